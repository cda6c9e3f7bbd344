//! Capture rules in a namespace that we did not write: Istio's sidecar chains (iptables-legacy
//! or iptables-nft: `ISTIO_*` chains, the jumps to them and Istio's rules in built-in chains),
//! its native nftables tables (`inet istio-*`, Istio 1.27+), its ambient in-pod rules in
//! either form, and its host probe chain. Two capture layers would both act on every packet,
//! so an apply says what to do about them ([`Foreign`]): refuse, keep, or replace.
//! [`Namespace::foreign`](crate::Namespace::foreign) reads them;
//! [`Namespace::apply_with`](crate::Namespace::apply_with) applies with a policy.

pub use redirect_istio::capture::{describe, IstioRules as ForeignRules};
pub use redirect_istio::xtables::{Leftover, Tool, Variant};
/// Istio's TPROXY routing (mark 1337, route table 133): what Istio's `--cleanup-only` and
/// CNI DEL remove whatever the pod's config was.
pub use redirect_istio::TPROXY_ROUTING;

use redirect_istio::capture::IstioRuleStore;
use redirect_kernel::nft::Difference;

/// What an apply does about capture rules it did not write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Foreign {
    /// Change nothing and fail with [`Error::Refused`](crate::Error::Refused), naming them
    /// (the default): an operator decides which layer captures.
    #[default]
    Refuse,
    /// Apply ours and leave theirs as they are. Nothing is read: the fast path of a program
    /// that knows a namespace is fresh, or that coexists on purpose.
    Keep,
    /// Apply ours first, then remove theirs: every packet is captured by one layer or the
    /// other throughout, and an established connection keeps flowing (its conntrack entry
    /// holds the redirection it started with).
    Replace,
}

/// What an apply does about a table of ours that holds another capture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ours {
    /// Update it in place to the new capture, in one batch (the plugin's ADD, repair,
    /// ambient); nothing is sent when it is equal already.
    #[default]
    Replace,
    /// Fail with [`Error::Refused`](crate::Error::Refused) listing the differences:
    /// `istio-iptables` without `--reconcile`, which never changes an operator's rules
    /// silently. Equal rules are fine (the routes beside them are ensured).
    RefuseOther,
}

/// How [`Namespace::apply_with`](crate::Namespace::apply_with) treats what the namespace holds
/// already. `Apply::default()` refuses foreign rules and updates ours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Apply {
    /// Capture rules we did not write.
    pub foreign: Foreign,
    /// A table of ours for another capture.
    pub ours: Ours,
}

impl Apply {
    /// The default, with `foreign` as the policy for rules we did not write.
    pub const fn foreign(foreign: Foreign) -> Apply {
        Apply {
            foreign,
            ours: Ours::Replace,
        }
    }
}

/// Our table before an apply, as far as the apply looked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OursBefore {
    /// Not read apart from the update itself ([`Ours::Replace`]).
    NotRead,
    /// There was no table of ours.
    Absent,
    /// Ours were in place, equal: nothing was sent for the table.
    Equal,
    /// Ours held another capture, replaced in place; how it differed.
    Differed(Vec<Difference>),
}

/// What [`Namespace::apply_with`](crate::Namespace::apply_with) did.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The ruleset applied.
    pub ruleset: redirect_model::Ruleset,
    /// Our table before.
    pub ours_before: OursBefore,
    /// The foreign rules found before ours were applied; `None` under [`Foreign::Keep`],
    /// which reads nothing.
    pub foreign_found: Option<ForeignRules>,
    /// The foreign rules removed after ours were in place ([`Foreign::Replace`]).
    pub foreign_removed: ForeignRules,
}

/// No foreign rules, ever: a namespace behind another backend.
pub(crate) struct NoForeign;

impl IstioRuleStore for NoForeign {
    fn read(&self) -> redirect_istio::Result<ForeignRules> {
        Ok(ForeignRules::default())
    }

    fn remove(&self) -> redirect_istio::Result<ForeignRules> {
        Ok(ForeignRules::default())
    }
}

/// Foreign rules in memory (feature `testing`), for
/// [`Namespace::with_foreign`](crate::Namespace::with_foreign): clones share one set, so a
/// test keeps a clone to see what a run removed.
#[cfg(feature = "testing")]
#[derive(Clone, Debug, Default)]
pub struct FakeForeign(std::sync::Arc<std::sync::Mutex<ForeignRules>>);

#[cfg(feature = "testing")]
impl FakeForeign {
    /// A store holding `rules`.
    pub fn new(rules: ForeignRules) -> FakeForeign {
        FakeForeign(std::sync::Arc::new(std::sync::Mutex::new(rules)))
    }

    /// What it holds now.
    pub fn rules(&self) -> ForeignRules {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(feature = "testing")]
impl IstioRuleStore for FakeForeign {
    fn read(&self) -> redirect_istio::Result<ForeignRules> {
        Ok(self.rules())
    }

    fn remove(&self) -> redirect_istio::Result<ForeignRules> {
        Ok(std::mem::take(
            &mut *self.0.lock().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

/// What [`Namespace::apply_iptables`](crate::Namespace::apply_iptables) did.
#[derive(Clone, Debug)]
pub struct AppliedIptables {
    /// The ruleset loaded.
    pub ruleset: redirect_model::Ruleset,
    /// The binaries that loaded each family's rules.
    pub tools: Vec<Tool>,
    /// Istio's chains removed before ours were loaded ([`Foreign::Replace`]).
    pub foreign_removed: Vec<Leftover>,
    /// Our nftables table, removed ([`Foreign::Replace`]).
    pub removed_our_table: bool,
}
