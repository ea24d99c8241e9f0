//! `results.csv`: one row per run of a sweep (round, series, x, every setting the spec sets,
//! every metric), appended as each run finishes, so that an interrupted sweep resumes from
//! the runs already written.

use super::metric::{PerSecond, METRICS};
use super::spec::{setting, Plan, Point};
use crate::report::RunReport;
use std::path::{Path, PathBuf};

/// One finished run.
#[derive(Clone, Debug, PartialEq)]
pub struct ResultRow {
    pub round: u32,
    pub series: String,
    pub x: f64,
    /// Why the run does not count (transactions unanswered, nothing committed, an error);
    /// empty when it counts.
    pub failure: String,
    /// Values of the plan's settings, in [`Plan::params`] order.
    pub params: Vec<String>,
    /// Values of every metric, in [`METRICS`] order.
    pub metrics: Vec<f64>,
}

impl ResultRow {
    /// The row of point `p`'s run in `round`: its report, or why it failed.
    pub fn new(plan: &Plan, p: &Point, round: u32, run: Result<&RunReport, String>) -> Self {
        let (failure, metrics) = match run {
            Ok(r) => (
                r.failure().unwrap_or_default(),
                METRICS.iter().map(|m| (m.of)(r)).collect(),
            ),
            Err(e) => (e, vec![f64::NAN; METRICS.len()]),
        };
        ResultRow {
            round,
            series: plan.series[p.series].clone(),
            x: p.x,
            failure,
            params: plan.params.iter().map(|k| setting(&p.cfg, k)).collect(),
            metrics,
        }
    }

    /// The rows of an over-time plan's successful run: one per second of its timeline, at
    /// x = the second (to a tenth, so that every series' seconds line up), with the
    /// metrics a timeline has (the others are NaN).
    pub fn over_time(plan: &Plan, p: &Point, round: u32, run: &RunReport) -> Vec<Self> {
        let of: Vec<Option<PerSecond>> = METRICS
            .iter()
            .map(|m| super::metric::over_time(m.name).ok())
            .collect();
        run.timeline
            .iter()
            .map(|t| ResultRow {
                round,
                series: plan.series[p.series].clone(),
                x: (t.t_s * 10.0).round() / 10.0,
                failure: String::new(),
                params: plan.params.iter().map(|k| setting(&p.cfg, k)).collect(),
                metrics: of.iter().map(|f| f.map_or(f64::NAN, |f| f(t))).collect(),
            })
            .collect()
    }

    /// Whether this row is (one of the rows of) point `p`'s run in `round`.
    pub fn is(&self, plan: &Plan, p: &Point, round: u32) -> bool {
        self.round == round
            && self.series == plan.series[p.series]
            && (self.x == p.x || plan.spec.x.over_time)
    }
}

/// The results file of a sweep.
pub struct ResultsFile {
    path: PathBuf,
    header: Vec<String>,
}

impl ResultsFile {
    /// `dir/results.csv` for `plan`, with the rows it already holds. A file whose columns
    /// are not this plan's belongs to another sweep: an error, never mixed in.
    pub fn open(plan: &Plan, dir: &Path) -> Result<(ResultsFile, Vec<ResultRow>), String> {
        let path = dir.join("results.csv");
        let mut header: Vec<String> = ["round", "series", "x", "failure"]
            .map(String::from)
            .to_vec();
        header.extend(plan.params.iter().cloned());
        header.extend(METRICS.iter().map(|m| m.name.to_string()));
        let file = ResultsFile { path, header };
        let rows = if file.path.exists() {
            drop_torn_tail(&file.path).map_err(|e| format!("{}: {e}", file.path.display()))?;
            file.read()
                .map_err(|e| format!("{}: {e}", file.path.display()))?
        } else {
            let mut w = csv::Writer::from_path(&file.path)
                .map_err(|e| format!("cannot create {}: {e}", file.path.display()))?;
            w.write_record(&file.header)
                .and_then(|()| w.flush().map_err(Into::into))
                .map_err(|e| format!("cannot write {}: {e}", file.path.display()))?;
            Vec::new()
        };
        Ok((file, rows))
    }

    fn read(&self) -> Result<Vec<ResultRow>, String> {
        let mut r = csv::Reader::from_path(&self.path).map_err(|e| e.to_string())?;
        let found: Vec<String> = r
            .headers()
            .map_err(|e| e.to_string())?
            .iter()
            .map(String::from)
            .collect();
        if found != self.header {
            return Err(
                "its columns are not this sweep's: it holds the results of another \
                 spec (or of the same spec with or without --quick); choose another --out \
                 or remove the file"
                    .into(),
            );
        }
        let params = self.header.len() - 4 - METRICS.len();
        let mut rows = Vec::new();
        for (i, rec) in r.records().enumerate() {
            let rec = rec.map_err(|e| e.to_string())?;
            if rec.len() != self.header.len() {
                return Err(format!(
                    "row {} has {} columns, not {}",
                    i + 1,
                    rec.len(),
                    self.header.len()
                ));
            }
            let num = |s: &str| s.parse::<f64>().unwrap_or(f64::NAN);
            let round = rec[0]
                .parse()
                .map_err(|_| format!("row {}: round {:?} is not a number", i + 1, &rec[0]))?;
            rows.push(ResultRow {
                round,
                series: rec[1].to_string(),
                x: num(&rec[2]),
                failure: rec[3].to_string(),
                params: (4..4 + params).map(|k| rec[k].to_string()).collect(),
                metrics: (4 + params..rec.len()).map(|k| num(&rec[k])).collect(),
            });
        }
        Ok(rows)
    }

    /// Appends one row and flushes it to the file.
    pub fn append(&self, row: &ResultRow) -> Result<(), String> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| format!("cannot append to {}: {e}", self.path.display()))?;
        let mut w = csv::Writer::from_writer(file);
        let mut rec = vec![
            row.round.to_string(),
            row.series.clone(),
            row.x.to_string(),
            row.failure.clone(),
        ];
        rec.extend(row.params.iter().cloned());
        rec.extend(row.metrics.iter().map(|v| format!("{v}")));
        w.write_record(&rec)
            .and_then(|()| w.flush().map_err(Into::into))
            .map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

/// Cuts a last line that has no newline: the process was stopped while writing it, and the
/// run it describes is simply made again.
pub(super) fn drop_torn_tail(path: &Path) -> std::io::Result<()> {
    let bytes = std::fs::read(path)?;
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(());
    }
    let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.set_len(keep as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_cut_and_whole_lines_are_kept() {
        let dir = std::env::temp_dir().join(format!("qstore-torn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.csv");
        std::fs::write(&path, "a,b\n1,2\n3,").unwrap();
        drop_torn_tail(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a,b\n1,2\n");
        drop_torn_tail(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a,b\n1,2\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
