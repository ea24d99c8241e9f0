//! YCSB-style transactions, as in the Q-Store, Calvin and Sundial evaluations: one table of
//! fixed-size rows, transactions of `ops_per_txn` accesses that are reads or
//! read-modify-writes, keys drawn uniformly or with Zipfian skew inside a partition, and a
//! fraction of multi-partition transactions that spread their accesses over several
//! partitions.
//!
//! Row layout: bytes 0..8 are a little-endian counter that every read-modify-write increments;
//! the rest is payload, rewritten by each write.

use crate::zipf::RankChooser;
use crate::{TxnCall, TxnGenerator, Workload};
use qstore_core::config::YcsbConfig;
use qstore_core::partition::PartitionMap;
use qstore_core::rng::Rng;
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, LogicAbort, ProcCall, ProcId, Procedure, Program,
    RowLoader, RowRef, StepId, TableSchema, Value,
};
use qstore_core::{ConfigError, PartitionId, QError, RunConfig};
use rand::distr::{Bernoulli, Distribution};
use rand::Rng as _;
use std::sync::Arc;

/// The only table.
pub const USERTABLE: u16 = 0;

/// Operation code of a read in a `ycsb_txn` call.
pub const OP_READ: u8 = 0;
/// Operation code of a read-modify-write in a `ycsb_txn` call.
pub const OP_RMW: u8 = 1;
/// Bytes of one access in a `ycsb_txn` call: the key (8, little-endian), then the operation.
pub const ACCESS_BYTES: usize = 9;

/// The one argument of a `ycsb_txn` call of `accesses`, given as (key, operation code).
pub fn ycsb_args(accesses: impl IntoIterator<Item = (u64, u8)>) -> Vec<Value> {
    let mut packed = Vec::new();
    for (key, op) in accesses {
        packed.extend_from_slice(&key.to_le_bytes());
        packed.push(op);
    }
    vec![Value::Bytes(packed)]
}

pub struct Ycsb {
    cfg: YcsbConfig,
    seed: u64,
    partitions: u32,
    pmap: PartitionMap,
    catalog: Arc<Catalog>,
    proc: ProcId,
    ranks: RankChooser,
    /// The keys written, when their skew is not the reads' (`write_theta`).
    write_ranks: Option<RankChooser>,
}

impl Ycsb {
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = run.workload.ycsb.clone();
        let partitions = run.cluster.nodes;
        cfg.validate(partitions)?;
        let schema = TableSchema {
            name: "usertable".into(),
            row_size: cfg.row_size,
            capacity_per_partition: cfg.records_per_partition as usize,
            keys_per_partition: cfg.records_per_partition,
            read_mostly: cfg.read_mostly,
        };
        let mut catalog = Catalog::default();
        catalog.add_table(schema);
        let steps = YcsbSteps {
            read: catalog.steps.register("ycsb_read", ycsb_read),
            rmw: catalog.steps.register("ycsb_rmw", ycsb_rmw),
        };
        let proc = catalog.add_procedure(Arc::new(YcsbTxn { steps }));
        Ok(Ycsb {
            pmap: PartitionMap::new(partitions, run.cluster.partitioning, &catalog.tables),
            ranks: RankChooser::new(cfg.records_per_partition, cfg.theta),
            write_ranks: cfg
                .write_theta
                .map(|theta| RankChooser::new(cfg.records_per_partition, theta)),
            catalog: Arc::new(catalog),
            cfg,
            seed: run.seed,
            partitions,
            proc,
        })
    }
}

impl Workload for Ycsb {
    fn name(&self) -> &'static str {
        "ycsb"
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }

    fn partition_map(&self) -> &PartitionMap {
        &self.pmap
    }

    fn load(&self, partition: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError> {
        let count = self.cfg.records_per_partition;
        crate::load_dense(
            loader,
            &self.pmap,
            USERTABLE,
            partition,
            count,
            &mut |key, row| {
                // Counter 0, payload derived from the key so rows differ.
                row[8..].fill(key as u8);
            },
        )
    }

    fn generator(&self, client: u32, home: PartitionId) -> Box<dyn TxnGenerator> {
        Box::new(YcsbGenerator {
            rng: qstore_core::rng::stream(self.seed, client as u64),
            home,
            cfg: self.cfg.clone(),
            partitions: self.partitions,
            pmap: self.pmap.clone(),
            ranks: self.ranks.clone(),
            write_ranks: self.write_ranks.clone(),
            proc: self.proc,
            chosen: Vec::with_capacity(self.cfg.ops_per_txn as usize),
            writing: Vec::new(),
            parts: Vec::new(),
            // Validation keeps the fraction within [0, 1].
            writes: Bernoulli::new(self.cfg.write_fraction).expect("validated write fraction"),
        })
    }
}

struct YcsbGenerator {
    rng: Rng,
    home: PartitionId,
    cfg: YcsbConfig,
    partitions: u32,
    pmap: PartitionMap,
    ranks: RankChooser,
    write_ranks: Option<RankChooser>,
    proc: ProcId,
    chosen: Vec<u64>,
    /// With `write_ranks`: whether each chosen key is written (drawn before its key).
    writing: Vec<bool>,
    parts: Vec<PartitionId>,
    /// Whether an access writes (an integer comparison, not a float draw per access).
    writes: Bernoulli,
}

impl YcsbGenerator {
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

    /// Chooses the keys of the next transaction into `chosen`: `ops` keys spread evenly over
    /// its partitions, round-robin, none twice (unless duplicates are allowed; configuration
    /// validation guarantees enough distinct keys exist).
    ///
    /// The random generator is copied into a local for the loop and back after it: as a
    /// field behind `&mut self` its state went to memory and back at every draw.
    fn choose_keys(&mut self, ops: usize) {
        let mut rng = self.rng.clone();
        let (parts, chosen) = (&self.parts, &mut self.chosen);
        chosen.clear();
        chosen.reserve(ops);
        self.writing.clear();
        // A counter, not `i % len`: a division per access is a visible share of the
        // generator's time.
        let mut next = 0;
        let remote = self.cfg.remote_access_fraction;
        for _ in 0..ops {
            let mut p = parts[next];
            next = if next + 1 == parts.len() { 0 } else { next + 1 };
            if remote > 0.0 && rng.random::<f64>() < remote {
                // Any partition but the home one, uniformly.
                let other = rng.random_range(1..self.partitions);
                p = PartitionId((self.home.0 + other) % self.partitions);
            }
            let mut ranks = &self.ranks;
            if let Some(write_ranks) = &self.write_ranks {
                let write = self.writes.sample(&mut rng);
                self.writing.push(write);
                if write {
                    ranks = write_ranks;
                }
            }
            loop {
                let key = self.pmap.nth_key_of(USERTABLE, p, ranks.sample(&mut rng));
                if self.cfg.allow_duplicate_keys || !chosen.contains(&key) {
                    chosen.push(key);
                    break;
                }
            }
        }
        self.rng = rng;
    }
}

impl TxnGenerator for YcsbGenerator {
    fn next_txn(&mut self) -> TxnCall {
        self.next_txn_reusing(ProcCall {
            proc: self.proc,
            args: Vec::new(),
        })
    }

    fn next_txn_reusing(&mut self, old: ProcCall) -> TxnCall {
        self.choose_partitions();
        let ops = self.cfg.ops_per_txn;
        self.choose_keys(ops as usize);
        // Then the argument, packed, in the finished call's memory: the load generator shares
        // the machine with the engine, so its cost per transaction is the engine's loss, and
        // a planner on another core reads these bytes (9 per access, where a (key, op) pair
        // of values took 48).
        let mut args = old.args;
        let mut packed = match args.pop() {
            Some(Value::Bytes(b)) => b,
            _ => Vec::new(),
        };
        args.clear();
        // Sized once and filled in place: a push per field would check the capacity each time.
        packed.resize(self.chosen.len() * ACCESS_BYTES, 0);
        let mut rng = self.rng.clone();
        for (i, (access, &key)) in packed
            .chunks_exact_mut(ACCESS_BYTES)
            .zip(&self.chosen)
            .enumerate()
        {
            let write = match self.writing.get(i) {
                Some(&drawn) => drawn,
                None => self.writes.sample(&mut rng),
            };
            access[..8].copy_from_slice(&key.to_le_bytes());
            access[8] = if write { OP_RMW } else { OP_READ };
        }
        self.rng = rng;
        args.push(Value::Bytes(packed));
        TxnCall {
            call: ProcCall {
                proc: self.proc,
                args,
            },
            ops,
        }
    }
}

#[derive(Clone, Copy)]
struct YcsbSteps {
    read: StepId,
    rmw: StepId,
}

/// `ycsb_txn(accesses)`: reads (op 0) or read-modify-writes (op 1) of `usertable` rows, in
/// order. The one argument is bytes: per access, the key (8 bytes, little-endian) and the op
/// (1 byte); see [`ycsb_args`].
struct YcsbTxn {
    steps: YcsbSteps,
}

impl Procedure for YcsbTxn {
    fn name(&self) -> &'static str {
        "ycsb_txn"
    }

    fn may_abort(&self) -> bool {
        false
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let mut program = Program::default();
        self.program_into(args, &mut program)?;
        Ok(program)
    }

    /// Planners call this once per transaction: the accesses go into the caller's buffer, so
    /// building a program allocates nothing once the buffer has grown.
    fn program_into(&self, args: &[Value], out: &mut Program) -> Result<(), String> {
        let [Value::Bytes(packed)] = args else {
            return Err(format!(
                "expected one bytes argument (9 bytes per access: key, op), got {} values",
                args.len()
            ));
        };
        if !packed.len().is_multiple_of(ACCESS_BYTES) {
            return Err(format!(
                "expected 9 bytes per access (key, op), got {} bytes",
                packed.len()
            ));
        }
        let accesses = &mut out.accesses;
        accesses.clear();
        accesses.reserve(packed.len() / ACCESS_BYTES);
        for access in packed.chunks_exact(ACCESS_BYTES) {
            let (key, op) = access.split_at(8);
            let key = u64::from_le_bytes(key.try_into().expect("8 bytes"));
            let (kind, step, arg) = match op[0] {
                OP_READ => (AccessKind::Read, self.steps.read, Value::Null),
                OP_RMW => (AccessKind::ReadModifyWrite, self.steps.rmw, Value::Int(1)),
                other => return Err(format!("op must be 0 (read) or 1 (rmw), got {other}")),
            };
            accesses.push(Access::plain(USERTABLE, key, kind, step, arg, Vec::new()));
        }
        Ok(())
    }
}

#[inline]
fn counter(row: &[u8]) -> i64 {
    i64::from_le_bytes(row[..8].try_into().expect("rows are at least 8 bytes"))
}

/// Reads a row: returns its counter.
fn ycsb_read(row: RowRef<'_>, _arg: &Value, _inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(counter(row.bytes())))
}

/// Read-modify-write: adds the argument to the counter and rewrites the payload; returns the
/// counter as read.
fn ycsb_rmw(row: RowRef<'_>, arg: &Value, _inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(row) = row else {
        return Err(LogicAbort("ycsb_rmw needs a writable row"));
    };
    let old = counter(row);
    let new = old.wrapping_add(arg.as_int().unwrap_or(1));
    row[..8].copy_from_slice(&new.to_le_bytes());
    row[8..].fill(new as u8);
    Ok(Value::Int(old))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(nodes: u32, mp: f64, theta: f64) -> RunConfig {
        let mut c = RunConfig::default();
        c.cluster.nodes = nodes;
        c.workload.ycsb.records_per_partition = 1000;
        c.workload.ycsb.multi_partition_fraction = mp;
        c.workload.ycsb.theta = theta;
        c
    }

    /// The (key, op) of each access of a call.
    fn accesses_of(call: &TxnCall) -> Vec<(u64, u8)> {
        let [Value::Bytes(packed)] = &call.call.args[..] else {
            panic!("one bytes argument: {:?}", call.call.args);
        };
        packed
            .chunks(ACCESS_BYTES)
            .map(|a| (u64::from_le_bytes(a[..8].try_into().unwrap()), a[8]))
            .collect()
    }

    fn keys_of(call: &TxnCall) -> Vec<u64> {
        accesses_of(call).into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn reusing_a_finished_call_gives_the_same_stream() {
        let y = Ycsb::new(&config(2, 0.5, 0.0)).unwrap();
        let mut fresh = y.generator(3, PartitionId(1));
        let mut reusing = y.generator(3, PartitionId(1));
        let mut old = reusing.next_txn().call;
        assert_eq!(fresh.next_txn().call, old);
        for _ in 0..50 {
            let next = reusing.next_txn_reusing(old).call;
            assert_eq!(fresh.next_txn().call, next);
            old = next;
        }
    }

    #[test]
    fn single_partition_txns_stay_home_without_duplicates() {
        let y = Ycsb::new(&config(4, 0.0, 0.99)).unwrap();
        let mut g = y.generator(0, PartitionId(2));
        for _ in 0..200 {
            let t = g.next_txn();
            let keys = keys_of(&t);
            assert_eq!(keys.len(), 16);
            assert!(keys
                .iter()
                .all(|&k| y.pmap.partition_of(0, k) == PartitionId(2)));
            let mut sorted = keys.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 16, "no duplicate keys");
        }
    }

    #[test]
    fn multi_partition_fraction_and_spread() {
        let y = Ycsb::new(&config(4, 0.5, 0.0)).unwrap();
        let mut g = y.generator(3, PartitionId(1));
        let mut multi = 0;
        for _ in 0..2000 {
            let keys = keys_of(&g.next_txn());
            let mut parts: Vec<_> = keys.iter().map(|&k| y.pmap.partition_of(0, k)).collect();
            assert!(
                parts.contains(&PartitionId(1)),
                "home partition always involved"
            );
            parts.sort();
            parts.dedup();
            assert!(parts.len() <= 2);
            multi += (parts.len() == 2) as u32;
        }
        assert!((900..1100).contains(&multi), "{multi}");
    }

    #[test]
    fn remote_accesses_go_to_the_other_partitions_at_their_rate() {
        let mut c = config(4, 0.0, 0.0);
        c.workload.ycsb.remote_access_fraction = 0.1;
        let y = Ycsb::new(&c).unwrap();
        let mut g = y.generator(0, PartitionId(2));
        let mut per_partition = [0u32; 4];
        for _ in 0..1000 {
            for k in keys_of(&g.next_txn()) {
                per_partition[y.pmap.partition_of(0, k).index()] += 1;
            }
        }
        let remote = 16_000 - per_partition[2];
        assert!((1400..1800).contains(&remote), "{per_partition:?}");
        for p in [0, 1, 3] {
            assert!((400..650).contains(&per_partition[p]), "{per_partition:?}");
        }
    }

    #[test]
    fn write_fraction_is_respected() {
        let mut c = config(1, 0.0, 0.0);
        c.workload.ycsb.write_fraction = 0.25;
        let y = Ycsb::new(&c).unwrap();
        let mut g = y.generator(0, PartitionId(0));
        let writes: usize = (0..1000)
            .map(|_| {
                let t = g.next_txn();
                accesses_of(&t).iter().filter(|a| a.1 == OP_RMW).count()
            })
            .sum();
        assert!((3600..4400).contains(&writes), "{writes}");
    }

    #[test]
    fn reads_and_writes_may_have_their_own_skew() {
        let mut c = config(1, 0.0, 1.5);
        c.workload.ycsb.write_fraction = 0.5;
        c.workload.ycsb.write_theta = Some(0.0);
        let y = Ycsb::new(&c).unwrap();
        let mut g = y.generator(0, PartitionId(0));
        // How many accesses of each kind go to the 10 most popular rows of the 1000 (rank
        // order is key order here).
        let (mut hot, mut all) = ([0usize; 2], [0usize; 2]);
        for _ in 0..1000 {
            let t = g.next_txn();
            for (key, op) in accesses_of(&t) {
                let w = usize::from(op == OP_RMW);
                all[w] += 1;
                hot[w] += usize::from(y.pmap.nth_key_of(USERTABLE, PartitionId(0), 10) > key);
            }
        }
        assert!(hot[0] * 2 > all[0], "reads are skewed: {hot:?} of {all:?}");
        assert!(
            hot[1] * 30 < all[1],
            "writes are uniform: {hot:?} of {all:?}"
        );
    }

    #[test]
    fn same_seed_same_stream() {
        let y = Ycsb::new(&config(2, 0.3, 0.9)).unwrap();
        let a: Vec<_> = {
            let mut g = y.generator(5, PartitionId(1));
            (0..50).map(|_| g.next_txn()).collect()
        };
        let mut g = y.generator(5, PartitionId(1));
        assert!(a.iter().all(|t| *t == g.next_txn()));
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let y = Ycsb::new(&config(1, 0.0, 0.0)).unwrap();
        let cat = y.catalog();
        for (args, expect) in [
            (vec![Value::Int(1)], "one bytes argument"),
            (ycsb_args([(1, 7)]), "op must be 0 (read) or 1 (rmw), got 7"),
            (vec![Value::Bytes(vec![1; 10])], "9 bytes per access"),
            (
                vec![Value::Bytes(Vec::new()), Value::Int(0)],
                "one bytes argument",
            ),
        ] {
            let call = ProcCall { proc: y.proc, args };
            let err = cat.program(&call).unwrap_err().to_string();
            assert!(err.contains(expect), "{err}");
        }
        let good = ProcCall {
            proc: y.proc,
            args: ycsb_args([(3, OP_READ), (5, OP_RMW)]),
        };
        let program = cat.program(&good).unwrap();
        let got: Vec<_> = program.accesses.iter().map(|a| (a.key, a.kind)).collect();
        assert_eq!(
            got,
            [(3, AccessKind::Read), (5, AccessKind::ReadModifyWrite)]
        );
    }
}
