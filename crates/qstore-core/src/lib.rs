//! Core vocabulary of qstore: identifiers, the run configuration, the transaction model
//! (procedures, programs, accesses and step functions), seeded randomness and errors.
//!
//! Every other crate depends on this one; it depends on no other qstore crate.

pub mod config;
pub mod error;
pub mod ids;
pub mod partition;
pub mod placement;
pub mod rng;
pub mod txn;

pub use config::RunConfig;
pub use error::{ConfigError, QError};
pub use ids::{Key, NodeId, PartitionId, TableId, TxnId, MAX_KEY};
