//! The TCP transport: one process per node, frames of many messages over plain blocking
//! sockets and threads (per-peer blocking sockets measured as fast as an async runtime on
//! loopback, and keep the transport small).
//!
//! # Connections
//!
//! Each node dials every other node once and only sends on that connection; the peer's own
//! outgoing connection arrives through the listener and is only read. So a pair of nodes uses
//! exactly two unidirectional TCP connections, and each direction has one writer thread and
//! one reader thread, with no locking around sockets.
//!
//! A connection opens with a handshake (cluster id, node id, protocol name, format version,
//! and a challenge–response proving both ends hold the cluster secret, see
//! [`handshake`]). The acceptor refuses a peer whose settings differ or that cannot prove the
//! secret, with the reason logged on both sides, and the dialer checks that it reached the
//! node it meant to and that it, too, holds the secret. Unauthenticated connections are few
//! at a time ([`MAX_PENDING_HANDSHAKES`]) and the whole handshake has one deadline.
//!
//! Every process has an incarnation, chosen at random when it starts. A peer that comes back
//! with another incarnation restarted and lost its state: it is refused, the link to it stops,
//! and the transport reports [`PeerEventKind::Restarted`]; the restarted process learns why
//! from the refusal and [`TcpTransport::wait_connected`] fails at once.
//!
//! # Sending
//!
//! [`Transport::send`] never touches a socket: it puts the message on the peer's queue. The
//! peer's link thread encodes queued messages into one frame and writes it when it reaches
//! `flush_bytes` or the queue runs dry (after waiting at most `flush_after` once for more), so
//! a busy link sends large frames and a quiet one adds at most `flush_after` of latency (none
//! by default).
//! Messages are counted (with their postcard size, as the in-process transport counts them)
//! when they enter a frame, and frames when they are written. Injected delay holds each
//! message until `sent_at + delay + U[0, jitter)` on the sending side, never before an earlier
//! message of the same link. Messages to the node itself go straight to its inbox, without
//! injected delay: they cross no network (the in-process transport does delay them).
//!
//! # Failures
//!
//! A link thread that cannot connect, or whose connection breaks, retries with exponential
//! back-off and reports [`PeerEventKind::Down`] / [`PeerEventKind::Up`]. Messages sent while a
//! link is down wait in its queue, which is unbounded like node inboxes (load is bounded at
//! admission, see [`Transport`]); a frame whose write failed is dropped, because nobody knows
//! how much of it arrived: delivery is at most once, in order, and the Down event tells the
//! engine which in-flight work to fail. A peer that goes away is noticed by the next write, or
//! within 20 ms on an idle link (which checks that its connection is still open). A reader that receives a malformed frame logs the
//! reason and closes that connection; the node keeps running and the peer reconnects.

mod accept;
mod handshake;
mod link;
mod shared;

pub use accept::MAX_PENDING_HANDSHAKES;
pub use handshake::{accept_as, dial_as, Handshake};

use crate::frame::{DEFAULT_FLUSH_BYTES, DEFAULT_MAX_FRAME};
use crate::{encoded_len, Envelope, NetCounters, Transport};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use link::Queued;
use parking_lot::Mutex;
use qstore_core::config::NetConfig;
use qstore_core::NodeId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use shared::Shared;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long shutdown lets link threads write out what is still queued before it closes
/// their sockets.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// Settings of a node's TCP transport.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// This node.
    pub me: NodeId,
    /// The address of every node, indexed by node id (this node's own address included).
    pub peers: Vec<SocketAddr>,
    /// What peers must agree on before they exchange messages.
    pub handshake: Handshake,
    /// Injected delay, the same knob as in the in-process transport.
    pub net: NetConfig,
    /// Seed of the injected jitter.
    pub seed: u64,
    /// Largest frame payload sent or accepted, in bytes.
    pub max_frame: usize,
    /// Payload size at which a frame is written without waiting for more messages.
    pub flush_bytes: usize,
    /// How long a link waits (once per frame) for more messages when its queue runs dry;
    /// zero (the default) writes at once. Never delays a busy link, whose queue is not dry.
    /// Off by default: messages that arrive while a frame is being written already share the
    /// next frame, and on loopback a 50 µs wait more than doubled the round trip for little
    /// gain in messages per frame.
    pub flush_after: Duration,
    /// First and largest pause between connection attempts to a peer.
    pub connect_backoff_min: Duration,
    pub connect_backoff_max: Duration,
    /// Time allowed to connect, and then to complete a handshake (one deadline).
    pub handshake_timeout: Duration,
    /// This process's incarnation, sent in every handshake (random by default).
    pub incarnation: u64,
    /// What the operator is told to do about a peer that restarted and lost its state (the
    /// end of the refusal both sides log and report).
    pub restart_advice: String,
    /// Admit a peer that restarted (it rejoins its cluster, which rebuilds its state) rather
    /// than refuse it.
    pub admit_restarted: bool,
}

impl TcpConfig {
    /// Settings with default limits: 16 MiB frames flushed at 64 KiB or when the queue runs
    /// dry, back-off from 10 ms to 1 s, 2 s handshakes, no injected delay.
    pub fn new(me: NodeId, peers: Vec<SocketAddr>, handshake: Handshake) -> Self {
        TcpConfig {
            me,
            peers,
            handshake,
            net: NetConfig::default(),
            seed: 0,
            max_frame: DEFAULT_MAX_FRAME,
            flush_bytes: DEFAULT_FLUSH_BYTES,
            flush_after: Duration::ZERO,
            connect_backoff_min: Duration::from_millis(10),
            connect_backoff_max: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(2),
            incarnation: crate::auth::random_u64().unwrap_or_else(|_| fallback_incarnation()),
            restart_advice: "restart the cluster".into(),
            admit_restarted: false,
        }
    }

    /// Refuses settings the transport cannot run with, naming the setting.
    fn validate(&self) -> io::Result<()> {
        let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        let n = self.peers.len();
        if self.me.index() >= n {
            return invalid(format!(
                "node {} is not among the {n} peer addresses",
                self.me.0
            ));
        }
        if self.max_frame < 64 || self.max_frame > u32::MAX as usize {
            return invalid(format!(
                "max_frame {} must be in 64..=2^32-1 bytes",
                self.max_frame
            ));
        }
        if self.flush_bytes == 0 {
            return invalid("flush_bytes must be at least 1".into());
        }
        if self.connect_backoff_min.is_zero() || self.connect_backoff_min > self.connect_backoff_max
        {
            return invalid(format!(
                "connect back-off {:?}..{:?} must be positive and ordered",
                self.connect_backoff_min, self.connect_backoff_max
            ));
        }
        if self.handshake_timeout.is_zero() {
            return invalid("handshake_timeout must be positive".into());
        }
        self.handshake.validate()
    }
}

/// An incarnation when the system has no random source: the start time and process id,
/// which differ between two starts of a node as well.
fn fallback_incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 40)
}

/// A change in the state of the link to a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerEvent {
    pub peer: NodeId,
    pub kind: PeerEventKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerEventKind {
    /// The outgoing connection to the peer is (again) established.
    Up,
    /// The outgoing connection was lost, with the reason; messages in flight may be lost.
    Down(String),
    /// The peer shut down on purpose (it said goodbye before closing); like `Down` otherwise.
    Stopped,
    /// The peer came back as a new process (another incarnation): it lost its state, and this
    /// node no longer talks to it. The reason is meant for clients and operators.
    Restarted(String),
}

/// A node's end of a TCP cluster. Dropping it shuts it down.
pub struct TcpTransport<M> {
    shared: Arc<Shared>,
    /// Queue of each peer's link thread, indexed by node id (`None` for this node).
    links: Vec<Option<Sender<Queued<M>>>>,
    inbox: Sender<Envelope<M>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Disconnected once every link thread has finished.
    links_done: Receiver<()>,
    local_addr: SocketAddr,
}

impl<M: Serialize + DeserializeOwned + Send + 'static> TcpTransport<M> {
    /// Starts the acceptor on `listener` (bound by the caller, so ports can be chosen before
    /// the peer list is known) and one link thread per peer. Received messages go to `inbox`;
    /// link state changes go to `events`, which should be read promptly (a full bounded
    /// channel holds up that link until there is room or the transport shuts down).
    pub fn start(
        cfg: TcpConfig,
        listener: TcpListener,
        inbox: Sender<Envelope<M>>,
        events: Option<Sender<PeerEvent>>,
    ) -> io::Result<Self> {
        cfg.validate()?;
        let local_addr = listener.local_addr()?;
        let (done_tx, links_done) = bounded(0);
        // Built step by step so that a failure part way shuts down what already runs.
        let mut transport = TcpTransport {
            shared: Arc::new(Shared::new(cfg, events)),
            links: Vec::new(),
            inbox,
            threads: Mutex::new(Vec::new()),
            links_done,
            local_addr,
        };
        let acceptor = accept::spawn(listener, transport.shared.clone(), transport.inbox.clone())?;
        transport.threads.lock().push(acceptor);
        for peer in 0..transport.shared.cfg.peers.len() {
            let link = transport.spawn_link(NodeId(peer as u32), &done_tx)?;
            transport.links.push(link);
        }
        Ok(transport)
    }

    fn spawn_link(&self, peer: NodeId, done: &Sender<()>) -> io::Result<Option<Sender<Queued<M>>>> {
        if peer == self.shared.cfg.me {
            return Ok(None);
        }
        let (tx, rx) = unbounded();
        let handle = link::spawn(peer, rx, self.shared.clone(), done.clone())?;
        self.threads.lock().push(handle);
        Ok(Some(tx))
    }
}

impl<M> TcpTransport<M> {
    /// This node.
    pub fn me(&self) -> NodeId {
        self.shared.cfg.me
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits until the outgoing connection to every peer is established. The error names the
    /// peers that are still not reachable.
    pub fn wait_connected(&self, timeout: Duration) -> Result<(), String> {
        self.wait_connected_unless(timeout, &|| false)
    }

    /// [`wait_connected`](Self::wait_connected), giving up early (with an error saying so)
    /// once `cancelled` returns true, e.g. when the process was asked to stop. Also fails at
    /// once when the peers refused this node as a restarted one.
    pub fn wait_connected_unless(
        &self,
        timeout: Duration,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<(), String> {
        /// How often a wait checks `cancelled`.
        const POLL: Duration = Duration::from_millis(50);
        let deadline = Instant::now() + timeout;
        let missing = loop {
            let slice = (Instant::now() + POLL).min(deadline);
            let missing = self.shared.wait_all_up(slice)?;
            if missing.is_empty() || Instant::now() >= deadline {
                break missing;
            }
            if cancelled() {
                return Err(format!(
                    "node {}: stopped while waiting for peers",
                    self.me().0
                ));
            }
        };
        if missing.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = missing
            .iter()
            .map(|p| format!("{} ({})", p.0, self.shared.cfg.peers[p.index()]))
            .collect();
        Err(format!(
            "node {}: no connection after {timeout:?} to peer(s) {}",
            self.me().0,
            names.join(", ")
        ))
    }

    /// Stops every thread: link threads first write out what is queued (for a short grace
    /// period), then all sockets are closed and the threads joined. A link thread in the middle
    /// of connecting to an unreachable host finishes that attempt first (at most
    /// `handshake_timeout`). Idempotent.
    pub fn shutdown(&self) {
        self.shared.stop.stop();
        // Returns once every link thread has dropped its end, or at the deadline.
        let _ = self
            .links_done
            .recv_deadline(Instant::now() + SHUTDOWN_GRACE);
        self.shared.sockets.close_all();
        let threads = std::mem::take(&mut *self.threads.lock());
        for handle in threads {
            let _ = handle.join();
        }
    }
}

impl<M> Drop for TcpTransport<M> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl<M: Serialize + DeserializeOwned + Send + 'static> Transport<M> for TcpTransport<M> {
    fn send(&self, from: NodeId, to: NodeId, msg: M) {
        let me = self.shared.cfg.me;
        debug_assert_eq!(from, me, "a TCP transport sends for its own node only");
        if to == me {
            // Counted like any other message, so that figures match the in-process transport.
            self.shared.counters.record(me.index(), encoded_len(&msg));
            let _ = self.inbox.send(Envelope { from, msg });
            return;
        }
        match self.links.get(to.index()) {
            // Fails only after shutdown, when messages are moot.
            Some(Some(queue)) => {
                let _ = queue.send(Queued {
                    sent_at: Instant::now(),
                    msg,
                });
            }
            _ => tracing::error!(
                "node {}: dropping a message to unknown node {} (cluster of {})",
                me.0,
                to.0,
                self.links.len()
            ),
        }
    }

    fn counters(&self) -> &NetCounters {
        &self.shared.counters
    }

    fn reachable(&self, _from: NodeId, to: NodeId) -> bool {
        to == self.shared.cfg.me || self.shared.link_up(to)
    }
}
