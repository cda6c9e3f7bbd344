//! Ambient mode (Istio's ztunnel data plane), being built: so far the ZDS server (`zds`) that
//! hands ztunnel the pods' namespaces. The agent does not start it yet; the enrollment by label,
//! the in-pod rules and the host's probe rule come next (issue "Ambient mode").

pub mod zds;
