//! TPC-C's data: the nine tables of the spec and a static last-name index, as fixed-size
//! rows ([`layout`], [`schema`]), their keys under range partitioning ([`keys`]), the spec's
//! random inputs ([`random`]) and the initial population of a partition ([`load`]).
//!
//! The stored procedures of the five transactions build on these; until they exist, `tpcc`
//! is not among the workloads `--workload` accepts.

pub mod keys;
pub mod layout;
pub mod load;
pub mod random;
pub mod schema;

pub use keys::{KeyError, TpccKeys};
pub use layout::{Field, Kind, Layout, LayoutError};
pub use load::TpccData;
pub use random::NuRandC;
