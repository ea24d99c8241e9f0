//! A Redis-protocol client port: `redis-cli`, `redis-benchmark` and Redis client libraries
//! run serializable transactions on a qstore node, whichever protocol the cluster runs.
//!
//! Every command that touches keys is one transaction of the `kv` workload (see
//! [`qstore_workload::kv`]): `MGET`/`MSET` are atomic across partitions, and `MULTI … EXEC`
//! runs its queued commands as one transaction. `WATCH` remembers the versions of the
//! watched keys' buckets; `EXEC` checks them inside its transaction (an access that aborts
//! it when one changed) and answers nil then, as Redis does.
//!
//! An event-loop thread serves many connections (up to `max_clients` in all, over
//! `event_loops` threads; see [`event`]): the transactions of its connections go to the
//! engine together, and on an idle qstore node they run as one batch on that thread.
//! Replies go out in the order of the requests. Clients must `AUTH` with the password
//! derived from the cluster secret ([`password_for`]) before anything but `AUTH`,
//! `HELLO … AUTH` and `QUIT`.

pub mod bench;
pub mod command;
mod event;
pub mod resp;
mod session;

use event::EventLoop;
use mio::{Interest, Poll, Waker};
use parking_lot::Mutex;
use qstore_core::NodeId;
use qstore_engine::server::WakeFlag;
use qstore_engine::server::{PeerHealth, TxnIds};
use qstore_engine::Cluster;
use qstore_net::auth::ClusterSecret;
use qstore_workload::kv::Kv;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The role under which the Redis password is derived from the cluster secret.
const PASSWORD_ROLE: &str = "qstore redis password";

/// The Redis password of the cluster whose secret is `secret`: derived from it (64 hex
/// digits), so that the secret itself never crosses the network.
pub fn password_for(secret: &ClusterSecret) -> String {
    secret
        .prove(PASSWORD_ROLE, b"AUTH")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// How clients prove who they are.
pub enum Auth {
    /// `AUTH` with the password derived from this secret (see [`password_for`]).
    Secret(ClusterSecret),
    /// No password: every client is let in (only where the operator said so).
    Open,
}

impl Auth {
    fn required(&self) -> bool {
        matches!(self, Auth::Secret(_))
    }

    /// Whether `password` is the cluster's, compared in constant time.
    fn accepts(&self, password: &[u8]) -> bool {
        match self {
            Auth::Open => true,
            Auth::Secret(secret) => {
                let Some(proof) = unhex32(password) else {
                    return false;
                };
                secret.verify(PASSWORD_ROLE, b"AUTH", &proof)
            }
        }
    }
}

fn unhex32(s: &[u8]) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// The port's limits.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_clients: usize,
    /// A connection with nothing to do for this long is closed.
    pub idle_timeout: Duration,
    /// How long a command waits for its transaction's answer.
    pub answer_timeout: Duration,
    /// Event-loop threads, each serving the connections it accepted.
    pub event_loops: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_clients: 1024,
            idle_timeout: Duration::from_secs(300),
            answer_timeout: Duration::from_secs(30),
            event_loops: 1,
        }
    }
}

/// What every connection of the port shares.
pub struct Backend {
    pub cluster: Arc<Cluster>,
    pub kv: Kv,
    pub me: NodeId,
    pub ids: Arc<TxnIds>,
    /// Why new transactions are refused now, if they are (a peer is down).
    pub health: Option<Arc<PeerHealth>>,
    pub auth: Auth,
    pub limits: Limits,
}

/// Counters for `INFO`.
#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    commands: AtomicU64,
    transactions: AtomicU64,
    retries: AtomicU64,
}

struct Shared {
    backend: Backend,
    counters: Counters,
    /// Connections open now.
    open: AtomicUsize,
    stop: AtomicBool,
}

/// A running Redis port.
pub struct RedisServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    wakes: Vec<Arc<WakeFlag>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl RedisServer {
    /// Serves Redis clients on `listener` until [`RedisServer::stop`], with
    /// `limits.event_loops` threads: each polls the listener and serves the connections it
    /// accepts (as the node's own client endpoint does).
    pub fn start(listener: TcpListener, backend: Backend) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            backend,
            counters: Counters::default(),
            open: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let mut port = RedisServer {
            shared,
            addr,
            wakes: Vec::new(),
            threads: Mutex::new(Vec::new()),
        };
        for i in 0..port.shared.backend.limits.event_loops.max(1) {
            // On failure, dropping the port stops the loops already started.
            let (wake, thread) = spawn_loop(&port.shared, &listener, i)?;
            port.wakes.push(wake);
            port.threads.lock().push(thread);
        }
        Ok(port)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, gives clients the answers they wait for (for a while), closes every
    /// connection and waits.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.wakes.iter().for_each(|w| w.wake_now());
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
    }
}

/// Starts event loop `i` of the port, polling its own handle of `listener`.
fn spawn_loop(
    shared: &Arc<Shared>,
    listener: &TcpListener,
    i: usize,
) -> io::Result<(Arc<WakeFlag>, JoinHandle<()>)> {
    let mut listener = mio::net::TcpListener::from_std(listener.try_clone()?);
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, event::LISTENER, Interest::READABLE)?;
    let wake = Arc::new(WakeFlag::new(Waker::new(poll.registry(), event::WAKER)?));
    let (s, w) = (shared.clone(), wake.clone());
    let thread = std::thread::Builder::new()
        .name(format!("n{}-redis-{i}", shared.backend.me.0))
        .spawn(move || EventLoop::new(&s, poll, listener, w).run())?;
    Ok((wake, thread))
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
