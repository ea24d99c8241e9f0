//! `--workload tpcc`: the catalog, the clients' transaction stream and the consistency
//! conditions checked after a run.
//!
//! Each client belongs to a home partition and, for each transaction, picks one of its
//! warehouses and a district uniformly, as a terminal of that district would (there is no
//! keying or thinking time: a throughput benchmark, as the papers run it). Inputs follow
//! clauses 2.4.1 and 2.5.1; which warehouses are remote follows `TpccConfig`: per
//! transaction (`multi_partition_fraction`, the Q-Store paper's knob: a New-Order or Payment
//! spans two partitions) or per access (`remote_access_fraction`, LEAP's: each New-Order line
//! and each Payment's customer is of another partition on its own, so a New-Order may span
//! several).
//!
//! All five transactions run: the standard mix (`mix = "standard"`, the minor ones at 4%
//! each), or New-Order and Payment with the minor ones at the shares configured
//! (`mix = "neworder-payment"`). Stock-Level and Delivery run as OLLP (see `procs`).

use super::keys::{TpccKeys, CUSTOMERS, DISTRICTS, ITEMS, LAST_NAMES, MAX_OL_CNT};
use super::load::LOAD_DATE;
use super::procs::{self, LastNameChoices, Procs, MIN_OL_CNT};
use super::random::{nurand, uniform, NuRandC, A_C_ID, A_C_LAST, A_OL_I_ID};
use super::schema::*;
use super::TpccData;
use crate::{ScanFn, Tally, TxnCall, TxnGenerator, Workload};
use qstore_core::config::{TpccConfig, TpccMix};
use qstore_core::partition::PartitionMap;
use qstore_core::rng::Rng;
use qstore_core::txn::{Catalog, ProcCall, RowLoader, Value};
use qstore_core::{ConfigError, PartitionId, QError, RunConfig};
use rand::Rng as _;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// The standard mix's share of each minor transaction (clause 5.2.3's minimum).
const STANDARD_MINOR_SHARE: f64 = 0.04;

/// Mixed into the clients' stream numbers, so that TPC-C's inputs are not another
/// workload's for the same seed.
const CLIENT_STREAMS: u64 = 0x7470_6363_636c_6e74;

pub struct Tpcc {
    cfg: TpccConfig,
    data: TpccData,
    seed: u64,
    pmap: PartitionMap,
    catalog: Arc<Catalog>,
    procs: Procs,
}

impl Tpcc {
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = run.workload.tpcc.clone();
        let data = TpccData::new(run)?;
        let mut catalog = Catalog::default();
        for schema in data.schemas() {
            catalog.add_table(schema);
        }
        let choices = Arc::new(LastNameChoices::new(&data));
        let procs = procs::register(&mut catalog, *data.keys(), choices);
        let pmap = PartitionMap::new(run.cluster.nodes, run.cluster.partitioning, &catalog.tables);
        Ok(Tpcc {
            cfg,
            data,
            seed: run.seed,
            pmap,
            catalog: Arc::new(catalog),
            procs,
        })
    }

    fn keys(&self) -> &TpccKeys {
        self.data.keys()
    }

    /// Stock-Level after its reconnaissance: `[w, d, threshold]` and the D_NEXT_O_ID and line
    /// items it read become `[w, d, threshold, D_NEXT_O_ID, distinct items]`.
    fn stock_level_after(&self, recon: &ProcCall, outputs: &[Value]) -> Result<ProcCall, String> {
        let Some((Value::Int(next), lines)) = outputs.split_first() else {
            return Err("Stock-Level's reconnaissance answered no D_NEXT_O_ID".into());
        };
        let items: std::collections::BTreeSet<i64> =
            lines.iter().filter_map(Value::as_int).collect();
        let mut args = recon.args.clone();
        args.push(Value::Int(*next));
        args.extend(items.into_iter().map(Value::Int));
        Ok(ProcCall {
            proc: self.procs.stock_level,
            args,
        })
    }

    /// Delivery after its reconnaissance: `[w, carrier, date]` and, per district, the head,
    /// whether its NEW-ORDER row is there, the order's customer and line count, and the lines'
    /// amounts become `[w, carrier, date, then per district: o, present, c, ol_cnt, amount]`.
    fn delivery_after(&self, recon: &ProcCall, outputs: &[Value]) -> Result<ProcCall, String> {
        let per = procs::DELIVERY_RECON_PER_DISTRICT;
        if outputs.len() != DISTRICTS as usize * per {
            return Err(format!(
                "Delivery's reconnaissance answered {} values, not {}",
                outputs.len(),
                DISTRICTS as usize * per
            ));
        }
        let mut args = recon.args.clone();
        for district in outputs.chunks_exact(per) {
            let Value::Int(o) = district[0] else {
                return Err("Delivery's reconnaissance answered no NEW_ORDER_HEAD".into());
            };
            let order = match (&district[1], &district[2]) {
                (Value::Int(1), Value::Bytes(b)) if b.len() == 8 => {
                    let c = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
                    let ol_cnt = u32::from_le_bytes(b[4..].try_into().expect("4 bytes"));
                    let lines = district[3..].iter().take(ol_cnt as usize);
                    let amount: i64 = lines.filter_map(Value::as_int).sum();
                    [1, c as i64, ol_cnt as i64, amount]
                }
                _ => [0; 4],
            };
            args.push(Value::Int(o));
            args.extend(order.map(Value::Int));
        }
        Ok(ProcCall {
            proc: self.procs.delivery,
            args,
        })
    }
}

impl Workload for Tpcc {
    fn name(&self) -> &'static str {
        "tpcc"
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }

    fn partition_map(&self) -> &PartitionMap {
        &self.pmap
    }

    fn load(&self, partition: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError> {
        self.data.load(partition, loader)
    }

    fn generator(&self, client: u32, home: PartitionId) -> Box<dyn TxnGenerator> {
        Box::new(TpccGenerator {
            rng: qstore_core::rng::stream(self.seed ^ CLIENT_STREAMS, client as u64),
            keys: *self.keys(),
            cfg: self.cfg.clone(),
            nurand: self.data.nurand_run(),
            home,
            procs: self.procs,
            date: LOAD_DATE as u32,
        })
    }

    fn is_reconnaissance(&self, call: &ProcCall) -> bool {
        call.proc == self.procs.stock_level_recon || call.proc == self.procs.delivery_recon
    }

    fn after_reconnaissance(
        &self,
        recon: &ProcCall,
        outputs: &[Value],
    ) -> Result<ProcCall, String> {
        if !self.is_reconnaissance(recon) || recon.args.len() != 3 {
            return Err(format!(
                "no reconnaissance: call of procedure #{}",
                recon.proc.0
            ));
        }
        match recon.proc == self.procs.delivery_recon {
            true => self.delivery_after(recon, outputs),
            false => self.stock_level_after(recon, outputs),
        }
    }

    fn tally(&self, scan: &mut ScanFn<'_>) -> Option<Tally> {
        Some(consistency_tally(self.keys(), scan))
    }

    fn check_tally(&self, t: &Tally) -> Result<String, String> {
        let want = self.keys().warehouses() as i128;
        let (warehouses, districts) = (t.count("warehouses"), t.count("districts"));
        if let Some(problems) = t.problems_line() {
            return Err(format!("tpcc: {problems}"));
        }
        if warehouses != want || districts != want * DISTRICTS as i128 {
            return Err(format!(
                "tpcc: found {warehouses} warehouses and {districts} districts, expected {want} \
                 and {}",
                want * DISTRICTS as i128
            ));
        }
        Ok(format!(
            "tpcc: consistency conditions 1-5 hold in all {districts} districts ({} orders, {} \
             order lines, {} new orders, {} history rows), and CUSTOMER_LAST_ORDER names every \
             customer's latest order",
            t.count("orders"),
            t.count("order_lines"),
            t.count("new_orders"),
            t.count("history")
        ))
    }
}

/// A district's figures for the consistency conditions.
#[derive(Default)]
struct DistrictFigures {
    next_o_id: u32,
    next_h_id: u32,
    order_lines_column: u32,
    ytd: i64,
    max_o_id: u32,
    ol_cnt_sum: u64,
    order_lines: u64,
    new_orders: u64,
    min_no_o_id: u32,
    max_no_o_id: u32,
    history: u64,
    head: u32,
    /// Orders without a carrier (undelivered): how many, and the smallest and largest id.
    undelivered: u64,
    min_undelivered: u32,
    max_undelivered: u32,
}

/// Conditions 1-5 of clause 3.3.2 over the rows `scan` visits, which hold whole warehouses
/// (one partition's, or all): per warehouse W_YTD = sum(D_YTD); per district D_NEXT_O_ID - 1
/// = max(O_ID) = max(NO_O_ID), the NEW-ORDER rows are max(NO_O_ID) - min(NO_O_ID) + 1,
/// sum(O_OL_CNT) = the ORDER-LINE rows, and the orders without a carrier are those with a
/// NEW-ORDER row. Also what makes sure no insert was lost (each district's D_ORDER_LINES and
/// D_NEXT_H_ID - 1 count its ORDER-LINE and HISTORY rows) and that the indexes are right
/// (CUSTOMER_LAST_ORDER, NEW_ORDER_HEAD).
pub fn consistency_tally(k: &TpccKeys, scan: &mut ScanFn<'_>) -> Tally {
    let mut t = Tally::default();
    let mut w_ytd: FxHashMap<u32, i64> = FxHashMap::default();
    let mut districts: FxHashMap<(u32, u32), DistrictFigures> = FxHashMap::default();
    scan(WAREHOUSE, &mut |key, row| {
        w_ytd.insert(key as u32, W_YTD.get_money(row));
    });
    scan(DISTRICT, &mut |key, row| {
        let f = districts.entry(k.decode_district(key)).or_default();
        f.next_o_id = D_NEXT_O_ID.get_u32(row);
        f.next_h_id = D_NEXT_H_ID.get_u32(row);
        f.order_lines_column = D_ORDER_LINES.get_u32(row);
        f.ytd = D_YTD.get_money(row);
    });
    // The latest order of each customer that has one, by the customer's key.
    let mut latest: FxHashMap<u64, u32> = FxHashMap::default();
    scan(ORDER, &mut |key, row| {
        let (w, d, o) = k.decode_order(key);
        let f = districts.entry((w, d)).or_default();
        f.max_o_id = f.max_o_id.max(o);
        f.ol_cnt_sum += O_OL_CNT.get_i32(row) as u64;
        if O_CARRIER_ID.get_u32(row) == 0 {
            f.min_undelivered = match f.undelivered {
                0 => o,
                _ => f.min_undelivered.min(o),
            };
            f.max_undelivered = f.max_undelivered.max(o);
            f.undelivered += 1;
        }
        t.add("orders", 1);
        match k.checked_customer(w as i64, d as i64, O_C_ID.get_u32(row) as i64) {
            Ok(c) => {
                let l = latest.entry(c).or_default();
                *l = (*l).max(o);
            }
            Err(e) => t.problem(|| format!("ORDER {w}/{d}/{o}: {e}")),
        }
    });
    scan(CUSTOMER_LAST_ORDER, &mut |key, row| {
        let (o, want) = (CO_O_ID.get_u32(row), latest.remove(&key).unwrap_or(0));
        if o != want {
            let (w, d, c) = k.decode_customer(key);
            t.problem(|| {
                format!(
                    "CUSTOMER_LAST_ORDER of customer {w}/{d}/{c} is order {o}, but its latest \
                     order is {want}"
                )
            });
        }
    });
    if let Some((&key, &o)) = latest.iter().next() {
        let (w, d, c) = k.decode_customer(key);
        t.problem(|| format!("customer {w}/{d}/{c} has order {o} but no CUSTOMER_LAST_ORDER row"));
    }
    scan(NEW_ORDER, &mut |key, _| {
        let (w, d, o) = k.decode_order(key);
        let f = districts.entry((w, d)).or_default();
        f.min_no_o_id = if f.new_orders == 0 {
            o
        } else {
            f.min_no_o_id.min(o)
        };
        f.max_no_o_id = f.max_no_o_id.max(o);
        f.new_orders += 1;
        t.add("new_orders", 1);
    });
    scan(NEW_ORDER_HEAD, &mut |key, row| {
        districts.entry(k.decode_district(key)).or_default().head = NOH_O_ID.get_u32(row);
    });
    scan(ORDER_LINE, &mut |key, _| {
        let (w, d, _, _) = k.decode_order_line(key);
        districts.entry((w, d)).or_default().order_lines += 1;
        t.add("order_lines", 1);
    });
    scan(HISTORY, &mut |key, row| {
        let (w, d) = (H_W_ID.get_u32(row), H_D_ID.get_u32(row));
        let (kw, kd, _, _) = k.decode_history(key);
        if (kw, kd) != (w, d) {
            t.problem(|| {
                format!("HISTORY key {key:#x} is district ({kw}, {kd}), its row ({w}, {d})")
            });
        }
        districts.entry((w, d)).or_default().history += 1;
        t.add("history", 1);
    });
    let mut sums: FxHashMap<u32, i64> = FxHashMap::default();
    for (&(w, d), f) in &districts {
        *sums.entry(w).or_default() += f.ytd;
        check_district(w, d, f, &mut t);
    }
    for (w, ytd) in w_ytd {
        let sum = sums.get(&w).copied().unwrap_or(0);
        if ytd != sum {
            t.problem(|| format!("condition 1: warehouse {w} W_YTD {ytd} != sum(D_YTD) {sum}"));
        }
        t.add("warehouses", 1);
    }
    t.add("districts", districts.len() as i128);
    t
}

fn check_district(w: u32, d: u32, f: &DistrictFigures, t: &mut Tally) {
    let at = format!("warehouse {w} district {d}");
    let last = f.next_o_id.wrapping_sub(1);
    if last != f.max_o_id || last != f.max_no_o_id {
        t.problem(|| {
            format!(
                "condition 2: {at}: D_NEXT_O_ID - 1 = {last}, max(O_ID) = {}, max(NO_O_ID) = {}",
                f.max_o_id, f.max_no_o_id
            )
        });
    }
    let span = match f.new_orders {
        0 => 0,
        _ => (f.max_no_o_id as u64 + 1).saturating_sub(f.min_no_o_id as u64),
    };
    if f.new_orders != span {
        t.problem(|| {
            format!(
                "condition 3: {at}: {} NEW-ORDER rows, but NO_O_ID spans {}..={}",
                f.new_orders, f.min_no_o_id, f.max_no_o_id
            )
        });
    }
    // 5: O_CARRIER_ID is null exactly for the orders with a NEW-ORDER row (given 3, which
    // makes those a range: as many distinct ids as the range's span, within it).
    let carrierless = (f.undelivered, f.min_undelivered, f.max_undelivered);
    if f.new_orders != 0 && carrierless != (f.new_orders, f.min_no_o_id, f.max_no_o_id)
        || f.new_orders == 0 && f.undelivered != 0
    {
        t.problem(|| {
            format!(
                "condition 5: {at}: {} orders without a carrier (ids {}..={}), but {} NEW-ORDER \
                 rows ({}..={})",
                f.undelivered,
                f.min_undelivered,
                f.max_undelivered,
                f.new_orders,
                f.min_no_o_id,
                f.max_no_o_id
            )
        });
    }
    let oldest = if f.new_orders == 0 {
        f.next_o_id
    } else {
        f.min_no_o_id
    };
    if f.head != oldest {
        t.problem(|| {
            format!(
                "{at}: NEW_ORDER_HEAD is {}, but the oldest undelivered order is {oldest}",
                f.head
            )
        });
    }
    if f.ol_cnt_sum != f.order_lines || f.order_lines != f.order_lines_column as u64 {
        t.problem(|| {
            format!(
                "condition 4: {at}: sum(O_OL_CNT) = {}, {} ORDER-LINE rows, D_ORDER_LINES = {}",
                f.ol_cnt_sum, f.order_lines, f.order_lines_column
            )
        });
    }
    if f.history + 1 != f.next_h_id as u64 {
        t.problem(|| {
            format!(
                "{at}: {} HISTORY rows, but D_NEXT_H_ID = {}",
                f.history, f.next_h_id
            )
        });
    }
}

struct TpccGenerator {
    rng: Rng,
    keys: TpccKeys,
    cfg: TpccConfig,
    nurand: NuRandC,
    home: PartitionId,
    procs: Procs,
    /// O_ENTRY_D and H_DATE: a clock of the client's own (steps may not read one), a second
    /// per transaction from the load's date.
    date: u32,
}

impl TpccGenerator {
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random::<f64>() < p
    }

    /// A warehouse of another partition, for a multi-partition transaction.
    fn remote_partition_warehouse(&mut self) -> u32 {
        let n = self.keys.partitions();
        let other = (self.home.0 + uniform(&mut self.rng, 1, n - 1)) % n;
        let ws = self.keys.warehouses_of(PartitionId(other));
        uniform(&mut self.rng, ws.start, ws.end - 1)
    }

    /// Another warehouse of the home partition than `w`, if it has one.
    fn other_home_warehouse(&mut self, w: u32) -> Option<u32> {
        let ws = self.keys.warehouses_of(self.home);
        let n = ws.end - ws.start;
        (n > 1).then(|| ws.start + (w - ws.start + uniform(&mut self.rng, 1, n - 1)) % n)
    }

    /// Whether this transaction spans two partitions (never with one partition).
    fn multi_partition(&mut self) -> bool {
        self.keys.partitions() > 1 && self.chance(self.cfg.multi_partition_fraction)
    }

    /// Whether this access (a New-Order line, a Payment's customer) goes to another partition,
    /// LEAP's remote share per access (never with one partition). Draws nothing when the
    /// share is 0, so the stream is then the one without it.
    fn remote_access(&mut self) -> bool {
        self.keys.partitions() > 1 && self.chance(self.cfg.remote_access_fraction)
    }

    fn new_order_call(&mut self, w: u32, d: u32) -> TxnCall {
        let c = nurand(&mut self.rng, A_C_ID, 1, CUSTOMERS, self.nurand.c_id);
        let ol_cnt = uniform(&mut self.rng, MIN_OL_CNT, MAX_OL_CNT);
        let rollback = uniform(&mut self.rng, 1, 100) == 1;
        let remote_line = self
            .multi_partition()
            .then(|| uniform(&mut self.rng, 1, ol_cnt));
        let mut args = Vec::with_capacity(4 + 3 * ol_cnt as usize);
        args.extend([w, d, c, self.date].map(|v| Value::Int(v as i64)));
        for ol in 1..=ol_cnt {
            let item = match rollback && ol == ol_cnt {
                true => ITEMS + 1,
                false => nurand(&mut self.rng, A_OL_I_ID, 1, ITEMS, self.nurand.ol_i_id),
            };
            let supply_w = if remote_line == Some(ol) || self.remote_access() {
                self.remote_partition_warehouse()
            } else if self.chance(self.cfg.remote_new_order_line_fraction) {
                self.other_home_warehouse(w).unwrap_or(w)
            } else {
                w
            };
            let quantity = uniform(&mut self.rng, 1, 10);
            args.extend([item, supply_w, quantity].map(|v| Value::Int(v as i64)));
        }
        TxnCall {
            call: ProcCall {
                proc: self.procs.new_order,
                args,
            },
            ops: 6 + 3 * ol_cnt,
        }
    }

    /// A customer as Payment and Order-Status choose one (clauses 2.5.1.2, 2.6.1.2): by last
    /// name 60% of the time (a last-name number), else by C_ID.
    fn customer(&mut self) -> (bool, u32) {
        let by_name = uniform(&mut self.rng, 1, 100) <= 60;
        let who = match by_name {
            true => nurand(
                &mut self.rng,
                A_C_LAST,
                0,
                LAST_NAMES - 1,
                self.nurand.c_last,
            ),
            false => nurand(&mut self.rng, A_C_ID, 1, CUSTOMERS, self.nurand.c_id),
        };
        (by_name, who)
    }

    /// Order-Status of a customer of the client's district (always the home warehouse).
    fn order_status_call(&mut self, w: u32, d: u32) -> TxnCall {
        let (by_name, who) = self.customer();
        TxnCall {
            call: ProcCall {
                proc: self.procs.order_status,
                args: [w, d, by_name as u32, who]
                    .iter()
                    .map(|&v| Value::Int(v as i64))
                    .collect(),
            },
            ops: 3 + MAX_OL_CNT,
        }
    }

    /// Stock-Level of the client's district, as its reconnaissance (the client runs the
    /// transaction itself once that answers: see `Workload::after_reconnaissance`).
    fn stock_level_call(&mut self, w: u32, d: u32) -> TxnCall {
        let [lo, hi] = procs::STOCK_LEVEL_THRESHOLD;
        let threshold = uniform(&mut self.rng, lo, hi);
        TxnCall {
            call: ProcCall {
                proc: self.procs.stock_level_recon,
                args: [w, d, threshold].map(|v| Value::Int(v as i64)).to_vec(),
            },
            // The reconnaissance's reads; the transaction adds the district and the items.
            ops: 1 + procs::STOCK_LEVEL_LINES,
        }
    }

    /// Delivery of the client's warehouse (all its districts), as its reconnaissance.
    fn delivery_call(&mut self, w: u32) -> TxnCall {
        let carrier = uniform(&mut self.rng, 1, 10);
        TxnCall {
            call: ProcCall {
                proc: self.procs.delivery_recon,
                args: [w, carrier, self.date]
                    .map(|v| Value::Int(v as i64))
                    .to_vec(),
            },
            // The reconnaissance's reads; the transaction writes about as many.
            ops: (DISTRICTS as usize * procs::DELIVERY_RECON_PER_DISTRICT) as u32,
        }
    }

    fn payment_call(&mut self, w: u32, d: u32) -> TxnCall {
        let (c_w, c_d) = if self.multi_partition() || self.remote_access() {
            (
                self.remote_partition_warehouse(),
                uniform(&mut self.rng, 1, DISTRICTS),
            )
        } else if self.chance(self.cfg.remote_payment_fraction) {
            match self.other_home_warehouse(w) {
                Some(o) => (o, uniform(&mut self.rng, 1, DISTRICTS)),
                None => (w, d),
            }
        } else {
            (w, d)
        };
        let (by_name, who) = self.customer();
        let amount = uniform(&mut self.rng, 100, 500_000);
        let args = [w, d, c_w, c_d, by_name as u32, who, amount, self.date];
        TxnCall {
            call: ProcCall {
                proc: self.procs.payment,
                args: args.iter().map(|&v| Value::Int(v as i64)).collect(),
            },
            ops: 4,
        }
    }
}

impl TxnGenerator for TpccGenerator {
    fn next_txn(&mut self) -> TxnCall {
        let ws = self.keys.warehouses_of(self.home);
        let w = uniform(&mut self.rng, ws.start, ws.end - 1);
        let d = uniform(&mut self.rng, 1, DISTRICTS);
        self.date = self.date.wrapping_add(1);
        // One draw splits the shares: Payment, Order-Status, Stock-Level, Delivery, New-Order
        // the rest.
        let [order_status, stock_level, delivery] = match self.cfg.mix {
            TpccMix::Standard => [STANDARD_MINOR_SHARE; 3],
            TpccMix::NeworderPayment => [
                self.cfg.order_status_fraction,
                self.cfg.stock_level_fraction,
                self.cfg.delivery_fraction,
            ],
        };
        let x = self.rng.random::<f64>() - self.cfg.payment_fraction;
        if x < 0.0 {
            self.payment_call(w, d)
        } else if x < order_status {
            self.order_status_call(w, d)
        } else if x < order_status + stock_level {
            self.stock_level_call(w, d)
        } else if x < order_status + stock_level + delivery {
            self.delivery_call(w)
        } else {
            self.new_order_call(w, d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemStore;
    use qstore_core::config::Partitioning;

    /// The integer arguments of a call (every TPC-C procedure's).
    fn int_args(call: &ProcCall) -> Vec<u32> {
        call.args
            .iter()
            .map(|v| v.as_int().unwrap() as u32)
            .collect()
    }

    fn config(nodes: u32, max_orders: u32) -> RunConfig {
        let mut c = RunConfig::default();
        c.workload.name = "tpcc".into();
        c.cluster.nodes = nodes;
        c.cluster.partitioning = Partitioning::Range;
        let t = &mut c.workload.tpcc;
        t.mix = TpccMix::NeworderPayment;
        t.payment_fraction = 0.5;
        t.max_orders_per_district = max_orders;
        t.multi_partition_fraction = 0.5;
        c
    }

    /// A New-Order of customer `c` of district (0, `d`): items 1..=5 from warehouse 0, 3 each.
    fn new_order(t: &Tpcc, d: u32, c: u32) -> ProcCall {
        ProcCall {
            proc: t.procs.new_order,
            args: [0, d, c, 0]
                .into_iter()
                .chain((0..5).flat_map(|i| [i + 1, 0, 3]))
                .map(|v| Value::Int(v as i64))
                .collect(),
        }
    }

    fn run_serially(t: &Tpcc, m: &mut MemStore, home: u32, n: usize) -> Vec<Option<Vec<Value>>> {
        let mut g = t.generator(home, PartitionId(home));
        let cat = t.catalog();
        (0..n)
            .map(|_| m.execute(&cat, &g.next_txn().call))
            .collect()
    }

    /// Runs `call` as the client does: a reconnaissance, then the transaction built from it
    /// (serially there is nothing in between, so no guess is ever stale).
    fn run_as_client(t: &Tpcc, m: &mut MemStore, call: &ProcCall) -> Option<Vec<Value>> {
        let cat = t.catalog();
        let out = m.execute(&cat, call)?;
        match t.is_reconnaissance(call) {
            true => m.execute(&cat, &t.after_reconnaissance(call, &out).unwrap()),
            false => Some(out),
        }
    }

    /// The standard mix: its shares, and all five transactions run serially keep conditions
    /// 1-5 and the indexes right.
    #[test]
    fn the_standard_mix_runs_all_five_and_keeps_the_conditions() {
        let mut c = config(2, 4_000);
        c.workload.tpcc.mix = TpccMix::Standard;
        c.workload.tpcc.payment_fraction = 0.43;
        let t = Tpcc::new(&c).unwrap();
        let p = &t.procs;
        let mut g = t.generator(3, PartitionId(0));
        let calls: Vec<ProcCall> = (0..2_000).map(|_| g.next_txn().call).collect();
        let share = |proc| calls.iter().filter(|c| c.proc == proc).count() as f64 / 2_000.0;
        assert!((share(p.payment) - 0.43).abs() < 0.04);
        for minor in [p.order_status, p.stock_level_recon, p.delivery_recon] {
            assert!((share(minor) - 0.04).abs() < 0.015, "{}", share(minor));
        }
        assert!((share(p.new_order) - 0.45).abs() < 0.04);
        let mut m = MemStore::loaded(&t, 0..1);
        let done = calls
            .iter()
            .filter(|c| run_as_client(&t, &mut m, c).is_some());
        assert!(done.count() > 1_950);
        let tally = m.tally_where(&t, |_, _| true).unwrap();
        assert_eq!(tally.problems_line(), None);
    }

    /// Delivery takes the oldest new order of each district: the NEW-ORDER row goes, the order
    /// gets its carrier and its lines their date, the customer the amount, the head moves on;
    /// a second Delivery in between makes the first one's guess stale.
    #[test]
    fn delivery_delivers_the_oldest_order_of_each_district() {
        let t = Tpcc::new(&config(2, 4_000)).unwrap();
        let mut m = MemStore::loaded(&t, 0..1);
        let (cat, k) = (t.catalog(), *t.keys());
        let recon = ProcCall {
            proc: t.procs.delivery_recon,
            args: [0, 7, 12_345].map(Value::Int).to_vec(),
        };
        let seen = m.run(&cat, &recon).unwrap();
        let main = t.after_reconnaissance(&recon, &seen).unwrap();
        let before = m.clone();
        m.run(&cat, &main).unwrap();
        for d in 1..=DISTRICTS {
            let o = NOH_O_ID.get_u32(before.get(NEW_ORDER_HEAD, k.district(0, d)));
            assert_eq!(
                NOH_O_ID.get_u32(m.get(NEW_ORDER_HEAD, k.district(0, d))),
                o + 1
            );
            assert!(m.try_get(NEW_ORDER, k.new_order(0, d, o)).is_none());
            let order = m.get(ORDER, k.order(0, d, o));
            assert_eq!(O_CARRIER_ID.get_u32(order), 7);
            let c = O_C_ID.get_u32(order);
            let mut amount = 0;
            for ol in 1..=O_OL_CNT.get_i32(order) as u32 {
                let line = m.get(ORDER_LINE, k.order_line(0, d, o, ol));
                assert_eq!(OL_DELIVERY_D.get_i64(line), 12_345);
                amount += OL_AMOUNT.get_money(line);
            }
            let (was, now) = (
                before.get(CUSTOMER, k.customer(0, d, c)),
                m.get(CUSTOMER, k.customer(0, d, c)),
            );
            assert_eq!(C_BALANCE.get_money(now), C_BALANCE.get_money(was) + amount);
            assert_eq!(C_DELIVERY_CNT.get_i32(now), C_DELIVERY_CNT.get_i32(was) + 1);
        }
        let tally = m.tally_where(&t, |_, _| true).unwrap();
        assert_eq!(tally.problems_line(), None);
        // Run again on the old guess: every head has moved.
        assert_eq!(m.run(&cat, &main), Err(qstore_core::txn::OLLP_RESTART));
        // Malformed answers and arguments are refused.
        assert!(t.after_reconnaissance(&recon, &seen[1..]).is_err());
        let mut bad = main.clone();
        bad.args.pop();
        assert!(cat.program(&bad).is_err());
        bad.args.push(Value::Int(16));
        bad.args[3 + 3] = Value::Int(16); // O_OL_CNT of district 1
        assert!(cat.program(&bad).is_err());
    }

    /// New-Orders and Payments run serially keep conditions 1-4, about 1% of New-Orders roll
    /// back, and each partition's tally merges into the check of the whole.
    #[test]
    fn serial_execution_keeps_the_consistency_conditions() {
        let t = Tpcc::new(&config(2, 4_000)).unwrap();
        let mut m = MemStore::loaded(&t, 0..2);
        assert!(m
            .check_final(&t)
            .unwrap()
            .unwrap()
            .contains("hold in all 20"));
        let orders = m.len(ORDER);
        let history = m.len(HISTORY);
        let results = [0, 1].map(|home| run_serially(&t, &mut m, home, 1_500));
        let rolled_back = results.iter().flatten().filter(|r| r.is_none()).count();
        assert!((5..=40).contains(&rolled_back), "{rolled_back} of 3000");
        let committed = 3_000 - rolled_back;
        assert_eq!(m.len(ORDER) - orders + m.len(HISTORY) - history, committed);
        let whole = m.check_final(&t).unwrap().unwrap();
        let mut merged = Tally::default();
        for p in 0..2 {
            let part = m.tally_where(&t, |table, k| {
                t.pmap.partition_of(table, k) == PartitionId(p)
            });
            merged.merge(&part.unwrap());
        }
        assert_eq!(t.check_tally(&merged).unwrap(), whole);
        // The rows New-Order and Payment insert are where their keys say.
        let k = t.keys();
        let (key, row) = m.rows(ORDER).last().unwrap();
        assert_eq!(k.decode_order(key).2, O_ID.get_u32(row));
        let (key, row) = m.rows(ORDER_LINE).last().unwrap();
        let (_, _, o, ol) = k.decode_order_line(key);
        assert_eq!((o, ol), (OL_O_ID.get_u32(row), OL_NUMBER.get_u32(row)));
        assert!(OL_AMOUNT.get_money(row) > 0 && !OL_DIST_INFO.get_bytes(row).is_empty());
    }

    #[test]
    fn each_broken_condition_is_reported() {
        let t = Tpcc::new(&config(2, 4_000)).unwrap();
        let k = *t.keys();
        let fresh = MemStore::loaded(&t, 0..2);
        let broken = |edit: &dyn Fn(&mut MemStore), want: &str| {
            let mut m = fresh.clone();
            edit(&mut m);
            let err = m.check_final(&t).unwrap_err();
            assert!(err.contains(want), "{want}: {err}");
        };
        broken(
            &|m| W_YTD.set_money(m.get_mut(WAREHOUSE, k.warehouse(1)), 1),
            "condition 1: warehouse 1",
        );
        broken(
            &|m| D_NEXT_O_ID.set_u32(m.get_mut(DISTRICT, k.district(0, 3)), 2_999),
            "condition 2: warehouse 0 district 3",
        );
        broken(
            &|m| m.remove(NEW_ORDER, k.new_order(1, 2, 2_500)),
            "condition 3: warehouse 1 district 2",
        );
        broken(
            &|m| m.remove(ORDER_LINE, k.order_line(0, 9, 17, 1)),
            "condition 4: warehouse 0 district 9",
        );
        broken(
            &|m| D_NEXT_H_ID.set_u32(m.get_mut(DISTRICT, k.district(1, 10)), 5_000),
            "HISTORY rows",
        );
        broken(
            &|m| CO_O_ID.set_u32(m.get_mut(CUSTOMER_LAST_ORDER, k.customer(0, 2, 7)), 1),
            "CUSTOMER_LAST_ORDER of customer 0/2/7",
        );
        broken(
            &|m| m.remove(CUSTOMER_LAST_ORDER, k.customer(1, 5, 3_000)),
            "customer 1/5/3000 has order",
        );
        broken(
            &|m| O_CARRIER_ID.set_u32(m.get_mut(ORDER, k.order(0, 4, 2_500)), 3),
            "condition 5: warehouse 0 district 4",
        );
        broken(
            &|m| NOH_O_ID.set_u32(m.get_mut(NEW_ORDER_HEAD, k.district(1, 1)), 2_102),
            "NEW_ORDER_HEAD is 2102",
        );
    }

    /// Order-Status answers the customer's balance and latest order, before and after the
    /// customer orders again; it reads that order and every line number it could have.
    #[test]
    fn order_status_reads_the_customers_latest_order() {
        let t = Tpcc::new(&config(2, 4_000)).unwrap();
        let mut m = MemStore::loaded(&t, 0..1);
        let (cat, k) = (t.catalog(), *t.keys());
        let status = |by_name: i64, who: i64| ProcCall {
            proc: t.procs.order_status,
            args: [0, 3, by_name, who].map(Value::Int).to_vec(),
        };
        let c = 42;
        let loaded = CO_O_ID.get_u32(m.get(CUSTOMER_LAST_ORDER, k.customer(0, 3, c)));
        let balance = C_BALANCE.get_money(m.get(CUSTOMER, k.customer(0, 3, c)));
        let out = m.execute(&cat, &status(0, c as i64)).unwrap();
        assert_eq!(out.len(), 3 + MAX_OL_CNT as usize);
        assert_eq!(out[..2], [Value::Int(balance), Value::Int(loaded as i64)]);
        let program = cat.program(&status(0, c as i64)).unwrap();
        assert!(program.accesses[2..].iter().all(|a| a.key_dep.is_some()));
        let order = new_order(&t, 3, c);
        m.execute(&cat, &order).unwrap();
        let new = D_NEXT_O_ID.get_u32(m.get(DISTRICT, k.district(0, 3))) - 1;
        let out = m.execute(&cat, &status(0, c as i64)).unwrap();
        assert_eq!(out[1], Value::Int(new as i64));
        // By last name: the customer the index lists in the middle.
        let name = 7;
        let row = m.get(CUSTOMER_BY_LAST_NAME, k.customer_by_last_name(0, 3, name));
        let who = cl_middle_customer(row).unwrap();
        let latest = CO_O_ID.get_u32(m.get(CUSTOMER_LAST_ORDER, k.customer(0, 3, who)));
        let out = m.execute(&cat, &status(1, name as i64)).unwrap();
        assert_eq!(out[1], Value::Int(latest as i64));
        let tally = m.tally_where(&t, |_, _| true).unwrap();
        assert_eq!(tally.problems_line(), None);
    }

    /// Stock-Level: its reconnaissance reads the last 20 orders' items, the transaction
    /// counts those whose stock is below the threshold, and a new order in between makes the
    /// guess stale (an OLLP restart, not a result).
    #[test]
    fn stock_level_counts_low_stock_of_the_last_20_orders_and_restarts_when_stale() {
        let t = Tpcc::new(&config(2, 4_000)).unwrap();
        let mut m = MemStore::loaded(&t, 0..1);
        let (cat, k) = (t.catalog(), *t.keys());
        let (w, d, threshold) = (0, 6, 15);
        let recon = ProcCall {
            proc: t.procs.stock_level_recon,
            args: [w, d, threshold].map(Value::Int).to_vec(),
        };
        assert!(t.is_reconnaissance(&recon));
        let seen = m.run(&cat, &recon).unwrap();
        let main = t.after_reconnaissance(&recon, &seen).unwrap();
        assert!(!t.is_reconnaissance(&main));
        // What the spec's query finds, straight from the rows.
        let next = D_NEXT_O_ID.get_u32(m.get(DISTRICT, k.district(0, 6)));
        let lines = m.range(
            ORDER_LINE,
            k.order_line(0, 6, next - 20, 1),
            k.order_line(0, 6, next - 1, MAX_OL_CNT),
        );
        let items: std::collections::BTreeSet<u32> =
            lines.iter().map(|l| OL_I_ID.get_u32(l)).collect();
        assert_eq!(main.args.len(), 4 + items.len());
        let low = items
            .iter()
            .filter(|&&i| S_QUANTITY.get_i32(m.get(STOCK, k.stock(0, i))) < threshold as i32)
            .count();
        let out = m.run(&cat, &main).unwrap();
        let count: i64 = out.iter().filter_map(Value::as_int).sum();
        assert_eq!(count, low as i64);
        // A New-Order of the district moves D_NEXT_O_ID: the guess is stale.
        let order = new_order(&t, 6, 1);
        m.run(&cat, &order).unwrap();
        assert_eq!(m.run(&cat, &main), Err(qstore_core::txn::OLLP_RESTART));
        let fresh = t.after_reconnaissance(&recon, &m.run(&cat, &recon).unwrap());
        assert!(m.run(&cat, &fresh.unwrap()).is_ok());
        // What the client gets wrong is refused, not run.
        assert!(t.after_reconnaissance(&recon, &[]).is_err());
        assert!(t.after_reconnaissance(&order, &seen).is_err());
        for args in [
            vec![0, 6, 9, 3_001],
            vec![0, 6, 15],
            vec![0, 6, 15, 3_001, 100_001],
        ] {
            let bad = ProcCall {
                proc: t.procs.stock_level,
                args: args.into_iter().map(Value::Int).collect(),
            };
            assert!(cat.program(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn full_tables_abort_with_the_setting_to_raise() {
        let t = Tpcc::new(&config(2, 3_010)).unwrap();
        let mut m = MemStore::loaded(&t, 0..1);
        let cat = t.catalog();
        let k = *t.keys();
        let order = |c: u32| new_order(&t, 1, c);
        for c in 1..=10 {
            assert!(m.execute(&cat, &order(c)).is_some());
        }
        assert!(
            m.execute(&cat, &order(11)).is_none(),
            "the district is full"
        );
        let district = m.get(DISTRICT, k.district(0, 1));
        assert_eq!(D_NEXT_O_ID.get_u32(district), 3_011);
        let program = cat.program(&order(12)).unwrap();
        let next = &program.accesses[6];
        let mut row = district.to_vec();
        let refused = cat
            .steps
            .run(
                next.as_ref(),
                qstore_core::txn::RowRef::Write(&mut row),
                &[],
            )
            .unwrap_err();
        assert!(
            refused.0.contains("max_orders_per_district"),
            "{}",
            refused.0
        );
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let t = Tpcc::new(&config(2, 4_000)).unwrap();
        let cat = t.catalog();
        let call = |proc, args: &[i64]| ProcCall {
            proc,
            args: args.iter().map(|&v| Value::Int(v)).collect(),
        };
        let line = [1, 0, 5];
        let lines = |n: usize| line.repeat(n);
        let no = |fixed: &[i64], n| [fixed, &lines(n)].concat();
        for (args, want) in [
            (no(&[0, 1, 1, 0], 4), "lines of 3"),
            (no(&[0, 1, 1, 0], 16), "lines of 3"),
            (no(&[2, 1, 1, 0], 5), "W_ID = 2"),
            (no(&[0, 0, 1, 0], 5), "D_ID = 0"),
            (no(&[0, 1, 3_001, 0], 5), "C_ID = 3001"),
            (
                [no(&[0, 1, 1, 0], 5), vec![0, 0, 11]].concat(),
                "OL_I_ID = 0",
            ),
        ] {
            let err = cat
                .program(&call(t.procs.new_order, &args))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
        for (args, want) in [
            (vec![0, 1, 0, 1, 0, 1, 500], "8 arguments"),
            (vec![0, 1, 0, 1, 1, 1_000, 500, 0], "C_LAST number = 1000"),
            (vec![0, 1, 0, 1, 2, 1, 500, 0], "by last name = 2"),
            (vec![0, 1, 0, 1, 0, 1, 99, 0], "H_AMOUNT = 99"),
        ] {
            let err = cat
                .program(&call(t.procs.payment, &args))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
        for (args, want) in [
            (vec![0, 1, 0], "4 arguments"),
            (vec![0, 11, 0, 1], "D_ID = 11"),
            (vec![0, 1, 2, 1], "by last name = 2"),
            (vec![0, 1, 0, 0], "C_ID = 0"),
            (vec![0, 1, 1, -1], "C_LAST number = -1"),
        ] {
            let err = cat
                .program(&call(t.procs.order_status, &args))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
        let bytes = ProcCall {
            proc: t.procs.payment,
            args: vec![Value::Bytes(vec![1]); 8],
        };
        assert!(cat.program(&bytes).is_err());
    }

    /// A customer chosen by last name is the one CUSTOMER_BY_LAST_NAME lists in the middle.
    #[test]
    fn last_names_choose_the_customer_the_index_lists() {
        let t = Tpcc::new(&config(2, 4_000)).unwrap();
        let m = MemStore::loaded(&t, 1..2);
        let k = *t.keys();
        let cat = t.catalog();
        for name in [0, 1, 371, 999] {
            let row = m.get(CUSTOMER_BY_LAST_NAME, k.customer_by_last_name(1, 4, name));
            let want = cl_middle_customer(row).unwrap();
            let args = [0, 1, 1, 4, 1, name as i64, 500, 0]
                .map(Value::Int)
                .to_vec();
            let program = cat
                .program(&ProcCall {
                    proc: t.procs.payment,
                    args,
                })
                .unwrap();
            assert_eq!(program.accesses[2].key, k.customer(1, 4, want));
        }
    }

    /// FNV-1a over the arguments (and procedure) of a generator's first `n` calls.
    fn stream_fingerprint(t: &Tpcc, client: u32, home: u32, n: usize) -> u64 {
        let mut g = t.generator(client, PartitionId(home));
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut eat = |v: u64| {
            for b in v.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        };
        for _ in 0..n {
            let call = g.next_txn().call;
            eat(call.proc.0 as u64);
            for a in &call.args {
                eat(a.as_int().expect("integer arguments") as u64);
            }
        }
        h
    }

    #[test]
    fn without_remote_accesses_the_stream_is_unchanged() {
        // Fingerprints of the streams before remote_access_fraction existed: the
        // multi-partition knob, the spec's in-partition remote fractions and the standard mix.
        let mp = config(3, 4_000);
        let mut standard = config(4, 4_000);
        standard.workload.tpcc.mix = TpccMix::Standard;
        standard.workload.tpcc.payment_fraction = 0.43;
        standard.workload.tpcc.multi_partition_fraction = 0.15;
        standard.workload.tpcc.warehouses_per_partition = 2;
        let mut local = config(2, 4_000);
        local.workload.tpcc.multi_partition_fraction = 0.0;
        local.workload.tpcc.warehouses_per_partition = 3;
        local.workload.tpcc.remote_new_order_line_fraction = 0.2;
        let got =
            [mp, standard, local].map(|c| stream_fingerprint(&Tpcc::new(&c).unwrap(), 7, 1, 400));
        assert_eq!(
            got,
            [
                0x649d_6f7e_abc3_6159,
                0x31b8_a536_40b1_ce99,
                0x1400_acfb_0953_238a
            ],
            "{got:#x?}"
        );
    }

    /// LEAP's TPC-C (section 5.3): New-Order and Payment half and half, remote accesses
    /// instead of multi-partition transactions.
    fn remote_config(nodes: u32, warehouses: u32, r: f64) -> RunConfig {
        let mut c = config(nodes, 4_000);
        c.workload.tpcc.warehouses_per_partition = warehouses;
        c.workload.tpcc.multi_partition_fraction = 0.0;
        c.workload.tpcc.remote_access_fraction = r;
        c.validate().unwrap();
        c
    }

    /// Each New-Order line's supplier and each Payment's customer is of another partition
    /// with probability r, independently, of each other partition alike; otherwise of the
    /// home partition, its other warehouses at the spec's shares as without remote accesses.
    #[test]
    fn remote_accesses_go_to_other_partitions_at_the_configured_share() {
        for r in [0.1, 0.5, 1.0] {
            let t = Tpcc::new(&remote_config(4, 2, r)).unwrap();
            let (k, home) = (*t.keys(), PartitionId(2));
            let mut g = t.generator(5, home);
            let (mut lines, mut payments) = ([0u32; 2], [0u32; 2]);
            // Remote accesses by partition; local ones of another home warehouse.
            let (mut to, mut other_home_w) = ([0u32; 4], [0u32; 2]);
            let n = 12_000;
            for _ in 0..n {
                let call = g.next_txn().call;
                let a = int_args(&call);
                assert_eq!(k.partition_of_warehouse(a[0]), home);
                let payment = call.proc == t.procs.payment;
                let (accessed, tally): (Vec<u32>, _) = match payment {
                    true => (vec![a[2]], &mut payments),
                    false => (a[4..].chunks(3).map(|l| l[1]).collect(), &mut lines),
                };
                for w in accessed {
                    let p = k.partition_of_warehouse(w);
                    to[p.0 as usize] += 1;
                    tally[(p != home) as usize] += 1;
                    other_home_w[payment as usize] += (p == home && w != a[0]) as u32;
                }
            }
            let share = |[local, remote]: [u32; 2]| remote as f64 / (local + remote) as f64;
            let (line_share, payment_share) = (share(lines), share(payments));
            assert!((line_share - r).abs() < 0.015, "r {r}: lines {line_share}");
            assert!(
                (payment_share - r).abs() < 0.03,
                "r {r}: payments {payment_share}"
            );
            // The other partitions alike, never the home one for a remote access.
            let remote: u32 = lines[1] + payments[1];
            for p in [0, 1, 3] {
                let of = to[p] as f64 / remote as f64;
                assert!((of - 1.0 / 3.0).abs() < 0.02, "r {r}: partition {p}: {of}");
            }
            // What stays home goes to the home partition's other warehouse at the spec's
            // shares: 1% of lines, 15% of payments.
            if r < 1.0 {
                let line_other = other_home_w[0] as f64 / lines[0] as f64;
                let payment_other = other_home_w[1] as f64 / payments[0] as f64;
                assert!((line_other - 0.01).abs() < 0.005, "r {r}: {line_other}");
                assert!(
                    (payment_other - 0.15).abs() < 0.04,
                    "r {r}: {payment_other}"
                );
            } else {
                assert_eq!(lines[0] + payments[0], 0);
            }
        }
    }

    /// The partitions a call's program touches, and whether every access to another
    /// partition than the home one has its key known up front (what the deterministic
    /// planners, Calvin's and Q-Store's, need).
    fn partitions_touched(t: &Tpcc, call: &ProcCall, home: PartitionId) -> (usize, bool) {
        let program = t.catalog().program(call).unwrap();
        let mut touched: Vec<PartitionId> = program
            .accesses
            .iter()
            .map(|a| t.pmap.partition_of(a.table, a.key))
            .collect();
        let planned = program
            .accesses
            .iter()
            .all(|a| a.key_dep.is_none() || t.pmap.partition_of(a.table, a.key) == home);
        touched.sort();
        touched.dedup();
        (touched.len(), planned)
    }

    /// LEAP's figure 9a: the share of distributed transactions as the remote share per access
    /// grows (one warehouse per partition, as there). A New-Order of n lines is distributed
    /// with probability 1 - (1 - r)^n, n uniform in 5..=15; a Payment with probability r.
    #[test]
    fn the_distributed_share_grows_with_the_remote_share_as_in_leap_figure_9a() {
        let expected_new_order = |r: f64| {
            let n = (MIN_OL_CNT..=MAX_OL_CNT).map(|n| 1.0 - (1.0 - r).powi(n as i32));
            n.sum::<f64>() / (MAX_OL_CNT - MIN_OL_CNT + 1) as f64
        };
        for (r, tolerance) in [(0.0, 0.0), (0.01, 0.01), (0.1, 0.02), (0.5, 0.02)] {
            let t = Tpcc::new(&remote_config(4, 1, r)).unwrap();
            let home = PartitionId(1);
            let mut g = t.generator(3, home);
            // [New-Order, Payment]: [transactions, distributed ones].
            let mut count = [[0u32; 2]; 2];
            for _ in 0..10_000 {
                let call = g.next_txn().call;
                let (touched, planned) = partitions_touched(&t, &call, home);
                assert!(planned, "r {r}: {call:?}");
                let c = &mut count[(call.proc == t.procs.payment) as usize];
                c[0] += 1;
                c[1] += (touched > 1) as u32;
            }
            let share = |[n, distributed]: [u32; 2]| distributed as f64 / n as f64;
            let (new_order, payment) = (share(count[0]), share(count[1]));
            let all = (count[0][1] + count[1][1]) as f64 / 10_000.0;
            eprintln!(
                "r = {r}: distributed: New-Order {new_order:.3} (expected {:.3}), Payment \
                 {payment:.3}, both at 50/50 {all:.3}",
                expected_new_order(r)
            );
            assert!(
                (new_order - expected_new_order(r)).abs() <= tolerance,
                "r {r}"
            );
            assert!((payment - r).abs() <= 2.0 * tolerance, "r {r}: {payment}");
            assert!(
                (all - (expected_new_order(r) + r) / 2.0).abs() <= tolerance,
                "r {r}"
            );
        }
        // The paper's points: 1% -> about 10%, 10% -> about 63%, 50% -> nearly 100% of the
        // New-Orders (its counts match the New-Orders').
        assert!((expected_new_order(0.01) - 0.095).abs() < 0.001);
        assert!((expected_new_order(0.1) - 0.632).abs() < 0.001);
        assert!(expected_new_order(0.5) > 0.99);
    }

    /// New-Orders and Payments with remote accesses, run serially over three partitions, keep
    /// the consistency conditions; every committed remote line counts in its STOCK row's
    /// S_REMOTE_CNT, and every committed remote Payment's HISTORY row names a customer of
    /// another partition.
    #[test]
    fn remote_accesses_run_and_keep_the_consistency_conditions() {
        let t = Tpcc::new(&remote_config(3, 1, 0.3)).unwrap();
        let k = *t.keys();
        let mut m = MemStore::loaded(&t, 0..3);
        let remote_cnt = |m: &MemStore| -> i64 {
            m.rows(STOCK)
                .map(|(_, r)| S_REMOTE_CNT.get_i32(r) as i64)
                .sum()
        };
        let (stock_before, history_before) = (remote_cnt(&m), m.len(HISTORY));
        let cat = t.catalog();
        let (mut remote_lines, mut remote_payments, mut distributed) = (0i64, 0, 0);
        for home in 0..3 {
            let mut g = t.generator(home, PartitionId(home));
            for _ in 0..400 {
                let call = g.next_txn().call;
                let a = int_args(&call);
                let remote = |w: u32| k.partition_of_warehouse(w) != PartitionId(home);
                let (lines, payment) = match call.proc == t.procs.payment {
                    true => (0, remote(a[2]) as u32),
                    false => (a[4..].chunks(3).filter(|l| remote(l[1])).count() as i64, 0),
                };
                distributed += (lines > 0 || payment > 0) as u32;
                if m.execute(&cat, &call).is_some() {
                    remote_lines += lines;
                    remote_payments += payment;
                }
            }
        }
        assert!(distributed > 500, "{distributed} of 1200 distributed");
        assert!(remote_lines > 1_000 && remote_payments > 100);
        assert_eq!(remote_cnt(&m) - stock_before, remote_lines);
        let history: Vec<_> = m.rows(HISTORY).map(|(_, r)| r.to_vec()).collect();
        let remote_history = history.iter().filter(|r| {
            k.partition_of_warehouse(H_C_W_ID.get_u32(r))
                != k.partition_of_warehouse(H_W_ID.get_u32(r))
        });
        assert_eq!(remote_history.count(), remote_payments as usize);
        assert!(history.len() > history_before);
        assert!(m
            .check_final(&t)
            .unwrap()
            .unwrap()
            .contains("hold in all 30"));
    }

    #[test]
    fn the_stream_follows_the_mix_and_the_remote_fractions() {
        let mut c = config(4, 4_000);
        c.workload.tpcc.payment_fraction = 0.4;
        c.workload.tpcc.order_status_fraction = 0.2;
        let t = Tpcc::new(&c).unwrap();
        let k = *t.keys();
        let mut g = t.generator(7, PartitionId(2));
        let (mut payments, mut remote_payments, mut remote_orders, mut rollbacks) = (0, 0, 0, 0);
        let mut statuses = 0;
        let n = 4_000;
        let first: Vec<_> = (0..n).map(|_| g.next_txn()).collect();
        for c in &first {
            let a: Vec<u32> = c
                .call
                .args
                .iter()
                .map(|v| v.as_int().unwrap() as u32)
                .collect();
            assert_eq!(
                k.partition_of_warehouse(a[0]),
                PartitionId(2),
                "home warehouse"
            );
            if c.call.proc == t.procs.payment {
                payments += 1;
                remote_payments += (k.partition_of_warehouse(a[2]) != PartitionId(2)) as u32;
            } else if c.call.proc == t.procs.order_status {
                statuses += 1;
                assert_eq!(a.len(), 4);
            } else {
                let lines = &a[4..];
                assert!((5..=15).contains(&(lines.len() / 3)));
                let supply = lines.chunks(3).map(|l| k.partition_of_warehouse(l[1]));
                remote_orders += supply.filter(|&p| p != PartitionId(2)).count().min(1) as u32;
                rollbacks += (lines[lines.len() - 3] == ITEMS + 1) as u32;
            }
        }
        let orders = n - payments - statuses;
        let share = |x: u32, of: u32| x as f64 / of as f64;
        assert!((share(payments, n) - 0.4).abs() < 0.04, "{payments}");
        assert!((share(statuses, n) - 0.2).abs() < 0.03, "{statuses}");
        assert!((share(remote_payments, payments) - 0.5).abs() < 0.05);
        assert!((share(remote_orders, orders) - 0.5).abs() < 0.05);
        assert!((5..=45).contains(&rollbacks), "{rollbacks} of {orders}");
        let mut again = t.generator(7, PartitionId(2));
        assert!(
            first.iter().all(|c| *c == again.next_txn()),
            "same seed, same stream"
        );
    }
}
