//! An embedded cluster: every node of a cluster in one process.

use crate::history::HistoryRecorder;
use crate::protocol::{self, Engine, TxnRequest};
use qstore_core::partition::PartitionMap;
use qstore_core::txn::{Catalog, RowLoader};
use qstore_core::{NodeId, PartitionId, QError, RunConfig};
use qstore_net::NetCounters;
use qstore_storage::PartitionStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What every protocol gets to run on: configuration, catalog, partition map and the
/// partitions themselves (node `n` hosts partition `n`).
pub struct EngineCtx {
    pub cfg: RunConfig,
    pub catalog: Arc<Catalog>,
    pub pmap: PartitionMap,
    pub partitions: Vec<Arc<PartitionStore>>,
    /// Set when the run records its history (for `--verify` and `--history`).
    pub history: Option<Arc<HistoryRecorder>>,
}

impl EngineCtx {
    pub fn nodes(&self) -> u32 {
        self.cfg.cluster.nodes
    }

    #[inline]
    pub fn store(&self, p: PartitionId) -> &PartitionStore {
        &self.partitions[p.index()]
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
    /// Creates the partitions, loads them in parallel, and starts the configured protocol.
    /// With `record_history`, protocols record every transaction for the checkers.
    pub fn start(
        cfg: RunConfig,
        catalog: Arc<Catalog>,
        pmap: PartitionMap,
        load: &LoadFn<'_>,
        record_history: bool,
    ) -> Result<Cluster, QError> {
        cfg.validate()?;
        if !protocol::names().contains(&cfg.protocol.name.as_str()) {
            return Err(protocol::unknown_protocol(&cfg.protocol.name).into());
        }
        let started = Instant::now();
        let partitions = load_partitions(cfg.cluster.nodes, &catalog, load)?;
        let load_time = started.elapsed();
        let history = record_history.then(|| Arc::new(HistoryRecorder::new(pmap.clone())));
        let ctx = Arc::new(EngineCtx {
            history,
            pmap,
            catalog,
            partitions,
            cfg,
        });
        let engine = protocol::start(&ctx.cfg.protocol.name.clone(), ctx.clone())?;
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

    pub fn net_counters(&self) -> Option<&NetCounters> {
        self.engine.net_counters()
    }

    /// Stops the protocol's threads and hands back the data for inspection.
    pub fn stop(self) -> StoppedCluster {
        self.engine.shutdown();
        StoppedCluster { ctx: self.ctx }
    }
}

/// A cluster whose threads have stopped: its data can be inspected safely.
pub struct StoppedCluster {
    ctx: Arc<EngineCtx>,
}

impl StoppedCluster {
    /// Content hash of each partition, in partition order.
    pub fn partition_hashes(&self) -> Vec<u64> {
        self.ctx
            .partitions
            .iter()
            .map(|p| p.content_hash())
            .collect()
    }

    pub fn ctx(&self) -> &EngineCtx {
        &self.ctx
    }
}

/// Creates and loads every partition, several at a time (one thread per core).
pub(crate) fn load_partitions(
    nodes: u32,
    catalog: &Catalog,
    load: &LoadFn<'_>,
) -> Result<Vec<Arc<PartitionStore>>, QError> {
    let stores: Vec<Arc<PartitionStore>> = (0..nodes)
        .map(|p| Arc::new(PartitionStore::new(PartitionId(p), &catalog.tables)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.min(stores.len()))
            .map(|_| {
                s.spawn(|| -> Result<(), QError> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(store) = stores.get(i) else {
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
    Ok(stores)
}
