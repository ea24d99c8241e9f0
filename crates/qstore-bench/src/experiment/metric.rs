//! The figures a run yields, by name: what a spec's y axes and trends refer to, and the metric
//! columns of `results.csv`.

use crate::report::RunReport;
use crate::timeline::TimelinePoint;

/// A measured quantity of a run.
pub struct Metric {
    pub name: &'static str,
    /// Axis label, with its unit.
    pub label: &'static str,
    pub of: fn(&RunReport) -> f64,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Time (us) in an interactive protocol's phase per committed transaction; 0 for protocols
/// without phases.
fn phase_us(r: &RunReport, phase: &str) -> f64 {
    r.phase(phase).map_or(0.0, |c| c.us)
}

/// Node-to-node messages in an interactive protocol's phase per committed transaction.
fn phase_msgs(r: &RunReport, phase: &str) -> f64 {
    r.phase(phase).map_or(0.0, |c| c.msgs)
}

/// Activity `name`'s share of the worker threads' time, in percent; 0 for protocols that do
/// not account it.
fn worker_pct(r: &RunReport, name: &str) -> f64 {
    r.worker_pct(name).unwrap_or(0.0)
}

/// Attempts aborted for `cause`, as a percentage of all attempts (commits and
/// concurrency-control aborts), as the Sundial paper's figure 12 counts them.
fn aborts_pct(r: &RunReport, cause: &str) -> f64 {
    let all: u64 = r.cc_aborts.values().sum();
    let of_cause = r.cc_aborts.get(cause).copied().unwrap_or(0);
    if all == 0 {
        return 0.0;
    }
    r.abort_rate * 100.0 * of_cause as f64 / all as f64
}

/// Records LEAP moved to a transaction's node, in any of the three cases, per committed
/// transaction.
fn leap_transfers_per_txn(r: &RunReport) -> f64 {
    [
        "leap_received_rp_o",
        "leap_received_r_po",
        "leap_received_r_p_o",
    ]
    .iter()
    .map(|c| r.counter_per_txn(c))
    .sum()
}

/// Every metric, in the column order of `results.csv`.
pub const METRICS: &[Metric] = &[
    Metric {
        name: "throughput_tps",
        label: "throughput (txn/s)",
        of: |r| r.throughput_tps,
    },
    Metric {
        name: "throughput_per_node",
        label: "throughput per node (txn/s)",
        of: |r| r.throughput_tps / f64::from(r.nodes.max(1)),
    },
    Metric {
        name: "throughput_ops",
        label: "throughput (operations/s)",
        of: |r| r.throughput_ops,
    },
    Metric {
        name: "latency_mean_ms",
        label: "mean latency (ms)",
        of: |r| r.latency.mean_us / 1000.0,
    },
    Metric {
        name: "latency_p50_ms",
        label: "median latency (ms)",
        of: |r| ms(r.latency.p50_us),
    },
    Metric {
        name: "latency_p90_ms",
        label: "90th percentile latency (ms)",
        of: |r| ms(r.latency.p90_us),
    },
    Metric {
        name: "latency_p99_ms",
        label: "99th percentile latency (ms)",
        of: |r| ms(r.latency.p99_us),
    },
    Metric {
        name: "latency_p999_ms",
        label: "99.9th percentile latency (ms)",
        of: |r| ms(r.latency.p999_us),
    },
    Metric {
        name: "abort_rate_pct",
        label: "concurrency-control aborts (% of attempts)",
        of: |r| r.abort_rate * 100.0,
    },
    Metric {
        name: "aborts_lease_newer_version_pct",
        label:
            "lease renewal aborts, case (a): rewritten at or after the commit ts (% of attempts)",
        of: |r| aborts_pct(r, "lease_newer_version"),
    },
    Metric {
        name: "aborts_lease_overwritten_pct",
        label: "lease renewal aborts, case (b): rewritten before the commit ts (% of attempts)",
        of: |r| aborts_pct(r, "lease_overwritten"),
    },
    Metric {
        name: "aborts_lease_locked_pct",
        label: "lease renewal aborts, case (c): row locked (% of attempts)",
        of: |r| aborts_pct(r, "lease_locked"),
    },
    Metric {
        name: "aborts_wait_die_pct",
        label: "write-write (WAIT_DIE) aborts (% of attempts)",
        of: |r| aborts_pct(r, "wait_die"),
    },
    Metric {
        name: "aborts_frozen_range_pct",
        label: "MaaT aborts against a frozen [x, inf) range (% of attempts)",
        of: |r| aborts_pct(r, "frozen_range"),
    },
    Metric {
        name: "aborts_range_empty_pct",
        label: "MaaT aborts for other empty ranges (% of attempts)",
        of: |r| aborts_pct(r, "range_empty"),
    },
    Metric {
        name: "aborts_timestamp_order_pct",
        label: "timestamp-order aborts (% of attempts)",
        of: |r| aborts_pct(r, "timestamp_order"),
    },
    Metric {
        name: "aborts_ollp_restart_pct",
        label: "OLLP restarts: stale reconnaissance (% of attempts)",
        of: |r| aborts_pct(r, "ollp_restart"),
    },
    Metric {
        name: "background_tps",
        label: "background transactions (index updates) per second",
        of: |r| r.background.map_or(0.0, |b| b.per_s),
    },
    Metric {
        name: "msgs_per_txn",
        label: "messages per transaction",
        of: |r| r.msgs_per_txn,
    },
    Metric {
        name: "bytes_per_txn",
        label: "bytes sent per transaction",
        of: |r| r.bytes_per_txn,
    },
    Metric {
        name: "msgs_per_s",
        label: "messages sent per second (all nodes)",
        of: |r| r.msgs_per_txn * r.throughput_tps,
    },
    Metric {
        name: "bytes_per_s",
        label: "bytes sent per second (all nodes)",
        of: |r| r.bytes_per_txn * r.throughput_tps,
    },
    Metric {
        name: "phase_execution_us",
        label: "execution phase per txn (us)",
        of: |r| phase_us(r, "execution"),
    },
    Metric {
        name: "phase_prepare_us",
        label: "prepare phase per txn (us)",
        of: |r| phase_us(r, "prepare"),
    },
    Metric {
        name: "phase_commit_us",
        label: "commit phase per txn (us)",
        of: |r| phase_us(r, "commit"),
    },
    Metric {
        name: "phase_abort_us",
        label: "aborted attempts per txn (us)",
        of: |r| phase_us(r, "aborted attempts"),
    },
    Metric {
        name: "phase_execution_msgs",
        label: "execution messages per txn",
        of: |r| phase_msgs(r, "execution"),
    },
    Metric {
        name: "phase_commit_msgs",
        label: "commit-phase messages per txn",
        of: |r| phase_msgs(r, "commit"),
    },
    Metric {
        name: "phase_abort_msgs",
        label: "messages of aborted attempts per txn",
        of: |r| phase_msgs(r, "aborted attempts"),
    },
    Metric {
        name: "worker_useful_pct",
        label: "useful work: transaction logic (% of worker time)",
        of: |r| worker_pct(r, "useful"),
    },
    Metric {
        name: "worker_lock_pct",
        label: "lock acquisition and release (% of worker time)",
        of: |r| worker_pct(r, "lock"),
    },
    Metric {
        name: "worker_deadlock_pct",
        label: "deadlock detection and handling (% of worker time)",
        of: |r| worker_pct(r, "deadlock"),
    },
    Metric {
        name: "worker_2pc_pct",
        label: "commit protocol: prepare, commit, abort (% of worker time)",
        of: |r| worker_pct(r, "2pc"),
    },
    Metric {
        name: "worker_planning_pct",
        label: "Q-Store planning (% of worker time)",
        of: |r| worker_pct(r, "planning"),
    },
    Metric {
        name: "worker_other_pct",
        label: "other: messages, bookkeeping (% of worker time)",
        of: |r| worker_pct(r, "other"),
    },
    Metric {
        name: "worker_idle_pct",
        label: "idle: waiting for locks, messages, work (% of worker time)",
        of: |r| worker_pct(r, "idle"),
    },
    Metric {
        name: "leap_transfers_per_txn",
        label: "records moved to the transaction's node per txn",
        of: leap_transfers_per_txn,
    },
    Metric {
        name: "leap_transfers_per_s",
        label: "records moved per second (all nodes)",
        of: |r| leap_transfers_per_txn(r) * r.throughput_tps,
    },
    Metric {
        name: "leap_rp_o_per_txn",
        label: "RP-O transfers per txn (requester is the partitioner)",
        of: |r| r.counter_per_txn("leap_received_rp_o"),
    },
    Metric {
        name: "leap_r_po_per_txn",
        label: "R-PO transfers per txn (partitioner is the owner)",
        of: |r| r.counter_per_txn("leap_received_r_po"),
    },
    Metric {
        name: "leap_r_p_o_per_txn",
        label: "R-P-O transfers per txn (three nodes)",
        of: |r| r.counter_per_txn("leap_received_r_p_o"),
    },
    Metric {
        name: "committed",
        label: "committed transactions",
        of: |r| r.committed as f64,
    },
];

/// How a metric is read off one point of a run's timeline.
pub type PerSecond = fn(&TimelinePoint) -> f64;

/// The metrics a run's timeline has, with the value of each at one of its points: what
/// an over-time figure can draw.
pub const OVER_TIME: &[(&str, PerSecond)] = &[
    ("throughput_tps", |p| p.tps),
    ("latency_mean_ms", |p| p.latency_mean_ms),
    ("msgs_per_s", |p| p.msgs_per_s),
    ("bytes_per_s", |p| p.bytes_per_s),
];

/// How metric `name` is read off a timeline point, if a timeline has it.
pub fn over_time(name: &str) -> Result<PerSecond, String> {
    OVER_TIME
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .ok_or_else(|| {
            format!(
                "metric {name:?} is not measured second by second; an over-time figure can \
                 draw: {}",
                OVER_TIME
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// The metric called `name`.
pub fn find(name: &str) -> Result<&'static Metric, String> {
    METRICS.iter().find(|m| m.name == name).ok_or_else(|| {
        format!(
            "unknown metric {name:?}; choose one of: {}",
            METRICS
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}
