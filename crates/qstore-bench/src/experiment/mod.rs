//! Experiments: a spec per figure of a paper, swept in rounds into `results.csv`, summarised,
//! drawn and judged against the paper's claim (`qstore figure`).

pub mod cdf;
pub mod index;
pub mod metric;
pub mod results;
pub mod spec;
pub mod summary;
pub mod sweep;
pub mod trend;

pub use index::{write_index, FigureRecord};
pub use spec::{Plan, Spec};
pub use sweep::{sweep, Event, Outcome};
