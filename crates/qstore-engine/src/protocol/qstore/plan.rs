//! Planning: turning a transaction's program into fragments placed in execution queues.
//!
//! Every access goes to the execution queue of its record's sub-partition on its record's
//! node, so conflicting accesses always meet in the same queue, in planning order. A key's
//! sub-partition is a hash of (table, key) modulo the queues per node: O(1) routing.

use super::msg::{Eq, FateInfo, Frag, Route};
use qstore_core::partition::PartitionMap;
use qstore_core::txn::Program;
use qstore_core::{NodeId, TableId, TxnId};
use rustc_hash::FxHashMap;

/// The sub-partition (execution queue index) of a record.
#[inline]
pub fn sub_of(table: TableId, key: u64, subs: u32) -> u32 {
    let h = qstore_core::rng::splitmix64(key ^ ((table as u64) << 56));
    (h % subs as u64) as u32
}

/// How a node's execution queues are numbered.
#[derive(Clone, Copy)]
pub struct QueueShape {
    /// Queues (sub-partitions) for transactions that write.
    pub subs: u32,
    /// Where read-only queues start (read-committed isolation), if there are any.
    pub read_only_from: Option<u32>,
}

/// A planner's execution queues of one batch, per destination node.
pub struct BatchPlan {
    /// Per node, per sub-partition: the fragments (only non-empty queues are sent).
    pub queues: Vec<FxHashMap<u32, Vec<Frag>>>,
}

impl BatchPlan {
    pub fn new(nodes: usize) -> Self {
        BatchPlan {
            queues: (0..nodes).map(|_| FxHashMap::default()).collect(),
        }
    }

    /// The execution queues for `node`, in sub-partition order.
    pub fn take_eqs(&mut self, node: NodeId) -> Vec<Eq> {
        let mut eqs: Vec<Eq> = self.queues[node.index()]
            .drain()
            .map(|(sub, frags)| Eq { sub, frags })
            .collect();
        eqs.sort_unstable_by_key(|e| e.sub);
        eqs
    }

    /// Places the program of transaction `seq` of the batch, planned at node `home`. A
    /// read-only transaction goes to the read-only queues when `shape` has them. Returns the
    /// nodes it touches.
    pub fn place(
        &mut self,
        seq: u32,
        id: TxnId,
        home: NodeId,
        program: Program,
        pmap: &PartitionMap,
        shape: QueueShape,
    ) -> Vec<NodeId> {
        let QueueShape {
            subs,
            read_only_from,
        } = shape;
        let n = program.accesses.len();
        let read_only = program.accesses.iter().all(|a| !a.kind.is_write());
        let offset = read_only_from.filter(|_| read_only).unwrap_or(0);
        let abortables = program.accesses.iter().filter(|a| a.may_abort).count() as u16;
        // Where each access runs: (node, sub-partition).
        let homes: Vec<(NodeId, u32)> = program
            .accesses
            .iter()
            .map(|a| {
                let node = NodeId(pmap.partition_of(a.table, a.key).0);
                (node, offset + sub_of(a.table, a.key, subs))
            })
            .collect();
        let mut frags: Vec<((NodeId, u32), Frag)> = Vec::new();
        for (i, a) in program.accesses.into_iter().enumerate() {
            let at = homes[i];
            let f = match frags.iter().position(|(h, _)| *h == at) {
                Some(f) => f,
                None => {
                    let frag = Frag {
                        seq,
                        id,
                        accesses: Vec::new(),
                        needs: Vec::new(),
                        routes: Vec::new(),
                        n_accesses: n as u16,
                        fate: None,
                    };
                    frags.push((at, frag));
                    frags.len() - 1
                }
            };
            for &d in &a.deps {
                let from = homes[d as usize];
                if from == at {
                    continue; // same fragment: runs earlier, in program order
                }
                frags[f].1.needs.push(d);
                let producer = frags
                    .iter()
                    .position(|(h, _)| *h == from)
                    .expect("deps point back");
                route(&mut frags[producer].1, d, at.0, from.0);
            }
            frags[f].1.accesses.push((i as u16, a));
        }
        let mut nodes: Vec<NodeId> = Vec::new();
        for &((node, _), _) in &frags {
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        let fate = (abortables > 0).then(|| {
            let mut notify = nodes.clone();
            if !notify.contains(&home) {
                notify.push(home);
            }
            FateInfo { abortables, notify }
        });
        for ((node, sub), mut frag) in frags {
            frag.fate = fate.clone();
            self.queues[node.index()].entry(sub).or_default().push(frag);
        }
        nodes
    }
}

/// Makes the output of access `idx` (in `producer`, running on `from`) reach node `to`.
fn route(producer: &mut Frag, idx: u16, to: NodeId, from: NodeId) {
    let r = match producer.routes.iter().position(|r| r.idx == idx) {
        Some(r) => r,
        None => {
            producer.routes.push(Route {
                idx,
                local: false,
                nodes: Vec::new(),
            });
            producer.routes.len() - 1
        }
    };
    let r = &mut producer.routes[r];
    if to == from {
        r.local = true;
    } else if !r.nodes.contains(&to) {
        r.nodes.push(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::config::Partitioning;
    use qstore_core::txn::{Access, AccessKind, StepId, TableSchema, Value};

    fn access(key: u64, deps: Vec<u16>) -> Access {
        Access {
            table: 0,
            key,
            kind: AccessKind::ReadModifyWrite,
            step: StepId(0),
            arg: Value::Null,
            deps,
            may_abort: key == 150,
        }
    }

    fn pmap() -> PartitionMap {
        let t = TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: 100,
            keys_per_partition: 100,
        };
        PartitionMap::new(2, Partitioning::Range, &[t])
    }

    #[test]
    fn conflicting_accesses_share_a_queue_and_deps_are_routed() {
        let program = Program {
            accesses: vec![access(5, vec![]), access(150, vec![0]), access(5, vec![1])],
        };
        let mut plan = BatchPlan::new(2);
        let shape = QueueShape {
            subs: 4,
            read_only_from: Some(4),
        };
        let nodes = plan.place(0, TxnId(9), NodeId(0), program, &pmap(), shape);
        assert_eq!(nodes, vec![NodeId(0), NodeId(1)]);
        let eqs0 = plan.take_eqs(NodeId(0));
        let eqs1 = plan.take_eqs(NodeId(1));
        assert_eq!((eqs0.len(), eqs1.len()), (1, 1));
        let f0 = &eqs0[0].frags[0];
        let idx: Vec<u16> = f0.accesses.iter().map(|(i, _)| *i).collect();
        assert_eq!(idx, vec![0, 2], "both accesses of key 5, in program order");
        assert_eq!(f0.needs, vec![1]);
        let f1 = &eqs1[0].frags[0];
        assert_eq!(f1.needs, vec![0]);
        assert_eq!(f0.routes.len(), 1);
        assert_eq!(
            (f0.routes[0].idx, &f0.routes[0].nodes),
            (0, &vec![NodeId(1)])
        );
        assert_eq!(
            (f1.routes[0].idx, &f1.routes[0].nodes),
            (1, &vec![NodeId(0)])
        );
        let fate = f0.fate.as_ref().expect("the access to key 150 may abort");
        assert_eq!(
            (fate.abortables, fate.notify.clone()),
            (1, vec![NodeId(0), NodeId(1)])
        );
    }

    #[test]
    fn sub_partitions_spread_keys() {
        let mut counts = [0u32; 4];
        for k in 0..4000 {
            counts[sub_of(0, k, 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (900..1100).contains(&c)),
            "{counts:?}"
        );
    }
}
