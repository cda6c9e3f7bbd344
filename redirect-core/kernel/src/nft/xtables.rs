//! iptables-nft's chains by a name prefix, read and removed over netlink, with no iptables
//! binary on the node. iptables-nft keeps each iptables table as an nf_tables table of family
//! `ip` or `ip6` (`nat`, `mangle`...), each user chain as a regular chain of it, and
//! `-j CHAIN` as an immediate jump; so a dump of the family's chains and rules shows what
//! `iptables-nft-save` would, and one batch removes it.
//!
//! What is found and removed, in a table that has chains with the prefix (none: the table is
//! left alone), as `iptables-nft-save` plus `-restore` would do it:
//! - every rule outside a prefixed chain that jumps or goes to one;
//! - every rule of a built-in chain that has the shape of an interface exclusion
//!   (`-i X -j RETURN`, `-o X -j RETURN` in nat or mangle PREROUTING / OUTPUT: Istio's steps 1
//!   and 2);
//! - then every prefixed chain is flushed and deleted.
//!
//! Not recognised here: rules that are not jumps and have another shape (Istio's TPROXY tail in
//! mangle, whose CONNMARK is an xtables target); they stay, and the chains are still removed.

use netlink_packet_core::Parseable;
use netlink_packet_core::{parse_string, parse_u32_be, parse_u64_be, DecodeError, NlasIterator};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, ExpressionAttribute, ListAttribute, NfTablesMessage,
    RuleAttribute, RuleMessage,
};
use netlink_packet_netfilter::NetfilterProtoFamily;

use super::batch::{Batch, Encoded, Label};
use super::error::{Error, Result};
use super::expr::{Expr, MetaKey, Verdict};
use super::message::{self, flags};
use super::socket::Socket;
use super::Features;
use redirect_model::Family;

/// One chain found, or Istio-shaped rules found in a built-in chain (`jumps` 0 then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XtChain {
    /// The table's family.
    pub family: Family,
    /// The iptables table (`nat`, `mangle`...).
    pub table: String,
    /// The chain.
    pub chain: String,
    /// Its rules (for a built-in chain, only the shaped ones).
    pub rules: usize,
    /// The rules that jump or go to it, its own tables' prefixed chains included.
    pub jumps: usize,
}

/// What one read found, with the ruleset generation it was read at, so that a removal acts on
/// exactly that or on nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XtFound {
    /// The chains, in family, table and kernel order.
    pub chains: Vec<XtChain>,
    generation: u32,
    /// (family, table, chain, handle) of each rule to delete outside the prefixed chains.
    rules: Vec<(Family, String, String, u64)>,
    /// (family, table, chain) of each prefixed chain.
    prefixed: Vec<(Family, String, String)>,
}

/// How often a removal starts over because the ruleset moved between its read and its batch.
const TRIES: usize = 10;

/// What the prefix matches in every `ip` and `ip6` table, read at one generation.
pub(super) fn find(sock: &Socket, families: &[Family], prefix: &str) -> Result<XtFound> {
    for _ in 0..TRIES {
        let before = super::dump::generation(sock)?;
        let mut found = XtFound {
            generation: before,
            ..XtFound::default()
        };
        let mut interrupted = false;
        for &family in families {
            match scan_family(sock, family, prefix, &mut found) {
                Err(Error::Rejected { errno, .. }) if errno == libc::EINTR => {
                    interrupted = true;
                    break;
                }
                other => other?,
            }
        }
        if !interrupted && super::dump::generation(sock)? == before {
            return Ok(found);
        }
    }
    Err(Error::ReadUnsettled { tries: TRIES })
}

/// Remove what [`find`] finds, in one batch bound to the generation it was read at (the
/// kernel refuses it when anything moved since; then it is read and tried again). Returns
/// what was removed.
pub(super) fn remove(sock: &Socket, families: &[Family], prefix: &str) -> Result<Vec<XtChain>> {
    for _ in 0..TRIES {
        let found = find(sock, families, prefix)?;
        if found.prefixed.is_empty() {
            return Ok(Vec::new());
        }
        let batch = removal(
            &found,
            sock.next_seq(),
            Some(found.generation),
            sock.features(),
        );
        let describe = |seq: u32| match batch.label_of(seq) {
            Some(l) => l.describe(&Default::default()),
            None => format!("the batch removing iptables-nft's {prefix}* chains (message {seq})"),
        };
        match sock.send_batch(&batch, &describe) {
            Err(Error::Rejected { errno, .. }) if errno == libc::ERESTART => continue,
            Err(e) => return Err(e),
            Ok(()) => return Ok(found.chains),
        }
    }
    Err(Error::ReadUnsettled { tries: TRIES })
}

/// The batch that removes what `found` holds: the rules outside the prefixed chains by handle,
/// then each prefixed chain flushed (which drops the jumps between them), then deleted.
pub(super) fn removal(
    found: &XtFound,
    first_seq: u32,
    genid: Option<u32>,
    features: Features,
) -> Encoded {
    let mut b = Batch::new(first_seq, genid, features);
    for (family, table, chain, handle) in &found.rules {
        let msg = NfTablesMessage::DeleteRule(RuleMessage {
            attributes: vec![
                RuleAttribute::Table(table.clone()),
                RuleAttribute::Chain(chain.clone()),
                RuleAttribute::Handle(*handle),
            ],
        });
        let label = Label::XtDeleteRule {
            nfproto: nfproto(*family),
            table: table.clone(),
            chain: chain.clone(),
            handle: *handle,
        };
        b.push_in(proto_family(*family), msg, flags::DELETE, label);
    }
    for (family, table, chain) in &found.prefixed {
        let label = Label::XtFlushChain {
            nfproto: nfproto(*family),
            table: table.clone(),
            chain: chain.clone(),
        };
        let msg = message::flush_chain(table, chain);
        b.push_in(proto_family(*family), msg, flags::DELETE, label);
    }
    for (family, table, chain) in &found.prefixed {
        let label = Label::XtDeleteChain {
            nfproto: nfproto(*family),
            table: table.clone(),
            chain: chain.clone(),
        };
        let msg = message::del_chain(table, chain);
        b.push_in(proto_family(*family), msg, flags::DELETE, label);
    }
    b.finish()
}

impl XtFound {
    /// What a read would have found: rules to delete by (family, table, chain, handle) and the
    /// prefixed chains by (family, table, chain); for the oracle test.
    #[cfg(feature = "testing")]
    pub fn of(
        rules: Vec<(Family, String, String, u64)>,
        prefixed: Vec<(Family, String, String)>,
    ) -> XtFound {
        XtFound {
            chains: Vec::new(),
            generation: 0,
            rules,
            prefixed,
        }
    }
}

fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => 2,
        Family::V6 => 10,
    }
}

fn proto_family(family: Family) -> NetfilterProtoFamily {
    match family {
        Family::V4 => NetfilterProtoFamily::IPv4,
        Family::V6 => NetfilterProtoFamily::IPv6,
    }
}

/// A dumped chain: its table, name and whether it is a base (built-in) chain.
struct Chain {
    table: String,
    name: String,
    base: bool,
}

/// A dumped rule, as far as this module looks at it.
struct Rule {
    table: String,
    chain: String,
    handle: u64,
    /// The chain it jumps or goes to.
    target: Option<String>,
    /// Whether it is `-i X -j RETURN` or `-o X -j RETURN`.
    interface_return: bool,
}

fn scan_family(sock: &Socket, family: Family, prefix: &str, out: &mut XtFound) -> Result<()> {
    let nf = proto_family(family);
    let get_chains = NfTablesMessage::GetChain(ChainMessage { attributes: vec![] });
    let mut chains = Vec::new();
    for raw in sock
        .dump(nf, get_chains, "iptables-nft's chains")?
        .unwrap_or_default()
    {
        if let NfTablesMessage::NewChain(c) = raw.parsed()? {
            chains.push(chain(c.attributes));
        }
    }
    let mut tables: Vec<String> = Vec::new();
    for c in chains.iter().filter(|c| c.name.starts_with(prefix)) {
        if !tables.contains(&c.table) {
            tables.push(c.table.clone());
        }
    }
    if tables.is_empty() {
        return Ok(());
    }
    let get_rules = NfTablesMessage::GetRule(RuleMessage { attributes: vec![] });
    let mut rules = Vec::new();
    for raw in sock
        .dump(nf, get_rules, "iptables-nft's rules")?
        .unwrap_or_default()
    {
        let r = rule(&raw.payload).map_err(|e| Error::Netlink {
            op: "a dumped iptables-nft rule",
            cause: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
            hint: "",
        })?;
        if tables.contains(&r.table) {
            rules.push(r);
        }
    }
    for table in &tables {
        let chains: Vec<&Chain> = chains.iter().filter(|c| &c.table == table).collect();
        let rules: Vec<&Rule> = rules.iter().filter(|r| &r.table == table).collect();
        table_found(family, table, &chains, &rules, prefix, out);
    }
    Ok(())
}

/// What one table that has prefixed chains holds of them: the chains, the rules that jump to
/// them from outside, and the interface exclusions in its built-in chains.
fn table_found(
    family: Family,
    table: &str,
    chains: &[&Chain],
    rules: &[&Rule],
    prefix: &str,
    out: &mut XtFound,
) {
    let ours = |name: &str| name.starts_with(prefix);
    for c in chains.iter().filter(|c| ours(&c.name)) {
        out.chains.push(XtChain {
            family,
            table: table.to_owned(),
            chain: c.name.clone(),
            rules: rules.iter().filter(|r| r.chain == c.name).count(),
            jumps: rules
                .iter()
                .filter(|r| r.target.as_deref() == Some(&c.name))
                .count(),
        });
        out.prefixed
            .push((family, table.to_owned(), c.name.clone()));
    }
    for r in rules.iter().filter(|r| !ours(&r.chain)) {
        if r.target.as_deref().is_some_and(ours) {
            out.rules
                .push((family, table.to_owned(), r.chain.clone(), r.handle));
        }
    }
    for c in chains.iter().filter(|c| c.base) {
        let shaped: Vec<&&Rule> = rules
            .iter()
            .filter(|r| r.chain == c.name)
            .filter(|r| r.interface_return && interface_shape(table, &c.name))
            .collect();
        if shaped.is_empty() {
            continue;
        }
        out.chains.push(XtChain {
            family,
            table: table.to_owned(),
            chain: c.name.clone(),
            rules: shaped.len(),
            jumps: 0,
        });
        for r in shaped {
            out.rules
                .push((family, table.to_owned(), r.chain.clone(), r.handle));
        }
    }
}

/// Where Istio puts `-i X -j RETURN` / `-o X -j RETURN` (steps 1 and 2).
fn interface_shape(table: &str, chain: &str) -> bool {
    matches!(table, "nat" | "mangle") && matches!(chain, "PREROUTING" | "OUTPUT")
}

fn chain(attrs: Vec<ChainAttribute>) -> Chain {
    let mut c = Chain {
        table: String::new(),
        name: String::new(),
        base: false,
    };
    for a in attrs {
        match a {
            ChainAttribute::Table(t) => c.table = t,
            ChainAttribute::Name(n) => c.name = n,
            ChainAttribute::Hook(_) => c.base = true,
            _ => {}
        }
    }
    c
}

// enum nft_rule_attributes
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
// The immediate's data: NFTA_IMMEDIATE_DATA > NFTA_DATA_VERDICT > NFTA_VERDICT_CODE / _CHAIN.
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
/// `NFT_GOTO` (`-g CHAIN`), as a u32.
const NFT_GOTO: u32 = -4i32 as u32;

fn rule(payload: &[u8]) -> std::result::Result<Rule, DecodeError> {
    let mut r = Rule {
        table: String::new(),
        chain: String::new(),
        handle: 0,
        target: None,
        interface_return: false,
    };
    let mut exprs = Vec::new();
    for nla in NlasIterator::new(payload) {
        let nla = nla?;
        match nla.kind() {
            NFTA_RULE_TABLE => r.table = parse_string(nla.value())?,
            NFTA_RULE_CHAIN => r.chain = parse_string(nla.value())?,
            NFTA_RULE_HANDLE => r.handle = parse_u64_be(nla.value())?,
            NFTA_RULE_EXPRESSIONS => {
                for e in NlasIterator::new(nla.value()) {
                    let list = ListAttribute::<ExpressionAttribute>::parse(&e?)?;
                    exprs.push(super::expr::decode(&list));
                }
            }
            _ => {}
        }
    }
    r.target = exprs.iter().find_map(|e| match e {
        Expr::Verdict(Verdict::Jump(c)) => Some(c.clone()),
        Expr::Foreign(f) if f.name == "immediate" => goto_target(&f.attrs),
        _ => None,
    });
    // `-i X -j RETURN`: meta iifname (or oifname), cmp eq, iptables-nft's counter, return.
    let meaningful: Vec<&Expr> = exprs.iter().filter(|e| **e != Expr::Counter).collect();
    r.interface_return = matches!(
        meaningful.as_slice(),
        [
            Expr::Meta(MetaKey::IifName | MetaKey::OifName),
            Expr::Cmp { eq: true, .. },
            Expr::Verdict(Verdict::Return)
        ]
    );
    Ok(r)
}

/// The chain of an immediate `goto` (which the typed decoder leaves as a foreign expression).
fn goto_target(attrs: &[(u16, Vec<u8>)]) -> Option<String> {
    let (_, data) = attrs.iter().find(|(k, _)| *k == NFTA_IMMEDIATE_DATA)?;
    for d in NlasIterator::new(&data[..]) {
        let d = d.ok()?;
        if d.kind() != NFTA_DATA_VERDICT {
            continue;
        }
        let (mut code, mut chain) = (None, None);
        for v in NlasIterator::new(d.value()) {
            let v = v.ok()?;
            match v.kind() {
                NFTA_VERDICT_CODE => code = parse_u32_be(v.value()).ok(),
                NFTA_VERDICT_CHAIN => chain = parse_string(v.value()).ok(),
                _ => {}
            }
        }
        if code == Some(NFT_GOTO) {
            return chain;
        }
    }
    None
}
