//! `redirect-cni`: the node installer as `redirect-cni install`; the plugin comes next.

fn main() {
    let env = |name: &str| std::env::var(name).ok();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "install") {
        std::process::exit(cni_shim::install::main(args[1..].to_vec(), &env));
    }
    eprintln!("redirect-cni: the CNI plugin is not implemented yet");
    std::process::exit(1);
}
