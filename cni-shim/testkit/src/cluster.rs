//! A stateful, in-process HTTPS stand-in for the Kubernetes API server, for tests of code that
//! lists, watches, patches and deletes pods and nodes and records events (the repair
//! controller) through kube-rs.
//!
//! One thread accepts on 127.0.0.1 and each connection gets a thread (std TCP and rustls, with
//! the CA and certificate of [`super::pki`]); every answer carries `Connection: close`, so
//! hyper makes one connection per request. The store is a map of JSON objects (pods, nodes,
//! core/v1 and events.k8s.io/v1 events) with one global resource version, as etcd's revision,
//! and a history of every change so that a watch from any version seen in a list misses
//! nothing. What the API server does and this stand-in does too:
//!
//! - lists and watches of a namespace or of all, with `fieldSelector` (`=`, `==`, `!=` on the
//!   fields the API server allows for that resource) and `labelSelector` (`=`, `==`, `!=`,
//!   `in`, `notin`, `k`, `!k`); a watch turns an object that starts or stops matching the
//!   selectors into ADDED or DELETED, ends at `timeoutSeconds`, answers `sendInitialEvents=true`
//!   with the objects then a BOOKMARK marked `k8s.io/initial-events-end`, and answers a version
//!   older than [`Cluster::compact`] with an ERROR event 410 (Expired), as after etcd
//!   compaction;
//! - merge, strategic merge (as merge), JSON (RFC 6902) and apply (as merge) patches of the
//!   object or its `status` subresource; a patch of the object leaves its status alone, a patch
//!   of `status` leaves its spec alone; a patch that changes nothing makes no new version and no
//!   event; a `metadata.resourceVersion` (or `uid`) in the patched object that is not the
//!   stored one is a 409 Conflict; a failed JSON patch operation (`test` included) is a 422, as
//!   the API server answers it;
//! - replace (PUT), with the same rules; create (POST, `generateName` too) and 409
//!   AlreadyExists; delete with `preconditions` (409 on a mismatch), answered with the deleted
//!   object, which is gone at once (no graceful deletion, no finalizers); pod eviction as a
//!   delete;
//! - `dryRun=All` changes nothing; a request without `Authorization: Bearer <TOKEN>` gets 401;
//!   anything else gets 404 (405 for a method a path does not take).
//!
//! Lists ignore `limit` (everything comes in one page without `continue`) and
//! `resourceVersion` (the current state). No periodic BOOKMARKs are sent.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Map, Value};

use super::pki::{pki, reason, status_reason, status_value, write_kubeconfig, TOKEN};

/// One request as the stand-in read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The HTTP method (`GET`, `PATCH`, ...).
    pub method: String,
    /// The path, as sent (percent-encoded).
    pub path: String,
    /// The query string after `?`, as sent (percent-encoded; empty if none).
    pub query: String,
    /// The `Content-Type` header, when sent.
    pub content_type: Option<String>,
    /// The body, as text.
    pub body: String,
}

impl Request {
    /// The decoded value of query parameter `key` (the first one).
    pub fn param(&self, key: &str) -> Option<String> {
        parse_query(&self.query)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Whether this is a watch (`watch=true` or `watch=1`).
    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch").as_deref(), Some("true" | "1"))
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if !self.query.is_empty() {
            write!(f, "?{}", self.query)?;
        }
        Ok(())
    }
}

/// The stand-in API server. Its threads stop, and its watches end, when it is dropped.
pub struct Cluster {
    shared: Arc<Shared>,
    addr: SocketAddr,
    kubeconfig: PathBuf,
    ca_pem: String,
    acceptor: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Listens on 127.0.0.1 (a free port) and writes a kubeconfig for itself (the token
    /// [`TOKEN`], the CA of a fresh [`pki`]) into its own temporary directory.
    pub fn start() -> Cluster {
        let pki = pki();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = write_kubeconfig(dir.path(), &format!("https://{addr}"), &pki.ca_pem);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            server: pki.server,
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("stand-in-accept".into())
            .spawn(move || accept(s, listener))
            .unwrap();
        Cluster {
            shared,
            addr,
            kubeconfig,
            ca_pem: pki.ca_pem,
            acceptor: Some(acceptor),
            _dir: dir,
        }
    }

    /// A kubeconfig for this server, as [`write_kubeconfig`] writes it.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The PEM of the CA that signed the server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Creates or replaces (by namespace, `default` if unset, and name) a pod: sets
    /// `metadata.resourceVersion`, and `metadata.uid` (the stored pod's if it has one) and
    /// `metadata.creationTimestamp` if unset, and emits ADDED or MODIFIED (DELETED then ADDED
    /// for a new uid). The stored pod.
    pub fn put_pod(&self, pod: Value) -> Value {
        self.shared.update(|s| s.put(Res::Pods, pod))
    }

    /// Removes a pod, if there, and emits DELETED.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        self.shared
            .update(|s| s.remove(&(Res::Pods, namespace.into(), name.into())));
    }

    /// Pod `namespace/name` as stored now, if there.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared.get(&(Res::Pods, namespace.into(), name.into()))
    }

    /// Every pod, by namespace then name.
    pub fn pods(&self) -> Vec<Value> {
        self.shared.all(Res::Pods)
    }

    /// As [`Cluster::put_pod`], for a node (cluster-scoped: by name).
    pub fn put_node(&self, node: Value) -> Value {
        self.shared.update(|s| s.put(Res::Nodes, node))
    }

    /// Removes a node, if there, and emits DELETED.
    pub fn remove_node(&self, name: &str) {
        self.shared
            .update(|s| s.remove(&(Res::Nodes, String::new(), name.into())));
    }

    /// Node `name` as stored now, if there.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.shared.get(&(Res::Nodes, String::new(), name.into()))
    }

    /// Every event created (core/v1 and events.k8s.io/v1), in the order of creation, as
    /// stored now (with the patches made since, e.g. kube's `Recorder` counting a series).
    pub fn events(&self) -> Vec<Value> {
        let s = self.shared.state();
        s.event_order
            .iter()
            .filter_map(|k| s.objects.get(k).cloned())
            .collect()
    }

    /// Every request read, in order (including those answered 401, 404 or by
    /// [`Cluster::fail_next`]).
    pub fn requests(&self) -> Vec<Request> {
        self.shared.state().requests.clone()
    }

    /// The next `times` requests with this method (`*`: any) whose path starts with
    /// `path_prefix` are answered `code` with a `Status`, and nothing else happens.
    pub fn fail_next(&self, method: &str, path_prefix: &str, code: u16, times: usize) {
        self.shared.state().failures.push(Failure {
            method: method.to_ascii_uppercase(),
            prefix: path_prefix.to_owned(),
            code,
            left: times,
        });
    }

    /// Forgets the history: a watch from a resource version older than the current one gets
    /// an ERROR event 410 (Expired), after which kube's watcher lists again.
    pub fn compact(&self) {
        // The history stays, for the watches already running.
        let mut s = self.shared.state();
        s.floor = s.rv;
    }

    /// The current (latest) resource version.
    pub fn resource_version(&self) -> u64 {
        self.shared.state().rv
    }

    /// Calls `f` every 20 ms until it returns something, and returns that; panics naming
    /// `what` (and the last requests) after `timeout`.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&Cluster) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            if Instant::now() >= deadline {
                let requests = self.requests();
                let last: Vec<String> = requests
                    .iter()
                    .rev()
                    .take(10)
                    .rev()
                    .map(|r| r.to_string())
                    .collect();
                panic!(
                    "timed out after {timeout:?} waiting for {what}; the last of {} requests:\n  {}",
                    requests.len(),
                    last.join("\n  ")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let shared = &self.shared;
        shared.stop.store(true, Ordering::SeqCst);
        {
            let _state = shared.state();
            shared.changed.notify_all();
        }
        // Wake the accept loop so that it sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        // Connections reading a request or being answered are cut; watches end on `stop`
        // (their last chunk and close_notify), cut too if they take long.
        for c in shared.conns().values().filter(|c| !c.streaming) {
            let _ = c.tcp.shutdown(Shutdown::Both);
        }
        let until = Instant::now() + Duration::from_secs(2);
        while !shared.conns().is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        for c in shared.conns().values() {
            let _ = c.tcp.shutdown(Shutdown::Both);
        }
        let threads =
            std::mem::take(&mut *shared.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Resources and the store

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Res {
    Pods,
    Nodes,
    /// core/v1 events.
    Events,
    /// events.k8s.io/v1 events.
    EventsV1,
}

impl Res {
    fn plural(self) -> &'static str {
        match self {
            Res::Pods => "pods",
            Res::Nodes => "nodes",
            Res::Events | Res::EventsV1 => "events",
        }
    }

    /// As the API server names the resource in messages (`<plural>.<group>`).
    fn qualified(self) -> &'static str {
        match self {
            Res::EventsV1 => "events.events.k8s.io",
            other => other.plural(),
        }
    }

    fn group(self) -> &'static str {
        match self {
            Res::EventsV1 => "events.k8s.io",
            _ => "",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Res::Pods => "Pod",
            Res::Nodes => "Node",
            Res::Events | Res::EventsV1 => "Event",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Res::EventsV1 => "events.k8s.io/v1",
            _ => "v1",
        }
    }

    fn namespaced(self) -> bool {
        self != Res::Nodes
    }

    fn has_status(self) -> bool {
        matches!(self, Res::Pods | Res::Nodes)
    }

    /// The fields the API server can select on (`None`: any path, here).
    fn field_labels(self) -> Option<&'static [&'static str]> {
        match self {
            // pkg/registry/core/pod/strategy.go, ToSelectableFields.
            Res::Pods => Some(&[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ]),
            Res::Nodes => Some(&["metadata.name", "spec.unschedulable"]),
            Res::Events | Res::EventsV1 => None,
        }
    }
}

/// (resource, namespace or "", name)
type Key = (Res, String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

struct Change {
    rv: u64,
    key: Key,
    kind: ChangeKind,
    /// The object after the change (for a deletion: as it was, with the deletion's version).
    object: Value,
    /// The object before a modification.
    prev: Option<Value>,
}

struct Failure {
    method: String,
    prefix: String,
    code: u16,
    left: usize,
}

#[derive(Default)]
struct State {
    rv: u64,
    uids: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    /// Watches from a version below this one are answered 410.
    floor: u64,
    event_order: Vec<Key>,
    requests: Vec<Request>,
    failures: Vec<Failure>,
}

impl State {
    fn new_uid(&mut self) -> String {
        self.uids += 1;
        format!("5a4d0000-0000-4000-8000-{:012x}", self.uids)
    }

    /// Stores `obj` under `key` with a new resource version and records the change.
    fn store(&mut self, key: Key, mut obj: Value) -> Value {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), rv.to_string().into());
        let prev = self.objects.insert(key.clone(), obj.clone());
        let kind = if prev.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.history.push(Change {
            rv,
            key,
            kind,
            object: obj.clone(),
            prev,
        });
        obj
    }

    /// Removes `key` with a new resource version and records the change.
    fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut obj = self.objects.remove(key)?;
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), rv.to_string().into());
        self.history.push(Change {
            rv,
            key: key.clone(),
            kind: ChangeKind::Deleted,
            object: obj.clone(),
            prev: None,
        });
        Some(obj)
    }

    /// The test's create-or-replace.
    fn put(&mut self, res: Res, mut obj: Value) -> Value {
        assert!(obj.is_object(), "not an object: {obj}");
        let name = meta_str(&obj, "name").unwrap_or_else(|| panic!("no metadata.name: {obj}"));
        let ns = if res.namespaced() {
            let ns = meta_str(&obj, "namespace").unwrap_or_else(|| "default".into());
            meta_mut(&mut obj).insert("namespace".into(), ns.clone().into());
            ns
        } else {
            String::new()
        };
        set_type(&mut obj, res);
        let key = (res, ns, name);
        if let Some(old) = self.objects.get(&key) {
            let old_uid = meta_str(old, "uid");
            let old_created = old["metadata"].get("creationTimestamp").cloned();
            match (meta_str(&obj, "uid"), old_uid) {
                (None, Some(uid)) => {
                    meta_mut(&mut obj).insert("uid".into(), uid.into());
                }
                (Some(new), Some(old)) if new != old => {
                    // Another object of the same name.
                    self.remove(&key);
                }
                _ => {}
            }
            if let (None, Some(t)) = (obj["metadata"].get("creationTimestamp"), old_created) {
                meta_mut(&mut obj).insert("creationTimestamp".into(), t);
            }
        }
        self.init_meta(&mut obj);
        self.store(key, obj)
    }

    /// Sets `uid` and `creationTimestamp` where unset.
    fn init_meta(&mut self, obj: &mut Value) {
        if meta_str(obj, "uid").is_none() {
            let uid = self.new_uid();
            meta_mut(obj).insert("uid".into(), uid.into());
        }
        if obj["metadata"].get("creationTimestamp").is_none() {
            let now = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
            meta_mut(obj).insert("creationTimestamp".into(), now.into());
        }
    }

    /// The failure to answer `method path` with, if one is due.
    fn take_failure(&mut self, method: &str, path: &str) -> Option<u16> {
        let f = self.failures.iter_mut().find(|f| {
            f.left > 0 && (f.method == "*" || f.method == method) && path.starts_with(&f.prefix)
        })?;
        f.left -= 1;
        Some(f.code)
    }
}

struct Conn {
    tcp: TcpStream,
    streaming: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Notified on every change of `state` and on stop.
    changed: Condvar,
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, Conn>>,
    next_conn: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    server: Arc<rustls::ServerConfig>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Conn>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the state and wakes the watches.
    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self.state();
        let out = f(&mut s);
        self.changed.notify_all();
        out
    }

    fn get(&self, key: &Key) -> Option<Value> {
        self.state().objects.get(key).cloned()
    }

    fn all(&self, res: Res) -> Vec<Value> {
        self.state()
            .objects
            .iter()
            .filter(|(k, _)| k.0 == res)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let o = obj.as_object_mut().expect("an object");
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().unwrap()
}

fn meta_str(obj: &Value, field: &str) -> Option<String> {
    obj.get("metadata")?
        .get(field)?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn set_type(obj: &mut Value, res: Res) {
    let o = obj.as_object_mut().unwrap();
    o.entry("apiVersion").or_insert(res.api_version().into());
    o.entry("kind").or_insert(res.kind().into());
}

// ---------------------------------------------------------------------------------------------
// Connections

fn accept(shared: Arc<Shared>, listener: TcpListener) {
    for tcp in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(tcp) = tcp else { continue };
        let Ok(clone) = tcp.try_clone() else { continue };
        let id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
        shared.conns().insert(
            id,
            Conn {
                tcp: clone,
                streaming: false,
            },
        );
        let s = shared.clone();
        let t = std::thread::Builder::new()
            .name(format!("stand-in-conn-{id}"))
            .spawn(move || {
                serve(&s, tcp, id);
                s.conns().remove(&id);
            });
        match t {
            Ok(t) => {
                let mut threads = shared.threads.lock().unwrap_or_else(|e| e.into_inner());
                threads.retain(|t| !t.is_finished());
                threads.push(t);
            }
            Err(_) => {
                shared.conns().remove(&id);
            }
        }
    }
}

type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

/// What to answer.
enum Reply {
    Json(u16, Value),
    Watch(Watch),
}

fn serve(shared: &Shared, tcp: TcpStream, id: u64) {
    if shared.stop.load(Ordering::SeqCst) {
        return;
    }
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = tcp.set_write_timeout(Some(Duration::from_secs(10)));
    let _ = tcp.set_nodelay(true);
    let Ok(conn) = rustls::ServerConnection::new(shared.server.clone()) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // Reading drives the handshake; a client that rejects our certificate ends here.
    let Some((request, authorization)) = read_request(&mut tls) else {
        return;
    };
    let reply = {
        let mut s = shared.state();
        s.requests.push(request.clone());
        let reply = answer(&mut s, &request, authorization.as_deref());
        shared.changed.notify_all();
        reply
    };
    match reply {
        Reply::Json(code, body) => {
            let body = body.to_string();
            let head = format!(
                "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Cache-Control: no-cache, private\r\nConnection: close\r\n\r\n",
                reason(code),
                body.len()
            );
            let _ = tls
                .write_all(head.as_bytes())
                .and_then(|_| tls.write_all(body.as_bytes()));
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
        Reply::Watch(watch) => {
            if let Some(c) = shared.conns().get_mut(&id) {
                c.streaming = true;
            }
            stream(shared, &mut tls, watch);
        }
    }
}

/// Reads one request: the request, and its Authorization header.
fn read_request(tls: &mut Tls) -> Option<(Request, Option<String>)> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > 1 << 20 || !read_more(tls, &mut buf) {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let target = first.next()?.to_owned();
    let mut headers = HashMap::new();
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let mut rest = buf.split_off(head_end);
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        read_chunked(tls, rest)?
    } else {
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while rest.len() < len {
            if !read_more(tls, &mut rest) {
                return None;
            }
        }
        rest.truncate(len);
        rest
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), q.to_owned()),
        None => (target, String::new()),
    };
    let request = Request {
        method,
        path,
        query,
        content_type: headers.get("content-type").cloned(),
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    Some((request, headers.remove("authorization")))
}

fn read_more(tls: &mut Tls, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16384];
    match tls.read(&mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

fn read_chunked(tls: &mut Tls, mut raw: Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut pos = 0;
    loop {
        let line_end = loop {
            if let Some(p) = find(&raw[pos..], b"\r\n") {
                break pos + p;
            }
            if !read_more(tls, &mut raw) {
                return None;
            }
        };
        let line = String::from_utf8_lossy(&raw[pos..line_end]).into_owned();
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        pos = line_end + 2;
        if size == 0 {
            // Trailers, up to an empty line.
            while find(&raw[pos..], b"\r\n").is_none() && find(&raw[pos..], b"\r\n\r\n").is_none() {
                if !read_more(tls, &mut raw) {
                    break;
                }
            }
            return Some(body);
        }
        while raw.len() < pos + size + 2 {
            if !read_more(tls, &mut raw) {
                return None;
            }
        }
        body.extend_from_slice(&raw[pos..pos + size]);
        pos += size + 2;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Whether the client of a watch went away (or sent anything, which on a watch can only be
/// its close_notify).
fn peer_gone(tcp: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: a valid socket and a one-byte buffer.
    let n = unsafe {
        libc::recv(
            tcp.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n >= 0 {
        return true;
    }
    let e = std::io::Error::last_os_error();
    !matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
    )
}

// ---------------------------------------------------------------------------------------------
// Routing

struct Route {
    res: Res,
    /// The namespace in the path.
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn route(path: &str) -> Option<Route> {
    let segs: Vec<String> = path
        .trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .map(percent_decode)
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", "events.k8s.io", "v1", rest @ ..] => ("events.k8s.io", rest),
        _ => return None,
    };
    let find_res = |plural: &str| -> Option<Res> {
        match (group, plural) {
            ("", "pods") => Some(Res::Pods),
            ("", "nodes") => Some(Res::Nodes),
            ("", "events") => Some(Res::Events),
            ("events.k8s.io", "events") => Some(Res::EventsV1),
            _ => None,
        }
    };
    let (ns, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..] if !ns.is_empty() => {
            (Some(ns.to_string()), *plural, tail)
        }
        [plural, tail @ ..] => (None, *plural, tail),
        [] => return None,
    };
    let res = find_res(plural)?;
    if ns.is_some() != res.namespaced() && !(ns.is_none() && tail.is_empty()) {
        // A namespaced resource by name needs its namespace; a cluster-scoped one has none.
        return None;
    }
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub] => (Some(name.to_string()), Some(sub.to_string())),
        _ => return None,
    };
    match sub.as_deref() {
        None => {}
        Some("status") if res.has_status() => {}
        Some("eviction") if res == Res::Pods => {}
        Some(_) => return None,
    }
    if name.as_deref() == Some("") {
        return None;
    }
    Some(Route { res, ns, name, sub })
}

fn answer(s: &mut State, req: &Request, authorization: Option<&str>) -> Reply {
    if authorization != Some(format!("Bearer {TOKEN}").as_str()) {
        return error(401, "Unauthorized");
    }
    if let Some(code) = s.take_failure(&req.method, &req.path) {
        return Reply::Json(
            code,
            status_value(
                code,
                status_reason(code),
                &format!(
                    "stand-in: failure {code} as asked, for {} {}",
                    req.method, req.path
                ),
            ),
        );
    }
    let Some(route) = route(&req.path) else {
        return error(404, "the server could not find the requested resource");
    };
    let q: HashMap<String, String> = parse_query(&req.query).into_iter().rev().collect();
    let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
    let res = route.res;
    let key = |name: &str| (res, route.ns.clone().unwrap_or_default(), name.to_owned());
    match (
        req.method.as_str(),
        route.name.as_deref(),
        route.sub.as_deref(),
    ) {
        ("GET", None, None) if req.is_watch() => watch(s, &route, &q),
        ("GET", None, None) => list(s, &route, &q),
        ("POST", None, None) => create(s, &route, &req.body, dry_run),
        ("GET", Some(name), None | Some("status")) => match s.objects.get(&key(name)) {
            Some(obj) => Reply::Json(200, obj.clone()),
            None => not_found(res, name),
        },
        ("PATCH", Some(name), sub @ (None | Some("status"))) => patch(
            s,
            key(name),
            sub,
            req.content_type.as_deref(),
            &req.body,
            dry_run,
        ),
        ("PUT", Some(name), sub @ (None | Some("status"))) => {
            let Some(current) = s.objects.get(&key(name)).cloned() else {
                return not_found(res, name);
            };
            match serde_json::from_str::<Value>(&req.body) {
                Ok(new) if new.is_object() => update(s, key(name), sub, current, new, dry_run),
                _ => error(400, "the body of the request is not a JSON object"),
            }
        }
        ("DELETE", Some(name), None) => {
            let options = if req.body.trim().is_empty() {
                json!({})
            } else {
                match serde_json::from_str::<Value>(&req.body) {
                    Ok(v) => v,
                    Err(e) => return error(400, &format!("invalid DeleteOptions: {e}")),
                }
            };
            delete(s, key(name), &options, dry_run)
        }
        ("POST", Some(name), Some("eviction")) => {
            let eviction: Value = serde_json::from_str(&req.body).unwrap_or(json!({}));
            let options = eviction.get("deleteOptions").cloned().unwrap_or(json!({}));
            match delete(s, key(name), &options, dry_run) {
                Reply::Json(200, _) => Reply::Json(
                    201,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Success", "code": 201}),
                ),
                other => other,
            }
        }
        (method, _, _) => error(
            405,
            &format!("the server does not allow this method on the requested resource: {method}"),
        ),
    }
}

fn error(code: u16, message: &str) -> Reply {
    Reply::Json(code, status_value(code, status_reason(code), message))
}

/// A Status with `details`, as the API server names the object.
fn error_for(code: u16, reason: &str, res: Res, name: &str, message: String) -> Reply {
    let mut v = status_value(code, reason, &message);
    let mut details = json!({"name": name, "kind": res.plural()});
    if !res.group().is_empty() {
        details["group"] = res.group().into();
    }
    v["details"] = details;
    Reply::Json(code, v)
}

fn not_found(res: Res, name: &str) -> Reply {
    error_for(
        404,
        "NotFound",
        res,
        name,
        format!("{} \"{name}\" not found", res.qualified()),
    )
}

fn conflict(res: Res, name: &str, why: &str) -> Reply {
    error_for(
        409,
        "Conflict",
        res,
        name,
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            res.qualified()
        ),
    )
}

const MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

// ---------------------------------------------------------------------------------------------
// Reads

fn list(s: &State, route: &Route, q: &HashMap<String, String>) -> Reply {
    let sel = match Selectors::parse(route.res, q) {
        Ok(sel) => sel,
        Err(e) => return error(400, &e),
    };
    let items: Vec<Value> = s
        .objects
        .iter()
        .filter(|(k, _)| k.0 == route.res && route.ns.as_ref().is_none_or(|ns| *ns == k.1))
        .filter(|(_, v)| sel.matches(v))
        .map(|(_, v)| v.clone())
        .collect();
    Reply::Json(
        200,
        json!({
            "kind": format!("{}List", route.res.kind()),
            "apiVersion": route.res.api_version(),
            "metadata": {"resourceVersion": s.rv.to_string()},
            "items": items,
        }),
    )
}

/// A watch to stream.
struct Watch {
    res: Res,
    ns: Option<String>,
    sel: Selectors,
    /// Changes after this version are sent.
    cursor: u64,
    /// Lines to send first.
    first: Vec<Value>,
    /// Nothing to send after `first`.
    done: bool,
    deadline: Option<Instant>,
}

fn watch(s: &State, route: &Route, q: &HashMap<String, String>) -> Reply {
    let sel = match Selectors::parse(route.res, q) {
        Ok(sel) => sel,
        Err(e) => return error(400, &e),
    };
    let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let from = match rv {
        "" | "0" => None,
        v => match v.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => return error(400, &format!("invalid resource version: {v}")),
        },
    };
    let deadline = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(|t| Instant::now() + Duration::from_secs(t));
    let mut w = Watch {
        res: route.res,
        ns: route.ns.clone(),
        sel,
        cursor: s.rv,
        first: Vec::new(),
        done: false,
        deadline,
    };
    if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
        // A streaming list: the state now, then a bookmark marking its end.
        for (k, obj) in &s.objects {
            if w.wants(k) && w.sel.matches(obj) {
                w.first.push(json!({"type": "ADDED", "object": obj}));
            }
        }
        w.first.push(json!({"type": "BOOKMARK", "object": {
            "kind": route.res.kind(), "apiVersion": route.res.api_version(),
            "metadata": {"resourceVersion": s.rv.to_string(),
                         "annotations": {"k8s.io/initial-events-end": "true"}}}}));
    } else if let Some(from) = from {
        if from < s.floor {
            let message = format!("too old resource version: {from} ({})", s.floor);
            w.first
                .push(json!({"type": "ERROR", "object": status_value(410, "Expired", &message)}));
            w.done = true;
        } else {
            w.cursor = from;
        }
    }
    Reply::Watch(w)
}

impl Watch {
    fn wants(&self, key: &Key) -> bool {
        key.0 == self.res && self.ns.as_ref().is_none_or(|ns| *ns == key.1)
    }

    /// The event this change is to this watch, if any.
    fn event(&self, c: &Change) -> Option<Value> {
        if !self.wants(&c.key) {
            return None;
        }
        let now = self.sel.matches(&c.object);
        let kind = match c.kind {
            ChangeKind::Added => now.then_some("ADDED")?,
            ChangeKind::Deleted => now.then_some("DELETED")?,
            ChangeKind::Modified => {
                let before = c.prev.as_ref().is_some_and(|p| self.sel.matches(p));
                match (before, now) {
                    (true, true) => "MODIFIED",
                    (false, true) => "ADDED",
                    (true, false) => "DELETED",
                    (false, false) => return None,
                }
            }
        };
        Some(json!({"type": kind, "object": c.object}))
    }
}

fn stream(shared: &Shared, tls: &mut Tls, mut w: Watch) {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\nCache-Control: no-cache, private\r\n\
                Connection: close\r\n\r\n";
    if tls.write_all(head.as_bytes()).is_err() {
        return;
    }
    let first = std::mem::take(&mut w.first);
    if send(tls, &first).is_err() {
        return;
    }
    while !w.done {
        let batch = {
            let mut s = shared.state();
            loop {
                if shared.stop.load(Ordering::SeqCst) || peer_gone(&tls.sock) {
                    break None;
                }
                let start = s.history.partition_point(|c| c.rv <= w.cursor);
                if start < s.history.len() {
                    let batch: Vec<Value> = s.history[start..]
                        .iter()
                        .filter_map(|c| w.event(c))
                        .collect();
                    w.cursor = s.history.last().unwrap().rv;
                    if !batch.is_empty() {
                        break Some(batch);
                    }
                }
                let mut wait = Duration::from_millis(100);
                if let Some(d) = w.deadline {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break None;
                    }
                    wait = wait.min(left);
                }
                s = shared
                    .changed
                    .wait_timeout(s, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        match batch {
            Some(batch) => {
                if send(tls, &batch).is_err() {
                    return;
                }
            }
            None => break,
        }
    }
    let _ = tls.write_all(b"0\r\n\r\n");
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// Sends each event as a chunk of one JSON line.
fn send(tls: &mut Tls, events: &[Value]) -> std::io::Result<()> {
    for e in events {
        let line = format!("{e}\n");
        tls.write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes())?;
    }
    tls.flush()
}

// ---------------------------------------------------------------------------------------------
// Writes

fn create(s: &mut State, route: &Route, body: &str, dry_run: bool) -> Reply {
    let res = route.res;
    let mut obj: Value = match serde_json::from_str(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return error(400, "the body of the request is not a JSON object"),
    };
    if let Some(kind) = obj.get("kind").and_then(Value::as_str) {
        if kind != res.kind() {
            return error(
                400,
                &format!("the kind in the body ({kind}) is not {}", res.kind()),
            );
        }
    }
    set_type(&mut obj, res);
    let name = match (meta_str(&obj, "name"), meta_str(&obj, "generateName")) {
        (Some(n), _) => n,
        (None, Some(prefix)) => {
            s.uids += 1;
            let name = format!("{prefix}{}", suffix(s.uids));
            meta_mut(&mut obj).insert("name".into(), name.clone().into());
            name
        }
        (None, None) => {
            return error(422, &format!("{} \"\" is invalid: metadata.name: Required value: name or generateName is required", res.kind()))
        }
    };
    if res.namespaced() && route.ns.is_none() {
        return error(
            405,
            "the server does not allow this method on the requested resource: POST",
        );
    }
    let ns = route.ns.clone().unwrap_or_default();
    if res.namespaced() {
        match meta_str(&obj, "namespace") {
            Some(n) if n != ns => {
                return error(400, "the namespace of the provided object does not match the namespace sent on the request")
            }
            _ => {
                meta_mut(&mut obj).insert("namespace".into(), ns.clone().into());
            }
        }
    }
    let key = (res, ns, name.clone());
    if s.objects.contains_key(&key) {
        return error_for(
            409,
            "AlreadyExists",
            res,
            &name,
            format!("{} \"{name}\" already exists", res.qualified()),
        );
    }
    meta_mut(&mut obj).remove("uid");
    meta_mut(&mut obj).remove("resourceVersion");
    s.init_meta(&mut obj);
    if dry_run {
        return Reply::Json(201, obj);
    }
    if matches!(res, Res::Events | Res::EventsV1) {
        s.event_order.push(key.clone());
    }
    Reply::Json(201, s.store(key, obj))
}

/// Five characters from `n`, as the API server's random name suffixes look.
fn suffix(n: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 7;
    (0..5)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
            x /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn patch(
    s: &mut State,
    key: Key,
    sub: Option<&str>,
    content_type: Option<&str>,
    body: &str,
    dry_run: bool,
) -> Reply {
    let (res, name) = (key.0, key.2.clone());
    let media = content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let patch: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => return error(400, &format!("error decoding patch: {e}")),
    };
    let Some(current) = s.objects.get(&key).cloned() else {
        return not_found(res, &name);
    };
    let mut new = current.clone();
    match media.as_str() {
        // A strategic merge patch merges lists by key where a merge patch replaces them; and
        // server-side apply is a merge here, without field ownership.
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/apply-patch+yaml" => {
            if !patch.is_object() {
                return error(400, "a merge patch must be a JSON object");
            }
            merge_patch(&mut new, &patch);
        }
        "application/json-patch+json" => match json_patch(&mut new, &patch) {
            Ok(()) => {}
            Err(PatchError::Bad(e)) => return error(400, &e),
            Err(PatchError::Failed(e)) => return error(422, &e),
        },
        other => {
            return error(
                415,
                &format!(
                    "the body of the request was in an unknown format ({other}) - accepted media types include: \
                     application/json-patch+json, application/merge-patch+json, \
                     application/apply-patch+yaml, application/strategic-merge-patch+json"
                ),
            )
        }
    }
    if !new.is_object() {
        return error(422, "the patched object is not an object");
    }
    update(s, key, sub, current, new, dry_run)
}

/// Stores `new` in place of `current` (a patch's result, or a PUT's body), as the API server
/// updates an object or its status.
fn update(
    s: &mut State,
    key: Key,
    sub: Option<&str>,
    current: Value,
    mut new: Value,
    dry_run: bool,
) -> Reply {
    let (res, name) = (key.0, key.2.clone());
    match meta_str(&new, "name") {
        Some(n) if n != name => {
            return error(
                400,
                &format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                ),
            )
        }
        _ => {}
    }
    if res.namespaced() {
        match meta_str(&new, "namespace") {
            Some(n) if n != key.1 => {
                return error(400, "the namespace of the provided object does not match the namespace sent on the request")
            }
            _ => {}
        }
    }
    let cur_uid = meta_str(&current, "uid").unwrap_or_default();
    if let Some(uid) = meta_str(&new, "uid") {
        if uid != cur_uid {
            return conflict(
                res,
                &name,
                &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_uid}"),
            );
        }
    }
    let cur_rv = meta_str(&current, "resourceVersion").unwrap_or_default();
    if let Some(rv) = meta_str(&new, "resourceVersion") {
        if rv != cur_rv {
            return conflict(res, &name, MODIFIED);
        }
    }
    // What the server owns.
    let m = meta_mut(&mut new);
    m.insert("name".into(), name.clone().into());
    if res.namespaced() {
        m.insert("namespace".into(), key.1.clone().into());
    }
    for field in ["uid", "resourceVersion", "creationTimestamp"] {
        match current["metadata"].get(field) {
            Some(v) => m.insert(field.into(), v.clone()),
            None => m.remove(field),
        };
    }
    set_type(&mut new, res);
    if res.has_status() {
        // The object's endpoint leaves the status alone, the status endpoint the spec.
        let keep = if sub == Some("status") {
            "spec"
        } else {
            "status"
        };
        let o = new.as_object_mut().unwrap();
        match current.get(keep) {
            Some(v) => o.insert(keep.into(), v.clone()),
            None => o.remove(keep),
        };
    }
    if new == current || dry_run {
        // No change makes no new version and no event.
        return Reply::Json(200, new);
    }
    Reply::Json(200, s.store(key, new))
}

fn delete(s: &mut State, key: Key, options: &Value, dry_run: bool) -> Reply {
    let (res, name) = (key.0, key.2.clone());
    let Some(current) = s.objects.get(&key) else {
        return not_found(res, &name);
    };
    let pre = &options["preconditions"];
    if let Some(uid) = pre.get("uid").and_then(Value::as_str) {
        let cur = meta_str(current, "uid").unwrap_or_default();
        if uid != cur {
            return conflict(
                res,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {cur}"
                ),
            );
        }
    }
    if let Some(rv) = pre.get("resourceVersion").and_then(Value::as_str) {
        let cur = meta_str(current, "resourceVersion").unwrap_or_default();
        if rv != cur {
            return conflict(
                res,
                &name,
                &format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the \
                     ResourceVersion in record ({cur}). The object might have been modified"
                ),
            );
        }
    }
    let dry_run = dry_run
        || options["dryRun"]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == "All"));
    if dry_run {
        return Reply::Json(200, current.clone());
    }
    let removed = s.remove(&key).unwrap();
    Reply::Json(200, removed)
}

// ---------------------------------------------------------------------------------------------
// Patches

/// RFC 7386.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

enum PatchError {
    /// Not a patch: 400.
    Bad(String),
    /// An operation failed: 422.
    Failed(String),
}

/// RFC 6902: add, remove, replace, move, copy, test.
fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let ops = ops
        .as_array()
        .ok_or_else(|| PatchError::Bad("a JSON patch must be an array of operations".into()))?;
    for op in ops {
        let name = op["op"]
            .as_str()
            .ok_or_else(|| PatchError::Bad(format!("an operation without op: {op}")))?;
        let path = op["path"]
            .as_str()
            .ok_or_else(|| PatchError::Bad(format!("an operation without path: {op}")))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| PatchError::Bad(format!("an operation without value: {op}")))
        };
        let from = || {
            op["from"]
                .as_str()
                .ok_or_else(|| PatchError::Bad(format!("an operation without from: {op}")))
        };
        match name {
            "add" => pointer_add(doc, path, value()?)?,
            "remove" => {
                pointer_remove(doc, path)?;
            }
            "replace" => {
                pointer_remove(doc, path)?;
                pointer_add(doc, path, value()?)?;
            }
            "move" => {
                let v = pointer_remove(doc, from()?)?;
                pointer_add(doc, path, v)?;
            }
            "copy" => {
                let from = from()?;
                let v = doc.pointer(from).cloned().ok_or_else(|| missing(from))?;
                pointer_add(doc, path, v)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(PatchError::Failed(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => {
                return Err(PatchError::Bad(format!("Unexpected kind: {other}")));
            }
        }
    }
    Ok(())
}

fn missing(path: &str) -> PatchError {
    PatchError::Failed(format!("doc is missing path: \"{path}\": missing value"))
}

/// The parent's pointer and the last reference token, unescaped.
fn split_pointer(path: &str) -> Result<(&str, String), PatchError> {
    if !path.starts_with('/') {
        return Err(PatchError::Bad(format!("invalid JSON pointer: {path:?}")));
    }
    let i = path.rfind('/').unwrap();
    Ok((
        &path[..i],
        path[i + 1..].replace("~1", "/").replace("~0", "~"),
    ))
}

fn pointer_add(doc: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    match doc.pointer_mut(parent).ok_or_else(|| missing(path))? {
        Value::Object(o) => {
            o.insert(last, value);
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>().map_err(|_| missing(path))?
            };
            if i > a.len() {
                return Err(PatchError::Failed(format!(
                    "add operation does not apply: index {i} out of bounds in {path}"
                )));
            }
            a.insert(i, value);
        }
        _ => return Err(missing(path)),
    }
    Ok(())
}

fn pointer_remove(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let (parent, last) = split_pointer(path)?;
    match doc.pointer_mut(parent).ok_or_else(|| missing(path))? {
        Value::Object(o) => o.remove(&last).ok_or_else(|| missing(path)),
        Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing(path)),
        },
        _ => Err(missing(path)),
    }
}

// ---------------------------------------------------------------------------------------------
// Selectors

enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

struct FieldReq {
    path: String,
    value: String,
    negated: bool,
}

struct Selectors {
    fields: Vec<FieldReq>,
    labels: Vec<LabelReq>,
}

impl Selectors {
    fn parse(res: Res, q: &HashMap<String, String>) -> Result<Selectors, String> {
        let fields = match q.get("fieldSelector") {
            Some(f) => parse_fields(res, f)?,
            None => Vec::new(),
        };
        let labels = match q.get("labelSelector") {
            Some(l) => parse_labels(l)?,
            None => Vec::new(),
        };
        Ok(Selectors { fields, labels })
    }

    fn matches(&self, obj: &Value) -> bool {
        let fields = self
            .fields
            .iter()
            .all(|f| (field_value(obj, &f.path) == f.value) != f.negated);
        let labels = &obj["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        fields
            && self.labels.iter().all(|r| match r {
                LabelReq::Eq(k, v) => label(k) == Some(v),
                LabelReq::NotEq(k, v) => label(k) != Some(v),
                LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                LabelReq::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
                LabelReq::Exists(k) => label(k).is_some(),
                LabelReq::NotExists(k) => label(k).is_none(),
            })
    }
}

fn parse_fields(res: Res, selector: &str) -> Result<Vec<FieldReq>, String> {
    let mut out = Vec::new();
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (path, value, negated) = if let Some((p, v)) = term.split_once("!=") {
            (p, v, true)
        } else if let Some((p, v)) = term.split_once("==") {
            (p, v, false)
        } else if let Some((p, v)) = term.split_once('=') {
            (p, v, false)
        } else {
            return Err(format!(
                "invalid field selector {selector:?}: {term:?} is not field=value, field==value or field!=value"
            ));
        };
        let path = path.trim();
        if res
            .field_labels()
            .is_some_and(|allowed| !allowed.contains(&path))
        {
            return Err(format!("field label not supported: {path}"));
        }
        out.push(FieldReq {
            path: path.to_owned(),
            value: value.trim().to_owned(),
            negated,
        });
    }
    Ok(out)
}

/// A field as a selector sees it: a missing field is "" (false for the booleans).
fn field_value(obj: &Value, path: &str) -> String {
    let mut v = obj;
    for part in path.split('.') {
        match v.get(part) {
            Some(next) => v = next,
            None => {
                return match path {
                    "spec.hostNetwork" | "spec.unschedulable" => "false".into(),
                    _ => String::new(),
                }
            }
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn parse_labels(selector: &str) -> Result<Vec<LabelReq>, String> {
    let bad = |term: &str| {
        format!("unable to parse requirement: {term:?} in label selector {selector:?}")
    };
    // Split on the commas outside parentheses.
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    let key = |k: &str, term: &str| -> Result<String, String> {
        let k = k.trim();
        if k.is_empty() || k.contains(char::is_whitespace) {
            Err(bad(term))
        } else {
            Ok(k.to_owned())
        }
    };
    let mut out = Vec::new();
    for term in terms.into_iter().map(str::trim).filter(|t| !t.is_empty()) {
        let req = if let Some(k) = term.strip_prefix('!') {
            LabelReq::NotExists(key(k, term)?)
        } else if let Some(open) = term.find('(') {
            let close = term
                .rfind(')')
                .filter(|c| *c > open)
                .ok_or_else(|| bad(term))?;
            let values: Vec<String> = term[open + 1..close]
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect();
            let head = term[..open].trim();
            let (k, op) = head
                .rsplit_once(char::is_whitespace)
                .ok_or_else(|| bad(term))?;
            match op {
                "in" => LabelReq::In(key(k, term)?, values),
                "notin" => LabelReq::NotIn(key(k, term)?, values),
                _ => return Err(bad(term)),
            }
        } else if let Some((k, v)) = term.split_once("!=") {
            LabelReq::NotEq(key(k, term)?, v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once("==") {
            LabelReq::Eq(key(k, term)?, v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once('=') {
            LabelReq::Eq(key(k, term)?, v.trim().to_owned())
        } else {
            LabelReq::Exists(key(term, term)?)
        };
        out.push(req);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Queries

/// The pairs of a query string, decoded (`+` is a space).
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                percent_decode(&k.replace('+', " ")),
                percent_decode(&v.replace('+', " ")),
            )
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
