//! ZDS, the protocol between the node agent and ztunnel (Istio's ambient data plane): the
//! agent hands ztunnel each enrolled pod's network namespace, in which ztunnel binds its
//! in-pod listeners. [`proto`]: the messages; [`wire`]: one datagram each on a
//! `SOCK_SEQPACKET` socket, the namespace as `SCM_RIGHTS`; [`server`]: the listening side, what
//! each connection acked, its snapshot on each connection and its one-request-at-a-time
//! exchange (the door and the handshakes in `handshake`; what both share, the pods held and
//! the connections open, in `state`). Used by the node agent, ztunnel's stand-in
//! (`testpod ztunnel`) and the tests.

#![deny(missing_docs)]

mod handshake;
pub mod proto;
pub mod server;
mod state;
pub mod wire;
