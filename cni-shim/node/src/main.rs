//! `redirect-cni-node`: the node DaemonSet's process (installer and node agent).

/// The heap allocator of the static (musl) builds, as in the plugin (see its main.rs).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() {
    let vars = redirect_program::env::Env::capture();
    let env = |name: &str| vars.get(name);
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    std::process::exit(cni_node::daemon::main(args, &env));
}
