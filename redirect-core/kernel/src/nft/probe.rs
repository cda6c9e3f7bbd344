//! Which kernel features a table needs and the kernel lacks, asked of the kernel itself with a
//! check-only batch: begin, then the messages, and no end. The kernel then handles every
//! message, answers each (an error names that message), and aborts the transaction
//! (`NFNL_ABORT_VALIDATE`, what `nft --check` relies on): nothing is committed.
//!
//! The probe declares a throwaway table holding one copy of each distinct base chain (type and
//! hook), of each distinct set (no elements), and one rule per distinct expression that a
//! module provides, alone, in a regular chain no base chain reaches (so no hook rule applies:
//! only whether the kernel knows the expression, and its key, is tested). A refusal of one of
//! these messages with ENOENT, EOPNOTSUPP or EAFNOSUPPORT names the feature.

use std::collections::BTreeSet;
use std::sync::Mutex;

use super::batch::{Batch, Label};
use super::error::{Error, MissingFeature, Result};
use super::feature::{self, Feature, INET_FAMILY};
use super::lower::{NftChain, NftSet, NftTable};
use super::message::{self, flags};
use super::socket::Socket;
use super::Features;

/// The probe's table: declared in the batch, never committed.
pub const PROBE_TABLE: &str = "redirect_feature_probe";
/// The probe's regular chain, which holds the expressions.
const EXPR_CHAIN: &str = "exprs";

/// Features this process found the kernel has: each is probed once per process.
static PRESENT: Mutex<BTreeSet<Feature>> = Mutex::new(BTreeSet::new());

/// The probe's table for `t`: what `t` needs, each once.
pub(super) fn probe_table(t: &NftTable) -> NftTable {
    let mut p = NftTable::named(PROBE_TABLE);
    for c in &t.chains {
        let Some(b) = c.base else { continue };
        if !p.chains.iter().any(|x| x.base == Some(b)) {
            p.chains.push(NftChain {
                name: format!("c{}", p.chains.len()),
                base: Some(b),
                rules: Vec::new(),
            });
        }
    }
    for s in &t.sets {
        let shape = |x: &NftSet| (x.interval, x.key_type, x.key_len, x.size.is_some());
        if !p.sets.iter().any(|x| shape(x) == shape(s)) {
            p.sets.push(NftSet {
                name: format!("s{}", p.sets.len()),
                id: p.sets.len() as u32 + 1,
                elements: Vec::new(),
                ..s.clone()
            });
        }
    }
    let mut exprs = NftChain {
        name: EXPR_CHAIN.into(),
        base: None,
        rules: Vec::new(),
    };
    for e in t.chains.iter().flat_map(|c| &c.rules).flatten() {
        if feature::Feature::of_expr(e).is_some() && !exprs.rules.iter().any(|r| r[0] == *e) {
            exprs.rules.push(vec![e.clone()]);
        }
    }
    p.chains.push(exprs);
    p
}

/// The features each message of the probe of `p` tests, by label.
fn tested(p: &NftTable, label: &Label) -> Option<Feature> {
    match label {
        Label::CreateTable => Some(INET_FAMILY),
        Label::AddSet(i) => Some(Feature::of_set(&p.sets[*i])),
        Label::AddChain(i) => p.chains[*i].base.map(|b| Feature::of_chain(b.kind)),
        Label::AddRule { chain, rule } => Feature::of_expr(&p.chains[*chain].rules[*rule][0]),
        _ => None,
    }
}

/// The features `t` needs that the kernel lacks, in the table's order; empty when it has them
/// all. Commits nothing.
pub(super) fn missing(sock: &Socket, t: &NftTable) -> Result<Vec<Feature>> {
    let p = probe_table(t);
    // Begin is sent without an ACK flag on every kernel: its answer would tell nothing here.
    let plain = Features {
        acks_batch_ends: false,
    };
    let mut b = Batch::new(sock.next_seq(), None, plain);
    b.push(
        message::new_dormant_table(&p.name),
        flags::CREATE_TABLE,
        Label::CreateTable,
    );
    for (i, s) in p.sets.iter().enumerate() {
        b.push(
            message::new_set(&p.name, s),
            flags::ADD_SET,
            Label::AddSet(i),
        );
    }
    for (i, c) in p.chains.iter().enumerate() {
        b.push(
            message::new_chain(&p.name, c),
            flags::ADD_CHAIN,
            Label::AddChain(i),
        );
    }
    let last = p.chains.len() - 1;
    for (rule, r) in p.chains[last].rules.iter().enumerate() {
        b.push(
            message::new_rule(&p.name, EXPR_CHAIN, r, &|_| 0),
            flags::ADD_RULE,
            Label::AddRule { chain: last, rule },
        );
    }
    let batch = b.check_only();
    let refused = sock.check_batch(&batch)?;
    let mut out: Vec<Feature> = Vec::new();
    for (seq, errno) in refused {
        let f = batch.label_of(seq).and_then(|l| tested(&p, l));
        match f {
            Some(f) if feature::may_be_missing(errno) && !out.contains(&f) => out.push(f),
            _ => {}
        }
    }
    if out.contains(&INET_FAMILY) {
        // Without the family every other message fails too: the family is what is missing.
        out.retain(|f| *f == INET_FAMILY);
    }
    Ok(out)
}

/// Every feature `t` needs, without asking the kernel.
pub(super) fn needed(t: &NftTable) -> BTreeSet<Feature> {
    let p = probe_table(t);
    let mut out = BTreeSet::from([INET_FAMILY]);
    out.extend(p.sets.iter().map(Feature::of_set));
    out.extend(
        p.chains
            .iter()
            .filter_map(|c| c.base.map(|b| Feature::of_chain(b.kind))),
    );
    out.extend(
        p.chains
            .iter()
            .flat_map(|c| &c.rules)
            .filter_map(|r| Feature::of_expr(&r[0])),
    );
    out
}

/// Fails with [`Error::MissingFeature`] when the kernel lacks a feature `t` needs; asks the
/// kernel only about features this process has not yet seen it have.
pub(super) fn check(sock: &Socket, t: &NftTable) -> Result<()> {
    let needed = needed(t);
    let known = PRESENT
        .lock()
        .map(|p| needed.is_subset(&p))
        .unwrap_or(false);
    if known {
        return Ok(());
    }
    let missing = missing(sock, t)?;
    if !missing.is_empty() {
        return Err(Error::MissingFeature(MissingFeature {
            features: missing,
            refused: None,
        }));
    }
    if let Ok(mut p) = PRESENT.lock() {
        p.extend(needed);
    }
    Ok(())
}

/// After the kernel refused `label` of a batch for `t` with `errno`: the missing features, when
/// the refusal can mean one and the probe finds any (a probe that fails is no diagnosis).
pub(super) fn diagnose(
    sock: &Socket,
    t: &NftTable,
    label: Option<&Label>,
    errno: i32,
) -> Vec<Feature> {
    let may_need = matches!(
        label,
        Some(
            Label::CreateTable
                | Label::AddTable
                | Label::AddSet(_)
                | Label::AddChain(_)
                | Label::AddRule { .. }
        )
    );
    if !may_need || !feature::may_be_missing(errno) {
        return Vec::new();
    }
    missing(sock, t).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::lower;

    fn default_table() -> NftTable {
        let cfg = redirect_model::CaptureConfig::istio_sidecar_default();
        lower(&redirect_testkit::plan(&cfg).unwrap())
    }

    #[test]
    fn the_probe_holds_each_chain_type_set_and_module_expression_once() {
        let t = default_table();
        let p = probe_table(&t);
        let bases: Vec<_> = p.chains.iter().filter_map(|c| c.base).collect();
        let distinct: BTreeSet<_> = t
            .chains
            .iter()
            .filter_map(|c| c.base)
            .map(|b| (b.hook.number(), b.kind.name(), b.priority))
            .collect();
        assert_eq!(bases.len(), distinct.len());
        let exprs = &p.chains.last().unwrap().rules;
        assert!(exprs.iter().all(|r| r.len() == 1));
        assert!(exprs.contains(&vec![crate::nft::Expr::Redir]), "{exprs:?}");
        assert!(needed(&t).contains(&feature::REDIR));
        assert!(needed(&t).contains(&feature::NAT_CHAIN));
        assert!(!needed(&t).contains(&feature::TPROXY));
    }
}
