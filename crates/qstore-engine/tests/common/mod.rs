//! What the engine's cluster tests share: one table of 8-byte counters, `KEYS` rows per
//! partition, where key k starts at k.

use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, LogicAbort, Procedure, Program, RowLoader, RowRef, StepId,
    TableSchema, Value,
};
use qstore_core::{PartitionId, QError};

pub const KEYS: u64 = 64;

pub fn counter(row: &[u8]) -> i64 {
    i64::from_le_bytes(row[..8].try_into().unwrap())
}

/// Step: outputs the row's counter.
pub fn read(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(counter(row.bytes())))
}

/// A catalog with the counter table (table 0) and no procedures yet.
pub fn counter_catalog() -> Catalog {
    let mut c = Catalog::default();
    c.add_table(TableSchema {
        name: "t".into(),
        row_size: 8,
        capacity_per_partition: KEYS as usize,
        keys_per_partition: KEYS,
        read_mostly: false,
    });
    c
}

/// Loads partition `p` of the counter table (range partitioning): key k holds k.
#[allow(dead_code)]
pub fn load_counters(p: PartitionId, l: &mut dyn RowLoader) -> Result<(), QError> {
    let mut keys = (0..KEYS).map(|i| p.0 as u64 * KEYS + i);
    l.load_rows(0, &mut keys, &mut |k, row| {
        row.copy_from_slice(&(k as i64).to_le_bytes())
    })
}

// Not every test binary that includes this module uses every helper below.

/// Step: adds the argument, or the first input when the argument is Null.
#[allow(dead_code)]
pub fn add(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(bytes) = row else {
        unreachable!("add is a read-modify-write")
    };
    let n = arg.as_int().or(inputs.get(0).as_int()).unwrap_or(0) + counter(bytes);
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    Ok(Value::Int(n))
}

/// Step: subtracts the argument unless that would go below zero (an integrity check).
#[allow(dead_code)]
pub fn take(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(bytes) = row else {
        unreachable!("take is a read-modify-write")
    };
    let n = counter(bytes) - arg.as_int().unwrap_or(0);
    if n < 0 {
        return Err(LogicAbort("insufficient funds"));
    }
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    Ok(Value::Int(n))
}

/// Procedure argument `i` as an integer.
#[allow(dead_code)]
pub fn int(args: &[Value], i: usize) -> Result<i64, String> {
    args.get(i)
        .and_then(Value::as_int)
        .ok_or_else(|| format!("argument {i} must be an integer"))
}

/// An access to key `key` of the counter table that cannot abort.
#[allow(dead_code)]
pub fn access(key: i64, kind: AccessKind, step: StepId, arg: Value, deps: Vec<u16>) -> Access {
    Access::plain(0, key as u64, kind, step, arg, deps)
}

/// `pay(src, dst, amount)`: credits dst, then debits src if it has enough.
#[allow(dead_code)] // used by some of the test binaries that share this module
pub struct Pay {
    pub add: StepId,
    pub take: StepId,
}

impl Procedure for Pay {
    fn name(&self) -> &'static str {
        "pay"
    }
    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let amount = Value::Int(int(args, 2)?);
        let rmw = AccessKind::ReadModifyWrite;
        let mut debit = access(int(args, 0)?, rmw, self.take, amount.clone(), vec![]);
        debit.may_abort = true;
        Ok(Program {
            accesses: vec![access(int(args, 1)?, rmw, self.add, amount, vec![]), debit],
        })
    }
}

/// A client of an embedded cluster: calls procedures by name and takes the answers, every
/// attempt under a fresh id.
#[allow(dead_code)] // used by some of the test binaries that share this module
pub struct TestClient {
    pub cluster: qstore_engine::Cluster,
    catalog: std::sync::Arc<Catalog>,
    tx: crossbeam_channel::Sender<qstore_core::txn::TxnResponse>,
    pub rx: crossbeam_channel::Receiver<qstore_core::txn::TxnResponse>,
    next_id: u64,
}

#[allow(dead_code)]
impl TestClient {
    /// Starts an embedded cluster of `cfg` over `catalog`'s tables, range-partitioned over
    /// its nodes and loaded by `load`.
    pub fn start(
        cfg: qstore_core::RunConfig,
        catalog: Catalog,
        load: &qstore_engine::cluster::LoadFn<'_>,
    ) -> Result<TestClient, QError> {
        use qstore_core::config::Partitioning;
        let catalog = std::sync::Arc::new(catalog);
        let pmap = qstore_core::partition::PartitionMap::new(
            cfg.cluster.nodes,
            Partitioning::Range,
            &catalog.tables,
        );
        let cluster = qstore_engine::Cluster::start(cfg, catalog.clone(), pmap, load, false)?;
        let (tx, rx) = crossbeam_channel::unbounded();
        Ok(TestClient {
            cluster,
            catalog,
            tx,
            rx,
            next_id: 0,
        })
    }

    /// A call of procedure `name` with integer arguments.
    pub fn call(&self, name: &str, args: &[i64]) -> std::sync::Arc<qstore_core::txn::ProcCall> {
        std::sync::Arc::new(qstore_core::txn::ProcCall {
            proc: self.catalog.procedure_id(name).unwrap(),
            args: args.iter().map(|&a| Value::Int(a)).collect(),
        })
    }

    /// Submits an attempt of `call` at node `home` (born at `birth_us`, if given); returns
    /// its id.
    pub fn submit(
        &mut self,
        home: u32,
        call: &std::sync::Arc<qstore_core::txn::ProcCall>,
        birth_us: Option<u64>,
    ) -> qstore_core::TxnId {
        self.next_id += 1;
        let id = qstore_core::TxnId(self.next_id);
        let mut req = qstore_engine::TxnRequest::new(id, call.clone(), self.tx.clone());
        if let Some(b) = birth_us {
            req.birth_us = b;
        }
        self.cluster.submit(qstore_core::NodeId(home), req);
        id
    }

    /// The next answer, whichever attempt it is for, or `None` after `timeout`.
    pub fn answer(&self, timeout: std::time::Duration) -> Option<qstore_core::txn::TxnResponse> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Runs a call of `name` at `home` to its final outcome, retrying concurrency-control
    /// aborts (panicking after `retries` of them); `None` if an attempt went unanswered for
    /// `timeout`. Answers to earlier attempts are passed over.
    pub fn run(
        &mut self,
        (home, name, args): (u32, &str, &[i64]),
        timeout: std::time::Duration,
        retries: usize,
    ) -> Option<qstore_core::txn::TxnOutcome> {
        use qstore_core::txn::TxnOutcome;
        let call = self.call(name, args);
        for _ in 0..retries {
            let id = self.submit(home, &call, None);
            let answer = loop {
                let a = self.answer(timeout)?;
                if a.id == id {
                    break a;
                }
            };
            match answer.outcome {
                TxnOutcome::CcAbort(_) => continue,
                other => return Some(other),
            }
        }
        panic!("{name}{args:?}: aborted {retries} times by concurrency control");
    }
}
