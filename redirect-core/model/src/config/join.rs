//! Lists written as Istio writes them (`80,443`, `10.0.0.0/8,fd00::/8`), for messages,
//! `Selection`'s `Display` and the renderers. Apart from the parsers because writing has its
//! own concern: lists of 10,000 CIDRs are written into one buffer, digit by digit.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::GroupRef;

/// Items as Istio writes a list: comma-separated, no spaces.
pub fn join<T: ListItem>(items: &[T]) -> String {
    join_with(items, ",")
}

/// Items separated by `sep`, into one buffer (no string per item: lists can hold 10,000 CIDRs).
pub fn join_with<T: ListItem>(items: &[T], sep: &str) -> String {
    let mut s = String::with_capacity(items.len() * 16);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            s.push_str(sep);
        }
        item.push_to(&mut s);
    }
    s
}

/// An item of a list we print (ports, IDs, interfaces, groups, CIDRs).
pub trait ListItem: std::fmt::Display {
    /// Append the item to `out` as Istio writes it; by default through its `Display`.
    fn push_to(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = write!(out, "{self}");
    }
}

impl ListItem for u16 {}
impl ListItem for u32 {}
impl ListItem for String {}
impl ListItem for GroupRef {}
impl ListItem for Ipv4Addr {}
impl ListItem for Ipv6Addr {}
impl ListItem for IpAddr {}
impl ListItem for &str {}

/// IPv4 CIDRs are written digit by digit: through `core::fmt`, every piece of 10,000 of them is
/// a `memcpy` call, and musl's (the static builds') is slow for small copies: 6 ms of
/// redirect-init's 21 ms with 10,000 CIDRs.
impl ListItem for IpNet {
    fn push_to(&self, out: &mut String) {
        match self {
            IpNet::V4(n) => {
                for (i, o) in n.addr().octets().iter().enumerate() {
                    if i > 0 {
                        out.push('.');
                    }
                    push_decimal(out, *o);
                }
                out.push('/');
                push_decimal(out, n.prefix_len());
            }
            IpNet::V6(n) => {
                use std::fmt::Write;
                let _ = write!(out, "{n}");
            }
        }
    }
}

fn push_decimal(out: &mut String, v: u8) {
    if v >= 100 {
        out.push(char::from(b'0' + v / 100));
    }
    if v >= 10 {
        out.push(char::from(b'0' + v / 10 % 10));
    }
    out.push(char::from(b'0' + v % 10));
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::Ipv4Net;

    /// The CIDR writer prints what `Display` prints, for every octet value and prefix length.
    #[test]
    fn cidrs_are_written_as_display_writes_them() {
        let mut nets: Vec<IpNet> = Vec::new();
        for v in [0u8, 1, 9, 10, 42, 99, 100, 199, 200, 255] {
            for p in [0u8, 1, 8, 9, 10, 24, 25, 31, 32] {
                let a = Ipv4Addr::new(v, 255 - v, v / 3, v / 7);
                nets.push(IpNet::V4(Ipv4Net::new(a, p).unwrap()));
            }
        }
        nets.push("fd00::/8".parse().unwrap());
        nets.push("::1/128".parse().unwrap());
        let want: Vec<String> = nets.iter().map(|n| n.to_string()).collect();
        assert_eq!(join(&nets), want.join(","));
        assert_eq!(
            join_with(&nets[..2], ", "),
            format!("{}, {}", want[0], want[1])
        );
    }
}
