//! The receiving side: an acceptor thread, and one reader thread per incoming connection that
//! checks the handshake, then decodes frames into the node's inbox.

use super::handshake::{self, HandshakeError};
use super::shared::Shared;
use super::PeerEventKind;
use crate::frame::{FrameDecoder, FrameError, DEFAULT_FLUSH_BYTES};
use crate::Envelope;
use crossbeam_channel::Sender;
use qstore_core::NodeId;
use serde::de::DeserializeOwned;
use std::io::{self, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Most connections at a time that have not finished their handshake. Peers connect rarely
/// (at start and after failures), so this never holds up a real node, and it bounds the
/// threads and memory that anyone who can reach the peer port can take.
pub const MAX_PENDING_HANDSHAKES: usize = 16;

/// Pause between polls of the listener when no connection is waiting. Connections are
/// opened rarely (at start and after failures), so a few milliseconds cost nothing, and
/// polling lets the acceptor notice shutdown without a wake-up connection.
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// Starts the acceptor thread on `listener`.
pub(super) fn spawn<M: DeserializeOwned + Send + 'static>(
    listener: TcpListener,
    shared: Arc<Shared>,
    inbox: Sender<Envelope<M>>,
) -> io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let name = format!("net-accept-{}", shared.cfg.me.0);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || run_acceptor(listener, &shared, &inbox))
}

/// Accepts connections until shutdown, then waits for their readers.
fn run_acceptor<M: DeserializeOwned + Send + 'static>(
    listener: TcpListener,
    shared: &Arc<Shared>,
    inbox: &Sender<Envelope<M>>,
) {
    let mut readers: Vec<JoinHandle<()>> = Vec::new();
    let pending = Arc::new(AtomicUsize::new(0));
    while !shared.stop.is_stopped() {
        match listener.accept() {
            Ok((stream, from)) if pending.load(Ordering::Acquire) >= MAX_PENDING_HANDSHAKES => {
                tracing::warn!(
                    "node {}: refusing a connection from {from}: {MAX_PENDING_HANDSHAKES} \
                     handshakes are already under way",
                    shared.cfg.me.0
                );
                let _ = stream.shutdown(Shutdown::Both);
            }
            Ok((stream, from)) => match spawn_reader(stream, from, shared, inbox, &pending) {
                Ok(reader) => readers.push(reader),
                Err(e) => tracing::warn!("node {}: cannot serve {from}: {e}", shared.cfg.me.0),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                shared.stop.sleep(ACCEPT_POLL);
            }
            Err(e) => {
                tracing::warn!("node {}: accept failed: {e}", shared.cfg.me.0);
                shared.stop.sleep(ACCEPT_POLL);
            }
        }
        // Finished readers need no join; forget them so the list stays short.
        readers.retain(|r| !r.is_finished());
    }
    // Free the port at once, so that a restarted node can bind it.
    drop(listener);
    for reader in readers {
        let _ = reader.join();
    }
}

fn spawn_reader<M: DeserializeOwned + Send + 'static>(
    stream: TcpStream,
    from: SocketAddr,
    shared: &Arc<Shared>,
    inbox: &Sender<Envelope<M>>,
    pending: &Arc<AtomicUsize>,
) -> io::Result<JoinHandle<()>> {
    // Accepted sockets may inherit the listener's non-blocking mode on some systems.
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let tracked = shared.sockets.track(&stream)?;
    let (shared, inbox) = (shared.clone(), inbox.clone());
    let name = format!("net-read-{}", shared.cfg.me.0);
    let handshaking = Pending::enter(pending);
    std::thread::Builder::new().name(name).spawn(move || {
        serve(stream, from, &shared, &inbox, handshaking);
        drop(tracked);
    })
}

/// Counts a connection among those still in their handshake until dropped.
struct Pending(Arc<AtomicUsize>);

impl Pending {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Pending(count.clone())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs the handshake, then reads the peer's frames until the connection ends.
fn serve<M: DeserializeOwned>(
    stream: TcpStream,
    from: SocketAddr,
    shared: &Shared,
    inbox: &Sender<Envelope<M>>,
    handshaking: Pending,
) {
    // Failures are logged by the handshake; closing the connection is the answer.
    let accepted = handshake::accept(&stream, &shared.cfg, from, &shared.incarnations);
    drop(handshaking);
    let peer = match accepted {
        Ok(peer) => peer,
        Err(e) => {
            let _ = stream.shutdown(Shutdown::Both);
            if let HandshakeError::PeerRestarted(peer, why) = e {
                shared.link_changed(peer, PeerEventKind::Restarted(why));
            }
            return;
        }
    };
    let turn = match shared.incoming[peer.index()].take_over(&stream) {
        Ok(turn) => turn,
        Err(e) => {
            tracing::warn!(
                "node {}: cannot read peer {} ({from}): {e}",
                shared.cfg.me.0,
                peer.0
            );
            return;
        }
    };
    read_frames(&stream, from, peer, shared, inbox);
    let _ = stream.shutdown(Shutdown::Both);
    drop(turn);
}

/// Delivers the messages of every frame from `peer` to the inbox. A malformed frame closes
/// the connection (the caller shuts it down); the node keeps running. Once the node no longer
/// reads its inbox (it is shutting down) messages are read and dropped: closing the
/// connection before the transport stops and says goodbye would look like a crash to the
/// peer.
fn read_frames<M: DeserializeOwned>(
    stream: &TcpStream,
    from: SocketAddr,
    peer: NodeId,
    shared: &Shared,
    inbox: &Sender<Envelope<M>>,
) {
    let me = shared.cfg.me.0;
    let mut reader = BufReader::with_capacity(DEFAULT_FLUSH_BYTES, stream);
    let mut decoder = FrameDecoder::new(shared.cfg.max_frame);
    shared.set_goodbye(peer, false);
    loop {
        match decoder.read_frame::<M, _>(&mut reader) {
            Ok(Some(msgs)) if msgs.is_empty() => {
                tracing::debug!("node {me}: peer {} is stopping", peer.0);
                shared.set_goodbye(peer, true);
            }
            Ok(Some(msgs)) => {
                for msg in msgs {
                    if inbox.send(Envelope { from: peer, msg }).is_err() {
                        break;
                    }
                }
            }
            Ok(None) => {
                tracing::debug!("node {me}: peer {} ({from}) closed its connection", peer.0);
                return;
            }
            Err(_) if shared.stop.is_stopped() => return,
            Err(e @ FrameError::Io(_)) => {
                tracing::warn!(
                    "node {me}: connection from peer {} ({from}) failed: {e}",
                    peer.0
                );
                return;
            }
            Err(e) => {
                tracing::error!(
                    "node {me}: closing connection from peer {} ({from}): {e}",
                    peer.0
                );
                return;
            }
        }
    }
}
