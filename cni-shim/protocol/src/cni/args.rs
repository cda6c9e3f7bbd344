//! CNI_ARGS: `K=V;K=V`. Unknown keys are accepted silently (runtimes add their own).

use super::{code, CniError};

/// The keys we use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`: the pod's sandbox container.
    pub infra_container_id: Option<String>,
}

/// Parses `CNI_ARGS`; an empty value counts as absent. A pair without `=`, or with an empty
/// key, is an `INVALID_ENV` error naming it.
pub fn parse(s: &str) -> Result<CniArgs, CniError> {
    let mut a = CniArgs::default();
    for pair in s.split(';').filter(|p| !p.trim().is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!("CNI_ARGS: {pair:?} is not KEY=VALUE"),
                format!("CNI_ARGS={s:?}; expected pairs like K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod separated by ';'"),
            ));
        };
        let v = (!v.is_empty()).then(|| v.to_string());
        match k.trim() {
            "K8S_POD_NAMESPACE" => a.pod_namespace = v,
            "K8S_POD_NAME" => a.pod_name = v,
            "K8S_POD_UID" => a.pod_uid = v,
            "K8S_POD_INFRA_CONTAINER_ID" => a.infra_container_id = v,
            "" => {
                return Err(CniError::new(
                    code::INVALID_ENV,
                    format!("CNI_ARGS: {pair:?} has an empty key"),
                    format!("CNI_ARGS={s:?}"),
                ))
            }
            _ => {}
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_and_podman_forms() {
        let a = parse("K8S_POD_UID=u1;IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc").unwrap();
        assert_eq!(a.pod_namespace.as_deref(), Some("ns"));
        assert_eq!(a.pod_name.as_deref(), Some("web-0"));
        assert_eq!(a.pod_uid.as_deref(), Some("u1"));
        let p = parse("IgnoreUnknown=1;K8S_POD_NAME=box").unwrap();
        assert_eq!(
            (p.pod_namespace, p.pod_name.as_deref()),
            (None, Some("box"))
        );
        assert_eq!(parse("").unwrap(), CniArgs::default());
        assert_eq!(parse("K8S_POD_NAME=;").unwrap(), CniArgs::default());
    }

    #[test]
    fn malformed_pairs_are_named() {
        for bad in ["K8S_POD_NAME", "a=b;oops", "=x"] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV);
            assert!(e.msg.contains("CNI_ARGS") && e.details.contains(bad), "{e}");
        }
    }
}
