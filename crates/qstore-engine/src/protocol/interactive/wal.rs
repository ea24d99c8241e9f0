//! The write-ahead log of the interactive protocols, with two-phase commit: what each node
//! writes, when it waits for the disk, and how a restarted node recovers from it.
//!
//! - A participant that votes yes first forces a **prepare** record with the redo of its
//!   writes here: the after-image of every record it changed, and the version it leaves.
//! - A coordinator forces its **commit decision** before it sends any commit. A transaction
//!   without a decision record aborted (presumed abort).
//! - A participant writes the **outcome** of a prepared transaction when the decision
//!   arrives, before it makes the changes visible, so that the log's order is the order of
//!   installs. It acknowledges a commit only once the outcome is on disk: from then on it
//!   will never ask about the transaction again.
//! - With every acknowledgement in, the coordinator writes that the transaction **ended**
//!   (not forced): its decision is forgotten at the next checkpoint. (A decision whose end
//!   record a crash lost is kept, which is safe.)
//! - A transaction with a single participant commits in one phase: the participant forces a
//!   **commit** record with its redo before it makes the changes visible and acknowledges.
//!
//! Waiting for the disk never blocks a worker: the record is appended, and what must wait for
//! it (a vote, a one-phase commit, the commits of a decision) goes to the node's syncer
//! thread, which syncs the log once for everything queued meanwhile (group commit) and hands
//! the work back to the workers. The changes stay invisible (locks held, copies not
//! installed) until their record is durable, so no transaction anywhere can depend on a
//! change a crash could lose.
//!
//! Every so often the log is folded into a **checkpoint** and dropped (see [`super::checkpoint`]).
//!
//! **Recovery**, before the node serves anything: the partition is loaded as at the first
//! start, then the checkpoint's rows are put back, then the after-images of every
//! transaction the log holds as committed, each record's
//! in the protocol's commit order (its timestamps when it has them, otherwise the order of
//! the log, which under locks is the order of installs). Prepared transactions without an
//! outcome are *in doubt*: the node asks their coordinators, which answer from their own
//! recovered decisions, before it admits any transaction (see [`super::start`]).

use super::msg::{Attempt, Body, IMsg, Vote};
use super::{Cc, Execution, Node};
use crate::exec::{UndoLog, WriteBuffer};
use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender};
use qstore_core::{Key, NodeId, QError, TableId, TxnId};
use qstore_log::{FsyncPolicy, LogOptions, Lsn, RecordLog, SegmentLog};
use qstore_net::Envelope;
use qstore_storage::PartitionStore;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The after-image of one record a transaction changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct RowImage {
    pub table: TableId,
    pub key: Key,
    /// The record's bytes, or `None` if the transaction deleted it.
    #[serde(with = "serde_bytes")]
    pub bytes: Option<Vec<u8>>,
}

impl RowImage {
    pub fn view(&self) -> ImageView<'_> {
        ImageView {
            table: self.table,
            key: self.key,
            bytes: self.bytes.as_deref(),
        }
    }
}

/// A [`RowImage`] read back from the log, its bytes borrowed from the record's (the same
/// encoding): folding the log copies only the images it keeps.
#[derive(Clone, Copy, Debug, Deserialize)]
pub(super) struct ImageView<'a> {
    pub table: TableId,
    pub key: Key,
    #[serde(borrow)]
    pub bytes: Option<&'a [u8]>,
}

impl ImageView<'_> {
    fn to_owned(self) -> RowImage {
        RowImage {
            table: self.table,
            key: self.key,
            bytes: self.bytes.map(<[u8]>::to_vec),
        }
    }
}

/// A record of the log: written with owned images ([`RowImage`]), read back with borrowed
/// ones ([`ImageView`]).
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Record<I = RowImage> {
    /// A participant votes yes (forced first).
    Prepared {
        txn: TxnId,
        coord: NodeId,
        at: Attempt,
        redo: Vec<I>,
    },
    /// The decision about a prepared transaction reached its participant: committed at this
    /// timestamp, or aborted (`None`).
    Outcome { txn: TxnId, commit_ts: Option<u64> },
    /// A transaction with a single participant committed there (forced first).
    Committed {
        txn: TxnId,
        at: Attempt,
        redo: Vec<I>,
    },
    /// The coordinator decided to commit, at this timestamp (forced first).
    Decided { txn: TxnId, ts: u64 },
    /// The node started (recovered) again: the commit order starts again too (timestamps
    /// need not grow across starts), after everything before.
    Started,
    /// Every participant of a transaction decided here has its outcome on disk: nobody will
    /// ask about it again.
    Ended { txn: TxnId },
    /// Every timestamp the node hands out stays below `ts` (protocols whose timestamps must
    /// outlive a restart, [`Cc::BOUNDS_TIMESTAMPS`]: Sundial's upper-bound timestamp).
    Bound { ts: u64 },
    /// The protocol's note about a record here, and its new image if it moved in or out
    /// (see [`super::Port::log_note`]).
    Note {
        table: TableId,
        key: Key,
        #[serde(with = "serde_bytes")]
        state: Vec<u8>,
        image: Option<I>,
    },
}

/// The latest note of each record (see [`Record::Note`]).
pub(crate) type NoteMap = FxHashMap<(TableId, Key), Vec<u8>>;

/// What waits for a record to be on disk.
pub(super) enum Durable {
    /// A participant's yes vote, once its prepare record is.
    Vote {
        coord: NodeId,
        txn: TxnId,
        vote: Vote,
    },
    /// A one-phase commit: install, release and acknowledge once its commit record is.
    Commit { txn: TxnId },
    /// A coordinator's commits, once its decision record is.
    Decision { txn: TxnId },
    /// A participant's acknowledgement of a commit, once its outcome record is.
    Ack { coord: NodeId, txn: TxnId },
    /// The protocol's own messages, once its notes are.
    Send(Vec<(NodeId, TxnId, Vec<u8>)>),
}

/// A prepared transaction whose outcome the log does not hold.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct InDoubt {
    /// The start it was prepared in.
    start: u64,
    coord: NodeId,
    at: Attempt,
    redo: Vec<RowImage>,
}

/// What a prefix of the log amounts to, besides the after-images of what committed (which
/// go to an [`Images`]): the transactions in doubt at its end, the commit decisions of
/// transactions coordinated here that a participant may still ask about, and how many
/// times the node started.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Folded {
    pub starts: u64,
    /// Transactions whose changes were put back.
    pub redone: u64,
    pub in_doubt: FxHashMap<TxnId, InDoubt>,
    pub decided: FxHashMap<TxnId, u64>,
    /// Above every timestamp the log names (see [`Record::Bound`]).
    pub bound: u64,
    /// The protocol's notes.
    pub notes: NoteMap,
}

/// Where the after-images of committed transactions go, with their place in the commit order.
pub(super) trait Images {
    fn put(&mut self, images: &[ImageView<'_>], place: Place) -> Result<(), String>;
}

impl Folded {
    /// Adds record `lsn` of the log; `commit_order` is the protocol's.
    pub fn fold(
        &mut self,
        lsn: Lsn,
        record: Record<ImageView<'_>>,
        commit_order: impl Fn(&Attempt) -> Option<u128>,
        images: &mut impl Images,
    ) -> Result<(), String> {
        // Without timestamps, the order of the log is the order of installs.
        let order = |at: &Attempt| commit_order(at).unwrap_or(u128::from(lsn));
        let start = self.starts;
        let named = match &record {
            Record::Prepared { at, .. } | Record::Committed { at, .. } => at.ts.saturating_add(1),
            Record::Outcome { commit_ts, .. } => commit_ts.map_or(0, |ts| ts.saturating_add(1)),
            Record::Decided { ts, .. } => ts.saturating_add(1),
            Record::Bound { ts } => *ts,
            Record::Started | Record::Ended { .. } | Record::Note { .. } => 0,
        };
        self.bound = self.bound.max(named);
        match record {
            Record::Prepared {
                txn,
                coord,
                at,
                redo,
            } => {
                let redo = redo.into_iter().map(ImageView::to_owned).collect();
                let t = InDoubt {
                    start,
                    coord,
                    at,
                    redo,
                };
                self.in_doubt.insert(txn, t);
            }
            Record::Outcome { txn, commit_ts } => {
                if let (Some(mut t), Some(ts)) = (self.in_doubt.remove(&txn), commit_ts) {
                    t.at.ts = ts;
                    self.redone += 1;
                    let place = (t.start, order(&t.at));
                    let views: Vec<_> = t.redo.iter().map(RowImage::view).collect();
                    images.put(&views, place)?;
                }
            }
            Record::Committed { at, redo, .. } => {
                self.redone += 1;
                images.put(&redo, (start, order(&at)))?;
            }
            Record::Decided { txn, ts } => {
                self.decided.insert(txn, ts);
            }
            Record::Ended { txn } => {
                self.decided.remove(&txn);
            }
            Record::Started => self.starts += 1,
            Record::Bound { .. } => {}
            Record::Note {
                table,
                key,
                state,
                image,
            } => {
                if let Some(img) = image {
                    // Rows move only under protocols that commit in the log's order.
                    images.put(&[img], (start, u128::from(lsn)))?;
                }
                if state.is_empty() {
                    self.notes.remove(&(table, key));
                } else {
                    self.notes.insert((table, key), state);
                }
            }
        }
        Ok(())
    }
}

/// What a node's log held: transactions in doubt here, and the commit decisions of
/// transactions coordinated here (which a participant may ask about).
#[derive(Default)]
pub(super) struct Recovered {
    pub folded: Folded,
    /// Where the changes put back stand in the commit order.
    pub redo: Redo,
}

/// How far above a timestamp that crossed it the next bound is set (see
/// `Node::keep_below_bound`): Sundial's leases grow by about one per write of a hot row, so a
/// bound lasts minutes.
const BOUND_SLACK: u64 = 1 << 24;

/// Segment files of the log: a checkpoint frees the segments before it, so smaller ones
/// are freed sooner (at most this much is kept beyond the checkpoint).
const SEGMENT_BYTES: u64 = 16 << 20;

/// A node's write-ahead log.
pub(super) struct Wal {
    pub(super) log: SegmentLog,
    to_sync: Sender<(Lsn, Durable)>,
    /// Set once a write failed: nothing more is acknowledged.
    failed: AtomicBool,
    /// Where its checkpoint is kept, and the first record the checkpoint does not hold.
    pub(super) checkpoint: PathBuf,
    pub(super) checkpointed: AtomicU64,
}

impl Wal {
    /// Opens the log in `dir` (recovering a torn tail; damage elsewhere is an error naming
    /// the file and offset), and returns it with the queue its syncer thread serves.
    pub fn open(
        dir: &Path,
        checkpoint: &Path,
        fsync: FsyncPolicy,
    ) -> Result<(Wal, Receiver<(Lsn, Durable)>), QError> {
        let opts = LogOptions {
            fsync,
            segment_bytes: SEGMENT_BYTES,
            ..LogOptions::default()
        };
        Wal::open_with(dir, checkpoint, opts)
    }

    /// [`Wal::open`] with other options of the log.
    pub(super) fn open_with(
        dir: &Path,
        checkpoint: &Path,
        opts: LogOptions,
    ) -> Result<(Wal, Receiver<(Lsn, Durable)>), QError> {
        let log = crate::data_dir::open_log("write-ahead log", dir, opts)?;
        let (to_sync, synced) = crossbeam_channel::unbounded();
        let wal = Wal {
            log,
            to_sync,
            failed: AtomicBool::new(false),
            checkpoint: checkpoint.into(),
            checkpointed: AtomicU64::new(0),
        };
        Ok((wal, synced))
    }

    /// Appends `r`; `None` if the log failed (the error is reported once).
    pub(super) fn append(&self, r: &Record) -> Option<Lsn> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let bytes = postcard::to_allocvec(r).expect("log records encode");
        match self.log.append(&bytes) {
            Ok(lsn) => Some(lsn),
            Err(e) => {
                self.fail(&e);
                None
            }
        }
    }

    /// Appends `r` and waits until it is on disk (as the fsync policy has it); false if the
    /// log failed.
    fn append_durable(&self, r: &Record) -> bool {
        let Some(lsn) = self.append(r) else {
            return false;
        };
        match self.log.sync_to(lsn) {
            Ok(()) => true,
            Err(e) => {
                self.fail(&e);
                false
            }
        }
    }

    fn fail(&self, e: &dyn std::fmt::Display) {
        if !self.failed.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "the write-ahead log in {} failed: {e}; this node acknowledges nothing more \
                 (restart it once the disk is fixed)",
                self.log.dir().display()
            );
        }
    }

    /// Appends `r` and hands `then` to the syncer, to be done once `r` is on disk. Without a
    /// working log, `then` is never done: its transaction stays unanswered until the node
    /// stops, rather than be acknowledged without its record.
    fn append_then(&self, r: &Record, then: Durable) {
        if let Some(lsn) = self.append(r) {
            self.after(lsn, then);
        }
    }

    /// Hands `then` to the syncer, to be done once record `lsn` is on disk.
    fn after(&self, lsn: Lsn, then: Durable) {
        // The syncer holds the receiver until the node stops.
        let _ = self.to_sync.send((lsn, then));
    }

    pub fn stats_reader(&self) -> qstore_log::StatsReader {
        self.log.stats_reader()
    }

    /// Reports what the log did since it was opened (at the end of a run).
    pub fn report(&self, node: NodeId) {
        let s = self.log.stats();
        tracing::info!(
            "node {node}: write-ahead log: {} records, {} bytes, {} fsyncs ({:.1} records per \
             fsync)",
            s.appends,
            s.appended_bytes,
            s.syncs,
            s.appends as f64 / s.syncs.max(1) as f64
        );
    }

    /// The records from `from` to the last one appended, decoded, one at a time.
    pub(super) fn records(
        &self,
        from: Lsn,
    ) -> Result<impl Iterator<Item = Result<(Lsn, Vec<u8>), QError>> + '_, QError> {
        let dir = self.log.dir();
        let read = move |e: qstore_log::LogError| {
            QError::Other(format!(
                "cannot read the write-ahead log in {}: {e}",
                dir.display()
            ))
        };
        let items = self.log.read_from(from).map_err(read)?;
        Ok(items.map(move |item| item.map_err(read)))
    }

    /// Decodes record `lsn`, borrowing its images from `bytes`.
    pub(super) fn decode<'a>(
        &self,
        lsn: Lsn,
        bytes: &'a [u8],
    ) -> Result<Record<ImageView<'a>>, QError> {
        postcard::from_bytes(bytes).map_err(|e| {
            QError::Other(format!(
                "the write-ahead log in {}: record {lsn} passed its checksum but is not a log \
                 record ({e}): written by another version of qstore?",
                self.log.dir().display()
            ))
        })
    }
}

/// The redo of a transaction's changes to `store`: after-images of the rows it changed in place
/// (`undo` names them) or of its buffered copies (`writes`).
///
/// # Safety
/// In place, the caller holds `txn`'s exclusive grants on every row `undo` names, so that
/// nothing writes them meanwhile.
pub(super) unsafe fn redo_of(
    execution: Execution,
    store: &PartitionStore,
    undo: &UndoLog,
    writes: &WriteBuffer,
) -> Vec<RowImage> {
    match execution {
        Execution::InPlace => {
            let mut changed: Vec<(TableId, Key)> = undo.changed().collect();
            changed.sort_unstable();
            changed.dedup();
            changed
                .into_iter()
                .map(|(table, key)| {
                    let t = store.table(table);
                    // SAFETY: the caller holds the row exclusively (this function's
                    // contract): it is not written while it is copied.
                    let bytes = t.lookup(key).map(|rid| unsafe { t.row(rid) }.to_vec());
                    RowImage { table, key, bytes }
                })
                .collect()
        }
        Execution::Buffered => writes
            .iter()
            // Inserted, then deleted: nothing is installed.
            .filter(|w| w.rid.is_some() || w.present)
            .map(|w| RowImage {
                table: w.table,
                key: w.key,
                bytes: w.present.then(|| w.bytes.clone()),
            })
            .collect(),
    }
}

/// A place in the commit order across starts: the start, then the place within it.
pub(super) type Place = (u64, u128);

/// Puts after-images back into a store nothing else uses yet, keeping for every record the
/// image latest in the protocol's commit order.
#[derive(Default)]
pub(super) struct Redo {
    /// Per record, the commit-order place of the image in place.
    latest: FxHashMap<(TableId, Key), Place>,
}

impl Redo {
    /// Notes that the image of `row` in place is at `place` (put back from a checkpoint).
    pub(super) fn seed(&mut self, row: (TableId, Key), place: Place) {
        self.latest.insert(row, place);
    }

    fn apply(
        &mut self,
        store: &PartitionStore,
        images: &[ImageView<'_>],
        order: Place,
    ) -> Result<(), String> {
        for img in images {
            let place = (img.table, img.key);
            if self.latest.get(&place).is_some_and(|&o| o > order) {
                continue; // a later commit of the record is in place (Thomas write rule)
            }
            self.latest.insert(place, order);
            put(store, img)?;
        }
        Ok(())
    }
}

/// Recovery's [`Images`]: into the store.
struct Restore<'a> {
    store: &'a PartitionStore,
    redo: &'a mut Redo,
}

impl Images for Restore<'_> {
    fn put(&mut self, images: &[ImageView<'_>], place: Place) -> Result<(), String> {
        self.redo.apply(self.store, images, place)
    }
}

/// Puts `img` in place, as a record of the initial state: the history of a start begins
/// with the state recovered (the writers of earlier starts are not part of it).
pub(super) fn put(store: &PartitionStore, img: &ImageView<'_>) -> Result<(), String> {
    // SAFETY: recovery runs before any thread uses the store.
    unsafe { store.restore_row(img.table, img.key, img.bytes) }
}

impl<C: Cc> Node<C> {
    /// Puts the node's checkpoint back and replays the log after it onto its freshly loaded
    /// partition (see the module's documentation); what is still undecided is returned.
    pub(super) fn recover(&self) -> Result<Recovered, QError> {
        let Some(wal) = &self.wal else {
            return Ok(Recovered::default());
        };
        let began = Instant::now();
        let store = self.store();
        let mut out = Recovered::default();
        let loaded = super::checkpoint::load(wal, store, &mut out)?;
        let from = loaded.map_or(0, |c| c.upto);
        let dir = wal.log.dir().display();
        let mut replayed = 0u64;
        let mut restore = Restore {
            store,
            redo: &mut out.redo,
        };
        for item in wal.records(from)? {
            let (lsn, bytes) = item?;
            let record = wal.decode(lsn, &bytes)?;
            replayed += 1;
            let order = |at: &Attempt| self.cc.commit_order(at);
            out.folded
                .fold(lsn, record, order, &mut restore)
                .map_err(|why| {
                    QError::Other(format!(
                        "the write-ahead log in {dir}: record {lsn} holds {why}: the directory \
                         is not this cluster's"
                    ))
                })?;
        }
        wal.append(&Record::Started);
        if loaded.is_some() || replayed > 0 {
            let f = &out.folded;
            let checkpoint = match loaded {
                Some(c) => format!("a checkpoint of {} rows up to log record {from}", c.rows),
                None => "no checkpoint".into(),
            };
            tracing::info!(
                "node {}: recovered in {:.1?}: {checkpoint}, then {replayed} log records from \
                 {dir} ({} committed transactions redone in all, {} in doubt)",
                self.id,
                began.elapsed(),
                f.redone,
                f.in_doubt.len()
            );
        }
        Ok(out)
    }

    /// Logs a prepare record; the yes vote goes once it is durable.
    pub(super) fn log_prepare(
        &self,
        coord: NodeId,
        txn: TxnId,
        at: Attempt,
        redo: Vec<RowImage>,
        vote: Vote,
    ) {
        let r = Record::Prepared {
            txn,
            coord,
            at,
            redo,
        };
        self.wal_or_fail()
            .append_then(&r, Durable::Vote { coord, txn, vote });
    }

    /// Logs a one-phase commit's record; the commit goes on once it is durable.
    pub(super) fn log_commit(&self, txn: TxnId, at: Attempt, redo: Vec<RowImage>) {
        let r = Record::Committed { txn, at, redo };
        self.wal_or_fail().append_then(&r, Durable::Commit { txn });
    }

    /// For protocols whose timestamps must outlive a restart ([`Cc::BOUNDS_TIMESTAMPS`]):
    /// makes sure the log holds a bound above `ts`, and above every lease a commit at `ts`
    /// may extend ([`Cc::LEASE_REACH`]), before anything at `ts` is acknowledged. The bound
    /// is loose (`BOUND_SLACK` above), so that it is forced rarely, and a worker that finds
    /// it too low forces the next one itself. False if the log failed.
    pub(super) fn keep_below_bound(&self, ts: u64) -> bool {
        let (true, Some(wal)) = (C::BOUNDS_TIMESTAMPS, &self.wal) else {
            return true;
        };
        let ts = ts.saturating_add(C::LEASE_REACH);
        if ts < self.bound.load(Ordering::Acquire) {
            return true;
        }
        let _raising = self.raising_bound.lock();
        if ts < self.bound.load(Ordering::Acquire) {
            return true;
        }
        let bound = ts.saturating_add(BOUND_SLACK);
        if !wal.append_durable(&Record::Bound { ts: bound }) {
            return false;
        }
        self.bound.store(bound, Ordering::Release);
        true
    }

    fn wal_or_fail(&self) -> &Wal {
        self.wal.as_ref().expect("only a node with a log logs")
    }

    /// The outcome of a prepared transaction, as it reaches its participant; where it is in
    /// the log.
    pub(super) fn log_outcome(&self, txn: TxnId, commit_ts: Option<u64>) -> Option<Lsn> {
        self.wal
            .as_ref()
            .and_then(|wal| wal.append(&Record::Outcome { txn, commit_ts }))
    }

    /// Acknowledges the commit of `txn` to `coord` once its outcome, record `outcome`, is on
    /// disk (at once without a log).
    pub(super) fn ack_commit(&self, coord: NodeId, txn: TxnId, outcome: Option<Lsn>) {
        match (&self.wal, outcome) {
            (Some(wal), Some(lsn)) => wal.after(lsn, Durable::Ack { coord, txn }),
            // A log that failed acknowledges nothing more.
            (Some(_), None) => {}
            (None, _) => self.send(coord, txn, Body::CommitAck),
        }
    }

    /// Every participant of `txn`, decided here, has its outcome on disk.
    pub(super) fn log_end(&self, txn: TxnId) {
        if let Some(wal) = &self.wal {
            wal.append(&Record::Ended { txn });
        }
    }

    /// A coordinator's commit decision, forced; true if the commits must wait for it.
    pub(super) fn log_decision(&self, txn: TxnId, ts: u64) -> bool {
        match &self.wal {
            Some(wal) => {
                wal.append_then(&Record::Decided { txn, ts }, Durable::Decision { txn });
                true
            }
            None => false,
        }
    }

    /// The syncer thread: syncs the log for everything queued since the last sync, then
    /// hands the work that waited for it to the workers.
    pub(super) fn sync_loop(&self, queued: Receiver<(Lsn, Durable)>) {
        let Some(wal) = &self.wal else { return };
        let mut batch = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            match queued.recv_timeout(super::IDLE_WAIT) {
                Ok(first) => batch.push(first),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
            batch.extend(queued.try_iter());
            let last = batch.iter().map(|(lsn, _)| *lsn).max().unwrap_or_default();
            if let Err(e) = wal.log.sync_to(last) {
                wal.fail(&e);
                return;
            }
            for (_, d) in batch.drain(..) {
                let _ = self.durable_tx.send(d);
            }
        }
    }

    /// Work whose record is now durable.
    pub(super) fn on_durable(&self, d: Durable) {
        match d {
            Durable::Vote { coord, txn, vote } => self.send(coord, txn, Body::Vote(vote)),
            Durable::Commit { txn } => self.complete_commit(txn),
            Durable::Decision { txn } => self.send_commits(txn),
            Durable::Ack { coord, txn } => self.send(coord, txn, Body::CommitAck),
            Durable::Send(msgs) => {
                for (to, txn, msg) in msgs {
                    self.send(to, txn, Body::Peer(msg));
                }
            }
        }
    }

    /// Appends the protocol's note (see [`super::Port::log_note`]).
    pub(super) fn append_note(
        &self,
        (table, key): (TableId, Key),
        state: &[u8],
        image: Option<Option<&[u8]>>,
    ) -> Option<Lsn> {
        debug_assert!(!C::USES_TIMESTAMPS, "notes are put back in the log's order");
        let r = Record::Note {
            table,
            key,
            state: state.to_vec(),
            image: image.map(|bytes| RowImage {
                table,
                key,
                bytes: bytes.map(<[u8]>::to_vec),
            }),
        };
        self.wal.as_ref()?.append(&r)
    }

    /// Sends the protocol's messages `msgs` once record `lsn` is on disk.
    pub(super) fn send_when_durable(&self, lsn: Lsn, msgs: Vec<(NodeId, TxnId, Vec<u8>)>) {
        match &self.wal {
            Some(wal) => wal.after(lsn, Durable::Send(msgs)),
            None => self.on_durable(Durable::Send(msgs)),
        }
    }

    /// A participant asks what became of `txn`, which it prepared before it restarted. A
    /// transaction still running here is decided as usual; one this node has forgotten
    /// committed if its decision is logged, and aborted otherwise (presumed abort).
    pub(super) fn on_resolve(&self, from: NodeId, txn: TxnId) {
        if self.coords.shard(txn).lock().contains_key(&txn) {
            return;
        }
        let body = match self.decided.lock().get(&txn) {
            Some(&ts) => Body::Commit { ts },
            None => Body::Abort,
        };
        self.send(from, txn, body);
    }

    /// The coordinator's answer about a transaction in doubt here: its changes are put back
    /// or dropped, and the outcome logged.
    fn settle(
        &self,
        txn: TxnId,
        t: InDoubt,
        commit_ts: Option<u64>,
        redo: &mut Redo,
    ) -> Result<(), QError> {
        // Not waited for: nothing is acknowledged, and the coordinator keeps its decision.
        self.log_outcome(txn, commit_ts);
        let Some(ts) = commit_ts else { return Ok(()) };
        let at = Attempt { ts, ..t.at };
        // Without timestamps, nothing committed after it changed its records here: it held
        // them until its decision.
        let order = self.cc.commit_order(&at).unwrap_or(u128::MAX);
        let views: Vec<_> = t.redo.iter().map(RowImage::view).collect();
        redo.apply(self.store(), &views, (t.start, order))
            .map_err(|why| QError::Other(format!("transaction {txn:?} in doubt holds {why}")))
    }
}

/// A node hosted here, and its inbox.
pub(super) type Hosted<C> = (Arc<Node<C>>, Receiver<Envelope<IMsg>>);

/// How long recovery waits for the coordinators of transactions in doubt to answer.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Settles every transaction in doubt at the nodes hosted here before any of them serves:
/// asks their coordinators (answering other nodes' questions meanwhile) and applies the
/// answers. Returns the other messages that arrived meanwhile, per node, to be handled once
/// the node runs.
pub(super) fn settle_in_doubt<C: Cc>(
    nodes: &[Hosted<C>],
    recovered: Vec<Recovered>,
) -> Result<Vec<Vec<Envelope<IMsg>>>, QError> {
    let (mut in_doubt, mut redo): (Vec<_>, Vec<_>) = recovered
        .into_iter()
        .map(|r| (r.folded.in_doubt, r.redo))
        .unzip();
    let mut stash: Vec<Vec<Envelope<IMsg>>> = nodes.iter().map(|_| Vec::new()).collect();
    if in_doubt.iter().all(|d| d.is_empty()) {
        return Ok(stash);
    }
    // Transactions a node coordinated itself: its own log decides.
    for (i, (node, _)) in nodes.iter().enumerate() {
        let own: Vec<TxnId> = in_doubt[i]
            .iter()
            .filter(|(_, t)| t.coord == node.id)
            .map(|(&txn, _)| txn)
            .collect();
        for txn in own {
            let t = in_doubt[i].remove(&txn).expect("listed above");
            let ts = node.decided.lock().get(&txn).copied();
            node.settle(txn, t, ts, &mut redo[i])?;
        }
    }
    let ask = |i: usize, d: &FxHashMap<TxnId, InDoubt>| {
        for (&txn, t) in d {
            nodes[i].0.send(t.coord, txn, Body::Resolve);
        }
    };
    for (i, d) in in_doubt.iter().enumerate() {
        ask(i, d);
    }
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut next_report = Instant::now() + Duration::from_secs(2);
    while in_doubt.iter().any(|d| !d.is_empty()) {
        let mut sel = Select::new();
        for (_, inbox) in nodes {
            sel.recv(inbox);
        }
        let Ok(op) = sel.select_timeout(Duration::from_millis(100)) else {
            if Instant::now() > deadline {
                let left: usize = in_doubt.iter().map(|d| d.len()).sum();
                return Err(QError::Other(format!(
                    "{left} transactions prepared before the restart are still in doubt after \
                     {SETTLE_TIMEOUT:?}: their coordinators did not answer; start every server \
                     of the cluster"
                )));
            }
            if Instant::now() > next_report {
                next_report += Duration::from_secs(5);
                for (i, d) in in_doubt.iter().enumerate() {
                    tracing::info!(
                        "node {}: asking again about {} transactions in doubt",
                        nodes[i].0.id,
                        d.len()
                    );
                    ask(i, d);
                }
            }
            continue;
        };
        let i = op.index();
        let Ok(env) = op.recv(&nodes[i].1) else {
            return Err(QError::Other("the network closed during recovery".into()));
        };
        let node = &nodes[i].0;
        let txn = env.msg.txn;
        match env.msg.body {
            Body::Resolve => node.on_resolve(env.from, txn),
            Body::Commit { ts } if in_doubt[i].contains_key(&txn) => {
                let t = in_doubt[i].remove(&txn).expect("checked above");
                node.settle(txn, t, Some(ts), &mut redo[i])?;
            }
            Body::Abort if in_doubt[i].contains_key(&txn) => {
                let t = in_doubt[i].remove(&txn).expect("checked above");
                node.settle(txn, t, None, &mut redo[i])?;
            }
            _ => stash[i].push(env),
        }
    }
    Ok(stash)
}

#[cfg(test)]
mod tests {
    use super::super::msg::Age;
    use super::*;
    use crate::cluster::Cluster;
    use qstore_core::RunConfig;

    /// A two-node no_wait cluster on `dir`: started (recovering), then stopped; returns node
    /// 1's row `key` of table 0.
    fn start_and_read(cfg: &RunConfig, key: Key) -> Vec<u8> {
        let workload = qstore_workload::build(cfg).unwrap();
        let cluster = Cluster::start(
            cfg.clone(),
            workload.catalog(),
            workload.partition_map().clone(),
            &|p, loader| workload.load(p, loader),
            false,
        )
        .unwrap();
        let stopped = cluster.stop();
        let table = stopped.ctx().server_store(NodeId(1)).table(0);
        let rid = table.lookup(key).expect("the row exists");
        // SAFETY: the cluster stopped: nothing writes the row.
        unsafe { table.row(rid) }.to_vec()
    }

    fn append(dir: &Path, r: &Record) {
        let (wal, _) =
            Wal::open(dir, &dir.with_file_name("checkpoint"), FsyncPolicy::Always).unwrap();
        let lsn = wal.append(r).unwrap();
        wal.log.sync_to(lsn).unwrap();
    }

    #[test]
    fn the_log_bounds_every_timestamp_it_names() {
        struct Nowhere;
        impl Images for Nowhere {
            fn put(&mut self, _: &[ImageView<'_>], _: Place) -> Result<(), String> {
                Ok(())
            }
        }
        let at = |ts| Attempt {
            age: Age {
                birth_us: 0,
                id: TxnId(1),
            },
            ts,
        };
        let mut f = Folded::default();
        let mut fold = |lsn, r| f.fold(lsn, r, |_| None, &mut Nowhere).unwrap();
        let redo = Vec::new();
        fold(
            0,
            Record::Committed {
                txn: TxnId(1),
                at: at(10),
                redo,
            },
        );
        fold(
            1,
            Record::Decided {
                txn: TxnId(2),
                ts: 20,
            },
        );
        fold(2, Record::Started);
        assert_eq!(f.bound, 21, "past the largest timestamp named");
        let mut fold = |lsn, r| f.fold(lsn, r, |_| None, &mut Nowhere).unwrap();
        fold(3, Record::Bound { ts: 1000 });
        fold(
            4,
            Record::Outcome {
                txn: TxnId(3),
                commit_ts: Some(30),
            },
        );
        assert_eq!(f.bound, 1000, "a bound logged ahead");
    }

    #[test]
    fn a_transaction_in_doubt_is_settled_by_its_coordinators_log() {
        let dir = std::env::temp_dir().join(format!("qstore-wal-doubt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cfg = RunConfig::default();
        cfg.protocol.name = "no_wait".into();
        cfg.cluster.nodes = 2;
        cfg.cluster.workers = 1;
        cfg.workload.ycsb.records_per_partition = 100;
        cfg.durability.data_dir = dir.to_string_lossy().into_owned();
        // Keys of node 1 (YCSB lays keys out round robin by default or in ranges; find one).
        let workload = qstore_workload::build(&cfg).unwrap();
        let pmap = workload.partition_map().clone();
        let mut keys = (0..1_000u64).filter(|&k| pmap.partition_of(0, k).0 == 1);
        let (committed_key, aborted_key, own_key) = (
            keys.next().unwrap(),
            keys.next().unwrap(),
            keys.next().unwrap(),
        );
        let before = start_and_read(&cfg, committed_key);
        let untouched = start_and_read(&cfg, aborted_key);
        let changed = vec![0xab; before.len()];
        let at = |id| Attempt {
            age: Age {
                birth_us: 0,
                id: TxnId(id),
            },
            ts: 0,
        };
        // Node 1 prepared two transactions coordinated by node 0 and one it coordinated
        // itself, and crashed; node 0 logged the decision to commit the first one only, node
        // 1 its own.
        let (node0, node1) = (dir.join("server-0/wal"), dir.join("server-1/wal"));
        for (id, key, coord) in [(7, committed_key, 0), (8, aborted_key, 0), (9, own_key, 1)] {
            let redo = vec![RowImage {
                table: 0,
                key,
                bytes: Some(changed.clone()),
            }];
            let txn = TxnId(id);
            let prepared = Record::Prepared {
                txn,
                coord: NodeId(coord),
                at: at(id),
                redo,
            };
            append(&node1, &prepared);
        }
        append(
            &node0,
            &Record::Decided {
                txn: TxnId(7),
                ts: 0,
            },
        );
        assert_eq!(start_and_read(&cfg, committed_key), changed, "committed");
        assert_eq!(
            start_and_read(&cfg, aborted_key),
            untouched,
            "presumed aborted"
        );
        // The outcomes are logged: a later start redoes the commit without asking.
        assert_eq!(start_and_read(&cfg, committed_key), changed);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
