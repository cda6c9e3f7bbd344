//! Plan and print the rules for a config: Istio's sidecar defaults, or a config in JSON (the
//! form `CaptureConfig::to_json` writes) named on the command line. Nothing is touched; no
//! privilege is needed.
//!
//! ```text
//! cargo run -p redirect-core --example plan                       # nft script, Istio's defaults
//! cargo run -p redirect-core --example plan -- config.json        # another config
//! cargo run -p redirect-core --example plan -- --iptables         # iptables-restore input
//! ```

use std::error::Error;

use redirect_core::{render, CaptureConfig, SystemGroups};

fn main() {
    if let Err(e) = run() {
        eprintln!("plan: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match args.iter().find(|a| !a.starts_with("--")) {
        Some(path) => CaptureConfig::from_json(&std::fs::read_to_string(path)?)?,
        None => CaptureConfig::istio_sidecar_default().validated()?,
    };
    let rules = config.plan(&SystemGroups)?;
    if args.iter().any(|a| a == "--iptables") {
        let (v4, v6) = render::iptables_restore_all(&rules);
        print!("{v4}");
        if let Some(v6) = v6 {
            print!("{v6}");
        }
    } else {
        print!("{}", render::nft_script(&rules));
    }
    eprintln!(
        "{} rules in {} chains, {} sets",
        rules.rule_count(),
        rules.chains.len(),
        rules.sets.len()
    );
    Ok(())
}
