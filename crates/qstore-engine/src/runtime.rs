//! Thread plumbing shared by protocols: named worker threads, optional pinning to cores.
//!
//! Workers wait on crossbeam channels, which spin briefly and then park the thread: idle
//! workers cost no CPU, which matters when nodes share two cores.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The determinism study's slow node (its section 3.5): a node whose cores `T` CPU-bound
/// threads share, from some moment on. The paper starts such threads on one machine; one
/// machine here hosts every node, and threads started in it would slow them all. So the
/// slow node's own threads pay for them: after each piece of work that took `t`, a thread
/// spins for `T x t` (real work, no sleep), and so gets through `1 / (T + 1)` of what it
/// could, as a thread given its fair share of a core beside `T` busy ones. Waiting for work
/// costs nothing, as it would not on a shared core either.
pub struct Pace {
    burners: u32,
    from: Instant,
}

impl Pace {
    /// Node `node`'s pace, if the configuration slows it down (`cluster.slow_node`).
    pub fn of(cfg: &qstore_core::RunConfig, node: qstore_core::NodeId) -> Option<Pace> {
        let c = &cfg.cluster;
        (c.slow_node == Some(node.0) && c.slow_threads > 0).then(|| Pace {
            burners: c.slow_threads,
            from: Instant::now() + Duration::from_secs_f64(c.slow_from_s),
        })
    }

    /// When a piece of work begins (`None`: the node is not slowed down).
    #[inline]
    pub fn begin(pace: &Option<Pace>) -> Option<Instant> {
        pace.as_ref().map(|_| Instant::now())
    }

    /// The piece of work that began at `began` ([`Pace::begin`]) is done: spins for the
    /// burners' share of the core.
    #[inline]
    pub fn end(pace: &Option<Pace>, began: Option<Instant>) {
        if let (Some(p), Some(began)) = (pace, began) {
            p.burn(began);
        }
    }

    fn burn(&self, began: Instant) {
        let now = Instant::now();
        let until = now + self.share(began, now);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }

    /// How long the burners take of the core after a piece of work from `began` to `now`.
    fn share(&self, began: Instant, now: Instant) -> Duration {
        if now < self.from {
            return Duration::ZERO;
        }
        now.duration_since(began) * self.burners
    }
}

/// Spawns a named worker thread, pinned to core `index % cores` when `pin` is set.
///
/// A worker that panics has left its node's shared state half-updated, and the work it held
/// would never finish: the node would hang without a word. So the process stops instead,
/// with the panic's message, and peers and clients see a dead node they report.
pub fn spawn_worker<F>(name: String, pin: bool, index: usize, f: F) -> JoinHandle<()>
where
    F: FnOnce() + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if pin {
                pin_to_core(index);
            }
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                tracing::error!("worker thread {name} panicked; stopping the process");
                eprintln!("error: worker thread {name} panicked; stopping the process");
                std::process::exit(101);
            }
        })
        .expect("spawn worker thread")
}

fn pin_to_core(index: usize) {
    if let Some(cores) = core_affinity::get_core_ids() {
        if !cores.is_empty() && !core_affinity::set_for_current(cores[index % cores.len()]) {
            tracing::warn!("could not pin thread to core {}", index % cores.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::{NodeId, RunConfig};

    fn paced(node: u32, threads: u32, from_s: f64) -> Option<Pace> {
        let mut cfg = RunConfig::default();
        cfg.cluster.slow_node = Some(1);
        cfg.cluster.slow_threads = threads;
        cfg.cluster.slow_from_s = from_s;
        Pace::of(&cfg, NodeId(node))
    }

    /// Time a piece of work of `work` takes on a node paced by `pace`.
    fn took(pace: &Option<Pace>, work: Duration) -> Duration {
        let began = Pace::begin(pace);
        let start = Instant::now();
        while start.elapsed() < work {
            std::hint::spin_loop();
        }
        Pace::end(pace, began);
        start.elapsed()
    }

    #[test]
    fn the_slow_node_spends_its_burners_share_after_each_piece_of_work() {
        let work = Duration::from_millis(2);
        assert!(paced(0, 3, 0.0).is_none(), "only the slow node is paced");
        assert!(paced(1, 0, 0.0).is_none(), "no burners, no pace");
        assert!(took(&paced(1, 3, 0.0), work) >= work * 4);
        // Before the moment it slows down, it runs at full speed.
        let later = paced(1, 3, 60.0).unwrap();
        let now = Instant::now();
        assert_eq!(later.share(now - work, now), Duration::ZERO);
        assert_eq!(
            later.share(now, now + Duration::from_secs(61)),
            Duration::from_secs(183)
        );
    }
}
