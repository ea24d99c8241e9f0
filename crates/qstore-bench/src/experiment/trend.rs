//! Trends: the checkable form of a paper's claim ("qstore ≥ 2× calvin at every point with
//! mp ≥ 50%", "qstore varies by less than 25% across the swept values", "qstore at the
//! largest batch is at least 2× qstore at the smallest"), evaluated on the medians of a
//! sweep.

use super::metric;
use super::spec::Spec;
use super::summary::Summary;
use serde::Deserialize;

/// What a trend compares.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `series` / `over` at each x in range: at least `at_least`, at most `at_most`.
    Ratio,
    /// `series` varies by at most `within` (a fraction of its largest value) over the range.
    Flat,
    /// `series` at the last x in range over the first: at least `at_least`, at most
    /// `at_most` (a growth when at_least > 1, a fall when at_most < 1). With `over`, of
    /// the ratio `series` / `over` (a speedup that grows or shrinks).
    Change,
}

/// One checkable statement about the medians of a sweep.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trend {
    pub kind: Kind,
    /// The series the statement is about.
    pub series: String,
    /// The series it is divided by (ratio).
    #[serde(default)]
    pub over: Option<String>,
    #[serde(default)]
    pub at_least: Option<f64>,
    #[serde(default)]
    pub at_most: Option<f64>,
    /// Largest spread, as a fraction of the largest value (flat).
    #[serde(default)]
    pub within: Option<f64>,
    /// The part of the x axis it is about (axis units, inclusive).
    #[serde(default)]
    pub from: Option<f64>,
    #[serde(default)]
    pub to: Option<f64>,
    /// Ratio: it is enough that one point in range satisfies the bounds.
    #[serde(default)]
    pub anywhere: bool,
    /// The metric (default: the spec's first).
    #[serde(default)]
    pub metric: Option<String>,
}

/// A trend's verdict.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Verdict {
    /// None when it could not be checked (a series did not run, or every run failed).
    pub holds: Option<bool>,
    /// The statement and the numbers behind the verdict.
    pub line: String,
}

impl Trend {
    pub(super) fn check(&self, spec: &Spec) -> Result<(), String> {
        let known = |name: &str| spec.series.iter().any(|s| s.name() == name);
        for s in std::iter::once(&self.series).chain(&self.over) {
            if !known(s) {
                return Err(format!(
                    "a trend names series {s:?}, which the spec has not"
                ));
            }
        }
        if let Some(m) = &self.metric {
            metric::find(m)?;
        } else if spec.x.cdf {
            // The default is the first y axis, and a CDF figure has none.
            return Err(
                "a trend of a cdf figure names its metric, e.g. metric = \"latency_p50_ms\"".into(),
            );
        }
        let needs = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(format!("a {:?} trend needs {what}", self.kind))
            }
        };
        match self.kind {
            Kind::Ratio => {
                needs(self.over.is_some(), "over (the series divided by)")?;
                needs(
                    self.at_least.is_some() || self.at_most.is_some(),
                    "at_least or at_most",
                )
            }
            Kind::Flat => needs(self.within.is_some(), "within"),
            Kind::Change => needs(
                self.at_least.is_some() || self.at_most.is_some(),
                "at_least or at_most",
            ),
        }
    }

    fn metric_name<'a>(&'a self, spec: &'a Spec) -> &'a str {
        // (Lazily: a latency CDF figure has no metrics, and its trends name theirs.)
        self.metric
            .as_deref()
            .unwrap_or_else(|| &spec.metrics[0].name)
    }

    fn in_range(&self, x: f64) -> bool {
        self.from.is_none_or(|f| x >= f) && self.to.is_none_or(|t| x <= t)
    }

    /// The statement in words.
    pub fn statement(&self, spec: &Spec) -> String {
        let metric = self.metric_name(spec);
        let range = match (self.from, self.to) {
            (None, None) => String::new(),
            (Some(f), None) => format!(" where x ≥ {}", num(f)),
            (None, Some(t)) => format!(" where x ≤ {}", num(t)),
            (Some(f), Some(t)) => format!(" where {} ≤ x ≤ {}", num(f), num(t)),
        };
        let bounds = |unit: &str| {
            let mut b = Vec::new();
            if let Some(l) = self.at_least {
                b.push(format!("≥ {}{unit}", num(l)));
            }
            if let Some(m) = self.at_most {
                b.push(format!("≤ {}{unit}", num(m)));
            }
            b.join(" and ")
        };
        match self.kind {
            Kind::Ratio => format!(
                "{metric}: {} / {} {} at {} point{range}",
                self.series,
                self.over.as_deref().unwrap_or("?"),
                bounds("×"),
                if self.anywhere { "some" } else { "every" },
            ),
            Kind::Flat => format!(
                "{metric}: {} varies by at most {:.0}% of its largest value{range}",
                self.series,
                self.within.unwrap_or(0.0) * 100.0
            ),
            Kind::Change => format!(
                "{metric}: {} at the last x over the first {}{range}",
                match &self.over {
                    Some(over) => format!("{} / {over}", self.series),
                    None => self.series.clone(),
                },
                bounds("×")
            ),
        }
    }

    /// Evaluates the trend on the sweep's medians.
    pub fn evaluate(&self, spec: &Spec, summary: &Summary) -> Verdict {
        let statement = self.statement(spec);
        let metric = self.metric_name(spec);
        let values = |series: &str| -> Option<Vec<(f64, f64)>> {
            summary.series_index(series)?;
            Some(
                summary
                    .xs
                    .iter()
                    .filter(|x| self.in_range(**x))
                    .filter_map(|x| Some((*x, summary.median(series, metric, *x)?)))
                    .collect(),
            )
        };
        let not_checked = |why: String| Verdict {
            holds: None,
            line: format!("not checked: {statement}: {why}"),
        };
        let Some(mut a) = values(&self.series) else {
            return not_checked(format!("series {} did not run", self.series));
        };
        if let (Kind::Change, Some(over)) = (self.kind, &self.over) {
            // The change of a ratio: divide first, at the x values both have.
            let Some(b) = values(over) else {
                return not_checked(format!("series {over} did not run"));
            };
            a = ratios(&a, &b);
        }
        if a.is_empty() {
            return not_checked("no point in range has a successful run".into());
        }
        let (holds, numbers) = match self.kind {
            Kind::Ratio => {
                let over = self.over.as_deref().unwrap_or_default();
                let Some(b) = values(over) else {
                    return not_checked(format!("series {over} did not run"));
                };
                let ratios = ratios(&a, &b);
                if ratios.is_empty() {
                    return not_checked(format!("{over} has no successful run in range"));
                }
                let ok = |r: f64| self.bounds_hold(r);
                let holds = if self.anywhere {
                    ratios.iter().any(|(_, r)| ok(*r))
                } else {
                    ratios.iter().all(|(_, r)| ok(*r))
                };
                let list = ratios
                    .iter()
                    .map(|(x, r)| format!("{:.2}× at {}", r, num(*x)))
                    .collect::<Vec<_>>()
                    .join(", ");
                (holds, list)
            }
            Kind::Flat => {
                let hi = a.iter().map(|p| p.1).fold(f64::MIN, f64::max);
                let lo = a.iter().map(|p| p.1).fold(f64::MAX, f64::min);
                let spread = (hi - lo) / hi.max(f64::MIN_POSITIVE);
                (
                    spread <= self.within.unwrap_or(0.0),
                    format!(
                        "varies by {:.0}% ({} to {})",
                        spread * 100.0,
                        short(lo),
                        short(hi)
                    ),
                )
            }
            Kind::Change => {
                let (first, last) = (a[0], a[a.len() - 1]);
                let r = last.1 / first.1.max(f64::MIN_POSITIVE);
                (
                    self.bounds_hold(r),
                    format!(
                        "{:.2}× ({} at {}, {} at {})",
                        r,
                        short(first.1),
                        num(first.0),
                        short(last.1),
                        num(last.0)
                    ),
                )
            }
        };
        Verdict {
            holds: Some(holds),
            line: format!(
                "{}: {statement}: {numbers}",
                if holds { "holds" } else { "does not hold" }
            ),
        }
    }

    fn bounds_hold(&self, r: f64) -> bool {
        self.at_least.is_none_or(|l| r >= l) && self.at_most.is_none_or(|m| r <= m)
    }
}

/// `a` over `b` at each x both have, as (x, ratio).
fn ratios(a: &[(f64, f64)], b: &[(f64, f64)]) -> Vec<(f64, f64)> {
    a.iter()
        .filter_map(|(x, v)| {
            let (_, w) = b.iter().find(|(bx, _)| bx == x)?;
            Some((*x, v / w.max(f64::MIN_POSITIVE)))
        })
        .collect()
}

/// A number as short as it can be written exactly enough for a verdict line.
pub fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    }
}

/// A measured value with a k/M suffix.
pub fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::results::ResultRow;
    use super::super::spec::tests::spec;
    use super::super::summary::Summary;
    use super::*;

    /// A summary where qstore makes `q[i]` and calvin `c[i]` txn/s at the i-th x, twice.
    fn summary(q: [f64; 3], c: [f64; 3]) -> (Spec, Summary) {
        let spec = spec("");
        let plan = spec.plan("t", false, &|p| p != "future").unwrap();
        let mut rows = Vec::new();
        for round in 0..2 {
            for (i, x) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                for (series, v) in [("qstore", q[i]), ("calvin-count", c[i])] {
                    let mut metrics = vec![0.0; super::super::metric::METRICS.len()];
                    // Round 1 runs 10% faster: the median is the mean of the two.
                    metrics[0] = v * if round == 1 { 1.1 } else { 1.0 };
                    rows.push(ResultRow {
                        round,
                        series: series.into(),
                        x,
                        failure: String::new(),
                        params: Vec::new(),
                        metrics,
                    });
                }
            }
        }
        (spec, Summary::new(&plan, &rows))
    }

    fn trend(text: &str) -> Trend {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_ratio_holds_at_every_point_of_its_range_or_not() {
        let (spec, s) = summary([300.0, 200.0, 400.0], [100.0, 100.0, 100.0]);
        let every =
            trend("kind = 'ratio'\nseries = 'qstore'\nover = 'calvin-count'\nat_least = 2.5");
        let v = every.evaluate(&spec, &s);
        assert_eq!(v.holds, Some(false), "{}", v.line);
        assert!(
            v.line.contains("3.00× at 0, 2.00× at 50, 4.00× at 100"),
            "{}",
            v.line
        );
        let from = trend(
            "kind = 'ratio'\nseries = 'qstore'\nover = 'calvin-count'\nat_least = 2.5\nfrom = 100",
        );
        assert_eq!(from.evaluate(&spec, &s).holds, Some(true));
        let some = trend(
            "kind = 'ratio'\nseries = 'qstore'\nover = 'calvin-count'\nat_least = 3.5\nanywhere = true",
        );
        assert_eq!(some.evaluate(&spec, &s).holds, Some(true));
    }

    #[test]
    fn a_change_with_over_is_the_change_of_the_ratio() {
        // qstore / calvin: 1x, 1.8x, 4x.
        let (spec, s) = summary([100.0, 90.0, 80.0], [100.0, 50.0, 20.0]);
        let grows =
            trend("kind = 'change'\nseries = 'qstore'\nover = 'calvin-count'\nat_least = 3.5");
        let v = grows.evaluate(&spec, &s);
        assert_eq!(v.holds, Some(true), "{}", v.line);
        assert!(
            v.line
                .contains("qstore / calvin-count at the last x over the first")
                && v.line.contains("4.00× (1.00 at 0, 4.00 at 100)"),
            "{}",
            v.line
        );
        let to = trend(
            "kind = 'change'\nseries = 'qstore'\nover = 'calvin-count'\nat_least = 3.5\nto = 50",
        );
        assert_eq!(to.evaluate(&spec, &s).holds, Some(false));
    }

    #[test]
    fn flat_and_change_use_the_medians() {
        let (spec, s) = summary([100.0, 90.0, 80.0], [100.0, 50.0, 20.0]);
        assert_eq!(s.median("qstore", "throughput_tps", 0.0), Some(105.0));
        let flat = trend("kind = 'flat'\nseries = 'qstore'\nwithin = 0.25");
        let v = flat.evaluate(&spec, &s);
        assert_eq!(v.holds, Some(true), "{}", v.line);
        assert!(v.line.contains("varies by 20%"), "{}", v.line);
        let falls = trend("kind = 'change'\nseries = 'calvin-count'\nat_most = 0.5");
        let v = falls.evaluate(&spec, &s);
        assert_eq!(v.holds, Some(true), "{}", v.line);
        assert!(v.line.contains("0.20×"), "{}", v.line);
        let grows = trend("kind = 'change'\nseries = 'qstore'\nat_least = 1.0");
        assert_eq!(grows.evaluate(&spec, &s).holds, Some(false));
    }

    #[test]
    fn a_series_that_did_not_run_is_not_checked() {
        let (spec, s) = summary([1.0; 3], [1.0; 3]);
        let t = trend("kind = 'flat'\nseries = 'future'\nwithin = 0.1");
        let v = t.evaluate(&spec, &s);
        assert_eq!(v.holds, None);
        assert!(v.line.starts_with("not checked"), "{}", v.line);
    }
}
