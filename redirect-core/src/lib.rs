//! redirect-core: a pod's traffic captured for its service-mesh sidecar.

pub use ipnet;
pub use redirect_istio as istio;
pub use redirect_kernel as kernel;
pub use redirect_model as model;
