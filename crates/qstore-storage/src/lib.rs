//! In-memory storage of qstore: tables of fixed-size rows with a hash primary index, one
//! [`PartitionStore`] per partition, the [`PartitionMap`] from keys to partitions, per-row
//! protocol metadata kept beside the rows ([`MetaColumn`]), and an order-independent content
//! hash used by tests and the serial oracle.
//!
//! Storage knows nothing about concurrency control. Row bytes are handed out through `unsafe`
//! accessors whose contract is: the calling protocol guarantees that no one writes a row while
//! anyone else reads or writes it (a lock, queue ownership, or a single thread).

mod index;
mod meta;
mod table;

pub use meta::MetaColumn;
pub use qstore_core::partition::PartitionMap;
pub use table::{content_hash_of, ContentSum, PartitionStore, RowId, RowVersion, Table};
