//! The client protocol: what clients and servers of a distributed cluster say to each other.
//!
//! A client opens a TCP connection to a node's client address and talks in frames of
//! [`qstore_net::frame`] (each frame carries one or more postcard-encoded messages). It first
//! proves that it holds the cluster secret (see [`qstore_net::auth`]):
//!
//! ```text
//! client -> server: Hello { cluster_id, format_version, nonce }
//! server -> client: Challenge { nonce, proof }   (or Refused, and the server closes)
//! client -> server: Prove { proof }
//! server -> client: Welcome { .. }               (or Refused, and the server closes)
//! ```
//!
//! Each proof is the keyed MAC of its role and [`transcript`] (both nonces), so the client
//! also knows it reached a server of its cluster. The whole handshake must finish within the
//! server's `server.handshake_timeout_s`. Then the client may send, pipelined, any number of
//! requests:
//! - `Submit { id, call, birth_us, key }`: run a stored-procedure call with this node as its
//!   home; the answer is `Answer { id, outcome }` (commit with the access outputs, logic
//!   abort, retryable concurrency-control abort, rejection with the reason, e.g. an unknown
//!   procedure, or, replicated, `NotLeader` naming the server that leads this node's
//!   partition: resubmit there with the same `key`).
//!   Answers come in completion order, not submission order; `id` is the client's.
//! - `Stats`: the node's message counters, answered by `Stats`.
//! - `Collect { history }`: after a run, the node's partition hash and (when the server
//!   records one and `history` asks for it) its part of the history, answered by
//!   `Collected`. Without the history it is cheap: a client polls it until the copies of a
//!   replicated cluster agree.
//!
//! A malformed frame closes the connection; a request that is well-formed but wrong gets an
//! `Error` or a `Rejected` answer and the connection stays.

use qstore_core::txn::{ProcCall, TxnKey, TxnOutcome};
use qstore_core::NodeId;
use qstore_net::auth::{ClusterSecret, Nonce, Proof};
use qstore_net::frame::{FrameDecoder, FrameEncoder};
use serde::{Deserialize, Serialize};
use std::net::TcpStream;
use std::time::Duration;

/// Largest handshake frame either side sends.
const MAX_HANDSHAKE_FRAME: usize = 4096;

/// Version of the client protocol; a client with another version is refused.
pub const CLIENT_FORMAT_VERSION: u32 = 12;

/// Role labels of the client handshake's proofs.
pub const SERVER_ROLE: &str = "qstore client-port server";
pub const CLIENT_ROLE: &str = "qstore client-port client";

/// What both proofs of a client handshake cover: the client's hello and the server's nonce.
pub fn transcript(
    cluster_id: u64,
    format_version: u32,
    client_nonce: &Nonce,
    server_nonce: &Nonce,
) -> Vec<u8> {
    let mut t = Vec::with_capacity(12 + 2 * client_nonce.len());
    t.extend_from_slice(&cluster_id.to_le_bytes());
    t.extend_from_slice(&format_version.to_le_bytes());
    t.extend_from_slice(client_nonce);
    t.extend_from_slice(server_nonce);
    t
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClientRequest {
    Hello {
        cluster_id: u64,
        format_version: u32,
        nonce: Nonce,
    },
    /// The client's answer to the server's challenge.
    Prove {
        proof: Proof,
    },
    Submit {
        id: u64,
        call: ProcCall,
        /// When the client first submitted this transaction (µs since the UNIX epoch); the
        /// same on every retry, so age-ordered protocols keep a retried transaction's age.
        birth_us: u64,
        /// The client's name for this attempt, the same when it resubmits the attempt to
        /// another server after a `NotLeader` answer or a lost connection: a replicated
        /// cluster answers an attempt it already ran with the original outcome.
        key: TxnKey,
    },
    Stats,
    Collect {
        /// Whether to include the node's part of the history (large after a long run).
        history: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClientResponse {
    /// The server's proof, and the nonce the client's proof must cover.
    Challenge {
        nonce: Nonce,
        proof: Proof,
    },
    Welcome {
        node: NodeId,
        /// Partitions of the cluster.
        nodes: u32,
        /// Copies of each partition (the cluster has `nodes` x `replicas` servers).
        replicas: u32,
        protocol: String,
        /// Of the node's catalog: a client built for another workload is told so.
        catalog: u64,
        /// How many times the server started from its data directory before (see
        /// `EngineCtx::generation`): a client numbers its clients past the earlier starts'.
        generation: u64,
    },
    Refused(String),
    Answer {
        id: u64,
        outcome: TxnOutcome,
    },
    Stats(ServerStats),
    Collected(Collected),
    Error(String),
}

/// A node's counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    pub node: NodeId,
    /// Messages, bytes and frames this node sent to other nodes.
    pub msgs_sent: u64,
    pub bytes_sent: u64,
    pub frames_sent: u64,
    /// The totals of the node's stage clocks so far, for protocols that time stages.
    pub stages: Option<crate::stages::StageTotals>,
    /// What the node's logs did since it started (with a data directory).
    pub log: Option<qstore_log::LogStats>,
    /// The protocol's own event counts so far (see `Engine::counters`).
    pub counters: crate::protocol::ProtocolCounters,
    /// Where the node's worker threads spent their time so far, by activity (see
    /// `Engine::worker_time`; empty for protocols that do not account it).
    pub worker_time: Vec<(NodeId, crate::stages::StageTotals)>,
}

/// What a node hands the client after a run for checking.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Collected {
    pub node: NodeId,
    pub partition_hash: u64,
    /// The node's part of the engine history (a postcard-encoded
    /// `qstore_engine::history::HistoryPart`), when the server records one and it was asked.
    pub history: Option<Vec<u8>>,
    /// What the workload's final-state check finds in the node's partition (a
    /// postcard-encoded `qstore_workload::Tally`), for workloads that have one.
    pub tally: Option<Vec<u8>>,
    /// Replicated: whether the node's cluster instance is still in service as far as the
    /// node knows (an instance that lost a server, or ran a plan no log committed, is not).
    pub in_service: bool,
    /// Replicated: whether the node's instance was rebuilt from another's copies (its
    /// history lacks what ran before the copy).
    pub rebuilt: bool,
    /// Replicated: times the node saw its group's leadership move between servers.
    pub failovers: u32,
    /// The protocol's account of the node for its own end-of-run check (LEAP: which records
    /// it owns; see `Engine::audit`), for protocols that keep one.
    pub audit: Option<Vec<u8>>,
}

/// The client's side of the handshake on a fresh connection: hello, check the server's proof,
/// prove the secret, and return the server's welcome (a `Welcome`), all within `timeout`.
/// The error says what went wrong, including the server's reason for a refusal.
pub fn client_handshake(
    stream: &mut TcpStream,
    cluster_id: u64,
    secret: &ClusterSecret,
    timeout: Duration,
) -> Result<ClientResponse, String> {
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let nonce = qstore_net::auth::nonce().map_err(|e| format!("no random source: {e}"))?;
    send(
        stream,
        &ClientRequest::Hello {
            cluster_id,
            format_version: CLIENT_FORMAT_VERSION,
            nonce,
        },
    )?;
    let (server_nonce, proof) = match receive(stream)? {
        ClientResponse::Challenge { nonce, proof } => (nonce, proof),
        ClientResponse::Refused(why) => return Err(format!("refused this client: {why}")),
        other => return Err(format!("expected a challenge, got {other:?}")),
    };
    let t = transcript(cluster_id, CLIENT_FORMAT_VERSION, &nonce, &server_nonce);
    if !secret.verify(SERVER_ROLE, &t, &proof) {
        return Err(
            "the server could not prove it holds the cluster secret: it is not a \
                    server of this cluster (or the secret files differ)"
                .into(),
        );
    }
    send(
        stream,
        &ClientRequest::Prove {
            proof: secret.prove(CLIENT_ROLE, &t),
        },
    )?;
    let welcome = match receive(stream)? {
        w @ ClientResponse::Welcome { .. } => w,
        ClientResponse::Refused(why) => return Err(format!("refused this client: {why}")),
        other => return Err(format!("expected a welcome, got {other:?}")),
    };
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok(welcome)
}

fn send(stream: &mut TcpStream, r: &ClientRequest) -> Result<(), String> {
    let mut enc = FrameEncoder::new(MAX_HANDSHAKE_FRAME, MAX_HANDSHAKE_FRAME);
    enc.push(r).map_err(|e| e.to_string())?;
    enc.write_to(stream)
        .map_err(|e| format!("cannot send the handshake: {e}"))
}

fn receive(stream: &mut TcpStream) -> Result<ClientResponse, String> {
    match FrameDecoder::new(MAX_HANDSHAKE_FRAME).read_frame::<ClientResponse, _>(stream) {
        Ok(Some(msgs)) => msgs
            .into_iter()
            .next()
            .ok_or_else(|| "an empty handshake frame".to_string()),
        Ok(None) => Err("the server closed the connection during the handshake".into()),
        Err(e) => Err(format!("bad handshake answer: {e}")),
    }
}
