//! Calvin replicated: its input, the sequenced epochs, goes through each replica group's log
//! before anything runs (replication point 1 of QR-Store section 2.2, and Calvin's own
//! design: the determinism study, section 2).
//!
//! The leader of replica group `i` sequences the clients' transactions for partition `i` as
//! an unreplicated sequencer does, but instead of sending each epoch to the nodes of its
//! instance it proposes the epoch (the transactions' calls, in order) to group `i`'s log.
//! Every member of the group, the leader included, when the entry commits, dispatches that
//! epoch inside its own cluster instance exactly as an unreplicated sequencer dispatches
//! its own: every instance so schedules and runs the same epochs in the same global order
//! (epoch, partition, place) and reaches the same state. The member that sequenced a
//! transaction answers its client; the others run it for no one, keeping its outcome for a
//! resubmission (the [`Dedup`] table).
//!
//! Epochs are numbered per group and the log must hold them in order, without gaps: a
//! leader proposes each in the term it leads (`GroupMember::propose_in_term`), and a new
//! leader goes on after the last epoch its log committed (raft lets it propose only once it
//! has applied every entry of earlier terms). A member's own proposals that its log will
//! never commit (its leadership ended first) are answered `NotLeader`, so their clients
//! resubmit to the new leader.
//!
//! Fail-over. When a leader dies its group elects another member (raft), which goes on after
//! the last epoch the log committed. The dead server's cluster instance can no longer run
//! anything (every epoch needs every node of the instance): with copies, every member that
//! finds a server of its instance unreachable takes the instance out of service (*stale*)
//! at once (a group of one watches it stall instead, [`StallWatch`]); its nodes answer their
//! waiting clients `NotLeader` and hand their groups to members of other instances. A
//! resubmitted transaction that the log already holds is answered with the outcome its first
//! run had (the [`Dedup`] table, filled from the log at every member). Once the instance's
//! servers are reachable again it is rebuilt from another instance's copies and serves
//! again (see `replication::rebuild`; the scheduler copies and installs).

use super::node::CalvinNode;
use super::sequencer::{cut_epochs, dispatch, place, Accepted, Epoch, EpochSink, Sequenced};
use super::txn::roles;
use crate::protocol::checkpoint::Checkpointer;
use crate::protocol::{Admitted, TxnRequest};
use crate::replication::rebuild::HeldEntry;
use crate::replication::{Applier, Dedup, GroupLog, StallWatch};
use crossbeam_channel::{never, Receiver, RecvTimeoutError};
use parking_lot::Mutex;
use qstore_core::txn::{ProcCall, TxnKey, TxnOutcome};
use qstore_core::{NodeId, PartitionId, TxnId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long a member that does not lead waits for a stray request before it looks again.
const FOLLOWER_POLL: Duration = Duration::from_millis(5);

/// A server's seat in its partition's replica group (unused without replication).
pub(super) struct GroupSeat {
    pub member: OnceLock<Box<dyn GroupLog>>,
    /// Transactions of the group's log, by client key (see [`Dedup`]).
    pub dedup: Mutex<Dedup>,
    /// Epochs this member proposed as leader that its log has not committed yet, by (term,
    /// epoch): their requests. Given up (answered `NotLeader`) when it stops leading.
    proposed: Mutex<BTreeMap<(u64, u64), Vec<Accepted>>>,
    /// The next epoch the group's log is to commit.
    next_logged: AtomicU64,
    /// This server's cluster instance lost a server (or fell behind its log): it runs
    /// nothing more, and its members lead no group.
    stale: AtomicBool,
    /// When this server last saw its instance finish a transaction.
    watch: StallWatch,
}

impl GroupSeat {
    pub fn new(stall: Duration) -> Self {
        GroupSeat {
            member: OnceLock::new(),
            dedup: Mutex::default(),
            proposed: Mutex::default(),
            next_logged: AtomicU64::new(0),
            stale: AtomicBool::new(false),
            watch: StallWatch::new(stall),
        }
    }

    /// A new run after an installed copy of the group's epochs before `next` (see
    /// `replication::rebuild`): what the copy's group finished, and nothing proposed.
    pub fn restart_at(&self, next: u64, dedup: Dedup) {
        self.next_logged.store(next, Ordering::Release);
        let lost = std::mem::take(&mut *self.proposed.lock());
        self.give_up(lost.into_values().flatten(), None);
        *self.dedup.lock() = dedup;
    }

    /// Whether this server's instance is out of service.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// Recovery from a checkpoint: the group's epochs before `from` are in it.
    pub fn resume_at(&self, from: u64) {
        self.next_logged.fetch_max(from, Ordering::AcqRel);
    }

    /// A transaction finished here: the instance makes progress.
    pub fn progressed(&self) {
        self.watch.progressed();
    }

    /// Whether no proposal of this member awaits its log.
    pub fn idle(&self) -> bool {
        self.proposed.lock().is_empty()
    }

    /// The requests of every proposal awaiting the log, taken (at shutdown).
    pub fn take_proposed(&self) -> Vec<TxnRequest> {
        let proposed = std::mem::take(&mut *self.proposed.lock());
        proposed.into_values().flatten().map(|a| a.req).collect()
    }

    /// An entry of the group's log committed, proposed by `mine`'s member or not: returns
    /// this member's own proposal of it (if it is one), and answers `NotLeader` every
    /// proposal of this member the log will now never commit (those before it, or all when
    /// another member proposed it: entries of a later term follow it).
    fn settle_proposals(
        &self,
        mine: bool,
        key: (u64, u64),
        leader: Option<NodeId>,
    ) -> Vec<Accepted> {
        let (lost, own) = {
            let mut proposed = self.proposed.lock();
            if mine {
                let later = proposed.split_off(&key);
                let lost = std::mem::replace(&mut *proposed, later);
                (lost, proposed.remove(&key))
            } else {
                (std::mem::take(&mut *proposed), None)
            }
        };
        self.give_up(lost.into_values().flatten(), leader);
        own.unwrap_or_default()
    }

    /// Answers requests that will not run `NotLeader`, and forgets their keys (with the
    /// resubmissions that waited on them), so that they can run when resubmitted.
    fn give_up(&self, lost: impl IntoIterator<Item = Accepted>, leader: Option<NodeId>) {
        let mut dedup = self.dedup.lock();
        for a in lost {
            let waiting = dedup.forget(a.req.key);
            for req in std::iter::once(a.req).chain(waiting) {
                req.answer(TxnOutcome::NotLeader { leader });
            }
        }
    }
}

/// An epoch as the log holds it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LoggedEpoch {
    /// The term its proposer led in (see `GroupSeat::proposed`).
    term: u64,
    epoch: u64,
    txns: Vec<LoggedTxn>,
}

#[derive(Debug, Serialize, Deserialize)]
struct LoggedTxn {
    id: TxnId,
    /// The client's name for it (see [`Dedup`]).
    key: TxnKey,
    call: Arc<ProcCall>,
}

impl HeldEntry for LoggedEpoch {
    fn batch(&self) -> u64 {
        self.epoch
    }

    /// A group has one sequencer.
    fn rank(&self) -> u32 {
        0
    }
}

impl LoggedEpoch {
    fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("an epoch serializes to memory")
    }

    fn decode(bytes: &[u8]) -> Result<LoggedEpoch, String> {
        postcard::from_bytes(bytes).map_err(|e| format!("undecodable epoch: {e}"))
    }
}

/// The sequencer of a group's leader: each epoch it ends goes to the group's log.
struct Proposer<'a> {
    node: &'a CalvinNode,
    member: &'a dyn GroupLog,
    term: u64,
    open: Vec<Accepted>,
}

impl EpochSink for Proposer<'_> {
    fn add(&mut self, _: u64, a: Accepted) {
        let Accepted {
            req,
            program,
            roles,
        } = a;
        // A resubmission of a transaction the group's log holds waits for its outcome.
        if let Some(req) = self.node.group.dedup.lock().admit(req) {
            self.open.push(Accepted {
                req,
                program,
                roles,
            });
        }
    }

    fn close(&mut self, e: u64) {
        let txns = self.open.iter().map(|a| LoggedTxn {
            id: a.req.id,
            key: a.req.key,
            call: a.req.call.clone(),
        });
        let entry = LoggedEpoch {
            term: self.term,
            epoch: e,
            txns: txns.collect(),
        };
        let open = std::mem::take(&mut self.open);
        self.node.group.proposed.lock().insert((self.term, e), open);
        self.member.propose_in_term(self.term, entry.encode());
    }

    fn len(&self) -> usize {
        self.open.len()
    }
}

/// The sequencer thread of a replicated node: while its member leads the group, it cuts
/// epochs and proposes them; otherwise it sends stray requests to the leader.
pub(super) fn lead(node: &CalvinNode, queue: &mut Receiver<Admitted>, epoch_closed: &Receiver<()>) {
    let member = node
        .group
        .member
        .get()
        .expect("members join before the threads start");
    let leader = || node.ctx.placement.leader(PartitionId(node.part));
    let stale = || node.group.stale.load(Ordering::Acquire);
    while !node.stop.load(Ordering::Acquire) {
        let Some(term) = member.leading_term().filter(|_| !stale()) else {
            match queue.recv_timeout(FOLLOWER_POLL) {
                Ok(Admitted { req, .. }) => req.answer(TxnOutcome::NotLeader { leader: leader() }),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => *queue = never(),
            }
            continue;
        };
        // Every entry of earlier terms is applied (see `GroupMember::leading_term`).
        let first = node.group.next_logged.load(Ordering::Acquire);
        let mut proposer = Proposer {
            node,
            member,
            term,
            open: Vec::new(),
        };
        let still_leading = || member.leading_term() == Some(term) && !stale();
        cut_epochs(
            node,
            queue,
            epoch_closed,
            first,
            &mut proposer,
            still_leading,
        );
        node.group.give_up(proposer.open, leader());
        if stale() {
            // Resubmissions that came to wait here for a first run this instance will never
            // finish (`become_stale` answered those before them).
            for req in node.group.dedup.lock().take_waiting() {
                req.answer(TxnOutcome::NotLeader { leader: leader() });
            }
        }
    }
}

impl Applier for CalvinNode {
    fn committed(&self, proposer: NodeId, proposed_here: bool, data: &[u8]) {
        self.committed_at(0, proposer, proposed_here, data)
    }

    fn committed_at(&self, index: u64, proposer: NodeId, proposed_here: bool, data: &[u8]) {
        let mut entry = match LoggedEpoch::decode(data) {
            Ok(e) => e,
            Err(why) => return tracing::error!("node {}: {why}", self.id),
        };
        let e = entry.epoch;
        if let Some(c) = &self.ckpt {
            c.applied(index, e);
            if e < c.replay_from() {
                // The restored checkpoint holds it already.
                self.group.next_logged.fetch_max(e + 1, Ordering::AcqRel);
                return;
            }
        }
        self.serve_if_rebuilt();
        if self.group.is_stale() {
            // Still a voter of its group, but its instance runs nothing more until it is
            // rebuilt: the entry is held for then.
            match self.rebuild.state.lock().hold(proposer, entry, data.len()) {
                None => return,
                Some(back) => entry = back, // back in service meanwhile
            }
        }
        self.apply_epoch(proposed_here, entry);
    }

    fn checkpoints(&self) -> Option<&Checkpointer> {
        self.ckpt.as_deref()
    }

    fn leader_changed(&self, leader: Option<NodeId>) {
        // The sequencer follows `GroupLog::leading_term`.
        if leader == Some(self.id) {
            // The stall clock of a new leader's instance starts now.
            self.group.progressed();
        } else {
            // Proposals of a leader that lost its group may still commit, or may not: their
            // clients resubmit, and the next leader, which applies every earlier entry before
            // it takes any, runs each once (see `Dedup`).
            let lost = std::mem::take(&mut *self.group.proposed.lock());
            self.group.give_up(lost.into_values().flatten(), leader);
        }
    }

    fn should_step_aside(&self) -> bool {
        self.group.is_stale()
    }

    /// Every member watches its instance. With copies, one that finds a server of it
    /// unreachable takes it out of service at once (what was sent to that server is lost);
    /// a group of one (which only logs) gives it up when clients wait and nothing finished
    /// for `replication.stall_ms` meanwhile. A stale member works at rebuilding it.
    fn tick(&self) {
        if !self.group.is_stale() {
            let placement = &self.ctx.placement;
            let lost = || {
                (0..self.ctx.nodes())
                    .map(|p| placement.peer_of(self.id, PartitionId(p)))
                    .find(|&n| !self.net.reachable(self.id, n))
            };
            if placement.replicas() > 1 {
                if let Some(n) = lost() {
                    self.become_stale(&format!("node {n} of its instance is unreachable"));
                }
            } else {
                let busy = !self.home.lock().is_empty() || !self.group.idle();
                if let Some(why) = self.group.watch.verdict(busy, lost) {
                    self.become_stale(&why);
                }
            }
        }
        if self.group.is_stale() {
            self.rebuild_step();
        }
    }

    fn fell_behind(&self) {
        self.rebuild.state.lock().skipped();
        self.become_stale(
            "it fell behind its group's compacted log (it is rebuilt from a copy of the \
             partition)",
        );
    }
}

impl CalvinNode {
    /// A stale node's periodic step of rebuilding (on its member's thread): the shared steps
    /// (see `Rebuilder::step`); a whole copy goes to the scheduler, which installs it.
    fn rebuild_step(&self) {
        if let Some(copy) = self.with_seat(|seat| self.rebuild.step(seat, 0..1)) {
            *self.to_install.lock() = Some(copy);
        }
        self.serve_if_rebuilt();
    }

    /// Back in service once every node of the instance installed the same copy: dispatches
    /// the epochs held after it, in log order (on the member's thread, before any later
    /// entry).
    fn serve_if_rebuilt(&self) {
        if !self.group.is_stale() {
            return;
        }
        let held = {
            let mut r = self.rebuild.state.lock();
            let Some(held) = r.serve_if_whole(self.ctx.nodes()) else {
                return;
            };
            self.rebuild.begin_replay();
            self.group.stale.store(false, Ordering::Release);
            held
        };
        let placement = &self.ctx.placement;
        placement.mark_rebuilt(placement.instance_of(self.id));
        tracing::warn!(
            "node {}: rebuilt, back in service; replaying {} epochs of its group's log",
            self.id,
            held.len()
        );
        self.group.progressed();
        for (_, entry) in held {
            self.apply_epoch(false, entry);
        }
        self.rebuild.end_replay();
    }

    /// Dispatches epoch `entry` of the group's log inside this server's instance.
    fn apply_epoch(&self, proposed_here: bool, entry: LoggedEpoch) {
        let e = entry.epoch;
        let next = self.group.next_logged.load(Ordering::Acquire);
        if e != next {
            // A proposer numbers its epochs after what its log committed, in one term: this
            // cannot happen unless members disagree on the log.
            return tracing::error!(
                "node {}: the log committed epoch {e} of partition {}, expected {next}: skipped",
                self.id,
                self.part
            );
        }
        let leader = self.ctx.placement.leader(PartitionId(self.part));
        let own = self
            .group
            .settle_proposals(proposed_here, (entry.term, e), leader);
        let mut epoch = Epoch::new(self.ctx.nodes());
        let same = own.len() == entry.txns.len()
            && own.iter().zip(&entry.txns).all(|(a, t)| a.req.id == t.id);
        if same {
            for (idx, a) in own.into_iter().enumerate() {
                place(self, &mut epoch, e, Sequenced::accepted(idx as u32, a));
            }
        } else {
            if !own.is_empty() {
                tracing::error!(
                    "node {}: its proposal of epoch {e} differs from what the log committed",
                    self.id
                );
                self.group.give_up(own, leader);
            }
            self.place_logged(&mut epoch, e, entry.txns);
        }
        dispatch(self, &mut epoch, e);
        self.group.next_logged.store(e + 1, Ordering::Release);
    }

    /// Takes this server's cluster instance out of the run: it can no longer run its epochs
    /// (a server of it is lost), so its copies fall behind. Every node of the instance is
    /// told; each answers its waiting clients `NotLeader` (they resubmit to the new leader,
    /// whose instance ran, or will run, whatever the log committed) and its members give
    /// their groups away. Each holds what its log commits until its instance is rebuilt
    /// from another's copies (see `replication::rebuild`).
    pub fn become_stale(&self, why: &str) {
        let mut rebuild = self.rebuild.state.lock();
        if self.group.stale.swap(true, Ordering::AcqRel) {
            return;
        }
        rebuild.go_stale();
        drop(rebuild);
        let placement = &self.ctx.placement;
        let instance = placement.instance_of(self.id);
        placement.mark_stale(instance);
        tracing::error!(
            "node {} (instance {instance}): stale, out of the run until rebuilt: {why}",
            self.id
        );
        self.tell_stale();
        let outcome = TxnOutcome::NotLeader {
            leader: placement.leader(PartitionId(self.part)),
        };
        let mut waiting = self.group.dedup.lock().take_waiting();
        // The transactions stay (acknowledgements may still come); their clients go.
        waiting.extend(
            self.home
                .lock()
                .values_mut()
                .filter_map(|t| t.client.take()),
        );
        waiting.extend(self.group.take_proposed());
        waiting.extend(self.queue.try_iter().map(|a| a.req));
        for req in waiting {
            req.answer(outcome.clone());
        }
    }

    /// Another member sequenced these transactions: this member builds their programs from
    /// their calls (procedures are deterministic) and places them for no client.
    fn place_logged(&self, epoch: &mut Epoch, e: u64, txns: Vec<LoggedTxn>) {
        let ctx = &*self.ctx;
        for (idx, t) in txns.into_iter().enumerate() {
            self.group.dedup.lock().running(t.key);
            let program = match ctx.catalog.program(&t.call) {
                Ok(p) => p,
                Err(err) => {
                    tracing::error!(
                        "node {}: cannot build the program of {} from the log (do all nodes run \
                         the same workload?): {err}",
                        self.id,
                        t.id
                    );
                    continue;
                }
            };
            let roles = roles(&program, &ctx.pmap, self.part);
            let t = Sequenced {
                idx: idx as u32,
                id: t.id,
                call: t.call,
                key: t.key,
                program,
                roles,
                client: None,
            };
            place(self, epoch, e, t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::txn::{ProcId, Value};

    #[test]
    fn an_epoch_survives_the_log_and_garbage_is_refused() {
        let entry = LoggedEpoch {
            term: 3,
            epoch: 17,
            txns: vec![LoggedTxn {
                id: TxnId(5),
                key: TxnKey { session: 1, seq: 2 },
                call: Arc::new(ProcCall {
                    proc: ProcId(4),
                    args: vec![Value::Int(9)],
                }),
            }],
        };
        let back = LoggedEpoch::decode(&entry.encode()).unwrap();
        assert_eq!((back.term, back.epoch), (3, 17));
        assert_eq!(back.txns[0].id, TxnId(5));
        assert_eq!(back.txns[0].key, TxnKey { session: 1, seq: 2 });
        assert_eq!(back.txns[0].call, entry.txns[0].call);
        assert!(LoggedEpoch::decode(&[0xff; 3]).is_err());
    }

    /// A member's proposals of (term, epoch) `key`s, each one transaction whose answers go to
    /// `tx`.
    fn proposals(
        seat: &GroupSeat,
        keys: &[(u64, u64)],
        tx: &crossbeam_channel::Sender<crate::protocol::TxnResponse>,
    ) {
        let call = Arc::new(ProcCall {
            proc: ProcId(0),
            args: Vec::new(),
        });
        for &(term, epoch) in keys {
            let mut req = TxnRequest::new(TxnId(epoch), call.clone(), tx.clone());
            req.key = TxnKey {
                session: 1,
                seq: epoch,
            };
            let req = seat.dedup.lock().admit(req).expect("a new key");
            let a = Accepted {
                req,
                program: Default::default(),
                roles: super::super::txn::Roles {
                    participants: vec![0],
                    executing: vec![0],
                },
            };
            seat.proposed.lock().insert((term, epoch), vec![a]);
        }
    }

    #[test]
    fn proposals_the_log_will_never_commit_are_answered_not_leader_and_forgotten() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let seat = GroupSeat::new(Duration::from_secs(1));
        proposals(&seat, &[(1, 5), (1, 6), (3, 7)], &tx);
        // The log commits this member's (1, 6): (1, 5) of the same member came before it and
        // is lost; (3, 7) may still come.
        let own = seat.settle_proposals(true, (1, 6), Some(NodeId(4)));
        assert_eq!(own.len(), 1);
        assert_eq!(own[0].req.id, TxnId(6));
        let lost = rx.try_recv().unwrap();
        assert_eq!(lost.id, TxnId(5));
        assert_eq!(
            lost.outcome,
            TxnOutcome::NotLeader {
                leader: Some(NodeId(4))
            }
        );
        assert!(rx.try_recv().is_err());
        assert!(!seat.idle());
        // Another member's entry commits: every proposal left is lost.
        assert!(seat.settle_proposals(false, (4, 7), None).is_empty());
        assert_eq!(rx.try_recv().unwrap().id, TxnId(7));
        assert!(seat.idle());
        // Their keys are forgotten: a resubmission runs.
        let mut again = TxnRequest::new(TxnId(9), own[0].req.call.clone(), tx.clone());
        again.key = TxnKey { session: 1, seq: 5 };
        assert!(seat.dedup.lock().admit(again).is_some());
    }
}
