//! What the benchmarks and the comparison scripts share: the configurations measured, the
//! excluded-CIDR lists, and Istio's equivalent rules for them (iptables-restore input and the
//! `nft -f` script of Istio's native nftables backend).

#![deny(missing_docs)]

pub mod istio_rules;

pub use redirect_testkit::configs::{
    cidr_list, configs, excluded_cidrs, ports_all, ports_alternate, sidecar_default,
    tproxy_dns_ipv6, with_excluded,
};
