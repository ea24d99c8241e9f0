//! QR-Store over TCP as an operator meets it: `qstore cluster --replication-factor 3` starts
//! a server process per copy of every partition, and a group leader killed with SIGKILL in
//! the middle of a verified run is replaced while the run goes on.

mod common;

use common::*;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Held by each test that runs a cluster of real server processes: on 2 cores, three such
/// clusters at once (about 20 processes) slow a rebuild down past the end of the run.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_cluster_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The one-kill case of the kill -9 test (`scripts/kill-loop.sh` repeats it with random
/// timing): 3 partitions x 3 copies, the leader of partition 0's group killed 1.5 s into a
/// list-append run. Every transaction is answered, what ran before the kill and was answered
/// after it is not run twice (no element twice in a list), the surviving copies agree, and
/// the client history goes to adya in `scripts/check-histories.sh`.
#[test]
fn a_killed_group_leader_is_replaced_and_the_run_goes_on() {
    kill_leader_after("1500", "0");
}

/// A leader killed during the warm-up, before the client first asked the servers for their
/// statistics (at the start of the measurement window): the run is survived all the same,
/// the lost server's figures left out.
#[test]
fn a_leader_killed_before_the_first_statistics_is_survived() {
    kill_leader_after("300", "1");
}

/// The one-kill run, the leader of partition 0's group killed `ms` into the run (whose
/// warm-up lasts `warmup` s).
fn kill_leader_after(ms: &str, warmup: &str) {
    let _one = one_cluster_at_a_time();
    let dir = TestDir::new("kill-leader");
    let (json, history) = (dir.path("out.json"), dir.path("history.jsonl"));
    let mut cmd = Command::new(QSTORE);
    cmd.args([
        "cluster",
        "--nodes",
        "3",
        "--replication-factor",
        "3",
        "--workload",
        "append",
        "--records",
        "2000",
        "--clients",
        "3",
        "--inflight",
        "20",
        "--duration",
        "4",
        "--warmup",
        warmup,
        "--kill-leader-after-ms",
        ms,
        "--verify",
        "--quiet",
        "--history",
        history.to_str().unwrap(),
        "--output",
        json.to_str().unwrap(),
    ]);
    let mut launcher = Proc::spawn("qstore cluster", &mut cmd, None);
    let status = launcher
        .wait_for_exit(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("qstore cluster still running\n{}", launcher.output()));
    let (out, err) = (launcher.stdout.text(), launcher.stderr.text());
    assert!(status.success(), "{status}\n{out}\n{err}");
    assert!(err.contains("starting 9 servers"), "{err}");
    assert!(
        err.contains("fault: killed node") && err.contains("the leader of partition 0"),
        "{err}"
    );
    assert!(
        err.contains("leads partition 0") && err.contains("ms after its leader was killed"),
        "no new leader announced\n{err}"
    );
    assert!(out.contains("copies in service equal"), "{out}");
    // The whole engine history of an instance in service, checked and replayed.
    assert!(out.contains("serializable: yes"), "{out}");
    assert!(out.contains("serial oracle: match"), "{out}");
    assert!(out.contains("no value twice in a list"), "{out}");
    let r = read_json(&json);
    assert_eq!(r["unfinished"], 0, "{r}");
    assert_eq!(r["rejected"], 0, "{r}");
    assert!(r["committed"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["redirected"].as_u64().unwrap() > 0,
        "clients of the killed leader were sent elsewhere: {r}"
    );
    let stall = r["longest_stall_ms"].as_u64().unwrap();
    assert!(stall > 0, "the fail-over leaves a gap in the commits: {r}");
    let events = std::fs::read_to_string(&history).unwrap();
    assert!(events.lines().count() > 100, "a client history was written");
}

#[test]
fn a_fault_needs_replication_and_a_partition_the_cluster_has() {
    let run = |extra: &[&str]| {
        let mut cmd = Command::new(QSTORE);
        cmd.args(["cluster", "--nodes", "2", "--kill-leader-after-ms", "100"])
            .args(extra);
        cmd.output().unwrap()
    };
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--replication-factor 3"), "{err}");
    let o = run(&["--replication-factor", "2", "--kill-partition", "2"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("partitions 0 to 1"), "{err}");
}

/// A killed server started again has lost its copy: its peers admit it, it rejoins its
/// group as a follower, and its cluster instance (stale since the kill) is rebuilt from
/// another instance's copies. The client's run passes its verification with every copy of
/// every partition in service, the restarted server's included.
fn restart_and_rebuild(protocol: &str, duration: &str) {
    let _one = one_cluster_at_a_time();
    let mut cluster = Cluster::start_replicated_running("restart", 2, 3, protocol);
    // Long enough for the rebuild to end before the run does on a loaded 2-core machine (a
    // debug build there has taken 6 s from the kill to the instance back in service at the
    // client's default load; a lighter load leaves the copies room on the links).
    let load = ["--inflight", "50"];
    let mut client =
        cluster.committing_client(&[&load[..], &["--duration", duration, "--verify"]].concat());
    cluster.servers[0].child.kill().unwrap();
    cluster.servers[0].child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    cluster.servers[0] = cluster.spawn_server(0, None);
    let started = Instant::now();
    let status = client
        .wait_for_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("the client hangs\n{}", client.output()));
    let (out, err) = (client.stdout.text(), client.stderr.text());
    let servers = cluster.outputs();
    assert!(
        status.success(),
        "{status} after {:?}\n{out}\n{err}\n{servers}",
        started.elapsed()
    );
    assert!(
        out.contains("instances out of service []"),
        "{out}\n{servers}"
    );
    assert!(out.contains("2 partitions x 3 copies"), "{out}\n{servers}");
    assert!(out.contains("serial oracle: match"), "{out}");
    let rejoined = cluster.servers[0].stderr.text();
    assert!(rejoined.contains("rebuilt, back in service"), "{rejoined}");
    for (s, server) in cluster.servers.iter_mut().enumerate() {
        assert!(server.running(), "server {s} died\n{}", server.output());
    }
}

/// A server killed and restarted while no client sends anything is rebuilt all the same: the
/// copy's source plans a batch to mark the copy on even when it has no transaction to plan.
fn restart_idle_and_rebuild(protocol: &str) {
    let _one = one_cluster_at_a_time();
    let mut cluster = Cluster::start_replicated_running("idle-restart", 2, 3, protocol);
    cluster.servers[0].child.kill().unwrap();
    cluster.servers[0].child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    cluster.servers[0] = cluster.spawn_server(0, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cluster.servers[0]
        .stderr
        .text()
        .contains("rebuilt, back in service")
    {
        assert!(
            Instant::now() < deadline,
            "not rebuilt in 30 s while idle\n{}",
            cluster.outputs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for (s, server) in cluster.servers.iter_mut().enumerate() {
        assert!(server.running(), "server {s} died\n{}", server.output());
    }
}

#[test]
fn an_idle_cluster_rebuilds_a_restarted_server() {
    restart_idle_and_rebuild("qstore");
}

#[test]
fn an_idle_calvin_cluster_rebuilds_a_restarted_server() {
    restart_idle_and_rebuild("calvin");
}

#[test]
fn a_restarted_server_rejoins_and_its_instance_is_rebuilt() {
    restart_and_rebuild("qstore", "10");
}

#[test]
fn a_restarted_calvin_server_rejoins_and_its_instance_is_rebuilt() {
    restart_and_rebuild("calvin", "10");
}
