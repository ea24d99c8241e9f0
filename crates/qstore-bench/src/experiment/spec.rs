//! Experiment specs: one TOML file per figure of a paper (`experiments/<paper>-fig<N>.toml`),
//! and their expansion into the runs of a sweep.
//!
//! A spec names the figure and the claim it supports, a base configuration (a partial
//! `RunConfig`, merged over the defaults), the swept parameter(s) and their values, the
//! series (usually one protocol each), the metrics on the y axes, repeats, and the trends that
//! say whether the claim holds here. Settings are written as TOML tables with dotted keys,
//! e.g. `set = { protocol.name = "calvin", protocol.calvin.epoch_txns = 0 }`, so any setting
//! of the configuration can be swept without code.

use super::metric;
use super::trend::Trend;
use qstore_core::RunConfig;
use serde::Deserialize;
use toml::{Table, Value};

/// One figure of a paper, as a sweep.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The paper, e.g. "Q-Store (EDBT 2020)".
    pub paper: String,
    /// Which figure of it, e.g. "Figure 7".
    pub figure: String,
    /// What the figure shows, e.g. "multi-partition transactions".
    pub title: String,
    /// The claim the figure supports, in our words, with the paper's numbers.
    pub claim: String,
    /// What this machine's run can and cannot show of the paper's setting.
    #[serde(default)]
    pub fidelity: String,
    /// Workloads and protocols the figure cannot be drawn without (beyond its series).
    #[serde(default)]
    pub needs: Vec<String>,
    /// A partial configuration merged over the defaults.
    #[serde(default)]
    pub base: Table,
    pub x: XAxis,
    /// The y axes: one panel per metric (none in a latency CDF figure, whose one panel is
    /// the CDF).
    #[serde(default, rename = "metric")]
    pub metrics: Vec<MetricSpec>,
    #[serde(rename = "series")]
    pub series: Vec<SeriesSpec>,
    /// Rounds of the full sweep: each round runs every point once.
    #[serde(default = "one")]
    pub repeats: u32,
    /// What `--quick` changes.
    #[serde(default)]
    pub quick: Quick,
    /// The checkable form of the claim.
    #[serde(default, rename = "trend")]
    pub trends: Vec<Trend>,
    /// The spec's text, as read.
    #[serde(skip)]
    pub source: String,
}

fn one() -> u32 {
    1
}

fn unit() -> f64 {
    1.0
}

/// The swept parameter.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XAxis {
    /// Axis label, with its unit.
    pub label: String,
    /// The setting(s) each value is written to (dotted paths, e.g.
    /// "workload.ycsb.theta"); several paths all get the same value.
    #[serde(default)]
    pub param: Params,
    /// The values swept (with `param`).
    #[serde(default)]
    pub values: Vec<Value>,
    /// Instead of param and values: each point with its x and its own settings.
    #[serde(default)]
    pub points: Vec<XPoint>,
    /// Multiplier from a value to its place on the axis (e.g. 100 for a fraction shown in %).
    #[serde(default = "unit")]
    pub scale: f64,
    /// Logarithmic axis.
    #[serde(default)]
    pub log: bool,
    /// The x axis is time into the run's measurement window (seconds), with neither param
    /// nor values: each series runs once per round at the spec's settings, and its
    /// throughput, latency and traffic are drawn second by second (the run's timeline).
    #[serde(default)]
    pub over_time: bool,
    /// The x axis is transaction latency (ms, logarithmic whatever `log` says), with
    /// neither param nor values: each series runs once per round at the spec's settings,
    /// and one panel draws the fraction of its committed transactions that took at most
    /// each latency (the runs' latency CDFs). The figure has no [[metric]]; its trends
    /// name theirs (e.g. `latency_p50_ms`), read off each series' runs.
    #[serde(default)]
    pub cdf: bool,
}

impl XAxis {
    /// Whether each series runs once per round, at the spec's settings, rather than once per
    /// x value: the x values come from the runs (over time, or a latency CDF).
    pub fn runs_once(&self) -> bool {
        self.over_time || self.cdf
    }

    /// The mode of an x axis that sweeps nothing, and what its x is, for error messages.
    fn unswept(&self) -> Option<(&'static str, &'static str)> {
        if self.over_time {
            Some(("over_time", "the run's time"))
        } else if self.cdf {
            Some(("cdf", "the latency of the series' transactions"))
        } else {
            None
        }
    }
}

/// One dotted path, or several.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(untagged)]
pub enum Params {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl Params {
    fn paths(&self) -> Vec<String> {
        match self {
            Params::None => Vec::new(),
            Params::One(p) => vec![p.clone()],
            Params::Many(ps) => ps.clone(),
        }
    }
}

/// A point of the x axis given with its own settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XPoint {
    pub x: f64,
    pub set: Table,
}

/// A y axis.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricSpec {
    /// A metric name (see [`metric::METRICS`]).
    pub name: String,
    #[serde(default)]
    pub log: bool,
}

/// One line of the figure.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesSpec {
    /// The legend's name (default: the protocol).
    #[serde(default)]
    pub name: Option<String>,
    /// The protocol it runs.
    pub protocol: String,
    /// Further settings of this series only.
    #[serde(default)]
    pub set: Table,
}

impl SeriesSpec {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.protocol)
    }
}

/// What `--quick` changes: a shorter run per point, fewer points or rounds.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quick {
    /// Settings merged over the base.
    #[serde(default)]
    pub base: Table,
    /// The x values to run (a subset of the full sweep's), when fewer.
    #[serde(default)]
    pub values: Vec<Value>,
    pub repeats: Option<u32>,
    /// What the quick run gives up.
    #[serde(default)]
    pub note: String,
}

/// One run of a sweep, before the round it belongs to.
#[derive(Clone, Debug)]
pub struct Point {
    /// Index of its series in [`Plan::series`].
    pub series: usize,
    /// Its place on the x axis (scaled).
    pub x: f64,
    pub cfg: RunConfig,
}

/// A spec made concrete: the series this build can run and every point's configuration.
#[derive(Clone, Debug)]
pub struct Plan {
    pub name: String,
    pub spec: Spec,
    pub quick: bool,
    /// Names of the series that run.
    pub series: Vec<String>,
    /// Series left out, with why (a protocol this build does not have).
    pub skipped: Vec<(String, String)>,
    /// Points in run order within a round: by x, then by series.
    pub points: Vec<Point>,
    pub repeats: u32,
    /// The settings the spec sets (dotted paths), the columns of the results.
    pub params: Vec<String>,
}

impl Spec {
    /// Parses a spec; `name` says where it came from in errors.
    pub fn parse(name: &str, text: &str) -> Result<Spec, String> {
        let mut spec: Spec = toml::from_str(text).map_err(|e| format!("spec {name}: {e}"))?;
        spec.source = text.to_string();
        spec.check().map_err(|e| format!("spec {name}: {e}"))?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), String> {
        self.check_metrics()?;
        if self.series.is_empty() {
            return Err("no [[series]]".into());
        }
        let mut names: Vec<&str> = self.series.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("two series are called {:?}", w[0]));
        }
        self.check_x()?;
        if self.repeats == 0 || self.quick.repeats == Some(0) {
            return Err("repeats must be at least 1".into());
        }
        for v in &self.quick.values {
            if !self.x.values.contains(v) {
                return Err(format!(
                    "quick.values has {v}, which x.values does not: quick runs a subset"
                ));
            }
        }
        for t in &self.trends {
            t.check(self)?;
        }
        Ok(())
    }

    /// The y axes: known metrics, ones a timeline has in a figure over time, and none in a
    /// latency CDF figure.
    fn check_metrics(&self) -> Result<(), String> {
        if self.x.cdf {
            if !self.metrics.is_empty() {
                return Err("[x] cdf draws one panel, the latency CDF: remove its \
                            [[metric]] entries (a trend names its metric, e.g. \
                            metric = \"latency_p50_ms\")"
                    .into());
            }
        } else if self.metrics.is_empty() {
            return Err("no [[metric]]: name at least one y axis".into());
        }
        for m in &self.metrics {
            metric::find(&m.name)?;
            if self.x.over_time {
                metric::over_time(&m.name)?;
            }
        }
        Ok(())
    }

    /// The x axis: a swept setting (param and values, or points), or a mode whose x values
    /// come from the runs.
    fn check_x(&self) -> Result<(), String> {
        let by_values = !self.x.values.is_empty();
        let by_points = !self.x.points.is_empty();
        if self.x.over_time && self.x.cdf {
            return Err("[x] over_time and cdf exclude each other: choose one x axis".into());
        }
        if let Some((mode, x)) = self.x.unswept() {
            if by_values || by_points || !self.x.param.paths().is_empty() {
                return Err(format!(
                    "[x] {mode} takes no param, values or points: the x axis is {x}"
                ));
            }
        } else if by_values == by_points {
            return Err("[x] needs either param and values, or points".into());
        }
        if by_values && self.x.param.paths().is_empty() {
            return Err("[x] values need a param (the setting they are written to)".into());
        }
        if !(self.x.scale.is_finite() && self.x.scale > 0.0) {
            return Err(format!("x.scale = {}: must be positive", self.x.scale));
        }
        Ok(())
    }

    /// Protocols and workloads this spec needs that `available` does not have.
    pub fn missing_needs(&self, available: &dyn Fn(&str) -> bool) -> Vec<String> {
        self.needs
            .iter()
            .filter(|n| !available(n))
            .cloned()
            .collect()
    }

    /// The spec's sweep: the series whose protocol `known` accepts, at every x value.
    pub fn plan(
        &self,
        name: &str,
        quick: bool,
        known: &dyn Fn(&str) -> bool,
    ) -> Result<Plan, String> {
        let mut base = toml::Table::try_from(RunConfig::default())
            .map_err(|e| format!("the default configuration: {e}"))?;
        merge(&mut base, &self.base);
        if quick {
            merge(&mut base, &self.quick.base);
        }
        let xs = self.x_points(quick);
        let mut series = Vec::new();
        let mut skipped = Vec::new();
        let mut points = Vec::new();
        let runnable: Vec<&SeriesSpec> = self
            .series
            .iter()
            .filter(|s| {
                let ok = known(&s.protocol);
                if !ok {
                    skipped.push((
                        s.name().to_string(),
                        format!("protocol {} not built yet", s.protocol),
                    ));
                }
                ok
            })
            .collect();
        for s in &runnable {
            series.push(s.name().to_string());
        }
        for (x, set) in &xs {
            for (i, s) in runnable.iter().enumerate() {
                let mut t = base.clone();
                merge(
                    &mut t,
                    &dotted("protocol.name", Value::String(s.protocol.clone())),
                );
                merge(&mut t, &s.set);
                merge(&mut t, set);
                let cfg: RunConfig = Value::Table(t).try_into().map_err(|e| {
                    format!("series {} at x = {x}: {}", s.name(), clean(&e.to_string()))
                })?;
                cfg.validate()
                    .map_err(|e| format!("series {} at x = {x}: {e}", s.name()))?;
                points.push(Point {
                    series: i,
                    x: *x,
                    cfg,
                });
            }
        }
        let repeats = if quick {
            self.quick.repeats.unwrap_or(self.repeats)
        } else {
            self.repeats
        };
        Ok(Plan {
            name: name.to_string(),
            spec: self.clone(),
            quick,
            series,
            skipped,
            points,
            repeats,
            params: self.params(quick, &xs),
        })
    }

    /// Each x of the sweep with the settings it makes.
    fn x_points(&self, quick: bool) -> Vec<(f64, Table)> {
        if self.x.runs_once() {
            // One run per series; over time its rows take their x from its timeline.
            return vec![(0.0, Table::new())];
        }
        if !self.x.points.is_empty() {
            return self.x.points.iter().map(|p| (p.x, p.set.clone())).collect();
        }
        let values = if quick && !self.quick.values.is_empty() {
            &self.quick.values
        } else {
            &self.x.values
        };
        values
            .iter()
            .map(|v| {
                let mut set = Table::new();
                for path in self.x.param.paths() {
                    merge(&mut set, &dotted(&path, v.clone()));
                }
                (as_f64(v) * self.x.scale, set)
            })
            .collect()
    }

    /// Every setting the spec writes, as dotted paths, sorted.
    fn params(&self, quick: bool, xs: &[(f64, Table)]) -> Vec<String> {
        let mut paths = vec!["protocol.name".to_string()];
        leaf_paths(&self.base, "", &mut paths);
        if quick {
            leaf_paths(&self.quick.base, "", &mut paths);
        }
        for s in &self.series {
            leaf_paths(&s.set, "", &mut paths);
        }
        for (_, set) in xs {
            leaf_paths(set, "", &mut paths);
        }
        paths.sort();
        paths.dedup();
        paths
    }
}

impl Plan {
    /// Runs of the whole sweep.
    pub fn runs(&self) -> usize {
        self.points.len() * self.repeats as usize
    }

    /// Index of the series called `name`, if it runs.
    pub fn series_index(&self, name: &str) -> Option<usize> {
        self.series.iter().position(|s| s == name)
    }
}

/// The value of setting `path` (dotted) in `cfg`, as text.
pub fn setting(cfg: &RunConfig, path: &str) -> String {
    let Ok(t) = toml::Table::try_from(cfg) else {
        return String::new();
    };
    let mut v = &Value::Table(t);
    for part in path.split('.') {
        match v.get(part) {
            Some(next) => v = next,
            None => return String::new(),
        }
    }
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn as_f64(v: &Value) -> f64 {
    match v {
        Value::Integer(i) => *i as f64,
        Value::Float(f) => *f,
        _ => f64::NAN,
    }
}

/// `{a = {b = value}}` from "a.b".
fn dotted(path: &str, value: Value) -> Table {
    let mut v = value;
    for part in path.rsplit('.') {
        let mut t = Table::new();
        t.insert(part.to_string(), v);
        v = Value::Table(t);
    }
    match v {
        Value::Table(t) => t,
        _ => unreachable!("a path has at least one part"),
    }
}

/// Writes every leaf of `over` into `into`, keeping what `over` does not mention.
fn merge(into: &mut Table, over: &Table) {
    for (k, v) in over {
        match (into.get_mut(k), v) {
            (Some(Value::Table(a)), Value::Table(b)) => merge(a, b),
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

fn leaf_paths(t: &Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in t {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(inner) => leaf_paths(inner, &path, out),
            _ => out.push(path),
        }
    }
}

/// A serde error on one line.
fn clean(e: &str) -> String {
    e.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A spec of two series over three x values, with `extra` appended.
    pub fn spec(extra: &str) -> Spec {
        let text = format!(
            r#"
paper = "P"
figure = "Figure 1"
title = "t"
claim = "c"
repeats = 2
[base]
cluster.nodes = 2
workload.ycsb = {{ ops_per_txn = 4, multi_partition_fraction = 0.5 }}
[x]
label = "mp (%)"
param = ["workload.ycsb.multi_partition_fraction", "workload.bank.multi_partition_fraction"]
values = [0, 0.5, 1.0]
scale = 100
[[metric]]
name = "throughput_tps"
[[series]]
protocol = "qstore"
[[series]]
name = "calvin-count"
protocol = "calvin"
set = {{ protocol.calvin.epoch_txns = 64 }}
[[series]]
protocol = "future"
[quick]
values = [0, 1.0]
repeats = 1
base.client.duration_s = 0.5
{extra}
"#
        );
        Spec::parse("t", &text).unwrap()
    }

    fn known(p: &str) -> bool {
        p != "future"
    }

    /// The text of a latency CDF spec of two series, with `x` added to its [x] and `extra`
    /// appended.
    pub fn cdf_text(x: &str, extra: &str) -> String {
        format!(
            r#"
paper = "P"
figure = "Figure 7"
title = "latency"
claim = "c"
repeats = 3
[base]
cluster.nodes = 2
[x]
label = "latency (ms)"
cdf = true
{x}
[[series]]
name = "fast"
protocol = "qstore"
[[series]]
name = "slow"
protocol = "calvin"
set = {{ protocol.calvin.epoch_txns = 64 }}
[quick]
repeats = 1
{extra}
"#
        )
    }

    #[test]
    fn a_cdf_spec_runs_each_series_once_per_round_and_draws_no_metric() {
        let trend = "[[trend]]\nkind = \"ratio\"\nseries = \"fast\"\nover = \"slow\"\n\
                     metric = \"latency_p50_ms\"\nat_most = 1.0\n";
        let spec = Spec::parse("c", &cdf_text("", trend)).unwrap();
        assert!(spec.x.cdf && spec.x.runs_once() && spec.metrics.is_empty());
        let plan = spec.plan("c", false, &known).unwrap();
        assert_eq!(plan.series, ["fast", "slow"]);
        assert_eq!(plan.points.len(), 2);
        assert!(plan.points.iter().all(|p| p.x == 0.0));
        assert_eq!(plan.points[1].cfg.protocol.calvin.epoch_txns, 64);
        assert_eq!((plan.repeats, plan.runs()), (3, 6));
        assert_eq!(spec.plan("c", true, &known).unwrap().runs(), 2);
    }

    #[test]
    fn cdf_mistakes_are_named() {
        let bad = |x: &str, extra: &str, expect: &str| {
            let e = Spec::parse("b", &cdf_text(x, extra))
                .map(|_| ())
                .unwrap_err();
            assert!(e.starts_with("spec b: ") && e.contains(expect), "{e}");
        };
        bad(
            "param = \"workload.micro.multi_partition_fraction\"\nvalues = [0.0, 1.0]",
            "",
            "[x] cdf takes no param, values or points",
        );
        bad(
            "points = [{ x = 1, set = {} }]",
            "",
            "the x axis is the latency",
        );
        bad(
            "over_time = true",
            "",
            "over_time and cdf exclude each other",
        );
        bad(
            "",
            "[[metric]]\nname = \"latency_p50_ms\"\n",
            "cdf draws one panel, the latency CDF",
        );
        bad(
            "",
            "[[trend]]\nkind = \"ratio\"\nseries = \"fast\"\nover = \"slow\"\nat_most = 1.0\n",
            "a trend of a cdf figure names its metric",
        );
        bad("", "values = [0.5]", "quick runs a subset");
        // Without cdf, a figure still needs its y axes.
        let e = Spec::parse(
            "n",
            &cdf_text("", "").replace("cdf = true", "over_time = true"),
        )
        .unwrap_err();
        assert!(e.contains("no [[metric]]"), "{e}");
    }

    #[test]
    fn a_plan_merges_base_series_and_x_settings_over_the_defaults() {
        let plan = spec("").plan("t", false, &known).unwrap();
        assert_eq!(plan.series, ["qstore", "calvin-count"]);
        assert_eq!(plan.skipped.len(), 1);
        assert_eq!(plan.points.len(), 6);
        assert_eq!(plan.runs(), 12);
        let p = &plan.points[3]; // x = 50, calvin
        assert_eq!((p.x, p.series), (50.0, 1));
        assert_eq!(p.cfg.protocol.name, "calvin");
        assert_eq!(p.cfg.protocol.calvin.epoch_txns, 64);
        assert_eq!(p.cfg.workload.ycsb.multi_partition_fraction, 0.5);
        assert_eq!(p.cfg.workload.bank.multi_partition_fraction, 0.5);
        assert_eq!(p.cfg.workload.ycsb.ops_per_txn, 4);
        // What the base does not mention keeps its default.
        assert_eq!(p.cfg.workload.ycsb.write_fraction, 0.5);
        assert_eq!(p.cfg.cluster.nodes, 2);
        assert_eq!(setting(&p.cfg, "workload.ycsb.ops_per_txn"), "4");
        assert_eq!(setting(&p.cfg, "protocol.name"), "calvin");
        assert!(plan
            .params
            .contains(&"protocol.calvin.epoch_txns".to_string()));
        assert!(plan
            .params
            .contains(&"workload.bank.multi_partition_fraction".to_string()));
    }

    #[test]
    fn quick_runs_its_subset_of_values_and_rounds() {
        let plan = spec("").plan("t", true, &known).unwrap();
        assert_eq!(plan.points.len(), 4);
        assert_eq!(plan.repeats, 1);
        assert_eq!(plan.points[0].cfg.client.duration_s, 0.5);
        assert!(plan.params.contains(&"client.duration_s".to_string()));
    }

    #[test]
    fn mistakes_are_named() {
        let bad = |text: &str, expect: &str| {
            let e = Spec::parse("b", text).map(|_| ()).unwrap_err();
            assert!(e.contains(expect), "{e}");
        };
        let ok = spec("").source;
        bad(
            &ok.replace("name = \"throughput_tps\"", "name = \"x\""),
            "unknown metric",
        );
        bad(
            &ok.replace("values = [0, 1.0]", "values = [0.25]"),
            "quick runs a subset",
        );
        bad(&ok.replace("repeats = 2", "repeats = 0"), "at least 1");
        bad(
            &ok.replace("name = \"calvin-count\"\n", "name = \"qstore\"\n"),
            "two series",
        );
        bad(
            &format!("{ok}\n[[trend]]\nkind = \"flat\"\nseries = \"qstore\"\n"),
            "within",
        );
        let unknown = ok.replace("ops_per_txn = 4", "ops_per_tx = 4");
        let e = Spec::parse("u", &unknown)
            .unwrap()
            .plan("u", false, &known)
            .unwrap_err();
        assert!(e.contains("unknown field `ops_per_tx`"), "{e}");
    }
}
