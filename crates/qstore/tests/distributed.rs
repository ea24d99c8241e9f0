//! Distributed mode as an operator meets it: real `qstore server` processes on loopback, the
//! `qstore client` and `qstore cluster` commands, a server killed mid-run, and hostile bytes
//! on the client and peer ports.

mod common;

use common::*;
use qstore_core::txn::{ProcCall, ProcId, TxnOutcome, Value};
use qstore_engine::net::WIRE_FORMAT_VERSION;
use qstore_engine::server::proto::{ClientRequest, ClientResponse, CLIENT_FORMAT_VERSION};
use std::io::Write;
use std::net::Shutdown;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Parent pid of `pid`, from /proc (the command name may hold spaces and parentheses, so the
/// fields are read after the last ')').
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The command lines of the processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<(u32, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent_of(pid) == Some(parent))
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = raw
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

#[test]
fn cluster_of_processes_runs_and_reports() {
    let dir = TestDir::new("launch");
    let json = dir.path("out.json");
    let mut cmd = Command::new(QSTORE);
    cmd.args([
        "cluster",
        "--nodes",
        "3",
        "--protocol",
        "qstore",
        "--workload",
        "ycsb",
        "--records",
        "2000",
        "--txns",
        "3000",
        "--output",
        json.to_str().unwrap(),
    ]);
    let mut launcher = Proc::spawn("qstore cluster", &mut cmd, None);
    let launcher_pid = launcher.child.id();
    // Watch the launcher's children while it runs: one server process per node, each a
    // process of its own, alive from the start of the run to its end.
    let mut seen: Vec<(u32, Vec<String>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        for (pid, args) in children_of(launcher_pid) {
            // The latest command line: a child caught between fork and exec still shows
            // the launcher's, and an exited one (a zombie until reaped) shows none.
            match seen.iter_mut().find(|(p, _)| *p == pid) {
                Some(known) if !args.is_empty() => known.1 = args,
                Some(_) => {}
                None => seen.push((pid, args)),
            }
        }
        if let Some(status) = launcher.wait_for_exit(Duration::ZERO) {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "qstore cluster still running\n{}",
            launcher.output()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let log = launcher.output();
    assert!(status.success(), "{status}\n{log}");
    let server_of = |node: usize| {
        let node = node.to_string();
        seen.iter()
            .filter(|(_, args)| {
                args.get(1).is_some_and(|a| a == "server")
                    && args.windows(2).any(|w| w[0] == "--node" && w[1] == node)
            })
            .map(|(pid, _)| *pid)
            .collect::<Vec<_>>()
    };
    let servers: Vec<u32> = (0..3)
        .map(|n| match server_of(n).as_slice() {
            [pid] => *pid,
            other => panic!("node {n}: server processes {other:?}; saw {seen:?}\n{log}"),
        })
        .collect();
    let mut distinct = servers.clone();
    distinct.push(launcher_pid);
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "one process per server: {servers:?}");
    for (node, pid) in servers.iter().enumerate() {
        let ready = format!("[node {node}] qstore server: node {node} ready");
        assert!(log.contains(&ready), "missing {ready:?}\n{log}");
        // Stopped and reaped: no server outlives the launcher.
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "server {node} (pid {pid}) still exists"
        );
    }
    let r = read_json(&json);
    assert!(r["committed"].as_u64().unwrap() >= 3000, "{r}");
    assert_eq!(r["protocol"], "qstore", "{r}");
    let per_frame = r["msgs_per_frame"].as_f64();
    assert!(
        per_frame.is_some_and(|m| m >= 1.0),
        "messages went between the processes in frames: msgs_per_frame = {}",
        r["msgs_per_frame"]
    );
    // The servers' stage totals reach the report: means, no percentiles.
    let stages = r["stages"]
        .as_array()
        .unwrap_or_else(|| panic!("no stages: {r}"));
    let planning = stages.iter().find(|s| s["stage"] == "planning").unwrap();
    assert!(planning["txns"].as_u64().unwrap() > 0, "{planning}");
    assert!(planning["mean_us"].as_f64().unwrap() > 0.0, "{planning}");
    assert!(planning["p50_us"].is_null(), "{planning}");
    // And where each server's workers spent their time (an idle Q-Store node runs
    // transactions on the thread that receives them, so the workers may have had little
    // to do in so short a run).
    let workers = &r["worker_time"];
    let shares = workers["pct"]
        .as_object()
        .unwrap_or_else(|| panic!("{workers}"));
    let total: f64 = shares.values().filter_map(|p| p.as_f64()).sum();
    assert!((total - 100.0).abs() < 1e-6, "{workers}");
    let nodes = workers["per_node"].as_array().map(Vec::len);
    assert_eq!(nodes, Some(3), "{workers}");
}

#[test]
fn killing_a_server_gives_client_errors_not_a_hang() {
    // Half the transactions span two nodes, so clients of every node have work on node 1.
    let mut cluster = Cluster::start("kill", 3, "multi_partition_fraction = 0.5\nops_per_txn = 4");
    let mut client = cluster.committing_client(&["--duration", "30"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(client.running(), "{}", client.output());
    cluster.servers[1].child.kill().unwrap();
    let killed = Instant::now();
    cluster.servers[1].child.wait().unwrap();
    // The run is 30 s long; losing node 1 must end it much sooner: the failed connection
    // answers its transactions, and the drain (3 s in the cluster file) bounds the rest.
    let status = client
        .wait_for_exit(Duration::from_secs(15))
        .unwrap_or_else(|| {
            panic!(
                "the client still runs 15 s after node 1 died\n{}",
                client.output()
            )
        });
    let took = killed.elapsed();
    let err = client.stderr.text();
    assert!(
        !status.success(),
        "the client reports the failure: {status}\n{err}"
    );
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("connection to node 1 lost"), "{err}");
    assert!(
        took < Duration::from_secs(10),
        "client exit took {took:?} after the kill"
    );
    // The surviving nodes are still up: losing a peer does not take them down.
    for node in [0, 2] {
        let s = &mut cluster.servers[node];
        assert!(
            s.running(),
            "server {node} died with node 1\n{}",
            s.output()
        );
    }
    // And they say why they take no new work, instead of leaving a client waiting.
    let ycsb = ycsb_proc(&cluster);
    let mut c = RawClient::connect(&cluster, 0);
    match c.call(ycsb_call(ycsb, 3, 1)) {
        TxnOutcome::Rejected(why) => assert!(why.contains("peer node 1 is down"), "{why}"),
        other => panic!("a node missing a peer must refuse new work, got {other:?}"),
    }
}

#[test]
fn garbage_on_the_client_port_does_not_stop_the_server() {
    let mut cluster = Cluster::start("garbage", 2, "");
    let id = cluster.cluster_id;
    let ycsb = ycsb_proc(&cluster);
    let valid = frame_of(&[hello(id)]);
    for node in 0..2 {
        let addr = cluster.client_addr(node);
        let at = |what: &str| format!("client port of node {node}: {what}");

        // Bytes that are no frame at all.
        let mut s = connect(addr);
        let junk: Vec<u8> = (0..512u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        s.write_all(&junk).unwrap();
        assert_closed_by_server(&mut s, &at("garbage"));

        // A valid header announcing a frame far larger than the limit.
        let mut s = connect(addr);
        let mut header = valid[..4].to_vec();
        header.extend_from_slice(&u32::MAX.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        s.write_all(&header).unwrap();
        assert_closed_by_server(&mut s, &at("huge length"));

        // A frame cut short, then the end of the stream.
        let mut s = connect(addr);
        s.write_all(&valid[..valid.len() - 3]).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        assert_closed_by_server(&mut s, &at("truncated frame"));

        // A complete frame whose checksum does not match.
        let mut s = connect(addr);
        let mut bad = valid.clone();
        bad[8] ^= 0x5a;
        s.write_all(&bad).unwrap();
        assert_closed_by_server(&mut s, &at("bad checksum"));

        // A well-formed frame whose payload is not a request.
        let mut s = connect(addr);
        s.write_all(&frame_of(&[0xffu8, 0xff, 0xff])).unwrap();
        assert_closed_by_server(&mut s, &at("undecodable payload"));

        // A valid hello from another cluster: refused with the reason. (That the server then
        // closes the connection is `refused_and_finished_client_connections_are_released`.)
        let mut s = connect(addr);
        s.write_all(&frame_of(&[hello(id ^ 1)])).unwrap();
        match read_msgs::<ClientResponse>(&mut s, &at("wrong cluster id")).as_slice() {
            [ClientResponse::Refused(why)] => assert!(why.contains("cluster id"), "{why}"),
            other => panic!("{}: {other:?}", at("wrong cluster id")),
        }

        // Another protocol version: refused too.
        let mut s = connect(addr);
        let old = ClientRequest::Hello {
            cluster_id: id,
            format_version: CLIENT_FORMAT_VERSION + 1,
            nonce: [0; 32],
        };
        s.write_all(&frame_of(&[old])).unwrap();
        match read_msgs::<ClientResponse>(&mut s, &at("wrong version")).as_slice() {
            [ClientResponse::Refused(why)] => assert!(why.contains("version"), "{why}"),
            other => panic!("{}: {other:?}", at("wrong version")),
        }

        // A request before the hello: refused, not run.
        let mut s = connect(addr);
        let submit = ClientRequest::Submit {
            id: 1,
            call: ycsb_call(ycsb, 0, 1),
            birth_us: 0,
            key: Default::default(),
        };
        s.write_all(&frame_of(&[submit])).unwrap();
        match read_msgs::<ClientResponse>(&mut s, &at("submit before hello")).as_slice() {
            [ClientResponse::Refused(why)] => assert!(why.contains("Hello"), "{why}"),
            other => panic!("{}: {other:?}", at("submit before hello")),
        }
    }
    // Neither early submit ran: the row they would have incremented is untouched.
    let mut c = RawClient::connect(&cluster, 1);
    assert_eq!(
        committed_value(c.call(ycsb_call(ycsb, 0, 0))),
        Value::Int(0)
    );
    drop(c);
    cluster.run_client_to_completion(500, "after client-port garbage");

    // The peer port: only other nodes of the cluster may talk there.
    let addr = cluster.peer_addr(0);
    // Opened first and checked last: a connection that never introduces itself is closed
    // after the handshake timeout.
    let mut silent = connect(addr);
    let mut s = connect(addr);
    s.write_all(&[0x42; 300]).unwrap();
    assert_closed_by_server(&mut s, "peer port: garbage");

    let mut s = connect(addr);
    let mut header = valid[..4].to_vec();
    header.extend_from_slice(&u32::MAX.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    s.write_all(&header).unwrap();
    assert_closed_by_server(&mut s, "peer port: huge length");

    let mut s = connect(addr);
    s.write_all(&valid[..valid.len() - 2]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_closed_by_server(&mut s, "peer port: truncated frame");

    // A client's hello is not a peer's.
    let mut s = connect(addr);
    s.write_all(&valid).unwrap();
    assert_closed_by_server(&mut s, "peer port: client hello");

    // A peer of another cluster is refused with the reason.
    let stranger = PeerHello {
        cluster_id: id ^ 1,
        node: 1,
        protocol: "qstore".into(),
        format_version: WIRE_FORMAT_VERSION,
        incarnation: 1,
        nonce: [0; 32],
    };
    let mut s = connect(addr);
    s.write_all(&frame_of(&[stranger])).unwrap();
    match read_msgs::<PeerReply>(&mut s, "peer port: other cluster").as_slice() {
        [PeerReply::Refuse(why)] => assert!(why.contains("cluster id"), "{why}"),
        other => panic!("peer port: other cluster: {other:?}"),
    }
    assert_closed_by_server(&mut s, "peer port: other cluster");

    // A node id outside the cluster is refused.
    let outsider = PeerHello {
        cluster_id: id,
        node: 7,
        protocol: "qstore".into(),
        format_version: WIRE_FORMAT_VERSION,
        incarnation: 1,
        nonce: [0; 32],
    };
    let mut s = connect(addr);
    s.write_all(&frame_of(&[outsider])).unwrap();
    match read_msgs::<PeerReply>(&mut s, "peer port: node 7").as_slice() {
        [PeerReply::Refuse(why)] => assert!(why.contains("node id 7"), "{why}"),
        other => panic!("peer port: node 7: {other:?}"),
    }
    assert_closed_by_server(&mut s, "peer port: node 7");

    assert_closed_by_server(&mut silent, "peer port: silent connection");
    cluster.run_client_to_completion(500, "after peer-port garbage");
}

#[test]
fn unknown_procedure_gets_an_error_answer() {
    let cluster = Cluster::start("procs", 1, "");
    let ycsb = ycsb_proc(&cluster);
    let mut c = RawClient::connect(&cluster, 0);
    let rejected = |outcome: TxnOutcome| match outcome {
        TxnOutcome::Rejected(why) => why,
        other => panic!("expected a rejection, got {other:?}"),
    };

    let why = rejected(c.call(ProcCall {
        proc: ProcId(999),
        args: vec![Value::Int(1), Value::Int(0)],
    }));
    assert!(
        why.contains("unknown procedure") && why.contains("999"),
        "{why}"
    );

    let bad_args: [(Vec<Value>, &str); 3] = [
        (vec![Value::Int(1)], "one bytes argument"),
        (ycsb_call(ycsb, 1, 7).args, "op must be 0 (read) or 1 (rmw)"),
        (vec![Value::Bytes(vec![1])], "9 bytes per access"),
    ];
    for (args, expect) in bad_args {
        let why = rejected(c.call(ProcCall {
            proc: ycsb,
            args: args.clone(),
        }));
        assert!(
            why.contains("bad arguments for procedure ycsb_txn") && why.contains(expect),
            "{args:?}: {why}"
        );
    }

    // The connection still works: two read-modify-writes of one row commit, the second
    // seeing the first's increment.
    let Value::Int(before) = committed_value(c.call(ycsb_call(ycsb, 17, 1))) else {
        panic!("a counter is an integer")
    };
    assert_eq!(
        committed_value(c.call(ycsb_call(ycsb, 17, 1))),
        Value::Int(before + 1)
    );
}

// ---------------------------------------------------------------------------------------
// Bugs these tests found, kept as regressions.

/// Refused client connections must be closed (the protocol says "refused (and closes)"), and
/// connections a client has closed must release their socket. The endpoint once kept a copy
/// of every accepted socket until the server stopped, so refused clients never saw the end
/// of the connection and every finished session leaked a descriptor (CLOSE-WAIT).
#[test]
fn refused_and_finished_client_connections_are_released() {
    let cluster = Cluster::start("release", 1, "");
    let addr = cluster.client_addr(0);
    let pid = cluster.servers[0].child.id();
    let open_fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let mut problems = Vec::new();

    let mut s = connect(addr);
    s.write_all(&frame_of(&[hello(cluster.cluster_id ^ 1)]))
        .unwrap();
    let refused = read_msgs::<ClientResponse>(&mut s, "wrong cluster id");
    assert!(matches!(refused.as_slice(), [ClientResponse::Refused(_)]));
    if let Err(e) = closed_by_server(&mut s) {
        problems.push(format!("refused hello: {e}"));
    }

    let mut s = connect(addr);
    let submit = ClientRequest::Submit {
        id: 1,
        call: ycsb_call(ycsb_proc(&cluster), 0, 0),
        birth_us: 0,
        key: Default::default(),
    };
    s.write_all(&frame_of(&[submit])).unwrap();
    let refused = read_msgs::<ClientResponse>(&mut s, "submit before hello");
    assert!(matches!(refused.as_slice(), [ClientResponse::Refused(_)]));
    if let Err(e) = closed_by_server(&mut s) {
        problems.push(format!("submit before hello: {e}"));
    }

    drop(RawClient::connect(&cluster, 0));
    std::thread::sleep(Duration::from_millis(200));
    let before = open_fds();
    let sessions = 20;
    for _ in 0..sessions {
        drop(RawClient::connect(&cluster, 0));
    }
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    while open_fds() > before + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = open_fds();
    if after > before + 2 {
        problems.push(format!(
            "{sessions} finished sessions left the server with {after} open descriptors \
             (was {before})"
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A key the primary index cannot hold (its free-slot markers) must touch no row. Looking
/// up `u64::MAX` (a client's key -1) once matched the first empty slot and read and wrote
/// the partition's first row; programs with such keys are now refused and the index never
/// finds them.
#[test]
fn a_key_the_index_cannot_hold_touches_no_row() {
    let cluster = Cluster::start("badkey", 1, "");
    let ycsb = ycsb_proc(&cluster);
    let mut c = RawClient::connect(&cluster, 0);
    let first_row = committed_value(c.call(ycsb_call(ycsb, 0, 0)));
    // Any other absent key reads as nothing.
    assert_eq!(
        committed_value(c.call(ycsb_call(ycsb, 5000, 1))),
        Value::Null
    );
    // Key u64::MAX is reserved by the index: refused, and no other row touched.
    match c.call(ycsb_call(ycsb, u64::MAX, 1)) {
        TxnOutcome::Rejected(why) => assert!(why.contains("reserved"), "{why}"),
        other => panic!("a reserved key must be refused, got {other:?}"),
    }
    let first_row_after = committed_value(c.call(ycsb_call(ycsb, 0, 0)));
    assert_eq!(first_row_after, first_row, "key 0 after the refused write");
}

#[test]
fn a_frozen_server_fails_the_run_and_its_verification() {
    // A server that stops answering but keeps its connections open (SIGSTOP: a hung process,
    // not a dead one) leaves transactions unanswered: the client ends the run after its drain
    // and fails it, --verify included, whatever the part that committed looks like.
    let cluster = Cluster::start("frozen", 2, "multi_partition_fraction = 0.5");
    let mut client = cluster.committing_client(&["--duration", "2", "--verify"]);
    let pid = cluster.servers[1].child.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let status = client.wait_for_exit(Duration::from_secs(30));
    signal("-CONT");
    let status = status.unwrap_or_else(|| panic!("the client hangs\n{}", client.output()));
    let (out, err) = (client.stdout.text(), client.stderr.text());
    assert_eq!(status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains("transaction(s) unanswered"), "{err}");
    // Each one given up is named, to be followed in the servers' logs.
    assert!(err.contains("no answer to transaction"), "{err}");
}

/// TPC-C's procedures over a real server: malformed calls are refused with the reason, a
/// forged or stale OLLP guess aborts without touching a row, and the server keeps serving.
#[test]
fn malformed_and_forged_tpcc_calls_are_refused_and_change_nothing() {
    let cluster = Cluster::start_tpcc("tpcc-hostile", 1);
    let text = std::fs::read_to_string(&cluster.file).unwrap();
    let cfg = qstore_core::RunConfig::from_toml(&text).unwrap();
    let catalog = qstore_workload::build(&cfg).unwrap().catalog();
    let proc = |name| catalog.procedure_id(name).unwrap();
    let call = |name, args: &[i64]| ProcCall {
        proc: proc(name),
        args: args.iter().map(|&v| Value::Int(v)).collect(),
    };
    let mut c = RawClient::connect(&cluster, 0);
    // Delivery of warehouse 0, carrier 3, date 9: for each district, order 2101 undelivered,
    // customer 1, 5 lines, amount 100 (the shape the client builds from its reconnaissance).
    let delivery = |o: i64, ol_cnt: i64| {
        let mut args = vec![0, 3, 9];
        for _ in 0..10 {
            args.extend([o, 1, 1, ol_cnt, 100]);
        }
        args
    };
    let refused: [(ProcCall, &str); 7] = [
        (
            call("tpcc_delivery", &delivery(2101, 5)[..20]),
            "Delivery takes 53 arguments",
        ),
        (call("tpcc_delivery", &delivery(2101, 16)), "O_OL_CNT = 16"),
        (call("tpcc_delivery", &delivery(0, 5)), "O_ID = 0"),
        (
            call("tpcc_stock_level", &[0, 1, 15, 3001, 0]),
            "OL_I_ID = 0",
        ),
        (
            call("tpcc_stock_level_recon", &[0, 1, 21]),
            "threshold = 21",
        ),
        (
            call("tpcc_order_status", &[0, 1, 1, 1_000]),
            "C_LAST number = 1000",
        ),
        (call("tpcc_delivery_recon", &[1, 3, 9]), "W_ID = 1"),
    ];
    for (bad, expect) in refused {
        match c.call(bad.clone()) {
            TxnOutcome::Rejected(why) => assert!(why.contains(expect), "{bad:?}: {why}"),
            other => panic!("{bad:?}: expected a refusal, got {other:?}"),
        }
    }
    // A forged guess (order 1 was delivered at the load) fails the head check in every
    // district: an OLLP restart, and no row changes.
    match c.call(call("tpcc_delivery", &delivery(1, 5))) {
        TxnOutcome::LogicAbort(why) => assert!(why.contains("ollp restart"), "{why}"),
        other => panic!("a forged Delivery guess: {other:?}"),
    }
    match c.call(call("tpcc_stock_level", &[0, 1, 15, 7, 1, 2])) {
        TxnOutcome::LogicAbort(why) => assert!(why.contains("ollp restart"), "{why}"),
        other => panic!("a stale Stock-Level guess: {other:?}"),
    }
    // Still serving: an Order-Status of customer 1 answers its balance and latest order.
    match c.call(call("tpcc_order_status", &[0, 1, 0, 1])) {
        TxnOutcome::Committed(out) => assert!(matches!(out[1], Value::Int(o) if o >= 1), "{out:?}"),
        other => panic!("Order-Status after the hostile calls: {other:?}"),
    }
}
