//! What redirect-init does once its settings are typed: derive, then one of cleanup, dry-run
//! or apply, then optionally the validation probe. Logs go to stderr; stdout carries only the
//! ruleset (the dry-run output, or what was applied).

use std::io::Write;

use tracing::{info, warn};

use redirect_core::error::MissingFeature;
use redirect_core::foreign::{describe, Foreign, Ours, OursBefore};
use redirect_core::pod_facts::{self, HostAddress};
use redirect_core::probe;
use redirect_core::render::{iptables_restore_all, nft_script};
use redirect_core::view::{kernel_counts, routing_of, TABLE};
use redirect_core::{Apply, Capture, Error, Namespace, Ruleset, SystemGroups};

use crate::report;
use redirect_core::cli::settings::{self, Backend, DryRunFormat, Settings};

/// Istio's exit code for success (also after `--help` and `--version`).
pub const EXIT_OK: i32 = 0;
/// Istio's exit code for any flag, config or apply error.
pub const EXIT_ERROR: i32 = 1;
/// Istio's exit code for a failed validation probe (`--run-validation`).
pub const EXIT_VALIDATION: i32 = 126;

/// A failure and the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    /// The exit code: [`EXIT_ERROR`], or [`EXIT_VALIDATION`] when the probe failed.
    pub code: i32,
    /// What went wrong, logged as the first error line.
    pub message: String,
    /// Lines logged after the message, each an error line of its own (a log line is one
    /// event: see `redirect_program::logging`).
    pub details: Vec<String>,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e.missing_feature() {
            Some(m) => fail(m.message_with(Some(&iptables_way_out(m)))),
            None => fail(e.to_string()),
        }
    }
}

/// The way out of a kernel that lacks an nftables feature: our iptables backend, and the
/// xtables module that does the same job.
pub fn iptables_way_out(m: &MissingFeature) -> String {
    let instead = match m.features.first().map(|f| f.module.as_ref()) {
        Some("nft_tproxy") => "istio-iptables' TPROXY target, module xt_TPROXY",
        Some("nft_redir") => "istio-iptables' REDIRECT target, module xt_REDIRECT",
        Some("nft_nat" | "nft_chain_nat") => "iptables' nat table, module iptable_nat",
        Some("nft_ct") => {
            "iptables' conntrack matches and targets, modules xt_conntrack, xt_connmark, xt_CT"
        }
        _ => "iptables-restore, with the host's iptables",
    };
    format!("use --backend iptables ({instead})")
}

impl From<redirect_core::error::ConfigError> for Failure {
    fn from(e: redirect_core::error::ConfigError) -> Self {
        Error::from(e).into()
    }
}

fn fail(message: String) -> Failure {
    Failure {
        code: EXIT_ERROR,
        message,
        details: Vec::new(),
    }
}

/// Run in the current namespace (the caller entered `--network-namespace` already).
pub fn run(s: Settings) -> Result<(), Failure> {
    run_with(s, &Namespace::current()?)
}

/// Run on `t`: the kernel (`run`), or a fake namespace in a test.
pub fn run_with(mut s: Settings, t: &Namespace) -> Result<(), Failure> {
    let host = if s.cleanup_only {
        None
    } else {
        Some(pod_facts::detect_host_address(
            &t.addresses()?,
            s.dual_stack,
        )?)
    };
    let (user_uid, nameservers, ignored) = settings::system_facts(&s)?;
    ignored.iter().for_each(|w| warn!("{w}"));
    if let Some(h) = &host {
        for w in s.finish(h, user_uid, &nameservers)? {
            warn!("{w}");
        }
        info!(
            "pod address {} ({})",
            h.ip,
            if h.ipv6 { "IPv6 rules on" } else { "IPv4 only" }
        );
    }
    crate::report::print(&report::variables(&s));

    if s.cleanup_only {
        return cleanup(&s, t);
    }
    let host = host.expect("derived above unless cleanup-only");
    let rs = s.config.plan(&SystemGroups)?;
    if s.dry_run {
        return dry_run(&s, &rs);
    }
    if s.skip_rule_apply {
        info!("--skip-rule-apply: programming nothing");
    } else {
        match s.backend {
            Backend::Native => apply_native(&s, &rs, t)?,
            Backend::Iptables => apply_iptables(&s, &rs, t)?,
        }
    }
    if s.run_validation {
        validate(&s, &host)?;
    }
    Ok(())
}

/// `--cleanup-only`: ours (table, routes, `::6`) and Istio's (nft tables, ISTIO_* chains).
fn cleanup(s: &Settings, t: &Namespace) -> Result<(), Failure> {
    if s.dry_run {
        let table = t.read(&Capture::Sidecar(s.config.clone()))?.is_some();
        let istio = t.foreign()?;
        info!(
            "--dry-run: would remove: our table: {}; Istio nft tables: {:?}; Istio iptables chains: {}",
            table,
            istio.nft_tables,
            describe(&istio.chains)
        );
        return Ok(());
    }
    let (done, istio) = t.clean_up_all(&routing_of(&s.config))?;
    info!(
        "cleanup: our table removed: {}; TPROXY routing removed: {:?}; ::6 removed from lo: {}; Istio nft tables removed: {:?}; Istio iptables chains removed: {}",
        done.table,
        done.tproxy,
        done.lo_v6,
        istio.nft_tables,
        describe(&istio.chains)
    );
    Ok(())
}

fn dry_run(s: &Settings, rs: &Ruleset) -> Result<(), Failure> {
    let text = match s.dry_run_format {
        DryRunFormat::Nft => nft_script(rs),
        DryRunFormat::Iptables => {
            let (v4, v6) = iptables_restore_all(rs);
            match v6 {
                Some(v6) => format!("{v4}{IP6TABLES_MARKER}\n{v6}"),
                None => v4,
            }
        }
        DryRunFormat::Json => {
            let doc = serde_json::json!({ "config": s.config, "ruleset": rs });
            serde_json::to_string_pretty(&doc).expect("serializable") + "\n"
        }
    };
    if let Some(path) = &s.dry_run_file {
        std::fs::write(path, &text).map_err(|e| {
            fail(format!(
                "cannot write DRY_RUN_FILE_PATH {}: {e}",
                path.display()
            ))
        })?;
    }
    print_stdout(&text);
    Ok(())
}

/// Separates the IPv4 and IPv6 iptables-restore inputs in `--dry-run-format iptables`.
pub const IP6TABLES_MARKER: &str = "# ---- ip6tables-restore input ----";

fn print_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// istio-iptables' flags as the one apply's policy: `--reconcile` replaces Istio's rules and
/// ours for another config; `--force-apply` ours only; neither refuses both.
fn policy(s: &Settings) -> Apply {
    Apply {
        foreign: if s.reconcile {
            Foreign::Replace
        } else {
            Foreign::Refuse
        },
        ours: if s.reconcile || s.force_apply {
            Ours::Replace
        } else {
            Ours::RefuseOther
        },
    }
}

fn apply_native(s: &Settings, rs: &Ruleset, t: &Namespace) -> Result<(), Failure> {
    let done = t.apply_with(&Capture::Sidecar(s.config.clone()), policy(s))?;
    let removed_istio = !done.foreign_removed.is_empty();
    if done.ours_before == OursBefore::Equal && !removed_istio {
        info!("the rules are already in place; nothing to apply (--force-apply reapplies)")
    } else {
        // Counted as the kernel holds them (with the per-family dispatch of the hooked
        // chains), so the numbers are the ones `inspect` shows.
        let (rules, chains) = kernel_counts(rs);
        info!("applied {rules} rules in {chains} chains to table inet {TABLE} in one transaction");
        if removed_istio {
            info!(
                "--reconcile: removed Istio's nft tables {:?} and iptables chains {}",
                done.foreign_removed.nft_tables,
                describe(&done.foreign_removed.chains)
            );
        }
    }
    print_stdout(&nft_script(rs));
    Ok(())
}

fn apply_iptables(s: &Settings, rs: &Ruleset, t: &Namespace) -> Result<(), Failure> {
    let done = t.apply_iptables(&s.config, policy(s), s.force_iptables_binary)?;
    if !done.foreign_removed.is_empty() {
        info!("--reconcile: removed {}", describe(&done.foreign_removed));
    }
    if done.removed_our_table {
        info!("--reconcile: removed our nft table {TABLE}");
    }
    for t in &done.tools {
        info!(
            "applied {} rules with {} ({} {}, {})",
            t.family, t.restore, t.variant, t.version, t.save
        );
    }
    let (v4, v6) = iptables_restore_all(rs);
    print_stdout(&v4);
    if let Some(v6) = v6 {
        print_stdout(&format!("{IP6TABLES_MARKER}\n{v6}"));
    }
    Ok(())
}

/// Istio's probe; its failure is exit 126 with what the probe saw and what to check.
fn validate(s: &Settings, host: &HostAddress) -> Result<(), Failure> {
    let spec = s.probe_spec(host.ip.is_ipv6());
    info!(
        "validation: connecting to {}:{} as uid {}, expecting a redirect to port {} or {}",
        if spec.ipv6 { "[::6]" } else { "127.0.0.6" },
        spec.probe_port,
        nix_uid(),
        spec.envoy_port,
        spec.inbound_capture_port
    );
    match probe::run(&spec) {
        Ok(ok) => {
            info!(
                "Validation passed, iptables rules established (redirected to port {} in {} ms)",
                ok.listener_port,
                ok.elapsed.as_millis()
            );
            Ok(())
        }
        Err(e) => {
            let d = redirect_core::probe::diagnose(
                &e,
                &redirect_core::probe::gather_facts(&spec, &e, &s.config),
            );
            Err(Failure {
                code: EXIT_VALIDATION,
                message: format!(
                    "iptables validation failed; workload is not ready for Istio: {e}"
                ),
                details: vec![
                    format!("diagnosis: {}: {}", d.cause, d.summary),
                    format!("fix: {}", d.fix),
                ],
            })
        }
    }
}

fn nix_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}
