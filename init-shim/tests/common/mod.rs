//! Running the real `redirect-init` binary inside a test namespace; the runner and the state
//! snapshots live in the test kit (`testkit::binary`), shared with redirect-validate.

#![allow(dead_code, unused_imports)]

pub use redirect_testkit::binary::{snapshot, snapshot_effective, snapshot_effective_of, Ran, Run};
use redirect_testkit::TestNetns;

pub const BIN: &str = env!("CARGO_BIN_EXE_redirect-init");

/// Run `redirect-init` inside `ns`; see `testkit::binary::run_in`.
pub fn run_in(ns: &TestNetns, run: &Run) -> Ran {
    redirect_testkit::binary::run_in(BIN, ns, run)
}
