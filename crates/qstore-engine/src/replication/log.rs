//! Where a replica group's log lives: behind [`LogStore`], so that the consensus code does not
//! care whether entries are kept in memory ([`MemLog`]) or in segment files on disk
//! ([`super::disk::DiskLog`]). Raft reads the log through its own [`raft::Storage`] trait; the writes it
//! asks for in each `Ready` go through the methods here.

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::Storage;

/// A replica group's log: what raft reads ([`Storage`]) and the writes a `Ready` asks for.
///
/// Every write must be durable (as durable as the implementation promises) before the call
/// returns: raft sends the messages that depend on it right after.
pub trait LogStore: Storage + Send + 'static {
    /// Appends entries, replacing any conflicting suffix (a new leader's entries overwrite
    /// what an old leader's left uncommitted).
    fn append(&mut self, entries: &[Entry]) -> raft::Result<()>;
    /// Records the vote, term and commit index.
    fn set_hard_state(&mut self, hs: HardState) -> raft::Result<()>;
    /// Records a new commit index alone (raft's light ready).
    fn set_commit(&mut self, commit: u64) -> raft::Result<()>;
    /// Replaces the log with a snapshot sent by the leader.
    fn apply_snapshot(&mut self, snapshot: Snapshot) -> raft::Result<()>;
    /// Forgets the entries before index `upto` (applied here, and not needed by any member).
    fn compact(&mut self, upto: u64) -> raft::Result<()>;
    /// Whether a member that restarts rebuilds its partition by replaying this log, so that
    /// only entries its protocol's checkpoints hold may be forgotten.
    fn replayed_on_restart(&self) -> bool {
        false
    }
}

/// Entries in memory, lost with the process (the durability issue brings the disk log).
pub struct MemLog {
    inner: MemStorage,
}

impl MemLog {
    /// An empty log of a group whose members are `voters` (raft ids).
    pub fn new(voters: Vec<u64>) -> Self {
        MemLog {
            inner: MemStorage::new_with_conf_state(ConfState::from((voters, vec![]))),
        }
    }
}

/// Implements raft's [`Storage`] for a log whose reads all go to the [`MemStorage`] in its
/// field `$mem` (every log here keeps that in-memory view; they differ in what they write).
macro_rules! storage_from_memory {
    ($log:ty, $mem:ident) => {
        impl raft::Storage for $log {
            fn initial_state(&self) -> raft::Result<raft::RaftState> {
                self.$mem.initial_state()
            }

            fn entries(
                &self,
                low: u64,
                high: u64,
                max_size: impl Into<Option<u64>>,
                context: raft::GetEntriesContext,
            ) -> raft::Result<Vec<raft::eraftpb::Entry>> {
                self.$mem.entries(low, high, max_size, context)
            }

            fn term(&self, idx: u64) -> raft::Result<u64> {
                self.$mem.term(idx)
            }

            fn first_index(&self) -> raft::Result<u64> {
                self.$mem.first_index()
            }

            fn last_index(&self) -> raft::Result<u64> {
                self.$mem.last_index()
            }

            fn snapshot(
                &self,
                request_index: u64,
                to: u64,
            ) -> raft::Result<raft::eraftpb::Snapshot> {
                self.$mem.snapshot(request_index, to)
            }
        }
    };
}
pub(super) use storage_from_memory;

storage_from_memory!(MemLog, inner);

impl LogStore for MemLog {
    fn append(&mut self, entries: &[Entry]) -> raft::Result<()> {
        self.inner.wl().append(entries)
    }

    fn set_hard_state(&mut self, hs: HardState) -> raft::Result<()> {
        self.inner.wl().set_hardstate(hs);
        Ok(())
    }

    fn set_commit(&mut self, commit: u64) -> raft::Result<()> {
        self.inner.wl().mut_hard_state().commit = commit;
        Ok(())
    }

    fn apply_snapshot(&mut self, snapshot: Snapshot) -> raft::Result<()> {
        self.inner.wl().apply_snapshot(snapshot)
    }

    fn compact(&mut self, upto: u64) -> raft::Result<()> {
        self.inner.wl().compact(upto)
    }
}
