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
//! use redirect_testkit::{istio, kernel_tests_enabled, run_probes, Topology};
//! if !kernel_tests_enabled() {
//!     return;
//! }
//! let case = istio::IstioCase::load("tproxy");
//! let topo = Topology::for_case(&case);
//! istio::load_istio_case(&topo.pod, &case); // or: topo.pod.run(|| apply_our_rules())
//! let outcomes = run_probes(&topo, &istio::probe_matrix(&case));
//! ```

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

/// The environment variable that skips kernel tests explicitly (CI never sets it).
pub const SKIP_ENV: &str = "REDIRECT_SKIP_KERNEL_TESTS";

/// Whether kernel tests run here. `REDIRECT_SKIP_KERNEL_TESTS=1` skips them (with a notice on
/// stderr); otherwise they need root, and without it this panics with a message that says so,
/// so a missing privilege is a failure, never a silent pass.
pub fn kernel_tests_enabled() -> bool {
    if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") {
        eprintln!(
            "NOTICE: kernel test skipped because {SKIP_ENV}=1 (it sends real traffic through network \
             namespaces and needs root)"
        );
        return false;
    }
    if !nix::unistd::geteuid().is_root() {
        panic!(
            "kernel tests need root (CAP_NET_ADMIN, CAP_SYS_ADMIN); run as root or set \
             {SKIP_ENV}=1 to skip them explicitly"
        );
    }
    true
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
