//! Sundial's cache of rows read at other nodes (its paper's section 4): a node keeps the rows
//! its transactions read elsewhere, with their leases, in banks (a row's bank by the hash of
//! its key), each a least-recently-used list whose rows' bytes (with a fixed charge per row)
//! stay within the bank's share of `--sundial-cache-mb`. The skeleton reads from it, fills it
//! and renews what it served (see `interactive::cached`); this decides when a read reuses a
//! copy (section 4.2):
//! - `always-reuse`: whenever one is cached;
//! - `always-request`: never (the read goes to the home, which leaves the row out of its
//!   answer when the copy is current: less traffic, the same round trips);
//! - `hybrid`: while the evidence favours the cache. Two counters gather it: `vote_cache`
//!   when a remote check finds the copy current or a cached read renews its lease,
//!   `vote_remote` when a check finds another version or a renewal fails. Copies are reused
//!   while `vote_cache` is at least 80% of the votes (the paper's threshold of 0.8, read as
//!   the cache's share); both counters are halved now and then so the policy follows the
//!   workload.
//!
//! It also keeps the table leases homes told it of (section 4.3), and a copy of a row of such
//! a table, read since the table's last write, is valid as long as the table's lease is.

use crate::protocol::interactive::cached::{CachedRow, RowCache};
use crate::protocol::interactive::{Fill, TabLease};
use lru::LruCache;
use parking_lot::{Mutex, RwLock};
use qstore_core::config::CachePolicy;
use qstore_core::{Key, NodeId, TableId};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Banks of a cache: enough that workers rarely meet on one.
const BANKS: usize = 16;
/// What a row costs besides its bytes: its entry in the list (key, lease, links: 96 bytes as
/// allocated), its hash slot, and the rounding of its bytes' allocation.
const ROW_OVERHEAD: usize = 128;
/// The hybrid policy halves its counters once they hold this many votes.
const VOTES_KEPT: u64 = 4096;

type RowKey = (TableId, Key);

struct Bank {
    rows: LruCache<RowKey, CachedRow>,
    bytes: usize,
    budget: usize,
}

fn cost(row: &CachedRow) -> usize {
    row.bytes.len() + ROW_OVERHEAD
}

impl Bank {
    fn insert(&mut self, k: RowKey, row: CachedRow) {
        self.remove(&k);
        if cost(&row) > self.budget {
            return; // larger than the whole bank
        }
        self.bytes += cost(&row);
        self.rows.put(k, row);
        while self.bytes > self.budget {
            let Some((_, old)) = self.rows.pop_lru() else {
                break;
            };
            self.bytes -= cost(&old);
        }
    }

    fn remove(&mut self, k: &RowKey) {
        if let Some(old) = self.rows.pop(k) {
            self.bytes -= cost(&old);
        }
    }
}

/// A node's cache of other nodes' rows.
pub(super) struct RemoteCache {
    banks: Box<[Mutex<Bank>]>,
    policy: CachePolicy,
    vote_cache: AtomicU64,
    vote_remote: AtomicU64,
    /// The latest lease known of each read-mostly table at each home.
    tabs: RwLock<FxHashMap<(NodeId, TableId), TabLease>>,
}

impl RemoteCache {
    /// A cache of `mb` megabytes (`None` for 0: no cache).
    pub(super) fn new(mb: u32, policy: CachePolicy) -> Option<RemoteCache> {
        let budget = ((mb as usize) << 20) / BANKS;
        let bank = || {
            Mutex::new(Bank {
                rows: LruCache::unbounded(),
                bytes: 0,
                budget,
            })
        };
        (mb > 0).then(|| RemoteCache {
            banks: (0..BANKS).map(|_| bank()).collect(),
            policy,
            vote_cache: AtomicU64::new(0),
            vote_remote: AtomicU64::new(0),
            tabs: RwLock::default(),
        })
    }

    fn bank(&self, k: &RowKey) -> &Mutex<Bank> {
        let h = (k.1 ^ (u64::from(k.0) << 56)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58;
        &self.banks[h as usize % BANKS]
    }

    /// Whether reads use cached copies now.
    fn reuses(&self) -> bool {
        match self.policy {
            CachePolicy::AlwaysReuse => true,
            CachePolicy::AlwaysRequest => false,
            CachePolicy::Hybrid => {
                let cache = self.vote_cache.load(Ordering::Relaxed);
                let remote = self.vote_remote.load(Ordering::Relaxed);
                5 * cache >= 4 * (cache + remote)
            }
        }
    }

    /// Evidence for the hybrid policy: a copy was found current (or renewed), or not.
    fn vote(&self, for_cache: bool) {
        let counter = if for_cache {
            &self.vote_cache
        } else {
            &self.vote_remote
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let total =
            self.vote_cache.load(Ordering::Relaxed) + self.vote_remote.load(Ordering::Relaxed);
        if total > VOTES_KEPT {
            // Racy halving is fine: the counters only steer a heuristic.
            for c in [&self.vote_cache, &self.vote_remote] {
                c.store(c.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
            }
        }
    }

    /// Learns a table's lease: one seen after more writes replaces the one known, one seen
    /// after as many extends it.
    fn learn(&self, home: NodeId, table: TableId, lease: TabLease) {
        let mut tabs = self.tabs.write();
        let known = tabs.entry((home, table)).or_insert(lease);
        if lease.writes > known.writes {
            *known = lease;
        } else if lease.writes == known.writes {
            known.rts = known.rts.max(lease.rts);
        }
    }

    /// The lease of a copy read when its table had seen `tab_writes` writes: its own, or
    /// its table's if that is known at the same count and ends later.
    fn rts_of(&self, home: NodeId, table: TableId, row: &CachedRow) -> u64 {
        let Some(writes) = row.tab_writes else {
            return row.rts;
        };
        match self.tabs.read().get(&(home, table)) {
            Some(tab) if tab.writes == writes => row.rts.max(tab.rts),
            _ => row.rts,
        }
    }

    /// Bytes the cache holds, its rows' charges included.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.banks.iter().map(|b| b.lock().bytes).sum()
    }
}

impl RowCache for RemoteCache {
    fn reuse(&self, home: NodeId, table: TableId, key: Key) -> Option<CachedRow> {
        if !self.reuses() {
            return None;
        }
        let k = (table, key);
        let mut row = self.bank(&k).lock().rows.get(&k).cloned()?;
        row.rts = self.rts_of(home, table, &row);
        Some(row)
    }

    fn held(&self, table: TableId, key: Key) -> Option<u64> {
        let k = (table, key);
        self.bank(&k).lock().rows.peek(&k).map(|r| r.wts)
    }

    fn fill(&self, home: NodeId, table: TableId, key: Key, fill: &Fill) {
        if let Some(tab) = fill.tab {
            self.learn(home, table, tab);
        }
        let k = (table, key);
        let mut bank = self.bank(&k).lock();
        let Some(bytes) = &fill.bytes else {
            // The home found the copy current: its lease may have grown, and it is current
            // at the table's count of writes now.
            if let Some(row) = bank.rows.get_mut(&k).filter(|r| r.wts == fill.wts) {
                row.rts = row.rts.max(fill.rts);
                row.tab_writes = fill.tab.map(|t| t.writes);
                drop(bank);
                self.vote(true);
            }
            return;
        };
        let stale = bank.rows.peek(&k).is_some();
        let row = CachedRow {
            wts: fill.wts,
            rts: fill.rts,
            writer: fill.writer,
            seq: fill.seq,
            bytes: bytes.clone(),
            tab_writes: fill.tab.map(|t| t.writes),
        };
        bank.insert(k, row);
        drop(bank);
        if stale {
            self.vote(false);
        }
    }

    fn renewed(&self, table: TableId, key: Key, to: Option<u64>) {
        let k = (table, key);
        let mut bank = self.bank(&k).lock();
        match to {
            Some(ts) => {
                if let Some(row) = bank.rows.peek_mut(&k) {
                    row.rts = row.rts.max(ts);
                }
            }
            // Algorithm 2, line 8: the copy would fail again.
            None => bank.remove(&k),
        }
        drop(bank);
        self.vote(to.is_some());
    }

    fn tab_leases(&self, home: NodeId, leases: &[(TableId, TabLease)]) {
        for &(table, lease) in leases {
            self.learn(home, table, lease);
        }
    }

    fn written(&self, table: TableId, key: Key) {
        let k = (table, key);
        self.bank(&k).lock().remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(wts: u64, rts: u64, bytes: Option<Vec<u8>>) -> Fill {
        Fill {
            idx: 0,
            wts,
            rts,
            writer: 1,
            seq: 0,
            bytes,
            tab: None,
        }
    }

    const HOME: NodeId = NodeId(1);

    #[test]
    fn the_cache_stays_within_its_memory_and_drops_the_least_recently_used() {
        let c = RemoteCache::new(1, CachePolicy::AlwaysReuse).unwrap();
        let row = vec![7u8; 1000];
        for key in 0..10_000 {
            c.fill(HOME, 0, key, &fill(1, 2, Some(row.clone())));
        }
        assert!(c.bytes() <= 1 << 20, "{} bytes", c.bytes());
        assert!(
            c.bytes() > (1 << 20) * 3 / 4,
            "{} bytes: banks are used",
            c.bytes()
        );
        assert!(c.reuse(HOME, 0, 9_999).is_some(), "the latest stays");
        assert!(c.reuse(HOME, 0, 0).is_none(), "the oldest went");
    }

    #[test]
    fn a_current_copy_renews_and_a_stale_one_is_replaced_or_dropped() {
        let c = RemoteCache::new(1, CachePolicy::AlwaysReuse).unwrap();
        c.fill(HOME, 0, 5, &fill(3, 4, Some(vec![1, 2])));
        assert_eq!(c.held(0, 5), Some(3));
        c.fill(HOME, 0, 5, &fill(3, 9, None));
        assert_eq!(
            c.reuse(HOME, 0, 5).map(|r| r.rts),
            Some(9),
            "lease grown, bytes kept"
        );
        c.fill(HOME, 0, 5, &fill(10, 12, Some(vec![3])));
        assert_eq!(
            c.reuse(HOME, 0, 5).map(|r| (r.wts, r.bytes)),
            Some((10, vec![3]))
        );
        c.renewed(0, 5, Some(20));
        assert_eq!(c.reuse(HOME, 0, 5).map(|r| r.rts), Some(20));
        c.renewed(0, 5, None);
        assert_eq!(c.held(0, 5), None, "a failed renewal drops the copy");
        c.fill(HOME, 0, 6, &fill(1, 1, Some(vec![0])));
        c.written(0, 6);
        assert_eq!(c.held(0, 6), None);
    }

    #[test]
    fn hybrid_requests_once_copies_are_mostly_found_stale_and_reuses_again_after() {
        let c = RemoteCache::new(1, CachePolicy::Hybrid).unwrap();
        c.fill(HOME, 0, 1, &fill(1, 1, Some(vec![0])));
        assert!(c.reuse(HOME, 0, 1).is_some(), "no evidence yet: reuse");
        for wts in 2..10 {
            c.fill(HOME, 0, 1, &fill(wts, wts, Some(vec![0])));
        }
        assert!(c.reuse(HOME, 0, 1).is_none(), "copies were stale: request");
        for _ in 0..100 {
            c.fill(HOME, 0, 1, &fill(9, 9, None));
        }
        assert!(
            c.reuse(HOME, 0, 1).is_some(),
            "copies are current again: reuse"
        );
        let never = RemoteCache::new(1, CachePolicy::AlwaysRequest).unwrap();
        never.fill(HOME, 0, 1, &fill(1, 1, Some(vec![0])));
        assert!(never.reuse(HOME, 0, 1).is_none());
        assert_eq!(never.held(0, 1), Some(1), "held, for the home to check");
        assert!(RemoteCache::new(0, CachePolicy::Hybrid).is_none());
    }

    #[test]
    fn a_table_lease_covers_the_copies_read_since_the_tables_last_write() {
        let c = RemoteCache::new(1, CachePolicy::AlwaysReuse).unwrap();
        let tab = |writes, rts| Some(TabLease { writes, rts });
        c.fill(
            HOME,
            0,
            1,
            &Fill {
                tab: tab(4, 50),
                ..fill(3, 9, Some(vec![1]))
            },
        );
        assert_eq!(
            c.reuse(HOME, 0, 1).map(|r| r.rts),
            Some(50),
            "the fill's own"
        );
        c.tab_leases(
            HOME,
            &[(
                0,
                TabLease {
                    writes: 4,
                    rts: 900,
                },
            )],
        );
        assert_eq!(c.reuse(HOME, 0, 1).map(|r| r.rts), Some(900), "extended");
        assert_eq!(
            c.reuse(NodeId(2), 0, 1).map(|r| r.rts),
            Some(9),
            "another home's table is another table"
        );
        c.tab_leases(
            HOME,
            &[(
                0,
                TabLease {
                    writes: 3,
                    rts: 5000,
                },
            )],
        );
        assert_eq!(
            c.reuse(HOME, 0, 1).map(|r| r.rts),
            Some(900),
            "an older lease"
        );
        c.tab_leases(
            HOME,
            &[(
                0,
                TabLease {
                    writes: 5,
                    rts: 1000,
                },
            )],
        );
        assert_eq!(
            c.reuse(HOME, 0, 1).map(|r| r.rts),
            Some(9),
            "written since the copy was read: the copy's own lease"
        );
        c.fill(
            HOME,
            0,
            1,
            &Fill {
                tab: tab(5, 1000),
                ..fill(3, 9, None)
            },
        );
        assert_eq!(
            c.reuse(HOME, 0, 1).map(|r| r.rts),
            Some(1000),
            "found current at the new count"
        );
    }
}
