//! The hand-back: a namespace we capture, given back to Istio in the form Istio itself writes
//! for the same config (its native nftables tables, or its iptables rules as iptables-nft keeps
//! them), so that Istio's agent, starting after us, finds its rules in place and nothing to
//! change. Sidecar and ambient pods go back in either form.

use redirect_istio::iptables_form::IstioIptables;
use redirect_istio::nft_form::{IstioNft, Unsupported};
use redirect_kernel::SystemGroups;
use redirect_model::{AmbientConfig, CaptureConfig};

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
        self.refuse_istio_held()?;
        match form {
            IstioForm::Nftables => self.hand_over_nft(IstioNft::build(cfg)?),
            IstioForm::IptablesNft => self.hand_over_xt(IstioIptables::build(cfg)?),
        }
    }

    /// Istio's ambient in-pod rules for `cfg` (an enrolled pod's) in `form`, in place of our
    /// in-pod table, in one batch as [`Namespace::hand_back`]: its native nftables tables
    /// (`inet istio-ambient-*`, Istio ≥ 1.28 with `nativeNftables`) or its iptables rules as
    /// iptables-nft keeps them. The policy routing of ztunnel's replies (mark `0x111`, table
    /// 100) is Istio's too and stays; so do ztunnel's sockets in the pod. Refused before
    /// anything is changed: a namespace that holds Istio's rules already.
    pub fn hand_back_ambient(&self, cfg: &AmbientConfig, form: IstioForm) -> Result<HandedBack> {
        cfg.plan()?;
        self.refuse_istio_held()?;
        match form {
            IstioForm::Nftables => self.hand_over_nft(IstioNft::ambient(cfg)),
            IstioForm::IptablesNft => self.hand_over_xt(IstioIptables::ambient(cfg)),
        }
    }

    fn refuse_istio_held(&self) -> Result<()> {
        let held = self.foreign()?;
        if held.is_empty() {
            return Ok(());
        }
        Err(Error::HandBack(Unsupported {
            what: format!("a namespace that holds Istio's rules already ({held})"),
            fix: "remove them (or leave the pod to Istio as it is) before handing back".into(),
        }))
    }

    fn hand_over_nft(&self, istio: IstioNft) -> Result<HandedBack> {
        let lowered = istio.lower(&SystemGroups)?;
        let had_ours = self.backend().hand_over(&lowered)?;
        Ok(HandedBack {
            tables: istio.table_names(),
            had_ours,
        })
    }

    fn hand_over_xt(&self, istio: IstioIptables) -> Result<HandedBack> {
        let lowered = istio.lower(&SystemGroups)?;
        let tables = lowered
            .iter()
            .map(|t| format!("{} {}", t.family.nft_name(), t.name))
            .collect();
        let had_ours = self.backend().hand_over_xt(&lowered)?;
        Ok(HandedBack { tables, had_ours })
    }
}
