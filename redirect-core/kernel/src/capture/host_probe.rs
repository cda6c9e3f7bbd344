//! The host's probe SNAT table (`redirect_model::host_probe`, table
//! [`HOST_PROBE_TABLE`]) in one namespace, the host's: programmed in one batch (an old table of
//! ours brought to the plan, its sets emptied), its sets' addresses added and removed at run
//! time in one batch each (`NFT_MSG_NEWSETELEM`, `NFT_MSG_DELSETELEM`), read back, and removed
//! whole. Sets and rules come planned and checked by the model; nothing here decides.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use redirect_model::table::HOST_PROBE_TABLE;
use redirect_model::{NamedSet, Ruleset};

use crate::netns::Netns;
use crate::nft::{self, lower_named, Applied, Nft, NftTable, TableState};
use crate::Result;

/// A handle on the host's probe SNAT table in one namespace, over one nf_tables socket opened
/// there.
pub struct HostProbe {
    nft: Nft,
}

impl HostProbe {
    /// The table in the namespace `netns` holds (the socket is created there).
    pub fn open_in(netns: &Netns) -> Result<HostProbe> {
        Ok(HostProbe::on(Nft::open_in(netns)?))
    }

    /// The table in the calling thread's namespace.
    pub fn open() -> Result<HostProbe> {
        Ok(HostProbe::on(Nft::open()?))
    }

    /// The table, over a socket already open in its namespace.
    pub fn on(nft: Nft) -> HostProbe {
        HostProbe {
            nft: nft.with_table(HOST_PROBE_TABLE),
        }
    }

    /// Program the plan (`HostProbeConfig::plan`) in one batch: create the table, or bring an
    /// old one to the plan in place, its sets flushed to the plan's members (none at start:
    /// the caller adds the pods it holds).
    pub fn apply(&self, rs: &Ruleset) -> Result<Applied> {
        Ok(self.nft.apply(rs)?)
    }

    /// Add the addresses of `sets` (`HostProbeConfig::plan_with(pods)`'s sets) to the table's
    /// sets, in one batch: all or none. An address there already is fine; a set the table
    /// lacks (an IPv6 set when the table was applied without IPv6), or no table, refuses the
    /// whole batch.
    pub fn add(&self, sets: &[NamedSet]) -> Result<()> {
        Ok(self.nft.add_elements(&elements_of(sets))?)
    }

    /// Remove the addresses of `sets` from the table's sets, in one batch; addresses not there
    /// are skipped. Returns how many were removed.
    pub fn remove(&self, sets: &[NamedSet]) -> Result<usize> {
        Ok(self.nft.remove_elements(&elements_of(sets))?)
    }

    /// The addresses in the table's sets, IPv4 first, each sorted; `None` when there is no
    /// table.
    pub fn members(&self) -> Result<Option<Vec<IpAddr>>> {
        Ok(self.read()?.map(|t| members_of(&t)))
    }

    /// The table as the kernel holds it, one consistent read; `None` when there is none.
    pub fn read(&self) -> Result<Option<TableState>> {
        Ok(self.nft.read()?)
    }

    /// Delete the table, its sets and their members; whether there was one.
    pub fn remove_table(&self) -> Result<bool> {
        Ok(self.nft.remove()?)
    }
}

/// The sets, lowered, as a table whose sets name committed sets (id 0) and hold the elements.
fn elements_of(sets: &[NamedSet]) -> NftTable {
    let rs = Ruleset {
        chains: Vec::new(),
        sets: sets.to_vec(),
    };
    let mut t = lower_named(&rs, HOST_PROBE_TABLE);
    for s in &mut t.sets {
        s.id = 0;
    }
    t
}

/// Every address key of every set, IPv4 first.
fn members_of(t: &TableState) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = t
        .sets
        .iter()
        .flat_map(|s| &s.elements)
        .filter_map(|e| match e.key.len() {
            4 => <[u8; 4]>::try_from(e.key.as_slice())
                .ok()
                .map(|k| IpAddr::V4(Ipv4Addr::from(k))),
            16 => <[u8; 16]>::try_from(e.key.as_slice())
                .ok()
                .map(|k| IpAddr::V6(Ipv6Addr::from(k))),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// The state a read returns for `rs` applied (the host table's name does not show in it).
pub fn expected(rs: &Ruleset) -> TableState {
    nft::expected(rs)
}
