//! H-Store: each partition runs one transaction at a time, with no record-level concurrency
//! control. A transaction first takes every partition it touches, one after the other in
//! ascending order (so two transactions never wait for each other in a cycle), then runs on
//! the interactive skeleton and commits with two-phase commit when it spans partitions.
//! Its partitions are free again when it commits or aborts (a read-only participant frees
//! its partition at prepare).
//!
//! Workers beyond one per node add no parallelism on a partition (that is the point of the
//! design); they only serve messages.

use crate::cluster::EngineCtx;
use crate::protocol::interactive::{self, Attempt, Cc, Gate};
use crate::protocol::Engine;
use parking_lot::Mutex;
use qstore_core::{Key, QError, TableId, TxnId};
use std::collections::VecDeque;
use std::sync::Arc;

/// Who holds the partition, and who waits for it, first come first served. H^L-Store
/// (`leap`) takes its partitions the same way.
#[derive(Default)]
pub(crate) struct PartitionLock {
    state: Mutex<Holders>,
}

#[derive(Default)]
struct Holders {
    holder: Option<TxnId>,
    queue: VecDeque<TxnId>,
}

impl PartitionLock {
    /// Takes the partition for `txn` (`held`: whether it has it), or queues it. Asked again
    /// when the wait ends.
    pub(crate) fn reserve(&self, txn: TxnId, held: &mut bool) -> Gate {
        let mut p = self.state.lock();
        match p.holder {
            Some(h) if h == txn => {}
            None => p.holder = Some(txn),
            Some(_) => {
                if !p.queue.contains(&txn) {
                    p.queue.push_back(txn);
                }
                return Gate::Wait;
            }
        }
        *held = true;
        Gate::Go
    }

    /// `txn` lets the partition go, if it `held` it; the next in line is added to `woken`.
    pub(crate) fn release(&self, txn: TxnId, held: &mut bool, woken: &mut Vec<TxnId>) {
        if !std::mem::take(held) {
            return;
        }
        let mut p = self.state.lock();
        debug_assert_eq!(p.holder, Some(txn));
        p.holder = p.queue.pop_front();
        woken.extend(p.holder);
    }
}

#[derive(Default)]
struct HStore {
    partition: PartitionLock,
}

impl Cc for HStore {
    /// Whether the transaction holds the partition.
    type Held = bool;

    const RESERVES_PARTITIONS: bool = true;

    fn reserve(&self, txn: TxnId, _: &Attempt, held: &mut bool) -> Gate {
        self.partition.reserve(txn, held)
    }

    fn access(
        &self,
        txn: TxnId,
        _: &Attempt,
        _: TableId,
        _: Key,
        _: bool,
        held: &mut bool,
    ) -> Gate {
        debug_assert!(*held, "{txn:?} accesses a partition it did not reserve");
        Gate::Go
    }

    fn release(&self, txn: TxnId, held: &mut bool, woken: &mut Vec<TxnId>) {
        self.partition.release(txn, held, woken);
    }
}

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    interactive::start(ctx, |_| HStore::default(), "hs")
}
