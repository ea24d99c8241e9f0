//! Synthetic serial histories, for tests and timing.

use crate::model::{History, ObjKey, Outcome, TxnRecord, Version};

/// SplitMix64: a tiny, seedable, good-enough pseudo-random generator.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `1 / n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// The record identity of dense key index `i` (spread over three tables).
fn obj_key(i: u64) -> ObjKey {
    ObjKey::new((i % 3) as u16, i)
}

/// Generates the history of a serial execution: transactions run one after
/// another, each performing `ops_per_txn` reads and `ops_per_txn` writes over
/// `n_keys` records (about half of the writes overwrite the record just read;
/// some records are written twice; transactions may read their own writes).
/// About one transaction in 20 aborts; its writes are never observed.
///
/// The result is serializable by construction, so it is a clean baseline for
/// the checker. Transaction ids are `1..=n_txns`.
pub fn generate_serial_history(
    n_txns: usize,
    n_keys: u64,
    ops_per_txn: usize,
    seed: u64,
) -> History {
    let n_keys = n_keys.max(1);
    let mut rng = SplitMix64(seed);
    let mut current = vec![Version::INITIAL; n_keys as usize];
    let mut orders: Vec<Vec<u64>> = vec![Vec::new(); n_keys as usize];
    let mut txns = Vec::with_capacity(n_txns);
    for id in 1..=n_txns as u64 {
        let TxnOps { reads, writes } = run_txn(&mut rng, id, &current, n_keys, ops_per_txn);
        let outcome = if rng.one_in(20) {
            let logic = rng.one_in(5);
            let cause = if logic { "user" } else { "conflict" };
            Outcome::Aborted {
                cause: cause.to_string(),
                logic,
            }
        } else {
            for &(k, count) in &writes {
                current[k as usize] = Version::new(id, count - 1);
                orders[k as usize].push(id);
            }
            Outcome::Committed
        };
        txns.push(TxnRecord {
            id,
            node: rng.below(4) as u32,
            outcome,
            reads,
            writes: writes.into_iter().map(|(k, c)| (obj_key(k), c)).collect(),
        });
    }
    let version_order = orders
        .into_iter()
        .enumerate()
        .filter(|(_, order)| !order.is_empty())
        .map(|(k, order)| (obj_key(k as u64), order))
        .collect();
    History {
        txns,
        version_order,
    }
}

/// What one simulated transaction did.
struct TxnOps {
    reads: Vec<(ObjKey, Version)>,
    /// Dense key index and write count.
    writes: Vec<(u64, u32)>,
}

/// Simulates one transaction against the committed state `current`.
fn run_txn(rng: &mut SplitMix64, id: u64, current: &[Version], n_keys: u64, ops: usize) -> TxnOps {
    let mut reads = Vec::with_capacity(ops);
    let mut writes: Vec<(u64, u32)> = Vec::with_capacity(ops);
    for _ in 0..ops {
        let read_key = rng.below(n_keys);
        let own = writes.iter().find(|(k, _)| *k == read_key);
        let seen = match own {
            Some(&(_, count)) => Version::new(id, count - 1),
            None => current[read_key as usize],
        };
        reads.push((obj_key(read_key), seen));
        let write_key = if rng.one_in(2) {
            read_key
        } else {
            rng.below(n_keys)
        };
        match writes.iter_mut().find(|(k, _)| *k == write_key) {
            Some((_, count)) => *count += 1,
            None => writes.push((write_key, 1)),
        }
    }
    TxnOps { reads, writes }
}
