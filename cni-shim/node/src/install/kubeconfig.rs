//! The kubeconfig the plugin uses to read pods: cluster `local` (the API server from
//! KUBERNETES_SERVICE_*, the CA inline), user `redirect-cni` with the service account's token,
//! context `redirect-cni-context`. Written atomically with KUBECONFIG_MODE, and again whenever the
//! token (or CA) changes. The token is never logged and never part of an error message.

use std::fs;
use std::path::{Path, PathBuf};

use crate::atomic_file::{self, FileAttrs};
use crate::error::{Error, Result};
use crate::server_url;
use crate::settings::Settings;

/// What goes into the kubeconfig.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct KubeconfigContent {
    pub server: String,
    /// PEM bytes; `None` with `insecure_skip_tls_verify`.
    pub ca: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
    pub token: String,
}

impl std::fmt::Debug for KubeconfigContent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeconfigContent")
            .field("server", &self.server)
            .field("ca_bytes", &self.ca.as_ref().map(Vec::len))
            .field("insecure_skip_tls_verify", &self.insecure_skip_tls_verify)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// The kubeconfig text (YAML; strings double-quoted, as JSON strings are valid YAML).
pub(crate) fn render(c: &KubeconfigContent) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let tls = match (&c.ca, c.insecure_skip_tls_verify) {
        (_, true) | (None, _) => "    insecure-skip-tls-verify: true\n".to_string(),
        (Some(ca), false) => format!("    certificate-authority-data: {}\n", q(&base64(ca))),
    };
    format!(
        "# Kubeconfig file for the redirect-cni plugin, written by `redirect-cni-node`.\n\
         apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: local\n  \
           cluster:\n    \
             server: {server}\n\
         {tls}\
         users:\n\
         - name: redirect-cni\n  \
           user:\n    \
             token: {token}\n\
         contexts:\n\
         - name: redirect-cni-context\n  \
           context:\n    \
             cluster: local\n    \
             user: redirect-cni\n\
         current-context: redirect-cni-context\n",
        server = q(&c.server),
        token = q(&c.token),
    )
}

/// Standard base64 with padding (RFC 4648 §4).
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Keeps `<run dir>/redirect-cni-kubeconfig` in line with the service account.
#[derive(Debug, Clone)]
pub(crate) struct Kubeconfig {
    pub path: PathBuf,
    pub mode: u32,
    pub token_path: PathBuf,
    pub ca_path: Option<PathBuf>,
    pub server: Option<String>,
}

impl Kubeconfig {
    pub fn new(s: &Settings) -> Self {
        Kubeconfig {
            path: s.kubeconfig_path(),
            mode: s.kubeconfig_mode,
            token_path: s.token_path(),
            ca_path: s.ca_path(),
            server: s.kubernetes_service_host.as_deref().map(|h| {
                server_url(
                    &s.kubernetes_service_protocol,
                    h,
                    &s.kubernetes_service_port,
                )
            }),
        }
    }

    /// The directories whose changes may change the kubeconfig (token, CA).
    pub fn watched_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::iter::once(&self.token_path)
            .chain(self.ca_path.as_ref())
            .filter_map(|p| p.parent().map(Path::to_path_buf))
            .collect();
        dirs.dedup();
        dirs
    }

    /// Read the token and CA now.
    pub fn content(&self) -> Result<KubeconfigContent> {
        let server = self.server.clone().ok_or_else(|| {
            Error::Kubeconfig(
                "KUBERNETES_SERVICE_HOST is not set: is this running in a pod? (or pass \
                 --kubernetes-service-host)"
                    .into(),
            )
        })?;
        let token = fs::read(&self.token_path).map_err(|e| {
            Error::ServiceAccount(format!(
                "cannot read the service account token {}: {e}; mount the service account \
                 token (automountServiceAccountToken) or pass --service-account-dir",
                self.token_path.display()
            ))
        })?;
        let token = String::from_utf8(token)
            .map_err(|_| {
                Error::ServiceAccount(format!(
                    "the service account token {} is not UTF-8 text",
                    self.token_path.display()
                ))
            })?
            .trim()
            .to_string();
        if token.is_empty() {
            return Err(Error::ServiceAccount(format!(
                "the service account token {} is empty",
                self.token_path.display()
            )));
        }
        let ca = match &self.ca_path {
            None => None,
            Some(p) => Some(fs::read(p).map_err(|e| {
                Error::ServiceAccount(format!(
                    "cannot read the CA bundle {}: {e}; set KUBE_CA_FILE, or SKIP_TLS_VERIFY=true",
                    p.display()
                ))
            })?),
        };
        Ok(KubeconfigContent {
            server,
            insecure_skip_tls_verify: ca.is_none(),
            ca,
            token,
        })
    }

    /// Write the kubeconfig if it is missing or differs (content or mode); `Ok(true)` if written.
    pub fn ensure(&self) -> Result<bool> {
        let text = render(&self.content()?);
        let current = atomic_file::read_if_exists(&self.path)?;
        let mode = atomic_file::attrs_of(&self.path)?.map(|a| a.mode);
        if current.as_deref() == Some(text.as_bytes()) && mode == Some(self.mode) {
            return Ok(false);
        }
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        }
        atomic_file::write_atomic(&self.path, text.as_bytes(), FileAttrs::mode(self.mode))?;
        Ok(true)
    }

    /// Delete the kubeconfig; `Ok(false)` if it was not there.
    pub fn remove(&self) -> Result<bool> {
        atomic_file::remove(&self.path)
    }
}
