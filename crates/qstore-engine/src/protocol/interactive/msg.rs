//! Messages between a transaction's coordinator (at its home node) and its participants
//! (the nodes whose records it reaches).

use qstore_core::txn::{Access, CcAbortCause, Value};
use qstore_core::{Key, TableId, TxnId};
use serde::{Deserialize, Serialize};

/// A transaction's age, for protocols that favour old transactions: the first attempt's birth
/// time, then the attempt's id to break ties. Smaller is older.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Age {
    pub birth_us: u64,
    pub id: TxnId,
}

/// One attempt of a transaction as its participants see it: its age (for protocols that
/// favour old transactions) and its timestamp, fresh for every attempt (for protocols that
/// order transactions by timestamp; see [`crate::timestamp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub age: Age,
    pub ts: u64,
}

/// Every message: the transaction it is about, the sender's logical clock (a Lamport clock
/// that orders commit decisions, see `Node::tick`) and what it says.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IMsg {
    pub txn: TxnId,
    pub clock: u64,
    pub body: Body,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Body {
    // Coordinator to participant.
    /// Reserve the whole partition (protocols that take partitions before running).
    Reserve {
        at: Attempt,
    },
    /// Run these accesses, in order, with these outputs of earlier accesses. `fill`: reads
    /// whose row the coordinator caches (protocols that cache, see `cached`), each with the
    /// `wts` of the copy it holds, if any.
    Exec {
        at: Attempt,
        accesses: Vec<(u16, Access)>,
        inputs: Vec<(u16, Value)>,
        fill: Vec<(u16, Option<u64>)>,
    },
    /// Two-phase commit, phase one, for a commit at timestamp `ts` as far as the coordinator
    /// knows it (the largest floor its participants reported; 0 for protocols that do not
    /// compute commit timestamps during execution).
    /// `renew`: rows the transaction read from the coordinator's cache, whose leases must
    /// be renewed here (protocols that cache, see `cached`).
    Prepare {
        ts: u64,
        renew: Vec<Renewal>,
    },
    /// Make the transaction's changes here permanent, at commit timestamp `ts` (the
    /// attempt's own, or the one the coordinator chose from the votes' ranges). The
    /// message's clock is at least the decision's, which keeps later writers of these
    /// records later in the commit order.
    Commit {
        ts: u64,
    },
    /// Undo the transaction's changes here and release what it holds.
    Abort,

    // Participant to coordinator.
    Reserved,
    /// The outputs of an `Exec`'s accesses that ran, in order, and how the group ended;
    /// `floor`: the smallest commit timestamp the transaction's accesses here allow so far
    /// (Sundial: after the versions it read and the leases of the records it locked).
    /// `fills`: the rows of the reads the coordinator asked to cache.
    Executed {
        outputs: Vec<Value>,
        end: GroupEnd,
        wrote: bool,
        floor: u64,
        fills: Vec<Fill>,
    },
    Vote(Vote),
    /// The table leases a participant extended while renewing the transaction's cached
    /// reads (Sundial's read-only tables), for the coordinator's cache; sent before the vote.
    TabLeases(Vec<(TableId, TabLease)>),
    CommitAck,

    // Deadlock detection (protocols that wait on any conflict), about no transaction.
    /// The detector (at node 0) asks for this node's waits-for edges.
    WaitsForRequest {
        round: u64,
    },
    /// A node's waits-for edges: (waiting transaction, its age, the transaction it waits for).
    WaitsFor {
        round: u64,
        edges: Vec<(TxnId, Age, TxnId)>,
    },
    /// `txn` is a deadlock's victim: if it waits here, it aborts.
    Victim {
        txn: TxnId,
    },

    // Recovery.
    /// A participant that restarted with the transaction prepared asks its coordinator for
    /// the decision; the answer is `Commit` or `Abort`.
    Resolve,

    /// A message of the concurrency control to its peer, in its own encoding (LEAP's
    /// ownership transfers; see `Cc::on_peer`).
    Peer(Vec<u8>),
}

/// How a group of accesses ended at a participant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum GroupEnd {
    Done,
    /// An access's integrity check failed: the transaction aborts, and is not retried.
    LogicAbort(String),
    /// The concurrency control refused an access: the transaction aborts and is retried.
    CcAbort(CcAbortCause),
}

/// A participant's answer to `Prepare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Vote {
    Yes,
    /// Yes, at any commit timestamp in the range (protocols that choose the commit
    /// timestamp from the participants' ranges: MaaT).
    YesWithin(TsRange),
    /// It wrote nothing here: it released everything and needs no second phase.
    ReadOnly,
    No(CcAbortCause),
}

/// Commit timestamps `lower..upper` (`upper` excluded; `u64::MAX` stands for no bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TsRange {
    pub lower: u64,
    pub upper: u64,
}

impl TsRange {
    pub const ALL: TsRange = TsRange {
        lower: 0,
        upper: u64::MAX,
    };

    pub fn is_empty(&self) -> bool {
        self.lower >= self.upper
    }

    pub fn intersect(&self, other: &TsRange) -> TsRange {
        TsRange {
            lower: self.lower.max(other.lower),
            upper: self.upper.min(other.upper),
        }
    }
}

/// A row read at its home, as a coordinator that caches remote rows asked for it: its lease,
/// its version, and its bytes (left out when the coordinator's copy is of the same version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fill {
    /// The read's index in the program.
    pub idx: u16,
    pub wts: u64,
    pub rts: u64,
    /// The version read (its writer and sequence), for the history.
    pub writer: u64,
    pub seq: u16,
    #[serde(with = "serde_bytes")]
    pub bytes: Option<Vec<u8>>,
    /// The lease of the row's table when it was read, if the table has one.
    pub tab: Option<TabLease>,
}

/// The lease of a whole read-mostly table at one partition (Sundial's section 4.3): every
/// row version that was current when the table had seen `writes` writes is valid up to
/// `rts` (its own lease may reach further).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabLease {
    pub writes: u64,
    pub rts: u64,
}

/// A read served from the coordinator's cache, to be renewed at the row's home: the lease
/// of the version written at `wts` must reach the commit timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewal {
    pub table: TableId,
    pub key: Key,
    pub wts: u64,
}
