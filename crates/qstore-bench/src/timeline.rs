//! Throughput over time: one point per second of the measurement window, with the commits,
//! their mean latency and the network traffic of that second. LEAP's automatic
//! repartitioning (its figure 12) and a slow node's drag show only here: a run's totals
//! average them away.

use serde::Serialize;

/// One interval of the measurement window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// End of the interval, in seconds since the measurement window opened.
    pub t_s: f64,
    /// Commits per second in the interval.
    pub tps: f64,
    /// Mean latency of the transactions that committed in the interval (0 when none did).
    pub latency_mean_ms: f64,
    /// Node-to-node messages and bytes sent per second in the interval, over all nodes.
    pub msgs_per_s: f64,
    pub bytes_per_s: f64,
}

/// The running totals a point is the difference of.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Totals {
    pub commits: u64,
    pub latency_us: u64,
    pub msgs: u64,
    pub bytes: u64,
}

impl Totals {
    /// Totals with the cluster's traffic summed over its nodes.
    pub fn new(commits: u64, latency_us: u64, traffic: &[(u64, u64)]) -> Totals {
        let (msgs, bytes) = traffic
            .iter()
            .fold((0, 0), |(m, b), &(m2, b2)| (m + m2, b + b2));
        Totals {
            commits,
            latency_us,
            msgs,
            bytes,
        }
    }
}

/// Builds the points of a window from samples of the totals.
pub(crate) struct Timeline {
    last: Totals,
    last_s: f64,
    pub points: Vec<TimelinePoint>,
}

impl Timeline {
    /// A timeline whose window opened with totals `start`.
    pub fn starting(start: Totals) -> Timeline {
        Timeline {
            last: start,
            last_s: 0.0,
            points: Vec::new(),
        }
    }

    /// Adds the point from the last sample to `now`, taken `t_s` seconds into the window.
    /// Totals only grow; a counter that went back (a server restarted) counts as no change.
    pub fn sample(&mut self, t_s: f64, now: Totals) {
        let dt = (t_s - self.last_s).max(1e-9);
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let commits = d(now.commits, self.last.commits);
        self.points.push(TimelinePoint {
            t_s,
            tps: commits as f64 / dt,
            latency_mean_ms: if commits == 0 {
                0.0
            } else {
                d(now.latency_us, self.last.latency_us) as f64 / commits as f64 / 1000.0
            },
            msgs_per_s: d(now.msgs, self.last.msgs) as f64 / dt,
            bytes_per_s: d(now.bytes, self.last.bytes) as f64 / dt,
        });
        self.last = now;
        self.last_s = t_s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_the_differences_of_the_samples_per_second() {
        let mut t = Timeline::starting(Totals::new(100, 10_000, &[(5, 500), (5, 500)]));
        t.sample(
            1.0,
            Totals::new(300, 10_000 + 200 * 1500, &[(10, 1000), (20, 2000)]),
        );
        t.sample(1.5, Totals::new(300, 310_000, &[(10, 1000), (20, 2000)]));
        assert_eq!(
            t.points[0],
            TimelinePoint {
                t_s: 1.0,
                tps: 200.0,
                latency_mean_ms: 1.5,
                msgs_per_s: 20.0,
                bytes_per_s: 2000.0,
            }
        );
        // Nothing committed, nothing sent: zeros, not NaN.
        assert_eq!(
            t.points[1],
            TimelinePoint {
                t_s: 1.5,
                tps: 0.0,
                latency_mean_ms: 0.0,
                msgs_per_s: 0.0,
                bytes_per_s: 0.0,
            }
        );
    }

    #[test]
    fn a_counter_that_went_back_counts_as_no_change() {
        let mut t = Timeline::starting(Totals::new(10, 0, &[(100, 100)]));
        t.sample(1.0, Totals::new(20, 1000, &[(40, 40)]));
        assert_eq!(t.points[0].msgs_per_s, 0.0);
        assert_eq!(t.points[0].tps, 10.0);
    }
}
