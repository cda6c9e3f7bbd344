//! `redirect-cni install`: the node DaemonSet's process. It installs the plugin (`install`)
//! and runs the node agent beside it (`agent`: repair, untaint, metrics and probes), told when
//! the plugin is installed and stopped before anything is uninstalled.

use std::ffi::OsString;

use redirect_program::logging::Sink;
use tracing::level_filters::LevelFilter;

use crate::agent::Agent;
use crate::install::{self, signals, StopHandle, WatchOptions};
use crate::node::settings::{self, Parsed, Settings};
use crate::node::Error;

/// `redirect-cni install [flags]`: `args` are the arguments after `install` (a leading
/// `redirect-cni install` is skipped too), `env` looks up environment variables. Returns the
/// exit code: 0 after a clean stop (SIGTERM/SIGINT) or `--help`, 1 on failure, 2 on bad flags.
pub fn main(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    // `level<TAB>message` on stderr, from info up, the agent's lines and kube's warnings too.
    redirect_program::logging::install(Sink::stderr(None, LevelFilter::INFO));
    let settings = match settings::parse(args, env) {
        Ok(Parsed::Info(text)) => {
            print!("{text}");
            return 0;
        }
        Ok(Parsed::Run(s)) => *s,
        Err(e) => {
            tracing::error!("{e}");
            return 2;
        }
    };
    let stop = match StopHandle::new().and_then(|s| signals::stop_on_signals(&s).map(|()| s)) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return 1;
        }
    };
    log_start(&settings);
    let agent = match Agent::start(&settings) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("{e}");
            return if matches!(e, Error::InvalidSetting { .. }) {
                2
            } else {
                1
            };
        }
    };
    match run(settings, &stop, &WatchOptions::default(), agent) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            1
        }
    }
}

/// [`install::run`] with the agent told when the plugin is installed, and stopped first.
pub fn run(
    settings: Settings,
    stop: &StopHandle,
    opts: &WatchOptions,
    agent: Agent,
) -> crate::node::Result<()> {
    let agent = std::cell::RefCell::new(Some(agent));
    let ready = |ready| {
        if let Some(a) = agent.borrow().as_ref() {
            a.set_ready(ready)
        }
    };
    let stopping = || {
        if let Some(a) = agent.borrow_mut().take() {
            a.stop()
        }
    };
    install::run(settings, stop, opts, &ready, &stopping)
}

fn log_start(settings: &Settings) {
    tracing::info!(
        "redirect-cni install {}: {} mode, net dir {} (host {}), bin dirs {}, run dir {}",
        env!("CARGO_PKG_VERSION"),
        if settings.chained {
            "chained"
        } else {
            "standalone"
        },
        settings.mounted_cni_net_dir.display(),
        settings.cni_net_dir.display(),
        settings
            .cni_bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(","),
        settings.cni_agent_run_dir.display()
    );
}
