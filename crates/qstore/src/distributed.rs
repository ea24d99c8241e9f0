//! `qstore server` and `qstore client`: one node of a distributed cluster, and the load
//! generator driving the servers of one, both described by a cluster file.

use qstore_core::{ConfigError, NodeId, PartitionId, QError, RunConfig};
use qstore_engine::server::{ClientEndpoint, EndpointLimits, PeerHealth};
use qstore_engine::{Cluster, Hosting, NodeHosting};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a restarted server waits for what its log recovered to run before it serves.
const RECOVERY_WAIT: Duration = Duration::from_secs(60);

/// The line a server prints when it serves (the launcher waits for it).
pub fn ready_line(node: u32) -> String {
    format!("qstore server: node {node} ready")
}

/// Runs node `node` of the cluster `cfg` describes until SIGINT or SIGTERM.
pub fn serve(
    cfg: RunConfig,
    node: u32,
    record_history: bool,
    redis: Option<SocketAddr>,
) -> Result<(), QError> {
    let addrs = cfg.socket_addresses()?;
    let Some(&(peer_addr, client_addr)) = addrs.get(node as usize) else {
        return Err(QError::Other(format!(
            "--node {node}: the cluster file has servers 0 to {}",
            addrs.len().saturating_sub(1)
        )));
    };
    // An address this host cannot listen on is a mistake in the cluster file (exit code 2).
    let bind = |which: &str, a: SocketAddr| {
        TcpListener::bind(a).map_err(|e| {
            let hint = match e.kind() {
                ErrorKind::AddrInUse => "; is another server using it?",
                ErrorKind::AddrNotAvailable => "; the address is not one of this host's",
                _ => "",
            };
            QError::Config(ConfigError::new(
                &format!("cluster.addresses[{node}].{which}"),
                a,
                format!("node {node} cannot listen there: {e}{hint}"),
            ))
        })
    };
    let secret = qstore_bench::remote::load_secret(&cfg)?;
    // Bound before loading, so a taken port fails at once.
    let peers = bind("peer", peer_addr)?;
    let clients = bind("client", client_addr)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let limits = EndpointLimits::from_config(&cfg.server, cfg.servers());
    let replicated = cfg.replication.factor > 1;
    let partition = node % cfg.cluster.nodes;
    let workload = qstore_workload::build(&cfg)?;
    // Built before the cluster takes the configuration (an error then stops nothing).
    let redis = match redis {
        Some(addr) => Some((
            addr,
            crate::redis_port::kv_of(&cfg)?,
            crate::redis_port::limits_of(&cfg),
        )),
        None => None,
    };
    let me = NodeId(node);
    let (events, peer_events) = crossbeam_channel::unbounded();
    let health = PeerHealth::watch(me, peer_events, replicated);
    let hosting = Hosting::Node(NodeHosting {
        me,
        peers: addrs.iter().map(|a| a.0).collect(),
        listener: parking_lot::Mutex::new(Some(peers)),
        events: Some(events),
        secret: secret.clone(),
        cancel: stop.clone(),
    });
    let started = Instant::now();
    eprintln!(
        "node {node}: loading partition {partition}, connecting to {} peer(s)...",
        addrs.len() - 1
    );
    let started_cluster = Cluster::start_hosting(
        cfg,
        workload.catalog(),
        workload.partition_map().clone(),
        &|p: PartitionId, loader| workload.load(p, loader),
        record_history,
        hosting,
    );
    let cluster = match started_cluster {
        Ok(c) => Arc::new(c),
        Err(QError::Interrupted(why)) => {
            eprintln!("{why}");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    // A restarted server serves once it has re-run what its log recovered (a deterministic
    // protocol's replayed epochs would otherwise still run under the first clients).
    if !cluster.wait_recovered(RECOVERY_WAIT) {
        eprintln!(
            "node {node}: what its log recovered is still running after {RECOVERY_WAIT:?}; \
             serving clients anyway"
        );
    }
    let tally = Some(qstore_bench::verify::partition_tally(workload.clone()));
    let endpoint = ClientEndpoint::start(
        cluster.clone(),
        me,
        clients,
        health.clone(),
        secret.clone(),
        limits,
        tally,
    )?;
    let redis = match redis {
        Some((addr, kv, limits)) => {
            let backend = qstore_redis::Backend {
                cluster: cluster.clone(),
                kv,
                me,
                ids: endpoint.txn_ids(),
                health: Some(health),
                auth: qstore_redis::Auth::Secret(secret),
                limits,
            };
            let port = crate::redis_port::start_port(addr, backend)?;
            eprintln!(
                "node {node}: serving Redis clients on {}",
                port.local_addr()
            );
            Some(port)
        }
        None => None,
    };
    eprintln!(
        "node {node}: serving clients on {} ({:.1} s to start)",
        endpoint.local_addr(),
        started.elapsed().as_secs_f64()
    );
    println!("{}", ready_line(node));
    let mut leads = false;
    while !stop.load(Ordering::Relaxed) {
        if replicated {
            announce_leadership(&cluster, me, &mut leads);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("node {node}: stopping");
    if let Some(port) = redis {
        port.stop();
    }
    endpoint.stop();
    cluster.shutdown();
    Ok(())
}

/// The line a replicated server prints when it becomes its group's leader (the launcher
/// follows them to know whom its fault injection kills).
pub fn leader_line(node: u32, partition: u32) -> String {
    format!("qstore server: node {node} leads partition {partition}")
}

/// Prints [`leader_line`] when this server has just become its group's leader, and a line
/// on stderr when it stopped leading.
fn announce_leadership(cluster: &Cluster, me: NodeId, leads: &mut bool) {
    let placement = &cluster.ctx().placement;
    let now = placement.is_leader(me);
    if now == *leads {
        return;
    }
    *leads = now;
    let partition = placement.partition_of(me).0;
    if now {
        println!("{}", leader_line(me.0, partition));
    } else {
        eprintln!("node {}: no longer leads partition {partition}", me.0);
    }
}

/// `--verify` against a distributed cluster: the merged history of every node, checked, and
/// the serial oracle against the nodes' partition hashes. True when all checks pass.
pub fn verify_remote(cfg: &RunConfig, outcome: &qstore_bench::RemoteOutcome) -> bool {
    crate::cli::print_verification(qstore_bench::verify::verify_remote(
        cfg,
        outcome.workload.as_ref(),
        &outcome.collected,
        &outcome.report,
    ))
}
