//! `serial`: every transaction of the whole cluster runs to completion, one at a time, in one
//! global order, on one thread, with no concurrency control at all.
//!
//! It is the correctness oracle (its results are those of a serial schedule by construction)
//! and the single-core, no-concurrency-control upper bound that other protocols' throughput is
//! compared with; so it is kept lean: requests are taken from the admission queue in batches,
//! programs are executed in place with reused scratch buffers, and undo images are recorded
//! only for programs that can abort.

use crate::cluster::EngineCtx;
use crate::exec::{run_program_alone, AloneOptions, Lookahead, TxnScratch};
use crate::protocol::{admit, reply, settle, AdmissionQueue, Admitted, Ending, Engine, TxnRequest};
use crate::runtime::spawn_worker;
use crossbeam_channel::{bounded, Receiver};
use parking_lot::{Mutex, RwLock};
use qstore_core::txn::{Program, TxnOutcome};
use qstore_core::{ConfigError, NodeId, PartitionId, QError, TableId};
use qstore_net::NetCounters;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Requests the executor takes from the admission queue at a time.
const DRAIN_BATCH: usize = 256;

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, QError> {
    if ctx.is_distributed() {
        return Err(ConfigError::new(
            "protocol.name",
            "serial",
            "serial runs the whole cluster on one thread of one process and has no \
             distributed mode; run it embedded (`qstore run --protocol serial`) or pick \
             another protocol",
        )
        .into());
    }
    let (tx, rx) = bounded(ctx.cfg.protocol.admission_queue as usize);
    let pin = ctx.cfg.cluster.pin_threads;
    let exec_ctx = ctx.clone();
    let handle = spawn_worker("serial-exec".into(), pin, 0, move || {
        Executor::new(exec_ctx).run(rx)
    });
    Ok(Box::new(Serial {
        admission: RwLock::new(Some(tx)),
        ctx,
        handle: Mutex::new(Some(handle)),
    }))
}

struct Serial {
    /// `None` once shut down.
    admission: RwLock<Option<AdmissionQueue>>,
    ctx: Arc<EngineCtx>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Engine for Serial {
    fn submit(&self, home: NodeId, req: TxnRequest) {
        // Every node's clients feed the one global executor.
        admit(
            self.admission.read().as_ref(),
            home,
            req,
            None,
            self.ctx.history.as_deref(),
        );
    }

    fn net_counters(&self) -> Option<&NetCounters> {
        None
    }

    fn shutdown(&self) {
        drop(self.admission.write().take());
        if let Some(h) = self.handle.lock().take() {
            let _ = h.join();
        }
    }
}

struct Executor {
    ctx: Arc<EngineCtx>,
    scratch: TxnScratch,
    /// Transactions decided so far: the serialization order.
    decided: u64,
}

impl Executor {
    fn new(ctx: Arc<EngineCtx>) -> Self {
        Executor {
            ctx,
            scratch: TxnScratch::default(),
            decided: 0,
        }
    }

    /// Serves requests until every sender is gone.
    fn run(mut self, rx: Receiver<Admitted>) {
        let mut batch = Vec::with_capacity(DRAIN_BATCH);
        // Program buffers, one per transaction of a drained batch, reused from batch to batch.
        let mut programs: Vec<Program> = Vec::new();
        let mut built = Vec::with_capacity(DRAIN_BATCH);
        let mut keys = Vec::new();
        while let Ok(first) = rx.recv() {
            batch.push(first);
            batch.extend(rx.try_iter().take(DRAIN_BATCH - 1));
            programs.resize_with(programs.len().max(batch.len()), Program::default);
            // Every program of the batch first, so that cache misses are started a few
            // accesses ahead across transaction boundaries (see `Lookahead`).
            keys.clear();
            built.clear();
            for (Admitted { req, .. }, program) in batch.iter().zip(&mut programs) {
                let result = self.ctx.catalog.program_into(&req.call, program);
                if result.is_ok() {
                    keys.extend(program.accesses.iter().map(|a| (a.table, a.key)));
                }
                built.push(result);
            }
            let ctx = self.ctx.clone();
            let locate = |&(table, key): &(TableId, u64)| {
                let part = ctx.store(ctx.pmap.partition_of(table, key));
                (part.table(table), key)
            };
            let ahead = Lookahead::new(&keys, locate);
            ahead.start(0);
            let step = |at| ahead.step(at);
            let mut first = 0;
            for ((Admitted { home, req, .. }, program), result) in
                batch.drain(..).zip(&programs).zip(built.drain(..))
            {
                let outcome = match result {
                    Ok(()) => {
                        let outcome = self.run_program(home, &req, program, (&step, first));
                        first += program.accesses.len();
                        outcome
                    }
                    Err(e) => TxnOutcome::Rejected(e.to_string()),
                };
                reply(&req, outcome);
            }
        }
    }

    fn run_program(
        &mut self,
        home: NodeId,
        req: &TxnRequest,
        program: &Program,
        ahead: (&dyn Fn(usize), usize),
    ) -> TxnOutcome {
        let ctx = &*self.ctx;
        let s = &mut self.scratch;
        let history = ctx.history.as_deref();
        let store = |p: PartitionId| ctx.store(p);
        let steps = &ctx.catalog.steps;
        // SAFETY: the serial protocol runs every transaction of the cluster on this one
        // executor thread; no other thread reads or writes a row while the cluster runs.
        let result = unsafe {
            run_program_alone(
                store,
                &ctx.pmap,
                steps,
                req.id,
                program,
                s,
                AloneOptions {
                    trace: history.is_some(),
                    ahead: Some(ahead),
                },
            )
        };
        let order = self.decided as u128;
        self.decided += 1;
        let ending = match result {
            Ok(()) => Ending::Committed {
                order,
                outputs: std::mem::take(&mut s.outputs),
            },
            Err(abort) => Ending::LogicAbort {
                order,
                why: abort.0.to_string(),
            },
        };
        settle(history, home, req.id, &req.call, &s.trace, ending)
    }
}
