//! istio-iptables' command line: every flag with its short name, environment variable, aliases
//! and default (docs/redirect-init.md, "Flags and environment"), resolved by `flag_table` with Istio's
//! precedence: a flag given on the command line, else the first alias variable that is set, else
//! the flag's own variable, else the default. Values stay strings here; `settings` types them.

pub use super::flag_table::{Flag, Parsed, Resolved, Source, Value};

use std::ffi::OsString;

use clap::Command;

use super::flag_table::Table;

const fn flag(
    key: &'static str,
    short: Option<char>,
    label: &'static str,
    env: Option<&'static str>,
    default: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        short,
        label,
        env,
        ..Flag::new(key, default, help)
    }
}

const fn boolean(
    key: &'static str,
    label: &'static str,
    env: &'static str,
    aliases: &'static [&'static str],
    help: &'static str,
) -> Flag {
    Flag {
        label,
        env: Some(env),
        aliases,
        boolean: true,
        ..Flag::new(key, "false", help)
    }
}

const fn env_only(key: &'static str, default: &'static str, help: &'static str) -> Flag {
    Flag {
        long: false,
        env: Some(key),
        ..Flag::new(key, default, help)
    }
}

/// Every environment variable the flags read (their own and Istio's aliases).
pub fn env_names() -> impl Iterator<Item = &'static str> {
    TABLE.env_names()
}

crate::flags! {
    /// Every setting redirect-init reads, in Istio's order, then ours.
    pub static FLAGS = [
        /// `--envoy-port` (`-p`): Envoy's outbound port, where outbound TCP is redirected (15001).
        ENVOY_PORT = flag("envoy-port", Some('p'), "--envoy-port (-p)", None, "15001", "Port to which all outbound TCP traffic is redirected (Envoy's outbound listener)"),
        /// `--inbound-capture-port` (`-z`, `INBOUND_CAPTURE_PORT`): where inbound TCP is redirected or
        /// tproxied (15006).
        INBOUND_CAPTURE_PORT = flag("inbound-capture-port", Some('z'), "--inbound-capture-port (-z)", Some("INBOUND_CAPTURE_PORT"), "15006", "Port to which all inbound TCP traffic is redirected or tproxied"),
        /// `--inbound-tunnel-port` (`-e`, `INBOUND_TUNNEL_PORT`): the HBONE port, never captured inbound
        /// (15008).
        INBOUND_TUNNEL_PORT = flag("inbound-tunnel-port", Some('e'), "--inbound-tunnel-port (-e)", Some("INBOUND_TUNNEL_PORT"), "15008", "HBONE tunnel port: never captured inbound"),
        /// `--proxy-uid` (`-u`, `PROXY_UID`): the proxy's UIDs; empty means `ENVOY_USER`'s UID.
        PROXY_UID = flag("proxy-uid", Some('u'), "--proxy-uid (-u)", Some("PROXY_UID"), "", "Comma-separated UIDs of the proxy, whose traffic is never captured (default: the UID of $ENVOY_USER, else 1337)"),
        /// `--proxy-gid` (`-g`, `PROXY_GID`): the proxy's GIDs; empty means the proxy UIDs.
        PROXY_GID = flag("proxy-gid", Some('g'), "--proxy-gid (-g)", Some("PROXY_GID"), "", "Comma-separated GIDs of the proxy (default: the proxy UIDs)"),
        /// `-m` (`ISTIO_INBOUND_INTERCEPTION_MODE`): `REDIRECT` (default) or `TPROXY`.
        ISTIO_INBOUND_INTERCEPTION_MODE = flag("istio-inbound-interception-mode", Some('m'), "--istio-inbound-interception-mode (-m)", Some("ISTIO_INBOUND_INTERCEPTION_MODE"), "", "REDIRECT (default) or TPROXY"),
        /// `-b` (`ISTIO_INBOUND_PORTS`): the inbound ports to capture, `*` for all.
        ISTIO_INBOUND_PORTS = flag("istio-inbound-ports", Some('b'), "--istio-inbound-ports (-b)", Some("ISTIO_INBOUND_PORTS"), "", "Inbound ports to capture, '*' for all; empty captures no inbound traffic"),
        /// `-d` (`ISTIO_LOCAL_EXCLUDE_PORTS`): inbound ports never captured.
        ISTIO_LOCAL_EXCLUDE_PORTS = flag("istio-local-exclude-ports", Some('d'), "--istio-local-exclude-ports (-d)", Some("ISTIO_LOCAL_EXCLUDE_PORTS"), "", "Inbound ports never captured (used with -b '*')"),
        /// `-c` (`ISTIO_EXCLUDE_INTERFACES`): interfaces on which nothing is captured.
        ISTIO_EXCLUDE_INTERFACES = flag("istio-exclude-interfaces", Some('c'), "--istio-exclude-interfaces (-c)", Some("ISTIO_EXCLUDE_INTERFACES"), "", "Interfaces on which nothing is captured"),
        /// `-i` (`ISTIO_SERVICE_CIDR`): the outbound destinations to capture, `*` for all.
        ISTIO_SERVICE_CIDR = flag("istio-service-cidr", Some('i'), "--istio-service-cidr (-i)", Some("ISTIO_SERVICE_CIDR"), "", "Outbound destinations to capture, '*' for all; empty captures none by address"),
        /// `-x` (`ISTIO_SERVICE_EXCLUDE_CIDR`): outbound destinations never captured.
        ISTIO_SERVICE_EXCLUDE_CIDR = flag("istio-service-exclude-cidr", Some('x'), "--istio-service-exclude-cidr (-x)", Some("ISTIO_SERVICE_EXCLUDE_CIDR"), "", "Outbound destinations never captured"),
        /// `-q` (`ISTIO_OUTBOUND_PORTS`): outbound TCP ports captured whatever the destination.
        ISTIO_OUTBOUND_PORTS = flag("istio-outbound-ports", Some('q'), "--istio-outbound-ports (-q)", Some("ISTIO_OUTBOUND_PORTS"), "", "Outbound TCP ports captured whatever the destination"),
        /// `-o` (`ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE`): outbound ports never captured.
        ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE = flag("istio-local-outbound-ports-exclude", Some('o'), "--istio-local-outbound-ports-exclude (-o)", Some("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"), "", "Outbound TCP and UDP ports never captured"),
        /// `-k` (`KUBE_VIRT_INTERFACES`): interfaces whose inbound traffic is treated as outbound
        /// (KubeVirt VMs).
        KUBE_VIRT_INTERFACES = flag("kube-virt-interfaces", Some('k'), "--kube-virt-interfaces (-k)", Some("KUBE_VIRT_INTERFACES"), "", "Interfaces whose inbound traffic is treated as outbound (KubeVirt VMs)"),
        /// `-t` (`ISTIO_INBOUND_TPROXY_MARK`): the TPROXY packet mark (1337).
        ISTIO_INBOUND_TPROXY_MARK = flag("istio-inbound-tproxy-mark", Some('t'), "--istio-inbound-tproxy-mark (-t)", Some("ISTIO_INBOUND_TPROXY_MARK"), "1337", "TPROXY packet mark"),
        /// `-r` (`ISTIO_INBOUND_TPROXY_ROUTE_TABLE`): the TPROXY policy-routing table (133).
        ISTIO_INBOUND_TPROXY_ROUTE_TABLE = flag("istio-inbound-tproxy-route-table", Some('r'), "--istio-inbound-tproxy-route-table (-r)", Some("ISTIO_INBOUND_TPROXY_ROUTE_TABLE"), "133", "TPROXY policy-routing table"),
        /// `--dry-run` (`-n`, `DRY_RUN`): print what would be applied, change nothing.
        DRY_RUN = Flag { short: Some('n'), ..boolean("dry-run", "--dry-run (-n)", "DRY_RUN", &[], "Print what would be applied; touch nothing") },
        /// `--iptables-probe-port` (`IPTABLES_PROBE_PORT`): the validation probe's original
        /// destination port (15002).
        IPTABLES_PROBE_PORT = flag("iptables-probe-port", None, "--iptables-probe-port", Some("IPTABLES_PROBE_PORT"), "15002", "Validation: the original destination port the probe connects to"),
        /// `--probe-timeout` (`PROBE_TIMEOUT`): the validation probe's overall timeout, a Go duration
        /// (5s).
        PROBE_TIMEOUT = flag("probe-timeout", None, "--probe-timeout", Some("PROBE_TIMEOUT"), "5s", "Validation: overall timeout (Go duration: 5s, 500ms, 1m)"),
        /// `--skip-rule-apply` (`SKIP_RULE_APPLY`): program nothing.
        SKIP_RULE_APPLY = boolean("skip-rule-apply", "--skip-rule-apply", "SKIP_RULE_APPLY", &[], "Program nothing (with --run-validation: only validate)"),
        /// `--run-validation` (`RUN_VALIDATION`): run the validation probe.
        RUN_VALIDATION = boolean("run-validation", "--run-validation", "RUN_VALIDATION", &[], "Run the validation probe; exit 126 when capture does not work"),
        /// `--redirect-dns` (`REDIRECT_DNS`, or Istio's `ISTIO_META_DNS_CAPTURE`): capture DNS to the
        /// agent.
        REDIRECT_DNS = boolean("redirect-dns", "--redirect-dns", "REDIRECT_DNS", &["ISTIO_META_DNS_CAPTURE"], "Capture DNS to the agent on port 15053"),
        /// `--capture-all-dns` (`CAPTURE_ALL_DNS`): capture all port-53 traffic, not only to the
        /// resolv.conf servers.
        CAPTURE_ALL_DNS = boolean("capture-all-dns", "--capture-all-dns", "CAPTURE_ALL_DNS", &[], "With --redirect-dns: capture all port-53 traffic, not only to resolv.conf servers"),
        /// `--drop-invalid` (`DROP_INVALID`, or Istio's `INVALID_DROP`): drop conntrack INVALID packets.
        DROP_INVALID = boolean("drop-invalid", "--drop-invalid", "DROP_INVALID", &["INVALID_DROP"], "Drop packets conntrack finds INVALID"),
        /// `--dual-stack` (`DUAL_STACK`, or Istio's `ISTIO_DUAL_STACK`): IPv6 rules when the pod has any
        /// IPv6 address.
        DUAL_STACK = boolean("dual-stack", "--dual-stack", "DUAL_STACK", &["ISTIO_DUAL_STACK"], "Program IPv6 rules when the pod has any IPv6 address"),
        /// `--network-namespace` (`NETWORK_NAMESPACE`): the namespace file to act in.
        NETWORK_NAMESPACE = flag("network-namespace", None, "--network-namespace", Some("NETWORK_NAMESPACE"), "", "Network namespace file to act in (default: this process's namespace)"),
        /// `--cni-mode` (`CNI_MODE`): accepted for compatibility; only checked to be a boolean.
        CNI_MODE = boolean("cni-mode", "--cni-mode", "CNI_MODE", &[], "Accepted for compatibility (the native backend needs no xtables lock sandbox)"),
        /// `--reconcile` (`RECONCILE`): replace rules found for another config, ours or Istio's.
        RECONCILE = boolean("reconcile", "--reconcile", "RECONCILE", &[], "Replace rules that differ from this config, ours or Istio's"),
        /// `--cleanup-only` (`CLEANUP_ONLY`): remove ours and Istio's leftovers, apply nothing.
        CLEANUP_ONLY = boolean("cleanup-only", "--cleanup-only", "CLEANUP_ONLY", &[], "Remove our rules, routes and ::6, and Istio's leftovers; apply nothing"),
        /// `--force-apply` (`FORCE_APPLY`): apply even when our rules are in place already.
        FORCE_APPLY = boolean("force-apply", "--force-apply", "FORCE_APPLY", &[], "Apply even when the rules are already in place"),
        /// `--native-nftables` (`NATIVE_NFTABLES`): accepted for compatibility; refused with
        /// `--backend iptables`.
        NATIVE_NFTABLES = boolean("native-nftables", "--native-nftables", "NATIVE_NFTABLES", &[], "Accepted for compatibility: the native netlink backend is the default"),
        /// `--force-iptables-binary` (`FORCE_IPTABLES_BINARY`): `legacy` or `nft` for the iptables
        /// backend; empty chooses as Istio does.
        FORCE_IPTABLES_BINARY = flag("force-iptables-binary", None, "--force-iptables-binary", Some("FORCE_IPTABLES_BINARY"), "", "With --backend iptables: 'legacy' or 'nft'"),
        /// Ours, `--bypass-uids` (`REDIRECT_BYPASS_UIDS`): UIDs whose outbound traffic is never captured.
        BYPASS_UIDS = flag("bypass-uids", None, "--bypass-uids", Some("REDIRECT_BYPASS_UIDS"), "", "Comma-separated UIDs whose outbound traffic, DNS included, is never captured (init containers; not the proxy's)"),
        /// Ours, `--bypass-gids` (`REDIRECT_BYPASS_GIDS`): GIDs whose outbound traffic is never captured.
        BYPASS_GIDS = flag("bypass-gids", None, "--bypass-gids", Some("REDIRECT_BYPASS_GIDS"), "", "Comma-separated GIDs whose outbound traffic, DNS included, is never captured"),
        /// Ours, `--backend` (`REDIRECT_BACKEND`): `native` (nftables over netlink) or `iptables`.
        BACKEND = flag("backend", None, "--backend", Some("REDIRECT_BACKEND"), "native", "native (nftables over netlink, no binary) or iptables (iptables-restore, for kernels without nf_tables)"),
        /// Ours, `--dry-run-format` (`DRY_RUN_FORMAT`): what `--dry-run` prints (`nft`, `iptables`,
        /// `json`).
        DRY_RUN_FORMAT = flag("dry-run-format", None, "--dry-run-format", Some("DRY_RUN_FORMAT"), "nft", "What --dry-run prints: nft (an nft -f script), iptables (iptables-restore input per family) or json"),
        /// `ISTIO_OUTBOUND_OWNER_GROUPS` (variable only): the groups whose outbound traffic is
        /// captured, `*` for all.
        ISTIO_OUTBOUND_OWNER_GROUPS = env_only("ISTIO_OUTBOUND_OWNER_GROUPS", "*", "Only these groups' outbound traffic is captured ('*' = all)"),
        /// `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE` (variable only): groups whose outbound traffic is
        /// not captured.
        ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE = env_only("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "", "These groups' outbound traffic is not captured (with owner groups '*')"),
        /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR` (variable only): the IPv4 loopback range treated as
        /// the pod itself (127.0.0.1/32).
        ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR = env_only("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/32", "The IPv4 loopback range treated as the pod itself"),
        /// `ENVOY_USER` (variable only): the proxy's account, whose UID is the default proxy UID.
        ENVOY_USER = env_only("ENVOY_USER", "istio-proxy", "The proxy's account, for the default proxy UID"),
        /// `DRY_RUN_FILE_PATH` (variable only): with `--dry-run`, also write the output there.
        DRY_RUN_FILE_PATH = env_only("DRY_RUN_FILE_PATH", "", "With --dry-run: also write the output to this file"),
    ];
}

/// Istio's logging flags, accepted (the injector passes `--log_output_level`); [`log_flags`]
/// reads `--log_as_json` and `--log_output_level`, the others are ignored.
const IGNORED_LOG_FLAGS: &[&str] = &[
    "log_output_level",
    "log_as_json",
    "log_caller",
    "log_stacktrace_level",
    "log_target",
    "log_rotate",
    "log_rotate_max_age",
    "log_rotate_max_backups",
    "log_rotate_max_size",
];

/// Istio's logging flags as given (the injector passes `--log_output_level`, and
/// `--log_as_json` with `global.logAsJson`), for the program's log lines; the other logging
/// flags stay ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogFlags {
    /// `--log_as_json`: one JSON object per line.
    pub as_json: bool,
    /// `--log_output_level`: a level or Istio's `scope:level` list.
    pub output_level: Option<String>,
}

/// [`LogFlags`] of a parse; `--log_as_json=<not a Go bool>` is an error naming it.
pub fn log_flags(r: &Resolved) -> Result<LogFlags, String> {
    let given = |name: &str| {
        r.matches
            .try_get_one::<String>(name)
            .ok()
            .flatten()
            .cloned()
    };
    let as_json = match given("log_as_json") {
        None => false,
        Some(v) => crate::go::parse_bool(&v).ok_or_else(|| {
            format!("--log_as_json={v:?}: expected true or false (or the flag alone)")
        })?,
    };
    Ok(LogFlags {
        as_json,
        output_level: given("log_output_level"),
    })
}

/// istio-iptables' help shows no defaults; its logging flags are accepted and ignored.
const TABLE: Table = Table {
    flags: FLAGS,
    show_defaults: false,
    ignored: IGNORED_LOG_FLAGS,
    name_non_utf8: true,
};

/// redirect-init's command: the flags in `FLAGS`.
pub fn command() -> Command {
    istio_command(
        "redirect-init",
        "Programs a pod's traffic capture for a service-mesh sidecar: a drop-in for istio-iptables",
    )
}

/// A command named `name` that takes every flag in `FLAGS` (and Istio's ignored log flags); a
/// program adds its own arguments to it and parses with [`parse_command`].
pub fn istio_command(name: &'static str, about: &'static str) -> Command {
    TABLE.command(name, about)
}

/// Resolve every setting of redirect-init from the command line and an environment lookup.
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Parsed, String> {
    parse_command(command(), args, env)
}

/// Resolve every setting of `FLAGS` with a command built by [`istio_command`].
pub fn parse_command(
    cmd: Command,
    args: impl IntoIterator<Item = OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Parsed, String> {
    TABLE.parse(cmd, args, env)
}
