//! `qstore server --redis` and `qstore redis` as real processes, driven by the real
//! `redis-cli` (Debian's redis-tools, installed by scripts/setup.sh).

mod common;

use common::{free_addresses, run_with_timeout, Proc, TestDir, QSTORE};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Waits for `line` on the process's stdout (sent to `lines`).
fn wait_line(lines: &mpsc::Receiver<String>, p: &mut Proc, line: &str) {
    let deadline = Instant::now() + common::READY_TIMEOUT;
    loop {
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(l) if l.contains(line) => return,
            Ok(_) => {}
            Err(_) => {
                assert!(Instant::now() < deadline, "no {line:?}\n{}", p.output());
                assert!(p.running(), "exited before {line:?}\n{}", p.output());
            }
        }
    }
}

fn cli(addr: SocketAddr, password: &str, args: &[&str]) -> String {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(["-a", password, "--no-auth-warning"])
        .args(args);
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_servers_of_a_cluster_serve_redis_clients_across_partitions() {
    let dir = TestDir::new("redis");
    let secret = dir.path("secret");
    let out = run_with_timeout(
        {
            let mut c = Command::new(QSTORE);
            c.arg("secret").arg(&secret);
            c
        },
        Duration::from_secs(10),
    );
    assert!(out.status.success());
    let addrs = free_addresses(2);
    let redis = [free_addr(), free_addr()];
    let file = dir.path("cluster.toml");
    std::fs::write(
        &file,
        format!(
            "[cluster]\nnodes = 2\nworkers = 1\ncluster_id = 9\nsecret_file = \"secret\"\n\
             addresses = [{{ peer = \"{}\", client = \"{}\" }}, {{ peer = \"{}\", client = \"{}\" }}]\n\
             \n[workload]\nname = \"kv\"\n\n[workload.kv]\nbuckets_per_partition = 256\n",
            addrs[0].0, addrs[0].1, addrs[1].0, addrs[1].1
        ),
    )
    .unwrap();
    // One line channel per server: with a shared one, waiting for node 0's line
    // would consume node 1's if node 1 happened to be ready first.
    let (mut servers, lines): (Vec<Proc>, Vec<mpsc::Receiver<String>>) = (0..2)
        .map(|n| {
            let (tx, rx) = mpsc::channel();
            let mut cmd = Command::new(QSTORE);
            cmd.arg("server").arg("--cluster").arg(&file);
            cmd.args(["--node", &n.to_string(), "--redis", &redis[n].to_string()]);
            (Proc::spawn(&format!("server {n}"), &mut cmd, Some(tx)), rx)
        })
        .unzip();
    for (n, (s, rx)) in servers.iter_mut().zip(&lines).enumerate() {
        wait_line(rx, s, &format!("node {n} ready"));
    }
    let password = {
        let mut c = Command::new(QSTORE);
        c.arg("redis-password").arg("--cluster").arg(&file);
        let out = run_with_timeout(c, Duration::from_secs(10));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    // Written through one server, read through the other: keys on both partitions.
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let mut mset = vec!["MSET"];
    for k in &keys {
        mset.extend([k.as_str(), k.as_str()]);
    }
    assert_eq!(cli(redis[0], &password, &mset), "OK\n");
    let mut mget = vec!["MGET"];
    mget.extend(keys.iter().map(String::as_str));
    let expected: String = keys.iter().map(|k| format!("{k}\n")).collect();
    assert_eq!(cli(redis[1], &password, &mget), expected);
    assert_eq!(cli(redis[1], &password, &["INCRBY", "k0:n", "5"]), "5\n");
    let wrong = cli(redis[0], "wrong", &["GET", "k0"]);
    assert!(
        wrong.contains("WRONGPASS") || wrong.contains("NOAUTH"),
        "{wrong}"
    );
    for s in &mut servers {
        let _ = Command::new("kill").arg(s.child.id().to_string()).status();
        let status = s
            .wait_for_exit(Duration::from_secs(20))
            .expect("server stops");
        assert!(status.success(), "{}", s.output());
    }
}

#[test]
fn redis_on_a_cluster_of_another_workload_is_refused_with_a_reason() {
    let dir = TestDir::new("redis-ycsb");
    let file = dir.path("cluster.toml");
    let addrs = free_addresses(1);
    std::fs::write(
        &file,
        format!(
            "[cluster]\nnodes = 1\ncluster_id = 3\nsecret_file = \"secret\"\n\
             addresses = [{{ peer = \"{}\", client = \"{}\" }}]\n",
            addrs[0].0, addrs[0].1
        ),
    )
    .unwrap();
    let mut cmd = Command::new(QSTORE);
    cmd.arg("server").arg("--cluster").arg(&file);
    cmd.args(["--node", "0", "--redis", &free_addr().to_string()]);
    let out = run_with_timeout(cmd, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--redis needs the kv workload"));
}

#[test]
fn qstore_redis_serves_until_stopped_and_verifies_what_clients_ran() {
    let addr = free_addr();
    let (tx, rx) = mpsc::channel();
    let mut cmd = Command::new(QSTORE);
    cmd.args([
        "redis",
        "--protocol",
        "calvin",
        "--nodes",
        "2",
        "--no-auth",
        "--verify",
    ]);
    cmd.args(["--listen", &addr.to_string(), "--kv-buckets", "256"]);
    let mut p = Proc::spawn("qstore redis", &mut cmd, Some(tx));
    wait_line(&rx, &mut p, "ready on");
    let run = |args: &[&str]| {
        let mut c = Command::new("redis-cli");
        c.args(["-p", &addr.port().to_string()]).args(args);
        let out = run_with_timeout(c, Duration::from_secs(30));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(run(&["SET", "a", "1"]), "OK\n");
    assert_eq!(run(&["INCR", "a"]), "2\n");
    let _ = Command::new("kill").arg(p.child.id().to_string()).status();
    let status = p
        .wait_for_exit(Duration::from_secs(30))
        .expect("stops on SIGTERM");
    let out = p.output();
    assert!(status.success(), "{out}");
    assert!(
        out.contains("serializable: yes") && out.contains("serial oracle: match"),
        "{out}"
    );
}

/// Two consecutive free loopback ports.
fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let first = free_addr().port();
        if first < u16::MAX && TcpListener::bind(("127.0.0.1", first + 1)).is_ok() {
            return first;
        }
    }
    panic!("no two consecutive free ports");
}

#[test]
fn qstore_cluster_serves_redis_clients_on_every_server() {
    let port = free_port_pair();
    let mut cmd = Command::new(QSTORE);
    cmd.args([
        "cluster",
        "--workload",
        "kv",
        "--nodes",
        "2",
        "--duration",
        "20",
    ]);
    cmd.args(["--kv-buckets", "256", "--redis-port", &port.to_string()]);
    let mut p = Proc::spawn("qstore cluster", &mut cmd, None);
    let began = Instant::now();
    let password = loop {
        let err = p.stderr.text();
        if let Some(at) = err.find("password ") {
            let rest = &err[at + "password ".len()..];
            break rest.split_whitespace().next().unwrap().to_string();
        }
        assert!(began.elapsed() < common::READY_TIMEOUT, "{}", p.output());
        assert!(p.running(), "{}", p.output());
        std::thread::sleep(Duration::from_millis(50));
    };
    let at = |n: u16| SocketAddr::from(([127, 0, 0, 1], port + n));
    assert_eq!(cli(at(0), &password, &["MSET", "x", "1", "y", "2"]), "OK\n");
    assert_eq!(cli(at(1), &password, &["MGET", "x", "y"]), "1\n2\n");
    let _ = Command::new("kill").arg(p.child.id().to_string()).status();
    p.wait_for_exit(Duration::from_secs(30))
        .expect("stops on SIGTERM");
    // Another workload: refused before anything starts, with the reason.
    let mut cmd = Command::new(QSTORE);
    cmd.args([
        "cluster",
        "--workload",
        "ycsb",
        "--redis-port",
        &port.to_string(),
    ]);
    let out = run_with_timeout(cmd, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --workload kv"));
}
