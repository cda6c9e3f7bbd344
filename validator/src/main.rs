fn main() {
    // Istio's flags read the same variables as redirect-init's.
    if let Err(msg) = redirect_core::check_env_utf8(redirect_core::istio::cli::flags::env_names()) {
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
    let env = |name: &str| std::env::var(name).ok();
    std::process::exit(validator::main_with(std::env::args_os().collect(), &env));
}
