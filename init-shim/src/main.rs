//! `redirect-init`: see the crate docs in lib.rs.

fn main() {
    init_shim::log_to_stderr();
    if let Err(msg) = redirect_core::check_env_utf8(init_shim::flags::env_names()) {
        tracing::error!("{msg}");
        std::process::exit(init_shim::run::EXIT_ERROR);
    }
    let env = |name: &str| std::env::var(name).ok();
    std::process::exit(init_shim::main_with(std::env::args_os().collect(), &env));
}
