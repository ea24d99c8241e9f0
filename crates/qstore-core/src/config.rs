//! The run configuration: one typed tree, read from TOML (`--config`), overridden by command
//! line flags, validated once, then passed explicitly to every layer.
//!
//! Counts that may be "unbounded" or "automatic" use 0 for that meaning, so that the whole
//! tree, defaults included, prints as TOML (`qstore config --default`).

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};
use std::net::ToSocketAddrs;

/// Everything one run needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Seed of every random choice of the run.
    pub seed: u64,
    pub cluster: ClusterConfig,
    pub protocol: ProtocolConfig,
    pub workload: WorkloadConfig,
    pub client: ClientConfig,
    pub net: NetConfig,
    pub server: ServerConfig,
    pub replication: ReplicationConfig,
    pub durability: DurabilityConfig,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            seed: 42,
            cluster: ClusterConfig::default(),
            protocol: ProtocolConfig::default(),
            workload: WorkloadConfig::default(),
            client: ClientConfig::default(),
            net: NetConfig::default(),
            server: ServerConfig::default(),
            replication: ReplicationConfig::default(),
            durability: DurabilityConfig::default(),
        }
    }
}

/// Limits of a server's client endpoint (distributed mode).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Most client connections open at once; one more is refused with the reason. 0 sizes it
    /// for the machine: 4096, or fewer when the process may open fewer files.
    pub max_clients: u32,
    /// A client connection with no transaction in flight that sends no complete request for
    /// this long is closed.
    pub client_idle_timeout_s: f64,
    /// Time a new connection (client or peer) has to complete its handshake, from connecting
    /// to being welcomed; one deadline, not a timeout per read.
    pub handshake_timeout_s: f64,
    /// Threads serving client connections (each serves many, over non-blocking sockets).
    /// 0 = one per 4 cores, at least 1.
    pub io_threads: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_clients: 0,
            client_idle_timeout_s: 600.0,
            handshake_timeout_s: 5.0,
            io_threads: 0,
        }
    }
}

impl ServerConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.max_clients <= 1_000_000,
            "server.max_clients",
            self.max_clients,
            "must be at most 1000000 (0 = sized for the machine)",
        )?;
        check(
            self.client_idle_timeout_s >= 0.1 && self.client_idle_timeout_s <= 86_400.0,
            "server.client_idle_timeout_s",
            self.client_idle_timeout_s,
            "must be between 0.1 and 86400 seconds",
        )?;
        check(
            self.handshake_timeout_s >= 0.05 && self.handshake_timeout_s <= 600.0,
            "server.handshake_timeout_s",
            self.handshake_timeout_s,
            "must be between 0.05 and 600 seconds",
        )?;
        check(
            self.io_threads <= 64,
            "server.io_threads",
            self.io_threads,
            "must be at most 64 (0 = one per 4 cores)",
        )
    }

    /// The I/O thread count to use.
    pub fn io_threads(&self) -> usize {
        match self.io_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get().div_ceil(4)),
            n => n as usize,
        }
    }
}

/// How keys map to partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Partitioning {
    /// Contiguous key ranges: partition = key / keys-per-partition (the papers' default).
    Range,
    /// Scattered: partition = key mod partitions.
    Hash,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Number of nodes; each hosts one partition.
    pub nodes: u32,
    /// Worker threads per node (protocols that run one thread per partition ignore it);
    /// 0 = as many as the machine has cores, shared among the nodes one machine hosts (see
    /// [`ClusterConfig::resolve_workers`]).
    pub workers: u32,
    pub partitioning: Partitioning,
    /// Pin worker threads to cores.
    pub pin_threads: bool,
    /// Distributed mode (a cluster file): where each node listens, by node id. Empty for an
    /// embedded cluster.
    pub addresses: Vec<NodeAddress>,
    /// Distributed mode: an id every process of the cluster must share (peers and clients
    /// of another cluster are refused).
    pub cluster_id: u64,
    /// Distributed mode: how long a starting server waits for all its peers.
    pub connect_timeout_s: f64,
    /// Distributed mode: a file holding the cluster's secret (at least 16 bytes, readable only
    /// by its owner), which every server and client proves it holds when it connects. A
    /// relative path is relative to the cluster file. `qstore secret FILE` makes one;
    /// `qstore cluster` makes one for its run.
    pub secret_file: String,
    /// The determinism study's slow node (its section 3.5): this node runs as if
    /// `slow_threads` CPU-bound threads shared its cores from `slow_from_s` seconds after
    /// the cluster started (see the engine's `runtime::Pace`).
    pub slow_node: Option<u32>,
    pub slow_threads: u32,
    pub slow_from_s: f64,
}

/// Where one node of a distributed cluster listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeAddress {
    /// For the other nodes, e.g. "127.0.0.1:7100".
    pub peer: String,
    /// For clients, e.g. "127.0.0.1:7200".
    pub client: String,
    /// The server's data directory (see [`DurabilityConfig`]); "" = the one
    /// `durability.data_dir` gives it, if any. A relative path is relative to the cluster
    /// file.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data_dir: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            nodes: 4,
            workers: 0,
            partitioning: Partitioning::Range,
            pin_threads: false,
            addresses: Vec::new(),
            cluster_id: 0,
            connect_timeout_s: 30.0,
            secret_file: String::new(),
            slow_node: None,
            slow_threads: 0,
            slow_from_s: 0.0,
        }
    }
}

impl ClusterConfig {
    /// Whether this describes a distributed cluster (one process per node).
    pub fn is_distributed(&self) -> bool {
        !self.addresses.is_empty()
    }

    /// Checks the addresses of a distributed cluster of `servers` servers (`nodes` times the
    /// replication factor): one per server, each a valid socket address, no two the same (a
    /// server's peer and client addresses included). Resolved addresses in server order:
    /// (peer, client).
    pub fn socket_addresses(
        &self,
        servers: u32,
    ) -> Result<Vec<(std::net::SocketAddr, std::net::SocketAddr)>, ConfigError> {
        if self.addresses.len() != servers as usize {
            let why = if servers == self.nodes {
                format!(
                    "a distributed cluster needs one address entry per node ({} nodes)",
                    self.nodes
                )
            } else {
                format!(
                    "a replicated cluster needs one address entry per server ({} nodes x {} \
                     copies = {servers} servers, instance after instance)",
                    self.nodes,
                    servers / self.nodes.max(1)
                )
            };
            return Err(ConfigError::new(
                "cluster.addresses",
                self.addresses.len(),
                why,
            ));
        }
        let parse = |i: usize, which: &str, a: &str| {
            a.parse().map_err(|_| {
                ConfigError::new(
                    &format!("cluster.addresses[{i}].{which}"),
                    a,
                    "must be an IP address and port, e.g. 127.0.0.1:7100",
                )
            })
        };
        let addrs: Vec<_> = self
            .addresses
            .iter()
            .enumerate()
            .map(|(i, a)| Ok((parse(i, "peer", &a.peer)?, parse(i, "client", &a.client)?)))
            .collect::<Result<_, ConfigError>>()?;
        // Two listeners cannot share an address: the second server (or the second listener of
        // one server) would fail to start, or one node would take another's connections.
        let mut seen = std::collections::HashMap::new();
        for (i, (peer, client)) in addrs.iter().enumerate() {
            for (which, addr) in [("peer", peer), ("client", client)] {
                let entry = format!("cluster.addresses[{i}].{which}");
                if let Some(first) = seen.insert(*addr, entry.clone()) {
                    return Err(ConfigError::new(
                        &entry,
                        addr,
                        format!(
                            "is also {first}; every node needs its own peer and client addresses"
                        ),
                    ));
                }
            }
        }
        Ok(addrs)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProtocolConfig {
    /// Protocol name (`qstore protocols` lists them); Q-Store by default.
    pub name: String,
    /// Capacity of each node's client admission queue; a full queue refuses new transactions.
    pub admission_queue: u32,
    pub qstore: QStoreConfig,
    pub calvin: CalvinConfig,
    pub mvcc: MvccConfig,
    pub dl_detect: DlDetectConfig,
    pub sundial: SundialConfig,
    /// Nondeterministic protocols: a node that falls behind (work from other nodes piles up
    /// in its inbox) refuses a growing random share of its single-partition transactions,
    /// which their clients retry (the determinism study's throttling, figure 5b).
    pub throttle: bool,
}

impl ProtocolConfig {
    /// Whether the protocol needs every transaction's read/write set before it runs it (its
    /// deterministic locking or planning): a transaction whose keys depend on data then goes
    /// through OLLP.
    pub fn plans_up_front(&self) -> bool {
        matches!(self.name.as_str(), "qstore" | "calvin")
    }
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        ProtocolConfig {
            name: "qstore".into(),
            admission_queue: 65_536,
            qstore: QStoreConfig::default(),
            calvin: CalvinConfig::default(),
            mvcc: MvccConfig::default(),
            dl_detect: DlDetectConfig::default(),
            sundial: SundialConfig::default(),
            throttle: false,
        }
    }
}

/// How Q-Store executes transactions that may abort (logic-induced aborts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QStoreMode {
    /// Fragments wait before touching a record written by a transaction that may still
    /// abort: no cascading aborts.
    Conservative,
    /// Fragments read uncommitted writes and aborts cascade to their readers.
    Speculative,
}

/// Isolation level of Q-Store transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    Serializable,
    /// Read-only transactions run in queues of their own, beside the writers, and read the
    /// committed state (copies of records taken before in-flight batches wrote them).
    ReadCommitted,
}

/// Knobs of the Q-Store protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QStoreConfig {
    /// Execution paradigm for transactions that may abort. Programs that cannot abort run
    /// the same way in both.
    pub mode: QStoreMode,
    pub isolation: Isolation,
    /// Most transactions a planner puts in one batch (count-based demarcation; batches close
    /// earlier when a worker is idle, see `close_when_idle`).
    pub batch_size: u32,
    /// A planner closes its batch after this many microseconds even if it is not full
    /// (time-based demarcation; also what keeps an idle cluster moving).
    pub batch_timeout_us: u64,
    /// A worker that finds nothing to execute closes its planner's batch at once, however
    /// few transactions it holds: batches then grow with the load (full under heavy load,
    /// small and quick under light load). Off: batches close only when full or timed out,
    /// the paper's count-based demarcation.
    pub close_when_idle: bool,
    /// Execution queues each planner fills per node (0 = one per worker thread).
    pub eqs_per_planner: u32,
    /// Batches a node may have in flight at once (the ring of batch slots); 1 is a
    /// node-level barrier between batches.
    pub pipeline_depth: u32,
    /// Planners per node (0 = one per worker).
    pub planners: u32,
    /// Run planners on threads of their own that do not execute (the split mode); otherwise
    /// workers plan, then execute, as in the paper.
    pub dedicated_planners: bool,
}

impl Default for QStoreConfig {
    fn default() -> Self {
        QStoreConfig {
            mode: QStoreMode::Speculative,
            isolation: Isolation::Serializable,
            batch_size: 128,
            batch_timeout_us: 1_000,
            close_when_idle: true,
            eqs_per_planner: 0,
            pipeline_depth: 2,
            planners: 0,
            dedicated_planners: false,
        }
    }
}

impl ClusterConfig {
    /// Turns `workers = 0` into a number: the machine's cores divided among the
    /// `nodes_here` nodes that share it (all of an embedded cluster's, or of a local
    /// multi-process one), at least one each. Other values stay as they are.
    pub fn resolve_workers(&mut self, nodes_here: u32) {
        if self.workers == 0 {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
            self.workers = (cores / nodes_here.max(1)).clamp(1, 256);
        }
    }
}

impl QStoreConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            (1..=1_000_000).contains(&self.batch_size),
            "protocol.qstore.batch_size",
            self.batch_size,
            "must be between 1 and 1000000",
        )?;
        check(
            (10..=10_000_000).contains(&self.batch_timeout_us),
            "protocol.qstore.batch_timeout_us",
            self.batch_timeout_us,
            "must be between 10 and 10000000 microseconds",
        )?;
        check(
            self.eqs_per_planner <= 4096,
            "protocol.qstore.eqs_per_planner",
            self.eqs_per_planner,
            "must be at most 4096 (0 = one per worker)",
        )?;
        check(
            (1..=64).contains(&self.pipeline_depth),
            "protocol.qstore.pipeline_depth",
            self.pipeline_depth,
            "must be between 1 and 64",
        )?;
        check(
            self.planners <= 256,
            "protocol.qstore.planners",
            self.planners,
            "must be at most 256 (0 = one per worker)",
        )
    }

    /// Planners per node for `workers` workers per node.
    pub fn planners_per_node(&self, workers: u32) -> u32 {
        if self.planners == 0 {
            workers
        } else {
            self.planners
        }
    }
}

/// Which lock manager Calvin's scheduler uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CalvinLocks {
    /// A hash table of per-record FIFO queues of shared and exclusive requests.
    LockTable,
    /// Very lightweight locking: per-record request counters and one queue of transactions,
    /// with selective contention analysis.
    Vll,
}

/// Knobs of the MVCC protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MvccConfig {
    /// Older versions kept per row, besides the current one; a read that needs an older
    /// version than those kept aborts (`version_reclaimed`).
    pub max_versions: u32,
}

impl Default for MvccConfig {
    fn default() -> Self {
        MvccConfig { max_versions: 4 }
    }
}

impl MvccConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            (1..=64).contains(&self.max_versions),
            "protocol.mvcc.max_versions",
            self.max_versions,
            "must be between 1 and 64",
        )
    }
}

/// When a Sundial node reads a row of another node from its cache rather than at the row's
/// home (its paper's section 4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CachePolicy {
    /// Always read a cached copy: best for rows rarely written.
    AlwaysReuse,
    /// Always ask the home, which sends the row only if the cached copy is not its current
    /// version: saves traffic, not round trips.
    AlwaysRequest,
    /// Reuse while remote checks mostly find cached copies current (and cached reads renew
    /// their leases), request otherwise.
    Hybrid,
}

/// Knobs of Sundial.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SundialConfig {
    /// Memory of each node's cache of rows read at other nodes, in MB (0: no cache).
    pub cache_mb: u32,
    pub cache_policy: CachePolicy,
    /// The read-only table optimisations (section 4.3) for tables their workload declares
    /// read-mostly: one lease for the whole table, extended speculatively past the commit
    /// timestamp that asked for it.
    pub table_leases: bool,
}

impl Default for SundialConfig {
    fn default() -> Self {
        SundialConfig {
            cache_mb: 64,
            cache_policy: CachePolicy::Hybrid,
            table_leases: true,
        }
    }
}

impl SundialConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.cache_mb <= 64 * 1024,
            "protocol.sundial.cache_mb",
            self.cache_mb,
            "must be at most 65536 (64 GB); 0 turns the cache off",
        )
    }
}

/// Knobs of deadlock-detecting 2PL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DlDetectConfig {
    /// The detector gathers every node's waits-for edges this often (microseconds), and at
    /// once again while it keeps finding deadlocks.
    pub interval_us: u64,
    /// UNSAFE, for measurement only: no two-phase commit. A distributed transaction's
    /// participants are told to commit as soon as it ran everywhere, without a prepare round
    /// (its client is answered once they installed): the determinism study's upper bound on
    /// what 2PC costs. Without failures the history stays serializable (locks are held until each
    /// participant commits); a crash could commit a transaction at some participants only,
    /// so a data directory is refused with it.
    pub skip_commit_protocol: bool,
}

impl Default for DlDetectConfig {
    fn default() -> Self {
        DlDetectConfig {
            interval_us: 2_000,
            skip_commit_protocol: false,
        }
    }
}

impl DlDetectConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            (100..=10_000_000).contains(&self.interval_us),
            "protocol.dl_detect.interval_us",
            self.interval_us,
            "must be between 100 and 10000000 microseconds",
        )
    }
}

/// Knobs of the Calvin protocol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CalvinConfig {
    /// A sequencer closes its epoch after this many microseconds (time-based demarcation).
    pub epoch_us: u64,
    /// Also close an epoch once it holds this many transactions (0 = time-based only).
    pub epoch_txns: u32,
    pub locks: CalvinLocks,
}

impl Default for CalvinConfig {
    fn default() -> Self {
        CalvinConfig {
            epoch_us: 5_000,
            epoch_txns: 0,
            locks: CalvinLocks::LockTable,
        }
    }
}

impl CalvinConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            (10..=10_000_000).contains(&self.epoch_us),
            "protocol.calvin.epoch_us",
            self.epoch_us,
            "must be between 10 and 10000000 microseconds",
        )?;
        check(
            self.epoch_txns <= 1_000_000,
            "protocol.calvin.epoch_txns",
            self.epoch_txns,
            "must be at most 1000000 (0 = time-based epochs only)",
        )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Workload name, e.g. `ycsb`.
    pub name: String,
    pub ycsb: YcsbConfig,
    pub micro: MicroConfig,
    pub bank: BankConfig,
    pub append: AppendConfig,
    pub tpcc: TpccConfig,
    pub kv: KvConfig,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            name: "ycsb".into(),
            ycsb: YcsbConfig::default(),
            micro: MicroConfig::default(),
            bank: BankConfig::default(),
            append: AppendConfig::default(),
            tpcc: TpccConfig::default(),
            kv: KvConfig::default(),
        }
    }
}

/// The YCSB-style transactional workload: every knob the papers vary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct YcsbConfig {
    /// Rows loaded into each partition.
    pub records_per_partition: u64,
    /// Bytes per row (the first 8 hold a counter that writes increment).
    pub row_size: usize,
    /// Record accesses per transaction.
    pub ops_per_txn: u32,
    /// Fraction of accesses that are read-modify-writes (the rest are reads).
    pub write_fraction: f64,
    /// Zipfian skew θ of key choice inside a partition; 0 is uniform.
    pub theta: f64,
    /// The skew of the keys written, if not `theta` (which then applies to reads only):
    /// Sundial's social-network workload reads popular rows (θ up to 1.7) and writes
    /// uniformly (0).
    pub write_theta: Option<f64>,
    /// Fraction of transactions that touch more than one partition.
    pub multi_partition_fraction: f64,
    /// Partitions a multi-partition transaction touches (its home partition included).
    pub partitions_per_mp_txn: u32,
    /// Sundial's mode, instead of multi-partition transactions: each access independently
    /// goes to a uniformly chosen other partition with this probability (Sundial uses 0.1).
    pub remote_access_fraction: f64,
    /// LEAP's P(L|R) (section 3.4.1): the probability that a remote access is *with
    /// locality*, touching a record only the requesting home's transactions touch. When set,
    /// each partition's keys are split into `nodes` stripes by rank modulo the partition count:
    /// partition p's stripe p serves its local accesses and the remote accesses without
    /// locality, its stripe h (h != p) only the remote accesses with locality from home h.
    /// `None` (the default) keeps today's key choice. Needs `remote_access_fraction > 0`.
    pub remote_locality: Option<f64>,
    /// LEAP's multi-step transactions (figure 11): the accesses are split into `steps + 1`
    /// consecutive steps, and every access of a step takes the output of the first access of
    /// the step before as input (a data dependency; keys stay known up front). As the
    /// paper's, every step after the first begins with an access to another partition (when
    /// there is one), so that under 2PC each intermediate result crosses the network; the
    /// other accesses are remote as `remote_access_fraction` says. 0 = one step, no
    /// dependencies. At most `ops_per_txn - 1`.
    pub steps: u32,
    /// LEAP's access-pattern phases (figure 13): in turn, for its `seconds`, each phase limits
    /// every remote access to one of the `partitions` partitions following the home one (0 =
    /// all), cycling through the list from the generator's creation (the load generator's
    /// start, warm-up included). Empty (the default): no phases. Needs
    /// `remote_access_fraction > 0`; the stream then depends on timing, not on the seed alone.
    pub remote_phases: Vec<RemotePhase>,
    /// Allow one transaction to pick the same key twice.
    pub allow_duplicate_keys: bool,
    /// Declare the table read-mostly (see `TableSchema::read_mostly`): for Sundial's table
    /// leases on a table that is written now and then.
    pub read_mostly: bool,
}

/// One access-pattern phase of `workload.ycsb.remote_phases`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemotePhase {
    /// How long the phase lasts, in seconds (> 0).
    pub seconds: f64,
    /// A remote access goes to one of the `partitions` partitions following its home
    /// (home+1 .. home+partitions, modulo the partition count), uniformly; 0 = any other.
    pub partitions: u32,
}

impl Default for YcsbConfig {
    fn default() -> Self {
        YcsbConfig {
            records_per_partition: 1_000_000,
            row_size: 100,
            ops_per_txn: 16,
            write_fraction: 0.5,
            theta: 0.0,
            write_theta: None,
            multi_partition_fraction: 0.0,
            partitions_per_mp_txn: 2,
            remote_access_fraction: 0.0,
            remote_locality: None,
            steps: 0,
            remote_phases: Vec::new(),
            allow_duplicate_keys: false,
            read_mostly: false,
        }
    }
}

/// The contention-index microbenchmark of the evaluation of deterministic database systems
/// (Ren, Thomson and Abadi, VLDB 2014, section 3.3): every transaction reads and updates
/// `ops_per_txn` records, exactly one of them a hot record at each partition it touches (one
/// of `1 / contention_index` hot records there), the others cold records of the rest of the
/// partition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MicroConfig {
    /// Rows loaded into each partition, hot and cold.
    pub records_per_partition: u64,
    /// Records a transaction reads and updates.
    pub ops_per_txn: u32,
    /// The probability that two transactions conflict at a partition they both touch:
    /// 1 / the hot records per partition (0.01: 100 hot records; 0.0001: 10,000).
    pub contention_index: f64,
    /// CPU work each access performs, in microseconds (0: short transactions; the paper's
    /// long transactions do 15).
    pub compute_us_per_access: f64,
    /// Fraction of transactions that touch more than one partition.
    pub multi_partition_fraction: f64,
    /// Partitions a multi-partition transaction touches (its home partition included).
    pub partitions_per_mp_txn: u32,
    /// Share of transactions that are *dependent* (section 3.6): they look up a secondary
    /// index entry to learn which records to process.
    pub dependent_fraction: f64,
    /// Entries of the secondary index in each partition.
    pub index_entries_per_partition: u64,
    /// Updates per second of *each* index entry, made by an updater beside the clients
    /// (0: the index never changes).
    pub index_volatility: f64,
    /// Share of a dependent transaction's accesses that come before its index lookup and do
    /// not depend on it (figure 6c): OLLP's reconnaissance must do them too.
    pub lookup_position: f64,
    /// How dependent transactions learn their records.
    pub dependent_lookup: DependentLookup,
}

impl Default for MicroConfig {
    fn default() -> Self {
        MicroConfig {
            records_per_partition: 1_000_000,
            ops_per_txn: 10,
            contention_index: 0.0001,
            compute_us_per_access: 0.0,
            multi_partition_fraction: 0.0,
            partitions_per_mp_txn: 2,
            dependent_fraction: 0.0,
            index_entries_per_partition: 100,
            index_volatility: 0.0,
            lookup_position: 0.0,
            dependent_lookup: DependentLookup::Auto,
        }
    }
}

/// How a dependent transaction of the microbenchmark learns the records its index entry
/// names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DependentLookup {
    /// OLLP for protocols that need the read/write set up front (Q-Store, Calvin), the
    /// lookup inside the transaction for the others.
    Auto,
    /// Optimistic lock location prediction: a read-only reconnaissance reads the entry, then
    /// the transaction runs on that guess, checks it, and restarts when it was stale.
    Ollp,
    /// The transaction reads the entry and then reaches the records it names, locking them
    /// as it goes (only protocols that do not plan the read/write set up front).
    InTransaction,
}

/// The bank workload: transfers inside branches of accounts (total money is invariant) and
/// read-only audits of whole branches (each branch's sum is invariant).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BankConfig {
    /// Accounts loaded into each partition.
    pub accounts_per_partition: u64,
    /// Accounts per branch; transfers and audits stay inside one branch.
    pub branch_size: u32,
    /// Average starting balance: every branch starts with `branch_size * initial_balance`.
    pub initial_balance: i64,
    /// A transfer moves a uniformly random amount in [1, max_amount] to each destination.
    pub max_amount: i64,
    /// Accounts a transfer touches: one source and `accounts_per_transfer - 1` destinations.
    pub accounts_per_transfer: u32,
    /// Fraction of transactions that are audits (read a whole branch); the rest transfer.
    pub audit_fraction: f64,
    /// Zipfian skew θ of branch choice; 0 is uniform.
    pub theta: f64,
    /// Fraction of transfers and audits whose accounts lie in more than one partition.
    pub multi_partition_fraction: f64,
}

impl Default for BankConfig {
    fn default() -> Self {
        BankConfig {
            accounts_per_partition: 10_000,
            branch_size: 8,
            initial_balance: 1_000,
            max_amount: 200,
            accounts_per_transfer: 2,
            audit_fraction: 0.1,
            theta: 0.0,
            multi_partition_fraction: 0.5,
        }
    }
}

/// The list-append workload (as in Jepsen's Elle): transactions of appends to and reads of
/// per-key lists, whose histories an Elle-style checker can verify.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AppendConfig {
    /// Lists (keys) loaded, empty, into each partition.
    pub keys_per_partition: u64,
    /// Capacity of a list; appending to a full list aborts the transaction (logic abort).
    pub max_list_len: u32,
    /// Micro-operations (reads or appends, on distinct keys) per transaction.
    pub ops_per_txn: u32,
    /// Fraction of micro-operations that read a whole list (the rest append).
    pub read_fraction: f64,
    /// Size of the sliding window of keys a client draws from in each partition.
    pub active_keys: u32,
    /// Fraction of transactions that touch more than one partition.
    pub multi_partition_fraction: f64,
    /// Partitions a multi-partition transaction touches (its home partition included).
    pub partitions_per_mp_txn: u32,
}

impl Default for AppendConfig {
    fn default() -> Self {
        AppendConfig {
            keys_per_partition: 100_000,
            max_list_len: 32,
            ops_per_txn: 4,
            read_fraction: 0.5,
            active_keys: 16,
            multi_partition_fraction: 0.5,
            partitions_per_mp_txn: 2,
        }
    }
}

/// The key-value store behind the Redis port: byte-string keys hashed into fixed-size
/// buckets, each bucket a record holding the entries (key beside value) that hash to it.
/// Its own clients run Redis-style transactions: `reads_per_txn` GETs and `rmws_per_txn`
/// INCRs on keys drawn uniformly from `keys`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    /// Buckets (records) per partition.
    pub buckets_per_partition: u64,
    /// Bytes of a bucket: a bucket holds every entry that hashes to it (key, value and 6
    /// bytes), so the largest value is a little less than this.
    pub bucket_bytes: u32,
    /// Distinct keys (`key:0` ..) the workload's own clients use.
    pub keys: u64,
    /// GETs per transaction of the workload's own clients.
    pub reads_per_txn: u32,
    /// INCRs (read-modify-writes) per transaction of the workload's own clients.
    pub rmws_per_txn: u32,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig {
            buckets_per_partition: 16_384,
            bucket_bytes: 1024,
            keys: 10_000,
            reads_per_txn: 8,
            rmws_per_txn: 8,
        }
    }
}

impl KvConfig {
    /// Largest bucket: the engine's row limit (rows of about half a megabyte).
    pub const MAX_BUCKET_BYTES: u32 = 512 << 10;

    pub fn validate(&self) -> Result<(), ConfigError> {
        check(
            (64..=Self::MAX_BUCKET_BYTES).contains(&self.bucket_bytes),
            "workload.kv.bucket_bytes",
            self.bucket_bytes,
            "must be between 64 and 524288",
        )?;
        check(
            (1..=1u64 << 32).contains(&self.buckets_per_partition),
            "workload.kv.buckets_per_partition",
            self.buckets_per_partition,
            "must be between 1 and 2^32",
        )?;
        check(
            self.keys >= 1,
            "workload.kv.keys",
            self.keys,
            "must be at least 1",
        )?;
        check(
            (1..=256).contains(&(self.reads_per_txn + self.rmws_per_txn)),
            "workload.kv.reads_per_txn",
            self.reads_per_txn,
            "reads_per_txn + rmws_per_txn must be between 1 and 256",
        )
    }
}

/// Which TPC-C transactions run, and in what shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TpccMix {
    /// All five transactions (clause 5.2.3): Payment at `payment_fraction`, Order-Status,
    /// Delivery and Stock-Level at the spec's minimum of 4% each, New-Order the rest (45% at
    /// the default `payment_fraction`).
    Standard,
    /// New-Order and Payment only, 88% of the standard mix and what the papers measure:
    /// Payment at `payment_fraction`, New-Order the rest.
    NeworderPayment,
}

/// Where TPC-C's ITEM table lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ItemPlacement {
    /// A copy in every partition: New-Order reads its home partition's (the papers' default).
    Replicated,
    /// Hash-partitioned on the item id (item `i` in partition `i mod P`): most New-Orders
    /// read items at other partitions (Sundial's "NoRep", section 6.4.1).
    Partitioned,
}

/// The TPC-C workload: warehouses spread over the partitions, each with the spec's initial
/// population; the five transactions, or New-Order and Payment alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TpccConfig {
    /// Warehouses each partition holds; warehouse `w` (numbered from 0) lives in partition
    /// `w / warehouses_per_partition`. More warehouses per partition means less contention
    /// on each warehouse's rows and more memory per node.
    pub warehouses_per_partition: u32,
    /// Orders a district can hold: the 3000 loaded plus room for the orders New-Order adds.
    /// It sizes the order-id part of the keys and the ORDER, NEW-ORDER, ORDER-LINE and
    /// HISTORY tables (whose per-district sequence it also bounds), so it sets most of a
    /// partition's memory; a New-Order past it aborts.
    pub max_orders_per_district: u32,
    pub mix: TpccMix,
    /// Share of transactions that are Payments. With `mix = "standard"` it must stay between
    /// the spec's minimum 43% and 88% (the other three minor transactions take 4% each);
    /// with `mix = "neworder-payment"` it may be anything from 0 (New-Order only) to 1
    /// (Payment only).
    pub payment_fraction: f64,
    /// Share of transactions that are Order-Status (read-only), taken from New-Order's share.
    /// Only with `mix = "neworder-payment"`, where it is 0 by default and `payment_fraction +
    /// order_status_fraction` may be at most 1; the standard mix fixes it at 4%.
    pub order_status_fraction: f64,
    /// Share of transactions that are Stock-Level (read-only, run as OLLP: a reconnaissance,
    /// then the transaction), taken from New-Order's share like `order_status_fraction` and
    /// under the same rules.
    pub stock_level_fraction: f64,
    /// Share of transactions that are Delivery (run as OLLP), taken from New-Order's share
    /// like `order_status_fraction` and under the same rules.
    pub delivery_fraction: f64,
    /// Share of New-Order and Payment transactions that span two partitions (the knob of the
    /// Q-Store paper, whose TPC-C touches at most two partitions): such a Payment's customer
    /// belongs to, and at least one line of such a New-Order is supplied by, a warehouse of
    /// one other partition. Every other transaction stays in its home partition. The default
    /// is the spec's 15% of remote Payments, which the paper applies to both transactions.
    pub multi_partition_fraction: f64,
    /// LEAP's remote share per access (section 5.3, figure 9), instead of
    /// `multi_partition_fraction` (which must then be 0): each New-Order line is supplied by,
    /// and each Payment's customer belongs to, a uniformly chosen warehouse of a uniformly
    /// chosen other partition with this probability, independently; otherwise the line or
    /// customer is chosen as below. A New-Order may so span several partitions. 0 (the
    /// default) = off, the stream unchanged.
    pub remote_access_fraction: f64,
    /// Chance that a line of a New-Order is supplied by another warehouse of the home
    /// partition (the spec's 1%, clause 2.4.1.5), when not already remote. Other warehouses
    /// of other partitions come only through `multi_partition_fraction` or
    /// `remote_access_fraction`, so with one warehouse per partition this has no effect.
    pub remote_new_order_line_fraction: f64,
    /// Chance that the customer of a Payment belongs to another warehouse of the home
    /// partition (the spec's 15%, clause 2.5.1.2), when not already remote; as above, remote
    /// partitions come only through `multi_partition_fraction` or `remote_access_fraction`.
    pub remote_payment_fraction: f64,
    /// Where ITEM lives: replicated in every partition, or partitioned on the item id.
    pub items: ItemPlacement,
}

impl Default for TpccConfig {
    fn default() -> Self {
        TpccConfig {
            warehouses_per_partition: 1,
            max_orders_per_district: 3_000 + 30_000,
            mix: TpccMix::Standard,
            payment_fraction: 0.43,
            order_status_fraction: 0.0,
            stock_level_fraction: 0.0,
            delivery_fraction: 0.0,
            multi_partition_fraction: 0.15,
            remote_access_fraction: 0.0,
            remote_new_order_line_fraction: 0.01,
            remote_payment_fraction: 0.15,
            items: ItemPlacement::Replicated,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// Clients in the whole cluster, spread round-robin over home nodes (0 = one per node).
    pub clients: u32,
    /// Transactions each client keeps in flight (closed loop).
    pub inflight: u32,
    /// Open-loop target rate in transactions/s for the whole cluster (0 = closed loop).
    pub rate: f64,
    /// Measurement window in seconds (after the warm-up).
    pub duration_s: f64,
    /// Warm-up in seconds; commits during it are not counted.
    pub warmup_s: f64,
    /// Stop after this many commits (0 = no count: the duration alone bounds the run). With
    /// `duration_s` > 0 the run stops at whichever comes first; with `duration_s` = 0 the
    /// count alone bounds it, and the run also ends once nothing has committed for
    /// `drain_timeout_s`. The warm-up is skipped in this mode: every commit counts.
    pub txns: u64,
    /// Load-generator threads, each driving a share of the clients (0 = one per core, at most
    /// one per client). The generator shares the machine with the engine: with fewer
    /// threads than cores, the scheduler can leave a core idle while a generator thread
    /// waits for its turn on the other (measured on 2 cores: about 10% idle time, and the
    /// generator, not the engine, set the throughput).
    pub threads: u32,
    /// Back-off after a concurrency-control abort: a uniformly random wait in
    /// [0, min(max, base * 2^retries)) microseconds.
    pub backoff_base_us: u64,
    pub backoff_max_us: u64,
    /// Seconds to wait for in-flight transactions after the run before giving up (and, in a
    /// run bounded by `txns` alone, for the next commit; at least 1 s there).
    pub drain_timeout_s: f64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            clients: 0,
            inflight: 200,
            rate: 0.0,
            duration_s: 5.0,
            warmup_s: 1.0,
            txns: 0,
            threads: 0,
            backoff_base_us: 50,
            backoff_max_us: 10_000,
            drain_timeout_s: 10.0,
        }
    }
}

impl ClientConfig {
    /// Highest open-loop rate (transactions/s). Each load thread spaces its arrivals
    /// `threads / rate` apart in whole nanoseconds: far above this the spacing rounds to
    /// nothing and the thread schedules arrivals forever instead of taking answers. No load
    /// thread issues more than a few million transactions/s anyway.
    pub const MAX_RATE: f64 = 1e8;
    /// Lowest open-loop rate other than 0 (closed loop): one arrival per 1000 s.
    pub const MIN_RATE: f64 = 1e-3;

    /// Clients actually started for a cluster of `nodes` nodes.
    pub fn effective_clients(&self, nodes: u32) -> u32 {
        if self.clients == 0 {
            nodes
        } else {
            self.clients
        }
    }

    /// Load-generator threads actually started for `clients` clients.
    pub fn effective_threads(&self, clients: u32) -> u32 {
        let threads = if self.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(64) as u32)
        } else {
            self.threads
        };
        threads.clamp(1, clients.max(1))
    }
}

/// When a replicated Q-Store leader may start executing a batch it planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationMode {
    /// At once, while the batch is being replicated; its transactions are answered when it
    /// has both run and been committed in the group's log (QR-Store's speculative
    /// replication).
    Speculative,
    /// Only once the batch is committed in the group's log.
    Synchronous,
}

/// How a replica group's log entries are compressed (QR-Store section 3.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationCompression {
    None,
    Lz4,
    Snappy,
}

/// What keeps a replica group's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationLayer {
    /// raft among the group's members, on the protocol's own transport (QR-Store's integrated
    /// replication).
    Raft,
    /// A ZooKeeper server that the group's members use as clients (Calvin's middleware
    /// replication); Calvin only.
    Zookeeper,
}

/// Replication of partitions (QR-Store): copies per partition, and the consensus timing of
/// each replica group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicationConfig {
    /// Copies of every partition, each on its own server: `cluster.nodes` × `factor`
    /// servers in all. 1 = no replication.
    pub factor: u32,
    pub mode: ReplicationMode,
    /// Where a Q-Store planner batch is replicated (QR-Store section 2.2): 2 (Q-Store's
    /// default) after planning, its execution queues; 1 before planning, its transactions,
    /// which every member then plans itself (a leader executes a batch only once it is
    /// committed); 3 after execution, what the batch wrote (each record's last committed
    /// image), which the other members put in place without running the transactions.
    /// Calvin replicates at point 1 only: its sequenced epochs, before they run. Unset: the protocol's default (see [`ReplicationConfig::point_of`]).
    pub point: Option<u32>,
    /// How the leader compresses each batch it proposes (members read any entry, whatever
    /// their own setting says).
    pub compression: ReplicationCompression,
    /// What keeps each group's log: raft (default) or ZooKeeper (Calvin only).
    pub layer: ReplicationLayer,
    /// ZooKeeper's client address (host:port), with `layer = "zookeeper"`.
    pub zookeeper: String,
    /// Milliseconds per consensus tick (the unit of the two settings below).
    pub tick_ms: u32,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: u32,
    /// Ticks without a heartbeat before a follower calls an election (randomised between
    /// this and twice this).
    pub election_ticks: u32,
    /// Milliseconds a group leader waits for its cluster instance to retire a batch, while
    /// it has work in flight and a server of the instance is unreachable, before it takes the
    /// instance for broken, marks it stale and hands its group to a member of another
    /// instance. With every server reachable it waits five times as long (a hung server):
    /// the instance may only be waiting for another group's plans.
    pub stall_ms: u32,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            factor: 1,
            mode: ReplicationMode::Speculative,
            point: None,
            compression: ReplicationCompression::None,
            layer: ReplicationLayer::Raft,
            zookeeper: "127.0.0.1:2181".into(),
            tick_ms: 10,
            heartbeat_ticks: 3,
            election_ticks: 30,
            stall_ms: 1000,
        }
    }
}

impl ReplicationConfig {
    /// Where `protocol` replicates: the point set, or the protocol's own (Calvin 1, Q-Store
    /// 2).
    pub fn point_of(&self, protocol: &str) -> u32 {
        self.point
            .unwrap_or(if protocol == "calvin" { 1 } else { 2 })
    }

    pub fn validate(&self, protocol: &str) -> Result<(), ConfigError> {
        check(
            (1..=7).contains(&self.factor),
            "replication.factor",
            self.factor,
            "must be between 1 and 7",
        )?;
        if self.factor == 1 {
            return Ok(());
        }
        check(
            matches!(protocol, "qstore" | "calvin"),
            "replication.factor",
            self.factor,
            "replication is implemented for the qstore and calvin protocols only so far: \
             use --protocol qstore or calvin, or a factor of 1",
        )?;
        check(
            self.layer == ReplicationLayer::Raft || protocol == "calvin",
            "replication.layer",
            "zookeeper",
            "ZooKeeper replicates Calvin's epochs only (as in Calvin's paper): Q-Store \
             replicates through its groups' own raft logs; use --replication-layer raft",
        )?;
        check(
            self.layer == ReplicationLayer::Raft
                || self
                    .zookeeper
                    .to_socket_addrs()
                    .is_ok_and(|mut a| a.next().is_some()),
            "replication.zookeeper",
            &self.zookeeper,
            "must be ZooKeeper's client address as host:port, e.g. 127.0.0.1:2181",
        )?;
        let point = self.point_of(protocol);
        if protocol == "calvin" {
            check(
                point == 1,
                "replication.point",
                point,
                "Calvin replicates its sequenced epochs before they run (point 1) and nothing \
                 else: leave the point out, or set it to 1",
            )?;
        }
        check(
            (1..=3).contains(&point),
            "replication.point",
            point,
            "must be 1 (before planning), 2 (after planning) or 3 (after execution)",
        )?;
        check(
            point != 3 || self.mode != ReplicationMode::Synchronous,
            "replication.mode",
            "synchronous",
            "at replication point 3 the log holds what a batch wrote, which exists only once \
             the batch ran: replication there is speculative (leave the mode out)",
        )?;
        check(
            (1..=10_000).contains(&self.tick_ms),
            "replication.tick_ms",
            self.tick_ms,
            "must be between 1 and 10000",
        )?;
        check(
            self.heartbeat_ticks >= 1,
            "replication.heartbeat_ticks",
            self.heartbeat_ticks,
            "must be at least 1",
        )?;
        check(
            self.election_ticks > self.heartbeat_ticks,
            "replication.election_ticks",
            self.election_ticks,
            "must be more than replication.heartbeat_ticks",
        )?;
        check(
            self.stall_ms as u64 > 2 * self.tick_ms as u64 * self.election_ticks as u64,
            "replication.stall_ms",
            self.stall_ms,
            "must be more than two election timeouts (2 x tick_ms x election_ticks): a \
             group must have time to elect a new leader before its instance is given up",
        )
    }
}

/// When a server's log calls `fdatasync` (see the README's durability section for exactly
/// what each promises).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fsync {
    /// A transaction is answered only once its log record is on disk: it survives a crash
    /// of the process and of the machine. Records written meanwhile share one sync.
    Always,
    /// Records are written to the operating system before the answer and synced every few
    /// milliseconds: a process crash loses nothing, a power failure the last moments.
    Batch,
    /// Records are written to the operating system before the answer and never synced by
    /// qstore: a process crash loses nothing, a power failure may lose anything recent.
    Never,
}

/// Durability: where each server keeps its log, and how hard it writes. Without a data
/// directory a server keeps everything in memory and a crash loses it.
///
/// With one, the deterministic protocols (qstore, calvin) log their input: every planned
/// batch or sequenced epoch goes through its replica group's raft log (a group of one
/// server without replication), kept on disk; a restarted server replays it. The
/// interactive protocols log their effects (write-ahead logging with two-phase commit); a
/// restarted server puts back what committed and settles what was in doubt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DurabilityConfig {
    /// A directory holding one data directory per server, `server-S` for server S ("" = in
    /// memory, unless the cluster file names a server's own). A relative path is relative
    /// to the directory the process started in.
    pub data_dir: String,
    pub fsync: Fsync,
    /// Seconds between two checkpoints, after which the log before them is dropped: the
    /// interactive protocols fold their write-ahead log into the last checkpoint; Q-Store and
    /// Calvin copy every partition at one batch (epoch) boundary (with replication, each
    /// cluster instance at its own). Unset: every `DEFAULT_CHECKPOINT_INTERVAL_S`; 0: never.
    pub checkpoint_interval_s: Option<u64>,
}

/// Seconds between two checkpoints when `durability.checkpoint_interval_s` is unset.
pub const DEFAULT_CHECKPOINT_INTERVAL_S: u64 = 60;

impl DurabilityConfig {
    /// How often a server with a write-ahead log checkpoints it; `None`: never.
    pub fn checkpoint_interval(&self) -> Option<std::time::Duration> {
        match self
            .checkpoint_interval_s
            .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL_S)
        {
            0 => None,
            s => Some(std::time::Duration::from_secs(s)),
        }
    }
}

impl Default for DurabilityConfig {
    fn default() -> Self {
        DurabilityConfig {
            data_dir: String::new(),
            fsync: Fsync::Always,
            checkpoint_interval_s: None,
        }
    }
}

/// Injected network delay (every message between nodes) and loss (in-process only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// Fixed one-way delay in microseconds.
    pub delay_us: u64,
    /// Extra uniformly random delay in [0, jitter) microseconds.
    pub jitter_us: u64,
    /// Fault injection: the fraction of messages between nodes the embedded cluster's
    /// in-process transport loses (seeded). No protocol survives lost messages yet: this
    /// shows that a run whose cluster stops answering says so and fails.
    pub drop_fraction: f64,
    /// Fault injection (in-process only): from `cut_off_after_ms` after the cluster
    /// started, this server sends and receives nothing, as if its machine had died (with
    /// replication, its group elects another leader and the run goes on).
    pub cut_off_node: Option<u32>,
    pub cut_off_after_ms: u64,
    /// How long the cut lasts, in milliseconds (0: to the end of the run); then the server
    /// is reachable again, as if its machine came back (with replication, its instance is
    /// rebuilt from another's copies and serves again).
    pub cut_off_for_ms: u64,
    /// Injected clock skew, in microseconds: node `n` of `N` reads the clock
    /// `n * skew / (N - 1)` behind, so the first and last nodes are `skew` apart (only the
    /// protocols that take timestamps from the clock notice: TIMESTAMP and MVCC).
    pub clock_skew_us: u64,
}

fn check(ok: bool, setting: &str, value: impl ToString, allowed: &str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(setting, value, allowed))
    }
}

fn fraction(setting: &str, v: f64) -> Result<(), ConfigError> {
    check(
        (0.0..=1.0).contains(&v),
        setting,
        v,
        "must be a fraction between 0 and 1",
    )
}

impl RunConfig {
    /// Parses a TOML document; unknown settings are errors (they are usually typos).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("the configuration always serializes")
    }

    /// Server `server`'s data directory: its own in the cluster file, or `server-S` under
    /// `durability.data_dir`; `None` when it keeps everything in memory.
    pub fn data_dir_of(&self, server: u32) -> Option<std::path::PathBuf> {
        let own = self.cluster.addresses.get(server as usize);
        match own.map(|a| a.data_dir.as_str()) {
            Some(dir) if !dir.is_empty() => Some(dir.into()),
            _ if self.durability.data_dir.is_empty() => None,
            _ => Some(
                std::path::Path::new(&self.durability.data_dir).join(format!("server-{server}")),
            ),
        }
    }

    /// Whether any server keeps a data directory (cheap: asked while planning).
    pub fn is_durable(&self) -> bool {
        !self.durability.data_dir.is_empty()
            || self
                .cluster
                .addresses
                .iter()
                .any(|a| !a.data_dir.is_empty())
    }

    /// Servers of the cluster: every copy of every partition (`cluster.nodes` x
    /// `replication.factor`).
    pub fn servers(&self) -> u32 {
        self.cluster.nodes * self.replication.factor
    }

    /// The checked addresses of a distributed cluster's servers (see
    /// [`ClusterConfig::socket_addresses`]).
    pub fn socket_addresses(
        &self,
    ) -> Result<Vec<(std::net::SocketAddr, std::net::SocketAddr)>, ConfigError> {
        self.cluster.socket_addresses(self.servers())
    }

    fn validate_durability(&self) -> Result<(), ConfigError> {
        if !self.is_durable() {
            return Ok(());
        }
        let setting = "durability.data_dir";
        check(
            self.protocol.name != "serial",
            setting,
            &self.durability.data_dir,
            "the serial bound measures execution alone and keeps nothing on disk: leave the \
             data directory out, or choose another protocol",
        )?;
        check(
            self.replication.layer == ReplicationLayer::Raft,
            setting,
            &self.durability.data_dir,
            "ZooKeeper keeps its own log: a data directory goes with --replication-layer raft",
        )?;
        let every = self.durability.checkpoint_interval_s.unwrap_or_default();
        check(
            every <= 24 * 3600,
            "durability.checkpoint_interval_s",
            every,
            "must be at most a day (86400 seconds); 0 takes no checkpoints",
        )
    }

    /// Checks every value against its allowed range. Names (protocol, workload) are checked
    /// by the crates that own them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        check(
            (1..=1024).contains(&c.nodes),
            "cluster.nodes",
            c.nodes,
            "must be between 1 and 1024",
        )?;
        check(
            c.workers <= 256,
            "cluster.workers",
            c.workers,
            "must be between 1 and 256 (0 = one per core, shared among the nodes)",
        )?;
        check(
            c.connect_timeout_s > 0.0 && c.connect_timeout_s <= 3600.0,
            "cluster.connect_timeout_s",
            c.connect_timeout_s,
            "must be between 0 and 3600 seconds",
        )?;
        if let Some(n) = c.slow_node {
            check(
                n < self.servers(),
                "cluster.slow_node",
                n,
                "names no server of this cluster: servers are numbered from 0",
            )?;
        }
        check(
            c.slow_threads <= 64 && (c.slow_threads == 0 || c.slow_node.is_some()),
            "cluster.slow_threads",
            c.slow_threads,
            "must be at most 64, and needs cluster.slow_node (--slow-node) to say which node",
        )?;
        check(
            c.slow_from_s.is_finite() && (0.0..=86_400.0).contains(&c.slow_from_s),
            "cluster.slow_from_s",
            c.slow_from_s,
            "must be between 0 and 86400 seconds",
        )?;
        self.replication.validate(&self.protocol.name)?;
        self.validate_durability()?;
        if c.is_distributed() {
            c.socket_addresses(self.servers())?;
        }
        check(
            self.protocol.admission_queue >= 1,
            "protocol.admission_queue",
            self.protocol.admission_queue,
            "must be at least 1",
        )?;
        self.protocol.qstore.validate()?;
        self.protocol.calvin.validate()?;
        self.protocol.mvcc.validate()?;
        self.protocol.sundial.validate()?;
        self.protocol.dl_detect.validate()?;
        check(
            !self.protocol.throttle
                || !matches!(self.protocol.name.as_str(), "qstore" | "calvin" | "serial"),
            "protocol.throttle",
            true,
            "throttling refuses transactions at a node that falls behind, which only a \
             nondeterministic protocol may do: a deterministic one must run every transaction \
             of its input (leave --throttle out, or pick an interactive protocol)",
        )?;
        let skip = self.protocol.dl_detect.skip_commit_protocol;
        check(
            !skip || self.protocol.name == "dl_detect",
            "protocol.dl_detect.skip_commit_protocol",
            skip,
            "skipping the commit protocol is a dl_detect option: use --protocol dl_detect",
        )?;
        check(
            !skip || !self.is_durable(),
            "protocol.dl_detect.skip_commit_protocol",
            skip,
            "without two-phase commit a crash can commit a transaction at some nodes only, so \
             it cannot be logged: leave the data directory out (the option is for measurement)",
        )?;
        let q = &self.protocol.qstore;
        check(
            q.dedicated_planners || c.workers == 0 || q.planners <= c.workers,
            "protocol.qstore.planners",
            q.planners,
            "must be at most cluster.workers unless planners are dedicated threads",
        )?;
        self.validate_client()?;
        self.validate_net()?;
        self.server.validate()?;
        match self.workload.name.as_str() {
            "ycsb" => self.workload.ycsb.validate(c.nodes),
            "micro" => {
                let m = &self.workload.micro;
                check(
                    m.dependent_lookup != DependentLookup::InTransaction
                        || !self.protocol.plans_up_front(),
                    "workload.micro.dependent_lookup",
                    "in-transaction",
                    &format!(
                        "{} needs every transaction's records before it runs it, so dependent \
                         transactions must use OLLP (--dependent-lookup ollp or auto)",
                        self.protocol.name
                    ),
                )?;
                m.validate(c.nodes)
            }
            "bank" => self.workload.bank.validate(c.nodes),
            "append" => self.workload.append.validate(c.nodes),
            "tpcc" => self.workload.tpcc.validate(c.nodes, c.partitioning),
            _ => Ok(()),
        }
    }

    fn validate_client(&self) -> Result<(), ConfigError> {
        let k = &self.client;
        check(
            k.clients <= 1_000_000,
            "client.clients",
            k.clients,
            "must be at most 1000000 (0 = one per node)",
        )?;
        check(
            (1..=100_000).contains(&k.inflight),
            "client.inflight",
            k.inflight,
            "must be between 1 and 100000",
        )?;
        check(
            k.rate == 0.0 || (ClientConfig::MIN_RATE..=ClientConfig::MAX_RATE).contains(&k.rate),
            "client.rate",
            k.rate,
            "must be 0 (closed loop) or between 0.001 and 100000000 transactions/s",
        )?;
        check(
            k.duration_s.is_finite() && k.duration_s >= 0.0 && k.duration_s <= 1e6,
            "client.duration_s",
            k.duration_s,
            "must be between 0 and 1000000 seconds",
        )?;
        check(
            k.duration_s > 0.0 || k.txns > 0,
            "client.duration_s",
            k.duration_s,
            "must be > 0 unless client.txns bounds the run",
        )?;
        check(
            k.warmup_s.is_finite() && (0.0..=1e6).contains(&k.warmup_s),
            "client.warmup_s",
            k.warmup_s,
            "must be between 0 and 1000000 seconds",
        )?;
        check(
            k.threads <= 64,
            "client.threads",
            k.threads,
            "must be between 0 (one per core) and 64",
        )?;
        check(
            k.backoff_max_us >= k.backoff_base_us && k.backoff_max_us <= 10_000_000,
            "client.backoff_max_us",
            k.backoff_max_us,
            "must be >= client.backoff_base_us and at most 10000000",
        )?;
        check(
            k.drain_timeout_s.is_finite() && k.drain_timeout_s >= 0.0,
            "client.drain_timeout_s",
            k.drain_timeout_s,
            "must be a finite number >= 0",
        )
    }

    fn validate_net(&self) -> Result<(), ConfigError> {
        check(
            self.net.clock_skew_us <= 60_000_000,
            "net.clock_skew_us",
            self.net.clock_skew_us,
            "must be at most a minute (60000000)",
        )?;
        check(
            self.net.delay_us <= 10_000_000,
            "net.delay_us",
            self.net.delay_us,
            "must be at most 10000000 (10 s)",
        )?;
        check(
            self.net.jitter_us <= 10_000_000,
            "net.jitter_us",
            self.net.jitter_us,
            "must be at most 10000000 (10 s)",
        )?;
        fraction("net.drop_fraction", self.net.drop_fraction)?;
        let r = &self.replication;
        let round_trip_us = 2 * (self.net.delay_us + self.net.jitter_us);
        let election_us = r.tick_ms as u64 * r.election_ticks as u64 * 1000;
        check(
            r.factor == 1 || round_trip_us < election_us,
            "net.delay_us",
            self.net.delay_us,
            &format!(
                "with replication, a round trip (2 x (delay + jitter) = {} ms) must be shorter \
                 than the election timeout (replication.tick_ms x election_ticks = {} ms), or \
                 leaders lose their quorum over and over: raise replication.election_ticks",
                round_trip_us / 1000,
                election_us / 1000
            ),
        )?;
        let servers = self.servers();
        check(
            self.net.cut_off_node.is_none() || self.replication.layer == ReplicationLayer::Raft,
            "net.cut_off_node",
            self.net.cut_off_node.unwrap_or_default(),
            "a group replicated through ZooKeeper has a fixed leader (instance 0's member): \
             fail-over is built on raft only (--replication-layer raft)",
        )?;
        check(
            self.net.cut_off_for_ms == 0 || self.net.cut_off_node.is_some(),
            "net.cut_off_for_ms",
            self.net.cut_off_for_ms,
            "says how long net.cut_off_node is cut off: name the server (--cut-off-node)",
        )?;
        match self.net.cut_off_node {
            Some(n) => check(
                n < servers,
                "net.cut_off_node",
                n,
                &format!(
                    "must name one of the cluster's {servers} servers (0 to {})",
                    servers.saturating_sub(1)
                ),
            ),
            None => Ok(()),
        }
    }
}

impl YcsbConfig {
    /// Largest row the engine accepts.
    pub const MAX_ROW_SIZE: usize = 1 << 20;

    pub fn validate(&self, partitions: u32) -> Result<(), ConfigError> {
        check(
            (1..=1u64 << 40).contains(&self.records_per_partition),
            "workload.ycsb.records_per_partition",
            self.records_per_partition,
            "must be between 1 and 2^40",
        )?;
        check(
            (8..=Self::MAX_ROW_SIZE).contains(&self.row_size),
            "workload.ycsb.row_size",
            self.row_size,
            "must be between 8 and 1048576 bytes",
        )?;
        check(
            (1..=4096).contains(&self.ops_per_txn),
            "workload.ycsb.ops_per_txn",
            self.ops_per_txn,
            "must be between 1 and 4096",
        )?;
        fraction("workload.ycsb.write_fraction", self.write_fraction)?;
        for (setting, theta) in [
            ("workload.ycsb.theta", self.theta),
            ("workload.ycsb.write_theta", self.write_theta.unwrap_or(0.0)),
        ] {
            check(
                theta.is_finite() && (0.0..=100.0).contains(&theta),
                setting,
                theta,
                "must be a finite number between 0 and 100 (0 = uniform)",
            )?;
        }
        fraction(
            "workload.ycsb.multi_partition_fraction",
            self.multi_partition_fraction,
        )?;
        check(
            self.multi_partition_fraction == 0.0 || partitions >= 2,
            "workload.ycsb.multi_partition_fraction",
            self.multi_partition_fraction,
            "must be 0 on a single-node cluster (multi-partition transactions need 2+ nodes)",
        )?;
        mp_fraction(
            "workload.ycsb.remote_access_fraction",
            self.remote_access_fraction,
            partitions,
        )?;
        check(
            self.remote_access_fraction == 0.0 || self.multi_partition_fraction == 0.0,
            "workload.ycsb.remote_access_fraction",
            self.remote_access_fraction,
            "must be 0 when workload.ycsb.multi_partition_fraction is not: choose remote \
             accesses (Sundial's mode) or multi-partition transactions",
        )?;
        check(
            self.partitions_per_mp_txn >= 2 && self.partitions_per_mp_txn <= partitions.max(2),
            "workload.ycsb.partitions_per_mp_txn",
            self.partitions_per_mp_txn,
            &format!("must be between 2 and the number of nodes ({partitions})"),
        )?;
        self.validate_leap_knobs(partitions)?;
        // Without duplicates, one partition must hold enough distinct keys for its share.
        let per_partition = self
            .ops_per_txn
            .div_ceil(if self.multi_partition_fraction > 0.0 {
                self.partitions_per_mp_txn
            } else {
                1
            });
        check(
            self.allow_duplicate_keys || self.records_per_partition >= per_partition as u64 * 2,
            "workload.ycsb.records_per_partition",
            self.records_per_partition,
            &format!(
                "must be at least twice the keys a transaction picks in one partition ({per_partition}) \
                 unless duplicate keys are allowed"
            ),
        )
    }
}

impl YcsbConfig {
    /// The knobs of LEAP's extended YCSB: `remote_locality`, `steps`, `remote_phases`.
    fn validate_leap_knobs(&self, partitions: u32) -> Result<(), ConfigError> {
        let remote = self.remote_access_fraction > 0.0 && partitions >= 2;
        if let Some(locality) = self.remote_locality {
            let setting = "workload.ycsb.remote_locality";
            fraction(setting, locality)?;
            check(
                remote,
                setting,
                locality,
                "needs remote accesses: set workload.ycsb.remote_access_fraction \
                 (--remote-access-fraction) above 0 on 2+ nodes, or leave remote_locality unset",
            )?;
            // Every stripe holds enough distinct keys for a whole transaction, from every home.
            let stripe = self.records_per_partition / partitions as u64;
            let need = partitions as u64 * self.ops_per_txn as u64;
            check(
                (self.allow_duplicate_keys && stripe >= 1) || stripe >= need,
                "workload.ycsb.records_per_partition",
                self.records_per_partition,
                &format!(
                    "must be at least nodes x nodes x ops_per_txn ({}) with \
                     workload.ycsb.remote_locality set: each of the {partitions} stripes of a \
                     partition needs nodes x ops_per_txn ({need}) keys (raise --records, lower \
                     --ops, or unset remote_locality)",
                    need * partitions as u64
                ),
            )?;
        }
        check(
            self.steps < self.ops_per_txn,
            "workload.ycsb.steps",
            self.steps,
            &format!(
                "must be at most workload.ycsb.ops_per_txn - 1 ({}): every one of the steps + 1 \
                 steps needs an access (lower --steps or raise --ops)",
                self.ops_per_txn.saturating_sub(1)
            ),
        )?;
        if !self.remote_phases.is_empty() {
            let setting = "workload.ycsb.remote_phases";
            let shown = format_phases(&self.remote_phases);
            check(
                remote,
                setting,
                &shown,
                "need remote accesses: set workload.ycsb.remote_access_fraction \
                 (--remote-access-fraction) above 0 on 2+ nodes, or leave remote_phases empty",
            )?;
            for phase in &self.remote_phases {
                check(
                    phase.seconds.is_finite() && phase.seconds > 0.0 && phase.seconds <= 1e9,
                    setting,
                    &shown,
                    &format!(
                        "every phase must last a finite number of seconds above 0 (got {})",
                        phase.seconds
                    ),
                )?;
                check(
                    phase.partitions < partitions,
                    setting,
                    &shown,
                    &format!(
                        "a phase's partitions must be at most nodes - 1 ({}), or 0 (all) (got {})",
                        partitions - 1,
                        phase.partitions
                    ),
                )?;
            }
        }
        Ok(())
    }
}

impl MicroConfig {
    /// Hot records per partition: 1 / `contention_index`, rounded.
    pub fn hot_records(&self) -> u64 {
        // A float-to-integer cast saturates: a tiny index gives a huge count, refused below.
        (1.0 / self.contention_index).round() as u64
    }

    /// Whether dependent transactions go through OLLP under `protocol`.
    pub fn uses_ollp(&self, protocol: &ProtocolConfig) -> bool {
        match self.dependent_lookup {
            DependentLookup::Auto => protocol.plans_up_front(),
            DependentLookup::Ollp => true,
            DependentLookup::InTransaction => false,
        }
    }

    /// Index updates per second over the cluster: every entry of every partition
    /// `index_volatility` times a second.
    pub fn index_updates_per_s(&self, partitions: u32) -> f64 {
        self.index_volatility * self.index_entries_per_partition as f64 * f64::from(partitions)
    }

    /// Most index updates per second a run may ask for.
    pub const MAX_INDEX_UPDATES_PER_S: f64 = 1_000_000.0;

    fn validate_dependent(&self, partitions: u32) -> Result<(), ConfigError> {
        fraction("workload.micro.dependent_fraction", self.dependent_fraction)?;
        fraction("workload.micro.lookup_position", self.lookup_position)?;
        check(
            (1..=1u64 << 24).contains(&self.index_entries_per_partition),
            "workload.micro.index_entries_per_partition",
            self.index_entries_per_partition,
            "must be between 1 and 2^24",
        )?;
        let v = self.index_volatility;
        check(
            v.is_finite() && v >= 0.0,
            "workload.micro.index_volatility",
            v,
            "must be 0 or more updates per second of each index entry",
        )?;
        let rate = self.index_updates_per_s(partitions);
        check(
            rate <= Self::MAX_INDEX_UPDATES_PER_S,
            "workload.micro.index_volatility",
            v,
            &format!(
                "asks for {rate:.0} index updates per second (volatility x entries x \
                 partitions), more than the updater's limit of {:.0}: lower the volatility or \
                 the entries (--index-entries)",
                Self::MAX_INDEX_UPDATES_PER_S
            ),
        )?;
        // A dependent transaction's records come from two disjoint halves of the cold
        // records (see the workload): those after the lookup from the lower half, shifted by
        // up to K - 1, and those before it from the upper half.
        let (hot, records) = (self.hot_records(), self.records_per_partition);
        check(
            self.dependent_fraction == 0.0 || hot <= u32::MAX as u64,
            "workload.micro.contention_index",
            self.contention_index,
            "gives more than 2^32 hot records, more than an index entry can shift: raise it",
        )?;
        let needed = 4 * hot + 4 * self.ops_per_txn as u64;
        check(
            self.dependent_fraction == 0.0 || records >= needed,
            "workload.micro.records_per_partition",
            records,
            &format!(
                "must be at least 4 x the hot records plus 4 x the accesses ({needed}) with \
                 dependent transactions, whose records an index entry shifts by up to the \
                 hot records: raise --records or the contention index"
            ),
        )
    }

    pub fn validate(&self, partitions: u32) -> Result<(), ConfigError> {
        check(
            (1..=1u64 << 40).contains(&self.records_per_partition),
            "workload.micro.records_per_partition",
            self.records_per_partition,
            "must be between 1 and 2^40",
        )?;
        check(
            (1..=4096).contains(&self.ops_per_txn),
            "workload.micro.ops_per_txn",
            self.ops_per_txn,
            "must be between 1 and 4096",
        )?;
        let ci = self.contention_index;
        check(
            ci.is_finite() && ci > 0.0 && ci <= 1.0,
            "workload.micro.contention_index",
            ci,
            "must be above 0 and at most 1: it is 1 / the hot records per partition (0.01 for \
             100 hot records, 0.0001 for 10000)",
        )?;
        let (hot, records) = (self.hot_records(), self.records_per_partition);
        check(
            hot < records,
            "workload.micro.contention_index",
            ci,
            &format!(
                "gives {hot} hot records per partition (1 / contention_index), which must be \
                 fewer than workload.micro.records_per_partition ({records}): raise the \
                 contention index (--contention-index) or the records (--records)"
            ),
        )?;
        let us = self.compute_us_per_access;
        check(
            us.is_finite() && (0.0..=1_000_000.0).contains(&us),
            "workload.micro.compute_us_per_access",
            us,
            "must be between 0 (short transactions) and 1000000 microseconds",
        )?;
        self.validate_dependent(partitions)?;
        let mp = self.multi_partition_fraction;
        mp_fraction("workload.micro.multi_partition_fraction", mp, partitions)?;
        let per_mp = self.partitions_per_mp_txn;
        check(
            per_mp >= 2 && per_mp <= partitions.max(2),
            "workload.micro.partitions_per_mp_txn",
            per_mp,
            &format!("must be between 2 and the number of nodes ({partitions})"),
        )?;
        check(
            mp == 0.0 || self.ops_per_txn >= per_mp,
            "workload.micro.ops_per_txn",
            self.ops_per_txn,
            &format!(
                "must be at least workload.micro.partitions_per_mp_txn ({per_mp}) with \
                 multi-partition transactions: each of their partitions gets its hot access \
                 (raise --ops or lower --mp-partitions)"
            ),
        )?;
        // The most accesses one partition gets: all of a single-partition transaction's, or
        // a multi-partition one's share when every transaction is multi-partition. All but
        // the hot one go to distinct cold records, drawn until distinct: twice as many
        // cold records as that keep the draws few.
        let share = if mp < 1.0 {
            self.ops_per_txn
        } else {
            self.ops_per_txn.div_ceil(per_mp)
        };
        let cold = 2 * (share as u64 - 1);
        check(
            records - hot >= cold,
            "workload.micro.records_per_partition",
            records,
            &format!(
                "leaves {} cold records per partition ({hot} of the {records} are hot), fewer \
                 than twice the {} cold records a transaction picks in one partition: raise \
                 the records (--records) or the contention index (--contention-index), or \
                 lower the accesses (--ops)",
                records - hot,
                share - 1
            ),
        )
    }
}

/// Phases as the command line takes them: `seconds:partitions,...`, `all` for 0.
pub fn format_phases(phases: &[RemotePhase]) -> String {
    phases
        .iter()
        .map(|p| match p.partitions {
            0 => format!("{}:all", p.seconds),
            k => format!("{}:{k}", p.seconds),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses `seconds:partitions,...` (partitions a number or `all`), e.g. `10:1,10:2,10:all`.
/// Only the syntax is checked here; [`YcsbConfig::validate`] checks the values.
pub fn parse_phases(text: &str) -> Result<Vec<RemotePhase>, String> {
    text.split(',')
        .map(|phase| {
            let phase = phase.trim();
            let (seconds, partitions) = phase.split_once(':').ok_or_else(|| {
                format!("phase {phase:?} must be SECONDS:PARTITIONS, e.g. 10:1 or 10:all")
            })?;
            let seconds: f64 = seconds
                .trim()
                .parse()
                .map_err(|_| format!("phase {phase:?}: {seconds:?} is not a number of seconds"))?;
            let partitions = match partitions.trim() {
                "all" => 0,
                n => n.parse().map_err(|_| {
                    format!("phase {phase:?}: {n:?} is not a partition count or \"all\"")
                })?,
            };
            Ok(RemotePhase {
                seconds,
                partitions,
            })
        })
        .collect()
}

/// A multi-partition fraction: a fraction, and 0 on a single-node cluster.
fn mp_fraction(setting: &str, v: f64, partitions: u32) -> Result<(), ConfigError> {
    fraction(setting, v)?;
    check(
        v == 0.0 || partitions >= 2,
        setting,
        v,
        "must be 0 on a single-node cluster (multi-partition transactions need 2+ nodes)",
    )
}

impl BankConfig {
    /// Largest total amount of money: balances and their sums stay far from i64 overflow.
    pub const MAX_TOTAL_MONEY: u128 = 1 << 62;

    pub fn validate(&self, partitions: u32) -> Result<(), ConfigError> {
        self.validate_layout()?;
        self.validate_money(partitions)?;
        check(
            (2..=self.branch_size).contains(&self.accounts_per_transfer),
            "workload.bank.accounts_per_transfer",
            self.accounts_per_transfer,
            &format!(
                "must be between 2 and workload.bank.branch_size ({})",
                self.branch_size
            ),
        )?;
        fraction("workload.bank.audit_fraction", self.audit_fraction)?;
        check(
            self.theta.is_finite() && (0.0..=100.0).contains(&self.theta),
            "workload.bank.theta",
            self.theta,
            "must be a finite number between 0 and 100 (0 = uniform)",
        )?;
        let mp = "workload.bank.multi_partition_fraction";
        mp_fraction(mp, self.multi_partition_fraction, partitions)?;
        // A branch spans partitions only if it can keep 2 accounts in each of at least two.
        check(
            self.multi_partition_fraction == 0.0 || self.branch_size >= 4,
            mp,
            self.multi_partition_fraction,
            "must be 0 when workload.bank.branch_size < 4 (a branch spans partitions with \
             at least 2 accounts in each)",
        )
    }

    fn validate_layout(&self) -> Result<(), ConfigError> {
        check(
            (2..=1024).contains(&self.branch_size),
            "workload.bank.branch_size",
            self.branch_size,
            "must be between 2 and 1024",
        )?;
        let min = 2 * self.branch_size as u64;
        check(
            (min..=1u64 << 40).contains(&self.accounts_per_partition),
            "workload.bank.accounts_per_partition",
            self.accounts_per_partition,
            &format!("must be between 2 * workload.bank.branch_size ({min}) and 2^40"),
        )
    }

    fn validate_money(&self, partitions: u32) -> Result<(), ConfigError> {
        check(
            (0..=1i64 << 40).contains(&self.initial_balance),
            "workload.bank.initial_balance",
            self.initial_balance,
            "must be between 0 and 2^40",
        )?;
        check(
            (1..=1i64 << 40).contains(&self.max_amount),
            "workload.bank.max_amount",
            self.max_amount,
            "must be between 1 and 2^40",
        )?;
        let total =
            partitions as u128 * self.accounts_per_partition as u128 * self.initial_balance as u128;
        check(
            total <= Self::MAX_TOTAL_MONEY,
            "workload.bank.initial_balance",
            self.initial_balance,
            "makes the total money (nodes * accounts_per_partition * initial_balance) exceed 2^62",
        )
    }
}

impl AppendConfig {
    /// Longest list: rows (8 + 8 * max_list_len bytes) stay within the engine's row limit.
    pub const MAX_LIST_LEN: u32 = 65_536;

    /// Bytes of a row: a u64 count, then `max_list_len` u64 values.
    pub fn row_size(&self) -> usize {
        8 + 8 * self.max_list_len as usize
    }

    pub fn validate(&self, partitions: u32) -> Result<(), ConfigError> {
        check(
            (1..=Self::MAX_LIST_LEN).contains(&self.max_list_len),
            "workload.append.max_list_len",
            self.max_list_len,
            "must be between 1 and 65536",
        )?;
        check(
            (1..=64).contains(&self.ops_per_txn),
            "workload.append.ops_per_txn",
            self.ops_per_txn,
            "must be between 1 and 64",
        )?;
        // Every micro-operation of a transaction on one partition needs its own active key.
        check(
            self.active_keys >= self.ops_per_txn,
            "workload.append.active_keys",
            self.active_keys,
            &format!(
                "must be at least workload.append.ops_per_txn ({})",
                self.ops_per_txn
            ),
        )?;
        check(
            (self.active_keys as u64..=1u64 << 40).contains(&self.keys_per_partition),
            "workload.append.keys_per_partition",
            self.keys_per_partition,
            &format!(
                "must be between workload.append.active_keys ({}) and 2^40",
                self.active_keys
            ),
        )?;
        fraction("workload.append.read_fraction", self.read_fraction)?;
        self.validate_mp(partitions)
    }

    fn validate_mp(&self, partitions: u32) -> Result<(), ConfigError> {
        let mp = self.multi_partition_fraction;
        mp_fraction("workload.append.multi_partition_fraction", mp, partitions)?;
        check(
            self.partitions_per_mp_txn >= 2 && self.partitions_per_mp_txn <= partitions.max(2),
            "workload.append.partitions_per_mp_txn",
            self.partitions_per_mp_txn,
            &format!("must be between 2 and the number of nodes ({partitions})"),
        )?;
        check(
            mp == 0.0 || self.ops_per_txn >= self.partitions_per_mp_txn,
            "workload.append.ops_per_txn",
            self.ops_per_txn,
            &format!(
                "must be at least workload.append.partitions_per_mp_txn ({}) when \
                 multi-partition transactions are on",
                self.partitions_per_mp_txn
            ),
        )
    }
}

impl TpccConfig {
    /// Orders the load puts in every district (clause 4.3.3.1).
    pub const INITIAL_ORDERS: u32 = 3_000;
    /// ORDER-LINE rows a partition keeps room for per order: orders have 5 to 15 lines,
    /// uniformly (clause 2.4.1.3), so 10 on average, and this is 10% more. Room for 15 would
    /// take a third more memory (and, past a power of two, twice the index) for orders
    /// that never come; a New-Order that finds the table full aborts.
    pub const ORDER_LINES_ROOM: u32 = 11;
    /// Districts per warehouse.
    pub const DISTRICTS: u32 = 10;
    /// Key bits of a warehouse's HISTORY rows besides the order-id bits, the widest of the
    /// tables: 4 for the district and 12 for the customer (`qstore_workload::tpcc::keys`).
    pub const HISTORY_FIXED_BITS: u32 = 16;
    /// Most rows a partition's table can hold: storage numbers rows with 32 bits.
    pub const MAX_TABLE_ROWS: u128 = 1 << 32;

    /// Bits of the order-id part of keys: enough for ids up to `max_orders_per_district`.
    pub fn order_id_bits(&self) -> u32 {
        u32::BITS - self.max_orders_per_district.leading_zeros()
    }

    /// Bits of the widest per-warehouse key space (HISTORY's).
    pub fn key_bits_per_warehouse(&self) -> u32 {
        Self::HISTORY_FIXED_BITS + self.order_id_bits()
    }

    pub fn validate(&self, partitions: u32, partitioning: Partitioning) -> Result<(), ConfigError> {
        check(
            partitioning == Partitioning::Range,
            "cluster.partitioning",
            "hash",
            "must be range for workload tpcc (each warehouse's rows are one key range, placed \
             whole in one partition)",
        )?;
        check(
            (1..=64).contains(&self.warehouses_per_partition),
            "workload.tpcc.warehouses_per_partition",
            self.warehouses_per_partition,
            "must be between 1 and 64",
        )?;
        self.validate_orders(partitions)?;
        self.validate_mix()?;
        mp_fraction(
            "workload.tpcc.multi_partition_fraction",
            self.multi_partition_fraction,
            partitions,
        )?;
        mp_fraction(
            "workload.tpcc.remote_access_fraction",
            self.remote_access_fraction,
            partitions,
        )?;
        check(
            self.remote_access_fraction == 0.0 || self.multi_partition_fraction == 0.0,
            "workload.tpcc.remote_access_fraction",
            self.remote_access_fraction,
            &format!(
                "must be 0 when workload.tpcc.multi_partition_fraction is not (it is {}; the \
                 default is 0.15): choose remote accesses (LEAP's mode: each New-Order line \
                 and Payment customer remote on its own) or multi-partition transactions; for \
                 remote accesses set workload.tpcc.multi_partition_fraction = 0 (--mp-fraction \
                 0)",
                self.multi_partition_fraction
            ),
        )?;
        fraction(
            "workload.tpcc.remote_new_order_line_fraction",
            self.remote_new_order_line_fraction,
        )?;
        fraction(
            "workload.tpcc.remote_payment_fraction",
            self.remote_payment_fraction,
        )
    }

    fn validate_orders(&self, partitions: u32) -> Result<(), ConfigError> {
        let setting = "workload.tpcc.max_orders_per_district";
        let max = self.max_orders_per_district;
        check(
            max > Self::INITIAL_ORDERS,
            setting,
            max,
            "must be at least 3001 (the 3000 loaded orders and room for new ones)",
        )?;
        let warehouses = partitions as u128 * self.warehouses_per_partition as u128;
        // Keys run from 0 to warehouses * 2^bits - 1, which must not reach the reserved keys.
        let keys = warehouses << self.key_bits_per_warehouse();
        check(
            keys <= crate::MAX_KEY as u128 + 1,
            setting,
            max,
            &format!(
                "makes the keys of {warehouses} warehouses overflow 64 bits (each takes \
                 2^(16 + {} order-id bits) HISTORY keys)",
                self.order_id_bits()
            ),
        )?;
        let lines = self.warehouses_per_partition as u128
            * (Self::DISTRICTS * Self::ORDER_LINES_ROOM) as u128
            * max as u128;
        check(
            lines <= Self::MAX_TABLE_ROWS,
            setting,
            max,
            "makes a partition's ORDER-LINE table (warehouses_per_partition * 10 districts * \
             max_orders_per_district * 11 lines) exceed 2^32 rows, the most a table holds",
        )
    }

    fn validate_mix(&self) -> Result<(), ConfigError> {
        let (lo, hi, allowed) = match self.mix {
            TpccMix::Standard => (
                0.43,
                0.88,
                "must be between 0.43 (the spec's minimum) and 0.88 (Order-Status, Delivery and \
                 Stock-Level take 4% each) with mix = \"standard\"; mix = \"neworder-payment\" \
                 allows 0 to 1",
            ),
            TpccMix::NeworderPayment => (0.0, 1.0, "must be a fraction between 0 and 1"),
        };
        check(
            (lo..=hi).contains(&self.payment_fraction),
            "workload.tpcc.payment_fraction",
            self.payment_fraction,
            allowed,
        )?;
        // The minor transactions' shares, each checked with those before it.
        let mut taken = self.payment_fraction;
        for (setting, share) in [
            ("order_status_fraction", self.order_status_fraction),
            ("stock_level_fraction", self.stock_level_fraction),
            ("delivery_fraction", self.delivery_fraction),
        ] {
            let (ok, allowed) = match self.mix {
                TpccMix::Standard => (
                    share == 0.0,
                    "applies to mix = \"neworder-payment\" only: the standard mix fixes the \
                     minor transactions at 4% each",
                ),
                TpccMix::NeworderPayment => (
                    (0.0..=1.0 - taken).contains(&share),
                    "must be a fraction between 0 and 1 minus the shares of Payment and the \
                     minor transactions before it (New-Order takes the rest)",
                ),
            };
            check(ok, &format!("workload.tpcc.{setting}"), share, allowed)?;
            taken += share;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_threads_default_to_one_per_core_and_never_exceed_the_clients() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get().min(64) as u32);
        let mut k = ClientConfig::default();
        assert_eq!(k.threads, 0);
        assert_eq!(k.effective_threads(1000), cores);
        assert_eq!(k.effective_threads(1), 1);
        k.threads = 3;
        assert_eq!(k.effective_threads(1000), 3);
        assert_eq!(k.effective_threads(2), 2);
        k.threads = 65;
        let c = RunConfig {
            client: k,
            ..Default::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("client.threads"), "{err}");
    }

    #[test]
    fn default_config_is_valid_and_round_trips_through_toml() {
        let c = RunConfig::default();
        c.validate().unwrap();
        let text = c.to_toml();
        assert_eq!(RunConfig::from_toml(&text).unwrap(), c);
    }

    #[test]
    fn partial_toml_keeps_defaults() {
        let c = RunConfig::from_toml("seed = 7\n[workload.ycsb]\ntheta = 0.9\n").unwrap();
        assert_eq!(c.seed, 7);
        assert_eq!(c.workload.ycsb.theta, 0.9);
        assert_eq!(c.cluster.nodes, 4);
    }

    #[test]
    fn unknown_settings_are_rejected() {
        let err = RunConfig::from_toml("[cluster]\nnodez = 3\n").unwrap_err();
        assert!(err.contains("nodez"), "{err}");
    }

    fn invalid(f: impl FnOnce(&mut RunConfig)) -> ConfigError {
        let mut c = RunConfig::default();
        f(&mut c);
        c.validate().unwrap_err()
    }

    #[test]
    fn bad_values_are_rejected_with_the_setting_named() {
        assert_eq!(invalid(|c| c.cluster.nodes = 0).setting, "cluster.nodes");
        assert_eq!(
            invalid(|c| c.workload.ycsb.theta = -1.0).setting,
            "workload.ycsb.theta"
        );
        assert_eq!(
            invalid(|c| c.workload.ycsb.theta = f64::NAN).setting,
            "workload.ycsb.theta"
        );
        assert_eq!(
            invalid(|c| c.workload.ycsb.write_fraction = 1.5).setting,
            "workload.ycsb.write_fraction"
        );
        assert_eq!(
            invalid(|c| c.workload.ycsb.row_size = 1 << 30).setting,
            "workload.ycsb.row_size"
        );
        assert_eq!(
            invalid(|c| c.client.inflight = 0).setting,
            "client.inflight"
        );
        for rate in [-1.0, 1e-9, 1.5e8, 1e10, f64::INFINITY, f64::NAN] {
            let e = invalid(|c| c.client.rate = rate);
            assert_eq!(e.setting, "client.rate", "{rate}: {e}");
        }
        for rate in [0.0, 0.001, 1.0, 1e8] {
            let mut c = RunConfig::default();
            c.client.rate = rate;
            c.validate().unwrap();
        }
        let e = invalid(|c| {
            c.cluster.nodes = 1;
            c.workload.ycsb.multi_partition_fraction = 0.5;
        });
        assert!(e.to_string().contains("single-node"), "{e}");
        let e = invalid(|c| c.workload.ycsb.partitions_per_mp_txn = 9);
        assert!(
            e.to_string()
                .contains("between 2 and the number of nodes (4)"),
            "{e}"
        );
        let e = invalid(|c| {
            c.client.duration_s = 0.0;
            c.client.txns = 0;
        });
        assert_eq!(e.setting, "client.duration_s");
    }

    #[test]
    fn leap_ycsb_knobs_are_validated_and_round_trip_through_toml() {
        let remote = |c: &mut RunConfig| {
            c.cluster.nodes = 3;
            c.workload.ycsb.records_per_partition = 10_000;
            c.workload.ycsb.remote_access_fraction = 0.1;
        };
        let mut c = RunConfig::default();
        remote(&mut c);
        c.workload.ycsb.remote_locality = Some(0.9);
        c.workload.ycsb.steps = 15;
        c.workload.ycsb.remote_phases = parse_phases("10:1, 0.5:2,10:all").unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.workload.ycsb.remote_phases,
            [
                RemotePhase {
                    seconds: 10.0,
                    partitions: 1
                },
                RemotePhase {
                    seconds: 0.5,
                    partitions: 2
                },
                RemotePhase {
                    seconds: 10.0,
                    partitions: 0
                },
            ]
        );
        assert_eq!(
            format_phases(&c.workload.ycsb.remote_phases),
            "10:1,0.5:2,10:all"
        );
        assert_eq!(RunConfig::from_toml(&c.to_toml()).unwrap(), c);

        // Each knob needs remote accesses, and names the setting that enables them.
        for knob in [
            (|c: &mut RunConfig| c.workload.ycsb.remote_locality = Some(0.5)) as fn(&mut _),
            |c| c.workload.ycsb.remote_phases = parse_phases("1:1").unwrap(),
        ] {
            let e = invalid(|c| {
                remote(c);
                c.workload.ycsb.remote_access_fraction = 0.0;
                knob(c);
            });
            assert!(e.setting.starts_with("workload.ycsb.remote_"), "{e}");
            assert!(e.to_string().contains("remote_access_fraction"), "{e}");
        }
        let e = invalid(|c| {
            remote(c);
            c.workload.ycsb.remote_locality = Some(1.5);
        });
        assert_eq!(e.setting, "workload.ycsb.remote_locality");
        // 3 stripes of 3 x 16 keys each: 144 records per partition at least.
        let e = invalid(|c| {
            remote(c);
            c.workload.ycsb.records_per_partition = 143;
            c.workload.ycsb.remote_locality = Some(0.5);
        });
        assert_eq!(e.setting, "workload.ycsb.records_per_partition");
        assert!(e.to_string().contains("(144)"), "{e}");
        let mut ok = RunConfig::default();
        remote(&mut ok);
        ok.workload.ycsb.records_per_partition = 144;
        ok.workload.ycsb.remote_locality = Some(0.5);
        ok.validate().unwrap();

        let e = invalid(|c| c.workload.ycsb.steps = 16);
        assert_eq!(e.setting, "workload.ycsb.steps");
        assert!(
            e.to_string()
                .contains("at most workload.ycsb.ops_per_txn - 1 (15)"),
            "{e}"
        );

        for (phases, expect) in [
            ("0:1", "above 0"),
            ("1:3", "at most nodes - 1 (2)"),
            ("1:1,inf:1", "above 0"),
        ] {
            let e = invalid(|c| {
                remote(c);
                c.workload.ycsb.remote_phases = parse_phases(phases).unwrap();
            });
            assert_eq!(e.setting, "workload.ycsb.remote_phases");
            assert!(e.to_string().contains(expect), "{phases}: {e}");
        }
        for bad in ["", "1", "1:x", "x:1", "1:1,"] {
            assert!(parse_phases(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn replication_is_refused_where_it_is_not_built_yet() {
        let e = invalid(|c| c.replication.factor = 0);
        assert_eq!(e.setting, "replication.factor");
        let e = invalid(|c| {
            c.replication.factor = 2;
            c.protocol.name = "no_wait".into();
        });
        assert!(
            e.to_string().contains("qstore and calvin protocols only"),
            "{e}"
        );
        let e = invalid(|c| {
            c.replication.factor = 2;
            c.protocol.name = "calvin".into();
            c.replication.point = Some(2);
        });
        assert!(
            e.to_string()
                .contains("Calvin replicates its sequenced epochs"),
            "{e}"
        );
        let e = invalid(|c| {
            c.replication.factor = 3;
            c.replication.election_ticks = c.replication.heartbeat_ticks;
        });
        assert_eq!(e.setting, "replication.election_ticks");
        let e = invalid(|c| {
            c.replication.factor = 2;
            c.replication.point = Some(3);
            c.replication.mode = ReplicationMode::Synchronous;
        });
        assert!(e.to_string().contains("exists only once"), "{e}");
        let e = invalid(|c| {
            c.replication.factor = 2;
            c.replication.point = Some(4);
        });
        assert_eq!(e.setting, "replication.point");
        let e = invalid(|c| {
            c.replication.factor = 2;
            c.net.delay_us = 150_000;
        });
        assert!(e.to_string().contains("election timeout"), "{e}");
        let mut ok = RunConfig::default();
        ok.replication.factor = 3;
        ok.validate().unwrap();
        ok.protocol.name = "calvin".into();
        ok.validate().unwrap();
        assert_eq!(ok.replication.point_of("calvin"), 1);
        assert_eq!(ok.replication.point_of("qstore"), 2);
    }

    #[test]
    fn a_replicated_cluster_file_lists_every_server() {
        let mut c = RunConfig::default();
        c.cluster.nodes = 2;
        c.replication.factor = 2;
        let address = |i: u32| NodeAddress {
            peer: format!("127.0.0.1:{}", 7100 + i),
            client: format!("127.0.0.1:{}", 7200 + i),
            data_dir: String::new(),
        };
        c.cluster.addresses = (0..2).map(address).collect();
        let e = c.validate().unwrap_err();
        assert_eq!(e.setting, "cluster.addresses");
        assert!(
            e.to_string().contains("2 nodes x 2 copies = 4 servers"),
            "{e}"
        );
        c.cluster.addresses = (0..4).map(address).collect();
        c.validate().unwrap();
        assert_eq!(c.socket_addresses().unwrap().len(), 4);
    }

    #[test]
    fn a_cluster_file_address_used_twice_is_refused_naming_both_entries() {
        let two = |a: [&str; 4]| {
            let mut c = RunConfig::default();
            c.cluster.nodes = 2;
            c.cluster.addresses = vec![
                NodeAddress {
                    peer: a[0].into(),
                    client: a[1].into(),
                    data_dir: String::new(),
                },
                NodeAddress {
                    peer: a[2].into(),
                    client: a[3].into(),
                    data_dir: String::new(),
                },
            ];
            c
        };
        let ok = two([
            "127.0.0.1:7100",
            "127.0.0.1:7200",
            "127.0.0.1:7101",
            "127.0.0.1:7201",
        ]);
        ok.validate().unwrap();
        // Another host may use the same port.
        two([
            "10.0.0.1:7100",
            "10.0.0.1:7200",
            "10.0.0.2:7100",
            "10.0.0.2:7200",
        ])
        .validate()
        .unwrap();
        let cases = [
            (
                [
                    "127.0.0.1:7100",
                    "127.0.0.1:7200",
                    "127.0.0.1:7100",
                    "127.0.0.1:7201",
                ],
                "invalid cluster.addresses[1].peer = 127.0.0.1:7100: is also \
                 cluster.addresses[0].peer",
            ),
            (
                [
                    "127.0.0.1:7100",
                    "127.0.0.1:7200",
                    "127.0.0.1:7101",
                    "127.0.0.1:7200",
                ],
                "invalid cluster.addresses[1].client = 127.0.0.1:7200: is also \
                 cluster.addresses[0].client",
            ),
            (
                [
                    "127.0.0.1:7100",
                    "127.0.0.1:7100",
                    "127.0.0.1:7101",
                    "127.0.0.1:7201",
                ],
                "invalid cluster.addresses[0].client = 127.0.0.1:7100: is also \
                 cluster.addresses[0].peer",
            ),
            (
                [
                    "127.0.0.1:7100",
                    "127.0.0.1:7200",
                    "127.0.0.1:7200",
                    "127.0.0.1:7201",
                ],
                "invalid cluster.addresses[1].peer = 127.0.0.1:7200: is also \
                 cluster.addresses[0].client",
            ),
        ];
        for (addrs, expect) in cases {
            let e = two(addrs).validate().unwrap_err().to_string();
            assert!(e.starts_with(expect), "{addrs:?}: {e}");
        }
    }

    #[test]
    fn calvin_settings_parse_validate_and_round_trip() {
        let c = RunConfig::from_toml(
            "[protocol]\nname = \"calvin\"\n[protocol.calvin]\nlocks = \"vll\"\nepoch_txns = 100\n",
        )
        .unwrap();
        assert_eq!(c.protocol.calvin.locks, CalvinLocks::Vll);
        assert_eq!(c.protocol.calvin.epoch_txns, 100);
        assert_eq!(c.protocol.calvin.epoch_us, 5_000);
        c.validate().unwrap();
        assert_eq!(RunConfig::from_toml(&c.to_toml()).unwrap(), c);
        assert!(RunConfig::default()
            .to_toml()
            .contains("locks = \"lock-table\""));
        let err = RunConfig::from_toml("[protocol.calvin]\nlocks = \"2pl\"\n").unwrap_err();
        assert!(err.contains("lock-table"), "{err}");
        assert_eq!(
            invalid(|c| c.protocol.calvin.epoch_us = 0).setting,
            "protocol.calvin.epoch_us"
        );
        assert_eq!(
            invalid(|c| c.protocol.calvin.epoch_txns = 2_000_000).setting,
            "protocol.calvin.epoch_txns"
        );
    }

    #[test]
    fn error_message_names_value_and_range() {
        let e = invalid(|c| c.workload.ycsb.theta = -1.0);
        assert_eq!(
            e.to_string(),
            "invalid workload.ycsb.theta = -1: must be a finite number between 0 and 100 (0 = uniform)"
        );
    }

    /// A change to a configuration, for tables of invalid cases.
    type Edit = Box<dyn FnOnce(&mut RunConfig)>;

    fn invalid_for(workload: &str, f: impl FnOnce(&mut RunConfig)) -> ConfigError {
        invalid(|c| {
            c.workload.name = workload.into();
            f(c)
        })
    }

    #[test]
    fn bank_and_append_defaults_are_valid_and_round_trip_through_toml() {
        for name in ["bank", "append"] {
            let mut c = RunConfig::default();
            c.workload.name = name.into();
            c.validate().unwrap();
            assert_eq!(RunConfig::from_toml(&c.to_toml()).unwrap(), c);
        }
        let text = RunConfig::default().to_toml();
        assert!(text.contains("[workload.bank]") && text.contains("branch_size"));
        assert!(text.contains("[workload.append]") && text.contains("max_list_len"));
    }

    #[test]
    fn partial_bank_and_append_toml_keeps_defaults() {
        let c = RunConfig::from_toml(
            "[workload]\nname = \"bank\"\n[workload.bank]\nbranch_size = 4\n\
             [workload.append]\nops_per_txn = 8\n",
        )
        .unwrap();
        assert_eq!(c.workload.bank.branch_size, 4);
        assert_eq!(c.workload.bank.initial_balance, 1_000);
        assert_eq!(c.workload.append.ops_per_txn, 8);
        assert_eq!(c.workload.append.max_list_len, 32);
        c.validate().unwrap();
        let err = RunConfig::from_toml("[workload.bank]\nbranchsize = 3\n").unwrap_err();
        assert!(err.contains("branchsize"), "{err}");
    }

    #[test]
    fn only_the_selected_workload_is_validated() {
        let mut c = RunConfig::default();
        c.workload.bank.branch_size = 1;
        c.workload.append.max_list_len = 0;
        c.validate().unwrap();
    }

    #[test]
    fn bad_bank_values_are_rejected_with_the_setting_named() {
        let cases: Vec<(&str, Edit)> = vec![
            ("branch_size", Box::new(|c| c.workload.bank.branch_size = 1)),
            (
                "accounts_per_partition",
                Box::new(|c| c.workload.bank.accounts_per_partition = 15),
            ),
            (
                "initial_balance",
                Box::new(|c| c.workload.bank.initial_balance = -1),
            ),
            (
                "initial_balance",
                Box::new(|c| {
                    c.workload.bank.accounts_per_partition = 1 << 30;
                    c.workload.bank.initial_balance = 1 << 40;
                }),
            ),
            ("max_amount", Box::new(|c| c.workload.bank.max_amount = 0)),
            (
                "accounts_per_transfer",
                Box::new(|c| c.workload.bank.accounts_per_transfer = 1),
            ),
            (
                "accounts_per_transfer",
                Box::new(|c| c.workload.bank.accounts_per_transfer = 9),
            ),
            (
                "audit_fraction",
                Box::new(|c| c.workload.bank.audit_fraction = 1.5),
            ),
            ("theta", Box::new(|c| c.workload.bank.theta = f64::NAN)),
            (
                "multi_partition_fraction",
                Box::new(|c| c.workload.bank.multi_partition_fraction = 1.1),
            ),
            (
                "multi_partition_fraction",
                Box::new(|c| c.cluster.nodes = 1),
            ),
            (
                "multi_partition_fraction",
                Box::new(|c| {
                    c.workload.bank.branch_size = 3;
                    c.workload.bank.accounts_per_transfer = 2;
                }),
            ),
        ];
        for (setting, f) in cases {
            let e = invalid_for("bank", f);
            assert_eq!(e.setting, format!("workload.bank.{setting}"), "{e}");
        }
        let e = invalid_for("bank", |c| c.cluster.nodes = 1);
        assert!(e.to_string().contains("single-node"), "{e}");
        let mut c = RunConfig::default();
        c.workload.name = "bank".into();
        c.cluster.nodes = 1;
        c.workload.bank.multi_partition_fraction = 0.0;
        c.validate().unwrap();
    }

    #[test]
    fn bad_append_values_are_rejected_with_the_setting_named() {
        let cases: Vec<(&str, Edit)> = vec![
            (
                "max_list_len",
                Box::new(|c| c.workload.append.max_list_len = 0),
            ),
            (
                "max_list_len",
                Box::new(|c| c.workload.append.max_list_len = 1 << 20),
            ),
            (
                "ops_per_txn",
                Box::new(|c| c.workload.append.ops_per_txn = 0),
            ),
            (
                "ops_per_txn",
                Box::new(|c| c.workload.append.ops_per_txn = 65),
            ),
            (
                "active_keys",
                Box::new(|c| c.workload.append.active_keys = 3),
            ),
            (
                "keys_per_partition",
                Box::new(|c| c.workload.append.keys_per_partition = 15),
            ),
            (
                "read_fraction",
                Box::new(|c| c.workload.append.read_fraction = 1.01),
            ),
            (
                "multi_partition_fraction",
                Box::new(|c| c.workload.append.multi_partition_fraction = -0.1),
            ),
            (
                "multi_partition_fraction",
                Box::new(|c| c.cluster.nodes = 1),
            ),
            (
                "partitions_per_mp_txn",
                Box::new(|c| c.workload.append.partitions_per_mp_txn = 5),
            ),
            (
                "ops_per_txn",
                Box::new(|c| {
                    c.workload.append.ops_per_txn = 2;
                    c.workload.append.partitions_per_mp_txn = 3;
                }),
            ),
        ];
        for (setting, f) in cases {
            let e = invalid_for("append", f);
            assert_eq!(e.setting, format!("workload.append.{setting}"), "{e}");
        }
        assert_eq!(AppendConfig::default().row_size(), 8 + 8 * 32);
    }

    #[test]
    fn tpcc_defaults_are_valid_and_round_trip_through_toml() {
        let mut c = RunConfig::default();
        c.workload.name = "tpcc".into();
        c.validate().unwrap();
        assert_eq!(RunConfig::from_toml(&c.to_toml()).unwrap(), c);
        let text = RunConfig::default().to_toml();
        assert!(text.contains("[workload.tpcc]") && text.contains("mix = \"standard\""));
        let t = TpccConfig::default();
        assert_eq!(t.order_id_bits(), 16);
        assert_eq!(t.key_bits_per_warehouse(), 32);
    }

    /// The settings the figure specs of the Q-Store paper's TPC-C experiments use.
    #[test]
    fn tpcc_settings_of_the_figure_specs_parse() {
        let c = RunConfig::from_toml(
            "[cluster]\nnodes = 4\n[workload]\nname = \"tpcc\"\n[workload.tpcc]\n\
             warehouses_per_partition = 4\npayment_fraction = 0.5\n\
             multi_partition_fraction = 0.2\nmix = \"neworder-payment\"\n",
        )
        .unwrap();
        let t = &c.workload.tpcc;
        assert_eq!(t.warehouses_per_partition, 4);
        assert_eq!(t.payment_fraction, 0.5);
        assert_eq!(t.multi_partition_fraction, 0.2);
        assert_eq!(t.mix, TpccMix::NeworderPayment);
        assert_eq!(t.remote_payment_fraction, 0.15);
        c.validate().unwrap();
        let err = RunConfig::from_toml("[workload.tpcc]\nmix = \"payment\"\n").unwrap_err();
        assert!(err.contains("neworder-payment"), "{err}");
        let err = RunConfig::from_toml("[workload.tpcc]\nwarehouses = 3\n").unwrap_err();
        assert!(err.contains("warehouses"), "{err}");
    }

    /// LEAP's remote share per access: valid from 0 to 1 with multi-partition transactions
    /// off and 2+ partitions; otherwise refused, naming the setting (and the one in the way).
    #[test]
    fn tpcc_remote_access_fraction_is_validated_and_round_trips_through_toml() {
        let remote = |r: f64| {
            move |c: &mut RunConfig| {
                c.workload.name = "tpcc".into();
                c.cluster.nodes = 3;
                c.workload.tpcc.multi_partition_fraction = 0.0;
                c.workload.tpcc.remote_access_fraction = r;
            }
        };
        for r in [0.0, 0.01, 0.5, 1.0] {
            let mut c = RunConfig::default();
            remote(r)(&mut c);
            c.validate().unwrap();
            assert_eq!(RunConfig::from_toml(&c.to_toml()).unwrap(), c);
        }
        assert_eq!(TpccConfig::default().remote_access_fraction, 0.0);
        let c = RunConfig::from_toml(
            "[workload]\nname = \"tpcc\"\n[workload.tpcc]\nremote_access_fraction = 0.1\n\
             multi_partition_fraction = 0.0\n",
        )
        .unwrap();
        assert_eq!(c.workload.tpcc.remote_access_fraction, 0.1);
        c.validate().unwrap();
        // Both modes at once: the error names both settings and how to choose.
        let e = invalid(|c| {
            remote(0.1)(c);
            c.workload.tpcc.multi_partition_fraction = 0.15;
        });
        assert_eq!(e.setting, "workload.tpcc.remote_access_fraction");
        let text = e.to_string();
        for want in [
            "workload.tpcc.remote_access_fraction",
            "workload.tpcc.multi_partition_fraction",
            "must be 0 when",
            "--mp-fraction 0",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        // The default multi-partition fraction (0.15) is in the way too.
        let e = invalid(|c| {
            c.workload.name = "tpcc".into();
            c.workload.tpcc.remote_access_fraction = 0.1;
        });
        assert!(e.to_string().contains("0.15"), "{e}");
        for bad in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
            let e = invalid(|c| remote(bad)(c));
            assert_eq!(e.setting, "workload.tpcc.remote_access_fraction", "{bad}");
            assert!(e.to_string().contains("between 0 and 1"), "{bad}: {e}");
        }
        let e = invalid(|c| {
            remote(0.1)(c);
            c.cluster.nodes = 1;
        });
        assert_eq!(e.setting, "workload.tpcc.remote_access_fraction");
        assert!(e.to_string().contains("single-node"), "{e}");
    }

    #[test]
    fn bad_tpcc_values_are_rejected_with_the_setting_named() {
        let np = |c: &mut RunConfig| c.workload.tpcc.mix = TpccMix::NeworderPayment;
        let cases: Vec<(&str, Edit)> = vec![
            (
                "workload.tpcc.warehouses_per_partition",
                Box::new(|c| c.workload.tpcc.warehouses_per_partition = 0),
            ),
            (
                "workload.tpcc.warehouses_per_partition",
                Box::new(|c| c.workload.tpcc.warehouses_per_partition = 65),
            ),
            (
                "workload.tpcc.max_orders_per_district",
                Box::new(|c| c.workload.tpcc.max_orders_per_district = 3_000),
            ),
            // 2^16 warehouses of 2^48 HISTORY keys each: 2^64 keys.
            (
                "workload.tpcc.max_orders_per_district",
                Box::new(|c| {
                    c.cluster.nodes = 1024;
                    c.workload.tpcc.warehouses_per_partition = 64;
                    c.workload.tpcc.max_orders_per_district = u32::MAX;
                }),
            ),
            // 64 * 110 * 10^6 order lines in one partition.
            (
                "workload.tpcc.max_orders_per_district",
                Box::new(|c| {
                    c.workload.tpcc.warehouses_per_partition = 64;
                    c.workload.tpcc.max_orders_per_district = 1_000_000;
                }),
            ),
            (
                "workload.tpcc.payment_fraction",
                Box::new(|c| c.workload.tpcc.payment_fraction = 0.42),
            ),
            (
                "workload.tpcc.payment_fraction",
                Box::new(|c| c.workload.tpcc.payment_fraction = 1.0),
            ),
            (
                "workload.tpcc.payment_fraction",
                Box::new(move |c| {
                    np(c);
                    c.workload.tpcc.payment_fraction = f64::NAN;
                }),
            ),
            (
                "workload.tpcc.order_status_fraction",
                Box::new(|c| c.workload.tpcc.order_status_fraction = 0.04),
            ),
            (
                "workload.tpcc.order_status_fraction",
                Box::new(move |c| {
                    np(c);
                    c.workload.tpcc.payment_fraction = 0.9;
                    c.workload.tpcc.order_status_fraction = 0.2;
                }),
            ),
            (
                "workload.tpcc.order_status_fraction",
                Box::new(move |c| {
                    np(c);
                    c.workload.tpcc.order_status_fraction = -0.1;
                }),
            ),
            (
                "workload.tpcc.stock_level_fraction",
                Box::new(move |c| {
                    np(c);
                    c.workload.tpcc.order_status_fraction = 0.3;
                    c.workload.tpcc.stock_level_fraction = 0.3;
                }),
            ),
            (
                "workload.tpcc.delivery_fraction",
                Box::new(move |c| {
                    np(c);
                    c.workload.tpcc.delivery_fraction = 0.6;
                }),
            ),
            (
                "workload.tpcc.multi_partition_fraction",
                Box::new(|c| c.workload.tpcc.multi_partition_fraction = 1.5),
            ),
            (
                "workload.tpcc.multi_partition_fraction",
                Box::new(|c| c.cluster.nodes = 1),
            ),
            (
                "workload.tpcc.remote_access_fraction",
                Box::new(|c| {
                    c.workload.tpcc.multi_partition_fraction = 0.0;
                    c.workload.tpcc.remote_access_fraction = 1.5;
                }),
            ),
            (
                "workload.tpcc.remote_access_fraction",
                Box::new(|c| {
                    c.workload.tpcc.multi_partition_fraction = 0.0;
                    c.workload.tpcc.remote_access_fraction = f64::NAN;
                }),
            ),
            (
                "workload.tpcc.remote_access_fraction",
                Box::new(|c| c.workload.tpcc.remote_access_fraction = 0.1),
            ),
            (
                "workload.tpcc.remote_new_order_line_fraction",
                Box::new(|c| c.workload.tpcc.remote_new_order_line_fraction = -0.1),
            ),
            (
                "workload.tpcc.remote_payment_fraction",
                Box::new(|c| c.workload.tpcc.remote_payment_fraction = 2.0),
            ),
            (
                "cluster.partitioning",
                Box::new(|c| c.cluster.partitioning = Partitioning::Hash),
            ),
        ];
        for (setting, f) in cases {
            let e = invalid_for("tpcc", f);
            assert_eq!(e.setting, setting, "{e}");
        }
        let e = invalid_for("tpcc", |c| c.workload.tpcc.payment_fraction = 0.0);
        assert!(e.to_string().contains("neworder-payment"), "{e}");
        let mut c = RunConfig::default();
        c.workload.name = "tpcc".into();
        for (mix, pay) in [
            (TpccMix::NeworderPayment, 0.0),
            (TpccMix::NeworderPayment, 1.0),
            (TpccMix::Standard, 0.88),
        ] {
            c.workload.tpcc.mix = mix;
            c.workload.tpcc.payment_fraction = pay;
            c.validate().unwrap();
        }
        c.workload.tpcc.mix = TpccMix::NeworderPayment;
        c.workload.tpcc.payment_fraction = 0.5;
        c.workload.tpcc.order_status_fraction = 0.5;
        c.validate().unwrap();
        c.cluster.nodes = 1;
        c.workload.tpcc.multi_partition_fraction = 0.0;
        c.validate().unwrap();
    }
}
