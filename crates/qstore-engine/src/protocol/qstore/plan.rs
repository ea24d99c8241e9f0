//! Planning: turning a transaction's program into fragments placed in execution queues.
//!
//! Every access goes to the execution queue of its record's sub-partition on its record's
//! node, so conflicting accesses always meet in the same queue, in planning order. A key's
//! sub-partition is a hash of (table, key) modulo the queues per node: O(1) routing.

use super::msg::{Eq, FateInfo, Frag, Route};
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{Access, Program};
use qstore_core::{NodeId, TableId, TxnId};

/// The sub-partition (execution queue index) of a record: a multiplicative (Fibonacci) hash
/// of (table, key), whose high bits are well mixed, mapped onto `0..subs` by
/// multiply-and-shift, which unlike `%` needs no division. Planning computes one per access,
/// so it is kept to two multiplications.
#[inline]
pub fn sub_of(table: TableId, key: u64, subs: u32) -> u32 {
    let h = (key ^ ((table as u64) << 56)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h as u128 * subs as u128) >> 64) as u32
}

/// How a node's execution queues are numbered.
#[derive(Clone, Copy)]
pub struct QueueShape {
    /// Queues (sub-partitions) for transactions that write.
    pub subs: u32,
    /// Where read-only queues start (read-committed isolation), if there are any.
    pub read_only_from: Option<u32>,
}

/// A planner's execution queues, per destination node, for the batch being planned. One
/// lives as long as its planner: queues and scratch space keep their capacity from batch to
/// batch, so planning a transaction allocates nothing in the common case.
pub struct BatchPlan {
    /// Every node's queues, node after node, each node's by queue index (sub-partition, then
    /// read-only queues): one flat index per destination.
    queues: Vec<Eq>,
    /// Per queue: the most fragments and operations it has held in a batch.
    most: Vec<(usize, usize)>,
    per_node: u32,
    /// Scratch for `place`: the fragments of the transaction being placed, as (destination,
    /// index in its queue's `frags`, index of its first access), and the fragment (index
    /// here) of each access placed so far.
    frags: Vec<(Dest, usize, u16)>,
    owners: Vec<u16>,
    nodes: Vec<NodeId>,
}

/// Where an access goes: a node, and the flat index of one of its queues in a [`BatchPlan`]
/// (which alone tells destinations apart).
#[derive(Clone, Copy)]
struct Dest {
    node: NodeId,
    slot: u32,
}

/// The destination of access `a` in a plan of `per_node` queues per node, whose queues for
/// it start at `first`. (A closure doing this, called from two places, stayed a call: a
/// third of planning's time.)
#[inline(always)]
fn destination(pmap: &PartitionMap, per_node: u32, first: u32, subs: u32, a: &Access) -> Dest {
    let node = NodeId(pmap.partition_of(a.table, a.key).0);
    let slot = node.0 * per_node + first + sub_of(a.table, a.key, subs);
    Dest { node, slot }
}

/// What [`BatchPlan::place`] tells the planner about a transaction.
pub struct Placed<'a> {
    /// The nodes it touches.
    pub nodes: &'a [NodeId],
    /// Whether some access may abort it.
    pub may_abort: bool,
}

impl BatchPlan {
    /// An empty plan for `nodes` nodes of `queues` execution queues each.
    pub fn new(nodes: usize, queues: u32) -> Self {
        BatchPlan {
            queues: (0..nodes)
                .flat_map(|_| {
                    (0..queues).map(|sub| Eq {
                        sub,
                        ..Eq::default()
                    })
                })
                .collect(),
            most: vec![(0, 0); nodes * queues as usize],
            per_node: queues,
            frags: Vec::new(),
            owners: Vec::new(),
            nodes: Vec::new(),
        }
    }

    /// Takes the execution queues for `node`, in sub-partition order (only non-empty ones).
    /// Each queue left behind is pre-sized for the largest batch its slot has held: sized
    /// only like the last one, a full batch after a small (early-closed) one grew its
    /// queues by doubling, copying their operations each time.
    pub fn take_eqs(&mut self, node: NodeId) -> Vec<Eq> {
        let per_node = self.per_node as usize;
        let first = node.index() * per_node;
        let mut eqs = Vec::new();
        let slots = first..first + per_node;
        for (queue, most) in self.queues[slots.clone()]
            .iter_mut()
            .zip(&mut self.most[slots])
        {
            if !queue.frags.is_empty() {
                most.0 = most.0.max(queue.frags.len());
                most.1 = most.1.max(queue.ops.len());
                let next = Eq {
                    sub: queue.sub,
                    frags: Vec::with_capacity(most.0),
                    ops: Vec::with_capacity(most.1),
                    extras: Vec::new(),
                };
                eqs.push(std::mem::replace(queue, next));
            }
        }
        eqs
    }

    /// Places the program of transaction `seq` of the batch, planned at node `home`. A
    /// read-only transaction none of whose accesses may abort goes to the read-only queues
    /// when `shape` has them (they cast no verdicts: one that may abort runs in the
    /// ordinary queues, where its verdicts are counted).
    pub fn place(
        &mut self,
        seq: u32,
        id: TxnId,
        home: NodeId,
        program: &Program,
        pmap: &PartitionMap,
        shape: QueueShape,
    ) -> Placed<'_> {
        let QueueShape {
            subs,
            read_only_from,
        } = shape;
        let accesses = &program.accesses;
        let n = accesses.len() as u16;
        let offset = match read_only_from {
            Some(from) if accesses.iter().all(|a| !a.kind.is_write() && !a.may_abort) => from,
            _ => 0,
        };
        let per_node = self.per_node;
        // One pass: each access goes to the fragment of its destination, made in that queue
        // when the destination first appears. A fragment's accesses are contiguous in its
        // queue's `ops` (no other transaction is placed meanwhile), so its length is known
        // when the next fragment of its queue starts, or at the end.
        //
        // A fragment runs once every outside value it needs has come, so the fragments of a
        // transaction must not wait for each other in a cycle. They do not if every outside
        // value a fragment needs comes from an access before the fragment's first one (a
        // fragment then only waits for fragments that start earlier). An access that would
        // break this (it needs the output of another fragment's access that comes after its
        // own fragment's start: a chain that leaves a queue and comes back) starts a new
        // fragment in its queue, which runs after the first there.
        let (frags, owners, queues) = (&mut self.frags, &mut self.owners, &mut self.queues);
        frags.clear();
        owners.clear();
        let mut abortables = 0u16;
        for (i, a) in accesses.iter().enumerate() {
            let dest = destination(pmap, per_node, offset, subs, a);
            let q = &mut queues[dest.slot as usize];
            let open = frags.iter().rposition(|(d, _, _)| d.slot == dest.slot);
            let comes_back = |f: usize| {
                let first = frags[f].2;
                a.deps
                    .iter()
                    .any(|&d| owners[d as usize] as usize != f && d >= first)
            };
            let f = match open {
                Some(f) if !comes_back(f) => f,
                _ => {
                    if let Some(f) = open {
                        let (_, at, _) = frags[f];
                        let frag = &mut q.frags[at];
                        frag.len = (q.ops.len() - frag.start as usize) as u16;
                    }
                    q.frags.push(Frag::empty(seq, id, q.ops.len() as u32, n));
                    frags.push((dest, q.frags.len() - 1, i as u16));
                    frags.len() - 1
                }
            };
            q.push_op(i as u16, a);
            owners.push(f as u16);
            abortables += a.may_abort as u16;
            if !a.deps.is_empty() {
                // Rare (dependent transactions).
                let producers: Vec<_> = a
                    .deps
                    .iter()
                    .map(|&d| (d, owners[d as usize] as usize))
                    .collect();
                link(queues, frags, f, &producers);
            }
        }
        self.nodes.clear();
        for &(dest, at, _) in frags.iter() {
            let q = &mut queues[dest.slot as usize];
            let frag = &mut q.frags[at];
            // The last fragment of each queue ends with the queue's operations.
            if frag.len == 0 {
                frag.len = (q.ops.len() - frag.start as usize) as u16;
            }
            if !self.nodes.contains(&dest.node) {
                self.nodes.push(dest.node);
            }
        }
        if abortables > 0 {
            let mut notify = self.nodes.clone();
            if !notify.contains(&home) {
                notify.push(home);
            }
            let fate = FateInfo { abortables, notify };
            for &(dest, at, _) in frags.iter() {
                queues[dest.slot as usize].frags[at].links_mut().fate = Some(fate.clone());
            }
        }
        Placed {
            nodes: &self.nodes,
            may_abort: abortables > 0,
        }
    }
}

/// Records that the access being placed, in fragment `f`, needs the outputs of earlier
/// accesses, given as (access index, fragment holding it): each one in another fragment
/// becomes a need of `f` and a route of its producer (one in the same fragment runs earlier,
/// in program order).
fn link(queues: &mut [Eq], frags: &[(Dest, usize, u16)], f: usize, producers: &[(u16, usize)]) {
    let (dest, at, _) = frags[f];
    for &(d, producer) in producers {
        if producer != f {
            queues[dest.slot as usize].frags[at]
                .links_mut()
                .needs
                .push(d);
            let (from, from_at, _) = frags[producer];
            let producer = &mut queues[from.slot as usize].frags[from_at];
            route(producer, d, dest.node, from.node);
        }
    }
}

/// Makes the output of access `idx` (in `producer`, running on `from`) reach node `to`.
fn route(producer: &mut Frag, idx: u16, to: NodeId, from: NodeId) {
    let routes = &mut producer.links_mut().routes;
    let r = match routes.iter().position(|r| r.idx == idx) {
        Some(r) => r,
        None => {
            routes.push(Route {
                idx,
                local: false,
                nodes: Vec::new(),
            });
            routes.len() - 1
        }
    };
    let r = &mut routes[r];
    if to == from {
        r.local = true;
    } else if !r.nodes.contains(&to) {
        r.nodes.push(to);
    }
}

#[cfg(test)]
mod tests {
    use super::super::msg::FragRef;
    use super::*;
    use qstore_core::config::Partitioning;
    use qstore_core::txn::{AccessKind, StepId, TableSchema, Value};

    fn access(key: u64, deps: Vec<u16>) -> Access {
        Access {
            table: 0,
            key,
            kind: AccessKind::ReadModifyWrite,
            step: StepId(0),
            arg: Value::Null,
            deps,
            may_abort: key == 150,
            key_dep: None,
        }
    }

    fn pmap() -> PartitionMap {
        let t = TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: 100,
            keys_per_partition: 100,
            read_mostly: false,
        };
        PartitionMap::new(2, Partitioning::Range, &[t])
    }

    #[test]
    fn conflicting_accesses_share_a_queue_and_deps_are_routed() {
        let program = Program {
            accesses: vec![access(5, vec![]), access(150, vec![0]), access(5, vec![1])],
        };
        let mut plan = BatchPlan::new(2, 8);
        let shape = QueueShape {
            subs: 4,
            read_only_from: Some(4),
        };
        let nodes = plan
            .place(0, TxnId(9), NodeId(0), &program, &pmap(), shape)
            .nodes
            .to_vec();
        assert_eq!(nodes, vec![NodeId(0), NodeId(1)]);
        let eqs0 = plan.take_eqs(NodeId(0));
        let eqs1 = plan.take_eqs(NodeId(1));
        assert_eq!((eqs0.len(), eqs1.len()), (1, 1));
        // Both accesses of key 5 are in its queue, in program order, but in two fragments:
        // one holding both would wait for access 1, which waits for access 0 (a cycle).
        assert_eq!(eqs0[0].frags.len(), 2);
        let (f0, f2) = (eqs0[0].frag(0).unwrap(), eqs0[0].frag(1).unwrap());
        let idx = |f: &FragRef<'_>| f.accesses.iter().map(|op| op.idx).collect::<Vec<_>>();
        assert_eq!((idx(&f0), idx(&f2)), (vec![0], vec![2]));
        assert!(f0.needs().is_empty());
        assert_eq!(f2.needs(), [1]);
        let f1 = &eqs1[0].frags[0];
        assert_eq!(f1.needs(), [0]);
        assert_eq!(f0.routes().len(), 1);
        assert_eq!(
            (f0.routes()[0].idx, &f0.routes()[0].nodes),
            (0, &vec![NodeId(1)])
        );
        assert_eq!(
            (f1.routes()[0].idx, &f1.routes()[0].nodes),
            (1, &vec![NodeId(0)])
        );
        let fate = f0.fate().expect("the access to key 150 may abort");
        assert_eq!(f2.fate().map(|f| f.abortables), Some(1));
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
