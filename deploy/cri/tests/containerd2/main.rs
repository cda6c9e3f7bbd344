//! containerd 2 (Debian sid's 2.1.9, `.tools/containerd2`) driven through the CRI as kubelet
//! drives it, with `redirect-cni` chained after bridge and host-local in a cniVersion 1.1.0
//! conflist that asks for the pods' annotations. Each test has a containerd of its own in
//! namespaces of its own (`containerd.rs`); every call of our plugin is logged with its time.
//!
//! - a sandbox with Istio's sidecar annotations gets our table, equal to what the annotations
//!   ask; StopPodSandbox runs DEL and the table is gone;
//! - containerd calls CNI STATUS when asked for its CRI `Status` (and never on its own), and
//!   the `NetworkReady` condition follows the node agent's readiness file; a sandbox started
//!   while the agent is not ready is not held by containerd, and is captured all the same;
//! - containerd 2.1.9 never calls CNI GC (go-cni has no GC call): any GC seen must succeed.
//!
//! `REDIRECT_CRI_BREAK=unchained` (no `redirect-cni` in the conflist) or `status-ready` (STATUS
//! answered "ready" without the plugin) breaks the set-up on purpose: the tests must fail.
//! Without the CRI's api.proto (`scripts/install-deps.sh` unpacks it) the client is not
//! generated and `the_cri_client_is_generated` fails saying so.

#[cfg(not(cri_proto_missing))]
mod containerd;
#[cfg(not(cri_proto_missing))]
mod scenarios;

/// The client exists: without `.tools/containerd2/api.proto` this fails, saying what to run.
#[test]
fn the_cri_client_is_generated() {
    if let Some(why) = cri_client::PROTO_MISSING {
        panic!("the CRI client was not generated, so containerd 2's tests cannot run: {why}");
    }
}
