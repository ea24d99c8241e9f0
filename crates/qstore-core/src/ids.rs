//! Identifiers shared by every layer.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A primary key. Workloads encode composite keys into 64 bits so that range partitioning
/// (key / keys-per-partition) places related rows together.
pub type Key = u64;

/// The largest key a table can hold: indexes use the two largest values to mark free slots.
pub const MAX_KEY: Key = u64::MAX - 2;

/// A table of the catalog, numbered from 0 in registration order.
pub type TableId = u16;

/// A node (server) of the cluster. A node hosts exactly one partition replica; which one is
/// the placement map's to say ([`crate::placement::Placement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

/// A partition of the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionId(pub u32);

/// One attempt of one transaction. Unique in a run and never 0 (0 names the initial,
/// loaded version of every row in histories). A retried transaction gets a new id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TxnId(pub u64);

impl TxnId {
    /// The writer id of rows as loaded, before any transaction ran.
    pub const INITIAL: TxnId = TxnId(0);
}

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl PartitionId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T{}", self.0)
    }
}
