//! A table read back against the plan's, object by object (`state` holds both): each way they
//! differ, its rules and elements in nft syntax (`text`). Apart from `state` because the text
//! printer reads a set's state: the types below the printer, the comparison above it.

use std::fmt;

use serde::Serialize;

use super::expr::Expr;
use super::state::{SetState, TableState};
use super::text;
use super::TABLE;

/// One way in which the kernel differs from the plan. Rules are in nft syntax.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Difference {
    /// There is no table: nothing is captured.
    TableMissing,
    /// The table carries flags (`dormant`: its chains are unhooked, nothing is captured).
    TableFlags {
        /// The flags as nft names them ([`table_flags`]).
        flags: String,
    },
    /// A planned chain is not in the table.
    ChainMissing {
        /// The chain's name.
        chain: String,
    },
    /// The table has a chain the plan does not.
    ChainUnexpected {
        /// The chain's name.
        chain: String,
    },
    /// A chain's type, hook, priority or policy differs, or one is a base chain and the other
    /// is not.
    ChainSpec {
        /// The chain's name.
        chain: String,
        /// The planned base chain in nft syntax; `None` for a regular chain.
        expected: Option<String>,
        /// The kernel's, the same way.
        actual: Option<String>,
    },
    /// A planned rule is not in the chain.
    RuleMissing {
        /// The chain's name.
        chain: String,
        /// The rule's place in the plan, from 1.
        position: usize,
        /// The rule in nft syntax.
        rule: String,
    },
    /// The chain has a rule the plan does not.
    RuleUnexpected {
        /// The chain's name.
        chain: String,
        /// The rule's place in the kernel's chain, from 1.
        position: usize,
        /// The rule in nft syntax.
        rule: String,
    },
    /// The chain holds the planned rules, but in another order.
    RuleOrder {
        /// The chain's name.
        chain: String,
    },
    /// A planned set is not in the table.
    SetMissing {
        /// The set's name.
        set: String,
    },
    /// The table has a set the plan does not.
    SetUnexpected {
        /// The set's name.
        set: String,
    },
    /// A set's key type, key length or flags differ.
    SetSpec {
        /// The set's name.
        set: String,
        /// The planned key and flags, as one phrase ([`SetState::spec`]).
        expected: String,
        /// The kernel's, the same way.
        actual: String,
    },
    /// A set holds other elements than planned.
    SetElements {
        /// The set's name.
        set: String,
        /// Planned elements it lacks, as ports or CIDRs (raw keys when the ranges are the same
        /// but written differently).
        missing: Vec<String>,
        /// Elements it has beyond the plan, the same way (a key listed twice says
        /// "(repeated)").
        unexpected: Vec<String>,
    },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Difference::*;
        match self {
            TableMissing => write!(
                f,
                "table inet {TABLE} is missing: no capture rules in this namespace"
            ),
            TableFlags { flags } => write!(
                f,
                "table inet {TABLE} has flags {flags} but the plan has none{}",
                if flags.contains("dormant") {
                    ": a dormant table hooks no chain, so nothing is captured"
                } else {
                    ""
                }
            ),
            ChainMissing { chain } => write!(f, "chain {chain} is missing"),
            ChainUnexpected { chain } => write!(f, "chain {chain} is not in the plan"),
            ChainSpec {
                chain,
                expected,
                actual,
            } => write!(
                f,
                "chain {chain} is {} but the plan says {}",
                actual.as_deref().unwrap_or("a regular chain"),
                expected.as_deref().unwrap_or("a regular chain")
            ),
            RuleMissing {
                chain,
                position,
                rule,
            } => write!(f, "chain {chain}: rule {position} is missing: {rule}"),
            RuleUnexpected {
                chain,
                position,
                rule,
            } => write!(
                f,
                "chain {chain}: rule {position} is not in the plan: {rule}"
            ),
            RuleOrder { chain } => write!(
                f,
                "chain {chain}: the rules are in another order than planned"
            ),
            SetMissing { set } => write!(f, "set {set} is missing"),
            SetUnexpected { set } => write!(f, "set {set} is not in the plan"),
            SetSpec {
                set,
                expected,
                actual,
            } => write!(f, "set {set} is {actual} but the plan says {expected}"),
            SetElements {
                set,
                missing,
                unexpected,
            } => write!(
                f,
                "set {set}: {} element(s) missing {:?}, {} unexpected {:?}",
                missing.len(),
                missing,
                unexpected.len(),
                unexpected
            ),
        }
    }
}

/// Compare the expected table with the kernel's (None = no table).
pub fn compare(expected: &TableState, actual: Option<&TableState>) -> Vec<Difference> {
    let Some(actual) = actual else {
        return vec![Difference::TableMissing];
    };
    let mut out = Vec::new();
    if actual.flags != expected.flags {
        out.push(Difference::TableFlags {
            flags: table_flags(actual.flags),
        });
    }
    for e in &expected.chains {
        let Some(a) = actual.chain(&e.name) else {
            out.push(Difference::ChainMissing {
                chain: e.name.clone(),
            });
            continue;
        };
        if e.base != a.base {
            out.push(Difference::ChainSpec {
                chain: e.name.clone(),
                expected: e.base.as_ref().map(|b| b.to_string()),
                actual: a.base.as_ref().map(|b| b.to_string()),
            });
        }
        compare_rules(&e.name, &e.rules, &a.rules, &mut out);
    }
    for a in &actual.chains {
        if expected.chain(&a.name).is_none() {
            out.push(Difference::ChainUnexpected {
                chain: a.name.clone(),
            });
        }
    }
    for e in &expected.sets {
        let Some(a) = actual.set(&e.name) else {
            out.push(Difference::SetMissing {
                set: e.name.clone(),
            });
            continue;
        };
        if !e.same_spec(a) {
            out.push(Difference::SetSpec {
                set: e.name.clone(),
                expected: e.spec(),
                actual: a.spec(),
            });
        } else if e.elements != a.elements {
            out.push(element_difference(e, a));
        }
    }
    for a in &actual.sets {
        if expected.set(&a.name).is_none() {
            out.push(Difference::SetUnexpected {
                set: a.name.clone(),
            });
        }
    }
    out
}

/// Table flags as nft names them (`dormant`, `owner`, `persist`), unknown bits in hex.
pub fn table_flags(flags: u32) -> String {
    const NAMES: [(u32, &str); 3] = [(1, "dormant"), (2, "owner"), (4, "persist")];
    let mut words: Vec<String> = NAMES
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, name)| name.to_string())
        .collect();
    let rest = flags & !NAMES.iter().map(|(bit, _)| bit).sum::<u32>();
    if rest != 0 {
        words.push(format!("{rest:#x}"));
    }
    words.join(",")
}

/// The elements one set has and the other lacks, as ports or CIDRs; as raw keys when the
/// two hold the same ranges written differently.
fn element_difference(e: &SetState, a: &SetState) -> Difference {
    let only = |x: &[String], y: &[String]| -> Vec<String> {
        x.iter().filter(|v| !y.contains(v)).cloned().collect()
    };
    let (de, da) = (text::set_elements(e), text::set_elements(a));
    let (mut missing, mut unexpected) = (only(&de, &da), only(&da, &de));
    if missing.is_empty() && unexpected.is_empty() {
        let keys = |s: &SetState| -> Vec<String> { s.elements.iter().map(text::key).collect() };
        let (ke, ka) = (keys(e), keys(a));
        missing = only(&ke, &ka);
        unexpected = only(&ka, &ke);
        if missing.is_empty() && unexpected.is_empty() {
            // The same keys, some listed more often than planned.
            let count = |x: &[String], v: &String| x.iter().filter(|k| *k == v).count();
            unexpected = ka
                .iter()
                .filter(|k| count(&ka, k) > count(&ke, k))
                .map(|k| format!("{k} (repeated)"))
                .collect();
            unexpected.dedup();
        }
    }
    Difference::SetElements {
        set: e.name.clone(),
        missing,
        unexpected,
    }
}

fn compare_rules(
    chain: &str,
    expected: &[Vec<Expr>],
    actual: &[Vec<Expr>],
    out: &mut Vec<Difference>,
) {
    if expected == actual {
        return;
    }
    // Match rules as multisets first; what is left over is missing or unexpected.
    let mut used = vec![false; actual.len()];
    let mut any = false;
    for (i, r) in expected.iter().enumerate() {
        match (0..actual.len()).find(|&j| !used[j] && &actual[j] == r) {
            Some(j) => used[j] = true,
            None => {
                any = true;
                out.push(Difference::RuleMissing {
                    chain: chain.into(),
                    position: i + 1,
                    rule: text::exprs(r),
                });
            }
        }
    }
    for (j, a) in actual.iter().enumerate() {
        if !used[j] {
            any = true;
            out.push(Difference::RuleUnexpected {
                chain: chain.into(),
                position: j + 1,
                rule: text::exprs(a),
            });
        }
    }
    if !any {
        out.push(Difference::RuleOrder {
            chain: chain.into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::lower::SetElem;
    use crate::nft::message::SET_INTERVAL;

    fn elem(key: [u8; 4], interval_end: bool) -> SetElem {
        SetElem {
            key: key.to_vec(),
            interval_end,
        }
    }

    /// A read that lists an element twice (a dump that overlapped another writer's batch) is
    /// a difference that says which key came twice, not "0 missing, 0 unexpected".
    #[test]
    fn a_repeated_element_is_named() {
        let set = |elements| SetState {
            name: "ip-exclude-cidrs".into(),
            key_type: 7,
            key_len: 4,
            flags: SET_INTERVAL,
            size: None,
            elements,
        };
        let planned = set(vec![
            elem([0, 0, 0, 0], true),
            elem([10, 0, 0, 0], false),
            elem([10, 64, 0, 0], true),
        ]);
        let read = set(vec![
            elem([0, 0, 0, 0], true),
            elem([0, 0, 0, 0], true),
            elem([10, 0, 0, 0], false),
            elem([10, 64, 0, 0], true),
        ]);
        let d = element_difference(&planned, &read).to_string();
        assert!(d.contains("-00000000 (repeated)"), "{d}");
        assert!(d.contains("0 element(s) missing"), "{d}");
    }
}
