//! The client protocol: what clients and servers of a distributed cluster say to each other.
//!
//! A client opens a TCP connection to a node's client address and talks in frames of
//! [`qstore_net::frame`] (each frame carries one or more postcard-encoded messages). It first
//! sends [`ClientRequest::Hello`]; the node answers [`ClientResponse::Welcome`] or
//! [`ClientResponse::Refused`] (and closes). Then it may send, pipelined, any number of
//! requests:
//! - `Submit { id, call, birth_us }`: run a stored-procedure call with this node as its home; the answer
//!   is `Answer { id, outcome }` (commit with the access outputs, logic abort, retryable
//!   concurrency-control abort, or rejection with the reason, e.g. an unknown procedure).
//!   Answers come in completion order, not submission order; `id` is the client's.
//! - `Stats`: the node's message counters, answered by `Stats`.
//! - `Collect`: after a run, the node's partition hash and (when the server records one) its
//!   part of the history, answered by `Collected`.
//!
//! A malformed frame closes the connection; a request that is well-formed but wrong gets an
//! `Error` or a `Rejected` answer and the connection stays.

use qstore_core::txn::{ProcCall, TxnOutcome};
use qstore_core::NodeId;
use serde::{Deserialize, Serialize};

/// Version of the client protocol; a client with another version is refused.
pub const CLIENT_FORMAT_VERSION: u32 = 2;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClientRequest {
    Hello {
        cluster_id: u64,
        format_version: u32,
    },
    Submit {
        id: u64,
        call: ProcCall,
        /// When the client first submitted this transaction (µs since the UNIX epoch); the
        /// same on every retry, so age-ordered protocols keep a retried transaction's age.
        birth_us: u64,
    },
    Stats,
    Collect,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClientResponse {
    Welcome {
        node: NodeId,
        nodes: u32,
        protocol: String,
        /// Of the node's catalog: a client built for another workload is told so.
        catalog: u64,
    },
    Refused(String),
    Answer {
        id: u64,
        outcome: TxnOutcome,
    },
    Stats(ServerStats),
    Collected(Collected),
    Error(String),
}

/// A node's counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    pub node: NodeId,
    /// Messages, bytes and frames this node sent to other nodes.
    pub msgs_sent: u64,
    pub bytes_sent: u64,
    pub frames_sent: u64,
}

/// What a node hands the client after a run for checking.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Collected {
    pub node: NodeId,
    pub partition_hash: u64,
    /// The node's part of the engine history (a postcard-encoded
    /// `qstore_engine::history::HistoryPart`), when the server records one.
    pub history: Option<Vec<u8>>,
}
