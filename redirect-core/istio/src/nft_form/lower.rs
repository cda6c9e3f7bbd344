//! Istio's rules as nf_tables objects, expression for expression what `nft` compiles from
//! Istio's text: its implicit dependencies (`meta nfproto` before an address of an `inet`
//! table, `meta l4proto` before a port unless the rule matched the protocol already),
//! interface names padded to 16 bytes, a prefix loaded in whole bytes (masked only within a
//! byte), and `{ 53, 15008 }` as an anonymous constant set (`__set<N>`, numbered per table as
//! `nft` numbers them).

use ipnet::IpNet;
use redirect_kernel::nft::{
    BaseSpec, CtKey, Expr, MetaKey, NftChain, NftSet, NftTable, Verdict as NftVerdict,
};
use redirect_model::{CtStates, GroupResolver, L4};

use super::{IstioNft, Item, Unsupported, Verdict};

const IFNAMSIZ: usize = 16;

struct Rule<'a> {
    exprs: Vec<Expr>,
    l4: Option<L4>,
    v6: Option<bool>,
    table: &'a mut NftTable,
    next_id: &'a mut u32,
}

/// [`IstioNft::lower`]: the tables as nf_tables objects.
pub(super) fn lower(
    form: &IstioNft,
    groups: &dyn GroupResolver,
) -> Result<Vec<NftTable>, Unsupported> {
    let mut next_id = 1;
    let mut out = Vec::new();
    for t in &form.tables {
        let mut table = NftTable::named(t.table.name());
        let mut chains = Vec::new();
        for c in &t.chains {
            let mut rules = Vec::new();
            for r in &c.rules {
                let mut rule = Rule {
                    exprs: Vec::new(),
                    l4: None,
                    v6: None,
                    table: &mut table,
                    next_id: &mut next_id,
                };
                for item in r {
                    rule.item(item, groups)?;
                }
                rules.push(rule.exprs);
            }
            chains.push(NftChain {
                name: c.name.to_string(),
                base: c.base.map(|b| BaseSpec {
                    hook: b.hook,
                    kind: b.kind,
                    priority: b.priority,
                }),
                rules,
            });
        }
        table.chains = chains;
        out.push(table);
    }
    Ok(out)
}

fn cmp(eq: bool, data: Vec<u8>) -> Expr {
    Expr::Cmp { eq, data }
}

impl Rule<'_> {
    fn item(&mut self, item: &Item, groups: &dyn GroupResolver) -> Result<(), Unsupported> {
        let e = &mut self.exprs;
        match item {
            Item::IfName { out, ne, name } => {
                let key = if *out {
                    MetaKey::OifName
                } else {
                    MetaKey::IifName
                };
                let mut data = name.as_bytes().to_vec();
                data.resize(data.len().max(IFNAMSIZ), 0);
                e.extend([Expr::Meta(key), cmp(!ne, data)]);
            }
            Item::L4Proto(l4) => {
                e.extend([Expr::Meta(MetaKey::L4Proto), cmp(true, vec![l4.number()])]);
                self.l4 = Some(*l4);
            }
            Item::Addr { src, ne, net } => self.addr(*src, *ne, net)?,
            Item::Host { src, ip } => self.addr(*src, false, &IpNet::from(*ip))?,
            Item::Port { l4, src, ne, port } => {
                self.transport(*l4, if *src { 0 } else { 2 });
                self.exprs.push(cmp(!ne, port.to_be_bytes().to_vec()));
            }
            Item::PortsNotIn(l4, ports) => {
                self.transport(*l4, 2);
                let name = format!("__set{}", self.table.sets.len());
                let id = *self.next_id;
                *self.next_id += 1;
                self.table.sets.push(NftSet::ports(name.clone(), id, ports));
                self.exprs.push(Expr::Lookup {
                    set: name,
                    invert: true,
                });
            }
            Item::Owner { gid, ne, id, .. } => {
                let key = if *gid { MetaKey::SkGid } else { MetaKey::SkUid };
                let n = owner_id(*gid, id, groups)?;
                e.extend([Expr::Meta(key), cmp(!ne, n.to_ne_bytes().to_vec())]);
            }
            Item::Mark { ne, value } => {
                e.extend([
                    Expr::Meta(MetaKey::Mark),
                    cmp(!ne, value.to_ne_bytes().to_vec()),
                ]);
            }
            Item::CtState(states) => {
                // ct state bits: INVALID 1, ESTABLISHED 2, RELATED 4.
                let mask: u32 = match states {
                    CtStates::Invalid => 1,
                    CtStates::RelatedEstablished => 2 | 4,
                };
                e.extend([
                    Expr::Ct(CtKey::State),
                    Expr::Mask(mask.to_ne_bytes().to_vec()),
                    cmp(false, 0u32.to_ne_bytes().to_vec()),
                ]);
            }
            Item::CtMark(v) => {
                e.extend([Expr::Ct(CtKey::Mark), cmp(true, v.to_ne_bytes().to_vec())])
            }
            Item::MarkBits {
                ct,
                mask,
                ne,
                value,
                ..
            } => e.extend([
                if *ct {
                    Expr::Ct(CtKey::Mark)
                } else {
                    Expr::Meta(MetaKey::Mark)
                },
                Expr::Mask(mask.to_ne_bytes().to_vec()),
                cmp(!ne, value.to_ne_bytes().to_vec()),
            ]),
            _ => self.statement(item),
        }
        Ok(())
    }

    /// What a rule does: counter, marks, zones, NAT, TPROXY, verdict.
    fn statement(&mut self, item: &Item) {
        let e = &mut self.exprs;
        match item {
            Item::Counter => e.push(Expr::Counter),
            Item::MarkSet(v) => e.extend([
                Expr::Imm(v.to_ne_bytes().to_vec()),
                Expr::MetaSet(MetaKey::Mark),
            ]),
            Item::CtMarkSetMark => e.extend([Expr::Meta(MetaKey::Mark), Expr::CtSet(CtKey::Mark)]),
            Item::MarkSetCtMark => e.extend([Expr::Ct(CtKey::Mark), Expr::MetaSet(MetaKey::Mark)]),
            Item::CtMarkSetBits { keep, set } => e.extend([
                Expr::Ct(CtKey::Mark),
                Expr::Bits {
                    mask: keep.to_ne_bytes().to_vec(),
                    xor: set.to_ne_bytes().to_vec(),
                },
                Expr::CtSet(CtKey::Mark),
            ]),
            Item::CtZone(z) => e.extend([
                Expr::Imm(z.to_ne_bytes().to_vec()),
                Expr::CtSet(CtKey::Zone),
            ]),
            Item::Redirect(p) => e.extend([Expr::Imm(p.to_be_bytes().to_vec()), Expr::Redir]),
            Item::Tproxy { v6, port } => e.extend([
                Expr::Imm(port.to_be_bytes().to_vec()),
                Expr::Tproxy {
                    nfproto: if *v6 { 10 } else { 2 },
                },
            ]),
            Item::Verdict(v) => e.push(Expr::Verdict(match v {
                Verdict::Return => NftVerdict::Return,
                Verdict::Accept => NftVerdict::Accept,
                Verdict::Drop => NftVerdict::Drop,
                Verdict::Jump(c) => NftVerdict::Jump((*c).to_string()),
            })),
            _ => unreachable!("a match is lowered by `item`"),
        }
    }

    /// `meta l4proto` unless the rule matched it already, then the port's two bytes.
    fn transport(&mut self, l4: L4, offset: u32) {
        if self.l4 != Some(l4) {
            self.exprs.push(Expr::Meta(MetaKey::L4Proto));
            self.exprs.push(cmp(true, vec![l4.number()]));
            self.l4 = Some(l4);
        }
        self.exprs.push(Expr::Payload {
            base: redirect_kernel::nft::Base::Transport,
            offset,
            len: 2,
        });
    }

    fn addr(&mut self, src: bool, ne: bool, net: &IpNet) -> Result<(), Unsupported> {
        let v6 = matches!(net, IpNet::V6(_));
        if self.v6 != Some(v6) {
            self.exprs.push(Expr::Meta(MetaKey::NfProto));
            self.exprs.push(cmp(true, vec![if v6 { 10 } else { 2 }]));
            self.v6 = Some(v6);
        }
        let prefix = u32::from(net.prefix_len());
        if prefix == 0 {
            return Err(Unsupported {
                what: format!("the network {net}"),
                fix: "name a network with a prefix length above 0".into(),
            });
        }
        let offset = match (v6, src) {
            (false, true) => 12,
            (false, false) => 16,
            (true, true) => 8,
            (true, false) => 24,
        };
        let len = prefix.div_ceil(8);
        let bytes = |a: std::net::IpAddr| match a {
            std::net::IpAddr::V4(a) => a.octets().to_vec(),
            std::net::IpAddr::V6(a) => a.octets().to_vec(),
        };
        self.exprs.push(Expr::Payload {
            base: redirect_kernel::nft::Base::Network,
            offset,
            len,
        });
        if prefix % 8 != 0 {
            let mut mask = bytes(net.netmask());
            mask.truncate(len as usize);
            self.exprs.push(Expr::Mask(mask));
        }
        let mut data = bytes(net.network());
        data.truncate(len as usize);
        self.exprs.push(cmp(!ne, data));
        Ok(())
    }
}

fn owner_id(gid: bool, id: &str, groups: &dyn GroupResolver) -> Result<u32, Unsupported> {
    if let Ok(n) = id.parse() {
        return Ok(n);
    }
    match gid.then(|| groups.gid_of(id)).flatten() {
        Some(n) => Ok(n),
        None => Err(Unsupported {
            what: format!("the group {id:?}"),
            fix: "name a group the host's group database holds, or its numeric GID".into(),
        }),
    }
}
