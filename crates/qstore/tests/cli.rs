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
            &["--remote-access-fraction", "0.1", "--mp-fraction", "0.5"],
            "choose remote accesses (Sundial's mode) or multi-partition transactions",
        ),
        (
            &["--remote-access-fraction", "1.5"],
            "workload.ycsb.remote_access_fraction = 1.5",
        ),
        (
            &["--remote-locality", "0.5"],
            "workload.ycsb.remote_locality = 0.5: needs remote accesses",
        ),
        (&["--steps", "16"], "workload.ycsb.steps = 16"),
        (
            &["--slow-node", "9"],
            "cluster.slow_node = 9: names no server",
        ),
        (
            &["--slow-threads", "3"],
            "needs cluster.slow_node (--slow-node)",
        ),
        (
            &["--throttle", "--protocol", "qstore"],
            "protocol.throttle = true: throttling refuses transactions",
        ),
        (
            &["--dl-detect-skip-2pc", "--protocol", "no_wait"],
            "is a dl_detect option: use --protocol dl_detect",
        ),
        (
            &["--workload", "micro", "--contention-index", "0"],
            "workload.micro.contention_index = 0",
        ),
        (
            &["--contention-index", "0.01"],
            "(micro only) does not apply to workload ycsb",
        ),
        (
            &["--remote-access-fraction", "0.1", "--remote-phases", "1:9"],
            "workload.ycsb.remote_phases = 1:9",
        ),
        (
            &["--workload", "bank", "--steps", "2"],
            "does not apply to workload bank",
        ),
        (
            &["--workload", "bank", "--remote-access-fraction", "0.1"],
            "--remote-access-fraction (ycsb and tpcc only) does not apply to workload bank",
        ),
        (
            &["--workload", "append", "--remote-access-fraction", "0.1"],
            "--remote-access-fraction (ycsb and tpcc only) does not apply to workload append",
        ),
        (
            &[
                "--workload",
                "tpcc",
                "--remote-access-fraction",
                "0.1",
                "--mp-fraction",
                "0.2",
            ],
            "workload.tpcc.remote_access_fraction = 0.1: must be 0 when \
             workload.tpcc.multi_partition_fraction is not (it is 0.2",
        ),
        (
            &["--workload", "tpcc", "--remote-access-fraction", "1.5"],
            "workload.tpcc.remote_access_fraction = 1.5",
        ),
        (
            &[
                "--workload",
                "tpcc",
                "--nodes",
                "1",
                "--remote-access-fraction",
                "0.1",
            ],
            "workload.tpcc.remote_access_fraction = 0.1: must be 0 on a single-node",
        ),
        (
            &["--workload", "tpcc", "--remote-locality", "0.5"],
            "does not apply to workload tpcc",
        ),
        (
            &["--config", "/nonexistent/q.toml"],
            "cannot read configuration file",
        ),
        (&["--rate", "1e10"], "client.rate = 10000000000"),
        (&["--rate", "-5"], "client.rate = -5"),
        (&["--rate", "inf"], "client.rate = inf"),
        (&["--rate", "NaN"], "client.rate = NaN"),
        (
            &["--rate", "1e-30"],
            "client.rate = 0.000000000000000000000000000001",
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

/// A scratch directory unique to this test process and `name`.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("qstore-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Two loopback addresses that were free a moment ago.
fn free_addresses() -> (std::net::SocketAddr, std::net::SocketAddr) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap(), b.local_addr().unwrap())
}

/// Writes a cluster file of `nodes` Q-Store nodes with small data, and its secret beside
/// it; `addresses` is the TOML array of address entries.
fn write_cluster_file(dir: &std::path::Path, nodes: u32, addresses: &str) -> std::path::PathBuf {
    let path = dir.join("cluster.toml");
    let secret = dir.join("secret");
    if !secret.exists() {
        qstore_net::auth::ClusterSecret::create_file(&secret).unwrap();
    }
    std::fs::write(
        &path,
        format!(
            "[cluster]\nnodes = {nodes}\nworkers = 1\naddresses = [{addresses}]\n\
             secret_file = \"secret\"\n\
             [protocol]\nname = \"qstore\"\n[workload.ycsb]\nrecords_per_partition = 2000\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_missing_or_readable_secret_file_is_a_configuration_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("secret-file");
    let (peer, client) = free_addresses();
    let file = write_cluster_file(
        &dir,
        1,
        &format!("{{ peer = \"{peer}\", client = \"{client}\" }}"),
    );
    let limit = std::time::Duration::from_secs(20);
    let args = ["server", "--cluster", file.to_str().unwrap(), "--node", "0"];
    let secret = dir.join("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, err) = qstore_within(&args, limit);
    assert_eq!(code, Some(2), "{err}");
    assert_one_clean_error_line(&err, "readable secret");
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::remove_file(&secret).unwrap();
    let (code, err) = qstore_within(&args, limit);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cluster.secret_file"), "{err}");
    // No secret named at all.
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("secret_file = \"secret\"\n", "");
    std::fs::write(&file, text).unwrap();
    let (code, err) = qstore_within(&args, limit);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("qstore secret"), "{err}");
}

/// A `qstore server` process whose stderr is collected as it arrives; killed when dropped.
struct Server {
    child: std::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    fn start(cluster: &std::path::Path, rust_log: Option<&str>) -> Server {
        use std::io::BufRead;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_qstore"));
        cmd.args(["server", "--node", "0", "--cluster"])
            .arg(cluster)
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if let Some(filter) = rust_log {
            cmd.env("RUST_LOG", filter);
        }
        let mut child = cmd.spawn().expect("start qstore server");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let text = stderr.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut t = text.lock().unwrap();
                t.push_str(&line);
                t.push('\n');
            }
        });
        Server { child, stderr }
    }

    /// Waits up to `secs` seconds for stderr to contain `what`; the stderr so far either way.
    fn wait_for(&self, what: &str, secs: u64) -> (bool, String) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let text = self.stderr.lock().unwrap().clone();
            if text.contains(what) || std::time::Instant::now() >= deadline {
                return (text.contains(what), text);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects to `addr` and sends bytes that are no valid frame or handshake.
fn send_garbage(addr: std::net::SocketAddr) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let _ = s.write_all(&[0xFF; 64]);
    let _ = s.shutdown(std::net::Shutdown::Write);
}

#[test]
fn warnings_reach_stderr_without_rust_log_and_rust_log_still_overrides() {
    let dir = scratch("warn");
    let (peer, client) = free_addresses();
    let file = write_cluster_file(
        &dir,
        1,
        &format!("{{ peer = \"{peer}\", client = \"{client}\" }}"),
    );
    for (rust_log, shown) in [(None, true), (Some("off"), false)] {
        let server = Server::start(&file, rust_log);
        let (ready, text) = server.wait_for("serving clients", 20);
        assert!(ready, "server did not start: {text}");
        send_garbage(peer);
        // The warning comes within milliseconds; when it must not come, 2 s is long enough.
        let (warned, text) = server.wait_for("WARN", if shown { 20 } else { 2 });
        assert_eq!(warned, shown, "RUST_LOG={rust_log:?}: {text}");
        drop(server);
    }
}

/// Runs qstore with `args` for at most `limit`; its exit code (`None` if it had to be
/// killed) and its stderr.
fn qstore_within(args: &[&str], limit: std::time::Duration) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_qstore"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run qstore");
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    let deadline = std::time::Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (code, reader.join().unwrap())
}

/// Asserts that `err` is one `error: ` line that does not say which node twice.
fn assert_one_clean_error_line(err: &str, what: &str) {
    assert!(err.starts_with("error: "), "{what}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
    for n in 0..8 {
        let prefix = format!("node {n}:");
        assert!(err.matches(&prefix).count() <= 1, "{what}: {err}");
    }
}

#[test]
fn server_configuration_mistakes_exit_2_and_runtime_failures_1_each_in_one_line() {
    let dir = scratch("server-errors");
    let entry = |(p, c): (std::net::SocketAddr, std::net::SocketAddr)| {
        format!("{{ peer = \"{p}\", client = \"{c}\" }}")
    };
    let (a, b) = (free_addresses(), free_addresses());
    let two = write_cluster_file(&dir, 2, &format!("{}, {}", entry(a), entry(b)));
    let two = two.to_str().unwrap();
    let limit = std::time::Duration::from_secs(20);

    let (code, err) = qstore_within(&["server", "--cluster", two, "--node", "5"], limit);
    assert_eq!(code, Some(2), "--node 5: {err}");
    assert_one_clean_error_line(&err, "--node 5");
    assert!(
        err.contains("--node = 5") && err.contains("servers 0 to 1"),
        "{err}"
    );

    // The same address twice (node 1's client is node 0's client).
    let dup_dir = scratch("server-dup");
    let dup = write_cluster_file(&dup_dir, 2, &format!("{}, {}", entry(a), entry((b.0, a.1))));
    let (code, err) = qstore_within(
        &["server", "--cluster", dup.to_str().unwrap(), "--node", "0"],
        limit,
    );
    assert_eq!(code, Some(2), "duplicate address: {err}");
    assert_one_clean_error_line(&err, "duplicate address");
    assert!(
        err.contains("cluster.addresses[1].client") && err.contains("cluster.addresses[0].client"),
        "{err}"
    );

    // An address another process listens on.
    let taken = std::net::TcpListener::bind(a.0).unwrap();
    let (code, err) = qstore_within(&["server", "--cluster", two, "--node", "0"], limit);
    drop(taken);
    assert_eq!(code, Some(2), "address in use: {err}");
    assert_one_clean_error_line(&err, "address in use");
    assert!(
        err.contains("cluster.addresses[0].peer") && err.contains("cannot listen"),
        "{err}"
    );

    // An address of no interface here (TEST-NET-1 is reserved for documentation).
    let far_dir = scratch("server-far");
    let far = write_cluster_file(
        &far_dir,
        2,
        &format!(
            "{}, {}",
            entry(("192.0.2.1:7100".parse().unwrap(), a.1)),
            entry(b)
        ),
    );
    let (code, err) = qstore_within(
        &["server", "--cluster", far.to_str().unwrap(), "--node", "0"],
        limit,
    );
    assert_eq!(code, Some(2), "foreign address: {err}");
    assert_one_clean_error_line(&err, "foreign address");
    assert!(err.contains("192.0.2.1:7100"), "{err}");

    // A peer that never comes is a failure of the run, not of the file.
    let lonely_dir = scratch("server-lonely");
    let lonely = lonely_dir.join("cluster.toml");
    let text = std::fs::read_to_string(two).unwrap();
    std::fs::write(
        &lonely,
        text.replace("[cluster]\n", "[cluster]\nconnect_timeout_s = 0.5\n"),
    )
    .unwrap();
    std::fs::copy(dir.join("secret"), lonely_dir.join("secret")).unwrap();
    let (code, err) = qstore_within(
        &[
            "server",
            "--cluster",
            lonely.to_str().unwrap(),
            "--node",
            "0",
        ],
        limit,
    );
    let last = err.lines().last().unwrap_or("").to_string();
    assert_eq!(code, Some(1), "peer never connects: {err}");
    assert_one_clean_error_line(&last, "peer never connects");
    assert!(
        last.contains("node 0:") && last.contains("peer(s) 1"),
        "{err}"
    );
}

#[test]
fn a_run_with_txns_and_duration_stops_at_whichever_comes_first() {
    let limit = std::time::Duration::from_secs(30);
    let dir = scratch("txns-first");
    let json = dir.join("r.json");
    let small = ["run", "--nodes", "2", "--records", "1000", "-q"];
    // The duration first: a count no run reaches.
    let args = [
        &small[..],
        &["--txns", "18446744073709551615", "--duration", "1"],
    ]
    .concat();
    let (code, err) = qstore_within(&args, limit);
    assert_eq!(code, Some(0), "{err}");
    // The count first.
    let json_arg = json.to_str().unwrap();
    let count_first = ["--txns", "300", "--duration", "1000", "--output", json_arg];
    let (code, err) = qstore_within(&[&small[..], &count_first].concat(), limit);
    assert_eq!(code, Some(0), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["committed"], 300);
}

#[test]
fn a_run_bounded_by_txns_alone_ends_once_nothing_commits() {
    // Every transfer from an empty account aborts by its own check: nothing ever commits.
    let dir = scratch("txns-stall");
    let cfg = dir.join("q.toml");
    std::fs::write(&cfg, "[client]\ndrain_timeout_s = 1.0\n").unwrap();
    let (code, err) = qstore_within(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--workload",
            "bank",
            "--nodes",
            "2",
            "--records",
            "64",
            "--initial-balance",
            "0",
            "--audit-fraction",
            "0",
            "--txns",
            "1000",
            "-q",
        ],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("error: the run ended with 0 of the 1000 transactions asked for committed"),
        "{err}"
    );
}

#[test]
fn a_measured_run_without_commits_warns_and_fails_unless_none_were_due() {
    // Every transfer from an empty account aborts by its own check: nothing commits.
    let o = qstore(&[
        "run",
        "--workload",
        "bank",
        "--nodes",
        "2",
        "--records",
        "64",
        "--initial-balance",
        "0",
        "--audit-fraction",
        "0",
        "--warmup",
        "0",
        "--duration",
        "0.5",
        "-q",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("warning: no transaction committed in the 0.5 s measurement window"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // An open loop of one arrival per 100 s asks for none in a 1 s window (the first
    // arrivals fall in the warm-up).
    let o = qstore(&[
        "run",
        "--nodes",
        "2",
        "--records",
        "1000",
        "--rate",
        "0.01",
        "--duration",
        "1",
        "-q",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn data_that_cannot_fit_in_memory_is_refused_before_loading() {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    if !meminfo.contains("MemAvailable:") {
        eprintln!("no MemAvailable in /proc/meminfo: the check is skipped here");
        return;
    }
    // Under an 8 GB address-space limit, so that a run that does try to load 10^10 rows a
    // partition fails at once instead of taking the machine's memory.
    let qstore = env!("CARGO_BIN_EXE_qstore");
    let limited = |args: &[&str]| {
        let script = format!("ulimit -v 8000000 && exec {qstore} \"$@\"");
        let o = Command::new("sh")
            .args(["-c", &script, "qstore"])
            .args(args)
            .output()
            .expect("run sh");
        (o.status.code(), stderr(&o))
    };
    let (code, err) = limited(&["run", "--records", "10000000000"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "error: invalid workload.ycsb.records_per_partition = 10000000000: needs about"
        ) && err.contains("TiB of memory")
            && err.contains("available"),
        "{err}"
    );
    // Every workload, and a server counts its own partition.
    let (code, err) = limited(&["run", "--workload", "bank", "--records", "1000000000000"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("workload.bank.accounts_per_partition"),
        "{err}"
    );
    let (code, err) = limited(&[
        "run",
        "--workload",
        "append",
        "--max-list-len",
        "65536",
        "--records",
        "100000000",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("workload.append.keys_per_partition"), "{err}");
    let dir = scratch("sizing");
    let (p, c) = free_addresses();
    let file = write_cluster_file(&dir, 1, &format!("{{ peer = \"{p}\", client = \"{c}\" }}"));
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace(
            "records_per_partition = 2000",
            "records_per_partition = 4000000000",
        ),
    )
    .unwrap();
    let (code, err) = limited(&["server", "--cluster", file.to_str().unwrap(), "--node", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("1 partition(s) loaded here"), "{err}");
}

#[test]
fn a_run_that_leaves_transactions_unanswered_fails_verify_and_exits_1_on_every_protocol() {
    // Lost messages (injected) leave some transactions unanswered on every protocol whose
    // nodes talk to each other. What did commit may well check out: the run must fail anyway.
    let dir = scratch("unanswered");
    let cfg = dir.join("q.toml");
    std::fs::write(&cfg, "[client]\ndrain_timeout_s = 0.5\n").unwrap();
    let out = qstore(&["protocols", "--names"]);
    let names = String::from_utf8(out.stdout).unwrap();
    // `serial` runs every partition on one thread: it sends no messages to lose.
    for protocol in names.split_whitespace().filter(|&p| p != "serial") {
        let o = qstore(&[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--protocol",
            protocol,
            "--nodes",
            "2",
            "--records",
            "1000",
            "--mp-fraction",
            "0.5",
            "--drop-fraction",
            "0.02",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--verify",
            "-q",
        ]);
        let (out, err) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
        assert_eq!(o.status.code(), Some(1), "{protocol}:\n{out}\n{err}");
        assert!(
            out.contains("transaction(s) UNANSWERED when the run ended"),
            "{protocol}: --verify must name the unanswered transactions:\n{out}\n{err}"
        );
        assert!(
            err.contains("unanswered when the run ended"),
            "{protocol}: {err}"
        );
    }
}

#[test]
fn zookeeper_latency_refuses_bad_flags_and_says_when_no_server_answers() {
    let o = qstore(&["zookeeper-latency", "--payloads", "100,2000000"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("at most 1000000 bytes"),
        "{}",
        stderr(&o)
    );
    let o = qstore(&["zookeeper-latency", "--requests", "0"]);
    assert_eq!(o.status.code(), Some(2));
    // A port nothing listens on.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    let o = qstore(&["zookeeper-latency", "--zookeeper", &addr]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("scripts/zookeeper.sh start"),
        "{}",
        stderr(&o)
    );
}
