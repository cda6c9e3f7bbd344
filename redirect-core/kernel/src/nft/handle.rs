//! [`Nft`]: one nf_tables socket, opened in a namespace, and the jobs done over it.

use redirect_model::Ruleset;

use super::error::{Error, MissingFeature, Result};
use super::foreign::TableList;
use super::socket::{self, Socket};
use super::{compare, dump, foreign, lower_named, update, Changes, Difference, Encoded, Features};
use super::{probe, xtables, Feature, XtChain, XtFound};
use super::{NftTable, TableState, TABLE};
use crate::netns::Netns;
use redirect_model::Family;

/// How often apply reads the table again when a concurrent change moved the ruleset under it,
/// before it replaces the table whatever it holds (as it does when the read itself cannot
/// settle).
const APPLY_TRIES: usize = 3;

/// Our table in one network namespace, over one socket opened there: every job of a run (read,
/// apply, read back, remove) uses it, and acts on the namespace the socket was opened in,
/// from whichever thread calls. The table is [`TABLE`] unless [`Nft::with_table`] names
/// another of ours (the host's probe SNAT table).
pub struct Nft {
    sock: Socket,
    table: String,
}

/// What [`Nft::apply`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// There was no table: it was created.
    Created,
    /// The table was updated in place (nothing sent when the changes are empty).
    Updated(Changes),
    /// Other writers kept changing the ruleset between read and write: the table was deleted
    /// and created again in one batch that depends on no read.
    Replaced,
}

impl Nft {
    /// A handle on the calling thread's network namespace.
    pub fn open() -> Result<Nft> {
        Nft::open_with(Features::of_running_kernel())
    }

    /// A handle on the namespace `netns` holds (the socket is created there, on a thread that
    /// enters it; the caller's thread stays where it is).
    pub fn open_in(netns: &Netns) -> crate::Result<Nft> {
        let features = Features::of_running_kernel();
        Ok(netns.run(move || Nft::open_with(features))??)
    }

    /// A handle on the calling thread's namespace, for a kernel with `features`.
    pub fn open_with(features: Features) -> Result<Nft> {
        Ok(Nft {
            sock: Socket::open(features)?,
            table: TABLE.into(),
        })
    }

    /// The same socket, for our table named `name`: every job below acts on that table.
    pub fn with_table(mut self, name: &str) -> Nft {
        self.table = name.into();
        self
    }

    /// The name of the table this handle acts on.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Program a ruleset: create our table, or update it in place to the ruleset, atomically.
    pub fn apply(&self, rs: &Ruleset) -> Result<Applied> {
        self.apply_table(&lower_named(rs, &self.table))
    }

    /// [`Nft::apply`] into our table named `table` (the handle's own is not changed).
    pub fn apply_named(&self, table: &str, rs: &Ruleset) -> Result<Applied> {
        self.apply_table(&lower_named(rs, table))
    }

    /// [`Nft::read_at`] of our table named `table`.
    pub fn read_named(&self, table: &str) -> Result<(u32, Option<TableState>)> {
        dump::table_at(&self.sock, table)
    }

    /// The counters of our table named `table`, in one dump of its rules.
    pub fn counters(&self, table: &str) -> Result<Vec<super::RuleCounter>> {
        super::counters(&self.sock, table)
    }

    /// `apply` of a lowered table.
    pub fn apply_table(&self, table: &NftTable) -> Result<Applied> {
        let sock = &self.sock;
        for _ in 0..APPLY_TRIES {
            // The batch is bound to the generation the table was read at: if anything changed
            // since, the kernel refuses it whole.
            let (genid, current) = match dump::table_at(sock, &table.name) {
                Ok(read) => read,
                Err(Error::ReadUnsettled { .. }) => break,
                Err(e) => return Err(e),
            };
            let (batch, applied) = match current {
                None => (
                    update::create(table, sock.next_seq(), Some(genid), sock.features()),
                    Applied::Created,
                ),
                Some(cur) => {
                    match update::update(&cur, table, sock.next_seq(), Some(genid), sock.features())
                    {
                        None => return Ok(Applied::Updated(Changes::default())),
                        Some((b, ch)) => (b, Applied::Updated(ch)),
                    }
                }
            };
            match self.send(&batch, table) {
                // The ruleset moved since it was read: read again.
                Err(Error::Rejected { errno, .. }) if errno == libc::ERESTART => continue,
                // An update that names an object the kernel no longer has (or already has),
                // though its generation held: seen on Debian 12's 6.1 with 8 racing writers
                // under emulation. Read again; the replace below depends on no read.
                Err(Error::Rejected { errno, .. })
                    if matches!(applied, Applied::Updated(_))
                        && matches!(errno, libc::ENOENT | libc::EEXIST) =>
                {
                    continue
                }
                other => return other.map(|()| applied),
            }
        }
        let batch = update::replace(table, sock.next_seq(), sock.features());
        self.send(&batch, table).map(|()| Applied::Replaced)
    }

    /// Send a batch for `table`. A refusal that can mean a missing kernel feature is looked
    /// into with a check-only probe, which names the feature (only on failure: a success
    /// costs nothing more).
    fn send(&self, batch: &Encoded, table: &NftTable) -> Result<()> {
        let Some((seq, errno)) = self.sock.send_batch_answer(batch)? else {
            return Ok(());
        };
        let label = batch.label_of(seq);
        let what = match label {
            Some(l) => l.describe(table),
            None => format!("the batch (message {seq})"),
        };
        let features = probe::diagnose(&self.sock, table, label, errno);
        if features.is_empty() {
            return Err(socket::rejected(what, errno));
        }
        Err(Error::MissingFeature(MissingFeature {
            features,
            refused: Some((what, errno)),
        }))
    }

    /// The kernel features `table` needs that the kernel lacks (empty when none), asked with a
    /// check-only batch that commits nothing (its table, [`super::PROBE_TABLE`], is never
    /// created).
    pub fn missing_features(&self, table: &NftTable) -> Result<Vec<Feature>> {
        probe::missing(&self.sock, table)
    }

    /// Fails with [`Error::MissingFeature`] when the kernel lacks a feature that our table
    /// `table` would need for `rs`, before anything is changed. The kernel is asked once per
    /// process for a given set of features; that probe costs one RCU grace period (the kernel
    /// waits for one whenever it aborts a batch: 4 to 27 ms measured), which is why `apply`
    /// does not run it and probes only after a refusal. For a long-lived program's start.
    pub fn check_features(&self, table: &str, rs: &Ruleset) -> Result<()> {
        probe::check(&self.sock, &lower_named(rs, table))
    }

    /// Write someone else's tables (`tables`, each replaced whole) and delete our table, in one
    /// batch bound to the generation our table was read at: the hand-back of a namespace to
    /// Istio. Returns whether our table was there.
    pub fn hand_over(&self, tables: &[NftTable]) -> Result<bool> {
        let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
        let what = format!("writing the tables {}", names.join(", "));
        self.in_place_of_ours(&what, |remove, seq, genid, features| {
            update::hand_over(tables, remove, seq, Some(genid), features)
        })
    }

    /// Write iptables-nft's tables (`tables`: added, or their chains and rules added to the
    /// table already there) and delete our table, in one batch bound to the generation our
    /// table was read at: the hand-back of a namespace to Istio's iptables form. Returns whether
    /// our table was there.
    pub fn hand_over_xt(&self, tables: &[super::XtTable]) -> Result<bool> {
        self.in_place_of_ours(
            "writing iptables-nft's tables",
            |remove, seq, genid, features| {
                let remove: Vec<String> = remove.iter().map(|n| n.to_string()).collect();
                super::xt_write::hand_over(tables, &remove, seq, Some(genid), features)
            },
        )
    }

    /// One batch from `build` (given our table's name when it is there, to delete), bound to
    /// the generation our table was read at, read again and rebuilt when the ruleset moved.
    fn in_place_of_ours(
        &self,
        what: &str,
        build: impl Fn(Option<&str>, u32, u32, Features) -> Encoded,
    ) -> Result<bool> {
        let sock = &self.sock;
        for _ in 0..APPLY_TRIES {
            let (genid, ours) = match dump::table_at(sock, &self.table) {
                Ok(read) => read,
                Err(Error::ReadUnsettled { .. }) => break,
                Err(e) => return Err(e),
            };
            let remove = ours.is_some().then_some(self.table.as_str());
            let batch = build(remove, sock.next_seq(), genid, sock.features());
            match sock.send_batch_answer(&batch)? {
                None => return Ok(remove.is_some()),
                Some((_, errno)) if errno == libc::ERESTART => continue,
                Some((seq, errno)) => {
                    let label = batch.label_of(seq).map(|l| format!(": {l:?}"));
                    let what = format!(
                        "{what} in place of {} (message {seq}{})",
                        self.table,
                        label.unwrap_or_default()
                    );
                    return Err(socket::rejected(what, errno));
                }
            }
        }
        Err(Error::ReadUnsettled { tries: APPLY_TRIES })
    }

    /// Delete our table. Returns whether there was one.
    pub fn remove(&self) -> Result<bool> {
        self.remove_named(&self.table)
    }

    /// [`Nft::remove`] of our table named `table`.
    pub fn remove_named(&self, table: &str) -> Result<bool> {
        let sock = &self.sock;
        let name = table.to_string();
        let batch = update::delete_tables(
            std::slice::from_ref(&name),
            sock.next_seq(),
            sock.features(),
        );
        match self.send(&batch, &NftTable::named(table)) {
            // No table (never made, or a concurrent DEL won): gone either way.
            Err(Error::Rejected { errno, .. }) if errno == libc::ENOENT => Ok(false),
            other => other.map(|()| true),
        }
    }

    /// Read our table; `None` when it does not exist. One state of it, never a mix of two.
    pub fn read(&self) -> Result<Option<TableState>> {
        dump::table(&self.sock, &self.table)
    }

    /// Add elements to sets of ours that exist (`t` names the table and holds, per set, the
    /// elements to add; a set id of 0 names a committed set), in one batch: all or none.
    /// Elements already there are fine.
    pub fn add_elements(&self, t: &NftTable) -> Result<()> {
        let batch = update::elements(t, false, self.sock.next_seq(), None, self.sock.features());
        self.send(&batch, t)
    }

    /// Remove elements from sets of ours (`t` as for [`Nft::add_elements`]), in one batch bound
    /// to the generation they were read at: elements (or sets, or the table) not there are
    /// skipped, since the kernel refuses to delete what is absent. Returns how many went.
    pub fn remove_elements(&self, t: &NftTable) -> Result<usize> {
        for _ in 0..APPLY_TRIES {
            let (genid, current) = dump::table_at(&self.sock, &t.name)?;
            let present = present_only(t, current.as_ref());
            let n: usize = present.sets.iter().map(|s| s.elements.len()).sum();
            if n == 0 {
                return Ok(0);
            }
            let (seq, features) = (self.sock.next_seq(), self.sock.features());
            let batch = update::elements(&present, true, seq, Some(genid), features);
            match self.send(&batch, &present) {
                // The ruleset moved since it was read: read again.
                Err(Error::Rejected { errno, .. }) if errno == libc::ERESTART => continue,
                other => return other.map(|()| n),
            }
        }
        Err(Error::ReadUnsettled { tries: APPLY_TRIES })
    }

    /// Create the trace table `t` ([`super::trace_table`]) over this handle's socket, owned by
    /// the socket where the kernel has owner tables (5.12+). Returns whether it is owned: when
    /// not, the kernel refused the flag (EOPNOTSUPP) and the table was created without it, so
    /// only [`Nft::remove_named`] removes it.
    pub fn add_trace_table(&self, t: &NftTable) -> Result<bool> {
        super::trace::add_table(&self.sock, t)
    }

    /// The rules of our table named `table`, with their handles, in chain order; empty when
    /// the table does not exist.
    pub fn rule_handles(&self, table: &str) -> Result<Vec<super::RuleHandle>> {
        super::trace::rule_handles(&self.sock, table)
    }

    /// Compare our table with a ruleset; empty when they are equal.
    pub fn diff(&self, rs: &Ruleset) -> Result<Vec<Difference>> {
        Ok(compare::compare(
            &super::expected(rs),
            self.read()?.as_ref(),
        ))
    }

    /// Our table with the ruleset generation it was read at (one state of it, as [`Nft::read`]).
    pub fn read_at(&self) -> Result<(u32, Option<TableState>)> {
        dump::table_at(&self.sock, &self.table)
    }

    /// The ruleset's generation.
    pub fn generation(&self) -> Result<u32> {
        dump::generation(&self.sock)
    }

    /// Every table of the namespace (any family), from one dump.
    pub fn tables(&self) -> Result<TableList> {
        TableList::read(&self.sock)
    }

    /// The families (`ip`, `ip6`) that have any nf_tables table: iptables-nft keeps its rules
    /// in such tables, so in a family without one there is nothing to look for and no
    /// `iptables-nft-save` to run.
    pub fn families_with_tables(&self) -> Result<Vec<Family>> {
        foreign::families_with_tables(&self.sock)
    }

    /// Names of the `inet` tables whose name starts with `prefix`, in kernel order.
    pub fn inet_tables(&self, prefix: &str) -> Result<Vec<String>> {
        foreign::inet_tables(&self.sock, prefix)
    }

    /// iptables-nft's chains whose name starts with `prefix` in the `ip` and `ip6` tables of
    /// `families`, the rules that jump to them and Istio's interface exclusions beside them, read
    /// at one ruleset generation with no iptables binary (see `xtables`).
    pub fn xtables_chains(&self, families: &[Family], prefix: &str) -> Result<XtFound> {
        xtables::find(&self.sock, families, prefix)
    }

    /// Remove what [`Nft::xtables_chains`] finds, in one batch (all or none); returns what went.
    pub fn remove_xtables_chains(&self, families: &[Family], prefix: &str) -> Result<Vec<XtChain>> {
        xtables::remove(&self.sock, families, prefix)
    }

    /// Delete every `inet` table whose name starts with `prefix`, in one batch (all or none);
    /// returns the names.
    pub fn remove_inet_tables(&self, prefix: &str) -> Result<Vec<String>> {
        foreign::remove_inet_tables(&self.sock, prefix)
    }
}

/// `t` with only the elements `current` holds, and only the sets that have some.
fn present_only(t: &NftTable, current: Option<&TableState>) -> NftTable {
    let mut out = NftTable::named(&t.name);
    for s in &t.sets {
        let Some(cur) = current.and_then(|c| c.set(&s.name)) else {
            continue;
        };
        let mut s = s.clone();
        s.elements.retain(|e| cur.elements.contains(e));
        if !s.elements.is_empty() {
            out.sets.push(s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use redirect_testkit::{kernel_test, netns::TestNetns};

    /// A batch computed from a generation the ruleset has left is refused whole (ERESTART),
    /// so a stale difference is never applied; `apply` then reads again and succeeds.
    #[kernel_test]
    fn a_batch_bound_to_an_old_generation_is_refused() {
        let ns = TestNetns::new();
        let rs = redirect_testkit::plan(&redirect_model::CaptureConfig::istio_sidecar_default())
            .unwrap();
        let t = crate::nft::lower(&rs);
        let nft = ns.run(Nft::open).unwrap();
        let genid = nft.generation().unwrap();
        ns.sh("nft add table inet someone-else");
        let batch = update::create(&t, nft.sock.next_seq(), Some(genid), nft.sock.features());
        match nft.send(&batch, &t).unwrap_err() {
            Error::Rejected { errno, what, .. } => {
                assert_eq!(errno, libc::ERESTART, "{what}");
            }
            e => panic!("{e}"),
        }
        assert_eq!(nft.read().unwrap(), None, "nothing was applied");
        nft.apply(&rs).unwrap();
        assert!(nft.diff(&rs).unwrap().is_empty());
    }
}
