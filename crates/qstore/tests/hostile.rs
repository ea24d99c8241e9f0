//! Hostile clients and peers against real `qstore server` processes on loopback. Each case
//! first does what once wedged, crashed or fooled a server, checks the answer a careful server
//! gives, and then checks that the servers still serve a normal client run whose history is
//! serializable and whose data matches the serial oracle.

mod common;

use common::*;
use qstore_core::txn::{ProcCall, ProcId, TxnOutcome, Value};
use qstore_engine::net::WIRE_FORMAT_VERSION;
use qstore_engine::server::proto::{ClientRequest, ClientResponse};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A YCSB call over `accesses` (key, op) pairs: op 0 reads, op 1 read-modify-writes.
fn ycsb_calls(proc: ProcId, accesses: &[(u64, u8)]) -> ProcCall {
    ProcCall {
        proc,
        args: qstore_workload::ycsb::ycsb_args(accesses.iter().copied()),
    }
}

/// Raises this test process's open-file limit to its hard limit (a thousand sockets need
/// more than the usual soft limit of 1024).
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only access the struct passed, which lives on this
    // stack frame for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// A procedure call that yields a program with no accesses once stopped a whole Q-Store
/// cluster: it was never answered, and neither was anything after it.
#[test]
fn an_empty_program_is_answered_and_wedges_nothing() {
    let mut cluster = Cluster::start("empty", 2, "");
    let ycsb = ycsb_proc(&cluster);
    for node in 0..2 {
        let mut c = RawClient::connect(&cluster, node);
        let outcome = c.call(ycsb_calls(ycsb, &[]));
        assert!(
            matches!(outcome, TxnOutcome::Rejected(_) | TxnOutcome::Committed(_)),
            "node {node}: {outcome:?}"
        );
        // The node still answers the next request.
        assert!(matches!(
            c.call(ycsb_call(ycsb, node as u64 * 2000 + 1, 1)),
            TxnOutcome::Committed(_)
        ));
    }
    cluster.verified_run(500, "after empty programs");
}

/// A connection to the peer port that claims to be node 1 once replaced the real node 1's
/// link (losing what was in flight and wedging a Q-Store cluster). Now it must prove the
/// cluster secret, and fails.
#[test]
fn an_impersonating_peer_is_refused_and_the_real_link_survives() {
    let mut cluster = Cluster::start("impersonate", 2, "");
    for claimed in [0u32, 1] {
        let target = 1 - claimed as usize;
        let mut s = connect(cluster.peer_addr(target));
        let hello = PeerHello {
            cluster_id: cluster.cluster_id,
            node: claimed,
            protocol: "qstore".into(),
            format_version: WIRE_FORMAT_VERSION,
            incarnation: 1,
            nonce: [9; 32],
        };
        s.write_all(&frame_of(&[hello])).unwrap();
        match read_msgs::<PeerReply>(&mut s, "impostor's hello").as_slice() {
            [PeerReply::Accept { .. }] => {}
            other => panic!("node {target}: {other:?}"),
        }
        // A made-up proof.
        s.write_all(&frame_of(&[[0x42u8; 32]])).unwrap();
        match read_msgs::<PeerVerdict>(&mut s, "impostor's proof").as_slice() {
            [PeerVerdict::Refuse { reason, .. }] => {
                assert!(reason.contains("cannot prove"), "{reason}")
            }
            other => panic!("node {target} welcomed an impostor: {other:?}"),
        }
        assert_closed_by_server(&mut s, "impostor");
    }
    cluster.verified_run(1000, "after impostors");
    let logs = cluster.outputs();
    assert!(
        logs.contains("cannot prove"),
        "refusals are logged by default:\n{logs}"
    );
}

/// The client port once served anyone who knew the cluster id.
#[test]
fn a_client_without_the_secret_is_refused() {
    let mut cluster = Cluster::start("unauth", 1, "");
    let ycsb = ycsb_proc(&cluster);
    let addr = cluster.client_addr(0);

    // A hello answered by a challenge, then a made-up proof.
    let mut s = connect(addr);
    s.write_all(&frame_of(&[hello(cluster.cluster_id)]))
        .unwrap();
    match read_msgs::<ClientResponse>(&mut s, "hello").as_slice() {
        [ClientResponse::Challenge { .. }] => {}
        other => panic!("expected a challenge, got {other:?}"),
    }
    let forged = ClientRequest::Prove { proof: [1; 32] };
    s.write_all(&frame_of(&[forged])).unwrap();
    match read_msgs::<ClientResponse>(&mut s, "forged proof").as_slice() {
        [ClientResponse::Refused(why)] => assert!(why.contains("secret"), "{why}"),
        other => panic!("a forged proof was accepted: {other:?}"),
    }
    assert_closed_by_server(&mut s, "forged proof");

    // A submit after the hello, without proving anything: refused, not run.
    let mut s = connect(addr);
    let submit = ClientRequest::Submit {
        id: 1,
        call: ycsb_call(ycsb, 5, 1),
        birth_us: 0,
        key: Default::default(),
    };
    s.write_all(&frame_of(&[hello(cluster.cluster_id), submit]))
        .unwrap();
    let answers = read_msgs::<ClientResponse>(&mut s, "submit before proof");
    assert!(
        matches!(answers.as_slice(), [ClientResponse::Challenge { .. }, ClientResponse::Refused(why)] if why.contains("Prove")),
        "{answers:?}"
    );
    assert_closed_by_server(&mut s, "submit before proof");

    // A `qstore client` whose cluster file names another secret: refused, and says so.
    let other = cluster.dir.path("other.toml");
    let text = std::fs::read_to_string(&cluster.file)
        .unwrap()
        .replace("secret_file = \"secret\"", "secret_file = \"other.secret\"");
    std::fs::write(&other, text).unwrap();
    qstore_net::auth::ClusterSecret::create_file(&cluster.dir.path("other.secret")).unwrap();
    let mut cmd = std::process::Command::new(QSTORE);
    cmd.args(["client", "--cluster"])
        .arg(&other)
        .args(["--txns", "10"]);
    let o = run_with_timeout(cmd, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("cluster secret"), "{err}");

    // Nothing of that ran: key 5 was never written.
    let mut c = RawClient::connect(&cluster, 0);
    assert_eq!(
        committed_value(c.call(ycsb_call(ycsb, 5, 0))),
        Value::Int(0)
    );
    drop(c);
    cluster.verified_run(500, "after unauthenticated clients");
}

/// A node killed and restarted with the same cluster file once rejoined silently with
/// freshly loaded data, and the cluster never answered again.
#[test]
fn a_restarted_node_is_refused_and_clients_are_told_why() {
    let mut cluster = Cluster::start("restart", 2, "");
    let ycsb = ycsb_proc(&cluster);
    let mut c = RawClient::connect(&cluster, 0);
    // Multi-partition transactions in flight at node 0 when node 1 dies.
    let sent: Vec<u64> = (0..200)
        .map(|i| c.send(ycsb_calls(ycsb, &[(i % 2000, 1), (2000 + i % 2000, 1)])))
        .collect();
    cluster.servers[1].child.kill().unwrap();
    cluster.servers[1].wait_for_exit(Duration::from_secs(5));

    let restarted = Instant::now();
    let mut again = cluster.spawn_server(1, None);
    // The new process is refused by its peer, and gives up at once, saying why.
    let status = again
        .wait_for_exit(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("the restarted node kept waiting\n{}", again.output()));
    assert!(!status.success());
    assert!(again.output().contains("restarted"), "{}", again.output());
    assert!(restarted.elapsed() < Duration::from_secs(15));

    // Every transaction in flight is answered; those that did not commit say why: node 1 was
    // lost (when node 0 noticed the dead connection first) or it restarted.
    let mut answered = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while answered.len() < sent.len() && Instant::now() < deadline {
        for (id, outcome) in c.answers().unwrap_or_default() {
            if let TxnOutcome::Rejected(why) = &outcome {
                let said = why.contains("restart") || why.contains("is down");
                assert!(why.contains("node 1") && said, "{why}");
            }
            answered.insert(id);
        }
    }
    assert_eq!(answered.len(), sent.len(), "transactions left unanswered");

    // New transactions are refused with the reason, on a new connection too.
    let mut c = RawClient::connect(&cluster, 0);
    match c.call(ycsb_call(ycsb, 7, 1)) {
        TxnOutcome::Rejected(why) => assert!(
            why.contains("node 1 restarted") && why.contains("restart the cluster"),
            "{why}"
        ),
        other => panic!("a node whose peer lost its data took new work: {other:?}"),
    }
    assert!(cluster.servers[0].running(), "node 0 stays up to say so");
}

/// Each idle client connection once took two threads and about 1.2 MB.
#[test]
fn a_thousand_idle_connections_cost_no_threads() {
    raise_fd_limit();
    let mut cluster = Cluster::start("idle", 1, "");
    let (threads_before, _) = cluster.server_usage(0);
    let idle: Vec<RawClient> = (0..1000).map(|_| RawClient::connect(&cluster, 0)).collect();
    let (threads, rss_kib) = cluster.server_usage(0);
    eprintln!("1000 idle clients: {threads} threads (was {threads_before}), {rss_kib} KiB RSS");
    assert!(
        threads <= threads_before + 2,
        "{threads} threads with 1000 idle clients (was {threads_before})"
    );
    assert!(rss_kib < 256 << 10, "{rss_kib} KiB with 1000 idle clients");
    cluster.verified_run(1000, "with 1000 idle connections open");
    drop(idle);
}

/// Connections beyond `server.max_clients` are refused with the reason; a freed place is
/// taken again.
#[test]
fn connections_over_the_limit_are_refused_with_the_reason() {
    let mut cluster = Cluster::start_with(
        "limit",
        1,
        "",
        "[server]\nmax_clients = 3\nhandshake_timeout_s = 1.0\n",
    );
    let mut held: Vec<RawClient> = (0..3).map(|_| RawClient::connect(&cluster, 0)).collect();
    match RawClient::try_connect(&cluster, 0) {
        Err(why) => assert!(why.contains("max_clients"), "{why}"),
        Ok(_) => panic!("a fourth client was served over max_clients = 3"),
    }
    held.pop();
    // The place is freed once the server notices the close.
    let deadline = Instant::now() + Duration::from_secs(5);
    let c = loop {
        match RawClient::try_connect(&cluster, 0) {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("a freed place was not taken again: {e}"),
        }
    };
    drop((c, held));
    std::thread::sleep(Duration::from_millis(300));
    cluster.verified_run(300, "after the limit");
}

/// A sender at one byte per interval once held a connection (and its threads) forever; an
/// idle client is closed after the idle timeout, told why.
#[test]
fn slow_and_idle_clients_are_cut_off() {
    let mut cluster = Cluster::start_with(
        "slow",
        1,
        "",
        "[server]\nhandshake_timeout_s = 1.0\nclient_idle_timeout_s = 1.0\n",
    );
    let addr = cluster.client_addr(0);
    let hello = frame_of(&[hello(cluster.cluster_id)]);
    let mut slow = connect(addr);
    let opened = Instant::now();
    let mut cut = false;
    for b in hello.iter().cycle().take(60) {
        std::thread::sleep(Duration::from_millis(100));
        if slow.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        if opened.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    if !cut {
        assert_closed_by_server(&mut slow, "slow sender");
    }
    assert!(
        opened.elapsed() < Duration::from_secs(5),
        "{:?}",
        opened.elapsed()
    );

    // Authenticated, then silent: closed after the idle timeout, with the reason.
    let mut idle = RawClient::connect(&cluster, 0);
    idle.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    match read_msgs::<ClientResponse>(&mut idle.stream, "idle client").as_slice() {
        [ClientResponse::Refused(why)] => assert!(why.contains("idle"), "{why}"),
        other => panic!("idle client: {other:?}"),
    }
    assert_closed_by_server(&mut idle.stream, "idle client");
    cluster.verified_run(300, "after slow and idle clients");
}

/// `Collect` once emptied the servers' history, so a second verified client run reported
/// anomalies and an oracle mismatch.
#[test]
fn every_verified_client_run_sees_the_whole_history() {
    let mut cluster = Cluster::start("collect", 2, "multi_partition_fraction = 0.5");
    cluster.verified_run(500, "first run");
    cluster.verified_run(500, "second run");
    cluster.verified_run(500, "third run");
}

/// A small deterministic generator for the frame fuzzer.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Up to `max` random bytes (at least `min`).
    fn bytes(&mut self, min: u64, max: u64) -> Vec<u8> {
        let n = min + self.below(max - min + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// One generated request: mostly well-formed, with arguments of every shape.
fn random_request(rng: &mut XorShift, cluster_id: u64, ycsb: ProcId) -> ClientRequest {
    match rng.below(8) {
        0 => hello(cluster_id ^ rng.below(2)),
        1 => ClientRequest::Prove {
            proof: rng.bytes(32, 32).try_into().unwrap(),
        },
        2 => ClientRequest::Stats,
        3 => ClientRequest::Submit {
            id: rng.next(),
            call: ProcCall {
                proc: ProcId(rng.below(4) as u16),
                args: (0..rng.below(4))
                    .map(|_| match rng.below(3) {
                        0 => Value::Null,
                        1 => Value::Int(rng.next() as i64),
                        _ => Value::Bytes(rng.bytes(0, 40)),
                    })
                    .collect(),
            },
            birth_us: rng.next(),
            key: qstore_core::txn::TxnKey {
                session: rng.next(),
                seq: rng.next(),
            },
        },
        _ => {
            let n = rng.below(5) as usize;
            let accesses: Vec<(u64, u8)> = (0..n)
                .map(|_| (rng.below(4100), rng.below(3) as u8))
                .collect();
            ClientRequest::Submit {
                id: rng.next(),
                call: ycsb_calls(ycsb, &accesses),
                birth_us: 0,
                key: Default::default(),
            }
        }
    }
}

/// Mangles a frame the way a broken or hostile sender might.
fn mangle(rng: &mut XorShift, mut frame: Vec<u8>) -> Vec<u8> {
    match rng.below(6) {
        0 => {
            let i = rng.below(frame.len() as u64) as usize;
            frame[i] ^= 1 << rng.below(8);
        }
        1 => frame.truncate(rng.below(frame.len() as u64) as usize),
        2 => frame[4..8].copy_from_slice(&(rng.next() as u32).to_le_bytes()),
        3 => frame = rng.bytes(1, 200),
        4 => frame.extend(rng.bytes(1, 20)),
        _ => {} // left valid
    }
    frame
}

/// Thousands of generated frames, valid-looking and not, before and after a real handshake,
/// bounded in count and time; then a normal verified run.
#[test]
fn thousands_of_generated_frames_leave_the_server_serving() {
    let mut cluster = Cluster::start("fuzz", 2, "");
    let ycsb = ycsb_proc(&cluster);
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let started = Instant::now();
    let (mut frames, mut connections) = (0u64, 0u64);
    while frames < 5000 && started.elapsed() < Duration::from_secs(30) {
        let node = rng.below(2) as usize;
        connections += 1;
        // Half the connections authenticate first, so requests reach the engine.
        let mut stream: TcpStream = if rng.below(2) == 0 {
            RawClient::connect(&cluster, node).stream
        } else {
            connect(cluster.client_addr(node))
        };
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        for _ in 0..rng.below(20) + 1 {
            let reqs: Vec<ClientRequest> = (0..rng.below(4) + 1)
                .map(|_| random_request(&mut rng, cluster.cluster_id, ycsb))
                .collect();
            let bytes = mangle(&mut rng, frame_of(&reqs));
            frames += 1;
            if stream.write_all(&bytes).is_err() {
                break; // the server closed it: the expected answer to garbage
            }
        }
        // Read whatever comes back, briefly; the server may answer, refuse or close.
        let mut sink = [0u8; 4096];
        let _ = stream.read(&mut sink);
    }
    eprintln!(
        "{frames} frames on {connections} connections in {:?}",
        started.elapsed()
    );
    assert!(frames >= 1000, "only {frames} frames were sent");
    for (node, s) in cluster.servers.iter_mut().enumerate() {
        assert!(s.running(), "server {node} died\n{}", s.output());
    }
    cluster.verified_run(1000, "after generated frames");
}

/// A server waiting for its peers once ignored SIGTERM until its connect timeout (20 s here)
/// ran out.
#[test]
fn a_server_waiting_for_its_peers_stops_at_once_on_sigterm() {
    let cluster = Cluster::start("sigterm", 1, "");
    // A two-node cluster file whose node 1 never starts.
    let two = cluster.dir.path("two.toml");
    let addrs = free_addresses(2);
    let entries: Vec<String> = addrs
        .iter()
        .map(|(p, c)| format!("{{ peer = \"{p}\", client = \"{c}\" }}"))
        .collect();
    let text = std::fs::read_to_string(&cluster.file).unwrap();
    let text = text
        .lines()
        .map(|l| match l {
            l if l.starts_with("nodes =") => "nodes = 2".to_string(),
            l if l.starts_with("addresses =") => format!("addresses = [{}]", entries.join(", ")),
            l => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&two, text).unwrap();
    let mut cmd = std::process::Command::new(QSTORE);
    cmd.args(["server", "--cluster"])
        .arg(&two)
        .args(["--node", "0"]);
    let mut server = Proc::spawn("waiting server", &mut cmd, None);
    // Let it load and start waiting for node 1.
    let waiting = Instant::now() + Duration::from_secs(10);
    while !server.output().contains("connecting to 1 peer") && Instant::now() < waiting {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let pid = server.child.id() as libc::pid_t;
    // SAFETY: kill(2) reads or writes no memory of this process; the child is not reaped
    // (it is still running), so the pid names it.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let asked = Instant::now();
    let status = server
        .wait_for_exit(Duration::from_secs(5))
        .unwrap_or_else(|| {
            panic!(
                "SIGTERM ignored while waiting for peers\n{}",
                server.output()
            )
        });
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert!(status.success(), "{status}\n{}", server.output());
    assert!(
        server.output().contains("stopped while waiting for peers"),
        "{}",
        server.output()
    );
}
