//! The opt-in counters of our table read back: one dump of its rules, each counter's packets
//! and bytes taken from the rule that holds it, and summed per path by where the plan put
//! the counted rules (`lower::counted_rules`). Counter values are the kernel's; the rest of a
//! read (`dump`) ignores them, so a table compares equal whatever it has counted.

use netlink_packet_core::{parse_string, NlasIterator};

use super::dump::{bad, rule_walk};
use super::error::Result;
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

// enum nft_counter_attributes
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

// enum nft_expr_attributes
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;

/// A dumped rule's table, chain and counter, if it has one. The expressions are walked as
/// raw attributes: only a counter's name and values are read (the netlink crate's typed
/// parse of every expression costs more than the dump itself).
fn rule_counter(payload: &[u8]) -> std::result::Result<Decoded, netlink_packet_core::DecodeError> {
    let mut count = None;
    let (table, chain) = rule_walk(payload, |e| {
        let c = counter_of(e.value())?;
        count = count.or(c);
        Ok(())
    })?;
    Ok((table, chain, count))
}

/// The packets and bytes of one expression (`NFTA_LIST_ELEM`'s value) if it is a `counter`.
fn counter_of(elem: &[u8]) -> std::result::Result<Option<Count>, netlink_packet_core::DecodeError> {
    let (mut is_counter, mut data) = (false, None);
    for a in NlasIterator::new(elem) {
        let a = a?;
        match a.kind() {
            NFTA_EXPR_NAME => is_counter = parse_string(a.value())? == "counter",
            NFTA_EXPR_DATA => data = Some(a.value().to_vec()),
            _ => {}
        }
    }
    let (true, Some(data)) = (is_counter, data) else {
        return Ok(None);
    };
    let mut count = Count::default();
    for a in NlasIterator::new(&data[..]) {
        let a = a?;
        let Some(n) = a.value().get(..8).and_then(|v| v.try_into().ok()) else {
            continue;
        };
        match a.kind() {
            NFTA_COUNTER_BYTES => count.bytes = u64::from_be_bytes(n),
            NFTA_COUNTER_PACKETS => count.packets = u64::from_be_bytes(n),
            _ => {}
        }
    }
    Ok(Some(count))
}
