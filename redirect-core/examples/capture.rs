//! Capture a network namespace's traffic with Istio's sidecar defaults, see a connection land
//! on the proxy's port with its original destination, check the namespace against the config,
//! and remove the capture. Run it as root on a namespace of your own, with `lo` up (the
//! proxy's port is reached through it) and an interface with an address (so that 10.99.0.2
//! has a route):
//!
//! ```text
//! ip netns add demo
//! ip -n demo link set lo up
//! ip -n demo link add d0 type veth peer name d1 && ip -n demo addr add 10.99.0.1/24 dev d0
//! ip -n demo link set d0 up && ip -n demo link set d1 up
//! cargo run -p redirect-core --example capture -- /run/netns/demo
//! ip netns del demo
//! ```

use std::error::Error;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use redirect_core::{original_dst, Capture, CaptureConfig, Namespace};

fn main() {
    if let Err(e) = run() {
        eprintln!("capture: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: capture NETNS_PATH (for example /run/netns/demo)")?;
    let config = Capture::Sidecar(CaptureConfig::istio_sidecar_default().validated()?);
    let pod = Namespace::open(&path)?;

    let rules = pod.apply(&config)?;
    println!(
        "applied: {} rules in table inet redirect_capture",
        rules.rule_count()
    );
    let differences = pod.check(&config)?;
    println!("check: {} differences", differences.len());

    // The app (this process is root, not the proxy's UID 1337) connects out; the rules send
    // the connection to the proxy's port, 15001, which keeps where it was going.
    let landed = pod.run(connect_through_the_proxy)??;
    println!("10.99.0.2:80 landed on 15001, original destination {landed}");

    pod.remove(&config)?;
    let after = pod.check(&config)?;
    println!("removed; check now finds: {}", after[0]);
    if differences.is_empty() && landed.to_string() == "10.99.0.2:80" && !after.is_empty() {
        Ok(())
    } else {
        Err("capture did not behave as Istio's defaults say".into())
    }
}

/// Listen where the proxy would, connect as the app would, and read the original destination
/// of what arrived.
fn connect_through_the_proxy() -> Result<SocketAddr, std::io::Error> {
    let proxy = TcpListener::bind("0.0.0.0:15001")?;
    let dst: SocketAddr = ([10, 99, 0, 2], 80).into();
    let _app = TcpStream::connect_timeout(&dst, Duration::from_secs(2))?;
    let (conn, _) = proxy.accept()?;
    original_dst(&conn, false)
}
