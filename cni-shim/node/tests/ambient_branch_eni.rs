//! kubelet's probes to an ambient pod behind an AWS branch ENI (EKS Security Groups for Pods,
//! issue 46; Istio 1.31's `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`), against a real API server.
//!
//! The node is laid out as aws-vpc-cni lays it out: `net.ipv4.tcp_early_demux=0`; the trunk
//! ENI (`eth1`, whose far end drops everything, as the VPC drops the probe's link-local source)
//! with its VLAN 1 (`vlan.eth.1`; a macvlan where the kernel has no 802.1Q); the pod's veth
//! `vlansgp` and the VLAN sharing table 101 (`iif` rules at priority 10, the pod's host route
//! and the default route out of the VLAN there); no route to the pod in the main table, whose
//! default leaves through the trunk. A plain pod beside it is routed through its veth in the
//! main table.

use cni_testkit as common;

mod support;

use std::net::TcpListener;
use std::time::Duration;

use common::ambient::{create_pod, pod_netns, running, Node, KUBELET_UID};
use common::host_proc::cgroupfs;
use redirect_testkit::{kernel_test, TestNetns};
use support::redirection;
use support::ztunnel::TestZtunnel;

const WAIT: Duration = Duration::from_secs(30);
const RULE_TO_POD: &str = "512:\tfrom all to 10.77.0.5 lookup 101 proto 157";
const RULE_FROM_VETH: &str = "9:\tfrom all iif vlansgp lookup local proto 157";

/// The node's side of the branch-ENI pod at 10.77.0.5 (wired by `pod_netns` on `vlansgp`),
/// moved from the main table to table 101 as aws-vpc-cni routes it; `vpc` is the far end of
/// the trunk.
fn branch_eni_layout(node: &TestNetns, vpc: &TestNetns) {
    node.sh(&format!(
        "echo 0 > /proc/sys/net/ipv4/tcp_early_demux
         ip link add eth1 type veth peer name eth1 netns {vpc} && ip link set eth1 up",
        vpc = vpc.name()
    ));
    vpc.sh("ip link set eth1 up");
    if node
        .try_sh("ip link add link eth1 name vlan.eth.1 type vlan id 1")
        .is_err()
    {
        eprintln!("no 802.1Q VLAN in this kernel: a macvlan stands in for vlan.eth.1");
        node.sh("ip link add link eth1 name vlan.eth.1 type macvlan mode bridge");
    }
    node.sh("set -e
         ip link set vlan.eth.1 up
         ip route del 10.77.0.5/32 dev vlansgp
         ip route add 10.77.0.5 dev vlansgp scope link table 101
         ip route add default dev vlan.eth.1 table 101
         ip rule add iif vlan.eth.1 lookup 101 pref 10
         ip rule add iif vlansgp lookup 101 pref 10
         ip route add default dev eth1");
}

/// kubelet's connection from the node to `ip`:8080: "app from <source>" or "nowhere".
fn kubelet_probe(node: &TestNetns, ip: &str, app: &TcpListener) -> String {
    if let Err(e) = support::connect_as(node, KUBELET_UID, ip) {
        return e;
    }
    for _ in 0..100 {
        if let Some(from) = support::accepted(app) {
            return from;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    "nowhere".into()
}

fn app(pod: &TestNetns) -> TcpListener {
    let l = pod.run(|| TcpListener::bind("0.0.0.0:8080")).unwrap();
    l.set_nonblocking(true).unwrap();
    l
}

fn rules(node: &TestNetns) -> String {
    node.sh("ip -4 rule show")
}

#[kernel_test]
fn kubelets_probes_reach_an_ambient_pod_behind_a_branch_eni() {
    let n = Node::new();
    let vpc = TestNetns::with_prefix("rdvpc");
    n.ambient_namespace("shop");
    let sgp_uid = create_pod(&n.cp, "shop", "sgp");
    let sgp = pod_netns(&n.host, "10.77.0.5", "vlansgp");
    let web_uid = create_pod(&n.cp, "shop", "web");
    let web = pod_netns(&n.host, "10.77.0.2", "vweb");
    branch_eni_layout(&n.host, &vpc);
    let aws = rules(&n.host);
    let (sgp_app, web_app) = (app(&sgp), app(&web));
    n.proc.add(4100, &cgroupfs(&sgp_uid), 100, sgp.path());
    n.proc.add(4200, &cgroupfs(&web_uid), 100, web.path());
    running(&n.cp, "shop", "sgp", "10.77.0.5");
    running(&n.cp, "shop", "web", "10.77.0.2");
    let z = TestZtunnel::start(&n.socket);

    // The setting off: both pods enrolled, and the probe to the branch-ENI pod leaves
    // through the VPC, lost (what Istio's issue 59778 reported).
    let agent = n.agent_with(&["--ambient-enable-aws-branch-eni-probe=false"]);
    let enrolled = |name: &str| redirection(&n.cp, "shop", name).as_deref() == Some("enabled");
    common::eventually("both pods enrolled", WAIT, || {
        (enrolled("sgp") && enrolled("web")).then_some(())
    });
    assert_eq!(
        kubelet_probe(&n.host, "10.77.0.2", &web_app),
        "app from 169.254.7.127"
    );
    assert!(
        kubelet_probe(&n.host, "10.77.0.5", &sgp_app).starts_with("nowhere"),
        "the probe reached the branch-ENI pod without the rules: the layout does not hold"
    );
    assert_eq!(rules(&n.host), aws);
    drop(agent);

    // Istio's default: the agent adds the two rules for the branch-ENI pod only, and the
    // probe reaches the pod from the probe address.
    let agent = n.agent();
    common::eventually("the branch-ENI rules", WAIT, || {
        let r = rules(&n.host);
        (r.contains(RULE_TO_POD) && r.contains(RULE_FROM_VETH)).then_some(())
    });
    assert_eq!(
        rules(&n.host).matches("proto 157").count(),
        2,
        "rules for the plain pod too:\n{}",
        rules(&n.host)
    );
    assert_eq!(
        kubelet_probe(&n.host, "10.77.0.5", &sgp_app),
        "app from 169.254.7.127"
    );
    assert_eq!(
        kubelet_probe(&n.host, "10.77.0.2", &web_app),
        "app from 169.254.7.127"
    );

    // A rule deleted under the agent comes back at the next pass, counted as a repair.
    n.host.sh("ip rule del to 10.77.0.5 lookup 101 pref 512");
    common::eventually("the rule put back", WAIT, || {
        rules(&n.host).contains(RULE_TO_POD).then_some(())
    });
    assert!(
        agent
            .log()
            .contains("the branch-ENI probe rules differed: added to 10.77.0.5"),
        "{}",
        agent.log()
    );

    // The pod released: its rules go, aws-vpc-cni's stay as they were.
    support::opt_out(&n.cp, "shop", "sgp");
    common::eventually("the rules gone with the pod", WAIT, || {
        (rules(&n.host) == aws).then_some(())
    });
    assert!(z.serves(&web_uid) && !z.serves(&sgp_uid));
}
