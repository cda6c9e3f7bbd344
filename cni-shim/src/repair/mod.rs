//! The repair controller's parts (Istio's `cni/pkg/repair`): which pods started without the
//! plugin's rules (`detect`), where a running pod's network namespace is (`pod_netns`), and
//! repairing one in place (`in_place`). The controller that watches pods and acts on them is
//! not written yet (issue 17): nothing here runs in the shipped programs until it is.

pub mod detect;
pub mod in_place;
pub mod pod_netns;
