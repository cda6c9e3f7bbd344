//! [`Namespace`]: one network namespace held open, where a [`Capture`] of any kind is applied,
//! checked, read and removed, and the host probe's members added and removed. The routes and
//! the table go together: the routes first, then the table in one atomic batch, the routes
//! taken back when the table is refused (`kernel::capture`). Rules we did not write are a
//! policy of the same apply (`foreign`).

use std::path::Path;

use std::net::IpAddr;

use redirect_istio::capture::{IstioRuleStore, LiveIstioRules, Refusal, Refused};
use redirect_kernel::backend::{Backend, Live};
use redirect_kernel::capture::{self as kernel_capture, Cleaned, Mismatch};
use redirect_kernel::netns::Netns;
use redirect_kernel::nft::{self, Nft, TableState};
use redirect_kernel::routes::{Routes, TproxyRouting};
use redirect_kernel::SystemGroups;
use redirect_model::{
    AmbientConfig, Capture, CaptureConfig, HostProbeConfig, PathCounts, Ruleset, ValidConfig,
};

use crate::error::{Error, Result};
use crate::foreign::{Applied, Apply, Foreign, ForeignRules, Ours, OursBefore};
use crate::hand_back::{self, HandedBack, IstioForm};

/// A network namespace, opened once: work is done through the descriptor that was judged,
/// never through the path again, so a path that changes between two calls cannot send it
/// elsewhere.
pub struct Namespace {
    netns: Option<Netns>,
    backend: Box<dyn Backend>,
    /// Where foreign rules are read and removed: `None` for the kernel (read in the namespace
    /// itself); a test's store in memory otherwise.
    foreign: Option<Box<dyn IstioRuleStore + Send>>,
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
            foreign: None,
        })
    }

    /// A namespace the caller already holds open (found by a scan, or received as a
    /// descriptor): its netlink sockets are created inside it.
    pub fn from_netns(netns: Netns) -> Result<Namespace> {
        let backend = Box::new(Live::open_in(&netns)?);
        Ok(Namespace {
            netns: Some(netns),
            backend,
            foreign: None,
        })
    }

    /// A namespace the caller holds open and keeps: [`Namespace::from_netns`] of a second
    /// descriptor of it.
    pub fn open_in(netns: &Netns) -> Result<Namespace> {
        Namespace::from_netns(netns.try_clone()?)
    }

    /// Whether nf_tables answers in the calling thread's namespace (a CNI STATUS): one dump of
    /// its tables' families.
    pub fn nf_tables_answers() -> Result<()> {
        Nft::open()?.families_with_tables()?;
        Ok(())
    }

    /// The calling thread's own namespace (an init container's, for instance).
    pub fn current() -> Result<Namespace> {
        Ok(Namespace {
            netns: None,
            backend: Box::new(Live::open()?),
            foreign: None,
        })
    }

    /// A namespace behind another backend: with the `testing` feature,
    /// `kernel::fake::Fake` keeps one in memory, so a program's decisions are tested
    /// without root.
    /// Foreign rules are none, unless a test gives a store (`with_foreign`, feature `testing`).
    pub fn with_backend(backend: Box<dyn Backend>) -> Namespace {
        Namespace {
            netns: None,
            backend,
            foreign: Some(Box::new(crate::foreign::NoForeign)),
        }
    }

    /// This namespace, its foreign rules held by `store` (`testing::FakeForeign`): a test of
    /// a program's policy over Istio's rules, without root.
    #[cfg(feature = "testing")]
    pub fn with_foreign(mut self, store: crate::testing::FakeForeign) -> Namespace {
        self.foreign = Some(Box::new(store));
        self
    }

    /// Plan `capture` (a sidecar's owner group names from the host's group database) and
    /// program it: the routes it needs, then its table, all or nothing. Returns the ruleset
    /// applied. Every kind goes the same way: a sidecar's capture and ambient's in-pod rules
    /// in a pod's namespace, the host's probe SNAT (its members with it, in the same batch) in
    /// the host's. Capture rules we did not write are refused ([`Apply::default`]); see
    /// [`Namespace::apply_with`] for the other policies.
    pub fn apply(&self, capture: &Capture) -> Result<Ruleset> {
        Ok(self.apply_with(capture, Apply::default())?.ruleset)
    }

    /// [`Namespace::apply`] with a policy for what the namespace holds already: capture rules
    /// we did not write ([`Foreign`]: refused, kept, or replaced after ours are in) and a
    /// table of ours for another capture ([`Ours`]). A refusal changes nothing and names what
    /// was found ([`Error::Refused`](crate::Error::Refused)).
    pub fn apply_with(&self, capture: &Capture, how: Apply) -> Result<Applied> {
        let rs = capture.plan(&SystemGroups)?;
        let foreign_found = match how.foreign {
            Foreign::Keep => None,
            Foreign::Refuse | Foreign::Replace => Some(self.foreign()?),
        };
        match (how.foreign, &foreign_found) {
            (Foreign::Refuse, Some(found)) if !found.is_empty() => {
                return Err(Refused(Refusal::IstioRules(Box::new(found.clone()))).into());
            }
            // Replacing what cannot be removed would leave two captures: refused up front.
            (Foreign::Replace, Some(found)) if !found.unread.is_empty() => {
                return Err(Refused(Refusal::CannotReplace(Box::new(found.clone()))).into());
            }
            _ => {}
        }
        let ours_before = match how.ours {
            Ours::Replace => OursBefore::NotRead,
            Ours::RefuseOther => self.ours_before(capture, &rs)?,
        };
        kernel_capture::apply(self.backend(), capture, &rs)?;
        let foreign_removed = match &foreign_found {
            // Ours are in place first, so no packet goes uncaptured while theirs go.
            Some(found) if how.foreign == Foreign::Replace && !found.is_empty() => {
                self.remove_foreign()?
            }
            _ => ForeignRules::default(),
        };
        Ok(Applied {
            ruleset: rs,
            ours_before,
            foreign_found,
            foreign_removed,
        })
    }

    fn ours_before(&self, capture: &Capture, rs: &Ruleset) -> Result<OursBefore> {
        let Some(table) = self.read(capture)? else {
            return Ok(OursBefore::Absent);
        };
        let differences = nft::compare(rs, Some(&table));
        if differences.is_empty() {
            return Ok(OursBefore::Equal);
        }
        Err(Refused(Refusal::OursDiffer { differences }).into())
    }

    /// The capture rules in this namespace that we did not write (see [`crate::foreign`]):
    /// Istio's nftables tables over netlink; its iptables chains, looked for only where the
    /// kernel holds iptables tables (with the node's `iptables-save`, run inside the
    /// namespace).
    pub fn foreign(&self) -> Result<ForeignRules> {
        match &self.foreign {
            Some(store) => Ok(store.read()?),
            None => self.run(|| LiveIstioRules(&Nft::open()?).read())?,
        }
    }

    /// Remove the capture rules we did not write, all of them; returns what went.
    pub fn remove_foreign(&self) -> Result<ForeignRules> {
        match &self.foreign {
            Some(store) => Ok(store.remove()?),
            None => self.run(|| LiveIstioRules(&Nft::open()?).remove())?,
        }
    }

    /// Istio's ambient rules on the node, removed from this (the node's) namespace once ours
    /// hold there: its tables and chains as [`Namespace::remove_foreign`] removes them (the
    /// probe SNAT chain `ISTIO_POSTRT`, its `inet istio-*` tables), then its probe IP sets
    /// (`istio-inpod-probes-v4`, `-v6`), which only that chain used. iptables-legacy rules
    /// with no binary to read them stay; [`IstioHost::rules`] names them as unread. Returns
    /// what went.
    pub fn remove_istio_host(&self) -> Result<IstioHost> {
        let rules = self.remove_foreign()?;
        let sets = self.probe_sets("destroy", redirect_kernel::ipset::destroy)?;
        Ok(IstioHost { rules, sets })
    }

    /// Istio's ambient rules on the node as [`Namespace::remove_istio_host`] would find them,
    /// removing nothing.
    pub fn istio_host(&self) -> Result<IstioHost> {
        let rules = self.foreign()?;
        let sets = self.probe_sets("read", redirect_kernel::ipset::exists)?;
        Ok(IstioHost { rules, sets })
    }

    /// Istio's probe IP sets for which `op` (run inside the namespace: `read` is
    /// `ipset::exists`, `destroy` is `ipset::destroy`) answered true.
    fn probe_sets(
        &self,
        op: &'static str,
        f: fn(&str) -> std::io::Result<bool>,
    ) -> Result<Vec<String>> {
        let mut sets = Vec::new();
        for set in redirect_istio::ambient::PROBE_SETS {
            let yes = self.run(|| f(set))?.map_err(|cause| Error::IpSet {
                set: set.into(),
                op,
                cause,
            })?;
            if yes {
                sets.push(set.to_owned());
            }
        }
        Ok(sets)
    }

    /// A sidecar's `cfg` with IPv6 as Istio decides it for a pod: on when `dual_stack` and the
    /// pod has an IPv6 address, or when its only address is IPv6. The addresses are `known`
    /// ones (a CNI result's, IPv4 first) or, with none, this namespace's.
    pub fn for_pod(
        &self,
        cfg: ValidConfig,
        dual_stack: bool,
        known: Option<&[IpAddr]>,
    ) -> Result<ValidConfig> {
        let read;
        let addrs = match known.filter(|a| !a.is_empty()) {
            Some(addrs) => addrs,
            None => {
                read = self.addresses()?;
                &read
            }
        };
        let host = redirect_istio::pod_facts::detect_host_address(addrs, dual_stack)?;
        Ok(cfg.with_ipv6(host.ipv6))
    }

    /// Every address of every interface, in the kernel's order (IPv4 first).
    pub fn addresses(&self) -> Result<Vec<IpAddr>> {
        Ok(self.backend.addresses()?)
    }

    /// The addresses of a namespace held open, read without opening its nf_tables socket (a
    /// scan over many namespaces for a pod's).
    pub fn addresses_of(netns: &Netns) -> Result<Vec<IpAddr>> {
        Ok(Routes::open_in(netns)?.addresses()?)
    }

    /// How the namespace differs from `capture`: its table against the plan, rule by rule,
    /// the routes it needs, and, in a pod's namespace, capture rules another layer wrote
    /// ([`Namespace::foreign`], reported as [`Mismatch::Foreign`]). Empty when it is exactly in
    /// place.
    pub fn check(&self, capture: &Capture) -> Result<Vec<Mismatch>> {
        let rs = capture.plan(&SystemGroups)?;
        let mut found = kernel_capture::check(self.backend(), capture, &rs)?;
        // In a pod's namespace, another layer's capture beside ours is a difference too. The
        // node's own namespace holds other iptables tables (kube-proxy's) by design.
        if !matches!(capture, Capture::HostProbe { .. }) {
            let foreign = self.foreign()?;
            if !foreign.is_empty() {
                found.push(Mismatch::Foreign(foreign.to_string()));
            }
        }
        Ok(found)
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
        // Nothing committed since: no plan, no dump; the routes alone (most passes).
        if let Some(at) = kernel_capture::unchanged_since(self.backend(), seen)? {
            return Ok((
                kernel_capture::check_routes(self.backend(), capture)?,
                Some(at),
            ));
        }
        let rs = capture.plan(&SystemGroups)?;
        Ok(kernel_capture::check_since(
            self.backend(),
            capture,
            &rs,
            None,
        )?)
    }

    /// `capture`'s counters (its config has counters on), summed per path: one dump of the
    /// table's rules. `None` when the table's counters are not exactly where `capture`'s plan
    /// puts its counted rules (a table set up without counters, or by another config): a
    /// counter is attributed to a path by its place.
    pub fn path_counts(&self, capture: &Capture) -> Result<Option<PathCounts>> {
        let rs = capture.plan(&SystemGroups)?;
        Ok(kernel_capture::path_counts(self.backend(), capture, &rs)?)
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

    /// [`Namespace::clean_up`], then the capture rules we did not write (Istio's
    /// `--cleanup-only`): Istio adds the same routes and `::6`, so they go too.
    pub fn clean_up_all(&self, routing: &TproxyRouting) -> Result<(Cleaned, ForeignRules)> {
        let ours = self.clean_up(routing)?;
        Ok((ours, self.remove_foreign()?))
    }

    /// Our capture only, as CNI DEL removes it: when a table of ours is there, it goes with
    /// Istio's TPROXY routing and `::6` (only a namespace we programmed has routes of ours);
    /// whether it was there. Istio's rules are left to Istio.
    pub fn remove_ours(&self) -> Result<bool> {
        if self.backend.read_table()?.is_none() {
            return Ok(false);
        }
        self.clean_up(&crate::foreign::TPROXY_ROUTING)?;
        Ok(true)
    }

    /// Whether our table here holds ambient's in-pod rules (the node agent's, not a sidecar
    /// capture the plugin applied).
    pub fn holds_ambient(&self) -> Result<bool> {
        Ok(self.backend.read_table()?.is_some_and(|t| {
            t.chains
                .iter()
                .any(|c| redirect_model::ambient::is_ambient_chain(&c.name))
        }))
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

    /// The backend beneath: our tables, the routes beside them and the addresses, for a
    /// caller that needs one piece.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }
}

impl Namespace {
    /// Istio's rules for `cfg` (a sidecar's config) in `form`, in place of our table, in one
    /// batch bound to the generation our table was read at: no packet sees neither. The
    /// TPROXY routing and `::6` on `lo` are Istio's values and stay. Refused before anything
    /// is changed: a config Istio has no rule for (our bypass UIDs), a group name the host does
    /// not know, and a namespace that holds Istio's rules already (which the new ones would
    /// double).
    pub fn hand_back(&self, cfg: &CaptureConfig, form: IstioForm) -> Result<HandedBack> {
        cfg.validate()?;
        hand_back::refuse_istio_held(&self.foreign()?)?;
        hand_back::sidecar(self.backend(), cfg, form)
    }

    /// Istio's ambient in-pod rules for `cfg` (an enrolled pod's) in `form`, in place of our
    /// in-pod table, in one batch as [`Namespace::hand_back`]: its native nftables tables
    /// (`inet istio-ambient-*`, Istio ≥ 1.28 with `nativeNftables`) or its iptables rules as
    /// iptables-nft keeps them. The policy routing of ztunnel's replies (mark `0x111`, table
    /// 100) is Istio's too and stays; so do ztunnel's sockets in the pod. Refused before
    /// anything is changed: a namespace that holds Istio's rules already.
    pub fn hand_back_ambient(&self, cfg: &AmbientConfig, form: IstioForm) -> Result<HandedBack> {
        cfg.plan()?;
        hand_back::refuse_istio_held(&self.foreign()?)?;
        hand_back::ambient(self.backend(), cfg, form)
    }
}

impl Namespace {
    /// Read the namespace's capture once, for a person (`redirect-validate inspect`): our
    /// table, the capture rules we did not write, the TPROXY routing of `routing` in both
    /// families and `::6`; judged against `expected`.
    pub fn inspect(
        &self,
        routing: &TproxyRouting,
        expected: crate::view::Expected,
    ) -> Result<crate::view::Inspection> {
        use crate::view::Expected;
        let kernel = self.run(|| redirect_istio::validation::diagnosis::read_kernel(None))??;
        let routes = kernel_capture::RoutesSeen::read_all(self.backend(), routing)?;
        let differences = match expected {
            Expected::Sidecar(cfg, rs) => kernel_capture::compare(
                &redirect_model::sidecar_routes(cfg),
                rs,
                kernel.table.as_ref(),
                &routes,
            ),
            Expected::Uncaptured => kernel_capture::compare_uncaptured(kernel.table.as_ref()),
            Expected::Unknown => Vec::new(),
        };
        Ok(crate::view::Inspection {
            kernel,
            routes,
            differences,
        })
    }
}

impl Namespace {
    /// A sidecar's capture with the iptables backend (kernels without nf_tables,
    /// `--backend iptables`): rendered as `iptables-restore` input and loaded with the node's
    /// binaries (`force_binary`: legacy or nft; `None` chooses as Istio does), run inside the
    /// namespace. Istio's chains are refused (iptables-restore cannot create them again)
    /// unless `how.foreign` replaces them, which removes them first, with our nftables table.
    pub fn apply_iptables(
        &self,
        cfg: &ValidConfig,
        how: Apply,
        force_binary: Option<crate::foreign::Variant>,
    ) -> Result<crate::foreign::AppliedIptables> {
        let rs = cfg.plan(&SystemGroups)?;
        // The iptables backend reads no earlier rules of ours: `how.ours` has no say here.
        let replace = how.foreign == Foreign::Replace;
        let run = |k: &dyn Backend| {
            redirect_istio::capture::reconcile_iptables(k, cfg, &rs, replace, force_binary)
        };
        let done = match &self.netns {
            // The binaries act on the calling thread's namespace: run them inside this one.
            Some(ns) => ns.run(|| run(&Live::open()?))??,
            None => run(self.backend())?,
        };
        Ok(crate::foreign::AppliedIptables {
            ruleset: rs,
            tools: done.tools,
            foreign_removed: done.removed_istio_chains,
            removed_our_table: done.removed_our_table,
        })
    }
}

/// Istio's ambient rules on a node: its probe SNAT tables and chains, and its probe IP sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IstioHost {
    /// Its tables and chains (and iptables tables that could not be read).
    pub rules: ForeignRules,
    /// Its IP sets, by name.
    pub sets: Vec<String>,
}

impl IstioHost {
    /// Whether nothing of Istio's is there.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.sets.is_empty()
    }
}

impl std::fmt::Display for IstioHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.rules.is_empty(), self.sets.is_empty()) {
            (true, true) => f.write_str("none"),
            (false, true) => write!(f, "{}", self.rules),
            (true, false) => write!(f, "IP sets {}", self.sets.join(", ")),
            (false, false) => write!(f, "{}; IP sets {}", self.rules, self.sets.join(", ")),
        }
    }
}
