//! One server's seat in its replica group: a thread driving raft (TiKV's raft-rs) for leader
//! election and log replication. raft-rs is a state machine: this thread ticks it, steps it
//! with the messages other members sent, proposes what the protocol replicates, and carries
//! out each `Ready` (append to the [`LogStore`], send messages over the protocol's transport,
//! hand committed entries to the protocol's [`Applier`]).

use super::log::LogStore;
use super::{codec, ReplMsg, MAX_RAFT_MESSAGE};
use crate::protocol::checkpoint::Checkpointer;
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use protobuf::Message as _;
use qstore_core::config::{ReplicationCompression, ReplicationConfig};
use qstore_core::placement::Placement;
use qstore_core::{NodeId, QError};
use raft::eraftpb::{Entry, EntryType, Message, MessageType};
use raft::{RawNode, StateRole};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Applied entries a member lets pile up before it forgets them.
const COMPACT_EVERY: u64 = 256;
/// Entries a leader keeps for a member that has been silent for an election timeout (see
/// `Driver::compact`): it bounds what a dead member costs.
const SILENT_SLACK: u64 = 8192;

/// What the protocol does with its group's log.
pub trait Applier: Send + Sync + 'static {
    /// An entry committed in the log, in log order, on every member. `proposer` is the member
    /// that proposed it; `proposed_here` says whether this member did, since its process
    /// started (a leader may act on its proposals before they commit). An entry a restarted
    /// member replays from its data directory was not proposed here, whoever proposed it:
    /// nothing of what its proposer did survived the restart.
    fn committed(&self, proposer: NodeId, proposed_here: bool, data: &[u8]);
    /// [`Applier::committed`], told the entry's index in the log as well (a protocol whose
    /// checkpoints let the log forget entries says which by index: see
    /// [`Applier::compactable_before`]).
    fn committed_at(&self, index: u64, proposer: NodeId, proposed_here: bool, data: &[u8]) {
        let _ = index;
        self.committed(proposer, proposed_here, data)
    }
    /// The protocol's checkpoints, if it keeps any: what lets its log forget entries. (Only
    /// the crate's own protocols keep checkpoints, hence a crate-private type here.)
    #[allow(private_interfaces)]
    fn checkpoints(&self) -> Option<&Checkpointer> {
        None
    }
    /// For a log a restarted member replays (see [`LogStore::replayed_on_restart`]): the
    /// entries before this index are in checkpoints the protocol will restore instead, and
    /// may be forgotten. `None`: none may.
    fn compactable_before(&self) -> Option<u64> {
        self.checkpoints()
            .and_then(Checkpointer::compactable_before)
    }
    /// A restarted member's log begins at entry `first` (1: it is whole): whether the
    /// protocol can recover from it (the entries before must be in what it restored).
    fn log_starts_at(&self, first: u64) -> Result<(), String> {
        match self.checkpoints() {
            Some(c) => Checkpointer::log_starts_at(Some(c), first),
            None if first <= 1 => Ok(()),
            None => Err(format!(
                "its group log starts at entry {first}, and the protocol has nothing that \
                 holds the entries before"
            )),
        }
    }
    /// The member learnt who leads the group now (`None`: an election is under way).
    fn leader_changed(&self, leader: Option<NodeId>);
    /// Asked of a leading member at every tick: whether it should hand the leadership to
    /// another member (its cluster instance can no longer serve, see the protocol).
    fn should_step_aside(&self) -> bool {
        false
    }
    /// Called at every tick on every member, whatever its role (a follower may have to give
    /// up its instance too).
    fn tick(&self) {}
    /// The member came back behind what its group's log still holds and skipped to a
    /// snapshot of the log: the entries in between never reach `committed`. (The log's
    /// snapshots hold no protocol state yet.)
    fn fell_behind(&self) {}
}

/// How members send each other raft messages: over the protocol's transport.
pub type Outbox = Arc<dyn Fn(NodeId, ReplMsg) + Send + Sync>;

enum Input {
    /// A payload, the codec byte that says how it is compressed, and the term in which the
    /// proposer means it (`None`: whatever the term).
    Propose(u8, Vec<u8>, Option<u64>),
    Step(NodeId, ReplMsg),
}

/// Ticks a leader waits for a leadership transfer before it tries another member.
const TRANSFER_TICKS: u32 = 50;

/// A server's member of its replica group.
pub struct GroupMember {
    me: NodeId,
    /// How this member compresses what it proposes.
    compression: ReplicationCompression,
    inputs: Mutex<Option<Sender<Input>>>,
    /// Whether every entry this member knows of is committed and applied everywhere it
    /// can tell (see `Driver::settled`).
    settled: Arc<AtomicBool>,
    /// Entries the member's log holds.
    retained: Arc<AtomicU64>,
    /// The term in which the member leads its group and may propose (see
    /// `Driver::may_propose`); 0 when it may not.
    leading: Arc<AtomicU64>,
    /// The index of the last entry it applied, and of the last it knows committed.
    position: Arc<[AtomicU64; 2]>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// raft numbers members from 1.
fn raft_id(n: NodeId) -> u64 {
    n.0 as u64 + 1
}

fn node_of(raft_id: u64) -> Option<NodeId> {
    (raft_id > 0).then(|| NodeId((raft_id - 1) as u32))
}

impl GroupMember {
    /// Starts `me`'s member of its partition's group. With `campaign`, it calls an election
    /// at once (instance 0's members do, so a cluster has leaders without waiting for an
    /// election timeout).
    pub fn start(
        me: NodeId,
        placement: Arc<Placement>,
        cfg: &ReplicationConfig,
        log: impl LogStore,
        outbox: Outbox,
        applier: Arc<dyn Applier>,
        campaign: bool,
    ) -> Result<GroupMember, QError> {
        let partition = placement.partition_of(me);
        let members: Vec<NodeId> = placement.group(partition).collect();
        let config = raft::Config {
            id: raft_id(me),
            heartbeat_tick: cfg.heartbeat_ticks as usize,
            election_tick: cfg.election_ticks as usize,
            max_size_per_msg: MAX_RAFT_MESSAGE as u64 / 2,
            max_inflight_msgs: 256,
            // A member that hears no heartbeat first asks whether it could win: a member cut
            // off for a while does not depose a working leader when it comes back.
            pre_vote: true,
            check_quorum: true,
            ..Default::default()
        };
        config
            .validate()
            .map_err(|e| QError::Other(format!("replication settings: {e}")))?;
        let logger = slog::Logger::root(TracingDrain, slog::o!("node" => me.0));
        let recovered_term = raft::Storage::initial_state(&log)
            .map_err(|e| QError::Other(format!("node {me}: cannot read its group log: {e}")))?
            .hard_state
            .term;
        if log.replayed_on_restart() {
            let first = raft::Storage::first_index(&log)
                .map_err(|e| QError::Other(format!("node {me}: cannot read its group log: {e}")))?;
            applier
                .log_starts_at(first)
                .map_err(|why| QError::Other(format!("node {me}: {why}")))?;
        }
        let mut raw = RawNode::new(&config, log, &logger)
            .map_err(|e| QError::Other(format!("node {me}: cannot start its raft member: {e}")))?;
        if campaign {
            raw.campaign()
                .map_err(|e| QError::Other(format!("node {me}: cannot campaign: {e}")))?;
        }
        let (tx, rx) = unbounded();
        let settled = Arc::new(AtomicBool::new(false));
        let retained = Arc::new(AtomicU64::new(0));
        let leading = Arc::new(AtomicU64::new(0));
        let position = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let driver = Driver {
            retained: retained.clone(),
            leading: leading.clone(),
            position: position.clone(),
            term_start: u64::MAX,
            stepping_aside: None,
            me,
            members,
            raw,
            outbox,
            applier,
            placement,
            settled: settled.clone(),
            tick: Duration::from_millis(cfg.tick_ms as u64),
            leader: None,
            recovered_term,
        };
        let thread = std::thread::Builder::new()
            .name(format!("r{}", me.0))
            .spawn(move || driver.run(rx))
            .map_err(|e| QError::Other(format!("cannot start a replication thread: {e}")))?;
        Ok(GroupMember {
            me,
            compression: cfg.compression,
            inputs: Mutex::new(Some(tx)),
            settled,
            retained,
            leading,
            position,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Proposes an entry to the group's log (this member should lead it), compressed on the
    /// calling thread as the settings say.
    pub fn propose(&self, data: Vec<u8>) {
        self.send_proposal(data, None);
    }

    /// Proposes an entry to the group's log only if this member still leads in `term` (see
    /// [`GroupMember::leading_term`]) when its turn comes: a proposer that numbers its
    /// entries (Calvin's epochs) so never leaves a gap by a proposal lost between two that
    /// were not. A lost proposal of the term makes the member step down (its group elects a
    /// leader anew), so the term's later proposals are lost too.
    pub fn propose_in_term(&self, term: u64, data: Vec<u8>) {
        self.send_proposal(data, Some(term));
    }

    fn send_proposal(&self, data: Vec<u8>, term: Option<u64>) {
        let (codec, payload) = codec::pack(self.compression, data);
        if let Some(tx) = &*self.inputs.lock() {
            let _ = tx.send(Input::Propose(codec, payload, term));
        }
    }

    /// A raft message from member `from`, as the network delivered it.
    pub fn receive(&self, from: NodeId, msg: ReplMsg) {
        if let Some(tx) = &*self.inputs.lock() {
            let _ = tx.send(Input::Step(from, msg));
        }
    }

    /// Whether nothing is left to replicate or apply that this member can see: as leader,
    /// every entry is committed, on every member, and every member knows it; as follower,
    /// every entry it knows committed is applied.
    pub fn settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Whether this member leads its group and has applied every entry of the terms before
    /// its own: what it proposes now follows everything the group's log committed (a new
    /// leader continues after its predecessor's last committed entry).
    pub fn leading(&self) -> bool {
        self.leading_term().is_some()
    }

    /// The term in which this member leads (see [`GroupMember::leading`]).
    pub fn leading_term(&self) -> Option<u64> {
        Some(self.leading.load(Ordering::Acquire)).filter(|&t| t != 0)
    }

    /// The index of the last entry the member applied, and of the last it knows committed.
    pub fn position(&self) -> (u64, u64) {
        let [applied, committed] = &*self.position;
        (
            applied.load(Ordering::Acquire),
            committed.load(Ordering::Acquire),
        )
    }

    /// Entries the member's log holds (applied ones are forgotten, see `Driver::compact`).
    pub fn retained(&self) -> u64 {
        self.retained.load(Ordering::Relaxed)
    }

    /// Stops the member's thread.
    pub fn stop(&self) {
        self.inputs.lock().take();
        if let Some(t) = self.thread.lock().take() {
            if t.join().is_err() {
                tracing::error!("node {}: its replication thread panicked", self.me);
            }
        }
    }
}

struct Driver<L: LogStore> {
    me: NodeId,
    members: Vec<NodeId>,
    raw: RawNode<L>,
    outbox: Outbox,
    applier: Arc<dyn Applier>,
    placement: Arc<Placement>,
    settled: Arc<AtomicBool>,
    retained: Arc<AtomicU64>,
    leading: Arc<AtomicU64>,
    position: Arc<[AtomicU64; 2]>,
    /// Index of the first entry of this member's term as leader (raft appends an empty one
    /// on election); `u64::MAX` while it does not lead.
    term_start: u64,
    /// A leadership transfer under way: to whom, and the ticks left before trying another.
    stepping_aside: Option<(NodeId, u32)>,
    tick: Duration,
    leader: Option<NodeId>,
    /// The term the member's log was in when its process started: entries of that term or
    /// before were proposed by an earlier process (a member leads only after an election,
    /// in a later term).
    recovered_term: u64,
}

impl<L: LogStore> Driver<L> {
    fn run(mut self, inputs: Receiver<Input>) {
        let mut next_tick = Instant::now() + self.tick;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match inputs.recv_timeout(wait) {
                Ok(input) => self.take(input),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            // Whatever else arrived meanwhile goes into the same ready.
            for input in inputs.try_iter() {
                self.take(input);
            }
            let now = Instant::now();
            if now >= next_tick {
                self.raw.tick();
                self.applier.tick();
                self.step_aside_if_asked();
                // Also when idle: the last ready may have come before the entries it applied
                // (or the followers' acknowledgements) allowed a compaction.
                self.compact();
                next_tick = now + self.tick;
            }
            if self.raw.has_ready() {
                if let Err(why) = self.on_ready() {
                    // It can no longer keep what it promises its group: it leaves it (the
                    // others go on without it, as without a dead member).
                    tracing::error!("node {}: {why}; it leaves its replica group", self.me);
                    self.leading.store(0, Ordering::Release);
                    self.settled.store(false, Ordering::Release);
                    return;
                }
                self.compact();
            }
            self.settled.store(self.is_settled(), Ordering::Release);
            let term = if self.may_propose() {
                self.raw.raft.term
            } else {
                0
            };
            self.leading.store(term, Ordering::Release);
            let log = &self.raw.raft.raft_log;
            self.position[0].store(log.applied, Ordering::Release);
            self.position[1].store(log.committed, Ordering::Release);
            let store = self.raw.store();
            if let (Ok(first), Ok(last)) = (store.first_index(), store.last_index()) {
                let retained = (last + 1).saturating_sub(first);
                self.retained.store(retained, Ordering::Relaxed);
            }
        }
    }

    fn take(&mut self, input: Input) {
        match input {
            Input::Propose(codec, data, term) => {
                if term.is_some_and(|t| t != self.raw.raft.term || !self.may_propose()) {
                    // Meant for a term this member no longer leads in: the protocol learns
                    // it lost when another member's entry commits.
                    tracing::debug!("node {}: a proposal of an earlier term dropped", self.me);
                    return;
                }
                if self.raw.raft.state != StateRole::Leader {
                    // raft would forward it to the leader, whose log would then hold it after
                    // the leader's own entry for the same slot of the global order: what a
                    // member planned while it led is lost with its leadership.
                    tracing::debug!("node {}: a proposal dropped: not the leader", self.me);
                    return;
                }
                // The entry's context: its proposer, and how its data is compressed.
                let mut context = self.me.0.to_le_bytes().to_vec();
                context.push(codec);
                if let Err(e) = self.raw.propose(context, data) {
                    // A member that lost its leadership meanwhile: the protocol answers the
                    // proposal's transactions `NotLeader` (see `Applier::leader_changed`).
                    tracing::error!("node {}: a proposal was dropped: {e}", self.me);
                    if term.is_some() && self.raw.raft.state == StateRole::Leader {
                        // Its later proposals of this term must not follow it into the log.
                        let t = self.raw.raft.term;
                        self.raw.raft.become_follower(t, raft::INVALID_ID);
                    }
                }
            }
            Input::Step(from, msg) => match self.check(from, &msg) {
                Ok(mut m) => {
                    self.keep_heartbeat_within_log(&mut m);
                    if let Err(e) = self.raw.step(m) {
                        tracing::debug!("node {}: raft refused a message: {e}", self.me);
                    }
                }
                Err(why) => {
                    tracing::warn!(
                        "node {}: refused a raft message from node {from}: {why}",
                        self.me
                    )
                }
            },
        }
    }

    /// A heartbeat whose commit index lies past this member's log commits nothing here
    /// (raft-rs would panic on it). A leader sends one when its progress for this member
    /// predates a restart that lost the member's log: the appends that follow find where
    /// the logs part and fill the log in, as they would for any member behind.
    fn keep_heartbeat_within_log(&self, m: &mut Message) {
        let log = &self.raw.raft.raft_log;
        if m.get_msg_type() == MessageType::MsgHeartbeat && m.commit > log.last_index() {
            m.commit = log.committed;
        }
    }

    /// Decodes a message and checks that it comes from a member of this group, to this one,
    /// and names its real sender (a node cannot speak for another).
    fn check(&self, from: NodeId, msg: &ReplMsg) -> Result<Message, String> {
        if msg.0.len() > MAX_RAFT_MESSAGE {
            return Err(format!("{} bytes is too long", msg.0.len()));
        }
        let m = Message::parse_from_bytes(&msg.0).map_err(|e| format!("undecodable: {e}"))?;
        if !self.members.contains(&from) || from == self.me {
            return Err("the sender is not another member of this group".into());
        }
        if m.from != raft_id(from) || m.to != raft_id(self.me) {
            return Err(format!(
                "it claims to be from member {} to member {}",
                m.from, m.to
            ));
        }
        if raft::raw_node::is_local_msg(m.get_msg_type()) {
            return Err("a local message cannot come from the network".into());
        }
        Ok(m)
    }

    /// Carries out a ready: raft-rs's order (send what need not wait, persist, apply,
    /// advance, then what needed the log persisted). A write the log could not make is an
    /// error: what raft would send next depends on it.
    fn on_ready(&mut self) -> Result<(), String> {
        let mut ready = self.raw.ready();
        if let Some(ss) = ready.ss() {
            self.observe_leader(ss.leader_id, ss.raft_state);
        }
        self.send(ready.take_messages());
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            if let Err(e) = self.raw.mut_store().apply_snapshot(snapshot) {
                tracing::error!("node {}: cannot apply a snapshot: {e}", self.me);
            }
            // The entries the snapshot skips never reach the protocol.
            self.applier.fell_behind();
        }
        self.apply(ready.take_committed_entries());
        if !ready.entries().is_empty() {
            let store = self.raw.mut_store();
            store
                .append(ready.entries())
                .map_err(|e| format!("cannot append to the log: {e}"))?;
        }
        if let Some(hs) = ready.hs() {
            let store = self.raw.mut_store();
            store
                .set_hard_state(hs.clone())
                .map_err(|e| format!("cannot record its vote and term: {e}"))?;
        }
        self.send(ready.take_persisted_messages());
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            let store = self.raw.mut_store();
            store
                .set_commit(commit)
                .map_err(|e| format!("cannot record the commit index: {e}"))?;
        }
        self.send(light.take_messages());
        self.apply(light.take_committed_entries());
        self.raw.advance_apply();
        Ok(())
    }

    /// A leader whose protocol asks it to step aside transfers the leadership to another
    /// member its log shows active, trying the next one if a transfer does not finish.
    fn step_aside_if_asked(&mut self) {
        // Raft may have won an election in this turn, before the ready that tells the
        // protocol so (`observe_leader`): the protocol is asked only once it knows it leads,
        // so that it judges its instance from then on, not by the last leader's clock.
        let leads = self.raw.raft.state == StateRole::Leader && self.leader == Some(self.me);
        if !leads || !self.applier.should_step_aside() {
            self.stepping_aside = None;
            return;
        }
        if let Some((to, ticks)) = &mut self.stepping_aside {
            if *ticks > 0 {
                *ticks -= 1;
                return;
            }
            tracing::warn!(
                "node {}: leadership transfer to node {to} timed out",
                self.me
            );
        }
        // Members after this one first, in instance order, then around: a deterministic
        // choice that moves past one that failed.
        let after = self.stepping_aside.map_or(self.me, |(to, _)| to);
        let raft = &self.raw.raft;
        let mut candidates: Vec<NodeId> = self.members.clone();
        candidates.sort_by_key(|n| (n.0 <= after.0, n.0));
        let target = candidates.into_iter().find(|&n| {
            n != self.me
                && raft
                    .prs()
                    .get(raft_id(n))
                    .is_some_and(|pr| pr.recent_active)
        });
        if let Some(to) = target {
            tracing::warn!(
                "node {}: handing the group's leadership to node {to}",
                self.me
            );
            self.raw.transfer_leader(raft_id(to));
            self.stepping_aside = Some((to, TRANSFER_TICKS));
        }
    }

    /// Leader, not handing over, and every entry of earlier terms applied.
    fn may_propose(&self) -> bool {
        let raft = &self.raw.raft;
        raft.state == StateRole::Leader
            && raft.lead_transferee.is_none()
            && raft.raft_log.applied >= self.term_start
    }

    fn observe_leader(&mut self, leader_id: u64, role: StateRole) {
        self.term_start = match role {
            // raft appended its term's empty entry on election: the last one now.
            StateRole::Leader => self.raw.raft.raft_log.last_index(),
            _ => u64::MAX,
        };
        let leader = match role {
            StateRole::Leader | StateRole::Follower => node_of(leader_id),
            StateRole::Candidate | StateRole::PreCandidate => None,
        };
        if leader != self.leader {
            self.leader = leader;
            let partition = self.placement.partition_of(self.me);
            // Every member reports what it learns; the map keeps the latest word. A member
            // that saw no leader does not erase one another member reported.
            if leader.is_some() {
                self.placement.set_leader(partition, leader);
            }
            tracing::debug!("node {}: group leader is now {leader:?}", self.me);
            self.applier.leader_changed(leader);
        }
    }

    fn send(&self, msgs: Vec<Message>) {
        for m in msgs {
            let Some(to) = node_of(m.to) else { continue };
            match m.write_to_bytes() {
                Ok(bytes) => (self.outbox)(to, ReplMsg(bytes)),
                Err(e) => tracing::error!("node {}: cannot encode a raft message: {e}", self.me),
            }
        }
    }

    fn apply(&self, entries: Vec<Entry>) {
        for e in entries {
            // A new leader's empty entry, and membership changes (none are proposed): nothing
            // for the protocol.
            if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
                continue;
            }
            let Some((proposer, codec)) = <[u8; 5]>::try_from(&e.context[..])
                .ok()
                .map(|c| (NodeId(u32::from_le_bytes([c[0], c[1], c[2], c[3]])), c[4]))
            else {
                tracing::error!("node {}: a log entry without its proposer", self.me);
                continue;
            };
            match codec::unpack(codec, &e.data, MAX_RAFT_MESSAGE) {
                Ok(data) => {
                    let here = proposer == self.me && e.term > self.recovered_term;
                    self.applier.committed_at(e.index, proposer, here, &data)
                }
                Err(why) => tracing::error!("node {}: an unreadable log entry: {why}", self.me),
            }
        }
    }

    /// Forgets applied entries no active member needs any more, once there are
    /// `COMPACT_EVERY` of them: a log that keeps every batch grows by the whole workload.
    /// The leader keeps what its slowest recently active member lacks, and at most
    /// `SILENT_SLACK` entries more for a member silent for an election timeout (dead, or cut
    /// off): otherwise the log would grow for as long as it is away. Should it come back
    /// behind the compacted log, it is sent a snapshot, and its protocol is told
    /// (`Applier::fell_behind`).
    fn compact(&mut self) {
        let raft = &self.raw.raft;
        let mut upto = raft.raft_log.applied;
        if self.raw.store().replayed_on_restart() {
            // Only what the protocol's checkpoints hold: the rest is replayed on restart.
            match self.applier.compactable_before() {
                Some(covered) => upto = upto.min(covered),
                None => return,
            }
        }
        if raft.state == StateRole::Leader {
            // A silent member still keeps `SILENT_SLACK` entries: one that was only slow for
            // a moment catches up from the log.
            let needs = |(id, pr): (&u64, &raft::Progress)| {
                let active = pr.recent_active || *id == raft.id;
                let slack = if active { 0 } else { SILENT_SLACK };
                pr.matched.saturating_add(slack)
            };
            let slowest = raft.prs().iter().map(needs).min();
            upto = upto.min(slowest.unwrap_or(0));
        }
        let first = self.raw.store().first_index().unwrap_or(upto);
        if upto >= first + COMPACT_EVERY {
            if let Err(e) = self.raw.mut_store().compact(upto) {
                tracing::error!("node {}: cannot compact the log: {e}", self.me);
            }
        }
    }

    fn is_settled(&self) -> bool {
        let raft = &self.raw.raft;
        let log = &raft.raft_log;
        let applied = log.applied == log.committed;
        if raft.state != StateRole::Leader {
            return applied;
        }
        let last = log.last_index();
        applied
            && log.committed == last
            && raft
                .prs()
                .iter()
                .all(|(_, pr)| pr.matched == last && pr.committed_index >= last)
    }
}

/// Hands raft-rs's log records to `tracing`: elections and warnings at debug and warn level.
struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{}", record.msg())
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{}", record.msg()),
            slog::Level::Info => tracing::debug!(target: "raft", "{}", record.msg()),
            slog::Level::Debug | slog::Level::Trace => {
                tracing::trace!(target: "raft", "{}", record.msg())
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::{DiskLog, MemLog};
    use qstore_log::FsyncPolicy;
    use std::sync::OnceLock;

    /// Records what a member applied.
    #[derive(Default)]
    struct Log {
        entries: Mutex<Vec<(NodeId, Vec<u8>)>>,
    }

    impl Applier for Log {
        fn committed(&self, proposer: NodeId, _: bool, data: &[u8]) {
            self.entries.lock().push((proposer, data.to_vec()));
        }
        fn leader_changed(&self, _: Option<NodeId>) {}
    }

    /// A group of three members (partition 0 of a 1-partition cluster with 3 copies), whose
    /// messages go straight to each other's `receive`.
    fn group() -> (Arc<Placement>, Vec<Arc<GroupMember>>, Vec<Arc<Log>>) {
        group_on(|voters, _| MemLog::new(voters))
    }

    /// [`group`], member `n` keeping its log in `log(voters, n)`.
    fn group_on<L: LogStore>(
        log: impl Fn(Vec<u64>, u32) -> L,
    ) -> (Arc<Placement>, Vec<Arc<GroupMember>>, Vec<Arc<Log>>) {
        group_with(log, |_| Arc::default())
    }

    /// [`group_on`], member `n` applying with `applier(n)`.
    fn group_with<L: LogStore, A: Applier + 'static>(
        log: impl Fn(Vec<u64>, u32) -> L,
        applier: impl Fn(NodeId) -> Arc<A>,
    ) -> (Arc<Placement>, Vec<Arc<GroupMember>>, Vec<Arc<A>>) {
        let placement = Arc::new(Placement::new(1, 3));
        let members: Arc<Vec<OnceLock<Arc<GroupMember>>>> =
            Arc::new((0..3).map(|_| OnceLock::new()).collect());
        let logs: Vec<Arc<A>> = (0..3).map(|n| applier(NodeId(n))).collect();
        let cfg = ReplicationConfig {
            factor: 3,
            tick_ms: 2,
            ..Default::default()
        };
        for n in 0..3u32 {
            let (me, to_members) = (NodeId(n), members.clone());
            let outbox: Outbox = Arc::new(move |to: NodeId, msg| {
                if let Some(m) = to_members[to.index()].get() {
                    m.receive(me, msg);
                }
            });
            let voters = placement.group(qstore_core::PartitionId(0));
            let log = log(voters.map(raft_id).collect(), n);
            let m = GroupMember::start(
                me,
                placement.clone(),
                &cfg,
                log,
                outbox,
                logs[n as usize].clone(),
                n == 0,
            )
            .unwrap();
            let _ = members[n as usize].set(Arc::new(m));
        }
        let members = members.iter().map(|m| m.get().unwrap().clone()).collect();
        (placement, members, logs)
    }

    /// The leader partition 0's group elects (waiting for it).
    fn elected(placement: &Placement) -> NodeId {
        let p0 = qstore_core::PartitionId(0);
        wait_for("a leader", || placement.leader(p0).is_some());
        placement.leader(p0).unwrap()
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_group_elects_a_leader_and_every_member_applies_its_proposals_in_order() {
        let (placement, members, logs) = group();
        let leader = elected(&placement);
        for i in 0..50u8 {
            members[leader.index()].propose(vec![i; 1 + i as usize]);
        }
        wait_for("every entry applied everywhere", || {
            logs.iter().all(|l| l.entries.lock().len() == 50)
        });
        wait_for("the group to settle", || {
            members.iter().all(|m| m.settled())
        });
        // Applied entries are forgotten once enough pile up.
        for i in 0..2 * COMPACT_EVERY {
            members[leader.index()].propose(i.to_le_bytes().to_vec());
        }
        let all = 50 + 2 * COMPACT_EVERY as usize;
        wait_for("every entry applied everywhere", || {
            logs.iter().all(|l| l.entries.lock().len() == all)
        });
        wait_for("the group to settle", || {
            members.iter().all(|m| m.settled())
        });
        wait_for("applied entries forgotten everywhere", || {
            members.iter().all(|m| m.retained() <= COMPACT_EVERY + 1)
        });
        for l in &logs {
            let entries = l.entries.lock();
            for (i, (proposer, data)) in entries.iter().take(50).enumerate() {
                assert_eq!(*proposer, leader);
                assert_eq!(data, &vec![i as u8; 1 + i]);
            }
        }
        for m in &members {
            m.stop();
        }
    }

    /// A member that no longer leads may still propose what it planned while it led: raft
    /// must not forward that to the new leader, whose log would then hold two entries for
    /// the same slot of the global order (the second one after the new leader's own).
    #[test]
    fn a_followers_proposal_never_reaches_the_log() {
        let (placement, members, logs) = group();
        let leader = elected(&placement);
        let follower = (leader.index() + 1) % members.len();
        members[follower].propose(b"from a follower".to_vec());
        members[leader.index()].propose(b"from the leader".to_vec());
        wait_for("the leader's entry applied everywhere", || {
            logs.iter().all(|l| l.entries.lock().len() == 1)
        });
        wait_for("the group to settle", || {
            members.iter().all(|m| m.settled())
        });
        for l in &logs {
            let entries = l.entries.lock();
            assert_eq!(entries.len(), 1, "only the leader's proposal is logged");
            assert_eq!(entries[0].1, b"from the leader");
        }
    }

    #[test]
    fn a_dead_member_pins_a_bounded_part_of_the_log() {
        let (placement, members, logs) = group();
        let leader = elected(&placement);
        let (dead, alive) = (NodeId((leader.0 + 1) % 3), NodeId((leader.0 + 2) % 3));
        members[dead.index()].stop();
        // Long enough for the leader to see it silent (an election timeout of 30 ticks).
        std::thread::sleep(Duration::from_millis(200));
        let n = SILENT_SLACK + 4 * COMPACT_EVERY;
        for i in 0..n {
            members[leader.index()].propose(i.to_le_bytes().to_vec());
        }
        wait_for("every entry applied by the live members", || {
            logs[alive.index()].entries.lock().len() == n as usize
        });
        wait_for("the leader to compact past the dead member", || {
            members[leader.index()].retained() <= SILENT_SLACK + 2 * COMPACT_EVERY
        });
        for m in &members {
            m.stop();
        }
    }

    #[test]
    fn forged_and_garbled_messages_are_refused_and_the_group_goes_on() {
        let (placement, members, logs) = group();
        let p0 = qstore_core::PartitionId(0);
        let leader = elected(&placement);
        let follower = NodeId((leader.0 + 1) % 3);
        // Garbage, an oversized message, and a message in which node 2 speaks for node 1
        // (a vote for itself in a term far ahead, which would depose the leader if taken).
        members[follower.index()].receive(NodeId(2), ReplMsg(vec![0xff; 64]));
        members[follower.index()].receive(NodeId(2), ReplMsg(vec![0; MAX_RAFT_MESSAGE + 1]));
        let forged = raft_message(MessageType::MsgRequestVote, NodeId(1), follower, |m| {
            m.term = 1_000;
        });
        for m in &members {
            m.receive(NodeId(2), forged.clone());
            // From outside the group.
            m.receive(NodeId(7), forged.clone());
        }
        goes_on(&members, &logs, leader);
        assert_eq!(placement.leader(p0), Some(leader));
    }

    /// A raft message of `kind` from `from` to `to`, with `fill`'s fields, as a peer sends it.
    fn raft_message(
        kind: MessageType,
        from: NodeId,
        to: NodeId,
        fill: impl FnOnce(&mut Message),
    ) -> ReplMsg {
        let mut m = Message::default();
        m.set_msg_type(kind);
        m.from = raft_id(from);
        m.to = raft_id(to);
        fill(&mut m);
        ReplMsg(m.write_to_bytes().unwrap())
    }

    /// Proposes one entry at `leader`, waits until every member applied it, and stops them.
    fn goes_on(members: &[Arc<GroupMember>], logs: &[Arc<Log>], leader: NodeId) {
        members[leader.index()].propose(b"after".to_vec());
        wait_for("the entry applied everywhere", || {
            logs.iter().all(|l| l.entries.lock().len() == 1)
        });
        for m in members {
            m.stop();
        }
    }

    #[test]
    fn a_heartbeat_committing_past_the_log_leaves_the_member_working() {
        let (placement, members, logs) = group();
        let leader = elected(&placement);
        let follower = NodeId((leader.0 + 1) % 3);
        // What a leader sends a member that restarted without its log.
        let beat = raft_message(MessageType::MsgHeartbeat, leader, follower, |m| {
            m.commit = 1_000;
        });
        members[follower.index()].receive(leader, beat);
        goes_on(&members, &logs, leader);
    }

    /// Members that keep their logs on disk come back from a restart of the whole group with
    /// their votes and entries: the group elects a leader again and goes on after what it
    /// committed (every member is handed the committed entries again from the start, as raft
    /// keeps no applied index).
    #[test]
    fn a_group_on_disk_logs_restarts_with_what_it_committed() {
        let base = std::env::temp_dir().join(format!("qstore-group-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let open = |voters, n: u32| {
            DiskLog::open(&base.join(format!("m{n}")), voters, FsyncPolicy::Always).unwrap()
        };
        let p0 = qstore_core::PartitionId(0);
        let (placement, members, logs) = group_on(open);
        let leader = elected(&placement);
        for i in 0..20u8 {
            members[leader.index()].propose(vec![i; 3]);
        }
        wait_for("every entry applied everywhere", || {
            logs.iter().all(|l| l.entries.lock().len() == 20)
        });
        wait_for("the group to settle", || {
            members.iter().all(|m| m.settled())
        });
        for m in &members {
            m.stop();
        }
        let before = logs[0].entries.lock().clone();

        let (placement, members, logs) = group_on(open);
        wait_for("a leader after the restart", || {
            placement.leader(p0).is_some()
        });
        let leader = placement.leader(p0).unwrap();
        members[leader.index()].propose(b"after".to_vec());
        wait_for("the old entries and the new one everywhere", || {
            logs.iter().all(|l| l.entries.lock().len() == 21)
        });
        for l in &logs {
            let entries = l.entries.lock();
            assert_eq!(entries[..20], before[..], "the committed entries, in order");
            assert_eq!(entries[20].1, b"after");
        }
        for m in &members {
            m.stop();
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A member that always asks to step aside once told it leads, and notes whether it was
    /// ever asked before it was told.
    struct Restless {
        me: NodeId,
        told: AtomicBool,
        elected: AtomicU64,
        asked_untold: AtomicU64,
    }

    impl Applier for Restless {
        fn committed(&self, _: NodeId, _: bool, _: &[u8]) {}
        fn leader_changed(&self, leader: Option<NodeId>) {
            let leads = leader == Some(self.me);
            self.told.store(leads, Ordering::SeqCst);
            if leads {
                self.elected.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn should_step_aside(&self) -> bool {
            if !self.told.load(Ordering::SeqCst) {
                self.asked_untold.fetch_add(1, Ordering::SeqCst);
            }
            true
        }
    }

    /// A protocol judges whether to step aside from what it learnt on becoming leader (its
    /// stall clock restarts then): asked earlier, in the tick that falls in the same turn as
    /// the winning vote, it judged by the last leader's clock and gave its instance up at once.
    #[test]
    fn a_member_is_asked_to_step_aside_only_once_it_knows_it_leads() {
        let (_, members, appliers) = group_with(
            |voters, _| MemLog::new(voters),
            |me| {
                Arc::new(Restless {
                    me,
                    told: AtomicBool::new(false),
                    elected: AtomicU64::new(0),
                    asked_untold: AtomicU64::new(0),
                })
            },
        );
        let elections = || -> u64 {
            appliers
                .iter()
                .map(|a| a.elected.load(Ordering::SeqCst))
                .sum()
        };
        wait_for("the leadership to move 100 times", || elections() >= 100);
        for m in &members {
            m.stop();
        }
        for a in &appliers {
            assert_eq!(
                a.asked_untold.load(Ordering::SeqCst),
                0,
                "node {} was asked before it knew it led",
                a.me
            );
        }
    }
}
