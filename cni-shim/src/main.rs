fn main() {
    eprintln!("redirect-cni: not implemented yet (see issue: redirect-cni)");
    std::process::exit(1);
}
