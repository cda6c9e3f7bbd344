//! One error, printed once: for each error of the node agent and installer that wraps another
//! (the installer's file errors, the namespace search's, the repair's, ZDS's, kubelet's UID),
//! walking its chain (`Display`, then each `source()`) finds no message twice, neither equal to
//! another nor standing inside the one before it, so a chain reporter prints each thing once;
//! the first message still names the value; and `redirect_program::errors::chain`, which the
//! agent's log lines and answers use, shows every message of the chain, once.
//!
//! `RepairError::Apply` holds the core's one `Error`, whose own kinds `redirect-core`'s
//! tests/errors.rs walks; here, its wrapping.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use cni_node::pods::search::FindError;
use cni_node::repair::in_place::RepairError;
use cni_node::Error;
use redirect_core::ambient::KubeletUidError;
use redirect_core::mesh::MeshError;
use redirect_testkit::errors::{assert_each_message_once, assert_shown_once, messages};
use zds::server::ZdsError;

fn assert_once(kind: &str, e: &dyn std::error::Error, names: &str) {
    let msgs = assert_each_message_once(kind, e, names);
    // What the log line (or the answer) shows: the whole chain, each message once.
    assert_shown_once(kind, &redirect_program::errors::chain(e), &msgs);
}

fn denied() -> io::Error {
    io::Error::from(io::ErrorKind::PermissionDenied)
}

fn read_error() -> FindError {
    FindError::Read {
        path: "/host/proc".into(),
        source: denied(),
    }
}

#[test]
fn each_wrapping_error_prints_each_message_once() {
    let io = Error::Io {
        action: "write",
        path: "/host/etc/cni/net.d/10-calico.conflist".into(),
        source: denied(),
    };
    assert_once("installer Io", &io, "10-calico.conflist");

    assert_once("FindError::Read", &read_error(), "/host/proc");

    let annotations = RepairError::Annotations {
        pod: "shop/web".into(),
        source: MeshError::from(redirect_core::error::ConfigError::Config {
            field: "traffic.sidecar.istio.io/includeInboundPorts",
            value: "x".into(),
            expected: "a comma-separated list of ports, or *".into(),
        }),
    };
    assert_once("RepairError::Annotations", &annotations, "shop/web");
    assert!(
        redirect_program::errors::chain(&annotations).contains("includeInboundPorts"),
        "the annotation reaches the log line"
    );

    let not_found = RepairError::Netns {
        pod: "shop/web".into(),
        source: Box::new(FindError::NotFound {
            uid: "u-1".into(),
            ip: "10.44.0.7".parse::<IpAddr>().unwrap(),
            proc: "/host/proc".into(),
            processes: 2,
            pin_dir: "/var/run/netns".into(),
            pins: 0,
        }),
    };
    assert_once("RepairError::Netns (not found)", &not_found, "shop/web");
    let unreadable = RepairError::Netns {
        pod: "shop/web".into(),
        source: Box::new(read_error()),
    };
    assert_once("RepairError::Netns (unreadable)", &unreadable, "shop/web");
    assert_eq!(
        messages(&unreadable).len(),
        3,
        "{:?}",
        messages(&unreadable)
    );

    let refused = redirect_core::Error::from(redirect_core::error::NamespaceError::Open {
        path: "/proc/42/ns/net".into(),
        cause: io::Error::from(io::ErrorKind::NotFound),
    });
    let apply = RepairError::Apply {
        pod: "shop/web".into(),
        netns: "/proc/42/ns/net".into(),
        source: refused,
    };
    assert_once("RepairError::Apply", &apply, "shop/web");

    let connection = ZdsError::Connection {
        request: "add uid-c".into(),
        source: io::Error::from(io::ErrorKind::TimedOut),
    };
    assert_once("ZdsError::Connection", &connection, "add uid-c");

    let kubelet = KubeletUidError::Proc {
        path: PathBuf::from("/host/proc"),
        source: io::Error::from(io::ErrorKind::NotFound),
    };
    assert_once("KubeletUidError::Proc", &kubelet, "/host/proc");
}
