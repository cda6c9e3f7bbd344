//! The synthetic check (`AMBIENT_SYNTHETIC_CHECK`, opt-in): once per pass, in one enrolled
//! pod's namespace, a connection to a documentation address the in-pod rules capture
//! (`192.0.2.1:9`, or `[2001:db8::1]:9` in a pod without IPv4), proved over sock_diag to land
//! on ztunnel's outbound listener (15001): the rules, the routes and ztunnel's listener agree
//! (`redirect_core::synthetic`). Observational: a failed check is logged, counted and shown
//! in the node view; it changes no pod's state.

use std::net::IpAddr;
use std::time::SystemTime;

use redirect_core::ambient::OUTBOUND_PORT;
use redirect_core::synthetic::{self, Outcome};
use redirect_core::Netns;

use crate::node_view::SyntheticView;

/// Which pod the check takes each pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SyntheticCheck {
    /// No check (the default).
    #[default]
    Off,
    /// One `enabled` pod each pass, taking them in turn.
    Rotate,
    /// That pod, each pass, whatever its stage.
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// The accepted forms, for the setting's error.
pub(crate) const FORMS: &str =
    "expected off, rotate, or <namespace>/<name> of one pod (such as shop/web-0)";

impl SyntheticCheck {
    /// `off`, `rotate` or `<namespace>/<name>`.
    pub fn parse(text: &str) -> Result<SyntheticCheck, String> {
        let text = text.trim();
        match text {
            "off" | "" => return Ok(SyntheticCheck::Off),
            "rotate" => return Ok(SyntheticCheck::Rotate),
            _ => {}
        }
        // Kubernetes' names: lowercase letters, digits, '-' and '.'.
        let name_like = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        };
        match text.split_once('/') {
            Some((ns, name)) if name_like(ns) && name_like(name) => Ok(SyntheticCheck::Pod {
                namespace: ns.into(),
                name: name.into(),
            }),
            _ => Err(FORMS.into()),
        }
    }

    /// Whether a check runs at all.
    pub fn is_on(&self) -> bool {
        *self != SyntheticCheck::Off
    }
}

/// The last check of one pod.
#[derive(Clone, Debug)]
pub(crate) struct Checked {
    pub at: SystemTime,
    pub outcome: Outcome,
    pub took: std::time::Duration,
}

impl Checked {
    /// For the node view.
    pub(crate) fn view(&self) -> SyntheticView {
        SyntheticView {
            at: self.at,
            ok: self.outcome.is_ok(),
            result: self.outcome.reason(),
            detail: self.outcome.to_string(),
            took_ms: self.took.as_secs_f64() * 1000.0,
        }
    }
}

/// One check in `netns`, of a pod with addresses `ips`: the IPv4 target unless the pod has
/// IPv6 addresses only.
pub(crate) fn run(netns: &Netns, ips: &[IpAddr]) -> Checked {
    let ipv4 = ips.is_empty() || ips.iter().any(IpAddr::is_ipv4);
    let started = std::time::Instant::now();
    let outcome = synthetic::check(
        netns,
        synthetic::target(ipv4),
        OUTBOUND_PORT,
        synthetic::DEADLINE,
    );
    Checked {
        at: SystemTime::now(),
        outcome,
        took: started.elapsed(),
    }
}

/// The pod to check among `candidates` (UIDs in order, each with its label and whether it is
/// `enabled`): with `Rotate`, the first enabled one after `last` (wrapping); with `Pod`, the
/// one so named.
pub(crate) fn pick<'a>(
    setting: &SyntheticCheck,
    candidates: &'a [(String, String, bool)],
    last: Option<&str>,
) -> Option<&'a str> {
    match setting {
        SyntheticCheck::Off => None,
        SyntheticCheck::Pod { namespace, name } => {
            let label = format!("{namespace}/{name}");
            candidates
                .iter()
                .find(|(_, l, _)| *l == label)
                .map(|(u, _, _)| u.as_str())
        }
        SyntheticCheck::Rotate => {
            let enabled = || candidates.iter().filter(|(_, _, e)| *e);
            enabled()
                .find(|(u, _, _)| last.is_none_or(|l| u.as_str() > l))
                .or_else(|| enabled().next())
                .map(|(u, _, _)| u.as_str())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_setting_takes_off_rotate_and_one_pod() {
        assert_eq!(SyntheticCheck::parse("off"), Ok(SyntheticCheck::Off));
        assert_eq!(
            SyntheticCheck::parse(" rotate "),
            Ok(SyntheticCheck::Rotate)
        );
        assert_eq!(
            SyntheticCheck::parse("shop/web-0"),
            Ok(SyntheticCheck::Pod {
                namespace: "shop".into(),
                name: "web-0".into()
            })
        );
        for bad in [
            "on",
            "true",
            "shop/",
            "/web",
            "shop/web/0",
            "Shop/web",
            "rotate all",
        ] {
            assert_eq!(SyntheticCheck::parse(bad), Err(FORMS.into()), "{bad}");
        }
    }

    #[test]
    fn synthetic_rotation_takes_the_enabled_pods_in_turn() {
        let pods: Vec<(String, String, bool)> = [("a", true), ("b", false), ("c", true)]
            .iter()
            .map(|(u, e)| (u.to_string(), format!("shop/{u}"), *e))
            .collect();
        let r = SyntheticCheck::Rotate;
        assert_eq!(pick(&r, &pods, None), Some("a"));
        assert_eq!(pick(&r, &pods, Some("a")), Some("c"), "b is not enabled");
        assert_eq!(pick(&r, &pods, Some("c")), Some("a"), "wraps");
        let one = SyntheticCheck::parse("shop/b").unwrap();
        assert_eq!(
            pick(&one, &pods, Some("b")),
            Some("b"),
            "whatever its stage"
        );
        assert_eq!(pick(&SyntheticCheck::Off, &pods, None), None);
        assert_eq!(pick(&r, &[], None), None);
    }
}
