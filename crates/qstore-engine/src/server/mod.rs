//! The client endpoint of a node of a distributed cluster: accepts client connections, checks
//! that each proves the cluster secret, runs their calls with this node as home, and answers
//! (see [`proto`] for the protocol).
//!
//! A small fixed pool of I/O threads ([`io`]) serves every connection over non-blocking
//! sockets, so an idle or slow client costs a few hundred bytes, not threads. Nothing a client
//! sends can stop the node: a malformed or oversized frame closes that connection and is
//! logged; a wrong request gets an error answer; connections over `server.max_clients` are
//! refused with the reason; a handshake must finish by a deadline, and an idle connection is
//! closed after `server.client_idle_timeout_s`.

mod io;
pub mod proto;
mod wake;

use crate::cluster::Cluster;
use io::IoThread;
use parking_lot::Mutex;
use qstore_core::config::ServerConfig;
use qstore_core::NodeId;
use qstore_net::auth::ClusterSecret;
use qstore_net::{PeerEvent, PeerEventKind};
use qstore_storage::PartitionStore;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
pub use wake::WakeFlag;

/// Largest frame sent to a client: a history part after a long run is big, and the client
/// chose to trust this server.
pub const MAX_ANSWER_FRAME: usize = 1 << 30;

/// Engine transaction ids are (node + 1) << 37 | a per-node counter: unique in the cluster
/// for up to 2047 nodes and 2^37 transactions per node, within the 48 bits a row version
/// keeps of its writer.
const NODE_ID_SHIFT: u32 = 37;
// The top 7 bits of the per-node counter number the start (see `EngineCtx::generation`).
const _: () = assert!(crate::cluster::MAX_GENERATIONS == 1 << 7);

/// Hands out the engine transaction ids of the transactions a node's clients submit (every
/// client port of the node shares one): unique in the cluster, across restarts too.
pub struct TxnIds {
    me: NodeId,
    next: AtomicU64,
}

impl TxnIds {
    pub fn new(cluster: &Cluster, me: NodeId) -> Self {
        // Past the ids of earlier starts, which a recovered log holds.
        let first = cluster.ctx().generation() << (NODE_ID_SHIFT - 7);
        TxnIds {
            me,
            next: AtomicU64::new(first),
        }
    }

    pub fn next(&self) -> qstore_core::TxnId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        qstore_core::TxnId(((self.me.0 as u64 + 1) << NODE_ID_SHIFT) | n)
    }
}

/// Which peers of this node are unreachable, as the transport reports them, and whether one
/// came back as a new process that lost its data (after which this node takes nothing new).
///
/// With replication a lost peer stops nothing here: its replica group elects another leader,
/// and a cluster instance that lost a server is taken out of service by its group leaders
/// (see the replication module). A peer that restarted (without its copy) is refused by the
/// transport and stays out.
#[derive(Default)]
pub struct PeerHealth {
    replicated: bool,
    down: Mutex<BTreeMap<NodeId, String>>,
    /// Set once a peer restarted: the cluster's data is no longer whole.
    lost: Mutex<Option<String>>,
    /// Called once when `lost` is set (the client endpoint answers what is in flight).
    on_lost: Mutex<Vec<Arc<dyn Fn() + Send + Sync>>>,
}

impl PeerHealth {
    /// Follows the transport's peer events on a thread of its own, logging each change.
    pub fn watch(
        me: NodeId,
        events: crossbeam_channel::Receiver<PeerEvent>,
        replicated: bool,
    ) -> Arc<Self> {
        let health = Arc::new(PeerHealth {
            replicated,
            ..Default::default()
        });
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
        match e.kind {
            PeerEventKind::Down(why) if self.replicated => {
                tracing::error!(
                    "node {me}: peer node {} is down ({why}); its group elects another leader \
                     if it led, and its cluster instance stops at its next batch",
                    e.peer.0
                );
                self.down.lock().insert(e.peer, why);
            }
            PeerEventKind::Down(why) => {
                tracing::error!(
                    "node {me}: peer node {} is down ({why}); transactions that need it wait, \
                     new ones are refused until it is back",
                    e.peer.0
                );
                self.down.lock().insert(e.peer, why);
            }
            PeerEventKind::Stopped => {
                tracing::info!(
                    "node {me}: peer node {} stopped; new transactions are refused",
                    e.peer.0
                );
                self.down.lock().insert(e.peer, "it stopped".into());
            }
            PeerEventKind::Up => {
                if self.down.lock().remove(&e.peer).is_some() {
                    tracing::warn!("node {me}: peer node {} is back", e.peer.0);
                }
            }
            // The transport refuses it, and its reason says what follows (see `net::open`).
            PeerEventKind::Restarted(why) if self.replicated => {
                tracing::error!("node {me}: {why}")
            }
            PeerEventKind::Restarted(why) => self.lose(me, why),
        }
    }

    /// Records that the cluster lost data (a peer restarted): from now on every transaction
    /// is refused with `why`, and those in flight are answered so.
    fn lose(&self, me: NodeId, why: String) {
        {
            let mut lost = self.lost.lock();
            if lost.is_some() {
                return;
            }
            tracing::error!("node {me}: {why}; refusing every transaction from now on");
            *lost = Some(why);
        }
        for f in self.on_lost.lock().iter() {
            f();
        }
    }

    /// Calls `f` once the cluster has lost data (at once if it already has).
    fn when_lost(&self, f: Arc<dyn Fn() + Send + Sync>) {
        self.on_lost.lock().push(f.clone());
        if self.lost.lock().is_some() {
            f();
        }
    }

    /// Why the cluster lost data, if it did.
    fn lost(&self) -> Option<String> {
        self.lost.lock().clone()
    }

    /// Why the node cannot take new transactions now, if it cannot.
    pub fn refusal(&self) -> Option<String> {
        if let Some(why) = self.lost() {
            return Some(why);
        }
        if self.replicated {
            return None;
        }
        let down = self.down.lock();
        let (peer, why) = down.iter().next()?;
        Some(format!(
            "peer node {} is down ({why}): this node cannot run transactions until it is back",
            peer.0
        ))
    }
}

/// The endpoint's limits, from `[server]`.
#[derive(Clone, Debug)]
pub struct EndpointLimits {
    pub max_clients: usize,
    pub idle_timeout: Duration,
    pub handshake_timeout: Duration,
    pub io_threads: usize,
}

impl EndpointLimits {
    /// Limits from the configuration; an automatic `max_clients` is 4096, or fewer when the
    /// process may open fewer files (with room kept for peers, logs and listeners).
    pub fn from_config(cfg: &ServerConfig, nodes: u32) -> Self {
        let max_clients = match cfg.max_clients {
            0 => {
                let reserve = 64 + 4 * nodes as u64;
                open_file_limit().saturating_sub(reserve).clamp(1, 4096) as usize
            }
            n => n as usize,
        };
        EndpointLimits {
            max_clients,
            idle_timeout: Duration::from_secs_f64(cfg.client_idle_timeout_s),
            handshake_timeout: Duration::from_secs_f64(cfg.handshake_timeout_s),
            io_threads: cfg.io_threads(),
        }
    }
}

/// Raises this process's soft limit of open files to its hard limit (a server holds a socket
/// per client), and returns the limit in force.
fn open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the rlimit struct it is given, which lives on this
    // stack frame for the whole call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct it is given, which outlives the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    lim.rlim_cur
}

/// What the I/O threads share.
/// The workload's final-state check of one partition, encoded for the wire (the engine does
/// not know workloads: the server's binary supplies it). Called after a run, when no
/// transaction writes the partition.
pub type PartitionTally = Arc<dyn Fn(&PartitionStore) -> Option<Vec<u8>> + Send + Sync>;

pub(crate) struct Shared {
    cluster: Arc<Cluster>,
    tally: Option<PartitionTally>,
    me: NodeId,
    health: Arc<PeerHealth>,
    secret: ClusterSecret,
    limits: EndpointLimits,
    /// Engine transaction ids handed out here: node-unique, whatever ids clients use.
    ids: Arc<TxnIds>,
    /// Client connections open now, across I/O threads.
    open: AtomicUsize,
    stop: AtomicBool,
}

/// A running client endpoint.
pub struct ClientEndpoint {
    shared: Arc<Shared>,
    wakers: Vec<Arc<WakeFlag>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    addr: SocketAddr,
}

impl ClientEndpoint {
    /// Serves clients of node `me` on `listener` until [`ClientEndpoint::stop`]; each must
    /// prove it holds `secret`. New transactions are refused while `health` reports a peer
    /// down, and for good once a peer restarted.
    /// `tally`, if given, is how a collect request gets the workload's final-state tally of
    /// the node's partition.
    pub fn start(
        cluster: Arc<Cluster>,
        me: NodeId,
        listener: TcpListener,
        health: Arc<PeerHealth>,
        secret: ClusterSecret,
        limits: EndpointLimits,
        tally: Option<PartitionTally>,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let ids = Arc::new(TxnIds::new(&cluster, me));
        let shared = Arc::new(Shared {
            cluster,
            tally,
            me,
            health,
            secret,
            ids,
            open: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            limits,
        });
        let mut wakers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..shared.limits.io_threads.max(1) {
            let io = IoThread::new(shared.clone(), listener.try_clone()?)?;
            wakers.push(io.wake_flag());
            let name = format!("n{}-clients-{i}", me.0);
            threads.push(
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || io.run())?,
            );
        }
        let on_lost = wakers.clone();
        shared.health.when_lost(Arc::new(move || {
            on_lost.iter().for_each(|w| w.wake_now());
        }));
        Ok(ClientEndpoint {
            shared,
            wakers,
            threads: Mutex::new(threads),
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The ids this endpoint hands out, for another client port of the same node.
    pub fn txn_ids(&self) -> Arc<TxnIds> {
        self.shared.ids.clone()
    }

    /// Client connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::Acquire)
    }

    /// Stops accepting and closes every client connection.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake_now();
        }
        for h in std::mem::take(&mut *self.threads.lock()) {
            let _ = h.join();
        }
    }
}

impl Drop for ClientEndpoint {
    fn drop(&mut self) {
        self.stop();
    }
}
