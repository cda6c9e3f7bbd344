//! [`Namespace`]: one network namespace held open, where capture is applied, checked, read and
//! removed. The routes and the table go together: the routes first, then the table in one
//! atomic batch, the routes taken back when the table is refused (`kernel::capture`).

use std::path::Path;

use redirect_kernel::backend::{Backend, Live};
use redirect_kernel::capture::{self, Cleaned, Mismatch};
use redirect_kernel::netns::Netns;
use redirect_kernel::nft::TableState;
use redirect_kernel::routes::TproxyRouting;
use redirect_kernel::SystemGroups;
use redirect_model::{AmbientConfig, CaptureConfig, Ruleset, ValidConfig};

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

    /// Plan `cfg` (owner group names from the host's group database) and program it: the
    /// routes it needs, then our table, all or nothing. Returns the ruleset applied.
    pub fn apply(&self, cfg: &ValidConfig) -> Result<Ruleset> {
        let rs = cfg.plan(&SystemGroups)?;
        capture::apply(self.backend(), cfg, &rs)?;
        Ok(rs)
    }

    /// How the namespace differs from `cfg`: our table against its plan, rule by rule, and the
    /// routes it needs. Empty when capture is exactly in place.
    pub fn check(&self, cfg: &ValidConfig) -> Result<Vec<Mismatch>> {
        let rs = cfg.plan(&SystemGroups)?;
        Ok(capture::check(self.backend(), cfg, &rs)?)
    }

    /// Program Istio's ambient in-pod rules for `cfg` (ztunnel's redirection): the reply
    /// routing, then our table, all or nothing. Returns the ruleset applied.
    pub fn apply_ambient(&self, cfg: &AmbientConfig) -> Result<Ruleset> {
        let rs = cfg.plan()?;
        capture::ambient::apply(self.backend(), cfg, &rs)?;
        Ok(rs)
    }

    /// How the namespace differs from `cfg`'s ambient capture; empty when it is in place.
    pub fn check_ambient(&self, cfg: &AmbientConfig) -> Result<Vec<Mismatch>> {
        let rs = cfg.plan()?;
        Ok(capture::ambient::check(self.backend(), cfg, &rs)?)
    }

    /// [`Namespace::check_ambient`] for a caller that checks again and again (the node
    /// agent's pass over every enrolled pod): the table's dump is skipped while the ruleset's
    /// generation is still `seen`, the one the last call returned (nothing was committed in
    /// the namespace since the table read back equal); the reply routing is read each time.
    /// Returns the differences and the generation to pass next time (`None` when the table
    /// differed).
    pub fn check_ambient_since(
        &self,
        cfg: &AmbientConfig,
        seen: Option<u32>,
    ) -> Result<(Vec<Mismatch>, Option<u32>)> {
        let rs = cfg.plan()?;
        Ok(capture::ambient::check_since(
            self.backend(),
            cfg,
            &rs,
            seen,
        )?)
    }

    /// Remove ambient capture: our table and the reply routing.
    pub fn remove_ambient(&self) -> Result<()> {
        Ok(capture::ambient::remove(self.backend())?)
    }

    /// Our table as the kernel holds it, one consistent read; `None` when there is none.
    pub fn read(&self) -> Result<Option<TableState>> {
        Ok(self.backend.read_table()?)
    }

    /// Remove our table and the routes `cfg` would have added.
    pub fn remove(&self, cfg: &CaptureConfig) -> Result<()> {
        Ok(capture::remove(self.backend(), cfg)?)
    }

    /// Remove whatever capture left, whichever config put it there: our table, the TPROXY
    /// routing of `routing` in both families, `::6` on `lo`.
    pub fn clean_up(&self, routing: &TproxyRouting) -> Result<Cleaned> {
        Ok(capture::cleanup(self.backend(), routing)?)
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
