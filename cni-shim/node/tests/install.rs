//! `redirect-cni install` on temporary directories: chaining, conversion, selection, standalone,
//! idempotence, the watcher's repairs, exact uninstall, the kubeconfig, and full runs of the
//! binary (SIGTERM, no token in its output).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cni_node::install::binaries::{self, BinaryInstall};
use cni_node::install::conf_select::select_target;
use cni_node::install::kubeconfig::base64;
use cni_node::install::rate_limit::RewriteLimiter;
use cni_node::install::{ConfigStatus, Installer, StopHandle, WatchOptions};
use cni_node::plugin_entry::{plugin_entry, standalone_conf};
use cni_node::server_url;
use cni_node::settings::{parse, parse_mode};
use cni_node::{Error, Parsed, Settings};
use redirect_testkit::kernel_test;
use secrecy::ExposeSecret;
use serde_json::{json, Value};

const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2VuLWZvci10ZXN0cw.c2lnbmF0dXJl";
const TOKEN2: &str = "eyJhbGciOiJSUzI1NiJ9.cm90YXRlZC10b2tlbg.bmV3LXNpZ25hdHVyZQ";
const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBdummyCAforTests\n-----END CERTIFICATE-----\n";

const CALICO: &str = r#"{
    "name": "k8s-pod-network",
    "cniVersion": "0.3.1",
    "plugins": [
        {
            "type": "calico",
            "log_level": "info",
            "datastore_type": "kubernetes",
            "nodename": "node-1",
            "mtu": 1440,
            "ipam": { "type": "calico-ipam" },
            "policy": { "type": "k8s" },
            "kubernetes": { "kubeconfig": "/etc/cni/net.d/calico-kubeconfig" }
        },
        { "type": "bandwidth", "capabilities": { "bandwidth": true } },
        { "type": "portmap", "snat": true, "capabilities": { "portMappings": true } }
    ]
}
"#;

const BRIDGE: &str = r#"{
  "cniVersion": "0.4.0",
  "name": "mynet",
  "type": "bridge",
  "bridge": "cni0",
  "isGateway": true,
  "ipMasq": true,
  "ipam": { "type": "host-local", "subnet": "10.22.0.0/16", "routes": [ { "dst": "0.0.0.0/0" } ] }
}
"#;

/// A node in a temporary directory: net dir, two bin dirs, run dir, service account, binary.
struct Node {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Node {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        for d in ["net", "bin", "bin2", "run", "sa", "image"] {
            fs::create_dir(root.join(d)).unwrap();
        }
        fs::write(root.join("sa/token"), format!("{TOKEN}\n")).unwrap();
        fs::write(root.join("sa/ca.crt"), CA).unwrap();
        fs::write(root.join("image/redirect-cni"), b"\x7fELF fake plugin v1").unwrap();
        // Another plugin already in the bin dir, which must stay as it is.
        fs::write(root.join("bin/bridge"), b"bridge plugin").unwrap();
        fs::set_permissions(root.join("bin/bridge"), fs::Permissions::from_mode(0o755)).unwrap();
        Node { _tmp: tmp, root }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// The flags a DaemonSet would pass, pointing at this node.
    fn args(&self, extra: &[&str]) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--mounted-cni-net-dir".into(),
            self.p("net").into(),
            "--cni-bin-dir".into(),
            format!("{},{}", self.p("bin").display(), self.p("bin2").display()).into(),
            "--cni-agent-run-dir".into(),
            self.p("run").into(),
            "--service-account-dir".into(),
            self.p("sa").into(),
            "--binary".into(),
            self.p("image/redirect-cni").into(),
        ];
        a.extend(extra.iter().map(OsString::from));
        a
    }

    fn settings(&self, extra: &[&str]) -> Settings {
        self.settings_env(extra, &[])
    }

    fn settings_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Settings {
        let mut vars: Vec<(String, String)> = vec![
            ("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()),
            ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
            ("EXCLUDE_NAMESPACES".into(), "kube-system".into()),
            ("POD_NAMESPACE".into(), "redirect-system".into()),
        ];
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let lookup = move |k: &str| {
            vars.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        match parse(self.args(extra), &lookup).unwrap() {
            Parsed::Run(s) => *s,
            Parsed::Info(i) => panic!("unexpected info: {i}"),
        }
    }

    fn write(&self, rel: &str, text: &str, mode: u32) {
        let p = self.p(rel);
        fs::write(&p, text).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Every file under the node's host directories, with its bytes and mode.
    fn snapshot(&self) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
        let mut out = BTreeMap::new();
        for d in ["net", "bin", "bin2", "run"] {
            walk(&self.p(d), &mut out);
        }
        out
    }
}

fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (Vec<u8>, u32)>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            let mode = fs::metadata(&p).unwrap().mode() & 0o7777;
            out.insert(p.clone(), (fs::read(&p).unwrap(), mode));
        }
    }
}

/// The paths that differ between two snapshots (added, removed, other bytes or mode), for
/// messages: the snapshots themselves hold whole binaries, too big to print.
fn changed(
    before: &BTreeMap<PathBuf, (Vec<u8>, u32)>,
    after: &BTreeMap<PathBuf, (Vec<u8>, u32)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (p, v) in before {
        match after.get(p) {
            None => out.push(format!("removed {}", p.display())),
            Some(w) if w != v => out.push(format!("changed {}", p.display())),
            Some(_) => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        out.push(format!("added {}", p.display()));
    }
    out
}

fn json_of(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

fn ours(list: &Value) -> Vec<Value> {
    list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "redirect-cni")
        .cloned()
        .collect()
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn fast_watch() -> WatchOptions {
    WatchOptions {
        // Long resync: a repair seen within the tests' bounds came from inotify.
        resync: Duration::from_secs(3600),
        debounce: Duration::from_millis(20),
        retry: Duration::from_millis(200),
        ..WatchOptions::default()
    }
}

/// `run` in a thread, stopped (and so uninstalled) on drop of the returned guard's `stop`.
struct Running {
    stop: StopHandle,
    thread: Option<thread::JoinHandle<Result<(), Error>>>,
}

impl Running {
    fn start(settings: Settings, opts: WatchOptions) -> Self {
        Running::start_with(settings, opts, cni_node::install::Quiet)
    }

    fn start_with(
        settings: Settings,
        opts: WatchOptions,
        progress: impl cni_node::install::Progress + Send + 'static,
    ) -> Self {
        let stop = StopHandle::new().unwrap();
        let s2 = stop.clone();
        let thread = thread::spawn(move || cni_node::install::run(settings, &s2, &opts, &progress));
        Running {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> Result<(), Error> {
        self.stop.stop();
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------

#[test]
fn chains_into_an_existing_conflist_once_keeping_everything_else() {
    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o640);
    let s = node.settings(&[]);
    let mut inst = Installer::new(s.clone()).unwrap();
    let target = node.p("net/10-calico.conflist");
    assert_eq!(
        inst.install().unwrap(),
        ConfigStatus::Written(target.clone())
    );

    let before: Value = serde_json::from_str(CALICO).unwrap();
    let after = json_of(&target);
    let plugins = after["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 4, "{after:#}");
    assert_eq!(
        &plugins[..3],
        before["plugins"].as_array().unwrap().as_slice()
    );
    assert_eq!(plugins[3], plugin_entry(&s));
    assert_eq!(after["cniVersion"], "0.3.1");
    assert_eq!(after["name"], "k8s-pod-network");
    assert_eq!(after.as_object().unwrap().len(), 3);
    assert_eq!(mode_of(&target), 0o640, "mode preserved");
    // Key order of the other entries is kept (not re-sorted).
    let keys: Vec<&String> = plugins[0].as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "type",
            "log_level",
            "datastore_type",
            "nodename",
            "mtu",
            "ipam",
            "policy",
            "kubernetes"
        ]
    );
    let text = fs::read_to_string(&target).unwrap();
    assert!(text.find("\"name\"").unwrap() < text.find("\"cniVersion\"").unwrap());

    // Our entry as the plugin side reads it.
    let entry = &plugins[3];
    assert_eq!(entry["name"], "istio-cni", "Istio's entry's name");
    assert_eq!(entry["log_level"], "info");
    assert_eq!(entry["cni_agent_run_dir"], node.p("run").to_str().unwrap());
    assert_eq!(
        entry["kubeconfig"],
        node.p("run/redirect-cni-kubeconfig").to_str().unwrap()
    );
    assert_eq!(entry["exclude_namespaces"], json!(["kube-system"]));
    assert_eq!(entry["pod_namespace"], "redirect-system");
    assert_eq!(
        entry["capabilities"],
        json!({"io.kubernetes.cri.pod-annotations": true})
    );
    assert!(entry.get("cniVersion").is_none());

    // Binaries copied 0755 into both bin dirs.
    for d in ["bin", "bin2"] {
        let b = node.p(d).join("redirect-cni");
        assert_eq!(fs::read(&b).unwrap(), b"\x7fELF fake plugin v1");
        assert_eq!(mode_of(&b), 0o755);
    }
}

#[test]
fn an_old_entry_of_ours_is_replaced_not_duplicated() {
    let node = Node::new();
    let mut list: Value = serde_json::from_str(CALICO).unwrap();
    let old = json!({"type": "redirect-cni", "name": "redirect-cni", "log_level": "debug"});
    list["plugins"].as_array_mut().unwrap().insert(1, old);
    node.write("net/10-calico.conflist", &list.to_string(), 0o644);
    let s = node.settings(&["--plugin-log-level", "warn"]);
    let mut inst = Installer::new(s.clone()).unwrap();
    inst.install().unwrap();
    let after = json_of(&node.p("net/10-calico.conflist"));
    assert_eq!(ours(&after), vec![plugin_entry(&s)]);
    assert_eq!(after["plugins"].as_array().unwrap().len(), 4);
    assert_eq!(after["plugins"][3]["log_level"], "warn");
    assert_eq!(after["plugins"][1]["type"], "bandwidth");
}

#[test]
fn chaining_into_a_conf_turns_it_into_a_conflist() {
    let node = Node::new();
    node.write("net/10-bridge.conf", BRIDGE, 0o600);
    let s = node.settings(&[]);
    let mut inst = Installer::new(s.clone()).unwrap();
    let list_path = node.p("net/10-bridge.conflist");
    assert_eq!(
        inst.install().unwrap(),
        ConfigStatus::Written(list_path.clone())
    );
    assert!(!node.p("net/10-bridge.conf").exists(), "the .conf must go");
    let list = json_of(&list_path);
    let mut plugin: Value = serde_json::from_str(BRIDGE).unwrap();
    plugin.as_object_mut().unwrap().shift_remove("cniVersion");
    assert_eq!(
        list,
        json!({"cniVersion": "0.4.0", "name": "mynet", "plugins": [plugin, plugin_entry(&s)]})
    );
    assert_eq!(mode_of(&list_path), 0o600);
    // The runtime's choice is now the list, and a second pass changes nothing.
    assert_eq!(
        select_target(&node.p("net"), None).unwrap(),
        Some(list_path.clone())
    );
    assert_eq!(
        inst.reconcile_config().unwrap(),
        ConfigStatus::Unchanged(list_path)
    );
}

#[test]
fn the_target_is_the_file_the_runtime_uses() {
    let node = Node::new();
    node.write("net/00-broken.conflist", "{ not json", 0o644);
    node.write(
        "net/01-notype.conf",
        r#"{"cniVersion":"0.3.1","name":"x"}"#,
        0o644,
    );
    node.write(
        "net/02-empty.conflist",
        r#"{"cniVersion":"0.3.1","name":"e","plugins":[]}"#,
        0o644,
    );
    node.write("net/03-readme.txt", "not a config", 0o644);
    node.write("net/10-calico.conflist", CALICO, 0o644);
    node.write("net/20-bridge.conf", BRIDGE, 0o644);
    node.write("net/99-late.json", BRIDGE, 0o644);
    let net = node.p("net");
    assert_eq!(
        select_target(&net, None).unwrap(),
        Some(node.p("net/10-calico.conflist"))
    );
    // CNI_CONF_NAME wins, and its .conf/.conflist twin is accepted.
    assert_eq!(
        select_target(&net, Some("20-bridge.conf")).unwrap(),
        Some(node.p("net/20-bridge.conf"))
    );
    assert_eq!(
        select_target(&net, Some("20-bridge.conflist")).unwrap(),
        Some(node.p("net/20-bridge.conf"))
    );
    assert_eq!(
        select_target(&net, Some("30-missing.conflist")).unwrap(),
        None
    );
    fs::remove_file(node.p("net/10-calico.conflist")).unwrap();
    fs::remove_file(node.p("net/20-bridge.conf")).unwrap();
    assert_eq!(
        select_target(&net, None).unwrap(),
        Some(node.p("net/99-late.json"))
    );

    // Installing touches only the chosen file.
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let before = node.snapshot();
    let mut inst = Installer::new(node.settings(&[])).unwrap();
    inst.install().unwrap();
    let after = node.snapshot();
    let changed: Vec<_> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(v) && p.starts_with(&net))
        .map(|(p, _)| p.clone())
        .collect();
    assert_eq!(changed, vec![node.p("net/10-calico.conflist")]);

    // With CNI_CONF_NAME the named file is used instead.
    let node2 = Node::new();
    node2.write("net/10-calico.conflist", CALICO, 0o644);
    node2.write("net/20-bridge.conf", BRIDGE, 0o644);
    let s = node2.settings_env(&[], &[("CNI_CONF_NAME", "20-bridge.conf")]);
    let mut inst = Installer::new(s).unwrap();
    assert_eq!(
        inst.install().unwrap(),
        ConfigStatus::Written(node2.p("net/20-bridge.conflist"))
    );
    assert_eq!(
        fs::read_to_string(node2.p("net/10-calico.conflist")).unwrap(),
        CALICO
    );
}

/// A stop the agent judges an upgrade (its DaemonSet stays: `SAFE_UPGRADE`).
struct Upgrade;

impl cni_node::install::Progress for Upgrade {
    fn keep_installed(&self) -> Option<String> {
        Some("the DaemonSet stays".into())
    }
}

#[test]
fn a_stop_judged_an_upgrade_leaves_everything_for_the_next_agent() {
    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let s = node.settings(&[]);
    let target = node.p("net/10-calico.conflist");
    let installed = |s: &Settings| {
        serde_json::from_slice::<Value>(&fs::read(&target).unwrap())
            .map(|v| ours(&v) == vec![plugin_entry(s)])
            .unwrap_or(false)
    };
    let running = Running::start_with(s.clone(), fast_watch(), Upgrade);
    wait_until("our entry", Duration::from_secs(5), || installed(&s));
    running.stop().unwrap();
    assert!(installed(&s), "the entry was removed");
    assert!(node.p("run/redirect-cni-kubeconfig").exists());
    assert!(node.p("bin/redirect-cni").exists());

    // The next agent takes it over; a stop that is no upgrade undoes everything.
    let running = Running::start(s.clone(), fast_watch());
    wait_until("our entry", Duration::from_secs(5), || installed(&s));
    running.stop().unwrap();
    assert_eq!(fs::read_to_string(&target).unwrap(), CALICO);
    assert!(!node.p("run/redirect-cni-kubeconfig").exists());
}

#[test]
fn waits_for_a_config_that_appears_later() {
    let node = Node::new();
    let s = node.settings(&[]);
    let mut probe = Installer::new(s.clone()).unwrap();
    assert_eq!(probe.reconcile_config().unwrap(), ConfigStatus::Waiting);

    let running = Running::start(s.clone(), fast_watch());
    // Installed what can be installed, then waiting.
    wait_until("the kubeconfig", Duration::from_secs(5), || {
        node.p("run/redirect-cni-kubeconfig").exists()
    });
    thread::sleep(Duration::from_millis(300));
    assert_eq!(fs::read_dir(node.p("net")).unwrap().count(), 0);

    node.write("net/10-calico.conflist", CALICO, 0o644);
    let target = node.p("net/10-calico.conflist");
    wait_until(
        "our entry in the new config",
        Duration::from_secs(5),
        || {
            serde_json::from_slice::<Value>(&fs::read(&target).unwrap())
                .map(|v| ours(&v) == vec![plugin_entry(&s)])
                .unwrap_or(false)
        },
    );
    running.stop().unwrap();
    assert_eq!(fs::read_to_string(&target).unwrap(), CALICO);
}

#[test]
fn standalone_writes_our_own_conf_0600_or_0640() {
    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let s = node.settings(&["--chained=false"]);
    assert!(!s.chained);
    let mut inst = Installer::new(s.clone()).unwrap();
    let path = node.p("net/redirect-cni.conf");
    assert_eq!(inst.install().unwrap(), ConfigStatus::Written(path.clone()));
    let conf = json_of(&path);
    assert_eq!(conf, standalone_conf(&s));
    assert_eq!(conf["cniVersion"], "1.0.0");
    assert_eq!(conf["type"], "redirect-cni");
    // The network Istio's injector asks Multus for, without CNI_NETWORK_NAME.
    assert_eq!(conf["name"], "istio-cni");
    assert_eq!(mode_of(&path), 0o600);
    assert_eq!(
        fs::read_to_string(node.p("net/10-calico.conflist")).unwrap(),
        CALICO
    );

    // Env names as Istio's: CHAINED_CNI_PLUGIN, CNI_CONF_NAME, CNI_CONF_GROUP_READ.
    let node = Node::new();
    let s = node.settings_env(
        &[],
        &[
            ("CHAINED_CNI_PLUGIN", "false"),
            ("CNI_CONF_NAME", "05-redirect.conf"),
            ("CNI_CONF_GROUP_READ", "true"),
        ],
    );
    let mut inst = Installer::new(s).unwrap();
    inst.install().unwrap();
    assert_eq!(mode_of(&node.p("net/05-redirect.conf")), 0o640);
}

#[test]
fn reinstalling_changes_nothing() {
    for standalone in [false, true] {
        let node = Node::new();
        node.write("net/10-calico.conflist", CALICO, 0o644);
        let extra: &[&str] = if standalone {
            &["--chained=false"]
        } else {
            &[]
        };
        let mut inst = Installer::new(node.settings(extra)).unwrap();
        let path = match inst.install().unwrap() {
            ConfigStatus::Written(p) => p,
            other => panic!("{other:?}"),
        };
        let stat = |p: &Path| {
            let m = fs::metadata(p).unwrap();
            (m.ino(), m.mtime(), m.mtime_nsec())
        };
        let files = [
            path.clone(),
            node.p("run/redirect-cni-kubeconfig"),
            node.p("bin/redirect-cni"),
            node.p("bin2/redirect-cni"),
        ];
        let before: Vec<_> = files.iter().map(|p| stat(p)).collect();
        let bytes = fs::read(&path).unwrap();
        thread::sleep(Duration::from_millis(20));
        // The same process again, and a restarted one.
        assert_eq!(
            inst.install().unwrap(),
            ConfigStatus::Unchanged(path.clone())
        );
        let mut again = Installer::new(node.settings(extra)).unwrap();
        assert_eq!(
            again.install().unwrap(),
            ConfigStatus::Unchanged(path.clone())
        );
        let after: Vec<_> = files.iter().map(|p| stat(p)).collect();
        assert_eq!(
            before, after,
            "standalone={standalone}: a file was rewritten"
        );
        assert_eq!(fs::read(&path).unwrap(), bytes);
        if !standalone {
            assert_eq!(ours(&json_of(&path)).len(), 1);
        }
    }
}

#[test]
fn the_watcher_puts_our_entry_back_when_another_cni_drops_it() {
    let node = Node::new();
    let target = node.p("net/10-calico.conflist");
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let s = node.settings(&[]);
    let entry = plugin_entry(&s);
    let has_ours = |p: &Path| {
        fs::read(p)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| ours(&v) == vec![entry.clone()])
    };
    let running = Running::start(s.clone(), fast_watch());
    wait_until("the first install", Duration::from_secs(5), || {
        has_ours(&target)
    });

    // Another CNI rewrites its config in place, without our entry.
    let theirs = CALICO.replace("\"mtu\": 1440", "\"mtu\": 1400");
    fs::write(&target, &theirs).unwrap();
    wait_until(
        "the repair of an in-place rewrite",
        Duration::from_secs(5),
        || has_ours(&target),
    );
    assert_eq!(
        json_of(&target)["plugins"][0]["mtu"],
        1400,
        "their change is kept"
    );

    // And atomically (temp file + rename), as most installers do.
    let theirs2 = CALICO.replace("\"mtu\": 1440", "\"mtu\": 1380");
    fs::write(node.p("net/.calico.tmp"), &theirs2).unwrap();
    fs::rename(node.p("net/.calico.tmp"), &target).unwrap();
    wait_until(
        "the repair of an atomic rewrite",
        Duration::from_secs(5),
        || has_ours(&target),
    );

    // On stop, their latest version comes back byte for byte.
    running.stop().unwrap();
    assert_eq!(fs::read_to_string(&target).unwrap(), theirs2);
}

#[test]
fn the_watcher_puts_back_a_deleted_or_changed_standalone_conf() {
    let node = Node::new();
    let s = node.settings(&["--chained=false"]);
    let path = node.p("net/redirect-cni.conf");
    let want = serde_json::to_vec_pretty(&standalone_conf(&s)).unwrap();
    let is_right = |p: &Path| {
        fs::read(p).is_ok_and(|b| b.strip_suffix(b"\n") == Some(&want[..])) && mode_of(p) == 0o600
    };
    let running = Running::start(s, fast_watch());
    wait_until("the standalone conf", Duration::from_secs(5), || {
        is_right(&path)
    });
    fs::remove_file(&path).unwrap();
    wait_until("the conf after a delete", Duration::from_secs(5), || {
        is_right(&path)
    });
    fs::write(
        &path,
        r#"{"cniVersion":"1.0.0","type":"redirect-cni","name":"x"}"#,
    )
    .unwrap();
    wait_until("the conf after a change", Duration::from_secs(5), || {
        is_right(&path)
    });
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    wait_until("the mode after a chmod", Duration::from_secs(5), || {
        is_right(&path)
    });
    running.stop().unwrap();
    assert!(!path.exists());
}

#[test]
fn a_rewrite_loop_is_rate_limited() {
    let node = Node::new();
    let target = node.p("net/10-calico.conflist");
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let s = node.settings(&[]);
    let opts = WatchOptions {
        max_rewrites: 3,
        rewrite_window: Duration::from_secs(60),
        ..fast_watch()
    };
    let has_entry =
        |p: &Path| fs::read(p).is_ok_and(|b| String::from_utf8_lossy(&b).contains("redirect-cni"));
    // The first install is not a repair and is not counted.
    let running = Running::start(s, opts);
    wait_until("the first install", Duration::from_secs(5), || {
        has_entry(&target)
    });
    // Another installer drops our entry (atomically, so that each drop is one change).
    let drop_entry = || {
        fs::write(node.p("net/.calico.tmp"), CALICO).unwrap();
        fs::rename(node.p("net/.calico.tmp"), &target).unwrap();
    };
    for i in 0..3 {
        drop_entry();
        wait_until(&format!("repair {i}"), Duration::from_secs(5), || {
            has_entry(&target)
        });
    }
    // The limit is reached: the next drop is not repaired within the window.
    drop_entry();
    thread::sleep(Duration::from_millis(800));
    assert!(
        !has_entry(&target),
        "a 4th rewrite within a minute was not held off"
    );
    drop(running);

    let mut l = RewriteLimiter::new(2, Duration::from_secs(10));
    let t0 = Instant::now();
    assert_eq!(l.wait_needed(t0), None);
    l.record(t0);
    l.record(t0 + Duration::from_secs(1));
    assert_eq!(
        l.wait_needed(t0 + Duration::from_secs(2)),
        Some(Duration::from_secs(8))
    );
    assert_eq!(l.wait_needed(t0 + Duration::from_secs(10)), None);
}

fn assert_uninstall_restores(setup: impl Fn(&Node), extra: &[&str]) {
    let node = Node::new();
    setup(&node);
    let before = node.snapshot();
    let mut inst = Installer::new(node.settings(extra)).unwrap();
    assert!(matches!(inst.install().unwrap(), ConfigStatus::Written(_)));
    assert_ne!(node.snapshot(), before, "install changed nothing");
    inst.uninstall().unwrap();
    assert_eq!(node.snapshot(), before);

    // Also from a restarted installer (the record is read back from the run dir).
    let mut inst = Installer::new(node.settings(extra)).unwrap();
    inst.install().unwrap();
    let mut restarted = Installer::new(node.settings(extra)).unwrap();
    restarted.install().unwrap();
    restarted.uninstall().unwrap();
    assert_eq!(node.snapshot(), before);
}

#[test]
fn uninstall_restores_a_conflist_exactly() {
    assert_uninstall_restores(
        |n| {
            n.write("net/10-calico.conflist", CALICO, 0o640);
            n.write("net/calico-kubeconfig", "calico's", 0o600);
        },
        &[],
    );
}

#[test]
fn uninstall_restores_a_converted_conf_exactly() {
    assert_uninstall_restores(
        |n| {
            n.write("net/10-bridge.conf", BRIDGE, 0o644);
            n.write(
                "net/99-loopback.conf",
                r#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#,
                0o644,
            );
        },
        &[],
    );
}

#[test]
fn uninstall_removes_the_standalone_conf() {
    assert_uninstall_restores(
        |n| {
            n.write(
                "net/00-multus.conf",
                r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus"}"#,
                0o600,
            )
        },
        &["--chained=false"],
    );
}

/// A conflist that is a symbolic link to the primary CNI's own file: install never writes
/// through the link (that file stays as it is), and uninstall puts the link back, so the node's
/// config follows that file again; also after a restart, and after an edit elsewhere in ours.
#[test]
fn uninstall_restores_a_symlinked_conflist_as_the_link() {
    let node = Node::new();
    fs::create_dir(node.p("calico")).unwrap();
    node.write("calico/10-calico.conflist", CALICO, 0o644);
    let target = node.p("calico/10-calico.conflist");
    let link = node.p("net/10-calico.conflist");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let is_link = |p: &Path| fs::symlink_metadata(p).unwrap().file_type().is_symlink();
    for restart in [false, true] {
        let mut inst = Installer::new(node.settings(&[])).unwrap();
        assert!(matches!(inst.install().unwrap(), ConfigStatus::Written(_)));
        assert_eq!(
            fs::read_to_string(&target).unwrap(),
            CALICO,
            "written through the link"
        );
        assert!(!is_link(&link), "our chained config is a file of its own");
        assert_eq!(ours(&json_of(&link)).len(), 1);
        if restart {
            inst = Installer::new(node.settings(&[])).unwrap();
            inst.install().unwrap();
        }
        inst.uninstall().unwrap();
        assert!(is_link(&link), "restart {restart}: not a link again");
        assert_eq!(fs::read_link(&link).unwrap(), target);
        assert_eq!(fs::read_to_string(&target).unwrap(), CALICO);
    }
    // Our file edited meanwhile (our entry kept, the rest as the link's file): the link still
    // comes back, since without our entry it is that file.
    let mut inst = Installer::new(node.settings(&[])).unwrap();
    inst.install().unwrap();
    let edited = json_of(&link).to_string();
    fs::write(&link, edited).unwrap();
    inst.uninstall().unwrap();
    assert!(is_link(&link), "after an edit: not a link again");
    assert_eq!(fs::read_to_string(&target).unwrap(), CALICO);
}

#[test]
fn uninstall_after_another_cni_changed_the_file_removes_only_our_entry() {
    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let s = node.settings(&[]);
    let mut inst = Installer::new(s.clone()).unwrap();
    inst.install().unwrap();
    // Someone edits the list and keeps our entry: uninstall must keep their edit.
    let mut v = json_of(&node.p("net/10-calico.conflist"));
    v["plugins"][0]["mtu"] = json!(9000);
    fs::write(node.p("net/10-calico.conflist"), v.to_string()).unwrap();
    inst.uninstall().unwrap();
    let after = json_of(&node.p("net/10-calico.conflist"));
    assert!(ours(&after).is_empty());
    assert_eq!(after["plugins"].as_array().unwrap().len(), 3);
    assert_eq!(after["plugins"][0]["mtu"], 9000);
    assert!(!node.p("run/redirect-cni-install-state.json").exists());
}

#[test]
fn kubeconfig_is_0600_with_token_and_ca_and_follows_the_token() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    assert_eq!(
        server_url("https", "fd00::1", "443"),
        "https://[fd00::1]:443"
    );

    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let kc = node.p("run/redirect-cni-kubeconfig");
    let running = Running::start(node.settings(&[]), fast_watch());
    wait_until("the kubeconfig", Duration::from_secs(5), || kc.exists());
    let text = fs::read_to_string(&kc).unwrap();
    assert_eq!(mode_of(&kc), 0o600);
    assert!(text.contains(&format!("token: \"{TOKEN}\"")), "{text}");
    assert!(text.contains(&format!(
        "certificate-authority-data: \"{}\"",
        base64(CA.as_bytes())
    )));
    assert!(text.contains("server: \"https://10.96.0.1:443\""));
    assert!(text.contains("current-context: redirect-cni-context"));
    assert!(!text.contains("insecure-skip-tls-verify"));
    // The plugin's Kubernetes client (kube-rs) reads it as meant.
    let parsed = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some("https://10.96.0.1:443"));
    assert_eq!(
        cluster.certificate_authority_data.as_deref(),
        Some(base64(CA.as_bytes()).as_str())
    );
    let user = parsed.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(user.token.as_ref().unwrap().expose_secret(), TOKEN);
    assert_eq!(
        parsed.current_context.as_deref(),
        Some("redirect-cni-context")
    );

    // The kubelet rotates the token (atomically, through a rename in the directory).
    fs::write(node.p("sa/.token.new"), TOKEN2).unwrap();
    fs::rename(node.p("sa/.token.new"), node.p("sa/token")).unwrap();
    wait_until("the rotated token", Duration::from_secs(5), || {
        fs::read_to_string(&kc).is_ok_and(|t| t.contains(TOKEN2) && !t.contains(TOKEN))
    });
    assert_eq!(mode_of(&kc), 0o600);
    running.stop().unwrap();
    assert!(!kc.exists(), "the kubeconfig is removed on stop");

    // KUBECONFIG_MODE and SKIP_TLS_VERIFY.
    let node = Node::new();
    let s = node.settings_env(
        &[],
        &[("KUBECONFIG_MODE", "0640"), ("SKIP_TLS_VERIFY", "true")],
    );
    let inst = Installer::new(s).unwrap();
    assert!(inst.ensure_kubeconfig().unwrap());
    let text = fs::read_to_string(kc_path(&node)).unwrap();
    assert_eq!(mode_of(&kc_path(&node)), 0o640);
    assert!(text.contains("insecure-skip-tls-verify: true"));
    assert!(!text.contains("certificate-authority-data"));
}

fn kc_path(node: &Node) -> PathBuf {
    node.p("run/redirect-cni-kubeconfig")
}

#[test]
fn binaries_are_copied_atomically_and_removed_only_while_ours() {
    let node = Node::new();
    let src = node.p("image/redirect-cni");
    let dir = node.p("bin");
    assert_eq!(
        binaries::install_binary(&src, &dir).unwrap(),
        BinaryInstall::Copied
    );
    let dst = dir.join("redirect-cni");
    let ino = fs::metadata(&dst).unwrap().ino();
    assert_eq!(mode_of(&dst), 0o755);
    assert_eq!(
        binaries::install_binary(&src, &dir).unwrap(),
        BinaryInstall::AlreadyPresent
    );
    assert_eq!(
        fs::metadata(&dst).unwrap().ino(),
        ino,
        "identical: not copied again"
    );
    // A different build is replaced by a new file (a running copy is never overwritten).
    fs::write(&src, b"\x7fELF fake plugin v2").unwrap();
    assert_eq!(
        binaries::install_binary(&src, &dir).unwrap(),
        BinaryInstall::Copied
    );
    assert_ne!(fs::metadata(&dst).unwrap().ino(), ino);
    assert_eq!(fs::read(&dst).unwrap(), b"\x7fELF fake plugin v2");
    // Not ours any more (another build): left alone.
    fs::write(&src, b"\x7fELF fake plugin v3").unwrap();
    assert!(!binaries::remove_binary(&src, &dir).unwrap());
    assert!(dst.exists());
    fs::write(&src, b"\x7fELF fake plugin v2").unwrap();
    assert!(binaries::remove_binary(&src, &dir).unwrap());
    assert!(!dst.exists());
    assert!(binaries::install_binary(&src, &node.p("missing")).is_err());
    // No temporary file left behind.
    let names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![OsString::from("bridge")]);
}

#[test]
fn flags_and_istio_env_names() {
    let node = Node::new();
    // A flag wins over its variable; an empty variable counts as unset.
    let s = node.settings_env(
        &["--pod-namespace", "from-flag"],
        &[
            ("POD_NAMESPACE", "from-env"),
            ("CNI_CONF_NAME", ""),
            ("EXCLUDE_NAMESPACES", "kube-system, istio-system,"),
            (
                "PLUGIN_CONFIG_JSON",
                r#"{"dns_capture": true, "capabilities": {"portMappings": true}}"#,
            ),
            ("CNI_BIN_DIR", "/ignored/because/the/flag/is/given"),
        ],
    );
    assert_eq!(s.pod_namespace, "from-flag");
    assert_eq!(s.cni_conf_name, None);
    assert_eq!(s.exclude_namespaces, vec!["kube-system", "istio-system"]);
    assert_eq!(s.cni_bin_dirs, vec![node.p("bin"), node.p("bin2")]);
    let entry = plugin_entry(&s);
    assert_eq!(entry["dns_capture"], true);
    assert_eq!(
        entry["capabilities"],
        json!({"io.kubernetes.cri.pod-annotations": true, "portMappings": true})
    );

    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let d = match parse(Vec::<OsString>::new(), &env(&[])).unwrap() {
        Parsed::Run(s) => *s,
        _ => unreachable!(),
    };
    assert_eq!(d, Settings::default());
    assert_eq!(d.mounted_cni_net_dir, PathBuf::from("/host/etc/cni/net.d"));
    assert_eq!(d.cni_bin_dirs, vec![PathBuf::from("/host/opt/cni/bin")]);
    assert_eq!(d.cni_agent_run_dir, PathBuf::from("/var/run/redirect-cni"));
    assert!(d.chained && d.cleanup_on_exit && !d.skip_tls_verify);
    assert_eq!(d.kubeconfig_mode, 0o600);

    let e = match parse(
        Vec::<OsString>::new(),
        &env(&[
            ("MOUNTED_CNI_NET_DIR", "/host/etc/cni/multus/net.d"),
            ("CNI_BIN_DIR", "/host/opt/cni/bin,/host/var/lib/cni/bin"),
            ("CHAINED_CNI_PLUGIN", "false"),
            ("CNI_AGENT_RUN_DIR", "/run/x"),
            ("KUBE_CA_FILE", "/ca.pem"),
        ]),
    )
    .unwrap()
    {
        Parsed::Run(s) => *s,
        _ => unreachable!(),
    };
    assert_eq!(
        e.mounted_cni_net_dir,
        PathBuf::from("/host/etc/cni/multus/net.d")
    );
    assert_eq!(e.cni_bin_dirs.len(), 2);
    assert!(!e.chained);
    assert_eq!(
        e.kubeconfig_path(),
        PathBuf::from("/run/x/redirect-cni-kubeconfig")
    );
    assert_eq!(e.ca_path(), Some(PathBuf::from("/ca.pem")));

    // The whole command line may be passed too.
    let full = parse(
        ["redirect-cni", "install", "--chained-cni-plugin=false"].map(OsString::from),
        &env(&[]),
    )
    .unwrap();
    assert!(matches!(full, Parsed::Run(s) if !s.chained));

    // Bad values are named.
    for (args, env_pairs, needle) in [
        (
            vec!["--kubeconfig-mode", "0999"],
            &[][..],
            "kubeconfig-mode",
        ),
        (vec![], &[("SKIP_TLS_VERIFY", "yes")][..], "SKIP_TLS_VERIFY"),
        (
            vec!["--plugin-config-json", "[1]"],
            &[][..],
            "plugin-config-json",
        ),
        (
            vec!["--plugin-config-json", r#"{"type":"other"}"#],
            &[][..],
            "plugin-config-json",
        ),
        (
            vec!["--cni-conf-name", "../x.conf"],
            &[][..],
            "cni-conf-name",
        ),
        (vec!["--no-such-flag"], &[][..], "--no-such-flag"),
        (
            vec![],
            &[("PLUGIN_LOG_LEVEL", "verbose")][..],
            "PLUGIN_LOG_LEVEL",
        ),
    ] {
        let pairs: Vec<(String, String)> = env_pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let err = parse(args.iter().map(OsString::from), &lookup).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
    assert_eq!(parse_mode("0600"), Some(0o600));
    assert_eq!(parse_mode("640"), Some(0o640));
    assert_eq!(parse_mode("0o644"), Some(0o644));
    assert_eq!(parse_mode("384"), None);

    match parse([OsString::from("--help")], &env(&[])).unwrap() {
        Parsed::Info(text) => {
            for name in [
                "CNI_CONF_NAME",
                "CHAINED_CNI_PLUGIN",
                "MOUNTED_CNI_NET_DIR",
                "CNI_BIN_DIR",
            ] {
                assert!(text.contains(name), "--help lacks {name}");
            }
        }
        Parsed::Run(_) => panic!("--help ran"),
    }
}

// --- the binary -------------------------------------------------------------------------------

use cni_testkit::{node_bin, plugin_bin};

#[test]
fn binary_installs_until_sigterm_then_restores_and_never_logs_the_token() {
    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o644);
    node.write("net/05-bridge.conf", BRIDGE, 0o644);
    let before = node.snapshot();
    // The real binary copies the plugin from beside it (no --binary).
    let mut args: Vec<OsString> = node.args(&[]);
    args.truncate(args.len() - 2); // no --binary
    args.extend(["--plugin-log-level", "debug"].map(OsString::from));
    let child = Command::new(node_bin())
        .args(&args)
        .env_clear()
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "6443")
        .env("EXCLUDE_NAMESPACES", "kube-system")
        .env("POD_NAMESPACE", "redirect-system")
        // Only the installer: the repair controller would call the API server, and
        // 10.96.0.1 is nobody's here (it would also need a node name); no endpoints either, so
        // that a busy port 15014 on this machine cannot fail the run.
        .env("REPAIR_ENABLED", "false")
        .env("MONITORING_PORT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let list = node.p("net/05-bridge.conflist");
    let installed = || {
        fs::read(&list)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| ours(&v).len() == 1)
    };
    let start = Instant::now();
    while !installed() && start.elapsed() < Duration::from_secs(20) {
        thread::sleep(Duration::from_millis(50));
    }
    let ok = installed();
    let kc = fs::read_to_string(node.p("run/redirect-cni-kubeconfig")).unwrap_or_default();
    let copied = fs::read(node.p("bin2/redirect-cni")).unwrap_or_default();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        ok,
        "not installed within 20s; status {:?}; stderr:\n{stderr}",
        out.status
    );
    assert!(kc.contains(TOKEN) && kc.contains("https://10.96.0.1:6443"));
    assert_eq!(
        copied,
        fs::read(plugin_bin()).unwrap(),
        "the node agent copies the plugin from beside it"
    );
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(!stderr.contains(TOKEN), "the token was logged:\n{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(TOKEN));
    assert!(stderr.lines().any(|l| l.starts_with("info\t")), "{stderr}");
    let diff = changed(&before, &node.snapshot());
    assert!(
        diff.is_empty(),
        "SIGTERM must leave the node as it was: {diff:?}"
    );
}

/// A config file a runtime skips (not JSON, or JSON that is no config) is named with the
/// reason, once per version of the file: not at every pass of the watcher, again when it
/// changes.
#[test]
fn binary_says_once_per_version_why_it_skips_a_config_file() {
    let node = Node::new();
    let broken = node.p("net/05-broken.conflist");
    fs::write(&broken, "{\"name\": \"k8s-pod-network\", \"plugins\": [").unwrap();
    let mut args: Vec<OsString> = node.args(&[]);
    args.truncate(args.len() - 2); // no --binary
    let mut child = Command::new(node_bin())
        .args(&args)
        .env_clear()
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "6443")
        .env("REPAIR_ENABLED", "false")
        .env("MONITORING_PORT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Lines as they come, so each step waits for what the installer says, not for a time.
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let (stderr, lines) = (child.stderr.take().unwrap(), lines.clone());
        thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        })
    };
    let skipped = |n: usize| {
        let lines = lines.clone();
        move || {
            lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains("05-broken.conflist") && l.contains("skipped"))
                .count()
                >= n
        }
    };
    wait_until("the first skip line", Duration::from_secs(30), skipped(1));
    let pause = || thread::sleep(Duration::from_millis(600));
    // Passes of the watcher with the same broken bytes: an unrelated file, then the same
    // bytes written again.
    fs::write(node.p("net/README"), "notes").unwrap();
    pause();
    fs::write(&broken, "{\"name\": \"k8s-pod-network\", \"plugins\": [").unwrap();
    pause();
    // A new version, broken another way.
    fs::write(&broken, r#"{"name": "k8s-pod-network", "plugins": []}"#).unwrap();
    wait_until("the second skip line", Duration::from_secs(30), skipped(2));
    pause();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = child.wait();
    reader.join().unwrap();
    let stderr = lines.lock().unwrap().join("\n");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("05-broken.conflist") && l.contains("skipped"))
        .collect();
    assert_eq!(said.len(), 2, "one line per version:\n{stderr}");
    assert!(
        said[0].starts_with("warn\t") && said[0].contains("not JSON"),
        "{}",
        said[0]
    );
    assert!(said[1].contains("no plugins"), "{}", said[1]);
}

/// Runs the installer binary on `node` (its DaemonSet flags, no `--binary`) with `env` only,
/// expecting it to stop by itself within 20 s: (exit code, stderr).
fn binary_exits(node: &Node, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut args = node.args(&[]);
    args.truncate(args.len() - 2); // no --binary
    let mut child = Command::new(node_bin())
        .args(&args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after 20s (env {env:?}); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The node agent's settings are checked before anything is installed: the repair controller
/// (on by default) without this node's name, or a bad REPAIR_* value, is exit 2 with a message
/// naming the variable, and the node's directories stay as they were.
#[test]
fn binary_refuses_repair_without_a_node_name_or_with_bad_values_and_installs_nothing() {
    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let before = node.snapshot();
    let base = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "6443"),
        ("POD_NAMESPACE", "redirect-system"),
        // The port is not what is tested: a busy 15014 here must not decide the outcome.
        ("MONITORING_PORT", "0"),
    ];
    // (what, variables beside `base`, the variable the error must name)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 5] = [
        (
            "no node name (REPAIR_ENABLED unset: on)",
            &[],
            "REPAIR_NODE_NAME",
        ),
        (
            "no node name, REPAIR_ENABLED=true",
            &[("REPAIR_ENABLED", "true"), ("NODE_NAME", "")],
            "REPAIR_NODE_NAME",
        ),
        (
            "exit code not a number",
            &[
                ("NODE_NAME", "node-a"),
                ("REPAIR_INIT_CONTAINER_EXIT_CODE", "abc"),
            ],
            "REPAIR_INIT_CONTAINER_EXIT_CODE",
        ),
        (
            "zero attempts",
            &[("NODE_NAME", "node-a"), ("REPAIR_MAX_ATTEMPTS", "0")],
            "REPAIR_MAX_ATTEMPTS",
        ),
        (
            "repair switch not a boolean",
            &[("NODE_NAME", "node-a"), ("REPAIR_ENABLED", "yes")],
            "REPAIR_ENABLED",
        ),
    ];
    for (what, extra, names) in cases {
        let env: Vec<(&str, &str)> = base.iter().chain(extra.iter()).copied().collect();
        let (code, stderr) = binary_exits(&node, &env);
        assert_eq!(code, Some(2), "{what}: stderr:\n{stderr}");
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with("error\t") && l.contains(names)),
            "{what}: no error line naming {names}:\n{stderr}"
        );
        assert!(!stderr.contains(TOKEN), "{what}: the token was logged");
        let diff = changed(&before, &node.snapshot());
        assert!(diff.is_empty(), "{what}: the node was changed: {diff:?}");
    }
}

#[test]
fn the_node_name_comes_from_node_name_or_repair_node_name() {
    let node = Node::new();
    let s = node.settings_env(&[], &[("NODE_NAME", "node-a")]);
    assert_eq!(s.node_name, "node-a");
    assert_eq!(s.repair.node_name, "node-a", "the controller's default");
    assert!(s.check_agent().is_ok());
    let s = node.settings_env(
        &[],
        &[("NODE_NAME", "node-a"), ("REPAIR_NODE_NAME", "node-b")],
    );
    assert_eq!(
        s.repair.node_name, "node-b",
        "REPAIR_NODE_NAME wins for the controller"
    );
    let s = node.settings(&[]);
    let err = s.check_agent().unwrap_err().to_string();
    assert!(err.contains("REPAIR_NODE_NAME"), "{err}");
    let off = node.settings_env(&[], &[("REPAIR_ENABLED", "false")]);
    assert!(
        off.check_agent().is_ok(),
        "no controller, no node name needed"
    );
}

#[test]
fn binary_install_help_and_bad_flags() {
    let help = |bin: &str, args: &[&str]| {
        let out = Command::new(bin)
            .args(args)
            .arg("--help")
            .env_clear()
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{bin} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let stdout = help(node_bin(), &[]);
    assert!(stdout.contains("CNI_CONF_NAME") && stdout.contains("--chained-cni-plugin"));
    // The DaemonSet command of earlier manifests, `redirect-cni install`, runs the node agent.
    assert_eq!(help(plugin_bin(), &["install"]), stdout);
    assert_eq!(help(node_bin(), &["install"]), stdout);

    let out = Command::new(node_bin())
        .args(["--kubeconfig-mode", "abc"])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("kubeconfig-mode"));
}

// --- the manifests in docs/deploy ----------------------------------------------------------------

/// The `data` of the ConfigMap in a manifest, values unquoted.
fn configmap_data(manifest: &str) -> Vec<(String, String)> {
    let doc = manifest
        .split("\n---\n")
        .find(|d| d.contains("\nkind: ConfigMap\n"))
        .expect("a ConfigMap");
    let data = &doc[doc.find("\ndata:\n").expect("data") + 7..];
    data.lines()
        .take_while(|l| l.is_empty() || l.starts_with("  "))
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.trim().split_once(": ").expect("KEY: value");
            (k.to_string(), v.trim_matches('"').to_string())
        })
        .collect()
}

fn deploy_file(rel: &str) -> String {
    let path = redirect_testkit::docs::workspace().join("deploy").join(rel);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_manifests_configmaps_use_known_settings_and_the_nad_example_matches() {
    let help = match parse([OsString::from("--help")], &|_| None).unwrap() {
        Parsed::Info(text) => text,
        Parsed::Run(_) => panic!("--help ran"),
    };
    let mut settings = Vec::new();
    for (rel, chained) in [
        ("kubernetes/redirect-cni.yaml", true),
        ("openshift/redirect-cni.yaml", false),
    ] {
        let mut data = configmap_data(&deploy_file(rel));
        assert!(data.len() >= 8, "{rel}: {data:?}");
        for (k, _) in &data {
            // An unknown key would be ignored silently by the installer.
            assert!(
                help.contains(&format!("[env: {k}]")),
                "{rel}: unknown setting {k}"
            );
        }
        data.push(("POD_NAMESPACE".into(), "redirect-system".into()));
        data.push(("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()));
        let lookup = move |k: &str| data.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let s = match parse(Vec::<OsString>::new(), &lookup).unwrap() {
            Parsed::Run(s) => *s,
            Parsed::Info(i) => panic!("{i}"),
        };
        assert_eq!(s.chained, chained, "{rel}");
        // Istio's chart's repair defaults: on, in place.
        assert!(s.repair.enabled, "{rel}");
        assert_eq!(s.repair.mode(), "repair", "{rel}");
        assert_eq!(s.untaint, None, "{rel}");
        settings.push(s);
    }
    let os = &settings[1];
    assert_eq!(
        os.mounted_cni_net_dir,
        PathBuf::from("/host/etc/cni/multus/net.d")
    );
    assert_eq!(
        os.cni_bin_dirs,
        vec![PathBuf::from("/host/var/lib/cni/bin")]
    );
    assert_eq!(os.standalone_conf_name(), "redirect-cni.conf");

    // The commented inline config of the NetworkAttachmentDefinition is what the installer
    // writes with the OpenShift ConfigMap.
    let nad = deploy_file("openshift/network-attachment-definition.yaml");
    let inline: String = nad
        .lines()
        .skip_while(|l| !l.starts_with("#   config: |"))
        .skip(1)
        .map(|l| l.strip_prefix("#     ").unwrap_or(""))
        .collect();
    let inline: Value = serde_json::from_str(&inline).expect("the inline config is JSON");
    assert_eq!(inline, standalone_conf(os));
    // Istio's injected annotation (`k8s.v1.cni.cncf.io/networks: istio-cni`) finds our config
    // by its network name.
    assert_eq!(os.cni_network_name, "istio-cni");
    assert_eq!(inline["name"], "istio-cni");
    assert!(nad.contains("name: istio-cni\n  namespace: default\n"));
}

/// The run directory must be the agent's alone: one its group or others may write, or that
/// another user owns, is refused at start (exit 1, naming the mode and the fix) and nothing is
/// installed. (Before: taken as it was.) A kernel test: another user's folder is made (root).
#[kernel_test]
fn binary_refuses_a_run_dir_others_may_write() {
    let env = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "6443"),
        ("REPAIR_ENABLED", "false"),
        ("MONITORING_PORT", "0"),
    ];
    for (mode, owner, needle) in [
        (0o777, None, "mode 0777"),
        (0o775, None, "mode 0775"),
        (0o1777, None, "mode 1777"),
        (0o755, Some(4242), "owned by UID 4242"),
    ] {
        let node = Node::new();
        node.write("net/10-calico.conflist", CALICO, 0o644);
        fs::set_permissions(node.p("run"), fs::Permissions::from_mode(mode)).unwrap();
        if let Some(uid) = owner {
            nix::unistd::chown(&node.p("run"), Some(nix::unistd::Uid::from_raw(uid)), None)
                .unwrap();
        }
        let before = node.snapshot();
        let (code, stderr) = binary_exits(&node, &env);
        assert_eq!(code, Some(1), "{needle}: {stderr}");
        assert!(
            stderr.contains(needle) && stderr.contains("chmod 0755"),
            "{needle}: {stderr}"
        );
        assert!(changed(&before, &node.snapshot()).is_empty(), "{needle}");
    }
}

/// Where the agent writes its status file: a FIFO or a link left there is removed and the
/// agent's file written; a directory is refused at start, naming it. (Before: the FIFO stayed
/// and the plugin's STATUS blocked on it; the directory made STATUS say "ready".)
#[test]
fn binary_takes_back_its_status_path_and_refuses_a_directory() {
    let env = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "6443"),
        ("REPAIR_ENABLED", "false"),
        ("MONITORING_PORT", "0"),
    ];
    let node = Node::new();
    fs::create_dir(node.p("run/agent-ready")).unwrap();
    let (code, stderr) = binary_exits(&node, &env);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("agent-ready is a directory") && stderr.contains("remove it"),
        "{stderr}"
    );
    fs::remove_dir(node.p("run/agent-ready")).unwrap();

    nix::unistd::mkfifo(
        &node.p("run/agent-ready"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let child = spawn_agent(&node, &env);
    wait_until(
        "the agent's own status file",
        Duration::from_secs(20),
        || fs::symlink_metadata(node.p("run/agent-ready")).is_ok_and(|m| m.is_file()),
    );
    let stderr = sigterm(child);
    assert!(
        stderr.contains("not the regular file the agent writes"),
        "{stderr}"
    );
}

/// A kubeconfig replaced behind the agent's back (its server pointed elsewhere) is written
/// again at once, with a warning that says so. (Before: only at the next resync, a minute
/// later, without a word.)
#[test]
fn binary_writes_a_replaced_kubeconfig_again_at_once() {
    let env = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "6443"),
        ("REPAIR_ENABLED", "false"),
        ("MONITORING_PORT", "0"),
    ];
    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let child = spawn_agent(&node, &env);
    let kubeconfig = node.p("run/redirect-cni-kubeconfig");
    let ours = |t: &str| t.contains("https://10.96.0.1:6443");
    wait_until("the kubeconfig", Duration::from_secs(20), || {
        fs::read_to_string(&kubeconfig).is_ok_and(|t| ours(&t))
    });
    let written = Instant::now();
    let evil = node.p("run/evil");
    fs::write(&evil, "server: https://attacker.example:443\n").unwrap();
    fs::rename(&evil, &kubeconfig).unwrap();
    wait_until(
        "the kubeconfig written again",
        Duration::from_secs(10),
        || fs::read_to_string(&kubeconfig).is_ok_and(|t| ours(&t)),
    );
    let took = written.elapsed();
    let stderr = sigterm(child);
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        stderr.lines().any(|l| l.starts_with("warn\t")
            && l.contains("was changed, replaced or removed by someone else")),
        "{stderr}"
    );
}

/// The node agent on `node` (no `--binary`: the plugin beside it), with `env` only.
fn spawn_agent(node: &Node, env: &[(&str, &str)]) -> std::process::Child {
    let mut args = node.args(&[]);
    args.truncate(args.len() - 2); // no --binary
    Command::new(node_bin())
        .args(&args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Stops the agent as the kubelet does; its stderr.
fn sigterm(child: std::process::Child) -> String {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Ambient mode: ztunnel's socket folder must be the agent's alone (whoever may write there
/// can put a socket of their own in the agent's place and receive every pod's network
/// namespace): one its group or others may write, or another user's, stops the agent at start
/// naming the folder, its mode and the fix, and nothing is installed. A kernel test: another
/// user's folder is made (root).
#[kernel_test]
fn binary_refuses_a_ztunnel_socket_folder_others_may_write() {
    for (mode, owner, needle) in [
        (0o777, None, "mode 0777"),
        (0o1777, None, "mode 1777"),
        (0o775, None, "mode 0775"),
        (0o755, Some(4242), "owned by UID 4242"),
    ] {
        let node = Node::new();
        node.write("net/10-calico.conflist", CALICO, 0o644);
        let dir = node.p("ztunnel");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
        if let Some(uid) = owner {
            nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
        }
        let socket = dir.join("ztunnel.sock");
        let env = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
            ("REPAIR_ENABLED", "false"),
            ("MONITORING_PORT", "0"),
            ("NODE_NAME", "worker-1"),
            ("AMBIENT_ENABLED", "true"),
            ("ZTUNNEL_UDS_ADDRESS", socket.to_str().unwrap()),
        ];
        let before = node.snapshot();
        let (code, stderr) = binary_exits(&node, &env);
        assert_ne!(code, Some(0), "{needle}: {stderr}");
        assert!(
            stderr.contains(needle)
                && stderr.contains("ZTUNNEL_UDS_ADDRESS")
                && stderr.contains("chmod 0755"),
            "{needle}: {stderr}"
        );
        assert!(changed(&before, &node.snapshot()).is_empty(), "{needle}");
        assert!(!socket.exists(), "{needle}: a socket was made there");
    }
}

// ---- taking over Istio's config (a node switched from istio-cni) ----

/// Istio's chained entry as its installer writes it (1.24–1.31), appended to Calico's list.
fn calico_with_istio() -> Value {
    let mut list: Value = serde_json::from_str(CALICO).unwrap();
    list["plugins"].as_array_mut().unwrap().push(json!({
        "type": "istio-cni",
        "log_level": "info",
        "cni_agent_run_dir": "/var/run/istio-cni",
        "ambient_enabled": false,
        "exclude_namespaces": ["kube-system"],
        "kubernetes": {
            "kubeconfig": "/etc/cni/net.d/ZZZ-istio-cni-kubeconfig",
            "cni_bin_dir": "/opt/cni/bin",
            "exclude_namespaces": ["kube-system"]
        }
    }));
    list
}

/// Istio's uninstall: every entry of its type goes from the list (its `cleanup`).
fn istios_uninstall(list: &Value) -> Value {
    let mut out = list.clone();
    out["plugins"]
        .as_array_mut()
        .unwrap()
        .retain(|p| p["type"] != "istio-cni");
    out
}

#[test]
fn istios_chained_entry_is_taken_over_in_place_and_not_brought_back() {
    let node = Node::new();
    let target = node.p("net/10-calico.conflist");
    node.write(
        "net/10-calico.conflist",
        &serde_json::to_string_pretty(&calico_with_istio()).unwrap(),
        0o644,
    );
    let s = node.settings(&[]);
    let mut inst = Installer::new(s.clone()).unwrap();
    assert_eq!(
        inst.install().unwrap(),
        ConfigStatus::Written(target.clone())
    );
    let after = json_of(&target);
    let plugins = after["plugins"].as_array().unwrap();
    assert_eq!(
        plugins.len(),
        4,
        "Istio's entry replaced, not added to: {after:#}"
    );
    assert_eq!(plugins[3], plugin_entry(&s), "ours where Istio's was");
    assert!(
        plugins.iter().all(|p| p["type"] != "istio-cni"),
        "{after:#}"
    );
    assert_eq!(plugins[3]["name"], "istio-cni", "the network's name kept");

    // Installed again: nothing to do.
    assert_eq!(
        inst.install().unwrap(),
        ConfigStatus::Unchanged(target.clone())
    );
    // Istio's uninstall (its DaemonSet removed after ours is in) leaves ours.
    assert_eq!(istios_uninstall(&after), after);

    // Our uninstall puts back the list without any capture plugin: Istio's entry is for
    // Istio's installer to write again, with its binary.
    inst.uninstall().unwrap();
    let back = json_of(&target);
    let calico: Value = serde_json::from_str(CALICO).unwrap();
    assert_eq!(back, calico);
}

#[test]
fn istios_entry_put_back_by_its_installer_is_taken_over_again() {
    let node = Node::new();
    let target = node.p("net/10-calico.conflist");
    node.write("net/10-calico.conflist", CALICO, 0o644);
    let s = node.settings(&[]);
    let entry = plugin_entry(&s);
    let ours_alone = |p: &Path| {
        fs::read(p)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| {
                ours(&v) == vec![entry.clone()]
                    && v["plugins"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .all(|p| p["type"] != "istio-cni")
            })
    };
    let running = Running::start(s.clone(), fast_watch());
    wait_until("the first install", Duration::from_secs(5), || {
        ours_alone(&target)
    });
    // Istio's installer, still running during the switch, appends its entry again.
    let mut with_istio = json_of(&target);
    with_istio["plugins"]
        .as_array_mut()
        .unwrap()
        .push(calico_with_istio()["plugins"][3].clone());
    fs::write(&target, serde_json::to_string_pretty(&with_istio).unwrap()).unwrap();
    wait_until(
        "Istio's entry taken over again",
        Duration::from_secs(5),
        || ours_alone(&target),
    );
    running.stop().unwrap();
}

#[test]
fn istios_standalone_config_of_the_same_network_goes_once_ours_is_written() {
    let node = Node::new();
    let istio = json!({
        "cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni",
        "log_level": "info", "kubernetes": {"kubeconfig": "/etc/cni/multus/net.d/ZZZ-istio-cni-kubeconfig"}
    });
    node.write("net/istio-cni.conf", &istio.to_string(), 0o644);
    // Someone else's network of another name stays.
    let other = json!({"cniVersion": "0.3.1", "name": "other", "type": "istio-cni"});
    node.write("net/other.conf", &other.to_string(), 0o644);
    let s = node.settings(&["--chained=false"]);
    let mut inst = Installer::new(s.clone()).unwrap();
    let path = node.p("net/redirect-cni.conf");
    assert_eq!(inst.install().unwrap(), ConfigStatus::Written(path.clone()));
    assert_eq!(json_of(&path)["name"], "istio-cni");
    assert!(
        !node.p("net/istio-cni.conf").exists(),
        "Istio's config of the network goes"
    );
    assert_eq!(
        json_of(&node.p("net/other.conf")),
        other,
        "another network's stays"
    );
    inst.uninstall().unwrap();
    assert!(!path.exists());
    assert!(!node.p("net/istio-cni.conf").exists(), "not brought back");
}

// --- Istio's owned config file (ISTIO_OWNED_CNI_CONFIG) -----------------------------------------

/// With an owned file, the primary CNI's file is never written: install, its owner's rewrite
/// (followed by our copy), a restart, and the uninstall leave it byte for byte as its owner
/// made it; our list sorts first and holds its plugins and ours.
#[test]
fn an_owned_config_follows_the_primary_and_never_touches_it() {
    let node = Node::new();
    let primary = node.p("net/05-cilium.conflist");
    let owned = node.p("net/02-istio-cni.conflist");
    node.write("net/05-cilium.conflist", CALICO, 0o640);
    let s = node.settings_env(&[], &[("ISTIO_OWNED_CNI_CONFIG", "true")]);
    let entry = plugin_entry(&s);
    let copy_of = |text: &str| {
        let mut want: Value = serde_json::from_str(text).unwrap();
        want["plugins"].as_array_mut().unwrap().push(entry.clone());
        want
    };
    let running = Running::start(s.clone(), fast_watch());
    wait_until("the owned file", Duration::from_secs(5), || {
        owned.is_file() && json_of(&owned) == copy_of(CALICO)
    });
    assert_eq!(fs::read_to_string(&primary).unwrap(), CALICO);
    assert_eq!(
        mode_of(&owned),
        0o640,
        "the owned file takes the primary's mode"
    );
    assert_eq!(
        select_target(&node.p("net"), None).unwrap(),
        Some(owned.clone())
    );

    // The primary's owner rewrites its file (atomically, as Cilium does): our copy follows.
    let theirs = CALICO.replace("\"mtu\": 1440", "\"mtu\": 1400");
    fs::write(node.p("net/.cilium.tmp"), &theirs).unwrap();
    fs::rename(node.p("net/.cilium.tmp"), &primary).unwrap();
    wait_until(
        "the copy following the rewrite",
        Duration::from_secs(5),
        || json_of(&owned) == copy_of(&theirs),
    );
    assert_eq!(fs::read_to_string(&primary).unwrap(), theirs);

    // Stopped and started again: nothing rewritten; the uninstall removes only our file.
    running.stop().unwrap();
    assert!(!owned.exists(), "the uninstall left the owned file");
    assert_eq!(fs::read_to_string(&primary).unwrap(), theirs);
    let mut inst = Installer::new(s.clone()).unwrap();
    assert_eq!(
        inst.install().unwrap(),
        ConfigStatus::Written(owned.clone())
    );
    let mut again = Installer::new(s).unwrap();
    assert_eq!(
        again.install().unwrap(),
        ConfigStatus::Unchanged(owned.clone())
    );
    again.uninstall().unwrap();
    assert!(!owned.exists());
    assert_eq!(fs::read_to_string(&primary).unwrap(), theirs);
}

/// The owned file in place of an entry chained into the primary (a node switched from chained
/// mode), a `.conf` primary, a name that would sort after the primary, and the names refused.
#[test]
fn an_owned_config_takes_over_a_chained_entry_and_refuses_what_the_runtime_would_skip() {
    let node = Node::new();
    node.write("net/10-calico.conflist", CALICO, 0o644);
    // Chained first: our entry goes into the primary.
    let mut chained = Installer::new(node.settings(&[])).unwrap();
    chained.install().unwrap();
    assert_eq!(ours(&json_of(&node.p("net/10-calico.conflist"))).len(), 1);
    // Then owned: the primary's own bytes come back, our list is written beside it.
    let s = node.settings_env(&[], &[("ISTIO_OWNED_CNI_CONFIG", "true")]);
    let mut owned = Installer::new(s).unwrap();
    let owned_path = node.p("net/02-istio-cni.conflist");
    assert_eq!(
        owned.install().unwrap(),
        ConfigStatus::Written(owned_path.clone())
    );
    assert_eq!(
        fs::read_to_string(node.p("net/10-calico.conflist")).unwrap(),
        CALICO
    );
    assert_eq!(ours(&json_of(&owned_path)).len(), 1);
    owned.uninstall().unwrap();

    // A .conf primary is copied as a list; the .conf is not converted.
    let node = Node::new();
    node.write("net/10-bridge.conf", BRIDGE, 0o644);
    let env = [
        ("ISTIO_OWNED_CNI_CONFIG", "true"),
        ("ISTIO_OWNED_CNI_CONF_FILENAME", "01-mesh.conflist"),
    ];
    let mut inst = Installer::new(node.settings_env(&[], &env)).unwrap();
    let path = node.p("net/01-mesh.conflist");
    assert_eq!(inst.install().unwrap(), ConfigStatus::Written(path.clone()));
    assert_eq!(
        fs::read_to_string(node.p("net/10-bridge.conf")).unwrap(),
        BRIDGE
    );
    let list = json_of(&path);
    assert_eq!(
        (list["plugins"][0]["type"].as_str(), list["name"].as_str()),
        (Some("bridge"), Some("mynet"))
    );

    // A name that sorts after the primary: refused, naming both, nothing written.
    let node = Node::new();
    node.write("net/00-multus.conf", BRIDGE, 0o644);
    let before = node.snapshot();
    let s = node.settings_env(&[], &[("ISTIO_OWNED_CNI_CONFIG", "true")]);
    let err = Installer::new(s)
        .unwrap()
        .install()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("00-multus.conf")
            && err.contains("02-istio-cni.conflist")
            && err.contains("sorts before"),
        "{err}"
    );
    // The net dir as it was (the binaries and the kubeconfig come before the config).
    let net_changes: Vec<String> = changed(&before, &node.snapshot())
        .into_iter()
        .filter(|c| c.contains("/net/"))
        .collect();
    assert!(net_changes.is_empty(), "{net_changes:?}");
    assert!(!node.p("net/02-istio-cni.conflist").exists());

    // Names the runtime would not read as a list, or the primary's own name: refused.
    for (env, says) in [
        (
            ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "02-istio-cni.conf"),
            ".conflist",
        ),
        (
            ("ISTIO_OWNED_CNI_CONF_FILENAME", "../02.conflist"),
            "file name",
        ),
        (("CNI_CONF_NAME", "02-istio-cni.conflist"), "CNI_CONF_NAME"),
    ] {
        let vars = [("ISTIO_OWNED_CNI_CONFIG", "true"), env];
        let lookup = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let err = parse(node.args(&[]), &lookup).unwrap_err().to_string();
        assert!(
            err.contains(says) && err.contains("ISTIO_OWNED_CNI_CON"),
            "{env:?}: {err}"
        );
    }
}

/// A stop that cannot be told apart (the API server refuses the connection): the plugin goes,
/// as always, except with an owned config file, where it stays (Istio's default there).
#[test]
fn an_unanswered_stop_keeps_an_owned_config_and_removes_a_chained_entry() {
    use cni_node::upgrade::{decide, Stop};
    let node = Node::new();
    // A port nothing listens on: the connection is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let env = |owned: &'static str| {
        [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", port.as_str()),
            ("POD_NAME", "redirect-cni-node-x"),
            ("NODE_NAME", "node-1"),
            ("ISTIO_OWNED_CNI_CONFIG", owned),
            // The test's CA is no certificate: the client is built without it.
            ("SKIP_TLS_VERIFY", "true"),
        ]
        .map(|(k, v)| (k, v.to_string()))
    };
    let settings = |owned| {
        let vars = env(owned);
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        node.settings_env(&[], &pairs)
    };
    match decide(&settings("true")) {
        Stop::Keep(why) => assert!(
            why.contains("cannot read this pod") && why.contains("owned config file"),
            "{why}"
        ),
        other => panic!("owned: {other:?}"),
    }
    match decide(&settings("false")) {
        Stop::Remove(why) => assert!(why.contains("cannot read this pod"), "{why}"),
        other => panic!("chained: {other:?}"),
    }
}
