//! Running workloads against clusters and measuring them: the load generator
//! ([`driver`]), the statistics ([`stats`]) and the results ([`report`]).

pub mod cdf;
pub mod driver;
pub mod elle;
pub mod experiment;
pub mod remote;
pub mod report;
pub mod stats;
pub mod suite;
pub mod timeline;
pub mod verify;

use driver::{Control, Driver};
use qstore_core::{NodeId, QError, RunConfig};
use qstore_engine::protocol::ProtocolCounters;
use qstore_engine::stages::{StageSnapshot, StageSummary, StageTotals};
use qstore_engine::{Cluster, StoppedCluster, TxnRequest};
use qstore_log::LogStats;
use qstore_workload::Workload;
use report::LogActivity;
use report::{RunReport, Traffic, WorkerTime};
use stats::ClientStats;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use timeline::{Timeline, TimelinePoint, Totals};

/// A progress sample, taken once per second of the run.
#[derive(Clone, Debug)]
pub struct Progress {
    /// Seconds since the clients started.
    pub elapsed_s: f64,
    /// Whether the warm-up is over.
    pub measuring: bool,
    /// Commits per second over the last second (measurement window only).
    pub tps: f64,
    pub committed: u64,
    pub cc_aborts: u64,
}

/// Options of [`run`] that are about the run, not about the system under test.
#[derive(Default)]
pub struct RunOptions<'a> {
    /// Called once per second with a progress sample.
    pub progress: Option<&'a mut dyn FnMut(&Progress)>,
    /// Compute partition content hashes after the run.
    pub state_hashes: bool,
    /// Record the engine-side history (for `--verify` and `--engine-history`).
    pub record_history: bool,
    /// Write the client-observed Elle history here (list-append workloads).
    pub elle: Option<&'a elle::ElleLog>,
}

/// What a run leaves: its report, the stopped cluster (for hashes and checks) and the
/// workload (for its invariants).
pub struct RunOutcome {
    pub report: RunReport,
    pub cluster: StoppedCluster,
    pub workload: Arc<dyn Workload>,
}

/// What the load generator drives: an embedded cluster, or the servers of a distributed one.
pub trait Target: Sync {
    /// Submits `req` with node `home` as its home; the answer comes on `req.reply`.
    fn submit(&self, home: NodeId, req: TxnRequest);
    /// Submits several requests with node `home` as their home, as one arrival.
    fn submit_all(&self, home: NodeId, reqs: Vec<TxnRequest>) {
        for req in reqs {
            self.submit(home, req);
        }
    }
    /// (messages, bytes) each node has sent to other nodes so far.
    fn traffic(&self) -> Vec<(u64, u64)>;
    /// Time per stage of a transaction's life so far, where the protocol measures it.
    fn stages(&self) -> Option<StageSnapshot> {
        None
    }
    /// How many times the cluster started from its data directories before (see
    /// `EngineCtx::generation`): clients keep their transaction ids and their workload's
    /// values apart from those of earlier starts, which the recovered logs hold, by it.
    fn id_generation(&self) -> u64 {
        0
    }
    /// What the servers' logs did so far (with data directories).
    fn log_stats(&self) -> Option<LogStats> {
        None
    }
    /// The protocol's own event counts so far, summed over the nodes (see
    /// `Engine::counters`).
    fn protocol_counters(&self) -> ProtocolCounters {
        ProtocolCounters::new()
    }
    /// Where each node's worker threads spent their time so far, where the protocol
    /// accounts it (see `Engine::worker_time`).
    fn worker_time(&self) -> Vec<(NodeId, StageTotals)> {
        Vec::new()
    }
}

impl Target for Cluster {
    fn submit(&self, home: NodeId, req: TxnRequest) {
        Cluster::submit(self, home, req)
    }

    fn submit_all(&self, home: NodeId, reqs: Vec<TxnRequest>) {
        Cluster::submit_all(self, home, reqs)
    }

    fn id_generation(&self) -> u64 {
        self.ctx().generation()
    }

    fn traffic(&self) -> Vec<(u64, u64)> {
        self.net_counters()
            .map(|c| c.snapshot())
            .unwrap_or_default()
    }

    fn stages(&self) -> Option<StageSnapshot> {
        Cluster::stages(self)
    }

    fn log_stats(&self) -> Option<LogStats> {
        self.ctx().log_stats()
    }

    fn protocol_counters(&self) -> ProtocolCounters {
        Cluster::protocol_counters(self)
    }

    fn worker_time(&self) -> Vec<(NodeId, StageTotals)> {
        Cluster::worker_time(self)
    }
}

/// The client side of a run: statistics, the measurement window, traffic and the timeline.
pub(crate) struct Driven {
    pub stats: ClientStats,
    pub window_s: f64,
    pub traffic: Traffic,
    pub timeline: Vec<TimelinePoint>,
    /// What the protocol's own counters added during the window.
    pub counters: ProtocolCounters,
    /// Time per stage over the measurement window, where the protocol measures it.
    pub stages: Vec<StageSummary>,
    /// What the servers' logs did during the window (runs with data directories).
    pub log: Option<LogStats>,
    /// Where each node's worker threads spent the window, where the protocol accounts it.
    pub worker_time: Vec<(NodeId, StageTotals)>,
    /// The workload's background transactions (see `Workload::background`), apart.
    pub background: Option<ClientStats>,
}

/// Runs the configured clients against `target` until the run ends.
pub(crate) fn drive(
    cfg: &RunConfig,
    target: &dyn Target,
    workload: &dyn Workload,
    progress: &mut Option<&mut dyn FnMut(&Progress)>,
    elle: Option<&elle::ElleLog>,
) -> Driven {
    let control = Control::default();
    let clients = cfg.client.effective_clients(cfg.cluster.nodes);
    let threads = cfg.client.effective_threads(clients);
    // A counted run has no warm-up: every commit counts, from the very first one.
    if cfg.client.txns > 0 {
        control.measuring.store(true, Ordering::Relaxed);
    }
    let shared = driver::Shared {
        run: cfg,
        target,
        workload,
        control: &control,
        elle,
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ids: Vec<u32> = (t..clients).step_by(threads as usize).collect();
                std::thread::Builder::new()
                    .name(format!("client-{t}"))
                    .spawn_scoped(s, move || Driver::new(t, threads, &ids, shared).run())
                    .expect("spawn client thread")
            })
            .collect();
        let background = Driver::background(threads, shared).map(|d| {
            std::thread::Builder::new()
                .name("background".into())
                .spawn_scoped(s, move || d.run())
                .expect("spawn background client thread")
        });
        let mut d = control_run(cfg, target, &control, progress);
        for h in handles {
            d.stats.merge(&h.join().expect("client thread panicked"));
        }
        d.background = background.map(|h| h.join().expect("background client panicked"));
        d
    })
}

/// Builds the workload, starts an embedded cluster, drives it as configured, and reports.
pub fn run(cfg: &RunConfig, opts: RunOptions<'_>) -> Result<RunOutcome, QError> {
    cfg.validate()?;
    let mut cfg = cfg.clone();
    cfg.cluster.resolve_workers(cfg.cluster.nodes);
    let cfg = &cfg;
    let workload = qstore_workload::build(cfg)?;
    let cluster = Cluster::start(
        cfg.clone(),
        workload.catalog(),
        workload.partition_map().clone(),
        &|p, loader| workload.load(p, loader),
        opts.record_history,
    )?;
    let load_s = cluster.load_time().as_secs_f64();
    let mut progress = opts.progress;
    let d = drive(cfg, &cluster, workload.as_ref(), &mut progress, opts.elle);
    let mut report = RunReport::new(cfg, &d.stats, d.window_s, load_s, d.traffic, d.timeline);
    report.stages = d.stages;
    report.worker_time = WorkerTime::over(&d.worker_time);
    report.counters = d.counters;
    report.log = d
        .log
        .map(|l| LogActivity::over(&l, d.window_s, report.committed));
    if let Some(b) = &d.background {
        report.add_background(b);
    }
    let stopped = cluster.stop();
    if opts.state_hashes {
        report.state_hashes = Some(
            stopped
                .partition_hashes()
                .iter()
                .map(|h| format!("{h:016x}"))
                .collect(),
        );
    }
    Ok(RunOutcome {
        report,
        cluster: stopped,
        workload,
    })
}

/// What a run against a distributed cluster leaves: its report and what each node handed
/// back after it.
pub struct RemoteOutcome {
    pub report: RunReport,
    /// By server; `None` for a server lost during a replicated run.
    pub collected: Vec<Option<qstore_engine::server::proto::Collected>>,
    pub workload: Arc<dyn Workload>,
    /// Connections that failed during the run, with the reason (the run failed).
    pub failures: Vec<String>,
    /// Replicated: servers lost during the run, with the reason (the run went on).
    pub lost: Vec<String>,
}

/// Drives the servers of the distributed cluster `cfg` describes (its `cluster.addresses`),
/// and reports, with the servers' message counts and frame fill.
pub fn run_remote(cfg: &RunConfig, opts: RunOptions<'_>) -> Result<RemoteOutcome, QError> {
    cfg.validate()?;
    if !cfg.cluster.is_distributed() {
        return Err(QError::Other(
            "the configuration lists no node addresses (cluster.addresses): not a cluster \
             file; `qstore cluster` writes one and starts the servers"
                .into(),
        ));
    }
    let workload = qstore_workload::build(cfg)?;
    let remote = remote::RemoteCluster::connect(cfg, workload.catalog().fingerprint())?;
    let mut cfg = cfg.clone();
    cfg.protocol.name = remote.protocol.clone();
    let mut progress = opts.progress;
    let d = drive(&cfg, &remote, workload.as_ref(), &mut progress, opts.elle);
    let mut report = RunReport::new(&cfg, &d.stats, d.window_s, 0.0, d.traffic, d.timeline);
    report.stages = d.stages;
    report.worker_time = WorkerTime::over(&d.worker_time);
    report.counters = d.counters;
    report.log = d
        .log
        .map(|l| LogActivity::over(&l, d.window_s, report.committed));
    if let Some(b) = &d.background {
        report.add_background(b);
    }
    // With replication a server lost during the run is survived: its groups elected other
    // leaders, and what it held is checked on the other copies.
    let (failures, lost) = match remote.failures() {
        f if remote.replicated() => (Vec::new(), f),
        f => (f, Vec::new()),
    };
    let (collected, frames) = if failures.is_empty() {
        let stats = remote.stats()?;
        let (msgs, frames) = stats
            .iter()
            .fold((0, 0), |(m, f), s| (m + s.msgs_sent, f + s.frames_sent));
        (
            collect_settled(&remote, cfg.cluster.nodes as usize)?,
            (frames > 0).then(|| msgs as f64 / frames as f64),
        )
    } else {
        (Vec::new(), None)
    };
    report.msgs_per_frame = frames.or(Some(0.0));
    if opts.state_hashes {
        report.state_hashes = Some(
            collected
                .iter()
                .map(|c| match c {
                    Some(c) => format!("{:016x}", c.partition_hash),
                    None => "unreachable".into(),
                })
                .collect(),
        );
    }
    Ok(RemoteOutcome {
        report,
        collected,
        workload,
        failures,
        lost,
    })
}

/// What every server hands back after a run. With replication, the client's last answers
/// came from the leaders' instances: another instance may still be running the last batches
/// its log committed (a rebuilt one can be seconds behind), so the partition hashes alone
/// are polled (for up to `SETTLE_TIMEOUT`) until the in-service copies of each partition
/// agree, and only then is everything, histories included, collected. (Collecting the
/// histories takes seconds after a long run: polling them would leave a lagging copy no
/// time to catch up.) Copies that never agree are reported as they are, and fail
/// verification.
fn collect_settled(
    remote: &remote::RemoteCluster,
    partitions: usize,
) -> Result<Vec<Option<qstore_engine::server::proto::Collected>>, QError> {
    const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    if remote.replicated() {
        while !copies_agree(&remote.collect(false)?, partitions) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    remote.collect(true)
}

/// Whether every in-service copy of each partition has the same hash (`collected` by server,
/// instance after instance).
fn copies_agree(
    collected: &[Option<qstore_engine::server::proto::Collected>],
    partitions: usize,
) -> bool {
    (0..partitions).all(|p| {
        let mut hashes = collected
            .iter()
            .skip(p)
            .step_by(partitions.max(1))
            .flatten()
            .filter(|c| c.in_service)
            .map(|c| c.partition_hash);
        let first = hashes.next();
        hashes.all(|h| Some(h) == first)
    })
}

/// Paces the run from the calling thread: warm-up, measurement window (until the duration
/// passes or the transaction count is reached, whichever comes first), progress every
/// second. A run bounded by its count alone also ends once nothing has committed for the
/// drain timeout (every transaction logic-aborting, or retried forever, would otherwise keep
/// it going). Returns what the server side did in the window (the clients' statistics are
/// the caller's to add).
fn control_run(
    cfg: &RunConfig,
    target: &dyn Target,
    control: &Control,
    progress: &mut Option<&mut dyn FnMut(&Progress)>,
) -> Driven {
    let start = Instant::now();
    let snapshot = || target.traffic();
    let by_count = cfg.client.txns > 0;
    if !by_count {
        let warmup = Window::seconds(cfg.client.warmup_s);
        wait_with_progress(start, warmup, control, progress, None);
    }
    let before = snapshot();
    let stages_before = target.stages();
    let log_before = target.log_stats();
    let counters_before = target.protocol_counters();
    let workers_before = target.worker_time();
    let window_start = if by_count { start } else { Instant::now() };
    control.measuring.store(true, Ordering::Relaxed);
    let totals = |traffic: &[(u64, u64)]| {
        Totals::new(
            control.commits.load(Ordering::Relaxed),
            control.latency_us.load(Ordering::Relaxed),
            traffic,
        )
    };
    let mut timeline = Timeline::starting(totals(&before));
    let mut sample = |t_s: f64| timeline.sample(t_s, totals(&snapshot()));
    // Validation allows a zero duration only when the count bounds the run.
    let window = if cfg.client.duration_s > 0.0 {
        Window::seconds(cfg.client.duration_s)
    } else {
        Window {
            seconds: f64::INFINITY,
            stall: Some(Duration::from_secs_f64(cfg.client.drain_timeout_s.max(1.0))),
        }
    };
    let window = wait_with_progress(start, window, control, progress, Some(&mut sample));
    control.measuring.store(false, Ordering::Relaxed);
    control.stop.store(true, Ordering::Relaxed);
    let after = snapshot();
    let stages = match (target.stages(), stages_before) {
        (Some(after), Some(before)) => after.since(&before).summary(),
        _ => Vec::new(),
    };
    let window_s = match *control.finished_at.lock() {
        Some(t) if by_count => t.duration_since(window_start).as_secs_f64(),
        _ => window.as_secs_f64(),
    };
    let traffic = after
        .iter()
        .zip(before.iter().chain(std::iter::repeat(&(0, 0))))
        .map(|(a, b)| (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1)))
        .collect();
    let counters = target
        .protocol_counters()
        .into_iter()
        .map(|(name, n)| {
            let was = counters_before.get(&name).copied().unwrap_or(0);
            (name, n.saturating_sub(was))
        })
        .collect();
    Driven {
        stats: ClientStats::default(),
        window_s,
        traffic,
        timeline: timeline.points,
        counters,
        stages,
        log: target.log_stats().zip(log_before).map(|(a, b)| a.since(b)),
        worker_time: since_by_node(target.worker_time(), &workers_before),
        background: None,
    }
}

/// What each node's totals (`after`) added since `before` (a node missing then counts from 0).
fn since_by_node(
    after: Vec<(NodeId, StageTotals)>,
    before: &[(NodeId, StageTotals)],
) -> Vec<(NodeId, StageTotals)> {
    after
        .into_iter()
        .map(|(node, a)| match before.iter().find(|(n, _)| *n == node) {
            Some((_, b)) => (node, a.since(b)),
            None => (node, a),
        })
        .collect()
}

/// How long [`wait_with_progress`] waits.
struct Window {
    /// At most this long (infinite: until the run is stopped).
    seconds: f64,
    /// Also stop once the commit count has not moved for this long.
    stall: Option<Duration>,
}

impl Window {
    fn seconds(seconds: f64) -> Window {
        Window {
            seconds,
            stall: None,
        }
    }
}

/// Waits as `window` says (or until the run is stopped), reporting progress each second and
/// calling `sample` then with the seconds since the wait began (the timeline of a measurement
/// window). Returns the time waited.
fn wait_with_progress(
    run_start: Instant,
    window: Window,
    control: &Control,
    progress: &mut Option<&mut dyn FnMut(&Progress)>,
    mut sample: Option<&mut dyn FnMut(f64)>,
) -> Duration {
    let begin = Instant::now();
    let end = (window.seconds.is_finite()).then(|| begin + Duration::from_secs_f64(window.seconds));
    let mut next_tick = begin + Duration::from_secs(1);
    let mut last_commits = control.commits.load(Ordering::Relaxed);
    let (mut seen_commits, mut last_commit_at) = (last_commits, begin);
    loop {
        let now = Instant::now();
        if end.is_some_and(|e| now >= e) || control.stop.load(Ordering::Relaxed) {
            // The window's last part, unless it is too short to say anything.
            let since_tick = now + Duration::from_secs(1) - next_tick;
            if let Some(sample) = sample.as_mut().filter(|_| since_tick.as_millis() >= 100) {
                sample((now - begin).as_secs_f64());
            }
            return now - begin;
        }
        let commits = control.commits.load(Ordering::Relaxed);
        if commits != seen_commits {
            (seen_commits, last_commit_at) = (commits, now);
        }
        if let Some(stall) = window.stall.filter(|&s| now - last_commit_at >= s) {
            tracing::warn!(
                "nothing committed for {:.0} s ({commits} committed so far); ending the run",
                stall.as_secs_f64()
            );
            return now - begin;
        }
        if now >= next_tick {
            let commits = control.commits.load(Ordering::Relaxed);
            let measuring = control.measuring.load(Ordering::Relaxed);
            if let Some(sample) = sample.as_mut().filter(|_| measuring) {
                sample((now - begin).as_secs_f64());
            }
            if let Some(f) = progress.as_mut() {
                f(&Progress {
                    elapsed_s: run_start.elapsed().as_secs_f64(),
                    measuring,
                    tps: (commits - last_commits) as f64,
                    committed: commits,
                    cc_aborts: control.cc_aborts.load(Ordering::Relaxed),
                });
            }
            last_commits = commits;
            next_tick += Duration::from_secs(1);
        }
        let mut wake = next_tick.min(now + Duration::from_millis(10));
        if let Some(e) = end {
            wake = wake.min(e);
        }
        std::thread::sleep(wake.saturating_duration_since(now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_agree_when_every_in_service_copy_of_each_partition_does() {
        let copy = |node: u32, partition_hash: u64, in_service: bool| {
            Some(qstore_engine::server::proto::Collected {
                node: NodeId(node),
                partition_hash,
                history: None,
                tally: None,
                in_service,
                rebuilt: false,
                failovers: 0,
                audit: None,
            })
        };
        // 2 partitions x 3 copies, by server: instance after instance.
        let mut c = vec![
            copy(0, 10, true),
            copy(1, 20, true),
            copy(2, 10, true),
            copy(3, 20, true),
            copy(4, 10, true),
            copy(5, 20, true),
        ];
        assert!(copies_agree(&c, 2));
        c[3] = copy(3, 21, true); // an instance still running its last batch
        assert!(!copies_agree(&c, 2));
        c[3] = copy(3, 21, false); // out of service: not compared
        assert!(copies_agree(&c, 2));
        c[5] = None; // lost
        assert!(copies_agree(&c, 2));
    }

    /// A cluster that takes every request and never answers.
    struct Silent(parking_lot::Mutex<Vec<TxnRequest>>);

    impl Target for Silent {
        fn submit(&self, _: NodeId, req: TxnRequest) {
            self.0.lock().push(req);
        }
        fn traffic(&self) -> Vec<(u64, u64)> {
            Vec::new()
        }
    }

    /// A cluster that answers every request at once with the same outcome.
    struct Answering(fn() -> qstore_core::txn::TxnOutcome);

    impl Target for Answering {
        fn submit(&self, _: NodeId, req: TxnRequest) {
            req.answer((self.0)());
        }
        fn traffic(&self) -> Vec<(u64, u64)> {
            Vec::new()
        }
    }

    /// A replicated cluster whose group leader is lost: a transaction's first submission is
    /// answered `NotLeader` (its proposal may still commit), and its resubmission finds
    /// every server of its group unreachable.
    #[derive(Default)]
    struct LeaderLost(parking_lot::Mutex<rustc_hash::FxHashSet<u64>>);

    impl Target for LeaderLost {
        fn submit(&self, _: NodeId, req: TxnRequest) {
            use qstore_core::txn::TxnOutcome;
            let again = !self.0.lock().insert(req.key.seq);
            req.answer(if again {
                TxnOutcome::Rejected("every server holding partition 0 is unreachable".into())
            } else {
                TxnOutcome::NotLeader { leader: None }
            });
        }
        fn traffic(&self) -> Vec<(u64, u64)> {
            Vec::new()
        }
    }

    #[test]
    fn a_refused_resubmission_is_recorded_as_unknown_not_failed() {
        #[derive(Clone, Default)]
        struct Buf(Arc<parking_lot::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut cfg = small();
        cfg.workload.name = "append".into();
        cfg.workload.append.keys_per_partition = 100;
        cfg.workload.append.multi_partition_fraction = 0.0;
        cfg.client.txns = 10;
        cfg.client.drain_timeout_s = 0.5;
        let buf = Buf::default();
        let elle = elle::ElleLog::new(Box::new(buf.clone()));
        let workload = qstore_workload::build(&cfg).unwrap();
        let d = drive(
            &cfg,
            &LeaderLost::default(),
            workload.as_ref(),
            &mut None,
            Some(&elle),
        );
        assert!(d.stats.rejected > 0);
        let history = String::from_utf8(buf.0.lock().clone()).unwrap();
        assert!(history.contains(r#""type":"info""#), "{history}");
        // The first submission may have committed: "fail" would let a checker call a later
        // read of its append a read of an aborted write.
        assert!(!history.contains(r#""type":"fail""#), "{history}");
    }

    /// Drives `target` as `cfg` says on another thread; `None` if that takes over `limit`.
    fn drive_within(cfg: RunConfig, target: Answering, limit: Duration) -> Option<Driven> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let workload = qstore_workload::build(&cfg).unwrap();
            let _ = tx.send(drive(&cfg, &target, workload.as_ref(), &mut None, None));
        });
        rx.recv_timeout(limit).ok()
    }

    fn small() -> RunConfig {
        let mut cfg = RunConfig::default();
        cfg.cluster.nodes = 1;
        cfg.workload.ycsb.records_per_partition = 100;
        cfg.client.clients = 1;
        cfg.client.warmup_s = 0.0;
        cfg
    }

    #[test]
    fn a_run_bounded_by_count_and_duration_stops_at_whichever_comes_first() {
        use qstore_core::txn::TxnOutcome;
        let commit = || TxnOutcome::Committed(Vec::new());
        // The duration first: a count no run reaches.
        let mut cfg = small();
        cfg.client.txns = u64::MAX;
        cfg.client.duration_s = 0.3;
        let d = drive_within(cfg, Answering(commit), Duration::from_secs(20))
            .expect("the run ignored its duration");
        assert!(d.stats.commits > 0 && d.window_s < 5.0, "{}", d.window_s);
        // The count first.
        let mut cfg = small();
        cfg.client.txns = 100;
        cfg.client.duration_s = 1000.0;
        let d = drive_within(cfg, Answering(commit), Duration::from_secs(20))
            .expect("the run ignored its count");
        assert_eq!(d.stats.commits, 100);
    }

    #[test]
    fn a_run_bounded_by_count_alone_ends_when_nothing_commits_any_more() {
        use qstore_core::txn::TxnOutcome;
        let mut cfg = small();
        cfg.client.txns = 10;
        cfg.client.duration_s = 0.0;
        cfg.client.drain_timeout_s = 0.5;
        let abort = || TxnOutcome::LogicAbort("always".into());
        let d = drive_within(cfg, Answering(abort), Duration::from_secs(20))
            .expect("a run whose transactions all abort never ended");
        assert_eq!(d.stats.commits, 0);
        assert!(d.stats.logic_aborts > 0);
    }

    #[test]
    fn a_cluster_that_stops_answering_ends_the_run_with_unfinished_transactions() {
        let mut cfg = RunConfig::default();
        cfg.cluster.nodes = 1;
        cfg.workload.ycsb.records_per_partition = 100;
        cfg.client.clients = 1;
        cfg.client.inflight = 3;
        cfg.client.txns = 10;
        cfg.client.drain_timeout_s = 0.2;
        let workload = qstore_workload::build(&cfg).unwrap();
        let target = Silent(Default::default());
        let driven = drive(&cfg, &target, workload.as_ref(), &mut None, None);
        assert_eq!(driven.stats.unfinished, 3);
        assert_eq!(target.0.lock().len(), 3);
    }

    /// A cluster that commits one request every `PACE`, in order of arrival.
    struct Slow(crossbeam_channel::Sender<TxnRequest>);

    const PACE: Duration = Duration::from_millis(60);

    impl Target for Slow {
        fn submit(&self, _: NodeId, req: TxnRequest) {
            let _ = self.0.send(req);
        }
        fn traffic(&self) -> Vec<(u64, u64)> {
            Vec::new()
        }
    }

    #[test]
    fn a_slow_cluster_drains_every_transaction_while_it_keeps_finishing_them() {
        let mut cfg = small();
        cfg.client.inflight = 8;
        cfg.client.duration_s = 0.2;
        // Draining 8 transactions takes 8 x PACE, longer than the drain timeout, but one
        // finishes every PACE.
        cfg.client.drain_timeout_s = 0.3;
        let (tx, rx) = crossbeam_channel::unbounded::<TxnRequest>();
        let server = std::thread::spawn(move || {
            while let Ok(req) = rx.recv() {
                std::thread::sleep(PACE);
                req.answer(qstore_core::txn::TxnOutcome::Committed(Vec::new()));
            }
        });
        let workload = qstore_workload::build(&cfg).unwrap();
        let driven = drive(&cfg, &Slow(tx), workload.as_ref(), &mut None, None);
        assert_eq!(driven.stats.unfinished, 0);
        server.join().unwrap();
    }
}
