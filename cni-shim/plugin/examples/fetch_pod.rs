//! Fetches one pod the way `redirect-cni` does when it needs the spec, and prints the
//! `PodInfo` as JSON: for trying a kubeconfig by hand and for measuring the slow path.
//!
//! ```text
//! cargo run --release -p cni-plugin --example fetch_pod -- KUBECONFIG NAMESPACE NAME [ATTEMPTS]
//! ```
//! Logs (DEBUG and above, every crate) go to stderr when `FETCH_POD_DEBUG` is set.

use std::path::Path;
use std::process::ExitCode;

use cni_plugin::kube::{fetch_pod, FetchPolicy};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, kubeconfig, namespace, name, rest @ ..] = args.as_slice() else {
        eprintln!("usage: fetch_pod KUBECONFIG NAMESPACE NAME [ATTEMPTS]");
        return ExitCode::from(2);
    };
    let mut policy = FetchPolicy::default();
    if let Some(attempts) = rest.first() {
        match attempts.parse() {
            Ok(n) => policy.attempts = n,
            Err(e) => {
                eprintln!("ATTEMPTS {attempts:?}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if std::env::var_os("FETCH_POD_DEBUG").is_some() {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::stderr)
            .init();
    }
    match fetch_pod(Path::new(kubeconfig), namespace, name, &policy) {
        Ok(pod) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&pod).expect("PodInfo serializes")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fetch_pod: {e}");
            ExitCode::FAILURE
        }
    }
}
