//! Istio's iptables rules (or our iptables backend's, which has the same shape) left in a
//! namespace: found with `-save` of every family × variant whose binaries exist, removed with
//! one `-restore --noflush` input per table.
//!
//! What is removed, in a table that has `ISTIO_*` chains (none: the table is left alone):
//! - every rule outside an `ISTIO_*` chain that jumps (`-j`/`-g`) to one;
//! - every rule in a built-in chain that exactly has a shape Istio puts there without a jump
//!   (reference §1.5): step 1, the exclude-interface `-i X -j RETURN` (PREROUTING) and
//!   `-o X -j RETURN` (OUTPUT) in nat, and in mangle in TPROXY mode; step 2, the reroute
//!   interface `-i X -j RETURN` in nat PREROUTING; step 17, the TPROXY tail in mangle
//!   (CONNMARK save/restore, the mark RETURN on `lo`, the owner MARK 1338 rules). Shapes are
//!   matched on iptables-save's own printing of them, with any interface, mark, address or id;
//! - then every `ISTIO_*` chain is flushed (`-F`) and deleted (`-X`).
//!
//! Istio's ambient cleanup removes only the jumps and chains, which would leave the step 1, 2
//! and 17 rules active. Requiring `ISTIO_*` chains in the same table keeps look-alike rules of
//! someone else's (a plain `-i eth1 -j RETURN`) in namespaces Istio never touched. Not
//! removed: Istio's reconcile guardrails (`filter` `-p tcp -j DROP`), which are too generic to
//! tell from a user's.

use super::detect::{lock_wait, names, version_of};
use super::exec::{run, spawn_failure, tool_error};
use super::save::{parse, SavedRule, SavedTable};
use super::{Leftover, Variant};
use crate::error::Result;
use redirect_model::Family;

const PREFIX: &str = "ISTIO_";

fn is_istio(chain: &str) -> bool {
    chain.starts_with(PREFIX)
}

/// A token pattern: `*` stands for any one token.
type Shape = (&'static str, &'static str, &'static [&'static str]);

/// The non-jump rules Istio writes into built-in chains, as iptables-save prints them
/// (marks in hex, `--set-mark` as `--set-xmark`, CONNMARK masks spelled out).
const SHAPES: &[Shape] = &[
    // Step 1 (exclude interfaces) and step 2 (reroute interfaces).
    ("nat", "PREROUTING", &["-i", "*", "-j", "RETURN"]),
    ("nat", "OUTPUT", &["-o", "*", "-j", "RETURN"]),
    ("mangle", "PREROUTING", &["-i", "*", "-j", "RETURN"]),
    ("mangle", "OUTPUT", &["-o", "*", "-j", "RETURN"]),
    // Step 17, the TPROXY tail.
    (
        "mangle",
        "PREROUTING",
        &[
            "-p",
            "tcp",
            "-m",
            "mark",
            "--mark",
            "*",
            "-j",
            "CONNMARK",
            "--save-mark",
            "--nfmask",
            "0xffffffff",
            "--ctmask",
            "0xffffffff",
        ],
    ),
    (
        "mangle",
        "OUTPUT",
        &[
            "-o", "lo", "-p", "tcp", "-m", "mark", "--mark", "*", "-j", "RETURN",
        ],
    ),
    (
        "mangle",
        "OUTPUT",
        &[
            "!",
            "-d",
            "*",
            "-o",
            "lo",
            "-p",
            "tcp",
            "-m",
            "owner",
            "--uid-owner",
            "*",
            "-j",
            "MARK",
            "--set-xmark",
            "*",
        ],
    ),
    (
        "mangle",
        "OUTPUT",
        &[
            "!",
            "-d",
            "*",
            "-o",
            "lo",
            "-p",
            "tcp",
            "-m",
            "owner",
            "--gid-owner",
            "*",
            "-j",
            "MARK",
            "--set-xmark",
            "*",
        ],
    ),
    (
        "mangle",
        "OUTPUT",
        &[
            "-p",
            "tcp",
            "-m",
            "connmark",
            "--mark",
            "*",
            "-j",
            "CONNMARK",
            "--restore-mark",
            "--nfmask",
            "0xffffffff",
            "--ctmask",
            "0xffffffff",
        ],
    ),
];

fn istio_shaped(table: &str, r: &SavedRule) -> bool {
    SHAPES.iter().any(|(t, c, pat)| {
        *t == table
            && *c == r.chain
            && pat.len() == r.tokens.len()
            && pat
                .iter()
                .zip(&r.tokens)
                .all(|(p, tok)| *p == "*" || p == tok)
    })
}

/// What to remove from one table, and the restore input that does it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TableCleanup {
    pub leftovers: Vec<(String, usize, usize)>,
    pub input: String,
}

/// The cleanup of one parsed table; `None` when it has no `ISTIO_*` chain.
pub(crate) fn plan_table(t: &SavedTable) -> Option<TableCleanup> {
    let istio: Vec<&str> = t
        .chains
        .iter()
        .map(|c| c.name.as_str())
        .filter(|c| is_istio(c))
        .collect();
    if istio.is_empty() {
        return None;
    }
    let doomed: Vec<&SavedRule> = t
        .rules
        .iter()
        .filter(|r| !is_istio(&r.chain))
        .filter(|r| {
            r.target().is_some_and(is_istio) || (t.is_builtin(&r.chain) && istio_shaped(&t.name, r))
        })
        .collect();
    let mut leftovers: Vec<(String, usize, usize)> = istio
        .iter()
        .map(|c| {
            let rules = t.rules.iter().filter(|r| r.chain == *c).count();
            // Every jump to it, from built-in chains and from Istio's own (ISTIO_OUTPUT to
            // ISTIO_REDIRECT), so a chain no rule reaches shows as such.
            let jumps = t.rules.iter().filter(|r| r.target() == Some(*c)).count();
            (c.to_string(), rules, jumps)
        })
        .collect();
    // Istio's rules placed directly in built-in chains: one entry per chain, no jumps.
    for c in t.chains.iter().filter(|c| c.builtin) {
        let n = doomed
            .iter()
            .filter(|r| r.chain == c.name && !r.target().is_some_and(is_istio))
            .count();
        if n > 0 {
            leftovers.push((c.name.clone(), n, 0));
        }
    }
    let mut input = format!("*{}\n", t.name);
    for r in &doomed {
        input.push_str(&format!("-D {} {}\n", r.chain, r.spec));
    }
    for c in &istio {
        input.push_str(&format!("-F {c}\n"));
    }
    for c in &istio {
        input.push_str(&format!("-X {c}\n"));
    }
    input.push_str("COMMIT\n");
    Some(TableCleanup { leftovers, input })
}

/// One table of one iptables variant and family, scanned: the cleanup of what Istio left in
/// it, with the binaries that do it.
struct TableScan {
    family: Family,
    variant: Variant,
    table: String,
    restore: String,
    lock_wait: bool,
    cleanup: TableCleanup,
}

impl TableScan {
    fn leftovers(&self) -> impl Iterator<Item = Leftover> + '_ {
        self.cleanup
            .leftovers
            .iter()
            .map(|(chain, rules, jumps)| Leftover {
                family: self.family,
                variant: self.variant,
                table: self.table.clone(),
                chain: chain.clone(),
                rules: *rules,
                jumps: *jumps,
            })
    }
}

/// Whether the kernel holds any table of this iptables variant and family in the current
/// netns: legacy tables are listed in `/proc/thread-self/net/ip{,6}_tables_names` (absent when
/// the module is not loaded), iptables-nft tables are nf_tables tables of family ip or ip6
/// (`nft_families`, read once per scan).
fn has_tables(family: Family, variant: Variant, nft_families: &[Family]) -> Result<bool> {
    match variant {
        Variant::Legacy => {
            let file = match family {
                Family::V4 => "ip_tables_names",
                Family::V6 => "ip6_tables_names",
            };
            // thread-self: this thread may have entered the pod's namespace, the process not.
            let path = format!("/proc/thread-self/net/{file}");
            Ok(std::fs::read_to_string(path).is_ok_and(|t| !t.trim().is_empty()))
        }
        Variant::Nft => Ok(nft_families.contains(&family)),
    }
}

/// Where a family and variant's tables were read from.
enum Source {
    /// Its `-save`, one table at a time; removed with its `-restore`.
    Binary(TableScan),
    /// iptables-nft's tables over netlink, when there is no `iptables-nft-save`: what was
    /// found in that family.
    Netlink(Family, Vec<Leftover>),
    /// iptables-legacy's tables, with no binary to read them: in words.
    Unread(String),
}

fn scan(nft_families: &[Family]) -> Result<Vec<Source>> {
    let mut out = Vec::new();
    for family in Family::ALL {
        for variant in [Variant::Legacy, Variant::Nft] {
            // Most pods have no iptables tables at all: ask the kernel before running a binary.
            if !has_tables(family, variant, nft_families)? {
                continue;
            }
            let n = names(family, Some(variant));
            let dump = match run(&n.save, &[], None) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    out.extend(without_binary(family, variant, &n.save)?);
                    continue;
                }
                Err(e) => return Err(tool_error(&n.save, spawn_failure(&n.save, &e))),
                Ok(o) if !o.ok => return Err(tool_error(&n.save, o.failure())),
                Ok(o) => o.stdout,
            };
            let tables: Vec<(SavedTable, TableCleanup)> = parse(&dump)
                .into_iter()
                .filter_map(|t| plan_table(&t).map(|c| (t, c)))
                .collect();
            if tables.is_empty() {
                continue;
            }
            let (version, _) = version_of(&n.save).map_err(|why| tool_error(&n.save, why))?;
            for (t, cleanup) in tables {
                out.push(Source::Binary(TableScan {
                    family,
                    variant,
                    table: t.name,
                    restore: n.restore.clone(),
                    lock_wait: lock_wait(variant, &version),
                    cleanup,
                }));
            }
        }
    }
    Ok(out)
}

/// A family and variant whose tables exist, with no `save` binary on the node: iptables-nft's
/// are nf_tables tables, read over netlink; iptables-legacy's are named only.
fn without_binary(family: Family, variant: Variant, save: &str) -> Result<Option<Source>> {
    Ok(match variant {
        Variant::Nft => {
            let found = redirect_kernel::nft::Nft::open()?.xtables_chains(&[family], PREFIX)?;
            (!found.chains.is_empty()).then(|| {
                Source::Netlink(family, found.chains.into_iter().map(leftover_of).collect())
            })
        }
        Variant::Legacy => Some(Source::Unread(format!(
            "iptables-legacy {family} tables ({}) that no {save} here can read",
            legacy_tables(family).join(", ")
        ))),
    })
}

/// The iptables-legacy tables of this thread's namespace, by name.
fn legacy_tables(family: Family) -> Vec<String> {
    let file = match family {
        Family::V4 => "ip_tables_names",
        Family::V6 => "ip6_tables_names",
    };
    std::fs::read_to_string(format!("/proc/thread-self/net/{file}"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// What a scan found: Istio's chains, and the iptables tables that could not be read.
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub leftovers: Vec<Leftover>,
    /// One line per variant and family whose tables exist but could not be read (no binary).
    pub unread: Vec<String>,
}

pub(crate) fn find(nft_families: &[Family]) -> Result<Found> {
    let mut found = Found::default();
    for source in scan(nft_families)? {
        match source {
            Source::Binary(t) => found.leftovers.extend(t.leftovers()),
            Source::Netlink(_, l) => found.leftovers.extend(l),
            Source::Unread(why) => found.unread.push(why),
        }
    }
    Ok(found)
}

/// Removes what [`find`] finds. Tables that could not be read are left as they are (the
/// caller knows them from [`find`]).
pub(crate) fn remove() -> Result<Vec<Leftover>> {
    let mut removed = Vec::new();
    let nft = redirect_kernel::nft::Nft::open()?;
    let nft_families = nft.families_with_tables()?;
    for source in scan(&nft_families)? {
        let f = match source {
            Source::Binary(f) => f,
            Source::Netlink(family, _) => {
                let went = nft.remove_xtables_chains(&[family], PREFIX)?;
                removed.extend(went.into_iter().map(leftover_of));
                continue;
            }
            Source::Unread(_) => continue,
        };
        let mut args = vec!["--noflush"];
        if f.lock_wait {
            args.push("--wait=30");
        }
        let out = run(&f.restore, &args, Some(&f.cleanup.input))
            .map_err(|e| tool_error(&f.restore, spawn_failure(&f.restore, &e)))?;
        if !out.ok {
            let blamed = super::exec::blamed_line(&out.stderr, &f.cleanup.input)
                .map(|b| format!("; {b}"))
                .unwrap_or_default();
            let done = if removed.is_empty() {
                String::new()
            } else {
                format!("; already removed: {}", summary(&removed))
            };
            return Err(tool_error(
                &f.restore,
                format!(
                    "removing Istio's chains from table {} ({}, {}): {}{blamed}{done}",
                    f.table,
                    f.family,
                    f.variant,
                    out.failure()
                ),
            ));
        }
        removed.extend(f.leftovers());
    }
    Ok(removed)
}

fn leftover_of(c: redirect_kernel::nft::XtChain) -> Leftover {
    Leftover {
        family: c.family,
        variant: Variant::Nft,
        table: c.table,
        chain: c.chain,
        rules: c.rules,
        jumps: c.jumps,
    }
}

fn summary(l: &[Leftover]) -> String {
    l.iter()
        .map(|l| format!("{} {} {} {}", l.family, l.variant, l.table, l.chain))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dump: &str) -> SavedTable {
        parse(dump).into_iter().next().unwrap()
    }

    /// Istio's `tproxy` mangle table as iptables-save prints it, plus a rule of someone else's.
    const MANGLE: &str = "*mangle
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_DIVERT - [0:0]
:ISTIO_INBOUND - [0:0]
:ISTIO_TPROXY - [0:0]
:MINE - [0:0]
-A PREROUTING -i not-istio-nic -j RETURN
-A PREROUTING -p tcp -j ISTIO_INBOUND
-A PREROUTING -p tcp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A PREROUTING -p udp -j MINE
-A OUTPUT -o not-istio-nic -j RETURN
-A OUTPUT -o lo -p tcp -m mark --mark 0x539 -j RETURN
-A OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff
-A OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --gid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff
-A OUTPUT -p tcp -m connmark --mark 0x539 -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
-A OUTPUT -o lo -p udp -m mark --mark 0x539 -j RETURN
-A ISTIO_DIVERT -j MARK --set-xmark 0x539/0xffffffff
-A ISTIO_DIVERT -j ACCEPT
-A ISTIO_INBOUND -p tcp -m conntrack --ctstate RELATED,ESTABLISHED -j ISTIO_DIVERT
-A ISTIO_INBOUND -p tcp -j ISTIO_TPROXY
-A ISTIO_TPROXY ! -d 127.0.0.1/32 -p tcp -j TPROXY --on-port 15006 --on-ip 0.0.0.0 --tproxy-mark 0x539/0xffffffff
-A MINE -i eth0 -j RETURN
-A MINE -j ISTIO_DIVERT
COMMIT
";

    #[test]
    fn plans_jumps_shapes_and_chains() {
        let c = plan_table(&table(MANGLE)).unwrap();
        let want = "*mangle
-D PREROUTING -i not-istio-nic -j RETURN
-D PREROUTING -p tcp -j ISTIO_INBOUND
-D PREROUTING -p tcp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff
-D OUTPUT -o not-istio-nic -j RETURN
-D OUTPUT -o lo -p tcp -m mark --mark 0x539 -j RETURN
-D OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff
-D OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --gid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff
-D OUTPUT -p tcp -m connmark --mark 0x539 -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
-D MINE -j ISTIO_DIVERT
-F ISTIO_DIVERT
-F ISTIO_INBOUND
-F ISTIO_TPROXY
-X ISTIO_DIVERT
-X ISTIO_INBOUND
-X ISTIO_TPROXY
COMMIT
";
        assert_eq!(c.input, want);
        assert_eq!(
            c.leftovers,
            vec![
                // Jumps from ISTIO_INBOUND count too (issue 18: "0 jumps" read as unreachable).
                ("ISTIO_DIVERT".to_string(), 2, 2),
                ("ISTIO_INBOUND".to_string(), 2, 1),
                ("ISTIO_TPROXY".to_string(), 1, 1),
                ("PREROUTING".to_string(), 2, 0),
                ("OUTPUT".to_string(), 5, 0),
            ]
        );
    }

    #[test]
    fn tables_without_istio_chains_are_left_alone() {
        let t = table(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A PREROUTING -i eth1 -j RETURN\nCOMMIT\n",
        );
        assert_eq!(plan_table(&t), None);
    }

    #[test]
    fn shapes_are_exact() {
        let rule = |chain: &str, spec: &str| SavedRule {
            chain: chain.into(),
            spec: spec.into(),
            tokens: super::super::save::tokenize(spec),
        };
        assert!(istio_shaped(
            "nat",
            &rule("PREROUTING", "-i eth9 -j RETURN")
        ));
        assert!(!istio_shaped(
            "nat",
            &rule("PREROUTING", "! -i eth9 -j RETURN")
        ));
        assert!(!istio_shaped(
            "nat",
            &rule("PREROUTING", "-i eth9 -p tcp -j RETURN")
        ));
        assert!(!istio_shaped("nat", &rule("INPUT", "-i eth9 -j RETURN")));
        assert!(!istio_shaped(
            "raw",
            &rule("PREROUTING", "-i eth9 -j RETURN")
        ));
        assert!(!istio_shaped(
            "filter",
            &rule("OUTPUT", "-o eth9 -j RETURN")
        ));
    }
}
