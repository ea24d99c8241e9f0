//! Ownership transfer between three nodes, message by message: the paper's three cases,
//! requests that meet, local transactions sharing one transfer, and lost messages; and, on
//! nodes that keep notes, crashes (see [`crash`]).

mod crash;

use super::msg::Msg;
use super::ownership::{check_audits, Effects, Held, Journal, Ownership, Timers};
use crate::protocol::interactive::{Age, Gate};
use crate::protocol::locks::Record;
use parking_lot::Mutex;
use qstore_core::txn::TableSchema;
use qstore_core::{NodeId, PartitionId, TxnId};
use qstore_storage::PartitionStore;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODES: u32 = 3;

/// Key `k`'s partitioner is node `k % 3`.
fn partitioner((_, key): Record) -> NodeId {
    NodeId((key % NODES as u64) as u32)
}

fn age(birth: u64, id: u64) -> Age {
    Age {
        birth_us: birth,
        id: TxnId(id),
    }
}

/// A message on its way: from, to, about, what.
type Sent = (NodeId, NodeId, TxnId, Msg);

/// A note as a node's log holds it: the record, its state, and its image if it moved.
type Noted = (Record, Vec<u8>, Option<Option<Vec<u8>>>);

/// A node's log of notes, in memory.
#[derive(Default)]
struct MemLog(Mutex<Vec<Noted>>);

struct MemJournal(Arc<MemLog>);

impl Journal for MemJournal {
    fn note(&self, r: Record, kept: &[u8], image: Option<Option<&[u8]>>) -> Option<u64> {
        let mut log = self.0 .0.lock();
        log.push((r, kept.to_vec(), image.map(|i| i.map(<[u8]>::to_vec))));
        Some(log.len() as u64 - 1)
    }

    fn written(&self) -> Option<u64> {
        (self.0 .0.lock().len() as u64).checked_sub(1)
    }
}

/// Three nodes and the messages between them, delivered one at a time in order.
struct Cluster {
    nodes: Vec<Ownership>,
    stores: Vec<PartitionStore>,
    queue: VecDeque<Sent>,
    /// Transactions woken, by node.
    woken: Vec<(NodeId, TxnId)>,
    /// Messages delivered so far, by kind name.
    delivered: Vec<&'static str>,
    /// Nodes that keep notes: their logs, how much of each is on disk, the messages that
    /// wait for it (with the record they wait for), and how many times each started.
    logs: Option<Vec<Arc<MemLog>>>,
    synced: Vec<usize>,
    pending: Vec<Vec<(u64, Sent)>>,
    starts: Vec<u64>,
}

fn kind(m: &Msg) -> &'static str {
    match m {
        Msg::OwnerRequest { .. } => "owner-request",
        Msg::TransferRequest { .. } => "transfer-request",
        Msg::Granted { .. } => "granted",
        Msg::Refused { .. } => "refused",
        Msg::Inform { .. } => "inform",
        Msg::Ended { .. } => "ended",
    }
}

const TIMERS: Timers = Timers {
    resend: Duration::from_millis(10),
    backup: Duration::from_secs(60),
};

/// Node `n`'s store as loaded at the first start: keys below 12 of its partition, each row
/// holding its key.
fn loaded_store(n: u32) -> PartitionStore {
    let schema = TableSchema {
        name: "t".into(),
        row_size: 8,
        capacity_per_partition: 16,
        keys_per_partition: 16,
        read_mostly: false,
    };
    let store = PartitionStore::with_room(PartitionId(n), std::slice::from_ref(&schema), 3);
    let keys = (0..12u64).filter(|k| k % NODES as u64 == n as u64);
    let fill = |k: u64, row: &mut [u8]| row.copy_from_slice(&k.to_le_bytes());
    store.table(0).load(keys, fill).unwrap();
    store
}

impl Cluster {
    fn new() -> Self {
        Cluster {
            nodes: (0..NODES)
                .map(|n| Ownership::new(NodeId(n), partitioner, TIMERS))
                .collect(),
            stores: (0..NODES).map(loaded_store).collect(),
            queue: VecDeque::new(),
            woken: Vec::new(),
            delivered: Vec::new(),
            logs: None,
            synced: vec![0; NODES as usize],
            pending: (0..NODES).map(|_| Vec::new()).collect(),
            starts: vec![0; NODES as usize],
        }
    }

    fn act(&mut self, at: NodeId, fx: Effects) {
        assert!(!fx.unlogged, "a note was refused");
        for (to, txn, m) in fx.send {
            match fx.after {
                Some(lsn) => self.pending[at.index()].push((lsn, (at, to, txn, m))),
                None => self.queue.push_back((at, to, txn, m)),
            }
        }
        self.woken.extend(fx.wake.into_iter().map(|t| (at, t)));
    }

    /// Delivers messages until none is left, dropping those `lose` picks (every log is
    /// synced before each delivery).
    fn run(&mut self, mut lose: impl FnMut(&Msg) -> bool) {
        loop {
            (0..NODES).for_each(|n| self.sync(n));
            let Some(m) = self.queue.pop_front() else {
                break;
            };
            if !lose(&m.3) {
                self.deliver(m);
            }
        }
    }

    /// Node `n`'s log is on disk: the messages that waited for it go.
    fn sync(&mut self, n: u32) {
        let Some(logs) = &self.logs else { return };
        let n = n as usize;
        self.synced[n] = logs[n].0.lock().len();
        let synced = self.synced[n] as u64;
        let (ready, wait) = std::mem::take(&mut self.pending[n])
            .into_iter()
            .partition(|(lsn, _)| *lsn < synced);
        self.pending[n] = wait;
        self.queue.extend(ready.into_iter().map(|(_, m)| m));
    }

    /// Delivers one message; what it sends joins the queue's end.
    fn deliver(&mut self, (from, to, txn, m): (NodeId, NodeId, TxnId, Msg)) {
        self.delivered.push(kind(&m));
        if std::env::var("LEAP_TRACE").is_ok() {
            eprintln!("{from}->{to} {txn:?} {m:?}");
        }
        let mut fx = Effects::default();
        let (node, store) = (&self.nodes[to.index()], &self.stores[to.index()]);
        node.on_message(store, from, txn, m, &mut fx);
        self.act(to, fx);
    }

    fn access(&mut self, at: u32, txn: u64, a: Age, key: u64, held: &mut Held) -> Gate {
        let mut fx = Effects::default();
        let gate = self.nodes[at as usize].access(TxnId(txn), a, (0, key), true, held, &mut fx);
        self.act(NodeId(at), fx);
        gate
    }

    fn release(&mut self, at: u32, txn: u64, held: &mut Held) {
        let mut fx = Effects::default();
        let store = &self.stores[at as usize];
        self.nodes[at as usize].release(store, TxnId(txn), held, &mut fx);
        self.act(NodeId(at), fx);
    }

    fn tick(&mut self, at: Instant) {
        for n in 0..NODES as usize {
            let mut fx = Effects::default();
            self.nodes[n].tick(at, &mut fx);
            self.act(NodeId(n as u32), fx);
        }
    }

    /// Runs a transaction at node `at` that writes `key`: asks, lets the transfer happen,
    /// asks again (as the woken transaction does), and ends.
    fn move_to(&mut self, at: u32, txn: u64, key: u64) {
        let mut held = Held::default();
        let a = age(txn, txn);
        if self.access(at, txn, a, key, &mut held) == Gate::Wait {
            self.run(|_| false);
            assert!(
                self.woken.contains(&(NodeId(at), TxnId(txn))),
                "{txn} not woken"
            );
            assert_eq!(self.access(at, txn, a, key, &mut held), Gate::Go);
        }
        self.release(at, txn, &mut held);
        self.run(|_| false);
    }

    /// The node whose store holds `key`'s row, checking it is exactly one and that the row's
    /// bytes came along.
    fn holder(&self, key: u64) -> u32 {
        let holders: Vec<u32> = (0..NODES)
            .filter(|&n| self.stores[n as usize].table(0).lookup(key).is_some())
            .collect();
        assert_eq!(holders.len(), 1, "key {key} held by {holders:?}");
        let t = self.stores[holders[0] as usize].table(0);
        // SAFETY: nothing else uses the store in this test.
        let bytes = unsafe { t.row(t.lookup(key).unwrap()) };
        assert_eq!(
            bytes,
            key.to_le_bytes(),
            "key {key}'s row changed on the way"
        );
        holders[0]
    }

    fn check(&self) -> Result<String, String> {
        let audits: Vec<_> = (0..NODES as usize)
            .map(|n| self.nodes[n].audit(&self.stores[n]))
            .collect();
        check_audits(&audits, partitioner)
    }

    /// Transfers received by node `n` in each case: RP-O, R-PO, R-P-O.
    fn received(&self, n: u32) -> [u64; 3] {
        let r = &self.nodes[n as usize].counters.received;
        r.each_ref()
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }
}

#[test]
fn r_po_the_partitioner_owns_the_record_and_ships_it() {
    let mut c = Cluster::new();
    // Key 3: partitioner and owner node 0; node 1 asks.
    c.move_to(1, 1, 3);
    assert_eq!(c.holder(3), 1);
    c.check().unwrap();
    assert_eq!(c.received(1), [0, 1, 0]);
    assert_eq!(
        c.delivered,
        ["owner-request", "transfer-request", "granted", "inform"]
    );
}

#[test]
fn rp_o_the_requester_is_the_partitioner() {
    let mut c = Cluster::new();
    c.move_to(2, 1, 3); // key 3 (partitioner 0) now at node 2
    c.delivered.clear();
    c.move_to(0, 2, 3); // its partitioner takes it back
    assert_eq!(c.holder(3), 0);
    c.check().unwrap();
    assert_eq!(c.received(0), [1, 0, 0]);
    // Owner request and inform stay inside node 0: only the transfer request to the owner
    // and the shipment cross the network.
    assert_eq!(
        c.delivered,
        ["owner-request", "transfer-request", "granted", "inform"]
    );
}

#[test]
fn r_p_o_three_nodes_each_play_one_role() {
    let mut c = Cluster::new();
    c.move_to(2, 1, 3); // key 3 (partitioner 0) now at node 2
    c.move_to(1, 2, 3); // node 1 asks: partitioner 0, owner 2
    assert_eq!(c.holder(3), 1);
    assert_eq!(c.received(1), [0, 0, 1]);
    let audit = c.check().unwrap();
    assert!(audit.contains("1 owner-table entries"), "{audit}");
}

#[test]
fn an_absent_key_moves_with_its_ownership() {
    let mut c = Cluster::new();
    c.move_to(1, 1, 30); // key 30: partitioner 0, no row anywhere
    c.check().unwrap();
    let audits = c.nodes[1].audit(&c.stores[1]);
    assert_eq!(audits.guests, vec![(0, 30)]);
}

#[test]
fn local_transactions_waiting_for_one_record_share_its_transfer() {
    let mut c = Cluster::new();
    let (mut young, mut old) = (Held::default(), Held::default());
    assert_eq!(c.access(1, 10, age(10, 10), 3, &mut young), Gate::Wait);
    // An older transaction waits behind the request in flight; a younger one dies.
    assert_eq!(c.access(1, 11, age(5, 11), 3, &mut old), Gate::Wait);
    let mut younger = Held::default();
    let gate = c.access(1, 12, age(20, 12), 3, &mut younger);
    assert!(matches!(gate, Gate::Abort(_)), "{gate:?}");
    let requests = c
        .queue
        .iter()
        .filter(|m| kind(&m.3) == "owner-request")
        .count();
    assert_eq!(requests, 1, "one request for both");
    c.run(|_| false);
    assert!(c.woken.contains(&(NodeId(1), TxnId(10))));
    assert!(c.woken.contains(&(NodeId(1), TxnId(11))));
    // The requester holds the data lock now; the older one waits for it, locally.
    assert_eq!(c.access(1, 10, age(10, 10), 3, &mut young), Gate::Go);
    assert_eq!(c.access(1, 11, age(5, 11), 3, &mut old), Gate::Wait);
    c.release(1, 10, &mut young);
    assert_eq!(c.access(1, 11, age(5, 11), 3, &mut old), Gate::Go);
    c.release(1, 11, &mut old);
    assert_eq!(c.received(1), [0, 1, 0], "one transfer");
    assert_eq!(c.holder(3), 1);
}

#[test]
fn concurrent_requests_for_one_record_queue_or_die_at_the_partitioner() {
    let mut c = Cluster::new();
    let (mut a, mut b) = (Held::default(), Held::default());
    // Node 1's request reaches partitioner 0 first; node 2's older one waits behind it.
    assert_eq!(c.access(1, 1, age(10, 1), 3, &mut a), Gate::Wait);
    assert_eq!(c.access(2, 2, age(5, 2), 3, &mut b), Gate::Wait);
    c.run(|_| false);
    assert_eq!(c.holder(3), 1, "the first request is served first");
    assert!(c.woken.contains(&(NodeId(1), TxnId(1))));
    // Node 1's transaction holds the record: node 2's transfer (older) waits for it.
    assert_eq!(c.access(1, 1, age(10, 1), 3, &mut a), Gate::Go);
    c.release(1, 1, &mut a);
    c.run(|_| false);
    assert_eq!(c.holder(3), 2);
    assert!(c.woken.contains(&(NodeId(2), TxnId(2))));
    assert_eq!(c.access(2, 2, age(5, 2), 3, &mut b), Gate::Go);
    c.release(2, 2, &mut b);
    // A younger request while one is in flight is refused, and its transaction aborts.
    let (mut x, mut y) = (Held::default(), Held::default());
    assert_eq!(c.access(0, 5, age(60, 5), 3, &mut x), Gate::Wait);
    assert_eq!(c.access(1, 6, age(70, 6), 3, &mut y), Gate::Wait);
    c.run(|_| false);
    assert_eq!(c.access(0, 5, age(60, 5), 3, &mut x), Gate::Go);
    let refused = c.access(1, 6, age(70, 6), 3, &mut y);
    assert!(matches!(refused, Gate::Abort(_)), "{refused:?}");
    c.release(0, 5, &mut x);
    c.release(1, 6, &mut y);
    c.run(|_| false);
    assert_eq!(c.holder(3), 0);
    c.check().unwrap();
}

#[test]
fn the_owner_refuses_a_younger_transfer_while_a_local_transaction_holds_the_record() {
    let mut c = Cluster::new();
    let (mut local, mut remote) = (Held::default(), Held::default());
    assert_eq!(c.access(0, 1, age(1, 1), 3, &mut local), Gate::Go);
    assert_eq!(c.access(1, 2, age(9, 2), 3, &mut remote), Gate::Wait);
    c.run(|_| false);
    let gate = c.access(1, 2, age(9, 2), 3, &mut remote);
    assert!(matches!(gate, Gate::Abort(_)), "{gate:?}");
    c.release(1, 2, &mut remote);
    c.release(0, 1, &mut local);
    c.run(|_| false);
    assert_eq!(c.holder(3), 0, "nothing moved");
    // The refusal told the partitioner, which is free for the next request.
    c.move_to(1, 3, 3);
    assert_eq!(c.holder(3), 1);
}

#[test]
fn a_refusal_stands_when_the_inform_that_reports_it_is_lost() {
    let mut c = Cluster::new();
    c.move_to(2, 1, 3); // key 3 (partitioner 0) now at node 2
    let (mut local, mut remote) = (Held::default(), Held::default());
    assert_eq!(c.access(2, 2, age(1, 2), 3, &mut local), Gate::Go);
    assert_eq!(c.access(1, 3, age(9, 3), 3, &mut remote), Gate::Wait);
    // The owner refuses the younger transfer; the requester's inform saying so is lost.
    let mut lost = false;
    c.run(|m| {
        let drop = !lost && matches!(m, Msg::Inform { owned: false, .. });
        lost |= drop;
        drop
    });
    assert!(lost);
    assert!(matches!(
        c.access(1, 3, age(9, 3), 3, &mut remote),
        Gate::Abort(_)
    ));
    c.release(1, 3, &mut remote);
    c.release(2, 2, &mut local);
    // The partitioner asks the owner again, which is free now, but the transfer was
    // refused: it must not ship the record to a requester that no longer waits for it.
    c.tick(Instant::now() + Duration::from_millis(50));
    c.run(|_| false);
    assert_eq!(c.holder(3), 2);
    c.check().unwrap();
}

#[test]
fn a_record_shipped_for_a_request_no_longer_wanted_is_taken_in() {
    let mut c = Cluster::new();
    let (mut first, mut late) = (Held::default(), Held::default());
    assert_eq!(c.access(2, 1, age(5, 1), 3, &mut first), Gate::Wait);
    assert_eq!(c.access(1, 2, age(10, 2), 3, &mut late), Gate::Wait);
    // A resent copy of node 1's request is still on its way...
    let copy = c.queue.back().cloned().unwrap();
    c.run(|_| false);
    // ...when the request is refused (younger than node 2's) and its transaction ends.
    let refused = c.access(1, 2, age(10, 2), 3, &mut late);
    assert!(matches!(refused, Gate::Abort(_)), "{refused:?}");
    c.release(1, 2, &mut late);
    assert_eq!(c.access(2, 1, age(5, 1), 3, &mut first), Gate::Go);
    c.release(2, 1, &mut first);
    // The copy starts a transfer to node 1, which must take the record in.
    c.queue.push_back(copy);
    c.run(|_| false);
    assert_eq!(c.holder(3), 1);
    c.check().unwrap();
}

#[test]
fn messages_that_fit_no_transfer_change_nothing() {
    let mut c = Cluster::new();
    let a = age(1, 1);
    let stray = [
        // To node 0 about key 4, whose partitioner is node 1.
        Msg::OwnerRequest {
            table: 0,
            key: 4,
            age: a,
        },
        // An inform for a transfer that was never started.
        Msg::Inform {
            table: 0,
            key: 3,
            n: 99,
            owned: true,
        },
        // A transfer request for a record node 0 does not hold (key 4 is node 1's).
        Msg::TransferRequest {
            table: 0,
            key: 4,
            to: NodeId(2),
            age: a,
            n: 7,
        },
        // A refusal of a request nobody made.
        Msg::Refused {
            table: 0,
            key: 3,
            n: None,
        },
    ];
    for m in stray {
        c.queue.push_back((NodeId(2), NodeId(0), TxnId(1), m));
    }
    c.run(|_| false);
    assert_eq!(c.delivered.len(), 4, "nothing answered: {:?}", c.delivered);
    assert!(c.woken.is_empty());
    assert_eq!(c.holder(3), 0);
    assert_eq!(c.holder(4), 1);
    c.check().unwrap();
    // The records still move when asked properly.
    c.move_to(2, 2, 3);
    assert_eq!(c.holder(3), 2);
}

/// Drops the first message of each kind in `kinds`, then delivers the rest and lets the
/// timers resend until the transfer completes.
fn lose_once(kinds: &[&'static str]) {
    let mut c = Cluster::new();
    c.move_to(2, 1, 3); // so that the next transfer has three nodes
    let mut held = Held::default();
    let a = age(7, 7);
    assert_eq!(c.access(1, 7, a, 3, &mut held), Gate::Wait);
    let mut to_lose: Vec<&str> = kinds.to_vec();
    let mut now = Instant::now();
    for _ in 0..20 {
        c.run(|m| {
            let k = kind(m);
            let lost = to_lose.contains(&k);
            to_lose.retain(|&x| x != k);
            lost
        });
        if c.woken.contains(&(NodeId(1), TxnId(7))) && c.check().is_ok() {
            break;
        }
        now += Duration::from_millis(20);
        c.tick(now);
    }
    assert!(to_lose.is_empty(), "never sent: {to_lose:?}");
    assert_eq!(c.access(1, 7, a, 3, &mut held), Gate::Go, "lost {kinds:?}");
    c.release(1, 7, &mut held);
    c.run(|_| false);
    assert_eq!(c.holder(3), 1, "lost {kinds:?}");
    c.check().unwrap();
}

#[test]
fn a_lost_shipment_is_sent_again_from_the_owners_backup() {
    lose_once(&["granted"]);
}

#[test]
fn lost_requests_and_informs_are_sent_again() {
    lose_once(&["owner-request"]);
    lose_once(&["transfer-request"]);
    lose_once(&["inform"]);
    lose_once(&["owner-request", "transfer-request", "granted", "inform"]);
}

#[test]
fn a_late_copy_of_a_shipment_does_not_bring_a_record_back() {
    let mut c = Cluster::new();
    c.move_to(1, 1, 3);
    let stale = c.nodes[0]
        .counters
        .shipped
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(stale, 1);
    c.move_to(2, 2, 3); // node 1 gave it to node 2
                        // A copy of the first shipment (to node 1) arrives late.
    let copy = Msg::Granted {
        table: 0,
        key: 3,
        n: 1,
        row: super::msg::Shipped::Absent {
            grave: qstore_storage::RowVersion::INITIAL.into(),
        },
    };
    c.queue.push_back((NodeId(0), NodeId(1), TxnId(1), copy));
    c.run(|_| false);
    assert_eq!(c.holder(3), 2);
    c.check().unwrap();
}

#[test]
fn lstore_and_hlstore_lose_nothing_when_transfer_messages_are_lost() {
    use super::{start_with, PartitionLock, Shared};
    use crate::protocol::testing::contended_ycsb_tuned;
    // Resends after 20 ms, so that a lost message stalls its transfer briefly.
    let fast = Timers {
        resend: Duration::from_millis(20),
        backup: Duration::from_secs(60),
    };
    let lstore = move |ctx| start_with::<Shared>(ctx, fast, "ls");
    let hlstore = move |ctx| start_with::<PartitionLock>(ctx, fast, "hl");
    let systems: [(&str, crate::protocol::testing::StartFn<'_>); 2] =
        [("lstore", &lstore), ("hlstore", &hlstore)];
    for (name, start) in systems {
        let lossy = |cfg: &mut qstore_core::RunConfig| {
            // The name gives every node's tables room for the records that move in.
            cfg.protocol.name = name.into();
            cfg.net.drop_fraction = 0.05;
            let y = &mut cfg.workload.ycsb;
            (y.records_per_partition, y.theta) = (1000, 0.6);
        };
        // Only ownership messages cross the network (a transaction runs at home), so every
        // message lost is a transfer step; without resends the run would stall.
        let report = contended_ycsb_tuned(start, 400, Duration::from_secs(30), &lossy)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(report.is_serializable(), "{name}: {report}");
    }
}

/// A transaction of the random test: where it runs, its age, the keys it wants in order
/// (holding the earlier ones), how far it got, and what it holds.
struct Walker {
    node: u32,
    txn: u64,
    age: Age,
    keys: [u64; 2],
    at: usize,
    held: Held,
}

impl Walker {
    /// Starts transaction `txn` at a random node on two random keys below `keys`, and adds it
    /// to `live` unless it ended at once.
    fn start(
        c: &mut Cluster,
        live: &mut Vec<Walker>,
        roll: &mut impl FnMut(u64) -> u64,
        txn: u64,
        keys: u64,
    ) {
        let mut w = Walker {
            node: roll(NODES as u64) as u32,
            txn,
            // Retries keep their age: some transactions are born earlier.
            age: age(txn.saturating_sub(roll(3) * 10), txn),
            keys: [roll(keys), roll(keys)],
            at: 0,
            held: Held::default(),
        };
        if !w.step(c) {
            live.push(w);
        }
    }

    /// Asks for its keys from where it stopped; true once it ended (committed or refused),
    /// released.
    fn step(&mut self, c: &mut Cluster) -> bool {
        while self.at < self.keys.len() {
            match c.access(
                self.node,
                self.txn,
                self.age,
                self.keys[self.at],
                &mut self.held,
            ) {
                Gate::Go => self.at += 1,
                Gate::Wait => return false,
                Gate::Abort(_) => break,
            }
        }
        c.release(self.node, self.txn, &mut self.held);
        true
    }
}

/// Random transactions on a few hot records, with messages lost, duplicated and delivered
/// out of order: every transaction ends (commits or is refused), and ownership stays whole.
#[test]
fn random_transfers_with_lost_and_duplicated_messages_all_end() {
    for seed in 0..300u64 {
        let mut roll = dice(seed);
        let mut c = Cluster::new();
        let mut live: Vec<Walker> = Vec::new();
        let mut now = Instant::now();
        for step in 0..600u64 {
            if step < 400 && live.len() < 6 {
                Walker::start(&mut c, &mut live, &mut roll, step + 1, 5);
            }
            // Deliver a few messages: some lost, some twice, some later.
            for _ in 0..roll(4) {
                let Some(m) = c.queue.pop_front() else { break };
                match roll(20) {
                    0 => {}                              // lost
                    1 => c.queue.push_back(m),           // later
                    2 => c.queue.extend([m.clone(), m]), // twice, later
                    _ => c.deliver(m),
                }
            }
            wake(&mut c, &mut live);
            now += Duration::from_millis(7);
            c.tick(now);
        }
        // Then a calm network: everything must end.
        for _ in 0..300 {
            if live.is_empty() && c.queue.is_empty() {
                break;
            }
            c.run(|_| false);
            wake(&mut c, &mut live);
            now += Duration::from_millis(50);
            c.tick(now);
        }
        let stuck: Vec<_> = live.iter().map(|w| (w.node, w.txn, w.keys, w.at)).collect();
        assert!(
            stuck.is_empty(),
            "seed {seed}: stuck (node, txn, keys, at): {stuck:?}"
        );
        c.check().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

/// A seeded die: `roll(n)` is below `n`.
fn dice(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |n| {
        x = qstore_core::rng::splitmix64(x);
        x % n
    }
}

/// Woken transactions go on.
fn wake(c: &mut Cluster, live: &mut Vec<Walker>) {
    let woken = std::mem::take(&mut c.woken);
    live.retain_mut(|w| !woken.contains(&(NodeId(w.node), TxnId(w.txn))) || !w.step(c));
}
