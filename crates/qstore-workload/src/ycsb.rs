//! YCSB-style transactions, as in the Q-Store, Calvin and Sundial evaluations: one table of
//! fixed-size rows, transactions of `ops_per_txn` accesses that are reads or
//! read-modify-writes, keys drawn uniformly or with Zipfian skew inside a partition, and a
//! fraction of multi-partition transactions that spread their accesses over several
//! partitions.
//!
//! Row layout: bytes 0..8 are a little-endian counter that every read-modify-write increments;
//! the rest is payload, rewritten by each write.
//!
//! Three knobs give LEAP's extended YCSB (Lin et al., SIGMOD 2016, sections 3.4.1 and 5):
//!
//! * `remote_locality` (P(L|R)): whether a remote access touches records only its home's
//!   transactions touch. Each partition's keys are split into one stripe per partition by
//!   rank modulo the partition count (rank `r` is in stripe `r % partitions`); partition
//!   `p`'s stripe `p` serves its local accesses and the remote accesses without locality,
//!   its stripe `h` (`h != p`) only the remote accesses with locality from home `h`. Within
//!   a stripe, ranks keep the configured skew.
//! * `steps` (figure 11): the accesses are split into `steps + 1` consecutive steps, and
//!   every access of a step depends on (takes as input) the output of the first access of
//!   the step before. The paper derives the next step's keys from the previous step's
//!   result; here the dependency is on data, not on keys, so the key set stays known up
//!   front and deterministic protocols can still plan it, while an interactive protocol
//!   must still bring the intermediate result to the step's node before running it.
//! * `remote_phases` (figure 13): in turn, each phase limits every remote access to one of
//!   the few partitions following the home one, for some seconds. A generator times the
//!   phases from its creation (`std::time::Instant`), so with phases its stream depends on
//!   timing, not on the seed alone; without them it is the seed's as always.

use crate::zipf::RankChooser;
use crate::{TxnCall, TxnGenerator, Workload};
use qstore_core::config::{RemotePhase, YcsbConfig};
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
use std::time::Instant;

/// The only table.
pub const USERTABLE: u16 = 0;

/// Operation code of a read in a `ycsb_txn` call.
pub const OP_READ: u8 = 0;
/// Operation code of a read-modify-write in a `ycsb_txn` call.
pub const OP_RMW: u8 = 1;
/// Flag of an operation byte (or-ed with the code): the access begins a new step, and it and
/// every other access of its step take the output of the previous step's first access as
/// input (see [`YcsbTxn::program_into`]). Never on the first access.
pub const STEP_START: u8 = 0x80;
/// Bytes of one access in a `ycsb_txn` call: the key (8, little-endian), then the operation.
pub const ACCESS_BYTES: usize = 9;

/// The one argument of a `ycsb_txn` call of `accesses`, given as (key, operation byte: the
/// code, or-ed with [`STEP_START`] where a step begins).
pub fn ycsb_args(accesses: impl IntoIterator<Item = (u64, u8)>) -> Vec<Value> {
    let mut packed = Vec::new();
    pack_accesses(&mut packed, accesses);
    vec![Value::Bytes(packed)]
}

/// Appends `accesses`, given as (key, operation byte), to `packed` in the layout of
/// [`ycsb_args`].
pub(crate) fn pack_accesses(packed: &mut Vec<u8>, accesses: impl IntoIterator<Item = (u64, u8)>) {
    for (key, op) in accesses {
        packed.extend_from_slice(&key.to_le_bytes());
        packed.push(op);
    }
}

/// The argument list (emptied) and packed bytes (as they were: the caller overwrites or
/// clears them) of a finished call of the [`ycsb_args`] layout, for the next call to be
/// written in their memory; fresh bytes if the call had no bytes argument.
pub(crate) fn recycled_args(old: ProcCall) -> (Vec<Value>, Vec<u8>) {
    let mut args = old.args;
    let packed = match args.pop() {
        Some(Value::Bytes(b)) => b,
        _ => Vec::new(),
    };
    args.clear();
    (args, packed)
}

/// The accesses of an argument list in the layout of [`ycsb_args`], as (key, operation
/// byte), once its shape is checked: one bytes argument of 9 bytes per access.
pub(crate) fn unpack_accesses(
    args: &[Value],
) -> Result<impl ExactSizeIterator<Item = (u64, u8)> + '_, String> {
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
    Ok(packed.chunks_exact(ACCESS_BYTES).map(|access| {
        let (key, op) = access.split_at(8);
        (u64::from_le_bytes(key.try_into().expect("8 bytes")), op[0])
    }))
}

/// The schema of `usertable`: `records` rows of `row_size` bytes per partition.
pub(crate) fn usertable_schema(records: u64, row_size: usize, read_mostly: bool) -> TableSchema {
    TableSchema {
        name: "usertable".into(),
        row_size,
        capacity_per_partition: records as usize,
        keys_per_partition: records,
        read_mostly,
    }
}

/// Loads the first `records` rows of `partition` into `usertable`: counter 0 (written: a
/// loader need not hand out zeroed rows), payload derived from the key so rows differ.
pub(crate) fn load_usertable(
    loader: &mut dyn RowLoader,
    pmap: &PartitionMap,
    partition: PartitionId,
    records: u64,
) -> Result<(), QError> {
    crate::load_dense(
        loader,
        pmap,
        USERTABLE,
        partition,
        records,
        &mut |key, row| {
            row[..8].fill(0);
            row[8..].fill(key as u8);
        },
    )
}

/// Chooses the partitions of a transaction of home `home` into `parts`: the home partition,
/// plus, with probability `mp_fraction`, others drawn uniformly until the transaction spans
/// `per_mp_txn` distinct partitions (at most `partitions`).
pub(crate) fn choose_partitions(
    rng: &mut Rng,
    home: PartitionId,
    partitions: u32,
    mp_fraction: f64,
    per_mp_txn: u32,
    parts: &mut Vec<PartitionId>,
) {
    parts.clear();
    parts.push(home);
    let mp = mp_fraction > 0.0 && rng.random::<f64>() < mp_fraction;
    if !mp {
        return;
    }
    let want = per_mp_txn.min(partitions) as usize;
    while parts.len() < want {
        let p = PartitionId(rng.random_range(0..partitions));
        if !parts.contains(&p) {
            parts.push(p);
        }
    }
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
    /// With `remote_locality`: ranks inside a stripe (read, written), with the same skews.
    stripes: Option<(RankChooser, Option<RankChooser>)>,
}

impl Ycsb {
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = run.workload.ycsb.clone();
        let partitions = run.cluster.nodes;
        cfg.validate(partitions)?;
        let schema = usertable_schema(cfg.records_per_partition, cfg.row_size, cfg.read_mostly);
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
            stripes: cfg.remote_locality.map(|_| {
                // Validation keeps at least one key per stripe.
                let n = cfg.records_per_partition / partitions as u64;
                (
                    RankChooser::new(n, cfg.theta),
                    cfg.write_theta.map(|theta| RankChooser::new(n, theta)),
                )
            }),
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
        load_usertable(
            loader,
            &self.pmap,
            partition,
            self.cfg.records_per_partition,
        )
    }

    fn generator(&self, client: u32, home: PartitionId) -> Box<dyn TxnGenerator> {
        Box::new(self.ycsb_generator(client, home))
    }
}

impl Ycsb {
    fn ycsb_generator(&self, client: u32, home: PartitionId) -> YcsbGenerator {
        let ops = self.cfg.ops_per_txn as usize;
        let steps = self.cfg.steps as usize;
        YcsbGenerator {
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
            locality: self.cfg.remote_locality.map(|p| Locality {
                with: Bernoulli::new(p).expect("validated remote locality"),
                stripes: self.stripes.clone().expect("built with remote_locality"),
            }),
            phases: (!self.cfg.remote_phases.is_empty()).then(|| Phases {
                start: Instant::now(),
                total: self.cfg.remote_phases.iter().map(|p| p.seconds).sum(),
                list: self.cfg.remote_phases.clone(),
            }),
            span: self.partitions.saturating_sub(1).max(1),
            // Steps 1..=steps begin at k * ops / (steps + 1): sizes differ by one at most, and
            // every step has an access (validation keeps steps < ops).
            step_starts: (1..=steps).map(|k| k * ops / (steps + 1)).collect(),
        }
    }
}

/// `remote_locality` in a generator.
struct Locality {
    /// Whether a remote access is with locality.
    with: Bernoulli,
    /// Ranks inside a stripe (read, written).
    stripes: (RankChooser, Option<RankChooser>),
}

/// `remote_phases` in a generator, timed from its creation: which partitions a remote
/// access may go to depends on when the transaction is generated, so the stream is no
/// longer a function of the seed alone.
struct Phases {
    start: Instant,
    list: Vec<RemotePhase>,
    /// The length of one cycle through the list, in seconds.
    total: f64,
}

impl Phases {
    /// How many partitions following the home one remote accesses go to, `elapsed` seconds
    /// after the start.
    fn span_at(&self, elapsed: f64, partitions: u32) -> u32 {
        let mut t = elapsed % self.total;
        let span = |phase: &RemotePhase| match phase.partitions {
            0 => partitions - 1,
            k => k,
        };
        for phase in &self.list {
            if t < phase.seconds {
                return span(phase);
            }
            t -= phase.seconds;
        }
        // Only by rounding: the cycle's end.
        span(self.list.last().expect("phases are not empty"))
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
    /// `remote_locality`, if set.
    locality: Option<Locality>,
    /// `remote_phases`, if any: remote accesses then depend on the time since creation.
    phases: Option<Phases>,
    /// A remote access goes to one of the `span` partitions following the home one: all
    /// others (`partitions - 1`), unless the current phase limits them.
    span: u32,
    /// Where steps 1 and later begin (`steps`): their accesses' op bytes carry
    /// [`STEP_START`].
    step_starts: Vec<usize>,
}

impl YcsbGenerator {
    /// The partitions of the next transaction: the home partition, plus distinct others for
    /// a multi-partition transaction.
    fn choose_partitions(&mut self) {
        choose_partitions(
            &mut self.rng,
            self.home,
            self.partitions,
            self.cfg.multi_partition_fraction,
            self.cfg.partitions_per_mp_txn,
            &mut self.parts,
        );
    }

    /// Chooses the keys of the next transaction into `chosen`: `ops` keys spread evenly over
    /// its partitions, round-robin, none twice (unless duplicates are allowed; configuration
    /// validation guarantees enough distinct keys exist).
    ///
    /// With `remote_access_fraction`, each access goes with that probability to one of the
    /// `span` partitions after the home one (all others but in a limiting phase). With
    /// `steps`, this draw stays per access: a step may have no remote access or several
    /// (the paper's one remote access per step is the average when the fraction is
    /// `(steps + 1) / ops`). With `remote_locality`, a remote access is then with locality
    /// with that probability, which picks its stripe; without it, the draws are exactly
    /// those of a generator without the knob.
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
        let (home, partitions, span) = (self.home.0, self.partitions, self.span);
        let (read_ranks, write_ranks) = match &self.locality {
            Some(l) => (&l.stripes.0, l.stripes.1.as_ref()),
            None => (&self.ranks, self.write_ranks.as_ref()),
        };
        // The paper's multi-step transactions: every step after the first begins with a
        // remote access, which needs the step before's result (so that under 2PC each
        // intermediate result crosses the network), besides the accesses drawn remote.
        let step_starts: &[usize] = if partitions > 1 {
            &self.step_starts
        } else {
            &[]
        };
        for i in 0..ops {
            let mut p = parts[next];
            next = if next + 1 == parts.len() { 0 } else { next + 1 };
            // With locality: the stripe of `p` the key comes from, `p`'s own unless the
            // access is remote with locality.
            let mut stripe = p.0;
            let begins_step = step_starts.contains(&i);
            if begins_step || (remote > 0.0 && rng.random::<f64>() < remote) {
                // One of the `span` partitions after the home one, uniformly (without phases,
                // any partition but the home one).
                let other = rng.random_range(1..span + 1);
                p = PartitionId((home + other) % partitions);
                stripe = p.0;
                if let Some(locality) = &self.locality {
                    if locality.with.sample(&mut rng) {
                        stripe = home;
                    }
                }
            }
            let mut ranks = read_ranks;
            if let Some(write_ranks) = write_ranks {
                let write = self.writes.sample(&mut rng);
                self.writing.push(write);
                if write {
                    ranks = write_ranks;
                }
            }
            loop {
                let mut rank = ranks.sample(&mut rng);
                if self.locality.is_some() {
                    rank = rank * partitions as u64 + stripe as u64;
                }
                let key = self.pmap.nth_key_of(USERTABLE, p, rank);
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
        if let Some(phases) = &self.phases {
            // Once per transaction: a clock read per access would cost more than the draws.
            self.span = phases.span_at(phases.start.elapsed().as_secs_f64(), self.partitions);
        }
        self.choose_partitions();
        let ops = self.cfg.ops_per_txn;
        self.choose_keys(ops as usize);
        // Then the argument, packed, in the finished call's memory: the load generator shares
        // the machine with the engine, so its cost per transaction is the engine's loss, and
        // a planner on another core reads these bytes (9 per access, where a (key, op) pair
        // of values took 48).
        let (mut args, mut packed) = recycled_args(old);
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
        for &start in &self.step_starts {
            packed[start * ACCESS_BYTES + 8] |= STEP_START;
        }
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
/// (1 byte); see [`ycsb_args`]. An op byte with [`STEP_START`] (0x80) begins a new step of a
/// multi-step transaction (`workload.ycsb.steps`): each access of a step but the first
/// depends on the output of the first access of the step before. Arguments without the flag
/// (all before it existed) are single-step transactions without dependencies, as before.
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
    /// building a program allocates nothing once the buffer has grown (but for dependencies).
    ///
    /// Steps: the accesses from one with [`STEP_START`] to the next one with it form a step;
    /// every access of step `k >= 1` gets `deps = [first access of step k - 1]`, and the
    /// read-modify-writes fold that input into the payload they write. The keys stay those
    /// of the argument (no key is derived from a result), so deterministic protocols know
    /// the read/write set up front; the dependencies only order the steps and carry the
    /// intermediate results between them.
    fn program_into(&self, args: &[Value], out: &mut Program) -> Result<(), String> {
        let packed = unpack_accesses(args)?;
        let accesses = &mut out.accesses;
        accesses.clear();
        accesses.reserve(packed.len());
        // The first access of the previous step, and of the current one.
        let (mut previous, mut current) = (None::<u16>, 0u16);
        for (i, (key, byte)) in packed.enumerate() {
            let begins = byte & STEP_START != 0;
            let (kind, step, arg) = match byte & !STEP_START {
                OP_READ => (AccessKind::Read, self.steps.read, Value::Null),
                OP_RMW => (AccessKind::ReadModifyWrite, self.steps.rmw, Value::Int(1)),
                other if begins => {
                    return Err(format!(
                        "op must be 0 (read) or 1 (rmw), got {other} (access {i}, byte \
                         {byte:#04x}: the step flag 0x80 with op {other})"
                    ))
                }
                other => return Err(format!("op must be 0 (read) or 1 (rmw), got {other}")),
            };
            if begins {
                if i == 0 {
                    return Err(format!(
                        "access 0 has the step flag 0x80 (byte {byte:#04x}), but the first \
                         step begins there anyway: only a later access may begin a step"
                    ));
                }
                let Ok(at) = u16::try_from(i) else {
                    return Err(format!(
                        "access {i} begins a step, but steps begin at accesses 1 to {}",
                        u16::MAX
                    ));
                };
                previous = Some(current);
                current = at;
            }
            let deps = match previous {
                Some(first) => vec![first],
                None => Vec::new(),
            };
            accesses.push(Access::plain(USERTABLE, key, kind, step, arg, deps));
        }
        Ok(())
    }
}

#[inline]
pub(crate) fn counter(row: &[u8]) -> i64 {
    i64::from_le_bytes(row[..8].try_into().expect("rows are at least 8 bytes"))
}

/// Reads a row: returns its counter.
fn ycsb_read(row: RowRef<'_>, _arg: &Value, _inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(counter(row.bytes())))
}

/// Read-modify-write: adds the argument to the counter and rewrites the payload with the
/// low byte of (new counter + input), the input being the previous step's result (0 without
/// one: the payload is then the new counter's low byte); returns the counter as read.
pub(crate) fn ycsb_rmw(
    row: RowRef<'_>,
    arg: &Value,
    inputs: Inputs<'_>,
) -> Result<Value, LogicAbort> {
    let RowRef::Write(row) = row else {
        return Err(LogicAbort("ycsb_rmw needs a writable row"));
    };
    let old = counter(row);
    let new = old.wrapping_add(arg.as_int().unwrap_or(1));
    // A missing record's access outputs Null: no input.
    let input = inputs.get(0).as_int().unwrap_or(0);
    row[..8].copy_from_slice(&new.to_le_bytes());
    row[8..].fill(new.wrapping_add(input) as u8);
    Ok(Value::Int(old))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemStore;
    use qstore_core::config::Partitioning;
    use std::collections::HashMap;

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

    /// The accesses of a call that begin a step.
    fn step_starts(call: &TxnCall) -> Vec<usize> {
        accesses_of(call)
            .iter()
            .enumerate()
            .filter(|(_, a)| a.1 & STEP_START != 0)
            .map(|(i, _)| i)
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

    /// FNV-1a over the packed arguments of a generator's first `n` calls.
    fn stream_fingerprint(y: &Ycsb, client: u32, home: u32, n: usize) -> u64 {
        let mut g = y.generator(client, PartitionId(home));
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for _ in 0..n {
            let [Value::Bytes(packed)] = &g.next_txn().call.args[..] else {
                panic!("one bytes argument");
            };
            for &b in packed {
                h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        h
    }

    #[test]
    fn without_the_leap_knobs_the_stream_is_unchanged() {
        // Fingerprints of the streams before remote_locality, steps and remote_phases existed.
        let mut remote = config(4, 0.0, 0.9);
        remote.workload.ycsb.remote_access_fraction = 0.1;
        remote.workload.ycsb.write_theta = Some(0.0);
        let mut plain = config(3, 0.0, 0.0);
        plain.workload.ycsb.remote_access_fraction = 0.3;
        let mp = config(4, 0.5, 0.99);
        for (c, golden) in [
            (remote, 0xd039_72fd_4f89_f2b9),
            (plain, 0x40ef_2a36_afea_69e7),
            (mp, 0xdd7d_647c_9fc9_5cc1),
        ] {
            let got = stream_fingerprint(&Ycsb::new(&c).unwrap(), 7, 1, 300);
            assert_eq!(got, golden, "{got:#x}");
        }
    }

    /// Every key of the table: its partition and its rank there.
    fn placement(y: &Ycsb) -> HashMap<u64, (u32, u64)> {
        let mut at = HashMap::new();
        for p in 0..y.partitions {
            for r in 0..y.cfg.records_per_partition {
                at.insert(y.pmap.nth_key_of(USERTABLE, PartitionId(p), r), (p, r));
            }
        }
        at
    }

    fn locality_config(nodes: u32, remote: f64, locality: f64) -> RunConfig {
        let mut c = config(nodes, 0.0, 0.0);
        c.workload.ycsb.remote_access_fraction = remote;
        c.workload.ycsb.remote_locality = Some(locality);
        c
    }

    /// The (key, partition, rank) of every access `n` calls of home `home`'s generator make.
    fn accesses_with_placement(
        y: &Ycsb,
        at: &HashMap<u64, (u32, u64)>,
        home: u32,
        n: usize,
    ) -> Vec<(u64, u32, u64)> {
        let mut g = y.generator(10 + home, PartitionId(home));
        let mut out = Vec::new();
        for _ in 0..n {
            let keys = keys_of(&g.next_txn());
            let mut sorted = keys.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), keys.len(), "no duplicate keys");
            for k in keys {
                let (p, r) = at[&k];
                out.push((k, p, r));
            }
        }
        out
    }

    #[test]
    fn remote_accesses_with_locality_touch_keys_no_other_home_touches() {
        for (theta, partitioning) in [(0.0, Partitioning::Range), (0.99, Partitioning::Hash)] {
            let mut c = locality_config(4, 0.3, 1.0);
            c.workload.ycsb.theta = theta;
            c.cluster.partitioning = partitioning;
            let y = Ycsb::new(&c).unwrap();
            let at = placement(&y);
            let per_home: Vec<_> = (0..4)
                .map(|h| accesses_with_placement(&y, &at, h, 300))
                .collect();
            // Which homes chose each key.
            let mut chosen_by = HashMap::<u64, Vec<u32>>::new();
            for (h, accesses) in per_home.iter().enumerate() {
                for a in accesses {
                    chosen_by.entry(a.0).or_default().push(h as u32);
                }
            }
            for (h, accesses) in per_home.iter().enumerate() {
                let h = h as u32;
                let mut remote = 0;
                for &(key, p, r) in accesses {
                    // Local keys in the home's own stripe, remote ones in the home's stripe
                    // of the other partition.
                    assert_eq!(r % 4, h as u64, "key {key} (partition {p}) of home {h}");
                    if p != h {
                        remote += 1;
                        let homes = &chosen_by[&key];
                        assert!(
                            homes.iter().all(|&x| x == h),
                            "remote key {key} of home {h} also chosen by homes {homes:?}"
                        );
                    }
                }
                assert!((1200..1680).contains(&remote), "{remote} remote of 4800");
            }
        }
    }

    #[test]
    fn remote_accesses_without_locality_stay_in_the_target_partitions_own_stripe() {
        let y = Ycsb::new(&locality_config(4, 0.3, 0.0)).unwrap();
        let at = placement(&y);
        let mut remote_homes = HashMap::<u64, Vec<u32>>::new();
        for h in 0..4 {
            for (key, p, r) in accesses_with_placement(&y, &at, h, 300) {
                assert_eq!(r % 4, p as u64, "key {key}: the stripe of its partition");
                if p != h {
                    remote_homes.entry(key).or_default().push(h);
                }
            }
        }
        // Without locality, other homes share the same stripe: some remote keys are chosen
        // from several homes (and every local key lies there too).
        let shared = remote_homes
            .values()
            .filter(|homes| homes.iter().any(|&x| x != homes[0]))
            .count();
        assert!(shared > 10, "{shared}");
    }

    #[test]
    fn remote_and_locality_rates_are_respected() {
        let y = Ycsb::new(&locality_config(3, 0.2, 0.7)).unwrap();
        let at = placement(&y);
        let (mut remote, mut with_locality) = (0, 0);
        let accesses = accesses_with_placement(&y, &at, 1, 2000);
        for &(_, p, r) in &accesses {
            if p != 1 {
                remote += 1;
                with_locality += usize::from(r % 3 == 1);
            } else {
                assert_eq!(r % 3, 1);
            }
        }
        // 32,000 accesses: 6,400 remote expected (sd 72), 4,480 of them with locality (sd 37).
        assert_eq!(accesses.len(), 32_000);
        assert!((6100..6700).contains(&remote), "{remote}");
        let share = with_locality as f64 / remote as f64;
        assert!((0.67..0.73).contains(&share), "{share}");
        // And the stream is a function of the seed.
        let again = accesses_with_placement(&y, &at, 1, 2000);
        assert_eq!(accesses, again);
    }

    fn steps_config(ops: u32, steps: u32) -> RunConfig {
        let mut c = config(3, 0.0, 0.0);
        c.workload.ycsb.remote_access_fraction = 0.2;
        c.workload.ycsb.ops_per_txn = ops;
        c.workload.ycsb.steps = steps;
        c
    }

    #[test]
    fn steps_mark_their_first_accesses_and_depend_on_the_step_before() {
        let y = Ycsb::new(&steps_config(16, 4)).unwrap();
        let cat = y.catalog();
        let mut g = y.generator(0, PartitionId(0));
        for _ in 0..50 {
            let call = g.next_txn();
            let starts = step_starts(&call);
            // 16 accesses in 5 steps of 3, 3, 3, 3 and 4.
            assert_eq!(starts, [3, 6, 9, 12]);
            let program = cat.program(&call.call).unwrap();
            let deps: Vec<Vec<u16>> = program.accesses.iter().map(|a| a.deps.clone()).collect();
            let step = |i: usize| starts.iter().filter(|&&s| s <= i).count();
            for (i, d) in deps.iter().enumerate() {
                let want: Vec<u16> = match step(i) {
                    0 => vec![],
                    k => vec![if k == 1 { 0 } else { starts[k - 2] as u16 }],
                };
                assert_eq!(*d, want, "access {i}: {deps:?}");
            }
        }
        // As evenly as possible, whatever the sizes.
        for (ops, steps, want) in [
            (2, 1, vec![1]),
            (5, 4, vec![1, 2, 3, 4]),
            (10, 2, vec![3, 6]),
            (7, 0, vec![]),
        ] {
            let y = Ycsb::new(&steps_config(ops, steps)).unwrap();
            let call = y.generator(0, PartitionId(2)).next_txn();
            let starts = step_starts(&call);
            assert_eq!(starts, want, "{ops} ops in {} steps", steps + 1);
        }
    }

    #[test]
    fn every_step_after_the_first_begins_with_a_remote_access() {
        let mut c = steps_config(16, 5);
        c.workload.ycsb.remote_access_fraction = 0.0;
        let y = Ycsb::new(&c).unwrap();
        let mut g = y.generator(4, PartitionId(1));
        for _ in 0..100 {
            let call = g.next_txn();
            let starts = step_starts(&call);
            assert_eq!(starts.len(), 5);
            for (i, key) in keys_of(&call).into_iter().enumerate() {
                let remote = y.pmap.partition_of(USERTABLE, key) != PartitionId(1);
                assert_eq!(remote, starts.contains(&i), "access {i} of {starts:?}");
            }
        }
        // On one partition there is nowhere to go: the steps stay home.
        let mut one = steps_config(16, 5);
        one.cluster.nodes = 1;
        one.workload.ycsb.remote_access_fraction = 0.0;
        let y = Ycsb::new(&one).unwrap();
        let call = y.generator(0, PartitionId(0)).next_txn();
        assert_eq!(step_starts(&call).len(), 5);
    }

    #[test]
    fn old_arguments_parse_to_the_same_program() {
        let y = Ycsb::new(&config(2, 0.0, 0.0)).unwrap();
        let call = ProcCall {
            proc: y.proc,
            args: ycsb_args([(3, OP_READ), (5, OP_RMW), (8, OP_RMW), (1, OP_READ)]),
        };
        let program = y.catalog().program(&call).unwrap();
        let want: Vec<Access> = [(3, OP_READ), (5, OP_RMW), (8, OP_RMW), (1, OP_READ)]
            .into_iter()
            .map(|(key, op)| {
                let step = |name| y.catalog.steps.id(name).unwrap();
                let (kind, step, arg) = if op == OP_RMW {
                    (AccessKind::ReadModifyWrite, step("ycsb_rmw"), Value::Int(1))
                } else {
                    (AccessKind::Read, step("ycsb_read"), Value::Null)
                };
                Access::plain(USERTABLE, key, kind, step, arg, Vec::new())
            })
            .collect();
        assert_eq!(program.accesses, want);
    }

    #[test]
    fn read_modify_writes_fold_the_previous_steps_result_into_the_payload() {
        let y = Ycsb::new(&config(1, 0.0, 0.0)).unwrap();
        let cat = y.catalog();
        let mut store = MemStore::loaded(&y, [0]);
        // Give key 4 a counter of 40 (40 increments), key 6 one of 2, key 7 one of 5.
        for (key, times) in [(4, 40), (6, 2), (7, 5)] {
            for _ in 0..times {
                let call = ProcCall {
                    proc: y.proc,
                    args: ycsb_args([(key, OP_RMW)]),
                };
                store.execute(&cat, &call).unwrap();
            }
        }
        assert_eq!(counter(store.get(USERTABLE, 4)), 40);
        assert_eq!(
            store.get(USERTABLE, 4)[8],
            40,
            "no input: the counter's low byte"
        );
        // Step 0: read key 4 (outputs 40), rmw key 6 (outputs 2). Step 1: rmw keys 7 and 9,
        // both taking 40 as input (key 7 outputs 5). Step 2: rmw key 6 again, taking 5.
        let call = ProcCall {
            proc: y.proc,
            args: ycsb_args([
                (4, OP_READ),
                (6, OP_RMW),
                (7, OP_RMW | STEP_START),
                (9, OP_RMW),
                (6, OP_RMW | STEP_START),
            ]),
        };
        let outputs = store.execute(&cat, &call).unwrap();
        assert_eq!(outputs, [40, 2, 5, 0, 3].map(Value::Int));
        // (key, counter, payload byte): the counters go +1, the payloads add the inputs.
        for (key, count, byte) in [(7, 6, 6 + 40), (9, 1, 1 + 40), (6, 4, 4 + 5)] {
            let row = store.get(USERTABLE, key);
            assert_eq!(counter(row), count, "key {key}");
            assert!(
                row[8..].iter().all(|&b| b == byte),
                "key {key}: {:?}",
                &row[8..12]
            );
        }
        // The same accesses as one step: no inputs, payloads are the counters' low bytes.
        let mut flat = MemStore::loaded(&y, [0]);
        let unflagged = ycsb_args([(4, OP_READ), (7, OP_RMW), (9, OP_RMW)]);
        let call = ProcCall {
            proc: y.proc,
            args: unflagged,
        };
        flat.execute(&cat, &call).unwrap();
        assert_eq!(flat.get(USERTABLE, 7)[8], 1);
    }

    #[test]
    fn bad_step_flags_are_errors_not_panics() {
        let y = Ycsb::new(&config(1, 0.0, 0.0)).unwrap();
        let cat = y.catalog();
        for (args, expect) in [
            (
                ycsb_args([(1, OP_READ | STEP_START), (2, OP_READ)]),
                "access 0 has the step flag 0x80",
            ),
            (
                ycsb_args([(1, OP_READ), (2, 7 | STEP_START)]),
                "op must be 0 (read) or 1 (rmw), got 7 (access 1, byte 0x87",
            ),
            (
                ycsb_args([(1, OP_READ), (2, 0x7f)]),
                "op must be 0 (read) or 1 (rmw), got 127",
            ),
        ] {
            let call = ProcCall { proc: y.proc, args };
            let err = cat.program(&call).unwrap_err().to_string();
            assert!(err.contains(expect), "{err}");
        }
        // Steps beyond the accesses a transaction has are refused by validation.
        let err = Ycsb::new(&steps_config(4, 4)).err().unwrap();
        assert_eq!(err.setting, "workload.ycsb.steps");
    }

    fn phases_config(phases: &str) -> RunConfig {
        let mut c = config(4, 0.0, 0.0);
        c.workload.ycsb.remote_access_fraction = 0.5;
        c.workload.ycsb.remote_phases = qstore_core::config::parse_phases(phases).unwrap();
        c
    }

    /// How many accesses of `n` calls go to each partition.
    fn partitions_hit(y: &Ycsb, g: &mut dyn TxnGenerator, n: usize) -> [u32; 4] {
        let mut hit = [0; 4];
        for _ in 0..n {
            for k in keys_of(&g.next_txn()) {
                hit[y.pmap.partition_of(USERTABLE, k).index()] += 1;
            }
        }
        hit
    }

    #[test]
    fn a_phase_limits_remote_accesses_until_it_ends() {
        let y = Ycsb::new(&phases_config("0.05:1,100:all")).unwrap();
        let mut g = y.generator(0, PartitionId(3));
        let started = Instant::now();
        let first = partitions_hit(&y, &mut *g, 20);
        // A phase of 50 ms: 20 calls take far less, unless the machine stalls the test.
        if started.elapsed().as_secs_f64() < 0.05 {
            assert_eq!(first[1..3], [0, 0], "only partition 0 follows 3: {first:?}");
            assert!(first[0] > 100, "{first:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(60));
        let second = partitions_hit(&y, &mut *g, 100);
        for p in 0..3 {
            assert!(second[p] > 200, "all others now: {second:?}");
        }
    }

    #[test]
    fn phases_cycle_through_their_spans() {
        let y = Ycsb::new(&phases_config("1:1,2:2,1:all")).unwrap();
        let g = y.ycsb_generator(0, PartitionId(1));
        let phases = g.phases.as_ref().unwrap();
        for (t, span) in [
            (0.0, 1),
            (0.99, 1),
            (1.0, 2),
            (2.5, 2),
            (3.2, 3),
            (4.1, 1),
            (6.0, 2),
            (7.5, 3),
        ] {
            assert_eq!(phases.span_at(t, 4), span, "at {t} s");
        }
        // A span of 2 after home 3 is partitions 0 and 1, both of them.
        let mut g = y.ycsb_generator(0, PartitionId(3));
        g.phases.as_mut().unwrap().start -= std::time::Duration::from_millis(1500);
        let hit = partitions_hit(&y, &mut g, 100);
        assert_eq!(hit[2], 0, "{hit:?}");
        assert!(hit[0] > 150 && hit[1] > 150, "{hit:?}");
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
