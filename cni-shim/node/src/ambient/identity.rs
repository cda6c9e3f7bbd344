//! Which network namespace is a pod's: the agent binds a pod's identity (what ztunnel serves
//! it as, with its mTLS identity) to a namespace only when the namespace holds the pod's
//! addresses, as Istio binds a pod to the namespace that holds its IP, or when the agent's
//! own search of the host's `/proc` found it by the pod's cgroup. A descriptor handed over on
//! `ambient.sock` proves nothing by itself: whoever can reach the socket could hand over any
//! namespace, their own or another pod's.

use std::net::IpAddr;

use redirect_core::Netns;
use redirect_core::{Namespace, NetnsId};

pub(crate) use crate::node_view::Binding;

/// Why a namespace is not taken as a pod's.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the network namespace handed over is the agent's own (the node's)")]
    Node,
    #[error("the network namespace handed over is pod {0}'s, enrolled already")]
    Taken(String),
    #[error(
        "the network namespace handed over does not hold the pod's address(es) {missing} \
         (it holds {held}): it is not the pod's"
    )]
    Missing { missing: String, held: String },
    #[error(
        "the network namespace handed over holds {ip}, the address of pod {owner}: it is not \
         this pod's"
    )]
    Others { ip: IpAddr, owner: String },
    #[error(
        "no address to check that the network namespace handed over holds: the request lists \
         none, the pod's status has none yet, and the namespace holds none of its own"
    )]
    NoAddress,
    #[error("cannot read the addresses of the network namespace handed over: {0}")]
    Read(String),
}

/// What the agent knows beside the namespace: the pod's addresses in the API, the request's,
/// and the other pods of the node.
pub struct Claim<'a> {
    /// The pod's status addresses (none before kubelet writes them).
    pub api: &'a [IpAddr],
    /// The addresses the plugin's request listed (the previous plugin's result).
    pub request: &'a [IpAddr],
    /// The pod (other than this one) of the node whose status lists an address, if any.
    pub owner_of: &'a (dyn Fn(IpAddr) -> Option<String> + Sync),
    /// The enrolled pod (other than this one) bound to a namespace, if any.
    pub bound_to: &'a (dyn Fn(NetnsId) -> Option<String> + Sync),
}

/// Checks that `netns` may be the claimed pod's; returns the addresses checked (those that go
/// into the host's probe set) and how.
pub fn check(netns: &Netns, claim: &Claim) -> Result<(Vec<IpAddr>, Binding), Refused> {
    if netns.is_current().unwrap_or(false) {
        return Err(Refused::Node);
    }
    if let Some(other) = (claim.bound_to)(netns.id()) {
        return Err(Refused::Taken(other));
    }
    let held = held_by(netns)?;
    let own: Vec<IpAddr> = held.iter().copied().filter(|ip| global(*ip)).collect();
    let (wanted, binding) = match (claim.api.is_empty(), claim.request.is_empty()) {
        (false, _) => (claim.api, Binding::ApiAddresses),
        (true, false) => (claim.request, Binding::RequestAddresses),
        (true, true) if !own.is_empty() => (own.as_slice(), Binding::NamespaceAddresses),
        (true, true) => return Err(Refused::NoAddress),
    };
    let missing: Vec<IpAddr> = wanted
        .iter()
        .copied()
        .filter(|ip| !held.contains(ip))
        .collect();
    if !missing.is_empty() {
        return Err(Refused::Missing {
            missing: list(&missing),
            held: list(&held),
        });
    }
    if binding != Binding::ApiAddresses {
        for ip in wanted {
            if let Some(owner) = (claim.owner_of)(*ip) {
                return Err(Refused::Others { ip: *ip, owner });
            }
        }
    }
    Ok((wanted.to_vec(), binding))
}

/// The global addresses `netns` holds (those a pod is known by), for a namespace the agent's
/// own search found for a pod whose status lists none yet.
pub fn own_addresses(netns: &Netns) -> Result<Vec<IpAddr>, Refused> {
    Ok(held_by(netns)?
        .into_iter()
        .filter(|ip| global(*ip))
        .collect())
}

/// Whether `netns` holds every one of `ips` (an enrolled pod's, once the API lists them).
pub fn holds(netns: &Netns, ips: &[IpAddr]) -> Result<bool, Refused> {
    let held = held_by(netns)?;
    Ok(ips.iter().all(|ip| held.contains(ip)))
}

fn held_by(netns: &Netns) -> Result<Vec<IpAddr>, Refused> {
    Namespace::addresses_of(netns).map_err(|e| Refused::Read(e.to_string()))
}

/// An address a pod is known by: not loopback, link-local, multicast or unspecified.
fn global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            !(a.is_loopback() || a.is_link_local() || a.is_multicast() || a.is_unspecified())
        }
        IpAddr::V6(a) => {
            !(a.is_loopback()
                || a.is_multicast()
                || a.is_unspecified()
                || a.is_unicast_link_local())
        }
    }
}

fn list(ips: &[IpAddr]) -> String {
    match ips {
        [] => "none".into(),
        _ => ips
            .iter()
            .map(|ip| ip.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}
