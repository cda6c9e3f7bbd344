//! The Helm chart deploy/helm/redirect-cni renders the objects of deploy/kubernetes and
//! deploy/openshift.
//!
//! Offline, with the helm binary and kubernetes-validate that scripts/install-helm.sh puts into
//! .tools/ (scripts/install-deps.sh runs it); a test fails, it does not skip, when they are not
//! there. `helm lint --strict` passes for every setting below; `helm template` of each setting is
//! parsed and compared, object by object and field by field, with the plain manifests the
//! setting stands for (deploy/<platform>/*.yaml), changed only where the values differ on
//! purpose: each case names its files and its changes. The plain manifests leave the namespace
//! to `kubectl -n`; the chart writes the release's into the namespaced objects and the
//! ClusterRoleBindings' subjects, which the plain files spell `kube-system # SET-ME`, so the
//! cases render into kube-system. Istio's value names are also read at the top level, as
//! Istio's chart reads them; settings the chart cannot turn into a working deployment are
//! refused with a message; and every rendering passes kubernetes-validate --strict (the
//! Kubernetes OpenAPI schemas of the oldest and newest version it bundles; only the two CRD
//! kinds, NetworkAttachmentDefinition and SecurityContextConstraints, may go unchecked).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde::Deserialize;
use serde_json::{json, Value};

// --- running helm -------------------------------------------------------------------------------

fn repo() -> PathBuf {
    redirect_testkit::docs::workspace()
}

fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/redirect-cni")
}

/// A program installed into .tools/ by scripts/install-helm.sh.
fn tool(name: &str) -> PathBuf {
    let path = repo().join(".tools").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `bash scripts/install-deps.sh` (it installs helm and \
         kubernetes-validate into .tools/)",
        path.display()
    );
    path
}

/// Runs helm with empty config, cache and data folders of its own and no kubeconfig: no
/// repository, no plugin, no cluster, no network.
fn helm(args: &[&str]) -> Output {
    let home = tempfile::tempdir().expect("a temporary folder");
    Command::new(tool("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env("KUBECONFIG", home.path().join("no-kubeconfig"))
        .output()
        .unwrap_or_else(|e| panic!("running helm: {e}"))
}

/// `helm template` of the chart into `namespace` with more arguments (`--set k=v`,
/// `--api-versions ...`): the YAML, or helm's error.
fn template(namespace: &str, args: &[&str]) -> Result<String, String> {
    let chart = chart_dir();
    let chart = chart.to_str().expect("a UTF-8 path");
    let mut all = vec!["template", "redirect-cni", chart, "--namespace", namespace];
    all.extend_from_slice(args);
    let out = helm(&all);
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm writes UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The namespace the cases render into: the one the plain manifests' SET-ME lines name.
const NS: &str = "kube-system";

/// The chart rendered with `--set name=value` for each pair, into the namespace kube-system:
/// the YAML stream that `kubectl apply -f -` takes. To reuse it elsewhere, copy it with
/// `template`, `helm`, `tool`, `chart_dir`, `repo` and `NS`.
fn render(set: &[(&str, &str)]) -> String {
    let args: Vec<String> = set
        .iter()
        .flat_map(|(k, v)| ["--set".to_string(), format!("{k}={v}")])
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    template(NS, &args).unwrap_or_else(|e| panic!("helm template {set:?} failed:\n{e}"))
}

// --- objects ------------------------------------------------------------------------------------

/// Objects by "Kind/name", as JSON.
type Objects = BTreeMap<String, Value>;

/// Parses a multi-document YAML stream; empty documents are skipped, as kubectl skips them.
fn parse(text: &str, origin: &str) -> Objects {
    let mut out = Objects::new();
    for (i, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
        // yaml_serde's own Value first: it refuses duplicate keys, which a JSON map would
        // collapse into the last one.
        let yaml = yaml_serde::Value::deserialize(de)
            .unwrap_or_else(|e| panic!("{origin}: document #{i}: {e}\n{text}"));
        let value = serde_json::to_value(&yaml)
            .unwrap_or_else(|e| panic!("{origin}: document #{i}: not JSON: {e}"));
        if value.is_null() {
            continue;
        }
        let key = format!(
            "{}/{}",
            value["kind"].as_str().unwrap_or("?"),
            value["metadata"]["name"].as_str().unwrap_or("?")
        );
        if out.insert(key.clone(), value).is_some() {
            panic!("{origin}: {key} twice");
        }
    }
    out
}

/// The objects of plain manifests, deploy/<file> each.
fn plain(files: &[&str]) -> Objects {
    let mut out = Objects::new();
    for file in files {
        let path = repo().join("deploy").join(file);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (key, value) in parse(&text, file) {
            if out.insert(key.clone(), value).is_some() {
                panic!("{key} is in two of {files:?}");
            }
        }
    }
    out
}

const DS: &str = "DaemonSet/redirect-cni-node";
const CM: &str = "ConfigMap/redirect-cni-config";
const SA: &str = "ServiceAccount/redirect-cni";
const ROLE: &str = "ClusterRole/redirect-cni";
/// The installer's container in the DaemonSet, as a JSON pointer.
const C: &str = "/spec/template/spec/containers/0";
const POD: &str = "/spec/template";

fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

/// The parent of `pointer` in object `key`, and the last segment.
fn parent<'a>(objs: &'a mut Objects, key: &str, pointer: &str) -> (&'a mut Value, String) {
    let (up, last) = pointer.rsplit_once('/').expect("a JSON pointer");
    let obj = objs
        .get_mut(key)
        .unwrap_or_else(|| panic!("{key} is not among the plain manifests' objects"));
    let parent = obj
        .pointer_mut(up)
        .unwrap_or_else(|| panic!("{key}: nothing at {up}"));
    (parent, unescape(last))
}

/// Sets the field at `pointer` (its parent must exist) of object `key`.
fn set(objs: &mut Objects, key: &str, pointer: &str, value: Value) {
    let (parent, last) = parent(objs, key, pointer);
    match parent {
        Value::Object(m) => {
            m.insert(last, value);
        }
        Value::Array(a) => a[last.parse::<usize>().expect("an index")] = value,
        other => panic!("{key}: {pointer}: the parent is {other}"),
    }
}

/// Removes the field at `pointer` of object `key`, which must be there.
fn remove(objs: &mut Objects, key: &str, pointer: &str) {
    let (parent, last) = parent(objs, key, pointer);
    let gone = parent.as_object_mut().and_then(|m| m.remove(&last));
    assert!(gone.is_some(), "{key}: nothing to remove at {pointer}");
}

/// Removes the element named `name` from the array at `pointer` of object `key`.
fn remove_named(objs: &mut Objects, key: &str, pointer: &str, name: &str) {
    let array = objs
        .get_mut(key)
        .and_then(|o| o.pointer_mut(pointer))
        .and_then(Value::as_array_mut)
        .unwrap_or_else(|| panic!("{key}: no array at {pointer}"));
    let before = array.len();
    array.retain(|e| e["name"] != name);
    assert_eq!(
        array.len() + 1,
        before,
        "{key}: {pointer}: no {name} to remove"
    );
}

/// The DaemonSet without what only in-place repair needs: the three capabilities and the two
/// host mounts (docs/deploy/README.md: "in delete or label mode ... can go").
fn without_in_place_repair(o: &mut Objects) {
    remove(o, DS, &format!("{C}/securityContext/capabilities/add"));
    for name in ["host-proc", "netns-dir"] {
        remove_named(o, DS, &format!("{C}/volumeMounts"), name);
        remove_named(o, DS, &format!("{POD}/spec/volumes"), name);
    }
}

/// The kinds that live in a namespace, among those the chart renders.
fn namespaced(kind: &str) -> bool {
    matches!(
        kind,
        "ServiceAccount"
            | "ConfigMap"
            | "DaemonSet"
            | "ResourceQuota"
            | "NetworkAttachmentDefinition"
    )
}

/// Where `got` differs from `want`, one line each, with the JSON path.
fn diff(got: &Value, want: &Value, path: &str, key: &str, out: &mut Vec<String>) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let p = format!("{path}/{k}");
                match g.get(k) {
                    Some(gv) => diff(gv, wv, &p, key, out),
                    None => out.push(format!("{key}: {p}: missing (expected {wv})")),
                }
            }
            for (k, gv) in g {
                if !w.contains_key(k) {
                    out.push(format!("{key}: {path}/{k}: {gv} is not expected"));
                }
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                diff(gv, wv, &format!("{path}/{i}"), key, out);
            }
        }
        _ if got == want => {}
        _ => out.push(format!("{key}: {path}: rendered {got}, expected {want}")),
    }
}

/// The differences between a rendering into `ns` and the expected objects. An expected object
/// without a namespace (the plain manifests leave it to `kubectl -n`) must be rendered in `ns`
/// when its kind is namespaced.
fn differences(yaml: &str, expected: &Objects, ns: &str) -> Vec<String> {
    let rendered = parse(yaml, "helm template");
    let mut out = Vec::new();
    for (key, want) in expected {
        let Some(got) = rendered.get(key) else {
            out.push(format!("{key}: not rendered"));
            continue;
        };
        let mut got = got.clone();
        let kind = want["kind"].as_str().unwrap_or("");
        if namespaced(kind) && want["metadata"].get("namespace").is_none() {
            let n = got["metadata"]
                .as_object_mut()
                .and_then(|m| m.remove("namespace"));
            if n.as_ref().and_then(Value::as_str) != Some(ns) {
                out.push(format!(
                    "{key}: metadata.namespace is {n:?}, not the release's {ns:?}"
                ));
            }
        }
        diff(&got, want, "", key, &mut out);
    }
    for key in rendered.keys() {
        if !expected.contains_key(key) {
            out.push(format!("{key}: rendered, not expected"));
        }
    }
    out
}

// --- the settings -------------------------------------------------------------------------------

/// One setting: helm's arguments, the plain manifests it stands for, and what differs from
/// them on purpose.
struct Case {
    name: &'static str,
    args: &'static [&'static str],
    files: &'static [&'static str],
    edit: fn(&mut Objects),
}

const K8S: &str = "kubernetes/redirect-cni.yaml";
const OCP: &str = "openshift/redirect-cni.yaml";
const NAD: &str = "openshift/network-attachment-definition.yaml";

/// Istio's OpenShift profile (files/profile-platform-openshift.yaml of its istio-cni chart).
macro_rules! openshift_values {
    () => {
        "cni.chained=false,cni.provider=multus,cni.cniBinDir=/var/lib/cni/bin,\
         cni.cniConfDir=/etc/cni/multus/net.d,cni.cniConfFileName=istio-cni.conf"
    };
}

fn no_edit(_: &mut Objects) {}

fn istio_cni_conf(o: &mut Objects) {
    set(o, CM, "/data/CNI_CONF_NAME", json!("istio-cni.conf"));
}

/// deploy/openshift's objects without what only OpenShift has (the SCC, its use, the
/// pod's annotation pinning it, SELinux type spc_t): Multus on a cluster that is not OpenShift.
fn without_scc(o: &mut Objects) {
    o.remove("SecurityContextConstraints/redirect-cni")
        .expect("the plain manifest's SCC");
    let rules = o
        .get_mut(ROLE)
        .and_then(|r| r["rules"].as_array_mut())
        .expect("the role's rules");
    rules.retain(|r| r["apiGroups"][0] != "security.openshift.io");
    remove(
        o,
        DS,
        &format!("{POD}/metadata/annotations/openshift.io~1required-scc"),
    );
    remove(o, DS, &format!("{C}/securityContext/seLinuxOptions"));
}

/// The three settings of the issue and the plain default.
const SETTINGS: &[Case] = &[
    Case {
        name: "the default: deploy/kubernetes",
        args: &[],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "1. OpenShift standalone (global.platform=openshift)",
        args: &[
            "--set",
            openshift_values!(),
            "--set",
            "global.platform=openshift",
        ],
        files: &[OCP, NAD],
        edit: istio_cni_conf,
    },
    Case {
        name: "1. OpenShift standalone, helm install on OpenShift (it serves the SCC API)",
        args: &[
            "--set",
            openshift_values!(),
            "--api-versions",
            "security.openshift.io/v1",
        ],
        files: &[OCP, NAD],
        edit: istio_cni_conf,
    },
    Case {
        name: "1. standalone under Multus, not OpenShift: no SCC",
        args: &["--set", openshift_values!()],
        files: &[OCP, NAD],
        edit: |o| {
            istio_cni_conf(o);
            without_scc(o);
        },
    },
    Case {
        name: "2. OpenShift standalone, delete mode",
        args: &[
            "--set",
            openshift_values!(),
            "--set",
            "cni.repair.deletePods=true,cni.repair.repairPods=false",
            "--api-versions",
            "security.openshift.io/v1",
        ],
        files: &[OCP, NAD, "openshift/repair-delete-pods.yaml"],
        edit: |o| {
            istio_cni_conf(o);
            set(o, CM, "/data/REPAIR_REPAIR_PODS", json!("false"));
            set(o, CM, "/data/REPAIR_DELETE_PODS", json!("true"));
            without_in_place_repair(o);
        },
    },
    Case {
        name: "3. chained into Calico's config under Multus",
        args: &[
            "--set",
            "cni.chained=true,cni.provider=default,cni.cniConfDir=/run/multus/cni/net.d,\
             cni.cniConfFileName=10-calico.conflist",
        ],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/CNI_CONF_NAME", json!("10-calico.conflist"));
            set(o, CM, "/data/CNI_NET_DIR", json!("/run/multus/cni/net.d"));
            let mounted = json!("/host/run/multus/cni/net.d");
            set(o, CM, "/data/MOUNTED_CNI_NET_DIR", mounted.clone());
            set(o, DS, &format!("{C}/volumeMounts/1/mountPath"), mounted);
            let host = json!("/run/multus/cni/net.d");
            set(o, DS, &format!("{POD}/spec/volumes/1/hostPath/path"), host);
        },
    },
];

/// The other repair modes and the optional objects.
const MODES: &[Case] = &[
    Case {
        name: "label mode",
        args: &[
            "--set",
            "cni.repair.labelPods=true,cni.repair.repairPods=false",
        ],
        files: &[K8S, "kubernetes/repair-label-pods.yaml"],
        edit: |o| {
            set(o, CM, "/data/REPAIR_REPAIR_PODS", json!("false"));
            set(o, CM, "/data/REPAIR_LABEL_PODS", json!("true"));
            without_in_place_repair(o);
        },
    },
    Case {
        name: "delete mode wins over label mode",
        args: &[
            "--set",
            "cni.repair.labelPods=true,cni.repair.deletePods=true,cni.repair.repairPods=false",
        ],
        files: &[K8S, "kubernetes/repair-delete-pods.yaml"],
        edit: |o| {
            set(o, CM, "/data/REPAIR_REPAIR_PODS", json!("false"));
            set(o, CM, "/data/REPAIR_DELETE_PODS", json!("true"));
            set(o, CM, "/data/REPAIR_LABEL_PODS", json!("true"));
            without_in_place_repair(o);
        },
    },
    Case {
        name: "repair mode wins over delete mode: no delete RBAC",
        args: &["--set", "cni.repair.deletePods=true"],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/REPAIR_DELETE_PODS", json!("true")),
    },
    Case {
        name: "every mode off: the controller watches, nothing more",
        args: &["--set", "cni.repair.repairPods=false"],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/REPAIR_REPAIR_PODS", json!("false"));
            without_in_place_repair(o);
        },
    },
    Case {
        name: "repair off: the plugin's pods get only",
        args: &["--set", "cni.repair.enabled=false"],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/REPAIR_ENABLED", json!("false"));
            without_in_place_repair(o);
            let get_pods = json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]);
            set(o, ROLE, "/rules", get_pods);
        },
    },
    Case {
        name: "untaint",
        args: &["--set", "cni.untaintNode=true"],
        files: &[K8S, "kubernetes/untaint-node.yaml"],
        edit: |o| set(o, CM, "/data/UNTAINT_NODE", json!("true")),
    },
    Case {
        name: "the critical pods' quota",
        args: &["--set", "cni.resourceQuotas.enabled=true"],
        files: &[K8S, "kubernetes/resourcequota-critical-pods.yaml"],
        edit: no_edit,
    },
    Case {
        name: "the quota's size",
        args: &[
            "--set",
            "cni.resourceQuotas.enabled=true,cni.resourceQuotas.pods=5000",
        ],
        files: &[K8S, "kubernetes/resourcequota-critical-pods.yaml"],
        edit: |o| {
            let key = "ResourceQuota/redirect-cni-critical-pods";
            set(o, key, "/spec/hard/pods", json!("5000"));
        },
    },
];

/// Istio's other value names, each where the installer or Kubernetes reads it.
const VALUES: &[Case] = &[
    Case {
        name: "cni.excludeNamespaces -> EXCLUDE_NAMESPACES",
        args: &["--set", "cni.excludeNamespaces={kube-system,istio-system}"],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/EXCLUDE_NAMESPACES", json!("kube-system,istio-system")),
    },
    Case {
        name: "cni.logging.level -> PLUGIN_LOG_LEVEL",
        args: &["--set", "cni.logging.level=debug,global.logging.level=error"],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/PLUGIN_LOG_LEVEL", json!("debug")),
    },
    Case {
        name: "global.logging.level -> PLUGIN_LOG_LEVEL",
        args: &["--set", "global.logging.level=warn"],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/PLUGIN_LOG_LEVEL", json!("warn")),
    },
    Case {
        name: "cni.repair.initContainerName, brokenPodLabelKey, brokenPodLabelValue",
        args: &[
            "--set",
            "cni.repair.initContainerName=check,cni.repair.brokenPodLabelKey=example.com/broken",
            "--set-string",
            "cni.repair.brokenPodLabelValue=yes",
        ],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/REPAIR_INIT_CONTAINER_NAME", json!("check"));
            set(o, CM, "/data/REPAIR_BROKEN_POD_LABEL_KEY", json!("example.com/broken"));
            set(o, CM, "/data/REPAIR_BROKEN_POD_LABEL_VALUE", json!("yes"));
        },
    },
    Case {
        name: "cni.cniBinDir -> CNI_BIN_DIR and the mount",
        args: &["--set", "cni.cniBinDir=/home/kubernetes/bin"],
        files: &[K8S],
        edit: |o| {
            let mounted = json!("/host/home/kubernetes/bin");
            set(o, CM, "/data/CNI_BIN_DIR", mounted.clone());
            set(o, DS, &format!("{C}/volumeMounts/0/mountPath"), mounted);
            let host = json!("/home/kubernetes/bin");
            set(o, DS, &format!("{POD}/spec/volumes/0/hostPath/path"), host);
        },
    },
    Case {
        name: "cni.cniNetnsDir -> the pinned namespaces' mount",
        args: &["--set", "cni.cniNetnsDir=/run/netns"],
        files: &[K8S],
        edit: |o| set(o, DS, &format!("{POD}/spec/volumes/4/hostPath/path"), json!("/run/netns")),
    },
    Case {
        name: "global.hub, global.tag -> the image",
        args: &["--set", "global.hub=registry.example.com/mesh,global.tag=1.2.3"],
        files: &[K8S],
        edit: |o| {
            let image = json!("registry.example.com/mesh/redirect:1.2.3");
            set(o, DS, &format!("{C}/image"), image);
        },
    },
    Case {
        name: "cni.hub, cni.tag, cni.image win",
        args: &[
            "--set",
            "global.hub=a.example,global.tag=1,cni.hub=b.example/x,cni.tag=2.0.1,cni.image=redir",
        ],
        files: &[K8S],
        edit: |o| set(o, DS, &format!("{C}/image"), json!("b.example/x/redir:2.0.1")),
    },
    Case {
        name: "cni.image with a '/' is the whole image",
        args: &["--set", "cni.image=registry.example.com/redirect@sha256:0123"],
        files: &[K8S],
        edit: |o| {
            let image = json!("registry.example.com/redirect@sha256:0123");
            set(o, DS, &format!("{C}/image"), image);
        },
    },
    Case {
        name: "global.imagePullPolicy, cni.pullPolicy wins",
        args: &["--set", "global.imagePullPolicy=Always,cni.pullPolicy=IfNotPresent"],
        files: &[K8S],
        edit: |o| set(o, DS, &format!("{C}/imagePullPolicy"), json!("IfNotPresent")),
    },
    Case {
        name: "global.imagePullSecrets -> the ServiceAccount",
        args: &["--set", "global.imagePullSecrets={regcred}"],
        files: &[K8S],
        edit: |o| set(o, SA, "/imagePullSecrets", json!([{"name": "regcred"}])),
    },
    Case {
        name: "cni.resources: Istio's requests, the limit removed",
        args: &[
            "--set",
            "cni.resources.requests.cpu=100m,cni.resources.requests.memory=100Mi,\
             cni.resources.limits=null",
        ],
        files: &[K8S],
        edit: |o| {
            let requests = json!({"requests": {"cpu": "100m", "memory": "100Mi"}});
            set(o, DS, &format!("{C}/resources"), requests);
        },
    },
    Case {
        name: "cni.tolerations replace the default",
        args: &[
            "--set-json",
            r#"cni.tolerations=[{"key":"CriticalAddonsOnly","operator":"Exists"}]"#,
        ],
        files: &[K8S],
        edit: |o| {
            let t = json!([{"key": "CriticalAddonsOnly", "operator": "Exists"}]);
            set(o, DS, &format!("{POD}/spec/tolerations"), t);
        },
    },
    Case {
        name: "cni.podAnnotations are added, and win",
        args: &[
            "--set-string",
            r"cni.podAnnotations.example\.com/team=mesh,cni.podAnnotations.prometheus\.io/scrape=false",
        ],
        files: &[K8S],
        edit: |o| {
            let a = format!("{POD}/metadata/annotations");
            set(o, DS, &format!("{a}/example.com~1team"), json!("mesh"));
            set(o, DS, &format!("{a}/prometheus.io~1scrape"), json!("false"));
        },
    },
    Case {
        name: "cni.podLabels, cni.daemonSetLabels",
        args: &["--set", "cni.podLabels.team=mesh,cni.daemonSetLabels.tier=node"],
        files: &[K8S],
        edit: |o| {
            set(o, DS, &format!("{POD}/metadata/labels/team"), json!("mesh"));
            set(o, DS, "/metadata/labels/tier", json!("node"));
        },
    },
    Case {
        name: "cni.seLinuxOptions: spc_t unless a type is given",
        args: &["--set", "cni.seLinuxOptions.level=s0"],
        files: &[K8S],
        edit: |o| {
            let se = json!({"level": "s0", "type": "spc_t"});
            set(o, DS, &format!("{C}/securityContext/seLinuxOptions"), se);
        },
    },
    Case {
        name: "cni.affinity",
        args: &[
            "--set-json",
            r#"cni.affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"mesh","operator":"Exists"}]}]}}}"#,
        ],
        files: &[K8S],
        edit: |o| {
            let a = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "mesh", "operator": "Exists"}]}]}}});
            set(o, DS, &format!("{POD}/spec/affinity"), a);
        },
    },
    Case {
        name: "cni.terminationGracePeriodSeconds, cni.updateStrategy",
        args: &[
            "--set",
            "cni.terminationGracePeriodSeconds=30,cni.updateStrategy.rollingUpdate.maxUnavailable=2",
        ],
        files: &[K8S],
        edit: |o| {
            set(o, DS, &format!("{POD}/spec/terminationGracePeriodSeconds"), json!(30));
            set(o, DS, "/spec/updateStrategy/rollingUpdate/maxUnavailable", json!(2));
        },
    },
    Case {
        name: "cni.env: any installer variable, as a string, winning",
        args: &["--set", "cni.env.REPAIR_MAX_ATTEMPTS=7,cni.env.CLEANUP_ON_EXIT=false"],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/REPAIR_MAX_ATTEMPTS", json!("7"));
            set(o, CM, "/data/CLEANUP_ON_EXIT", json!("false"));
        },
    },
    Case {
        name: "standalone without a file name: redirect-cni.conf",
        args: &["--set", "cni.chained=false"],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/CHAINED_CNI_PLUGIN", json!("false"));
            set(o, CM, "/data/CNI_CONF_NAME", json!("redirect-cni.conf"));
            set(o, CM, "/data/CNI_CONF_GROUP_READ", json!("false"));
        },
    },
];

fn case_problems(cases: &[Case]) -> Vec<String> {
    let mut problems = Vec::new();
    for case in cases {
        let mut expected = plain(case.files);
        (case.edit)(&mut expected);
        match template(NS, case.args) {
            Ok(yaml) => problems.extend(
                differences(&yaml, &expected, NS)
                    .into_iter()
                    .map(|d| format!("{}: {d}", case.name)),
            ),
            Err(e) => problems.push(format!("{}: helm template failed: {e}", case.name)),
        }
    }
    problems
}

fn assert_no_problems(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// --- the tests ----------------------------------------------------------------------------------

#[test]
fn helm_lint_passes_for_each_setting() {
    let chart = chart_dir();
    let chart = chart.to_str().expect("a UTF-8 path");
    let mut problems = Vec::new();
    for case in SETTINGS.iter().chain(MODES) {
        // lint takes values, not --api-versions.
        let mut args = vec!["lint", chart, "--strict", "--namespace", NS];
        let mut rest = case.args.iter();
        while let Some(a) = rest.next() {
            let value = rest.next().expect("a flag's value");
            if *a != "--api-versions" {
                args.extend([*a, *value]);
            }
        }
        let out = helm(&args);
        if !out.status.success() {
            problems.push(format!(
                "{}: helm lint failed:\n{}{}",
                case.name,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert_no_problems(problems);
}

#[test]
fn the_default_and_the_three_settings_render_the_plain_manifests() {
    assert_no_problems(case_problems(SETTINGS));
}

#[test]
fn each_repair_mode_gets_its_rbac_and_only_in_place_repair_the_capabilities() {
    assert_no_problems(case_problems(MODES));
}

#[test]
fn istios_value_names_reach_the_installer_and_the_pod() {
    assert_no_problems(case_problems(VALUES));
}

/// The helper the API-server tests copy renders the default, which is the plain manifest.
#[test]
fn render_with_no_values_is_the_plain_kubernetes_manifest() {
    let problems = differences(&render(&[]), &plain(&[K8S]), NS);
    assert_no_problems(problems);
}

#[test]
fn the_release_namespace_is_the_namespace_of_the_objects_and_the_subjects() {
    let ns = "redirect-system";
    let args = [
        "--set",
        openshift_values!(),
        "--set",
        "global.platform=openshift,cni.repair.labelPods=true,cni.repair.repairPods=false,\
         cni.untaintNode=true,cni.resourceQuotas.enabled=true",
    ];
    let yaml = template(ns, &args).unwrap_or_else(|e| panic!("helm template: {e}"));
    let mut expected = plain(&[
        OCP,
        NAD,
        "openshift/repair-label-pods.yaml",
        "openshift/untaint-node.yaml",
        "kubernetes/resourcequota-critical-pods.yaml",
    ]);
    istio_cni_conf(&mut expected);
    set(
        &mut expected,
        CM,
        "/data/REPAIR_REPAIR_PODS",
        json!("false"),
    );
    set(&mut expected, CM, "/data/REPAIR_LABEL_PODS", json!("true"));
    set(&mut expected, CM, "/data/UNTAINT_NODE", json!("true"));
    without_in_place_repair(&mut expected);
    let mut bindings = 0;
    for (key, obj) in expected.iter_mut() {
        if key.starts_with("ClusterRoleBinding/") {
            assert_eq!(
                obj["subjects"][0]["namespace"], NS,
                "{key}: the SET-ME line"
            );
            obj["subjects"][0]["namespace"] = json!(ns);
            bindings += 1;
        }
    }
    assert_eq!(bindings, 3);
    // The NetworkAttachmentDefinition stays in "default", where every namespace may use it.
    assert_eq!(
        expected["NetworkAttachmentDefinition/redirect-cni"]["metadata"]["namespace"],
        "default"
    );
    assert_no_problems(differences(&yaml, &expected, ns));
}

/// Istio's chart also reads its names without the `cni.` prefix (an Istio values file has them
/// at the top level); so does this one, maps merged key by key.
#[test]
fn the_names_are_also_read_at_the_top_level() {
    let pairs: &[(&[&str], &[&str])] = &[
        (
            &[
                "--set",
                "cniBinDir=/var/lib/cni/bin,cniConfDir=/etc/cni/multus/net.d",
            ],
            &[
                "--set",
                "cni.cniBinDir=/var/lib/cni/bin,cni.cniConfDir=/etc/cni/multus/net.d",
            ],
        ),
        (
            &[
                "--set",
                "chained=false,provider=multus,cniConfFileName=istio-cni.conf",
            ],
            &[
                "--set",
                "cni.chained=false,cni.provider=multus,cni.cniConfFileName=istio-cni.conf",
            ],
        ),
        (
            &["--set", "platform=openshift"],
            &["--set", "global.platform=openshift"],
        ),
        (
            &["--set", "repair.deletePods=true,repair.repairPods=false"],
            &[
                "--set",
                "cni.repair.deletePods=true,cni.repair.repairPods=false",
            ],
        ),
        (
            &[
                "--set",
                "excludeNamespaces={a,b},logging.level=debug,hub=h.example,tag=9",
            ],
            &[
                "--set",
                "cni.excludeNamespaces={a,b},cni.logging.level=debug,cni.hub=h.example,cni.tag=9",
            ],
        ),
        // The top level wins.
        (
            &["--set", "cni.cniNetnsDir=/a,cniNetnsDir=/run/netns"],
            &["--set", "cni.cniNetnsDir=/run/netns"],
        ),
    ];
    let mut problems = Vec::new();
    for (top, under_cni) in pairs {
        let want = template(NS, under_cni).unwrap_or_else(|e| panic!("{under_cni:?}: {e}"));
        let got = template(NS, top).unwrap_or_else(|e| panic!("{top:?}: {e}"));
        assert_ne!(
            want,
            render(&[]),
            "{under_cni:?} changes nothing: a useless case"
        );
        problems.extend(
            differences(&got, &parse(&want, "cni."), NS)
                .into_iter()
                .map(|d| format!("{top:?}: {d}")),
        );
    }
    assert_no_problems(problems);
}

/// Settings that cannot make a working deployment fail the rendering, with a message.
#[test]
fn settings_that_cannot_work_are_refused_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--set", "cni.provider=multus"],
            "cni.provider=multus needs cni.chained=false",
        ),
        (
            &["--set", "ambient.enabled=true"],
            "ambient mode is not supported",
        ),
        (
            &["--set", "cni.ambient.enabled=true"],
            "ambient mode is not supported",
        ),
        (
            &["--set", "profile=ambient"],
            "ambient mode is not supported",
        ),
        (
            &["--set", "global.platform=k3s"],
            "global.platform=k3s: this chart knows only openshift",
        ),
        (
            &["--set", "platform=gke"],
            "global.platform=gke: this chart knows only openshift",
        ),
        // The schema.
        (&["--set", "cni.provider=calico"], "cni.provider"),
        (&["--set-string", "cni.chained=false"], "chained"),
        (&["--set", "chained=maybe"], "chained"),
        (&["--set", "cni.logging.level=trace"], "cni.logging.level"),
        (
            &["--set", "cni.cniConfFileName=a/b.conf"],
            "cni.cniConfFileName",
        ),
        (&["--set", "cni.cniBinDir=opt/cni/bin"], "cni.cniBinDir"),
        (
            &["--set", "cni.repair.deletePods=yes"],
            "cni.repair.deletePods",
        ),
        (
            &["--set", "cni.podAnnotations.a=true"],
            "cni.podAnnotations.a",
        ),
    ];
    let mut problems = Vec::new();
    for (args, message) in cases {
        match template(NS, args) {
            Ok(_) => problems.push(format!("{args:?}: rendered, not refused")),
            Err(e) if !e.contains(message) => problems.push(format!(
                "{args:?}: the error does not say {message:?}:\n{e}"
            )),
            Err(_) => {}
        }
    }
    assert_no_problems(problems);
}

// --- the Kubernetes schemas ---------------------------------------------------------------------

/// The oldest and the newest Kubernetes whose schemas kubernetes-validate bundles.
const KUBERNETES: [&str; 2] = ["1.25.0", "1.37.0"];

/// The kinds kubernetes-validate has no schema for (CRDs); they are checked against the plain
/// manifests above, which tests/manifests.rs checks against their CRDs' fields.
const CRDS: [&str; 2] = ["NetworkAttachmentDefinition", "SecurityContextConstraints"];

/// kubernetes-validate --strict on `files`, for each version at once: the complaints.
fn validate(files: &[PathBuf]) -> Vec<String> {
    let runs: Vec<_> = KUBERNETES
        .iter()
        .map(|version| {
            let child = Command::new(tool("kubernetes-validate"))
                .args(["--strict", "--quiet", "-k", version])
                .args(files)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("running kubernetes-validate: {e}"));
            (version, child)
        })
        .collect();
    let mut problems = Vec::new();
    for (version, child) in runs {
        let out = child
            .wait_with_output()
            .expect("kubernetes-validate's output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let before = problems.len();
        problems.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .filter(|l| !(l.starts_with("WARN ") && CRDS.iter().any(|k| l.contains(k))))
                .map(|l| format!("{version}: {l}")),
        );
        if !out.status.success() && problems.len() == before {
            problems.push(format!(
                "{version}: kubernetes-validate exited with {}",
                out.status
            ));
        }
    }
    problems
}

#[test]
fn every_rendering_passes_the_kubernetes_schemas_strictly() {
    // Each object once: the first case that renders it writes it into its file (YAML takes
    // JSON), so that a complaint names that case's file.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mut seen = std::collections::BTreeSet::new();
    let mut files = Vec::new();
    let mut names = Vec::new();
    for (i, case) in SETTINGS.iter().chain(MODES).chain(VALUES).enumerate() {
        let yaml = template(NS, case.args)
            .unwrap_or_else(|e| panic!("{}: helm template failed: {e}", case.name));
        let mut text = String::new();
        for object in parse(&yaml, case.name).into_values() {
            let json = object.to_string();
            if seen.insert(json.clone()) {
                text.push_str(&format!("---\n{json}\n"));
            }
        }
        if !text.is_empty() {
            let path = dir.path().join(format!("case{i:02}.yaml"));
            std::fs::write(&path, text).expect("writing a rendering");
            files.push(path);
            names.push(format!("case{i:02}.yaml: {}", case.name));
        }
    }
    let problems = validate(&files);
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}\nin the renderings of\n{}",
        problems.len(),
        problems.join("\n"),
        names.join("\n")
    );
}

/// The validator itself refuses a field Kubernetes does not know, in strict mode: without that,
/// the test above could not fail.
#[test]
fn the_schema_check_refuses_an_unknown_field() {
    let yaml = render(&[]).replace(
        "hostNetwork: true",
        "hostNetwork: true\n      hostNetwrk: true",
    );
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("broken.yaml");
    std::fs::write(&path, yaml).expect("writing");
    let problems = validate(std::slice::from_ref(&path));
    for version in KUBERNETES {
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with(version) && p.contains("hostNetwrk")),
            "{version}: the misspelled field went through: {problems:?}"
        );
    }
}
