//! The layers are crates, and their manifests hold the dependency rules of docs/architecture.md
//! (read here from `cargo metadata`, not by scanning source text); the map in that document
//! names every place of the library crates and of the node agent, and only places that exist. Inside each crate, the
//! modules use each other without a cycle and each type's inherent impls are in one file
//! (`layers/modules.rs` reads the sources with syn).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

// A folder of its own, so that cargo does not take it for a test of its own.
#[path = "layers/modules.rs"]
mod modules;

fn repo() -> PathBuf {
    redirect_testkit::docs::workspace()
}

/// A workspace package's folder, from `cargo metadata`.
fn dir_of(package: &str) -> PathBuf {
    let meta = metadata();
    let p = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == package)
        .unwrap_or_else(|| panic!("{package} is not a workspace package"));
    Path::new(p["manifest_path"].as_str().unwrap())
        .parent()
        .unwrap()
        .to_path_buf()
}

const LIBRARIES: [&str; 5] = [
    "redirect-core",
    "redirect-model",
    "redirect-kernel",
    "redirect-istio",
    "redirect-program",
];
const PROGRAMS: [&str; 4] = ["init-shim", "cni-plugin", "cni-node", "validator"];
/// The parts the plugin and its node agent share (the protocol between them, the sockets'
/// helpers), and the agent's ZDS server: shipped, but no program of their own.
const PARTS: [&str; 2] = ["cni-protocol", "zds"];

/// Each workspace package's declared dependencies: name → [(dependency, kind)], kind being
/// `normal`, `dev` or `build`.
fn manifests() -> BTreeMap<String, Vec<(String, String)>> {
    let meta = metadata();
    let mut map = BTreeMap::new();
    for p in meta["packages"].as_array().unwrap() {
        let deps = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let kind = d["kind"].as_str().unwrap_or("normal").to_string();
                (d["name"].as_str().unwrap().to_string(), kind)
            })
            .collect();
        map.insert(p["name"].as_str().unwrap().to_string(), deps);
    }
    map
}

/// `cargo metadata` of the workspace, without its dependencies.
fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The crates of ours that `package` depends on with one of `kinds`.
fn ours(
    m: &BTreeMap<String, Vec<(String, String)>>,
    package: &str,
    kinds: &[&str],
) -> BTreeSet<String> {
    m.get(package)
        .unwrap_or_else(|| panic!("{package} is not a workspace package"))
        .iter()
        .filter(|(name, kind)| {
            kinds.contains(&kind.as_str())
                && (name.starts_with("redirect-") || m.contains_key(name))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_manifests_keep_the_layers() {
    let m = manifests();
    let all = ["normal", "build", "dev"];
    let normal = ["normal", "build"];
    assert_eq!(
        ours(&m, "redirect-model", &all),
        set(&[]),
        "redirect-model depends on no crate of ours, not even for its tests"
    );
    assert_eq!(
        ours(&m, "redirect-kernel", &normal),
        set(&["redirect-model"]),
        "redirect-kernel depends on the model only"
    );
    for above in ["redirect-istio", "redirect-core"] {
        assert!(
            !ours(&m, "redirect-kernel", &all).contains(above),
            "redirect-kernel's tests must not need {above}"
        );
    }
    assert_eq!(
        ours(&m, "redirect-istio", &normal),
        set(&["redirect-model", "redirect-kernel"]),
        "redirect-istio depends on the model and the kernel crate"
    );
    assert!(
        !ours(&m, "redirect-istio", &all).contains("redirect-core"),
        "redirect-istio is a layer of redirect-core: its tests must not need it"
    );
    assert_eq!(
        ours(&m, "redirect-core", &normal),
        set(&["redirect-model", "redirect-kernel", "redirect-istio"]),
        "redirect-core is its three layers and nothing else of ours"
    );
    assert_eq!(
        ours(&m, "redirect-program", &normal),
        set(&[]),
        "redirect-program depends on no crate of ours"
    );
    assert_eq!(
        ours(&m, "redirect-testkit", &normal),
        set(&["redirect-model", "redirect-testkit-macros"]),
        "the test kit uses the model only (the kernel's tests use it), and its attribute's crate"
    );
    assert_eq!(
        ours(&m, "redirect-testkit-macros", &all),
        set(&[]),
        "the test kit's attribute (#[kernel_test]) depends on nothing"
    );
    assert_eq!(
        ours(&m, "cni-protocol", &normal),
        set(&["redirect-core", "redirect-program"]),
        "the plugin's protocol is a client of redirect-core"
    );
    assert_eq!(
        ours(&m, "zds", &normal),
        set(&["cni-protocol"]),
        "the ZDS server needs the socket helpers only"
    );
    for program in PROGRAMS {
        // The plugin and its agent share cni-protocol; no program links another.
        let allowed = match program {
            "cni-node" => set(&["redirect-core", "redirect-program", "cni-protocol", "zds"]),
            "cni-plugin" => set(&["redirect-core", "redirect-program", "cni-protocol"]),
            _ => set(&["redirect-core", "redirect-program"]),
        };
        let deps = ours(&m, program, &normal);
        assert!(
            deps.contains("redirect-core"),
            "{program} is a client of redirect-core"
        );
        assert!(
            deps.is_subset(&allowed),
            "{program} may depend on {allowed:?} only, not on {:?}",
            deps.difference(&allowed).collect::<Vec<_>>()
        );
        for (name, kind) in &m[program] {
            if kind != "dev" {
                assert!(
                    ![
                        "nftnl",
                        "nftnl-sys",
                        "mnl",
                        "redirect-testkit",
                        "redirect-testkit-macros",
                        "redirect-benches",
                        "cni-testkit"
                    ]
                    .contains(&name.as_str()),
                    "{program} links {name}, which is for tests only"
                );
            }
        }
    }
}

/// No crate of ours reaches itself through the others, dev-dependencies included: a cycle
/// through a test's dependency builds the crate twice, and two copies of one type do not meet.
#[test]
fn no_dependency_cycle_even_through_tests() {
    let m = manifests();
    let all = ["normal", "build", "dev"];
    // A crate's dev-dependency on itself (its own test features) is no cycle.
    let graph = m
        .keys()
        .map(|name| {
            let deps = ours(&m, name, &all)
                .into_iter()
                .filter(|d| d != name && m.contains_key(d))
                .collect();
            (name.clone(), deps)
        })
        .collect();
    let found = cycles_named(&graph, |c: &String| c.clone());
    assert!(found.is_empty(), "crate cycles: {found:?}");
}

/// Every crate of the workspace with a `src/`, read module by module.
fn crates() -> Vec<modules::Crate> {
    let meta = metadata();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            let dir = Path::new(p["manifest_path"].as_str().unwrap()).parent()?;
            let name = p["name"].as_str().unwrap();
            dir.join("src").is_dir().then(|| modules::read(name, dir))
        })
        .collect()
}

/// `graph`'s cycles, each as `a -> b -> a`.
fn cycles_named<T: Ord + Clone>(
    graph: &BTreeMap<T, BTreeSet<T>>,
    show: impl Fn(&T) -> String,
) -> Vec<String> {
    modules::cycles(graph)
        .iter()
        .map(|c| c.iter().map(&show).collect::<Vec<_>>().join(" -> "))
        .collect()
}

/// No crate's modules use each other in a cycle (`layers/modules.rs` says what a use is): a
/// cycle makes two modules one, to read and to change. Each hop is named with where it is.
#[test]
fn no_crate_has_a_module_cycle() {
    let (mut found, mut edges) = (Vec::new(), 0);
    for c in crates() {
        edges += c.uses.values().map(|u| u.len()).sum::<usize>();
        for cycle in modules::cycles(&c.graph()) {
            let path: Vec<String> = cycle.iter().map(|m| modules::show(m)).collect();
            found.push(format!("{}: {}", c.name, path.join(" -> ")));
            for hop in cycle.windows(2) {
                found.push(format!("    {}", c.uses[&hop[0]][&hop[1]]));
            }
        }
    }
    assert!(
        edges > 200,
        "only {edges} uses between modules read: the walk reads nothing"
    );
    assert!(
        found.is_empty(),
        "module cycles (move what both need to a module below them, or pass it in):\n{}",
        found.join("\n")
    );
}

/// A type's inherent impl blocks (`impl Type {`, not `impl Trait for Type`) are in one file:
/// a type split across files is one module in two places.
#[test]
fn each_types_inherent_impls_are_in_one_file() {
    let mut found = Vec::new();
    for c in crates() {
        for u in &c.unresolved {
            found.push(format!(
                "{}: {u}: which type of that name? say it by its path",
                c.name
            ));
        }
        for ((ty, defined), files) in &c.impls {
            if files.len() > 1 {
                let files: Vec<&str> = files.iter().map(|f| f.as_str()).collect();
                found.push(format!(
                    "{}: `{ty}` ({defined}) has inherent impl blocks in {}",
                    c.name,
                    files.join(", ")
                ));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The module walk on a crate made for it: a cycle through a `use` and a macro's tokens, an
/// impl split across two files, a parent's use of its child (no use) and a child's of its
/// parent (one), and a test module's use (none).
#[test]
fn the_module_walk_finds_a_cycle_and_a_split_impl() {
    let c = fixture(
        "walk",
        &[
            ("src/lib.rs", "mod a; mod b; mod c;"),
            (
                "src/a.rs",
                "use crate::b::B; pub struct A; impl A { fn f() {} }\n\
                 #[cfg(test)] mod tests { use crate::c::C; }",
            ),
            (
                "src/b.rs",
                "pub struct B; impl crate::a::A { fn g() { log!(\"{}\", super::a::X); } }",
            ),
            ("src/c/mod.rs", "mod d; pub struct C; use self::d::D;"),
            ("src/c/d.rs", "pub struct D; fn f() -> super::C { todo!() }"),
        ],
    );
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let graph = c.graph();
    assert_eq!(graph.len(), 3, "{graph:?}");
    assert_eq!(graph[&m("a")], BTreeSet::from([m("b")]));
    assert_eq!(graph[&m("b")], BTreeSet::from([m("a")]));
    assert_eq!(graph[&m("c::d")], BTreeSet::from([m("c")]));
    assert_eq!(modules::cycles(&graph), vec![vec![m("a"), m("b"), m("a")]]);
    let split = &c.impls[&("A".to_string(), "src/a.rs".to_string())];
    assert_eq!(split.len(), 2, "{:?}", c.impls);
}

/// A crate of `files` (path under its folder, text), written to a folder of its own and read
/// as `modules::read` reads ours.
fn fixture(name: &str, files: &[(&str, &str)]) -> modules::Crate {
    let dir = std::env::temp_dir().join(format!("layers-{name}-{}", std::process::id()));
    for (f, text) in files {
        let p = dir.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let c = modules::read(name, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
    c
}

/// The node agent's controllers: each a part with one entry, over what they share.
const CONTROLLERS: [&str; 6] = [
    "install", "repair", "untaint", "ambient", "metrics", "counters",
];

/// Where one of [`CONTROLLERS`] uses another in `c` (a path from one's modules into the
/// other's, outside `#[cfg(test)]`): `repair -> ambient: file:line path`.
fn controllers_using_each_other(c: &modules::Crate) -> Vec<String> {
    let part = |m: &[String]| {
        m.first()
            .filter(|t| CONTROLLERS.contains(&t.as_str()))
            .cloned()
    };
    let mut out = Vec::new();
    for (from, uses) in &c.uses {
        for (to, at) in uses {
            if let (Some(a), Some(b)) = (part(from), part(to)) {
                if a != b {
                    out.push(format!("{a} -> {b}: {at}"));
                }
            }
        }
    }
    out
}

/// The node agent's controllers are parts (issue 48): the installer, repair, untaint, ambient,
/// the metrics and the counters each run from one entry, and none uses another; what they
/// share is below them (the informers, the pods, the settings, the errors, the node view), and
/// `agent` wires them.
#[test]
fn the_node_agents_controllers_use_none_of_each_other() {
    let node = modules::read("cni-node", &dir_of("cni-node"));
    let mut found: Vec<String> = CONTROLLERS
        .iter()
        .filter(|part| {
            !node
                .modules
                .iter()
                .any(|m| m.first() == Some(&part.to_string()))
        })
        .map(|part| format!("no top-level module {part}"))
        .collect();
    found.extend(controllers_using_each_other(&node));
    assert!(
        found.is_empty(),
        "the node agent's controllers are not parts (move what two need below them, or let \
         the agent pass it in):\n{}",
        found.join("\n")
    );
    // And the check finds a controller that does.
    let made = fixture(
        "controllers",
        &[
            ("src/lib.rs", "mod ambient; mod repair; mod pods;"),
            (
                "src/ambient.rs",
                "use crate::pods::Pod; pub struct Enrolled;",
            ),
            (
                "src/repair.rs",
                "fn f() -> crate::ambient::Enrolled { todo!() }",
            ),
            ("src/pods.rs", "pub struct Pod;"),
        ],
    );
    assert_eq!(
        controllers_using_each_other(&made),
        ["repair -> ambient: src/repair.rs:1 crate::ambient::Enrolled"]
    );
}

/// Every library of the workspace documents whatever it makes public: its root denies
/// `missing_docs`, so an undocumented public item fails the build.
#[test]
fn every_library_denies_missing_docs() {
    let meta = metadata();
    let mut missing = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            if !t["kind"].as_array().unwrap().iter().any(|k| k == "lib") {
                continue;
            }
            let root = t["src_path"].as_str().unwrap();
            let text = std::fs::read_to_string(root).unwrap();
            if !text.contains("#![deny(missing_docs)]") {
                missing.push(root.to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "no #![deny(missing_docs)] in {missing:?}"
    );
}

/// Each library crate either forbids unsafe code, or each `unsafe` in it has a SAFETY comment
/// within the three lines above.
#[test]
fn unsafe_code_is_forbidden_or_said_why() {
    for krate in LIBRARIES {
        let src = dir_of(krate).join("src");
        let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
        if lib.contains("#![forbid(unsafe_code)]") {
            continue;
        }
        let mut files = Vec::new();
        modules::rust_files(&src, &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, l) in lines.iter().enumerate() {
                let code = l.split("//").next().unwrap_or("");
                if !code.contains("unsafe ") && !code.contains("unsafe{") {
                    continue;
                }
                let said = lines[i.saturating_sub(3)..i]
                    .iter()
                    .any(|p| p.trim_start().starts_with("// SAFETY:"));
                assert!(
                    said,
                    "{}:{}: `unsafe` without a `// SAFETY:` comment above it",
                    f.display(),
                    i + 1
                );
            }
        }
    }
}

/// The paths the map names: the first word of each line of the code block under "## Map";
/// an indented line is inside the last unindented `<crate>/src/` above it.
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
    let mut parent = String::new();
    let mut out = Vec::new();
    for l in block.lines().filter(|l| !l.trim().is_empty()) {
        let word = l.split_whitespace().next().unwrap();
        if l.starts_with(' ') {
            out.push(format!("{parent}{word}"));
        } else {
            parent = word.to_string();
            out.push(word.to_string());
        }
    }
    out
}

#[test]
fn the_map_names_every_place_and_only_places_that_exist() {
    let named = map_paths();
    assert!(
        named.len() > 20,
        "the map is too short to be one: {named:?}"
    );
    for p in &named {
        assert!(
            repo().join(p).exists(),
            "docs/architecture.md's map names {p}, which does not exist"
        );
    }
    // The node agent too: its parts are many, and each says what it holds there.
    for krate in LIBRARIES.iter().chain(&["cni-node"]) {
        let src = dir_of(krate).join("src");
        for entry in std::fs::read_dir(&src).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let rel = dir_of(krate);
            let rel = rel.strip_prefix(repo()).unwrap_or(&rel).display();
            let here = format!("{rel}/src/{name}");
            assert!(
                named
                    .iter()
                    .any(|p| p.trim_end_matches('/') == here.trim_end_matches('/')),
                "{here} is not in docs/architecture.md's map"
            );
        }
    }
}

/// The plugin, run once per pod, links none of the node agent's machinery: not the agent's
/// crate, its watch (kube's runtime), its metrics, its command line, its HTTP server.
#[test]
fn the_plugin_links_none_of_the_node_agent() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-e",
            "normal",
            "-p",
            "cni-plugin",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: BTreeSet<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        crates.contains("kube-client"),
        "the tree is no tree:\n{tree}"
    );
    for agent_only in [
        "cni-node",
        "kube-runtime",
        "prometheus-client",
        "clap",
        "tokio-macros",
    ] {
        assert!(
            !crates.contains(agent_only),
            "the plugin links {agent_only}, which only the node agent needs"
        );
    }
}

/// Every library and binary of the workspace's shipped crates is one of the logger's own
/// (`redirect_program::logging::OURS`): a crate missing there logs nothing below warn, which
/// is how the plugin lost every start and end line when its crate was renamed.
#[test]
fn every_shipped_crate_logs_as_ours() {
    let meta = metadata();
    let mut missing = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        if !LIBRARIES.contains(&name) && !PROGRAMS.contains(&name) && !PARTS.contains(&name) {
            continue;
        }
        for t in p["targets"].as_array().unwrap() {
            let kinds: Vec<&str> = t["kind"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|k| k.as_str())
                .collect();
            if kinds.iter().any(|k| *k == "lib" || *k == "bin") {
                let target = t["name"].as_str().unwrap().replace('-', "_");
                if !redirect_program::logging::OURS.contains(&target.as_str()) {
                    missing.push(target);
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in redirect_program::logging::OURS: {missing:?}"
    );
}

/// Kernel tests say what they are (issue 48): a test that needs root and network namespaces is a
/// `#[kernel_test]` (redirect_testkit), reported ignored with its reason where it cannot run and
/// run by `--include-ignored`, never a `#[test]` that returns early and passes. No file of the
/// workspace keeps the old guard; and, as a heuristic, no plain `#[test]` makes a network
/// namespace through the test kits (a `Topology`, a `TestNetns`, a user-namespace pod, the
/// ambient `Node`).
#[test]
fn kernel_tests_are_marked_as_such() {
    let offenders = kernel_test_offenders(&repo());
    assert!(
        offenders.is_empty(),
        "kernel tests must be #[kernel_test] (redirect_testkit::kernel_test), not a #[test] \
         with a guard:\n{}",
        offenders.join("\n")
    );
}

/// `file:line: why` for every place under `root` that breaks the rule above.
fn kernel_test_offenders(root: &Path) -> Vec<String> {
    // Spelled in two pieces, so that this file is not one of its own offenders.
    let old_guard = concat!("kernel_tests", "_enabled");
    let mut files = Vec::new();
    workspace_rust_files(root, &mut files);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(root).unwrap_or(&f).display().to_string();
        for (i, l) in text.lines().enumerate() {
            if l.contains(old_guard) {
                out.push(format!("{rel}:{}: the old guard `{old_guard}`", i + 1));
            }
        }
        // The ambient `Node` of cni-testkit makes a namespace; a test's own `struct Node` may not.
        let own_node = text.contains("struct Node");
        let mut makers = vec!["Topology::", "TestNetns::", "UserNsPod::"];
        if !own_node {
            makers.extend(["Node::new(", "Node::start("]);
        }
        for (line, name, body) in plain_tests(&text) {
            if let Some(m) = makers.iter().find(|m| body.contains(**m)) {
                out.push(format!(
                    "{rel}:{line}: `{name}` is a plain #[test] that makes a network namespace \
                     (`{m}`): make it a #[kernel_test]"
                ));
            }
        }
    }
    out
}

/// The `.rs` files of the workspace's crates (not `target`, `fuzz` or hidden folders).
fn workspace_rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "fuzz" {
                workspace_rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// Each plain `#[test]` fn of `text`: (line, name, body without comments and strings).
/// Attributes and doc comments may sit between `#[test]` and the `fn`.
fn plain_tests(text: &str) -> Vec<(usize, String, String)> {
    let text = &code_only(text);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("#[test]") {
        let start = from + at;
        from = start + "#[test]".len();
        // The attribute itself, first on its line (not in a comment or a string).
        let line_start = text[..start].rfind('\n').map_or(0, |n| n + 1);
        if !text[line_start..start].trim().is_empty() {
            continue;
        }
        let rest = &text[from..];
        let Some(fn_at) = rest.find("fn ") else { break };
        // Only attributes, doc comments and `pub` between the attribute and its fn.
        let between = &rest[..fn_at];
        if !between.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with("#[") || l.starts_with("//") || l == "pub"
        }) {
            continue;
        }
        let name: String = rest[fn_at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = rest[fn_at..].find('{') else {
            break;
        };
        let body_start = from + fn_at + open;
        let mut depth = 0usize;
        let body_end = text[body_start..]
            .char_indices()
            .find(|(_, c)| {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => return false,
                }
                depth == 0
            })
            .map_or(text.len(), |(n, _)| body_start + n + 1);
        let line = text[..start].matches('\n').count() + 1;
        out.push((line, name, text[body_start..body_end].to_string()));
    }
    out
}

/// `text` with its comments, strings and char literals blanked (each byte a space, newlines
/// kept), so that only code is matched and braces counted.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |from: usize, to: usize, out: &mut Vec<u8>| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let end = match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => text[i..].find('\n').map_or(b.len(), |n| i + n),
            b'/' if b.get(i + 1) == Some(&b'*') => {
                text[i..].find("*/").map_or(b.len(), |n| i + n + 2)
            }
            b'r' if i > 0
                && !b[i - 1].is_ascii_alphanumeric()
                && b[i - 1] != b'_'
                && matches!(b.get(i + 1), Some(b'"' | b'#')) =>
            {
                let hashes = text[i + 1..].chars().take_while(|c| *c == '#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let from = i + 2 + hashes;
                text[from..]
                    .find(&close)
                    .map_or(b.len(), |n| from + n + close.len())
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                j + 1
            }
            // A char literal ('{', '\'', '\n'); a lifetime ('a) has no closing quote.
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                text[i + 3..].find('\'').map_or(i + 1, |n| i + 3 + n + 1)
            }
            b'\'' => match text[i + 1..].char_indices().nth(1) {
                Some((n, '\'')) => i + 1 + n + 1,
                _ => i + 1,
            },
            _ => {
                i += 1;
                continue;
            }
        };
        blank(i, end, &mut out);
        i = end.max(i + 1);
    }
    String::from_utf8_lossy(&out).into_owned()
}
