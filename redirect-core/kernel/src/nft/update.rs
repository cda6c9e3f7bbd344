//! The batches that program our table.
//!
//! - Into a namespace without it: create the table (failing if it appeared meanwhile), then
//!   every set, chain and rule.
//! - Over an existing table: update it in place, in one batch, from what a dump shows. The
//!   table stays; a chain whose rules changed is flushed and refilled; a set whose elements
//!   changed is flushed and refilled; an object whose kind changed (a set's key type, a chain's
//!   hook) is deleted and added again; stale chains and sets are deleted. Deleting the whole
//!   table instead made the kernel wait for an RCU grace period (~10 ms, twice) before the
//!   socket could close.
//!
//! Both are bound to the ruleset generation they were computed from, so a concurrent change
//! makes the kernel refuse the batch (ERESTART) instead of applying a stale difference.

use std::collections::BTreeSet;

use super::batch::{Batch, Encoded, Label};
use super::expr::{Expr, Verdict};
use super::lower::NftTable;
use super::message::{self, flags};
use super::state::{expected, ChainState, TableState};
use super::Features;

/// Elements per NEWSETELEM message: well under the kernel's message size for IPv6 ranges.
const ELEMS_PER_MSG: usize = 512;

fn set_ids(t: &NftTable) -> impl Fn(&str) -> u32 + '_ {
    |name| t.sets.iter().find(|s| s.name == name).map_or(0, |s| s.id)
}

fn add_set(b: &mut Batch, t: &NftTable, si: usize, definition: bool) {
    let set = &t.sets[si];
    if definition {
        b.push(
            message::new_set(&t.name, set),
            flags::ADD_SET,
            Label::AddSet(si),
        );
    }
    for (chunk, elems) in set.elements.chunks(ELEMS_PER_MSG).enumerate() {
        b.push(
            message::new_elements(&t.name, set, elems),
            flags::ADD_ELEMENTS,
            Label::AddElements { set: si, chunk },
        );
    }
}

fn add_rules(b: &mut Batch, t: &NftTable, ci: usize) {
    let ids = set_ids(t);
    let c = &t.chains[ci];
    for (ri, exprs) in c.rules.iter().enumerate() {
        b.push(
            message::new_rule(&t.name, &c.name, exprs, &ids),
            flags::ADD_RULE,
            Label::AddRule {
                chain: ci,
                rule: ri,
            },
        );
    }
}

/// Create our table with everything in it; refused (EEXIST) if the table exists.
pub fn create(t: &NftTable, first_seq: u32, genid: Option<u32>, features: Features) -> Encoded {
    let mut b = Batch::new(first_seq, genid, features);
    b.push(
        message::new_table(&t.name, true),
        flags::CREATE_TABLE,
        Label::CreateTable,
    );
    fill(&mut b, t);
    b.finish()
}

/// Whatever the namespace holds, our table becomes `t`: add the table (so the delete finds
/// one), delete it, add it with everything. It depends on no read, so no concurrent change can
/// invalidate it; the price is the table's deletion (an RCU grace period when the socket
/// closes). `apply`'s last resort when other writers keep moving the ruleset.
pub fn replace(t: &NftTable, first_seq: u32, features: Features) -> Encoded {
    let mut b = Batch::new(first_seq, None, features);
    b.push(
        message::new_table(&t.name, false),
        flags::ADD_TABLE,
        Label::AddTable,
    );
    b.push(
        message::del_table(&t.name),
        flags::DELETE,
        Label::DeleteTable(t.name.clone()),
    );
    b.push(
        message::new_table(&t.name, false),
        flags::ADD_TABLE,
        Label::AddTable,
    );
    fill(&mut b, t);
    b.finish()
}

/// Someone else's tables (Istio's, handed back) written whole, each replaced as [`replace`]
/// does, and our table `remove` deleted, in one batch bound to `genid`: the namespace goes
/// from ours to theirs with no moment between.
pub fn hand_over(
    tables: &[NftTable],
    remove: Option<&str>,
    first_seq: u32,
    genid: Option<u32>,
    features: Features,
) -> Encoded {
    let mut b = Batch::new(first_seq, genid, features);
    for t in tables {
        b.push(
            message::new_table(&t.name, false),
            flags::ADD_TABLE,
            Label::AddTable,
        );
        let del = Label::DeleteTable(t.name.clone());
        b.push(message::del_table(&t.name), flags::DELETE, del);
        b.push(
            message::new_table(&t.name, false),
            flags::ADD_TABLE,
            Label::AddTable,
        );
        fill(&mut b, t);
    }
    if let Some(name) = remove {
        let del = Label::DeleteTable(name.to_string());
        b.push(message::del_table(name), flags::DELETE, del);
    }
    b.finish()
}

/// Every set, chain and rule of `t`, into a table that is empty in this transaction.
fn fill(b: &mut Batch, t: &NftTable) {
    for si in 0..t.sets.len() {
        add_set(b, t, si, true);
    }
    for (ci, c) in t.chains.iter().enumerate() {
        b.push(
            message::new_chain(&t.name, c),
            flags::ADD_CHAIN,
            Label::AddChain(ci),
        );
    }
    for ci in 0..t.chains.len() {
        add_rules(b, t, ci);
    }
}

/// What an in-place update changes, by name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// The table's flags are cleared (a `dormant` table hooks no chain).
    pub table_flags: bool,
    /// Chains flushed and refilled (kept, with other rules).
    pub refilled_chains: Vec<String>,
    /// Chains deleted and added again (their hook or kind changed).
    pub recreated_chains: Vec<String>,
    /// Chains added (planned, not in the table).
    pub added_chains: Vec<String>,
    /// Chains deleted (in the table, not planned).
    pub deleted_chains: Vec<String>,
    /// Sets flushed and refilled (their elements changed).
    pub refilled_sets: Vec<String>,
    /// Sets deleted and added again (their key type, key length, flags or size changed).
    pub recreated_sets: Vec<String>,
    /// Sets added (planned, not in the table).
    pub added_sets: Vec<String>,
    /// Sets deleted (in the table, not planned).
    pub deleted_sets: Vec<String>,
}

impl Changes {
    /// Whether nothing changes: the table is already what the plan says.
    pub fn is_empty(&self) -> bool {
        *self == Changes::default()
    }
}

fn refers_to(rules: &[Vec<Expr>], chains: &BTreeSet<&str>, sets: &BTreeSet<&str>) -> bool {
    rules.iter().flatten().any(|e| match e {
        Expr::Verdict(Verdict::Jump(c)) => chains.contains(c.as_str()),
        Expr::Lookup { set, .. } => sets.contains(set.as_str()),
        _ => false,
    })
}

/// What turns `cur` into `t`.
pub fn changes(cur: &TableState, t: &NftTable) -> Changes {
    let want = expected(t);
    let mut ch = Changes {
        table_flags: cur.flags != want.flags,
        ..Changes::default()
    };
    for s in &want.sets {
        match cur.set(&s.name) {
            None => ch.added_sets.push(s.name.clone()),
            Some(c)
                if (c.key_type, c.key_len, c.flags, c.size)
                    != (s.key_type, s.key_len, s.flags, s.size) =>
            {
                ch.recreated_sets.push(s.name.clone())
            }
            Some(c) if c.elements != s.elements => ch.refilled_sets.push(s.name.clone()),
            Some(_) => {}
        }
    }
    for c in &cur.sets {
        if want.set(&c.name).is_none() {
            ch.deleted_sets.push(c.name.clone());
        }
    }
    let mut kept: Vec<(&ChainState, &ChainState)> = Vec::new();
    for w in &want.chains {
        match cur.chain(&w.name) {
            None => ch.added_chains.push(w.name.clone()),
            Some(c) if c.base != w.base => ch.recreated_chains.push(w.name.clone()),
            Some(c) => kept.push((w, c)),
        }
    }
    for c in &cur.chains {
        if want.chain(&c.name).is_none() {
            ch.deleted_chains.push(c.name.clone());
        }
    }
    // A kept chain whose rules are unchanged must still be refilled when one of its rules
    // refers to a chain or set that is deleted and added again: the kernel counts such
    // references and refuses to delete what is still referred to.
    let gone_chains: BTreeSet<&str> = ch.recreated_chains.iter().map(String::as_str).collect();
    let gone_sets: BTreeSet<&str> = ch
        .recreated_sets
        .iter()
        .chain(&ch.deleted_sets)
        .map(String::as_str)
        .collect();
    for (w, c) in kept {
        if w.rules != c.rules || refers_to(&c.rules, &gone_chains, &gone_sets) {
            ch.refilled_chains.push(w.name.clone());
        }
    }
    ch
}

/// The batch that turns `cur` into `t` in place; `None` when they are equal already.
pub fn update(
    cur: &TableState,
    t: &NftTable,
    first_seq: u32,
    genid: Option<u32>,
    features: Features,
) -> Option<(Encoded, Changes)> {
    let ch = changes(cur, t);
    if ch.is_empty() {
        return None;
    }
    let mut b = Batch::new(first_seq, genid, features);
    // The table is there; adding it again asserts so within the transaction, and with its
    // flags written (0) clears them: a dormant table becomes active again.
    let label = if ch.table_flags {
        Label::ActivateTable
    } else {
        Label::AddTable
    };
    b.push(
        message::new_table(&t.name, ch.table_flags),
        flags::ADD_TABLE,
        label,
    );
    // 1, 2. Empty what changes or goes, delete what goes or changes kind.
    empty_and_delete(&mut b, &t.name, &ch);
    // 3. Sets: refill the kept ones that changed, add the new and the recreated ones.
    for (si, s) in t.sets.iter().enumerate() {
        if ch.refilled_sets.contains(&s.name) {
            b.push(
                message::flush_set(&t.name, &s.name),
                flags::DELETE,
                Label::FlushSet(s.name.clone()),
            );
            add_set(&mut b, t, si, false);
        } else if ch.added_sets.contains(&s.name) || ch.recreated_sets.contains(&s.name) {
            add_set(&mut b, t, si, true);
        }
    }
    // 4. Chains, then rules (a rule may jump to any chain).
    let is_new =
        |name: &String| ch.added_chains.contains(name) || ch.recreated_chains.contains(name);
    for (ci, c) in t.chains.iter().enumerate() {
        if is_new(&c.name) {
            b.push(
                message::new_chain(&t.name, c),
                flags::ADD_CHAIN,
                Label::AddChain(ci),
            );
        }
    }
    for (ci, c) in t.chains.iter().enumerate() {
        if is_new(&c.name) || ch.refilled_chains.contains(&c.name) {
            add_rules(&mut b, t, ci);
        }
    }
    Some((b.finish(), ch))
}

/// Steps 1 and 2 of an update: empty every chain that changes or goes (their rules hold
/// references), then delete what goes or changes kind.
fn empty_and_delete(b: &mut Batch, table: &str, ch: &Changes) {
    let emptied = ch
        .refilled_chains
        .iter()
        .chain(&ch.recreated_chains)
        .chain(&ch.deleted_chains);
    for name in emptied {
        b.push(
            message::flush_chain(table, name),
            flags::DELETE,
            Label::FlushChain(name.clone()),
        );
    }
    for name in ch.recreated_chains.iter().chain(&ch.deleted_chains) {
        b.push(
            message::del_chain(table, name),
            flags::DELETE,
            Label::DeleteChain(name.clone()),
        );
    }
    for name in ch.recreated_sets.iter().chain(&ch.deleted_sets) {
        b.push(
            message::del_set(table, name),
            flags::DELETE,
            Label::DeleteSet(name.clone()),
        );
    }
}

/// Elements added to (or, `delete`, removed from) sets of the table `t` that exist already, in
/// one batch: each set of `t` holds the elements to add or remove. Bound to `genid` when given.
pub fn elements(
    t: &NftTable,
    delete: bool,
    first_seq: u32,
    genid: Option<u32>,
    features: Features,
) -> Encoded {
    let mut b = Batch::new(first_seq, genid, features);
    for (si, set) in t.sets.iter().enumerate() {
        for (chunk, elems) in set.elements.chunks(ELEMS_PER_MSG).enumerate() {
            let (msg, f, label) = match delete {
                false => (
                    message::new_elements(&t.name, set, elems),
                    flags::ADD_ELEMENTS,
                    Label::AddElements { set: si, chunk },
                ),
                true => (
                    message::del_elements(&t.name, set, elems),
                    flags::DELETE,
                    Label::DeleteElements { set: si, chunk },
                ),
            };
            b.push(msg, f, label);
        }
    }
    b.finish()
}

/// Delete our table (or any of the given names) in one batch.
pub fn delete_tables(names: &[String], first_seq: u32, features: Features) -> Encoded {
    let mut b = Batch::new(first_seq, None, features);
    for n in names {
        b.push(
            message::del_table(n),
            flags::DELETE,
            Label::DeleteTable(n.clone()),
        );
    }
    b.finish()
}
