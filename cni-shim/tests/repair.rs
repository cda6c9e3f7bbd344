//! The repair controller's parts on real namespaces: finding a pod's network namespace, and
//! repairing a broken pod in place. The host's `/proc` is stood in for by a folder laid out like
//! it (`<pid>/cgroup`, `<pid>/stat`, `<pid>/ns/net` as a link to a real namespace file), as the
//! agent reads a mounted `/host/proc`; the namespaces and the addresses in them are real.

mod common;

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::symlink;
use std::path::Path;

use cni_shim::repair::in_place::{repair, Outcome, Places, RepairError};
use cni_shim::repair::pod_netns::{find, FindError};
use common::static_bin;
use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::{self, Decision, MeshDefaults};
use redirect_core::netns::{netns_id_of, netns_id_of_file};
use redirect_core::testkit::binary::{self, Run};
use redirect_core::testkit::{kernel_tests_enabled, TestNetns};
use redirect_core::{nft, plan, CaptureConfig};

const ISTIO_POD: &str = include_str!("fixtures/pod-istio-sidecar.json");

const UID: &str = "8f7c1a52-3b1e-4d2a-9c6e-0a1b2c3d4e5f";
const OTHER_UID: &str = "11111111-2222-3333-4444-555555555555";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A namespace holding `addrs` on a veth, as a pod does.
fn pod_ns(addrs: &[&str]) -> TestNetns {
    let ns = TestNetns::with_prefix("rdrep");
    let mut lines = vec![
        "link add eth0 type veth peer name eth1".to_string(),
        "link set eth0 up".into(),
    ];
    lines.extend(addrs.iter().map(|a| format!("addr add {a}/32 dev eth0")));
    ns.ip_batch(false, &lines);
    ns
}

/// A folder laid out like `/proc`.
struct FakeProc(tempfile::TempDir);

impl FakeProc {
    fn new() -> FakeProc {
        FakeProc(tempfile::tempdir().unwrap())
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Process `pid`, in cgroup `cgroup`, started at `start` ticks, in namespace `ns`.
    fn add(&self, pid: u32, cgroup: &str, start: u64, ns: &Path) {
        let dir = self.path().join(pid.to_string());
        fs::create_dir_all(dir.join("ns")).unwrap();
        fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
        fs::write(
            dir.join("stat"),
            format!("{pid} (pause) S 1 {pid} {pid} 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 {start} 1081344 1 0\n"),
        )
        .unwrap();
        symlink(ns, dir.join("ns/net")).unwrap();
    }
}

/// A cgroupfs-driver path for a pod's container.
fn cgroupfs(uid: &str) -> String {
    format!("/kubepods/besteffort/pod{uid}/0123456789abcdef")
}

fn same_ns(found: &fs::File, ns: &TestNetns) -> bool {
    netns_id_of_file(found).unwrap() == netns_id_of(ns.path()).unwrap()
}

#[test]
fn the_oldest_process_of_the_pod_whose_namespace_holds_its_ip_wins() {
    if !kernel_tests_enabled() {
        return;
    }
    let (a, b, c) = (
        pod_ns(&["10.55.0.2"]),
        pod_ns(&["10.55.0.2"]),
        pod_ns(&["10.55.0.3"]),
    );
    let other = pod_ns(&["10.55.0.2"]);
    let proc = FakeProc::new();
    proc.add(10, &cgroupfs(UID), 900, b.path());
    proc.add(11, &cgroupfs(UID), 300, a.path());
    // Older, but its namespace does not hold the IP.
    proc.add(12, &cgroupfs(UID), 50, c.path());
    // The oldest of all holds the IP, but belongs to another pod.
    proc.add(13, &cgroupfs(OTHER_UID), 10, other.path());
    fs::create_dir_all(proc.path().join("self")).unwrap();

    let found = find(proc.path(), Path::new("/nonexistent"), UID, ip("10.55.0.2")).unwrap();
    assert!(same_ns(&found.file, &a), "found {}", found.path.display());
    assert_eq!(found.path, proc.path().join("11/ns/net"));
}

#[test]
fn the_systemd_cgroup_driver_spells_the_uid_with_underscores() {
    if !kernel_tests_enabled() {
        return;
    }
    let a = pod_ns(&["10.55.1.2"]);
    let proc = FakeProc::new();
    let slice = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-1.scope",
        UID.replace('-', "_")
    );
    proc.add(42, &slice, 100, a.path());
    let found = find(proc.path(), Path::new("/nonexistent"), UID, ip("10.55.1.2")).unwrap();
    assert!(same_ns(&found.file, &a));
}

#[test]
fn the_agents_own_namespace_is_never_the_pods() {
    if !kernel_tests_enabled() {
        return;
    }
    let agent = pod_ns(&["10.55.2.2"]);
    let proc = FakeProc::new();
    proc.add(7, &cgroupfs(UID), 100, agent.path());
    let pins = tempfile::tempdir().unwrap();
    symlink(agent.path(), pins.path().join("agent")).unwrap();
    // Seen from another namespace, the pod's process and its namespace are found...
    let found = find(proc.path(), pins.path(), UID, ip("10.55.2.2")).unwrap();
    assert!(same_ns(&found.file, &agent));
    // ...seen from inside it (the agent's own namespace holds the IP), nothing is.
    let inside = agent.run(|| find(proc.path(), pins.path(), UID, ip("10.55.2.2")));
    match inside {
        Err(FindError::NotFound {
            processes, pins, ..
        }) => assert_eq!((processes, pins), (1, 1)),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[test]
fn without_a_process_the_pinned_namespaces_are_searched() {
    if !kernel_tests_enabled() {
        return;
    }
    let (a, b) = (pod_ns(&["10.55.3.9"]), pod_ns(&["10.55.3.2"]));
    let proc = FakeProc::new();
    let pins = tempfile::tempdir().unwrap();
    symlink(a.path(), pins.path().join("cni-aaaa")).unwrap();
    symlink(b.path(), pins.path().join("cni-bbbb")).unwrap();
    let found = find(proc.path(), pins.path(), UID, ip("10.55.3.2")).unwrap();
    assert!(same_ns(&found.file, &b));
    assert_eq!(found.path, pins.path().join("cni-bbbb"));

    let err = find(proc.path(), pins.path(), UID, ip("10.55.3.77")).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(UID) && text.contains("10.55.3.77") && text.contains("2 pinned"),
        "{text}"
    );
}

/// Istio's sidecar pod (the fixture), running on `ip`, with `uid`.
fn sidecar_pod(uid: &str, ip: &str) -> Pod {
    let mut pod: Pod = serde_json::from_str(ISTIO_POD).unwrap();
    pod.metadata.uid = Some(uid.into());
    pod.status.get_or_insert_with(Default::default).pod_ip = Some(ip.into());
    pod
}

/// A pod's namespace holding `ip`, and a `/proc` whose one process (the pause) belongs to the
/// pod and lives in it.
fn running_pod(ip: &str) -> (TestNetns, FakeProc) {
    let ns = pod_ns(&[ip]);
    let proc = FakeProc::new();
    proc.add(1, &cgroupfs(UID), 5, ns.path());
    (ns, proc)
}

fn places(proc: &FakeProc) -> Places {
    Places {
        proc: proc.path().to_owned(),
        pins: "/nonexistent".into(),
    }
}

#[test]
fn a_broken_pod_gets_the_plugins_capture_and_then_passes_the_real_probe() {
    if !kernel_tests_enabled() {
        return;
    }
    let validate = static_bin("redirect-validate");
    let validate = validate.to_str().unwrap();
    let (ns, proc) = running_pod("10.55.5.2");
    let probe = || binary::run_in(validate, &ns, &Run::args(&[]).user(1337, 1337));
    // Broken: no rules, and the probe says so as istio-validation does.
    assert_eq!(ns.run(nft::read_back).unwrap(), None);
    assert_eq!(probe().code, 126, "the probe must fail before the repair");

    let out = repair(
        &sidecar_pod(UID, "10.55.5.2"),
        &MeshDefaults::default(),
        &places(&proc),
    );
    assert_eq!(
        out.unwrap(),
        Outcome::Repaired {
            netns: proc.path().join("1/ns/net")
        }
    );
    // The table is the one ADD writes for this pod: the plugin's decision from the pod object
    // (this one captures DNS, from its istio-proxy's environment).
    let pod = sidecar_pod(UID, "10.55.5.2");
    let info = cni_shim::kube::pod_info(pod, String::new(), String::new());
    let Decision::Capture { config, .. } = mesh::decide(&info, &MeshDefaults::default()).unwrap()
    else {
        panic!("the fixture is a captured pod")
    };
    assert!(
        config.dns != CaptureConfig::istio_sidecar_default().dns,
        "the fixture's DNS capture"
    );
    let expected = nft::expected(&plan(&config).unwrap());
    assert_eq!(ns.run(nft::read_back).unwrap(), Some(expected));
    let ran = probe();
    assert_eq!(ran.code, 0, "the probe after the repair: {ran:?}");
}

#[test]
fn a_pod_the_plugin_would_not_capture_is_left_alone() {
    if !kernel_tests_enabled() {
        return;
    }
    let (ns, proc) = running_pod("10.55.6.2");
    let mut pod = sidecar_pod(UID, "10.55.6.2");
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("sidecar.istio.io/inject".into(), "false".into());
    let out = repair(&pod, &MeshDefaults::default(), &places(&proc)).unwrap();
    assert!(matches!(out, Outcome::NotCaptured(_)), "{out:?}");
    assert_eq!(ns.run(nft::read_back).unwrap(), None);
}

#[test]
fn a_pod_whose_namespace_is_not_found_is_a_failure_with_nothing_applied() {
    if !kernel_tests_enabled() {
        return;
    }
    // The pod's process is there, but its namespace does not hold the pod's IP.
    let (ns, proc) = running_pod("10.55.7.2");
    let err = repair(
        &sidecar_pod(UID, "10.55.7.9"),
        &MeshDefaults::default(),
        &places(&proc),
    )
    .unwrap_err();
    assert!(matches!(err, RepairError::Netns { .. }), "{err:?}");
    assert!(err.to_string().contains("10.55.7.9"), "{err}");
    assert_eq!(ns.run(nft::read_back).unwrap(), None);
}
