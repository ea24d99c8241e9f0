//! The record of a drawn figure (`figure.json` beside its plot) and the index of many
//! (`index.html`, `index.md`): per figure the plot, the paper's claim, the verdict measured
//! here and a short table.

use super::metric;
use super::spec::Plan;
use super::summary::Summary;
use super::trend::{num, short, Verdict};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// What the index shows of one figure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FigureRecord {
    /// The spec's name, also the figure's directory under the index.
    pub name: String,
    pub paper: String,
    pub figure: String,
    pub title: String,
    pub claim: String,
    pub fidelity: String,
    pub quick: bool,
    pub quick_note: String,
    /// holds, does not hold, not checked, or failed runs.
    pub verdict: String,
    /// Each trend's verdict with its numbers.
    pub trends: Vec<String>,
    pub failures: Vec<String>,
    /// Series of the spec this build could not run, with why.
    pub skipped: Vec<String>,
    pub table: MedianTable,
}

/// The medians of the first metric (of a latency CDF figure: its latency percentiles): a
/// row per x (percentile), a column per series.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MedianTable {
    pub metric: String,
    pub x_label: String,
    pub series: Vec<String>,
    pub xs: Vec<f64>,
    /// `cells[i][j]`: series j at xs[i].
    pub cells: Vec<Vec<Option<f64>>>,
}

impl FigureRecord {
    pub fn new(plan: &Plan, summary: &Summary, verdicts: &[Verdict], failures: &[String]) -> Self {
        let spec = &plan.spec;
        FigureRecord {
            name: plan.name.clone(),
            paper: spec.paper.clone(),
            figure: spec.figure.clone(),
            title: spec.title.clone(),
            claim: spec.claim.clone(),
            fidelity: spec.fidelity.clone(),
            quick: plan.quick,
            quick_note: spec.quick.note.clone(),
            verdict: overall(verdicts, failures).to_string(),
            trends: verdicts.iter().map(|v| v.line.clone()).collect(),
            failures: failures.to_vec(),
            skipped: plan
                .skipped
                .iter()
                .map(|(s, why)| format!("{s}: {why}"))
                .collect(),
            table: if spec.x.cdf {
                super::cdf::table(summary)
            } else {
                MedianTable::of_first_metric(plan, summary)
            },
        }
    }

    /// Reads `dir/figure.json`.
    pub fn read(dir: &Path) -> Result<FigureRecord, String> {
        let path = dir.join("figure.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

impl MedianTable {
    /// The medians of the spec's first metric at every x.
    fn of_first_metric(plan: &Plan, summary: &Summary) -> MedianTable {
        let spec = &plan.spec;
        let first = metric::find(&spec.metrics[0].name).expect("checked when parsed");
        MedianTable {
            metric: first.label.to_string(),
            x_label: spec.x.label.clone(),
            series: summary.series.clone(),
            xs: summary.xs.clone(),
            cells: summary
                .xs
                .iter()
                .map(|&x| {
                    summary
                        .series
                        .iter()
                        .map(|s| summary.median(s, first.name, x))
                        .collect()
                })
                .collect(),
        }
    }
}

/// The figure's verdict in a word or three.
pub fn overall(verdicts: &[Verdict], failures: &[String]) -> &'static str {
    if !failures.is_empty() {
        "failed runs"
    } else if verdicts.iter().any(|v| v.holds == Some(false)) {
        "does not hold"
    } else if verdicts.iter().any(|v| v.holds == Some(true)) {
        "holds"
    } else {
        "not checked"
    }
}

/// Writes `dir/index.html` and `dir/index.md` for `records`, whose figures are in
/// `dir/<name>/figure.png`.
/// `not_drawn` lists the specs left out, with why.
pub fn write_index(
    dir: &Path,
    records: &[FigureRecord],
    not_drawn: &[String],
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (file, text) in [
        ("index.html", html(records, not_drawn)),
        ("index.md", markdown(records, not_drawn)),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn cell(v: Option<f64>) -> String {
    v.map_or("–".into(), short)
}

fn heading(r: &FigureRecord) -> String {
    format!(
        "{} {}: {}{}",
        r.paper,
        r.figure,
        r.title,
        if r.quick { " (quick)" } else { "" }
    )
}

fn html(records: &[FigureRecord], not_drawn: &[String]) -> String {
    let mut h = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>qstore: the papers' figures, redrawn</title>\n<style>\n\
         body { font-family: sans-serif; max-width: 1500px; margin: 2em auto; padding: 0 1em; \
         color: #222; line-height: 1.4; }\n\
         section { border-top: 1px solid #ccc; padding: 1em 0 2em; }\n\
         img { max-width: 100%; border: 1px solid #eee; }\n\
         .verdict { display: inline-block; padding: 0.1em 0.6em; border-radius: 0.3em; \
         font-weight: bold; }\n\
         .holds { background: #d4edda; } .does-not-hold { background: #f8d7da; }\n\
         .not-checked { background: #e2e3e5; } .failed-runs { background: #f5c26b; }\n\
         table { border-collapse: collapse; margin-top: 0.5em; }\n\
         td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }\n\
         th:first-child, td:first-child { text-align: left; }\n\
         .note { color: #555; font-size: 0.92em; }\n\
         </style>\n</head>\n<body>\n<h1>The papers' figures, redrawn by qstore</h1>\n",
    );
    let _ = writeln!(
        h,
        "<p>{} figures. Each is a sweep made by <code>qstore figure</code>: medians of \
         the runs, bars from the fastest to the slowest run of a point.</p>\n<ul>",
        records.len()
    );
    for r in records {
        let _ = writeln!(
            h,
            "<li><a href=\"#{0}\">{1}</a>: <span class=\"verdict {2}\">{3}</span></li>",
            esc(&r.name),
            esc(&heading(r)),
            r.verdict.replace(' ', "-"),
            esc(&r.verdict)
        );
    }
    for n in not_drawn {
        let _ = writeln!(h, "<li class=\"note\">not drawn: {}</li>", esc(n));
    }
    h.push_str("</ul>\n");
    for r in records {
        let _ = writeln!(
            h,
            "<section id=\"{0}\">\n<h2>{1}</h2>\n<p><span class=\"verdict {2}\">{3}</span></p>\n\
             <p><b>The paper's claim.</b> {4}</p>\n\
             <p><a href=\"{0}/figure.svg\"><img src=\"{0}/figure.png\" alt=\"{1}\"></a></p>",
            esc(&r.name),
            esc(&heading(r)),
            r.verdict.replace(' ', "-"),
            esc(&r.verdict),
            esc(&r.claim)
        );
        h.push_str("<p><b>Measured here.</b></p>\n<ul>\n");
        for line in r.trends.iter().chain(&r.failures) {
            let _ = writeln!(h, "<li>{}</li>", esc(line));
        }
        h.push_str("</ul>\n");
        let t = &r.table;
        let _ = write!(
            h,
            "<table>\n<caption class=\"note\">{} (median)</caption>\n<tr><th>{}</th>",
            esc(&t.metric),
            esc(&t.x_label)
        );
        for s in &t.series {
            let _ = write!(h, "<th>{}</th>", esc(s));
        }
        h.push_str("</tr>\n");
        for (x, row) in t.xs.iter().zip(&t.cells) {
            let _ = write!(h, "<tr><td>{}</td>", num(*x));
            for v in row {
                let _ = write!(h, "<td>{}</td>", cell(*v));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
        let quick_note = if r.quick { r.quick_note.as_str() } else { "" };
        for (what, text) in [
            ("On this machine", r.fidelity.as_str()),
            ("Quick run", quick_note),
        ] {
            if !text.is_empty() {
                let _ = writeln!(h, "<p class=\"note\"><b>{what}.</b> {}</p>", esc(text));
            }
        }
        if !r.skipped.is_empty() {
            let _ = writeln!(
                h,
                "<p class=\"note\"><b>Not drawn.</b> {}</p>",
                esc(&r.skipped.join("; "))
            );
        }
        h.push_str("</section>\n");
    }
    h.push_str("</body>\n</html>\n");
    h
}

fn markdown(records: &[FigureRecord], not_drawn: &[String]) -> String {
    let mut m = String::from("# The papers' figures, redrawn by qstore\n\n");
    for n in not_drawn {
        let _ = writeln!(m, "- not drawn: {n}");
    }
    if !not_drawn.is_empty() {
        m.push('\n');
    }
    for r in records {
        let _ = writeln!(m, "## {}\n\n**{}**\n", heading(r), r.verdict);
        let _ = writeln!(m, "![{}]({}/figure.png)\n", heading(r), r.name);
        let _ = writeln!(m, "The paper's claim: {}\n", r.claim);
        for line in r.trends.iter().chain(&r.failures) {
            let _ = writeln!(m, "- {line}");
        }
        let t = &r.table;
        let _ = writeln!(
            m,
            "\n{} (median):\n\n| {} | {} |",
            t.metric,
            t.x_label,
            t.series.join(" | ")
        );
        let _ = writeln!(m, "|{}", " --- |".repeat(t.series.len() + 1));
        for (x, row) in t.xs.iter().zip(&t.cells) {
            let cells: Vec<String> = row.iter().map(|v| cell(*v)).collect();
            let _ = writeln!(m, "| {} | {} |", num(*x), cells.join(" | "));
        }
        if !r.fidelity.is_empty() {
            let _ = writeln!(m, "\nOn this machine: {}", r.fidelity);
        }
        if r.quick && !r.quick_note.is_empty() {
            let _ = writeln!(m, "\nQuick run: {}", r.quick_note);
        }
        if !r.skipped.is_empty() {
            let _ = writeln!(m, "\nNot drawn: {}", r.skipped.join("; "));
        }
        m.push('\n');
    }
    m
}
