//! The coordinator side: walking a transaction's program in waves, then (two-phase) commit
//! or abort, then the answer to the client.

use super::cached::CachedRead;
use super::msg::{Age, Attempt, Body, GroupEnd, Renewal, TsRange, Vote};
use super::part::{Group, Ran};
use super::phases::{self, PhaseCosts, COMMIT, EXECUTION, PREPARE};
use super::{Cc, Node};
use crate::history::TxnTrace;
use crate::protocol::shell::NodeShell;
use crate::protocol::{reply, settle, Ending, TxnRequest};
use parking_lot::Mutex;
use qstore_core::txn::{CcAbortCause, Program, TxnOutcome, Value};
use qstore_core::{NodeId, TxnId};
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Reserving partitions one after the other (protocols that reserve).
    Reserving,
    Walking,
    Preparing,
    Committing,
    /// The client has its answer.
    Answered,
}

/// A participant: a node the transaction reached.
pub(super) struct Participant {
    node: NodeId,
    wrote: bool,
    /// In the current round (wave or commit phase): the program indices of the group sent
    /// to it, or whether it still owes an answer.
    group: Vec<u16>,
    owes: bool,
    /// Voted yes: takes part in the second phase.
    commits: bool,
}

/// A transaction this node coordinates.
pub(super) struct CoordTxn {
    req: TxnRequest,
    pub(super) program: Arc<Program>,
    pub(super) at: Attempt,
    pub(super) outputs: Vec<Value>,
    /// Per access: the wave it was sent in (0: not yet).
    pub(super) wave_of: Vec<u32>,
    /// Per access: whether it was read from the cache (its output known at once).
    pub(super) from_cache: Vec<bool>,
    wave: u32,
    remaining: usize,
    participants: Vec<Participant>,
    outstanding: usize,
    phase: Phase,
    /// The first refusal or failed check seen; acted on once the round's answers are in.
    failure: Option<GroupEnd>,
    /// Partitions to reserve, ascending, and how many are reserved.
    to_reserve: Vec<NodeId>,
    reserved: usize,
    order: u128,
    /// The intersection of the commit-timestamp ranges voted (protocols that vote ranges).
    range: Option<TsRange>,
    /// Its phases' time and traffic, if it is one of those measured.
    costs: Option<PhaseCosts>,
    /// Went through two-phase commit (its participants prepared).
    prepared: bool,
    /// Its commit decision is in the log (and stays there until every participant
    /// acknowledged).
    logged_decision: bool,
    /// The reads it took from this node's cache of other nodes' rows, the renewals of their
    /// leases it asked for at prepare, and what those reads saw (see `cached`).
    pub(super) cached: Vec<CachedRead>,
    pub(super) renewing: Vec<(NodeId, Renewal)>,
    pub(super) trace: TxnTrace,
}

/// What a coordinator decided to do, done after its transaction's lock is released (a
/// message to this node is handled at once and may come back to the same transaction).
enum Action {
    Send(NodeId, Body),
    ExecHere(Attempt, Group, Vec<(u16, Value)>),
}

impl CoordTxn {
    pub(super) fn participant(&mut self, node: NodeId) -> &mut Participant {
        let i = match self.participants.iter().position(|p| p.node == node) {
            Some(i) => i,
            None => {
                self.participants.push(Participant {
                    node,
                    wrote: false,
                    group: Vec::new(),
                    owes: false,
                    commits: false,
                });
                self.participants.len() - 1
            }
        };
        &mut self.participants[i]
    }

    /// Marks an answer from `node` in the current round; true when it was the last.
    fn answered(&mut self, node: NodeId) -> bool {
        match self.participants.iter_mut().find(|p| p.node == node) {
            Some(p) if p.owes => p.owes = false,
            _ => return false, // a duplicate or stray answer: ignore it
        }
        self.outstanding -= 1;
        self.outstanding == 0
    }

    pub(super) fn fail(&mut self, end: GroupEnd) {
        // A concurrency-control refusal wins over a failed check: the check may have run on
        // a state the transaction would not see in a complete run.
        match (&self.failure, &end) {
            (None, _) | (Some(GroupEnd::LogicAbort(_)), GroupEnd::CcAbort(_)) => {
                self.failure = Some(end)
            }
            _ => {}
        }
    }
}

impl<C: Cc> Node<C> {
    /// A client's transaction arrives at its home node.
    pub(super) fn begin(&self, req: TxnRequest) {
        let program = match self.ctx.catalog.program(&req.call) {
            Ok(p) => Arc::new(p),
            Err(e) => return reply(&req, TxnOutcome::Rejected(e.to_string())),
        };
        if let Some(throttle) = &self.throttle {
            let single = program
                .accesses
                .iter()
                .all(|a| self.ctx.node_of(self.ctx.pmap.partition_of(a.table, a.key)) == self.id);
            if throttle.refuses(single, || self.remote_waiting()) {
                let (history, trace) = (self.ctx.history.as_deref(), &TxnTrace::default());
                let ending = Ending::CcAbort(CcAbortCause::Throttled);
                return reply(
                    &req,
                    settle(history, self.id, req.id, &req.call, trace, ending),
                );
            }
        }
        let txn = req.id;
        let n = program.accesses.len();
        let mut to_reserve = Vec::new();
        if C::RESERVES_PARTITIONS {
            to_reserve = program
                .accesses
                .iter()
                .map(|a| self.node_of(a.table, a.key))
                .collect();
            to_reserve.sort_unstable();
            to_reserve.dedup();
        }
        let mut t = CoordTxn {
            at: Attempt {
                age: Age {
                    birth_us: req.birth_us,
                    id: txn,
                },
                ts: if C::USES_TIMESTAMPS {
                    self.timestamps.next()
                } else {
                    0
                },
            },
            req,
            program,
            outputs: vec![Value::Null; n],
            wave_of: vec![0; n],
            from_cache: vec![false; n],
            wave: 0,
            remaining: n,
            participants: Vec::new(),
            outstanding: 0,
            phase: Phase::Walking,
            failure: None,
            to_reserve,
            reserved: 0,
            order: 0,
            range: None,
            costs: phases::measured(txn).then(PhaseCosts::start),
            prepared: false,
            logged_decision: false,
            cached: Vec::new(),
            renewing: Vec::new(),
            trace: TxnTrace::default(),
        };
        let actions = if t.to_reserve.is_empty() {
            self.next_wave(&mut t)
        } else {
            t.phase = Phase::Reserving;
            self.reserve_next(&mut t)
        };
        self.account(&mut t, &actions);
        if t.phase == Phase::Committing && t.outstanding == 0 {
            return self.answer(&mut t);
        }
        let shared = Arc::new(Mutex::new(t));
        self.coords.shard(txn).lock().insert(txn, shared);
        self.act(txn, actions);
    }

    /// Runs `f` on the coordinator state of `txn`, then does what it decided; a finished
    /// transaction is answered and forgotten.
    /// `received`: the size of the message from another node that brought this, if any (0
    /// otherwise).
    fn with_coord(
        &self,
        txn: TxnId,
        received: usize,
        f: impl FnOnce(&Self, &mut CoordTxn) -> Vec<Action>,
    ) {
        let Some(shared) = self.coords.shard(txn).lock().get(&txn).cloned() else {
            return; // already finished (or never known here): a stray message
        };
        let mut t = shared.lock();
        if t.phase == Phase::Answered {
            return;
        }
        if let (Some(c), true) = (&mut t.costs, received > 0) {
            c.message(received);
        }
        let actions = f(self, &mut t);
        self.account(&mut t, &actions);
        let finished = t.phase == Phase::Committing && t.outstanding == 0;
        if finished {
            t.phase = Phase::Answered;
        }
        drop(t);
        if finished {
            self.coords.shard(txn).lock().remove(&txn);
        }
        // The client hears of an abort only once it is on its way to every participant (and
        // done here), so nothing it did outlives its answer unannounced.
        self.act(txn, actions);
        if finished {
            self.answer(&mut shared.lock());
        }
    }

    /// Accounts the phase `t` is now in and the messages to other nodes it is about to send.
    fn account(&self, t: &mut CoordTxn, actions: &[Action]) {
        let Some(costs) = &mut t.costs else {
            return;
        };
        costs.enter(match t.phase {
            Phase::Reserving | Phase::Walking => EXECUTION,
            Phase::Preparing => PREPARE,
            Phase::Committing | Phase::Answered => COMMIT,
        });
        for a in actions {
            if let Action::Send(to, body) = a {
                if *to != self.id {
                    costs.message(self.wire_size(t.req.id, body));
                }
            }
        }
    }

    fn act(&self, txn: TxnId, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Send(to, body) => self.send(to, txn, body),
                Action::ExecHere(at, group, inputs) => {
                    self.on_exec(self.id, txn, at, group, inputs)
                }
            }
        }
    }

    fn reserve_next(&self, t: &mut CoordTxn) -> Vec<Action> {
        let node = t.to_reserve[t.reserved];
        let p = t.participant(node);
        p.owes = true;
        t.outstanding = 1;
        vec![Action::Send(node, Body::Reserve { at: t.at })]
    }

    pub(super) fn on_reserved(&self, from: NodeId, txn: TxnId, received: usize) {
        self.with_coord(txn, received, |node, t| {
            if t.phase != Phase::Reserving || !t.answered(from) {
                return Vec::new();
            }
            t.reserved += 1;
            if t.reserved < t.to_reserve.len() {
                return node.reserve_next(t);
            }
            t.phase = Phase::Walking;
            node.next_wave(t)
        });
    }

    /// Sends the next wave of accesses; with none left, starts the commit.
    fn next_wave(&self, t: &mut CoordTxn) -> Vec<Action> {
        if t.remaining == 0 {
            return self.start_commit(t);
        }
        t.wave += 1;
        let wave = t.wave;
        let program = t.program.clone();
        let mut blocked: Vec<NodeId> = Vec::new();
        for (i, a) in program.accesses.iter().enumerate() {
            if t.wave_of[i] != 0 {
                continue;
            }
            let node = self.node_of(a.table, a.key);
            if blocked.contains(&node) {
                continue;
            }
            // An input is known if an earlier wave produced it, or if the same group
            // produces it first (the participant runs its group in order).
            let known = a.deps.iter().all(|&d| {
                let w = t.wave_of[d as usize];
                w != 0
                    && (w < wave || t.from_cache[d as usize] || {
                        let da = &program.accesses[d as usize];
                        self.node_of(da.table, da.key) == node
                    })
            });
            if known {
                t.wave_of[i] = wave;
                t.remaining -= 1;
                if !self.read_from_cache(t, i, wave) {
                    t.participant(node).group.push(i as u16);
                }
            } else {
                // Keep each partition's accesses in program order.
                blocked.push(node);
            }
        }
        let mut actions = Vec::new();
        let groups: Vec<(NodeId, Vec<u16>)> = t
            .participants
            .iter()
            .filter(|p| !p.group.is_empty())
            .map(|p| (p.node, p.group.clone()))
            .collect();
        for (node, indices) in groups {
            t.participant(node).owes = true;
            t.outstanding += 1;
            let inputs = inputs_of(&program, &indices, t, wave);
            actions.push(if node == self.id {
                Action::ExecHere(
                    t.at,
                    Group::Local {
                        program: program.clone(),
                        indices,
                    },
                    inputs,
                )
            } else {
                let accesses = indices
                    .iter()
                    .map(|&i| (i, program.accesses[i as usize].clone()))
                    .collect();
                let fill = self.fills_wanted(t, &indices);
                Action::Send(
                    node,
                    Body::Exec {
                        at: t.at,
                        accesses,
                        inputs,
                        fill,
                    },
                )
            });
        }
        if t.outstanding == 0 {
            // Every access of the wave was read from the cache.
            return match t.failure {
                Some(_) => self.abort_everywhere(t),
                None => self.next_wave(t),
            };
        }
        actions
    }

    pub(super) fn on_executed(
        &self,
        from: NodeId,
        txn: TxnId,
        outputs: Vec<Value>,
        ran: Ran,
        received: usize,
    ) {
        let Ran {
            end,
            wrote,
            floor,
            fills,
        } = ran;
        self.with_coord(txn, received, |node, t| {
            // A refused reservation also answers `Executed`.
            if !matches!(t.phase, Phase::Walking | Phase::Reserving) {
                return Vec::new();
            }
            t.at.ts = t.at.ts.max(floor);
            node.take_fills(t, from, fills);
            let p = t.participant(from);
            p.wrote |= wrote;
            let group = std::mem::take(&mut p.group);
            for (&i, v) in group.iter().zip(outputs) {
                t.outputs[i as usize] = v;
            }
            if end != GroupEnd::Done {
                t.fail(end);
            }
            if !t.answered(from) {
                return Vec::new();
            }
            if t.failure.is_some() {
                return node.abort_everywhere(t);
            }
            node.next_wave(t)
        });
    }

    /// Every access ran: one participant commits at once (unless the protocol validates),
    /// several vote first (unless the protocol skips the commit protocol).
    fn start_commit(&self, t: &mut CoordTxn) -> Vec<Action> {
        t.renewing = self.renewals(t);
        let alone = (t.participants.len() <= 1 || self.cc.skips_commit_protocol()) && !C::VALIDATES;
        if alone || t.participants.is_empty() {
            for p in &mut t.participants {
                p.commits = true;
            }
            return self.decide_commit(t);
        }
        t.phase = Phase::Preparing;
        t.prepared = true;
        t.outstanding = t.participants.len();
        let (ts, renewing) = (t.at.ts, &t.renewing);
        t.participants
            .iter_mut()
            .map(|p| {
                p.owes = true;
                let renew = renewing
                    .iter()
                    .filter(|(n, _)| *n == p.node)
                    .map(|(_, r)| *r)
                    .collect();
                Action::Send(p.node, Body::Prepare { ts, renew })
            })
            .collect()
    }

    pub(super) fn on_vote(&self, from: NodeId, txn: TxnId, vote: Vote, received: usize) {
        self.with_coord(txn, received, |node, t| {
            if t.phase != Phase::Preparing {
                return Vec::new();
            }
            node.renewals_voted(t, from, !matches!(vote, Vote::No(_)));
            let p = t.participant(from);
            match vote {
                Vote::Yes => p.commits = true,
                Vote::YesWithin(r) => {
                    p.commits = true;
                    t.range = Some(t.range.unwrap_or(TsRange::ALL).intersect(&r));
                }
                Vote::ReadOnly => {}
                Vote::No(cause) => t.fail(GroupEnd::CcAbort(cause)),
            }
            if !t.answered(from) {
                return Vec::new();
            }
            if let Some(r) = t.range {
                if r.is_empty() {
                    t.fail(GroupEnd::CcAbort(CcAbortCause::RangeEmpty));
                } else {
                    // The smallest timestamp every participant accepts.
                    t.at.ts = r.lower;
                }
            }
            if t.failure.is_some() {
                return node.abort_everywhere(t);
            }
            node.decide_commit(t)
        });
    }

    /// The transaction commits: it takes its place in the commit order, and the
    /// participants that hold changes make them permanent; with a log, once the decision is
    /// on disk (participants that prepared ask for it after a crash).
    fn decide_commit(&self, t: &mut CoordTxn) -> Vec<Action> {
        self.drop_written(t);
        t.phase = Phase::Committing;
        t.order = self.cc.commit_order(&t.at).unwrap_or_else(|| self.tick());
        t.outstanding = 0;
        for p in t.participants.iter_mut().filter(|p| p.commits) {
            p.owes = true;
            t.outstanding += 1;
        }

        if t.prepared && t.outstanding > 0 && self.log_decision(t.req.id, t.at.ts) {
            t.logged_decision = true;
            return Vec::new();
        }
        commits(t)
    }

    /// A logged decision is on disk: its commits go.
    pub(super) fn send_commits(&self, txn: TxnId) {
        self.with_coord(txn, 0, |_, t| commits(t));
    }

    pub(super) fn on_commit_ack(&self, from: NodeId, txn: TxnId, received: usize) {
        self.with_coord(txn, received, |_, t| {
            if t.phase == Phase::Committing && t.answered(from) && t.logged_decision {
                // Nobody will ask about it again.
                self.log_end(txn);
            }
            Vec::new()
        });
    }

    /// Undoes the transaction wherever it ran and answers the client.
    fn abort_everywhere(&self, t: &mut CoordTxn) -> Vec<Action> {
        let actions = t
            .participants
            .iter()
            .map(|p| Action::Send(p.node, Body::Abort))
            .collect();
        // Nothing else is awaited: the transaction is finished once the aborts are sent.
        t.phase = Phase::Committing;
        t.outstanding = 0;
        t.participants.clear();
        actions
    }

    /// Answers the client of a finished transaction and records its end.
    fn answer(&self, t: &mut CoordTxn) {
        let _in = crate::worker_time::enter(crate::worker_time::Activity::Other);
        if let Some(c) = &mut t.costs {
            let (costs, n) = c.close(t.failure.is_none());
            self.phases.record_with_traffic(&costs[..n]);
        }
        let ending = match t.failure.take() {
            None => Ending::Committed {
                order: t.order,
                outputs: std::mem::take(&mut t.outputs),
            },
            Some(GroupEnd::CcAbort(cause)) => Ending::CcAbort(cause),
            Some(GroupEnd::LogicAbort(why)) => Ending::LogicAbort {
                order: self.tick(),
                why,
            },
            Some(GroupEnd::Done) => unreachable!("Done is not a failure"),
        };
        let (history, req) = (self.ctx.history.as_deref(), &t.req);
        reply(
            req,
            settle(history, self.id, req.id, &req.call, &t.trace, ending),
        );
    }
}

impl<C: Cc> NodeShell for Node<C> {
    fn close_admission(&self) {
        self.admission.write().take();
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Answers every transaction still coordinated here `Rejected` (the node is stopping).
    fn reject_leftovers(&self) {
        for s in self.coords.all() {
            for (_, shared) in s.lock().drain() {
                let t = shared.lock();
                if t.phase == Phase::Answered {
                    continue; // its answer is on the way
                }
                reply(
                    &t.req,
                    TxnOutcome::Rejected("the node stopped before the transaction finished".into()),
                );
            }
        }
        self.drop_parts();
    }

    /// Whether no transaction has state here: nothing coordinated, nothing held.
    fn quiescent(&self) -> bool {
        self.coords.all().all(|s| s.lock().is_empty()) && self.parts_idle() && self.cc.settled()
    }
}

/// The commit messages of a decided transaction, to the participants that voted yes.
fn commits(t: &CoordTxn) -> Vec<Action> {
    t.participants
        .iter()
        .filter(|p| p.commits)
        .map(|p| Action::Send(p.node, Body::Commit { ts: t.at.ts }))
        .collect()
}

/// The outputs a group of wave `wave` needs from accesses outside it (earlier waves, and
/// reads from the cache).
fn inputs_of(program: &Program, group: &[u16], t: &CoordTxn, wave: u32) -> Vec<(u16, Value)> {
    let mut inputs: Vec<(u16, Value)> = Vec::new();
    for &i in group {
        for &d in &program.accesses[i as usize].deps {
            let d_ = d as usize;
            let outside = t.wave_of[d_] < wave || t.from_cache[d_];
            if outside && !inputs.iter().any(|(x, _)| *x == d) {
                inputs.push((d, t.outputs[d_].clone()));
            }
        }
    }
    inputs
}
