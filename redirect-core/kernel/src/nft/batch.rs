//! A batch: begin, our messages, end, in one buffer for one `sendmsg`. The kernel commits what
//! lies between begin and end whole or not at all. Each message keeps its sequence number and
//! what it does, so an error names the exact message the kernel refused.

use netlink_packet_netfilter::nftables::NfTablesMessage;

use super::lower::NftTable;
use super::message;
use super::Features;

/// What one message of a batch does, for the error that names it. Rules are kept as indices
/// and formatted only when the kernel refuses one (formatting every rule up front cost more
/// than encoding it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Label {
    /// The batch's begin message (answered only on kernels that answer it).
    Begin,
    /// The batch's end message, the commit (answered only on kernels that answer it).
    End,
    /// `create table`: a new table, refused (EEXIST) if it exists.
    CreateTable,
    /// `add table`: the table, whether or not it exists (its flags left as they are).
    AddTable,
    /// `add table` with its flags written as 0: a dormant table becomes active.
    ActivateTable,
    /// `delete table` of the table by that name.
    DeleteTable(String),
    /// `add set` of the table's set at that index (its definition, no elements).
    AddSet(usize),
    /// `flush set`: every element of the set by that name goes.
    FlushSet(String),
    /// `delete set` of the set by that name.
    DeleteSet(String),
    /// One message of elements added to a set (a set's elements go in chunks).
    AddElements {
        /// The set's index in the table.
        set: usize,
        /// Which chunk of its elements, from 0.
        chunk: usize,
    },
    /// One message of elements removed from a set.
    DeleteElements {
        /// The set's index in the table.
        set: usize,
        /// Which chunk of its elements, from 0.
        chunk: usize,
    },
    /// `add chain` of the table's chain at that index.
    AddChain(usize),
    /// `flush chain`: every rule of the chain by that name goes.
    FlushChain(String),
    /// `delete chain` of the chain by that name.
    DeleteChain(String),
    /// `delete rule` by handle in a table of iptables-nft's (`nfproto` 2 `ip`, 10 `ip6`).
    XtDeleteRule {
        /// The table's family, as an `NFPROTO_*` number.
        nfproto: u8,
        /// The table (`nat`, `mangle`...).
        table: String,
        /// The rule's chain.
        chain: String,
        /// The rule's handle.
        handle: u64,
    },
    /// `flush chain` in a table of iptables-nft's.
    XtFlushChain {
        /// The table's family, as an `NFPROTO_*` number.
        nfproto: u8,
        /// The table.
        table: String,
        /// The chain.
        chain: String,
    },
    /// `delete chain` in a table of iptables-nft's.
    XtDeleteChain {
        /// The table's family, as an `NFPROTO_*` number.
        nfproto: u8,
        /// The table.
        table: String,
        /// The chain.
        chain: String,
    },
    /// `add rule`: one rule of one chain of the table.
    AddRule {
        /// The chain's index in the table.
        chain: usize,
        /// The rule's index in the chain.
        rule: usize,
    },
}

impl Label {
    /// The message in words; `t` is the table the batch was built from.
    pub fn describe(&self, t: &NftTable) -> String {
        match self {
            Label::Begin => "the batch's begin message".into(),
            Label::End => "the batch (its commit)".into(),
            Label::CreateTable => format!("create table inet {}", t.name),
            Label::AddTable => format!("add table inet {}", t.name),
            Label::ActivateTable => format!("add table inet {} {{ flags 0; }}", t.name),
            Label::DeleteTable(name) => format!("delete table inet {name}"),
            Label::AddSet(i) => format!("add set {}", t.sets[*i].name),
            Label::FlushSet(name) => format!("flush set {name}"),
            Label::DeleteSet(name) => format!("delete set {name}"),
            Label::AddElements { set, chunk } => format!(
                "add elements to set {} (chunk {})",
                t.sets[*set].name,
                chunk + 1
            ),
            Label::DeleteElements { set, chunk } => format!(
                "delete elements from set {} (chunk {})",
                t.sets[*set].name,
                chunk + 1
            ),
            Label::AddChain(i) => format!("add chain {}", t.chains[*i].name),
            Label::FlushChain(name) => format!("flush chain {name}"),
            Label::DeleteChain(name) => format!("delete chain {name}"),
            Label::XtDeleteRule {
                nfproto,
                table,
                chain,
                handle,
            } => format!(
                "delete rule {} {table} {chain} handle {handle}",
                family_word(*nfproto)
            ),
            Label::XtFlushChain {
                nfproto,
                table,
                chain,
            } => format!("flush chain {} {table} {chain}", family_word(*nfproto)),
            Label::XtDeleteChain {
                nfproto,
                table,
                chain,
            } => format!("delete chain {} {table} {chain}", family_word(*nfproto)),
            Label::AddRule { chain, rule } => {
                let c = &t.chains[*chain];
                format!(
                    "rule {} of chain {}: {}",
                    rule + 1,
                    c.name,
                    super::text::exprs(&c.rules[*rule])
                )
            }
        }
    }
}

/// `ip` or `ip6`, as nft names the family.
fn family_word(nfproto: u8) -> &'static str {
    if nfproto == 10 {
        "ip6"
    } else {
        "ip"
    }
}

/// A batch under construction.
pub struct Batch {
    bytes: Vec<u8>,
    next_seq: u32,
    /// (sequence number, label) of every message that asks for an answer.
    labels: Vec<(u32, Label)>,
    ack_ends: bool,
    begin_seq: u32,
}

/// A batch ready to send.
pub struct Encoded {
    bytes: Vec<u8>,
    labels: Vec<(u32, Label)>,
    begin_seq: u32,
}

impl Batch {
    /// A batch whose sequence numbers start at `first_seq`; with `genid`, the kernel refuses it
    /// (ERESTART) if the ruleset changed since that generation was read. `features` says
    /// whether the kernel answers begin and end.
    pub fn new(first_seq: u32, genid: Option<u32>, features: Features) -> Batch {
        let mut b = Batch {
            bytes: Vec::with_capacity(16 * 1024),
            next_seq: first_seq,
            labels: Vec::new(),
            ack_ends: features.acks_batch_ends,
            begin_seq: 0,
        };
        let (flags, seq) = b.end_flags(Label::Begin);
        b.begin_seq = seq;
        message::write_begin(&mut b.bytes, flags, seq, genid);
        b
    }

    /// Flags and sequence number of begin or end: answered only on kernels that answer them.
    fn end_flags(&mut self, label: Label) -> (u16, u32) {
        if self.ack_ends {
            let seq = self.take_seq(label);
            (netlink_packet_core::NLM_F_ACK, seq)
        } else {
            (0, 0)
        }
    }

    fn take_seq(&mut self, label: Label) -> u32 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        self.labels.push((seq, label));
        seq
    }

    /// Append one message (all our messages ask for an answer).
    pub fn push(&mut self, msg: NfTablesMessage, flags: u16, label: Label) {
        let seq = self.take_seq(label);
        message::write_nft(&mut self.bytes, msg, flags, seq);
    }

    /// Append one message for a table of another family (iptables-nft's `ip` and `ip6`).
    pub fn push_in(
        &mut self,
        family: netlink_packet_netfilter::NetfilterProtoFamily,
        msg: NfTablesMessage,
        flags: u16,
        label: Label,
    ) {
        let seq = self.take_seq(label);
        message::write(&mut self.bytes, family, 0, msg, flags, seq);
    }

    /// The batch without its end message, ready to send: the kernel answers every message,
    /// then aborts the transaction (`NFNL_ABORT_VALIDATE`), committing nothing.
    pub fn check_only(self) -> Encoded {
        Encoded {
            bytes: self.bytes,
            labels: self.labels,
            begin_seq: self.begin_seq,
        }
    }

    /// Append the end message: the batch, ready to send.
    pub fn finish(mut self) -> Encoded {
        let (flags, seq) = self.end_flags(Label::End);
        message::write_end(&mut self.bytes, flags, seq);
        Encoded {
            bytes: self.bytes,
            labels: self.labels,
            begin_seq: self.begin_seq,
        }
    }
}

impl Encoded {
    /// The bytes one `sendmsg` carries.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Number of messages between begin and end.
    pub fn messages(&self) -> usize {
        self.labels
            .iter()
            .filter(|(_, l)| !matches!(l, Label::Begin | Label::End))
            .count()
    }

    /// Sequence numbers that the kernel answers, with their labels.
    pub fn labels(&self) -> &[(u32, Label)] {
        &self.labels
    }

    /// The begin message's sequence number (0 where the kernel does not answer it). A refusal
    /// of the whole batch (a moved generation, a failed commit) comes back with it.
    pub fn begin_seq(&self) -> u32 {
        self.begin_seq
    }

    /// The label of the message with sequence number `seq`, to name what the kernel refused;
    /// `None` for a number the batch did not ask an answer for.
    pub fn label_of(&self, seq: u32) -> Option<&Label> {
        self.labels.iter().find(|(s, _)| *s == seq).map(|(_, l)| l)
    }
}
