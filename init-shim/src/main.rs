//! `redirect-init`: see the crate docs in lib.rs.

fn main() {
    let env = |name: &str| std::env::var(name).ok();
    std::process::exit(init_shim::main_with(std::env::args_os().collect(), &env));
}
