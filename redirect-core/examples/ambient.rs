//! Istio's ambient mode with the library: ambient's in-pod rules in a pod's namespace (its
//! outbound TCP lands on ztunnel's 15001, keeping where it was going) and, in the host's
//! namespace, the probe SNAT of kubelet's connections to the pod, each applied, checked and
//! removed. Run it as root on two namespaces of your own, a "host" and a "pod" joined by a
//! veth pair, `lo` up in the pod (ztunnel's port is reached through it):
//!
//! ```text
//! ip netns add host && ip netns add pod
//! ip -n pod link set lo up
//! ip -n host link add h0 type veth peer name eth0 netns pod
//! ip -n host addr add 10.77.0.1/24 dev h0 && ip -n host link set h0 up
//! ip -n pod addr add 10.77.0.2/24 dev eth0 && ip -n pod link set eth0 up
//! ip -n pod route add default via 10.77.0.1
//! cargo run -p redirect-core --example ambient -- /run/netns/host /run/netns/pod
//! ip netns del host; ip netns del pod
//! ```

use std::error::Error;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use redirect_core::{original_dst, AmbientConfig, Capture, HostProbeConfig, Namespace};

fn main() {
    if let Err(e) = run() {
        eprintln!("ambient: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let usage = "usage: ambient HOST_NETNS POD_NETNS (for example /run/netns/host /run/netns/pod)";
    let mut args = std::env::args().skip(1);
    let (host, pod) = match (args.next(), args.next()) {
        (Some(h), Some(p)) => (Namespace::open(h)?, Namespace::open(p)?),
        _ => return Err(usage.into()),
    };

    // The pod: its traffic to ztunnel, with Istio's defaults.
    let in_pod = Capture::Ambient(AmbientConfig::default());
    let rules = pod.apply(&in_pod)?;
    println!("pod: {} rules applied", rules.rule_count());
    let differences = pod.check(&in_pod)?;
    println!("pod: check finds {} differences", differences.len());
    let landed = pod.run(connect_through_ztunnel)??;
    println!("pod: 10.99.0.2:80 landed on ztunnel's 15001, original destination {landed}");

    // The host: kubelet's probes to the pod leave from the address the pod's rules let through.
    // kubelet is UID 0 here (this process): a demo's choice, not a node's.
    let probe = HostProbeConfig::new(0);
    let pod_ip: IpAddr = "10.77.0.2".parse()?;
    let snat = Capture::HostProbe {
        config: probe.clone(),
        members: vec![pod_ip],
    };
    host.apply(&snat)?;
    let members = host.members()?;
    println!("host: probe SNAT for {members:?}");
    let host_differences = host.check(&snat)?;
    println!("host: check finds {} differences", host_differences.len());
    host.remove_members(&probe, &[pod_ip])?;
    let emptied = host.members()?;

    host.remove(&snat)?;
    pod.remove(&in_pod)?;
    let after = pod.check(&in_pod)?;
    println!("removed; the pod's check now finds: {}", after[0]);
    let ok = differences.is_empty()
        && host_differences.is_empty()
        && landed.to_string() == "10.99.0.2:80"
        && members == Some(vec![pod_ip])
        && emptied == Some(vec![])
        && !after.is_empty()
        && host.members()?.is_none();
    if ok {
        Ok(())
    } else {
        Err("ambient capture did not behave as Istio's defaults say".into())
    }
}

/// Inside the pod: ztunnel's outbound listener on 15001 (bound with ztunnel's mark, so its own
/// socket is not captured), then a connection out to 10.99.0.2:80, which the rules send to
/// it; the original destination the listener sees.
fn connect_through_ztunnel() -> Result<SocketAddr, String> {
    let listener = TcpListener::bind("0.0.0.0:15001").map_err(|e| format!("bind 15001: {e}"))?;
    let to: SocketAddr = "10.99.0.2:80".parse().map_err(|e| format!("{e}"))?;
    let _client = TcpStream::connect_timeout(&to, Duration::from_secs(2))
        .map_err(|e| format!("connect {to}: {e}"))?;
    let (accepted, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    original_dst(&accepted, false).map_err(|e| format!("original destination: {e}"))
}
