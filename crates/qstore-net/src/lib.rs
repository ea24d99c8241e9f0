//! Messages between nodes: the [`Transport`] trait protocols talk to, the in-process
//! transport used by embedded clusters, the TCP transport used by distributed clusters (both
//! with injected delay), the frame codec, and message/byte accounting.
//!
//! Wire format: postcard (a stable, documented serde format), many messages per length-prefixed
//! frame ([`frame`]). The in-process transport does not serialize messages, but counts the
//! bytes they would take on the wire, so messages and bytes per transaction mean the same thing
//! embedded and over TCP.

pub mod auth;
mod counters;
pub mod frame;
mod inproc;
pub mod tcp;

pub use counters::{encoded_len, NetCounters, NodeCounters};
pub use frame::{FrameDecoder, FrameEncoder, FrameError};
pub use inproc::InProcNetwork;
pub use tcp::{Handshake, PeerEvent, PeerEventKind, TcpConfig, TcpTransport};

use qstore_core::NodeId;
use serde::Serialize;

/// A message with its sender, as delivered to a node's inbox.
#[derive(Debug)]
pub struct Envelope<M> {
    pub from: NodeId,
    pub msg: M,
}

/// What protocols use to reach other nodes. Sending never blocks on the receiver: node inboxes
/// are unbounded because blocking a worker on a peer's full inbox can deadlock two nodes that
/// send to each other; load is bounded instead at admission (clients keep a bounded number
/// of transactions in flight and admission queues are bounded).
pub trait Transport<M: Serialize + Send + 'static>: Send + Sync {
    /// Sends `msg` from node `from` to node `to` (which may be `from` itself).
    fn send(&self, from: NodeId, to: NodeId, msg: M);
    /// Message and byte counters of every node.
    fn counters(&self) -> &NetCounters;
    /// Whether messages from `from` reach `to` now, as far as the transport can tell (a TCP
    /// link that is down, a node the in-process transport cut off). A hung peer whose
    /// connection stays open looks reachable.
    fn reachable(&self, from: NodeId, to: NodeId) -> bool {
        let _ = (from, to);
        true
    }
}
