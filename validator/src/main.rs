fn main() {
    eprintln!("redirect-validate: not implemented yet (see issue: redirect-validate)");
    std::process::exit(1);
}
