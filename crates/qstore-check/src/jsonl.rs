//! The JSON-lines history file format.
//!
//! One JSON object per line; blank lines are skipped:
//!
//! ```text
//! {"type":"txn","id":17,"node":2,"status":"committed","reads":[[0,42,0,0]],"writes":[[0,42,1]]}
//! {"type":"txn","id":18,"node":0,"status":"aborted","cause":"conflict","logic":false,"reads":[],"writes":[[0,7,2]]}
//! {"type":"order","table":0,"key":42,"versions":[17,23,99]}
//! ```
//!
//! Reads are `[table, key, writer, seq]`, writes are `[table, key, count]`.
//! Unknown fields are ignored so the format can grow.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, BufRead, BufWriter, Write};
use std::marker::PhantomData;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use crate::model::{History, ObjKey, Outcome, TxnRecord, Version};

/// One line of a history file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Record {
    /// A transaction attempt (`"type":"txn"`).
    Txn(TxnRecord),
    /// The installed version order of one record (`"type":"order"`).
    Order {
        /// The record.
        key: ObjKey,
        /// Committed writers, oldest first, excluding the initial version.
        versions: Vec<u64>,
    },
}

/// An error reading a history file, always naming the (1-based) line.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The underlying reader failed.
    #[error("line {line}: {source}")]
    Io {
        /// Line being read when the error occurred.
        line: u64,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The line is not valid JSON or does not have the expected shape.
    #[error("line {line}: {message} (column {column})")]
    Syntax {
        /// Offending line.
        line: u64,
        /// Column reported by the JSON parser.
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// The line is well-formed JSON but not a valid record.
    #[error("line {line}: {message}")]
    Invalid {
        /// Offending line.
        line: u64,
        /// What was wrong.
        message: String,
    },
}

impl ReadError {
    /// The 1-based line number the error refers to.
    pub fn line(&self) -> u64 {
        match self {
            ReadError::Io { line, .. }
            | ReadError::Syntax { line, .. }
            | ReadError::Invalid { line, .. } => *line,
        }
    }
}

impl History {
    /// Writes the history as JSON lines: all transactions, then all version orders.
    pub fn write_jsonl<W: Write>(&self, out: W) -> io::Result<()> {
        let mut writer = HistoryWriter::new(BufWriter::new(out));
        for txn in &self.txns {
            writer.write_txn(txn)?;
        }
        for (key, versions) in &self.version_order {
            writer.write_order(*key, versions)?;
        }
        writer.flush()
    }

    /// Reads a JSON-lines history, stopping at the first bad line.
    pub fn read_jsonl<R: BufRead>(input: R) -> Result<History, ReadError> {
        let mut history = History::default();
        for record in HistoryReader::new(input) {
            match record? {
                Record::Txn(txn) => history.txns.push(txn),
                Record::Order { key, versions } => history.version_order.push((key, versions)),
            }
        }
        Ok(history)
    }
}

/// Streaming writer of history records, one JSON line per call.
///
/// Each record is formatted into an internal buffer and handed to the
/// underlying writer with a single `write_all`, so wrapping a file in a
/// `BufWriter` is optional.
#[derive(Debug)]
pub struct HistoryWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
}

impl<W: Write> HistoryWriter<W> {
    /// Creates a writer appending to `out`.
    pub fn new(out: W) -> Self {
        Self {
            out,
            buf: Vec::with_capacity(256),
        }
    }

    /// Appends one transaction record.
    pub fn write_txn(&mut self, txn: &TxnRecord) -> io::Result<()> {
        let (status, cause, logic) = match &txn.outcome {
            Outcome::Committed => ("committed", None, None),
            Outcome::Aborted { cause, logic } => ("aborted", Some(cause.as_str()), Some(*logic)),
        };
        self.emit(&TxnLineOut {
            ty: "txn",
            id: txn.id,
            node: txn.node,
            status,
            cause,
            logic,
            reads: ReadsOut(&txn.reads),
            writes: WritesOut(&txn.writes),
        })
    }

    /// Appends the version order of one record.
    pub fn write_order(&mut self, key: ObjKey, versions: &[u64]) -> io::Result<()> {
        self.emit(&OrderLineOut {
            ty: "order",
            table: key.table,
            key: key.key,
            versions,
        })
    }

    /// Appends any record.
    pub fn write_record(&mut self, record: &Record) -> io::Result<()> {
        match record {
            Record::Txn(txn) => self.write_txn(txn),
            Record::Order { key, versions } => self.write_order(*key, versions),
        }
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Returns the underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.out
    }

    fn emit<T: Serialize>(&mut self, line: &T) -> io::Result<()> {
        self.buf.clear();
        serde_json::to_writer(&mut self.buf, line).map_err(io::Error::other)?;
        self.buf.push(b'\n');
        self.out.write_all(&self.buf)
    }
}

/// Streaming reader of history records: an iterator of line-numbered results.
///
/// After an error the iterator continues with the next line, so callers can
/// choose to stop or to collect all errors.
#[derive(Debug)]
pub struct HistoryReader<R: BufRead> {
    input: R,
    line: u64,
    buf: Vec<u8>,
}

impl<R: BufRead> HistoryReader<R> {
    /// Creates a reader over `input`.
    pub fn new(input: R) -> Self {
        Self {
            input,
            line: 0,
            buf: Vec::with_capacity(256),
        }
    }

    /// The number of the last line read (1-based; 0 before the first).
    pub fn line(&self) -> u64 {
        self.line
    }
}

impl<R: BufRead> Iterator for HistoryReader<R> {
    type Item = Result<Record, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            self.line += 1;
            match self.input.read_until(b'\n', &mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(source) => {
                    return Some(Err(ReadError::Io {
                        line: self.line,
                        source,
                    }))
                }
            }
            let text = self.buf.trim_ascii_end();
            if !text.is_empty() {
                return Some(parse_line(text, self.line));
            }
        }
    }
}

/// Parses one non-blank line into a record.
fn parse_line(bytes: &[u8], line: u64) -> Result<Record, ReadError> {
    let raw: LineIn<'_> = serde_json::from_slice(bytes).map_err(|e| syntax_error(&e, line))?;
    let invalid = |message: String| ReadError::Invalid { line, message };
    match raw.ty.as_ref() {
        "txn" => raw.into_txn().map(Record::Txn).map_err(invalid),
        "order" => raw.into_order().map_err(invalid),
        other => Err(invalid(format!("unknown record type {other:?}"))),
    }
}

/// Converts a serde_json error into a [`ReadError`] with our own line number.
fn syntax_error(err: &serde_json::Error, line: u64) -> ReadError {
    let mut message = err.to_string();
    // serde_json appends " at line 1 column N"; we report the file line instead.
    if let Some(at) = message.rfind(" at line ") {
        message.truncate(at);
    }
    ReadError::Syntax {
        line,
        column: err.column(),
        message,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum StatusIn {
    Committed,
    Aborted,
}

/// The union of all record shapes; which fields are required depends on `type`.
#[derive(Deserialize)]
#[serde(expecting = "a history record object")]
struct LineIn<'a> {
    #[serde(rename = "type", borrow)]
    ty: Cow<'a, str>,
    id: Option<u64>,
    node: Option<u32>,
    status: Option<StatusIn>,
    cause: Option<String>,
    logic: Option<bool>,
    #[serde(default, deserialize_with = "de_reads")]
    reads: Vec<(ObjKey, Version)>,
    #[serde(default, deserialize_with = "de_writes")]
    writes: Vec<(ObjKey, u32)>,
    table: Option<u16>,
    key: Option<u64>,
    versions: Option<Vec<u64>>,
}

impl LineIn<'_> {
    fn into_txn(self) -> Result<TxnRecord, String> {
        let id = self.id.ok_or("txn record without \"id\"")?;
        if id == 0 {
            return Err("transaction id 0 is reserved for the initial version".into());
        }
        let node = self.node.ok_or("txn record without \"node\"")?;
        let outcome = match self.status.ok_or("txn record without \"status\"")? {
            StatusIn::Committed => Outcome::Committed,
            StatusIn::Aborted => Outcome::Aborted {
                cause: self.cause.unwrap_or_default(),
                logic: self.logic.unwrap_or(false),
            },
        };
        if let Some((key, _)) = self.writes.iter().find(|(_, count)| *count == 0) {
            return Err(format!("T{id} writes {key} with count 0 (must be >= 1)"));
        }
        Ok(TxnRecord {
            id,
            node,
            outcome,
            reads: self.reads,
            writes: self.writes,
        })
    }

    fn into_order(self) -> Result<Record, String> {
        let table = self.table.ok_or("order record without \"table\"")?;
        let key = self.key.ok_or("order record without \"key\"")?;
        let versions = self.versions.ok_or("order record without \"versions\"")?;
        Ok(Record::Order {
            key: ObjKey { table, key },
            versions,
        })
    }
}

/// Deserializes `[[table,key,writer,seq],...]` straight into the model type.
fn de_reads<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(ObjKey, Version)>, D::Error> {
    d.deserialize_seq(MapSeq::new(
        |(table, key, writer, seq): (u16, u64, u64, u32)| {
            (ObjKey { table, key }, Version { writer, seq })
        },
    ))
}

/// Deserializes `[[table,key,count],...]` straight into the model type.
fn de_writes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(ObjKey, u32)>, D::Error> {
    d.deserialize_seq(MapSeq::new(|(table, key, count): (u16, u64, u32)| {
        (ObjKey { table, key }, count)
    }))
}

/// A sequence visitor that maps each element as it is parsed, avoiding an
/// intermediate vector.
struct MapSeq<T, U, F> {
    map: F,
    marker: PhantomData<fn(T) -> U>,
}

impl<T, U, F: Fn(T) -> U> MapSeq<T, U, F> {
    fn new(map: F) -> Self {
        Self {
            map,
            marker: PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>, U, F: Fn(T) -> U> Visitor<'de> for MapSeq<T, U, F> {
    type Value = Vec<U>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of arrays")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<U>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(4).min(4096));
        while let Some(item) = seq.next_element::<T>()? {
            out.push((self.map)(item));
        }
        Ok(out)
    }
}

#[derive(Serialize)]
struct TxnLineOut<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    id: u64,
    node: u32,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logic: Option<bool>,
    reads: ReadsOut<'a>,
    writes: WritesOut<'a>,
}

#[derive(Serialize)]
struct OrderLineOut<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    table: u16,
    key: u64,
    versions: &'a [u64],
}

/// Serializes reads as `[[table,key,writer,seq],...]`.
struct ReadsOut<'a>(&'a [(ObjKey, Version)]);

impl Serialize for ReadsOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for (k, v) in self.0 {
            seq.serialize_element(&(k.table, k.key, v.writer, v.seq))?;
        }
        seq.end()
    }
}

/// Serializes writes as `[[table,key,count],...]`.
struct WritesOut<'a>(&'a [(ObjKey, u32)]);

impl Serialize for WritesOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for (k, count) in self.0 {
            seq.serialize_element(&(k.table, k.key, *count))?;
        }
        seq.end()
    }
}
