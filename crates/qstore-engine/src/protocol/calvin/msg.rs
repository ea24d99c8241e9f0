//! What Calvin nodes say to each other.

use crate::replication::rebuild::{CopyFor, RebuildMsg};
use qstore_core::txn::{ProcCall, Value};
use qstore_core::TxnId;
use serde::{Deserialize, Serialize};

/// Where a transaction sits in the global order: epoch, then the sequencer that sequenced it
/// (its home node), then its place in that sequencer's batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Pos {
    pub epoch: u64,
    pub node: u32,
    pub idx: u32,
}

impl Pos {
    /// The position as one sortable number (for histories and the serial oracle).
    pub fn order(self) -> u128 {
        (self.epoch as u128) << 64 | (self.node as u128) << 32 | self.idx as u128
    }
}

/// One transaction of a sequencer's epoch batch. Receivers rebuild its program from the call
/// (procedures are deterministic), so batches stay small.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BatchTxn {
    pub idx: u32,
    pub id: TxnId,
    pub call: ProcCall,
}

/// The copies of a participant's records a transaction accesses, for one executing
/// participant: for each record of the sender, in the order of the read/write-set analysis,
/// whether it exists and its row (zeros when absent), rows back to back.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reads {
    pub pos: Pos,
    pub present: Vec<bool>,
    pub rows: Vec<u8>,
}

/// How a transaction ended at one executing participant. Every executing participant reaches
/// the same verdict; the lowest one carries the program's outputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Verdict {
    Commit(Option<Vec<Value>>),
    LogicAbort(String),
}

/// An executing participant's report to the transaction's home.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ack {
    pub epoch: u64,
    pub idx: u32,
    pub verdict: Verdict,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum CMsg {
    /// The sender's epoch batch for the receiver: its transactions of `epoch` that touch the
    /// receiver, possibly none. Every sequencer sends one to every other node for every epoch
    /// (its own node's scheduler gets its batch directly), so a node knows when it holds the
    /// whole epoch. `checkpoint` (only from node 0): every node checkpoints after this epoch
    /// (see `protocol::checkpoint`); `copy` (only from node 0): every node copies its
    /// partition after it for a stale instance (see `replication::rebuild`).
    Batch {
        epoch: u64,
        txns: Vec<BatchTxn>,
        checkpoint: bool,
        copy: Option<CopyFor>,
    },
    /// What an executor produced for the receiver since its last message: read copies for
    /// transactions the receiver executes, acknowledgements of transactions it is home to.
    Exec { reads: Vec<Reads>, acks: Vec<Ack> },
    /// Replication: a message of the receiver's replica group (see [`super::replica`]).
    Raft(crate::replication::ReplMsg),
    /// Replication: the sender's cluster instance (the receiver's) is out of service.
    Stale,
    /// Replication: rebuilding a stale instance from another's copies.
    Rebuild(RebuildMsg),
    /// Durability: the checkpoints the sender holds, by epoch; with `asking`, at its start,
    /// for the receiver's.
    Checkpoints { have: Vec<u64>, asking: bool },
}

impl crate::protocol::checkpoint::CheckpointMsg for CMsg {
    fn checkpoints(have: Vec<u64>, asking: bool) -> Self {
        CMsg::Checkpoints { have, asking }
    }
}

impl CMsg {
    /// Whether it is a message of transaction processing inside an instance (epoch batches,
    /// reads, acknowledgements), which a rebuilt node takes only from the new run.
    pub fn is_of_a_run(&self) -> bool {
        matches!(self, CMsg::Batch { .. } | CMsg::Exec { .. })
    }
}
