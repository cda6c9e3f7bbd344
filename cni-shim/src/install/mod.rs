//! `redirect-cni install`: the node DaemonSet's entrypoint (copies the binary, writes or chains
//! the CNI config, writes the kubeconfig, keeps them in place, removes exactly what it added).
//!
//! The pieces, each usable on its own (the tests drive them on temporary directories):
//! - [`settings`]: flags and their Istio-named environment variables;
//! - [`binaries`]: the plugin binary in the host's bin dirs;
//! - [`conf_select`]: which CNI config file the runtime uses (kubelet's choice);
//! - [`plugin_entry`] and [`chain`]: our entry and the pure config transformations;
//! - [`config_file`] and [`undo`]: writing the config and undoing it byte for byte;
//! - [`kubeconfig`]: the plugin's kubeconfig from the service account;
//! - [`watch`], [`rate_limit`] and [`signals`]: keeping it all in place until SIGTERM;
//! - [`installer`]: the three together, in the order a runtime needs them;
//! - [`atomic_file`]: every write is a temporary file renamed into place.

pub mod atomic_file;
pub mod binaries;
pub mod chain;
pub mod conf_select;
pub mod config_file;
pub mod error;
pub mod installer;
pub mod kubeconfig;
pub mod plugin_entry;
pub mod rate_limit;
pub mod settings;
pub mod signals;
pub mod undo;
pub mod watch;

use std::ffi::OsString;

use redirect_program::logging::Sink;
use tracing::level_filters::LevelFilter;

use crate::agent::Agent;

pub use config_file::{CniConfig, ConfigStatus};
pub use error::{Error, Result};
pub use installer::Installer;
pub use plugin_entry::{plugin_entry, standalone_conf, PLUGIN_TYPE};
pub use settings::{Parsed, Settings};
pub use watch::{StopHandle, WatchOptions};

/// Install, keep installed until `stop`, then (unless `--cleanup-on-exit=false`) uninstall.
///
/// Fatal at start: a bad binary path or bin dir, or no kubeconfig (no service account or
/// KUBERNETES_SERVICE_HOST). A CNI config that cannot be written yet is retried.
pub fn run(settings: Settings, stop: &StopHandle, opts: &WatchOptions) -> Result<()> {
    run_with_agent(settings, stop, opts, None)
}

/// [`run`], with the node agent (repair, untaint, endpoints) told when the plugin is installed,
/// and stopped before anything is uninstalled.
pub fn run_with_agent(
    settings: Settings,
    stop: &StopHandle,
    opts: &WatchOptions,
    agent: Option<Agent>,
) -> Result<()> {
    let cleanup = settings.cleanup_on_exit;
    let mut inst = Installer::new(settings)?;
    inst.install_binaries()?;
    inst.ensure_kubeconfig()?;
    let watched = watch::watch(&mut inst, stop, opts, &|ready| {
        if let Some(a) = &agent {
            a.set_ready(ready);
        }
    });
    if let Some(a) = agent {
        a.stop();
    }
    let cleaned = if cleanup {
        tracing::info!("stopping: removing what was installed");
        inst.uninstall()
    } else {
        tracing::info!("stopping: leaving the installation in place (--cleanup-on-exit=false)");
        Ok(())
    };
    match (watched, cleaned) {
        (Err(e), Err(u)) => {
            tracing::error!("{u}");
            Err(e)
        }
        (Err(e), Ok(())) => Err(e),
        (Ok(()), cleaned) => cleaned,
    }
}

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
    match run_with_agent(settings, &stop, &WatchOptions::default(), Some(agent)) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            1
        }
    }
}
