//! The kernel features our table uses that a kernel may lack: each chain type, set kind and
//! expression our lowering writes, with the module that provides it and the first Linux release
//! that has it in an `inet` table. A probe (the `probe` module) tells which ones a refused batch
//! needed and the kernel lacks.

use std::borrow::Cow;

use super::expr::{CtKey, Expr};
use super::lower::{ChainKind, NftSet};

/// One nf_tables feature: what it is, the module that provides it, the first Linux release with
/// it (in an `inet` table, where that came later).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Feature {
    /// The feature in words, as the error names it ("nftables' tproxy expression").
    pub name: Cow<'static, str>,
    /// The kernel module that provides it (`modprobe` takes this name; on kernels that build
    /// it into nf_tables, loading nf_tables is enough).
    pub module: Cow<'static, str>,
    /// The first Linux release that has it, `None` when unknown (an expression we do not know).
    pub since: Option<&'static str>,
}

const fn known(name: &'static str, module: &'static str, since: &'static str) -> Feature {
    Feature {
        name: Cow::Borrowed(name),
        module: Cow::Borrowed(module),
        since: Some(since),
    }
}

/// The `inet` family (one table for IPv4 and IPv6).
pub const INET_FAMILY: Feature = known("nftables' inet family", "nf_tables", "3.14");
/// Base chains of type `filter`.
pub const FILTER_CHAIN: Feature = known("nftables' filter chains", "nf_tables", "3.13");
/// Base chains of type `route` in an `inet` table (mangle at OUTPUT). Given as 5.2, the release
/// the inet family's NAT needs anyway: it may be older (not pinned down).
pub const ROUTE_CHAIN: Feature = known("nftables' route chains in inet tables", "nf_tables", "5.2");
/// Base chains of type `nat` in an `inet` table.
pub const NAT_CHAIN: Feature = known(
    "nftables' nat chains in inet tables",
    "nft_chain_nat",
    "5.2",
);
/// Hash sets (exact keys; with a size, the fixed-size hash).
pub const HASH_SET: Feature = known("nftables' hash sets", "nft_set_hash", "3.13");
/// Interval sets (ranges: CIDRs, port ranges).
pub const INTERVAL_SET: Feature = known("nftables' interval sets", "nft_set_rbtree", "3.13");
/// The ct expression's state and mark keys, loaded and the mark set.
pub const CT: Feature = known("nftables' ct expression", "nft_ct", "3.13");
/// The ct expression's zone key (set).
pub const CT_ZONE: Feature = known("nftables' ct zone", "nft_ct", "4.10");
/// The redir expression in an `inet` table.
pub const REDIR: Feature = known(
    "nftables' redir expression in inet tables",
    "nft_redir",
    "5.2",
);
/// The tproxy expression.
pub const TPROXY: Feature = known("nftables' tproxy expression", "nft_tproxy", "4.19");
/// The nat expression (snat) in an `inet` table.
pub const SNAT: Feature = known("nftables' nat expression in inet tables", "nft_nat", "5.2");

/// Every feature our tables may need, as `docs/deploy/README.md` lists them.
pub const FEATURES: &[Feature] = &[
    INET_FAMILY,
    FILTER_CHAIN,
    ROUTE_CHAIN,
    NAT_CHAIN,
    HASH_SET,
    INTERVAL_SET,
    CT,
    CT_ZONE,
    REDIR,
    TPROXY,
    SNAT,
];

impl Feature {
    /// The feature a base chain of this type needs.
    pub fn of_chain(kind: ChainKind) -> Feature {
        match kind {
            ChainKind::Filter => FILTER_CHAIN,
            ChainKind::Route => ROUTE_CHAIN,
            ChainKind::Nat => NAT_CHAIN,
        }
    }

    /// The feature a set needs.
    pub fn of_set(s: &NftSet) -> Feature {
        if s.interval {
            INTERVAL_SET
        } else {
            HASH_SET
        }
    }

    /// The feature an expression needs, `None` for the ones nf_tables itself holds (meta,
    /// payload, cmp, bitwise, lookup, immediate and verdicts): a kernel with nf_tables has them.
    pub fn of_expr(e: &Expr) -> Option<Feature> {
        Some(match e {
            Expr::Ct(CtKey::Zone) | Expr::CtSet(CtKey::Zone) => CT_ZONE,
            Expr::Ct(_) | Expr::CtSet(_) => CT,
            Expr::Redir => REDIR,
            Expr::Tproxy { .. } => TPROXY,
            Expr::Snat { .. } => SNAT,
            Expr::Counter => known("nftables' counter expression", "nft_counter", "3.13"),
            Expr::Foreign(f) => Feature {
                name: format!("nftables' {} expression", f.name).into(),
                module: format!("nft_{}", f.name).into(),
                since: None,
            },
            Expr::Meta(_)
            | Expr::MetaSet(_)
            | Expr::Payload { .. }
            | Expr::Cmp { .. }
            | Expr::Mask(_)
            | Expr::Bits { .. }
            | Expr::Lookup { .. }
            | Expr::Imm(_)
            | Expr::Verdict(_) => return None,
        })
    }
}

impl std::fmt::Display for Feature {
    /// `nftables' tproxy expression (module nft_tproxy, Linux 4.19 or later)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.since {
            Some(v) => write!(
                f,
                "{} (module {}, Linux {v} or later)",
                self.name, self.module
            ),
            None => write!(f, "{} (module {})", self.name, self.module),
        }
    }
}

/// Whether a refusal with `errno` can mean a missing feature: the kernel answers ENOENT for an
/// expression, chain type or set type it does not know (after trying to load its module),
/// EOPNOTSUPP for a key or hook it does not support, EAFNOSUPPORT for a family it lacks.
pub fn may_be_missing(errno: i32) -> bool {
    matches!(errno, libc::ENOENT | libc::EOPNOTSUPP | libc::EAFNOSUPPORT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::expr::Foreign;

    #[test]
    fn each_module_backed_expression_names_its_module() {
        let cases = [
            (Expr::Tproxy { nfproto: 2 }, "nft_tproxy", Some("4.19")),
            (Expr::Tproxy { nfproto: 10 }, "nft_tproxy", Some("4.19")),
            (Expr::Redir, "nft_redir", Some("5.2")),
            (Expr::Snat { nfproto: 2 }, "nft_nat", Some("5.2")),
            (Expr::Ct(CtKey::State), "nft_ct", Some("3.13")),
            (Expr::CtSet(CtKey::Mark), "nft_ct", Some("3.13")),
            (Expr::CtSet(CtKey::Zone), "nft_ct", Some("4.10")),
        ];
        for (e, module, since) in cases {
            let f = Feature::of_expr(&e).unwrap();
            assert_eq!((f.module.as_ref(), f.since), (module, since), "{e:?}");
        }
        let bogus = Expr::Foreign(Foreign {
            name: "nosuchexpr".into(),
            attrs: vec![],
        });
        let f = Feature::of_expr(&bogus).unwrap();
        assert_eq!(f.module, "nft_nosuchexpr");
        assert_eq!(
            f.to_string(),
            "nftables' nosuchexpr expression (module nft_nosuchexpr)"
        );
        assert_eq!(Feature::of_expr(&Expr::Redir).unwrap().since, Some("5.2"));
    }

    #[test]
    fn nf_tables_own_expressions_need_no_module() {
        assert_eq!(Feature::of_expr(&Expr::Imm(vec![1])), None);
        assert_eq!(
            Feature::of_expr(&Expr::Meta(crate::nft::MetaKey::SkUid)),
            None
        );
    }

    #[test]
    fn chain_types_and_sets() {
        assert_eq!(Feature::of_chain(ChainKind::Nat), NAT_CHAIN);
        assert_eq!(NAT_CHAIN.module, "nft_chain_nat");
        assert_eq!(Feature::of_chain(ChainKind::Route), ROUTE_CHAIN);
        assert_eq!(Feature::of_chain(ChainKind::Filter), FILTER_CHAIN);
        let mut s = crate::nft::NftSet {
            name: "s".into(),
            id: 1,
            key_type: 13,
            key_len: 2,
            interval: true,
            size: None,
            elements: vec![],
        };
        assert_eq!(Feature::of_set(&s), INTERVAL_SET);
        s.interval = false;
        assert_eq!(Feature::of_set(&s), HASH_SET);
    }

    #[test]
    fn the_message_names_feature_module_and_release() {
        assert_eq!(
            TPROXY.to_string(),
            "nftables' tproxy expression (module nft_tproxy, Linux 4.19 or later)"
        );
    }

    #[test]
    fn only_the_errnos_of_an_unknown_object_may_mean_a_missing_feature() {
        for e in [libc::ENOENT, libc::EOPNOTSUPP, libc::EAFNOSUPPORT] {
            assert!(may_be_missing(e), "{e}");
        }
        for e in [
            libc::EINVAL,
            libc::EEXIST,
            libc::EBUSY,
            libc::EPERM,
            libc::ERESTART,
        ] {
            assert!(!may_be_missing(e), "{e}");
        }
    }
}
