//! The port's event loop: one thread serves many connections over non-blocking sockets (a port
//! runs `event_loops` of them; each serves the connections it accepted).
//!
//! Each turn of the loop reads what its connections sent, serves their requests
//! ([`Session::run_requests`]), and submits the transactions they need to the engine together
//! ([`Cluster::submit_all`](qstore_engine::Cluster::submit_all)): on an idle qstore node they
//! become one batch, planned and run on this thread. Answers come back on one channel whose
//! wake-up ([`WakeFlag`]) rouses the loop at most once per burst. A connection serves its
//! requests in order: while it waits for a transaction, its later requests wait in its input.

use crate::resp::Resp;
use crate::session::{refuse, Pending, Session, OUT_FLUSH};
use crate::Shared;
use crossbeam_channel::{unbounded, Receiver, Sender};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use qstore_core::txn::{TxnKey, TxnResponse};
use qstore_core::{NodeId, TxnId};
use qstore_engine::server::WakeFlag;
use qstore_engine::TxnRequest;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) const LISTENER: Token = Token(0);
pub(crate) const WAKER: Token = Token(1);
/// Tokens from here on are connections (token - FIRST_CONN indexes the slot).
const FIRST_CONN: usize = 2;
/// Unparsed request bytes a connection may hold: a value larger than any bucket, plus room.
const MAX_PENDING_INPUT: usize = 64 << 20;
/// A client that has not authenticated is let go after this long idle.
const UNAUTHENTICATED_IDLE: Duration = Duration::from_secs(10);
/// How often answer deadlines, idle connections and blocked writes are checked.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Bytes read per system call.
const READ_CHUNK: usize = 64 << 10;
/// How long a stopping port waits for the transactions its clients still wait for.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Turns of serving and submitting after one poll, while answers keep coming back at once
/// (transactions run on this thread): then the loop polls its sockets again.
const TURNS_PER_POLL: usize = 8;

/// A transaction a connection waits for: the attempt under way (none while a retry waits
/// for its back-off), and when it is given up.
struct Waiting {
    id: Option<TxnId>,
    pending: Pending,
    deadline: Instant,
}

struct Conn<'a> {
    stream: TcpStream,
    peer: String,
    session: Session<'a>,
    input: Vec<u8>,
    out: Vec<u8>,
    waiting: Option<Waiting>,
    last_active: Instant,
    /// Reading stopped at the input limit: the socket may hold more.
    unread: bool,
    /// The last round stopped to write its replies first: requests may remain.
    more: bool,
    /// The client closed its side: what it sent is served, then the connection closes.
    eof: bool,
    /// Closed once the replies are written.
    closing: bool,
    /// Since when replies wait with the socket full.
    blocked_since: Option<Instant>,
}

impl Conn<'_> {
    /// Reads what the socket holds, up to the input limit.
    fn fill(&mut self, chunk: &mut [u8]) -> io::Result<()> {
        self.unread = false;
        while !self.eof {
            if self.input.len() >= MAX_PENDING_INPUT {
                self.unread = true;
                return Ok(());
            }
            match self.stream.read(chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    self.input.extend_from_slice(&chunk[..n]);
                    self.last_active = Instant::now();
                    // A read that did not fill the chunk emptied the socket: with epoll's
                    // edge-triggered events, anything that arrives later raises a new
                    // event, so the read that would answer WouldBlock is one system call
                    // per request saved.
                    if n < chunk.len() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes what it can of the replies.
    fn flush(&mut self) -> io::Result<()> {
        let mut written = 0;
        while written < self.out.len() {
            match self.stream.write(&self.out[written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.drain(..written);
        if self.out.is_empty() {
            self.blocked_since = None;
            self.out.shrink_to(OUT_FLUSH);
        } else if written > 0 || self.blocked_since.is_none() {
            self.blocked_since = Some(Instant::now());
        }
        Ok(())
    }

    /// Serves buffered requests until one needs a transaction (returned), none is left, or
    /// replies must be written first.
    fn serve(&mut self, chunk: &mut [u8]) -> Option<Pending> {
        loop {
            let round = self.session.run_requests(&self.input, &mut self.out);
            self.input.drain(..round.used);
            self.more = round.more;
            let proto = self.session.proto();
            if let Some(why) = round.error {
                tracing::info!("redis client {}: closed: {why}", self.peer);
                Resp::err(why).encode(proto, &mut self.out);
                self.closing = true;
                return None;
            }
            if round.txn.is_some() {
                return round.txn;
            }
            if self.session.quit {
                self.closing = true;
                return None;
            }
            if self.input.len() >= MAX_PENDING_INPUT {
                let e = "ERR Protocol error: request too large";
                Resp::err(e).encode(proto, &mut self.out);
                self.closing = true;
                return None;
            }
            if self.more {
                if self.flush().is_err() {
                    self.closing = true;
                    return None;
                }
                if self.out.len() >= OUT_FLUSH {
                    return None;
                }
                continue;
            }
            if !self.unread {
                return None;
            }
            let had = self.input.len();
            if self.fill(chunk).is_err() || self.input.len() == had {
                return None;
            }
        }
    }

    /// Whether it is done: closing and written, or its client left and nothing it sent is
    /// still to be served.
    fn finished(&self) -> bool {
        let served = self.waiting.is_none() && !self.more && !self.unread;
        self.out.is_empty() && (self.closing || (self.eof && served))
    }
}

/// The event loop's state (on its own thread).
pub(crate) struct EventLoop<'a> {
    shared: &'a Shared,
    poll: Poll,
    listener: TcpListener,
    wake: Arc<WakeFlag>,
    answers: Receiver<TxnResponse>,
    reply_to: Sender<TxnResponse>,
    conns: Vec<Option<Conn<'a>>>,
    free: Vec<usize>,
    /// Connections with something to do once this turn's events are read.
    dirty: Vec<usize>,
    /// By transaction id (of the attempt under way): the connection waiting for it.
    owners: FxHashMap<TxnId, usize>,
    /// Retries waiting for their back-off: when, and which connection.
    retries: BinaryHeap<Reverse<(Instant, usize)>>,
    submit: Vec<TxnRequest>,
    chunk: Vec<u8>,
    /// The node transactions are submitted at.
    home: NodeId,
}

impl<'a> EventLoop<'a> {
    pub(crate) fn new(
        shared: &'a Shared,
        poll: Poll,
        listener: TcpListener,
        wake: Arc<WakeFlag>,
    ) -> Self {
        let (reply_to, answers) = unbounded();
        let b = &shared.backend;
        let home = NodeId(b.cluster.ctx().placement.partition_of(b.me).0);
        EventLoop {
            shared,
            poll,
            listener,
            wake,
            answers,
            reply_to,
            conns: Vec::new(),
            free: Vec::new(),
            dirty: Vec::new(),
            owners: FxHashMap::default(),
            retries: BinaryHeap::new(),
            submit: Vec::new(),
            chunk: vec![0; READ_CHUNK],
            home,
        }
    }

    /// Serves until the port stops, then gives waiting clients their answers (for a while)
    /// and closes every connection.
    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut next_sweep = Instant::now() + SWEEP_EVERY;
        let mut stop_by = None;
        loop {
            let now = Instant::now();
            if stop_by.is_none() && self.shared.stop.load(Ordering::Acquire) {
                stop_by = Some(now + STOP_GRACE);
                let _ = self.poll.registry().deregister(&mut self.listener);
            }
            if stop_by.is_some_and(|end| now >= end || self.owners.is_empty()) {
                break;
            }
            let next = self
                .retries
                .peek()
                .map_or(next_sweep, |r| r.0 .0.min(next_sweep));
            let timeout = next.saturating_duration_since(now);
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!("node {}: the Redis port stops: {e}", self.shared.backend.me);
                break;
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(t) => self.on_event(t - FIRST_CONN, ev.is_readable(), ev.is_writable()),
                }
            }
            self.turns(stop_by.is_none());
            if Instant::now() >= next_sweep {
                self.sweep(stop_by.is_none());
                next_sweep = Instant::now() + SWEEP_EVERY;
            }
        }
        for i in 0..self.conns.len() {
            if let Some(c) = &mut self.conns[i] {
                let _ = c.flush();
                self.close(i);
            }
        }
    }

    /// Serves what the events brought (new requests only if `serving`), and submits the
    /// transactions that needs, again while answers come back at once.
    fn turns(&mut self, serving: bool) {
        let wake = self.wake.clone();
        let mut suppressed = false;
        for _ in 0..TURNS_PER_POLL {
            wake.clear();
            suppressed = false;
            self.take_answers();
            self.due_retries();
            self.progress(serving);
            if self.submit.is_empty() {
                break;
            }
            let reqs = std::mem::take(&mut self.submit);
            // Answers given on this thread (an inline batch) need no wake-up: the next turn
            // drains them.
            wake.hold();
            suppressed = true;
            self.shared.backend.cluster.submit_all(self.home, reqs);
        }
        if suppressed && wake.clear() && !self.answers.is_empty() {
            wake.wake_now();
        }
    }

    fn accept(&mut self) {
        loop {
            let (mut stream, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. out of file descriptors: the connection waits in the backlog, and
                    // the sweep tries again.
                    let me = self.shared.backend.me;
                    return tracing::warn!("node {me}: accepting a Redis client failed: {e}");
                }
            };
            // Counted before it is checked: the port's other event loops admit at once.
            if self.shared.open.fetch_add(1, Ordering::AcqRel)
                >= self.shared.backend.limits.max_clients
            {
                self.shared.open.fetch_sub(1, Ordering::AcqRel);
                refuse(&mut stream, "ERR max number of clients reached");
                let _ = stream.shutdown(Shutdown::Both);
                continue;
            }
            let i = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            let interest = Interest::READABLE | Interest::WRITABLE;
            if let Err(e) =
                self.poll
                    .registry()
                    .register(&mut stream, Token(FIRST_CONN + i), interest)
            {
                tracing::warn!("redis client {peer}: {e}");
                self.shared.open.fetch_sub(1, Ordering::AcqRel);
                self.free.push(i);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let counters = &self.shared.counters;
            let number = counters.connections.fetch_add(1, Ordering::Relaxed) + 1;
            self.conns[i] = Some(Conn {
                stream,
                peer: peer.to_string(),
                session: Session::new(self.shared, number),
                input: Vec::new(),
                out: Vec::new(),
                waiting: None,
                last_active: Instant::now(),
                unread: false,
                more: false,
                eof: false,
                closing: false,
                blocked_since: None,
            });
            // A client may have written before the socket was registered.
            self.on_event(i, true, false);
        }
    }

    fn on_event(&mut self, i: usize, readable: bool, writable: bool) {
        let Some(Some(c)) = self.conns.get_mut(i) else {
            return;
        };
        if readable {
            if let Err(e) = c.fill(&mut self.chunk) {
                tracing::debug!("redis client {}: {e}", c.peer);
                return self.close(i);
            }
        }
        if writable && !c.out.is_empty() {
            if let Err(e) = c.flush() {
                tracing::info!("redis client {}: closed: writing replies: {e}", c.peer);
                return self.close(i);
            }
        }
        self.dirty.push(i);
    }

    /// Gives each connection the answer it waits for.
    fn take_answers(&mut self) {
        while let Ok(r) = self.answers.try_recv() {
            // An answer to an attempt given up on has no owner.
            let Some(i) = self.owners.remove(&r.id) else {
                continue;
            };
            let Some(Some(c)) = self.conns.get_mut(i) else {
                continue;
            };
            let Some(w) = c.waiting.take() else {
                continue;
            };
            if let Some(p) = c.session.answered(w.pending, r.outcome, &mut c.out) {
                let backoff = Duration::from_micros(10 << p.attempts.min(7));
                self.retries.push(Reverse((Instant::now() + backoff, i)));
                c.waiting = Some(Waiting {
                    id: None,
                    pending: p,
                    deadline: w.deadline,
                });
            }
            self.dirty.push(i);
        }
    }

    /// Submits the retries whose back-off has passed.
    fn due_retries(&mut self) {
        let now = Instant::now();
        while self.retries.peek().is_some_and(|r| r.0 .0 <= now) {
            let Reverse((_, i)) = self.retries.pop().expect("peeked");
            let Some(Some(c)) = self.conns.get_mut(i) else {
                continue;
            };
            if let Some(w) = c.waiting.as_mut().filter(|w| w.id.is_none()) {
                let id = self.shared.backend.ids.next();
                w.id = Some(id);
                self.owners.insert(id, i);
                self.submit
                    .push(request(id, &w.pending, &self.reply_to, &self.wake));
            }
        }
    }

    /// Serves the connections that had events or answers (only writes, if `serving` is
    /// false), writes their replies, and closes those that are done.
    fn progress(&mut self, serving: bool) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for &i in &dirty {
            let Some(Some(c)) = self.conns.get_mut(i) else {
                continue;
            };
            if serving && c.waiting.is_none() && !c.closing {
                if let Some(p) = c.serve(&mut self.chunk) {
                    let id = self.shared.backend.ids.next();
                    self.owners.insert(id, i);
                    self.submit
                        .push(request(id, &p, &self.reply_to, &self.wake));
                    let limit = self.shared.backend.limits.answer_timeout;
                    c.waiting = Some(Waiting {
                        id: Some(id),
                        pending: p,
                        deadline: Instant::now() + limit,
                    });
                }
            }
            // Replies before a transaction's wait for its answer, and go out with it: one
            // write for a MULTI's replies and its EXEC's, as Redis makes.
            let hold = c.waiting.is_some() && c.out.len() < OUT_FLUSH && !c.closing;
            if hold {
                continue;
            }
            if let Err(e) = c.flush() {
                tracing::info!("redis client {}: closed: writing replies: {e}", c.peer);
                self.close(i);
            } else if c.finished() {
                self.close(i);
            }
        }
        dirty.clear();
        self.dirty = dirty;
    }

    /// Gives up on answers past their deadline, and closes idle connections and those whose
    /// clients do not read their replies; accepts again while `serving`.
    fn sweep(&mut self, serving: bool) {
        if serving {
            // A connection left in the backlog when accepting failed (out of descriptors).
            self.accept();
        }
        let idle = self.shared.backend.limits.idle_timeout;
        let now = Instant::now();
        for i in 0..self.conns.len() {
            let Some(c) = &mut self.conns[i] else {
                continue;
            };
            if c.waiting.as_ref().is_some_and(|w| now >= w.deadline) {
                let w = c.waiting.take().expect("checked");
                if let Some(id) = w.id {
                    self.owners.remove(&id);
                }
                let limit = self.shared.backend.limits.answer_timeout;
                let why = Resp::err(format!(
                    "ERR no answer from the cluster within {limit:?}; the transaction may \
                     still commit"
                ));
                c.session.gave_up(w.pending, why, &mut c.out);
                self.dirty.push(i);
                continue;
            }
            let limit = match c.session.authed() {
                true => idle,
                false => idle.min(UNAUTHENTICATED_IDLE),
            };
            let quiet = c.waiting.is_none() && c.out.is_empty();
            if quiet && now.duration_since(c.last_active) > limit {
                tracing::info!("redis client {}: closed after {limit:?} idle", c.peer);
                self.close(i);
            } else if c
                .blocked_since
                .is_some_and(|t| now.duration_since(t) > idle)
            {
                tracing::info!(
                    "redis client {}: closed: it does not read its replies",
                    c.peer
                );
                self.close(i);
            }
        }
    }

    fn close(&mut self, i: usize) {
        let Some(mut c) = self.conns[i].take() else {
            return;
        };
        if let Some(id) = c.waiting.and_then(|w| w.id) {
            self.owners.remove(&id);
        }
        let _ = self.poll.registry().deregister(&mut c.stream);
        let _ = c.stream.shutdown(Shutdown::Both);
        self.shared.open.fetch_sub(1, Ordering::AcqRel);
        self.free.push(i);
    }
}

/// An attempt at `p` as a request to the engine, answered on `reply_to`.
fn request(
    id: TxnId,
    p: &Pending,
    reply_to: &Sender<TxnResponse>,
    wake: &Arc<WakeFlag>,
) -> TxnRequest {
    TxnRequest {
        id,
        call: p.call.clone(),
        reply: qstore_engine::ReplyTo::with_wake(reply_to.clone(), wake.clone()),
        birth_us: p.birth_us,
        // This thread plans and runs the batch itself when the node is idle.
        inline: true,
        key: TxnKey::default(),
    }
}
