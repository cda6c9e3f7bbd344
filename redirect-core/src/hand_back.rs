//! The hand-back: a namespace we capture, given back to Istio in the form Istio itself writes
//! for the same config (its native nftables tables, or its iptables rules as iptables-nft keeps
//! them), so that Istio's agent, starting after us, finds its rules in place and nothing to
//! change. Sidecar and ambient pods go back in either form. `Namespace::hand_back` and
//! `hand_back_ambient` call these with the namespace's backend and what it holds of Istio's.

use redirect_istio::iptables_form::IstioIptables;
use redirect_istio::nft_form::{IstioNft, Unsupported};
use redirect_kernel::backend::Backend;
use redirect_kernel::SystemGroups;
use redirect_model::{AmbientConfig, CaptureConfig};

use crate::error::{Error, Result};
use crate::foreign::ForeignRules;

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

/// Istio's rules for a sidecar's `cfg` in `form`, in place of our table, through `backend`
/// (`Namespace::hand_back`, which checked the config and that Istio holds nothing).
pub(crate) fn sidecar(
    backend: &dyn Backend,
    cfg: &CaptureConfig,
    form: IstioForm,
) -> Result<HandedBack> {
    match form {
        IstioForm::Nftables => over_nft(backend, IstioNft::build(cfg)?),
        IstioForm::IptablesNft => over_xt(backend, IstioIptables::build(cfg)?),
    }
}

/// Istio's ambient in-pod rules for `cfg` in `form`, as [`sidecar`] (`Namespace::hand_back_ambient`).
pub(crate) fn ambient(
    backend: &dyn Backend,
    cfg: &AmbientConfig,
    form: IstioForm,
) -> Result<HandedBack> {
    match form {
        IstioForm::Nftables => over_nft(backend, IstioNft::ambient(cfg)),
        IstioForm::IptablesNft => over_xt(backend, IstioIptables::ambient(cfg)),
    }
}

/// Refuses a namespace that holds Istio's rules already (`held`, as read there): the new ones
/// would double them.
pub(crate) fn refuse_istio_held(held: &ForeignRules) -> Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    Err(Error::HandBack(Unsupported {
        what: format!("a namespace that holds Istio's rules already ({held})"),
        fix: "remove them (or leave the pod to Istio as it is) before handing back".into(),
    }))
}

fn over_nft(backend: &dyn Backend, istio: IstioNft) -> Result<HandedBack> {
    let lowered = istio.lower(&SystemGroups)?;
    let had_ours = backend.hand_over(&lowered)?;
    Ok(HandedBack {
        tables: istio.table_names(),
        had_ours,
    })
}

fn over_xt(backend: &dyn Backend, istio: IstioIptables) -> Result<HandedBack> {
    let lowered = istio.lower(&SystemGroups)?;
    let tables = lowered
        .iter()
        .map(|t| format!("{} {}", t.family.nft_name(), t.name))
        .collect();
    let had_ours = backend.hand_over_xt(&lowered)?;
    Ok(HandedBack { tables, had_ours })
}
