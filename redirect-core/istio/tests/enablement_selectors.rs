//! Istio's enablement selectors, term by term: each operator, pod against namespace terms,
//! Istio's default list, the `none` opt-out, and what Kubernetes refuses to compile.

use std::collections::BTreeMap;

use redirect_istio::ambient::{enrollment, EnablementSelectors, Enrollment, PodView};

fn labels(text: &str) -> BTreeMap<String, String> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("k=v");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn selectors(json: &str) -> EnablementSelectors {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

const MODE: &str = "istio.io/dataplane-mode";

/// Istio's chart default, spelled as its values.yaml spells it.
const ISTIO_DEFAULT: &str = r#"[
  {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
  {"podSelector": {"matchExpressions": [
     {"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
   "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}
]"#;

/// The rollout istio#53578 asked for: every pod of the cluster unless it or its namespace
/// says `none`.
const CLUSTER_WIDE_OPT_OUT: &str = r#"[
  {"podSelector": {"matchExpressions": [
     {"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
   "namespaceSelector": {"matchExpressions": [
     {"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]}}
]"#;

#[test]
fn each_term_matches_as_istio_matches_it() {
    // (selectors, pod labels, namespace labels, enrolled)
    let table: &[(&str, &str, &str, bool)] = &[
        // Istio's default: the pod's label, the namespace's, and `none`.
        (ISTIO_DEFAULT, "istio.io/dataplane-mode=ambient", "", true),
        (ISTIO_DEFAULT, "", "istio.io/dataplane-mode=ambient", true),
        (
            ISTIO_DEFAULT,
            "app=web",
            "istio.io/dataplane-mode=ambient",
            true,
        ),
        (
            ISTIO_DEFAULT,
            "istio.io/dataplane-mode=none",
            "istio.io/dataplane-mode=ambient",
            false,
        ),
        (
            ISTIO_DEFAULT,
            "istio.io/dataplane-mode=ambient",
            "istio.io/dataplane-mode=none",
            true,
        ),
        (ISTIO_DEFAULT, "", "", false),
        (ISTIO_DEFAULT, "istio.io/dataplane-mode=sidecar", "", false),
        (ISTIO_DEFAULT, "", "istio.io/dataplane-mode=sidecar", false),
        // The cluster-wide opt-out.
        (CLUSTER_WIDE_OPT_OUT, "", "", true),
        (CLUSTER_WIDE_OPT_OUT, "app=web", "team=a", true),
        (
            CLUSTER_WIDE_OPT_OUT,
            "istio.io/dataplane-mode=none",
            "",
            false,
        ),
        (
            CLUSTER_WIDE_OPT_OUT,
            "",
            "istio.io/dataplane-mode=none",
            false,
        ),
        // In: the key there with a listed value.
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"tier","operator":"In","values":["a","b"]}]}}]"#,
            "tier=b",
            "",
            true,
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"tier","operator":"In","values":["a","b"]}]}}]"#,
            "tier=c",
            "",
            false,
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"tier","operator":"In","values":["a","b"]}]}}]"#,
            "",
            "",
            false,
        ),
        // NotIn: absent, or there with another value.
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"tier","operator":"NotIn","values":["a"]}]}}]"#,
            "",
            "",
            true,
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"tier","operator":"NotIn","values":["a"]}]}}]"#,
            "tier=b",
            "",
            true,
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"tier","operator":"NotIn","values":["a"]}]}}]"#,
            "tier=a",
            "",
            false,
        ),
        // Exists and DoesNotExist: the key, whatever its value (empty included).
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"mesh","operator":"Exists"}]}}]"#,
            "mesh=",
            "",
            true,
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"mesh","operator":"Exists"}]}}]"#,
            "app=x",
            "",
            false,
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"mesh","operator":"DoesNotExist"}]}}]"#,
            "app=x",
            "",
            true,
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"mesh","operator":"DoesNotExist"}]}}]"#,
            "mesh=off",
            "",
            false,
        ),
        // A namespace term reads the namespace's labels, never the pod's.
        (
            r#"[{"namespaceSelector":{"matchLabels":{"team":"a"}}}]"#,
            "team=a",
            "",
            false,
        ),
        (
            r#"[{"namespaceSelector":{"matchLabels":{"team":"a"}}}]"#,
            "",
            "team=a",
            true,
        ),
        // Within a term both must hold; matchLabels and matchExpressions both hold.
        (
            r#"[{"podSelector":{"matchLabels":{"app":"web"}},"namespaceSelector":{"matchLabels":{"team":"a"}}}]"#,
            "app=web",
            "team=b",
            false,
        ),
        (
            r#"[{"podSelector":{"matchLabels":{"app":"web"},"matchExpressions":[{"key":"v","operator":"Exists"}]}}]"#,
            "app=web",
            "",
            false,
        ),
        (
            r#"[{"podSelector":{"matchLabels":{"app":"web"},"matchExpressions":[{"key":"v","operator":"Exists"}]}}]"#,
            "app=web,v=1",
            "",
            true,
        ),
        // Terms are ORed.
        (
            r#"[{"podSelector":{"matchLabels":{"a":"1"}}},{"podSelector":{"matchLabels":{"b":"1"}}}]"#,
            "b=1",
            "",
            true,
        ),
        // An empty term matches every pod; an empty list, none.
        (r#"[{}]"#, "", "", true),
        (
            r#"[{"podSelector":null,"namespaceSelector":{"matchLabels":null,"matchExpressions":null}}]"#,
            "",
            "",
            true,
        ),
        (
            r#"[]"#,
            "istio.io/dataplane-mode=ambient",
            "istio.io/dataplane-mode=ambient",
            false,
        ),
    ];
    let mut wrong = Vec::new();
    for (i, (json, pod, ns, want)) in table.iter().enumerate() {
        let got = selectors(json).matches(&labels(pod), &labels(ns));
        if got != *want {
            wrong.push(format!(
                "row {i}: {json} pod {pod:?} namespace {ns:?}: got {got}, want {want}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn istios_default_is_what_its_values_spell() {
    assert_eq!(
        selectors(ISTIO_DEFAULT),
        EnablementSelectors::istio_default()
    );
    assert!(selectors(ISTIO_DEFAULT).is_istio_default());
    assert!(!selectors(CLUSTER_WIDE_OPT_OUT).is_istio_default());
}

#[test]
fn host_network_sidecars_and_excluded_namespaces_stay_out_whatever_the_selectors() {
    let everything = selectors("[{}]");
    let (none, sidecar) = (labels(""), labels("sidecar.istio.io/status=x"));
    let pod = |annotations, host_network, namespace| PodView {
        namespace,
        labels: &none,
        annotations,
        host_network,
        namespace_labels: &none,
    };
    let excluded = ["kube-system".to_string()];
    assert_eq!(
        enrollment(&pod(&none, false, "shop"), &excluded, &everything),
        Enrollment::Ambient
    );
    for (view, why) in [
        (pod(&none, true, "shop"), "on the host's network"),
        (pod(&sidecar, false, "shop"), "has a sidecar"),
        (pod(&none, false, "kube-system"), "in an excluded namespace"),
    ] {
        assert_eq!(
            enrollment(&view, &excluded, &everything),
            Enrollment::Not(why)
        );
    }
    // ztunnel, whatever the selectors take (Istio's IsZtunnelPod).
    let ztunnel = labels("app=ztunnel");
    let view = PodView {
        labels: &ztunnel,
        ..pod(&none, false, "istio-system")
    };
    assert_eq!(
        enrollment(&view, &[], &everything),
        Enrollment::Not("ztunnel itself")
    );
    let view = PodView {
        labels: &ztunnel,
        ..pod(&none, false, "shop")
    };
    assert_eq!(enrollment(&view, &[], &everything), Enrollment::Ambient);
    // A pod no custom term matches says so; under the default, which label is missing.
    let mine = selectors(r#"[{"podSelector":{"matchLabels":{"mesh":"on"}}}]"#);
    let Enrollment::Not(why) = enrollment(&pod(&none, false, "shop"), &[], &mine) else {
        panic!("enrolled by a term it does not match");
    };
    assert!(why.contains("no enablement selector"), "{why}");
    let out = labels(&format!("{MODE}=none"));
    let view = PodView {
        labels: &out,
        ..pod(&none, false, "shop")
    };
    assert_eq!(
        enrollment(&view, &[], &EnablementSelectors::istio_default()),
        Enrollment::Not("labelled istio.io/dataplane-mode=none")
    );
}

#[test]
fn what_kubernetes_refuses_is_refused_naming_the_term_and_the_fix() {
    let refused: &[(&str, &str)] = &[
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"a","operator":"In","values":[]}]}}]"#,
            "needs at least one value",
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"a","operator":"NotIn"}]}}]"#,
            "needs at least one value",
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Exists","values":["x"]}]}}]"#,
            "takes no values",
        ),
        (
            r#"[{},{"namespaceSelector":{"matchExpressions":[{"key":"a","operator":"DoesNotExist","values":["x"]}]}}]"#,
            "enablement selector 1, namespaceSelector",
        ),
        (
            r#"[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Equals","values":["x"]}]}}]"#,
            "Equals",
        ),
        (
            r#"[{"podSelector":{"matchLabels":{"bad key":"x"}}}]"#,
            "bad key",
        ),
        (
            r#"[{"podSelector":{"matchLabels":{"Istio.IO/mode":"x"}}}]"#,
            "DNS subdomain",
        ),
        (
            r#"[{"podSelector":{"matchLabels":{"a":"-x"}}}]"#,
            "starting and ending",
        ),
        (
            r#"[{"podSelector":{"matchLabels":{"a":"x"}},"podselector":{}}]"#,
            "podselector",
        ),
        (
            r#"[{"podSelector":{"matchlabels":{"a":"x"}}}]"#,
            "matchlabels",
        ),
    ];
    for (json, says) in refused {
        let err = serde_json::from_str::<EnablementSelectors>(json)
            .expect_err(json)
            .to_string();
        assert!(err.contains(says), "{json}: {err:?} does not say {says:?}");
    }
}
