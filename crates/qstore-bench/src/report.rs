//! The results of a run: one serializable record, printed as a table, written as JSON or CSV.

use crate::stats::ClientStats;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use qstore_core::config::ReplicationLayer;
use qstore_core::RunConfig;
use qstore_engine::stages::{PerTxn, StageSummary, StageTotals};
use qstore_engine::worker_time::{TimeShares, ACTIVITIES};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Latency {
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// The cumulative distribution at fixed fractions (see [`crate::cdf::fractions`]):
    /// what a latency CDF figure draws.
    pub cdf: Vec<crate::cdf::CdfPoint>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NodeTraffic {
    pub node: u32,
    pub msgs: u64,
    pub bytes: u64,
}

/// Everything a run measured, plus the configuration that produced it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunReport {
    pub protocol: String,
    pub workload: String,
    pub nodes: u32,
    pub workers: u32,
    /// Copies of every partition (replication factor), and how they replicate.
    pub replicas: u32,
    /// Empty without replication.
    pub replication_mode: String,
    pub clients: u32,
    /// Load-generator threads that drove them.
    pub client_threads: u32,
    pub inflight: u32,
    /// Open-loop target rate (0 = closed loop).
    pub rate: f64,
    pub seed: u64,
    /// Seconds spent loading the initial data.
    pub load_s: f64,
    /// Length of the measurement window in seconds.
    pub window_s: f64,
    pub committed: u64,
    pub ops: u64,
    pub throughput_tps: f64,
    pub throughput_ops: f64,
    pub latency: Latency,
    /// Concurrency-control aborts by cause (each attempt that was aborted and retried).
    pub cc_aborts: BTreeMap<String, u64>,
    /// cc aborts / (commits + cc aborts).
    pub abort_rate: f64,
    /// Logic-induced aborts (integrity checks of the programs); never retried.
    pub logic_aborts: u64,
    /// The logic aborts by the reason their program gave.
    pub logic_aborts_by_reason: BTreeMap<String, u64>,
    /// Requests the cluster refused, with the first reason.
    pub rejected: u64,
    pub first_rejection: Option<String>,
    /// Transactions still unanswered when the run stopped waiting.
    pub unfinished: u64,
    /// Resubmissions to another server after a `NotLeader` answer (replication fail-over).
    #[serde(default)]
    pub redirected: u64,
    /// The longest time between two commits of the run (warm-up and drain included) in
    /// which no transaction committed, to 10 ms: a fail-over's unavailability, for instance.
    #[serde(default)]
    pub longest_stall_ms: u64,
    pub missed_arrivals: u64,
    /// Committed answers that broke a workload invariant (e.g. a bank audit's sum).
    pub invariant_violations: u64,
    pub first_violation: Option<String>,
    pub msgs_per_txn: f64,
    pub bytes_per_txn: f64,
    /// Distributed mode: node-to-node messages per TCP frame over the whole run (how well
    /// the send path batches).
    pub msgs_per_frame: Option<f64>,
    pub per_node: Vec<NodeTraffic>,
    /// The back-off policy after concurrency-control aborts, in microseconds.
    pub backoff_base_us: u64,
    pub backoff_max_us: u64,
    /// Throughput, latency and traffic in each second of the measurement window.
    pub timeline: Vec<crate::timeline::TimelinePoint>,
    /// The protocol's own event counts over the measurement window, by name (e.g. LEAP's
    /// transfers by case), summed over the nodes.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub counters: qstore_engine::protocol::ProtocolCounters,
    /// Content hash of each partition after the run, when asked for.
    pub state_hashes: Option<Vec<String>>,
    /// Where transactions spent their time, stage by stage, over the measurement window
    /// (protocols that measure it; over TCP from the servers' totals, without percentiles).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageSummary>,
    /// Where the worker threads' time went over the measurement window, by activity
    /// (protocols that account it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_time: Option<WorkerTime>,
    /// What the servers' logs did over the measurement window (runs with data directories).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<LogActivity>,
    /// The workload's background transactions over the measurement window (the
    /// microbenchmark's index updates), counted apart from every figure above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background: Option<Background>,
    pub config: RunConfig,
}

/// What the workload's background transactions did (see `Workload::background`).
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Background {
    pub committed: u64,
    pub per_s: f64,
    /// Concurrency-control aborts (each retried).
    pub cc_aborts: u64,
}

/// The servers' logs over a measurement window, summed over the servers: how hard
/// durability worked, and how well group commit shared its syncs.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct LogActivity {
    pub records_per_s: f64,
    pub mb_per_s: f64,
    pub fsyncs_per_s: f64,
    /// Records one `fdatasync` made durable, on average (`None`: no sync, `--fsync never`).
    pub records_per_fsync: Option<f64>,
    /// Committed transactions per `fdatasync` (every server's syncs counted).
    pub txns_per_fsync: Option<f64>,
}

impl LogActivity {
    pub fn over(l: &qstore_log::LogStats, window_s: f64, committed: u64) -> LogActivity {
        let per_s = |n: u64| n as f64 / window_s.max(1e-9);
        let per_sync = |n: u64| (l.syncs > 0).then(|| n as f64 / l.syncs as f64);
        LogActivity {
            records_per_s: per_s(l.appends),
            mb_per_s: per_s(l.written_bytes) / 1e6,
            fsyncs_per_s: per_s(l.syncs),
            records_per_fsync: per_sync(l.appends),
            txns_per_fsync: per_sync(committed),
        }
    }
}

/// Shares of the worker threads' wall time over the measurement window, by activity (the
/// determinism study's figure 2: useful work, lock acquisition, deadlock handling, two-phase
/// commit, idle): over every node, and per node.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WorkerTime {
    #[serde(flatten)]
    pub all: TimeShares,
    pub per_node: Vec<NodeTimeShares>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NodeTimeShares {
    pub node: u32,
    #[serde(flatten)]
    pub shares: TimeShares,
}

impl WorkerTime {
    /// From each node's totals over the window; `None` when nothing was accounted.
    pub fn over(nodes: &[(qstore_core::NodeId, StageTotals)]) -> Option<WorkerTime> {
        let mut sum: Option<StageTotals> = None;
        for (_, t) in nodes {
            match &mut sum {
                Some(s) => s.add(t),
                None => sum = Some(t.clone()),
            }
        }
        let mut per_node: Vec<NodeTimeShares> = nodes
            .iter()
            .filter_map(|(n, t)| {
                let shares = TimeShares::of(t)?;
                Some(NodeTimeShares { node: n.0, shares })
            })
            .collect();
        per_node.sort_by_key(|n| n.node);
        Some(WorkerTime {
            all: TimeShares::of(&sum?)?,
            per_node,
        })
    }
}

/// "useful 41.2, lock 9.8, ..., idle 20.3": the activities that took any time, in order.
fn shares_line(s: &TimeShares) -> String {
    ACTIVITIES
        .iter()
        .filter(|a| s.pct(a) > 0.0)
        .map(|a| format!("{a} {:.1}", s.pct(a)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Network traffic during the measurement window: (messages, bytes) per node.
pub type Traffic = Vec<(u64, u64)>;

impl RunReport {
    /// The logic aborts, and (when there are any) how many of each reason, most frequent
    /// first.
    fn logic_aborts_line(&self) -> String {
        let mut reasons: Vec<_> = self.logic_aborts_by_reason.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let mut line = group(self.logic_aborts);
        if !reasons.is_empty() {
            let each: Vec<String> = reasons
                .iter()
                .map(|(why, n)| format!("{} {why}", group(**n)))
                .collect();
            line = format!("{line}: {}", each.join("; "));
        }
        line
    }

    /// Why this run measured nothing worth a benchmark figure: transactions left
    /// unanswered, or none committed.
    pub fn failure(&self) -> Option<String> {
        if self.unfinished > 0 {
            Some(format!("{} transaction(s) unanswered", self.unfinished))
        } else if self.committed == 0 {
            Some("no transaction committed".into())
        } else {
            None
        }
    }

    /// The protocol counter `name` over the window per committed transaction (0 when the
    /// protocol has no such counter or nothing committed).
    pub fn counter_per_txn(&self, name: &str) -> f64 {
        let n = self.counters.get(name).copied().unwrap_or(0);
        if self.committed == 0 {
            0.0
        } else {
            n as f64 / self.committed as f64
        }
    }

    pub(crate) fn new(
        cfg: &RunConfig,
        stats: &ClientStats,
        window_s: f64,
        load_s: f64,
        traffic: Traffic,
        timeline: Vec<crate::timeline::TimelinePoint>,
    ) -> Self {
        let h = &stats.latency_us;
        let per_commit = |x: u64| {
            if stats.commits == 0 {
                0.0
            } else {
                x as f64 / stats.commits as f64
            }
        };
        let cc = stats.cc_abort_total();
        let (msgs, bytes) = traffic
            .iter()
            .fold((0, 0), |(m, b), (m2, b2)| (m + m2, b + b2));
        let clients = cfg.client.effective_clients(cfg.cluster.nodes);
        RunReport {
            protocol: cfg.protocol.name.clone(),
            workload: cfg.workload.name.clone(),
            nodes: cfg.cluster.nodes,
            workers: cfg.cluster.workers,
            replicas: cfg.replication.factor,
            replication_mode: match (
                cfg.replication.factor,
                cfg.replication.point_of(&cfg.protocol.name),
            ) {
                (1, _) => String::new(),
                (_, 1) if cfg.protocol.name == "calvin" => match cfg.replication.layer {
                    ReplicationLayer::Raft => "point 1 (sequenced epochs, before they run)".into(),
                    ReplicationLayer::Zookeeper => {
                        "point 1 (sequenced epochs, through ZooKeeper)".into()
                    }
                },
                (_, 1) => "point 1 (transactions, planned by every member)".into(),
                _ => format!("{:?}", cfg.replication.mode).to_lowercase(),
            },
            clients,
            client_threads: cfg.client.effective_threads(clients),
            inflight: cfg.client.inflight,
            rate: cfg.client.rate,
            seed: cfg.seed,
            load_s,
            window_s,
            committed: stats.commits,
            ops: stats.ops,
            throughput_tps: stats.commits as f64 / window_s.max(1e-9),
            throughput_ops: stats.ops as f64 / window_s.max(1e-9),
            latency: Latency {
                mean_us: h.mean(),
                p50_us: h.value_at_quantile(0.50),
                p90_us: h.value_at_quantile(0.90),
                p99_us: h.value_at_quantile(0.99),
                p999_us: h.value_at_quantile(0.999),
                max_us: h.max(),
                cdf: crate::cdf::of(h),
            },
            cc_aborts: stats
                .cc_aborts
                .iter()
                .map(|(c, n)| (c.name().to_string(), *n))
                .collect(),
            abort_rate: if stats.commits + cc == 0 {
                0.0
            } else {
                cc as f64 / (stats.commits + cc) as f64
            },
            logic_aborts: stats.logic_aborts,
            logic_aborts_by_reason: stats.logic_reasons.clone(),
            rejected: stats.rejected,
            first_rejection: stats.first_rejection.clone(),
            unfinished: stats.unfinished,
            redirected: stats.redirected,
            longest_stall_ms: stats.longest_stall_ms(),
            missed_arrivals: stats.missed_arrivals,
            invariant_violations: stats.invariant_violations,
            first_violation: stats.first_violation.clone(),
            msgs_per_txn: per_commit(msgs),
            bytes_per_txn: per_commit(bytes),
            msgs_per_frame: None,
            per_node: traffic
                .iter()
                .enumerate()
                .map(|(i, &(msgs, bytes))| NodeTraffic {
                    node: i as u32,
                    msgs,
                    bytes,
                })
                .collect(),
            backoff_base_us: cfg.client.backoff_base_us,
            backoff_max_us: cfg.client.backoff_max_us,
            timeline,
            counters: Default::default(),
            state_hashes: None,
            stages: Vec::new(),
            worker_time: None,
            log: None,
            background: None,
            config: cfg.clone(),
        }
    }

    /// Adds what the background transactions did (`stats`, over the same window). Those
    /// refused or left unanswered count with the clients': a run that leaves any
    /// transaction unanswered failed, whichever thread sent it.
    pub fn add_background(&mut self, stats: &ClientStats) {
        self.background = Some(Background {
            committed: stats.commits,
            per_s: stats.commits as f64 / self.window_s.max(1e-9),
            cc_aborts: stats.cc_aborts.values().sum(),
        });
        self.unfinished += stats.unfinished;
        self.rejected += stats.rejected;
        if self.first_rejection.is_none() {
            self.first_rejection.clone_from(&stats.first_rejection);
        }
    }

    /// A human-readable table of the main figures.
    pub fn table(&self) -> String {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header(vec!["metric", "value"]);
        for (name, value) in self.rows() {
            t.add_row(vec![
                Cell::new(name),
                Cell::new(value).set_alignment(CellAlignment::Right),
            ]);
        }
        t.to_string()
    }

    fn rows(&self) -> Vec<(String, String)> {
        let l = &self.latency;
        let aborts = if self.cc_aborts.is_empty() {
            "none".to_string()
        } else {
            self.cc_aborts
                .iter()
                .map(|(c, n)| format!("{c}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut rows = vec![
            ("protocol", self.protocol.clone()),
            ("workload", self.workload.clone()),
            (
                "nodes x workers",
                format!("{} x {}", self.nodes, self.workers),
            ),
        ];
        if self.replicas > 1 {
            rows.push((
                "replication",
                format!(
                    "{} copies of each partition ({} nodes), {}",
                    self.replicas,
                    self.nodes * self.replicas,
                    self.replication_mode
                ),
            ));
        }
        rows.extend([
            (
                "clients x inflight",
                if self.rate > 0.0 {
                    format!("{} clients, open loop {} txn/s", self.clients, self.rate)
                } else {
                    format!("{} x {}", self.clients, self.inflight)
                },
            ),
            ("load threads", self.client_threads.to_string()),
            ("window (s)", format!("{:.2}", self.window_s)),
            ("committed", group(self.committed)),
            (
                "throughput (txn/s)",
                group(self.throughput_tps.round() as u64),
            ),
            (
                "throughput (ops/s)",
                group(self.throughput_ops.round() as u64),
            ),
            ("latency mean (us)", format!("{:.1}", l.mean_us)),
            (
                "latency p50/p90 (us)",
                format!("{} / {}", l.p50_us, l.p90_us),
            ),
            (
                "latency p99/p99.9 (us)",
                format!("{} / {}", l.p99_us, l.p999_us),
            ),
            ("latency max (us)", l.max_us.to_string()),
            (
                "abort rate (cc)",
                format!("{:.2}%", self.abort_rate * 100.0),
            ),
            ("cc aborts by cause", aborts),
            ("logic aborts", self.logic_aborts_line()),
            ("msgs per txn", format!("{:.2}", self.msgs_per_txn)),
            ("bytes per txn", format!("{:.1}", self.bytes_per_txn)),
            (
                "msgs per frame",
                self.msgs_per_frame
                    .map_or("in-process".into(), |f| format!("{f:.1} (tcp)")),
            ),
            (
                "back-off (us)",
                format!(
                    "U[0, min({}, {}*2^retries))",
                    self.backoff_max_us, self.backoff_base_us
                ),
            ),
            ("load time (s)", format!("{:.2}", self.load_s)),
        ]);
        if self.rejected > 0 {
            let why = self.first_rejection.clone().unwrap_or_default();
            rows.push(("rejected", format!("{} ({why})", self.rejected)));
        }
        if self.unfinished > 0 {
            rows.push(("unfinished", group(self.unfinished)));
        }
        if self.redirected > 0 {
            rows.push(("redirected to the leader", group(self.redirected)));
        }
        if self.longest_stall_ms >= 100 {
            rows.push((
                "longest time without a commit (ms)",
                group(self.longest_stall_ms),
            ));
        }
        if self.invariant_violations > 0 {
            let why = self.first_violation.clone().unwrap_or_default();
            rows.push((
                "INVARIANT VIOLATIONS",
                format!("{} ({why})", self.invariant_violations),
            ));
        }
        if self.missed_arrivals > 0 {
            rows.push(("missed arrivals", group(self.missed_arrivals)));
        }
        if let Some(b) = &self.background {
            rows.push((
                "background txn/s (cc aborts)",
                format!("{} ({})", group(b.per_s.round() as u64), group(b.cc_aborts)),
            ));
        }
        if let Some(l) = &self.log {
            rows.push((
                "log: records/s, MB/s",
                format!("{}, {:.1}", group(l.records_per_s as u64), l.mb_per_s),
            ));
            rows.push((
                "log: fsyncs/s, records and txns per fsync",
                format!(
                    "{}, {}, {}",
                    group(l.fsyncs_per_s as u64),
                    l.records_per_fsync
                        .map_or("-".into(), |r| format!("{r:.1}")),
                    l.txns_per_fsync.map_or("-".into(), |r| format!("{r:.1}"))
                ),
            ));
        }
        let mut rows: Vec<(String, String)> =
            rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        for (name, &n) in &self.counters {
            rows.push((
                name.clone(),
                format!("{} ({:.3} per txn)", group(n), self.counter_per_txn(name)),
            ));
        }
        for s in &self.stages {
            if let Some(c) = s.per_txn {
                rows.push((
                    format!("{} per txn", s.stage),
                    format!("{:.1} us, {:.2} msgs, {:.0} bytes", c.us, c.msgs, c.bytes),
                ));
            } else if s.txns > 0 {
                // (A stage the run's configuration does not have measures nothing.)
                let p50 = s.p50_us.map_or("-".into(), |p| format!("{p:.1}"));
                rows.push((
                    format!("stage {} p50/mean (us)", s.stage),
                    format!("{p50} / {:.1}", s.mean_us),
                ));
            }
        }
        if let Some(w) = &self.worker_time {
            rows.extend(self.worker_time_rows(w));
        }
        rows
    }

    /// The workers' time by activity, over the nodes and (with several) per node.
    fn worker_time_rows(&self, w: &WorkerTime) -> Vec<(String, String)> {
        let threads = w.all.worker_s / self.window_s.max(1e-9);
        let mut rows = vec![(
            "worker time (% of threads x window)".to_string(),
            format!("{} ({threads:.1} threads)", shares_line(&w.all)),
        )];
        if w.per_node.len() > 1 {
            for n in &w.per_node {
                rows.push((
                    format!("worker time node {} (%)", n.node),
                    shares_line(&n.shares),
                ));
            }
        }
        rows
    }

    /// Activity `name`'s share of the workers' time over the window, in percent (`None`
    /// for protocols that do not account it).
    pub fn worker_pct(&self, name: &str) -> Option<f64> {
        Some(self.worker_time.as_ref()?.all.pct(name))
    }

    /// The CSV columns of the workers' time by activity; empty cells for protocols that do
    /// not account it.
    fn worker_columns(&self) -> Vec<(String, String)> {
        ACTIVITIES
            .iter()
            .map(|a| {
                let cell = self
                    .worker_pct(a)
                    .map_or(String::new(), |p| format!("{p:.2}"));
                (format!("worker_{a}_pct"), cell)
            })
            .collect()
    }

    /// Phase `name`'s time and traffic per committed transaction (the interactive protocols'
    /// phases: execution, prepare, commit, aborted attempts).
    pub fn phase(&self, name: &str) -> Option<PerTxn> {
        self.stages.iter().find(|s| s.stage == name)?.per_txn
    }

    /// The CSV columns of the interactive protocols' phases, per committed transaction; empty
    /// for protocols that do not measure them.
    fn phase_columns(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (stage, key) in PHASE_COLUMNS {
            let cost = self.phase(stage);
            let cell = |f: fn(&PerTxn) -> String| cost.as_ref().map(f).unwrap_or_default();
            out.push((format!("phase_{key}_us"), cell(|c| format!("{:.2}", c.us))));
            out.push((
                format!("phase_{key}_msgs"),
                cell(|c| format!("{:.3}", c.msgs)),
            ));
            out.push((
                format!("phase_{key}_bytes"),
                cell(|c| format!("{:.1}", c.bytes)),
            ));
        }
        out
    }

    pub fn write_json(&self, out: impl Write) -> std::io::Result<()> {
        serde_json::to_writer_pretty(out, self).map_err(std::io::Error::other)
    }

    /// One header line and one data line of the scalar figures, for spreadsheets and sweeps.
    pub fn write_csv(&self, out: impl Write) -> std::io::Result<()> {
        let mut w = csv::Writer::from_writer(out);
        let l = &self.latency;
        let cc: u64 = self.cc_aborts.values().sum();
        let fields: Vec<(&str, String)> = vec![
            ("protocol", self.protocol.clone()),
            ("workload", self.workload.clone()),
            ("nodes", self.nodes.to_string()),
            ("workers", self.workers.to_string()),
            ("replicas", self.replicas.to_string()),
            ("replication_mode", self.replication_mode.clone()),
            ("clients", self.clients.to_string()),
            ("client_threads", self.client_threads.to_string()),
            ("inflight", self.inflight.to_string()),
            ("rate", self.rate.to_string()),
            ("seed", self.seed.to_string()),
            ("window_s", format!("{:.3}", self.window_s)),
            ("committed", self.committed.to_string()),
            ("ops", self.ops.to_string()),
            ("throughput_tps", format!("{:.1}", self.throughput_tps)),
            ("throughput_ops", format!("{:.1}", self.throughput_ops)),
            ("latency_mean_us", format!("{:.1}", l.mean_us)),
            ("latency_p50_us", l.p50_us.to_string()),
            ("latency_p90_us", l.p90_us.to_string()),
            ("latency_p99_us", l.p99_us.to_string()),
            ("latency_p999_us", l.p999_us.to_string()),
            ("latency_max_us", l.max_us.to_string()),
            ("cc_aborts", cc.to_string()),
            ("abort_rate", format!("{:.6}", self.abort_rate)),
            ("logic_aborts", self.logic_aborts.to_string()),
            ("rejected", self.rejected.to_string()),
            ("unfinished", self.unfinished.to_string()),
            ("msgs_per_txn", format!("{:.3}", self.msgs_per_txn)),
            ("bytes_per_txn", format!("{:.1}", self.bytes_per_txn)),
            ("backoff_base_us", self.backoff_base_us.to_string()),
            ("backoff_max_us", self.backoff_max_us.to_string()),
        ];
        let mut phases = self.phase_columns();
        phases.extend(self.worker_columns());
        let names = fields.iter().map(|(k, _)| *k);
        w.write_record(names.chain(phases.iter().map(|(k, _)| k.as_str())))?;
        let values = fields.iter().map(|(_, v)| v.as_str());
        w.write_record(values.chain(phases.iter().map(|(_, v)| v.as_str())))?;
        w.flush()
    }
}

/// The interactive protocols' phases (as their stages are named) and their CSV column keys.
const PHASE_COLUMNS: [(&str, &str); 4] = [
    ("execution", "execution"),
    ("prepare", "prepare"),
    ("commit", "commit"),
    ("aborted attempts", "abort"),
];

/// 1234567 -> "1,234,567".
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
    }

    /// Background transactions count apart, except those refused or left unanswered: they
    /// fail the run like the clients' own.
    #[test]
    fn background_work_counts_apart_but_its_failures_fail_the_run() {
        let mut clients = ClientStats::default();
        clients.record_commit(10, 100);
        let mut r = RunReport::new(&RunConfig::default(), &clients, 2.0, 0.0, vec![], vec![]);
        let mut background = ClientStats::default();
        for _ in 0..8 {
            background.record_commit(1, 50);
        }
        background.record_cc_abort(qstore_core::txn::CcAbortCause::Conflict);
        background.unfinished = 2;
        background.rejected = 1;
        background.first_rejection = Some("queue full".into());
        r.add_background(&background);
        let b = r.background.expect("reported");
        assert_eq!((b.committed, b.cc_aborts, b.per_s), (8, 1, 4.0));
        assert_eq!(
            (r.committed, r.abort_rate),
            (1, 0.0),
            "the clients' figures alone"
        );
        assert_eq!((r.unfinished, r.rejected), (2, 1));
        assert_eq!(r.first_rejection.as_deref(), Some("queue full"));
        assert!(r.table().contains("background txn/s"), "{}", r.table());
    }

    #[test]
    fn report_formats_agree() {
        let mut stats = ClientStats::default();
        stats.record_commit(16, 250);
        stats.record_cc_abort(qstore_core::txn::CcAbortCause::Conflict);
        let mut r = RunReport::new(
            &RunConfig::default(),
            &stats,
            2.0,
            0.1,
            vec![(4, 400), (2, 100)],
            vec![crate::timeline::TimelinePoint {
                t_s: 1.0,
                tps: 1.0,
                latency_mean_ms: 0.25,
                msgs_per_s: 6.0,
                bytes_per_s: 500.0,
            }],
        );
        r.counters.insert("leap_received_rp_o".into(), 3);
        assert_eq!(r.throughput_tps, 0.5);
        assert_eq!(r.abort_rate, 0.5);
        assert_eq!(r.msgs_per_txn, 6.0);
        let table = r.table();
        assert!(
            table.contains("throughput (txn/s)") && table.contains("conflict=1"),
            "{table}"
        );
        assert!(
            table.contains("leap_received_rp_o") && table.contains("3 (3.000 per txn)"),
            "{table}"
        );
        let mut csv = Vec::new();
        r.write_csv(&mut csv).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        assert_eq!(csv.lines().count(), 2);
        let mut json = Vec::new();
        r.write_json(&mut json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["latency"]["p50_us"], 250);
        assert_eq!(v["latency"]["cdf"][102]["fraction"], 1.0);
        assert_eq!(v["latency"]["cdf"][102]["latency_us"], 250);
        assert_eq!(v["cc_aborts"]["conflict"], 1);
        assert_eq!(v["counters"]["leap_received_rp_o"], 3);
        assert_eq!(v["timeline"][0]["latency_mean_ms"], 0.25);
    }

    /// The workers' time by activity reaches the table, the CSV and the JSON, over the
    /// nodes and per node.
    #[test]
    fn worker_time_is_reported_in_every_format() {
        let totals = |ns: [u64; 7]| StageTotals {
            names: ACTIVITIES.iter().map(|a| a.to_string()).collect(),
            per_txn: false,
            stages: ns
                .iter()
                .map(|&ns| qstore_engine::stages::StageTotal {
                    ns,
                    ..Default::default()
                })
                .collect(),
        };
        let ms = 1_000_000;
        // useful, lock, deadlock, 2pc, planning, other, idle
        let n0 = totals([600 * ms, 100 * ms, 0, 100 * ms, 0, 0, 200 * ms]);
        let n1 = totals([200 * ms, 100 * ms, 0, 100 * ms, 0, 0, 600 * ms]);
        let nodes = [(qstore_core::NodeId(1), n1), (qstore_core::NodeId(0), n0)];
        let mut r = RunReport::new(
            &RunConfig::default(),
            &ClientStats::default(),
            1.0,
            0.0,
            vec![],
            vec![],
        );
        r.worker_time = WorkerTime::over(&nodes);
        let w = r.worker_time.as_ref().unwrap();
        assert_eq!((w.all.worker_s, w.all.pct("useful")), (2.0, 40.0));
        assert_eq!(w.per_node[0].node, 0);
        assert_eq!(r.worker_pct("idle"), Some(40.0));
        let table = r.table();
        assert!(
            table.contains("useful 40.0, lock 10.0, 2pc 10.0, idle 40.0 (2.0 threads)"),
            "{table}"
        );
        assert!(table.contains("worker time node 1 (%)"), "{table}");
        let mut csv = Vec::new();
        r.write_csv(&mut csv).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        let (header, row) = csv.split_once('\n').unwrap();
        let at = header
            .split(',')
            .position(|c| c == "worker_2pc_pct")
            .unwrap();
        assert_eq!(row.split(',').nth(at), Some("10.00"), "{csv}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["worker_time"]["pct"]["lock"], 10.0);
        assert_eq!(json["worker_time"]["per_node"][1]["pct"]["idle"], 60.0);
    }
}
