//! Kernel tests of `branch_eni`: aws-vpc-cni's layout for a pod behind a branch ENI (a VLAN
//! of the trunk ENI, the pod's veth and the VLAN sharing table 101), built with iproute2 in a
//! fresh namespace, found (the socket opened there, then used from the test's thread), given Istio's two rules, read back and cleaned up. The rules are
//! compared with `ip rule show` and with what Istio's `ip rule add` commands make.

use redirect_kernel::branch_eni::{self, BranchEni, ProbeRoutes, ProbeRule};
use redirect_testkit::{kernel_test, TestNetns};

/// The node's side of two pods behind a branch ENI (10.0.5.7 and fd00::7 on `vlanpod1`,
/// 10.0.5.9 on `vlanpod2`, table 101), one plain veth pod (10.0.9.9, main table), and a decoy:
/// 10.0.5.8's host route in table 101 goes through an interface with no `iif` rule.
fn eks_node() -> TestNetns {
    let node = TestNetns::with_prefix("eni");
    // The trunk ENI, and its VLAN 1 as aws-vpc-cni names it. A kernel without 802.1Q (this
    // machine's has none; Debian's, in the kernel matrix, have it and require it) gets a
    // macvlan in its place: the rules and tables, which are all the code reads, are the same.
    node.sh("ip link add eth1 type veth peer name eth1-peer && ip link set eth1 up");
    if node
        .try_sh("ip link add link eth1 name vlan.eth.1 type vlan id 1")
        .is_err()
    {
        // The kernel matrix's guests load 8021q and say so: there the VLAN is required.
        assert!(
            std::env::var_os("REDIRECT_REQUIRE_VLAN").is_none(),
            "REDIRECT_REQUIRE_VLAN is set but this kernel makes no 802.1Q VLAN"
        );
        eprintln!("no 802.1Q VLAN in this kernel: a macvlan stands in for vlan.eth.1");
        node.sh("ip link add link eth1 name vlan.eth.1 type macvlan mode bridge");
    }
    node.sh("set -e
         ip link set vlan.eth.1 up
         for p in vlanpod1 vlanpod2 plain0 other0; do
           ip link add $p type veth peer name $p-peer
           ip link set $p up && ip link set $p-peer up
         done
         ip route add default dev vlan.eth.1 table 101
         ip route add 10.0.5.7 dev vlanpod1 scope link table 101
         ip route add 10.0.5.9 dev vlanpod2 scope link table 101
         ip route add 10.0.5.8 dev other0 scope link table 101
         ip -6 route add fd00::7 dev vlanpod1 table 101
         ip rule add iif vlan.eth.1 lookup 101 pref 10
         ip rule add iif vlanpod1 lookup 101 pref 10
         ip rule add iif vlanpod2 lookup 101 pref 20
         ip -6 rule add iif vlanpod1 lookup 101 pref 10
         ip route add 10.0.9.9 dev plain0
         ip rule add to 10.0.9.9 lookup main pref 512");
    node
}

fn ip_rules(node: &TestNetns) -> String {
    node.sh("ip -4 rule show; ip -6 rule show")
}

fn pods() -> Vec<std::net::IpAddr> {
    ["10.0.5.7", "fd00::7", "10.0.5.9", "10.0.9.9", "10.0.5.8"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect()
}

#[kernel_test]
fn branch_eni_pods_are_found_given_istios_rules_read_back_and_cleaned_up() {
    let node = eks_node();
    let aws = ip_rules(&node);
    let routes = node.run(|| ProbeRoutes::open().unwrap());
    // Only the pods whose table-101 host route goes through a veth with an `iif` rule.
    let found = routes.detect(&pods()).unwrap();
    let eni = |pod: &str, veth: &str, iif_priority| BranchEni {
        pod: pod.parse().unwrap(),
        table: 101,
        veth: veth.into(),
        iif_priority,
    };
    assert_eq!(
        found,
        [
            eni("10.0.5.7", "vlanpod1", 10),
            eni("10.0.5.9", "vlanpod2", 20),
            eni("fd00::7", "vlanpod1", 10),
        ]
    );
    let want: Vec<ProbeRule> = found.iter().flat_map(BranchEni::rules).collect();
    let changed = routes.converge(&want).unwrap();
    assert_eq!(changed.added, want);
    assert!(changed.removed.is_empty());

    // What iproute2 shows is what Istio's commands make, with our protocol.
    let shown = ip_rules(&node);
    for line in [
        "9:\tfrom all iif vlanpod1 lookup local proto 157",
        "19:\tfrom all iif vlanpod2 lookup local proto 157",
        "512:\tfrom all to 10.0.5.7 lookup 101 proto 157",
        "512:\tfrom all to 10.0.5.9 lookup 101 proto 157",
        "512:\tfrom all to fd00::7 lookup 101 proto 157",
    ] {
        assert!(shown.contains(line), "no {line:?} in:\n{shown}");
    }
    let istio = eks_node(); // a second node, given Istio's rules by iproute2
    istio.sh("ip rule add to 10.0.5.7/32 lookup 101 pref 512 protocol 157
         ip rule add iif vlanpod1 lookup local pref 9 protocol 157
         ip rule add to 10.0.5.9/32 lookup 101 pref 512 protocol 157
         ip rule add iif vlanpod2 lookup local pref 19 protocol 157
         ip -6 rule add to fd00::7/128 lookup 101 pref 512 protocol 157
         ip -6 rule add iif vlanpod1 lookup local pref 9 protocol 157");
    assert_eq!(
        shown,
        ip_rules(&istio),
        "ours differ from Istio's commands'"
    );
    let mut held = routes.held().unwrap();
    held.sort();
    let mut words: Vec<String> = want.iter().map(ToString::to_string).collect();
    words.sort();
    assert_eq!(held, words);

    // Converged again: nothing to do. A rule of ours deleted behind our back comes back.
    assert_eq!(routes.converge(&want).unwrap(), Default::default());
    node.sh("ip rule del to 10.0.5.9 lookup 101 pref 512");
    let changed = routes.converge(&want).unwrap();
    assert_eq!(
        changed.added,
        [ProbeRule::ToPod {
            pod: "10.0.5.9".parse().unwrap(),
            table: 101
        }]
    );

    // A pod released: its two rules go, the others stay.
    let kept: Vec<ProbeRule> = want
        .iter()
        .filter(|r| !r.to_string().contains("vlanpod2") && !r.to_string().contains("10.0.5.9"))
        .cloned()
        .collect();
    let changed = routes.converge(&kept).unwrap();
    assert_eq!(
        changed.removed,
        [
            "iif vlanpod2 lookup local pref 19 (IPv4)",
            "to 10.0.5.9 lookup 101 pref 512"
        ]
    );
    assert!(!ip_rules(&node).contains("vlanpod2 lookup local"));

    // Everything released: the node holds aws-vpc-cni's rules alone, as before.
    let changed = routes.converge(&[]).unwrap();
    assert_eq!(changed.removed.len(), 4, "{changed:?}");
    assert_eq!(ip_rules(&node), aws);
}

#[kernel_test]
fn rules_of_others_are_taken_as_there_and_never_removed() {
    let node = eks_node();
    // Istio's agent, before the switch, added the pod's rules (no protocol of ours).
    node.sh("ip rule add to 10.0.5.7 lookup 101 pref 512
         ip rule add iif vlanpod1 lookup local pref 9");
    let before = ip_rules(&node);
    let routes = node.run(|| ProbeRoutes::open().unwrap());
    let found = routes.detect(&["10.0.5.7".parse().unwrap()]).unwrap();
    let want: Vec<ProbeRule> = found.iter().flat_map(BranchEni::rules).collect();
    assert_eq!(want.len(), 2);
    assert_eq!(
        routes.converge(&want).unwrap(),
        Default::default(),
        "Istio's rules were added again"
    );
    assert_eq!(routes.converge(&[]).unwrap(), Default::default());
    assert_eq!(ip_rules(&node), before, "Istio's rules were touched");
    assert!(routes.held().unwrap().is_empty());
}

#[kernel_test]
fn a_plain_node_has_no_branch_eni_and_early_demux_is_read_per_namespace() {
    let node = TestNetns::with_prefix("eni");
    node.sh(
        "ip link add plain0 type veth peer name plain0-peer && ip link set plain0 up
         ip route add 10.0.9.9 dev plain0",
    );
    let routes = node.run(|| ProbeRoutes::open().unwrap());
    assert!(routes
        .detect(&["10.0.9.9".parse().unwrap()])
        .unwrap()
        .is_empty());
    assert!(
        !node.run(branch_eni::early_demux_disabled),
        "the default is 1"
    );
    node.sh("echo 0 > /proc/sys/net/ipv4/tcp_early_demux");
    assert!(node.run(branch_eni::early_demux_disabled));
    let other = TestNetns::with_prefix("eni");
    assert!(!other.run(branch_eni::early_demux_disabled));
}
