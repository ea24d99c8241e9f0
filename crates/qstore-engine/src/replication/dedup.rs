//! Running a transaction once however often its client resubmits it: a replicated cluster
//! answers a client that lost its leader `NotLeader`, and the client sends the same attempt
//! (the same [`TxnKey`]) to the next leader, which may already hold it in its log.

use crate::protocol::TxnRequest;
use qstore_core::txn::{TxnKey, TxnOutcome};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// Finished transactions remembered for resubmissions, at most.
const DEDUP_REMEMBERED: usize = 1 << 20;

/// What a member knows of the transactions its group's log holds, by client key: running
/// (with the resubmissions waiting for the outcome), or finished with its outcome.
#[derive(Default)]
pub struct Dedup {
    seen: FxHashMap<TxnKey, Seen>,
    /// Finished keys, oldest first: the first forgotten.
    finished: VecDeque<TxnKey>,
}

enum Seen {
    Running(Vec<TxnRequest>),
    Finished(TxnOutcome),
}

impl Dedup {
    /// A request this member is about to plan: handed back if the group never saw its key;
    /// otherwise answered now (finished) or when its first run ends.
    pub fn admit(&mut self, req: TxnRequest) -> Option<TxnRequest> {
        if req.key.is_none() {
            return Some(req);
        }
        match self.seen.get_mut(&req.key) {
            None => {
                self.seen.insert(req.key, Seen::Running(Vec::new()));
                Some(req)
            }
            Some(Seen::Running(waiting)) => {
                waiting.push(req);
                None
            }
            Some(Seen::Finished(outcome)) => {
                let outcome = outcome.clone();
                req.answer(outcome);
                None
            }
        }
    }

    /// A transaction another member planned, from the log.
    pub fn running(&mut self, key: TxnKey) {
        if !key.is_none() {
            self.seen.entry(key).or_insert(Seen::Running(Vec::new()));
        }
    }

    /// A transaction's outcome: resubmissions waiting for it are answered.
    pub fn finished(&mut self, key: TxnKey, outcome: &TxnOutcome) {
        if key.is_none() {
            return;
        }
        let before = self.seen.insert(key, Seen::Finished(outcome.clone()));
        if let Some(Seen::Running(waiting)) = before {
            for req in waiting {
                req.answer(outcome.clone());
            }
        }
        self.finished.push_back(key);
        while self.finished.len() > DEDUP_REMEMBERED {
            if let Some(old) = self.finished.pop_front() {
                self.seen.remove(&old);
            }
        }
    }

    /// The finished transactions remembered, oldest first: what a copy of the partition
    /// carries, so that a rebuilt member answers a resubmission as the others would.
    pub fn finished_outcomes(&self) -> Vec<(TxnKey, TxnOutcome)> {
        self.finished
            .iter()
            .filter_map(|k| match self.seen.get(k) {
                Some(Seen::Finished(o)) => Some((*k, o.clone())),
                _ => None,
            })
            .collect()
    }

    /// A table of `outcomes` (from [`Dedup::finished_outcomes`]), oldest first.
    pub fn of_outcomes(outcomes: Vec<(TxnKey, TxnOutcome)>) -> Self {
        let mut d = Dedup::default();
        for (key, outcome) in outcomes {
            d.finished(key, &outcome);
        }
        d
    }

    /// Resubmissions waiting here, handed back (this member no longer leads).
    pub fn take_waiting(&mut self) -> Vec<TxnRequest> {
        let mut out = Vec::new();
        for seen in self.seen.values_mut() {
            if let Seen::Running(waiting) = seen {
                out.append(waiting);
            }
        }
        out
    }

    /// Forgets a transaction that will not run after all (its proposal was lost with this
    /// member's leadership): its client resubmits it, perhaps here again. Hands back the
    /// resubmissions that were waiting for it.
    pub fn forget(&mut self, key: TxnKey) -> Vec<TxnRequest> {
        match self.seen.remove(&key) {
            Some(Seen::Running(waiting)) => waiting,
            Some(finished) => {
                self.seen.insert(key, finished);
                Vec::new()
            }
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::TxnId;

    #[test]
    fn a_resubmitted_transaction_gets_the_first_outcome_and_runs_once() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let call = std::sync::Arc::new(qstore_core::txn::ProcCall {
            proc: qstore_core::txn::ProcId(0),
            args: Vec::new(),
        });
        let key = TxnKey { session: 9, seq: 1 };
        let req = |id| {
            let mut r = TxnRequest::new(TxnId(id), call.clone(), tx.clone());
            r.key = key;
            r
        };
        let mut d = Dedup::default();
        // Planned from the log at another member; a resubmission here waits for its end.
        d.running(key);
        assert!(d.admit(req(1)).is_none());
        assert!(rx.try_recv().is_err());
        let done = TxnOutcome::Committed(Vec::new());
        d.finished(key, &done);
        assert_eq!(rx.try_recv().unwrap().outcome, done);
        // Later resubmissions are answered at once; a new key runs.
        assert!(d.admit(req(2)).is_none());
        assert_eq!(rx.try_recv().unwrap().outcome, done);
        let mut fresh = req(3);
        fresh.key = TxnKey { session: 9, seq: 2 };
        assert!(d.admit(fresh).is_some());
    }
}
