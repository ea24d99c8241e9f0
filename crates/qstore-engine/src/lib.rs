//! The qstore engine: a cluster of nodes, each hosting one partition, running one of the
//! concurrency-control protocols under [`protocol`]. Clients talk to a running cluster through
//! [`Cluster::submit`]; answers come back on the reply channel of each request.

pub mod cluster;
pub mod data_dir;
pub mod exec;
pub mod history;
pub mod net;
pub mod oracle;
pub mod protocol;
pub mod replication;
pub mod runtime;
pub mod server;
pub mod stages;
pub mod timestamp;
pub mod worker_time;

pub use cluster::{Cluster, EngineCtx, Hosting, NodeHosting, StoppedCluster};
pub use protocol::{wall_clock_us, Engine, ReplyTo, TxnRequest, PROTOCOLS};
