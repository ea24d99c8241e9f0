//! The load generator: client threads that submit transactions to a cluster and measure
//! the answers.
//!
//! Each thread drives a share of the clients. A client is bound to a home node and keeps
//! `inflight` transactions outstanding (closed loop), or transactions arrive at a fixed
//! target rate whatever the answers (open loop). A transaction aborted by concurrency
//! control is resubmitted, as a new attempt, after the shared [`Backoff`] policy's delay.

use crate::elle::{Completion, ElleLog};
use crate::stats::{Backoff, ClientStats};
use crate::Target;
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use qstore_core::config::ClientConfig;
use qstore_core::txn::{
    CcAbortCause, ProcCall, TxnKey, TxnOutcome, TxnResponse, Value, OLLP_RESTART,
};
use qstore_core::RunConfig;
use qstore_core::{NodeId, TxnId};
use qstore_engine::{wall_clock_us, TxnRequest};
use qstore_workload::{ElleOp, TxnCall, TxnGenerator, Workload};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Open-loop arrivals beyond this many outstanding transactions per thread are skipped and
/// counted, rather than queued without bound.
const OPEN_LOOP_MAX_OUTSTANDING: usize = 100_000;

/// How long a thread waits for an answer before re-checking the run's state.
const POLL: Duration = Duration::from_millis(20);
/// A load thread with fewer transactions than this outstanding lets an idle node run its
/// next one on the thread itself (see `TxnRequest::inline`).
const INLINE_BELOW: usize = 32;

/// State shared by the run's controller and its load-generator threads.
#[derive(Default)]
pub struct Control {
    /// Answers count in the statistics only while this is set.
    pub measuring: AtomicBool,
    /// No new transactions once set; outstanding ones are still answered and retried.
    pub stop: AtomicBool,
    /// Commits counted so far (progress lines, and the `txns` bound).
    pub commits: AtomicU64,
    /// The latencies of those commits, summed (the timeline's mean latency per interval).
    pub latency_us: AtomicU64,
    pub cc_aborts: AtomicU64,
    /// With a `txns` bound: fresh transactions issued and not logic-aborted or rejected.
    issued: AtomicU64,
    /// With a `txns` bound: when the last needed commit arrived.
    pub finished_at: Mutex<Option<Instant>>,
    /// What every driver thread's commit times count from (the first commit measured).
    epoch: std::sync::OnceLock<Instant>,
}

impl Control {
    /// Takes one of the `budget` transaction slots (always succeeds without a bound).
    fn take_slot(&self, budget: u64) -> bool {
        if budget == 0 {
            return true;
        }
        if self.issued.fetch_add(1, Ordering::Relaxed) < budget {
            true
        } else {
            self.issued.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    /// Gives back a slot of a transaction that ended without committing.
    fn return_slot(&self, budget: u64) {
        if budget > 0 {
            self.issued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

struct Client {
    home: NodeId,
    generator: Box<dyn TxnGenerator>,
}

/// One transaction until its final answer, across attempts.
struct Pending {
    client: usize,
    call: Arc<ProcCall>,
    ops: u32,
    first_submit: Instant,
    /// The first attempt's wall-clock time, carried by every retry (see `TxnRequest`).
    birth_us: u64,
    retries: u32,
    /// The Elle lane of this transaction and its invocation, when an Elle history is kept.
    elle: Option<(u64, Vec<ElleOp>)>,
    /// OLLP: the reconnaissance `call` was built from, while `call` runs on its guess (see
    /// `Workload::is_reconnaissance`).
    recon: Option<Arc<ProcCall>>,
    /// The attempt's name, kept when it is resubmitted after a `NotLeader` answer and
    /// cleared for a new attempt (see `TxnKey`).
    key: TxnKey,
    /// An earlier submission of this attempt was answered `NotLeader`: it may still run
    /// (its group's log may commit it), so a later refusal does not mean it failed.
    may_have_run: bool,
}

/// A retry waiting for its back-off to pass.
struct Retry {
    at: Instant,
    pending: Pending,
}

impl PartialEq for Retry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl Eq for Retry {}
impl PartialOrd for Retry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Retry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.cmp(&other.at)
    }
}

/// One load-generator thread.
pub struct Driver<'a> {
    index: u32,
    /// This driver's session in the transactions' keys (see `TxnKey`).
    session: u64,
    cluster: &'a dyn Target,
    workload: &'a dyn Workload,
    elle: Option<&'a ElleLog>,
    /// Elle lanes not in use, and the number of lanes created.
    free_lanes: Vec<u64>,
    lanes: u64,
    control: &'a Control,
    cfg: &'a ClientConfig,
    backoff: Backoff,
    clients: Vec<Client>,
    pending: FxHashMap<TxnId, Pending>,
    /// Requests made since the last look at the answers, sent together by `flush`.
    outbox: Vec<(NodeId, TxnRequest)>,
    retries: BinaryHeap<Reverse<Retry>>,
    /// A call whose transaction has finished, to build the next one in (see
    /// `TxnGenerator::next_txn_reusing`).
    spare: Option<(usize, ProcCall)>,
    reply_tx: Sender<TxnResponse>,
    reply_rx: Receiver<TxnResponse>,
    next_id: u64,
    rng: qstore_core::rng::Rng,
    stats: ClientStats,
    /// Open loop: time of the next arrival, its spacing, and the next client to use.
    next_arrival: Option<(Instant, Duration, usize)>,
    /// When the driver started, on the monotonic and on the wall clock (see `wall_us`).
    started: (Instant, u64),
    /// When a transaction last got its final answer (committed, failed its check, refused).
    last_finished: Instant,
    /// Runs the workload's background transactions (see `Workload::background`): they count
    /// in this driver's own statistics only, never in the run's progress or `txns` bound.
    background: bool,
}

/// What every load-generator thread of a run shares.
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    pub run: &'a RunConfig,
    pub target: &'a dyn Target,
    pub workload: &'a dyn Workload,
    pub control: &'a Control,
    pub elle: Option<&'a ElleLog>,
}

impl<'a> Driver<'a> {
    /// A thread driving clients `client_ids` (client `c` has home node `c mod nodes`).
    pub fn new(index: u32, threads: u32, client_ids: &[u32], shared: Shared<'a>) -> Self {
        let Shared {
            run,
            target: cluster,
            workload,
            ..
        } = shared;
        let cfg = &run.client;
        let nodes = run.cluster.nodes;
        // A client of a later start of a recovered cluster is another client than the one
        // of the same number before: its values and choices differ from those the recovered
        // log holds.
        let first_client = cluster.id_generation() as u32 * cfg.effective_clients(nodes);
        let clients = client_ids
            .iter()
            .map(|&c| {
                let home = NodeId(c % nodes);
                let generator =
                    workload.generator(first_client + c, qstore_core::PartitionId(home.0));
                Client { home, generator }
            })
            .collect();
        Self::with_clients(index, shared, clients, cfg.rate / threads as f64, false)
    }

    /// The thread that runs the workload's background transactions, one client per node at
    /// `Workload::background_rate` in all; `None` if the workload has none.
    pub fn background(index: u32, shared: Shared<'a>) -> Option<Self> {
        let rate = shared.workload.background_rate();
        let clients = (0..shared.run.cluster.nodes)
            .map(|n| {
                let generator = shared.workload.background(qstore_core::PartitionId(n))?;
                Some(Client {
                    home: NodeId(n),
                    generator,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        (rate > 0.0).then(|| Self::with_clients(index, shared, clients, rate, true))
    }

    /// A thread driving `clients`, open loop at `rate` transactions per second if positive.
    fn with_clients(
        index: u32,
        shared: Shared<'a>,
        clients: Vec<Client>,
        rate: f64,
        background: bool,
    ) -> Self {
        let Shared {
            run,
            target: cluster,
            workload,
            control,
            elle,
        } = shared;
        let cfg = &run.client;
        let next_arrival = (rate > 0.0).then(|| {
            // Validation keeps the rate where the spacing is at least a few nanoseconds; a
            // zero spacing would schedule arrivals forever without taking answers.
            let spacing = Duration::from_secs_f64(1.0 / rate);
            (Instant::now(), spacing.max(Duration::from_nanos(1)), 0)
        });
        let (reply_tx, reply_rx) = unbounded();
        Driver {
            index,
            session: TxnKey::new_session(),
            cluster,
            workload,
            elle,
            free_lanes: Vec::new(),
            lanes: 0,
            control,
            cfg,
            backoff: Backoff {
                base_us: cfg.backoff_base_us,
                max_us: cfg.backoff_max_us,
            },
            clients,
            pending: FxHashMap::default(),
            outbox: Vec::new(),
            retries: BinaryHeap::new(),
            spare: None,
            reply_tx,
            reply_rx,
            // Past the ids of earlier starts of a cluster that recovered them from its logs.
            next_id: cluster.id_generation() << 32,
            rng: qstore_core::rng::stream(run.seed, (1 << 32) + index as u64),
            stats: ClientStats::default(),
            next_arrival,
            started: (Instant::now(), wall_clock_us()),
            last_finished: Instant::now(),
            background,
        }
    }

    /// The run's `txns` bound as it applies to this thread (none to background work).
    fn budget(&self) -> u64 {
        match self.background {
            true => 0,
            false => self.cfg.txns,
        }
    }

    /// Runs until the run stops and every transaction is answered (or the drain times out).
    pub fn run(mut self) -> ClientStats {
        if self.next_arrival.is_none() {
            for c in 0..self.clients.len() {
                for _ in 0..self.cfg.inflight {
                    self.issue_fresh(c, Instant::now());
                }
            }
        }
        // When the run stopped, and whether because the cluster stopped answering.
        let mut stopped_at = None;
        let mut stalled = false;
        let stall_limit = Duration::from_secs_f64(self.cfg.drain_timeout_s);
        let mut last_answer = Instant::now();
        loop {
            let now = Instant::now();
            self.open_loop_arrivals(now);
            self.resubmit_due(now);
            self.flush();
            if !self.pending.is_empty() && now.duration_since(last_answer) >= stall_limit {
                // Transactions wait and nothing has been answered for the whole drain timeout:
                // the cluster is stuck. End the run (they count as unfinished) rather than
                // wait forever, as a run bounded by `txns` alone otherwise would.
                tracing::error!(
                    "no answer for {:.0} s with {} transactions outstanding; ending the run",
                    stall_limit.as_secs_f64(),
                    self.pending.len()
                );
                self.control.stop.store(true, Ordering::Relaxed);
                stalled = true;
            }
            if self.control.stop.load(Ordering::Relaxed) {
                // The run is over: wait for what is in flight for as long as transactions keep
                // finishing. A cluster that only answers aborts (retried without end) or
                // nothing at all for the drain timeout leaves them unfinished.
                let stopped = *stopped_at.get_or_insert(now);
                let progress = stopped.max(self.last_finished);
                if self.pending.is_empty() && self.retries.is_empty() {
                    break;
                }
                if now.duration_since(progress) >= stall_limit || stalled {
                    self.give_up_outstanding();
                    break;
                }
            }
            match self.reply_rx.recv_timeout(self.next_wait(now)) {
                Ok(resp) => {
                    // One clock read serves an answer's latency and the next transaction's
                    // start. It is read again for every answer: the next transaction may be
                    // answered while it is submitted (an idle Q-Store node runs it on the
                    // submitting thread), and a clock read shared with the answer before
                    // would make its latency zero.
                    last_answer = Instant::now();
                    self.on_response(resp, last_answer);
                    // Take whatever else has arrived before looking at timers again.
                    while let Ok(resp) = self.reply_rx.try_recv() {
                        self.on_response(resp, Instant::now());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => unreachable!("we hold a sender"),
            }
        }
        self.stats
    }

    fn next_wait(&self, now: Instant) -> Duration {
        let mut until = now + POLL;
        if let Some(Reverse(r)) = self.retries.peek() {
            until = until.min(r.at);
        }
        if let Some((at, _, _)) = self.next_arrival {
            until = until.min(at);
        }
        until.saturating_duration_since(now)
    }

    fn fresh_id(&mut self) -> TxnId {
        self.next_id += 1;
        TxnId(((self.index as u64 + 1) << 40) | self.next_id)
    }

    /// Starts a new transaction of client `c`, if the run still wants one.
    fn issue_fresh(&mut self, c: usize, first_submit: Instant) -> bool {
        if self.control.stop.load(Ordering::Relaxed) || !self.control.take_slot(self.budget()) {
            return false;
        }
        let generator = &mut self.clients[c].generator;
        let TxnCall { call, ops } = match self.spare.take() {
            Some((owner, old)) if owner == c => generator.next_txn_reusing(old),
            _ => generator.next_txn(),
        };
        let elle = self.elle.and_then(|log| {
            let invocation = self.workload.elle_ops(&call, None)?;
            let lane = self.free_lanes.pop().unwrap_or_else(|| {
                self.lanes += 1;
                ((self.index as u64) << 32) | self.lanes
            });
            log.invoke(lane, &invocation);
            Some((lane, invocation))
        });
        let pending = Pending {
            client: c,
            call: Arc::new(call),
            ops,
            first_submit,
            birth_us: self.wall_us(first_submit),
            retries: 0,
            may_have_run: false,
            elle,
            recon: None,
            key: TxnKey::default(),
        };
        self.submit(pending);
        true
    }

    /// Records the end of a transaction in the Elle history and frees its lane.
    fn elle_complete(&mut self, p: &Pending, how: Completion, outputs: Option<&[Value]>) {
        let (Some(log), Some((lane, invocation))) = (self.elle, &p.elle) else {
            return;
        };
        let completed = outputs.and_then(|o| self.workload.elle_ops(&p.call, Some(o)));
        log.complete(*lane, how, completed.as_deref().unwrap_or(invocation));
        self.free_lanes.push(*lane);
    }

    /// The run stopped waiting: count what is still outstanding, outcome unknown.
    fn give_up_outstanding(&mut self) {
        let pending: Vec<(TxnId, Pending)> = self.pending.drain().collect();
        // Named in the log, so a stuck transaction can be followed in the servers' logs.
        for (id, p) in pending.iter().take(8) {
            tracing::error!(
                "no answer to transaction {} (key {}:{}, home node {}, {} retries, first \
                 sent {:.1} s ago{})",
                id.0,
                p.key.session,
                p.key.seq,
                self.clients[p.client].home.0,
                p.retries,
                p.first_submit.elapsed().as_secs_f64(),
                if p.may_have_run {
                    ", answered NotLeader before"
                } else {
                    ""
                }
            );
        }
        let waiting = std::mem::take(&mut self.retries)
            .into_iter()
            .map(|Reverse(r)| r.pending);
        for p in pending.into_iter().map(|(_, p)| p).chain(waiting) {
            self.stats.unfinished += 1;
            self.elle_complete(&p, Completion::Info, None);
        }
    }

    fn submit(&mut self, mut pending: Pending) {
        let id = self.fresh_id();
        if pending.key.is_none() {
            pending.key = TxnKey {
                session: self.session,
                seq: id.0,
            };
        }
        let req = TxnRequest {
            id,
            call: pending.call.clone(),
            reply: self.reply_tx.clone().into(),
            birth_us: pending.birth_us,
            // With few transactions outstanding this thread mostly waits for answers, and the
            // node may run the transaction here; with many, it has answers to handle and
            // requests to send, and the node's threads batch them better.
            inline: self.pending.len() < INLINE_BELOW,
            key: pending.key,
        };
        let home = self.clients[pending.client].home;
        self.pending.insert(id, pending);
        self.outbox.push((home, req));
    }

    /// Sends the requests made since the last call, those for one home node together: a
    /// node takes them as one arrival (an idle Q-Store node plans them as one batch, rather
    /// than one batch per request as they would be if each ran as soon as it was made).
    fn flush(&mut self) {
        if self.outbox.is_empty() {
            return;
        }
        // Drained, not taken: the outbox keeps its room for the next round.
        self.outbox.sort_by_key(|&(home, _)| home);
        let mut out = self.outbox.drain(..).peekable();
        while let Some((home, req)) = out.next() {
            let mut reqs = vec![req];
            while let Some((_, req)) = out.next_if(|&(h, _)| h == home) {
                reqs.push(req);
            }
            self.cluster.submit_all(home, reqs);
        }
    }

    fn open_loop_arrivals(&mut self, now: Instant) {
        while let Some((at, spacing, next_client)) = self.next_arrival {
            if at > now || self.control.stop.load(Ordering::Relaxed) {
                return;
            }
            self.next_arrival = Some((
                at + spacing,
                spacing,
                (next_client + 1) % self.clients.len(),
            ));
            if self.pending.len() + self.retries.len() >= OPEN_LOOP_MAX_OUTSTANDING {
                self.stats.missed_arrivals += 1;
            } else {
                // Latency counts from the scheduled arrival, not from when we got to it.
                self.issue_fresh(next_client, at);
            }
        }
    }

    fn resubmit_due(&mut self, now: Instant) {
        while self.retries.peek().is_some_and(|Reverse(r)| r.at <= now) {
            let Reverse(r) = self.retries.pop().expect("peeked");
            self.submit(r.pending);
        }
    }

    /// The wall-clock time of `at`, in microseconds since the epoch, without a second clock
    /// read: the driver's start on both clocks, plus the monotonic time since.
    fn wall_us(&self, at: Instant) -> u64 {
        let (start, start_wall_us) = self.started;
        start_wall_us + at.saturating_duration_since(start).as_micros() as u64
    }

    /// Handles an answer that arrived at `now`.
    fn on_response(&mut self, resp: TxnResponse, now: Instant) {
        let Some(mut p) = self.pending.remove(&resp.id) else {
            return; // not ours: ignore rather than trust it
        };
        let measuring = self.control.measuring.load(Ordering::Relaxed);
        match resp.outcome {
            TxnOutcome::Committed(outputs) if self.workload.is_reconnaissance(&p.call) => {
                match self.workload.after_reconnaissance(&p.call, &outputs) {
                    Ok(main) => {
                        p.recon = Some(std::mem::replace(&mut p.call, Arc::new(main)));
                        p.key = TxnKey::default();
                        self.submit(p);
                    }
                    Err(why) => self.logic_abort(p, &why, now),
                }
            }
            TxnOutcome::LogicAbort(why) if why == OLLP_RESTART.0 && p.recon.is_some() => {
                if measuring {
                    self.stats.record_cc_abort(CcAbortCause::OllpRestart);
                    self.count_cc_abort();
                }
                // The guess was stale: look again after the back-off of a cc abort (a stale
                // guess means another transaction changed those rows just now, and the
                // transactions that saw the same rows restart together).
                p.call = p.recon.take().expect("checked above");
                p.key = TxnKey::default();
                p.may_have_run = false;
                self.retry(p, now);
            }
            TxnOutcome::Committed(outputs) => {
                if let Err(why) = self.workload.check_commit(&p.call, &outputs) {
                    self.stats.invariant_violations += 1;
                    self.stats.first_violation.get_or_insert(why);
                }
                self.elle_complete(&p, Completion::Ok, Some(&outputs));
                // From warm-up to drain: a stall that outlasts the window still counts.
                let epoch = *self.control.epoch.get_or_init(|| now);
                self.stats
                    .record_commit_time(now.saturating_duration_since(epoch));
                if measuring {
                    let latency = now.saturating_duration_since(p.first_submit).as_micros() as u64;
                    self.stats.record_commit(p.ops, latency);
                    self.count_commit(latency);
                }
                self.finish(p, now);
            }
            TxnOutcome::CcAbort(cause) => {
                if measuring {
                    self.stats.record_cc_abort(cause);
                    self.count_cc_abort();
                }
                p.key = TxnKey::default();
                p.may_have_run = false;
                self.retry(p, now);
            }
            TxnOutcome::NotLeader { .. } => {
                // Not run yet: the same attempt goes again (the cluster routes it to the
                // group's leader, which answers a transaction it already ran with its
                // outcome). The proposal of the member that answered may still commit.
                self.stats.redirected += 1;
                p.may_have_run = true;
                self.retry(p, now);
            }
            TxnOutcome::LogicAbort(why) => self.logic_abort(p, &why, now),
            // A refusal of a resubmission says nothing of the earlier submission, which may
            // have committed: its history says "unknown", not "failed".
            TxnOutcome::Rejected(why) if p.may_have_run => {
                self.refused(&p, Completion::Info, why, now)
            }
            TxnOutcome::Rejected(why) => self.refused(&p, Completion::Fail, why, now),
            // It may have committed: its list-append history says so.
            TxnOutcome::Unknown(why) => self.refused(&p, Completion::Info, why, now),
        }
    }

    /// `p` was refused, or lost with its connection (`how` says which, to the history): a
    /// misconfigured run or a cluster going away. The run ends and shows the reason rather
    /// than spin on refusals.
    fn refused(&mut self, p: &Pending, how: Completion, why: String, now: Instant) {
        self.elle_complete(p, how, None);
        self.stats.rejected += 1;
        self.stats.first_rejection.get_or_insert(why);
        self.last_finished = now;
        self.control.stop.store(true, Ordering::Relaxed);
    }

    /// Submits `p` again after a randomised back-off that grows with its retries.
    fn retry(&mut self, mut p: Pending, now: Instant) {
        let delay = self.backoff.delay_us(p.retries, &mut self.rng);
        p.retries += 1;
        let at = now + Duration::from_micros(delay);
        self.retries.push(Reverse(Retry { at, pending: p }));
    }

    /// Transaction `p` ended in a logic abort (final, not retried).
    fn logic_abort(&mut self, p: Pending, why: &str, now: Instant) {
        self.elle_complete(&p, Completion::Fail, None);
        if self.control.measuring.load(Ordering::Relaxed) {
            self.stats.record_logic_abort(why);
        }
        self.control.return_slot(self.budget());
        self.finish(p, now);
    }

    /// Counts a commit of `latency_us` in the run's progress (not background work's).
    fn count_commit(&self, latency_us: u64) {
        if self.background {
            return;
        }
        self.control
            .latency_us
            .fetch_add(latency_us, Ordering::Relaxed);
        let total = self.control.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if self.cfg.txns > 0 && total == self.cfg.txns {
            *self.control.finished_at.lock() = Some(Instant::now());
            self.control.stop.store(true, Ordering::Relaxed);
        }
    }

    fn count_cc_abort(&self) {
        if !self.background {
            self.control.cc_aborts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Transaction `p` has its final answer; a closed-loop client starts another, in the
    /// finished call's memory when nobody else holds it any more. `now` is the time of the answer.
    fn finish(&mut self, p: Pending, now: Instant) {
        self.last_finished = now;
        let c = p.client;
        if let Ok(call) = Arc::try_unwrap(p.call) {
            self.spare = Some((c, call));
        }
        if self.next_arrival.is_none() {
            self.issue_fresh(c, now);
        }
    }
}
