//! The repair controller's parts (Istio's `cni/pkg/repair`, see `docs/migrating.md`): which
//! pods started without the plugin's rules (`detect`), and where a running pod's network
//! namespace is (`pod_netns`). The controller that watches pods and acts on them is not
//! written yet (issue 17); nothing here runs in the shipped programs until it is.

pub mod detect;
pub mod pod_netns;
