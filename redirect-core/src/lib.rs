//! redirect-core: a pod's traffic capture for a service-mesh sidecar, compatible with Istio.
//!
//! `CaptureConfig` (what the mesh wants) → `plan()` → `Ruleset` (backend-neutral) → the nftables
//! netlink backend (`nft`), the renderers (`render`), and later the evaluator. `routes` programs
//! TPROXY policy routing and `::6` on `lo`; `netns` runs code inside a pod's network namespace.

mod alloc;
pub mod capture;
pub mod config;
pub mod diagnosis;
pub mod environ;
pub mod error;
pub mod eval;
pub mod istio;
pub mod logging;
pub mod netns;
pub mod nft;
pub mod plan;
pub mod probe;
pub mod render;
pub mod routes;
pub mod ruleset;
mod sockopt;

pub use config::CaptureConfig;
pub use error::{Error, Result};
pub use plan::{plan, plan_with};
pub use ruleset::Ruleset;
pub use sockopt::original_dst;
