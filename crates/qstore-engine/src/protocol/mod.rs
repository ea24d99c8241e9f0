//! Concurrency-control protocols, one folder each. A protocol is chosen at run time by name.

pub mod serial;

use crate::cluster::EngineCtx;
use crossbeam_channel::Sender;
use qstore_core::txn::{ProcCall, TxnResponse};
use qstore_core::{ConfigError, NodeId, TxnId};
use qstore_net::NetCounters;
use std::sync::Arc;

/// Where the answer to a request goes.
pub type ReplyTo = Sender<TxnResponse>;

/// A transaction attempt submitted by a client at its home node.
pub struct TxnRequest {
    pub id: TxnId,
    /// Shared so a client can resubmit the same call after an abort without copying it.
    pub call: Arc<ProcCall>,
    pub reply: ReplyTo,
}

/// A running protocol instance serving a whole cluster.
pub trait Engine: Send + Sync {
    /// Submits `req` at node `home`. Never blocks: when the node's admission queue is full the
    /// request is answered at once with a concurrency-control abort of cause `Overload`.
    fn submit(&self, home: NodeId, req: TxnRequest);
    /// Message counters, for protocols that exchange messages between nodes.
    fn net_counters(&self) -> Option<&NetCounters>;
    /// Stops every thread of the protocol; requests still queued are answered `Rejected`.
    fn shutdown(&self);
}

type Constructor = fn(Arc<EngineCtx>) -> Result<Box<dyn Engine>, ConfigError>;

/// Every protocol by its `--protocol` name.
pub const PROTOCOLS: &[(&str, Constructor)] = &[("serial", serial::start)];

/// Names accepted by `--protocol`.
pub fn names() -> Vec<&'static str> {
    PROTOCOLS.iter().map(|(n, _)| *n).collect()
}

pub(crate) fn start(name: &str, ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, ConfigError> {
    match PROTOCOLS.iter().find(|(n, _)| *n == name) {
        Some((_, ctor)) => ctor(ctx),
        None => Err(unknown_protocol(name)),
    }
}

/// The error for a `--protocol` name that is not implemented.
pub fn unknown_protocol(name: &str) -> ConfigError {
    ConfigError::new(
        "protocol.name",
        name,
        format!("unknown protocol; choose one of: {}", names().join(", ")),
    )
}
