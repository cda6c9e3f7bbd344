//! The three things installed on a node, in the order a runtime needs them: the binary, the
//! kubeconfig, then the CNI config that makes runtimes call the plugin. Uninstall goes the
//! other way round.

use std::fs;
use std::path::PathBuf;

use super::binaries::{self, BinaryInstall};
use super::config_file::{CniConfig, ConfigStatus};
use super::kubeconfig::Kubeconfig;
use crate::error::{Error, Result};
use crate::settings::Settings;
use crate::PLUGIN_TYPE;

/// The plugin's installation on this node: its binary, kubeconfig and CNI config, put in
/// place and removed together.
#[derive(Debug)]
pub struct Installer {
    pub(crate) settings: Settings,
    /// The plugin binary copied into the bin dirs.
    pub(crate) binary: PathBuf,
    pub(crate) config: CniConfig,
    pub(crate) kubeconfig: Kubeconfig,
    /// Whether this installer wrote the kubeconfig already: a later write puts back what
    /// someone else changed.
    kubeconfig_written: std::cell::Cell<bool>,
}

impl Installer {
    /// Resolve the binary, create the run dir and net dir if missing, load the previous record.
    pub fn new(settings: Settings) -> Result<Self> {
        let binary = match &settings.binary {
            Some(b) => b.clone(),
            // The image holds the plugin beside this binary (/usr/local/bin).
            None => std::env::current_exe()
                .map_err(|e| Error::io("find this executable", "/proc/self/exe", e))?
                .with_file_name(PLUGIN_TYPE),
        };
        crate::run_dir::ensure(&settings.cni_agent_run_dir)?;
        let net_dir = &settings.mounted_cni_net_dir;
        fs::create_dir_all(net_dir).map_err(|e| Error::io("create", net_dir, e))?;
        Ok(Installer {
            config: CniConfig::new(&settings),
            kubeconfig: Kubeconfig::new(&settings),
            kubeconfig_written: std::cell::Cell::new(false),
            binary,
            settings,
        })
    }

    /// Copy the binary into every bin dir where it is missing or differs.
    pub fn install_binaries(&self) -> Result<()> {
        for dir in &self.settings.cni_bin_dirs {
            if binaries::install_binary(&self.binary, dir)? == BinaryInstall::Copied {
                tracing::info!(
                    "copied {} to {}",
                    self.binary.display(),
                    binaries::binary_path(dir).display()
                );
            }
        }
        Ok(())
    }

    /// Write the kubeconfig if it is missing or out of date; `Ok(true)` if written.
    pub fn ensure_kubeconfig(&self) -> Result<bool> {
        let written = self.kubeconfig.ensure()?;
        if written && self.kubeconfig_written.replace(true) {
            tracing::warn!(
                "the kubeconfig {} was changed, replaced or removed by someone else (the token or CA it carries did not change); written again",
                self.kubeconfig.path.display()
            );
        } else if written {
            tracing::info!(
                "wrote the kubeconfig {} (mode {:04o}, token from {})",
                self.kubeconfig.path.display(),
                self.kubeconfig.mode,
                self.kubeconfig.token_path.display()
            );
        }
        Ok(written)
    }

    /// Put the CNI config right (see `CniConfig::reconcile`).
    pub fn reconcile_config(&mut self) -> Result<ConfigStatus> {
        let status = self.config.reconcile()?;
        if let ConfigStatus::Written(path) = &status {
            tracing::info!(
                "wrote the CNI config {} ({})",
                path.display(),
                if self.settings.chained {
                    "chained"
                } else {
                    "standalone"
                }
            );
        }
        Ok(status)
    }

    /// Everything, in order: binaries, kubeconfig, CNI config.
    pub fn install(&mut self) -> Result<ConfigStatus> {
        self.install_binaries()?;
        self.ensure_kubeconfig()?;
        self.reconcile_config()
    }

    /// Remove what was installed: our CNI config change, the kubeconfig, our binaries. Every
    /// step is tried; the first error is returned.
    pub fn uninstall(&mut self) -> Result<()> {
        let mut first_err = None;
        let mut keep = |r: Result<()>| {
            if let Err(e) = r {
                tracing::error!("uninstall: {}", redirect_program::errors::chain(&e));
                first_err.get_or_insert(e);
            }
        };
        keep(self.config.undo());
        keep(self.kubeconfig.remove().map(|removed| {
            if removed {
                tracing::info!("removed {}", self.kubeconfig.path.display());
            }
        }));
        for dir in &self.settings.cni_bin_dirs {
            keep(binaries::remove_binary(&self.binary, dir).map(|removed| {
                if removed {
                    tracing::info!("removed {}", binaries::binary_path(dir).display());
                }
            }));
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
