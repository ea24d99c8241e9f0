//! List append, as in Jepsen's Elle: every key holds a list of integers; a transaction is a
//! few micro-operations, each appending a value to a key's list or reading a whole list.
//! Because appended values are unique per key and lists keep their order, an Elle-style
//! checker (such as the `adya` crate) can recover from the reads the version order of every
//! key and so the write-write, write-read and read-write dependencies between transactions,
//! and find serializability anomalies without trusting the database. [`Workload::elle_ops`]
//! turns calls and their outputs into those micro-operations.
//!
//! # Key choice
//!
//! Keys rotate as in Elle: a client's `n`-th transaction draws its keys from a window of
//! `active_keys` consecutive key indices starting at `(n / 2) mod keys_per_partition` in each
//! partition it touches. Clients that advance at similar rates therefore share a small set of
//! hot keys and conflict often, while each key is only live for about `2 * active_keys`
//! transactions per client, so lists retire long before they fill (unless many clients share
//! a partition or the window wraps around `keys_per_partition`). A transaction never touches
//! a key twice.
//!
//! # Values
//!
//! The value of an append is `(client << 32) | c`, where `c` counts the client's appends from
//! 1: unique across the run without coordination (for fewer than 2^32 appends per client).
//! A retried attempt resubmits the same call, so a value is appended at most once.
//!
//! Row layout (`8 + 8 * max_list_len` bytes): a little-endian u64 count, then the values as
//! little-endian u64s.

use crate::{ElleOp, ScanFn, Tally, TxnCall, TxnGenerator, Workload};
use qstore_core::config::AppendConfig;
use qstore_core::partition::PartitionMap;
use qstore_core::rng::Rng;
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, LogicAbort, ProcCall, ProcId, Procedure, Program,
    RowLoader, RowRef, StepId, TableSchema, Value,
};
use qstore_core::{ConfigError, Key, PartitionId, QError, RunConfig, TableId};
use rand::Rng as _;
use std::sync::Arc;

/// The only table.
pub const LISTS: TableId = 0;

/// Argument code of a whole-list read in an `append_txn` call.
pub const OP_READ: i64 = 0;
/// Argument code of an append in an `append_txn` call.
pub const OP_APPEND: i64 = 1;

pub struct Append {
    cfg: AppendConfig,
    seed: u64,
    partitions: u32,
    pmap: PartitionMap,
    catalog: Arc<Catalog>,
    proc: ProcId,
}

impl Append {
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = run.workload.append.clone();
        let partitions = run.cluster.nodes;
        cfg.validate(partitions)?;
        let mut catalog = Catalog::default();
        catalog.add_table(TableSchema {
            name: "lists".into(),
            row_size: cfg.row_size(),
            capacity_per_partition: cfg.keys_per_partition as usize,
            keys_per_partition: cfg.keys_per_partition,
            read_mostly: false,
        });
        let read = catalog.steps.register("append_read", append_read);
        let push = catalog.steps.register("append_push", append_push);
        let proc = catalog.add_procedure(Arc::new(AppendTxn { read, push }));
        Ok(Append {
            pmap: PartitionMap::new(partitions, run.cluster.partitioning, &catalog.tables),
            catalog: Arc::new(catalog),
            cfg,
            seed: run.seed,
            partitions,
            proc,
        })
    }
}

impl Workload for Append {
    fn name(&self) -> &'static str {
        "append"
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }

    fn partition_map(&self) -> &PartitionMap {
        &self.pmap
    }

    fn load(&self, partition: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError> {
        let count = self.cfg.keys_per_partition;
        crate::load_dense(
            loader,
            &self.pmap,
            LISTS,
            partition,
            count,
            &mut |_, row| row.fill(0),
        )
    }

    fn generator(&self, client: u32, home: PartitionId) -> Box<dyn TxnGenerator> {
        Box::new(AppendGenerator {
            rng: qstore_core::rng::stream(self.seed, client as u64),
            client,
            home,
            cfg: self.cfg.clone(),
            partitions: self.partitions,
            pmap: self.pmap.clone(),
            proc: self.proc,
            txns: 0,
            appends: 0,
            parts: Vec::new(),
            chosen: Vec::with_capacity(self.cfg.ops_per_txn as usize),
        })
    }

    fn elle_ops(&self, call: &ProcCall, outputs: Option<&[Value]>) -> Option<Vec<ElleOp>> {
        if call.proc != self.proc {
            return None;
        }
        let ops = parse_ops(&call.args).ok()?;
        ops.iter()
            .enumerate()
            .map(|(i, op)| match op.append {
                Some(value) => Some(ElleOp::Append { key: op.key, value }),
                None => {
                    let list = match outputs {
                        None => None,
                        Some(outs) => Some(decode_list(outs.get(i)?)?),
                    };
                    Some(ElleOp::Read { key: op.key, list })
                }
            })
            .collect()
    }

    fn tally(&self, scan: &mut ScanFn<'_>) -> Option<Tally> {
        let cap = self.cfg.max_list_len as usize;
        let mut t = Tally::default();
        scan(LISTS, &mut |key, row| {
            t.add("lists", 1);
            let count = u64::from_le_bytes(row[..8].try_into().expect("rows have a count"));
            if count > cap as u64 {
                t.problem(|| format!("list {key} has count {count} > {cap}"));
                return;
            }
            let mut values = list_values(row).collect::<Vec<_>>();
            t.add("non-empty", (count > 0) as i128);
            t.add("elements", count as i128);
            values.sort_unstable();
            if let Some(w) = values.windows(2).find(|w| w[0] == w[1]) {
                t.problem(|| format!("list {key} holds value {} twice", w[0]));
            }
        });
        Some(t)
    }

    fn check_tally(&self, t: &Tally) -> Result<String, String> {
        if let Some(problems) = t.problems_line() {
            return Err(format!("append: {problems}"));
        }
        Ok(format!(
            "append: {} lists, {} non-empty, {} elements, no value twice in a list",
            t.count("lists"),
            t.count("non-empty"),
            t.count("elements")
        ))
    }
}

struct AppendGenerator {
    rng: Rng,
    client: u32,
    home: PartitionId,
    cfg: AppendConfig,
    partitions: u32,
    pmap: PartitionMap,
    proc: ProcId,
    /// Transactions generated so far: positions the key window.
    txns: u64,
    /// Appends generated so far: numbers the values.
    appends: u64,
    parts: Vec<PartitionId>,
    /// (partition, window offset) pairs of the current transaction.
    chosen: Vec<(PartitionId, u64)>,
}

impl AppendGenerator {
    /// The partitions of the next transaction: the home partition, plus distinct others for
    /// a multi-partition transaction.
    fn choose_partitions(&mut self) {
        self.parts.clear();
        self.parts.push(self.home);
        let mp = self.cfg.multi_partition_fraction > 0.0
            && self.rng.random::<f64>() < self.cfg.multi_partition_fraction;
        if !mp {
            return;
        }
        let want = self.cfg.partitions_per_mp_txn.min(self.partitions) as usize;
        while self.parts.len() < want {
            let p = PartitionId(self.rng.random_range(0..self.partitions));
            if !self.parts.contains(&p) {
                self.parts.push(p);
            }
        }
    }

    /// A key of partition `p` in the window starting at key index `start`, not yet chosen in
    /// this transaction. Validation guarantees the window holds enough keys.
    fn choose_key(&mut self, p: PartitionId, start: u64) -> Key {
        loop {
            let offset = self.rng.random_range(0..self.cfg.active_keys as u64);
            if !self.chosen.contains(&(p, offset)) {
                self.chosen.push((p, offset));
                let index = (start + offset) % self.cfg.keys_per_partition;
                return self.pmap.nth_key_of(LISTS, p, index);
            }
        }
    }

    /// The next value this client appends.
    fn next_value(&mut self) -> i64 {
        self.appends += 1;
        (((self.client as u64) << 32) | self.appends) as i64
    }
}

impl TxnGenerator for AppendGenerator {
    fn next_txn(&mut self) -> TxnCall {
        self.choose_partitions();
        self.chosen.clear();
        let start = (self.txns / 2) % self.cfg.keys_per_partition;
        self.txns += 1;
        let ops = self.cfg.ops_per_txn;
        let mut args = Vec::with_capacity(3 * ops as usize);
        for i in 0..ops as usize {
            // Spread micro-operations evenly over the transaction's partitions.
            let key = self.choose_key(self.parts[i % self.parts.len()], start);
            let read = self.rng.random::<f64>() < self.cfg.read_fraction;
            let (op, value) = if read {
                (OP_READ, 0)
            } else {
                (OP_APPEND, self.next_value())
            };
            args.extend([Value::Int(key as i64), Value::Int(op), Value::Int(value)]);
        }
        TxnCall {
            call: ProcCall {
                proc: self.proc,
                args,
            },
            ops,
        }
    }
}

/// One micro-operation of an `append_txn` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MicroOp {
    key: Key,
    /// The value appended, or `None` for a read.
    append: Option<u64>,
}

/// Parses `(key, op, value)` triples: integers, keys and values >= 0, no key twice.
fn parse_ops(args: &[Value]) -> Result<Vec<MicroOp>, String> {
    if !args.len().is_multiple_of(3) {
        return Err(format!(
            "expected (key, op, value) triples, got {} values",
            args.len()
        ));
    }
    let ops = args
        .chunks_exact(3)
        .map(|t| parse_op(&t[0], &t[1], &t[2]))
        .collect::<Result<Vec<_>, _>>()?;
    let mut keys: Vec<Key> = ops.iter().map(|o| o.key).collect();
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("key {} appears twice", w[0]));
    }
    Ok(ops)
}

fn parse_op(key: &Value, op: &Value, value: &Value) -> Result<MicroOp, String> {
    let (Some(key), Some(op), Some(value)) = (key.as_int(), op.as_int(), value.as_int()) else {
        return Err("keys, ops and values must be integers".into());
    };
    if key < 0 || value < 0 {
        return Err(format!(
            "keys and values must be >= 0, got key {key} value {value}"
        ));
    }
    let append = match op {
        OP_READ => None,
        OP_APPEND => Some(value as u64),
        other => return Err(format!("op must be 0 (read) or 1 (append), got {other}")),
    };
    Ok(MicroOp {
        key: key as Key,
        append,
    })
}

/// `append_txn(key0, op0, value0, key1, op1, value1, ...)`: reads the whole list (op 0,
/// value ignored) or appends the value (op 1) of each key, in order.
struct AppendTxn {
    read: StepId,
    push: StepId,
}

impl Procedure for AppendTxn {
    fn name(&self) -> &'static str {
        "append_txn"
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let accesses = parse_ops(args)?
            .into_iter()
            .map(|op| {
                let (kind, step, arg) = match op.append {
                    None => (AccessKind::Read, self.read, Value::Null),
                    Some(v) => (AccessKind::ReadModifyWrite, self.push, Value::Int(v as i64)),
                };
                Access {
                    table: LISTS,
                    key: op.key,
                    kind,
                    step,
                    arg,
                    deps: Vec::new(),
                    may_abort: op.append.is_some(),
                    key_dep: None,
                }
            })
            .collect();
        Ok(Program { accesses })
    }
}

/// The values a list read returned (`Value::Bytes` of little-endian u64s), or `None` if the
/// output is not such a list.
pub fn decode_list(v: &Value) -> Option<Vec<u64>> {
    let Value::Bytes(b) = v else {
        return None;
    };
    if !b.len().is_multiple_of(8) {
        return None;
    }
    Some(
        b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks")))
            .collect(),
    )
}

/// Values a row can hold.
#[inline]
fn capacity(row: &[u8]) -> usize {
    row.len().saturating_sub(8) / 8
}

/// The list's length, trusting the stored count only up to the row's capacity.
#[inline]
fn list_len(row: &[u8]) -> usize {
    let count = u64::from_le_bytes(row[..8].try_into().expect("rows have a count"));
    count.min(capacity(row) as u64) as usize
}

fn list_values(row: &[u8]) -> impl Iterator<Item = u64> + '_ {
    row[8..8 + 8 * list_len(row)]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunks")))
}

/// Reads a whole list: returns its values as little-endian u64 bytes.
fn append_read(row: RowRef<'_>, _arg: &Value, _inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = row.bytes();
    Ok(Value::Bytes(row[8..8 + 8 * list_len(row)].to_vec()))
}

/// Appends the argument to the list; a full list is a logic abort (row untouched).
fn append_push(row: RowRef<'_>, arg: &Value, _inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(row) = row else {
        return Err(LogicAbort("append_push needs a writable row"));
    };
    let Some(value) = arg.as_int() else {
        return Err(LogicAbort("append_push needs an integer value"));
    };
    let n = list_len(row);
    if n >= capacity(row) {
        return Err(LogicAbort("list full"));
    }
    row[8 + 8 * n..16 + 8 * n].copy_from_slice(&(value as u64).to_le_bytes());
    row[..8].copy_from_slice(&(n as u64 + 1).to_le_bytes());
    Ok(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemStore;
    use qstore_core::config::Partitioning;
    use std::collections::{BTreeSet, HashMap};

    fn config(nodes: u32, mp: f64) -> RunConfig {
        let mut c = RunConfig::default();
        c.workload.name = "append".into();
        c.cluster.nodes = nodes;
        c.workload.append.keys_per_partition = 1000;
        c.workload.append.multi_partition_fraction = mp;
        c
    }

    fn append(c: &RunConfig) -> Append {
        Append::new(c).unwrap()
    }

    fn ops_of(t: &TxnCall) -> Vec<MicroOp> {
        parse_ops(&t.call.args).unwrap()
    }

    /// The key index of `key` within its partition, for both partitioning schemes.
    fn index_of(a: &Append, key: Key) -> u64 {
        let p = a.pmap.partition_of(LISTS, key);
        (0..a.cfg.keys_per_partition)
            .find(|&i| a.pmap.nth_key_of(LISTS, p, i) == key)
            .unwrap()
    }

    #[test]
    fn same_seed_same_stream() {
        let a = append(&config(4, 0.5));
        let first: Vec<_> = {
            let mut g = a.generator(3, PartitionId(1));
            (0..200).map(|_| g.next_txn()).collect()
        };
        let mut g = a.generator(3, PartitionId(1));
        assert!(first.iter().all(|t| *t == g.next_txn()));
    }

    #[test]
    fn txns_touch_distinct_keys_and_respect_the_mp_fraction() {
        for scheme in [Partitioning::Range, Partitioning::Hash] {
            let mut c = config(4, 0.3);
            c.cluster.partitioning = scheme;
            c.workload.append.ops_per_txn = 16;
            let a = append(&c);
            let mut g = a.generator(0, PartitionId(2));
            let mut multi = 0;
            for _ in 0..3000 {
                let t = g.next_txn();
                let ops = ops_of(&t);
                assert_eq!((ops.len(), t.ops), (16, 16));
                let parts: BTreeSet<_> = ops
                    .iter()
                    .map(|o| a.pmap.partition_of(LISTS, o.key).0)
                    .collect();
                assert!(parts.contains(&2));
                assert!(parts.len() == 1 || parts.len() == 2, "{parts:?}");
                multi += (parts.len() == 2) as u32;
            }
            assert!((810..990).contains(&multi), "{scheme:?}: {multi}");
        }
        let a = append(&config(4, 0.0));
        let mut g = a.generator(0, PartitionId(3));
        for _ in 0..500 {
            let ops = ops_of(&g.next_txn());
            assert!(ops
                .iter()
                .all(|o| a.pmap.partition_of(LISTS, o.key) == PartitionId(3)));
        }
    }

    #[test]
    fn read_fraction_is_respected() {
        let mut c = config(2, 0.5);
        c.workload.append.read_fraction = 0.25;
        let a = append(&c);
        let mut g = a.generator(1, PartitionId(0));
        let reads: usize = (0..1000)
            .map(|_| {
                ops_of(&g.next_txn())
                    .iter()
                    .filter(|o| o.append.is_none())
                    .count()
            })
            .sum();
        assert!((900..1100).contains(&reads), "{reads}");
    }

    #[test]
    fn append_values_are_unique_across_clients() {
        let a = append(&config(4, 0.5));
        let mut seen = BTreeSet::new();
        for client in 0..6 {
            let mut g = a.generator(client, PartitionId(client % 4));
            let mut mine = Vec::new();
            for _ in 0..1000 {
                mine.extend(ops_of(&g.next_txn()).iter().filter_map(|o| o.append));
            }
            assert_eq!(mine[0], ((client as u64) << 32) | 1);
            assert!(mine.windows(2).all(|w| w[1] == w[0] + 1));
            for v in mine {
                assert!(seen.insert(v), "value {v:#x} twice");
            }
        }
        assert!(seen.len() > 10_000);
    }

    #[test]
    fn key_window_rotates() {
        let mut c = config(1, 0.0);
        c.workload.append.keys_per_partition = 100;
        c.cluster.partitioning = Partitioning::Hash;
        let a = append(&c);
        let mut g = a.generator(0, PartitionId(0));
        let mut early = BTreeSet::new();
        let mut late = BTreeSet::new();
        for n in 0..300u64 {
            let start = (n / 2) % 100;
            for op in ops_of(&g.next_txn()) {
                let i = index_of(&a, op.key);
                assert!(
                    (i + 100 - start) % 100 < 16,
                    "txn {n}: index {i}, start {start}"
                );
                if n < 10 {
                    early.insert(i);
                } else if (100..110).contains(&n) {
                    late.insert(i);
                }
            }
        }
        assert!(early.iter().all(|&i| i < 21) && late.iter().all(|&i| (50..71).contains(&i)));
        // Clients at the same position share the window.
        let mut other = a.generator(9, PartitionId(0));
        let keys = ops_of(&other.next_txn());
        assert!(keys.iter().all(|o| index_of(&a, o.key) < 16));
    }

    fn push(row: &mut [u8], v: i64) -> Result<Value, LogicAbort> {
        append_push(RowRef::Write(row), &Value::Int(v), Inputs::new(&[], &[]))
    }

    fn read(row: &[u8]) -> Vec<u64> {
        let out = append_read(RowRef::Read(row), &Value::Null, Inputs::new(&[], &[])).unwrap();
        decode_list(&out).unwrap()
    }

    #[test]
    fn push_fills_the_list_then_aborts_without_changing_it() {
        let mut row = vec![0u8; 8 + 8 * 3];
        assert_eq!(read(&row), Vec::<u64>::new());
        for v in [7, 8, 9] {
            assert_eq!(push(&mut row, v), Ok(Value::Null));
        }
        let full = row.clone();
        assert_eq!(push(&mut row, 10), Err(LogicAbort("list full")));
        assert_eq!(row, full);
        assert_eq!(read(&row), vec![7, 8, 9]);
        assert!(append_push(RowRef::Read(&row), &Value::Int(1), Inputs::new(&[], &[])).is_err());
        row[..8].copy_from_slice(&u64::MAX.to_le_bytes()); // a corrupt count does not panic
        assert_eq!(read(&row), vec![7, 8, 9]);
    }

    #[test]
    fn elle_ops_round_trip_args_and_outputs() {
        let a = append(&config(1, 0.0));
        let i = Value::Int;
        let call = ProcCall {
            proc: a.proc,
            args: vec![
                i(5),
                i(OP_APPEND),
                i(77),
                i(6),
                i(OP_READ),
                i(0),
                i(8),
                i(OP_READ),
                i(0),
            ],
        };
        let list: Vec<u8> = [3u64, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let outs = [Value::Null, Value::Bytes(list), Value::Bytes(vec![])];
        assert_eq!(
            a.elle_ops(&call, Some(&outs)).unwrap(),
            vec![
                ElleOp::Append { key: 5, value: 77 },
                ElleOp::Read {
                    key: 6,
                    list: Some(vec![3, 4])
                },
                ElleOp::Read {
                    key: 8,
                    list: Some(vec![])
                },
            ]
        );
        let invoked = a.elle_ops(&call, None).unwrap();
        assert_eq!(invoked[1], ElleOp::Read { key: 6, list: None });
        assert_eq!(a.elle_ops(&call, Some(&outs[..2])), None);
        assert_eq!(
            a.elle_ops(&call, Some(&[Value::Null, i(3), Value::Null])),
            None
        );
        let other = ProcCall {
            proc: ProcId(9),
            args: call.args.clone(),
        };
        assert_eq!(a.elle_ops(&other, None), None);
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let a = append(&config(1, 0.0));
        let i = Value::Int;
        for args in [
            vec![i(1)],
            vec![i(1), i(1)],
            vec![i(1), i(1), i(2), i(3)],
            vec![i(1), i(7), i(2)],
            vec![Value::Bytes(vec![1]), i(0), i(0)],
            vec![i(1), Value::Null, i(0)],
            vec![i(1), i(1), Value::Bytes(vec![])],
            vec![i(-1), i(0), i(0)],
            vec![i(1), i(1), i(-5)],
            vec![i(1), i(1), i(2), i(1), i(0), i(0)],
        ] {
            let call = ProcCall { proc: a.proc, args };
            assert!(a.catalog.program(&call).is_err(), "{call:?}");
            assert_eq!(a.elle_ops(&call, None), None);
        }
        // Well-formed, but with nothing to do: every protocol refuses it.
        let empty = ProcCall {
            proc: a.proc,
            args: vec![],
        };
        let err = a.catalog.program(&empty).unwrap_err().to_string();
        assert!(err.contains("no record accesses"), "{err}");
    }

    #[test]
    fn serial_execution_reads_every_committed_append_in_order() {
        let mut c = config(2, 0.5);
        c.workload.append.keys_per_partition = 40;
        let a = append(&c);
        let mut db = MemStore::loaded(&a, 0..2);
        let mut model: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut gens: Vec<_> = (0..8).map(|i| a.generator(i, PartitionId(i % 2))).collect();
        let (mut full, mut reads) = (0, 0);
        for round in 0..4000 {
            let t = gens[round % 8].next_txn();
            let Some(outs) = db.execute(&a.catalog, &t.call) else {
                full += 1;
                continue;
            };
            for op in a.elle_ops(&t.call, Some(&outs)).unwrap() {
                match op {
                    ElleOp::Append { key, value } => model.entry(key).or_default().push(value),
                    ElleOp::Read { key, list } => {
                        reads += 1;
                        assert_eq!(list.unwrap(), model.get(&key).cloned().unwrap_or_default());
                    }
                }
            }
        }
        assert!(
            full > 0 && reads > 1000,
            "{full} full-list aborts, {reads} reads"
        );
        let summary = db.check_final(&a).unwrap().unwrap();
        assert!(summary.starts_with("append: 80 lists"), "{summary}");
        let (key, _) = db.rows(LISTS).find(|(_, r)| list_len(r) >= 2).unwrap();
        let row = db.get_mut(LISTS, key);
        let first = row[8..16].to_vec();
        row[16..24].copy_from_slice(&first);
        assert!(db.check_final(&a).unwrap_err().contains("twice"));
    }
}
