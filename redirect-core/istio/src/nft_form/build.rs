//! The rules Istio's nftables backend writes for a config, step by step in Istio's order (its
//! `capture.NftablesConfigurator.Run`, read to learn its behaviour), then its inserts placed as
//! `nft` places them: an insert at an index below the chain's length goes before that rule,
//! any other is an append.

use std::net::IpAddr;

use ipnet::IpNet;
use redirect_model::{
    CaptureConfig, CtStates, DnsCapture, GroupRef, InterceptionMode, Selection, DNS_AGENT_PORT, L4,
    OUTBOUND_MARK,
};

use super::{Chain, IstioNft, IstioTable, Item, Table, Verdict};

use IstioTable::{Mangle, Nat, Raw};
use Item::Counter;

/// A config that has no form in Istio's rules, so it cannot be handed back as it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} has no equivalent in Istio's rules: {fix}")]
pub struct Unsupported {
    /// The setting.
    pub what: String,
    /// What to do.
    pub fix: String,
}

/// Our bypass UIDs and GIDs have no rule in any of Istio's forms: refused.
pub(crate) fn refuse_bypass(cfg: &CaptureConfig) -> Result<(), Unsupported> {
    if cfg.bypass_uids.is_empty() && cfg.bypass_gids.is_empty() {
        return Ok(());
    }
    Err(Unsupported {
        what: "a bypass UID or GID".into(),
        fix: "remove the bypass from the pod's settings, then hand it back".into(),
    })
}

struct Pending {
    table: IstioTable,
    chain: &'static str,
    index: Option<usize>,
    items: Vec<Item>,
}

struct Builder {
    ipv6: bool,
    rules: Vec<Pending>,
}

impl Builder {
    fn append(&mut self, table: IstioTable, chain: &'static str, items: Vec<Item>) {
        self.rules.push(Pending {
            table,
            chain,
            index: None,
            items,
        });
    }

    fn append6(&mut self, table: IstioTable, chain: &'static str, items: Vec<Item>) {
        if self.ipv6 {
            self.append(table, chain, items);
        }
    }

    fn insert(&mut self, table: IstioTable, chain: &'static str, index: usize, items: Vec<Item>) {
        self.rules.push(Pending {
            table,
            chain,
            index: Some(index),
            items,
        });
    }

    fn insert6(&mut self, table: IstioTable, chain: &'static str, index: usize, items: Vec<Item>) {
        if self.ipv6 {
            self.insert(table, chain, index, items);
        }
    }

    /// The tables in their final order; chains and tables without a rule left out.
    fn finish(self) -> IstioNft {
        let mut tables = Vec::new();
        for table in IstioTable::ALL {
            let mut chains: Vec<Chain> = table
                .chains()
                .iter()
                .map(|(name, base)| Chain {
                    name,
                    base: *base,
                    rules: Vec::new(),
                })
                .collect();
            for p in self.rules.iter().filter(|p| p.table == table) {
                let c = chains
                    .iter_mut()
                    .find(|c| c.name == p.chain)
                    .expect("chain");
                match p.index {
                    Some(i) if i < c.rules.len() => c.rules.insert(i, p.items.clone()),
                    _ => c.rules.push(p.items.clone()),
                }
            }
            chains.retain(|c| !c.rules.is_empty());
            if !chains.is_empty() {
                tables.push(Table { table, chains });
            }
        }
        IstioNft { tables }
    }
}

fn tcp() -> Item {
    Item::L4Proto(L4::Tcp)
}
fn port(l4: L4, src: bool, ne: bool, port: u16) -> Item {
    Item::Port { l4, src, ne, port }
}
pub(super) fn addr(src: bool, ne: bool, net: IpNet) -> Item {
    Item::Addr { src, ne, net }
}
fn host(a: IpAddr) -> IpNet {
    IpNet::from(a)
}
pub(super) fn iif(name: &str) -> Item {
    Item::IfName {
        out: false,
        ne: false,
        name: name.into(),
    }
}
pub(super) fn oif(name: &str) -> Item {
    Item::IfName {
        out: true,
        ne: false,
        name: name.into(),
    }
}
fn owner(gid: bool, ne: bool, id: impl ToString) -> Item {
    Item::Owner {
        gid,
        ne,
        meta: false,
        id: id.to_string(),
    }
}
fn ret() -> Item {
    Item::Verdict(Verdict::Return)
}
fn jump(c: &'static str) -> Item {
    Item::Verdict(Verdict::Jump(c))
}
fn lo6() -> IpNet {
    "::6/128".parse().unwrap()
}
fn lo4_6() -> IpNet {
    "127.0.0.6/32".parse().unwrap()
}
fn lo1_6() -> IpNet {
    "::1/128".parse().unwrap()
}

/// What the config says of DNS, in Istio's terms.
struct Dns {
    all: bool,
    v4: Vec<IpNet>,
    v6: Vec<IpNet>,
}

impl Dns {
    fn of(cfg: &CaptureConfig) -> Option<Dns> {
        if !cfg.dns.effective() {
            return None;
        }
        Some(match &cfg.dns {
            DnsCapture::Servers { v4, v6 } => Dns {
                all: false,
                v4: v4.iter().map(|a| host((*a).into())).collect(),
                v6: v6.iter().map(|a| host((*a).into())).collect(),
            },
            _ => Dns {
                all: true,
                v4: Vec::new(),
                v6: Vec::new(),
            },
        })
    }
}

/// [`IstioNft::build`]: the tables Istio's nftables backend writes for `cfg`.
pub(super) fn tables(cfg: &CaptureConfig) -> Result<IstioNft, Unsupported> {
    refuse_bypass(cfg)?;
    let mut b = Builder {
        ipv6: cfg.ipv6,
        rules: Vec::new(),
    };
    let dns = Dns::of(cfg);
    exclude_interfaces(&mut b, cfg);
    for i in &cfg.reroute_interfaces {
        b.insert(Nat, "prerouting", 0, vec![iif(i), Counter, ret()]);
    }
    if cfg.drop_invalid {
        let invalid = Item::CtState(CtStates::Invalid);
        b.append(
            Mangle,
            "prerouting",
            vec![tcp(), invalid, Counter, jump("istio-drop")],
        );
        b.append(
            Mangle,
            "istio-drop",
            vec![Counter, Item::Verdict(Verdict::Drop)],
        );
    }
    let tunnel = cfg.inbound_tunnel_port;
    b.append(
        Nat,
        "istio-inbound",
        vec![tcp(), port(L4::Tcp, false, false, tunnel), Counter, ret()],
    );
    b.append(
        Nat,
        "istio-redirect",
        vec![tcp(), Counter, Item::Redirect(cfg.envoy_port)],
    );
    let capture = Item::Redirect(cfg.inbound_capture_port);
    b.append(Nat, "istio-in-redirect", vec![tcp(), Counter, capture]);
    inbound(&mut b, cfg);
    b.append(Nat, "output", vec![Counter, jump("istio-output")]);
    for p in &cfg.outbound_exclude_ports {
        for l4 in [L4::Tcp, L4::Udp] {
            b.append(
                Nat,
                "istio-output",
                vec![port(l4, false, false, *p), Counter, ret()],
            );
        }
    }
    let lo = oif("lo");
    b.append(
        Nat,
        "istio-output",
        vec![lo.clone(), addr(true, false, lo4_6()), Counter, ret()],
    );
    b.append6(
        Nat,
        "istio-output",
        vec![lo, addr(true, false, lo6()), Counter, ret()],
    );
    proxy_owners(&mut b, cfg, dns.is_some());
    owner_groups(&mut b, cfg);
    if let Some(dns) = &dns {
        dns_redirect(&mut b, cfg, dns);
    }
    outbound(&mut b, cfg);
    if cfg.mode == InterceptionMode::Tproxy {
        tproxy_marks(&mut b, cfg);
    }
    Ok(b.finish())
}

fn exclude_interfaces(b: &mut Builder, cfg: &CaptureConfig) {
    let tables: &[IstioTable] = match cfg.mode {
        InterceptionMode::Tproxy => &[Nat, Mangle],
        InterceptionMode::Redirect => &[Nat],
    };
    for t in tables {
        for i in &cfg.exclude_interfaces {
            b.append(*t, "prerouting", vec![iif(i), Counter, ret()]);
            b.append(*t, "output", vec![oif(i), Counter, ret()]);
        }
    }
}

fn inbound(b: &mut Builder, cfg: &CaptureConfig) {
    let ports = match &cfg.inbound_ports {
        Selection::List(l) if l.is_empty() => return,
        Selection::List(l) => Some(l.as_slice()),
        Selection::All => None,
    };
    let (table, target) = match cfg.mode {
        InterceptionMode::Tproxy => {
            tproxy_chains(b, cfg);
            (Mangle, "istio-tproxy")
        }
        InterceptionMode::Redirect => {
            b.append(
                Nat,
                "prerouting",
                vec![tcp(), Counter, jump("istio-inbound")],
            );
            (Nat, "istio-in-redirect")
        }
    };
    let related = || Item::CtState(CtStates::RelatedEstablished);
    let divert = table == Mangle;
    match ports {
        None => {
            for p in &cfg.inbound_exclude_ports {
                let items = vec![tcp(), port(L4::Tcp, false, false, *p), Counter, ret()];
                b.append(table, "istio-inbound", items);
            }
            if divert {
                let items = vec![tcp(), related(), Counter, jump("istio-divert")];
                b.append(table, "istio-inbound", items);
            }
            b.append(table, "istio-inbound", vec![tcp(), Counter, jump(target)]);
        }
        Some(ports) => {
            for p in ports {
                let dport = || port(L4::Tcp, false, false, *p);
                if divert {
                    let items = vec![tcp(), related(), dport(), Counter, jump("istio-divert")];
                    b.append(table, "istio-inbound", items);
                }
                b.append(
                    table,
                    "istio-inbound",
                    vec![tcp(), dport(), Counter, jump(target)],
                );
            }
        }
    }
}

fn tproxy_chains(b: &mut Builder, cfg: &CaptureConfig) {
    let mark = cfg.tproxy_mark;
    let accept = || Item::Verdict(Verdict::Accept);
    b.append(Mangle, "istio-divert", vec![Counter, Item::MarkSet(mark)]);
    b.append(Mangle, "istio-divert", vec![Counter, accept()]);
    let port = cfg.inbound_capture_port;
    for (v6, lo) in [(false, IpNet::V4(cfg.ipv4_loopback_cidr)), (true, lo1_6())] {
        let items = vec![
            tcp(),
            addr(false, true, lo),
            Item::Tproxy { v6, port },
            Item::MarkSet(mark),
            Counter,
            accept(),
        ];
        match v6 {
            false => b.append(Mangle, "istio-tproxy", items),
            true => b.append6(Mangle, "istio-tproxy", items),
        }
    }
    b.append(
        Mangle,
        "prerouting",
        vec![tcp(), Counter, jump("istio-inbound")],
    );
}

/// The proxy's own UIDs and GIDs: its traffic to itself over `lo` back to the inbound side,
/// the rest left alone.
fn proxy_owners(b: &mut Builder, cfg: &CaptureConfig, dns: bool) {
    let tunnel = cfg.inbound_tunnel_port;
    let loopback_included = match &cfg.outbound_include_cidrs {
        Selection::List(l) => l.iter().any(|n| n.addr().is_loopback()),
        Selection::All => false,
    };
    let owners = cfg.proxy_uids.iter().map(|u| (false, *u));
    let owners = owners.chain(cfg.proxy_gids.iter().map(|g| (true, *g)));
    for (gid, id) in owners {
        // DNS's `{ 53, tunnel }` is written for UIDs only, as Istio does.
        let not_ports = |_| match dns && !gid {
            true => Item::PortsNotIn(L4::Tcp, vec![53, tunnel]),
            false => port(L4::Tcp, false, true, tunnel),
        };
        for (v6, lo) in [(false, IpNet::V4(cfg.ipv4_loopback_cidr)), (true, lo1_6())] {
            let items = vec![
                oif("lo"),
                tcp(),
                addr(false, true, lo),
                not_ports(()),
                owner(gid, false, id),
                Counter,
                jump("istio-in-redirect"),
            ];
            match v6 {
                false => b.append(Nat, "istio-output", items),
                true => b.append6(Nat, "istio-output", items),
            }
        }
        if !loopback_included {
            let items = match dns {
                true => vec![
                    oif("lo"),
                    tcp(),
                    port(L4::Tcp, false, true, 53),
                    owner(gid, true, id),
                    Counter,
                    ret(),
                ],
                false => vec![oif("lo"), owner(gid, true, id), Counter, ret()],
            };
            b.append(Nat, "istio-output", items);
        }
        b.append(
            Nat,
            "istio-output",
            vec![owner(gid, false, id), Counter, ret()],
        );
    }
}

fn owner_groups(b: &mut Builder, cfg: &CaptureConfig) {
    let name = |g: &GroupRef| g.to_string();
    match &cfg.owner_groups_include {
        Selection::All => {
            for g in &cfg.owner_groups_exclude {
                b.append(
                    Nat,
                    "istio-output",
                    vec![owner(true, false, name(g)), Counter, ret()],
                );
            }
        }
        Selection::List(groups) => {
            let mut items: Vec<Item> = groups.iter().map(|g| owner(true, true, name(g))).collect();
            items.extend([Counter, ret()]);
            b.append(Nat, "istio-output", items);
        }
    }
}

fn dns_redirect(b: &mut Builder, cfg: &CaptureConfig, dns: &Dns) {
    b.append(Raw, "output", vec![Counter, jump("istio-output-dns")]);
    b.append(Nat, "istio-output", vec![Counter, jump("istio-output-dns")]);
    let to = || Item::Redirect(DNS_AGENT_PORT);
    for l4 in [L4::Tcp, L4::Udp] {
        let dport = || port(l4, false, false, 53);
        if dns.all {
            let mut items = if l4 == L4::Tcp { vec![tcp()] } else { vec![] };
            items.extend([dport(), Counter, to()]);
            b.append(Nat, "istio-output-dns", items);
            continue;
        }
        for s in &dns.v4 {
            b.append(
                Nat,
                "istio-output-dns",
                vec![addr(false, false, *s), dport(), Counter, to()],
            );
        }
        for s in &dns.v6 {
            let items = vec![addr(false, false, *s), dport(), Counter, to()];
            b.append6(Nat, "istio-output-dns", items);
        }
    }
    dns_zones(b, cfg, dns);
}

fn dns_zones(b: &mut Builder, cfg: &CaptureConfig, dns: &Dns) {
    let zone = |z| Item::CtZone(z);
    let udp = |src, p| port(L4::Udp, src, false, p);
    let owners = cfg.proxy_uids.iter().map(|u| (false, *u));
    for (gid, id) in owners.chain(cfg.proxy_gids.iter().map(|g| (true, *g))) {
        let own = || Item::Owner {
            gid,
            ne: false,
            meta: true,
            id: id.to_string(),
        };
        b.append(
            Raw,
            "istio-output-dns",
            vec![udp(false, 53), own(), Counter, zone(1)],
        );
        let answer = vec![udp(true, DNS_AGENT_PORT), own(), Counter, zone(2)];
        b.append(Raw, "istio-output-dns", answer);
    }
    if dns.all {
        b.append(Raw, "prerouting", vec![Counter, jump("istio-inbound")]);
        b.append(
            Raw,
            "istio-output-dns",
            vec![udp(false, 53), Counter, zone(2)],
        );
        b.append(Raw, "istio-inbound", vec![udp(true, 53), Counter, zone(1)]);
        return;
    }
    if !dns.v4.is_empty() || !dns.v6.is_empty() {
        b.append(Raw, "prerouting", vec![Counter, jump("istio-inbound")]);
    }
    for (v6, s) in dns
        .v4
        .iter()
        .map(|s| (false, s))
        .chain(dns.v6.iter().map(|s| (true, s)))
    {
        let out = vec![udp(false, 53), addr(false, false, *s), Counter, zone(2)];
        let back = vec![udp(true, 53), addr(true, false, *s), Counter, zone(1)];
        match v6 {
            false => {
                b.append(Raw, "istio-output-dns", out);
                b.append(Raw, "istio-inbound", back);
            }
            true => {
                b.append6(Raw, "istio-output-dns", out);
                b.append6(Raw, "istio-inbound", back);
            }
        }
    }
}

/// Loopback and the excluded CIDRs left alone, then the included ports and CIDRs captured.
fn outbound(b: &mut Builder, cfg: &CaptureConfig) {
    let lo4 = IpNet::V4(cfg.ipv4_loopback_cidr);
    b.append(
        Nat,
        "istio-output",
        vec![addr(false, false, lo4), Counter, ret()],
    );
    b.append6(
        Nat,
        "istio-output",
        vec![addr(false, false, lo1_6()), Counter, ret()],
    );
    let (v4, v6): (Vec<IpNet>, Vec<IpNet>) = cfg
        .outbound_exclude_cidrs
        .iter()
        .partition(|n| matches!(n, IpNet::V4(_)));
    for n in v4 {
        b.append(
            Nat,
            "istio-output",
            vec![addr(false, false, n), Counter, ret()],
        );
    }
    for n in v6 {
        b.append6(
            Nat,
            "istio-output",
            vec![addr(false, false, n), Counter, ret()],
        );
    }
    for p in &cfg.outbound_include_ports {
        let items = vec![
            port(L4::Tcp, false, false, *p),
            Counter,
            jump("istio-redirect"),
        ];
        b.append(Nat, "istio-output", items);
    }
    let redirect = || jump("istio-redirect");
    match &cfg.outbound_include_cidrs {
        Selection::All => {
            b.append(Nat, "istio-output", vec![Counter, redirect()]);
            for i in &cfg.reroute_interfaces {
                b.insert(Nat, "prerouting", 0, vec![iif(i), Counter, redirect()]);
            }
        }
        Selection::List(nets) => {
            let (v4, v6): (Vec<&IpNet>, Vec<&IpNet>) =
                nets.iter().partition(|n| matches!(n, IpNet::V4(_)));
            for (is6, n) in v4
                .into_iter()
                .map(|n| (false, n))
                .chain(v6.into_iter().map(|n| (true, n)))
            {
                let d = || addr(false, false, *n);
                for i in &cfg.reroute_interfaces {
                    let items = vec![iif(i), d(), Counter, redirect()];
                    match is6 {
                        false => b.insert(Nat, "prerouting", 0, items),
                        true => b.insert6(Nat, "prerouting", 0, items),
                    }
                }
                match is6 {
                    false => b.append(Nat, "istio-output", vec![d(), Counter, redirect()]),
                    true => b.append6(Nat, "istio-output", vec![d(), Counter, redirect()]),
                }
            }
        }
    }
}

/// TPROXY mode: the proxy's marks saved and restored, and its own traffic kept off the
/// inbound path.
fn tproxy_marks(b: &mut Builder, cfg: &CaptureConfig) {
    let mark = cfg.tproxy_mark;
    let m = |ne, value| Item::Mark { ne, value };
    let lo = || oif("lo");
    b.append(
        Mangle,
        "prerouting",
        vec![tcp(), m(false, mark), Counter, Item::CtMarkSetMark],
    );
    b.append(
        Mangle,
        "output",
        vec![lo(), tcp(), m(false, mark), Counter, ret()],
    );
    let owners = cfg.proxy_uids.iter().map(|u| (false, *u));
    for (gid, id) in owners.chain(cfg.proxy_gids.iter().map(|g| (true, *g))) {
        for (v6, l) in [(false, IpNet::V4(cfg.ipv4_loopback_cidr)), (true, lo1_6())] {
            let items = vec![
                lo(),
                tcp(),
                addr(false, true, l),
                owner(gid, false, id),
                Counter,
                Item::MarkSet(OUTBOUND_MARK),
            ];
            match v6 {
                false => b.append(Mangle, "output", items),
                true => b.append6(Mangle, "output", items),
            }
        }
    }
    let restore = vec![tcp(), Item::CtMark(mark), Counter, Item::MarkSetCtMark];
    b.append(Mangle, "output", restore);
    b.insert(
        Mangle,
        "istio-inbound",
        0,
        vec![tcp(), m(false, mark), Counter, ret()],
    );
    let from_lo = |net| vec![iif("lo"), tcp(), addr(true, false, net), Counter, ret()];
    b.insert(Mangle, "istio-inbound", 1, from_lo(lo4_6()));
    b.insert6(Mangle, "istio-inbound", 1, from_lo(lo6()));
    let not_outbound = vec![iif("lo"), tcp(), m(true, OUTBOUND_MARK), Counter, ret()];
    b.insert(Mangle, "istio-inbound", 2, not_outbound);
}
