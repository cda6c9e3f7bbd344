//! What the plugin tells the node agent, and what the agent tells the plugin, through the run
//! directory they share (`cni_agent_run_dir`, the same path on the host for both):
//!
//! - [`Event`]: after each ADD, DEL and CHECK, one datagram on the agent's Unix socket
//!   [`SOCKET_NAME`]: the command, the result code, the pod, and how long each phase took. It
//!   is sent without waiting: no agent, a full socket or an agent that does not read cost the
//!   plugin one failed `sendto` and change nothing about its result.
//! - [`LogLine`]: each line the plugin logs, on the same socket, for the agent to print in its
//!   own log with the pod's name (operators read `kubectl logs` of the agent, not the runtime's
//!   journal); sent the same way, at most [`MAX_FORWARDED`] per call.
//! - [`Readiness`]: the agent's verdict on the installation, in the file [`READY_NAME`], which
//!   the plugin's STATUS reports.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cni::Command;

/// The agent's datagram socket in the run directory.
pub const SOCKET_NAME: &str = "plugin-events.sock";
/// The agent's readiness in the run directory: `ready`, or `not ready: <reason>`.
pub const READY_NAME: &str = "agent-ready";
/// The most lines one plugin call forwards to the agent; the rest stay on its stderr.
pub const MAX_FORWARDED: usize = 64;
/// The longest forwarded line; longer ones are cut (the whole line stays on stderr).
pub const MAX_LINE: usize = 2048;
/// The levels a forwarded line may have.
pub const LOG_LEVELS: [&str; 4] = ["debug", "info", "warn", "error"];
/// The commands the plugin reports.
pub const COMMANDS: [&str; 3] = [
    Command::Add.name(),
    Command::Del.name(),
    Command::Check.name(),
];
/// An event is a few hundred bytes, a forwarded line at most a few KiB (its text escaped for
/// JSON); a larger datagram is not ours.
pub const MAX_EVENT: usize = 16 * 1024;
/// The status file is one short line; more is not the agent's.
pub const MAX_READY: usize = 4096;
/// The longest call an event may report: a runtime gives a sandbox's network set-up minutes,
/// not hours (kubelet's default runtime request timeout is 2 minutes).
pub const MAX_CALL_US: u64 = 600_000_000;
/// The longest `namespace/name`: two DNS labels or subdomains and the slash.
pub const MAX_POD_NAME: usize = 253 + 1 + 253;

/// One plugin call, as the agent counts it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// `ADD`, `DEL` or `CHECK`.
    pub command: String,
    /// 0, or the CNI error code the call answered.
    pub code: u32,
    /// `namespace/name`, when CNI_ARGS named a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The whole call, from the process's start to its answer, in microseconds.
    pub total_us: u64,
    /// How long each part of the call took.
    #[serde(default)]
    pub phases: Phases,
}

/// The parts of a call that took place, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phases {
    /// Parsing the network config on stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_us: Option<u64>,
    /// Reading the pod from the Kubernetes API (only when the annotations were not enough).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_read_us: Option<u64>,
    /// Programming the namespace (ADD) or removing our capture (DEL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_us: Option<u64>,
    /// Reading the namespace back and comparing (CHECK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_back_us: Option<u64>,
}

impl Phases {
    /// The phases that took place.
    pub fn all(&self) -> impl Iterator<Item = u64> {
        [
            self.config_us,
            self.pod_read_us,
            self.apply_us,
            self.read_back_us,
        ]
        .into_iter()
        .flatten()
    }
}

/// Microseconds, for an event.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Event {
    /// Sends the event to the agent of `run_dir` without waiting; whatever goes wrong (no
    /// agent, a full queue, a path too long for a socket) is ignored.
    pub fn send(&self, run_dir: &Path) {
        if let Ok(bytes) = serde_json::to_vec(self) {
            send_datagram(&bytes, run_dir);
        }
    }

    /// An event as received; `None` when it is not one the plugin could have sent: not JSON
    /// of an event, a command it does not report, a call longer than [`MAX_CALL_US`] or a
    /// phase longer than its call, a pod name longer than [`MAX_POD_NAME`]. (The code is
    /// bounded where it becomes a label: [`Event::code_label`].)
    pub fn decode(bytes: &[u8]) -> Option<Event> {
        serde_json::from_slice::<Event>(bytes)
            .ok()
            .filter(|e| COMMANDS.contains(&e.command.as_str()))
            .filter(|e| e.total_us <= MAX_CALL_US && e.phases.all().all(|p| p <= e.total_us))
            .filter(|e| e.pod.as_ref().is_none_or(|p| p.len() <= MAX_POD_NAME))
    }

    /// The code as a metric's label: one the plugin answers with (`cni::code::ALL`), else
    /// `other`, so that a forged datagram adds no label value.
    pub fn code_label(&self) -> String {
        if crate::cni::code::ALL.contains(&self.code) {
            self.code.to_string()
        } else {
            "other".into()
        }
    }
}

/// One log line of the plugin, for the agent's log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// CNI_COMMAND, as the runtime sent it.
    pub command: String,
    /// `namespace/name`, when CNI_ARGS named a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The line (message and fields, escaped by the plugin's logging).
    pub line: String,
}

impl LogLine {
    /// Sends the line to the agent of `run_dir` without waiting, cut to [`MAX_LINE`]; as with
    /// an [`Event`], whatever goes wrong is ignored.
    pub fn send(mut self, run_dir: &Path) {
        if self.line.len() > MAX_LINE {
            let mut end = MAX_LINE;
            while !self.line.is_char_boundary(end) {
                end -= 1;
            }
            self.line.truncate(end);
            self.line.push_str("...");
        }
        if let Ok(bytes) = serde_json::to_vec(&LogEnvelope { log: self }) {
            send_datagram(&bytes, run_dir);
        }
    }

    /// A line as received; `None` when the plugin could not have sent it: not JSON of a line,
    /// a level it does not log at, a command name longer than a CNI command, a pod name longer
    /// than [`MAX_POD_NAME`] or a line longer than [`MAX_LINE`] and its mark.
    pub fn decode(bytes: &[u8]) -> Option<LogLine> {
        serde_json::from_slice::<LogEnvelope>(bytes)
            .ok()
            .map(|e| e.log)
            .filter(|l| LOG_LEVELS.contains(&l.level.as_str()))
            .filter(|l| l.command.len() <= 16 && l.command.bytes().all(|b| b.is_ascii_uppercase()))
            .filter(|l| l.pod.as_ref().is_none_or(|p| p.len() <= MAX_POD_NAME))
            .filter(|l| l.line.len() <= MAX_LINE + 3)
    }
}

/// One datagram to the agent of `run_dir`, without waiting; any failure ignored.
fn send_datagram(bytes: &[u8], run_dir: &Path) {
    if let Ok(sock) = UnixDatagram::unbound() {
        if sock.set_nonblocking(true).is_ok() {
            let _ = sock.send_to(bytes, run_dir.join(SOCKET_NAME));
        }
    }
}

/// A [`LogLine`] on the wire: `{"log": {...}}`, never read as an [`Event`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogEnvelope {
    log: LogLine,
}

/// The agent's verdict on the installation, for the plugin's STATUS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The agent found the installation in place.
    Ready,
    /// It is not, and why (STATUS answers `NOT_AVAILABLE` with it).
    NotReady(String),
}

impl Readiness {
    /// The file's text.
    pub fn text(&self) -> String {
        match self {
            Readiness::Ready => "ready\n".into(),
            Readiness::NotReady(why) => format!("not ready: {why}\n"),
        }
    }

    /// What the file in `run_dir` says; `None` when there is none (no agent on this node: the
    /// plugin installed by hand, or a test). The file is the agent's: opened without following
    /// a link and without blocking (a FIFO there never stalls STATUS), read only when it is a
    /// regular file owned by root (or by this process's user), at most [`MAX_READY`] bytes. A
    /// path that is anything else, or a file that does not say what the agent writes, reads as
    /// not ready, saying what is wrong and quoting nothing of it.
    pub fn read(run_dir: &Path) -> Option<Readiness> {
        let path = run_dir.join(READY_NAME);
        let not_ready = |what: String| {
            Some(Readiness::NotReady(format!(
                "the agent's status file {} {what}",
                path.display()
            )))
        };
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return not_ready("is a symbolic link, not the agent's file".into())
            }
            Err(e) => return not_ready(format!("cannot be read ({e})")),
        };
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => return not_ready(format!("cannot be read ({e})")),
        };
        if !meta.is_file() {
            return not_ready(format!("is {}, not the agent's file", kind_of(&meta)));
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != 0 && meta.uid() != me {
            return not_ready(format!("is owned by UID {}, not by root", meta.uid()));
        }
        let mut text = Vec::new();
        if let Err(e) = file.take(MAX_READY as u64 + 1).read_to_end(&mut text) {
            return not_ready(format!("cannot be read ({e})"));
        }
        Some(Readiness::parse(&text).unwrap_or_else(|| {
            Readiness::NotReady(format!(
                "the agent's status file {} does not hold what the agent writes",
                path.display()
            ))
        }))
    }

    /// The file's text, when it is the agent's: one line, `ready` or `not ready: <reason>`.
    fn parse(bytes: &[u8]) -> Option<Readiness> {
        if bytes.len() > MAX_READY {
            return None;
        }
        let text = std::str::from_utf8(bytes).ok()?;
        let line = text.strip_suffix('\n').unwrap_or(text);
        if line.contains(['\n', '\r']) || line.chars().any(char::is_control) {
            return None;
        }
        match line.strip_prefix("not ready: ") {
            Some(why) => Some(Readiness::NotReady(why.to_string())),
            None if line == "ready" => Some(Readiness::Ready),
            None => None,
        }
    }
}

/// The kind of a file that is not a regular one, in words.
fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_goes_through_the_socket_and_reads_back() {
        let dir = tempfile_dir();
        let agent = UnixDatagram::bind(dir.join(SOCKET_NAME)).unwrap();
        let e = Event {
            command: "ADD".into(),
            code: 0,
            pod: Some("shop/web-0".into()),
            total_us: 2400,
            phases: Phases {
                config_us: Some(40),
                apply_us: Some(1800),
                ..Phases::default()
            },
        };
        e.send(&dir);
        let mut buf = [0u8; MAX_EVENT];
        let n = agent.recv(&mut buf).unwrap();
        assert_eq!(Event::decode(&buf[..n]), Some(e));
        assert_eq!(Event::decode(b"not an event"), None);
        let status = br#"{"command":"STATUS","code":0,"total_us":1}"#;
        assert_eq!(
            Event::decode(status),
            None,
            "not a command the plugin reports"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// What no plugin sends is not an event: times past any call, a phase longer than its
    /// call, an overlong pod name. A code the plugin never answers is labelled `other`.
    #[test]
    fn forged_events_are_refused_or_bounded() {
        let ev = |json: &str| Event::decode(json.as_bytes());
        assert!(ev(r#"{"command":"ADD","code":0,"total_us":1000}"#).is_some());
        assert!(ev(&format!(
            r#"{{"command":"ADD","code":0,"total_us":{}}}"#,
            u64::MAX
        ))
        .is_none());
        assert!(ev(&format!(
            r#"{{"command":"ADD","code":0,"total_us":{}}}"#,
            MAX_CALL_US + 1
        ))
        .is_none());
        assert!(
            ev(r#"{"command":"ADD","code":0,"total_us":10,"phases":{"apply_us":11}}"#).is_none()
        );
        let long = "n".repeat(MAX_POD_NAME + 1);
        assert!(ev(&format!(
            r#"{{"command":"ADD","code":0,"total_us":1,"pod":"{long}"}}"#
        ))
        .is_none());
        let codes: std::collections::BTreeSet<String> = (0..2000u32)
            .map(|code| {
                Event {
                    code,
                    ..Event::default()
                }
                .code_label()
            })
            .collect();
        assert_eq!(codes.len(), crate::cni::code::ALL.len() + 1, "{codes:?}");
        assert!(codes.contains("other") && codes.contains("100") && codes.contains("0"));
    }

    #[test]
    fn no_agent_costs_nothing_and_fails_nothing() {
        let dir = tempfile_dir();
        Event::default().send(&dir);
        Event::default().send(Path::new("/nonexistent/run/dir"));
        assert_eq!(Readiness::read(&dir), None);
        std::fs::write(
            dir.join(READY_NAME),
            Readiness::NotReady("x y".into()).text(),
        )
        .unwrap();
        assert_eq!(
            Readiness::read(&dir),
            Some(Readiness::NotReady("x y".into()))
        );
        std::fs::write(dir.join(READY_NAME), Readiness::Ready.text()).unwrap();
        assert_eq!(Readiness::read(&dir), Some(Readiness::Ready));
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "rdc-events-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
