//! Reading our table back over netlink: chains, rules, sets and elements, parsed with
//! `netlink-packet-netfilter` and decoded into the typed form the plan is lowered to.

use netlink_packet_netfilter::nftables::{
    ChainAttribute, DataAttribute, GenAttribute, Hook as NlHook, ListAttribute, NfTablesMessage,
    RuleAttribute, SetAttribute, SetElementAttribute, SetElementList, TableAttribute, TableMessage,
};
use netlink_packet_netfilter::NetfilterProtoFamily;

use super::expr::Expr;
use super::lower::SetElem;
use super::message;
use super::socket::Socket;
use super::state::{BaseState, ChainState, SetState, TableState};
use super::TABLE;
use crate::error::Result;
use crate::Error;

/// How often a dump that a concurrent change interrupted is tried again.
const DUMP_TRIES: usize = 3;

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
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no generation id"),
        hint: "",
    })
}

/// Whether our table exists.
pub fn exists(sock: &Socket) -> Result<bool> {
    Ok(sock
        .request(message::get_table(TABLE), "our table")?
        .is_some())
}

/// Dump our table; `None` when it does not exist.
pub fn table(sock: &Socket) -> Result<Option<TableState>> {
    let mut tries = 0;
    loop {
        tries += 1;
        match table_once(sock) {
            Err(Error::NftRejected { errno, .. }) if errno == libc::EINTR && tries < DUMP_TRIES => {
                continue
            }
            other => return other,
        }
    }
}

fn table_once(sock: &Socket) -> Result<Option<TableState>> {
    if !exists(sock)? {
        return Ok(None);
    }
    let mut state = TableState::default();
    for msg in sock
        .dump_ours(message::get_chains(), "our chains")?
        .unwrap_or_default()
    {
        if let NfTablesMessage::NewChain(c) = msg {
            if let Some(chain) = chain(c.attributes) {
                state.chains.push(chain);
            }
        }
    }
    for msg in sock
        .dump_ours(message::get_rules(), "our rules")?
        .unwrap_or_default()
    {
        if let NfTablesMessage::NewRule(r) = msg {
            let (mut table, mut chain, mut exprs) = (String::new(), String::new(), Vec::new());
            for a in r.attributes {
                match a {
                    RuleAttribute::Table(t) => table = t,
                    RuleAttribute::Chain(c) => chain = c,
                    RuleAttribute::Expressions(list) => {
                        exprs = list.iter().map(Expr::decode).collect()
                    }
                    _ => {}
                }
            }
            if table != TABLE {
                continue;
            }
            if let Some(c) = state.chains.iter_mut().find(|c| c.name == chain) {
                c.rules.push(exprs);
            }
        }
    }
    for msg in sock
        .dump_ours(message::get_sets(), "our sets")?
        .unwrap_or_default()
    {
        if let NfTablesMessage::NewSet(s) = msg {
            if let Some(set) = set(s.attributes) {
                state.sets.push(set);
            }
        }
    }
    for set in &mut state.sets {
        let what = format!("the elements of set {}", set.name);
        for msg in sock
            .dump_ours(message::get_elements(&set.name), &what)?
            .unwrap_or_default()
        {
            if let NfTablesMessage::NewSetElement(m) = msg {
                for a in m.attributes {
                    if let SetElementList::Elements(list) = a {
                        set.elements.extend(list.iter().filter_map(element));
                    }
                }
            }
        }
    }
    state.sort();
    Ok(Some(state))
}

fn chain(attrs: Vec<ChainAttribute>) -> Option<ChainState> {
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
    (table == TABLE).then(|| ChainState {
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

fn set(attrs: Vec<SetAttribute>) -> Option<SetState> {
    let mut s = SetState {
        name: String::new(),
        key_type: 0,
        key_len: 0,
        flags: 0,
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
            _ => {}
        }
    }
    (table == TABLE).then_some(s)
}

fn element(elem: &ListAttribute<SetElementAttribute>) -> Option<SetElem> {
    let ListAttribute::Element(attrs) = elem else {
        return None;
    };
    let mut out = SetElem {
        key: Vec::new(),
        interval_end: false,
    };
    for a in attrs {
        match a {
            SetElementAttribute::Key(DataAttribute::Value(k)) => out.key = k.clone(),
            SetElementAttribute::Flags(f) => out.interval_end = f.bits() & 1 != 0,
            _ => {}
        }
    }
    Some(out)
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
    for (family, msg) in all.unwrap_or_default() {
        if let NfTablesMessage::NewTable(t) = msg {
            for a in t.attributes {
                if let TableAttribute::Name(n) = a {
                    out.push((family, n));
                }
            }
        }
    }
    Ok(out)
}
