//! `explain`: where a flow goes under the rules Istio's flags describe, and the rules on the
//! way. No privilege, no namespace: the evaluator reads the plan.

use redirect_program::logging::stderr_line;
use std::ffi::OsString;
use std::net::IpAddr;

use redirect_core::cli::settings::Settings;
use redirect_core::eval::{self, Evaluation, Flow, Verdict};
use redirect_core::mesh::Decision;
use redirect_core::pod_facts::{self, HostAddress};
use redirect_core::Ruleset;
use redirect_core::{CaptureConfig, DNS_AGENT_PORT};
use serde::Serialize;

use crate::Error;
use crate::{args, pod_file};
use crate::{EXIT_ERROR, EXIT_OK};

const ABOUT: &str = "Shows where a flow goes under the capture rules that Istio's flags (or a pod's annotations) describe, and the rules it crosses (no privilege needed)";

#[derive(Serialize)]
struct Explained {
    #[serde(flatten)]
    evaluation: Evaluation,
    /// What the verdict's port is, for this config.
    meaning: String,
}

pub fn main(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    let extra = vec![
        args::value("flow", "FLOW", "The flow, e.g. 'out tcp uid=1000 10.1.2.3:80' or 'in tcp 10.244.1.7:8080 src=10.0.0.9' (repeatable; keys: uid, gid, src, sport, iif, oif, mark, ct)")
            .action(clap::ArgAction::Append)
            .required(true),
        args::value("annotations", "FILE", "Plan for this pod as redirect-cni would: `kubectl get pod -o json` output, a JSON object of annotations, or a Downward API annotations file; Istio's flags act as the plugin's defaults"),
        args::value("pod-ip", "IPS", "The pod's addresses (comma-separated); an IPv6 one turns IPv6 rules on, as Istio derives it (default: an IPv4 pod)"),
        args::value("nameservers", "IPS", "The pod's resolv.conf servers, for --redirect-dns without --capture-all-dns"),
        args::switch("all-rules", "Also list the rules tested that did not match"),
        args::switch("json", "Print a JSON array, one object per flow (flow, verdict, steps, mark, ct_zone, notes, meaning)"),
    ];
    let r = match args::parse("redirect-validate explain", ABOUT, extra, args, env) {
        Ok(r) => r,
        Err(code) => return code,
    };
    match run(&r) {
        Ok((out, notes)) => {
            for n in notes {
                stderr_line("note", &n.to_string());
            }
            if r.matches.get_flag("json") {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&out).expect("serializes")
                );
            } else {
                print!("{}", text(&out, r.matches.get_flag("all-rules")));
            }
            EXIT_OK
        }
        Err(msg) => {
            stderr_line("error", &redirect_program::errors::chain(&msg));
            EXIT_ERROR
        }
    }
}

fn run(r: &redirect_core::cli::flags::Resolved) -> Result<(Vec<Explained>, Vec<String>), Error> {
    let flows: Vec<Flow> = r
        .matches
        .get_many::<String>("flow")
        .into_iter()
        .flatten()
        .map(|f| f.parse::<Flow>().map_err(Error::Flow))
        .collect::<Result<_, _>>()?;
    let pod_ips = ip_arg(r, "pod-ip")?;
    let nameservers = ip_arg(r, "nameservers")?;
    let mut s = args::settings(r)?;
    let mut notes = Vec::new();
    let decision = pod_file::from_args(r, &s)?;
    let dual_stack = pod_file::dual_stack(decision.as_ref(), &s);
    let host = if pod_ips.is_empty() {
        if flows.iter().any(|f| f.dst.is_ipv6()) {
            notes.push("no --pod-ip: planned for an IPv4 pod, which has no IPv6 rules; give the pod's IPv6 address to plan them".into());
        }
        HostAddress {
            ip: IpAddr::from([10, 0, 0, 1]),
            ipv6: false,
        }
    } else {
        pod_facts::host_address(&pod_ips, dual_stack)
            .ok_or_else(|| Error::NoPodAddress(pod_ips.clone()))?
    };
    let (cfg, rs) = rules(decision, &mut s, &host, &nameservers, &mut notes)?;
    let out = flows
        .iter()
        .map(|f| explain(f, &rs, &cfg, &pod_ips))
        .collect();
    Ok((out, notes))
}

/// The addresses of an optional flag.
fn ip_arg(
    r: &redirect_core::cli::flags::Resolved,
    flag: &'static str,
) -> Result<Vec<IpAddr>, Error> {
    match args::get(&r.matches, flag) {
        Some(v) => args::ip_list(flag, v),
        None => Ok(Vec::new()),
    }
}

/// The config and rules the flows meet: the pod's, when a pod file decided it (a pod outside
/// the mesh has none: every flow meets an empty ruleset), else Istio's flags'.
pub(crate) fn rules(
    decision: Option<Decision>,
    s: &mut Settings,
    host: &HostAddress,
    nameservers: &[IpAddr],
    notes: &mut Vec<String>,
) -> Result<(CaptureConfig, Ruleset), Error> {
    match decision {
        Some(Decision::Capture {
            config, warnings, ..
        }) => {
            notes.extend(warnings);
            let config = config.with_ipv6(host.ipv6);
            let rs = config.plan(&redirect_core::SystemGroups)?;
            Ok((config.into_inner(), rs))
        }
        Some(Decision::Skip(why)) => {
            notes.push(format!(
                "the pod is not captured ({why}): redirect-cni writes no rules for it, so no flow is captured"
            ));
            Ok((s.config.clone().into_inner(), Ruleset::default()))
        }
        Some(Decision::NeedSpec(why)) => {
            unreachable!("pod_file::decision returns it as an error: {why}")
        }
        None => {
            notes.extend(args::finish(s, host, nameservers)?);
            let rs = s.config.plan(&redirect_core::SystemGroups)?;
            Ok((s.config.clone().into_inner(), rs))
        }
    }
}

/// One flow through `rs`. The pod's own address is reached through lo, as the kernel routes
/// it.
fn explain(flow: &Flow, rs: &Ruleset, cfg: &CaptureConfig, pod_ips: &[IpAddr]) -> Explained {
    let mut f = flow.clone();
    if f.direction == eval::Direction::Out && f.oif.is_none() && pod_ips.contains(&f.dst.ip()) {
        f.oif = Some("lo".into());
    }
    let evaluation = eval::evaluate(rs, &f);
    let meaning = meaning(&evaluation, cfg);
    Explained {
        evaluation,
        meaning,
    }
}

/// What the verdict means for the mesh.
fn meaning(e: &Evaluation, cfg: &CaptureConfig) -> String {
    let orig = e.flow.dst;
    let port = match &e.verdict {
        Verdict::Redirect { port, .. } | Verdict::Tproxy { port, .. } => *port,
        Verdict::Pass => return format!("not captured: goes to {orig} directly"),
        Verdict::Drop => return "dropped".into(),
    };
    let who = if port == cfg.envoy_port {
        "the proxy's outbound listener (-p)"
    } else if port == cfg.inbound_capture_port {
        "the proxy's inbound listener (-z)"
    } else if port == DNS_AGENT_PORT {
        "the DNS proxy of istio-agent"
    } else {
        "a local listener"
    };
    format!("captured: {who} on port {port} gets it, with original destination {orig}")
}

fn text(out: &[Explained], all: bool) -> String {
    let mut s = String::new();
    for (i, x) in out.iter().enumerate() {
        if i > 0 {
            s.push('\n');
        }
        let e = &x.evaluation;
        s += &format!("flow:    {}\n", e.flow);
        s += &format!("verdict: {}\n", e.verdict);
        s += &format!("         {}\n", x.meaning);
        if e.mark != e.flow.mark {
            s += &format!("mark:    {:#x}\n", e.mark);
        }
        if let Some(z) = e.ct_zone {
            s += &format!("ct zone: {z}\n");
        }
        let shown: Vec<_> = e.steps.iter().filter(|st| all || st.matched).collect();
        if shown.is_empty() {
            s += "path:    no rule matched\n";
        } else {
            s += "path:\n";
            for st in shown {
                let mark = if st.matched { "" } else { "(no match) " };
                s += &format!("  {mark}{st}\n");
            }
        }
        for n in &e.notes {
            s += &format!("note:    {n}\n");
        }
    }
    s
}
