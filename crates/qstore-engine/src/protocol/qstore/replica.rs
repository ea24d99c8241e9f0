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

use super::msg::Eq;
use qstore_core::{NodeId, TxnId};
use serde::{Deserialize, Serialize};

/// A planner batch as the log holds it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LoggedBatch {
    pub batch: u64,
    pub rank: u32,
    /// Its execution queues, by node of the instance (node index = partition).
    pub eqs: Vec<Vec<Eq>>,
    /// Its transactions, in planning order: what the planning member needs to commit them.
    pub txns: Vec<TxnContext>,
    /// The nodes of the instance its queues involve (each acknowledges it).
    pub involved: Vec<NodeId>,
}

/// A transaction context: what commitment needs of a transaction besides its queues.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(super) struct TxnContext {
    pub id: TxnId,
    /// Accesses in its program: the length of its outputs.
    pub n_accesses: u16,
    pub may_abort: bool,
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
        if b.eqs.len() != nodes {
            return Err(format!(
                "queues for {} nodes (an instance has {nodes})",
                b.eqs.len()
            ));
        }
        if b.involved.iter().any(|n| n.index() >= nodes) {
            return Err("it involves a node outside the instance".into());
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_survives_the_log_and_bad_entries_are_refused() {
        let b = LoggedBatch {
            batch: 7,
            rank: 3,
            eqs: vec![vec![Eq::default()], Vec::new()],
            txns: vec![TxnContext {
                id: TxnId(5),
                n_accesses: 2,
                may_abort: true,
            }],
            involved: vec![NodeId(0)],
        };
        let back = LoggedBatch::decode(&b.encode(), 2).unwrap();
        assert_eq!((back.batch, back.rank, back.eqs.len()), (7, 3, 2));
        assert_eq!(back.txns[0].id, TxnId(5));
        assert!(LoggedBatch::decode(&b.encode(), 3).is_err());
        assert!(LoggedBatch::decode(&[1, 2, 3], 2).is_err());
    }
}
