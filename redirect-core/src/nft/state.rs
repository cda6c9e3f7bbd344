//! Reading our table back and comparing it with a plan.
//!
//! Both sides are brought to one form: a rule is the text libnftnl prints for its expressions
//! after a netlink round trip (what we would send, parsed back; what the kernel dumps, parsed),
//! so a rule compares equal exactly when the kernel holds the expressions we planned.

use std::ffi::{c_char, c_void, CStr, CString};
use std::fmt;
use std::ptr::NonNull;

use nftnl::{Chain, ProtoFamily, Rule, Table};
use nftnl_sys::{self as sys, libc};
use serde::Serialize;

use super::lower::{NftSet, NftTable};
use super::netlink::Socket;
use super::TABLE;
use crate::error::Result;

/// A table as read back: chains (sorted by name) and sets (sorted by name).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TableState {
    pub chains: Vec<ChainState>,
    pub sets: Vec<SetState>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChainState {
    pub name: String,
    /// `type nat hook output priority -100 policy accept` for a base chain.
    pub base: Option<String>,
    /// One line per rule: its expressions as libnftnl prints them.
    pub rules: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SetState {
    pub name: String,
    /// Key type, key length and flags.
    pub spec: String,
    /// Elements as hex keys (`-` prefix for an interval end), sorted.
    pub elements: Vec<String>,
}

impl TableState {
    pub fn chain(&self, name: &str) -> Option<&ChainState> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }
}

/// One way in which the kernel differs from the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Difference {
    TableMissing,
    ChainMissing {
        chain: String,
    },
    ChainUnexpected {
        chain: String,
    },
    ChainSpec {
        chain: String,
        expected: Option<String>,
        actual: Option<String>,
    },
    RuleMissing {
        chain: String,
        position: usize,
        rule: String,
    },
    RuleUnexpected {
        chain: String,
        position: usize,
        rule: String,
    },
    RuleOrder {
        chain: String,
    },
    SetMissing {
        set: String,
    },
    SetUnexpected {
        set: String,
    },
    SetSpec {
        set: String,
        expected: String,
        actual: String,
    },
    SetElements {
        set: String,
        missing: Vec<String>,
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
            } => {
                write!(f, "chain {chain}: rule {position} is missing: {rule}")
            }
            RuleUnexpected {
                chain,
                position,
                rule,
            } => {
                write!(
                    f,
                    "chain {chain}: rule {position} is not in the plan: {rule}"
                )
            }
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
                expected: e.base.clone(),
                actual: a.base.clone(),
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
        let Some(a) = actual.sets.iter().find(|s| s.name == e.name) else {
            out.push(Difference::SetMissing {
                set: e.name.clone(),
            });
            continue;
        };
        if e.spec != a.spec {
            out.push(Difference::SetSpec {
                set: e.name.clone(),
                expected: e.spec.clone(),
                actual: a.spec.clone(),
            });
        }
        let missing: Vec<String> = e
            .elements
            .iter()
            .filter(|x| !a.elements.contains(x))
            .cloned()
            .collect();
        let unexpected: Vec<String> = a
            .elements
            .iter()
            .filter(|x| !e.elements.contains(x))
            .cloned()
            .collect();
        if !missing.is_empty() || !unexpected.is_empty() {
            out.push(Difference::SetElements {
                set: e.name.clone(),
                missing,
                unexpected,
            });
        }
    }
    for a in &actual.sets {
        if !expected.sets.iter().any(|s| s.name == a.name) {
            out.push(Difference::SetUnexpected {
                set: a.name.clone(),
            });
        }
    }
    out
}

fn compare_rules(chain: &str, expected: &[String], actual: &[String], out: &mut Vec<Difference>) {
    if expected == actual {
        return;
    }
    // Match rules as multisets first; what is left over is missing or unexpected.
    let mut used = vec![false; actual.len()];
    let mut any = false;
    for (i, r) in expected.iter().enumerate() {
        match actual
            .iter()
            .enumerate()
            .position(|(j, a)| !used[j] && a == r)
        {
            Some(j) => used[j] = true,
            None => {
                any = true;
                out.push(Difference::RuleMissing {
                    chain: chain.into(),
                    position: i + 1,
                    rule: r.clone(),
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
                rule: a.clone(),
            });
        }
    }
    if !any {
        out.push(Difference::RuleOrder {
            chain: chain.into(),
        });
    }
}

/// What the kernel should hold for a lowered table.
pub fn expected(t: &NftTable) -> TableState {
    let table = Table::new(CString::new(TABLE).expect("no NUL"), ProtoFamily::Inet);
    let mut chains = Vec::new();
    for c in &t.chains {
        let chain = Chain::new(CString::new(c.name.as_str()).expect("no NUL"), &table);
        let rules = c
            .rules
            .iter()
            .map(|exprs| {
                let mut rule = Rule::new(&chain);
                for e in exprs {
                    rule.add_expr(e);
                }
                round_trip_rule_text(&rule)
            })
            .collect();
        chains.push(ChainState {
            name: c.name.clone(),
            base: c
                .base
                .map(|b| base_text(b.kind.name(), super::lower::hook_name(b.hook), b.priority)),
            rules,
        });
    }
    chains.sort_by(|a, b| a.name.cmp(&b.name));
    let mut sets: Vec<SetState> = t.sets.iter().map(expected_set).collect();
    sets.sort_by(|a, b| a.name.cmp(&b.name));
    TableState { chains, sets }
}

fn base_text(kind: &str, hook: &str, prio: i32) -> String {
    format!("type {kind} hook {hook} priority {prio} policy accept")
}

fn set_spec(key_type: u32, key_len: u32, flags: u32) -> String {
    let interval = flags & libc::NFT_SET_INTERVAL as u32 != 0;
    format!(
        "key type {key_type} len {key_len}{}",
        if interval { " interval" } else { "" }
    )
}

fn elem_text(key: &[u8], end: bool) -> String {
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    if end {
        format!("-{hex}")
    } else {
        hex
    }
}

fn expected_set(s: &NftSet) -> SetState {
    let flags = if s.interval {
        libc::NFT_SET_INTERVAL as u32
    } else {
        0
    };
    let mut elements: Vec<String> = s
        .elements
        .iter()
        .map(|e| elem_text(&e.key, e.interval_end))
        .collect();
    elements.sort();
    SetState {
        name: s.name.clone(),
        spec: set_spec(s.key_type, s.key_len, flags),
        elements,
    }
}

/// Serialize a rule as we would send it, parse it back, and print its expressions.
fn round_trip_rule_text(rule: &Rule) -> String {
    let mut buf = vec![0u8; nftnl::nft_nlmsg_maxsize() as usize];
    unsafe {
        nftnl::NlMsg::write(
            rule,
            buf.as_mut_ptr() as *mut c_void,
            0,
            nftnl::MsgType::Add,
        );
        let hdr = buf.as_ptr() as *const libc::nlmsghdr;
        let r = alloc_rule();
        sys::nftnl_rule_nlmsg_parse(hdr, r.as_ptr());
        let text = rule_text(r.as_ptr());
        sys::nftnl_rule_free(r.as_ptr());
        text
    }
}

fn alloc_rule() -> NonNull<sys::nftnl_rule> {
    NonNull::new(unsafe { sys::nftnl_rule_alloc() }).unwrap_or_else(|| std::process::abort())
}

/// The expressions of a parsed rule, as libnftnl prints them, joined on one line.
unsafe fn rule_text(r: *mut sys::nftnl_rule) -> String {
    let mut parts = Vec::new();
    unsafe {
        let it = sys::nftnl_expr_iter_create(r);
        if it.is_null() {
            return String::new();
        }
        loop {
            let e = sys::nftnl_expr_iter_next(it);
            if e.is_null() {
                break;
            }
            let name = CStr::from_ptr(sys::nftnl_expr_get_str(e, sys::NFTNL_EXPR_NAME as u16))
                .to_string_lossy()
                .into_owned();
            let mut b = vec![0u8; 1024];
            let n = sys::nftnl_expr_snprintf(
                b.as_mut_ptr() as *mut c_char,
                b.len(),
                e,
                sys::NFTNL_OUTPUT_DEFAULT,
                0,
            );
            let n = (n.max(0) as usize).min(b.len() - 1);
            let body = String::from_utf8_lossy(&b[..n]).trim().to_string();
            parts.push(format!("[ {name} {body} ]"));
        }
        sys::nftnl_expr_iter_destroy(it);
    }
    parts.join(" ")
}

fn request(ty: u32, flags: u32, seq: u32, build: impl FnOnce(*mut libc::nlmsghdr)) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    unsafe {
        let hdr = sys::nftnl_nlmsg_build_hdr(
            buf.as_mut_ptr() as *mut c_char,
            ty as u16,
            libc::NFPROTO_INET as u16,
            flags as u16,
            seq,
        );
        build(hdr);
        let len = (*hdr).nlmsg_len as usize;
        buf.truncate(len);
    }
    buf
}

/// Dump our table; `None` when it does not exist.
pub fn dump(sock: &Socket) -> Result<Option<TableState>> {
    let table_name = CString::new(TABLE).expect("no NUL");
    // Does the table exist? A GETTABLE by name answers ENOENT when not.
    let req = request(
        libc::NFT_MSG_GETTABLE as u32,
        (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u32,
        1,
        |hdr| unsafe {
            let t = sys::nftnl_table_alloc();
            sys::nftnl_table_set_str(t, sys::NFTNL_TABLE_NAME as u16, table_name.as_ptr());
            sys::nftnl_table_nlmsg_build_payload(hdr, t);
            sys::nftnl_table_free(t);
        },
    );
    if sock.dump_single(&req, 1)?.is_none() {
        return Ok(None);
    }

    let dump_flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u32;
    let req = request(libc::NFT_MSG_GETCHAIN as u32, dump_flags, 2, |hdr| unsafe {
        let c = sys::nftnl_chain_alloc();
        sys::nftnl_chain_set_str(c, sys::NFTNL_CHAIN_TABLE as u16, table_name.as_ptr());
        sys::nftnl_chain_nlmsg_build_payload(hdr, c);
        sys::nftnl_chain_free(c);
    });
    let mut chains = Vec::new();
    for msg in sock.dump(&req, 2)?.unwrap_or_default() {
        unsafe {
            let c = sys::nftnl_chain_alloc();
            if sys::nftnl_chain_nlmsg_parse(msg.as_ptr() as *const libc::nlmsghdr, c) >= 0
                && str_attr(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TABLE as u16)) == TABLE
            {
                let name = str_attr(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_NAME as u16));
                let base = if sys::nftnl_chain_is_set(c, sys::NFTNL_CHAIN_HOOKNUM as u16) {
                    let hook =
                        match sys::nftnl_chain_get_u32(c, sys::NFTNL_CHAIN_HOOKNUM as u16) as i32 {
                            libc::NF_INET_PRE_ROUTING => "prerouting".to_string(),
                            libc::NF_INET_LOCAL_OUT => "output".to_string(),
                            other => format!("hook#{other}"),
                        };
                    let kind = str_attr(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TYPE as u16));
                    let prio = sys::nftnl_chain_get_s32(c, sys::NFTNL_CHAIN_PRIO as u16);
                    let mut t = base_text(&kind, &hook, prio);
                    if sys::nftnl_chain_get_u32(c, sys::NFTNL_CHAIN_POLICY as u16)
                        != libc::NF_ACCEPT as u32
                    {
                        t = t.replace("policy accept", "policy drop");
                    }
                    Some(t)
                } else {
                    None
                };
                chains.push(ChainState {
                    name,
                    base,
                    rules: Vec::new(),
                });
            }
            sys::nftnl_chain_free(c);
        }
    }

    let req = request(libc::NFT_MSG_GETRULE as u32, dump_flags, 3, |hdr| unsafe {
        let r = sys::nftnl_rule_alloc();
        sys::nftnl_rule_set_str(r, sys::NFTNL_RULE_TABLE as u16, table_name.as_ptr());
        sys::nftnl_rule_nlmsg_build_payload(hdr, r);
        sys::nftnl_rule_free(r);
    });
    for msg in sock.dump(&req, 3)?.unwrap_or_default() {
        unsafe {
            let r = alloc_rule();
            if sys::nftnl_rule_nlmsg_parse(msg.as_ptr() as *const libc::nlmsghdr, r.as_ptr()) >= 0
                && str_attr(sys::nftnl_rule_get_str(
                    r.as_ptr(),
                    sys::NFTNL_RULE_TABLE as u16,
                )) == TABLE
            {
                let chain = str_attr(sys::nftnl_rule_get_str(
                    r.as_ptr(),
                    sys::NFTNL_RULE_CHAIN as u16,
                ));
                let text = rule_text(r.as_ptr());
                if let Some(c) = chains.iter_mut().find(|c| c.name == chain) {
                    c.rules.push(text);
                }
            }
            sys::nftnl_rule_free(r.as_ptr());
        }
    }

    let req = request(libc::NFT_MSG_GETSET as u32, dump_flags, 4, |hdr| unsafe {
        let s = sys::nftnl_set_alloc();
        sys::nftnl_set_set_str(s, sys::NFTNL_SET_TABLE as u16, table_name.as_ptr());
        sys::nftnl_set_nlmsg_build_payload(hdr, s);
        sys::nftnl_set_free(s);
    });
    let mut sets = Vec::new();
    for msg in sock.dump(&req, 4)?.unwrap_or_default() {
        unsafe {
            let s = sys::nftnl_set_alloc();
            if sys::nftnl_set_nlmsg_parse(msg.as_ptr() as *const libc::nlmsghdr, s) >= 0
                && str_attr(sys::nftnl_set_get_str(s, sys::NFTNL_SET_TABLE as u16)) == TABLE
            {
                let name = str_attr(sys::nftnl_set_get_str(s, sys::NFTNL_SET_NAME as u16));
                let spec = set_spec(
                    sys::nftnl_set_get_u32(s, sys::NFTNL_SET_KEY_TYPE as u16),
                    sys::nftnl_set_get_u32(s, sys::NFTNL_SET_KEY_LEN as u16),
                    sys::nftnl_set_get_u32(s, sys::NFTNL_SET_FLAGS as u16),
                );
                sets.push(SetState {
                    name,
                    spec,
                    elements: Vec::new(),
                });
            }
            sys::nftnl_set_free(s);
        }
    }
    for (i, set) in sets.iter_mut().enumerate() {
        let seq = 5 + i as u32;
        let set_name = CString::new(set.name.as_str()).expect("no NUL");
        let req = request(
            libc::NFT_MSG_GETSETELEM as u32,
            dump_flags,
            seq,
            |hdr| unsafe {
                let s = sys::nftnl_set_alloc();
                sys::nftnl_set_set_str(s, sys::NFTNL_SET_TABLE as u16, table_name.as_ptr());
                sys::nftnl_set_set_str(s, sys::NFTNL_SET_NAME as u16, set_name.as_ptr());
                sys::nftnl_set_elems_nlmsg_build_payload(hdr, s);
                sys::nftnl_set_free(s);
            },
        );
        for msg in sock.dump(&req, seq)?.unwrap_or_default() {
            unsafe {
                let s = sys::nftnl_set_alloc();
                if sys::nftnl_set_elems_nlmsg_parse(msg.as_ptr() as *const libc::nlmsghdr, s) >= 0 {
                    let it = sys::nftnl_set_elems_iter_create(s);
                    if !it.is_null() {
                        loop {
                            let e = sys::nftnl_set_elems_iter_next(it);
                            if e.is_null() {
                                break;
                            }
                            let mut len: u32 = 0;
                            let key = sys::nftnl_set_elem_get(
                                e,
                                sys::NFTNL_SET_ELEM_KEY as u16,
                                &mut len,
                            );
                            let key = if key.is_null() {
                                &[][..]
                            } else {
                                std::slice::from_raw_parts(key as *const u8, len as usize)
                            };
                            let flags = if sys::nftnl_set_elem_is_set(
                                e,
                                sys::NFTNL_SET_ELEM_FLAGS as u16,
                            ) {
                                sys::nftnl_set_elem_get_u32(e, sys::NFTNL_SET_ELEM_FLAGS as u16)
                            } else {
                                0
                            };
                            set.elements.push(elem_text(
                                key,
                                flags & libc::NFT_SET_ELEM_INTERVAL_END as u32 != 0,
                            ));
                        }
                        sys::nftnl_set_elems_iter_destroy(it);
                    }
                }
                sys::nftnl_set_free(s);
            }
        }
        set.elements.sort();
    }
    chains.sort_by(|a, b| a.name.cmp(&b.name));
    sets.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(TableState { chains, sets }))
}

unsafe fn str_attr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
