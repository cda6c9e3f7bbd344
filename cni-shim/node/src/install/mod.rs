//! The installer of `redirect-cni-node`, the node DaemonSet's entrypoint (copies the binary, writes or chains
//! the CNI config, writes the kubeconfig, keeps them in place, removes exactly what it added).
//!
//! Its settings, errors and the entry it writes are the crate's. The pieces, each usable on
//! its own (the tests drive them on temporary directories):
//! - [`binaries`]: the plugin binary in the host's bin dirs;
//! - [`conf_select`]: which CNI config file the runtime uses (kubelet's choice);
//! - [`chain`]: the pure config transformations around our entry;
//! - `config_file` and `undo` (private): writing the config and undoing it byte for byte;
//! - [`kubeconfig`]: the plugin's kubeconfig from the service account;
//! - [`watch`], [`rate_limit`] and [`signals`]: keeping it all in place until SIGTERM;
//! - [`installer`]: the three together, in the order a runtime needs them.
//!
//! Every write is a temporary file renamed into place (`crate::atomic_file`).

pub mod binaries;
pub mod chain;
pub mod conf_select;
pub(crate) mod config_file;
pub mod installer;
pub mod kubeconfig;
pub(crate) mod owned_file;
pub mod rate_limit;
pub mod signals;
pub(crate) mod undo;
pub mod watch;

pub use config_file::ConfigStatus;
pub use installer::Installer;
pub use watch::{StopHandle, WatchOptions};

use crate::telemetry::Install;
use crate::{Error, Result, Settings};
use cni_protocol::events::Readiness;

/// What the installer tells the process that runs it (the node agent, in the DaemonSet).
pub trait Progress {
    /// After every pass of the watcher: installed, or not and why.
    fn ready(&self, _verdict: &Readiness) {}
    /// An install step ended (Istio's `istio_cni_installs_total`).
    fn installed(&self, _result: Install) {}
    /// Before anything is uninstalled.
    fn stopping(&self) {}
    /// On a clean stop with `--cleanup-on-exit`: a reason to leave the installation in place
    /// for the next agent (an upgrade), or `None` to remove it.
    fn keep_installed(&self) -> Option<String> {
        None
    }
}

/// Tells nobody.
pub struct Quiet;

impl Progress for Quiet {}

/// The install step a kubeconfig error failed, in Istio's words.
pub fn kubeconfig_failure(e: &Error) -> Install {
    match e {
        Error::ServiceAccount(_) => Install::ReadServiceAccountFailure,
        _ => Install::CreateKubeconfigFailure,
    }
}

/// Install, keep installed until `stop`, then (unless `--cleanup-on-exit=false`) uninstall.
/// `progress` hears whether the plugin is installed after every pass, each install step's
/// result, and when the uninstall begins.
///
/// Fatal at start: a bad binary path or bin dir, or no kubeconfig (no service account or
/// KUBERNETES_SERVICE_HOST). A CNI config that cannot be written yet is retried.
pub fn run(
    settings: Settings,
    stop: &StopHandle,
    opts: &WatchOptions,
    progress: &dyn Progress,
) -> Result<()> {
    let cleanup = settings.cleanup_on_exit;
    let mut inst = Installer::new(settings)?;
    inst.install_binaries()
        .inspect_err(|_| progress.installed(Install::CopyBinariesFailure))?;
    inst.ensure_kubeconfig()
        .inspect_err(|e| progress.installed(kubeconfig_failure(e)))?;
    let watched = watch::watch(&mut inst, stop, opts, progress);
    progress.stopping();
    let cleaned = match (
        cleanup,
        watched.is_ok().then(|| progress.keep_installed()).flatten(),
    ) {
        (false, _) => {
            tracing::info!("stopping: leaving the installation in place (--cleanup-on-exit=false)");
            Ok(())
        }
        (true, Some(why)) => {
            tracing::info!("stopping: leaving the installation in place: {why}");
            Ok(())
        }
        (true, None) => {
            tracing::info!("stopping: removing what was installed");
            inst.uninstall()
        }
    };
    match (watched, cleaned) {
        (Err(e), Err(u)) => {
            tracing::error!("{}", redirect_program::errors::chain(&u));
            Err(e)
        }
        (Err(e), Ok(())) => Err(e),
        (Ok(()), cleaned) => cleaned,
    }
}
