//! State shared by a TCP transport and its threads: settings, the stop signal, open sockets,
//! link states and accounting.

use super::{PeerEvent, PeerEventKind, TcpConfig};
use crate::NetCounters;
use crossbeam_channel::{select, Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex, MutexGuard};
use qstore_core::NodeId;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a lost connection waits for the peer's goodbye on its other connection.
const GOODBYE_WAIT: Duration = Duration::from_millis(250);

pub(super) struct Shared {
    pub cfg: TcpConfig,
    pub stop: StopSignal,
    pub sockets: Arc<Sockets>,
    pub counters: NetCounters,
    /// The connection currently read from each peer, indexed by node id.
    pub incoming: Vec<IncomingSlot>,
    /// The incarnation each peer had when this node first met it.
    pub incarnations: Incarnations,
    /// Peers that said goodbye (shut down on purpose) since they last connected.
    goodbyes: Vec<AtomicBool>,
    /// Whether the outgoing connection to each peer is up (this node counts as up).
    links_up: Mutex<Vec<bool>>,
    /// Set when this node can never join its cluster (its peers refused it as a restarted
    /// node): waiting for connections ends with this reason.
    fatal: Mutex<Option<String>>,
    links_changed: Condvar,
    events: Option<Sender<PeerEvent>>,
}

impl Shared {
    pub fn new(cfg: TcpConfig, events: Option<Sender<PeerEvent>>) -> Self {
        let n = cfg.peers.len();
        let links_up = (0..n).map(|i| i == cfg.me.index()).collect();
        Shared {
            stop: StopSignal::new(),
            sockets: Arc::new(Sockets::default()),
            counters: NetCounters::new(n),
            incoming: (0..n).map(|_| IncomingSlot::default()).collect(),
            incarnations: Incarnations::new(n, &cfg.restart_advice, cfg.admit_restarted),
            goodbyes: (0..n).map(|_| AtomicBool::new(false)).collect(),
            links_up: Mutex::new(links_up),
            fatal: Mutex::new(None),
            links_changed: Condvar::new(),
            events,
            cfg,
        }
    }

    /// Records that the link to `peer` went up or down, and tells the event listener.
    pub fn link_changed(&self, peer: NodeId, kind: PeerEventKind) {
        self.links_up.lock()[peer.index()] = kind == PeerEventKind::Up;
        self.links_changed.notify_all();
        if let Some(events) = &self.events {
            // Waits for room in a bounded channel, but never past shutdown.
            select! {
                send(events, PeerEvent { peer, kind }) -> _ => {}
                recv(self.stop.receiver()) -> _ => {}
            }
        }
    }

    /// Whether the link to `peer` is up (this node's own is).
    pub fn link_up(&self, peer: NodeId) -> bool {
        self.links_up
            .lock()
            .get(peer.index())
            .copied()
            .unwrap_or(false)
    }

    /// Records that `peer` is shutting down on purpose (`true`), or connected again.
    pub fn set_goodbye(&self, peer: NodeId, said: bool) {
        if let Some(g) = self.goodbyes.get(peer.index()) {
            g.store(said, Ordering::Release);
        }
    }

    /// Whether `peer` said goodbye since it last connected.
    pub fn said_goodbye(&self, peer: NodeId) -> bool {
        self.goodbyes
            .get(peer.index())
            .is_some_and(|g| g.load(Ordering::Acquire))
    }

    /// Judges, once the connection to `peer` was lost, whether the peer stopped on purpose.
    /// Its goodbye comes on the other connection, read by another thread, and a stopping peer
    /// closes the connection it reads right after sending it: so this waits (briefly) until
    /// that connection has ended too. A crashed peer's connections end together: no wait.
    pub fn peer_stopped(&self, peer: NodeId) -> bool {
        let deadline = Instant::now() + GOODBYE_WAIT;
        let reading = |p: NodeId| self.incoming.get(p.index()).is_some_and(|s| s.is_open());
        while !self.said_goodbye(peer) && reading(peer) && Instant::now() < deadline {
            if self.stop.sleep(Duration::from_millis(1)) {
                break;
            }
        }
        self.said_goodbye(peer)
    }

    /// Records that this node can never join its cluster, and why; wakes waiters.
    pub fn set_fatal(&self, reason: String) {
        let _guard = self.links_up.lock();
        self.fatal.lock().get_or_insert(reason);
        self.links_changed.notify_all();
    }

    /// Waits until every link is up, `deadline` passes, or the node can never join (the
    /// error). Returns the peers still down.
    pub fn wait_all_up(&self, deadline: Instant) -> Result<Vec<NodeId>, String> {
        let mut up = self.links_up.lock();
        loop {
            if let Some(reason) = self.fatal.lock().clone() {
                return Err(reason);
            }
            let down: Vec<NodeId> = (up.iter().enumerate())
                .filter(|&(_, &u)| !u)
                .map(|(i, _)| NodeId(i as u32))
                .collect();
            if down.is_empty() || self.links_changed.wait_until(&mut up, deadline).timed_out() {
                return Ok(down);
            }
        }
    }
}

/// Tells every thread to stop, and lets them sleep so that stopping wakes them at once.
pub(super) struct StopSignal {
    stopped: AtomicBool,
    /// Dropped on stop: receivers then see a disconnected channel.
    tx: Mutex<Option<Sender<()>>>,
    rx: Receiver<()>,
}

impl StopSignal {
    fn new() -> Self {
        let (tx, rx) = crossbeam_channel::bounded(0);
        StopSignal {
            stopped: AtomicBool::new(false),
            tx: Mutex::new(Some(tx)),
            rx,
        }
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.tx.lock().take();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// A channel that becomes ready (disconnected) on stop, for `select!`.
    pub fn receiver(&self) -> &Receiver<()> {
        &self.rx
    }

    /// Sleeps for `d` or until stopped; returns whether the transport is stopping.
    pub fn sleep(&self, d: Duration) -> bool {
        !matches!(self.rx.recv_timeout(d), Err(RecvTimeoutError::Timeout)) || self.is_stopped()
    }

    /// Sleeps until `at` or until stopped; returns whether the transport is stopping.
    pub fn sleep_until(&self, at: Instant) -> bool {
        self.sleep(at.saturating_duration_since(Instant::now()))
    }
}

/// Every open socket of the transport, so that shutdown can close them and unblock the
/// threads that read or write them.
#[derive(Default)]
pub(super) struct Sockets {
    open: Mutex<(bool, HashMap<u64, TcpStream>)>,
    next_id: AtomicU64,
}

impl Sockets {
    /// Registers `stream` until the returned guard is dropped. Refused once the transport
    /// closes, so that no socket opened during shutdown escapes it.
    pub fn track(self: &Arc<Self>, stream: &TcpStream) -> io::Result<Tracked> {
        let clone = stream.try_clone()?;
        let mut open = self.open.lock();
        if open.0 {
            let _ = stream.shutdown(Shutdown::Both);
            return Err(io::Error::other("the transport is shutting down"));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        open.1.insert(id, clone);
        Ok(Tracked {
            sockets: self.clone(),
            id,
        })
    }

    /// Shuts down every open socket and refuses new ones.
    pub fn close_all(&self) {
        let mut open = self.open.lock();
        open.0 = true;
        for stream in open.1.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// A registered socket; unregisters it when dropped.
pub(super) struct Tracked {
    sockets: Arc<Sockets>,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.sockets.open.lock().1.remove(&self.id);
    }
}

/// The connection read from one peer. A peer that reconnects replaces its old connection;
/// readers take turns so that a new connection's messages never overtake the old one's.
#[derive(Default)]
pub(super) struct IncomingSlot {
    current: Mutex<Option<(u64, TcpStream)>>,
    reader: Mutex<()>,
    generation: AtomicU64,
}

impl IncomingSlot {
    /// Whether a connection from the peer is being read.
    pub fn is_open(&self) -> bool {
        self.current.lock().is_some()
    }

    /// Makes `stream` the peer's connection: closes the previous one, then waits until its
    /// reader has finished. Reading may start while the returned turn is held.
    pub fn take_over(&self, stream: &TcpStream) -> io::Result<ReaderTurn<'_>> {
        let id = self.generation.fetch_add(1, Ordering::Relaxed);
        let old = self.current.lock().replace((id, stream.try_clone()?));
        if let Some((_, old)) = old {
            let _ = old.shutdown(Shutdown::Both);
        }
        Ok(ReaderTurn {
            slot: self,
            id,
            _turn: self.reader.lock(),
        })
    }
}

/// The right to deliver a peer's messages; forgets the connection when dropped.
pub(super) struct ReaderTurn<'a> {
    slot: &'a IncomingSlot,
    id: u64,
    _turn: MutexGuard<'a, ()>,
}

impl Drop for ReaderTurn<'_> {
    fn drop(&mut self) {
        let mut current = self.slot.current.lock();
        if current.as_ref().is_some_and(|(id, _)| *id == self.id) {
            *current = None;
        }
    }
}

/// The incarnation of each peer, as first met: a peer that comes back with another one
/// restarted and lost its state.
pub(crate) struct Incarnations {
    known: Mutex<Vec<Option<u64>>>,
    /// The end of a refusal (see `TcpConfig::restart_advice`).
    advice: String,
    /// See `TcpConfig::admit_restarted`.
    admit_restarted: bool,
}

impl Incarnations {
    pub fn new(nodes: usize, advice: &str, admit_restarted: bool) -> Self {
        Incarnations {
            known: Mutex::new(vec![None; nodes]),
            advice: advice.to_string(),
            admit_restarted,
        }
    }

    /// Admits an authenticated `peer` of `incarnation`: its first one is remembered; another
    /// one is refused with the reason to tell the operator.
    pub fn admit(&self, peer: NodeId, incarnation: u64) -> Result<(), String> {
        let mut known = self.known.lock();
        let Some(slot) = known.get_mut(peer.index()) else {
            return Err(format!("node {} is not in this cluster", peer.0));
        };
        match *slot {
            None => {
                *slot = Some(incarnation);
                Ok(())
            }
            Some(k) if k == incarnation => Ok(()),
            Some(k) if self.admit_restarted => {
                tracing::warn!(
                    "node {} restarted (incarnation {k:016x}, now {incarnation:016x}): it \
                     rejoins",
                    peer.0
                );
                *slot = Some(incarnation);
                Ok(())
            }
            Some(k) => Err(format!(
                "node {} restarted (incarnation {k:016x}, now {incarnation:016x}) and lost its \
                 data; {}",
                peer.0, self.advice
            )),
        }
    }
}
