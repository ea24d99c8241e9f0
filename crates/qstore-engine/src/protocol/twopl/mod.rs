//! Two-phase locking on the interactive skeleton (two-phase commit across partitions):
//! shared locks to read, exclusive locks to write, all held until the transaction ends
//! (read-only participants release theirs at prepare). The variants differ only in what a
//! transaction does when a lock is taken:
//! - `no_wait`: it aborts at once (and is retried after a back-off);
//! - `wait_die`: it waits if it is older than every holder and waiter, and aborts otherwise.
//!   Its age is the first attempt's, so a retried transaction grows old enough to win.

mod locks;

pub use locks::Policy;

use self::locks::LockTable;
use crate::cluster::EngineCtx;
use crate::protocol::interactive::{self, Attempt, Cc, Gate};
use crate::protocol::Engine;
use qstore_core::{Key, QError, TableId, TxnId};
use std::sync::Arc;

/// 2PL's concurrency control for one partition.
struct TwoPl {
    locks: LockTable,
}

impl Cc for TwoPl {
    type Held = Vec<(TableId, Key)>;

    fn access(
        &self,
        txn: TxnId,
        at: &Attempt,
        table: TableId,
        key: Key,
        write: bool,
        held: &mut Self::Held,
    ) -> Gate {
        self.locks.lock(txn, at.age, (table, key), write, held)
    }

    fn release(&self, txn: TxnId, held: &mut Self::Held, woken: &mut Vec<TxnId>) {
        self.locks.release(txn, held, woken);
    }
}

fn start(ctx: Arc<EngineCtx>, policy: Policy, label: &str) -> Result<Box<dyn Engine>, QError> {
    let make = |_: &_| TwoPl {
        locks: LockTable::new(policy),
    };
    interactive::start(ctx, make, label)
}

pub fn start_no_wait(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start(ctx, Policy::NoWait, "nw")
}

pub fn start_wait_die(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start(ctx, Policy::WaitDie, "wd")
}
