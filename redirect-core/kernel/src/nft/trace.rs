//! The trace table of `redirect-validate trace`: a table of its own (never ours), with one
//! base chain that runs before every capture chain (priority -350, below raw's -300) and one
//! rule that matches exactly the flow traced and sets `meta nftrace`; from there on the
//! kernel reports every rule the packet meets (`crate::trace` reads the reports). The table is
//! created with `NFT_TABLE_F_OWNER` where the kernel has it (5.12+): it dies with the socket
//! that created it, so a killed tracer leaves nothing.
//!
//! Also here: our table's rules by handle (`Nft::rule_handles`), which the reports name. The
//! handle's methods call these with its socket.

use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{parse_string, parse_u64_be, NlasIterator};
use netlink_packet_netfilter::nftables::{
    NfTablesMessage, TableAttribute, TableFlags, TableMessage,
};
use redirect_model::{Hook, L4};

use super::batch::{Batch, Encoded, Label};
use super::error::Result;
use super::expr::{Base, Expr, MetaKey};
use super::lower::{BaseSpec, ChainKind, NftChain, NftTable};
use super::socket::Socket;
use super::{dump, message, text, Features};

/// The trace chain's priority: before raw (-300), so every capture chain sees the bit set.
pub const TRACE_PRIORITY: i32 = -350;
/// The trace table's one chain.
pub const TRACE_CHAIN: &str = "trace";

/// The flow the trace rule matches: its first packet only (for TCP, the SYN: `tcp flags & (syn
/// | ack) == syn`), so that the report is one packet's path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceMatch {
    /// Sent by a process of the namespace (`output` hook) rather than arriving (`prerouting`).
    pub outbound: bool,
    /// TCP or UDP.
    pub proto: L4,
    /// The destination address and port (before any NAT).
    pub dst: SocketAddr,
    /// The source address, when given.
    pub src: Option<IpAddr>,
    /// The sending socket's owner (outbound only).
    pub uid: Option<u32>,
}

/// The trace table named `name` for `m`: one base chain (`filter`, on `output` for an outbound
/// flow and `prerouting` for an inbound one, at [`TRACE_PRIORITY`]) holding one rule.
pub fn trace_table(name: &str, m: &TraceMatch) -> NftTable {
    let hook = if m.outbound {
        Hook::Output
    } else {
        Hook::Prerouting
    };
    let mut t = NftTable::named(name);
    t.chains.push(NftChain {
        name: TRACE_CHAIN.into(),
        base: Some(BaseSpec {
            hook,
            kind: ChainKind::Filter,
            priority: TRACE_PRIORITY,
        }),
        rules: vec![trace_rule(m)],
    });
    t
}

fn cmp(data: Vec<u8>) -> Expr {
    Expr::Cmp { eq: true, data }
}

/// `meta nfproto F meta l4proto P [ip saddr S] ip daddr D th dport N [tcp flags & (syn|ack) ==
/// syn] [meta skuid U] meta nftrace set 1`.
fn trace_rule(m: &TraceMatch) -> Vec<Expr> {
    let v6 = m.dst.is_ipv6();
    let (nfproto, addr_len, saddr_at, daddr_at) = if v6 {
        (10u8, 16, 8, 24)
    } else {
        (2u8, 4, 12, 16)
    };
    let proto = match m.proto {
        L4::Tcp => 6u8,
        L4::Udp => 17u8,
    };
    let mut r = vec![
        Expr::Meta(MetaKey::NfProto),
        cmp(vec![nfproto]),
        Expr::Meta(MetaKey::L4Proto),
        cmp(vec![proto]),
    ];
    let addr = |a: IpAddr| match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    if let Some(src) = m.src {
        r.push(Expr::Payload {
            base: Base::Network,
            offset: saddr_at,
            len: addr_len,
        });
        r.push(cmp(addr(src)));
    }
    r.push(Expr::Payload {
        base: Base::Network,
        offset: daddr_at,
        len: addr_len,
    });
    r.push(cmp(addr(m.dst.ip())));
    r.push(Expr::Payload {
        base: Base::Transport,
        offset: 2,
        len: 2,
    });
    r.push(cmp(m.dst.port().to_be_bytes().to_vec()));
    if m.proto == L4::Tcp {
        // TCP flags: byte 13 of the header; SYN 0x02, ACK 0x10.
        r.push(Expr::Payload {
            base: Base::Transport,
            offset: 13,
            len: 1,
        });
        r.push(Expr::Mask(vec![0x12]));
        r.push(cmp(vec![0x02]));
    }
    if let (true, Some(uid)) = (m.outbound, m.uid) {
        r.push(Expr::Meta(MetaKey::SkUid));
        r.push(cmp(uid.to_ne_bytes().to_vec()));
    }
    r.push(Expr::Imm(vec![1]));
    r.push(Expr::MetaSet(MetaKey::NfTrace));
    r
}

/// `add table` with `NFT_TABLE_F_OWNER` (the table dies with the socket that sends it), or
/// with flags 0 when `owner` is false, refused when the table exists.
pub(super) fn new_trace_table(name: &str, owner: bool) -> NfTablesMessage {
    let flags = if owner {
        TableFlags::Owner
    } else {
        TableFlags::empty()
    };
    NfTablesMessage::NewTable(TableMessage {
        attributes: vec![
            TableAttribute::Name(name.into()),
            TableAttribute::Flags(flags),
        ],
    })
}

/// The batch that creates the trace table `t` (as [`trace_table`] builds it): the table
/// (owned by the sending socket when `owner`), its chain and its rule.
pub fn trace_batch(t: &NftTable, owner: bool, first_seq: u32, features: Features) -> Encoded {
    let mut b = Batch::new(first_seq, None, features);
    b.push(
        new_trace_table(&t.name, owner),
        message::flags::CREATE_TABLE,
        Label::CreateTable,
    );
    for (i, c) in t.chains.iter().enumerate() {
        b.push(
            message::new_chain(&t.name, c),
            message::flags::ADD_CHAIN,
            Label::AddChain(i),
        );
    }
    for (ci, c) in t.chains.iter().enumerate() {
        for (ri, exprs) in c.rules.iter().enumerate() {
            b.push(
                message::new_rule(&t.name, &c.name, exprs, &|_| 0),
                message::flags::ADD_RULE,
                Label::AddRule {
                    chain: ci,
                    rule: ri,
                },
            );
        }
    }
    b.finish()
}

/// One rule of a table as read back with its handle: where a trace report points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleHandle {
    /// The rule's chain.
    pub chain: String,
    /// The kernel's handle of the rule (`NFTA_RULE_HANDLE`).
    pub handle: u64,
    /// Its 1-based position in the chain.
    pub position: usize,
    /// The rule in nft syntax.
    pub text: String,
}

/// `NFTA_RULE_HANDLE`.
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;

/// `Nft::add_trace_table`: the trace table `t` created over `sock`, owned by it where the
/// kernel can; whether it is owned.
pub(super) fn add_table(sock: &Socket, t: &NftTable) -> Result<bool> {
    for owner in [true, false] {
        let batch = trace_batch(t, owner, sock.next_seq(), sock.features());
        match sock.send_batch_answer(&batch)? {
            None => return Ok(owner),
            Some((_, errno)) if owner && errno == libc::EOPNOTSUPP => continue,
            Some((seq, errno)) => {
                let what = match batch.label_of(seq) {
                    Some(l) => l.describe(t),
                    None => format!("the trace table's batch (message {seq})"),
                };
                return Err(super::socket::rejected(what, errno));
            }
        }
    }
    unreachable!("the second try has no owner flag to refuse")
}

/// `Nft::rule_handles`: the rules of the table `table` with their handles, in chain order.
pub(super) fn rule_handles(sock: &Socket, table: &str) -> Result<Vec<RuleHandle>> {
    let raws = sock
        .dump_ours(message::get_rules(table), "our rules")?
        .unwrap_or_default();
    let mut out: Vec<RuleHandle> = Vec::new();
    for raw in raws {
        let (mut t, mut chain, mut handle) = (String::new(), String::new(), 0u64);
        for nla in NlasIterator::new(&raw.payload[..]) {
            let nla = nla.map_err(|e| dump::bad("a dumped rule", e))?;
            match nla.kind() {
                NFTA_RULE_TABLE => t = parse_string(nla.value()).unwrap_or_default(),
                NFTA_RULE_CHAIN => chain = parse_string(nla.value()).unwrap_or_default(),
                NFTA_RULE_HANDLE => handle = parse_u64_be(nla.value()).unwrap_or(0),
                _ => {}
            }
        }
        if t != table {
            continue;
        }
        let exprs = dump::rule(&raw.payload)
            .map_err(|e| dump::bad("a dumped rule", e))?
            .2;
        let position = out.iter().filter(|r| r.chain == chain).count() + 1;
        out.push(RuleHandle {
            chain,
            handle,
            position,
            text: text::exprs(&exprs),
        });
    }
    Ok(out)
}
