//! Benchmark suites: named sets of runs made in one go on one machine, so their ratios are
//! comparable. `qstore bench --suite NAME` runs one and prints a table.

use crate::report::RunReport;
use qstore_core::RunConfig;
use serde::Serialize;

/// One run of a suite.
pub struct Scenario {
    pub name: String,
    pub cfg: RunConfig,
    /// Name of the scenario this one's throughput is divided by (its baseline).
    pub baseline: Option<String>,
}

/// Suites `qstore bench` knows.
pub const SUITES: &[(&str, &str)] = &[
    (
        "qstore",
        "YCSB (16 ops, 50% writes, uniform): qstore vs serial on 1 node x 2 workers (2 planners, \
         or 1), and on 2 nodes x 1 worker at 0%, 50% and 100% multi-partition transactions, \
         at the load given; then at light load on 1 node x 2 workers, whatever the load given: \
         1 client x 1 in flight (qstore's latency vs no_wait's and serial's) and 1 client x 10 \
         in flight (qstore's throughput vs serial's)",
    ),
    (
        "baselines",
        "YCSB (16 ops, 50% writes) on 2 nodes x 1 worker at theta 0 and 0.9, 0% and 50% \
         multi-partition transactions, 0 and 200 us injected network delay: every protocol of \
         `qstore protocols` (ratios are to qstore in the same setting)",
    ),
    (
        "qrstore",
        "QR-Store's replication overhead: YCSB (16 ops, 50% writes) on 2 partitions x 1 worker \
         at theta 0 and 0.9, 0% and 50% multi-partition transactions: qstore with 1, 2 and 3 \
         copies of each partition (speculative replication), and 3 copies synchronous (ratios \
         are to 1 copy in the same setting; every copy runs on this machine's cores)",
    ),
    (
        "sundial",
        "the Sundial paper's setting: YCSB (16 ops, 90% reads, 10% of accesses remote) on 4 \
         nodes x 1 and x 2 workers at theta 0.6 and 0.9: the interactive protocols and qstore \
         (ratios are to no_wait in the same setting)",
    ),
    (
        "tpcc",
        "TPC-C New-Order and Payment 50/50, and the standard mix, on 2 nodes at 1 and 4 \
         warehouses per node, 0%, 15% and 50% of transactions reaching another node's \
         warehouse: every protocol of `qstore protocols` (ratios are to qstore in the same setting), \
         then aborts by cause (OLLP restarts apart)",
    ),
];

/// New-Orders the cluster commits per second at most in the tpcc suite's runs, with half
/// again to spare (the fastest seen on 2 cores: about 120,000, at one warehouse per node
/// without remote transactions).
const TPCC_SUITE_NEW_ORDERS_PER_S: f64 = 180_000.0;

/// Orders a district must hold for a run of `base`'s length (warm-up, measurement, and two
/// seconds of draining) over `warehouses` warehouses in all, so that no New-Order finds its
/// district full: about 16 KB per order and warehouse (33,000, the default, is about half a
/// GB per warehouse), at most 60,000.
fn tpcc_suite_max_orders(base: &RunConfig, warehouses: u32) -> u32 {
    let c = &base.client;
    let seconds = c.warmup_s + c.duration_s + 2.0;
    let districts = (warehouses * qstore_core::config::TpccConfig::DISTRICTS) as f64;
    let orders = qstore_core::config::TpccConfig::INITIAL_ORDERS as f64
        + seconds * TPCC_SUITE_NEW_ORDERS_PER_S / districts;
    orders.min(60_000.0) as u32
}

/// The protocols the Sundial paper compares (those this build has), and qstore.
const SUNDIAL_PROTOCOLS: [&str; 9] = [
    "no_wait",
    "wait_die",
    "dl_detect",
    "timestamp",
    "mvcc",
    "occ",
    "maat",
    "sundial",
    "qstore",
];

/// The protocols the baselines suite compares: every registered one, qstore first (the
/// others' baseline), so that a protocol added to the registry joins the comparison.
fn baseline_protocols() -> Vec<&'static str> {
    let mut all = qstore_engine::protocol::names();
    all.sort_by_key(|p| *p != "qstore");
    all
}

/// The scenarios of suite `name`, built on `base` (which supplies duration, seed, load...).
pub fn scenarios(name: &str, base: &RunConfig) -> Result<Vec<Scenario>, String> {
    match name {
        "qstore" => Ok(qstore_suite(base)),
        "baselines" => Ok(baselines_suite(base)),
        "qrstore" => Ok(qrstore_suite(base)),
        "sundial" => Ok(sundial_suite(base)),
        "tpcc" => Ok(tpcc_suite(base)),
        _ => Err(format!(
            "unknown suite {name:?}; choose one of: {}",
            SUITES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn ycsb(base: &RunConfig, protocol: &str, nodes: u32, workers: u32, mp: f64) -> RunConfig {
    let mut c = base.clone();
    c.protocol.name = protocol.into();
    c.cluster.nodes = nodes;
    c.cluster.workers = workers;
    c.workload.name = "ycsb".into();
    let y = &mut c.workload.ycsb;
    y.ops_per_txn = 16;
    y.write_fraction = 0.5;
    y.theta = 0.0;
    y.multi_partition_fraction = mp;
    y.partitions_per_mp_txn = 2;
    c
}

fn baselines_suite(base: &RunConfig) -> Vec<Scenario> {
    let mut s = Vec::new();
    for delay_us in [0, 200] {
        for theta in [0.0, 0.9] {
            for mp in [0.0, 0.5] {
                let setting = format!("θ{theta} mp{} d{delay_us}", (mp * 100.0) as u32);
                for protocol in baseline_protocols() {
                    let mut cfg = ycsb(base, protocol, 2, 1, mp);
                    cfg.workload.ycsb.theta = theta;
                    cfg.net.delay_us = delay_us;
                    s.push(Scenario {
                        name: format!("{protocol} {setting}"),
                        cfg,
                        baseline: (protocol != "qstore").then(|| format!("qstore {setting}")),
                    });
                }
            }
        }
    }
    s
}

fn qrstore_suite(base: &RunConfig) -> Vec<Scenario> {
    use qstore_core::config::ReplicationMode::{Speculative, Synchronous};
    let mut s = Vec::new();
    for theta in [0.0, 0.9] {
        for mp in [0.0, 0.5] {
            let setting = format!("θ{theta} mp{}", (mp * 100.0) as u32);
            for (factor, mode) in [
                (1, Speculative),
                (2, Speculative),
                (3, Speculative),
                (3, Synchronous),
            ] {
                let mut cfg = ycsb(base, "qstore", 2, 1, mp);
                cfg.workload.ycsb.theta = theta;
                cfg.replication.factor = factor;
                cfg.replication.mode = mode;
                let sync = if mode == Synchronous { " sync" } else { "" };
                s.push(Scenario {
                    name: format!("rf{factor}{sync} {setting}"),
                    cfg,
                    baseline: (factor > 1).then(|| format!("rf1 {setting}")),
                });
            }
        }
    }
    s
}

fn sundial_suite(base: &RunConfig) -> Vec<Scenario> {
    let mut s = Vec::new();
    for workers in [1, 2] {
        for theta in [0.6, 0.9] {
            let setting = format!("4x{workers} θ{theta}");
            let present = SUNDIAL_PROTOCOLS
                .into_iter()
                .filter(|p| qstore_engine::protocol::info(p).is_some());
            for protocol in present {
                let mut cfg = ycsb(base, protocol, 4, workers, 0.0);
                let y = &mut cfg.workload.ycsb;
                (y.theta, y.write_fraction, y.remote_access_fraction) = (theta, 0.1, 0.1);
                s.push(Scenario {
                    name: format!("{protocol} {setting}"),
                    cfg,
                    baseline: (protocol != "no_wait").then(|| format!("no_wait {setting}")),
                });
            }
        }
    }
    s
}

fn tpcc_suite(base: &RunConfig) -> Vec<Scenario> {
    let mut s = Vec::new();
    use qstore_core::config::TpccMix;
    let mixes = [TpccMix::NeworderPayment, TpccMix::Standard];
    let settings = mixes
        .into_iter()
        .flat_map(|mix| [0.0, 0.15, 0.5].map(|mp| (mix, mp)));
    for warehouses in [1, 4] {
        for (mix, mp) in settings.clone() {
            let std = if mix == TpccMix::Standard { " std" } else { "" };
            let setting = format!("{warehouses}wh{std} mp{}", (mp * 100.0) as u32);
            for protocol in baseline_protocols() {
                let mut cfg = base.clone();
                cfg.protocol.name = protocol.into();
                cfg.cluster.nodes = 2;
                cfg.cluster.partitioning = qstore_core::config::Partitioning::Range;
                cfg.workload.name = "tpcc".into();
                let t = &mut cfg.workload.tpcc;
                t.mix = mix;
                t.warehouses_per_partition = warehouses;
                t.payment_fraction = match mix {
                    TpccMix::Standard => 0.43,
                    TpccMix::NeworderPayment => 0.5,
                };
                t.multi_partition_fraction = mp;
                t.max_orders_per_district = tpcc_suite_max_orders(base, 2 * warehouses);
                s.push(Scenario {
                    name: format!("{protocol} {setting}"),
                    cfg,
                    baseline: (protocol != "qstore").then(|| format!("qstore {setting}")),
                });
            }
        }
    }
    s
}

/// `cfg` driven by one client keeping `inflight` transactions in flight.
fn light(mut cfg: RunConfig, inflight: u32) -> RunConfig {
    cfg.client.clients = 1;
    cfg.client.inflight = inflight;
    cfg.client.rate = 0.0;
    cfg
}

/// Light load on 1 node x 2 workers: what a newcomer trying a few transactions sees.
fn light_scenarios(base: &RunConfig) -> Vec<Scenario> {
    let mut s = Vec::new();
    for inflight in [1, 10] {
        let load = format!("1x2 c1x{inflight}");
        let baseline = if inflight == 1 { "no_wait" } else { "serial" };
        for protocol in ["serial", "no_wait", "qstore"] {
            if inflight > 1 && protocol == "no_wait" {
                continue;
            }
            s.push(Scenario {
                name: format!("{protocol} {load}"),
                cfg: light(ycsb(base, protocol, 1, 2, 0.0), inflight),
                baseline: (protocol == "qstore").then(|| format!("{baseline} {load}")),
            });
        }
    }
    s
}

fn qstore_suite(base: &RunConfig) -> Vec<Scenario> {
    let mut s = vec![
        Scenario {
            name: "serial 1x1".into(),
            cfg: ycsb(base, "serial", 1, 1, 0.0),
            baseline: None,
        },
        Scenario {
            name: "qstore 1x2".into(),
            cfg: ycsb(base, "qstore", 1, 2, 0.0),
            baseline: Some("serial 1x1".into()),
        },
        Scenario {
            name: "qstore 1x2 1 planner".into(),
            cfg: {
                let mut c = ycsb(base, "qstore", 1, 2, 0.0);
                c.protocol.qstore.planners = 1;
                c
            },
            baseline: Some("serial 1x1".into()),
        },
    ];
    for mp in [0.0, 0.5, 1.0] {
        let pct = (mp * 100.0) as u32;
        s.push(Scenario {
            name: format!("serial 2x1 mp{pct}"),
            cfg: ycsb(base, "serial", 2, 1, mp),
            baseline: None,
        });
        s.push(Scenario {
            name: format!("qstore 2x1 mp{pct}"),
            cfg: ycsb(base, "qstore", 2, 1, mp),
            baseline: Some(format!("serial 2x1 mp{pct}")),
        });
    }
    s.extend(light_scenarios(base));
    s
}

/// A finished scenario.
#[derive(Serialize)]
pub struct SuiteRow {
    pub scenario: String,
    pub baseline: Option<String>,
    /// Median, over rounds, of the throughput divided by the baseline's in the same round.
    pub ratio: Option<f64>,
    /// The same for the median latency.
    pub p50_ratio: Option<f64>,
    /// Throughput in each round.
    pub rounds_tps: Vec<f64>,
    /// The run with the median throughput.
    pub report: RunReport,
}

/// The rows of a suite run in rounds: `runs[r][i]` is scenario `i`'s run in round `r` (every
/// round runs every scenario once, in order). Ratios pair each run with its baseline's run
/// of the same round, minutes apart at most, so that a drift in the machine's speed between
/// rounds cancels out instead of favouring whichever scenario ran in a fast moment.
pub fn rows(scenarios: &[Scenario], runs: Vec<Vec<RunReport>>) -> Vec<SuiteRow> {
    // Per scenario, its runs in round order.
    let mut per: Vec<Vec<RunReport>> = scenarios.iter().map(|_| Vec::new()).collect();
    for round in runs {
        for (i, r) in round.into_iter().enumerate() {
            per[i].push(r);
        }
    }
    let tps: Vec<Vec<f64>> = per
        .iter()
        .map(|rs| rs.iter().map(|r| r.throughput_tps).collect())
        .collect();
    let p50: Vec<Vec<f64>> = per
        .iter()
        .map(|rs| rs.iter().map(|r| r.latency.p50_us as f64).collect())
        .collect();
    let index = |name: &String| scenarios.iter().position(|x| &x.name == name);
    // Per round, the scenario's figure over its baseline's; the median of those.
    let paired = |of: &[Vec<f64>], i: usize, b: usize| {
        median(
            of[i]
                .iter()
                .zip(&of[b])
                .map(|(x, bx)| x / bx.max(1e-9))
                .collect(),
        )
    };
    scenarios
        .iter()
        .zip(per)
        .enumerate()
        .map(|(i, (sc, mut reports))| {
            let baseline = sc.baseline.as_ref().and_then(index);
            let ratio = baseline.map(|b| paired(&tps, i, b));
            let p50_ratio = baseline.map(|b| paired(&p50, i, b));
            reports.sort_by(|a, b| a.throughput_tps.total_cmp(&b.throughput_tps));
            SuiteRow {
                scenario: sc.name.clone(),
                baseline: sc.baseline.clone(),
                ratio,
                p50_ratio,
                rounds_tps: tps[i].clone(),
                report: reports.swap_remove(reports.len() / 2),
            }
        })
        .collect()
}

/// The middle value (the upper one of an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The suite's results as a table.
pub fn table(rows: &[SuiteRow]) -> String {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "scenario",
        "txn/s",
        "vs baseline",
        "p50 us",
        "p50 vs baseline",
        "p99 us",
        "abort %",
        "msgs/txn",
    ]);
    for r in rows {
        let p = &r.report;
        t.add_row(vec![
            r.scenario.clone(),
            format!("{:.0}", p.throughput_tps),
            r.ratio.map_or("-".into(), |x| format!("{x:.2}x")),
            p.latency.p50_us.to_string(),
            r.p50_ratio.map_or("-".into(), |x| format!("{x:.2}x")),
            p.latency.p99_us.to_string(),
            format!("{:.2}", p.abort_rate * 100.0),
            format!("{:.3}", p.msgs_per_txn),
        ]);
    }
    t.to_string()
}

/// Where the interactive protocols' transactions spent their time and messages, phase by
/// phase, per committed transaction, and their aborts by cause; `None` when no run measured
/// phases.
pub fn breakdown(rows: &[SuiteRow]) -> Option<String> {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "scenario",
        "execution us / msgs",
        "prepare us / msgs",
        "commit us / msgs",
        "aborted us / msgs",
        "cc aborts by cause (% of attempts)",
    ]);
    let mut any = false;
    for r in rows {
        let p = &r.report;
        let phases: Vec<String> = p
            .stages
            .iter()
            .filter_map(|s| s.per_txn)
            .map(|c| format!("{:.0} / {:.2}", c.us, c.msgs))
            .collect();
        if phases.len() != 4 {
            continue;
        }
        any = true;
        let attempts = p.committed + p.cc_aborts.values().sum::<u64>();
        let causes = p
            .cc_aborts
            .iter()
            .map(|(c, n)| format!("{c} {:.1}", 100.0 * *n as f64 / attempts.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ");
        let mut row = vec![r.scenario.clone()];
        row.extend(phases);
        row.push(causes);
        t.add_row(row);
    }
    any.then(|| t.to_string())
}

/// Every run's aborts: concurrency-control aborts by cause and logic aborts, as shares of
/// the attempts.
pub fn aborts(rows: &[SuiteRow]) -> String {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "scenario",
        "cc aborts by cause (% of attempts)",
        "logic aborts (% of attempts, by reason)",
    ]);
    for r in rows {
        let p = &r.report;
        let attempts = (p.committed + p.logic_aborts + p.cc_aborts.values().sum::<u64>()).max(1);
        let share = |n: u64| 100.0 * n as f64 / attempts as f64;
        let causes = p
            .cc_aborts
            .iter()
            .map(|(c, n)| format!("{c} {:.1}", share(*n)))
            .collect::<Vec<_>>()
            .join(", ");
        let reasons = p
            .logic_aborts_by_reason
            .iter()
            .map(|(why, n)| format!("{why} {:.2}", share(*n)))
            .collect::<Vec<_>>()
            .join("; ");
        t.add_row(vec![
            r.scenario.clone(),
            causes,
            format!("{:.2} ({reasons})", share(p.logic_aborts)),
        ]);
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qstore_suite_pairs_every_qstore_run_with_a_serial_baseline() {
        let s = scenarios("qstore", &RunConfig::default()).unwrap();
        assert_eq!(s.len(), 14);
        for sc in &s {
            sc.cfg.validate().unwrap();
            if sc.cfg.protocol.name == "qstore" {
                let b = sc.baseline.as_ref().unwrap();
                assert!(s.iter().any(|x| &x.name == b));
            }
        }
        assert!(scenarios("nope", &RunConfig::default()).is_err());
    }

    /// A report of `tps` transactions per second.
    fn report(tps: f64) -> RunReport {
        let mut r = RunReport::new(
            &RunConfig::default(),
            &Default::default(),
            1.0,
            0.0,
            Vec::new(),
            Vec::new(),
        );
        r.throughput_tps = tps;
        r
    }

    #[test]
    fn ratios_pair_runs_of_the_same_round() {
        let s = scenarios("qstore", &RunConfig::default()).unwrap();
        let (serial, qstore) = (0, 1);
        assert_eq!(s[qstore].baseline.as_deref(), Some(s[serial].name.as_str()));
        // The machine runs at full speed in round 0, at half speed in round 1, and so on;
        // qstore is 1.2x serial in every round but its median run is not 1.2x serial's.
        let speed = [1.0, 0.5, 0.9];
        let runs = speed
            .iter()
            .enumerate()
            .map(|(r, v)| {
                (0..s.len())
                    .map(|i| match i {
                        0 => report(100.0 * v),
                        1 => report(120.0 * v * if r == 2 { 0.5 } else { 1.0 }),
                        _ => report(1.0),
                    })
                    .collect()
            })
            .collect();
        let rows = rows(&s, runs);
        assert_eq!(rows[qstore].rounds_tps, vec![120.0, 60.0, 54.0]);
        assert_eq!(rows[qstore].report.throughput_tps, 60.0, "the median run");
        assert_eq!(rows[serial].report.throughput_tps, 90.0);
        // Per round: 1.2, 1.2, 0.6; median 1.2 (the ratio of medians would be 0.67).
        assert!((rows[qstore].ratio.unwrap() - 1.2).abs() < 1e-9);
        assert_eq!(rows[serial].ratio, None);
    }

    #[test]
    fn sundial_suite_runs_what_this_build_has_in_the_papers_setting() {
        let s = scenarios("sundial", &RunConfig::default()).unwrap();
        let present = SUNDIAL_PROTOCOLS
            .iter()
            .filter(|p| qstore_engine::protocol::info(p).is_some())
            .count();
        assert_eq!(s.len(), 4 * present);
        for sc in &s {
            sc.cfg.validate().unwrap();
            assert_eq!(sc.cfg.workload.ycsb.remote_access_fraction, 0.1);
            if let Some(b) = &sc.baseline {
                assert!(s.iter().any(|x| &x.name == b), "{b}");
            }
        }
    }

    #[test]
    fn tpcc_suite_runs_every_protocol_at_each_warehouse_count_and_remote_share() {
        let s = scenarios("tpcc", &RunConfig::default()).unwrap();
        assert_eq!(s.len(), 12 * qstore_engine::PROTOCOLS.len());
        for sc in &s {
            sc.cfg.validate().unwrap();
            if sc.baseline.is_none() {
                // One workload per setting (building one computes its last-name index).
                qstore_workload::build(&sc.cfg).unwrap();
            }
            if let Some(b) = &sc.baseline {
                assert!(s.iter().any(|x| &x.name == b), "{b}");
            }
        }
        let wh: std::collections::BTreeSet<u32> = s
            .iter()
            .map(|sc| sc.cfg.workload.tpcc.warehouses_per_partition)
            .collect();
        assert_eq!(wh.into_iter().collect::<Vec<_>>(), [1, 4]);
    }

    #[test]
    fn baselines_suite_covers_every_setting_for_every_protocol() {
        let s = scenarios("baselines", &RunConfig::default()).unwrap();
        assert_eq!(s.len(), 8 * qstore_engine::PROTOCOLS.len());
        assert_eq!(baseline_protocols()[0], "qstore");
        for sc in &s {
            sc.cfg.validate().unwrap();
            assert!(qstore_engine::protocol::info(&sc.cfg.protocol.name).is_some());
            if let Some(b) = &sc.baseline {
                assert!(s.iter().any(|x| &x.name == b), "{b}");
            }
        }
    }
}
