//! The contention-index microbenchmark of the evaluation of deterministic database systems
//! (Ren, Thomson and Abadi, VLDB 2014, section 3.3).
//!
//! Every partition holds `records_per_partition` rows in YCSB's `usertable` layout (a
//! little-endian counter in bytes 0..8, then payload), split into K = 1 / `contention_index`
//! *hot* records (ranks 0..K of the partition's keys) and cold records (the rest). A
//! transaction reads and updates `ops_per_txn` distinct records: it stays in its home
//! partition, or with probability `multi_partition_fraction` spans `partitions_per_mp_txn`
//! partitions (home plus others drawn uniformly). The accesses are dealt round-robin over
//! the partitions (their counts differ by one at most), and at each partition exactly one
//! access, its first, goes to a hot record drawn uniformly from the K; the others go to
//! distinct cold records drawn uniformly. Two transactions touching a partition thus
//! conflict there with probability 1/K, the contention index; cold accesses hardly ever do.
//! The hot accesses come first (one per partition, in the order the partitions were drawn),
//! then the cold ones.
//!
//! Calls are YCSB's: `micro_txn` takes the [`ycsb_args`](crate::ycsb::ycsb_args) layout with
//! every operation a read-modify-write, whose step increments the counter as YCSB's does, so
//! the history checker sees the same versions.
//!
//! "Long" transactions (`compute_us_per_access`): each access's step first spins on CPU work
//! (a xorshift loop) for about that long, under every protocol alike, since the work is in
//! the step function. The iteration count comes from a calibration of the loop, done once
//! per process when the workload is built, so it varies between machines and runs: only the
//! timing depends on it, never the data written (the loop's result is discarded), so
//! deterministic replicas and the serial oracle agree whatever each process measured.
//!
//! Dependent transactions, which look up a secondary index to learn their records, and the
//! updater that changes the index are in [`dependent`].

mod dependent;

pub use dependent::INDEX;

use crate::ycsb::{
    choose_partitions, load_usertable, pack_accesses, recycled_args, unpack_accesses,
    usertable_schema, ycsb_rmw, OP_RMW, USERTABLE,
};
use crate::zipf::RankChooser;
use crate::{TxnCall, TxnGenerator, Workload};
use dependent::{DependentDraw, IndexUpdater, Procs, Shape};
use qstore_core::config::MicroConfig;
use qstore_core::partition::PartitionMap;
use qstore_core::rng::Rng;
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, LogicAbort, ProcCall, ProcId, Procedure, Program,
    RowLoader, RowRef, StepId, Value,
};
use qstore_core::{ConfigError, PartitionId, QError, RunConfig};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Bytes per row: the counter and 8 bytes of payload.
pub const ROW_SIZE: usize = 16;

pub struct Micro {
    cfg: MicroConfig,
    seed: u64,
    partitions: u32,
    pmap: PartitionMap,
    catalog: Arc<Catalog>,
    proc: ProcId,
    /// K, the hot records per partition.
    hot_records: u64,
    /// Dependent transactions' procedures and key space.
    dependent: (Procs, Shape),
    /// Whether dependent transactions go through OLLP (under this run's protocol).
    ollp: bool,
}

impl Micro {
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = run.workload.micro.clone();
        let partitions = run.cluster.nodes;
        cfg.validate(partitions)?;
        let mut catalog = Catalog::default();
        catalog.add_table(usertable_schema(cfg.records_per_partition, ROW_SIZE, false));
        catalog.add_table(dependent::index_schema(cfg.index_entries_per_partition));
        let rmw = catalog.steps.register("micro_rmw", micro_rmw);
        let read = catalog.steps.register("micro_read", micro_read);
        let iterations = compute_iterations(cfg.compute_us_per_access);
        let proc = catalog.add_procedure(Arc::new(MicroTxn { rmw, iterations }));
        let pmap = PartitionMap::new(partitions, run.cluster.partitioning, &catalog.tables);
        let stride = pmap.nth_key_of(USERTABLE, PartitionId(0), 1)
            - pmap.nth_key_of(USERTABLE, PartitionId(0), 0);
        let shape = Shape {
            rmw,
            read,
            iterations,
            // Validation keeps K within 32 bits when transactions are dependent.
            hot_records: cfg.hot_records().min(u32::MAX as u64) as u32,
            stride: stride as u32,
        };
        let procs = Procs::register(&mut catalog, shape);
        Ok(Micro {
            pmap,
            catalog: Arc::new(catalog),
            hot_records: cfg.hot_records(),
            dependent: (procs, shape),
            ollp: cfg.uses_ollp(&run.protocol),
            cfg,
            seed: run.seed,
            partitions,
            proc,
        })
    }

    /// How generators draw dependent transactions: the cold records split in two halves,
    /// the upper for records before the lookup, the lower (less K, the largest shift) for
    /// bases after it.
    fn dependent_draw(&self) -> DependentDraw {
        let k = self.hot_records;
        let cold = self.cfg.records_per_partition - k;
        let half = cold / 2;
        let ops = self.cfg.ops_per_txn as f64;
        DependentDraw {
            fraction: self.cfg.dependent_fraction,
            ollp: self.ollp,
            at: (self.cfg.lookup_position * ops).round() as usize,
            entries: self.cfg.index_entries_per_partition,
            procs: self.dependent.0,
            hot_records: k,
            hot: RankChooser::new(k, 0.0),
            upper: RankChooser::new(cold - half, 0.0),
            // Validation leaves the lower half more than K records.
            lower: RankChooser::new(half.saturating_sub(k).max(1), 0.0),
            upper_from: half,
        }
    }

    /// K, the hot records of each partition: its keys of ranks 0 to K - 1.
    pub fn hot_records(&self) -> u64 {
        self.hot_records
    }
}

impl Workload for Micro {
    fn name(&self) -> &'static str {
        "micro"
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }

    fn partition_map(&self) -> &PartitionMap {
        &self.pmap
    }

    fn load(&self, partition: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError> {
        load_usertable(
            loader,
            &self.pmap,
            partition,
            self.cfg.records_per_partition,
        )?;
        dependent::load_index(
            loader,
            &self.pmap,
            partition,
            self.cfg.index_entries_per_partition,
            self.hot_records,
        )
    }

    fn is_reconnaissance(&self, call: &ProcCall) -> bool {
        call.proc == self.dependent.0.recon
    }

    fn after_reconnaissance(
        &self,
        recon: &ProcCall,
        outputs: &[Value],
    ) -> Result<ProcCall, String> {
        if !self.is_reconnaissance(recon) {
            return Err(format!(
                "no reconnaissance: call of procedure #{}",
                recon.proc.0
            ));
        }
        let (procs, shape) = &self.dependent;
        dependent::after_reconnaissance(procs, shape, recon, outputs)
    }

    fn background_rate(&self) -> f64 {
        self.cfg.index_updates_per_s(self.partitions)
    }

    fn background(&self, home: PartitionId) -> Option<Box<dyn TxnGenerator>> {
        (self.background_rate() > 0.0).then(|| {
            Box::new(IndexUpdater {
                // Streams past every client's.
                rng: qstore_core::rng::stream(self.seed, (2 << 32) + home.0 as u64),
                partition: home,
                entries: self.cfg.index_entries_per_partition,
                hot_records: self.hot_records,
                pmap: self.pmap.clone(),
                proc: self.dependent.0.update,
            }) as Box<dyn TxnGenerator>
        })
    }

    fn generator(&self, client: u32, home: PartitionId) -> Box<dyn TxnGenerator> {
        let k = self.hot_records;
        Box::new(MicroGenerator {
            rng: qstore_core::rng::stream(self.seed, client as u64),
            home,
            partitions: self.partitions,
            mp_fraction: self.cfg.multi_partition_fraction,
            per_mp_txn: self.cfg.partitions_per_mp_txn,
            ops: self.cfg.ops_per_txn,
            pmap: self.pmap.clone(),
            proc: self.proc,
            hot_records: k,
            hot: RankChooser::new(k, 0.0),
            // Validation keeps at least one cold record.
            cold: RankChooser::new(self.cfg.records_per_partition - k, 0.0),
            parts: Vec::new(),
            chosen: Vec::with_capacity(self.cfg.ops_per_txn as usize),
            dependent: self.dependent_draw(),
        })
    }
}

struct MicroGenerator {
    rng: Rng,
    home: PartitionId,
    partitions: u32,
    mp_fraction: f64,
    per_mp_txn: u32,
    ops: u32,
    pmap: PartitionMap,
    proc: ProcId,
    hot_records: u64,
    /// Ranks of hot records, `[0, K)`.
    hot: RankChooser,
    /// Ranks of cold records less K, `[0, records - K)`.
    cold: RankChooser,
    parts: Vec<PartitionId>,
    chosen: Vec<u64>,
    dependent: DependentDraw,
}

impl MicroGenerator {
    /// The keys of the next transaction into `chosen`, over the partitions in `parts`: access
    /// `i` goes to partition `parts[i % parts.len()]`, a hot record for the first access of
    /// each partition, distinct cold records for the others (validation guarantees there are
    /// enough, and at least one access per partition).
    /// A dependent transaction's records and bases come from [`DependentDraw::key`].
    fn choose_keys(&mut self, dependent: bool) {
        let (parts, chosen) = (&self.parts, &mut self.chosen);
        chosen.clear();
        let mut rng = self.rng.clone();
        for i in 0..self.ops as usize {
            let p = parts[i % parts.len()];
            if dependent {
                loop {
                    let first = i < parts.len();
                    let d = &self.dependent;
                    let key = d.key(&mut rng, &self.pmap, i, p, first);
                    if !chosen.contains(&key) {
                        chosen.push(key);
                        break;
                    }
                }
                continue;
            }
            if i < parts.len() {
                let rank = self.hot.sample(&mut rng);
                chosen.push(self.pmap.nth_key_of(USERTABLE, p, rank));
                continue;
            }
            loop {
                let rank = self.hot_records + self.cold.sample(&mut rng);
                let key = self.pmap.nth_key_of(USERTABLE, p, rank);
                if !chosen.contains(&key) {
                    chosen.push(key);
                    break;
                }
            }
        }
        self.rng = rng;
    }
}

impl TxnGenerator for MicroGenerator {
    fn next_txn(&mut self) -> TxnCall {
        self.next_txn_reusing(ProcCall {
            proc: self.proc,
            args: Vec::new(),
        })
    }

    fn next_txn_reusing(&mut self, old: ProcCall) -> TxnCall {
        choose_partitions(
            &mut self.rng,
            self.home,
            self.partitions,
            self.mp_fraction,
            self.per_mp_txn,
            &mut self.parts,
        );
        if self.dependent.draw(&mut self.rng) {
            self.choose_keys(true);
            // The entry lies in the last partition drawn: a remote read for a distributed
            // transaction, as the paper's lookups may be.
            let p = *self.parts.last().expect("the home at least");
            let call = self
                .dependent
                .call(&mut self.rng, &self.pmap, p, &self.chosen);
            return TxnCall {
                call,
                ops: self.ops,
            };
        }
        self.choose_keys(false);
        let (mut args, mut packed) = recycled_args(old);
        packed.clear();
        pack_accesses(&mut packed, self.chosen.iter().map(|&key| (key, OP_RMW)));
        args.push(Value::Bytes(packed));
        TxnCall {
            call: ProcCall {
                proc: self.proc,
                args,
            },
            ops: self.ops,
        }
    }
}

/// `micro_txn(accesses)`: read-modify-writes of `usertable` rows, in order, each after
/// `iterations` rounds of CPU work. The one argument is bytes in the
/// [`ycsb_args`](crate::ycsb::ycsb_args) layout, every operation 1 (rmw).
struct MicroTxn {
    rmw: StepId,
    /// Rounds of [`compute`] per access (0: short transactions), the argument of every
    /// access's step: this process's calibration of `compute_us_per_access`.
    iterations: i64,
}

impl Procedure for MicroTxn {
    fn name(&self) -> &'static str {
        "micro_txn"
    }

    fn may_abort(&self) -> bool {
        false
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let mut program = Program::default();
        self.program_into(args, &mut program)?;
        Ok(program)
    }

    fn program_into(&self, args: &[Value], out: &mut Program) -> Result<(), String> {
        let packed = unpack_accesses(args)?;
        let accesses = &mut out.accesses;
        accesses.clear();
        accesses.reserve(packed.len());
        for (i, (key, op)) in packed.enumerate() {
            if op != OP_RMW {
                return Err(format!(
                    "micro_txn only reads and updates: op must be 1 (rmw), got {op} (access {i})"
                ));
            }
            accesses.push(Access::plain(
                USERTABLE,
                key,
                AccessKind::ReadModifyWrite,
                self.rmw,
                Value::Int(self.iterations),
                Vec::new(),
            ));
        }
        Ok(())
    }
}

/// Read-modify-write after `arg` (an integer) rounds of CPU work: the counter goes up by
/// one and the payload is rewritten, as YCSB's read-modify-write does; returns the counter
/// as read. The work's result is discarded: what is written never depends on it.
fn micro_rmw(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    work(arg);
    ycsb_rmw(row, &Value::Int(1), inputs)
}

/// The CPU work of one access: `arg` (an integer) rounds of [`compute`].
fn work(arg: &Value) {
    if let Some(iterations) = arg.as_int().filter(|&n| n > 0) {
        std::hint::black_box(compute(iterations as u64));
    }
}

/// Read after `arg` (an integer) rounds of CPU work: returns the counter (OLLP's
/// reconnaissance of the records before a dependent transaction's lookup).
fn micro_read(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    work(arg);
    Ok(Value::Int(crate::ycsb::counter(row.bytes())))
}

/// `iterations` rounds of a xorshift over a local value: CPU work only, no memory traffic.
/// Each round depends on the one before, so the rounds cannot overlap, and the seed and
/// result pass through `black_box`, so the loop is neither folded nor dropped.
#[inline(never)]
fn compute(iterations: u64) -> u64 {
    let mut x = std::hint::black_box(0x9e37_79b9_7f4a_7c15u64);
    for _ in 0..iterations {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

/// Rounds of [`compute`] that take about `us` microseconds here (0 for 0).
fn compute_iterations(us: f64) -> i64 {
    if us <= 0.0 {
        return 0;
    }
    // Validation keeps `us` at most a second: far from overflowing.
    (us * iterations_per_us()).round().max(1.0) as i64
}

/// Rounds of [`compute`] per microsecond on this machine, measured once per process, the
/// first time a workload with CPU work is built.
fn iterations_per_us() -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(calibrate)
}

/// Times [`compute`]: batches double until one takes a millisecond, then the fastest of
/// three batches of that size gives the rate (a batch slowed down by another thread counts
/// less). A few milliseconds in all.
fn calibrate() -> f64 {
    let time = |n: u64| {
        let start = Instant::now();
        compute(n);
        start.elapsed()
    };
    let mut n = 1u64 << 10;
    while time(n) < Duration::from_millis(1) && n < 1 << 40 {
        n *= 2;
    }
    let best = (0..3).map(|_| time(n)).min().expect("three batches");
    n as f64 / (best.as_secs_f64() * 1e6).max(1e-3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemStore;
    use crate::ycsb::{counter, ycsb_args, ACCESS_BYTES, OP_READ};
    use qstore_core::config::Partitioning;
    use std::collections::{HashMap, HashSet};

    fn config(nodes: u32, mp: f64, ci: f64) -> RunConfig {
        let mut c = RunConfig::default();
        c.workload.name = "micro".into();
        c.cluster.nodes = nodes;
        c.workload.micro.records_per_partition = 1000;
        c.workload.micro.multi_partition_fraction = mp;
        c.workload.micro.contention_index = ci;
        c
    }

    fn keys_of(call: &TxnCall) -> Vec<u64> {
        let [Value::Bytes(packed)] = &call.call.args[..] else {
            panic!("one bytes argument: {:?}", call.call.args);
        };
        packed
            .chunks(ACCESS_BYTES)
            .map(|a| {
                assert_eq!(a[8], OP_RMW, "every access reads and updates");
                u64::from_le_bytes(a[..8].try_into().unwrap())
            })
            .collect()
    }

    /// Every key of the table: its partition and its rank there.
    fn placement(m: &Micro) -> HashMap<u64, (u32, u64)> {
        let mut at = HashMap::new();
        for p in 0..m.partitions {
            for r in 0..m.cfg.records_per_partition {
                at.insert(m.pmap.nth_key_of(USERTABLE, PartitionId(p), r), (p, r));
            }
        }
        at
    }

    #[test]
    fn same_seed_and_client_same_stream() {
        let m = Micro::new(&config(3, 0.5, 0.01)).unwrap();
        let stream = |client, home| {
            let mut g = m.generator(client, PartitionId(home));
            (0..100).map(|_| g.next_txn()).collect::<Vec<_>>()
        };
        assert_eq!(stream(4, 1), stream(4, 1));
        assert_ne!(stream(4, 1), stream(5, 1), "clients have their own streams");
        // Reusing finished calls changes nothing.
        let mut fresh = m.generator(4, PartitionId(1));
        let mut reusing = m.generator(4, PartitionId(1));
        let mut old = reusing.next_txn().call;
        assert_eq!(fresh.next_txn().call, old);
        for _ in 0..50 {
            let next = reusing.next_txn_reusing(old).call;
            assert_eq!(fresh.next_txn().call, next);
            old = next;
        }
    }

    #[test]
    fn one_hot_access_per_partition_the_rest_cold_and_distinct() {
        for partitioning in [Partitioning::Range, Partitioning::Hash] {
            let mut c = config(4, 0.5, 0.01);
            c.cluster.partitioning = partitioning;
            c.workload.micro.partitions_per_mp_txn = 3;
            let m = Micro::new(&c).unwrap();
            let at = placement(&m);
            let mut g = m.generator(1, PartitionId(2));
            for _ in 0..500 {
                let keys = keys_of(&g.next_txn());
                assert_eq!(keys.len(), 10);
                let unique: HashSet<_> = keys.iter().collect();
                assert_eq!(unique.len(), 10, "distinct keys: {keys:?}");
                // Per partition: (hot, cold) accesses.
                let mut per = HashMap::<u32, (u32, u32)>::new();
                for (i, k) in keys.iter().enumerate() {
                    let (p, r) = at[k];
                    let e = per.entry(p).or_default();
                    if r < 100 {
                        e.0 += 1;
                        assert!(i < 3, "hot accesses come first: {keys:?}");
                    } else {
                        e.1 += 1;
                    }
                }
                assert!(per.contains_key(&2), "the home takes part");
                assert!(per.len() == 1 || per.len() == 3, "{per:?}");
                let n = per.len() as u32;
                for (p, (hot, cold)) in per {
                    assert_eq!(hot, 1, "partition {p}: one hot access");
                    // 10 accesses dealt evenly: 10 / n or one more, one of them hot.
                    assert!((10 / n..=10_u32.div_ceil(n)).contains(&(cold + 1)));
                }
            }
        }
    }

    #[test]
    fn mp_fraction_and_partitions_per_txn_are_respected() {
        for (mp, per_mp) in [(0.2, 2), (0.5, 4), (0.0, 3)] {
            let mut c = config(5, mp, 0.01);
            c.workload.micro.partitions_per_mp_txn = per_mp;
            let m = Micro::new(&c).unwrap();
            let mut g = m.generator(7, PartitionId(0));
            let (mut multi, mut touched) = (0u32, [0u32; 5]);
            for _ in 0..4000 {
                let mut parts: Vec<_> = keys_of(&g.next_txn())
                    .iter()
                    .map(|&k| m.pmap.partition_of(USERTABLE, k).0)
                    .collect();
                parts.sort();
                parts.dedup();
                assert_eq!(parts[0], 0, "the home takes part");
                match parts.len() {
                    1 => {}
                    n => {
                        assert_eq!(n, per_mp as usize, "{parts:?}");
                        multi += 1;
                        parts.iter().for_each(|&p| touched[p as usize] += 1);
                    }
                }
            }
            let expect = 4000.0 * mp;
            // 4,000 draws: the standard deviation is at most 32.
            assert!(
                (multi as f64 - expect).abs() < 130.0,
                "{multi} of 4000 for {mp}"
            );
            // The other partitions are drawn uniformly.
            let each = multi as f64 * (per_mp as f64 - 1.0) / 4.0;
            for p in 1..5 {
                assert!(
                    (touched[p] as f64 - each).abs() <= each * 0.15,
                    "{touched:?}"
                );
            }
        }
    }

    #[test]
    fn contention_index_sets_the_hot_records() {
        let m = Micro::new(&config(2, 0.0, 0.01)).unwrap();
        assert_eq!(m.hot_records(), 100);
        let at = placement(&m);
        let mut g = m.generator(0, PartitionId(1));
        let mut hot = HashSet::new();
        for _ in 0..3000 {
            let first = keys_of(&g.next_txn())[0];
            let (p, r) = at[&first];
            assert_eq!(p, 1);
            assert!(r < 100, "rank {r}");
            hot.insert(r);
        }
        assert_eq!(hot.len(), 100, "every hot record drawn");
        let default = Micro::new(&RunConfig {
            workload: qstore_core::config::WorkloadConfig {
                name: "micro".into(),
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        assert_eq!(default.hot_records(), 10_000);
        assert_eq!(
            Micro::new(&config(1, 0.0, 0.003)).unwrap().hot_records(),
            333
        );
    }

    #[test]
    fn bad_settings_say_what_is_wrong() {
        let err = |f: &dyn Fn(&mut RunConfig)| {
            let mut c = config(2, 0.0, 0.01);
            f(&mut c);
            Micro::new(&c).err().expect("refused")
        };
        for ci in [0.0, -0.5, 1.5, f64::NAN] {
            let e = err(&|c| c.workload.micro.contention_index = ci);
            assert_eq!(e.setting, "workload.micro.contention_index");
            assert!(e.to_string().contains("above 0 and at most 1"), "{e}");
        }
        // 1000 records cannot hold 1000 hot ones, nor 2000.
        for ci in [0.001, 0.0005] {
            let e = err(&|c| c.workload.micro.contention_index = ci);
            assert_eq!(e.setting, "workload.micro.contention_index");
            assert!(e.to_string().contains("fewer than"), "{e}");
            assert!(e.to_string().contains("--records"), "{e}");
        }
        // 990 hot records leave 10 cold ones, fewer than twice the 9 a transaction picks.
        let e = err(&|c| c.workload.micro.contention_index = 1.0 / 990.0);
        assert_eq!(e.setting, "workload.micro.records_per_partition");
        assert!(e.to_string().contains("leaves 10 cold records"), "{e}");
        // All multi-partition over 2 partitions: 4 cold ones each, so 10 cold records do.
        Micro::new(&{
            let mut c = config(2, 1.0, 1.0 / 990.0);
            c.workload.micro.partitions_per_mp_txn = 2;
            c
        })
        .unwrap();
        let e = err(&|c| c.workload.micro.partitions_per_mp_txn = 3);
        assert_eq!(e.setting, "workload.micro.partitions_per_mp_txn");
        let e = err(&|c| {
            c.workload.micro.multi_partition_fraction = 0.5;
            c.workload.micro.ops_per_txn = 1;
        });
        assert_eq!(e.setting, "workload.micro.ops_per_txn");
        let e = err(&|c| c.workload.micro.compute_us_per_access = -1.0);
        assert_eq!(e.setting, "workload.micro.compute_us_per_access");
        let e = Micro::new(&config(1, 0.2, 0.01)).err().unwrap();
        assert_eq!(e.setting, "workload.micro.multi_partition_fraction");
    }

    #[test]
    fn settings_read_from_a_configuration_file() {
        let c = RunConfig::from_toml(
            "[cluster]\nnodes = 3\n[workload]\nname = \"micro\"\n[workload.micro]\n\
             records_per_partition = 5000\ncontention_index = 0.01\n\
             compute_us_per_access = 15.0\nmulti_partition_fraction = 0.2\n\
             partitions_per_mp_txn = 3\n",
        )
        .unwrap();
        let m = &c.workload.micro;
        assert_eq!((m.records_per_partition, m.hot_records()), (5000, 100));
        assert_eq!((m.ops_per_txn, m.partitions_per_mp_txn), (10, 3));
        assert_eq!(RunConfig::from_toml(&c.to_toml()).unwrap(), c);
        c.validate().unwrap();
        let typo = RunConfig::from_toml("[workload.micro]\ncontention = 0.01\n").unwrap_err();
        assert!(typo.contains("unknown field"), "{typo}");
    }

    /// Runs `n` calls of client 3's stream through a fresh store; the outputs, and the store.
    fn run(m: &Micro, n: usize) -> (Vec<Vec<Value>>, MemStore) {
        let cat = m.catalog();
        let mut store = MemStore::loaded(m, 0..m.partitions);
        let mut g = m.generator(3, PartitionId(1));
        let outputs = (0..n)
            .map(|_| store.execute(&cat, &g.next_txn().call).unwrap())
            .collect();
        (outputs, store)
    }

    #[test]
    fn computing_changes_the_time_not_the_data() {
        let short = Micro::new(&config(2, 0.3, 0.05)).unwrap();
        let mut c = config(2, 0.3, 0.05);
        c.workload.micro.compute_us_per_access = 5.0;
        let long = Micro::new(&c).unwrap();
        let call = long.generator(3, PartitionId(1)).next_txn().call;
        let program = long.catalog().program(&call).unwrap();
        let iterations = program.accesses[0].arg.as_int().unwrap();
        assert!(iterations > 0, "{:?}", program.accesses[0]);
        let program = short.catalog().program(&call).unwrap();
        assert!(program.accesses.iter().all(|a| a.arg == Value::Int(0)));
        let (short_out, short_rows) = run(&short, 300);
        let (long_out, long_rows) = run(&long, 300);
        assert_eq!(short_out, long_out);
        let rows = |s: &MemStore| s.rows(USERTABLE).map(|(k, r)| (k, r.to_vec())).collect();
        let rows: (Vec<_>, Vec<_>) = (rows(&short_rows), rows(&long_rows));
        assert_eq!(rows.0, rows.1);
        // 3000 read-modify-writes: the counters add up to that.
        let total: i64 = short_rows.rows(USERTABLE).map(|(_, r)| counter(r)).sum();
        assert_eq!(total, 3000);
    }

    #[test]
    fn the_work_takes_time() {
        // 10 accesses of 200 µs each: 2 ms when the calibration was right. A busy machine
        // only makes it slower, unless it was busier while calibrating: a fifth of that.
        let mut c = config(1, 0.0, 0.01);
        c.workload.micro.compute_us_per_access = 200.0;
        let m = Micro::new(&c).unwrap();
        let mut store = MemStore::loaded(&m, [0]);
        let call = m.generator(0, PartitionId(0)).next_txn().call;
        let start = Instant::now();
        store.execute(&m.catalog(), &call).unwrap();
        let took = start.elapsed();
        assert!(took >= Duration::from_micros(400), "{took:?}");
    }

    #[test]
    fn rmw_counts_like_ycsb_and_bad_arguments_are_errors() {
        let m = Micro::new(&config(1, 0.0, 0.01)).unwrap();
        let cat = m.catalog();
        let mut store = MemStore::loaded(&m, [0]);
        for _ in 0..3 {
            let call = ProcCall {
                proc: m.proc,
                args: ycsb_args([(5, OP_RMW), (700, OP_RMW)]),
            };
            store.execute(&cat, &call).unwrap();
        }
        for key in [5, 700] {
            let row = store.get(USERTABLE, key);
            assert_eq!(counter(row), 3);
            assert!(row[8..].iter().all(|&b| b == 3));
        }
        for (args, expect) in [
            (vec![Value::Int(1)], "one bytes argument"),
            (vec![Value::Bytes(vec![1; 10])], "9 bytes per access"),
            (
                ycsb_args([(1, OP_RMW), (2, OP_READ)]),
                "op must be 1 (rmw), got 0 (access 1)",
            ),
        ] {
            let call = ProcCall { proc: m.proc, args };
            let e = cat.program(&call).unwrap_err().to_string();
            assert!(e.contains(expect), "{e}");
        }
    }
}
