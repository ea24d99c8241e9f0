//! Which partition holds a key.

use crate::config::Partitioning;
use crate::ids::{Key, PartitionId, TableId};
use crate::txn::TableSchema;
use strength_reduce::StrengthReducedU64;

/// Maps (table, key) to a partition in O(1).
///
/// Range partitioning (the default) gives partition `p` the keys `[p * w, (p + 1) * w)` of a
/// table whose range width is `w` (its `keys_per_partition`); keys beyond the last range go to
/// the last partition. Hash partitioning scatters consecutive keys round-robin: partition =
/// key mod partitions (an identity hash, which for the dense integer keys of the workloads
/// spreads load evenly and keeps key generation O(1) in both directions).
///
/// Every access of every protocol asks for its key's partition, and a hardware division is
/// a visible share of planning a transaction: the divisors are fixed for a run, so they are
/// kept as multiply-and-shift reciprocals.
#[derive(Clone, Debug)]
pub struct PartitionMap {
    partitions: u32,
    scheme: Partitioning,
    widths: Vec<StrengthReducedU64>,
    by_partitions: StrengthReducedU64,
}

impl PartitionMap {
    pub fn new(partitions: u32, scheme: Partitioning, tables: &[TableSchema]) -> Self {
        assert!(partitions > 0, "a cluster has at least one partition");
        PartitionMap {
            partitions,
            scheme,
            widths: tables
                .iter()
                .map(|t| StrengthReducedU64::new(t.keys_per_partition.max(1)))
                .collect(),
            by_partitions: StrengthReducedU64::new(partitions as u64),
        }
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    #[inline]
    pub fn partition_of(&self, table: TableId, key: Key) -> PartitionId {
        if self.partitions == 1 {
            return PartitionId(0);
        }
        let p = match self.scheme {
            Partitioning::Range => {
                (key / self.widths[table as usize]).min(self.partitions as u64 - 1)
            }
            Partitioning::Hash => key % self.by_partitions,
        };
        PartitionId(p as u32)
    }

    /// The `i`-th key (in key order) of `table` that lives in `partition`; workloads use it to
    /// generate keys of a chosen partition.
    #[inline]
    pub fn nth_key_of(&self, table: TableId, partition: PartitionId, i: u64) -> Key {
        match self.scheme {
            Partitioning::Range => partition.0 as u64 * self.widths[table as usize].get() + i,
            Partitioning::Hash => i * self.partitions as u64 + partition.0 as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables() -> Vec<TableSchema> {
        vec![TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: 10,
            keys_per_partition: 100,
            read_mostly: false,
        }]
    }

    #[test]
    fn range_partitioning_is_contiguous() {
        let m = PartitionMap::new(4, Partitioning::Range, &tables());
        assert_eq!(m.partition_of(0, 0), PartitionId(0));
        assert_eq!(m.partition_of(0, 99), PartitionId(0));
        assert_eq!(m.partition_of(0, 100), PartitionId(1));
        assert_eq!(m.partition_of(0, 399), PartitionId(3));
        assert_eq!(
            m.partition_of(0, 10_000),
            PartitionId(3),
            "overflow goes to the last"
        );
        assert_eq!(m.nth_key_of(0, PartitionId(2), 5), 205);
    }

    #[test]
    fn hash_partitioning_spreads_and_round_trips() {
        let m = PartitionMap::new(4, Partitioning::Hash, &tables());
        let mut counts = [0u32; 4];
        for k in 0..4000 {
            counts[m.partition_of(0, k).index()] += 1;
        }
        assert_eq!(counts, [1000; 4]);
        for p in 0..4 {
            for i in 0..5 {
                let k = m.nth_key_of(0, PartitionId(p), i);
                assert_eq!(m.partition_of(0, k), PartitionId(p));
            }
        }
    }

    /// The reciprocal division gives exactly what `/` and `%` give, for small and large
    /// divisors (powers of two take another path) and keys up to the largest allowed.
    #[test]
    fn reciprocal_division_matches_hardware_division() {
        let keys = (0..2000u64)
            .chain((0..64).map(|s| 1u64 << s))
            .chain((0..2000u64).map(|i| crate::MAX_KEY - i));
        for width in [1u64, 3, 7, 100, 1 << 20, 1_000_003, 10_000_000] {
            for partitions in [1u32, 2, 3, 4, 7, 64] {
                let table = TableSchema {
                    keys_per_partition: width,
                    ..tables()[0].clone()
                };
                let range = PartitionMap::new(
                    partitions,
                    Partitioning::Range,
                    std::slice::from_ref(&table),
                );
                let hash = PartitionMap::new(partitions, Partitioning::Hash, &[table]);
                for k in keys.clone() {
                    let want = (k / width).min(partitions as u64 - 1) as u32;
                    assert_eq!(
                        range.partition_of(0, k),
                        PartitionId(want),
                        "range {k}/{width}"
                    );
                    let want = (k % partitions as u64) as u32;
                    assert_eq!(
                        hash.partition_of(0, k),
                        PartitionId(want),
                        "hash {k}%{partitions}"
                    );
                }
            }
        }
    }
}
