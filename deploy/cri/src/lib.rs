//! A small client of the Kubernetes Container Runtime Interface (CRI, `runtime.v1`), for the
//! tests that drive containerd 2 the way kubelet does.
//!
//! The messages and the two clients ([`v1::runtime_service_client`],
//! [`v1::image_service_client`]) are generated at build time from the CRI's own `api.proto`,
//! which `scripts/install-containerd2.sh` unpacks from Debian's `golang-k8s-cri-api-dev` into
//! `.tools/containerd2/` (or `$REDIRECT_CRI_PROTO`): protox parses it in Rust, tonic writes
//! the client; no protoc, no Go. [`connect`] opens a channel over the runtime's Unix socket.
//!
//! Without the proto the crate builds all the same (so a bare clone builds), with neither the
//! module nor [`connect`]; [`PROTO_MISSING`] then says what to run, and the tests fail with it.

#![deny(missing_docs)]

/// `None` when the client was generated; else why not and what to run
/// (`bash scripts/install-deps.sh`).
#[cfg(not(cri_proto_missing))]
pub const PROTO_MISSING: Option<&str> = None;
/// `None` when the client was generated; else why not and what to run
/// (`bash scripts/install-deps.sh`).
#[cfg(cri_proto_missing)]
pub const PROTO_MISSING: Option<&str> = Some(env!("CRI_PROTO_MISSING"));

/// The CRI's `runtime.v1` package, as generated from `api.proto` (its comments are the
/// CRI's own documentation).
#[cfg(not(cri_proto_missing))]
#[allow(missing_docs, clippy::all, rustdoc::all)]
pub mod v1 {
    tonic::include_proto!("runtime.v1");
}

#[cfg(not(cri_proto_missing))]
mod connect;
#[cfg(not(cri_proto_missing))]
pub use connect::{connect, Cri};
