//! A channel over the runtime's Unix socket.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::v1::image_service_client::ImageServiceClient;
use crate::v1::runtime_service_client::RuntimeServiceClient;

/// Both CRI services on one channel.
#[derive(Clone)]
pub struct Cri {
    /// Sandboxes, containers, the runtime's status.
    pub runtime: RuntimeServiceClient<Channel>,
    /// Images.
    pub image: ImageServiceClient<Channel>,
}

/// Connects to the CRI server listening on the Unix socket `socket` (containerd's
/// `grpc.address`). The connection is made now, so a runtime not listening is an error here.
/// Must run inside a Tokio runtime.
pub async fn connect(socket: &Path) -> Result<Cri, tonic::transport::Error> {
    let path: PathBuf = socket.to_path_buf();
    // The URI is never dialled: the connector ignores it and opens the socket.
    let channel = Endpoint::from_static("http://cri.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await?;
    Ok(Cri {
        runtime: RuntimeServiceClient::new(channel.clone()),
        image: ImageServiceClient::new(channel),
    })
}
