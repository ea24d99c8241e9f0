//! The handshake that opens every connection between nodes: the dialer introduces itself, the
//! acceptor checks that both belong to the same cluster and speak the same protocol and
//! format, and answers with its own introduction or a refusal that says why.
//!
//! Wire format: one frame each way, holding one postcard message: the dialer's [`Hello`],
//! then a [`Reply`].

use super::TcpConfig;
use crate::frame::{FrameDecoder, FrameEncoder, FrameError};
use qstore_core::NodeId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io;
use std::net::{SocketAddr, TcpStream};

/// Handshake frames are small; a tight limit bounds what an unauthenticated connection can
/// make a node allocate.
const MAX_HANDSHAKE_FRAME: usize = 4096;
/// Longest protocol name, so that a hello always fits its frame.
const MAX_PROTOCOL_NAME: usize = 256;

/// What every node of a cluster must agree on before they exchange messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handshake {
    /// Identifies one cluster (one deployment or run); keeps stray processes out.
    pub cluster_id: u64,
    /// Name of the concurrency-control protocol; nodes running different protocols cannot
    /// understand each other's messages.
    pub protocol: String,
    /// Version of the message format.
    pub format_version: u32,
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

    fn hello(&self, me: NodeId) -> Hello {
        Hello {
            cluster_id: self.cluster_id,
            node: me.0,
            protocol: self.protocol.clone(),
            format_version: self.format_version,
        }
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
}

/// The acceptor's answer.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Accept(Hello),
    Refuse(String),
}

/// Introduces this node to `peer` at `addr` on a fresh connection and checks the answer.
pub(super) fn dial(stream: &mut TcpStream, cfg: &TcpConfig, peer: NodeId) -> io::Result<()> {
    let addr = cfg.peers[peer.index()];
    set_timeouts(stream, Some(cfg))?;
    write_one(stream, &cfg.handshake.hello(cfg.me))?;
    let reason = match read_one::<Reply>(stream)? {
        Reply::Refuse(reason) => {
            tracing::error!("peer {} ({addr}) refused the connection: {reason}", peer.0);
            return Err(io::Error::new(io::ErrorKind::ConnectionRefused, reason));
        }
        Reply::Accept(hello) => cfg.handshake.mismatch(&hello).or_else(|| {
            (hello.node != peer.0).then(|| format!("node id {} != {}", hello.node, peer.0))
        }),
    };
    if let Some(reason) = reason {
        tracing::error!("refusing peer {} ({addr}): {reason}", peer.0);
        return Err(io::Error::new(io::ErrorKind::InvalidData, reason));
    }
    set_timeouts(stream, None)
}

/// Answers the introduction of the node that connected from `from`; returns its id.
pub(super) fn accept(
    stream: &mut TcpStream,
    cfg: &TcpConfig,
    from: SocketAddr,
) -> io::Result<NodeId> {
    set_timeouts(stream, Some(cfg))?;
    let hello = read_one::<Hello>(stream).inspect_err(|e| {
        tracing::warn!("closing connection from {from}: no valid handshake: {e}");
    })?;
    if let Some(reason) = cfg
        .handshake
        .mismatch(&hello)
        .or_else(|| bad_node(cfg, &hello))
    {
        tracing::error!("refusing peer {from}: {reason}");
        let _ = write_one(stream, &Reply::Refuse(reason.clone()));
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, reason));
    }
    write_one(stream, &Reply::Accept(cfg.handshake.hello(cfg.me)))?;
    set_timeouts(stream, None)?;
    Ok(NodeId(hello.node))
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

/// Bounds the handshake (`Some`), or makes the socket block without limit again (`None`).
fn set_timeouts(stream: &TcpStream, cfg: Option<&TcpConfig>) -> io::Result<()> {
    let timeout = cfg.map(|c| c.handshake_timeout);
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)
}

fn write_one<T: Serialize>(stream: &mut TcpStream, msg: &T) -> io::Result<()> {
    let mut enc = FrameEncoder::new(MAX_HANDSHAKE_FRAME, MAX_HANDSHAKE_FRAME);
    enc.push(msg).map_err(io::Error::other)?;
    enc.write_to(stream)
}

fn read_one<T: DeserializeOwned>(stream: &mut TcpStream) -> io::Result<T> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
    match FrameDecoder::new(MAX_HANDSHAKE_FRAME).read_frame::<T, _>(stream) {
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
