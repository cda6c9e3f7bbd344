//! Istio's validation: the probe (`probe`), and why it failed (`diagnosis`). redirect-validate
//! and `redirect-init --run-validation` run both.

pub mod diagnosis;
pub mod probe;
