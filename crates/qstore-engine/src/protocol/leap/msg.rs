//! The messages of ownership transfer (the LEAP paper's section 3.3 and appendix D). Each
//! travels in the skeleton's `Peer` body, about the transaction that asked for the record.

use qstore_core::{Key, NodeId, TableId, TxnId};
use qstore_storage::RowVersion;
use serde::{Deserialize, Serialize};

use crate::protocol::interactive::Age;

/// One ownership-transfer step. `n` numbers a transfer: the record's partitioner hands out
/// one number per transfer it starts, so that late copies of an earlier transfer's messages
/// are told apart from the current one's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Msg {
    /// Requester to partitioner: the transaction (of `age`) wants record (`table`, `key`).
    OwnerRequest { table: TableId, key: Key, age: Age },
    /// Partitioner to owner: ship the record to node `to`.
    TransferRequest {
        table: TableId,
        key: Key,
        to: NodeId,
        age: Age,
        n: u64,
    },
    /// Owner to requester: the record, data and ownership.
    Granted {
        table: TableId,
        key: Key,
        n: u64,
        row: Shipped,
    },
    /// Owner (`n`: the transfer it refused) or partitioner (`None`: it started none) to
    /// requester: wait-die refused the transaction.
    Refused {
        table: TableId,
        key: Key,
        n: Option<u64>,
    },
    /// Requester to partitioner: transfer `n` ended, and the requester owns the record
    /// (`owned`) or not (the owner refused).
    Inform {
        table: TableId,
        key: Key,
        n: u64,
        owned: bool,
    },
    /// Partitioner to the old owner, with a data directory: transfer `n` ended, and the
    /// owner table's change is noted; the backup of the record shipped may go.
    Ended { table: TableId, key: Key, n: u64 },
}

/// A record on its way to its new owner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Shipped {
    /// The row, with its version (its history goes on at the new owner).
    Row { bytes: Vec<u8>, version: Version },
    /// The key has no row; a read of it observes `grave` (the delete that removed it).
    Absent { grave: Version },
}

impl Shipped {
    /// The same record as a restart puts it back: the history of a start begins with the
    /// state recovered (like every row put back, it is at the initial version).
    pub fn restarted(self) -> Self {
        let initial = RowVersion::INITIAL.into();
        match self {
            Shipped::Row { bytes, .. } => Shipped::Row {
                bytes,
                version: initial,
            },
            Shipped::Absent { .. } => Shipped::Absent { grave: initial },
        }
    }

    /// Bytes of row data it carries.
    pub fn data_len(&self) -> usize {
        match self {
            Shipped::Row { bytes, .. } => bytes.len(),
            Shipped::Absent { .. } => 0,
        }
    }
}

/// A [`RowVersion`] on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Version {
    writer: u64,
    seq: u16,
    dead: bool,
}

impl From<RowVersion> for Version {
    fn from(v: RowVersion) -> Self {
        Version {
            writer: v.writer.0,
            seq: v.seq,
            dead: v.dead,
        }
    }
}

impl From<Version> for RowVersion {
    fn from(v: Version) -> Self {
        RowVersion {
            writer: TxnId(v.writer.min(RowVersion::MAX_WRITER)),
            seq: v.seq.min(RowVersion::MAX_SEQ),
            dead: v.dead,
        }
    }
}
