//! An embedded cluster: every node of a cluster in one process.

use crate::data_dir::DataDir;
use crate::history::HistoryRecorder;
use crate::protocol::{self, Engine, TxnRequest};
use crossbeam_channel::Sender;
use parking_lot::Mutex;
use qstore_core::partition::PartitionMap;
use qstore_core::placement::Placement;
use qstore_core::txn::{Catalog, RowLoader};
use qstore_core::{NodeId, PartitionId, QError, RunConfig};
use qstore_net::auth::ClusterSecret;
use qstore_net::{NetCounters, PeerEvent};
use qstore_storage::PartitionStore;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which nodes of the cluster this process hosts.
pub enum Hosting {
    /// All of them, over the in-process transport.
    Embedded,
    /// One node of a distributed cluster, reaching its peers over TCP.
    Node(NodeHosting),
}

pub struct NodeHosting {
    pub me: NodeId,
    /// Every node's peer address, by node id (this node's included).
    pub peers: Vec<SocketAddr>,
    /// This node's peer listener, bound by the caller (so a bad address fails before
    /// loading); taken by the protocol's network when it starts.
    pub listener: Mutex<Option<TcpListener>>,
    /// Where peer connections going up and down are reported.
    pub events: Option<Sender<PeerEvent>>,
    /// The cluster's secret, which every peer must prove it holds.
    pub secret: ClusterSecret,
    /// Set when the process is asked to stop: a node still waiting for its peers gives up.
    pub cancel: Arc<AtomicBool>,
}

/// What every protocol gets to run on: configuration, catalog, partition map, placement map
/// and the partition copies hosted here.
pub struct EngineCtx {
    pub cfg: RunConfig,
    pub catalog: Arc<Catalog>,
    /// Which partition holds a key.
    pub pmap: PartitionMap,
    /// Which servers hold each partition, and which of them leads.
    pub placement: Arc<Placement>,
    /// By server (node) id: the partition copy it holds; `None` for servers other processes
    /// host.
    pub partitions: Vec<Option<Arc<PartitionStore>>>,
    pub hosting: Hosting,
    /// Set when the run records its history (for `--verify` and `--history`). With
    /// replication, cluster instance 0's (see `histories`).
    pub history: Option<Arc<HistoryRecorder>>,
    /// When the run records its history: by cluster instance hosted here, the history of
    /// what it ran (every instance runs every committed transaction).
    pub histories: Vec<Arc<HistoryRecorder>>,
    /// By server id: the data directory of a server hosted here that keeps one.
    pub data_dirs: Vec<Option<DataDir>>,
}

impl EngineCtx {
    /// What the logs of the servers hosted here did since they started; `None` without data
    /// directories.
    pub fn log_stats(&self) -> Option<qstore_log::LogStats> {
        let dirs = self.data_dirs.iter().flatten();
        dirs.map(DataDir::log_stats)
            .reduce(qstore_log::LogStats::plus)
    }

    /// Partitions of the database: the nodes of one cluster instance.
    pub fn nodes(&self) -> u32 {
        self.cfg.cluster.nodes
    }

    /// Whether the protocol's input goes through its replica groups' logs: with copies to
    /// keep, or a data directory to log to (a group of one server then).
    pub fn logged(&self) -> bool {
        self.placement.replicas() > 1 || self.cfg.is_durable()
    }

    /// How many times the servers hosted here started with their data directories before
    /// (0 without): transaction ids carry it, so that those of this start differ from the
    /// ones a recovered log holds. It wraps after [`MAX_GENERATIONS`] starts.
    pub fn generation(&self) -> u64 {
        let starts = self.data_dirs.iter().flatten().map(DataDir::earlier_starts);
        starts.max().unwrap_or(0) % MAX_GENERATIONS
    }

    /// Servers of the cluster: every copy of every partition.
    pub fn servers(&self) -> u32 {
        self.placement.servers()
    }

    /// Where server `s` records the run's history: its cluster instance's recorder.
    #[inline]
    pub fn history_of(&self, s: NodeId) -> Option<&HistoryRecorder> {
        let instance = match self.hosting {
            Hosting::Embedded => self.placement.instance_of(s) as usize,
            Hosting::Node(_) => 0,
        };
        self.histories.get(instance).map(|h| &**h)
    }

    /// The history to check after a run: with replication, that of the first cluster
    /// instance in service throughout (every instance records what it runs; one out of
    /// service may hold what no log committed, and a rebuilt one lacks what ran before its
    /// copy). A server process has its own part only.
    pub fn history_in_service(&self) -> Option<&Arc<HistoryRecorder>> {
        let p = &self.placement;
        let first = match self.hosting {
            Hosting::Embedded => (0..p.replicas())
                .find(|&i| !p.is_stale(i) && !p.is_rebuilt(i))
                .unwrap_or(0),
            Hosting::Node(_) => 0,
        };
        self.histories.get(first as usize)
    }

    /// The nodes this process hosts.
    pub fn local_nodes(&self) -> Vec<NodeId> {
        match &self.hosting {
            Hosting::Embedded => (0..self.servers()).map(NodeId).collect(),
            Hosting::Node(n) => vec![n.me],
        }
    }

    /// The node holding partition `p`, for protocols that do not replicate (one copy of each
    /// partition: node `p` holds partition `p`).
    #[inline]
    pub fn node_of(&self, p: PartitionId) -> NodeId {
        debug_assert_eq!(self.placement.replicas(), 1);
        self.placement.server(0, p)
    }

    pub fn is_distributed(&self) -> bool {
        matches!(self.hosting, Hosting::Node(_))
    }

    /// The partition copy node `n` holds, hosted here. Protocols reach other nodes by message
    /// only, so asking for one hosted elsewhere is a bug.
    #[inline]
    pub fn server_store(&self, n: NodeId) -> &PartitionStore {
        match &self.partitions[n.index()] {
            Some(store) => store,
            None => panic!("node {n} is not hosted in this process"),
        }
    }

    /// Partition `p`, hosted here, for protocols that do not replicate (see `node_of`).
    #[inline]
    pub fn store(&self, p: PartitionId) -> &PartitionStore {
        self.server_store(self.node_of(p))
    }

    /// The partitions hosted here.
    pub fn hosted(&self) -> impl Iterator<Item = &Arc<PartitionStore>> {
        self.partitions.iter().flatten()
    }
}

/// Loads the initial rows of one partition; given by the workload.
pub type LoadFn<'a> = dyn Fn(PartitionId, &mut dyn RowLoader) -> Result<(), QError> + Sync + 'a;

/// A running cluster.
pub struct Cluster {
    ctx: Arc<EngineCtx>,
    engine: Box<dyn Engine>,
    load_time: Duration,
}

impl Cluster {
    /// Creates the partitions, loads them in parallel, and starts the configured protocol on
    /// every node, in this process. With `record_history`, protocols record every
    /// transaction for the checkers.
    pub fn start(
        cfg: RunConfig,
        catalog: Arc<Catalog>,
        pmap: PartitionMap,
        load: &LoadFn<'_>,
        record_history: bool,
    ) -> Result<Cluster, QError> {
        Self::start_hosting(cfg, catalog, pmap, load, record_history, Hosting::Embedded)
    }

    /// Starts the nodes `hosting` names: all of them, or one node of a distributed cluster
    /// (which loads only its partition and connects to its peers before it returns).
    pub fn start_hosting(
        cfg: RunConfig,
        catalog: Arc<Catalog>,
        pmap: PartitionMap,
        load: &LoadFn<'_>,
        record_history: bool,
        hosting: Hosting,
    ) -> Result<Cluster, QError> {
        if !protocol::names().contains(&cfg.protocol.name.as_str()) {
            return Err(protocol::unknown_protocol(&cfg.protocol.name).into());
        }
        let start = |ctx: Arc<EngineCtx>| protocol::start(&ctx.cfg.protocol.name.clone(), ctx);
        Self::start_engine(cfg, catalog, pmap, load, record_history, hosting, &start)
    }

    /// [`Cluster::start_hosting`] with the engine `start` makes (tests run variants of a
    /// protocol that the registry does not offer, e.g. with a check switched off).
    pub(crate) fn start_engine(
        cfg: RunConfig,
        catalog: Arc<Catalog>,
        pmap: PartitionMap,
        load: &LoadFn<'_>,
        record_history: bool,
        hosting: Hosting,
        start: &dyn Fn(Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError>,
    ) -> Result<Cluster, QError> {
        cfg.validate()?;
        let started = Instant::now();
        let placement = Arc::new(Placement::new(cfg.cluster.nodes, cfg.replication.factor));
        let local: Vec<NodeId> = match &hosting {
            Hosting::Embedded => (0..placement.servers()).map(NodeId).collect(),
            Hosting::Node(n) => vec![n.me],
        };
        let mut cfg = cfg;
        cfg.cluster.resolve_workers(local.len() as u32);
        // A protocol that moves records between nodes may gather any of them on one node.
        let moves = protocol::info(&cfg.protocol.name).is_some_and(|p| p.moves_records);
        let room = if moves {
            placement.servers() as usize
        } else {
            1
        };
        let partitions = load_partitions(&placement, &local, &catalog, load, room)?;
        let data_dirs = open_data_dirs(&cfg, &partitions)?;
        let load_time = started.elapsed();
        // One recorder per cluster instance hosted here: each records what it runs.
        let instances = match hosting {
            Hosting::Embedded => placement.replicas(),
            Hosting::Node(_) => 1,
        };
        let histories: Vec<Arc<HistoryRecorder>> = (0..instances)
            .filter(|_| record_history)
            .map(|_| {
                Arc::new(match hosting {
                    Hosting::Embedded => HistoryRecorder::new(pmap.clone()),
                    Hosting::Node(_) => HistoryRecorder::deferred(pmap.clone()),
                })
            })
            .collect();
        let ctx = Arc::new(EngineCtx {
            history: histories.first().cloned(),
            histories,
            pmap,
            placement,
            catalog,
            partitions,
            hosting,
            cfg,
            data_dirs,
        });
        if ctx.generation() + 1 == MAX_GENERATIONS {
            tracing::warn!(
                "the data directories have seen {MAX_GENERATIONS} starts: transaction ids of the \
                 next start repeat those of the first"
            );
        }
        let engine = start(ctx.clone())?;
        Ok(Cluster {
            ctx,
            engine,
            load_time,
        })
    }

    pub fn ctx(&self) -> &EngineCtx {
        &self.ctx
    }

    /// How long loading the initial data took.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// Submits a transaction at node `home`; never blocks.
    #[inline]
    pub fn submit(&self, home: NodeId, req: TxnRequest) {
        self.engine.submit(home, req)
    }

    /// Submits several transactions at node `home` together (see [`Engine::submit_all`]).
    pub fn submit_all(&self, home: NodeId, reqs: Vec<TxnRequest>) {
        self.engine.submit_all(home, reqs)
    }

    pub fn net_counters(&self) -> Option<&NetCounters> {
        self.engine.net_counters()
    }

    /// Waits until the epochs or batches the nodes recovered from their data directories have
    /// run (see [`Engine::recovered`]), for at most `limit`; returns whether they have.
    pub fn wait_recovered(&self, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while !self.engine.recovered() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        true
    }

    /// The protocol's own event counts so far (see `Engine::counters`).
    pub fn protocol_counters(&self) -> crate::protocol::ProtocolCounters {
        self.engine.counters()
    }

    /// Time per stage of a transaction's life, for protocols that measure it.
    pub fn stages(&self) -> Option<crate::stages::StageSnapshot> {
        self.engine.stages()
    }

    /// Where each node's worker threads spent their time so far, for protocols that account
    /// it (see `Engine::worker_time`).
    pub fn worker_time(&self) -> Vec<(NodeId, crate::stages::StageTotals)> {
        self.engine.worker_time()
    }

    /// Stops the protocol's threads where the cluster is shared (a server's connections hold
    /// it); requests still queued are answered `Rejected`.
    pub fn shutdown(&self) {
        self.engine.shutdown();
    }

    /// Stops the protocol's threads and hands back the data for inspection.
    pub fn stop(self) -> StoppedCluster {
        self.engine.shutdown();
        StoppedCluster {
            audit: self.engine.audit(),
            ctx: self.ctx,
        }
    }

    /// The protocol's account of the nodes hosted here (see [`Engine::audit`]).
    pub fn audit(&self) -> Option<Vec<u8>> {
        self.engine.audit()
    }
}

/// A cluster whose threads have stopped: its data can be inspected safely.
pub struct StoppedCluster {
    ctx: Arc<EngineCtx>,
    audit: Option<Vec<u8>>,
}

impl StoppedCluster {
    /// The protocol's own end-of-run check over every node (LEAP: record ownership), for
    /// protocols that keep one.
    pub fn protocol_check(&self) -> Option<Result<String, String>> {
        let parts = std::slice::from_ref(self.audit.as_ref()?);
        protocol::check_audits(&self.ctx.cfg.protocol.name, &self.ctx.pmap, parts)
    }

    /// Content hash of each partition copy hosted here, in node order (instance by instance
    /// with replication).
    pub fn partition_hashes(&self) -> Vec<u64> {
        self.ctx.hosted().map(|p| p.content_hash()).collect()
    }

    /// The content hash of all the data hosted here as one partition: the same wherever
    /// its records live (LEAP moves them between nodes).
    pub fn data_hash(&self) -> u64 {
        let mut all = Vec::new();
        for p in self.ctx.hosted() {
            let sums = p.content_sums();
            all.resize(sums.len(), qstore_storage::ContentSum::default());
            all.iter_mut().zip(sums).for_each(|(a, s)| a.add(s));
        }
        qstore_storage::content_hash_of(&all)
    }

    pub fn ctx(&self) -> &EngineCtx {
        &self.ctx
    }
}

/// Starts whose transaction ids differ (see [`EngineCtx::generation`]).
pub const MAX_GENERATIONS: u64 = 128;

/// Opens the data directory of every server hosted here (its partition just loaded, by
/// server id) that keeps one.
fn open_data_dirs(
    cfg: &RunConfig,
    partitions: &[Option<Arc<PartitionStore>>],
) -> Result<Vec<Option<DataDir>>, QError> {
    let open = |(s, p): (usize, &Option<Arc<PartitionStore>>)| {
        let (Some(p), Some(path)) = (p, cfg.data_dir_of(s as u32)) else {
            return Ok(None);
        };
        DataDir::open(&path, cfg, s as u32, p.content_hash()).map(Some)
    };
    partitions.iter().enumerate().map(open).collect()
}

/// Creates and loads the partition copies of the nodes in `local`, several at a time (one
/// thread per core), each with `room` times its tables' rows of room. By node id.
pub(crate) fn load_partitions(
    placement: &Placement,
    local: &[NodeId],
    catalog: &Catalog,
    load: &LoadFn<'_>,
    room: usize,
) -> Result<Vec<Option<Arc<PartitionStore>>>, QError> {
    let stores: Vec<(NodeId, Arc<PartitionStore>)> = local
        .iter()
        .map(|&n| {
            let p = placement.partition_of(n);
            (
                n,
                Arc::new(PartitionStore::with_room(p, &catalog.tables, room)),
            )
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.min(stores.len()))
            .map(|_| {
                s.spawn(|| -> Result<(), QError> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((_, store)) = stores.get(i) else {
                            return Ok(());
                        };
                        let mut loader: &PartitionStore = store;
                        load(store.id, &mut loader)?;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("loader thread panicked"))
    })?;
    let mut by_node: Vec<Option<Arc<PartitionStore>>> =
        (0..placement.servers()).map(|_| None).collect();
    for (n, s) in stores {
        by_node[n.index()] = Some(s);
    }
    Ok(by_node)
}
