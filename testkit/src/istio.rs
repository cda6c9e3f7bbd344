//! Istio's side of the parity tests: its test cases (`testdata/istio/iptables/<case>.json`), its
//! `iptables-restore` input loaded into a namespace, and a probe matrix per case.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use ipnet::{IpNet, Ipv4Net};
use serde::Serialize;
use serde_json::{Map, Value};

use super::listeners::{dedup, ListenerSpec};
use super::netns::{run_command, TestNetns};
use super::topology::{Link, Topology, TopologySpec};
use super::traffic::{From, Probe};

/// The arguments Istio's injector gives `istio-init` for the default sidecar (and, after
/// `--run-validation --skip-rule-apply`, `istio-validation`): `CaptureConfig::istio_sidecar_default`.
pub const SIDECAR_ARGS: &[&str] = &[
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
    "--log_output_level=default:info",
];

/// The GID the group name `java` resolves to while Istio's rules load (and for our side).
pub const JAVA_GID: u32 = 3001;
/// The GID the group name `ftp` resolves to while Istio's rules load (and for our side).
pub const FTP_GID: u32 = 3002;
/// The uid/gid of "the application" in the probe matrix.
pub const APP_ID: u32 = 1000;
/// A v4 address owned by nobody, used as the destination of traffic arriving on a reroute
/// interface when the case has no include CIDR of that family.
pub const FOREIGN4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 9);
/// The v6 counterpart of [`FOREIGN4`].
pub const FOREIGN6: Ipv6Addr = Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 9);

/// The GID a group name of the cases resolves to: numbers as such, `java` and `ftp` to
/// [`JAVA_GID`] and [`FTP_GID`].
pub fn group_gid(name: &str) -> Option<u32> {
    match name {
        "java" => Some(JAVA_GID),
        "ftp" => Some(FTP_GID),
        n => n.parse().ok(),
    }
}

/// `<workspace>/../shared/testdata/istio`: Istio's own test data, which lives beside the
/// repository (a user's clone has no `../shared`). When it is missing, the calling test fails
/// with one line naming the folder and the test: it never passes without the data.
pub fn istio_testdata_dir() -> PathBuf {
    // The shared folder sits beside the clone.
    let beside = crate::docs::workspace().join("..");
    let dir = beside
        .canonicalize()
        .unwrap_or(beside)
        .join("shared/testdata/istio");
    match dir.canonicalize() {
        Ok(d) if d.is_dir() => d,
        _ => panic!("{}", missing_testdata(&dir)),
    }
}

/// The one line a test that needs Istio's data fails with when the folder is missing.
pub fn missing_testdata(dir: &Path) -> String {
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string();
    format!(
        "Istio's reference data is missing: {} does not exist; test `{test}` needs it \
         (place the shared folder beside the repository)",
        dir.display()
    )
}

fn list_json(sub: &str) -> Vec<String> {
    let dir = istio_testdata_dir().join(sub);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".json").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// The `istio-iptables` cases (`iptables/*.json`), sorted.
pub fn list_cases() -> Vec<String> {
    list_json("iptables")
}

/// The istio-cni plugin cases (`cni/*.json`), sorted.
pub fn list_cni_cases() -> Vec<String> {
    list_json("cni")
}

/// One Istio test configuration. Keys are Istio's flag / env names (see the testdata's
/// `INDEX.md`); lists are parsed as Istio does (comma split, trimmed, empty items dropped), so
/// `*` stays `["*"]`. Keys missing from a file (the CNI cases have fewer) get the value of the
/// istio-iptables test base. Every key of the file is also kept in `raw`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IstioCase {
    /// The case's name: its files' stem.
    pub name: String,
    /// The folder holding `<name>.json` / `.restore` / `.restore6`.
    pub dir: PathBuf,
    /// `_set_by_case`: the keys the case itself sets; the others are the test base's.
    pub set_by_case: Vec<String>,
    /// `envoy-port`: where outbound traffic is redirected (15001).
    pub envoy_port: u16,
    /// `inbound-capture-port`: where inbound traffic is redirected (15006).
    pub inbound_capture_port: u16,
    /// `inbound-tunnel-port`: the proxy's tunnel port (15008).
    pub inbound_tunnel_port: u16,
    /// `proxy-uid`: the proxy's UIDs, whose outbound traffic is not captured (1337).
    pub proxy_uid: Vec<String>,
    /// `proxy-gid`: the proxy's GIDs; the UIDs when the case gives none.
    pub proxy_gid: Vec<String>,
    /// `istio-inbound-interception-mode`: `TPROXY`, or else REDIRECT.
    pub interception_mode: String,
    /// `istio-inbound-tproxy-mark`: the packet mark of TPROXY's policy routing (1337).
    pub tproxy_mark: u32,
    /// `istio-inbound-tproxy-route-table`: the routing table marked packets look up (133).
    pub tproxy_route_table: u32,
    /// `istio-inbound-ports`: the inbound ports captured, `*` for all.
    pub inbound_ports: Vec<String>,
    /// `istio-local-exclude-ports`: inbound ports never captured.
    pub local_exclude_ports: Vec<String>,
    /// `istio-service-cidr`: the outbound destinations captured, `*` for all.
    pub service_cidr: Vec<String>,
    /// `istio-service-exclude-cidr`: outbound destinations never captured.
    pub service_exclude_cidr: Vec<String>,
    /// `istio-outbound-ports`: outbound ports captured whatever the destination.
    pub outbound_ports: Vec<String>,
    /// `istio-local-outbound-ports-exclude`: outbound ports never captured.
    pub local_outbound_ports_exclude: Vec<String>,
    /// `kube-virt-interfaces`: interfaces whose inbound traffic is rerouted as outbound.
    pub kube_virt_interfaces: Vec<String>,
    /// `istio-exclude-interfaces`: interfaces whose traffic is never captured.
    pub exclude_interfaces: Vec<String>,
    /// `redirect-dns`: capture DNS to the agent's proxy.
    pub redirect_dns: bool,
    /// `capture-all-dns`: DNS to any server, not only [`IstioCase::dns_servers_v4`] and
    /// [`IstioCase::dns_servers_v6`].
    pub capture_all_dns: bool,
    /// `drop-invalid`: drop packets conntrack finds invalid.
    pub drop_invalid: bool,
    /// `dry-run`: Istio prints the rules instead of applying them.
    pub dry_run: bool,
    /// `ISTIO_OUTBOUND_OWNER_GROUPS`.
    pub owner_groups: Vec<String>,
    /// `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE`.
    pub owner_groups_exclude: Vec<String>,
    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`.
    pub ipv4_loopback_cidr: String,
    /// `enable-ipv6`: the case programs IPv6 too (it has a `.restore6`).
    pub enable_ipv6: bool,
    /// `dns-servers-v4`: the pod's IPv4 resolvers: without `capture-all-dns`, only DNS sent to
    /// them is captured.
    pub dns_servers_v4: Vec<Ipv4Addr>,
    /// `dns-servers-v6`: the pod's IPv6 resolvers, likewise.
    pub dns_servers_v6: Vec<Ipv6Addr>,
    /// Every key of the file, as given.
    pub raw: Map<String, Value>,
}

/// Istio's list parsing: comma split, trim, drop empty items.
pub fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(str::to_string)
        .collect()
}

impl IstioCase {
    /// Loads `iptables/<name>.json`; panics with the reason if it cannot.
    pub fn load(name: &str) -> IstioCase {
        IstioCase::load_from(&istio_testdata_dir().join("iptables"), name)
    }

    /// Loads `cni/<name>.json` (the effective istio-iptables config the CNI plugin builds).
    pub fn load_cni(name: &str) -> IstioCase {
        IstioCase::load_from(&istio_testdata_dir().join("cni"), name)
    }

    /// Loads `<dir>/<name>.json`; panics with the reason if it cannot.
    pub fn load_from(dir: &Path, name: &str) -> IstioCase {
        let path = dir.join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        IstioCase::parse(name, dir, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Parses a case file's JSON.
    pub fn parse(name: &str, dir: &Path, json: &str) -> Result<IstioCase, String> {
        let raw: Map<String, Value> =
            serde_json::from_str(json).map_err(|e| format!("not a JSON object: {e}"))?;
        let text = |key: &str, default: &str| -> Result<String, String> {
            match raw.get(key) {
                None | Some(Value::Null) => Ok(default.to_string()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(Value::Number(n)) => Ok(n.to_string()),
                Some(Value::Bool(b)) => Ok(b.to_string()),
                Some(v) => Err(format!("{key}: expected a string, got {v}")),
            }
        };
        let list = |key: &str, default: &str| text(key, default).map(|s| split_list(&s));
        let flag = |key: &str| -> Result<bool, String> {
            match raw.get(key) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(Value::String(s)) => s
                    .parse()
                    .map_err(|_| format!("{key}: expected true or false, got {s:?}")),
                Some(v) => Err(format!("{key}: expected a boolean, got {v}")),
            }
        };
        let number = |key: &str, default: &str| -> Result<u32, String> {
            let s = text(key, default)?;
            s.parse()
                .map_err(|_| format!("{key}: expected a number, got {s:?}"))
        };
        let port = |key: &str, default: &str| -> Result<u16, String> {
            let s = text(key, default)?;
            s.parse()
                .map_err(|_| format!("{key}: expected a port, got {s:?}"))
        };
        fn addrs<A: std::str::FromStr>(
            raw: &Map<String, Value>,
            key: &str,
        ) -> Result<Vec<A>, String> {
            match raw.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|v| {
                        v.as_str()
                            .and_then(|s| s.parse().ok())
                            .ok_or_else(|| format!("{key}: not an address: {v}"))
                    })
                    .collect(),
                Some(v) => Err(format!("{key}: expected an array, got {v}")),
            }
        }
        let set_by_case = match raw.get("_set_by_case") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        let proxy_uid = list("proxy-uid", "1337")?;
        let proxy_gid = match list("proxy-gid", "")? {
            g if g.is_empty() => proxy_uid.clone(),
            g => g,
        };
        Ok(IstioCase {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            set_by_case,
            envoy_port: port("envoy-port", "15001")?,
            inbound_capture_port: port("inbound-capture-port", "15006")?,
            inbound_tunnel_port: port("inbound-tunnel-port", "15008")?,
            proxy_uid,
            proxy_gid,
            interception_mode: text("istio-inbound-interception-mode", "")?,
            tproxy_mark: number("istio-inbound-tproxy-mark", "1337")?,
            tproxy_route_table: number("istio-inbound-tproxy-route-table", "133")?,
            inbound_ports: list("istio-inbound-ports", "")?,
            local_exclude_ports: list("istio-local-exclude-ports", "")?,
            service_cidr: list("istio-service-cidr", "")?,
            service_exclude_cidr: list("istio-service-exclude-cidr", "")?,
            outbound_ports: list("istio-outbound-ports", "")?,
            local_outbound_ports_exclude: list("istio-local-outbound-ports-exclude", "")?,
            kube_virt_interfaces: list("kube-virt-interfaces", "")?,
            exclude_interfaces: list("istio-exclude-interfaces", "")?,
            redirect_dns: flag("redirect-dns")?,
            capture_all_dns: flag("capture-all-dns")?,
            drop_invalid: flag("drop-invalid")?,
            dry_run: flag("dry-run")?,
            owner_groups: list("ISTIO_OUTBOUND_OWNER_GROUPS", "*")?,
            owner_groups_exclude: list("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "")?,
            ipv4_loopback_cidr: text("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/32")?,
            enable_ipv6: flag("enable-ipv6")?,
            dns_servers_v4: addrs(&raw, "dns-servers-v4")?,
            dns_servers_v6: addrs(&raw, "dns-servers-v6")?,
            raw,
        })
    }

    /// TPROXY interception (anything else behaves as REDIRECT).
    pub fn is_tproxy(&self) -> bool {
        self.interception_mode == "TPROXY"
    }

    /// Inbound capture of every port (`-b '*'`).
    pub fn inbound_all(&self) -> bool {
        self.inbound_ports.iter().any(|p| p == "*")
    }

    /// The explicit inbound port list (empty for `*` or no capture).
    pub fn inbound_port_list(&self) -> Vec<u16> {
        ports(&self.inbound_ports)
    }

    /// The local exclude ports as numbers.
    pub fn local_exclude_port_list(&self) -> Vec<u16> {
        ports(&self.local_exclude_ports)
    }

    /// The outbound include ports as numbers.
    pub fn outbound_port_list(&self) -> Vec<u16> {
        ports(&self.outbound_ports)
    }

    /// The outbound exclude ports as numbers.
    pub fn outbound_exclude_port_list(&self) -> Vec<u16> {
        ports(&self.local_outbound_ports_exclude)
    }

    /// Outbound capture of every destination (`-i '*'`).
    pub fn include_all(&self) -> bool {
        self.service_cidr.iter().any(|c| c == "*")
    }

    /// The include CIDRs (both families; empty for `*`).
    pub fn include_cidrs(&self) -> Vec<IpNet> {
        cidrs(&self.service_cidr)
    }

    /// The exclude CIDRs (both families).
    pub fn exclude_cidrs(&self) -> Vec<IpNet> {
        cidrs(&self.service_exclude_cidr)
    }

    /// The proxy UIDs as numbers (an item that is not one is left out).
    pub fn proxy_uids(&self) -> Vec<u32> {
        self.proxy_uid
            .iter()
            .filter_map(|u| u.parse().ok())
            .collect()
    }

    /// The proxy GIDs as numbers (an item that is not one is left out).
    pub fn proxy_gids(&self) -> Vec<u32> {
        self.proxy_gid
            .iter()
            .filter_map(|g| g.parse().ok())
            .collect()
    }

    /// The owner-group include list as GIDs; `None` for `*` (every group).
    pub fn owner_group_gids(&self) -> Option<Vec<u32>> {
        if self.owner_groups.iter().any(|g| g == "*") {
            return None;
        }
        Some(
            self.owner_groups
                .iter()
                .filter_map(|g| group_gid(g))
                .collect(),
        )
    }

    /// The owner-group exclude list as GIDs.
    pub fn owner_group_exclude_gids(&self) -> Vec<u32> {
        self.owner_groups_exclude
            .iter()
            .filter_map(|g| group_gid(g))
            .collect()
    }

    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR` parsed.
    pub fn loopback_cidr(&self) -> Ipv4Net {
        self.ipv4_loopback_cidr.parse().unwrap_or_else(|_| {
            panic!(
                "{}: bad loopback CIDR {:?}",
                self.name, self.ipv4_loopback_cidr
            )
        })
    }

    /// Whether DNS capture is in effect (redirect-dns and capture-all or at least one server).
    pub fn dns_effective(&self) -> bool {
        self.redirect_dns
            && (self.capture_all_dns
                || !self.dns_servers_v4.is_empty()
                || !self.dns_servers_v6.is_empty())
    }

    /// The families the case programs: v4 always, v6 when `enable-ipv6`.
    pub fn families(&self) -> Vec<bool> {
        if self.enable_ipv6 {
            vec![false, true]
        } else {
            vec![false]
        }
    }

    /// `<dir>/<name>.restore`.
    pub fn restore_path(&self) -> PathBuf {
        self.dir.join(format!("{}.restore", self.name))
    }

    /// `<dir>/<name>.restore6`.
    pub fn restore6_path(&self) -> PathBuf {
        self.dir.join(format!("{}.restore6", self.name))
    }
}

fn ports(items: &[String]) -> Vec<u16> {
    items.iter().filter_map(|p| p.parse().ok()).collect()
}

fn cidrs(items: &[String]) -> Vec<IpNet> {
    items
        .iter()
        .filter(|c| c.as_str() != "*")
        .map(|c| {
            c.parse::<IpNet>()
                .or_else(|_| c.parse::<IpAddr>().map(IpNet::from))
                .unwrap_or_else(|_| panic!("not a CIDR: {c:?}"))
        })
        .collect()
}

static GROUP_FILES: AtomicU32 = AtomicU32::new(0);

/// A copy of `/etc/group` where `java` and `ftp` resolve to [`JAVA_GID`] and [`FTP_GID`] (the
/// names Istio's owner-group cases use), to bind-mount over `/etc/group` in a private mount
/// namespace. A fresh temp file per call; the caller removes it.
pub fn group_file() -> PathBuf {
    let base = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let mut group: String = base
        .lines()
        .filter(|l| !l.starts_with("java:") && !l.starts_with("ftp:"))
        .map(|l| format!("{l}\n"))
        .collect();
    group.push_str(&format!("java:x:{JAVA_GID}:\nftp:x:{FTP_GID}:\n"));
    let n = GROUP_FILES.fetch_add(1, Ordering::Relaxed);
    let group_path = std::env::temp_dir().join(format!("rdt-group-{}-{n}", std::process::id()));
    std::fs::write(&group_path, group)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", group_path.display()));
    group_path
}

/// Runs `iptables-restore --noflush` (or `ip6tables-restore`) with `path` inside `ns`, in a
/// private mount namespace where `/etc/group` also resolves `java` and `ftp` to [`JAVA_GID`] and
/// [`FTP_GID`] (a bind-mounted copy; the real file is never touched). Panics on failure.
pub fn iptables_restore(ns: &TestNetns, v6: bool, path: &Path) {
    iptables_restore_with(ns, v6, path, None);
}

/// Like [`iptables_restore`], with the given variant's binary (`iptables-legacy-restore`,
/// `iptables-nft-restore`); `None` = the plain `iptables-restore`.
pub fn iptables_restore_with(ns: &TestNetns, v6: bool, path: &Path, variant: Option<&str>) {
    let group_path = group_file();
    let family = if v6 { "ip6tables" } else { "iptables" };
    let bin = match variant {
        Some(v) => format!("{family}-{v}-restore"),
        None => format!("{family}-restore"),
    };
    let script = format!("mount --bind \"$0\" /etc/group && exec {bin} --noflush \"$1\"");
    let result = run_command(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                ns.name(),
                "unshare",
                "-m",
                "--propagation",
                "private",
            ])
            .args(["sh", "-c", &script])
            .arg(&group_path)
            .arg(path)
            .stdin(std::process::Stdio::null()),
        None,
        &format!("in netns {}: {bin} --noflush {}", ns.name(), path.display()),
    );
    let _ = std::fs::remove_file(&group_path);
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// What `cmd` (an `iptables-save`, or `nft list ruleset`) prints in `ns`, without its comments
/// and each chain's counters: what two namespaces holding the same rules print alike.
pub fn saved(ns: &TestNetns, cmd: &str) -> String {
    ns.sh(cmd)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.find(" [") {
            Some(i) if l.starts_with(':') => l[..i].to_string(),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Loads a case as Istio would program a pod: `<case>.restore` with `iptables-restore
/// --noflush`, `<case>.restore6` with `ip6tables-restore --noflush` when `enable-ipv6`, then
/// what Istio adds outside the restore: for TPROXY with inbound ports, `ip rule add fwmark
/// <mark> lookup <table>` and `ip route add local 0.0.0.0/0 dev lo table <table>` (and the v6
/// pair when `enable-ipv6`); `::6/128` on `lo` when `enable-ipv6`.
pub fn load_istio_case(ns: &TestNetns, case: &IstioCase) {
    load_istio_case_with(ns, case, None);
}

/// Like [`load_istio_case`], loading the restore files with the given iptables variant.
pub fn load_istio_case_with(ns: &TestNetns, case: &IstioCase, variant: Option<&str>) {
    iptables_restore_with(ns, false, &case.restore_path(), variant);
    if case.enable_ipv6 {
        iptables_restore_with(ns, true, &case.restore6_path(), variant);
    }
    if case.is_tproxy() && !case.inbound_ports.is_empty() {
        let (mark, table) = (case.tproxy_mark, case.tproxy_route_table);
        ns.ip_batch(
            false,
            &[
                format!("rule add fwmark {mark} lookup {table}"),
                format!("route add local 0.0.0.0/0 dev lo table {table}"),
            ],
        );
        if case.enable_ipv6 {
            ns.ip_batch(
                true,
                &[
                    format!("rule add fwmark {mark} lookup {table}"),
                    format!("route add local ::/0 dev lo table {table}"),
                ],
            );
        }
    }
    if case.enable_ipv6 {
        ns.ip_batch(true, &["addr add ::6/128 dev lo nodad".to_string()]);
    }
}

/// Host number `n` of `net` (1 = the first host; a /32 or /128 has only itself as host 1);
/// `None` when `net` is too small.
pub fn nth_host(net: &IpNet, n: u32) -> Option<IpAddr> {
    match net {
        IpNet::V4(v4) => {
            if v4.prefix_len() == 32 {
                return (n == 1).then(|| IpAddr::V4(v4.addr()));
            }
            let size = 1u64 << (32 - v4.prefix_len());
            // Keep clear of the broadcast address.
            ((n as u64) < size - 1)
                .then(|| IpAddr::V4(Ipv4Addr::from(u32::from(v4.network()).wrapping_add(n))))
        }
        IpNet::V6(v6) => {
            if v6.prefix_len() == 128 {
                return (n == 1).then(|| IpAddr::V6(v6.addr()));
            }
            let bits = 128 - v6.prefix_len() as u32;
            (bits >= 64 || (n as u128) < (1u128 << bits)).then(|| {
                IpAddr::V6(Ipv6Addr::from(
                    u128::from(v6.network()).wrapping_add(n as u128),
                ))
            })
        }
    }
}

fn family_cidrs(nets: Vec<IpNet>, v6: bool) -> Vec<IpNet> {
    nets.into_iter()
        .filter(|n| matches!(n, IpNet::V6(_)) == v6)
        .collect()
}

/// The pod interfaces a case names besides `eth0` (reroute and exclude interfaces), in the order
/// [`case_topology`] creates them.
pub fn case_extra_ifaces(case: &IstioCase) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in case
        .kube_virt_interfaces
        .iter()
        .chain(&case.exclude_interfaces)
    {
        if i != "eth0" && !out.contains(i) {
            out.push(i.clone());
        }
    }
    out
}

fn case_link(case: &IstioCase, iface: &str) -> Link {
    match case_extra_ifaces(case).iter().position(|i| i == iface) {
        Some(p) => Link::nth(p + 1, iface),
        None => Link::nth(0, "eth0"),
    }
}

/// Outbound targets from the include and exclude CIDRs: the first host of each.
fn cidr_targets(case: &IstioCase, v6: bool) -> Vec<IpAddr> {
    let mut nets = family_cidrs(case.include_cidrs(), v6);
    nets.extend(family_cidrs(case.exclude_cidrs(), v6));
    dedup(nets.iter().filter_map(|n| nth_host(n, 1)))
}

/// The outbound target routed through exclude interface number `k` (`iface`): a host of the
/// first (non-loopback) include CIDR when there is one (so the exclusion is what keeps it
/// uncaptured), else the peer end of that link. The bool says whether the pod needs a route.
fn exclude_iface_target(case: &IstioCase, k: usize, iface: &str, v6: bool) -> (IpAddr, bool) {
    let include = family_cidrs(case.include_cidrs(), v6);
    if let Some(a) = include
        .iter()
        .filter(|n| !n.addr().is_loopback())
        .find_map(|n| nth_host(n, 2 + k as u32))
    {
        return (a, true);
    }
    (case_link(case, iface).peer_addr(v6), false)
}

/// Destinations for traffic arriving on a reroute interface: a host of each include CIDR (one
/// nobody owns), or [`FOREIGN4`] / [`FOREIGN6`].
fn virt_targets(case: &IstioCase, v6: bool) -> Vec<IpAddr> {
    let hosts: Vec<IpAddr> = family_cidrs(case.include_cidrs(), v6)
        .iter()
        .filter(|n| !n.addr().is_loopback())
        .filter_map(|n| nth_host(n, 9))
        .collect();
    if hosts.is_empty() {
        vec![if v6 { FOREIGN6.into() } else { FOREIGN4.into() }]
    } else {
        dedup(hosts)
    }
}

fn dns_servers(case: &IstioCase, v6: bool) -> Vec<IpAddr> {
    if v6 {
        case.dns_servers_v6.iter().map(|a| IpAddr::V6(*a)).collect()
    } else {
        case.dns_servers_v4.iter().map(|a| IpAddr::V4(*a)).collect()
    }
}

/// A topology for an Istio case: extra links for its reroute and exclude interfaces, the
/// peer owning the first host of each include/exclude CIDR (and a host routed through each
/// exclude interface), the case's DNS servers on the pod's `lo`, pod listeners on every port
/// the matrix probes (DNS proxy owned by the first proxy uid/gid), peer listeners on 80,
/// 15020, 53 and the outbound include/exclude ports.
pub fn case_topology(case: &IstioCase) -> Topology {
    let mut spec = TopologySpec {
        extra_ifaces: case_extra_ifaces(case),
        ..TopologySpec::default()
    };
    for v6 in [false, true] {
        spec.remote_addrs.extend(
            cidr_targets(case, v6)
                .into_iter()
                .filter(|a| !a.is_loopback()),
        );
        for (k, iface) in case.exclude_interfaces.iter().enumerate() {
            let (a, routed) = exclude_iface_target(case, k, iface, v6);
            if routed {
                spec.remote_via.push((a, iface.clone()));
            }
        }
        for s in dns_servers(case, v6) {
            let local = match s {
                IpAddr::V4(a) => a.is_loopback(),
                IpAddr::V6(a) => a.is_loopback(),
            };
            if !local {
                spec.pod_lo_addrs.push(s);
            }
        }
    }
    spec.remote_addrs = dedup(spec.remote_addrs);
    let mut app = vec![8080, case.inbound_tunnel_port];
    app.extend(case.inbound_port_list());
    app.extend(case.local_exclude_port_list());
    app.extend([15020, 15021, 15090]);
    spec.pod_listeners = ListenerSpec::pod(&app);
    spec.pod_listeners.dns_proxy_owner = Some((
        case.proxy_uids().first().copied().unwrap_or(1337),
        case.proxy_gids().first().copied().unwrap_or(1337),
    ));
    let mut peer = vec![80, 15020];
    peer.extend(case.outbound_port_list());
    peer.extend(case.outbound_exclude_port_list());
    spec.peer_listeners = ListenerSpec::peer(&peer);
    Topology::new(&spec)
}

/// A probe matrix that exercises everything `case` configures, for each of its families:
///
/// - inbound from the peer to the pod on 8080, the tunnel port, each inbound include port, each
///   local exclude port, 15020, 15021, 15090;
/// - outbound from the pod as the app (1000/1000), as each proxy uid (gid 1000), as uid 1000
///   with each proxy gid, and with each owner-group GID of the include/exclude lists, to the
///   peer on 80 and 15020, to the first host of each include/exclude CIDR, to the peer on each
///   outbound include/exclude port, and DNS (UDP and TCP 53) to each configured server and to
///   the peer;
/// - loopback: the validation path (each proxy uid, each proxy gid, and both, from 127.0.0.1 /
///   ::1 to 127.0.0.6:15002 / `[::6]:15002`), the app to 127.0.0.1:8080, to 127.0.0.6:15002 and
///   to the pod's own address, the proxy to the pod's own address, plain and from 127.0.0.6;
/// - each reroute interface: from the peer through it to an include-CIDR host (or a foreign
///   address) and to the pod address;
/// - each exclude interface: outbound to an address routed through it, inbound through it.
pub fn probe_matrix(case: &IstioCase) -> Vec<Probe> {
    let mut out = Vec::new();
    let uids = case.proxy_uids();
    let gids = case.proxy_gids();
    let (u0, g0) = (
        uids.first().copied().unwrap_or(1337),
        gids.first().copied().unwrap_or(1337),
    );
    let pod_as = |uid, gid| From::Pod { uid, gid };
    for v6 in case.families() {
        let eth0 = Link::nth(0, "eth0");
        let pod = eth0.pod_addr(v6);
        let peer = eth0.peer_addr(v6);
        let lo: IpAddr = if v6 {
            Ipv6Addr::LOCALHOST.into()
        } else {
            Ipv4Addr::LOCALHOST.into()
        };
        let six: IpAddr = if v6 {
            Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6).into()
        } else {
            Ipv4Addr::new(127, 0, 0, 6).into()
        };
        let at = |ip: IpAddr, port: u16| SocketAddr::new(ip, port);

        // Inbound.
        let mut inbound = vec![8080, case.inbound_tunnel_port];
        inbound.extend(case.inbound_port_list());
        inbound.extend(case.local_exclude_port_list());
        inbound.extend([15020, 15021, 15090]);
        for p in dedup(inbound) {
            out.push(Probe::tcp(From::Peer, at(pod, p)));
        }

        // Outbound, per identity.
        let mut ids = vec![(APP_ID, APP_ID)];
        ids.extend(uids.iter().map(|&u| (u, APP_ID)));
        ids.extend(gids.iter().map(|&g| (APP_ID, g)));
        ids.extend(
            case.owner_group_gids()
                .unwrap_or_default()
                .into_iter()
                .map(|g| (APP_ID, g)),
        );
        ids.extend(
            case.owner_group_exclude_gids()
                .into_iter()
                .map(|g| (APP_ID, g)),
        );
        let mut tcp_dsts = vec![at(peer, 80), at(peer, 15020)];
        tcp_dsts.extend(cidr_targets(case, v6).into_iter().map(|a| at(a, 80)));
        tcp_dsts.extend(case.outbound_port_list().into_iter().map(|p| at(peer, p)));
        tcp_dsts.extend(
            case.outbound_exclude_port_list()
                .into_iter()
                .map(|p| at(peer, p)),
        );
        let tcp_dsts = dedup(tcp_dsts);
        let mut dns = dns_servers(case, v6);
        dns.push(peer);
        for (uid, gid) in dedup(ids) {
            for &d in &tcp_dsts {
                out.push(Probe::tcp(pod_as(uid, gid), d));
            }
            for &s in &dns {
                out.push(Probe::udp(pod_as(uid, gid), at(s, 53)));
                out.push(Probe::tcp(pod_as(uid, gid), at(s, 53)));
            }
        }

        // Loopback.
        let validation = at(six, 15002);
        let mut validators = vec![(u0, g0)];
        validators.extend(uids.iter().map(|&u| (u, APP_ID)));
        validators.extend(gids.iter().map(|&g| (APP_ID, g)));
        for (uid, gid) in dedup(validators) {
            out.push(Probe::tcp(pod_as(uid, gid), validation).bound(lo));
        }
        let app = pod_as(APP_ID, APP_ID);
        out.push(Probe::tcp(app.clone(), at(lo, 8080)));
        out.push(Probe::tcp(app.clone(), validation).bound(lo));
        out.push(Probe::tcp(app, at(pod, 8080)));
        out.push(Probe::tcp(pod_as(u0, g0), at(pod, 8080)));
        out.push(Probe::tcp(pod_as(u0, g0), at(pod, 8080)).bound(six));

        // Reroute (virtual) interfaces.
        for iface in &case.kube_virt_interfaces {
            for a in virt_targets(case, v6) {
                out.push(Probe::tcp(From::PeerVia(iface.clone()), at(a, 80)));
            }
            out.push(Probe::tcp(From::PeerVia(iface.clone()), at(pod, 8080)));
        }

        // Exclude interfaces.
        for (k, iface) in case.exclude_interfaces.iter().enumerate() {
            let (a, _) = exclude_iface_target(case, k, iface, v6);
            out.push(Probe::tcp(pod_as(APP_ID, APP_ID), at(a, 80)));
            out.push(Probe::tcp(From::PeerVia(iface.clone()), at(pod, 8080)));
            if let Some(&p) = case.inbound_port_list().first() {
                out.push(Probe::tcp(From::PeerVia(iface.clone()), at(pod, p)));
            }
        }
    }
    dedup_probes(out)
}

fn dedup_probes(probes: Vec<Probe>) -> Vec<Probe> {
    let mut seen = BTreeSet::new();
    probes
        .into_iter()
        .filter(|p| seen.insert(p.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_like_istio() {
        assert_eq!(split_list(" 6000, 7000,,"), vec!["6000", "7000"]);
        assert!(split_list("").is_empty());
        assert_eq!(split_list("*"), vec!["*"]);
    }

    #[test]
    fn hosts() {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            nth_host(&n("9.9.0.0/16"), 1),
            Some("9.9.0.1".parse().unwrap())
        );
        assert_eq!(
            nth_host(&n("127.1.2.3/32"), 1),
            Some("127.1.2.3".parse().unwrap())
        );
        assert_eq!(nth_host(&n("127.1.2.3/32"), 2), None);
        assert_eq!(
            nth_host(&n("10.0.0.0/30"), 2),
            Some("10.0.0.2".parse().unwrap())
        );
        assert_eq!(nth_host(&n("10.0.0.0/30"), 3), None);
        assert_eq!(
            nth_host(&n("2001:db8::/32"), 1),
            Some("2001:db8::1".parse().unwrap())
        );
    }

    #[test]
    fn every_case_parses_and_has_a_matrix() {
        for name in list_cases() {
            let case = IstioCase::load(&name);
            assert!(case.restore_path().exists(), "{name}");
            assert_eq!(case.enable_ipv6, case.restore6_path().exists(), "{name}");
            let m = probe_matrix(&case);
            assert!(
                m.len() >= 10 && m.len() <= 200,
                "{name}: {} probes",
                m.len()
            );
        }
        for name in list_cni_cases() {
            IstioCase::load_cni(&name);
        }
    }
}
