fn main() {
    let env = |name: &str| std::env::var(name).ok();
    std::process::exit(validator::main_with(std::env::args_os().collect(), &env));
}
