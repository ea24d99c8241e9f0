//! The serializability checker: builds Adya's direct serialization graph (DSG)
//! over committed transactions and reports G0, G1a, G1b, G1c and G2, plus
//! inconsistencies of the recorded history itself.
//!
//! Nodes are dense transaction indices (positions in [`History::txns`]);
//! aborted transactions are isolated nodes. The initial version (writer 0) is
//! not a node: reads of it only induce rw edges to the first installed writer.

use std::collections::BTreeMap;

use crate::graph::{tarjan, CycleFinder, Graph, KindMask, Sccs, Step};
use crate::index::{Index, ReadOf};
use crate::model::History;
use crate::report::{Anomaly, AnomalyClass, Edge, EdgeKind, Report};

/// Tuning knobs for [`check_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOptions {
    /// At most this many anomalies of each class are described in the report;
    /// all of them are counted.
    pub max_reported_per_class: usize,
    /// How many candidate edges to try per offending component when looking
    /// for a short cycle (the shortest found is reported).
    pub cycle_candidates: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            max_reported_per_class: 10,
            cycle_candidates: 4,
        }
    }
}

/// Checks `history` for serializability with default options.
pub fn check(history: &History) -> Report {
    check_with(history, &CheckOptions::default())
}

/// Checks `history` for serializability.
pub fn check_with(history: &History, options: &CheckOptions) -> Report {
    let mut findings = Findings::new(options.max_reported_per_class);
    let index = Index::build(history, &mut findings);
    let edges = index.dependency_edges(&mut findings);
    let graph = Graph::build(
        history.txns.len(),
        &[
            (EdgeKind::Ww, &edges.ww),
            (EdgeKind::Wr, &edges.wr),
            (EdgeKind::Rw, &edges.rw),
        ],
    );
    let edge_counts = edges.counts;
    drop(edges); // The graph holds the edges now; keep peak memory down.
    CycleSearch {
        index: &index,
        graph: &graph,
        findings: &mut findings,
        candidates: options.cycle_candidates.max(1),
    }
    .run();
    findings.anomalies.sort_by_key(|a| a.class);
    Report {
        committed: index.committed,
        aborted: index.aborted,
        edges: edge_counts,
        anomaly_counts: findings.counts,
        anomalies: findings.anomalies,
    }
}

/// Collected anomalies: all are counted, the first few per class described.
pub(crate) struct Findings {
    cap: usize,
    counts: BTreeMap<AnomalyClass, usize>,
    anomalies: Vec<Anomaly>,
}

impl Findings {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            counts: BTreeMap::new(),
            anomalies: Vec::new(),
        }
    }

    /// Counts one anomaly of `class`; returns whether it should be described.
    fn note(&mut self, class: AnomalyClass) -> bool {
        let count = self.counts.entry(class).or_insert(0);
        *count += 1;
        *count <= self.cap
    }

    /// Counts an anomaly without a cycle, describing it lazily.
    pub(crate) fn add(
        &mut self,
        class: AnomalyClass,
        describe: impl FnOnce() -> (Vec<u64>, String),
    ) {
        if self.note(class) {
            let (txns, description) = describe();
            self.anomalies.push(Anomaly {
                class,
                txns,
                description,
                cycle: Vec::new(),
            });
        }
    }
}

/// Finds and reports G2, G1c and G0 cycles.
struct CycleSearch<'a, 'h> {
    index: &'a Index<'h>,
    graph: &'a Graph,
    findings: &'a mut Findings,
    candidates: usize,
}

impl CycleSearch<'_, '_> {
    fn run(&mut self) {
        let all = tarjan(self.graph, KindMask::ALL);
        if all.nontrivial.is_empty() {
            return; // Acyclic: serializable as far as cycles go.
        }
        self.report(AnomalyClass::G2, &all, EdgeKind::Rw, KindMask::ALL);
        let ww_wr = tarjan(self.graph, KindMask::WW_WR);
        self.report(AnomalyClass::G1c, &ww_wr, EdgeKind::Wr, KindMask::WW_WR);
        let ww = tarjan(self.graph, KindMask::WW);
        self.report(AnomalyClass::G0, &ww, EdgeKind::Ww, KindMask::WW);
    }

    /// Reports every component containing an internal `required` edge, i.e. a
    /// cycle over `allowed` edges with at least one `required` edge.
    fn report(&mut self, class: AnomalyClass, sccs: &Sccs, required: EdgeKind, allowed: KindMask) {
        let mut finder = CycleFinder::new(self.graph, &sccs.comp);
        for members in &sccs.nontrivial {
            let mut starts = finder
                .internal_edges(members, required)
                .take(self.candidates);
            let Some(first) = starts.next() else { continue };
            let starts: Vec<Step> = std::iter::once(first).chain(starts).collect();
            if !self.findings.note(class) {
                continue;
            }
            let cycle = starts
                .into_iter()
                .filter_map(|s| finder.cycle_through(s, allowed))
                .min_by_key(Vec::len)
                .unwrap_or_default();
            let anomaly = self.describe_cycle(class, &cycle, members.len());
            self.findings.anomalies.push(anomaly);
        }
    }

    fn describe_cycle(&self, class: AnomalyClass, steps: &[Step], scc_size: usize) -> Anomaly {
        let cycle: Vec<Edge> = steps.iter().map(|s| self.explain(s)).collect();
        let mut description = summarize_cycle(class, &cycle);
        if scc_size > cycle.len() {
            description.push_str(&format!(
                "; strongly connected component of {scc_size} txns"
            ));
        }
        Anomaly {
            class,
            txns: cycle.iter().map(|e| e.from).collect(),
            description,
            cycle,
        }
    }

    /// Turns a graph step into an [`Edge`], finding a record that induces it.
    fn explain(&self, step: &Step) -> Edge {
        let ix = self.index;
        let (from, to) = (step.from, step.to);
        let to_id = ix.id(to);
        let key = match step.kind {
            EdgeKind::Ww => ix
                .slots_of(from)
                .iter()
                .find(|s| s.successor() == Some(to))
                .map(|s| ix.key_list[s.key as usize]),
            EdgeKind::Wr => {
                let from_id = ix.id(from);
                let reads = &ix.history.txns[to as usize].reads;
                reads
                    .iter()
                    .find(|(_, v)| v.writer == from_id)
                    .map(|(k, _)| *k)
            }
            EdgeKind::Rw => {
                let reads = &ix.history.txns[from as usize].reads;
                reads
                    .iter()
                    .find(|&&(k, v)| match ix.resolve_read(from, k, v) {
                        ReadOf::Initial { next } | ReadOf::Committed { next, .. } => {
                            next == Some(to)
                        }
                        _ => false,
                    })
                    .map(|(k, _)| *k)
            }
        };
        Edge {
            from: ix.id(from),
            to: to_id,
            kind: step.kind,
            key,
        }
    }
}

/// A short human explanation of a cycle, naming well-known patterns.
fn summarize_cycle(class: AnomalyClass, cycle: &[Edge]) -> String {
    let key = |e: &Edge| e.key.map_or_else(|| "?".to_string(), |k| k.to_string());
    if let [a, b] = cycle {
        let (rw, other) = if a.kind == EdgeKind::Rw {
            (a, b)
        } else {
            (b, a)
        };
        match (rw.kind, other.kind) {
            (EdgeKind::Rw, EdgeKind::Ww) if rw.key == other.key => {
                return format!("lost update on {}", key(rw));
            }
            (EdgeKind::Rw, EdgeKind::Rw) => {
                return format!("write skew on {} and {}", key(a), key(b));
            }
            (EdgeKind::Rw, EdgeKind::Wr) => {
                return format!(
                    "fractured read: T{} saw T{}'s write of {} but not of {}",
                    rw.from,
                    rw.to,
                    key(other),
                    key(rw)
                );
            }
            _ => {}
        }
    }
    let what = match class {
        AnomalyClass::G0 => "write cycle",
        AnomalyClass::G1c => "circular information flow",
        _ => "anti-dependency cycle",
    };
    let via: Vec<String> = cycle
        .iter()
        .take(8)
        .map(|e| format!("{} {}", e.kind, key(e)))
        .collect();
    let more = if cycle.len() > 8 { ", ..." } else { "" };
    format!(
        "{what} of {} txns via {}{more}",
        cycle.len(),
        via.join(", ")
    )
}
