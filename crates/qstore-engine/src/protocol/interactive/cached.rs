//! Caching at the coordinator of rows read at other nodes (Sundial's section 4), as the
//! skeleton carries it out for a protocol that keeps such a cache ([`Cc::row_cache`]):
//!
//! - **Reads from the cache**: a read of another node's record whose key is fixed, whose
//!   inputs come from earlier waves, and before which the program writes nothing on that node
//!   (the cache cannot show a transaction its own writes), is run by the coordinator on the
//!   cached copy when the cache offers one ([`RowCache::reuse`]). The copy's lease joins the
//!   coordinator's floor, and the read is traced with the version it saw.
//! - **Fills**: a read of another node's record that goes there asks for its row (with the
//!   `wts` of the copy held, so that a current copy costs no bytes); the coordinator caches
//!   what comes back ([`RowCache::fill`]).
//! - **Renewals**: at prepare, every read served from the cache whose lease ends before the
//!   commit timestamp has it renewed at the row's home, in the `Prepare` the home gets (a
//!   home the transaction did not otherwise reach is asked all the same). A failed renewal
//!   votes no and drops the copy.
//! - **Table leases** (read-mostly tables, [`TabLease`]): fills carry the lease of the row's
//!   table, and a home that extended a table's lease while renewing says so before its vote
//!   (`TabLeases`); the cache applies a table's lease to the copies read since its last
//!   write.
//! - A committed write of a cached record drops the copy (the coordinator does not hold the
//!   bytes written: the next read fills it again).
//!
//! [`Cc::row_cache`]: super::Cc::row_cache

use super::coord::CoordTxn;
use super::msg::{Body, Fill, GroupEnd, Renewal, TabLease};
use super::{Cc, Node};
use crate::exec::run_on_copy;
use qstore_core::txn::{AccessKind, CcAbortCause};
use qstore_core::{Key, NodeId, TableId, TxnId};
use qstore_storage::RowVersion;

/// A cached copy of a row of another node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CachedRow {
    pub wts: u64,
    pub rts: u64,
    /// The version's writer and sequence, for the history.
    pub writer: u64,
    pub seq: u16,
    pub bytes: Vec<u8>,
    /// The writes its table had seen when it was read, if the table has a lease.
    pub tab_writes: Option<u64>,
}

/// The lease of a row as a participant read it: its own, and its table's if it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadLease {
    pub wts: u64,
    /// Past the table's lease, if that ends later.
    pub rts: u64,
    pub tab: Option<TabLease>,
}

/// A node's cache of rows of other nodes, as the coordinator uses it.
pub(crate) trait RowCache: Send + Sync {
    /// The copy a read of (`table`, `key`), kept at node `home`, uses instead of asking
    /// there: when one is cached and the policy reuses it. Its `rts` counts its table's lease.
    fn reuse(&self, home: NodeId, table: TableId, key: Key) -> Option<CachedRow>;
    /// A read that goes to the home asks for a fill: `Some(wts)` of the copy held, if any.
    fn held(&self, table: TableId, key: Key) -> Option<u64>;
    /// A fill came back from the home (without bytes: the copy held is current).
    fn fill(&self, home: NodeId, table: TableId, key: Key, fill: &Fill);
    /// Node `home` extended the leases of these tables of its.
    fn tab_leases(&self, home: NodeId, leases: &[(TableId, TabLease)]);
    /// The renewal of the lease of a copy a transaction read reached timestamp `to`
    /// (`None`: it failed).
    fn renewed(&self, table: TableId, key: Key, to: Option<u64>);
    /// A transaction committed a write of (`table`, `key`): the copy is stale.
    fn written(&self, table: TableId, key: Key);
}

/// A read a transaction took from the cache.
#[derive(Clone, Copy, Debug)]
pub(super) struct CachedRead {
    pub node: NodeId,
    pub table: TableId,
    pub key: Key,
    pub wts: u64,
    pub rts: u64,
}

impl<C: Cc> Node<C> {
    /// Runs access `i` (of wave `wave`) on a cached copy instead of sending it to its home,
    /// if the cache offers one and the access may use it; true if it ran.
    pub(super) fn read_from_cache(&self, t: &mut CoordTxn, i: usize, wave: u32) -> bool {
        let Some(cache) = self.cc.row_cache() else {
            return false;
        };
        let program = t.program.clone();
        let a = &program.accesses[i];
        let node = self.node_of(a.table, a.key);
        let cacheable = a.kind == AccessKind::Read
            && a.key_dep.is_none()
            && node != self.id
            && a.deps.iter().all(|&d| t.wave_of[d as usize] < wave)
            && !program.accesses[..i]
                .iter()
                .any(|e| e.kind.is_write() && self.node_of(e.table, e.key) == node);
        if !cacheable {
            return false;
        }
        let Some(mut row) = cache.reuse(node, a.table, a.key) else {
            return false;
        };
        let Ok(access) = a.as_ref().resolve(&t.outputs) else {
            return false;
        };
        let mut present = true;
        let steps = &self.ctx.catalog.steps;
        match run_on_copy(steps, access, &mut row.bytes, &mut present, &t.outputs).0 {
            Ok(v) => t.outputs[i] = v,
            Err(abort) => t.fail(GroupEnd::LogicAbort(abort.0.to_string())),
        }
        t.at.ts = t.at.ts.max(row.wts);
        t.from_cache[i] = true;
        t.cached.push(CachedRead {
            node,
            table: a.table,
            key: a.key,
            wts: row.wts,
            rts: row.rts,
        });
        if self.ctx.history.is_some() {
            let version = RowVersion {
                writer: TxnId(row.writer),
                seq: row.seq,
                dead: false,
            };
            t.trace.read(a.table, a.key, version);
        }
        true
    }

    /// The fills to ask of `node` for the accesses of `group`: its reads of records with fixed
    /// keys, each with the `wts` of the copy held.
    pub(super) fn fills_wanted(&self, t: &CoordTxn, group: &[u16]) -> Vec<(u16, Option<u64>)> {
        let Some(cache) = self.cc.row_cache() else {
            return Vec::new();
        };
        group
            .iter()
            .filter_map(|&i| {
                let a = &t.program.accesses[i as usize];
                let wanted = a.kind == AccessKind::Read && a.key_dep.is_none();
                wanted.then(|| (i, cache.held(a.table, a.key)))
            })
            .collect()
    }

    /// Caches the rows `from` sent back (only for reads of records it holds).
    pub(super) fn take_fills(&self, t: &CoordTxn, from: NodeId, fills: Vec<Fill>) {
        let Some(cache) = self.cc.row_cache() else {
            return;
        };
        for f in fills {
            let Some(a) = t.program.accesses.get(f.idx as usize) else {
                continue;
            };
            let fits = a.kind == AccessKind::Read
                && a.key_dep.is_none()
                && self.node_of(a.table, a.key) == from;
            if fits {
                cache.fill(from, a.table, a.key, &f);
            }
        }
    }

    /// The renewals the transaction's cached reads need at commit timestamp `t.at.ts`, by
    /// home; each home becomes a participant (it votes).
    pub(super) fn renewals(&self, t: &mut CoordTxn) -> Vec<(NodeId, Renewal)> {
        let ts = t.at.ts;
        let due: Vec<(NodeId, Renewal)> = t
            .cached
            .iter()
            .filter(|c| ts > c.rts)
            .map(|c| {
                let r = Renewal {
                    table: c.table,
                    key: c.key,
                    wts: c.wts,
                };
                (c.node, r)
            })
            .collect();
        for (node, _) in &due {
            t.participant(*node);
        }
        due
    }

    /// A home voted on the renewals it was asked for.
    pub(super) fn renewals_voted(&self, t: &CoordTxn, from: NodeId, ok: bool) {
        if let Some(cache) = self.cc.row_cache() {
            for (_, r) in t.renewing.iter().filter(|(n, _)| *n == from) {
                cache.renewed(r.table, r.key, ok.then_some(t.at.ts));
            }
        }
    }

    /// The transaction committed: the copies of what it wrote are stale.
    pub(super) fn drop_written(&self, t: &CoordTxn) {
        if let Some(cache) = self.cc.row_cache() {
            for a in t.program.accesses.iter().filter(|a| a.kind.is_write()) {
                cache.written(a.table, a.key);
            }
        }
    }

    /// A participant renews the leases of rows the transaction read from its coordinator's
    /// cache, at commit timestamp `ts`; the table leases this extended, to go back to the
    /// cache.
    pub(super) fn renew_cached(
        &self,
        txn: TxnId,
        ts: u64,
        renew: &[Renewal],
    ) -> Result<Vec<(TableId, TabLease)>, CcAbortCause> {
        let mut tables = Vec::new();
        for r in renew {
            if r.table as usize >= self.ctx.catalog.tables.len() {
                return Err(CcAbortCause::LeaseOverwritten);
            }
            let table = self.store().table(r.table);
            // A record that is gone was rewritten since (rows keep their slot when deleted).
            let rid = table.slot(r.key).ok_or(CcAbortCause::LeaseOverwritten)?;
            self.cc.renew_cached(txn, r.table, rid, r.wts, ts)?;
            if !tables.contains(&r.table) {
                tables.push(r.table);
            }
        }
        let leases = tables
            .into_iter()
            .filter_map(|t| Some((t, self.cc.tab_lease(t)?)))
            .collect();
        Ok(leases)
    }

    /// Tells `coord` the table leases its cache may use (if any).
    pub(super) fn send_tab_leases(
        &self,
        coord: NodeId,
        txn: TxnId,
        leases: Vec<(TableId, TabLease)>,
    ) {
        if !leases.is_empty() {
            self.send(coord, txn, Body::TabLeases(leases));
        }
    }

    /// A home of cached rows extended its tables' leases (tables this catalog lacks, which
    /// only a faulty peer names, are ignored).
    pub(super) fn take_tab_leases(&self, home: NodeId, leases: &[(TableId, TabLease)]) {
        let tables = self.ctx.catalog.tables.len();
        if let Some(cache) = self.cc.row_cache() {
            let known: Vec<_> = leases
                .iter()
                .filter(|(t, _)| (*t as usize) < tables)
                .copied()
                .collect();
            cache.tab_leases(home, &known);
        }
    }
}
