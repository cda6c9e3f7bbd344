//! Ambient mode between events: what the agent says must be what ztunnel and the kernel hold,
//! through the faults an operator's node sees. Each test reproduces one behaviour the agent
//! had when it trusted what it did instead of reading back what is there (issue 39's list),
//! against a real API server, the agent as the DaemonSet runs it, pods in real network
//! namespaces and ztunnel's stand-in (`support::ztunnel`):
//!
//! 1. a pod enrolled at ADD before kubelet wrote its address survives the agent's restart;
//! 2. a pod ztunnel refused is `pending` until a connection acks it, then `enabled`;
//! 3. the host's probe table and a pod's table, deleted under the running agent, come back
//!    within one pass, and ADDs go on meanwhile;
//! 4. a request on `ambient.sock` naming an enrolled pod with another namespace is refused and
//!    changes nothing in either namespace;
//! 5. silent connections on either socket hold up no other and cost no thread;
//! 6. the sockets are the agent's alone whatever the umask, and a socket folder below a folder
//!    others may write is refused;
//! 7. ztunnel's death shows on the connected gauge within seconds;
//! 8. CHECK of an ambient pod whose rules differ fails, naming the difference;
//! 9. a restart writes nothing to a pod that did not change.

use cni_testkit as common;

mod support;

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use cni_protocol::ambient::{ask, AddAnswer, AddRequest, Command};
use common::ambient::{create_pod, pod_netns, running, Launch, Node};
use common::host_proc::cgroupfs;
use redirect_testkit::{kernel_test, TestNetns};
use support::ztunnel::TestZtunnel;
use support::{has_rules, pod, probe_members, resource_version, threads_and_fds, TestPod};

const WAIT: Duration = Duration::from_secs(30);
/// The agent's monitoring port in the node's namespace.
const PORT: u16 = 15014;
const MONITORED: &[&str] = &["--monitoring-port=15014"];

fn eventually<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::eventually(what, WAIT, f)
}

fn wait_enabled(n: &Node, p: &TestPod, z: &TestZtunnel) {
    eventually(&format!("{} enabled and served", p.name), || {
        (p.annotation(n).as_deref() == Some("enabled") && z.serves(&p.uid)).then_some(())
    });
}

fn metrics(n: &Node) -> String {
    common::http_get(&n.host, PORT, "/metrics")
        .map(|(_, body)| body)
        .unwrap_or_default()
}

fn our_table(ns: &TestNetns) -> Option<redirect_core::TableState> {
    redirect_kernel::testing::nft_in(ns.path()).read().unwrap()
}

/// Item 1: kubelet writes a pod's address after the sandbox (an image pull is enough): a pod the
/// plugin enrolled at ADD has none in its status when the agent restarts. The new agent must
/// still name it in ztunnel's snapshot (found by its cgroup, or `keep` when its namespace
/// cannot be found), else ztunnel drains it and its connections are refused.
#[kernel_test]
fn a_pod_enrolled_before_its_address_is_kept_across_the_agents_restart() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent();
    let z = TestZtunnel::start(&n.socket);
    eventually("ztunnel connected", || (z.snapshots() >= 1).then_some(()));
    let web = pod(&n, "web", "10.77.0.2", 4100, false);
    let out = web.add(&n);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    wait_enabled(&n, &web, &z);
    let rules = our_table(&web.netns);
    // A second pod whose runtime keeps no process in it (CRI-O's drop_infra_ctr): the agent's
    // search cannot find its namespace after the restart.
    let api_uid = create_pod(&n.cp, "shop", "api");
    let api_ns = pod_netns(&n.host, "10.77.0.3", "vapi");
    let out = n.cni("ADD", &api_ns, "shop", "api", &api_uid, &["10.77.0.3"]);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    eventually("api served", || z.serves(&api_uid).then_some(()));

    drop(agent);
    let agent = n.agent_with(MONITORED);
    eventually("the new agent's snapshot", || {
        (z.snapshots() >= 2).then_some(())
    });
    assert!(
        z.serves(&web.uid),
        "the restarted agent left web out of its snapshot (ztunnel drained it): {:?}\n{}",
        z.seen(),
        agent.log()
    );
    assert!(
        z.lands(&web.netns, &web.uid),
        "web's connections not served"
    );
    assert_eq!(our_table(&web.netns), rules, "the rules were touched");
    assert!(
        z.seen().contains(&format!("keep {api_uid}")) && z.serves(&api_uid),
        "api not kept: {:?}",
        z.seen()
    );
    // Its process shows up: the next pass finds its namespace and hands it to ztunnel.
    n.proc.add(4200, &cgroupfs(&api_uid), 100, api_ns.path());
    eventually("api's namespace found again", || {
        let m = metrics(&n);
        let found = common::metric(
            &m,
            "redirect_cni_ambient_repairs_total",
            &["kind=\"namespace\""],
        );
        (found >= 1.0).then_some(())
    });
    assert!(z.lands(&api_ns, &api_uid), "api's connections not served");
    // kubelet writes the status at last: its address goes into the probe set.
    running(&n.cp, "shop", "web", "10.77.0.2");
    eventually("web's address in the probe set", || {
        probe_members(&n.host)
            .contains(&"10.77.0.2".to_string())
            .then_some(())
    });
    assert_eq!(web.annotation(&n).as_deref(), Some("enabled"));
}

/// Item 2: ztunnel refuses a pod; a second ztunnel connects (a rollout) and acks everything its
/// snapshot holds. The pod must be `pending` while refused and `enabled` only once a
/// connection acked it: never annotated enabled while no ztunnel serves it.
#[kernel_test]
fn a_refused_pod_is_pending_until_a_connection_acks_it() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    let _agent = n.agent();
    let first = TestZtunnel::nacking(&n.socket, &[&web.uid]);
    eventually("ztunnel refused web", || {
        first
            .seen()
            .contains(&format!("add {}", web.uid))
            .then_some(())
    });
    eventually("web pending", || {
        (web.annotation(&n).as_deref() == Some("pending")).then_some(())
    });
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_ne!(
            web.annotation(&n).as_deref(),
            Some("enabled"),
            "enabled while ztunnel refuses it"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    first.stop_reconnecting();
    let second = TestZtunnel::start(&n.socket);
    eventually("the second ztunnel serving web, annotated enabled", || {
        (second.serves(&web.uid) && web.annotation(&n).as_deref() == Some("enabled")).then_some(())
    });
}

/// Item 3: A node firewall reload that flushes the ruleset deletes the host's probe table; someone
/// deletes a pod's table. Both come back within one pass (the host table with every enrolled
/// pod's address), ADDs go on meanwhile, and each repair is logged and counted.
#[kernel_test]
fn deleted_tables_come_back_within_a_pass_and_adds_go_on_meanwhile() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    let agent = n.agent_with(MONITORED);
    let z = TestZtunnel::start(&n.socket);
    wait_enabled(&n, &web, &z);

    n.host.sh("nft delete table inet redirect_ambient_host");
    let api = pod(&n, "api", "10.77.0.3", 4200, false);
    let out = api.add(&n);
    assert_eq!(
        out.code, 0,
        "ADD failed while the host table was gone: {}{}",
        out.stdout, out.stderr
    );
    eventually("the host table back with both pods", || {
        (probe_members(&n.host) == ["10.77.0.2", "10.77.0.3"]).then_some(())
    });

    let rules = our_table(&web.netns);
    assert!(rules.is_some());
    web.netns.sh("nft delete table inet redirect_capture");
    eventually("web's table back", || {
        (our_table(&web.netns) == rules).then_some(())
    });
    agent.line_with(&["ambient:", "shop/web", "repaired"]);
    let m = metrics(&n);
    for kind in ["host_table", "pod_rules"] {
        let label = format!("kind=\"{kind}\"");
        assert!(
            common::metric(&m, "redirect_cni_ambient_repairs_total", &[&label]) >= 1.0,
            "{kind} not counted:\n{m}"
        );
    }
    assert!(common::metric(&m, "redirect_cni_ambient_reconcile_passes_total", &[]) >= 1.0);

    // What the pass knows, an operator sees: the agent's view on its socket, and
    // redirect-validate's table.
    let socket = debug_socket(&n);
    let view: serde_json::Value = eventually("the view after the repair", || {
        let (code, body) = common::unix_get(&socket, "/debug/node")?;
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let web = v["pods"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == "web")?
            .clone();
        (web["last_repair"]["kind"] == "pod_rules").then_some(v)
    });
    let pods = view["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 2, "{view:#}");
    for p in pods {
        assert_eq!(p["kind"], "ambient", "{p}");
        assert_eq!(p["ztunnel"]["acked"], true, "{p}");
        assert!(p["rules"]["at"].is_string(), "{p}");
    }
    assert_eq!(view["ambient"]["ztunnel"]["connected"], true, "{view:#}");
    assert!(view["ambient"]["pass"]["repairs"]["host_table"].as_u64() >= Some(1));
    let out = std::process::Command::new(common::validate_bin())
        .args(["node", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.contains("ztunnel: connected"), "{table}");
    let row = table.lines().find(|l| l.contains("shop/web")).unwrap_or("");
    assert!(
        row.contains("enabled") && row.contains("pod_rules"),
        "{table}"
    );

    // Not on the port every pod reaches: a 404 saying where it went.
    let (code, body) = common::http_get(&n.host, PORT, "/debug/node").unwrap();
    assert_eq!(code, 404, "{body}");
    assert!(
        body.contains(socket.to_str().unwrap()) && body.contains("redirect-validate node"),
        "{body}"
    );
    assert!(!body.contains("shop"), "{body}");
    // And /metrics names no pod: not its name, namespace, UID, address or namespace path,
    // which the view (the control) holds.
    let identities = |text: &str| -> Vec<String> {
        let mut said = Vec::new();
        for p in [&web, &api] {
            for v in [
                &p.uid,
                &p.ip,
                &format!("\"{}\"", p.name),
                &p.netns.path().display().to_string(),
            ] {
                if text.contains(v.as_str()) {
                    said.push(v.clone());
                }
            }
        }
        if text.contains("shop") {
            said.push("shop".into());
        }
        said
    };
    let in_view = identities(&view.to_string());
    assert!(
        in_view.len() >= 5,
        "the control: the view names only {in_view:?}"
    );
    let m = metrics(&n);
    assert!(m.contains("redirect_cni_ambient_pods"), "{m}");
    assert_eq!(
        identities(&m),
        Vec::<String>::new(),
        "/metrics names pods:\n{m}"
    );
}

/// The node view's socket in the agent's run directory.
fn debug_socket(n: &Node) -> std::path::PathBuf {
    n.plugin_socket().with_file_name("debug.sock")
}

/// Item 4: A process that can reach `ambient.sock` names an enrolled pod with another namespace
/// (its own, or a running pod's that is not ambient): refused, and nothing changes in either
/// namespace, in ztunnel or in the probe set.
#[kernel_test]
fn a_forged_request_with_another_namespace_is_refused_and_changes_nothing() {
    let n = Node::new();
    n.ambient_namespace("shop");
    n.cp.namespace("plain");
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    // A running pod that is not ambient, and a namespace of the caller's own.
    let other_uid = create_pod(&n.cp, "plain", "other");
    let other = pod_netns(&n.host, "10.77.0.3", "vother");
    running(&n.cp, "plain", "other", "10.77.0.3");
    let rogue = TestNetns::with_prefix("rdrogue");
    rogue.sh(
        "ip link set lo up && ip link add d0 type veth peer name d1 && \
         ip addr add 10.77.0.9/32 dev d0",
    );
    let late = pod(&n, "late", "10.77.0.4", 4300, false);

    let _agent = n.agent();
    let z = TestZtunnel::start(&n.socket);
    wait_enabled(&n, &web, &z);
    let (rules, served) = (our_table(&web.netns), z.netns_of(&web.uid));
    // Link-local routes come up on their own once DAD ends; they are not ours to compare.
    let before = |ns: &TestNetns| {
        ns.sh("nft list ruleset; ip rule; ip route show table all | grep -v fe80::")
    };
    let (other_before, rogue_before) = (before(&other), before(&rogue));

    let forged = [
        ("web", &web.uid, &rogue, vec!["10.77.0.9"]),
        ("web", &web.uid, &rogue, vec![]),
        ("web", &web.uid, &other, vec!["10.77.0.3"]),
        ("web", &web.uid, &other, vec!["10.77.0.2"]),
        // A pod without an address yet, with a running pod's address and namespace.
        ("late", &late.uid, &other, vec!["10.77.0.3"]),
    ];
    for (name, uid, ns, ips) in forged {
        let request = AddRequest {
            command: Command::Add,
            namespace: "shop".into(),
            name: name.into(),
            uid: Some(uid.clone()),
            ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            netns: "/proc/self/ns/net".into(),
        };
        let fd: OwnedFd = File::open(ns.path()).unwrap().into();
        let answer = ask(
            n.plugin_socket().parent().unwrap(),
            &request,
            fd.as_fd(),
            Duration::from_secs(10),
        )
        .unwrap();
        let what = format!("{name} with {} and {ips:?}", ns.name());
        match answer {
            AddAnswer::Failed { error } => assert!(
                error.contains("namespace") && error.contains("hold"),
                "{what}: {error}"
            ),
            other => panic!("{what}: answered {other:?}"),
        }
        assert_eq!(
            before(&other),
            other_before,
            "{what}: the other pod changed"
        );
        assert_eq!(
            before(&rogue),
            rogue_before,
            "{what}: the caller's namespace changed"
        );
        assert_eq!(our_table(&web.netns), rules, "{what}: web's rules changed");
        assert_eq!(
            z.netns_of(&web.uid),
            served,
            "{what}: ztunnel got another namespace"
        );
        assert!(!z.serves(&late.uid), "{what}: late handed to ztunnel");
        assert_eq!(
            probe_members(&n.host),
            ["10.77.0.2"],
            "{what}: the probe set changed"
        );
    }
    assert!(!has_rules(&other) && !has_rules(&rogue));
    drop(other_uid);
}

/// Item 5: Connections that say nothing: 300 on the plugin's socket and 300 on ztunnel's. The
/// agent's threads and descriptors stay flat, a pod's ADD is served, and a ztunnel that
/// connects meanwhile gets its snapshot at once.
#[kernel_test]
fn silent_connections_on_either_socket_hold_up_nothing() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent();
    let z = TestZtunnel::start(&n.socket);
    eventually("ztunnel connected", || (z.snapshots() >= 1).then_some(()));
    std::thread::sleep(Duration::from_millis(500));
    let (threads, fds) = threads_and_fds(agent.pid());

    let mut silent = Vec::new();
    for path in [n.plugin_socket(), n.socket.clone()] {
        let before = silent.len();
        for _ in 0..300 {
            if let Ok(s) = cni_protocol::seqpacket::connect(&path, Duration::from_millis(200)) {
                silent.push(s);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        let (threads_now, fds_now) = threads_and_fds(agent.pid());
        let opened = silent.len() - before;
        assert!(
            threads_now <= threads + 4,
            "{opened} silent connections to {}: {threads} threads before, {threads_now} now",
            path.display()
        );
        assert!(
            fds_now <= fds + 64,
            "{opened} silent connections to {}: {fds} descriptors before, {fds_now} now",
            path.display()
        );
    }

    let web = pod(&n, "web", "10.77.0.2", 4100, false);
    let started = Instant::now();
    let out = web.add(&n);
    let took = started.elapsed();
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    assert!(took < Duration::from_secs(2), "ADD took {took:?}");

    z.stop_reconnecting();
    drop(z);
    let started = Instant::now();
    let z = TestZtunnel::start(&n.socket);
    common::eventually(
        "the new ztunnel's snapshot",
        Duration::from_secs(60),
        || (z.snapshots() >= 1).then_some(()),
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "ztunnel waited {took:?} for its snapshot"
    );
    assert!(z.serves(&web.uid));
    let (threads_end, _) = threads_and_fds(agent.pid());
    assert!(
        threads_end <= threads + 4,
        "{threads} threads before, {threads_end} at the end"
    );
    drop(silent);
}

/// Item 6: Started with umask 000, the sockets are still the agent's alone; the node view's
/// (issue 47) is root's alone (0600), refuses another user, takes the place of a link left at
/// its path without following it, and goes with the agent; a ZDS socket folder whose parent
/// anyone may write (not sticky) is refused before anything is installed.
#[kernel_test]
fn sockets_are_the_agents_alone_whatever_the_umask() {
    let n = Node::new();
    // A link left at the node view's path, to a file of the node's: replaced, never followed.
    // And the run directory open to all (as /var/run/redirect-cni is, 0755): the socket's own
    // mode keeps others out.
    let view = debug_socket(&n);
    std::fs::create_dir_all(view.parent().unwrap()).unwrap();
    std::fs::set_permissions(n.node.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim = n.node.path().join("victim");
    std::fs::write(&victim, "kept").unwrap();
    std::os::unix::fs::symlink(&victim, &view).unwrap();
    let agent = n.agent_as(&Launch {
        umask: Some(0),
        ..Launch::default()
    });
    let m = std::fs::symlink_metadata(&view).unwrap();
    assert!(
        m.file_type().is_socket() && m.mode() & 0o7777 == 0o600 && m.uid() == 0,
        "{}: {:?}, mode {:o}, owner {}",
        view.display(),
        m.file_type(),
        m.mode() & 0o7777,
        m.uid()
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "kept");
    let (code, body) = common::unix_get(&view, "/debug/node").unwrap();
    assert_eq!(code, 200, "{body}");
    // Another user is refused, and told why.
    let out = std::process::Command::new(common::validate_bin())
        .args(["node", "--socket", view.to_str().unwrap()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Permission denied") && stderr.contains("root"),
        "{stderr}"
    );
    let events = n.plugin_socket().with_file_name("plugin-events.sock");
    for socket in [n.plugin_socket(), n.socket.clone(), events] {
        let m = std::fs::symlink_metadata(&socket).unwrap();
        let dir = std::fs::metadata(socket.parent().unwrap()).unwrap();
        let private = m.mode() & 0o077 == 0 || dir.mode() & 0o077 == 0;
        assert!(
            private && m.uid() == 0,
            "{}: mode {:o} in a folder of mode {:o}",
            socket.display(),
            m.mode() & 0o7777,
            dir.mode() & 0o7777
        );
    }

    // Gone with the agent.
    drop(agent);
    assert!(
        std::fs::symlink_metadata(&view).is_err(),
        "{}",
        view.display()
    );

    let open = tempfile::tempdir().unwrap();
    let parent = open.path().join("shared");
    std::fs::create_dir(&parent).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
    let folder = parent.join("ztunnel");
    std::fs::create_dir(&folder).unwrap();
    let address = format!(
        "--ztunnel-uds-address={}",
        folder.join("ztunnel.sock").display()
    );
    let mut agent = n.agent_as(&Launch {
        args: &[&address],
        no_wait: true,
        ..Launch::default()
    });
    let status = eventually("the agent stopped", || agent.exited());
    assert!(!status.success(), "{}", agent.log());
    let log = agent.log();
    assert!(
        log.contains(parent.to_str().unwrap()) && log.contains("writable"),
        "{log}"
    );
    assert!(!folder.join("ztunnel.sock").exists());
}

/// Item 7: ztunnel killed: the connected gauge falls within seconds, as an alert needs.
#[kernel_test]
fn a_dead_ztunnel_shows_on_the_gauge_within_seconds() {
    let n = Node::new();
    let _agent = n.agent_with(MONITORED);
    let z = TestZtunnel::start(&n.socket);
    let gauge = || common::metric(&metrics(&n), "redirect_cni_ambient_ztunnel_connected", &[]);
    eventually("the gauge at 1", || (gauge() == 1.0).then_some(()));
    z.stop_reconnecting();
    drop(z);
    let killed = Instant::now();
    common::eventually("the gauge at 0", Duration::from_secs(10), || {
        (gauge() == 0.0).then_some(())
    });
    eprintln!(
        "the gauge fell {:?} after ztunnel's death",
        killed.elapsed()
    );
}

/// Item 8: CHECK of an ambient pod compares its in-pod rules: equal, exit 0; its table deleted,
/// code 100 naming what differs (the agent's pass would repair it; its interval is long here).
#[kernel_test]
fn check_of_an_ambient_pod_fails_when_its_rules_differ() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let _agent = n.agent_as(&Launch {
        env: &[("AMBIENT_RECONCILE_INTERVAL", "1h")],
        ..Launch::default()
    });
    let z = TestZtunnel::start(&n.socket);
    let web = pod(&n, "web", "10.77.0.2", 4100, false);
    let out = web.add(&n);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    wait_enabled(&n, &web, &z);
    let check = || n.cni("CHECK", &web.netns, "shop", "web", &web.uid, &["10.77.0.2"]);
    let out = check();
    assert_eq!(out.code, 0, "CHECK: {}{}", out.stdout, out.stderr);

    web.netns.sh("nft delete table inet redirect_capture");
    let out = check();
    assert_ne!(
        out.code, 0,
        "CHECK passed without the table: {}",
        out.stderr
    );
    let err = out.json();
    assert_eq!(err["code"], 100, "{err}");
    let text = format!("{} {}", err["msg"], err["details"]);
    assert!(text.contains("redirect_capture"), "{text}");
}

/// Item 9: The agent restarts and nothing changed: no pod's status is written (no `pending` and
/// back), ztunnel keeps serving every pod.
#[kernel_test]
fn a_restart_writes_nothing_to_unchanged_pods() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let pods: Vec<TestPod> = (0..3)
        .map(|i| {
            pod(
                &n,
                &format!("p{i}"),
                &format!("10.77.0.{}", 2 + i),
                4100 + i,
                true,
            )
        })
        .collect();
    let agent = n.agent();
    let z = TestZtunnel::start(&n.socket);
    for p in &pods {
        wait_enabled(&n, p, &z);
    }
    let versions: Vec<String> = pods
        .iter()
        .map(|p| resource_version(&n.cp, "shop", &p.name))
        .collect();
    drop(agent);
    let agent = n.agent();
    eventually("the new agent's snapshot", || {
        (z.snapshots() >= 2).then_some(())
    });
    // Two passes at least.
    std::thread::sleep(Duration::from_secs(6));
    for (p, v) in pods.iter().zip(&versions) {
        assert!(z.serves(&p.uid), "{} not served", p.name);
        assert_eq!(
            &resource_version(&n.cp, "shop", &p.name),
            v,
            "{} was written to:\n{}",
            p.name,
            agent.log()
        );
    }
}

/// Istio's ambient in-pod rules, in the shape its agent writes them (`ISTIO_PRERT` and
/// `ISTIO_OUTPUT` chains in iptables-nft's mangle and nat, reached from the built-in chains), or
/// its native nftables table `inet istio-ambient-nat`.
fn istios_in_pod_rules(ns: &TestNetns, form: &str) {
    match form {
        "iptables-nft" => ns.sh(
            "iptables-nft -t mangle -N ISTIO_PRERT && iptables-nft -t mangle -A PREROUTING -j ISTIO_PRERT && \
             iptables-nft -t mangle -A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff && \
             iptables-nft -t nat -N ISTIO_OUTPUT && iptables-nft -t nat -A OUTPUT -j ISTIO_OUTPUT && \
             iptables-nft -t nat -A ISTIO_OUTPUT -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
        ),
        _ => ns.sh(
            "nft add table inet istio-ambient-nat && \
             nft add chain inet istio-ambient-nat output '{ type nat hook output priority -100; }' && \
             nft add rule inet istio-ambient-nat output meta l4proto tcp meta mark and 0xfff != 0x539 redirect to :15001",
        ),
    };
}

/// Istio's host probe SNAT in its iptables form: the probe set and `ISTIO_POSTRT`, reached
/// first from nat POSTROUTING.
fn istios_host_rules(host: &TestNetns) {
    host.sh(
        "ipset create istio-inpod-probes-v4 hash:ip comment && \
         iptables-nft -t nat -N ISTIO_POSTRT && iptables-nft -t nat -I POSTROUTING 1 -j ISTIO_POSTRT && \
         iptables-nft -t nat -A ISTIO_POSTRT -m owner --socket-exists -p tcp \
           -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127",
    );
}

fn istio_left(ns: &TestNetns) -> String {
    ns.sh("iptables-nft-save; nft list ruleset; ipset list -n")
        .lines()
        .filter(|l| l.contains("ISTIO_") || l.contains("istio-"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Item 10 (issue 45): a node Istio's agent set up in ambient mode, taken over by ours with
/// `ADOPT_ISTIO=replace` (the default): each running pod holding Istio's in-pod rules (each
/// form) gets ours and loses Istio's (the form it held recorded for a hand-back), ztunnel is
/// handed every pod and never told to delete one, and Istio's host probe chain and IP set go
/// once our probe table holds.
#[kernel_test]
fn a_node_istio_set_up_in_ambient_mode_is_adopted_in_place() {
    let n = Node::new();
    n.ambient_namespace("shop");
    istios_host_rules(&n.host);
    let forms = ["iptables-nft", "nftables"];
    let pods: Vec<TestPod> = forms
        .iter()
        .enumerate()
        .map(|(i, form)| {
            let p = pod(
                &n,
                &format!("a{i}"),
                &format!("10.77.0.{}", 20 + i),
                4200 + i as u32,
                true,
            );
            istios_in_pod_rules(&p.netns, form);
            assert_ne!(istio_left(&p.netns), "", "{form}: Istio's rules loaded");
            p
        })
        .collect();
    let agent = n.agent_with(MONITORED);
    let z = TestZtunnel::start(&n.socket);
    for (p, form) in pods.iter().zip(forms) {
        wait_enabled(&n, p, &z);
        assert!(has_rules(&p.netns), "{form}: our table");
        assert_eq!(
            istio_left(&p.netns),
            "",
            "{form}: Istio's in-pod rules gone"
        );
        assert!(z.lands(&p.netns, &p.uid), "{form}: traffic reaches ztunnel");
    }
    eventually("Istio's host rules gone", || {
        istio_left(&n.host).is_empty().then_some(())
    });
    assert!(
        !probe_members(&n.host).is_empty() || pods.is_empty(),
        "our probe set holds the pods"
    );
    let seen = z.seen();
    assert!(
        seen.iter().all(|s| !s.starts_with("del")),
        "ztunnel was told to delete: {seen:?}"
    );
    eventually("the adoptions counted", || {
        let m = metrics(&n);
        (common::metric(
            &m,
            "redirect_cni_ambient_repairs_total",
            &["kind=\"adopted\""],
        ) >= 3.0)
            .then_some(())
    });
    // Each pod's form recorded for a hand-back (`HAND_BACK_FORM=as-adopted`).
    for (p, form) in pods.iter().zip(forms) {
        let record = n.node.path().join("run/adopted").join(&p.uid);
        let held = std::fs::read_to_string(&record).unwrap_or_default();
        assert_eq!(held.trim(), form, "{}: {}", record.display(), agent.log());
    }
    drop(agent);
}

/// Whether the pod's table sends DNS to ztunnel's proxy (15053).
fn captures_dns(ns: &TestNetns) -> bool {
    ns.sh("nft list table inet redirect_capture")
        .contains("15053")
}

/// Issue 47, item 6: a changed `ambient.istio.io/dns-capture` annotation is applied to the
/// running pod (the agent converges on it, as a pod enrolled now would get it), and holds
/// through the agent's restart: the same rules whether or not the agent restarted since.
#[kernel_test]
fn a_changed_dns_capture_annotation_applies_to_the_running_pod_and_holds_through_restarts() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent();
    let z = TestZtunnel::start(&n.socket);
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    let out = web.add(&n);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    wait_enabled(&n, &web, &z);
    assert!(captures_dns(&web.netns));
    let annotate = |v: &str| {
        n.cp.kubectl_ok(&[
            "annotate",
            "--overwrite",
            "pod",
            "web",
            "-n",
            "shop",
            &format!("ambient.istio.io/dns-capture={v}"),
        ]);
    };
    annotate("false");
    eventually("DNS no longer captured", || {
        (!captures_dns(&web.netns)).then_some(())
    });
    assert!(
        agent.log().contains("dns capture true -> false"),
        "{}",
        agent.log()
    );
    assert_eq!(web.annotation(&n).as_deref(), Some("enabled"));

    drop(agent);
    let agent = n.agent();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !captures_dns(&web.netns),
        "the restarted agent captured DNS again\n{}",
        agent.log()
    );
    annotate("true");
    eventually("DNS captured again", || {
        captures_dns(&web.netns).then_some(())
    });
}

/// Issue 47, item 1: the host's probe table is read back whole, not only its set members. With
/// the table kept but its chains flushed, made dormant, or an `accept` put first in its chain,
/// kubelet's probes would stay captured: each is put right within a pass, counted as a
/// `host_table` repair, and the table is what it was.
#[kernel_test]
fn a_host_table_flushed_made_dormant_or_bypassed_is_programmed_again_within_a_pass() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    let agent = n.agent_as(&Launch {
        args: MONITORED,
        env: &[("AMBIENT_RECONCILE_INTERVAL", "1s")],
        ..Launch::default()
    });
    let z = TestZtunnel::start(&n.socket);
    wait_enabled(&n, &web, &z);
    let listing = || n.host.sh("nft list table inet redirect_ambient_host");
    let good = eventually("the host table with web", || {
        let l = listing();
        l.contains("10.77.0.2").then_some(l)
    });
    let first_chain = good
        .lines()
        .find_map(|l| l.trim().strip_prefix("chain ")?.strip_suffix(" {"))
        .expect("a chain")
        .to_string();
    let repairs = || {
        common::metric(
            &metrics(&n),
            "redirect_cni_ambient_repairs_total",
            &["kind=\"host_table\""],
        )
    };
    for (fault, cmd) in [
        (
            "flushed",
            "nft flush table inet redirect_ambient_host".to_string(),
        ),
        (
            "dormant",
            "nft add table inet redirect_ambient_host '{ flags dormant; }'".to_string(),
        ),
        (
            "bypassed",
            format!("nft insert rule inet redirect_ambient_host {first_chain} accept"),
        ),
    ] {
        let before = repairs();
        n.host.sh(&cmd);
        assert_ne!(listing(), good, "{fault}: the fault changed nothing");
        eventually(&format!("the host table {fault}, put right"), || {
            (listing() == good && repairs() > before).then_some(())
        });
    }
    let log = agent.log();
    assert!(
        log.contains("the host's probe table differed from its plan"),
        "{log}"
    );
}

/// Issue 47, item 2: the plugin fails an ADD (code 11) after its deadline while the agent is
/// stalled; when the agent resumes, the abandoned request is dropped: ztunnel is sent nothing,
/// no rule is written in the sandbox, the pod is not annotated.
#[kernel_test]
fn an_add_the_plugin_gave_up_on_is_not_carried_out_later() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent();
    let z = TestZtunnel::start(&n.socket);
    eventually("ztunnel connected", || (z.snapshots() >= 1).then_some(()));
    let web = pod(&n, "web", "10.77.0.2", 4100, false);
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let out = web.add(&n);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_ne!(
        out.code, 0,
        "ADD passed with the agent stopped: {}",
        out.stdout
    );
    assert_eq!(out.json()["code"], 11, "{}", out.stdout);
    // The agent resumed: a pass or two later, nothing was done.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !z.seen().iter().any(|s| s.contains(&web.uid)),
        "ztunnel was sent the abandoned pod: {:?}",
        z.seen()
    );
    assert!(
        our_table(&web.netns).is_none(),
        "rules written in the abandoned sandbox"
    );
    assert_eq!(web.annotation(&n), None, "{}", agent.log());
    agent.line_with(&["ambient:", "shop/web", "gave up"]);
}

/// Issue 47, item 5: a sandbox restart. The runtime's DEL takes our rules out of the old
/// sandbox and its interface goes: the passes after it do not put the rules back in the dead
/// namespace nor count a repair (a false alert on a routine event); the runtime's ADD of the
/// new sandbox enrolls the pod there.
#[kernel_test]
fn a_sandbox_restart_is_not_taken_for_a_repair() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent_as(&Launch {
        args: MONITORED,
        env: &[("AMBIENT_RECONCILE_INTERVAL", "1s")],
        ..Launch::default()
    });
    let z = TestZtunnel::start(&n.socket);
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    let out = web.add(&n);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    wait_enabled(&n, &web, &z);
    let repairs = || {
        common::metric(
            &metrics(&n),
            "redirect_cni_ambient_repairs_total",
            &["kind=\"pod_rules\""],
        )
    };
    assert_eq!(repairs(), 0.0);

    // The runtime's DEL (ours, then the primary plugin's, which takes the interface): ours
    // leaves ambient's rules to the agent.
    let rules = our_table(&web.netns);
    let out = n.cni("DEL", &web.netns, "shop", "web", &web.uid, &["10.77.0.2"]);
    assert_eq!(out.code, 0, "DEL: {}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("left to it"), "{}", out.stderr);
    assert_eq!(our_table(&web.netns), rules, "DEL changed ambient's rules");
    n.host.sh("ip link del vweb");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        repairs(),
        0.0,
        "a pod_rules repair counted\n{}",
        agent.log()
    );
    // Something else takes the rules out of the torn-down sandbox (an older plugin's DEL):
    // not put back, not counted.
    web.netns.sh("nft delete table inet redirect_capture");
    agent.line_with(&["ambient:", "shop/web", "torn down"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        repairs(),
        0.0,
        "a pod_rules repair counted\n{}",
        agent.log()
    );
    assert!(
        our_table(&web.netns).is_none(),
        "the rules were put back in the torn-down sandbox"
    );

    // The new sandbox, its process in the host's /proc.
    let fresh = pod_netns(&n.host, "10.77.0.2", "vweb2");
    n.proc.add(4101, &cgroupfs(&web.uid), 100, fresh.path());
    let out = n.cni("ADD", &fresh, "shop", "web", &web.uid, &["10.77.0.2"]);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    let ino = std::fs::metadata(fresh.path()).unwrap().ino();
    eventually("ztunnel serves web in the new sandbox", || {
        (z.netns_of(&web.uid) == Some(ino) && our_table(&fresh).is_some()).then_some(())
    });
    assert_eq!(repairs(), 0.0, "{}", agent.log());
}

/// The agent's view's ztunnel part (`ambient.ztunnel` of `/debug/node`).
fn ztunnel_view(n: &Node) -> Option<serde_json::Value> {
    let (code, body) = common::unix_get(&debug_socket(n), "/debug/node")?;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    Some(v["ambient"]["ztunnel"].clone())
}

/// Issue 47, item 3: a rolling ztunnel upgrade. ztunnel A serves the pods; the new
/// DaemonSet's ztunnel B connects while A runs on. Both stay connected (each connects once and
/// gets one snapshot: a new connection used to close the old, and each ztunnel reconnecting at
/// once made them evict each other); a new pod's add goes to B alone; a pod deleted meanwhile
/// is deleted on both (Istio sends deletes to every connection); A stops and the pods stay
/// enabled, served by B, nothing sent again.
#[kernel_test]
fn a_rolling_ztunnel_upgrade_keeps_both_connections_adds_go_to_the_newest() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    let db = pod(&n, "db", "10.77.0.5", 4300, true);
    let _agent = n.agent_with(MONITORED);
    let a = TestZtunnel::start(&n.socket);
    wait_enabled(&n, &web, &a);
    wait_enabled(&n, &db, &a);

    let b = TestZtunnel::start(&n.socket);
    eventually("B's snapshot", || (b.snapshots() >= 1).then_some(()));
    // Both run side by side for 5 s, as during a DaemonSet's rolling update: count what each did.
    std::thread::sleep(Duration::from_secs(5));
    let counted = [
        a.connections(),
        b.connections(),
        a.snapshots(),
        b.snapshots(),
    ];
    assert_eq!(
        counted,
        [1, 1, 1, 1],
        "over 5 s: A's connections, B's, A's snapshots, B's (they evicted each other)"
    );
    let gauge = || common::metric(&metrics(&n), "ztunnel_connected", &[]);
    eventually("Istio's gauge at 2", || (gauge() == 2.0).then_some(()));
    let view = eventually("the view: two connections open", || {
        ztunnel_view(&n).filter(|z| z["connections_open"] == 2)
    });
    assert_eq!(view["connected"], true, "{view:#}");
    let serving = view["connection"].clone();
    assert!(serving.is_u64(), "{view:#}");
    for p in [&web, &db] {
        assert!(
            a.serves(&p.uid) && b.serves(&p.uid),
            "{} not on both",
            p.name
        );
    }

    // A new pod: its add goes to B, the newest; A never hears of it.
    let api = pod(&n, "api", "10.77.0.3", 4200, false);
    let out = api.add(&n);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    assert!(b.serves(&api.uid), "B did not get api: {:?}", b.seen());
    assert!(b.lands(&api.netns, &api.uid), "api's connections not on B");
    let add_api = format!("add {}", api.uid);
    assert!(!a.seen().contains(&add_api), "A got api: {:?}", a.seen());
    wait_enabled(&n, &api, &b);

    // web deleted while both run: both are told.
    n.cp.kubectl_ok(&["delete", "pod", "web", "-n", "shop", "--wait=false"]);
    let del_web = format!("del {}", web.uid);
    eventually("web deleted on A and B", || {
        (a.seen().contains(&del_web) && b.seen().contains(&del_web)).then_some(())
    });
    assert!(!a.serves(&web.uid) && !b.serves(&web.uid));

    // A's pod is stopped: B serves on, the pods stay enabled, nothing is sent again.
    let b_seen = b.seen();
    a.stop_reconnecting();
    drop(a);
    eventually("A's connection gone", || {
        ztunnel_view(&n).filter(|z| z["connections_open"] == 1)
    });
    eventually("Istio's gauge at 1", || (gauge() == 1.0).then_some(()));
    let passes = || {
        common::metric(
            &metrics(&n),
            "redirect_cni_ambient_reconcile_passes_total",
            &[],
        )
    };
    let after = passes();
    eventually("two passes since A left", || {
        (passes() >= after + 2.0).then_some(())
    });
    let view = ztunnel_view(&n).unwrap();
    assert_eq!(view["connection"], serving, "B no longer serves: {view:#}");
    for p in [&db, &api] {
        assert_eq!(p.annotation(&n).as_deref(), Some("enabled"), "{}", p.name);
        assert!(b.serves(&p.uid), "{} not on B", p.name);
    }
    assert!(b.lands(&db.netns, &db.uid), "db's connections not on B");
    assert_eq!(b.seen(), b_seen, "B was sent something again when A left");
    assert_eq!((b.connections(), b.snapshots()), (1, 1));
}
