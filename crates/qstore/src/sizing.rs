//! Whether a run's data fits in this machine, checked before anything is loaded: a size that
//! cannot fit is a configuration mistake (exit code 2), not an allocation failure minutes
//! into loading.
//!
//! The estimate counts what storage surely allocates for every partition loaded here (rows,
//! a version per row, the index; see `Table::footprint`) and nothing else, so it is a lower
//! bound: a run it refuses could not have run without swapping. It is weighed against the
//! memory the kernel says is available without swapping (MemAvailable in /proc/meminfo);
//! where that cannot be read, only the storage's own limits are checked.

use qstore_core::{ConfigError, RunConfig};
use qstore_storage::Table;

/// The data one command loads on this machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Loads {
    /// Partitions hosted here: every node's in an embedded run (and for `qstore cluster`,
    /// whose servers all run here), its own in a server.
    pub partitions: u32,
    /// Whether every partition is loaded again for the serial oracle of --verify.
    pub oracle: bool,
}

impl Loads {
    /// What `qstore run` (or `qstore cluster`) loads: every partition, and again for the
    /// oracle when `verify` asks for it and the protocol has one.
    pub fn embedded(cfg: &RunConfig, verify: bool) -> Loads {
        Loads {
            partitions: cfg.cluster.nodes,
            oracle: verify && has_oracle(cfg),
        }
    }
}

/// Whether `--verify` replays the run through the serial oracle (deterministic protocols).
pub fn has_oracle(cfg: &RunConfig) -> bool {
    qstore_engine::PROTOCOLS
        .iter()
        .any(|p| p.name == cfg.protocol.name && p.deterministic)
}

/// How many times its partition's rows each node's tables have room for: every record of the
/// cluster for a protocol that moves records between nodes (any may gather on one), once
/// otherwise.
fn room(cfg: &RunConfig) -> u128 {
    let moves = qstore_engine::PROTOCOLS
        .iter()
        .any(|p| p.name == cfg.protocol.name && p.moves_records);
    if moves {
        cfg.cluster.nodes as u128
    } else {
        1
    }
}

/// Refuses `cfg` if what `loads` says cannot fit in this machine's available memory, or
/// exceeds what a table can hold.
pub fn check(cfg: &RunConfig, loads: Loads) -> Result<(), ConfigError> {
    check_against(cfg, loads, available_memory())
}

/// [`check`] against `available` bytes (`None`: unknown, only the table limit is checked).
fn check_against(cfg: &RunConfig, loads: Loads, available: Option<u64>) -> Result<(), ConfigError> {
    let (setting, rows) = rows_setting(cfg);
    let workload = qstore_workload::build(cfg)?;
    let catalog = workload.catalog();
    let per_partition: u128 = catalog.tables.iter().map(Table::footprint).sum();
    let oracle = if loads.oracle { cfg.cluster.nodes } else { 0 };
    let room = room(cfg);
    let needed = per_partition * (room * loads.partitions as u128 + oracle as u128);
    if let Some(available) = available.filter(|&a| needed > a as u128) {
        let oracle = if loads.oracle {
            format!(", plus {oracle} for the serial oracle of --verify")
        } else if room > 1 {
            format!(
                ", each with room for the {room} partitions' records, which {} moves between \
                 nodes",
                cfg.protocol.name
            )
        } else {
            String::new()
        };
        return Err(ConfigError::new(
            setting,
            rows,
            format!(
                "needs about {} of memory ({} partition(s) loaded here{oracle}, {} bytes per \
                 row with its version and index), more than the {} available",
                bytes(needed),
                loads.partitions,
                per_partition / rows.max(1) as u128,
                bytes(available as u128)
            ),
        ));
    }
    match catalog
        .tables
        .iter()
        .find(|t| t.capacity_per_partition as u128 * room > Table::MAX_ROWS as u128)
    {
        Some(t) => Err(ConfigError::new(
            setting,
            rows,
            format!(
                "must be at most {} (table {} of a partition has 32-bit row ids)",
                Table::MAX_ROWS,
                t.name
            ),
        )),
        None => Ok(()),
    }
}

/// The setting that sizes the selected workload's partitions, and its value.
fn rows_setting(cfg: &RunConfig) -> (&'static str, u64) {
    let w = &cfg.workload;
    match w.name.as_str() {
        "bank" => (
            "workload.bank.accounts_per_partition",
            w.bank.accounts_per_partition,
        ),
        "append" => (
            "workload.append.keys_per_partition",
            w.append.keys_per_partition,
        ),
        "tpcc" => (
            "workload.tpcc.warehouses_per_partition",
            w.tpcc.warehouses_per_partition as u64,
        ),
        "kv" => (
            "workload.kv.buckets_per_partition",
            w.kv.buckets_per_partition,
        ),
        "micro" => (
            "workload.micro.records_per_partition",
            w.micro.records_per_partition,
        ),
        _ => (
            "workload.ycsb.records_per_partition",
            w.ycsb.records_per_partition,
        ),
    }
}

/// MemAvailable from /proc/meminfo in bytes: memory the kernel can hand out without
/// swapping. `None` where it cannot be read (not Linux, or a kernel before 3.14).
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let kib: u64 = fields.next()?.parse().ok()?;
    (fields.next() == Some("kB")).then(|| kib.checked_mul(1024))?
}

/// A byte count for people: MiB, GiB or TiB with one decimal.
fn bytes(n: u128) -> String {
    let units = [("TiB", 1u128 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)];
    let (unit, size) = units
        .into_iter()
        .find(|&(_, size)| n >= size)
        .unwrap_or(("MiB", 1 << 20));
    format!("{:.1} {unit}", n as f64 / size as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn with_workload(name: &str) -> RunConfig {
        let mut c = RunConfig::default();
        c.workload.name = name.into();
        c
    }

    fn all(cfg: &RunConfig) -> Loads {
        Loads::embedded(cfg, false)
    }

    #[test]
    fn the_defaults_fit_on_a_machine_with_a_few_gib() {
        for name in ["ycsb", "bank", "append"] {
            let c = with_workload(name);
            check_against(&c, all(&c), Some(2 * GIB)).unwrap();
            check_against(&c, Loads::embedded(&c, true), Some(2 * GIB)).unwrap();
        }
    }

    #[test]
    fn too_many_rows_are_refused_naming_setting_value_estimate_and_memory() {
        let mut c = RunConfig::default();
        c.workload.ycsb.records_per_partition = 10_000_000_000;
        let e = check_against(&c, all(&c), Some(16 * GIB)).unwrap_err();
        assert_eq!(e.setting, "workload.ycsb.records_per_partition");
        assert_eq!(e.value, "10000000000");
        // 100-byte rows, an 8-byte version, 2^35 index slots of 12 bytes for 10^10 rows.
        let per_row = (10_000_000_000u128 * 108 + (1u128 << 35) * 12) / 10_000_000_000;
        let text = e.to_string();
        assert!(
            text.contains("needs about 5.4 TiB of memory")
                && text.contains("4 partition(s) loaded here")
                && text.contains(&format!("{per_row} bytes per row"))
                && text.contains("more than the 16.0 GiB available"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 1);
        // Unknown memory: nothing to weigh against (only the row id limit; see below).
        c.workload.ycsb.records_per_partition = 1 << 32;
        check_against(&c, all(&c), None).unwrap();
    }

    #[test]
    fn a_protocol_that_moves_records_needs_room_for_the_cluster_on_every_node() {
        let mut c = RunConfig::default();
        let per_partition: u128 = qstore_workload::build(&c)
            .unwrap()
            .catalog()
            .tables
            .iter()
            .map(Table::footprint)
            .sum();
        // Twice what every partition loaded once needs: enough for qstore, not for lstore.
        let twice = (2 * per_partition * c.cluster.nodes as u128) as u64;
        check_against(&c, all(&c), Some(twice)).unwrap();
        c.protocol.name = "lstore".into();
        let e = check_against(&c, all(&c), Some(twice)).unwrap_err();
        assert!(
            e.to_string().contains("room for the 4 partitions' records"),
            "{e}"
        );
        c.cluster.nodes = 1;
        check_against(&c, all(&c), Some(twice)).unwrap();
    }

    #[test]
    fn each_workload_names_its_own_rows_setting() {
        let mut bank = with_workload("bank");
        bank.workload.bank.accounts_per_partition = 1 << 34;
        let e = check_against(&bank, all(&bank), Some(GIB)).unwrap_err();
        assert_eq!(e.setting, "workload.bank.accounts_per_partition");
        // Append rows hold whole lists: 8 + 8 * max_list_len bytes.
        let mut append = with_workload("append");
        append.workload.append.max_list_len = 65_536;
        let e = check_against(&append, all(&append), Some(16 * GIB)).unwrap_err();
        assert_eq!(e.setting, "workload.append.keys_per_partition");
        assert!(e.to_string().contains("needs about 195.3 GiB"), "{e}");
        // TPC-C's partitions grow with their warehouses.
        let mut tpcc = with_workload("tpcc");
        tpcc.workload.tpcc.warehouses_per_partition = 64;
        let e = check_against(&tpcc, all(&tpcc), Some(GIB)).unwrap_err();
        assert_eq!(e.setting, "workload.tpcc.warehouses_per_partition");
        assert_eq!(e.value, "64");
    }

    #[test]
    fn a_server_counts_its_own_partition_and_verify_the_oracle_copy() {
        let mut c = RunConfig::default();
        c.workload.ycsb.records_per_partition = 20_000_000; // about 2.6 GiB per partition
        let one = Loads {
            partitions: 1,
            oracle: false,
        };
        check_against(&c, one, Some(4 * GIB)).unwrap();
        check_against(&c, all(&c), Some(4 * GIB)).unwrap_err();
        // Serial has an oracle: --verify loads every partition a second time.
        c.cluster.nodes = 1;
        check_against(&c, all(&c), Some(4 * GIB)).unwrap();
        let e = check_against(&c, Loads::embedded(&c, true), Some(4 * GIB)).unwrap_err();
        assert!(
            e.to_string().contains("plus 1 for the serial oracle"),
            "{e}"
        );
        c.protocol.name = "no_wait".into();
        check_against(&c, Loads::embedded(&c, true), Some(4 * GIB)).unwrap();
    }

    #[test]
    fn more_rows_than_32_bit_row_ids_are_refused_whatever_the_memory() {
        let mut c = RunConfig::default();
        c.workload.ycsb.records_per_partition = (1 << 32) + 1;
        let e = check_against(&c, all(&c), None).unwrap_err();
        assert_eq!(e.setting, "workload.ycsb.records_per_partition");
        assert!(e.to_string().contains("32-bit row ids"), "{e}");
        c.workload.ycsb.records_per_partition = 1 << 32;
        check_against(&c, all(&c), None).unwrap();
    }

    #[test]
    fn mem_available_is_read_in_bytes() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots\n"), None);
        assert_eq!(bytes(1536 << 20), "1.5 GiB");
        assert_eq!(bytes(3 << 40), "3.0 TiB");
        assert_eq!(bytes(1000), "0.0 MiB");
    }
}
