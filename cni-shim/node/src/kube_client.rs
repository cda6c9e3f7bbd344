//! The node agent's API client: the service account's token file (re-read by kube as the
//! kubelet rotates it) and CA, and the API server from KUBERNETES_SERVICE_*. The plugin's
//! kubeconfig embeds the token instead, as the plugin runs once and reads it each time.

use std::path::Path;

use ::kube::client::ClientBuilder;
use ::kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use ::kube::{Client, Config};

use crate::informers::started::WatchStarts;
use crate::settings::Settings;

const AGENT_USER_AGENT: &str = concat!("redirect-cni-agent/", env!("CARGO_PKG_VERSION"));

/// A client for `server` that authenticates with the token in `token_file` and verifies the
/// server with the PEM CA bundle `ca` (`None`: no verification, `--skip-tls-verify`); the
/// watches the server accepts are noted in `starts` (the informers' sign that a quiet watch is
/// back).
pub async fn agent_client(
    server: &str,
    ca: Option<&Path>,
    token_file: &Path,
    starts: &WatchStarts,
) -> Result<Client, String> {
    let name = "agent".to_string();
    let kc = Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.clone(),
            cluster: Some(Cluster {
                server: Some(server.to_owned()),
                certificate_authority: ca.map(|p| p.to_string_lossy().into_owned()),
                insecure_skip_tls_verify: ca.is_none().then_some(true),
                ..Cluster::default()
            }),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.clone(),
            auth_info: Some(AuthInfo {
                token_file: Some(token_file.to_string_lossy().into_owned()),
                ..AuthInfo::default()
            }),
        }],
        contexts: vec![NamedContext {
            name: name.clone(),
            context: Some(Context {
                cluster: name.clone(),
                user: Some(name.clone()),
                namespace: None,
                extensions: None,
            }),
        }],
        current_context: Some(name),
        ..Kubeconfig::default()
    };
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("API client for {server}: {e}"))?;
    // The proxy of the node's image pulls is not the way to the API server.
    config.proxy_url = None;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(AGENT_USER_AGENT),
    ));
    let builder =
        ClientBuilder::try_from(config).map_err(|e| format!("API client for {server}: {e}"))?;
    Ok(builder.with_layer(&starts.layer()).build())
}

/// The agent's API client, from the same service account and server as the kubeconfig; the
/// watches it has accepted are noted in `starts` (the informers'), or nowhere.
pub(crate) async fn client(s: &Settings, starts: Option<&WatchStarts>) -> Result<Client, String> {
    let host = s.kubernetes_service_host.as_deref().ok_or_else(|| {
        "KUBERNETES_SERVICE_HOST is not set: the agent cannot reach the API server".to_string()
    })?;
    let server = crate::server_url(
        &s.kubernetes_service_protocol,
        host,
        &s.kubernetes_service_port,
    );
    let nowhere = WatchStarts::default();
    let starts = starts.unwrap_or(&nowhere);
    agent_client(&server, s.ca_path().as_deref(), &s.token_path(), starts).await
}
