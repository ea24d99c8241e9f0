//! How a protocol reaches the other nodes: over the in-process transport when the whole
//! cluster runs in this process, over TCP when this process hosts one node of a distributed
//! cluster. Protocols only see the [`Transport`] trait and their nodes' inboxes.

use crate::cluster::{EngineCtx, Hosting};
use crossbeam_channel::{unbounded, Receiver};
use qstore_core::{NodeId, QError};
use qstore_net::{Envelope, Handshake, InProcNetwork, TcpConfig, TcpTransport, Transport};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Version of the node-to-node wire format; peers with another version are refused.
pub const WIRE_FORMAT_VERSION: u32 = 2;

/// A protocol's network: the transport, and the inbox of every node hosted here.
pub struct NodeNet<M> {
    pub transport: Arc<dyn Transport<M>>,
    pub inboxes: Vec<(NodeId, Receiver<Envelope<M>>)>,
}

/// Opens the network for messages of type `M`. In distributed mode this connects to every
/// peer and waits until all are up (or the configured timeout passes).
pub fn open<M>(ctx: &EngineCtx) -> Result<NodeNet<M>, QError>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    match &ctx.hosting {
        Hosting::Embedded => {
            let nodes = ctx.servers() as usize;
            let (net, inboxes) = InProcNetwork::<M>::new(nodes, &ctx.cfg.net, ctx.cfg.seed);
            Ok(NodeNet {
                transport: Arc::new(net),
                inboxes: inboxes
                    .into_iter()
                    .enumerate()
                    .map(|(n, rx)| (NodeId(n as u32), rx))
                    .collect(),
            })
        }
        Hosting::Node(_)
            if ctx.cfg.net.drop_fraction > 0.0 || ctx.cfg.net.cut_off_node.is_some() =>
        {
            Err(QError::Other(
                "net.drop_fraction and net.cut_off_node are injected by the embedded \
                 cluster's in-process transport only: leave them out of the cluster file \
                 (kill a server process instead)"
                    .into(),
            ))
        }
        Hosting::Node(node) => {
            let listener = node.listener.lock().take().ok_or_else(|| {
                QError::Other("the node's peer listener was already taken".into())
            })?;
            let handshake = Handshake {
                cluster_id: ctx.cfg.cluster.cluster_id,
                protocol: ctx.cfg.protocol.name.clone(),
                format_version: WIRE_FORMAT_VERSION,
                secret: node.secret.clone(),
            };
            let mut tcp = TcpConfig::new(node.me, node.peers.clone(), handshake);
            tcp.net = ctx.cfg.net.clone();
            tcp.seed = ctx.cfg.seed;
            tcp.handshake_timeout = Duration::from_secs_f64(ctx.cfg.server.handshake_timeout_s);
            let raft = ctx.cfg.replication.layer == qstore_core::config::ReplicationLayer::Raft;
            if ctx.placement.replicas() > 1 && raft {
                // Its instance is rebuilt from another's copies (see `replication::rebuild`).
                tcp.admit_restarted = true;
            } else if ctx.placement.replicas() > 1 {
                tcp.restart_advice = "with replication through ZooKeeper the other servers go \
                    on without it, but a server that lost its copy rejoins only with \
                    --replication-layer raft (whose instances are rebuilt from copies)"
                    .into();
            }
            let (tx, rx) = unbounded();
            let transport = TcpTransport::start(tcp, listener, tx, node.events.clone())?;
            let timeout = Duration::from_secs_f64(ctx.cfg.cluster.connect_timeout_s);
            let cancelled = || node.cancel.load(Ordering::Relaxed);
            // The transport's message names this node, the wait and the missing peers.
            transport
                .wait_connected_unless(timeout, &cancelled)
                .map_err(|e| {
                    if cancelled() {
                        QError::Interrupted(e)
                    } else if e.contains("restarted") {
                        QError::Other(e)
                    } else {
                        QError::Other(format!(
                            "{e}; start every node of the cluster file \
                             (cluster.connect_timeout_s sets how long to wait)"
                        ))
                    }
                })?;
            Ok(NodeNet {
                transport: Arc::new(transport),
                inboxes: vec![(node.me, rx)],
            })
        }
    }
}
