//! The hand-back: a namespace we capture, given back to Istio in the form Istio's own nftables
//! backend writes for the same config, so that Istio's agent, starting after us, finds its
//! rules in place and nothing to change.

use redirect_istio::nft_form::IstioNft;
use redirect_kernel::SystemGroups;
use redirect_model::CaptureConfig;

use crate::error::Result;
use crate::namespace::Namespace;

/// What a hand-back wrote and removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandedBack {
    /// The tables written (`inet istio-proxy-nat`, ...).
    pub tables: Vec<String>,
    /// Whether our table was there (it went in the same batch).
    pub had_ours: bool,
}

impl Namespace {
    /// Istio's native nftables tables for `cfg` (a sidecar's config) in place of our table, in
    /// one batch bound to the generation our table was read at: no packet sees neither. The
    /// TPROXY routing and `::6` on `lo` are Istio's values and stay. A config Istio has no rule
    /// for (our bypass UIDs) is refused before anything is changed, as is a group name the
    /// host does not know.
    pub fn hand_back(&self, cfg: &CaptureConfig) -> Result<HandedBack> {
        cfg.validate()?;
        let istio = IstioNft::build(cfg)?;
        let tables = istio.lower(&SystemGroups)?;
        let had_ours = self.backend().hand_over(&tables)?;
        Ok(HandedBack {
            tables: istio.table_names(),
            had_ours,
        })
    }
}
