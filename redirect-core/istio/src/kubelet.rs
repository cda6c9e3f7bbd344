//! kubelet's UID on the host, found as Istio's node agent finds it for the host's probe SNAT
//! (`redirect_model::HostProbeConfig::kubelet_uid`): in the host's `/proc`, the first process
//! whose `comm` is `kubelet` and whose command line has an argument containing "kubelet" (any
//! case); else the same for `kubelite` (MicroK8s); else a `k3s` process (its command line is
//! not looked at); its real UID, the first number of the `Uid:` line of its `status`. "First"
//! is the lowest PID here (Istio takes its listing's order), so a scan is repeatable.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Why kubelet's UID was not found.
#[derive(Debug, thiserror::Error)]
pub enum KubeletUidError {
    /// The directory could not be listed.
    #[error("cannot list {path}; kubelet's UID is read from the host's /proc: mount the host's /proc into the agent (hostPID: true, or a hostPath volume of /proc) and pass its path")]
    Proc {
        /// The `/proc` directory given.
        path: PathBuf,
        /// Why listing it failed.
        source: io::Error,
    },

    /// No process qualified.
    #[error("no kubelet in {path}: of {scanned} processes none is `kubelet` or `kubelite` with an argument naming kubelet, or `k3s`; if this is not the host's /proc (a container sees its own processes only), mount the host's /proc (hostPID: true, or a hostPath volume of /proc) and pass its path")]
    NotFound {
        /// The `/proc` directory scanned.
        path: PathBuf,
        /// How many processes it listed.
        scanned: usize,
    },

    /// kubelet's `status` has no readable real UID.
    #[error("cannot read kubelet's real UID from {path}: {detail}; the host's /proc must be readable by the agent (run it as root)")]
    Status {
        /// kubelet's `/proc/<pid>/status` file.
        path: PathBuf,
        /// What was wrong with it (unreadable, no `Uid:` line, not a number).
        detail: String,
    },
}

/// The process names that are kubelet, in the order they are tried, and whether the command
/// line must name kubelet.
const KUBELETS: [(&str, bool); 3] = [("kubelet", true), ("kubelite", true), ("k3s", false)];

/// kubelet's real UID, from the host's `/proc` mounted at `proc`.
pub fn kubelet_uid(proc: &Path) -> Result<u32, KubeletUidError> {
    let pids = pids(proc)?;
    // Each process's comm once; one that exits meanwhile is skipped.
    let comms: Vec<(u32, String)> = pids
        .iter()
        .filter_map(|&pid| Some((pid, read_trimmed(&proc.join(format!("{pid}/comm")))?)))
        .collect();
    for (name, needs_arg) in KUBELETS {
        for (pid, comm) in &comms {
            if comm == name && (!needs_arg || names_kubelet(&proc.join(format!("{pid}/cmdline")))) {
                return real_uid(&proc.join(format!("{pid}/status")));
            }
        }
    }
    Err(KubeletUidError::NotFound {
        path: proc.to_path_buf(),
        scanned: pids.len(),
    })
}

/// The numeric entries of `proc`, sorted.
fn pids(proc: &Path) -> Result<Vec<u32>, KubeletUidError> {
    let bad = |source| KubeletUidError::Proc {
        path: proc.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for entry in fs::read_dir(proc).map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
            out.push(pid);
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Whether an argument of the command line (NUL-separated) contains "kubelet", any case.
fn names_kubelet(cmdline: &Path) -> bool {
    let Ok(bytes) = fs::read(cmdline) else {
        return false;
    };
    bytes.split(|b| *b == 0).any(|arg| {
        String::from_utf8_lossy(arg)
            .to_lowercase()
            .contains("kubelet")
    })
}

/// The real UID: the first number of the `Uid:` line (real, effective, saved, filesystem).
fn real_uid(status: &Path) -> Result<u32, KubeletUidError> {
    let bad = |detail: String| KubeletUidError::Status {
        path: status.to_path_buf(),
        detail,
    };
    let text = fs::read_to_string(status).map_err(|e| bad(e.to_string()))?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .ok_or_else(|| bad("no Uid: line".into()))?;
    let first = line.split_whitespace().next().unwrap_or_default();
    first.parse().map_err(|_| {
        bad(format!(
            "Uid: line {:?} does not start with a number",
            line.trim()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /proc in a directory of its own, removed when dropped.
    struct FakeProc(PathBuf);

    impl FakeProc {
        fn new(tag: &str) -> FakeProc {
            let dir =
                std::env::temp_dir().join(format!("kubelet-uid-{}-{tag}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            fs::create_dir_all(dir.join("self")).unwrap();
            FakeProc(dir)
        }

        fn process(&self, pid: u32, comm: &str, args: &[&str], uid: &str) -> &Self {
            let d = self.0.join(pid.to_string());
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
            let mut cmdline = args.join("\0");
            cmdline.push('\0');
            fs::write(d.join("cmdline"), cmdline).unwrap();
            let status = format!("Name:\t{comm}\nUmask:\t0022\nUid:\t{uid}\nGid:\t0\t0\t0\t0\n");
            fs::write(d.join("status"), status).unwrap();
            self
        }
    }

    impl Drop for FakeProc {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn kubelet_first_then_kubelite_then_k3s() {
        let p = FakeProc::new("order");
        p.process(1, "systemd", &["/sbin/init"], "0\t0\t0\t0")
            .process(40, "k3s", &["k3s", "server"], "7\t7\t7\t7")
            .process(
                50,
                "kubelite",
                &["/snap/kubelite", "--kubelet-args"],
                "8\t8\t8\t8",
            )
            .process(
                300,
                "kubelet",
                &["/usr/bin/KUBELET", "--v=2"],
                "1234\t0\t0\t0",
            );
        assert_eq!(
            kubelet_uid(&p.0).unwrap(),
            1234,
            "kubelet wins, its real UID"
        );
        fs::remove_dir_all(p.0.join("300")).unwrap();
        assert_eq!(kubelet_uid(&p.0).unwrap(), 8, "then kubelite");
        fs::remove_dir_all(p.0.join("50")).unwrap();
        assert_eq!(
            kubelet_uid(&p.0).unwrap(),
            7,
            "then k3s, whatever its arguments"
        );
    }

    #[test]
    fn a_kubelet_whose_command_line_does_not_name_it_is_not_kubelet() {
        let p = FakeProc::new("cmdline");
        p.process(20, "kubelet", &["/usr/bin/sleep", "100"], "5\t5\t5\t5")
            .process(
                30,
                "kubelet",
                &["/opt/bin/hyperkube", "Kubelet"],
                "6\t0\t0\t0",
            );
        assert_eq!(kubelet_uid(&p.0).unwrap(), 6);
    }

    #[test]
    fn no_kubelet_names_the_place_and_the_fix() {
        let p = FakeProc::new("none");
        p.process(1, "sh", &["sh"], "0\t0\t0\t0")
            .process(2, "kubelet", &["sleep"], "0\t0\t0\t0");
        let e = kubelet_uid(&p.0).unwrap_err().to_string();
        assert!(e.contains(p.0.to_str().unwrap()), "{e}");
        assert!(
            e.contains("2 processes") && e.contains("mount the host's /proc"),
            "{e}"
        );
        let missing = p.0.join("nothing-here");
        let e = kubelet_uid(&missing).unwrap_err().to_string();
        assert!(
            e.contains("nothing-here") && e.contains("mount the host's /proc"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_uid_line_is_an_error_naming_the_file() {
        let p = FakeProc::new("status");
        p.process(9, "kubelet", &["kubelet"], "x\t0\t0\t0");
        let e = kubelet_uid(&p.0).unwrap_err().to_string();
        assert!(
            e.contains("9/status") && e.contains("\"x\\t0\\t0\\t0\""),
            "{e}"
        );
    }
}
