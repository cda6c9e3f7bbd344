//! iptables-nft's tables written over netlink, with no iptables binary: an `ip` or `ip6` table
//! (`nat`, `mangle`, `raw`) with its user chains, the built-in chains its rules use, and each
//! rule as iptables-nft encodes it (expressions, xtables matches and targets as their raw
//! attributes, and the rule's `NFTA_RULE_COMPAT` when it names a protocol, which xtables
//! extensions such as `multiport` and `TPROXY` check). For the hand-back to Istio's iptables
//! form ([`super::Nft::hand_over_xt`]).

use netlink_packet_core::DefaultNla;
use netlink_packet_netfilter::nftables::{NfTablesMessage, RuleAttribute, RuleMessage};
use netlink_packet_netfilter::NetfilterProtoFamily;
use redirect_model::Family;

use super::batch::{Batch, Encoded, Label};
use super::expr::Expr;
use super::lower::{NftChain, NftTable};
use super::message::{self, flags};
use super::nla_writer::NlaWriter;
use super::Features;

/// `NFTA_RULE_COMPAT`, and its `NFTA_RULE_COMPAT_PROTO` / `_FLAGS`.
const NFTA_RULE_COMPAT: u16 = 5;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NLA_F_NESTED: u16 = 1 << 15;

/// One rule: its expressions, and the protocol iptables-nft records beside them
/// (`-p tcp`: 6), with its inversion flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XtRuleSpec {
    /// The expressions, in iptables-nft's order.
    pub exprs: Vec<Expr>,
    /// `(protocol, flags)` of `NFTA_RULE_COMPAT`, when the rule names a protocol.
    pub compat: Option<(u32, u32)>,
}

/// One chain: a built-in one (with its hook, type and priority) or a user chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XtChainSpec {
    /// The chain as an nf_tables chain (its name and base), its rules left empty.
    pub chain: NftChain,
    /// Its rules, in order.
    pub rules: Vec<XtRuleSpec>,
}

/// One iptables table of one family, as iptables-nft keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XtTable {
    /// `ip` (IPv4) or `ip6`.
    pub family: Family,
    /// `nat`, `mangle`, `raw`.
    pub name: String,
    /// Its chains, in the order iptables-nft-restore creates them.
    pub chains: Vec<XtChainSpec>,
}

fn nfproto(f: Family) -> NetfilterProtoFamily {
    match f {
        Family::V4 => NetfilterProtoFamily::IPv4,
        Family::V6 => NetfilterProtoFamily::IPv6,
    }
}

fn new_rule(table: &str, chain: &str, r: &XtRuleSpec) -> NfTablesMessage {
    let mut list = Vec::with_capacity(64 * r.exprs.len());
    let mut w = NlaWriter::new(&mut list);
    for e in &r.exprs {
        e.emit(&|_| 0, &mut w);
    }
    let mut attributes = vec![
        RuleAttribute::Table(table.into()),
        RuleAttribute::Chain(chain.into()),
        RuleAttribute::Other(DefaultNla::new(NFTA_RULE_EXPRESSIONS | NLA_F_NESTED, list)),
    ];
    if let Some((proto, fl)) = r.compat {
        let mut nest = Vec::new();
        let mut w = NlaWriter::new(&mut nest);
        w.bytes(1, &proto.to_be_bytes());
        w.bytes(2, &fl.to_be_bytes());
        attributes.push(RuleAttribute::Other(DefaultNla::new(
            NFTA_RULE_COMPAT | NLA_F_NESTED,
            nest,
        )));
    }
    NfTablesMessage::NewRule(RuleMessage { attributes })
}

/// `tables` added (their chains and rules appended; a table or built-in chain already there
/// is kept), and our `inet` tables in `remove` deleted, in one batch bound to `genid`.
pub(super) fn hand_over(
    tables: &[XtTable],
    remove: &[String],
    first_seq: u32,
    genid: Option<u32>,
    features: Features,
) -> Encoded {
    let mut b = Batch::new(first_seq, genid, features);
    for t in tables {
        let fam = nfproto(t.family);
        b.push_in(
            fam,
            message::new_table(&t.name, false),
            flags::ADD_TABLE,
            Label::AddTable,
        );
        let one = NftTable::named(&t.name);
        for (ci, c) in t.chains.iter().enumerate() {
            let msg = message::new_chain(&one.name, &c.chain);
            b.push_in(fam, msg, flags::ADD_CHAIN, Label::AddChain(ci));
        }
        for (ci, c) in t.chains.iter().enumerate() {
            for (ri, r) in c.rules.iter().enumerate() {
                let label = Label::AddRule {
                    chain: ci,
                    rule: ri,
                };
                b.push_in(
                    fam,
                    new_rule(&t.name, &c.chain.name, r),
                    flags::ADD_RULE,
                    label,
                );
            }
        }
    }
    for name in remove {
        let del = Label::DeleteTable(name.clone());
        b.push(message::del_table(name), flags::DELETE, del);
    }
    b.finish()
}
