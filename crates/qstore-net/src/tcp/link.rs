//! The sending side of the link to one peer: a thread that owns the outgoing connection,
//! batches queued messages into frames, applies injected delay, and reconnects with back-off.

use super::handshake::{self, HandshakeError};
use super::shared::{Shared, Tracked};
use super::PeerEventKind;
use crate::frame::FrameEncoder;
use crossbeam_channel::{select, Receiver, Sender};
use qstore_core::rng::Rng;
use qstore_core::NodeId;
use rand::Rng as _;
use serde::Serialize;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle link waits before checking that its peer is still there. A peer that
/// dies is noticed within this time even when nothing is sent to it.
const IDLE_CHECK: Duration = Duration::from_millis(20);
/// Write timeout while writing out the queue at shutdown, so a peer that stopped reading
/// cannot hold shutdown up.
const FINAL_WRITE_TIMEOUT: Duration = Duration::from_millis(200);

/// A message waiting for its link thread.
pub(super) struct Queued<M> {
    pub sent_at: Instant,
    pub msg: M,
}

/// Starts the link thread to `peer`. It holds `done` until it finishes.
pub(super) fn spawn<M: Serialize + Send + 'static>(
    peer: NodeId,
    queue: Receiver<Queued<M>>,
    shared: Arc<Shared>,
    done: Sender<()>,
) -> io::Result<JoinHandle<()>> {
    let name = format!("net-link-{}-{}", shared.cfg.me.0, peer.0);
    std::thread::Builder::new().name(name).spawn(move || {
        Link::new(peer, queue, shared).run();
        drop(done);
    })
}

/// Whether a failed connection attempt is worth repeating.
enum Retry {
    Later,
    /// One end restarted: the cluster cannot continue with this pair.
    Never,
}

/// Why a link stopped pumping messages.
enum Halt {
    /// The transport is shutting down (or was dropped).
    Stop,
    /// The connection failed.
    Lost(io::Error),
}

impl From<io::Error> for Halt {
    fn from(e: io::Error) -> Self {
        Halt::Lost(e)
    }
}

/// An established outgoing connection.
struct Conn {
    stream: TcpStream,
    _tracked: Tracked,
}

struct Link<M> {
    peer: NodeId,
    addr: SocketAddr,
    queue: Receiver<Queued<M>>,
    shared: Arc<Shared>,
    enc: FrameEncoder,
    delay: Option<Delay>,
    backoff: Duration,
    /// Whether the link has been up since it last reported Down (or ever).
    up: bool,
}

impl<M: Serialize> Link<M> {
    fn new(peer: NodeId, queue: Receiver<Queued<M>>, shared: Arc<Shared>) -> Self {
        let cfg = &shared.cfg;
        let link = (u64::from(cfg.me.0) << 32) | u64::from(peer.0);
        let delay = (cfg.net.delay_us > 0 || cfg.net.jitter_us > 0).then(|| Delay {
            delay: Duration::from_micros(cfg.net.delay_us),
            jitter_us: cfg.net.jitter_us,
            rng: qstore_core::rng::stream(cfg.seed, link),
            last_due: Instant::now(),
        });
        Link {
            peer,
            addr: cfg.peers[peer.index()],
            enc: FrameEncoder::new(cfg.flush_bytes, cfg.max_frame),
            backoff: cfg.connect_backoff_min,
            delay,
            up: false,
            queue,
            shared,
        }
    }

    /// Connects, pumps messages until the connection fails, reconnects; until stopped, or
    /// until one end turns out to have restarted (no reconnection can mend that).
    fn run(mut self) {
        while !self.shared.stop.is_stopped() {
            let mut conn = match self.connect() {
                Ok(conn) => conn,
                Err(Retry::Later) => {
                    self.back_off();
                    continue;
                }
                Err(Retry::Never) => {
                    // Messages for the peer are moot now; wait for shutdown.
                    let _ = self.shared.stop.receiver().recv();
                    break;
                }
            };
            match self.pump(&mut conn.stream) {
                Halt::Stop => {
                    self.send_rest(&mut conn.stream);
                    break;
                }
                Halt::Lost(e) => self.lost(conn, e),
            }
        }
    }

    fn connect(&mut self) -> Result<Conn, Retry> {
        match self.try_connect() {
            Ok(conn) => {
                tracing::info!(
                    "node {}: connected to peer {} ({})",
                    self.me().0,
                    self.peer.0,
                    self.addr
                );
                self.backoff = self.shared.cfg.connect_backoff_min;
                self.up = true;
                self.shared.link_changed(self.peer, PeerEventKind::Up);
                Ok(conn)
            }
            Err(HandshakeError::PeerRestarted(_, why)) => {
                tracing::error!("node {}: {why}", self.me().0);
                self.shared
                    .link_changed(self.peer, PeerEventKind::Restarted(why));
                Err(Retry::Never)
            }
            Err(HandshakeError::WeRestarted(why)) => {
                self.shared
                    .set_fatal(format!("peer {} refused this node: {why}", self.peer.0));
                Err(Retry::Never)
            }
            Err(HandshakeError::Failed(e)) => {
                // Expected while the peer starts or restarts; refusals are logged as errors
                // by the handshake.
                tracing::debug!(
                    "node {}: cannot reach peer {} ({}): {e}",
                    self.me().0,
                    self.peer.0,
                    self.addr
                );
                Err(Retry::Later)
            }
        }
    }

    fn try_connect(&self) -> Result<Conn, HandshakeError> {
        let cfg = &self.shared.cfg;
        let stream = TcpStream::connect_timeout(&self.addr, cfg.handshake_timeout)?;
        let tracked = self.shared.sockets.track(&stream)?;
        // Frames are already batched: sending them at once is what keeps latency low.
        stream.set_nodelay(true)?;
        handshake::dial(&stream, cfg, self.peer, &self.shared.incarnations)?;
        Ok(Conn {
            stream,
            _tracked: tracked,
        })
    }

    fn back_off(&mut self) {
        if !self.shared.stop.sleep(self.backoff) {
            self.backoff = (self.backoff * 2).min(self.shared.cfg.connect_backoff_max);
        }
    }

    fn lost(&mut self, conn: Conn, e: io::Error) {
        let _ = conn.stream.shutdown(Shutdown::Both);
        let (me, peer) = (self.me().0, self.peer.0);
        let kind = if self.shared.peer_stopped(self.peer) {
            tracing::info!("node {me}: peer {peer} ({}) stopped", self.addr);
            PeerEventKind::Stopped
        } else {
            let reason = format!("connection to peer {peer} ({}) lost: {e}", self.addr);
            tracing::warn!("node {me}: {reason}");
            PeerEventKind::Down(reason)
        };
        if std::mem::take(&mut self.up) {
            self.shared.link_changed(self.peer, kind);
        }
    }

    /// Moves queued messages onto the connection until it fails or the transport stops.
    fn pump(&mut self, conn: &mut TcpStream) -> Halt {
        loop {
            let step = match self.wait_first() {
                Ok(Some(q)) => self.add(conn, q).and_then(|()| self.drain(conn)),
                Ok(None) => check_alive(conn).map_err(Halt::Lost),
                Err(halt) => Err(halt),
            };
            if let Err(halt) = step.and_then(|()| self.write(conn)) {
                return halt;
            }
        }
    }

    /// Waits for a message; `None` after an idle period.
    fn wait_first(&self) -> Result<Option<Queued<M>>, Halt> {
        select! {
            recv(self.queue) -> q => q.map(Some).map_err(|_| Halt::Stop),
            recv(self.shared.stop.receiver()) -> _ => Err(Halt::Stop),
            default(IDLE_CHECK) => Ok(None),
        }
    }

    /// Adds whatever else is queued to the frame, waiting once up to `flush_after` for more
    /// when the queue runs dry, so that a burst that is still arriving shares a frame.
    fn drain(&mut self, conn: &mut TcpStream) -> Result<(), Halt> {
        let flush_after = self.shared.cfg.flush_after;
        let mut waited = flush_after.is_zero();
        loop {
            if self.shared.stop.is_stopped() {
                return Err(Halt::Stop);
            }
            let q = match self.queue.try_recv() {
                Ok(q) => q,
                Err(_) if waited || self.enc.is_empty() => return Ok(()),
                Err(_) => {
                    waited = true;
                    match self.wait_briefly(flush_after) {
                        Some(q) => q,
                        None => return Ok(()),
                    }
                }
            };
            self.add(conn, q)?;
        }
    }

    /// Waits up to `d` for a message by polling the queue: a timed sleep overshoots short
    /// bounds several times over (timer slack), a polling wait keeps the bound.
    fn wait_briefly(&self, d: Duration) -> Option<Queued<M>> {
        let deadline = Instant::now() + d;
        loop {
            if let Ok(q) = self.queue.try_recv() {
                return Some(q);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// Puts one message into the frame (once its injected delay has passed) and writes the
    /// frame out when it is full.
    fn add(&mut self, conn: &mut TcpStream, q: Queued<M>) -> Result<(), Halt> {
        let stopped = self.hold_until_due(conn, q.sent_at)?;
        match self.enc.push(&q.msg) {
            Ok(size) => self.shared.counters.record(self.me().index(), size),
            Err(e) => tracing::error!(
                "node {}: dropping a message to peer {}: {e}",
                self.me().0,
                self.peer.0
            ),
        }
        if self.enc.should_flush() {
            self.write(conn)?;
        }
        if stopped {
            return Err(Halt::Stop);
        }
        Ok(())
    }

    /// Waits until a message sent at `sent_at` is due, writing out the messages before it
    /// first. Returns whether the transport stopped meanwhile.
    fn hold_until_due(&mut self, conn: &mut TcpStream, sent_at: Instant) -> Result<bool, Halt> {
        let Some(due) = self.delay.as_mut().map(|d| d.due(sent_at)) else {
            return Ok(false);
        };
        if due <= Instant::now() {
            return Ok(false);
        }
        self.write(conn)?;
        Ok(self.shared.stop.sleep_until(due))
    }

    /// Writes the frame, if it holds any message.
    fn write(&mut self, conn: &mut TcpStream) -> Result<(), Halt> {
        if self.enc.is_empty() {
            return Ok(());
        }
        self.enc.write_to(conn)?;
        self.shared.counters.record_frame(self.me().index());
        Ok(())
    }

    /// At shutdown: writes out what is queued, without the remaining injected delay (as the
    /// in-process delay line does), within a short write timeout. Errors are moot now.
    fn send_rest(&mut self, conn: &mut TcpStream) {
        self.delay = None;
        let _ = conn.set_write_timeout(Some(FINAL_WRITE_TIMEOUT));
        while let Ok(q) = self.queue.try_recv() {
            if self.add(conn, q).is_err() {
                return;
            }
        }
        if self.write(conn).is_ok() {
            let _ = conn.write_all(&crate::frame::goodbye_frame());
        }
    }

    fn me(&self) -> NodeId {
        self.shared.cfg.me
    }
}

/// Checks, without blocking, that the peer has not closed an idle connection. Nothing is
/// ever read from an outgoing connection after the handshake, so readable means closed.
fn check_alive(conn: &TcpStream) -> io::Result<()> {
    conn.set_nonblocking(true)?;
    let peeked = conn.peek(&mut [0u8; 1]);
    conn.set_nonblocking(false)?;
    match peeked {
        Ok(0) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the connection",
        )),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "peer sent data on a send-only connection",
        )),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(e),
    }
}

/// Injected delay of one link: each message is due `delay + U[0, jitter)` after it was sent,
/// and never before the message sent before it.
struct Delay {
    delay: Duration,
    jitter_us: u64,
    rng: Rng,
    last_due: Instant,
}

impl Delay {
    fn due(&mut self, sent_at: Instant) -> Instant {
        let jitter = if self.jitter_us > 0 {
            self.rng.random_range(0..self.jitter_us)
        } else {
            0
        };
        let due = (sent_at + self.delay + Duration::from_micros(jitter)).max(self.last_due);
        self.last_due = due;
        due
    }
}
