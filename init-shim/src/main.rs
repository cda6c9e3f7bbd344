//! `redirect-init`: see the crate docs in lib.rs.

fn main() {
    if let Err(msg) = redirect_core::check_env_utf8(init_shim::flags::env_names()) {
        eprintln!("error\t{msg}");
        std::process::exit(init_shim::run::EXIT_ERROR);
    }
    let env = |name: &str| std::env::var(name).ok();
    std::process::exit(init_shim::main_with(std::env::args_os().collect(), &env));
}
