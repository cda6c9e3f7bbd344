//! Choosing the binaries as Istio does (reference §1.11): the forced variant only; else legacy
//! if it works and already holds rules in this namespace; else nft if it works; else plain
//! `iptables`. "Works" = `<bin>-save` runs, `<bin>-save --version` reads, and a test rule
//! (`-t nat -A INPUT -p 255 -j RETURN`, protocol 255 never matches) can be added and deleted.
//!
//! One deliberate difference: "holds rules" counts `-A` lines, where Istio counts three lines
//! of output. Probing materializes empty tables (the test rule creates `nat`), so Istio's count
//! can flip to legacy on a second run (istio/istio#61020); a rule count cannot. For the same
//! reason legacy is only probed (test rule included) when it holds rules.

use super::exec::{self, run, spawn_failure, tool_error, FIX};
use super::save::rule_count;
use super::{Tool, Variant};
use crate::error::Result;
use redirect_model::Family;

/// The three binary names of one variant (`None` = the plain, unsuffixed ones).
pub(crate) struct Names {
    pub bin: String,
    pub save: String,
    pub restore: String,
}

pub(crate) fn names(family: Family, variant: Option<Variant>) -> Names {
    let base = base(family);
    let bin = match variant {
        Some(v) => format!("{base}-{v}"),
        None => base.to_string(),
    };
    Names {
        save: format!("{bin}-save"),
        restore: format!("{bin}-restore"),
        bin,
    }
}

fn base(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    }
}

/// Legacy from 1.6.2 on takes the xtables lock, so writes pass `--wait=30` (as Istio does).
const LOCKING_SINCE: [u32; 3] = [1, 6, 2];

/// `v1.8.9` out of `iptables-save v1.8.9 (nf_tables)`.
fn parse_version(s: &str) -> Option<String> {
    s.split_whitespace().find_map(|w| {
        let v = w.strip_prefix('v')?;
        let ok = !v.is_empty()
            && v.starts_with(|c: char| c.is_ascii_digit())
            && v.chars().all(|c| c.is_ascii_digit() || c == '.');
        ok.then(|| v.to_string())
    })
}

fn at_least(version: &str, min: [u32; 3]) -> bool {
    let parts: Vec<u32> = version
        .split('.')
        .map(|p| p.parse().unwrap_or(0))
        .chain(std::iter::repeat(0))
        .take(3)
        .collect();
    parts.as_slice() >= min.as_slice()
}

/// The version and variant `<save> --version` reports. A save binary too old to know
/// `--version` (legacy 1.6.1) is taken as legacy 0.0.0, as Istio does.
pub(crate) fn version_of(save: &str) -> std::result::Result<(String, Variant), String> {
    let out = run(save, &["--version"], None).map_err(|e| spawn_failure(save, &e))?;
    if !out.ok || out.stderr.contains("unrecognized option") {
        return Ok(("0.0.0".into(), Variant::Legacy));
    }
    let version = parse_version(&out.stdout).ok_or_else(|| {
        format!(
            "{save} --version printed no version: {:?}",
            out.stdout.trim()
        )
    })?;
    let variant = if out.stdout.contains("nf_tables") {
        Variant::Nft
    } else {
        Variant::Legacy
    };
    Ok((version, variant))
}

pub(crate) fn lock_wait(variant: Variant, version: &str) -> bool {
    variant == Variant::Legacy && at_least(version, LOCKING_SINCE)
}

/// Whether `names` works here; the reason when not.
fn probe(family: Family, n: &Names) -> std::result::Result<Tool, String> {
    let dump = run(&n.save, &[], None).map_err(|e| spawn_failure(&n.save, &e))?;
    if !dump.ok {
        return Err(format!("{} failed, {}", n.save, dump.failure()));
    }
    let (version, variant) = version_of(&n.save)?;
    let lock_wait = lock_wait(variant, &version);
    let mut test = vec!["-t", "nat", "-A", "INPUT", "-p", "255", "-j", "RETURN"];
    if lock_wait {
        test.push("--wait=30");
    }
    let added = run(&n.bin, &test, None).map_err(|e| spawn_failure(&n.bin, &e))?;
    if !added.ok || added.stderr.contains("does not exist") {
        return Err(format!(
            "{} cannot add a test rule to table nat here (the kernel may lack {variant} \
             iptables support), {}",
            n.bin,
            added.failure()
        ));
    }
    test[2] = "-D";
    // A leftover test rule never matches anything (protocol 255); nothing to undo on failure.
    let _ = run(&n.bin, &test, None);
    Ok(Tool {
        family,
        variant,
        save: n.save.clone(),
        restore: n.restore.clone(),
        version,
        lock_wait,
    })
}

pub(crate) fn detect(family: Family, force: Option<Variant>) -> Result<Tool> {
    if let Some(v) = force {
        let n = names(family, Some(v));
        return probe(family, &n).map_err(|why| {
            tool_error(
                &n.bin,
                format!(
                    "FORCE_IPTABLES_BINARY={v} but {why}; {FIX}, or unset FORCE_IPTABLES_BINARY"
                ),
            )
        });
    }
    let candidates = [Some(Variant::Legacy), Some(Variant::Nft), None]
        .into_iter()
        .map(|v| (v, names(family, v)))
        .collect();
    detect_names(family, candidates)
}

/// Istio's order over the candidates; split out so a test can run it on names that do not
/// exist.
fn detect_names(family: Family, candidates: Vec<(Option<Variant>, Names)>) -> Result<Tool> {
    let mut why_not = Vec::new();
    for (variant, n) in &candidates {
        if *variant == Some(Variant::Legacy) {
            match run(&n.save, &[], None) {
                Err(e) => {
                    why_not.push(spawn_failure(&n.save, &e));
                    continue;
                }
                Ok(o) if !o.ok => {
                    why_not.push(format!("{} failed, {}", n.save, o.failure()));
                    continue;
                }
                Ok(o) if rule_count(&o.stdout) == 0 => {
                    why_not.push(format!(
                        "{} holds no rules in this network namespace (legacy is chosen only \
                         when it does)",
                        n.bin
                    ));
                    continue;
                }
                Ok(_) => {}
            }
        }
        match probe(family, n) {
            Ok(tool) => return Ok(tool),
            Err(why) => why_not.push(why),
        }
    }
    let tried: Vec<&str> = candidates.iter().map(|(_, n)| n.bin.as_str()).collect();
    Err(exec::tool_error(
        &tried.join(", "),
        format!(
            "no usable {} binary for {family}: {}; {FIX}",
            base(family),
            why_not.join("; ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(
            parse_version("iptables-save v1.8.9 (nf_tables)\n").as_deref(),
            Some("1.8.9")
        );
        assert_eq!(
            parse_version("ip6tables-legacy-save v1.6.2").as_deref(),
            Some("1.6.2")
        );
        assert_eq!(parse_version("version 1.8.9"), None);
        assert_eq!(parse_version("vx v"), None);
        assert!(at_least("1.6.2", LOCKING_SINCE));
        assert!(at_least("1.8", LOCKING_SINCE));
        assert!(!at_least("1.6.1", LOCKING_SINCE));
        assert!(!at_least("0.0.0", LOCKING_SINCE));
        assert!(!at_least("garbage", LOCKING_SINCE));
        assert!(lock_wait(Variant::Legacy, "1.8.9"));
        assert!(!lock_wait(Variant::Nft, "1.8.9"));
    }

    #[test]
    fn names_per_family_and_variant() {
        let n = names(Family::V6, Some(Variant::Legacy));
        assert_eq!(
            (n.bin.as_str(), n.save.as_str(), n.restore.as_str()),
            (
                "ip6tables-legacy",
                "ip6tables-legacy-save",
                "ip6tables-legacy-restore"
            )
        );
        assert_eq!(names(Family::V4, None).save, "iptables-save");
        assert_eq!(names(Family::V4, Some(Variant::Nft)).bin, "iptables-nft");
    }

    /// Nothing installed: the error names every binary tried, why each failed, and the fix.
    #[test]
    fn no_binary_names_all_tried_and_the_fix() {
        let fake = |s: &str| Names {
            bin: format!("rdt-missing-{s}"),
            save: format!("rdt-missing-{s}-save"),
            restore: format!("rdt-missing-{s}-restore"),
        };
        let err = detect_names(
            Family::V4,
            vec![
                (Some(Variant::Legacy), fake("legacy")),
                (Some(Variant::Nft), fake("nft")),
                (None, fake("plain")),
            ],
        )
        .unwrap_err();
        let msg = err.to_string();
        for s in ["legacy", "nft", "plain"] {
            assert!(
                msg.contains(&format!("rdt-missing-{s}-save is not installed")),
                "{msg}"
            );
        }
        assert!(msg.contains("install iptables"), "{msg}");
        assert!(msg.contains("native nftables backend"), "{msg}");
        assert!(msg.starts_with("rdt-missing-legacy, rdt-missing-nft, rdt-missing-plain failed"));
    }
}
