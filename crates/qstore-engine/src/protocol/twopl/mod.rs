//! Two-phase locking on the interactive skeleton (two-phase commit across partitions):
//! shared locks to read, exclusive locks to write, all held until the transaction ends
//! (read-only participants release theirs at prepare). The variants differ only in what a
//! transaction does when a lock is taken:
//! - `no_wait`: it aborts at once (and is retried after a back-off);
//! - `wait_die`: it waits if it is older than every holder and waiter, and aborts otherwise.
//!   Its age is the first attempt's, so a retried transaction grows old enough to win.
//! - `dl_detect`: it waits; a detector at node 0 gathers the waits-for edges of every node,
//!   and aborts the youngest transaction of every cycle (see `interactive::deadlock`).

pub use crate::protocol::locks::Policy;

use crate::cluster::EngineCtx;
use crate::protocol::interactive::{self, Attempt, Cc, Gate, WaitEdge};
use crate::protocol::locks::LockTable;
use crate::protocol::Engine;
use qstore_core::{Key, QError, TableId, TxnId};
use std::sync::Arc;

/// 2PL's concurrency control for one partition.
struct TwoPl {
    locks: LockTable,
    /// Waiting transactions may form cycles: the skeleton's detector must break them (off
    /// only in the test that shows what it prevents).
    detect: bool,
    /// `dl_detect` with `protocol.dl_detect.skip_commit_protocol`: no two-phase commit
    /// (measurement only, see [`Cc::skips_commit_protocol`]).
    skip_2pc: bool,
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

    fn detects_deadlocks(&self) -> bool {
        self.detect
    }

    fn skips_commit_protocol(&self) -> bool {
        self.skip_2pc
    }

    fn waits_for(&self, out: &mut Vec<WaitEdge>) {
        self.locks.waits_for(out);
    }

    fn abort_waiter(&self, txn: TxnId, woken: &mut Vec<TxnId>) -> bool {
        self.locks.abort_waiter(txn, woken)
    }
}

fn start(ctx: Arc<EngineCtx>, policy: Policy, label: &str) -> Result<Box<dyn Engine>, QError> {
    start_detecting(ctx, policy, label, policy == Policy::Wait)
}

fn start_detecting(
    ctx: Arc<EngineCtx>,
    policy: Policy,
    label: &str,
    detect: bool,
) -> Result<Box<dyn Engine>, QError> {
    let skip_2pc = policy == Policy::Wait && ctx.cfg.protocol.dl_detect.skip_commit_protocol;
    let make = |_: &_| TwoPl {
        locks: LockTable::new(policy),
        detect,
        skip_2pc,
    };
    interactive::start(ctx, make, label)
}

pub fn start_no_wait(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start(ctx, Policy::NoWait, "nw")
}

pub fn start_wait_die(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start(ctx, Policy::WaitDie, "wd")
}

pub fn start_dl_detect(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    start(ctx, Policy::Wait, "dl")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::contended_ycsb_within;
    use std::time::Duration;

    #[test]
    fn waiting_on_every_conflict_deadlocks_without_the_detector() {
        let undetected = |ctx| start_detecting(ctx, Policy::Wait, "dl", false);
        let stuck = contended_ycsb_within(&undetected, 3000, Duration::from_secs(2));
        assert!(
            stuck.is_err(),
            "no deadlock in 3000 contended transactions?"
        );
        let report = contended_ycsb_within(&start_dl_detect, 3000, Duration::from_secs(30))
            .expect("the detector breaks every deadlock");
        assert!(report.is_serializable(), "{report}");
    }
}
