//! Workloads: each defines its tables, stored procedures and step functions (a [`Catalog`]),
//! how to load a partition's initial rows, and a per-client stream of procedure calls.
//!
//! Workloads depend on `qstore-core` only; they never see storage or protocols.

pub mod append;
pub mod bank;
pub mod kv;
pub mod micro;
#[cfg(test)]
mod testing;
pub mod tpcc;
pub mod ycsb;
pub mod zipf;

use qstore_core::partition::PartitionMap;
use qstore_core::txn::{Catalog, ProcCall, RowLoader, Value};
use qstore_core::{ConfigError, Key, PartitionId, QError, RunConfig, TableId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Names accepted by `--workload`.
pub const WORKLOADS: &[&str] = &["ycsb", "micro", "bank", "append", "tpcc", "kv"];

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

    /// The next transaction, built in the memory of `old`, a finished call of this
    /// generator, where the workload can (the load generator recycles calls so the next one
    /// is written where the last one was, still in the cache). Same stream as `next_txn`.
    fn next_txn_reusing(&mut self, old: ProcCall) -> TxnCall {
        drop(old);
        self.next_txn()
    }
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

    /// OLLP (optimistic lock location prediction): whether `call` is the reconnaissance of a
    /// transaction whose keys depend on data. Its generator issues the reconnaissance, a
    /// read-only call that reads those keys; the client then runs
    /// [`Workload::after_reconnaissance`] with its answer, and restarts from a fresh
    /// reconnaissance when that fails with [`qstore_core::txn::OLLP_RESTART`].
    fn is_reconnaissance(&self, _call: &ProcCall) -> bool {
        false
    }

    /// The transaction to run after reconnaissance `recon` committed with `outputs`: its keys
    /// are the guess, which it checks when it runs.
    fn after_reconnaissance(
        &self,
        recon: &ProcCall,
        _outputs: &[Value],
    ) -> Result<ProcCall, String> {
        Err(format!("procedure #{} has no reconnaissance", recon.proc.0))
    }

    /// Transactions the workload needs run beside its clients at a steady rate, outside
    /// every measurement (the microbenchmark's index updater): their rate over the whole
    /// cluster, per second (0: none).
    fn background_rate(&self) -> f64 {
        0.0
    }

    /// The stream of background transactions of partition `home` (see
    /// [`Workload::background_rate`]); `None` when the workload has none.
    fn background(&self, _home: PartitionId) -> Option<Box<dyn TxnGenerator>> {
        None
    }

    /// Checks the answer of a committed call against the workload's invariants (e.g. the sum
    /// a bank audit read). Called by the client for every commit.
    fn check_commit(&self, _call: &ProcCall, _outputs: &[Value]) -> Result<(), String> {
        Ok(())
    }

    /// What the final-state check finds in the rows `scan` visits (`scan(table, f)` calls
    /// `f(key, row)` for every row of `table`): counters and problems that add up across
    /// partitions, so that each server can tally its own partition and the client merges
    /// them. `None` if the workload has no final invariant.
    fn tally(&self, _scan: &mut ScanFn<'_>) -> Option<Tally> {
        None
    }

    /// Judges the whole database from its tally (every partition's, merged): a one-line
    /// summary of what was checked, or what is wrong.
    fn check_tally(&self, _tally: &Tally) -> Result<String, String> {
        Ok(String::new())
    }

    /// Checks the final database state after a run, over every partition `scan` visits.
    fn check_final(&self, scan: &mut ScanFn<'_>) -> Result<Option<String>, String> {
        self.tally(scan).map(|t| self.check_tally(&t)).transpose()
    }

    /// The call as list-append micro-operations for an Elle-style history (`None` for
    /// workloads that are not list-append). `outputs` is `None` for the invocation and the
    /// committed outputs for the completion, where reads carry the lists they saw.
    fn elle_ops(&self, _call: &ProcCall, _outputs: Option<&[Value]>) -> Option<Vec<ElleOp>> {
        None
    }
}

/// Counters and problems a final-state check found in part of the database; tallies of
/// different partitions merge into the tally of the whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// Named counters, summed across partitions.
    pub counts: BTreeMap<String, i128>,
    /// Problems found, the first few as examples.
    pub problems: Vec<String>,
    pub problem_count: u64,
}

impl Tally {
    /// Problems kept as examples.
    const EXAMPLES: usize = 5;

    pub fn add(&mut self, counter: &str, n: i128) {
        *self.counts.entry(counter.to_string()).or_default() += n;
    }

    pub fn count(&self, counter: &str) -> i128 {
        self.counts.get(counter).copied().unwrap_or(0)
    }

    pub fn problem(&mut self, what: impl FnOnce() -> String) {
        self.problem_count += 1;
        if self.problems.len() < Self::EXAMPLES {
            self.problems.push(what());
        }
    }

    pub fn merge(&mut self, other: &Tally) {
        for (k, v) in &other.counts {
            *self.counts.entry(k.clone()).or_default() += v;
        }
        for p in &other.problems {
            if self.problems.len() < Self::EXAMPLES {
                self.problems.push(p.clone());
            }
        }
        self.problem_count += other.problem_count;
    }

    /// The problems as one line, if there are any.
    pub fn problems_line(&self) -> Option<String> {
        (self.problem_count > 0).then(|| {
            format!(
                "{} problem(s), e.g. {}",
                self.problem_count,
                self.problems.join("; ")
            )
        })
    }
}

/// Visits every row of a table across all partitions: `scan(table, f)` calls `f(key, row)`.
pub type ScanFn<'a> = dyn FnMut(TableId, &mut dyn FnMut(Key, &[u8])) + 'a;

/// One micro-operation of a list-append transaction, as Elle and adya understand them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElleOp {
    /// `["append", key, value]`.
    Append { key: u64, value: u64 },
    /// `["r", key, list]`; `None` before the read is done (invocations), `Some` after.
    Read { key: u64, list: Option<Vec<u64>> },
}

/// Builds the workload named in `cfg.workload.name`.
pub fn build(cfg: &RunConfig) -> Result<Arc<dyn Workload>, ConfigError> {
    match cfg.workload.name.as_str() {
        "ycsb" => Ok(Arc::new(ycsb::Ycsb::new(cfg)?)),
        "micro" => Ok(Arc::new(micro::Micro::new(cfg)?)),
        "bank" => Ok(Arc::new(bank::Bank::new(cfg)?)),
        "append" => Ok(Arc::new(append::Append::new(cfg)?)),
        "tpcc" => Ok(Arc::new(tpcc::Tpcc::new(cfg)?)),
        "kv" => Ok(Arc::new(kv::Kv::new(cfg)?)),
        other => Err(ConfigError::new(
            "workload.name",
            other,
            format!("unknown workload; choose one of: {}", WORKLOADS.join(", ")),
        )),
    }
}

/// Whether workload `name` produces list-append histories (`--history` in the Elle format).
pub fn is_list_append(name: &str) -> bool {
    name == "append"
}

/// Loads rows for the first `count` keys of `table` in `partition` (its keys in key order),
/// filling each with `fill`: the dense layout every workload here loads.
pub fn load_dense(
    loader: &mut dyn RowLoader,
    pmap: &PartitionMap,
    table: TableId,
    partition: PartitionId,
    count: u64,
    fill: &mut dyn FnMut(Key, &mut [u8]),
) -> Result<(), QError> {
    let mut keys = (0..count).map(|i| pmap.nth_key_of(table, partition, i));
    loader.load_rows(table, &mut keys, fill)
}
