//! The handshake that opens every connection between nodes: the dialer introduces itself, the
//! acceptor checks that both belong to the same cluster and speak the same protocol and
//! format, and both prove that they hold the cluster secret (see [`crate::auth`]).
//!
//! Wire format: one frame each way per step, holding one postcard message:
//!
//! ```text
//! dialer   -> acceptor: Hello   (cluster, node, protocol, format, incarnation, nonce)
//! acceptor -> dialer:   Reply   Accept { its Hello, proof } | Refuse
//! dialer   -> acceptor: Proof
//! acceptor -> dialer:   Verdict Welcome | Refuse
//! ```
//!
//! Both proofs cover both hellos (so both nonces): a proof cannot be replayed in another
//! handshake or by the other role. The whole handshake has one deadline, not a timeout per
//! read, so a peer that sends a byte at a time cannot hold a connection open.
//!
//! Each side also learns the other's **incarnation**, a random number a process picks when it
//! starts. A node whose peer comes back with another incarnation knows the peer restarted and
//! lost its state; the connection is refused and the transport reports
//! [`PeerEventKind::Restarted`](super::PeerEventKind::Restarted).

use super::shared::Incarnations;
use super::TcpConfig;
use crate::auth::{self, ClusterSecret, Nonce, Proof};
use crate::frame::{FrameDecoder, FrameEncoder, FrameError};
use qstore_core::NodeId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

/// Handshake frames are small; a tight limit bounds what an unauthenticated connection can
/// make a node allocate.
const MAX_HANDSHAKE_FRAME: usize = 4096;
/// Longest protocol name, so that a hello always fits its frame.
const MAX_PROTOCOL_NAME: usize = 256;
/// Role labels of the two proofs.
const ACCEPTOR: &str = "qstore peer acceptor";
const DIALER: &str = "qstore peer dialer";

/// What every node of a cluster must agree on, and prove, before they exchange messages.
#[derive(Clone, Debug)]
pub struct Handshake {
    /// Identifies one cluster (one deployment or run); keeps stray processes out early and
    /// with a clear reason.
    pub cluster_id: u64,
    /// Name of the concurrency-control protocol; nodes running different protocols cannot
    /// understand each other's messages.
    pub protocol: String,
    /// Version of the message format.
    pub format_version: u32,
    /// The cluster's shared secret: a connection whose other end cannot prove it holds the
    /// same one is refused.
    pub secret: ClusterSecret,
}

impl Handshake {
    pub(super) fn validate(&self) -> io::Result<()> {
        if self.protocol.len() > MAX_PROTOCOL_NAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("protocol name longer than {MAX_PROTOCOL_NAME} bytes"),
            ));
        }
        Ok(())
    }

    fn hello(&self, me: NodeId, incarnation: u64) -> io::Result<Hello> {
        Ok(Hello {
            cluster_id: self.cluster_id,
            node: me.0,
            protocol: self.protocol.clone(),
            format_version: self.format_version,
            incarnation,
            nonce: auth::nonce()?,
        })
    }

    /// Why a node introducing itself with `theirs` cannot talk to this one, if it cannot.
    fn mismatch(&self, theirs: &Hello) -> Option<String> {
        if theirs.cluster_id != self.cluster_id {
            Some(format!(
                "cluster id {} != {}",
                theirs.cluster_id, self.cluster_id
            ))
        } else if theirs.protocol != self.protocol {
            Some(format!(
                "protocol {:?} != {:?}",
                theirs.protocol, self.protocol
            ))
        } else if theirs.format_version != self.format_version {
            Some(format!(
                "format version {} != {}",
                theirs.format_version, self.format_version
            ))
        } else {
            None
        }
    }
}

/// A node's introduction.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    cluster_id: u64,
    node: u32,
    protocol: String,
    format_version: u32,
    /// Chosen at random when the node's process started.
    incarnation: u64,
    nonce: Nonce,
}

/// The acceptor's answer to a hello.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Accept { hello: Hello, proof: Proof },
    Refuse(String),
}

/// The acceptor's last word, after checking the dialer's proof.
#[derive(Debug, Serialize, Deserialize)]
enum Verdict {
    Welcome,
    /// `restarted`: refused because the dialer is a new incarnation of a node this one
    /// served with; retrying cannot help.
    Refuse {
        reason: String,
        restarted: bool,
    },
}

/// How a handshake failed.
#[derive(Debug)]
pub(super) enum HandshakeError {
    /// The connection failed, or the other end is not a node of this cluster.
    Failed(io::Error),
    /// The peer is a new incarnation of a node this one already served with (it restarted and
    /// lost its state); the reason says so.
    PeerRestarted(NodeId, String),
    /// The peer refused this node because this node restarted; no retry can help.
    WeRestarted(String),
}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Failed(e)
    }
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Failed(e) => e.fmt(f),
            HandshakeError::PeerRestarted(_, why) | HandshakeError::WeRestarted(why) => {
                f.write_str(why)
            }
        }
    }
}

/// The bytes both proofs cover: both introductions, the dialer's first.
fn transcript(dialer: &Hello, acceptor: &Hello) -> io::Result<Vec<u8>> {
    postcard::to_stdvec(&(dialer, acceptor)).map_err(io::Error::other)
}

/// Introduces this node to `peer` on a fresh connection, checks the answer and the peer's
/// proof, and proves this node's membership, all before the handshake deadline.
pub(super) fn dial(
    stream: &TcpStream,
    cfg: &TcpConfig,
    peer: NodeId,
    incarnations: &Incarnations,
) -> Result<(), HandshakeError> {
    let addr = cfg.peers[peer.index()];
    let mut s = Deadlined::new(stream, Instant::now() + cfg.handshake_timeout);
    let mine = cfg.handshake.hello(cfg.me, cfg.incarnation)?;
    write_one(&mut s, &mine)?;
    let (theirs, proof) = match read_one::<Reply>(&mut s)? {
        Reply::Refuse(reason) => {
            tracing::error!("peer {} ({addr}) refused the connection: {reason}", peer.0);
            return Err(refused(io::ErrorKind::ConnectionRefused, reason));
        }
        Reply::Accept { hello, proof } => (hello, proof),
    };
    let reason = cfg.handshake.mismatch(&theirs).or_else(|| {
        (theirs.node != peer.0).then(|| format!("node id {} != {}", theirs.node, peer.0))
    });
    if let Some(reason) = reason {
        tracing::error!("refusing peer {} ({addr}): {reason}", peer.0);
        return Err(refused(io::ErrorKind::InvalidData, reason));
    }
    let transcript = transcript(&mine, &theirs)?;
    if !cfg.handshake.secret.verify(ACCEPTOR, &transcript, &proof) {
        let reason = "it could not prove it holds the cluster secret (another cluster's \
                      secret file, or not a node of this cluster)"
            .to_string();
        tracing::error!("refusing peer {} ({addr}): {reason}", peer.0);
        return Err(refused(io::ErrorKind::PermissionDenied, reason));
    }
    // Authenticated: its incarnation can be trusted now.
    incarnations
        .admit(peer, theirs.incarnation)
        .map_err(|why| HandshakeError::PeerRestarted(peer, why))?;
    write_one(&mut s, &cfg.handshake.secret.prove(DIALER, &transcript))?;
    match read_one::<Verdict>(&mut s)? {
        Verdict::Welcome => Ok(()),
        Verdict::Refuse { reason, restarted } => {
            tracing::error!("peer {} ({addr}) refused the connection: {reason}", peer.0);
            if restarted {
                return Err(HandshakeError::WeRestarted(reason));
            }
            Err(refused(io::ErrorKind::ConnectionRefused, reason))
        }
    }
}

/// Answers the introduction of the node that connected from `from`, checks its proof, and
/// returns its id.
pub(super) fn accept(
    stream: &TcpStream,
    cfg: &TcpConfig,
    from: SocketAddr,
    incarnations: &Incarnations,
) -> Result<NodeId, HandshakeError> {
    let mut s = Deadlined::new(stream, Instant::now() + cfg.handshake_timeout);
    let theirs = read_one::<Hello>(&mut s).inspect_err(|e| {
        tracing::warn!("closing connection from {from}: no valid handshake: {e}");
    })?;
    if let Some(reason) = cfg
        .handshake
        .mismatch(&theirs)
        .or_else(|| bad_node(cfg, &theirs))
    {
        tracing::error!("refusing peer {from}: {reason}");
        let _ = write_one(&mut s, &Reply::Refuse(reason.clone()));
        return Err(refused(io::ErrorKind::PermissionDenied, reason));
    }
    let mine = cfg.handshake.hello(cfg.me, cfg.incarnation)?;
    let transcript = transcript(&theirs, &mine)?;
    let proof = cfg.handshake.secret.prove(ACCEPTOR, &transcript);
    write_one(&mut s, &Reply::Accept { hello: mine, proof })?;
    let theirs_proof = read_one::<Proof>(&mut s).inspect_err(|e| {
        tracing::warn!("closing connection from {from}: no proof of the cluster secret: {e}");
    })?;
    let peer = NodeId(theirs.node);
    let refusal = if !cfg
        .handshake
        .secret
        .verify(DIALER, &transcript, &theirs_proof)
    {
        Some((
            format!(
                "the connection claiming to be node {} cannot prove it holds the cluster \
                 secret",
                peer.0
            ),
            false,
        ))
    } else {
        incarnations
            .admit(peer, theirs.incarnation)
            .err()
            .map(|reason| (reason, true))
    };
    let Some((reason, restarted)) = refusal else {
        write_one(&mut s, &Verdict::Welcome)?;
        s.release()?;
        return Ok(peer);
    };
    tracing::error!("refusing peer {from}: {reason}");
    let verdict = Verdict::Refuse {
        reason: reason.clone(),
        restarted,
    };
    let _ = write_one(&mut s, &verdict);
    if restarted {
        return Err(HandshakeError::PeerRestarted(peer, reason));
    }
    Err(refused(io::ErrorKind::PermissionDenied, reason))
}

fn refused(kind: io::ErrorKind, reason: String) -> HandshakeError {
    HandshakeError::Failed(io::Error::new(kind, reason))
}

/// Why the node id of `hello` is not one of this node's peers, if it is not.
fn bad_node(cfg: &TcpConfig, hello: &Hello) -> Option<String> {
    let n = cfg.peers.len();
    if hello.node as usize >= n {
        Some(format!(
            "node id {} is not in this cluster of {n} nodes",
            hello.node
        ))
    } else if hello.node == cfg.me.0 {
        Some(format!("node id {} is this node's own id", hello.node))
    } else {
        None
    }
}

/// A socket whose reads and writes all end by one deadline: each call gets the time left.
pub(crate) struct Deadlined<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl<'a> Deadlined<'a> {
    pub(crate) fn new(stream: &'a TcpStream, deadline: Instant) -> Self {
        Deadlined { stream, deadline }
    }

    /// Arms the socket's timeouts with the time left, or fails once the deadline passed.
    fn arm(&self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the handshake did not finish in time",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.set_write_timeout(Some(left))
    }

    /// Makes the socket block without limit again, for the connection's life after the
    /// handshake.
    pub(crate) fn release(self) -> io::Result<()> {
        self.stream.set_read_timeout(None)?;
        self.stream.set_write_timeout(None)
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        (&mut &*self.stream).read(buf)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        (&mut &*self.stream).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn write_one<T: Serialize, W: Write>(w: &mut W, msg: &T) -> io::Result<()> {
    let mut enc = FrameEncoder::new(MAX_HANDSHAKE_FRAME, MAX_HANDSHAKE_FRAME);
    enc.push(msg).map_err(io::Error::other)?;
    enc.write_to(w)
}

fn read_one<T: DeserializeOwned>(r: &mut impl Read) -> io::Result<T> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
    match FrameDecoder::new(MAX_HANDSHAKE_FRAME).read_frame::<T, _>(r) {
        Ok(Some(msgs)) => match <[T; 1]>::try_from(msgs) {
            Ok([msg]) => Ok(msg),
            Err(msgs) => Err(invalid(format!(
                "a handshake frame holds one message, not {}",
                msgs.len()
            ))),
        },
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed during the handshake",
        )),
        Err(FrameError::Io(e)) => Err(e),
        Err(e) => Err(invalid(e.to_string())),
    }
}

/// Tests and tools: completes the dialer's side of a handshake as node `me` with
/// `incarnation`, on `stream`, to the node that listens there. Nothing else in the transport
/// needs it; it lets tests play a peer on a raw socket.
pub fn dial_as(
    stream: &TcpStream,
    handshake: &Handshake,
    me: NodeId,
    incarnation: u64,
    peer: NodeId,
    timeout: std::time::Duration,
) -> io::Result<()> {
    let n = me.index().max(peer.index()) + 1;
    let mut cfg = TcpConfig::new(me, vec![stream.peer_addr()?; n], handshake.clone());
    cfg.incarnation = incarnation;
    cfg.handshake_timeout = timeout;
    dial(
        stream,
        &cfg,
        peer,
        &Incarnations::new(n, &cfg.restart_advice, cfg.admit_restarted),
    )
    .map_err(as_io_error)
}

/// A handshake's failure as the I/O error a test or tool sees: a refusal is
/// `ConnectionRefused` with the reason.
fn as_io_error(e: HandshakeError) -> io::Error {
    match e {
        HandshakeError::Failed(e) => e,
        other => io::Error::new(io::ErrorKind::ConnectionRefused, other.to_string()),
    }
}

/// Tests and tools: completes the acceptor's side of a handshake as node `me` with
/// `incarnation`, on an accepted `stream`; returns the dialing node. Lets tests play a peer
/// that a real node dials.
pub fn accept_as(
    stream: &TcpStream,
    handshake: &Handshake,
    me: NodeId,
    incarnation: u64,
    nodes: usize,
    timeout: std::time::Duration,
) -> io::Result<NodeId> {
    let mut cfg = TcpConfig::new(me, vec![stream.local_addr()?; nodes], handshake.clone());
    cfg.incarnation = incarnation;
    cfg.handshake_timeout = timeout;
    let from = stream.peer_addr()?;
    accept(
        stream,
        &cfg,
        from,
        &Incarnations::new(nodes, &cfg.restart_advice, cfg.admit_restarted),
    )
    .map_err(as_io_error)
}
