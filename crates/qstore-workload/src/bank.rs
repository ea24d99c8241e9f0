//! Bank transfers: money moves between accounts of one branch, so the total money in the
//! database and the sum of every branch are invariant. Transfers that would overdraw their
//! source abort by the program's own check (a logic-induced abort), and read-only audits read
//! a whole branch and must see exactly its initial sum: a concurrency-control bug that lets
//! an audit see half of a transfer, or loses an update, shows up as a wrong sum at once
//! ([`Workload::check_commit`]) or at the end ([`Workload::check_final`]).
//!
//! # Layout
//!
//! Each partition's accounts are numbered by index `0..accounts_per_partition` (the index is
//! turned into a key by [`PartitionMap::nth_key_of`], so range and hash partitioning both
//! work). Indices are cut into blocks of `branch_size` (B); block `g` holds indices
//! `g*B .. g*B + B` in every partition. Leftover indices past the last whole block are loaded
//! but never touched. A branch is a pair (block `g`, first partition `f`), and its account
//! `j` (0 ≤ j < B) is the account of index `g*B + j` in partition `(f + j mod s) mod P`,
//! where `s` is the branch's span:
//!
//! * even blocks are *local*: `s = 1`, so all B accounts live in partition `f`;
//! * odd blocks are *spanning*: `s = min(P, B / 2)`, so the branch covers `s` consecutive
//!   partitions and holds at least `⌊B / s⌋ ≥ 2` accounts in each.
//!
//! With one partition, or B < 4, `s` is 1 and every block is local. For a given block each
//! (partition, index) belongs to exactly one branch: partition `q`, index `g*B + j` belongs
//! to the branch whose first partition is `(q - j mod s) mod P`. Example, P = 4, B = 8,
//! spanning block 1, branch (1, f = 2): accounts j = 0, 4 in partition 2, j = 1, 5 in 3,
//! j = 2, 6 in 0 and j = 3, 7 in 1.
//!
//! # Transactions
//!
//! A client homed at partition `h` only uses branches with accounts in `h`:
//!
//! * a single-partition audit reads a local branch of `h`;
//! * a multi-partition audit reads a spanning branch covering `h` (it touches `s` partitions);
//! * a single-partition transfer picks its accounts among the accounts in `h` of a local
//!   branch of `h` or, when `accounts_per_transfer ≤ ⌊B / s⌋`, of a spanning branch covering
//!   `h`: single- and multi-partition transactions then contend for the same rows;
//! * a multi-partition transfer picks accounts of a spanning branch, at least one in `h` and
//!   at least one elsewhere.
//!
//! Branch choice is uniform or Zipfian over the candidates, lowest blocks hottest. The source
//! of a transfer is a random one of its accounts.
//!
//! # Opening balances
//!
//! Every branch starts with `B * initial_balance`, but not evenly: accounts `2m` and `2m + 1`
//! of a branch start with `initial_balance ± x`, `x` uniform in `[0, initial_balance]` from
//! the seed (an odd branch's last account gets `initial_balance`). Some accounts thus start
//! nearly empty and overdrafts happen from the first transactions, not only after balances
//! have drifted for a long time.
//!
//! Row layout (16 bytes): bytes 0..8 the balance, a little-endian i64; 8..16 spare (zero).

use crate::zipf::RankChooser;
use crate::{ScanFn, Tally, TxnCall, TxnGenerator, Workload};
use qstore_core::config::BankConfig;
use qstore_core::partition::PartitionMap;
use qstore_core::rng::{splitmix64, Rng};
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, LogicAbort, ProcCall, ProcId, Procedure, Program,
    RowLoader, RowRef, StepId, TableSchema, Value,
};
use qstore_core::{ConfigError, Key, PartitionId, QError, RunConfig, TableId};
use rand::Rng as _;
use std::sync::Arc;

/// The only table.
pub const ACCOUNTS: TableId = 0;
/// Bytes of an account row.
pub const ROW_SIZE: usize = 16;

/// A branch: block `block` of the partitions it covers, its account 0 in partition `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Branch {
    pub block: u64,
    pub first: u32,
}

/// Where accounts and branches live (see the module documentation).
#[derive(Clone, Debug)]
struct Layout {
    pmap: PartitionMap,
    partitions: u32,
    branch_size: u32,
    accounts_per_partition: u64,
    /// Partitions a spanning branch covers; 1 when there are no spanning branches.
    span: u32,
    /// Whole blocks per partition.
    blocks: u64,
    /// Accounts a transfer touches.
    transfer_size: u32,
}

impl Layout {
    fn new(cfg: &BankConfig, pmap: PartitionMap) -> Self {
        let partitions = pmap.partitions();
        Layout {
            partitions,
            branch_size: cfg.branch_size,
            accounts_per_partition: cfg.accounts_per_partition,
            span: partitions.min(cfg.branch_size / 2).max(1),
            blocks: cfg.accounts_per_partition / cfg.branch_size as u64,
            transfer_size: cfg.accounts_per_transfer,
            pmap,
        }
    }

    fn span_of(&self, block: u64) -> u32 {
        if self.span >= 2 && block % 2 == 1 {
            self.span
        } else {
            1
        }
    }

    fn partition_of(&self, b: Branch, j: u32) -> u32 {
        (b.first + j % self.span_of(b.block)) % self.partitions
    }

    fn key(&self, b: Branch, j: u32) -> Key {
        let p = PartitionId(self.partition_of(b, j));
        let index = b.block * self.branch_size as u64 + j as u64;
        self.pmap.nth_key_of(ACCOUNTS, p, index)
    }

    /// The branch and position of the account of index `i` in partition `p` (`None` for the
    /// leftover indices past the last whole block).
    fn locate(&self, p: u32, i: u64) -> Option<(Branch, u32)> {
        let block = i / self.branch_size as u64;
        if block >= self.blocks {
            return None;
        }
        let j = (i % self.branch_size as u64) as u32;
        let s = self.span_of(block);
        let first = (p + self.partitions - j % s) % self.partitions;
        Some((Branch { block, first }, j))
    }

    /// The index of `key` within its partition, by binary search over the partition's keys
    /// (which [`PartitionMap::nth_key_of`] yields in increasing order).
    fn index_of(&self, key: Key) -> Option<(u32, u64)> {
        let p = self.pmap.partition_of(ACCOUNTS, key);
        let (mut lo, mut hi) = (0, self.accounts_per_partition);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.pmap.nth_key_of(ACCOUNTS, p, mid) < key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let found =
            lo < self.accounts_per_partition && self.pmap.nth_key_of(ACCOUNTS, p, lo) == key;
        found.then_some((p.0, lo))
    }

    /// The positions of branch `b`'s accounts that live in partition `p`.
    fn share(&self, b: Branch, p: u32) -> impl Iterator<Item = u32> {
        let s = self.span_of(b.block);
        let d = (p + self.partitions - b.first) % self.partitions;
        let start = if d < s { d } else { self.branch_size };
        (start..self.branch_size).step_by(s as usize)
    }

    /// Local branches: one per local block, in every partition.
    fn local_count(&self) -> u64 {
        if self.span >= 2 {
            self.blocks.div_ceil(2)
        } else {
            self.blocks
        }
    }

    fn local_branch(&self, home: u32, rank: u64) -> Branch {
        let block = if self.span >= 2 { 2 * rank } else { rank };
        Branch { block, first: home }
    }

    /// Spanning branches covering a partition: `span` per spanning block.
    fn spanning_count(&self) -> u64 {
        if self.span >= 2 {
            self.blocks / 2 * self.span as u64
        } else {
            0
        }
    }

    fn spanning_branch(&self, home: u32, rank: u64) -> Branch {
        let s = self.span as u64;
        let d = (rank % s) as u32;
        Branch {
            block: 2 * (rank / s) + 1,
            first: (home + self.partitions - d) % self.partitions,
        }
    }

    /// Whether a single-partition transfer fits in a spanning branch's share of a partition.
    fn sp_uses_spanning(&self) -> bool {
        self.span >= 2 && self.transfer_size <= self.branch_size / self.span
    }

    /// Candidates of single-partition transfers: local branches, and the spanning ones too
    /// when they fit, interleaved block by block so that skew favours low blocks of both.
    fn sp_count(&self) -> u64 {
        if self.sp_uses_spanning() {
            self.blocks / 2 * (1 + self.span as u64) + self.blocks % 2
        } else {
            self.local_count()
        }
    }

    fn sp_branch(&self, home: u32, rank: u64) -> Branch {
        if !self.sp_uses_spanning() {
            return self.local_branch(home, rank);
        }
        let per_pair = 1 + self.span as u64;
        let (pair, k) = (rank / per_pair, rank % per_pair);
        if k == 0 {
            self.local_branch(home, pair)
        } else {
            self.spanning_branch(home, pair * self.span as u64 + k - 1)
        }
    }
}

pub struct Bank {
    cfg: BankConfig,
    seed: u64,
    layout: Layout,
    catalog: Arc<Catalog>,
    transfer: ProcId,
    audit: ProcId,
}

impl Bank {
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = run.workload.bank.clone();
        cfg.validate(run.cluster.nodes)?;
        let mut catalog = Catalog::default();
        catalog.add_table(TableSchema {
            name: "accounts".into(),
            row_size: ROW_SIZE,
            capacity_per_partition: cfg.accounts_per_partition as usize,
            keys_per_partition: cfg.accounts_per_partition,
            read_mostly: false,
        });
        let pmap = PartitionMap::new(run.cluster.nodes, run.cluster.partitioning, &catalog.tables);
        let layout = Layout::new(&cfg, pmap);
        let read = catalog.steps.register("bank_read", bank_read);
        let debit = catalog.steps.register("bank_debit", bank_debit);
        let credit = catalog.steps.register("bank_credit", bank_credit);
        let transfer = catalog.add_procedure(Arc::new(Transfer {
            debit,
            credit,
            max_amount: cfg.max_amount,
            layout: layout.clone(),
        }));
        let audit = catalog.add_procedure(Arc::new(Audit {
            read,
            layout: layout.clone(),
        }));
        Ok(Bank {
            layout,
            catalog: Arc::new(catalog),
            cfg,
            seed: run.seed,
            transfer,
            audit,
        })
    }

    /// The opening balance of the account of index `i` in partition `p` (see the module
    /// documentation): paired deviations that cancel inside each branch.
    fn opening_balance(&self, p: u32, i: u64) -> i64 {
        let initial = self.cfg.initial_balance;
        let Some((b, j)) = self.layout.locate(p, i) else {
            return initial;
        };
        if j ^ 1 >= self.layout.branch_size {
            return initial; // the unpaired last account of an odd-sized branch
        }
        let pair = ((b.first as u64) << 32) | (j / 2) as u64;
        let h = splitmix64(self.seed ^ splitmix64(b.block ^ splitmix64(pair)));
        let x = (h % (initial as u64 + 1)) as i64;
        if j % 2 == 0 {
            initial + x
        } else {
            initial - x
        }
    }

    /// Money in the whole database, which no transaction changes.
    fn expected_total(&self) -> i128 {
        self.layout.partitions as i128
            * self.cfg.accounts_per_partition as i128
            * self.cfg.initial_balance as i128
    }

    /// A readable name of the branch holding `key`, for error messages.
    fn branch_name(&self, key: Key) -> String {
        match self
            .layout
            .index_of(key)
            .and_then(|(p, i)| self.layout.locate(p, i))
        {
            Some((b, _)) => format!("branch (block {}, first partition {})", b.block, b.first),
            None => "no branch".into(),
        }
    }

    fn check_audit(&self, call: &ProcCall, outputs: &[Value]) -> Result<(), String> {
        let expected = self.cfg.branch_size as i128 * self.cfg.initial_balance as i128;
        let sum: Option<i128> = outputs.iter().map(|v| v.as_int().map(i128::from)).sum();
        match sum {
            Some(actual) if actual == expected && outputs.len() == call.args.len() => Ok(()),
            Some(actual) => Err(format!(
                "{}: read {outputs:?} summing to {actual}, expected {expected}",
                self.audit_name(call)
            )),
            None => Err(format!(
                "{}: outputs are not balances: {outputs:?}",
                self.audit_name(call)
            )),
        }
    }

    /// Names the branch and keys of an audit, for error messages.
    fn audit_name(&self, call: &ProcCall) -> String {
        let keys: Vec<i64> = call.args.iter().filter_map(Value::as_int).collect();
        let first = keys.first().map_or(0, |&k| k as u64);
        format!("bank audit of {} (keys {keys:?})", self.branch_name(first))
    }

    fn check_transfer(&self, call: &ProcCall, outputs: &[Value]) -> Result<(), String> {
        match outputs.iter().find(|v| v.as_int().is_none_or(|b| b < 0)) {
            Some(bad) => Err(format!(
                "bank transfer {:?} left balance {bad:?} (outputs {outputs:?})",
                call.args
            )),
            None => Ok(()),
        }
    }
}

impl Workload for Bank {
    fn name(&self) -> &'static str {
        "bank"
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }

    fn partition_map(&self) -> &PartitionMap {
        &self.layout.pmap
    }

    fn load(&self, partition: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError> {
        let layout = &self.layout;
        let (pmap, count) = (&layout.pmap, layout.accounts_per_partition);
        let mut stray = None;
        crate::load_dense(loader, pmap, ACCOUNTS, partition, count, &mut |key, row| {
            row.fill(0);
            match layout.index_of(key) {
                Some((p, i)) if p == partition.0 => {
                    set_balance(row, self.opening_balance(p, i));
                }
                _ => stray = Some(key),
            }
        })?;
        match stray {
            Some(key) => Err(QError::Other(format!(
                "bank: loader asked to fill key {key}, not an account of {partition}"
            ))),
            None => Ok(()),
        }
    }

    fn generator(&self, client: u32, home: PartitionId) -> Box<dyn TxnGenerator> {
        let l = &self.layout;
        let theta = self.cfg.theta;
        Box::new(BankGenerator {
            rng: qstore_core::rng::stream(self.seed, client as u64),
            home: home.0,
            cfg: self.cfg.clone(),
            local: RankChooser::new(l.local_count(), theta),
            spanning: (l.spanning_count() > 0).then(|| RankChooser::new(l.spanning_count(), theta)),
            sp: RankChooser::new(l.sp_count(), theta),
            layout: l.clone(),
            transfer: self.transfer,
            audit: self.audit,
            picked: Vec::with_capacity(l.branch_size as usize),
        })
    }

    fn check_commit(&self, call: &ProcCall, outputs: &[Value]) -> Result<(), String> {
        if call.proc == self.audit {
            self.check_audit(call, outputs)
        } else if call.proc == self.transfer {
            self.check_transfer(call, outputs)
        } else {
            Ok(())
        }
    }

    fn tally(&self, scan: &mut ScanFn<'_>) -> Option<Tally> {
        let mut t = Tally::default();
        scan(ACCOUNTS, &mut |key, row| {
            let b = balance(row);
            t.add("money", b as i128);
            t.add("accounts", 1);
            if b < 0 {
                t.problem(|| format!("account {key} = {b}"));
            }
        });
        Some(t)
    }

    fn check_tally(&self, t: &Tally) -> Result<String, String> {
        let (total, accounts) = (t.count("money"), t.count("accounts"));
        let expected = self.expected_total();
        let want_accounts =
            self.layout.partitions as i128 * self.cfg.accounts_per_partition as i128;
        if total != expected {
            return Err(format!("bank: total money {total}, expected {expected}"));
        }
        if accounts != want_accounts {
            return Err(format!(
                "bank: {accounts} accounts, expected {want_accounts}"
            ));
        }
        if t.problem_count > 0 {
            return Err(format!(
                "bank: {} negative balances, e.g. {}",
                t.problem_count,
                t.problems.join(", ")
            ));
        }
        Ok(format!(
            "bank: total {total} = expected, {accounts} accounts, none negative"
        ))
    }
}

struct BankGenerator {
    rng: Rng,
    home: u32,
    cfg: BankConfig,
    layout: Layout,
    local: RankChooser,
    spanning: Option<RankChooser>,
    sp: RankChooser,
    transfer: ProcId,
    audit: ProcId,
    /// Account positions chosen for the current transfer.
    picked: Vec<u32>,
}

impl BankGenerator {
    fn audit_call(&mut self, mp: bool) -> TxnCall {
        let b = match &self.spanning {
            Some(ranks) if mp => self
                .layout
                .spanning_branch(self.home, ranks.sample(&mut self.rng)),
            _ => self
                .layout
                .local_branch(self.home, self.local.sample(&mut self.rng)),
        };
        let args = (0..self.layout.branch_size)
            .map(|j| Value::Int(self.layout.key(b, j) as i64))
            .collect();
        TxnCall {
            call: ProcCall {
                proc: self.audit,
                args,
            },
            ops: self.layout.branch_size,
        }
    }

    fn transfer_call(&mut self, mp: bool) -> TxnCall {
        let b = match &self.spanning {
            Some(ranks) if mp => {
                let b = self
                    .layout
                    .spanning_branch(self.home, ranks.sample(&mut self.rng));
                self.pick_across(b);
                b
            }
            _ => {
                let b = self
                    .layout
                    .sp_branch(self.home, self.sp.sample(&mut self.rng));
                self.pick_within(b);
                b
            }
        };
        let amount = self.rng.random_range(1..=self.cfg.max_amount);
        let mut args = Vec::with_capacity(1 + self.picked.len());
        args.push(Value::Int(amount));
        args.extend(
            self.picked
                .iter()
                .map(|&j| Value::Int(self.layout.key(b, j) as i64)),
        );
        TxnCall {
            call: ProcCall {
                proc: self.transfer,
                args,
            },
            ops: self.picked.len() as u32,
        }
    }

    /// Picks `accounts_per_transfer` distinct accounts of `b` in the home partition, in
    /// random order (the first is the source).
    fn pick_within(&mut self, b: Branch) {
        self.picked.clear();
        self.picked.extend(self.layout.share(b, self.home));
        let n = self.layout.transfer_size as usize;
        partial_shuffle(&mut self.rng, &mut self.picked, n);
        self.picked.truncate(n);
    }

    /// Picks `accounts_per_transfer` distinct accounts of spanning branch `b`, at least one in
    /// the home partition and one elsewhere, in random order.
    fn pick_across(&mut self, b: Branch) {
        let l = &self.layout;
        let here_count = l.share(b, self.home).count();
        let nth = self.rng.random_range(0..here_count);
        let here = l
            .share(b, self.home)
            .nth(nth)
            .expect("a spanning branch covers home");
        let away = loop {
            let j = self.rng.random_range(0..l.branch_size);
            if l.partition_of(b, j) != self.home {
                break j;
            }
        };
        self.picked.clear();
        self.picked
            .extend((0..l.branch_size).filter(|&j| j != here && j != away));
        let rest = l.transfer_size as usize - 2;
        partial_shuffle(&mut self.rng, &mut self.picked, rest);
        self.picked.truncate(rest);
        self.picked.extend([here, away]);
        let n = self.picked.len();
        partial_shuffle(&mut self.rng, &mut self.picked, n);
    }
}

/// Moves a uniformly random selection of `n` elements of `v` to its front, in random order.
fn partial_shuffle(rng: &mut Rng, v: &mut [u32], n: usize) {
    for k in 0..n.min(v.len()) {
        let r = rng.random_range(k..v.len());
        v.swap(k, r);
    }
}

impl TxnGenerator for BankGenerator {
    fn next_txn(&mut self) -> TxnCall {
        let audit = self.rng.random::<f64>() < self.cfg.audit_fraction;
        let mp = self.cfg.multi_partition_fraction > 0.0
            && self.rng.random::<f64>() < self.cfg.multi_partition_fraction;
        if audit {
            self.audit_call(mp)
        } else {
            self.transfer_call(mp)
        }
    }
}

/// The account keys of a call: keys of accounts that exist, no account twice. Credits and
/// audit reads cannot abort, and an access that cannot abort does nothing to a missing
/// record (see `qstore_core::txn`): a transfer to a key that is no account would lose its
/// money, so such calls are refused here.
fn account_keys(layout: &Layout, args: &[Value]) -> Result<Vec<Key>, String> {
    let keys = args
        .iter()
        .map(|v| match v.as_int() {
            Some(k) if k >= 0 && layout.index_of(k as Key).is_some() => Ok(k as Key),
            Some(k) if k >= 0 => Err(format!("no account has key {k}")),
            _ => Err(format!("account keys must be integers >= 0, got {v:?}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("account {} named twice", w[0]));
    }
    Ok(keys)
}

fn access(key: Key, kind: AccessKind, step: StepId, arg: Value, may_abort: bool) -> Access {
    Access {
        table: ACCOUNTS,
        key,
        kind,
        step,
        arg,
        deps: Vec::new(),
        may_abort,
        key_dep: None,
    }
}

/// `transfer(amount, source, destination1, ...)`: debits `amount * destinations` from the
/// source (aborting on overdraft) and credits `amount` to each destination.
struct Transfer {
    debit: StepId,
    credit: StepId,
    /// Amounts are bounded so that no balance can overflow (configuration bounds the total).
    max_amount: i64,
    layout: Layout,
}

impl Procedure for Transfer {
    fn name(&self) -> &'static str {
        "transfer"
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let Some((amount, accounts)) = args.split_first() else {
            return Err("expected (amount, source, destination...)".into());
        };
        let amount = match amount.as_int() {
            Some(a) if (1..=self.max_amount).contains(&a) => a,
            _ => {
                return Err(format!(
                    "amount must be an integer in [1, {}], got {amount:?}",
                    self.max_amount
                ))
            }
        };
        let keys = account_keys(&self.layout, accounts)?;
        if keys.len() < 2 {
            return Err(format!(
                "need a source and a destination, got {} accounts",
                keys.len()
            ));
        }
        let debit = amount
            .checked_mul(keys.len() as i64 - 1)
            .ok_or("amount * destinations overflows")?;
        let mut accesses = vec![access(
            keys[0],
            AccessKind::ReadModifyWrite,
            self.debit,
            Value::Int(debit),
            true,
        )];
        accesses.extend(keys[1..].iter().map(|&k| {
            access(
                k,
                AccessKind::ReadModifyWrite,
                self.credit,
                Value::Int(amount),
                false,
            )
        }));
        Ok(Program { accesses })
    }
}

/// `audit(key1, ..., keyN)`: reads the balances of the accounts (a whole branch).
struct Audit {
    read: StepId,
    layout: Layout,
}

impl Procedure for Audit {
    fn name(&self) -> &'static str {
        "audit"
    }

    fn may_abort(&self) -> bool {
        false
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let keys = account_keys(&self.layout, args)?;
        if keys.is_empty() {
            return Err("an audit reads at least one account".into());
        }
        let accesses = keys
            .into_iter()
            .map(|k| access(k, AccessKind::Read, self.read, Value::Null, false))
            .collect();
        Ok(Program { accesses })
    }
}

#[inline]
fn balance(row: &[u8]) -> i64 {
    i64::from_le_bytes(row[..8].try_into().expect("account rows are 16 bytes"))
}

#[inline]
fn set_balance(row: &mut [u8], v: i64) {
    row[..8].copy_from_slice(&v.to_le_bytes());
}

/// Reads an account: returns its balance.
fn bank_read(row: RowRef<'_>, _arg: &Value, _inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(balance(row.bytes())))
}

/// Debits the argument from the account; refuses (a logic abort, row untouched) if the
/// balance does not cover it. Returns the new balance.
fn bank_debit(row: RowRef<'_>, arg: &Value, _inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(row) = row else {
        return Err(LogicAbort("bank_debit needs a writable row"));
    };
    let Some(amount) = arg.as_int().filter(|&a| a >= 0) else {
        return Err(LogicAbort("bank_debit needs an amount >= 0"));
    };
    let old = balance(row);
    if old < amount {
        return Err(LogicAbort("insufficient funds"));
    }
    set_balance(row, old - amount);
    Ok(Value::Int(old - amount))
}

/// Credits the argument to the account. Returns the new balance. Cannot overflow: amounts
/// are bounded and no balance exceeds the total money, which configuration bounds by 2^62.
fn bank_credit(row: RowRef<'_>, arg: &Value, _inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let RowRef::Write(row) = row else {
        return Err(LogicAbort("bank_credit needs a writable row"));
    };
    let new = balance(row).saturating_add(arg.as_int().unwrap_or(0));
    set_balance(row, new);
    Ok(Value::Int(new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemStore;
    use qstore_core::config::Partitioning;
    use std::collections::BTreeSet;

    fn config(nodes: u32, mp: f64) -> RunConfig {
        let mut c = RunConfig::default();
        c.workload.name = "bank".into();
        c.cluster.nodes = nodes;
        c.workload.bank.accounts_per_partition = 800;
        c.workload.bank.multi_partition_fraction = mp;
        c
    }

    fn bank(c: &RunConfig) -> Bank {
        Bank::new(c).unwrap()
    }

    fn branch_keys(l: &Layout, b: Branch) -> Vec<Key> {
        (0..l.branch_size).map(|j| l.key(b, j)).collect()
    }

    /// The accounts a call names (a transfer's first argument is its amount).
    fn keys(b: &Bank, t: &TxnCall) -> Vec<Key> {
        let skip = usize::from(t.call.proc == b.transfer);
        t.call.args[skip..]
            .iter()
            .map(|v| v.as_int().unwrap() as Key)
            .collect()
    }

    fn partitions(b: &Bank, keys: &[Key]) -> BTreeSet<u32> {
        keys.iter()
            .map(|&k| b.layout.pmap.partition_of(ACCOUNTS, k).0)
            .collect()
    }

    #[test]
    fn layout_is_a_bijection_and_branches_keep_two_accounts_per_partition() {
        for scheme in [Partitioning::Range, Partitioning::Hash] {
            for (nodes, size) in [
                (1, 2),
                (1, 8),
                (2, 4),
                (3, 8),
                (4, 8),
                (5, 5),
                (8, 8),
                (3, 3),
            ] {
                let mut c = config(nodes, 0.0);
                c.cluster.partitioning = scheme;
                c.workload.bank.branch_size = size;
                c.workload.bank.accounts_per_partition = 10 * size as u64 + 3;
                let b = bank(&c);
                let l = &b.layout;
                let mut seen = BTreeSet::new();
                for p in 0..nodes {
                    for i in 0..c.workload.bank.accounts_per_partition {
                        let key = l.pmap.nth_key_of(ACCOUNTS, PartitionId(p), i);
                        assert_eq!(l.index_of(key), Some((p, i)));
                        let Some((br, j)) = l.locate(p, i) else {
                            assert!(i >= l.blocks * size as u64);
                            continue;
                        };
                        assert_eq!(l.key(br, j), key, "{scheme:?} P={nodes} B={size}");
                        assert!(seen.insert((br.block, br.first, j)));
                        let here = l.share(br, p).count();
                        assert!(here >= 2, "P={nodes} B={size} {br:?} has {here} in {p}");
                    }
                }
            }
        }
    }

    #[test]
    fn opening_balances_keep_branch_sums_and_some_accounts_start_low() {
        let b = bank(&config(4, 0.5));
        let l = &b.layout;
        let mut low = 0;
        for p in 0..4 {
            for block in 0..l.blocks {
                let br = Branch { block, first: p };
                let sum: i64 = (0..l.branch_size)
                    .map(|j| {
                        let (q, i) = l.index_of(l.key(br, j)).unwrap();
                        let bal = b.opening_balance(q, i);
                        assert!(bal >= 0);
                        low += (bal < b.cfg.max_amount) as u32;
                        bal
                    })
                    .sum();
                assert_eq!(sum, 8 * 1_000);
            }
        }
        assert!(
            low > 10,
            "overdrafts must be possible early: {low} low accounts"
        );
    }

    #[test]
    fn same_seed_same_stream() {
        let b = bank(&config(4, 0.5));
        let a: Vec<_> = {
            let mut g = b.generator(7, PartitionId(3));
            (0..200).map(|_| g.next_txn()).collect()
        };
        let mut g = b.generator(7, PartitionId(3));
        assert!(a.iter().all(|t| *t == g.next_txn()));
        let mut other = b.generator(8, PartitionId(3));
        assert!(a.iter().any(|t| *t != other.next_txn()));
    }

    #[test]
    fn single_partition_txns_stay_home() {
        for scheme in [Partitioning::Range, Partitioning::Hash] {
            let mut c = config(4, 0.0);
            c.cluster.partitioning = scheme;
            c.workload.bank.audit_fraction = 0.3;
            let b = bank(&c);
            for home in 0..4 {
                let mut g = b.generator(home, PartitionId(home));
                for _ in 0..500 {
                    let t = g.next_txn();
                    let parts = partitions(&b, &keys(&b, &t));
                    assert_eq!(parts, BTreeSet::from([home]), "{scheme:?} {t:?}");
                }
            }
        }
    }

    #[test]
    fn multi_partition_fraction_is_respected_and_includes_home() {
        for mp in [0.2, 0.5, 0.9] {
            let mut c = config(4, mp);
            c.workload.bank.audit_fraction = 0.5;
            let b = bank(&c);
            let mut g = b.generator(1, PartitionId(2));
            let (mut multi, mut audits_multi, mut audits) = (0u32, 0u32, 0u32);
            for _ in 0..4000 {
                let t = g.next_txn();
                let parts = partitions(&b, &keys(&b, &t));
                assert!(parts.contains(&2), "home partition always involved");
                let is_multi = parts.len() > 1;
                multi += is_multi as u32;
                if t.call.proc == b.audit {
                    audits += 1;
                    audits_multi += is_multi as u32;
                }
            }
            let want = 4000.0 * mp;
            assert!((multi as f64 - want).abs() < 0.1 * want, "mp {mp}: {multi}");
            let want = audits as f64 * mp;
            assert!(
                (audits_multi as f64 - want).abs() < 0.1 * want,
                "{audits_multi}/{audits}"
            );
        }
    }

    #[test]
    fn transfers_name_distinct_accounts_of_one_branch() {
        for n in [2, 4, 8] {
            let mut c = config(4, 0.5);
            c.workload.bank.accounts_per_transfer = n;
            let b = bank(&c);
            let mut g = b.generator(0, PartitionId(1));
            for _ in 0..1000 {
                let t = g.next_txn();
                if t.call.proc != b.transfer {
                    continue;
                }
                let amount = t.call.args[0].as_int().unwrap();
                assert!((1..=200).contains(&amount));
                let ks = keys(&b, &t);
                assert_eq!(ks.len(), n as usize);
                assert_eq!(t.ops, n);
                assert_eq!(ks.iter().collect::<BTreeSet<_>>().len(), ks.len(), "{ks:?}");
                let branches: BTreeSet<_> = ks
                    .iter()
                    .map(|&k| {
                        let (p, i) = b.layout.index_of(k).unwrap();
                        b.layout.locate(p, i).unwrap().0
                    })
                    .collect();
                assert_eq!(branches.len(), 1);
            }
        }
    }

    #[test]
    fn single_partition_transfers_share_rows_with_multi_partition_txns() {
        let b = bank(&config(4, 0.5));
        let mut g = b.generator(0, PartitionId(0));
        let (mut sp, mut mp) = (BTreeSet::new(), BTreeSet::new());
        for _ in 0..5000 {
            let t = g.next_txn();
            let ks = keys(&b, &t);
            let set = if partitions(&b, &ks).len() > 1 {
                &mut mp
            } else {
                &mut sp
            };
            set.extend(ks);
        }
        assert!(sp.intersection(&mp).count() > 0);
    }

    #[test]
    fn audits_read_exactly_one_whole_branch() {
        let mut c = config(4, 0.5);
        c.workload.bank.audit_fraction = 1.0;
        let b = bank(&c);
        let mut g = b.generator(3, PartitionId(3));
        for _ in 0..500 {
            let t = g.next_txn();
            assert_eq!(t.call.proc, b.audit);
            let ks = keys(&b, &t);
            let (p, i) = b.layout.index_of(ks[0]).unwrap();
            let (br, _) = b.layout.locate(p, i).unwrap();
            assert_eq!(ks, branch_keys(&b.layout, br));
            assert_eq!(t.ops, 8);
        }
    }

    #[test]
    fn skew_favours_low_blocks() {
        let mut c = config(2, 0.0);
        c.workload.bank.theta = 1.2;
        c.workload.bank.accounts_per_partition = 80_000;
        let b = bank(&c);
        let mut g = b.generator(0, PartitionId(0));
        let low = (0..2000)
            .filter(|_| {
                let (_, i) = b.layout.index_of(keys(&b, &g.next_txn())[0]).unwrap();
                i < 80
            })
            .count();
        assert!(low > 500, "{low}");
    }

    fn debit(balance_before: i64, amount: i64) -> (Result<Value, LogicAbort>, i64) {
        let mut row = [0u8; ROW_SIZE];
        set_balance(&mut row, balance_before);
        let reg = &bank(&config(1, 0.0)).catalog.steps;
        let a = access(
            0,
            AccessKind::ReadModifyWrite,
            reg.id("bank_debit").unwrap(),
            Value::Int(amount),
            true,
        );
        let out = reg.run(a.as_ref(), RowRef::Write(&mut row), &[]);
        (out, balance(&row))
    }

    #[test]
    fn debit_refuses_overdraft_without_changing_the_row() {
        assert_eq!(
            debit(100, 101),
            (Err(LogicAbort("insufficient funds")), 100)
        );
        assert_eq!(debit(100, 100), (Ok(Value::Int(0)), 0));
        assert_eq!(debit(0, 1), (Err(LogicAbort("insufficient funds")), 0));
        assert!(debit(100, -5).0.is_err());
        let mut row = [0u8; ROW_SIZE];
        set_balance(&mut row, 7);
        let no = Inputs::new(&[], &[]);
        assert_eq!(
            bank_credit(RowRef::Write(&mut row), &Value::Int(5), no),
            Ok(Value::Int(12))
        );
        assert_eq!(
            bank_read(RowRef::Read(&row), &Value::Null, no),
            Ok(Value::Int(12))
        );
        assert!(bank_debit(RowRef::Read(&row), &Value::Int(1), no).is_err());
    }

    #[test]
    fn transfer_program_debits_once_and_credits_each_destination() {
        let b = bank(&config(1, 0.0));
        let call = ProcCall {
            proc: b.transfer,
            args: vec![Value::Int(30), Value::Int(1), Value::Int(2), Value::Int(3)],
        };
        let p = b.catalog.program(&call).unwrap();
        assert_eq!(p.accesses.len(), 3);
        assert_eq!(p.accesses[0].arg, Value::Int(60));
        assert!(p.accesses[0].may_abort);
        assert!(p.accesses[1..]
            .iter()
            .all(|a| a.arg == Value::Int(30) && !a.may_abort));
        assert!(p
            .accesses
            .iter()
            .all(|a| a.kind == AccessKind::ReadModifyWrite));
    }

    #[test]
    fn check_commit_accepts_a_correct_audit_and_rejects_a_wrong_sum() {
        let b = bank(&config(4, 0.5));
        let br = Branch { block: 1, first: 2 };
        let args: Vec<Value> = branch_keys(&b.layout, br)
            .into_iter()
            .map(|k| Value::Int(k as i64))
            .collect();
        let call = ProcCall {
            proc: b.audit,
            args,
        };
        let mut outs = vec![Value::Int(1_000); 8];
        outs[0] = Value::Int(1_500);
        outs[1] = Value::Int(500);
        assert_eq!(b.check_commit(&call, &outs), Ok(()));
        outs[1] = Value::Int(400);
        let e = b.check_commit(&call, &outs).unwrap_err();
        assert!(
            e.contains("block 1, first partition 2") && e.contains("7900") && e.contains("8000"),
            "{e}"
        );
        assert!(b.check_commit(&call, &outs[..7]).is_err());
        let transfer = ProcCall {
            proc: b.transfer,
            args: vec![Value::Int(1), Value::Int(0), Value::Int(1)],
        };
        assert!(b
            .check_commit(&transfer, &[Value::Int(0), Value::Int(9)])
            .is_ok());
        assert!(b
            .check_commit(&transfer, &[Value::Int(-1), Value::Int(9)])
            .is_err());
    }

    #[test]
    fn check_final_passes_on_fresh_data_and_fails_on_a_changed_balance() {
        let b = bank(&config(4, 0.5));
        let mut m = MemStore::loaded(&b, 0..b.layout.partitions);
        assert_eq!(m.len(ACCOUNTS), 3200);
        assert!(m.rows(ACCOUNTS).all(|(_, r)| r[8..] == [0; 8]));
        let summary = m.check_final(&b).unwrap().unwrap();
        assert_eq!(
            summary,
            "bank: total 3200000 = expected, 3200 accounts, none negative"
        );
        let key = b.layout.pmap.nth_key_of(ACCOUNTS, PartitionId(2), 17);
        let row = m.get_mut(ACCOUNTS, key);
        let old = balance(row);
        set_balance(row, old + 1);
        assert!(m.check_final(&b).unwrap_err().contains("expected 3200000"));
        // Same total, but money moved so that one account is negative.
        set_balance(m.get_mut(ACCOUNTS, key), -1);
        let other = b.layout.pmap.nth_key_of(ACCOUNTS, PartitionId(0), 3);
        let row = m.get_mut(ACCOUNTS, other);
        let moved = balance(row) + old + 1;
        set_balance(row, moved);
        assert!(m.check_final(&b).unwrap_err().contains("negative"));
    }

    /// Servers tally their own partitions; the merged tallies judge the whole as a scan of
    /// everything does, a negative balance found on one server included.
    #[test]
    fn tallies_of_each_partition_merge_into_the_check_of_the_whole() {
        let b = bank(&config(4, 0.5));
        let mut m = MemStore::loaded(&b, 0..b.layout.partitions);
        let key = b.layout.pmap.nth_key_of(ACCOUNTS, PartitionId(3), 5);
        let other = b.layout.pmap.nth_key_of(ACCOUNTS, PartitionId(1), 9);
        // Money moves from `key` (left at -7) to `other`: the total stays right.
        let moved = balance(m.get(ACCOUNTS, key)) + 7;
        set_balance(m.get_mut(ACCOUNTS, key), -7);
        let richer = balance(m.get(ACCOUNTS, other)) + moved;
        set_balance(m.get_mut(ACCOUNTS, other), richer);
        let whole = m.check_final(&b).unwrap_err();
        let mut merged = Tally::default();
        for p in 0..4 {
            let part = m.tally_where(&b, |t, k| {
                b.layout.pmap.partition_of(t, k) == PartitionId(p)
            });
            merged.merge(&part.unwrap());
        }
        assert_eq!(b.check_tally(&merged).unwrap_err(), whole);
        assert!(whole.contains("negative"), "{whole}");
    }

    #[test]
    fn serial_execution_keeps_the_invariants_and_overdrafts_happen() {
        let mut c = config(3, 0.5);
        c.workload.bank.accounts_per_partition = 64;
        c.workload.bank.accounts_per_transfer = 3;
        c.cluster.partitioning = Partitioning::Hash;
        let b = bank(&c);
        let cat = b.catalog();
        let mut m = MemStore::loaded(&b, 0..b.layout.partitions);
        let mut gens: Vec<_> = (0..6).map(|i| b.generator(i, PartitionId(i % 3))).collect();
        let mut aborts = 0;
        for round in 0..3000 {
            let t = gens[round % 6].next_txn();
            match m.execute(&cat, &t.call) {
                Some(outs) => b.check_commit(&t.call, &outs).unwrap(),
                None => aborts += 1,
            }
        }
        assert!(aborts > 0, "no overdraft in 3000 transactions");
        m.check_final(&b).unwrap();
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let b = bank(&config(1, 0.0));
        let i = Value::Int;
        let bad_transfers = [
            vec![],
            vec![i(5)],
            vec![i(5), i(1)],
            vec![i(5), i(1), i(1)],
            vec![i(0), i(1), i(2)],
            vec![i(-3), i(1), i(2)],
            vec![i(201), i(1), i(2)],
            vec![Value::Null, i(1), i(2)],
            vec![i(5), i(1), Value::Bytes(vec![2])],
            vec![i(5), i(-1), i(2)],
            // Key 800 is no account (one partition of 800): its credit would do nothing.
            vec![i(5), i(1), i(800)],
        ];
        for args in bad_transfers {
            let call = ProcCall {
                proc: b.transfer,
                args,
            };
            assert!(b.catalog.program(&call).is_err(), "{call:?}");
        }
        for args in [
            vec![],
            vec![i(1), i(1)],
            vec![Value::Bytes(vec![])],
            vec![i(-2)],
            vec![i(3), i(800)],
        ] {
            let call = ProcCall {
                proc: b.audit,
                args,
            };
            assert!(b.catalog.program(&call).is_err(), "{call:?}");
        }
        let edge = ProcCall {
            proc: b.transfer,
            args: vec![i(5), i(0), i(799)],
        };
        assert!(b.catalog.program(&edge).is_ok(), "the last account exists");
    }
}
