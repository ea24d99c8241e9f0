//! Transaction history model and serializability checker.
//!
//! The engine records a [`History`]: every transaction attempt with the
//! versions it read and the records it wrote, plus the order in which
//! committed versions of each record were installed. [`check`] builds Adya's
//! direct serialization graph (DSG) over committed transactions, with
//!
//! - **ww** edges between consecutive installed versions of a record,
//! - **wr** edges from a writer to each reader of its versions,
//! - **rw** anti-dependency edges from a reader to the writer of the next version,
//!
//! and reports the phenomena of Adya's thesis: G0 (write cycles), G1a
//! (aborted reads), G1b (intermediate reads), G1c (circular information flow)
//! and G2 (anti-dependency cycles), plus reads of versions that never existed
//! and inconsistencies of the recorded version order.
//!
//! Histories are stored as JSON lines; see [`History::read_jsonl`],
//! [`History::write_jsonl`] and the streaming [`HistoryWriter`].
//!
//! ```
//! use qstore_check::{check, History, ObjKey, Outcome, TxnRecord, Version};
//!
//! let x = ObjKey::new(0, 42);
//! let txn = |id| TxnRecord {
//!     id,
//!     node: 0,
//!     outcome: Outcome::Committed,
//!     reads: vec![(x, Version::INITIAL)],
//!     writes: vec![(x, 1)],
//! };
//! // Two transactions read the initial x and both overwrite it: a lost update.
//! let history = History { txns: vec![txn(1), txn(2)], version_order: vec![(x, vec![1, 2])] };
//! let report = check(&history);
//! assert!(!report.is_serializable());
//! assert!(report.to_string().contains("lost update on 0:42"));
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod checker;
mod generate;
mod graph;
mod index;
mod jsonl;
mod model;
mod report;

pub use checker::{check, check_with, CheckOptions};
pub use generate::generate_serial_history;
pub use jsonl::{HistoryReader, HistoryWriter, ReadError, Record};
pub use model::{History, ObjKey, Outcome, TxnRecord, Version, INITIAL_WRITER};
pub use report::{Anomaly, AnomalyClass, Edge, EdgeCounts, EdgeKind, Report};
