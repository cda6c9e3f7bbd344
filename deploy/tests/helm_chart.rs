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
//! Istio's chart reads them, the `cni.` one winning as there; settings the chart cannot turn
//! into a working deployment are refused with a message; ambient mode (`ambient.enabled`,
//! `profile=ambient`) renders the plain manifests with ambient.yaml, the AMBIENT_* settings,
//! the plugin's `ambient_enabled` and ztunnel's folder, and without it none of them is there;
//! and every rendering passes
//! kubernetes-validate --strict (the Kubernetes OpenAPI schemas of the oldest and newest version
//! it bundles; only the two CRD kinds, NetworkAttachmentDefinition and
//! SecurityContextConstraints, may go unchecked).
//!
//! The seeds' own values (issue 31): Istio install commands and values blocks from documents
//! users follow render as Istio users mean them, and give the node what Istio's own chart (1.24
//! and 1.30, recorded here; checked against the charts themselves when ISTIO_RELEASES_DIR names
//! the folder they were extracted into) gives it. Under Multus, an attachment without config
//! named as Istio's injector asks finds the file the real node agent writes with the chart's
//! ConfigMap (Multus's lookup applied to the folder). The migration section of
//! docs/deploy/README.md names each way the container differs from Istio's, and the agent run
//! with exactly the container's capabilities shows why DAC_OVERRIDE is not among them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

/// This file's own flag for helm: the next argument is the text of a values file (a block as
/// users paste it from a document), written to a file and given to helm as `-f FILE`.
const VALUES_YAML: &str = "--values-yaml";

/// `args` with each `--values-yaml TEXT` written to a file of `dir` and replaced by `-f FILE`.
fn with_values_files(args: &[&str], dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        if *a == VALUES_YAML {
            let text = rest.next().expect("the values file's text");
            let path = dir.join(format!("values{}.yaml", out.len()));
            std::fs::write(&path, text).expect("writing a values file");
            out.push("-f".to_string());
            out.push(path.to_str().expect("a UTF-8 path").to_string());
        } else {
            out.push(a.to_string());
        }
    }
    out
}

/// `helm template` of `chart` as release `release` into `namespace` with more arguments
/// (`--set k=v`, `--api-versions ...`, `--values-yaml TEXT`): the YAML, or helm's error.
fn template_of(
    chart: &Path,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> Result<String, String> {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let args = with_values_files(args, dir.path());
    let chart = chart.to_str().expect("a UTF-8 path");
    let mut all = vec!["template", release, chart, "--namespace", namespace];
    all.extend(args.iter().map(String::as_str));
    let out = helm(&all);
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("helm writes UTF-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `helm template` of the chart into `namespace` with more arguments: the YAML, or helm's
/// error.
fn template(namespace: &str, args: &[&str]) -> Result<String, String> {
    template_of(&chart_dir(), "redirect-cni", namespace, args)
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

/// Appends `value` to the array at `pointer` of object `key`.
fn push(objs: &mut Objects, key: &str, pointer: &str, value: Value) {
    objs.get_mut(key)
        .and_then(|o| o.pointer_mut(pointer))
        .and_then(Value::as_array_mut)
        .unwrap_or_else(|| panic!("{key}: no array at {pointer}"))
        .push(value);
}

/// The DaemonSet without what only in-place repair needs: the three capabilities and the two
/// host mounts (docs/deploy/README.md: "in delete or label mode ... can go").
fn without_in_place_repair(o: &mut Objects) {
    // Adopting Istio's pods needs the same rights: off unless cni.adoptIstio asks.
    set(o, CM, "/data/ADOPT_ISTIO", json!("off"));
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
        name: "flowControl.enabled=false: no FlowSchema, no PriorityLevelConfiguration",
        args: &["--set", "flowControl.enabled=false"],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "cni.flowControl.apiVersion=...v1beta3 (Kubernetes 1.26 to 1.28)",
        args: &[
            "--set",
            "cni.flowControl.apiVersion=flowcontrol.apiserver.k8s.io/v1beta3",
            "--kube-version",
            "1.28.0",
        ],
        files: &[K8S],
        edit: |o| {
            for key in [
                "FlowSchema/redirect-cni",
                "PriorityLevelConfiguration/redirect-cni",
            ] {
                set(
                    o,
                    key,
                    "/apiVersion",
                    json!("flowcontrol.apiserver.k8s.io/v1beta3"),
                );
            }
        },
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
        // Istio's "install with CNI" page for OpenShift 4.2+, as given there (istioctl's
        // `values.` spelling, no platform, no provider): the standalone istio-cni.conf whose
        // network is istio-cni, the name Istio's injector asks Multus for.
        name: "istios_openshift_command: values.cni.* unchanged, no platform value",
        args: &[
            "--set",
            "values.cni.cniBinDir=/var/lib/cni/bin",
            "--set",
            "values.cni.cniConfDir=/etc/cni/multus/net.d",
            "--set",
            "values.cni.chained=false",
            "--set",
            "values.cni.cniConfFileName=istio-cni.conf",
        ],
        files: &[OCP],
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
    Case {
        name: "istioOwnedCNIConfig: our own list beside the primary's file",
        args: &["--set", "istioOwnedCNIConfig=true"],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/ISTIO_OWNED_CNI_CONFIG", json!("true"));
            set(o, CM, "/data/ISTIO_OWNED_CNI_CONF_FILENAME", json!(""));
        },
    },
    Case {
        name: "cni.istioOwnedCNIConfig with its file name",
        args: &[
            "--set",
            "cni.istioOwnedCNIConfig=true,cni.istioOwnedCNIConfigFileName=01-mesh.conflist",
        ],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/ISTIO_OWNED_CNI_CONFIG", json!("true"));
            let name = json!("01-mesh.conflist");
            set(o, CM, "/data/ISTIO_OWNED_CNI_CONF_FILENAME", name);
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
        name: "delete mode, adopting Istio's pods asked for: in-place rights",
        args: &[
            "--set",
            "cni.repair.deletePods=true,cni.repair.repairPods=false,cni.adoptIstio=keep",
        ],
        files: &[K8S, "kubernetes/repair-delete-pods.yaml"],
        edit: |o| {
            set(o, CM, "/data/REPAIR_REPAIR_PODS", json!("false"));
            set(o, CM, "/data/REPAIR_DELETE_PODS", json!("true"));
            set(o, CM, "/data/ADOPT_ISTIO", json!("keep"));
        },
    },
    Case {
        name: "hand-back at uninstall: the variable",
        args: &["--set", "cni.handBackOnUninstall=nftables"],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/HAND_BACK_ON_UNINSTALL", json!("nftables")),
    },
    Case {
        name: "delete mode, hand-back at uninstall asked for: in-place rights",
        args: &[
            "--set",
            "cni.repair.deletePods=true,cni.repair.repairPods=false,cni.handBackOnUninstall=nftables",
        ],
        files: &[K8S, "kubernetes/repair-delete-pods.yaml"],
        edit: |o| {
            set(o, CM, "/data/REPAIR_REPAIR_PODS", json!("false"));
            set(o, CM, "/data/REPAIR_DELETE_PODS", json!("true"));
            set(o, CM, "/data/ADOPT_ISTIO", json!("off"));
            set(o, CM, "/data/HAND_BACK_ON_UNINSTALL", json!("nftables"));
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
            set(o, ROLE, "/rules", repair_off_rules());
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

const AMB: &str = "kubernetes/ambient.yaml";

/// Ambient mode over the plain manifests (with ambient.yaml's RBAC among the files): the
/// agent's four AMBIENT_* settings (Istio's defaults), the plugin's `ambient_enabled`, and the
/// host's /var/run/ztunnel at the same path, where ztunnel's socket is (ZTUNNEL_UDS_ADDRESS's
/// default). The capabilities and the host's /proc and pins stay, as in-place repair has them.
fn ambient_on(o: &mut Objects) {
    for key in [
        "AMBIENT_ENABLED",
        "AMBIENT_DNS_CAPTURE",
        "AMBIENT_IPV6",
        "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP",
    ] {
        set(o, CM, &format!("/data/{key}"), json!("true"));
    }
    set(
        o,
        CM,
        "/data/PLUGIN_CONFIG_JSON",
        json!(r#"{"ambient_enabled":true}"#),
    );
    let mount = json!({"name": "ztunnel-dir", "mountPath": "/var/run/ztunnel"});
    push(o, DS, &format!("{C}/volumeMounts"), mount);
    let volume = json!({"name": "ztunnel-dir",
        "hostPath": {"path": "/var/run/ztunnel", "type": "DirectoryOrCreate"}});
    push(o, DS, &format!("{POD}/spec/volumes"), volume);
}

/// Istio's ambient values block (its chart's values.yaml, 1.30), under `cni:` as istioctl and
/// Istio's docs write it.
const ISTIO_AMBIENT_VALUES: &str = "cni:
  ambient:
    enabled: true
    enablementSelectors:
    - podSelector:
        matchLabels: {istio.io/dataplane-mode: ambient}
    - podSelector:
        matchExpressions:
        - { key: istio.io/dataplane-mode, operator: NotIn, values: [none] }
      namespaceSelector:
        matchLabels: {istio.io/dataplane-mode: ambient}
    configDir: \"\"
    dnsCapture: true
    ipv6: true
    reconcileIptablesOnStartup: true
    shareHostNetworkNamespace: false
    enableAmbientDetectionRetry: false
";

/// Ambient mode: Istio's values that turn it on, its switches, and with the other settings.
const AMBIENT: &[Case] = &[
    Case {
        name: "ambient.enabled: the settings, the plugin's field, ambient.yaml's RBAC, ztunnel's folder",
        args: &["--set", "ambient.enabled=true"],
        files: &[K8S, AMB],
        edit: ambient_on,
    },
    Case {
        name: "cni.ambient.enabled",
        args: &["--set", "cni.ambient.enabled=true"],
        files: &[K8S, AMB],
        edit: ambient_on,
    },
    Case {
        name: "profile=ambient (Istio's profile sets cni.ambient.enabled)",
        args: &["--set", "profile=ambient"],
        files: &[K8S, AMB],
        edit: ambient_on,
    },
    Case {
        name: "global.profile=ambient",
        args: &["--set", "global.profile=ambient"],
        files: &[K8S, AMB],
        edit: ambient_on,
    },
    Case {
        name: "profile=ambient with cni.ambient.enabled=false: off, as with Istio's chart",
        args: &["--set", "profile=ambient,cni.ambient.enabled=false"],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "profile=ambient with ambient.enabled=false: on (the profile's cni. value wins, as in Istio's chart)",
        args: &["--set", "profile=ambient,ambient.enabled=false"],
        files: &[K8S, AMB],
        edit: ambient_on,
    },
    Case {
        name: "Istio's ambient values block as written (its default selectors, the ignored names)",
        args: &[VALUES_YAML, ISTIO_AMBIENT_VALUES],
        files: &[K8S, AMB],
        edit: ambient_on,
    },
    Case {
        name: "ambient.dnsCapture, cni.ambient.ipv6, ambient.reconcileIptablesOnStartup off",
        args: &[
            "--set",
            "ambient.enabled=true,ambient.dnsCapture=false,cni.ambient.ipv6=false,\
             ambient.reconcileIptablesOnStartup=false",
        ],
        files: &[K8S, AMB],
        edit: |o| {
            ambient_on(o);
            set(o, CM, "/data/AMBIENT_DNS_CAPTURE", json!("false"));
            set(o, CM, "/data/AMBIENT_IPV6", json!("false"));
            let reconcile = "/data/AMBIENT_RECONCILE_POD_RULES_ON_STARTUP";
            set(o, CM, reconcile, json!("false"));
        },
    },
    Case {
        name: "ambient.enablementSelectors, the cluster-wide opt-out: AMBIENT_ENABLEMENT_SELECTOR as JSON",
        args: &[
            "--set",
            "ambient.enabled=true",
            "--set-json",
            r#"cni.ambient.enablementSelectors=[{"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},"namespaceSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]}}]"#,
        ],
        files: &[K8S, AMB],
        edit: |o| {
            ambient_on(o);
            let terms = r#"[{"namespaceSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]}}]"#;
            set(o, CM, "/data/AMBIENT_ENABLEMENT_SELECTOR", json!(terms));
        },
    },
    Case {
        name: "ambient.enablementSelectors: [] enrolls none, as with Istio",
        args: &["--set", "ambient.enabled=true", "--set-json", "ambient.enablementSelectors=[]"],
        files: &[K8S, AMB],
        edit: |o| {
            ambient_on(o);
            set(o, CM, "/data/AMBIENT_ENABLEMENT_SELECTOR", json!("[]"));
        },
    },
    Case {
        name: "ambient with label mode: both roles; the capabilities and host mounts stay",
        args: &[
            "--set",
            "ambient.enabled=true,cni.repair.labelPods=true,cni.repair.repairPods=false",
        ],
        files: &[K8S, "kubernetes/repair-label-pods.yaml", AMB],
        edit: |o| {
            set(o, CM, "/data/REPAIR_REPAIR_PODS", json!("false"));
            set(o, CM, "/data/REPAIR_LABEL_PODS", json!("true"));
            ambient_on(o);
        },
    },
    Case {
        name: "ambient with repair off: pods list and watch stay (the ambient controller), no Events",
        args: &["--set", "ambient.enabled=true,cni.repair.enabled=false"],
        files: &[K8S, AMB],
        edit: |o| {
            set(o, CM, "/data/REPAIR_ENABLED", json!("false"));
            ambient_on(o);
            let mut rules = repair_off_rules();
            rules[0]["verbs"] = json!(["get", "list", "watch"]);
            set(o, ROLE, "/rules", rules);
        },
    },
    Case {
        name: "ambient with env.PLUGIN_CONFIG_JSON: merged over ambient_enabled, its keys winning",
        args: &[
            VALUES_YAML,
            "ambient:\n  enabled: true\nenv:\n  PLUGIN_CONFIG_JSON: '{\"log_file\": \"/var/run/redirect-cni/plugin.log\"}'\n",
        ],
        files: &[K8S, AMB],
        edit: |o| {
            ambient_on(o);
            let merged = r#"{"ambient_enabled":true,"log_file":"/var/run/redirect-cni/plugin.log"}"#;
            set(o, CM, "/data/PLUGIN_CONFIG_JSON", json!(merged));
        },
    },
    Case {
        name: "OpenShift standalone with ambient: openshift/ambient.yaml",
        args: &[
            "--set",
            openshift_values!(),
            "--set",
            "global.platform=openshift,cni.ambient.enabled=true",
        ],
        files: &[OCP, NAD, "openshift/ambient.yaml"],
        edit: |o| {
            istio_cni_conf(o);
            ambient_on(o);
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
        name: "cni.logging.level -> PLUGIN_LOG_LEVEL and the agent's LOG_OUTPUT_LEVEL",
        args: &["--set", "cni.logging.level=debug,global.logging.level=error"],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/PLUGIN_LOG_LEVEL", json!("debug"));
            set(o, CM, "/data/LOG_OUTPUT_LEVEL", json!("debug"));
        },
    },
    Case {
        name: "global.logging.level -> PLUGIN_LOG_LEVEL and LOG_OUTPUT_LEVEL",
        args: &["--set", "global.logging.level=warn"],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/PLUGIN_LOG_LEVEL", json!("warn"));
            set(o, CM, "/data/LOG_OUTPUT_LEVEL", json!("warn"));
        },
    },
    Case {
        name: "Istio's scope:level list: the agent's whole, the plugin's cni-plugin level",
        args: &["--set-string", "logging.level=default:warn\\,cni-plugin:debug\\,ambient:debug"],
        files: &[K8S],
        edit: |o| {
            set(o, CM, "/data/PLUGIN_LOG_LEVEL", json!("debug"));
            let list = json!("default:warn,cni-plugin:debug,ambient:debug");
            set(o, CM, "/data/LOG_OUTPUT_LEVEL", list);
        },
    },
    Case {
        name: "global.logAsJson: LOG_AS_JSON, the agent's and the plugin's JSON lines",
        args: &["--set", "global.logAsJson=true"],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/LOG_AS_JSON", json!("true")),
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
        name: "standalone without a file name: redirect-cni.conf, network istio-cni",
        args: &["--set", "cni.chained=false"],
        files: &[K8S],
        edit: standalone,
    },
];

/// Chained into the node's config -> our standalone file redirect-cni.conf (0600), whose network
/// is named istio-cni, as Istio's standalone config is.
fn standalone(o: &mut Objects) {
    set(o, CM, "/data/CHAINED_CNI_PLUGIN", json!("false"));
    set(o, CM, "/data/CNI_CONF_NAME", json!("redirect-cni.conf"));
    set(o, CM, "/data/CNI_CONF_GROUP_READ", json!("false"));
    set(o, CM, "/data/CNI_NETWORK_NAME", json!("istio-cni"));
}

/// The host's bin dir: the ConfigMap's CNI_BIN_DIR, the mount and the volume.
fn bin_dir(o: &mut Objects, dir: &str) {
    let mounted = json!(format!("/host{dir}"));
    set(o, CM, "/data/CNI_BIN_DIR", mounted.clone());
    set(o, DS, &format!("{C}/volumeMounts/0/mountPath"), mounted);
    set(
        o,
        DS,
        &format!("{POD}/spec/volumes/0/hostPath/path"),
        json!(dir),
    );
}

fn log_level(o: &mut Objects, level: &str) {
    set(o, CM, "/data/PLUGIN_LOG_LEVEL", json!(level));
}

/// A GKE node's Kubernetes version, as `helm install` sees it there (Istio's chart looks for
/// "-gke" in it).
const GKE: &str = "v1.30.1-gke.1066000";

/// The seeds' own values (issue 31): Istio install commands and values blocks from documents
/// users follow, given to the chart as written (`--values-yaml`: the block as a values file).
const SEEDS: &[Case] = &[
    Case {
        name: "the old istio/cni README: --set excludeNamespaces={} ... --set logLevel=debug",
        args: &[
            "--set",
            "excludeNamespaces={}",
            "--set",
            "hub=registry.example.com/mesh",
            "--set",
            "tag=0.1.0",
            "--set",
            "pullPolicy=IfNotPresent",
            "--set",
            "logLevel=debug",
        ],
        files: &[K8S],
        edit: |o| {
            // helm makes [""] of {}: no namespace excluded, as with Istio's chart.
            set(o, CM, "/data/EXCLUDE_NAMESPACES", json!(""));
            log_level(o, "debug");
            let image = json!("registry.example.com/mesh/redirect:0.1.0");
            set(o, DS, &format!("{C}/image"), image);
            set(o, DS, &format!("{C}/imagePullPolicy"), json!("IfNotPresent"));
        },
    },
    Case {
        name: "the old istio/cni README with --set logLevel=info",
        args: &["--set", "excludeNamespaces={}", "--set", "logLevel=info"],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/EXCLUDE_NAMESPACES", json!("")),
    },
    Case {
        name: "excludeNamespaces with an empty item: dropped",
        args: &["--set", "cni.excludeNamespaces={,istio-system}"],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/EXCLUDE_NAMESPACES", json!("istio-system")),
    },
    Case {
        name: "Istio's OpenShift guide (1.12 to 1.21): cni.* and cni.logLevel=info, no provider",
        args: &[
            "--set",
            "cni.cniBinDir=/var/lib/cni/bin",
            "--set",
            "cni.cniConfDir=/etc/cni/multus/net.d",
            "--set",
            "cni.chained=false",
            "--set",
            "cni.cniConfFileName=istio-cni.conf",
            "--set",
            "cni.excludeNamespaces[0]=istio-system",
            "--set",
            "cni.excludeNamespaces[1]=kube-system",
            "--set",
            "cni.repair.enabled=false",
            "--set",
            "cni.logLevel=info",
        ],
        // The standalone file of deploy/openshift, without the attachment (no provider) and
        // without the SCC (no platform).
        files: &[OCP],
        edit: |o| {
            istio_cni_conf(o);
            without_scc(o);
            set(o, CM, "/data/EXCLUDE_NAMESPACES", json!("istio-system,kube-system"));
            set(o, CM, "/data/REPAIR_ENABLED", json!("false"));
            without_in_place_repair(o);
            set(o, ROLE, "/rules", repair_off_rules());
        },
    },
    Case {
        name: "values block: cniBinDir: \"\" (Istio 1.16 to 1.23's values.yaml)",
        args: &[VALUES_YAML, "cniBinDir: \"\" # Auto-detected based on version; defaults to /opt/cni/bin.\n"],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "values block: cni: cniBinDir: \"\"",
        args: &[VALUES_YAML, "cni:\n  cniBinDir: \"\"\n"],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "Istio's GKE profile values on GKE: cniBinDir \"\" is /home/kubernetes/bin there",
        args: &[
            VALUES_YAML,
            "cni:\n  cniBinDir: \"\"\n  resourceQuotas:\n    enabled: true\nresourceQuotas:\n  enabled: true\n",
            "--kube-version",
            GKE,
        ],
        files: &[K8S, "kubernetes/resourcequota-critical-pods.yaml"],
        edit: |o| bin_dir(o, "/home/kubernetes/bin"),
    },
    Case {
        name: "values block on GKE: cniBinDir: /home/kubernetes/bin",
        args: &[VALUES_YAML, "cniBinDir: /home/kubernetes/bin\n"],
        files: &[K8S],
        edit: |o| bin_dir(o, "/home/kubernetes/bin"),
    },
    Case {
        name: "values block: cniNetnsDir: left empty (null)",
        args: &[VALUES_YAML, "cniNetnsDir: # Defaults to '/var/run/netns'\n"],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "values block: cni: cniNetnsDir: left empty (null)",
        args: &[VALUES_YAML, "cni:\n  cniNetnsDir:\n"],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "values block: chained, provider, untaintNode and repair's flags left empty (null)",
        args: &[
            VALUES_YAML,
            "chained:\nprovider:\ncni:\n  untaintNode:\n  repair:\n    repairPods:\n    deletePods:\n",
        ],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "values block: the three directories \"\"",
        args: &[VALUES_YAML, "cniBinDir: \"\"\ncniConfDir: \"\"\ncniNetnsDir: \"\"\n"],
        files: &[K8S],
        edit: no_edit,
    },
    Case {
        name: "values block: logLevel: debug",
        args: &[VALUES_YAML, "logLevel: debug\n"],
        files: &[K8S],
        edit: |o| log_level(o, "debug"),
    },
    Case {
        name: "values block: cni: logLevel: debug",
        args: &[VALUES_YAML, "cni:\n  logLevel: debug\n"],
        files: &[K8S],
        edit: |o| log_level(o, "debug"),
    },
    Case {
        name: "--set cni.logLevel=debug",
        args: &["--set", "cni.logLevel=debug"],
        files: &[K8S],
        edit: |o| log_level(o, "debug"),
    },
    Case {
        name: "logging.level (the newer name) wins over logLevel, which wins over global",
        args: &[VALUES_YAML, "logLevel: debug\nlogging:\n  level: warn\nglobal:\n  logging:\n    level: error\n"],
        files: &[K8S],
        edit: |o| {
            log_level(o, "warn");
            set(o, CM, "/data/LOG_OUTPUT_LEVEL", json!("warn"));
        },
    },
    Case {
        name: "an old Istio values block: cni.logLevel, psp_cluster_role \"\", excludeNamespaces",
        args: &[
            VALUES_YAML,
            "cni:\n  logLevel: info\n  psp_cluster_role: \"\"\n  excludeNamespaces:\n    - istio-system\n    - kube-system\n",
        ],
        files: &[K8S],
        edit: |o| set(o, CM, "/data/EXCLUDE_NAMESPACES", json!("istio-system,kube-system")),
    },
    Case {
        name: "--set chained=true --set cni.chained=false: the cni. value, as Istio's chart",
        args: &["--set", "chained=true", "--set", "cni.chained=false"],
        files: &[K8S],
        edit: standalone,
    },
    Case {
        name: "values block: chained: true, cni: chained: false",
        args: &[VALUES_YAML, "chained: true\ncni:\n  chained: false\n"],
        files: &[K8S],
        edit: standalone,
    },
    Case {
        name: "OpenShift Service Mesh 3 (profile=openshift) with Multus",
        args: &[
            "--set",
            "profile=openshift",
            "--set",
            "cni.provider=multus",
            "--set",
            "cni.chained=false",
            "--set",
            "cni.cniBinDir=/var/lib/cni/bin",
            "--set",
            "cni.cniConfDir=/etc/cni/multus/net.d",
            "--set",
            "cni.cniConfFileName=istio-cni.conf",
        ],
        files: &[OCP, NAD],
        edit: istio_cni_conf,
    },
    Case {
        name: "cni.env.CNI_NETWORK_NAME renames the network and the attachment (the old names)",
        args: &[
            "--set",
            openshift_values!(),
            "--set",
            "global.platform=openshift,cni.env.CNI_NETWORK_NAME=redirect-cni",
        ],
        files: &[OCP, NAD],
        edit: |o| {
            istio_cni_conf(o);
            set(o, CM, "/data/CNI_NETWORK_NAME", json!("redirect-cni"));
            let mut nad = o
                .remove("NetworkAttachmentDefinition/istio-cni")
                .expect("the plain attachment");
            nad["metadata"]["name"] = json!("redirect-cni");
            o.insert("NetworkAttachmentDefinition/redirect-cni".into(), nad);
        },
    },
    Case {
        name: "OpenShift Service Mesh 3 (global.platform=openshift) with Multus, as a values block",
        args: &[
            VALUES_YAML,
            "global:\n  platform: openshift\ncni:\n  provider: multus\n  chained: false\n  cniBinDir: /var/lib/cni/bin\n  cniConfDir: /etc/cni/multus/net.d\n  cniConfFileName: istio-cni.conf\n",
        ],
        files: &[OCP, NAD],
        edit: istio_cni_conf,
    },
];

/// The platform's flowcontrol.yaml, which every rendering holds unless the case turns
/// `flowControl` off (or renders no cluster-scoped object).
fn with_flow_control(case: &Case) -> Objects {
    let mut expected = plain(case.files);
    let off = case
        .args
        .iter()
        .any(|a| a.contains("flowControl.enabled=false") || a.contains("resourceScope=namespace"));
    if !off {
        let platform = if case.files.iter().any(|f| f.starts_with("openshift/")) {
            "openshift/flowcontrol.yaml"
        } else {
            "kubernetes/flowcontrol.yaml"
        };
        expected.extend(plain(&[platform]));
    }
    expected
}

fn case_problems(cases: &[Case]) -> Vec<String> {
    let mut problems = Vec::new();
    for case in cases {
        let mut expected = with_flow_control(case);
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
    for case in SETTINGS.iter().chain(MODES).chain(AMBIENT).chain(SEEDS) {
        // lint takes values and the Kubernetes version, not --api-versions.
        let dir = tempfile::tempdir().expect("a temporary folder");
        let given = with_values_files(case.args, dir.path());
        let mut args = vec!["lint", chart, "--strict", "--namespace", NS];
        let mut rest = given.iter();
        while let Some(a) = rest.next() {
            let value = rest.next().expect("a flag's value");
            if a != "--api-versions" {
                args.extend([a.as_str(), value.as_str()]);
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
fn ambient_mode_gets_its_settings_the_plugins_field_its_rbac_and_ztunnels_folder() {
    assert_no_problems(case_problems(AMBIENT));
}

/// Without ambient mode nothing of it is rendered: no AMBIENT_* setting, no `ambient_enabled`,
/// no ambient role, no rule on namespaces, no ztunnel folder.
#[test]
fn without_ambient_mode_none_of_it_is_rendered() {
    let cases: &[&[&str]] = &[
        &[],
        &["--set", "ambient.enabled=false"],
        &["--set", "profile=ambient,cni.ambient.enabled=false"],
        &[
            "--set",
            "cni.repair.labelPods=true,cni.repair.repairPods=false",
        ],
        &["--set", "cni.repair.enabled=false"],
        &["--set", "profile=openshift", "--set", openshift_values!()],
        &["--set", "ambient.dnsCapture=false,ambient.ipv6=false"],
    ];
    let mut problems = Vec::new();
    for args in cases {
        let yaml = template(NS, args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let objects = parse(&yaml, "helm template");
        // The FlowSchema's rule matches every namespace of the agents' requests.
        for (key, obj) in objects
            .iter()
            .filter(|(k, _)| *k != "FlowSchema/redirect-cni")
        {
            let text = obj.to_string();
            for word in [
                "AMBIENT_",
                "ambient_enabled",
                "ztunnel",
                "namespaces",
                "ambient",
            ] {
                if text.contains(word) {
                    problems.push(format!("{args:?}: {key} holds {word:?}"));
                }
            }
        }
    }
    assert_no_problems(problems);
}

#[test]
fn istios_value_names_reach_the_installer_and_the_pod() {
    assert_no_problems(case_problems(VALUES));
}

/// The helper the API-server tests copy renders the default, which is the plain manifest.
#[test]
fn render_with_no_values_is_the_plain_kubernetes_manifest() {
    let problems = differences(
        &render(&[]),
        &plain(&[K8S, "kubernetes/flowcontrol.yaml"]),
        NS,
    );
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
        "openshift/flowcontrol.yaml",
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
    let agents = "/spec/rules/0/subjects/0/serviceAccount/namespace";
    let fs = expected
        .get_mut("FlowSchema/redirect-cni")
        .expect("the FlowSchema");
    assert_eq!(fs.pointer(agents), Some(&json!(NS)), "the SET-ME line");
    *fs.pointer_mut(agents).unwrap() = json!(ns);
    // The NetworkAttachmentDefinition stays in "default", where every namespace may use it.
    assert_eq!(
        expected["NetworkAttachmentDefinition/istio-cni"]["metadata"]["namespace"],
        "default"
    );
    assert_no_problems(differences(&yaml, &expected, ns));
}

/// Istio's chart also reads its names without the `cni.` prefix (an Istio values file has them
/// at the top level); so does this one.
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
        (
            &["--set", "ambient.enabled=true,ambient.ipv6=false"],
            &["--set", "cni.ambient.enabled=true,cni.ambient.ipv6=false"],
        ),
        // The `cni.` value wins, as in Istio's chart (`a_cni_value_wins_...` below).
        (
            &["--set", "cniNetnsDir=/a,cni.cniNetnsDir=/run/netns"],
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
        // A selector the agent could not compile: an operator Kubernetes does not have, a
        // misspelt field (Go would ignore it and match every pod).
        (
            &[
                "--set",
                "profile=ambient",
                "--set-json",
                r#"cni.ambient.enablementSelectors=[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Equals"}]}}]"#,
            ],
            "operator",
        ),
        (
            &[
                "--set",
                "profile=ambient",
                "--set-json",
                r#"cni.ambient.enablementSelectors=[{"podselector":{}}]"#,
            ],
            "podselector",
        ),
        (&["--set-string", "ambient.enabled=true"], "ambient.enabled"),
        (
            &["--set", "cni.ambient.dnsCapture=no"],
            "cni.ambient.dnsCapture",
        ),
        (
            &[
                VALUES_YAML,
                "ambient:\n  enabled: true\nenv:\n  PLUGIN_CONFIG_JSON: '[\"log_file\"]'\n",
            ],
            "env.PLUGIN_CONFIG_JSON=[\"log_file\"]: not a JSON object",
        ),
        // A platform Istio's chart does not know either.
        (
            &["--set", "global.platform=k8s"],
            "global.platform=k8s: unknown platform",
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
        (&["--set", "logLevel=trace"], "logLevel"),
        (&["--set", "cni.logLevel=verbose"], "cni.logLevel"),
        // Istio's old RoleBinding for a PodSecurityPolicy role: PSP is gone (Kubernetes 1.25),
        // and a binding that grants nothing is not made silently.
        (
            &["--set", "psp_cluster_role=psp-privileged"],
            "psp_cluster_role=psp-privileged: PodSecurityPolicy was removed in Kubernetes 1.25",
        ),
        (
            &["--set", "cni.psp_cluster_role=psp-privileged"],
            "psp_cluster_role=psp-privileged: PodSecurityPolicy was removed in Kubernetes 1.25",
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

/// Issue 31: the Istio commands and values blocks users follow work as written.
#[test]
fn the_seeds_own_values_render_what_they_mean() {
    assert_no_problems(case_problems(SEEDS));
}

/// Every name read both at the top level and under `cni.`: the `cni.` value wins, as in Istio's
/// chart (1.24 and 1.30 merge `.Values.cni` over the top level), maps merged key by key.
#[test]
fn a_cni_value_wins_over_the_same_name_at_the_top_level() {
    // (both given, the same rendering as); None: the `cni.` arguments alone.
    let cases: &[(&[&str], Option<&[&str]>)] = &[
        (&["--set", "hub=a.example,cni.hub=b.example"], None),
        (&["--set", "tag=1,cni.tag=2"], None),
        (&["--set", "image=a,cni.image=b"], None),
        (&["--set", "pullPolicy=Always,cni.pullPolicy=Never"], None),
        (&["--set", "cniBinDir=/a,cni.cniBinDir=/b"], None),
        (&["--set", "cniConfDir=/a,cni.cniConfDir=/b"], None),
        (
            &["--set", "cniConfFileName=a.conf,cni.cniConfFileName=b.conf"],
            None,
        ),
        (&["--set", "cniNetnsDir=/a,cni.cniNetnsDir=/b"], None),
        (
            &["--set", "excludeNamespaces={a},cni.excludeNamespaces={b}"],
            None,
        ),
        (
            &["--set", "chained=true", "--set", "cni.chained=false"],
            None,
        ),
        (
            &[
                "--set",
                "chained=false,provider=multus,cni.provider=default",
            ],
            Some(&["--set", "chained=false"]),
        ),
        (
            &["--set", "logging.level=debug,cni.logging.level=error"],
            None,
        ),
        (&["--set", "logLevel=debug,cni.logLevel=warn"], None),
        (
            &["--set", "repair.enabled=false,cni.repair.enabled=true"],
            Some(&[]),
        ),
        (
            &[
                "--set",
                "repair.repairPods=true,cni.repair.repairPods=false",
            ],
            None,
        ),
        (
            &[
                "--set",
                "repair.deletePods=true,repair.repairPods=false,cni.repair.deletePods=false",
            ],
            Some(&["--set", "cni.repair.repairPods=false"]),
        ),
        (
            &[
                "--set",
                "repair.initContainerName=a,cni.repair.initContainerName=b",
            ],
            None,
        ),
        (
            &["--set", "untaintNode=true,cni.untaintNode=false"],
            Some(&[]),
        ),
        (
            &[
                "--set",
                "resources.requests.cpu=1,cni.resources.requests.cpu=2",
            ],
            None,
        ),
        (
            &[
                "--set-json",
                r#"tolerations=[{"key":"a","operator":"Exists"}]"#,
                "--set-json",
                r#"cni.tolerations=[{"key":"b","operator":"Exists"}]"#,
            ],
            Some(&[
                "--set-json",
                r#"cni.tolerations=[{"key":"b","operator":"Exists"}]"#,
            ]),
        ),
        (
            &[
                "--set-json",
                r#"affinity={"podAffinity":{}}"#,
                "--set-json",
                r#"cni.affinity={"podAntiAffinity":{}}"#,
            ],
            Some(&[
                "--set-json",
                r#"affinity={"podAffinity":{},"podAntiAffinity":{}}"#,
            ]),
        ),
        (
            &["--set", "podAnnotations.a=x,cni.podAnnotations.a=y"],
            None,
        ),
        (&["--set", "podLabels.a=x,cni.podLabels.a=y"], None),
        (
            &["--set", "daemonSetLabels.a=x,cni.daemonSetLabels.a=y"],
            None,
        ),
        (
            &[
                "--set",
                "seLinuxOptions.level=s0,cni.seLinuxOptions.level=s1",
            ],
            None,
        ),
        (
            &[
                "--set",
                "updateStrategy.rollingUpdate.maxUnavailable=2,\
                 cni.updateStrategy.rollingUpdate.maxUnavailable=3",
            ],
            None,
        ),
        (
            &[
                "--set",
                "terminationGracePeriodSeconds=5,cni.terminationGracePeriodSeconds=6",
            ],
            None,
        ),
        (
            &[
                "--set",
                "resourceQuotas.enabled=true,resourceQuotas.pods=7,cni.resourceQuotas.pods=8",
            ],
            Some(&[
                "--set",
                "cni.resourceQuotas.enabled=true,cni.resourceQuotas.pods=8",
            ]),
        ),
        (&["--set", "env.A=x,cni.env.A=y"], None),
        (
            &["--set", "ambient.enabled=false,cni.ambient.enabled=true"],
            None,
        ),
        (
            &[
                "--set",
                "ambient.enabled=true,ambient.dnsCapture=true,cni.ambient.dnsCapture=false",
            ],
            Some(&[
                "--set",
                "cni.ambient.enabled=true,cni.ambient.dnsCapture=false",
            ]),
        ),
    ];
    // The half of the arguments given under `cni.` (`cni`) or at the top level: a `--set`
    // list is split at its commas, a `--set-json` value taken whole.
    let half = |args: &[&str], cni: bool| -> Vec<String> {
        let mut out = Vec::new();
        for pair in args.chunks(2) {
            let items: Vec<&str> = if pair[0] == "--set" {
                pair[1].split(',').collect()
            } else {
                vec![pair[1]]
            };
            let kept: Vec<&str> = items
                .into_iter()
                .filter(|kv| kv.starts_with("cni.") == cni)
                .collect();
            if !kept.is_empty() {
                out.push(pair[0].to_string());
                out.push(kept.join(","));
            }
        }
        out
    };
    let mut problems = Vec::new();
    for (both, same_as) in cases {
        let cni_only = half(both, true);
        let same_as: Vec<&str> = match same_as {
            Some(s) => s.to_vec(),
            None => cni_only.iter().map(String::as_str).collect(),
        };
        let top_only = half(both, false);
        let top_only: Vec<&str> = top_only.iter().map(String::as_str).collect();
        let got = match template(NS, both) {
            Ok(y) => y,
            Err(e) => {
                problems.push(format!("{both:?}: {e}"));
                continue;
            }
        };
        let want = template(NS, &same_as).unwrap_or_else(|e| panic!("{same_as:?}: {e}"));
        let top = template(NS, &top_only).unwrap_or_else(|e| panic!("{top_only:?}: {e}"));
        if parse(&top, "top") == parse(&got, "both") {
            problems.push(format!(
                "{both:?}: renders as the top-level value alone {top_only:?}"
            ));
        }
        problems.extend(
            differences(&got, &parse(&want, "want"), NS)
                .into_iter()
                .map(|d| format!("{both:?} (expected as {same_as:?}): {d}")),
        );
    }
    assert_no_problems(problems);
}

// --- what Istio's chart makes of the same values ---------------------------------------------------

/// The settings a rendering gives the node: the ConfigMap's (chained, excluded namespaces, the
/// config file, the repair flags, ambient mode and its switches), the DaemonSet's host folders,
/// and the attachment. The same names for Istio's chart and this one.
fn node_settings(yaml: &str, origin: &str) -> BTreeMap<&'static str, String> {
    let objects = parse(yaml, origin);
    let of_kind = |kind: &str| {
        let found: Vec<&Value> = objects
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{kind}/")))
            .map(|(_, v)| v)
            .collect();
        found
    };
    let cm = of_kind("ConfigMap");
    assert_eq!(cm.len(), 1, "{origin}: one ConfigMap");
    let data = &cm[0]["data"];
    let s = |k: &str| data[k].as_str().unwrap_or("").to_string();
    let mut out = BTreeMap::new();
    out.insert("chained", s("CHAINED_CNI_PLUGIN"));
    let exclude: Vec<String> = s("EXCLUDE_NAMESPACES")
        .split(',')
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    out.insert("exclude", exclude.join(","));
    out.insert("conf_file", s("CNI_CONF_NAME"));
    out.insert(
        "repair",
        format!(
            "enabled={} repair={} delete={} label={}",
            s("REPAIR_ENABLED"),
            s("REPAIR_REPAIR_PODS"),
            s("REPAIR_DELETE_PODS"),
            s("REPAIR_LABEL_PODS")
        ),
    );
    // Istio writes AMBIENT_ENABLED "false"; this chart nothing without ambient mode.
    let ambient = s("AMBIENT_ENABLED");
    out.insert(
        "ambient",
        if ambient.is_empty() {
            "false".into()
        } else {
            ambient
        },
    );
    out.insert("ambient_dns", s("AMBIENT_DNS_CAPTURE"));
    out.insert("ambient_ipv6", s("AMBIENT_IPV6"));
    out.insert(
        "ambient_reconcile",
        s("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP"),
    );
    // Our own list file: Istio writes "false" without it, this chart nothing.
    let owned = s("ISTIO_OWNED_CNI_CONFIG");
    out.insert(
        "owned",
        if owned.is_empty() {
            "false".into()
        } else {
            owned
        },
    );
    out.insert("owned_name", s("ISTIO_OWNED_CNI_CONF_FILENAME"));
    // The terms the agent enrolls by, as it reads them (Istio's chart renders YAML, this one
    // JSON, or nothing at Istio's default, the agent's own), in one spelling.
    let terms = s("AMBIENT_ENABLEMENT_SELECTOR");
    let selectors: redirect_istio::enablement::EnablementSelectors = if terms.trim().is_empty() {
        Default::default()
    } else {
        yaml_serde::from_str(&terms).unwrap_or_else(|e| panic!("{origin}: {terms}: {e}"))
    };
    out.insert(
        "ambient_selectors",
        serde_json::to_string(&selectors).expect("JSON"),
    );
    out.insert("quota", (!of_kind("ResourceQuota").is_empty()).to_string());
    let ds = of_kind("DaemonSet");
    assert_eq!(ds.len(), 1, "{origin}: one DaemonSet");
    let container = &ds[0]["spec"]["template"]["spec"]["containers"][0];
    let selinux = &container["securityContext"]["seLinuxOptions"]["type"];
    out.insert("selinux", selinux.as_str().unwrap_or("").to_string());
    for v in ds[0]["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
    {
        let key = match v["name"].as_str().unwrap_or("") {
            "cni-bin-dir" => "bin_dir",
            "cni-net-dir" => "conf_dir",
            "netns-dir" | "cni-netns-dir" => "netns_dir",
            "host-proc" | "cni-host-procfs" => "host_proc",
            "ztunnel-dir" | "cni-ztunnel-sock-dir" => "ztunnel_dir",
            _ => continue,
        };
        let path = v["hostPath"]["path"].as_str().unwrap_or("");
        out.insert(key, path.to_string());
    }
    let nads: Vec<String> = of_kind("NetworkAttachmentDefinition")
        .iter()
        .map(|n| {
            format!(
                "{}/{}",
                n["metadata"]["namespace"].as_str().unwrap_or(""),
                n["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    out.insert("nad", nads.join(","));
    out
}

/// One of the seeds' values given to Istio's chart and to this one, with what Istio's renders
/// for the node (`node_settings`), recorded from Istio's own charts, releases 1.24.6, 1.30.3
/// and 1.31.0-rc.0 (`versions`). Settings not listed differ on purpose or mean nothing there (the note says).
struct AsIstio {
    name: &'static str,
    args: &'static [&'static str],
    versions: &'static [&'static str],
    istio: &'static [(&'static str, &'static str)],
}

const BOTH: &[&str] = &["1.24.6", "1.30.3"];

const AS_ISTIO: &[AsIstio] = &[
    AsIstio {
        name: "the old istio/cni README's line",
        args: &[
            "--set",
            "excludeNamespaces={}",
            "--set",
            "hub=registry.example.com/mesh",
            "--set",
            "tag=0.1.0",
            "--set",
            "pullPolicy=IfNotPresent",
            "--set",
            "logLevel=debug",
        ],
        versions: BOTH,
        // (Istio 1.24 and 1.30 no longer read logLevel: the plugin's level is theirs. Istio up
        // to 1.22 wrote it into the plugin's log_level, which is what this chart does.)
        istio: &[
            ("chained", "true"),
            ("exclude", ""),
            ("bin_dir", "/opt/cni/bin"),
            ("conf_dir", "/etc/cni/net.d"),
            ("netns_dir", "/var/run/netns"),
        ],
    },
    AsIstio {
        name: "excludeNamespaces with an empty item",
        args: &["--set", "cni.excludeNamespaces={,istio-system}"],
        versions: BOTH,
        istio: &[("exclude", "istio-system")],
    },
    AsIstio {
        name: "Istio's OpenShift guide (1.12 to 1.21)",
        args: &[
            "--set",
            "cni.cniBinDir=/var/lib/cni/bin",
            "--set",
            "cni.cniConfDir=/etc/cni/multus/net.d",
            "--set",
            "cni.chained=false",
            "--set",
            "cni.cniConfFileName=istio-cni.conf",
            "--set",
            "cni.excludeNamespaces[0]=istio-system",
            "--set",
            "cni.excludeNamespaces[1]=kube-system",
            "--set",
            "cni.repair.enabled=false",
            "--set",
            "cni.logLevel=info",
        ],
        versions: BOTH,
        istio: &[
            ("chained", "false"),
            ("exclude", "istio-system,kube-system"),
            ("conf_file", "istio-cni.conf"),
            ("bin_dir", "/var/lib/cni/bin"),
            ("conf_dir", "/etc/cni/multus/net.d"),
            ("repair", "enabled=false repair=true delete=false label=false"),
            ("nad", ""),
        ],
    },
    AsIstio {
        name: "cniBinDir: \"\"",
        args: &[VALUES_YAML, "cniBinDir: \"\"\n"],
        versions: BOTH,
        istio: &[("bin_dir", "/opt/cni/bin")],
    },
    AsIstio {
        name: "Istio's GKE profile values on GKE",
        args: &[
            VALUES_YAML,
            "cni:\n  cniBinDir: \"\"\n  resourceQuotas:\n    enabled: true\nresourceQuotas:\n  enabled: true\n",
            "--kube-version",
            GKE,
        ],
        versions: BOTH,
        istio: &[("bin_dir", "/home/kubernetes/bin")],
    },
    AsIstio {
        name: "cniBinDir: /home/kubernetes/bin",
        args: &[VALUES_YAML, "cniBinDir: /home/kubernetes/bin\n"],
        versions: BOTH,
        istio: &[("bin_dir", "/home/kubernetes/bin")],
    },
    AsIstio {
        // Istio 1.30 renders an empty hostPath, which the API server refuses; 1.24 the default.
        name: "cniNetnsDir: null",
        args: &[VALUES_YAML, "cniNetnsDir:\n"],
        versions: &["1.24.6"],
        istio: &[("netns_dir", "/var/run/netns")],
    },
    AsIstio {
        name: "cni: cniNetnsDir: null",
        args: &[VALUES_YAML, "cni:\n  cniNetnsDir:\n"],
        versions: &["1.24.6"],
        istio: &[("netns_dir", "/var/run/netns")],
    },
    AsIstio {
        name: "chained=true, cni.chained=false",
        args: &["--set", "chained=true", "--set", "cni.chained=false"],
        versions: BOTH,
        istio: &[("chained", "false")],
    },
    AsIstio {
        name: "the directories and the file at both levels",
        args: &[
            "--set",
            "cniBinDir=/a,cni.cniBinDir=/b,cniConfDir=/c,cni.cniConfDir=/d",
            "--set",
            "cniConfFileName=a.conf,cni.cniConfFileName=b.conf,cniNetnsDir=/e,cni.cniNetnsDir=/f",
            "--set",
            "excludeNamespaces={a},cni.excludeNamespaces={b}",
        ],
        versions: BOTH,
        istio: &[
            ("bin_dir", "/b"),
            ("conf_dir", "/d"),
            ("conf_file", "b.conf"),
            ("netns_dir", "/f"),
            ("exclude", "b"),
        ],
    },
    AsIstio {
        name: "repair at both levels: merged key by key",
        args: &[
            "--set",
            "repair.deletePods=true,repair.repairPods=false,cni.repair.deletePods=false",
        ],
        versions: BOTH,
        istio: &[("repair", "enabled=true repair=false delete=false label=false")],
    },
    AsIstio {
        name: "OpenShift Service Mesh 3 (global.platform=openshift) with Multus",
        args: &[
            "--set",
            "global.platform=openshift",
            "--set",
            "cni.provider=multus,cni.chained=false,cni.cniBinDir=/var/lib/cni/bin",
            "--set",
            "cni.cniConfDir=/etc/cni/multus/net.d,cni.cniConfFileName=istio-cni.conf",
        ],
        versions: BOTH,
        istio: &[
            ("chained", "false"),
            ("conf_file", "istio-cni.conf"),
            ("bin_dir", "/var/lib/cni/bin"),
            ("conf_dir", "/etc/cni/multus/net.d"),
            ("nad", "default/istio-cni"),
        ],
    },
    AsIstio {
        name: "profile=ambient",
        args: &["--set", "profile=ambient"],
        versions: BOTH,
        istio: &[
            ("ambient", "true"),
            ("ambient_ipv6", "true"),
            ("host_proc", "/proc"),
            ("ztunnel_dir", "/var/run/ztunnel"),
        ],
    },
    AsIstio {
        // (Istio 1.24: DNS not captured and no reconcile setting; 1.29 made both true.)
        name: "profile=ambient: DNS captured, the rules reconciled at start",
        args: &["--set", "profile=ambient"],
        versions: &["1.30.3"],
        istio: &[("ambient_dns", "true"), ("ambient_reconcile", "true")],
    },
    AsIstio {
        // (Istio 1.24 reads the top-level profile only.)
        name: "global.profile=ambient",
        args: &["--set", "global.profile=ambient"],
        versions: &["1.30.3"],
        istio: &[("ambient", "true"), ("ztunnel_dir", "/var/run/ztunnel")],
    },
    AsIstio {
        name: "profile=ambient, cni.ambient.enabled=false",
        args: &["--set", "profile=ambient,cni.ambient.enabled=false"],
        versions: BOTH,
        istio: &[("ambient", "false"), ("ztunnel_dir", "(none)")],
    },
    AsIstio {
        name: "profile=ambient, ambient.enabled=false: the profile's cni.ambient.enabled wins",
        args: &["--set", "profile=ambient,ambient.enabled=false"],
        versions: BOTH,
        istio: &[("ambient", "true"), ("ztunnel_dir", "/var/run/ztunnel")],
    },
    AsIstio {
        name: "ambient.enabled with label mode: the host's /proc stays",
        args: &[
            "--set",
            "ambient.enabled=true,repair.repairPods=false,repair.labelPods=true",
        ],
        versions: BOTH,
        istio: &[
            ("ambient", "true"),
            ("repair", "enabled=true repair=false delete=false label=true"),
            ("host_proc", "/proc"),
            ("ztunnel_dir", "/var/run/ztunnel"),
        ],
    },
    AsIstio {
        name: "ambient's three switches off",
        args: &[
            "--set",
            "cni.ambient.enabled=true,ambient.dnsCapture=false,cni.ambient.ipv6=false",
            "--set",
            "ambient.reconcileIptablesOnStartup=false",
        ],
        versions: &["1.30.3"],
        istio: &[
            ("ambient", "true"),
            ("ambient_dns", "false"),
            ("ambient_ipv6", "false"),
            ("ambient_reconcile", "false"),
        ],
    },
    AsIstio {
        name: "ambient.enablementSelectors: the cluster-wide opt-out (Istio 1.31's values)",
        args: &[
            "--set",
            "profile=ambient",
            "--set-json",
            r#"ambient.enablementSelectors=[{"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},"namespaceSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]}}]"#,
        ],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("ambient", "true"),
            (
                "ambient_selectors",
                r#"[{"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},"namespaceSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]}}]"#,
            ),
        ],
    },
    AsIstio {
        name: "istioOwnedCNIConfig with its file name (Istio 1.31's values)",
        args: &[
            "--set",
            "profile=ambient,istioOwnedCNIConfig=true,istioOwnedCNIConfigFileName=01-mesh.conflist",
        ],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("owned", "true"),
            ("owned_name", "01-mesh.conflist"),
            ("chained", "true"),
        ],
    },
    AsIstio {
        name: "global.platform=gke: Istio 1.31's platform profile",
        args: &["--set", "global.platform=gke"],
        versions: &["1.31.0-rc.0"],
        istio: &[("bin_dir", "/opt/cni/bin"), ("conf_dir", "/etc/cni/net.d"), ("quota", "true")],
    },
    AsIstio {
        name: "global.platform=k3s",
        args: &["--set", "global.platform=k3s"],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("bin_dir", "/var/lib/rancher/k3s/data/cni"),
            ("conf_dir", "/var/lib/rancher/k3s/agent/etc/cni/net.d"),
            ("chained", "true"),
            ("quota", "false"),
        ],
    },
    AsIstio {
        name: "global.platform=k3d",
        args: &["--set", "global.platform=k3d"],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("bin_dir", "/bin"),
            ("conf_dir", "/var/lib/rancher/k3s/agent/etc/cni/net.d"),
        ],
    },
    AsIstio {
        name: "global.platform=microk8s",
        args: &["--set", "global.platform=microk8s"],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("bin_dir", "/var/snap/microk8s/current/opt/cni/bin"),
            ("conf_dir", "/var/snap/microk8s/current/args/cni-network"),
        ],
    },
    AsIstio {
        name: "global.platform=minikube",
        args: &["--set", "global.platform=minikube"],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("bin_dir", "/opt/cni/bin"),
            ("netns_dir", "/var/run/docker/netns"),
        ],
    },
    AsIstio {
        name: "global.platform=openshift: Multus's folders, standalone istio-cni.conf, spc_t",
        args: &["--set", "global.platform=openshift"],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("bin_dir", "/var/lib/cni/bin"),
            ("conf_dir", "/etc/cni/multus/net.d"),
            ("chained", "false"),
            ("conf_file", "istio-cni.conf"),
            ("selinux", "spc_t"),
            ("nad", "default/istio-cni"),
        ],
    },
    AsIstio {
        name: "a value of the user's cni. wins over the platform's, which wins over the top level",
        args: &[
            "--set",
            "global.platform=k3s,cni.cniBinDir=/opt/k3s/bin,cniConfDir=/etc/ignored",
        ],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("bin_dir", "/opt/k3s/bin"),
            ("conf_dir", "/var/lib/rancher/k3s/agent/etc/cni/net.d"),
        ],
    },
    AsIstio {
        name: "istioOwnedCNIConfig off (Istio 1.31's default)",
        args: &["--set", "profile=ambient"],
        versions: &["1.31.0-rc.0"],
        istio: &[("owned", "false"), ("owned_name", "")],
    },
    AsIstio {
        name: "profile=ambient, Istio's default selectors (Istio 1.31)",
        args: &["--set", "profile=ambient"],
        versions: &["1.31.0-rc.0"],
        istio: &[
            ("ambient", "true"),
            (
                "ambient_selectors",
                r#"[{"podSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}},"namespaceSelector":{}},{"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},"namespaceSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}}}]"#,
            ),
        ],
    },
    AsIstio {
        name: "Istio's ambient values block",
        args: &[VALUES_YAML, ISTIO_AMBIENT_VALUES],
        versions: &["1.30.3"],
        istio: &[
            ("ambient", "true"),
            ("ambient_dns", "true"),
            ("ambient_ipv6", "true"),
            ("ambient_reconcile", "true"),
            ("host_proc", "/proc"),
            ("ztunnel_dir", "/var/run/ztunnel"),
        ],
    },
];

/// Istio's released charts, when the environment names the folder they were extracted into
/// (`ISTIO_RELEASES_DIR`, holding `istio-<version>/manifests/charts/istio-cni`): the records
/// above are then checked against them. Without it, only the records are used.
fn istio_chart(version: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("ISTIO_RELEASES_DIR")?;
    let chart = PathBuf::from(dir)
        .join(format!("istio-{version}"))
        .join("manifests/charts/istio-cni");
    assert!(
        chart.join("Chart.yaml").is_file(),
        "ISTIO_RELEASES_DIR is set, but {} is not Istio's istio-cni chart",
        chart.display()
    );
    Some(chart)
}

/// The seeds' values mean for the node what they mean to Istio's chart: the same host folders,
/// chaining, file, exclusions, repair flags and attachment.
#[test]
fn the_seeds_own_values_give_the_node_what_istios_chart_gives_it() {
    let mut problems = Vec::new();
    let mut checked_with_istio = 0;
    for case in AS_ISTIO {
        let ours = match template(NS, case.args) {
            Ok(yaml) => node_settings(&yaml, case.name),
            Err(e) => {
                problems.push(format!("{}: helm template failed: {e}", case.name));
                continue;
            }
        };
        for (key, want) in case.istio {
            let got = ours.get(key).map(String::as_str).unwrap_or("(none)");
            if got != *want {
                problems.push(format!(
                    "{}: {key} is {got:?}, Istio's chart gives {want:?}",
                    case.name
                ));
            }
        }
        for version in case.versions {
            let Some(chart) = istio_chart(version) else {
                continue;
            };
            checked_with_istio += 1;
            let yaml = template_of(&chart, "istio-cni", NS, case.args)
                .unwrap_or_else(|e| panic!("{}: Istio {version}'s chart: {e}", case.name));
            let istio = node_settings(&yaml, version);
            for (key, want) in case.istio {
                let got = istio.get(key).map(String::as_str).unwrap_or("(none)");
                if got != *want {
                    problems.push(format!(
                        "{}: the record says Istio {version} gives {key} {want:?}, it renders {got:?}",
                        case.name
                    ));
                }
            }
        }
    }
    if checked_with_istio == 0 {
        eprintln!(
            "NOTICE: compared with the records of Istio's charts only; set ISTIO_RELEASES_DIR to \
             check the records against the charts themselves"
        );
    }
    assert_no_problems(problems);
}

// --- Multus: an attachment without a config finds our file by its network name ---------------

/// Multus's rule for a NetworkAttachmentDefinition with an empty spec (its
/// GetCNIConfigFromFile): among the files of `conf_dir` ending in .conf, .json or .conflist, in
/// libcni's order (by file name), the first whose "name" is the attachment's; a .conf (or .json)
/// must also have a "type". A file that does not load fails the lookup, as in Multus.
fn multus_config_for(conf_dir: &Path, name: &str) -> Result<(PathBuf, Value), String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(conf_dir)
        .map_err(|e| format!("No networks found in {}: {e}", conf_dir.display()))?
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| !p.is_dir())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("conf" | "json" | "conflist")
            )
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("No networks found in {}", conf_dir.display()));
    }
    for file in files {
        let text = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let conf: Value = serde_json::from_slice(&text)
            .map_err(|e| format!("Error loading CNI config file {}: {e}", file.display()))?;
        let list = file.extension().is_some_and(|e| e == "conflist");
        if list {
            if conf["name"].as_str().is_none() || !conf["plugins"].is_array() {
                return Err(format!(
                    "Error loading CNI conflist file {}",
                    file.display()
                ));
            }
        } else if conf["type"].as_str().is_none_or(str::is_empty) {
            return Err(format!(
                "Error loading CNI config file {}: missing 'type'",
                file.display()
            ));
        }
        if conf["name"] == name {
            return Ok((file, conf));
        }
    }
    Err(format!(
        "no network available in the name {name} in cni dir {}",
        conf_dir.display()
    ))
}

/// The attachment names of a pod's `k8s.v1.cni.cncf.io/networks` annotation (the comma form:
/// `[<namespace>/]<name>[@<interface>]`), as Multus reads them: (namespace, name).
fn requested_networks(annotation: &str, pod_namespace: &str) -> Vec<(String, String)> {
    annotation
        .split(',')
        .map(str::trim)
        .map(|item| {
            let item = item.split('@').next().unwrap_or(item);
            match item.split_once('/') {
                Some((ns, name)) => (ns.to_string(), name.to_string()),
                None => (pod_namespace.to_string(), item.to_string()),
            }
        })
        .collect()
}

/// The node agent (this build's `redirect-cni-node`) with a rendering's ConfigMap as its
/// environment, on the temporary node folders of `node` (`cni_testkit::install_args`:
/// standalone, net/, bin/, run/; the flags win over the ConfigMap's folders), without the
/// repair controller (no API server here) or endpoints. `extra` changes the environment.
fn start_agent(data: &Value, node: &Path, extra: &[(&str, Option<&str>)]) -> std::process::Child {
    let sa = node.join("sa");
    std::fs::create_dir_all(&sa).expect("the service account folder");
    std::fs::write(sa.join("token"), "t0k3n\n").expect("a token");
    std::fs::write(sa.join("ca.crt"), "-----BEGIN CERTIFICATE-----\n").expect("a CA");
    let mut env: BTreeMap<String, String> = data
        .as_object()
        .expect("the ConfigMap's data")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().expect("a string").to_string()))
        .collect();
    for (k, v) in [
        ("POD_NAMESPACE", Some(NS)),
        ("KUBERNETES_SERVICE_HOST", Some("10.96.0.1")),
        ("REPAIR_ENABLED", Some("false")),
        ("MONITORING_PORT", Some("0")),
    ]
    .iter()
    .chain(extra)
    {
        match v {
            Some(v) => env.insert(k.to_string(), v.to_string()),
            None => env.remove(*k),
        };
    }
    Command::new(cni_testkit::node_bin())
        .args(cni_testkit::install_args(node))
        .arg("--service-account-dir")
        .arg(&sa)
        .env_clear()
        .envs(&env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running redirect-cni-node")
}

/// SIGTERM, as kubelet stops the pod: its exit status and log.
fn stop_agent(child: std::process::Child) -> (Option<i32>, String) {
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(kill.success(), "kill -TERM failed");
    let out = child.wait_with_output().expect("the agent's exit");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits (at most 20 s) until `file` holds a config of type redirect-cni (the installer writes
/// a temporary file and renames it into place).
fn wait_for_our_config(file: &Path) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(20) {
        let ours = std::fs::read(file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v["type"] == "redirect-cni");
        if ours {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// OpenShift Service Mesh 3's Multus setup: Istio's injector annotates pods with
/// `k8s.v1.cni.cncf.io/networks: istio-cni` (or `default/istio-cni`), and the attachment of that
/// name (the chart's in "default", or one per namespace) has no config, so Multus runs the config
/// of its folder whose network name is istio-cni. The chart rendered with the OSSM values, the
/// real node agent run with its ConfigMap on temporary node folders, and Multus's lookup applied
/// to the folder: it finds our file. With the old naming (network redirect-cni) it would not.
#[test]
fn an_istio_cni_attachment_without_config_runs_our_plugin_under_multus() {
    let yaml = template(
        NS,
        SEEDS
            .iter()
            .find(|c| c.name.contains("profile=openshift"))
            .unwrap()
            .args,
    )
    .unwrap_or_else(|e| panic!("helm template: {e}"));
    let objects = parse(&yaml, "OSSM values");
    let data = &objects[CM]["data"];
    let nads: Vec<&Value> = objects
        .iter()
        .filter(|(k, _)| k.starts_with("NetworkAttachmentDefinition/"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(nads.len(), 1, "one attachment: {:?}", objects.keys());
    let nad = nads[0];
    assert!(
        nad.get("spec").is_none(),
        "the attachment carries no config: {nad}"
    );
    let nad_ref = format!(
        "{}/{}",
        nad["metadata"]["namespace"].as_str().unwrap_or(""),
        nad["metadata"]["name"].as_str().unwrap_or("")
    );
    // What Istio's injector writes, and the attachment each entry names: the chart's (in
    // "default"), or one of the same name and no config in the pod's namespace ("shop").
    for annotation in [
        "istio-cni",
        "default/istio-cni",
        "macvlan-conf, default/istio-cni",
    ] {
        let (ns, name) = requested_networks(annotation, "shop").pop().unwrap();
        assert_eq!(name, "istio-cni", "{annotation}");
        if ns == "default" {
            assert_eq!(
                nad_ref, "default/istio-cni",
                "the chart's attachment for {annotation:?}"
            );
        }
    }

    // A node with Multus's own config and the cluster network's in the folder.
    let node = tempfile::tempdir().expect("a temporary folder");
    let net = node.path().join("net");
    std::fs::create_dir_all(&net).unwrap();
    let multus = json!({"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus"});
    std::fs::write(net.join("00-multus.conf"), multus.to_string()).unwrap();
    let ovn =
        json!({"cniVersion": "0.4.0", "name": "ovn-kubernetes", "type": "ovn-k8s-cni-overlay"});
    std::fs::write(net.join("10-ovn-kubernetes.conf"), ovn.to_string()).unwrap();

    let conf_name = data["CNI_CONF_NAME"]
        .as_str()
        .expect("the config file's name");
    let agent = start_agent(data, node.path(), &[]);
    let installed = wait_for_our_config(&net.join(conf_name));
    let found = multus_config_for(&net, "istio-cni");
    let (code, log) = stop_agent(agent);
    assert!(
        installed,
        "no config of ours in 20 s; the agent's log:\n{log}"
    );
    assert_eq!(code, Some(0), "the agent's log:\n{log}");
    let (file, conf) = found.unwrap_or_else(|e| panic!("Multus: {e}"));
    assert_eq!(conf["type"], "redirect-cni", "{}: {conf}", file.display());
    assert_eq!(file, net.join(conf_name), "the ConfigMap's file");
    assert!(!net.join(conf_name).exists(), "removed on SIGTERM");

    // Without CNI_NETWORK_NAME (a ConfigMap of an earlier chart, or the installer run by hand):
    // the agent's default is Istio's name too, so Multus still finds istio-cni. (The default
    // was redirect-cni: Multus then found no network istio-cni and failed every pod's ADD.)
    let node = tempfile::tempdir().expect("a temporary folder");
    let net = node.path().join("net");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("00-multus.conf"), multus.to_string()).unwrap();
    let agent = start_agent(data, node.path(), &[("CNI_NETWORK_NAME", None)]);
    let installed = wait_for_our_config(&net.join(conf_name));
    let found = multus_config_for(&net, "istio-cni");
    let by_old_name = multus_config_for(&net, "redirect-cni");
    let (code, log) = stop_agent(agent);
    assert!(installed && code == Some(0), "the agent's log:\n{log}");
    let (file, conf) = found.unwrap_or_else(|e| panic!("the default name: Multus: {e}"));
    assert_eq!(file, net.join(conf_name), "{conf}");
    assert!(
        by_old_name.is_err(),
        "no network redirect-cni: {by_old_name:?}"
    );
}

/// `cni.handBackOnUninstall` takes off, as-adopted, iptables-nft or nftables; iptables-legacy (which the
/// agent's image cannot write) and anything else fail the render, naming the value and what to
/// do.
#[test]
fn a_hand_back_form_that_cannot_be_written_fails_the_render() {
    for bad in ["iptables-legacy", "yes"] {
        let set = format!("cni.handBackOnUninstall={bad}");
        let err = template(NS, &["--set", &set]).unwrap_err();
        for want in [
            bad,
            "off, as-adopted, iptables-nft or nftables",
            "nativeNftables=true",
        ] {
            assert!(err.contains(want), "{bad}: {err}");
        }
    }
    for good in ["as-adopted", "iptables-nft", "nftables"] {
        let set = format!("cni.handBackOnUninstall={good}");
        assert!(template(NS, &["--set", &set]).is_ok(), "{good}");
    }
}

/// The lookup of the test above, on folders made for it: it can fail, and it follows libcni's
/// order and Multus's rules.
#[test]
fn the_multus_lookup_follows_multuss_rule() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let d = dir.path();
    let write = |name: &str, v: Value| std::fs::write(d.join(name), v.to_string()).unwrap();
    assert!(multus_config_for(d, "a")
        .unwrap_err()
        .contains("No networks found"));
    write("notes.txt", json!({"name": "a", "type": "x"}));
    assert!(multus_config_for(d, "a")
        .unwrap_err()
        .contains("No networks found"));
    write("20-b.conf", json!({"name": "a", "type": "second"}));
    write(
        "10-a.conflist",
        json!({"name": "a", "plugins": [{"type": "first"}]}),
    );
    let (file, _) = multus_config_for(d, "a").unwrap();
    assert_eq!(file, d.join("10-a.conflist"), "the first by file name");
    assert!(multus_config_for(d, "z")
        .unwrap_err()
        .contains("no network available in the name z"));
    write("05-untyped.conf", json!({"name": "u"}));
    assert!(multus_config_for(d, "a")
        .unwrap_err()
        .contains("missing 'type'"));
    assert_eq!(
        requested_networks("a, ns/b@net1,c@eth2", "pods"),
        [("pods", "a"), ("ns", "b"), ("pods", "c")].map(|(n, m)| (n.to_string(), m.to_string()))
    );
}

// --- differences from Istio's DaemonSet ------------------------------------------------------

/// What Istio's chart gives its container (sidecar mode, default values), recorded from
/// releases 1.24.6 and 1.30.3 and checked against them when ISTIO_RELEASES_DIR is set.
struct IstioContainer {
    capabilities: &'static [&'static str],
    readiness: (&'static str, u64),
    liveness: bool,
    host_network: bool,
}

const ISTIO_CONTAINER: IstioContainer = IstioContainer {
    capabilities: &[
        "NET_ADMIN",
        "NET_RAW",
        "SYS_PTRACE",
        "SYS_ADMIN",
        "DAC_OVERRIDE",
    ],
    readiness: ("/readyz", 8000),
    liveness: false,
    host_network: false,
};

/// (capabilities added, readiness probe path and port, a liveness probe, host network) of a
/// rendering's DaemonSet; a named probe port is resolved through the container's ports.
fn container_facts(yaml: &str, origin: &str) -> (Vec<String>, (String, u64), bool, bool) {
    let objects = parse(yaml, origin);
    let ds = objects
        .iter()
        .find(|(k, _)| k.starts_with("DaemonSet/"))
        .map(|(_, v)| v)
        .expect("a DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    let caps = c["securityContext"]["capabilities"]["add"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    let probe = &c["readinessProbe"]["httpGet"];
    let port = match &probe["port"] {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(name) => c["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == *name))
            .and_then(|p| p["containerPort"].as_u64())
            .expect("the named port"),
        other => panic!("{origin}: probe port {other}"),
    };
    let path = probe["path"].as_str().unwrap_or("").to_string();
    let liveness = c.get("livenessProbe").is_some();
    let host_network = spec["hostNetwork"] == true;
    (caps, (path, port), liveness, host_network)
}

/// The section of docs/deploy/README.md on migrating from Istio's chart.
fn migration_section() -> String {
    let doc = redirect_testkit::docs::read("docs/deploy/README.md");
    let start = doc
        .find("### Migrating from Istio's istio-cni chart")
        .expect("the migration section");
    let rest = &doc[start..];
    let end = rest[4..].find("\n## ").map_or(rest.len(), |i| i + 4);
    rest[..end].to_string()
}

/// Each way our container differs from Istio's (a capability it adds and we do not, the
/// readiness probe's port, the liveness probe, the host network) is named in the migration
/// section, which says why.
#[test]
fn the_migration_section_names_each_difference_from_istios_container() {
    if let Some(chart) = istio_chart("1.24.6") {
        for version in BOTH {
            let chart = if *version == "1.24.6" {
                chart.clone()
            } else {
                istio_chart(version).unwrap()
            };
            let yaml = template_of(&chart, "istio-cni", NS, &[]).expect("Istio's chart");
            let (caps, readiness, liveness, host_network) = container_facts(&yaml, version);
            assert_eq!(caps, ISTIO_CONTAINER.capabilities, "Istio {version}");
            assert_eq!(
                readiness,
                (
                    ISTIO_CONTAINER.readiness.0.to_string(),
                    ISTIO_CONTAINER.readiness.1
                ),
                "Istio {version}"
            );
            assert_eq!(liveness, ISTIO_CONTAINER.liveness, "Istio {version}");
            assert_eq!(
                host_network, ISTIO_CONTAINER.host_network,
                "Istio {version}"
            );
        }
    }
    let section = migration_section();
    let named = |item: &str| redirect_testkit::docs::in_backticks(&section, item);
    let (caps, (path, port), liveness, host_network) = container_facts(&render(&[]), "ours");
    let mut problems = Vec::new();
    for cap in ISTIO_CONTAINER.capabilities {
        if !caps.iter().any(|c| c == cap) && !named(cap) {
            problems.push(format!(
                "Istio's container adds {cap}, ours does not: say so, and why"
            ));
        }
    }
    let (istio_path, istio_port) = ISTIO_CONTAINER.readiness;
    if (path.as_str(), port) != (istio_path, istio_port)
        && !(named(&istio_port.to_string()) && named(&port.to_string()))
    {
        problems.push(format!(
            "the readiness probe is {path} on port {port}, Istio's {istio_path} on {istio_port}: \
             name both ports"
        ));
    }
    if liveness != ISTIO_CONTAINER.liveness && !named("/healthz") {
        problems.push("ours has a liveness probe (/healthz), Istio's none".into());
    }
    if host_network != ISTIO_CONTAINER.host_network && !named("hostNetwork") {
        problems.push(format!(
            "hostNetwork is {host_network} (Istio: {})",
            ISTIO_CONTAINER.host_network
        ));
    }
    assert_no_problems(problems);
}

/// Why the container needs no DAC_OVERRIDE: uid 0 writes the host's root-owned CNI folders
/// through their owner's permissions. The real node agent, run as root with exactly the
/// capabilities the DaemonSet gives its container (setpriv's bounding set), chains into a
/// root-owned node; on folders owned by another user it cannot, until DAC_OVERRIDE is added
/// (what Istio's container adds it for).
#[redirect_testkit::kernel_test]
fn root_with_the_containers_capabilities_writes_root_owned_host_folders() {
    let yaml = render(&[]);
    let objects = parse(&yaml, "default");
    let data = objects[CM]["data"].clone();
    let caps = container_facts(&yaml, "default").0;
    let bounding = |extra: &[&str]| {
        let mut b = String::from("-all");
        for c in caps.iter().map(String::as_str).chain(extra.iter().copied()) {
            b.push_str(&format!(",+{}", c.to_lowercase()));
        }
        b
    };
    let calico = json!({"cniVersion": "0.3.1", "name": "k8s-pod-network",
        "plugins": [{"type": "calico"}, {"type": "portmap", "capabilities": {"portMappings": true}}]});
    // Runs the agent on a fresh node whose net and bin folders belong to `owner`: whether our
    // entry got into the conflist within `wait`.
    let run = |owner: u32, bounding: &str, wait: std::time::Duration| -> (bool, String) {
        let node = tempfile::tempdir().expect("a temporary folder");
        let p = |d: &str| node.path().join(d);
        for d in ["net", "bin", "run", "sa"] {
            std::fs::create_dir(p(d)).unwrap();
        }
        std::fs::write(p("sa/token"), "t0k3n\n").unwrap();
        std::fs::write(p("sa/ca.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        let list = p("net/10-calico.conflist");
        std::fs::write(&list, calico.to_string()).unwrap();
        for f in [p("net"), p("bin"), list.clone()] {
            std::os::unix::fs::chown(&f, Some(owner), Some(owner)).unwrap();
        }
        let env: Vec<(String, String)> = data
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .chain(
                [
                    ("POD_NAMESPACE", NS),
                    ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                    ("REPAIR_ENABLED", "false"),
                    ("MONITORING_PORT", "0"),
                ]
                .map(|(k, v)| (k.to_string(), v.to_string())),
            )
            .collect();
        let mut child = Command::new("setpriv")
            .args([
                "--reuid=0",
                "--regid=0",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(format!("--bounding-set={bounding}"))
            .arg("--")
            .arg(cni_testkit::node_bin())
            .arg("--mounted-cni-net-dir")
            .arg(p("net"))
            .arg("--cni-bin-dir")
            .arg(p("bin"))
            .arg("--cni-agent-run-dir")
            .arg(p("run"))
            .arg("--binary")
            .arg(cni_testkit::plugin_bin())
            .arg("--service-account-dir")
            .arg(p("sa"))
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running setpriv (util-linux)");
        let ours = || {
            std::fs::read(&list)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|v| v.to_string().contains("\"redirect-cni\""))
        };
        let start = std::time::Instant::now();
        while !ours() && start.elapsed() < wait {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let installed = ours();
        let log = match child.try_wait() {
            Ok(Some(_)) => {
                let out = child.wait_with_output().unwrap();
                String::from_utf8_lossy(&out.stderr).into_owned()
            }
            _ => stop_agent(child).1,
        };
        (installed, log)
    };
    let long = std::time::Duration::from_secs(20);
    let (ok, log) = run(0, &bounding(&[]), long);
    assert!(
        ok,
        "root-owned folders, the container's capabilities {caps:?}: not installed\n{log}"
    );
    assert!(!caps.iter().any(|c| c == "DAC_OVERRIDE"));
    let (ok, log) = run(1000, &bounding(&[]), std::time::Duration::from_secs(3));
    assert!(
        !ok,
        "folders of uid 1000 written without DAC_OVERRIDE?\n{log}"
    );
    let (ok, log) = run(1000, &bounding(&["DAC_OVERRIDE"]), long);
    assert!(
        ok,
        "folders of uid 1000, with DAC_OVERRIDE: not installed\n{log}"
    );
}

// --- the Kubernetes schemas ---------------------------------------------------------------------

/// The oldest and the newest Kubernetes whose schemas kubernetes-validate bundles.
const KUBERNETES: [&str; 2] = ["1.25.0", "1.37.0"];

/// The kinds kubernetes-validate has no schema for (CRDs); they are checked against the plain
/// manifests above, which tests/manifests.rs checks against their CRDs' fields.
const CRDS: [&str; 2] = ["NetworkAttachmentDefinition", "SecurityContextConstraints"];

/// The flowcontrol API versions that `version` does not serve, for which kubernetes-validate
/// has no schema: the chart renders v1 (1.29+) or v1beta3 (1.26-1.28) by what the cluster
/// serves (none on 1.25), so the oldest bundled (1.25) has neither and the newest (1.37) no
/// v1beta3.
fn unserved_flow_control(line: &str, version: &str) -> bool {
    let unserved: &[&str] = match version {
        "1.25.0" => &["v1", "v1beta3"],
        _ => &["v1beta3"],
    };
    line.starts_with("WARN ")
        && ["FlowSchema", "PriorityLevelConfiguration"]
            .iter()
            .any(|k| {
                unserved.iter().any(|v| {
                    line.contains(&format!(
                        "kind {k} with api version flowcontrol.apiserver.k8s.io/{v} "
                    ))
                })
            })
}

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
                .filter(|l| !unserved_flow_control(l, version))
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
    for (i, case) in SETTINGS
        .iter()
        .chain(MODES)
        .chain(AMBIENT)
        .chain(VALUES)
        .chain(SEEDS)
        .enumerate()
    {
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

/// The ClusterRole with the repair controller off: the plugin reads pods, and the agent its
/// DaemonSet and node when it stops (SAFE_UPGRADE).
fn repair_off_rules() -> Value {
    json!([
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["redirect-cni-node"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}
    ])
}

// --- the rest of Istio 1.31's values: scopes, revision, policy, security, plugin fields ---------

/// What a rendering holds of the values below, in the same words for Istio's chart and ours:
/// the kinds rendered, whether every object carries `istio.io/rev`, the NetworkPolicy's ports
/// and egress, the container's seccomp profile, and the ConfigMap's Istio keys.
fn istio_facts(yaml: &str, origin: &str) -> BTreeMap<&'static str, String> {
    let objects = parse(yaml, origin);
    let mut kinds: Vec<String> = objects
        .keys()
        .map(|k| k.split('/').next().unwrap_or("").to_string())
        .collect();
    kinds.sort();
    kinds.dedup();
    // Ours adds the agents' flow control, which Istio's chart has not: a fact of its own.
    let (flow, kinds): (Vec<String>, Vec<String>) = kinds
        .into_iter()
        .partition(|k| k == "FlowSchema" || k == "PriorityLevelConfiguration");
    let mut out = BTreeMap::new();
    out.insert("kinds", kinds.join(","));
    out.insert("flow_control", flow.join(","));
    let rev: Vec<String> = objects
        .values()
        .map(|o| {
            o["metadata"]["labels"]["istio.io/rev"]
                .as_str()
                .unwrap_or("-")
                .to_string()
        })
        .collect();
    out.insert("rev", rev.iter().min().cloned().unwrap_or_default());
    for o in objects.values() {
        match o["kind"].as_str() {
            Some("NetworkPolicy") => {
                let ports: Vec<String> = o["spec"]["ingress"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|i| i["ports"].as_array().cloned().unwrap_or_default())
                    .map(|p| p["port"].to_string())
                    .collect();
                out.insert("policy_ports", ports.join(","));
                out.insert("policy_egress", o["spec"]["egress"].to_string());
            }
            Some("DaemonSet") => {
                let c = &o["spec"]["template"]["spec"]["containers"][0];
                let seccomp = &c["securityContext"]["seccompProfile"]["type"];
                out.insert("seccomp", seccomp.as_str().unwrap_or("").to_string());
                let selector = &o["spec"]["selector"]["matchLabels"]["istio.io/rev"];
                out.insert("selector_rev", selector.as_str().unwrap_or("-").to_string());
            }
            Some("ConfigMap") => {
                for k in ["NATIVE_NFTABLES", "ENABLE_AMBIENT_DETECTION_RETRY"] {
                    let v = o["data"][k].as_str().unwrap_or("false");
                    out.insert(
                        if k == "NATIVE_NFTABLES" {
                            "nft"
                        } else {
                            "retry"
                        },
                        v.into(),
                    );
                }
            }
            _ => {}
        }
    }
    out
}

/// Istio 1.31's values that only its chart reads: each rendered by ours as Istio's renders it,
/// checked against the records and, with `ISTIO_RELEASES_DIR`, against Istio 1.31.0-rc.0's
/// chart itself.
#[test]
fn istios_scopes_revision_policy_and_security_values_render_as_istios() {
    type Row = (
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
        &'static [(&'static str, &'static str)],
    );
    // (values, what both give, what only ours gives where the objects differ by design)
    let rows: &[Row] = &[
        (
            &["--set", "global.resourceScope=cluster"],
            &[("kinds", "ClusterRole,ClusterRoleBinding")],
            &[("flow_control", "FlowSchema,PriorityLevelConfiguration")],
        ),
        (
            &["--set", "global.resourceScope=namespace"],
            &[("kinds", "ConfigMap,DaemonSet,ServiceAccount")],
            &[("flow_control", "")],
        ),
        (
            &["--set", "global.resourceScope=neither"],
            &[("kinds", "")],
            &[],
        ),
        (
            &["--set", "revision=canary"],
            &[("rev", "canary"), ("selector_rev", "-")],
            &[],
        ),
        (
            &["--set", "global.networkPolicy.enabled=true"],
            &[("policy_egress", "[{}]")],
            &[("policy_ports", "15014")],
        ),
        (
            &[
                "--set",
                "seccompProfile.type=Localhost,seccompProfile.localhostProfile=cni.json",
            ],
            &[("seccomp", "Localhost")],
            &[],
        ),
        (
            &["--set", "global.nativeNftables=true"],
            &[("nft", "true")],
            &[],
        ),
        (
            &[
                "--set",
                "profile=ambient,ambient.enableAmbientDetectionRetry=true",
            ],
            &[("retry", "true")],
            &[],
        ),
    ];
    let mut problems = Vec::new();
    for (args, both, ours_only) in rows {
        let ours = istio_facts(
            &template(NS, args).unwrap_or_else(|e| panic!("{args:?}: {e}")),
            "ours",
        );
        for (k, want) in both.iter().chain(ours_only.iter()) {
            let got = ours.get(k).map(String::as_str).unwrap_or("(none)");
            if got != *want {
                problems.push(format!("{args:?}: ours gives {k} {got:?}, want {want:?}"));
            }
        }
        let Some(chart) = istio_chart("1.31.0-rc.0") else {
            continue;
        };
        let yaml = template_of(&chart, "istio-cni", NS, args)
            .unwrap_or_else(|e| panic!("{args:?}: Istio's chart: {e}"));
        let istio = istio_facts(&yaml, "istio");
        for (k, want) in *both {
            let got = istio.get(k).map(String::as_str).unwrap_or("(none)");
            if got != *want {
                problems.push(format!(
                    "{args:?}: the record says Istio gives {k} {want:?}, it renders {got:?}"
                ));
            }
        }
    }
    assert_no_problems(problems);
}
