//! The run configuration: one typed tree, read from TOML (`--config`), overridden by command
//! line flags, validated once, then passed explicitly to every layer.
//!
//! Counts that may be "unbounded" or "automatic" use 0 for that meaning, so that the whole
//! tree, defaults included, prints as TOML (`qstore config --default`).

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

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
    /// Worker threads per node (protocols that run one thread per partition ignore it).
    pub workers: u32,
    pub partitioning: Partitioning,
    /// Pin worker threads to cores.
    pub pin_threads: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            nodes: 4,
            workers: 2,
            partitioning: Partitioning::Range,
            pin_threads: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProtocolConfig {
    /// Protocol name, e.g. `serial`.
    pub name: String,
    /// Capacity of each node's client admission queue; a full queue refuses new transactions.
    pub admission_queue: u32,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        ProtocolConfig {
            name: "serial".into(),
            admission_queue: 65_536,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Workload name, e.g. `ycsb`.
    pub name: String,
    pub ycsb: YcsbConfig,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            name: "ycsb".into(),
            ycsb: YcsbConfig::default(),
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
    /// Fraction of transactions that touch more than one partition.
    pub multi_partition_fraction: f64,
    /// Partitions a multi-partition transaction touches (its home partition included).
    pub partitions_per_mp_txn: u32,
    /// Allow one transaction to pick the same key twice.
    pub allow_duplicate_keys: bool,
}

impl Default for YcsbConfig {
    fn default() -> Self {
        YcsbConfig {
            records_per_partition: 1_000_000,
            row_size: 100,
            ops_per_txn: 16,
            write_fraction: 0.5,
            theta: 0.0,
            multi_partition_fraction: 0.0,
            partitions_per_mp_txn: 2,
            allow_duplicate_keys: false,
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
    /// Stop after this many commits instead of after the duration (0 = use the duration).
    /// The warm-up is skipped in this mode: every commit counts.
    pub txns: u64,
    /// Load-generator threads (each drives a share of the clients).
    pub threads: u32,
    /// Back-off after a concurrency-control abort: a uniformly random wait in
    /// [0, min(max, base * 2^retries)) microseconds.
    pub backoff_base_us: u64,
    pub backoff_max_us: u64,
    /// Seconds to wait for in-flight transactions after the run before giving up.
    pub drain_timeout_s: f64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            clients: 0,
            inflight: 10,
            rate: 0.0,
            duration_s: 5.0,
            warmup_s: 1.0,
            txns: 0,
            threads: 1,
            backoff_base_us: 50,
            backoff_max_us: 10_000,
            drain_timeout_s: 10.0,
        }
    }
}

impl ClientConfig {
    /// Clients actually started for a cluster of `nodes` nodes.
    pub fn effective_clients(&self, nodes: u32) -> u32 {
        if self.clients == 0 {
            nodes
        } else {
            self.clients
        }
    }
}

/// Injected network delay, applied to every message between nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// Fixed one-way delay in microseconds.
    pub delay_us: u64,
    /// Extra uniformly random delay in [0, jitter) microseconds.
    pub jitter_us: u64,
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
            (1..=256).contains(&c.workers),
            "cluster.workers",
            c.workers,
            "must be between 1 and 256",
        )?;
        check(
            self.protocol.admission_queue >= 1,
            "protocol.admission_queue",
            self.protocol.admission_queue,
            "must be at least 1",
        )?;
        self.validate_client()?;
        self.validate_net()?;
        if self.workload.name == "ycsb" {
            self.workload.ycsb.validate(c.nodes)?;
        }
        Ok(())
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
            k.rate.is_finite() && k.rate >= 0.0,
            "client.rate",
            k.rate,
            "must be a finite number >= 0 (0 = closed loop)",
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
            (1..=64).contains(&k.threads),
            "client.threads",
            k.threads,
            "must be between 1 and 64",
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
        )
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
        check(
            self.theta.is_finite() && (0.0..=100.0).contains(&self.theta),
            "workload.ycsb.theta",
            self.theta,
            "must be a finite number between 0 and 100 (0 = uniform)",
        )?;
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
        check(
            self.partitions_per_mp_txn >= 2 && self.partitions_per_mp_txn <= partitions.max(2),
            "workload.ycsb.partitions_per_mp_txn",
            self.partitions_per_mp_txn,
            &format!("must be between 2 and the number of nodes ({partitions})"),
        )?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn error_message_names_value_and_range() {
        let e = invalid(|c| c.workload.ycsb.theta = -1.0);
        assert_eq!(
            e.to_string(),
            "invalid workload.ycsb.theta = -1: must be a finite number between 0 and 100 (0 = uniform)"
        );
    }
}
