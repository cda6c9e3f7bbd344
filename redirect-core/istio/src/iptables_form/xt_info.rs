//! The data of the xtables matches and targets Istio's rules use, laid out as the kernel's
//! structs are (LP64: x86_64 and arm64; host byte order where the struct holds host order,
//! network order where it holds `__be16`), padded to `XT_ALIGN` (8), the length the kernel
//! requires. Which revision of each iptables 1.8 picks is beside each builder.

/// Bytes of `len`, with `fields` (offset, bytes) written in.
fn layout(len: usize, fields: &[(usize, &[u8])]) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (at, bytes) in fields {
        v[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    v
}

fn ne32(v: u32) -> [u8; 4] {
    v.to_ne_bytes()
}

/// `owner` revision 1 (`struct xt_owner_match_info`, 18 bytes): `--uid-owner` or
/// `--gid-owner`, `!` inverting it.
pub fn owner(gid: bool, id: u32, invert: bool) -> Vec<u8> {
    // XT_OWNER_UID 1, XT_OWNER_GID 2.
    let bit: u8 = if gid { 2 } else { 1 };
    let at = if gid { 8 } else { 0 };
    let inv = if invert { bit } else { 0 };
    layout(
        24,
        &[
            (at, &ne32(id)),
            (at + 4, &ne32(id)),
            (16, &[bit]),
            (17, &[inv]),
        ],
    )
}

/// `multiport` revision 1 (`struct xt_multiport_v1`, 48 bytes): `[!] --dports a,b`.
pub fn multiport_dports(ports: &[u16], invert: bool) -> Vec<u8> {
    // XT_MULTIPORT_DESTINATION 1; the ports in host order.
    let list: Vec<u8> = ports.iter().flat_map(|p| p.to_ne_bytes()).collect();
    let count = [1u8, ports.len() as u8];
    layout(48, &[(0, &count), (2, &list), (47, &[u8::from(invert)])])
}

/// `tcp` revision 0 (`struct xt_tcp`, 12 bytes) with no option: every source and
/// destination port (`0:65535`, host order).
pub fn tcp_any() -> Vec<u8> {
    let any = [0u16.to_ne_bytes(), u16::MAX.to_ne_bytes()].concat();
    layout(16, &[(0, &any), (4, &any)])
}

/// `conntrack` revision 3 (`struct xt_conntrack_mtinfo3`, 164 bytes): `--ctstate` with the
/// state bits (INVALID 1, ESTABLISHED 2, RELATED 4).
pub fn conntrack_state(states: u16) -> Vec<u8> {
    // match_flags XT_CONNTRACK_STATE (1) at 146, state_mask at 150.
    layout(
        168,
        &[(146, &1u16.to_ne_bytes()), (150, &states.to_ne_bytes())],
    )
}

/// `connmark` revision 1 (`struct xt_connmark_mtinfo1`, 9 bytes): `[!] --mark v[/m]`.
pub fn connmark(mark: u32, mask: u32, invert: bool) -> Vec<u8> {
    layout(
        16,
        &[(0, &ne32(mark)), (4, &ne32(mask)), (8, &[u8::from(invert)])],
    )
}

/// `REDIRECT` revision 0, `--to-ports p`: IPv4's `struct nf_nat_ipv4_multi_range_compat` (20
/// bytes), IPv6's `struct nf_nat_range` (40 bytes); `NF_NAT_RANGE_PROTO_SPECIFIED`.
pub fn redirect(v6: bool, port: u16) -> Vec<u8> {
    let p = port.to_be_bytes();
    match v6 {
        false => layout(24, &[(0, &ne32(1)), (4, &ne32(2)), (16, &p), (18, &p)]),
        true => layout(40, &[(0, &ne32(2)), (36, &p), (38, &p)]),
    }
}

/// `MARK` revision 2 (`struct xt_mark_tginfo2`, 8 bytes): `--set-mark v`.
pub fn mark(value: u32) -> Vec<u8> {
    layout(8, &[(0, &ne32(value)), (4, &ne32(u32::MAX))])
}

/// `CONNMARK` revision 2 (`struct xt_connmark_tginfo2`, 15 bytes): `--save-mark` (mode 1) or
/// `--restore-mark` (mode 2), every bit.
pub fn connmark_target(restore: bool) -> Vec<u8> {
    let mode = if restore { 2u8 } else { 1 };
    layout(
        16,
        &[(4, &ne32(u32::MAX)), (8, &ne32(u32::MAX)), (14, &[mode])],
    )
}

/// `CONNMARK` revision 2, `--set-xmark v/m` (mode 0): the connection mark's bits in `m`
/// set to `v`'s.
pub fn connmark_set(mark: u32, mask: u32) -> Vec<u8> {
    layout(16, &[(0, &ne32(mark)), (4, &ne32(mask))])
}

/// `TPROXY` revision 1 (`struct xt_tproxy_target_info_v1`, 28 bytes): `--tproxy-mark v/m
/// --on-port p`.
pub fn tproxy(mark: u32, mask: u32, port: u16) -> Vec<u8> {
    layout(
        32,
        &[
            (0, &ne32(mask)),
            (4, &ne32(mark)),
            (24, &port.to_be_bytes()),
        ],
    )
}

/// `CT` revision 2 (`struct xt_ct_target_info_v1`, 72 bytes): `--zone z`.
pub fn ct_zone(zone: u16) -> Vec<u8> {
    layout(72, &[(2, &zone.to_ne_bytes())])
}
