//! docs/redirect-init.md documents everything redirect-init accepts: every flag (long and
//! short) and variable of `redirect-init --help` and of `FLAGS` (environment-only settings
//! included), and every exit code; and every flag the page names still exists.

use std::collections::BTreeSet;

use redirect_testkit::docs::*;

use init_shim::flags::{env_names, FLAGS};

const PAGE: &str = "docs/redirect-init.md";
const BIN: &str = env!("CARGO_BIN_EXE_redirect-init");

// ---- the checks ----

#[test]
fn every_flag_of_help_is_documented() {
    let doc = read(PAGE);
    let help = run_help(BIN, &[]);
    let mut missing = Vec::new();
    for l in help.documented_longs() {
        if !in_backticks(&doc, &format!("--{l}")) {
            missing.push(format!("--{l}"));
        }
    }
    for s in help.documented_shorts() {
        if !in_backticks(&doc, &format!("-{s}")) {
            missing.push(format!("-{s}"));
        }
    }
    fail_if_any(
        missing,
        &format!("flags of `redirect-init --help` not documented (in backticks) in {PAGE}"),
    );
}

#[test]
fn every_variable_is_documented() {
    let doc = read(PAGE);
    let help = run_help(BIN, &[]);
    let names: BTreeSet<String> = help
        .envs
        .iter()
        .cloned()
        .chain(env_names().map(str::to_string))
        .collect();
    let missing = names
        .into_iter()
        .filter(|n| !in_backticks(&doc, n))
        .collect();
    fail_if_any(
        missing,
        &format!("environment variables (`--help`, FLAGS) not documented (in backticks) in {PAGE}"),
    );
}

#[test]
fn flags_table_matches_flags_list() {
    // The table has one row per flag of FLAGS, with its short name and its variables.
    let doc = read(PAGE);
    let rows = table_rows(&doc, &["flag"]);
    let mut problems = Vec::new();
    for f in FLAGS.iter().filter(|f| f.long) {
        let long = format!("`--{}`", f.key);
        let Some(row) = rows.iter().find(|r| r[0].contains(&long)) else {
            problems.push(format!("--{}: no row in the flag table", f.key));
            continue;
        };
        if let Some(s) = f.short {
            if !row[0].contains(&format!("`-{s}`")) {
                problems.push(format!("--{}: row does not name `-{s}`", f.key));
            }
        }
        for e in f.env.iter().chain(f.aliases) {
            if !row[1].contains(&format!("`{e}`")) {
                problems.push(format!("--{}: row does not name variable `{e}`", f.key));
            }
        }
    }
    fail_if_any(problems, &format!("flag table of {PAGE}"));
}

#[test]
fn every_flag_the_page_names_exists() {
    let doc = read(PAGE);
    let help = run_help(BIN, &[]);
    let mut gone = Vec::new();
    for flag in long_flags_named(&doc) {
        let known = help.longs.contains(&flag[2..]) || accepts(BIN, &[], &flag);
        if !known {
            gone.push(flag);
        }
    }
    for row in table_rows(&doc, &["flag"]) {
        for span in row[0].split('`').skip(1).step_by(2) {
            if let Some(s) = span.strip_prefix('-').filter(|s| !s.starts_with('-')) {
                let c = s.chars().next().unwrap();
                if s.chars().count() != 1 || !help.shorts.contains(&c) {
                    gone.push(span.to_string());
                }
            }
        }
    }
    fail_if_any(
        gone,
        &format!("flags named in {PAGE} that redirect-init does not accept"),
    );
}

#[test]
fn every_exit_code_is_documented() {
    let doc = read(PAGE);
    let rows = table_rows(&doc, &["code", "exit"]);
    let documented: BTreeSet<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let consts = exit_constants("init-shim/src/run.rs");
    let missing = consts
        .iter()
        .filter(|(_, n)| !documented.contains(n.to_string().as_str()))
        .map(|(name, n)| format!("{n} ({name})"))
        .collect();
    fail_if_any(
        missing,
        &format!(
            "exit codes of init-shim/src/run.rs without a row in the exit code table of {PAGE}"
        ),
    );
    let unknown = documented
        .iter()
        .filter(|d| !consts.iter().any(|(_, n)| n.to_string() == **d))
        .map(|d| d.to_string())
        .collect();
    fail_if_any(
        unknown,
        &format!("exit codes in {PAGE} that init-shim/src/run.rs does not define"),
    );
}
