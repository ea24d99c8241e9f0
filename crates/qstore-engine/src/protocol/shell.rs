//! The node shell every multi-threaded protocol shares: how a cluster's nodes stop. New
//! requests are refused, the transactions in flight are given a while to finish everywhere
//! (an abort on its way to a participant must still roll back there, or the data would keep
//! its writes), then the threads stop and whatever is left is answered `Rejected`.

use parking_lot::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A protocol's node, as the shell stops it.
pub(crate) trait NodeShell {
    /// Refuses new requests; those already admitted go on.
    fn close_admission(&self);
    /// Whether nothing is in flight: every admitted transaction is answered and its work
    /// done on this node.
    fn quiescent(&self) -> bool;
    /// Tells the node's threads to stop, and wakes those that sleep.
    fn stop(&self);
    /// Answers `Rejected` every transaction still unanswered (after the threads stopped).
    fn reject_leftovers(&self);
}

/// Stops `nodes` (those this process hosts) and joins `threads`, giving the transactions in
/// flight up to `quiesce` to finish.
pub(crate) fn shut_down<N: NodeShell>(
    nodes: &[&N],
    threads: &Mutex<Vec<JoinHandle<()>>>,
    quiesce: Duration,
) {
    for n in nodes {
        n.close_admission();
    }
    let deadline = Instant::now() + quiesce;
    while !nodes.iter().all(|n| n.quiescent()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if !nodes.iter().all(|n| n.quiescent()) {
        tracing::warn!("stopping with transactions still in flight");
    }
    for n in nodes {
        n.stop();
    }
    for h in threads.lock().drain(..) {
        let _ = h.join();
    }
    for n in nodes {
        n.reject_leftovers();
    }
}
