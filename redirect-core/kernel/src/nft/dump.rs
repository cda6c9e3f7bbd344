//! Reading our table back over netlink: chains, rules, sets and elements, parsed with
//! `netlink-packet-netfilter` (chains, sets, each rule's expressions) or our own parsers on
//! `netlink-packet-core` (a rule's top level, set elements), and decoded into the typed form
//! the plan is lowered to.

use netlink_packet_core::{parse_string, DecodeError, NlaBuffer, NlasIterator, Parseable};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ExpressionAttribute, GenAttribute, Hook as NlHook, ListAttribute,
    NfTablesMessage, SetAttribute, SetDescription, TableAttribute, TableMessage,
};
use netlink_packet_netfilter::NetfilterProtoFamily;

use super::batch::Batch;
use super::elements;
use super::error::Error;
use super::error::Result;
use super::expr::Expr;
use super::message;
use super::socket::Socket;
use super::state::{BaseState, ChainState, SetState, TableState};

/// How often a read of our table starts over because the ruleset changed while it was read,
/// before it fails with [`Error::ReadUnsettled`]. A read takes about a millisecond; another
/// writer that moves the ruleset ten times in a row is still writing, and what it leaves is
/// for the next read to judge.
const READ_TRIES: usize = 10;

/// The ruleset's generation: a batch bound to it fails if anything changed since.
pub fn generation(sock: &Socket) -> Result<u32> {
    let answer = sock.request(message::get_gen(), "the ruleset generation")?;
    if let Some(NfTablesMessage::NewGen(g)) = answer {
        for a in g.attributes {
            if let GenAttribute::Id(id) = a {
                return Ok(id);
            }
        }
    }
    Err(Error::Netlink {
        op: "read the nf_tables generation",
        cause: std::io::Error::new(std::io::ErrorKind::InvalidData, "no generation id"),
        hint: "",
    })
}

/// The flags (`NFTA_TABLE_FLAGS`) of our table `name`, or `None` when it does not exist.
pub fn table_flags(sock: &Socket, name: &str) -> Result<Option<u32>> {
    let answer = sock.request(message::get_table(name), "our table")?;
    Ok(answer.map(|m| match m {
        NfTablesMessage::NewTable(t) => t
            .attributes
            .iter()
            .find_map(|a| match a {
                TableAttribute::Flags(f) => Some(f.bits()),
                _ => None,
            })
            .unwrap_or(0),
        _ => 0,
    }))
}

/// Dump our table `name`; `None` when it does not exist. One state of it, never a mix: see
/// [`table_at`].
pub fn table(sock: &Socket, name: &str) -> Result<Option<TableState>> {
    table_at(sock, name).map(|(_, t)| t)
}

/// Dump our table, with the ruleset generation it was read at. The table, its chains, rules,
/// sets and elements come in separate dumps; the generation is read before and after them,
/// and when it moved (another writer committed in between, so the parts may belong to two
/// states) the read starts over, up to [`READ_TRIES`] times.
pub fn table_at(sock: &Socket, name: &str) -> Result<(u32, Option<TableState>)> {
    for _ in 0..READ_TRIES {
        let before = generation(sock)?;
        let state = match table_once(sock, name) {
            // A dump the kernel marked interrupted: the generation moved too.
            Err(Error::Rejected { errno, .. }) if errno == libc::EINTR => continue,
            // No table (a pod's first run): one answer, nothing that can mix two states. A
            // writer creating it in flight is not visible until it commits, and its commit
            // moves the generation, which a batch bound to `before` then fails on.
            Ok(None) => return Ok((before, None)),
            other => other?,
        };
        wait_for_writers(sock)?;
        if generation(sock)? == before {
            return Ok((before, state));
        }
    }
    Err(Error::ReadUnsettled { tries: READ_TRIES })
}

/// Returns once no other transaction is in flight. A writer's batch changes the table's
/// objects while the kernel prepares it, before its commit moves the generation, and a dump
/// that runs meanwhile can see elements twice; a generation read right after that dump would
/// still be the old one. Any batch takes the kernel's commit mutex, so an empty one (begin,
/// end: nothing to commit, the generation stays) returns after the writer committed or
/// aborted, and the generation read next tells whether it committed.
fn wait_for_writers(sock: &Socket) -> Result<()> {
    let empty = Batch::new(sock.next_seq(), None, sock.features()).finish();
    sock.send_batch(&empty, &|_| {
        "an empty batch (waiting for other writers)".into()
    })
}

fn table_once(sock: &Socket, name: &str) -> Result<Option<TableState>> {
    let Some(flags) = table_flags(sock, name)? else {
        return Ok(None);
    };
    let mut state = TableState {
        flags,
        ..TableState::default()
    };
    for raw in sock
        .dump_ours(message::get_chains(name), "our chains")?
        .unwrap_or_default()
    {
        if let NfTablesMessage::NewChain(c) = raw.parsed()? {
            if let Some(chain) = chain(c.attributes, name) {
                state.chains.push(chain);
            }
        }
    }
    for raw in sock
        .dump_ours(message::get_rules(name), "our rules")?
        .unwrap_or_default()
    {
        let (table, chain, exprs) = rule(&raw.payload).map_err(|e| bad("a dumped rule", e))?;
        if table != name {
            continue;
        }
        if let Some(c) = state.chains.iter_mut().find(|c| c.name == chain) {
            c.rules.push(exprs);
        }
    }
    for raw in sock
        .dump_ours(message::get_sets(name), "our sets")?
        .unwrap_or_default()
    {
        if let NfTablesMessage::NewSet(s) = raw.parsed()? {
            if let Some(set) = set(s.attributes, name) {
                state.sets.push(set);
            }
        }
    }
    for set in &mut state.sets {
        let what = format!("the elements of set {}", set.name);
        for raw in sock
            .dump_ours(message::get_elements(name, &set.name), &what)?
            .unwrap_or_default()
        {
            let elems = elements::parse(&raw.payload).map_err(|e| bad("dumped elements", e))?;
            set.elements.extend(elems);
        }
    }
    state.sort();
    Ok(Some(state))
}

pub(super) fn bad(what: &'static str, e: DecodeError) -> Error {
    Error::Netlink {
        op: what,
        cause: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
        hint: "",
    }
}

// enum nft_rule_attributes
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;

/// A dumped rule's table, chain and expressions. The top level is walked here; each
/// expression is parsed by netlink-packet-netfilter (its rule parser formats the whole
/// expression list into each expression's error context).
pub(super) fn rule(payload: &[u8]) -> Result<(String, String, Vec<Expr>), DecodeError> {
    let mut exprs = Vec::new();
    let (table, chain) = rule_walk(payload, |e| {
        let list = ListAttribute::<ExpressionAttribute>::parse(e)?;
        exprs.push(super::expr::decode(&list));
        Ok(())
    })?;
    Ok((table, chain, exprs))
}

/// A dumped rule's table and chain, with `each` called on every expression (`NFTA_LIST_ELEM`)
/// in order: the one walk of a rule's top level, for the typed read and the counters' read.
pub(super) fn rule_walk(
    payload: &[u8],
    mut each: impl FnMut(&NlaBuffer<&[u8]>) -> Result<(), DecodeError>,
) -> Result<(String, String), DecodeError> {
    let (mut table, mut chain) = (String::new(), String::new());
    for nla in NlasIterator::new(payload) {
        let nla = nla?;
        match nla.kind() {
            NFTA_RULE_TABLE => table = parse_string(nla.value())?,
            NFTA_RULE_CHAIN => chain = parse_string(nla.value())?,
            NFTA_RULE_EXPRESSIONS => {
                for e in NlasIterator::new(nla.value()) {
                    each(&e?)?;
                }
            }
            _ => {}
        }
    }
    Ok((table, chain))
}

fn chain(attrs: Vec<ChainAttribute>, ours: &str) -> Option<ChainState> {
    let (mut table, mut name, mut kind) = (String::new(), String::new(), None);
    let (mut hook, mut priority, mut policy) = (None, 0i32, 1u32);
    for a in attrs {
        match a {
            ChainAttribute::Table(t) => table = t,
            ChainAttribute::Name(n) => name = n,
            ChainAttribute::Type(t) => kind = Some(t),
            ChainAttribute::Policy(p) => policy = p,
            ChainAttribute::Hook(h) => {
                for x in h {
                    match x {
                        NlHook::Number(n) => hook = Some(u32::from(n)),
                        NlHook::Priority(p) => priority = p as i32,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    (table == ours).then(|| ChainState {
        name,
        base: hook.map(|hook| BaseState {
            kind: kind.unwrap_or_default(),
            hook,
            priority,
            policy,
        }),
        rules: Vec::new(),
    })
}

fn set(attrs: Vec<SetAttribute>, ours: &str) -> Option<SetState> {
    let mut s = SetState {
        name: String::new(),
        key_type: 0,
        key_len: 0,
        flags: 0,
        size: None,
        elements: Vec::new(),
    };
    let mut table = String::new();
    for a in attrs {
        match a {
            SetAttribute::Table(t) => table = t,
            SetAttribute::Name(n) => s.name = n,
            SetAttribute::Flags(f) => s.flags = f.bits(),
            SetAttribute::KeyType(t) => s.key_type = t,
            SetAttribute::KeyLen(l) => s.key_len = l,
            SetAttribute::Description(d) => {
                for x in d {
                    if let SetDescription::Size(n) = x {
                        s.size = Some(n);
                    }
                }
            }
            _ => {}
        }
    }
    (table == ours).then_some(s)
}

/// Every table of the namespace as (nfproto family, name), from one dump of all families.
pub fn tables(sock: &Socket) -> Result<Vec<(u8, String)>> {
    // The request names no table, and its family is UNSPEC: every family's tables.
    let all = sock.dump(
        NetfilterProtoFamily::Unspec,
        NfTablesMessage::GetTable(TableMessage { attributes: vec![] }),
        "the tables",
    )?;
    let mut out = Vec::new();
    for raw in all.unwrap_or_default() {
        if let NfTablesMessage::NewTable(t) = raw.parsed()? {
            for a in t.attributes {
                if let TableAttribute::Name(n) = a {
                    out.push((raw.family, n));
                }
            }
        }
    }
    Ok(out)
}
