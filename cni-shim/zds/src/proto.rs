//! ZDS's messages (ztunnel's `zds.proto`, version 1): one protobuf message per datagram, no
//! length prefix. Field numbers are the protocol; the names follow ztunnel's.

use prost::{Message, Oneof};

/// The protocol version ztunnel announces (`Version` enum: 0 unused, 1 = V1).
pub const VERSION_V1: i32 = 1;

/// ztunnel's first datagram on a new connection.
#[derive(Clone, PartialEq, Message)]
pub struct ZdsHello {
    /// The protocol version it speaks ([`VERSION_V1`]).
    #[prost(int32, tag = "1")]
    pub version: i32,
}

/// Who a workload is, for ztunnel's identity and logs.
#[derive(Clone, PartialEq, Message)]
pub struct WorkloadInfo {
    /// The pod's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The pod's Kubernetes namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// The pod's service account, which its identity derives from.
    #[prost(string, tag = "3")]
    pub service_account: String,
}

/// A pod to serve; the datagram carries its network namespace as one `SCM_RIGHTS` descriptor.
#[derive(Clone, PartialEq, Message)]
pub struct AddWorkload {
    /// The pod's UID, which later requests name it by.
    #[prost(string, tag = "1")]
    pub uid: String,
    /// Who the pod is.
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
}

/// A pod ztunnel already serves and should keep (the agent no longer holds its namespace).
#[derive(Clone, PartialEq, Message)]
pub struct KeepWorkload {
    /// The pod's UID.
    #[prost(string, tag = "1")]
    pub uid: String,
}

/// A pod to stop serving. Tag 2, as in ztunnel's proto.
#[derive(Clone, PartialEq, Message)]
pub struct DelWorkload {
    /// The pod's UID.
    #[prost(string, tag = "2")]
    pub uid: String,
}

/// The end of the snapshot sent on each new connection.
#[derive(Clone, PartialEq, Message)]
pub struct SnapshotSent {}

/// The one thing a [`WorkloadRequest`] asks (a protobuf `oneof`).
#[derive(Clone, PartialEq, Oneof)]
pub enum Payload {
    /// Serve a pod, its namespace attached.
    #[prost(message, tag = "1")]
    Add(AddWorkload),
    /// Keep serving a pod whose namespace the agent does not hold.
    #[prost(message, tag = "5")]
    Keep(KeepWorkload),
    /// Stop serving a pod.
    #[prost(message, tag = "2")]
    Del(DelWorkload),
    /// The snapshot is complete.
    #[prost(message, tag = "3")]
    SnapshotSent(SnapshotSent),
}

/// What the agent sends.
#[derive(Clone, PartialEq, Message)]
pub struct WorkloadRequest {
    /// What it asks; `None` only in a malformed request.
    #[prost(oneof = "Payload", tags = "1, 5, 2, 3")]
    pub payload: Option<Payload>,
}

/// ztunnel's answer to a request: an empty `error` acknowledges it.
#[derive(Clone, PartialEq, Message)]
pub struct Ack {
    /// Why ztunnel refused the request; empty when it accepted it.
    #[prost(string, tag = "1")]
    pub error: String,
}

/// What a [`WorkloadResponse`] holds (a protobuf `oneof` of one case).
#[derive(Clone, PartialEq, Oneof)]
pub enum ResponsePayload {
    /// ztunnel's ack or nack.
    #[prost(message, tag = "1")]
    Ack(Ack),
}

/// What ztunnel sends back, one per request, in order.
#[derive(Clone, PartialEq, Message)]
pub struct WorkloadResponse {
    /// The answer; `None` only in a malformed response.
    #[prost(oneof = "ResponsePayload", tags = "1")]
    pub payload: Option<ResponsePayload>,
}

impl WorkloadRequest {
    /// Asks ztunnel to serve the pod `uid`; its namespace rides with the datagram, not in the
    /// message.
    pub fn add(uid: &str, info: WorkloadInfo) -> Self {
        Self::of(Payload::Add(AddWorkload {
            uid: uid.to_owned(),
            workload_info: Some(info),
        }))
    }

    /// Asks ztunnel to keep serving the pod `uid`, whose namespace the agent does not hold.
    pub fn keep(uid: &str) -> Self {
        Self::of(Payload::Keep(KeepWorkload {
            uid: uid.to_owned(),
        }))
    }

    /// Asks ztunnel to stop serving the pod `uid`.
    pub fn del(uid: &str) -> Self {
        Self::of(Payload::Del(DelWorkload {
            uid: uid.to_owned(),
        }))
    }

    /// Marks the end of the snapshot sent on a new connection.
    pub fn snapshot_sent() -> Self {
        Self::of(Payload::SnapshotSent(SnapshotSent {}))
    }

    fn of(p: Payload) -> Self {
        WorkloadRequest { payload: Some(p) }
    }

    /// The request's kind and pod, for logs and errors.
    pub fn describe(&self) -> String {
        match &self.payload {
            Some(Payload::Add(a)) => format!("add {}", a.uid),
            Some(Payload::Keep(k)) => format!("keep {}", k.uid),
            Some(Payload::Del(d)) => format!("del {}", d.uid),
            Some(Payload::SnapshotSent(_)) => "snapshot-sent".into(),
            None => "an empty request".into(),
        }
    }
}

impl WorkloadResponse {
    /// An ack: an [`Ack`] with an empty error.
    pub fn ack() -> Self {
        Self::nack("")
    }

    /// A nack: ztunnel refused the request, saying `error`.
    pub fn nack(error: &str) -> Self {
        WorkloadResponse {
            payload: Some(ResponsePayload::Ack(Ack {
                error: error.to_owned(),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes worked out by hand from the wire format (field number << 3 | wire type).
    #[test]
    fn messages_encode_with_ztunnels_field_numbers() {
        assert_eq!(ZdsHello { version: 1 }.encode_to_vec(), [0x08, 0x01]);
        let add = WorkloadRequest::add(
            "u1",
            WorkloadInfo {
                name: "p".into(),
                namespace: "n".into(),
                service_account: "s".into(),
            },
        );
        // 1: AddWorkload { 1: "u1", 2: WorkloadInfo { 1: "p", 2: "n", 3: "s" } }
        assert_eq!(
            add.encode_to_vec(),
            [
                0x0a, 0x0f, 0x0a, 0x02, b'u', b'1', 0x12, 0x09, 0x0a, 0x01, b'p', 0x12, 0x01, b'n',
                0x1a, 0x01, b's'
            ]
        );
        assert_eq!(
            WorkloadRequest::keep("u").encode_to_vec(),
            [0x2a, 0x03, 0x0a, 0x01, b'u']
        );
        // DelWorkload's uid is field 2.
        assert_eq!(
            WorkloadRequest::del("u").encode_to_vec(),
            [0x12, 0x03, 0x12, 0x01, b'u']
        );
        assert_eq!(
            WorkloadRequest::snapshot_sent().encode_to_vec(),
            [0x1a, 0x00]
        );
        assert_eq!(WorkloadResponse::ack().encode_to_vec(), [0x0a, 0x00]);
        assert_eq!(
            WorkloadResponse::nack("no").encode_to_vec(),
            [0x0a, 0x04, 0x0a, 0x02, b'n', b'o']
        );
    }

    #[test]
    fn responses_decode() {
        let r = WorkloadResponse::decode(&[0x0a, 0x04, 0x0a, 0x02, b'n', b'o'][..]).unwrap();
        assert_eq!(r, WorkloadResponse::nack("no"));
        assert!(WorkloadResponse::decode(&[0xff][..]).is_err());
    }
}
