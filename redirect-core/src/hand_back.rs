//! The hand-back: a namespace we capture, given back to Istio in the form Istio itself writes
//! for the same config (its native nftables tables, or its iptables rules as iptables-nft keeps
//! them), so that Istio's agent, starting after us, finds its rules in place and nothing to
//! change.

use redirect_istio::iptables_form::IstioIptables;
use redirect_istio::nft_form::{IstioNft, Unsupported};
use redirect_kernel::SystemGroups;
use redirect_model::CaptureConfig;

use crate::error::{Error, Result};
use crate::namespace::Namespace;

/// Which of Istio's forms a namespace is handed back in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IstioForm {
    /// Istio's native nftables tables (`inet istio-proxy-*`, Istio ≥ 1.28 with
    /// `nativeNftables`).
    #[default]
    Nftables,
    /// Istio's iptables rules as iptables-nft keeps them (`ip`/`ip6` tables `nat`, `mangle`,
    /// `raw`, chains `ISTIO_*`): Istio's default.
    IptablesNft,
}

impl IstioForm {
    /// `nftables` or `iptables-nft`.
    pub fn word(self) -> &'static str {
        match self {
            IstioForm::Nftables => "nftables",
            IstioForm::IptablesNft => "iptables-nft",
        }
    }
}

/// What a hand-back wrote and removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandedBack {
    /// The tables written (`inet istio-proxy-nat`, `ip nat`...).
    pub tables: Vec<String>,
    /// Whether our table was there (it went in the same batch).
    pub had_ours: bool,
}

impl Namespace {
    /// Istio's rules for `cfg` (a sidecar's config) in `form`, in place of our table, in one
    /// batch bound to the generation our table was read at: no packet sees neither. The
    /// TPROXY routing and `::6` on `lo` are Istio's values and stay. Refused before anything
    /// is changed: a config Istio has no rule for (our bypass UIDs), a group name the host does
    /// not know, and a namespace that holds Istio's rules already (which the new ones would
    /// double).
    pub fn hand_back(&self, cfg: &CaptureConfig, form: IstioForm) -> Result<HandedBack> {
        cfg.validate()?;
        let held = self.foreign()?;
        if !held.is_empty() {
            return Err(Error::HandBack(Unsupported {
                what: format!("a namespace that holds Istio's rules already ({held})"),
                fix: "remove them (or leave the pod to Istio as it is) before handing back".into(),
            }));
        }
        let backend = self.backend();
        let (tables, had_ours) = match form {
            IstioForm::Nftables => {
                let istio = IstioNft::build(cfg)?;
                let lowered = istio.lower(&SystemGroups)?;
                (istio.table_names(), backend.hand_over(&lowered)?)
            }
            IstioForm::IptablesNft => {
                let lowered = IstioIptables::build(cfg)?.lower(&SystemGroups)?;
                let names = lowered
                    .iter()
                    .map(|t| format!("{} {}", t.family.nft_name(), t.name))
                    .collect();
                (names, backend.hand_over_xt(&lowered)?)
            }
        };
        Ok(HandedBack { tables, had_ours })
    }
}
