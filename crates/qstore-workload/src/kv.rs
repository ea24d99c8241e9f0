//! A key-value store of byte-string keys and values: what the Redis port runs on.
//!
//! # Buckets
//!
//! Records have fixed sizes and 64-bit keys, so a byte-string key is hashed (xxh3) to a
//! *bucket*: partition `h % partitions`, slot `(h / partitions) % buckets_per_partition`. A
//! bucket is one record holding every entry that hashes to it, key beside value, so two
//! keys that share a bucket never mix: a lookup compares the whole key. Layout
//! (`bucket_bytes`): a u64 version, a u32 count of used bytes, then entries
//! `[key len u16][value len u32][key][value]`, all little-endian. A write that does not fit
//! in its bucket's free space fails with an error reply, and changes nothing.
//!
//! The version counts the bucket's changes: `WATCH` reads it, and `EXEC` checks it is still
//! the same (an abortable access), so a watched key counts as changed when another key of its
//! bucket changed too (a false conflict, never a missed one).
//!
//! # Transactions
//!
//! One procedure, `kv_txn`, runs any list of single-key operations ([`Op`]) as one
//! transaction. [`KvTxnBuilder`] groups them by bucket (one access each, in the order of
//! first use: a read if every operation on it reads, a read-modify-write otherwise), and
//! spreads the bucket's [`Reply`]s back over the operations in their order. Operations on
//! different keys commute, so running each bucket's in order is running them all in order.

use crate::{ScanFn, Tally, TxnCall, TxnGenerator, Workload};
use qstore_core::config::KvConfig;
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, LogicAbort, ProcCall, ProcId, Procedure, Program,
    RowLoader, RowRef, StepId, TableSchema, Value,
};
use qstore_core::{ConfigError, Key, PartitionId, QError, RunConfig, TableId};
use rand::Rng as _;
use rustc_hash::FxHashMap;
use std::io::Write as _;
use std::sync::Arc;

/// The only table: buckets.
pub const BUCKETS: TableId = 0;
/// Bytes before a bucket's entries: version (u64) and used bytes (u32).
const HEADER: usize = 12;
/// Bytes of an entry besides its key and value.
const ENTRY_HEADER: usize = 6;
/// Longest key (its length is a u16).
pub const MAX_KEY: usize = u16::MAX as usize;

/// A single-key operation (or a bucket check for `WATCH`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Get(Vec<u8>),
    /// Sets the value; with `nx` only if the key is absent, with `xx` only if present. With
    /// `whole`, a value that does not fit in the bucket aborts the transaction (MSET sets
    /// every key or none) instead of answering an error.
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
        nx: bool,
        xx: bool,
        whole: bool,
    },
    Del(Vec<u8>),
    Exists(Vec<u8>),
    IncrBy(Vec<u8>, i64),
    Append(Vec<u8>, Vec<u8>),
    Strlen(Vec<u8>),
    /// The version of the key's bucket (what `WATCH` remembers).
    Version(Vec<u8>),
    /// Aborts the transaction unless the key's bucket still has this version.
    Check(Vec<u8>, u64),
    /// The number of keys in a bucket (placed by [`KvTxnBuilder::count_all`]; it has no key).
    Count,
}

impl Op {
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Get(k)
            | Op::Set { key: k, .. }
            | Op::Del(k)
            | Op::Exists(k)
            | Op::IncrBy(k, _)
            | Op::Append(k, _)
            | Op::Strlen(k)
            | Op::Version(k)
            | Op::Check(k, _) => k,
            Op::Count => &[],
        }
    }

    fn writes(&self) -> bool {
        matches!(
            self,
            Op::Set { .. } | Op::Del(_) | Op::IncrBy(..) | Op::Append(..)
        )
    }

    /// Bytes [`Op::encode`] appends.
    fn encoded_len(&self) -> usize {
        let extra = match self {
            Op::Set { value, .. } => 1 + 4 + value.len(),
            Op::IncrBy(..) | Op::Check(..) => 8,
            Op::Append(_, value) => 4 + value.len(),
            _ => 0,
        };
        1 + 2 + self.key().len() + extra
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let (code, key) = match self {
            Op::Get(k) => (1, k),
            Op::Set { key, .. } => (2, key),
            Op::Del(k) => (3, k),
            Op::Exists(k) => (4, k),
            Op::IncrBy(k, _) => (5, k),
            Op::Append(k, _) => (6, k),
            Op::Strlen(k) => (7, k),
            Op::Version(k) => (8, k),
            Op::Check(k, _) => (9, k),
            Op::Count => (10, &Vec::new()),
        };
        out.push(code);
        put_bytes16(out, key);
        match self {
            Op::Set {
                value,
                nx,
                xx,
                whole,
                ..
            } => {
                out.push(*nx as u8 | (*xx as u8) << 1 | (*whole as u8) << 2);
                put_bytes32(out, value);
            }
            Op::IncrBy(_, by) => out.extend_from_slice(&by.to_le_bytes()),
            Op::Append(_, value) => put_bytes32(out, value),
            Op::Check(_, version) => out.extend_from_slice(&version.to_le_bytes()),
            _ => {}
        }
    }

    fn decode(r: &mut Reader<'_>) -> Option<Op> {
        let code = r.u8()?;
        let key = r.bytes16()?.to_vec();
        Some(match code {
            1 => Op::Get(key),
            2 => {
                let flags = r.u8()?;
                Op::Set {
                    key,
                    nx: flags & 1 != 0,
                    xx: flags & 2 != 0,
                    whole: flags & 4 != 0,
                    value: r.bytes32()?.to_vec(),
                }
            }
            3 => Op::Del(key),
            4 => Op::Exists(key),
            5 => Op::IncrBy(key, r.u64()? as i64),
            6 => Op::Append(key, r.bytes32()?.to_vec()),
            7 => Op::Strlen(key),
            8 => Op::Version(key),
            9 => Op::Check(key, r.u64()?),
            10 => Op::Count,
            _ => return None,
        })
    }
}

/// What an operation answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Ok,
    Int(i64),
    Bulk(Vec<u8>),
    /// An error reply, as Redis words it (`ERR ...`, `OOM ...`).
    Err(String),
}

impl Reply {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Nil => out.push(0),
            Reply::Ok => out.push(1),
            Reply::Int(v) => {
                out.push(2);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Reply::Bulk(b) => {
                out.push(3);
                put_bytes32(out, b);
            }
            Reply::Err(e) => {
                out.push(4);
                put_bytes32(out, e.as_bytes());
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Option<Reply> {
        Some(match r.u8()? {
            0 => Reply::Nil,
            1 => Reply::Ok,
            2 => Reply::Int(r.u64()? as i64),
            3 => Reply::Bulk(r.bytes32()?.to_vec()),
            4 => Reply::Err(String::from_utf8_lossy(r.bytes32()?).into_owned()),
            _ => return None,
        })
    }
}

fn put_bytes16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads little-endian fields; `None` past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }

    fn bytes16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }

    fn bytes32(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An entry's place in its bucket: where it starts, and its key and value.
struct Entry<'a> {
    at: usize,
    key: &'a [u8],
    value: &'a [u8],
}

impl Entry<'_> {
    fn len(&self) -> usize {
        ENTRY_HEADER + self.key.len() + self.value.len()
    }
}

/// A bucket's entries, read in place (no allocation on the step's path).
struct Entries<'a> {
    /// The bucket's used bytes.
    used: &'a [u8],
    /// Where the next entry starts in `used`.
    pos: usize,
    /// An entry (or the header) did not parse: iteration stopped there.
    corrupt: bool,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        if self.pos == self.used.len() || self.corrupt {
            return None;
        }
        let mut r = Reader(&self.used[self.pos..]);
        let parsed = (|| {
            let klen = r.u16()? as usize;
            let vlen = r.u32()? as usize;
            Some((r.take(klen)?, r.take(vlen)?))
        })();
        let Some((key, value)) = parsed else {
            self.corrupt = true;
            return None;
        };
        let entry = Entry {
            at: HEADER + self.pos,
            key,
            value,
        };
        self.pos += entry.len();
        Some(entry)
    }
}

/// Reads and changes one bucket's bytes.
struct Bucket;

impl Bucket {
    fn version(row: &[u8]) -> u64 {
        u64::from_le_bytes(row[..8].try_into().expect("buckets have a header"))
    }

    fn used(row: &[u8]) -> usize {
        u32::from_le_bytes(row[8..12].try_into().expect("buckets have a header")) as usize
    }

    /// The bucket's entries in order, read in place. Stops at the first that does not parse
    /// (see [`Entries::corrupt`]).
    fn iter(row: &[u8]) -> Entries<'_> {
        let used = row.get(8..12).map_or(usize::MAX, |_| Self::used(row));
        match row.get(HEADER..HEADER.saturating_add(used)) {
            Some(used) => Entries {
                used,
                pos: 0,
                corrupt: false,
            },
            None => Entries {
                used: &[],
                pos: 0,
                corrupt: true,
            },
        }
    }

    /// Whether the bytes are a bucket: a header, and entries that fill exactly the used
    /// bytes, all within the row.
    fn valid(row: &[u8]) -> bool {
        let mut entries = Self::iter(row);
        entries.by_ref().for_each(drop);
        !entries.corrupt
    }

    /// The bucket's entries; `None` if its bytes are not a valid bucket.
    fn entries(row: &[u8]) -> Option<Vec<Entry<'_>>> {
        let mut iter = Self::iter(row);
        let entries: Vec<Entry<'_>> = iter.by_ref().collect();
        (!iter.corrupt).then_some(entries)
    }

    fn find<'a>(row: &'a [u8], key: &[u8]) -> Option<Entry<'a>> {
        Self::iter(row).find(|e| e.key == key)
    }

    fn get(row: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        Self::find(row, key).map(|e| e.value.to_vec())
    }

    /// Removes `key`'s entry; whether there was one.
    fn remove(row: &mut [u8], key: &[u8]) -> bool {
        let Some((at, len)) = Self::find(row, key).map(|e| (e.at, e.len())) else {
            return false;
        };
        let end = HEADER + Self::used(row);
        row.copy_within(at + len..end, at);
        row[end - len..end].fill(0);
        Self::set_used(row, end - len - HEADER);
        true
    }

    /// Sets `key` to `value`, or fails (changing nothing) when it does not fit.
    fn put(row: &mut [u8], key: &[u8], value: &[u8]) -> Result<(), Reply> {
        let old = Self::find(row, key).map_or(0, |e| e.len());
        let need = ENTRY_HEADER + key.len() + value.len();
        let free = row.len() - HEADER - Self::used(row) + old;
        if need > free {
            return Err(Reply::Err(format!(
                "OOM the key's bucket has {free} bytes free and the entry needs {need} \
                 (workload.kv.bucket_bytes = {})",
                row.len()
            )));
        }
        Self::remove(row, key);
        let at = HEADER + Self::used(row);
        let (klen, vlen) = (key.len(), value.len());
        row[at..at + 2].copy_from_slice(&(klen as u16).to_le_bytes());
        row[at + 2..at + ENTRY_HEADER].copy_from_slice(&(vlen as u32).to_le_bytes());
        row[at + ENTRY_HEADER..at + ENTRY_HEADER + klen].copy_from_slice(key);
        row[at + ENTRY_HEADER + klen..at + need].copy_from_slice(value);
        Self::set_used(row, at + need - HEADER);
        Ok(())
    }

    fn set_used(row: &mut [u8], used: usize) {
        row[8..12].copy_from_slice(&(used as u32).to_le_bytes());
    }

    fn bump(row: &mut [u8]) {
        let v = Self::version(row).wrapping_add(1);
        row[..8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Why a transaction aborted when a watched key's bucket changed.
pub const WATCHED_KEY_CHANGED: &str = "a watched key changed";
/// Why a transaction aborted when an all-or-nothing write (MSET) did not fit in its bucket.
pub const WHOLE_DOES_NOT_FIT: &str =
    "OOM a key and value do not fit in their bucket (workload.kv.bucket_bytes); nothing was set";
const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";

/// Runs one operation on a bucket (writable if `row` is `Some` for writes).
fn apply(op: &Op, row: &mut RowRef<'_>) -> Result<Reply, LogicAbort> {
    let bytes = row.bytes();
    let reply = match op {
        Op::Get(k) => Bucket::get(bytes, k).map_or(Reply::Nil, Reply::Bulk),
        Op::Exists(k) => Reply::Int(Bucket::find(bytes, k).is_some() as i64),
        Op::Strlen(k) => Reply::Int(Bucket::find(bytes, k).map_or(0, |e| e.value.len()) as i64),
        Op::Version(_) => Reply::Int(Bucket::version(bytes) as i64),
        Op::Count => Reply::Int(Bucket::iter(bytes).count() as i64),
        Op::Check(_, v) if Bucket::version(bytes) == *v => Reply::Ok,
        Op::Check(..) => return Err(LogicAbort(WATCHED_KEY_CHANGED)),
        _ => {
            let RowRef::Write(row) = row else {
                return Err(LogicAbort("a write reached a read-only access"));
            };
            write(op, row)?
        }
    };
    Ok(reply)
}

/// Runs a write; the bucket's version moves when its bytes change.
fn write(op: &Op, row: &mut [u8]) -> Result<Reply, LogicAbort> {
    let (reply, changed) = match op {
        Op::Set {
            key,
            value,
            nx,
            xx,
            whole,
        } => {
            let present = Bucket::find(row, key).is_some();
            if (*nx && present) || (*xx && !present) {
                (Reply::Nil, false)
            } else {
                match Bucket::put(row, key, value) {
                    Ok(()) => (Reply::Ok, true),
                    Err(_) if *whole => return Err(LogicAbort(WHOLE_DOES_NOT_FIT)),
                    Err(e) => (e, false),
                }
            }
        }
        Op::Del(k) => {
            let removed = Bucket::remove(row, k);
            (Reply::Int(removed as i64), removed)
        }
        Op::IncrBy(k, by) => match incr(row, k, *by) {
            Ok(v) => (Reply::Int(v), true),
            Err(e) => (e, false),
        },
        Op::Append(k, tail) => {
            let mut value = Bucket::get(row, k).unwrap_or_default();
            value.extend_from_slice(tail);
            match Bucket::put(row, k, &value) {
                Ok(()) => (Reply::Int(value.len() as i64), true),
                Err(e) => (e, false),
            }
        }
        _ => unreachable!("reads are answered by `apply`"),
    };
    if changed {
        Bucket::bump(row);
    }
    Ok(reply)
}

fn incr(row: &mut [u8], key: &[u8], by: i64) -> Result<i64, Reply> {
    let old = match Bucket::find(row, key) {
        None => 0,
        Some(e) => parse_int(e.value).ok_or_else(|| Reply::Err(NOT_AN_INTEGER.into()))?,
    };
    let new = old
        .checked_add(by)
        .ok_or_else(|| Reply::Err(OVERFLOW.into()))?;
    // Formatted on the stack: an i64 has at most 20 characters.
    let mut text = [0u8; 20];
    let mut w = &mut text[..];
    write!(w, "{new}").expect("an i64 fits in 20 bytes");
    let len = 20 - w.len();
    Bucket::put(row, key, &text[..len])?;
    Ok(new)
}

/// An integer as Redis accepts one: decimal, optional minus, no spaces or plus sign, no
/// leading zeros, fits in an i64.
pub fn parse_int(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    match digits {
        [] => return None,
        [b'0'] if negative => return None,
        [b'0', _, ..] => return None,
        _ => {}
    }
    // Summed below zero, so i64::MIN, whose magnitude no i64 holds, parses too.
    let mut n: i64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(i64::from(c - b'0'))?;
    }
    if negative {
        Some(n)
    } else {
        n.checked_neg()
    }
}

/// The step of every access: runs the bucket's operations in order and answers their replies
/// (encoded).
fn kv_apply(mut row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let Value::Bytes(ops) = arg else {
        return Err(LogicAbort("kv operations are bytes"));
    };
    // Buckets are written only here, so one that does not parse is corrupt: refuse to touch
    // it rather than read or write past what it says it holds.
    if !Bucket::valid(row.bytes()) {
        return Err(LogicAbort("a bucket does not parse"));
    }
    let mut r = Reader(ops);
    // Replies are about as long as the operations (an INCR's is shorter, a GET's holds the
    // value): one allocation for most buckets.
    let mut out = Vec::with_capacity(ops.len() + 32);
    while !r.is_empty() {
        let op = Op::decode(&mut r).ok_or(LogicAbort("malformed kv operation"))?;
        apply(&op, &mut row)?.encode(&mut out);
    }
    Ok(Value::Bytes(out))
}

/// `kv_txn`: arguments are triples (bucket key, flags, operations); flag 1: the access
/// writes, flag 2: it may abort (it checks a version).
struct KvTxn {
    apply: StepId,
}

const WRITES: i64 = 1;
const CHECKS: i64 = 2;

impl Procedure for KvTxn {
    fn name(&self) -> &'static str {
        "kv_txn"
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        if args.is_empty() || !args.len().is_multiple_of(3) {
            return Err(format!(
                "expected (bucket, flags, operations) triples, got {} arguments",
                args.len()
            ));
        }
        let mut program = Program::default();
        for t in args.chunks(3) {
            let (Value::Int(key), Value::Int(flags), ops @ Value::Bytes(_)) = (&t[0], &t[1], &t[2])
            else {
                return Err("a triple is (int bucket, int flags, bytes operations)".into());
            };
            let kind = if flags & WRITES != 0 {
                AccessKind::ReadModifyWrite
            } else {
                AccessKind::Read
            };
            let mut access =
                Access::plain(BUCKETS, *key as Key, kind, self.apply, ops.clone(), vec![]);
            access.may_abort = flags & CHECKS != 0;
            program.accesses.push(access);
        }
        Ok(program)
    }
}

/// Where byte-string keys live: their bucket's record key.
#[derive(Clone)]
pub struct KvKeys {
    pmap: PartitionMap,
    buckets: u64,
}

impl KvKeys {
    /// Buckets in the whole cluster.
    pub fn total(&self) -> u64 {
        self.pmap.partitions() as u64 * self.buckets
    }

    /// Every bucket's key, partition by partition.
    fn all(&self) -> impl Iterator<Item = Key> + '_ {
        (0..self.pmap.partitions()).flat_map(move |p| {
            (0..self.buckets).map(move |slot| self.pmap.nth_key_of(BUCKETS, PartitionId(p), slot))
        })
    }

    pub fn bucket(&self, key: &[u8]) -> Key {
        let h = xxhash_rust::xxh3::xxh3_64(key);
        let parts = self.pmap.partitions() as u64;
        let slot = (h / parts) % self.buckets;
        self.pmap
            .nth_key_of(BUCKETS, PartitionId((h % parts) as u32), slot)
    }
}

/// Builds one `kv_txn` call from operations, and reads its outputs back as one reply per
/// operation.
pub struct KvTxnBuilder<'a> {
    keys: &'a KvKeys,
    proc: ProcId,
    /// Per bucket (in order of first use): its key, whether it writes or checks, its
    /// operations encoded.
    buckets: Vec<(Key, i64, Vec<u8>)>,
    index: FxHashMap<Key, usize>,
    /// Per operation: its bucket's index.
    placed: Vec<usize>,
}

impl<'a> KvTxnBuilder<'a> {
    pub fn push(&mut self, op: &Op) {
        self.push_at(self.keys.bucket(op.key()), op);
    }

    /// Counts the keys of every bucket (what DBSIZE sums): one read of each, so it fits in a
    /// transaction only while the cluster has at most `u16::MAX` buckets
    /// ([`KvKeys::total`]).
    pub fn count_all(&mut self) {
        let keys = self.keys;
        for bucket in keys.all() {
            self.push_at(bucket, &Op::Count);
        }
    }

    fn push_at(&mut self, bucket: Key, op: &Op) {
        let i = *self.index.entry(bucket).or_insert_with(|| {
            self.buckets.push((bucket, 0, Vec::new()));
            self.buckets.len() - 1
        });
        let b = &mut self.buckets[i];
        b.2.reserve(op.encoded_len());
        b.1 |= match op {
            Op::Check(..) => CHECKS,
            op if op.writes() => WRITES,
            _ => 0,
        };
        op.encode(&mut b.2);
        self.placed.push(i);
    }

    pub fn is_empty(&self) -> bool {
        self.placed.is_empty()
    }

    /// Makes room for `ops` more operations (on as many buckets at most).
    pub fn reserve(&mut self, ops: usize) {
        self.buckets.reserve(ops);
        self.index.reserve(ops);
        self.placed.reserve(ops);
    }

    /// The call, and what [`KvTxnBuilder::replies`] needs to read its outputs.
    pub fn finish(self) -> (ProcCall, Vec<usize>) {
        let args = self
            .buckets
            .into_iter()
            .flat_map(|(key, flags, ops)| {
                [Value::Int(key as i64), Value::Int(flags), Value::Bytes(ops)]
            })
            .collect();
        let call = ProcCall {
            proc: self.proc,
            args,
        };
        (call, self.placed)
    }

    /// One reply per operation, in the order they were pushed, from the committed call's
    /// outputs (one per bucket).
    pub fn replies(placed: &[usize], outputs: &[Value]) -> Result<Vec<Reply>, String> {
        let mut readers: Vec<Reader<'_>> = outputs
            .iter()
            .map(|o| match o {
                Value::Bytes(b) => Ok(Reader(b)),
                other => Err(format!("a bucket answered {other:?}, not its replies")),
            })
            .collect::<Result<_, _>>()?;
        let mut replies = Vec::with_capacity(placed.len());
        for &i in placed {
            let reply = readers
                .get_mut(i)
                .and_then(Reply::decode)
                .ok_or_else(|| format!("bucket {i} answered fewer replies than operations"))?;
            replies.push(reply);
        }
        Ok(replies)
    }
}

#[derive(Clone)]
pub struct Kv {
    cfg: KvConfig,
    seed: u64,
    keys: KvKeys,
    catalog: Arc<Catalog>,
    proc: ProcId,
}

impl Kv {
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = run.workload.kv.clone();
        cfg.validate()?;
        let mut catalog = Catalog::default();
        catalog.add_table(TableSchema {
            name: "buckets".into(),
            row_size: cfg.bucket_bytes as usize,
            capacity_per_partition: cfg.buckets_per_partition as usize,
            keys_per_partition: cfg.buckets_per_partition,
            read_mostly: false,
        });
        let apply = catalog.steps.register("kv_apply", kv_apply);
        let proc = catalog.add_procedure(Arc::new(KvTxn { apply }));
        let pmap = PartitionMap::new(run.cluster.nodes, run.cluster.partitioning, &catalog.tables);
        Ok(Kv {
            keys: KvKeys {
                pmap,
                buckets: cfg.buckets_per_partition,
            },
            catalog: Arc::new(catalog),
            cfg,
            seed: run.seed,
            proc,
        })
    }

    /// A builder of one transaction.
    pub fn txn(&self) -> KvTxnBuilder<'_> {
        KvTxnBuilder {
            keys: &self.keys,
            proc: self.proc,
            buckets: Vec::new(),
            index: FxHashMap::default(),
            placed: Vec::new(),
        }
    }

    /// Where keys live.
    pub fn keys(&self) -> &KvKeys {
        &self.keys
    }

    /// Bytes of key and value that fit in an empty bucket: a larger pair never fits.
    pub fn entry_room(&self) -> usize {
        self.cfg.bucket_bytes as usize - HEADER - ENTRY_HEADER
    }
}

impl Workload for Kv {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }

    fn partition_map(&self) -> &PartitionMap {
        &self.keys.pmap
    }

    fn load(&self, partition: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError> {
        // Empty buckets: version 0, nothing used.
        let count = self.cfg.buckets_per_partition;
        crate::load_dense(
            loader,
            &self.keys.pmap,
            BUCKETS,
            partition,
            count,
            &mut |_, row| row.fill(0),
        )
    }

    fn generator(&self, client: u32, _home: PartitionId) -> Box<dyn TxnGenerator> {
        Box::new(KvGenerator {
            rng: qstore_core::rng::stream(self.seed, client as u64),
            kv: self.clone(),
        })
    }

    fn tally(&self, scan: &mut ScanFn<'_>) -> Option<Tally> {
        let mut t = Tally::default();
        scan(BUCKETS, &mut |bucket, row| match Bucket::entries(row) {
            None => t.problem(|| format!("bucket {bucket} does not parse")),
            Some(entries) => {
                t.add("keys", entries.len() as i128);
                for e in entries {
                    if self.keys.bucket(e.key) != bucket {
                        t.problem(|| format!("a key of bucket {bucket} hashes elsewhere"));
                    }
                }
            }
        });
        Some(t)
    }

    fn check_tally(&self, t: &Tally) -> Result<String, String> {
        match t.problems_line() {
            Some(p) => Err(format!("kv: {p}")),
            None => Ok(format!(
                "kv: {} keys, every bucket well-formed and every key in its own bucket",
                t.count("keys")
            )),
        }
    }
}

/// The workload's own clients: `reads_per_txn` GETs and `rmws_per_txn` INCRs per
/// transaction, on keys `key:N` drawn uniformly.
struct KvGenerator {
    rng: qstore_core::rng::Rng,
    kv: Kv,
}

impl TxnGenerator for KvGenerator {
    fn next_txn(&mut self) -> TxnCall {
        let KvConfig {
            keys,
            reads_per_txn,
            rmws_per_txn,
            ..
        } = self.kv.cfg;
        let rng = &mut self.rng;
        let mut key = || format!("key:{}", rng.random_range(0..keys)).into_bytes();
        let mut txn = self.kv.txn();
        for _ in 0..reads_per_txn {
            txn.push(&Op::Get(key()));
        }
        for _ in 0..rmws_per_txn {
            txn.push(&Op::IncrBy(key(), 1));
        }
        let (call, _) = txn.finish();
        TxnCall {
            call,
            ops: reads_per_txn + rmws_per_txn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_knows_its_encoded_length() {
        let k = b"some key".to_vec();
        let ops = [
            Op::Get(k.clone()),
            Op::Set {
                key: k.clone(),
                value: b"a value".to_vec(),
                nx: true,
                xx: false,
                whole: false,
            },
            Op::Del(k.clone()),
            Op::Exists(k.clone()),
            Op::IncrBy(k.clone(), -3),
            Op::Append(k.clone(), b"more".to_vec()),
            Op::Strlen(k.clone()),
            Op::Version(k.clone()),
            Op::Check(k, 7),
            Op::Count,
        ];
        for op in ops {
            let mut out = Vec::new();
            op.encode(&mut out);
            assert_eq!(out.len(), op.encoded_len(), "{op:?}");
        }
    }

    fn run(row: &mut [u8], ops: &[Op]) -> Result<Vec<Reply>, LogicAbort> {
        let mut arg = Vec::new();
        ops.iter().for_each(|o| o.encode(&mut arg));
        let writes = ops.iter().any(|o| o.writes());
        let view = if writes {
            RowRef::Write(row)
        } else {
            RowRef::Read(row)
        };
        let Value::Bytes(out) = kv_apply(view, &Value::Bytes(arg), Inputs::new(&[], &[]))? else {
            panic!("replies are bytes")
        };
        let mut r = Reader(&out);
        Ok(ops.iter().map(|_| Reply::decode(&mut r).unwrap()).collect())
    }

    fn set(k: &str, v: &str) -> Op {
        Op::Set {
            key: k.into(),
            value: v.into(),
            nx: false,
            xx: false,
            whole: false,
        }
    }

    #[test]
    fn keys_of_one_bucket_never_mix() {
        let mut row = vec![0; 128];
        let replies = run(
            &mut row,
            &[
                set("a", "1"),
                set("bb", "22"),
                Op::Get("a".into()),
                Op::Del("a".into()),
                Op::Get("a".into()),
                Op::Get("bb".into()),
                Op::Exists("bb".into()),
                Op::Strlen("bb".into()),
            ],
        )
        .unwrap();
        use Reply::*;
        assert_eq!(
            replies,
            [
                Ok,
                Ok,
                Bulk(b"1".to_vec()),
                Int(1),
                Nil,
                Bulk(b"22".to_vec()),
                Int(1),
                Int(2)
            ]
        );
        assert_eq!(Bucket::entries(&row).unwrap().len(), 1);
    }

    #[test]
    fn a_count_is_the_keys_of_its_bucket() {
        let mut row = vec![0; 128];
        let replies = run(
            &mut row,
            &[
                Op::Count,
                set("a", "1"),
                set("b", "2"),
                set("a", "3"),
                Op::Count,
                Op::Del("a".into()),
                Op::Count,
            ],
        )
        .unwrap();
        let counts: Vec<_> = [0, 4, 6].iter().map(|&i| replies[i].clone()).collect();
        assert_eq!(counts, [Reply::Int(0), Reply::Int(2), Reply::Int(1)]);
    }

    #[test]
    fn counting_all_reads_every_bucket_once() {
        let mut run = RunConfig::default();
        run.workload.name = "kv".into();
        run.cluster.nodes = 3;
        run.workload.kv.buckets_per_partition = 100;
        let kv = Kv::new(&run).unwrap();
        assert_eq!(kv.keys().total(), 300);
        let mut txn = kv.txn();
        txn.count_all();
        let (call, placed) = txn.finish();
        assert_eq!(placed.len(), 300);
        let program = KvTxn { apply: StepId(0) }.program(&call.args).unwrap();
        let mut keys: Vec<Key> = program.accesses.iter().map(|a| a.key).collect();
        assert!(program.accesses.iter().all(|a| a.kind == AccessKind::Read));
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 300);
    }

    #[test]
    fn writes_that_do_not_fit_change_nothing() {
        let mut row = vec![0; 64];
        let big = "x".repeat(60);
        let replies = run(
            &mut row,
            &[set("a", "1"), set("b", &big), Op::Get("a".into())],
        )
        .unwrap();
        assert!(matches!(&replies[1], Reply::Err(e) if e.starts_with("OOM")));
        assert_eq!(replies[2], Reply::Bulk(b"1".to_vec()));
        assert_eq!(Bucket::version(&row), 1);
    }

    #[test]
    fn a_whole_write_that_does_not_fit_aborts_and_a_corrupt_bucket_is_refused() {
        let mut row = vec![0; 64];
        let mut big = set("b", &"x".repeat(60));
        if let Op::Set { whole, .. } = &mut big {
            *whole = true;
        }
        assert_eq!(run(&mut row, &[big]), Err(LogicAbort(WHOLE_DOES_NOT_FIT)));
        row[8..12].copy_from_slice(&1000u32.to_le_bytes());
        assert!(run(&mut row, &[set("a", "1")]).is_err());
        assert!(run(&mut row, &[Op::Get("a".into())]).is_err());
    }

    #[test]
    fn incr_follows_redis() {
        let mut row = vec![0; 256];
        let replies = run(
            &mut row,
            &[
                Op::IncrBy("n".into(), 5),
                Op::IncrBy("n".into(), -7),
                set("s", "abc"),
                Op::IncrBy("s".into(), 1),
                set("m", &i64::MAX.to_string()),
                Op::IncrBy("m".into(), 1),
                Op::Append("n".into(), "0".into()),
            ],
        )
        .unwrap();
        assert_eq!(replies[0], Reply::Int(5));
        assert_eq!(replies[1], Reply::Int(-2));
        assert_eq!(replies[3], Reply::Err(NOT_AN_INTEGER.into()));
        assert_eq!(replies[5], Reply::Err(OVERFLOW.into()));
        assert_eq!(replies[6], Reply::Int(3));
        assert_eq!(Bucket::get(&row, b"n").unwrap(), b"-20");
        for bad in [
            "",
            "-",
            "01",
            "+1",
            " 1",
            "-0",
            "1 ",
            "1a",
            "--1",
            "99999999999999999999",
            "9223372036854775808",
            "-9223372036854775809",
        ] {
            assert_eq!(parse_int(bad.as_bytes()), None, "{bad:?}");
        }
        for n in [0, 1, -1, 42, -907, i64::MAX, i64::MIN] {
            assert_eq!(parse_int(n.to_string().as_bytes()), Some(n));
        }
    }

    #[test]
    fn set_nx_and_xx() {
        let mut row = vec![0; 128];
        let op = |k: &str, nx, xx| Op::Set {
            key: k.into(),
            value: "v".into(),
            nx,
            xx,
            whole: false,
        };
        let replies = run(
            &mut row,
            &[
                op("a", false, true),
                op("a", true, false),
                op("a", true, false),
                op("a", false, true),
            ],
        )
        .unwrap();
        assert_eq!(replies, [Reply::Nil, Reply::Ok, Reply::Nil, Reply::Ok]);
    }

    #[test]
    fn a_changed_bucket_fails_its_check() {
        let mut row = vec![0; 128];
        let v = match &run(&mut row, &[Op::Version("a".into())]).unwrap()[0] {
            Reply::Int(v) => *v as u64,
            r => panic!("{r:?}"),
        };
        assert!(run(&mut row, &[Op::Check("a".into(), v)]).is_ok());
        run(&mut row, &[set("b", "1")]).unwrap();
        assert!(run(&mut row, &[Op::Check("a".into(), v)]).is_err());
    }

    #[test]
    fn a_builder_groups_by_bucket_and_answers_in_order() {
        let mut cfg = RunConfig::default();
        cfg.cluster.nodes = 3;
        cfg.workload.kv.buckets_per_partition = 2;
        let kv = Kv::new(&cfg).unwrap();
        let mut txn = kv.txn();
        let ops: Vec<Op> = (0..20).map(|i| set(&format!("k{i}"), "v")).collect();
        ops.iter().for_each(|o| txn.push(o));
        let (call, placed) = txn.finish();
        // 20 keys over 6 buckets: one access per bucket used, none twice.
        let program = kv.catalog.program(&call).unwrap();
        assert!(program.accesses.len() <= 6);
        let mut seen: Vec<Key> = program.accesses.iter().map(|a| a.key).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), program.accesses.len());
        let outputs: Vec<Value> = call
            .args
            .chunks(3)
            .map(|t| {
                let mut row = vec![0; 1024];
                let out = kv_apply(RowRef::Write(&mut row), &t[2], Inputs::new(&[], &[])).unwrap();
                out
            })
            .collect();
        let replies = KvTxnBuilder::replies(&placed, &outputs).unwrap();
        assert_eq!(replies, vec![Reply::Ok; 20]);
    }
}
