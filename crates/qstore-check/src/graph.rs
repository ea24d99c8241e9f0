//! A compact dependency graph (CSR adjacency with edge kinds), iterative
//! Tarjan SCCs and shortest-cycle search.

use crate::report::EdgeKind;

/// A set of edge kinds, as a bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KindMask(u8);

impl KindMask {
    pub(crate) const WW: KindMask = KindMask(1);
    pub(crate) const WW_WR: KindMask = KindMask(1 | 2);
    pub(crate) const ALL: KindMask = KindMask(1 | 2 | 4);

    fn bit(kind: EdgeKind) -> u8 {
        match kind {
            EdgeKind::Ww => 1,
            EdgeKind::Wr => 2,
            EdgeKind::Rw => 4,
        }
    }

    pub(crate) fn contains(self, kind: EdgeKind) -> bool {
        self.0 & Self::bit(kind) != 0
    }
}

/// Edges of one kind, packed as `src << 32 | dst`.
#[derive(Debug, Default)]
pub(crate) struct EdgeList(Vec<u64>);

impl EdgeList {
    pub(crate) fn push(&mut self, src: u32, dst: u32) {
        self.0.push(u64::from(src) << 32 | u64::from(dst));
    }

    /// Sorts and removes parallel edges; returns the number of distinct edges.
    pub(crate) fn dedup(&mut self) -> usize {
        self.0.sort_unstable();
        self.0.dedup();
        self.0.len()
    }

    fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.0.iter().map(|&e| ((e >> 32) as u32, e as u32))
    }
}

/// Directed graph in compressed sparse row form; node `v`'s out-edges are
/// `targets[offsets[v]..offsets[v + 1]]`, with their kinds alongside.
#[derive(Debug)]
pub(crate) struct Graph {
    offsets: Vec<u32>,
    targets: Vec<u32>,
    kinds: Vec<EdgeKind>,
}

impl Graph {
    /// Builds the graph from per-kind edge lists. Within a node, ww edges come
    /// first, then wr, then rw, so searches prefer the strongest explanation.
    pub(crate) fn build(n: usize, lists: &[(EdgeKind, &EdgeList)]) -> Graph {
        let mut offsets = vec![0u32; n + 1];
        for (_, list) in lists {
            for (src, _) in list.iter() {
                offsets[src as usize + 1] += 1;
            }
        }
        for v in 0..n {
            offsets[v + 1] += offsets[v];
        }
        let m = offsets[n] as usize;
        let mut cursor = offsets[..n].to_vec();
        let mut targets = vec![0u32; m];
        let mut kinds = vec![EdgeKind::Ww; m];
        for (kind, list) in lists {
            for (src, dst) in list.iter() {
                let slot = cursor[src as usize] as usize;
                cursor[src as usize] += 1;
                targets[slot] = dst;
                kinds[slot] = *kind;
            }
        }
        Graph {
            offsets,
            targets,
            kinds,
        }
    }

    /// Number of nodes.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Out-edges of `v` as `(target, kind)`.
    pub(crate) fn edges(&self, v: u32) -> impl Iterator<Item = (u32, EdgeKind)> + '_ {
        let range = self.edge_range(v);
        self.targets[range.clone()]
            .iter()
            .copied()
            .zip(self.kinds[range].iter().copied())
    }

    fn edge_range(&self, v: u32) -> std::ops::Range<usize> {
        self.offsets[v as usize] as usize..self.offsets[v as usize + 1] as usize
    }
}

/// Strongly connected components of a graph restricted to some edge kinds.
#[derive(Debug)]
pub(crate) struct Sccs {
    /// Component id of every node.
    pub(crate) comp: Vec<u32>,
    /// Members of each component with more than one node, in discovery order.
    pub(crate) nontrivial: Vec<Vec<u32>>,
}

const UNVISITED: u32 = u32::MAX;

/// Tarjan's algorithm with an explicit call stack (no recursion), considering
/// only edges whose kind is in `mask`.
pub(crate) fn tarjan(g: &Graph, mask: KindMask) -> Sccs {
    let mut t = Tarjan::new(g.len());
    for root in 0..g.len() as u32 {
        if t.index[root as usize] == UNVISITED {
            t.run_from(g, mask, root);
        }
    }
    Sccs {
        comp: t.comp,
        nontrivial: t.nontrivial,
    }
}

/// State of an iterative Tarjan run.
struct Tarjan {
    index: Vec<u32>,
    low: Vec<u32>,
    on_stack: Vec<bool>,
    comp: Vec<u32>,
    stack: Vec<u32>,
    /// Simulated recursion: node and the next out-edge to examine.
    calls: Vec<(u32, usize)>,
    nontrivial: Vec<Vec<u32>>,
    next_index: u32,
    next_comp: u32,
}

impl Tarjan {
    fn new(n: usize) -> Self {
        Self {
            index: vec![UNVISITED; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            comp: vec![UNVISITED; n],
            stack: Vec::new(),
            calls: Vec::new(),
            nontrivial: Vec::new(),
            next_index: 0,
            next_comp: 0,
        }
    }

    /// Depth-first search from `root`, emitting every component it closes.
    fn run_from(&mut self, g: &Graph, mask: KindMask, root: u32) {
        self.enter(g, root);
        while let Some(&(v, cursor)) = self.calls.last() {
            if cursor < g.edge_range(v).end {
                if let Some(top) = self.calls.last_mut() {
                    top.1 += 1;
                }
                if mask.contains(g.kinds[cursor]) {
                    self.relax(g, v, g.targets[cursor]);
                }
                continue;
            }
            self.calls.pop();
            if let Some(&(parent, _)) = self.calls.last() {
                self.low[parent as usize] = self.low[parent as usize].min(self.low[v as usize]);
            }
            if self.low[v as usize] == self.index[v as usize] {
                self.close_component(v);
            }
        }
    }

    /// Handles edge `v -> w`: descend into `w` or update `v`'s low-link.
    fn relax(&mut self, g: &Graph, v: u32, w: u32) {
        if self.index[w as usize] == UNVISITED {
            self.enter(g, w);
        } else if self.on_stack[w as usize] {
            self.low[v as usize] = self.low[v as usize].min(self.index[w as usize]);
        }
    }

    fn enter(&mut self, g: &Graph, v: u32) {
        self.index[v as usize] = self.next_index;
        self.low[v as usize] = self.next_index;
        self.next_index += 1;
        self.on_stack[v as usize] = true;
        self.stack.push(v);
        self.calls.push((v, g.edge_range(v).start));
    }

    /// Pops the component rooted at `root` off the stack.
    fn close_component(&mut self, root: u32) {
        if self.stack.last() == Some(&root) {
            // Singleton component: the common case, handled without allocating.
            self.stack.pop();
            self.on_stack[root as usize] = false;
            self.comp[root as usize] = self.next_comp;
            self.next_comp += 1;
            return;
        }
        let at = self.stack.iter().rposition(|&x| x == root).unwrap_or(0);
        let members = self.stack.split_off(at);
        for &m in &members {
            self.on_stack[m as usize] = false;
            self.comp[m as usize] = self.next_comp;
        }
        self.next_comp += 1;
        if members.len() > 1 {
            self.nontrivial.push(members);
        }
    }
}

/// One step of a cycle: `from -kind-> to` (dense node indices).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) kind: EdgeKind,
}

/// Reusable breadth-first search state for finding short cycles inside one SCC.
pub(crate) struct CycleFinder<'g> {
    graph: &'g Graph,
    comp: &'g [u32],
    stamp: Vec<u32>,
    parent: Vec<(u32, EdgeKind)>,
    round: u32,
}

impl<'g> CycleFinder<'g> {
    pub(crate) fn new(graph: &'g Graph, comp: &'g [u32]) -> Self {
        Self {
            graph,
            comp,
            stamp: vec![0; graph.len()],
            parent: vec![(0, EdgeKind::Ww); graph.len()],
            round: 0,
        }
    }

    /// Edges of kind `required` whose endpoints are both in the component of
    /// `members`, in member order.
    pub(crate) fn internal_edges<'a>(
        &'a self,
        members: &'a [u32],
        required: EdgeKind,
    ) -> impl Iterator<Item = Step> + 'a {
        members.iter().flat_map(move |&u| {
            self.graph
                .edges(u)
                .filter(move |&(w, kind)| {
                    kind == required && self.comp[w as usize] == self.comp[u as usize]
                })
                .map(move |(to, kind)| Step { from: u, to, kind })
        })
    }

    /// The shortest cycle that starts with `first` and returns to its source
    /// using only `allowed` edges inside the same component.
    pub(crate) fn cycle_through(&mut self, first: Step, allowed: KindMask) -> Option<Vec<Step>> {
        let mut path = self.shortest_path(first.to, first.from, allowed)?;
        path.insert(0, first);
        Some(path)
    }

    /// BFS from `src` to `dst` within `src`'s component.
    fn shortest_path(&mut self, src: u32, dst: u32, allowed: KindMask) -> Option<Vec<Step>> {
        self.round += 1;
        let round = self.round;
        let comp = self.comp[src as usize];
        let mut queue = std::collections::VecDeque::from([src]);
        self.stamp[src as usize] = round;
        while let Some(v) = queue.pop_front() {
            if v == dst {
                return Some(self.path_to(src, dst));
            }
            for (w, kind) in self.graph.edges(v) {
                let wi = w as usize;
                if allowed.contains(kind) && self.comp[wi] == comp && self.stamp[wi] != round {
                    self.stamp[wi] = round;
                    self.parent[wi] = (v, kind);
                    queue.push_back(w);
                }
            }
        }
        None
    }

    fn path_to(&self, src: u32, dst: u32) -> Vec<Step> {
        let mut steps = Vec::new();
        let mut v = dst;
        while v != src {
            let (from, kind) = self.parent[v as usize];
            steps.push(Step { from, to: v, kind });
            v = from;
        }
        steps.reverse();
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(n: usize, ww: &[(u32, u32)], rw: &[(u32, u32)]) -> Graph {
        let mut a = EdgeList::default();
        let mut b = EdgeList::default();
        ww.iter().for_each(|&(s, d)| a.push(s, d));
        rw.iter().for_each(|&(s, d)| b.push(s, d));
        a.dedup();
        b.dedup();
        Graph::build(n, &[(EdgeKind::Ww, &a), (EdgeKind::Rw, &b)])
    }

    #[test]
    fn tarjan_finds_components_respecting_mask() {
        let g = graph(5, &[(0, 1), (1, 2), (3, 4)], &[(2, 0), (4, 3)]);
        let all = tarjan(&g, KindMask::ALL);
        assert_eq!(all.nontrivial.len(), 2);
        let ww = tarjan(&g, KindMask::WW);
        assert!(ww.nontrivial.is_empty());
    }

    #[test]
    fn tarjan_handles_deep_chains_without_recursion() {
        let n = 200_000u32;
        let chain: Vec<_> = (0..n - 1).map(|v| (v, v + 1)).collect();
        let g = graph(n as usize, &chain, &[(n - 1, 0)]);
        let sccs = tarjan(&g, KindMask::ALL);
        assert_eq!(sccs.nontrivial.len(), 1);
        assert_eq!(sccs.nontrivial[0].len(), n as usize);
    }

    #[test]
    fn cycle_finder_returns_shortest_cycle_through_edge() {
        let g = graph(4, &[(0, 1), (1, 2), (2, 3), (1, 3)], &[(3, 0)]);
        let sccs = tarjan(&g, KindMask::ALL);
        let mut finder = CycleFinder::new(&g, &sccs.comp);
        let first = Step {
            from: 3,
            to: 0,
            kind: EdgeKind::Rw,
        };
        let cycle = finder.cycle_through(first, KindMask::ALL).unwrap();
        assert_eq!(cycle.len(), 3);
        assert_eq!(cycle.last().unwrap().to, 3);
    }
}
