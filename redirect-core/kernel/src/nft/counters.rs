//! The opt-in counters of our table read back: one dump of its rules, each counter's packets
//! and bytes taken from the rule that holds it, and summed per path by where the plan put
//! the counted rules (`lower::counted_rules`). Counter values are the kernel's; the rest of a
//! read (`dump`) ignores them, so a table compares equal whatever it has counted.

use netlink_packet_core::{parse_string, Nla, NlasIterator, Parseable, NLA_TYPE_MASK};
use netlink_packet_netfilter::nftables::{ExpressionAttribute, Expressions, ListAttribute};

use super::dump::bad;
use super::error::Result;
use super::extra;
use super::lower::CountedRule;
use super::message;
use super::socket::Socket;
use redirect_model::{Count, PathCounts};

/// One counter of our table: the chain and position of its rule, and what it counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleCounter {
    /// The chain's name in the table.
    pub chain: String,
    /// The rule's position in the chain, from 0.
    pub index: usize,
    /// What the counter saw.
    pub count: Count,
}

// enum nft_rule_attributes, enum nft_counter_attributes
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;

/// Every counter of our table `table`, in one dump of its rules; none when there is no table.
pub fn counters(sock: &Socket, table: &str) -> Result<Vec<RuleCounter>> {
    let mut out = Vec::new();
    let mut last: Option<(String, usize)> = None;
    let rules = sock.dump_ours(message::get_rules(table), "our rules' counters")?;
    for raw in rules.unwrap_or_default() {
        let (t, chain, count) = rule_counter(&raw.payload).map_err(|e| bad("a dumped rule", e))?;
        if t != table {
            continue;
        }
        // The kernel dumps a chain's rules in order, chain after chain.
        let index = match &last {
            Some((c, i)) if *c == chain => i + 1,
            _ => 0,
        };
        last = Some((chain.clone(), index));
        if let Some(count) = count {
            out.push(RuleCounter {
                chain,
                index,
                count,
            });
        }
    }
    Ok(out)
}

/// The counters summed per path, or `None` when they are not exactly where the plan puts its
/// counted rules (a table written without counters, or by another config): a counter is
/// attributed to a path by its place alone, so a table of another shape is not read.
pub fn path_counts(read: &[RuleCounter], counted: &[CountedRule]) -> Option<PathCounts> {
    if read.len() != counted.len() {
        return None;
    }
    // The kernel lists chains in their creation order, which updates in place change.
    let mut read: Vec<&RuleCounter> = read.iter().collect();
    read.sort_by(|a, b| (&a.chain, a.index).cmp(&(&b.chain, b.index)));
    let mut counted: Vec<&CountedRule> = counted.iter().collect();
    counted.sort_by(|a, b| (&a.chain, a.index).cmp(&(&b.chain, b.index)));
    let mut sums = PathCounts::default();
    for (r, c) in read.into_iter().zip(counted) {
        if r.index != c.index || r.chain != c.chain {
            return None;
        }
        sums.add(c.path, r.count);
    }
    Some(sums)
}

type Decoded = (String, String, Option<Count>);

/// A dumped rule's table, chain and counter, if it has one.
fn rule_counter(payload: &[u8]) -> std::result::Result<Decoded, netlink_packet_core::DecodeError> {
    let (mut table, mut chain, mut count) = (String::new(), String::new(), None);
    for nla in NlasIterator::new(payload) {
        let nla = nla?;
        match nla.kind() {
            NFTA_RULE_TABLE => table = parse_string(nla.value())?,
            NFTA_RULE_CHAIN => chain = parse_string(nla.value())?,
            NFTA_RULE_EXPRESSIONS => {
                for e in NlasIterator::new(nla.value()) {
                    let list = ListAttribute::<ExpressionAttribute>::parse(&e?)?;
                    count = count.or_else(|| counter_of(&list));
                }
            }
            _ => {}
        }
    }
    Ok((table, chain, count))
}

/// The packets and bytes of a `counter` expression; `None` for any other.
fn counter_of(elem: &ListAttribute<ExpressionAttribute>) -> Option<Count> {
    let ListAttribute::Element(attrs) = elem else {
        return None;
    };
    let is_counter = attrs
        .iter()
        .any(|a| matches!(a, ExpressionAttribute::Name(n) if n == "counter"));
    let data = attrs.iter().find_map(|a| match a {
        ExpressionAttribute::Data(Expressions::Other { attributes, .. }) => Some(attributes),
        _ => None,
    });
    let (true, Some(data)) = (is_counter, data) else {
        return None;
    };
    let mut count = Count::default();
    for a in data {
        let v = extra::value(a);
        let n = u64::from_be_bytes(v.get(..8)?.try_into().ok()?);
        match a.kind() & NLA_TYPE_MASK {
            NFTA_COUNTER_BYTES => count.bytes = n,
            NFTA_COUNTER_PACKETS => count.packets = n,
            _ => {}
        }
    }
    Some(count)
}
