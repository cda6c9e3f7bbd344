//! Every manifest of `deploy/` and every rendering of the Helm chart accepted by a real API
//! server (kube-apiserver 1.20 and etcd, `cni_testkit::apiserver`): `kubectl apply
//! --dry-run=server` of the plain manifests as their headers say to apply them (the OpenShift
//! set with the NetworkAttachmentDefinition CRD, and a stand-in CRD for OpenShift's
//! SecurityContextConstraints, which a plain API server does not serve), and the chart's
//! renderings applied for real. Ambient mode's RBAC (ambient.yaml, the chart's
//! `profile=ambient`) gives the agent's account what the ambient controller does (`kubectl auth
//! can-i`), which redirect-cni.yaml alone does not.

use std::process::Command;
use std::time::Duration;

use cni_testkit::apiserver::{as_written, ControlPlane, SYSTEM};
use redirect_testkit::kernel_test;
use serde_json::json;

fn eventually<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    cni_testkit::eventually(what, Duration::from_secs(30), f)
}

/// A stand-in CRD for OpenShift's SecurityContextConstraints (only OpenShift serves that API):
/// any field, and `priority` a nullable integer as in OpenShift's own schema.
fn scc_crd() -> String {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "securitycontextconstraints.security.openshift.io"},
        "spec": {"group": "security.openshift.io", "scope": "Cluster",
            "names": {"kind": "SecurityContextConstraints", "plural": "securitycontextconstraints",
                "singular": "securitycontextconstraints"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {"priority": {"type": "integer", "nullable": true}}}}}]}})
    .to_string()
}

/// Both CRDs, once their schemas are published (kubectl validates against them).
fn openshift_crds(cp: &ControlPlane) {
    cp.apply(&nad_crd());
    cp.apply(&scc_crd());
    eventually("the CRDs' schemas published", || {
        [
            "securitycontextconstraints.priority",
            "network-attachment-definitions.spec.config",
        ]
        .iter()
        .all(|f| cp.kubectl(&["explain", f]).status.success())
        .then_some(())
    });
}

/// Multus' NetworkAttachmentDefinition CRD, as Multus installs it (v1, namespaced, spec.config a
/// string).
fn nad_crd() -> String {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "network-attachment-definitions.k8s.cni.cncf.io"},
        "spec": {"group": "k8s.cni.cncf.io", "scope": "Namespaced",
            "names": {"kind": "NetworkAttachmentDefinition", "plural": "network-attachment-definitions",
                "singular": "network-attachment-definition", "shortNames": ["net-attach-def"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": {"type": "object", "properties": {"config": {"type": "string"}}}}}}}]}})
    .to_string()
}

/// `kubectl apply` of `yaml` (into `namespace`, with `--dry-run=server` when `dry`): its
/// stdout, or its error. kubectl validates each object against the schemas the server
/// publishes; this 1.20 server publishes OpenAPI v2 only, in which a CRD field cannot be
/// nullable, so the stand-in SCC (whose `priority: null` OpenShift's own API takes) is sent
/// unvalidated by kubectl, on its own; the server still takes it through the CRD's schema.
fn kubectl_apply(
    cp: &ControlPlane,
    yaml: &str,
    namespace: Option<&str>,
    dry: bool,
) -> Result<String, String> {
    let (scc, rest): (Vec<&str>, Vec<&str>) = yaml
        .split("\n---")
        .partition(|d| d.lines().any(|l| l == "kind: SecurityContextConstraints"));
    let mut stdout = String::new();
    for (docs, validate) in [(rest, true), (scc, false)] {
        if docs
            .iter()
            .all(|d| d.lines().all(|l| l.trim().is_empty() || l.starts_with('#')))
        {
            continue;
        }
        let mut a = vec!["apply", "-f", "-"];
        if dry {
            a.push("--dry-run=server");
        }
        if !validate {
            a.push("--validate=false");
        }
        if let Some(ns) = namespace {
            a.extend(["-n", ns]);
        }
        let out = cp.kubectl_in(&a, Some(&docs.join("\n---")));
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        stdout += &String::from_utf8_lossy(&out.stdout);
    }
    Ok(stdout)
}

fn dry_run(cp: &ControlPlane, yaml: &str, namespace: Option<&str>) -> Result<String, String> {
    kubectl_apply(cp, yaml, namespace, true)
}

/// Whether ServiceAccount `namespace/name` may `verb` `resource` (`kubectl auth can-i`, which
/// exits 1 for "no"), in any namespace.
fn account_may(cp: &ControlPlane, namespace: &str, name: &str, verb: &str, resource: &str) -> bool {
    let who = format!("--as=system:serviceaccount:{namespace}:{name}");
    let (resource, sub) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (resource, None),
    };
    let mut args = vec![
        "auth",
        "can-i",
        verb,
        resource,
        "--all-namespaces",
        who.as_str(),
    ];
    let sub = sub.map(|s| format!("--subresource={s}"));
    if let Some(s) = &sub {
        args.push(s);
    }
    let out = cp.kubectl(&args);
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        answer == "yes" || answer == "no",
        "kubectl {args:?}: {answer} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

/// What ambient mode's controller does with the API (ambient.yaml's grants).
const AMBIENT_RIGHTS: [(&str, &str); 4] = [
    ("get", "namespaces"),
    ("list", "namespaces"),
    ("watch", "namespaces"),
    ("patch", "pods/status"),
];

#[kernel_test]
fn every_manifest_of_deploy_is_accepted_by_a_real_api_server() {
    let cp = ControlPlane::start();
    // Each file as its header says: into a namespace of one's choice, SET-ME replaced; the
    // main file applied for real first (the others refer to its account).
    cp.namespace(SYSTEM);
    cp.install("kubernetes/redirect-cni.yaml");
    for f in [
        "redirect-cni.yaml",
        "repair-delete-pods.yaml",
        "repair-label-pods.yaml",
        "untaint-node.yaml",
        "resourcequota-critical-pods.yaml",
        "ambient.yaml",
    ] {
        let yaml = as_written(&format!("kubernetes/{f}"));
        let out =
            dry_run(&cp, &yaml, Some(SYSTEM)).unwrap_or_else(|e| panic!("kubernetes/{f}: {e}"));
        assert!(out.contains("(server dry run)"), "kubernetes/{f}: {out}");
    }
    // The check can fail: a misspelled field is refused.
    let broken = as_written("kubernetes/redirect-cni.yaml").replace("hostNetwork:", "hostNetwrok:");
    let err =
        dry_run(&cp, &broken, Some(SYSTEM)).expect_err("a misspelled field should be refused");
    assert!(err.contains("hostNetwrok"), "{err}");

    // ambient.yaml, applied for real as its header says, gives the agent's account what the
    // ambient controller does; redirect-cni.yaml alone does not.
    for (verb, resource) in AMBIENT_RIGHTS {
        assert!(
            !account_may(&cp, SYSTEM, "redirect-cni", verb, resource),
            "redirect-cni.yaml alone lets the agent {verb} {resource}"
        );
    }
    cp.install("kubernetes/ambient.yaml");
    eventually("ambient.yaml's rights in force", || {
        AMBIENT_RIGHTS
            .iter()
            .all(|(verb, resource)| account_may(&cp, SYSTEM, "redirect-cni", verb, resource))
            .then_some(())
    });

    // OpenShift, with Multus' CRD and a stand-in for OpenShift's SCC API.
    openshift_crds(&cp);
    for f in [
        "redirect-cni.yaml",
        "repair-delete-pods.yaml",
        "repair-label-pods.yaml",
        "untaint-node.yaml",
        "ambient.yaml",
        "network-attachment-definition.yaml",
    ] {
        let yaml = as_written(&format!("openshift/{f}"));
        let ns = (f != "network-attachment-definition.yaml").then_some(SYSTEM);
        let out = dry_run(&cp, &yaml, ns).unwrap_or_else(|e| panic!("openshift/{f}: {e}"));
        assert!(out.contains("(server dry run)"), "openshift/{f}: {out}");
    }
}

/// `helm template` of `deploy/helm/redirect-cni` into `namespace` with `--set` of each value
/// (helm from `scripts/install-helm.sh`; no repository, no cluster, no network).
fn helm_template(namespace: &str, values: &[&str]) -> String {
    let repo = redirect_testkit::docs::workspace();
    let helm = repo.join(".tools/helm");
    assert!(
        helm.is_file(),
        "{} is missing: run `bash scripts/install-deps.sh`",
        helm.display()
    );
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(helm);
    cmd.args(["template", "redirect-cni"])
        .arg(repo.join("deploy/helm/redirect-cni"))
        .args(["--namespace", namespace])
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env("KUBECONFIG", home.path().join("none"));
    for v in values {
        cmd.args(["--set", v]);
    }
    // Without a cluster helm assumes the API versions of its own Kubernetes, so the chart
    // renders the agents' FlowSchema as flowcontrol.apiserver.k8s.io/v1, which this 1.20
    // server does not serve (it has v1beta1 only). `helm install` on it sees the versions
    // served and renders none (deploy/tests/real_node.rs installs that way); here the same
    // is asked for. The FlowSchema's fields are checked against 1.25's and 1.37's schemas in
    // helm_chart.rs.
    cmd.args(["--set", "flowControl.enabled=false"]);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The chart's three settings of the seeds, OpenShift Service Mesh 3's values and its default,
/// rendered and applied for real (each into a namespace of its own): the server takes every
/// object, and the DaemonSet and its ConfigMap hold what the values asked for.
#[kernel_test]
fn the_helm_charts_renderings_are_accepted_by_a_real_api_server() {
    let cp = ControlPlane::start();
    openshift_crds(&cp);
    const OPENSHIFT: &str = "cni.chained=false,cni.provider=multus,cni.cniBinDir=/var/lib/cni/bin,\
        cni.cniConfDir=/etc/cni/multus/net.d,cni.cniConfFileName=istio-cni.conf";
    let settings: [(&str, &[&str], &str, &str); 6] = [
        ("helm-default", &[], "/etc/cni/net.d", ""),
        // OpenShift Service Mesh 3's values, as written (issue 31).
        ("helm-ossm", &[OPENSHIFT, "profile=openshift"], "/etc/cni/multus/net.d", "istio-cni.conf"),
        ("helm-openshift", &[OPENSHIFT, "global.platform=openshift"], "/etc/cni/multus/net.d", "istio-cni.conf"),
        (
            "helm-openshift-delete",
            &[OPENSHIFT, "global.platform=openshift", "cni.repair.deletePods=true,cni.repair.repairPods=false"],
            "/etc/cni/multus/net.d",
            "istio-cni.conf",
        ),
        (
            "helm-chained",
            &["cni.chained=true,cni.provider=default,cni.cniConfDir=/run/multus/cni/net.d,cni.cniConfFileName=10-calico.conflist"],
            "/run/multus/cni/net.d",
            "10-calico.conflist",
        ),
        ("helm-ambient", &["profile=ambient"], "/etc/cni/net.d", ""),
    ];
    for (ns, values, net_dir, conf_name) in settings {
        cp.namespace(ns);
        let yaml = helm_template(ns, values);
        // The chart names each object's namespace (the attachment's is "default").
        kubectl_apply(&cp, &yaml, None, false)
            .unwrap_or_else(|e| panic!("{ns}: kubectl apply: {e}"));
        let ds = cp.get(&["daemonset", "redirect-cni-node", "-n", ns]);
        let volumes = ds["spec"]["template"]["spec"]["volumes"].to_string();
        assert!(
            volumes.contains(net_dir),
            "{ns}: the net dir {net_dir} mounted: {volumes}"
        );
        let cm = cp.get(&["configmap", "redirect-cni-config", "-n", ns]);
        assert_eq!(
            cm["data"]["CNI_CONF_NAME"].as_str().unwrap_or(""),
            conf_name,
            "{ns}: {cm}"
        );
        if ns.starts_with("helm-openshift") || ns == "helm-ossm" {
            // Istio's attachment, and the standalone file's network of the same name.
            let nad = cp.get(&[
                "network-attachment-definitions",
                "istio-cni",
                "-n",
                "default",
            ]);
            assert_eq!(nad["metadata"]["name"], "istio-cni");
            assert_eq!(cm["data"]["CNI_NETWORK_NAME"], "istio-cni", "{ns}: {cm}");
        }
    }
    // The delete mode's RBAC is in place: the agent's account may delete pods.
    let may = cp.kubectl_ok(&[
        "auth",
        "can-i",
        "delete",
        "pods",
        "--as=system:serviceaccount:helm-openshift-delete:redirect-cni",
    ]);
    assert_eq!(may.trim(), "yes");
    // Ambient mode's: its settings, ztunnel's folder and its role. (Without ambient mode the
    // account lacks these rights: every_manifest_of_deploy_is_accepted_by_a_real_api_server; the
    // releases here share the cluster-wide binding names, so the other accounts prove nothing.)
    let cm = cp.get(&["configmap", "redirect-cni-config", "-n", "helm-ambient"]);
    assert_eq!(cm["data"]["AMBIENT_ENABLED"], "true", "{cm}");
    let ds = cp.get(&["daemonset", "redirect-cni-node", "-n", "helm-ambient"]);
    let volumes = ds["spec"]["template"]["spec"]["volumes"].to_string();
    assert!(volumes.contains("/var/run/ztunnel"), "{volumes}");
    for (verb, resource) in AMBIENT_RIGHTS {
        assert!(
            account_may(&cp, "helm-ambient", "redirect-cni", verb, resource),
            "helm-ambient: the agent may not {verb} {resource}"
        );
    }
}
