//! docs/redirect-validate.md documents everything redirect-validate accepts: each mode's own
//! flags (probe, `inspect`, `explain`) in that mode's section, Istio's flags and variables
//! (here or in docs/redirect-init.md, which the page links), and every exit code; and every
//! flag the page names still exists.

use std::collections::BTreeSet;

use redirect_testkit::docs::*;

use redirect_core::cli::flags::{env_names, FLAGS};

const PAGE: &str = "docs/redirect-validate.md";
/// Istio's flags are documented there; the validate page links it.
const ISTIO_PAGE: &str = "docs/redirect-init.md";
const BIN: &str = env!("CARGO_BIN_EXE_redirect-validate");

/// The modes: subcommand words and the heading of the page's section about them.
const MODES: &[(&[&str], &str)] = &[
    (&[], "## The probe"),
    (&["inspect"], "## inspect"),
    (&["explain"], "## explain"),
    (&["trace"], "## trace"),
    (&["node"], "## node"),
];

// ---- the checks ----

fn is_istio_flag(long: &str) -> bool {
    FLAGS.iter().any(|f| f.long && f.key == long)
}

fn mode_name(sub: &[&str]) -> String {
    std::iter::once("redirect-validate")
        .chain(sub.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first word of the first cell of each row of a section's "own flag" table.
fn own_flag_rows(section: &str) -> Vec<String> {
    table_rows(section, &["own flag"])
        .iter()
        .map(|r| {
            r[0].trim_matches('`')
                .split([' ', '='])
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn each_mode_documents_its_own_flags_in_its_section() {
    let doc = read(PAGE);
    let mut missing = Vec::new();
    for (sub, heading) in MODES {
        let help = run_help(BIN, sub);
        let rows = own_flag_rows(section(&doc, heading));
        for l in help.documented_longs().filter(|l| !is_istio_flag(l)) {
            if !rows.contains(&format!("--{l}")) {
                missing.push(format!(
                    "--{l} (of `{}`): no row in the own-flag table of section {heading:?}",
                    mode_name(sub)
                ));
            }
        }
    }
    fail_if_any(missing, &format!("own flags not documented in {PAGE}"));
}

#[test]
fn istio_flags_and_variables_are_documented() {
    let doc = read(PAGE);
    let istio = read(ISTIO_PAGE);
    let documented = |item: &str| in_backticks(&doc, item) || in_backticks(&istio, item);
    let mut missing = BTreeSet::new();
    for (sub, _) in MODES {
        let help = run_help(BIN, sub);
        for l in help.documented_longs().filter(|l| is_istio_flag(l)) {
            if !documented(&format!("--{l}")) {
                missing.insert(format!("--{l}"));
            }
        }
        for s in help.documented_shorts() {
            if !documented(&format!("-{s}")) {
                missing.insert(format!("-{s}"));
            }
        }
        for e in help
            .envs
            .iter()
            .cloned()
            .chain(env_names().map(str::to_string))
        {
            if !documented(&e) {
                missing.insert(e);
            }
        }
    }
    fail_if_any(
        missing.into_iter().collect(),
        &format!("Istio flags or variables of redirect-validate documented neither in {PAGE} nor in {ISTIO_PAGE}"),
    );
}

#[test]
fn every_flag_the_page_names_exists() {
    let doc = read(PAGE);
    let mut gone = Vec::new();
    for (sub, heading) in MODES {
        let help = run_help(BIN, sub);
        for flag in own_flag_rows(section(&doc, heading)) {
            if !help.longs.contains(flag.trim_start_matches('-')) {
                gone.push(format!(
                    "{flag}: in the own-flag table of {heading:?}, not accepted by `{}`",
                    mode_name(sub)
                ));
            }
        }
    }
    let helps: Vec<Help> = MODES.iter().map(|(sub, _)| run_help(BIN, sub)).collect();
    for flag in long_flags_named(&doc) {
        let known = helps.iter().any(|h| h.longs.contains(&flag[2..]))
            || MODES.iter().any(|(sub, _)| accepts(BIN, sub, &flag));
        if !known {
            gone.push(format!("{flag}: accepted by no mode"));
        }
    }
    fail_if_any(
        gone,
        &format!("flags named in {PAGE} that redirect-validate does not accept"),
    );
}

#[test]
fn every_exit_code_is_documented() {
    let doc = read(PAGE);
    let documented: BTreeSet<String> = table_rows(&doc, &["code", "exit"])
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    let consts = exit_constants("validator/src/lib.rs");
    let missing = consts
        .iter()
        .filter(|(_, n)| !documented.contains(&n.to_string()))
        .map(|(name, n)| format!("{n} ({name})"))
        .collect();
    fail_if_any(
        missing,
        &format!(
            "exit codes of validator/src/lib.rs without a row in an exit code table of {PAGE}"
        ),
    );
    let unknown = documented
        .iter()
        .filter(|d| !consts.iter().any(|(_, n)| n.to_string() == **d))
        .cloned()
        .collect();
    fail_if_any(
        unknown,
        &format!("exit codes in {PAGE} that validator/src/lib.rs does not define"),
    );
}
