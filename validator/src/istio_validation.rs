//! The default mode: Istio's validation probe, run as Istio's `istio-validation` container runs
//! it (same flags, unprivileged, as the proxy UID), with a diagnosis when it fails.

use redirect_program::logging::stderr_line;
use std::ffi::OsString;

use redirect_core::pod_facts;
use redirect_core::probe::{self, Diagnosis, ProbeFailure};
use serde::Serialize;

use crate::args;
use crate::Error;
use crate::{EXIT_ERROR, EXIT_OK, EXIT_VALIDATION};

const ABOUT: &str = "Checks that a pod's traffic capture works, as Istio's istio-validation does (same flags, exit 126 on failure), and says why it does not";

/// Istio's words, kept for people and tools that search logs for them.
const ISTIO_FAILED: &str = "iptables validation failed; workload is not ready for Istio. When using Istio CNI, this can occur if a pod is scheduled before the node is ready. If installed with 'cni.repair.deletePods=true', this pod should automatically be deleted and retry. Otherwise, this pod will need to be manually removed so that it is scheduled on a node with istio-cni running, allowing iptables rules to be established.";
const ISTIO_PASSED: &str = "Validation passed, iptables rules established";

#[derive(Serialize)]
struct Report {
    passed: bool,
    exit_code: i32,
    uid: u32,
    gid: u32,
    /// `127.0.0.6:15002` or `[::6]:15002`.
    target: String,
    listener_port: Option<u16>,
    elapsed_ms: u128,
    message: String,
    diagnosis: Option<Diagnosis>,
    warnings: Vec<String>,
}

pub fn main(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    let extra = vec![args::switch(
        "json",
        "Print one JSON object on stdout (passed, exit_code, diagnosis{cause,summary,fix,evidence}, ...)",
    )];
    let r = match args::parse("redirect-validate", ABOUT, extra, args, env) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let logs = redirect_core::cli::flags::log_flags(&r);
    if let Err(msg) = logs.and_then(|l| {
        redirect_program::logging::install_istio_flags(l.as_json, l.output_level.as_deref())
    }) {
        stderr_line("error", &msg);
        return EXIT_ERROR;
    }
    let json = r.matches.get_flag("json");
    match run(&r) {
        Ok(report) => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("report serializes")
                );
            } else {
                print_text(&report);
            }
            report.exit_code
        }
        Err(msg) => {
            stderr_line("error", &redirect_program::errors::chain(&msg));
            if json {
                println!(
                    "{}",
                    serde_json::json!({"passed": false, "exit_code": EXIT_ERROR, "error": redirect_program::errors::chain(&msg)})
                );
            }
            EXIT_ERROR
        }
    }
}

fn run(r: &redirect_core::cli::flags::Resolved) -> Result<Report, Error> {
    let mut s = args::settings(r)?;
    // Istio probes the family of the pod's address.
    let addresses = redirect_core::Namespace::current()?.addresses()?;
    let host = pod_facts::detect_host_address(&addresses, s.dual_stack)?;
    let nameservers = if s.wants_nameservers() {
        args::nameservers_of(std::path::Path::new("/etc/resolv.conf")).unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut warnings = args::finish(&mut s, &host, &nameservers)?;
    let spec = s.probe_spec(host.ip.is_ipv6());
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let target = spec.target().to_string();
    match probe::run(&spec) {
        Ok(ok) => {
            warnings.extend(ok.listen_errors.iter().map(|(p, e)| {
                format!(
                    "could not listen on port {p} ({e}); the probe passed on port {}",
                    ok.listener_port
                )
            }));
            Ok(Report {
                passed: true,
                exit_code: EXIT_OK,
                uid,
                gid,
                target,
                listener_port: Some(ok.listener_port),
                elapsed_ms: ok.elapsed.as_millis(),
                message: ISTIO_PASSED.into(),
                diagnosis: None,
                warnings,
            })
        }
        Err(failure) => {
            let facts = probe::gather_facts(&spec, &failure, &s.config);
            let elapsed = match &failure {
                ProbeFailure::Timeout { after, .. } => after.as_millis(),
                ProbeFailure::NoListener { .. } => 0,
            };
            let diagnosis = probe::diagnose(&failure, &facts);
            Ok(Report {
                passed: false,
                exit_code: EXIT_VALIDATION,
                uid,
                gid,
                target,
                listener_port: None,
                elapsed_ms: elapsed,
                message: ISTIO_FAILED.into(),
                diagnosis: Some(diagnosis),
                warnings,
            })
        }
    }
}

fn print_text(r: &Report) {
    for w in &r.warnings {
        stderr_line("warn", &w.to_string());
    }
    match &r.diagnosis {
        None => stderr_line(
            "info",
            &format!(
                "{} (probe to {} as uid {} redirected to port {} in {} ms)",
                r.message,
                r.target,
                r.uid,
                r.listener_port.unwrap_or_default(),
                r.elapsed_ms
            ),
        ),
        Some(d) => {
            stderr_line("error", &r.message);
            stderr_line("error", &format!("diagnosis: {}: {}", d.cause, d.summary));
            stderr_line("error", &format!("fix: {}", d.fix));
            for e in &d.evidence {
                stderr_line("error", &format!("evidence: {e}"));
            }
        }
    }
}
