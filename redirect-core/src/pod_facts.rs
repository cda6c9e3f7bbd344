//! What Istio derives inside the pod instead of taking it as a flag: the pod's host address
//! (which family, and whether both), its nameservers from `resolv.conf`, a user's UID.

pub use redirect_istio::pod_facts::{
    detect_host_address, host_address, parse_resolv_conf, read_resolv_conf, uid_of_user,
    HostAddress, Nameservers, DEFAULT_PROXY_UID,
};
