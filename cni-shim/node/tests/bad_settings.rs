//! Bad settings for the node agent (`redirect-cni-node` flags and env), in process: every bad
//! value is refused with a message naming the setting and the value, before anything is
//! written.

use std::ffi::OsString;

/// The installer's settings (`redirect-cni install` flags and env), in process: every bad value
/// is refused with a message naming the setting and the value, before anything is written.
#[test]
fn bad_installer_settings() {
    use cni_node::settings::parse;
    // (what, args, env, what the message must name)
    type SettingsRow<'a> = (
        &'a str,
        &'a [&'a str],
        &'a [(&'a str, &'a str)],
        &'a [&'a str],
    );
    let rows: &[SettingsRow] = &[
        (
            "mode not octal",
            &["--kubeconfig-mode", "abc"],
            &[],
            &["kubeconfig-mode", "abc"],
        ),
        (
            "mode too long",
            &["--kubeconfig-mode", "077777"],
            &[],
            &["kubeconfig-mode", "077777"],
        ),
        (
            "mode digit 9",
            &["--kubeconfig-mode", "0699"],
            &[],
            &["kubeconfig-mode", "0699"],
        ),
        (
            "mode from env",
            &[],
            &[("KUBECONFIG_MODE", "rw-------")],
            &["KUBECONFIG_MODE", "rw-------"],
        ),
        (
            // The token would be readable by every user of the node.
            "kubeconfig readable by others",
            &[],
            &[("KUBECONFIG_MODE", "0644")],
            &["KUBECONFIG_MODE", "0644", "service-account token"],
        ),
        (
            "kubeconfig writable by the group",
            &["--kubeconfig-mode", "0660"],
            &[],
            &["kubeconfig-mode", "0660", "0640"],
        ),
        (
            // A word that is none of the accepted forms: named, with the forms.
            "synthetic check",
            &["--ambient-synthetic-check=sometimes"],
            &[],
            &[
                "ambient-synthetic-check",
                "sometimes",
                "off, rotate, or <namespace>/<name>",
            ],
        ),
        (
            "synthetic check from env, a pod with no name",
            &[],
            &[("AMBIENT_SYNTHETIC_CHECK", "shop/")],
            &["AMBIENT_SYNTHETIC_CHECK", "shop/", "<namespace>/<name>"],
        ),
        (
            "ambient switch",
            &["--ambient-enabled=sometimes"],
            &[],
            &["ambient-enabled", "sometimes"],
        ),
        (
            "enablement selector not a list",
            &[],
            &[("AMBIENT_ENABLEMENT_SELECTOR", "podSelector: {}")],
            &[
                "AMBIENT_ENABLEMENT_SELECTOR",
                "podSelector: {}",
                "list of terms",
            ],
        ),
        (
            "enablement selector Kubernetes would refuse",
            &[],
            &[(
                "AMBIENT_ENABLEMENT_SELECTOR",
                "- podSelector: {matchExpressions: [{key: mesh, operator: In}]}",
            )],
            &[
                "AMBIENT_ENABLEMENT_SELECTOR",
                "needs at least one value",
                "enablement selector 0",
            ],
        ),
        (
            "enablement selector misspelt",
            &["--ambient-enablement-selector", r#"[{"podselector":{}}]"#],
            &[],
            &["ambient-enablement-selector", "podselector"],
        ),
        (
            "probe SNAT address not an address",
            &[],
            &[("HOST_PROBE_SNAT_IP", "169.254.7")],
            &["HOST_PROBE_SNAT_IP", "169.254.7", "IP address"],
        ),
        (
            "probe SNAT address of the wrong family",
            &[],
            &[("HOST_PROBE_SNAT_IP", "fd00::1")],
            &["HOST_PROBE_SNAT_IP", "fd00::1", "IPv4"],
        ),
        (
            "IPv6 probe SNAT address of the wrong family",
            &["--host-probe-snat-ipv6", "10.0.0.1"],
            &[],
            &["host-probe-snat-ipv6", "10.0.0.1", "IPv6"],
        ),
        (
            "ztunnel's socket not absolute",
            &[],
            &[("ZTUNNEL_UDS_ADDRESS", "run/ztunnel.sock")],
            &["ZTUNNEL_UDS_ADDRESS", "run/ztunnel.sock", "absolute"],
        ),
        (
            "boolean flag value",
            &["--chained-cni-plugin=maybe"],
            &[],
            &["chained-cni-plugin", "maybe"],
        ),
        (
            "boolean env",
            &[],
            &[("CNI_CONF_GROUP_READ", "yes please")],
            &["CNI_CONF_GROUP_READ", "yes please"],
        ),
        (
            "boolean env, TLS",
            &[],
            &[("SKIP_TLS_VERIFY", "2")],
            &["SKIP_TLS_VERIFY", "2"],
        ),
        (
            "unknown flag",
            &["--cni-net-dri", "/x"],
            &[],
            &["--cni-net-dri"],
        ),
        (
            "flag without value",
            &["--cni-conf-name"],
            &[],
            &["--cni-conf-name"],
        ),
        // The node agent's (repair controller, untaint, endpoints).
        (
            "repair exit code not a number",
            &[],
            &[("REPAIR_INIT_CONTAINER_EXIT_CODE", "abc")],
            &["REPAIR_INIT_CONTAINER_EXIT_CODE", "abc"],
        ),
        (
            "repair exit code out of range",
            &["--repair-init-container-exit-code", "256"],
            &[],
            &["repair-init-container-exit-code", "256"],
        ),
        (
            "repair attempts zero",
            &[],
            &[("REPAIR_MAX_ATTEMPTS", "0")],
            &["REPAIR_MAX_ATTEMPTS", "0"],
        ),
        (
            "ADOPT_ISTIO is not a policy",
            &[],
            &[("ADOPT_ISTIO", "yes")],
            &["ADOPT_ISTIO", "\"yes\"", "off, keep or replace"],
        ),
        (
            "HAND_BACK_ON_UNINSTALL in a form the agent's image cannot write",
            &[],
            &[("HAND_BACK_ON_UNINSTALL", "iptables-legacy")],
            &[
                "HAND_BACK_ON_UNINSTALL",
                "iptables-legacy",
                "nativeNftables=true",
            ],
        ),
        (
            "CAPTURE_COUNTERS not a mode",
            &[],
            &[("CAPTURE_COUNTERS", "yes")],
            &["CAPTURE_COUNTERS", "yes", "off, node", "pod"],
        ),
        (
            "CAPTURE_COUNTERS_INTERVAL out of range",
            &["--capture-counters-interval", "500ms"],
            &[],
            &["capture-counters-interval", "500ms", "1s to 1h"],
        ),
        (
            "HAND_BACK_FORM the agent's image cannot write",
            &["--hand-back-form", "iptables-legacy"],
            &[],
            &[
                "hand-back-form",
                "iptables-legacy",
                "iptables-nft or nftables",
            ],
        ),
        (
            "HAND_BACK_ON_UNINSTALL where an uninstall cannot be told from a restart",
            &["--safe-upgrade=false"],
            &[("HAND_BACK_ON_UNINSTALL", "iptables-nft")],
            &["HAND_BACK_ON_UNINSTALL", "SAFE_UPGRADE=true"],
        ),
        (
            "repair attempts negative",
            &["--repair-max-attempts=-1"],
            &[],
            &["repair-max-attempts", "-1"],
        ),
        (
            "repair switch",
            &[],
            &[("REPAIR_ENABLED", "on")],
            &["REPAIR_ENABLED", "on"],
        ),
        (
            "repair mode switch",
            &[],
            &[("REPAIR_DELETE_PODS", "yes")],
            &["REPAIR_DELETE_PODS", "yes"],
        ),
        (
            "untaint switch",
            &[],
            &[("UNTAINT_NODE", "maybe")],
            &["UNTAINT_NODE", "maybe"],
        ),
        (
            "untaint without a key",
            &["--untaint-node", "--untaint-taint-key", " "],
            &[],
            &["untaint-taint-key"],
        ),
        (
            "monitoring port out of range",
            &[],
            &[("MONITORING_PORT", "65536")],
            &["MONITORING_PORT", "65536"],
        ),
        (
            "monitoring port not a number",
            &["--monitoring-port", "http"],
            &[],
            &["monitoring-port", "http"],
        ),
    ];
    for (what, args, env, names) in rows {
        let env_map: std::collections::HashMap<&str, &str> = env.iter().copied().collect();
        let lookup = |k: &str| env_map.get(k).map(|v| v.to_string());
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let msg = match parse(args, &lookup) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => e.to_string(),
        };
        for n in *names {
            assert!(msg.contains(n), "{what}: {msg:?} does not name {n:?}");
        }
    }
    eprintln!("installer settings: {} rows refused by name", rows.len());
}

/// `AMBIENT_ENABLEMENT_SELECTOR` as Istio's chart renders it (`toYaml`), as ours renders it
/// (JSON), and empty: the terms the agent enrolls by, and the plugin's entry carries them.
#[test]
fn the_enablement_selector_is_read_as_istio_writes_it_and_reaches_the_plugin() {
    use cni_node::plugin_entry::plugin_entry;
    use cni_node::settings::{parse, Parsed};
    use redirect_core::ambient::EnablementSelectors;
    let settings = |value: &str| {
        let env = [
            ("AMBIENT_ENABLED", "true"),
            ("AMBIENT_ENABLEMENT_SELECTOR", value),
        ];
        let lookup = move |k: &str| {
            env.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        };
        match parse(Vec::<OsString>::new(), &lookup) {
            Ok(Parsed::Run(s)) => *s,
            other => panic!("{value}: {other:?}"),
        }
    };
    let istio_yaml = "- podSelector:\n    matchExpressions:\n    - key: istio.io/dataplane-mode\n      \
                      operator: NotIn\n      values:\n      - none\n  namespaceSelector:\n    \
                      matchExpressions:\n    - key: istio.io/dataplane-mode\n      operator: NotIn\n      \
                      values:\n      - none\n";
    let json = r#"[{"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},"namespaceSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]}}]"#;
    let (from_yaml, from_json) = (settings(istio_yaml), settings(json));
    assert_eq!(from_yaml.ambient.selectors, from_json.ambient.selectors);
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let none = labels(&[("istio.io/dataplane-mode", "none")]);
    let sel = &from_yaml.ambient.selectors;
    assert!(sel.matches(&labels(&[]), &labels(&[])));
    assert!(!sel.matches(&none, &labels(&[])) && !sel.matches(&labels(&[]), &none));
    // The plugin decides by the same terms while the agent is away.
    let entry = plugin_entry(&from_yaml);
    let carried: EnablementSelectors =
        serde_json::from_value(entry["enablement_selectors"].clone()).expect("carried");
    assert_eq!(&carried, sel);
    // Empty: Istio's default, left out of the entry (the plugin's default too).
    let default = settings("  ");
    assert!(default.ambient.selectors.is_istio_default());
    assert!(plugin_entry(&default).get("enablement_selectors").is_none());
    // []: none, as with Istio.
    let nothing = settings("[]");
    assert!(!nothing
        .ambient
        .selectors
        .matches(&none, &labels(&[("istio.io/dataplane-mode", "ambient")])));
    assert_eq!(
        plugin_entry(&nothing)["enablement_selectors"],
        serde_json::json!([])
    );
}

/// `CAPTURE_COUNTERS`: the plugin's entry carries `counters` (the plugin's ADD puts them in a
/// sidecar pod's rules) in either mode that counts, and ambient's in-pod rules carry them too.
#[test]
fn capture_counters_reach_the_plugin_entry_and_ambients_rules() {
    use cni_node::plugin_entry::plugin_entry;
    use cni_node::settings::{parse, Parsed};
    use cni_node::telemetry::capture_counts::CountersMode;
    let with = |value: &str| {
        let env = |k: &str| (k == "CAPTURE_COUNTERS").then(|| value.to_string());
        match parse(Vec::<OsString>::new(), &env) {
            Ok(Parsed::Run(s)) => *s,
            other => panic!("CAPTURE_COUNTERS={value}: {other:?}"),
        }
    };
    for (value, mode) in [
        ("off", CountersMode::Off),
        ("node", CountersMode::Node),
        ("pod", CountersMode::Pod),
    ] {
        let s = with(value);
        assert_eq!(s.capture_counters, mode);
        let entry = plugin_entry(&s);
        assert_eq!(
            entry.get("counters").is_some(),
            mode.on(),
            "{value}: {entry}"
        );
        assert_eq!(s.ambient.base.counters, mode.on(), "{value}");
    }
}
