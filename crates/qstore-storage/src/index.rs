//! The primary index: an open-addressing hash table whose lookups never write shared memory.
//!
//! Lookups are plain atomic loads, so executors on different cores reading the same index do
//! not bounce lock cache lines between them (a reader-writer lock's read side writes its lock
//! word on every lookup). Inserts and removals are serialised by a mutex and publish with
//! release stores: a slot's row id is written before its key, so a reader that sees the key
//! sees the row id.
//!
//! Contract (what the concurrency-control protocols guarantee): a lookup of a key never runs
//! concurrently with the removal of that same key. Lookups concurrent with inserts or removals
//! of other keys are always correct.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Slot states, as key values; these two keys cannot be stored.
const EMPTY: u64 = u64::MAX;
const TOMBSTONE: u64 = u64::MAX - 1;

/// Whether `key` can be stored in an index (the two largest keys mark free slots).
pub fn storable(key: u64) -> bool {
    key <= qstore_core::MAX_KEY
}

pub struct Index {
    keys: Box<[AtomicU64]>,
    rids: Box<[AtomicU32]>,
    mask: usize,
    writer: Mutex<()>,
}

/// Consecutive keys that share a run of slots: the keys of a run of [`RUN`] slots fill one
/// 64-byte cache line.
const RUN_BITS: u32 = 3;
const RUN: u64 = 1 << RUN_BITS;

/// Where a probe for `key` starts: runs of `RUN` consecutive keys are hashed to a place
/// together, and keep their order within it. Keys inserted one after the other (a TPC-C
/// order's lines, a district's next orders) then land in the cache line the previous insert
/// just brought in, instead of one cache miss each in an index of hundreds of MB; random keys
/// cost one miss either way.
#[inline]
fn home_slot(key: u64, mask: usize) -> usize {
    let run = (key >> RUN_BITS)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(29);
    ((run << RUN_BITS | (key & (RUN - 1))) as usize) & mask
}

impl Index {
    /// An index for up to `capacity` keys (sized at twice that, rounded to a power of two, so
    /// probe sequences stay short).
    pub fn new(capacity: usize) -> Self {
        let slots = Self::slots(capacity);
        Index {
            keys: (0..slots).map(|_| AtomicU64::new(EMPTY)).collect(),
            rids: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            mask: slots - 1,
            writer: Mutex::new(()),
        }
    }

    fn slots(capacity: usize) -> usize {
        (capacity.max(1) * 2).next_power_of_two()
    }

    /// Bytes an index for `capacity` keys takes: a key and a row id per slot.
    pub fn footprint(capacity: usize) -> u128 {
        let slot = (std::mem::size_of::<AtomicU64>() + std::mem::size_of::<AtomicU32>()) as u128;
        Self::slots(capacity) as u128 * slot
    }

    /// The row of `key`, if present.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        if !storable(key) {
            return None; // it would match a free slot's marker
        }
        let mut i = home_slot(key, self.mask);
        for _ in 0..=self.mask {
            let k = self.keys[i].load(Ordering::Acquire);
            if k == key {
                return Some(self.rids[i].load(Ordering::Relaxed));
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Starts fetching the first slot a lookup of `key` probes (its key and its row id) into
    /// the cache; reads nothing.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        let i = home_slot(key, self.mask);
        crate::table::prefetch_read(self.keys[i].as_ptr() as *const u8);
        crate::table::prefetch_read(self.rids[i].as_ptr() as *const u8);
    }

    /// The slot holding `key`, or where to put it (first tombstone or empty slot seen).
    fn find(&self, key: u64) -> Result<usize, Option<usize>> {
        let mut i = home_slot(key, self.mask);
        let mut free = None;
        for _ in 0..=self.mask {
            match self.keys[i].load(Ordering::Relaxed) {
                k if k == key => return Ok(i),
                EMPTY => return Err(free.or(Some(i))),
                TOMBSTONE => free = free.or(Some(i)),
                _ => {}
            }
            i = (i + 1) & self.mask;
        }
        Err(free)
    }

    /// Adds `key -> rid`. Returns false if the key is already present.
    ///
    /// # Panics
    /// If `key` is not [`storable`] or the table has no free slot (callers check both: keys
    /// are validated and tables hold at most half as many rows as the index has slots).
    pub fn insert(&self, key: u64, rid: u32) -> bool {
        assert!(storable(key), "reserved key {key}");
        let _w = self.writer.lock();
        match self.find(key) {
            Ok(_) => false,
            Err(slot) => {
                let slot = slot.expect("index sized at twice the table capacity");
                self.rids[slot].store(rid, Ordering::Relaxed);
                self.keys[slot].store(key, Ordering::Release);
                true
            }
        }
    }

    /// Removes `key`; returns its row.
    pub fn remove(&self, key: u64) -> Option<u32> {
        if !storable(key) {
            return None;
        }
        let _w = self.writer.lock();
        let slot = self.find(key).ok()?;
        let rid = self.rids[slot].load(Ordering::Relaxed);
        self.keys[slot].store(TOMBSTONE, Ordering::Release);
        self.clear_tombstones_before(slot);
        Some(rid)
    }

    /// Turns the run of tombstones that ends at `slot` back into empty slots when the slot
    /// after it is empty: no probe sequence can pass an empty slot, so none leads through
    /// that run to a key beyond it, and a lookup that now stops earlier finds what it would
    /// have found. Without this, tables whose keys come and go (rows moving between nodes,
    /// deleted orders) fill with tombstones until every lookup of an absent key probes the
    /// whole index. Called with the writer lock held.
    fn clear_tombstones_before(&self, slot: usize) {
        if self.keys[(slot + 1) & self.mask].load(Ordering::Relaxed) != EMPTY {
            return;
        }
        let mut i = slot;
        for _ in 0..=self.mask {
            if self.keys[i].load(Ordering::Relaxed) != TOMBSTONE {
                break;
            }
            self.keys[i].store(EMPTY, Ordering::Release);
            i = i.wrapping_sub(1) & self.mask;
        }
    }

    /// Calls `f(key, rid)` for every entry (unspecified order).
    pub fn for_each(&self, mut f: impl FnMut(u64, u32)) {
        for (k, r) in self.keys.iter().zip(self.rids.iter()) {
            let k = k.load(Ordering::Acquire);
            if storable(k) {
                f(k, r.load(Ordering::Relaxed));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_and_reuse_tombstones() {
        let idx = Index::new(4);
        for k in 0..4 {
            assert!(idx.insert(k * 1000, k as u32));
        }
        assert!(!idx.insert(2000, 9), "duplicates refused");
        assert_eq!(idx.get(3000), Some(3));
        assert_eq!(idx.get(5), None);
        assert_eq!(idx.remove(1000), Some(1));
        assert_eq!(idx.get(1000), None);
        assert_eq!(idx.remove(1000), None);
        assert!(idx.insert(1000, 7));
        assert_eq!(idx.get(1000), Some(7));
        let mut seen = Vec::new();
        idx.for_each(|k, r| seen.push((k, r)));
        seen.sort();
        assert_eq!(seen, vec![(0, 0), (1000, 7), (2000, 2), (3000, 3)]);
    }

    #[test]
    fn churn_keeps_every_live_key_findable() {
        let idx = Index::new(64);
        let mut live = std::collections::BTreeMap::new();
        let mut rng = qstore_core::rng::stream(3, 0);
        use rand::Rng as _;
        for step in 0..20_000u32 {
            let key = rng.random_range(0..100u64);
            if live.len() < 64 && !live.contains_key(&key) {
                assert!(idx.insert(key, step));
                live.insert(key, step);
            } else if let Some(rid) = live.remove(&key) {
                assert_eq!(idx.remove(key), Some(rid));
            }
            if step % 97 == 0 {
                for (&k, &r) in &live {
                    assert_eq!(idx.get(k), Some(r));
                }
            }
        }
    }

    /// Keys that come and go leave no tombstones behind once their neighbours are gone too:
    /// an index emptied by removals is all empty slots again.
    #[test]
    fn removals_leave_no_tombstone_runs_before_an_empty_slot() {
        let idx = Index::new(1_000);
        let mut rng = qstore_core::rng::stream(5, 0);
        use rand::Rng as _;
        let mut live = std::collections::BTreeSet::new();
        for _ in 0..50_000 {
            let key = rng.random_range(0..5_000u64);
            if live.remove(&key) {
                assert!(idx.remove(key).is_some());
            } else if live.len() < 1_000 {
                assert!(idx.insert(key, 0));
                live.insert(key);
            }
        }
        for &k in &live {
            assert_eq!(idx.get(k), Some(0), "key {k}");
            idx.remove(k);
        }
        let left = idx
            .keys
            .iter()
            .filter(|k| k.load(Ordering::Relaxed) != EMPTY);
        assert_eq!(left.count(), 0, "slots not empty after every key left");
    }

    /// Runs of consecutive keys share a run of slots; runs that land on each other still
    /// leave every key findable, with the index full to its designed half.
    #[test]
    fn dense_and_strided_keys_share_runs_of_slots() {
        let idx = Index::new(6_000);
        let dense = 0..3_000u64;
        let strided = (0..3_000u64).map(|i| (1 << 40) + i * 8);
        for (n, k) in dense.clone().chain(strided.clone()).enumerate() {
            assert!(idx.insert(k, n as u32));
        }
        for (n, k) in dense.chain(strided).enumerate() {
            assert_eq!(idx.get(k), Some(n as u32), "key {k}");
        }
        assert_eq!(home_slot(16, idx.mask) + 1, home_slot(17, idx.mask));
    }

    #[test]
    fn readers_run_alongside_a_writer() {
        let idx = std::sync::Arc::new(Index::new(10_000));
        for k in 0..5_000 {
            idx.insert(k, k as u32);
        }
        let reader = {
            let idx = idx.clone();
            std::thread::spawn(move || {
                for round in 0..20 {
                    for k in 0..5_000u64 {
                        assert_eq!(idx.get(k), Some(k as u32), "round {round}");
                    }
                }
            })
        };
        for k in 5_000..10_000 {
            idx.insert(k, k as u32);
        }
        reader.join().unwrap();
    }
}
