//! Running one xtables binary on the calling thread, so the child starts in that thread's
//! network namespace, and turning its failures into messages that say what to do.

use std::io::{self, Write};
use std::process::{Command, Stdio};

use crate::error::Error;

/// What to do when no working binary is there.
pub(crate) const FIX: &str = "install iptables (Debian/Ubuntu: apt-get install iptables; \
     Alpine: apk add iptables ip6tables), or use the native nftables backend";

/// A finished run.
pub(crate) struct Output {
    pub ok: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// `exit status 2 (xtables parameter problem): <stderr>`, stderr on one line without
    /// the "Try `iptables -h'" advice.
    pub fn failure(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("Try `"))
            .collect();
        let stderr = if lines.is_empty() {
            "(no message on stderr)".to_string()
        } else {
            lines.join(" | ")
        };
        format!("{}: {stderr}", exit_meaning(self.code))
    }
}

/// Whether an executable file `bin` is in a folder of `PATH`.
fn on_path(bin: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(bin))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Runs `bin args...`, feeding `stdin` if given. The error is only for a binary that could not
/// be started; a non-zero exit is an `Output` with `ok == false`.
pub(crate) fn run(bin: &str, args: &[&str], stdin: Option<&str>) -> io::Result<Output> {
    // A node without the binary (the agent's image has none) answers NotFound from a look at
    // PATH: spawning only to learn that forks the whole process, milliseconds per call.
    if !bin.contains('/') && !on_path(bin) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{bin}: not on PATH"),
        ));
    }
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn()?;
    let pipe = child.stdin.take();
    // Write stdin from another thread while this one drains stdout and stderr: a tool that
    // fills a pipe while we still write would otherwise deadlock. The child already exists,
    // so that thread's namespace does not matter.
    let out = std::thread::scope(|s| {
        if let (Some(mut pipe), Some(input)) = (pipe, stdin) {
            s.spawn(move || {
                // A write error (the tool exited early) shows as the tool's own failure.
                let _ = pipe.write_all(input.as_bytes());
            });
        }
        child.wait_with_output()
    })?;
    Ok(Output {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Why a binary could not be started.
pub(crate) fn spawn_failure(bin: &str, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => format!("{bin} is not installed (not found in PATH)"),
        io::ErrorKind::PermissionDenied => format!("{bin} cannot be executed: {e}"),
        _ => format!("{bin} could not be started: {e}"),
    }
}

/// The xtables exit codes (`xtables_exittype`), as Istio reports them.
fn exit_meaning(code: Option<i32>) -> String {
    match code {
        Some(1) => "exit status 1 (xtables other problem)".into(),
        Some(2) => "exit status 2 (xtables parameter problem)".into(),
        Some(3) => "exit status 3 (xtables version problem)".into(),
        Some(4) => "exit status 4 (xtables resource problem: the xtables lock is held, or the \
                    kernel lacks a module)"
            .into(),
        Some(n) => format!("exit status {n}"),
        None => "killed by a signal".into(),
    }
}

pub(crate) fn tool_error(tool: &str, detail: String) -> Error {
    Error::Tool {
        tool: tool.to_string(),
        detail,
    }
}

/// For a failed `-restore`: the input line its stderr blames (`Error occurred at line: N`).
pub(crate) fn blamed_line(stderr: &str, input: &str) -> Option<String> {
    let n: usize = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("Error occurred at line:"))?
        .trim()
        .parse()
        .ok()?;
    let line = input.lines().nth(n.checked_sub(1)?)?;
    Some(format!("input line {n} is `{line}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blamed_line_quotes_the_input() {
        let input = "*nat\n-N A\n-A PREROUTING -j B\nCOMMIT\n";
        let err = "iptables-restore: Chain 'B' does not exist\nError occurred at line: 3\nTry ...";
        assert_eq!(
            blamed_line(err, input).as_deref(),
            Some("input line 3 is `-A PREROUTING -j B`")
        );
        assert_eq!(blamed_line("Error occurred at line: 0", input), None);
        assert_eq!(blamed_line("Error occurred at line: 99", input), None);
        assert_eq!(blamed_line("Error occurred at line: x", input), None);
        assert_eq!(blamed_line("nothing", input), None);
    }

    #[test]
    fn missing_binary_is_a_spawn_error() {
        let e = run("rdt-no-such-binary", &[], None).err().unwrap();
        assert!(spawn_failure("rdt-no-such-binary", &e).contains("not installed"));
    }
}
