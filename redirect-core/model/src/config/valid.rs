//! [`ValidConfig`]: a config that passed [`CaptureConfig::validate`], so that a program checks
//! it once: planning a `ValidConfig` ([`ValidConfig::plan`]) does not check it again, and the
//! facts a program derives afterwards (the proxy's IDs, IPv6, DNS servers) are set through
//! methods that check only what they change.

use std::ops::Deref;

use serde::Serialize;

use super::{validate, CaptureConfig, DnsCapture};
use crate::error::Result;
use crate::plan::GroupResolver;
use crate::ruleset::Ruleset;

/// A validated [`CaptureConfig`]; read it through `Deref`.
#[derive(Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ValidConfig(CaptureConfig);

impl ValidConfig {
    /// `cfg` once it passed [`CaptureConfig::validate`] (`CaptureConfig::validated`).
    pub(super) fn of(cfg: CaptureConfig) -> Result<ValidConfig> {
        cfg.validate()?;
        Ok(ValidConfig(cfg))
    }

    /// Istio's sidecar defaults, which are valid.
    pub fn istio_sidecar_default() -> ValidConfig {
        ValidConfig(CaptureConfig::istio_sidecar_default())
    }

    /// The rules for this config: the one way to plan, from a config validated once. Owner
    /// group names are resolved by `groups` (the host's group database is
    /// `redirect_kernel::SystemGroups`; [`NoGroupDatabase`](crate::NoGroupDatabase) takes
    /// numeric GIDs only, and a name is then an error naming it). The plan is `crate::plan`'s.
    pub fn plan(&self, groups: &dyn GroupResolver) -> Result<Ruleset> {
        crate::plan::plan_checked(self, groups)
    }

    /// The same config with other proxy IDs: the checks that involve them run again (at
    /// least one of each; no bypass ID among them).
    pub fn with_proxy_ids(self, uids: Vec<u32>, gids: Vec<u32>) -> Result<ValidConfig> {
        let cfg = CaptureConfig {
            proxy_uids: uids,
            proxy_gids: gids,
            ..self.0
        };
        validate::check_proxy_ids(&cfg)?;
        validate::check_bypass(&cfg)?;
        Ok(ValidConfig(cfg))
    }

    /// The same config with IPv6 rules or without (no field depends on it).
    pub fn with_ipv6(self, ipv6: bool) -> ValidConfig {
        ValidConfig(CaptureConfig { ipv6, ..self.0 })
    }

    /// The same config with another DNS capture (no check concerns it).
    pub fn with_dns(self, dns: DnsCapture) -> ValidConfig {
        ValidConfig(CaptureConfig { dns, ..self.0 })
    }

    /// The config itself, to change it (validate it again before planning).
    pub fn into_inner(self) -> CaptureConfig {
        self.0
    }
}

impl Deref for ValidConfig {
    type Target = CaptureConfig;
    fn deref(&self) -> &CaptureConfig {
        &self.0
    }
}

/// Shown as the config it holds.
impl std::fmt::Debug for ValidConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_facts_are_checked_where_they_can_break_the_config() {
        let v = CaptureConfig {
            bypass_uids: vec![1000],
            ..CaptureConfig::istio_sidecar_default()
        }
        .validated()
        .unwrap();
        assert!(v.clone().with_proxy_ids(vec![], vec![1337]).is_err());
        assert!(v.clone().with_proxy_ids(vec![1000], vec![1337]).is_err());
        let v = v.with_proxy_ids(vec![5], vec![5]).unwrap().with_ipv6(true);
        assert_eq!((v.proxy_uids.as_slice(), v.ipv6), (&[5][..], true));
        assert!(CaptureConfig {
            envoy_port: 0,
            ..CaptureConfig::default()
        }
        .validated()
        .is_err());
    }
}
