//! Rebuilding a stale cluster instance from another instance's copies, so that a server that
//! was cut off (or one that restarted without its copy) rejoins as a follower. Q-Store and
//! Calvin share it: a *batch* below is a Q-Store batch or a Calvin epoch, and a *rank* a
//! Q-Store planner rank (Calvin has one per group, its sequencer).
//!
//! An instance goes stale when it lost a server or ran what no log committed. Its members
//! stay voters of their groups; from then on each one **holds** the entries its group's log
//! commits instead of delivering them. Rebuilding takes four steps:
//!
//! 1. **Ready.** A member holds, for every rank of its group, at least one entry; the
//!    first held entry of each rank bounds what it can replay: every later entry of that rank
//!    is held (a rank's entries reach the log in batch order). It reports the largest such
//!    first batch (`Ready { from }`) to its instance's node 0, the coordinator. A member
//!    still missing some rank says so to the leader of group 0 instead (`Starved`): an idle
//!    cluster plans no batches, so that leader then plans one, empty if need be, which every
//!    other planner closes too.
//! 2. **Asking.** Once every node of the instance reported, the coordinator numbers an
//!    attempt (`gen`), tells its instance (`Attempt`), and asks the leader of group 0 (node
//!    0 of an instance in service) for copies after some batch `c >= from` (`Wanted`);
//!    that leader plans its next batch at once, idle or not, to mark the copy on.
//! 3. **Copying.** That leader's instance marks batch `c` as a checkpoint is marked (Q-Store:
//!    on the plan of node 0's first planner; Calvin: on node 0's epoch batches), which
//!    reaches every node of the instance before anything after `c` could run there. Each node of the serving instance runs nothing after `c`
//!    until everything up to `c` has run and been answered, copies its partition's rows (the
//!    pause), goes on, and sends the copy, with the outcomes its group's transactions had
//!    (for resubmissions), to the node of the stale instance holding the same partition.
//! 4. **Installing.** A stale node that has the whole copy of the current attempt waits until
//!    nothing runs there, replaces its partition's rows and its node state (the next
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

use crate::cluster::EngineCtx;
use parking_lot::Mutex;
use qstore_core::txn::{TxnKey, TxnOutcome};
use qstore_core::{NodeId, PartitionId};
use qstore_net::Transport;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// An entry of a group's log, as a stale node holds it.
pub trait HeldEntry {
    /// Its batch (or epoch).
    fn batch(&self) -> u64;
    /// The rank that made it (0 for a protocol with one per group).
    fn rank(&self) -> u32;
}

/// Most bytes of log entries a stale node holds; past it, it cannot be rebuilt (it says so).
const MAX_HELD_BYTES: usize = 512 << 20;
/// How often a ready stale node reports to its coordinator.
const REPORT_EVERY: Duration = Duration::from_millis(200);
/// How long the coordinator waits for an attempt that makes no progress (no part of a copy,
/// no node's `Rebuilt`) before it makes another one: longer than making a large copy (a
/// million rows take about half a second here, ten times as long in a debug build), since
/// another attempt drops the copies of the one before.
pub const RETRY_AFTER: Duration = Duration::from_secs(20);
/// Bytes of copy records per message (a record holds about 1 MiB of rows at most), and
/// outcomes per message: a message stays well under the transport's frame limit.
pub const COPY_BYTES_PER_MESSAGE: usize = 4 << 20;
pub const OUTCOMES_PER_MESSAGE: usize = 16 << 10;

/// What a stale node has to say to its coordinator, or to the copy's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// It can replay its group's entries after this batch.
    From(u64),
    /// Some planner of its group has planned nothing since the node went stale (an idle
    /// cluster plans no batches): it cannot say yet.
    Starved,
}

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
    /// To the leader of group 0: the sender's instance waits for batches to be planned (it
    /// cannot be rebuilt until every planner of its groups planned one since it went
    /// stale); an idle cluster plans one.
    Starved,
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
pub enum Phase {
    Serving,
    Stale,
    Installed { gen: u64, batch: u64 },
}

/// A whole copy, ready to install.
pub struct Copy {
    pub gen: u64,
    pub batch: u64,
    /// The stretch of held entries it was handed out against (see `Rebuild::holding`).
    pub holding: u64,
    pub records: Vec<Vec<u8>>,
    pub outcomes: Vec<(TxnKey, TxnOutcome)>,
}

/// A node's side of rebuilding its instance (and, at node 0, the coordinator's).
pub struct Rebuild<E> {
    phase: Phase,
    /// Entries its group's log committed since the node went stale, in log order, with
    /// their proposers.
    held: Vec<(NodeId, E)>,
    held_bytes: usize,
    /// The first held batch of each planner rank.
    first_held: BTreeMap<u32, u64>,
    /// Set when the held entries outgrew `MAX_HELD_BYTES`: this node cannot be rebuilt.
    overflowed: bool,
    /// One more each time the node's log skipped entries while it was out of service: a
    /// copy handed out for installing before that no longer fits what is held.
    holding: u64,
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

impl<E: HeldEntry> Default for Rebuild<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: HeldEntry> Rebuild<E> {
    pub fn new() -> Self {
        Rebuild {
            phase: Phase::Serving,
            held: Vec::new(),
            held_bytes: 0,
            first_held: BTreeMap::new(),
            overflowed: false,
            holding: 0,
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

    /// The node's log skipped entries (it fell behind a compacted log and took a snapshot).
    /// Out of service, what it held (and any copy it has or installs meanwhile) would leave
    /// a gap before the entries to come: it holds anew from the next entry on, and its
    /// reports ask for a copy after that. (A node in service goes stale instead.)
    pub fn skipped(&mut self) {
        if self.phase == Phase::Serving {
            return;
        }
        *self = Rebuild {
            phase: Phase::Stale,
            holding: self.holding + 1,
            gen: self.gen,
            installed: std::mem::take(&mut self.installed),
            reports: std::mem::take(&mut self.reports),
            asked: self.asked,
            ..Rebuild::new()
        };
    }

    /// An entry the log committed: handed back to deliver if the node serves, else held.
    pub fn hold(&mut self, proposer: NodeId, entry: E, len: usize) -> Option<E> {
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
        self.first_held.entry(entry.rank()).or_insert(entry.batch());
        self.held.push((proposer, entry));
        None
    }

    /// What this node can replay after, once it holds an entry of every rank of its group,
    /// if it is due to report it (stale, not installed, every `REPORT_EVERY`); or, if some
    /// rank has sent it nothing yet, that it is starved.
    pub fn report_due(&mut self, ranks: std::ops::Range<u32>, now: Instant) -> Option<Report> {
        if self.phase != Phase::Stale || self.overflowed {
            return None;
        }
        if self.reported.is_some_and(|at| now - at < REPORT_EVERY) {
            return None;
        }
        self.reported = Some(now);
        let first = ranks.map(|r| self.first_held.get(&r).copied());
        match first.collect::<Option<Vec<u64>>>() {
            Some(held) => held.into_iter().max().map(Report::From),
            None => Some(Report::Starved),
        }
    }

    /// Coordinator: node `part` can replay after `from`. A node that reports a later batch
    /// than before skipped entries: the copies of the current attempt come too early for
    /// it, so the next attempt is due at once.
    pub fn on_ready(&mut self, part: u32, from: u64) {
        if self
            .reports
            .insert(part, from)
            .is_some_and(|before| from > before)
        {
            self.asked = None;
        }
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

    /// Part of a copy, at `now`. Returns an error to log if the part does not fit.
    pub fn on_copy(
        &mut self,
        gen: u64,
        batch: u64,
        part: CopyPart,
        now: Instant,
    ) -> Result<(), String> {
        if self.phase == Phase::Serving || gen != self.gen {
            return Ok(()); // in service already, or of an attempt given up
        }
        // The attempt is making progress: a large copy takes a while (coordinator).
        self.progressed(now);
        if self
            .incoming
            .as_ref()
            .is_none_or(|c| c.gen != gen || c.batch != batch)
        {
            self.incoming = Some(Copy {
                gen,
                batch,
                holding: self.holding,
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

    /// Puts back a copy that could not be installed yet (something was running).
    pub fn keep_complete(&mut self, copy: Copy) {
        if copy.gen == self.gen && copy.holding == self.holding && self.phase != Phase::Serving {
            self.complete = Some(copy);
        }
    }

    /// This node installed attempt `gen`'s copy after `batch`, handed out against the
    /// held entries of stretch `holding`. False if the log skipped entries since: the node
    /// stays stale (and says nothing to its instance) until it installs a later copy.
    pub fn installed_copy(&mut self, gen: u64, batch: u64, holding: u64) -> bool {
        if holding != self.holding {
            return false;
        }
        self.phase = Phase::Installed { gen, batch };
        true
    }

    /// Node `part` of the instance installed attempt `gen`, heard at `now`.
    pub fn on_rebuilt(&mut self, gen: u64, part: u32, now: Instant) {
        self.installed.entry(gen).or_default().insert(part);
        if gen == self.gen {
            self.progressed(now);
        }
    }

    /// Coordinator: the current attempt made progress at `now`; another one waits until it
    /// made none for `RETRY_AFTER`.
    fn progressed(&mut self, now: Instant) {
        if self.asked.is_some() {
            self.asked = Some(now);
        }
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
    pub fn serve_if_whole(&mut self, parts: u32) -> Option<Vec<(NodeId, E)>> {
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
        Some(
            held.into_iter()
                .filter(|(_, e)| e.batch() > batch)
                .collect(),
        )
    }
}

/// The partition (node of the instance) of server `n`, if it belongs to server `me`'s
/// instance.
pub fn instance_part(ctx: &EngineCtx, me: NodeId, n: NodeId) -> Option<u32> {
    let p = &ctx.placement;
    (n.index() < ctx.servers() as usize && p.instance_of(n) == p.instance_of(me))
        .then(|| p.partition_of(n).0)
}

/// A node's view of its instance, and how it talks to it, for the shared steps below.
pub struct Seat<'a> {
    pub ctx: &'a EngineCtx,
    pub id: NodeId,
    /// Whether the node can reach server `n` now.
    pub reachable: &'a dyn Fn(NodeId) -> bool,
    /// Sends a rebuild message (wrapped in the protocol's own) to server `n`.
    pub send: &'a dyn Fn(NodeId, RebuildMsg),
    /// Tells every node of the instance that it is stale.
    pub tell_stale: &'a dyn Fn(),
}

/// Runs `f` with server `id`'s seat, whose rebuild messages travel on `net` wrapped in the
/// protocol's own (`wrap`).
pub fn with_seat<M: Serialize + Send + 'static, R>(
    ctx: &EngineCtx,
    id: NodeId,
    net: &dyn Transport<M>,
    wrap: impl Fn(RebuildMsg) -> M,
    tell_stale: &dyn Fn(),
    f: impl FnOnce(&Seat) -> R,
) -> R {
    let reachable = |n| net.reachable(id, n);
    let send = |to, msg| net.send(id, to, wrap(msg));
    f(&Seat {
        ctx,
        id,
        reachable: &reachable,
        send: &send,
        tell_stale,
    })
}

impl Seat<'_> {
    /// This node's partition: its place in its instance.
    fn part(&self) -> u32 {
        self.ctx.placement.partition_of(self.id).0
    }

    /// The server that is node `d` of this node's instance.
    fn peer(&self, d: u32) -> NodeId {
        self.ctx.placement.peer_of(self.id, PartitionId(d))
    }

    fn instance_part(&self, n: NodeId) -> Option<u32> {
        instance_part(self.ctx, self.id, n)
    }

    /// Where a stale instance's copies come from: the leader of group 0, if it is known and
    /// serves in another instance (its instance marks the batch every node of it copies
    /// after).
    fn copy_source(&self) -> Option<NodeId> {
        let p = &self.ctx.placement;
        let leader = p.leader(PartitionId(0))?;
        let instance = p.instance_of(leader);
        (instance != p.instance_of(self.id) && !p.is_stale(instance)).then_some(leader)
    }
}

/// A node's part in rebuilds, its instance's when it is stale and another's when it serves
/// copies: what Q-Store's and Calvin's nodes share of it.
pub struct Rebuilder<E> {
    pub state: Mutex<Rebuild<E>>,
    /// At the source (the leader of group 0): copies a stale instance wants (attempt, and
    /// the batch to copy after at the earliest), marked on the next batch due.
    wanted: Mutex<Option<(CopyFor, u64)>>,
    /// `wanted` holds a copy: read on every planning step, so without the lock.
    pending: AtomicBool,
    /// A copy is being installed.
    installing: AtomicBool,
    /// Back in service, the node replays what it held.
    replaying: AtomicBool,
}

impl<E: HeldEntry> Default for Rebuilder<E> {
    fn default() -> Self {
        Rebuilder {
            state: Mutex::new(Rebuild::new()),
            wanted: Mutex::new(None),
            pending: AtomicBool::new(false),
            installing: AtomicBool::new(false),
            replaying: AtomicBool::new(false),
        }
    }
}

impl<E: HeldEntry> Rebuilder<E> {
    /// The copy a stale instance wants after `batch`, if it is due: the source marks it.
    pub fn copy_due(&self, id: NodeId, batch: u64) -> Option<CopyFor> {
        let mut wanted = self.wanted.lock();
        match *wanted {
            Some((copy, from)) if batch >= from => {
                *wanted = None;
                self.pending.store(false, Ordering::Release);
                tracing::info!(
                    "node {id}: instance {} gets copies after batch {batch}",
                    copy.instance
                );
                Some(copy)
            }
            Some((copy, from)) => {
                tracing::debug!(
                    "node {id}: batch {batch} comes before the copies instance {} wants after \
                     batch {from}",
                    copy.instance
                );
                None
            }
            None => {
                self.pending.store(false, Ordering::Release);
                None
            }
        }
    }

    /// Whether a stale instance waits for this source to plan a batch (to mark its copy on,
    /// or to hear from every planner): an idle source plans one all the same, or the
    /// instance would wait for the next client.
    pub fn copy_wanted(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// A stale node's periodic step: tells its instance it is stale (a node that was cut off
    /// learns it so), reports what it can replay (ranks `ranks` are its group's), asks for
    /// copies (the coordinator), and hands back a whole copy to install, if one is there
    /// and none is being installed (the caller then calls [`Rebuilder::install_done`]).
    pub fn step(&self, seat: &Seat, ranks: std::ops::Range<u32>) -> Option<Copy> {
        let now = Instant::now();
        let nodes = seat.ctx.nodes();
        let all_reachable = (0..nodes).all(|d| (seat.reachable)(seat.peer(d)));
        let (report, attempt, copy) = {
            let mut r = self.state.lock();
            let report = all_reachable.then(|| r.report_due(ranks, now)).flatten();
            let attempt = (seat.part() == 0 && all_reachable)
                .then(|| seat.copy_source())
                .flatten()
                .and_then(|source| Some((source, r.attempt_due(nodes, now)?)));
            // One copy installed at a time.
            let installing = self.installing.swap(true, Ordering::AcqRel);
            let copy = if installing { None } else { r.take_complete() };
            if !installing && copy.is_none() {
                self.installing.store(false, Ordering::Release);
            }
            (report, attempt, copy)
        };
        match report {
            Some(Report::From(from)) => {
                (seat.tell_stale)();
                (seat.send)(seat.peer(0), RebuildMsg::Ready { from });
            }
            Some(Report::Starved) => {
                (seat.tell_stale)();
                if let Some(source) = seat.copy_source() {
                    (seat.send)(source, RebuildMsg::Starved);
                }
            }
            None => {}
        }
        if let Some((source, (gen, from))) = attempt {
            let instance = seat.ctx.placement.instance_of(seat.id);
            for d in 0..nodes {
                (seat.send)(seat.peer(d), RebuildMsg::Attempt { gen });
            }
            tracing::warn!(
                "node {}: instance {instance} asks node {source} for copies after batch {from} \
                 (attempt {gen})",
                seat.id
            );
            let wanted = RebuildMsg::Wanted {
                instance,
                gen,
                from,
            };
            (seat.send)(source, wanted);
        }
        copy
    }

    /// The node is back in service and replays what it held, until [`Rebuilder::end_replay`].
    /// Called before the node's stale flag is cleared: a shutdown never finds it idle in
    /// between.
    pub fn begin_replay(&self) {
        self.replaying.store(true, Ordering::Release);
    }

    pub fn replaying(&self) -> bool {
        self.replaying.load(Ordering::Acquire)
    }

    pub fn end_replay(&self) {
        self.replaying.store(false, Ordering::Release);
    }

    /// How a shutdown sees node `id` (`stale` or not) as far as rebuilding goes: `Some(true)`
    /// if it is out of the run (its instance is out of service: what it holds never
    /// finishes); `Some(false)` if it replays what it held, or is about to (another node of
    /// its instance is back in service); `None` if it serves, and its own work says.
    pub fn quiescence(&self, stale: bool, ctx: &EngineCtx, id: NodeId) -> Option<bool> {
        if self.replaying.load(Ordering::Acquire) {
            return Some(false);
        }
        let placement = &ctx.placement;
        stale.then(|| placement.is_stale(placement.instance_of(id)))
    }

    /// The copy [`Rebuilder::step`] handed out is installed, kept for later, or dropped.
    pub fn install_done(&self) {
        self.installing.store(false, Ordering::Release);
    }

    /// Handles a rebuild message from server `from`. `serves` says whether this node may
    /// serve copies (it leads group 0 and its instance is in service).
    pub fn on_msg(&self, seat: &Seat, from: NodeId, msg: RebuildMsg, serves: bool) {
        let part = seat.instance_part(from);
        let id = seat.id;
        match msg {
            RebuildMsg::Ready { from: after } => match part {
                Some(p) if seat.part() == 0 => self.state.lock().on_ready(p, after),
                _ => tracing::warn!("node {id}: a rebuild report from node {from}"),
            },
            RebuildMsg::Attempt { gen } if part == Some(0) => self.state.lock().on_attempt(gen),
            RebuildMsg::Attempt { .. } => {
                tracing::warn!("node {id}: a rebuild attempt from node {from}")
            }
            RebuildMsg::Wanted {
                instance,
                gen,
                from: after,
            } => {
                if instance < seat.ctx.placement.replicas() && seat.part() == 0 && serves {
                    tracing::info!(
                        "node {id}: instance {instance} wants copies after batch {after} or \
                         later (attempt {gen})"
                    );
                    *self.wanted.lock() = Some((CopyFor { instance, gen }, after));
                    self.pending.store(true, Ordering::Release);
                } else {
                    // The coordinator asks again later (a new attempt).
                    tracing::warn!(
                        "node {id}: instance {instance} asks node {id} for copies, but it \
                         cannot serve them (not the leader of group 0, or out of service)"
                    );
                }
            }
            // Marked like a wanted copy: the next batch is planned at once.
            RebuildMsg::Starved if serves => self.pending.store(true, Ordering::Release),
            RebuildMsg::Starved => {}
            RebuildMsg::Copy {
                gen,
                batch,
                part: piece,
            } => {
                let source = seat.ctx.placement.partition_of(from);
                if source.0 != seat.part() {
                    return tracing::warn!("node {id}: a copy of partition {source} from {from}");
                }
                let now = Instant::now();
                if let Err(why) = self.state.lock().on_copy(gen, batch, piece, now) {
                    tracing::error!("node {id}: a copy from node {from} refused: {why}");
                }
            }
            RebuildMsg::Rebuilt { gen } => match part {
                Some(p) => self.state.lock().on_rebuilt(gen, p, Instant::now()),
                None => tracing::warn!("node {id}: node {from} of another instance"),
            },
        }
    }
}

/// Sends every stale instance in `wanted` the copy of partition `part` after `batch`, with
/// the outcomes of the group's finished transactions. It waits first (at most 2 s) until
/// `answered` says every transaction up to the copy has its outcome, so the copy holds them.
#[allow(clippy::too_many_arguments)]
pub fn send_copies(
    ctx: &EngineCtx,
    part: PartitionId,
    send: &dyn Fn(NodeId, RebuildMsg),
    wanted: &[CopyFor],
    batch: u64,
    rows: Vec<Vec<u8>>,
    answered: impl Fn() -> bool,
    outcomes: impl FnOnce() -> Vec<(TxnKey, TxnOutcome)>,
) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !answered() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
    let outcomes = outcomes();
    for copy in wanted {
        let to = ctx.placement.server(copy.instance, part);
        let (rows, outcomes) = (rows.clone(), outcomes.clone());
        send_copy(send, to, (copy.gen, batch), rows, outcomes);
    }
}

/// Sends server `to` the copy of its partition after `batch` for attempt `gen`: the rows
/// (records of `checkpoint::copy_rows`), then the outcomes, then the end, in messages of
/// about `COPY_BYTES_PER_MESSAGE`.
fn send_copy(
    send: &dyn Fn(NodeId, RebuildMsg),
    to: NodeId,
    (gen, batch): (u64, u64),
    rows: Vec<Vec<u8>>,
    outcomes: Vec<(TxnKey, TxnOutcome)>,
) {
    let piece = |part| RebuildMsg::Copy { gen, batch, part };
    let records = rows.len() as u64;
    let (mut part, mut bytes) = (Vec::new(), 0);
    for record in rows {
        bytes += record.len();
        part.push(serde_bytes::ByteBuf::from(record));
        if bytes >= COPY_BYTES_PER_MESSAGE {
            send(to, piece(CopyPart::Rows(std::mem::take(&mut part))));
            bytes = 0;
        }
    }
    if !part.is_empty() {
        send(to, piece(CopyPart::Rows(part)));
    }
    for chunk in outcomes.chunks(OUTCOMES_PER_MESSAGE) {
        send(to, piece(CopyPart::Outcomes(chunk.to_vec())));
    }
    let end = CopyPart::End {
        records,
        outcomes: outcomes.len() as u64,
    };
    send(to, piece(end));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Entry(u64, u32);

    impl HeldEntry for Entry {
        fn batch(&self) -> u64 {
            self.0
        }
        fn rank(&self) -> u32 {
            self.1
        }
    }

    fn entry(batch: u64, rank: u32) -> Entry {
        Entry(batch, rank)
    }

    fn stale_with(entries: &[(u64, u32)]) -> Rebuild<Entry> {
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

    fn send_copy(r: &mut Rebuild<Entry>, gen: u64, batch: u64) -> Result<(), String> {
        let rows = CopyPart::Rows(vec![serde_bytes::ByteBuf::from(vec![1, 2])]);
        r.on_copy(gen, batch, rows, Instant::now())?;
        r.on_copy(
            gen,
            batch,
            CopyPart::End {
                records: 1,
                outcomes: 0,
            },
            Instant::now(),
        )
    }

    #[test]
    fn a_stale_node_reports_once_it_holds_every_rank_and_replays_only_after_the_copy() {
        let mut r = stale_with(&[(5, 0), (5, 1), (6, 0)]);
        let now = Instant::now();
        let starved = r.report_due(0..3, now);
        assert_eq!(
            starved,
            Some(Report::Starved),
            "rank 2 has nothing held yet"
        );
        r.hold(NodeId(1), entry(7, 2), 10);
        r.hold(NodeId(1), entry(6, 1), 10);
        assert_eq!(r.report_due(0..3, now), None, "not again so soon");
        let now = now + REPORT_EVERY;
        assert_eq!(r.report_due(0..3, now), Some(Report::From(7)));
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
        assert!(r.installed_copy(gen, 9, copy.holding));
        r.hold(NodeId(1), entry(10, 0), 10);
        assert!(!r.accepts_from(1), "node 1's messages are of the old run");
        r.on_rebuilt(gen, 0, now);
        assert!(r.serve_if_whole(2).is_none(), "node 1 has not installed");
        r.on_rebuilt(gen, 1, now);
        assert!(r.accepts_from(1));
        let replay = r.serve_if_whole(2).expect("back in service");
        let batches: Vec<(u64, u32)> = replay.iter().map(|(_, e)| (e.0, e.1)).collect();
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
        r.on_copy(2, 5, CopyPart::Rows(Vec::new()), Instant::now())
            .unwrap();
        let end = CopyPart::End {
            records: 3,
            outcomes: 0,
        };
        assert!(
            r.on_copy(2, 5, end, Instant::now()).is_err(),
            "records are missing"
        );
        assert!(r.take_complete().is_none());
    }

    #[test]
    fn an_attempt_whose_copies_arrive_is_not_given_up() {
        let mut r = stale_with(&[(3, 0)]);
        let start = Instant::now();
        r.on_ready(0, 3);
        let (gen, _) = r.attempt_due(1, start).expect("an attempt");
        r.on_attempt(gen);
        // Parts keep coming until after the retry time: no new attempt meanwhile.
        let later = start + RETRY_AFTER - Duration::from_millis(10);
        let rows = CopyPart::Rows(vec![serde_bytes::ByteBuf::from(vec![1])]);
        r.on_copy(gen, 4, rows, later).unwrap();
        assert_eq!(r.attempt_due(1, start + RETRY_AFTER), None);
        // A node's `Rebuilt` counts as progress too.
        let much_later = later + RETRY_AFTER - Duration::from_millis(10);
        r.on_rebuilt(gen, 0, much_later);
        assert_eq!(r.attempt_due(1, later + RETRY_AFTER), None);
        // Nothing more for `RETRY_AFTER`: another attempt.
        let (next, _) = r
            .attempt_due(1, much_later + RETRY_AFTER)
            .expect("a new attempt");
        assert_eq!(next, gen + 1);
    }

    /// A stale node whose log skips entries (it fell behind a compacted log) holds a gap:
    /// neither what it held nor a copy it installed before can be replayed over it. It holds
    /// anew, reports a later batch, and the coordinator asks for another copy at once.
    #[test]
    fn a_node_whose_log_skips_entries_needs_a_copy_after_them() {
        let mut r = stale_with(&[(5, 0)]);
        let now = Instant::now();
        assert_eq!(r.report_due(0..1, now), Some(Report::From(5)));
        r.on_ready(0, 5);
        let (gen, _) = r.attempt_due(1, now).expect("an attempt");
        r.on_attempt(gen);
        send_copy(&mut r, gen, 6).unwrap();
        let copy = r.take_complete().expect("whole");
        // Entries 7 to 19 are skipped while the copy is being installed.
        r.skipped();
        assert!(
            !r.installed_copy(copy.gen, copy.batch, copy.holding),
            "installed over a gap"
        );
        assert_eq!(r.phase(), Phase::Stale);
        r.hold(NodeId(0), entry(20, 0), 10);
        let later = now + REPORT_EVERY;
        assert_eq!(r.report_due(0..1, later), Some(Report::From(20)));
        r.on_ready(0, 20);
        let (next, from) = r.attempt_due(1, later).expect("another attempt at once");
        assert_eq!((next, from), (gen + 1, 20));
        r.on_attempt(next);
        assert!(send_copy(&mut r, next, 19).is_err(), "before the gap's end");
        send_copy(&mut r, next, 20).unwrap();
        let copy = r.take_complete().expect("whole");
        assert!(r.installed_copy(copy.gen, copy.batch, copy.holding));
        r.hold(NodeId(0), entry(21, 0), 10);
        r.on_rebuilt(next, 0, later);
        let replay = r.serve_if_whole(1).expect("back in service");
        let batches: Vec<u64> = replay.iter().map(|(_, e)| e.0).collect();
        assert_eq!(batches, vec![21]);
    }

    #[test]
    fn a_node_that_held_too_much_cannot_be_rebuilt() {
        let mut r = stale_with(&[]);
        r.hold(NodeId(0), entry(1, 0), MAX_HELD_BYTES + 1);
        assert_eq!(r.report_due(0..1, Instant::now()), None);
    }
}
