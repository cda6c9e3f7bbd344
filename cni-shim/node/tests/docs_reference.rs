//! docs/deploy/README.md's "Settings" table documents every flag and variable of
//! `redirect-cni-node`, and every one the page names exists; docs/repair.md describes every
//! metric the agent exposes, and every metric it names exists.

use std::collections::BTreeSet;

use cni_testkit::node_bin;
use redirect_testkit::docs::*;

const DEPLOY: &str = "docs/deploy/README.md";

#[test]
fn installer_settings_table_documents_every_flag_and_variable() {
    let doc = read(DEPLOY);
    let help = run_help(node_bin(), &[]);
    let rows = table_rows(&doc, &["variable"]);
    assert!(
        !rows.is_empty(),
        "{DEPLOY} has no Settings table (header `| variable | flag |`)"
    );
    let cell_has = |col: usize, item: &str| rows.iter().any(|r| in_backticks(&r[col], item));
    let mut missing = Vec::new();
    for l in help.documented_longs() {
        if !cell_has(1, &format!("--{l}")) {
            missing.push(format!("--{l}"));
        }
    }
    for s in help.documented_shorts() {
        if !cell_has(1, &format!("-{s}")) {
            missing.push(format!("-{s}"));
        }
    }
    for e in &help.envs {
        if !cell_has(0, e) {
            missing.push(e.clone());
        }
    }
    fail_if_any(missing, &format!("flags and variables of `redirect-cni-node --help` without a row in the Settings table of {DEPLOY}"));
}

/// Each row's default is the one `--help` shows: a flag whose help gives a default in words
/// (`(default: redirect-cni beside this executable)`) has those words in its row, and one
/// with a value (`[default: "5s"]`) has that value.
#[test]
fn each_settings_default_is_the_one_help_shows() {
    let doc = read(DEPLOY);
    let text = std::process::Command::new(node_bin())
        .arg("--help")
        .output()
        .unwrap()
        .stdout;
    let text = String::from_utf8_lossy(&text);
    let rows = table_rows(&doc, &["variable"]);
    let mut wrong = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(flag) = line.trim().strip_prefix("--") else {
            continue;
        };
        let flag = flag.split([' ', '[', '<']).next().unwrap_or("");
        let Some(help) = lines.peek().map(|l| l.trim().to_string()) else {
            break;
        };
        let Some(row) = rows
            .iter()
            .find(|r| in_backticks(&r[1], &format!("--{flag}")))
        else {
            continue;
        };
        let cell = row[2].replace('`', "");
        if let Some(value) = help
            .rsplit_once("[default: \"")
            .and_then(|(_, v)| v.strip_suffix("\"]"))
            .filter(|v| !v.is_empty())
        {
            if !cell.contains(value) {
                wrong.push(format!(
                    "--{flag}: the page says {cell:?}, --help {value:?}"
                ));
            }
        }
        if flag == "binary" {
            // Issue 39: the page said "this executable"; the agent copies the plugin beside it.
            let words = help
                .split_once("(default: ")
                .and_then(|(_, w)| w.split_once(')'))
                .map(|(w, _)| w.to_string())
                .unwrap_or_default();
            if words.is_empty() || !cell.contains(&words) {
                wrong.push(format!(
                    "--binary: the page says {cell:?}, --help {words:?}"
                ));
            }
        }
    }
    fail_if_any(
        wrong,
        &format!("defaults in {DEPLOY} that differ from --help"),
    );
}

/// The ambient section's step for ztunnel's folder gives the snippet to copy (the plain
/// manifests have no such mount), with the path ztunnel looks at.
#[test]
fn the_ambient_steps_give_the_ztunnel_mount_to_copy() {
    let doc = read(DEPLOY);
    let ambient = section(&doc, "## Ambient mode");
    for needle in [
        "mountPath: /var/run/ztunnel",
        "path: /var/run/ztunnel",
        "type: DirectoryOrCreate",
    ] {
        assert!(
            ambient.contains(needle),
            "{DEPLOY}'s ambient section lacks {needle:?}"
        );
    }
    let manifest = read("deploy/kubernetes/redirect-cni.yaml");
    assert!(
        !manifest.contains("/var/run/ztunnel"),
        "the plain manifest mounts ztunnel's folder now: the step should say so"
    );
}

#[test]
fn every_installer_flag_and_variable_the_page_names_exists() {
    let doc = read(DEPLOY);
    let help = run_help(node_bin(), &[]);
    let mut gone = Vec::new();
    for flag in long_flags_named(&doc) {
        if !help.longs.contains(&flag[2..]) && !accepts(node_bin(), &[], &flag) {
            gone.push(flag);
        }
    }
    for row in table_rows(&doc, &["variable"]) {
        for v in row[0].split('`').skip(1).step_by(2) {
            if !help.envs.contains(v) {
                gone.push(format!("variable {v}"));
            }
        }
    }
    fail_if_any(
        gone,
        &format!("flags or variables in {DEPLOY} that `redirect-cni-node` does not read"),
    );
}

/// Every metric the agent exposes (each family, once it has a sample) is described in
/// docs/repair.md, and every metric that page names in backticks exists.
#[test]
fn every_metric_is_documented_and_exists() {
    use cni_node::repair::detect::Action;
    use cni_node::telemetry::capture_counts::{CaptureCounts, CountersMode};
    use cni_node::telemetry::{Install, Metrics};
    use cni_protocol::events::Event;
    let counts = CaptureCounts::new(CountersMode::Pod);
    let m = Metrics::new(Some(Action::Repair.metric_type()), true)
        .with_ambient()
        .with_counters(counts);
    m.set_ambient(1, 0, 1, 1);
    m.ambient_failed();
    m.ambient_pass(std::time::Duration::from_millis(2));
    m.ambient_repair("pod_rules");
    m.synthetic_check(true);
    m.ambient_plugin_request("200");
    m.reconcile_event("add");
    m.set_watch_up(true);
    m.watch_listed();
    m.installed(Install::Success);
    m.plugin_event(&Event {
        command: "ADD".into(),
        phases: cni_protocol::events::Phases {
            config_us: Some(100),
            ..Default::default()
        },
        ..Event::default()
    });
    let text = m.encode();
    let exposed: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();
    assert!(exposed.len() >= 6, "{text}");
    let doc = read("docs/repair.md");
    let section = section(&doc, "## Metrics and endpoints");
    let spans = code_spans(section);
    // A counter's family is `name`, its samples `name_total`.
    let named = |family: &str| {
        spans.iter().any(|s| {
            let s = s.split('{').next().unwrap();
            s == family || s == format!("{family}_total")
        })
    };
    let missing: Vec<String> = exposed.iter().filter(|f| !named(f)).cloned().collect();
    fail_if_any(
        missing,
        "metrics missing from docs/repair.md's \"Metrics and endpoints\"",
    );
    let stale: Vec<String> = spans
        .iter()
        .map(|s| s.split('{').next().unwrap().to_owned())
        .filter(|s| s.starts_with("istio_cni_") || s.starts_with("redirect_cni_"))
        .filter(|s| !exposed.contains(s) && !exposed.contains(s.trim_end_matches("_total")))
        .collect();
    fail_if_any(
        stale,
        "metrics docs/repair.md names that the agent does not expose",
    );
}

/// The plugin entry docs/deploy/README.md shows is the one the installer writes with its
/// defaults and the two values the page's manifests set (the agent in `redirect-system`,
/// `EXCLUDE_NAMESPACES=kube-system`): every field, its value and its order. (It once showed
/// `"name": "redirect-cni"` after the installer's default became Istio's `istio-cni`.)
#[test]
fn the_documented_plugin_entry_is_the_one_the_installer_writes() {
    let doc = read(DEPLOY);
    let intro = "The plugin entry, in chained mode";
    let at = doc
        .find(intro)
        .unwrap_or_else(|| panic!("{DEPLOY} no longer says {intro:?}"));
    let block = doc[at..]
        .split("```json\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .unwrap_or_else(|| panic!("{DEPLOY}: no JSON block after {intro:?}"));
    let shown: serde_json::Value = serde_json::from_str(block)
        .unwrap_or_else(|e| panic!("{DEPLOY}'s example entry is not JSON ({e}):\n{block}"));
    let env = |k: &str| match k {
        "POD_NAMESPACE" => Some("redirect-system".to_string()),
        "EXCLUDE_NAMESPACES" => Some("kube-system".to_string()),
        _ => None,
    };
    let settings = match cni_node::settings::parse(Vec::<std::ffi::OsString>::new(), &env) {
        Ok(cni_node::Parsed::Run(s)) => *s,
        other => panic!("the defaults do not parse: {other:?}"),
    };
    let written = cni_node::plugin_entry::plugin_entry(&settings);
    assert_eq!(
        shown,
        written,
        "{DEPLOY}'s example entry differs from what the installer writes:\n{}",
        serde_json::to_string_pretty(&written).unwrap()
    );
    let keys =
        |v: &serde_json::Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&shown), keys(&written), "the fields' order");
}
