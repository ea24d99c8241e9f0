//! `qstore figure`: redraw a paper's figure from its experiment spec, or every figure and an
//! index of them.

use crate::cli::{usage_error, EXIT_FAILURE};
use crate::sizing;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qstore_bench::experiment::{
    self, sweep::describe, trend::num, Event, FigureRecord, Plan, Spec,
};
use qstore_bench::RunOptions;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod builtin {
    include!(concat!(env!("OUT_DIR"), "/specs.rs"));
}

#[derive(Args)]
pub struct FigureArgs {
    /// The figure to draw: a spec name from --list (e.g. qstore-fig7), or a spec file.
    #[arg(value_name = "SPEC", required_unless_present_any = ["list", "all"])]
    spec: Option<String>,
    /// List every spec: its paper and figure, and whether this build has what it needs.
    #[arg(long, conflicts_with_all = ["spec", "all"])]
    list: bool,
    /// Draw every figure this build can, each into OUT/<spec>/, then OUT/index.html and
    /// OUT/index.md.
    #[arg(long, conflicts_with = "spec")]
    all: bool,
    /// The spec's quick variant: shorter runs, fewer rounds or points (about 5 minutes a
    /// figure on 2 cores; each spec says what it gives up).
    #[arg(long)]
    quick: bool,
    /// Where results and images go (default: figures/<spec>, or figures/ with --all). A
    /// directory that already holds some of the sweep's runs is resumed: only the missing
    /// runs are made.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Read the specs from this directory instead of the built-in ones (the repository's
    /// experiments/ folder as of the build).
    #[arg(long, value_name = "DIR")]
    specs: Option<PathBuf>,
}

/// A spec's name and text.
struct Source {
    name: String,
    text: String,
}

/// Whether this build has a protocol or workload called `name`.
/// What a spec may need besides protocols and workloads: a ZooKeeper server at the address
/// `replication.zookeeper` names by default.
const ZOOKEEPER: &str = "zookeeper";

fn available(name: &str) -> bool {
    qstore_engine::protocol::info(name).is_some()
        || qstore_workload::WORKLOADS.contains(&name)
        || (name == ZOOKEEPER && qstore_engine::replication::zookeeper::answers(&zookeeper()))
}

fn zookeeper() -> String {
    qstore_core::config::ReplicationConfig::default().zookeeper
}

/// What a missing need is, said so a user can supply it.
fn describe_needs(missing: &[String]) -> String {
    let each = missing.iter().map(|n| {
        if n == ZOOKEEPER {
            format!(
                "a ZooKeeper server at {} (start one: scripts/zookeeper.sh start 2181 DIR)",
                zookeeper()
            )
        } else {
            format!("{n} (not built yet)")
        }
    });
    each.collect::<Vec<_>>().join(", ")
}

fn known_protocol(name: &str) -> bool {
    qstore_engine::protocol::info(name).is_some()
}

pub fn figure(args: FigureArgs) -> i32 {
    let sources = match catalog(args.specs.as_deref()) {
        Ok(s) => s,
        Err(e) => return usage_error(&e),
    };
    if args.list {
        return list(&sources);
    }
    if args.all {
        let out = args.out.unwrap_or_else(|| PathBuf::from("figures"));
        return all(&sources, &out, args.quick);
    }
    let arg = args
        .spec
        .expect("clap requires SPEC without --list or --all");
    let source = match find(&sources, &arg) {
        Ok(s) => s,
        Err(e) => return usage_error(&e),
    };
    let plan = match prepare(&source, args.quick) {
        Ok(p) => p,
        Err(e) => return usage_error(&e),
    };
    let out = args
        .out
        .unwrap_or_else(|| Path::new("figures").join(&source.name));
    if let Err(e) = experiment::sweep::check_dir(&plan, &out) {
        return usage_error(&e);
    }
    match draw(&plan, &out) {
        Ok(record) if record.failures.is_empty() => 0,
        Ok(_) => EXIT_FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    }
}

/// The built-in specs, or those of `dir`.
fn catalog(dir: Option<&Path>) -> Result<Vec<Source>, String> {
    let mut sources = match dir {
        Some(dir) => read_dir(dir)?,
        None => builtin(),
    };
    sources.sort_by_key(|s| natural_key(&s.name));
    Ok(sources)
}

/// "qstore-fig10" as ("qstore-fig", 10), so that figure 5 comes before figure 10.
fn natural_key(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, number) = name.split_at(name.len() - digits);
    (stem.to_string(), number.parse().unwrap_or(0))
}

fn builtin() -> Vec<Source> {
    builtin::SPECS
        .iter()
        .map(|(name, text)| Source {
            name: name.to_string(),
            text: text.to_string(),
        })
        .collect()
}

fn read_dir(dir: &Path) -> Result<Vec<Source>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut sources = Vec::new();
    for path in entries.filter_map(Result::ok).map(|e| e.path()) {
        if path.extension().is_some_and(|x| x == "toml") {
            sources.push(read_source(&path)?);
        }
    }
    Ok(sources)
}

fn read_source(path: &Path) -> Result<Source, String> {
    Ok(Source {
        name: path
            .file_stem()
            .map_or_else(|| "spec".into(), |s| s.to_string_lossy().into_owned()),
        text: std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
    })
}

/// The spec `arg` names: a file, or a name from the catalog.
fn find(sources: &[Source], arg: &str) -> Result<Source, String> {
    let path = Path::new(arg);
    if arg.ends_with(".toml") || path.is_file() {
        return read_source(path);
    }
    sources
        .iter()
        .find(|s| s.name == arg)
        .map(|s| Source {
            name: s.name.clone(),
            text: s.text.clone(),
        })
        .ok_or_else(|| {
            let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
            format!(
                "no spec called {arg:?}; choose one of: {} (or give a spec file)",
                names.join(", ")
            )
        })
}

/// The spec's plan, every point checked to be runnable here.
fn prepare(source: &Source, quick: bool) -> Result<Plan, String> {
    prepare_with(source, quick, &available)
}

/// [`prepare`], with what this machine has told by `available`.
fn prepare_with(
    source: &Source,
    quick: bool,
    available: &dyn Fn(&str) -> bool,
) -> Result<Plan, String> {
    let spec = Spec::parse(&source.name, &source.text)?;
    let missing = spec.missing_needs(available);
    if !missing.is_empty() {
        return Err(format!(
            "{} needs {}",
            source.name,
            describe_needs(&missing)
        ));
    }
    let plan = spec.plan(&source.name, quick, &known_protocol)?;
    if plan.series.is_empty() {
        return Err(format!(
            "{}: none of its series' protocols exist",
            source.name
        ));
    }
    for p in &plan.points {
        let w = &p.cfg.workload.name;
        if !qstore_workload::WORKLOADS.contains(&w.as_str()) {
            return Err(format!("{}: unknown workload {w}", source.name));
        }
        sizing::check(&p.cfg, sizing::Loads::embedded(&p.cfg, false))
            .map_err(|e| format!("{}: {e}", source.name))?;
    }
    Ok(plan)
}

fn list(sources: &[Source]) -> i32 {
    let mut broken = false;
    let mut rows = Vec::new();
    for s in sources {
        let (figure, status) = match Spec::parse(&s.name, &s.text) {
            Ok(spec) => (
                format!("{} {}: {}", spec.paper, spec.figure, spec.title),
                status(&spec),
            ),
            Err(e) => {
                broken = true;
                (String::new(), format!("INVALID: {e}"))
            }
        };
        rows.push((s.name.as_str(), figure, status));
    }
    let name_w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(4);
    let fig_w = rows
        .iter()
        .map(|r| r.1.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    println!("{:<name_w$}  {:<fig_w$}  status", "spec", "figure");
    for (name, figure, status) in rows {
        println!("{name:<name_w$}  {figure:<fig_w$}  {status}");
    }
    if broken {
        EXIT_FAILURE
    } else {
        0
    }
}

/// Whether this build can draw `spec`, and which of its series it leaves out.
fn status(spec: &Spec) -> String {
    let missing = spec.missing_needs(&available);
    if !missing.is_empty() {
        return format!("needs {}", describe_needs(&missing));
    }
    let absent: Vec<&str> = spec
        .series
        .iter()
        .filter(|s| !known_protocol(&s.protocol))
        .map(|s| s.protocol.as_str())
        .collect();
    let runs = spec.series.len() - absent.len();
    if runs == 0 {
        "no series can run".into()
    } else if absent.is_empty() {
        format!("ready ({runs} series)")
    } else {
        format!(
            "ready ({runs} of {} series; not built yet: {})",
            spec.series.len(),
            absent.join(", ")
        )
    }
}

fn all(sources: &[Source], out: &Path, quick: bool) -> i32 {
    let mut records = Vec::new();
    let mut not_drawn = Vec::new();
    let mut failed = false;
    for s in sources {
        let plan = match prepare(s, quick) {
            Ok(p) => p,
            Err(e) => {
                // The reason names the spec.
                eprintln!("skipping {e}");
                not_drawn.push(e);
                continue;
            }
        };
        match draw(&plan, &out.join(&s.name)) {
            Ok(r) => {
                failed |= !r.failures.is_empty();
                records.push(r);
            }
            Err(e) => {
                eprintln!("error: {}: {e}", s.name);
                not_drawn.push(format!("{}: {e}", s.name));
                failed = true;
            }
        }
    }
    if let Err(e) = experiment::write_index(out, &records, &not_drawn) {
        eprintln!("error: {e}");
        return EXIT_FAILURE;
    }
    println!(
        "\nindex: {} and {}",
        out.join("index.html").display(),
        out.join("index.md").display()
    );
    if failed {
        EXIT_FAILURE
    } else {
        0
    }
}

/// Runs `plan` into `out` with progress, then prints the medians and the verdict.
fn draw(plan: &Plan, out: &Path) -> Result<FigureRecord, String> {
    let spec = &plan.spec;
    println!(
        "{} {}: {}{}",
        spec.paper,
        spec.figure,
        spec.title,
        if plan.quick { " (quick)" } else { "" }
    );
    println!("claim: {}", spec.claim);
    for (series, why) in &plan.skipped {
        println!("not drawn: {series} ({why})");
    }
    let per_run = plan.points.first().map_or(0.0, |p| {
        p.cfg.client.warmup_s + p.cfg.client.duration_s + 1.0
    });
    println!(
        "{} runs ({} points x {} rounds), about {:.0} min; results in {} (an interrupted \
         sweep resumes when run again)",
        plan.runs(),
        plan.points.len(),
        plan.repeats,
        (plan.runs() as f64 * per_run / 60.0).ceil(),
        out.display()
    );
    let mut progress = Progress::new(plan);
    let mut run = |cfg: &qstore_core::RunConfig| {
        qstore_bench::run(cfg, RunOptions::default())
            .map(|o| o.report)
            .map_err(|e| e.to_string())
    };
    let outcome = experiment::sweep(plan, out, &mut run, &mut |e| progress.on(e))?;
    progress.finish();
    print_medians(&outcome.record);
    for v in &outcome.verdicts {
        println!("{}", v.line);
    }
    for f in &outcome.failures {
        eprintln!("error: run failed: {f}");
    }
    println!("verdict: {}", outcome.record.verdict);
    println!(
        "figure: {}, {}; data: {}, {}",
        out.join("figure.png").display(),
        out.join("figure.svg").display(),
        out.join("results.csv").display(),
        out.join("summary.csv").display()
    );
    Ok(outcome.record)
}

fn print_medians(r: &FigureRecord) {
    let t = &r.table;
    let width = t.series.iter().map(|s| s.len()).max().unwrap_or(0).max(9);
    print!("\n{} (median)\n{:>12}", t.metric, "x");
    for s in &t.series {
        print!(" {s:>width$}");
    }
    println!();
    for (x, row) in t.xs.iter().zip(&t.cells) {
        print!("{:>12}", num(*x));
        for v in row {
            let cell = v.map_or("-".into(), experiment::trend::short);
            print!(" {cell:>width$}");
        }
        println!();
    }
}

/// A progress bar with the point being run and an ETA on a terminal; a line per run
/// otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    done: usize,
}

impl Progress {
    fn new(plan: &Plan) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(plan.runs() as u64);
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} runs, {elapsed} elapsed, ETA {eta}  {msg}",
                )
                .expect("a valid template"),
            );
            b.enable_steady_tick(Duration::from_millis(500));
            b
        });
        Progress {
            bar,
            total: plan.runs(),
            done: 0,
        }
    }

    fn on(&mut self, e: Event) {
        match e {
            Event::Start { total, done } => {
                self.total = total;
                self.done = done;
                if done > 0 {
                    self.say(format!(
                        "resuming: {done} of {total} runs already in results.csv"
                    ));
                }
                if let Some(b) = &self.bar {
                    b.set_position(done as u64);
                    b.reset_eta();
                }
            }
            Event::Run {
                round,
                rounds,
                series,
                x,
            } => {
                let what = format!("round {}/{rounds}: {series} at x = {}", round + 1, num(x));
                match &self.bar {
                    Some(b) => b.set_message(what),
                    None => eprint!("[{}/{}] {what} ... ", self.done + 1, self.total),
                }
            }
            Event::Ran { row } => {
                self.done += 1;
                match &self.bar {
                    Some(b) => {
                        if !row.failure.is_empty() {
                            b.println(format!(
                                "{} at x = {}: {}",
                                row.series,
                                num(row.x),
                                describe(row)
                            ));
                        }
                        b.inc(1);
                    }
                    None => eprintln!("{}", describe(row)),
                }
            }
        }
    }

    fn say(&self, line: String) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_spec_plans_runnable_points_in_both_variants() {
        assert!(builtin().len() >= 8, "experiments/ was not built in");
        // A ZooKeeper server is needed to run a spec, not to plan it.
        let available = |n: &str| n == ZOOKEEPER || available(n);
        for s in builtin() {
            let spec = Spec::parse(&s.name, &s.text).unwrap();
            if !spec.missing_needs(&available).is_empty() {
                continue;
            }
            for quick in [false, true] {
                let plan = prepare_with(&s, quick, &available).unwrap();
                assert!(
                    !plan.series.is_empty(),
                    "{}: no series this build has",
                    s.name
                );
                // A sweep has two x values at least; a figure over time or of latency CDFs
                // runs each series once and takes its x values from the run.
                let per_series = if spec.x.runs_once() { 1 } else { 2 };
                assert!(
                    plan.points.len() >= per_series * plan.series.len(),
                    "{}",
                    s.name
                );
            }
        }
    }

    #[test]
    fn specs_sort_by_figure_number() {
        let mut names = ["qstore-fig10", "qstore-fig5", "qstore-fig13", "a"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, ["a", "qstore-fig5", "qstore-fig10", "qstore-fig13"]);
    }
}
