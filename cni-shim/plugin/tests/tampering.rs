//! A table that does not capture is never "the rules match": after someone makes our table
//! dormant (its chains unhooked) or changes a base chain, CNI CHECK fails naming what changed,
//! and ADD brings the capture back. Judged by traffic: a real connection from the app lands on
//! the proxy's 15001, or does not.

use cni_testkit as common;

use std::net::SocketAddr;

use common::{cni_env as env, listen, mesh_conf, plugin, pod_ns, Probe, ARGS};
use redirect_testkit::kernel_test;

const APP_UID: u32 = 1000;

#[kernel_test]
fn a_dormant_table_or_a_changed_base_chain_fails_check_and_add_restores_capture() {
    let pod = pod_ns();
    let p = pod.path().to_str().unwrap().to_string();
    let l = listen(&pod, &[15001]);
    let remote: SocketAddr = "10.33.0.99:80".parse().unwrap();
    let lands = || l.probe(&pod, Some(APP_UID), remote).map(|(port, _)| port);
    // The proxy's own connection to loopback is not captured: it reaches 15001 as sent.
    let local: SocketAddr = "127.0.0.1:15001".parse().unwrap();
    let proxy_reaches = || l.probe(&pod, Some(1337), local) == Some((15001, local));

    let out = plugin(&env("ADD", &p, ARGS), &mesh_conf());
    assert_eq!(out.code, 0, "ADD: {}", out.stderr);
    assert_eq!(lands(), Some(15001), "captured after ADD");
    assert!(proxy_reaches(), "the proxy's loopback connection after ADD");

    // What each does to traffic: the app is no longer captured, or the proxy's own traffic
    // that the rules return meets a dropping policy.
    let tamperings = [
        (
            "dormant",
            "nft add table inet redirect_capture '{ flags dormant; }'",
            "dormant",
        ),
        (
            "policy drop",
            "nft 'add chain inet redirect_capture nat_output { type nat hook output priority -100; policy drop; }'",
            "policy drop",
        ),
        (
            "unhooked base chain",
            "nft flush chain inet redirect_capture nat_output && \
             nft delete chain inet redirect_capture nat_output && \
             nft add chain inet redirect_capture nat_output",
            "nat_output is a regular chain",
        ),
    ];
    for (what, cmd, named) in tamperings {
        pod.sh(cmd);
        assert!(
            lands() != Some(15001) || !proxy_reaches(),
            "{what}: traffic goes where it went before {cmd}"
        );
        let out = plugin(&env("CHECK", &p, ARGS), &mesh_conf());
        assert_eq!(out.code, 1, "{what}: CHECK passed: {}", out.stderr);
        let e = out.json();
        assert_eq!(e["code"], 100, "{what}: {e}");
        assert!(
            e.to_string().contains(named),
            "{what}: CHECK does not name {named:?}: {e}"
        );

        let out = plugin(&env("ADD", &p, ARGS), &mesh_conf());
        assert_eq!(out.code, 0, "{what}: second ADD: {}", out.stderr);
        assert_eq!(
            lands(),
            Some(15001),
            "{what}: ADD did not bring capture back"
        );
        assert!(
            proxy_reaches(),
            "{what}: the proxy's loopback connection after ADD"
        );
        let out = plugin(&env("CHECK", &p, ARGS), &mesh_conf());
        assert_eq!(out.code, 0, "{what}: CHECK after ADD: {}", out.stdout);
        assert!(
            !pod.sh("nft list table inet redirect_capture")
                .contains("dormant"),
            "{what}: the table is still dormant"
        );
    }
}
