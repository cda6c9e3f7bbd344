//! Kernel test kit: real traffic through a pod-like network namespace, and where it landed.
//!
//! A crate of its own, a dev-dependency of the others: the release binaries never link it
//! (`cargo tree -e normal` shows it nowhere).
//!
//! - [`TestNetns`]: a fresh named network namespace (`/run/netns/<name>`), deleted on drop.
//! - [`Topology`]: a `pod` and a `peer` namespace joined by veth pairs (`eth0` plus optional extra
//!   interfaces), "remote" addresses owned by the peer, and listeners on both sides that answer every
//!   connection with a landing report (side, listener port, `SO_ORIGINAL_DST`, local address).
//! - [`Probe`] / [`run_probe`] / [`run_probes`]: connect from the pod (as a given uid/gid, on a
//!   thread of its own whose credentials alone are switched) or from the peer (optionally through a
//!   given pod interface), and report the [`Outcome`].
//! - [`Landings`]: listeners in any namespaces that report where each connection landed, and a
//!   client connecting as a given UID: whole-program tests and the demo.
//! - [`istio`]: Istio's `istio-iptables` test cases (`testdata/istio/iptables`), loading their
//!   `iptables-restore` input into a namespace, and a probe matrix per case.
//!
//! Typical use, for any ruleset:
//!
//! ```no_run
//! use redirect_testkit::{istio, kernel_test, run_probes};
//! #[kernel_test]
//! fn tproxy_case_lands_as_istio_says() {
//! let case = istio::IstioCase::load("tproxy");
//! let topo = istio::case_topology(&case);
//! istio::load_istio_case(&topo.pod, &case); // or: topo.pod.run(|| apply_our_rules())
//! let outcomes = run_probes(&topo, &istio::probe_matrix(&case));
//! }
//! ```
//!
//! **Kernel tests say what they are.** A test that needs root and network namespaces (it
//! creates namespaces, sends real traffic, programs nftables) is a [`kernel_test`], never a
//! plain `#[test]` with a guard that returns early: `#[kernel_test]` makes it a test ignored
//! with its reason (`ignored, kernel test: needs root and network namespaces ...`), and
//! `cargo test -- --include-ignored` runs it, first calling [`require_kernel`], which fails
//! naming what is missing where it cannot run. `scripts/test.sh` runs every test with
//! `--include-ignored` as root and fails if any test was reported ignored
//! (`redirect-core/tests/layers.rs` finds a test left with the old guard).

#![deny(missing_docs)]

pub mod bad_input;
pub mod binary;
pub mod configs;
pub mod docs;
pub mod errors;
mod flow;
mod landings;
mod listeners;
pub mod netns;
mod sock;
mod topology;
mod traffic;

pub mod istio;

pub use flow::{Proto, Side, Timing};
pub use landings::{Landing, Landings};
pub use listeners::{ListenerSpec, CAPTURE_PORTS, DNS_PROXY_PORT};
pub use netns::TestNetns;
pub use redirect_testkit_macros::kernel_test;
pub use topology::{Link, Topology, TopologySpec, PEER4, PEER6, POD4, POD6};
pub use traffic::{
    run_probe, run_probe_report, run_probe_with, run_probes, run_probes_report, From, Outcome,
    Probe, ProbeReport,
};

/// How many rounds a race test runs: `REDIRECT_RACE_RUNS`, else `default`.
pub fn race_runs(default: usize) -> usize {
    std::env::var("REDIRECT_RACE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Checks that this process can run a kernel test, the first statement of every
/// [`kernel_test`]: panics naming what is missing (not root; a network namespace cannot be
/// created), so a kernel test run with `--include-ignored` where it cannot run fails saying
/// why, never passes without running.
pub fn require_kernel() {
    if let Err(missing) = kernel() {
        panic!(
            "kernel test run where it cannot run: {missing}. Kernel tests need root and network \
             namespaces (CAP_NET_ADMIN, CAP_SYS_ADMIN): run them as root (scripts/test.sh does), \
             or without --include-ignored, which reports them ignored"
        );
    }
}

/// Whether kernel work can run here (root, and a network namespace can be created); when not,
/// prints a notice naming `what` and why on stderr. For the harness-less benchmarks, which
/// are no tests and have no "ignored"; a test is a [`kernel_test`] instead.
pub fn kernel_available(what: &str) -> bool {
    match kernel() {
        Ok(()) => true,
        Err(missing) => {
            eprintln!("NOTICE: {what} not run: {missing} (it needs root and network namespaces)");
            false
        }
    }
}

/// `Ok` when this process is root and can create a network namespace, else what is missing;
/// found once per process.
fn kernel() -> Result<(), String> {
    static FOUND: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let euid = nix::unistd::geteuid();
            if !euid.is_root() {
                return Err(format!("not root (effective uid {euid})"));
            }
            // A short-lived thread of its own unshares, so that no thread of the test moves.
            std::thread::spawn(|| nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET))
                .join()
                .expect("the namespace check's thread")
                .map_err(|e| {
                    format!("cannot create a network namespace (unshare(CLONE_NEWNET): {e})")
                })
        })
        .clone()
}

/// Runs `f` on a thread inside the namespace at `path` (`TestNetns::path()`,
/// `/run/netns/NAME`); panics when it cannot be entered. The kernel crate's handles on a
/// test's namespace are `redirect_kernel::testing` (this kit links no crate of the kernel's).
pub fn run_in<T: Send>(path: &std::path::Path, f: impl FnOnce() -> T + Send) -> T {
    let ns =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                    .unwrap_or_else(|e| panic!("entering {}: {e}", path.display()));
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Validate and plan `cfg` with numeric owner groups only (a name is an error naming it): the
/// tests' short way to the one way to plan, `ValidConfig::plan`.
pub fn plan(
    cfg: &redirect_model::CaptureConfig,
) -> redirect_model::Result<redirect_model::Ruleset> {
    plan_with(cfg, &redirect_model::NoGroupDatabase)
}

/// [`plan`] with a group resolver.
pub fn plan_with(
    cfg: &redirect_model::CaptureConfig,
    groups: &dyn redirect_model::GroupResolver,
) -> redirect_model::Result<redirect_model::Ruleset> {
    cfg.clone().validated()?.plan(groups)
}
