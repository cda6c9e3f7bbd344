//! The plugin's requests at ADD and CHECK (`cni_protocol::ambient`): a `SOCK_SEQPACKET` socket
//! in the run directory (mode 0600, root's: only root on the node may connect), one request
//! and one answer per connection. `gate` lets the requests in on one thread (a connection
//! that says nothing within [`FIRST_REQUEST`] is closed, and at most [`WAITING`] are held);
//! at most [`IN_FLIGHT`] requests wait for the controller at once, the rest answered "busy"
//! at once. The controller decides and answers in its own order with the watch's work.

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Pod};
use kube::api::Api;
use redirect_core::ambient::Enrollment;
use redirect_core::Netns;
use tokio::sync::mpsc;

use super::controller::{Controller, State};
use super::dataplane::{Rules, Stage};
use super::error::AmbientError;
use super::identity::{self, Binding, Claim};
use super::pods;
use cni_protocol::ambient::{AddAnswer, AddRequest, Command, MAX_MESSAGE, SOCKET_NAME};
use cni_protocol::gate::{self, Closed, Limits};
use cni_protocol::seqpacket::{self, Datagram};

/// How long a connection may take to send its request (the plugin sends it as it connects).
pub const FIRST_REQUEST: Duration = Duration::from_secs(1);
/// Connections held while they have said nothing.
pub const WAITING: usize = 32;
/// Requests waiting for the controller at once (a node's burst of pod starts, with room).
pub const IN_FLIGHT: usize = 256;

/// The plugin's request, with the pod's namespace and where to answer.
pub struct PluginRequest {
    pub add: AddRequest,
    pub netns: OwnedFd,
    pub reply: Reply,
}

/// The connection a request came on; answering (or dropping it) frees its place.
pub struct Reply {
    conn: OwnedFd,
    in_flight: Arc<AtomicUsize>,
}

impl Reply {
    /// Answers; the error when the plugin is gone (it gave up waiting: `Broken pipe`).
    pub fn send(self, answer: &AddAnswer) -> std::io::Result<()> {
        send_answer(&self.conn, answer)
    }

    /// Whether the plugin closed its end (it gave up waiting, and failed its ADD): then
    /// nothing may be done for the request.
    pub fn gone(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        // The end of a closed connection reads as readable (its EOF) and hung up.
        let mut fds = [PollFd::new(self.conn.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => false,
            // The plugin sends nothing after its request: anything readable is its end.
            Ok(_) => fds[0].revents().is_some_and(|r| {
                r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLIN)
            }),
            Err(_) => false,
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `answer` on the plugin's connection; the error when the plugin is gone.
fn send_answer(conn: &OwnedFd, answer: &AddAnswer) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(answer).map_err(std::io::Error::other)?;
    seqpacket::send(conn.as_fd(), &bytes, None, MAX_MESSAGE)
}

/// [`send_answer`], a failure logged.
fn answer_on(conn: &OwnedFd, answer: &AddAnswer) {
    if let Err(e) = send_answer(conn, answer) {
        tracing::warn!("ambient: could not answer the plugin: {e}");
    }
}

/// The listening socket's thread; dropping it stops the thread and removes the socket.
pub struct Listener {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens in `run_dir` (which the agent has checked is its own) and forwards each request.
pub fn listen_in(run_dir: &Path, to: mpsc::Sender<PluginRequest>) -> std::io::Result<Listener> {
    let path = run_dir.join(SOCKET_NAME);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let sock = seqpacket::listen_private(&path, 128)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("ambient-plugin".into())
        .spawn(move || door(&sock, &flag, &to))?;
    Ok(Listener {
        path,
        stop,
        thread: Some(thread),
    })
}

fn door(sock: &OwnedFd, stop: &AtomicBool, to: &mpsc::Sender<PluginRequest>) {
    let limits = Limits {
        waiting: WAITING,
        first_datagram: FIRST_REQUEST,
        max: MAX_MESSAGE,
        tick: Duration::from_secs(1),
    };
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut seen = Closed::default();
    let first = |conn: OwnedFd, got: std::io::Result<Datagram>| {
        let _ = seqpacket::set_timeouts(&conn, Duration::from_secs(1));
        let read = got.map_err(|error| AmbientError::Unreadable { error });
        let (add, netns) = match read.and_then(read_request) {
            Ok(r) => r,
            Err(e) => {
                let error = e.to_string();
                return answer_on(&conn, &AddAnswer::Failed { error });
            }
        };
        if in_flight.fetch_add(1, Ordering::AcqRel) >= IN_FLIGHT {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            let error = format!(
                "the agent is busy ({IN_FLIGHT} requests waiting); the runtime tries again"
            );
            tracing::warn!(
                "ambient: the plugin's request for {}/{} refused: {error}",
                add.namespace,
                add.name
            );
            return answer_on(&conn, &AddAnswer::Failed { error });
        }
        let reply = Reply {
            conn,
            in_flight: in_flight.clone(),
        };
        let request = PluginRequest { add, netns, reply };
        if let Err(e) = to.try_send(request) {
            let (error, r) = match e {
                mpsc::error::TrySendError::Full(r) => {
                    ("the agent is busy; the runtime tries again", r)
                }
                mpsc::error::TrySendError::Closed(r) => {
                    ("the ambient controller is not running", r)
                }
            };
            answer_on(
                &r.reply.conn,
                &AddAnswer::Failed {
                    error: error.into(),
                },
            );
        }
    };
    let tick = |closed: Closed| {
        if closed != seen {
            tracing::warn!(
                "ambient: {} connection(s) on {SOCKET_NAME} closed before their request ({} \
                 to make room, {} at the {FIRST_REQUEST:?} deadline); the plugin sends its \
                 request as soon as it connects",
                closed.evicted + closed.timed_out - seen.evicted - seen.timed_out,
                closed.evicted - seen.evicted,
                closed.timed_out - seen.timed_out,
            );
            seen = closed;
        }
    };
    gate::serve(sock, limits, stop, first, tick);
}

fn read_request(d: Datagram) -> Result<(AddRequest, OwnedFd), AmbientError> {
    let add: AddRequest =
        serde_json::from_slice(&d.bytes).map_err(|error| AmbientError::BadRequest { error })?;
    let mut fds = d.fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(fd), None) => Ok((add, fd)),
        _ => Err(AmbientError::Descriptors),
    }
}

/// The plugin's command, as the logs name it.
fn verb(command: Command) -> &'static str {
    match command {
        Command::Add => "ADD",
        Command::Check => "CHECK",
    }
}

impl Controller {
    /// The plugin's ADD or CHECK: the pod decided from the watch's memory (or the API when
    /// the watch has not seen it yet).
    pub(super) async fn plugin_request(&self, state: &mut State, r: PluginRequest) {
        let who = format!("{}/{}", r.add.namespace, r.add.name);
        let command = r.add.command;
        if r.reply.gone() {
            // The plugin gave up waiting (the agent was stalled) and failed its ADD: the
            // runtime tears the sandbox down. Doing it now would enroll a dead sandbox.
            tracing::warn!(
                "ambient: pod {who}: the plugin gave up on its {} before the agent got to it \
                 (its connection is closed): dropped, nothing done",
                verb(command)
            );
            return;
        }
        let mut uid = None;
        let answer = match self.decide_for_plugin(state, &r.add).await {
            Err(e) => AddAnswer::Failed {
                error: e.to_string(),
            },
            Ok(Err(reason)) => AddAnswer::NotAmbient { reason },
            Ok(Ok(pod)) => {
                uid.clone_from(&pod.metadata.uid);
                match command {
                    Command::Add => self.enroll_for_plugin(state, &pod, r.add, r.netns).await,
                    Command::Check => self.check_for_plugin(&pod, r.netns, &r.add.netns).await,
                }
            }
        };
        let verb = verb(command);
        match &answer {
            AddAnswer::Enrolled => tracing::info!("ambient: pod {who} enrolled at ADD"),
            AddAnswer::Matches => tracing::debug!("ambient: pod {who} at CHECK: its rules match"),
            AddAnswer::Differs { differences } => tracing::warn!(
                "ambient: pod {who} at CHECK: its rules differ: {}",
                differences.join("; ")
            ),
            AddAnswer::NotAmbient { reason } => {
                tracing::debug!("ambient: pod {who} at {verb}: not ambient ({reason})")
            }
            AddAnswer::Failed { error } => {
                self.metrics.ambient_failed();
                tracing::warn!("ambient: pod {who} at {verb}: {error}")
            }
        }
        // Istio's agent answers the ambient ADDs its plugin sends (ours asks about every pod
        // without a sidecar: a pod found not ambient is not one of those).
        match (command, &answer) {
            (Command::Add, AddAnswer::Enrolled) => self.metrics.ambient_plugin_request("200"),
            (Command::Add, AddAnswer::Failed { .. }) => self.metrics.ambient_plugin_request("500"),
            _ => {}
        }
        if let Err(e) = r.reply.send(&answer) {
            tracing::warn!("ambient: pod {who}: could not answer the plugin's {verb}: {e}");
            if let (AddAnswer::Enrolled, Some(uid)) = (&answer, &uid) {
                // The plugin failed the ADD (it gave up meanwhile): the runtime tears the
                // sandbox down, so what this ADD did is undone, as a failed ADD leaves
                // nothing.
                self.release(uid, false).await;
                tracing::warn!(
                    "ambient: pod {who}: the ADD the plugin gave up on is undone (released, \
                     ztunnel told)"
                );
            }
        }
        self.update_metrics();
    }

    /// The pod and whether it is ambient (`Ok(Err(reason))` when not).
    async fn decide_for_plugin(
        &self,
        state: &mut State,
        add: &AddRequest,
    ) -> Result<Result<Pod, String>, AmbientError> {
        let cached = state.pods.values().find(|p| {
            p.metadata.namespace.as_deref() == Some(&add.namespace)
                && p.metadata.name.as_deref() == Some(&add.name)
                && add
                    .uid
                    .as_ref()
                    .is_none_or(|u| p.metadata.uid.as_ref() == Some(u))
        });
        let pod = match cached {
            Some(p) => p.clone(),
            None => {
                let pod = Api::<Pod>::namespaced(self.client.clone(), &add.namespace)
                    .get(&add.name)
                    .await
                    .map_err(|error| AmbientError::Read {
                        what: format!("pod {}/{}", add.namespace, add.name),
                        error: Box::new(error),
                    })?;
                // Known before the watch brings it: the queue must not take it for deleted.
                state.remember(&pod);
                pod
            }
        };
        if !state.namespaces.contains_key(&add.namespace) {
            let ns = Api::<KubeNamespace>::all(self.client.clone())
                .get(&add.namespace)
                .await
                .map_err(|error| AmbientError::Read {
                    what: format!("namespace {}", add.namespace),
                    error: Box::new(error),
                })?;
            state.namespaces.insert(
                add.namespace.clone(),
                ns.metadata.labels.unwrap_or_default(),
            );
        }
        Ok(
            match pods::decide(
                &pod,
                &state.namespace_labels(&pod),
                &self.excluded,
                &self.settings.selectors,
            ) {
                Enrollment::Ambient => Ok(pod),
                Enrollment::Not(why) => Err(why.to_string()),
            },
        )
    }

    /// ADD: the namespace handed over is checked to be the pod's (`identity`), then the pod is
    /// enrolled in it. A namespace that fails the check changes nothing, whatever was enrolled.
    async fn enroll_for_plugin(
        &self,
        state: &mut State,
        pod: &Pod,
        add: AddRequest,
        fd: OwnedFd,
    ) -> AddAnswer {
        let (netns, cfg) = match self.handed_over(pod, fd, &add.netns) {
            Ok(got) => got,
            Err(answer) => return answer,
        };
        let (ips, binding) = match self.bind(state, pod, &netns, &add).await {
            Ok(checked) => checked,
            Err(answer) => return answer,
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut r = pods::pod_ref(pod);
        r.ips = ips;
        let was_enrolled = {
            let id = uid.clone();
            self.with_dataplane(move |dp| dp.pod(&id).is_some()).await
        };
        let added = self
            .with_dataplane(move |dp| dp.enroll(&r, Some((netns, binding)), &cfg, Rules::Apply))
            .await;
        match added {
            Ok((Stage::Enabled, _)) => {
                // The annotation right after the answer (the queue's next turn): the API's
                // round trip is not the pod's start's.
                state.queue.add(&uid);
                AddAnswer::Enrolled
            }
            Ok((_, refused)) => {
                let id = uid.clone();
                let lacking = self
                    .with_dataplane(move |dp| dp.listeners_missing(&id))
                    .await;
                // ADD fails: the namespace as it was (the runtime tears the sandbox down and
                // tries again).
                self.release(&uid, false).await;
                if was_enrolled {
                    state.queue.add(&uid);
                }
                AddAnswer::Failed {
                    error: match refused {
                        Some(e) => redirect_program::errors::chain(&e),
                        None if !lacking.is_empty() => format!(
                            "ztunnel acked the pod but its listeners {} are missing in the pod's \
                             namespace (ztunnel's proxy for it is not up: see ztunnel's log)",
                            super::listeners::words(&lacking)
                        ),
                        None => format!(
                            "ztunnel is not connected to {}: an ambient pod cannot start without it",
                            self.settings.ztunnel_socket.display()
                        ),
                    },
                }
            }
            Err(e) => AddAnswer::Failed {
                error: e.to_string(),
            },
        }
    }

    /// The namespace a request handed over (judged: a network namespace) and the pod's
    /// in-pod settings; the answer to give when either cannot be had.
    fn handed_over(
        &self,
        pod: &Pod,
        fd: OwnedFd,
        path: &str,
    ) -> Result<(Netns, redirect_core::AmbientConfig), AddAnswer> {
        let failed = |error: String| AddAnswer::Failed { error };
        let netns =
            Netns::from_file(File::from(fd), Path::new(path)).map_err(|e| failed(e.to_string()))?;
        let cfg = self.pod_config(pod).map_err(|e| failed(e.to_string()))?;
        Ok((netns, cfg))
    }

    /// Whether `netns` may be the pod's (`identity::check`, with what the watch and the data
    /// plane know): the addresses checked and how, or the refusal to answer with.
    async fn bind(
        &self,
        state: &State,
        pod: &Pod,
        netns: &Netns,
        add: &AddRequest,
    ) -> Result<(Vec<IpAddr>, Binding), AddAnswer> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let owners = state.address_owners(&uid);
        let (id, except) = (netns.id(), uid);
        let bound = self
            .with_dataplane(move |dp| dp.bound_to(id, &except))
            .await;
        let claim = Claim {
            api: &pods::ips(pod),
            request: &add.ips,
            owner_of: &|ip| owners.get(&ip).cloned(),
            bound_to: &|_| bound.clone(),
        };
        identity::check(netns, &claim).map_err(|refused| {
            tracing::warn!(
                "ambient: pod {}: the namespace handed over at ADD ({}) is refused: {refused}",
                pods::label(pod),
                add.netns
            );
            AddAnswer::Failed {
                error: refused.to_string(),
            }
        })
    }

    /// CHECK: the pod's in-pod rules in the namespace handed over, against its plan; the
    /// namespace must be the one the pod is enrolled in.
    async fn check_for_plugin(&self, pod: &Pod, fd: OwnedFd, path: &str) -> AddAnswer {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let (netns, cfg) = match self.handed_over(pod, fd, path) {
            Ok(got) => got,
            Err(answer) => return answer,
        };
        let id = uid.clone();
        let bound = self.with_dataplane(move |dp| dp.netns_id(&id)).await;
        if bound != Some(netns.id()) {
            return AddAnswer::Differs {
                differences: vec![match bound {
                    None => "the pod is ambient but the agent holds no namespace for it (not \
                             enrolled yet, or its namespace was not found)"
                        .into(),
                    Some(_) => "the namespace checked is not the one the pod is enrolled in".into(),
                }],
            };
        }
        // ztunnel's listeners too, as the pass reads them: the rules alone prove nothing.
        let wanted = self
            .settings
            .check_listeners
            .then(|| super::listeners::wanted(&cfg));
        let checked = tokio::task::spawn_blocking(move || {
            let lacking = wanted.map(|w| {
                redirect_core::listeners::SockDiag::open_in(&netns).and_then(|mut d| d.missing(&w))
            });
            let capture = redirect_core::Capture::Ambient(cfg);
            let rules =
                redirect_core::Namespace::from_netns(netns).and_then(|ns| ns.check(&capture));
            rules.map(|d| {
                let mut d: Vec<String> = d.iter().map(|m| m.to_string()).collect();
                match lacking {
                    Some(Ok(m)) if !m.is_empty() => d.push(format!(
                        "ztunnel's listeners {} are missing in the pod's namespace",
                        super::listeners::words(&m)
                    )),
                    Some(Err(e)) => d.push(format!("ztunnel's listeners could not be read: {e}")),
                    _ => {}
                }
                d
            })
        })
        .await;
        match checked {
            Ok(Ok(d)) if d.is_empty() => AddAnswer::Matches,
            Ok(Ok(differences)) => AddAnswer::Differs { differences },
            Ok(Err(e)) => AddAnswer::Failed {
                error: format!("reading the in-pod rules back: {e}"),
            },
            Err(e) => AddAnswer::Failed {
                error: e.to_string(),
            },
        }
    }
}
