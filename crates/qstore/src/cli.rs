//! Command-line interface.

use clap::{Args, Parser, Subcommand};
use qstore_bench::{Progress, RunOptions};
use qstore_core::config::Partitioning;
use qstore_core::{QError, RunConfig};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// Exit code of invalid input (bad flags, bad configuration values).
const EXIT_USAGE: i32 = 2;
/// Exit code of a run that failed.
const EXIT_FAILURE: i32 = 1;

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
    Run(Box<RunArgs>),
    /// Print a configuration as TOML.
    Config(ConfigArgs),
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
    /// Concurrency-control protocol: serial.
    #[arg(long, help_heading = "Cluster")]
    protocol: Option<String>,
    /// Nodes in the cluster; each hosts one partition.
    #[arg(long, help_heading = "Cluster")]
    nodes: Option<u32>,
    /// Worker threads per node.
    #[arg(long, help_heading = "Cluster")]
    workers: Option<u32>,
    /// How keys map to partitions: range or hash.
    #[arg(long, value_parser = parse_partitioning, help_heading = "Cluster")]
    partitioning: Option<Partitioning>,
    /// Pin worker threads to cores.
    #[arg(long, help_heading = "Cluster")]
    pin_threads: bool,
    /// Capacity of each node's client admission queue.
    #[arg(long, help_heading = "Cluster")]
    admission_queue: Option<u32>,
    /// Injected one-way network delay per message, in microseconds.
    #[arg(long, help_heading = "Cluster")]
    delay_us: Option<u64>,
    /// Extra uniformly random delay per message in [0, jitter), in microseconds.
    #[arg(long, help_heading = "Cluster")]
    jitter_us: Option<u64>,

    // --- workload ---
    /// Workload: ycsb.
    #[arg(long, help_heading = "Workload")]
    workload: Option<String>,
    /// Seed of every random choice (same seed, same workload stream).
    #[arg(long, help_heading = "Workload")]
    seed: Option<u64>,
    /// YCSB: rows per partition.
    #[arg(long, help_heading = "Workload")]
    records: Option<u64>,
    /// YCSB: bytes per row (8 to 1048576).
    #[arg(long, help_heading = "Workload")]
    row_size: Option<usize>,
    /// YCSB: record accesses per transaction.
    #[arg(long, help_heading = "Workload")]
    ops: Option<u32>,
    /// YCSB: fraction of accesses that are read-modify-writes (0 to 1).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    write_fraction: Option<f64>,
    /// YCSB: Zipfian skew θ of key choice (0 = uniform; 0.99 and above allowed).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    theta: Option<f64>,
    /// YCSB: fraction of multi-partition transactions (0 to 1).
    #[arg(long, allow_negative_numbers = true, help_heading = "Workload")]
    mp_fraction: Option<f64>,
    /// YCSB: partitions a multi-partition transaction touches.
    #[arg(long, help_heading = "Workload")]
    mp_partitions: Option<u32>,
    /// YCSB: allow a transaction to pick the same key twice.
    #[arg(long, help_heading = "Workload")]
    allow_duplicate_keys: bool,

    // --- load generator ---
    /// Clients in the cluster, spread round-robin over home nodes (0 = one per node).
    #[arg(long, help_heading = "Load")]
    clients: Option<u32>,
    /// Transactions each client keeps in flight (closed loop).
    #[arg(long, help_heading = "Load")]
    inflight: Option<u32>,
    /// Open-loop target rate in transactions/s for the whole cluster (0 = closed loop).
    #[arg(long, allow_negative_numbers = true, help_heading = "Load")]
    rate: Option<f64>,
    /// Measurement window in seconds (after the warm-up).
    #[arg(long, allow_negative_numbers = true, help_heading = "Load")]
    duration: Option<f64>,
    /// Warm-up in seconds before the measurement window.
    #[arg(long, allow_negative_numbers = true, help_heading = "Load")]
    warmup: Option<f64>,
    /// Stop after this many committed transactions instead of after --duration (no warm-up).
    #[arg(long, help_heading = "Load")]
    txns: Option<u64>,
    /// Load-generator threads.
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
    /// Progress line each second even when stderr is not a terminal.
    #[arg(long, help_heading = "Output", conflicts_with = "quiet")]
    progress: bool,
    /// No progress line and no table (files are still written).
    #[arg(long, short, help_heading = "Output")]
    quiet: bool,
}

fn parse_partitioning(s: &str) -> Result<Partitioning, String> {
    match s {
        "range" => Ok(Partitioning::Range),
        "hash" => Ok(Partitioning::Hash),
        _ => Err(format!("{s:?} is not a partitioning; use range or hash")),
    }
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
        set(&mut c.net.delay_us, self.delay_us);
        set(&mut c.net.jitter_us, self.jitter_us);
        set(&mut c.workload.name, self.workload.clone());
        let y = &mut c.workload.ycsb;
        set(&mut y.records_per_partition, self.records);
        set(&mut y.row_size, self.row_size);
        set(&mut y.ops_per_txn, self.ops);
        set(&mut y.write_fraction, self.write_fraction);
        set(&mut y.theta, self.theta);
        set(&mut y.multi_partition_fraction, self.mp_fraction);
        set(&mut y.partitions_per_mp_txn, self.mp_partitions);
        y.allow_duplicate_keys |= self.allow_duplicate_keys;
        let k = &mut c.client;
        set(&mut k.clients, self.clients);
        set(&mut k.inflight, self.inflight);
        set(&mut k.rate, self.rate);
        set(&mut k.duration_s, self.duration);
        set(&mut k.warmup_s, self.warmup);
        set(&mut k.txns, self.txns);
        set(&mut k.threads, self.client_threads);
        set(&mut k.backoff_base_us, self.backoff_base_us);
        set(&mut k.backoff_max_us, self.backoff_max_us);
        validate_names(&c)?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}

fn load_config(path: &PathBuf) -> Result<RunConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read configuration file {}: {e}", path.display()))?;
    RunConfig::from_toml(&text)
        .map_err(|e| format!("configuration file {}: {}", path.display(), e.trim_end()))
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

fn usage_error(msg: &str) -> i32 {
    eprintln!("error: {msg}");
    EXIT_USAGE
}

fn run(args: RunArgs) -> i32 {
    let cfg = match args.config() {
        Ok(c) => c,
        Err(e) => return usage_error(&e),
    };
    let live = !args.quiet && (args.progress || std::io::stderr().is_terminal());
    let tty = std::io::stderr().is_terminal();
    let mut print_progress = |p: &Progress| {
        let phase = if p.measuring { "run " } else { "warm" };
        let line = format!(
            "[{:>5.1}s {phase}] {:>10.0} txn/s  committed {:>10}  cc aborts {:>8}",
            p.elapsed_s, p.tps, p.committed, p.cc_aborts
        );
        if tty {
            eprint!("\r{line}");
        } else {
            eprintln!("{line}");
        }
    };
    let opts = RunOptions {
        progress: if live {
            Some(&mut print_progress)
        } else {
            None
        },
        state_hashes: args.print_state_hash,
    };
    if !args.quiet {
        eprintln!(
            "qstore: {} on {} node(s), workload {}, loading data...",
            cfg.protocol.name, cfg.cluster.nodes, cfg.workload.name
        );
    }
    let outcome = match qstore_bench::run(&cfg, opts) {
        Ok(o) => o,
        Err(QError::Config(e)) => return usage_error(&e.to_string()),
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILURE;
        }
    };
    if live && tty {
        eprintln!();
    }
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
    0
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
