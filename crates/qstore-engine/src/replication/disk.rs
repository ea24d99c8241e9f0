//! A replica group's log on disk: raft's entries, vote, term and commit index kept in a
//! [`qstore_log::SegmentLog`] (checksummed records, group commit, torn-tail recovery), so that
//! a member that restarts comes back with everything it promised its group (raft's safety
//! needs it: a member that forgot its vote could vote twice in a term, one that forgot
//! entries it acknowledged could undo a commit).
//!
//! The file log is an operation log: every write a `Ready` asks for becomes one record
//! (entries appended, a hard state, a commit index, a snapshot applied, a compaction), each
//! on disk (`fdatasync`, shared by the writes of one moment) before the call returns. The
//! member reads from a [`MemStorage`] that mirrors the same operations; reopening replays the
//! records onto a new one. So that the file does not grow with the whole run, a compaction
//! every so often writes a *checkpoint* (the state so far: first index and term, membership,
//! hard state, and the entries still kept) and drops the segments before it; replay starts
//! at the first checkpoint of what is left.

use super::log::{storage_from_memory, LogStore};
use qstore_core::QError;
use qstore_log::{FsyncPolicy, LogOptions, Lsn, RecordLog, SegmentLog};
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, Storage, StorageError};
use std::path::Path;

/// What a record of the file says.
const ENTRIES: u8 = 1;
const HARD_STATE: u8 = 2;
const COMMIT: u8 = 3;
const SNAPSHOT: u8 = 4;
const COMPACT: u8 = 5;
const CHECKPOINT: u8 = 6;
const CONF_STATE: u8 = 7;

/// Records between two checkpoints, at least (and at least twice the entries kept, so that
/// a checkpoint, which rewrites them, costs a bounded share of the writes).
const CHECKPOINT_EVERY: u64 = 4096;
/// Segment files of the log: small enough that a checkpoint frees space soon.
const SEGMENT_BYTES: u64 = 16 << 20;

/// A replica group's log kept in `dir`, durable before each write returns.
pub struct DiskLog {
    mem: MemStorage,
    /// The index before the first entry kept, and its term: where a checkpoint starts
    /// (MemStorage forgets the term of a compacted entry).
    base: (u64, u64),
    file: SegmentLog,
    /// Records written since the last checkpoint (or the start).
    since_checkpoint: u64,
}

fn store_error(what: &str, e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(StorageError::Other(format!("{what}: {e}").into()))
}

impl DiskLog {
    /// Opens the log in `dir`: a new one for a group whose members are `voters` (raft ids),
    /// or the one a member left there, recovered (a torn tail cut; damage elsewhere is an
    /// error that names the file and offset).
    /// Writes are on disk before they return as `fsync` says.
    pub fn open(dir: &Path, voters: Vec<u64>, fsync: FsyncPolicy) -> Result<DiskLog, QError> {
        Self::open_with(dir, voters, fsync, SEGMENT_BYTES)
    }

    /// A reader of the file log's counters.
    pub fn stats_reader(&self) -> qstore_log::StatsReader {
        self.file.stats_reader()
    }

    /// [`DiskLog::open`] with segment files of `segment_bytes`.
    fn open_with(
        dir: &Path,
        voters: Vec<u64>,
        fsync: FsyncPolicy,
        segment_bytes: u64,
    ) -> Result<DiskLog, QError> {
        let opts = LogOptions {
            fsync,
            segment_bytes,
            ..LogOptions::default()
        };
        let file = crate::data_dir::open_log("group log", dir, opts)?;
        let mut log = DiskLog {
            mem: MemStorage::new(),
            base: (0, 0),
            file,
            since_checkpoint: 0,
        };
        let replayed = log
            .replay()
            .map_err(|e| QError::Other(format!("the group log in {}: {e}", dir.display())))?;
        if !replayed {
            let cs = ConfState::from((voters, vec![]));
            log.mem.wl().set_conf_state(cs.clone());
            log.write(CONF_STATE, &encode(&cs))
                .map_err(|e| QError::Other(format!("the group log in {}: {e}", dir.display())))?;
        }
        Ok(log)
    }

    /// Replays the file onto the in-memory view; whether it held anything.
    fn replay(&mut self) -> Result<bool, String> {
        let first = self.file.first_lsn();
        let records = self.file.read_from(first).map_err(|e| e.to_string())?;
        // A log whose start was dropped begins at its first checkpoint.
        let mut started = first == 0;
        let mut any = false;
        for record in records {
            let (lsn, data) = record.map_err(|e| e.to_string())?;
            let (&kind, body) = data
                .split_first()
                .ok_or_else(|| format!("record {lsn} is empty"))?;
            started |= kind == CHECKPOINT;
            if !started {
                continue;
            }
            redo(&mut self.mem, &mut self.base, kind, body)
                .map_err(|e| format!("record {lsn} (kind {kind}): {e}"))?;
            any = true;
        }
        if !started && self.file.next_lsn() > first {
            return Err(format!(
                "it starts at record {first} without a checkpoint to start from"
            ));
        }
        Ok(any)
    }

    /// Writes a record and waits until it is on disk.
    fn write(&mut self, kind: u8, body: &[u8]) -> raft::Result<Lsn> {
        let mut record = Vec::with_capacity(1 + body.len());
        record.push(kind);
        record.extend_from_slice(body);
        self.since_checkpoint += 1;
        self.file
            .append_durable(&record)
            .map_err(|e| store_error("cannot write the group log", e))
    }

    /// Writes a checkpoint of the state so far when enough records piled up since the last
    /// one, and drops the file's segments before it.
    fn checkpoint_if_due(&mut self) -> raft::Result<()> {
        let first = self.mem.first_index()?;
        let last = self.mem.last_index()?;
        let kept = (last + 1).saturating_sub(first);
        // Nothing compacted yet: replay from the start is the checkpoint.
        if first <= 1 || self.since_checkpoint < CHECKPOINT_EVERY.max(2 * kept) {
            return Ok(());
        }
        let mut meta = SnapshotMetadata::default();
        (meta.index, meta.term) = self.base;
        meta.set_conf_state(self.mem.initial_state()?.conf_state);
        let hs = self.mem.initial_state()?.hard_state;
        let entries = if kept > 0 {
            let ctx = GetEntriesContext::empty(false);
            self.mem.entries(first, last + 1, None, ctx)?
        } else {
            Vec::new()
        };
        let at = self.write(CHECKPOINT, &checkpoint(&meta, &hs))?;
        self.write(ENTRIES, &encode_entries(&entries))?;
        self.file
            .compact_before(at)
            .map_err(|e| store_error("cannot compact the group log", e))?;
        self.since_checkpoint = 0;
        Ok(())
    }
}

/// Applies one record to the in-memory view, as the write that made it did.
fn redo(mem: &mut MemStorage, base: &mut (u64, u64), kind: u8, body: &[u8]) -> Result<(), String> {
    let err = |e: raft::Error| e.to_string();
    match kind {
        ENTRIES => mem.wl().append(&decode_entries(body)?).map_err(err),
        HARD_STATE => {
            mem.wl().set_hardstate(decode(body)?);
            Ok(())
        }
        COMMIT => {
            mem.wl().mut_hard_state().commit = u64_of(body)?;
            Ok(())
        }
        SNAPSHOT => {
            let meta: SnapshotMetadata = decode(body)?;
            *base = (meta.index, meta.term);
            let mut s = Snapshot::default();
            s.set_metadata(meta);
            mem.wl().apply_snapshot(s).map_err(err)
        }
        COMPACT => compact(mem, base, u64_of(body)?).map_err(err),
        CHECKPOINT => {
            let (meta, hs) = split_checkpoint(body)?;
            *base = (meta.index, meta.term);
            *mem = MemStorage::new();
            let mut s = Snapshot::default();
            s.set_metadata(meta);
            mem.wl().apply_snapshot(s).map_err(err)?;
            mem.wl().set_hardstate(hs);
            Ok(())
        }
        CONF_STATE => {
            mem.wl().set_conf_state(decode(body)?);
            Ok(())
        }
        other => Err(format!("unknown record kind {other}")),
    }
}

/// Compacts the in-memory view up to `upto`, keeping the term of the entry before it.
fn compact(mem: &MemStorage, base: &mut (u64, u64), upto: u64) -> raft::Result<()> {
    if upto > mem.first_index()? {
        *base = (upto - 1, mem.term(upto - 1)?);
    }
    mem.wl().compact(upto)
}

storage_from_memory!(DiskLog, mem);

impl LogStore for DiskLog {
    fn replayed_on_restart(&self) -> bool {
        true
    }

    fn append(&mut self, entries: &[Entry]) -> raft::Result<()> {
        self.write(ENTRIES, &encode_entries(entries))?;
        self.mem.wl().append(entries)
    }

    fn set_hard_state(&mut self, hs: HardState) -> raft::Result<()> {
        self.write(HARD_STATE, &encode(&hs))?;
        self.mem.wl().set_hardstate(hs);
        Ok(())
    }

    fn set_commit(&mut self, commit: u64) -> raft::Result<()> {
        self.write(COMMIT, &commit.to_le_bytes())?;
        self.mem.wl().mut_hard_state().commit = commit;
        Ok(())
    }

    fn apply_snapshot(&mut self, snapshot: Snapshot) -> raft::Result<()> {
        let meta = snapshot.get_metadata();
        self.write(SNAPSHOT, &encode(meta))?;
        self.base = (meta.index, meta.term);
        self.mem.wl().apply_snapshot(snapshot)
    }

    fn compact(&mut self, upto: u64) -> raft::Result<()> {
        self.write(COMPACT, &upto.to_le_bytes())?;
        compact(&self.mem, &mut self.base, upto)?;
        self.checkpoint_if_due()
    }
}

fn encode(m: &impl protobuf::Message) -> Vec<u8> {
    m.write_to_bytes().unwrap_or_default()
}

fn decode<M: protobuf::Message>(body: &[u8]) -> Result<M, String> {
    M::parse_from_bytes(body).map_err(|e| format!("undecodable: {e}"))
}

fn u64_of(body: &[u8]) -> Result<u64, String> {
    let bytes: [u8; 8] = body.try_into().map_err(|_| "not an index".to_string())?;
    Ok(u64::from_le_bytes(bytes))
}

/// Entries back to back, each its length (u32 LE) and its encoding.
fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let bytes = encode(e);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn decode_entries(mut body: &[u8]) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    while !body.is_empty() {
        let (len, rest) = body
            .split_first_chunk::<4>()
            .ok_or("a truncated entry length")?;
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return Err(format!("an entry of {len} bytes in {} left", rest.len()));
        }
        entries.push(decode(&rest[..len])?);
        body = &rest[len..];
    }
    Ok(entries)
}

/// A checkpoint's body: the snapshot metadata (first index - 1, its term, membership) and
/// the hard state, each its length (u32 LE) and its encoding.
fn checkpoint(meta: &SnapshotMetadata, hs: &HardState) -> Vec<u8> {
    let mut out = Vec::new();
    for bytes in [encode(meta), encode(hs)] {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn split_checkpoint(body: &[u8]) -> Result<(SnapshotMetadata, HardState), String> {
    let (len, rest) = body
        .split_first_chunk::<4>()
        .ok_or("a truncated checkpoint")?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > rest.len() {
        return Err("a truncated checkpoint".into());
    }
    let meta = decode(&rest[..len])?;
    let (len2, rest2) = rest[len..]
        .split_first_chunk::<4>()
        .ok_or("a truncated checkpoint")?;
    let len2 = u32::from_le_bytes(*len2) as usize;
    if len2 != rest2.len() {
        return Err("a checkpoint of the wrong length".into());
    }
    Ok((meta, decode(rest2)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("qstore-disklog-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: vec![index as u8; 1 + (index % 7) as usize].into(),
            ..Default::default()
        }
    }

    fn all(log: &DiskLog) -> Vec<Entry> {
        let (first, last) = (log.first_index().unwrap(), log.last_index().unwrap());
        log.entries(first, last + 1, None, GetEntriesContext::empty(false))
            .unwrap()
    }

    #[test]
    fn a_reopened_log_has_its_entries_vote_and_commit() {
        let d = dir("reopen");
        {
            let mut log = DiskLog::open(&d, vec![1, 2, 3], FsyncPolicy::Always).unwrap();
            log.append(&(1..=10).map(|i| entry(i, 1)).collect::<Vec<_>>())
                .unwrap();
            // A new leader's entries replace a conflicting suffix.
            log.append(&[entry(8, 2), entry(9, 2)]).unwrap();
            let hs = HardState {
                term: 2,
                vote: 3,
                ..Default::default()
            };
            log.set_hard_state(hs).unwrap();
            log.set_commit(7).unwrap();
        }
        let log = DiskLog::open(&d, vec![9], FsyncPolicy::Always).unwrap();
        let state = log.initial_state().unwrap();
        assert_eq!(
            state.conf_state.voters,
            vec![1, 2, 3],
            "the first voters stay"
        );
        assert_eq!(
            (
                state.hard_state.term,
                state.hard_state.vote,
                state.hard_state.commit
            ),
            (2, 3, 7)
        );
        let entries = all(&log);
        assert_eq!(entries.len(), 9);
        assert_eq!((entries[7].index, entries[7].term), (8, 2));
        assert_eq!(entries[0], entry(1, 1));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn checkpoints_bound_the_file_and_a_reopened_log_starts_at_the_last() {
        let d = dir("checkpoint");
        let n = 3 * CHECKPOINT_EVERY;
        let segment = 64 << 10;
        {
            let mut log = DiskLog::open_with(&d, vec![1], FsyncPolicy::Always, segment).unwrap();
            for i in 1..=n {
                log.append(&[entry(i, 1)]).unwrap();
                log.set_commit(i).unwrap();
                if i % 64 == 0 {
                    log.compact(i - 16).unwrap();
                }
            }
        }
        let log = DiskLog::open_with(&d, vec![1], FsyncPolicy::Always, segment).unwrap();
        assert_eq!(log.first_index().unwrap(), n - 16);
        assert_eq!(log.last_index().unwrap(), n);
        assert_eq!(
            log.term(n - 17).unwrap(),
            1,
            "the term before the first entry"
        );
        assert_eq!(log.initial_state().unwrap().hard_state.commit, n);
        assert_eq!(all(&log).last(), Some(&entry(n, 1)));
        assert!(
            log.file.first_lsn() > 0,
            "segments before a checkpoint were dropped"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn garbage_in_a_record_is_an_error_not_a_panic() {
        assert!(decode_entries(&[9, 0, 0, 0, 1]).is_err());
        assert!(decode_entries(&[1, 2]).is_err());
        assert!(split_checkpoint(&[200, 0, 0, 0]).is_err());
        assert!(u64_of(&[1, 2, 3]).is_err());
    }
}
