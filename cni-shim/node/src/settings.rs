//! `redirect-cni-node`'s flags. Each flag can also come from an environment variable, named
//! as Istio's install-cni names it where Istio has one (`a-b` ↔ `A_B`): a flag given on the
//! command line wins, then a non-empty variable, then the default. The core's flag-table engine
//! (`redirect_core::cli::flag_table`, also redirect-init's) parses and resolves them; this
//! file holds the table and types the values.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Command;
use redirect_core::cli::flag_table::{self, Flag, Table};
use serde_json::{Map, Value};

use super::error::{Error, Result};
use crate::adopt::AdoptIstio;
use crate::ambient::synthetic::SyntheticCheck;
use crate::ambient::AmbientSettings;
use crate::pods::Places;
use crate::repair::detect::{Action, Filter};
use crate::repair::RepairSettings;
use crate::PLUGIN_TYPE;
use redirect_core::ambient::EnablementSelectors;
use redirect_core::AmbientConfig;

use crate::adopted_forms::HandBackForm;

/// Where Kubernetes mounts a pod's service-account token and CA.
pub const DEFAULT_SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A flag and its variable (`None`: a flag only), named by its key in messages.
const fn s(
    key: &'static str,
    env: Option<&'static str>,
    default: &'static str,
    help: &'static str,
) -> Flag {
    Flag::new(key, default, help).with_env(env)
}

/// A Go bool flag and its variable.
const fn b(
    key: &'static str,
    env: &'static str,
    default: &'static str,
    help: &'static str,
) -> Flag {
    s(key, Some(env), default, help).go_bool()
}

redirect_core::cli::flags! {
    static SPECS = [
        MOUNTED_CNI_NET_DIR = s(
            "mounted-cni-net-dir",
            Some("MOUNTED_CNI_NET_DIR"),
            "/host/etc/cni/net.d",
            "The host's CNI config directory as mounted in this container",
        ),
        CNI_NET_DIR = s(
            "cni-net-dir",
            Some("CNI_NET_DIR"),
            "/etc/cni/net.d",
            "The same directory as the host sees it (used in messages)",
        ),
        CNI_BIN_DIR = s(
            "cni-bin-dir",
            Some("CNI_BIN_DIR"),
            "/host/opt/cni/bin",
            "Comma-separated host CNI bin directories (as mounted here) to copy the plugin into",
        ),
        BINARY = s(
            "binary",
            None,
            "",
            "The plugin binary to copy (default: redirect-cni beside this executable)",
        ),
        CNI_CONF_NAME = s(
            "cni-conf-name",
            Some("CNI_CONF_NAME"),
            "",
            "Chained: the config file to chain into (default: the one kubelet uses); \
             standalone: the file to write (default: redirect-cni.conf)",
        ),
        ISTIO_OWNED_CNI_CONFIG = b(
            "istio-owned-cni-config",
            "ISTIO_OWNED_CNI_CONFIG",
            "false",
            "Chained: leave the primary CNI's file alone and write our own list, named to sort \
             first, holding the primary's plugins and ours, rewritten when the primary's file \
             changes (Istio's istioOwnedCNIConfig)",
        ),
        ISTIO_OWNED_CNI_CONFIG_FILENAME = s(
            "istio-owned-cni-config-filename",
            Some("ISTIO_OWNED_CNI_CONFIG_FILENAME"),
            "",
            "The owned file's name, a .conflist that sorts before the primary's (empty: \
             ISTIO_OWNED_CNI_CONF_FILENAME, else 02-istio-cni.conflist)",
        ),
        ISTIO_OWNED_CNI_CONF_FILENAME = s(
            "istio-owned-cni-conf-filename",
            Some("ISTIO_OWNED_CNI_CONF_FILENAME"),
            "",
            "The same, under the name Istio's chart gives it in its ConfigMap",
        ),
        CNI_NETWORK_NAME = s(
            "cni-network-name",
            Some("CNI_NETWORK_NAME"),
            "istio-cni",
            "The network name in our config (its `name`): Multus finds a standalone config by \
             it when a NetworkAttachmentDefinition of that name has no config of its own; \
             Istio's, which its injector's k8s.v1.cni.cncf.io/networks annotation asks for",
        ),
        CHAINED_CNI_PLUGIN = Flag {
            flag_aliases: &["chained"],
            ..b(
                "chained-cni-plugin",
                "CHAINED_CNI_PLUGIN",
                "true",
                "Chain into the node's CNI config (false: write a standalone config, for Multus)",
            )
        },
        CNI_AGENT_RUN_DIR = s(
            "cni-agent-run-dir",
            Some("CNI_AGENT_RUN_DIR"),
            "/var/run/redirect-cni",
            "Run directory shared with the plugin (same path on the host): kubeconfig and state",
        ),
        KUBECONFIG_MODE = s(
            "kubeconfig-mode",
            Some("KUBECONFIG_MODE"),
            "0600",
            "File mode of the kubeconfig, octal",
        ),
        CNI_CONF_GROUP_READ = b(
            "cni-conf-group-read",
            "CNI_CONF_GROUP_READ",
            "false",
            "Standalone config mode 0640 instead of 0600",
        ),
        KUBE_CA_FILE = s(
            "kube-ca-file",
            Some("KUBE_CA_FILE"),
            "",
            "CA bundle for the kubeconfig (default: the service account's ca.crt)",
        ),
        SKIP_TLS_VERIFY = b(
            "skip-tls-verify",
            "SKIP_TLS_VERIFY",
            "false",
            "Write insecure-skip-tls-verify instead of the CA into the kubeconfig",
        ),
        SERVICE_ACCOUNT_DIR = s(
            "service-account-dir",
            None,
            DEFAULT_SERVICE_ACCOUNT_DIR,
            "Directory holding the service account's token and ca.crt",
        ),
        KUBERNETES_SERVICE_HOST = s(
            "kubernetes-service-host",
            Some("KUBERNETES_SERVICE_HOST"),
            "",
            "API server host for the kubeconfig",
        ),
        KUBERNETES_SERVICE_PORT = s(
            "kubernetes-service-port",
            Some("KUBERNETES_SERVICE_PORT"),
            "443",
            "API server port for the kubeconfig",
        ),
        KUBERNETES_SERVICE_PROTOCOL = s(
            "kubernetes-service-protocol",
            Some("KUBERNETES_SERVICE_PROTOCOL"),
            "https",
            "API server scheme for the kubeconfig",
        ),
        EXCLUDE_NAMESPACES = s(
            "exclude-namespaces",
            Some("EXCLUDE_NAMESPACES"),
            "",
            "Comma-separated namespaces whose pods the plugin leaves alone",
        ),
        POD_NAMESPACE = s(
            "pod-namespace",
            Some("POD_NAMESPACE"),
            "",
            "This DaemonSet's namespace (the plugin leaves its pods alone)",
        ),
        PLUGIN_LOG_LEVEL = s(
            "plugin-log-level",
            Some("PLUGIN_LOG_LEVEL"),
            "info",
            "The plugin's log level (log_level in its config)",
        ),
        LOG_OUTPUT_LEVEL = s(
            "log_output_level",
            Some("LOG_OUTPUT_LEVEL"),
            "info",
            "The agent's own log level: a level (debug, info, warn, error, none) or Istio's \
             scope:level list, such as default:info,ambient:debug (scopes: default, install, \
             repair, ambient, cni-agent, cni-plugin, cni); the plugin's lines forwarded to the \
             agent are scope cni-plugin",
        ),
        LOG_AS_JSON = b(
            "log_as_json",
            "LOG_AS_JSON",
            "false",
            "JSON log lines (level, time, scope, msg, fields), the agent's and the plugin's \
             (log_as_json in its entry)",
        ),
        NATIVE_NFTABLES = b(
            "native-nftables",
            "NATIVE_NFTABLES",
            "false",
            "Istio's global.nativeNftables: written into the plugin's entry (native_nftables) as \
             Istio's installer does; our rules are nftables either way",
        ),
        ENABLE_AMBIENT_DETECTION_RETRY = b(
            "enable-ambient-detection-retry",
            "ENABLE_AMBIENT_DETECTION_RETRY",
            "false",
            "Istio's ambient.enableAmbientDetectionRetry: written into the plugin's entry \
             (enable_ambient_detection_retry); our plugin always fails the ADD of a pod whose \
             labels it cannot read, retrying as kube_attempts says, which is Istio's behaviour \
             with it on",
        ),
        PLUGIN_CONFIG_JSON = s(
            "plugin-config-json",
            Some("PLUGIN_CONFIG_JSON"),
            "",
            "A JSON object merged into the plugin's config entry",
        ),
        CLEANUP_ON_EXIT = b(
            "cleanup-on-exit",
            "CLEANUP_ON_EXIT",
            "true",
            "On SIGTERM/SIGINT remove everything that was installed",
        ),
        SAFE_UPGRADE = b(
            "safe-upgrade",
            "SAFE_UPGRADE",
            "true",
            "With --cleanup-on-exit: leave the plugin in place when this pod's DaemonSet still \
             runs a pod on this node (an upgrade, a restart), so pods started before the next \
             agent are captured; remove it when the DaemonSet is gone, being deleted or no \
             longer selects the node, or when that cannot be told (needs POD_NAME, and RBAC to \
             get daemonsets and nodes)",
        ),
        POD_NAME = s(
            "pod-name",
            Some("POD_NAME"),
            "",
            "This DaemonSet pod's name (the downward API's metadata.name), to find its \
             DaemonSet on a clean stop (--safe-upgrade)",
        ),
        // -- the node agent: repair controller (Istio's names, its chart's defaults), untaint, metrics
        NODE_NAME = s(
            "node-name",
            Some("NODE_NAME"),
            "",
            "This node's name (the DaemonSet sets it from spec.nodeName); the default of \
             --repair-node-name, and the node --untaint-node untaints",
        ),
        REPAIR_ENABLED = b(
            "repair-enabled",
            "REPAIR_ENABLED",
            "true",
            "Run the repair controller: act on this node's pods that started without the plugin",
        ),
        REPAIR_REPAIR_PODS = b(
            "repair-repair-pods",
            "REPAIR_REPAIR_PODS",
            "true",
            "Repair a broken pod in place: program its capture into its running network namespace \
             (needs SYS_ADMIN, SYS_PTRACE and the host's /proc); wins over delete and label",
        ),
        REPAIR_DELETE_PODS = b(
            "repair-delete-pods",
            "REPAIR_DELETE_PODS",
            "false",
            "Delete a broken pod (its controller recreates it, with the plugin); wins over label",
        ),
        REPAIR_LABEL_PODS = b(
            "repair-label-pods",
            "REPAIR_LABEL_PODS",
            "false",
            "Label a broken pod with --repair-broken-pod-label-key=--repair-broken-pod-label-value",
        ),
        REPAIR_NODE_NAME = s(
            "repair-node-name",
            Some("REPAIR_NODE_NAME"),
            "",
            "The node whose pods the repair controller watches (default: --node-name); required \
             when the controller runs",
        ),
        REPAIR_SIDECAR_ANNOTATION = s(
            "repair-sidecar-annotation",
            Some("REPAIR_SIDECAR_ANNOTATION"),
            "sidecar.istio.io/status",
            "Only pods carrying this annotation (any value) are considered; empty: every pod",
        ),
        REPAIR_INIT_CONTAINER_NAME = s(
            "repair-init-container-name",
            Some("REPAIR_INIT_CONTAINER_NAME"),
            "istio-validation",
            "The validation init container whose failure marks a broken pod; empty: any",
        ),
        REPAIR_INIT_CONTAINER_EXIT_CODE = s(
            "repair-init-container-exit-code",
            Some("REPAIR_INIT_CONTAINER_EXIT_CODE"),
            "126",
            "Its exit code that marks a broken pod; 0: any",
        ),
        REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE = s(
            "repair-init-container-termination-message",
            Some("REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE"),
            "",
            "Its termination message that marks a broken pod (compared trimmed); empty: any",
        ),
        REPAIR_BROKEN_POD_LABEL_KEY = s(
            "repair-broken-pod-label-key",
            Some("REPAIR_BROKEN_POD_LABEL_KEY"),
            "cni.istio.io/uninitialized",
            "Label mode: the label's key",
        ),
        REPAIR_BROKEN_POD_LABEL_VALUE = s(
            "repair-broken-pod-label-value",
            Some("REPAIR_BROKEN_POD_LABEL_VALUE"),
            "true",
            "Label mode: the label's value",
        ),
        REPAIR_LABEL_SELECTORS = s(
            "repair-label-selectors",
            Some("REPAIR_LABEL_SELECTORS"),
            "",
            "A Kubernetes label selector narrowing the watched pods",
        ),
        REPAIR_FIELD_SELECTORS = s(
            "repair-field-selectors",
            Some("REPAIR_FIELD_SELECTORS"),
            "",
            "A field selector narrowing the watched pods, joined with spec.nodeName=<node>",
        ),
        REPAIR_MAX_ATTEMPTS = s(
            "repair-max-attempts",
            Some("REPAIR_MAX_ATTEMPTS"),
            "5",
            "Attempts per pod before the controller gives up until the pod changes again (1 to 100)",
        ),
        HAND_BACK_FORM = s(
            "hand-back-form",
            Some("HAND_BACK_FORM"),
            "as-adopted",
            "For `redirect-cni-node hand-back`: the form of Istio's rules each pod is handed back \
             in: as-adopted (each pod in the form it held when the agent adopted it; the others \
             in the form most adopted pods held, else iptables-nft), iptables-nft (Istio's \
             default: its ISTIO_* chains as iptables-nft keeps them) or nftables (Istio's native \
             tables)",
        ),
        HAND_BACK_ON_UNINSTALL = s(
            "hand-back-on-uninstall",
            Some("HAND_BACK_ON_UNINSTALL"),
            "off",
            "At an uninstall (told apart from an upgrade as --safe-upgrade does), before our \
             entry is removed: off, as-adopted, iptables-nft or nftables (every pod of the node we \
             capture handed back to Istio in place, in that form of Istio's own rules for it, as \
             `redirect-cni-node hand-back` does)",
        ),
        ADOPT_ISTIO = s(
            "adopt-istio",
            Some("ADOPT_ISTIO"),
            "replace",
            "Pods on this node that hold Istio's capture rules (a node switched from istio-cni): \
             replace (ours applied in place from the pod's annotations, then Istio's removed; no \
             restart), keep (left capturing with Istio's rules, shown in the node view), or off \
             (not looked for)",
        ),
        REPAIR_HOST_PROC = s(
            "repair-host-proc",
            Some("REPAIR_HOST_PROC"),
            "/host/proc",
            "The host's /proc as mounted here, searched for the pod's processes (repair mode)",
        ),
        REPAIR_NETNS_DIR = s(
            "repair-netns-dir",
            Some("REPAIR_NETNS_DIR"),
            "/var/run/netns",
            "Pinned network namespaces, searched when no process of the pod is found (repair mode)",
        ),
        UNTAINT_NODE = b(
            "untaint-node",
            "UNTAINT_NODE",
            "false",
            "Once the plugin is installed, remove --untaint-taint-key from this node's taints",
        ),
        UNTAINT_TAINT_KEY = s(
            "untaint-taint-key",
            Some("UNTAINT_TAINT_KEY"),
            "cni.istio.io/not-ready",
            "The taint --untaint-node removes (every effect of that key)",
        ),
        AMBIENT_ENABLED = b(
            "ambient-enabled",
            "AMBIENT_ENABLED",
            "false",
            "Ambient mode: enroll this node's ambient pods (labelled, or in a namespace labelled, \
             istio.io/dataplane-mode=ambient) and hand them to ztunnel over ZDS",
        ),
        AMBIENT_ENABLEMENT_SELECTOR = s(
            "ambient-enablement-selector",
            Some("AMBIENT_ENABLEMENT_SELECTOR"),
            "",
            "Ambient: which pods are enrolled, as Istio's ambient.enablementSelectors (YAML or \
             JSON: a list of terms, each a podSelector and a namespaceSelector with matchLabels \
             and matchExpressions; a pod is enrolled when any term matches it and its \
             namespace); empty: Istio's default (the pod labelled \
             istio.io/dataplane-mode=ambient, or in a namespace so labelled unless the pod says \
             none); [] enrolls none",
        ),
        AMBIENT_DNS_CAPTURE = b(
            "ambient-dns-capture",
            "AMBIENT_DNS_CAPTURE",
            "true",
            "Ambient: send enrolled pods' DNS to ztunnel's proxy (15053); a pod's \
             ambient.istio.io/dns-capture annotation wins",
        ),
        AMBIENT_IPV6 = b(
            "ambient-ipv6",
            "AMBIENT_IPV6",
            "true",
            "Ambient: IPv6 in-pod rules, routes and probe SNAT too",
        ),
        AMBIENT_RECONCILE_POD_RULES_ON_STARTUP = b(
            "ambient-reconcile-pod-rules-on-startup",
            "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP",
            "true",
            "Ambient: at start, program again the in-pod rules of enrolled pods whose rules \
             differ from this agent's (false: leave them, as an older agent wrote them)",
        ),
        AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE = b(
            "ambient-enable-aws-branch-eni-probe",
            "AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE",
            "true",
            "Ambient: on a node with net.ipv4.tcp_early_demux=0 (EKS Security Groups for Pods), \
             ip rules that let kubelet's probes reach enrolled pods behind an AWS branch ENI",
        ),
        CAPTURE_COUNTERS = s(
            "capture-counters",
            Some("CAPTURE_COUNTERS"),
            "off",
            "Counters on the capture rules of every pod set up from now on (the plugin's \
             `counters` for sidecar pods, ambient's in-pod rules), exported on the metrics port \
             per path (inbound and outbound captured, bypassed, excluded): off, node (summed \
             over the node's pods) or pod (per pod: the metrics port then names every pod)",
        ),
        CAPTURE_COUNTERS_INTERVAL = s(
            "capture-counters-interval",
            Some("CAPTURE_COUNTERS_INTERVAL"),
            "15s",
            "With CAPTURE_COUNTERS: how often the sidecar pods' counters are read (ambient pods' \
             at each ambient pass); 1s to 1h",
        ),
        AMBIENT_CHECK_LISTENERS = b(
            "ambient-check-listeners",
            "AMBIENT_CHECK_LISTENERS",
            "true",
            "Ambient: each pass, read the sockets listening in every enrolled pod (sock_diag): a \
             pod whose ztunnel listeners (15001, 15006, 15008, and 15053 with DNS capture) are \
             missing is pending, and its add is sent to ztunnel again with backoff",
        ),
        AMBIENT_SYNTHETIC_CHECK = s(
            "ambient-synthetic-check",
            Some("AMBIENT_SYNTHETIC_CHECK"),
            "off",
            "Ambient: each pass, a synthetic connection in one pod's namespace to 192.0.2.1:9 \
             (or [2001:db8::1]:9), proved over sock_diag to land on ztunnel's 15001: off, \
             rotate (one enabled pod each pass, in turn) or <namespace>/<name> (that pod); \
             observational, a pod's state is not changed",
        ),
        AMBIENT_RECONCILE_INTERVAL = s(
            "ambient-reconcile-interval",
            Some("AMBIENT_RECONCILE_INTERVAL"),
            "5s",
            "Ambient: how often the agent reads back every enrolled pod's rules, the host's \
             probe table and what ztunnel acked, and puts right what differs (besides every \
             change it sees); 1s to 1h",
        ),
        ZTUNNEL_UDS_ADDRESS = s(
            "ztunnel-uds-address",
            Some("ZTUNNEL_UDS_ADDRESS"),
            "/var/run/ztunnel/ztunnel.sock",
            "Ambient: the ZDS socket ztunnel connects to (its folder must not be writable by \
             group or others)",
        ),
        HOST_PROBE_SNAT_IP = s(
            "host-probe-snat-ip",
            Some("HOST_PROBE_SNAT_IP"),
            "169.254.7.127",
            "Ambient: the source kubelet's probes to enrolled pods are SNATed to (IPv4)",
        ),
        HOST_PROBE_SNAT_IPV6 = s(
            "host-probe-snat-ipv6",
            Some("HOST_PROBE_SNAT_IPV6"),
            "fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
            "Ambient: the same for IPv6",
        ),
        MONITORING_PORT = s(
            "monitoring-port",
            Some("MONITORING_PORT"),
            "15014",
            "Port of the agent's HTTP endpoints: /metrics (Prometheus), /healthz, /readyz; 0: none",
        ),
    ];
}

/// Everything `redirect-cni-node` was told.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `MOUNTED_CNI_NET_DIR`: the host's CNI config directory as mounted here.
    pub mounted_cni_net_dir: PathBuf,
    /// `CNI_NET_DIR`: the same directory as the host sees it; only logged.
    pub cni_net_dir: PathBuf,
    /// `CNI_BIN_DIR`: the host's CNI bin directories (as mounted here) the plugin is copied into.
    pub cni_bin_dirs: Vec<PathBuf>,
    /// `None`: `redirect-cni` beside this executable.
    pub binary: Option<PathBuf>,
    /// `CNI_CONF_NAME`: chained, the file to chain into (`None`: the one kubelet uses);
    /// standalone, the file to write (`None`: `redirect-cni.conf`).
    pub cni_conf_name: Option<String>,
    /// The `name` of our config: the network's name for a standalone config (Multus).
    pub cni_network_name: String,
    /// `CHAINED_CNI_PLUGIN`: chain into the node's CNI config; `false`: write a standalone one.
    pub chained: bool,
    /// Chained with `ISTIO_OWNED_CNI_CONFIG`: the name of our own list file.
    pub owned_conf_name: Option<String>,
    /// `CNI_AGENT_RUN_DIR`: the run directory shared with the plugin (kubeconfig, status file,
    /// sockets, install record), at the same path on the host.
    pub cni_agent_run_dir: PathBuf,
    /// `KUBECONFIG_MODE`: the kubeconfig's file mode.
    pub kubeconfig_mode: u32,
    /// `CNI_CONF_GROUP_READ`: the standalone config gets mode 0640 instead of 0600.
    pub cni_conf_group_read: bool,
    /// `KUBE_CA_FILE`: the CA bundle to trust; `None`: the service account's `ca.crt`.
    pub kube_ca_file: Option<PathBuf>,
    /// `SKIP_TLS_VERIFY`: the API server's certificate is not verified (neither by the
    /// kubeconfig nor by the agent's client).
    pub skip_tls_verify: bool,
    /// `--service-account-dir`: where the service account's `token` and `ca.crt` are.
    pub service_account_dir: PathBuf,
    /// `KUBERNETES_SERVICE_HOST`: the API server's host; `None` when not given.
    pub kubernetes_service_host: Option<String>,
    /// `KUBERNETES_SERVICE_PORT`: the API server's port.
    pub kubernetes_service_port: String,
    /// `KUBERNETES_SERVICE_PROTOCOL`: the API server's scheme (`https`).
    pub kubernetes_service_protocol: String,
    /// `EXCLUDE_NAMESPACES`: namespaces whose pods the plugin leaves alone.
    pub exclude_namespaces: Vec<String>,
    /// `POD_NAMESPACE`: this DaemonSet's namespace; the plugin leaves its pods alone, and
    /// `--safe-upgrade` reads this pod and its DaemonSet there. Empty when not given.
    pub pod_namespace: String,
    /// `PLUGIN_LOG_LEVEL`: the plugin's log level (`log_level` in its entry).
    pub plugin_log_level: String,
    /// `LOG_OUTPUT_LEVEL`: the agent's own levels, by scope.
    pub log_levels: redirect_program::logging::ScopeLevels,
    /// `LOG_AS_JSON`: JSON log lines, the agent's and the plugin's.
    pub log_as_json: bool,
    /// `NATIVE_NFTABLES` and `ENABLE_AMBIENT_DETECTION_RETRY`: Istio's plugin fields, written
    /// into the entry when true.
    pub istio_fields: (bool, bool),
    /// Extra fields for the plugin's entry (`--plugin-config-json`).
    pub plugin_config: Map<String, Value>,
    /// `CLEANUP_ON_EXIT`: on a clean stop, remove what was installed.
    pub cleanup_on_exit: bool,
    /// `--safe-upgrade`: keep the plugin for the next agent when the DaemonSet stays.
    pub safe_upgrade: bool,
    /// `HAND_BACK_ON_UNINSTALL`: the form the node's pods are handed back to Istio in at an
    /// uninstall; `None` for off.
    pub hand_back_on_uninstall: Option<HandBackForm>,
    /// `HAND_BACK_FORM`: the form `redirect-cni-node hand-back` writes.
    pub hand_back_form: HandBackForm,
    /// This pod (`POD_NAME`); empty when not given.
    pub pod_name: String,
    /// This node (`NODE_NAME`); empty when not given.
    pub node_name: String,
    /// The repair controller (`REPAIR_*`).
    pub repair: RepairSettings,
    /// `--untaint-node`: the taint key to remove once installed.
    pub untaint: Option<String>,
    /// The agent's HTTP port; 0: no endpoints.
    pub monitoring_port: u16,
    /// `CAPTURE_COUNTERS`: counters on the capture rules, exported per path (and pod).
    pub capture_counters: crate::telemetry::capture_counts::CountersMode,
    /// `CAPTURE_COUNTERS_INTERVAL`: how often the sidecar pods' counters are read.
    pub capture_counters_interval: Duration,
    /// Ambient mode (`AMBIENT_ENABLED` and the rest).
    pub ambient: AmbientSettings,
}

impl Default for Settings {
    /// The defaults of every flag, as with no flag and no variable.
    fn default() -> Self {
        match parse(Vec::<OsString>::new(), &|_| None) {
            Ok(Parsed::Run(s)) => *s,
            _ => unreachable!("the defaults parse"),
        }
    }
}

impl Settings {
    /// The node the agent runs on: `NODE_NAME`, else `REPAIR_NODE_NAME` (which defaults to it).
    pub fn node(&self) -> &str {
        if self.node_name.is_empty() {
            &self.repair.node_name
        } else {
            &self.node_name
        }
    }

    /// What the node agent needs beyond the installer: a node name when the repair controller
    /// runs or the node is to be untainted. Istio would watch unscheduled pods instead.
    pub fn check_agent(&self) -> Result<()> {
        let needs_node = |setting: &'static str, what: &str| Error::InvalidSetting {
            setting,
            value: String::new(),
            reason: format!(
                "{what} needs this node's name: set NODE_NAME or REPAIR_NODE_NAME from the \
                 pod's spec.nodeName (a fieldRef in the DaemonSet), or pass --node-name"
            ),
        };
        if self.repair.enabled && self.repair.node_name.is_empty() {
            return Err(needs_node(
                "REPAIR_NODE_NAME",
                "the repair controller (REPAIR_ENABLED=true, the default)",
            ));
        }

        if self.untaint.is_some() && self.node_name.is_empty() && self.repair.node_name.is_empty() {
            return Err(needs_node("NODE_NAME", "--untaint-node"));
        }
        if self.ambient.enabled && self.node().is_empty() {
            return Err(needs_node(
                "NODE_NAME",
                "ambient mode (AMBIENT_ENABLED=true)",
            ));
        }
        Ok(())
    }

    /// The standalone config's mode: 0600, or 0640 with `CNI_CONF_GROUP_READ`.
    pub fn standalone_conf_mode(&self) -> u32 {
        if self.cni_conf_group_read {
            0o640
        } else {
            0o600
        }
    }

    /// The standalone config's file name.
    pub fn standalone_conf_name(&self) -> &str {
        self.cni_conf_name.as_deref().unwrap_or("redirect-cni.conf")
    }

    /// Where the kubeconfig goes (the same path inside this container and on the host).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.cni_agent_run_dir.join("redirect-cni-kubeconfig")
    }

    /// Where the record of what was changed goes (to undo it exactly, also after a restart).
    pub fn state_path(&self) -> PathBuf {
        self.cni_agent_run_dir
            .join("redirect-cni-install-state.json")
    }

    pub(crate) fn token_path(&self) -> PathBuf {
        self.service_account_dir.join("token")
    }

    /// The CA bundle the kubeconfig and the agent's client trust: `KUBE_CA_FILE`, else the
    /// service account's `ca.crt`; `None` with `SKIP_TLS_VERIFY`.
    pub fn ca_path(&self) -> Option<PathBuf> {
        if self.skip_tls_verify {
            None
        } else {
            Some(
                self.kube_ca_file
                    .clone()
                    .unwrap_or_else(|| self.service_account_dir.join("ca.crt")),
            )
        }
    }
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    /// Run with these settings.
    Run(Box<Settings>),
    /// `--help` or `--version`: print this on stdout and exit 0.
    Info(String),
}

/// The installer's help shows each default; it has no ignored flags, and keeps clap's own
/// message for an argument that is not UTF-8.
const TABLE: Table = Table {
    flags: SPECS,
    show_defaults: true,
    ignored: &[],
    name_non_utf8: false,
};

/// The clap command (for `--help`).
pub fn command() -> Command {
    TABLE.command(
        "redirect-cni-node",
        "Installs the redirect-cni plugin on this node (binary, CNI config, kubeconfig), \
         keeps it installed, and removes exactly what it added on SIGTERM",
    )
}

/// Resolve every setting from the arguments following `install` and an environment lookup.
///
/// Leading words up to and including `install` are skipped, so the command line of earlier
/// manifests (`redirect-cni install --flag ...`, which runs this binary) works as well.
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Parsed> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    if let Some(i) = args
        .iter()
        .take_while(|a| !a.to_string_lossy().starts_with('-'))
        .position(|a| a == "install")
    {
        args.drain(..=i);
    }
    let argv = std::iter::once(OsString::from("redirect-cni-node")).chain(args);
    match TABLE.parse(command(), argv, env) {
        Ok(flag_table::Parsed::Run(r)) => Ok(Parsed::Run(Box::new(settings(&Values(r))?))),
        Ok(flag_table::Parsed::Info(text)) => Ok(Parsed::Info(text)),
        Err(message) => Err(Error::Usage(message)),
    }
}

/// The settings, checked in the order an operator reads them: the node's folders, the files
/// written, the agent's parts. The first bad value is the error.
fn settings(v: &Values) -> Result<Settings> {
    let cni_bin_dirs = cni_bin_dirs(v)?;
    let kubeconfig_mode = kubeconfig_mode(v)?;
    let plugin_config = match v.non_empty(&PLUGIN_CONFIG_JSON) {
        None => Map::new(),
        Some(text) => {
            parse_plugin_config(&text).map_err(|reason| v.invalid(&PLUGIN_CONFIG_JSON, reason))?
        }
    };
    let plugin_log_level = v.string(&PLUGIN_LOG_LEVEL);
    if redirect_program::logging::level(&plugin_log_level).is_none() {
        let levels = redirect_program::logging::level_names(", ");
        return Err(v.invalid(&PLUGIN_LOG_LEVEL, format!("expected one of {levels}")));
    }
    let cni_conf_name = v.non_empty(&CNI_CONF_NAME);
    if let Some(name) = &cni_conf_name {
        if name.contains('/') || name == "." || name == ".." {
            let reason = "a file name inside the CNI net dir is expected, without '/'";
            return Err(v.invalid(&CNI_CONF_NAME, reason.into()));
        }
    }
    let cni_network_name = v.string(&CNI_NETWORK_NAME).trim().to_string();
    if cni_network_name.is_empty() {
        let reason = "a network name is needed, e.g. istio-cni (Istio's) or redirect-cni";
        return Err(v.invalid(&CNI_NETWORK_NAME, reason.into()));
    }
    let node_name = v.string(&NODE_NAME).trim().to_string();
    let repair = repair(v, &node_name)?;
    let untaint = untaint(v)?;
    let monitoring_port = v.number(&MONITORING_PORT, 0..=65535)? as u16;
    Ok(Settings {
        mounted_cni_net_dir: v.string(&MOUNTED_CNI_NET_DIR).into(),
        cni_net_dir: v.string(&CNI_NET_DIR).into(),
        cni_bin_dirs,
        binary: v.non_empty(&BINARY).map(PathBuf::from),
        cni_network_name,
        chained: v.boolean(&CHAINED_CNI_PLUGIN)?,
        owned_conf_name: owned_conf_name(v, cni_conf_name.as_deref())?,
        cni_conf_name,
        cni_agent_run_dir: v.string(&CNI_AGENT_RUN_DIR).into(),
        kubeconfig_mode,
        cni_conf_group_read: v.boolean(&CNI_CONF_GROUP_READ)?,
        kube_ca_file: v.non_empty(&KUBE_CA_FILE).map(PathBuf::from),
        skip_tls_verify: v.boolean(&SKIP_TLS_VERIFY)?,
        service_account_dir: v.string(&SERVICE_ACCOUNT_DIR).into(),
        kubernetes_service_host: v.non_empty(&KUBERNETES_SERVICE_HOST),
        kubernetes_service_port: v.string(&KUBERNETES_SERVICE_PORT),
        kubernetes_service_protocol: v.string(&KUBERNETES_SERVICE_PROTOCOL),
        exclude_namespaces: split_list(&v.string(&EXCLUDE_NAMESPACES)),
        pod_namespace: v.string(&POD_NAMESPACE),
        plugin_log_level,
        log_levels: redirect_program::logging::ScopeLevels::parse(&v.string(&LOG_OUTPUT_LEVEL))
            .map_err(|why| v.invalid(&LOG_OUTPUT_LEVEL, why))?,
        log_as_json: v.boolean(&LOG_AS_JSON)?,
        istio_fields: (
            v.boolean(&NATIVE_NFTABLES)?,
            v.boolean(&ENABLE_AMBIENT_DETECTION_RETRY)?,
        ),
        plugin_config,
        cleanup_on_exit: v.boolean(&CLEANUP_ON_EXIT)?,
        safe_upgrade: v.boolean(&SAFE_UPGRADE)?,
        hand_back_on_uninstall: hand_back_on_uninstall(v)?,
        hand_back_form: parse_form(&v.string(&HAND_BACK_FORM))
            .map_err(|why| v.invalid(&HAND_BACK_FORM, why))?,
        pod_name: v.string(&POD_NAME).trim().to_string(),
        node_name,
        repair,
        untaint,
        monitoring_port,
        capture_counters: counters_mode(v)?,
        capture_counters_interval: duration(v, &CAPTURE_COUNTERS_INTERVAL)?,
        ambient: ambient(v)?,
    })
}

/// Ambient mode's settings: the chart's switches over Istio's in-pod defaults.
fn ambient(v: &Values) -> Result<AmbientSettings> {
    let ip = |key: &Flag| -> Result<std::net::IpAddr> {
        let text = v.string(key);
        text.trim()
            .parse()
            .map_err(|_| v.invalid(key, "expected an IP address".into()))
    };
    let mut base = AmbientConfig {
        dns_capture: v.boolean(&AMBIENT_DNS_CAPTURE)?,
        ipv6: v.boolean(&AMBIENT_IPV6)?,
        counters: counters_mode(v)?.on(),
        ..AmbientConfig::default()
    };
    match ip(&HOST_PROBE_SNAT_IP)? {
        std::net::IpAddr::V4(a) => base.probe_snat_v4 = a,
        _ => return Err(v.invalid(&HOST_PROBE_SNAT_IP, "expected an IPv4 address".into())),
    }
    match ip(&HOST_PROBE_SNAT_IPV6)? {
        std::net::IpAddr::V6(a) => base.probe_snat_v6 = a,
        _ => return Err(v.invalid(&HOST_PROBE_SNAT_IPV6, "expected an IPv6 address".into())),
    }
    let socket = PathBuf::from(v.string(&ZTUNNEL_UDS_ADDRESS).trim());
    if !socket.is_absolute() {
        let reason = "expected an absolute path, e.g. /var/run/ztunnel/ztunnel.sock";
        return Err(v.invalid(&ZTUNNEL_UDS_ADDRESS, reason.into()));
    }
    let reconcile_interval = duration(v, &AMBIENT_RECONCILE_INTERVAL)?;
    Ok(AmbientSettings {
        enabled: v.boolean(&AMBIENT_ENABLED)?,
        selectors: enablement_selectors(v)?,
        base,
        reconcile_on_startup: v.boolean(&AMBIENT_RECONCILE_POD_RULES_ON_STARTUP)?,
        reconcile_interval,
        ztunnel_socket: socket,
        aws_branch_eni_probe: v.boolean(&AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE)?,
        check_listeners: v.boolean(&AMBIENT_CHECK_LISTENERS)?,
        synthetic_check: SyntheticCheck::parse(&v.string(&AMBIENT_SYNTHETIC_CHECK))
            .map_err(|why| v.invalid(&AMBIENT_SYNTHETIC_CHECK, why))?,
    })
}

/// `CAPTURE_COUNTERS`'s value.
fn counters_mode(v: &Values) -> Result<crate::telemetry::capture_counts::CountersMode> {
    crate::telemetry::capture_counts::CountersMode::parse(&v.string(&CAPTURE_COUNTERS))
        .map_err(|why| v.invalid(&CAPTURE_COUNTERS, why))
}

/// A duration setting from 1 s to 1 h (`5s`, `1m`).
fn duration(v: &Values, key: &Flag) -> Result<Duration> {
    humantime::parse_duration(v.string(key).trim())
        .ok()
        .filter(|d| (Duration::from_secs(1)..=Duration::from_secs(3600)).contains(d))
        .ok_or_else(|| {
            v.invalid(
                key,
                "expected a duration from 1s to 1h, such as 5s or 1m".into(),
            )
        })
}

/// Istio's default name for the owned config file (`ISTIO_OWNED_CNI_CONFIG`).
pub const OWNED_DEFAULT_NAME: &str = "02-istio-cni.conflist";

/// `ISTIO_OWNED_CNI_CONFIG_FILENAME`'s check: a plain file name ending in `.conflist` (the
/// file is a list; a runtime would read a `.conf` as one plugin).
fn check_owned_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(
            "expected a file name in the CNI config folder, such as 02-istio-cni.conflist".into(),
        );
    }
    if !name.ends_with(".conflist") {
        return Err(
            "the owned file is a plugin list: its name must end in .conflist (e.g. \
             02-istio-cni.conflist)"
                .into(),
        );
    }
    Ok(())
}

/// The owned file's name when chained with `ISTIO_OWNED_CNI_CONFIG` (Istio ignores the setting
/// in standalone mode, and so do we); never the file `CNI_CONF_NAME` names.
fn owned_conf_name(v: &Values, conf_name: Option<&str>) -> Result<Option<String>> {
    if !v.boolean(&ISTIO_OWNED_CNI_CONFIG)? || !v.boolean(&CHAINED_CNI_PLUGIN)? {
        return Ok(None);
    }
    let (flag, name) = match (
        v.non_empty(&ISTIO_OWNED_CNI_CONFIG_FILENAME),
        v.non_empty(&ISTIO_OWNED_CNI_CONF_FILENAME),
    ) {
        (Some(name), _) => (&ISTIO_OWNED_CNI_CONFIG_FILENAME, name),
        (None, Some(name)) => (&ISTIO_OWNED_CNI_CONF_FILENAME, name),
        (None, None) => (
            &ISTIO_OWNED_CNI_CONFIG_FILENAME,
            OWNED_DEFAULT_NAME.to_string(),
        ),
    };
    let name = name.trim().to_string();
    check_owned_name(&name).map_err(|why| v.invalid(flag, why))?;
    if conf_name == Some(name.as_str()) {
        let why = format!(
            "it names the owned file of ISTIO_OWNED_CNI_CONFIG ({name}), which is ours; \
             CNI_CONF_NAME names the primary CNI's file: leave it empty or name that file"
        );
        return Err(v.invalid(&CNI_CONF_NAME, why));
    }
    Ok(Some(name))
}

/// `AMBIENT_ENABLEMENT_SELECTOR`: YAML (Istio's chart renders it with `toYaml`) or JSON, each
/// term checked as Kubernetes checks a label selector; empty: Istio's default.
fn enablement_selectors(v: &Values) -> Result<EnablementSelectors> {
    let text = v.string(&AMBIENT_ENABLEMENT_SELECTOR);
    if text.trim().is_empty() {
        return Ok(EnablementSelectors::istio_default());
    }
    yaml_serde::from_str(&text).map_err(|e| {
        v.invalid(
            &AMBIENT_ENABLEMENT_SELECTOR,
            format!(
                "{e}; expected a list of terms such as [{{podSelector: {{matchLabels: \
                 {{istio.io/dataplane-mode: ambient}}}}}}] (Istio's ambient.enablementSelectors), \
                 or leave it empty for Istio's default"
            ),
        )
    })
}

fn cni_bin_dirs(v: &Values) -> Result<Vec<PathBuf>> {
    let dirs: Vec<PathBuf> = split_list(&v.string(&CNI_BIN_DIR))
        .into_iter()
        .map(PathBuf::from)
        .collect();
    if dirs.is_empty() {
        let reason = "at least one directory is needed, e.g. /host/opt/cni/bin";
        return Err(v.invalid(&CNI_BIN_DIR, reason.into()));
    }
    Ok(dirs)
}

/// The kubeconfig's mode: octal, and giving no one but its owner (and the group, to read) the
/// service-account token it holds.
fn kubeconfig_mode(v: &Values) -> Result<u32> {
    let mode = parse_mode(&v.string(&KUBECONFIG_MODE)).ok_or_else(|| {
        v.invalid(
            &KUBECONFIG_MODE,
            "expected an octal file mode such as 0600".into(),
        )
    })?;
    if mode & KUBECONFIG_UNSAFE_BITS != 0 {
        return Err(v.invalid(&KUBECONFIG_MODE, "the kubeconfig holds the node agent's service-account token: a mode that gives other users any access, or the group write access, lets them read or replace it; use 0600 (the default) or 0640".into()));
    }
    Ok(mode)
}

/// The repair controller's settings; its node is `node_name` unless it names its own.
fn repair(v: &Values, node_name: &str) -> Result<RepairSettings> {
    Ok(RepairSettings {
        enabled: v.boolean(&REPAIR_ENABLED)?,
        action: [
            (v.boolean(&REPAIR_REPAIR_PODS)?, Action::Repair),
            (v.boolean(&REPAIR_DELETE_PODS)?, Action::Delete),
            (v.boolean(&REPAIR_LABEL_PODS)?, Action::Label),
        ]
        .into_iter()
        .find_map(|(on, action)| on.then_some(action)),
        node_name: v
            .non_empty(&REPAIR_NODE_NAME)
            .map(|n| n.trim().to_string())
            .unwrap_or_else(|| node_name.to_string()),
        filter: Filter {
            sidecar_annotation: v.string(&REPAIR_SIDECAR_ANNOTATION),
            init_container_name: v.string(&REPAIR_INIT_CONTAINER_NAME),
            exit_code: v.number(&REPAIR_INIT_CONTAINER_EXIT_CODE, 0..=255)? as i32,
            termination_message: v.string(&REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE),
        },
        label_key: v.string(&REPAIR_BROKEN_POD_LABEL_KEY),
        label_value: v.string(&REPAIR_BROKEN_POD_LABEL_VALUE),
        label_selectors: selectors(v, &REPAIR_LABEL_SELECTORS, true)?,
        field_selectors: selectors(v, &REPAIR_FIELD_SELECTORS, false)?,
        max_attempts: v.number(&REPAIR_MAX_ATTEMPTS, 1..=100)? as u32,
        adopt_istio: AdoptIstio::parse(&v.string(&ADOPT_ISTIO))
            .map_err(|why| v.invalid(&ADOPT_ISTIO, why))?,
        places: Places {
            proc: v.string(&REPAIR_HOST_PROC).into(),
            pins: v.string(&REPAIR_NETNS_DIR).into(),
        },
        adopted_forms: Some(v.string(&CNI_AGENT_RUN_DIR).into()),
    })
}

/// A repair selector, read as the node matches it (`pods::selectors`): an error names the
/// requirement that cannot be read.
fn selectors(v: &Values, key: &Flag, labels: bool) -> Result<String> {
    let text = v.string(key);
    let (l, f) = if labels {
        (text.as_str(), "")
    } else {
        ("", text.as_str())
    };
    crate::pods::selectors::PodFilter::parse(l, f).map_err(|why| v.invalid(key, why))?;
    Ok(text)
}

/// `HAND_BACK_ON_UNINSTALL`: off, or a form; only where an uninstall can be told from a
/// restart (a restart handing every pod back would undo our capture node-wide).
fn hand_back_on_uninstall(v: &Values) -> Result<Option<HandBackForm>> {
    let value = v.string(&HAND_BACK_ON_UNINSTALL);
    if value.trim() == "off" {
        return Ok(None);
    }
    let form = parse_form(&value)
        .map_err(|why| v.invalid(&HAND_BACK_ON_UNINSTALL, format!("off, or {why}")))?;
    if !v.boolean(&CLEANUP_ON_EXIT)? || !v.boolean(&SAFE_UPGRADE)? {
        let why = "it needs CLEANUP_ON_EXIT=true and SAFE_UPGRADE=true, which tell an uninstall \
                   from a restart (else every restart would hand the node back)";
        return Err(v.invalid(&HAND_BACK_ON_UNINSTALL, why.into()));
    }
    Ok(Some(form))
}

/// `HAND_BACK_FORM` (and `HAND_BACK_ON_UNINSTALL`): which of Istio's forms a pod is
/// handed back in: `as-adopted` (the form it held, `crate::adopted_forms`), `iptables-nft`
/// (Istio's default) or `nftables` (Istio ≥ 1.28 with `values.global.nativeNftables=true`).
/// iptables-legacy is named and refused: its tables can only be written by
/// `iptables-legacy-restore`, which the agent's image does not have.
pub fn parse_form(s: &str) -> Result<HandBackForm, String> {
    use redirect_core::IstioForm;
    match s.trim() {
        "as-adopted" => Ok(HandBackForm::AsAdopted),
        "iptables-nft" => Ok(HandBackForm::Fixed(IstioForm::IptablesNft)),
        "nftables" => Ok(HandBackForm::Fixed(IstioForm::Nftables)),
        "iptables-legacy" => Err("iptables-legacy cannot be written without \
             iptables-legacy-restore, which the agent's image does not have: install Istio's CNI \
             on iptables-nft (its default on nodes with nf_tables) or with \
             values.global.nativeNftables=true, and hand back with iptables-nft or nftables"
            .into()),
        _ => Err("expected as-adopted, iptables-nft or nftables".into()),
    }
}

/// The taint to remove once the plugin is in place, when untainting is on.
fn untaint(v: &Values) -> Result<Option<String>> {
    if !v.boolean(&UNTAINT_NODE)? {
        return Ok(None);
    }
    let key = v.string(&UNTAINT_TAINT_KEY);
    if key.trim().is_empty() {
        let reason = "a taint key is needed, e.g. cni.istio.io/not-ready";
        return Err(v.invalid(&UNTAINT_TAINT_KEY, reason.into()));
    }
    Ok(Some(key.trim().to_string()))
}

/// The resolved command line, read by kind; a bad value's error names the flag or the
/// variable it came from.
struct Values(flag_table::Resolved);

impl Values {
    fn string(&self, key: &Flag) -> String {
        self.0.get(key).value.clone()
    }

    fn non_empty(&self, key: &Flag) -> Option<String> {
        Some(self.string(key)).filter(|v| !v.is_empty())
    }

    fn boolean(&self, key: &Flag) -> Result<bool> {
        parse_bool(&self.string(key))
            .ok_or_else(|| self.invalid(key, "expected true or false (also 1, 0, t, f)".into()))
    }

    fn number(&self, key: &Flag, range: std::ops::RangeInclusive<i64>) -> Result<i64> {
        let (start, end) = (range.start(), range.end());
        self.string(key)
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|n| range.contains(n))
            .ok_or_else(|| {
                self.invalid(
                    key,
                    format!("expected a whole number from {start} to {end}"),
                )
            })
    }

    /// The setting's value refused for `reason`, naming where the value came from.
    fn invalid(&self, key: &Flag, reason: String) -> Error {
        let v = self.0.get(key);
        Error::InvalidSetting {
            setting: v.field(),
            value: v.value.clone(),
            reason,
        }
    }
}

/// Go's `strconv.ParseBool` (Istio's install-cni reads its booleans with it).
pub use redirect_core::cli::parse_bool;

/// Mode bits refused for the kubeconfig: any access for others, write or execute for the group.
pub const KUBECONFIG_UNSAFE_BITS: u32 = 0o037;

/// An octal mode: `0600`, `600` or `0o600`, at most 0777.
pub fn parse_mode(v: &str) -> Option<u32> {
    let digits = v.strip_prefix("0o").unwrap_or(v);
    if digits.is_empty() || digits.len() > 4 {
        return None;
    }
    u32::from_str_radix(digits, 8).ok().filter(|m| *m <= 0o777)
}

/// The items of a comma-separated list, as every program splits them.
fn split_list(v: &str) -> Vec<String> {
    redirect_core::cli::split_list(v)
        .map(String::from)
        .collect()
}

fn parse_plugin_config(text: &str) -> std::result::Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => {
            match map.get("type") {
                Some(Value::String(t)) if t == PLUGIN_TYPE => {}
                None => {}
                Some(other) => {
                    return Err(format!(
                        "\"type\" must stay {PLUGIN_TYPE:?} (got {other}); remove it"
                    ))
                }
            }
            Ok(map)
        }
        Ok(_) => Err("a JSON object such as {\"key\": \"value\"} is expected".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}
