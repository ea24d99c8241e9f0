//! Dense indices over a history (transactions, records, writes and version
//! orders) and the construction of the dependency edges.
//!
//! Transactions are identified by their position in [`History::txns`]
//! ("txn index"), records by a dense "key index". Cache behaviour matters on
//! million-transaction histories, so per-transaction state lives in small flat
//! vectors and each write carries its successor in the version order.

use std::fmt;

use rustc_hash::FxHashMap;

use crate::checker::Findings;
use crate::graph::EdgeList;
use crate::model::{History, ObjKey, Outcome, TxnRecord, Version, INITIAL_WRITER};
use crate::report::{AnomalyClass, EdgeCounts};

/// Absent txn index or slot index.
const NONE: u32 = u32::MAX;

/// Transaction id -> txn index. Uses a direct table when ids are dense
/// (the common case: an attempt counter), a hash map otherwise.
enum IdMap {
    Dense { base: u64, index: Vec<u32> },
    Hashed(FxHashMap<u64, u32>),
}

impl IdMap {
    fn for_txns(txns: &[TxnRecord]) -> Self {
        let ids = txns.iter().map(|t| t.id).filter(|&id| id != INITIAL_WRITER);
        let (min, max) = ids.fold((u64::MAX, 0), |(lo, hi), id| (lo.min(id), hi.max(id)));
        let dense_limit = 4 * txns.len() as u64 + 1024;
        match max.checked_sub(min) {
            Some(span) if span < dense_limit => IdMap::Dense {
                base: min,
                index: vec![NONE; span as usize + 1],
            },
            _ => IdMap::Hashed(FxHashMap::with_capacity_and_hasher(
                txns.len(),
                Default::default(),
            )),
        }
    }

    /// Maps `id` to `t` unless already mapped; returns whether it was new.
    fn insert(&mut self, id: u64, t: u32) -> bool {
        match self {
            IdMap::Dense { base, index } => {
                let slot = &mut index[(id - *base) as usize];
                let new = *slot == NONE;
                if new {
                    *slot = t;
                }
                new
            }
            IdMap::Hashed(map) => {
                let new = !map.contains_key(&id);
                if new {
                    map.insert(id, t);
                }
                new
            }
        }
    }

    fn get(&self, id: u64) -> Option<u32> {
        match self {
            IdMap::Dense { base, index } => {
                let offset = usize::try_from(id.checked_sub(*base)?).ok()?;
                index.get(offset).copied().filter(|&t| t != NONE)
            }
            IdMap::Hashed(map) => map.get(&id).copied(),
        }
    }
}

/// How a transaction record takes part in the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnState {
    /// Duplicate id or id 0: ignored.
    Invalid,
    Committed,
    Aborted,
}

/// One record written by one transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteSlot {
    /// Dense key index.
    pub(crate) key: u32,
    /// How many times the transaction wrote the record.
    count: u32,
    /// The txn installed right after this transaction's version, or [`NONE`].
    next: u32,
    /// Whether the version appears in the record's version order.
    ordered: bool,
}

impl WriteSlot {
    /// The transaction that overwrote this version, if any.
    pub(crate) fn successor(&self) -> Option<u32> {
        (self.next != NONE).then_some(self.next)
    }
}

/// Dense indices over a history.
pub(crate) struct Index<'h> {
    pub(crate) history: &'h History,
    ids: IdMap,
    state: Vec<TxnState>,
    keys: FxHashMap<ObjKey, u32>,
    /// Dense key index -> record identity.
    pub(crate) key_list: Vec<ObjKey>,
    /// Per key: the first installed writer, or [`NONE`].
    first_writer: Vec<u32>,
    /// Per key: the slot of the last installed version so far, or [`NONE`].
    last_slot: Vec<u32>,
    /// Txn `t`'s writes are `slots[slot_start[t]..slot_start[t + 1]]`, sorted by key.
    slot_start: Vec<u32>,
    slots: Vec<WriteSlot>,
    pub(crate) committed: usize,
    pub(crate) aborted: usize,
}

impl<'h> Index<'h> {
    /// Indexes `history`, reporting structural problems and version-order
    /// inconsistencies to `findings`.
    pub(crate) fn build(history: &'h History, findings: &mut Findings) -> Self {
        let mut index = Index {
            history,
            ids: IdMap::for_txns(&history.txns),
            state: Vec::with_capacity(history.txns.len()),
            keys: FxHashMap::default(),
            key_list: Vec::new(),
            first_writer: Vec::new(),
            last_slot: Vec::new(),
            slot_start: Vec::with_capacity(history.txns.len() + 1),
            slots: Vec::new(),
            committed: 0,
            aborted: 0,
        };
        index.index_txns(findings);
        index.index_writes(findings);
        index.index_orders(findings);
        index.report_unordered_writes(findings);
        index
    }

    fn index_txns(&mut self, findings: &mut Findings) {
        for (t, txn) in self.history.txns.iter().enumerate() {
            let state = if txn.id == INITIAL_WRITER {
                findings.add(AnomalyClass::InvalidHistory, || {
                    let why = "a transaction has id 0, which is reserved for the initial version";
                    (vec![0], why.to_string())
                });
                TxnState::Invalid
            } else if !self.ids.insert(txn.id, t as u32) {
                // Keep the first occurrence; the duplicate takes no part.
                findings.add(AnomalyClass::InvalidHistory, || {
                    (vec![txn.id], format!("T{} appears more than once", txn.id))
                });
                TxnState::Invalid
            } else if txn.is_committed() {
                self.committed += 1;
                TxnState::Committed
            } else {
                self.aborted += 1;
                TxnState::Aborted
            };
            self.state.push(state);
        }
    }

    fn intern(&mut self, key: ObjKey) -> u32 {
        let next = self.key_list.len() as u32;
        let k = *self.keys.entry(key).or_insert(next);
        if k == next {
            self.key_list.push(key);
            self.first_writer.push(NONE);
            self.last_slot.push(NONE);
        }
        k
    }

    fn index_writes(&mut self, findings: &mut Findings) {
        let history = self.history;
        let mut scratch = Vec::new();
        for (t, txn) in history.txns.iter().enumerate() {
            self.slot_start.push(self.slots.len() as u32);
            if self.state[t] == TxnState::Invalid {
                continue;
            }
            scratch.clear();
            for &(key, count) in &txn.writes {
                if count == 0 {
                    findings.add(AnomalyClass::InvalidHistory, || {
                        (
                            vec![txn.id],
                            format!("T{} writes {key} with count 0", txn.id),
                        )
                    });
                    continue;
                }
                let key = self.intern(key);
                let next = NONE;
                scratch.push(WriteSlot {
                    key,
                    count,
                    next,
                    ordered: false,
                });
            }
            scratch.sort_unstable_by_key(|s| s.key);
            let before = scratch.len();
            scratch.dedup_by_key(|s| s.key);
            if scratch.len() != before {
                findings.add(AnomalyClass::InvalidHistory, || {
                    let why = format!("T{} lists the same record in several write entries", txn.id);
                    (vec![txn.id], why)
                });
            }
            self.slots.extend_from_slice(&scratch);
        }
        self.slot_start.push(self.slots.len() as u32);
    }

    fn index_orders(&mut self, findings: &mut Findings) {
        for (key, writers) in &self.history.version_order {
            let k = self.intern(*key);
            for &writer in writers {
                if let Err(why) = self.install(k, writer) {
                    findings.add(AnomalyClass::IncompleteOrder, || {
                        (
                            vec![writer],
                            format!("version order of {key} names T{writer}, {why}"),
                        )
                    });
                }
            }
        }
    }

    /// Appends `writer`'s final version to the version order of key `k`.
    fn install(&mut self, k: u32, writer: u64) -> Result<(), &'static str> {
        if writer == INITIAL_WRITER {
            return Err("the initial version, which is implicitly first");
        }
        let t = self.ids.get(writer).ok_or("which is not in the history")?;
        if self.state[t as usize] != TxnState::Committed {
            return Err("which aborted");
        }
        let s = self.slot_index(t, k).ok_or("which did not write it")?;
        if self.slots[s].ordered {
            return Err("more than once");
        }
        self.slots[s].ordered = true;
        match self.last_slot[k as usize] {
            NONE => self.first_writer[k as usize] = t,
            prev => self.slots[prev as usize].next = t,
        }
        self.last_slot[k as usize] = s as u32;
        Ok(())
    }

    fn report_unordered_writes(&self, findings: &mut Findings) {
        for (t, txn) in self.history.txns.iter().enumerate() {
            if self.state[t] != TxnState::Committed {
                continue;
            }
            for slot in self.slots_of(t as u32).iter().filter(|s| !s.ordered) {
                findings.add(AnomalyClass::IncompleteOrder, || {
                    let key = self.key_list[slot.key as usize];
                    let why = format!(
                        "committed T{} wrote {key} but is missing from its version order",
                        txn.id
                    );
                    (vec![txn.id], why)
                });
            }
        }
    }

    /// Txn `t`'s writes, sorted by key index.
    pub(crate) fn slots_of(&self, t: u32) -> &[WriteSlot] {
        let start = self.slot_start[t as usize] as usize;
        let end = self.slot_start[t as usize + 1] as usize;
        &self.slots[start..end]
    }

    /// Position in `slots` of txn `t`'s write of key `k`.
    fn slot_index(&self, t: u32, k: u32) -> Option<usize> {
        let start = self.slot_start[t as usize] as usize;
        let found = self.slots_of(t).binary_search_by_key(&k, |s| s.key).ok()?;
        Some(start + found)
    }

    /// The id of txn `t`.
    pub(crate) fn id(&self, t: u32) -> u64 {
        self.history.txns[t as usize].id
    }

    /// Resolves what committed txn `reader` observed when reading `version` of `key`.
    pub(crate) fn resolve_read(&self, reader: u32, key: ObjKey, version: Version) -> ReadOf {
        let k = self.keys.get(&key).copied();
        if version.is_initial() {
            if version.seq != 0 {
                return ReadOf::Phantom(Phantom::InitialSeq);
            }
            let first = k.map_or(NONE, |k| self.first_writer[k as usize]);
            return ReadOf::Initial {
                next: (first != NONE).then_some(first),
            };
        }
        let Some(writer) = self.ids.get(version.writer) else {
            return ReadOf::Phantom(Phantom::NoSuchTxn);
        };
        let Some(slot) = k
            .and_then(|k| self.slot_index(writer, k))
            .map(|s| self.slots[s])
        else {
            return ReadOf::Phantom(Phantom::NeverWrote);
        };
        if version.seq >= slot.count {
            return ReadOf::Phantom(Phantom::SeqTooLarge(slot.count));
        }
        if writer == reader {
            return ReadOf::Own;
        }
        if self.state[writer as usize] != TxnState::Committed {
            return ReadOf::Aborted { writer };
        }
        if !slot.ordered {
            return ReadOf::Unordered { writer };
        }
        ReadOf::Committed {
            writer,
            next: slot.successor(),
            intermediate: version.seq + 1 < slot.count,
        }
    }

    /// Builds the ww, wr and rw edge lists, reporting read anomalies on the way.
    pub(crate) fn dependency_edges(&self, findings: &mut Findings) -> DependencyEdges {
        let mut edges = DependencyEdges::default();
        for t in 0..self.history.txns.len() as u32 {
            for next in self.slots_of(t).iter().filter_map(WriteSlot::successor) {
                edges.ww.push(t, next);
            }
        }
        for (t, txn) in self.history.txns.iter().enumerate() {
            if self.state[t] != TxnState::Committed {
                continue;
            }
            for &(key, version) in &txn.reads {
                self.read_edges(t as u32, key, version, &mut edges, findings);
            }
        }
        edges.counts = EdgeCounts {
            ww: edges.ww.dedup(),
            wr: edges.wr.dedup(),
            rw: edges.rw.dedup(),
        };
        edges
    }

    /// Adds the edges induced by one read of a committed txn and reports G1a,
    /// G1b and phantom reads.
    fn read_edges(
        &self,
        reader: u32,
        key: ObjKey,
        version: Version,
        edges: &mut DependencyEdges,
        findings: &mut Findings,
    ) {
        let reader_id = self.id(reader);
        let describe = |what: String| {
            let txns = vec![reader_id, version.writer];
            (
                txns,
                format!("T{reader_id} read {key} version {version}, {what}"),
            )
        };
        let mut anti_dependency = |next: Option<u32>| {
            if let Some(next) = next.filter(|&n| n != reader) {
                edges.rw.push(reader, next);
            }
        };
        match self.resolve_read(reader, key, version) {
            ReadOf::Initial { next } => anti_dependency(next),
            ReadOf::Own => {}
            ReadOf::Committed {
                writer,
                next,
                intermediate,
            } => {
                if intermediate {
                    findings.add(AnomalyClass::G1b, || {
                        describe("an intermediate (non-final) version".to_string())
                    });
                }
                anti_dependency(next);
                edges.wr.push(writer, reader);
            }
            ReadOf::Aborted { writer } => {
                let cause = match &self.history.txns[writer as usize].outcome {
                    Outcome::Aborted { cause, .. } => cause.as_str(),
                    Outcome::Committed => "",
                };
                findings.add(AnomalyClass::G1a, || {
                    describe(format!("written by aborted T{} ({cause})", version.writer))
                });
            }
            ReadOf::Unordered { writer } => {
                findings.add(AnomalyClass::PhantomVersion, || {
                    describe(Phantom::NotInOrder.to_string())
                });
                edges.wr.push(writer, reader);
            }
            ReadOf::Phantom(why) => {
                findings.add(AnomalyClass::PhantomVersion, || describe(why.to_string()));
            }
        }
    }
}

/// What a read observed.
pub(crate) enum ReadOf {
    /// The initial version; `next` is the first installed writer, if any.
    Initial { next: Option<u32> },
    /// The reader's own write (no edges).
    Own,
    /// An installed version of a committed writer; `next` overwrote it.
    Committed {
        writer: u32,
        next: Option<u32>,
        intermediate: bool,
    },
    /// A version of an aborted writer: G1a.
    Aborted { writer: u32 },
    /// A version of a committed writer that is missing from the version order.
    Unordered { writer: u32 },
    /// A version that never existed.
    Phantom(Phantom),
}

/// Why a read version never existed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phantom {
    InitialSeq,
    NoSuchTxn,
    NeverWrote,
    SeqTooLarge(u32),
    NotInOrder,
}

impl fmt::Display for Phantom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phantom::InitialSeq => f.write_str("but the initial version only has seq 0"),
            Phantom::NoSuchTxn => f.write_str("but its writer is not in the history"),
            Phantom::NeverWrote => f.write_str("but its writer never wrote that record"),
            Phantom::SeqTooLarge(n) => {
                write!(f, "but its writer wrote that record only {n} time(s)")
            }
            Phantom::NotInOrder => {
                f.write_str("but that version is missing from the record's version order")
            }
        }
    }
}

/// Edge lists of the dependency graph, deduplicated, with their sizes.
#[derive(Default)]
pub(crate) struct DependencyEdges {
    pub(crate) ww: EdgeList,
    pub(crate) wr: EdgeList,
    pub(crate) rw: EdgeList,
    pub(crate) counts: EdgeCounts,
}
