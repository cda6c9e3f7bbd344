//! TPROXY policy routing and the IPv6 inbound address on `lo`, over rtnetlink.
//!
//! Istio's TPROXY mode runs, per family:
//!
//! ```text
//! ip rule add fwmark 1337 lookup 133
//! ip route add local 0.0.0.0/0 dev lo table 133      # v6: local ::/0
//! ```
//!
//! so that marked packets are delivered locally to the proxy's transparent socket, and with
//! IPv6 it adds `::6/128` to `lo` (`ip -6 addr add ::6/128 dev lo`) for inbound redirection.
//! This module does the same with synchronous netlink requests (no `ip` binary) and builds the
//! messages as iproute2 does, so the kernel state is identical to Istio's. Every request asks
//! for an ACK and checks it. Apply and remove are idempotent.
//!
//! Every function acts on the network namespace of the calling thread and opens its own socket
//! there: to act on a pod, call them inside [`crate::netns::Netns::run`].

use std::io;
use std::net::{IpAddr, Ipv6Addr};

use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::route::{
    RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use std::cell::RefCell;

type Result<T, E = Error> = std::result::Result<T, E>;
use crate::netlink::Step;
use crate::netns::Netns;
use redirect_model::Family;

/// Why a routing request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Routing values that would reroute all traffic (checked again here, below the config's
    /// own validation, since a wrong value here blackholes the namespace).
    #[error("invalid {field}: {value:?}: {expected}")]
    UnsafeRouting {
        /// Which value, in words ("tproxy mark").
        field: &'static str,
        /// The value refused, as text ("0x539/0x0").
        value: String,
        /// What a safe value is.
        expected: String,
    },

    /// A routing (rtnetlink) request failed.
    #[error("{what} ({family}) failed: {cause} (errno {errno}){hint}")]
    Route {
        /// The request, in words ("add rule fwmark 0x539 lookup 133").
        what: String,
        /// The family the request was for.
        family: Family,
        /// The kernel's errno.
        errno: i32,
        /// The errno as an error (in the message, not a `source()`).
        cause: io::Error,
        /// What to do about the errno ("; hint: ..."), or empty.
        hint: &'static str,
    },

    /// A request about a network interface (rtnetlink link) failed.
    #[error("{what} failed: {cause} (errno {errno}){hint}")]
    Link {
        /// The request, in words ("look up interface \"lo\"").
        what: String,
        /// The kernel's errno.
        errno: i32,
        /// The errno as an error (in the message, not a `source()`).
        cause: io::Error,
        /// What to do about the errno ("; hint: ..."), or empty.
        hint: &'static str,
    },

    /// A netlink socket operation failed before the kernel answered.
    #[error("netlink {op} failed: {cause}{hint}")]
    Netlink {
        /// The operation, in words ("send a routing request").
        op: &'static str,
        /// The socket's error (in the message, not a `source()`).
        cause: io::Error,
        /// A hint to put after the message; the routing socket's errors have none (empty).
        hint: &'static str,
    },
}

/// The address Istio puts on `lo` for IPv6 inbound capture (`::6/128`).
pub const LO_V6_INBOUND_ADDR: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6);

/// Mark-based local routing (the model's [`PolicyRouting`](redirect_model::PolicyRouting)): packets whose mark under `mask`
/// is `mark` are looked up in `table`, which holds one `local` default route via `lo`.
pub use redirect_model::PolicyRouting as TproxyRouting;

/// Refuses routing values that would reroute all traffic: mark 0 makes the kernel match every
/// packet, and a local default route in a reserved table (0 unspec, 253 default, 254 main, 255
/// local) would capture everything. Checked here again, below the config's own validation,
/// since a wrong value blackholes the namespace.
pub fn validate(r: &TproxyRouting) -> Result<()> {
    if r.mask == 0 || r.mark & !r.mask != 0 {
        return Err(Error::UnsafeRouting {
            field: "tproxy mark mask",
            value: format!("{:#x}/{:#x}", r.mark, r.mask),
            expected: "a non-zero mask that covers the mark (a zero mask matches every \
                       packet; a mark outside it matches none)"
                .into(),
        });
    }
    if r.mark == 0 {
        return Err(Error::UnsafeRouting {
            field: "tproxy mark",
            value: "0".into(),
            expected: "a non-zero fwmark (Istio uses 1337)".into(),
        });
    }
    if matches!(r.table, 0 | 253..=255) {
        return Err(Error::UnsafeRouting {
            field: "tproxy route table",
            value: r.table.to_string(),
            expected:
                "a table id other than 0, 253 (default), 254 (main) and 255 (local); Istio uses 133"
                    .into(),
        });
    }
    Ok(())
}

/// What [`Routes::read_tproxy`] found for one family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TproxyState {
    /// Number of `fwmark <mark> lookup <table>` rules (more than one if someone added
    /// duplicates, e.g. `ip rule add` run twice).
    pub rules: usize,
    /// Whether the `local` default route via `lo` is in the table.
    pub route: bool,
}

impl TproxyState {
    /// The rule and the route are both there.
    pub fn is_complete(&self) -> bool {
        self.rules > 0 && self.route
    }

    /// Neither the rule nor the route is there.
    pub fn is_absent(&self) -> bool {
        self.rules == 0 && !self.route
    }
}

/// TPROXY routing, `::6` on `lo` and the interfaces' addresses of one network namespace, over
/// one NETLINK_ROUTE socket opened there.
pub struct Routes {
    nl: RefCell<Rtnl>,
}

impl Routes {
    /// A handle on the calling thread's network namespace.
    pub fn open() -> Result<Routes> {
        Ok(Routes {
            nl: RefCell::new(Rtnl::open()?),
        })
    }

    /// A handle on the namespace `netns` holds (the socket is created there, on a thread that
    /// enters it; the caller's thread stays where it is).
    pub fn open_in(netns: &Netns) -> crate::Result<Routes> {
        Ok(netns.run(Routes::open)??)
    }

    /// Adds, for each family, the rule `fwmark <mark> lookup <table>` and the route
    /// `local default dev lo table <table>`, unless they exist already.
    ///
    /// `lo` must be up for IPv6: the kernel refuses an IPv6 route via a down device (ENETDOWN).
    /// In a pod it is (the runtime or the CNI `loopback` plugin brings it up).
    pub fn apply_tproxy(&self, r: &TproxyRouting, families: &[Family]) -> Result<()> {
        validate(r)?;
        let nl = &mut *self.nl.borrow_mut();
        let lo = link_index(nl, "lo")?;
        for &family in families {
            // `ip rule add` happily adds duplicates, and NLM_F_EXCL does not help: the kernel's
            // duplicate check compares the priority too, which it picks anew for each rule sent
            // without one (Linux 6.18: three adds gave rules at 32765, 32764, 32763; with an
            // explicit priority the second add gets EEXIST). So look before adding.
            if our_rules(nl, r, family)?.is_empty() {
                let errno = nl.ack(
                    RouteNetlinkMessage::NewRule(rule_message(r, family)),
                    NLM_F_CREATE | NLM_F_EXCL,
                )?;
                check(errno, &[libc::EEXIST], || {
                    route_error(format!("add rule {}", rule_text(r)), family, errno)
                })?;
            }
            // Routes have a real identity: NLM_F_EXCL makes a duplicate fail with EEXIST.
            let errno = nl.ack(
                RouteNetlinkMessage::NewRoute(route_message(r, family, lo, RouteScope::Host)),
                NLM_F_CREATE | NLM_F_EXCL,
            )?;
            check(errno, &[libc::EEXIST], || {
                route_error(
                    format!("add route {}", route_text(r, family)),
                    family,
                    errno,
                )
            })?;
        }
        Ok(())
    }

    /// Deletes, for each family, every `fwmark <mark> lookup <table>` rule and the `local` default
    /// route in the table. What is absent already is fine.
    pub fn remove_tproxy(&self, r: &TproxyRouting, families: &[Family]) -> Result<()> {
        validate(r)?;
        let nl = &mut *self.nl.borrow_mut();
        let lo = link_index(nl, "lo")?;
        for &family in families {
            // Send back each rule as dumped (with its priority) so only that rule goes.
            for rule in our_rules(nl, r, family)? {
                let errno = nl.ack(RouteNetlinkMessage::DelRule(rule), 0)?;
                check(errno, &[libc::ENOENT], || {
                    route_error(format!("delete rule {}", rule_text(r)), family, errno)
                })?;
            }
            // Scope "nowhere" is the kernel's wildcard for deletion: match whatever scope it has.
            let del = route_message(r, family, lo, RouteScope::NoWhere);
            // Bounded: a table could hold several such routes (other metrics or TOS), each
            // delete removes one.
            for _ in 0..16 {
                let errno = nl.ack(RouteNetlinkMessage::DelRoute(del.clone()), 0)?;
                if matches!(errno, libc::ESRCH | libc::ENOENT | libc::EAFNOSUPPORT) {
                    break;
                }
                check(errno, &[], || {
                    route_error(
                        format!("delete route {}", route_text(r, family)),
                        family,
                        errno,
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Reads back whether the rule and the route of `r` exist for `family`.
    pub fn read_tproxy(&self, r: &TproxyRouting, family: Family) -> Result<TproxyState> {
        let nl = &mut *self.nl.borrow_mut();
        let lo = link_index(nl, "lo")?;
        let rules = our_rules(nl, r, family)?.len();
        let route = nl
            .routes(family)?
            .iter()
            .any(|m| is_our_route(m, r, family, lo));
        Ok(TproxyState { rules, route })
    }

    /// Adds `::6/128` to `lo`; present already is fine. `lo` need not be up.
    pub fn ensure_lo_v6_inbound_addr(&self) -> Result<()> {
        let nl = &mut *self.nl.borrow_mut();
        let lo = link_index(nl, "lo")?;
        let mut add = lo_v6_message(lo);
        // Without NODAD the kernel adds the address tentative and clears that from its
        // address-configuration work queue, shared by every namespace: until then a bind to
        // ::6 (the validation probe's, the proxy's) fails with EADDRNOTAVAIL.
        add.header.flags = AddressHeaderFlags::Nodad;
        let errno = nl.ack(
            RouteNetlinkMessage::NewAddress(add),
            NLM_F_CREATE | NLM_F_EXCL,
        )?;
        check(errno, &[libc::EEXIST], || {
            route_error(
                format!("add address {LO_V6_INBOUND_ADDR}/128 to lo"),
                Family::V6,
                errno,
            )
        })
    }

    /// Deletes `::6/128` from `lo`; absent is fine.
    pub fn remove_lo_v6_inbound_addr(&self) -> Result<()> {
        let nl = &mut *self.nl.borrow_mut();
        let lo = link_index(nl, "lo")?;
        let errno = nl.ack(RouteNetlinkMessage::DelAddress(lo_v6_message(lo)), 0)?;
        // EADDRNOTAVAIL: not on lo; EAFNOSUPPORT: no IPv6 here at all, so nothing to remove.
        check(
            errno,
            &[libc::EADDRNOTAVAIL, libc::ENOENT, libc::EAFNOSUPPORT],
            || {
                route_error(
                    format!("delete address {LO_V6_INBOUND_ADDR}/128 from lo"),
                    Family::V6,
                    errno,
                )
            },
        )
    }

    /// Whether `lo` has `::6/128`.
    pub fn has_lo_v6_inbound_addr(&self) -> Result<bool> {
        let nl = &mut *self.nl.borrow_mut();
        let lo = link_index(nl, "lo")?;
        let mut dump = AddressMessage::default();
        dump.header.family = AddressFamily::Inet6;
        let addrs = nl.dump(
            RouteNetlinkMessage::GetAddress(dump),
            "list addresses",
            Family::V6,
        )?;
        Ok(addrs.iter().any(|m| match m {
            RouteNetlinkMessage::NewAddress(a) => {
                a.header.index == lo
                    && a.header.prefix_len == 128
                    && a.attributes.iter().any(|attr| {
                        matches!(attr, AddressAttribute::Address(IpAddr::V6(ip)) if *ip == LO_V6_INBOUND_ADDR)
                    })
            }
            _ => false,
        }))
    }

    /// The addresses of [`Routes::interface_addresses`], without the interfaces.
    pub fn addresses(&self) -> Result<Vec<IpAddr>> {
        Ok(self
            .interface_addresses()?
            .into_iter()
            .map(|(_, ip)| ip)
            .collect())
    }

    /// Every address on every interface of this namespace, in the kernel's order (IPv4 first,
    /// then IPv6), with the interface index. Istio's host-IP detection reads the same list.
    pub fn interface_addresses(&self) -> Result<Vec<(u32, IpAddr)>> {
        let nl = &mut *self.nl.borrow_mut();
        let mut out = Vec::new();
        // One dump of every family (AF_UNSPEC), not one per family: a round trip less.
        {
            let dump = RouteNetlinkMessage::GetAddress(AddressMessage::default());
            let (replies, errno) = nl.exchange(dump, NLM_F_REQUEST | NLM_F_DUMP)?;
            if errno != 0 {
                return Err(link_error("list addresses".into(), errno));
            }
            for m in replies {
                if let RouteNetlinkMessage::NewAddress(a) = m {
                    // IFA_LOCAL is the address itself on point-to-point links; IFA_ADDRESS otherwise.
                    let local = a.attributes.iter().find_map(|at| match at {
                        AddressAttribute::Local(ip) => Some(*ip),
                        _ => None,
                    });
                    let addr = a.attributes.iter().find_map(|at| match at {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    });
                    if let Some(ip) = local.or(addr) {
                        out.push((a.header.index, ip));
                    }
                }
            }
        }
        // IPv4 first, each family in the kernel's order (a stable sort).
        out.sort_by_key(|(_, ip)| ip.is_ipv6());
        Ok(out)
    }
}

// ---- messages, built as iproute2 builds them ----

pub(crate) fn address_family(family: Family) -> AddressFamily {
    match family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    }
}

/// The header's 8-bit table field; ids above 255 travel only in the table attribute.
pub(crate) fn header_table(table: u32) -> u8 {
    u8::try_from(table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC)
}

fn rule_text(r: &TproxyRouting) -> String {
    let mask = match r.mask {
        u32::MAX => String::new(),
        m => format!("/{m:#x}"),
    };
    let pref = r.priority.map(|p| format!(" pref {p}")).unwrap_or_default();
    format!("fwmark {:#x}{mask} lookup {}{pref}", r.mark, r.table)
}

fn route_text(r: &TproxyRouting, family: Family) -> String {
    let dst = match family {
        Family::V4 => "0.0.0.0/0",
        Family::V6 => "::/0",
    };
    format!("local {dst} dev lo table {}", r.table)
}

/// `fwmark <mark>/<mask> lookup <table> [pref <priority>]`. iproute2 sends no mask for a full
/// one and the kernel then uses 0xffffffff; sending it explicitly gives the same rule.
fn rule_message(r: &TproxyRouting, family: Family) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = address_family(family);
    m.header.table = header_table(r.table);
    m.header.action = RuleAction::ToTable;
    m.attributes = vec![
        RuleAttribute::FwMark(r.mark),
        RuleAttribute::FwMask(r.mask),
        RuleAttribute::Table(r.table),
    ];
    if let Some(p) = r.priority {
        m.attributes.push(RuleAttribute::Priority(p));
    }
    m
}

/// Whether a dumped rule is exactly ours: the mark, the mask, the table (and the priority when
/// we name one), and no other selector (a rule with an extra `iif`, `from`, `not` ... is someone else's).
fn is_our_rule(m: &RuleMessage, r: &TproxyRouting, family: Family) -> bool {
    let h = &m.header;
    if h.family != address_family(family)
        || h.action != RuleAction::ToTable
        || h.src_len != 0
        || h.dst_len != 0
        || h.tos != 0
        || h.flags.contains(RuleFlags::Invert)
    {
        return false;
    }
    let (mut mark, mut mask, mut table, mut priority) = (None, None, u32::from(h.table), None);
    for attr in &m.attributes {
        match attr {
            RuleAttribute::FwMark(v) => mark = Some(*v),
            RuleAttribute::FwMask(v) => mask = Some(*v),
            RuleAttribute::Table(v) => table = *v,
            RuleAttribute::Priority(p) => priority = Some(*p),
            RuleAttribute::Protocol(_) => {}
            // The kernel reports "no suppression" as -1, and does so for every rule.
            RuleAttribute::SuppressPrefixLen(u32::MAX)
            | RuleAttribute::SuppressIfGroup(u32::MAX) => {}
            _ => return false,
        }
    }
    let mask = mask.unwrap_or(u32::MAX);
    mark == Some(r.mark)
        && mask == r.mask
        && table == r.table
        && r.priority.is_none_or(|p| priority == Some(p))
}

fn our_rules(nl: &mut Rtnl, r: &TproxyRouting, family: Family) -> Result<Vec<RuleMessage>> {
    let mut rules = nl.rules(family)?;
    rules.retain(|m| is_our_rule(m, r, family));
    Ok(rules)
}

/// `local <default> dev lo table <table>`, with what `ip route add` sets: protocol boot, and
/// host scope for a local route. No destination attribute: a /0 needs none.
fn route_message(r: &TproxyRouting, family: Family, lo: u32, scope: RouteScope) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = address_family(family);
    m.header.table = header_table(r.table);
    m.header.protocol = if scope == RouteScope::NoWhere {
        RouteProtocol::Unspec // a wildcard when deleting
    } else {
        RouteProtocol::Boot
    };
    m.header.scope = scope;
    m.header.kind = RouteType::Local;
    m.attributes = vec![RouteAttribute::Table(r.table), RouteAttribute::Oif(lo)];
    m
}

fn is_our_route(m: &RouteMessage, r: &TproxyRouting, family: Family, lo: u32) -> bool {
    let h = &m.header;
    let mut table = u32::from(h.table);
    let mut oif = None;
    for attr in &m.attributes {
        match attr {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    h.address_family == address_family(family)
        && h.kind == RouteType::Local
        && h.destination_prefix_length == 0
        && h.source_prefix_length == 0
        && table == r.table
        && oif == Some(lo)
}

fn lo_v6_message(lo: u32) -> AddressMessage {
    let mut m = AddressMessage::default();
    m.header.family = AddressFamily::Inet6;
    m.header.prefix_len = 128;
    m.header.index = lo;
    let ip = IpAddr::V6(LO_V6_INBOUND_ADDR);
    m.attributes = vec![AddressAttribute::Local(ip), AddressAttribute::Address(ip)];
    m
}

/// The index of the interface called `name` in this namespace (`lo` is 1 in a fresh one, but
/// that is not promised).
fn link_index(nl: &mut Rtnl, name: &str) -> Result<u32> {
    let mut get = LinkMessage::default();
    get.attributes.push(LinkAttribute::IfName(name.to_owned()));
    let (replies, errno) =
        nl.exchange(RouteNetlinkMessage::GetLink(get), NLM_F_REQUEST | NLM_F_ACK)?;
    check(errno, &[], || {
        link_error(format!("look up interface {name:?}"), errno)
    })?;
    replies
        .iter()
        .find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(l.header.index),
            _ => None,
        })
        .ok_or_else(|| link_error(format!("look up interface {name:?}"), libc::ENODEV))
}

// ---- errors ----

/// Ok if the kernel said 0 or one of `ok`, else the error `err` builds.
pub(crate) fn check(errno: i32, ok: &[i32], err: impl FnOnce() -> Error) -> Result<()> {
    if errno == 0 || ok.contains(&errno) {
        Ok(())
    } else {
        Err(err())
    }
}

pub(crate) fn route_error(what: String, family: Family, errno: i32) -> Error {
    Error::Route {
        what,
        family,
        errno,
        cause: io::Error::from_raw_os_error(errno),
        hint: route_hint(errno),
    }
}

pub(crate) fn link_error(what: String, errno: i32) -> Error {
    Error::Link {
        what,
        errno,
        cause: io::Error::from_raw_os_error(errno),
        hint: route_hint(errno),
    }
}

fn netlink_error(op: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |cause| Error::Netlink {
        op,
        cause,
        hint: "",
    }
}

/// Hints for routing requests (`errno_hint` speaks of nf_tables).
fn route_hint(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "; hint: changing routes needs CAP_NET_ADMIN in the pod's network namespace (run as root or grant NET_ADMIN)",
        libc::EACCES => "; hint: IPv6 is disabled on the interface (sysctl net.ipv6.conf.<if>.disable_ipv6=1); enable it or turn IPv6 capture off",
        libc::EAFNOSUPPORT => "; hint: this address family is not available in the namespace (IPv6 disabled with ipv6.disable=1?); enable it or turn IPv6 capture off",
        libc::ENODEV => "; hint: no interface by that name in this network namespace",
        libc::ENETDOWN => "; hint: an IPv6 route via lo needs lo up; bring it up first (ip link set lo up)",
        libc::ENETUNREACH | libc::EINVAL => "; hint: the kernel found the request malformed or inconsistent",
        libc::ENOMEM | libc::ENOBUFS => "; hint: the kernel ran out of memory",
        _ => "",
    }
}

// ---- the socket ----

/// A NETLINK_ROUTE socket in the calling thread's namespace, used for one request at a time.
pub(crate) struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    pub(crate) fn open() -> Result<Self> {
        let mut socket =
            Socket::new(NETLINK_ROUTE).map_err(netlink_error("open a NETLINK_ROUTE socket"))?;
        socket
            .bind_auto()
            .map_err(netlink_error("bind the NETLINK_ROUTE socket"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(netlink_error("connect the NETLINK_ROUTE socket"))?;
        Ok(Rtnl { socket, seq: 0 })
    }

    /// Sends a request with an ACK asked for; returns the kernel's errno (0 = done).
    pub(crate) fn ack(&mut self, msg: RouteNetlinkMessage, flags: u16) -> Result<i32> {
        Ok(self.exchange(msg, NLM_F_REQUEST | NLM_F_ACK | flags)?.1)
    }

    /// Dumps all objects of one kind; a kernel error becomes [`Error::Route`], except
    /// EAFNOSUPPORT (the family does not exist here), which is an empty list.
    pub(crate) fn dump(
        &mut self,
        msg: RouteNetlinkMessage,
        what: &str,
        family: Family,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let (replies, errno) = self.exchange(msg, NLM_F_REQUEST | NLM_F_DUMP)?;
        match errno {
            0 => Ok(replies),
            libc::EAFNOSUPPORT => Ok(Vec::new()),
            _ => Err(route_error(what.to_owned(), family, errno)),
        }
    }

    /// Every rule of `family`.
    pub(crate) fn rules(&mut self, family: Family) -> Result<Vec<RuleMessage>> {
        let mut dump = RuleMessage::default();
        dump.header.family = address_family(family);
        let replies = self.dump(RouteNetlinkMessage::GetRule(dump), "list rules", family)?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRule(m) => Some(m),
                _ => None,
            })
            .collect())
    }

    /// Every route of `family`, of every table (a dump without a table asked gives them all).
    pub(crate) fn routes(&mut self, family: Family) -> Result<Vec<RouteMessage>> {
        let mut dump = RouteMessage::default();
        dump.header.address_family = address_family(family);
        let replies = self.dump(RouteNetlinkMessage::GetRoute(dump), "list routes", family)?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(m) => Some(m),
                _ => None,
            })
            .collect())
    }

    /// Sends one request and collects the replies up to its end: NLMSG_DONE for a dump, the
    /// ACK or error otherwise. Returns them with the kernel's errno (0 = success).
    pub(crate) fn exchange(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<(Vec<RouteNetlinkMessage>, i32)> {
        self.seq = self.seq.wrapping_add(1);
        crate::netlink::exchange(&self.socket, self.seq, msg, flags).map_err(|(step, cause)| {
            netlink_error(match step {
                Step::Send => "send a routing request",
                Step::Receive => "receive a routing reply",
                Step::Decode => "decode a routing reply",
            })(cause)
        })
    }
}
