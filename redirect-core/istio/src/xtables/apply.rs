//! Loading a ruleset with `<restore> --noflush`, one input per family.
//!
//! iptables-restore commits table by table, and v4 and v6 are two processes, so a failure
//! half-way would leave part of the rules in place. Hence, *before* anything is written:
//! binaries for every family are chosen; any Istio leftover in any family or variant refuses
//! the apply (Istio's rules would stay active beside ours, and Istio's own `-N` would fail on
//! its chains: the usual failure, caught without touching anything); any other chain the input
//! creates must not exist yet. If a restore still fails, every table written so far is put
//! back as `-save` printed it before (a restore without `--noflush` of those tables only).

use super::detect::detect;
use super::exec::{blamed_line, run, spawn_failure, tool_error};
use super::save::{parse, SavedTable};
use super::{Tool, Variant};
use crate::error::Result;
use redirect_model::render::iptables_restore;
use redirect_model::Ruleset;

/// One family's work: the tool, its input, and the tables as they were.
struct Step {
    tool: Tool,
    input: String,
    before: Vec<SavedTable>,
}

pub(crate) fn apply(rs: &Ruleset, force: Option<Variant>) -> Result<Vec<Tool>> {
    let tools = rs
        .families()
        .into_iter()
        .map(|f| detect(f, force))
        .collect::<Result<Vec<Tool>>>()?;
    let Some(first) = tools.first() else {
        return Ok(tools);
    };
    let found = super::find_istio_leftovers()?;
    if !found.is_empty() {
        let names: Vec<String> = found
            .iter()
            .map(|l| format!("{} {} {}/{}", l.family, l.variant, l.table, l.chain))
            .collect();
        return Err(refusal(first, &names));
    }
    let mut steps = Vec::new();
    for tool in tools {
        let input = iptables_restore(rs, tool.family);
        let before = save(&tool)?;
        check_free(&tool, &input, &before)?;
        steps.push(Step {
            tool,
            input,
            before,
        });
    }
    for (i, step) in steps.iter().enumerate() {
        if let Err(why) = restore(&step.tool, &step.input, true) {
            let undo: Vec<String> = steps[..=i].iter().map(roll_back).collect();
            return Err(tool_error(
                &step.tool.restore,
                format!("{why}; {}", undo.join("; ")),
            ));
        }
    }
    Ok(steps.into_iter().map(|s| s.tool).collect())
}

fn save(tool: &Tool) -> Result<Vec<SavedTable>> {
    let out = run(&tool.save, &[], None)
        .map_err(|e| tool_error(&tool.save, spawn_failure(&tool.save, &e)))?;
    if !out.ok {
        return Err(tool_error(&tool.save, out.failure()));
    }
    Ok(parse(&out.stdout))
}

/// The tables an input writes (`*nat` lines), in order.
fn tables_of(input: &str) -> Vec<&str> {
    input
        .lines()
        .filter_map(|l| l.strip_prefix('*'))
        .map(str::trim)
        .collect()
}

/// Refuses when a chain the input creates exists already in the table it goes to.
fn check_free(tool: &Tool, input: &str, before: &[SavedTable]) -> Result<()> {
    let mut table = "";
    let mut taken = Vec::new();
    for line in input.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim();
        } else if let Some(chain) = line.strip_prefix("-N ") {
            let chain = chain.trim();
            if before.iter().any(|s| s.name == table && s.has_chain(chain)) {
                taken.push(format!("{} {} {table}/{chain}", tool.family, tool.variant));
            }
        }
    }
    if taken.is_empty() {
        return Ok(());
    }
    Err(refusal(tool, &taken))
}

fn refusal(tool: &Tool, chains: &[String]) -> crate::error::Error {
    tool_error(
        &tool.restore,
        format!(
            "not run: the namespace already has capture chains or rules ({}): Istio's, or an \
             earlier run's; remove them first (remove_istio_leftovers, i.e. the init binary's \
             cleanup) and apply again",
            chains.join(", ")
        ),
    )
}

/// Runs the tool's restore; `noflush` false replaces the tables the input names.
fn restore(tool: &Tool, input: &str, noflush: bool) -> std::result::Result<(), String> {
    let mut args = Vec::new();
    if noflush {
        args.push("--noflush");
    }
    if tool.lock_wait {
        args.push("--wait=30");
    }
    let out =
        run(&tool.restore, &args, Some(input)).map_err(|e| spawn_failure(&tool.restore, &e))?;
    if out.ok {
        return Ok(());
    }
    let blamed = blamed_line(&out.stderr, input)
        .map(|b| format!("; {b}"))
        .unwrap_or_default();
    Err(format!(
        "{} {} ({}, {}): {}{blamed}",
        tool.restore,
        args.join(" "),
        tool.family,
        tool.variant,
        out.failure()
    ))
}

/// Puts back the tables a step wrote, as they were; says what happened.
fn roll_back(step: &Step) -> String {
    let tables = tables_of(&step.input);
    let mut input = String::new();
    for t in &tables {
        match step.before.iter().find(|s| s.name == *t) {
            Some(saved) => input.push_str(&saved.raw),
            // The table did not exist: leave it empty.
            None => input.push_str(&format!("*{t}\nCOMMIT\n")),
        }
    }
    let what = format!(
        "{} tables {} ({})",
        step.tool.family,
        tables.join(", "),
        step.tool.variant
    );
    match restore(&step.tool, &input, false) {
        Ok(()) => format!("rolled back: {what} restored as they were"),
        Err(why) => format!(
            "ROLL-BACK FAILED for {what}: {why}; part of the rules may be in place, remove \
             them with remove_istio_leftovers"
        ),
    }
}
