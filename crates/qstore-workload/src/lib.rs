//! Workloads: each defines its tables, stored procedures and step functions (a [`Catalog`]),
//! how to load a partition's initial rows, and a per-client stream of procedure calls.
//!
//! Workloads depend on `qstore-core` only; they never see storage or protocols.

pub mod ycsb;
pub mod zipf;

use qstore_core::partition::PartitionMap;
use qstore_core::txn::{Catalog, ProcCall, RowLoader};
use qstore_core::{ConfigError, PartitionId, QError, RunConfig};
use std::sync::Arc;

/// Names accepted by `--workload`.
pub const WORKLOADS: &[&str] = &["ycsb"];

/// One procedure call to submit, with the number of record operations it performs (for
/// operations/s).
#[derive(Clone, Debug, PartialEq)]
pub struct TxnCall {
    pub call: ProcCall,
    pub ops: u32,
}

/// A per-client stream of transactions. Deterministic for a given seed and client.
pub trait TxnGenerator: Send {
    fn next_txn(&mut self) -> TxnCall;
}

/// A workload.
pub trait Workload: Send + Sync {
    fn name(&self) -> &'static str;
    /// Tables, steps and procedures; identical on every node.
    fn catalog(&self) -> Arc<Catalog>;
    /// Loads the initial rows of `partition`.
    fn load(&self, partition: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError>;
    /// The transaction stream of client `client`, whose home partition is `home`.
    fn generator(&self, client: u32, home: PartitionId) -> Box<dyn TxnGenerator>;
    /// The partition map this workload's keys were laid out for.
    fn partition_map(&self) -> &PartitionMap;
}

/// Builds the workload named in `cfg.workload.name`.
pub fn build(cfg: &RunConfig) -> Result<Arc<dyn Workload>, ConfigError> {
    match cfg.workload.name.as_str() {
        "ycsb" => Ok(Arc::new(ycsb::Ycsb::new(cfg)?)),
        other => Err(ConfigError::new(
            "workload.name",
            other,
            format!("unknown workload; choose one of: {}", WORKLOADS.join(", ")),
        )),
    }
}
