//! QR-Store: Q-Store replicated at the paper's second replication point, after planning.
//!
//! The leader of replica group `i` plans batches as an unreplicated node does and proposes
//! each planner batch — its execution queues for every node of the instance and its
//! transactions' contexts, serialised once — to group `i`'s log. Every other member of the
//! group, when the entry commits, delivers the same queues inside its own cluster instance,
//! which therefore executes exactly what the leader's instance executes, in the same global
//! order (batch, group, planner): every instance reaches the same state.
//!
//! Speculative replication (the default) lets the leader's instance execute a batch while it
//! is being replicated; its transactions are answered only once the batch has both run and
//! been committed in the log (the paper's verification before commitment, figure 3).
//! Synchronous replication delivers the leader's batch only when it is committed.
//! Point 1 logs the transactions instead and every member plans them; point 3 logs what a
//! batch wrote once it ran, and the other members put those writes in place (see `writes`).
//!
//! Fail-over. A transaction of batch `b` ran on the state every planner batch before it left;
//! so it is answered only once every group's entries up to `b` are committed (the
//! [`LogGate`]): then its instance ran exactly what the logs hold, and every instance would
//! answer the same. When a leader dies, its group elects another member, whose planners go
//! on after the last entry its log committed (raft lets a new leader propose only once it
//! has applied every entry of earlier terms). An instance that lost a node cannot go on (what
//! was sent to the node is lost): every node that finds a peer of its instance unreachable,
//! and a leader whose instance stalls, marks the instance *stale* (its speculative execution
//! may have run plans that were never committed); its leaders hand their groups to members
//! of other instances. Once every node of a stale instance is reachable again, the instance
//! is rebuilt from another instance's copies and serves again (see `rebuild`).
//! Clients whose transactions were lost on the way are answered `NotLeader` and resubmit
//! with the same key; the [`Dedup`](crate::replication::Dedup) table, which every member fills from its log, answers a
//! transaction that already ran with its original outcome rather than running it twice.

use super::msg::Eq;
use qstore_core::txn::TxnKey;
use qstore_core::{NodeId, TxnId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A planner batch as the log holds it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LoggedBatch {
    pub batch: u64,
    pub rank: u32,
    /// Its transactions, in planning order: what the planning member needs to commit them.
    pub txns: Vec<TxnContext>,
    pub plan: LoggedPlan,
}

/// What the log holds of a planner batch's plan, by replication point.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum LoggedPlan {
    /// Point 2, after planning: its execution queues, by node of the instance (node index =
    /// partition), and the nodes they involve (each acknowledges the batch).
    Queues {
        eqs: Vec<Vec<Eq>>,
        involved: Vec<NodeId>,
    },
    /// Point 1, before planning: only the transactions (with their calls); every member
    /// plans them itself, which gives the same queues everywhere (planning is deterministic).
    Inputs,
    /// Point 3, after execution: write-only queues, by node of the instance, holding the
    /// last committed write of each record the batch wrote (see `writes`), and the nodes
    /// they involve. The transactions' contexts carry their outcomes: no member runs them.
    Writes {
        eqs: Vec<Vec<Eq>>,
        involved: Vec<NodeId>,
    },
}

/// How a transaction ended, as the log holds it at replication point 3.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) enum LoggedFate {
    Committed(Vec<qstore_core::txn::Value>),
    Aborted(String),
    /// Aborted because it read what an aborted transaction wrote (speculative mode).
    Cascade,
}

/// A transaction context: what commitment needs of a transaction besides its queues.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct TxnContext {
    pub id: TxnId,
    /// The client's name for it (see [`Dedup`](crate::replication::Dedup)).
    pub key: TxnKey,
    /// Accesses in its program: the length of its outputs.
    pub n_accesses: u16,
    pub may_abort: bool,
    /// Its call: at replication point 1 (every member plans it), in a durable log, or when
    /// the run keeps histories (every instance records what it runs, so that any instance in service has
    /// the whole history after a fail-over).
    pub call: Option<std::sync::Arc<qstore_core::txn::ProcCall>>,
    /// Point 3: how it ended (its members only record it).
    pub fate: Option<LoggedFate>,
}

impl crate::replication::rebuild::HeldEntry for LoggedBatch {
    fn batch(&self) -> u64 {
        self.batch
    }

    fn rank(&self) -> u32 {
        self.rank
    }
}

impl LoggedBatch {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a batch serializes to memory")
    }

    /// Decodes an entry of the log, and checks that it fits a cluster instance of `nodes`
    /// nodes.
    pub fn decode(bytes: &[u8], nodes: usize) -> Result<LoggedBatch, String> {
        let b: LoggedBatch =
            postcard::from_bytes(bytes).map_err(|e| format!("undecodable batch: {e}"))?;
        match &b.plan {
            LoggedPlan::Queues { eqs, .. } | LoggedPlan::Writes { eqs, .. }
                if eqs.len() != nodes =>
            {
                Err(format!(
                    "queues for {} nodes (an instance has {nodes})",
                    eqs.len()
                ))
            }
            LoggedPlan::Queues { involved, .. } | LoggedPlan::Writes { involved, .. }
                if involved.iter().any(|n| n.index() >= nodes) =>
            {
                Err("it involves a node outside the instance".into())
            }
            LoggedPlan::Writes { .. } if b.txns.iter().any(|t| t.fate.is_none()) => {
                Err("a transaction of a batch of writes without its outcome".into())
            }
            LoggedPlan::Inputs if b.txns.iter().any(|t| t.call.is_none()) => {
                Err("a transaction to plan without its call".into())
            }
            _ => Ok(b),
        }
    }
}

/// Which planner batches the group logs have committed, as far as one node of an instance
/// has heard: each planner batch's deliverer in the instance tells every node (`Logged`).
pub(super) struct LogGate {
    /// Planner batches (ranks) per batch.
    ranks: u32,
    /// Every planner batch of batches below this one is committed.
    through: u64,
    /// Committed planner batches (by rank) of later batches.
    ahead: BTreeMap<u64, Vec<bool>>,
}

impl LogGate {
    pub fn new(ranks: u32) -> Self {
        LogGate {
            ranks,
            through: 0,
            ahead: BTreeMap::new(),
        }
    }

    /// Planner batch (`batch`, `rank`) is committed (told once or more).
    pub fn committed(&mut self, batch: u64, rank: u32) {
        if batch < self.through || rank >= self.ranks {
            return;
        }
        let ranks = self.ranks as usize;
        self.ahead
            .entry(batch)
            .or_insert_with(|| vec![false; ranks])[rank as usize] = true;
        while self
            .ahead
            .get(&self.through)
            .is_some_and(|r| r.iter().all(|&c| c))
        {
            self.ahead.remove(&self.through);
            self.through += 1;
        }
    }

    /// Recovery from a checkpoint: batches below `batch` are in it, committed long ago.
    pub fn skip_to(&mut self, batch: u64) {
        self.through = self.through.max(batch);
        self.ahead.retain(|&b, _| b >= batch);
    }

    /// Whether every planner batch up to and including `batch`'s is committed.
    pub fn allows(&self, batch: u64) -> bool {
        batch < self.through
    }

    /// Whether every planner batch before (`batch`, `rank`) in the global order is
    /// committed (replication point 3 proposes a batch's writes only then).
    pub fn follows_committed(&self, batch: u64, rank: u32) -> bool {
        if batch != self.through {
            return batch < self.through;
        }
        let done = self.ahead.get(&batch);
        (0..rank as usize).all(|r| done.is_some_and(|d| d[r]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_survives_the_log_and_bad_entries_are_refused() {
        let mut b = LoggedBatch {
            batch: 7,
            rank: 3,
            plan: LoggedPlan::Queues {
                eqs: vec![vec![Eq::default()], Vec::new()],
                involved: vec![NodeId(0)],
            },
            txns: vec![TxnContext {
                id: TxnId(5),
                key: TxnKey { session: 1, seq: 2 },
                n_accesses: 2,
                may_abort: true,
                call: Some(std::sync::Arc::new(qstore_core::txn::ProcCall {
                    proc: qstore_core::txn::ProcId(4),
                    args: vec![qstore_core::txn::Value::Int(9)],
                })),
                fate: None,
            }],
        };
        let back = LoggedBatch::decode(&b.encode(), 2).unwrap();
        assert_eq!((back.batch, back.rank), (7, 3));
        assert!(matches!(back.plan, LoggedPlan::Queues { ref eqs, .. } if eqs.len() == 2));
        assert_eq!(back.txns[0].id, TxnId(5));
        assert_eq!(back.txns[0].call, b.txns[0].call, "the call rides along");
        assert!(LoggedBatch::decode(&b.encode(), 3).is_err());
        assert!(LoggedBatch::decode(&[1, 2, 3], 2).is_err());
        // Point 1: transactions to plan, each with its call.
        b.plan = LoggedPlan::Inputs;
        assert!(LoggedBatch::decode(&b.encode(), 3).is_ok());
        b.txns[0].call = None;
        assert!(LoggedBatch::decode(&b.encode(), 2).is_err());
        // Point 3: writes to put in place, and how each transaction ended.
        b.plan = LoggedPlan::Writes {
            eqs: vec![Vec::new(), Vec::new()],
            involved: Vec::new(),
        };
        assert!(LoggedBatch::decode(&b.encode(), 2).is_err(), "no outcome");
        b.txns[0].fate = Some(LoggedFate::Aborted("overdraft".into()));
        assert!(LoggedBatch::decode(&b.encode(), 2).is_ok());
        assert!(LoggedBatch::decode(&b.encode(), 3).is_err());
    }

    #[test]
    fn the_gate_opens_a_batch_once_every_planner_batch_up_to_it_committed() {
        let mut g = LogGate::new(2);
        g.committed(1, 0);
        g.committed(0, 1);
        assert!(!g.allows(0));
        g.committed(0, 1);
        assert!(!g.allows(0), "batch 0 has one of its two, told twice");
        assert!(!g.follows_committed(0, 1) && g.follows_committed(0, 0));
        g.committed(0, 0);
        assert!(g.allows(0) && !g.allows(1));
        assert!(g.follows_committed(1, 0) && g.follows_committed(1, 1));
        assert!(!g.follows_committed(2, 0), "batch 1 has one of its two");
        g.committed(1, 1);
        assert!(g.allows(1) && !g.allows(2));
        assert!(g.follows_committed(2, 0) && !g.follows_committed(2, 1));
    }
}
