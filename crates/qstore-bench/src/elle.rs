//! Client-observed histories in the Jepsen/Elle JSON-lines format, for independent
//! checkers (e.g. `adya check -m list-append -c serializable FILE`).
//!
//! Each transaction is an `invoke` event written just before it is first submitted and an
//! `ok` (committed), `fail` (definitely not committed) or `info` (outcome unknown) event
//! written just after its final answer, so the file order is consistent with real time.
//! A process is a sequential lane: one transaction at a time, as Elle requires; a client
//! with several transactions in flight uses several lanes. Concurrency-control aborts are
//! invisible here: the retried attempts are one operation.

use parking_lot::Mutex;
use qstore_workload::ElleOp;
use serde_json::{json, Value as Json};
use std::io::Write;

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    Ok,
    Fail,
    Info,
}

struct Inner {
    out: Box<dyn Write + Send>,
    index: u64,
    error: Option<std::io::Error>,
}

/// A shared, append-only Elle history.
pub struct ElleLog {
    inner: Mutex<Inner>,
}

fn ops_json(ops: &[ElleOp]) -> Json {
    Json::Array(
        ops.iter()
            .map(|op| match op {
                ElleOp::Append { key, value } => json!(["append", key, value]),
                ElleOp::Read { key, list } => json!(["r", key, list]),
            })
            .collect(),
    )
}

impl ElleLog {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        ElleLog {
            inner: Mutex::new(Inner {
                out,
                index: 0,
                error: None,
            }),
        }
    }

    fn event(&self, kind: &str, process: u64, ops: &[ElleOp]) {
        let mut g = self.inner.lock();
        let line =
            json!({"index": g.index, "type": kind, "process": process, "value": ops_json(ops)});
        g.index += 1;
        if g.error.is_none() {
            if let Err(e) = writeln!(g.out, "{line}") {
                g.error = Some(e);
            }
        }
    }

    pub fn invoke(&self, process: u64, ops: &[ElleOp]) {
        self.event("invoke", process, ops);
    }

    pub fn complete(&self, process: u64, how: Completion, ops: &[ElleOp]) {
        let kind = match how {
            Completion::Ok => "ok",
            Completion::Fail => "fail",
            Completion::Info => "info",
        };
        self.event(kind, process, ops);
    }

    /// Flushes the file; reports the first write error, if any.
    pub fn finish(&self) -> std::io::Result<()> {
        let mut g = self.inner.lock();
        if let Some(e) = g.error.take() {
            return Err(e);
        }
        g.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn events_are_jepsen_json_lines() {
        let buf = Buf::default();
        let log = ElleLog::new(Box::new(buf.clone()));
        let inv = [
            ElleOp::Append { key: 1, value: 7 },
            ElleOp::Read { key: 2, list: None },
        ];
        let ok = [
            ElleOp::Append { key: 1, value: 7 },
            ElleOp::Read {
                key: 2,
                list: Some(vec![3, 5]),
            },
        ];
        log.invoke(4, &inv);
        log.complete(4, Completion::Ok, &ok);
        log.finish().unwrap();
        let text = String::from_utf8(buf.0.lock().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            r#"{"index":0,"process":4,"type":"invoke","value":[["append",1,7],["r",2,null]]}"#
        );
        assert_eq!(
            lines[1],
            r#"{"index":1,"process":4,"type":"ok","value":[["append",1,7],["r",2,[3,5]]]}"#
        );
    }
}
