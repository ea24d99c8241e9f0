//! A sequenced transaction as one node sees it: the read/write-set analysis (Calvin's
//! phase 1) that every node makes alike from the program, and the copies of remote records an
//! executing participant collects.

use super::msg::{Pos, Reads};
use qstore_core::partition::PartitionMap;
use qstore_core::txn::Program;
use qstore_core::{Key, TableId, TxnId};
use rustc_hash::FxHashMap;

/// Programs with more accesses than this find repeated records by hashing, not scanning.
const LINEAR_DEDUP: usize = 32;

/// The nodes a transaction involves, both lists sorted.
#[derive(Debug, PartialEq)]
pub struct Roles {
    /// Nodes holding a record the program accesses.
    pub participants: Vec<u32>,
    /// Active participants (nodes where the program writes); when it writes nowhere, the
    /// lowest participant, which then executes the program for its home.
    pub executing: Vec<u32>,
}

/// Phase 1: who takes part in a transaction sequenced at `home`. A program without accesses
/// is executed by its home.
pub fn roles(program: &Program, pmap: &PartitionMap, home: u32) -> Roles {
    let mut participants: Vec<u32> = Vec::with_capacity(2);
    let mut executing: Vec<u32> = Vec::with_capacity(2);
    for a in &program.accesses {
        let node = pmap.partition_of(a.table, a.key).0;
        if !participants.contains(&node) {
            participants.push(node);
        }
        if a.kind.is_write() && !executing.contains(&node) {
            executing.push(node);
        }
    }
    participants.sort_unstable();
    executing.sort_unstable();
    if participants.is_empty() {
        participants.push(home);
    }
    if executing.is_empty() {
        executing.push(participants[0]);
    }
    Roles {
        participants,
        executing,
    }
}

/// Why Calvin cannot run `program` with these roles, if it cannot: a derived access that
/// outputs a value runs only where its range is (no other node knows its key in advance to
/// send a copy of its record), so that node must be the only one executing the program.
pub fn unrunnable(program: &Program, pmap: &PartitionMap, roles: &Roles) -> Option<String> {
    let (i, a) = program
        .accesses
        .iter()
        .enumerate()
        .filter(|(_, a)| a.key_dep.is_some_and(|d| d.output))
        .find(|(_, a)| roles.executing != [pmap.partition_of(a.table, a.key).0])?;
    Some(format!(
        "calvin cannot run this call: access {i} reads a derived key and outputs a value, but \
         nodes {:?} execute the program, and only node {} can run that access (keep a program \
         with derived outputs within one partition)",
        roles.executing,
        pmap.partition_of(a.table, a.key).0
    ))
}

/// One distinct record of a program.
#[derive(Clone, Debug, PartialEq)]
pub struct Rec {
    pub table: TableId,
    pub key: Key,
    pub node: u32,
    /// Whether some access of the program writes it.
    pub write: bool,
    /// Its place among its node's records, and the offset of its row in that node's block of
    /// rows in a [`Reads`] message.
    pub nth: u32,
    pub off: usize,
}

/// The rows of one participant's records, received from it.
pub struct ReadSet {
    pub present: Vec<bool>,
    pub rows: Vec<u8>,
}

/// A sequenced transaction at one node.
pub struct Txn {
    pub pos: Pos,
    pub id: TxnId,
    pub program: Program,
    /// Distinct records in first-access order, and the record of each access.
    pub records: Vec<Rec>,
    pub access_rec: Vec<u32>,
    pub roles: Roles,
    /// Per participant: how many records it holds and the bytes of their rows.
    pub blocks: Vec<(u32, usize)>,
    /// The scheduler's handle of the transaction's locks here.
    pub slot: u32,
    /// The node's run it was scheduled in (see `CalvinNode::run`).
    pub run: u64,
    /// Executing participants: what other participants sent, by participant index, and how
    /// many are still to come.
    pub remote: Vec<Option<ReadSet>>,
    pub missing: u32,
}

/// Why a [`Reads`] message cannot be used.
#[derive(Debug, PartialEq)]
pub enum BadReads {
    NotAParticipant,
    Duplicate,
    Shape,
}

impl Txn {
    /// Analyses `program`, sequenced at `pos`, for the nodes of `pmap` (tables' row sizes in
    /// `row_sizes`).
    pub fn new(
        pos: Pos,
        id: TxnId,
        program: Program,
        pmap: &PartitionMap,
        row_sizes: &[usize],
    ) -> Self {
        let roles = roles(&program, pmap, pos.node);
        Self::with_roles(pos, id, program, roles, pmap, row_sizes)
    }

    /// [`Txn::new`] for a program whose roles are known.
    pub fn with_roles(
        pos: Pos,
        id: TxnId,
        program: Program,
        roles: Roles,
        pmap: &PartitionMap,
        row_sizes: &[usize],
    ) -> Self {
        let n = program.accesses.len();
        let mut records: Vec<Rec> = Vec::with_capacity(n);
        let mut access_rec = Vec::with_capacity(n);
        let mut index: Option<FxHashMap<(TableId, Key), u32>> =
            (n > LINEAR_DEDUP).then(FxHashMap::default);
        let mut blocks = vec![(0u32, 0usize); roles.participants.len()];
        for a in &program.accesses {
            let found = match &index {
                Some(m) => m.get(&(a.table, a.key)).copied(),
                None => records
                    .iter()
                    .position(|r| r.table == a.table && r.key == a.key)
                    .map(|i| i as u32),
            };
            let r = match found {
                Some(r) => {
                    records[r as usize].write |= a.kind.is_write();
                    r
                }
                None => {
                    let node = pmap.partition_of(a.table, a.key).0;
                    let p = roles
                        .participants
                        .binary_search(&node)
                        .expect("every accessed node is a participant");
                    let (nth, off) = blocks[p];
                    blocks[p] = (nth + 1, off + row_sizes[a.table as usize]);
                    let r = records.len() as u32;
                    records.push(Rec {
                        table: a.table,
                        key: a.key,
                        node,
                        write: a.kind.is_write(),
                        nth,
                        off,
                    });
                    if let Some(m) = &mut index {
                        m.insert((a.table, a.key), r);
                    }
                    r
                }
            };
            access_rec.push(r);
        }
        Txn {
            pos,
            id,
            program,
            records,
            access_rec,
            roles,
            blocks,
            slot: u32::MAX,
            run: 0,
            remote: Vec::new(),
            missing: 0,
        }
    }

    pub fn executes(&self, node: u32) -> bool {
        self.roles.executing.binary_search(&node).is_ok()
    }

    /// Executing participant `me` starts waiting for the other participants' reads.
    pub fn expect_reads(&mut self, me: u32) {
        let n = self.roles.participants.len();
        self.remote = (0..n).map(|_| None).collect();
        self.missing = n as u32;
        if let Ok(p) = self.roles.participants.binary_search(&me) {
            // Its own records it reads in place: nothing to receive from itself.
            self.remote[p] = Some(ReadSet {
                present: Vec::new(),
                rows: Vec::new(),
            });
            self.missing -= 1;
        }
    }

    /// Keeps the reads participant `from` sent.
    pub fn accept(&mut self, from: u32, reads: Reads) -> Result<(), BadReads> {
        let p = self
            .roles
            .participants
            .binary_search(&from)
            .map_err(|_| BadReads::NotAParticipant)?;
        let slot = self.remote.get_mut(p).ok_or(BadReads::NotAParticipant)?;
        if slot.is_some() {
            return Err(BadReads::Duplicate);
        }
        let (count, bytes) = self.blocks[p];
        if reads.present.len() != count as usize || reads.rows.len() != bytes {
            return Err(BadReads::Shape);
        }
        *slot = Some(ReadSet {
            present: reads.present,
            rows: reads.rows,
        });
        self.missing -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::tests::{access, fixture};
    use qstore_core::txn::AccessKind;

    fn pos() -> Pos {
        Pos {
            epoch: 3,
            node: 1,
            idx: 7,
        }
    }

    #[test]
    fn roles_follow_reads_and_writes() {
        let (cat, pmap, _) = fixture();
        let program = |accesses| Program { accesses };
        // Reads on node 0, a write on node 1: node 1 alone executes.
        let p = program(vec![
            access(&cat, AccessKind::Read, 1, 0),
            access(&cat, AccessKind::ReadModifyWrite, 12, 1),
        ]);
        let r = roles(&p, &pmap, 0);
        assert_eq!((r.participants, r.executing), (vec![0, 1], vec![1]));
        // Read-only: the lowest participant executes.
        let p = program(vec![
            access(&cat, AccessKind::Read, 12, 0),
            access(&cat, AccessKind::Read, 3, 0),
        ]);
        let r = roles(&p, &pmap, 1);
        assert_eq!((r.participants, r.executing), (vec![0, 1], vec![0]));
        // Nothing accessed: the home executes.
        let r = roles(&program(vec![]), &pmap, 1);
        assert_eq!((r.participants, r.executing), (vec![1], vec![1]));
    }

    /// A derived access with an output must run on the one node that executes the program.
    #[test]
    fn derived_outputs_run_only_where_the_program_executes() {
        let (cat, pmap, _) = fixture();
        let derived = |output| {
            let mut a = access(&cat, AccessKind::Read, 12, 0);
            a.deps = vec![0];
            a.key_dep = Some(qstore_core::txn::KeyDep {
                dep: 0,
                scale: 1,
                limit: 4,
                back: 0,
                output,
            });
            a
        };
        let check = |accesses| {
            let p = Program { accesses };
            unrunnable(&p, &pmap, &roles(&p, &pmap, 0))
        };
        // Read-only over nodes 0 and 1: node 0 executes, but the range is on node 1.
        let read_1 = access(&cat, AccessKind::Read, 1, 0);
        let why = check(vec![read_1.clone(), derived(true)]).unwrap();
        assert!(why.contains("only node 1"), "{why}");
        // Without an output it is skipped where it is not, as before.
        assert_eq!(check(vec![read_1, derived(false)]), None);
        // Node 1 writes, so it alone executes: the derived access runs there.
        let write_12 = access(&cat, AccessKind::ReadModifyWrite, 12, 0);
        assert_eq!(check(vec![write_12, derived(true)]), None);
    }

    #[test]
    fn records_are_distinct_with_offsets_per_node() {
        let (cat, pmap, _) = fixture();
        let p = Program {
            accesses: vec![
                access(&cat, AccessKind::Read, 1, 0),
                access(&cat, AccessKind::Read, 12, 0),
                access(&cat, AccessKind::ReadModifyWrite, 1, 1),
                access(&cat, AccessKind::Read, 2, 0),
            ],
        };
        let t = Txn::new(pos(), TxnId(5), p, &pmap, &[8]);
        assert_eq!(t.access_rec, vec![0, 1, 0, 2]);
        let r: Vec<_> = t
            .records
            .iter()
            .map(|r| (r.key, r.node, r.write, r.nth, r.off))
            .collect();
        assert_eq!(
            r,
            vec![
                (1, 0, true, 0, 0),
                (12, 1, false, 0, 0),
                (2, 0, false, 1, 8)
            ]
        );
        assert_eq!(t.blocks, vec![(2, 16), (1, 8)]);
    }

    #[test]
    fn reads_are_checked_before_they_are_kept() {
        let (cat, pmap, _) = fixture();
        let p = Program {
            accesses: vec![
                access(&cat, AccessKind::ReadModifyWrite, 1, 1),
                access(&cat, AccessKind::Read, 12, 0),
            ],
        };
        let mut t = Txn::new(pos(), TxnId(5), p, &pmap, &[8]);
        t.expect_reads(0);
        assert_eq!(t.missing, 1);
        let reads = |present: Vec<bool>, rows: Vec<u8>| Reads {
            pos: pos(),
            present,
            rows,
        };
        assert_eq!(
            t.accept(1, reads(vec![true], vec![0; 7])),
            Err(BadReads::Shape)
        );
        assert_eq!(
            t.accept(4, reads(vec![true], vec![0; 8])),
            Err(BadReads::NotAParticipant)
        );
        assert_eq!(
            t.accept(0, reads(vec![true], vec![0; 8])),
            Err(BadReads::Duplicate),
            "nothing is expected from the executing node itself"
        );
        assert_eq!(t.accept(1, reads(vec![true], vec![0; 8])), Ok(()));
        assert_eq!(t.missing, 0);
        assert_eq!(
            t.accept(1, reads(vec![true], vec![0; 8])),
            Err(BadReads::Duplicate)
        );
    }
}
