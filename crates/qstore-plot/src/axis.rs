//! Axes: ranges with a margin, linear or logarithmic, their ticks and tick labels.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

/// The largest magnitude drawn on a linear axis: larger values are drawn at it, so that
/// ranges and their margins stay finite.
const LIMIT: f64 = 1e300;
/// The largest value drawn on a log axis, and the inverse of the smallest.
const LOG_LIMIT: f64 = 1e200;

/// One axis: its range, linear or logarithmic, with the ticks chosen for it.
#[derive(Clone, Debug)]
pub(crate) struct Axis {
    pub(crate) log: bool,
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    /// On a log axis, what non-positive values are drawn at.
    pub(crate) floor: f64,
    /// Labelled ticks.
    pub(crate) major: Vec<f64>,
    /// Ticks of the light grid between them.
    pub(crate) minor: Vec<f64>,
}

impl Axis {
    /// An axis that holds `values` (all finite) with a little margin. A linear axis that
    /// `from_zero` starts at 0 (or below, for negative values).
    pub(crate) fn new(values: &[f64], log: bool, from_zero: bool, max_ticks: usize) -> Axis {
        let (lo, hi, floor) = if log {
            log_range(values)
        } else {
            let (lo, hi) = linear_range(values, from_zero);
            (lo, hi, f64::MIN_POSITIVE)
        };
        let (major, minor) = if log {
            log_ticks(lo, hi, max_ticks)
        } else {
            linear_ticks(lo, hi, max_ticks)
        };
        Axis {
            log,
            lo,
            hi,
            floor,
            major,
            minor,
        }
    }

    /// Where `v` is drawn: on a log axis, non-positive values go to the floor; magnitudes
    /// are kept within [`LIMIT`] or [`LOG_LIMIT`].
    pub(crate) fn place(&self, v: f64) -> f64 {
        if !self.log {
            v.clamp(-LIMIT, LIMIT)
        } else if v <= 0.0 {
            self.floor
        } else {
            v.clamp(1.0 / LOG_LIMIT, LOG_LIMIT)
        }
    }

    /// Where `v` lies along the axis: 0 at its start, 1 at its end.
    pub(crate) fn fraction(&self, v: f64) -> f64 {
        let (a, b) = (self.scaled(self.lo), self.scaled(self.hi));
        (self.scaled(v) - a) / (b - a)
    }

    fn scaled(&self, v: f64) -> f64 {
        if self.log {
            v.max(f64::MIN_POSITIVE).ln()
        } else {
            v
        }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let f = self.fraction(*value);
        // Far outside values still map to a pixel well outside the chart.
        let f = if f.is_finite() {
            f.clamp(-4.0, 5.0)
        } else {
            0.0
        };
        limit.0 + (f * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            let mut all = self.major.clone();
            all.extend_from_slice(&self.minor);
            all
        } else {
            self.major.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// The range of a linear axis holding `values`.
pub(crate) fn linear_range(values: &[f64], from_zero: bool) -> (f64, f64) {
    let Some((mut mn, mut mx)) = min_max(values.iter().map(|v| v.clamp(-LIMIT, LIMIT))) else {
        return (0.0, 1.0);
    };
    if from_zero {
        mn = mn.min(0.0);
        mx = mx.max(0.0);
    }
    let span = mx - mn;
    if span <= mx.abs().max(mn.abs()) * 1e-9 || span == 0.0 {
        // One value: a range around it.
        let pad = if mx == 0.0 { 1.0 } else { mx.abs() * 0.1 };
        let lo = if from_zero && mn == 0.0 {
            0.0
        } else {
            mn - pad
        };
        return (lo, mx + pad);
    }
    let pad = span * 0.05;
    let lo = if from_zero && mn == 0.0 {
        0.0
    } else {
        mn - pad
    };
    let hi = if from_zero && mx == 0.0 {
        0.0
    } else {
        mx + pad
    };
    (lo, hi)
}

/// The range of a log axis holding `values`, and the floor non-positive values are drawn at:
/// half the smallest positive value.
pub(crate) fn log_range(values: &[f64]) -> (f64, f64, f64) {
    let positive = values.iter().filter(|v| **v > 0.0);
    let Some((mn, mx)) = min_max(positive.map(|v| v.clamp(1.0 / LOG_LIMIT, LOG_LIMIT))) else {
        return (1.0, 10.0, 1.0);
    };
    let floor = mn / 2.0;
    let mn = if values.iter().any(|v| *v <= 0.0) {
        floor
    } else {
        mn
    };
    if mx <= mn * (1.0 + 1e-9) {
        return (mn / 2.0, mx * 2.0, floor);
    }
    // 5 % of the span on each side, in log space (the ratio itself may not be finite).
    let pad = (0.05 * (mx.ln() - mn.ln())).exp().max(1.05);
    (mn / pad, mx * pad, floor)
}

fn min_max(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((a, b)) => Some((a.min(v), b.max(v))),
        })
}

/// Multiples of a round step (1, 2, 2.5 or 5 times a power of ten) in `lo..=hi`, at most
/// `max_ticks` of them; the light grid halves the step.
pub(crate) fn linear_ticks(lo: f64, hi: f64, max_ticks: usize) -> (Vec<f64>, Vec<f64>) {
    let span = hi - lo;
    if !span.is_finite() || span <= 0.0 {
        return (vec![], vec![]);
    }
    let max_ticks = max_ticks.max(2);
    let raw = span / (max_ticks - 1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let mut step = 10.0 * mag;
    for m in [1.0, 2.0, 2.5, 5.0] {
        if m * mag >= raw * (1.0 - 1e-9) {
            step = m * mag;
            break;
        }
    }
    let multiples = |step: f64| -> Vec<f64> {
        let first = (lo / step - 1e-9).ceil() as i64;
        let last = (hi / step + 1e-9).floor() as i64;
        if last.saturating_sub(first) > 1000 {
            // The range is too narrow for its magnitude to tell the steps apart.
            return Vec::new();
        }
        (first..=last).map(|k| k as f64 * step).collect()
    };
    let major = multiples(step);
    let minor = multiples(step / 2.0)
        .into_iter()
        .filter(|v| !major.iter().any(|m| (m - v).abs() < step * 1e-6))
        .collect();
    (major, minor)
}

/// Ticks of a log axis: powers of ten (every n-th one if there are too many), 1-2-5 times
/// them on a shorter range, or round linear steps on a range too short for those.
pub(crate) fn log_ticks(lo: f64, hi: f64, max_ticks: usize) -> (Vec<f64>, Vec<f64>) {
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return (vec![], vec![]);
    }
    let within = |v: f64| v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9);
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let with_mults = |mults: &[f64]| -> Vec<f64> {
        (first..=last)
            .flat_map(|e| mults.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| within(*v))
            .collect()
    };
    let decades = with_mults(&[1.0]);
    let all_minor = if last - first <= 8 {
        with_mults(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    } else {
        decades.clone()
    };
    let mut major = decades.clone();
    if major.len() > max_ticks {
        // Every n-th power of ten, n round.
        let need = major.len().div_ceil(max_ticks);
        let stride = [2, 3, 5, 10, 20, 25, 50, 100]
            .into_iter()
            .find(|n| *n >= need)
            .unwrap_or(need) as i32;
        major.retain(|v| (v.log10().round() as i32).rem_euclid(stride) == 0);
    }
    if major.len() < 3 {
        let more = with_mults(&[1.0, 2.0, 5.0]);
        if more.len() <= max_ticks {
            major = more;
        }
    }
    if major.len() < 3 {
        // Less than a few times wide: round linear steps.
        let (lin, _) = linear_ticks(lo, hi, max_ticks.min(7));
        let lin: Vec<f64> = lin.into_iter().filter(|v| *v > 0.0).collect();
        if lin.len() > major.len() {
            major = lin;
        }
    }
    let mut minor: Vec<f64> = all_minor
        .into_iter()
        .filter(|v| !major.iter().any(|m| (m - v).abs() <= m.abs() * 1e-9))
        .collect();
    if minor.len() > 100 {
        // So many lines would grey the chart.
        minor.clear();
    }
    (major, minor)
}

/// A short tick label: k, M, G suffixes from a thousand on, no decimals on whole numbers,
/// no trailing zeros; scientific notation below 0.0001 and from 10^12 on.
pub(crate) fn tick_label(v: f64) -> String {
    if !v.is_finite() {
        return String::new();
    }
    let a = v.abs();
    if a == 0.0 {
        return "0".to_string();
    }
    if !(1e-4..1e12).contains(&a) {
        // Scientific notation, to 4 significant digits.
        let text = format!("{v:.3e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e{exponent}");
    }
    let (scaled, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    // The fewest decimals (up to 6) that show the value to a part in a million.
    let mut decimals = 0;
    while decimals < 6 {
        let p = 10f64.powi(decimals);
        if ((scaled * p).round() - scaled * p).abs() <= 1e-6 * scaled.abs().max(1e-9) * p {
            break;
        }
        decimals += 1;
    }
    let mut text = format!("{scaled:.*}", decimals as usize);
    if text.contains('.') {
        while text.ends_with('0') {
            text.pop();
        }
        if text.ends_with('.') {
            text.pop();
        }
    }
    if text == "-0" {
        text = "0".to_string();
    }
    text + suffix
}
