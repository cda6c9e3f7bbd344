//! Istio's ambient in-pod rules in its native nftables form (its node agent's nftables
//! backend, Istio ≥ 1.28 with `nativeNftables`, read to learn its behaviour): the tables
//! `inet istio-ambient-{nat,mangle,raw}` an enrolled pod holds under Istio's agent, chain for
//! chain in Istio's order and words. The marks, ports and routing are the ones our own in-pod
//! rules use ([`redirect_model::ambient`]) and Istio's iptables form uses: ztunnel sees no
//! difference between the three.

use std::net::IpAddr;

use ipnet::IpNet;
use redirect_model::ambient::{
    DNS_PORT, DNS_ZONE, HBONE_PORT, INBOUND_PORT, MARK_MASK, OUTBOUND_PORT, REPLY_MARK,
    ZTUNNEL_MARK,
};
use redirect_model::{AmbientConfig, L4};

use super::build::{addr, iif, oif};
use super::{Chain, IstioNft, IstioTable, Item, Table, Verdict};

use IstioTable::{AmbientMangle, AmbientNat, AmbientRaw};
use Item::Counter;

const PRERT: &str = "istio-prerouting";
const OUTPUT: &str = "istio-output";

/// The rules of one table, per chain, in the order they are appended.
struct Rules {
    table: IstioTable,
    pre: Vec<Vec<Item>>,
    out: Vec<Vec<Item>>,
}

impl Rules {
    fn new(table: IstioTable) -> Self {
        Rules {
            table,
            pre: Vec::new(),
            out: Vec::new(),
        }
    }

    /// The table with its two base chains jumping to Istio's two, all four declared (Istio
    /// declares a chain that has a rule or is jumped to).
    fn table(self) -> Table {
        let jump = |to: &'static str| vec![vec![Item::Verdict(Verdict::Jump(to))]];
        let rules = [jump(PRERT), jump(OUTPUT), self.pre, self.out];
        let chains = self
            .table
            .chains()
            .iter()
            .zip(rules)
            .map(|(&(name, base), rules)| Chain { name, base, rules })
            .collect();
        Table {
            table: self.table,
            chains,
        }
    }
}

/// Some bits of the packet's mark compared, in `words` as Istio writes them.
fn mark(words: &'static str, ne: bool, value: u32) -> Item {
    Item::MarkBits {
        ct: false,
        words,
        mask: MARK_MASK,
        ne,
        value,
    }
}

fn port(l4: L4, src: bool, ne: bool, port: u16) -> Item {
    Item::Port { l4, src, ne, port }
}

/// Each family's loopback network (`127.0.0.1/32`, `::1/128`), as `!=` matches.
fn not_loopback(v6: bool) -> Item {
    let lo: IpAddr = if v6 {
        std::net::Ipv6Addr::LOCALHOST.into()
    } else {
        std::net::Ipv4Addr::LOCALHOST.into()
    };
    addr(false, true, IpNet::from(lo))
}

/// The items of a rule ending in `counter` and `end`.
fn rule(items: Vec<Item>, end: Item) -> Vec<Item> {
    let mut r = items;
    r.extend([Counter, end]);
    r
}

fn accept(items: Vec<Item>) -> Vec<Item> {
    rule(items, Item::Verdict(Verdict::Accept))
}

fn redirect(items: Vec<Item>, port: u16) -> Vec<Item> {
    rule(items, Item::Redirect(port))
}

fn not_ztunnel() -> Item {
    mark("mark and", true, ZTUNNEL_MARK)
}

/// One pod's config, and the families its rules are written for (IPv6 second).
struct Pod<'a> {
    cfg: &'a AmbientConfig,
    families: &'a [bool],
}

impl Pod<'_> {
    /// The source address of kubelet's probes after the host's SNAT, per family.
    fn snat(&self, v6: bool) -> IpAddr {
        if v6 {
            self.cfg.probe_snat_v6.into()
        } else {
            self.cfg.probe_snat_v4.into()
        }
    }

    /// `istio-ambient-nat`'s rules: virtual interfaces, probes and inbound in prerouting;
    /// probes, DNS (with `dns`), ztunnel's replies, loopback and outbound in output.
    fn nat(&self, dns: &[Vec<Item>]) -> Rules {
        let tcp = || Item::L4Proto(L4::Tcp);
        let mut nat = Rules::new(AmbientNat);
        for i in &self.cfg.virtual_interfaces {
            nat.pre.push(redirect(vec![iif(i), tcp()], OUTBOUND_PORT));
            nat.pre
                .push(rule(vec![iif(i), tcp()], Item::Verdict(Verdict::Return)));
        }
        if !self.cfg.bypass_inbound {
            for &v6 in self.families {
                let ip = self.snat(v6);
                nat.pre
                    .push(accept(vec![tcp(), Item::Host { src: true, ip }]));
            }
        }
        for &v6 in self.families {
            let ip = self.snat(v6);
            nat.out
                .push(accept(vec![tcp(), Item::Host { src: false, ip }]));
        }
        if !self.cfg.bypass_inbound {
            for &v6 in self.families {
                let hbone = port(L4::Tcp, false, true, HBONE_PORT);
                let inbound = vec![not_loopback(v6), hbone, not_ztunnel()];
                nat.pre.push(redirect(inbound, INBOUND_PORT));
            }
        }
        nat.out.extend(dns.iter().cloned());
        let replies = vec![tcp(), mark("mark and", false, REPLY_MARK)];
        nat.out.push(accept(replies));
        for &v6 in self.families {
            nat.out.push(accept(vec![oif("lo"), not_loopback(v6)]));
        }
        for &v6 in self.families {
            let outbound = vec![tcp(), not_loopback(v6), not_ztunnel()];
            nat.out.push(redirect(outbound, OUTBOUND_PORT));
        }
        nat
    }

    /// DNS to ztunnel's proxy (`istio-ambient-nat`'s output), and `istio-ambient-raw`: the
    /// conntrack zone of ztunnel's upstream queries and their answers.
    fn dns(&self) -> (Vec<Vec<Item>>, Rules) {
        let not_lo = Item::IfName {
            out: true,
            ne: true,
            name: "lo".into(),
        };
        let udp53 = |src| port(L4::Udp, src, false, 53);
        let mut nat = vec![redirect(
            vec![not_lo, not_ztunnel(), udp53(false)],
            DNS_PORT,
        )];
        for &v6 in self.families {
            let tcp = vec![
                not_loopback(v6),
                port(L4::Tcp, false, false, 53),
                not_ztunnel(),
            ];
            nat.push(redirect(tcp, DNS_PORT));
        }
        let mut raw = Rules::new(AmbientRaw);
        let zone = Item::CtZone(DNS_ZONE);
        let query = vec![udp53(false), mark("meta mark and", false, ZTUNNEL_MARK)];
        raw.out.push(rule(query, zone.clone()));
        let answer = vec![udp53(true), mark("meta mark and", true, ZTUNNEL_MARK)];
        raw.pre.push(rule(answer, zone));
        (nat, raw)
    }
}

/// `istio-ambient-mangle`: ztunnel's mark kept on its connections, and put back on their
/// packets going out.
fn mangle() -> Rules {
    let mut mangle = Rules::new(AmbientMangle);
    let keep = Item::CtMarkSetBits {
        keep: !MARK_MASK,
        set: REPLY_MARK,
    };
    mangle
        .pre
        .push(rule(vec![mark("meta mark &", false, ZTUNNEL_MARK)], keep));
    let reply = Item::MarkBits {
        ct: true,
        words: "ct mark and",
        mask: MARK_MASK,
        ne: false,
        value: REPLY_MARK,
    };
    mangle.out.push(rule(vec![reply], Item::MarkSetCtMark));
    mangle
}

/// [`IstioNft::ambient`]: Istio's in-pod tables for an ambient pod.
pub(super) fn tables(cfg: &AmbientConfig) -> IstioNft {
    let families: &[bool] = if cfg.ipv6 { &[false, true] } else { &[false] };
    let pod = Pod { cfg, families };
    let (dns, raw) = match cfg.dns_capture {
        true => {
            let (nat, raw) = pod.dns();
            (nat, Some(raw))
        }
        false => (Vec::new(), None),
    };
    let mut tables = vec![pod.nat(&dns).table(), mangle().table()];
    tables.extend(raw.map(Rules::table));
    IstioNft { tables }
}
