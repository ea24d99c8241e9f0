//! Checkpoints of a deterministic protocol's command log: a copy of each partition at one
//! boundary of the global order (a Q-Store batch, a Calvin epoch), taken by every node of the
//! cluster at the same boundary, so that the log before it can be dropped.
//!
//! Q-Store and Calvin log their input (planner batches, sequenced epochs), so recovery
//! re-executes the log; a batch's (an epoch's) transactions exchange values across nodes, so
//! every node must resume from the same boundary. Hence one boundary for the whole cluster:
//!
//! 1. **Choosing it.** Node 0, when `checkpoint_interval_s` has passed, marks what it sends
//!    every node of boundary `c` (Q-Store: the plan of its first planner; Calvin: its
//!    sequencer's epoch batch): "checkpoint after `c`". Every node gets that mark before it
//!    could run anything after `c` (Q-Store: plans of one planner travel in order, and rank
//!    0's come first; Calvin: no node schedules epoch `c + 1` before it holds every
//!    sequencer's batch of `c`).
//! 2. **Taking it.** A node then runs nothing after `c` until everything up to `c` has run
//!    and been decided here; at that moment nothing runs, and the node copies its
//!    partition's rows into memory (the pause: a copy of the partition, tens of milliseconds
//!    per million small rows) and goes on. A background thread writes the copy as a snapshot
//!    file (temporary file, synced, renamed) and tells every node.
//! 3. **Forgetting the log.** Once every node has its checkpoint of `c` on disk, each node
//!    lets its log forget the entries up to `c`, and deletes its older checkpoints.
//! 4. **Recovering.** A restarted node tells every node which checkpoints it holds, and
//!    hears theirs; all restore the newest checkpoint every node holds (one exists: a node
//!    deletes a checkpoint only once every node has a newer one), and replay the log after
//!    it. A node without checkpoints, in a cluster whose logs are whole, replays from the
//!    start.
//!
//! With replication, "the cluster" above is each cluster instance: every instance runs the
//! same boundaries in the same order, so each checkpoints on its own (its node 0 marks, its
//! nodes agree among themselves), and each member of a replica group lets its own copy of
//! the group's log forget what its instance's common checkpoint holds.
//!
//! A checkpoint file holds a head (partition, boundary) and the partition's rows, by table
//! and key, in records of at most `ROWS_PER_RECORD` rows and about `RECORD_BYTES` bytes.

use crate::cluster::EngineCtx;
use crate::history::HistoryRecorder;
use parking_lot::{Condvar, Mutex};
use qstore_core::txn::RowLoader;
use qstore_core::{Key, NodeId, PartitionId, QError, TableId};
use qstore_log::{open_snapshot, SnapshotReader, SnapshotWriter};
use qstore_net::Transport;
use qstore_storage::PartitionStore;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Rows per record of a checkpoint file.
const ROWS_PER_RECORD: usize = 1024;
/// Bytes of rows after which a record ends early (rows may be up to 1 MiB each).
const RECORD_BYTES: usize = 1 << 20;
/// How long a restarted node waits to hear every node's checkpoints.
const AGREE_WAIT: Duration = Duration::from_secs(60);
/// How often it asks again meanwhile (a node not listening yet missed the question).
const ASK_EVERY: Duration = Duration::from_millis(200);

/// The message a protocol's nodes announce their checkpoints with.
pub(crate) trait CheckpointMsg: Serialize + Send + 'static {
    /// The checkpoints the sender holds, by boundary; `asking` for the receiver's.
    fn checkpoints(have: Vec<u64>, asking: bool) -> Self;
}

/// A checkpoint's first record.
#[derive(Serialize, Deserialize)]
struct Head {
    partition: PartitionId,
    /// It holds everything up to this boundary, and nothing after it.
    batch: u64,
}

/// A row as a checkpoint keeps it.
#[derive(Serialize, Deserialize)]
struct Row<'a> {
    table: TableId,
    key: Key,
    #[serde(with = "serde_bytes", borrow)]
    bytes: Cow<'a, [u8]>,
}

/// A partition's rows, encoded in records, ready to be written.
pub(crate) struct Image {
    batch: u64,
    records: Vec<Vec<u8>>,
}

/// A node's checkpoints: where they are, which ones every node has, and what the log may
/// forget.
pub(crate) struct Checkpointer {
    me: NodeId,
    part: usize,
    partition: PartitionId,
    /// The server that is each node of the instance.
    peers: Vec<NodeId>,
    dir: PathBuf,
    /// What a boundary is called (in file names and messages): "batch", "epoch".
    unit: &'static str,
    /// Node 0 (Q-Store: its first planner): how often it marks a checkpoint (`None`: never); when it
    /// last did, and whether that checkpoint is still being taken here.
    every: Option<Duration>,
    marked: Mutex<Instant>,
    /// Checkpoints marked and not taken yet here, by batch.
    pending: Mutex<BTreeSet<u64>>,
    /// By node of the instance: the checkpoints it holds (from its answer at the start, and
    /// each one it took since), `None` until heard.
    held: Mutex<Vec<Option<BTreeSet<u64>>>>,
    heard: Condvar,
    /// Log entries applied here, (index, batch), oldest first, until a checkpoint of every
    /// node covers them.
    applied: Mutex<VecDeque<(u64, u64)>>,
    /// The log may forget entries before this index (0: none).
    compactable: AtomicU64,
    /// Batches up to this one came from the checkpoint restored (0: none, else batch + 1).
    restored: AtomicU64,
    /// The checkpoint restored is kept while the process runs: the run's history starts
    /// from it, and the serial oracle reads it.
    keep_restored: AtomicBool,
    writer: Mutex<Option<crossbeam_channel::Sender<Image>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    /// The checkpointer of server `me`, if it has a data directory: its checkpoints are in
    /// `subdir` of it, one per boundary called `unit`.
    pub fn open(
        ctx: &EngineCtx,
        me: NodeId,
        subdir: &str,
        unit: &'static str,
    ) -> Result<Option<Arc<Checkpointer>>, QError> {
        let Some(dir) = &ctx.data_dirs[me.index()] else {
            return Ok(None);
        };
        let every = ctx.cfg.durability.checkpoint_interval();
        let dir = dir.path().join(subdir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| QError::Other(format!("cannot create {}: {e}", dir.display())))?;
        let nodes = ctx.nodes() as usize;
        let partition = ctx.placement.partition_of(me);
        let peers = (0..nodes as u32)
            .map(|p| ctx.placement.peer_of(me, PartitionId(p)))
            .collect();
        let c = Arc::new(Checkpointer::new(me, partition, peers, (dir, unit), every));
        let mine = c.list()?;
        c.held.lock()[c.part] = Some(mine);
        Ok(Some(c))
    }

    /// Server `me`'s checkpointer, which is node `partition` of its instance (`peers`: the
    /// server of each node), keeping checkpoints in `dir` with file names of `unit`, and
    /// (node 0) marking them `every`.
    fn new(
        me: NodeId,
        partition: PartitionId,
        peers: Vec<NodeId>,
        (dir, unit): (PathBuf, &'static str),
        every: Option<Duration>,
    ) -> Checkpointer {
        let nodes = peers.len();
        Checkpointer {
            me,
            part: partition.index(),
            partition,
            peers,
            dir,
            unit,
            every,
            marked: Mutex::new(Instant::now()),
            pending: Mutex::new(BTreeSet::new()),
            held: Mutex::new(vec![None; nodes]),
            heard: Condvar::new(),
            applied: Mutex::new(VecDeque::new()),
            compactable: AtomicU64::new(0),
            restored: AtomicU64::new(0),
            keep_restored: AtomicBool::new(false),
            writer: Mutex::new(None),
            thread: Mutex::new(None),
        }
    }

    fn path(&self, batch: u64) -> PathBuf {
        path_of(&self.dir, self.unit, batch)
    }

    /// The complete checkpoints in the directory, by batch.
    fn list(&self) -> Result<BTreeSet<u64>, QError> {
        let read = std::fs::read_dir(&self.dir)
            .map_err(|e| QError::Other(format!("cannot list {}: {e}", self.dir.display())))?;
        let mut found = BTreeSet::new();
        for entry in read.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".snap.tmp") {
                // A write a crash cut short: the checkpoints before it are whole.
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            if let Some(b) = name
                .strip_prefix(self.unit)
                .and_then(|n| n.strip_prefix('-'))
                .and_then(|n| n.strip_suffix(".snap"))
                .and_then(|n| n.parse().ok())
            {
                found.insert(b);
            }
        }
        Ok(found)
    }

    // ---- recovery ----

    /// Asks every node which checkpoints it holds (and tells them ours).
    pub fn ask<M: CheckpointMsg>(&self, net: &dyn Transport<M>) {
        let have: Vec<u64> = self.held.lock()[self.part]
            .iter()
            .flatten()
            .copied()
            .collect();
        for (p, &peer) in self.peers.iter().enumerate() {
            if p != self.part {
                let msg = M::checkpoints(have.clone(), true);
                net.send(self.me, peer, msg);
            }
        }
    }

    /// A node told which checkpoints it holds (at its start, `asking` for ours, or one it
    /// took since); returns our answer when it asked.
    pub fn heard_from<M: CheckpointMsg>(
        &self,
        from: NodeId,
        have: Vec<u64>,
        asking: bool,
    ) -> Option<M> {
        let Some(p) = self.peers.iter().position(|&n| n == from) else {
            tracing::error!(
                "node {}: checkpoints announced by node {from}, not of its instance",
                self.me
            );
            return None;
        };
        {
            let mut held = self.held.lock();
            held[p].get_or_insert_with(BTreeSet::new).extend(have);
            self.heard.notify_all();
        }
        self.forget_covered();
        asking.then(|| {
            let held = self.held.lock();
            M::checkpoints(held[self.part].iter().flatten().copied().collect(), false)
        })
    }

    /// Waits until every node said which checkpoints it holds, and returns the newest one
    /// all hold (`None`: there is none, and every log must still be whole).
    pub fn agree<M: CheckpointMsg>(&self, net: &dyn Transport<M>) -> Result<Option<u64>, QError> {
        let deadline = Instant::now() + AGREE_WAIT;
        let mut held = self.held.lock();
        while let Some(p) = held.iter().position(Option::is_none) {
            if Instant::now() > deadline {
                return Err(QError::Other(format!(
                    "node {}: node {} did not say which checkpoints it holds in {AGREE_WAIT:?}: \
                     every server of the cluster must be started to recover",
                    self.me, self.peers[p]
                )));
            }
            parking_lot::MutexGuard::unlocked(&mut held, || self.ask(net));
            self.heard.wait_for(&mut held, ASK_EVERY);
        }
        let mut sets = held.iter().flatten();
        let first = sets.next().cloned().unwrap_or_default();
        let common = sets.fold(first, |acc, s| acc.intersection(s).copied().collect());
        Ok(common.last().copied())
    }

    /// Puts checkpoint `batch` into `store` (loaded with the workload's initial data), in
    /// place of its rows; replay then skips the batches it holds. Returns the rows restored.
    ///
    /// # Safety
    /// No other thread may use the store (recovery runs before any does).
    pub unsafe fn restore(&self, batch: u64, store: &PartitionStore) -> Result<u64, QError> {
        let path = self.path(batch);
        let failed = |e: String| QError::Other(format!("the checkpoint {}: {e}", path.display()));
        let (head, rows) = open(&path)?;
        if head.partition != self.partition || head.batch != batch {
            return Err(failed(format!(
                "it holds {unit} {} of partition {}, not {unit} {batch} of partition {}",
                head.batch,
                head.partition,
                self.partition,
                unit = self.unit
            )));
        }
        // SAFETY: the caller's promise.
        let count = unsafe { put_back(rows, store) }.map_err(|e| failed(e.to_string()))?;
        self.restored.store(batch + 1, Ordering::Release);
        Ok(count)
    }

    /// Where replay starts: batches below it came from the restored checkpoint.
    pub fn replay_from(&self) -> u64 {
        self.restored.load(Ordering::Acquire)
    }

    /// The checkpoint restored, if any: its batch and file, kept while this process runs
    /// (a history that starts from it needs it).
    pub fn keep_restored(&self) -> Option<(u64, PathBuf)> {
        self.keep_restored.store(true, Ordering::Release);
        self.restored()
    }

    /// The checkpoint restored, if any: its batch and file.
    pub fn restored(&self) -> Option<(u64, PathBuf)> {
        let from = self.replay_from();
        (from > 0).then(|| (from - 1, self.path(from - 1)))
    }

    /// Whether a restarted node whose group log begins at entry `first` can recover, with
    /// checkpointer `this` (if it has a data directory): the entries before it must be in
    /// the checkpoint it restored (see `Applier::log_starts_at`).
    pub fn log_starts_at(this: Option<&Self>, first: u64) -> Result<(), String> {
        if first <= 1 || this.is_some_and(|c| c.restored().is_some()) {
            return Ok(());
        }
        let dir = this.and_then(|c| c.dir.file_name()).unwrap_or_default();
        Err(format!(
            "its group log starts at entry {first}: the entries before it are gone, and no \
             checkpoint every server holds was restored (one was deleted or damaged?); put the \
             checkpoints back in every server's {} directory, or start with new data \
             directories",
            dir.to_string_lossy()
        ))
    }

    // ---- taking checkpoints ----

    /// Node 0, sending what it has of boundary `batch` (Q-Store: its first planner's plan;
    /// Calvin: its sequencer's epoch): whether to mark it as a checkpoint's.
    pub fn mark_due(&self, batch: u64) -> bool {
        let Some(every) = self.every else {
            return false;
        };
        let mut marked = self.marked.lock();
        // One at a time: the next is marked once this one is taken here.
        if marked.elapsed() < every || !self.pending.lock().is_empty() {
            return false;
        }
        *marked = Instant::now();
        tracing::debug!("node {}: checkpoint after {} {batch}", self.me, self.unit);
        true
    }

    /// Node 0 marked checkpoint `batch`: nothing after it runs here until it is taken.
    /// Returns the first batch (epoch) held back.
    pub fn schedule(&self, batch: u64) -> u64 {
        let mut pending = self.pending.lock();
        pending.insert(batch);
        pending.first().map_or(u64::MAX, |b| b + 1)
    }

    /// The first batch held back by a checkpoint not taken yet (`u64::MAX`: none).
    pub fn hold_from(&self) -> u64 {
        self.pending.lock().first().map_or(u64::MAX, |b| b + 1)
    }

    /// Takes the pending checkpoint, if everything up to it has run and been decided here
    /// (`retired` is past it): copies the partition and hands it to the writer. Returns the
    /// first batch (epoch) held back after it.
    ///
    /// # Safety
    /// Nothing may run meanwhile (Q-Store: every batch before `retired` is done, and none
    /// after the checkpoint may be claimed; Calvin: the scheduler holds no transaction).
    pub unsafe fn take_if_due(&self, retired: u64, store: &PartitionStore) -> u64 {
        let mut pending = self.pending.lock();
        let Some(&batch) = pending.first() else {
            return u64::MAX;
        };
        if retired <= batch {
            return batch + 1;
        }
        pending.pop_first();
        let started = Instant::now();
        // SAFETY: the caller's promise.
        let image = unsafe { copy(self.partition, batch, store) };
        tracing::debug!(
            "node {}: copied checkpoint {batch} in {:?}",
            self.me,
            started.elapsed()
        );
        if let Some(w) = self.writer.lock().as_ref() {
            let _ = w.send(image);
        }
        pending.first().map_or(u64::MAX, |b| b + 1)
    }

    /// Starts the thread that writes checkpoints and tells every node of each.
    pub fn start_writer<M: CheckpointMsg>(self: &Arc<Self>, net: Arc<dyn Transport<M>>) {
        let (tx, rx) = crossbeam_channel::unbounded::<Image>();
        *self.writer.lock() = Some(tx);
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name(format!("q{}-ckpt", self.me.0))
            .spawn(move || {
                for image in rx {
                    let batch = image.batch;
                    match write(&me.path(batch), image) {
                        Ok(bytes) => {
                            tracing::info!(
                                "node {}: checkpoint after {} {batch} on disk ({bytes} bytes)",
                                me.me,
                                me.unit
                            );
                            me.took(batch, &*net);
                        }
                        // The log is kept whole meanwhile: nothing is lost, the next one
                        // may succeed.
                        Err(e) => tracing::error!("node {}: checkpoint {batch}: {e}", me.me),
                    }
                }
            })
            .expect("spawn the checkpoint writer");
        *self.thread.lock() = Some(thread);
    }

    /// Stops the writer once it wrote what it was given.
    pub fn stop(&self) {
        self.writer.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    /// Checkpoint `batch` is on disk here: every node hears of it.
    fn took<M: CheckpointMsg>(&self, batch: u64, net: &dyn Transport<M>) {
        self.held.lock()[self.part]
            .get_or_insert_with(BTreeSet::new)
            .insert(batch);
        for (p, &peer) in self.peers.iter().enumerate() {
            if p != self.part {
                net.send(self.me, peer, M::checkpoints(vec![batch], false));
            }
        }
        self.forget_covered();
    }

    // ---- forgetting the log ----

    /// The newest checkpoint every node has on disk, as far as this node heard.
    fn common(&self) -> Option<u64> {
        let held = self.held.lock();
        held.iter()
            .map(|s| s.as_ref().and_then(|s| s.last().copied()))
            .min()
            .flatten()
    }

    /// Log entry `index`, of batch (epoch) `batch`, was applied here.
    pub fn applied(&self, index: u64, batch: u64) {
        if self.every.is_none() {
            // This cluster takes no checkpoints: its log is kept whole (and nothing piles
            // up here waiting for one).
            return;
        }
        self.applied.lock().push_back((index, batch));
        self.forget_covered();
    }

    /// Lets the log forget entries every node's checkpoint covers, and deletes this node's
    /// checkpoints older than the newest every node has.
    fn forget_covered(&self) {
        let Some(common) = self.common() else {
            return;
        };
        {
            let mut applied = self.applied.lock();
            while let Some(&(index, batch)) = applied.front() {
                if batch > common {
                    break;
                }
                applied.pop_front();
                self.compactable.fetch_max(index + 1, Ordering::AcqRel);
            }
        }
        let mut held = self.held.lock();
        let Some(mine) = held[self.part].as_mut() else {
            return;
        };
        let kept = self
            .keep_restored
            .load(Ordering::Acquire)
            .then(|| self.replay_from().wrapping_sub(1));
        let old: Vec<u64> = mine
            .range(..common)
            .copied()
            .filter(|&b| Some(b) != kept)
            .collect();
        for b in old {
            match std::fs::remove_file(self.path(b)) {
                Ok(()) => {
                    mine.remove(&b);
                }
                Err(e) => tracing::warn!(
                    "node {}: cannot delete the old checkpoint {}: {e}",
                    self.me,
                    self.path(b).display()
                ),
            }
        }
    }

    /// The log may forget entries before this index (`None`: none).
    pub fn compactable_before(&self) -> Option<u64> {
        match self.compactable.load(Ordering::Acquire) {
            0 => None,
            i => Some(i),
        }
    }
}

/// A node of a protocol that checkpoints, as recovery sees it.
pub(crate) trait Recovers {
    fn id(&self) -> NodeId;
    /// Its checkpointer (`None`: no data directory).
    fn checkpointer(&self) -> Option<&Arc<Checkpointer>>;
    fn store(&self) -> &PartitionStore;
    fn history(&self) -> Option<&HistoryRecorder>;
    /// Everything before batch (epoch) `from` came from the restored checkpoint: replay and
    /// new work start there.
    fn resume_at(&self, from: u64);
}

/// Durability, at a start: every local node with a data directory agrees with every node of
/// its instance on the newest checkpoint all hold, restores it (before its group log replays
/// and before anything runs), and starts writing checkpoints.
pub(crate) fn recover<N: Recovers, M: CheckpointMsg>(
    nodes: &[&N],
    net: &Arc<dyn Transport<M>>,
) -> Result<(), QError> {
    let nodes: Vec<(&N, &Arc<Checkpointer>)> = nodes
        .iter()
        .filter_map(|&n| n.checkpointer().map(|c| (n, c)))
        .collect();
    for (_, c) in &nodes {
        c.ask(&**net);
    }
    for &(n, c) in &nodes {
        if let Some(batch) = c.agree(&**net)? {
            let started = Instant::now();
            // SAFETY: recovery runs before anything of the node runs, and before its group's
            // log replays.
            let rows = unsafe { c.restore(batch, n.store()) }?;
            tracing::info!(
                "node {}: restored the checkpoint after {} {batch} ({rows} rows) in {:?}",
                n.id(),
                c.unit,
                started.elapsed()
            );
            n.resume_at(batch + 1);
            // A history starts from the checkpoint: it is kept for the serial oracle.
            if let Some((h, (b, path))) = n.history().zip(c.keep_restored()) {
                h.set_base(c.partition, b, path);
            }
        }
        c.start_writer(net.clone());
    }
    Ok(())
}

/// The file of checkpoint `batch` in `dir`, named by its `unit`.
fn path_of(dir: &Path, unit: &str, batch: u64) -> PathBuf {
    dir.join(format!("{unit}-{batch:020}.snap"))
}

/// Copies `store`'s rows into a checkpoint image of `batch`.
///
/// # Safety
/// No transaction may write the store meanwhile.
unsafe fn copy(partition: PartitionId, batch: u64, store: &PartitionStore) -> Image {
    let head = Head { partition, batch };
    let mut records = vec![postcard::to_stdvec(&head).expect("a head serializes")];
    for (t, table) in store.tables().iter().enumerate() {
        let mut rows = Vec::with_capacity(ROWS_PER_RECORD);
        let mut flush = |rows: &mut Vec<Row<'_>>| {
            if !rows.is_empty() {
                records.push(postcard::to_stdvec(&*rows).expect("rows serialize"));
                rows.clear();
            }
        };
        let mut keys = Vec::with_capacity(table.len());
        table.for_each(|key, rid| keys.push((key, rid)));
        // Sorted: a checkpoint of the same state is the same file.
        keys.sort_unstable_by_key(|&(k, _)| k);
        let mut bytes_in = 0;
        for (key, rid) in keys {
            // SAFETY: `rid` is live, and the caller promises no writer.
            let bytes = unsafe { table.row(rid) };
            bytes_in += bytes.len();
            rows.push(Row {
                table: t as TableId,
                key,
                bytes: Cow::Borrowed(bytes),
            });
            if rows.len() == ROWS_PER_RECORD || bytes_in >= RECORD_BYTES {
                flush(&mut rows);
                bytes_in = 0;
            }
        }
        flush(&mut rows);
    }
    Image { batch, records }
}

/// Makes `store` hold exactly `rows` (a copy of a partition): every row of it put back, and
/// every other row deleted (it was deleted before the copy). Returns the rows put back.
///
/// # Safety
/// No other thread may use the store meanwhile.
unsafe fn put_back(
    rows: impl Iterator<Item = Result<Row<'static>, QError>>,
    store: &PartitionStore,
) -> Result<u64, QError> {
    let mut kept: Vec<rustc_hash::FxHashSet<Key>> =
        store.tables().iter().map(|_| Default::default()).collect();
    let mut count = 0;
    for row in rows {
        let row = row?;
        let Some(seen) = kept.get_mut(row.table as usize) else {
            return Err(QError::Other(format!(
                "a row of unknown table {}",
                row.table
            )));
        };
        // SAFETY: the caller's promise.
        unsafe { store.restore_row(row.table, row.key, Some(&row.bytes)) }
            .map_err(QError::Other)?;
        seen.insert(row.key);
        count += 1;
    }
    for (t, table) in store.tables().iter().enumerate() {
        let mut gone = Vec::new();
        table.for_each(|key, _| {
            if !kept[t].contains(&key) {
                gone.push(key);
            }
        });
        for key in gone {
            // SAFETY: the caller's promise.
            unsafe { store.restore_row(t as TableId, key, None) }.map_err(QError::Other)?;
        }
    }
    Ok(count)
}

/// A copy of `store`'s rows, as records of rows (a checkpoint without its head): what a
/// stale cluster instance is rebuilt from (see `qstore::rebuild`).
///
/// # Safety
/// No transaction may write the store meanwhile.
pub(crate) unsafe fn copy_rows(store: &PartitionStore) -> Vec<Vec<u8>> {
    // SAFETY: the caller's promise.
    let mut image = unsafe { copy(PartitionId(0), 0, store) };
    image.records.remove(0);
    image.records
}

/// Makes `store` hold exactly the rows of `records` (from [`copy_rows`]). Returns the rows.
///
/// # Safety
/// No other thread may use the store meanwhile.
pub(crate) unsafe fn install_rows(
    records: Vec<Vec<u8>>,
    store: &PartitionStore,
) -> Result<u64, QError> {
    let rows =
        records
            .into_iter()
            .flat_map(|bytes| match postcard::from_bytes::<Vec<Row<'_>>>(&bytes) {
                Ok(rows) => rows
                    .into_iter()
                    .map(|r| {
                        Ok(Row {
                            table: r.table,
                            key: r.key,
                            bytes: Cow::Owned(r.bytes.into_owned()),
                        })
                    })
                    .collect::<Vec<_>>(),
                Err(e) => vec![Err(QError::Other(format!("damaged rows ({e})")))],
            });
    // SAFETY: the caller's promise.
    unsafe { put_back(rows, store) }
}

/// Writes `image` as the snapshot `path`; returns its size.
fn write(path: &Path, image: Image) -> Result<u64, QError> {
    let failed = |e: qstore_log::LogError| QError::Other(format!("{}: {e}", path.display()));
    let mut w = SnapshotWriter::create(path).map_err(failed)?;
    for r in &image.records {
        w.push(r).map_err(failed)?;
    }
    w.finish().map_err(failed)
}

/// A checkpoint's rows, decoded one at a time.
type Rows = Box<dyn Iterator<Item = Result<Row<'static>, QError>>>;

/// Opens checkpoint `path`: its head and its rows.
fn open(path: &Path) -> Result<(Head, Rows), QError> {
    let p = path.to_path_buf();
    let failed = move |e: String| QError::Other(format!("the checkpoint {}: {e}", p.display()));
    let snap: SnapshotReader = open_snapshot(path)
        .map_err(|e| failed(e.to_string()))?
        .ok_or_else(|| failed("it is missing".into()))?;
    let mut snap = snap.map(move |r| r.map_err(|e| e.to_string()));
    let head_bytes = snap
        .next()
        .ok_or_else(|| failed("it is empty".into()))?
        .map_err(&failed)?;
    let head: Head =
        postcard::from_bytes(&head_bytes).map_err(|e| failed(format!("a damaged head ({e})")))?;
    let rows = snap.flat_map(move |item| {
        let chunk = item.and_then(|b| {
            postcard::from_bytes::<Vec<Row<'_>>>(&b)
                .map(|rows| {
                    rows.into_iter()
                        .map(|r| Row {
                            table: r.table,
                            key: r.key,
                            bytes: Cow::Owned(r.bytes.into_owned()),
                        })
                        .collect::<Vec<_>>()
                })
                .map_err(|e| format!("damaged rows ({e})"))
        });
        match chunk {
            Ok(rows) => rows.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) => vec![Err(QError::Other(e))],
        }
    });
    Ok((head, Box::new(rows)))
}

/// Loads checkpoint `path` of `partition` through `loader` (the serial oracle starts from
/// the checkpoint a recovered run restored).
pub fn load_into(
    path: &Path,
    partition: PartitionId,
    loader: &mut dyn RowLoader,
) -> Result<(), QError> {
    let (head, rows) = open(path)?;
    if head.partition != partition {
        return Err(QError::Other(format!(
            "the checkpoint {} is of partition {}, not {partition}",
            path.display(),
            head.partition
        )));
    }
    let rows: Vec<Row<'static>> = rows.collect::<Result<_, _>>()?;
    let mut i = 0;
    while i < rows.len() {
        let table = rows[i].table;
        let end = rows[i..]
            .iter()
            .position(|r| r.table != table)
            .map_or(rows.len(), |n| i + n);
        let run = &rows[i..end];
        let mut keys = run.iter().map(|r| r.key);
        let mut at = i;
        loader.load_rows(table, &mut keys, &mut |key, row| {
            debug_assert_eq!(rows[at].key, key);
            if rows[at].bytes.len() == row.len() {
                row.copy_from_slice(&rows[at].bytes);
            }
            at += 1;
        })?;
        i = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::txn::TableSchema;
    use qstore_storage::RowVersion;

    fn store(p: u32) -> PartitionStore {
        let schema = TableSchema {
            name: "t".into(),
            row_size: 64,
            capacity_per_partition: 4096,
            keys_per_partition: 1 << 20,
            read_mostly: false,
        };
        PartitionStore::new(PartitionId(p), &[schema])
    }

    #[test]
    fn a_checkpoint_round_trips_and_refuses_another_partition() {
        let dir = std::env::temp_dir().join(format!("qstore-qckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let s = store(1);
        let t = &s.tables()[0];
        for k in 0..3000u64 {
            t.insert_with(k, RowVersion::INITIAL, |_, row| {
                row[..8].copy_from_slice(&(k * 7).to_le_bytes())
            })
            .unwrap();
        }
        let path = path_of(&dir, "batch", 41);
        // SAFETY: this thread alone uses the store.
        let image = unsafe { copy(PartitionId(1), 41, &s) };
        write(&path, image).unwrap();
        // A copy that has more rows and other values: restore puts back exactly the
        // checkpoint's.
        let back = store(1);
        let bt = &back.tables()[0];
        for k in 2990..3100u64 {
            bt.insert_with(k, RowVersion::INITIAL, |_, row| row.fill(9))
                .unwrap();
        }
        let (head, rows) = open(&path).unwrap();
        assert_eq!((head.partition, head.batch), (PartitionId(1), 41));
        assert_eq!(rows.count(), 3000);
        let c = Checkpointer::for_test(&dir, PartitionId(1));
        // SAFETY: this thread alone uses the store.
        assert_eq!(unsafe { c.restore(41, &back) }.unwrap(), 3000);
        assert_eq!(back.content_hash(), s.content_hash());
        assert_eq!(c.replay_from(), 42);
        let other = Checkpointer::for_test(&dir, PartitionId(2));
        // SAFETY: as above.
        let refused = unsafe { other.restore(41, &store(2)) }.unwrap_err();
        assert!(refused.to_string().contains("partition"), "{refused}");
        // The oracle's load gives the same partition.
        let loaded = store(1);
        let mut loader: &PartitionStore = &loaded;
        load_into(&path, PartitionId(1), &mut loader).unwrap();
        assert_eq!(loaded.content_hash(), s.content_hash());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_log_is_forgotten_only_up_to_the_checkpoint_every_node_has() {
        let dir = std::env::temp_dir().join(format!("qstore-qckpt-f-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Checkpointer::for_test(&dir, PartitionId(0));
        c.every = Some(Duration::from_secs(3600));
        c.peers = vec![NodeId(0), NodeId(1)];
        *c.held.lock() = vec![Some(BTreeSet::new()), None];
        for (i, b) in [(1, 0), (2, 1), (3, 1), (4, 2), (5, 3)] {
            c.applied(i, b);
        }
        assert_eq!(c.compactable_before(), None, "no checkpoint anywhere");
        c.held.lock()[0].as_mut().unwrap().extend([1, 3]);
        assert_eq!(c.compactable_before(), None, "node 1 has not answered");
        assert!(c
            .heard_from::<Announced>(NodeId(1), vec![1], true)
            .is_some());
        assert_eq!(
            c.compactable_before(),
            Some(4),
            "entries of batches 0 and 1"
        );
        assert!(c
            .heard_from::<Announced>(NodeId(1), vec![3], false)
            .is_none());
        assert_eq!(c.compactable_before(), Some(6));
        assert_eq!(c.common(), Some(3));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A protocol's announcement of its checkpoints.
    #[derive(Serialize)]
    struct Announced;

    impl CheckpointMsg for Announced {
        fn checkpoints(_: Vec<u64>, _: bool) -> Self {
            Announced
        }
    }

    impl Checkpointer {
        /// Node 0 of a one-node instance, or of `partition`'s, keeping checkpoints in `dir`.
        fn for_test(dir: &Path, partition: PartitionId) -> Checkpointer {
            let me = NodeId(partition.0);
            let at = (dir.to_path_buf(), "batch");
            let c = Checkpointer::new(me, PartitionId(0), vec![me], at, None);
            Checkpointer { partition, ..c }
        }
    }
}
