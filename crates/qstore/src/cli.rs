//! Command-line interface.

use crate::sizing;
use clap::{Args, Parser, Subcommand};
use qstore_bench::{Progress, RunOptions};
use qstore_core::config::{
    parse_phases, CachePolicy, CalvinLocks, DependentLookup, Fsync, Isolation, ItemPlacement,
    Partitioning, QStoreMode, RemotePhase, ReplicationCompression, ReplicationLayer,
    ReplicationMode, TpccMix,
};
use qstore_core::{QError, RunConfig};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Exit code of invalid input (bad flags, bad configuration values).
pub(crate) const EXIT_USAGE: i32 = 2;
/// Exit code of a run that failed.
pub(crate) const EXIT_FAILURE: i32 = 1;

#[derive(Parser)]
#[command(
    name = "qstore",
    version,
    about = "qstore: a distributed in-memory transaction engine with queue-oriented deterministic \
             transactions (Q-Store) and the protocols it is compared with",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a workload on an embedded cluster (all nodes in this process) and print results.
    ///
    /// Settings come from the defaults (see `qstore config --default`), then the --config
    /// file, then the flags below.
    ///
    /// Exit code 2 for invalid settings (nothing runs); 1 when the run fails: a check of
    /// --verify fails, the cluster refuses requests, or nothing commits in the measurement
    /// window (unless an open loop had no arrival due in it).
    Run(Box<RunArgs>),
    /// Print a configuration as TOML.
    Config(ConfigArgs),
    /// List the protocols `--protocol` accepts.
    Protocols(ProtocolsArgs),
    /// Run a benchmark suite (several runs, one after another, on this machine) and print
    /// throughput, ratios to each run's baseline, latency and messages per transaction.
    ///
    /// The run flags set what the suite does not (duration, load, seed...); the suite sets the
    /// protocol, cluster shape and workload of each run.
    Bench(Box<BenchArgs>),
    /// Redraw a figure of the papers: run its experiment spec (a sweep of one parameter over
    /// several protocols, in rounds), write results.csv and summary.csv, draw figure.png and
    /// figure.svg, and say whether the paper's claim holds here, with the numbers.
    ///
    /// `qstore figure --list` lists the specs; `qstore figure --all --quick` draws every
    /// figure this build can and an index page of them. Exit code 2 for a spec that is
    /// invalid or needs what this build does not have, 1 when a run failed (transactions
    /// left unanswered, nothing committed). A claim that does not hold is a result, not a
    /// failure.
    Figure(crate::figure::FigureArgs),
    /// Check a recorded history (from `run --engine-history`) for serializability anomalies.
    ///
    /// Builds the direct serialization graph (ww, wr and rw edges) and reports G0, G1a, G1b,
    /// G1c, G2 and reads of versions that never existed, each with a short cycle. Exit code 0
    /// when serializable, 1 when anomalies are found, 2 when the file cannot be read.
    Check(CheckArgs),
    /// Start one node of a distributed cluster: listen on its addresses from the cluster
    /// file, load its partition, connect to every peer, then serve clients until SIGINT or
    /// SIGTERM.
    ///
    /// A cluster file is a configuration (as `qstore config` prints) whose [cluster] section
    /// lists every node's addresses, e.g.
    /// `addresses = [{ peer = "127.0.0.1:7100", client = "127.0.0.1:7200" }, ...]`, and
    /// names the cluster's secret (`secret_file = "cluster.secret"`, made by `qstore secret`),
    /// which every peer and client must prove it holds. Client limits are under [server].
    /// `qstore cluster` writes one and starts everything on this machine.
    ///
    /// Exit code 2 for a mistake in the cluster file or the flags (an invalid value, an
    /// address used twice or that this host cannot listen on, a --node the file does not
    /// have), 1 when the server fails while starting or serving (e.g. a peer never comes).
    Server(ServerArgs),
    /// Serve Redis clients (redis-cli, redis-benchmark, client libraries) from an embedded
    /// cluster: every command is a serializable transaction of the kv workload on the chosen
    /// protocol, MULTI/EXEC one transaction across partitions, WATCH checked on the buckets'
    /// versions.
    ///
    /// Takes `run`'s cluster and kv flags (--protocol, --nodes, --workers, --kv-buckets,
    /// --kv-bucket-bytes). With --verify the cluster records every transaction the clients
    /// ran and, once stopped, checks the history and replays it against the serial oracle
    /// (deterministic protocols); exit code 1 if a check fails. Clients must AUTH: with the password printed at start, the one
    /// derived from --secret-file, or not at all with --no-auth (loopback only).
    /// Supported: GET, SET [NX|XX], DEL, EXISTS, INCR, INCRBY, DECR, DECRBY, APPEND, STRLEN,
    /// MGET, MSET, DBSIZE, MULTI, EXEC, DISCARD, WATCH, UNWATCH, PING, ECHO, SELECT 0, AUTH,
    /// HELLO [2|3], CLIENT SETNAME/GETNAME/ID, COMMAND, INFO, QUIT.
    Redis(Box<RedisArgs>),
    /// Load Redis ports with YCSB-16 as Redis transactions (MULTI, 8 GETs, 8 INCRs, EXEC,
    /// one pipeline each; or, with --form lua, the same as a Lua script on servers that run
    /// scripts) and print throughput and latency per server as a table (and CSV with
    /// --output): compares qstore's port with a real redis-server under the same load.
    ///
    /// Exit code 1 when a server cannot be reached or answers an EXEC with an error.
    RedisBench(RedisBenchArgs),
    /// Print the Redis password of a cluster (derived from its secret; the secret itself
    /// never crosses the network).
    RedisPassword(RedisPasswordArgs),
    /// Run the load generator against the servers of a distributed cluster and print the same
    /// results as `qstore run`, with the servers' message counts.
    ///
    /// Settings come from the cluster file; the flags may change the load (clients, inflight,
    /// duration, rate, workload mix), not the servers.
    Client(Box<ClientArgs>),
    /// Start a distributed cluster on this machine: one `qstore server` process per node (per
    /// copy of every partition with --replication-factor) on loopback ports, then one
    /// `qstore client` process, with their output streamed here; stop everything when the
    /// client is done (or on Ctrl-C).
    ///
    /// Takes the same flags as `run`; the cluster file it writes is removed afterwards unless
    /// --cluster-file names where to keep it.
    Cluster(Box<ClusterArgs>),
    /// Create a cluster secret file: 32 random bytes as hex, readable only by you (mode 600).
    ///
    /// Name it in the cluster file as `secret_file` under [cluster]; every server and client
    /// of the cluster proves it holds the secret when it connects (the secret itself never
    /// crosses the network). `qstore cluster` makes one for each launch by itself.
    Secret(SecretArgs),
    /// Measure a ZooKeeper server's write latency by payload size (QR-Store's figure 4, the
    /// cost of the middleware Calvin replicates through): `--requests` writes of each size,
    /// `--concurrency` at once; a table, results.csv and figure.png/svg under --out.
    ///
    /// Exit code 2 for invalid flags, 1 when no server answers or a write fails.
    ZookeeperLatency(crate::zk_latency::ZkLatencyArgs),
}

#[derive(Args)]
struct SecretArgs {
    /// Where to write the secret; an existing file is never overwritten.
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

#[derive(Args)]
struct ClusterArgs {
    /// Write the cluster file here and keep it (default: a temporary file).
    #[arg(long, value_name = "FILE")]
    cluster_file: Option<PathBuf>,
    /// Fault injection (replicated clusters): this long after the client started, kill the
    /// server leading --kill-partition's replica group with SIGKILL. Its group elects
    /// another leader and the run goes on; the launcher says when, and the client's results
    /// show the longest time without a commit. Try it with --verify and --history.
    #[arg(long, value_name = "MS", help_heading = "Replication")]
    kill_leader_after_ms: Option<u64>,
    /// The partition whose group leader --kill-leader-after-ms kills.
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0,
        help_heading = "Replication"
    )]
    kill_partition: u32,
    /// Start the server --kill-leader-after-ms killed again, this long after the kill, as a
    /// rebooted machine would come back without its copy: it rejoins its group as a
    /// follower, and its cluster instance is rebuilt from another instance's copies
    /// (protocols qstore and calvin).
    #[arg(long, value_name = "MS", help_heading = "Replication")]
    restart_after_ms: Option<u64>,
    /// Also serve Redis clients while the cluster runs: server N listens on
    /// 127.0.0.1:PORT+N (workload kv only). The password is printed once the servers are
    /// ready; raise --duration to keep the cluster up longer.
    #[arg(long, value_name = "PORT")]
    redis_port: Option<u16>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct ServerArgs {
    /// Cluster file (TOML).
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,
    /// Which server of the cluster file this is (0 to its number of addresses - 1; with
    /// replication, server s holds partition s mod nodes in cluster instance s / nodes).
    #[arg(long)]
    node: u32,
    /// Record this node's part of the engine history, for `qstore client --verify`.
    #[arg(long)]
    record_history: bool,
    /// This server's data directory (overrides the cluster file's; see `qstore run --help`,
    /// Durability).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Also serve Redis clients on this address (the cluster must run the kv workload);
    /// they AUTH with the password `qstore redis-password --cluster FILE` prints.
    #[arg(long, value_name = "ADDR")]
    redis: Option<std::net::SocketAddr>,
}

#[derive(Args)]
struct RedisArgs {
    /// Where to listen for Redis clients.
    #[arg(long, default_value = "127.0.0.1:7379", value_name = "ADDR")]
    listen: std::net::SocketAddr,
    /// Clients AUTH with the password derived from this cluster secret file (see `qstore
    /// redis-password`); without it a secret is made for this run and its password printed.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// Let every client in without AUTH (only on a loopback address).
    #[arg(long)]
    no_auth: bool,
    /// Event-loop threads serving Redis clients (server.io_threads; default one per 4
    /// cores). Each runs its connections' transactions, so more help where cores are spare.
    #[arg(long, value_name = "N")]
    io_threads: Option<u32>,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECONDS")]
    serve_for: Option<f64>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct RedisBenchArgs {
    /// Servers to load, each a Redis port (qstore's or a real redis-server), one after the
    /// other with the same load.
    #[arg(long = "addr", value_name = "ADDR", required = true)]
    addrs: Vec<std::net::SocketAddr>,
    /// AUTH with this password (the same for every server).
    #[arg(long)]
    password: Option<String>,
    /// Concurrent clients (connections), each with one transaction in flight.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds per server.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Keys key:0 .. drawn uniformly.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// GETs per transaction.
    #[arg(long, default_value_t = 8)]
    reads: usize,
    /// INCRs (read-modify-writes) per transaction.
    #[arg(long, default_value_t = 8)]
    rmws: usize,
    /// How each transaction is sent: `multi` (MULTI, the commands, EXEC) or `lua` (EVALSHA
    /// of a script running the same commands; servers without scripts, such as qstore's
    /// port, are skipped). Several forms, comma-separated, run one after the other.
    #[arg(long, value_delimiter = ',', default_value = "multi", value_parser = parse_bench_form)]
    form: Vec<qstore_redis::bench::Form>,
    /// Also write the results as CSV to this file.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

fn parse_bench_form(s: &str) -> Result<qstore_redis::bench::Form, String> {
    match s {
        "multi" => Ok(qstore_redis::bench::Form::Multi),
        "lua" => Ok(qstore_redis::bench::Form::Lua),
        _ => Err(format!("unknown form {s:?}: use multi or lua")),
    }
}

#[derive(Args)]
struct RedisPasswordArgs {
    /// Cluster file (TOML) whose secret_file the password is derived from.
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,
}

#[derive(Args)]
struct ClientArgs {
    /// Cluster file (TOML) of the running servers.
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct BenchArgs {
    /// Suite to run: qstore, baselines, qrstore, sundial or tpcc (see --list).
    #[arg(long, default_value = "qstore")]
    suite: String,
    /// List the suites and exit.
    #[arg(long)]
    list: bool,
    /// Rounds: each runs every scenario once. A scenario reports its median run, and its
    /// ratio is the median over rounds of its throughput over its baseline's in the same
    /// round (repeat to trust a ratio on a noisy machine).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=99))]
    repeat: u32,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct ProtocolsArgs {
    /// Names only, one per line (for scripts).
    #[arg(long)]
    names: bool,
}

#[derive(Args)]
struct CheckArgs {
    /// History file in qstore's JSON-lines format.
    #[arg(value_name = "FILE", required_unless_present = "synthetic")]
    file: Option<PathBuf>,
    /// Instead of a file, generate a serializable history of N transactions and time parsing
    /// and checking it (a benchmark of the checker).
    #[arg(long, value_name = "N", conflicts_with = "file")]
    synthetic: Option<usize>,
}

#[derive(Args)]
struct ConfigArgs {
    /// Print the full default configuration (a starting point for --config files).
    #[arg(long)]
    default: bool,
    /// Print this file's configuration with every default filled in (after validation).
    #[arg(long, value_name = "FILE", conflicts_with = "default")]
    config: Option<PathBuf>,
}

#[derive(Args, Default)]
struct RunArgs {
    /// TOML configuration file; flags override its values.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    // --- system under test ---
    #[arg(long, help_heading = "Cluster", help = protocol_help())]
    protocol: Option<String>,
    /// Nodes in the cluster; each hosts one partition.
    #[arg(long, help_heading = "Cluster")]
    nodes: Option<u32>,
    /// Worker threads per node (default: the machine's cores shared among the nodes, at
    /// least one each).
    #[arg(long, help_heading = "Cluster")]
    workers: Option<u32>,
    /// How keys map to partitions: range or hash.
    #[arg(long, value_parser = parse_partitioning, help_heading = "Cluster")]
    partitioning: Option<Partitioning>,
    /// Pin worker threads to cores.
    #[arg(long, help_heading = "Cluster")]
    pin_threads: bool,
    /// Slow down this node as if CPU-bound threads (--slow-threads) shared its cores: its
    /// threads spin, after each piece of work, that many times as long as it took (the
    /// determinism study's slow node; one machine cannot give one node fewer cores).
    #[arg(long, help_heading = "Cluster")]
    slow_node: Option<u32>,
    /// With --slow-node: how many CPU-bound threads the slow node shares its cores with.
    #[arg(long, help_heading = "Cluster")]
    slow_threads: Option<u32>,
    /// With --slow-node: seconds after the cluster started at which the node slows down.
    #[arg(long, help_heading = "Cluster")]
    slow_from_s: Option<f64>,
    /// Capacity of each node's client admission queue.
    #[arg(long, help_heading = "Cluster")]
    admission_queue: Option<u32>,
    /// Q-Store: execution paradigm for transactions that may abort: speculative (default;
    /// aborts cascade to transactions that touched their writes) or conservative (wait for
    /// the verdict, no cascades).
    #[arg(long, value_parser = parse_qstore_mode, help_heading = "Q-Store")]
    qstore_mode: Option<QStoreMode>,
    /// Q-Store: isolation level: serializable or read-committed.
    #[arg(long, value_parser = parse_isolation, help_heading = "Q-Store")]
    isolation: Option<Isolation>,
    /// Q-Store: most transactions per planner batch (a full batch closes; see --full-batches).
    #[arg(long, help_heading = "Q-Store")]
    batch_size: Option<u32>,
    /// Q-Store: close a batch after this many microseconds even if not full.
    #[arg(long, help_heading = "Q-Store")]
    batch_timeout_us: Option<u64>,
    /// Q-Store: close batches only when full or timed out (the paper's count-based
    /// demarcation); by default a worker with nothing to execute closes its batch early.
    #[arg(long, help_heading = "Q-Store")]
    full_batches: bool,
    /// Q-Store: execution queues per planner and node (0 = one per worker).
    #[arg(long, help_heading = "Q-Store")]
    eqs_per_planner: Option<u32>,
    /// Q-Store: batches a node keeps in flight (1 = a node-level barrier between batches).
    #[arg(long, help_heading = "Q-Store")]
    pipeline_depth: Option<u32>,
    /// Q-Store: planners per node (0 = one per worker).
    #[arg(long, help_heading = "Q-Store")]
    planners: Option<u32>,
    /// Q-Store: planners get threads of their own that do not execute (split roles).
    #[arg(long, help_heading = "Q-Store")]
    dedicated_planners: bool,
    /// Replication (QR-Store): copies of every partition, each on its own node: --nodes x this
    /// nodes in all, one cluster instance per copy (1 = no replication; qstore and calvin only).
    #[arg(long, help_heading = "Replication")]
    replication_factor: Option<u32>,
    /// Replication: speculative (default; a leader executes a batch while the group's log
    /// replicates it, and answers once both are done) or synchronous (execution waits for
    /// the log).
    #[arg(long, value_parser = parse_replication_mode, help_heading = "Replication")]
    replication_mode: Option<ReplicationMode>,
    /// Replication point of Q-Store: 2 (default) replicates each planner batch's execution
    /// queues after planning; 1 replicates its transactions before planning, and every member
    /// plans them itself (execution then waits for the log, whatever --replication-mode
    /// says); 3 replicates, once a planner batch ran in the leader's instance, write-only
    /// queues holding the last committed write of each record, which the other members put
    /// in place without running the transactions (speculative only). Calvin replicates at
    /// point 1 only (its sequenced epochs, before they run).
    #[arg(long, value_name = "1|2|3", help_heading = "Replication")]
    replication_point: Option<u32>,
    /// Replication: how a leader compresses each batch it proposes to its group's log:
    /// none (default), lz4 or snappy.
    #[arg(long, value_parser = parse_replication_compression, help_heading = "Replication")]
    replication_compression: Option<ReplicationCompression>,
    /// Replication: what keeps each replica group's log: raft (default: among the group's
    /// servers, on the cluster's own connections) or zookeeper (Calvin only, as in Calvin's
    /// paper: the servers are clients of the ZooKeeper server at --zookeeper; start one with
    /// scripts/zookeeper.sh).
    #[arg(long, value_parser = parse_replication_layer, help_heading = "Replication")]
    replication_layer: Option<ReplicationLayer>,
    /// Replication: ZooKeeper's client address (host:port) for --replication-layer zookeeper
    /// (default 127.0.0.1:2181).
    #[arg(long, value_name = "HOST:PORT", help_heading = "Replication")]
    zookeeper: Option<String>,
    /// Durability: keep each server's log on disk, in DIR/server-S for server S, and recover
    /// from it on start (every protocol but serial: command logging for qstore and calvin,
    /// write-ahead logging with 2PC for the others; the embedded cluster keeps everything in
    /// memory without it). A directory of another cluster or server is refused.
    #[arg(long, value_name = "DIR", help_heading = "Durability")]
    data_dir: Option<PathBuf>,
    /// Durability: when the log is synced to disk: always (default; a transaction is answered
    /// once its record is on disk, records written meanwhile share one sync), batch (synced
    /// every 10 ms: a power failure loses the last moments) or never (left to the operating
    /// system: survives a crash of the process, not of the machine).
    #[arg(long, value_parser = parse_fsync, help_heading = "Durability")]
    fsync: Option<Fsync>,
    /// Durability: seconds between two checkpoints (default 60; 0 = never), after which the
    /// log before them is dropped, so it stops growing and recovery reads less. Interactive
    /// protocols fold their write-ahead log into the checkpoint in the background; qstore and
    /// calvin copy every partition at one batch (epoch) boundary (replicated: each cluster
    /// instance at its own).
    #[arg(long, value_name = "SECONDS", help_heading = "Durability")]
    checkpoint_interval_s: Option<u64>,
    /// Calvin: lock manager of the schedulers: lock-table (default) or vll.
    #[arg(long, value_parser = parse_calvin_locks, help_heading = "Calvin")]
    calvin_locks: Option<CalvinLocks>,
    /// Calvin: a sequencer closes its epoch after this many microseconds.
    #[arg(long, help_heading = "Calvin")]
    calvin_epoch_us: Option<u64>,
    /// Calvin: also close an epoch once it holds this many transactions (0 = time only).
    #[arg(long, help_heading = "Calvin")]
    calvin_epoch_txns: Option<u32>,
    /// DL_DETECT: the deadlock detector gathers every node's waits-for edges this often.
    #[arg(long, help_heading = "DL_DETECT")]
    dl_detect_interval_us: Option<u64>,
    /// DL_DETECT, UNSAFE (measurement only): no two-phase commit. Participants commit as
    /// soon as a transaction ran everywhere, without a prepare round: the upper bound on
    /// what 2PC costs. A crash could commit a transaction at some nodes only, so a
    /// data directory is refused with it.
    #[arg(long, help_heading = "DL_DETECT")]
    dl_detect_skip_2pc: bool,
    /// Nondeterministic protocols: a node that falls behind refuses a growing share of its
    /// single-partition transactions (retried by their clients), to serve the distributed
    /// ones other nodes wait for (the determinism study's throttling).
    #[arg(long, help_heading = "Cluster")]
    throttle: bool,
    /// MVCC: older versions kept per row (1-64); a read needing an older one aborts.
    #[arg(long, help_heading = "MVCC")]
    mvcc_max_versions: Option<u32>,
    /// Sundial: memory of each node's cache of rows read at other nodes, in MB (default 64;
    /// 0 = no cache). Least recently used rows leave first.
    #[arg(long, value_name = "MB", help_heading = "Sundial")]
    sundial_cache_mb: Option<u32>,
    /// Sundial: when a read uses a cached row: always-reuse (rows rarely written),
    /// always-request (ask the home every time; it sends the row only if the copy is stale,
    /// which saves traffic, not round trips) or hybrid (default: reuse while copies are
    /// found current, request otherwise).
    #[arg(long, value_parser = parse_cache_policy, value_name = "POLICY", help_heading = "Sundial")]
    sundial_cache_policy: Option<CachePolicy>,
    /// Sundial: turn off the read-only table optimisations (one lease per read-mostly table,
    /// extended speculatively), to measure what they bring.
    #[arg(long, help_heading = "Sundial")]
    sundial_no_table_leases: bool,
    /// Injected one-way network delay per message, in microseconds.
    #[arg(long, help_heading = "Cluster")]
    delay_us: Option<u64>,
    /// Extra uniformly random delay per message in [0, jitter), in microseconds.
    #[arg(long, help_heading = "Cluster")]
    jitter_us: Option<u64>,
    /// Injected clock skew, in microseconds: node n of N reads the clock n*skew/(N-1)
    /// behind (timestamp and mvcc take their timestamps from the clock).
    #[arg(long, help_heading = "Cluster")]
    clock_skew_us: Option<u64>,
    /// Fault injection (embedded cluster only): the fraction of messages between nodes lost.
    /// Protocols do not survive lost messages: the run ends with transactions unanswered.
    #[arg(long, help_heading = "Cluster")]
    drop_fraction: Option<f64>,
    /// Fault injection (embedded cluster only): cut this server off from every other one
    /// (no message in or out), as if its machine died, `--cut-off-after-ms` into the run.
    /// With `--replication-factor 3`, its replica group elects another leader and the run
    /// goes on; try it with `--verify`.
    #[arg(long, help_heading = "Cluster", value_name = "SERVER")]
    cut_off_node: Option<u32>,
    /// When `--cut-off-node` strikes, in milliseconds after the cluster started.
    #[arg(long, help_heading = "Cluster", value_name = "MS")]
    cut_off_after_ms: Option<u64>,
    /// How long the cut lasts, in milliseconds (default 0: to the end of the run). Then the
    /// server is back, as if its machine restarted: with replication, its cluster instance
    /// is rebuilt from another instance's copies and serves again.
    #[arg(long, help_heading = "Cluster", value_name = "MS")]
    cut_off_for_ms: Option<u64>,

    // --- workload ---
    /// Workload: ycsb, micro, bank, append or tpcc.
    #[arg(long, help_heading = "Workload")]
    workload: Option<String>,
    /// Seed of every random choice (same seed, same workload stream).
    #[arg(long, help_heading = "Workload")]
    seed: Option<u64>,
    /// Rows per partition (ycsb and micro records, bank accounts, append keys); refused when the
    /// partitions this process loads cannot fit in the memory available.
    #[arg(long, help_heading = "Workload")]
    records: Option<u64>,
    /// Record accesses per transaction (ycsb, micro, append).
    #[arg(long, help_heading = "Workload")]
    ops: Option<u32>,
    /// Zipfian skew θ of key choice (ycsb keys, bank branches): 0 = uniform; 0.99 and above allowed.
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    theta: Option<f64>,
    /// Fraction of multi-partition transactions, 0 to 1 (every workload).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    mp_fraction: Option<f64>,
    /// Partitions a multi-partition transaction touches (ycsb, micro, append).
    #[arg(long, help_heading = "Workload")]
    mp_partitions: Option<u32>,
    /// ycsb: bytes per row (8 to 1048576).
    #[arg(long, help_heading = "Workload")]
    row_size: Option<usize>,
    /// ycsb: fraction of accesses that are read-modify-writes (0 to 1).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    write_fraction: Option<f64>,
    /// ycsb: Zipfian skew θ of the keys written, --theta then being that of the keys read
    /// (default: --theta for both). Sundial's read-hot workload: --theta 1.3 --write-theta 0.
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    write_theta: Option<f64>,
    /// ycsb, tpcc: remote accesses instead of multi-partition transactions: each access goes
    /// to a uniformly chosen other partition with this probability (Sundial's mode for ycsb,
    /// e.g. 0.1; LEAP's figure 9 for tpcc, where the accesses are New-Order lines and Payment
    /// customers, and --mp-fraction then defaults to 0).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    remote_access_fraction: Option<f64>,
    /// ycsb, with --remote-access-fraction: LEAP's P(L|R), the probability that a remote
    /// access is with locality (touches rows of the other partition that only this home's
    /// transactions touch; the others touch rows shared with every home).
    #[arg(
        long,
        value_name = "P",
        allow_negative_numbers = true,
        help_heading = "Workload"
    )]
    remote_locality: Option<f64>,
    /// ycsb: LEAP's multi-step transactions: N intermediate results, the accesses split into
    /// N+1 steps, each taking the result of the step before and each after the first
    /// beginning with an access to another partition (0 = one step; at most --ops - 1).
    #[arg(long, value_name = "N", help_heading = "Workload")]
    steps: Option<u32>,
    /// ycsb, with --remote-access-fraction: LEAP's access-pattern phases, SECONDS:K,... each
    /// sending remote accesses to the K partitions after the home one (all: every other)
    /// for SECONDS, in a cycle, timed from the load generator's start, warm-up included (so
    /// the stream depends on timing, not on --seed alone), e.g. 10:1,10:2,10:all.
    #[arg(long, value_name = "PHASES", value_parser = parse_remote_phases, help_heading = "Workload")]
    remote_phases: Option<RemotePhases>,
    /// ycsb: allow a transaction to pick the same key twice.
    #[arg(long, help_heading = "Workload")]
    allow_duplicate_keys: bool,
    /// ycsb: declare the table read-mostly (Sundial then leases it as a whole).
    #[arg(long, help_heading = "Workload")]
    read_mostly: bool,
    /// micro: the contention index, 1 / the hot records per partition (above 0, at most 1):
    /// each transaction updates one hot record at every partition it touches, e.g. 0.01
    /// (100 hot records, high contention) or 0.0001 (10000, low; the default).
    #[arg(
        long,
        value_name = "CI",
        allow_negative_numbers = true,
        help_heading = "Workload"
    )]
    contention_index: Option<f64>,
    /// micro: CPU work each record access performs, in microseconds (0 = short transactions,
    /// the default; the paper's long transactions do 15).
    #[arg(
        long,
        value_name = "US",
        allow_negative_numbers = true,
        help_heading = "Workload"
    )]
    compute_us_per_access: Option<f64>,
    /// micro: share of transactions that are dependent: they look up a secondary index
    /// entry to learn which records to process (0 to 1).
    #[arg(
        long,
        value_name = "FRACTION",
        allow_negative_numbers = true,
        help_heading = "Workload"
    )]
    dependent_fraction: Option<f64>,
    /// micro: updates per second of each secondary index entry, made by an updater thread
    /// beside the clients and counted apart (the index's volatility; 0 = never changes).
    #[arg(
        long,
        value_name = "PER_S",
        allow_negative_numbers = true,
        help_heading = "Workload"
    )]
    index_volatility: Option<f64>,
    /// micro: secondary index entries per partition (default 100).
    #[arg(long, value_name = "N", help_heading = "Workload")]
    index_entries: Option<u64>,
    /// micro: share of a dependent transaction's accesses done before its index lookup
    /// (0 = the lookup comes first; OLLP's reconnaissance must do them too).
    #[arg(
        long,
        value_name = "FRACTION",
        allow_negative_numbers = true,
        help_heading = "Workload"
    )]
    lookup_position: Option<f64>,
    /// micro: how dependent transactions learn their records: ollp (a read-only
    /// reconnaissance, then the transaction on that guess, restarted when it went stale),
    /// in-transaction (read the entry, then lock the records it names), or auto (OLLP for
    /// qstore and calvin, which need the records up front; in-transaction otherwise).
    #[arg(long, value_name = "HOW", value_parser = parse_dependent_lookup, help_heading = "Workload")]
    dependent_lookup: Option<DependentLookup>,
    /// bank: accounts per branch (a branch's total is invariant).
    #[arg(long, help_heading = "Workload")]
    branch_size: Option<u32>,
    /// bank: average opening balance of an account.
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    initial_balance: Option<i64>,
    /// bank: largest amount a transfer moves.
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    max_amount: Option<i64>,
    /// bank: accounts a transfer touches (one source, the rest destinations).
    #[arg(long, help_heading = "Workload")]
    accounts_per_transfer: Option<u32>,
    /// bank: fraction of transactions that are read-only audits of a whole branch.
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    audit_fraction: Option<f64>,
    /// append: values a list can hold (its row size is 8 + 8 x this).
    #[arg(long, help_heading = "Workload")]
    max_list_len: Option<u32>,
    /// append: fraction of micro-operations that read a whole list.
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    read_fraction: Option<f64>,
    /// append: size of the sliding window of hot keys per partition.
    #[arg(long, help_heading = "Workload")]
    active_keys: Option<u32>,
    /// kv: buckets (records) per partition that byte-string keys hash to.
    #[arg(long, help_heading = "Workload")]
    kv_buckets: Option<u64>,
    /// kv: bytes of a bucket; a bucket holds every key and value that hash to it, so the
    /// largest value is a little less than this.
    #[arg(long, help_heading = "Workload")]
    kv_bucket_bytes: Option<u32>,

    /// tpcc: warehouses per node (1 = the high-contention setting the papers use; each takes
    /// about half a GB at the default --max-orders-per-district).
    #[arg(long, help_heading = "Workload")]
    warehouses: Option<u32>,
    /// tpcc: which transactions run: neworder-payment (New-Order and Payment, what the papers
    /// measure, plus the minor transactions' --*-fraction) or standard (all five, the minor
    /// ones 4% each).
    #[arg(long, value_parser = parse_tpcc_mix, help_heading = "Workload")]
    tpcc_mix: Option<TpccMix>,
    /// tpcc: where ITEM lives: replicated (a copy in every partition, the default) or
    /// partitioned (item i in partition i mod P: New-Orders read items at other nodes).
    #[arg(long, value_parser = parse_item_placement, value_name = "PLACEMENT", help_heading = "Workload")]
    tpcc_items: Option<ItemPlacement>,
    /// tpcc: fraction of transactions that are Payments (the rest New-Orders, or Order-Status
    /// as --order-status-fraction says).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    payment_fraction: Option<f64>,
    /// tpcc, mix neworder-payment: fraction of transactions that are Order-Status
    /// (read-only), taken from New-Order's share (default 0).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    order_status_fraction: Option<f64>,
    /// tpcc, mix neworder-payment: fraction of transactions that are Stock-Level (read-only,
    /// run as OLLP), taken from New-Order's share (default 0).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    stock_level_fraction: Option<f64>,
    /// tpcc, mix neworder-payment: fraction of transactions that are Delivery (run as OLLP),
    /// taken from New-Order's share (default 0).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    delivery_fraction: Option<f64>,
    /// tpcc: orders a district can hold (3000 loaded plus room for new ones); sets most of
    /// the memory, and a New-Order past it aborts (counted as a logic abort).
    #[arg(long, help_heading = "Workload")]
    max_orders_per_district: Option<u32>,

    // --- load generator ---
    /// Clients in the cluster, spread round-robin over home nodes (0 = one per node).
    #[arg(long, help_heading = "Load")]
    clients: Option<u32>,
    /// Transactions each client keeps in flight (closed loop; default 200: a batching
    /// engine needs enough in flight to fill its batches).
    #[arg(long, help_heading = "Load")]
    inflight: Option<u32>,
    /// Open-loop target rate in transactions/s for the whole cluster: 0.001 to 100000000
    /// (0 = closed loop). Arrivals the load threads cannot issue in time count as missed.
    #[arg(long, allow_negative_numbers = true, help_heading = "Load")]
    rate: Option<f64>,
    /// Measurement window in seconds (after the warm-up); with --txns, the longest the run
    /// may take.
    #[arg(long, allow_negative_numbers = true, help_heading = "Load")]
    duration: Option<f64>,
    /// Warm-up in seconds before the measurement window.
    #[arg(long, allow_negative_numbers = true, help_heading = "Load")]
    warmup: Option<f64>,
    /// Stop after this many committed transactions (no warm-up: every commit counts). With
    /// --duration too, the run stops at whichever comes first; without, it also stops, as a
    /// failure, once nothing has committed for client.drain_timeout_s (10 s).
    #[arg(long, help_heading = "Load")]
    txns: Option<u64>,
    /// Load-generator threads (0 = one per core, the default).
    #[arg(long, help_heading = "Load")]
    client_threads: Option<u32>,
    /// Back-off after a concurrency-control abort: base in microseconds (doubles per retry).
    #[arg(long, help_heading = "Load")]
    backoff_base_us: Option<u64>,
    /// Back-off cap in microseconds.
    #[arg(long, help_heading = "Load")]
    backoff_max_us: Option<u64>,

    // --- output ---
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    output: Option<PathBuf>,
    /// Write the results as CSV (header and one row) to FILE.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    csv: Option<PathBuf>,
    /// Print the content hash of every partition after the run.
    #[arg(long, help_heading = "Output")]
    print_state_hash: bool,
    /// Check the run: history serializability, the serial oracle for deterministic protocols,
    /// and the workload's invariants. Exit code 1 if any check fails.
    #[arg(long, help_heading = "Verification")]
    verify: bool,
    /// Write the client-observed history in the Jepsen/Elle JSON-lines format to FILE, for an
    /// independent checker (list-append workloads: --workload append), e.g.
    /// `adya check -m list-append -c serializable FILE`.
    #[arg(long, value_name = "FILE", help_heading = "Verification")]
    history: Option<PathBuf>,
    /// Write the engine's history (versions read and written, version order) to FILE, for
    /// `qstore check FILE`.
    #[arg(long, value_name = "FILE", help_heading = "Verification")]
    engine_history: Option<PathBuf>,
    /// Progress line each second even when stderr is not a terminal.
    #[arg(long, help_heading = "Output", conflicts_with = "quiet")]
    progress: bool,
    /// No progress line and no table (files are still written).
    #[arg(long, short, help_heading = "Output")]
    quiet: bool,
}

/// `--protocol`'s help, listing the registry's protocols.
fn protocol_help() -> String {
    format!(
        "Concurrency-control protocol: {} (default qstore; `qstore protocols` says what each is)",
        qstore_engine::protocol::names().join(", ")
    )
}

fn parse_isolation(s: &str) -> Result<Isolation, String> {
    match s {
        "serializable" => Ok(Isolation::Serializable),
        "read-committed" => Ok(Isolation::ReadCommitted),
        _ => Err(format!(
            "{s:?} is not an isolation level; use serializable or read-committed"
        )),
    }
}

fn parse_qstore_mode(s: &str) -> Result<QStoreMode, String> {
    match s {
        "conservative" => Ok(QStoreMode::Conservative),
        "speculative" => Ok(QStoreMode::Speculative),
        _ => Err(format!(
            "{s:?} is not a Q-Store mode; use conservative or speculative"
        )),
    }
}

fn parse_dependent_lookup(s: &str) -> Result<DependentLookup, String> {
    match s {
        "auto" => Ok(DependentLookup::Auto),
        "ollp" => Ok(DependentLookup::Ollp),
        "in-transaction" => Ok(DependentLookup::InTransaction),
        _ => Err(format!(
            "unknown lookup {s:?}: choose auto, ollp or in-transaction"
        )),
    }
}

fn parse_calvin_locks(s: &str) -> Result<CalvinLocks, String> {
    match s {
        "lock-table" => Ok(CalvinLocks::LockTable),
        "vll" => Ok(CalvinLocks::Vll),
        _ => Err(format!(
            "{s:?} is not a Calvin lock manager; use lock-table or vll"
        )),
    }
}

fn parse_cache_policy(s: &str) -> Result<CachePolicy, String> {
    match s {
        "always-reuse" => Ok(CachePolicy::AlwaysReuse),
        "always-request" => Ok(CachePolicy::AlwaysRequest),
        "hybrid" => Ok(CachePolicy::Hybrid),
        _ => Err(format!(
            "{s:?} is not a Sundial cache policy; use always-reuse, always-request or hybrid"
        )),
    }
}

fn parse_item_placement(s: &str) -> Result<ItemPlacement, String> {
    match s {
        "replicated" => Ok(ItemPlacement::Replicated),
        "partitioned" => Ok(ItemPlacement::Partitioned),
        _ => Err(format!(
            "{s:?} is not a placement of ITEM; use replicated or partitioned"
        )),
    }
}

/// `--remote-phases`' list (an alias, so that clap takes the list as one value).
type RemotePhases = Vec<RemotePhase>;

fn parse_remote_phases(s: &str) -> Result<RemotePhases, String> {
    parse_phases(s)
}

fn parse_tpcc_mix(s: &str) -> Result<TpccMix, String> {
    match s {
        "standard" => Ok(TpccMix::Standard),
        "neworder-payment" => Ok(TpccMix::NeworderPayment),
        _ => Err(format!(
            "{s:?} is not a TPC-C mix; use standard or neworder-payment"
        )),
    }
}

fn parse_replication_compression(s: &str) -> Result<ReplicationCompression, String> {
    match s {
        "none" => Ok(ReplicationCompression::None),
        "lz4" => Ok(ReplicationCompression::Lz4),
        "snappy" => Ok(ReplicationCompression::Snappy),
        _ => Err(format!(
            "{s:?} is not a replication compression; use none, lz4 or snappy"
        )),
    }
}

fn parse_fsync(s: &str) -> Result<Fsync, String> {
    match s {
        "always" => Ok(Fsync::Always),
        "batch" => Ok(Fsync::Batch),
        "never" => Ok(Fsync::Never),
        _ => Err(format!(
            "{s:?} is not an fsync policy; use always, batch or never"
        )),
    }
}

fn parse_replication_layer(s: &str) -> Result<ReplicationLayer, String> {
    match s {
        "raft" => Ok(ReplicationLayer::Raft),
        "zookeeper" => Ok(ReplicationLayer::Zookeeper),
        _ => Err(format!(
            "{s:?} is not a replication layer; use raft or zookeeper"
        )),
    }
}

fn parse_replication_mode(s: &str) -> Result<ReplicationMode, String> {
    match s {
        "speculative" => Ok(ReplicationMode::Speculative),
        "synchronous" => Ok(ReplicationMode::Synchronous),
        _ => Err(format!(
            "{s:?} is not a replication mode; use speculative or synchronous"
        )),
    }
}

fn parse_partitioning(s: &str) -> Result<Partitioning, String> {
    match s {
        "range" => Ok(Partitioning::Range),
        "hash" => Ok(Partitioning::Hash),
        _ => Err(format!("{s:?} is not a partitioning; use range or hash")),
    }
}

/// `dir` made absolute (against the directory the process started in), as a string for the
/// configuration: a cluster file names the same directory whatever the reader's directory.
fn absolute(dir: &Path) -> Result<String, String> {
    std::path::absolute(dir)
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| format!("--data-dir {}: {e}", dir.display()))
}

/// Sets `target` to `value` if the flag was given.
fn set<T>(target: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *target = v;
    }
}

impl RunArgs {
    /// Defaults, then the --config file, then flags.
    fn config(&self) -> Result<RunConfig, String> {
        let mut c = match &self.config {
            Some(path) => load_config(path)?,
            None => RunConfig::default(),
        };
        set(&mut c.seed, self.seed);
        set(&mut c.protocol.name, self.protocol.clone());
        set(&mut c.protocol.admission_queue, self.admission_queue);
        set(&mut c.cluster.nodes, self.nodes);
        set(&mut c.cluster.workers, self.workers);
        set(&mut c.cluster.partitioning, self.partitioning);
        c.cluster.pin_threads |= self.pin_threads;
        if self.slow_node.is_some() {
            c.cluster.slow_node = self.slow_node;
        }
        set(&mut c.cluster.slow_threads, self.slow_threads);
        set(&mut c.cluster.slow_from_s, self.slow_from_s);
        let q = &mut c.protocol.qstore;
        set(&mut q.mode, self.qstore_mode);
        set(&mut q.isolation, self.isolation);
        set(&mut q.batch_size, self.batch_size);
        set(&mut q.batch_timeout_us, self.batch_timeout_us);
        set(&mut q.eqs_per_planner, self.eqs_per_planner);
        set(&mut q.pipeline_depth, self.pipeline_depth);
        set(&mut q.planners, self.planners);
        q.dedicated_planners |= self.dedicated_planners;
        q.close_when_idle &= !self.full_batches;
        let k = &mut c.protocol.calvin;
        set(&mut k.locks, self.calvin_locks);
        set(&mut k.epoch_us, self.calvin_epoch_us);
        set(&mut k.epoch_txns, self.calvin_epoch_txns);
        set(&mut c.protocol.mvcc.max_versions, self.mvcc_max_versions);
        set(&mut c.protocol.sundial.cache_mb, self.sundial_cache_mb);
        set(
            &mut c.protocol.sundial.cache_policy,
            self.sundial_cache_policy,
        );
        c.protocol.sundial.table_leases &= !self.sundial_no_table_leases;
        set(
            &mut c.protocol.dl_detect.interval_us,
            self.dl_detect_interval_us,
        );
        c.protocol.dl_detect.skip_commit_protocol |= self.dl_detect_skip_2pc;
        c.protocol.throttle |= self.throttle;
        set(&mut c.replication.factor, self.replication_factor);
        set(&mut c.replication.mode, self.replication_mode);
        set(&mut c.replication.compression, self.replication_compression);
        set(&mut c.replication.layer, self.replication_layer);
        set(&mut c.replication.zookeeper, self.zookeeper.clone());
        if let Some(p) = self.replication_point {
            c.replication.point = Some(p);
        }
        if let Some(dir) = &self.data_dir {
            c.durability.data_dir = absolute(dir)?;
        }
        set(&mut c.durability.fsync, self.fsync);
        if self.checkpoint_interval_s.is_some() {
            c.durability.checkpoint_interval_s = self.checkpoint_interval_s;
        }
        set(&mut c.net.delay_us, self.delay_us);
        set(&mut c.net.clock_skew_us, self.clock_skew_us);
        set(&mut c.net.jitter_us, self.jitter_us);
        set(&mut c.net.drop_fraction, self.drop_fraction);
        if self.cut_off_node.is_some() {
            c.net.cut_off_node = self.cut_off_node;
        }
        set(&mut c.net.cut_off_after_ms, self.cut_off_after_ms);
        set(&mut c.net.cut_off_for_ms, self.cut_off_for_ms);
        set(&mut c.workload.name, self.workload.clone());
        self.apply_workload_flags(&mut c)?;
        let k = &mut c.client;
        set(&mut k.clients, self.clients);
        set(&mut k.inflight, self.inflight);
        set(&mut k.rate, self.rate);
        set(&mut k.duration_s, self.duration);
        set(&mut k.warmup_s, self.warmup);
        set(&mut k.txns, self.txns);
        // --txns alone bounds the run by its count; --duration as well adds a time limit.
        if self.txns.is_some_and(|n| n > 0) && self.duration.is_none() {
            k.duration_s = 0.0;
        }
        set(&mut k.threads, self.client_threads);
        set(&mut k.backoff_base_us, self.backoff_base_us);
        set(&mut k.backoff_max_us, self.backoff_max_us);
        validate_names(&c)?;
        c.validate().map_err(|e| e.to_string())?;
        // Every node of `run` and of `cluster` shares this machine.
        let nodes = c.cluster.nodes * c.replication.factor;
        c.cluster.resolve_workers(nodes);
        Ok(c)
    }
}

impl RunArgs {
    /// Workload flags apply to the selected workload; a flag it does not have is an error
    /// rather than silently ignored.
    fn apply_workload_flags(&self, c: &mut RunConfig) -> Result<(), String> {
        let name = c.workload.name.clone();
        let not_for = |flag: &str, given: bool| -> Result<(), String> {
            if given {
                Err(format!("{flag} does not apply to workload {name}"))
            } else {
                Ok(())
            }
        };
        let w = &mut c.workload;
        match name.as_str() {
            "ycsb" => {
                let y = &mut w.ycsb;
                set(&mut y.records_per_partition, self.records);
                set(&mut y.ops_per_txn, self.ops);
                set(&mut y.theta, self.theta);
                set(&mut y.multi_partition_fraction, self.mp_fraction);
                set(&mut y.partitions_per_mp_txn, self.mp_partitions);
                set(&mut y.row_size, self.row_size);
                set(&mut y.write_fraction, self.write_fraction);
                y.write_theta = self.write_theta.or(y.write_theta);
                set(&mut y.remote_access_fraction, self.remote_access_fraction);
                y.remote_locality = self.remote_locality.or(y.remote_locality);
                set(&mut y.steps, self.steps);
                set(&mut y.remote_phases, self.remote_phases.clone());
                y.allow_duplicate_keys |= self.allow_duplicate_keys;
                y.read_mostly |= self.read_mostly;
            }
            "micro" => {
                let m = &mut w.micro;
                set(&mut m.records_per_partition, self.records);
                set(&mut m.ops_per_txn, self.ops);
                set(&mut m.multi_partition_fraction, self.mp_fraction);
                set(&mut m.partitions_per_mp_txn, self.mp_partitions);
                set(&mut m.contention_index, self.contention_index);
                set(&mut m.compute_us_per_access, self.compute_us_per_access);
                set(&mut m.dependent_fraction, self.dependent_fraction);
                set(&mut m.index_volatility, self.index_volatility);
                set(&mut m.index_entries_per_partition, self.index_entries);
                set(&mut m.lookup_position, self.lookup_position);
                set(&mut m.dependent_lookup, self.dependent_lookup);
                not_for("--theta", self.theta.is_some())?;
            }
            "bank" => {
                let b = &mut w.bank;
                set(&mut b.accounts_per_partition, self.records);
                set(&mut b.theta, self.theta);
                set(&mut b.multi_partition_fraction, self.mp_fraction);
                set(&mut b.branch_size, self.branch_size);
                set(&mut b.initial_balance, self.initial_balance);
                set(&mut b.max_amount, self.max_amount);
                set(&mut b.accounts_per_transfer, self.accounts_per_transfer);
                set(&mut b.audit_fraction, self.audit_fraction);
                not_for("--ops", self.ops.is_some())?;
                not_for("--mp-partitions", self.mp_partitions.is_some())?;
            }
            "append" => {
                let a = &mut w.append;
                set(&mut a.keys_per_partition, self.records);
                set(&mut a.ops_per_txn, self.ops);
                set(&mut a.multi_partition_fraction, self.mp_fraction);
                set(&mut a.partitions_per_mp_txn, self.mp_partitions);
                set(&mut a.max_list_len, self.max_list_len);
                set(&mut a.read_fraction, self.read_fraction);
                set(&mut a.active_keys, self.active_keys);
                not_for("--theta", self.theta.is_some())?;
            }
            "kv" => {
                let k = &mut w.kv;
                set(&mut k.keys, self.records);
                set(&mut k.buckets_per_partition, self.kv_buckets);
                set(&mut k.bucket_bytes, self.kv_bucket_bytes);
                not_for("--theta", self.theta.is_some())?;
                not_for("--ops", self.ops.is_some())?;
                not_for("--mp-fraction", self.mp_fraction.is_some())?;
            }
            "tpcc" => {
                let t = &mut w.tpcc;
                set(&mut t.warehouses_per_partition, self.warehouses);
                set(&mut t.mix, self.tpcc_mix);
                set(&mut t.items, self.tpcc_items);
                set(&mut t.payment_fraction, self.payment_fraction);
                set(&mut t.order_status_fraction, self.order_status_fraction);
                set(&mut t.stock_level_fraction, self.stock_level_fraction);
                set(&mut t.delivery_fraction, self.delivery_fraction);
                set(&mut t.max_orders_per_district, self.max_orders_per_district);
                set(&mut t.multi_partition_fraction, self.mp_fraction);
                set(&mut t.remote_access_fraction, self.remote_access_fraction);
                // Remote accesses replace multi-partition transactions: the fraction of
                // those (15% by default) yields to the flag, unless --mp-fraction is given
                // too (validation then refuses both being on).
                if self.remote_access_fraction.is_some_and(|r| r != 0.0)
                    && self.mp_fraction.is_none()
                {
                    t.multi_partition_fraction = 0.0;
                }
                not_for("--records", self.records.is_some())?;
                not_for("--ops", self.ops.is_some())?;
                not_for("--theta", self.theta.is_some())?;
                not_for("--mp-partitions", self.mp_partitions.is_some())?;
                // Warehouses are key ranges: TPC-C needs range partitioning, so it is the
                // default here (an explicit --partitioning hash is still refused clearly).
                if self.partitioning.is_none() && c.cluster.partitioning != Partitioning::Range {
                    c.cluster.partitioning = Partitioning::Range;
                }
            }
            _ => {}
        }
        let w = &mut c.workload;
        let tpcc_only = self.warehouses.is_some()
            || self.tpcc_mix.is_some()
            || self.tpcc_items.is_some()
            || self.payment_fraction.is_some()
            || self.order_status_fraction.is_some()
            || self.stock_level_fraction.is_some()
            || self.delivery_fraction.is_some()
            || self.max_orders_per_district.is_some();
        not_for(
            "tpcc flags (--warehouses, --tpcc-mix, ...)",
            tpcc_only && name != "tpcc",
        )?;
        let ycsb_only = self.row_size.is_some()
            || self.write_fraction.is_some()
            || self.write_theta.is_some()
            || self.remote_locality.is_some()
            || self.steps.is_some()
            || self.remote_phases.is_some()
            || self.allow_duplicate_keys
            || self.read_mostly;
        let micro_only = self.contention_index.is_some()
            || self.compute_us_per_access.is_some()
            || self.dependent_fraction.is_some()
            || self.index_volatility.is_some()
            || self.index_entries.is_some()
            || self.lookup_position.is_some()
            || self.dependent_lookup.is_some();
        let bank_only = self.branch_size.is_some()
            || self.initial_balance.is_some()
            || self.max_amount.is_some()
            || self.accounts_per_transfer.is_some()
            || self.audit_fraction.is_some();
        let append_only = self.max_list_len.is_some()
            || self.read_fraction.is_some()
            || self.active_keys.is_some();
        not_for(
            "--row-size/--write-fraction/--write-theta/--remote-locality/--steps/\
             --remote-phases/--allow-duplicate-keys",
            ycsb_only && name != "ycsb",
        )?;
        not_for(
            "--remote-access-fraction (ycsb and tpcc only)",
            self.remote_access_fraction.is_some() && name != "ycsb" && name != "tpcc",
        )?;
        not_for(
            "--contention-index/--compute-us-per-access/--dependent-fraction/\
             --index-volatility/--index-entries/--lookup-position/--dependent-lookup \
             (micro only)",
            micro_only && name != "micro",
        )?;
        not_for(
            "bank flags (--branch-size, --max-amount, ...)",
            bank_only && name != "bank",
        )?;
        not_for(
            "append flags (--max-list-len, ...)",
            append_only && name != "append",
        )?;
        not_for(
            "kv flags (--kv-buckets, --kv-bucket-bytes)",
            (self.kv_buckets.is_some() || self.kv_bucket_bytes.is_some()) && name != "kv",
        )?;
        // On one node nothing can be multi-partition: a default fraction yields to that.
        if c.cluster.nodes == 1 && self.mp_fraction.is_none() {
            w.ycsb.multi_partition_fraction = 0.0;
            w.micro.multi_partition_fraction = 0.0;
            w.bank.multi_partition_fraction = 0.0;
            w.append.multi_partition_fraction = 0.0;
            w.tpcc.multi_partition_fraction = 0.0;
        }
        Ok(())
    }
}

fn load_config(path: &Path) -> Result<RunConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read configuration file {}: {e}", path.display()))?;
    let mut cfg = RunConfig::from_toml(&text)
        .map_err(|e| format!("configuration file {}: {}", path.display(), e.trim_end()))?;
    // A relative secret file or data directory lives beside the file that names it.
    if let Some(dir) = path.parent() {
        let beside = |p: &mut String| {
            if !p.is_empty() && Path::new(p.as_str()).is_relative() {
                *p = dir.join(p.as_str()).to_string_lossy().into_owned();
            }
        };
        beside(&mut cfg.cluster.secret_file);
        cfg.cluster
            .addresses
            .iter_mut()
            .for_each(|a| beside(&mut a.data_dir));
    }
    Ok(cfg)
}

fn validate_names(c: &RunConfig) -> Result<(), String> {
    if !qstore_engine::protocol::names().contains(&c.protocol.name.as_str()) {
        return Err(qstore_engine::protocol::unknown_protocol(&c.protocol.name).to_string());
    }
    if !qstore_workload::WORKLOADS.contains(&c.workload.name.as_str()) {
        return Err(format!(
            "invalid workload.name = {}: unknown workload; choose one of: {}",
            c.workload.name,
            qstore_workload::WORKLOADS.join(", ")
        ));
    }
    Ok(())
}

pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Config(args) => config(args),
        Command::Check(args) => check(args),
        Command::Protocols(args) => protocols(args),
        Command::Bench(args) => bench(*args),
        Command::Figure(args) => crate::figure::figure(args),
        Command::Server(args) => server(args),
        Command::Redis(args) => redis(*args),
        Command::RedisPassword(args) => redis_password(args),
        Command::RedisBench(args) => redis_bench(args),
        Command::Client(args) => client(*args),
        Command::Cluster(args) => cluster(*args),
        Command::Secret(args) => secret(args),
        Command::ZookeeperLatency(args) => crate::zk_latency::zookeeper_latency(args),
    }
}

fn secret(args: SecretArgs) -> i32 {
    match qstore_net::auth::ClusterSecret::create_file(&args.file) {
        Ok(()) => {
            eprintln!(
                "wrote a new cluster secret to {} (mode 600); name it in the cluster file: \
                 secret_file = {:?} under [cluster]",
                args.file.display(),
                args.file.display().to_string()
            );
            0
        }
        Err(e) => usage_error(&e),
    }
}

fn cluster(args: ClusterArgs) -> i32 {
    let cfg = match args.run.config() {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    if cfg.protocol.name == "serial" {
        return usage_error(
            "serial has no distributed mode (one thread runs the whole cluster); choose \
             another --protocol, or use `qstore run --protocol serial`",
        );
    }
    // Every server runs on this machine, and the client's --verify loads the data again.
    if let Err(e) = sizing::check(&cfg, sizing::Loads::embedded(&cfg, args.run.verify)) {
        return usage_error(&e.to_string());
    }
    if let Some(port) = args.redis_port {
        if let Err(e) = redis_ports_fit(&cfg, port) {
            return usage_error(&e);
        }
    }
    let r = &args.run;
    let mut client_args: Vec<std::ffi::OsString> = Vec::new();
    let mut flag = |on: bool, name: &str| {
        if on {
            client_args.push(name.into());
        }
    };
    flag(r.verify, "--verify");
    flag(r.progress, "--progress");
    flag(r.quiet, "--quiet");
    flag(r.print_state_hash, "--print-state-hash");
    for (name, path) in [
        ("--output", &r.output),
        ("--csv", &r.csv),
        ("--history", &r.history),
    ] {
        if let Some(p) = path {
            client_args.push(name.into());
            client_args.push(p.into());
        }
    }
    let kill = match kill_leader(&args, &cfg) {
        Ok(k) => k,
        Err(e) => return usage_error(&e),
    };
    let opts = crate::launcher::LaunchOptions {
        kill,
        cluster_file: args.cluster_file.clone(),
        client_args,
        server_args: if r.verify {
            vec!["--record-history".into()]
        } else {
            Vec::new()
        },
        redis_port: args.redis_port,
        ..Default::default()
    };
    match crate::launcher::launch(cfg, opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    }
}

/// The fault `--kill-leader-after-ms` asks for, checked against the cluster.
fn kill_leader(
    args: &ClusterArgs,
    cfg: &RunConfig,
) -> Result<Option<crate::launcher::KillLeader>, String> {
    let Some(ms) = args.kill_leader_after_ms else {
        return match args.restart_after_ms {
            Some(r) => Err(format!(
                "--restart-after-ms {r} restarts the server --kill-leader-after-ms kills: add \
                 --kill-leader-after-ms"
            )),
            None => Ok(None),
        };
    };
    if cfg.replication.factor < 2 {
        return Err(format!(
            "--kill-leader-after-ms {ms}: without replication the killed server's partition \
             is lost with it; add --replication-factor 3"
        ));
    }
    if cfg.replication.layer != qstore_core::config::ReplicationLayer::Raft {
        return Err(format!(
            "--kill-leader-after-ms {ms}: a group replicated through ZooKeeper has a fixed \
             leader; fail-over is built on raft only (--replication-layer raft)"
        ));
    }
    if args.kill_partition >= cfg.cluster.nodes {
        return Err(format!(
            "invalid --kill-partition = {}: the cluster has partitions 0 to {}",
            args.kill_partition,
            cfg.cluster.nodes - 1
        ));
    }
    Ok(Some(crate::launcher::KillLeader {
        partition: args.kill_partition,
        after: Duration::from_millis(ms),
        restart_after: args.restart_after_ms.map(Duration::from_millis),
    }))
}

fn server(args: ServerArgs) -> i32 {
    let cfg = match load_config(&args.cluster).and_then(|c| {
        validate_names(&c)?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }) {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    if !cfg.cluster.is_distributed() {
        return usage_error(&format!(
            "{} lists no node addresses (cluster.addresses): not a cluster file",
            args.cluster.display()
        ));
    }
    if args.node >= cfg.servers() {
        return usage_error(&format!(
            "invalid --node = {}: {} has servers 0 to {}",
            args.node,
            args.cluster.display(),
            cfg.servers() - 1
        ));
    }
    let mut cfg = cfg;
    if let Some(dir) = &args.data_dir {
        match absolute(dir) {
            Ok(dir) => cfg.cluster.addresses[args.node as usize].data_dir = dir,
            Err(e) => return usage_error(&e),
        }
    }
    let own_partition = sizing::Loads {
        partitions: 1,
        oracle: false,
    };
    if let Err(e) = sizing::check(&cfg, own_partition) {
        return usage_error(&e.to_string());
    }
    if args.redis.is_some() && cfg.workload.name != "kv" {
        return usage_error(&format!(
            "--redis needs the kv workload; {} runs {} (set workload.name = \"kv\")",
            args.cluster.display(),
            cfg.workload.name
        ));
    }
    match crate::distributed::serve(cfg, args.node, args.record_history, args.redis) {
        Ok(()) => 0,
        Err(QError::Config(e)) => usage_error(&e.to_string()),
        Err(e) => {
            eprintln!("error: {}", naming_node(args.node, &e.to_string()));
            EXIT_FAILURE
        }
    }
}

fn redis(mut args: RedisArgs) -> i32 {
    match args.run.workload.as_deref() {
        None => args.run.workload = Some("kv".into()),
        Some("kv") => {}
        Some(other) => {
            return usage_error(&format!(
                "invalid --workload = {other}: the Redis port serves the kv workload"
            ))
        }
    }
    let mut cfg = match args.run.config() {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    if let Some(n) = args.io_threads {
        cfg.server.io_threads = n;
        if let Err(e) = cfg.server.validate() {
            return usage_error(&format!("--io-threads: {e}"));
        }
    }
    let loads = sizing::Loads {
        partitions: cfg.cluster.nodes,
        oracle: false,
    };
    if let Err(e) = sizing::check(&cfg, loads) {
        return usage_error(&e.to_string());
    }
    if args.no_auth && !args.listen.ip().is_loopback() {
        return usage_error(&format!(
            "--no-auth on {}: without a password, listen on a loopback address only",
            args.listen
        ));
    }
    let auth = match (&args.secret_file, args.no_auth) {
        (Some(_), true) => return usage_error("give --secret-file or --no-auth, not both"),
        (Some(f), false) => crate::redis_port::PortAuth::SecretFile(f),
        (None, true) => crate::redis_port::PortAuth::Open,
        (None, false) => crate::redis_port::PortAuth::Fresh,
    };
    let serve_for = match args.serve_for {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            return usage_error(&format!("invalid --serve-for = {s}: must be above 0"))
        }
        s => s.map(Duration::from_secs_f64),
    };
    match crate::redis_port::serve_embedded(cfg, args.listen, auth, serve_for, args.run.verify) {
        Ok(true) => 0,
        Ok(false) => EXIT_FAILURE,
        Err(QError::Config(e)) => usage_error(&e.to_string()),
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    }
}

fn redis_bench(args: RedisBenchArgs) -> i32 {
    if !(args.duration > 0.0 && args.duration.is_finite()) || args.clients == 0 || args.keys == 0 {
        return usage_error("--duration, --clients and --keys must be above 0");
    }
    let mut rows = Vec::new();
    let mut failed = false;
    for addr in &args.addrs {
        for &form in &args.form {
            eprintln!(
                "redis-bench: {addr} as {} for {} s ...",
                form.name(),
                args.duration
            );
            match redis_bench_one(&args, *addr, form) {
                Ok(Some(o)) => {
                    failed |= o.errors > 0;
                    rows.push((*addr, form, o));
                }
                Ok(None) => {}
                Err(()) => failed = true,
            }
        }
    }
    print!("{}", redis_bench_table(&rows));
    if let Some(path) = &args.output {
        let mut csv = String::from("server,form,clients,txn_per_s,p50_us,p99_us,errors\n");
        for (addr, form, o) in &rows {
            csv.push_str(&format!(
                "{addr},{},{},{:.0},{},{},{}\n",
                form.name(),
                args.clients,
                o.txn_per_s(),
                o.p50_us,
                o.p99_us,
                o.errors
            ));
        }
        if let Err(e) = std::fs::write(path, csv) {
            eprintln!("error: cannot write {}: {e}", path.display());
            failed = true;
        }
    }
    if failed {
        EXIT_FAILURE
    } else {
        0
    }
}

type BenchRow = (
    std::net::SocketAddr,
    qstore_redis::bench::Form,
    qstore_redis::bench::Outcome,
);

/// The rows as an aligned table, each row's throughput also as a ratio to the first's.
fn redis_bench_table(rows: &[BenchRow]) -> String {
    let mut out = format!(
        "{:<22} {:<6} {:>10} {:>8} {:>8} {:>7} {:>9}\n",
        "server", "form", "txn/s", "p50 us", "p99 us", "errors", "vs first"
    );
    let first = rows.first().map_or(1.0, |r| r.2.txn_per_s());
    for (addr, form, o) in rows {
        out.push_str(&format!(
            "{:<22} {:<6} {:>10.0} {:>8} {:>8} {:>7} {:>8.2}x\n",
            addr.to_string(),
            form.name(),
            o.txn_per_s(),
            o.p50_us,
            o.p99_us,
            o.errors,
            o.txn_per_s() / first
        ));
    }
    out
}

/// Runs one server with one form: its outcome, `None` if the server does not run that form
/// (said on stderr), or an error (said on stderr).
fn redis_bench_one(
    args: &RedisBenchArgs,
    addr: std::net::SocketAddr,
    form: qstore_redis::bench::Form,
) -> Result<Option<qstore_redis::bench::Outcome>, ()> {
    let spec = qstore_redis::bench::Spec {
        addr,
        password: args.password.clone(),
        clients: args.clients,
        duration: Duration::from_secs_f64(args.duration),
        keys: args.keys,
        reads: args.reads,
        rmws: args.rmws,
        form,
    };
    match qstore_redis::bench::run(&spec) {
        Ok(o) => Ok(Some(o)),
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            eprintln!("skipped: {addr} {}: {e}", form.name());
            Ok(None)
        }
        Err(e) => {
            eprintln!("error: {addr} {}: {e}", form.name());
            Err(())
        }
    }
}

fn redis_password(args: RedisPasswordArgs) -> i32 {
    match redis_password_of(&args.cluster) {
        Ok(password) => {
            println!("{password}");
            0
        }
        Err(e) => usage_error(&e),
    }
}

/// The Redis password of the cluster file at `path`.
pub(crate) fn redis_password_of(path: &Path) -> Result<String, String> {
    let cfg = load_config(path)?;
    let secret = qstore_bench::remote::load_secret(&cfg).map_err(|e| e.to_string())?;
    Ok(qstore_redis::password_for(&secret))
}

/// Whether `qstore cluster --redis-port PORT` can serve Redis clients: the kv workload, and
/// a port for every server.
fn redis_ports_fit(cfg: &RunConfig, port: u16) -> Result<(), String> {
    if cfg.workload.name != "kv" {
        return Err(format!(
            "--redis-port serves the kv workload's keys, but the workload is {}; add \
             --workload kv",
            cfg.workload.name
        ));
    }
    let last = port as u64 + cfg.servers() as u64 - 1;
    if port == 0 || last > u16::MAX as u64 {
        return Err(format!(
            "--redis-port {port}: the {} servers need ports {port} to {last}; choose a port \
             from 1 to {}",
            cfg.servers(),
            u16::MAX as u64 + 1 - cfg.servers() as u64
        ));
    }
    Ok(())
}

/// `msg` as a line about node `node`: prefixed with `node N: ` unless it already says which
/// node it is about (the engine's messages often do).
fn naming_node(node: u32, msg: &str) -> String {
    if msg.starts_with(&format!("node {node}:")) || msg.starts_with(&format!("node n{node}:")) {
        msg.to_string()
    } else {
        format!("node {node}: {msg}")
    }
}

fn client(mut args: ClientArgs) -> i32 {
    if args.run.config.is_some() {
        return usage_error("give the cluster file with --cluster only (not --config)");
    }
    args.run.config = Some(args.cluster.clone());
    let cfg = match args.run.config() {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    // The servers hold the data; --verify's serial oracle loads all of it here again.
    let oracle = sizing::Loads {
        partitions: 0,
        oracle: args.run.verify && sizing::has_oracle(&cfg),
    };
    if let Err(e) = sizing::check(&cfg, oracle) {
        return usage_error(&e.to_string());
    }
    let elle = match open_elle(&args.run, &cfg) {
        Ok(e) => e,
        Err(e) => return usage_error(&e),
    };
    let printer = ProgressPrinter::new(&args.run);
    let mut print = |p: &Progress| printer.print(p);
    let opts = RunOptions {
        progress: printer
            .live
            .then_some(&mut print as &mut dyn FnMut(&Progress)),
        state_hashes: args.run.print_state_hash,
        record_history: false,
        elle: elle.as_ref(),
    };
    let outcome = match qstore_bench::run_remote(&cfg, opts) {
        Ok(o) => o,
        Err(e) => return run_error(e),
    };
    printer.finish();
    let report = &outcome.report;
    if !args.run.quiet {
        println!("{}", report.table());
    }
    if let Some(hashes) = &report.state_hashes {
        for (p, h) in hashes.iter().enumerate() {
            println!("partition {p} state hash {h}");
        }
    }
    if let Err(e) = write_outputs(&args.run, report) {
        eprintln!("error: {e}");
        return EXIT_FAILURE;
    }
    if let Some(Err(e)) = elle.map(|log| log.finish()) {
        eprintln!("error: writing the history: {e}");
        return EXIT_FAILURE;
    }
    for f in &outcome.failures {
        eprintln!("error: {f}");
    }
    for l in &outcome.lost {
        eprintln!("server lost during the run (its group went on without it): {l}");
    }
    let answered = outcome.failures.is_empty() && report.unfinished == 0;
    if !answered {
        eprintln!(
            "error: {} transaction(s) unanswered, {} rejected",
            report.unfinished, report.rejected
        );
    }
    // Verified even when some went unanswered, to say what else held; the run fails anyway.
    let verified = !args.run.verify || crate::distributed::verify_remote(&cfg, &outcome);
    if !answered || !verified {
        return EXIT_FAILURE;
    }
    if let Some(line) = shortfall(&cfg, report) {
        eprintln!("{line}");
        return EXIT_FAILURE;
    }
    0
}

/// Progress lines during a run: on a terminal one line rewritten in place, else one line per
/// second (when asked for with --progress).
struct ProgressPrinter {
    live: bool,
    tty: bool,
}

impl ProgressPrinter {
    fn new(args: &RunArgs) -> Self {
        let tty = std::io::stderr().is_terminal();
        ProgressPrinter {
            live: !args.quiet && (args.progress || tty),
            tty,
        }
    }

    fn print(&self, p: &Progress) {
        let phase = if p.measuring { "run " } else { "warm" };
        let line = format!(
            "[{:>5.1}s {phase}] {:>10.0} txn/s  committed {:>10}  cc aborts {:>8}",
            p.elapsed_s, p.tps, p.committed, p.cc_aborts
        );
        if self.tty {
            eprint!("\r{line}");
        } else {
            eprintln!("{line}");
        }
    }

    fn finish(&self) {
        if self.live && self.tty {
            eprintln!();
        }
    }
}

fn bench(args: BenchArgs) -> i32 {
    use qstore_bench::suite;
    if args.list {
        for (name, what) in suite::SUITES {
            println!("{name:<10} {what}");
        }
        return 0;
    }
    let base = match args.run.config() {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    let scenarios = match suite::scenarios(&args.suite, &base) {
        Ok(s) => s,
        Err(e) => return usage_error(&e),
    };
    // Scenarios run one after another: each must fit on its own.
    for sc in &scenarios {
        if let Err(e) = sizing::check(&sc.cfg, sizing::Loads::embedded(&sc.cfg, false)) {
            return usage_error(&format!("scenario {}: {e}", sc.name));
        }
    }
    // Round-robin: every round runs every scenario once, so runs compared in a ratio are
    // minutes apart at most.
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for r in 0..args.repeat {
        let mut round = Vec::new();
        for (i, sc) in scenarios.iter().enumerate() {
            eprint!(
                "[round {}/{}] [{}/{}] {} ... ",
                r + 1,
                args.repeat,
                i + 1,
                scenarios.len(),
                sc.name,
            );
            match qstore_bench::run(&sc.cfg, RunOptions::default()) {
                Ok(o) => {
                    eprintln!("{:.0} txn/s", o.report.throughput_tps);
                    if let Some(why) = o.report.failure() {
                        failures.push(format!("round {}, {}: {why}", r + 1, sc.name));
                    }
                    round.push(o.report);
                }
                Err(QError::Config(e)) => {
                    eprintln!();
                    return usage_error(&format!("scenario {}: {e}", sc.name));
                }
                Err(e) => {
                    eprintln!("\nerror: scenario {}: {e}", sc.name);
                    return EXIT_FAILURE;
                }
            }
        }
        runs.push(round);
    }
    let rows = suite::rows(&scenarios, runs);
    println!("{}", suite::table(&rows));
    if let Some(phases) = suite::breakdown(&rows) {
        println!("per committed transaction, by phase (the run with the median throughput):");
        println!("{phases}");
    }
    if scenarios.iter().any(|s| s.cfg.workload.name == "tpcc") {
        println!("aborts (the run with the median throughput):");
        println!("{}", suite::aborts(&rows));
    }
    for f in &failures {
        eprintln!("error: {f}");
    }
    if let Some(path) = &args.run.output {
        let written = std::fs::File::create(path)
            .map_err(|e| e.to_string())
            .and_then(|f| serde_json::to_writer_pretty(f, &rows).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("error: cannot write {}: {e}", path.display());
            return EXIT_FAILURE;
        }
    }
    if let Some(path) = &args.run.csv {
        if let Err(e) = write_suite_csv(path, &rows) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return EXIT_FAILURE;
        }
    }
    if failures.is_empty() {
        0
    } else {
        EXIT_FAILURE
    }
}

/// One CSV line per scenario: its name and ratio, then the run's figures.
fn write_suite_csv(path: &PathBuf, rows: &[qstore_bench::suite::SuiteRow]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (i, r) in rows.iter().enumerate() {
        let mut buf = Vec::new();
        r.report.write_csv(&mut buf)?;
        let text = String::from_utf8_lossy(&buf);
        let mut lines = text.lines();
        let (header, data) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
        if i == 0 {
            writeln!(out, "scenario,ratio,{header}")?;
        }
        let ratio = r.ratio.map_or(String::new(), |x| format!("{x:.4}"));
        writeln!(out, "{},{ratio},{data}", r.scenario)?;
    }
    out.flush()
}

fn protocols(args: ProtocolsArgs) -> i32 {
    for p in qstore_engine::PROTOCOLS {
        if args.names {
            println!("{}", p.name);
        } else {
            let kind = if p.deterministic {
                "deterministic"
            } else {
                "interactive"
            };
            println!("{:<10} {:<14} {}", p.name, kind, p.summary);
        }
    }
    0
}

fn check(args: CheckArgs) -> i32 {
    if let Some(n) = args.synthetic {
        return check_synthetic(n);
    }
    let path = args.file.expect("clap requires FILE without --synthetic");
    let file = match std::fs::File::open(&path) {
        Ok(f) => std::io::BufReader::new(f),
        Err(e) => return usage_error(&format!("cannot read {}: {e}", path.display())),
    };
    let history = match qstore_check::History::read_jsonl(file) {
        Ok(h) => h,
        Err(e) => {
            let hint = if e.to_string().contains("\"invoke\"") || e.to_string().contains("\"ok\"") {
                " (this looks like a client-observed Elle history: check it with adya)"
            } else {
                ""
            };
            return usage_error(&format!("{}: {e}{hint}", path.display()));
        }
    };
    let report = qstore_check::check(&history);
    println!("{}", report.to_string().trim_end());
    if report.is_serializable() {
        0
    } else {
        EXIT_FAILURE
    }
}

fn check_synthetic(n: usize) -> i32 {
    use std::time::Instant;
    let t = Instant::now();
    let history = qstore_check::generate_serial_history(n, (n as u64 / 10).max(10), 4, 1);
    let generated = t.elapsed();
    let mut bytes = Vec::new();
    history.write_jsonl(&mut bytes).expect("writing to memory");
    let t = Instant::now();
    let parsed = qstore_check::History::read_jsonl(&bytes[..]).expect("own output parses");
    let parse = t.elapsed();
    let t = Instant::now();
    let report = qstore_check::check(&parsed);
    let checking = t.elapsed();
    println!("{}", report.to_string().trim_end());
    println!(
        "synthetic history: {n} transactions, {:.0} MB; generate {:.2}s, parse {:.2}s, check {:.2}s",
        bytes.len() as f64 / 1e6,
        generated.as_secs_f64(),
        parse.as_secs_f64(),
        checking.as_secs_f64()
    );
    if report.is_serializable() {
        0
    } else {
        EXIT_FAILURE
    }
}

fn config(args: ConfigArgs) -> i32 {
    let cfg = match &args.config {
        Some(path) => match load_config(path).and_then(|c| {
            validate_names(&c)?;
            c.validate().map_err(|e| e.to_string())?;
            Ok(c)
        }) {
            Ok(c) => c,
            Err(e) => return usage_error(&e),
        },
        None if args.default => RunConfig::default(),
        None => return usage_error("say what to print: --default, or --config FILE"),
    };
    print!("{}", cfg.to_toml());
    0
}

/// The exit code of a failed run: configuration mistakes are usage errors.
fn run_error(e: QError) -> i32 {
    match e {
        QError::Config(e) => usage_error(&e.to_string()),
        e => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    }
}

pub(crate) fn usage_error(msg: &str) -> i32 {
    eprintln!("error: {msg}");
    EXIT_USAGE
}

fn run(args: RunArgs) -> i32 {
    let cfg = match args.config() {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    if let Err(e) = sizing::check(&cfg, sizing::Loads::embedded(&cfg, args.verify)) {
        return usage_error(&e.to_string());
    }
    let printer = ProgressPrinter::new(&args);
    let mut print = |p: &Progress| printer.print(p);
    let elle = match open_elle(&args, &cfg) {
        Ok(e) => e,
        Err(e) => return usage_error(&e),
    };
    let opts = RunOptions {
        progress: printer
            .live
            .then_some(&mut print as &mut dyn FnMut(&Progress)),
        state_hashes: args.print_state_hash,
        record_history: args.verify || args.engine_history.is_some(),
        elle: elle.as_ref(),
    };
    if !args.quiet {
        eprintln!(
            "qstore: {} on {} node(s), workload {}, loading data...",
            cfg.protocol.name, cfg.cluster.nodes, cfg.workload.name
        );
    }
    let outcome = match qstore_bench::run(&cfg, opts) {
        Ok(o) => o,
        Err(e) => return run_error(e),
    };
    printer.finish();
    let report = &outcome.report;
    if !args.quiet {
        println!("{}", report.table());
    }
    if let Some(hashes) = &report.state_hashes {
        for (p, h) in hashes.iter().enumerate() {
            println!("partition {p} state hash {h}");
        }
    }
    if let Err(e) = write_outputs(&args, report) {
        eprintln!("error: {e}");
        return EXIT_FAILURE;
    }
    if let Some(Err(e)) = elle.map(|log| log.finish()) {
        eprintln!("error: writing the history: {e}");
        return EXIT_FAILURE;
    }
    if let Err(e) = write_engine_history(&args, &outcome) {
        eprintln!("error: {e}");
        return EXIT_FAILURE;
    }
    let answered = report.unfinished == 0;
    if !answered {
        eprintln!(
            "error: {} transaction(s) unanswered when the run ended: the cluster stopped \
             answering (see the warnings above)",
            report.unfinished
        );
    }
    // Verified even when some went unanswered, to say what else held; the run fails anyway.
    let verified = !args.verify || verify(&cfg, &outcome);
    if !answered || !verified {
        return EXIT_FAILURE;
    }
    if report.rejected > 0 {
        eprintln!(
            "error: the cluster refused {} request(s): {}",
            report.rejected,
            report
                .first_rejection
                .as_deref()
                .unwrap_or("no reason given")
        );
        return EXIT_FAILURE;
    }
    if let Some(line) = shortfall(&cfg, report) {
        eprintln!("{line}");
        return EXIT_FAILURE;
    }
    0
}

/// Why a run that otherwise went well is no success: a run bounded by its count alone that
/// ended short of it, or a measurement window without a single commit when the load asked
/// for some (an open loop so slow that no arrival was due in the window asked for none).
fn shortfall(cfg: &RunConfig, r: &qstore_bench::report::RunReport) -> Option<String> {
    let k = &cfg.client;
    let outcomes = format!(
        "{} logic aborts, {} cc aborts, {} unanswered",
        r.logic_aborts,
        r.cc_aborts.values().sum::<u64>(),
        r.unfinished
    );
    if k.txns > 0 && k.duration_s == 0.0 && r.committed < k.txns {
        return Some(format!(
            "error: the run ended with {} of the {} transactions asked for committed ({outcomes})",
            r.committed, k.txns
        ));
    }
    let due = if k.rate > 0.0 {
        k.rate * r.window_s
    } else {
        f64::INFINITY
    };
    (r.committed == 0 && due >= 1.0).then(|| {
        format!(
            "warning: no transaction committed in the {:.1} s measurement window ({outcomes}); \
             the run measured nothing",
            r.window_s
        )
    })
}

/// Opens the Elle history file if one was asked for; only list-append workloads have one.
fn open_elle(
    args: &RunArgs,
    cfg: &RunConfig,
) -> Result<Option<qstore_bench::elle::ElleLog>, String> {
    let Some(path) = &args.history else {
        return Ok(None);
    };
    if !qstore_workload::is_list_append(&cfg.workload.name) {
        return Err(format!(
            "--history writes list-append histories; use --workload append, or --engine-history {} \
             for the engine's history of workload {}",
            path.display(),
            cfg.workload.name
        ));
    }
    let file =
        std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Some(qstore_bench::elle::ElleLog::new(Box::new(
        std::io::BufWriter::new(file),
    ))))
}

fn write_engine_history(args: &RunArgs, outcome: &qstore_bench::RunOutcome) -> Result<(), String> {
    let (Some(path), Some(recorder)) = (
        &args.engine_history,
        outcome.cluster.ctx().history_in_service(),
    ) else {
        return Ok(());
    };
    let file =
        std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    recorder
        .history()
        .write_jsonl(&mut out)
        .and_then(|_| out.flush())
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Runs the checks of `--verify` and prints their verdicts; true when all pass.
fn verify(cfg: &RunConfig, outcome: &qstore_bench::RunOutcome) -> bool {
    print_verification(qstore_bench::verify::verify(
        cfg,
        outcome.workload.as_ref(),
        &outcome.cluster,
        &outcome.report,
    ))
}

/// Prints the verdicts of `--verify`; true when all checks passed.
pub fn print_verification(v: Result<qstore_bench::verify::Verification, QError>) -> bool {
    match v {
        Ok(v) => {
            print!("{v}");
            v.passed()
        }
        Err(e) => {
            eprintln!("error: verification could not run: {e}");
            false
        }
    }
}

fn write_outputs(args: &RunArgs, report: &qstore_bench::report::RunReport) -> Result<(), String> {
    let create = |path: &PathBuf| {
        std::fs::File::create(path)
            .map(std::io::BufWriter::new)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    if let Some(path) = &args.output {
        let mut f = create(path)?;
        report
            .write_json(&mut f)
            .and_then(|_| f.flush())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.csv {
        let mut f = create(path)?;
        report
            .write_csv(&mut f)
            .and_then(|_| f.flush())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}
