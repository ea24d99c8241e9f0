//! The command line as a user meets it: exit codes, error lines, output files.

use std::process::{Command, Output};

fn qstore(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qstore"))
        .args(args)
        .output()
        .expect("run qstore")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn invalid_values_exit_2_with_one_clear_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["--theta", "-0.5"], "workload.ycsb.theta = -0.5"),
        (&["--nodes", "0"], "cluster.nodes = 0"),
        (
            &["--write-fraction", "1.5"],
            "workload.ycsb.write_fraction = 1.5",
        ),
        (
            &["--protocol", "nope"],
            "unknown protocol; choose one of: serial",
        ),
        (
            &["--workload", "nope"],
            "unknown workload; choose one of: ycsb",
        ),
        (&["--row-size", "99999999"], "workload.ycsb.row_size"),
        (&["--nodes", "1", "--mp-fraction", "0.5"], "single-node"),
        (
            &["--config", "/nonexistent/q.toml"],
            "cannot read configuration file",
        ),
    ];
    for (args, expect) in cases {
        let mut full = vec!["run"];
        full.extend_from_slice(args);
        let o = qstore(&full);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(expect),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn bad_config_file_names_the_unknown_setting() {
    let dir = std::env::temp_dir().join(format!("qstore-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[cluster]\nnodez = 2\n").unwrap();
    let o = qstore(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nodez"), "{}", stderr(&o));
}

#[test]
fn default_config_prints_and_reads_back() {
    let o = qstore(&["config", "--default"]);
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.contains("[workload.ycsb]") && text.contains("theta"));
    let dir = std::env::temp_dir().join(format!("qstore-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("default.toml");
    std::fs::write(&path, &text).unwrap();
    let back = qstore(&["config", "--config", path.to_str().unwrap()]);
    assert_eq!(String::from_utf8(back.stdout).unwrap(), text);
}

#[test]
fn run_prints_a_table_and_writes_json_and_csv() {
    let dir = std::env::temp_dir().join(format!("qstore-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let csv = dir.join("r.csv");
    let o = qstore(&[
        "run",
        "--nodes",
        "2",
        "--records",
        "1000",
        "--txns",
        "500",
        "--print-state-hash",
        "--output",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("throughput (txn/s)"), "{out}");
    assert!(out.contains("partition 1 state hash"), "{out}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["committed"], 500);
    for field in [
        "throughput_tps",
        "latency",
        "cc_aborts",
        "msgs_per_txn",
        "bytes_per_txn",
    ] {
        assert!(r.get(field).is_some(), "missing {field}");
    }
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(csv.starts_with("protocol,workload,"));
    assert_eq!(csv.lines().count(), 2);
}

#[test]
fn help_lists_every_command() {
    let o = qstore(&["--help"]);
    let text = String::from_utf8(o.stdout).unwrap();
    for cmd in ["run", "config"] {
        assert!(text.contains(cmd), "{text}");
    }
    let o = qstore(&["run", "--help"]);
    let text = String::from_utf8(o.stdout).unwrap();
    for flag in [
        "--theta",
        "--mp-fraction",
        "--inflight",
        "--rate",
        "--txns",
        "--delay-us",
    ] {
        assert!(text.contains(flag), "{flag} missing from run --help");
    }
}

#[test]
fn check_flags_each_planted_anomaly_with_its_class() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../qstore-check/fixtures");
    let cases = [
        ("clean", 0, "serializable: yes"),
        ("lost_update", 1, "G2:"),
        ("write_skew", 1, "G2:"),
        ("dirty_read", 1, "G1b"),
        ("fractured_read", 1, "G2:"),
        ("aborted_read", 1, "G1a"),
        ("long_g2", 1, "G2:"),
    ];
    for (name, code, class) in cases {
        let o = qstore(&["check", &format!("{fixtures}/{name}.jsonl")]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(code), "{name}: {out}");
        assert!(out.contains(class), "{name}: {out}");
    }
    let o = qstore(&["check", "/nonexistent.jsonl"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn verify_passes_on_bank_and_engine_history_round_trips_through_check() {
    let dir = std::env::temp_dir().join(format!("qstore-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hist = dir.join("e.jsonl");
    let o = qstore(&[
        "run",
        "--workload",
        "bank",
        "--nodes",
        "3",
        "--records",
        "64",
        "--txns",
        "3000",
        "--verify",
        "--engine-history",
        hist.to_str().unwrap(),
        "-q",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    for line in [
        "serializable: yes",
        "serial oracle: match",
        "invariants: ok",
    ] {
        assert!(out.contains(line), "missing {line:?} in {out}");
    }
    let o = qstore(&["check", hist.to_str().unwrap()]);
    assert!(o.status.success());
}

#[test]
fn history_needs_a_list_append_workload_and_writes_jepsen_events() {
    let dir = std::env::temp_dir().join(format!("qstore-elle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let h = dir.join("h.jsonl");
    let o = qstore(&[
        "run",
        "--workload",
        "ycsb",
        "--history",
        h.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--engine-history"), "{}", stderr(&o));
    let o = qstore(&[
        "run",
        "--workload",
        "append",
        "--nodes",
        "2",
        "--records",
        "100",
        "--txns",
        "500",
        "--history",
        h.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&h).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let invokes = events.iter().filter(|e| e["type"] == "invoke").count();
    let oks = events.iter().filter(|e| e["type"] == "ok").count();
    assert!(invokes >= 500 && oks == 500, "{invokes} invokes, {oks} oks");
    assert!(events.iter().enumerate().all(|(i, e)| e["index"] == i));
}

#[test]
fn run_help_names_every_protocol() {
    let names = String::from_utf8(qstore(&["protocols", "--names"]).stdout).unwrap();
    let help = String::from_utf8(qstore(&["run", "--help"]).stdout).unwrap();
    let help = help.replace(char::is_whitespace, " ");
    for name in names.lines() {
        assert!(help.contains(name), "`run --help` does not name {name}");
    }
}
