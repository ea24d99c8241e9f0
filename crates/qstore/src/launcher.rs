//! Local multi-process cluster: one `qstore server` process per node on loopback, then one
//! `qstore client` run against them, then a clean stop.
//!
//! This is the distributed mode on one machine: the same processes, TCP links and cluster
//! file as on several machines, without having to pick ports or start and stop processes by
//! hand. The launcher owns every process it starts: whatever happens (the client finishes, a
//! server fails to start, the user presses Ctrl-C, an error or a panic unwinds), the
//! processes are stopped and reaped before `launch` returns, so none is left behind.

use qstore_core::config::NodeAddress;
use qstore_core::RunConfig;
use qstore_net::auth::ClusterSecret;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Exit code of a launch interrupted by SIGINT or SIGTERM (the shell's 128 + SIGINT).
pub const INTERRUPTED: i32 = 130;
/// How long a process gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How often waits look at the processes and at the interruption flag.
const POLL: Duration = Duration::from_millis(20);
/// Lines of each server's stderr kept to explain a failed start.
const TAIL_LINES: usize = 20;

/// How to launch a local cluster.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Where to write the cluster file (kept afterwards: it records the addresses and the
    /// cluster id of the run); `None` writes it in a fresh temporary directory removed at
    /// the end.
    pub cluster_file: Option<PathBuf>,
    /// Extra arguments for `qstore client` (output and check flags).
    pub client_args: Vec<OsString>,
    /// Extra arguments for every `qstore server` (e.g. `--record-history`).
    pub server_args: Vec<OsString>,
    /// How long the servers, all together, may take to load their partitions and connect
    /// to their peers.
    pub ready_timeout: Duration,
    /// Fault injection: SIGKILL a group's leader while the client runs.
    pub kill: Option<KillLeader>,
    /// Server N also serves Redis clients on 127.0.0.1:PORT+N.
    pub redis_port: Option<u16>,
}

/// Fault injection of a replicated launch: `after` the client started, the server leading
/// `partition`'s replica group is killed with SIGKILL (as a crashed machine would vanish),
/// and the launcher reports when the group has a new leader. With `restart_after`, the
/// killed server is started again that long after the kill (as a rebooted machine would
/// come back, without its copy).
#[derive(Clone, Copy, Debug)]
pub struct KillLeader {
    pub partition: u32,
    pub after: Duration,
    pub restart_after: Option<Duration>,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            cluster_file: None,
            client_args: Vec::new(),
            server_args: Vec::new(),
            ready_timeout: Duration::from_secs(60),
            kill: None,
            redis_port: None,
        }
    }
}

/// Runs `cfg` as a local multi-process cluster: picks free loopback ports, writes the
/// cluster file, starts one server per node, waits until all are ready, runs the client,
/// then stops the servers. Any addresses already in `cfg` are replaced.
///
/// Returns the client's exit code, or [`INTERRUPTED`] when SIGINT or SIGTERM arrived
/// (everything is stopped first; a second signal exits at once). While it runs, those
/// signals stop the cluster instead of the process; once it returns they are ignored (the
/// handlers stay installed but do nothing), so the caller should exit or launch again.
pub fn launch(cfg: RunConfig, opts: LaunchOptions) -> Result<i32, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the qstore binary to start servers: {e}"))?;
    let interrupted = Arc::new(AtomicBool::new(false));
    let _signals = SignalFlags::register(&interrupted)?;
    let program = Program {
        exe,
        leading_args: Vec::new(),
    };
    launch_with(&program, cfg, &opts, &interrupted)
}

/// [`launch`] with the program to run and the interruption flag given (tests use a stand-in
/// script and set the flag themselves rather than signal the whole test process).
fn launch_with(
    program: &Program,
    cfg: RunConfig,
    opts: &LaunchOptions,
    interrupted: &AtomicBool,
) -> Result<i32, String> {
    let cfg = with_local_addresses(cfg)?;
    let file = ClusterFile::write(&cfg, opts.cluster_file.as_deref())?;
    let servers_n = cfg.servers() as usize;
    eprintln!("starting {servers_n} servers...");
    let started = Instant::now();
    // Declared after `file`, so dropped (stopped) before the file is removed.
    let mut servers = Children::default();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (leader_tx, leaders) = mpsc::channel();
    for node in 0..servers_n {
        let lines = ServerLines {
            partition: node as u32 % cfg.cluster.nodes,
            ready: ready_tx.clone(),
            leads: leader_tx.clone(),
        };
        servers.push(spawn_server(program, file.path(), node, opts, lines)?);
    }
    drop(ready_tx);
    match wait_ready(&mut servers, &ready_rx, opts.ready_timeout, interrupted) {
        Ok(Startup::Ready) => {}
        Ok(Startup::Interrupted) => return Ok(stop_interrupted(None, &mut servers)),
        Err(failure) => {
            servers.stop();
            return Err(failure.explain(&servers));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("all {servers_n} servers ready ({secs:.1} s)");
    if let Some(port) = opts.redis_port {
        let last = port as usize + servers_n - 1;
        match crate::cli::redis_password_of(file.path()) {
            Ok(password) => eprintln!(
                "Redis clients: 127.0.0.1:{port} to 127.0.0.1:{last} (server N on port \
                 {port}+N), password {password}"
            ),
            Err(e) => eprintln!("Redis clients: cannot derive the password: {e}"),
        }
    }
    let mut client = Children::default();
    client.push(spawn_client(program, file.path(), &opts.client_args)?);
    let partitions = cfg.cluster.nodes;
    let respawn = |node: usize| {
        let lines = ServerLines {
            partition: node as u32 % partitions,
            ready: mpsc::channel().0,
            leads: leader_tx.clone(),
        };
        spawn_server(program, file.path(), node, opts, lines)
    };
    let mut fault = opts
        .kill
        .map(|k| Fault::new(k, leaders, partitions, Box::new(respawn)));
    let status = match wait_client(&mut client, &mut servers, &mut fault, interrupted) {
        Some(status) => status,
        None => return Ok(stop_interrupted(Some(&mut client), &mut servers)),
    };
    eprintln!("stopping servers...");
    servers.stop();
    let killed = fault
        .as_ref()
        .filter(|f| !f.restarted)
        .and_then(|f| f.killed);
    report_failed_servers(&mut servers, killed);
    Ok(exit_code(status))
}

/// How to run qstore: the binary and any arguments that come before the subcommand.
struct Program {
    exe: PathBuf,
    leading_args: Vec<OsString>,
}

impl Program {
    /// `qstore <subcommand> --cluster FILE`, to which the caller adds the rest.
    fn command(&self, subcommand: &str, cluster_file: &Path) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.leading_args)
            .arg(subcommand)
            .arg("--cluster")
            .arg(cluster_file);
        cmd
    }
}

// ---------------------------------------------------------------------------------------
// Addresses and the cluster file

/// Fills `cfg.cluster.addresses` with free loopback ports and gives the cluster an id if it
/// has none, then validates the result. The configuration is validated first too, so that a
/// bad node count is reported as such rather than as a failure to find ports.
fn with_local_addresses(mut cfg: RunConfig) -> Result<RunConfig, String> {
    cfg.cluster.addresses.clear();
    cfg.validate().map_err(|e| e.to_string())?;
    let servers = cfg.servers() as usize;
    let ports =
        pick_ports(2 * servers).map_err(|e| format!("cannot find free loopback ports: {e}"))?;
    cfg.cluster.addresses = ports
        .chunks(2)
        .map(|p| NodeAddress {
            peer: format!("127.0.0.1:{}", p[0]),
            client: format!("127.0.0.1:{}", p[1]),
            data_dir: String::new(),
        })
        .collect();
    if cfg.cluster.cluster_id == 0 {
        cfg.cluster.cluster_id = match cfg.durability.data_dir.as_str() {
            "" => random_cluster_id(),
            dir => kept_cluster_id(Path::new(dir))?,
        };
    }
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// `count` distinct free loopback ports. Every listener stays open until all ports are
/// chosen, so the system cannot hand out the same port twice; they are closed on return,
/// just before the servers bind them (another process could still take one in between; the
/// server would then fail to start and say so).
fn pick_ports(count: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// The cluster id of the data directories under `dir`: the one a launch on them chose
/// first (kept in `dir/cluster-id`), so that their servers recognise their cluster when it
/// is launched again.
fn kept_cluster_id(dir: &Path) -> Result<u64, String> {
    let file = dir.join("cluster-id");
    let failed = |e: io::Error| format!("the cluster id in {}: {e}", file.display());
    match std::fs::read_to_string(&file) {
        Ok(text) => text.trim().parse().map_err(|e| {
            format!(
                "{} is damaged ({e}): it should hold the cluster's id",
                file.display()
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let id = random_cluster_id();
            std::fs::create_dir_all(dir).map_err(failed)?;
            let mut f = std::fs::File::create(&file).map_err(failed)?;
            writeln!(f, "{id}")
                .and_then(|()| f.sync_all())
                .map_err(failed)?;
            Ok(id)
        }
        Err(e) => Err(failed(e)),
    }
}

/// A random non-zero cluster id, so that processes of two launches on one machine refuse
/// each other. At most `i64::MAX`: TOML integers are signed 64-bit.
fn random_cluster_id() -> u64 {
    (random_u64() >> 1).max(1)
}

/// A random number from the standard library's per-process random hash keys, mixed with the
/// time and process id (no dependency needed for an id that only has to differ).
fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new().hash_one((now, std::process::id()))
}

/// The cluster file every process of the launch reads. A temporary one lives in a directory
/// of its own, removed with it when this is dropped; a file the caller named is kept.
struct ClusterFile {
    path: PathBuf,
    temp_dir: Option<PathBuf>,
}

impl ClusterFile {
    /// Writes `cfg` as the cluster file (with a new cluster secret beside it, unless `cfg`
    /// names one).
    fn write(cfg: &RunConfig, path: Option<&Path>) -> Result<ClusterFile, String> {
        let file = match path {
            Some(p) => ClusterFile {
                path: p.to_path_buf(),
                temp_dir: None,
            },
            None => {
                let dir = make_temp_dir()?;
                ClusterFile {
                    path: dir.join("cluster.toml"),
                    temp_dir: Some(dir),
                }
            }
        };
        let mut cfg = cfg.clone();
        if cfg.cluster.secret_file.is_empty() {
            cfg.cluster.secret_file = file.make_secret()?;
        }
        let text = toml::to_string_pretty(&cfg)
            .map_err(|e| format!("cannot write the configuration as TOML: {e}"))?;
        std::fs::write(&file.path, text)
            .map_err(|e| format!("cannot write the cluster file {}: {e}", file.path.display()))?;
        Ok(file)
    }

    /// Creates the cluster secret beside the cluster file (`NAME.secret`, readable only by
    /// this user) and returns its name relative to the cluster file. A kept cluster file's
    /// secret from an earlier launch is used again.
    fn make_secret(&self) -> Result<String, String> {
        let name = format!(
            "{}.secret",
            self.path
                .file_name()
                .map_or("cluster".into(), |n| n.to_string_lossy())
        );
        let path = self.path.with_file_name(&name);
        if path.exists() {
            ClusterSecret::load(&path)?;
        } else {
            ClusterSecret::create_file(&path)?;
        }
        Ok(name)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ClusterFile {
    fn drop(&mut self) {
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A new, empty directory under the system's temporary directory. `create_dir` fails if the
/// name exists, so a directory is never shared with another launch.
fn make_temp_dir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    let mut last_error = None;
    for _ in 0..16 {
        let dir = base.join(format!(
            "qstore-cluster-{}-{:016x}",
            std::process::id(),
            random_u64()
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last_error = Some(e),
        }
    }
    Err(format!(
        "cannot create a temporary directory in {}: {}",
        base.display(),
        last_error.map_or_else(String::new, |e| e.to_string())
    ))
}

// ---------------------------------------------------------------------------------------
// Starting processes and waiting for them

/// The line a server prints on stdout once it serves.
fn ready_line(node: usize) -> String {
    crate::distributed::ready_line(node as u32)
}

/// Where a server's stdout reader reports the lines the launcher follows.
struct ServerLines {
    /// The partition the server holds.
    partition: u32,
    /// The server's ready line: its node.
    ready: Sender<usize>,
    /// A replicated server's "leads partition" line: (partition, node).
    leads: Sender<(u32, usize)>,
}

/// Starts `qstore server` for `node`. Its output goes to our stderr, line by line, prefixed
/// with the node; the stdout reader reports the ready and leadership lines on `lines`.
fn spawn_server(
    program: &Program,
    cluster_file: &Path,
    node: usize,
    opts: &LaunchOptions,
    lines: ServerLines,
) -> Result<Proc, String> {
    let mut cmd = program.command("server", cluster_file);
    cmd.arg("--node")
        .arg(node.to_string())
        .args(&opts.server_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(port) = opts.redis_port {
        cmd.arg("--redis")
            .arg(format!("127.0.0.1:{}", port as usize + node));
    }
    let name = format!("node {node}");
    let mut proc = Proc::spawn(name.clone(), &mut cmd)?;
    let prefix = format!("[{name}] ");
    let expected = ready_line(node);
    let leads = crate::distributed::leader_line(node as u32, lines.partition);
    if let Some(out) = proc.child.stdout.take() {
        proc.forward(out, prefix.clone(), move |line| {
            // The receivers may be gone (startup over, no fault to inject): no answer needed.
            if line == expected {
                let _ = lines.ready.send(node);
            } else if line == leads {
                let _ = lines.leads.send((lines.partition, node));
            }
        })?;
    }
    if let Some(err) = proc.child.stderr.take() {
        let tail = proc.stderr_tail.clone();
        proc.forward(err, prefix, move |line| {
            let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line.to_string());
        })?;
    }
    Ok(proc)
}

/// Starts `qstore client` with the caller's flags. Its stdout and stderr are ours: the
/// results table prints as in an embedded run, and a progress bar still sees a terminal.
fn spawn_client(
    program: &Program,
    cluster_file: &Path,
    client_args: &[OsString],
) -> Result<Proc, String> {
    let mut cmd = program.command("client", cluster_file);
    cmd.args(client_args).stdin(Stdio::null());
    Proc::spawn("client".into(), &mut cmd)
}

enum Startup {
    Ready,
    Interrupted,
}

/// Why the servers did not all become ready, and which nodes to show the stderr of.
struct StartFailure {
    message: String,
    nodes: Vec<usize>,
}

impl StartFailure {
    /// The message with the last stderr lines of the nodes concerned (call once they are
    /// stopped, so that their output has been read to the end).
    fn explain(&self, servers: &Children) -> String {
        let mut text = self.message.clone();
        for &node in &self.nodes {
            let tail = servers.procs[node].stderr_lines();
            if tail.is_empty() {
                text.push_str(&format!("\nnode {node} wrote nothing on stderr"));
            } else {
                text.push_str(&format!("\nlast lines of node {node}'s stderr:"));
                for line in tail {
                    text.push_str(&format!("\n  {line}"));
                }
            }
        }
        text
    }
}

/// Waits until every server has printed its ready line. Fails as soon as one exits (a
/// server never exits on its own while starting or serving) or when `timeout` passes.
fn wait_ready(
    servers: &mut Children,
    ready: &Receiver<usize>,
    timeout: Duration,
    interrupted: &AtomicBool,
) -> Result<Startup, StartFailure> {
    let deadline = Instant::now() + timeout;
    let mut is_ready = vec![false; servers.procs.len()];
    loop {
        if interrupted.load(Ordering::Relaxed) {
            return Ok(Startup::Interrupted);
        }
        match ready.recv_timeout(POLL) {
            Ok(node) => {
                is_ready[node] = true;
                if is_ready.iter().all(|&r| r) {
                    return Ok(Startup::Ready);
                }
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
            // Every stdout is closed: the exit check below finds out why.
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(POLL),
        }
        if let Some((node, status)) = servers.first_exited() {
            // A Ctrl-C in the terminal reaches the servers too: that exit is no failure.
            if interrupted.load(Ordering::Relaxed) {
                return Ok(Startup::Interrupted);
            }
            return Err(StartFailure {
                message: format!("node {node} exited ({status}) while the cluster was starting"),
                nodes: vec![node],
            });
        }
        if Instant::now() >= deadline {
            let late: Vec<usize> = (0..is_ready.len()).filter(|&n| !is_ready[n]).collect();
            let names: Vec<String> = late.iter().map(|n| format!("node {n}")).collect();
            return Err(StartFailure {
                message: format!(
                    "servers not ready within {:.1} s: {}",
                    timeout.as_secs_f64(),
                    names.join(", ")
                ),
                nodes: late,
            });
        }
    }
}

/// Waits for the client to exit; `None` if the launch is interrupted (a client stopped by
/// the same Ctrl-C counts as interrupted, not as its exit code). A server that exits
/// meanwhile is reported at once (the client will likely fail too, and this says why),
/// except the one `fault` killed.
fn wait_client(
    client: &mut Children,
    servers: &mut Children,
    fault: &mut Option<Fault<'_>>,
    interrupted: &AtomicBool,
) -> Option<ExitStatus> {
    let mut reported = vec![false; servers.procs.len()];
    let client_started = Instant::now();
    loop {
        let status = client.procs[0].exited();
        if interrupted.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(f) = fault.as_mut() {
            f.poll(client_started, servers);
            if let Some(node) = f.killed {
                reported[node] = true;
            }
        }
        if status.is_some() {
            if let Some(f) = fault.as_mut() {
                f.finish();
            }
            return status;
        }
        for (node, server) in servers.procs.iter_mut().enumerate() {
            if reported[node] {
                continue;
            }
            if let Some(status) = server.exited() {
                eprintln!("node {node} exited ({status}) while the client was running");
                reported[node] = true;
            }
        }
        std::thread::sleep(POLL);
    }
}

/// The fault a launch injects ([`KillLeader`]), and what it saw of the servers' leadership.
struct Fault<'a> {
    plan: KillLeader,
    /// The servers' "leads partition" lines: (partition, node).
    lines: Receiver<(u32, usize)>,
    /// By partition: the server that last said it leads.
    leader: Vec<Option<usize>>,
    /// The server killed, and when.
    killed: Option<usize>,
    killed_at: Option<Instant>,
    /// When another server of the group said it leads, after the kill.
    replaced: bool,
    /// Starts a server again (`restart_after`), and whether it did.
    respawn: Respawn<'a>,
    restarted: bool,
}

type Respawn<'a> = Box<dyn FnMut(usize) -> Result<Proc, String> + 'a>;

impl<'a> Fault<'a> {
    fn new(
        plan: KillLeader,
        lines: Receiver<(u32, usize)>,
        partitions: u32,
        respawn: Respawn<'a>,
    ) -> Fault<'a> {
        Fault {
            plan,
            lines,
            leader: vec![None; partitions as usize],
            killed: None,
            killed_at: None,
            replaced: false,
            respawn,
            restarted: false,
        }
    }

    /// Follows the leadership lines, and kills the leader when it is time (once one is
    /// known).
    fn poll(&mut self, client_started: Instant, servers: &mut Children) {
        let p = self.plan.partition;
        while let Ok((partition, node)) = self.lines.try_recv() {
            self.leader[partition as usize] = Some(node);
            if let Some(at) = self.killed_at.filter(|_| partition == p && !self.replaced) {
                self.replaced = true;
                eprintln!(
                    "fault: node {node} leads partition {p} {:.0} ms after its leader was killed",
                    at.elapsed().as_secs_f64() * 1e3
                );
            }
        }
        if let (Some(node), Some(at)) = (self.killed, self.killed_at) {
            return self.restart_if_due(node, at, servers);
        }
        if client_started.elapsed() < self.plan.after {
            return;
        }
        let Some(node) = self.leader[p as usize] else {
            return; // no leader announced yet: kill once there is one
        };
        servers.procs[node].kill();
        self.killed = Some(node);
        self.killed_at = Some(Instant::now());
        eprintln!(
            "fault: killed node {node}, the leader of partition {p}, with SIGKILL {:.1} s \
             after the client started",
            client_started.elapsed().as_secs_f64()
        );
    }

    /// Starts the killed server again once `restart_after` passed since the kill.
    fn restart_if_due(&mut self, node: usize, killed_at: Instant, servers: &mut Children) {
        let due = self
            .plan
            .restart_after
            .is_some_and(|d| killed_at.elapsed() >= d);
        if self.restarted || !due {
            return;
        }
        self.restarted = true;
        // Reap the killed process first: its ports are free once it is gone.
        let _ = servers.procs[node].exited();
        match (self.respawn)(node) {
            Ok(proc) => {
                servers.procs[node] = proc;
                eprintln!(
                    "fault: restarted node {node} {:.1} s after it was killed; it rejoins its \
                     group as a follower",
                    killed_at.elapsed().as_secs_f64()
                );
            }
            Err(e) => eprintln!("fault: cannot restart node {node}: {e}"),
        }
    }

    /// Says what did not happen by the end of the run.
    fn finish(&self) {
        let p = self.plan.partition;
        if self.killed.is_none() {
            eprintln!(
                "fault: NOT injected: the client ended before --kill-leader-after-ms, or \
                 partition {p} never announced a leader"
            );
        } else if !self.replaced {
            eprintln!("fault: no other server announced it leads partition {p} before the end");
        }
    }
}

/// Stops the client (if started) and the servers after an interruption.
fn stop_interrupted(client: Option<&mut Children>, servers: &mut Children) -> i32 {
    eprintln!("interrupted; stopping all processes...");
    if let Some(client) = client {
        client.stop();
    }
    servers.stop();
    INTERRUPTED
}

/// Servers exit 0 on SIGTERM; anything else (a crash, a refusal to stop) is worth a line,
/// except for the server a fault killed.
fn report_failed_servers(servers: &mut Children, killed: Option<usize>) {
    for (node, proc) in servers.procs.iter_mut().enumerate() {
        if Some(node) == killed {
            continue;
        }
        match proc.status {
            Some(status) if status.success() => {}
            Some(status) => eprintln!("{} exited with {status}", proc.name),
            None => eprintln!("{} could not be waited for", proc.name),
        }
    }
}

/// The client's exit code; a client killed by a signal counts as the shell does (128 + it).
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

// ---------------------------------------------------------------------------------------
// Owned child processes

/// One process the launcher started, with the threads that forward its output.
struct Proc {
    /// "node 3" or "client", for messages.
    name: String,
    child: Child,
    /// Set once the process has been reaped.
    status: Option<ExitStatus>,
    forwarders: Vec<JoinHandle<()>>,
    /// The last lines it wrote on stderr, when stderr is forwarded.
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl Proc {
    fn spawn(name: String, cmd: &mut Command) -> Result<Proc, String> {
        let child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start {name} ({}): {e}",
                cmd.get_program().to_string_lossy()
            )
        })?;
        Ok(Proc {
            name,
            child,
            status: None,
            forwarders: Vec::new(),
            stderr_tail: Arc::default(),
        })
    }

    /// Copies `pipe` to our stderr line by line behind `prefix` (one write per line, so
    /// lines of different processes do not mix), handing each line to `on_line`. It keeps
    /// reading when our stderr fails: a child blocked on a full pipe would never stop.
    fn forward(
        &mut self,
        pipe: impl Read + Send + 'static,
        prefix: String,
        mut on_line: impl FnMut(&str) + Send + 'static,
    ) -> Result<(), String> {
        let thread = std::thread::Builder::new()
            .name(format!("{}-output", self.name))
            .spawn(move || {
                let mut reader = BufReader::new(pipe);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match reader.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let text = String::from_utf8_lossy(&buf);
                    let line = text.trim_end_matches(['\n', '\r']);
                    let _ = writeln!(io::stderr().lock(), "{prefix}{line}");
                    on_line(line);
                }
            })
            .map_err(|e| format!("cannot start a thread to read {}'s output: {e}", self.name))?;
        self.forwarders.push(thread);
        Ok(())
    }

    /// The exit status if the process has exited (reaping it), `None` while it runs.
    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            // An error means it cannot be waited for (it is not our child any more); the
            // stop below still kills and waits for it once.
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Asks the process to stop (SIGTERM), if it still runs.
    fn terminate(&mut self) {
        if self.exited().is_none() {
            send_sigterm(self.child.id());
        }
    }

    /// SIGKILL and reap, for a process that did not stop when asked.
    fn kill(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }

    /// The last lines it wrote on stderr (when stderr was forwarded).
    fn stderr_lines(&self) -> Vec<String> {
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect()
    }
}

/// Sends SIGTERM to `pid`, which must be a child not yet reaped. The standard library only
/// sends SIGKILL, which would give servers no chance to shut down cleanly.
fn send_sigterm(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes two integers and reads or writes no memory of this process, so
    // it cannot break memory safety. The callers have just seen (try_wait) that the child is
    // not reaped, so its pid still names it and not a recycled, unrelated process.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}

/// The processes of one role (the servers, or the client). Dropping it stops them, so no
/// return path, error or panic leaves a process behind.
#[derive(Default)]
struct Children {
    procs: Vec<Proc>,
}

impl Children {
    fn push(&mut self, proc: Proc) {
        self.procs.push(proc);
    }

    /// The first process (by index) that has exited, with its status.
    fn first_exited(&mut self) -> Option<(usize, ExitStatus)> {
        self.procs
            .iter_mut()
            .enumerate()
            .find_map(|(i, p)| p.exited().map(|s| (i, s)))
    }

    /// Stops every process still running: SIGTERM to all at once, up to [`STOP_GRACE`] for
    /// them to exit, then SIGKILL. Reaps them all and waits for their output to be copied.
    /// Calling it again does nothing.
    fn stop(&mut self) {
        self.stop_within(STOP_GRACE);
    }

    fn stop_within(&mut self, grace: Duration) {
        self.procs.iter_mut().for_each(Proc::terminate);
        let deadline = Instant::now() + grace;
        while self.procs.iter_mut().any(|p| p.exited().is_none()) && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        for proc in &mut self.procs {
            if proc.exited().is_none() {
                eprintln!(
                    "{} did not stop within {} s; killing it",
                    proc.name,
                    grace.as_secs_f64()
                );
                proc.kill();
            }
            // The pipes close when the process exits, so these end.
            for thread in proc.forwarders.drain(..) {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------------------
// Signals

/// SIGINT and SIGTERM set the interruption flag while a launch runs, so that it stops its
/// processes before returning. A second signal exits at once with [`INTERRUPTED`], in case
/// stopping hangs. Dropping this removes the handlers.
struct SignalFlags {
    ids: Vec<signal_hook::SigId>,
}

impl SignalFlags {
    fn register(flag: &Arc<AtomicBool>) -> Result<SignalFlags, String> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::flag;
        let mut flags = SignalFlags { ids: Vec::new() };
        for signal in [SIGINT, SIGTERM] {
            let error = |e: io::Error| format!("cannot handle signal {signal}: {e}");
            // The exit must come first: it looks at the flag before the second action sets
            // it, so only a signal arriving when the flag is already set exits.
            let exit = flag::register_conditional_shutdown(signal, INTERRUPTED, flag.clone());
            flags.ids.push(exit.map_err(error)?);
            flags
                .ids
                .push(flag::register(signal, flag.clone()).map_err(error)?);
        }
        Ok(flags)
    }
}

impl Drop for SignalFlags {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory removed at the end of a test.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new() -> TestDir {
            TestDir(make_temp_dir().unwrap())
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A shell script standing in for the qstore binary: `$1` is the subcommand, `$3` the
    /// cluster file, `$5` the node of a server, `$4...` the client's flags.
    fn stand_in(dir: &TestDir, script: &str) -> Program {
        let path = dir.0.join("qstore.sh");
        std::fs::write(&path, script).unwrap();
        Program {
            exe: "/bin/sh".into(),
            leading_args: vec![path.into()],
        }
    }

    /// A server that records its pid, writes a line on stderr, says it is ready and serves
    /// until SIGTERM.
    fn server_script(dir: &TestDir) -> String {
        format!(
            r#"
            [ -f "$3" ] || exit 8
            echo $$ > "{dir}/server-$5.pid"
            echo "node $5 loading" >&2
            trap 'exit 0' TERM
            echo "qstore server: node $5 ready"
            while :; do sleep 0.05; done
            "#,
            dir = dir.0.display()
        )
    }

    fn small_config(nodes: u32) -> RunConfig {
        let mut cfg = RunConfig::default();
        cfg.cluster.nodes = nodes;
        cfg
    }

    fn options() -> LaunchOptions {
        LaunchOptions {
            ready_timeout: Duration::from_secs(20),
            ..LaunchOptions::default()
        }
    }

    /// Whether the process `pid` is gone (exited and reaped).
    fn gone(pid: &str) -> bool {
        !Path::new(&format!("/proc/{}", pid.trim())).exists()
    }

    fn server_pids(dir: &TestDir, nodes: usize) -> Vec<String> {
        (0..nodes)
            .map(|n| std::fs::read_to_string(dir.0.join(format!("server-{n}.pid"))).unwrap())
            .collect()
    }

    #[test]
    fn picked_ports_are_distinct() {
        let ports = pick_ports(16).unwrap();
        assert_eq!(ports.len(), 16);
        assert!(ports.iter().all(|&p| p != 0));
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
    }

    #[test]
    fn cluster_file_parses_back_with_the_addresses() {
        let cfg = with_local_addresses(small_config(3)).unwrap();
        assert_eq!(cfg.cluster.addresses.len(), 3);
        assert_ne!(cfg.cluster.cluster_id, 0);
        let file = ClusterFile::write(&cfg, None).unwrap();
        let text = std::fs::read_to_string(file.path()).unwrap();
        let mut back = RunConfig::from_toml(&text).unwrap();
        // A new secret, private, beside the cluster file.
        assert_eq!(back.cluster.secret_file, "cluster.toml.secret");
        ClusterSecret::load(&file.path().with_file_name("cluster.toml.secret")).unwrap();
        back.cluster.secret_file.clear();
        assert_eq!(back, cfg);
        assert_eq!(back.socket_addresses().unwrap().len(), 3);
        let dir = file.temp_dir.clone().unwrap();
        drop(file);
        assert!(!dir.exists(), "the temporary cluster file is removed");
    }

    #[test]
    fn a_named_cluster_file_is_kept_and_ids_fit_in_toml() {
        let dir = TestDir::new();
        let path = dir.0.join("cluster.toml");
        let mut cfg = small_config(2);
        cfg.cluster.cluster_id = random_cluster_id() | (1 << 62);
        let cfg = with_local_addresses(cfg).unwrap();
        drop(ClusterFile::write(&cfg, Some(&path)).unwrap());
        let back = RunConfig::from_toml(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back.cluster.cluster_id, cfg.cluster.cluster_id);
        // The kept file's secret is kept too, and used again by the next launch.
        let secret = dir.0.join("cluster.toml.secret");
        let before = std::fs::read(&secret).unwrap();
        drop(ClusterFile::write(&cfg, Some(&path)).unwrap());
        assert_eq!(std::fs::read(&secret).unwrap(), before);
        assert!((0..100).all(|_| random_cluster_id() <= i64::MAX as u64));
    }

    #[test]
    fn an_invalid_configuration_is_refused_before_any_port_is_taken() {
        let err = with_local_addresses(small_config(0)).unwrap_err();
        assert!(err.contains("cluster.nodes"), "{err}");
    }

    #[test]
    fn dropping_children_kills_and_reaps_them() {
        let mut children = Children::default();
        children.push(Proc::spawn("sleeper".into(), Command::new("sleep").arg("30")).unwrap());
        let pid = children.procs[0].child.id().to_string();
        assert!(children.procs[0].exited().is_none());
        let started = Instant::now();
        drop(children);
        assert!(gone(&pid), "sleep {pid} still exists");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn stop_asks_with_sigterm_then_kills() {
        let mut children = Children::default();
        children.push(Proc::spawn("polite".into(), Command::new("sleep").arg("30")).unwrap());
        // Ignores SIGTERM (the ignored disposition survives exec).
        let stubborn = Command::new("sh")
            .args(["-c", "trap '' TERM; exec sleep 30"])
            .spawn()
            .unwrap();
        children.push(Proc {
            name: "stubborn".into(),
            child: stubborn,
            status: None,
            forwarders: Vec::new(),
            stderr_tail: Arc::default(),
        });
        // Once the shell has become `sleep`, its trap is in place.
        let comm = format!("/proc/{}/comm", children.procs[1].child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&comm).unwrap_or_default().trim() != "sleep"
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        children.stop_within(Duration::from_millis(300));
        let signal = |i: usize| children.procs[i].status.and_then(|s| s.signal());
        assert_eq!(signal(0), Some(libc::SIGTERM));
        assert_eq!(signal(1), Some(libc::SIGKILL));
    }

    #[test]
    fn a_signal_during_a_launch_sets_the_flag_instead_of_ending_the_process() {
        let flag = Arc::new(AtomicBool::new(false));
        let flags = SignalFlags::register(&flag).unwrap();
        signal_hook::low_level::raise(libc::SIGTERM).unwrap();
        assert!(flag.load(Ordering::Relaxed));
        drop(flags);
    }

    #[test]
    fn launch_runs_the_client_against_ready_servers_and_stops_them() {
        let dir = TestDir::new();
        let script = format!(
            r#"
            case "$1" in
            server) {server} ;;
            client)
                [ -f "$3" ] || exit 8
                echo "$3" > "{dir}/client-saw"
                [ "$4" = "--verify" ] || exit 9
                exit 7 ;;
            esac
            exit 99
            "#,
            server = server_script(&dir),
            dir = dir.0.display()
        );
        let program = stand_in(&dir, &script);
        let opts = LaunchOptions {
            client_args: vec!["--verify".into()],
            ..options()
        };
        let code = launch_with(&program, small_config(3), &opts, &AtomicBool::new(false));
        assert_eq!(code, Ok(7), "the client's exit code is returned");
        for pid in server_pids(&dir, 3) {
            assert!(gone(&pid), "server {pid} still exists");
        }
        let cluster_file = std::fs::read_to_string(dir.0.join("client-saw")).unwrap();
        assert!(
            !Path::new(cluster_file.trim()).exists(),
            "temporary file removed"
        );
    }

    #[test]
    fn a_server_failing_to_start_is_named_with_its_stderr() {
        let dir = TestDir::new();
        let script = format!(
            r#"
            if [ "$1" = server ] && [ "$5" = 1 ]; then
                echo "cannot bind 127.0.0.1:1: address in use" >&2
                exit 3
            fi
            case "$1" in server) {server} ;; client) exit 0 ;; esac
            "#,
            server = server_script(&dir)
        );
        let program = stand_in(&dir, &script);
        let err = launch_with(
            &program,
            small_config(3),
            &options(),
            &AtomicBool::new(false),
        )
        .unwrap_err();
        assert!(err.contains("node 1 exited (exit status: 3)"), "{err}");
        assert!(err.contains("cannot bind 127.0.0.1:1"), "{err}");
        for pid in std::fs::read_dir(&dir.0).unwrap().filter_map(|e| {
            let path = e.unwrap().path();
            let pid = path.extension().is_some_and(|x| x == "pid");
            pid.then(|| std::fs::read_to_string(path).unwrap())
        }) {
            assert!(gone(&pid), "server {pid} still exists");
        }
    }

    #[test]
    fn servers_that_never_get_ready_time_out() {
        let dir = TestDir::new();
        let script = r#"
            echo "node $5 still loading" >&2
            while :; do sleep 0.05; done
        "#;
        let program = stand_in(&dir, script);
        let opts = LaunchOptions {
            ready_timeout: Duration::from_millis(300),
            ..options()
        };
        let started = Instant::now();
        let err =
            launch_with(&program, small_config(2), &opts, &AtomicBool::new(false)).unwrap_err();
        assert!(
            err.contains("not ready within 0.3 s: node 0, node 1"),
            "{err}"
        );
        assert!(err.contains("node 1 still loading"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn an_interrupted_launch_stops_the_client_and_servers() {
        let dir = TestDir::new();
        let script = format!(
            r#"
            case "$1" in
            server) {server} ;;
            client)
                echo $$ > "{dir}/client.pid"
                while :; do sleep 0.05; done ;;
            esac
            "#,
            server = server_script(&dir),
            dir = dir.0.display()
        );
        let program = stand_in(&dir, &script);
        let interrupted = Arc::new(AtomicBool::new(false));
        let client_pid = dir.0.join("client.pid");
        let interrupter = {
            let (interrupted, client_pid) = (interrupted.clone(), client_pid.clone());
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                while !client_pid.exists() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                interrupted.store(true, Ordering::Relaxed);
            })
        };
        let code = launch_with(&program, small_config(2), &options(), &interrupted);
        interrupter.join().unwrap();
        assert_eq!(code, Ok(INTERRUPTED));
        let client = std::fs::read_to_string(&client_pid).unwrap();
        assert!(gone(&client), "client {client} still exists");
        for pid in server_pids(&dir, 2) {
            assert!(gone(&pid), "server {pid} still exists");
        }
    }
}
