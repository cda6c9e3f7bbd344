//! Istio's native nftables form (istio-iptables with `--native-nftables`, Istio ≥ 1.28): the
//! tables `inet istio-proxy-{nat,mangle,raw}` Istio's nftables backend writes for a sidecar's
//! config, built here rule for rule so that a node can be handed back to Istio with the rules
//! Istio itself would write (its agent then finds nothing to change).
//!
//! - [`IstioNft::build`]: the tables for a
//!   [`CaptureConfig`], in their final order (Istio's inserts
//!   already placed), each chain with its rules and each table only if it has one.
//! - [`IstioNft::rule_lines`]: the rules as Istio writes them (`add rule inet ...`), one per
//!   line, which Istio's goldens hold.
//! - [`IstioNft::lower`]: the tables as nf_tables objects, expression for expression what `nft`
//!   compiles from Istio's text, for one batch over netlink (`Nft::hand_over`).
//! - [`IstioNft::ambient`]: an ambient pod's in-pod tables `inet istio-ambient-{nat,mangle,raw}`
//!   as Istio's node agent writes them (Istio ≥ 1.28 with `nativeNftables`).
//! - [`IstioNft::script`]: the whole text Istio pipes to `nft -f`.

use std::fmt;

use ipnet::IpNet;
use redirect_kernel::nft::NftTable;
use redirect_model::{AmbientConfig, CaptureConfig, ChainKind, CtStates, GroupResolver, Hook, L4};

mod ambient;
mod build;
mod lower;

pub(crate) use build::refuse_bypass;
pub use build::Unsupported;

/// One of Istio's three tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IstioTable {
    /// `istio-proxy-nat`: REDIRECT.
    Nat,
    /// `istio-proxy-mangle`: TPROXY, marks, invalid drop.
    Mangle,
    /// `istio-proxy-raw`: DNS conntrack zones.
    Raw,
    /// `istio-ambient-nat`: an ambient pod's REDIRECTs to ztunnel.
    AmbientNat,
    /// `istio-ambient-mangle`: an ambient pod's connection marks.
    AmbientMangle,
    /// `istio-ambient-raw`: an ambient pod's DNS conntrack zones.
    AmbientRaw,
}

impl IstioTable {
    /// A sidecar's three, in the order Istio writes them.
    pub const ALL: [IstioTable; 3] = [IstioTable::Nat, IstioTable::Mangle, IstioTable::Raw];
    /// An ambient pod's three, in the order Istio's agent writes them.
    pub const AMBIENT: [IstioTable; 3] = [
        IstioTable::AmbientNat,
        IstioTable::AmbientMangle,
        IstioTable::AmbientRaw,
    ];

    /// The table's name (family `inet`).
    pub fn name(self) -> &'static str {
        match self {
            IstioTable::Nat => "istio-proxy-nat",
            IstioTable::Mangle => "istio-proxy-mangle",
            IstioTable::Raw => "istio-proxy-raw",
            IstioTable::AmbientNat => "istio-ambient-nat",
            IstioTable::AmbientMangle => "istio-ambient-mangle",
            IstioTable::AmbientRaw => "istio-ambient-raw",
        }
    }

    /// The chains Istio declares in this table, in its order: base chains with their hook,
    /// type and priority, then regular chains.
    pub fn chains(self) -> &'static [(&'static str, Option<BaseChain>)] {
        match self {
            IstioTable::Nat => NAT_CHAINS,
            IstioTable::Mangle => MANGLE_CHAINS,
            IstioTable::Raw => RAW_CHAINS,
            IstioTable::AmbientNat => AMBIENT_NAT_CHAINS,
            IstioTable::AmbientMangle => AMBIENT_MANGLE_CHAINS,
            IstioTable::AmbientRaw => AMBIENT_RAW_CHAINS,
        }
    }
}

type Chains = &'static [(&'static str, Option<BaseChain>)];

const NAT_CHAINS: Chains = &[
    (
        "prerouting",
        Some(BaseChain::new(Hook::Prerouting, ChainKind::Nat, -100)),
    ),
    (
        "output",
        Some(BaseChain::new(Hook::Output, ChainKind::Nat, -100)),
    ),
    ("istio-inbound", None),
    ("istio-redirect", None),
    ("istio-in-redirect", None),
    ("istio-output", None),
    ("istio-output-dns", None),
];
const MANGLE_CHAINS: Chains = &[
    (
        "prerouting",
        Some(BaseChain::new(Hook::Prerouting, ChainKind::Filter, -150)),
    ),
    (
        "output",
        Some(BaseChain::new(Hook::Output, ChainKind::Route, -150)),
    ),
    ("istio-divert", None),
    ("istio-tproxy", None),
    ("istio-inbound", None),
    ("istio-drop", None),
];
const RAW_CHAINS: Chains = &[
    (
        "prerouting",
        Some(BaseChain::new(Hook::Prerouting, ChainKind::Filter, -300)),
    ),
    (
        "output",
        Some(BaseChain::new(Hook::Output, ChainKind::Filter, -300)),
    ),
    ("istio-inbound", None),
    ("istio-output-dns", None),
];

/// An ambient table's chains: two base chains that jump to Istio's own two.
macro_rules! ambient_chains {
    ($name:ident, $pre:expr, $out:expr, $priority:expr) => {
        const $name: Chains = &[
            (
                "prerouting",
                Some(BaseChain::new(Hook::Prerouting, $pre, $priority)),
            ),
            (
                "output",
                Some(BaseChain::new(Hook::Output, $out, $priority)),
            ),
            ("istio-prerouting", None),
            ("istio-output", None),
        ];
    };
}
ambient_chains!(AMBIENT_NAT_CHAINS, ChainKind::Nat, ChainKind::Nat, -100);
ambient_chains!(
    AMBIENT_MANGLE_CHAINS,
    ChainKind::Filter,
    ChainKind::Route,
    -150
);
ambient_chains!(
    AMBIENT_RAW_CHAINS,
    ChainKind::Filter,
    ChainKind::Filter,
    -300
);

/// A base chain's hook, type and priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseChain {
    /// The hook.
    pub hook: Hook,
    /// Its type (`nat`, `filter`, `route`).
    pub kind: ChainKind,
    /// Its priority.
    pub priority: i32,
}

impl BaseChain {
    const fn new(hook: Hook, kind: ChainKind, priority: i32) -> Self {
        BaseChain {
            hook,
            kind,
            priority,
        }
    }
}

/// What a rule does at its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `return`.
    Return,
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `jump <chain>`.
    Jump(&'static str),
}

/// One word group of a rule, as Istio writes it, in the rule's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// `iifname X` (`out`: `oifname X`; `ne`: `iifname != X`).
    IfName {
        /// The output interface rather than the input one.
        out: bool,
        /// Any interface but this one.
        ne: bool,
        /// The name.
        name: String,
    },
    /// `meta l4proto tcp`.
    L4Proto(L4),
    /// `ip daddr != X` and the like (the family from the address).
    Addr {
        /// The source address rather than the destination.
        src: bool,
        /// Anything but this network.
        ne: bool,
        /// The network, as Istio prints it.
        net: IpNet,
    },
    /// `ip saddr 169.254.7.127`: one address, written bare (Istio's ambient rules).
    Host {
        /// The source address rather than the destination.
        src: bool,
        /// The address.
        ip: std::net::IpAddr,
    },
    /// `tcp dport != 15008` and the like.
    Port {
        /// The protocol.
        l4: L4,
        /// The source port rather than the destination.
        src: bool,
        /// Anything but this port.
        ne: bool,
        /// The port.
        port: u16,
    },
    /// `tcp dport != { 53, 15008 }`.
    PortsNotIn(L4, Vec<u16>),
    /// `skuid 1337`, `meta skgid != java`...
    Owner {
        /// The group rather than the user.
        gid: bool,
        /// Anything but this one.
        ne: bool,
        /// Written with `meta` (Istio's raw table does).
        meta: bool,
        /// The id or group name as Istio's config gives it.
        id: String,
    },
    /// `mark 1337`, `mark != 1338`.
    Mark {
        /// Anything but this mark.
        ne: bool,
        /// The mark.
        value: u32,
    },
    /// `ct state related,established` or `ct state invalid`.
    CtState(CtStates),
    /// `ct mark 1337`.
    CtMark(u32),
    /// Some bits of the packet's or the connection's mark: `mark and 0xfff != 0x539`,
    /// `ct mark and 0xfff == 0x111` (Istio's ambient rules).
    MarkBits {
        /// The connection's mark rather than the packet's.
        ct: bool,
        /// The words before the mask, as Istio writes them (`mark and`, `meta mark &`).
        words: &'static str,
        /// The bits compared.
        mask: u32,
        /// Anything but this value.
        ne: bool,
        /// The value.
        value: u32,
    },
    /// `ct mark set ct mark & 0xfffff000 | 0x111`: some bits of the connection's mark set,
    /// the others kept.
    CtMarkSetBits {
        /// The bits kept.
        keep: u32,
        /// The bits then set.
        set: u32,
    },
    /// `counter`.
    Counter,
    /// `meta mark set 1337`.
    MarkSet(u32),
    /// `ct mark set mark`.
    CtMarkSetMark,
    /// `meta mark set ct mark`.
    MarkSetCtMark,
    /// `ct zone set 1`.
    CtZone(u16),
    /// `redirect to :15001`.
    Redirect(u16),
    /// `tproxy ip to :15006` (`v6`: `tproxy ip6`).
    Tproxy {
        /// IPv6.
        v6: bool,
        /// The port.
        port: u16,
    },
    /// The verdict.
    Verdict(Verdict),
}

/// One chain of Istio's table, in its final order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// Its name.
    pub name: &'static str,
    /// Its hook, type and priority for a base chain.
    pub base: Option<BaseChain>,
    /// Its rules, in order.
    pub rules: Vec<Vec<Item>>,
}

/// One of Istio's tables with the chains that have rules, in Istio's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Which table.
    pub table: IstioTable,
    /// Its chains (those with a rule).
    pub chains: Vec<Chain>,
}

/// Istio's native nftables rules for one config: the tables that have a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IstioNft {
    /// The tables, in Istio's order (nat, mangle, raw).
    pub tables: Vec<Table>,
}

impl IstioNft {
    /// The tables Istio's nftables backend writes for `cfg`. Refused for what Istio has no
    /// rule for (our bypass UIDs and GIDs).
    pub fn build(cfg: &CaptureConfig) -> Result<IstioNft, Unsupported> {
        build::tables(cfg)
    }

    /// Istio's in-pod tables for an ambient pod's `cfg` (its DNS capture, IPv6, inbound bypass
    /// and virtual interfaces).
    pub fn ambient(cfg: &AmbientConfig) -> IstioNft {
        ambient::tables(cfg)
    }

    /// The tables as nf_tables objects for one batch. Group names are resolved with
    /// `groups`; one that does not resolve is refused, as `nft` refuses it.
    pub fn lower(&self, groups: &dyn GroupResolver) -> Result<Vec<NftTable>, Unsupported> {
        lower::lower(self, groups)
    }

    /// Every rule as `add rule inet <table> <chain> <rule>`, in the tables' final order.
    pub fn rule_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.tables {
            for c in &t.chains {
                for r in &c.rules {
                    out.push(format!(
                        "add rule inet {} {} {}",
                        t.table.name(),
                        c.name,
                        RuleText(r)
                    ));
                }
            }
        }
        out
    }

    /// The text Istio pipes to `nft -f` for these tables: each table added and flushed, its
    /// chains declared, then every rule.
    pub fn script(&self) -> String {
        let mut out = Vec::new();
        for t in &self.tables {
            let name = t.table.name();
            out.push(format!("add table inet {name}"));
            out.push(format!("flush table inet {name}"));
            for c in &t.chains {
                let decl = match c.base {
                    Some(b) => format!(
                        " {{ type {} hook {} priority {} ; }}",
                        b.kind.name(),
                        b.hook.nf_name(),
                        b.priority
                    ),
                    None => String::new(),
                };
                out.push(format!("add chain inet {name} {}{decl}", c.name));
            }
        }
        out.extend(self.rule_lines());
        out.join("\n") + "\n"
    }

    /// The names of the tables it writes.
    pub fn table_names(&self) -> Vec<String> {
        self.tables
            .iter()
            .map(|t| t.table.name().to_string())
            .collect()
    }
}

/// A rule's items as Istio joins them (one space between).
pub struct RuleText<'a>(pub &'a [Item]);

impl fmt::Display for RuleText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

fn ne(neg: bool) -> &'static str {
    if neg {
        "!= "
    } else {
        ""
    }
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::IfName { out, ne: n, name } => {
                let key = if *out { "oifname" } else { "iifname" };
                write!(f, "{key} {}{name}", ne(*n))
            }
            Item::L4Proto(l4) => write!(f, "meta l4proto {}", l4.name()),
            Item::Addr { src, ne: n, net } => {
                let fam = if matches!(net, IpNet::V4(_)) {
                    "ip"
                } else {
                    "ip6"
                };
                let dir = if *src { "saddr" } else { "daddr" };
                write!(f, "{fam} {dir} {}{net}", ne(*n))
            }
            Item::Host { src, ip } => {
                let fam = if ip.is_ipv4() { "ip" } else { "ip6" };
                let dir = if *src { "saddr" } else { "daddr" };
                write!(f, "{fam} {dir} {ip}")
            }
            Item::Port {
                l4,
                src,
                ne: n,
                port,
            } => {
                let dir = if *src { "sport" } else { "dport" };
                write!(f, "{} {dir} {}{port}", l4.name(), ne(*n))
            }
            Item::PortsNotIn(l4, ports) => {
                let list: Vec<String> = ports.iter().map(u16::to_string).collect();
                write!(f, "{} dport != {{ {} }}", l4.name(), list.join(", "))
            }
            Item::Owner {
                gid,
                ne: n,
                meta,
                id,
            } => {
                let key = if *gid { "skgid" } else { "skuid" };
                let meta = if *meta { "meta " } else { "" };
                write!(f, "{meta}{key} {}{id}", ne(*n))
            }
            Item::Mark { ne: n, value } => write!(f, "mark {}{value}", ne(*n)),
            Item::CtState(CtStates::Invalid) => f.write_str("ct state invalid"),
            Item::CtState(CtStates::RelatedEstablished) => {
                f.write_str("ct state related,established")
            }
            Item::CtMark(v) => write!(f, "ct mark {v}"),
            Item::MarkBits {
                words,
                mask,
                ne: n,
                value,
                ..
            } => {
                let op = if *n { "!=" } else { "==" };
                write!(f, "{words} {mask:#x} {op} {value:#x}")
            }
            Item::CtMarkSetBits { keep, set } => {
                write!(f, "ct mark set ct mark & {keep:#x} | {set:#x}")
            }
            Item::Counter => f.write_str("counter"),
            Item::MarkSet(v) => write!(f, "meta mark set {v}"),
            Item::CtMarkSetMark => f.write_str("ct mark set mark"),
            Item::MarkSetCtMark => f.write_str("meta mark set ct mark"),
            Item::CtZone(z) => write!(f, "ct zone set {z}"),
            Item::Redirect(p) => write!(f, "redirect to :{p}"),
            Item::Tproxy { v6, port } => {
                write!(f, "tproxy {} to :{port}", if *v6 { "ip6" } else { "ip" })
            }
            Item::Verdict(Verdict::Return) => f.write_str("return"),
            Item::Verdict(Verdict::Accept) => f.write_str("accept"),
            Item::Verdict(Verdict::Drop) => f.write_str("drop"),
            Item::Verdict(Verdict::Jump(c)) => write!(f, "jump {c}"),
        }
    }
}
