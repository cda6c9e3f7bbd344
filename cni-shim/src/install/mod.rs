//! `redirect-cni install`: the node DaemonSet's entrypoint (copies the binary, writes or chains
//! the CNI config, writes the kubeconfig, keeps them in place, removes exactly what it added).
//!
//! Its settings, errors and the entry it writes are `crate::node`'s. The pieces, each usable on
//! its own (the tests drive them on temporary directories):
//! - [`binaries`]: the plugin binary in the host's bin dirs;
//! - [`conf_select`]: which CNI config file the runtime uses (kubelet's choice);
//! - [`chain`]: the pure config transformations around our entry;
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
pub mod installer;
pub mod kubeconfig;
pub mod rate_limit;
pub mod signals;
pub mod undo;
pub mod watch;

pub use config_file::{CniConfig, ConfigStatus};
pub use installer::Installer;
pub use watch::{StopHandle, WatchOptions};

use crate::node::{Result, Settings};

/// Install, keep installed until `stop`, then (unless `--cleanup-on-exit=false`) uninstall.
/// `ready` hears whether the plugin is installed, at each change; `stopping` runs before
/// anything is uninstalled.
///
/// Fatal at start: a bad binary path or bin dir, or no kubeconfig (no service account or
/// KUBERNETES_SERVICE_HOST). A CNI config that cannot be written yet is retried.
pub fn run(
    settings: Settings,
    stop: &StopHandle,
    opts: &WatchOptions,
    ready: &dyn Fn(bool),
    stopping: &dyn Fn(),
) -> Result<()> {
    let cleanup = settings.cleanup_on_exit;
    let mut inst = Installer::new(settings)?;
    inst.install_binaries()?;
    inst.ensure_kubeconfig()?;
    let watched = watch::watch(&mut inst, stop, opts, ready);
    stopping();
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
