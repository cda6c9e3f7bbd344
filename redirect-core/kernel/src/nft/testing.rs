//! The batches each job sends, encoded but not sent: the config → plan → netlink path without
//! a kernel, for the libnftnl oracle test and the benchmarks (feature `testing`).

use redirect_model::Ruleset;

use super::{lower, update, Changes, Encoded, Features, NftTable, TableState, TABLE};

/// The batch `apply` sends into a namespace without our table.
pub fn encode(rs: &Ruleset, features: Features) -> Encoded {
    update::create(&lower(rs), 1, None, features)
}

/// [`encode`] for the kernel this process runs on.
pub fn encode_running(rs: &Ruleset) -> Encoded {
    encode(rs, Features::of_running_kernel())
}

/// The batch that creates a lowered table.
pub fn encode_create(t: &NftTable, first_seq: u32, features: Features) -> Encoded {
    update::create(t, first_seq, None, features)
}

/// The same, bound to a ruleset generation, as `apply` sends it.
pub fn encode_create_bound(
    t: &NftTable,
    first_seq: u32,
    genid: u32,
    features: Features,
) -> Encoded {
    update::create(t, first_seq, Some(genid), features)
}

/// The batch that updates `current` into `t` in place, `None` when equal.
pub fn encode_update(
    current: &TableState,
    t: &NftTable,
    features: Features,
) -> Option<(Encoded, Changes)> {
    update::update(current, t, 1, None, features)
}

/// The batch that replaces our table whatever it holds.
pub fn encode_replace(t: &NftTable, first_seq: u32, features: Features) -> Encoded {
    update::replace(t, first_seq, features)
}

/// The batch that adds (or, `delete`, removes) the elements of `t`'s sets, as
/// `Nft::add_elements` and `Nft::remove_elements` send it (the latter bound to a generation).
pub fn encode_elements(t: &NftTable, delete: bool, features: Features) -> Encoded {
    update::elements(t, delete, 1, None, features)
}

/// The batch that deletes our table.
pub fn encode_delete(first_seq: u32, features: Features) -> Encoded {
    update::delete_tables(&[TABLE.to_string()], first_seq, features)
}

/// The batch that removes iptables-nft's chains `found` holds (`Nft::remove_xtables_chains`),
/// unbound to a generation.
pub fn encode_xtables_removal(found: &super::XtFound, features: Features) -> Encoded {
    super::xtables::removal(found, 1, None, features)
}
