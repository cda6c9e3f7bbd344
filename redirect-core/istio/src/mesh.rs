//! Whether a pod is in the mesh and, if so, its capture config, from its annotations (and its
//! spec when known), as istio-cni decides and maps them (docs/redirect-cni.md, "Which pods, and their settings").
//! Shared by the CNI plugin and by `redirect-validate inspect --annotations`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::pod::{ContainerInfo, PodInfo};
use redirect_model::parse::{
    parse_cidr_selection, parse_cidrs, parse_ids, parse_interfaces, parse_port_selection,
    parse_ports,
};
use redirect_model::{CaptureConfig, DnsCapture, InterceptionMode, Selection, ValidConfig};
use redirect_model::{Error, IdKind, Result};

/// The injector's status annotation: present on every injected pod, it lists the containers
/// the injector added (in the mesh only when present).
pub const STATUS: &str = "sidecar.istio.io/status";
/// `false` keeps a pod out of the mesh; read as a label first, then as an annotation.
pub const INJECT: &str = "sidecar.istio.io/inject";
/// `REDIRECT` (default) or `TPROXY`, exactly as Istio spells them.
pub const INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
/// Outbound destinations to capture: `*` (default) or CIDRs.
pub const INCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/includeOutboundIPRanges";
/// Outbound destinations never captured (CIDRs).
pub const EXCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";
/// Inbound ports to capture: `*` (default) or a list; empty captures no inbound traffic.
pub const INCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeInboundPorts";
/// Inbound ports never captured (15020 by default); 15020, 15021 and 15090 are always added.
pub const EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
/// Outbound ports captured whatever the destination.
pub const INCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeOutboundPorts";
/// Outbound ports never captured; replaces istio-cni's default (15020).
pub const EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
/// Interfaces on which nothing is captured.
pub const EXCLUDE_INTERFACES: &str = "traffic.sidecar.istio.io/excludeInterfaces";
/// Interfaces whose inbound traffic is treated as outbound (KubeVirt VMs); wins over
/// [`KUBEVIRT_INTERFACES`].
pub const REROUTE_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";
/// The older name of [`REROUTE_INTERFACES`], read when that one is absent.
pub const KUBEVIRT_INTERFACES: &str = "traffic.sidecar.istio.io/kubevirtInterfaces";
/// Ours: UIDs/GIDs whose outbound traffic is never captured (init containers).
pub const BYPASS_UIDS: &str = "redirect.io/bypass-uids";
/// Ours: GIDs whose outbound traffic is never captured (the GID side of [`BYPASS_UIDS`]).
pub const BYPASS_GIDS: &str = "redirect.io/bypass-gids";

/// Every annotation this module reads, for documentation and tests.
pub const ANNOTATIONS: &[&str] = &[
    STATUS,
    INJECT,
    INTERCEPTION_MODE,
    INCLUDE_OUTBOUND_IP_RANGES,
    EXCLUDE_OUTBOUND_IP_RANGES,
    INCLUDE_INBOUND_PORTS,
    EXCLUDE_INBOUND_PORTS,
    INCLUDE_OUTBOUND_PORTS,
    EXCLUDE_OUTBOUND_PORTS,
    EXCLUDE_INTERFACES,
    REROUTE_INTERFACES,
    KUBEVIRT_INTERFACES,
    BYPASS_UIDS,
    BYPASS_GIDS,
];

/// Every pod label this module reads (`sidecar.istio.io/inject` is read as a label first).
pub const LABELS: &[&str] = &[INJECT];

/// Every `istio-proxy` environment variable this module reads from the pod spec.
pub const PROXY_ENV: &[&str] = &[
    "DISABLE_ENVOY",
    "ISTIO_META_DNS_CAPTURE",
    "ISTIO_DUAL_STACK",
    "INVALID_DROP",
];

const PROXY: &str = "istio-proxy";
/// Ports istio-cni always excludes inbound (agent status, Envoy health, Envoy metrics).
const ALWAYS_EXCLUDED_INBOUND: [u16; 3] = [15020, 15021, 15090];
/// istio-cni's default outbound exclusion (the agent's status port), replaced by the annotation.
const DEFAULT_EXCLUDED_OUTBOUND: u16 = 15020;

/// What the plugin's own config says where the pod cannot (annotations only). Its fields are
/// the plugin config's, by the same names (`proxy_uid`, `dns_capture`, `bypass_uids`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct MeshDefaults {
    /// The proxy UID/GID when the spec is unknown. `None`: the spec must be fetched, because a
    /// wrong UID captures the proxy's own traffic in a loop.
    pub proxy_uid: Option<u32>,
    /// The proxy GID when the spec is unknown; `None`: the proxy UID.
    pub proxy_gid: Option<u32>,
    /// The proxy env settings when the spec is unknown (Istio reads them from istio-proxy's env):
    /// `ISTIO_META_DNS_CAPTURE`, capture all DNS.
    pub dns_capture: bool,
    /// `ISTIO_DUAL_STACK`: IPv6 rules when the pod has an IPv6 address.
    pub dual_stack: bool,
    /// `INVALID_DROP`: drop packets conntrack finds INVALID.
    pub drop_invalid: bool,
    /// Bypass IDs for every pod (plugin level); a pod's annotation adds to them.
    pub bypass_uids: Vec<u32>,
    /// Bypass GIDs for every pod; the pod's annotation adds to them.
    pub bypass_gids: Vec<u32>,
    /// Ours, opt-in: counters on the rules that decide a path (`CaptureConfig::counters`),
    /// which the node agent exports per pod.
    pub counters: bool,
}

/// The outcome for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not in the mesh (or not handled by the CNI plugin): do nothing. The reason is for logs.
    Skip(String),
    /// The annotations are not enough: fetch the pod spec and decide again.
    NeedSpec(String),
    /// Capture with this config. `dual_stack` decides IPv6 from the pod's addresses (derived
    /// later, in the namespace); the warnings are for logs.
    Capture {
        /// The validated capture config (IPv6 is set later, from the pod's addresses).
        config: Box<ValidConfig>,
        /// Istio's `ISTIO_DUAL_STACK`: any IPv6 address of the pod turns IPv6 on.
        dual_stack: bool,
        /// What was taken as Istio takes it but deserves a log line (an env value that is not
        /// a boolean).
        warnings: Vec<String>,
    },
}

/// The injector's status annotation (only the fields we use).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InjectStatus {
    #[serde(default)]
    init_containers: Vec<String>,
    #[serde(default)]
    containers: Vec<String>,
}

/// Go's strconv.ParseBool, after trimming (annotation and env values are hand-written).
fn parse_bool(s: &str) -> Option<bool> {
    crate::go::parse_bool(s.trim())
}

/// Why a pod's capture cannot be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    /// An annotation has a bad value (named with its key), or brought one of the proxy's IDs
    /// into a bypass list.
    #[error(transparent)]
    Annotation(Error),
    /// The defaults themselves (the plugin config's `bypass_uids`/`bypass_gids`) name one of
    /// the proxy's IDs.
    #[error(transparent)]
    DefaultsConflict(Error),
}

impl From<Error> for MeshError {
    fn from(e: Error) -> Self {
        MeshError::Annotation(e)
    }
}

/// Decide for a pod. Errors are bad annotation values (named with their key), or defaults
/// that conflict with the proxy's IDs.
pub fn decide(pod: &PodInfo, defaults: &MeshDefaults) -> Result<Decision, MeshError> {
    let ann = &pod.annotations;
    let Some(status) = ann.get(STATUS) else {
        return Ok(Decision::Skip(format!(
            "no {STATUS} annotation: the sidecar was not injected"
        )));
    };
    let inject = pod
        .labels
        .get(INJECT)
        .or_else(|| ann.get(INJECT))
        .and_then(|v| parse_bool(v));
    if inject == Some(false) {
        return Ok(Decision::Skip(format!("{INJECT} is false")));
    }
    match &pod.spec {
        Some(spec) => {
            if spec.container("istio-init").is_some() {
                return Ok(Decision::Skip(
                    "the pod has the istio-init container: its rules come from there".into(),
                ));
            }
            let Some(proxy) = spec.container(PROXY) else {
                return Ok(Decision::Skip(format!("no {PROXY} container")));
            };
            if proxy
                .env
                .get("DISABLE_ENVOY")
                .and_then(|v| parse_bool(v))
                .unwrap_or(false)
            {
                return Ok(Decision::Skip(format!("{PROXY} has DISABLE_ENVOY=true")));
            }
            if let Some(i) = proxy.args.iter().position(|a| a == "proxy") {
                if let Some(kind) = proxy.args.get(i + 1).filter(|k| *k != "sidecar") {
                    return Ok(Decision::Skip(format!(
                        "{PROXY} runs `proxy {kind}`, not a sidecar"
                    )));
                }
            }
        }
        None => {
            // The injector lists what it added; an unparsable status is Istio's "injected".
            let st: InjectStatus = serde_json::from_str(status).unwrap_or_default();
            if st.init_containers.iter().any(|c| c == "istio-init") {
                return Ok(Decision::Skip(
                    "the injector added istio-init: its rules come from there".into(),
                ));
            }
            let listed = !st.containers.is_empty() || !st.init_containers.is_empty();
            if listed
                && !st
                    .containers
                    .iter()
                    .chain(&st.init_containers)
                    .any(|c| c == PROXY)
            {
                return Ok(Decision::Skip(format!(
                    "the injector added no {PROXY} container"
                )));
            }
            if defaults.proxy_uid.is_none() {
                return Ok(Decision::NeedSpec(format!(
                    "the proxy UID comes from the {PROXY} container's runAsUser (the plugin config does not pin proxy_uid)"
                )));
            }
        }
    }
    config_for(pod, defaults).map(|(config, dual_stack, warnings)| Decision::Capture {
        config: Box::new(config),
        dual_stack,
        warnings,
    })
}

fn ann_err(key: &'static str, value: &str, e: Error) -> Error {
    let expected = match e {
        Error::Config { expected, .. } => expected,
        other => other.to_string(),
    };
    Error::Config {
        field: key,
        value: value.to_string(),
        expected,
    }
}

fn typed<T>(
    ann: &BTreeMap<String, String>,
    key: &'static str,
    default: &str,
    parse: fn(&'static str, &str) -> Result<T>,
) -> Result<T> {
    let v = ann.get(key).map(String::as_str).unwrap_or(default);
    parse(key, v).map_err(|e| ann_err(key, v, e))
}

fn config_for(
    pod: &PodInfo,
    d: &MeshDefaults,
) -> Result<(ValidConfig, bool, Vec<String>), MeshError> {
    let ann = &pod.annotations;
    let mut warnings = Vec::new();
    let proxy = pod.spec.as_ref().and_then(|s| s.container(PROXY));
    let (uid, gid) = proxy_ids(proxy, d);
    let dns = env_bool(
        "ISTIO_META_DNS_CAPTURE",
        proxy,
        d.dns_capture,
        &mut warnings,
    );
    let dual_stack = env_bool("ISTIO_DUAL_STACK", proxy, d.dual_stack, &mut warnings);
    let drop_invalid = env_bool("INVALID_DROP", proxy, d.drop_invalid, &mut warnings);
    // Read in this order, so that of two bad annotations the same one is reported.
    let mode = interception_mode(ann)?;
    let exclude_in = inbound_excludes(ann)?;
    let exclude_out = outbound_excludes(ann)?;
    let reroute_key = if ann.contains_key(REROUTE_INTERFACES) {
        REROUTE_INTERFACES
    } else {
        KUBEVIRT_INTERFACES
    };
    let ann_bypass_uids: Vec<u32> = typed(ann, BYPASS_UIDS, "", parse_ids)?;
    let ann_bypass_gids: Vec<u32> = typed(ann, BYPASS_GIDS, "", parse_ids)?;
    let config = CaptureConfig {
        proxy_uids: vec![uid],
        proxy_gids: vec![gid],
        mode,
        inbound_ports: typed(ann, INCLUDE_INBOUND_PORTS, "*", parse_port_selection)?,
        inbound_exclude_ports: exclude_in,
        outbound_include_cidrs: typed(ann, INCLUDE_OUTBOUND_IP_RANGES, "*", parse_cidr_selection)?,
        outbound_exclude_cidrs: typed(ann, EXCLUDE_OUTBOUND_IP_RANGES, "", parse_cidrs)?,
        outbound_include_ports: typed(ann, INCLUDE_OUTBOUND_PORTS, "", parse_ports)?,
        outbound_exclude_ports: exclude_out,
        exclude_interfaces: typed(ann, EXCLUDE_INTERFACES, "", parse_interfaces)?,
        reroute_interfaces: typed(ann, reroute_key, "", parse_interfaces)?,
        // The plugin cannot see the pod's resolv.conf: DNS capture means all DNS (as Istio).
        dns: if dns {
            DnsCapture::All
        } else {
            DnsCapture::Off
        },
        drop_invalid,
        bypass_uids: [d.bypass_uids.as_slice(), &ann_bypass_uids].concat(),
        bypass_gids: [d.bypass_gids.as_slice(), &ann_bypass_gids].concat(),
        counters: d.counters,
        ..CaptureConfig::default()
    };
    let config = config
        .validated()
        .map_err(|e| blame_bypass(e, &ann_bypass_uids, &ann_bypass_gids))?;
    Ok((config, dual_stack, warnings))
}

/// The proxy's UID and GID: from its container's security context when the spec is known
/// (Istio: runAsUser nil or 0 means 1337, as a root proxy would bypass itself in TPROXY),
/// else from the plugin's defaults.
fn proxy_ids(proxy: Option<&ContainerInfo>, d: &MeshDefaults) -> (u32, u32) {
    let id = |v: Option<i64>, default: Option<u32>| -> u32 {
        match v {
            Some(n) if n > 0 => u32::try_from(n).unwrap_or(1337),
            Some(_) => 1337,
            None => default.unwrap_or(1337),
        }
    };
    match proxy {
        Some(p) => (id(p.run_as_user, None), id(p.run_as_group, None)),
        None => {
            let uid = d.proxy_uid.unwrap_or(1337);
            (uid, d.proxy_gid.unwrap_or(uid))
        }
    }
}

/// A boolean of the proxy's env: the plugin's default when the spec is unknown; unset or not
/// a boolean is false, as Istio takes it (with a warning for the latter).
fn env_bool(
    name: &str,
    proxy: Option<&ContainerInfo>,
    default: bool,
    warnings: &mut Vec<String>,
) -> bool {
    match proxy {
        None => default,
        Some(p) => match p.env.get(name) {
            None => false,
            Some(v) => parse_bool(v).unwrap_or_else(|| {
                warnings.push(format!(
                    "{PROXY} env {name}={v:?} is not a boolean: taken as false (as Istio does)"
                ));
                false
            }),
        },
    }
}

/// The interception mode annotation, exactly as Istio spells it.
fn interception_mode(ann: &BTreeMap<String, String>) -> Result<InterceptionMode> {
    match ann.get(INTERCEPTION_MODE) {
        None => Ok(InterceptionMode::Redirect),
        Some(v) => match v.as_str() {
            "REDIRECT" => Ok(InterceptionMode::Redirect),
            "TPROXY" => Ok(InterceptionMode::Tproxy),
            _ => Err(Error::Config {
                field: INTERCEPTION_MODE,
                value: v.clone(),
                expected: "REDIRECT or TPROXY (case matters, as in Istio)".into(),
            }),
        },
    }
}

/// The inbound ports not captured: the annotation's list (15020 by default), never `*`, and
/// the ports istio-cni always excludes.
fn inbound_excludes(ann: &BTreeMap<String, String>) -> Result<Vec<u16>> {
    let mut exclude_in = match typed(ann, EXCLUDE_INBOUND_PORTS, "15020", parse_port_selection)? {
        Selection::List(l) => l,
        Selection::All => {
            return Err(Error::Config {
                field: EXCLUDE_INBOUND_PORTS,
                value: ann.get(EXCLUDE_INBOUND_PORTS).cloned().unwrap_or_default(),
                expected: format!(
                "a port list; to capture no inbound traffic set {INCLUDE_INBOUND_PORTS} to \"\""
            ),
            })
        }
    };
    for p in ALWAYS_EXCLUDED_INBOUND {
        if !exclude_in.contains(&p) {
            exclude_in.push(p);
        }
    }
    Ok(exclude_in)
}

/// The outbound ports not captured: the annotation replaces istio-cni's default.
fn outbound_excludes(ann: &BTreeMap<String, String>) -> Result<Vec<u16>> {
    match ann.get(EXCLUDE_OUTBOUND_PORTS) {
        None => Ok(vec![DEFAULT_EXCLUDED_OUTBOUND]),
        Some(v) => parse_ports(EXCLUDE_OUTBOUND_PORTS, v)
            .map_err(|e| ann_err(EXCLUDE_OUTBOUND_PORTS, v, e)),
    }
}

/// Blame the annotation for a bypass conflict only when it brought the conflicting ID;
/// otherwise it came from the defaults (`bypass_uids`/`bypass_gids`), whose name stays.
fn blame_bypass(e: Error, ann_bypass_uids: &[u32], ann_bypass_gids: &[u32]) -> MeshError {
    match e {
        Error::BypassConflict { field, kind, id } => {
            let (key, from_ann) = match kind {
                IdKind::Uid => (BYPASS_UIDS, ann_bypass_uids),
                IdKind::Gid => (BYPASS_GIDS, ann_bypass_gids),
            };
            if from_ann.contains(&id) {
                MeshError::Annotation(Error::BypassConflict {
                    field: key,
                    kind,
                    id,
                })
            } else {
                MeshError::DefaultsConflict(Error::BypassConflict { field, kind, id })
            }
        }
        other => MeshError::Annotation(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{ContainerInfo, PodSpecInfo};

    /// This file's code without whitespace (and without its tests), for the list checks below.
    fn code_without_whitespace() -> String {
        let src = include_str!("mesh.rs");
        let code = &src[..src.find("#[cfg(test)]").expect("the tests module")];
        code.lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<String>()
            .split_whitespace()
            .collect()
    }

    /// The first argument of every `pattern(...)` call in `code`.
    fn first_args<'a>(code: &'a str, pattern: &str) -> Vec<&'a str> {
        code.match_indices(pattern)
            .map(|(i, _)| {
                let rest = &code[i + pattern.len()..];
                &rest[..rest.find([',', ')']).expect("an argument list")]
            })
            .collect()
    }

    /// The value of `pub const NAME: &str = "...";` in `code`.
    fn const_value<'a>(code: &'a str, name: &str) -> Option<&'a str> {
        let decl = format!("pubconst{name}:&str=\"");
        let i = code.find(&decl)? + decl.len();
        Some(&code[i..i + code[i..].find('"')?])
    }

    #[test]
    fn every_annotation_label_and_env_read_is_listed() {
        let code = code_without_whitespace();
        // Every annotation-like constant is listed (so the docs check covers it).
        for (i, _) in code.match_indices("pubconst") {
            let name = code[i + "pubconst".len()..].split(':').next().unwrap_or("");
            if let Some(value) = const_value(&code, name).filter(|v| v.contains('/')) {
                assert!(
                    ANNOTATIONS.contains(&value) || LABELS.contains(&value),
                    "{name} = {value:?} is not in ANNOTATIONS or LABELS"
                );
            }
        }
        // Every annotation read names a listed constant (or a variable set from them).
        let mut reads = 0;
        for pattern in [
            "ann.get(",
            "ann.contains_key(",
            "typed(ann,",
            "annotations.get(",
        ] {
            for arg in first_args(&code, pattern) {
                reads += 1;
                assert!(
                    !arg.starts_with('"'),
                    "annotation {arg} read by literal: use a constant in ANNOTATIONS"
                );
                if arg.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                    let value = const_value(&code, arg)
                        .unwrap_or_else(|| panic!("{arg}: no such constant"));
                    assert!(
                        ANNOTATIONS.contains(&value),
                        "annotation {arg} = {value:?} is read but not in ANNOTATIONS"
                    );
                }
            }
        }
        assert!(
            reads >= ANNOTATIONS.len(),
            "found only {reads} annotation reads: is the pattern stale?"
        );
        let labels = first_args(&code, "labels.get(");
        assert!(
            !labels.is_empty(),
            "no label read found: is the pattern stale?"
        );
        for arg in labels {
            let value =
                const_value(&code, arg).unwrap_or_else(|| panic!("label {arg}: not a constant"));
            assert!(
                LABELS.contains(&value),
                "label {arg} = {value:?} is read but not in LABELS"
            );
        }
        let envs: Vec<&str> = ["env.get(", "env_bool("]
            .iter()
            .flat_map(|p| first_args(&code, p))
            .filter(|a| a.starts_with('"'))
            .map(|a| a.trim_matches('"'))
            .collect();
        assert!(
            envs.len() >= PROXY_ENV.len(),
            "found only {envs:?}: is the pattern stale?"
        );
        for name in envs {
            assert!(
                PROXY_ENV.contains(&name),
                "istio-proxy env {name} is read but not in PROXY_ENV"
            );
        }
    }

    fn pod(ann: &[(&str, &str)], spec: Option<PodSpecInfo>) -> PodInfo {
        PodInfo {
            namespace: "ns".into(),
            name: "p".into(),
            annotations: ann
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            labels: BTreeMap::new(),
            spec,
        }
    }

    fn injected_spec(uid: Option<i64>, env: &[(&str, &str)]) -> PodSpecInfo {
        PodSpecInfo {
            containers: vec![
                ContainerInfo {
                    name: "app".into(),
                    ..Default::default()
                },
                ContainerInfo {
                    name: PROXY.into(),
                    args: vec!["proxy".into(), "sidecar".into()],
                    env: env
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    run_as_user: uid,
                    run_as_group: uid,
                },
            ],
            init_containers: vec![ContainerInfo {
                name: "istio-validation".into(),
                ..Default::default()
            }],
        }
    }

    const STATUS_CNI: &str =
        r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#;

    fn capture(d: Decision) -> (CaptureConfig, bool) {
        match d {
            Decision::Capture {
                config, dual_stack, ..
            } => (config.into_inner(), dual_stack),
            other => panic!("expected capture, got {other:?}"),
        }
    }

    #[test]
    fn istio_cni_defaults() {
        let (cfg, dual) = capture(
            decide(
                &pod(&[(STATUS, STATUS_CNI)], Some(injected_spec(None, &[]))),
                &MeshDefaults::default(),
            )
            .unwrap(),
        );
        assert!(!dual);
        assert_eq!(cfg.inbound_ports, Selection::All);
        assert_eq!(cfg.outbound_include_cidrs, Selection::All);
        assert_eq!(cfg.inbound_exclude_ports, [15020, 15021, 15090]);
        assert_eq!(cfg.outbound_exclude_ports, [15020]);
        assert_eq!(
            (cfg.proxy_uids.clone(), cfg.proxy_gids.clone()),
            (vec![1337], vec![1337])
        );
        assert_eq!(cfg.dns, DnsCapture::Off);
    }

    #[test]
    fn annotations_and_env_map_as_istio_maps_them() {
        let p = pod(
            &[
                (STATUS, STATUS_CNI),
                (INTERCEPTION_MODE, "TPROXY"),
                (INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/8"),
                (EXCLUDE_OUTBOUND_IP_RANGES, "10.96.0.0/12"),
                (INCLUDE_INBOUND_PORTS, "8080,9090"),
                (EXCLUDE_INBOUND_PORTS, "9090,15021"),
                (INCLUDE_OUTBOUND_PORTS, "3306"),
                (EXCLUDE_OUTBOUND_PORTS, "9000"),
                (EXCLUDE_INTERFACES, "eth9"),
                (KUBEVIRT_INTERFACES, "old0"),
                (REROUTE_INTERFACES, "tap0"),
                (BYPASS_UIDS, "1000"),
            ],
            Some(injected_spec(
                Some(1000620000),
                &[
                    ("ISTIO_META_DNS_CAPTURE", "true"),
                    ("ISTIO_DUAL_STACK", "true"),
                    ("INVALID_DROP", "1"),
                ],
            )),
        );
        let d = MeshDefaults {
            bypass_uids: vec![999],
            ..Default::default()
        };
        let (cfg, dual) = capture(decide(&p, &d).unwrap());
        assert!(dual && cfg.drop_invalid);
        assert_eq!(cfg.mode, InterceptionMode::Tproxy);
        assert_eq!(cfg.proxy_uids, [1000620000]);
        assert_eq!(cfg.inbound_ports, Selection::List(vec![8080, 9090]));
        assert_eq!(cfg.inbound_exclude_ports, [9090, 15021, 15020, 15090]);
        assert_eq!(
            cfg.outbound_exclude_ports,
            [9000],
            "the annotation replaces 15020"
        );
        assert_eq!(cfg.outbound_include_ports, [3306]);
        assert_eq!(cfg.exclude_interfaces, ["eth9"]);
        assert_eq!(cfg.reroute_interfaces, ["tap0"], "the new annotation wins");
        assert_eq!(cfg.dns, DnsCapture::All);
        assert_eq!(cfg.bypass_uids, [999, 1000]);
    }

    #[test]
    fn skips_pods_outside_the_mesh() {
        let d = MeshDefaults::default();
        let skip = |p: PodInfo| matches!(decide(&p, &d).unwrap(), Decision::Skip(_));
        assert!(skip(pod(&[], Some(injected_spec(None, &[])))), "no status");
        assert!(skip(pod(
            &[(STATUS, STATUS_CNI), (INJECT, "false")],
            Some(injected_spec(None, &[]))
        )));
        let mut spec = injected_spec(None, &[("DISABLE_ENVOY", "true")]);
        assert!(skip(pod(&[(STATUS, STATUS_CNI)], Some(spec.clone()))));
        spec.containers[1].env.clear();
        spec.containers[1].args = vec!["proxy".into(), "router".into()];
        assert!(
            skip(pod(&[(STATUS, STATUS_CNI)], Some(spec.clone()))),
            "gateway"
        );
        spec.init_containers.push(ContainerInfo {
            name: "istio-init".into(),
            ..Default::default()
        });
        spec.containers[1].args.clear();
        assert!(skip(pod(&[(STATUS, STATUS_CNI)], Some(spec))), "istio-init");
        assert!(
            skip(pod(&[(STATUS, STATUS_CNI)], Some(PodSpecInfo::default()))),
            "no proxy"
        );
        let init_status = r#"{"initContainers":["istio-init"],"containers":["istio-proxy"]}"#;
        assert!(skip(pod(&[(STATUS, init_status)], None)));
    }

    #[test]
    fn annotations_only_need_a_pinned_uid() {
        let p = pod(&[(STATUS, STATUS_CNI)], None);
        assert!(matches!(
            decide(&p, &MeshDefaults::default()).unwrap(),
            Decision::NeedSpec(_)
        ));
        let d = MeshDefaults {
            proxy_uid: Some(2000),
            dns_capture: true,
            ..Default::default()
        };
        let (cfg, _) = capture(decide(&p, &d).unwrap());
        assert_eq!(
            (cfg.proxy_uids.clone(), cfg.proxy_gids.clone()),
            (vec![2000], vec![2000])
        );
        assert_eq!(cfg.dns, DnsCapture::All);
    }

    #[test]
    fn bad_annotations_name_the_key_and_value() {
        let spec = Some(injected_spec(None, &[]));
        for (k, v) in [
            (INTERCEPTION_MODE, "redirect"),
            (INCLUDE_INBOUND_PORTS, "80,70000"),
            (EXCLUDE_INBOUND_PORTS, "*"),
            (INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/33"),
            (EXCLUDE_OUTBOUND_IP_RANGES, "*"),
            (EXCLUDE_OUTBOUND_PORTS, "x"),
            (EXCLUDE_INTERFACES, "a/b"),
            (BYPASS_UIDS, "1337"),
            (BYPASS_GIDS, "g"),
        ] {
            let err = decide(
                &pod(&[(STATUS, STATUS_CNI), (k, v)], spec.clone()),
                &MeshDefaults::default(),
            )
            .expect_err(&format!("{k}={v} accepted"))
            .to_string();
            assert!(err.contains(k), "{k}={v}: {err}");
        }
    }
}
