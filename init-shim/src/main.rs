fn main() {
    eprintln!("redirect-init: not implemented yet (see issue: redirect-init)");
    std::process::exit(1);
}
