//! `redirect-cni`: the CNI plugin a runtime runs. `redirect-cni install` (the DaemonSet's
//! command before the node agent had a binary of its own) runs `redirect-cni-node` from
//! beside this executable.

use std::io::Read;
use std::os::unix::process::CommandExt;

/// The heap allocator of the static (musl) builds. musl's own malloc made redirect-init with
/// 10,000 CIDRs 50% slower than the same code on glibc (22.8 ms against 15.1 ms); dlmalloc, a
/// pure-Rust port of the allocator glibc's derives from, brings it back. Other builds keep
/// their libc's allocator.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() {
    let started = std::time::Instant::now();
    let vars = redirect_program::env::Env::capture();
    let env = |name: &str| vars.get(name);
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "install") {
        std::process::exit(run_node_agent(&args[1..]));
    }
    let mut stdin = Vec::new();
    // VERSION may come with no stdin at all; an unreadable stdin is an empty config.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let env_error = vars
        .check_utf8(cni_plugin::plugin::ENV_NAMES.iter().copied())
        .err();
    std::process::exit(cni_plugin::plugin_main(&env, &stdin, env_error, started));
}

/// Replaces this process with `redirect-cni-node` from this executable's directory (the
/// image's `/usr/local/bin`); returns only when that fails, with the exit code to use.
fn run_node_agent(args: &[std::ffi::OsString]) -> i32 {
    let node = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(cni_plugin::NODE_AGENT_BINARY)));
    let Some(node) = node else {
        eprintln!("error\tredirect-cni install: cannot find this executable's directory (/proc/self/exe); run {} directly", cni_plugin::NODE_AGENT_BINARY);
        return 1;
    };
    let e = std::process::Command::new(&node).args(args).exec();
    eprintln!(
        "error\tredirect-cni install: cannot run {}: {e}; the node agent is {} (beside redirect-cni in the image), which the DaemonSet runs",
        node.display(),
        cni_plugin::NODE_AGENT_BINARY
    );
    1
}
