//! The CNI commands. ADD programs a mesh pod's namespace; everything else about a pod that is
//! not in the mesh is a pass-through, so the plugin never breaks a pod it does not capture.
//!
//! The kernel side of a pod's namespace is opened through [`Invocation::kernel`]: the kernel
//! in the plugin, a fake namespace in tests, so the decisions (which pods,
//! which rules, which errors) are tested without root.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redirect_core::error::NamespaceError;
use redirect_core::mesh::{self, Decision, PodInfo};
use redirect_core::{
    Apply, Capture, Error as CaptureError, Foreign, Namespace, Netns, ValidConfig,
};
use redirect_program::logging::{self, Forward, Sink};
use tracing::level_filters::LevelFilter;
use tracing::{error, info, warn};

use crate::ambient;
use crate::cni::args::{self, CniArgs};
use crate::cni::conf::{self, NetConf};
use crate::cni::result::passthrough;
use crate::cni::{code, CniError, Command, SUPPORTED_VERSIONS};
use crate::events::{micros, Event, LogLine, Phases, Readiness, MAX_FORWARDED};

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

/// Log lines at the config's `log_level`, to stderr and to its `log_file` when it names one,
/// as JSON with `log_as_json`; each line also to the node agent, which prints it in its own log
/// with the call's command and pod (at most `MAX_FORWARDED` per call, never waiting).
fn log_as_configured(conf: &NetConf, call: &Call) {
    let (run_dir, command, pod) = (conf.run_dir.clone(), call.name.clone(), call.pod_name());
    let sent = std::sync::atomic::AtomicUsize::new(0);
    let forward = Forward(std::sync::Arc::new(move |level: &str, line: &str| {
        if sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < MAX_FORWARDED {
            LogLine {
                level: level.into(),
                command: command.clone(),
                pod: pod.clone(),
                line: line.into(),
            }
            .send(&run_dir);
        }
    }));
    logging::install(Sink {
        prefix: Some(LOG_PREFIX),
        // `conf::parse` accepts only the level names.
        level: logging::level(&conf.log_level).unwrap_or(LevelFilter::INFO),
        file: conf.log_file.clone(),
        scopes: Vec::new(),
        json: conf.log_as_json,
        forward: Some(forward),
    });
}

/// Opens the judged namespace: [`Namespace::open_in`] for the kernel; a test returns a
/// namespace behind a fake.
pub type Opener<'a> = &'a dyn Fn(&Netns) -> redirect_core::Result<Namespace>;

/// The process's inputs.
pub struct Invocation<'a> {
    /// Looks up an environment variable: `CNI_COMMAND`, `CNI_ARGS` and the rest.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The network configuration the runtime wrote to stdin (may be empty, for VERSION).
    pub stdin: &'a [u8],
    /// Set when one of `ENV_NAMES` is not UTF-8: read as unset, it would drop the pod's
    /// capture silently.
    pub env_error: Option<String>,
    /// How a pod's namespace is reached: `redirect_core::Namespace::open_in`.
    pub kernel: Opener<'a>,
    /// When the process started: the event's whole time counts from here.
    pub started: Instant,
}

/// One call, with what the runtime says of the pod read once.
struct Call<'a> {
    inv: &'a Invocation<'a>,
    /// CNI_COMMAND as the runtime sent it, for the log lines and the event.
    name: String,
    /// The command it names, if it names one.
    command: Option<Command>,
    /// The pod from CNI_ARGS: `Ok(None)` when it is not a Kubernetes pod.
    pod: Result<Option<(String, String)>, CniError>,
    /// How long each phase took, for the agent's histograms.
    phases: Cell<Phases>,
}

/// What a call answers (its stdout) and what it did, in words, for its end line.
struct Answer {
    stdout: String,
    outcome: String,
}

impl Answer {
    fn done(outcome: impl Into<String>) -> Answer {
        Answer {
            stdout: String::new(),
            outcome: outcome.into(),
        }
    }
}

/// What ADD or CHECK do with a pod: leave it alone (and why), or capture it.
enum Handling {
    Pass(String),
    Capture(Box<ValidConfig>, bool),
}

impl<'a> Call<'a> {
    fn new(inv: &'a Invocation<'a>, name: String) -> Call<'a> {
        let pod =
            args::parse(&(inv.env)("CNI_ARGS").unwrap_or_default()).map(|a: CniArgs| {
                match (a.pod_namespace, a.pod_name) {
                    (Some(ns), Some(name)) => Some((ns, name)),
                    _ => None,
                }
            });
        Call {
            inv,
            command: Command::from_name(&name),
            name,
            pod,
            phases: Cell::default(),
        }
    }

    /// Runs `f`, its time recorded in the phase `slot` names.
    fn timed<T>(&self, slot: fn(&mut Phases) -> &mut Option<u64>, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        let mut p = self.phases.get();
        *slot(&mut p) = Some(micros(t.elapsed()));
        self.phases.set(p);
        out
    }

    /// Whether the call is one of a pod's (ADD, DEL, CHECK): see `Command::is_pods`.
    fn is_pod_call(&self) -> bool {
        self.command.is_some_and(Command::is_pods)
    }

    /// `<namespace>/<name>`, when CNI_ARGS named a pod.
    fn pod_name(&self) -> Option<String> {
        match &self.pod {
            Ok(Some((ns, name))) => Some(format!("{ns}/{name}")),
            _ => None,
        }
    }

    /// The pod or, for a sandbox that is not a Kubernetes pod, `container <id>`.
    fn subject(&self) -> String {
        self.pod_name().unwrap_or_else(|| {
            format!(
                "container {}",
                (self.inv.env)("CNI_CONTAINERID").unwrap_or_else(|| "(unset)".into())
            )
        })
    }

    /// The line an operator greps for when a pod's sandbox starts: `ADD shop/web-0: start`.
    fn log_start(&self) {
        if self.is_pod_call() {
            info!(
                "{} {}: start (netns {}, interface {})",
                self.name,
                self.subject(),
                self.netns_path(),
                (self.inv.env)("CNI_IFNAME").unwrap_or_default()
            );
        }
    }

    /// The matching end line, with the outcome and the whole time; then the agent's event.
    fn finish(&self, run_dir: &Path, result: Result<&str, &CniError>) {
        if !self.is_pod_call() {
            return;
        }
        let total = self.inv.started.elapsed();
        let ms = total.as_secs_f64() * 1000.0;
        match result {
            Ok(outcome) => info!(
                "{} {}: end: {outcome} ({ms:.1} ms)",
                self.name,
                self.subject()
            ),
            Err(e) => error!(
                "{} {}: end: failed with code {} ({ms:.1} ms)",
                self.name,
                self.subject(),
                e.code
            ),
        }
        Event {
            command: self.name.clone(),
            code: result.err().map_or(0, |e| e.code),
            pod: self.pod_name(),
            total_us: micros(total),
            phases: self.phases.get(),
        }
        .send(run_dir);
    }

    /// `"<namespace>/<name> "` for log lines, or nothing when the pod is not known.
    fn label(&self) -> String {
        self.pod_name().map(|p| p + " ").unwrap_or_default()
    }

    fn netns_path(&self) -> String {
        (self.inv.env)("CNI_NETNS").unwrap_or_default()
    }
}

/// Runs one command: `Ok(stdout)` or a CNI error (printed as JSON, exit 1).
pub fn run(inv: &Invocation) -> Result<String, (CniError, String)> {
    let name = (inv.env)("CNI_COMMAND").unwrap_or_default();
    if Command::from_name(&name) == Some(Command::Version) {
        return Ok(version(inv.stdin));
    }
    let call = Call::new(inv, name);
    // The subscriber is installed once: after VERSION, which logs nothing, and once the
    // config says where lines go (parsing it logs nothing either); stderr alone when it is bad.
    let conf = match call.timed(|p| &mut p.config_us, || conf::parse(inv.stdin)) {
        Ok(conf) => conf,
        Err(e) => {
            log_to_stderr();
            error!("{} {}{e}", call.name, call.label());
            call.finish(&run_dir_hint(inv.stdin), Err(&e));
            return Err((e, conf::requested_version(inv.stdin)));
        }
    };
    log_as_configured(&conf, &call);
    call.log_start();
    let result = dispatch(&call, &conf);
    match &result {
        Ok(answer) => call.finish(&conf.run_dir, Ok(&answer.outcome)),
        Err(e) => {
            // Into the log file too: a failed ADD is what an operator looks for there.
            error!("{} {}{e}", call.name, call.label());
            call.finish(&conf.run_dir, Err(e));
        }
    }
    result
        .map(|a| a.stdout)
        .map_err(|e| (e, conf.cni_version.clone()))
}

/// The agent's run directory of a config the plugin refused, as far as it can be read: its
/// event still counts the failure.
fn run_dir_hint(stdin: &[u8]) -> PathBuf {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("cni_agent_run_dir")?.as_str().map(PathBuf::from))
        .unwrap_or_else(|| conf::DEFAULT_RUN_DIR.into())
}

fn dispatch(call: &Call, conf: &NetConf) -> Result<Answer, CniError> {
    if let Some(msg) = &call.inv.env_error {
        return Err(CniError::new(
            code::INVALID_ENV,
            msg.clone(),
            "the runtime must pass the CNI variables as UTF-8",
        ));
    }
    if let Some(c) = call.command.filter(|c| !c.allowed_in(&conf.cni_version)) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "config version {} does not allow {c}: {c} exists from cniVersion {} on",
                conf.cni_version,
                c.since()
            ),
            format!("the runtime must not send {c} for this config; set its cniVersion to {} or newer to use {c}", c.since()),
        ));
    }
    match call.command {
        Some(Command::Add) => add(call, conf),
        Some(Command::Del) => del(call, conf).map(Answer::done),
        Some(Command::Check) => check(call, conf).map(Answer::done),
        Some(Command::Status) => status(conf).map(|_| Answer::done("ready")),
        Some(Command::Gc) => {
            info!("GC: nothing to collect: the rules live in the pod's namespace and go with it");
            Ok(Answer::done("nothing to collect"))
        }
        Some(Command::Version) => Ok(Answer {
            stdout: version(call.inv.stdin),
            outcome: "versions".into(),
        }),
        None if call.name.is_empty() => Err(CniError::new(
            code::INVALID_ENV,
            "CNI_COMMAND is not set",
            "redirect-cni is a CNI plugin: the runtime runs it with CNI_COMMAND=ADD|DEL|CHECK|STATUS|GC|VERSION; the node installer is `redirect-cni-node`",
        )),
        None => Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_COMMAND {:?} is not a CNI command", call.name),
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

/// What to do for this pod: pass it through (and why), or the config and dual-stack flag.
fn handling(call: &Call, conf: &NetConf) -> Result<Handling, CniError> {
    let Some((ns, name)) = call.pod.clone()? else {
        info!("no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS: not a Kubernetes pod, nothing to do",);
        return Ok(Handling::Pass("not a Kubernetes pod".into()));
    };
    if let Some(why) = conf.excluded(&ns, &name) {
        info!("{ns}/{name}: {why}");
        return Ok(Handling::Pass(why.to_string()));
    }
    let mut pod = match &conf.pod_annotations {
        Some(a) => PodInfo {
            namespace: ns.clone(),
            name: name.clone(),
            annotations: a.clone(),
            ..PodInfo::default()
        },
        None => fetch(
            call,
            conf,
            &ns,
            &name,
            "the runtime sent no pod annotations",
        )?,
    };
    let mut decision = mesh_decision(&pod, conf)?;
    if let Decision::NeedSpec(why) = &decision {
        pod = fetch(call, conf, &ns, &name, why)?;
        decision = mesh_decision(&pod, conf)?;
    }
    match decision {
        Decision::Skip(why) => {
            info!("{ns}/{name}: not captured: {why}");
            Ok(Handling::Pass(why))
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
            Ok(Handling::Capture(config, dual_stack))
        }
    }
}

/// `mesh::decide` with the plugin's defaults, its refusals as CNI errors.
fn mesh_decision(pod: &PodInfo, conf: &NetConf) -> Result<Decision, CniError> {
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

/// The pod from the API, timed as the call's pod read.
fn fetch(
    call: &Call,
    conf: &NetConf,
    ns: &str,
    name: &str,
    why: &str,
) -> Result<PodInfo, CniError> {
    call.timed(|p| &mut p.pod_read_us, || fetch_pod(conf, ns, name, why))
}

fn fetch_pod(conf: &NetConf, ns: &str, name: &str, why: &str) -> Result<PodInfo, CniError> {
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
        CaptureError::Namespace(NamespaceError::Open { .. } | NamespaceError::NotNetns { .. }) => {
            code::UNKNOWN_CONTAINER
        }
        CaptureError::Config(_) => code::INVALID_CONFIG,
        _ => code::IO_FAILURE,
    };
    CniError::new(code, format!("{what}: {e}"), "")
}

/// The pod's addresses as the previous plugin's result gives them (`ips[].address`, IPv4
/// first, as the kernel lists them), so that IPv6 is decided without asking the kernel; `None`
/// when the result has none (the namespace's addresses are read then).
fn prev_addresses(conf: &NetConf) -> Option<Vec<std::net::IpAddr>> {
    let ips = conf.prev_result.as_ref()?.get("ips")?.as_array()?;
    let mut addrs: Vec<std::net::IpAddr> = ips
        .iter()
        .filter_map(|ip| {
            ip.get("address")?
                .as_str()?
                .parse::<redirect_core::ipnet::IpNet>()
                .ok()
        })
        .map(|net| net.addr())
        .collect();
    addrs.sort_by_key(|a| a.is_ipv6());
    (!addrs.is_empty()).then_some(addrs)
}

/// The kernel side of the judged namespace.
fn open(call: &Call, netns: &Netns, what: &str) -> Result<Namespace, CniError> {
    (call.inv.kernel)(netns).map_err(|e| kernel_error(what, e))
}

/// ADD's policy over what the namespace holds: the runtime made it for this sandbox moments
/// ago, so no other capture layer can be in it yet, and nothing is read for one
/// ([`Foreign::Keep`] costs nothing); ours from an earlier ADD are updated in place.
const ADD_POLICY: Apply = Apply::foreign(Foreign::Keep);

fn add(call: &Call, conf: &NetConf) -> Result<Answer, CniError> {
    let stdout = passthrough(&conf.cni_version, conf.prev_result.as_ref());
    let (cfg, dual_stack) = match handling(call, conf)? {
        Handling::Pass(why) => {
            let outcome = match ambient_add(call, conf)? {
                Some(outcome) => outcome,
                None => format!("not captured ({why})"),
            };
            return Ok(Answer { stdout, outcome });
        }
        Handling::Capture(cfg, dual_stack) => (*cfg, dual_stack),
    };
    let netns = netns_of(call, conf)?;
    let what = "programming the pod's capture";
    let k = open(call, &netns, what)?;
    let known = prev_addresses(conf);
    let cfg = call
        .timed(
            |p| &mut p.apply_us,
            || {
                let cfg = k.for_pod(cfg, dual_stack, known.as_deref())?;
                k.apply_with(&Capture::Sidecar(cfg.clone()), ADD_POLICY)?;
                Ok(cfg)
            },
        )
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
    Ok(Answer {
        stdout,
        outcome: "captured".into(),
    })
}

/// Ambient mode: a pod without a sidecar is the agent's to judge; it enrolls an ambient pod
/// (rules in its namespace, ztunnel told) before the runtime starts it. `None`: not asked
/// (ambient off, not a Kubernetes pod, an excluded namespace).
fn ambient_add(call: &Call, conf: &NetConf) -> Result<Option<String>, CniError> {
    let Some((request, answer)) = ambient_ask(call, conf, ambient::Command::Add)? else {
        return Ok(None);
    };
    let answer = match answer {
        AgentSaid::Answer(a) => a,
        AgentSaid::NotListening(why) => return without_agent(call, conf, &request, &why).map(Some),
    };
    match answer {
        ambient::AddAnswer::Enrolled | ambient::AddAnswer::Matches => {
            info!(
                "{}enrolled in ambient mode: {}",
                call.label(),
                request.netns
            );
            Ok(Some("enrolled in ambient mode".into()))
        }
        ambient::AddAnswer::NotAmbient { reason } => {
            info!("{}not ambient: {reason}", call.label());
            Ok(Some(format!("not captured (not ambient: {reason})")))
        }
        ambient::AddAnswer::Failed { error } => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("ambient mode: the node agent could not enroll the pod: {error}"),
            "the runtime tries again; the agent's log says more",
        )),
        ambient::AddAnswer::Differs { differences } => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("ambient mode: the node agent answered ADD with a CHECK's answer: {differences:?}"),
            "the agent and the plugin are of different releases: the agent installs its own plugin; the runtime tries again",
        )),
    }
}

/// Ambient mode's CHECK of a pod without a sidecar: the agent compares an ambient pod's
/// in-pod rules in this namespace with its plan (it holds the chart's settings and knows the
/// pod is enrolled). `None`: not asked, as for ADD.
fn ambient_check(call: &Call, conf: &NetConf) -> Result<Option<String>, CniError> {
    let Some((request, answer)) = ambient_ask(call, conf, ambient::Command::Check)? else {
        return Ok(None);
    };
    let netns = request.netns.as_str();
    match answer {
        AgentSaid::NotListening(why) => check_without_agent(call, conf, &request, &why).map(Some),
        AgentSaid::Answer(ambient::AddAnswer::Matches | ambient::AddAnswer::Enrolled) => {
            info!("CHECK: the in-pod rules match the ambient pod's plan");
            Ok(Some("the in-pod rules match (ambient)".into()))
        }
        AgentSaid::Answer(ambient::AddAnswer::NotAmbient { reason }) => {
            Ok(Some(format!("not captured (not ambient: {reason})")))
        }
        AgentSaid::Answer(ambient::AddAnswer::Differs { differences }) => Err(CniError::new(
            code::RULES_DIFFER,
            format!(
                "the in-pod rules in {netns} differ from what the ambient pod's settings ask                  for ({} differences)",
                differences.len()
            ),
            differences.iter().take(20).cloned().collect::<Vec<_>>().join("; "),
        )),
        AgentSaid::Answer(ambient::AddAnswer::Failed { error }) => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("ambient mode: the node agent could not check the pod: {error}"),
            "the agent's log says more",
        )),
    }
}

/// What the agent said, or that none listens.
enum AgentSaid {
    Answer(ambient::AddAnswer),
    /// No socket, or nobody behind it (stopped, or being upgraded): why, in words.
    NotListening(String),
}

/// Asks the agent about this call's pod; `None` when ambient mode does not concern it.
fn ambient_ask(
    call: &Call,
    conf: &NetConf,
    command: ambient::Command,
) -> Result<Option<(ambient::AddRequest, AgentSaid)>, CniError> {
    let Some((namespace, name)) = call.pod.clone()?.filter(|_| conf.ambient_enabled) else {
        return Ok(None);
    };
    if conf.excluded(&namespace, &name).is_some() {
        return Ok(None);
    }
    let netns = netns_of(call, conf)?;
    let uid = args::parse(&(call.inv.env)("CNI_ARGS").unwrap_or_default())?.pod_uid;
    let request = ambient::AddRequest {
        command,
        namespace,
        name,
        uid,
        ips: prev_addresses(conf).unwrap_or_default(),
        netns: netns.path().display().to_string(),
    };
    let socket = conf.run_dir.join(ambient::SOCKET_NAME);
    let fd = std::os::fd::AsFd::as_fd(&netns);
    let slot: fn(&mut Phases) -> &mut Option<u64> = match command {
        ambient::Command::Add => |p: &mut Phases| &mut p.apply_us,
        ambient::Command::Check => |p: &mut Phases| &mut p.read_back_us,
    };
    let answer = call.timed(slot, || {
        ambient::ask(&conf.run_dir, &request, fd, ambient::DEADLINE)
    });
    let said = match answer {
        Ok(a) => AgentSaid::Answer(a),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            AgentSaid::NotListening(format!(
                "the node agent does not answer at {}: {e}",
                socket.display()
            ))
        }
        Err(e) => {
            return Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!(
                    "ambient mode: the node agent does not answer at {}: {e}",
                    socket.display()
                ),
                "with ambient_enabled every pod without a sidecar waits for the node agent's \
                 verdict (is redirect-cni-node running on this node?); the runtime tries again",
            ))
        }
    };
    Ok(Some((request, said)))
}

/// CHECK with no agent listening: a pod the agent annotated `ambient.istio.io/redirection:
/// enabled` cannot be checked without it (its settings are the agent's); any other pod is
/// not captured.
fn check_without_agent(
    call: &Call,
    conf: &NetConf,
    request: &ambient::AddRequest,
    why: &str,
) -> Result<String, CniError> {
    let pod = fetch(
        call,
        conf,
        &request.namespace,
        &request.name,
        "the node agent does not answer: CHECK needs the pod's ambient annotation",
    )?;
    let annotated = pod
        .annotations
        .get(redirect_core::ambient::REDIRECTION)
        .map(String::as_str);
    if annotated == Some("enabled") {
        return Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!("ambient mode: {why}; the pod is enrolled in ambient mode and its rules cannot be checked without the agent"),
            "is redirect-cni-node running on this node? the runtime tries again",
        ));
    }
    Ok("not captured (not ambient; the node agent was not reachable)".into())
}

/// Ambient mode with no agent listening: the plugin reads the pod's and its namespace's labels
/// itself (as Istio's plugin does); a pod that is not ambient goes on uncaptured, an ambient
/// one fails (code 11) until the agent is back. A read that fails counts as ambient: nothing
/// starts uncaptured on a guess.
fn without_agent(
    call: &Call,
    conf: &NetConf,
    request: &ambient::AddRequest,
    why: &str,
) -> Result<String, CniError> {
    use redirect_core::ambient::{enrollment, Enrollment, PodView};
    let (ns, name) = (request.namespace.as_str(), request.name.as_str());
    let fail = |detail: String| {
        CniError::new(
            code::TRY_AGAIN_LATER,
            format!("ambient mode: {why}; {detail}"),
            "an ambient pod waits for the node agent (is redirect-cni-node running on this \
             node?); the runtime tries again",
        )
    };
    let pod = fetch(
        call,
        conf,
        ns,
        name,
        "the node agent does not answer: ambient mode needs the pod's labels",
    )
    .map_err(|e| fail(format!("the pod's labels cannot be read ({})", e.msg)))?;
    let policy = crate::kube::FetchPolicy::default();
    let ns_labels = crate::kube::fetch_namespace_labels(&conf.kubeconfig, ns, &policy)
        .map_err(|e| fail(format!("the namespace's labels cannot be read ({e})")))?;
    let view = PodView {
        namespace: ns,
        labels: &pod.labels,
        annotations: &pod.annotations,
        host_network: false,
        namespace_labels: &ns_labels,
    };
    match enrollment(&view, &conf.exclude_namespaces, &conf.enablement_selectors) {
        Enrollment::Ambient => Err(fail("the pod is ambient".into())),
        Enrollment::Not(reason) => {
            warn!(
                "{}{why}; not ambient ({reason}): ADD goes on without it",
                call.label()
            );
            Ok(format!(
                "not captured (not ambient: {reason}; the node agent was not reachable)"
            ))
        }
    }
}

/// DEL: remove ours when the namespace is still there; everything else succeeds. A sandbox
/// that is gone (no path, no file, or a file that is no network namespace any more, such as
/// the empty mount point an unmounted namespace leaves) has nothing to remove: the CNI spec
/// asks DEL to succeed then, or the runtime could never tear the sandbox down.
fn del(call: &Call, conf: &NetConf) -> Result<&'static str, CniError> {
    const GONE: &str = "nothing to remove (the sandbox is gone)";
    let netns = call.netns_path();
    if netns.is_empty() {
        info!("DEL: no network namespace given: nothing to remove");
        return Ok("nothing to remove (no network namespace given)");
    }
    let what = "removing the pod's capture";
    let ns = match Netns::open(Path::new(&netns)) {
        Ok(ns) => ns,
        Err(NamespaceError::Open { cause: source, .. })
            if matches!(
                source.raw_os_error(),
                Some(libc::ENOENT) | Some(libc::ENOTDIR)
            ) =>
        {
            info!("DEL: CNI_NETNS {netns} does not exist any more: nothing to remove");
            return Ok(GONE);
        }
        Err(e @ NamespaceError::NotNetns { .. }) => {
            info!("DEL: {e}: the sandbox is gone, nothing to remove");
            return Ok(GONE);
        }
        Err(e) => return Err(kernel_error(what, e.into())),
    };
    if !conf.allow_host_netns && is_own(&ns)? {
        warn!("DEL: CNI_NETNS {netns} is the plugin's own namespace: nothing removed");
        return Ok("nothing removed (the plugin's own namespace)");
    }
    let k = open(call, &ns, what)?;
    // Ambient's in-pod rules are the node agent's: it releases them with the pod, and a
    // sandbox torn down takes them with it. Removed here, the agent's next pass would see
    // them missing in a namespace it still holds and put them back (a sandbox restart
    // counted as a repair).
    if k.holds_ambient().map_err(|e| kernel_error(what, e))? {
        info!("DEL {netns}: ambient's in-pod rules, the node agent's: left to it");
        return Ok("ambient's rules left to the node agent");
    }
    let removed = call
        .timed(|p| &mut p.apply_us, || k.remove_ours())
        .map_err(|e| kernel_error(what, e))?;
    let outcome = if removed {
        "rules removed"
    } else {
        "no rules of ours"
    };
    info!("DEL {netns}: {outcome}");
    Ok(outcome)
}

/// CHECK: the namespace's rules must be what the pod's annotations ask for.
fn check(call: &Call, conf: &NetConf) -> Result<String, CniError> {
    let (cfg, dual_stack) = match handling(call, conf)? {
        Handling::Pass(why) => {
            return Ok(match ambient_check(call, conf)? {
                Some(outcome) => outcome,
                None => format!("not captured ({why})"),
            })
        }
        Handling::Capture(cfg, dual_stack) => (*cfg, dual_stack),
    };
    let netns = netns_of(call, conf)?;
    let what = "reading the pod's capture back";
    let k = open(call, &netns, what)?;
    let known = prev_addresses(conf);
    let diff = call
        .timed(
            |p| &mut p.read_back_us,
            || {
                k.check(&Capture::Sidecar(k.for_pod(
                    cfg,
                    dual_stack,
                    known.as_deref(),
                )?))
            },
        )
        .map_err(|e| kernel_error(what, e))?;
    if diff.is_empty() {
        info!("CHECK: the rules match the pod's annotations");
        return Ok("the rules match".into());
    }
    let diff: Vec<String> = diff.iter().map(|d| d.to_string()).collect();
    Err(CniError::new(
        code::RULES_DIFFER,
        format!("the capture rules in {} differ from what the pod's annotations ask for ({} differences)", netns.path().display(), diff.len()),
        diff.iter().take(20).cloned().collect::<Vec<_>>().join("; "),
    ))
}

/// STATUS: ready when the config parsed (done), the node agent (when there is one) says the
/// plugin is installed, and nf_tables answers. With no agent's status file in the run
/// directory (the plugin installed by hand), the agent is not asked.
fn status(conf: &NetConf) -> Result<(), CniError> {
    if let Some(Readiness::NotReady(why)) = Readiness::read(&conf.run_dir) {
        return Err(CniError::new(
            code::NOT_AVAILABLE,
            format!("the node agent is not ready: {why}"),
            format!(
                "the agent (redirect-cni-node) writes {}; its log says what it waits for",
                conf.run_dir.join(crate::events::READY_NAME).display()
            ),
        ));
    }
    Namespace::nf_tables_answers().map_err(|e| {
        CniError::new(
            code::NOT_AVAILABLE,
            format!("nf_tables does not answer: {e}"),
            "the kernel needs nf_tables (modprobe nf_tables nft_redir nft_tproxy nft_ct nft_nat)",
        )
    })?;
    info!("STATUS: ready");
    Ok(())
}
