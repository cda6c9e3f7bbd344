//! ztunnel's listeners in each enrolled pod, read from the kernel: an ack says ztunnel took
//! the pod; only its sockets listening in the pod's namespace say the traffic the rules
//! redirect has somewhere to go. Read over sock_diag with a socket opened once in the pod
//! (`redirect_core::listeners`), each pass and after each ack; a pod whose listeners are
//! missing is `pending`, and its add is sent to ztunnel again, at once and then with backoff
//! (ztunnel takes a repeated add of the same namespace for done: a `del` goes first).

use std::time::{Duration, Instant, SystemTime};

use redirect_core::ambient::{DNS_PORT, HBONE_PORT, INBOUND_PORT, OUTBOUND_PORT};
use redirect_core::listeners::{Port, SockDiag, Transport};
use redirect_core::{AmbientConfig, Netns};

use crate::node_view::ListenersView;

/// The first wait between two resends of a pod whose listeners stay missing; it doubles up
/// to [`MAX_BACKOFF`].
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_secs(10);
/// The longest wait between two resends.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The listeners ztunnel opens in a pod it serves with `cfg`: outbound 15001, inbound
/// plaintext 15006, HBONE 15008, and with DNS capture its DNS proxy on 15053 (TCP and UDP).
pub(crate) fn wanted(cfg: &AmbientConfig) -> Vec<Port> {
    let tcp = |port| Port {
        port,
        transport: Transport::Tcp,
    };
    let mut ports = vec![tcp(OUTBOUND_PORT), tcp(INBOUND_PORT), tcp(HBONE_PORT)];
    if cfg.dns_capture {
        ports.push(tcp(DNS_PORT));
        ports.push(Port {
            port: DNS_PORT,
            transport: Transport::Udp,
        });
    }
    ports
}

/// What was read of one pod's listeners, and when it may be sent to ztunnel again.
#[derive(Default)]
pub(crate) struct PodListeners {
    /// The socket in the pod's namespace, opened at the first read.
    diag: Option<SockDiag>,
    /// The ports the last read found missing (empty: all there); `None`: never read, or the
    /// read failed.
    missing: Option<Vec<Port>>,
    checked: Option<SystemTime>,
    /// Since when the last finding holds.
    since: Option<SystemTime>,
    /// The last read's failure.
    failed: Option<String>,
    next_resend: Option<Instant>,
    backoff: Duration,
}

impl PodListeners {
    /// Reads the pod's listeners in `netns`: the ports of `wanted` missing, or why they
    /// could not be read.
    pub(crate) fn read(&mut self, netns: &Netns, wanted: &[Port]) -> Result<Vec<Port>, String> {
        let found = self.lacking_of(netns, wanted);
        let now = SystemTime::now();
        self.checked = Some(now);
        match found {
            Ok(m) => {
                if self.missing.as_ref() != Some(&m) {
                    self.since = Some(now);
                }
                if m.is_empty() {
                    self.next_resend = None;
                    self.backoff = Duration::ZERO;
                }
                self.missing = Some(m.clone());
                self.failed = None;
                Ok(m)
            }
            Err(e) => {
                // A socket that failed once is opened anew next time.
                self.diag = None;
                self.missing = None;
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// The ports of `wanted` missing, on the socket opened in the pod at the first read.
    fn lacking_of(&mut self, netns: &Netns, wanted: &[Port]) -> Result<Vec<Port>, String> {
        if self.diag.is_none() {
            self.diag = Some(SockDiag::open_in(netns).map_err(|e| e.to_string())?);
        }
        let diag = self.diag.as_mut().expect("opened above");
        diag.missing(wanted).map_err(|e| e.to_string())
    }

    /// Whether the last read found a listener missing.
    pub(crate) fn lacking(&self) -> bool {
        self.missing.as_ref().is_some_and(|m| !m.is_empty())
    }

    /// The ports the last read found missing.
    pub(crate) fn missing(&self) -> &[Port] {
        self.missing.as_deref().unwrap_or_default()
    }

    /// Whether the pod may be sent again now; if so, the next time is set (backoff doubled).
    pub(crate) fn resend_due(&mut self, now: Instant) -> bool {
        if self.next_resend.is_some_and(|t| now < t) {
            return false;
        }
        self.backoff = if self.backoff.is_zero() {
            FIRST_BACKOFF
        } else {
            (self.backoff * 2).min(MAX_BACKOFF)
        };
        self.next_resend = Some(now + self.backoff);
        true
    }

    /// For the node view.
    pub(crate) fn view(&self) -> Option<ListenersView> {
        let checked_at = self.checked?;
        Some(ListenersView {
            checked_at,
            seen: self.missing.as_ref().is_some_and(|m| m.is_empty()),
            missing: self.missing().iter().map(|p| p.to_string()).collect(),
            since: self.since,
            error: self.failed.clone(),
        })
    }
}

/// The ports, in words (`15001/tcp, 15053/udp`).
pub(crate) fn words(ports: &[Port]) -> String {
    ports
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_capture_adds_the_dns_proxys_two_listeners() {
        let with = words(&wanted(&AmbientConfig::default()));
        assert_eq!(
            with,
            "15001/tcp, 15006/tcp, 15008/tcp, 15053/tcp, 15053/udp"
        );
        let without = AmbientConfig {
            dns_capture: false,
            ..AmbientConfig::default()
        };
        assert_eq!(words(&wanted(&without)), "15001/tcp, 15006/tcp, 15008/tcp");
    }

    #[test]
    fn resends_back_off_from_ten_seconds_to_five_minutes() {
        let mut l = PodListeners::default();
        let t0 = Instant::now();
        assert!(l.resend_due(t0), "the first at once");
        assert!(!l.resend_due(t0 + Duration::from_secs(9)));
        assert!(l.resend_due(t0 + Duration::from_secs(10)));
        let mut at = t0 + Duration::from_secs(10);
        let mut waits = Vec::new();
        for _ in 0..8 {
            let next = l.next_resend.unwrap();
            waits.push((next - at).as_secs());
            at = next;
            assert!(l.resend_due(at));
        }
        assert_eq!(waits, [20, 40, 80, 160, 300, 300, 300, 300]);
    }
}
