//! The map in docs/architecture.md matches the tree, and redirect-core's modules import only
//! their own layer and those below it (model < mechanism < Istio compatibility < policy).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The paths the map names: the first word of each line of the code block under "## Map";
/// indented ones are inside `redirect-core/src/`.
fn map_paths() -> Vec<String> {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let section = doc
        .split("\n## Map\n")
        .nth(1)
        .expect("docs/architecture.md has a `## Map` section");
    let block = section
        .split("```")
        .nth(1)
        .expect("the map is a fenced block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let word = l.split_whitespace().next().unwrap();
            if l.starts_with(' ') {
                format!("redirect-core/src/{word}")
            } else {
                word.to_string()
            }
        })
        .collect()
}

#[test]
fn the_map_names_every_place_and_only_places_that_exist() {
    let named = map_paths();
    assert!(
        named.len() > 10,
        "the map is too short to be one: {named:?}"
    );
    for p in &named {
        assert!(
            repo().join(p).exists(),
            "docs/architecture.md's map names {p}, which does not exist"
        );
    }
    let src = repo().join("redirect-core/src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let here = format!("redirect-core/src/{name}");
        assert!(
            named
                .iter()
                .any(|p| p.trim_end_matches('/') == here || p.starts_with(&format!("{here}/"))),
            "redirect-core/src/{name} is not in docs/architecture.md's map"
        );
    }
}

/// The layer of a module path's first segments (`validation` is split: its probe is a
/// mechanism, its diagnosis policy).
fn layer(first: &str, second: Option<&str>) -> Option<u8> {
    Some(match (first, second) {
        ("config" | "plan" | "ruleset" | "error", _) => 0,
        (
            "nft" | "render" | "eval" | "routes" | "netns" | "sockopt" | "alloc" | "env_vars"
            | "logging",
            _,
        ) => 1,
        ("validation", Some("probe")) | ("validation", Some("mod")) => 1,
        ("istio", _) => 2,
        ("capture", _) | ("validation", _) => 3,
        _ => return None,
    })
}

const NAMES: [&str; 4] = ["model", "mechanism", "Istio compatibility", "policy"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn each_module_imports_only_its_layer_and_those_below() {
    let src = repo().join("redirect-core/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = BTreeSet::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let parts: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        if parts == ["lib"] {
            continue;
        }
        let own = layer(&parts[0], parts.get(1).map(String::as_str)).unwrap_or_else(|| {
            panic!(
                "{} has no layer: add it to the map and to this test",
                rel.display()
            )
        });
        let text = std::fs::read_to_string(&f).unwrap();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let path: Vec<&str> = line[i + 7..]
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .next()
                    .unwrap()
                    .split("::")
                    .collect();
                let Some(theirs) = layer(path[0], path.get(1).copied()) else {
                    continue;
                };
                if theirs > own {
                    wrong.insert(format!(
                        "{} ({}) imports crate::{} ({})",
                        rel.display(),
                        NAMES[own as usize],
                        path.join("::"),
                        NAMES[theirs as usize]
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against docs/architecture.md's layers:\n{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}
