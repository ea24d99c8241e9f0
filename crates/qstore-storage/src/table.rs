//! Tables and partition stores.

use crate::index::{storable, Index};
use parking_lot::Mutex;
use qstore_core::txn::TableSchema;
use qstore_core::{PartitionId, QError, TableId, TxnId};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Asks the CPU to bring the cache line at `ptr` closer; a no-op where unsupported.
#[inline(always)]
pub(crate) fn prefetch_read(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs only SSE, which every x86_64 CPU has; it is a hint that
    // never faults and neither reads nor writes memory the program can observe, whatever the
    // address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// Position of a row inside its table; stable for the row's lifetime.
pub type RowId = u32;

/// Which version of a row is current: the transaction that wrote it, and which of that
/// transaction's writes to the row it is (0 for its first). Histories use it to tell the
/// versions a transaction read; (`TxnId::INITIAL`, 0) is the loaded row.
///
/// A version may be a **tombstone**: the row was deleted by its writer. Only buffered
/// protocols write tombstones (see [`Table::slot`]): their readers copy rows without
/// locking them, so a deleted row keeps its slot and its place in the index, and a reader
/// that meets it sees the key absent *at that version*, which it can validate like any
/// other read. Protocols that delete in place remove the key instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowVersion {
    pub writer: TxnId,
    pub seq: u16,
    pub dead: bool,
}

impl RowVersion {
    /// Transaction ids in versions are limited to 48 bits so a version packs into one word.
    pub const MAX_WRITER: u64 = (1 << 48) - 1;
    /// Writes of one transaction to one row are counted in 15 bits (the 16th marks
    /// tombstones in the packed word); the count saturates there.
    pub const MAX_SEQ: u16 = (1 << 15) - 1;
    pub const INITIAL: RowVersion = RowVersion::live(TxnId::INITIAL, 0);
    const DEAD_BIT: u64 = 1 << 63;

    /// The `seq`-th write of `writer` to a row that it left in place.
    pub const fn live(writer: TxnId, seq: u16) -> RowVersion {
        RowVersion {
            writer,
            seq,
            dead: false,
        }
    }

    /// The version `txn` installs when it writes a row whose current version is `self`.
    #[inline]
    pub fn next_for(self, txn: TxnId) -> RowVersion {
        let seq = if self.writer == txn {
            self.seq.saturating_add(1).min(Self::MAX_SEQ)
        } else {
            0
        };
        RowVersion::live(txn, seq)
    }

    /// The tombstone `txn` installs when it deletes a row whose current version is `self`.
    #[inline]
    pub fn deleted_by(self, txn: TxnId) -> RowVersion {
        RowVersion {
            dead: true,
            ..self.next_for(txn)
        }
    }

    #[inline]
    fn pack(self) -> u64 {
        debug_assert!(
            self.writer.0 <= Self::MAX_WRITER,
            "transaction id over 48 bits"
        );
        let dead = if self.dead { Self::DEAD_BIT } else { 0 };
        (self.writer.0 & Self::MAX_WRITER) | ((self.seq & Self::MAX_SEQ) as u64) << 48 | dead
    }

    #[inline]
    fn unpack(word: u64) -> RowVersion {
        RowVersion {
            writer: TxnId(word & Self::MAX_WRITER),
            seq: ((word >> 48) as u16) & Self::MAX_SEQ,
            dead: word & Self::DEAD_BIT != 0,
        }
    }
}

/// A table of one partition: fixed-size rows in one pre-sized buffer, a hash primary index,
/// and per row its current [`RowVersion`].
pub struct Table {
    schema: TableSchema,
    /// Start of `capacity * row_size` zero-initialised bytes, owned by this table.
    data: NonNull<u8>,
    capacity: usize,
    versions: Box<[AtomicU64]>,
    index: Index,
    /// Slots handed out so far (the high-water mark).
    allocated: AtomicUsize,
    free: Mutex<Vec<RowId>>,
    live: AtomicUsize,
    /// Keys removed while histories are recorded, with the versions their deletes removed
    /// and wrote: what a later read of the absent key observes ([`Table::absent_version`]).
    graves: Mutex<HashMap<u64, Vec<(RowVersion, RowVersion)>>>,
}

// SAFETY: `NonNull` alone is what keeps `Table` from being `Send`. `data` is a heap buffer
// the table owns outright (like a `Box<[u8]>`, freed only in `Drop`), with no tie to the
// thread that allocated it, so moving the table to another thread moves that ownership whole;
// every other field is `Send`.
unsafe impl Send for Table {}
// SAFETY: through `&Table`, row bytes are reached only (a) by the `unsafe` accessors `row` and
// `row_mut`, whose callers guarantee that nobody writes a row while anyone else reads or
// writes it, and (b) inside `insert` and `load`, which write only a slot they just took from
// `allocate`: one never handed out, or one whose key `remove` took out of the index. A
// remove writes the row, so by the same contract nobody else held its bytes then, and
// afterwards no lookup leads to the slot. `prefetch` reads nothing. Every other field is
// atomics, a lock, or never written after `new`.
unsafe impl Sync for Table {}

impl Drop for Table {
    fn drop(&mut self) {
        let len = Self::buffer_len(self.capacity, self.schema.row_size);
        // SAFETY: `data` came from `Box::<[u8]>::into_raw` of a buffer of exactly `len` bytes
        // in `new` (the same `buffer_len` of the same capacity and row size), and `drop` runs
        // once, so the box is rebuilt with its own length and freed exactly once.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.data.as_ptr(),
                len,
            )))
        };
    }
}

impl Table {
    /// Most rows a table can hold: row ids are 32 bits.
    pub const MAX_ROWS: usize = RowId::MAX as usize + 1;

    /// Bytes a table of `schema` takes once loaded: its rows, a version per row and its
    /// index. What a process can check against the memory it has before loading anything.
    /// `schema.capacity_per_partition` must be at most [`Table::MAX_ROWS`].
    pub fn footprint(schema: &TableSchema) -> u128 {
        let capacity = schema.capacity_per_partition.max(1);
        let per_row = schema.row_size + std::mem::size_of::<AtomicU64>();
        capacity as u128 * per_row as u128 + Index::footprint(capacity)
    }

    /// An empty table with room for `schema.capacity_per_partition` rows.
    pub fn new(schema: TableSchema) -> Self {
        let capacity = schema.capacity_per_partition.max(1);
        assert!(
            capacity <= Self::MAX_ROWS,
            "table {} of {capacity} rows: row ids are 32 bits",
            schema.name
        );
        let len = capacity
            .checked_mul(schema.row_size)
            .expect("table size overflows");
        // vec! of zeros comes from calloc: pages are zeroed lazily by the kernel.
        let buffer: Box<[u8]> = vec![0u8; len.max(1)].into_boxed_slice();
        let capacity = if len == 0 { 0 } else { capacity };
        debug_assert_eq!(buffer.len(), Self::buffer_len(capacity, schema.row_size));
        let data = NonNull::new(Box::into_raw(buffer) as *mut u8).expect("non-null allocation");
        let versions = (0..capacity).map(|_| AtomicU64::new(0)).collect();
        Table {
            index: Index::new(capacity),
            schema,
            data,
            capacity,
            versions,
            allocated: AtomicUsize::new(0),
            free: Mutex::new(Vec::new()),
            live: AtomicUsize::new(0),
            graves: Mutex::new(HashMap::new()),
        }
    }

    /// Bytes of the row buffer of a table of `capacity` rows of `row_size` bytes: at least
    /// one, so that the buffer is a real allocation.
    fn buffer_len(capacity: usize, row_size: usize) -> usize {
        (capacity * row_size).max(1)
    }

    pub fn schema(&self) -> &TableSchema {
        &self.schema
    }

    pub fn row_size(&self) -> usize {
        self.schema.row_size
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rows currently stored.
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots in use: the rows, and the tombstones that keep theirs.
    pub fn occupied(&self) -> usize {
        self.allocated.load(Ordering::Relaxed).min(self.capacity) - self.free.lock().len()
    }

    /// The row holding `key`, if any (a tombstone holds no key).
    #[inline]
    pub fn lookup(&self, key: u64) -> Option<RowId> {
        self.lookup_versioned(key).map(|(rid, _)| rid)
    }

    /// [`Table::lookup`] with the row's version: one load of the version word, for callers
    /// that need both.
    #[inline]
    pub fn lookup_versioned(&self, key: u64) -> Option<(RowId, RowVersion)> {
        let rid = self.index.get(key)?;
        let version = self.version(rid);
        (!version.dead).then_some((rid, version))
    }

    /// The slot of `key`, tombstone or not: what a buffered protocol copies under the row's
    /// latch, where the copy's version tells whether the row is there.
    #[inline]
    pub fn slot(&self, key: u64) -> Option<RowId> {
        self.index.get(key)
    }

    /// Hints the CPU to start fetching the index entry of `key`, without waiting for it. Called
    /// a step before [`Table::prefetch`], whose lookup then finds the entry in the cache and
    /// does not stall on it.
    #[inline]
    pub fn prefetch_index(&self, key: u64) {
        self.index.prefetch(key);
    }

    /// Hints the CPU to start fetching the row of `key` (index entry, row bytes and version)
    /// into the cache. Executors call it for a whole transaction before running it, so the
    /// cache misses of its accesses overlap instead of happening one after another. No effect
    /// on contents.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        if let Some(rid) = self.lookup(key) {
            let size = self.schema.row_size;
            let offset = rid as usize * size;
            // Every cache line the row spans (up to four): rows are not line-aligned, so a
            // 100-byte row may touch three.
            let first = offset & !63;
            let end = (offset + size).min(first + 256);
            for line in (first..end).step_by(64) {
                // The first line may begin before the row: start at the row itself there.
                let at = line.max(offset);
                // SAFETY: `rid` is live (just looked up), so `rid < capacity` and
                // offset <= at < offset + size <= capacity * size: the pointer stays inside
                // the buffer, as `add` requires. Prefetching it reads nothing.
                prefetch_read(unsafe { self.data.as_ptr().add(at) });
            }
            // Every access reads the version too; it lives in an array of its own.
            prefetch_read(self.versions[rid as usize].as_ptr() as *const u8);
        }
    }

    /// Read access to a row's bytes.
    ///
    /// # Safety
    /// `rid` must be a live row of this table, and no one may write the row while the returned
    /// slice is alive (the caller's concurrency control guarantees it).
    #[inline]
    pub unsafe fn row(&self, rid: RowId) -> &[u8] {
        debug_assert!((rid as usize) < self.capacity);
        let size = self.schema.row_size;
        // SAFETY: a live row's id is below `capacity` (`allocate` hands out no other), so its
        // `size` bytes at `rid * size` lie inside the `capacity * size`-byte buffer, which is
        // initialised (zeroed at creation) and lives as long as `&self`. Nobody writes them
        // while the slice lives, by this function's contract.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().add(rid as usize * size), size) }
    }

    /// Write access to a row's bytes.
    ///
    /// # Safety
    /// `rid` must be a live row of this table, and the caller must have exclusive access to
    /// the row (no other reference to its bytes) while the returned slice is alive.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn row_mut(&self, rid: RowId) -> &mut [u8] {
        debug_assert!((rid as usize) < self.capacity);
        let size = self.schema.row_size;
        // SAFETY: the bytes lie inside the buffer and are initialised, as in `row`; the caller
        // guarantees no other reference to them exists while the returned slice lives, so
        // the `&mut` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr().add(rid as usize * size), size) }
    }

    /// The row's current version.
    #[inline]
    pub fn version(&self, rid: RowId) -> RowVersion {
        RowVersion::unpack(self.versions[rid as usize].load(Ordering::Acquire))
    }

    #[inline]
    pub fn set_version(&self, rid: RowId, version: RowVersion) {
        self.versions[rid as usize].store(version.pack(), Ordering::Release);
    }

    /// [`Table::set_version`] for a buffered install, which may write a tombstone or a live
    /// version over one (a buffered insert of a deleted key): the row leaves or rejoins the
    /// rows [`Table::len`] counts. The caller holds the row's latch, so that nobody else
    /// changes the version meanwhile.
    pub fn install_version(&self, rid: RowId, version: RowVersion) {
        let before = self.version(rid);
        self.set_version(rid, version);
        match (before.dead, version.dead) {
            (false, true) => self.live.fetch_sub(1, Ordering::Relaxed),
            (true, false) => self.live.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    fn allocate(&self) -> Result<RowId, QError> {
        if let Some(rid) = self.free.lock().pop() {
            return Ok(rid);
        }
        let rid = self.allocated.fetch_add(1, Ordering::Relaxed);
        if rid >= self.capacity {
            self.allocated.fetch_sub(1, Ordering::Relaxed);
            return Err(QError::TableFull {
                table: self.schema.name.clone(),
                capacity: self.capacity,
            });
        }
        Ok(rid as RowId)
    }

    /// Inserts `key` with zeroed bytes and version `version`, and returns its row, or
    /// `Ok(None)` if the key exists. The new row becomes visible to lookups at once; the caller
    /// fills it under its own concurrency control (the row is the inserter's until published).
    pub fn insert(&self, key: u64, version: RowVersion) -> Result<Option<RowId>, QError> {
        self.insert_with(key, version, |_, _| {})
    }

    /// [`Table::insert`], with `fill(row id, zeroed bytes)` called before the row becomes
    /// visible to lookups: for an inserter whose readers do not wait for it (a buffered
    /// protocol installing a committed insert), which must publish the row complete.
    pub fn insert_with(
        &self,
        key: u64,
        version: RowVersion,
        fill: impl FnOnce(RowId, &mut [u8]),
    ) -> Result<Option<RowId>, QError> {
        if !storable(key) {
            return Err(QError::Other(format!("key {key} is reserved")));
        }
        if self.index.get(key).is_some() {
            return Ok(None);
        }
        let rid = self.allocate()?;
        // SAFETY: `rid` comes from `allocate`, so it is below `capacity`, and the slot was free
        // (never handed out, or given back by `remove` after its key left the index): no
        // lookup leads to it until the index insert below, so nobody else references it.
        let row = unsafe { self.row_mut(rid) };
        row.fill(0);
        fill(rid, row);
        self.set_version(rid, version);
        if !self.index.insert(key, rid) {
            // Another insert of the same key won the race.
            self.free.lock().push(rid);
            return Ok(None);
        }
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok(Some(rid))
    }

    /// Removes `key`; its slot is reused by later inserts. Returns the row it occupied.
    pub fn remove(&self, key: u64) -> Option<RowId> {
        let rid = self.index.remove(key)?;
        self.live.fetch_sub(1, Ordering::Relaxed);
        self.free.lock().push(rid);
        Some(rid)
    }

    /// [`Table::remove`] by a delete of the row at version `before` that wrote `grave`,
    /// remembered for histories: a later read of the absent key reads `grave` (see
    /// [`Table::absent_version`]) until the delete is undone ([`Table::unbury`]).
    pub fn remove_recorded(
        &self,
        key: u64,
        before: RowVersion,
        grave: RowVersion,
    ) -> Option<RowId> {
        let rid = self.remove(key)?;
        self.graves
            .lock()
            .entry(key)
            .or_default()
            .push((before, grave));
        Some(rid)
    }

    /// Forgets the recorded delete of `key` at version `before`: it was rolled back, so the
    /// key's absence (should its insert be rolled back too) goes back to the delete before.
    pub fn unbury(&self, key: u64, before: RowVersion) {
        let mut graves = self.graves.lock();
        if let Some(g) = graves.get_mut(&key) {
            if let Some(i) = g.iter().rposition(|&(b, _)| b == before) {
                g.remove(i);
            }
        }
    }

    /// The version a read of absent `key` observes, for histories: the latest delete that
    /// removed it ([`Table::remove_recorded`]), or the initial version (the key was never
    /// there, as far as the history goes).
    pub fn absent_version(&self, key: u64) -> RowVersion {
        self.graves
            .lock()
            .get(&key)
            .and_then(|g| g.last())
            .map_or(RowVersion::INITIAL, |&(_, grave)| grave)
    }

    /// Takes `key`'s row out of the table, for a protocol that moves records between nodes:
    /// its bytes and version, or `None` if the key is absent. The slot is reused by later
    /// inserts; the version travels with the bytes, so the row's history goes on where it
    /// lands ([`Table::adopt_row`]).
    ///
    /// # Safety
    /// The caller has exclusive access to the row (nobody else reads or writes its bytes).
    pub unsafe fn take_row(&self, key: u64) -> Option<(Vec<u8>, RowVersion)> {
        let (rid, version) = self.lookup_versioned(key)?;
        // SAFETY: `rid` is live, and the caller has the row to itself.
        let bytes = unsafe { self.row(rid) }.to_vec();
        self.remove(key);
        Some((bytes, version))
    }

    /// Puts a row taken from another table ([`Table::take_row`]) in place with its version.
    /// `Ok(false)` if the key is already here.
    pub fn adopt_row(&self, key: u64, bytes: &[u8], version: RowVersion) -> Result<bool, QError> {
        if bytes.len() != self.row_size() {
            return Err(QError::Other(format!(
                "a row of {} bytes for table {}, whose rows have {}",
                bytes.len(),
                self.schema.name,
                self.row_size()
            )));
        }
        let placed = self.insert_with(key, version, |_, row| row.copy_from_slice(bytes))?;
        Ok(placed.is_some())
    }

    /// Forgets the deletes recorded for absent `key`, for a protocol that moves the key to
    /// another node: the version a read of the absent key observes there
    /// ([`Table::absent_version`]), which [`Table::bury`] puts back where it lands.
    pub fn take_grave(&self, key: u64) -> RowVersion {
        let graves = self.graves.lock().remove(&key);
        graves
            .and_then(|g| g.last().copied())
            .map_or(RowVersion::INITIAL, |(_, grave)| grave)
    }

    /// Records that absent `key` was last deleted at version `grave` (moved here with
    /// [`Table::take_grave`]). The record's "before" is the grave itself, a dead version no
    /// live row's delete starts from, so [`Table::unbury`] never takes it back.
    pub fn bury(&self, key: u64, grave: RowVersion) {
        if grave != RowVersion::INITIAL {
            self.graves.lock().insert(key, vec![(grave, grave)]);
        }
    }

    /// Loads rows `keys` in bulk, filling each with `fill(key, row)`. Used before the run
    /// starts.
    pub fn load(
        &self,
        keys: impl Iterator<Item = u64>,
        mut fill: impl FnMut(u64, &mut [u8]),
    ) -> Result<(), QError> {
        let name = &self.schema.name;
        for key in keys {
            if !storable(key) {
                return Err(QError::Other(format!(
                    "key {key} of table {name} is reserved"
                )));
            }
            let rid = self.allocate()?;
            // SAFETY: `rid` comes from `allocate` (below `capacity`) and is not in the index
            // yet, so no lookup leads another thread to it: this is the only reference.
            fill(key, unsafe { self.row_mut(rid) });
            self.set_version(rid, RowVersion::INITIAL);
            if !self.index.insert(key, rid) {
                return Err(QError::Other(format!(
                    "duplicate key {key} loaded into table {name}"
                )));
            }
            self.live.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Order-independent hash of the table's contents (keys and row bytes, not versions):
    /// equal contents give equal hashes whatever the insertion order or slot layout.
    ///
    /// Must be called while no transaction writes the table.
    pub fn content_hash(&self) -> u64 {
        ContentSum::of(self).hash()
    }

    /// Calls `f(key, row)` for every row, tombstones left out (unspecified order).
    /// Quiescent tables only.
    pub fn for_each(&self, mut f: impl FnMut(u64, RowId)) {
        self.index.for_each(|key, rid| {
            if !self.version(rid).dead {
                f(key, rid)
            }
        });
    }
}

/// The order-independent sum a content hash is made of: the sums of tables that hold parts
/// of one table's rows add up to the whole table's (see [`PartitionStore::content_sums`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContentSum {
    sum: u64,
    rows: u64,
}

impl ContentSum {
    /// Of `t`'s rows (keys and bytes, not versions); quiescent tables only.
    fn of(t: &Table) -> Self {
        let mut s = ContentSum::default();
        t.for_each(|key, rid| {
            // SAFETY: `rid` is live (the index holds it), and the caller runs this only while
            // no transaction writes the table (see `Table::content_hash`), so nothing writes
            // the row while it is hashed.
            let bytes = unsafe { t.row(rid) };
            s.sum = s
                .sum
                .wrapping_add(xxhash_rust::xxh3::xxh3_64_with_seed(bytes, key));
            s.rows += 1;
        });
        s
    }

    pub fn add(&mut self, other: ContentSum) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.rows += other.rows;
    }

    pub fn hash(&self) -> u64 {
        qstore_core::rng::splitmix64(self.sum ^ qstore_core::rng::splitmix64(self.rows))
    }
}

/// The tables of one partition.
pub struct PartitionStore {
    pub id: PartitionId,
    tables: Vec<Table>,
}

impl PartitionStore {
    pub fn new(id: PartitionId, schemas: &[TableSchema]) -> Self {
        Self::with_room(id, schemas, 1)
    }

    /// A partition whose tables have room for `room` times their rows per partition (up to
    /// [`Table::MAX_ROWS`]): for protocols that move records of other partitions in.
    pub fn with_room(id: PartitionId, schemas: &[TableSchema], room: usize) -> Self {
        let widen = |s: &TableSchema| TableSchema {
            capacity_per_partition: s
                .capacity_per_partition
                .saturating_mul(room.max(1))
                .min(Table::MAX_ROWS),
            ..s.clone()
        };
        PartitionStore {
            id,
            tables: schemas.iter().map(widen).map(Table::new).collect(),
        }
    }

    #[inline]
    pub fn table(&self, id: TableId) -> &Table {
        &self.tables[id as usize]
    }

    pub fn tables(&self) -> &[Table] {
        &self.tables
    }

    /// Puts `bytes` in place as row `key` of `table` (`None`: removes the row), as a row of
    /// the initial state: recovery's way back to a recovered state (a checkpoint, a redo).
    ///
    /// # Safety
    /// No other thread may use the store meanwhile (recovery runs before any does).
    pub unsafe fn restore_row(
        &self,
        table: TableId,
        key: u64,
        bytes: Option<&[u8]>,
    ) -> Result<(), String> {
        let t = self
            .tables
            .get(table as usize)
            .ok_or_else(|| format!("a row of table {table}, which does not exist"))?;
        let Some(bytes) = bytes else {
            t.remove(key);
            return Ok(());
        };
        if bytes.len() != t.row_size() {
            return Err(format!(
                "a row of {} bytes for table {table}, whose rows have {}",
                bytes.len(),
                t.row_size()
            ));
        }
        let initial = RowVersion::INITIAL;
        match t.lookup(key) {
            Some(rid) => {
                // SAFETY: the caller guarantees no other thread uses the store, so nothing
                // else references the row's bytes.
                unsafe { t.row_mut(rid) }.copy_from_slice(bytes);
                t.set_version(rid, initial);
            }
            None => {
                t.insert_with(key, initial, |_, row| row.copy_from_slice(bytes))
                    .map_err(|e| format!("cannot put back key {key}: {e}"))?;
            }
        }
        Ok(())
    }

    /// Content hash of the whole partition (see [`Table::content_hash`]).
    pub fn content_hash(&self) -> u64 {
        content_hash_of(&self.content_sums())
    }

    /// Each table's [`ContentSum`].
    pub fn content_sums(&self) -> Vec<ContentSum> {
        self.tables.iter().map(ContentSum::of).collect()
    }
}

/// The content hash of a partition whose tables have `sums`.
pub fn content_hash_of(sums: &[ContentSum]) -> u64 {
    sums.iter().enumerate().fold(0u64, |acc, (i, s)| {
        acc ^ qstore_core::rng::splitmix64(s.hash().wrapping_add(i as u64))
    })
}

impl qstore_core::txn::RowLoader for &PartitionStore {
    fn load_rows(
        &mut self,
        table: TableId,
        keys: &mut dyn Iterator<Item = u64>,
        fill: &mut dyn FnMut(u64, &mut [u8]),
    ) -> Result<(), QError> {
        let t = self.tables.get(table as usize).ok_or_else(|| {
            QError::Other(format!(
                "table {table} does not exist in partition {}",
                self.id
            ))
        })?;
        t.load(keys, fill)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(cap: usize) -> TableSchema {
        TableSchema {
            name: "t".into(),
            row_size: 16,
            capacity_per_partition: cap,
            keys_per_partition: 1 << 32,
            read_mostly: false,
        }
    }

    fn v(writer: u64) -> RowVersion {
        RowVersion::live(TxnId(writer), 0)
    }

    #[test]
    fn footprint_counts_rows_versions_and_index_slots() {
        // 1000 rows of 16 bytes and an 8-byte version each; 2048 index slots of 12 bytes.
        assert_eq!(Table::footprint(&schema(1000)), 1000 * 24 + 2048 * 12);
        // A table of 2^32 rows, as big as row ids allow, is weighed without overflow.
        let most = Table::footprint(&schema(Table::MAX_ROWS));
        assert_eq!(most, (1u128 << 32) * 24 + (1u128 << 33) * 12);
    }

    #[test]
    #[should_panic(expected = "row ids are 32 bits")]
    fn a_table_beyond_32_bit_row_ids_is_refused() {
        Table::new(schema(Table::MAX_ROWS + 1));
    }

    #[test]
    fn versions_pack_and_count_writes_of_one_writer() {
        let t = Table::new(schema(1));
        let rid = t.insert(1, v(5)).unwrap().unwrap();
        let again = t.version(rid).next_for(TxnId(5));
        assert_eq!(again, RowVersion::live(TxnId(5), 1));
        t.set_version(rid, again);
        assert_eq!(t.version(rid), again);
        assert_eq!(
            again.next_for(TxnId(RowVersion::MAX_WRITER)),
            v(RowVersion::MAX_WRITER)
        );
    }

    #[test]
    fn insert_lookup_remove_reuse() {
        let t = Table::new(schema(2));
        let a = t.insert(10, v(1)).unwrap().unwrap();
        assert_eq!(t.insert(10, v(2)).unwrap(), None, "duplicate key refused");
        let b = t.insert(20, v(1)).unwrap().unwrap();
        assert_ne!(a, b);
        assert!(matches!(t.insert(30, v(1)), Err(QError::TableFull { .. })));
        assert_eq!(t.lookup(10), Some(a));
        assert_eq!(t.remove(10), Some(a));
        assert_eq!(t.lookup(10), None);
        assert_eq!(t.insert(30, v(3)).unwrap(), Some(a), "freed slot reused");
        assert_eq!(t.version(a), v(3));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_tombstone_keeps_its_slot_but_not_its_key() {
        let t = Table::new(schema(4));
        t.load(0..3, |k, r| r[0] = k as u8).unwrap();
        let empty_of_1 = Table::new(schema(4));
        empty_of_1
            .load([0, 2].into_iter(), |k, r| r[0] = k as u8)
            .unwrap();
        let rid = t.lookup(1).unwrap();
        let dead = t.version(rid).deleted_by(TxnId(7));
        assert!(dead.dead && dead.writer == TxnId(7));
        t.install_version(rid, dead);
        assert_eq!(t.version(rid), dead, "the dead mark survives packing");
        assert_eq!(t.lookup(1), None, "a deleted key is not found");
        assert_eq!(t.slot(1), Some(rid), "but its slot is");
        assert_eq!(t.len(), 2);
        let mut keys = Vec::new();
        t.for_each(|k, _| keys.push(k));
        keys.sort_unstable();
        assert_eq!(keys, [0, 2]);
        assert_eq!(t.content_hash(), empty_of_1.content_hash());
        // A buffered insert of the key writes a live version over the tombstone.
        let back = t.version(rid).next_for(TxnId(8));
        assert!(!back.dead);
        t.install_version(rid, back);
        assert_eq!((t.lookup(1), t.len()), (Some(rid), 3));
    }

    #[test]
    fn write_counts_saturate_below_the_dead_mark() {
        let most = RowVersion::live(TxnId(3), RowVersion::MAX_SEQ);
        assert_eq!(most.next_for(TxnId(3)), most);
        let t = Table::new(schema(1));
        let rid = t.insert(1, most).unwrap().unwrap();
        assert_eq!(t.version(rid), most);
        assert_eq!(t.lookup(1), Some(rid), "a full count is not a tombstone");
    }

    #[test]
    fn rows_keep_their_bytes() {
        let t = Table::new(schema(100));
        t.load(0..100, |k, row| row[..8].copy_from_slice(&k.to_le_bytes()))
            .unwrap();
        for k in 0..100u64 {
            let rid = t.lookup(k).unwrap();
            // SAFETY: `rid` is live (just looked up) and this test's thread is the only one
            // using the table.
            let row = unsafe { t.row(rid) };
            assert_eq!(u64::from_le_bytes(row[..8].try_into().unwrap()), k);
        }
        assert_eq!(t.len(), 100);
    }

    #[test]
    fn content_hash_ignores_order_and_sees_changes() {
        let a = Table::new(schema(10));
        let b = Table::new(schema(10));
        a.load(0..10, |k, r| r[0] = k as u8).unwrap();
        b.load((0..10).rev(), |k, r| r[0] = k as u8).unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
        let rid = b.lookup(3).unwrap();
        // SAFETY: `rid` is live, and this test's thread, the only one using the table, holds
        // no other reference to the row.
        unsafe { b.row_mut(rid)[1] = 9 };
        assert_ne!(a.content_hash(), b.content_hash());
        // Versions are not content.
        a.set_version(a.lookup(4).unwrap(), v(77));
        // SAFETY: `rid` is still live, and the slice written through above is gone: this is
        // again the only reference to the row.
        unsafe { b.row_mut(rid)[1] = 0 };
        assert_eq!(a.content_hash(), b.content_hash());
    }

    #[test]
    fn duplicate_keys_in_a_load_are_an_error() {
        let t = Table::new(schema(10));
        assert!(t.load([1, 2, 1].into_iter(), |_, _| {}).is_err());
    }
}
