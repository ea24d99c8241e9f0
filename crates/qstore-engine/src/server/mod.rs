//! The client endpoint of a node of a distributed cluster: accepts client connections, runs
//! their calls with this node as home, and answers (see [`proto`] for the protocol).
//!
//! Each connection has a reader thread (decodes requests, submits them) and a writer thread
//! (batches answers into frames). Nothing a client sends can stop the node: a malformed or
//! oversized frame closes that connection and is logged; a wrong request gets an error answer.

pub mod proto;

use crate::cluster::Cluster;
use crate::protocol::TxnRequest;
use crossbeam_channel::{select, unbounded, Receiver, Sender};
use parking_lot::Mutex;
use proto::{ClientRequest, ClientResponse, Collected, ServerStats, CLIENT_FORMAT_VERSION};
use qstore_core::txn::TxnResponse;
use qstore_core::{NodeId, TxnId};
use qstore_net::frame::{FrameDecoder, FrameEncoder, DEFAULT_FLUSH_BYTES, DEFAULT_MAX_FRAME};
use qstore_net::{PeerEvent, PeerEventKind};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::io::{self, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest client frame accepted: far above any real batch of calls, small enough that a
/// hostile length cannot make the node allocate much.
const MAX_CLIENT_FRAME: usize = DEFAULT_MAX_FRAME / 4;

/// Largest frame sent to a client: a history part after a long run is big, and the client
/// chose to trust this server.
pub const MAX_ANSWER_FRAME: usize = 1 << 30;

/// Engine transaction ids are (node + 1) << 37 | a per-node counter: unique in the cluster
/// for up to 2047 nodes and 2^37 transactions per node, within the 48 bits a row version
/// keeps of its writer.
const NODE_ID_SHIFT: u32 = 37;

/// How often the acceptor checks whether the endpoint is stopping.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// Which peers of this node are unreachable, as the transport reports them.
#[derive(Default)]
pub struct PeerHealth {
    down: Mutex<BTreeMap<NodeId, String>>,
}

impl PeerHealth {
    /// Follows the transport's peer events on a thread of its own, logging each change.
    pub fn watch(me: NodeId, events: Receiver<PeerEvent>) -> Arc<Self> {
        let health = Arc::new(PeerHealth::default());
        let h = health.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("n{}-peers", me.0))
            .spawn(move || {
                for e in events {
                    h.apply(me, e);
                }
            });
        if let Err(e) = spawned {
            tracing::error!("node {me}: cannot watch peer connections: {e}");
        }
        health
    }

    fn apply(&self, me: NodeId, e: PeerEvent) {
        let mut down = self.down.lock();
        match e.kind {
            PeerEventKind::Down(why) => {
                tracing::error!(
                    "node {me}: peer node {} is down ({why}); transactions that need it wait, \
                     new ones are refused until it is back",
                    e.peer.0
                );
                down.insert(e.peer, why);
            }
            PeerEventKind::Up => {
                if down.remove(&e.peer).is_some() {
                    tracing::warn!("node {me}: peer node {} is back", e.peer.0);
                }
            }
        }
    }

    /// Why the node cannot take new transactions now, if it cannot.
    fn refusal(&self) -> Option<String> {
        let down = self.down.lock();
        let (peer, why) = down.iter().next()?;
        Some(format!(
            "peer node {} is down ({why}): this node cannot run transactions until it is back",
            peer.0
        ))
    }
}

/// What the endpoint needs of the node.
struct Node {
    cluster: Arc<Cluster>,
    me: NodeId,
    health: Arc<PeerHealth>,
    /// Engine transaction ids handed out here: node-unique, whatever ids clients use.
    next_id: AtomicU64,
}

/// Open client connections by number, so stopping can close them; each removes itself when
/// it ends (holding a copy of its socket would keep it from ever closing).
type Registry = Arc<Mutex<FxHashMap<u64, TcpStream>>>;

/// A running client endpoint.
pub struct ClientEndpoint {
    stop: Arc<AtomicBool>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
    conns: Registry,
    addr: SocketAddr,
}

impl ClientEndpoint {
    /// Serves clients of node `me` on `listener` until [`ClientEndpoint::stop`]; new
    /// transactions are refused while `health` reports a peer down.
    pub fn start(
        cluster: Arc<Cluster>,
        me: NodeId,
        listener: TcpListener,
        health: Arc<PeerHealth>,
    ) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Registry::default();
        let node = Arc::new(Node {
            cluster,
            me,
            health,
            next_id: AtomicU64::new(0),
        });
        let (s, c) = (stop.clone(), conns.clone());
        let acceptor = std::thread::Builder::new()
            .name(format!("n{}-clients", me.0))
            .spawn(move || accept_loop(listener, node, s, c))?;
        Ok(ClientEndpoint {
            stop,
            acceptor: Mutex::new(Some(acceptor)),
            conns,
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes every client connection.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.acceptor.lock().take() {
            let _ = h.join();
        }
        for (_, c) in self.conns.lock().drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for ClientEndpoint {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, node: Arc<Node>, stop: Arc<AtomicBool>, conns: Registry) {
    let mut next = 0u64;
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                next += 1;
                if let Err(e) = open_connection(stream, peer, next, &node, &conns) {
                    tracing::warn!("node {}: client {peer}: {e}", node.me);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                tracing::warn!("node {}: accepting a client failed: {e}", node.me);
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

/// Starts the reader and writer threads of a new connection.
fn open_connection(
    stream: TcpStream,
    peer: SocketAddr,
    number: u64,
    node: &Arc<Node>,
    conns: &Registry,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    conns.lock().insert(number, stream.try_clone()?);
    let (answers_tx, answers_rx) = unbounded();
    let (control_tx, control_rx) = unbounded();
    let ids = Arc::new(Mutex::new(FxHashMap::default()));
    let writer_stream = stream.try_clone()?;
    let writer_ids = ids.clone();
    let me = node.me;
    std::thread::Builder::new()
        .name(format!("n{}-cw", me.0))
        .spawn(move || write_loop(writer_stream, answers_rx, control_rx, writer_ids))?;
    let conn = Connection {
        node: node.clone(),
        number,
        registry: conns.clone(),
        peer,
        answers: answers_tx,
        control: control_tx,
        ids,
        greeted: false,
    };
    std::thread::Builder::new()
        .name(format!("n{}-cr", me.0))
        .spawn(move || conn.read_loop(stream))?;
    Ok(())
}

/// The reading side of one client connection.
struct Connection {
    node: Arc<Node>,
    number: u64,
    registry: Registry,
    peer: SocketAddr,
    /// Where the engine answers this connection's transactions.
    answers: Sender<TxnResponse>,
    control: Sender<ClientResponse>,
    /// Engine transaction id -> the client's id, while in flight.
    ids: Arc<Mutex<FxHashMap<TxnId, u64>>>,
    greeted: bool,
}

impl Connection {
    /// Serves requests until the client leaves, errs or is refused; then closes the
    /// connection (the writer ends once this reader's channels are gone).
    fn read_loop(mut self, stream: TcpStream) {
        self.serve(&stream);
        self.registry.lock().remove(&self.number);
        let _ = stream.shutdown(Shutdown::Read);
    }

    fn serve(&mut self, stream: &TcpStream) {
        let mut reader = BufReader::with_capacity(64 << 10, stream);
        let mut decoder = FrameDecoder::new(MAX_CLIENT_FRAME);
        loop {
            match decoder.read_frame::<ClientRequest, _>(&mut reader) {
                Ok(Some(requests)) => {
                    for r in requests {
                        if !self.handle(r) {
                            return;
                        }
                    }
                }
                Ok(None) => return, // the client closed the connection
                Err(e) => {
                    tracing::warn!(
                        "node {}: closing client connection {}: {e}",
                        self.node.me,
                        self.peer
                    );
                    return;
                }
            }
        }
    }

    /// Handles one request; false closes the connection.
    fn handle(&mut self, r: ClientRequest) -> bool {
        let reply = |resp| self.control.send(resp).is_ok();
        match r {
            ClientRequest::Hello {
                cluster_id,
                format_version,
            } => match self.welcome(cluster_id, format_version) {
                Ok(w) => {
                    self.greeted = true;
                    reply(w)
                }
                Err(why) => {
                    tracing::warn!(
                        "node {}: refusing client {}: {why}",
                        self.node.me,
                        self.peer
                    );
                    reply(ClientResponse::Refused(why));
                    false
                }
            },
            _ if !self.greeted => {
                reply(ClientResponse::Refused(
                    "send Hello before any other request".into(),
                ));
                false
            }
            ClientRequest::Submit { id, call, birth_us } => {
                self.submit(id, call, birth_us);
                true
            }
            ClientRequest::Stats => reply(ClientResponse::Stats(self.stats())),
            ClientRequest::Collect => reply(ClientResponse::Collected(self.collect())),
        }
    }

    fn welcome(&self, cluster_id: u64, format_version: u32) -> Result<ClientResponse, String> {
        let ctx = self.node.cluster.ctx();
        if format_version != CLIENT_FORMAT_VERSION {
            return Err(format!(
                "client protocol version {format_version}, this server speaks {CLIENT_FORMAT_VERSION}"
            ));
        }
        if cluster_id != ctx.cfg.cluster.cluster_id {
            return Err(format!(
                "cluster id {cluster_id} != {}: the client uses another cluster file",
                ctx.cfg.cluster.cluster_id
            ));
        }
        Ok(ClientResponse::Welcome {
            node: self.node.me,
            nodes: ctx.nodes(),
            protocol: ctx.cfg.protocol.name.clone(),
            catalog: ctx.catalog.fingerprint(),
        })
    }

    fn submit(&self, client_id: u64, call: qstore_core::txn::ProcCall, birth_us: u64) {
        if let Some(why) = self.node.health.refusal() {
            let answer = ClientResponse::Answer {
                id: client_id,
                outcome: qstore_core::txn::TxnOutcome::Rejected(why),
            };
            let _ = self.control.send(answer);
            return;
        }
        let n = self.node.next_id.fetch_add(1, Ordering::Relaxed);
        let id = TxnId(((self.node.me.0 as u64 + 1) << NODE_ID_SHIFT) | n);
        self.ids.lock().insert(id, client_id);
        let req = TxnRequest {
            id,
            call: Arc::new(call),
            reply: self.answers.clone(),
            birth_us,
        };
        self.node.cluster.submit(self.node.me, req);
    }

    fn stats(&self) -> ServerStats {
        let me = self.node.me.index();
        let counters = self.node.cluster.net_counters();
        let (msgs_sent, bytes_sent) = counters
            .and_then(|c| c.snapshot().get(me).copied())
            .unwrap_or_default();
        let frames_sent = counters
            .and_then(|c| c.frames().get(me).copied())
            .unwrap_or_default();
        ServerStats {
            node: self.node.me,
            msgs_sent,
            bytes_sent,
            frames_sent,
        }
    }

    fn collect(&self) -> Collected {
        let ctx = self.node.cluster.ctx();
        Collected {
            node: self.node.me,
            partition_hash: ctx
                .store(qstore_core::PartitionId(self.node.me.0))
                .content_hash(),
            history: ctx
                .history
                .as_ref()
                .map(|h| postcard::to_stdvec(&h.export()).expect("histories serialize to memory")),
        }
    }
}

/// The writing side of one client connection: answers and control responses, as many per
/// frame as are ready.
fn write_loop(
    mut stream: TcpStream,
    answers: Receiver<TxnResponse>,
    control: Receiver<ClientResponse>,
    ids: Arc<Mutex<FxHashMap<TxnId, u64>>>,
) {
    let mut enc = FrameEncoder::new(DEFAULT_FLUSH_BYTES, MAX_ANSWER_FRAME);
    let to_client = |r: TxnResponse| {
        let id = ids.lock().remove(&r.id)?;
        Some(ClientResponse::Answer {
            id,
            outcome: r.outcome,
        })
    };
    loop {
        let first = select! {
            recv(answers) -> a => a.ok().and_then(to_client),
            recv(control) -> c => match c {
                Ok(c) => Some(c),
                Err(_) => return, // the reader is gone: the connection is closed
            },
        };
        let ready = first
            .into_iter()
            .chain(control.try_iter())
            .chain(answers.try_iter().filter_map(to_client));
        for msg in ready {
            if let Err(e) = enc.push(&msg) {
                tracing::error!("cannot send a client answer: {e}");
                continue; // never take the node down for it
            }
            if enc.should_flush() && enc.write_to(&mut stream).is_err() {
                return;
            }
        }
        if !enc.is_empty() && enc.write_to(&mut stream).is_err() {
            return;
        }
    }
}
