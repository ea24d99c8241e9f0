//! The transaction history model: what the engine records and the checker reads.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A record identity: table id and primary key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjKey {
    /// Table id.
    pub table: u16,
    /// Primary key within the table.
    pub key: u64,
}

impl ObjKey {
    /// Creates a record identity.
    pub const fn new(table: u16, key: u64) -> Self {
        Self { table, key }
    }
}

impl fmt::Display for ObjKey {
    /// Formats as `table:key`, e.g. `0:42`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.table, self.key)
    }
}

/// A version of a record: the transaction that wrote it and which of that
/// transaction's writes to the record it is (0-based; a transaction may write
/// one record several times). `writer == 0` means the initial (loaded)
/// version, with `seq` 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Version {
    /// Id of the writing transaction, or [`INITIAL_WRITER`] for the loaded version.
    pub writer: u64,
    /// Index of this write among the writer's writes to the record (0-based).
    pub seq: u32,
}

/// The pseudo transaction id of the initial (loaded) version of every record.
pub const INITIAL_WRITER: u64 = 0;

impl Version {
    /// The initial (loaded) version of a record.
    pub const INITIAL: Version = Version {
        writer: INITIAL_WRITER,
        seq: 0,
    };

    /// Creates a version written by `writer` as its `seq`-th write of the record.
    pub const fn new(writer: u64, seq: u32) -> Self {
        Self { writer, seq }
    }

    /// Whether this is the initial (loaded) version.
    pub const fn is_initial(&self) -> bool {
        self.writer == INITIAL_WRITER
    }
}

impl fmt::Display for Version {
    /// Formats as `T17.0` (writer and seq), or `init` for the initial version.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_initial() && self.seq == 0 {
            f.write_str("init")
        } else {
            write!(f, "T{}.{}", self.writer, self.seq)
        }
    }
}

/// How a transaction attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// The transaction committed; its final writes were installed.
    Committed,
    /// The transaction aborted; none of its writes may be observed.
    Aborted {
        /// Why it aborted, e.g. `conflict`.
        cause: String,
        /// Whether the abort was requested by transaction logic (user abort)
        /// rather than by the concurrency control.
        logic: bool,
    },
}

impl Outcome {
    /// Whether this is [`Outcome::Committed`].
    pub fn is_committed(&self) -> bool {
        matches!(self, Outcome::Committed)
    }
}

/// One transaction attempt as recorded by the engine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TxnRecord {
    /// Unique per attempt, never 0.
    pub id: u64,
    /// Home node.
    pub node: u32,
    /// Committed or aborted.
    pub outcome: Outcome,
    /// Versions observed. Reads of aborted transactions are ignored by the checker.
    pub reads: Vec<(ObjKey, Version)>,
    /// Records written and how many times (>= 1). The final version of this
    /// transaction on a record has `seq == count - 1`.
    pub writes: Vec<(ObjKey, u32)>,
}

impl TxnRecord {
    /// Whether the transaction committed.
    pub fn is_committed(&self) -> bool {
        self.outcome.is_committed()
    }
}

/// A recorded execution: transaction attempts plus the per-record version order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct History {
    /// All transaction attempts, committed and aborted, in any order.
    pub txns: Vec<TxnRecord>,
    /// Per record, the order in which committed versions were installed
    /// (writer ids, oldest first, NOT including the initial version, which is
    /// implicitly first). Several entries for the same record are concatenated
    /// in list order, so an engine may append the order incrementally.
    pub version_order: Vec<(ObjKey, Vec<u64>)>,
}
