//! The evaluator: where one packet ends under a `Ruleset`, and the rules it crossed.
//!
//! It walks the chains the way netfilter does for the first packet of a connection:
//!
//! - `out`: OUTPUT at raw (-300), mangle (-150), then nat (-100, new connections only). A packet
//!   that stays local (out through `lo`, or redirected to a loopback address) then comes back in
//!   on `lo` through PREROUTING raw and mangle, with its mark but without its socket
//!   (loopback orphans it); nat PREROUTING does not run again for it (its NAT was set up at
//!   OUTPUT).
//! - `in`: PREROUTING at raw, mangle, then nat (new connections only).
//! - `out`, new connections, after OUTPUT: nat POSTROUTING (source NAT: the host's probe
//!   SNAT), where the packet still has its socket.
//!
//! A rule matches when all its conditions hold. A condition on something the packet does not
//! carry (the socket owner of an inbound packet, the input interface on the output path) does
//! not hold, negated or not, as nftables' `meta` breaks the rule there.
//! `ct state` is the flow's (`new` by default); the connection mark starts at 0.
//!
//! Kernel tests hold these answers against real connections (`tests/eval_kernel.rs`).

mod flow;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::Serialize;

pub use flow::{CtState, Direction, Flow, FlowError};

use crate::render::nft_rule;
use crate::ruleset::{
    Action, AddrMatch, Chain, CtStates, Family, Hook, Match, PortMatch, Ruleset, SetElements, Stage,
};
use crate::table::chain_name;

/// Where the packet ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// NATed to `to` (a local address) on `port`: a process listening there gets it, and reads
    /// the original destination with `SO_ORIGINAL_DST`. At OUTPUT `to` is the loopback
    /// address; at PREROUTING the kernel uses the input interface's first address, which the
    /// evaluator does not know, so `to` keeps the destination address.
    Redirect {
        /// The port it lands on.
        port: u16,
        /// The new destination: the address and `port`.
        to: SocketAddr,
    },
    /// Handed to the transparent socket on `port` with the packet mark set; the original
    /// destination stays the local address (unless nat PREROUTING redirected it too, as for a
    /// reroute interface: then a note says so). Dropped when no such socket listens.
    Tproxy {
        /// The port of the transparent socket.
        port: u16,
        /// The packet mark TPROXY set.
        mark: u32,
    },
    /// Goes on to its destination (its source rewritten when nat POSTROUTING SNATed it:
    /// [`Evaluation::snat`]).
    Pass,
    /// Dropped by a rule.
    Drop,
}

impl Verdict {
    /// The port a redirected flow lands on; `None` for any other verdict.
    pub fn redirect_port(&self) -> Option<u16> {
        match self {
            Verdict::Redirect { port, .. } => Some(*port),
            _ => None,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Redirect { port, to } => write!(f, "redirected to port {port} ({to})"),
            Verdict::Tproxy { port, mark } => {
                write!(f, "tproxied to port {port} with mark {mark:#x}")
            }
            Verdict::Pass => f.write_str("passed (not captured)"),
            Verdict::Drop => f.write_str("dropped"),
        }
    }
}

/// One rule the packet was tested against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// The family of the chain.
    pub family: Family,
    /// The hook the packet entered the chain's stage from (a jumped-to chain has none of its
    /// own).
    pub hook: Hook,
    /// The stage of the chain.
    pub stage: Stage,
    /// The chain's name in the ruleset (Istio's: `ISTIO_OUTPUT`; built-ins: `OUTPUT`).
    pub chain: String,
    /// The chain's name in our nftables table (`nat_ip_istio_output`).
    pub nft_chain: String,
    /// 1-based position in the chain.
    pub position: usize,
    /// The rule in nft syntax.
    pub rule: String,
    /// Whether all the rule's conditions held (then its action ran).
    pub matched: bool,
}

impl fmt::Display for Step {
    /// `ip nat OUTPUT > ISTIO_OUTPUT #6: <rule>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} > {} #{}: {}",
            self.family.nft_name(),
            self.stage.table_name(),
            self.hook.chain_name(),
            self.chain,
            self.position,
            self.rule
        )
    }
}

/// The answer for one flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Evaluation {
    /// The flow as evaluated (defaults filled in).
    pub flow: Flow,
    /// Where the packet ends.
    pub verdict: Verdict,
    /// Every rule tested, in order; `matched` marks the path.
    pub steps: Vec<Step>,
    /// The packet mark at the end.
    pub mark: u32,
    /// The conntrack zone set on the way, if any.
    pub ct_zone: Option<u16>,
    /// The source address nat POSTROUTING gave the connection, if any (`snat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snat: Option<IpAddr>,
    /// What the evaluator assumed or could not know.
    pub notes: Vec<String>,
}

impl Evaluation {
    /// The rules that matched: the path through the ruleset.
    pub fn path(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|s| s.matched)
    }
}

/// Evaluate one flow (after [`Flow::with_defaults`]) against a ruleset.
pub fn evaluate(rs: &Ruleset, flow: &Flow) -> Evaluation {
    let flow = flow.clone().with_defaults();
    let mut w = Walker {
        rs,
        family: flow.family(),
        pkt: Packet::of(&flow),
        steps: Vec::new(),
        zone: None,
        tracked: false,
        notes: Vec::new(),
    };
    let mut ends = w.first_pass(&flow);
    if !ends.dropped && flow.direction == Direction::Out && flow.ct == CtState::New {
        w.postrouting(&mut ends);
    }
    // A packet that stays local comes back in on lo: PREROUTING raw and mangle only.
    let local = ends.redirect.is_some() || w.pkt.oif.as_deref() == Some("lo");
    if !ends.dropped && flow.direction == Direction::Out && local {
        w.back_in_on_lo(&mut ends);
    }
    let snat = ends.snat;
    let verdict = ends.verdict(&mut w.notes);
    Evaluation {
        mark: w.pkt.mark,
        ct_zone: w.zone,
        snat,
        notes: w.notes,
        steps: w.steps,
        verdict,
        flow,
    }
}

/// How the stages a packet went through ended.
#[derive(Default)]
struct Ends {
    redirect: Option<SocketAddr>,
    tproxy: Option<(u16, u32)>,
    snat: Option<IpAddr>,
    dropped: bool,
}

impl Ends {
    /// The verdict, with the notes a TPROXY verdict needs.
    fn verdict(self, notes: &mut Vec<String>) -> Verdict {
        if self.dropped {
            return Verdict::Drop;
        }
        if let Some((port, mark)) = self.tproxy {
            notes.push(format!(
                "TPROXY hands the connection to a socket listening on port {port} with IP_TRANSPARENT; without one, the packet is dropped"
            ));
            if let Some(to) = self.redirect {
                notes.push(format!(
                    "nat PREROUTING also redirected it to port {}: the socket's local address is that, not the original destination",
                    to.port()
                ));
            }
            return Verdict::Tproxy { port, mark };
        }
        match self.redirect {
            Some(to) => Verdict::Redirect {
                port: to.port(),
                to,
            },
            None => Verdict::Pass,
        }
    }
}

impl Walker<'_> {
    /// The flow's own hook (OUTPUT for `out`, PREROUTING for `in`): raw, mangle, and nat for
    /// a new connection.
    fn first_pass(&mut self, flow: &Flow) -> Ends {
        let mut ends = Ends::default();
        let first_hook = match flow.direction {
            Direction::Out => Hook::Output,
            Direction::In => Hook::Prerouting,
        };
        for stage in [Stage::Raw, Stage::Mangle, Stage::Nat] {
            if stage == Stage::Nat && flow.ct != CtState::New {
                continue;
            }
            match self.run_stage(first_hook, stage) {
                End::Drop => {
                    ends.dropped = true;
                    break;
                }
                End::Redirect(port) => ends.redirect = Some(self.redirect(first_hook, port)),
                End::Tproxy { port, mark } => ends.tproxy = Some((port, mark)),
                End::Snat(_) | End::Accept => {}
            }
        }
        ends
    }

    /// nat POSTROUTING of a new outbound connection: source NAT, with the packet's socket.
    fn postrouting(&mut self, ends: &mut Ends) {
        match self.run_stage(Hook::Postrouting, Stage::Nat) {
            End::Drop => ends.dropped = true,
            End::Snat(a) => {
                self.pkt.src = Some(a);
                ends.snat = Some(a);
            }
            End::Redirect(_) | End::Tproxy { .. } | End::Accept => {}
        }
    }

    /// Back in on `lo`, with its mark but without its socket (loopback orphans it) and
    /// without nat (its NAT was set at OUTPUT).
    fn back_in_on_lo(&mut self, ends: &mut Ends) {
        self.pkt.iif = Some("lo".into());
        self.pkt.oif = None;
        self.pkt.uid = None;
        self.pkt.gid = None;
        self.tracked = true;
        for stage in [Stage::Raw, Stage::Mangle] {
            match self.run_stage(Hook::Prerouting, stage) {
                End::Drop => {
                    ends.dropped = true;
                    break;
                }
                End::Tproxy { port, mark } => ends.tproxy = Some((port, mark)),
                End::Redirect(_) | End::Snat(_) | End::Accept => {}
            }
        }
    }
}

/// The packet as the rules see it, changing on the way.
struct Packet {
    proto: crate::ruleset::L4,
    src: Option<IpAddr>,
    sport: Option<u16>,
    dst: SocketAddr,
    uid: Option<u32>,
    gid: Option<u32>,
    iif: Option<String>,
    oif: Option<String>,
    mark: u32,
    ctmark: u32,
    ct: CtState,
}

impl Packet {
    fn of(f: &Flow) -> Packet {
        Packet {
            proto: f.proto,
            src: f.src,
            sport: f.sport,
            dst: f.dst,
            uid: f.uid,
            gid: f.gid,
            iif: (f.direction == Direction::In)
                .then(|| f.iif.clone())
                .flatten(),
            oif: (f.direction == Direction::Out)
                .then(|| f.oif.clone())
                .flatten(),
            mark: f.mark,
            ctmark: 0,
            ct: f.ct,
        }
    }
}

/// How a stage (one base chain) ended.
enum End {
    Accept,
    Drop,
    Redirect(u16),
    Tproxy { port: u16, mark: u32 },
    Snat(IpAddr),
}

struct Walker<'a> {
    rs: &'a Ruleset,
    family: Family,
    pkt: Packet,
    steps: Vec<Step>,
    zone: Option<u16>,
    /// Conntrack has seen the packet (it is looping back in on lo).
    tracked: bool,
    notes: Vec<String>,
}

/// Deeper jumps than this mean a loop (a plan has three levels at most).
const MAX_DEPTH: usize = 16;

impl Walker<'_> {
    fn run_stage(&mut self, hook: Hook, stage: Stage) -> End {
        let base = self
            .rs
            .chains
            .iter()
            .find(|c| c.family == self.family && c.stage == stage && c.hook == Some(hook));
        match base {
            Some(chain) => self.run_chain(chain, hook, 0).unwrap_or(End::Accept),
            None => End::Accept,
        }
    }

    /// `None` when the chain returns (or ends) without a verdict.
    fn run_chain(&mut self, chain: &Chain, hook: Hook, depth: usize) -> Option<End> {
        if depth > MAX_DEPTH {
            self.notes.push(format!(
                "jumps nest deeper than {MAX_DEPTH} at chain {}: a loop; stopped there",
                chain.name
            ));
            return None;
        }
        for (i, rule) in chain.rules.iter().enumerate() {
            let matched = rule.matches.iter().all(|m| self.holds(m));
            self.steps.push(Step {
                family: chain.family,
                hook,
                stage: chain.stage,
                chain: chain.name.clone(),
                nft_chain: chain_name(chain.stage, chain.family, &chain.name),
                position: i + 1,
                rule: nft_rule(rule, chain.family, chain.stage)
                    .into_iter()
                    .next()
                    .unwrap_or_default(),
                matched,
            });
            if !matched {
                continue;
            }
            match &rule.action {
                Action::Jump(target) => match self.rs.chain(chain.family, chain.stage, target) {
                    Some(next) => {
                        if let Some(end) = self.run_chain(next, hook, depth + 1) {
                            return Some(end);
                        }
                    }
                    None => self.notes.push(format!(
                        "chain {} jumps to {target}, which does not exist: skipped",
                        chain.name
                    )),
                },
                Action::Return => return None,
                Action::Accept => return Some(End::Accept),
                Action::Drop => return Some(End::Drop),
                Action::Redirect(port) => return Some(End::Redirect(*port)),
                Action::Tproxy { port, mark } => {
                    self.pkt.mark = *mark;
                    return Some(End::Tproxy {
                        port: *port,
                        mark: *mark,
                    });
                }
                Action::SetMark(v) => self.pkt.mark = *v,
                Action::SaveMark => self.pkt.ctmark = self.pkt.mark,
                Action::RestoreMark => self.pkt.mark = self.pkt.ctmark,
                // Only a packet not yet tracked takes a zone, and the first setter wins (both
                // xt_CT and nft's `ct zone set` ignore a packet that has a conntrack entry).
                Action::CtZone(z) if !self.tracked && self.zone.is_none() => self.zone = Some(*z),
                Action::CtZone(_) => {}
                Action::SetCtMarkBits { value, mask } => {
                    self.pkt.ctmark = (self.pkt.ctmark & !mask) ^ value
                }
                Action::Snat(a) => return Some(End::Snat(*a)),
            }
        }
        None
    }

    /// Apply a redirect: at OUTPUT to the loopback address, at PREROUTING to the address the
    /// packet arrived for (the pod's address on that interface).
    fn redirect(&mut self, hook: Hook, port: u16) -> SocketAddr {
        let ip = match (hook, self.family) {
            (Hook::Output, Family::V4) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            (Hook::Output, Family::V6) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            (Hook::Prerouting | Hook::Postrouting, _) => self.pkt.dst.ip(),
        };
        self.pkt.dst = SocketAddr::new(ip, port);
        self.pkt.dst
    }

    fn holds(&self, m: &Match) -> bool {
        let p = &self.pkt;
        match m {
            Match::Proto(l4) => p.proto == *l4,
            Match::DPort(pm) => self.port(pm, Some(p.dst.port())),
            Match::SPort(pm) => self.port(pm, p.sport),
            Match::DAddr(am) => self.addr(am, Some(p.dst.ip())),
            Match::SAddr(am) => self.addr(am, p.src),
            Match::Iif { name, negate } => p.iif.as_ref().is_some_and(|i| (i == name) != *negate),
            Match::Oif { name, negate } => p.oif.as_ref().is_some_and(|o| (o == name) != *negate),
            Match::Uid { id, negate } => p.uid.is_some_and(|u| (u == *id) != *negate),
            Match::Gid { id, negate } => p.gid.is_some_and(|g| (g == *id) != *negate),
            Match::Mark { value, negate } => (p.mark == *value) != *negate,
            Match::CtMark { value } => p.ctmark == *value,
            Match::MarkBits {
                value,
                mask,
                negate,
            } => (p.mark & mask == *value) != *negate,
            Match::CtMarkBits { value, mask } => p.ctmark & mask == *value,
            Match::CtState(CtStates::Invalid) => p.ct == CtState::Invalid,
            Match::CtState(CtStates::RelatedEstablished) => p.ct == CtState::Established,
        }
    }

    /// An unknown port (an ephemeral source port) equals none of the listed ports.
    fn port(&self, pm: &PortMatch, port: Option<u16>) -> bool {
        let is = |want: u16| port == Some(want);
        match pm {
            PortMatch::Eq(want) => is(*want),
            PortMatch::Ne(want) => !is(*want),
            PortMatch::NotIn(list) => !list.iter().any(|w| is(*w)),
            PortMatch::InSet(name) => match self.rs.set(name).map(|s| &s.elements) {
                Some(SetElements::Ports(list)) => port.is_some_and(|p| list.contains(&p)),
                _ => false,
            },
        }
    }

    /// An unknown address (a source the kernel picks) is in none of the listed networks.
    fn addr(&self, am: &AddrMatch, addr: Option<IpAddr>) -> bool {
        let within = |net: &ipnet::IpNet| addr.is_some_and(|a| net.contains(&a));
        match am {
            AddrMatch::Eq(net) => within(net),
            AddrMatch::Ne(net) => !within(net),
            AddrMatch::InSet(name) => match self.rs.set(name).map(|s| &s.elements) {
                Some(SetElements::Cidrs(nets)) => nets.iter().any(within),
                Some(SetElements::Addrs(list)) => addr.is_some_and(|a| list.contains(&a)),
                _ => false,
            },
        }
    }
}

#[cfg(test)]
mod tests;
