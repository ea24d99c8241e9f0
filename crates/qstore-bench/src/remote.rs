//! The servers of a distributed cluster as a load-generator [`Target`]: one TCP connection
//! per server, speaking the client protocol of `qstore_engine::server::proto`.
//!
//! Each connection has a writer thread (requests, many per frame) and a reader thread (answers
//! routed to the reply channel of their request). A connection that fails answers every
//! transaction in flight on it, and every later one, `Rejected` with the reason: clients see
//! errors, never a silent hang.
//!
//! With replication a transaction goes to the server this client believes leads its home
//! partition's group ([`Routes`]). A `NotLeader` answer teaches it the leader (or, naming
//! none, sends it to the next member of the group), and a lost connection answers what was in
//! flight on it `NotLeader` instead of `Rejected`: the load generator resubmits each with the
//! same key, and the group's new leader answers a transaction that did run with its outcome.

use crate::Target;
use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;
use qstore_core::txn::{TxnOutcome, TxnResponse};
use qstore_core::{NodeId, QError, RunConfig, TxnId};
use qstore_engine::server::proto::{
    client_handshake, ClientRequest, ClientResponse, Collected, ServerStats,
};
use qstore_engine::server::MAX_ANSWER_FRAME;
use qstore_engine::stages::StageSnapshot;
use qstore_engine::{ReplyTo, TxnRequest};
use qstore_log::LogStats;
use qstore_net::auth::ClusterSecret;
use qstore_net::frame::{FrameDecoder, FrameEncoder, DEFAULT_FLUSH_BYTES, DEFAULT_MAX_FRAME};
use rustc_hash::FxHashMap;
use std::io::BufReader;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a statistics request may take: a live server answers it at once.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a collect request may take: the server encodes its whole history.
const COLLECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections to every server of a distributed cluster.
pub struct RemoteCluster {
    /// By server id.
    conns: Vec<Conn>,
    routes: Arc<Routes>,
    /// The protocol the servers run (from their welcome).
    pub protocol: String,
    /// The latest start of the servers' data directories (see `Target::id_generation`).
    generation: u64,
    /// How to connect again (a replicated server that restarted and rejoined is collected
    /// on a new connection): client addresses by server, the cluster's id and secret.
    addrs: Vec<SocketAddr>,
    cluster_id: u64,
    secret: ClusterSecret,
}

/// One server's connection.
struct Conn {
    node: NodeId,
    requests: Sender<ClientRequest>,
    control: Mutex<Receiver<ClientResponse>>,
    state: Arc<Mutex<ConnState>>,
    stream: TcpStream,
    routes: Arc<Routes>,
    /// The server's counters when last asked (kept for a server that died since).
    last_stats: Mutex<Option<ServerStats>>,
}

/// Where this client sends each partition's transactions: the server it believes leads the
/// partition's replica group (servers are numbered instance after instance, as in
/// [`qstore_core::placement::Placement`]). Without replication, server p for partition p.
pub struct Routes {
    partitions: u32,
    replicas: u32,
    /// By partition: the server believed to lead its group.
    leaders: Vec<AtomicU32>,
}

impl Routes {
    pub fn new(partitions: u32, replicas: u32) -> Self {
        Routes {
            partitions,
            replicas,
            // Instance 0's members call the first elections.
            leaders: (0..partitions).map(AtomicU32::new).collect(),
        }
    }

    /// The server believed to lead partition `p`'s group.
    pub fn leader(&self, p: u32) -> NodeId {
        NodeId(self.leaders[p as usize].load(Ordering::Acquire))
    }

    /// What an answer `NotLeader { leader }` from `from` (or the loss of `from`, with `None`)
    /// teaches: the leader it names, or else the member of `from`'s group after `from`.
    pub fn learn(&self, from: NodeId, leader: Option<NodeId>) {
        let p = from.0 % self.partitions;
        let slot = &self.leaders[p as usize];
        match leader {
            Some(l) if l != from && l.0 % self.partitions == p && l.0 < self.servers() => {
                slot.store(l.0, Ordering::Release)
            }
            _ => {
                let next = (from.0 + self.partitions) % self.servers();
                // Only if no other answer moved it meanwhile.
                let _ = slot.compare_exchange(from.0, next, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    /// The server to send partition `p`'s transactions to: the believed leader, or, if
    /// `down` says its connection is lost, the next member of the group (in the order
    /// `learn` walks) whose connection is not, which is then believed to lead. `None` if
    /// every member is down. The walk reads the believed leader once: a concurrent stale
    /// answer naming a lost member cannot send it back there.
    pub fn live_member(&self, p: u32, down: impl Fn(NodeId) -> bool) -> Option<NodeId> {
        let first = self.leader(p);
        let live = (0..self.replicas)
            .map(|k| NodeId((first.0 + k * self.partitions) % self.servers()))
            .find(|&n| !down(n))?;
        if live != first {
            let slot = &self.leaders[p as usize];
            let _ = slot.compare_exchange(first.0, live.0, Ordering::AcqRel, Ordering::Acquire);
        }
        Some(live)
    }

    fn servers(&self) -> u32 {
        self.partitions * self.replicas
    }

    fn replicated(&self) -> bool {
        self.replicas > 1
    }
}

/// Transactions in flight on a connection, or why it is gone.
#[derive(Default)]
struct ConnState {
    pending: FxHashMap<u64, ReplyTo>,
    down: Option<String>,
}

impl RemoteCluster {
    /// Connects to every server of `cfg`'s cluster (retrying until `cluster.connect_timeout_s`
    /// while servers start) and checks each one runs the same cluster, protocol and catalog.
    pub fn connect(cfg: &RunConfig, catalog_fingerprint: u64) -> Result<Self, QError> {
        let addrs = cfg.socket_addresses()?;
        let timeout = Duration::from_secs_f64(cfg.cluster.connect_timeout_s);
        let secret = load_secret(cfg)?;
        let routes = Arc::new(Routes::new(cfg.cluster.nodes, cfg.replication.factor));
        let mut conns = Vec::new();
        let mut protocol = String::new();
        let mut generation = 0;
        let client_addrs: Vec<SocketAddr> = addrs.iter().map(|&(_, client)| client).collect();
        for (i, (_, client)) in addrs.into_iter().enumerate() {
            let node = NodeId(i as u32);
            let (stream, welcome) =
                handshake(node, client, cfg.cluster.cluster_id, &secret, timeout)?;
            let ClientResponse::Welcome {
                node: their_node,
                protocol: p,
                catalog,
                nodes,
                replicas,
                generation: g,
            } = welcome
            else {
                unreachable!("handshake returns a welcome")
            };
            let mismatch = |what: String| QError::Other(format!("node {node} at {client}: {what}"));
            let (want_nodes, want_replicas) = (cfg.cluster.nodes, cfg.replication.factor);
            if their_node != node || nodes != want_nodes || replicas != want_replicas {
                return Err(mismatch(format!(
                    "it is server {their_node} of {nodes} partitions x {replicas} copies, the \
                     cluster file says server {node} of {want_nodes} x {want_replicas}"
                )));
            }
            if catalog != catalog_fingerprint {
                return Err(mismatch(
                    "it runs another workload (catalog differs from this client's)".into(),
                ));
            }
            protocol = p;
            generation = generation.max(g);
            conns.push(Conn::start(node, stream, routes.clone())?);
        }
        Ok(RemoteCluster {
            conns,
            routes,
            protocol,
            generation,
            addrs: client_addrs,
            cluster_id: cfg.cluster.cluster_id,
            secret,
        })
    }

    /// Each server's counters: as last seen for a server that no longer answers (with
    /// replication a run goes on without it, and one lost before it first answered is left
    /// out; without, the run has failed already).
    pub fn stats(&self) -> Result<Vec<ServerStats>, QError> {
        let mut all = Vec::with_capacity(self.conns.len());
        for c in &self.conns {
            match c.ask(ClientRequest::Stats, STATS_TIMEOUT) {
                Ok(ClientResponse::Stats(s)) => {
                    *c.last_stats.lock() = Some(s.clone());
                    all.push(s);
                }
                Ok(other) => return Err(c.unexpected(other)),
                Err(e) => match c.last_stats.lock().clone() {
                    Some(s) => all.push(s),
                    // Lost before it first told its figures: with replication the run goes
                    // on without it (its loss is reported), and its figures are left out.
                    None if self.routes.replicated() => {}
                    None => return Err(e),
                },
            }
        }
        Ok(all)
    }

    /// Each server's partition hash and, if `history`, history part, after a run; with
    /// replication, `None` for a server that no longer answers (one whose connection was
    /// lost is asked again on a new one: it may have restarted and rejoined).
    pub fn collect(&self, history: bool) -> Result<Vec<Option<Collected>>, QError> {
        let ask = ClientRequest::Collect { history };
        self.conns
            .iter()
            .map(|c| match c.ask(ask.clone(), COLLECT_TIMEOUT) {
                Ok(ClientResponse::Collected(s)) => Ok(Some(s)),
                Ok(other) => Err(c.unexpected(other)),
                Err(_) if self.routes.replicated() => Ok(self.collect_again(c.node, ask.clone())),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// Collects server `node` on a new connection, if it answers.
    fn collect_again(&self, node: NodeId, ask: ClientRequest) -> Option<Collected> {
        let addr = *self.addrs.get(node.index())?;
        let timeout = Duration::from_secs(5);
        let (stream, _) = handshake(node, addr, self.cluster_id, &self.secret, timeout).ok()?;
        let conn = Conn::start(node, stream, self.routes.clone()).ok()?;
        let answer = conn.ask(ask, COLLECT_TIMEOUT);
        conn.state
            .lock()
            .down
            .get_or_insert_with(|| "closed by the client".into());
        let _ = conn.stream.shutdown(Shutdown::Both);
        match answer {
            Ok(ClientResponse::Collected(s)) => Some(s),
            _ => None,
        }
    }

    /// Connections that failed, with the reason.
    pub fn failures(&self) -> Vec<String> {
        self.conns
            .iter()
            .filter_map(|c| c.state.lock().down.clone())
            .collect()
    }

    /// Whether the cluster keeps copies of its partitions (a lost server is then survivable).
    pub fn replicated(&self) -> bool {
        self.routes.replicated()
    }
}

impl Drop for RemoteCluster {
    fn drop(&mut self) {
        for c in &self.conns {
            // Closed on purpose: the reader's end of stream is no failure.
            c.state
                .lock()
                .down
                .get_or_insert_with(|| "closed by the client".into());
            let _ = c.stream.shutdown(Shutdown::Both);
        }
    }
}

impl Target for RemoteCluster {
    fn id_generation(&self) -> u64 {
        self.generation
    }

    /// `home` names a partition; the transaction goes to the server believed to lead it.
    fn submit(&self, home: NodeId, req: TxnRequest) {
        if home.0 >= self.routes.partitions {
            let why = format!("no partition {home} in the cluster file");
            return reject(&req.reply, req.id, why);
        }
        if !self.routes.replicated() {
            return self.conns[home.index()].submit(req);
        }
        // Past members whose connection is lost, to the first live one.
        let down = |n: NodeId| self.conns[n.index()].state.lock().down.is_some();
        match self.routes.live_member(home.0, down) {
            Some(server) => self.conns[server.index()].submit(req),
            None => {
                let why = format!("every server holding partition {home} is unreachable");
                reject(&req.reply, req.id, why);
            }
        }
    }

    fn traffic(&self) -> Vec<(u64, u64)> {
        match self.stats() {
            Ok(s) => s.iter().map(|s| (s.msgs_sent, s.bytes_sent)).collect(),
            Err(e) => {
                tracing::warn!("cannot fetch server statistics: {e}");
                Vec::new()
            }
        }
    }

    /// What every server's logs did so far, summed (`None`: none keeps a data directory).
    fn log_stats(&self) -> Option<LogStats> {
        let stats = self
            .stats()
            .map_err(|e| tracing::warn!("cannot fetch server statistics: {e}"))
            .ok()?;
        stats
            .into_iter()
            .filter_map(|s| s.log)
            .reduce(LogStats::plus)
    }

    /// Every server's protocol counters, summed.
    fn protocol_counters(&self) -> qstore_engine::protocol::ProtocolCounters {
        let mut all = qstore_engine::protocol::ProtocolCounters::new();
        let stats = self
            .stats()
            .map_err(|e| tracing::warn!("cannot fetch server statistics: {e}"))
            .unwrap_or_default();
        for (name, n) in stats.into_iter().flat_map(|s| s.counters) {
            *all.entry(name).or_default() += n;
        }
        all
    }

    /// Every server's nodes' worker time.
    fn worker_time(&self) -> Vec<(NodeId, qstore_engine::stages::StageTotals)> {
        let stats = self
            .stats()
            .map_err(|e| tracing::warn!("cannot fetch server statistics: {e}"))
            .unwrap_or_default();
        stats.into_iter().flat_map(|s| s.worker_time).collect()
    }

    /// Every server's stage totals, merged: means and figures per transaction (percentiles
    /// stay with the servers' histograms).
    fn stages(&self) -> Option<StageSnapshot> {
        let stats = self
            .stats()
            .map_err(|e| tracing::warn!("cannot fetch server statistics: {e}"))
            .ok()?;
        let mut nodes = stats
            .into_iter()
            .filter_map(|s| s.stages.map(StageSnapshot::from_totals));
        let mut all = nodes.next()?;
        for s in nodes {
            all.merge(&s);
        }
        Some(all)
    }
}

/// The cluster's secret, from the file the cluster file names.
pub fn load_secret(cfg: &RunConfig) -> Result<ClusterSecret, QError> {
    let path = &cfg.cluster.secret_file;
    if path.is_empty() {
        return Err(qstore_core::ConfigError::new(
            "cluster.secret_file",
            "\"\"",
            "a distributed cluster needs a secret file that every server and client reads \
             (create one with `qstore secret FILE`)",
        )
        .into());
    }
    ClusterSecret::load(std::path::Path::new(path))
        .map_err(|e| qstore_core::ConfigError::new("cluster.secret_file", path, e).into())
}

fn reject(reply: &ReplyTo, id: TxnId, why: String) {
    let _ = reply.send(TxnResponse {
        id,
        outcome: TxnOutcome::Rejected(why),
    });
}

/// Connects (retrying while the server starts), completes the authenticated handshake and
/// returns the server's welcome.
fn handshake(
    node: NodeId,
    addr: SocketAddr,
    cluster_id: u64,
    secret: &ClusterSecret,
    timeout: Duration,
) -> Result<(TcpStream, ClientResponse), QError> {
    let deadline = Instant::now() + timeout;
    let mut stream = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(QError::Other(format!(
                    "cannot connect to node {node} at {addr}: {e}; is `qstore server` running \
                     for it?"
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    stream.set_nodelay(true)?;
    let welcome = client_handshake(&mut stream, cluster_id, secret, timeout)
        .map_err(|e| QError::Other(format!("node {node} at {addr}: {e}")))?;
    Ok((stream, welcome))
}

impl Conn {
    fn start(node: NodeId, stream: TcpStream, routes: Arc<Routes>) -> Result<Self, QError> {
        let (requests, requests_rx) = unbounded();
        let (control_tx, control) = unbounded();
        let state = Arc::new(Mutex::new(ConnState::default()));
        let (w, r) = (stream.try_clone()?, stream.try_clone()?);
        let (ws, rs) = (state.clone(), state.clone());
        let (wr, rr) = (routes.clone(), routes.clone());
        std::thread::Builder::new()
            .name(format!("remote-{}-w", node.0))
            .spawn(move || write_loop(node, w, requests_rx, ws, &wr))?;
        std::thread::Builder::new()
            .name(format!("remote-{}-r", node.0))
            .spawn(move || read_loop(node, r, control_tx, rs, &rr))?;
        Ok(Conn {
            node,
            requests,
            control: Mutex::new(control),
            state,
            stream,
            routes,
            last_stats: Mutex::new(None),
        })
    }

    fn submit(&self, req: TxnRequest) {
        let mut state = self.state.lock();
        if let Some(why) = &state.down {
            return reject(&req.reply, req.id, why.clone());
        }
        state.pending.insert(req.id.0, req.reply);
        drop(state);
        let call = (*req.call).clone();
        let _ = self.requests.send(ClientRequest::Submit {
            id: req.id.0,
            call,
            birth_us: req.birth_us,
            key: req.key,
        });
    }

    /// Sends a control request and waits up to `timeout` for its answer. A server that does
    /// not answer in time is taken for hung: its connection is marked failed, so later
    /// requests fail at once instead of each waiting out its timeout again.
    fn ask(&self, r: ClientRequest, timeout: Duration) -> Result<ClientResponse, QError> {
        let control = self.control.lock();
        if let Some(why) = self.state.lock().down.clone() {
            return Err(QError::Other(why));
        }
        let _ = self.requests.send(r);
        control.recv_timeout(timeout).map_err(|_| {
            let why = format!("no answer to a control request in {} s", timeout.as_secs());
            fail(self.node, &self.state, why, &self.routes);
            QError::Other(self.state.lock().down.clone().unwrap_or_default())
        })
    }

    fn unexpected(&self, r: ClientResponse) -> QError {
        QError::Other(format!("node {}: unexpected answer {r:?}", self.node))
    }
}

/// Marks the connection failed and answers everything in flight on it: `Unknown` (it was
/// sent, and may have committed), or with replication `NotLeader` (the client resubmits each to another member of the group, which
/// answers a transaction that did run with its outcome).
fn fail(node: NodeId, state: &Mutex<ConnState>, why: String, routes: &Routes) {
    let mut s = state.lock();
    if s.down.is_some() {
        return;
    }
    let why = format!("connection to node {} lost: {why}", node.0);
    if routes.replicated() {
        tracing::warn!("{why}; its transactions go to another member of its group");
        routes.learn(node, None);
    } else {
        tracing::error!("{why}");
    }
    for (id, reply) in s.pending.drain() {
        let outcome = if routes.replicated() {
            TxnOutcome::NotLeader { leader: None }
        } else {
            // Sent: it may have run.
            TxnOutcome::Unknown(why.clone())
        };
        let _ = reply.send(TxnResponse {
            id: TxnId(id),
            outcome,
        });
    }
    s.down = Some(why);
}

fn write_loop(
    node: NodeId,
    mut stream: TcpStream,
    requests: Receiver<ClientRequest>,
    state: Arc<Mutex<ConnState>>,
    routes: &Routes,
) {
    let mut enc = FrameEncoder::new(DEFAULT_FLUSH_BYTES, DEFAULT_MAX_FRAME);
    while let Ok(first) = requests.recv() {
        for r in std::iter::once(first).chain(requests.try_iter()) {
            let pushed = enc.push(&r).map(|_| ()).map_err(|e| e.to_string());
            let flushed = if enc.should_flush() {
                enc.write_to(&mut stream).map_err(|e| e.to_string())
            } else {
                Ok(())
            };
            if let Err(e) = pushed.and(flushed) {
                return fail(node, &state, e, routes);
            }
        }
        if let Err(e) = enc.write_to(&mut stream) {
            return fail(node, &state, e.to_string(), routes);
        }
    }
}

fn read_loop(
    node: NodeId,
    stream: TcpStream,
    control: Sender<ClientResponse>,
    state: Arc<Mutex<ConnState>>,
    routes: &Routes,
) {
    let lost = |why: String| fail(node, &state, why, routes);
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    let mut decoder = FrameDecoder::new(MAX_ANSWER_FRAME);
    loop {
        let frame = match decoder.read_frame::<ClientResponse, _>(&mut reader) {
            Ok(Some(f)) => f,
            Ok(None) => return lost("the server closed it".into()),
            Err(e) => return lost(e.to_string()),
        };
        for msg in frame {
            match msg {
                ClientResponse::Refused(why) => {
                    return lost(format!("the server refused it: {why}"))
                }
                ClientResponse::Answer { id, outcome } => {
                    if let TxnOutcome::NotLeader { leader } = &outcome {
                        routes.learn(node, *leader);
                    }
                    if let Some(reply) = state.lock().pending.remove(&id) {
                        let _ = reply.send(TxnResponse {
                            id: TxnId(id),
                            outcome,
                        });
                    }
                }
                other => {
                    let _ = control.send(other);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transaction_in_flight_on_a_lost_connection_has_an_unknown_outcome() {
        // Sent, then the server vanished: it may have committed (a durable cluster brings it
        // back), so it is not a failure.
        let (tx, rx) = crossbeam_channel::unbounded();
        let state = Mutex::new(ConnState {
            pending: FxHashMap::default(),
            down: None,
        });
        state.lock().pending.insert(7, ReplyTo::from(tx));
        fail(
            NodeId(0),
            &state,
            "reset by peer".into(),
            &Routes::new(3, 1),
        );
        let answer = rx.try_recv().expect("answered");
        assert!(
            matches!(&answer.outcome, TxnOutcome::Unknown(why) if why.contains("reset by peer")),
            "{:?}",
            answer.outcome
        );
    }

    #[test]
    fn routes_follow_named_leaders_and_move_past_silent_members() {
        // 3 partitions x 3 copies: partition 1's group is servers 1, 4 and 7.
        let r = Routes::new(3, 3);
        assert_eq!(r.leader(1), NodeId(1));
        r.learn(NodeId(1), Some(NodeId(7)));
        assert_eq!(r.leader(1), NodeId(7));
        // A stale answer from a member no longer believed to lead moves nothing...
        r.learn(NodeId(1), None);
        assert_eq!(r.leader(1), NodeId(7));
        // ...the believed leader's does: to the next member, wrapping around.
        r.learn(NodeId(7), None);
        assert_eq!(r.leader(1), NodeId(1));
        r.learn(NodeId(1), None);
        assert_eq!(r.leader(1), NodeId(4));
        // Naming a server of another group, or one the cluster does not have, names none.
        r.learn(NodeId(4), Some(NodeId(5)));
        assert_eq!(r.leader(1), NodeId(7));
        r.learn(NodeId(7), Some(NodeId(10)));
        assert_eq!(r.leader(1), NodeId(1));
        assert_eq!(r.leader(0), NodeId(0));
        assert!(r.replicated() && !Routes::new(3, 1).replicated());
    }

    /// A lost leader's group is reached through its next live member, even while answers
    /// from members that have not yet heard of the election keep naming the lost one.
    #[test]
    fn a_lost_leader_is_passed_over_whatever_stale_answers_say() {
        // Partition 0's group is servers 0, 3 and 6; server 0 was killed.
        let r = Routes::new(3, 3);
        let down = |n: NodeId| n == NodeId(0);
        for _ in 0..3 {
            // A member that still believes in server 0 names it...
            r.learn(NodeId(3), Some(NodeId(0)));
            assert_eq!(r.leader(0), NodeId(0));
            // ...and the next transaction goes to a live member all the same.
            assert_eq!(r.live_member(0, down), Some(NodeId(3)));
            assert_eq!(r.leader(0), NodeId(3));
        }
        // Past two lost members, wrapping around; none when all are lost.
        r.learn(NodeId(0), Some(NodeId(6)));
        let two_down = |n: NodeId| n != NodeId(3);
        assert_eq!(r.live_member(0, two_down), Some(NodeId(3)));
        assert_eq!(r.live_member(0, |_| true), None);
        assert_eq!(r.live_member(1, down), Some(NodeId(1)));
    }
}
