//! The checker's findings: anomaly classes, cycles and the report.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::ObjKey;

/// Kind of a direct serialization graph edge `Ti -> Tj` (Adya).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EdgeKind {
    /// Write dependency: Tj installed the version right after Ti's.
    Ww,
    /// Read dependency: Tj read a version Ti wrote.
    Wr,
    /// Anti-dependency: Ti read a version that Tj overwrote (installed the next version of).
    Rw,
}

impl fmt::Display for EdgeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EdgeKind::Ww => "ww",
            EdgeKind::Wr => "wr",
            EdgeKind::Rw => "rw",
        })
    }
}

/// One edge of a reported cycle, with the record that induced it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Edge {
    /// Source transaction id.
    pub from: u64,
    /// Target transaction id.
    pub to: u64,
    /// Dependency kind.
    pub kind: EdgeKind,
    /// A record on which the dependency arises (one of possibly several).
    pub key: Option<ObjKey>,
}

/// Anomaly classes, named after Adya's phenomena where they exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AnomalyClass {
    /// Write cycle: a cycle of ww edges only.
    G0,
    /// Aborted read: a committed transaction read a version written by an aborted one.
    G1a,
    /// Intermediate read: a committed transaction read a non-final version of another.
    G1b,
    /// Circular information flow: a cycle of ww and wr edges with at least one wr.
    G1c,
    /// Anti-dependency cycle: a cycle with at least one rw edge.
    G2,
    /// A read of a version that never existed (or was never installed).
    PhantomVersion,
    /// The version order is inconsistent with the transactions' writes.
    IncompleteOrder,
    /// Structurally invalid history (duplicate or zero ids, zero write counts, ...).
    InvalidHistory,
}

impl fmt::Display for AnomalyClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One reported anomaly.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Anomaly {
    /// Which phenomenon.
    pub class: AnomalyClass,
    /// Transactions involved (for cycles: in cycle order).
    pub txns: Vec<u64>,
    /// Human-readable explanation.
    pub description: String,
    /// For G0, G1c and G2: one short cycle, edge by edge; empty otherwise.
    pub cycle: Vec<Edge>,
}

impl fmt::Display for Anomaly {
    /// Formats as `G2: T17 -rw-> T23 -ww-> T17 (lost update on 0:42)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.class)?;
        let Some(first) = self.cycle.first() else {
            return f.write_str(&self.description);
        };
        write!(f, "T{}", first.from)?;
        for edge in &self.cycle {
            write!(f, " -{}-> T{}", edge.kind, edge.to)?;
        }
        write!(f, " ({})", self.description)
    }
}

/// Number of distinct edges of each kind in the dependency graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EdgeCounts {
    /// Write dependencies.
    pub ww: usize,
    /// Read dependencies.
    pub wr: usize,
    /// Anti-dependencies.
    pub rw: usize,
}

impl EdgeCounts {
    /// All edges.
    pub fn total(&self) -> usize {
        self.ww + self.wr + self.rw
    }
}

/// The result of checking a history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Report {
    /// Committed transactions (graph nodes).
    pub committed: usize,
    /// Aborted transactions.
    pub aborted: usize,
    /// Distinct dependency edges by kind.
    pub edges: EdgeCounts,
    /// How many anomalies of each class were found (including unreported ones).
    /// For cycle classes this counts offending strongly connected components.
    pub anomaly_counts: BTreeMap<AnomalyClass, usize>,
    /// The reported anomalies (capped per class), grouped by class.
    pub anomalies: Vec<Anomaly>,
}

impl Report {
    /// Whether no anomaly of any class was found.
    pub fn is_serializable(&self) -> bool {
        self.anomaly_counts.values().all(|&n| n == 0)
    }

    /// How many anomalies of `class` were found (reported or not).
    pub fn count(&self, class: AnomalyClass) -> usize {
        self.anomaly_counts.get(&class).copied().unwrap_or(0)
    }

    /// The classes with at least one anomaly, in order.
    pub fn classes(&self) -> Vec<AnomalyClass> {
        self.anomaly_counts
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(&class, _)| class)
            .collect()
    }

    fn reported(&self, class: AnomalyClass) -> usize {
        self.anomalies.iter().filter(|a| a.class == class).count()
    }
}

impl fmt::Display for Report {
    /// First line `serializable: yes (N transactions, E edges)` or
    /// `serializable: NO (...)`, then one line per reported anomaly, a note per
    /// class with unreported anomalies, and a summary line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.is_serializable() { "yes" } else { "NO" };
        writeln!(
            f,
            "serializable: {verdict} ({} transactions, {} edges)",
            self.committed,
            self.edges.total()
        )?;
        for anomaly in &self.anomalies {
            writeln!(f, "{anomaly}")?;
        }
        for (&class, &found) in &self.anomaly_counts {
            let hidden = found.saturating_sub(self.reported(class));
            if hidden > 0 {
                writeln!(f, "... and {hidden} more {class} ({found} in total)")?;
            }
        }
        write!(
            f,
            "committed {}, aborted {}; edges ww {}, wr {}, rw {}",
            self.committed, self.aborted, self.edges.ww, self.edges.wr, self.edges.rw
        )
    }
}
