//! `--verify`: after a run, check its recorded history for serializability anomalies, replay
//! it through the serial oracle (deterministic protocols), and check the workload's
//! invariants. Each check prints one line; any failure makes the verification fail.

use crate::report::RunReport;
use qstore_check::{AnomalyClass, Report};
use qstore_core::txn::RowLoader;
use qstore_core::{PartitionId, QError, RunConfig};
use qstore_engine::history::{HistoryPart, HistoryRecorder};
use qstore_engine::server::proto::Collected;
use qstore_engine::server::PartitionTally;
use qstore_engine::{oracle, StoppedCluster};
use qstore_storage::PartitionStore;
use qstore_workload::{Tally, Workload};
use std::fmt;
use std::sync::Arc;

/// The verdicts of one run.
pub struct Verification {
    pub history: Report,
    /// Read-committed runs only forbid G0 and G1 (and impossible reads): G2 is allowed.
    pub read_committed: bool,
    /// Serial oracle: `None` when the protocol is not deterministic.
    pub oracle: Option<OracleVerdict>,
    /// Workload invariants: summary or failure (`None` if the workload has none).
    pub invariants: Option<Result<String, String>>,
    /// The protocol's own end-of-run check, for protocols that keep one (LEAP: every record
    /// has exactly one owner, and the owner tables agree with where the data is).
    pub protocol_check: Option<Result<String, String>>,
    /// Violations seen by clients in committed answers (e.g. a bank audit's sum).
    pub client_violations: u64,
    pub first_client_violation: Option<String>,
    /// Transactions the cluster never answered: the checks above cover only what did commit,
    /// so a run that left any unanswered fails whatever they say.
    pub unanswered: u64,
    /// Replication with a fail-over during the run: what could be checked instead of the
    /// history and the oracle.
    pub failover: Option<FailoverVerdict>,
}

/// Replication with a fail-over: the cluster instances taken out of service (they may hold
/// what no log committed, or lost a server), and whether the copies of every partition in
/// the instances still in service are equal. The history and the serial oracle are checked
/// on an instance in service (every instance records what it runs).
pub struct FailoverVerdict {
    /// Instances taken out of service.
    pub stale: Vec<u32>,
    pub copies_equal: bool,
    pub detail: String,
}

pub struct OracleVerdict {
    pub replayed: usize,
    pub hashes_match: bool,
    pub divergent: usize,
    pub detail: String,
}

impl Verification {
    /// Whether the history meets the run's isolation level.
    pub fn isolation_kept(&self) -> bool {
        if self.read_committed {
            self.history
                .classes()
                .iter()
                .all(|c| *c == AnomalyClass::G2)
        } else {
            self.history.is_serializable()
        }
    }

    pub fn passed(&self) -> bool {
        self.failover.as_ref().is_none_or(|f| f.copies_equal)
            && self.isolation_kept()
            && self
                .oracle
                .as_ref()
                .is_none_or(|o| o.hashes_match && o.divergent == 0)
            && !matches!(self.invariants, Some(Err(_)))
            && !matches!(self.protocol_check, Some(Err(_)))
            && self.client_violations == 0
            && self.unanswered == 0
    }
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(fo) = &self.failover {
            let verdict = if fo.copies_equal { "equal" } else { "DIFFER" };
            writeln!(
                f,
                "fail-over during the run: instances out of service {:?}; copies in service \
                 {verdict} ({})",
                fo.stale, fo.detail
            )?;
        }
        writeln!(f, "{}", self.history.to_string().trim_end())?;
        if self.read_committed {
            let verdict = if self.isolation_kept() { "yes" } else { "NO" };
            writeln!(
                f,
                "read committed: {verdict} (no G0/G1 anomalies required; {} G2 cycles allowed)",
                self.history.count(AnomalyClass::G2)
            )?;
        }
        match &self.oracle {
            Some(o) if o.hashes_match && o.divergent == 0 => writeln!(
                f,
                "serial oracle: match ({} transactions replayed, {})",
                o.replayed, o.detail
            )?,
            Some(o) => writeln!(
                f,
                "serial oracle: MISMATCH ({} transactions replayed, {} decided differently; {})",
                o.replayed, o.divergent, o.detail
            )?,
            None => writeln!(
                f,
                "serial oracle: not applicable (protocol is not deterministic)"
            )?,
        }
        self.fmt_answers(f)
    }
}

impl Verification {
    /// The invariants' and the clients' verdicts.
    fn fmt_answers(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.invariants {
            Some(Ok(s)) => writeln!(f, "invariants: ok ({s})")?,
            Some(Err(e)) => writeln!(f, "invariants: VIOLATED ({e})")?,
            None => {}
        }
        match &self.protocol_check {
            Some(Ok(s)) => writeln!(f, "ownership: ok ({s})")?,
            Some(Err(e)) => writeln!(f, "ownership: VIOLATED ({e})")?,
            None => {}
        }
        if self.client_violations > 0 {
            writeln!(
                f,
                "client checks: {} VIOLATIONS, first: {}",
                self.client_violations,
                self.first_client_violation.as_deref().unwrap_or("")
            )?;
        }
        if self.unanswered > 0 {
            writeln!(
                f,
                "answers: {} transaction(s) UNANSWERED when the run ended",
                self.unanswered
            )?;
        }
        Ok(())
    }
}

/// What clients saw that the checks cannot see in the cluster: violations in committed
/// answers, and transactions never answered.
#[derive(Clone, Debug, Default)]
pub struct ClientView {
    pub violations: u64,
    pub first_violation: Option<String>,
    pub unanswered: u64,
}

impl From<&RunReport> for ClientView {
    fn from(r: &RunReport) -> Self {
        ClientView {
            violations: r.invariant_violations,
            first_violation: r.first_violation.clone(),
            unanswered: r.unfinished,
        }
    }
}

/// Verifies a finished run whose cluster recorded its history; `clients` is what the load
/// generator saw (violations in answers, transactions never answered).
pub fn verify(
    cfg: &RunConfig,
    workload: &dyn Workload,
    cluster: &StoppedCluster,
    clients: &RunReport,
) -> Result<Verification, QError> {
    verify_cluster(cfg, workload, cluster, &clients.into())
}

/// Verifies a cluster that recorded its history while serving clients this process does not
/// see (the Redis port's): the history, the serial oracle and the workload's invariants.
pub fn verify_served(
    cfg: &RunConfig,
    workload: &dyn Workload,
    cluster: &StoppedCluster,
) -> Result<Verification, QError> {
    verify_cluster(cfg, workload, cluster, &ClientView::default())
}

fn verify_cluster(
    cfg: &RunConfig,
    workload: &dyn Workload,
    cluster: &StoppedCluster,
    clients: &ClientView,
) -> Result<Verification, QError> {
    let ctx = cluster.ctx();
    let recorder = ctx
        .history_in_service()
        .ok_or_else(|| QError::Other("the run did not record its history".into()))?;
    let placement = &ctx.placement;
    let stale: Vec<u32> = (0..placement.replicas())
        .filter(|&i| placement.is_stale(i))
        .collect();
    let failed_over = placement.replicas() > 1 && placement.failovers() > 0;
    let hashes = cluster.partition_hashes();
    let mut v = verified_copies(
        cfg,
        workload,
        recorder,
        &hashes,
        stale,
        failed_over,
        clients,
    )?;
    v.invariants = check_final(workload, cluster);
    v.protocol_check = cluster.protocol_check();
    Ok(v)
}

/// The history check and the serial oracle on `recorder` (an instance in service) against
/// the copies of the instances in service (`hashes` by server, instance after instance); and,
/// after a fail-over or with instances out of service, whether those copies are equal.
fn verified_copies(
    cfg: &RunConfig,
    workload: &dyn Workload,
    recorder: &HistoryRecorder,
    hashes: &[u64],
    stale: Vec<u32>,
    failed_over: bool,
    clients: &ClientView,
) -> Result<Verification, QError> {
    let partitions = cfg.cluster.nodes as usize;
    let in_service: Vec<&[u64]> = hashes
        .chunks(partitions)
        .enumerate()
        .filter(|(i, _)| !stale.contains(&(*i as u32)))
        .map(|(_, h)| h)
        .collect();
    let failover = (failed_over || !stale.is_empty()).then(|| FailoverVerdict {
        copies_equal: !in_service.is_empty() && in_service.windows(2).all(|w| w[0] == w[1]),
        detail: format!(
            "{partitions} partitions x {} copies in service: {}",
            in_service.len(),
            in_service
                .iter()
                .map(|h| hex(h))
                .collect::<Vec<_>>()
                .join(" / ")
        ),
        stale,
    });
    let mut v = verify_recorded(cfg, workload, recorder, &in_service.concat(), clients)?;
    v.failover = failover;
    Ok(v)
}

/// Verifies a run of a distributed cluster from what its servers handed back (by server;
/// `None` for one lost during a replicated run): their history parts, merged, and their
/// partition hashes. With replication, a cluster instance that lost a server or that its
/// servers took out of service is left out, and after a fail-over the checks are those of
/// [`FailoverVerdict`].
pub fn verify_remote(
    cfg: &RunConfig,
    workload: &dyn Workload,
    collected: &[Option<Collected>],
    clients: &RunReport,
) -> Result<Verification, QError> {
    let partitions = cfg.cluster.nodes as usize;
    let stale: Vec<u32> = collected
        .chunks(partitions)
        .enumerate()
        .filter(|(_, servers)| {
            servers
                .iter()
                .any(|c| c.as_ref().is_none_or(|c| !c.in_service))
        })
        .map(|(i, _)| i as u32)
        .collect();
    let failed_over = collected.iter().flatten().any(|c| c.failovers > 0);
    let in_service = |c: &Collected| !stale.contains(&(c.node.0 / partitions as u32));
    let invariants = check_collected_tallies(workload, collected, partitions, &in_service)?;
    // Every instance records what it runs: the first one in service throughout has the
    // whole history (a rebuilt one lacks what ran before its copy).
    let rebuilt = |i: usize| {
        collected[i * partitions..(i + 1) * partitions]
            .iter()
            .flatten()
            .any(|c| c.rebuilt)
    };
    let first = (0..collected.len() / partitions.max(1))
        .find(|&i| !stale.contains(&(i as u32)) && !rebuilt(i));
    let servers = first.map_or(&[][..], |i| {
        &collected[i * partitions..(i + 1) * partitions]
    });
    let parts = servers
        .iter()
        .flatten()
        .map(|c| {
            let bytes = c.history.as_ref().ok_or_else(|| {
                QError::Other(format!(
                    "node {} did not record its history: start the servers with \
                     --record-history (`qstore cluster --verify` does)",
                    c.node
                ))
            })?;
            postcard::from_bytes::<HistoryPart>(bytes).map_err(|e| {
                QError::Other(format!("node {}: unreadable history part: {e}", c.node))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let recorder = HistoryRecorder::merge(workload.partition_map().clone(), parts);
    let hashes: Vec<u64> = collected
        .iter()
        .map(|c| c.as_ref().map_or(0, |c| c.partition_hash))
        .collect();
    let mut v = verified_copies(
        cfg,
        workload,
        &recorder,
        &hashes,
        stale,
        failed_over,
        &clients.into(),
    )?;
    v.invariants = invariants;
    let audits: Vec<Vec<u8>> = collected
        .iter()
        .flatten()
        .filter_map(|c| c.audit.clone())
        .collect();
    let pmap = workload.partition_map();
    v.protocol_check = qstore_engine::protocol::check_audits(&cfg.protocol.name, pmap, &audits);
    Ok(v)
}

/// The history check and, for deterministic protocols, the serial oracle against the
/// partition hashes the run ended with.
fn verify_recorded(
    cfg: &RunConfig,
    workload: &dyn Workload,
    recorder: &HistoryRecorder,
    run_hashes: &[u64],
    clients: &ClientView,
) -> Result<Verification, QError> {
    let history = qstore_check::check(&recorder.history());
    let deterministic =
        qstore_engine::protocol::info(&cfg.protocol.name).is_some_and(|p| p.deterministic);
    let oracle = if deterministic {
        let order = recorder.serialization_order();
        let catalog = workload.catalog();
        let pmap = workload.partition_map();
        // A partition restored from a checkpoint replays from it.
        let bases = recorder.bases();
        let load =
            |p: PartitionId, l: &mut dyn RowLoader| match bases.iter().find(|b| b.partition == p) {
                Some(b) => qstore_engine::protocol::load_checkpoint(&b.path, p, l),
                None => workload.load(p, l),
            };
        let replay = oracle::replay(&catalog, pmap, &load, &order)?;
        // With replication the run has a copy of every partition per cluster instance,
        // instance after instance: each must equal the replay.
        let copies = run_hashes.len() / replay.hashes.len().max(1);
        let expected = replay.hashes.repeat(copies);
        let hashes_match = expected == run_hashes;
        let detail = if hashes_match && copies > 1 {
            format!(
                "{} partitions x {copies} copies: every hash equal",
                replay.hashes.len()
            )
        } else if hashes_match {
            format!("{} partition hashes equal", run_hashes.len())
        } else {
            format!(
                "run hashes {} vs replay {}",
                hex(run_hashes),
                hex(&expected)
            )
        };
        Some(OracleVerdict {
            replayed: replay.replayed,
            hashes_match,
            divergent: replay.divergent.len(),
            detail,
        })
    } else {
        None
    };
    let read_committed = cfg.protocol.name == "qstore"
        && cfg.protocol.qstore.isolation == qstore_core::config::Isolation::ReadCommitted;
    Ok(Verification {
        history,
        read_committed,
        oracle,
        invariants: None,
        protocol_check: None,
        client_violations: clients.violations,
        first_client_violation: clients.first_violation.clone(),
        unanswered: clients.unanswered,
        failover: None,
    })
}

fn hex(hashes: &[u64]) -> String {
    hashes
        .iter()
        .map(|h| format!("{h:016x}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs the workload's final-state check over every partition: over each cluster instance
/// (a copy of the whole database) with replication.
pub fn check_final(
    workload: &dyn Workload,
    cluster: &StoppedCluster,
) -> Option<Result<String, String>> {
    let ctx = cluster.ctx();
    let placement = &ctx.placement;
    let mut tallies: Vec<Option<Tally>> = vec![None; placement.replicas() as usize];
    for (n, store) in ctx.partitions.iter().enumerate() {
        let Some(store) = store else { continue };
        let instance = placement.instance_of(qstore_core::NodeId(n as u32));
        if placement.is_stale(instance) {
            continue;
        }
        let instance = instance as usize;
        // The cluster is stopped: nothing writes rows any more.
        if let Some(t) = tally_partition(workload, store) {
            tallies[instance]
                .get_or_insert_with(Tally::default)
                .merge(&t);
        }
    }
    let mut verdicts = tallies
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| Some((i, workload.check_tally(&t?))));
    let (_, first) = verdicts.next()?;
    for (i, v) in verdicts {
        if let Err(e) = v {
            return Some(Err(format!("copy {i} of the database: {e}")));
        }
    }
    Some(first)
}

/// What the workload's final-state check finds in one partition.
///
/// Call it only while no transaction writes the partition (after a run).
pub fn tally_partition(workload: &dyn Workload, store: &PartitionStore) -> Option<Tally> {
    let mut scan = |table: u16, f: &mut dyn FnMut(u64, &[u8])| {
        let t = store.table(table);
        t.for_each(|key, rid| {
            // SAFETY: `rid` is live (the index holds it), and nothing writes the partition
            // meanwhile (this function's contract).
            f(key, unsafe { t.row(rid) })
        });
    };
    workload.tally(&mut scan)
}

/// A server's way to tally its partition for a collect request (see
/// [`qstore_engine::server::PartitionTally`]), for workloads with a final-state check.
pub fn partition_tally(workload: Arc<dyn Workload>) -> PartitionTally {
    Arc::new(move |store: &PartitionStore| {
        let t = tally_partition(workload.as_ref(), store)?;
        Some(postcard::to_stdvec(&t).expect("tallies serialize to memory"))
    })
}

/// The final-state check from the servers' tallies of their partitions, for each cluster
/// instance (a copy of the whole database) whose servers are `in_service`.
fn check_collected_tallies(
    workload: &dyn Workload,
    collected: &[Option<Collected>],
    partitions: usize,
    in_service: &dyn Fn(&Collected) -> bool,
) -> Result<Option<Result<String, String>>, QError> {
    let mut verdict = None;
    for (instance, servers) in collected.chunks(partitions).enumerate() {
        let servers: Vec<&Collected> = servers.iter().flatten().filter(|c| in_service(c)).collect();
        let mut whole: Option<Tally> = None;
        for c in &servers {
            let Some(bytes) = &c.tally else { continue };
            let t: Tally = postcard::from_bytes(bytes).map_err(|e| {
                QError::Other(format!(
                    "node {}: unreadable final-state tally: {e}",
                    c.node
                ))
            })?;
            whole.get_or_insert_with(Tally::default).merge(&t);
        }
        if whole.is_some() && servers.iter().any(|c| c.tally.is_none()) {
            return Err(QError::Other(
                "some nodes returned no final-state tally: are all servers the same version?"
                    .into(),
            ));
        }
        match whole.map(|t| workload.check_tally(&t)) {
            Some(Err(e)) if collected.len() > partitions => {
                return Ok(Some(Err(format!("copy {instance} of the database: {e}"))))
            }
            Some(Err(e)) => return Ok(Some(Err(e))),
            Some(ok) => {
                verdict.get_or_insert(ok);
            }
            None => {}
        }
    }
    Ok(verdict)
}
