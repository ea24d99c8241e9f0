//! Speculative execution with cascading aborts: what a node tracks about the transactions
//! that ran on its records before their fate was known.
//!
//! In speculative mode a fragment never waits for an earlier transaction's fate: it reads
//! and overwrites records that undecided transactions wrote. Each node notes, per record,
//! the latest undecided writer, and per transaction the undecided transactions whose writes
//! it touched here (its speculation dependencies), its before-images and its own verdict.
//!
//! Fates are decided by the transaction's home node, never by the nodes separately, so all
//! nodes agree: a node acknowledges a planner's batch only once every dependency of the
//! batch's transactions here is decided, and tells the home which of them read a write that
//! was rolled back (cascade) or failed an integrity check (abort). The home answers the
//! clients and sends the fates (`Final`) to every node involved, which rolls back the aborted
//! transactions together with every transaction that touched their writes here, newest first.
//!
//! Only the shape of the bookkeeping is here; the node runs it under its lock and holds the
//! records being rolled back.

use super::msg::{FateNote, Outputs, TxnPos};
use crate::exec::UndoLog;
use qstore_core::TableId;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;

/// A record: (table, key).
pub type RecordKey = (TableId, u64);
/// A planner's batch: (batch, rank), its place in the global order.
pub type PlannerBatch = (u64, u32);

/// What a node knows of one transaction that wrote here, or touched an undecided write.
#[derive(Default)]
struct SpecTxn {
    /// Before-images of its writes here, one log per fragment (drained by a rollback).
    undo: Vec<UndoLog>,
    /// Records it wrote here, with the undecided writer each one had before.
    written: Vec<(RecordKey, Option<TxnPos>)>,
    /// Undecided transactions whose writes it touched here.
    deps: Vec<TxnPos>,
    /// Those of them in its own planner batch (by place in the batch).
    after: Vec<u32>,
    /// Transactions that touched its writes here.
    dependents: Vec<TxnPos>,
    /// Dependencies not decided yet.
    pending: u32,
    /// It touched a write that was rolled back: it must abort too.
    cascade: bool,
    /// Why one of its integrity checks here failed.
    own_abort: Option<String>,
}

/// What applying the fates of a planner's batch did.
pub struct Finalized {
    /// Planner batches whose parked acknowledgements may go now.
    pub released: Vec<(PlannerBatch, Outputs)>,
    /// Records rolled back, each with the oldest planner batch that had written it: every
    /// write of it since that planner batch began is undone (later writers touched it, so
    /// they were rolled back too).
    pub restored: Vec<(RecordKey, PlannerBatch)>,
}

/// The speculation state of a node.
#[derive(Default)]
pub struct Speculation {
    txns: FxHashMap<TxnPos, SpecTxn>,
    /// The latest undecided writer of each record.
    dirty: FxHashMap<RecordKey, TxnPos>,
    /// Undecided transactions tracked here, by planner batch.
    by_batch: BTreeMap<PlannerBatch, Vec<u32>>,
    /// Per planner batch: how many of its transactions wait for a dependency's fate.
    waiting: FxHashMap<PlannerBatch, u32>,
    /// Acknowledgements held back until those fates are known.
    parked: FxHashMap<PlannerBatch, Outputs>,
}

impl Speculation {
    /// Notes, before a fragment of `pos` runs, which undecided writes it is about to touch.
    pub fn touch(&mut self, pos: TxnPos, keys: impl Iterator<Item = RecordKey>) {
        for k in keys {
            let Some(&w) = self.dirty.get(&k) else {
                continue;
            };
            if w == pos || self.txns.get(&pos).is_some_and(|t| t.deps.contains(&w)) {
                continue;
            }
            let Some(writer) = self.txns.get_mut(&w) else {
                debug_assert!(false, "record {k:?} held by {w:?}, which is not tracked");
                continue;
            };
            writer.dependents.push(pos);
            let t = self.entry(pos);
            t.deps.push(w);
            if (w.batch, w.rank) == (pos.batch, pos.rank) {
                // Decided by the same home in the same step, earlier in planning order: the
                // home resolves it, waiting for it here would wait for ourselves.
                t.after.push(w.seq);
                continue;
            }
            t.pending += 1;
            if t.pending == 1 {
                *self.waiting.entry((pos.batch, pos.rank)).or_default() += 1;
            }
        }
    }

    /// Whether a transaction other than `pos` whose fate is not known here wrote `key` last.
    pub fn holds(&self, key: RecordKey, pos: TxnPos) -> bool {
        self.dirty.get(&key).is_some_and(|&w| w != pos)
    }

    /// Records what a fragment of `pos` did: its before-images, the records it wrote, and
    /// the failed integrity check if one did.
    pub fn ran(
        &mut self,
        pos: TxnPos,
        undo: UndoLog,
        writes: impl Iterator<Item = RecordKey>,
        own_abort: Option<String>,
    ) {
        let mut written = Vec::new();
        for k in writes {
            let prev = self.dirty.insert(k, pos);
            if prev != Some(pos) {
                written.push((k, prev));
            }
        }
        if written.is_empty() && own_abort.is_none() && !self.txns.contains_key(&pos) {
            return;
        }
        let t = self.entry(pos);
        if !undo.is_empty() {
            t.undo.push(undo);
        }
        t.written.extend(written);
        if t.own_abort.is_none() {
            t.own_abort = own_abort;
        }
    }

    fn entry(&mut self, pos: TxnPos) -> &mut SpecTxn {
        self.txns.entry(pos).or_insert_with(|| {
            self.by_batch
                .entry((pos.batch, pos.rank))
                .or_default()
                .push(pos.seq);
            SpecTxn::default()
        })
    }

    /// Acknowledges a planner's batch whose queues all ran here: returns the outputs back if
    /// the acknowledgement may go now, or keeps them until its dependencies are decided.
    pub fn ack_or_park(&mut self, pb: PlannerBatch, outputs: Outputs) -> Option<Outputs> {
        if self.waiting.get(&pb).copied().unwrap_or(0) == 0 {
            return Some(outputs);
        }
        self.parked.insert(pb, outputs);
        None
    }

    /// What to acknowledge a planner's batch with: for each of its transactions with
    /// something to report, whether it must abort and which earlier transactions of the same
    /// planner batch it depends on here.
    pub fn notes(&self, pb: PlannerBatch) -> Vec<FateNote> {
        let Some(seqs) = self.by_batch.get(&pb) else {
            return Vec::new();
        };
        seqs.iter()
            .filter_map(|&seq| {
                let t = &self.txns[&TxnPos {
                    batch: pb.0,
                    rank: pb.1,
                    seq,
                }];
                let note = FateNote {
                    seq,
                    cascade: t.cascade,
                    abort: t.own_abort.clone(),
                    after: t.after.clone(),
                };
                note.says_something().then_some(note)
            })
            .collect()
    }

    /// Applies the fates of a planner's batch: rolls back each aborted transaction with
    /// everything that touched its writes here (via `rollback`, newest first), releases the
    /// records of the committed ones, and tells their dependents.
    pub fn finalize(
        &mut self,
        pb: PlannerBatch,
        aborted: &[u32],
        mut rollback: impl FnMut(&mut UndoLog),
    ) -> Finalized {
        let pos = |seq| TxnPos {
            batch: pb.0,
            rank: pb.1,
            seq,
        };
        let mut restored = FxHashMap::default();
        for &seq in aborted {
            self.roll_back_closure(pos(seq), &mut rollback, &mut restored);
        }
        let mut released = Vec::new();
        for seq in self.by_batch.remove(&pb).unwrap_or_default() {
            let p = pos(seq);
            let t = self.txns.remove(&p).expect("tracked");
            let abort = aborted.contains(&seq);
            if !abort {
                for (k, _) in &t.written {
                    if self.dirty.get(k) == Some(&p) {
                        self.dirty.remove(k);
                    }
                }
            }
            // Dependents in the same planner batch did not wait (the home resolved them).
            for d in t.dependents.into_iter().filter(|d| (d.batch, d.rank) != pb) {
                self.dependency_decided(d, abort, &mut released);
            }
        }
        self.waiting.remove(&pb);
        Finalized {
            released,
            restored: restored.into_iter().collect(),
        }
    }

    fn dependency_decided(
        &mut self,
        d: TxnPos,
        aborted: bool,
        released: &mut Vec<(PlannerBatch, Outputs)>,
    ) {
        // A dependent decided first (its home saw the same fate) is gone already.
        let Some(t) = self.txns.get_mut(&d) else {
            return;
        };
        t.cascade |= aborted;
        t.pending -= 1;
        if t.pending > 0 {
            return;
        }
        let pb = (d.batch, d.rank);
        let w = self
            .waiting
            .get_mut(&pb)
            .expect("counted when it began waiting");
        *w -= 1;
        if *w == 0 {
            if let Some(outputs) = self.parked.remove(&pb) {
                released.push((pb, outputs));
            }
        }
    }

    /// Rolls back `root` and, transitively, every transaction that touched its writes here,
    /// newest first so each record returns to the value before the oldest of them.
    fn roll_back_closure(
        &mut self,
        root: TxnPos,
        rollback: &mut impl FnMut(&mut UndoLog),
        restored: &mut FxHashMap<RecordKey, PlannerBatch>,
    ) {
        let mut closure = FxHashSet::default();
        let mut stack = vec![root];
        while let Some(p) = stack.pop() {
            if let Some(t) = self.txns.get(&p) {
                if closure.insert(p) {
                    stack.extend_from_slice(&t.dependents);
                }
            }
        }
        let mut members: Vec<TxnPos> = closure.into_iter().collect();
        members.sort_unstable_by(|a, b| b.cmp(a));
        for p in members {
            let t = self.txns.get_mut(&p).expect("in closure");
            t.cascade |= p != root;
            for mut u in t.undo.drain(..).rev() {
                rollback(&mut u);
            }
            let written = std::mem::take(&mut t.written);
            for (k, prev) in written.into_iter().rev() {
                let at = (p.batch, p.rank);
                let oldest = restored.entry(k).or_insert(at);
                *oldest = (*oldest).min(at);
                if self.dirty.get(&k) != Some(&p) {
                    continue;
                }
                // The writer before it holds the record again, unless it was decided
                // (committed) meanwhile.
                match prev.filter(|w| self.txns.contains_key(w)) {
                    Some(w) => self.dirty.insert(k, w),
                    None => self.dirty.remove(&k),
                };
            }
        }
    }

    /// The oldest planner batch with a transaction still undecided here (its slot must stay).
    pub fn oldest_undecided(&self) -> Option<PlannerBatch> {
        self.by_batch.keys().next().copied()
    }

    /// Whether no transaction is undecided here.
    pub fn is_idle(&self) -> bool {
        self.txns.is_empty()
    }

    /// Undecided transactions and held records, for diagnostics.
    pub fn describe(&self) -> String {
        format!(
            "{} undecided speculative transactions, {} records with undecided writes, {} parked acknowledgements",
            self.txns.len(),
            self.dirty.len(),
            self.parked.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(batch: u64, rank: u32, seq: u32) -> TxnPos {
        TxnPos { batch, rank, seq }
    }

    fn none() -> UndoLog {
        UndoLog::default()
    }

    #[test]
    fn dependencies_inside_a_planner_batch_are_reported_not_waited_for() {
        let mut s = Speculation::default();
        s.ran(p(0, 0, 0), none(), [(0, 1)].into_iter(), None);
        s.touch(p(0, 0, 1), [(0, 1)].into_iter()); // reads 0's write
        s.ran(p(0, 0, 1), none(), [(0, 2)].into_iter(), None);
        s.touch(p(0, 0, 2), [(0, 2)].into_iter()); // reads 1's write
        s.ran(p(0, 0, 2), none(), std::iter::empty(), None);
        s.touch(p(0, 0, 3), [(0, 9)].into_iter()); // unrelated
        s.ran(p(0, 0, 3), none(), [(0, 9)].into_iter(), None);
        assert!(s.ack_or_park((0, 0), Vec::new()).is_some());
        let after: Vec<(u32, Vec<u32>)> = s
            .notes((0, 0))
            .into_iter()
            .map(|n| (n.seq, n.after))
            .collect();
        assert_eq!(after, vec![(1, vec![0]), (2, vec![1])]);
        s.finalize((0, 0), &[0, 1, 2], |_| {});
        assert!(s.txns.is_empty() && s.dirty.is_empty());
    }

    #[test]
    fn a_later_batch_waits_for_the_fate_and_learns_the_cascade() {
        let mut s = Speculation::default();
        let (w, t) = (p(0, 0, 0), p(1, 0, 0));
        s.ran(w, none(), [(0, 1)].into_iter(), Some("overdraft".into()));
        s.touch(t, [(0, 1)].into_iter());
        s.ran(t, none(), [(0, 1)].into_iter(), None);
        let n = &s.notes((0, 0))[0];
        assert_eq!(
            (n.seq, n.abort.as_deref(), n.cascade),
            (0, Some("overdraft"), false)
        );
        assert!(
            s.ack_or_park((1, 0), vec![]).is_none(),
            "t waits for w's fate"
        );
        let done = s.finalize((0, 0), &[0], |_| {});
        assert_eq!(done.released.len(), 1, "batch 1's acknowledgement may go");
        assert_eq!(done.restored, vec![((0, 1), (0, 0))]);
        assert!(s.notes((1, 0))[0].cascade);
        assert!(s.dirty.is_empty(), "both writes rolled back");
        s.finalize((1, 0), &[0], |_| {});
        assert!(s.txns.is_empty());
    }

    #[test]
    fn rollback_restores_the_previous_undecided_writer() {
        let mut s = Speculation::default();
        let (w, t) = (p(0, 0, 0), p(0, 1, 0));
        s.ran(w, none(), [(0, 1)].into_iter(), None);
        s.touch(t, [(0, 1)].into_iter());
        s.ran(t, none(), [(0, 1)].into_iter(), None);
        s.finalize((0, 1), &[0], |_| {}); // t aborted by another node's check
        assert_eq!(s.dirty.get(&(0, 1)), Some(&w));
        assert!(s.txns[&w].dependents.contains(&t));
        s.finalize((0, 0), &[], |_| {});
        assert!(s.dirty.is_empty() && s.txns.is_empty());
    }
}
