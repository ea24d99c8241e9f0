//! What Q-Store nodes say to each other.

use qstore_core::txn::{Access, Value};
use qstore_core::{NodeId, TxnId};
use serde::{Deserialize, Serialize};

/// Where a transaction sits in the global order: batch, then planner rank (node priority,
/// then planner priority), then its place in the planner's batch. Every node executes
/// conflicting accesses in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TxnPos {
    pub batch: u64,
    pub rank: u32,
    pub seq: u32,
}

impl TxnPos {
    /// The position as one sortable number (for histories and the serial oracle).
    pub fn order_key(self) -> u128 {
        (self.batch as u128) << 64 | (self.rank as u128) << 32 | self.seq as u128
    }
}

/// The accesses of one transaction that fall into one execution queue, in program order.
/// (The paper's fragments group accesses by record; grouping all of a transaction's accesses
/// of one queue keeps data dependencies inside a queue in program order, so a queue never
/// waits on itself.) The accesses themselves live in the queue's `ops`, fragment after
/// fragment: see [`Eq`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Frag {
    pub seq: u32,
    pub id: TxnId,
    /// Where its accesses start in the queue's `ops`, and how many there are.
    pub start: u32,
    pub len: u16,
    /// Outputs of accesses outside this fragment that its accesses need.
    pub needs: Vec<u16>,
    /// Where this fragment's outputs must go besides the home node: (access index, whether a
    /// fragment on this node needs it, other nodes that need it).
    pub routes: Vec<Route>,
    /// Accesses in the whole program (sizes the value table of dependent fragments).
    pub n_accesses: u16,
    /// Set when the transaction may abort: how its fate is decided.
    pub fate: Option<FateInfo>,
}

/// A fragment together with its accesses (index in the program, access).
#[derive(Clone, Copy)]
pub struct FragRef<'a> {
    pub head: &'a Frag,
    pub accesses: &'a [(u16, Access)],
}

impl std::ops::Deref for FragRef<'_> {
    type Target = Frag;
    fn deref(&self) -> &Frag {
        self.head
    }
}

/// How the fate of a transaction that may abort is decided: each of its `abortables`
/// accesses, where it runs, sends its verdict to every node in `notify` (the nodes it touches
/// and its home). Every node so reaches the same decision on its own.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FateInfo {
    pub abortables: u16,
    pub notify: Vec<NodeId>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Route {
    pub idx: u16,
    pub local: bool,
    pub nodes: Vec<NodeId>,
}

/// One execution queue: the fragments one planner placed into one sub-partition of one
/// node in one batch, in planning order. Their accesses are stored flat, in one vector per
/// queue rather than one per fragment: planning allocates per queue, not per transaction, and
/// an executor reads them front to back.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Eq {
    pub sub: u32,
    pub frags: Vec<Frag>,
    pub ops: Vec<(u16, Access)>,
}

impl Eq {
    /// Fragment `i` with its accesses.
    pub fn frag(&self, i: usize) -> Option<FragRef<'_>> {
        let head = self.frags.get(i)?;
        let start = head.start as usize;
        Some(FragRef {
            head,
            accesses: &self.ops[start..start + head.len as usize],
        })
    }

    /// Whether every fragment's accesses lie inside `ops` (a queue from the network is
    /// checked before it is installed).
    pub fn is_well_formed(&self) -> bool {
        self.frags
            .iter()
            .all(|f| f.start as usize + f.len as usize <= self.ops.len())
    }
}

/// An access output reported to the home node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Output {
    pub seq: u32,
    pub idx: u16,
    pub value: Value,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum QMsg {
    /// Planner `rank`'s execution queues for the receiving node in `batch`; an empty list
    /// tells the receiver that this planner has nothing for it in that batch.
    Plan { batch: u64, rank: u32, eqs: Vec<Eq> },
    /// Every fragment planner `rank` sent the sender in `batch` has run; here are their
    /// outputs.
    /// (Speculative mode with abortable transactions: `notes` report fates.)
    Ack {
        batch: u64,
        rank: u32,
        outputs: Vec<Output>,
        notes: Vec<FateNote>,
    },
    /// Speculative mode: the fates of planner `rank`'s transactions in `batch`, decided by
    /// their home: these aborted, every other one committed.
    Final {
        batch: u64,
        rank: u32,
        aborted: Vec<u32>,
    },
    /// A value an access produced, needed by a fragment at the receiver.
    Dep { pos: TxnPos, idx: u16, value: Value },
    /// The verdict of one access that may abort: `None` if it passed, else why it aborted.
    /// `abortables` is the number of verdicts the transaction's fate needs.
    Vote {
        pos: TxnPos,
        abortables: u16,
        abort: Option<String>,
    },
}

/// Speculative mode: what a node that ran some of a planner's batch reports about one of its
/// transactions, for the home to decide its fate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FateNote {
    pub seq: u32,
    /// It touched a write here that was rolled back.
    pub cascade: bool,
    /// One of its integrity checks here failed.
    pub abort: Option<String>,
    /// Earlier transactions of the same planner batch whose undecided writes it touched here.
    pub after: Vec<u32>,
}

impl FateNote {
    pub fn says_something(&self) -> bool {
        self.cascade || self.abort.is_some() || !self.after.is_empty()
    }
}
