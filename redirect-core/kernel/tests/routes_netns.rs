//! Kernel tests for `netns` and `routes`. Each test makes a fresh network namespace of its own.
//! They are kernel tests (`#[kernel_test]`): ignored with their reason unless run with
//! `--include-ignored`, and then they need root.
//!
//! State is checked twice: through our read-back functions and through `ip` (iproute2) run
//! inside the namespace, compared with what Istio's `ip` commands produce.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use redirect_kernel::netns::{current_netns_id, netns_id_of};
use redirect_kernel::routes::{self, TproxyRouting, TproxyState};
use redirect_model::Family;
use redirect_testkit::kernel_test;

/// Istio's TPROXY mark and route table.
const ISTIO: TproxyRouting = TproxyRouting {
    mark: 1337,
    mask: u32::MAX,
    table: 133,
    priority: None,
};

// ---- helpers ----

/// A fresh network namespace, pinned by a bind mount on a file under /run/netns-test, so it
/// outlives the thread that made it. Dropping it unmounts and removes the file.
struct TestNetns {
    path: PathBuf,
}

impl TestNetns {
    fn new(tag: &str) -> TestNetns {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = Path::new("/run/netns-test");
        fs::create_dir_all(dir).expect("create /run/netns-test");
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{tag}-{}-{n}", std::process::id()));
        File::create(&path).expect("create the namespace mount point");
        let target = path.clone();
        // unshare moves only this short-lived thread into the new namespace.
        std::thread::spawn(move || {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .expect("bind-mount the new namespace");
        })
        .join()
        .expect("namespace thread");
        TestNetns { path }
    }

    /// A fresh namespace with lo up (by iproute2), as in a pod: IPv6 routes via lo need it.
    fn with_lo_up(tag: &str) -> TestNetns {
        let ns = TestNetns::new(tag);
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Runs `ip ARGS` inside the namespace (a child spawned from a thread inside inherits its
    /// namespace) and returns stdout; panics if `ip` fails.
    fn ip(&self, args: &[&str]) -> String {
        let out = redirect_kernel::netns::Netns::open(&self.path)
            .and_then(|ns| ns.run(|| Command::new("ip").args(args).output()))
            .expect("run_in")
            .expect("run ip");
        assert!(
            out.status.success(),
            "ip {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("ip output is UTF-8")
    }

    /// `ip [-6] route show table all`, only the lines of `table`. (`show table N` of a table
    /// that does not exist is an error in recent iproute2.)
    fn routes_in_table(&self, family: Family, table: u32) -> Vec<String> {
        let fam = match family {
            Family::V4 => "-4",
            Family::V6 => "-6",
        };
        let needle = format!(" table {table} ");
        self.ip(&[fam, "route", "show", "table", "all"])
            .lines()
            .filter(|l| format!("{l} ").contains(&needle))
            .map(str::to_owned)
            .collect()
    }

    fn rules(&self, family: Family) -> String {
        let fam = match family {
            Family::V4 => "-4",
            Family::V6 => "-6",
        };
        self.ip(&[fam, "rule", "show"])
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = umount2(&self.path, MntFlags::MNT_DETACH);
        let _ = fs::remove_file(&self.path);
    }
}

/// What the namespace looks like for `routing`, as iproute2 prints it.
#[derive(Debug, PartialEq, Eq)]
struct IpView {
    rules: String,
    routes: Vec<String>,
}

fn ip_view(ns: &TestNetns, family: Family, routing: &TproxyRouting) -> IpView {
    IpView {
        rules: ns.rules(family),
        routes: ns.routes_in_table(family, routing.table),
    }
}

fn count_rule_lines(rules: &str, routing: &TproxyRouting) -> usize {
    let needle = format!("fwmark {:#x} lookup {}", routing.mark, routing.table);
    rules.lines().filter(|l| l.contains(&needle)).count()
}

/// Istio's commands for TPROXY routing, run with iproute2 inside `ns`.
fn istio_ip_commands(ns: &TestNetns, family: Family, r: &TproxyRouting) {
    let (fam, dst) = match family {
        Family::V4 => ("-4", "0.0.0.0/0"),
        Family::V6 => ("-6", "::/0"),
    };
    let (mark, table) = (r.mark.to_string(), r.table.to_string());
    ns.ip(&[fam, "rule", "add", "fwmark", &mark, "lookup", &table]);
    ns.ip(&[
        fam, "route", "add", "local", dst, "dev", "lo", "table", &table,
    ]);
}

const BOTH: [Family; 2] = [Family::V4, Family::V6];

// ---- netns ----

#[kernel_test]
fn run_in_enters_the_namespace_and_leaves_the_caller_alone() {
    let ns = TestNetns::new("enter");
    let before = current_netns_id().unwrap();
    let target = netns_id_of(&ns.path).unwrap();
    assert_ne!(before, target, "a fresh namespace must differ from ours");

    // The closure may borrow mutably from the caller (scoped thread).
    let mut seen = Vec::new();
    let inside = redirect_kernel::netns::Netns::open(&ns.path)
        .and_then(|ns| {
            ns.run(|| {
                seen.push(current_netns_id().unwrap());
                current_netns_id().unwrap()
            })
        })
        .unwrap();
    assert_eq!(
        inside, target,
        "the closure must run in the target namespace"
    );
    assert_eq!(seen, vec![target]);
    assert_eq!(
        current_netns_id().unwrap(),
        before,
        "the caller's namespace changed"
    );

    // The fresh namespace has only lo, as `ip` run through run_in shows.
    let links = ns.ip(&["-o", "link", "show"]);
    assert_eq!(links.lines().count(), 1, "{links}");
    assert!(links.contains(": lo:"), "{links}");
}

#[test]
fn run_in_on_a_missing_path_is_netns_open_naming_the_path() {
    // Opening a missing file needs no privilege, so this runs everywhere.
    let path = PathBuf::from(format!(
        "/run/netns-test/does-not-exist-{}",
        std::process::id()
    ));
    let ran = AtomicBool::new(false);
    let err = redirect_kernel::netns::Netns::open(&path)
        .and_then(|ns| ns.run(|| ran.store(true, Ordering::SeqCst)))
        .unwrap_err();
    match &err {
        redirect_kernel::netns::Error::Open {
            path: p,
            cause: source,
        } => {
            assert_eq!(p, &path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected NetnsOpen, got {other:?}"),
    }
    assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    assert!(!ran.load(Ordering::SeqCst), "the closure must not run");
}

#[kernel_test]
fn run_in_turns_a_panic_into_netns_thread() {
    let ns = TestNetns::new("panic");
    let before = current_netns_id().unwrap();
    let err = redirect_kernel::netns::Netns::open(&ns.path)
        .and_then(|ns| ns.run(|| -> u32 { panic!("boom in the pod") }))
        .unwrap_err();
    match &err {
        redirect_kernel::netns::Error::Thread { path, reason } => {
            assert_eq!(path, &ns.path);
            assert!(reason.contains("boom in the pod"), "{reason}");
        }
        other => panic!("expected NetnsThread, got {other:?}"),
    }
    assert_eq!(current_netns_id().unwrap(), before);
}

#[kernel_test]
fn run_in_on_a_file_that_is_no_network_namespace_is_not_netns() {
    // A regular file, a directory, and a namespace of another kind: judged on the open
    // descriptor before any thread enters anything.
    for (path, found) in [
        ("/proc/version", "regular file"),
        ("/proc/self", "a directory"),
        ("/proc/self/ns/mnt", "another kind"),
    ] {
        let path = Path::new(path);
        let ran = AtomicBool::new(false);
        let err = redirect_kernel::netns::Netns::open(path)
            .and_then(|ns| ns.run(|| ran.store(true, Ordering::SeqCst)))
            .unwrap_err();
        match &err {
            redirect_kernel::netns::Error::NotNetns { path: p, found: f } => {
                assert_eq!(p, path);
                assert!(f.contains(found), "{path:?}: {f}");
            }
            other => panic!("{path:?}: expected NotNetns, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("is not a network namespace") && !msg.contains("CAP_SYS_ADMIN"),
            "{msg}"
        );
        assert!(!ran.load(Ordering::SeqCst), "the closure must not run");
    }
}

// ---- routes ----

#[kernel_test]
fn apply_tproxy_gives_the_same_state_as_istios_ip_commands() {
    // Istio's defaults, and a table id above 255 (it travels in an attribute, not the header).
    for r in [
        ISTIO,
        TproxyRouting {
            mark: 0x10000,
            mask: u32::MAX,
            table: 1000,
            priority: None,
        },
    ] {
        let ours = TestNetns::with_lo_up("apply-ours");
        let theirs = TestNetns::with_lo_up("apply-ip");
        redirect_kernel::testing::routes_in(&ours.path)
            .apply_tproxy(&r, &BOTH)
            .unwrap();
        for family in BOTH {
            istio_ip_commands(&theirs, family, &r);
            let view = ip_view(&ours, family, &r);
            assert_eq!(view, ip_view(&theirs, family, &r), "{family} {r:?}");
            assert_eq!(count_rule_lines(&view.rules, &r), 1, "{}", view.rules);
            assert_eq!(view.routes.len(), 1, "{:?}", view.routes);
            assert!(view.routes[0].starts_with("local "), "{:?}", view.routes);
            assert!(view.routes[0].contains(" dev lo "), "{:?}", view.routes);

            let state = redirect_kernel::testing::routes_in(&ours.path)
                .read_tproxy(&r, family)
                .unwrap();
            assert_eq!(
                state,
                TproxyState {
                    rules: 1,
                    route: true
                },
                "{family}"
            );
            // Our read-back recognises what iproute2 made, too.
            let state = redirect_kernel::testing::routes_in(&theirs.path)
                .read_tproxy(&r, family)
                .unwrap();
            assert_eq!(
                state,
                TproxyState {
                    rules: 1,
                    route: true
                },
                "{family}"
            );
        }
    }
}

#[kernel_test]
fn apply_tproxy_twice_changes_nothing() {
    let ns = TestNetns::with_lo_up("apply-twice");
    let r = ISTIO;
    redirect_kernel::testing::routes_in(&ns.path)
        .apply_tproxy(&r, &BOTH)
        .unwrap();
    let once: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&ns, f, &r)).collect();
    redirect_kernel::testing::routes_in(&ns.path)
        .apply_tproxy(&r, &BOTH)
        .unwrap();
    redirect_kernel::testing::routes_in(&ns.path)
        .apply_tproxy(&r, &BOTH)
        .unwrap();
    let thrice: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&ns, f, &r)).collect();
    assert_eq!(once, thrice);
    for (family, view) in BOTH.iter().zip(&thrice) {
        assert_eq!(
            count_rule_lines(&view.rules, &r),
            1,
            "{family}: {}",
            view.rules
        );
        assert_eq!(view.routes.len(), 1, "{family}: {:?}", view.routes);
        let state = redirect_kernel::testing::routes_in(&ns.path)
            .read_tproxy(&r, *family)
            .unwrap();
        assert_eq!(
            state,
            TproxyState {
                rules: 1,
                route: true
            }
        );
    }
    // After iproute2 made them (Istio's init container ran first), apply adds nothing.
    let theirs = TestNetns::with_lo_up("apply-after-ip");
    for family in BOTH {
        istio_ip_commands(&theirs, family, &r);
    }
    let before: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&theirs, f, &r)).collect();
    redirect_kernel::testing::routes_in(&theirs.path)
        .apply_tproxy(&r, &BOTH)
        .unwrap();
    let after: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&theirs, f, &r)).collect();
    assert_eq!(before, after);
}

#[kernel_test]
fn apply_tproxy_touches_only_the_families_asked_for() {
    let ns = TestNetns::with_lo_up("apply-v4");
    let r = ISTIO;
    let v6_before = ip_view(&ns, Family::V6, &r);
    redirect_kernel::testing::routes_in(&ns.path)
        .apply_tproxy(&r, &[Family::V4])
        .unwrap();
    assert_eq!(ip_view(&ns, Family::V6, &r), v6_before);
    let v6 = redirect_kernel::testing::routes_in(&ns.path)
        .read_tproxy(&r, Family::V6)
        .unwrap();
    assert!(v6.is_absent(), "{v6:?}");
    let v4 = redirect_kernel::testing::routes_in(&ns.path)
        .read_tproxy(&r, Family::V4)
        .unwrap();
    assert!(v4.is_complete(), "{v4:?}");
}

#[kernel_test]
fn apply_tproxy_v6_with_lo_down_is_a_route_error_saying_so() {
    let ns = TestNetns::new("lo-down");
    let r = ISTIO;
    let err = redirect_kernel::testing::routes_in(&ns.path)
        .apply_tproxy(&r, &[Family::V6])
        .unwrap_err();
    match &err {
        routes::Error::Route { family, errno, .. } => {
            assert_eq!(*family, Family::V6);
            assert_eq!(*errno, libc::ENETDOWN, "{err}");
        }
        other => panic!("expected Route, got {other:?}"),
    }
    assert!(err.to_string().contains("lo up"), "{err}");
    // IPv4 local routes do not care.
    redirect_kernel::testing::routes_in(&ns.path)
        .apply_tproxy(&r, &[Family::V4])
        .unwrap();
    let v4 = redirect_kernel::testing::routes_in(&ns.path)
        .read_tproxy(&r, Family::V4)
        .unwrap();
    assert!(v4.is_complete(), "{v4:?}");
}

#[kernel_test]
fn remove_tproxy_leaves_nothing_and_may_run_twice() {
    let ns = TestNetns::with_lo_up("remove");
    let r = ISTIO;
    let pristine: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&ns, f, &r)).collect();
    assert!(pristine.iter().all(|v| v.routes.is_empty()));

    redirect_kernel::testing::routes_in(&ns.path)
        .apply_tproxy(&r, &BOTH)
        .unwrap();
    redirect_kernel::testing::routes_in(&ns.path)
        .remove_tproxy(&r, &BOTH)
        .unwrap();
    let after: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&ns, f, &r)).collect();
    assert_eq!(after, pristine);
    for family in BOTH {
        let state = redirect_kernel::testing::routes_in(&ns.path)
            .read_tproxy(&r, family)
            .unwrap();
        assert!(state.is_absent(), "{family}: {state:?}");
    }

    // Nothing left to remove: still fine, still nothing.
    redirect_kernel::testing::routes_in(&ns.path)
        .remove_tproxy(&r, &BOTH)
        .unwrap();
    let again: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&ns, f, &r)).collect();
    assert_eq!(again, pristine);
}

#[kernel_test]
fn remove_tproxy_removes_what_iproute2_made_duplicates_included() {
    let ns = TestNetns::with_lo_up("remove-ip");
    let r = ISTIO;
    let pristine: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&ns, f, &r)).collect();
    let (mark, table) = (r.mark.to_string(), r.table.to_string());
    for family in BOTH {
        istio_ip_commands(&ns, family, &r);
        // `ip rule add` twice makes two rules: the kernel does not refuse duplicates.
        let fam = if family == Family::V4 { "-4" } else { "-6" };
        ns.ip(&[fam, "rule", "add", "fwmark", &mark, "lookup", &table]);
        assert_eq!(count_rule_lines(&ns.rules(family), &r), 2);
        let state = redirect_kernel::testing::routes_in(&ns.path)
            .read_tproxy(&r, family)
            .unwrap();
        assert_eq!(
            state,
            TproxyState {
                rules: 2,
                route: true
            }
        );
    }
    redirect_kernel::testing::routes_in(&ns.path)
        .remove_tproxy(&r, &BOTH)
        .unwrap();
    let after: Vec<IpView> = BOTH.iter().map(|&f| ip_view(&ns, f, &r)).collect();
    assert_eq!(after, pristine);
}

#[kernel_test]
fn remove_tproxy_leaves_other_rules_and_routes_alone() {
    let ns = TestNetns::with_lo_up("remove-others");
    let r = ISTIO;
    // Near misses: another mark to the same table, the same mark with an extra selector, and
    // a unicast route in the same table.
    ns.ip(&["rule", "add", "fwmark", "1338", "lookup", "133"]);
    ns.ip(&[
        "rule", "add", "fwmark", "1337", "iif", "lo", "lookup", "133",
    ]);
    ns.ip(&["route", "add", "10.1.0.0/16", "dev", "lo", "table", "133"]);
    let others = ip_view(&ns, Family::V4, &r);
    let state = redirect_kernel::testing::routes_in(&ns.path)
        .read_tproxy(&r, Family::V4)
        .unwrap();
    assert!(state.is_absent(), "near misses are not ours: {state:?}");

    redirect_kernel::testing::routes_in(&ns.path)
        .apply_tproxy(&r, &BOTH)
        .unwrap();
    redirect_kernel::testing::routes_in(&ns.path)
        .remove_tproxy(&r, &BOTH)
        .unwrap();
    assert_eq!(ip_view(&ns, Family::V4, &r), others);
}

#[test]
fn tproxy_routing_refuses_values_that_would_capture_everything() {
    // Pure validation: no namespace needed.
    let bad = [
        TproxyRouting {
            mark: 0,
            mask: u32::MAX,
            table: 133,
            priority: None,
        },
        TproxyRouting {
            mark: 1337,
            mask: u32::MAX,
            table: 0,
            priority: None,
        },
        TproxyRouting {
            mark: 1337,
            mask: u32::MAX,
            table: 254,
            priority: None,
        },
        TproxyRouting {
            mark: 1337,
            mask: u32::MAX,
            table: 255,
            priority: None,
        },
        // A zero mask matches every packet; a mark outside its mask matches none.
        TproxyRouting {
            mark: 0x111,
            mask: 0,
            table: 100,
            priority: None,
        },
        TproxyRouting {
            mark: 0x1111,
            mask: 0xfff,
            table: 100,
            priority: None,
        },
    ];
    let host = routes::Routes::open().unwrap();
    for r in bad {
        assert!(
            matches!(
                host.apply_tproxy(&r, &BOTH),
                Err(routes::Error::UnsafeRouting { .. })
            ),
            "{r:?}"
        );
        assert!(
            matches!(
                host.remove_tproxy(&r, &BOTH),
                Err(routes::Error::UnsafeRouting { .. })
            ),
            "{r:?}"
        );
    }
}

#[kernel_test]
fn lo_v6_inbound_addr_is_idempotent_and_removable() {
    let ns = TestNetns::new("lo6");
    let lo6_lines = |ns: &TestNetns| -> usize {
        ns.ip(&["-6", "addr", "show", "dev", "lo"])
            .lines()
            .filter(|l| l.trim_start().starts_with("inet6 ::6/128 "))
            .count()
    };
    assert!(!redirect_kernel::testing::routes_in(&ns.path)
        .has_lo_v6_inbound_addr()
        .unwrap());
    assert_eq!(lo6_lines(&ns), 0);

    // lo is down in a fresh namespace; the address goes on all the same.
    redirect_kernel::testing::routes_in(&ns.path)
        .ensure_lo_v6_inbound_addr()
        .unwrap();
    assert_eq!(lo6_lines(&ns), 1);
    assert!(redirect_kernel::testing::routes_in(&ns.path)
        .has_lo_v6_inbound_addr()
        .unwrap());
    redirect_kernel::testing::routes_in(&ns.path)
        .ensure_lo_v6_inbound_addr()
        .unwrap();
    assert_eq!(lo6_lines(&ns), 1);

    ns.ip(&["link", "set", "lo", "up"]);
    redirect_kernel::testing::routes_in(&ns.path)
        .ensure_lo_v6_inbound_addr()
        .unwrap();
    assert_eq!(lo6_lines(&ns), 1);

    redirect_kernel::testing::routes_in(&ns.path)
        .remove_lo_v6_inbound_addr()
        .unwrap();
    assert_eq!(lo6_lines(&ns), 0);
    assert!(!redirect_kernel::testing::routes_in(&ns.path)
        .has_lo_v6_inbound_addr()
        .unwrap());
    redirect_kernel::testing::routes_in(&ns.path)
        .remove_lo_v6_inbound_addr()
        .unwrap();
    assert_eq!(lo6_lines(&ns), 0);

    // What iproute2 adds, we see and remove.
    ns.ip(&["-6", "addr", "add", "::6/128", "dev", "lo"]);
    assert!(redirect_kernel::testing::routes_in(&ns.path)
        .has_lo_v6_inbound_addr()
        .unwrap());
    redirect_kernel::testing::routes_in(&ns.path)
        .remove_lo_v6_inbound_addr()
        .unwrap();
    assert_eq!(lo6_lines(&ns), 0);
}

/// `::6` is usable as soon as it is added: with DAD the kernel marks it tentative until its
/// address-configuration work runs (never, while `lo` is down; milliseconds later on a busy
/// node), and a bind to it fails with EADDRNOTAVAIL meanwhile: the validation probe and the
/// proxy bind it right after capture is applied.
#[kernel_test]
fn lo_v6_inbound_addr_is_usable_at_once() {
    let ns = TestNetns::new("lo6-now");
    redirect_kernel::testing::routes_in(&ns.path)
        .ensure_lo_v6_inbound_addr()
        .unwrap();
    let shown = ns.ip(&["-6", "addr", "show", "dev", "lo"]);
    assert!(
        shown.contains("::6/128") && !shown.contains("tentative"),
        "{shown}"
    );
    let bound = redirect_kernel::netns::Netns::open(&ns.path)
        .unwrap()
        .run(|| std::net::TcpListener::bind("[::6]:0").map(drop))
        .unwrap();
    assert!(bound.is_ok(), "bind [::6]:0 right after the add: {bound:?}");
}
