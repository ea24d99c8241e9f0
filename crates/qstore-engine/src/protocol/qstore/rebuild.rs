//! Rebuilding a stale cluster instance from another instance's copies, so that a server that
//! was cut off (or one that restarted without its copy) rejoins as a follower.
//!
//! An instance goes stale when it lost a server or ran plans no log committed (see
//! `replica`). Its members stay voters of their groups; from then on each one **holds** the
//! entries its group's log commits instead of delivering them. Rebuilding takes four steps:
//!
//! 1. **Ready.** A member holds, for every planner rank of its group, at least one entry; the
//!    first held entry of each rank bounds what it can replay: every later entry of that rank
//!    is held (a rank's entries reach the log in batch order). It reports the largest such
//!    first batch (`Ready { from }`) to its instance's node 0, the coordinator.
//! 2. **Asking.** Once every node of the instance reported, the coordinator numbers an
//!    attempt (`gen`), tells its instance (`Attempt`), and asks the leader of group 0 (node
//!    0 of an instance in service) for copies after some batch `c >= from` (`Wanted`).
//! 3. **Copying.** That leader marks the plan of its first planner for batch `c` (the plan
//!    reaches every node of its instance before anything after `c` could run there, as a
//!    checkpoint's mark does). Each node of the serving instance runs nothing after `c`
//!    until everything up to `c` has run and been answered, copies its partition's rows (the
//!    pause), goes on, and sends the copy, with the outcomes its group's transactions had
//!    (for resubmissions), to the node of the stale instance holding the same partition.
//! 4. **Installing.** A stale node that has the whole copy of the current attempt waits until
//!    none of its queues runs, replaces its partition's rows and its node state (the next
//!    batch is `c + 1`) and tells every node of its instance (`Rebuilt { gen }`). A node whose
//!    whole instance installed the same attempt is back in service: it delivers its held
//!    entries after `c`, in log order, and then what its log commits, as any member does.
//!
//! Messages between nodes of a stale instance belong to its old run: a node drops them
//! until the sender's `Rebuilt` of the node's own attempt arrived (links are FIFO, so what
//! comes after it belongs to the new run). The coordinator asks again (a new attempt) if no
//! node of its instance is back in service within `RETRY_AFTER`: it can tell, since a node
//! comes back only with every node's `Rebuilt`, the coordinator's included, and the
//! coordinator sends its own only for an attempt it installed.

use super::replica::LoggedBatch;
use qstore_core::txn::{TxnKey, TxnOutcome};
use qstore_core::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Most bytes of log entries a stale node holds; past it, it cannot be rebuilt (it says so).
const MAX_HELD_BYTES: usize = 512 << 20;
/// How often a ready stale node reports to its coordinator.
const REPORT_EVERY: Duration = Duration::from_millis(200);
/// How long the coordinator waits for an attempt before it makes another one.
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Bytes of copy records per message (a record holds about 1 MiB of rows at most), and
/// outcomes per message: a message stays well under the transport's frame limit.
pub(super) const COPY_BYTES_PER_MESSAGE: usize = 4 << 20;
pub(super) const OUTCOMES_PER_MESSAGE: usize = 16 << 10;

/// The messages of a rebuild (see the module's steps).
#[derive(Debug, Serialize, Deserialize)]
pub enum RebuildMsg {
    /// A stale node can replay its group's entries after batch `from`.
    Ready { from: u64 },
    /// The coordinator's attempt `gen`: copies of other attempts are dropped.
    Attempt { gen: u64 },
    /// To the leader of group 0: copies for stale instance `instance`, after a batch of
    /// at least `from`.
    Wanted { instance: u32, gen: u64, from: u64 },
    /// Part of the copy of the receiver's partition after `batch`, for attempt `gen`.
    Copy {
        gen: u64,
        batch: u64,
        part: CopyPart,
    },
    /// The sender installed attempt `gen`'s copy.
    Rebuilt { gen: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum CopyPart {
    /// Records of rows (see `checkpoint::copy_rows`).
    Rows(Vec<serde_bytes::ByteBuf>),
    /// Outcomes of transactions the group's log held, by client key.
    Outcomes(Vec<(TxnKey, TxnOutcome)>),
    /// The end: how many records and outcomes came before it.
    End { records: u64, outcomes: u64 },
}

/// A plan's mark (node 0's first planner): every node of its instance copies its partition
/// after this batch for stale instance `instance`'s attempt `gen`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyFor {
    pub instance: u32,
    pub gen: u64,
}

/// Where a node is: in service, stale, or installed and waiting for its instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Serving,
    Stale,
    Installed { gen: u64, batch: u64 },
}

/// A whole copy, ready to install.
pub(super) struct Copy {
    pub gen: u64,
    pub batch: u64,
    pub records: Vec<Vec<u8>>,
    pub outcomes: Vec<(TxnKey, TxnOutcome)>,
}

/// A node's side of rebuilding its instance (and, at node 0, the coordinator's).
pub(super) struct Rebuild {
    phase: Phase,
    /// Entries its group's log committed since the node went stale, in log order, with
    /// their proposers.
    held: Vec<(NodeId, LoggedBatch)>,
    held_bytes: usize,
    /// The first held batch of each planner rank.
    first_held: BTreeMap<u32, u64>,
    /// Set when the held entries outgrew `MAX_HELD_BYTES`: this node cannot be rebuilt.
    overflowed: bool,
    /// The latest attempt heard of.
    gen: u64,
    /// By attempt: the nodes of the instance (by partition) that installed its copy.
    installed: BTreeMap<u64, BTreeSet<u32>>,
    incoming: Option<Copy>,
    /// The whole copy of the current attempt, waiting until no queue runs here.
    complete: Option<Copy>,
    reported: Option<Instant>,
    /// Coordinator: what every node of the instance can replay after, and when it last
    /// asked for copies.
    reports: BTreeMap<u32, u64>,
    asked: Option<Instant>,
}

impl Rebuild {
    pub fn new() -> Self {
        Rebuild {
            phase: Phase::Serving,
            held: Vec::new(),
            held_bytes: 0,
            first_held: BTreeMap::new(),
            overflowed: false,
            gen: 0,
            installed: BTreeMap::new(),
            incoming: None,
            complete: None,
            reported: None,
            reports: BTreeMap::new(),
            asked: None,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The node's instance went stale: it holds what its log commits from now on.
    pub fn go_stale(&mut self) {
        if self.phase == Phase::Serving {
            *self = Rebuild {
                gen: self.gen,
                ..Rebuild::new()
            };
            self.phase = Phase::Stale;
        }
    }

    /// An entry the log committed: handed back to deliver if the node serves, else held.
    pub fn hold(
        &mut self,
        proposer: NodeId,
        entry: LoggedBatch,
        len: usize,
    ) -> Option<LoggedBatch> {
        if self.phase == Phase::Serving {
            return Some(entry);
        }
        if self.overflowed {
            return None;
        }
        if self.held_bytes + len > MAX_HELD_BYTES {
            tracing::error!(
                "a stale node held {} MB of its group's log: it cannot be rebuilt any more",
                self.held_bytes >> 20
            );
            self.overflowed = true;
            self.held = Vec::new();
            return None;
        }
        self.held_bytes += len;
        self.first_held.entry(entry.rank).or_insert(entry.batch);
        self.held.push((proposer, entry));
        None
    }

    /// What this node can replay after, once it holds an entry of every rank of its group,
    /// if it is due to report it (stale, not installed, every `REPORT_EVERY`).
    pub fn report_due(&mut self, ranks: std::ops::Range<u32>, now: Instant) -> Option<u64> {
        if self.phase != Phase::Stale || self.overflowed {
            return None;
        }
        if self.reported.is_some_and(|at| now - at < REPORT_EVERY) {
            return None;
        }
        let from = ranks
            .map(|r| self.first_held.get(&r).copied())
            .collect::<Option<Vec<u64>>>()?
            .into_iter()
            .max()?;
        self.reported = Some(now);
        Some(from)
    }

    /// Coordinator: node `part` can replay after `from`.
    pub fn on_ready(&mut self, part: u32, from: u64) {
        self.reports.insert(part, from);
    }

    /// Coordinator: a new attempt and the batch to copy after, when every one of the
    /// instance's `parts` nodes reported and the last attempt is `RETRY_AFTER` old.
    pub fn attempt_due(&mut self, parts: u32, now: Instant) -> Option<(u64, u64)> {
        if self.phase == Phase::Serving || self.reports.len() < parts as usize {
            return None;
        }
        if self.asked.is_some_and(|at| now - at < RETRY_AFTER) {
            return None;
        }
        self.asked = Some(now);
        self.gen += 1;
        let from = self.reports.values().copied().max()?;
        Some((self.gen, from))
    }

    /// The coordinator's attempt `gen`: copies of earlier ones are dropped from now on.
    pub fn on_attempt(&mut self, gen: u64) {
        if gen > self.gen {
            self.gen = gen;
        }
        if self.incoming.as_ref().is_some_and(|c| c.gen < self.gen) {
            self.incoming = None;
        }
    }

    /// Part of a copy. Returns an error to log if the part does not fit.
    pub fn on_copy(&mut self, gen: u64, batch: u64, part: CopyPart) -> Result<(), String> {
        if self.phase == Phase::Serving || gen != self.gen {
            return Ok(()); // in service already, or of an attempt given up
        }
        if self
            .incoming
            .as_ref()
            .is_none_or(|c| c.gen != gen || c.batch != batch)
        {
            self.incoming = Some(Copy {
                gen,
                batch,
                records: Vec::new(),
                outcomes: Vec::new(),
            });
        }
        let copy = self.incoming.as_mut().expect("just set");
        match part {
            CopyPart::Rows(records) => copy
                .records
                .extend(records.into_iter().map(|r| r.into_vec())),
            CopyPart::Outcomes(outcomes) => copy.outcomes.extend(outcomes),
            CopyPart::End { records, outcomes } => {
                let copy = self.incoming.take().expect("just set");
                if copy.records.len() as u64 != records || copy.outcomes.len() as u64 != outcomes {
                    return Err(format!(
                        "a copy of {} records and {} outcomes announced {records} and \
                         {outcomes}",
                        copy.records.len(),
                        copy.outcomes.len()
                    ));
                }
                let needed = self.first_held.values().copied().max().unwrap_or(u64::MAX);
                if batch < needed || self.overflowed {
                    return Err(format!(
                        "a copy after batch {batch}, but this node holds its log from batch \
                         {needed} on"
                    ));
                }
                self.complete = Some(copy);
            }
        }
        Ok(())
    }

    /// The whole copy waiting to be installed, if any.
    pub fn take_complete(&mut self) -> Option<Copy> {
        self.complete.take()
    }

    /// Puts back a copy that could not be installed yet (a queue was running).
    pub fn keep_complete(&mut self, copy: Copy) {
        if copy.gen == self.gen && self.phase != Phase::Serving {
            self.complete = Some(copy);
        }
    }

    /// This node installed attempt `gen`'s copy after `batch`.
    pub fn installed_copy(&mut self, gen: u64, batch: u64) {
        self.phase = Phase::Installed { gen, batch };
    }

    /// Node `part` of the instance installed attempt `gen`.
    pub fn on_rebuilt(&mut self, gen: u64, part: u32) {
        self.installed.entry(gen).or_default().insert(part);
    }

    /// Whether messages of transaction processing from node `part` of the instance belong to
    /// the run this node takes part in.
    pub fn accepts_from(&self, part: u32) -> bool {
        match self.phase {
            Phase::Serving => true,
            Phase::Stale => false,
            Phase::Installed { gen, .. } => {
                self.installed.get(&gen).is_some_and(|s| s.contains(&part))
            }
        }
    }

    /// Back in service, if every one of the instance's `parts` nodes installed this node's
    /// attempt: the held entries to deliver (those after the copy), in log order.
    pub fn serve_if_whole(&mut self, parts: u32) -> Option<Vec<(NodeId, LoggedBatch)>> {
        let Phase::Installed { gen, batch } = self.phase else {
            return None;
        };
        if self
            .installed
            .get(&gen)
            .is_none_or(|s| s.len() < parts as usize)
        {
            return None;
        }
        let held = std::mem::take(&mut self.held);
        *self = Rebuild {
            gen: self.gen,
            ..Rebuild::new()
        };
        Some(held.into_iter().filter(|(_, e)| e.batch > batch).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::qstore::replica::LoggedPlan;

    fn entry(batch: u64, rank: u32) -> LoggedBatch {
        LoggedBatch {
            batch,
            rank,
            txns: Vec::new(),
            plan: LoggedPlan::Inputs,
        }
    }

    fn stale_with(entries: &[(u64, u32)]) -> Rebuild {
        let mut r = Rebuild::new();
        assert!(
            r.hold(NodeId(0), entry(1, 0), 10).is_some(),
            "serving: delivered"
        );
        r.go_stale();
        for &(b, rank) in entries {
            assert!(r.hold(NodeId(0), entry(b, rank), 10).is_none());
        }
        r
    }

    fn send_copy(r: &mut Rebuild, gen: u64, batch: u64) -> Result<(), String> {
        let rows = CopyPart::Rows(vec![serde_bytes::ByteBuf::from(vec![1, 2])]);
        r.on_copy(gen, batch, rows)?;
        r.on_copy(
            gen,
            batch,
            CopyPart::End {
                records: 1,
                outcomes: 0,
            },
        )
    }

    #[test]
    fn a_stale_node_reports_once_it_holds_every_rank_and_replays_only_after_the_copy() {
        let mut r = stale_with(&[(5, 0), (5, 1), (6, 0)]);
        let now = Instant::now();
        assert_eq!(r.report_due(0..3, now), None, "rank 2 has nothing held yet");
        r.hold(NodeId(1), entry(7, 2), 10);
        r.hold(NodeId(1), entry(6, 1), 10);
        assert_eq!(r.report_due(0..3, now), Some(7));
        assert_eq!(r.report_due(0..3, now), None, "not again so soon");
        // Coordinator of two nodes.
        r.on_ready(0, 7);
        assert_eq!(r.attempt_due(2, now), None, "node 1 has not reported");
        r.on_ready(1, 9);
        let (gen, from) = r.attempt_due(2, now).expect("an attempt");
        assert_eq!((gen, from), (1, 9));
        assert_eq!(r.attempt_due(2, now), None, "one attempt at a time");
        r.on_attempt(gen);
        // A copy too early for what is held is refused.
        assert!(send_copy(&mut r, gen, 6).is_err());
        send_copy(&mut r, gen, 9).unwrap();
        let copy = r.take_complete().expect("whole");
        assert_eq!((copy.batch, copy.records.len()), (9, 1));
        r.installed_copy(gen, 9);
        r.hold(NodeId(1), entry(10, 0), 10);
        assert!(!r.accepts_from(1), "node 1's messages are of the old run");
        r.on_rebuilt(gen, 0);
        assert!(r.serve_if_whole(2).is_none(), "node 1 has not installed");
        r.on_rebuilt(gen, 1);
        assert!(r.accepts_from(1));
        let replay = r.serve_if_whole(2).expect("back in service");
        let batches: Vec<(u64, u32)> = replay.iter().map(|(_, e)| (e.batch, e.rank)).collect();
        assert_eq!(batches, vec![(10, 0)], "only what comes after the copy");
        assert_eq!(r.phase(), Phase::Serving);
        assert!(r.hold(NodeId(0), entry(11, 0), 10).is_some());
    }

    #[test]
    fn copies_of_another_attempt_or_with_missing_parts_are_dropped() {
        let mut r = stale_with(&[(3, 0)]);
        r.on_attempt(2);
        send_copy(&mut r, 1, 5).unwrap();
        assert!(r.take_complete().is_none(), "attempt 1 was given up");
        r.on_copy(2, 5, CopyPart::Rows(Vec::new())).unwrap();
        let end = CopyPart::End {
            records: 3,
            outcomes: 0,
        };
        assert!(r.on_copy(2, 5, end).is_err(), "records are missing");
        assert!(r.take_complete().is_none());
    }

    #[test]
    fn a_node_that_held_too_much_cannot_be_rebuilt() {
        let mut r = stale_with(&[]);
        r.hold(NodeId(0), entry(1, 0), MAX_HELD_BYTES + 1);
        assert_eq!(r.report_due(0..1, Instant::now()), None);
    }
}
