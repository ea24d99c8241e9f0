//! A server's data directory: what it keeps on disk, and whose it is.
//!
//! The directory holds an identity file naming the cluster and the server it belongs to,
//! and the server's logs. A server refuses a directory of another cluster, of another
//! server, or of a cluster of another shape (its log would be replayed onto the wrong
//! partition), and a non-empty directory that is not a data directory at all.

use parking_lot::Mutex;
use qstore_core::config::Fsync;
use qstore_core::error::ConfigError;
use qstore_core::{QError, RunConfig};
use qstore_log::{FsyncPolicy, LogOptions, LogStats, SegmentLog, StatsReader};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The identity file's name.
const IDENTITY: &str = "qstore-data.toml";

/// Whose a data directory is.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    cluster_id: u64,
    server: u32,
    /// The cluster's shape: partitions, replication factor, protocol and workload.
    shape: String,
    /// The content hash of the server's partition as loaded, before any transaction: the
    /// log replays onto exactly that data (workload settings and seed make it).
    initial_data: u64,
    /// How many times a server started with this directory.
    starts: u64,
}

impl Identity {
    fn of(cfg: &RunConfig, server: u32, initial_data: u64) -> Self {
        Identity {
            initial_data,
            cluster_id: cfg.cluster.cluster_id,
            server,
            shape: format!(
                "{} partitions x {} copies, protocol {}, workload {}",
                cfg.cluster.nodes, cfg.replication.factor, cfg.protocol.name, cfg.workload.name
            ),
            starts: 1,
        }
    }

    fn to_text(&self) -> String {
        format!(
            "# A qstore server's data directory: which server of which cluster it belongs to.\n\
             cluster_id = {}\nserver = {}\nshape = {:?}\ninitial_data = {}\nstarts = {}\n",
            self.cluster_id, self.server, self.shape, self.initial_data, self.starts
        )
    }

    fn parse(text: &str) -> Option<Identity> {
        let mut id = Identity {
            cluster_id: 0,
            server: 0,
            shape: String::new(),
            initial_data: 0,
            starts: 0,
        };
        let mut seen = 0;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let (key, value) = line.split_once('=')?;
            let value = value.trim();
            match key.trim() {
                "cluster_id" => id.cluster_id = value.parse().ok()?,
                "server" => id.server = value.parse().ok()?,
                "shape" => id.shape = value.strip_prefix('"')?.strip_suffix('"')?.into(),
                "initial_data" => id.initial_data = value.parse().ok()?,
                "starts" => id.starts = value.parse().ok()?,
                _ => return None,
            }
            seen += 1;
        }
        (seen == 5 && id.starts > 0).then_some(id)
    }
}

/// A server's data directory, checked to be its own.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// Whether it held a server's data already (the server recovers from it).
    existed: bool,
    /// Starts of a server with this directory before this one.
    earlier_starts: u64,
    /// The counters of the logs the server keeps here.
    logs: Mutex<Vec<StatsReader>>,
}

impl DataDir {
    /// Opens server `server`'s data directory at `path`, creating it (and its identity
    /// file) if it does not exist or is empty. `initial_data` is the content hash of the
    /// server's partition as loaded.
    pub fn open(
        path: &Path,
        cfg: &RunConfig,
        server: u32,
        initial_data: u64,
    ) -> Result<DataDir, QError> {
        let want = Identity::of(cfg, server, initial_data);
        // A directory that is not this server's is a mistake in the configuration; one
        // that cannot be read or written is a failure.
        let refuse = |why: String| {
            QError::Config(ConfigError::new(
                "durability.data_dir",
                path.display(),
                format!("server {server} cannot use this data directory: {why}"),
            ))
        };
        let failed = |why: String| {
            QError::Other(format!(
                "server {server}: the data directory {}: {why}",
                path.display()
            ))
        };
        std::fs::create_dir_all(path).map_err(|e| failed(format!("cannot create it: {e}")))?;
        let file = path.join(IDENTITY);
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                let found = Identity::parse(&text)
                    .ok_or_else(|| refuse(format!("its {IDENTITY} is damaged")))?;
                check(&found, &want).map_err(refuse)?;
                let now = Identity {
                    starts: found.starts + 1,
                    ..found
                };
                write_durably(path, &file, now.to_text().as_bytes())
                    .map_err(|e| failed(format!("cannot write {IDENTITY}: {e}")))?;
                Ok(DataDir {
                    path: path.into(),
                    existed: true,
                    earlier_starts: found.starts,
                    logs: Mutex::default(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let empty = std::fs::read_dir(path)
                    .map_err(|e| failed(format!("cannot read it: {e}")))?
                    .next()
                    .is_none();
                if !empty {
                    return Err(refuse(format!(
                        "it is not empty and has no {IDENTITY}: not a qstore data directory \
                         (name an empty or new directory)"
                    )));
                }
                write_durably(path, &file, want.to_text().as_bytes())
                    .map_err(|e| failed(format!("cannot write {IDENTITY}: {e}")))?;
                Ok(DataDir {
                    path: path.into(),
                    existed: false,
                    earlier_starts: 0,
                    logs: Mutex::default(),
                })
            }
            Err(e) => Err(failed(format!("cannot read {IDENTITY}: {e}"))),
        }
    }

    /// Counts the work of a log kept here in [`DataDir::log_stats`].
    pub fn add_log(&self, log: StatsReader) {
        self.logs.lock().push(log);
    }

    /// What the logs kept here did since the server started.
    pub fn log_stats(&self) -> LogStats {
        self.logs
            .lock()
            .iter()
            .fold(LogStats::default(), |sum, l| sum.plus(l.stats()))
    }

    /// Where the write-ahead log of an interactive protocol lives.
    pub fn wal(&self) -> PathBuf {
        self.path.join("wal")
    }

    /// Where the checkpoint of the write-ahead log lives.
    pub fn checkpoint(&self) -> PathBuf {
        self.path.join("checkpoint")
    }

    /// Where the log of the replica group the server belongs to lives.
    pub fn group_log(&self) -> PathBuf {
        self.path.join("group-log")
    }

    /// Whether the directory held the server's data before (it recovers from it).
    pub fn existed(&self) -> bool {
        self.existed
    }

    /// How many times a server started with this directory before: transaction ids made
    /// in this start differ from theirs by it (see [`crate::cluster::EngineCtx::generation`]).
    pub fn earlier_starts(&self) -> u64 {
        self.earlier_starts
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Opens `what` (a log of a data directory, named in messages) in `dir`: a torn tail is cut
/// and reported; damage elsewhere is an error naming the file and offset.
pub fn open_log(what: &str, dir: &Path, opts: LogOptions) -> Result<SegmentLog, QError> {
    let log = SegmentLog::open(dir, opts)
        .map_err(|e| QError::Other(format!("the {what} in {}: {e}", dir.display())))?;
    if let Some(cut) = &log.recovery_report().tail_cut {
        tracing::warn!(
            "the {what} in {}: cut a torn tail at byte {} of {} ({} bytes from record {} on: \
             {}); records before it are intact",
            dir.display(),
            cut.offset,
            cut.path.display(),
            cut.bytes_cut,
            cut.lsn,
            cut.reason
        );
    }
    Ok(log)
}

/// The sync policy of the server's logs, as `durability.fsync` sets it.
pub fn fsync_policy(cfg: &RunConfig) -> FsyncPolicy {
    match cfg.durability.fsync {
        Fsync::Always => FsyncPolicy::Always,
        Fsync::Batch => FsyncPolicy::Batch,
        Fsync::Never => FsyncPolicy::Never,
    }
}

/// Why a directory of identity `found` is not one for `want`.
fn check(found: &Identity, want: &Identity) -> Result<(), String> {
    if found.cluster_id != want.cluster_id {
        return Err(format!(
            "it belongs to cluster {}, not to this cluster ({}); give each cluster its own \
             directories",
            found.cluster_id, want.cluster_id
        ));
    }
    if found.server != want.server {
        return Err(format!(
            "it belongs to server {} of this cluster; each server needs its own",
            found.server
        ));
    }
    if found.shape == want.shape && found.initial_data != want.initial_data {
        return Err(
            "its log was written over other initial data (the workload's settings or \
             the seed differ): start the cluster with the settings it had, or use new \
             directories"
                .into(),
        );
    }
    if found.shape != want.shape {
        return Err(format!(
            "it holds a cluster of {}, and this one is {}; start the cluster as it was, or \
             use new directories",
            found.shape, want.shape
        ));
    }
    Ok(())
}

/// Writes `bytes` to `file` so that it is whole or absent after a crash: a temporary file,
/// synced, renamed over it, and the directory synced.
fn write_durably(dir: &Path, file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temp = file.with_extension("tmp");
    let mut f = std::fs::File::create(&temp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&temp, file)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qstore-data-dir-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_directory_is_made_once_and_refused_to_anyone_else() {
        let d = temp_dir("identity");
        let mut cfg = RunConfig::default();
        cfg.cluster.cluster_id = 7;
        let first = DataDir::open(&d, &cfg, 2, 5).unwrap();
        assert!(!first.existed());
        let again = DataDir::open(&d, &cfg, 2, 5).unwrap();
        assert!(again.existed(), "its own server reopens it");
        assert_eq!((first.earlier_starts(), again.earlier_starts()), (0, 1));
        assert_eq!(DataDir::open(&d, &cfg, 2, 5).unwrap().earlier_starts(), 2);
        let err = |c: &RunConfig, s: u32| DataDir::open(&d, c, s, 5).unwrap_err().to_string();
        assert!(err(&cfg, 3).contains("belongs to server 2"));
        let mut other = cfg.clone();
        other.cluster.cluster_id = 8;
        assert!(err(&other, 2).contains("belongs to cluster 7"));
        let mut shape = cfg.clone();
        shape.cluster.nodes = 5;
        assert!(err(&shape, 2).contains("holds a cluster of 4 partitions"));
        let e = DataDir::open(&d, &cfg, 2, 6).unwrap_err().to_string();
        assert!(e.contains("other initial data"), "{e}");
        std::fs::write(d.join(IDENTITY), "cluster_id = x\n").unwrap();
        assert!(err(&cfg, 2).contains("damaged"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_of_something_else_is_refused() {
        let d = temp_dir("foreign");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("notes.txt"), "mine").unwrap();
        let e = DataDir::open(&d, &RunConfig::default(), 0, 5).unwrap_err();
        assert!(e.to_string().contains("not a qstore data directory"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
