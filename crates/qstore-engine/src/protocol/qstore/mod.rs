//! Q-Store: queue-oriented, deterministic distributed transaction processing
//! (Qadah and Sadoghi, EDBT 2020).
//!
//! Every worker of a node is a planner with its own client queue, and an executor. A planner
//! closes a batch when it holds `batch_size` transactions or `batch_timeout_us` has passed,
//! splits each program into fragments, and places them in execution queues by the
//! sub-partition of their records: conflicting accesses always meet in one queue, in planning
//! order. Queues for other nodes travel in one message per (destination, planner). Executors
//! run the queues of each sub-partition in the global priority order (batch, node, planner);
//! queues of one planner run in parallel, a stalled queue (waiting for a value another queue
//! produces) is set aside, never waited on. Values needed across queues are forwarded, across
//! nodes by message. When every queue a planner filled has run (its own node's directly,
//! remote ones acknowledged), its node answers that planner's transactions: no two-phase
//! commit, because no node can refuse.
//!
//! Batches are pipelined: a node keeps up to `pipeline_depth` batches in flight, each
//! sub-partition moving to the next batch as soon as it finished the previous one; a
//! planner may not start a batch beyond that window (the ring of batch slots), which bounds
//! memory and makes slot reuse safe.
//!
//! Transactions that may abort run in one of two paradigms: conservative (a fragment waits
//! before touching a record an undecided transaction wrote; verdicts travel to every node the
//! transaction touches) or speculative (fragments go ahead; aborts cascade, see `spec`).
//! Read-committed isolation sends read-only transactions to read-only queues that read
//! committed copies.

mod batch;
mod msg;
mod node;
mod plan;
mod replica;
mod spec;
mod writes;

pub use node::start;
