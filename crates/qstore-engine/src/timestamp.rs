//! Timestamps that every timestamp-based protocol shares: a loosely synchronised clock (the
//! system clock, in microseconds) with the node id in the low bits, monotonic per node. Two
//! nodes never hand out the same timestamp, and a node's timestamps only grow, even when its
//! clock steps back.

use qstore_core::NodeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Bits of a timestamp that hold the node id (clusters have at most 1024 nodes).
const NODE_BITS: u32 = 10;

/// One node's source of timestamps.
pub struct TsSource {
    node: u64,
    /// How far behind the system clock this node's clock is (injected skew).
    behind_us: u64,
    last: AtomicU64,
}

impl TsSource {
    pub fn new(node: NodeId) -> Self {
        Self::behind(node, 0)
    }

    /// A source whose clock runs `behind_us` behind the system's.
    pub fn behind(node: NodeId, behind_us: u64) -> Self {
        debug_assert!(u64::from(node.0) < 1 << NODE_BITS);
        TsSource {
            node: u64::from(node.0),
            behind_us,
            last: AtomicU64::new(0),
        }
    }

    /// A timestamp later than every one this source gave before.
    pub fn next(&self) -> u64 {
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
            .saturating_sub(self.behind_us);
        let candidate = (now_us << NODE_BITS) | self.node;
        let step = 1 << NODE_BITS;
        let prev = self
            .last
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                Some(candidate.max(last + step))
            })
            .expect("the update always succeeds");
        candidate.max(prev + step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_grow_and_carry_their_node() {
        let (a, b) = (TsSource::new(NodeId(3)), TsSource::new(NodeId(5)));
        let mut last = 0;
        for _ in 0..10_000 {
            let t = a.next();
            assert!(t > last);
            assert_eq!(t & ((1 << NODE_BITS) - 1), 3);
            last = t;
        }
        assert_ne!(a.next(), b.next());
    }
}
