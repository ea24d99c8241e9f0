//! Batch metadata at an executing node: the execution queues of every batch in flight, by
//! sub-partition and planner rank, and which of them may run now.
//!
//! The rule (the paper's priority condition): on each sub-partition, the queues run in global
//! order, batch by batch and within a batch by planner rank; queues of different
//! sub-partitions run in parallel. A queue runs only once the plan of every higher-priority
//! planner for that batch has arrived (an arrived plan without a queue for a sub-partition
//! means "nothing here").

use super::msg::{Eq, Output, Outputs};
use std::collections::BTreeMap;

/// One sub-partition of one batch.
struct SubQueue {
    /// Queues by planner rank (`None`: not arrived, empty, or running).
    eqs: Vec<Option<Eq>>,
    /// Ranks below this one are done here.
    next_rank: u32,
    /// Fragments of `eqs[next_rank]` already executed (a queue can stall part-way).
    cursor: usize,
    running: bool,
    /// The event count when the queue last stalled: retrying before anything has happened
    /// since would only stall again.
    stalled_at: Option<u64>,
}

/// One batch at this node.
pub struct BatchSlot {
    subs: Vec<SubQueue>,
    /// Plans arrived, by rank.
    arrived: Vec<bool>,
    /// Per rank: its queues here not yet finished, and the outputs to acknowledge with.
    unfinished: Vec<u32>,
    outputs: Vec<Outputs>,
}

/// A queue taken by an executor: run it from `cursor`, then hand it back.
pub struct Claim {
    pub batch: u64,
    pub sub: u32,
    pub rank: u32,
    pub eq: Eq,
    pub cursor: usize,
}

/// What finishing a queue completed.
pub struct Finished {
    /// Every queue of this rank in this batch is done here: acknowledge with these outputs.
    pub ack: Option<Outputs>,
}

/// All batches in flight at a node.
pub struct Batches {
    subs: u32,
    /// Sub-partitions at or above this one hold read-only queues (read-committed isolation):
    /// they run beside the writers but only once every earlier batch is done.
    read_only_from: u32,
    ranks: u32,
    slots: BTreeMap<u64, BatchSlot>,
    /// Counts events that may unblock a stalled queue (values, verdicts, finished queues).
    events: u64,
    /// No queue of this batch or a later one may be claimed (a checkpoint waits for the
    /// batches before it, or recovery for its checkpoint).
    hold_from: u64,
}

impl Batches {
    #[cfg(test)]
    pub fn new(subs: u32, ranks: u32) -> Self {
        Self::with_read_only(subs, 0, ranks)
    }

    /// `subs` queues for writers and `read_only` queues for read-only transactions.
    pub fn with_read_only(subs: u32, read_only: u32, ranks: u32) -> Self {
        Batches {
            read_only_from: subs,
            subs: subs + read_only,
            ranks,
            slots: BTreeMap::new(),
            events: 0,
            hold_from: u64::MAX,
        }
    }

    fn slot(&mut self, batch: u64) -> &mut BatchSlot {
        let (subs, ranks) = (self.subs as usize, self.ranks as usize);
        self.slots.entry(batch).or_insert_with(|| BatchSlot {
            subs: (0..subs)
                .map(|_| SubQueue {
                    eqs: (0..ranks).map(|_| None).collect(),
                    next_rank: 0,
                    cursor: 0,
                    running: false,
                    stalled_at: None,
                })
                .collect(),
            arrived: vec![false; ranks],
            unfinished: vec![0; ranks],
            outputs: vec![Vec::new(); ranks],
        })
    }

    /// Why planner `rank`'s queues, received from the network, cannot be installed, if
    /// they cannot: an unknown rank or queue, or fragments pointing outside their queue.
    pub fn check_plan(&self, rank: u32, eqs: &[Eq]) -> Result<(), String> {
        if rank >= self.ranks {
            return Err(format!(
                "planner rank {rank} (the cluster has {})",
                self.ranks
            ));
        }
        if let Some(eq) = eqs.iter().find(|eq| eq.sub >= self.subs) {
            return Err(format!("queue {} (nodes have {})", eq.sub, self.subs));
        }
        if eqs.iter().any(|eq| !eq.is_well_formed()) {
            return Err("a fragment's accesses lie outside its queue".to_string());
        }
        Ok(())
    }

    /// Holds back every queue of batch `from` and later ones (`u64::MAX`: none).
    pub fn hold_from(&mut self, from: u64) {
        self.hold_from = from;
    }

    /// Whether an executor holds a queue (claimed and not handed back).
    pub fn any_running(&self) -> bool {
        self.slots
            .values()
            .any(|slot| slot.subs.iter().any(|q| q.running))
    }

    /// The first batch held back.
    pub fn held_from(&self) -> u64 {
        self.hold_from
    }

    /// The newest batch any planner's plan has arrived for, if one is in flight.
    pub fn newest(&self) -> Option<u64> {
        self.slots.keys().next_back().copied()
    }

    /// Installs planner `rank`'s queues for `batch`. Returns true if the rank had none here
    /// (nothing to acknowledge).
    pub fn install(&mut self, batch: u64, rank: u32, eqs: Vec<Eq>) -> bool {
        let slot = self.slot(batch);
        debug_assert!(!slot.arrived[rank as usize], "one plan per rank and batch");
        slot.arrived[rank as usize] = true;
        slot.unfinished[rank as usize] = eqs.len() as u32;
        let empty = eqs.is_empty();
        for eq in eqs {
            let sub = eq.sub as usize;
            slot.subs[sub].eqs[rank as usize] = Some(eq);
        }
        empty
    }

    /// Takes the first queue that may run now, scanning batches oldest first and
    /// sub-partitions from `start` (spreading executors over sub-partitions). A read-only
    /// queue runs only once every writer before it in the global order (earlier batches, and
    /// lower planner ranks of its batch) has run and been decided here, which the caller
    /// says by `readable`: queues at positions (batch, rank) up to it may run.
    pub fn claim(&mut self, start: u32, readable: (u64, u32)) -> Option<Claim> {
        let ranks = self.ranks;
        // Sub-partitions still busy in an older batch may not start a newer one.
        let mut blocked = vec![false; self.subs as usize];
        for (&batch, slot) in self.slots.range_mut(..self.hold_from) {
            for k in 0..self.subs {
                let e = ((start + k) % self.subs) as usize;
                if blocked[e] {
                    continue;
                }
                let arrived = &slot.arrived;
                let q = &mut slot.subs[e];
                // Skip ranks that arrived with nothing for this sub-partition.
                while q.next_rank < ranks
                    && !q.running
                    && arrived[q.next_rank as usize]
                    && q.eqs[q.next_rank as usize].is_none()
                {
                    q.next_rank += 1;
                    q.cursor = 0;
                }
                if q.next_rank == ranks {
                    continue;
                }
                blocked[e] = true;
                let read_only = e as u32 >= self.read_only_from;
                if q.running
                    || q.stalled_at == Some(self.events)
                    || (read_only && (batch, q.next_rank) > readable)
                {
                    continue;
                }
                if let Some(eq) = q.eqs[q.next_rank as usize].take() {
                    q.running = true;
                    return Some(Claim {
                        batch,
                        sub: e as u32,
                        rank: q.next_rank,
                        eq,
                        cursor: q.cursor,
                    });
                }
            }
        }
        None
    }

    /// The first position (batch, planner rank), from batch `from` on, whose writer queues
    /// have not all run here: its plan has not arrived, or one of its writer queues waits or
    /// runs. Batches below the oldest slot have run here (slots are dropped oldest first, and
    /// a planner's plans arrive in order, so no slot is missing between oldest and newest).
    pub fn writers_done_before(&self, from: u64) -> (u64, u32) {
        let oldest = self.slots.keys().next().copied();
        let mut b = from.max(oldest.unwrap_or(from));
        while let Some(slot) = self.slots.get(&b) {
            let writers = &slot.subs[..self.read_only_from as usize];
            let first_undone = |q: &SubQueue| {
                if q.running {
                    return q.next_rank;
                }
                (q.next_rank..self.ranks)
                    .find(|&r| !slot.arrived[r as usize] || q.eqs[r as usize].is_some())
                    .unwrap_or(self.ranks)
            };
            // Ranks that no writer queue here waits on may still have to arrive.
            let arrived = slot
                .arrived
                .iter()
                .position(|&a| !a)
                .unwrap_or(slot.arrived.len());
            let undone = writers.iter().map(first_undone).min().unwrap_or(self.ranks);
            let undone = undone.min(arrived as u32);
            if undone < self.ranks {
                return (b, undone);
            }
            b += 1;
        }
        (b, 0)
    }

    /// Returns a queue that stalled at fragment `cursor` (it resumes there later) because of
    /// what it saw when the event count was `seen`: it is retried after the next event.
    pub fn stall(&mut self, c: Claim, seen: u64) {
        let q = &mut self.slot(c.batch).subs[c.sub as usize];
        q.stalled_at = Some(seen);
        q.cursor = c.cursor;
        q.running = false;
        q.eqs[c.rank as usize] = Some(c.eq);
    }

    /// Notes an event that may let stalled or waiting queues continue.
    pub fn event(&mut self) {
        self.events += 1;
    }

    /// The event count (an idle executor sleeps only if it has not moved since it looked).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Keeps outputs of fragments that ran before a queue stalled, for the acknowledgement.
    pub fn add_outputs(&mut self, batch: u64, rank: u32, outputs: Vec<Output>) {
        self.slot(batch).outputs[rank as usize].push(outputs);
    }

    /// Records that a claimed queue ran to its end, with the outputs it produced.
    pub fn finish(&mut self, batch: u64, sub: u32, rank: u32, outputs: Vec<Output>) -> Finished {
        self.events += 1;
        let slot = self.slot(batch);
        let q = &mut slot.subs[sub as usize];
        q.running = false;
        q.next_rank = rank + 1;
        q.cursor = 0;
        let r = rank as usize;
        slot.outputs[r].push(outputs);
        slot.unfinished[r] -= 1;
        let ack = (slot.unfinished[r] == 0).then(|| std::mem::take(&mut slot.outputs[r]));
        Finished { ack }
    }

    /// Drops the oldest batches whose queues have all run; returns the first batch still in
    /// flight (or `upto` if none).
    pub fn retire_done(&mut self, upto: u64) -> u64 {
        let ranks = self.ranks;
        while let Some((&b, slot)) = self.slots.first_key_value() {
            let done = slot.arrived.iter().all(|&a| a)
                && slot.subs.iter().all(|q| {
                    !q.running && (q.next_rank as usize..ranks as usize).all(|r| q.eqs[r].is_none())
                })
                && slot.unfinished.iter().all(|&u| u == 0);
            if !done {
                return b;
            }
            self.slots.pop_first();
        }
        upto
    }

    /// A one-line summary of the oldest batch in flight, for diagnosing a stuck node.
    pub fn describe_oldest(&self) -> String {
        let Some((b, slot)) = self.slots.first_key_value() else {
            return "no batch in flight".into();
        };
        let arrived = slot.arrived.iter().filter(|&&a| a).count();
        let subs: Vec<String> = slot
            .subs
            .iter()
            .map(|q| {
                let waiting = q.eqs.iter().filter(|e| e.is_some()).count();
                format!(
                    "r{}c{}{}{}w{}",
                    q.next_rank,
                    q.cursor,
                    if q.running { "R" } else { "" },
                    if q.stalled_at.is_some() { "S" } else { "" },
                    waiting
                )
            })
            .collect();
        format!(
            "batch {b}: {arrived}/{} plans, unfinished {:?}, subs [{}], {} batches in flight",
            slot.arrived.len(),
            slot.unfinished,
            subs.join(" "),
            self.slots.len()
        )
    }

    /// Whether no batch is in flight here.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read-only queues anywhere in the order may run.
    const ANY: (u64, u32) = (u64::MAX, u32::MAX);

    fn eq(sub: u32, n: usize) -> Eq {
        Eq {
            sub,
            frags: (0..n as u32)
                .map(|seq| {
                    super::super::msg::Frag::empty(seq, qstore_core::TxnId(seq as u64 + 1), 0, 0)
                })
                .collect(),
            ops: vec![],
            extras: vec![],
        }
    }

    #[test]
    fn queues_run_in_rank_order_per_sub_partition() {
        let mut b = Batches::new(2, 2);
        // Rank 1's queue for sub 0 arrives first: it must wait for rank 0's plan.
        assert!(!b.install(0, 1, vec![eq(0, 1)]));
        assert!(b.claim(0, ANY).is_none());
        // Rank 0 has nothing for sub 0 but a queue for sub 1.
        b.install(0, 0, vec![eq(1, 2)]);
        let c1 = b.claim(1, ANY).unwrap();
        assert_eq!((c1.sub, c1.rank), (1, 0));
        let c0 = b.claim(0, ANY).unwrap();
        assert_eq!((c0.sub, c0.rank), (0, 1), "rank 0 was empty for sub 0");
        assert!(b.claim(0, ANY).is_none(), "both sub-partitions are running");
        assert!(b.finish(0, 0, 1, vec![]).ack.is_some());
        assert!(b.finish(0, 1, 0, vec![]).ack.is_some());
        assert_eq!(b.retire_done(1), 1);
        assert!(b.is_empty());
    }

    #[test]
    fn a_hold_keeps_later_batches_waiting_until_lifted() {
        let mut b = Batches::new(2, 1);
        b.hold_from(1);
        b.install(0, 0, vec![eq(0, 1)]);
        b.install(1, 0, vec![eq(1, 1)]);
        let c = b.claim(0, ANY).unwrap();
        assert_eq!(c.batch, 0);
        assert!(b.claim(1, ANY).is_none(), "batch 1 is held back");
        b.finish(0, 0, 0, vec![]);
        assert_eq!(b.retire_done(2), 1, "batch 0 retires; batch 1 waits");
        assert!(b.claim(1, ANY).is_none());
        b.hold_from(u64::MAX);
        assert_eq!(b.claim(1, ANY).unwrap().batch, 1);
    }

    #[test]
    fn malformed_plans_are_refused() {
        let b = Batches::new(2, 2);
        assert!(b.check_plan(1, &[eq(1, 0)]).is_ok());
        assert!(b.check_plan(2, &[]).unwrap_err().contains("rank 2"));
        assert!(b
            .check_plan(0, &[eq(2, 0)])
            .unwrap_err()
            .contains("queue 2"));
        let mut outside = eq(0, 1);
        outside.frags[0].len = 1; // but the queue has no accesses
        assert!(b.check_plan(0, &[outside]).unwrap_err().contains("outside"));
    }

    #[test]
    fn a_newer_batch_waits_for_the_older_one_on_the_same_sub_partition() {
        let mut b = Batches::new(1, 1);
        b.install(0, 0, vec![eq(0, 1)]);
        b.install(1, 0, vec![eq(0, 1)]);
        let c = b.claim(0, ANY).unwrap();
        assert_eq!(c.batch, 0);
        assert!(b.claim(0, ANY).is_none());
        // A stalled queue comes back with its cursor, once something has happened.
        let seen = b.events();
        b.stall(Claim { cursor: 1, ..c }, seen);
        assert!(b.claim(0, ANY).is_none());
        b.event();
        let c = b.claim(0, ANY).unwrap();
        assert_eq!((c.batch, c.cursor), (0, 1));
        b.finish(0, 0, 0, vec![]);
        assert_eq!(b.claim(0, ANY).unwrap().batch, 1);
        assert_eq!(b.retire_done(2), 1);
    }

    #[test]
    fn read_only_queues_wait_for_the_writers_before_them_only() {
        // One writer and one read-only sub-partition; two planners.
        let mut b = Batches::with_read_only(1, 1, 2);
        b.install(0, 0, vec![eq(0, 1), eq(1, 1)]);
        b.install(0, 1, vec![eq(0, 1), eq(1, 1)]);
        b.install(1, 0, vec![eq(1, 1)]);
        // No writer comes before rank 0's readers of batch 0.
        assert_eq!(b.writers_done_before(0), (0, 0));
        let reader = b.claim(1, b.writers_done_before(0)).unwrap();
        assert_eq!((reader.batch, reader.sub, reader.rank), (0, 1, 0));
        b.finish(0, 1, 0, vec![]);
        // Rank 1's readers wait for rank 0's writer, which runs.
        let writer = b.claim(1, b.writers_done_before(0)).unwrap();
        assert_eq!((writer.batch, writer.sub, writer.rank), (0, 0, 0));
        assert!(b.claim(1, b.writers_done_before(0)).is_none());
        b.finish(0, 0, 0, vec![]);
        assert_eq!(b.writers_done_before(0), (0, 1));
        // Now they run, beside rank 1's writer; batch 1's readers wait for that writer.
        let reader = b.claim(1, b.writers_done_before(0)).unwrap();
        assert_eq!((reader.batch, reader.sub, reader.rank), (0, 1, 1));
        b.finish(0, 1, 1, vec![]);
        let writer = b.claim(1, b.writers_done_before(0)).unwrap();
        assert_eq!((writer.batch, writer.rank), (0, 1));
        assert!(b.claim(1, b.writers_done_before(0)).is_none());
        b.finish(0, 0, 1, vec![]);
        // Batch 1 has no writer here, but rank 1's plan has not arrived.
        assert_eq!(b.writers_done_before(0), (1, 1));
        let reader = b.claim(1, b.writers_done_before(0)).unwrap();
        assert_eq!((reader.batch, reader.rank), (1, 0));
    }
}
