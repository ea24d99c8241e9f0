//! What the tests of distributed mode share: scratch directories, server processes, a
//! cluster of them on loopback, raw client connections that speak the client protocol, and
//! the peer handshake's wire layout.
#![allow(dead_code)] // each test binary uses some of these

use qstore_core::txn::{ProcCall, ProcId, TxnOutcome, Value};
use qstore_core::RunConfig;
use qstore_engine::server::proto::{
    client_handshake, ClientRequest, ClientResponse, CLIENT_FORMAT_VERSION,
};
use qstore_net::auth::ClusterSecret;
use qstore_net::frame::{FrameDecoder, FrameEncoder, DEFAULT_FLUSH_BYTES, DEFAULT_MAX_FRAME};
use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const QSTORE: &str = env!("CARGO_BIN_EXE_qstore");

/// How long servers may take to load and connect (they take well under a second here).
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server may take to close a connection it should close.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------
// Scratch directories, processes and clusters

/// A fresh directory, removed at the end of the test.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!(
            "qstore-dist-{name}-{}-{:x}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A number that differs between calls and between test processes.
pub fn unique() -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    std::collections::hash_map::RandomState::new().hash_one((now, std::process::id()))
}

/// Text a child process writes, collected by a thread as it arrives.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<String>>);

impl Captured {
    /// Copies `from` line by line into the capture; each line also goes to `lines`.
    pub fn collect(
        &self,
        from: impl Read + Send + 'static,
        lines: Option<mpsc::Sender<String>>,
    ) -> JoinHandle<()> {
        let text = self.0.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines() {
                let Ok(line) = line else { return };
                let mut t = text.lock().unwrap();
                t.push_str(&line);
                t.push('\n');
                drop(t);
                if let Some(tx) = &lines {
                    let _ = tx.send(line);
                }
            }
        })
    }

    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}

/// A child process killed and reaped when dropped, whatever path the test takes.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub stdout: Captured,
    pub stderr: Captured,
    pub readers: Vec<JoinHandle<()>>,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr captured; stdout lines also go to `lines`.
    pub fn spawn(name: &str, cmd: &mut Command, lines: Option<mpsc::Sender<String>>) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let (stdout, stderr) = (Captured::default(), Captured::default());
        let readers = vec![
            stdout.collect(child.stdout.take().unwrap(), lines),
            stderr.collect(child.stderr.take().unwrap(), None),
        ];
        Proc {
            name: name.to_string(),
            child,
            stdout,
            stderr,
            readers,
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits up to `limit` for the process to exit by itself; `None` if it did not.
    pub fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Its pipes are closed: let the readers take the last lines.
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Everything it wrote so far, for failure messages.
    pub fn output(&self) -> String {
        format!(
            "--- {} stdout ---\n{}--- {} stderr ---\n{}",
            self.name,
            self.stdout.text(),
            self.name,
            self.stderr.text()
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A distributed cluster of real `qstore server` processes on loopback, described by a
/// cluster file in a scratch directory. Dropping it kills every server.
pub struct Cluster {
    pub dir: TestDir,
    pub file: PathBuf,
    pub cluster_id: u64,
    /// (peer, client) address of each node.
    pub addrs: Vec<(SocketAddr, SocketAddr)>,
    pub servers: Vec<Proc>,
    /// The cluster's secret (its file is `secret` beside the cluster file).
    pub secret: ClusterSecret,
    /// TOML sections appended to the cluster file (e.g. `[server]` limits).
    pub sections: String,
    /// Lines added to the file's `[cluster]` section.
    pub cluster_toml: String,
    /// Copies of each partition: the file lists `replicas` servers per node.
    pub replicas: usize,
    /// The protocol the servers run.
    pub protocol: String,
}

impl Cluster {
    /// Writes a cluster file for `nodes` Q-Store nodes on free loopback ports, with small
    /// data and a short drain, then starts every server and waits until all are ready.
    /// `extra_toml` goes into the `[workload.ycsb]` section.
    pub fn start(name: &str, nodes: usize, extra_toml: &str) -> Cluster {
        Self::start_with(name, nodes, extra_toml, "")
    }

    /// [`Cluster::start`] with more TOML `sections` at the end of the cluster file (a
    /// `[server]` section replaces the default one, whose handshakes time out in 1 s).
    pub fn start_with(name: &str, nodes: usize, extra_toml: &str, sections: &str) -> Cluster {
        Self::start_full(name, nodes, extra_toml, sections, "")
    }

    /// A replicated cluster: `nodes` partitions, `replicas` copies of each, so
    /// `nodes * replicas` servers (server `s` holds partition `s % nodes`).
    #[allow(dead_code)]
    pub fn start_replicated(name: &str, nodes: usize, replicas: usize) -> Cluster {
        Self::start_replicated_running(name, nodes, replicas, "qstore")
    }

    /// [`Cluster::start_replicated`] with another protocol.
    #[allow(dead_code)]
    pub fn start_replicated_running(
        name: &str,
        nodes: usize,
        replicas: usize,
        protocol: &str,
    ) -> Cluster {
        let sections = format!("[replication]\nfactor = {replicas}\n");
        Self::start_copies(name, (nodes, replicas, protocol), "", &sections, "")
    }

    /// A cluster of `nodes` servers running TPC-C (New-Order and Payment by default, every
    /// procedure callable), one warehouse each, room for 4,000 orders per district, and no
    /// transaction reaching another node.
    #[allow(dead_code)]
    pub fn start_tpcc(name: &str, nodes: usize) -> Cluster {
        let sections = "[workload]\nname = \"tpcc\"\n\n[workload.tpcc]\n\
                        mix = \"neworder-payment\"\nmax_orders_per_district = 4000\n\
                        multi_partition_fraction = 0.0\n";
        Self::start_full(name, nodes, "", sections, "partitioning = \"range\"")
    }

    fn start_full(
        name: &str,
        nodes: usize,
        extra_toml: &str,
        sections: &str,
        cluster_toml: &str,
    ) -> Cluster {
        Self::start_copies(
            name,
            (nodes, 1, "qstore"),
            extra_toml,
            sections,
            cluster_toml,
        )
    }

    /// A cluster of `nodes` partitions × `replicas` copies running `protocol`.
    fn start_copies(
        name: &str,
        (nodes, replicas, protocol): (usize, usize, &str),
        extra_toml: &str,
        sections: &str,
        cluster_toml: &str,
    ) -> Cluster {
        let dir = TestDir::new(name);
        let file = dir.path("cluster.toml");
        let cluster_id = (unique() >> 1).max(1);
        let secret_path = dir.path("secret");
        ClusterSecret::create_file(&secret_path).unwrap();
        let sections = if sections.contains("[server]") {
            sections.to_string()
        } else {
            format!("[server]\nhandshake_timeout_s = 1.0\n{sections}")
        };
        let mut cluster = Cluster {
            dir,
            file,
            cluster_id,
            addrs: Vec::new(),
            servers: Vec::new(),
            secret: ClusterSecret::load(&secret_path).unwrap(),
            sections,
            cluster_toml: cluster_toml.to_string(),
            replicas,
            protocol: protocol.to_string(),
        };
        // The ports are free when chosen, but another process may take one before the
        // server binds it; the server then exits saying so, and the cluster gets new ports.
        for attempt in 1.. {
            cluster.addrs = free_addresses(nodes * replicas);
            cluster.write_file(extra_toml);
            let started = cluster.start_servers();
            // Servers that exited have said why by now.
            for server in &mut cluster.servers {
                server.wait_for_exit(Duration::ZERO);
            }
            match started {
                Ok(()) => return cluster,
                Err(e) if attempt < 3 && cluster.outputs().contains("cannot listen") => {
                    eprintln!("retrying with other ports: {e}");
                    cluster.servers.clear();
                }
                Err(e) => panic!("{e}\n{}", cluster.outputs()),
            }
        }
        unreachable!()
    }

    pub fn write_file(&self, extra_toml: &str) {
        let entries: Vec<String> = self
            .addrs
            .iter()
            .map(|(p, c)| format!("{{ peer = \"{p}\", client = \"{c}\" }}"))
            .collect();
        let text = format!(
            "[cluster]\n\
             nodes = {}\n\
             workers = 1\n\
             {}\n\
             cluster_id = {}\n\
             connect_timeout_s = 20.0\n\
             secret_file = \"secret\"\n\
             addresses = [{}]\n\
             \n\
             [protocol]\n\
             name = \"{}\"\n\
             \n\
             [workload.ycsb]\n\
             records_per_partition = 2000\n\
             {extra_toml}\n\
             \n\
             [client]\n\
             drain_timeout_s = 3.0\n\
             \n\
             {}\n",
            self.addrs.len() / self.replicas,
            self.cluster_toml,
            self.cluster_id,
            entries.join(", "),
            self.protocol,
            self.sections
        );
        std::fs::write(&self.file, text).unwrap();
    }

    /// Starts one server per node and waits for every ready line.
    pub fn start_servers(&mut self) -> Result<(), String> {
        let (ready_tx, ready_rx) = mpsc::channel();
        for node in 0..self.addrs.len() {
            let server = self.spawn_server(node, Some(ready_tx.clone()));
            self.servers.push(server);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut ready = vec![false; self.servers.len()];
        while !ready.iter().all(|&r| r) {
            match ready_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => {
                    for (node, r) in ready.iter_mut().enumerate() {
                        *r |= line == format!("qstore server: node {node} ready");
                    }
                }
                Err(_) if Instant::now() >= deadline => {
                    return Err(format!("servers not ready: {ready:?}"))
                }
                Err(_) => {}
            }
            for (node, server) in self.servers.iter_mut().enumerate() {
                if !ready[node] && !server.running() {
                    return Err(format!("server {node} exited before it was ready"));
                }
            }
        }
        Ok(())
    }

    /// Starts the server of `node` (recording its history, for `qstore client --verify`).
    pub fn spawn_server(&self, node: usize, lines: Option<mpsc::Sender<String>>) -> Proc {
        let mut cmd = Command::new(QSTORE);
        cmd.arg("server")
            .arg("--cluster")
            .arg(&self.file)
            .args(["--node", &node.to_string()])
            .arg("--record-history");
        Proc::spawn(&format!("server {node}"), &mut cmd, lines)
    }

    /// Runs `qstore client --txns N --verify` to completion: every transaction answered and
    /// committed, the history serializable and the serial oracle matching the servers' data.
    pub fn verified_run(&mut self, txns: u64, what: &str) {
        let o = run_with_timeout(
            self.client(&["--txns", &txns.to_string(), "--verify", "--quiet"]),
            Duration::from_secs(90),
        );
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success()
                && out.contains("serializable: yes")
                && out.contains("serial oracle: match"),
            "{what}: verified run failed ({}):\n{out}\n{err}\n{}",
            o.status,
            self.outputs()
        );
        for (node, s) in self.servers.iter_mut().enumerate() {
            assert!(s.running(), "{what}: server {node} exited\n{}", s.output());
        }
    }

    /// Threads and resident memory (KiB) of the server of `node`, from /proc.
    pub fn server_usage(&self, node: usize) -> (u64, u64) {
        let pid = self.servers[node].child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| -> u64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        (field("Threads:"), field("VmRSS:"))
    }

    /// A `qstore client` run against this cluster.
    pub fn client(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(QSTORE);
        cmd.arg("client")
            .arg("--cluster")
            .arg(&self.file)
            .args(args);
        cmd
    }

    /// Starts `qstore client` with `args` (no warm-up, progress lines on) and returns once a
    /// progress line says it commits.
    pub fn committing_client(&self, args: &[&str]) -> Proc {
        let mut all = vec!["--warmup", "0", "--progress"];
        all.extend_from_slice(args);
        let mut client = Proc::spawn("client", &mut self.client(&all), None);
        let started = Instant::now();
        while !client.stderr.text().contains("committed") {
            assert!(
                client.running() && started.elapsed() < Duration::from_secs(20),
                "the client never made progress\n{}\n{}",
                client.output(),
                self.outputs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        client
    }

    pub fn peer_addr(&self, node: usize) -> SocketAddr {
        self.addrs[node].0
    }

    pub fn client_addr(&self, node: usize) -> SocketAddr {
        self.addrs[node].1
    }

    /// Every server's output, for failure messages.
    pub fn outputs(&self) -> String {
        self.servers.iter().map(Proc::output).collect()
    }

    /// Runs `qstore client --txns N` to completion and checks that every transaction
    /// committed and the client exited 0.
    pub fn run_client_to_completion(&mut self, txns: u64, what: &str) {
        let json = self.dir.path(&format!("{}.json", what.replace(' ', "-")));
        let o = run_with_timeout(
            self.client(&[
                "--txns",
                &txns.to_string(),
                "--quiet",
                "--output",
                json.to_str().unwrap(),
            ]),
            Duration::from_secs(60),
        );
        assert!(
            o.status.success(),
            "{what}: client failed ({}): {}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr),
            self.outputs()
        );
        let r = read_json(&json);
        assert!(
            r["committed"].as_u64().unwrap() >= txns,
            "{what}: {}",
            r["committed"]
        );
        assert_eq!(r["unfinished"], 0, "{what}");
        assert_eq!(r["rejected"], 0, "{what}: {}", r["first_rejection"]);
        for (node, s) in self.servers.iter_mut().enumerate() {
            assert!(s.running(), "{what}: server {node} exited\n{}", s.output());
        }
    }
}

/// `nodes` pairs of distinct free loopback addresses. Every listener stays open until all
/// are chosen, so no port is handed out twice.
pub fn free_addresses(nodes: usize) -> Vec<(SocketAddr, SocketAddr)> {
    let listeners: Vec<TcpListener> = (0..2 * nodes)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    addrs.chunks(2).map(|a| (a[0], a[1])).collect()
}

/// Runs `cmd` to its end, killing it (and failing) if it takes longer than `limit`.
pub fn run_with_timeout(mut cmd: Command, limit: Duration) -> Output {
    let mut p = Proc::spawn("command", &mut cmd, None);
    let Some(status) = p.wait_for_exit(limit) else {
        panic!("still running after {limit:?}\n{}", p.output());
    };
    Output {
        status,
        stdout: p.stdout.text().into_bytes(),
        stderr: p.stderr.text().into_bytes(),
    }
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap()
}

// ---------------------------------------------------------------------------------------
// Raw connections

/// One frame holding `msgs`, as a sender would write it.
pub fn frame_of<M: Serialize>(msgs: &[M]) -> Vec<u8> {
    let mut enc = FrameEncoder::new(DEFAULT_FLUSH_BYTES, DEFAULT_MAX_FRAME);
    for m in msgs {
        enc.push(m).unwrap();
    }
    let mut bytes = Vec::new();
    enc.write_to(&mut bytes).unwrap();
    bytes
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(CLOSE_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(CLOSE_TIMEOUT)).unwrap();
    s
}

/// Reads one frame of `M` (failing after the read timeout).
pub fn read_msgs<M: serde::de::DeserializeOwned>(s: &mut TcpStream, what: &str) -> Vec<M> {
    FrameDecoder::new(DEFAULT_MAX_FRAME)
        .read_frame::<M, _>(s)
        .unwrap_or_else(|e| panic!("{what}: no answer: {e}"))
        .unwrap_or_else(|| panic!("{what}: closed without an answer"))
}

/// Whether the server closes `s` within [`CLOSE_TIMEOUT`]: reads end (or the connection is
/// reset) rather than time out. Bytes still arriving before the end are skipped.
pub fn closed_by_server(s: &mut TcpStream) -> Result<(), String> {
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "the server kept the connection open for {CLOSE_TIMEOUT:?}"
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Ok(()), // reset: closed with our bytes unread
        }
        if Instant::now() >= deadline {
            return Err("the server keeps talking".into());
        }
    }
}

pub fn assert_closed_by_server(s: &mut TcpStream, what: &str) {
    if let Err(e) = closed_by_server(s) {
        panic!("{what}: {e}");
    }
}

/// A client hello (answered by a challenge, or refused).
pub fn hello(cluster_id: u64) -> ClientRequest {
    ClientRequest::Hello {
        cluster_id,
        format_version: CLIENT_FORMAT_VERSION,
        nonce: [7; 32],
    }
}

/// A connection to a node's client port that has been welcomed.
pub struct RawClient {
    pub stream: TcpStream,
    pub next_id: u64,
}

impl RawClient {
    /// Connects to `node` and completes the authenticated handshake.
    pub fn connect(cluster: &Cluster, node: usize) -> RawClient {
        Self::try_connect(cluster, node).unwrap_or_else(|e| panic!("node {node}: {e}"))
    }

    /// [`RawClient::connect`], with the server's refusal as the error.
    pub fn try_connect(cluster: &Cluster, node: usize) -> Result<RawClient, String> {
        let mut stream = connect(cluster.client_addr(node));
        let welcome = client_handshake(
            &mut stream,
            cluster.cluster_id,
            &cluster.secret,
            CLOSE_TIMEOUT,
        )?;
        match welcome {
            ClientResponse::Welcome {
                node: n, protocol, ..
            } => {
                assert_eq!(n.0 as usize, node);
                assert_eq!(protocol, "qstore");
            }
            other => panic!("expected a welcome, got {other:?}"),
        }
        stream.set_read_timeout(Some(CLOSE_TIMEOUT)).unwrap();
        Ok(RawClient { stream, next_id: 0 })
    }

    /// Submits `call` without waiting; returns the id its answer will carry.
    pub fn send(&mut self, call: ProcCall) -> u64 {
        self.next_id += 1;
        let request = ClientRequest::Submit {
            id: self.next_id,
            call,
            birth_us: 0,
            key: Default::default(),
        };
        self.stream.write_all(&frame_of(&[request])).unwrap();
        self.next_id
    }

    /// The next frame of answers, as (id, outcome); `None` if none came within the read
    /// timeout or the connection ended.
    pub fn answers(&mut self) -> Option<Vec<(u64, TxnOutcome)>> {
        let msgs = FrameDecoder::new(DEFAULT_MAX_FRAME)
            .read_frame::<ClientResponse, _>(&mut self.stream)
            .ok()??;
        Some(
            msgs.into_iter()
                .map(|m| match m {
                    ClientResponse::Answer { id, outcome } => (id, outcome),
                    other => panic!("expected answers, got {other:?}"),
                })
                .collect(),
        )
    }

    /// Submits `call` and waits for its answer.
    pub fn call(&mut self, call: ProcCall) -> TxnOutcome {
        self.next_id += 1;
        let id = self.next_id;
        let request = ClientRequest::Submit {
            id,
            call,
            birth_us: 0,
            key: Default::default(),
        };
        self.stream.write_all(&frame_of(&[request])).unwrap();
        let what = format!("submit {id}");
        match read_msgs::<ClientResponse>(&mut self.stream, &what).as_slice() {
            [ClientResponse::Answer { id: got, outcome }] => {
                assert_eq!(*got, id, "the answer carries the request's id");
                outcome.clone()
            }
            other => panic!("{what}: expected one answer, got {other:?}"),
        }
    }
}

/// The id of YCSB's one procedure in the cluster's catalog.
pub fn ycsb_proc(cluster: &Cluster) -> ProcId {
    let text = std::fs::read_to_string(&cluster.file).unwrap();
    let cfg = RunConfig::from_toml(&text).unwrap();
    let catalog = qstore_workload::build(&cfg).unwrap().catalog();
    catalog.procedure_id("ycsb_txn").unwrap()
}

/// A `ycsb_txn` call of one access: read (op 0) or read-modify-write (op 1) of `key`.
pub fn ycsb_call(proc: ProcId, key: u64, op: u8) -> ProcCall {
    ProcCall {
        proc,
        args: qstore_workload::ycsb::ycsb_args([(key, op)]),
    }
}

/// The one output of a committed single-access call.
pub fn committed_value(outcome: TxnOutcome) -> Value {
    match outcome {
        TxnOutcome::Committed(out) if out.len() == 1 => out.into_iter().next().unwrap(),
        other => panic!("expected a commit with one output, got {other:?}"),
    }
}

/// The peer handshake a node sends on every connection to another node (the field layout of
/// `qstore_net`'s handshake, which is not public).
#[derive(Serialize, Deserialize, Debug)]
pub struct PeerHello {
    pub cluster_id: u64,
    pub node: u32,
    pub protocol: String,
    pub format_version: u32,
    pub incarnation: u64,
    pub nonce: [u8; 32],
}

/// The answer to a [`PeerHello`].
#[derive(Serialize, Deserialize, Debug)]
pub enum PeerReply {
    Accept { hello: PeerHello, proof: [u8; 32] },
    Refuse(String),
}

/// The acceptor's last word in the peer handshake, after the dialer's proof.
#[derive(Serialize, Deserialize, Debug)]
pub enum PeerVerdict {
    Welcome,
    Refuse { reason: String, restarted: bool },
}
