//! The hand-back through the door (`Namespace::hand_back`): a pod's capture of ours replaced by
//! Istio's rules for the same config, in each of Istio's forms, in fresh network namespaces.
//! What is written equals what Istio's own loading makes of the rules as Istio writes them
//! (`nft -f` of its nftables script; `iptables-nft-restore` of its restore files); ours is
//! gone; a config Istio has no rule for, and a namespace holding Istio's rules already, are
//! refused and the namespace is left as it was. (Equality with Istio's own goldens, case by
//! case, is redirect-istio's `tests/nft_form.rs` and `tests/iptables_form.rs`.) An ambient pod
//! goes back in Istio's nftables or iptables form with ztunnel's reply routing kept, each probe landing
//! where it landed under ours, in either form.

use redirect_core::{
    AmbientConfig, Capture, CaptureConfig, InterceptionMode, IstioForm, Namespace,
};
use redirect_istio::iptables_form::{restore_file, IstioIptables};
use redirect_istio::nft_form::IstioNft;
use redirect_testkit::{kernel_test, run_probes, From, Outcome, Probe, Side, TestNetns, Topology};

/// Istio's rules for `cfg` in `form`, loaded as Istio loads them, in `ns`.
fn load_istios(ns: &TestNetns, cfg: &CaptureConfig, form: IstioForm) {
    let dir =
        std::env::temp_dir().join(format!("rdt-handback-{}-{}", std::process::id(), ns.name()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    match form {
        IstioForm::Nftables => {
            let script = IstioNft::build(cfg).unwrap().script();
            ns.sh(&format!("nft -f {}", file("istio.nft", script)));
        }
        IstioForm::IptablesNft => {
            let xt = IstioIptables::build(cfg).unwrap();
            let v4 = file("v4", restore_file(&xt.v4));
            ns.sh(&format!("iptables-nft-restore --noflush {v4}"));
            if let Some(v6) = &xt.v6 {
                let v6 = file("v6", restore_file(v6));
                ns.sh(&format!("ip6tables-nft-restore --noflush {v6}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn listing(ns: &TestNetns) -> String {
    [
        "nft -s list ruleset",
        "iptables-nft-save",
        "ip6tables-nft-save",
    ]
    .iter()
    .map(|cmd| redirect_testkit::istio::saved(ns, cmd))
    .collect::<Vec<_>>()
    .join("\n")
}

#[kernel_test]
fn a_pod_is_handed_back_in_each_of_istios_forms_or_refused_unchanged() {
    let mut cfg = CaptureConfig::istio_sidecar_default();
    for form in [IstioForm::Nftables, IstioForm::IptablesNft] {
        for mode in [InterceptionMode::Redirect, InterceptionMode::Tproxy] {
            cfg.mode = mode;
            cfg.ipv6 = mode == InterceptionMode::Tproxy;
            let istio = TestNetns::new();
            load_istios(&istio, &cfg, form);

            let ns = TestNetns::new();
            let pod = Namespace::open(ns.path()).unwrap();
            pod.apply(&Capture::Sidecar(cfg.clone().validated().unwrap()))
                .unwrap();
            let before = listing(&ns);
            assert!(before.contains("table inet redirect_capture"), "{before}");
            let mut bypass = cfg.clone();
            bypass.bypass_uids = vec![4000];
            let refused = pod.hand_back(&bypass, form).unwrap_err().to_string();
            assert!(refused.contains("bypass"), "{refused}");
            assert_eq!(
                listing(&ns),
                before,
                "a refused hand-back changed the namespace"
            );

            let done = pod.hand_back(&cfg, form).unwrap();
            assert!(done.had_ours, "{form:?} {mode:?}");
            let after = listing(&ns);
            assert!(
                !after.contains("redirect_capture"),
                "ours is still there:\n{after}"
            );
            assert_eq!(
                after,
                listing(&istio),
                "{form:?} {mode:?}: not Istio's rules"
            );

            // Istio's rules are there now: a second hand-back would double them.
            let again = pod.hand_back(&cfg, form).unwrap_err().to_string();
            assert!(again.contains("holds Istio's rules already"), "{again}");
            assert_eq!(
                listing(&ns),
                after,
                "a refused hand-back changed the namespace"
            );
        }
    }
}

#[kernel_test]
fn an_ambient_pod_is_handed_back_in_each_of_istios_forms_with_its_routing_kept() {
    let configs = [
        AmbientConfig::default(),
        AmbientConfig {
            dns_capture: false,
            ipv6: false,
            bypass_inbound: true,
            virtual_interfaces: vec!["kubevirt0".into()],
            ..AmbientConfig::default()
        },
    ];
    for form in [IstioForm::IptablesNft, IstioForm::Nftables] {
        for cfg in &configs {
            ambient_hand_back(cfg, form);
        }
    }
}

/// Istio's ambient in-pod rules for `cfg` in `form`, loaded as Istio's agent loads them.
fn load_istios_ambient(istio: &TestNetns, cfg: &AmbientConfig, form: IstioForm) {
    let dir = std::env::temp_dir().join(format!("rdt-handback-amb-{}", istio.name()));
    std::fs::create_dir_all(&dir).unwrap();
    match form {
        IstioForm::Nftables => {
            let path = dir.join("istio.nft");
            std::fs::write(&path, IstioNft::ambient(cfg).script()).unwrap();
            istio.sh(&format!("nft -f {}", path.display()));
        }
        IstioForm::IptablesNft => {
            let rules = IstioIptables::ambient(cfg);
            for (bin, rules) in [
                ("iptables-nft-restore", Some(&rules.v4)),
                ("ip6tables-nft-restore", rules.v6.as_ref()),
            ] {
                if let Some(rules) = rules {
                    let path = dir.join(bin);
                    std::fs::write(&path, restore_file(rules)).unwrap();
                    istio.sh(&format!("{bin} --noflush {}", path.display()));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn ambient_hand_back(cfg: &AmbientConfig, form: IstioForm) {
    let istio = TestNetns::new();
    load_istios_ambient(&istio, cfg, form);

    let topo = Topology::basic();
    let ns = &topo.pod;
    let pod = Namespace::open(ns.path()).unwrap();
    pod.apply(&Capture::Ambient(cfg.clone())).unwrap();
    // Where the app's and the peer's packets go: to ztunnel's ports, under ours and then
    // under Istio's rules alike.
    let app = From::Pod {
        uid: 1000,
        gid: 1000,
    };
    let probes = [
        Probe::tcp(app.clone(), "10.77.0.1:80".parse().unwrap()),
        Probe::tcp(app.clone(), "[fd77::1]:80".parse().unwrap()),
        Probe::udp(app.clone(), "10.77.0.1:53".parse().unwrap()),
        Probe::tcp(app, "10.77.0.1:53".parse().unwrap()),
        Probe::tcp(From::Peer, "10.77.0.2:8080".parse().unwrap()),
    ];
    let landed = run_probes(&topo, &probes);
    assert_eq!(
        landed[0],
        Outcome::landed(Side::Pod, 15001, Some("10.77.0.1:80".parse().unwrap()))
    );
    // (Without IPv6, table 100 has no IPv6 route and `ip -6` says so: the same before and
    // after.)
    let routing = |ns: &TestNetns| {
        ns.sh("ip rule list; ip route show table 100; ip -6 rule list; ip -6 route show table 100 2>&1 || true")
    };
    let routes = routing(ns);
    assert!(routes.contains("lookup 100"), "{routes}");

    let done = pod.hand_back_ambient(cfg, form).unwrap();
    assert!(done.had_ours);
    let after = listing(ns);
    assert!(
        !after.contains("redirect_"),
        "ours is still there:\n{after}"
    );
    assert_eq!(
        after,
        listing(&istio),
        "{form:?} {cfg:?}: not Istio's in-pod rules"
    );
    assert_eq!(routing(ns), routes, "ztunnel's reply routing changed");
    assert_eq!(
        run_probes(&topo, &probes),
        landed,
        "{form:?} {cfg:?}: a packet goes elsewhere under Istio's rules"
    );

    // Istio's rules are there now, in either form: refused, nothing changed.
    for again in [IstioForm::IptablesNft, IstioForm::Nftables] {
        let refused = pod.hand_back_ambient(cfg, again).unwrap_err().to_string();
        assert!(refused.contains("holds Istio's rules already"), "{refused}");
        assert_eq!(
            listing(ns),
            after,
            "a refused hand-back changed the namespace"
        );
    }
}
