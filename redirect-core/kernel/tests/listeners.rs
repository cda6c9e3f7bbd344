//! Kernel tests of `listeners`: real sockets in a fresh namespace, listed over sock_diag from a
//! socket opened there and asked from the test's thread, as the agent asks a pod's.

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};

use redirect_kernel::listeners::{missing, Listener, Port, SockDiag, Transport};
use redirect_kernel::netns::Netns;
use redirect_testkit::{kernel_test, TestNetns};

fn port(port: u16, transport: Transport) -> Port {
    Port { port, transport }
}

#[kernel_test]
fn listening_sockets_are_listed_and_connected_ones_are_not() {
    let pod = TestNetns::with_prefix("lsn");
    pod.sh("ip link set lo up");
    let netns = Netns::open(pod.path()).unwrap();
    let mut diag = SockDiag::open_in(&netns).unwrap();
    assert_eq!(
        diag.all().unwrap(),
        Vec::<Listener>::new(),
        "a new namespace"
    );

    // ztunnel's in-pod listeners, as it binds them, and sockets that are no listener.
    let held = pod.run(|| {
        let tcp = |a: &str| TcpListener::bind(a.parse::<SocketAddr>().unwrap()).unwrap();
        let outbound = tcp("127.0.0.1:15001");
        let inbound = tcp("[::]:15008");
        let plain = tcp("0.0.0.0:15006");
        let dns_tcp = tcp("127.0.0.1:15053");
        let dns_udp = UdpSocket::bind("127.0.0.1:15053").unwrap();
        // A client connection (and the server's accepted end): ESTABLISHED, not listed.
        let client = TcpStream::connect("127.0.0.1:15006").unwrap();
        let (accepted, _) = plain.accept().unwrap();
        // A connected UDP socket: not a listener.
        let connected = UdpSocket::bind("127.0.0.1:0").unwrap();
        connected.connect("127.0.0.1:15053").unwrap();
        (
            outbound, inbound, plain, dns_tcp, dns_udp, client, accepted, connected,
        )
    });
    let mut seen = diag.all().unwrap();
    seen.sort();
    let addr = |a: &str| a.parse::<SocketAddr>().unwrap();
    let me = nix::unistd::getuid().as_raw();
    let l = |transport, a| Listener {
        transport,
        addr: addr(a),
        uid: me,
    };
    let mut want = vec![
        l(Transport::Tcp, "127.0.0.1:15001"),
        l(Transport::Tcp, "0.0.0.0:15006"),
        l(Transport::Tcp, "127.0.0.1:15053"),
        l(Transport::Tcp, "[::]:15008"),
        l(Transport::Udp, "127.0.0.1:15053"),
    ];
    want.sort();
    assert_eq!(seen, want);

    let ztunnel = [
        port(15001, Transport::Tcp),
        port(15006, Transport::Tcp),
        port(15008, Transport::Tcp),
        port(15053, Transport::Tcp),
        port(15053, Transport::Udp),
    ];
    assert!(missing(&ztunnel, &seen).is_empty());
    assert!(diag.missing(&ztunnel).unwrap().is_empty());

    // The outbound listener and the DNS one over UDP close: those two are missing, read by
    // the same socket (no new entry into the namespace).
    let (outbound, inbound, plain, dns_tcp, dns_udp, ..) = held;
    drop(outbound);
    drop(dns_udp);
    let seen = diag.all().unwrap();
    assert_eq!(
        missing(&ztunnel, &seen),
        [port(15001, Transport::Tcp), port(15053, Transport::Udp)]
    );
    assert_eq!(
        diag.missing(&ztunnel).unwrap(),
        [port(15001, Transport::Tcp), port(15053, Transport::Udp)]
    );
    drop((inbound, plain, dns_tcp));
    assert_eq!(missing(&ztunnel, &diag.all().unwrap()).len(), 5);
}

#[kernel_test]
fn the_socket_answers_for_its_own_namespace_only() {
    let (a, b) = (TestNetns::with_prefix("lsa"), TestNetns::with_prefix("lsb"));
    let _in_a = a.run(|| TcpListener::bind("127.0.0.1:15001").unwrap());
    let mut in_b = SockDiag::open_in(&Netns::open(b.path()).unwrap()).unwrap();
    assert!(in_b.listening(Transport::Tcp).unwrap().is_empty());
    let mut in_a = SockDiag::open_in(&Netns::open(a.path()).unwrap()).unwrap();
    assert_eq!(in_a.listening(Transport::Tcp).unwrap().len(), 1);
}
