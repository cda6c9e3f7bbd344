//! The plugin's requests at ADD (`cni_plugin::ambient`): a `SOCK_SEQPACKET` socket in the
//! run directory (root's, mode 0755: only root on the node may connect), one request and one
//! answer per connection. A thread accepts and reads them; the controller decides and enrolls,
//! in its own order with the watch's work.

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Pod};
use kube::api::Api;
use redirect_core::istio::ambient::Enrollment;
use redirect_core::Netns;
use tokio::sync::{mpsc, oneshot};

use super::controller::{Controller, PluginRequest, State};
use super::dataplane::{Rules, Stage};
use super::pods;
use cni_plugin::ambient::{AddAnswer, AddRequest, MAX_MESSAGE, SOCKET_NAME};
use cni_plugin::seqpacket;

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
    let sock = seqpacket::listen(&path, 64, Duration::from_millis(200))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("ambient-plugin".into())
        .spawn(move || accept_loop(&sock, &flag, &to))?;
    Ok(Listener {
        path,
        stop,
        thread: Some(thread),
    })
}

fn accept_loop(sock: &OwnedFd, stop: &AtomicBool, to: &mpsc::Sender<PluginRequest>) {
    while !stop.load(Ordering::Relaxed) {
        let conn = match seqpacket::accept(sock) {
            Ok(Some(conn)) => conn,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("ambient: the plugin's socket: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let to = to.clone();
        // One thread per request: a slow enrollment must not hold the next pod's.
        let _ = std::thread::Builder::new()
            .name("ambient-add".into())
            .spawn(move || serve(conn, &to));
    }
}

/// Reads one request, hands it to the controller, writes its answer.
fn serve(conn: OwnedFd, to: &mpsc::Sender<PluginRequest>) {
    let _ = seqpacket::set_timeouts(&conn, Duration::from_secs(10));
    let answer = match read_request(&conn) {
        Ok((add, netns)) => {
            let (tx, rx) = oneshot::channel();
            let who = format!("{}/{}", add.namespace, add.name);
            let request = PluginRequest {
                add,
                netns,
                answer: tx,
            };
            match to.blocking_send(request) {
                Ok(()) => rx.blocking_recv().unwrap_or_else(|_| AddAnswer::Failed {
                    error: format!("the agent dropped the request for {who} (stopping?)"),
                }),
                Err(_) => AddAnswer::Failed {
                    error: "the ambient controller is not running".into(),
                },
            }
        }
        Err(error) => AddAnswer::Failed { error },
    };
    if let Ok(bytes) = serde_json::to_vec(&answer) {
        if let Err(e) = seqpacket::send(conn.as_fd(), &bytes, None, MAX_MESSAGE) {
            tracing::warn!("ambient: could not answer the plugin: {e}");
        }
    }
}

fn read_request(conn: &OwnedFd) -> Result<(AddRequest, OwnedFd), String> {
    let d = seqpacket::recv(conn.as_fd(), MAX_MESSAGE)
        .map_err(|e| format!("reading the request: {e}"))?;
    let add: AddRequest = serde_json::from_slice(&d.bytes)
        .map_err(|e| format!("a request the agent cannot read: {e}"))?;
    let mut fds = d.fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(fd), None) => Ok((add, fd)),
        _ => Err("a request must carry exactly one descriptor, the pod's network namespace".into()),
    }
}

impl Controller {
    /// The plugin's ADD: the pod decided from the watch's memory (or the API when the watch
    /// has not seen it yet), enrolled in the namespace the plugin handed over.
    pub(super) async fn plugin_request(&self, state: &mut State, r: PluginRequest) {
        let who = format!("{}/{}", r.add.namespace, r.add.name);
        let answer = match self.decide_for_plugin(state, &r.add).await {
            Err(error) => AddAnswer::Failed { error },
            Ok(Err(reason)) => AddAnswer::NotAmbient { reason },
            Ok(Ok(pod)) => self.enroll_for_plugin(state, &pod, r.add, r.netns).await,
        };
        match &answer {
            AddAnswer::Enrolled => tracing::info!("ambient: pod {who} enrolled at ADD"),
            AddAnswer::NotAmbient { reason } => {
                tracing::debug!("ambient: pod {who} at ADD: not ambient ({reason})")
            }
            AddAnswer::Failed { error } => {
                self.metrics.ambient_failed();
                tracing::warn!("ambient: pod {who} at ADD: {error}")
            }
        }
        let _ = r.answer.send(answer);
        self.update_metrics();
    }

    /// The pod and whether it is ambient (`Ok(Err(reason))` when not).
    async fn decide_for_plugin(
        &self,
        state: &mut State,
        add: &AddRequest,
    ) -> Result<Result<Pod, String>, String> {
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
                    .map_err(|e| format!("reading pod {}/{}: {e}", add.namespace, add.name))?;
                // Known before the watch brings it: the queue must not take it for deleted.
                state.remember(&pod);
                pod
            }
        };
        if !state.namespaces.contains_key(&add.namespace) {
            let ns = Api::<KubeNamespace>::all(self.client.clone())
                .get(&add.namespace)
                .await
                .map_err(|e| format!("reading namespace {}: {e}", add.namespace))?;
            state.namespaces.insert(
                add.namespace.clone(),
                ns.metadata.labels.unwrap_or_default(),
            );
        }
        Ok(
            match pods::decide(&pod, &state.namespace_labels(&pod), &self.excluded) {
                Enrollment::Ambient => Ok(pod),
                Enrollment::Not(why) => Err(why.to_string()),
            },
        )
    }

    async fn enroll_for_plugin(
        &self,
        state: &mut State,
        pod: &Pod,
        add: AddRequest,
        fd: OwnedFd,
    ) -> AddAnswer {
        let netns = match Netns::from_file(File::from(fd), Path::new(&add.netns)) {
            Ok(n) => n,
            Err(e) => {
                return AddAnswer::Failed {
                    error: e.to_string(),
                }
            }
        };
        let cfg = match self.pod_config(pod) {
            Ok(c) => c,
            Err(error) => return AddAnswer::Failed { error },
        };
        let ips: Vec<IpAddr> = add.ips.clone();
        let r = pods::pod_ref(pod, &ips);
        let uid = r.uid.clone();
        let added = self
            .with_dataplane(move |dp| dp.add(&r, netns, &cfg, Rules::Apply))
            .await;
        match added {
            Ok((Stage::Enabled, _)) => {
                // The annotation right after the answer (the queue's next turn): the API's
                // round trip is not the pod's start's.
                state.queue.add(&uid);
                AddAnswer::Enrolled
            }
            Ok((Stage::Pending, refused)) => {
                // ADD fails: the namespace as it was (the runtime tears the sandbox down and
                // tries again).
                self.release(&uid, false).await;
                AddAnswer::Failed {
                    error: match refused {
                        Some(e) => e.to_string(),
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
}
