//! TPC-C's data: the nine tables of the spec and a static last-name index, as fixed-size
//! rows ([`layout`], [`schema`]), their keys under range partitioning ([`keys`]), the spec's
//! random inputs ([`random`]) and the initial population of a partition ([`load`]).
//!
//! New-Order and Payment are stored procedures ([`procs`]), and [`workload`] runs them as
//! `--workload tpcc` (the New-Order + Payment mix; the other three transactions are not
//! built yet).

pub mod keys;
pub mod layout;
pub mod load;
pub mod procs;
pub mod random;
pub mod schema;
pub mod workload;

pub use keys::{KeyError, TpccKeys};
pub use layout::{Field, Kind, Layout, LayoutError};
pub use load::TpccData;
pub use random::NuRandC;
pub use workload::Tpcc;
