//! Latency CDF figures (`[x] cdf = true`): each run's latency CDF (see [`crate::cdf`]) is
//! appended to `cdf-runs.csv` as the run finishes, so that an interrupted sweep resumes
//! with it; at the end each series gets one curve, written to `cdf.csv` and drawn.

use super::index::MedianTable;
use super::results::{drop_torn_tail, ResultRow};
use super::spec::Plan;
use super::summary::{median_sorted, Summary};
use crate::cdf::CdfPoint;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every run's CDF, in the sweep's directory.
pub const RUNS_FILE: &str = "cdf-runs.csv";
/// The curves drawn, in the sweep's directory.
pub const CURVES_FILE: &str = "cdf.csv";
const RUNS_HEADER: [&str; 4] = ["round", "series", "fraction", "latency_us"];

const Y_LABEL: &str = "fraction of transactions with at most this latency";

/// The percentiles of the figure's table, with the metric of a run that holds each.
const TABLE: [(f64, &str); 4] = [
    (50.0, "latency_p50_ms"),
    (90.0, "latency_p90_ms"),
    (99.0, "latency_p99_ms"),
    (99.9, "latency_p999_ms"),
];

/// One series' curve: (latency in ms, fraction), by fraction.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    pub series: String,
    pub points: Vec<(f64, f64)>,
}

/// `cdf-runs.csv`: a block of rows (round, series, fraction, latency in us) per run.
pub struct RunsFile {
    path: PathBuf,
}

impl RunsFile {
    /// `dir/cdf-runs.csv`, created if it is not there yet.
    pub fn open(dir: &Path) -> Result<RunsFile, String> {
        let file = RunsFile {
            path: dir.join(RUNS_FILE),
        };
        if file.path.exists() {
            drop_torn_tail(&file.path).map_err(|e| file.fail(e))?;
        } else {
            let mut w = csv::Writer::from_path(&file.path).map_err(|e| file.fail(e))?;
            w.write_record(RUNS_HEADER).map_err(|e| file.fail(e))?;
            w.flush().map_err(|e| file.fail(e))?;
        }
        Ok(file)
    }

    /// An error about the file.
    fn fail(&self, e: impl std::fmt::Display) -> String {
        format!("{}: {e}", self.path.display())
    }

    /// Appends the CDF of `series`' run in `round` and flushes it to the file.
    pub fn append(&self, round: u32, series: &str, cdf: &[CdfPoint]) -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("cannot write {}", self.fail(e));
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| fail(&e))?;
        let mut w = csv::Writer::from_writer(file);
        for p in cdf {
            let rec = [
                round.to_string(),
                series.to_string(),
                p.fraction.to_string(),
                p.latency_us.to_string(),
            ];
            w.write_record(&rec).map_err(|e| fail(&e))?;
        }
        w.flush().map_err(|e| fail(&e))
    }

    /// Each run's CDF by (round, series). A run made again (the sweep stopped after its CDF
    /// was written, before its row of `results.csv` was) counts once: its last block.
    fn read(&self) -> Result<BTreeMap<(u32, String), Vec<CdfPoint>>, String> {
        let mut r = csv::Reader::from_path(&self.path).map_err(|e| self.fail(e))?;
        let header: Vec<String> = r
            .headers()
            .map_err(|e| self.fail(e))?
            .iter()
            .map(String::from)
            .collect();
        if header != RUNS_HEADER {
            let want = RUNS_HEADER.join(",");
            return Err(self.fail(format!("its columns are not {want}")));
        }
        let mut runs: BTreeMap<(u32, String), Vec<CdfPoint>> = BTreeMap::new();
        let mut last: Option<((u32, String), f64)> = None;
        for (i, rec) in r.records().enumerate() {
            let rec = rec.map_err(|e| self.fail(e))?;
            let (key, p) = parse_row(&rec).map_err(|e| self.fail(format!("row {}: {e}", i + 1)))?;
            // A block starts where the run changes or its fractions start over.
            let same_run = last
                .as_ref()
                .is_some_and(|(k, f)| *k == key && p.fraction > *f);
            last = Some((key.clone(), p.fraction));
            let block = runs.entry(key).or_default();
            if !same_run {
                block.clear();
            }
            block.push(p);
        }
        Ok(runs)
    }
}

fn parse_row(rec: &csv::StringRecord) -> Result<((u32, String), CdfPoint), String> {
    let series = rec.get(1).ok_or("no series")?.to_string();
    let point = CdfPoint {
        fraction: column(rec, 2, "fraction")?,
        latency_us: column(rec, 3, "latency")?,
    };
    Ok(((column(rec, 0, "round")?, series), point))
}

/// Column `i` of `rec`, parsed.
fn column<T: std::str::FromStr>(
    rec: &csv::StringRecord,
    i: usize,
    what: &str,
) -> Result<T, String> {
    let v = rec.get(i).ok_or_else(|| format!("no {what}"))?;
    v.parse()
        .map_err(|_| format!("{what} {v:?} is not a number"))
}

/// Each series' curve over its successful runs (by `rows`, the sweep's results).
///
/// With several rounds, the curve's latency at each fraction is the median of the runs'
/// latencies there: as for every other figure, a median keeps one disturbed round from
/// moving the result, and taken fraction by fraction it is a CDF again (the middle of
/// nondecreasing sequences is nondecreasing).
pub fn curves(plan: &Plan, dir: &Path, rows: &[ResultRow]) -> Result<Vec<Curve>, String> {
    let runs = RunsFile {
        path: dir.join(RUNS_FILE),
    }
    .read()?;
    let counts = |round: u32, series: &str| {
        rows.iter()
            .any(|r| r.round == round && r.series == series && r.failure.is_empty())
    };
    Ok(plan
        .series
        .iter()
        .map(|s| {
            let of_series: Vec<&[CdfPoint]> = runs
                .iter()
                .filter(|((round, series), _)| series == s && counts(*round, s))
                .map(|(_, cdf)| cdf.as_slice())
                .collect();
            Curve {
                series: s.clone(),
                points: median_curve(&of_series),
            }
        })
        .collect())
}

/// At each fraction any run has, the median of the runs' latencies there (in ms).
fn median_curve(runs: &[&[CdfPoint]]) -> Vec<(f64, f64)> {
    // Fractions are positive: their bits sort as they do.
    let mut by_fraction: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for p in runs.iter().flat_map(|r| r.iter()) {
        by_fraction
            .entry(p.fraction.to_bits())
            .or_default()
            .push(p.latency_us as f64 / 1000.0);
    }
    by_fraction
        .into_iter()
        .map(|(bits, mut ms)| {
            ms.sort_by(f64::total_cmp);
            (median_sorted(&ms), f64::from_bits(bits))
        })
        .collect()
}

/// Writes `cdf.csv`: series, latency_ms, fraction, one row per point of each curve.
pub fn write_curves(path: &Path, curves: &[Curve]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", path.display());
    let mut w = csv::Writer::from_path(path).map_err(|e| fail(&e))?;
    w.write_record(["series", "latency_ms", "fraction"])
        .map_err(|e| fail(&e))?;
    for c in curves {
        for (ms, fraction) in &c.points {
            w.write_record([c.series.clone(), format!("{ms:.3}"), fraction.to_string()])
                .map_err(|e| fail(&e))?;
        }
    }
    w.flush().map_err(|e| fail(&e))
}

/// The figure's one panel: a line per series, latency on x, fraction on y.
pub fn panel(curves: &[Curve]) -> qstore_plot::Panel {
    qstore_plot::Panel {
        y_label: Y_LABEL.to_string(),
        y_log: false,
        series: curves
            .iter()
            .map(|c| qstore_plot::Series {
                name: c.series.clone(),
                points: c
                    .points
                    .iter()
                    .map(|&(x, y)| qstore_plot::Point { x, y, lo: y, hi: y })
                    .collect(),
            })
            .collect(),
    }
}

/// The figure's table: each series' latency at the median and in the tail, the median of
/// its runs (as the curves).
pub fn table(summary: &Summary) -> MedianTable {
    // The one point every series ran at.
    let x = summary.xs.first().copied().unwrap_or(0.0);
    MedianTable {
        metric: "latency (ms) by percentile".into(),
        x_label: "percentile".into(),
        series: summary.series.clone(),
        xs: TABLE.iter().map(|(p, _)| *p).collect(),
        cells: TABLE
            .iter()
            .map(|(_, metric)| {
                summary
                    .series
                    .iter()
                    .map(|s| summary.median(s, metric, x))
                    .collect()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::spec::{tests::cdf_text, Spec};
    use super::super::sweep::sweep;
    use super::*;
    use crate::report::RunReport;
    use crate::stats::ClientStats;
    use qstore_core::RunConfig;

    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("qstore-cdf-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A run whose transactions took `scale` times 1..=1000 us.
    fn report(cfg: &RunConfig, scale: u64) -> RunReport {
        let mut stats = ClientStats::default();
        for us in 1..=1000 {
            stats.record_commit(10, us * scale);
        }
        RunReport::new(cfg, &stats, 1.0, 0.0, Vec::new(), Vec::new())
    }

    fn point(fraction: f64, latency_us: u64) -> CdfPoint {
        CdfPoint {
            fraction,
            latency_us,
        }
    }

    #[test]
    fn a_cdf_sweep_draws_each_series_median_curve_and_resumes() {
        let trend = "[[trend]]\nkind = \"ratio\"\nseries = \"fast\"\nover = \"slow\"\n\
                     metric = \"latency_p50_ms\"\nat_most = 0.5\n";
        let spec = Spec::parse("c", &cdf_text("", trend)).unwrap();
        let plan = spec.plan("c", false, &|_| true).unwrap();
        let dir = scratch("sweep");
        // Round r of "fast" (qstore) takes (r + 1) times 1..=1000 us; "slow" ten times that.
        let mut made: Vec<RunReport> = Vec::new();
        let mut run = |cfg: &RunConfig| {
            let slow = if cfg.protocol.name == "calvin" { 10 } else { 1 };
            let round = made
                .iter()
                .filter(|r| r.protocol == cfg.protocol.name)
                .count() as u64;
            let r = report(cfg, (round + 1) * slow);
            made.push(r.clone());
            Ok(r)
        };
        let outcome = sweep(&plan, &dir, &mut run, &mut |_| {}).unwrap();
        assert!(outcome.passed(), "{:?}", outcome.failures);
        assert_eq!(
            outcome.verdicts[0].holds,
            Some(true),
            "{:?}",
            outcome.verdicts
        );

        // The curves are the middle round's CDFs (latencies grow with the round).
        let curves = curves(&plan, &dir, &[]).unwrap();
        assert!(curves.iter().all(|c| c.points.is_empty()), "no row, no run");
        let text = std::fs::read_to_string(dir.join(CURVES_FILE)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "series,latency_ms,fraction");
        assert_eq!(lines.len(), 1 + 2 * crate::cdf::fractions().count());
        for (series, protocol) in [("fast", "qstore"), ("slow", "calvin")] {
            let middle = made
                .iter()
                .filter(|r| r.protocol == protocol)
                .nth(1)
                .unwrap();
            for p in &middle.latency.cdf {
                let row = format!(
                    "{series},{:.3},{}",
                    p.latency_us as f64 / 1000.0,
                    p.fraction
                );
                assert!(lines.contains(&row.as_str()), "{row} not in {text}");
            }
        }
        let table = &outcome.record.table;
        assert_eq!(table.xs, [50.0, 90.0, 99.0, 99.9]);
        // The table's medians are the curves' at the same fractions.
        let p50 = |protocol: &str| {
            let middle = made.iter().filter(|r| r.protocol == protocol).nth(1);
            middle.map(|r| r.latency.p50_us as f64 / 1000.0)
        };
        assert_eq!(table.cells[0], [p50("qstore"), p50("calvin")]);
        assert_eq!(p50("qstore"), Some(1.0));
        assert!(dir.join("figure.png").exists() && dir.join("figure.svg").exists());

        // Run again: every run is there, nothing is made, the same curves are drawn.
        let mut none = |_: &RunConfig| -> Result<RunReport, String> { panic!("run made again") };
        sweep(&plan, &dir, &mut none, &mut |_| {}).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join(CURVES_FILE)).unwrap(),
            text
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_run_made_again_counts_once_with_its_last_cdf() {
        let dir = scratch("again");
        let file = RunsFile::open(&dir).unwrap();
        let cdf = |us: u64| [point(0.5, us), point(1.0, us * 2)];
        file.append(0, "a", &cdf(10)).unwrap();
        file.append(0, "b", &cdf(20)).unwrap();
        file.append(0, "a", &cdf(30)).unwrap();
        file.append(1, "a", &cdf(40)).unwrap();
        file.append(1, "a", &cdf(50)).unwrap();
        // A torn last line is cut when the file is opened again.
        let path = dir.join(RUNS_FILE);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("2,a,0.5");
        std::fs::write(&path, text).unwrap();
        let runs = RunsFile::open(&dir).unwrap().read().unwrap();
        let key = |round: u32, s: &str| (round, s.to_string());
        assert_eq!(runs.len(), 3);
        assert_eq!(runs[&key(0, "a")], cdf(30));
        assert_eq!(runs[&key(0, "b")], cdf(20));
        assert_eq!(runs[&key(1, "a")], cdf(50));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_median_curve_takes_each_fraction_apart() {
        let a = [point(0.5, 1000), point(1.0, 9000)];
        let b = [point(0.5, 3000), point(1.0, 4000)];
        let c = [point(0.5, 2000), point(1.0, 5000)];
        assert_eq!(
            median_curve(&[&a, &b, &c]),
            [(2.0, 0.5), (5.0, 1.0)],
            "a different run's latency at each fraction"
        );
        assert_eq!(median_curve(&[&a, &b]), [(2.0, 0.5), (6.5, 1.0)]);
        assert!(median_curve(&[]).is_empty());
    }
}
