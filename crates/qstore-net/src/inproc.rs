//! The in-process transport: one channel per node, and, when a delay is configured, a delay
//! line thread that holds each message until its delivery time. Loss can be injected too.

use crate::{encoded_len, Envelope, NetCounters, Transport};
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use qstore_core::config::NetConfig;
use qstore_core::NodeId;
use rand::Rng as _;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A network of `n` nodes inside one process.
pub struct InProcNetwork<M> {
    inboxes: Vec<Sender<Envelope<M>>>,
    delay_line: Option<(Sender<Delayed<M>>, JoinHandle<()>)>,
    loss: Option<Loss>,
    /// A node cut off from every other one from this moment on (fault injection).
    /// The server cut off, from when, and until when (`None`: for good).
    cut_off: Option<(NodeId, Instant, Option<Instant>)>,
    counters: NetCounters,
}

/// Injected message loss: message `n` between nodes is lost when a hash of (seed, n) falls
/// below `threshold`. Senders on many threads share one counter, so which messages are lost
/// depends on their interleaving, but the fraction does not.
struct Loss {
    threshold: u64,
    seed: u64,
    sent: AtomicU64,
}

impl Loss {
    fn new(fraction: f64, seed: u64) -> Option<Loss> {
        (fraction > 0.0).then(|| Loss {
            // 2^64 * fraction, saturating at 1.0.
            threshold: (fraction * u64::MAX as f64) as u64,
            seed,
            sent: AtomicU64::new(0),
        })
    }

    fn lose(&self) -> bool {
        let n = self.sent.fetch_add(1, Ordering::Relaxed);
        qstore_core::rng::splitmix64(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            < self.threshold
    }
}

struct Delayed<M> {
    sent_at: Instant,
    to: NodeId,
    env: Envelope<M>,
}

impl<M: Serialize + Send + 'static> InProcNetwork<M> {
    /// Creates the network and returns the inbox of every node, indexed by node id.
    pub fn new(nodes: usize, net: &NetConfig, seed: u64) -> (Self, Vec<Receiver<Envelope<M>>>) {
        let (inboxes, receivers): (Vec<_>, Vec<_>) = (0..nodes).map(|_| unbounded()).unzip();
        let delay_line = (net.delay_us > 0 || net.jitter_us > 0).then(|| {
            let (tx, rx) = unbounded();
            let targets = inboxes.clone();
            let (delay, jitter) = (net.delay_us, net.jitter_us);
            let handle = std::thread::Builder::new()
                .name("net-delay".into())
                .spawn(move || run_delay_line(rx, targets, delay, jitter, seed))
                .expect("spawn delay line thread");
            (tx, handle)
        });
        let network = InProcNetwork {
            inboxes,
            delay_line,
            loss: Loss::new(net.drop_fraction, seed),
            cut_off: net.cut_off_node.map(|n| {
                let at = Instant::now() + Duration::from_millis(net.cut_off_after_ms);
                let until = (net.cut_off_for_ms > 0)
                    .then(|| at + Duration::from_millis(net.cut_off_for_ms));
                (NodeId(n), at, until)
            }),
            counters: NetCounters::new(nodes),
        };
        (network, receivers)
    }
}

impl<M> Drop for InProcNetwork<M> {
    fn drop(&mut self) {
        if let Some((tx, handle)) = self.delay_line.take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}

impl<M: Serialize + Send + 'static> Transport<M> for InProcNetwork<M> {
    fn send(&self, from: NodeId, to: NodeId, msg: M) {
        self.counters.record(from.index(), encoded_len(&msg));
        if from != to && self.loss.as_ref().is_some_and(Loss::lose) {
            return;
        }
        if !self.reachable(from, to) {
            return;
        }
        let env = Envelope { from, msg };
        // A send fails only when the receiving node has shut down; its messages are moot then.
        match &self.delay_line {
            None => {
                let _ = self.inboxes[to.index()].send(env);
            }
            Some((tx, _)) => {
                let sent_at = Instant::now();
                let _ = tx.send(Delayed { sent_at, to, env });
            }
        }
    }

    fn counters(&self) -> &NetCounters {
        &self.counters
    }

    fn reachable(&self, from: NodeId, to: NodeId) -> bool {
        match self.cut_off {
            Some((cut, at, until)) => {
                let now = Instant::now();
                let cut_now = now >= at && until.is_none_or(|u| now < u);
                from == to || (from != cut && to != cut) || !cut_now
            }
            None => true,
        }
    }
}

/// Delivers each message `delay + U[0, jitter)` microseconds after it was sent, never before
/// an earlier message of the same link (links are FIFO, like TCP connections).
fn run_delay_line<M>(
    rx: Receiver<Delayed<M>>,
    inboxes: Vec<Sender<Envelope<M>>>,
    delay_us: u64,
    jitter_us: u64,
    seed: u64,
) {
    let n = inboxes.len();
    let mut rng = qstore_core::rng::stream(seed, u64::MAX - 1);
    let mut link_last = vec![Instant::now(); n * n];
    // Heap of (deliver_at, sequence) -> message; the sequence keeps equal times FIFO.
    let mut heap: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut pending: seq_map::SeqMap<Envelope<M>, NodeId> = Default::default();
    let mut seq = 0u64;
    loop {
        let now = Instant::now();
        while let Some(&Reverse((at, s))) = heap.peek() {
            if at > now {
                break;
            }
            heap.pop();
            let (env, to) = pending.take(s);
            let _ = inboxes[to.index()].send(env);
        }
        let next = match heap.peek() {
            Some(&Reverse((at, _))) => rx.recv_timeout(at.saturating_duration_since(now)),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(d) => {
                let jitter = if jitter_us > 0 {
                    rng.random_range(0..jitter_us)
                } else {
                    0
                };
                let link = d.env.from.index() * n + d.to.index();
                let at =
                    (d.sent_at + Duration::from_micros(delay_us + jitter)).max(link_last[link]);
                link_last[link] = at;
                heap.push(Reverse((at, seq)));
                pending.put(seq, d.env, d.to);
                seq += 1;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // Shutting down: deliver what is left in time order.
    while let Some(Reverse((_, s))) = heap.pop() {
        let (env, to) = pending.take(s);
        let _ = inboxes[to.index()].send(env);
    }
}

/// Messages waiting in the delay line, by sequence number.
mod seq_map {
    use std::collections::VecDeque;

    /// Sequence numbers are handed out consecutively and taken roughly in order, so a ring
    /// buffer indexed by `seq - first` holds them without hashing.
    pub struct SeqMap<V, T> {
        first: u64,
        slots: VecDeque<Option<(V, T)>>,
    }

    impl<V, T> Default for SeqMap<V, T> {
        fn default() -> Self {
            SeqMap {
                first: 0,
                slots: VecDeque::new(),
            }
        }
    }

    impl<V, T> SeqMap<V, T> {
        pub fn put(&mut self, seq: u64, v: V, t: T) {
            debug_assert_eq!(seq, self.first + self.slots.len() as u64);
            self.slots.push_back(Some((v, t)));
        }

        pub fn take(&mut self, seq: u64) -> (V, T) {
            let i = (seq - self.first) as usize;
            let item = self.slots[i]
                .take()
                .expect("each sequence number is taken once");
            while matches!(self.slots.front(), Some(None)) {
                self.slots.pop_front();
                self.first += 1;
            }
            item
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivers_and_counts_without_delay() {
        let (net, rx) = InProcNetwork::<u64>::new(2, &NetConfig::default(), 1);
        net.send(NodeId(0), NodeId(1), 5);
        let env = rx[1].recv().unwrap();
        assert_eq!((env.from, env.msg), (NodeId(0), 5));
        assert_eq!(net.counters().snapshot()[0], (1, encoded_len(&5u64) as u64));
    }

    #[test]
    fn injected_delay_holds_messages_and_keeps_links_fifo() {
        let cfg = NetConfig {
            delay_us: 2_000,
            jitter_us: 1_000,
            ..Default::default()
        };
        let (net, rx) = InProcNetwork::<u32>::new(2, &cfg, 1);
        let start = Instant::now();
        for i in 0..50 {
            net.send(NodeId(0), NodeId(1), i);
        }
        let got: Vec<u32> = (0..50).map(|_| rx[1].recv().unwrap().msg).collect();
        assert!(start.elapsed() >= Duration::from_micros(2_000));
        assert_eq!(got, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn injected_loss_drops_about_its_fraction_between_nodes_only() {
        let cfg = NetConfig {
            drop_fraction: 0.25,
            ..Default::default()
        };
        let (net, rx) = InProcNetwork::<u32>::new(2, &cfg, 7);
        for i in 0..4_000 {
            net.send(NodeId(0), NodeId(1), i);
            net.send(NodeId(0), NodeId(0), i);
        }
        let delivered = rx[1].try_iter().count();
        assert!((2_800..3_200).contains(&delivered), "{delivered} of 4000");
        assert_eq!(
            rx[0].try_iter().count(),
            4_000,
            "a node's own messages are never lost"
        );
    }
}
