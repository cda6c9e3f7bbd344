//! A packet's real path through a namespace's rules, from nf_tables' trace reports: a
//! [`Tracer`] puts a short-lived trace table of its own in the namespace (one rule, for one
//! flow: [`TraceMatch`]), which the kernel removes when the tracer's process dies (owner
//! tables, Linux 5.12+) and the tracer removes when dropped; it reads each report
//! ([`TraceEvent`]: table, chain, rule handle, verdict, the packet's addresses, interfaces and
//! mark) and our table's rules by handle ([`RuleHandle`]). [`send_probe`] sends the flow's
//! first packet from inside a namespace. `redirect-validate trace` sets these side by side
//! with the evaluator's path.

pub use redirect_kernel::nft::{trace_table, RuleHandle, TraceMatch, TRACE_CHAIN, TRACE_PRIORITY};
pub use redirect_kernel::trace::{
    send_probe, TraceAttribute, TraceEvent, TraceKind, TraceReader, Tracer, NFNLGRP_NFTRACE,
};
/// The names of our table and its chains, which the reports name: a base chain per stage and
/// hook (dispatching on the family), a family's chain per planned chain.
pub use redirect_model::table::{base_chain_name, chain_name, TABLE};
