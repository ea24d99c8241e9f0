//! A replica group's log kept in ZooKeeper, as Calvin's paper replicates its input: the
//! group's members are clients of a ZooKeeper service, which is itself the replicated part,
//! so there are no elections and no messages between members.
//!
//! The log of group `p` is the znode `<root>/g<p>`. Its leader, fixed for the whole run, is
//! the group's member of cluster instance 0: it creates the znode at start, leads in term 1,
//! and appends each proposal as persistent sequential children `e-NNNNNNNNNN` (ZooKeeper
//! numbers them; a single creator gets consecutive numbers from 0), from one writer thread,
//! so the log holds them in the order they were proposed. Every member, the leader included,
//! reads the children in order from `e-0000000000` on and hands each entry to its
//! [`Applier`]. When the leader stops, it deletes the log.
//!
//! A child's data is a header of [`HEADER`] bytes, then the entry's payload compressed as
//! [`codec`] says (or a piece of it): the proposer's `NodeId` (u32, little-endian), the codec
//! byte, and flags: `MORE` = 1 (the entry goes on in the next child) and `CONT` = 2 (this
//! child continues the entry of the child before). ZooKeeper refuses a znode over about 1 MiB
//! (`jute.maxbuffer`), so an entry longer than [`MAX_ZNODE`] spreads over several
//! consecutive children, and readers put it back together. What a reader gets from the
//! server is untrusted: a child that is not part of a well-formed entry is skipped with an
//! error.
//!
//! The client is the synchronous `zookeeper` crate: a client that loses its server for a
//! session timeout ends its session for good, so a member replaces it by a new one, logging
//! the loss and retrying with back-off for as long as it runs.

use super::{codec, Applier, GroupLog, ReplMsg};
use ::zookeeper::{
    Acl, CreateMode, WatchedEvent, ZkError, ZkResult, ZkState, ZooKeeper, ZooKeeperExt,
};
use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::Mutex;
use qstore_core::config::ReplicationCompression;
use qstore_core::placement::Placement;
use qstore_core::{NodeId, QError};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The only term of a ZooKeeper-backed group: its leader never changes.
const TERM: u64 = 1;
/// The session timeout a member asks of ZooKeeper.
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a member waits for ZooKeeper to answer a new client.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// How long a member waits at start for a server that does not answer, and a follower for
/// its leader to create the group's log.
const START_WAIT: Duration = Duration::from_secs(30);
/// How often a reader waiting for the next entry looks again, should its watch be lost (a
/// new session does not keep the old one's watches).
const POLL: Duration = Duration::from_millis(20);
/// The first and the longest pause between two tries of a failed request.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long a stopping leader spends deleting its group's log, and with how many requests in
/// flight (a long run leaves many children, deleted one request each).
const DELETE_WAIT: Duration = Duration::from_secs(20);
const DELETERS: usize = 8;

/// The longest data of a child: ZooKeeper refuses requests over `jute.maxbuffer` (1 MiB less
/// a byte by default), the path and the ACL included.
pub const MAX_ZNODE: usize = 1_000_000;
/// Bytes of a child's header: proposer (4), codec (1), flags (1).
pub const HEADER: usize = 6;
/// The longest entry a reader puts together, or decompresses.
pub const MAX_ENTRY: usize = 64 << 20;
/// Flag: the entry goes on in the next child.
const MORE: u8 = 1;
/// Flag: this child continues the entry of the child before.
const CONT: u8 = 2;

/// A server's member of its partition's replica group, whose log ZooKeeper keeps.
pub struct ZkMember {
    me: NodeId,
    /// How this member compresses what it proposes.
    compression: ReplicationCompression,
    /// Whether this member leads its group (for the whole run).
    leads: bool,
    shared: Arc<Shared>,
    /// Proposals for the writer thread (the leader's only): codec byte and payload.
    inputs: Mutex<Option<Sender<Proposal>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A proposal for the writer: the codec byte, and the payload.
type Proposal = (u8, Vec<u8>);

/// What a member shares with its threads.
struct Shared {
    session: Session,
    /// The group's log: `<root>/g<p>`.
    log: String,
    /// Proposals taken and not yet written (or given up).
    pending: AtomicU64,
    /// One past the number of the last child the writer created.
    written: AtomicU64,
    /// The number of the next child the reader is to read: every one before is applied or
    /// skipped.
    applied: AtomicU64,
    /// Whether the reader found no next child and holds no part of an entry.
    caught_up: AtomicBool,
}

impl ZkMember {
    /// Starts `me`'s member of its partition's group, whose log is under `root` (the same
    /// for every member of a cluster, e.g. `/qstore/run-1a2b3c`) in the ZooKeeper service at
    /// `address` (`host:port`). The group's leader (its member of instance 0) creates the
    /// log, and refuses to start if one is there already; the other members wait for it
    /// (30 s at most). Every member records the leader in `placement` and tells `applier`,
    /// which then gets every entry of the log, in order; the leader compresses what it
    /// proposes with `compression`.
    pub fn start(
        me: NodeId,
        placement: Arc<Placement>,
        address: &str,
        root: &str,
        compression: ReplicationCompression,
        applier: Arc<dyn Applier>,
    ) -> Result<ZkMember, QError> {
        let p = placement.partition_of(me);
        let leader = placement.server(0, p);
        let root = checked_root(root)?;
        let log = format!("{root}/g{}", p.0);
        let session = Session::open(address)?;
        let leads = me == leader;
        let ready = if leads {
            create_log(&session, &root, &log, &stamp(me))
        } else {
            await_log(&session, &log, me, leader)
        };
        if let Err(e) = ready {
            session.close();
            return Err(e);
        }
        placement.set_leader(p, Some(leader));
        applier.leader_changed(Some(leader));
        let member = ZkMember {
            me,
            compression,
            leads,
            shared: Arc::new(Shared {
                session,
                log,
                pending: AtomicU64::new(0),
                written: AtomicU64::new(0),
                applied: AtomicU64::new(0),
                caught_up: AtomicBool::new(false),
            }),
            inputs: Mutex::new(None),
            threads: Mutex::new(Vec::new()),
        };
        if let Err(e) = member.spawn_threads(applier) {
            member.stop();
            return Err(e);
        }
        Ok(member)
    }

    fn spawn_threads(&self, applier: Arc<dyn Applier>) -> Result<(), QError> {
        let reader = Reader {
            me: self.me,
            shared: self.shared.clone(),
            applier,
            assembler: Assembler::default(),
        };
        self.spawn(format!("zkr{}", self.me.0), move || reader.run())?;
        if self.leads {
            let (tx, rx) = unbounded();
            let writer = Writer {
                me: self.me,
                shared: self.shared.clone(),
                next: 0,
            };
            self.spawn(format!("zkw{}", self.me.0), move || writer.run(rx))?;
            *self.inputs.lock() = Some(tx);
        }
        Ok(())
    }

    fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> Result<(), QError> {
        let t = std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .map_err(|e| QError::Other(format!("cannot start a replication thread: {e}")))?;
        self.threads.lock().push(t);
        Ok(())
    }

    /// Deletes the group's log and its children, best effort: ZooKeeper does not keep old
    /// runs' logs.
    fn remove_log(&self) {
        let shared = &self.shared;
        let log = &shared.log;
        let address = &shared.session.address;
        let client = shared.session.current().map(Ok).unwrap_or_else(|| {
            // The session ended (ZooKeeper was away): one more try, briefly.
            let stop = AtomicBool::new(false);
            Client::connect(address, Duration::from_secs(2), &stop).map(Arc::new)
        });
        let outcome = client.and_then(|client| {
            let end = shared.written.load(Ordering::Acquire);
            let end = end.max(shared.applied.load(Ordering::Acquire));
            let children: Vec<String> = (0..end).map(|i| child(log, i)).collect();
            delete_all(&client.zk, &children, Instant::now() + DELETE_WAIT)?;
            // What is left: children another client created, and the log itself.
            client
                .zk
                .delete_recursive(log)
                .map_err(|e| format!("{e:?}"))
        });
        if let Err(why) = outcome {
            tracing::warn!(
                "node {}: could not delete the group's log {log} from ZooKeeper at {address} \
                 ({why}); delete it with `zkCli.sh -server {address} deleteall {log}`",
                self.me
            );
        }
    }
}

impl GroupLog for ZkMember {
    /// Term 1 on the group's leader (its log is ready once it started), until it stops.
    fn leading_term(&self) -> Option<u64> {
        (self.leads && !self.shared.session.stopping()).then_some(TERM)
    }

    /// Appends `data` to the log, compressed on the calling thread, if this member leads
    /// and `term` is its term; otherwise the proposal is dropped.
    fn propose_in_term(&self, term: u64, data: Vec<u8>) {
        if term != TERM || self.leading_term().is_none() {
            tracing::debug!("node {}: a proposal of term {term} dropped", self.me);
            return;
        }
        let (codec, payload) = codec::pack(self.compression, data);
        if let Some(tx) = &*self.inputs.lock() {
            self.shared.pending.fetch_add(1, Ordering::AcqRel);
            if tx.send((codec, payload)).is_err() {
                self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn receive(&self, from: NodeId, _: ReplMsg) {
        tracing::error!(
            "node {}: a message from node {from} dropped: the members of a group whose log \
             ZooKeeper keeps send each other none",
            self.me
        );
    }

    /// The leader: every proposal written, and applied here; any member: no child left to
    /// read that it could see.
    fn settled(&self) -> bool {
        let s = &self.shared;
        if !self.leads {
            return s.caught_up.load(Ordering::Acquire);
        }
        // `pending` first: the writer counts a child written before it drops the proposal.
        s.pending.load(Ordering::Acquire) == 0
            && s.applied.load(Ordering::Acquire) >= s.written.load(Ordering::Acquire)
            && s.caught_up.load(Ordering::Acquire)
    }

    /// Stops the threads; the leader then deletes its group's log. The session ends.
    fn stop(&self) {
        let first = !self.shared.session.stopping.swap(true, Ordering::AcqRel);
        self.inputs.lock().take();
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            if t.join().is_err() {
                tracing::error!("node {}: a replication thread panicked", self.me);
            }
        }
        if first {
            if self.leads {
                self.remove_log();
            }
            self.shared.session.close();
        }
    }
}

impl Drop for ZkMember {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `root` without a trailing slash (empty for `/`), if it is an absolute path.
fn checked_root(root: &str) -> Result<String, QError> {
    let trimmed = root.trim_end_matches('/');
    if !root.starts_with('/') || trimmed.contains("//") {
        return Err(QError::Other(format!(
            "the ZooKeeper root {root:?} is not an absolute znode path such as /qstore/run-1"
        )));
    }
    Ok(trimmed.to_string())
}

/// The path of child `i` of `log`.
fn child(log: &str, i: u64) -> String {
    format!("{log}/e-{i:010}")
}

/// The number ZooKeeper gave a sequential child, from its path.
fn number_of(path: &str) -> Option<u64> {
    path.rsplit_once("/e-")?.1.parse().ok()
}

/// The leader's start: `root`'s missing ancestors, and a new `log`, which holds `stamp`.
fn create_log(session: &Session, root: &str, log: &str, stamp: &str) -> Result<(), QError> {
    let deadline = Some(Instant::now() + START_WAIT);
    let address = &session.address;
    let failed = |path: &str, f: Failed| {
        QError::Other(format!(
            "cannot create {path} in ZooKeeper at {address}: {f}"
        ))
    };
    if !root.is_empty() {
        let ancestors = |zk: &ZooKeeper| zk.ensure_path(root);
        session
            .call(&|| format!("creating {root}"), deadline, ancestors)
            .map_err(|f| failed(root, f))?;
    }
    let mut tried = false;
    let create = |zk: &ZooKeeper| {
        // A create whose connection was lost may have been done: the log holding this
        // start's stamp is this start's.
        if std::mem::replace(&mut tried, true) {
            match zk.get_data(log, false) {
                Ok((found, _)) if found == stamp.as_bytes() => return Ok(()),
                Ok(_) | Err(ZkError::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
        let open = Acl::open_unsafe().clone();
        let data = stamp.as_bytes().to_vec();
        zk.create(log, data, open, CreateMode::Persistent).map(drop)
    };
    match session.call(&|| format!("creating {log}"), deadline, create) {
        Ok(()) => Ok(()),
        Err(Failed::Refused(ZkError::NodeExists)) => Err(QError::Other(format!(
            "ZooKeeper at {address} already holds a log at {log} (left by an earlier run, or \
             another cluster uses the root {root:?}): delete it with `zkCli.sh -server \
             {address} deleteall {log}`, or start the cluster with a new root"
        ))),
        Err(f) => Err(failed(log, f)),
    }
}

/// What the leader writes in its group's log znode: which start created it.
fn stamp(me: NodeId) -> String {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let pid = std::process::id();
    format!(
        "created by node {me}, process {pid}, at {}",
        since_epoch.as_nanos()
    )
}

/// A follower's start: waits until its leader created `log`.
fn await_log(session: &Session, log: &str, me: NodeId, leader: NodeId) -> Result<(), QError> {
    let deadline = Instant::now() + START_WAIT;
    let address = &session.address;
    loop {
        let exists = session.call(&|| format!("looking for {log}"), Some(deadline), |zk| {
            zk.exists(log, false)
        });
        match exists {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) => {
                return Err(QError::Other(format!(
                    "node {me}: no log at {log} in ZooKeeper at {address} after {START_WAIT:?}: \
                     the group's leader, node {leader}, creates it when it starts"
                )))
            }
            Err(f) => {
                return Err(QError::Other(format!(
                    "node {me}: cannot look for {log} in ZooKeeper at {address}: {f}"
                )))
            }
        }
    }
}

/// Deletes `paths` (missing ones are fine), `DELETERS` requests in flight, until `deadline`.
fn delete_all(zk: &ZooKeeper, paths: &[String], deadline: Instant) -> Result<(), String> {
    let next = AtomicUsize::new(0);
    let deleter = || -> Result<(), String> {
        loop {
            let Some(path) = paths.get(next.fetch_add(1, Ordering::Relaxed)) else {
                return Ok(());
            };
            if Instant::now() > deadline {
                return Err(format!("not done in {DELETE_WAIT:?}"));
            }
            match zk.delete(path, None) {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(e) => return Err(format!("deleting {path}: {e:?}")),
            }
        }
    };
    std::thread::scope(|s| {
        let deleters: Vec<_> = (0..DELETERS).map(|_| s.spawn(deleter)).collect();
        let outcomes: Vec<_> = deleters.into_iter().map(|d| d.join()).collect();
        let panicked = || Err("a deleting thread panicked".to_string());
        outcomes
            .into_iter()
            .try_for_each(|o| o.unwrap_or_else(|_| panicked()))
    })
}

/// Why a request to ZooKeeper did not succeed.
#[derive(Debug)]
enum Failed {
    /// The member is stopping.
    Stopped,
    /// ZooKeeper answered with this error.
    Refused(ZkError),
    /// ZooKeeper could not be reached before the deadline (the last problem).
    Unreachable(String),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Stopped => write!(f, "stopping"),
            Failed::Refused(e) => write!(f, "{e:?}"),
            Failed::Unreachable(why) => write!(f, "unreachable ({why})"),
        }
    }
}

/// Errors that say the connection or the session was lost, not that ZooKeeper refused the
/// request: it is tried again (after a lost connection, it may or may not have been done).
fn lost(e: ZkError) -> bool {
    matches!(
        e,
        ZkError::ConnectionLoss
            | ZkError::SessionExpired
            | ZkError::SessionMoved
            | ZkError::OperationTimeout
            | ZkError::NotReadOnly
    )
}

/// One ZooKeeper client, and whether its session ended.
struct Client {
    zk: ZooKeeper,
    /// Set once the session ended (expired, closed, or no server for a session timeout):
    /// the client never reconnects after that.
    ended: Arc<AtomicBool>,
}

impl Client {
    /// A client of the service at `address`, once it answers (within `wait`; `stop` gives
    /// up earlier).
    fn connect(address: &str, wait: Duration, stop: &AtomicBool) -> Result<Client, String> {
        // The client panics (in the calling thread) on a socket it cannot even open.
        let connect = || ZooKeeper::connect(address, SESSION_TIMEOUT, |_: WatchedEvent| {});
        let zk = std::panic::catch_unwind(std::panic::AssertUnwindSafe(connect))
            .unwrap_or(Err(ZkError::SystemError))
            .map_err(|e| format!("cannot connect to ZooKeeper at {address}: {e:?}"))?;
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        zk.add_listener(move |state| {
            let alive = matches!(
                state,
                ZkState::Connected | ZkState::ConnectedReadOnly | ZkState::Connecting
            );
            if !alive {
                flag.store(true, Ordering::Release);
            }
        });
        let client = Client { zk, ended };
        // The client connects in the background: a request answered says the session is up.
        let deadline = Instant::now() + wait;
        let mut pause = BACKOFF_MIN;
        loop {
            let e = match client.zk.exists("/", false) {
                Ok(_) => return Ok(client),
                Err(e) => e,
            };
            if Instant::now() + pause > deadline || stop.load(Ordering::Acquire) {
                client.discard();
                return Err(format!(
                    "ZooKeeper at {address} did not answer in {wait:?} ({e:?})"
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(BACKOFF_MAX / 4);
        }
    }

    /// Closes the session on another thread: closing waits for an answer, which a server
    /// that is away never sends (the client gives up after a session timeout).
    fn discard(self) {
        let closing = std::thread::Builder::new().name("zk-close".into());
        if let Err(e) = closing.spawn(move || drop(self)) {
            tracing::warn!("cannot start a thread to close a ZooKeeper session: {e}");
        }
    }
}

/// A member's session with ZooKeeper: a client, replaced by a new one (a new session) when
/// its session ends.
struct Session {
    address: String,
    client: Mutex<Option<Arc<Client>>>,
    /// Set when the member stops: requests are no longer tried again.
    stopping: AtomicBool,
    /// Whether the last request failed (so that its recovery is logged).
    troubled: AtomicBool,
}

impl Session {
    /// A session with the service at `address`, once it answers.
    fn open(address: &str) -> Result<Session, QError> {
        let stop = AtomicBool::new(false);
        let client = Client::connect(address, CONNECT_WAIT, &stop).map_err(QError::Other)?;
        Ok(Session {
            address: address.to_string(),
            client: Mutex::new(Some(Arc::new(client))),
            stopping: stop,
            troubled: AtomicBool::new(false),
        })
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// The client, if its session still lives.
    fn current(&self) -> Option<Arc<Client>> {
        let client = self.client.lock().clone();
        client.filter(|c| !c.ended.load(Ordering::Acquire))
    }

    /// The client, or a new one (a new session) if its session ended.
    fn client(&self) -> Result<Arc<Client>, String> {
        // Held while connecting: the member's other thread does not open a second session.
        let mut current = self.client.lock();
        if let Some(c) = current
            .as_ref()
            .filter(|c| !c.ended.load(Ordering::Acquire))
        {
            return Ok(c.clone());
        }
        let client = Arc::new(Client::connect(
            &self.address,
            CONNECT_WAIT,
            &self.stopping,
        )?);
        tracing::warn!("ZooKeeper at {}: a new session", self.address);
        *current = Some(client.clone());
        Ok(client)
    }

    /// Runs `op` (`what` it does, for the log) until ZooKeeper answers it, trying again with
    /// back-off while the connection or the session is lost, until the member stops or
    /// `deadline` passes.
    fn call<T>(
        &self,
        what: &dyn Fn() -> String,
        deadline: Option<Instant>,
        mut op: impl FnMut(&ZooKeeper) -> ZkResult<T>,
    ) -> Result<T, Failed> {
        let mut pause = BACKOFF_MIN;
        let mut since = Instant::now();
        loop {
            if self.stopping() {
                return Err(Failed::Stopped);
            }
            let why = match self.client() {
                Ok(client) => match op(&client.zk) {
                    Ok(v) => {
                        self.recovered();
                        return Ok(v);
                    }
                    Err(e) if lost(e) => {
                        // A client gives its session up after a session timeout without a
                        // server; one still failing long after that is broken: replaced.
                        let broken = since.elapsed() > 3 * SESSION_TIMEOUT;
                        if e == ZkError::SessionExpired || broken {
                            client.ended.store(true, Ordering::Release);
                            since = Instant::now();
                        }
                        format!("{e:?}")
                    }
                    Err(e) => return Err(Failed::Refused(e)),
                },
                Err(why) => why,
            };
            if deadline.is_some_and(|d| Instant::now() + pause > d) {
                return Err(Failed::Unreachable(why));
            }
            tracing::error!(
                "ZooKeeper at {}: {} failed ({why}); trying again in {pause:?}",
                self.address,
                what()
            );
            self.troubled.store(true, Ordering::Relaxed);
            self.nap(pause);
            pause = (pause * 2).min(BACKOFF_MAX);
        }
    }

    fn recovered(&self) {
        if self.troubled.swap(false, Ordering::Relaxed) {
            tracing::warn!("ZooKeeper at {}: answering again", self.address);
        }
    }

    /// Sleeps for `pause`, or until the member stops.
    fn nap(&self, pause: Duration) {
        let end = Instant::now() + pause;
        while !self.stopping() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(POLL));
        }
    }

    /// Ends the session (a client closes its session when dropped).
    fn close(&self) {
        let client = self.client.lock().take();
        drop(client);
    }
}

/// The children's data of an entry proposed by `proposer`: the header, then the payload, cut
/// in pieces that fit a znode.
fn chunks(proposer: NodeId, codec: u8, payload: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    let pieces = payload.len().div_ceil(MAX_ZNODE - HEADER).max(1);
    let mut rest = payload.chunks(MAX_ZNODE - HEADER);
    (0..pieces).map(move |i| {
        let piece = rest.next().unwrap_or_default();
        let flags = if i > 0 { CONT } else { 0 } | if i + 1 < pieces { MORE } else { 0 };
        let mut data = Vec::with_capacity(HEADER + piece.len());
        data.extend_from_slice(&proposer.0.to_le_bytes());
        data.extend_from_slice(&[codec, flags]);
        data.extend_from_slice(piece);
        data
    })
}

/// The leader's writer thread: appends each proposal to the log, in order.
struct Writer {
    me: NodeId,
    shared: Arc<Shared>,
    /// The number the next child should get (with a single creator).
    next: u64,
}

impl Writer {
    fn run(mut self, inputs: Receiver<Proposal>) {
        for (codec, payload) in inputs.iter() {
            if self.shared.session.stopping() {
                return;
            }
            self.write(codec, &payload);
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn write(&mut self, codec: u8, payload: &[u8]) {
        for data in chunks(self.me, codec, payload) {
            match self.create(&data) {
                Ok(n) => {
                    self.next = n + 1;
                    self.shared.written.fetch_max(self.next, Ordering::AcqRel);
                }
                Err(Failed::Stopped) => return,
                Err(f) => {
                    // Readers drop what was written of it.
                    let log = &self.shared.log;
                    tracing::error!("node {}: cannot append to {log}: {f}; entry lost", self.me);
                    return;
                }
            }
        }
    }

    /// Creates the next child with `data`: its number.
    fn create(&self, data: &[u8]) -> Result<u64, Failed> {
        let (log, expected) = (&self.shared.log, self.next);
        let prefix = format!("{log}/e-");
        let mut tried = false;
        let what = || format!("appending to {log}");
        self.shared.session.call(&what, None, |zk| {
            // A create whose connection was lost may have been done: the child it would have
            // made, holding the same data, is it.
            if std::mem::replace(&mut tried, true) {
                if let Some(n) = done_already(zk, log, expected, data)? {
                    return Ok(n);
                }
            }
            let open = Acl::open_unsafe().clone();
            let path = zk.create(
                &prefix,
                data.to_vec(),
                open,
                CreateMode::PersistentSequential,
            )?;
            Ok(number_of(&path).unwrap_or(expected))
        })
    }
}

/// `Some(n)` if child `n` of `log` holds `data`.
fn done_already(zk: &ZooKeeper, log: &str, n: u64, data: &[u8]) -> ZkResult<Option<u64>> {
    match zk.get_data(&child(log, n), false) {
        Ok((found, _)) => Ok((found == data).then_some(n)),
        Err(ZkError::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A member's reader thread: applies the log's entries, in order.
struct Reader {
    me: NodeId,
    shared: Arc<Shared>,
    applier: Arc<dyn Applier>,
    assembler: Assembler,
}

impl Reader {
    fn run(mut self) {
        // Woken by a watch on the next child.
        let (wake, woken) = unbounded::<()>();
        let mut watching = None;
        let mut next = 0u64;
        let shared = self.shared.clone();
        loop {
            let path = child(&shared.log, next);
            match self.read(&path) {
                Ok(Some(data)) => {
                    shared.caught_up.store(false, Ordering::Release);
                    self.take(next, &data);
                    next += 1;
                    shared.applied.store(next, Ordering::Release);
                }
                Ok(None) => {
                    let idle = self.assembler.idle();
                    shared.caught_up.store(idle, Ordering::Release);
                    // One watch for each child waited for; the poll covers a lost one.
                    if watching != Some(next) {
                        watching = Some(next);
                        if self.watch(&path, &wake) {
                            continue;
                        }
                    }
                    let _ = woken.recv_timeout(POLL);
                }
                Err(Failed::Stopped) => return,
                Err(f) => {
                    tracing::error!("node {}: cannot read {path}: {f}", self.me);
                    shared.session.nap(BACKOFF_MAX);
                }
            }
        }
    }

    /// The data of child `path`, if it exists.
    fn read(&self, path: &str) -> Result<Option<Vec<u8>>, Failed> {
        let what = || format!("reading {path}");
        self.shared
            .session
            .call(&what, None, |zk| match zk.get_data(path, false) {
                Ok((data, _)) => Ok(Some(data)),
                Err(ZkError::NoNode) => Ok(None),
                Err(e) => Err(e),
            })
    }

    /// Sets a watch for the creation of `path`: whether it exists already.
    fn watch(&self, path: &str, wake: &Sender<()>) -> bool {
        let what = || format!("watching {path}");
        let exists = self.shared.session.call(&what, None, |zk| {
            let wake = wake.clone();
            zk.exists_w(path, move |_: WatchedEvent| {
                let _ = wake.send(());
            })
        });
        matches!(exists, Ok(Some(_)))
    }

    /// Takes child `n`'s data, and applies the entry it completes.
    fn take(&mut self, n: u64, data: &[u8]) {
        let (me, log) = (self.me, &self.shared.log);
        let refuse = |why: String| tracing::error!("node {me}: {log}/e-{n:010} skipped: {why}");
        let Some(entry) = self.assembler.take(n, data, refuse) else {
            return;
        };
        match codec::unpack(entry.codec, &entry.payload, MAX_ENTRY) {
            Ok(data) => self
                .applier
                .committed(entry.proposer, entry.proposer == me, &data),
            Err(why) => tracing::error!(
                "node {me}: the entry of {log} from e-{:010} to e-{n:010} skipped: {why}",
                entry.first
            ),
        }
    }
}

/// A child's data, read.
struct Chunk<'a> {
    proposer: NodeId,
    codec: u8,
    flags: u8,
    body: &'a [u8],
}

impl Chunk<'_> {
    fn parse(data: &[u8]) -> Result<Chunk<'_>, String> {
        let Some((head, body)) = data.split_first_chunk::<HEADER>() else {
            return Err(format!("{} bytes, too short for a header", data.len()));
        };
        let [a, b, c, d, codec, flags] = *head;
        if flags & !(MORE | CONT) != 0 {
            return Err(format!("unknown flags {flags:#04x}"));
        }
        Ok(Chunk {
            proposer: NodeId(u32::from_le_bytes([a, b, c, d])),
            codec,
            flags,
            body,
        })
    }
}

/// A whole entry of the log, as its proposer packed it.
struct Entry {
    /// The number of its first child.
    first: u64,
    proposer: NodeId,
    codec: u8,
    payload: Vec<u8>,
}

/// Puts entries back together from the children they were cut in.
#[derive(Default)]
struct Assembler {
    /// An entry whose last child is still to come; `payload` is emptied, and the entry's
    /// children only skipped, once it is found too long.
    partial: Option<(Entry, bool)>,
}

impl Assembler {
    /// Whether no entry awaits its next child.
    fn idle(&self) -> bool {
        self.partial.is_none()
    }

    /// Takes child `n`'s data: the entry it completes, if any. What cannot be part of a
    /// well-formed entry is told to `refuse`, and skipped (with the entry it breaks off).
    fn take(&mut self, n: u64, data: &[u8], refuse: impl Fn(String)) -> Option<Entry> {
        let chunk = match Chunk::parse(data) {
            Ok(chunk) => chunk,
            Err(why) => {
                self.break_off(&refuse);
                refuse(why);
                return None;
            }
        };
        let (mut entry, mut too_long) = self.entry_of(n, &chunk, &refuse)?;
        if !too_long && entry.payload.len() + chunk.body.len() > MAX_ENTRY {
            refuse(format!("its entry is longer than {MAX_ENTRY} bytes"));
            entry.payload = Vec::new();
            too_long = true;
        }
        if !too_long {
            entry.payload.extend_from_slice(chunk.body);
        }
        if chunk.flags & MORE != 0 {
            self.partial = Some((entry, too_long));
            return None;
        }
        (!too_long).then_some(entry)
    }

    /// The entry child `n` begins, or the one under way that it continues (and whether it
    /// is too long); `None` for a child that does neither.
    fn entry_of(
        &mut self,
        n: u64,
        chunk: &Chunk<'_>,
        refuse: &impl Fn(String),
    ) -> Option<(Entry, bool)> {
        if chunk.flags & CONT == 0 {
            self.break_off(refuse);
            let (proposer, codec, payload) = (chunk.proposer, chunk.codec, Vec::new());
            return Some((
                Entry {
                    first: n,
                    proposer,
                    codec,
                    payload,
                },
                false,
            ));
        }
        match self.partial.take() {
            Some((e, too_long)) if (e.proposer, e.codec) == (chunk.proposer, chunk.codec) => {
                Some((e, too_long))
            }
            Some(other) => {
                self.partial = Some(other);
                self.break_off(refuse);
                refuse("its header differs from its entry's first child".into());
                None
            }
            None => {
                refuse("it continues an entry whose first child was not read".into());
                None
            }
        }
    }

    /// Drops the entry under way, its last child missing.
    fn break_off(&mut self, refuse: &impl Fn(String)) {
        if let Some((entry, _)) = self.partial.take() {
            refuse(format!(
                "it breaks off the entry begun at e-{:010}, which is dropped",
                entry.first
            ));
        }
    }
}

/// Whether a ZooKeeper server answers at `address` (`host:port`): its `ruok` command, which
/// a healthy server answers `imok`, within a second.
pub fn answers(address: &str) -> bool {
    use std::io::{Read, Write};
    use std::net::{TcpStream, ToSocketAddrs};
    let timeout = Duration::from_secs(1);
    let Some(addr) = address.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return false;
    };
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let mut reply = [0u8; 4];
    stream.write_all(b"ruok").is_ok() && stream.read_exact(&mut reply).is_ok() && &reply == b"imok"
}

/// Writes `requests` znodes of `payload` bytes each under `path` (created if missing; deleted
/// after, with what was written), `concurrency` in flight at once over one session to the
/// ZooKeeper service at `address`, and returns each write's latency, in no particular order:
/// a micro-benchmark of ZooKeeper itself (QR-Store's figure 4).
pub fn write_latencies(
    address: &str,
    path: &str,
    payload: usize,
    requests: usize,
    concurrency: usize,
) -> Result<Vec<Duration>, QError> {
    if payload > MAX_ZNODE {
        return Err(QError::Other(format!(
            "a znode of {payload} bytes is over ZooKeeper's limit ({MAX_ZNODE} here)"
        )));
    }
    let path = checked_root(path)?;
    if path.is_empty() {
        return Err(QError::Other(
            "write_latencies needs a path other than /".into(),
        ));
    }
    let stop = AtomicBool::new(false);
    let client = Client::connect(address, CONNECT_WAIT, &stop).map_err(QError::Other)?;
    let zk = &client.zk;
    let failed = |what: &str, e: ZkError| {
        QError::Other(format!("ZooKeeper at {address}: {what} {path}: {e:?}"))
    };
    let existed = zk
        .exists(&path, false)
        .map_err(|e| failed("looking for", e))?;
    zk.ensure_path(&path).map_err(|e| failed("creating", e))?;
    let (latencies, created, error) = timed_writes(zk, &path, payload, requests, concurrency);
    let cleaned = delete_all(zk, &created, Instant::now() + DELETE_WAIT);
    let cleaned = cleaned.and_then(|()| match existed {
        Some(_) => Ok(()),
        None => zk.delete_recursive(&path).map_err(|e| format!("{e:?}")),
    });
    if let Err(why) = cleaned {
        tracing::warn!("ZooKeeper at {address}: could not delete what was written ({why})");
    }
    match error {
        Some(e) => Err(failed("writing under", e)),
        None => Ok(latencies),
    }
}

/// `requests` sequential children of `payload` bytes created under `path` by `concurrency`
/// threads: their latencies, their paths, and the first error (which stops the writes).
fn timed_writes(
    zk: &ZooKeeper,
    path: &str,
    payload: usize,
    requests: usize,
    concurrency: usize,
) -> (Vec<Duration>, Vec<String>, Option<ZkError>) {
    let data = vec![0x5a; payload];
    let prefix = format!("{path}/w-");
    let (next, failed) = (AtomicUsize::new(0), AtomicBool::new(false));
    let writer = || {
        let (mut done, mut error) = (Vec::new(), None);
        while !failed.load(Ordering::Relaxed) && next.fetch_add(1, Ordering::Relaxed) < requests {
            let (data, open) = (data.clone(), Acl::open_unsafe().clone());
            let t = Instant::now();
            match zk.create(&prefix, data, open, CreateMode::PersistentSequential) {
                Ok(created) => done.push((t.elapsed(), created)),
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    error = Some(e);
                }
            }
        }
        (done, error)
    };
    let threads = concurrency.clamp(1, requests.max(1));
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..threads).map(|_| s.spawn(writer)).collect();
        writers.into_iter().map(|w| w.join()).collect()
    });
    let (mut latencies, mut created, mut error) = (Vec::new(), Vec::new(), None);
    for outcome in outcomes {
        let (done, e) = outcome.unwrap_or((Vec::new(), Some(ZkError::SystemError)));
        error = error.or(e);
        for (latency, path) in done {
            latencies.push(latency);
            created.push(path);
        }
    }
    (latencies, created, error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qstore_core::PartitionId;
    use std::path::PathBuf;
    use std::process::Command;

    /// Records what a member applied, and the leaders it was told of.
    #[derive(Default)]
    struct Log {
        entries: Mutex<Vec<(NodeId, Vec<u8>)>>,
        leaders: Mutex<Vec<Option<NodeId>>>,
    }

    impl Applier for Log {
        fn committed(&self, proposer: NodeId, _: bool, data: &[u8]) {
            self.entries.lock().push((proposer, data.to_vec()));
        }
        fn leader_changed(&self, leader: Option<NodeId>) {
            self.leaders.lock().push(leader);
        }
    }

    impl Log {
        fn len(&self) -> usize {
            self.entries.lock().len()
        }
    }

    /// A ZooKeeper server of its own (scripts/zookeeper.sh), stopped when dropped.
    struct Server {
        dir: PathBuf,
        port: u16,
        address: String,
    }

    const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/zookeeper.sh");

    /// Runs scripts/zookeeper.sh: its error output if it failed.
    fn script(args: &[&str], dir: &std::path::Path) -> Result<(), String> {
        let out = Command::new("bash")
            .arg(SCRIPT)
            .args(args)
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run {SCRIPT}: {e}"))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }

    impl Server {
        fn start() -> Server {
            static RUNS: AtomicUsize = AtomicUsize::new(0);
            let mut why = String::new();
            // A free port may be taken before the server binds it: a few tries.
            for _ in 0..3 {
                let run = RUNS.fetch_add(1, Ordering::Relaxed);
                let name = format!("qstore-zk-{}-{run}", std::process::id());
                let port = free_port();
                let server = Server {
                    dir: std::env::temp_dir().join(name),
                    port,
                    address: format!("127.0.0.1:{port}"),
                };
                match server.run() {
                    Ok(()) => return server,
                    Err(e) if e.contains("apt-get install") => panic!("{e}"),
                    Err(e) => why = e,
                }
            }
            panic!(
                "cannot start a ZooKeeper server (these tests need Debian's zookeeperd \
                 package: apt-get install -y zookeeperd): {why}"
            );
        }

        /// Starts the server (again, with what it stored).
        fn run(&self) -> Result<(), String> {
            script(&["start", &self.port.to_string()], &self.dir)
        }

        fn halt(&self) {
            script(&["stop"], &self.dir).unwrap();
        }

        fn client(&self) -> Client {
            Client::connect(&self.address, CONNECT_WAIT, &AtomicBool::new(false)).unwrap()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = script(&["stop"], &self.dir);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn free_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts the members of group 0 of a one-partition cluster of `replicas` copies, the
    /// followers before their leader (they wait for its log).
    fn group(
        server: &Server,
        root: &str,
        replicas: u32,
        how: ReplicationCompression,
    ) -> (Vec<ZkMember>, Vec<Arc<Log>>) {
        let placement = Arc::new(Placement::new(1, replicas));
        let logs: Vec<Arc<Log>> = (0..replicas).map(|_| Arc::default()).collect();
        let start = |n: u32| {
            let applier: Arc<dyn Applier> = logs[n as usize].clone();
            let (address, placement) = (&server.address, placement.clone());
            ZkMember::start(NodeId(n), placement, address, root, how, applier)
        };
        let members = std::thread::scope(|s| {
            let followers: Vec<_> = (1..replicas).map(|n| s.spawn(move || start(n))).collect();
            std::thread::sleep(Duration::from_millis(100));
            let mut members = vec![start(0).unwrap()];
            members.extend(followers.into_iter().map(|f| f.join().unwrap().unwrap()));
            members
        });
        assert_eq!(placement.leader(PartitionId(0)), Some(NodeId(0)));
        for log in &logs {
            assert_eq!(*log.leaders.lock(), vec![Some(NodeId(0))]);
        }
        (members, logs)
    }

    fn settle(members: &[ZkMember]) {
        wait_for("the group to settle", || {
            members.iter().all(|m| m.settled())
        });
    }

    /// Bytes that do not compress.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let step = |_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        };
        (0..len).map(step).collect()
    }

    fn children(zk: &ZooKeeper, log: &str) -> Vec<String> {
        let mut names = zk.get_children(log, false).unwrap();
        names.sort();
        names
    }

    #[test]
    fn chunks_are_put_back_together_and_garbage_is_refused() {
        let mut asm = Assembler::default();
        let refused = Mutex::new(Vec::new());
        let refuse = |why: String| refused.lock().push(why);
        let big = noise(3_000_000, 7);
        let mut n = 0;
        let mut feed = |asm: &mut Assembler, data: &[u8]| {
            n += 1;
            asm.take(n - 1, data, refuse)
        };
        let parts: Vec<_> = chunks(NodeId(3), 1, &big).collect();
        assert_eq!(parts.len(), 4);
        assert!(parts.iter().all(|p| p.len() <= MAX_ZNODE));
        for p in &parts[..3] {
            assert!(feed(&mut asm, p).is_none());
        }
        let e = feed(&mut asm, &parts[3]).unwrap();
        assert_eq!((e.proposer, e.codec, e.first), (NodeId(3), 1, 0));
        assert_eq!(e.payload, big);
        assert!(refused.lock().is_empty());
        // An empty entry is one child.
        let empty: Vec<_> = chunks(NodeId(1), 0, &[]).collect();
        assert_eq!(empty, vec![vec![1, 0, 0, 0, 0, 0]]);
        assert!(feed(&mut asm, &empty[0]).unwrap().payload.is_empty());
        // Garbage, a continuation without its start, and an entry broken off.
        assert!(feed(&mut asm, &[1, 2]).is_none());
        assert!(feed(&mut asm, &[0xff; 64]).is_none());
        assert!(feed(&mut asm, &parts[1]).is_none());
        assert!(feed(&mut asm, &parts[0]).is_none());
        assert!(!asm.idle());
        assert!(feed(&mut asm, &empty[0]).is_some());
        assert!(asm.idle());
        let refused = refused.lock();
        assert_eq!(refused.len(), 4, "{refused:?}");
        assert!(refused[3].contains("breaks off the entry begun at e-0000000008"));
    }

    #[test]
    fn every_member_applies_every_proposal_in_order() {
        let server = Server::start();
        let root = "/qstore/test-order";
        let (members, logs) = group(&server, root, 3, ReplicationCompression::Lz4);
        let entry = |i: usize| -> Vec<u8> {
            let len = (i * 997) % 20_000;
            (0..len).map(|k| (k * 31 + i) as u8 % 50).collect()
        };
        assert_eq!(members[0].leading_term(), Some(1));
        for i in 0..200 {
            members[0].propose_in_term(1, entry(i));
        }
        wait_for("every entry applied everywhere", || {
            logs.iter().all(|l| l.len() == 200)
        });
        settle(&members);
        for log in &logs {
            for (i, (proposer, data)) in log.entries.lock().iter().enumerate() {
                assert_eq!(*proposer, NodeId(0));
                assert_eq!(*data, entry(i), "entry {i}");
            }
        }
        let zk = server.client();
        let names = children(&zk.zk, "/qstore/test-order/g0");
        let expected: Vec<_> = (0..200).map(|i| format!("e-{i:010}")).collect();
        assert_eq!(names, expected);
        for m in &members {
            m.stop();
        }
        assert_eq!(members[0].leading_term(), None);
        // The leader deleted its log.
        assert!(zk
            .zk
            .exists("/qstore/test-order/g0", false)
            .unwrap()
            .is_none());
    }

    #[test]
    fn an_entry_over_a_megabyte_is_split_and_put_back_together() {
        let server = Server::start();
        let (members, logs) = group(&server, "/big", 2, ReplicationCompression::None);
        let big = noise(3 << 20, 11);
        for data in [b"before".to_vec(), big.clone(), b"after".to_vec()] {
            members[0].propose_in_term(1, data);
        }
        wait_for("every entry applied everywhere", || {
            logs.iter().all(|l| l.len() == 3)
        });
        settle(&members);
        for log in &logs {
            let entries = log.entries.lock();
            assert_eq!(entries[0].1, b"before");
            assert!(entries[1].1 == big, "the big entry differs");
            assert_eq!(entries[2].1, b"after");
        }
        // 3 MiB in children of at most a million bytes: 4 of them.
        let zk = server.client();
        assert_eq!(children(&zk.zk, "/big/g0").len(), 1 + 4 + 1);
        for m in &members {
            m.stop();
        }
    }

    #[test]
    fn proposals_of_another_term_or_from_a_follower_are_dropped() {
        let server = Server::start();
        let (members, logs) = group(&server, "/terms", 2, ReplicationCompression::Snappy);
        assert_eq!(members[1].leading_term(), None);
        members[0].propose_in_term(2, b"another term".to_vec());
        members[1].propose_in_term(1, b"from a follower".to_vec());
        members[0].propose_in_term(1, b"kept".to_vec());
        wait_for("the entry applied everywhere", || {
            logs.iter().all(|l| l.len() == 1)
        });
        settle(&members);
        std::thread::sleep(Duration::from_millis(200));
        for log in &logs {
            assert_eq!(*log.entries.lock(), vec![(NodeId(0), b"kept".to_vec())]);
        }
        // A member refuses messages from others, and stops twice without harm.
        members[1].receive(NodeId(0), ReplMsg(vec![1, 2, 3]));
        for m in &members {
            m.stop();
            m.stop();
        }
        members[0].propose_in_term(1, b"stopped".to_vec());
        assert_eq!(logs[0].len(), 1);
    }

    #[test]
    fn a_second_start_on_the_same_root_is_refused() {
        let server = Server::start();
        let placement = Arc::new(Placement::new(1, 1));
        let how = ReplicationCompression::None;
        let start = || {
            let applier: Arc<dyn Applier> = Arc::new(Log::default());
            ZkMember::start(
                NodeId(0),
                placement.clone(),
                &server.address,
                "/twice/",
                how,
                applier,
            )
        };
        let first = start().unwrap();
        let e = start().err().expect("a second start on the same root");
        let e = e.to_string();
        assert!(e.contains("already holds a log at /twice/g0"), "{e}");
        assert!(e.contains("deleteall /twice/g0"), "{e}");
        // The first one's log is deleted when it stops: the root can be used again.
        first.stop();
        start().unwrap().stop();
        let bad = ZkMember::start(NodeId(0), placement.clone(), &server.address, "x", how, {
            Arc::new(Log::default())
        });
        assert!(bad
            .err()
            .unwrap()
            .to_string()
            .contains("absolute znode path"));
    }

    #[test]
    fn garbage_in_the_log_is_skipped_and_later_entries_apply() {
        let server = Server::start();
        let (members, logs) = group(&server, "/junk", 2, ReplicationCompression::Lz4);
        let entry = |i: u8| vec![i; 100 * i as usize];
        for i in 0..3 {
            members[0].propose_in_term(1, entry(i));
        }
        wait_for("the first entries", || logs.iter().all(|l| l.len() == 3));
        let zk = server.client();
        let mut lz4_lie = vec![0, 0, 0, 0, 1, 0];
        lz4_lie.extend_from_slice(&u32::MAX.to_le_bytes());
        let garbage = [
            vec![0xff; 64],
            vec![1, 2],
            vec![0, 0, 0, 0, 9, 0, 1, 2, 3],
            vec![0, 0, 0, 0, 0, CONT, 1],
            lz4_lie,
        ];
        for g in garbage {
            let open = Acl::open_unsafe().clone();
            zk.zk
                .create("/junk/g0/e-", g, open, CreateMode::PersistentSequential)
                .unwrap();
        }
        for i in 3..6 {
            members[0].propose_in_term(1, entry(i));
        }
        wait_for("every good entry", || logs.iter().all(|l| l.len() == 6));
        settle(&members);
        for log in &logs {
            let entries = log.entries.lock();
            let data: Vec<_> = entries.iter().map(|(_, d)| d.clone()).collect();
            assert_eq!(data, (0..6).map(entry).collect::<Vec<_>>());
        }
        for m in &members {
            m.stop();
        }
        assert!(zk.zk.exists("/junk/g0", false).unwrap().is_none());
    }

    #[test]
    fn the_group_goes_on_when_zookeeper_comes_back() {
        let server = Server::start();
        let (members, logs) = group(&server, "/restart", 2, ReplicationCompression::None);
        let entry = |i: u32| i.to_le_bytes().repeat(1 + i as usize * 50);
        for i in 0..5 {
            members[0].propose_in_term(1, entry(i));
        }
        wait_for("the first entries", || logs.iter().all(|l| l.len() == 5));
        server.halt();
        // Proposed while ZooKeeper is away: written once it is back, in order.
        for i in 5..10 {
            members[0].propose_in_term(1, entry(i));
        }
        std::thread::sleep(Duration::from_secs(1));
        assert!(!members[0].settled());
        server.run().unwrap();
        wait_for("every entry", || logs.iter().all(|l| l.len() == 10));
        settle(&members);
        for log in &logs {
            let data: Vec<_> = log.entries.lock().iter().map(|(_, d)| d.clone()).collect();
            assert_eq!(data, (0..10).map(entry).collect::<Vec<_>>());
        }
        for m in &members {
            m.stop();
        }
    }

    #[test]
    fn a_member_without_zookeeper_fails_to_start_in_bounded_time() {
        let address = format!("127.0.0.1:{}", free_port());
        let placement = Arc::new(Placement::new(1, 1));
        let t = Instant::now();
        let applier: Arc<dyn Applier> = Arc::new(Log::default());
        let how = ReplicationCompression::None;
        let started = ZkMember::start(NodeId(0), placement, &address, "/none", how, applier);
        let e = started.err().expect("no server").to_string();
        assert!(e.contains(&address), "{e}");
        assert!(t.elapsed() < CONNECT_WAIT + Duration::from_secs(5));
    }

    #[test]
    fn write_latencies_times_each_write_and_cleans_up() {
        let server = Server::start();
        let latencies = write_latencies(&server.address, "/bench/writes", 1000, 40, 8).unwrap();
        assert_eq!(latencies.len(), 40);
        assert!(latencies.iter().all(|l| *l < Duration::from_secs(10)));
        let zk = server.client();
        assert!(zk.zk.exists("/bench/writes", false).unwrap().is_none());
        let too_big = write_latencies(&server.address, "/bench/big", 2 << 20, 1, 1);
        assert!(too_big.is_err());
    }
}
