//! Istio's ambient in-pod rules in its iptables form (its node agent's `AppendInpodRules`,
//! read to learn its behaviour): what an enrolled pod holds under Istio's agent, in Istio's
//! order and words, so that a pod we capture for ztunnel can be handed back with the rules
//! Istio's agent would have written. The marks, ports and routing are the ones our own in-pod
//! rules use ([`redirect_model::ambient`]): ztunnel sees no difference.

use redirect_model::ambient::{
    DNS_PORT, DNS_ZONE, HBONE_PORT, INBOUND_PORT, MARK_MASK, OUTBOUND_PORT, REPLY_MARK,
    ZTUNNEL_MARK,
};
use redirect_model::AmbientConfig;

use super::{Builder, Fam, IstioIptables};

const PRERT: &str = "ISTIO_PRERT";
const OUTPUT: &str = "ISTIO_OUTPUT";

/// [`IstioIptables::ambient`]: Istio's in-pod rules, per family.
pub(super) fn rules(cfg: &AmbientConfig) -> IstioIptables {
    let mut b = Builder {
        v4: Vec::new(),
        v6: Vec::new(),
    };
    let mark = format!("{ZTUNNEL_MARK:#x}/{MARK_MASK:#x}");
    let reply = format!("{REPLY_MARK:#x}/{MARK_MASK:#x}");
    jumps(&mut b, cfg.dns_capture);
    for i in &cfg.virtual_interfaces {
        let redirect = format!("-i {i} -p tcp -j REDIRECT --to-ports {OUTBOUND_PORT}");
        b.add(Fam::Both, "nat", PRERT, &redirect);
        b.add(Fam::Both, "nat", PRERT, &format!("-i {i} -p tcp -j RETURN"));
    }
    let connmark = format!("-m mark --mark {mark} -j CONNMARK --set-xmark {reply}");
    b.add(Fam::Both, "mangle", PRERT, &connmark);
    let (probe4, probe6) = (cfg.probe_snat_v4.to_string(), cfg.probe_snat_v6.to_string());
    if !cfg.bypass_inbound {
        let line = "-s {ip} -p tcp -m tcp -j ACCEPT";
        b.versioned(&probe4, &probe6, "nat", PRERT, line);
    }
    let line = "-d {ip} -p tcp -m tcp -j ACCEPT";
    b.versioned(&probe4, &probe6, "nat", OUTPUT, line);
    let not_lo = |line: &str| line.replace("{not_lo}", "! -d {ip}");
    let (lo4, lo6) = ("127.0.0.1/32", "::1/128");
    if !cfg.bypass_inbound {
        let line = not_lo(&format!(
            "{{not_lo}} -p tcp ! --dport {HBONE_PORT} -m mark ! --mark {mark} \
             -j REDIRECT --to-ports {INBOUND_PORT}"
        ));
        b.versioned(lo4, lo6, "nat", PRERT, &line);
    }
    let restore = format!(
        "-m connmark --mark {reply} -j CONNMARK --restore-mark --nfmask {all:#x} --ctmask {all:#x}",
        all = u32::MAX
    );
    b.add(Fam::Both, "mangle", OUTPUT, &restore);
    if cfg.dns_capture {
        dns(&mut b, &mark);
    }
    let accept = format!("-p tcp -m mark --mark {reply} -j ACCEPT");
    b.add(Fam::Both, "nat", OUTPUT, &accept);
    b.versioned(lo4, lo6, "nat", OUTPUT, &not_lo("{not_lo} -o lo -j ACCEPT"));
    let outbound = not_lo(&format!(
        "{{not_lo}} -p tcp -m mark ! --mark {mark} -j REDIRECT --to-ports {OUTBOUND_PORT}"
    ));
    b.versioned(lo4, lo6, "nat", OUTPUT, &outbound);
    IstioIptables {
        v4: b.v4,
        v6: cfg.ipv6.then_some(b.v6),
    }
}

/// The jumps from the built-in chains, in Istio's order (raw only with DNS capture).
fn jumps(b: &mut Builder, dns: bool) {
    b.add(Fam::Both, "mangle", "PREROUTING", &format!("-j {PRERT}"));
    b.add(Fam::Both, "mangle", "OUTPUT", &format!("-j {OUTPUT}"));
    b.add(Fam::Both, "nat", "OUTPUT", &format!("-j {OUTPUT}"));
    if dns {
        b.add(Fam::Both, "raw", "PREROUTING", &format!("-j {PRERT}"));
        b.add(Fam::Both, "raw", "OUTPUT", &format!("-j {OUTPUT}"));
    }
    b.add(Fam::Both, "nat", "PREROUTING", &format!("-j {PRERT}"));
}

/// DNS to ztunnel's proxy, and the conntrack zone of its upstream queries and their replies.
fn dns(b: &mut Builder, mark: &str) {
    let udp = format!(
        "! -o lo -p udp -m mark ! --mark {mark} -m udp --dport 53 -j REDIRECT --to-port {DNS_PORT}"
    );
    b.add(Fam::Both, "nat", OUTPUT, &udp);
    let tcp = format!(
        "! -d {{ip}} -p tcp --dport 53 -m mark ! --mark {mark} -j REDIRECT --to-ports {DNS_PORT}"
    );
    b.versioned("127.0.0.1/32", "::1/128", "nat", OUTPUT, &tcp);
    let out = format!("-p udp -m mark --mark {mark} -m udp --dport 53 -j CT --zone {DNS_ZONE}");
    b.add(Fam::Both, "raw", OUTPUT, &out);
    let back = format!("-p udp -m mark ! --mark {mark} -m udp --sport 53 -j CT --zone {DNS_ZONE}");
    b.add(Fam::Both, "raw", PRERT, &back);
}
