//! Netlink attributes written straight into a message's bytes, nests closed by patching their
//! length (as libmnl's `mnl_attr_nest_start`/`_end` do). The rules' expressions go through it:
//! the crate's typed attributes allocate a vector per attribute and per nest, and encoding a
//! default table's 20 messages that way was 43% of a whole redirect-init run's instructions.
//! The bytes are the same (`nft/expr` tests them against the typed path; the oracle test
//! against libnftnl).

use netlink_packet_core::NLA_F_NESTED;

/// An attribute header: 2 bytes length, 2 bytes type.
const HEADER: usize = 4;

/// Appends attributes to a buffer.
pub(super) struct NlaWriter<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> NlaWriter<'a> {
    pub(super) fn new(buf: &'a mut Vec<u8>) -> Self {
        NlaWriter { buf }
    }

    fn header(&mut self, len: usize, kind: u16) {
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
    }

    fn pad(&mut self) {
        let padded = (self.buf.len() + 3) & !3;
        self.buf.resize(padded, 0);
    }

    /// A u32 in network byte order, as nf_tables reads every number of ours.
    pub(super) fn u32(&mut self, kind: u16, v: u32) {
        self.header(HEADER + 4, kind);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(super) fn bytes(&mut self, kind: u16, v: &[u8]) {
        self.header(HEADER + v.len(), kind);
        self.buf.extend_from_slice(v);
        self.pad();
    }

    /// A NUL-terminated string.
    pub(super) fn str(&mut self, kind: u16, s: &str) {
        self.header(HEADER + s.len() + 1, kind);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    /// A nested attribute (`NLA_F_NESTED` set) holding what `f` writes.
    pub(super) fn nest(&mut self, kind: u16, f: impl FnOnce(&mut NlaWriter)) {
        let start = self.buf.len();
        self.header(0, kind | NLA_F_NESTED);
        f(self);
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }
}
