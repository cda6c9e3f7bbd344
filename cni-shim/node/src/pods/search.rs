//! Finding a running pod's network namespace from the node, for the repair controller.
//!
//! Istio scans every process under the host's `/proc` and takes the oldest whose namespace holds
//! the pod's IP; that matches by IP alone (a host interface carrying the address would win, and
//! the rules would land in the host's namespace), finds nothing when the runtime keeps no
//! process in the pod (CRI-O's `drop_infra_ctr`), and hands back a `/proc/PID` path that may
//! name another namespace by the time it is opened again. Here:
//!
//! - a process counts only when its cgroup names the pod's UID (`pod<uid>` as cgroupfs writes
//!   it, or with `_` for `-` as the systemd driver does), and its namespace holds the pod's IP
//!   (an address dump inside it);
//! - among those, the oldest process wins (the pause container, which outlives the others);
//! - without such a process, namespaces pinned under the runtime's pin folder
//!   (`/var/run/netns`) that hold the IP are the fallback;
//! - the agent's own namespace is never a candidate;
//! - the namespace is returned as an open file, which is what the apply enters.

use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use redirect_core::Netns;
use redirect_core::NetnsId;

/// A pod's network namespace, held open (its path, `Netns::path`, is where it was found:
/// `<proc>/<pid>/ns/net` or a pin, for log lines).
pub type PodNetns = Netns;

/// Why no namespace was found; each names what was looked at.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// No namespace of the pod's processes, nor any pinned one, holds its address.
    #[error(
        "no network namespace holds pod {uid}'s IP {ip}: {processes} process(es) under {proc} \
         belong to the pod, {pins} pinned namespace(s) under {pin_dir} were checked; the pod's \
         sandbox may be gone, or the agent cannot see the host's processes (mount the host's \
         /proc and give the agent SYS_PTRACE)"
    )]
    NotFound {
        /// The pod's UID.
        uid: String,
        /// The address looked for.
        ip: IpAddr,
        /// The host's `/proc` searched.
        proc: PathBuf,
        /// The pod's processes found there (by their cgroup).
        processes: usize,
        /// The folder of pinned namespaces searched.
        pin_dir: PathBuf,
        /// The pinned namespaces checked.
        pins: usize,
    },
    /// The search by UID alone ([`find_by_uid`]): no process of the pod is in a namespace other
    /// than the agent's.
    #[error(
        "no process of pod {uid} under {proc} is in a network namespace of its own \
         ({processes} found by their cgroup): the runtime may keep no process in the pod, or \
         the agent cannot see the host's processes (mount the host's /proc)"
    )]
    NoProcess {
        /// The pod's UID.
        uid: String,
        /// The host's `/proc` searched.
        proc: PathBuf,
        /// The pod's processes found there (by their cgroup).
        processes: usize,
    },
    /// The host's `/proc`, or the agent's own namespace, could not be read.
    #[error("cannot read {path}")]
    Read {
        /// What could not be read.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
}

/// Finds the network namespace of the pod with `uid` and `ip`: see the module's comment.
/// `proc` is the host's `/proc` as the agent sees it (e.g. `/host/proc`); `pins` the folder of
/// pinned namespaces (e.g. `/var/run/netns`; a missing folder holds none).
pub fn find(proc: &Path, pins: &Path, uid: &str, ip: IpAddr) -> Result<PodNetns, FindError> {
    let (own, candidates) = oldest_first(proc, uid)?;
    let processes = candidates.len();
    let mut seen: Vec<NetnsId> = vec![own];
    for c in candidates {
        if let Some(found) = holding(&c.netns, ip, &mut seen) {
            return Ok(found);
        }
    }
    let mut pinned = 0;
    if let Ok(dir) = fs::read_dir(pins) {
        let mut paths: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            pinned += 1;
            if let Some(found) = holding(&path, ip, &mut seen) {
                return Ok(found);
            }
        }
    }
    Err(FindError::NotFound {
        uid: uid.to_owned(),
        ip,
        proc: proc.to_owned(),
        processes,
        pin_dir: pins.to_owned(),
        pins: pinned,
    })
}

/// Finds the network namespace of the pod with `uid` by its processes alone (their cgroup names
/// the pod), for a pod whose status has no address yet: the oldest process's namespace that is
/// not the agent's own. Without such a process (the runtime keeps none, or the sandbox is
/// gone) it is an error naming what was looked at.
pub fn find_by_uid(proc: &Path, uid: &str) -> Result<PodNetns, FindError> {
    let (own, candidates) = oldest_first(proc, uid)?;
    let processes = candidates.len();
    for c in candidates {
        if let Ok(ns) = Netns::open(&c.netns) {
            if ns.id() != own {
                return Ok(ns);
            }
        }
    }
    Err(FindError::NoProcess {
        uid: uid.to_owned(),
        proc: proc.to_owned(),
        processes,
    })
}

/// The agent's own namespace, and the pod's processes, the oldest first.
fn oldest_first(proc: &Path, uid: &str) -> Result<(NetnsId, Vec<PodProcess>), FindError> {
    let own = redirect_core::current_netns_id().map_err(|source| FindError::Read {
        path: "/proc/thread-self/ns/net".into(),
        source,
    })?;
    let mut candidates = pod_processes(proc, uid)?;
    candidates.sort_by_key(|c| c.start);
    Ok((own, candidates))
}

/// A process of the pod: its namespace file and its start time (clock ticks after boot).
struct PodProcess {
    netns: PathBuf,
    start: u64,
}

/// The processes under `proc` whose cgroup names the pod. Processes that exit while being read
/// are skipped.
fn pod_processes(proc: &Path, uid: &str) -> Result<Vec<PodProcess>, FindError> {
    let dir = fs::read_dir(proc).map_err(|source| FindError::Read {
        path: proc.to_owned(),
        source,
    })?;
    let (dashed, underscored) = (format!("pod{uid}"), format!("pod{}", uid.replace('-', "_")));
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let base = entry.path();
        let Ok(cgroup) = fs::read_to_string(base.join("cgroup")) else {
            continue;
        };
        if !cgroup.contains(&dashed) && !cgroup.contains(&underscored) {
            continue;
        }
        let Some(start) = fs::read_to_string(base.join("stat"))
            .ok()
            .and_then(|s| start_time(&s))
        else {
            continue;
        };
        out.push(PodProcess {
            netns: base.join("ns/net"),
            start,
        });
    }
    Ok(out)
}

/// Field 22 of `/proc/PID/stat`, counted after the command name (which may hold spaces and
/// parentheses, so the last `)` ends it).
fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")": field 3 (state) is the first; starttime is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The namespace at `path`, opened, if it is not one already looked at and it holds `ip`.
fn holding(path: &Path, ip: IpAddr, seen: &mut Vec<NetnsId>) -> Option<PodNetns> {
    let ns = Netns::open(path).ok()?;
    if seen.contains(&ns.id()) {
        return None;
    }
    seen.push(ns.id());
    let addrs = redirect_core::Namespace::addresses_of(&ns).ok()?;
    addrs.contains(&ip).then_some(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_after_the_command() {
        let stat = "4242 (pause (x) y) S 1 4242 4242 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 \
                    123456 1081344 1 18446744073709551615";
        assert_eq!(start_time(stat), Some(123456));
        assert_eq!(start_time("1 (init) S"), None);
        assert_eq!(start_time("no parenthesis"), None);
    }
}
