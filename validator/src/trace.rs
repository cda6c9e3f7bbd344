//! `trace`: the path one packet of a flow really takes through a pod's rules, read from the
//! kernel's trace reports (a short-lived trace table of our own marks that flow's first packet;
//! `redirect_core::trace`), next to `explain`'s prediction for the same flow from the same
//! flags, annotations or ambient config, and the first step where they differ. Needs root.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redirect_core::error::NamespaceError;
use redirect_core::eval::{self, CtState, Direction, Flow};
use redirect_core::pod_facts::{self, HostAddress};
use redirect_core::trace::{self as kt, TraceEvent, TraceKind, TraceMatch, Tracer};
use redirect_core::{AmbientConfig, Capture, Namespace, Ruleset};
use redirect_program::logging::stderr_line;
use serde::Serialize;

use crate::Error;
use crate::{args, explain, pod_file};
use crate::{EXIT_DIFFERS, EXIT_ERROR, EXIT_OK};

const ABOUT: &str = "Traces one flow's first packet through a pod's rules as the kernel runs them (nf_tables trace reports) and sets its path beside explain's prediction (exit 0 same, 2 different, 1 error; needs root)";

/// How long the reports of one packet may keep coming after the first.
const SETTLE: Duration = Duration::from_millis(300);

/// One rule the packet passed, or the evaluator says it passes.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PathStep {
    /// The hook it entered from (`output`, `prerouting`, `postrouting`), when known.
    pub hook: String,
    /// The chain in our table (`nat_ip_istio_output`).
    pub chain: String,
    /// 1-based position in the chain.
    pub position: usize,
    /// The rule in nft syntax.
    pub rule: String,
    /// What the rule did (the kernel's verdict: `continue`, `jump ...`, `accept`); the
    /// evaluator's step has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
}

/// Where the two paths part.
#[derive(Debug, Serialize)]
struct Difference {
    /// 1-based step number.
    step: usize,
    expected: Option<PathStep>,
    traced: Option<PathStep>,
}

#[derive(Debug, Serialize)]
struct Report {
    netns: PathBuf,
    flow: String,
    expected_from: String,
    trace_table: String,
    /// Whether the kernel owned the trace table to this process (Linux 5.12+).
    owner_flag: bool,
    expected_verdict: String,
    expected: Vec<PathStep>,
    traced: Vec<PathStep>,
    /// Every report of the packet, in order (other tables' too).
    events: Vec<TraceEvent>,
    /// Milliseconds from the start of the wait (or of the send) to the first report.
    first_event_ms: Option<f64>,
    equal: bool,
    first_difference: Option<Difference>,
    notes: Vec<String>,
}

pub fn main(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    let extra = vec![
        args::value("netns", "PATH", "The pod's network namespace: /proc/<pid>/ns/net, /var/run/netns/<name>, or CNI_NETNS").required(true),
        args::value("to", "ADDR:PORT", "The flow's destination, e.g. 10.96.0.10:80 or [fd00::7]:8080").required(true),
        args::value("from", "ADDR", "The flow's source address (matched; with --send, bound)"),
        args::value("proto", "PROTO", "tcp (default) or udp"),
        args::value("uid", "UID", "An outbound flow sent by a process of this UID (with --send, the sending thread takes it)"),
        args::value("direction", "DIR", "in or out (default: in when --to is one of the namespace's addresses and no --uid is given, else out)"),
        args::value("annotations", "FILE", "Predict from this pod as redirect-cni would: `kubectl get pod -o json` output, a JSON object of annotations, or a Downward API annotations file; Istio's flags act as the plugin's defaults"),
        args::value("nameservers", "IPS", "The pod's resolv.conf servers, for --redirect-dns without --capture-all-dns"),
        args::switch("ambient", "Predict from Istio's ambient in-pod rules (AmbientConfig::default()) instead of a sidecar's"),
        args::switch("send", "Send the flow's first packet: outbound from inside the namespace (as --uid), inbound from the namespace trace runs in (the node)"),
        args::value("timeout", "DURATION", "How long to wait for the first packet (default 10s; e.g. 500ms, 3s, 3)"),
        args::switch("json", "Print one JSON object on stdout"),
    ];
    let r = match args::parse("redirect-validate trace", ABOUT, extra, args, env) {
        Ok(r) => r,
        Err(code) => return code,
    };
    match run(&r) {
        Ok(report) => {
            for n in &report.notes {
                stderr_line("note", n);
            }
            if r.matches.get_flag("json") {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("serializes")
                );
            } else {
                print!("{}", text(&report));
            }
            if report.equal {
                EXIT_OK
            } else {
                EXIT_DIFFERS
            }
        }
        Err(msg) => {
            stderr_line("error", &redirect_program::errors::chain(&msg));
            EXIT_ERROR
        }
    }
}

/// The flow as given, checked before anything touches the namespace.
struct Given {
    netns: PathBuf,
    to: SocketAddr,
    from: Option<IpAddr>,
    tcp: bool,
    uid: Option<u32>,
    direction: Option<Direction>,
    timeout: Duration,
    send: bool,
}

fn given(r: &redirect_core::cli::flags::Resolved) -> Result<Given, Error> {
    let m = &r.matches;
    let bad = |flag: &'static str, value: &str, want: &'static str| Error::TraceArg {
        flag,
        value: value.to_string(),
        want,
    };
    let to_s = args::get(m, "to").expect("required");
    let to = to_s.parse::<SocketAddr>().map_err(|_| {
        bad(
            "to",
            to_s,
            "ADDR:PORT, e.g. 10.96.0.10:80 or [fd00::7]:8080",
        )
    })?;
    let from = args::get(m, "from")
        .map(|v| {
            v.parse::<IpAddr>()
                .map_err(|_| bad("from", v, "an IP address"))
        })
        .transpose()?;
    if from.is_some_and(|f| f.is_ipv6() != to.is_ipv6()) {
        return Err(bad(
            "from",
            args::get(m, "from").expect("given"),
            "an address of --to's family",
        ));
    }
    let tcp = match args::get(m, "proto").map(|s| s.as_str()) {
        None | Some("tcp") => true,
        Some("udp") => false,
        Some(v) => return Err(bad("proto", v, "tcp or udp")),
    };
    let uid = args::get(m, "uid")
        .map(|v| v.parse::<u32>().map_err(|_| bad("uid", v, "a number")))
        .transpose()?;
    let direction = match args::get(m, "direction").map(|s| s.as_str()) {
        None => None,
        Some("in") => Some(Direction::In),
        Some("out") => Some(Direction::Out),
        Some(v) => return Err(bad("direction", v, "in or out")),
    };
    if direction == Some(Direction::In) && uid.is_some() {
        return Err(bad(
            "uid",
            args::get(m, "uid").expect("given"),
            "no --uid for an inbound flow (a UID is the sender's, inside the pod)",
        ));
    }
    let timeout = match args::get(m, "timeout") {
        None => Duration::from_secs(10),
        Some(v) => {
            duration(v).ok_or_else(|| bad("timeout", v, "a duration, e.g. 500ms, 3s or 3"))?
        }
    };
    Ok(Given {
        netns: PathBuf::from(args::get(m, "netns").expect("required")),
        to,
        from,
        tcp,
        uid,
        direction,
        timeout,
        send: m.get_flag("send"),
    })
}

/// `500ms`, `3s`, `3` (seconds).
fn duration(v: &str) -> Option<Duration> {
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else {
        (v, 1.0)
    };
    let x: f64 = num.parse().ok()?;
    (x.is_finite() && x > 0.0 && x * scale <= 3600.0).then(|| Duration::from_secs_f64(x * scale))
}

fn run(r: &redirect_core::cli::flags::Resolved) -> Result<Report, Error> {
    let g = given(r)?;
    // SIGINT and SIGTERM wait for a thread of ours (all threads have them blocked from here):
    // the wait below ends, and the trace table is removed on the way out.
    let stop = interrupt_flag();
    let ns = redirect_core::Netns::open(&g.netns).map_err(|e| match e {
        NamespaceError::Open { path, cause } => Error::Netns {
            path,
            source: cause,
        },
        other => other.into(),
    })?;
    let pod_ips = Namespace::addresses_of(&ns).map_err(Error::KernelRead)?;
    let (from_what, rs, mut notes) = expected_rules(r, &g, &pod_ips)?;
    let direction = g
        .direction
        .unwrap_or(if g.uid.is_none() && pod_ips.contains(&g.to.ip()) {
            Direction::In
        } else {
            Direction::Out
        });
    let flow = flow_of(&g, direction, &pod_ips);
    let evaluation = eval::evaluate(&rs, &flow);
    let m = TraceMatch {
        outbound: direction == Direction::Out,
        proto: flow.proto,
        dst: g.to,
        src: g.from,
        uid: g.uid,
    };
    let table = format!("redirect_trace_{}", std::process::id());
    let mut tracer = Tracer::start(&ns, &table, &m).map_err(|e| Error::KernelRead(e.into()))?;
    let owned = tracer.owned();
    if !owned {
        notes.push(format!(
            "this kernel has no owner tables (Linux 5.12+): {table} is removed when trace exits or is interrupted, but stays if trace is killed (nft delete table inet {table})"
        ));
    }
    let (events, first) = send_and_collect(&g, direction, &ns, &mut tracer, &stop, &mut notes)?;
    if stop.load(Ordering::SeqCst) {
        let _ = tracer.stop();
        return Err(Error::Interrupted);
    }
    let handles = tracer
        .rules_of(kt::TABLE)
        .map_err(|e| Error::KernelRead(e.into()))?;
    tracer.stop().map_err(|e| Error::KernelRead(e.into()))?;
    if first.is_none() {
        return Err(Error::NoPacket {
            timeout: g.timeout,
            hint: if g.send {
                "the packet sent did not match the flow (check --from and --direction)"
            } else {
                "no such packet passed; send one, or give --send"
            },
        });
    }
    let traced = traced_path(&events, &handles, &base_chains(&rs));
    let expected = expected_path(&evaluation);
    let first_difference = first_difference(&expected, &traced);
    Ok(Report {
        netns: g.netns,
        flow: evaluation.flow.to_string(),
        expected_from: from_what,
        trace_table: table,
        owner_flag: owned,
        expected_verdict: evaluation.verdict.to_string(),
        equal: first_difference.is_none(),
        first_difference,
        expected,
        traced,
        events,
        first_event_ms: first.map(|d| d.as_secs_f64() * 1000.0),
        notes,
    })
}

/// The reports of the flow's packets, and when the first came, the packet sent (with
/// `--send`) beside the reading, not before it: a connection attempt nobody answers holds its
/// sender for a second, and the reports are timed as they are read.
fn send_and_collect(
    g: &Given,
    direction: Direction,
    ns: &redirect_core::Netns,
    tracer: &mut Tracer,
    stop: &AtomicBool,
    notes: &mut Vec<String>,
) -> Result<(Vec<TraceEvent>, Option<Duration>), Error> {
    let started = Instant::now();
    let (collected, sent) = std::thread::scope(|scope| {
        let sender = g.send.then(|| scope.spawn(|| send(g, direction, ns)));
        let collected = collect(tracer, started, g.timeout, stop);
        let sent = sender.map(|h| h.join().expect("the sender does not panic"));
        (collected, sent)
    });
    if let Some(note) = sent.transpose()?.flatten() {
        notes.push(note);
    }
    collected
}

/// The flow's first packet: outbound from inside the pod's namespace (as --uid), inbound from
/// the namespace trace runs in. A send that fails is a note (returned): the wait says whether
/// a packet passed.
fn send(
    g: &Given,
    direction: Direction,
    ns: &redirect_core::Netns,
) -> Result<Option<String>, Error> {
    let wait = Duration::from_secs(1);
    let sent = if direction == Direction::Out {
        kt::send_probe(Some(ns), g.tcp, g.to, g.from, g.uid, wait)
    } else {
        kt::send_probe(None, g.tcp, g.to, g.from, None, wait)
    };
    match sent {
        Ok(Ok(())) => Ok(None),
        Ok(Err(e)) => Ok(Some(format!("sending the packet: {e}"))),
        Err(e) => Err(Error::KernelRead(e.into())),
    }
}

/// The evaluator's path: the rules that matched.
fn expected_path(evaluation: &redirect_core::eval::Evaluation) -> Vec<PathStep> {
    evaluation
        .path()
        .map(|s| PathStep {
            hook: s.hook.chain_name().to_ascii_lowercase(),
            chain: s.nft_chain.clone(),
            position: s.position,
            rule: s.rule.clone(),
            verdict: None,
        })
        .collect()
}

/// The rules the prediction reads: ambient's, the pod file's, or Istio's flags'.
fn expected_rules(
    r: &redirect_core::cli::flags::Resolved,
    g: &Given,
    pod_ips: &[IpAddr],
) -> Result<(String, Ruleset, Vec<String>), Error> {
    let mut notes = Vec::new();
    if r.matches.get_flag("ambient") {
        let rs = Capture::Ambient(AmbientConfig::default())
            .plan(&redirect_core::SystemGroups)
            .map_err(redirect_core::Error::from)?;
        return Ok(("Istio's ambient in-pod rules".into(), rs, notes));
    }
    let mut s = args::settings(r)?;
    let decision = pod_file::from_args(r, &s)?;
    let dual_stack = pod_file::dual_stack(decision.as_ref(), &s);
    let host = pod_facts::detect_host_address(pod_ips, dual_stack)
        .ok()
        .unwrap_or(HostAddress {
            ip: g.to.ip(),
            ipv6: g.to.is_ipv6(),
        });
    let from = if decision.is_some() {
        "the pod's annotations"
    } else {
        "Istio's flags"
    };
    let nameservers = match args::get(&r.matches, "nameservers") {
        Some(v) => args::ip_list("nameservers", v)?,
        None => Vec::new(),
    };
    let (_, rs) = explain::rules(decision, &mut s, &host, &nameservers, &mut notes)?;
    Ok((from.into(), rs, notes))
}

/// The flow the evaluator walks: as given, with the kernel's defaults (the pod's own address
/// is reached through lo, as `explain` has it).
fn flow_of(g: &Given, direction: Direction, pod_ips: &[IpAddr]) -> Flow {
    let dir = if direction == Direction::Out {
        "out"
    } else {
        "in"
    };
    let proto = if g.tcp { "tcp" } else { "udp" };
    let mut f: Flow = format!("{dir} {proto} {}", g.to)
        .parse()
        .expect("a flow from checked parts");
    f.src = g.from;
    f.uid = g.uid;
    f.gid = g.uid;
    f.ct = CtState::New;
    if direction == Direction::Out && pod_ips.contains(&g.to.ip()) {
        f.oif = Some("lo".into());
    }
    f.with_defaults()
}

/// Our table's base chains (they dispatch on the family: not in the evaluator's path), with
/// their hooks.
fn base_chains(rs: &Ruleset) -> BTreeMap<String, String> {
    rs.chains
        .iter()
        .filter_map(|c| {
            let h = c.hook?;
            Some((
                kt::base_chain_name(c.stage, h),
                h.chain_name().to_ascii_lowercase(),
            ))
        })
        .collect()
}

/// The rules of our table the packet matched, in order, each with the hook of the base chain
/// it came from.
fn traced_path(
    events: &[TraceEvent],
    handles: &[redirect_core::trace::RuleHandle],
    bases: &BTreeMap<String, String>,
) -> Vec<PathStep> {
    let mut hook = String::new();
    let mut out = Vec::new();
    for e in events {
        if e.table != kt::TABLE || e.table_family != 1 {
            continue;
        }
        if let Some(h) = bases.get(&e.chain) {
            hook = h.clone();
            continue;
        }
        // A rule report without a handle is a chain's end (the packet fell off it).
        let (TraceKind::Rule, Some(handle)) = (e.kind, e.handle) else {
            continue;
        };
        let rule = handles
            .iter()
            .find(|r| r.chain == e.chain && r.handle == handle);
        out.push(PathStep {
            hook: hook.clone(),
            chain: e.chain.clone(),
            position: rule.map_or(0, |r| r.position),
            rule: rule.map_or_else(
                || format!("handle {handle} (gone from the table)"),
                |r| r.text.clone(),
            ),
            verdict: e.verdict.clone(),
        });
    }
    out
}

/// The same step: the same rule of the same chain, at the same hook.
fn same(a: &PathStep, b: &PathStep) -> bool {
    a.chain == b.chain && a.position == b.position && a.hook == b.hook
}

fn first_difference(expected: &[PathStep], traced: &[PathStep]) -> Option<Difference> {
    let n = expected.len().max(traced.len());
    (0..n)
        .find(|&i| match (expected.get(i), traced.get(i)) {
            (Some(a), Some(b)) => !same(a, b),
            _ => true,
        })
        .map(|i| Difference {
            step: i + 1,
            expected: expected.get(i).cloned(),
            traced: traced.get(i).cloned(),
        })
}

/// Reports until the first packet's have all come: the first within `timeout`, then until
/// [`SETTLE`] passes without one. The reports of the trace table itself are left out.
fn collect(
    tracer: &mut Tracer,
    started: Instant,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<(Vec<TraceEvent>, Option<Duration>), Error> {
    let own = tracer.table().to_string();
    let mut events = Vec::new();
    let mut first = None;
    let end = started + timeout;
    loop {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let limit = match first {
            None => end,
            Some(_) => Instant::now() + SETTLE,
        };
        // Short slices, so that an interrupt is seen at once.
        let slice = limit.min(Instant::now() + Duration::from_millis(100));
        match tracer
            .next(slice)
            .map_err(|e| Error::KernelRead(e.into()))?
        {
            Some(e) => {
                first.get_or_insert_with(|| started.elapsed());
                if e.table != own {
                    events.push(e);
                }
                continue;
            }
            None if Instant::now() >= limit => break,
            None => {}
        }
        if first.is_some() {
            // Quiet for a slice after the first reports: wait out the rest of SETTLE.
            match tracer
                .next(Instant::now() + SETTLE)
                .map_err(|e| Error::KernelRead(e.into()))?
            {
                Some(e) => {
                    if e.table != own {
                        events.push(e);
                    }
                }
                None => break,
            }
        }
    }
    Ok((events, first))
}

/// Block SIGINT and SIGTERM in every thread and wait for them on one: the flag it sets ends the
/// wait, and the trace table is removed before exit.
fn interrupt_flag() -> Arc<AtomicBool> {
    use nix::sys::signal::{SigSet, Signal};
    let flag = Arc::new(AtomicBool::new(false));
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    if set.thread_block().is_ok() {
        let f = flag.clone();
        std::thread::spawn(move || {
            if set.wait().is_ok() {
                f.store(true, Ordering::SeqCst);
            }
        });
    }
    flag
}

fn text(r: &Report) -> String {
    let mut s = String::new();
    s += &format!("flow:      {}\n", r.flow);
    s += &format!(
        "predicted: {} (from {})\n",
        r.expected_verdict, r.expected_from
    );
    if let Some(ms) = r.first_event_ms {
        s += &format!(
            "traced:    first report after {ms:.1} ms, {} report(s)\n",
            r.events.len()
        );
    }
    let line = |st: &PathStep| {
        let v = st
            .verdict
            .as_ref()
            .map(|v| format!(" (verdict {v})"))
            .unwrap_or_default();
        format!("{} {} #{}: {}{v}", st.hook, st.chain, st.position, st.rule)
    };
    let diff_at = r.first_difference.as_ref().map(|d| d.step);
    s += "path (kernel, then explain where they differ):\n";
    let n = r.expected.len().max(r.traced.len());
    for i in 0..n {
        let mark = match diff_at {
            Some(d) if i + 1 >= d => "!",
            _ => " ",
        };
        match (r.traced.get(i), r.expected.get(i)) {
            (Some(t), Some(e)) if same(t, e) => s += &format!(" {mark}{:>2}. {}\n", i + 1, line(t)),
            (t, e) => {
                s += &format!(
                    " {mark}{:>2}. kernel:  {}\n",
                    i + 1,
                    t.map_or("(nothing)".into(), line)
                );
                s += &format!("      explain: {}\n", e.map_or("(nothing)".into(), line));
            }
        }
    }
    if n == 0 {
        s += "    no rule of ours matched, as explain predicts\n";
    }
    match &r.first_difference {
        None => s += "result:    the kernel's path equals explain's\n",
        Some(d) => {
            s += &format!("result:    DIFFERENT from step {}: ", d.step);
            s += &match (&d.expected, &d.traced) {
                (Some(e), Some(t)) => format!(
                    "explain expects {} #{} ({}), the kernel passed {} #{} ({})\n",
                    e.chain, e.position, e.rule, t.chain, t.position, t.rule
                ),
                (Some(e), None) => format!(
                    "explain expects {} #{} ({}), the kernel passed no further rule of ours\n",
                    e.chain, e.position, e.rule
                ),
                (None, Some(t)) => format!(
                    "the kernel also passed {} #{} ({}), which explain does not expect\n",
                    t.chain, t.position, t.rule
                ),
                (None, None) => "\n".into(),
            };
        }
    }
    s
}
