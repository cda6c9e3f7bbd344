//! Every nf_tables message we send, built with `netlink-packet-netfilter` on
//! `netlink-packet-core`'s `NetlinkMessage`: batch begin and end, table, chain, rule, set,
//! elements, their deletes and flushes, and the dump requests. Attributes come in libnftnl's
//! order and flags as libnftnl and the nftnl crate set them, so each message is byte-identical
//! to libnftnl's (held by the oracle test).

use netlink_packet_core::{
    DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLA_F_NESTED, NLM_F_ACK,
    NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, GenMessage, Hook as NlHook, HookNumber, InetHookNumber,
    NfTablesMessage, RuleAttribute, RuleMessage, SetAttribute, SetDescription, SetElementList,
    SetElementMessage, SetFlags, SetMessage, TableAttribute, TableFlags, TableMessage,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

use super::elements::Elements;
use super::expr::Expr;
use super::lower::{NftChain, NftSet, SetElem};
use super::nla_writer::NlaWriter;

/// `NFNL_SUBSYS_NFTABLES`: the subsystem a batch is for (nfgenmsg res_id of begin and end).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN`, `NFNL_MSG_BATCH_END`.
const BATCH_BEGIN: u8 = 16;
const BATCH_END: u8 = 17;
/// `NFNL_BATCH_GENID`: the batch fails with ERESTART when the ruleset generation moved.
const NFNL_BATCH_GENID: u16 = 1;
const NF_ACCEPT: u32 = 1;
/// `NFT_SET_INTERVAL`.
pub(super) const SET_INTERVAL: u32 = 4;
/// `NFT_SET_ANONYMOUS | NFT_SET_CONSTANT`: a set written inline in a rule (`{ 53, 15008 }`),
/// named `__set<N>` as nft names them; only Istio's form (`hand_over`) writes one.
const SET_ANONYMOUS_CONSTANT: u32 = 1 | 2;

/// The message kinds a batch sends for our table, with the flags each carries.
pub(super) mod flags {
    use super::*;
    /// `add table` that fails with EEXIST when the table exists.
    pub const CREATE_TABLE: u16 = NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
    pub const ADD_TABLE: u16 = NLM_F_ACK;
    pub const ADD_CHAIN: u16 = NLM_F_CREATE | NLM_F_ACK;
    pub const ADD_RULE: u16 = NLM_F_CREATE | NLM_F_APPEND | NLM_F_EXCL | NLM_F_ACK;
    pub const ADD_SET: u16 = NLM_F_CREATE | NLM_F_ACK;
    pub const ADD_ELEMENTS: u16 = NLM_F_CREATE | NLM_F_ACK;
    /// Every delete and flush.
    pub const DELETE: u16 = NLM_F_ACK;
    pub const DUMP: u16 = NLM_F_DUMP;
    pub const GET: u16 = NLM_F_ACK;
}

/// Append one netlink message (header and nfgenmsg included) to `out`.
pub(super) fn write(
    out: &mut Vec<u8>,
    family: NetfilterProtoFamily,
    res_id: u16,
    inner: impl Into<netlink_packet_netfilter::NetfilterMessageInner>,
    flags: u16,
    seq: u32,
) {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = seq;
    let msg = NetfilterMessage::new(NetfilterHeader::new(family, 0, res_id), inner);
    let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    nl.finalize();
    let start = out.len();
    out.resize(start + nl.buffer_len(), 0);
    nl.serialize(&mut out[start..]);
}

/// An nf_tables message for our `inet` table.
pub(super) fn write_nft(out: &mut Vec<u8>, msg: NfTablesMessage, flags: u16, seq: u32) {
    write(out, NetfilterProtoFamily::Inet, 0, msg, flags, seq);
}

/// Batch begin, optionally bound to a ruleset generation.
pub(super) fn write_begin(out: &mut Vec<u8>, flags: u16, seq: u32, genid: Option<u32>) {
    let inner = match genid {
        None => ControlMessage::BatchBegin,
        Some(id) => ControlMessage::Other {
            message_type: BATCH_BEGIN,
            attributes: vec![netlink_packet_core::DefaultNla::new(
                NFNL_BATCH_GENID,
                id.to_be_bytes().to_vec(),
            )],
        },
    };
    write(
        out,
        NetfilterProtoFamily::Unspec,
        NFNL_SUBSYS_NFTABLES,
        inner,
        flags,
        seq,
    );
}

pub(super) fn write_end(out: &mut Vec<u8>, flags: u16, seq: u32) {
    let _ = BATCH_END;
    write(
        out,
        NetfilterProtoFamily::Unspec,
        NFNL_SUBSYS_NFTABLES,
        ControlMessage::BatchEnd,
        flags,
        seq,
    );
}

/// `add table` (`create`: with flags 0 written, as libnftnl does for a created table).
pub(super) fn new_table(name: &str, create: bool) -> NfTablesMessage {
    let mut attributes = vec![TableAttribute::Name(name.into())];
    if create {
        attributes.push(TableAttribute::Flags(TableFlags::empty()));
    }
    NfTablesMessage::NewTable(TableMessage { attributes })
}

/// `add table` of a dormant table: its base chains hook nothing, so a probe that declares
/// them has no hook to take back when the kernel aborts it (which waits for RCU).
pub(super) fn new_dormant_table(name: &str) -> NfTablesMessage {
    NfTablesMessage::NewTable(TableMessage {
        attributes: vec![
            TableAttribute::Name(name.into()),
            TableAttribute::Flags(TableFlags::Dormant),
        ],
    })
}

pub(super) fn del_table(name: &str) -> NfTablesMessage {
    NfTablesMessage::DeleteTable(TableMessage {
        attributes: vec![TableAttribute::Name(name.into())],
    })
}

pub(super) fn new_chain(table: &str, c: &NftChain) -> NfTablesMessage {
    let mut attributes = vec![
        ChainAttribute::Table(table.into()),
        ChainAttribute::Name(c.name.clone()),
    ];
    if let Some(b) = c.base {
        attributes.push(ChainAttribute::Hook(vec![
            NlHook::Number(HookNumber::Inet(InetHookNumber::from(b.hook.number()))),
            NlHook::Priority(b.priority as u32),
        ]));
        attributes.push(ChainAttribute::Policy(NF_ACCEPT));
        attributes.push(ChainAttribute::Type(b.kind.name().into()));
    }
    NfTablesMessage::NewChain(ChainMessage { attributes })
}

pub(super) fn del_chain(table: &str, name: &str) -> NfTablesMessage {
    NfTablesMessage::DeleteChain(ChainMessage {
        attributes: vec![
            ChainAttribute::Table(table.into()),
            ChainAttribute::Name(name.into()),
        ],
    })
}

/// `flush chain`: a rule delete naming only the chain.
pub(super) fn flush_chain(table: &str, name: &str) -> NfTablesMessage {
    NfTablesMessage::DeleteRule(RuleMessage {
        attributes: vec![
            RuleAttribute::Table(table.into()),
            RuleAttribute::Chain(name.into()),
        ],
    })
}

/// `NFTA_RULE_EXPRESSIONS`.
const NFTA_RULE_EXPRESSIONS: u16 = 4;

/// A rule; its expressions written by [`NlaWriter`] into one attribute (the crate's typed
/// expressions allocate per attribute, the bulk of a default table's encoding).
pub(super) fn new_rule(
    table: &str,
    chain: &str,
    exprs: &[Expr],
    set_id: &dyn Fn(&str) -> u32,
) -> NfTablesMessage {
    let mut list = Vec::with_capacity(64 * exprs.len());
    let mut w = NlaWriter::new(&mut list);
    for e in exprs {
        e.emit(set_id, &mut w);
    }
    NfTablesMessage::NewRule(RuleMessage {
        attributes: vec![
            RuleAttribute::Table(table.into()),
            RuleAttribute::Chain(chain.into()),
            RuleAttribute::Other(DefaultNla::new(NFTA_RULE_EXPRESSIONS | NLA_F_NESTED, list)),
        ],
    })
}

pub(super) fn new_set(table: &str, s: &NftSet) -> NfTablesMessage {
    let mut flags = if s.interval { SET_INTERVAL } else { 0 };
    if s.name.starts_with("__set") {
        flags |= SET_ANONYMOUS_CONSTANT;
    }
    NfTablesMessage::NewSet(SetMessage {
        attributes: vec![
            SetAttribute::Table(table.into()),
            SetAttribute::Name(s.name.clone()),
            SetAttribute::Flags(SetFlags::from_bits_retain(flags)),
            SetAttribute::KeyType(s.key_type),
            SetAttribute::KeyLen(s.key_len),
            SetAttribute::Id(s.id),
        ]
        .into_iter()
        .chain(
            s.size
                .map(|n| SetAttribute::Description(vec![SetDescription::Size(n)])),
        )
        .collect(),
    })
}

pub(super) fn del_set(table: &str, name: &str) -> NfTablesMessage {
    NfTablesMessage::DeleteSet(SetMessage {
        attributes: vec![
            SetAttribute::Table(table.into()),
            SetAttribute::Name(name.into()),
        ],
    })
}

/// `flush set`: an element delete naming only the set.
pub(super) fn flush_set(table: &str, name: &str) -> NfTablesMessage {
    NfTablesMessage::DeleteSetElement(SetElementMessage {
        attributes: vec![
            SetElementList::Set(name.into()),
            SetElementList::Table(table.into()),
        ],
    })
}

/// A chunk of a set's elements. The element list is our own attribute type (`Elements`): the
/// crate's typed list allocates several times per element, which 20,000 interval keys feel.
/// A set id of 0 names a set committed before this batch: by name only, as `nft add element`.
pub(super) fn new_elements(table: &str, s: &NftSet, elems: &[SetElem]) -> NfTablesMessage {
    NfTablesMessage::NewSetElement(elements_message(table, s, elems))
}

/// Delete these elements of a set (each must be in it, or the kernel refuses the batch).
pub(super) fn del_elements(table: &str, s: &NftSet, elems: &[SetElem]) -> NfTablesMessage {
    NfTablesMessage::DeleteSetElement(elements_message(table, s, elems))
}

fn elements_message(table: &str, s: &NftSet, elems: &[SetElem]) -> SetElementMessage {
    let mut attributes = vec![SetElementList::Set(s.name.clone())];
    if s.id != 0 {
        attributes.push(SetElementList::SetId(s.id));
    }
    attributes.push(SetElementList::Table(table.into()));
    attributes.push(SetElementList::Other(super::extra::to_default(&Elements(
        elems,
    ))));
    SetElementMessage { attributes }
}

/// Requests of the dump: by table name, for a whole table's chains, rules or sets, and a set's
/// elements.
pub(super) fn get_table(name: &str) -> NfTablesMessage {
    NfTablesMessage::GetTable(TableMessage {
        attributes: vec![TableAttribute::Name(name.into())],
    })
}

pub(super) fn get_chains(table: &str) -> NfTablesMessage {
    NfTablesMessage::GetChain(ChainMessage {
        attributes: vec![ChainAttribute::Table(table.into())],
    })
}

pub(super) fn get_rules(table: &str) -> NfTablesMessage {
    NfTablesMessage::GetRule(RuleMessage {
        attributes: vec![RuleAttribute::Table(table.into())],
    })
}

pub(super) fn get_sets(table: &str) -> NfTablesMessage {
    NfTablesMessage::GetSet(SetMessage {
        attributes: vec![SetAttribute::Table(table.into())],
    })
}

pub(super) fn get_elements(table: &str, set: &str) -> NfTablesMessage {
    NfTablesMessage::GetSetElement(SetElementMessage {
        attributes: vec![
            SetElementList::Table(table.into()),
            SetElementList::Set(set.into()),
        ],
    })
}

pub(super) fn get_gen() -> NfTablesMessage {
    NfTablesMessage::GetGen(GenMessage { attributes: vec![] })
}
