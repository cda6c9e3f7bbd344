//! Istio ambient's probe SNAT on a [`Namespace`], the host's: kubelet's TCP connections to an
//! enrolled pod's address leave with the source the pods' in-pod rules let through
//! ([`HostProbeConfig`]). Our table `redirect_ambient_host` is programmed in one batch; the
//! pods' addresses are added and removed one batch each as pods are enrolled and released.
//! Each call opens its own nf_tables socket in the namespace (a handful of calls per pod).

use std::net::IpAddr;

use redirect_kernel::capture::host_probe::HostProbe;
use redirect_model::{HostProbeConfig, Ruleset};

use crate::error::Result;
use crate::Namespace;

impl Namespace {
    /// Program the host's probe SNAT for `cfg` in this namespace (meant for the host's): our
    /// table `redirect_ambient_host` with an empty address set per family and the nat
    /// POSTROUTING rule, in one batch, all or nothing. A table of ours already there is
    /// brought to the plan and its sets emptied: add the pods held after this. Returns the
    /// ruleset applied. A namespace made by [`Namespace::with_backend`] has no host table of
    /// its own: this acts on the calling thread's namespace.
    pub fn apply_host_probe(&self, cfg: &HostProbeConfig) -> Result<Ruleset> {
        let rs = cfg.plan()?;
        self.host_table()?.apply(&rs)?;
        Ok(rs)
    }

    /// [`Namespace::apply_host_probe`] with the sets holding `pods`' addresses, all in one
    /// batch: the table and its members come back together (after a firewall reload flushed
    /// the ruleset) or not at all. Bad addresses as for [`Namespace::host_probe_add`].
    pub fn apply_host_probe_with(&self, cfg: &HostProbeConfig, pods: &[IpAddr]) -> Result<Ruleset> {
        let rs = cfg.plan_with(pods)?;
        self.host_table()?.apply(&rs)?;
        Ok(rs)
    }

    /// Add pods' addresses to the sets, in one batch: all or none. An address already there
    /// is fine. An address that cannot be a pod's, or an IPv6 one when `cfg` has IPv6 off, is
    /// an error naming it, and nothing is sent.
    pub fn host_probe_add(&self, cfg: &HostProbeConfig, pods: &[IpAddr]) -> Result<()> {
        let sets = cfg.plan_with(pods)?.sets;
        if !pods.is_empty() {
            self.host_table()?.add(&sets)?;
        }
        Ok(())
    }

    /// Remove pods' addresses from the sets, in one batch; addresses not there are skipped.
    /// Returns how many were removed. Bad addresses as for [`Namespace::host_probe_add`].
    pub fn host_probe_remove(&self, cfg: &HostProbeConfig, pods: &[IpAddr]) -> Result<usize> {
        let sets = cfg.plan_with(pods)?.sets;
        if pods.is_empty() {
            return Ok(0);
        }
        Ok(self.host_table()?.remove(&sets)?)
    }

    /// The addresses in the sets, IPv4 first, each sorted; `None` when the table is not there.
    pub fn host_probe_members(&self) -> Result<Option<Vec<IpAddr>>> {
        Ok(self.host_table()?.members()?)
    }

    /// Remove the host's probe SNAT table with its sets; whether there was one.
    pub fn remove_host_probe(&self) -> Result<bool> {
        Ok(self.host_table()?.remove_table()?)
    }

    /// The host table's handle, its socket opened in this namespace.
    fn host_table(&self) -> Result<HostProbe> {
        Ok(self.run(HostProbe::open)??)
    }
}
