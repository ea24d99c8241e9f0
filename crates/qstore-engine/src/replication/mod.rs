//! Replication of partitions (QR-Store): every partition has a replica group, one copy per
//! cluster instance (see [`qstore_core::placement`]), and each group keeps a log with raft.
//! A protocol that replicates proposes what it must replicate to its group's log and is told
//! of every committed entry on every member ([`member::Applier`]); raft's messages travel in
//! the protocol's own messages over the protocol's transport.
//!
//! The log sits behind [`log::LogStore`], kept in memory for now; its entries may be
//! compressed ([`codec`]).

pub mod codec;
pub mod log;
pub mod member;

pub use log::{LogStore, MemLog};
pub use member::{Applier, GroupMember, Outbox};

use serde::{Deserialize, Serialize};

/// A raft message between members of a group, in raft's own (protobuf) encoding (postcard
/// writes a `Vec<u8>` as its length and its bytes).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplMsg(pub Vec<u8>);

/// Longest raft message a member accepts (a frame of the TCP transport holds it).
pub const MAX_RAFT_MESSAGE: usize = qstore_net::frame::DEFAULT_MAX_FRAME / 2;
