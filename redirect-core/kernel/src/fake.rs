//! [`Fake`]: a network namespace in memory, behind the same [`Backend`] as the kernel, built
//! from what the model says the kernel would hold: applying a ruleset stores it and the state
//! a read of the real table would return (`nft::expected`), with the changes an in-place update
//! would make; [`Fake::evaluate`] sends a flow through the stored ruleset with the model's
//! evaluator. A test can set the routes, addresses and failures, or tamper with the table, and
//! count the batches a run sent. Clones share one state, so a test keeps a clone to look at
//! what the code under test did with the other. Feature `testing`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use redirect_model::eval::{evaluate, Evaluation, Flow};
use redirect_model::table::TABLE;
use redirect_model::{Family, NamedSet, Ruleset, SetElements};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::nft::{self, lower, Applied, Changes, TableState};
use crate::routes::{TproxyRouting, TproxyState};

/// What the fake namespace holds. Public: a test sets it up and looks at it.
#[derive(Clone, Debug, Default)]
pub struct FakeState {
    /// The ruleset our table was last programmed with; `None` when there is no table.
    pub ruleset: Option<Ruleset>,
    /// Our table as a read returns it (what `nft::expected` says for `ruleset`, unless a test
    /// tampered with it); `None` when there is none.
    pub table: Option<TableState>,
    /// Our other tables (the host's probe SNAT table), by name, as the ruleset they hold.
    pub others: BTreeMap<String, Ruleset>,
    /// TPROXY rule and route per (mark, route table, family).
    pub tproxy: BTreeMap<(u32, u32, Family), TproxyState>,
    /// Whether `lo` has `::6/128`.
    pub lo_v6: bool,
    /// The interfaces' addresses, as `Backend::addresses` returns them.
    pub addresses: Vec<IpAddr>,
    /// Batches that changed our table (an apply equal to what is there sends none).
    pub batches: usize,
    /// Writes (apply, remove, a route) fail with EPERM, as without CAP_NET_ADMIN.
    pub deny_writes: bool,
    /// Applies succeed but keep nothing: a read finds what was there before (the bug of a
    /// plugin that reports success with no rules written).
    pub forget_applies: bool,
    /// Kernel features the namespace's kernel lacks: a table is refused with
    /// `nft::Error::MissingFeature` naming them, when it is applied.
    pub missing_features: Vec<nft::Feature>,
}

/// A namespace in memory. See the module's comment.
#[derive(Clone, Debug, Default)]
pub struct Fake {
    state: Arc<Mutex<FakeState>>,
}

impl Fake {
    /// An empty namespace whose interfaces have `addresses`.
    pub fn with_addresses(addresses: &[IpAddr]) -> Fake {
        let fake = Fake::default();
        fake.lock().addresses = addresses.to_vec();
        fake
    }

    /// What it holds now (a copy).
    pub fn state(&self) -> FakeState {
        self.lock().clone()
    }

    /// Change what it holds (tamper with the table, add routes, deny writes).
    pub fn update(&self, f: impl FnOnce(&mut FakeState)) {
        f(&mut self.lock())
    }

    /// Where `flow` ends with the rules the table holds; `None` when there is no table, or
    /// when it is no longer what its ruleset planned (a test tampered with it).
    pub fn evaluate(&self, flow: &Flow) -> Option<Evaluation> {
        let st = self.lock();
        let rs = st.ruleset.as_ref()?;
        (st.table.as_ref() == Some(&nft::expected(rs))).then(|| evaluate(rs, flow))
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // A test that panicked while holding it leaves the state as it was.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses a table when the kernel "lacks" features, as the kernel's probe reports it.
    fn lacks_features(&self) -> Result<()> {
        let missing = self.lock().missing_features.clone();
        if missing.is_empty() {
            return Ok(());
        }
        Err(nft::Error::MissingFeature(nft::MissingFeature {
            features: missing,
            refused: None,
        })
        .into())
    }

    fn write(&self) -> Result<MutexGuard<'_, FakeState>> {
        let st = self.lock();
        if st.deny_writes {
            return Err(Error::from(nft::Error::Rejected {
                what: "a write to the fake namespace".into(),
                errno: libc::EPERM,
                cause: std::io::Error::from_raw_os_error(libc::EPERM),
                hint: crate::errno_hint(libc::EPERM),
            }));
        }
        Ok(st)
    }
}

/// What the kernel says of a table or set that is not there.
fn missing(what: &str) -> Error {
    Error::from(nft::Error::Rejected {
        what: format!("elements of {what}"),
        errno: libc::ENOENT,
        cause: std::io::Error::from_raw_os_error(libc::ENOENT),
        hint: crate::errno_hint(libc::ENOENT),
    })
}

impl Backend for Fake {
    fn read_named(&self, table: &str) -> Result<(Option<u32>, Option<TableState>)> {
        let st = self.lock();
        Ok((
            None,
            match table {
                TABLE => st.table.clone(),
                other => st.others.get(other).map(nft::expected),
            },
        ))
    }

    fn apply_named(&self, table: &str, rs: &Ruleset) -> Result<Applied> {
        self.lacks_features()?;
        if table != TABLE {
            let mut st = self.write()?;
            let applied = match st.others.get(table) {
                None => Applied::Created,
                Some(cur) => Applied::Updated(nft::changes(&nft::expected(cur), &lower(rs))),
            };
            st.others.insert(table.to_string(), rs.clone());
            return Ok(applied);
        }
        let mut st = self.write()?;
        let want = lower(rs);
        let applied = match &st.table {
            None => Applied::Created,
            Some(cur) => Applied::Updated(nft::changes(cur, &want)),
        };
        if applied != Applied::Updated(Changes::default()) {
            st.batches += 1;
        }
        if st.forget_applies {
            return Ok(applied);
        }
        st.table = Some(nft::state_of(&want));
        st.ruleset = Some(rs.clone());
        Ok(applied)
    }

    fn remove_named(&self, table: &str) -> Result<bool> {
        let mut st = self.write()?;
        if table != TABLE {
            return Ok(st.others.remove(table).is_some());
        }
        st.ruleset = None;
        let had = st.table.take().is_some();
        if had {
            st.batches += 1;
        }
        Ok(had)
    }

    fn add_elements(&self, table: &str, sets: &[NamedSet]) -> Result<()> {
        let mut st = self.write()?;
        let rs = st.others.get_mut(table).ok_or_else(|| missing(table))?;
        for add in sets {
            let set = rs
                .sets
                .iter_mut()
                .find(|s| s.name == add.name)
                .ok_or_else(|| missing(&add.name))?;
            if let (SetElements::Addrs(have), SetElements::Addrs(new)) =
                (&mut set.elements, &add.elements)
            {
                for a in new {
                    if !have.contains(a) {
                        have.push(*a);
                    }
                }
            }
        }
        Ok(())
    }

    fn remove_elements(&self, table: &str, sets: &[NamedSet]) -> Result<usize> {
        let mut st = self.write()?;
        let Some(rs) = st.others.get_mut(table) else {
            return Ok(0);
        };
        let mut n = 0;
        for gone in sets {
            let Some(set) = rs.sets.iter_mut().find(|s| s.name == gone.name) else {
                continue;
            };
            if let (SetElements::Addrs(have), SetElements::Addrs(old)) =
                (&mut set.elements, &gone.elements)
            {
                let before = have.len();
                have.retain(|a| !old.contains(a));
                n += before - have.len();
            }
        }
        Ok(n)
    }

    /// Our table goes in one batch; the tables written in its place are not kept (a fake
    /// holds our tables only).
    fn hand_over(&self, _tables: &[crate::nft::NftTable]) -> Result<bool> {
        let mut st = self.write()?;
        st.ruleset = None;
        let had = st.table.take().is_some();
        st.batches += 1;
        Ok(had)
    }

    /// As [`Fake::hand_over`]: our table goes; iptables-nft's tables are not kept.
    fn hand_over_xt(&self, _tables: &[crate::nft::XtTable]) -> Result<bool> {
        self.hand_over(&[])
    }

    fn read_tproxy(&self, r: &TproxyRouting, family: Family) -> Result<TproxyState> {
        let st = self.lock();
        Ok(st
            .tproxy
            .get(&(r.mark, r.table, family))
            .copied()
            .unwrap_or_default())
    }

    fn apply_tproxy(&self, r: &TproxyRouting, families: &[Family]) -> Result<()> {
        crate::routes::validate(r)?;
        let mut st = self.write()?;
        for &f in families {
            let e = st.tproxy.entry((r.mark, r.table, f)).or_default();
            e.rules = e.rules.max(1);
            e.route = true;
        }
        Ok(())
    }

    fn remove_tproxy(&self, r: &TproxyRouting, families: &[Family]) -> Result<()> {
        crate::routes::validate(r)?;
        let mut st = self.write()?;
        for &f in families {
            st.tproxy.remove(&(r.mark, r.table, f));
        }
        Ok(())
    }

    fn has_lo_v6(&self) -> Result<bool> {
        Ok(self.lock().lo_v6)
    }

    fn ensure_lo_v6(&self) -> Result<()> {
        self.write()?.lo_v6 = true;
        Ok(())
    }

    fn remove_lo_v6(&self) -> Result<()> {
        self.write()?.lo_v6 = false;
        Ok(())
    }

    fn addresses(&self) -> Result<Vec<IpAddr>> {
        Ok(self.lock().addresses.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redirect_model::eval::Verdict;
    use redirect_model::CaptureConfig;
    use redirect_testkit::plan;

    /// The fake answers as the kernel would: an apply stores what a read returns, a second
    /// equal apply sends nothing, a flow from the app lands on the proxy's port, and a
    /// tampered table is no longer judged by the evaluator.
    #[test]
    fn the_fake_holds_what_the_model_says_the_kernel_would() {
        let rs = plan(&CaptureConfig::istio_sidecar_default()).unwrap();
        let fake = Fake::default();
        assert_eq!(fake.apply(&rs).unwrap(), Applied::Created);
        assert_eq!(fake.read_table().unwrap(), Some(nft::expected(&rs)));
        assert_eq!(
            fake.apply(&rs).unwrap(),
            Applied::Updated(Changes::default())
        );
        assert_eq!(fake.state().batches, 1, "the equal apply sent nothing");
        let flow: Flow = "out tcp uid=1000 10.96.0.1:80".parse().unwrap();
        let ev = fake.evaluate(&flow).expect("a table to evaluate");
        assert!(
            matches!(ev.verdict, Verdict::Redirect { port: 15001, .. }),
            "{:?}",
            ev.verdict
        );
        fake.update(|st| st.table.as_mut().unwrap().flags = 1);
        assert!(fake.evaluate(&flow).is_none(), "a dormant table");
        fake.update(|st| st.deny_writes = true);
        assert!(fake.remove_table().is_err());
    }
}
