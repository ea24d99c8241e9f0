//! The transaction model.
//!
//! Transactions are deterministic stored procedures. A [`Procedure`], given its arguments,
//! yields a [`Program`]: an ordered list of [`Access`]es to records. Each access names the
//! step function that computes its effect (registered by name in a [`StepRegistry`] on every
//! node), the earlier accesses whose outputs it needs (data dependencies), and whether it may
//! abort the transaction (an integrity check: a logic-induced abort).
//!
//! Deterministic protocols read the whole read/write set from the program up front and split
//! it into fragments; interactive protocols walk it access by access. Programs are plain data
//! (serde), so they and their fragments can cross the network.
//!
//! Two rules hold on every protocol, so that the same request gets the same answer whichever
//! runs it:
//!
//! * a call whose program has no accesses is refused ([`Program::validate`], see
//!   [`EMPTY_PROGRAM`]);
//! * an access that fails (its record does not exist, an insert's key already does, or its
//!   step refuses) aborts the transaction only if it is declared abortable
//!   ([`Access::may_abort`]); otherwise it has no effect and outputs [`Value::Null`]
//!   ([`AccessRef::settle`]).

use crate::ids::{Key, NodeId, TableId, TxnId};
use crate::QError;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A value passed into or produced by a step: a procedure argument, an access argument, or an
/// access output that later accesses depend on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Value {
    #[default]
    Null,
    Int(i64),
    /// Decoded as one buffer, not byte by byte.
    Bytes(#[serde(with = "serde_bytes")] Vec<u8>),
}

impl Value {
    /// The integer inside, or `None` for other kinds.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }
}

/// What an access does to its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AccessKind {
    /// Reads the record; the step sees it read-only.
    Read,
    /// Overwrites the record without reading it (a blind write).
    Write,
    /// Reads and updates the record in place.
    ReadModifyWrite,
    /// Creates the record; the step fills a zeroed row. Aborts (logic) if the key exists.
    Insert,
    /// Removes the record; the step sees it read-only first.
    Delete,
}

impl AccessKind {
    /// Whether the access changes the database (and so conflicts with every other access to
    /// the record).
    pub fn is_write(self) -> bool {
        !matches!(self, AccessKind::Read)
    }
}

/// Index of a registered step function. Ids are assigned in registration order, which is the
/// same on every node; [`StepRegistry::fingerprint`] lets peers check they agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StepId(pub u16);

/// Index of a registered procedure (same rules as [`StepId`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcId(pub u16);

/// One record access of a transaction program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Access {
    pub table: TableId,
    pub key: Key,
    pub kind: AccessKind,
    pub step: StepId,
    /// Argument of the step (e.g. the amount to add).
    pub arg: Value,
    /// Indices of earlier accesses of the same program whose outputs this step needs.
    pub deps: Vec<u16>,
    /// Whether the access may abort the transaction (a logic-induced abort): when its step
    /// refuses, or its record is missing (for an insert: already there). An access that
    /// cannot abort outputs `Null` on such a failure instead ([`AccessRef::settle`]).
    pub may_abort: bool,
    /// For a *derived* access, whose key depends on an earlier access's output (TPC-C's new
    /// order takes its id from the district it updates): how; `key` is then the base.
    pub key_dep: Option<KeyDep>,
}

impl Access {
    /// An access to (`table`, `key`) that cannot abort and has a fixed key: the common kind.
    pub fn plain(
        table: TableId,
        key: Key,
        kind: AccessKind,
        step: StepId,
        arg: Value,
        deps: Vec<u16>,
    ) -> Access {
        Access {
            table,
            key,
            kind,
            step,
            arg,
            deps,
            may_abort: false,
            key_dep: None,
        }
    }
}

/// How a derived access's key follows from an earlier access's output `v` (an integer, or
/// bytes starting with one, 8 bytes little-endian): `key + scale * (v - back)`, for
/// `back <= v < limit` (`back` reaches records before the one `v` names: TPC-C's
/// Stock-Level reads the 20 orders before D_NEXT_O_ID).
///
/// The keys `key .. key + scale * limit` are the access's *derived range*, and its base key
/// `key` names the whole range: protocols that fix their read/write sets before they execute
/// (Q-Store, Calvin) lock or queue the base key, not the derived one, so two derived accesses
/// to one range are ordered by it. That is sound under one rule, which procedures keep: every
/// access to a key of a derived range is a derived access with the same base. The range must
/// also lie within one partition (the base's). Protocols that walk programs access by access
/// lock the derived key itself.
///
/// A derived access may not abort. Its output is `Null` on every protocol unless it
/// declares `output`, and only then may later accesses depend on it. Protocols that run a
/// program at several nodes (Calvin) run a derived access only where its range is and skip
/// it elsewhere: an access whose output nobody sees cannot make them disagree, and one with
/// an output is refused there unless its node is the only one that executes the program
/// (TPC-C's transactions that read derived keys stay within one warehouse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyDep {
    /// The access whose output gives the offset; it must be among the access's `deps`.
    pub dep: u16,
    pub scale: u32,
    pub limit: u32,
    pub back: u32,
    /// Whether the access outputs what its step returns.
    pub output: bool,
}

/// A derived access whose offset is missing or out of its range fails with this.
pub const NO_DERIVED_KEY: LogicAbort = LogicAbort("derived key out of range");

impl KeyDep {
    /// The key from `base` and the outputs so far, if the offset is in range.
    #[inline]
    pub fn key(self, base: Key, outputs: &[Value]) -> Option<Key> {
        let v = match outputs.get(self.dep as usize)? {
            Value::Int(v) => *v,
            Value::Bytes(b) => i64::from_le_bytes(b.get(..8)?.try_into().ok()?),
            Value::Null => return None,
        };
        let v = u64::try_from(v).ok().filter(|&v| v < self.limit as u64)?;
        let v = v.checked_sub(self.back as u64)?;
        base.checked_add(v * self.scale as u64)
            .filter(|&k| k <= crate::MAX_KEY)
    }
}

/// An access as the storage layer runs it, borrowed from wherever the protocol keeps it (an
/// [`Access`] of a program, or a protocol's own compact record).
#[derive(Clone, Copy, Debug)]
pub struct AccessRef<'a> {
    pub table: TableId,
    pub key: Key,
    pub kind: AccessKind,
    pub step: StepId,
    pub arg: &'a Value,
    pub deps: &'a [u16],
    /// Whether a failure of the access aborts the transaction (see [`AccessRef::settle`]).
    pub may_abort: bool,
    /// A derived access not yet resolved ([`AccessRef::resolve`]).
    pub key_dep: Option<KeyDep>,
    /// A derived access already resolved: `key` is the derived key.
    pub derived: bool,
    /// Whether the access outputs what its step returns: false only for a resolved derived
    /// access that does not declare an output ([`KeyDep::output`]).
    pub output: bool,
}

impl Access {
    pub fn as_ref(&self) -> AccessRef<'_> {
        AccessRef {
            table: self.table,
            key: self.key,
            kind: self.kind,
            step: self.step,
            arg: &self.arg,
            deps: &self.deps,
            may_abort: self.may_abort,
            key_dep: self.key_dep,
            derived: false,
            output: true,
        }
    }
}

impl<'a> AccessRef<'a> {
    /// The access with its key resolved: a derived access's key computed from `outputs`
    /// ([`KeyDep`]), or `Err` ([`NO_DERIVED_KEY`]) when it cannot be. Every protocol runs an
    /// access through here before it locks or looks up its record.
    #[inline]
    pub fn resolve(self, outputs: &[Value]) -> Result<AccessRef<'a>, LogicAbort> {
        match self.key_dep {
            None => Ok(self),
            Some(d) => match d.key(self.key, outputs) {
                Some(key) => Ok(AccessRef {
                    key,
                    key_dep: None,
                    derived: true,
                    output: d.output,
                    ..self
                }),
                None => Err(NO_DERIVED_KEY),
            },
        }
    }

    /// What a failure of this access (`result` an error: its record does not exist, an
    /// insert's key already does, or its step refused) means for the transaction: an abort
    /// if the access is declared abortable, otherwise nothing: the access outputs `Null` and
    /// the transaction goes on. Every protocol runs accesses through here (storage does it in
    /// `qstore_engine::exec::run_access`), so they all answer a request the same way.
    ///
    /// Why not abort on every failure: a procedure that declares an access cannot abort lets
    /// the engines skip what aborting it would need. Q-Store sends no verdicts and keeps no
    /// before-images or held records for it, and the serial and Calvin executors keep no undo
    /// log for a program none of whose accesses may abort; aborting such a program halfway
    /// could not be undone. A failed access that cannot abort is what a SQL `UPDATE` or
    /// `SELECT` of a missing row is: zero rows affected, and the transaction commits. An
    /// integrity check that needs the record (a debit of an account) declares its access
    /// abortable and then aborts with the record's absence (`"key not found"`).
    ///
    /// A resolved derived access without an output outputs `Null` whatever its step returned
    /// ([`KeyDep`]).
    #[inline]
    pub fn settle(&self, result: Result<Value, LogicAbort>) -> Result<Value, LogicAbort> {
        match result {
            Err(_) if !self.may_abort => Ok(Value::Null),
            Ok(_) if !self.output => Ok(Value::Null),
            result => result,
        }
    }
}

/// Why a call whose program has no accesses is refused (by [`Program::validate`], so by
/// every protocol, where it builds the program).
///
/// Refused rather than committed at once: such a call is almost surely a client's mistake
/// (an empty argument list), and a transaction that touches no record has no place in a
/// deterministic protocol's schedule. Q-Store places accesses in execution queues and answers
/// a batch when the nodes holding its queues acknowledge them; a transaction with no access
/// is in no queue, so a batch of only such transactions would wait for acknowledgements that
/// never come. Refusing it where every protocol builds programs decides it in one place,
/// before any protocol's machinery sees it.
pub const EMPTY_PROGRAM: &str = "the call produced a transaction with no record accesses";

/// A record an access needs does not exist: the abort of an abortable access to it.
pub const KEY_NOT_FOUND: LogicAbort = LogicAbort("key not found");
/// An insert's key exists already.
pub const DUPLICATE_KEY: LogicAbort = LogicAbort("duplicate key");
/// An insert found its table full (its capacity is set by the workload's configuration).
pub const TABLE_FULL: LogicAbort = LogicAbort("cannot insert: table full or key reserved");

/// The ordered accesses of one transaction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub accesses: Vec<Access>,
}

impl Program {
    /// Whether any access may abort the transaction (protocols keep undo images only then).
    pub fn may_abort(&self) -> bool {
        self.accesses.iter().any(|a| a.may_abort)
    }

    /// Checks, in one pass, the rules every protocol relies on: at least one and at most
    /// `u16::MAX` accesses, tables among the first `tables`, no reserved keys, dependencies
    /// on earlier accesses only, and accesses that may abort only when `may_abort` (the
    /// procedure's promise). Procedures build programs from untrusted arguments, so this is
    /// enforced.
    pub fn validate(&self, tables: usize, may_abort: bool) -> Result<(), String> {
        if self.accesses.is_empty() {
            return Err(EMPTY_PROGRAM.into());
        }
        if self.accesses.len() > u16::MAX as usize {
            return Err(format!(
                "{} accesses (at most {})",
                self.accesses.len(),
                u16::MAX
            ));
        }
        for (i, a) in self.accesses.iter().enumerate() {
            if a.table as usize >= tables {
                return Err(format!("table {} does not exist", a.table));
            }
            if a.key > crate::MAX_KEY {
                return Err(format!(
                    "access {i}: key {} is reserved (keys go up to {})",
                    a.key,
                    crate::MAX_KEY
                ));
            }
            if let Some(d) = a.deps.iter().find(|&&d| d as usize >= i) {
                return Err(format!(
                    "access {i} depends on access {d}, which is not earlier"
                ));
            }
            if let Some(d) = a.key_dep {
                if !a.deps.contains(&d.dep) {
                    return Err(format!(
                        "access {i}: its key depends on access {}, which is not among its dependencies",
                        d.dep
                    ));
                }
                if a.may_abort {
                    return Err(format!(
                        "access {i}: an access with a derived key may not abort"
                    ));
                }
            }
            if let Some(d) = a
                .deps
                .iter()
                .find(|&&d| self.accesses[d as usize].key_dep.is_some_and(|k| !k.output))
            {
                return Err(format!(
                    "access {i} depends on access {d}, whose key is derived and which declares \
                     no output"
                ));
            }
            if a.may_abort && !may_abort {
                return Err(
                    "the program has an access that may abort, but the procedure declares it never aborts"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

/// A logic-induced abort raised by a step: the same on every replica and never retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicAbort(pub &'static str);

/// The record as a step sees it.
pub enum RowRef<'a> {
    /// Read-only view (Read and Delete accesses).
    Read(&'a [u8]),
    /// Writable view (Write, ReadModifyWrite and Insert accesses).
    Write(&'a mut [u8]),
}

impl RowRef<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            RowRef::Read(b) => b,
            RowRef::Write(b) => b,
        }
    }
}

/// Outputs of earlier accesses that a step depends on, in the order of [`Access::deps`].
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    outputs: &'a [Value],
    deps: &'a [u16],
}

impl<'a> Inputs<'a> {
    /// `outputs` is indexed by access index; entries a step does not depend on may be `Null`.
    pub fn new(outputs: &'a [Value], deps: &'a [u16]) -> Self {
        Inputs { outputs, deps }
    }

    pub fn len(&self) -> usize {
        self.deps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deps.is_empty()
    }

    /// The output of the `i`-th dependency (Null if the access has fewer, so a step never
    /// panics on a program that declares fewer dependencies than it expects).
    pub fn get(&self, i: usize) -> &'a Value {
        self.deps
            .get(i)
            .and_then(|&d| self.outputs.get(d as usize))
            .unwrap_or(&Value::Null)
    }
}

/// A step function: computes the effect of one access on its record and returns the access's
/// output. Steps must be deterministic functions of (row, arg, inputs).
pub type StepFn = fn(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort>;

/// Step functions by name and id.
#[derive(Default)]
pub struct StepRegistry {
    names: Vec<&'static str>,
    fns: Vec<StepFn>,
    by_name: FxHashMap<&'static str, StepId>,
}

impl StepRegistry {
    /// Registers `f` under `name` (idempotent for the same name) and returns its id.
    pub fn register(&mut self, name: &'static str, f: StepFn) -> StepId {
        if let Some(&id) = self.by_name.get(name) {
            return id;
        }
        let id = StepId(self.fns.len() as u16);
        self.names.push(name);
        self.fns.push(f);
        self.by_name.insert(name, id);
        id
    }

    pub fn id(&self, name: &str) -> Option<StepId> {
        self.by_name.get(name).copied()
    }

    pub fn name(&self, id: StepId) -> Option<&'static str> {
        self.names.get(id.0 as usize).copied()
    }

    /// Runs access `a` on `row`, with `outputs` holding the outputs of earlier accesses.
    #[inline]
    pub fn run(
        &self,
        a: AccessRef<'_>,
        row: RowRef<'_>,
        outputs: &[Value],
    ) -> Result<Value, LogicAbort> {
        match self.fns.get(a.step.0 as usize) {
            Some(f) => f(row, a.arg, Inputs::new(outputs, a.deps)),
            None => Err(LogicAbort("unknown step function")),
        }
    }

    /// Hash of the registered names in order; peers with different registries must not talk.
    pub fn fingerprint(&self) -> u64 {
        names_fingerprint(&self.names)
    }
}

/// A stored procedure: turns arguments into a program.
pub trait Procedure: Send + Sync {
    fn name(&self) -> &'static str;
    /// Builds the program; bad arguments are an error (reported to the client), never a panic.
    fn program(&self, args: &[Value]) -> Result<Program, String>;
    /// Builds the program into `out`, replacing what it held and reusing its memory where the
    /// procedure can: engines that plan many transactions call this with one buffer.
    fn program_into(&self, args: &[Value], out: &mut Program) -> Result<(), String> {
        *out = self.program(args)?;
        Ok(())
    }
    /// Whether its programs may contain accesses that may abort. Speculative engines track
    /// undecided writes only for catalogs where some procedure may abort, so a procedure that
    /// says no is held to it (its programs with abortable accesses are refused).
    fn may_abort(&self) -> bool {
        true
    }
}

/// The schema of one table: fixed-size rows keyed by a 64-bit primary key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSchema {
    pub name: String,
    pub row_size: usize,
    /// Rows a partition can hold (initial rows plus room for inserts).
    pub capacity_per_partition: usize,
    /// Width of a partition's key range under range partitioning: key / width = partition.
    pub keys_per_partition: u64,
    /// Declared read-mostly by its workload: rarely or never written (TPC-C's ITEM). Sundial
    /// extends such a table's leases all at once (its paper's section 4.3); writes to it stay
    /// correct, only dearer.
    #[serde(default)]
    pub read_mostly: bool,
}

/// Everything a node must know to run a workload's transactions: tables, steps, procedures.
/// Built identically on every node.
#[derive(Default)]
pub struct Catalog {
    pub tables: Vec<TableSchema>,
    pub steps: StepRegistry,
    procs: Vec<Arc<dyn Procedure>>,
    proc_by_name: FxHashMap<&'static str, ProcId>,
}

impl Catalog {
    pub fn add_table(&mut self, schema: TableSchema) -> TableId {
        self.tables.push(schema);
        (self.tables.len() - 1) as TableId
    }

    pub fn add_procedure(&mut self, p: Arc<dyn Procedure>) -> ProcId {
        let id = ProcId(self.procs.len() as u16);
        self.proc_by_name.insert(p.name(), id);
        self.procs.push(p);
        id
    }

    pub fn procedure_id(&self, name: &str) -> Option<ProcId> {
        self.proc_by_name.get(name).copied()
    }

    pub fn procedure(&self, id: ProcId) -> Option<&dyn Procedure> {
        self.procs.get(id.0 as usize).map(|p| p.as_ref())
    }

    /// Builds and validates the program of a call; unknown procedures and bad arguments are
    /// errors for the client.
    pub fn program(&self, call: &ProcCall) -> Result<Program, QError> {
        let mut program = Program::default();
        self.program_into(call, &mut program)?;
        Ok(program)
    }

    /// [`Catalog::program`] into `out`, reusing its memory.
    pub fn program_into(&self, call: &ProcCall, out: &mut Program) -> Result<(), QError> {
        let proc = self
            .procedure(call.proc)
            .ok_or_else(|| QError::UnknownProcedure(format!("#{}", call.proc.0)))?;
        let bad = |why: String| QError::BadArguments {
            proc: proc.name().to_string(),
            why,
        };
        proc.program_into(&call.args, out).map_err(bad)?;
        out.validate(self.tables.len(), proc.may_abort())
            .map_err(bad)
    }

    /// Whether some procedure's programs may abort.
    pub fn may_abort(&self) -> bool {
        self.procs.iter().any(|p| p.may_abort())
    }

    /// Hash of tables, steps and procedures; equal catalogs have equal fingerprints.
    pub fn fingerprint(&self) -> u64 {
        let mut names: Vec<&str> = self.tables.iter().map(|t| t.name.as_str()).collect();
        names.extend(self.procs.iter().map(|p| p.name()));
        names_fingerprint(&names) ^ self.steps.fingerprint().rotate_left(17)
    }
}

fn names_fingerprint(names: &[&str]) -> u64 {
    let joined = names.join("\u{1f}");
    xxhash_rust::xxh3::xxh3_64(joined.as_bytes())
}

/// Where a workload puts its initial rows; implemented by storage. Workloads see only this,
/// so they depend on the core crate alone.
pub trait RowLoader {
    /// Inserts every key of `keys` into `table`, filling each row with `fill(key, row)`.
    fn load_rows(
        &mut self,
        table: TableId,
        keys: &mut dyn Iterator<Item = Key>,
        fill: &mut dyn FnMut(Key, &mut [u8]),
    ) -> Result<(), QError>;
}

/// A call of a stored procedure by id with arguments: what a client sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcCall {
    pub proc: ProcId,
    pub args: Vec<Value>,
}

/// Why a concurrency-control protocol aborted a transaction (retried by the client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CcAbortCause {
    /// A lock or version was held by another transaction (NO_WAIT, OCC, ...).
    Conflict,
    /// WAIT_DIE: a younger transaction met an older lock holder.
    WaitDie,
    /// A deadlock was detected and this transaction was chosen as the victim.
    Deadlock,
    /// Validation failed at commit (OCC, MaaT, Sundial).
    Validation,
    /// A timestamp-ordering rule was violated (TIMESTAMP, MVCC).
    TimestampOrder,
    /// A participant voted no in two-phase commit.
    RemoteAbort,
    /// The node's admission queue was full.
    Overload,
    /// Speculative execution: it touched a write of a transaction that then aborted.
    Cascade,
    /// MVCC: the version the transaction's timestamp must read was already reclaimed.
    VersionReclaimed,
    /// MaaT: the transaction had to follow one validated with no upper bound (`[x, inf)`),
    /// whose range is frozen.
    FrozenRange,
    /// MaaT: its commit-timestamp ranges left no timestamp (other conflicts).
    RangeEmpty,
    /// OLLP: the keys its reconnaissance read had changed by the time it ran (counted by the
    /// client, which restarts it with a fresh reconnaissance; see [`OLLP_RESTART`]).
    OllpRestart,
    /// Sundial, case (a) of its figure 6: a lease it must renew is of a version since
    /// replaced by one written at or after its commit timestamp.
    LeaseNewerVersion,
    /// Sundial, case (b): the version it read was replaced before its commit timestamp.
    LeaseOverwritten,
    /// Sundial, case (c): the lease cannot be extended while another transaction holds the
    /// row's lock.
    LeaseLocked,
    /// Throttling: the node was falling behind and refused a single-partition transaction,
    /// to serve the distributed ones others wait for (the determinism study's figure 5b).
    Throttled,
}

/// The logic abort of a transaction whose reconnaissance guess turned out wrong when it ran
/// (OLLP): deterministic like every logic abort, but the client restarts the transaction
/// from a fresh reconnaissance and counts it as [`CcAbortCause::OllpRestart`].
pub const OLLP_RESTART: LogicAbort = LogicAbort("ollp restart: the reconnaissance is stale");

impl CcAbortCause {
    pub fn name(self) -> &'static str {
        match self {
            CcAbortCause::Conflict => "conflict",
            CcAbortCause::WaitDie => "wait_die",
            CcAbortCause::Deadlock => "deadlock",
            CcAbortCause::Validation => "validation",
            CcAbortCause::TimestampOrder => "timestamp_order",
            CcAbortCause::RemoteAbort => "remote_abort",
            CcAbortCause::Overload => "overload",
            CcAbortCause::Cascade => "cascade",
            CcAbortCause::VersionReclaimed => "version_reclaimed",
            CcAbortCause::FrozenRange => "frozen_range",
            CcAbortCause::RangeEmpty => "range_empty",
            CcAbortCause::OllpRestart => "ollp_restart",
            CcAbortCause::LeaseNewerVersion => "lease_newer_version",
            CcAbortCause::LeaseOverwritten => "lease_overwritten",
            CcAbortCause::LeaseLocked => "lease_locked",
            CcAbortCause::Throttled => "throttled",
        }
    }
}

/// The final answer to one transaction attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TxnOutcome {
    /// Committed; the outputs of the program's accesses in order.
    Committed(Vec<Value>),
    /// Aborted by the program's own integrity check; not retried.
    LogicAbort(String),
    /// Aborted by concurrency control; the client retries after back-off.
    CcAbort(CcAbortCause),
    /// The request was refused (unknown procedure, bad arguments, shutting down).
    Rejected(String),
    /// The server does not lead the replica group of the transaction's home partition (it
    /// lost the leadership, or never had it), and did not run the transaction. The client
    /// resubmits it, with the same [`TxnKey`], to `leader` (when the server knows it) or
    /// after a short wait: a replicated cluster answers a transaction it already ran with
    /// the original outcome instead of running it twice.
    NotLeader { leader: Option<NodeId> },
    /// The client lost its connection to the server after it sent the request: the
    /// transaction may or may not have committed (a cluster with data directories keeps it
    /// if it did). Only clients answer this; a server never sends it.
    Unknown(String),
}

/// The client's name for one attempt at a transaction: the same on every resubmission after
/// a [`TxnOutcome::NotLeader`] answer or a lost connection, and new for each attempt after an
/// abort. `session` tells clients apart (a random number per client process), `seq` the
/// attempts of one client. A key of zeros names nothing (no deduplication).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TxnKey {
    pub session: u64,
    pub seq: u64,
}

impl TxnKey {
    pub fn is_none(&self) -> bool {
        self.session == 0 && self.seq == 0
    }

    /// A session number no other client process is likely to draw (from the operating
    /// system's randomness, through std's hasher keys); never 0.
    pub fn new_session() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() | 1
    }
}

/// A response to a client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TxnResponse {
    pub id: TxnId,
    pub outcome: TxnOutcome,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
        let RowRef::Write(b) = row else {
            return Err(LogicAbort("read-only"));
        };
        let base = if inputs.is_empty() {
            0
        } else {
            inputs.get(0).as_int().unwrap_or(0)
        };
        let v = i64::from_le_bytes(b[..8].try_into().unwrap()) + arg.as_int().unwrap_or(0) + base;
        b[..8].copy_from_slice(&v.to_le_bytes());
        Ok(Value::Int(v))
    }

    #[test]
    fn steps_run_with_dependencies() {
        let mut reg = StepRegistry::default();
        let id = reg.register("add", add);
        assert_eq!(reg.register("add", add), id);
        let a = Access {
            table: 0,
            key: 1,
            kind: AccessKind::ReadModifyWrite,
            step: id,
            arg: Value::Int(5),
            deps: vec![0],
            may_abort: false,
            key_dep: None,
        };
        let mut row = [0u8; 8];
        let out = reg
            .run(a.as_ref(), RowRef::Write(&mut row), &[Value::Int(10)])
            .unwrap();
        assert_eq!(out, Value::Int(15));
    }

    #[test]
    fn forward_dependencies_are_rejected() {
        let a = Access {
            table: 0,
            key: 1,
            kind: AccessKind::Read,
            step: StepId(0),
            arg: Value::Null,
            deps: vec![0],
            may_abort: false,
            key_dep: None,
        };
        let p = Program { accesses: vec![a] };
        assert!(p.validate(1, true).is_err());
    }

    #[test]
    fn derived_keys_name_their_dependency_and_only_declared_outputs_are_depended_on() {
        let plain = |deps: Vec<u16>, key_dep| Access {
            table: 0,
            key: 100,
            kind: AccessKind::Insert,
            step: StepId(0),
            arg: Value::Null,
            deps,
            may_abort: false,
            key_dep,
        };
        let d = KeyDep {
            dep: 0,
            scale: 16,
            limit: 4,
            back: 0,
            output: false,
        };
        let dep = Some(d);
        let ok = Program {
            accesses: vec![plain(vec![], None), plain(vec![0], dep)],
        };
        assert_eq!(ok.validate(1, true), Ok(()));
        let unnamed = Program {
            accesses: vec![plain(vec![], None), plain(vec![], dep)],
        };
        assert!(unnamed.validate(1, true).unwrap_err().contains("not among"));
        let mut abortable = ok.clone();
        abortable.accesses[1].may_abort = true;
        assert!(abortable
            .validate(1, true)
            .unwrap_err()
            .contains("may not abort"));
        let mut leaf = ok.clone();
        leaf.accesses.push(plain(vec![1], None));
        assert!(leaf.validate(1, true).unwrap_err().contains("no output"));
        leaf.accesses[1].key_dep = Some(KeyDep { output: true, ..d });
        assert_eq!(leaf.validate(1, true), Ok(()));
        // key = base + scale * output, for outputs in 0..limit, from ints or leading bytes.
        assert_eq!(d.key(100, &[Value::Int(3)]), Some(148));
        let mut bytes = 2i64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"name");
        assert_eq!(d.key(100, &[Value::Bytes(bytes)]), Some(132));
        for bad in [
            Value::Int(4),
            Value::Int(-1),
            Value::Null,
            Value::Bytes(vec![1]),
        ] {
            assert_eq!(d.key(100, std::slice::from_ref(&bad)), None, "{bad:?}");
        }
        let a = ok.accesses[1].as_ref();
        let r = a.resolve(&[Value::Int(1)]).unwrap();
        assert_eq!((r.key, r.derived, r.key_dep), (116, true, None));
        assert_eq!(r.settle(Ok(Value::Int(7))), Ok(Value::Null));
        assert_eq!(a.resolve(&[Value::Null]).unwrap_err(), NO_DERIVED_KEY);
        let out = leaf.accesses[1].as_ref().resolve(&[Value::Int(1)]).unwrap();
        assert_eq!(out.settle(Ok(Value::Int(7))), Ok(Value::Int(7)));
        // Counting back: key = base + scale * (output - back), for back <= output < limit.
        let back = KeyDep { back: 2, ..d };
        assert_eq!(back.key(100, &[Value::Int(3)]), Some(116));
        assert_eq!(back.key(100, &[Value::Int(2)]), Some(100));
        assert_eq!(back.key(100, &[Value::Int(1)]), None);
    }

    #[test]
    fn programs_without_accesses_are_refused() {
        let err = Program::default().validate(1, true).unwrap_err();
        assert_eq!(err, EMPTY_PROGRAM);
    }

    #[test]
    fn only_accesses_that_may_abort_abort_on_failure() {
        let mut a = Access {
            table: 0,
            key: 1,
            kind: AccessKind::ReadModifyWrite,
            step: StepId(0),
            arg: Value::Null,
            deps: vec![],
            may_abort: false,
            key_dep: None,
        };
        assert_eq!(a.as_ref().settle(Err(KEY_NOT_FOUND)), Ok(Value::Null));
        assert_eq!(a.as_ref().settle(Ok(Value::Int(3))), Ok(Value::Int(3)));
        a.may_abort = true;
        assert_eq!(a.as_ref().settle(Err(KEY_NOT_FOUND)), Err(KEY_NOT_FOUND));
    }

    #[test]
    fn validation_checks_tables_and_the_procedures_abort_promise() {
        let a = Access {
            table: 1,
            key: 1,
            kind: AccessKind::Read,
            step: StepId(0),
            arg: Value::Null,
            deps: vec![],
            may_abort: true,
            key_dep: None,
        };
        let p = Program { accesses: vec![a] };
        assert_eq!(p.validate(2, true), Ok(()));
        let no_table = p.validate(1, true).unwrap_err();
        assert!(no_table.contains("table 1 does not exist"), "{no_table}");
        let broken_promise = p.validate(2, false).unwrap_err();
        assert!(broken_promise.contains("never aborts"), "{broken_promise}");
    }
}
