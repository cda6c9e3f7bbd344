//! redirect-init: a drop-in for Istio's `istio-iptables` in the init container. Thin: flags and
//! environment become a `redirect_model` config (`flags`, `settings`); `run` calls the library.

#![deny(missing_docs)]

mod report;
pub mod run;

pub use redirect_core::cli::{flags, settings};

use std::ffi::OsString;

use flags::Parsed;
use redirect_program::logging::Sink;
use run::{Failure, EXIT_ERROR, EXIT_OK};
use tracing::level_filters::LevelFilter;

/// redirect-init's log lines: `level<TAB>message` on stderr, from info up
/// (`redirect_program::logging`). Installs the process's subscriber unless one is there already.
pub fn log_to_stderr() {
    redirect_program::logging::install(Sink::stderr(None, LevelFilter::INFO));
}

/// The whole program, from arguments and an environment lookup to an exit code.
pub fn main_with(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    log_to_stderr();
    let resolved = match flags::parse(args, env) {
        Ok(Parsed::Run(r)) => r,
        Ok(Parsed::Info(text)) => {
            print!("{text}");
            return EXIT_OK;
        }
        Err(msg) => {
            eprintln!("{msg}");
            return EXIT_ERROR;
        }
    };
    let logs = redirect_core::cli::flags::log_flags(&resolved);
    if let Err(msg) = logs.and_then(|l| {
        redirect_program::logging::install_istio_flags(l.as_json, l.output_level.as_deref())
    }) {
        eprintln!("{msg}");
        return EXIT_ERROR;
    }
    report::print(&report::environment(env));
    let result = settings::Settings::from_resolved(&resolved)
        .map_err(Failure::from)
        .and_then(|s| match s.network_namespace.clone() {
            Some(path) => redirect_core::Netns::open(&path)
                .and_then(|ns| ns.run(move || run::run(s)))
                .map_err(|e| Failure::from(redirect_core::Error::from(e)))
                .and_then(|r| r),
            None => run::run(s),
        });
    match result {
        Ok(()) => EXIT_OK,
        Err(f) => {
            tracing::error!("{}", f.message);
            for line in &f.details {
                tracing::error!("{line}");
            }
            f.code
        }
    }
}
