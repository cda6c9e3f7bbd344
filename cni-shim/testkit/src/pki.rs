//! PKI and kubeconfigs for the stand-ins of the Kubernetes API server: a cluster CA and a
//! server certificate made here with rcgen, a kubeconfig with `certificate-authority-data` and
//! a bearer token, and the `Status` bodies the API server answers errors with.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// The bearer token in every kubeconfig here: it must never show in an error or a log.
pub const TOKEN: &str =
    "eyJhbGciOiJSUzI1NiIsImtpZCI6InN0YW5kLWluIn0.c3RhbmQtaW4tc2VjcmV0LXRva2Vu.c2ln";

/// A cluster CA and a server configuration whose certificate it signed.
pub struct Pki {
    /// The CA's certificate in PEM, for the clients to trust.
    pub ca_pem: String,
    /// The server's TLS configuration: its certificate and key.
    pub server: Arc<rustls::ServerConfig>,
}

/// A CA and a server certificate for 127.0.0.1 and localhost.
pub fn pki() -> Pki {
    pki_with("stand-in cluster CA", &["127.0.0.1", "localhost"])
}

/// As [`pki`], with a server certificate for these names (IP addresses become IP SANs).
pub fn pki_for(names: &[&str]) -> Pki {
    pki_with("stand-in cluster CA", names)
}

/// A CA with this common name, and a server certificate it signed for these names.
pub fn pki_with(ca_name: &str, names: &[&str]) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();

    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    let cert = params.signed_by(&key, &ca).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    Pki {
        ca_pem: ca.pem(),
        server: Arc::new(server),
    }
}

/// A kubeconfig as the node installer writes it (one cluster, one user with the token
/// [`TOKEN`]), written to `dir/redirect-cni-kubeconfig`.
pub fn write_kubeconfig(dir: &Path, server: &str, ca_pem: &str) -> PathBuf {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let path = dir.join("redirect-cni-kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: redirect-cni
  user:
    token: \"{TOKEN}\"
contexts:
- name: redirect-cni-context
  context:
    cluster: local
    user: redirect-cni
current-context: redirect-cni-context
"
        ),
    )
    .unwrap();
    path
}

/// The HTTP reason phrase of a status code.
pub fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Whatever",
    }
}

/// The `reason` of a `Status` the API server sends with this code.
pub fn status_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// A `Status` as the API server sends it with an error.
pub fn status_body(code: u16, message: &str) -> String {
    status_value(code, status_reason(code), message).to_string()
}

/// A failed `Status` with this code, reason and message.
pub fn status_value(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}
