//! `serial`: every transaction of the whole cluster runs to completion, one at a time, in one
//! global order, on one thread, with no concurrency control at all.
//!
//! It is the correctness oracle (its results are those of a serial schedule by construction)
//! and the single-core, no-concurrency-control upper bound that other protocols' throughput is
//! compared with; so it is kept lean: requests are taken from the admission queue in batches,
//! programs are executed in place with reused scratch buffers, and undo images are recorded
//! only for programs that can abort.

use crate::cluster::EngineCtx;
use crate::exec::{run_access, TxnScratch};
use crate::protocol::{Engine, TxnRequest};
use crate::runtime::spawn_worker;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use parking_lot::{Mutex, RwLock};
use qstore_core::txn::{CcAbortCause, Program, TxnOutcome, TxnResponse};
use qstore_core::{ConfigError, NodeId, TxnId};
use qstore_net::NetCounters;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Requests the executor takes from the admission queue at a time.
const DRAIN_BATCH: usize = 256;

pub fn start(ctx: Arc<EngineCtx>) -> Result<Box<dyn Engine>, ConfigError> {
    let (tx, rx) = bounded(ctx.cfg.protocol.admission_queue as usize);
    let pin = ctx.cfg.cluster.pin_threads;
    let exec_ctx = ctx.clone();
    let handle = spawn_worker("serial-exec".into(), pin, 0, move || {
        Executor::new(exec_ctx).run(rx)
    });
    Ok(Box::new(Serial {
        admission: RwLock::new(Some(tx)),
        handle: Mutex::new(Some(handle)),
    }))
}

struct Serial {
    /// `None` once shut down.
    admission: RwLock<Option<Sender<TxnRequest>>>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Engine for Serial {
    fn submit(&self, _home: NodeId, req: TxnRequest) {
        // Every node's clients feed the one global executor.
        let guard = self.admission.read();
        let Some(sender) = guard.as_ref() else {
            return reply(
                &req,
                TxnOutcome::Rejected("cluster is shutting down".into()),
            );
        };
        match sender.try_send(req) {
            Ok(()) => {}
            Err(TrySendError::Full(req)) => {
                reply(&req, TxnOutcome::CcAbort(CcAbortCause::Overload))
            }
            Err(TrySendError::Disconnected(req)) => reply(
                &req,
                TxnOutcome::Rejected("cluster is shutting down".into()),
            ),
        }
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

fn reply(req: &TxnRequest, outcome: TxnOutcome) {
    // A client that went away no longer needs the answer.
    let _ = req.reply.send(TxnResponse {
        id: req.id,
        outcome,
    });
}

struct Executor {
    ctx: Arc<EngineCtx>,
    scratch: TxnScratch,
}

impl Executor {
    fn new(ctx: Arc<EngineCtx>) -> Self {
        Executor {
            ctx,
            scratch: TxnScratch::default(),
        }
    }

    /// Serves requests until every sender is gone.
    fn run(mut self, rx: Receiver<TxnRequest>) {
        let mut batch = Vec::with_capacity(DRAIN_BATCH);
        while let Ok(first) = rx.recv() {
            batch.push(first);
            batch.extend(rx.try_iter().take(DRAIN_BATCH - 1));
            for req in batch.drain(..) {
                let outcome = self.run_request(&req);
                reply(&req, outcome);
            }
        }
    }

    fn run_request(&mut self, req: &TxnRequest) -> TxnOutcome {
        match self.ctx.catalog.program(&req.call) {
            Ok(program) => self.execute(req.id, &program),
            Err(e) => TxnOutcome::Rejected(e.to_string()),
        }
    }

    /// Runs `program` to completion; rolls it back on a logic-induced abort.
    fn execute(&mut self, txn: TxnId, program: &Program) -> TxnOutcome {
        let ctx = &*self.ctx;
        let keep_undo = program.may_abort();
        let s = &mut self.scratch;
        s.begin();
        for a in &program.accesses {
            let store = ctx.store(ctx.pmap.partition_of(a.table, a.key));
            store.table(a.table).prefetch(a.key);
        }
        for a in &program.accesses {
            let store = ctx.store(ctx.pmap.partition_of(a.table, a.key));
            let undo = keep_undo.then_some(&mut s.undo);
            // SAFETY: this is the only thread that touches any row while the cluster runs.
            match unsafe { run_access(store, &ctx.catalog.steps, txn, a, &s.outputs, undo) } {
                Ok(v) => s.outputs.push(v),
                Err(abort) => {
                    // SAFETY: as above; nobody else touches rows.
                    unsafe { s.undo.rollback(|p| ctx.store(p)) };
                    return TxnOutcome::LogicAbort(abort.0.to_string());
                }
            }
        }
        TxnOutcome::Committed(std::mem::take(&mut s.outputs))
    }
}
