//! Every protocol gives the same answer to the same request: a call whose program has no
//! accesses, reads and read-modify-writes of keys that do not exist (single- and
//! multi-partition, by accesses that may and may not abort), deletes and inserts (of the same
//! key again, within one transaction and across transactions), and then an ordinary
//! transaction, which must still be answered (a node wedged by an earlier request fails
//! the test after a timeout instead of hanging it).
//!
//! Each request is submitted alone and answered before the next, so the answers are
//! deterministic and the serial protocol's are the reference. Every protocol of the
//! registry runs on one node and on two (keys 0..64 on node 0, 64..128 on node 1), and so
//! do Q-Store's other execution modes.

use qstore_core::config::{Isolation, QStoreMode};
use qstore_core::txn::{
    AccessKind, Catalog, Procedure, Program, RowLoader, StepId, TxnOutcome, Value,
};
use qstore_core::{PartitionId, QError, RunConfig};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{access, add, counter_catalog, int, read, take, Pay, TestClient, KEYS};

/// How long one request may take before its node counts as wedged.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Concurrency-control aborts a request may meet before the test gives up on it (nothing
/// else runs, so there should be none).
const MAX_RETRIES: usize = 20;

/// The last keys of each partition are not loaded: they are the missing keys.
const MISSING_PER_PARTITION: u64 = 4;

fn missing(k: u64) -> bool {
    k % KEYS >= KEYS - MISSING_PER_PARTITION
}

/// Loads partition `p` (range partitioning): key k holds k, except the missing keys.
fn load_with_holes(p: PartitionId, l: &mut dyn RowLoader) -> Result<(), QError> {
    let mut keys = (0..KEYS)
        .map(|i| p.0 as u64 * KEYS + i)
        .filter(|&k| !missing(k));
    l.load_rows(0, &mut keys, &mut |k, row| {
        row.copy_from_slice(&(k as i64).to_le_bytes())
    })
}

/// `ops(key0, op0, key1, op1, ...)`: reads (op 0), adds 1 to (op 1), inserts with value 1
/// (op 2) or deletes, answering the value it had (op 3) each key in order; no access may
/// abort. No arguments make a program with no accesses (as YCSB's procedure
/// does for an empty argument).
struct Ops {
    read: StepId,
    add: StepId,
}

impl Procedure for Ops {
    fn name(&self) -> &'static str {
        "ops"
    }

    fn may_abort(&self) -> bool {
        false
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        if !args.len().is_multiple_of(2) {
            return Err("expected (key, op) pairs".into());
        }
        let accesses = (0..args.len() / 2)
            .map(|i| {
                let key = int(args, 2 * i)?;
                Ok(match int(args, 2 * i + 1)? {
                    0 => access(key, AccessKind::Read, self.read, Value::Null, vec![]),
                    1 => access(
                        key,
                        AccessKind::ReadModifyWrite,
                        self.add,
                        Value::Int(1),
                        vec![],
                    ),
                    2 => access(key, AccessKind::Insert, self.add, Value::Int(1), vec![]),
                    3 => access(key, AccessKind::Delete, self.read, Value::Null, vec![]),
                    op => return Err(format!("op must be 0 to 3, got {op}")),
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Program { accesses })
    }
}

/// `must_read(key)`: reads the key, an access that may abort (so aborts if it is missing).
struct MustRead {
    read: StepId,
}

impl Procedure for MustRead {
    fn name(&self) -> &'static str {
        "must_read"
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let mut a = access(
            int(args, 0)?,
            AccessKind::Read,
            self.read,
            Value::Null,
            vec![],
        );
        a.may_abort = true;
        Ok(Program { accesses: vec![a] })
    }
}

fn catalog() -> Catalog {
    let mut c = counter_catalog();
    let read = c.steps.register("read", read);
    let add = c.steps.register("add", add);
    let take = c.steps.register("take", take);
    c.add_procedure(Arc::new(Ops { read, add }));
    c.add_procedure(Arc::new(Pay { add, take }));
    c.add_procedure(Arc::new(MustRead { read }));
    c
}

/// One request of the table: a name for messages, the node it is submitted at, the call,
/// and the answer the transaction model prescribes (`qstore_core::txn`): a program with no
/// accesses is refused; an access to a missing record aborts the transaction only if it is
/// declared abortable, and otherwise outputs Null.
struct Request {
    name: &'static str,
    home: u32,
    proc: &'static str,
    args: Vec<i64>,
    expect: Expect,
}

enum Expect {
    Committed(Vec<Value>),
    LogicAbort(&'static str),
    /// Refused, for a reason containing this.
    Rejected(&'static str),
}

impl Expect {
    fn matches(&self, got: &TxnOutcome) -> bool {
        match (self, got) {
            (Expect::Committed(want), TxnOutcome::Committed(got)) => want == got,
            (Expect::LogicAbort(want), TxnOutcome::LogicAbort(got)) => want == got,
            (Expect::Rejected(want), TxnOutcome::Rejected(got)) => got.contains(want),
            _ => false,
        }
    }
}

fn req(name: &'static str, home: u32, call: (&'static str, &[i64]), expect: Expect) -> Request {
    Request {
        name,
        home,
        proc: call.0,
        args: call.1.to_vec(),
        expect,
    }
}

/// The requests for a cluster of `nodes` nodes, the ordinary transaction last.
fn requests(nodes: u32) -> Vec<Request> {
    // Keys that exist, one per node when there are two, and missing ones.
    let (here, there): (i64, i64) = if nodes == 1 { (5, 6) } else { (5, 70) };
    let (gone_here, gone_there): (i64, i64) = if nodes == 1 { (61, 62) } else { (61, 125) };
    // Keys the deletes and inserts use, and nothing else.
    let (here2, there2): (i64, i64) = if nodes == 1 { (7, 8) } else { (7, 72) };
    let gone = |k: i64| missing(k as u64);
    assert!(gone(gone_here) && gone(gone_there) && !gone(here) && !gone(there));
    let far = (nodes - 1).min(1);
    let int = Value::Int;
    let null = || Value::Null;
    let not_found = || Expect::LogicAbort("key not found");
    let refused = || Expect::Rejected("no record accesses");
    use Expect::Committed;
    vec![
        req("empty program", 0, ("ops", &[]), refused()),
        req(
            "empty program at the last node",
            far,
            ("ops", &[]),
            refused(),
        ),
        req(
            "read of a missing key",
            0,
            ("ops", &[gone_here, 0]),
            Committed(vec![null()]),
        ),
        req(
            "read-modify-write of a missing key",
            0,
            ("ops", &[gone_here, 1]),
            Committed(vec![null()]),
        ),
        req(
            "read-modify-write of a missing key on another node",
            0,
            ("ops", &[gone_there, 1]),
            Committed(vec![null()]),
        ),
        // The write of `here` stands: the access to the missing key cannot abort.
        req(
            "multi-partition call touching a missing key",
            0,
            ("ops", &[here, 1, gone_there, 1, there, 0]),
            Committed(vec![int(here + 1), null(), int(there)]),
        ),
        req(
            "read (may abort) of a missing key",
            0,
            ("must_read", &[gone_there]),
            not_found(),
        ),
        req(
            "check (may abort) of a missing key",
            far,
            ("pay", &[gone_here, there, 1]),
            not_found(),
        ),
        req(
            "check (may abort) of a missing key after a write elsewhere",
            0,
            ("pay", &[gone_there, here, 1]),
            not_found(),
        ),
        // Both aborted checks had their writes undone; the multi-partition call's stayed.
        req(
            "what those left behind",
            0,
            ("ops", &[here, 0, there, 0]),
            Committed(vec![int(here + 1), int(there)]),
        ),
        req(
            "delete, then insert of the key again in the same transaction",
            far,
            ("ops", &[here2, 3, here2, 0, here2, 2, here2, 1]),
            Committed(vec![int(here2), null(), int(1), int(2)]),
        ),
        req(
            "delete on another node",
            0,
            ("ops", &[there2, 3, here2, 0]),
            Committed(vec![int(there2), int(2)]),
        ),
        req(
            "reads of the deleted key, and its delete again",
            far,
            ("ops", &[there2, 0, there2, 1, there2, 3]),
            Committed(vec![null(), null(), null()]),
        ),
        req(
            "read (may abort) of the deleted key",
            0,
            ("must_read", &[there2]),
            not_found(),
        ),
        req(
            "insert of the deleted key, and of an existing one",
            0,
            ("ops", &[there2, 2, here2, 2, there2, 1]),
            Committed(vec![int(1), null(), int(2)]),
        ),
        req(
            "insert then delete of a missing key in one transaction",
            0,
            ("ops", &[gone_there, 2, gone_there, 3, gone_there, 0]),
            Committed(vec![int(1), int(1), null()]),
        ),
        req(
            "what the deletes and inserts left",
            far,
            ("ops", &[here2, 0, there2, 0, gone_there, 0]),
            Committed(vec![int(2), int(2), null()]),
        ),
        req(
            "ordinary transaction afterwards",
            far,
            ("ops", &[here, 1, there, 1]),
            Committed(vec![int(here + 2), int(there + 1)]),
        ),
    ]
}

/// A protocol of the registry, or one of Q-Store's other modes.
struct Variant {
    name: String,
    protocol: &'static str,
    tune: fn(&mut RunConfig),
}

fn variants() -> Vec<Variant> {
    let mut v: Vec<Variant> = qstore_engine::PROTOCOLS
        .iter()
        .map(|p| Variant {
            name: p.name.to_string(),
            protocol: p.name,
            tune: |_| {},
        })
        .collect();
    v.push(Variant {
        name: "qstore (conservative)".into(),
        protocol: "qstore",
        tune: |c| c.protocol.qstore.mode = QStoreMode::Conservative,
    });
    v.push(Variant {
        name: "qstore (read committed)".into(),
        protocol: "qstore",
        tune: |c| c.protocol.qstore.isolation = Isolation::ReadCommitted,
    });
    v
}

/// A client of a cluster of `nodes` running variant `v` over this file's procedures.
fn start(v: &Variant, nodes: u32) -> TestClient {
    let mut cfg = RunConfig::default();
    cfg.protocol.name = v.protocol.into();
    cfg.cluster.nodes = nodes;
    cfg.cluster.workers = 2;
    (v.tune)(&mut cfg);
    TestClient::start(cfg, catalog(), &load_with_holes)
        .unwrap_or_else(|e| panic!("{}: {e}", v.name))
}

/// Each variant's answers to the requests, in request order (`None`: no answer in time,
/// and nothing submitted after it).
fn answers(nodes: u32) -> Vec<(String, Vec<Option<TxnOutcome>>)> {
    let requests = requests(nodes);
    variants()
        .iter()
        .map(|v| {
            let mut c = start(v, nodes);
            let mut got = Vec::new();
            for r in &requests {
                let answer = c.run((r.home, r.proc, &r.args), ANSWER_TIMEOUT, MAX_RETRIES);
                let wedged = answer.is_none();
                got.push(answer);
                if wedged {
                    break;
                }
            }
            got.resize(requests.len(), None);
            c.cluster.stop();
            (v.name.clone(), got)
        })
        .collect()
}

fn check(nodes: u32) {
    let requests = requests(nodes);
    let answers = answers(nodes);
    let (reference, expected) = &answers[0];
    let mut report = String::new();
    for (i, r) in requests.iter().enumerate() {
        for (variant, got) in &answers {
            if got[i] != expected[i] || got[i].is_none() {
                let _ = writeln!(
                    report,
                    "{nodes} node(s), {:?} at node {}: {variant} answered {:?}, {reference} {:?}",
                    r.name, r.home, got[i], expected[i]
                );
            }
        }
    }
    for (i, r) in requests.iter().enumerate() {
        if !expected[i]
            .as_ref()
            .is_some_and(|got| r.expect.matches(got))
        {
            let _ = writeln!(
                report,
                "{nodes} node(s), {:?}: {reference} answered {:?}, not what the model says",
                r.name, expected[i]
            );
        }
    }
    let last = requests.len() - 1;
    for (variant, got) in &answers {
        if !matches!(got[last], Some(TxnOutcome::Committed(_))) {
            let _ = writeln!(
                report,
                "{nodes} node(s): {variant} did not commit the ordinary transaction: {:?}",
                got[last]
            );
        }
    }
    assert!(report.is_empty(), "answers differ:\n{report}");
}

#[test]
fn every_protocol_gives_the_same_answers_on_one_node() {
    check(1);
}

#[test]
fn every_protocol_gives_the_same_answers_on_two_nodes() {
    check(2);
}
