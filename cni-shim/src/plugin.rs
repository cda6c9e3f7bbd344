//! The CNI commands. ADD programs a mesh pod's namespace; everything else about a pod that is
//! not in the mesh is a pass-through, so the plugin never breaks a pod it does not capture.
//!
//! The kernel side of a pod's namespace is opened through [`Invocation::kernel`]: the kernel
//! in the plugin, a fake namespace in tests, so the decisions (which pods,
//! which rules, which errors) are tested without root.

use std::path::Path;
use std::time::Duration;

use redirect_istio::capture;
use redirect_istio::mesh::{self, Decision};
use redirect_istio::pod::PodInfo;
use redirect_istio::Error as CaptureError;
use redirect_kernel::backend::{Backend, Opener};
use redirect_kernel::netns::{self, Netns};
use redirect_kernel::nft::Nft;
use redirect_kernel::Error as KernelError;
use redirect_kernel::SystemGroups;
use redirect_model::ValidConfig;
use redirect_program::logging::{self, Sink};
use tracing::level_filters::LevelFilter;
use tracing::{error, info, warn};

use crate::cni::args::{self, CniArgs};
use crate::cni::conf::{self, NetConf};
use crate::cni::result::passthrough;
use crate::cni::{code, CniError, SUPPORTED_VERSIONS};

/// The variables the runtime passes (CNI spec), checked for UTF-8 before anything runs.
pub const ENV_NAMES: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

/// Between the level and the message of every log line: the runtime's log mixes plugins.
const LOG_PREFIX: &str = "redirect-cni";

/// Log lines when the config cannot be read (so its level and file are unknown): stderr, from
/// info up. The process's subscriber (`redirect_program::logging`) is installed here or in
/// `log_as_configured`.
fn log_to_stderr() {
    logging::install(Sink::stderr(Some(LOG_PREFIX), LevelFilter::INFO));
}

/// Log lines at the config's `log_level`, to stderr and to its `log_file` when it names one.
fn log_as_configured(conf: &NetConf) {
    logging::install(Sink {
        prefix: Some(LOG_PREFIX),
        // `conf::parse` accepts only the level names.
        level: logging::level(&conf.log_level).unwrap_or(LevelFilter::INFO),
        file: conf.log_file.clone(),
    });
}

/// The process's inputs.
pub struct Invocation<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub stdin: &'a [u8],
    /// Set when one of `ENV_NAMES` is not UTF-8: read as unset, it would drop the pod's
    /// capture silently.
    pub env_error: Option<String>,
    /// How a pod's namespace is reached: `redirect_kernel::backend::open_live`.
    pub kernel: Opener<'a>,
}

/// One call, with what the runtime says of the pod read once.
struct Call<'a> {
    inv: &'a Invocation<'a>,
    command: String,
    /// The pod from CNI_ARGS: `Ok(None)` when it is not a Kubernetes pod.
    pod: Result<Option<(String, String)>, CniError>,
}

impl<'a> Call<'a> {
    fn new(inv: &'a Invocation<'a>, command: String) -> Call<'a> {
        let pod =
            args::parse(&(inv.env)("CNI_ARGS").unwrap_or_default()).map(|a: CniArgs| {
                match (a.pod_namespace, a.pod_name) {
                    (Some(ns), Some(name)) => Some((ns, name)),
                    _ => None,
                }
            });
        Call { inv, command, pod }
    }

    /// `"<namespace>/<name> "` for log lines, or nothing when the pod is not known.
    fn label(&self) -> String {
        match &self.pod {
            Ok(Some((ns, name))) => format!("{ns}/{name} "),
            _ => String::new(),
        }
    }

    fn netns_path(&self) -> String {
        (self.inv.env)("CNI_NETNS").unwrap_or_default()
    }
}

/// Runs one command: `Ok(stdout)` or a CNI error (printed as JSON, exit 1).
pub fn run(inv: &Invocation) -> Result<String, (CniError, String)> {
    let command = (inv.env)("CNI_COMMAND").unwrap_or_default();
    if command == "VERSION" {
        return Ok(version(inv.stdin));
    }
    let call = Call::new(inv, command);
    // The subscriber is installed once: after VERSION, which logs nothing, and once the
    // config says where lines go (parsing it logs nothing either); stderr alone when it is bad.
    let conf = match conf::parse(inv.stdin) {
        Ok(conf) => conf,
        Err(e) => {
            log_to_stderr();
            error!("{} {}{e}", call.command, call.label());
            return Err((e, conf::requested_version(inv.stdin)));
        }
    };
    log_as_configured(&conf);
    let result = dispatch(&call, &conf);
    if let Err(e) = &result {
        // Into the log file too: a failed ADD is what an operator looks for there.
        error!("{} {}{e}", call.command, call.label());
    }
    result.map_err(|e| (e, conf.cni_version.clone()))
}

fn dispatch(call: &Call, conf: &NetConf) -> Result<String, CniError> {
    if conf.ambient_enabled {
        warn!("ambient_enabled is set: ambient mode is not supported by redirect-cni; sidecar pods are handled as usual");
    }
    if let Some(msg) = &call.inv.env_error {
        return Err(CniError::new(
            code::INVALID_ENV,
            msg.clone(),
            "the runtime must pass the CNI variables as UTF-8",
        ));
    }
    match call.command.as_str() {
        "ADD" => add(call, conf),
        "DEL" => del(call, conf).map(|_| String::new()),
        "CHECK" => check(call, conf).map(|_| String::new()),
        "STATUS" => status(conf).map(|_| String::new()),
        "GC" => {
            info!("GC: nothing to collect: the rules live in the pod's namespace and go with it");
            Ok(String::new())
        }
        "" => Err(CniError::new(
            code::INVALID_ENV,
            "CNI_COMMAND is not set",
            "redirect-cni is a CNI plugin: the runtime runs it with CNI_COMMAND=ADD|DEL|CHECK|STATUS|GC|VERSION; the installer runs as `redirect-cni install`",
        )),
        other => Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_COMMAND {other:?} is not a CNI command"),
            "expected ADD, DEL, CHECK, STATUS, GC or VERSION",
        )),
    }
}

fn version(stdin: &[u8]) -> String {
    serde_json::json!({
        "cniVersion": conf::requested_version(stdin),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
    .to_string()
}

/// What to do for this pod: `None` = pass through; else the config and dual-stack flag.
fn plan_for(call: &Call, conf: &NetConf) -> Result<Option<(ValidConfig, bool)>, CniError> {
    let Some((ns, name)) = call.pod.clone()? else {
        info!("no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS: not a Kubernetes pod, nothing to do",);
        return Ok(None);
    };
    if let Some(why) = conf.excluded(&ns, &name) {
        info!("{ns}/{name}: {why}");
        return Ok(None);
    }
    let mut pod = match &conf.pod_annotations {
        Some(a) => PodInfo {
            namespace: ns.clone(),
            name: name.clone(),
            annotations: a.clone(),
            ..PodInfo::default()
        },
        None => fetch(conf, &ns, &name, "the runtime sent no pod annotations")?,
    };
    let mut decision = decide(&pod, conf)?;
    if let Decision::NeedSpec(why) = &decision {
        pod = fetch(conf, &ns, &name, why)?;
        decision = decide(&pod, conf)?;
    }
    match decision {
        Decision::Skip(why) => {
            info!("{ns}/{name}: not captured: {why}");
            Ok(None)
        }
        Decision::NeedSpec(why) => Err(CniError::new(
            code::POD_UNKNOWN,
            format!("{ns}/{name}: cannot decide the capture: {why}"),
            "",
        )),
        Decision::Capture {
            config,
            dual_stack,
            warnings,
        } => {
            for w in warnings {
                warn!("{ns}/{name}: {w}");
            }
            Ok(Some((*config, dual_stack)))
        }
    }
}

fn decide(pod: &PodInfo, conf: &NetConf) -> Result<Decision, CniError> {
    mesh::decide(pod, &conf.mesh).map_err(|e| match e {
        // The plugin config's own lists conflicting with the proxy's IDs: a config error.
        mesh::MeshError::DefaultsConflict(e) => CniError::new(
            code::INVALID_CONFIG,
            format!("config field {e}"),
            "fix the plugin's config; nothing was applied",
        ),
        mesh::MeshError::Annotation(e) => CniError::new(
            code::BAD_ANNOTATION,
            format!(
                "pod {}/{}: annotation value error: {e}",
                pod.namespace, pod.name
            ),
            "fix the pod's annotation; nothing was applied",
        ),
    })
}

fn fetch(conf: &NetConf, ns: &str, name: &str, why: &str) -> Result<PodInfo, CniError> {
    info!("{ns}/{name}: reading the pod from the Kubernetes API ({why})");
    let policy = crate::kube::FetchPolicy {
        attempts: conf.kube_attempts,
        interval: Duration::from_millis(conf.kube_interval_ms),
        deadline: Duration::from_millis(conf.kube_deadline_ms),
        ..crate::kube::FetchPolicy::default()
    };
    crate::kube::fetch_pod(&conf.kubeconfig, ns, name, &policy).map_err(|e| {
        CniError::new(
            code::POD_UNKNOWN,
            format!("{ns}/{name}: cannot read the pod from the Kubernetes API: {e}"),
            "the pod's capture depends on its spec; nothing was applied",
        )
    })
}

/// The pod's namespace, opened once and judged by its descriptor: set, a network namespace,
/// and not the plugin's own. What is judged here is what ADD and CHECK enter.
fn netns_of(call: &Call, conf: &NetConf) -> Result<Netns, CniError> {
    let netns = call.netns_path();
    if netns.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            "CNI_NETNS is empty for a pod in the mesh",
            "the runtime must give the pod's network namespace",
        ));
    }
    let ns = Netns::open(Path::new(&netns)).map_err(|e| {
        CniError::new(
            code::UNKNOWN_CONTAINER,
            format!("CNI_NETNS: {e}"),
            "the runtime must pass the pod's namespace file (/proc/PID/ns/net or /run/netns/NAME), while the sandbox exists",
        )
    })?;
    if !conf.allow_host_netns && is_own(&ns)? {
        return Err(CniError::new(
            code::HOST_NETNS,
            format!("CNI_NETNS {netns} is the namespace the plugin runs in (the host's): refusing to capture its traffic"),
            "a pod must have its own network namespace; set \"allow_host_netns\": true only for tests",
        ));
    }
    Ok(ns)
}

/// Whether the held namespace is the plugin's own (the node's).
fn is_own(ns: &Netns) -> Result<bool, CniError> {
    ns.is_current().map_err(|e| {
        CniError::new(
            code::IO_FAILURE,
            format!("cannot read our own network namespace: {e}"),
            "",
        )
    })
}

fn kernel_error(what: &str, e: CaptureError) -> CniError {
    let code = match e {
        CaptureError::Kernel(KernelError::Netns(
            netns::Error::Open { .. } | netns::Error::NotNetns { .. },
        )) => code::UNKNOWN_CONTAINER,
        CaptureError::Model(_) => code::INVALID_CONFIG,
        _ => code::IO_FAILURE,
    };
    CniError::new(code, format!("{what}: {e}"), "")
}

/// The kernel side of the judged namespace.
fn open(call: &Call, netns: &Netns, what: &str) -> Result<Box<dyn Backend>, CniError> {
    (call.inv.kernel)(netns).map_err(|e| kernel_error(what, e.into()))
}

fn add(call: &Call, conf: &NetConf) -> Result<String, CniError> {
    let out = passthrough(&conf.cni_version, conf.prev_result.as_ref());
    let Some((cfg, dual_stack)) = plan_for(call, conf)? else {
        return Ok(out);
    };
    let netns = netns_of(call, conf)?;
    let what = "programming the pod's capture";
    let k = open(call, &netns, what)?;
    let (cfg, _) = capture::apply_to_pod(k.as_ref(), cfg, dual_stack, &SystemGroups)
        .map_err(|e| kernel_error(what, e))?;
    info!(
        "{}captured: {} (inbound {}, outbound {}, IPv6 {}, mode {:?})",
        call.label(),
        netns.path().display(),
        cfg.inbound_ports,
        cfg.outbound_include_cidrs,
        cfg.ipv6,
        cfg.mode
    );
    Ok(out)
}

/// DEL: remove ours when the namespace is still there; everything else succeeds. A sandbox
/// that is gone (no path, no file, or a file that is no network namespace any more, such as
/// the empty mount point an unmounted namespace leaves) has nothing to remove: the CNI spec
/// asks DEL to succeed then, or the runtime could never tear the sandbox down.
fn del(call: &Call, conf: &NetConf) -> Result<(), CniError> {
    let netns = call.netns_path();
    if netns.is_empty() {
        info!("DEL: no network namespace given: nothing to remove");
        return Ok(());
    }
    let what = "removing the pod's capture";
    let ns = match Netns::open(Path::new(&netns)) {
        Ok(ns) => ns,
        Err(netns::Error::Open { source, .. })
            if matches!(
                source.raw_os_error(),
                Some(libc::ENOENT) | Some(libc::ENOTDIR)
            ) =>
        {
            info!("DEL: CNI_NETNS {netns} does not exist any more: nothing to remove");
            return Ok(());
        }
        Err(e @ netns::Error::NotNetns { .. }) => {
            info!("DEL: {e}: the sandbox is gone, nothing to remove");
            return Ok(());
        }
        Err(e) => return Err(kernel_error(what, e.into())),
    };
    if !conf.allow_host_netns && is_own(&ns)? {
        warn!("DEL: CNI_NETNS {netns} is the plugin's own namespace: nothing removed");
        return Ok(());
    }
    let k = open(call, &ns, what)?;
    let removed = remove_ours(k.as_ref()).map_err(|e| kernel_error(what, e))?;
    info!(
        "DEL {netns}: {}",
        if removed {
            "rules removed"
        } else {
            "no rules of ours"
        }
    );
    Ok(())
}

/// Only a namespace we programmed has routes and `::6` of ours.
fn remove_ours(k: &dyn Backend) -> Result<bool, CaptureError> {
    if k.read_table()?.is_none() {
        return Ok(false);
    }
    capture::cleanup(k, &redirect_istio::TPROXY_ROUTING)?;
    Ok(true)
}

/// CHECK: the namespace's rules must be what the pod's annotations ask for.
fn check(call: &Call, conf: &NetConf) -> Result<(), CniError> {
    let Some((cfg, dual_stack)) = plan_for(call, conf)? else {
        return Ok(());
    };
    let netns = netns_of(call, conf)?;
    let what = "reading the pod's capture back";
    let k = open(call, &netns, what)?;
    let (_, diff) = capture::check_pod(k.as_ref(), cfg, dual_stack, &SystemGroups)
        .map_err(|e| kernel_error(what, e))?;
    if diff.is_empty() {
        info!("CHECK: the rules match the pod's annotations");
        return Ok(());
    }
    let diff: Vec<String> = diff.iter().map(|d| d.to_string()).collect();
    Err(CniError::new(
        code::RULES_DIFFER,
        format!("the capture rules in {} differ from what the pod's annotations ask for ({} differences)", netns.path().display(), diff.len()),
        diff.iter().take(20).cloned().collect::<Vec<_>>().join("; "),
    ))
}

/// STATUS: ready when the config parsed (done) and nf_tables answers.
fn status(_conf: &NetConf) -> Result<(), CniError> {
    Nft::open()
        .and_then(|nft| nft.families_with_tables())
        .map_err(|e| {
            CniError::new(
                code::NOT_AVAILABLE,
                format!("nf_tables does not answer: {e}"),
                "the kernel needs nf_tables (modprobe nf_tables nft_redir nft_tproxy nft_ct nft_nat)",
            )
        })?;
    info!("STATUS: ready");
    Ok(())
}
