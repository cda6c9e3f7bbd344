//! Reading the reference pages and the binaries' `--help`, for the tests that check every
//! flag, variable, field, annotation and exit code is documented (each crate's
//! `tests/docs_reference.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root: the nearest folder above the test kit whose `Cargo.toml` declares the
/// workspace, so that no test hard-codes how deep its crate sits.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
        })
        .expect("the test kit is inside the workspace")
        .to_path_buf()
}

/// A file of the workspace, by relative path.
pub fn read(rel: &str) -> String {
    std::fs::read_to_string(workspace().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// What a clap `--help` lists.
#[derive(Debug, Default)]
pub struct Help {
    /// The long options, without their `--`.
    pub longs: BTreeSet<String>,
    /// The short options' letters.
    pub shorts: BTreeSet<char>,
    /// The environment variables of its `[env: ...]` notes.
    pub envs: BTreeSet<String>,
}

impl Help {
    /// clap's generated `-h, --help` and `-V, --version` are not documented per page.
    pub fn documented_longs(&self) -> impl Iterator<Item = &String> {
        self.longs
            .iter()
            .filter(|l| *l != "help" && *l != "version")
    }

    /// The short options but clap's generated `-h` and `-V`.
    pub fn documented_shorts(&self) -> impl Iterator<Item = &char> {
        self.shorts.iter().filter(|s| **s != 'h' && **s != 'V')
    }
}

/// Parse clap's help: option lines (`  -p, --envoy-port <VALUE>`, `      --dry-run[=<BOOL>]`,
/// indented at most 6 columns; descriptions are indented 10) and `[env: A, B]` notes.
pub fn parse_help(text: &str) -> Help {
    let mut h = Help::default();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with('-') && line.len() - t.len() <= 6 {
            let spec = t.split("  ").next().unwrap_or(t);
            for part in spec.split(", ") {
                let word: String = part
                    .chars()
                    .take_while(|c| !matches!(c, ' ' | '[' | '=' | '<'))
                    .collect();
                if let Some(l) = word.strip_prefix("--") {
                    h.longs.insert(l.to_string());
                } else if let Some(s) = word.strip_prefix('-') {
                    assert_eq!(s.chars().count(), 1, "odd option {part:?} in: {line}");
                    h.shorts.insert(s.chars().next().unwrap());
                }
            }
        }
        let mut rest = line;
        while let Some(i) = rest.find("[env: ") {
            let after = &rest[i + "[env: ".len()..];
            let end = after
                .find(']')
                .unwrap_or_else(|| panic!("unclosed [env: in {line}"));
            for name in after[..end].split(',') {
                h.envs.insert(name.trim().to_string());
            }
            rest = &after[end..];
        }
    }
    assert!(!h.longs.is_empty(), "no options parsed from help:\n{text}");
    h
}

/// `bin [args] --help`, parsed.
pub fn run_help(bin: &str, args: &[&str]) -> Help {
    let out = Command::new(bin).args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "{bin} {args:?} --help: {out:?}");
    parse_help(&String::from_utf8(out.stdout).unwrap())
}

/// Whether the binary accepts `--flag` (hidden aliases and flags included): `--flag=1 --help`
/// prints help only when clap knows the flag.
pub fn accepts(bin: &str, sub: &[&str], flag: &str) -> bool {
    Command::new(bin)
        .args(sub)
        .arg(format!("{flag}=1"))
        .arg("--help")
        .output()
        .unwrap()
        .status
        .success()
}

/// The page without its fenced code blocks (examples are not documentation).
pub fn prose(doc: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Every inline code span of the prose.
pub fn code_spans(text: &str) -> Vec<String> {
    prose(text)
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Whether `item` is written in backticks: the whole span, or its first word
/// (`` `--dry-run-format iptables` ``, `` `--log_output_level=default:info` ``).
pub fn in_backticks(text: &str, item: &str) -> bool {
    code_spans(text)
        .iter()
        .any(|s| s == item || s.split([' ', '=']).next() == Some(item))
}

/// The first word of every code span that starts with `--`.
pub fn long_flags_named(text: &str) -> BTreeSet<String> {
    code_spans(text)
        .iter()
        .filter(|s| s.starts_with("--") && s.len() > 2)
        .map(|s| s.split([' ', '=']).next().unwrap().to_string())
        .collect()
}

/// The rows (cells, trimmed) of every table whose header's first cell is one of `headers`.
pub fn table_rows(text: &str, headers: &[&str]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    let mut header_seen = false;
    for line in prose(text).lines() {
        let t = line.trim();
        if !t.starts_with('|') {
            in_table = false;
            header_seen = false;
            continue;
        }
        let cells: Vec<String> = t
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect();
        if !header_seen {
            header_seen = true;
            in_table = headers.contains(&cells[0].as_str());
            continue;
        }
        if in_table && !cells[0].starts_with("---") {
            rows.push(cells);
        }
    }
    rows
}

/// `pub const EXIT_*: i32 = N;` in a source file: (name, N).
pub fn exit_constants(rel: &str) -> Vec<(String, i32)> {
    let src = read(rel);
    let found: Vec<(String, i32)> = src
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const EXIT_"))
        .map(|l| {
            let (name, rest) = l.split_once(':').unwrap();
            let n = rest.split('=').nth(1).unwrap().trim().trim_end_matches(';');
            (format!("EXIT_{name}"), n.parse().unwrap())
        })
        .collect();
    assert!(!found.is_empty(), "no EXIT_ constants in {rel}");
    found
}

/// Fail listing `missing` under `what`, if any.
pub fn fail_if_any(missing: Vec<String>, what: &str) {
    assert!(missing.is_empty(), "{what}:\n  {}", missing.join("\n  "));
}

/// Paragraphs and list items of the prose.
pub fn paragraphs(text: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    for line in prose(text).lines() {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with("- ") || t.starts_with('|') || t.starts_with('#') {
            out.push(String::new());
        }
        let last = out.last_mut().unwrap();
        last.push_str(line);
        last.push('\n');
    }
    out
}

/// The page's section under `heading` (up to the next `## `).
pub fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(&format!("\n{heading}"))
        .unwrap_or_else(|| panic!("the page has no section {heading:?}"))
        + 1;
    let end = doc[start + 3..]
        .find("\n## ")
        .map_or(doc.len(), |i| start + 3 + i + 1);
    &doc[start..end]
}
