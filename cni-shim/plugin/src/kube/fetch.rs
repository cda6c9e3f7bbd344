//! The GET: kubeconfig, a client on a current-thread runtime, bounded retries, and errors
//! sorted into what is worth retrying.

use std::error::Error as StdError;
use std::path::Path;
use std::time::{Duration, Instant};

use ::kube::api::Api;
use ::kube::config::{KubeConfigOptions, Kubeconfig};
use ::kube::{Client, Config};
use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::PodInfo;

use super::secret::Secrets;
use super::{FetchPolicy, KubeError};
use cni_protocol::pod as convert;

/// Where the kubeconfig comes from, for every kubeconfig error.
const KUBECONFIG_HINT: &str = "the node agent (`redirect-cni-node`, run by the DaemonSet) \
     writes this file, and the plugin configuration field `kubeconfig` names it: is the \
     installer running on this node, and do the two paths agree?";

const USER_AGENT: &str = concat!("redirect-cni/", env!("CARGO_PKG_VERSION"));

/// Gets pod `namespace`/`name` from the API server that `kubeconfig` (its current context)
/// names, trying as `policy` says, and returns what capture needs of it.
///
/// Runs a current-thread tokio runtime for the duration of the call; call it from synchronous
/// code, not from inside another runtime.
pub fn fetch_pod(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    policy: &FetchPolicy,
) -> Result<PodInfo, KubeError> {
    if !is_dns1123_label(namespace) || !is_dns1123_subdomain(name) {
        tracing::warn!(
            namespace,
            name,
            "not a valid Kubernetes namespace or pod name; the API server is not asked"
        );
        return Err(KubeError::NotFound {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
    }
    let (kc, secrets) = read_kubeconfig(kubeconfig)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| KubeError::Unavailable {
            server: "(not contacted)".to_owned(),
            attempts: 0,
            deadline: Duration::ZERO,
            deadline_hit: false,
            elapsed: Duration::ZERO,
            last: format!("could not start an I/O runtime: {e}"),
        })?;
    let fetch = Fetch {
        path: kubeconfig,
        secrets: &secrets,
        namespace,
        name,
        policy,
    };
    let result = runtime.block_on(fetch.run(kc));
    // Do not wait for a resolver thread that may still be blocked in getaddrinfo.
    runtime.shutdown_background();
    result
}

/// The labels of `namespace`, one GET bounded by `policy`'s request timeout (ambient mode's
/// decision when the node agent does not answer). Same kubeconfig handling as [`fetch_pod`].
pub fn fetch_namespace_labels(
    kubeconfig: &Path,
    namespace: &str,
    policy: &FetchPolicy,
) -> Result<std::collections::BTreeMap<String, String>, KubeError> {
    let (kc, secrets) = read_kubeconfig(kubeconfig)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| KubeError::Config {
            path: kubeconfig.to_owned(),
            reason: format!("could not start an I/O runtime: {e}"),
        })?;
    let fetch = Fetch {
        path: kubeconfig,
        secrets: &secrets,
        namespace,
        name: "",
        policy,
    };
    let result = runtime.block_on(fetch.namespace_labels(kc));
    runtime.shutdown_background();
    result
}

/// Reads and parses the kubeconfig, and collects its secrets.
fn read_kubeconfig(path: &Path) -> Result<(Kubeconfig, Secrets), KubeError> {
    let config_error = |reason: String| KubeError::Config {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        config_error(match e.kind() {
            std::io::ErrorKind::NotFound => format!("does not exist; {KUBECONFIG_HINT}"),
            std::io::ErrorKind::PermissionDenied => format!(
                "cannot be read: permission denied (the plugin runs with the container \
                 runtime's user; check the file's owner and mode); {KUBECONFIG_HINT}"
            ),
            std::io::ErrorKind::InvalidData => {
                format!("is not UTF-8 text, so not a kubeconfig; {KUBECONFIG_HINT}")
            }
            _ => format!("cannot be read: {e}; {KUBECONFIG_HINT}"),
        })
    })?;
    let mut secrets = Secrets::from_text(&text);
    if text.trim().is_empty() {
        return Err(config_error(format!("is empty; {KUBECONFIG_HINT}")));
    }
    let kc = Kubeconfig::read_from(path).map_err(|e| {
        // The parser quotes the values it did not expect, and a value may be a credential
        // that is in the wrong place: quoted values are left out.
        config_error(secrets.scrub(format!(
            "is not a valid kubeconfig: {}; {KUBECONFIG_HINT}",
            without_quoted_values(&chain(&e))
        )))
    })?;
    secrets.add_kubeconfig(&kc);
    Ok((kc, secrets))
}

/// One call of [`fetch_pod`].
struct Fetch<'a> {
    path: &'a Path,
    secrets: &'a Secrets,
    namespace: &'a str,
    name: &'a str,
    policy: &'a FetchPolicy,
}

/// What to do after a failed attempt.
enum Failed {
    /// Give up with this error.
    Final(KubeError),
    /// Try again; this is what went wrong (scrubbed).
    Retry(String),
}

/// How one GET ended.
enum Attempt {
    Got(PodInfo),
    Failed(Failed),
    /// No answer before the whole fetch's deadline: this is what went wrong.
    DeadlineHit(String),
}

impl Fetch<'_> {
    async fn run(&self, kc: Kubeconfig) -> Result<PodInfo, KubeError> {
        let (client, server) = self.client(kc).await?;
        self.get(&Api::namespaced(client, self.namespace), server)
            .await
    }

    /// One GET of the namespace, bounded by the request timeout: its labels.
    async fn namespace_labels(
        &self,
        kc: Kubeconfig,
    ) -> Result<std::collections::BTreeMap<String, String>, KubeError> {
        let (client, server) = self.client(kc).await?;
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
        let unavailable = |last: String| KubeError::Unavailable {
            server: server.clone(),
            attempts: 1,
            deadline: self.policy.request_timeout,
            deadline_hit: false,
            elapsed: Duration::ZERO,
            last: self.secrets.scrub(last),
        };
        match tokio::time::timeout(self.policy.request_timeout, api.get(self.namespace)).await {
            Ok(Ok(ns)) => Ok(ns.metadata.labels.unwrap_or_default()),
            Ok(Err(e)) => Err(unavailable(format!(
                "namespace {}: {}",
                self.namespace,
                chain(&e)
            ))),
            Err(_) => Err(unavailable(format!(
                "namespace {}: no answer within {:?}",
                self.namespace, self.policy.request_timeout
            ))),
        }
    }

    /// The API client the kubeconfig describes, bounded by the policy's request timeout, and
    /// its server (for messages).
    async fn client(&self, kc: Kubeconfig) -> Result<(Client, String), KubeError> {
        let client_error = |what: &str, e: &(dyn StdError + 'static)| KubeError::Config {
            path: self.path.to_owned(),
            reason: self
                .secrets
                .scrub(format!("{what}: {}; {KUBECONFIG_HINT}", chain(e))),
        };
        let kubeconfig_proxy = kc.clusters.iter().any(|c| {
            c.cluster
                .as_ref()
                .and_then(|c| c.proxy_url.as_deref())
                .is_some_and(|p| !p.is_empty())
        });
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| client_error("is not a usable kubeconfig", &e))?;
        if !kubeconfig_proxy {
            // kube takes HTTPS_PROXY from the environment, which the runtime passes on to
            // CNI plugins (often set for image pulls, with the cluster in NO_PROXY, which kube
            // ignores): the API server of our own cluster is reached directly.
            config.proxy_url = None;
        }
        let timeout = Some(self.policy.request_timeout);
        config.connect_timeout = timeout;
        config.read_timeout = timeout;
        config.write_timeout = timeout;
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static(USER_AGENT),
        ));
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config)
            .map_err(|e| client_error("cannot make an API client from it", &e))?;
        Ok((client, server))
    }

    /// GET the pod, retried as the policy says until it comes, a final answer, or the
    /// deadline.
    async fn get(&self, api: &Api<Pod>, server: String) -> Result<PodInfo, KubeError> {
        let attempts = self.policy.attempts.max(1);
        let start = Instant::now();
        let deadline = start + self.policy.deadline;
        let mut last = String::new();
        let mut made = 0;
        let mut deadline_hit = false;
        for attempt in 1..=attempts {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                deadline_hit = true;
                break;
            }
            made = attempt;
            let bound = self.policy.request_timeout.min(left);
            match self.attempt(api, bound, attempt, &server).await {
                Attempt::Got(pod) => return Ok(pod),
                Attempt::Failed(Failed::Final(err)) => return Err(err),
                Attempt::Failed(Failed::Retry(msg)) => last = msg,
                Attempt::DeadlineHit(msg) => {
                    last = msg;
                    deadline_hit = true;
                    break;
                }
            }
            if attempt < attempts {
                // A pause that ends past the deadline would only delay the error.
                if deadline.saturating_duration_since(Instant::now()) <= self.policy.interval {
                    deadline_hit = true;
                    break;
                }
                tracing::debug!(
                    server = %server,
                    attempt,
                    attempts,
                    error = %last,
                    "getting the pod failed; retrying in {:?}",
                    self.policy.interval
                );
                tokio::time::sleep(self.policy.interval).await;
            }
        }
        let elapsed = Duration::from_millis(start.elapsed().as_millis() as u64);
        Err(KubeError::Unavailable {
            server,
            attempts: made,
            deadline: self.policy.deadline,
            deadline_hit,
            elapsed,
            last,
        })
    }

    /// One GET, bounded by `bound` (the request timeout, or less when the deadline is nearer).
    async fn attempt(&self, api: &Api<Pod>, bound: Duration, n: u32, server: &str) -> Attempt {
        match tokio::time::timeout(bound, api.get(self.name)).await {
            Ok(Ok(pod)) => {
                tracing::debug!(
                    namespace = self.namespace,
                    name = self.name,
                    attempt = n,
                    "got the pod from the API server"
                );
                Attempt::Got(convert::pod_info(
                    pod,
                    self.namespace.to_owned(),
                    self.name.to_owned(),
                ))
            }
            Ok(Err(e)) => Attempt::Failed(self.classify(&e, server)),
            Err(_) if bound < self.policy.request_timeout => {
                Attempt::DeadlineHit(format!("no answer before the deadline ({bound:?} left)"))
            }
            Err(_) => Attempt::Failed(Failed::Retry(format!(
                "no answer within the request timeout of {:?}",
                self.policy.request_timeout
            ))),
        }
    }

    /// Sorts a failed GET into final or worth retrying.
    fn classify(&self, e: &::kube::Error, server: &str) -> Failed {
        let scrub = |s: String| self.secrets.scrub(s);
        if let ::kube::Error::Api(status) = e {
            let message = scrub(status.message.clone());
            return match status.code {
                404 => Failed::Final(KubeError::NotFound {
                    namespace: self.namespace.to_owned(),
                    name: self.name.to_owned(),
                }),
                401 => Failed::Final(KubeError::Forbidden {
                    namespace: self.namespace.to_owned(),
                    name: self.name.to_owned(),
                    detail: format!(
                        "401 Unauthorized ({message}): the API server rejected the kubeconfig's \
                         credentials; a service account token expires or is revoked, and the \
                         node installer writes a fresh one into the kubeconfig: is it running?"
                    ),
                }),
                403 => Failed::Final(KubeError::Forbidden {
                    namespace: self.namespace.to_owned(),
                    name: self.name.to_owned(),
                    detail: format!(
                        "403 Forbidden ({message}); the service account whose token is in the \
                         kubeconfig needs the RBAC permission `get` on `pods` (apiGroups [\"\"]) \
                         in every namespace, through a ClusterRole and ClusterRoleBinding"
                    ),
                }),
                code => Failed::Retry(format!(
                    "{code} {}: {message}",
                    scrub(status.reason.clone())
                )),
            };
        }
        if let Some(tls) = tls_verification_failure(e) {
            return Failed::Final(KubeError::Config {
                path: self.path.to_owned(),
                reason: scrub(format!(
                    "TLS verification of the API server {server} failed: {tls}; the \
                     kubeconfig's certificate-authority-data must hold the cluster's CA (the \
                     installer copies the service account's ca.crt), and the server's \
                     certificate must name the kubeconfig's `server` host"
                )),
            });
        }
        if let Some(auth) = find::<::kube::client::AuthError>(e) {
            return Failed::Final(KubeError::Config {
                path: self.path.to_owned(),
                reason: scrub(format!(
                    "its credentials cannot be used: {}; {KUBECONFIG_HINT}",
                    chain(auth)
                )),
            });
        }
        Failed::Retry(scrub(chain(e)))
    }
}

/// `e` and its causes. An `io::Error` hides its payload from `source()` (and hyper-rustls
/// wraps one io::Error in another): its payload is followed instead.
fn causes<'a>(
    e: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(e), |&err| match err.downcast_ref::<std::io::Error>() {
        Some(io) => match io.get_ref() {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => io.source(),
        },
        None => err.source(),
    })
}

/// The first error of type `T` among `e` and its causes.
fn find<'a, T: StdError + 'static>(e: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    causes(e).find_map(|err| err.downcast_ref::<T>())
}

/// A certificate verification failure among `e`'s causes, described.
fn tls_verification_failure(e: &(dyn StdError + 'static)) -> Option<String> {
    let rustls::Error::InvalidCertificate(cert) = find::<rustls::Error>(e)? else {
        return None;
    };
    let why = match cert {
        rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature => {
            "the server's certificate is not signed by the kubeconfig's certificate authority"
        }
        rustls::CertificateError::NotValidForName
        | rustls::CertificateError::NotValidForNameContext { .. } => {
            "the server's certificate does not name the host it was reached at"
        }
        rustls::CertificateError::Expired | rustls::CertificateError::ExpiredContext { .. } => {
            "the server's certificate has expired"
        }
        _ => "the server's certificate was rejected",
    };
    Some(format!(
        "{why} ({})",
        rustls::Error::InvalidCertificate(cert.clone())
    ))
}

/// `e` and its sources, each once, joined by ": ".
fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let s = err.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = err.source();
    }
    out
}

/// `text` with the contents of every `"..."` (serde's quoting of a string value) and of every
/// long `` `...` `` (its quoting of other values; field names are short) replaced by `…`.
fn without_quoted_values(text: &str) -> String {
    const LONG: usize = 24;
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest.as_bytes()[open];
        out.push_str(&rest[..=open]);
        let body = &rest[open + 1..];
        // The closing quote, skipping backslash escapes inside "...".
        let mut close = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if quote == b'"' && !escaped => escaped = true,
                c if c as u32 == u32::from(quote) && !escaped => {
                    close = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(close) = close else {
            // Unbalanced: the rest may be a value; leave it out.
            out.push('…');
            return out;
        };
        let value = &body[..close];
        if quote == b'"' || value.chars().count() >= LONG {
            out.push('…');
        } else {
            out.push_str(value);
        }
        out.push(quote as char);
        rest = &body[close + 1..];
    }
    out.push_str(rest);
    out
}

/// RFC 1123 label, as Kubernetes checks namespace names.
fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// RFC 1123 subdomain, as Kubernetes checks pod names.
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}
