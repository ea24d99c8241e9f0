//! Dependent transactions of the microbenchmark (section 3.6 of the determinism study): a
//! transaction that must look up a secondary index entry to learn which records it
//! processes, while an updater changes the entries at `index_volatility` updates per second
//! each.
//!
//! **The index.** Table `micro_index` holds `index_entries_per_partition` entries per
//! partition; an entry's value is a shift `v` in `[0, K)`, K the hot records. A dependent
//! transaction draws its records as an ordinary one does, except that each access after the
//! lookup gets a *base* instead of a record, and the index entry's value shifts every base
//! by `v` ranks: the hot access's base is rank 0 (so the entry picks one of the K hot
//! records), a cold access's base a rank in the lower half of the cold records. Accesses
//! before the lookup (`lookup_position`, figure 6c) take records of the upper half, so no
//! shift can make two of a transaction's accesses meet. A changed entry thus changes every
//! record after the lookup.
//!
//! **Two ways to run it**, as the paper compares them:
//! - *in the transaction* (nondeterministic protocols): `micro_dep` reads the entry and
//!   reaches each later record through a derived key (`KeyDep`: base + v x stride), locking
//!   it as it goes;
//! - *OLLP* (protocols that need the read/write set up front): `micro_dep_recon` reads the
//!   records before the lookup and the entry, read-only; the client then runs
//!   `micro_dep_checked` on that guess, whose index access aborts with `OLLP_RESTART` when
//!   the entry moved in between, and the client starts over from a fresh reconnaissance.
//!
//! **The updater** (`micro_index_update`) adds a random non-zero shift modulo K to one
//! entry; the client side runs it beside the clients, at the configured rate, outside the
//! measurements (see `Workload::background`).

use crate::ycsb::{pack_accesses, unpack_accesses, OP_RMW, USERTABLE};
use crate::zipf::RankChooser;
use crate::{TxnCall, TxnGenerator};
use qstore_core::partition::PartitionMap;
use qstore_core::rng::Rng;
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, KeyDep, LogicAbort, ProcCall, ProcId, Procedure, Program,
    RowLoader, RowRef, StepId, TableSchema, Value, OLLP_RESTART,
};
use qstore_core::{Key, PartitionId, QError, TableId};
use rand::Rng as _;
use std::sync::Arc;

/// The secondary index's table.
pub const INDEX: TableId = 1;
/// An entry: its shift, a little-endian i64.
const INDEX_ROW: usize = 8;

/// The index's schema.
pub(super) fn index_schema(entries: u64) -> TableSchema {
    TableSchema {
        name: "micro_index".into(),
        row_size: INDEX_ROW,
        capacity_per_partition: entries as usize,
        keys_per_partition: entries,
        read_mostly: false,
    }
}

/// Loads the index of `partition`: each entry's first shift is drawn from its key.
pub(super) fn load_index(
    loader: &mut dyn RowLoader,
    pmap: &PartitionMap,
    partition: PartitionId,
    entries: u64,
    hot_records: u64,
) -> Result<(), QError> {
    crate::load_dense(loader, pmap, INDEX, partition, entries, &mut |key, row| {
        let v = qstore_core::rng::splitmix64(key) % hot_records;
        row.copy_from_slice(&(v as i64).to_le_bytes());
    })
}

/// What the procedures share: the steps and the shape of the key space.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    /// The usertable's read-modify-write and read steps, and their argument (rounds of CPU
    /// work per access).
    pub rmw: StepId,
    pub read: StepId,
    pub iterations: i64,
    /// K: shifts are below it.
    pub hot_records: u32,
    /// Keys between a partition's consecutive ranks (1 under range partitioning, the number
    /// of partitions under hash partitioning): a shift of `v` ranks adds `v` x this.
    pub stride: u32,
}

/// The procedures of dependent transactions and of the updater.
#[derive(Clone, Copy)]
pub(super) struct Procs {
    pub in_transaction: ProcId,
    pub recon: ProcId,
    pub checked: ProcId,
    pub update: ProcId,
}

impl Procs {
    pub fn register(catalog: &mut Catalog, shape: Shape) -> Procs {
        let lookup = catalog.steps.register("micro_index_lookup", index_lookup);
        let check = catalog.steps.register("micro_index_check", index_check);
        let shift = catalog.steps.register("micro_index_shift", index_shift);
        let mut add = |how| {
            catalog.add_procedure(Arc::new(DependentTxn {
                shape,
                lookup,
                check,
                how,
            }))
        };
        let in_transaction = add(How::InTransaction);
        let recon = add(How::Recon);
        let checked = add(How::Checked);
        let update = catalog.add_procedure(Arc::new(IndexUpdate {
            shift,
            hot_records: shape.hot_records,
        }));
        Procs {
            in_transaction,
            recon,
            checked,
            update,
        }
    }
}

/// Which of a dependent transaction's procedures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    /// `micro_dep(entry, at, keys)`: reads the entry, reaches the records after it by
    /// derived keys.
    InTransaction,
    /// `micro_dep_recon(entry, at, keys)`: OLLP's reconnaissance, read-only: the records
    /// before the lookup, then the entry.
    Recon,
    /// `micro_dep_checked(entry, at, keys, guess)`: the transaction on the guess, its keys
    /// shifted already; the entry must still hold the guess.
    Checked,
}

struct DependentTxn {
    shape: Shape,
    lookup: StepId,
    check: StepId,
    how: How,
}

/// A dependent call's arguments: the entry's key, how many accesses come before the lookup,
/// and the records (before the lookup) and bases (after it), packed as YCSB's are.
pub(super) struct DependentArgs<'a> {
    pub entry: Key,
    pub at: usize,
    pub packed: &'a [Value],
}

impl<'a> DependentArgs<'a> {
    fn parse(args: &'a [Value], name: &str) -> Result<Self, String> {
        let (Some(Value::Int(entry)), Some(Value::Int(at)), Some(packed @ Value::Bytes(_))) =
            (args.first(), args.get(1), args.get(2))
        else {
            return Err(format!(
                "{name} takes (index entry, accesses before the lookup, packed accesses)"
            ));
        };
        let entry = u64::try_from(*entry).map_err(|_| format!("{name}: negative entry"))?;
        let at = usize::try_from(*at).map_err(|_| format!("{name}: negative position"))?;
        Ok(DependentArgs {
            entry,
            at,
            packed: std::slice::from_ref(packed),
        })
    }
}

impl Procedure for DependentTxn {
    fn name(&self) -> &'static str {
        match self.how {
            How::InTransaction => "micro_dep",
            How::Recon => "micro_dep_recon",
            How::Checked => "micro_dep_checked",
        }
    }

    fn may_abort(&self) -> bool {
        self.how == How::Checked
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let mut program = Program::default();
        self.program_into(args, &mut program)?;
        Ok(program)
    }

    fn program_into(&self, args: &[Value], out: &mut Program) -> Result<(), String> {
        let name = self.name();
        let a = DependentArgs::parse(args, name)?;
        let guess = match (self.how, args.get(3)) {
            (How::Checked, Some(Value::Int(g))) => Some(*g),
            (How::Checked, _) => return Err(format!("{name} takes the guessed shift 4th")),
            _ => None,
        };
        let keys: Vec<Key> = unpack_accesses(a.packed)?.map(|(k, _)| k).collect();
        if a.at > keys.len() {
            return Err(format!(
                "{name}: {} accesses before the lookup, of {}",
                a.at,
                keys.len()
            ));
        }
        let accesses = &mut out.accesses;
        accesses.clear();
        let s = self.shape;
        let record = |key, kind, step, deps, key_dep| Access {
            key_dep,
            ..Access::plain(USERTABLE, key, kind, step, Value::Int(s.iterations), deps)
        };
        let before = match self.how {
            How::Recon => (AccessKind::Read, s.read),
            _ => (AccessKind::ReadModifyWrite, s.rmw),
        };
        for &key in &keys[..a.at] {
            accesses.push(record(key, before.0, before.1, Vec::new(), None));
        }
        let mut entry = Access::plain(
            INDEX,
            a.entry,
            AccessKind::Read,
            self.lookup,
            Value::Null,
            Vec::new(),
        );
        if let Some(g) = guess {
            (entry.step, entry.arg, entry.may_abort) = (self.check, Value::Int(g), true);
        }
        accesses.push(entry);
        let lookup = a.at as u16;
        for &key in &keys[a.at..] {
            let access = match self.how {
                How::Recon => break,
                // Its input is the check's output, the shift, as in the lookup's case.
                How::Checked => record(key, AccessKind::ReadModifyWrite, s.rmw, vec![lookup], None),
                How::InTransaction => {
                    let shift = KeyDep {
                        dep: lookup,
                        scale: s.stride,
                        limit: s.hot_records,
                        back: 0,
                        output: true,
                    };
                    record(
                        key,
                        AccessKind::ReadModifyWrite,
                        s.rmw,
                        vec![lookup],
                        Some(shift),
                    )
                }
            };
            accesses.push(access);
        }
        Ok(())
    }
}

/// The entry's shift.
fn shift_of(row: &[u8]) -> i64 {
    i64::from_le_bytes(row[..INDEX_ROW].try_into().expect("index rows are 8 bytes"))
}

/// Reads the entry: outputs its shift.
fn index_lookup(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(shift_of(row.bytes())))
}

/// OLLP's check: the entry still holds the guess `arg` the reconnaissance read.
fn index_check(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let v = shift_of(row.bytes());
    match arg.as_int() == Some(v) {
        true => Ok(Value::Int(v)),
        false => Err(OLLP_RESTART),
    }
}

/// `micro_index_update(entry, delta)`: the entry's shift moves by `delta` modulo K.
struct IndexUpdate {
    shift: StepId,
    hot_records: u32,
}

impl Procedure for IndexUpdate {
    fn name(&self) -> &'static str {
        "micro_index_update"
    }

    fn may_abort(&self) -> bool {
        false
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let [Value::Int(entry), Value::Int(delta)] = args else {
            return Err("micro_index_update takes (index entry, shift)".into());
        };
        let entry = u64::try_from(*entry).map_err(|_| "micro_index_update: negative entry")?;
        // The step adds modulo K: K rides along so that the step needs no state.
        let arg = Value::Int(
            delta.rem_euclid(i64::from(self.hot_records)) << 32 | i64::from(self.hot_records),
        );
        Ok(Program {
            accesses: vec![Access::plain(
                INDEX,
                entry,
                AccessKind::ReadModifyWrite,
                self.shift,
                arg,
                Vec::new(),
            )],
        })
    }
}

/// Shifts the entry: `arg` is (delta << 32 | K); outputs the shift as read.
fn index_shift(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(row) = row else {
        return Err(LogicAbort("micro_index_shift needs a writable row"));
    };
    let arg = arg
        .as_int()
        .ok_or(LogicAbort("micro_index_shift takes an integer"))?;
    let (delta, k) = (arg >> 32, (arg & 0xffff_ffff).max(1));
    let old = shift_of(row);
    row.copy_from_slice(&(old + delta).rem_euclid(k).to_le_bytes());
    Ok(Value::Int(old))
}

/// OLLP's second step: the transaction `recon` (a `micro_dep_recon` call) stands for, with its
/// bases shifted by the entry's value the reconnaissance read (its last output).
pub(super) fn after_reconnaissance(
    procs: &Procs,
    shape: &Shape,
    recon: &ProcCall,
    outputs: &[Value],
) -> Result<ProcCall, String> {
    let a = DependentArgs::parse(&recon.args, "micro_dep_recon")?;
    let Some(&Value::Int(v)) = outputs.last() else {
        return Err("micro_dep_recon answered no index entry".into());
    };
    if !(0..i64::from(shape.hot_records)).contains(&v) {
        return Err(format!(
            "index entry {} holds {v}, not a shift below K",
            a.entry
        ));
    }
    let keys = unpack_accesses(a.packed)?.map(|(k, _)| k);
    let shifted = keys.enumerate().map(|(i, k)| match i < a.at {
        true => (k, OP_RMW),
        false => (k + v as u64 * u64::from(shape.stride), OP_RMW),
    });
    let mut packed = Vec::new();
    pack_accesses(&mut packed, shifted);
    Ok(ProcCall {
        proc: procs.checked,
        args: vec![
            Value::Int(a.entry as i64),
            Value::Int(a.at as i64),
            Value::Bytes(packed),
            Value::Int(v),
        ],
    })
}

/// How a generator draws dependent transactions.
pub(super) struct DependentDraw {
    pub fraction: f64,
    /// OLLP (a reconnaissance first) or the lookup in the transaction.
    pub ollp: bool,
    /// Accesses before the lookup.
    pub at: usize,
    pub entries: u64,
    pub procs: Procs,
    /// K, and ranks of hot records, `[0, K)`.
    pub hot_records: u64,
    pub hot: RankChooser,
    /// Cold ranks less K of records before the lookup (the upper half) and of bases after it
    /// (the lower half, less K so that a shift stays inside it).
    pub upper: RankChooser,
    pub lower: RankChooser,
    /// Where the upper half begins, less K.
    pub upper_from: u64,
}

impl DependentDraw {
    /// Whether the next transaction is dependent.
    pub fn draw(&self, rng: &mut Rng) -> bool {
        self.fraction > 0.0 && rng.random::<f64>() < self.fraction
    }

    /// Access `i` of a dependent transaction at partition `p`, the first there if `first`:
    /// a record before the lookup, a base after it.
    pub fn key(
        &self,
        rng: &mut Rng,
        pmap: &PartitionMap,
        i: usize,
        p: PartitionId,
        first: bool,
    ) -> Key {
        let k = self.hot_records;
        let rank = match (i < self.at, first) {
            (true, true) => self.hot.sample(rng),
            (true, false) => k + self.upper_from + self.upper.sample(rng),
            (false, true) => 0,
            (false, false) => k + self.lower.sample(rng),
        };
        pmap.nth_key_of(USERTABLE, p, rank)
    }

    /// The call for `keys`, whose index entry lies in partition `p`.
    pub fn call(
        &self,
        rng: &mut Rng,
        pmap: &PartitionMap,
        p: PartitionId,
        keys: &[Key],
    ) -> ProcCall {
        let entry = pmap.nth_key_of(INDEX, p, rng.random_range(0..self.entries));
        let mut packed = Vec::with_capacity(keys.len() * crate::ycsb::ACCESS_BYTES);
        pack_accesses(&mut packed, keys.iter().map(|&k| (k, OP_RMW)));
        ProcCall {
            proc: match self.ollp {
                true => self.procs.recon,
                false => self.procs.in_transaction,
            },
            args: vec![
                Value::Int(entry as i64),
                Value::Int(self.at as i64),
                Value::Bytes(packed),
            ],
        }
    }
}

/// The updater's stream for one partition: uniformly drawn entries, each moved by a random
/// non-zero shift.
pub(super) struct IndexUpdater {
    pub rng: Rng,
    pub partition: PartitionId,
    pub entries: u64,
    pub hot_records: u64,
    pub pmap: PartitionMap,
    pub proc: ProcId,
}

impl TxnGenerator for IndexUpdater {
    fn next_txn(&mut self) -> TxnCall {
        let entry = self.pmap.nth_key_of(
            INDEX,
            self.partition,
            self.rng.random_range(0..self.entries),
        );
        let delta = 1 + self
            .rng
            .random_range(0..self.hot_records.saturating_sub(1).max(1));
        TxnCall {
            call: ProcCall {
                proc: self.proc,
                args: vec![Value::Int(entry as i64), Value::Int(delta as i64)],
            },
            ops: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::micro::Micro;
    use crate::testing::MemStore;
    use crate::ycsb::ACCESS_BYTES;
    use crate::Workload;
    use qstore_core::config::{DependentLookup, Partitioning};
    use qstore_core::RunConfig;
    use std::collections::{BTreeMap, HashSet};

    fn config(protocol: &str, partitioning: Partitioning) -> RunConfig {
        let mut c = RunConfig::default();
        c.protocol.name = protocol.into();
        c.workload.name = "micro".into();
        c.cluster.nodes = 3;
        c.cluster.partitioning = partitioning;
        let m = &mut c.workload.micro;
        m.records_per_partition = 2000;
        m.contention_index = 0.01;
        m.multi_partition_fraction = 0.5;
        m.partitions_per_mp_txn = 3;
        m.dependent_fraction = 1.0;
        m.index_entries_per_partition = 5;
        m.lookup_position = 0.3;
        c
    }

    fn keys(call: &ProcCall) -> Vec<Key> {
        let Value::Bytes(packed) = &call.args[2] else {
            panic!("packed accesses third: {call:?}");
        };
        packed
            .chunks(ACCESS_BYTES)
            .map(|a| u64::from_le_bytes(a[..8].try_into().unwrap()))
            .collect()
    }

    /// Runs `call` as a client does: with OLLP, the reconnaissance and then the transaction
    /// on its guess. The transaction run, and its outputs.
    fn as_client(w: &Micro, m: &mut MemStore, call: &ProcCall) -> (ProcCall, Vec<Value>) {
        let cat = w.catalog();
        let out = m.run(&cat, call).unwrap();
        if !w.is_reconnaissance(call) {
            return (call.clone(), out);
        }
        let main = w.after_reconnaissance(call, &out).unwrap();
        let out = m.run(&cat, &main).unwrap();
        (main, out)
    }

    #[test]
    fn ollp_and_the_lookup_in_the_transaction_process_the_same_records() {
        for partitioning in [Partitioning::Range, Partitioning::Hash] {
            let inline = Micro::new(&config("dl_detect", partitioning)).unwrap();
            let ollp = Micro::new(&config("calvin", partitioning)).unwrap();
            let (mut a, mut b) = (
                MemStore::loaded(&inline, 0..3),
                MemStore::loaded(&ollp, 0..3),
            );
            let (mut ga, mut gb) = (
                inline.generator(4, PartitionId(1)),
                ollp.generator(4, PartitionId(1)),
            );
            for i in 0..300 {
                let (ca, cb) = (ga.next_txn().call, gb.next_txn().call);
                assert_eq!(ca.proc, inline.dependent.0.in_transaction);
                assert_eq!(cb.proc, ollp.dependent.0.recon);
                let (_, out_a) = as_client(&inline, &mut a, &ca);
                let (main, out_b) = as_client(&ollp, &mut b, &cb);
                assert_eq!(out_a, out_b, "txn {i}: the same reads");
                // The guess's records: distinct, three before the lookup.
                let touched = keys(&main);
                assert_eq!(touched.len(), 10);
                assert_eq!(touched.iter().collect::<HashSet<_>>().len(), 10);
                assert_eq!(touched[..3], keys(&cb)[..3], "records before the lookup");
                // The index changes between transactions, so the guesses differ.
                let update = ProcCall {
                    proc: inline.dependent.0.update,
                    args: vec![main.args[0].clone(), Value::Int(1 + i as i64 % 7)],
                };
                for m in [&mut a, &mut b] {
                    m.run(&inline.catalog(), &update).unwrap();
                }
            }
            let rows = |m: &MemStore| {
                [USERTABLE, INDEX].map(|t| {
                    m.rows(t)
                        .map(|(k, r)| (k, r.to_vec()))
                        .collect::<BTreeMap<_, _>>()
                })
            };
            // Not `assert_eq!`: the tables are too long to print.
            assert!(rows(&a) == rows(&b), "{partitioning:?}: the same database");
        }
    }

    #[test]
    fn a_moved_entry_restarts_the_transaction_and_changes_nothing() {
        let w = Micro::new(&config("qstore", Partitioning::Hash)).unwrap();
        let cat = w.catalog();
        let mut m = MemStore::loaded(&w, 0..3);
        let recon = w.generator(0, PartitionId(0)).next_txn().call;
        let main = w
            .after_reconnaissance(&recon, &m.run(&cat, &recon).unwrap())
            .unwrap();
        let before = m.clone();
        let update = ProcCall {
            proc: w.dependent.0.update,
            args: vec![recon.args[0].clone(), Value::Int(3)],
        };
        m.run(&cat, &update).unwrap();
        let moved = m.clone();
        assert_eq!(m.run(&cat, &main), Err(OLLP_RESTART));
        assert_eq!(
            m.rows(USERTABLE).collect::<Vec<_>>(),
            moved.rows(USERTABLE).collect::<Vec<_>>(),
            "the restarted transaction wrote nothing"
        );
        // A fresh reconnaissance sees the new entry, and its guess holds.
        let main = w
            .after_reconnaissance(&recon, &m.run(&cat, &recon).unwrap())
            .unwrap();
        m.run(&cat, &main).unwrap();
        assert_ne!(
            m.rows(USERTABLE).collect::<Vec<_>>(),
            before.rows(USERTABLE).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_updater_keeps_every_shift_below_k_and_always_moves_it() {
        let mut c = config("calvin", Partitioning::Range);
        c.workload.micro.index_volatility = 10.0;
        let w = Micro::new(&c).unwrap();
        assert_eq!(w.background_rate(), 10.0 * 5.0 * 3.0);
        let cat = w.catalog();
        let mut m = MemStore::loaded(&w, 0..3);
        let mut g = w.background(PartitionId(2)).expect("an updater");
        for _ in 0..500 {
            let call = g.next_txn().call;
            let entry = call.args[0].as_int().unwrap() as u64;
            assert_eq!(w.pmap.partition_of(INDEX, entry), PartitionId(2));
            let old = shift_of(m.get(INDEX, entry));
            m.run(&cat, &call).unwrap();
            let new = shift_of(m.get(INDEX, entry));
            assert_ne!(old, new);
            assert!((0..100).contains(&new), "{new}");
        }
        c.workload.micro.index_volatility = 0.0;
        let still = Micro::new(&c).unwrap();
        assert!(still.background(PartitionId(0)).is_none());
    }

    #[test]
    fn bad_dependent_settings_say_what_is_wrong() {
        let refused = |protocol: &str, f: &dyn Fn(&mut RunConfig)| {
            let mut c = config(protocol, Partitioning::Range);
            f(&mut c);
            c.validate().expect_err("refused")
        };
        let e = refused("calvin", &|c| {
            c.workload.micro.dependent_lookup = DependentLookup::InTransaction
        });
        assert_eq!(e.setting, "workload.micro.dependent_lookup");
        assert!(e.to_string().contains("OLLP"), "{e}");
        let e = refused("dl_detect", &|c| {
            c.workload.micro.records_per_partition = 400
        });
        assert_eq!(e.setting, "workload.micro.records_per_partition");
        let e = refused("dl_detect", &|c| c.workload.micro.index_volatility = 1e9);
        assert!(e.to_string().contains("--index-entries"), "{e}");
        let e = refused("dl_detect", &|c| c.workload.micro.lookup_position = 1.5);
        assert_eq!(e.setting, "workload.micro.lookup_position");
        // OLLP is fine anywhere.
        let mut c = config("dl_detect", Partitioning::Range);
        c.workload.micro.dependent_lookup = DependentLookup::Ollp;
        c.validate().unwrap();
    }
}
