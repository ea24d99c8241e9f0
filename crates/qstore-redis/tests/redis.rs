//! The Redis port against real Redis: the same commands sent to a `redis-server` started
//! here and to qstore's port must get the same reply bytes (the oracle test), the real
//! `redis-cli` must work unchanged, and concurrent MULTI/EXEC transfers must keep their sum.
//!
//! Needs `redis-server` and `redis-cli` (Debian's `redis-server` and `redis-tools`, which
//! `scripts/setup.sh` installs).

use qstore_core::{PartitionId, RunConfig};
use qstore_engine::server::TxnIds;
use qstore_engine::Cluster;
use qstore_net::auth::ClusterSecret;
use qstore_redis::{password_for, Auth, Backend, Limits, RedisServer};
use qstore_workload::kv::Kv;
use qstore_workload::Workload;
use redis_protocol::resp2::decode::decode;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"a cluster secret for the redis tests, long enough";

struct Qstore {
    server: RedisServer,
    cluster: Arc<Cluster>,
    password: String,
}

impl Drop for Qstore {
    fn drop(&mut self) {
        self.server.stop();
        self.cluster.shutdown();
    }
}

fn qstore(protocol: &str, nodes: u32) -> Qstore {
    qstore_with(protocol, nodes, Limits::default())
}

fn qstore_with(protocol: &str, nodes: u32, limits: Limits) -> Qstore {
    qstore_buckets(protocol, nodes, limits, 512)
}

fn qstore_buckets(protocol: &str, nodes: u32, limits: Limits, buckets: u64) -> Qstore {
    let mut cfg = RunConfig::default();
    cfg.protocol.name = protocol.into();
    cfg.workload.name = "kv".into();
    cfg.cluster.nodes = nodes;
    cfg.workload.kv.buckets_per_partition = buckets;
    let kv = Kv::new(&cfg).unwrap();
    let cluster = Cluster::start(
        cfg,
        kv.catalog(),
        kv.partition_map().clone(),
        &|p: PartitionId, loader| kv.load(p, loader),
        false,
    )
    .unwrap();
    let cluster = Arc::new(cluster);
    let secret = ClusterSecret::from_material(SECRET).unwrap();
    let password = password_for(&secret);
    let me = qstore_core::NodeId(0);
    let backend = Backend {
        ids: Arc::new(TxnIds::new(&cluster, me)),
        cluster: cluster.clone(),
        kv,
        me,
        health: None,
        auth: Auth::Secret(secret),
        limits,
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = RedisServer::start(listener, backend).unwrap();
    Qstore {
        server,
        cluster,
        password,
    }
}

/// A real redis-server on a free loopback port, with `password`, stopped on drop.
struct RealRedis {
    child: Child,
    port: u16,
}

impl Drop for RealRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn real_redis(password: &str) -> RealRedis {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--requirepass",
            password,
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (Debian's redis-server package; scripts/setup.sh installs it)");
    let began = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    RealRedis { child, port }
}

/// A raw RESP connection: sends a request, returns the reply's exact bytes.
struct Raw(TcpStream, Vec<u8>);

impl Raw {
    fn connect(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Raw(s, Vec::new())
    }

    fn send_bytes(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.0.write_all(bytes).unwrap();
        self.reply()
    }

    fn cmd(&mut self, args: &[&str]) -> Vec<u8> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.send_bytes(&req)
    }

    fn reply(&mut self) -> Vec<u8> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Ok(Some((_, n))) = decode(&self.1) {
                return self.1.drain(..n).collect();
            }
            match self.0.read(&mut chunk) {
                Ok(0) | Err(_) => return std::mem::take(&mut self.1),
                Ok(n) => self.1.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

/// The script both servers run: (connection, command) pairs; connection 1 interleaves with
/// connection 0 where WATCH needs another client.
fn script(password: &str) -> Vec<(usize, Vec<String>)> {
    let lines = [
        "0 GET a",
        "0 AUTH wrong",
        "0 AUTH default wrong",
        &format!("0 AUTH {password}"),
        &format!("1 AUTH default {password}"),
        "0 DBSIZE",
        "0 PING",
        "0 PING hi",
        "0 PING a b",
        "0 ECHO x",
        "0 GET a",
        "0 SET a 1",
        "0 GET a",
        "0 SET a 2 NX",
        "0 SET a 3 XX",
        "0 GET a",
        "0 SET b 1 XX",
        "0 SET b 1 NX",
        "0 SET a b NX XX",
        "0 SET a b FOO",
        "0 INCR a",
        "0 INCRBY a 10",
        "0 DECR a",
        "0 DECRBY a 5",
        "0 INCRBY a x",
        "0 INCRBY a 9223372036854775807",
        "0 SET s abc",
        "0 INCR s",
        "0 SET z 007",
        "0 INCR z",
        "0 APPEND a xyz",
        "0 STRLEN a",
        "0 STRLEN nokey",
        "0 APPEND new hi",
        "0 GET new",
        "0 DEL a b nokey",
        "0 EXISTS a b s s new",
        "0 MSET k1 v1 k2 v2",
        "0 MGET k1 nokey k2",
        "0 DBSIZE",
        "0 DBSIZE x",
        "0 MSET k1",
        "0 GET",
        "0 FOO bar baz",
        "0 MULTI",
        "0 SET t 1",
        "0 INCR t",
        "0 GET t",
        "0 EXEC",
        "0 MULTI",
        "0 SET t 5",
        "0 FOO",
        "0 EXEC",
        "0 GET t",
        "0 EXEC",
        "0 DISCARD",
        "0 MULTI",
        "0 MULTI",
        "0 WATCH t",
        "0 DISCARD",
        "0 WATCH w",
        "0 SET w mine",
        "0 MULTI",
        "0 SET w 2",
        "0 EXEC",
        "0 GET w",
        "0 WATCH w",
        "1 SET w theirs",
        "0 MULTI",
        "0 SET w 3",
        "0 EXEC",
        "0 GET w",
        "0 WATCH w",
        "0 MULTI",
        "0 GET w",
        "0 PING",
        "0 EXEC",
        "0 WATCH w",
        "0 UNWATCH",
        "1 SET w again",
        "0 MULTI",
        "0 GET w",
        "0 EXEC",
        "0 MULTI",
        "0 INCR s",
        "0 SET u 1",
        "0 EXEC",
        "0 GET u",
        "0 MULTI",
        "0 EXEC",
        "0 MULTI",
        "0 SET q 1",
        "0 SET q 2 FOO",
        "0 INCRBY q x",
        "0 PING a b",
        "0 INCR q",
        "0 EXEC",
        "0 WATCH q q",
        "0 MULTI",
        "0 GET q",
        "0 EXEC",
        "0 SELECT 0",
        "0 SELECT x",
        "0 CLIENT SETNAME app",
        "0 CLIENT GETNAME",
        "0 CLIENT SETNAME a b",
        "1 DBSIZE",
        "0 QUIT",
    ];
    lines
        .iter()
        .map(|l| {
            let (c, cmd) = l.split_once(' ').unwrap();
            (
                c.parse().unwrap(),
                cmd.split(' ').map(String::from).collect(),
            )
        })
        .collect()
}

fn run_script(port: u16, password: &str) -> Vec<String> {
    let mut conns = [Raw::connect(port), Raw::connect(port)];
    script(password)
        .into_iter()
        .map(|(c, args)| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let reply = conns[c].cmd(&args);
            format!(
                "{} -> {}",
                args.join(" "),
                String::from_utf8_lossy(&reply).escape_debug()
            )
        })
        .collect()
}

fn oracle(protocol: &str) {
    let q = qstore(protocol, 2);
    let real = real_redis(&q.password);
    let expected = run_script(real.port, &q.password);
    let got = run_script(q.server.local_addr().port(), &q.password);
    let mut diffs = Vec::new();
    for (e, g) in expected.iter().zip(&got) {
        if e != g {
            diffs.push(format!("redis:  {e}\nqstore: {g}"));
        }
    }
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    assert_eq!(expected.len(), got.len());
}

#[test]
fn replies_match_redis_byte_for_byte_on_qstore() {
    oracle("qstore");
}

#[test]
fn replies_match_redis_byte_for_byte_on_no_wait() {
    oracle("no_wait");
}

#[test]
fn hostile_requests_get_redis_errors_and_the_port_keeps_serving() {
    let q = qstore("qstore", 1);
    let real = real_redis(&q.password);
    // Counts are read as Redis reads them: no plus sign, no leading zeros.
    let bad_counts: [(&[u8], &str); 5] = [
        (b"*99999999999\r\n", "multibulk"),
        (b"*05\r\n", "multibulk"),
        (b"*+1\r\n", "multibulk"),
        (b"*1\r\n$03\r\nabc\r\n", "bulk"),
        (b"*1\r\n$-1\r\n", "bulk"),
    ];
    for port in [real.port, q.server.local_addr().port()] {
        for (request, what) in bad_counts {
            let mut c = Raw::connect(port);
            assert_eq!(c.cmd(&["AUTH", &q.password]), b"+OK\r\n");
            let reply = c.send_bytes(request);
            assert_eq!(
                String::from_utf8_lossy(&reply),
                format!("-ERR Protocol error: invalid {what} length\r\n"),
                "port {port}, {}",
                String::from_utf8_lossy(request)
            );
        }
    }
    // Deep nesting, before AUTH: refused at once, and the process lives on.
    let mut deep = Raw::connect(q.server.local_addr().port());
    let reply = deep.send_bytes(&b"*1\r\n".repeat(4000));
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "-ERR Protocol error: expected '$', got '*'\r\n"
    );
    // Garbage, an unauthenticated client, and a half request that never ends: the port
    // answers the next client as before.
    let port = q.server.local_addr().port();
    let mut g = Raw::connect(port);
    g.send_bytes(b"*1\r\n:5\r\n");
    let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
    half.write_all(b"*2\r\n$3\r\nGET\r\n$100000\r\nabc")
        .unwrap();
    let mut c = Raw::connect(port);
    assert_eq!(
        c.cmd(&["GET", "a"]),
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(c.cmd(&["AUTH", &q.password]), b"+OK\r\n");
    assert_eq!(c.cmd(&["SET", "a", "1"]), b"+OK\r\n");
    let big = "x".repeat(2000);
    let reply = String::from_utf8(c.cmd(&["SET", "big", &big])).unwrap();
    assert!(
        reply.starts_with("-ERR key and value are 2003 bytes"),
        "{reply}"
    );
    assert_eq!(c.cmd(&["GET", "a"]), b"$1\r\n1\r\n");
}

#[test]
fn hello_3_switches_to_resp3() {
    let q = qstore("qstore", 1);
    let mut c = Raw::connect(q.server.local_addr().port());
    let reply = c.cmd(&["HELLO", "3"]);
    assert!(
        reply.starts_with(b"-NOAUTH HELLO must be called"),
        "{reply:?}"
    );
    let reply = c.cmd(&["HELLO", "3", "AUTH", "default", &q.password]);
    assert!(
        reply.starts_with(b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n"),
        "{reply:?}"
    );
    assert_eq!(c.cmd(&["GET", "nokey"]), b"_\r\n");
}

#[test]
fn redis_cli_works_unchanged() {
    let q = qstore("qstore", 2);
    let port = q.server.local_addr().port().to_string();
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-p", &port, "-a", &q.password, "--no-auth-warning"])
            .args(args)
            .output()
            .expect("redis-cli (Debian's redis-tools; scripts/setup.sh installs it)");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(cli(&["SET", "greeting", "hello world"]), "OK\n");
    assert_eq!(cli(&["GET", "greeting"]), "hello world\n");
    assert_eq!(cli(&["INCRBY", "n", "41"]), "41\n");
    assert_eq!(
        cli(&["MGET", "greeting", "n", "none"]),
        "hello world\n41\n\n"
    );
    assert_eq!(cli(&["PING"]), "PONG\n");
}

/// Transfers between accounts in MULTI/EXEC (read balances under WATCH, write both) while
/// auditors MGET every account: the total never changes, on every protocol tried.
fn transfers_keep_the_sum(protocol: &str, event_loops: usize) {
    const ACCOUNTS: usize = 8;
    const START: i64 = 100;
    let limits = Limits {
        event_loops,
        ..Limits::default()
    };
    let q = qstore_with(protocol, 2, limits);
    let port = q.server.local_addr().port();
    let keys: Vec<String> = (0..ACCOUNTS).map(|i| format!("acct:{i}")).collect();
    let mut setup = Raw::connect(port);
    setup.cmd(&["AUTH", &q.password]);
    let mut mset = vec!["MSET".to_string()];
    for k in &keys {
        mset.extend([k.clone(), START.to_string()]);
    }
    let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
    assert_eq!(setup.cmd(&mset), b"+OK\r\n");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let transfers: Vec<_> = (0..4)
        .map(|t| {
            let (keys, password) = (keys.clone(), q.password.clone());
            std::thread::spawn(move || {
                let mut c = Raw::connect(port);
                c.cmd(&["AUTH", &password]);
                let mut done = 0;
                for i in 0..150usize {
                    let (a, b) = (
                        &keys[(t + i) % ACCOUNTS],
                        &keys[(t * 3 + i * 5 + 1) % ACCOUNTS],
                    );
                    if a == b {
                        continue;
                    }
                    c.cmd(&["WATCH", a, b]);
                    let balance = |c: &mut Raw, k: &str| -> i64 {
                        let r = c.cmd(&["GET", k]);
                        let text = String::from_utf8(r).unwrap();
                        text.lines().nth(1).unwrap().parse().unwrap()
                    };
                    let (x, y) = (balance(&mut c, a), balance(&mut c, b));
                    c.cmd(&["MULTI"]);
                    c.cmd(&["SET", a, &(x - 1).to_string()]);
                    c.cmd(&["SET", b, &(y + 1).to_string()]);
                    let r = c.cmd(&["EXEC"]);
                    if r.starts_with(b"*2\r\n") {
                        done += 1;
                    } else {
                        assert_eq!(r, b"*-1\r\n", "EXEC answered neither its replies nor nil");
                    }
                }
                done
            })
        })
        .collect();
    let audits: Vec<_> = (0..2)
        .map(|_| {
            let (keys, password, stop) = (keys.clone(), q.password.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut c = Raw::connect(port);
                c.cmd(&["AUTH", &password]);
                let mut args = vec!["MGET"];
                args.extend(keys.iter().map(String::as_str));
                let mut audits = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = String::from_utf8(c.cmd(&args)).unwrap();
                    let sum: i64 = r
                        .lines()
                        .skip(2)
                        .step_by(2)
                        .map(|v| v.parse::<i64>().unwrap())
                        .sum();
                    assert_eq!(
                        sum,
                        START * ACCOUNTS as i64,
                        "an MGET saw a transfer half done"
                    );
                    audits += 1;
                }
                audits
            })
        })
        .collect();
    let committed: usize = transfers.into_iter().map(|t| t.join().unwrap()).sum();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let audited: usize = audits.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(
        committed > 0 && audited > 0,
        "{committed} transfers, {audited} audits"
    );
    println!(
        "{protocol}, {event_loops} event loop(s): {committed} transfers committed, {audited} \
         audits, sum kept"
    );
}

#[test]
fn transfers_keep_the_sum_on_qstore() {
    transfers_keep_the_sum("qstore", 1);
}

/// The same with the port's connections spread over two event loops, which submit to the
/// engine concurrently.
#[test]
fn transfers_keep_the_sum_over_two_event_loops() {
    transfers_keep_the_sum("qstore", 2);
}

#[test]
fn transfers_keep_the_sum_on_calvin() {
    transfers_keep_the_sum("calvin", 1);
}

#[test]
fn transfers_keep_the_sum_on_occ() {
    transfers_keep_the_sum("occ", 1);
}

/// DBSIZE counts one state of the database: writers move a key of their own (DEL one name,
/// SET another, in MULTI) while DBSIZE is asked again and again; it sees each key once.
fn dbsize_sees_one_state(protocol: &str) {
    const WRITERS: usize = 3;
    let q = qstore(protocol, 2);
    let port = q.server.local_addr().port();
    let mut setup = Raw::connect(port);
    setup.cmd(&["AUTH", &q.password]);
    assert_eq!(setup.cmd(&["DBSIZE"]), b":0\r\n");
    for w in 0..WRITERS {
        assert_eq!(setup.cmd(&["SET", &format!("w{w}:0"), "x"]), b"+OK\r\n");
    }
    assert_eq!(setup.cmd(&["SET", "fixed", "y"]), b"+OK\r\n");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let password = q.password.clone();
            std::thread::spawn(move || {
                let mut c = Raw::connect(port);
                c.cmd(&["AUTH", &password]);
                for i in 0..200 {
                    let (from, to) = (format!("w{w}:{}", i % 2), format!("w{w}:{}", (i + 1) % 2));
                    c.cmd(&["MULTI"]);
                    c.cmd(&["DEL", &from]);
                    c.cmd(&["SET", &to, "x"]);
                    assert_eq!(c.cmd(&["EXEC"]), b"*2\r\n:1\r\n+OK\r\n");
                }
            })
        })
        .collect();
    let counter = {
        let (password, stop) = (q.password.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut c = Raw::connect(port);
            c.cmd(&["AUTH", &password]);
            let mut counts = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = String::from_utf8(c.cmd(&["DBSIZE"])).unwrap();
                assert_eq!(
                    r,
                    format!(":{}\r\n", WRITERS + 1),
                    "DBSIZE saw a move half done"
                );
                counts += 1;
            }
            counts
        })
    };
    writers.into_iter().for_each(|w| w.join().unwrap());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let counts = counter.join().unwrap();
    assert!(counts > 0, "DBSIZE never answered");
    assert_eq!(
        setup.cmd(&["DBSIZE"]),
        format!(":{}\r\n", WRITERS + 1).as_bytes()
    );
    println!("{protocol}: {counts} DBSIZE answers, every one whole");
}

#[test]
fn dbsize_sees_one_state_on_qstore() {
    dbsize_sees_one_state("qstore");
}

#[test]
fn dbsize_sees_one_state_on_no_wait() {
    dbsize_sees_one_state("no_wait");
}

/// DBSIZE is refused, with the reason, where its transaction would be too large, and when
/// queued in MULTI.
#[test]
fn dbsize_says_when_it_cannot_count() {
    let q = qstore_buckets("qstore", 2, Limits::default(), 40_000);
    let mut c = Raw::connect(q.server.local_addr().port());
    c.cmd(&["AUTH", &q.password]);
    let reply = String::from_utf8(c.cmd(&["DBSIZE"])).unwrap();
    assert!(
        reply.starts_with(
            "-ERR DBSIZE reads every bucket in one transaction, and this cluster has 80000 buckets"
        ),
        "{reply}"
    );
    assert_eq!(c.cmd(&["MULTI"]), b"+OK\r\n");
    let reply = String::from_utf8(c.cmd(&["DBSIZE"])).unwrap();
    assert!(reply.starts_with("-ERR only key commands"), "{reply}");
    assert!(c.cmd(&["EXEC"]).starts_with(b"-EXECABORT"));
    assert_eq!(c.cmd(&["SET", "a", "1"]), b"+OK\r\n");
}

/// Requests sent in one write (a pipeline): key commands that arrive together run as one
/// transaction here, and must still answer exactly as Redis does, in order.
#[test]
fn a_pipeline_answers_as_redis_does() {
    let q = qstore("qstore", 2);
    let real = real_redis(&q.password);
    let script = [
        vec!["AUTH", q.password.as_str()],
        vec!["SET", "p", "1"],
        vec!["INCR", "p"],
        vec!["GET", "p"],
        vec!["INCR", "p:s"],
        vec!["APPEND", "p:s", "x"],
        vec!["INCR", "p:s"],
        vec!["FOO"],
        vec!["MSET", "p:a", "1", "p:b", "2"],
        vec!["MGET", "p:a", "p:b", "p"],
        vec!["MULTI"],
        vec!["INCR", "p"],
        vec!["EXEC"],
        vec!["DEL", "p", "p:a", "nokey"],
        vec!["EXISTS", "p", "p:b"],
        vec!["PING"],
    ];
    let mut req = Vec::new();
    for args in &script {
        req.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            req.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
    }
    let replies = |port| {
        let mut c = Raw::connect(port);
        c.0.write_all(&req).unwrap();
        (0..script.len())
            .map(|_| String::from_utf8_lossy(&c.reply()).into_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(replies(q.server.local_addr().port()), replies(real.port));
}

#[test]
fn connections_over_the_limit_and_idle_ones_are_closed_with_a_reason() {
    let limits = Limits {
        max_clients: 2,
        idle_timeout: Duration::from_millis(1500),
        ..Limits::default()
    };
    let q = qstore_with("qstore", 1, limits);
    let port = q.server.local_addr().port();
    let mut a = Raw::connect(port);
    let mut b = Raw::connect(port);
    assert_eq!(a.cmd(&["AUTH", &q.password]), b"+OK\r\n");
    assert_eq!(b.cmd(&["PING"]), b"-NOAUTH Authentication required.\r\n");
    let mut c = Raw::connect(port);
    assert_eq!(c.reply(), b"-ERR max number of clients reached\r\n");
    // Idle past the timeout: closed (the read sees the end of the stream).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(a.reply(), b"");
    assert_eq!(b.reply(), b"");
    // Their places are free again (once their threads have ended).
    let began = Instant::now();
    let mut d = loop {
        let mut d = Raw::connect(port);
        if d.cmd(&["AUTH", &q.password]) == b"+OK\r\n" {
            break d;
        }
        assert!(began.elapsed() < Duration::from_secs(5), "no place freed");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(d.cmd(&["GET", "x"]), b"$-1\r\n");
}

#[test]
fn a_client_that_does_not_read_holds_up_no_one_and_is_let_go() {
    let limits = Limits {
        idle_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let q = qstore_with("qstore", 1, limits);
    let port = q.server.local_addr().port();
    let value = "v".repeat(600);
    let mut a = Raw::connect(port);
    assert_eq!(a.cmd(&["AUTH", &q.password]), b"+OK\r\n");
    assert_eq!(a.cmd(&["SET", "big", &value]), b"+OK\r\n");
    // 100,000 GETs of 600 bytes, never read: far more replies than the sockets hold.
    let flood = b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(100_000);
    let mut writer = a.0.try_clone().unwrap();
    let flooding = std::thread::spawn(move || {
        let _ = writer.write_all(&flood);
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut b = Raw::connect(port);
    let began = Instant::now();
    assert_eq!(b.cmd(&["AUTH", &q.password]), b"+OK\r\n");
    assert_eq!(b.cmd(&["SET", "k", "1"]), b"+OK\r\n");
    assert_eq!(b.cmd(&["GET", "k"]), b"$1\r\n1\r\n");
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "another client was held up for {:?}",
        began.elapsed()
    );
    // Past the idle timeout with its replies unread, the flooding client is closed: reading
    // now ends (before all its replies) instead of waiting.
    std::thread::sleep(Duration::from_secs(4));
    let mut got = 0usize;
    let mut chunk = [0u8; 1 << 16];
    loop {
        match a.0.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(got < 100_000 * 600, "read {got} bytes");
    flooding.join().unwrap();
    // (b was idle as long, and is closed too.)
    let mut c = Raw::connect(port);
    assert_eq!(c.cmd(&["AUTH", &q.password]), b"+OK\r\n");
    assert_eq!(c.cmd(&["GET", "k"]), b"$1\r\n1\r\n");
}

#[test]
fn a_client_that_stops_sending_still_gets_every_reply() {
    let q = qstore("qstore", 2);
    let mut c = TcpStream::connect(("127.0.0.1", q.server.local_addr().port())).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!(
        "*2\r\n$4\r\nAUTH\r\n${}\r\n{}\r\n",
        q.password.len(),
        q.password
    );
    req.push_str("*3\r\n$3\r\nSET\r\n$1\r\nh\r\n$1\r\n1\r\n*1\r\n$5\r\nMULTI\r\n");
    req.push_str(
        "*2\r\n$4\r\nINCR\r\n$1\r\nh\r\n*1\r\n$4\r\nEXEC\r\n*2\r\n$3\r\nGET\r\n$1\r\nh\r\n",
    );
    c.write_all(req.as_bytes()).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut replies = String::new();
    c.read_to_string(&mut replies).unwrap();
    assert_eq!(
        replies,
        "+OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n:2\r\n$1\r\n2\r\n"
    );
}

/// `redis-bench`'s load: as MULTI on both servers and as a Lua script on redis-server, every
/// transaction answered whole, and every INCR it made is in the keys afterwards; qstore's
/// port, which runs no scripts, is reported as such rather than failing.
#[test]
fn the_bench_load_runs_on_both_servers_and_every_incr_lands() {
    use qstore_redis::bench::{run, Form, Spec};
    let q = qstore("qstore", 1);
    let r = real_redis(&q.password);
    let spec = |port: u16, form: Form| Spec {
        addr: ([127, 0, 0, 1], port).into(),
        password: Some(q.password.clone()),
        clients: 3,
        duration: Duration::from_millis(300),
        keys: 50,
        reads: 2,
        rmws: 3,
        form,
    };
    let total = |port: u16| -> i64 {
        let mut raw = Raw::connect(port);
        raw.cmd(&["AUTH", &q.password]);
        (0..50)
            .map(|k| {
                let reply = raw.cmd(&["GET", &format!("key:{k}")]);
                match decode(&reply).unwrap().unwrap().0 {
                    redis_protocol::resp2::types::OwnedFrame::BulkString(v) => {
                        String::from_utf8(v).unwrap().parse::<i64>().unwrap()
                    }
                    _ => 0,
                }
            })
            .sum()
    };
    let qport = q.server.local_addr().port();
    let multi = run(&spec(qport, Form::Multi)).unwrap();
    assert!(multi.committed > 0 && multi.errors == 0, "{multi:?}");
    assert_eq!(total(qport), multi.committed as i64 * 3);
    let refused = run(&spec(qport, Form::Lua)).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::Unsupported, "{refused}");

    let multi = run(&spec(r.port, Form::Multi)).unwrap();
    let lua = run(&spec(r.port, Form::Lua)).unwrap();
    for o in [&multi, &lua] {
        assert!(o.committed > 0 && o.errors == 0, "{o:?}");
    }
    assert_eq!(total(r.port), (multi.committed + lua.committed) as i64 * 3);
}
