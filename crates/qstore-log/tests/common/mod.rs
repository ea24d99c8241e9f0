//! Helpers shared by the integration tests: temporary directories, time bounds, payloads.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use qstore_log::{Lsn, RecordLog};

/// A fresh directory under the system's temporary directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates a new empty directory whose name contains `tag`.
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("qstore-log-{tag}-{}-{n}-{nanos}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `f` on its own thread and fails the test if it takes more than `secs` seconds.
pub fn with_timeout<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(RecvTimeoutError::Timeout) => panic!("test did not finish within {secs} s"),
        Err(RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("test thread ended without a result"),
        },
    }
}

/// A payload of a size that varies with `i` (0 to a few hundred bytes, some empty) and content
/// that identifies `i`.
pub fn payload(i: u64) -> Vec<u8> {
    let len = match i % 7 {
        0 => 0,
        1 => 1,
        2 => 300 + (i % 50) as usize,
        _ => (i * 37 % 120) as usize,
    };
    (0..len).map(|j| (i as usize * 31 + j * 7) as u8).collect()
}

/// Every record of `log` from its first one.
pub fn read_all(log: &dyn RecordLog) -> Vec<(Lsn, Vec<u8>)> {
    log.read_from(log.first_lsn())
        .expect("read_from(first_lsn)")
        .collect::<Result<Vec<_>, _>>()
        .expect("records read back")
}

/// The segment files of a log directory, sorted by name.
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("list log dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    files
}
