//! Replication of partitions (QR-Store): every partition has a replica group, one copy per
//! cluster instance (see [`qstore_core::placement`]), and each group keeps a log with raft.
//! A protocol that replicates proposes what it must replicate to its group's log and is told
//! of every committed entry on every member ([`member::Applier`]); raft's messages travel in
//! the protocol's own messages over the protocol's transport.
//!
//! The log sits behind [`log::LogStore`]: in memory ([`MemLog`]), or, for a server with a
//! data directory, on disk ([`DiskLog`]), which is then also the deterministic protocols'
//! command log (a server without copies runs a group of one); its entries may be compressed
//! ([`codec`]).

pub mod codec;
pub mod dedup;
pub mod disk;
pub mod log;
pub mod member;
pub mod rebuild;
pub mod stall;
pub mod zookeeper;

pub use dedup::Dedup;
pub use disk::DiskLog;
pub use log::{LogStore, MemLog};
pub use member::{Applier, GroupMember, Outbox};
pub use stall::StallWatch;

use crate::cluster::EngineCtx;
use crate::data_dir::{fsync_policy, DataDir};
use crate::protocol::{reply, TxnRequest};
use qstore_core::placement::Placement;
use qstore_core::txn::TxnOutcome;
use qstore_core::{NodeId, PartitionId, QError};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A replica group's log as a protocol that numbers its own entries (Calvin's epochs) uses it,
/// whatever keeps it: raft among the group's members ([`GroupMember`]), or an external
/// coordination service that the members use as clients (ZooKeeper, as Calvin's paper does).
/// Every member is told of every committed entry, in log order, through the protocol's
/// [`Applier`].
pub trait GroupLog: Send + Sync + 'static {
    /// The term in which this member leads its group and may propose, having applied every
    /// entry of earlier terms; `None` when it does not lead.
    fn leading_term(&self) -> Option<u64>;
    /// Proposes an entry, only if this member still leads in `term` when its turn comes (a
    /// proposal lost between two kept ones would leave a gap in the protocol's numbering).
    fn propose_in_term(&self, term: u64, data: Vec<u8>);
    /// A message from another member of the group, as the protocol's transport delivered it
    /// (a log kept outside the group has none, and refuses it).
    fn receive(&self, from: NodeId, msg: ReplMsg);
    /// Whether nothing is left to replicate or apply that this member can see.
    fn settled(&self) -> bool;
    /// Where the member is in a log whose entries every member numbers alike: the last
    /// entry it applied and the last it knows committed (`None` for a log that does not).
    fn position(&self) -> Option<(u64, u64)> {
        None
    }
    /// Stops the member's threads.
    fn stop(&self);
}

impl GroupLog for GroupMember {
    fn leading_term(&self) -> Option<u64> {
        GroupMember::leading_term(self)
    }

    fn propose_in_term(&self, term: u64, data: Vec<u8>) {
        GroupMember::propose_in_term(self, term, data)
    }

    fn receive(&self, from: NodeId, msg: ReplMsg) {
        GroupMember::receive(self, from, msg)
    }

    fn settled(&self) -> bool {
        GroupMember::settled(self)
    }

    fn position(&self) -> Option<(u64, u64)> {
        Some(GroupMember::position(self))
    }

    fn stop(&self) {
        GroupMember::stop(self)
    }
}

impl GroupLog for Box<dyn GroupLog> {
    fn leading_term(&self) -> Option<u64> {
        (**self).leading_term()
    }

    fn propose_in_term(&self, term: u64, data: Vec<u8>) {
        (**self).propose_in_term(term, data)
    }

    fn receive(&self, from: NodeId, msg: ReplMsg) {
        (**self).receive(from, msg)
    }

    fn settled(&self) -> bool {
        (**self).settled()
    }

    fn position(&self) -> Option<(u64, u64)> {
        (**self).position()
    }

    fn stop(&self) {
        (**self).stop()
    }
}

impl From<GroupMember> for Box<dyn GroupLog> {
    fn from(m: GroupMember) -> Self {
        Box::new(m)
    }
}

/// A raft message between members of a group, in raft's own (protobuf) encoding (postcard
/// writes a `Vec<u8>` as its length and its bytes).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplMsg(pub Vec<u8>);

/// Longest raft message a member accepts (a frame of the TCP transport holds it).
pub const MAX_RAFT_MESSAGE: usize = qstore_net::frame::DEFAULT_MAX_FRAME / 2;

/// Hands a raft message the transport delivered to server `me`'s group member; a server
/// without one (its partitions are not replicated, or it is still joining its group: a peer
/// that started first may already be calling an election) logs it and drops it; raft sends
/// again what matters.
pub(crate) fn deliver(member: Option<&impl GroupLog>, me: NodeId, from: NodeId, msg: ReplMsg) {
    match member {
        Some(m) => m.receive(from, msg),
        None => tracing::warn!(
            "node {me}: a replication message from node {from} dropped: this server has no \
             group member (yet)"
        ),
    }
}

/// How long a replicated cluster waits at start for every group to elect its leader.
const ELECTION_WAIT: Duration = Duration::from_secs(30);

/// Starts the group member of every server hosted here (`local`: the server, the protocol's
/// applier for it, and where the server keeps its member), each sending its raft messages
/// through `outbox(server)`, and waits until every group of those servers has a leader.
/// Instance 0's members call the first elections, so a cluster has leaders without waiting
/// for an election timeout.
pub(crate) fn join_groups(
    ctx: &EngineCtx,
    local: Vec<(
        NodeId,
        Arc<dyn Applier>,
        &OnceLock<impl From<GroupMember> + GroupLog>,
    )>,
    outbox: impl Fn(NodeId) -> Outbox,
) -> Result<(), QError> {
    let placement = &ctx.placement;
    let stop = || {
        for (_, _, m) in &local {
            if let Some(m) = m.get() {
                m.stop();
            }
        }
    };
    for (me, applier, seat) in &local {
        let voters: Vec<u64> = placement
            .group(placement.partition_of(*me))
            .map(|n| n.0 as u64 + 1)
            .collect();
        let campaign = placement.instance_of(*me) == 0;
        let cfg = &ctx.cfg.replication;
        // A macro, not a closure: the two logs are different types.
        macro_rules! start {
            ($log:expr) => {
                GroupMember::start(
                    *me,
                    placement.clone(),
                    cfg,
                    $log,
                    outbox(*me),
                    applier.clone(),
                    campaign,
                )
            };
        }
        let started = match &ctx.data_dirs[me.index()] {
            None => start!(MemLog::new(voters)),
            Some(dir) => open_disk_log(ctx, *me, dir, voters).and_then(|log| start!(log)),
        };
        match started {
            Ok(m) => {
                let _ = seat.set(m.into());
            }
            Err(e) => {
                stop();
                return Err(e);
            }
        }
    }
    // The groups of the servers hosted here (a server process knows only its own group's
    // leader).
    let deadline = Instant::now() + ELECTION_WAIT;
    let leaderless = || {
        local
            .iter()
            .map(|(me, _, _)| placement.partition_of(*me))
            .find(|&p| placement.leader(p).is_none())
    };
    while let Some(p) = leaderless() {
        if Instant::now() > deadline {
            stop();
            return Err(QError::Other(format!(
                "replica group of partition {p} elected no leader in {ELECTION_WAIT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Opens server `me`'s group log in its data directory.
fn open_disk_log(
    ctx: &EngineCtx,
    me: NodeId,
    dir: &DataDir,
    voters: Vec<u64>,
) -> Result<DiskLog, QError> {
    if dir.existed() {
        tracing::info!("node {me}: recovering from {}", dir.path().display());
    }
    let log = DiskLog::open(&dir.group_log(), voters, fsync_policy(&ctx.cfg))?;
    dir.add_log(log.stats_reader());
    Ok(log)
}

/// Where a transaction submitted for partition `home` goes: without replication, server
/// `home`; with it, the leader of `home`'s group, if `hosted` here. Otherwise the request is
/// answered (`NotLeader`, naming the leader if one is known, so the client goes there; or
/// `Rejected` for a partition that does not exist) and `None` returned.
pub(crate) fn route(
    placement: &Placement,
    home: NodeId,
    hosted: impl Fn(NodeId) -> bool,
    req: &TxnRequest,
) -> Option<NodeId> {
    if placement.replicas() == 1 {
        return Some(home);
    }
    let p = PartitionId(home.0);
    if p.0 >= placement.partitions() {
        reply(req, TxnOutcome::Rejected(format!("no partition {p}")));
        return None;
    }
    match placement.leader(p) {
        // Led here (in a server process: by this server).
        Some(leader) if hosted(leader) => Some(leader),
        // Led elsewhere, or an election is under way: the client goes to the leader.
        leader => {
            reply(req, TxnOutcome::NotLeader { leader });
            None
        }
    }
}
