//! Running a plan: rounds of runs (each round runs every point once, so a slow drift of the
//! machine hits every series alike), appended to `results.csv` as they finish, then the
//! summary, the figure and the verdict.

use super::cdf;
use super::index::FigureRecord;
use super::metric;
use super::results::{ResultRow, ResultsFile};
use super::spec::{Plan, Point};
use super::summary::Summary;
use super::trend::{short, Verdict};
use crate::report::RunReport;
use qstore_core::RunConfig;
use std::path::Path;

/// What a sweep reports as it goes.
pub enum Event<'a> {
    /// The sweep starts: `done` of its `total` runs are already in `results.csv`.
    Start { total: usize, done: usize },
    /// A run starts.
    Run {
        round: u32,
        rounds: u32,
        series: &'a str,
        x: f64,
    },
    /// It ended.
    Ran { row: &'a ResultRow },
}

/// A finished sweep.
pub struct Outcome {
    pub summary: Summary,
    pub verdicts: Vec<Verdict>,
    /// Runs that did not count, and why.
    pub failures: Vec<String>,
    pub record: FigureRecord,
}

impl Outcome {
    /// The sweep measured what it should and its claim holds.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs `plan` into `dir` (created if needed), resuming from the runs already there. `run`
/// makes one run; `on` hears about progress.
pub fn sweep(
    plan: &Plan,
    dir: &Path,
    run: &mut dyn FnMut(&RunConfig) -> Result<RunReport, String>,
    on: &mut dyn FnMut(Event),
) -> Result<Outcome, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    claim_dir(plan, dir)?;
    let (file, mut rows) = ResultsFile::open(plan, dir)?;
    let cdfs = plan
        .spec
        .x
        .cdf
        .then(|| cdf::RunsFile::open(dir))
        .transpose()?;
    let todo: Vec<(u32, usize)> = (0..plan.repeats)
        .flat_map(|round| (0..plan.points.len()).map(move |i| (round, i)))
        .filter(|(round, i)| !rows.iter().any(|r| r.is(plan, &plan.points[*i], *round)))
        .collect();
    on(Event::Start {
        total: plan.runs(),
        done: plan.runs() - todo.len(),
    });
    for (round, i) in todo {
        let p = &plan.points[i];
        on(Event::Run {
            round,
            rounds: plan.repeats,
            series: &plan.series[p.series],
            x: p.x,
        });
        let report = run(&p.cfg);
        let row = ResultRow::new(plan, p, round, report.as_ref().map_err(Clone::clone));
        let written = match &report {
            Ok(r) if row.failure.is_empty() => {
                if let Some(cdfs) = &cdfs {
                    // Before its row: a run whose row is written has its CDF.
                    cdfs.append(round, &row.series, &r.latency.cdf)?;
                }
                rows_of_run(plan, p, round, r, &row)
            }
            _ => vec![row.clone()],
        };
        for w in &written {
            file.append(w)?;
        }
        on(Event::Ran { row: &row });
        rows.extend(written);
    }
    finish(plan, dir, &rows)
}

/// The rows of a successful run (`row`, its report `r`): one, or over time one per second
/// of its timeline.
fn rows_of_run(
    plan: &Plan,
    p: &Point,
    round: u32,
    r: &RunReport,
    row: &ResultRow,
) -> Vec<ResultRow> {
    if !plan.spec.x.over_time {
        return vec![row.clone()];
    }
    match ResultRow::over_time(plan, p, round, r) {
        rows if rows.is_empty() => vec![ResultRow {
            failure: "no timeline: the measurement window was under a second (over-time \
                      figures need a duration, not a transaction count)"
                .into(),
            ..row.clone()
        }],
        rows => rows,
    }
}

/// The files that say which sweep a directory holds: the spec it ran and whether quick.
fn markers(plan: &Plan) -> [(&'static str, String); 2] {
    let marker = serde_json::json!({ "spec": plan.name, "quick": plan.quick }).to_string();
    [
        ("spec.toml", plan.spec.source.clone()),
        ("sweep.json", marker),
    ]
}

/// Whether `dir` is free for `plan`: empty, or holding runs of this very sweep. Resuming
/// another sweep's directory is an error, never a mix.
pub fn check_dir(plan: &Plan, dir: &Path) -> Result<(), String> {
    for (file, want) in markers(plan) {
        let path = dir.join(file);
        if std::fs::read_to_string(&path).is_ok_and(|found| found != want) {
            return Err(format!(
                "{} holds the results of another sweep ({} differs: another spec, another \
                 version of it, or --quick given one time and not the other); choose another \
                 --out or remove the directory",
                dir.display(),
                path.display()
            ));
        }
    }
    Ok(())
}

/// Marks `dir` as `plan`'s.
fn claim_dir(plan: &Plan, dir: &Path) -> Result<(), String> {
    check_dir(plan, dir)?;
    for (file, want) in markers(plan) {
        let path = dir.join(file);
        std::fs::write(&path, want).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The summary, figure and verdict of a sweep's rows.
fn finish(plan: &Plan, dir: &Path, rows: &[ResultRow]) -> Result<Outcome, String> {
    let summary = Summary::new(plan, rows);
    let path = dir.join("summary.csv");
    summary
        .write_csv(&path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let panels = if plan.spec.x.cdf {
        let curves = cdf::curves(plan, dir, rows)?;
        cdf::write_curves(&dir.join(cdf::CURVES_FILE), &curves)?;
        vec![cdf::panel(&curves)]
    } else {
        metric_panels(plan, &summary)
    };
    let figure = figure(plan, panels);
    qstore_plot::draw_png(&figure, &dir.join("figure.png"))?;
    qstore_plot::draw_svg(&figure, &dir.join("figure.svg"))?;
    let verdicts: Vec<Verdict> = plan
        .spec
        .trends
        .iter()
        .map(|t| t.evaluate(&plan.spec, &summary))
        .collect();
    let failures: Vec<String> = rows
        .iter()
        .filter(|r| !r.failure.is_empty())
        .map(|r| {
            format!(
                "round {}, {} at x = {}: {}",
                r.round + 1,
                r.series,
                super::trend::num(r.x),
                r.failure
            )
        })
        .collect();
    let record = FigureRecord::new(plan, &summary, &verdicts, &failures);
    let path = dir.join("figure.json");
    let json = serde_json::to_string_pretty(&record).expect("a record serializes");
    std::fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Outcome {
        summary,
        verdicts,
        failures,
        record,
    })
}

/// One panel per metric, one line per series, medians with min–max bars.
fn metric_panels(plan: &Plan, summary: &Summary) -> Vec<qstore_plot::Panel> {
    plan.spec
        .metrics
        .iter()
        .map(|m| {
            let metric = metric::find(&m.name).expect("checked when parsed");
            qstore_plot::Panel {
                y_label: metric.label.to_string(),
                y_log: m.log,
                series: summary
                    .series
                    .iter()
                    .map(|s| qstore_plot::Series {
                        name: s.clone(),
                        points: summary
                            .xs
                            .iter()
                            .filter_map(|&x| {
                                let c = summary.cell(s, metric.name, x)?;
                                Some(qstore_plot::Point {
                                    x,
                                    y: c.median,
                                    lo: c.min,
                                    hi: c.max,
                                })
                            })
                            .collect(),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The figure of `panels`, with the spec's title and x axis.
fn figure(plan: &Plan, panels: Vec<qstore_plot::Panel>) -> qstore_plot::Figure {
    let spec = &plan.spec;
    qstore_plot::Figure {
        title: format!(
            "{} {}: {}{}",
            spec.paper,
            spec.figure,
            spec.title,
            if plan.quick { " (quick)" } else { "" }
        ),
        x_label: spec.x.label.clone(),
        // Latencies span decades.
        x_log: spec.x.log || spec.x.cdf,
        panels,
    }
}

/// A one-line account of a finished run, for progress output.
pub fn describe(row: &ResultRow) -> String {
    if row.failure.is_empty() {
        format!("{} txn/s", short(row.metrics[0]))
    } else {
        format!("FAILED: {}", row.failure)
    }
}
