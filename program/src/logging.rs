//! Log lines of redirect-init, the CNI plugin and its installer: one `tracing` subscriber per
//! process, installed by [`install`], that writes our line format. Code logs with
//! `tracing::info!` (`debug!`, `warn!`, `error!`); records of the `log` crate (rustls, netlink)
//! join the same lines.
//!
//! - stderr: `level<TAB>[prefix<TAB>]message\n`, written with one `write` per line so that
//!   lines from several threads or processes never interleave. The prefix names the program
//!   where the runtime mixes several on one stream (`redirect-cni` for the CNI plugin).
//! - the file, when the [`Sink`] names one: the same line after its RFC 3339 time (UTC,
//!   milliseconds) and a TAB, appended. It is opened once, at the first line, without blocking
//!   (`O_NONBLOCK`): only a regular file is kept. A FIFO (read or not), a directory, a device,
//!   or a file that cannot be opened gets one `warn` line on stderr naming it and why, and no
//!   lines after that; nothing fails and nothing waits on it.
//! - one event, one line: the message and fields are escaped ([`escape`]): a line break, a
//!   TAB (our column separator), any other control character, and the Unicode line and
//!   paragraph separators and direction overrides become `\n`, `\t`, `\u{..}`. A pod name,
//!   annotation, path or server answer carrying them can never forge a line or a column, on
//!   stderr or in the file, and no caller has to remember to escape.
//! - levels: `debug`, `info`, `warn`, `error`. Fields of an event follow its message as
//!   ` name=value`; a line from another crate names its target first (`kube_client::...: `).
//! - the filter: our crates ([`OURS`]) log from the sink's level; every other crate (kube,
//!   hyper, rustls, tokio, netlink) from `warn`, or from the sink's level when that is stricter.
//!   Their `info` and `debug` are request-by-request chatter that would bury our lines; their
//!   warnings and errors are what an operator needs.
//!
//! Never stdout: the CNI protocol and redirect-init's ruleset use it.

use std::fmt::{self, Write as _};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::Registry;
use tracing_subscriber::reload;

pub use crate::log_scopes::{scope_of, ScopeLevels, SCOPES};

/// The crates whose lines pass at the sink's level: the workspace's libraries and binaries, as
/// `tracing` names them (the first segment of a target, the module path).
pub const OURS: &[&str] = &[
    "redirect_program",
    "redirect_core",
    "redirect_model",
    "redirect_kernel",
    "redirect_istio",
    "init_shim",
    "redirect_init",
    "cni_protocol",
    "zds",
    "cni_plugin",
    "redirect_cni",
    "cni_node",
    "redirect_cni_node",
    "validator",
    "redirect_validate",
];

/// Where a process's lines go, and from which level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sink {
    /// Between the level and the message on every line (`redirect-cni`), or nothing.
    pub prefix: Option<&'static str>,
    /// The lowest level of our crates' lines; `OFF` logs nothing.
    pub level: LevelFilter,
    /// A file that gets every line too, each after its time.
    pub file: Option<PathBuf>,
    /// Scopes at another level than `level` (Istio's `scope:level` lists, [`ScopeLevels`]).
    pub scopes: Vec<(&'static str, LevelFilter)>,
    /// JSON lines (Istio's `--log_as_json`): `{"level","time","scope","msg", fields...}`.
    pub json: bool,
    /// Also hands each line written to this (the plugin's lines to its node agent).
    pub forward: Option<Forward>,
}

/// Where a line goes besides stderr: given its level name and its text (message and fields,
/// escaped). It must not block.
#[derive(Clone)]
pub struct Forward(pub Arc<ForwardFn>);

/// What a [`Forward`] calls: `(level, text)`.
pub type ForwardFn = dyn Fn(&str, &str) + Send + Sync;

impl fmt::Debug for Forward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Forward")
    }
}

impl PartialEq for Forward {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Forward {}

impl Sink {
    /// stderr only, from `level` up.
    pub fn stderr(prefix: Option<&'static str>, level: LevelFilter) -> Sink {
        Sink {
            prefix,
            level,
            file: None,
            scopes: Vec::new(),
            json: false,
            forward: None,
        }
    }

    /// With the levels of an Istio `scope:level` list.
    pub fn with_levels(mut self, levels: ScopeLevels) -> Sink {
        self.level = levels.default;
        self.scopes = levels.named;
        self
    }
}

/// The levels the programs' settings name (the plugin's `log_level`, the installer's
/// `--plugin-log-level`), with their filters: the one list both check against.
pub const LEVELS: &[(&str, LevelFilter)] = &[
    ("debug", LevelFilter::DEBUG),
    ("info", LevelFilter::INFO),
    ("warn", LevelFilter::WARN),
    ("error", LevelFilter::ERROR),
    ("none", LevelFilter::OFF),
];

/// A level as the programs' settings name it ([`LEVELS`]).
pub fn level(name: &str) -> Option<LevelFilter> {
    LEVELS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

/// The level names of [`LEVELS`] for a message, the last one after `last` (`" or "`:
/// `debug, info, warn, error or none`).
pub fn level_names(last: &str) -> String {
    let names: Vec<&str> = LEVELS.iter().map(|(n, _)| *n).collect();
    match names.split_last() {
        Some((tail, head)) if !head.is_empty() => format!("{}{last}{tail}", head.join(", ")),
        _ => names.join(", "),
    }
}

/// The sink Istio's logging flags ask for, installed: JSON lines with `--log_as_json`
/// (`as_json`), the `default` level of `--log_output_level` (`output_level`; the proxy's other
/// scopes passed over, none given is `info`). For redirect-init and redirect-validate, which
/// Istio's injector runs with `global.logAsJson` and `global.logging.level`. A bad level is an
/// error naming it, and nothing is installed.
pub fn install_istio_flags(as_json: bool, output_level: Option<&str>) -> Result<(), String> {
    let text = output_level.unwrap_or_default();
    let level =
        ScopeLevels::default_of(text).map_err(|e| format!("--log_output_level={text:?}: {e}"))?;
    install(Sink {
        json: as_json,
        ..Sink::stderr(None, level)
    });
    Ok(())
}

/// The handle of our subscriber's layer, or `None` when the process had another subscriber
/// (a test's) before ours.
static HANDLE: OnceLock<Option<reload::Handle<Lines, Registry>>> = OnceLock::new();

/// Sends this process's log lines to `sink`. The first call installs the global subscriber
/// (and the `log` crate's logger); a later call only changes the sink, so a program can start
/// on stderr and add its configured level and file once it has read them. Returns false when
/// another subscriber was installed first (then that one gets the lines, and nothing panics).
pub fn install(sink: Sink) -> bool {
    JSON_LINES.store(sink.json, Ordering::Relaxed);
    let mut fresh = false;
    let handle = HANDLE.get_or_init(|| {
        let (layer, handle) = reload::Layer::new(Lines::new(sink.clone()));
        let subscriber = Registry::default().with(layer);
        tracing::subscriber::set_global_default(subscriber).ok()?;
        // Only ours forwards `log` records: with another subscriber they would bypass it.
        let _ = log::set_logger(&LogRecords);
        fresh = true;
        Some(handle)
    });
    let Some(handle) = handle else {
        return false;
    };
    log::set_max_level(log_level(sink.level));
    if !fresh {
        // Re-registers every call site against the new level.
        let _ = handle.reload(Lines::new(sink));
    }
    true
}

/// The layer that writes our lines (behind `reload`, so that [`install`] can change its sink).
struct Lines {
    sink: Sink,
    /// The sink's file, opened at the first line (`None`: none, or refused).
    file: OnceLock<Option<File>>,
}

impl Lines {
    fn new(sink: Sink) -> Lines {
        Lines {
            sink,
            file: OnceLock::new(),
        }
    }

    fn passes(&self, level: &Level, target: &str) -> bool {
        let scope = scope_of(target);
        let own = self
            .sink
            .scopes
            .iter()
            .find(|(s, _)| *s == scope)
            .map_or(self.sink.level, |(_, l)| *l);
        let floor = if is_ours(target) {
            own
        } else {
            own.min(LevelFilter::WARN)
        };
        *level <= floor
    }

    /// The line of one record: its message and fields (`body` writes the message; `fields`
    /// as name and value), as a text line or, with `json`, a JSON line.
    fn line(&self, level: &Level, target: &str, body: impl FnOnce(&mut String)) -> String {
        self.line_with(level, target, body, &Fields::default())
    }

    fn line_with(
        &self,
        level: &Level,
        target: &str,
        body: impl FnOnce(&mut String),
        fields: &Fields,
    ) -> String {
        let mut text = String::with_capacity(96);
        body(&mut text);
        if self.sink.json {
            return crate::log_json::line(
                level_name(level),
                scope_of(target),
                (!is_ours(target)).then_some(target),
                &text,
                &fields.pairs,
            );
        }
        let mut line = String::with_capacity(128);
        line.push_str(level_name(level));
        line.push('\t');
        if let Some(prefix) = self.sink.prefix {
            line.push_str(prefix);
            line.push('\t');
        }
        if !is_ours(target) {
            line.push_str(target);
            line.push_str(": ");
        }
        text.push_str(&fields.rest);
        escape_into(&mut line, &text);
        line.push('\n');
        line
    }

    /// The line of `event`, whose fields were read once into `fields`.
    fn line_of(&self, event: &Event<'_>, fields: &Fields) -> String {
        let m = event.metadata();
        self.line_with(
            m.level(),
            m.target(),
            |l| l.push_str(&fields.message),
            fields,
        )
    }

    fn write(&self, line: &str) {
        // One write: stderr is unbuffered. A closed stderr is not an error.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        self.append(line);
    }

    /// Hands the line to the sink's forward, as text (message and fields, escaped) after its
    /// level, whatever the format here.
    fn forward(&self, level: &Level, text: &str) {
        if let Some(Forward(f)) = &self.sink.forward {
            f(level_name(level), &escape(text));
        }
    }

    fn append(&self, line: &str) {
        let Some(mut file) = self.log_file() else {
            return;
        };
        if self.sink.json {
            // A JSON line carries its time.
            let _ = file.write_all(line.as_bytes());
            return;
        }
        // The file gathers the lines of many processes: each needs its time. (The runtime
        // stamps stderr itself.)
        let stamped = format!(
            "{}\t{line}",
            humantime::format_rfc3339_millis(SystemTime::now())
        );
        let _ = file.write_all(stamped.as_bytes());
    }

    fn log_file(&self) -> Option<&File> {
        self.file
            .get_or_init(|| {
                let path = self.sink.file.as_deref()?;
                open_log_file(path)
                    .map_err(|why| self.refuse(path, &why))
                    .ok()
            })
            .as_ref()
    }

    /// The one stderr line that says the file gets no lines, and why.
    fn refuse(&self, path: &Path, why: &str) {
        let line = self.line(&Level::WARN, OURS[0], |l| {
            let _ = write!(
                l,
                "log_file {}: {why}; log lines go to stderr only",
                path.display()
            );
        });
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// Opens the log file for appending without ever waiting on it: `O_NONBLOCK`, so a FIFO with
/// no reader fails at once instead of hanging the plugin (after its rules are in); and only a
/// regular file is kept (a FIFO with a reader, a device or a socket could stall every write).
fn open_log_file(path: &Path) -> Result<File, String> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => "a FIFO that nobody reads".to_string(),
            _ => format!("cannot be opened: {e}"),
        })?;
    let kind = file
        .metadata()
        .map_err(|e| format!("cannot be read: {e}"))?
        .file_type();
    if kind.is_file() {
        Ok(file)
    } else if kind.is_fifo() {
        Err("a FIFO, not a regular file".into())
    } else {
        Err("not a regular file".into())
    }
}

impl<S: Subscriber> Layer<S> for Lines {
    fn register_callsite(&self, m: &'static Metadata<'static>) -> Interest {
        if self.wants(m) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, m: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.wants(m)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        // Other crates' floor is never below ours.
        Some(
            self.sink
                .scopes
                .iter()
                .map(|(_, l)| *l)
                .fold(self.sink.level, LevelFilter::max),
        )
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let fields = Fields::of(event);
        self.write(&self.line_of(event, &fields));
        if self.sink.forward.is_some() {
            let text = format!("{}{}", fields.message, fields.rest);
            self.forward(event.metadata().level(), &text);
        }
    }
}

impl Lines {
    /// Events only: spans would cost without showing in a line.
    fn wants(&self, m: &Metadata<'_>) -> bool {
        m.is_event() && self.passes(m.level(), m.target())
    }
}

/// Whether the sink last installed writes JSON lines: [`stderr_line`] follows it.
static JSON_LINES: AtomicBool = AtomicBool::new(false);

/// Whether the sink last installed writes JSON lines.
pub fn json_lines() -> bool {
    JSON_LINES.load(Ordering::Relaxed)
}

/// Writes one `level<TAB>message` line on stderr, the message escaped, in one write: for a
/// program's own status lines outside the subscriber (redirect-validate's, redirect-init's
/// report). With a JSON sink installed, the line is a JSON object of scope `default`.
pub fn stderr_line(level: &str, message: &str) {
    if JSON_LINES.load(Ordering::Relaxed) {
        let line = crate::log_json::line(level, "default", None, message, &[]);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        return;
    }
    let mut line = String::with_capacity(message.len() + 16);
    line.push_str(level);
    line.push('\t');
    escape_into(&mut line, message);
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `s` with what could break a log line escaped: see the module's comment. For text that
/// reaches stderr outside the subscriber (a program's own report block).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    escape_into(&mut out, s);
    out
}

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Control characters (C0, DEL, C1: NEL among them), the line and paragraph separators, and
/// the bidirectional overrides that make a line read as another: what [`escape`] escapes.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

pub(crate) fn is_ours(target: &str) -> bool {
    OURS.contains(&target.split("::").next().unwrap_or(target))
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// An event's message, and its other fields as ` name=value` (and as pairs, for JSON).
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
    pairs: Vec<(&'static str, String)>,
}

impl Fields {
    /// The fields of `event`, read once.
    fn of(event: &Event<'_>) -> Fields {
        let mut fields = Fields::default();
        event.record(&mut fields);
        fields
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
            self.pairs.push((field.name(), value.to_string()));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let _ = write!(self.rest, " {}={value}", field.name());
        self.pairs.push((field.name(), value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
                self.pairs.push((name, format!("{value:?}")));
            }
        }
    }
}

/// The `log` crate's records, into our lines with the same filter.
struct LogRecords;

impl log::Log for LogRecords {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        with_lines(|l| l.passes(&tracing_level(m.level()), m.target())).unwrap_or(false)
    }

    fn log(&self, r: &log::Record<'_>) {
        with_lines(|l| {
            let level = tracing_level(r.level());
            if l.passes(&level, r.target()) {
                let text = r.args().to_string();
                l.write(&l.line(&level, r.target(), |line| line.push_str(&text)));
                l.forward(&level, &text);
            }
        });
    }

    fn flush(&self) {}
}

fn with_lines<T>(f: impl FnOnce(&Lines) -> T) -> Option<T> {
    HANDLE.get()?.as_ref()?.with_current(f).ok()
}

fn tracing_level(level: log::Level) -> Level {
    match level {
        log::Level::Error => Level::ERROR,
        log::Level::Warn => Level::WARN,
        log::Level::Info => Level::INFO,
        log::Level::Debug => Level::DEBUG,
        log::Level::Trace => Level::TRACE,
    }
}

fn log_level(level: LevelFilter) -> log::LevelFilter {
    match level.into_level() {
        None => log::LevelFilter::Off,
        Some(Level::ERROR) => log::LevelFilter::Error,
        Some(Level::WARN) => log::LevelFilter::Warn,
        Some(Level::INFO) => log::LevelFilter::Info,
        Some(Level::DEBUG) => log::LevelFilter::Debug,
        Some(Level::TRACE) => log::LevelFilter::Trace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects the lines `Lines` would write, for events under a scoped subscriber.
    struct Collect {
        lines: Lines,
        out: Arc<Mutex<Vec<String>>>,
    }

    impl<S: Subscriber> Layer<S> for Collect {
        fn enabled(&self, m: &Metadata<'_>, _: Context<'_, S>) -> bool {
            self.lines.wants(m)
        }
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            self.out
                .lock()
                .unwrap()
                .push(self.lines.line_of(event, &Fields::of(event)));
        }
    }

    fn lines_of(sink: Sink, f: impl FnOnce()) -> Vec<String> {
        let out = Arc::new(Mutex::new(Vec::new()));
        let collect = Collect {
            lines: Lines::new(sink),
            out: out.clone(),
        };
        tracing::subscriber::with_default(Registry::default().with(collect), f);
        let lines = out.lock().unwrap().clone();
        lines
    }

    #[test]
    fn lines_carry_the_level_the_prefix_the_message_and_the_fields() {
        let lines = lines_of(
            Sink::stderr(Some("redirect-cni"), LevelFilter::INFO),
            || {
                tracing::info!("pod {}/{} captured", "shop", "web-0");
                tracing::warn!(attempt = 2, server = %"https://10.0.0.1", name = "web-0", "retrying");
                tracing::error!("three\n  lines\r\n  here\tend");
                tracing::debug!("not at info");
            },
        );
        assert_eq!(
            lines,
            [
                "info\tredirect-cni\tpod shop/web-0 captured\n",
                "warn\tredirect-cni\tretrying attempt=2 server=https://10.0.0.1 name=\"web-0\"\n",
                // One event, one line: breaks and TABs are escaped.
                "error\tredirect-cni\tthree\\n  lines\\r\\n  here\\tend\n",
            ]
        );
        let lines = lines_of(Sink::stderr(None, LevelFilter::DEBUG), || {
            tracing::debug!("shown");
        });
        assert_eq!(lines, ["debug\tshown\n"]);
    }

    #[test]
    fn other_crates_log_from_warn_and_name_their_target() {
        let sink = Sink::stderr(None, LevelFilter::DEBUG);
        let lines = lines_of(sink, || {
            tracing::info!(target: "kube_client::client", "chatter");
            tracing::warn!(target: "kube_client::client", "something to see");
            tracing::error!(target: "hyper_util", "broken");
            tracing::debug!(target: "cni_plugin::kube::fetch", "ours");
        });
        assert_eq!(
            lines,
            [
                "warn\tkube_client::client: something to see\n",
                "error\thyper_util: broken\n",
                "debug\tours\n",
            ]
        );
        // A stricter level holds for them too; none is nothing at all.
        let lines = lines_of(Sink::stderr(None, LevelFilter::ERROR), || {
            tracing::warn!(target: "kube_client", "hidden");
            tracing::warn!("hidden too");
            tracing::error!(target: "kube_client", "shown");
        });
        assert_eq!(lines, ["error\tkube_client: shown\n"]);
        let lines = lines_of(Sink::stderr(None, LevelFilter::OFF), || {
            tracing::error!("nothing");
        });
        assert!(lines.is_empty(), "{lines:?}");
    }

    #[test]
    fn the_level_names_of_the_settings() {
        assert_eq!(level("debug"), Some(LevelFilter::DEBUG));
        assert_eq!(level("warn"), Some(LevelFilter::WARN));
        assert_eq!(level("none"), Some(LevelFilter::OFF));
        assert_eq!(level("trace"), None);
        assert_eq!(level("INFO"), None);
    }

    #[test]
    fn the_file_gets_the_line_after_its_time() {
        let path = std::env::temp_dir().join(format!("redirect-logging-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let lines = Lines::new(Sink {
            file: Some(path.clone()),
            ..Sink::stderr(Some("redirect-cni"), LevelFilter::INFO)
        });
        lines.append("info\tredirect-cni\tone\n");
        lines.append("warn\tredirect-cni\ttwo\n");
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let got: Vec<(&str, &str)> = text.lines().map(|l| l.split_once('\t').unwrap()).collect();
        assert_eq!(got.len(), 2, "{text}");
        assert_eq!(got[0].1, "info\tredirect-cni\tone");
        assert_eq!(got[1].1, "warn\tredirect-cni\ttwo");
        for (time, _) in got {
            // 2024-05-01T10:11:12.345Z
            assert_eq!(time.len(), 24, "{time}");
            assert!(humantime::parse_rfc3339(time).is_ok(), "{time}");
        }
        // A file that cannot be written loses the line, nothing else.
        let unwritable = Lines::new(Sink {
            file: Some("/proc/no/such/dir/plugin.log".into()),
            ..lines.sink.clone()
        });
        unwritable.append("info\tredirect-cni\tlost\n");
    }

    #[test]
    fn outside_strings_never_break_a_line_or_a_column() {
        let forged = "cart\n2026-01-01T00:00:00.000Z\terror\tredirect-cni\tFORGED";
        assert_eq!(
            escape(forged),
            "cart\\n2026-01-01T00:00:00.000Z\\terror\\tredirect-cni\\tFORGED"
        );
        assert_eq!(escape("a\r\nb"), "a\\r\\nb");
        // NEL, the line and paragraph separators, a direction override, ESC, DEL.
        assert_eq!(
            escape("a\u{85}b\u{2028}c\u{2029}d\u{202e}e\u{1b}[2Jf\u{7f}"),
            "a\\u{85}b\\u{2028}c\\u{2029}d\\u{202e}e\\u{1b}[2Jf\\u{7f}"
        );
        assert_eq!(escape("ünïcode stays, \\n too"), "ünïcode stays, \\n too");
        // Through the subscriber: the message and every field, on one line.
        let lines = lines_of(
            Sink::stderr(Some("redirect-cni"), LevelFilter::INFO),
            || {
                tracing::info!("ADD {}/{} captured", "shop", forged);
                tracing::warn!(pod = %forged, path = forged, "retrying");
            },
        );
        assert_eq!(lines.len(), 2, "{lines:?}");
        for l in &lines {
            assert_eq!(l.matches('\n').count(), 1, "{l:?}");
            assert_eq!(l.matches('\t').count(), 2, "{l:?}");
        }
    }

    #[test]
    fn a_log_file_that_is_no_regular_file_is_refused_without_waiting() {
        use nix::sys::stat::Mode;
        let dir = std::env::temp_dir().join(format!("redirect-logfile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
        let sink = |file: &Path| Sink {
            file: Some(file.to_owned()),
            ..Sink::stderr(None, LevelFilter::INFO)
        };
        // A FIFO nobody reads (opening it for writing would block), and a directory.
        for path in [&fifo, &dir] {
            let lines = Lines::new(sink(path));
            lines.append("info\tlost\n");
            assert!(lines.log_file().is_none(), "{}", path.display());
        }
        // A FIFO with a reader opens, and is refused all the same: a write could wait on it.
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let lines = Lines::new(sink(&fifo));
        lines.append("info\tlost\n");
        assert!(lines.log_file().is_none());
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut &reader, &mut got);
        assert!(got.is_empty(), "{got:?}");
        // A regular file is kept, and created when missing.
        let file = dir.join("plugin.log");
        let lines = Lines::new(sink(&file));
        lines.append("info\tkept\n");
        assert!(lines.log_file().is_some());
        assert!(std::fs::read_to_string(&file)
            .unwrap()
            .ends_with("\tinfo\tkept\n"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn json_lines_parse_one_by_one_with_istios_keys_and_the_fields() {
        let sink = Sink {
            json: true,
            ..Sink::stderr(Some("redirect-cni"), LevelFilter::INFO)
        };
        let forged = "cart\n{\"level\":\"error\",\"msg\":\"FORGED\"}";
        let lines = lines_of(sink, || {
            tracing::info!(target: "cni_node::install::watch", "wrote {}", "/etc/cni/net.d/10.conflist");
            tracing::warn!(target: "cni_node::ambient::controller", pod = %forged, attempt = 2, "retrying");
            tracing::warn!(target: "kube_client::client", "something to see");
        });
        assert_eq!(lines.len(), 3, "{lines:?}");
        let parsed: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| {
                assert_eq!(l.matches('\n').count(), 1, "{l:?}");
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))
            })
            .collect();
        assert_eq!(parsed[0]["level"], "info");
        assert_eq!(parsed[0]["scope"], "install");
        assert_eq!(parsed[0]["msg"], "wrote /etc/cni/net.d/10.conflist");
        assert!(humantime::parse_rfc3339(parsed[0]["time"].as_str().unwrap()).is_ok());
        assert_eq!(parsed[1]["scope"], "ambient");
        assert_eq!(parsed[1]["pod"], forged);
        assert_eq!(parsed[1]["attempt"], "2");
        assert_eq!(parsed[2]["target"], "kube_client::client");
        assert_eq!(parsed[2]["scope"], "default");
    }

    #[test]
    fn each_scope_logs_from_its_own_level() {
        let levels = ScopeLevels::parse("default:warn,ambient:debug").unwrap();
        let sink = Sink::stderr(None, LevelFilter::INFO).with_levels(levels);
        let lines = lines_of(sink, || {
            tracing::debug!(target: "cni_node::ambient::dataplane", "ambient detail");
            tracing::info!(target: "cni_node::install::watch", "install info");
            tracing::warn!(target: "cni_node::install::watch", "install warning");
            tracing::debug!(target: "kube_client", "kube debug");
        });
        assert_eq!(
            lines,
            ["debug\tambient detail\n", "warn\tinstall warning\n"]
        );
    }

    #[test]
    fn a_forward_gets_each_line_as_text_whatever_the_format() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let to = got.clone();
        let forward = Forward(Arc::new(move |level: &str, text: &str| {
            to.lock().unwrap().push(format!("{level} {text}"));
        }));
        let sink = Sink {
            json: true,
            forward: Some(forward),
            ..Sink::stderr(None, LevelFilter::INFO)
        };
        let lines = Lines::new(sink);
        let collect = Forwarded(lines);
        tracing::subscriber::with_default(Registry::default().with(collect), || {
            tracing::info!(pod = "shop/web", "ADD\tcaptured");
            tracing::debug!("not at info");
        });
        assert_eq!(
            *got.lock().unwrap(),
            ["info ADD\\tcaptured pod=\"shop/web\""]
        );
    }

    /// `Lines` as the subscriber's layer, its forward included (stderr gets the lines too).
    struct Forwarded(Lines);

    impl<S: Subscriber> Layer<S> for Forwarded {
        fn enabled(&self, m: &Metadata<'_>, _: Context<'_, S>) -> bool {
            self.0.wants(m)
        }
        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            <Lines as Layer<S>>::on_event(&self.0, event, ctx);
        }
    }
}
