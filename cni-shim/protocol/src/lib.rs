//! What the redirect-cni plugin and its node agent share, so that neither program is the
//! other's library:
//!
//! - [`cni`]: the CNI protocol as the plugin speaks it (spec 1.1): its commands, versions, the
//!   error object and its codes, CNI_ARGS, the network config on stdin (which the agent writes
//!   and checks as the plugin parses it) and the result on stdout;
//! - [`events`]: what the plugin tells the agent after each call, and the agent's readiness
//!   file the plugin's STATUS reads;
//! - [`ambient`]: the plugin's request to the agent at ADD and CHECK in ambient mode;
//! - [`seqpacket`]: `SOCK_SEQPACKET` datagrams with descriptors riding along (that request,
//!   and ZDS), and [`gate`], the door of the agent's two such sockets;
//! - [`folder`]: whether a folder is the agent's alone (the run directory, ztunnel's folder);
//! - [`pod`]: a pod as the API gives it, as capture reads it.

#![deny(missing_docs)]

pub mod ambient;
pub mod cni;
pub mod events;
pub mod folder;
pub mod gate;
pub mod pod;
pub mod seqpacket;
