//! Message and byte accounting, per node.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one node. Padded to a cache line so that nodes do not false-share.
#[derive(Default, Debug)]
#[repr(align(64))]
pub struct NodeCounters {
    pub msgs_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// Frames written by the TCP transport (each carries one or more messages).
    pub frames_sent: AtomicU64,
}

/// Counters of every node of a cluster.
#[derive(Debug)]
pub struct NetCounters {
    nodes: Box<[NodeCounters]>,
}

impl NetCounters {
    pub fn new(nodes: usize) -> Self {
        NetCounters {
            nodes: (0..nodes).map(|_| NodeCounters::default()).collect(),
        }
    }

    #[inline]
    pub fn record(&self, node: usize, bytes: usize) {
        let c = &self.nodes[node];
        c.msgs_sent.fetch_add(1, Ordering::Relaxed);
        c.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts one frame written by `node` (the TCP transport batches messages into frames).
    #[inline]
    pub fn record_frame(&self, node: usize) {
        self.nodes[node].frames_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Frames sent by each node so far (0 for in-process transports, which send no frames).
    pub fn frames(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|c| c.frames_sent.load(Ordering::Relaxed))
            .collect()
    }

    /// (messages, bytes) sent by each node so far.
    pub fn snapshot(&self) -> Vec<(u64, u64)> {
        self.nodes
            .iter()
            .map(|c| {
                (
                    c.msgs_sent.load(Ordering::Relaxed),
                    c.bytes_sent.load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}

/// A postcard output that only counts bytes.
struct CountingFlavor(usize);

impl postcard::ser_flavors::Flavor for CountingFlavor {
    type Output = usize;

    fn try_push(&mut self, _data: u8) -> postcard::Result<()> {
        self.0 += 1;
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0 += data.len();
        Ok(())
    }

    fn finalize(self) -> postcard::Result<usize> {
        Ok(self.0)
    }
}

/// Bytes `msg` takes in the wire format, computed without allocating.
pub fn encoded_len<T: Serialize + ?Sized>(msg: &T) -> usize {
    postcard::serialize_with_flavor(msg, CountingFlavor(0)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_len_matches_postcard() {
        let v = (7u32, "hello".to_string(), vec![1u64, 300, 70_000]);
        assert_eq!(encoded_len(&v), postcard::to_stdvec(&v).unwrap().len());
    }

    #[test]
    fn counters_add_up_per_node() {
        let c = NetCounters::new(2);
        c.record(1, 10);
        c.record(1, 5);
        c.record_frame(1);
        assert_eq!(c.snapshot(), vec![(0, 0), (2, 15)]);
        assert_eq!(c.frames(), vec![0, 1]);
    }
}
