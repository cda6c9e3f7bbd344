//! `redirect-cni`: a CNI plugin when the runtime runs it, the node installer as
//! `redirect-cni install`.

use std::io::Read;

fn main() {
    let env = |name: &str| std::env::var(name).ok();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "install") {
        std::process::exit(cni_shim::install::main(args[1..].to_vec(), &env));
    }
    let mut stdin = Vec::new();
    // VERSION may come with no stdin at all; an unreadable stdin is an empty config.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let env_error =
        redirect_core::check_env_utf8(cni_shim::plugin::ENV_NAMES.iter().copied()).err();
    std::process::exit(cni_shim::plugin_main(&env, &stdin, env_error));
}
