//! End to end with the CNI reference client: a conflist of Debian's `bridge` + `host-local` +
//! `redirect-cni`, the pod annotations passed as the runtime capability (cnitool's CAP_ARGS),
//! cniVersion 0.4.0 and 1.0.0. cnitool runs in a "node" namespace of its own, so the bridge
//! never touches the host. After ADD real connections are captured as the annotations say;
//! CHECK passes, and fails once a rule is deleted by hand; DEL removes our table.

use cni_testkit as common;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;

use common::{listen, plugin_bin, Probe, STATUS_CNI};
use redirect_testkit::{kernel_test, TestNetns};

fn cnitool() -> PathBuf {
    let p = std::env::var_os("CNITOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| redirect_testkit::docs::workspace().join(".tools/cnitool"));
    assert!(
        p.exists() && std::path::Path::new("/usr/lib/cni/bridge").exists(),
        "cnitool or Debian's CNI plugins are missing: run `bash scripts/install-deps.sh` (it builds them with scripts/install-cnitool.sh)"
    );
    p
}

struct Net {
    dir: PathBuf,
    subnet_gw: IpAddr,
}

/// A temp dir holding the conflist, a bin dir with our plugin, and host-local's data dir.
fn network(version: &str, tag: &str) -> Net {
    let dir = std::env::temp_dir().join(format!("rdc-e2e-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("net.d")).unwrap();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::copy(plugin_bin(), dir.join("bin/redirect-cni")).unwrap();
    let conflist = serde_json::json!({
        "cniVersion": version,
        "name": "podnet",
        "plugins": [
            {"type": "bridge", "bridge": "rdbr0", "isGateway": true, "ipMasq": false,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.22.0.0/24"}]],
                      "dataDir": dir.join("ipam")}},
            {"type": "redirect-cni", "proxy_uid": 1337, "exclude_namespaces": ["kube-system"],
             "log_file": dir.join("plugin.log"),
             "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
        ]
    });
    std::fs::write(dir.join("net.d/10-podnet.conflist"), conflist.to_string()).unwrap();
    Net {
        dir,
        subnet_gw: "10.22.0.1".parse().unwrap(),
    }
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_cnitool(
    node: &TestNetns,
    net: &Net,
    cmd: &str,
    pod: &TestNetns,
    annotations: &serde_json::Value,
) -> Ran {
    let cap_args = serde_json::json!({ "io.kubernetes.cri.pod-annotations": annotations });
    let out = Command::new("ip")
        .args(["netns", "exec", node.name()])
        .arg(cnitool())
        .args([cmd, "podnet"])
        .arg(pod.path())
        .env(
            "CNI_PATH",
            format!("/usr/lib/cni:{}", net.dir.join("bin").display()),
        )
        .env("NETCONFPATH", net.dir.join("net.d"))
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
        )
        .env("CAP_ARGS", cap_args.to_string())
        .output()
        .expect("run cnitool");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn pod_ip(add_stdout: &str) -> IpAddr {
    let v: serde_json::Value = serde_json::from_str(add_stdout).expect("ADD result is JSON");
    let addr = v["ips"][0]["address"]
        .as_str()
        .expect("an address in the result");
    addr.split('/').next().unwrap().parse().unwrap()
}

#[kernel_test]
fn chained_after_bridge_with_the_reference_client() {
    for (version, exclude) in [("0.4.0", None), ("1.0.0", Some("8080"))] {
        let net = network(version, version);
        let node = TestNetns::new();
        let pod = TestNetns::new();
        let mut ann = serde_json::json!({ "sidecar.istio.io/status": STATUS_CNI });
        if let Some(p) = exclude {
            ann["traffic.sidecar.istio.io/excludeInboundPorts"] = p.into();
        }
        let add = run_cnitool(&node, &net, "add", &pod, &ann);
        assert_eq!(add.code, 0, "{version} ADD: {}\n{}", add.stdout, add.stderr);
        let result: serde_json::Value = serde_json::from_str(&add.stdout).unwrap();
        assert_eq!(
            result["cniVersion"], version,
            "the result keeps the list's version"
        );
        let ip = pod_ip(&add.stdout);
        let log = std::fs::read_to_string(net.dir.join("plugin.log")).unwrap_or_default();
        assert!(log.contains("captured"), "{version}: plugin log: {log}");

        // Real connections: inbound to the app port, outbound as the app and as the proxy.
        let l = listen(&pod, &[15001, 15006]);
        let inbound = l.probe(&node, None, SocketAddr::new(ip, 8080));
        let inbound_other = l.probe(&node, None, SocketAddr::new(ip, 9090));
        let health = l.probe(&node, None, SocketAddr::new(ip, 15021));
        let out_app = l.probe(&pod, Some(1000), SocketAddr::new(net.subnet_gw, 80));
        let out_proxy = l.probe(&pod, Some(1337), SocketAddr::new(net.subnet_gw, 80));
        match exclude {
            None => assert_eq!(
                inbound,
                Some((15006, SocketAddr::new(ip, 8080))),
                "{version}"
            ),
            Some(_) => assert_eq!(inbound, None, "{version}: 8080 is excluded by annotation"),
        }
        assert_eq!(
            inbound_other,
            Some((15006, SocketAddr::new(ip, 9090))),
            "{version}"
        );
        assert_eq!(health, None, "{version}: 15021 is never captured");
        assert_eq!(
            out_app,
            Some((15001, SocketAddr::new(net.subnet_gw, 80))),
            "{version}"
        );
        assert_eq!(
            out_proxy, None,
            "{version}: the proxy's own traffic is not captured"
        );

        let check = run_cnitool(&node, &net, "check", &pod, &ann);
        assert_eq!(
            check.code, 0,
            "{version} CHECK: {}\n{}",
            check.stdout, check.stderr
        );

        // Delete one rule by hand: CHECK must fail and say what differs.
        let listing = pod.sh("nft -a list chain inet redirect_capture nat_ip_istio_output");
        let handle = listing
            .lines()
            .filter_map(|l| {
                l.rsplit_once("# handle ")
                    .map(|(_, h)| h.trim().to_string())
            })
            .next_back()
            .expect("a rule handle");
        pod.sh(&format!(
            "nft delete rule inet redirect_capture nat_ip_istio_output handle {handle}"
        ));
        let check = run_cnitool(&node, &net, "check", &pod, &ann);
        assert_ne!(
            check.code, 0,
            "{version}: CHECK passed after a rule was deleted"
        );
        let text = format!("{}{}", check.stdout, check.stderr);
        assert!(
            text.contains("differ") && text.contains("nat_ip_istio_output"),
            "{version}: {text}"
        );

        let del = run_cnitool(&node, &net, "del", &pod, &ann);
        assert_eq!(del.code, 0, "{version} DEL: {}\n{}", del.stdout, del.stderr);
        assert!(
            !pod.sh("nft list tables").contains("redirect_capture"),
            "{version}: DEL left our table"
        );
        // A second DEL (containerd removes the sandbox twice) succeeds too.
        let del = run_cnitool(&node, &net, "del", &pod, &ann);
        assert_eq!(del.code, 0, "{version} second DEL: {}", del.stderr);
        let _ = std::fs::remove_dir_all(&net.dir);
    }
}
