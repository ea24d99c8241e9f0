//! Deadlock detection for protocols whose transactions wait on any conflict (`dl_detect`):
//! a periodic detector at node 0 gathers every node's waits-for edges, finds the cycles of
//! the union, and aborts the youngest transaction of each.
//!
//! A periodic global detector rather than edge-chasing probes: a round costs two messages per
//! node whatever the number of waiting transactions, a cycle that spans nodes is found in one
//! round, and the victim (the youngest of the cycle, so that the oldest transactions always
//! make progress) is chosen with the whole cycle in view. The edges of a round are gathered
//! at slightly different times on different nodes, so a round may see a cycle that was
//! already broken; its victim then aborts without need, which costs a retry, never
//! correctness. A victim that is no longer waiting when the verdict arrives is left alone.

use super::msg::{Age, Body};
use super::{Cc, Node};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use qstore_core::{NodeId, TxnId};
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A transaction waiting (with its age) for another to release a record.
pub(crate) type WaitEdge = (TxnId, Age, TxnId);

/// How long a round waits for the nodes' edges before deciding on what it has.
const ROUND_TIMEOUT: Duration = Duration::from_millis(100);

/// The control messages of detection are about no transaction.
pub(super) const CONTROL: TxnId = TxnId(0);

/// One node's answer to a round: (round, edges).
pub(super) type Answer = (u64, Vec<WaitEdge>);

/// Runs rounds from node 0 until the node stops.
pub(super) fn detector<C: Cc>(node: Arc<Node<C>>, answers: Receiver<Answer>) {
    let nodes = node.ctx.nodes();
    // How often it looks for cycles.
    let every = Duration::from_micros(node.ctx.cfg.protocol.dl_detect.interval_us);
    let mut round = 0;
    let mut found = false;
    while !node.stop.load(Ordering::Acquire) {
        // Right away while deadlocks keep being found: transactions wait on them.
        if !found {
            std::thread::sleep(every);
        }
        round += 1;
        for n in 0..nodes {
            node.send(NodeId(n), CONTROL, Body::WaitsForRequest { round });
        }
        let mut edges = Vec::new();
        let mut heard = 0;
        let deadline = Instant::now() + ROUND_TIMEOUT;
        while heard < nodes {
            match answers.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((r, e)) if r == round => {
                    heard += 1;
                    edges.extend(e);
                }
                Ok(_) => {} // a late answer to an earlier round
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let chosen = victims(&edges);
        found = !chosen.is_empty();
        for victim in chosen {
            for n in 0..nodes {
                node.send(NodeId(n), CONTROL, Body::Victim { txn: victim });
            }
        }
    }
}

/// Transactions whose abort breaks every cycle of the waits-for graph `edges`: the youngest
/// of each cycle, then the youngest of each cycle left without those, and so on.
pub(crate) fn victims(edges: &[WaitEdge]) -> Vec<TxnId> {
    let mut ages: FxHashMap<TxnId, Age> = FxHashMap::default();
    let mut out: FxHashMap<TxnId, Vec<TxnId>> = FxHashMap::default();
    for &(waiter, age, holder) in edges {
        ages.insert(waiter, age);
        out.entry(waiter).or_default().push(holder);
    }
    let mut chosen = Vec::new();
    loop {
        let round: Vec<TxnId> = strongly_connected(&out)
            .into_iter()
            .filter(|c| c.len() > 1 || out[&c[0]].contains(&c[0]))
            .filter_map(|c| c.into_iter().max_by_key(|t| ages.get(t).copied()))
            .collect();
        if round.is_empty() {
            return chosen;
        }
        for v in &round {
            // An aborted transaction waits for nothing and holds nothing.
            out.remove(v);
            for holders in out.values_mut() {
                holders.retain(|h| h != v);
            }
        }
        chosen.extend(round);
    }
}

/// The strongly connected components of the graph (Tarjan's algorithm, iterative), over the
/// vertices that have outgoing edges; vertices that only receive edges wait for nothing and
/// can be in no cycle.
fn strongly_connected(out: &FxHashMap<TxnId, Vec<TxnId>>) -> Vec<Vec<TxnId>> {
    #[derive(Clone, Copy)]
    struct Mark {
        index: usize,
        low: usize,
        on_stack: bool,
    }
    let mut marks: FxHashMap<TxnId, Mark> = FxHashMap::default();
    let mut stack: Vec<TxnId> = Vec::new();
    let mut components = Vec::new();
    let mut next = 0;
    let mut roots: Vec<TxnId> = out.keys().copied().collect();
    roots.sort_unstable();
    for root in roots {
        if marks.contains_key(&root) {
            continue;
        }
        // (vertex, position in its edge list)
        let mut calls: Vec<(TxnId, usize)> = vec![(root, 0)];
        marks.insert(
            root,
            Mark {
                index: next,
                low: next,
                on_stack: true,
            },
        );
        stack.push(root);
        next += 1;
        while let Some(&mut (v, ref mut i)) = calls.last_mut() {
            let succ = out.get(&v).map_or(&[][..], |s| s.as_slice());
            if let Some(&w) = succ.get(*i) {
                *i += 1;
                if !out.contains_key(&w) {
                    continue;
                }
                match marks.get(&w).copied() {
                    None => {
                        marks.insert(
                            w,
                            Mark {
                                index: next,
                                low: next,
                                on_stack: true,
                            },
                        );
                        stack.push(w);
                        next += 1;
                        calls.push((w, 0));
                    }
                    Some(m) if m.on_stack => {
                        let mv = marks.get_mut(&v).expect("visited");
                        mv.low = mv.low.min(m.index);
                    }
                    Some(_) => {}
                }
                continue;
            }
            calls.pop();
            let mv = marks[&v];
            if let Some(&(parent, _)) = calls.last() {
                let mp = marks.get_mut(&parent).expect("visited");
                mp.low = mp.low.min(mv.low);
            }
            if mv.low == mv.index {
                let mut component = Vec::new();
                loop {
                    let w = stack.pop().expect("v is on the stack");
                    marks.get_mut(&w).expect("visited").on_stack = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

impl<C: Cc> Node<C> {
    /// A round of detection asks for this node's edges.
    pub(super) fn on_waits_for_request(&self, from: NodeId, round: u64) {
        let mut edges = Vec::new();
        self.cc.waits_for(&mut edges);
        self.send(from, CONTROL, Body::WaitsFor { round, edges });
    }

    /// The detector (at node 0) hears a node's edges.
    pub(super) fn on_waits_for(&self, round: u64, edges: Vec<WaitEdge>) {
        if let Some(tx) = &self.detector {
            let _ = tx.send((round, edges));
        }
    }

    /// `txn` is the victim of a deadlock: if it waits here, it wakes to abort.
    pub(super) fn on_victim(&self, txn: TxnId) {
        let mut woken = Vec::new();
        if self.cc.abort_waiter(txn, &mut woken) {
            woken.push(txn);
        }
        self.wake_all(woken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(w: u64, h: u64) -> WaitEdge {
        let age = Age {
            birth_us: w,
            id: TxnId(w),
        };
        (TxnId(w), age, TxnId(h))
    }

    #[test]
    fn the_youngest_of_each_cycle_is_the_victim() {
        // 1 -> 2 -> 3 -> 1 is a cycle (3 is youngest); 4 -> 5 -> 4 another; 6 -> 1 waits on
        // the first cycle without being in it; 7 -> 8 is no cycle.
        let edges = [
            edge(1, 2),
            edge(2, 3),
            edge(3, 1),
            edge(4, 5),
            edge(5, 4),
            edge(6, 1),
            edge(7, 8),
        ];
        let mut v = victims(&edges);
        v.sort_unstable();
        assert_eq!(v, vec![TxnId(3), TxnId(5)]);
        // Two cycles sharing 1: aborting 3 (the youngest) leaves 1 -> 2 -> 1.
        let mut v = victims(&[edge(1, 2), edge(2, 3), edge(3, 1), edge(2, 1)]);
        v.sort_unstable();
        assert_eq!(v, vec![TxnId(2), TxnId(3)]);
        assert!(victims(&[edge(1, 2), edge(2, 3)]).is_empty());
        assert_eq!(victims(&[edge(9, 9)]), vec![TxnId(9)]);
    }
}
