//! Istio's iptables form: the rules `istio-iptables` (and istio-cni's plugin) write for a
//! sidecar's config, per family, in Istio's order and words (its `capture.IptablesConfigurator`,
//! read to learn its behaviour): what a hand-back in that form must leave in each chain.
//!
//! [`IstioIptables::build`] gives each family's rules as Istio's builder issues them (appends
//! and inserts); [`chains`] the state they leave, chain by chain; [`IstioIptables::lower`] the
//! tables as iptables-nft keeps them (`lower`: its expressions, and its xtables matches and
//! targets with their data as iptables 1.8 builds it), for one batch over netlink
//! (`Nft::hand_over_xt`).

use std::collections::BTreeMap;

use ipnet::IpNet;
use redirect_kernel::nft::XtTable;
use redirect_model::{
    AmbientConfig, CaptureConfig, DnsCapture, GroupResolver, InterceptionMode, Selection,
    DNS_AGENT_PORT,
};

use crate::nft_form::Unsupported;

mod ambient;
mod lower;
mod xt_info;

/// One rule as Istio issues it: appended, or inserted at a 1-based position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XtRule {
    /// `nat`, `mangle` or `raw`.
    pub table: &'static str,
    /// The chain.
    pub chain: &'static str,
    /// `-I <chain> <n>` when inserted; `None` for `-A`.
    pub insert: Option<usize>,
    /// The rule's words after the chain (`-p tcp --dport 15008 -j RETURN`).
    pub args: Vec<String>,
}

/// Istio's iptables rules for one config: IPv4's, and IPv6's when the pod has IPv6.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IstioIptables {
    /// `iptables`' rules, in the order Istio issues them.
    pub v4: Vec<XtRule>,
    /// `ip6tables`' rules, when the config has IPv6.
    pub v6: Option<Vec<XtRule>>,
}

/// The restore file Istio writes for one family's `rules` (what it pipes to
/// `iptables-restore --noflush`): per table (mangle, nat, raw), the chains it creates (those
/// with rules, then those only jumped to), its rules as issued, `COMMIT`.
pub fn restore_file(rules: &[XtRule]) -> String {
    let mut out = String::new();
    for table in ["mangle", "nat", "raw"] {
        let mine: Vec<&XtRule> = rules.iter().filter(|r| r.table == table).collect();
        if mine.is_empty() {
            continue;
        }
        out.push_str(&format!("* {table}\n"));
        for c in created_chains(rules, table) {
            out.push_str(&format!("-N {c}\n"));
        }
        for r in mine {
            let head = match r.insert {
                Some(n) => format!("-I {} {n}", r.chain),
                None => format!("-A {}", r.chain),
            };
            out.push_str(&format!("{head} {}\n", r.args.join(" ")));
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// The chains Istio's restore file creates in `table` for `rules` (and iptables-nft-restore in
/// that order): those with rules, in the order they first get one, then those only jumped to
/// (an ingress pod's empty `ISTIO_PRERT`).
pub(crate) fn created_chains<'a>(rules: &'a [XtRule], table: &str) -> Vec<&'a str> {
    let mine = rules.iter().filter(|r| r.table == table);
    let with_rules = mine.clone().map(|r| r.chain);
    let jumped_to = mine
        .filter_map(XtRule::jump)
        .filter(|c| c.starts_with("ISTIO_"));
    let mut made: Vec<&str> = Vec::new();
    for c in with_rules.chain(jumped_to) {
        if !lower::BUILT_IN.contains(&c) && !made.contains(&c) {
            made.push(c);
        }
    }
    made
}

impl XtRule {
    /// The chain the rule jumps to (`-j X` at its end), if any.
    pub fn jump(&self) -> Option<&str> {
        match self.args.as_slice() {
            [.., j, target] if j == "-j" => Some(target),
            _ => None,
        }
    }
}

/// Each chain's rules once `rules` are applied in order, by (table, chain).
pub fn chains(rules: &[XtRule]) -> BTreeMap<(&'static str, &'static str), Vec<String>> {
    let mut out: BTreeMap<_, Vec<String>> = BTreeMap::new();
    for r in rules {
        let list = out.entry((r.table, r.chain)).or_default();
        let line = r.args.join(" ");
        match r.insert {
            Some(n) => {
                let at = n.saturating_sub(1).min(list.len());
                list.insert(at, line);
            }
            None => list.push(line),
        }
    }
    out
}

/// Which families a rule goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fam {
    Both,
    V4,
    V6,
}

struct Builder {
    v4: Vec<XtRule>,
    v6: Vec<XtRule>,
}

impl Builder {
    /// `line`'s words (Istio's arguments hold no space), appended or inserted at `insert`.
    fn push(
        &mut self,
        fam: Fam,
        table: &'static str,
        chain: &'static str,
        insert: Option<usize>,
        line: &str,
    ) {
        let rule = XtRule {
            table,
            chain,
            insert,
            args: line.split_whitespace().map(str::to_string).collect(),
        };
        if fam != Fam::V6 {
            self.v4.push(rule.clone());
        }
        if fam != Fam::V4 {
            self.v6.push(rule);
        }
    }

    fn add(&mut self, fam: Fam, table: &'static str, chain: &'static str, line: &str) {
        self.push(fam, table, chain, None, line);
    }

    fn insert(
        &mut self,
        fam: Fam,
        table: &'static str,
        chain: &'static str,
        at: usize,
        line: &str,
    ) {
        self.push(fam, table, chain, Some(at), line);
    }

    /// A rule with an address of each family in place of `{ip}`.
    fn versioned(
        &mut self,
        v4: &str,
        v6: &str,
        table: &'static str,
        chain: &'static str,
        line: &str,
    ) {
        self.add(Fam::V4, table, chain, &line.replace("{ip}", v4));
        self.add(Fam::V6, table, chain, &line.replace("{ip}", v6));
    }
}

impl IstioIptables {
    /// Istio's iptables rules for `cfg`. Refused for what Istio has no rule for (our bypass
    /// UIDs and GIDs).
    pub fn build(cfg: &CaptureConfig) -> Result<IstioIptables, Unsupported> {
        crate::nft_form::refuse_bypass(cfg)?;
        let mut b = Builder {
            v4: Vec::new(),
            v6: Vec::new(),
        };
        let dns = cfg.dns.effective();
        base(&mut b, cfg);
        inbound(&mut b, cfg);
        b.add(Fam::Both, "nat", "OUTPUT", "-j ISTIO_OUTPUT");
        for p in &cfg.outbound_exclude_ports {
            for proto in ["tcp", "udp"] {
                let line = format!("-p {proto} --dport {p} -j RETURN");
                b.add(Fam::Both, "nat", "ISTIO_OUTPUT", &line);
            }
        }
        let lo6 = "-o lo -s {ip} -j RETURN";
        b.versioned("127.0.0.6/32", "::6/128", "nat", "ISTIO_OUTPUT", lo6);
        proxy_owners(&mut b, cfg, dns);
        owner_groups(&mut b, cfg);
        if dns {
            dns_redirect(&mut b, cfg);
        }
        outbound(&mut b, cfg);
        if cfg.mode == InterceptionMode::Tproxy {
            tproxy_marks(&mut b, cfg);
        }
        Ok(IstioIptables {
            v4: b.v4,
            v6: cfg.ipv6.then_some(b.v6),
        })
    }

    /// Istio's in-pod rules for an ambient pod's `cfg` (its DNS capture, IPv6, inbound bypass
    /// and virtual interfaces), per family.
    pub fn ambient(cfg: &AmbientConfig) -> IstioIptables {
        ambient::rules(cfg)
    }

    /// The tables of both families as iptables-nft keeps them, for one batch. Group names are
    /// resolved with `groups`; one that does not resolve is refused, as iptables refuses it.
    pub fn lower(&self, groups: &dyn GroupResolver) -> Result<Vec<XtTable>, Unsupported> {
        lower::lower(self, groups)
    }
}

/// The interfaces left alone or rerouted, the invalid drop, and the redirect chains.
fn base(b: &mut Builder, cfg: &CaptureConfig) {
    let tables: &[&'static str] = match cfg.mode {
        InterceptionMode::Tproxy => &["nat", "mangle"],
        InterceptionMode::Redirect => &["nat"],
    };
    for t in tables {
        for i in &cfg.exclude_interfaces {
            b.add(Fam::Both, t, "PREROUTING", &format!("-i {i} -j RETURN"));
            b.add(Fam::Both, t, "OUTPUT", &format!("-o {i} -j RETURN"));
        }
    }
    for i in &cfg.reroute_interfaces {
        b.insert(
            Fam::Both,
            "nat",
            "PREROUTING",
            1,
            &format!("-i {i} -j RETURN"),
        );
    }
    if cfg.drop_invalid {
        let invalid = "-m conntrack --ctstate INVALID -j ISTIO_DROP";
        b.add(Fam::Both, "mangle", "PREROUTING", invalid);
        b.add(Fam::Both, "mangle", "ISTIO_DROP", "-j DROP");
    }
    let tunnel = cfg.inbound_tunnel_port;
    b.add(
        Fam::Both,
        "nat",
        "ISTIO_INBOUND",
        &format!("-p tcp --dport {tunnel} -j RETURN"),
    );
    let envoy = cfg.envoy_port;
    let to_envoy = format!("-p tcp -j REDIRECT --to-ports {envoy}");
    b.add(Fam::Both, "nat", "ISTIO_REDIRECT", &to_envoy);
    let capture = cfg.inbound_capture_port;
    let to_capture = format!("-p tcp -j REDIRECT --to-ports {capture}");
    b.add(Fam::Both, "nat", "ISTIO_IN_REDIRECT", &to_capture);
}

fn inbound(b: &mut Builder, cfg: &CaptureConfig) {
    let ports = match &cfg.inbound_ports {
        Selection::List(l) if l.is_empty() => return,
        Selection::List(l) => Some(l.as_slice()),
        Selection::All => None,
    };
    let tproxy = cfg.mode == InterceptionMode::Tproxy;
    let table = if tproxy { "mangle" } else { "nat" };
    if tproxy {
        let mark = cfg.tproxy_mark;
        b.add(
            Fam::Both,
            "mangle",
            "ISTIO_DIVERT",
            &format!("-j MARK --set-mark {mark}"),
        );
        b.add(Fam::Both, "mangle", "ISTIO_DIVERT", "-j ACCEPT");
        let port = cfg.inbound_capture_port;
        let line = format!(
            "! -d {{ip}} -p tcp -j TPROXY --tproxy-mark {mark}/0xffffffff --on-port {port}"
        );
        let lo = cfg.ipv4_loopback_cidr.to_string();
        b.versioned(&lo, "::1/128", "mangle", "ISTIO_TPROXY", &line);
    }
    b.add(Fam::Both, table, "PREROUTING", "-p tcp -j ISTIO_INBOUND");
    let related = "-m conntrack --ctstate RELATED,ESTABLISHED -j ISTIO_DIVERT";
    let target = if tproxy {
        "ISTIO_TPROXY"
    } else {
        "ISTIO_IN_REDIRECT"
    };
    let (chain, fam) = ("ISTIO_INBOUND", Fam::Both);
    match ports {
        None => {
            for p in &cfg.inbound_exclude_ports {
                b.add(fam, table, chain, &format!("-p tcp --dport {p} -j RETURN"));
            }
            if tproxy {
                b.add(fam, table, chain, &format!("-p tcp {related}"));
            }
            b.add(fam, table, chain, &format!("-p tcp -j {target}"));
        }
        Some(ports) => {
            for p in ports {
                if tproxy {
                    b.add(fam, table, chain, &format!("-p tcp --dport {p} {related}"));
                }
                b.add(
                    fam,
                    table,
                    chain,
                    &format!("-p tcp --dport {p} -j {target}"),
                );
            }
        }
    }
}

/// The proxy's UIDs and GIDs, `uid` first.
fn owners(cfg: &CaptureConfig) -> impl Iterator<Item = (&'static str, u32)> + '_ {
    let uids = cfg.proxy_uids.iter().map(|u| ("--uid-owner", *u));
    uids.chain(cfg.proxy_gids.iter().map(|g| ("--gid-owner", *g)))
}

fn proxy_owners(b: &mut Builder, cfg: &CaptureConfig, dns: bool) {
    let loopback_included = match &cfg.outbound_include_cidrs {
        Selection::List(l) => l.iter().any(|n| n.addr().is_loopback()),
        Selection::All => false,
    };
    let (lo, tunnel) = (cfg.ipv4_loopback_cidr.to_string(), cfg.inbound_tunnel_port);
    for (flag, id) in owners(cfg) {
        // DNS's `{ 53, tunnel }` is written for UIDs only, as Istio does.
        let ports = match dns && flag == "--uid-owner" {
            true => format!("-m multiport ! --dports 53,{tunnel}"),
            false => format!("! --dport {tunnel}"),
        };
        let line =
            format!("-o lo ! -d {{ip}} -p tcp {ports} -m owner {flag} {id} -j ISTIO_IN_REDIRECT");
        b.versioned(&lo, "::1/128", "nat", "ISTIO_OUTPUT", &line);
        if !loopback_included {
            let tcp = if dns { "-p tcp ! --dport 53 " } else { "" };
            let line = format!("-o lo {tcp}-m owner ! {flag} {id} -j RETURN");
            b.add(Fam::Both, "nat", "ISTIO_OUTPUT", &line);
        }
        let line = format!("-m owner {flag} {id} -j RETURN");
        b.add(Fam::Both, "nat", "ISTIO_OUTPUT", &line);
    }
}

fn owner_groups(b: &mut Builder, cfg: &CaptureConfig) {
    match &cfg.owner_groups_include {
        Selection::All => {
            for g in &cfg.owner_groups_exclude {
                let line = format!("-m owner --gid-owner {g} -j RETURN");
                b.add(Fam::Both, "nat", "ISTIO_OUTPUT", &line);
            }
        }
        Selection::List(groups) => {
            let none_of: String = groups
                .iter()
                .map(|g| format!("-m owner ! --gid-owner {g} "))
                .collect();
            b.add(
                Fam::Both,
                "nat",
                "ISTIO_OUTPUT",
                &format!("{none_of}-j RETURN"),
            );
        }
    }
}

/// The servers of each family as Istio writes them (`/32`, `/128`); `None` for all DNS.
fn dns_servers(cfg: &CaptureConfig) -> Option<(Vec<String>, Vec<String>)> {
    match &cfg.dns {
        DnsCapture::Servers { v4, v6 } => Some((
            v4.iter().map(|a| format!("{a}/32")).collect(),
            v6.iter().map(|a| format!("{a}/128")).collect(),
        )),
        _ => None,
    }
}

fn dns_redirect(b: &mut Builder, cfg: &CaptureConfig) {
    let servers = dns_servers(cfg);
    b.add(Fam::Both, "raw", "OUTPUT", "-j ISTIO_OUTPUT_DNS");
    for (fam, i) in [(Fam::V4, 0), (Fam::V6, 1)] {
        let any = servers.as_ref().is_none_or(|s| ![&s.0, &s.1][i].is_empty());
        if any {
            b.add(fam, "nat", "ISTIO_OUTPUT", "-j ISTIO_OUTPUT_DNS");
        }
    }
    let agent = DNS_AGENT_PORT;
    // Istio spells the TCP rule's option `--to-ports` and the UDP one's `--to-port`.
    for (proto, to) in [("tcp", "--to-ports"), ("udp", "--to-port")] {
        let Some((v4, v6)) = &servers else {
            let line = format!("-p {proto} --dport 53 -j REDIRECT {to} {agent}");
            b.add(Fam::Both, "nat", "ISTIO_OUTPUT_DNS", &line);
            continue;
        };
        for (fam, list) in [(Fam::V4, v4), (Fam::V6, v6)] {
            for s in list {
                let line = format!("-p {proto} --dport 53 -d {s} -j REDIRECT {to} {agent}");
                b.add(fam, "nat", "ISTIO_OUTPUT_DNS", &line);
            }
        }
    }
    dns_zones(b, cfg, servers.as_ref());
}

fn dns_zones(b: &mut Builder, cfg: &CaptureConfig, servers: Option<&(Vec<String>, Vec<String>)>) {
    let agent = DNS_AGENT_PORT;
    for (flag, id) in owners(cfg) {
        for (port, zone) in [
            ("--dport 53".to_string(), 1),
            (format!("--sport {agent}"), 2),
        ] {
            let line = format!("-p udp {port} -m owner {flag} {id} -j CT --zone {zone}");
            b.add(Fam::Both, "raw", "ISTIO_OUTPUT_DNS", &line);
        }
    }
    let Some((v4, v6)) = servers else {
        b.add(Fam::Both, "raw", "PREROUTING", "-j ISTIO_INBOUND");
        b.add(
            Fam::Both,
            "raw",
            "ISTIO_OUTPUT_DNS",
            "-p udp --dport 53 -j CT --zone 2",
        );
        b.add(
            Fam::Both,
            "raw",
            "ISTIO_INBOUND",
            "-p udp --sport 53 -j CT --zone 1",
        );
        return;
    };
    for (fam, list) in [(Fam::V4, v4), (Fam::V6, v6)] {
        if !list.is_empty() {
            b.add(fam, "raw", "PREROUTING", "-j ISTIO_INBOUND");
        }
        for s in list {
            let out = format!("-p udp --dport 53 -d {s} -j CT --zone 2");
            b.add(fam, "raw", "ISTIO_OUTPUT_DNS", &out);
            let back = format!("-p udp --sport 53 -s {s} -j CT --zone 1");
            b.add(fam, "raw", "ISTIO_INBOUND", &back);
        }
    }
}

fn outbound(b: &mut Builder, cfg: &CaptureConfig) {
    let lo = cfg.ipv4_loopback_cidr.to_string();
    b.versioned(&lo, "::1/128", "nat", "ISTIO_OUTPUT", "-d {ip} -j RETURN");
    let fam = |n: &IpNet| {
        if matches!(n, IpNet::V4(_)) {
            Fam::V4
        } else {
            Fam::V6
        }
    };
    for want in [Fam::V4, Fam::V6] {
        for n in cfg.outbound_exclude_cidrs.iter().filter(|n| fam(n) == want) {
            b.add(want, "nat", "ISTIO_OUTPUT", &format!("-d {n} -j RETURN"));
        }
    }
    for p in &cfg.outbound_include_ports {
        let line = format!("-p tcp --dport {p} -j ISTIO_REDIRECT");
        b.add(Fam::Both, "nat", "ISTIO_OUTPUT", &line);
    }
    for want in [Fam::V4, Fam::V6] {
        let nets: Vec<Option<&IpNet>> = match &cfg.outbound_include_cidrs {
            Selection::All => vec![None],
            Selection::List(nets) => nets.iter().filter(|n| fam(n) == want).map(Some).collect(),
        };
        for n in nets {
            let d = n.map(|n| format!("-d {n} ")).unwrap_or_default();
            for i in &cfg.reroute_interfaces {
                let line = format!("-i {i} {d}-j ISTIO_REDIRECT");
                b.insert(want, "nat", "PREROUTING", 1, &line);
            }
            b.add(
                want,
                "nat",
                "ISTIO_OUTPUT",
                &format!("{d}-j ISTIO_REDIRECT"),
            );
        }
    }
}

fn tproxy_marks(b: &mut Builder, cfg: &CaptureConfig) {
    let mark = cfg.tproxy_mark;
    let outbound = redirect_model::OUTBOUND_MARK;
    let save = format!("-p tcp -m mark --mark {mark} -j CONNMARK --save-mark");
    b.add(Fam::Both, "mangle", "PREROUTING", &save);
    let lo_ret = format!("-p tcp -o lo -m mark --mark {mark} -j RETURN");
    b.add(Fam::Both, "mangle", "OUTPUT", &lo_ret);
    let lo = cfg.ipv4_loopback_cidr.to_string();
    for (flag, id) in owners(cfg) {
        let line =
            format!("! -d {{ip}} -p tcp -o lo -m owner {flag} {id} -j MARK --set-mark {outbound}");
        b.versioned(&lo, "::1/128", "mangle", "OUTPUT", &line);
    }
    let restore = format!("-p tcp -m connmark --mark {mark} -j CONNMARK --restore-mark");
    b.add(Fam::Both, "mangle", "OUTPUT", &restore);
    let (t, c) = ("mangle", "ISTIO_INBOUND");
    b.insert(
        Fam::Both,
        t,
        c,
        1,
        &format!("-p tcp -m mark --mark {mark} -j RETURN"),
    );
    b.insert(Fam::V4, t, c, 2, "-p tcp -s 127.0.0.6/32 -i lo -j RETURN");
    b.insert(Fam::V6, t, c, 2, "-p tcp -s ::6/128 -i lo -j RETURN");
    let not_out = format!("-p tcp -i lo -m mark ! --mark {outbound} -j RETURN");
    b.insert(Fam::Both, t, c, 3, &not_out);
}
