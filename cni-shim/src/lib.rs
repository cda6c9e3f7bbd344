//! redirect-cni: the CNI plugin and its node installer.

pub mod install;
pub mod kube;
