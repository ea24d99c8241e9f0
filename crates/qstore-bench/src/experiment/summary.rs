//! Medians per point: what the figure draws and the trends check, written as `summary.csv`.

use super::metric::METRICS;
use super::results::ResultRow;
use super::spec::Plan;
use std::collections::BTreeMap;
use std::path::Path;

/// One point's metric over its successful runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The runs of one point of one series.
#[derive(Clone, Debug, Default)]
struct PointRuns {
    ok: usize,
    failed: usize,
    /// Per metric (in [`METRICS`] order), the successful runs' values.
    values: Vec<Vec<f64>>,
}

/// Every point's medians, by series and x.
#[derive(Clone, Debug)]
pub struct Summary {
    pub series: Vec<String>,
    /// The x values, ascending.
    pub xs: Vec<f64>,
    points: BTreeMap<(usize, u64), PointRuns>,
}

impl Summary {
    /// Groups `rows` by point; failed runs are counted, not measured.
    pub fn new(plan: &Plan, rows: &[ResultRow]) -> Summary {
        let mut xs: Vec<f64> = if plan.spec.x.over_time {
            // The seconds of the timelines (a failed run's row, at 0, is counted only).
            rows.iter()
                .filter(|r| r.failure.is_empty())
                .map(|r| r.x)
                .collect()
        } else {
            plan.points.iter().map(|p| p.x).collect()
        };
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let mut points: BTreeMap<(usize, u64), PointRuns> = BTreeMap::new();
        for r in rows {
            let Some(s) = plan.series_index(&r.series) else {
                continue;
            };
            let p = points.entry((s, r.x.to_bits())).or_default();
            if r.failure.is_empty() {
                p.ok += 1;
                p.values.resize(METRICS.len(), Vec::new());
                for (i, v) in r.metrics.iter().enumerate().take(METRICS.len()) {
                    p.values[i].push(*v);
                }
            } else {
                p.failed += 1;
            }
        }
        Summary {
            series: plan.series.clone(),
            xs,
            points,
        }
    }

    pub fn series_index(&self, name: &str) -> Option<usize> {
        self.series.iter().position(|s| s == name)
    }

    /// Metric `metric` of `series` at `x` over the successful runs there.
    pub fn cell(&self, series: &str, metric: &str, x: f64) -> Option<Cell> {
        let s = self.series_index(series)?;
        let m = METRICS.iter().position(|k| k.name == metric)?;
        let mut v = self.points.get(&(s, x.to_bits()))?.values.get(m)?.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Cell {
            median: median_sorted(&v),
            min: v[0],
            max: v[v.len() - 1],
        })
    }

    pub fn median(&self, series: &str, metric: &str, x: f64) -> Option<f64> {
        self.cell(series, metric, x).map(|c| c.median)
    }

    /// (successful, failed) runs of a point.
    pub fn runs(&self, series: &str, x: f64) -> (usize, usize) {
        self.series_index(series)
            .and_then(|s| self.points.get(&(s, x.to_bits())))
            .map_or((0, 0), |p| (p.ok, p.failed))
    }

    /// `summary.csv`: one row per series and x with the runs counted, then each metric's
    /// median, min and max.
    pub fn write_csv(&self, path: &Path) -> std::io::Result<()> {
        let mut out = csv::Writer::from_path(path)?;
        let mut header = vec![
            "series".to_string(),
            "x".into(),
            "runs".into(),
            "failed".into(),
        ];
        for m in METRICS {
            for k in ["median", "min", "max"] {
                header.push(format!("{}_{k}", m.name));
            }
        }
        out.write_record(&header)?;
        for s in &self.series {
            for &x in &self.xs {
                let (ok, failed) = self.runs(s, x);
                let mut row = vec![s.clone(), x.to_string(), ok.to_string(), failed.to_string()];
                for m in METRICS {
                    match self.cell(s, m.name, x) {
                        Some(c) => row.extend([c.median, c.min, c.max].map(|v| format!("{v:.6}"))),
                        None => row.extend(["", "", ""].map(String::from)),
                    }
                }
                out.write_record(&row)?;
            }
        }
        out.flush()
    }
}

/// The middle value of a sorted list (the mean of the two middle ones for an even count).
pub(super) fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
