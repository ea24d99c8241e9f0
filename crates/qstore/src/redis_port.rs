//! `qstore redis` (an embedded cluster serving Redis clients) and the Redis port of
//! `qstore server --redis`.

use qstore_core::{NodeId, PartitionId, QError, RunConfig};
use qstore_engine::server::TxnIds;
use qstore_engine::Cluster;
use qstore_net::auth::ClusterSecret;
use qstore_redis::{password_for, Auth, Backend, Limits, RedisServer};
use qstore_workload::kv::Kv;
use qstore_workload::Workload;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How clients of an embedded cluster's port authenticate.
pub enum PortAuth<'a> {
    /// With the password derived from the secret in this file.
    SecretFile(&'a Path),
    /// With the password of a secret made for this run (printed).
    Fresh,
    /// Without a password (asked for explicitly).
    Open,
}

/// The kv workload of `cfg`, which a Redis port needs.
pub fn kv_of(cfg: &RunConfig) -> Result<Kv, QError> {
    if cfg.workload.name != "kv" {
        return Err(QError::Other(format!(
            "the Redis port needs the kv workload (workload.name = \"kv\", or --workload kv), \
             not {}",
            cfg.workload.name
        )));
    }
    Ok(Kv::new(cfg)?)
}

/// The port's limits from `[server]` (an automatic `max_clients`, 0, takes the port's own;
/// `io_threads` event loops serve it).
pub fn limits_of(cfg: &RunConfig) -> Limits {
    Limits {
        max_clients: match cfg.server.max_clients {
            0 => Limits::default().max_clients,
            n => n as usize,
        },
        idle_timeout: Duration::from_secs_f64(cfg.server.client_idle_timeout_s),
        event_loops: cfg.server.io_threads(),
        ..Limits::default()
    }
}

/// Starts a Redis port on `addr` for `backend`.
pub fn start_port(addr: SocketAddr, backend: Backend) -> Result<RedisServer, QError> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| QError::Other(format!("cannot listen for Redis clients on {addr}: {e}")))?;
    Ok(RedisServer::start(listener, backend)?)
}

/// Runs an embedded cluster of `cfg` (workload kv) and serves Redis clients on `addr`, with
/// node 0 as every transaction's home, until SIGINT/SIGTERM or `serve_for`. With `verify`,
/// the cluster records its history, and once stopped checks it (and, for deterministic
/// protocols, replays it against the serial oracle): returns whether every check passed.
pub fn serve_embedded(
    cfg: RunConfig,
    addr: SocketAddr,
    auth: PortAuth<'_>,
    serve_for: Option<Duration>,
    verify: bool,
) -> Result<bool, QError> {
    let kv = kv_of(&cfg)?;
    let started = Instant::now();
    eprintln!(
        "qstore redis: {} on {} node(s), {} buckets of {} bytes per partition, loading...",
        cfg.protocol.name,
        cfg.cluster.nodes,
        cfg.workload.kv.buckets_per_partition,
        cfg.workload.kv.bucket_bytes
    );
    let cluster = Arc::new(Cluster::start(
        cfg.clone(),
        kv.catalog(),
        kv.partition_map().clone(),
        &|p: PartitionId, loader| kv.load(p, loader),
        verify,
    )?);
    let auth = match auth {
        PortAuth::SecretFile(path) => {
            Auth::Secret(ClusterSecret::load(path).map_err(QError::Other)?)
        }
        PortAuth::Fresh => {
            let text = ClusterSecret::generate_text()?;
            let secret = ClusterSecret::from_material(text.as_bytes()).map_err(QError::Other)?;
            println!("password: {}", password_for(&secret));
            Auth::Secret(secret)
        }
        PortAuth::Open => Auth::Open,
    };
    let me = NodeId(0);
    let ids = Arc::new(TxnIds::new(&cluster, me));
    let backend = Backend {
        cluster: cluster.clone(),
        kv: kv.clone(),
        me,
        ids,
        health: None,
        auth,
        limits: limits_of(&cfg),
    };
    let port = start_port(addr, backend)?;
    eprintln!(
        "qstore redis: serving Redis clients on {} ({:.1} s to start); Ctrl-C stops",
        port.local_addr(),
        started.elapsed().as_secs_f64()
    );
    println!("qstore redis: ready on {}", port.local_addr());
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    while !stop.load(Ordering::Relaxed) && serve_for.is_none_or(|d| started.elapsed() < d) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("qstore redis: stopping");
    port.stop();
    drop(port);
    let Ok(cluster) = Arc::try_unwrap(cluster) else {
        unreachable!("the port, its only other holder, is gone")
    };
    let stopped = cluster.stop();
    if !verify {
        return Ok(true);
    }
    Ok(crate::cli::print_verification(
        qstore_bench::verify::verify_served(&cfg, &kv, &stopped),
    ))
}
