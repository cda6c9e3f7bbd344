//! What the capture policy needs of one network namespace, behind one small trait: our table
//! (read, apply, remove), the routes beside it (TPROXY routing, `::6` on `lo`) and the
//! interfaces' addresses. [`Live`] is the kernel, over two sockets opened in the namespace;
//! with the `testing` feature, `Fake` holds the same state in memory, so a program's
//! decisions are tested without root.

use std::net::IpAddr;

use redirect_model::table::TABLE;
use redirect_model::{Family, NamedSet, Ruleset};

use crate::error::Result;
use crate::netns::Netns;
use crate::nft::{self, Applied, Nft, NftTable, TableState};
use crate::routes::{Routes, TproxyRouting, TproxyState};

/// One network namespace, as capture reads and writes it. `Send`: a program may keep one open
/// (the node agent keeps each enrolled pod's) and use it from one thread at a time. Our tables
/// are named: a pod's (`TABLE`, which `read_table`, `apply` and `remove_table` mean), the
/// host's probe SNAT table (`HOST_PROBE_TABLE`).
pub trait Backend: Send {
    /// Our table `table`, one state of it, with the ruleset generation it was read at when the
    /// backend has generations (the kernel's nf_tables does); `None` when there is no table.
    fn read_named(&self, table: &str) -> Result<(Option<u32>, Option<TableState>)>;
    /// Create our table `table`, or update it in place to `rs`, atomically.
    fn apply_named(&self, table: &str, rs: &Ruleset) -> Result<Applied>;
    /// Delete our table `table`; whether there was one.
    fn remove_named(&self, table: &str) -> Result<bool>;
    /// Add the elements `sets` hold to those sets of our table `table`, in one batch: all or
    /// none (an element already there is fine; a set or table that is not there refuses it).
    fn add_elements(&self, table: &str, sets: &[NamedSet]) -> Result<()>;
    /// Remove the elements `sets` hold from those sets, in one batch; those not there are
    /// skipped. How many went.
    fn remove_elements(&self, table: &str, sets: &[NamedSet]) -> Result<usize>;
    /// The ruleset's generation now: any commit in the namespace moves it, so a table read at
    /// generation `g` is unchanged while it is still `g`. `None` without generations.
    fn generation(&self) -> Result<Option<u32>> {
        Ok(None)
    }
    /// The counters of our table `table` (counters on): each counted rule's chain, position
    /// and count. A backend that counts nothing (the fake) reports its counters at zero.
    fn read_counters(&self, table: &str) -> Result<Vec<nft::RuleCounter>> {
        let (_, state) = self.read_named(table)?;
        let mut out = Vec::new();
        for c in state.iter().flat_map(|t| &t.chains) {
            for (index, rule) in c.rules.iter().enumerate() {
                if rule.contains(&nft::Expr::Counter) {
                    let chain = c.name.clone();
                    let count = redirect_model::Count::default();
                    out.push(nft::RuleCounter {
                        chain,
                        index,
                        count,
                    });
                }
            }
        }
        Ok(out)
    }
    /// The pod's table ([`TABLE`]), one state of it; `None` when there is none.
    fn read_table(&self) -> Result<Option<TableState>> {
        Ok(self.read_named(TABLE)?.1)
    }
    /// Create the pod's table, or update it in place to `rs`, atomically.
    fn apply(&self, rs: &Ruleset) -> Result<Applied> {
        self.apply_named(TABLE, rs)
    }
    /// Delete the pod's table; whether there was one.
    fn remove_table(&self) -> Result<bool> {
        self.remove_named(TABLE)
    }
    /// Someone else's tables written whole in place of our table, in one batch (a hand-back
    /// to Istio, `Nft::hand_over`); whether our table was there.
    fn hand_over(&self, tables: &[NftTable]) -> Result<bool>;
    /// iptables-nft's tables written in place of our table, in one batch (a hand-back to
    /// Istio's iptables form, `Nft::hand_over_xt`); whether our table was there.
    fn hand_over_xt(&self, tables: &[nft::XtTable]) -> Result<bool>;
    /// The TPROXY rule and route of `r` in `family`.
    fn read_tproxy(&self, r: &TproxyRouting, family: Family) -> Result<TproxyState>;
    /// Add what is missing of the TPROXY rule and route in each family.
    fn apply_tproxy(&self, r: &TproxyRouting, families: &[Family]) -> Result<()>;
    /// Delete the TPROXY rules and route in each family; absent is fine.
    fn remove_tproxy(&self, r: &TproxyRouting, families: &[Family]) -> Result<()>;
    /// Whether `lo` has `::6/128`.
    fn has_lo_v6(&self) -> Result<bool>;
    /// Add `::6/128` to `lo`; present is fine.
    fn ensure_lo_v6(&self) -> Result<()>;
    /// Delete `::6/128` from `lo`; absent is fine.
    fn remove_lo_v6(&self) -> Result<()>;
    /// Every address of every interface, in the kernel's order (IPv4 first).
    fn addresses(&self) -> Result<Vec<IpAddr>>;
}

/// Opens the backend of a namespace held open: [`open_live`] for the kernel; a test passes a
/// closure that returns a fake.
pub type Opener<'a> = &'a dyn Fn(&Netns) -> Result<Box<dyn Backend>>;

/// The kernel side of `netns` ([`Live::open_in`]), boxed for an [`Opener`].
pub fn open_live(netns: &Netns) -> Result<Box<dyn Backend>> {
    Ok(Box::new(Live::open_in(netns)?))
}

/// The kernel: a socket for our table and one for the routes, both opened in the namespace.
pub struct Live {
    /// Our tables' nf_tables handle in the namespace.
    pub nft: Nft,
    /// The rtnetlink handle for the TPROXY routing, `::6` on `lo` and the addresses.
    pub routes: Routes,
}

impl Live {
    /// The calling thread's namespace.
    pub fn open() -> Result<Live> {
        Ok(Live {
            nft: Nft::open()?,
            routes: Routes::open()?,
        })
    }

    /// The namespace `netns` holds.
    pub fn open_in(netns: &Netns) -> Result<Live> {
        netns.run(Live::open)?
    }
}

impl Backend for Live {
    fn read_named(&self, table: &str) -> Result<(Option<u32>, Option<TableState>)> {
        let (generation, state) = self.nft.read_named(table)?;
        Ok((Some(generation), state))
    }
    fn apply_named(&self, table: &str, rs: &Ruleset) -> Result<Applied> {
        Ok(self.nft.apply_named(table, rs)?)
    }
    fn read_counters(&self, table: &str) -> Result<Vec<nft::RuleCounter>> {
        Ok(self.nft.counters(table)?)
    }
    fn remove_named(&self, table: &str) -> Result<bool> {
        Ok(self.nft.remove_named(table)?)
    }
    fn add_elements(&self, table: &str, sets: &[NamedSet]) -> Result<()> {
        Ok(self.nft.add_elements(&nft::elements_table(table, sets))?)
    }
    fn remove_elements(&self, table: &str, sets: &[NamedSet]) -> Result<usize> {
        Ok(self
            .nft
            .remove_elements(&nft::elements_table(table, sets))?)
    }
    fn generation(&self) -> Result<Option<u32>> {
        Ok(Some(self.nft.generation()?))
    }
    fn hand_over(&self, tables: &[NftTable]) -> Result<bool> {
        Ok(self.nft.hand_over(tables)?)
    }
    fn hand_over_xt(&self, tables: &[nft::XtTable]) -> Result<bool> {
        Ok(self.nft.hand_over_xt(tables)?)
    }
    fn read_tproxy(&self, r: &TproxyRouting, family: Family) -> Result<TproxyState> {
        Ok(self.routes.read_tproxy(r, family)?)
    }
    fn apply_tproxy(&self, r: &TproxyRouting, families: &[Family]) -> Result<()> {
        Ok(self.routes.apply_tproxy(r, families)?)
    }
    fn remove_tproxy(&self, r: &TproxyRouting, families: &[Family]) -> Result<()> {
        Ok(self.routes.remove_tproxy(r, families)?)
    }
    fn has_lo_v6(&self) -> Result<bool> {
        Ok(self.routes.has_lo_v6_inbound_addr()?)
    }
    fn ensure_lo_v6(&self) -> Result<()> {
        Ok(self.routes.ensure_lo_v6_inbound_addr()?)
    }
    fn remove_lo_v6(&self) -> Result<()> {
        Ok(self.routes.remove_lo_v6_inbound_addr()?)
    }
    fn addresses(&self) -> Result<Vec<IpAddr>> {
        Ok(self.routes.addresses()?)
    }
}
