//! Typed settings from the resolved flags: the capture config (less what is derived from the
//! namespace) and how to run. Every error names the flag or variable the value came from.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::pod_facts::{self, HostAddress, DEFAULT_PROXY_UID};
use crate::validation::probe::ProbeSpec;
use crate::xtables::Variant;
use redirect_model::parse::{
    parse_cidr_selection, parse_cidrs, parse_groups, parse_ids, parse_interfaces,
    parse_loopback_cidr, parse_port_selection, parse_ports,
};
use redirect_model::{
    CaptureConfig, DnsCapture, GroupRef, InterceptionMode, Selection, ValidConfig,
};
use redirect_model::{Error, Result};

use super::flags::*;

/// Which backend programs the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// nftables over netlink, one atomic batch (default).
    Native,
    /// iptables-restore with the host's binaries.
    Iptables,
}

/// What `--dry-run` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DryRunFormat {
    /// An `nft -f` script (default).
    Nft,
    /// iptables-restore input, per family.
    Iptables,
    /// JSON.
    Json,
}

/// Everything redirect-init needs, before the namespace is looked at.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The capture config with the flag values, validated; `finish` fills in what Istio
    /// derives.
    pub config: ValidConfig,
    /// `-u` was empty: the UID comes from `ENVOY_USER`.
    pub proxy_uid_from_user: bool,
    /// `-g` was empty: the GIDs are the UIDs.
    pub proxy_gid_from_uid: bool,
    /// `ENVOY_USER`: the account whose UID is the proxy's when `-u` is empty.
    pub envoy_user: String,
    /// `--redirect-dns` (or `ISTIO_META_DNS_CAPTURE`).
    pub redirect_dns: bool,
    /// `--capture-all-dns`.
    pub capture_all_dns: bool,
    /// `--dual-stack` (or `ISTIO_DUAL_STACK`): any IPv6 address of the pod turns IPv6 on.
    pub dual_stack: bool,
    /// `--dry-run`: print, change nothing.
    pub dry_run: bool,
    /// `--dry-run-format`.
    pub dry_run_format: DryRunFormat,
    /// `DRY_RUN_FILE_PATH`: where `--dry-run` also writes its output.
    pub dry_run_file: Option<PathBuf>,
    /// `--skip-rule-apply`.
    pub skip_rule_apply: bool,
    /// `--run-validation`.
    pub run_validation: bool,
    /// `--cleanup-only`.
    pub cleanup_only: bool,
    /// `--reconcile`.
    pub reconcile: bool,
    /// `--force-apply`.
    pub force_apply: bool,
    /// `--backend`.
    pub backend: Backend,
    /// `FORCE_IPTABLES_BINARY`: `None` chooses as Istio does.
    pub force_iptables_binary: Option<Variant>,
    /// `--network-namespace`: `None` acts in this process's namespace.
    pub network_namespace: Option<PathBuf>,
    /// `--iptables-probe-port`.
    pub probe_port: u16,
    /// `--probe-timeout`.
    pub probe_timeout: Duration,
}

impl Settings {
    /// Type every value; the first bad one is the error (so the helpers run in the flags'
    /// order).
    pub fn from_resolved(r: &Resolved) -> Result<Settings> {
        let v = |k: &Flag| r.get(k);
        let proxy_uid = v(&PROXY_UID);
        let proxy_gid = v(&PROXY_GID);
        let uids = parse_ids(proxy_uid.field(), &proxy_uid.value)?;
        let gids = parse_ids(proxy_gid.field(), &proxy_gid.value)?;
        let backend = backend(r)?;
        let force_iptables_binary = {
            let f = v(&FORCE_IPTABLES_BINARY);
            Variant::parse(f.field(), &f.value)?
        };
        let groups_exclude = groups_exclude(r)?;
        let config = capture_config(r, &uids, &gids, groups_exclude)?;
        let dry_run_format = dry_run_format(r)?;
        let path = |k: &Flag| {
            let p = v(k).value.trim();
            (!p.is_empty()).then(|| PathBuf::from(p))
        };
        let mut s = Settings {
            // Replaced below, once every flag is typed (so a bad flag is named first).
            config: ValidConfig::istio_sidecar_default(),
            proxy_uid_from_user: uids.is_empty(),
            proxy_gid_from_uid: gids.is_empty(),
            envoy_user: v(&ENVOY_USER).value.clone(),
            redirect_dns: boolean(v(&REDIRECT_DNS))?,
            capture_all_dns: boolean(v(&CAPTURE_ALL_DNS))?,
            dual_stack: boolean(v(&DUAL_STACK))?,
            dry_run: boolean(v(&DRY_RUN))?,
            dry_run_format,
            dry_run_file: path(&DRY_RUN_FILE_PATH),
            skip_rule_apply: boolean(v(&SKIP_RULE_APPLY))?,
            run_validation: boolean(v(&RUN_VALIDATION))?,
            cleanup_only: boolean(v(&CLEANUP_ONLY))?,
            reconcile: boolean(v(&RECONCILE))?,
            force_apply: boolean(v(&FORCE_APPLY))?,
            backend,
            force_iptables_binary,
            network_namespace: path(&NETWORK_NAMESPACE),
            probe_port: port(v(&IPTABLES_PROBE_PORT))?,
            probe_timeout: duration(v(&PROBE_TIMEOUT))?,
        };
        boolean(v(&CNI_MODE))?;
        s.config = config.validated().map_err(|e| name_the_flag(e, r))?;
        Ok(s)
    }

    /// Fill in what Istio derives (§1.3) and validate the whole: the proxy UID from
    /// `ENVOY_USER`, IPv6 from the pod's address, DNS servers from resolv.conf. Returns the
    /// warnings to log.
    pub fn finish(
        &mut self,
        host: &HostAddress,
        user_uid: Option<u32>,
        nameservers: &[IpAddr],
    ) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        let mut config = std::mem::replace(&mut self.config, ValidConfig::istio_sidecar_default());
        if self.proxy_uid_from_user {
            let uid = user_uid.unwrap_or_else(|| {
                warnings.push(format!(
                    "ENVOY_USER {:?} is not a user here: using proxy UID {DEFAULT_PROXY_UID}",
                    self.envoy_user
                ));
                DEFAULT_PROXY_UID
            });
            let gids = if self.proxy_gid_from_uid {
                vec![uid]
            } else {
                config.proxy_gids.clone()
            };
            config = config.with_proxy_ids(vec![uid], gids)?;
        }
        let dns = DnsCapture::from_istio(self.redirect_dns, self.capture_all_dns, nameservers);
        self.config = config.with_ipv6(host.ipv6).with_dns(dns);
        if self.redirect_dns && !self.config.dns.effective() {
            warnings.push(
                "--redirect-dns is set but /etc/resolv.conf has no nameserver and --capture-all-dns is off: DNS is not captured (as with Istio)".into(),
            );
        }
        warnings.extend(
            crate::quirks::warnings(&self.config)
                .into_iter()
                .map(|q| format!("{} (quirk {})", q.message, q.id)),
        );
        Ok(warnings)
    }

    /// The probe Istio's validation runs for these settings.
    pub fn probe_spec(&self, ipv6: bool) -> ProbeSpec {
        ProbeSpec {
            envoy_port: self.config.envoy_port,
            inbound_capture_port: self.config.inbound_capture_port,
            probe_port: self.probe_port,
            ipv6,
            timeout: self.probe_timeout,
            ..ProbeSpec::istio_default()
        }
    }

    /// The UID of `ENVOY_USER`, looked up only when `-u` was empty (NSS may consult slow
    /// sources for a user that is not there).
    pub fn envoy_user_uid(&self) -> Option<u32> {
        self.proxy_uid_from_user
            .then(|| pod_facts::uid_of_user(&self.envoy_user))
            .flatten()
    }

    /// The resolv.conf whose servers DNS capture needs, if any.
    pub fn wants_nameservers(&self) -> bool {
        self.redirect_dns && !self.capture_all_dns
    }
}

/// Read the system's view for `finish`: the ENVOY_USER account and resolv.conf's servers.
pub fn system_facts(s: &Settings) -> crate::Result<(Option<u32>, Vec<IpAddr>, Vec<String>)> {
    let uid = s.envoy_user_uid();
    if !s.wants_nameservers() {
        return Ok((uid, Vec::new(), Vec::new()));
    }
    let ns = pod_facts::read_resolv_conf(std::path::Path::new("/etc/resolv.conf"))?;
    let ignored = ns
        .ignored
        .iter()
        .map(|l| format!("/etc/resolv.conf: ignored {l:?}: not an IP address"))
        .collect();
    Ok((uid, ns.servers, ignored))
}

/// The config's own field names, as the flag or variable that set them.
const CORE_FIELDS: &[(&str, &Flag)] = &[
    ("envoy_port", &ENVOY_PORT),
    ("inbound_capture_port", &INBOUND_CAPTURE_PORT),
    ("inbound_tunnel_port", &INBOUND_TUNNEL_PORT),
    ("proxy_uids", &PROXY_UID),
    ("proxy_gids", &PROXY_GID),
    ("tproxy_mark", &ISTIO_INBOUND_TPROXY_MARK),
    ("tproxy_route_table", &ISTIO_INBOUND_TPROXY_ROUTE_TABLE),
    ("owner_groups_include", &ISTIO_OUTBOUND_OWNER_GROUPS),
    ("owner_groups", &ISTIO_OUTBOUND_OWNER_GROUPS),
    ("ipv4_loopback_cidr", &ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR),
    ("exclude_interfaces", &ISTIO_EXCLUDE_INTERFACES),
    ("reroute_interfaces", &KUBE_VIRT_INTERFACES),
    ("bypass_uids", &BYPASS_UIDS),
    ("bypass_gids", &BYPASS_GIDS),
];

/// `--backend`, checked against `--native-nftables`.
fn backend(r: &Resolved) -> Result<Backend> {
    let native_requested = boolean(r.get(&NATIVE_NFTABLES))?;
    let f = r.get(&BACKEND);
    let backend = match f.value.trim().to_ascii_lowercase().as_str() {
        "native" | "nft" | "nftables" | "" => Backend::Native,
        "iptables" => Backend::Iptables,
        _ => {
            return Err(bad(
                f,
                "expected native (nftables over netlink) or iptables",
            ))
        }
    };
    if native_requested && backend == Backend::Iptables {
        return Err(bad(
            f,
            "--native-nftables asks for nftables: drop one of --native-nftables and --backend iptables",
        ));
    }
    Ok(backend)
}

/// `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE`: a list, or nothing; `*` is refused.
fn groups_exclude(r: &Resolved) -> Result<Vec<GroupRef>> {
    let f = r.get(&ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE);
    match parse_groups(f.field(), &f.value) {
        Ok(Selection::List(l)) => Ok(l),
        Ok(Selection::All) => Err(bad(f, "\"*\" is not allowed in the exclude list: to capture no group's traffic, leave outbound capture off")),
        // Empty: nothing excluded.
        Err(_) if f.value.trim().is_empty() => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The capture config the flags describe, before `finish` derives what Istio derives in the
/// pod (the proxy IDs are placeholders until ENVOY_USER is resolved).
fn capture_config(
    r: &Resolved,
    uids: &[u32],
    gids: &[u32],
    owner_groups_exclude: Vec<GroupRef>,
) -> Result<CaptureConfig> {
    let v = |k: &Flag| r.get(k);
    let uid_list = if uids.is_empty() {
        vec![DEFAULT_PROXY_UID]
    } else {
        uids.to_vec()
    };
    Ok(CaptureConfig {
        envoy_port: port(v(&ENVOY_PORT))?,
        inbound_capture_port: port(v(&INBOUND_CAPTURE_PORT))?,
        inbound_tunnel_port: port(v(&INBOUND_TUNNEL_PORT))?,
        proxy_uids: uid_list.clone(),
        proxy_gids: if gids.is_empty() {
            uid_list
        } else {
            gids.to_vec()
        },
        mode: {
            let f = v(&ISTIO_INBOUND_INTERCEPTION_MODE);
            InterceptionMode::parse(f.field(), &f.value)?
        },
        inbound_ports: typed(v(&ISTIO_INBOUND_PORTS), parse_port_selection)?,
        inbound_exclude_ports: typed(v(&ISTIO_LOCAL_EXCLUDE_PORTS), parse_ports)?,
        outbound_include_cidrs: typed(v(&ISTIO_SERVICE_CIDR), parse_cidr_selection)?,
        outbound_exclude_cidrs: typed(v(&ISTIO_SERVICE_EXCLUDE_CIDR), parse_cidrs)?,
        outbound_include_ports: typed(v(&ISTIO_OUTBOUND_PORTS), parse_ports)?,
        outbound_exclude_ports: typed(v(&ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE), parse_ports)?,
        exclude_interfaces: typed(v(&ISTIO_EXCLUDE_INTERFACES), parse_interfaces)?,
        reroute_interfaces: typed(v(&KUBE_VIRT_INTERFACES), parse_interfaces)?,
        tproxy_mark: number(v(&ISTIO_INBOUND_TPROXY_MARK))?,
        tproxy_route_table: number(v(&ISTIO_INBOUND_TPROXY_ROUTE_TABLE))?,
        dns: DnsCapture::Off,
        drop_invalid: boolean(v(&DROP_INVALID))?,
        owner_groups_include: typed(v(&ISTIO_OUTBOUND_OWNER_GROUPS), parse_groups)?,
        owner_groups_exclude,
        ipv4_loopback_cidr: typed(v(&ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR), parse_loopback_cidr)?,
        ipv6: false,
        bypass_uids: typed(v(&BYPASS_UIDS), parse_ids)?,
        bypass_gids: typed(v(&BYPASS_GIDS), parse_ids)?,
        // The node agent exports counters; an init container has no one to read them.
        counters: false,
    })
}

/// `--dry-run-format`.
fn dry_run_format(r: &Resolved) -> Result<DryRunFormat> {
    let f = r.get(&DRY_RUN_FORMAT);
    match f.value.trim().to_ascii_lowercase().as_str() {
        "nft" | "" => Ok(DryRunFormat::Nft),
        "iptables" => Ok(DryRunFormat::Iptables),
        "json" => Ok(DryRunFormat::Json),
        _ => Err(bad(f, "expected nft, iptables or json")),
    }
}

fn name_the_flag(e: Error, r: &Resolved) -> Error {
    let flag = |field: &'static str| {
        CORE_FIELDS
            .iter()
            .find(|(core, _)| *core == field)
            .map(|(_, key)| r.get(key).field())
            .unwrap_or(field)
    };
    match e {
        Error::Config {
            field,
            value,
            expected,
        } => Error::Config {
            field: flag(field),
            value,
            expected,
        },
        Error::BypassConflict { field, kind, id } => Error::BypassConflict {
            field: flag(field),
            kind,
            id,
        },
    }
}

fn bad(v: &Value, expected: &str) -> Error {
    Error::Config {
        field: v.field(),
        value: v.value.clone(),
        expected: expected.to_string(),
    }
}

fn typed<T>(v: &Value, parse: fn(&'static str, &str) -> Result<T>) -> Result<T> {
    parse(v.field(), &v.value)
}

fn port(v: &Value) -> Result<u16> {
    match v.value.trim().parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(bad(v, "expected a port from 1 to 65535")),
    }
}

fn number(v: &Value) -> Result<u32> {
    v.value
        .trim()
        .parse::<u32>()
        .map_err(|_| bad(v, "expected a number from 0 to 4294967295"))
}

/// Go's strconv.ParseBool, which Istio's flags and variables use.
pub fn boolean(v: &Value) -> Result<bool> {
    crate::go::parse_bool(v.value.trim())
        .ok_or_else(|| bad(v, "expected true or false (also 1/0, t/f)"))
}

/// A Go duration: a sequence of number+unit (`5s`, `500ms`, `1m30s`, `1.5s`); a bare number
/// is refused, as Go refuses it.
fn duration(v: &Value) -> Result<Duration> {
    parse_go_duration(v.value.trim())
        .ok_or_else(|| bad(v, "expected a duration such as 5s, 500ms or 1m30s"))
}

/// A Go duration as `time.ParseDuration` writes it: number+unit pairs (`ns`, `us`/`µs`, `ms`,
/// `s`, `m`, `h`), such as `5s`, `500ms` or `1m30s`, or a bare `0`; `None` for anything else
/// (a bare number, a sign).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|i| *i > 0)?;
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).ok()
}
