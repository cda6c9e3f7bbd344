//! Istio's validation probe as a library call ([`run`] a [`ProbeSpec`]: listen on the inbound
//! port, connect out as the proxy's UID, see whether capture sent it there), and why it failed
//! ([`diagnose`] the [`Facts`] gathered from the kernel).

pub use redirect_istio::validation::diagnosis::{
    diagnose, gather_facts, read_kernel, Cause, Diagnosis, Facts, KernelView,
};
pub use redirect_istio::validation::probe::{run, ProbeFailure, ProbeSpec, ProbeSuccess};
