//! One I/O thread of the client endpoint: an event loop over non-blocking sockets that
//! accepts connections, runs each one's handshake, decodes requests, submits transactions and
//! writes answers, for as many connections as the endpoint allows.
//!
//! The engine answers on one channel per thread; the reply's wake-up ([`WakeFlag`]) rouses the
//! loop at most once per burst of answers. Answers for one connection that arrive together go
//! out in one frame.

use super::proto::{
    self, ClientRequest, ClientResponse, Collected, ServerStats, CLIENT_FORMAT_VERSION,
};
use super::{Shared, WakeFlag, MAX_ANSWER_FRAME};
use crate::protocol::{ReplyTo, TxnRequest};
use crossbeam_channel::{unbounded, Receiver};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use qstore_core::txn::{ProcCall, TxnKey, TxnOutcome, TxnResponse};
use qstore_core::{NodeId, TxnId};
use qstore_net::frame::{parse_frame, FrameEncoder, DEFAULT_FLUSH_BYTES, DEFAULT_MAX_FRAME};
use rustc_hash::FxHashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// Tokens from here on are connections (token - FIRST_CONN indexes the slot).
const FIRST_CONN: usize = 2;

/// Largest client frame accepted once a connection is authenticated: far above any real
/// batch of calls, small enough that a hostile length cannot make the node allocate much.
const MAX_CLIENT_FRAME: usize = DEFAULT_MAX_FRAME / 4;
/// Largest frame accepted before: a hello or a proof is tiny.
const MAX_HANDSHAKE_FRAME: usize = 4096;
/// Bytes read per system call.
const READ_CHUNK: usize = 64 << 10;
/// A client that does not read its answers is not read from while this much waits for it.
const OUT_HIGH_WATER: usize = 4 << 20;
/// Nor while it has this many transactions in flight.
const MAX_INFLIGHT_PER_CONN: usize = 1 << 16;
/// How often deadlines and idle connections are checked.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Buffers larger than this are given back once empty.
const KEEP_BUFFER: usize = 256 << 10;

/// Where a connection is in its life.
enum Phase {
    /// Waiting for the client's hello.
    Hello,
    /// Challenge sent; waiting for the client's proof over this transcript.
    Proof(Vec<u8>),
    /// Authenticated: requests are served.
    Ready,
}

struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    /// Unique per thread, so that an answer for a closed connection never reaches a new one
    /// in the same slot.
    number: u64,
    phase: Phase,
    /// Bytes received and not yet decoded (at most one partial frame).
    input: Vec<u8>,
    /// Encoded answers not yet written, from `written` on.
    output: Vec<u8>,
    written: usize,
    /// Responses to encode at the end of this loop turn.
    queued: Vec<ClientResponse>,
    inflight: usize,
    /// Last complete request or answer; idleness is measured from it.
    last_active: Instant,
    /// The handshake must be done by then.
    handshake_deadline: Instant,
    /// Refused: close once the output is written.
    closing: bool,
    /// Reading stopped until the client catches up with its answers.
    paused: bool,
}

impl Conn {
    fn must_pause(&self) -> bool {
        self.output.len() - self.written > OUT_HIGH_WATER || self.inflight >= MAX_INFLIGHT_PER_CONN
    }
}

/// A transaction in flight: its connection's slot and number, and the client's id for it.
struct InFlight {
    slot: usize,
    number: u64,
    client_id: u64,
}

pub(super) struct IoThread {
    poll: Poll,
    listener: TcpListener,
    shared: Arc<Shared>,
    wake: Arc<WakeFlag>,
    answers: Receiver<TxnResponse>,
    reply: ReplyTo,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    next_number: u64,
    inflight: FxHashMap<TxnId, InFlight>,
    /// Slots with responses queued this turn.
    dirty: Vec<usize>,
    enc: FrameEncoder,
    scratch: Vec<u8>,
    lost_seen: bool,
    /// Connections refused for the limit since the last log line about it.
    refused_for_limit: u64,
}

impl IoThread {
    pub(super) fn new(shared: Arc<Shared>, listener: std::net::TcpListener) -> io::Result<Self> {
        let poll = Poll::new()?;
        let mut listener = TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let wake = Arc::new(WakeFlag::new(Waker::new(poll.registry(), WAKER)?));
        let (tx, answers) = unbounded();
        let reply = ReplyTo::with_wake(tx, wake.clone());
        Ok(IoThread {
            poll,
            listener,
            shared,
            wake,
            answers,
            reply,
            conns: Vec::new(),
            free: Vec::new(),
            next_number: 0,
            inflight: FxHashMap::default(),
            dirty: Vec::new(),
            enc: FrameEncoder::new(DEFAULT_FLUSH_BYTES, MAX_ANSWER_FRAME),
            scratch: vec![0; READ_CHUNK],
            lost_seen: false,
            refused_for_limit: 0,
        })
    }

    pub(super) fn wake_flag(&self) -> Arc<WakeFlag> {
        self.wake.clone()
    }

    /// Serves until the endpoint stops; then closes every connection.
    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut next_sweep = Instant::now() + SWEEP_EVERY;
        while !self.shared.stop.load(Ordering::Acquire) {
            let timeout = next_sweep.saturating_duration_since(Instant::now());
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("node {}: client I/O poll failed: {e}", self.me());
                    std::thread::sleep(SWEEP_EVERY);
                }
                continue;
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {}
                    Token(t) => self.on_socket(t - FIRST_CONN, ev.is_readable()),
                }
            }
            self.take_answers();
            self.flush_dirty();
            if Instant::now() >= next_sweep {
                self.sweep();
                next_sweep = Instant::now() + SWEEP_EVERY;
            }
        }
        for slot in 0..self.conns.len() {
            self.close(slot);
        }
    }

    fn me(&self) -> qstore_core::NodeId {
        self.shared.me
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => self.admit(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // E.g. out of file descriptors: the connection waits in the backlog.
                    tracing::warn!("node {}: accepting a client failed: {e}", self.me());
                    return;
                }
            }
        }
    }

    /// Takes a new connection, or refuses it with the reason when the endpoint is full.
    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr) {
        let max = self.shared.limits.max_clients;
        if self.shared.open.fetch_add(1, Ordering::AcqRel) >= max {
            self.shared.open.fetch_sub(1, Ordering::AcqRel);
            self.refused_for_limit += 1;
            let why = format!(
                "this server already serves {max} client connections (server.max_clients); \
                 try again later or raise the limit"
            );
            // Best effort: a fresh socket's buffer takes a short frame without blocking.
            let refusal = [ClientResponse::Refused(why)];
            let _ = encode(&mut self.enc, &refusal, &mut stream_writer(&stream));
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let token = Token(slot + FIRST_CONN);
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self.poll.registry().register(&mut stream, token, interest) {
            tracing::warn!("node {}: cannot serve client {peer}: {e}", self.me());
            self.shared.open.fetch_sub(1, Ordering::AcqRel);
            self.free.push(slot);
            return;
        }
        let _ = stream.set_nodelay(true);
        self.next_number += 1;
        let now = Instant::now();
        self.conns[slot] = Some(Conn {
            stream,
            peer,
            number: self.next_number,
            phase: Phase::Hello,
            input: Vec::new(),
            output: Vec::new(),
            written: 0,
            queued: Vec::new(),
            inflight: 0,
            last_active: now,
            handshake_deadline: now + self.shared.limits.handshake_timeout,
            closing: false,
            paused: false,
        });
    }

    fn on_socket(&mut self, slot: usize, readable: bool) {
        if self.conns.get(slot).is_none_or(|c| c.is_none()) {
            return;
        }
        if readable {
            self.read(slot);
        }
        self.write(slot);
    }

    /// Reads and serves what the client sent, until the socket has nothing more or the
    /// connection must pause.
    fn read(&mut self, slot: usize) {
        loop {
            let Some(conn) = self.conns[slot].as_mut() else {
                return;
            };
            if conn.closing {
                return;
            }
            if conn.must_pause() {
                conn.paused = true;
                return;
            }
            conn.paused = false;
            match conn.stream.read(&mut self.scratch) {
                Ok(0) => return self.close(slot), // the client closed the connection
                Ok(n) => conn.input.extend_from_slice(&self.scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("node {}: client {}: {e}", self.shared.me, conn.peer);
                    return self.close(slot);
                }
            }
            self.decode(slot);
        }
    }

    /// Serves every complete frame received on `slot`.
    fn decode(&mut self, slot: usize) {
        let mut used = 0;
        loop {
            let Some(conn) = self.conns[slot].as_mut() else {
                return;
            };
            if conn.closing {
                break;
            }
            let max = match conn.phase {
                Phase::Ready => MAX_CLIENT_FRAME,
                _ => MAX_HANDSHAKE_FRAME,
            };
            let requests = match parse_frame::<ClientRequest>(&conn.input[used..], max) {
                Ok(Some((requests, n))) => {
                    used += n;
                    requests
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(
                        "node {}: closing client connection {}: {e}",
                        self.shared.me,
                        conn.peer
                    );
                    return self.close(slot);
                }
            };
            conn.last_active = Instant::now();
            for r in requests {
                if !self.handle(slot, r) {
                    break;
                }
            }
        }
        if let Some(conn) = self.conns[slot].as_mut() {
            conn.input.drain(..used);
        }
    }

    /// Handles one request; false when the connection takes no more.
    fn handle(&mut self, slot: usize, r: ClientRequest) -> bool {
        let Some(conn) = self.conns[slot].as_mut() else {
            return false;
        };
        match r {
            ClientRequest::Hello {
                cluster_id,
                format_version,
                nonce,
            } if matches!(conn.phase, Phase::Hello) => {
                self.challenge(slot, cluster_id, format_version, nonce)
            }
            ClientRequest::Prove { proof } if matches!(conn.phase, Phase::Proof(_)) => {
                let Phase::Proof(transcript) = std::mem::replace(&mut conn.phase, Phase::Ready)
                else {
                    unreachable!("matched above")
                };
                if !self
                    .shared
                    .secret
                    .verify(proto::CLIENT_ROLE, &transcript, &proof)
                {
                    return self.refuse(
                        slot,
                        "the client could not prove it holds the cluster secret; use the \
                         cluster file (and its secret_file) the servers were started with"
                            .into(),
                    );
                }
                let welcome = self.welcome();
                self.respond(slot, welcome);
                true
            }
            _ if matches!(conn.phase, Phase::Hello) => {
                self.refuse(slot, "send Hello before any other request".into())
            }
            _ if matches!(conn.phase, Phase::Proof(_)) => self.refuse(
                slot,
                "answer the challenge (Prove) before any request".into(),
            ),
            ClientRequest::Submit {
                id,
                call,
                birth_us,
                key,
            } => {
                self.submit(slot, id, call, birth_us, key);
                true
            }
            ClientRequest::Stats => {
                let stats = ClientResponse::Stats(self.stats());
                self.respond(slot, stats);
                true
            }
            ClientRequest::Collect { history } => {
                let collected = ClientResponse::Collected(self.collect(history));
                self.respond(slot, collected);
                true
            }
            ClientRequest::Hello { .. } | ClientRequest::Prove { .. } => {
                self.refuse(slot, "the handshake was already done".into())
            }
        }
    }

    /// Answers a hello: the server's proof and a challenge, or a refusal.
    fn challenge(
        &mut self,
        slot: usize,
        cluster_id: u64,
        format_version: u32,
        nonce: qstore_net::auth::Nonce,
    ) -> bool {
        let ours = self.shared.cluster.ctx().cfg.cluster.cluster_id;
        if format_version != CLIENT_FORMAT_VERSION {
            return self.refuse(
                slot,
                format!(
                    "client protocol version {format_version}, this server speaks \
                     {CLIENT_FORMAT_VERSION}"
                ),
            );
        }
        if cluster_id != ours {
            return self.refuse(
                slot,
                format!("cluster id {cluster_id} != {ours}: the client uses another cluster file"),
            );
        }
        let server_nonce = match qstore_net::auth::nonce() {
            Ok(n) => n,
            Err(e) => return self.refuse(slot, format!("the server has no random source: {e}")),
        };
        let transcript = proto::transcript(cluster_id, format_version, &nonce, &server_nonce);
        let proof = self.shared.secret.prove(proto::SERVER_ROLE, &transcript);
        if let Some(conn) = self.conns[slot].as_mut() {
            conn.phase = Phase::Proof(transcript);
        }
        self.respond(
            slot,
            ClientResponse::Challenge {
                nonce: server_nonce,
                proof,
            },
        );
        true
    }

    fn welcome(&self) -> ClientResponse {
        let ctx = self.shared.cluster.ctx();
        ClientResponse::Welcome {
            node: self.shared.me,
            nodes: ctx.nodes(),
            replicas: ctx.placement.replicas(),
            protocol: ctx.cfg.protocol.name.clone(),
            catalog: ctx.catalog.fingerprint(),
            generation: ctx.generation(),
        }
    }

    /// Answers `why` and closes the connection once the answer is out.
    fn refuse(&mut self, slot: usize, why: String) -> bool {
        if let Some(conn) = self.conns[slot].as_mut() {
            tracing::warn!(
                "node {}: refusing client {}: {why}",
                self.shared.me,
                conn.peer
            );
            conn.closing = true;
        }
        self.respond(slot, ClientResponse::Refused(why));
        false
    }

    fn respond(&mut self, slot: usize, r: ClientResponse) {
        if let Some(conn) = self.conns[slot].as_mut() {
            if conn.queued.is_empty() {
                self.dirty.push(slot);
            }
            conn.queued.push(r);
        }
    }

    fn submit(&mut self, slot: usize, client_id: u64, call: ProcCall, birth_us: u64, key: TxnKey) {
        if let Some(why) = self.shared.health.refusal() {
            let outcome = TxnOutcome::Rejected(why);
            return self.respond(
                slot,
                ClientResponse::Answer {
                    id: client_id,
                    outcome,
                },
            );
        }
        let Some(conn) = self.conns[slot].as_mut() else {
            return;
        };
        let id = self.shared.ids.next();
        conn.inflight += 1;
        let number = conn.number;
        self.inflight.insert(
            id,
            InFlight {
                slot,
                number,
                client_id,
            },
        );
        let req = TxnRequest {
            id,
            call: Arc::new(call),
            reply: self.reply.clone(),
            birth_us,
            // This thread serves other connections meanwhile.
            inline: false,
            key,
        };
        // The engine takes the home partition: with replication, a server that does not lead
        // its partition's group answers `NotLeader`, naming the leader when it knows it.
        let home = self
            .shared
            .cluster
            .ctx()
            .placement
            .partition_of(self.shared.me);
        self.shared.cluster.submit(NodeId(home.0), req);
    }

    /// Routes the engine's answers to their connections.
    fn take_answers(&mut self) {
        // Cleared before draining: see `WakeFlag::wake`.
        self.wake.clear();
        while let Ok(r) = self.answers.try_recv() {
            let Some(f) = self.inflight.remove(&r.id) else {
                continue; // answered already (the cluster lost data), or its client left
            };
            self.answer(f, r.outcome);
        }
        if !self.lost_seen {
            if let Some(why) = self.shared.health.lost() {
                self.lost_seen = true;
                self.answer_all_in_flight(&why);
            }
        }
    }

    /// Once a peer restarted, nothing in flight will be answered by the engine in a
    /// meaningful way: answer it now, so that no client waits forever.
    fn answer_all_in_flight(&mut self, why: &str) {
        for (_, f) in std::mem::take(&mut self.inflight) {
            self.answer(f, TxnOutcome::Rejected(why.to_string()));
        }
    }

    fn answer(&mut self, f: InFlight, outcome: TxnOutcome) {
        let Some(conn) = self.conns.get_mut(f.slot).and_then(|c| c.as_mut()) else {
            return;
        };
        if conn.number != f.number {
            return; // the client left; its slot serves another now
        }
        conn.inflight -= 1;
        conn.last_active = Instant::now();
        self.respond(
            f.slot,
            ClientResponse::Answer {
                id: f.client_id,
                outcome,
            },
        );
    }

    /// Encodes the responses queued this turn, one frame per connection where they fit, and
    /// writes them. Writing may resume reading a paused connection, which may queue more.
    fn flush_dirty(&mut self) {
        while !self.dirty.is_empty() {
            for slot in std::mem::take(&mut self.dirty) {
                let Some(conn) = self.conns[slot].as_mut() else {
                    continue;
                };
                if let Err(e) = encode(&mut self.enc, &conn.queued, &mut conn.output) {
                    tracing::error!("node {}: cannot answer a client: {e}", self.shared.me);
                }
                conn.queued.clear();
                self.write(slot);
            }
        }
    }

    /// Writes what the connection has to send, as far as the socket takes it; resumes reading
    /// a paused connection that caught up; closes a refused one once its answer is out.
    fn write(&mut self, slot: usize) {
        let Some(conn) = self.conns[slot].as_mut() else {
            return;
        };
        while conn.written < conn.output.len() {
            match conn.stream.write(&conn.output[conn.written..]) {
                Ok(0) => return self.close(slot),
                Ok(n) => conn.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!("node {}: client {}: {e}", self.shared.me, conn.peer);
                    return self.close(slot);
                }
            }
        }
        if conn.written == conn.output.len() {
            conn.output.clear();
            conn.written = 0;
            if conn.output.capacity() > KEEP_BUFFER {
                conn.output = Vec::new();
            }
            if conn.closing && conn.queued.is_empty() {
                return self.close(slot);
            }
        }
        if conn.paused && !conn.must_pause() {
            self.read(slot);
        }
    }

    /// Closes connections whose handshake is late or that have been idle too long, and gives
    /// back the buffers of quiet ones.
    fn sweep(&mut self) {
        let now = Instant::now();
        let idle = self.shared.limits.idle_timeout;
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_mut() else {
                continue;
            };
            let why = match conn.phase {
                Phase::Ready if conn.inflight == 0 && now - conn.last_active > idle => {
                    format!(
                        "idle for {:.0} s (server.client_idle_timeout_s)",
                        idle.as_secs_f64()
                    )
                }
                Phase::Hello | Phase::Proof(_) if now > conn.handshake_deadline => format!(
                    "no complete handshake within {:.1} s (server.handshake_timeout_s)",
                    self.shared.limits.handshake_timeout.as_secs_f64()
                ),
                // A refused client that does not read its refusal.
                _ if conn.closing && now - conn.last_active > SWEEP_EVERY * 10 => {
                    self.close(slot);
                    continue;
                }
                _ => {
                    if conn.input.is_empty() && conn.input.capacity() > 0 {
                        conn.input = Vec::new();
                    }
                    continue;
                }
            };
            tracing::info!(
                "node {}: closing client {}: {why}",
                self.shared.me,
                conn.peer
            );
            let refusal = [ClientResponse::Refused(why)];
            let _ = encode(&mut self.enc, &refusal, &mut stream_writer(&conn.stream));
            self.close(slot);
        }
        if self.refused_for_limit > 0 {
            tracing::warn!(
                "node {}: refused {} client connection(s): server.max_clients = {} reached",
                self.shared.me,
                std::mem::take(&mut self.refused_for_limit),
                self.shared.limits.max_clients
            );
        }
    }

    fn close(&mut self, slot: usize) {
        let Some(mut conn) = self.conns.get_mut(slot).and_then(|c| c.take()) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let _ = conn.stream.shutdown(Shutdown::Both);
        self.shared.open.fetch_sub(1, Ordering::AcqRel);
        self.free.push(slot);
    }

    fn stats(&self) -> ServerStats {
        let me = self.shared.me.index();
        let counters = self.shared.cluster.net_counters();
        let (msgs_sent, bytes_sent) = counters
            .and_then(|c| c.snapshot().get(me).copied())
            .unwrap_or_default();
        let frames_sent = counters
            .and_then(|c| c.frames().get(me).copied())
            .unwrap_or_default();
        ServerStats {
            node: self.shared.me,
            msgs_sent,
            bytes_sent,
            frames_sent,
            stages: self.shared.cluster.stages().map(|s| s.totals().clone()),
            log: self.shared.cluster.ctx().log_stats(),
            counters: self.shared.cluster.protocol_counters(),
            worker_time: self.shared.cluster.worker_time(),
        }
    }

    /// The partition hash and, if `history`, the history recorded since the server started.
    /// Collecting does not consume the history: every client may verify the run so far.
    fn collect(&self, history: bool) -> Collected {
        let ctx = self.shared.cluster.ctx();
        let store = ctx.server_store(self.shared.me);
        let placement = &ctx.placement;
        Collected {
            node: self.shared.me,
            in_service: !placement.is_stale(placement.instance_of(self.shared.me)),
            rebuilt: placement.is_rebuilt(placement.instance_of(self.shared.me)),
            failovers: placement.failovers(),
            partition_hash: store.content_hash(),
            tally: self.shared.tally.as_ref().and_then(|t| t(store)),
            audit: self.shared.cluster.audit(),
            history: ctx
                .history
                .as_ref()
                .filter(|_| history)
                .map(|h| postcard::to_stdvec(&h.export()).expect("histories serialize to memory")),
        }
    }
}

/// Encodes `msgs` into frames written to `out`. A message too large for any frame is logged
/// and dropped: never take the node down for one answer.
fn encode(enc: &mut FrameEncoder, msgs: &[ClientResponse], out: &mut impl Write) -> io::Result<()> {
    for m in msgs {
        if let Err(e) = enc.push(m) {
            tracing::error!("dropping a client answer: {e}");
            continue;
        }
        if enc.should_flush() {
            enc.write_to(out)?;
        }
    }
    enc.write_to(out)
}

/// A writer for one best-effort write to a socket outside the loop's buffering (a refusal
/// before closing): whatever the socket does not take at once is dropped.
fn stream_writer(stream: &TcpStream) -> impl Write + '_ {
    struct Once<'a>(&'a TcpStream);
    impl Write for Once<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            (&mut &*self.0).write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    Once(stream)
}
