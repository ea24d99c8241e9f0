//! What Q-Store nodes say to each other.

use qstore_core::txn::{Access, AccessKind, AccessRef, KeyDep, StepId, Value};
use qstore_core::TableId;
use qstore_core::{NodeId, TxnId};
use serde::{Deserialize, Serialize};

/// Where a transaction sits in the global order: batch, then planner rank (node priority,
/// then planner priority), then its place in the planner's batch. Every node executes
/// conflicting accesses in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TxnPos {
    pub batch: u64,
    pub rank: u32,
    pub seq: u32,
}

impl TxnPos {
    /// The position as one sortable number (for histories and the serial oracle).
    pub fn order_key(self) -> u128 {
        (self.batch as u128) << 64 | (self.rank as u128) << 32 | self.seq as u128
    }
}

/// The accesses of one transaction that fall into one execution queue, in program order.
/// (The paper's fragments group accesses by record; grouping all of a transaction's accesses
/// of one queue keeps data dependencies inside a queue in program order, so a queue never
/// waits on itself.) The accesses themselves live in the queue's `ops`, fragment after
/// fragment: see [`Eq`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Frag {
    pub seq: u32,
    /// Where its accesses start in the queue's `ops`, and how many there are.
    pub start: u32,
    pub id: TxnId,
    pub len: u16,
    /// Accesses in the whole program (sizes the value table of dependent fragments).
    pub n_accesses: u16,
    /// Data dependencies and fate, for the fragments that have any. Most have none, and
    /// keeping these out of line makes a fragment a third of the size: planners write and
    /// executors read one per transaction and queue.
    pub links: Option<Box<FragLinks>>,
}

// Planners write, and executors read, these per access and per (transaction, queue).
const _: () = assert!(std::mem::size_of::<Frag>() <= 32 && std::mem::size_of::<Op>() <= 32);

/// The rarer parts of a fragment.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FragLinks {
    /// Outputs of accesses outside this fragment that its accesses need.
    pub needs: Vec<u16>,
    /// Where this fragment's outputs must go besides the home node: (access index, whether a
    /// fragment on this node needs it, other nodes that need it).
    pub routes: Vec<Route>,
    /// Set when the transaction may abort: how its fate is decided.
    pub fate: Option<FateInfo>,
}

impl Frag {
    /// A fragment of transaction `id` (`seq` in its batch, `n_accesses` in its program) with
    /// no accesses yet; they will start at `start` in its queue's `ops`.
    pub fn empty(seq: u32, id: TxnId, start: u32, n_accesses: u16) -> Self {
        Frag {
            seq,
            start,
            id,
            len: 0,
            n_accesses,
            links: None,
        }
    }

    /// Outputs of accesses outside this fragment that its accesses need.
    pub fn needs(&self) -> &[u16] {
        self.links.as_ref().map_or(&[], |l| &l.needs)
    }

    /// Where its outputs must go besides the home node.
    pub fn routes(&self) -> &[Route] {
        self.links.as_ref().map_or(&[], |l| &l.routes)
    }

    /// How the fate of its transaction is decided, if it may abort.
    pub fn fate(&self) -> Option<&FateInfo> {
        self.links.as_ref().and_then(|l| l.fate.as_ref())
    }

    /// Its links, made when first needed (planning).
    pub fn links_mut(&mut self) -> &mut FragLinks {
        self.links.get_or_insert_with(Box::default)
    }
}

/// A fragment together with its accesses and their side records.
#[derive(Clone, Copy)]
pub struct FragRef<'a> {
    pub head: &'a Frag,
    pub accesses: &'a [Op],
    extras: &'a [OpExtra],
}

impl std::ops::Deref for FragRef<'_> {
    type Target = Frag;
    fn deref(&self) -> &Frag {
        self.head
    }
}

impl<'a> FragRef<'a> {
    /// Operation `op` of this fragment as storage runs it. An integer argument is unpacked
    /// into `int_arg`.
    pub fn access<'b>(&self, op: &'b Op, int_arg: &'b mut Value) -> AccessRef<'b>
    where
        'a: 'b,
    {
        static NULL: Value = Value::Null;
        let (arg, deps, key_dep): (&Value, &[u16], _) = match self.extras.get(op.extra as usize) {
            Some(x) => (&x.arg, &x.deps, x.key_dep),
            None if op.int_arg => {
                *int_arg = Value::Int(op.arg);
                (int_arg, &[], None)
            }
            None => (&NULL, &[], None),
        };
        AccessRef {
            table: op.table,
            key: op.key,
            kind: op.kind,
            step: op.step,
            arg,
            deps,
            may_abort: op.may_abort,
            key_dep,
            derived: false,
            output: true,
        }
    }

    /// Whether any of its operations reads outputs of earlier accesses.
    pub fn has_deps(&self) -> bool {
        let extras = self.extras;
        self.accesses.iter().any(|op| {
            extras
                .get(op.extra as usize)
                .is_some_and(|x| !x.deps.is_empty())
        })
    }
}

/// A compact operation record: one access of a fragment, as queues carry it. The common
/// access (a null or integer argument, no data dependencies) fits in 32 bytes, less than half
/// of a program's [`Access`]; the rest keep their argument and dependencies in the queue's
/// `extras`. Queues are written by a planner and read by executors on other cores and nodes,
/// so their size is what planning and execution move around.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Op {
    pub key: u64,
    /// The step's argument when `int_arg` is set.
    pub arg: i64,
    /// Where its argument and dependencies are in the queue's `extras`, or [`Op::PLAIN`].
    pub extra: u32,
    pub table: TableId,
    /// Its index in the transaction's program.
    pub idx: u16,
    pub step: StepId,
    pub kind: AccessKind,
    pub int_arg: bool,
    pub may_abort: bool,
}

impl Op {
    /// `extra` of an operation whose argument is null or an integer, with no dependencies.
    pub const PLAIN: u32 = u32::MAX;
}

/// The argument and data dependencies of an operation that does not fit [`Op`] alone.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpExtra {
    pub arg: Value,
    pub deps: Vec<u16>,
    /// A derived access's key dependency (a derived access always has deps, so an extra).
    pub key_dep: Option<KeyDep>,
}

/// How the fate of a transaction that may abort is decided: each of its `abortables`
/// accesses, where it runs, sends its verdict to every node in `notify` (the nodes it touches
/// and its home). Every node so reaches the same decision on its own.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FateInfo {
    pub abortables: u16,
    pub notify: Vec<NodeId>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Route {
    pub idx: u16,
    pub local: bool,
    pub nodes: Vec<NodeId>,
}

/// One execution queue: the fragments one planner placed into one sub-partition of one
/// node in one batch, in planning order. Their accesses are stored flat, in one vector per
/// queue rather than one per fragment: planning allocates per queue, not per transaction, and
/// an executor reads them front to back.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Eq {
    pub sub: u32,
    pub frags: Vec<Frag>,
    pub ops: Vec<Op>,
    pub extras: Vec<OpExtra>,
}

impl Eq {
    /// Fragment `i` with its accesses.
    pub fn frag(&self, i: usize) -> Option<FragRef<'_>> {
        let head = self.frags.get(i)?;
        let start = head.start as usize;
        Some(FragRef {
            head,
            accesses: &self.ops[start..start + head.len as usize],
            extras: &self.extras,
        })
    }

    /// Appends access `idx` of a program (the current fragment's accesses must be appended
    /// together).
    #[inline]
    pub fn push_op(&mut self, idx: u16, a: &Access) {
        let (arg, int_arg, extra) = match (&a.arg, a.deps.is_empty()) {
            (Value::Null, true) => (0, false, Op::PLAIN),
            (&Value::Int(v), true) => (v, true, Op::PLAIN),
            _ => {
                self.extras.push(OpExtra {
                    arg: a.arg.clone(),
                    deps: a.deps.clone(),
                    key_dep: a.key_dep,
                });
                (0, false, self.extras.len() as u32 - 1)
            }
        };
        self.ops.push(Op {
            key: a.key,
            arg,
            extra,
            table: a.table,
            idx,
            step: a.step,
            kind: a.kind,
            int_arg,
            may_abort: a.may_abort,
        });
    }

    /// Whether every fragment's accesses, and every operation's side record, lie inside the
    /// queue (a queue from the network is checked before it is installed).
    pub fn is_well_formed(&self) -> bool {
        let extras = self.extras.len();
        self.frags
            .iter()
            .all(|f| f.start as usize + f.len as usize <= self.ops.len())
            && self
                .ops
                .iter()
                .all(|op| op.extra == Op::PLAIN || (op.extra as usize) < extras)
    }
}

/// An access output reported to the home node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Output {
    pub seq: u32,
    pub idx: u16,
    pub value: Value,
}

/// The outputs of one planner's queues at one node: a list per queue run, joined without
/// copying.
pub type Outputs = Vec<Vec<Output>>;

#[derive(Debug, Serialize, Deserialize)]
pub enum QMsg {
    /// Planner `rank`'s execution queues for the receiving node in `batch`; an empty list
    /// tells the receiver that this planner has nothing for it in that batch. `checkpoint`
    /// (only from node 0's first planner): every node checkpoints after this batch; `copy`
    /// (the same): every node copies its partition after it for a stale instance.
    Plan {
        batch: u64,
        rank: u32,
        eqs: Vec<Eq>,
        checkpoint: bool,
        copy: Option<crate::replication::rebuild::CopyFor>,
    },
    /// Every fragment planner `rank` sent the sender in `batch` has run; here are their
    /// outputs.
    /// (Speculative mode with abortable transactions: `notes` report fates.)
    Ack {
        batch: u64,
        rank: u32,
        outputs: Outputs,
        notes: Vec<FateNote>,
        /// Replication point 3: the records those fragments wrote, as they left them.
        written: Vec<super::writes::Written>,
    },
    /// Speculative mode: the fates of planner `rank`'s transactions in `batch`, decided by
    /// their home: these aborted, every other one committed.
    Final {
        batch: u64,
        rank: u32,
        aborted: Vec<u32>,
    },
    /// A value an access produced, needed by a fragment at the receiver.
    Dep { pos: TxnPos, idx: u16, value: Value },
    /// The verdict of one access that may abort: `None` if it passed, else why it aborted.
    /// `abortables` is the number of verdicts the transaction's fate needs.
    Vote {
        pos: TxnPos,
        abortables: u16,
        abort: Option<String>,
    },
    /// Replication: a raft message between members of a replica group.
    Raft(crate::replication::ReplMsg),
    /// Replication: planner `rank`'s batch `batch` is committed in its group's log (from the
    /// node that delivered it in the receiver's instance).
    Logged { batch: u64, rank: u32 },
    /// Replication: the sender's instance (the receiver's) ran plans no log committed, or
    /// lost a node; it takes no further part in the run.
    Stale,
    /// Replication: rebuilding a stale instance from another's copies (see `rebuild`).
    Rebuild(crate::replication::rebuild::RebuildMsg),
    /// Durability: the checkpoints the sender holds, by batch (see `checkpoint`); with
    /// `asking`, it restarted and wants the receiver's.
    Checkpoints { have: Vec<u64>, asking: bool },
}

impl QMsg {
    /// Whether it is a message of transaction processing inside an instance (plans, values,
    /// verdicts, acknowledgements, fates, log commits), as opposed to replication's own.
    pub fn is_of_a_run(&self) -> bool {
        matches!(
            self,
            QMsg::Plan { .. }
                | QMsg::Ack { .. }
                | QMsg::Final { .. }
                | QMsg::Dep { .. }
                | QMsg::Vote { .. }
                | QMsg::Logged { .. }
        )
    }
}

/// Speculative mode: what a node that ran some of a planner's batch reports about one of its
/// transactions, for the home to decide its fate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FateNote {
    pub seq: u32,
    /// It touched a write here that was rolled back.
    pub cascade: bool,
    /// One of its integrity checks here failed.
    pub abort: Option<String>,
    /// Earlier transactions of the same planner batch whose undecided writes it touched here.
    pub after: Vec<u32>,
}

impl FateNote {
    pub fn says_something(&self) -> bool {
        self.cascade || self.abort.is_some() || !self.after.is_empty()
    }
}

impl crate::protocol::checkpoint::CheckpointMsg for QMsg {
    fn checkpoints(have: Vec<u64>, asking: bool) -> Self {
        QMsg::Checkpoints { have, asking }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(arg: Value, deps: Vec<u16>) -> Access {
        Access {
            table: 1,
            key: 42,
            kind: AccessKind::ReadModifyWrite,
            step: StepId(3),
            arg,
            deps,
            may_abort: true,
            key_dep: None,
        }
    }

    fn one_frag(accesses: Vec<Access>) -> Eq {
        let mut eq = Eq::default();
        let len = accesses.len() as u16;
        for (i, a) in accesses.iter().enumerate() {
            eq.push_op(i as u16, a);
        }
        let mut frag = Frag::empty(0, TxnId(1), 0, len);
        frag.len = len;
        eq.frags.push(frag);
        eq
    }

    #[test]
    fn compact_operations_give_back_the_accesses_they_were_made_from() {
        let accesses = vec![
            access(Value::Null, vec![]),
            access(Value::Int(-7), vec![]),
            access(Value::Bytes(b"xyz".to_vec()), vec![]),
            access(Value::Int(5), vec![0, 1]),
        ];
        let eq = one_frag(accesses.clone());
        assert_eq!(
            eq.extras.len(),
            2,
            "only the bytes and the dependent access"
        );
        assert!(eq.is_well_formed());
        let frag = eq.frag(0).expect("fragment 0");
        assert!(frag.has_deps());
        for (op, original) in frag.accesses.iter().zip(&accesses) {
            let mut int_arg = Value::Null;
            let a = frag.access(op, &mut int_arg);
            let want = original.as_ref();
            assert_eq!(
                (a.table, a.key, a.kind, a.step),
                (1, 42, want.kind, want.step)
            );
            assert_eq!((a.arg, a.deps), (want.arg, want.deps));
            assert!(op.may_abort);
        }
        assert_eq!(std::mem::size_of::<Op>(), 32);
    }

    #[test]
    fn operations_pointing_outside_the_extras_are_malformed() {
        let mut eq = one_frag(vec![access(Value::Int(1), vec![0])]);
        eq.ops[0].extra = 5;
        assert!(!eq.is_well_formed());
    }
}
