//! [`Namespace`]: one network namespace held open, where a [`Capture`] of any kind is applied,
//! checked, read and removed, and the host probe's members added and removed. The routes and
//! the table go together: the routes first, then the table in one atomic batch, the routes
//! taken back when the table is refused (`kernel::capture`).

use std::path::Path;

use std::net::IpAddr;

use redirect_kernel::backend::{Backend, Live};
use redirect_kernel::capture::{self as kernel_capture, Cleaned, Mismatch};
use redirect_kernel::netns::Netns;
use redirect_kernel::nft::TableState;
use redirect_kernel::routes::TproxyRouting;
use redirect_kernel::SystemGroups;
use redirect_model::{Capture, HostProbeConfig, Ruleset};

use crate::error::Result;

/// A network namespace, opened once: work is done through the descriptor that was judged,
/// never through the path again, so a path that changes between two calls cannot send it
/// elsewhere.
pub struct Namespace {
    netns: Option<Netns>,
    backend: Box<dyn Backend>,
}

impl Namespace {
    /// The network namespace at `path` (`/run/netns/NAME`, `/proc/PID/ns/net`): opened, checked
    /// to be a network namespace, and its netlink sockets created inside it. Needs
    /// `CAP_SYS_ADMIN` to enter and `CAP_NET_ADMIN` in it. The caller's own namespace is not
    /// refused: a program that must never touch its own (a CNI plugin) compares
    /// [`Namespace::netns`]'s `is_current` first.
    pub fn open(path: impl AsRef<Path>) -> Result<Namespace> {
        let netns = Netns::open(path.as_ref())?;
        let backend = Box::new(Live::open_in(&netns)?);
        Ok(Namespace {
            netns: Some(netns),
            backend,
        })
    }

    /// A namespace the caller already holds open (found by a scan, or received as a
    /// descriptor): its netlink sockets are created inside it.
    pub fn from_netns(netns: Netns) -> Result<Namespace> {
        let backend = Box::new(Live::open_in(&netns)?);
        Ok(Namespace {
            netns: Some(netns),
            backend,
        })
    }

    /// The calling thread's own namespace (an init container's, for instance).
    pub fn current() -> Result<Namespace> {
        Ok(Namespace {
            netns: None,
            backend: Box::new(Live::open()?),
        })
    }

    /// A namespace behind another backend: with the `testing` feature,
    /// `kernel::fake::Fake` keeps one in memory, so a program's decisions are tested
    /// without root.
    pub fn with_backend(backend: Box<dyn Backend>) -> Namespace {
        Namespace {
            netns: None,
            backend,
        }
    }

    /// Plan `capture` (a sidecar's owner group names from the host's group database) and
    /// program it: the routes it needs, then its table, all or nothing. Returns the ruleset
    /// applied. Every kind goes the same way: a sidecar's capture and ambient's in-pod rules
    /// in a pod's namespace, the host's probe SNAT (its members with it, in the same batch) in
    /// the host's.
    pub fn apply(&self, capture: &Capture) -> Result<Ruleset> {
        let rs = capture.plan(&SystemGroups)?;
        kernel_capture::apply(self.backend(), capture, &rs)?;
        Ok(rs)
    }

    /// How the namespace differs from `capture`: its table against the plan, rule by rule,
    /// and the routes it needs. Empty when it is exactly in place.
    pub fn check(&self, capture: &Capture) -> Result<Vec<Mismatch>> {
        let rs = capture.plan(&SystemGroups)?;
        Ok(kernel_capture::check(self.backend(), capture, &rs)?)
    }

    /// [`Namespace::check`] for a caller that checks again and again (the node agent's pass
    /// over every enrolled pod): the table's dump is skipped while the ruleset's generation is
    /// still `seen`, the one the last call returned (nothing was committed in the namespace
    /// since the table read back equal); the routes are read each time. Returns the
    /// differences and the generation to pass next time (`None` when the table differed).
    pub fn check_since(
        &self,
        capture: &Capture,
        seen: Option<u32>,
    ) -> Result<(Vec<Mismatch>, Option<u32>)> {
        let rs = capture.plan(&SystemGroups)?;
        Ok(kernel_capture::check_since(
            self.backend(),
            capture,
            &rs,
            seen,
        )?)
    }

    /// `capture`'s table as the kernel holds it, one consistent read; `None` when there is
    /// none. Only its kind matters (which table): a config's values are not looked at.
    pub fn read(&self, capture: &Capture) -> Result<Option<TableState>> {
        Ok(kernel_capture::read(self.backend(), capture)?)
    }

    /// Remove `capture`: its table and the routes it would have added.
    pub fn remove(&self, capture: &Capture) -> Result<()> {
        Ok(kernel_capture::remove(self.backend(), capture)?)
    }

    /// Add pod addresses to the host's probe SNAT sets, in one batch: all or none. An address
    /// already there is fine. When the table is not there (a firewall reload flushed the
    /// ruleset), it is created with these addresses, in one batch too, and `true` says so (it
    /// holds these addresses only: add the other pods'). An address that cannot be a pod's, or
    /// an IPv6 one when `cfg` has IPv6 off, is an error naming it, and nothing is sent.
    pub fn add_members(&self, cfg: &HostProbeConfig, pods: &[IpAddr]) -> Result<bool> {
        Ok(kernel_capture::add_members(self.backend(), cfg, pods)?)
    }

    /// Remove pod addresses from the host's probe SNAT sets, in one batch; addresses not there
    /// are skipped. Returns how many were removed. Bad addresses as for
    /// [`Namespace::add_members`].
    pub fn remove_members(&self, cfg: &HostProbeConfig, pods: &[IpAddr]) -> Result<usize> {
        Ok(kernel_capture::remove_members(self.backend(), cfg, pods)?)
    }

    /// The addresses in the host's probe SNAT sets, IPv4 first, each sorted; `None` when the
    /// table is not there.
    pub fn members(&self) -> Result<Option<Vec<IpAddr>>> {
        Ok(kernel_capture::members(self.backend())?)
    }

    /// Remove whatever capture left, whichever config put it there: our table, the TPROXY
    /// routing of `routing` in both families, `::6` on `lo`.
    pub fn clean_up(&self, routing: &TproxyRouting) -> Result<Cleaned> {
        Ok(kernel_capture::cleanup(self.backend(), routing)?)
    }

    /// Run `f` inside the namespace, on a thread of its own (the caller's thread never
    /// changes namespace): to open a socket there, for instance. For [`Namespace::current`]
    /// and [`Namespace::with_backend`], `f` runs on the calling thread.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        match &self.netns {
            Some(ns) => Ok(ns.run(f)?),
            None => Ok(f()),
        }
    }

    /// The namespace file held open, when it was opened by path.
    pub fn netns(&self) -> Option<&Netns> {
        self.netns.as_ref()
    }

    /// The backend, for the layers' own jobs on this namespace (the Istio layer's policies).
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }
}
