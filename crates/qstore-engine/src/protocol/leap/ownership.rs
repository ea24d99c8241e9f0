//! One node's side of LEAP: the data lock of its records, and ownership transfer in its
//! three roles (the paper's section 3.3, 4.1 and appendix D).
//!
//! - As **requester**: a transaction that needs a record this node does not own puts a
//!   *request lock* on it (a [`Fetch`]) and asks the record's partitioner; later local
//!   transactions that need it wait behind that request if they are older (wait-die), so
//!   one transfer serves them all. When the record arrives, the request lock becomes the
//!   requesting transaction's data lock.
//! - As **partitioner** (the node the record's key maps to): its owner table names the
//!   owner of every record of its partition that moved (and nothing else: the owner of an
//!   unmoved record is its partitioner). Its *owner dispatcher* forwards one request per
//!   record at a time to the owner; requests that arrive meanwhile wait if older than the
//!   one in flight and are refused otherwise. The owner table changes only when the
//!   requester informs it that the transfer succeeded.
//! - As **owner**: a transfer takes the record's exclusive lock with the requester's age,
//!   like a local transaction (wait-die), then ships data and ownership together and keeps
//!   a backup copy for a while, in case the shipment is lost. Its answer to a transfer
//!   (shipped, or refused) is final: asked again, it answers the same.
//!
//! Lost and duplicated messages (section 3.3): the requester resends its request, and the
//! partitioner its transfer request, when no answer came in time; every transfer carries
//! its number, so each role recognises a copy of a step it already took and answers it
//! again (the owner from its backup) instead of taking it twice.
//!
//! **Durability** (with a data directory; the paper's section 3.4 and appendix D): every
//! change of what a node must remember about a record goes to its log as a *note* (see
//! [`Kept`]) before any message that follows from it is sent, so that a node restarted from
//! its log goes on where the others think it stands:
//! - the owner notes a shipment (the record leaves its store; it keeps the row as its
//!   backup) before the record goes, and a refusal before it is sent (its answer to a
//!   transfer is final, across restarts too);
//! - the requester notes the record it received (its row enters the store) before it
//!   informs the partitioner;
//! - the partitioner notes the transfer it starts before it asks the owner, and the owner
//!   table's change before it tells the old owner the transfer ended ([`Msg::Ended`]).
//!
//! The old owner keeps the backup of a shipped record until that message: a requester that
//! crashed before its note reached the disk gets the record again from the backup when the
//! partitioner, recovered or not, asks the owner again. Without a log, backups expire after
//! a while, as in the paper (messages may be lost, but no node restarts).
//!
//! This module does no I/O: each call returns the messages to send and the transactions to
//! wake in [`Effects`], which the caller acts on after every lock here is released. Notes
//! are appended (not synced) under the record's lock, so that the log has them in the order
//! of the record's changes; the messages of a call that wrote notes wait for them.

use super::msg::{Msg, Shipped};
use crate::protocol::interactive::{Age, Gate};
use crate::protocol::locks::{LockEntry, Policy, Record};
use parking_lot::Mutex;
use qstore_core::txn::CcAbortCause;
use qstore_core::{NodeId, TxnId};
use qstore_storage::{PartitionStore, RowVersion};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What a call asks its caller to do: send these messages (about these transactions), once
/// the log is on disk up to record `after` if it wrote notes, then resume these
/// transactions. `unlogged`: a note could not be written (the log failed), so nothing may
/// be sent.
#[derive(Default, Debug)]
pub(crate) struct Effects {
    pub send: Vec<(NodeId, TxnId, Msg)>,
    pub wake: Vec<TxnId>,
    pub after: Option<u64>,
    pub unlogged: bool,
}

impl Effects {
    /// The messages wait for the log to be on disk up to record `lsn` too.
    fn wait_for(&mut self, lsn: u64) {
        self.after = Some(self.after.map_or(lsn, |a| a.max(lsn)));
    }
}

/// Where a node with a data directory writes its notes: its log.
pub(crate) trait Journal: Send + Sync {
    /// Appends the note `kept` (encoded; empty: nothing to remember) about record `r`, with
    /// the record's new image here if it moved in (`Some(Some(row))`) or out
    /// (`Some(None)`). Where it is in the log, or `None` if the log failed.
    fn note(&self, r: Record, kept: &[u8], image: Option<Option<&[u8]>>) -> Option<u64>;
    /// Where the last record appended so far is in the log (`None`: none yet).
    fn written(&self) -> Option<u64>;
}

/// What a node's log keeps of a record's state there: what it must remember across a
/// restart. Not kept: data locks and requests (transactions die with the node, and other
/// nodes' requesters ask again), and refusals (asked again, the owner decides again).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Kept {
    came_by: Option<u64>,
    away: bool,
    last_n: u64,
    owner: Option<NodeId>,
    /// Partitioner: its transfer in flight.
    in_flight: Option<KeptTransfer>,
    /// Owner: its answer to the last transfer asked of it: the row it shipped (kept until
    /// the partitioner says the transfer ended), or a refusal (`None`). Noted before it is
    /// sent, so that a restarted owner answers the same.
    backup: Option<KeptBackup>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct KeptTransfer {
    from: NodeId,
    txn: TxnId,
    age: Age,
    n: u64,
    owner: NodeId,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct KeptBackup {
    n: u64,
    to: NodeId,
    txn: TxnId,
    row: Option<Shipped>,
}

/// The three shapes of a transfer (the paper's figure 4), by which roles share a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Case {
    /// RP-O: the requester is the partitioner.
    RequesterPartitions,
    /// R-PO: the partitioner is the owner.
    PartitionerOwns,
    /// R-P-O: three different nodes.
    ThreeNodes,
}

/// Timers of the transfer protocol.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timers {
    /// A request (or a transfer request) unanswered for this long is sent again.
    pub resend: Duration,
    /// An owner keeps the copy of a record it shipped this long.
    pub backup: Duration,
}

/// What a transaction holds here: the records whose data lock it holds or waits for, or
/// whose transfer it waits for.
#[derive(Default)]
pub(crate) struct Held {
    records: Vec<Record>,
}

/// Counters of the transfers this node took part in.
#[derive(Default)]
pub(crate) struct Counters {
    /// Records received as requester, by case: RP-O, R-PO, R-P-O.
    pub received: [AtomicU64; 3],
    /// Records shipped as owner, and their bytes of row data.
    pub shipped: AtomicU64,
    pub shipped_bytes: AtomicU64,
    /// Requests refused (by wait-die at the partitioner or the owner).
    pub refused: AtomicU64,
    /// Messages sent again after a timeout.
    pub resent: AtomicU64,
}

impl Counters {
    /// The counts by their names in run results (`leap_...`), added to `into`.
    pub fn add_to(&self, into: &mut crate::protocol::ProtocolCounters) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let named = [
            (
                "leap_received_rp_o",
                load(&self.received[Case::RequesterPartitions as usize]),
            ),
            (
                "leap_received_r_po",
                load(&self.received[Case::PartitionerOwns as usize]),
            ),
            (
                "leap_received_r_p_o",
                load(&self.received[Case::ThreeNodes as usize]),
            ),
            ("leap_shipped", load(&self.shipped)),
            ("leap_shipped_bytes", load(&self.shipped_bytes)),
            ("leap_refused", load(&self.refused)),
            ("leap_resent", load(&self.resent)),
        ];
        for (name, n) in named {
            *into.entry(name.to_string()).or_default() += n;
        }
    }
}

/// What this node knows and does about one record. Absent from the map (all defaults) for
/// a record of its own partition that never moved and that nobody is using.
#[derive(Default)]
struct RecordState {
    /// The data lock (section 4.1), for local transactions and for transfers out.
    lock: LockEntry,
    /// Requester: this node asked for the record and waits for it.
    fetch: Option<Fetch>,
    /// Here because transfer `n` brought it, and not given away since.
    came_by: Option<u64>,
    /// The latest transfer of the record this node took part in, as requester or owner:
    /// a copy of an earlier one's message arriving late is ignored.
    last_n: u64,
    /// A record of this node's partition that it shipped away.
    away: bool,
    /// Owner: a transfer out that waits for the data lock.
    ship: Option<Ship>,
    /// Owner: its last answer to a transfer request, to give again if it was lost.
    backup: Option<Backup>,
    /// Partitioner: the owner-table entry (`None`: the partitioner owns it).
    owner: Option<NodeId>,
    /// Partitioner: the owner dispatcher's transfer in flight and the requests waiting.
    dispatch: Dispatch,
}

impl RecordState {
    fn is_idle(&self) -> bool {
        self.lock.is_free()
            && self.fetch.is_none()
            && self.came_by.is_none()
            && self.last_n == 0
            && !self.away
            && self.ship.is_none()
            && self.backup.is_none()
            && self.owner.is_none()
            && self.dispatch.is_idle()
    }

    /// Whether a timer runs for the record here.
    fn is_timed(&self) -> bool {
        self.fetch.is_some() || self.backup.is_some() || self.dispatch.in_flight.is_some()
    }

    fn kept(&self) -> Kept {
        Kept {
            came_by: self.came_by,
            away: self.away,
            last_n: self.last_n,
            owner: self.owner,
            in_flight: self.dispatch.in_flight.as_ref().map(|f| KeptTransfer {
                from: f.req.from,
                txn: f.req.txn,
                age: f.req.age,
                n: f.n,
                owner: f.owner,
            }),
            backup: self.backup.as_ref().map(|b| KeptBackup {
                n: b.n,
                to: b.to,
                txn: b.txn,
                row: b.row.clone(),
            }),
        }
    }

    /// Takes back what a note kept (a transfer in flight as if last asked at `now`).
    fn restore(&mut self, k: Kept, now: Instant) {
        self.came_by = k.came_by;
        self.away = k.away;
        self.last_n = k.last_n;
        self.owner = k.owner;
        self.dispatch.in_flight = k.in_flight.map(|f| InFlight {
            req: Request {
                from: f.from,
                txn: f.txn,
                age: f.age,
            },
            n: f.n,
            owner: f.owner,
            sent: now,
        });
        self.backup = k.backup.map(|b| Backup {
            n: b.n,
            to: b.to,
            txn: b.txn,
            row: b.row.map(Shipped::restarted),
            at: now,
        });
    }
}

struct Fetch {
    txn: TxnId,
    age: Age,
    write: bool,
    /// The requesting transaction ended before the record came: nobody takes its lock.
    orphan: bool,
    /// Local transactions (older than `txn`) waiting for the same record.
    waiting: Vec<TxnId>,
    sent: Instant,
}

#[derive(Clone, Copy)]
struct Ship {
    to: NodeId,
    txn: TxnId,
    n: u64,
}

/// An owner's answer to transfer `n`: the record shipped (a backup copy), or refused.
struct Backup {
    n: u64,
    to: NodeId,
    txn: TxnId,
    row: Option<Shipped>,
    at: Instant,
}

impl Backup {
    fn answer(&self, (table, key): Record) -> Msg {
        let n = self.n;
        match &self.row {
            Some(row) => Msg::Granted {
                table,
                key,
                n,
                row: row.clone(),
            },
            None => Msg::Refused {
                table,
                key,
                n: Some(n),
            },
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Request {
    from: NodeId,
    txn: TxnId,
    age: Age,
}

struct InFlight {
    req: Request,
    n: u64,
    owner: NodeId,
    sent: Instant,
}

#[derive(Default)]
struct Dispatch {
    in_flight: Option<InFlight>,
    queue: Vec<Request>,
}

impl Dispatch {
    fn is_idle(&self) -> bool {
        self.in_flight.is_none() && self.queue.is_empty()
    }
}

#[derive(Default)]
struct Shard {
    records: FxHashMap<Record, RecordState>,
    /// Records with a timer running (a fetch, a transfer in flight, a backup).
    timed: FxHashSet<Record>,
}

const SHARDS: usize = 64;

/// One node's records as LEAP sees them.
pub(crate) struct Ownership {
    me: NodeId,
    /// The partitioner of a record: the node its key maps to.
    partitioner: Box<dyn Fn(Record) -> NodeId + Send + Sync>,
    shards: Box<[Mutex<Shard>]>,
    /// Transactions whose transfer was refused, refused again when they ask next.
    refused: Mutex<FxHashMap<TxnId, CcAbortCause>>,
    /// Partitioner: the number of the next transfer it starts.
    next_n: AtomicU64,
    timers: Timers,
    /// With a data directory: where its notes go.
    journal: OnceLock<Box<dyn Journal>>,
    pub counters: Counters,
}

impl Ownership {
    pub fn new(
        me: NodeId,
        partitioner: impl Fn(Record) -> NodeId + Send + Sync + 'static,
        timers: Timers,
    ) -> Self {
        Ownership {
            me,
            partitioner: Box::new(partitioner),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            refused: Mutex::default(),
            // Numbers start above 0 and differ between nodes' partitions only by record.
            next_n: AtomicU64::new(1),
            timers,
            journal: OnceLock::new(),
            counters: Counters::default(),
        }
    }

    /// From now on, every change of what the node must remember goes to `journal` first.
    pub fn keep_notes(&self, journal: Box<dyn Journal>) {
        let _ = self.journal.set(journal);
    }

    /// Writes the note of record `r`'s state `st` (and its new image here, if it moved), if
    /// the node keeps notes; the call's messages wait for it.
    fn note(&self, r: Record, st: &RecordState, image: Option<Option<&[u8]>>, fx: &mut Effects) {
        let Some(journal) = self.journal.get() else {
            return;
        };
        let kept = st.kept();
        let bytes = if kept == Kept::default() {
            Vec::new()
        } else {
            postcard::to_stdvec(&kept).expect("notes encode")
        };
        match journal.note(r, &bytes, image) {
            Some(lsn) => fx.wait_for(lsn),
            None => fx.unlogged = true,
        }
    }

    /// The call repeats a message: it waits for the notes written so far, as the first one
    /// did (the note of the state it repeats may not be on disk yet).
    fn repeat(&self, fx: &mut Effects) {
        if let Some(lsn) = self.journal.get().and_then(|j| j.written()) {
            fx.wait_for(lsn);
        }
    }

    /// After a restart, before anything runs: takes back the latest note of every record the
    /// log holds (`notes`); `starts`: how many times the node started before. The rows the
    /// notes name are back in the store already (recovery put back their images).
    pub fn restore<'a>(
        &self,
        notes: impl IntoIterator<Item = (Record, &'a [u8])>,
        starts: u64,
    ) -> Result<(), String> {
        // Transfer numbers grow across starts, above every one handed out before: the other
        // nodes take a smaller one for a late copy.
        self.next_n.store((starts << 40) + 1, Ordering::Relaxed);
        // A transfer in flight is asked again at the first tick: it may have stalled since
        // before the crash, and the other nodes' checks of the cluster wait for it.
        let now = Instant::now();
        let now = now.checked_sub(self.timers.resend).unwrap_or(now);
        for (r, bytes) in notes {
            let kept: Kept = postcard::from_bytes(bytes)
                .map_err(|e| format!("an unreadable ownership note about {r:?} ({e})"))?;
            let mut shard = self.shard(r).lock();
            let st = shard.records.entry(r).or_default();
            st.restore(kept, now);
            if st.is_timed() {
                shard.timed.insert(r);
            }
        }
        Ok(())
    }

    fn shard(&self, r: Record) -> &Mutex<Shard> {
        let h = (r.1 ^ ((r.0 as u64) << 56)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    /// Runs `f` on the state of record `r`, creating it if needed and forgetting it when it
    /// is idle again.
    fn with<T>(&self, r: Record, f: impl FnOnce(&mut RecordState) -> T) -> T {
        let mut shard = self.shard(r).lock();
        let st = shard.records.entry(r).or_default();
        let out = f(st);
        let (idle, timed) = (st.is_idle(), st.is_timed());
        if idle {
            shard.records.remove(&r);
        }
        if timed {
            shard.timed.insert(r);
        } else {
            shard.timed.remove(&r);
        }
        out
    }

    /// Whether this node owns `r` (holds its data, or knows it absent).
    fn owns(&self, r: Record, st: &RecordState) -> bool {
        if (self.partitioner)(r) == self.me {
            !st.away
        } else {
            st.came_by.is_some()
        }
    }

    /// A local transaction asks for record `r` (`write`: to change it). `Go` once this node
    /// owns the record and the transaction holds its data lock; `Wait` while the lock is
    /// taken by younger transactions or the record is on its way here.
    pub fn access(
        &self,
        txn: TxnId,
        age: Age,
        r: Record,
        write: bool,
        held: &mut Held,
        fx: &mut Effects,
    ) -> Gate {
        if let Some(cause) = self.refused.lock().remove(&txn) {
            return Gate::Abort(cause);
        }
        let partitioner = (self.partitioner)(r);
        self.with(r, |st| {
            if self.owns(r, st) {
                let (gate, newly) = st.lock.ask(Policy::WaitDie, txn, age, write);
                if newly {
                    held.records.push(r);
                }
                return gate;
            }
            match &mut st.fetch {
                Some(f) if f.txn == txn || f.waiting.contains(&txn) => Gate::Wait,
                // Wait-die against the transaction whose request is in flight.
                Some(f) if age < f.age => {
                    f.waiting.push(txn);
                    held.records.push(r);
                    Gate::Wait
                }
                Some(_) => Gate::Abort(CcAbortCause::WaitDie),
                None => {
                    st.fetch = Some(Fetch {
                        txn,
                        age,
                        write,
                        orphan: false,
                        waiting: Vec::new(),
                        sent: Instant::now(),
                    });
                    held.records.push(r);
                    let (table, key) = r;
                    let ask = Msg::OwnerRequest { table, key, age };
                    fx.send.push((partitioner, txn, ask));
                    Gate::Wait
                }
            }
        })
    }

    /// `txn` ended: it lets go of every data lock and request it held or waited for.
    /// Transfers out that waited for those locks ship now.
    pub fn release(&self, store: &PartitionStore, txn: TxnId, held: &mut Held, fx: &mut Effects) {
        self.refused.lock().remove(&txn);
        for r in held.records.drain(..) {
            self.with(r, |st| {
                if let Some(f) = &mut st.fetch {
                    f.waiting.retain(|&t| t != txn);
                    f.orphan |= f.txn == txn;
                }
                let mut woken = Vec::new();
                st.lock.release(txn, &mut woken);
                self.granted(store, r, st, woken, fx);
            });
        }
    }

    /// Hands the lock grants in `woken` out: a transfer out ships, local transactions wake.
    fn granted(
        &self,
        store: &PartitionStore,
        r: Record,
        st: &mut RecordState,
        woken: Vec<TxnId>,
        fx: &mut Effects,
    ) {
        for t in woken {
            match st.ship {
                Some(s) if s.txn == t => {
                    st.ship = None;
                    self.ship(store, r, st, s, fx);
                }
                _ => fx.wake.push(t),
            }
        }
    }

    /// A message from node `from` about transaction `txn`.
    pub fn on_message(
        &self,
        store: &PartitionStore,
        from: NodeId,
        txn: TxnId,
        msg: Msg,
        fx: &mut Effects,
    ) {
        match msg {
            Msg::OwnerRequest { table, key, age } => {
                let req = Request { from, txn, age };
                self.on_owner_request((table, key), req, fx)
            }
            Msg::TransferRequest {
                table,
                key,
                to,
                age,
                n,
            } => self.on_transfer_request(store, (table, key), to, txn, age, n, fx),
            Msg::Granted { table, key, n, row } => {
                self.on_granted(store, from, (table, key), txn, n, row, fx)
            }
            Msg::Refused { table, key, n } => self.on_refused((table, key), txn, n, fx),
            Msg::Inform {
                table,
                key,
                n,
                owned,
            } => self.on_inform((table, key), from, n, owned, fx),
            Msg::Ended { table, key, n } => self.on_ended((table, key), n, fx),
        }
    }

    /// Partitioner: a node asks for record `r`.
    fn on_owner_request(&self, r: Record, req: Request, fx: &mut Effects) {
        if (self.partitioner)(r) != self.me {
            tracing::warn!(
                "node {} asked node {} for a record of another partition",
                req.from,
                self.me
            );
            return;
        }
        self.with(r, |st| {
            let d = &mut st.dispatch;
            if let Some(f) = &mut d.in_flight {
                if f.req.from == req.from && f.req.txn == req.txn {
                    // Asked again: the transfer request (or its answer) may be lost.
                    self.counters.resent.fetch_add(1, Ordering::Relaxed);
                    fx.send.push((f.owner, f.req.txn, transfer_request(r, f)));
                    f.sent = Instant::now();
                    self.repeat(fx);
                } else if d.queue.contains(&req) {
                } else if req.age < f.req.age {
                    d.queue.push(req);
                } else {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    let (table, key) = r;
                    fx.send.push((
                        req.from,
                        req.txn,
                        Msg::Refused {
                            table,
                            key,
                            n: None,
                        },
                    ));
                }
                return;
            }
            self.dispatch_next(r, st, Some(req), fx);
        })
    }

    /// Partitioner: starts the transfer of `r` that `req` asked for, or else the youngest
    /// waiting request's (the paper's choice: the oldest may still wait behind it).
    fn dispatch_next(
        &self,
        r: Record,
        st: &mut RecordState,
        req: Option<Request>,
        fx: &mut Effects,
    ) {
        let owner = st.owner.unwrap_or(self.me);
        let d = &mut st.dispatch;
        let next = req.or_else(|| {
            let youngest = (0..d.queue.len()).max_by_key(|&i| d.queue[i].age)?;
            Some(d.queue.swap_remove(youngest))
        });
        let Some(req) = next else { return };
        if req.from == owner {
            // It owns the record already (an earlier transfer brought it): nothing to move.
            return self.dispatch_next(r, st, None, fx);
        }
        let f = InFlight {
            req,
            n: self.next_n.fetch_add(1, Ordering::Relaxed),
            owner,
            sent: Instant::now(),
        };
        fx.send.push((owner, req.txn, transfer_request(r, &f)));
        d.in_flight = Some(f);
        self.note(r, st, None, fx);
    }

    /// Owner: the partitioner asks it to ship `r` to `to` (transfer `n`, for `txn` of `age`).
    #[allow(clippy::too_many_arguments)]
    fn on_transfer_request(
        &self,
        store: &PartitionStore,
        r: Record,
        to: NodeId,
        txn: TxnId,
        age: Age,
        n: u64,
        fx: &mut Effects,
    ) {
        self.with(r, |st| {
            if let Some(b) = st.backup.as_ref().filter(|b| b.n == n) {
                // Answered already, but the answer may be lost: the same again.
                self.counters.resent.fetch_add(1, Ordering::Relaxed);
                fx.send.push((b.to, b.txn, b.answer(r)));
                self.repeat(fx);
                return;
            }
            if n <= st.last_n {
                return; // a late copy of a transfer already over
            }
            if !self.owns(r, st) {
                tracing::debug!("node {} does not own {r:?} for transfer {n}", self.me);
                return;
            }
            if st.ship.is_some_and(|s| s.n == n) {
                return; // already waiting for the lock
            }
            match st.lock.ask(Policy::WaitDie, txn, age, true).0 {
                Gate::Go => self.ship(store, r, st, Ship { to, txn, n }, fx),
                Gate::Wait => st.ship = Some(Ship { to, txn, n }),
                Gate::Abort(_) => {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    let refused = Backup {
                        n,
                        to,
                        txn,
                        row: None,
                        at: Instant::now(),
                    };
                    fx.send.push((to, txn, refused.answer(r)));
                    st.backup = Some(refused);
                    st.last_n = n;
                    self.note(r, st, None, fx);
                }
            }
        })
    }

    /// Owner: ships `r`, whose data lock the transfer holds, and gives up its ownership.
    fn ship(
        &self,
        store: &PartitionStore,
        r: Record,
        st: &mut RecordState,
        s: Ship,
        fx: &mut Effects,
    ) {
        let (table, key) = r;
        let t = store.table(table);
        // SAFETY: the transfer holds the record's exclusive data lock: no transaction here
        // reads or writes the row meanwhile, and after this none finds it here.
        let row = match unsafe { t.take_row(key) } {
            Some((bytes, version)) => Shipped::Row {
                bytes,
                version: version.into(),
            },
            None => Shipped::Absent {
                grave: t.take_grave(key).into(),
            },
        };
        if (self.partitioner)(r) == self.me {
            st.away = true;
        }
        st.came_by = None;
        st.last_n = s.n;
        self.counters.shipped.fetch_add(1, Ordering::Relaxed);
        let bytes = row.data_len() as u64;
        self.counters
            .shipped_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        let shipped = Backup {
            n: s.n,
            to: s.to,
            txn: s.txn,
            row: Some(row),
            at: Instant::now(),
        };
        fx.send.push((s.to, s.txn, shipped.answer(r)));
        st.backup = Some(shipped);
        self.note(r, st, Some(None), fx);
        // Local transactions queued behind the transfer find the record gone and ask for
        // it back.
        let mut woken = Vec::new();
        st.lock.release(s.txn, &mut woken);
        self.granted(store, r, st, woken, fx);
    }

    /// Requester: the record arrived (or a copy of a shipment it already took).
    #[allow(clippy::too_many_arguments)]
    fn on_granted(
        &self,
        store: &PartitionStore,
        from: NodeId,
        r: Record,
        txn: TxnId,
        n: u64,
        row: Shipped,
        fx: &mut Effects,
    ) {
        let partitioner = (self.partitioner)(r);
        let (table, key) = r;
        let inform = Msg::Inform {
            table,
            key,
            n,
            owned: true,
        };
        self.with(r, |st| {
            if self.owns(r, st) {
                if st.came_by == Some(n) {
                    // The partitioner's resend: our inform may be lost.
                    fx.send.push((partitioner, txn, inform));
                    self.repeat(fx);
                }
                return;
            }
            if n <= st.last_n {
                return; // a late copy of an earlier shipment
            }
            // A later transfer to this node is the partitioner's one in flight: the record
            // is this node's now, even if the request it answers is no longer wanted (a
            // resent request can reach the partitioner after its transaction gave up).
            if let Err(e) = adopt(store, r, &row) {
                // Tables have room for every record of the cluster, so this is a bug.
                tracing::error!("node {} cannot take record {r:?} in: {e}", self.me);
                return;
            }
            st.came_by = Some(n);
            st.last_n = n;
            st.away = false;
            let image = match &row {
                Shipped::Row { bytes, .. } => Some(bytes.as_slice()),
                Shipped::Absent { .. } => None,
            };
            self.note(r, st, Some(image), fx);
            let case = if partitioner == self.me {
                Case::RequesterPartitions
            } else if partitioner == from {
                Case::PartitionerOwns
            } else {
                Case::ThreeNodes
            };
            self.counters.received[case as usize].fetch_add(1, Ordering::Relaxed);
            if let Some(f) = st.fetch.take() {
                // The request lock becomes the requester's data lock.
                if !f.orphan {
                    st.lock.ask(Policy::WaitDie, f.txn, f.age, f.write);
                    fx.wake.push(f.txn);
                }
                fx.wake.extend(f.waiting);
            }
            fx.send.push((partitioner, txn, inform));
        })
    }

    /// Requester: the partitioner or the owner refused the transaction's request.
    fn on_refused(&self, r: Record, txn: TxnId, n: Option<u64>, fx: &mut Effects) {
        let (table, key) = r;
        if let Some(n) = n {
            // The partitioner waits to hear how its transfer ended.
            let inform = Msg::Inform {
                table,
                key,
                n,
                owned: false,
            };
            fx.send.push(((self.partitioner)(r), txn, inform));
        }
        self.with(r, |st| {
            let Some(f) = st.fetch.take_if(|f| f.txn == txn) else {
                return; // a late copy
            };
            if !f.orphan {
                self.refused.lock().insert(f.txn, CcAbortCause::WaitDie);
                fx.wake.push(f.txn);
            }
            // They ask again; the first becomes the requester.
            fx.wake.extend(f.waiting);
        })
    }

    /// Partitioner: transfer `n` of `r` ended at requester `from`.
    fn on_inform(&self, r: Record, from: NodeId, n: u64, owned: bool, fx: &mut Effects) {
        self.with(r, |st| {
            let Some(f) = st
                .dispatch
                .in_flight
                .take_if(|f| f.n == n && f.req.from == from)
            else {
                return; // a copy of an inform already taken
            };
            if owned {
                st.owner = (from != self.me).then_some(from);
                if self.journal.get().is_some() {
                    // The old owner's backup is no longer needed (once this is noted).
                    if f.owner == self.me {
                        st.backup.take_if(|b| b.n == n);
                    } else {
                        let (table, key) = r;
                        fx.send
                            .push((f.owner, f.req.txn, Msg::Ended { table, key, n }));
                    }
                }
            }
            self.note(r, st, None, fx);
            self.dispatch_next(r, st, None, fx);
        })
    }

    /// Old owner: transfer `n` of `r` ended, and the partitioner noted it: the backup goes.
    fn on_ended(&self, r: Record, n: u64, fx: &mut Effects) {
        self.with(r, |st| {
            if st.backup.take_if(|b| b.n == n).is_some() {
                self.note(r, st, None, fx);
            }
        })
    }

    /// Resends what went unanswered for too long; forgets backups past their time.
    pub fn tick(&self, now: Instant, fx: &mut Effects) {
        let Timers { resend, backup } = self.timers;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let Shard { records, timed } = &mut *shard;
            timed.retain(|r| {
                let Some(st) = records.get_mut(r) else {
                    return false;
                };
                let partitioner = (self.partitioner)(*r);
                let (table, key) = *r;
                let due = |sent: Instant| now.saturating_duration_since(sent) >= resend;
                if let Some(f) = st.fetch.as_mut().filter(|f| due(f.sent)) {
                    let ask = Msg::OwnerRequest {
                        table,
                        key,
                        age: f.age,
                    };
                    fx.send.push((partitioner, f.txn, ask));
                    f.sent = now;
                    self.counters.resent.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(f) = st.dispatch.in_flight.as_mut().filter(|f| due(f.sent)) {
                    fx.send.push((f.owner, f.req.txn, transfer_request(*r, f)));
                    f.sent = now;
                    self.counters.resent.fetch_add(1, Ordering::Relaxed);
                    self.repeat(fx);
                }
                // With a log, a shipped row stays until its transfer is known to have ended.
                let keeps = |b: &Backup| b.row.is_some() && self.journal.get().is_some();
                if st
                    .backup
                    .as_ref()
                    .is_some_and(|b| !keeps(b) && now.saturating_duration_since(b.at) >= backup)
                {
                    st.backup = None;
                }
                let timed = st.is_timed();
                if st.is_idle() {
                    records.remove(r);
                }
                timed
            });
        }
    }

    /// Whether no transfer this node takes part in as requester or partitioner is under way
    /// (every transfer has one of those two waiting until it ends).
    pub fn settled(&self) -> bool {
        self.shards.iter().all(|shard| {
            let shard = shard.lock();
            shard.timed.iter().all(|r| {
                shard
                    .records
                    .get(r)
                    .is_none_or(|st| st.fetch.is_none() && st.dispatch.in_flight.is_none())
            })
        })
    }

    /// What this node's records look like, for the ownership check after a run (call it
    /// only when nothing runs).
    pub fn audit(&self, store: &PartitionStore) -> NodeAudit {
        let mut a = NodeAudit {
            node: self.me,
            guests: Vec::new(),
            away: Vec::new(),
            owner_table: Vec::new(),
            in_flight: Vec::new(),
            rows: Vec::new(),
        };
        for shard in self.shards.iter() {
            let shard = shard.lock();
            for (&r, st) in &shard.records {
                let home = (self.partitioner)(r) == self.me;
                if !home && st.came_by.is_some() {
                    a.guests.push(r);
                }
                if home && st.away {
                    a.away.push(r);
                }
                if let Some(o) = st.owner {
                    a.owner_table.push((r, o));
                }
                if st.fetch.is_some() || !st.dispatch.is_idle() || st.ship.is_some() {
                    a.in_flight.push(r);
                }
            }
        }
        for (table, t) in store.tables().iter().enumerate() {
            t.for_each(|key, _| a.rows.push((table as u16, key)));
        }
        a
    }
}

impl Ownership {
    /// What this node knows of record `r`, for a test's failure message.
    #[cfg(test)]
    pub fn describe(&self, r: Record) -> String {
        let shard = self.shard(r).lock();
        let Some(st) = shard.records.get(&r) else {
            return "idle".into();
        };
        format!(
            "{:?}; fetch {:?}; ship {:?}; queue {}; lock free {}",
            st.kept(),
            st.fetch
                .as_ref()
                .map(|f| (f.txn, f.orphan, f.waiting.clone())),
            st.ship.map(|s| (s.to, s.txn, s.n)),
            st.dispatch.queue.len(),
            st.lock.is_free()
        )
    }
}

fn transfer_request(r: Record, f: &InFlight) -> Msg {
    let (table, key) = r;
    Msg::TransferRequest {
        table,
        key,
        to: f.req.from,
        age: f.req.age,
        n: f.n,
    }
}

/// Puts a shipped record into this node's store.
fn adopt(store: &PartitionStore, r: Record, row: &Shipped) -> Result<(), String> {
    let (table, key) = r;
    let t = store
        .tables()
        .get(table as usize)
        .ok_or_else(|| format!("no table {table}"))?;
    match row {
        Shipped::Row { bytes, version } => {
            match t.adopt_row(key, bytes, RowVersion::from(*version)) {
                Ok(true) => Ok(()),
                Ok(false) => Err("the key is already here".into()),
                Err(e) => Err(e.to_string()),
            }
        }
        Shipped::Absent { grave } => {
            t.bury(key, RowVersion::from(*grave));
            Ok(())
        }
    }
}

/// One node's records after a run (see [`Ownership::audit`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct NodeAudit {
    pub node: NodeId,
    /// Records of other partitions it owns.
    pub guests: Vec<Record>,
    /// Records of its partition it shipped away.
    pub away: Vec<Record>,
    pub owner_table: Vec<(Record, NodeId)>,
    /// Records with a transfer not finished.
    pub in_flight: Vec<Record>,
    /// Every row in its store.
    pub rows: Vec<Record>,
}

/// The ownership check after a run, over every node's [`NodeAudit`]: no transfer is left
/// unfinished, every record has exactly one owner, its partitioner's owner table names that
/// owner, and every row in a store is one its node owns.
pub(crate) fn check_audits(
    audits: &[NodeAudit],
    partitioner: impl Fn(Record) -> NodeId,
) -> Result<String, String> {
    let by_node: FxHashMap<NodeId, &NodeAudit> = audits.iter().map(|a| (a.node, a)).collect();
    let sets: FxHashMap<NodeId, (FxHashSet<Record>, FxHashSet<Record>)> = audits
        .iter()
        .map(|a| {
            let guests = a.guests.iter().copied().collect();
            let away = a.away.iter().copied().collect();
            (a.node, (guests, away))
        })
        .collect();
    let owns = |n: NodeId, r: Record| {
        let (guests, away) = &sets[&n];
        if partitioner(r) == n {
            !away.contains(&r)
        } else {
            guests.contains(&r)
        }
    };
    for a in audits {
        if let Some(r) = a.in_flight.first() {
            return Err(format!(
                "node {}: the transfer of record {r:?} never ended",
                a.node
            ));
        }
        if let Some(r) = a.rows.iter().find(|&&r| !owns(a.node, r)) {
            return Err(format!(
                "node {} holds a row of record {r:?}, which it does not own",
                a.node
            ));
        }
    }
    let moved: FxHashSet<Record> = audits
        .iter()
        .flat_map(|a| {
            a.guests
                .iter()
                .chain(&a.away)
                .chain(a.owner_table.iter().map(|(r, _)| r))
        })
        .copied()
        .collect();
    for &r in &moved {
        let p = partitioner(r);
        let owners: Vec<NodeId> = audits
            .iter()
            .map(|a| a.node)
            .filter(|&n| owns(n, r))
            .collect();
        let [owner] = owners[..] else {
            return Err(format!(
                "record {r:?} has {} owners: {owners:?}",
                owners.len()
            ));
        };
        let Some(pa) = by_node.get(&p) else {
            continue; // its partitioner is not among the nodes audited
        };
        let listed = pa
            .owner_table
            .iter()
            .find(|(x, _)| *x == r)
            .map_or(p, |&(_, o)| o);
        if listed != owner {
            return Err(format!(
                "record {r:?} is owned by node {owner} but its partitioner's owner table says node {listed}"
            ));
        }
    }
    let entries: usize = audits.iter().map(|a| a.owner_table.len()).sum();
    let guests: usize = audits.iter().map(|a| a.guests.len()).sum();
    Ok(format!(
        "every record has one owner; {guests} records away from their partition, \
         {entries} owner-table entries"
    ))
}
