//! Per-row protocol metadata kept beside the rows, so that storage needs no knowledge of
//! protocols: a protocol allocates one `MetaColumn<M>` per partition, sized like the tables,
//! and indexes it by (table, row).

use crate::{PartitionStore, RowId};
use qstore_core::TableId;

pub struct MetaColumn<M> {
    per_table: Vec<Box<[M]>>,
}

impl<M: Default> MetaColumn<M> {
    /// One `M::default()` per row slot of every table of `store`.
    pub fn for_partition(store: &PartitionStore) -> Self {
        let per_table = store
            .tables()
            .iter()
            .map(|t| (0..t.capacity()).map(|_| M::default()).collect())
            .collect();
        MetaColumn { per_table }
    }
}

impl<M> MetaColumn<M> {
    #[inline]
    pub fn get(&self, table: TableId, rid: RowId) -> &M {
        &self.per_table[table as usize][rid as usize]
    }

    /// Every row slot's metadata, table after table.
    pub fn iter(&self) -> impl Iterator<Item = &M> {
        self.per_table.iter().flat_map(|t| t.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::txn::TableSchema;
    use qstore_core::PartitionId;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn metadata_follows_table_shape() {
        let schemas = [
            TableSchema {
                name: "a".into(),
                row_size: 8,
                capacity_per_partition: 3,
                keys_per_partition: 10,
                read_mostly: false,
            },
            TableSchema {
                name: "b".into(),
                row_size: 8,
                capacity_per_partition: 5,
                keys_per_partition: 10,
                read_mostly: false,
            },
        ];
        let store = PartitionStore::new(PartitionId(0), &schemas);
        let meta: MetaColumn<AtomicU32> = MetaColumn::for_partition(&store);
        meta.get(1, 4).store(7, Ordering::Relaxed);
        assert_eq!(meta.get(1, 4).load(Ordering::Relaxed), 7);
        assert_eq!(meta.get(0, 2).load(Ordering::Relaxed), 0);
    }
}
