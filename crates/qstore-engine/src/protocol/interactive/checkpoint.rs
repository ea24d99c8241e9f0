//! Checkpoints of the write-ahead log: what the log up to some record amounts to, kept in a
//! snapshot file beside it, so that the log before that record can be dropped.
//!
//! A checkpoint is built from the log, not from the live partition: the previous checkpoint
//! is merged with the records written since (folded exactly as recovery folds them), and
//! written as a new snapshot (a temporary file, synced, renamed over the old one). It is
//! consistent by construction (it holds what committed, in the commit order, and nothing
//! that did not), it never pauses a transaction, and it costs reading the recent log back
//! (usually from the page cache) and writing the changed rows once per checkpoint. Only then
//! are the log's segments before it deleted.
//!
//! A checkpoint holds, in this order: a head (the first log record it does not cover, and
//! what is left of the fold: the starts, the transactions prepared and not yet decided, the
//! decisions still wanted), then the after-image of every row any transaction changed since
//! the first start, sorted by table and key, with its place in the commit order (a later
//! record may still hold an earlier commit of the same row under timestamp ordering).

use super::msg::Attempt;
use super::wal::{put, Folded, ImageView, Images, Place, Recovered, Wal};
use super::{Cc, Node};
use qstore_core::{Key, QError, TableId};
use qstore_log::{open_snapshot, Lsn, RecordLog, SnapshotReader, SnapshotWriter};
use qstore_storage::PartitionStore;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::hash_map::Entry;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Rows per record of a checkpoint file.
const ROWS_PER_RECORD: usize = 1024;

/// A checkpoint's first record.
#[derive(Serialize, Deserialize)]
struct Head {
    /// The first log record the checkpoint does not cover.
    upto: Lsn,
    folded: Folded,
}

/// A row as a checkpoint keeps it.
#[derive(Serialize, Deserialize)]
struct Row {
    table: TableId,
    key: Key,
    place: Place,
    #[serde(with = "serde_bytes")]
    bytes: Option<Vec<u8>>,
}

/// What a checkpoint put back.
#[derive(Clone, Copy, Debug)]
pub(super) struct Loaded {
    pub upto: Lsn,
    pub rows: u64,
}

fn failed(wal: &Wal, e: impl std::fmt::Display) -> QError {
    QError::Other(format!("the checkpoint {}: {e}", wal.checkpoint.display()))
}

/// Reads a checkpoint's head.
fn head(wal: &Wal, snap: &mut SnapshotReader) -> Result<Head, QError> {
    let bytes = snap
        .next()
        .ok_or_else(|| failed(wal, "it is empty"))?
        .map_err(|e| failed(wal, e))?;
    postcard::from_bytes(&bytes).map_err(|e| failed(wal, format!("a damaged head ({e})")))
}

/// The rows of a checkpoint after its head, one at a time.
fn rows<'a>(wal: &'a Wal, snap: SnapshotReader) -> impl Iterator<Item = Result<Row, QError>> + 'a {
    snap.flat_map(move |item| {
        let chunk: Result<Vec<Row>, QError> = item.map_err(|e| failed(wal, e)).and_then(|b| {
            postcard::from_bytes(&b).map_err(|e| failed(wal, format!("damaged rows ({e})")))
        });
        match chunk {
            Ok(rows) => rows.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) => vec![Err(e)],
        }
    })
}

/// Puts the node's checkpoint, if it has one, into `store` (freshly loaded), and starts
/// `out` from it. Refuses a log that does not continue the checkpoint: records the
/// checkpoint needs are gone, or the log lost records the checkpoint covers.
pub(super) fn load(
    wal: &Wal,
    store: &PartitionStore,
    out: &mut Recovered,
) -> Result<Option<Loaded>, QError> {
    let (first, next) = (wal.log.first_lsn(), wal.log.next_lsn());
    // A damaged checkpoint is not needed while the log still holds everything.
    let damaged = |e: QError| match first {
        0 => QError::Other(format!(
            "{e}; the write-ahead log still holds every record from the first: move the \
             checkpoint away, and the server recovers from the log alone"
        )),
        _ => e,
    };
    let snap = open_snapshot(&wal.checkpoint).map_err(|e| damaged(failed(wal, e)))?;
    let Some(mut snap) = snap else {
        if first > 0 {
            return Err(QError::Other(format!(
                "the write-ahead log in {} starts at record {first}, and there is no checkpoint \
                 ({}) holding what came before: it was deleted; restore it, or start with a \
                 new data directory",
                wal.log.dir().display(),
                wal.checkpoint.display()
            )));
        }
        return Ok(None);
    };
    let head = head(wal, &mut snap).map_err(damaged)?;
    if first > head.upto || next < head.upto {
        return Err(QError::Other(format!(
            "the write-ahead log in {} holds records {first} to {next} (excluded), which do not \
             continue its checkpoint {} (up to record {}): {}",
            wal.log.dir().display(),
            wal.checkpoint.display(),
            head.upto,
            if first > head.upto {
                "records in between are gone"
            } else {
                "the log lost records the checkpoint covers (it was cut or replaced)"
            }
        )));
    }
    out.folded = head.folded;
    let mut count = 0;
    for row in rows(wal, snap) {
        let Row {
            table,
            key,
            place,
            bytes,
        } = row.map_err(damaged)?;
        let bytes = bytes.as_deref();
        put(store, &ImageView { table, key, bytes })
            .map_err(|why| failed(wal, format!("it holds {why}: not this cluster's")))?;
        out.redo.seed((table, key), place);
        count += 1;
    }
    wal.checkpointed.store(head.upto, Ordering::Relaxed);
    Ok(Some(Loaded {
        upto: head.upto,
        rows: count,
    }))
}

/// A checkpoint's [`Images`]: the latest image of each row, in the commit order (hashed while
/// the log is folded, sorted once to be written). A row written again reuses its buffer.
#[derive(Default)]
struct Latest(FxHashMap<(TableId, Key), Row>);

impl Images for Latest {
    fn put(&mut self, images: &[ImageView<'_>], place: Place) -> Result<(), String> {
        for img in images {
            match self.0.entry((img.table, img.key)) {
                Entry::Vacant(slot) => {
                    slot.insert(Row {
                        table: img.table,
                        key: img.key,
                        place,
                        bytes: img.bytes.map(<[u8]>::to_vec),
                    });
                }
                Entry::Occupied(mut slot) if slot.get().place <= place => {
                    let row = slot.get_mut();
                    row.place = place;
                    match (&mut row.bytes, img.bytes) {
                        (Some(buf), Some(b)) => {
                            buf.clear();
                            buf.extend_from_slice(b);
                        }
                        (kept, b) => *kept = b.map(<[u8]>::to_vec),
                    }
                }
                Entry::Occupied(_) => {} // a later commit's image is kept
            }
        }
        Ok(())
    }
}

/// What one checkpoint did.
struct Taken {
    upto: Lsn,
    records: u64,
    rows: u64,
    bytes: u64,
}

impl<C: Cc> Node<C> {
    /// The checkpointer thread: a checkpoint every `every`, until the node stops. A failed
    /// checkpoint is reported and tried again next time; the log is kept meanwhile.
    pub(super) fn checkpoint_loop(&self, every: Duration) {
        let mut next = Instant::now() + every;
        while !self.stop.load(Ordering::Acquire) {
            if Instant::now() < next {
                std::thread::sleep(super::IDLE_WAIT);
                continue;
            }
            next = Instant::now() + every;
            self.checkpoint_and_report();
        }
    }

    /// Takes a checkpoint now (a node that stops takes one, so that its next start reads
    /// less) and reports it.
    pub(super) fn checkpoint_and_report(&self) {
        let began = Instant::now();
        match self.checkpoint() {
            Ok(Some(t)) => tracing::info!(
                "node {}: checkpoint up to log record {} in {:.1?}: {} records folded, {} \
                 rows, {} bytes",
                self.id,
                t.upto,
                began.elapsed(),
                t.records,
                t.rows,
                t.bytes
            ),
            Ok(None) => {}
            Err(e) => tracing::error!("node {}: no checkpoint: {e}", self.id),
        }
    }

    fn checkpoint(&self) -> Result<Option<Taken>, QError> {
        match &self.wal {
            Some(wal) => take(wal, |at| self.cc.commit_order(at)),
            None => Ok(None),
        }
    }
}

/// Folds the log written since the last checkpoint into a new one, then drops it; `None` if
/// nothing was written since. `commit_order` is the protocol's.
fn take(
    wal: &Wal,
    commit_order: impl Fn(&Attempt) -> Option<u128>,
) -> Result<Option<Taken>, QError> {
    let from = wal.checkpointed.load(Ordering::Relaxed);
    let upto = wal.log.next_lsn();
    if upto == from {
        return Ok(None);
    }
    // On disk before anything relies on the checkpoint: a log that lost records it covers
    // would number new records as ones the checkpoint holds.
    wal.log.force_sync().map_err(|e| failed(wal, e))?;
    let prev = open_snapshot(&wal.checkpoint).map_err(|e| failed(wal, e))?;
    let (mut folded, prev_rows) = match prev {
        Some(mut snap) => {
            let h = head(wal, &mut snap)?;
            if h.upto != from {
                return Err(failed(
                    wal,
                    "it does not end where the last one taken ended",
                ));
            }
            let records = usize::try_from(snap.len()).unwrap_or(usize::MAX);
            (h.folded, Some((records * ROWS_PER_RECORD, rows(wal, snap))))
        }
        None => (Folded::default(), None),
    };
    // Sized for the rows the last checkpoint held: most are written again.
    let rows_before = prev_rows.as_ref().map_or(0, |(n, _)| *n);
    let mut latest = Latest(FxHashMap::with_capacity_and_hasher(
        rows_before,
        Default::default(),
    ));
    let mut records = 0;
    for item in wal.records(from)? {
        let (lsn, bytes) = item?;
        if lsn >= upto {
            break;
        }
        let record = wal.decode(lsn, &bytes)?;
        records += 1;
        folded
            .fold(lsn, record, &commit_order, &mut latest)
            .map_err(|why| failed(wal, why))?;
    }
    let prev_rows = prev_rows.map(|(_, rows)| rows);
    let (rows, bytes) = write(wal, Head { upto, folded }, prev_rows, latest)?;
    wal.checkpointed.store(upto, Ordering::Relaxed);
    wal.log
        .compact_before(upto)
        .map_err(|e| failed(wal, format!("taken, but the log was not cut: {e}")))?;
    Ok(Some(Taken {
        upto,
        records,
        rows,
        bytes,
    }))
}

/// Writes a checkpoint: `head`, then the rows of the previous checkpoint merged with the
/// images folded since (the later in the commit order wins). Returns its rows and bytes.
fn write(
    wal: &Wal,
    head: Head,
    prev: Option<impl Iterator<Item = Result<Row, QError>>>,
    latest: Latest,
) -> Result<(u64, u64), QError> {
    let mut out = SnapshotWriter::create(&wal.checkpoint).map_err(|e| failed(wal, e))?;
    let bytes = postcard::to_allocvec(&head).expect("a checkpoint head encodes");
    out.push(&bytes).map_err(|e| failed(wal, e))?;
    let mut chunk: Vec<Row> = Vec::with_capacity(ROWS_PER_RECORD);
    let mut count = 0u64;
    let flush = |chunk: &mut Vec<Row>, out: &mut SnapshotWriter| {
        let bytes = postcard::to_allocvec(&*chunk).expect("checkpoint rows encode");
        let n = chunk.len() as u64;
        chunk.clear();
        out.push(&bytes).map(|()| n).map_err(|e| failed(wal, e))
    };
    let mut sorted: Vec<Row> = latest.0.into_values().collect();
    sorted.sort_unstable_by_key(|r| (r.table, r.key));
    let mut new = sorted.into_iter();
    let mut old = prev.into_iter().flatten();
    let (mut a, mut b) = (old.next().transpose()?, new.next());
    loop {
        let row = match (a.take(), b.take()) {
            (None, None) => break,
            (Some(x), None) => {
                a = old.next().transpose()?;
                x
            }
            (None, Some(y)) => {
                b = new.next();
                y
            }
            (Some(x), Some(y)) => match (x.table, x.key).cmp(&(y.table, y.key)) {
                std::cmp::Ordering::Less => {
                    (a, b) = (old.next().transpose()?, Some(y));
                    x
                }
                std::cmp::Ordering::Greater => {
                    (a, b) = (Some(x), new.next());
                    y
                }
                std::cmp::Ordering::Equal => {
                    (a, b) = (old.next().transpose()?, new.next());
                    if x.place > y.place {
                        x
                    } else {
                        y
                    }
                }
            },
        };
        chunk.push(row);
        if chunk.len() == ROWS_PER_RECORD {
            count += flush(&mut chunk, &mut out)?;
        }
    }
    if !chunk.is_empty() {
        count += flush(&mut chunk, &mut out)?;
    }
    let size = out.finish().map_err(|e| failed(wal, e))?;
    Ok((count, size))
}

#[cfg(test)]
mod tests {
    use super::super::msg::Age;
    use super::super::wal::{Record, RowImage};
    use super::*;
    use qstore_core::txn::TableSchema;
    use qstore_core::{NodeId, PartitionId, TxnId};
    use qstore_log::{FsyncPolicy, LogOptions};
    use std::path::{Path, PathBuf};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qstore-ckpt-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A log of tiny segments, so that a checkpoint frees some.
    fn open(d: &Path) -> Wal {
        let opts = LogOptions {
            fsync: FsyncPolicy::Always,
            segment_bytes: 128,
            ..LogOptions::default()
        };
        Wal::open_with(&d.join("wal"), &d.join("checkpoint"), opts)
            .unwrap()
            .0
    }

    fn at(ts: u64) -> Attempt {
        let age = Age {
            birth_us: 0,
            id: TxnId(ts),
        };
        Attempt { age, ts }
    }

    fn image(key: Key, byte: u8) -> Vec<RowImage> {
        vec![RowImage {
            table: 0,
            key,
            bytes: Some(vec![byte; 8]),
        }]
    }

    fn committed(w: &Wal, ts: u64, key: Key, byte: u8) {
        let r = Record::Committed {
            txn: TxnId(ts),
            at: at(ts),
            redo: image(key, byte),
        };
        w.append(&r).unwrap();
    }

    fn store() -> PartitionStore {
        let schema = TableSchema {
            name: "t".into(),
            row_size: 8,
            capacity_per_partition: 64,
            keys_per_partition: 64,
            read_mostly: false,
        };
        PartitionStore::new(PartitionId(0), &[schema])
    }

    fn byte_of(store: &PartitionStore, key: Key) -> Option<u8> {
        let t = store.table(0);
        // SAFETY: nothing else uses the store.
        t.lookup(key).map(|rid| unsafe { t.row(rid) }[0])
    }

    /// Timestamp ordering: the commit order is the timestamps'.
    fn by_ts(a: &Attempt) -> Option<u128> {
        Some(u128::from(a.ts))
    }

    #[test]
    fn a_checkpoint_holds_what_the_log_held_and_the_log_before_it_goes() {
        let d = dir("fold");
        let w = open(&d);
        w.append(&Record::Started).unwrap();
        committed(&w, 5, 1, 0xa);
        // Logged later, but earlier in the commit order: the image of 5 stays.
        committed(&w, 3, 1, 0xb);
        let prepared = Record::Prepared {
            txn: TxnId(10),
            coord: NodeId(1),
            at: at(6),
            redo: image(2, 0xc),
        };
        w.append(&prepared).unwrap();
        for txn in [20, 21] {
            w.append(&Record::Decided {
                txn: TxnId(txn),
                ts: 1,
            })
            .unwrap();
        }
        w.append(&Record::Ended { txn: TxnId(21) }).unwrap();
        let first = take(&w, by_ts).unwrap().expect("a checkpoint");
        assert_eq!((first.records, first.rows), (7, 1));
        assert!(w.log.first_lsn() > 0, "the log before it is dropped");
        assert!(take(&w, by_ts).unwrap().is_none(), "nothing new");
        // After it: the transaction in doubt commits, and another earlier commit of row 1
        // (its place is kept in the checkpoint) arrives.
        let outcome = Record::Outcome {
            txn: TxnId(10),
            commit_ts: Some(7),
        };
        w.append(&outcome).unwrap();
        committed(&w, 4, 1, 0xd);
        committed(&w, 8, 3, 0xe);
        let second = take(&w, by_ts).unwrap().expect("a second checkpoint");
        assert_eq!(second.rows, 3);
        drop(w);
        let w = open(&d);
        let (s, mut out) = (store(), Recovered::default());
        let loaded = load(&w, &s, &mut out).unwrap().expect("loaded");
        assert_eq!((loaded.upto, loaded.rows), (second.upto, 3));
        let bytes: Vec<_> = (1..=3).map(|k| byte_of(&s, k)).collect();
        assert_eq!(bytes, [Some(0xa), Some(0xc), Some(0xe)]);
        assert!(out.folded.in_doubt.is_empty());
        assert_eq!(out.folded.decided.keys().collect::<Vec<_>>(), [&TxnId(20)]);
        assert_eq!(out.folded.starts, 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_log_that_does_not_continue_its_checkpoint_is_refused() {
        let d = dir("refused");
        let w = open(&d);
        for ts in 1..=20 {
            committed(&w, ts, ts, 1);
        }
        take(&w, by_ts).unwrap();
        drop(w);
        let load_err = || {
            let (s, mut out) = (store(), Recovered::default());
            load(&open(&d), &s, &mut out).unwrap_err().to_string()
        };
        // The checkpoint deleted (a write of the next one cut short leaves it in place):
        std::fs::rename(d.join("checkpoint"), d.join("kept")).unwrap();
        let e = load_err();
        assert!(
            e.contains("no checkpoint") && e.contains("starts at record"),
            "{e}"
        );
        // The log replaced by an empty one:
        std::fs::rename(d.join("kept"), d.join("checkpoint")).unwrap();
        std::fs::remove_dir_all(d.join("wal")).unwrap();
        let e = load_err();
        assert!(e.contains("lost records the checkpoint covers"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
