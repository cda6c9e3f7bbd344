//! A crate outside the workspace that depends on redirect-core alone (by path) builds the
//! ten-line example of the crate's documentation, taken from `src/lib.rs` itself so the two
//! cannot drift, and the program runs: its namespace ends up captured with the one change.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use redirect_testkit::{docs::workspace, kernel_test, TestNetns};

/// The example: the first `no_run` block of the crate's doc, without its `//! ` prefixes.
fn doc_example() -> String {
    let lib = std::fs::read_to_string(workspace().join("redirect-core/src/lib.rs")).unwrap();
    let block = lib
        .split("//! ```no_run\n")
        .nth(1)
        .and_then(|rest| rest.split("//! ```\n").next())
        .expect("redirect-core/src/lib.rs opens with a no_run example");
    block
        .lines()
        .map(|l| {
            l.strip_prefix("//! ")
                .unwrap_or(l.trim_start_matches("//!"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes the outside crate and builds it offline; returns its binary.
fn build_outside_crate() -> PathBuf {
    let root = workspace();
    let dir = root.join("target/outside-crate");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"outside\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nredirect-core = {{ path = {:?} }}\n\n[workspace]\n",
        root.join("redirect-core")
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    let example = doc_example();
    assert!(
        example.lines().filter(|l| l.starts_with("use ")).count() == 1,
        "the example imports one path: {example}"
    );
    std::fs::write(dir.join("src/main.rs"), example + "\n").unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the outside crate does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("target/debug/outside")
}

/// The outside crate's binary, built once per process (both tests want it; one build at a time
/// writes its folder).
fn outside_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(build_outside_crate)
}

/// Without root too: the example builds in a crate of its own.
#[test]
fn the_doc_example_builds_in_an_outside_crate() {
    assert!(outside_binary().is_file());
}

#[kernel_test]
fn the_doc_example_builds_in_an_outside_crate_and_captures() {
    let bin = outside_binary();
    // The example opens /run/netns/pod: give it this test's namespace under that name, in a
    // mount namespace of its own, so nothing on the machine is named or touched.
    let ns = TestNetns::new();
    ns.sh("ip link add d0 type veth peer name d1 && ip addr add 10.99.0.1/24 dev d0 && ip link set d0 up");
    let script = format!(
        "exec 3<{} && mount --make-rprivate / && mount -t tmpfs none /run/netns && touch /run/netns/pod && mount --bind /proc/self/fd/3 /run/netns/pod && exec 3<&- && exec {}",
        ns.path().display(),
        bin.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("table inet redirect_capture {"), "{stdout}");
    let table = ns.sh("nft list table inet redirect_capture");
    assert!(
        table.contains("8080"),
        "the one change is not in the kernel:\n{table}"
    );
}
