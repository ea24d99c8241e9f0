//! Where partitions live: which servers hold a copy of each partition, and which of those
//! copies currently leads.
//!
//! A cluster of P partitions with replication factor rf runs rf **cluster instances**, each
//! holding every partition once (QR-Store's shape): server `s` belongs to instance `s / P`
//! and holds partition `s % P`. The servers holding copies of partition `i` form **replica
//! group** `i`; one of them is its leader, the one that plans (Q-Store) and answers clients.
//! Messages of transaction processing stay inside an instance; replication messages stay
//! inside a group. With rf = 1 server `n` holds partition `n` and leads it.
//!
//! Leaders change at run time (elections): the map is shared, and the replication layer
//! records each group's leader as it learns it.

use crate::ids::{NodeId, PartitionId};
use std::sync::atomic::{AtomicU32, Ordering};

/// Marks a group with no known leader (before its first election, or during one).
const NO_LEADER: u32 = u32::MAX;

/// The placement map: partition → replica group → current leader.
#[derive(Debug)]
pub struct Placement {
    partitions: u32,
    replicas: u32,
    /// By partition: the server leading its group, or `NO_LEADER`.
    leaders: Vec<AtomicU32>,
    /// By instance: taken out of service (its copies may hold what no log committed).
    stale: Vec<std::sync::atomic::AtomicBool>,
    /// By instance: rebuilt from another instance's copies (its history of the run has a
    /// gap: what ran before the copy ran elsewhere).
    rebuilt: Vec<std::sync::atomic::AtomicBool>,
    failovers: AtomicU32,
}

impl Placement {
    /// `partitions` partitions, each on `replicas` servers. With one replica each server
    /// leads its partition for good; with more, no group has a leader until its first
    /// election.
    pub fn new(partitions: u32, replicas: u32) -> Self {
        assert!(partitions > 0 && replicas > 0, "an empty placement");
        let first = |p| if replicas == 1 { p } else { NO_LEADER };
        Placement {
            partitions,
            replicas,
            leaders: (0..partitions).map(|p| AtomicU32::new(first(p))).collect(),
            stale: (0..replicas).map(|_| Default::default()).collect(),
            rebuilt: (0..replicas).map(|_| Default::default()).collect(),
            failovers: AtomicU32::new(0),
        }
    }

    /// Takes cluster instance `instance` out of service: its copies may hold what no log
    /// committed (a fail-over caught it executing speculatively), or it lost a server.
    pub fn mark_stale(&self, instance: u32) {
        if let Some(s) = self.stale.get(instance as usize) {
            s.store(true, Ordering::Release);
        }
    }

    /// Puts stale instance `instance` back in service, rebuilt from another's copies.
    pub fn mark_rebuilt(&self, instance: u32) {
        if let Some(r) = self.rebuilt.get(instance as usize) {
            r.store(true, Ordering::Release);
        }
        if let Some(s) = self.stale.get(instance as usize) {
            s.store(false, Ordering::Release);
        }
    }

    /// Whether instance `instance` was rebuilt (see `mark_rebuilt`).
    pub fn is_rebuilt(&self, instance: u32) -> bool {
        self.rebuilt
            .get(instance as usize)
            .is_some_and(|s| s.load(Ordering::Acquire))
    }

    /// Whether instance `instance` is out of service (see `mark_stale`).
    pub fn is_stale(&self, instance: u32) -> bool {
        self.stale
            .get(instance as usize)
            .is_some_and(|s| s.load(Ordering::Acquire))
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The replication factor: copies of each partition.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// Servers in the cluster: every copy of every partition.
    pub fn servers(&self) -> u32 {
        self.partitions * self.replicas
    }

    /// The partition server `s` holds.
    #[inline]
    pub fn partition_of(&self, s: NodeId) -> PartitionId {
        PartitionId(s.0 % self.partitions)
    }

    /// The cluster instance server `s` belongs to.
    #[inline]
    pub fn instance_of(&self, s: NodeId) -> u32 {
        s.0 / self.partitions
    }

    /// The server of `instance` that holds partition `p`.
    #[inline]
    pub fn server(&self, instance: u32, p: PartitionId) -> NodeId {
        debug_assert!(instance < self.replicas && p.0 < self.partitions);
        NodeId(instance * self.partitions + p.0)
    }

    /// The server in `s`'s instance that holds partition `p`: where `s` sends what it has
    /// for `p` while processing transactions.
    #[inline]
    pub fn peer_of(&self, s: NodeId, p: PartitionId) -> NodeId {
        self.server(self.instance_of(s), p)
    }

    /// Replica group `p`: the servers holding partition `p`, by instance.
    pub fn group(&self, p: PartitionId) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.replicas).map(move |k| self.server(k, p))
    }

    /// The server leading partition `p`'s group, if one is known.
    #[inline]
    pub fn leader(&self, p: PartitionId) -> Option<NodeId> {
        match self.leaders[p.index()].load(Ordering::Acquire) {
            NO_LEADER => None,
            s => Some(NodeId(s)),
        }
    }

    /// Records what the replication layer learnt: `leader` now leads `p`'s group (`None`:
    /// an election is under way).
    pub fn set_leader(&self, p: PartitionId, leader: Option<NodeId>) {
        debug_assert!(leader.is_none_or(|s| self.partition_of(s) == p));
        let v = leader.map_or(NO_LEADER, |s| s.0);
        let before = self.leaders[p.index()].swap(v, Ordering::AcqRel);
        if before != NO_LEADER && v != NO_LEADER && before != v {
            self.failovers.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Times a group's leadership moved from one server to another (fail-overs and
    /// hand-overs) that this map learnt of.
    pub fn failovers(&self) -> u32 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// Whether `s` leads its partition's group.
    #[inline]
    pub fn is_leader(&self, s: NodeId) -> bool {
        self.leader(self.partition_of(s)) == Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_replica_is_node_n_holds_partition_n() {
        let p = Placement::new(4, 1);
        assert_eq!(p.servers(), 4);
        for n in 0..4 {
            assert_eq!(p.partition_of(NodeId(n)), PartitionId(n));
            assert_eq!(p.leader(PartitionId(n)), Some(NodeId(n)));
            assert!(p.is_leader(NodeId(n)));
        }
    }

    #[test]
    fn instances_hold_every_partition_and_groups_span_instances() {
        let p = Placement::new(3, 2);
        assert_eq!(p.servers(), 6);
        assert_eq!(p.leader(PartitionId(0)), None);
        assert_eq!(p.instance_of(NodeId(4)), 1);
        assert_eq!(p.partition_of(NodeId(4)), PartitionId(1));
        assert_eq!(p.peer_of(NodeId(4), PartitionId(2)), NodeId(5));
        let g: Vec<_> = p.group(PartitionId(2)).collect();
        assert_eq!(g, vec![NodeId(2), NodeId(5)]);
        p.set_leader(PartitionId(2), Some(NodeId(5)));
        assert!(p.is_leader(NodeId(5)) && !p.is_leader(NodeId(2)));
        p.set_leader(PartitionId(2), None);
        assert_eq!(p.leader(PartitionId(2)), None);
    }
}
