//! docs/redirect-cni.md documents everything the plugin reads (config fields, nested keys,
//! pod annotations, labels and proxy env), its CNI commands and error codes. Both directions
//! where cheap: what the page names still exists. (The node agent's settings and metrics:
//! cni-node's `docs_reference`.)

use std::collections::BTreeSet;
use std::path::Path;

use redirect_testkit::docs::*;

use cni_plugin::cni::conf::{FIELDS, NESTED_FIELDS};
use cni_plugin::cni::Command;
use redirect_core::mesh::{ANNOTATIONS, LABELS, PROXY_ENV};

const PAGE: &str = "docs/redirect-cni.md";

// ---- the checks ----

#[test]
fn every_config_field_is_documented() {
    let doc = read(PAGE);
    let mut missing: Vec<String> = FIELDS
        .iter()
        .filter(|f| !in_backticks(&doc, f))
        .map(|f| f.to_string())
        .collect();
    for (parent, key) in NESTED_FIELDS {
        let dotted = in_backticks(&doc, &format!("{parent}.{key}"));
        let together = paragraphs(&doc)
            .iter()
            .any(|p| in_backticks(p, parent) && in_backticks(p, key));
        if !dotted && !together {
            missing.push(format!(
                "{parent}.{key} (write `{parent}.{key}`, or `{parent}` and `{key}` in one paragraph)"
            ));
        }
    }
    fail_if_any(
        missing,
        &format!("config fields (conf::FIELDS, NESTED_FIELDS) not documented in {PAGE}"),
    );
}

#[test]
fn every_annotation_label_and_proxy_env_is_documented() {
    let doc = read(PAGE);
    let mut missing: Vec<String> = ANNOTATIONS
        .iter()
        .filter(|a| !in_backticks(&doc, a))
        .map(|a| format!("annotation {a}"))
        .collect();
    let annotation_rows = table_rows(&doc, &["annotation"]);
    // Those that set the capture (all but the status and inject ones) have a table row.
    let decides = [redirect_core::mesh::STATUS, redirect_core::mesh::INJECT];
    for a in ANNOTATIONS.iter().filter(|a| !decides.contains(a)) {
        if !annotation_rows
            .iter()
            .any(|r| r[0].contains(&format!("`{a}`")))
        {
            missing.push(format!("annotation {a}: no row in the annotation table"));
        }
    }
    for l in LABELS {
        let in_words = paragraphs(&doc)
            .iter()
            .any(|p| in_backticks(p, l) && p.contains("label"));
        if !in_words {
            missing.push(format!(
                "label {l} (name it in a paragraph that says it is a label)"
            ));
        }
    }
    for e in PROXY_ENV {
        if !in_backticks(&doc, e) {
            missing.push(format!("istio-proxy env {e}"));
        }
    }
    fail_if_any(
        missing,
        &format!("pod inputs (mesh::ANNOTATIONS, LABELS, PROXY_ENV) not documented in {PAGE}"),
    );
}

/// `pub const NAME: u32 = N;` of `pub mod code`: (name, N).
fn error_codes() -> Vec<(String, u32)> {
    let src = read("cni-shim/protocol/src/cni/mod.rs");
    let start = src
        .find("pub mod code {")
        .expect("pub mod code in cni/mod.rs");
    let body = &src[start..start + src[start..].find("\n}").unwrap()];
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        // The codes themselves, not `ALL`, their list.
        .filter(|l| l.contains(": u32 ="))
        .map(|l| {
            let (name, rest) = l.split_once(':').unwrap();
            let n = rest.split('=').nth(1).unwrap().trim().trim_end_matches(';');
            (name.to_string(), n.parse().unwrap())
        })
        .collect()
}

/// The text of every `.rs` file under `dir`.
fn sources(dir: &Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.push_str(&sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
    out
}

#[test]
fn every_error_code_used_is_documented() {
    let doc = read(PAGE);
    let documented: BTreeSet<String> = table_rows(&doc, &["code"])
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    let codes = error_codes();
    assert!(codes.len() >= 10, "parsed too few codes: {codes:?}");
    let src = sources(&workspace().join("cni-shim/plugin/src"));
    let missing = codes
        .iter()
        .filter(|(name, _)| src.contains(&format!("code::{name}")))
        .filter(|(_, n)| !documented.contains(&n.to_string()))
        .map(|(name, n)| format!("{n} (code::{name})"))
        .collect();
    fail_if_any(
        missing,
        &format!("CNI error codes the plugin returns without a row in the code table of {PAGE}"),
    );
    let unknown = documented
        .iter()
        .filter(|d| !codes.iter().any(|(_, n)| n.to_string() == **d))
        .cloned()
        .collect();
    fail_if_any(
        unknown,
        &format!("error codes in {PAGE} that cni::code does not define"),
    );
}

#[test]
fn every_cni_command_is_documented_and_exists() {
    let doc = read(PAGE);
    let documented: BTreeSet<String> = table_rows(&doc, &["command"])
        .into_iter()
        .map(|r| r[0].trim_matches('`').to_string())
        .collect();
    let known: BTreeSet<String> = Command::ALL.iter().map(|c| c.name().to_owned()).collect();
    let missing = known.difference(&documented).cloned().collect();
    fail_if_any(
        missing,
        &format!("CNI commands (cni::Command) without a row in the command table of {PAGE}"),
    );
    // The other way, against the binary: a pod outside Kubernetes (no CNI_ARGS) is passed
    // through, so nothing on this machine changes.
    let mut gone = Vec::new();
    for cmd in &documented {
        let out = cni_testkit::plugin(
            &[("CNI_COMMAND", cmd)],
            r#"{"cniVersion":"1.0.0","name":"docs","type":"redirect-cni"}"#,
        );
        let stdout = out.stdout;
        if stdout.contains("is not a CNI command") {
            gone.push(format!("{cmd}: {stdout}"));
        }
    }
    fail_if_any(
        gone,
        &format!("CNI commands in {PAGE} that redirect-cni does not know"),
    );
}
