//! `--workload tpcc`: the catalog, the clients' transaction stream and the consistency
//! conditions checked after a run.
//!
//! Each client belongs to a home partition and, for each transaction, picks one of its
//! warehouses and a district uniformly, as a terminal of that district would (there is no
//! keying or thinking time: a throughput benchmark, as the papers run it). Inputs follow
//! clauses 2.4.1 and 2.5.1; which warehouses are remote follows `TpccConfig`.
//!
//! Only the New-Order + Payment mix runs so far; `mix = "standard"` is refused with a clear
//! error until Delivery, Order-Status and Stock-Level exist.

use super::keys::{TpccKeys, CUSTOMERS, DISTRICTS, ITEMS, LAST_NAMES, MAX_OL_CNT};
use super::load::LOAD_DATE;
use super::procs::{self, LastNameChoices, MIN_OL_CNT};
use super::random::{nurand, uniform, NuRandC, A_C_ID, A_C_LAST, A_OL_I_ID};
use super::schema::*;
use super::TpccData;
use crate::{ScanFn, Tally, TxnCall, TxnGenerator, Workload};
use qstore_core::config::{TpccConfig, TpccMix};
use qstore_core::partition::PartitionMap;
use qstore_core::rng::Rng;
use qstore_core::txn::{Catalog, ProcCall, ProcId, RowLoader, Value};
use qstore_core::{ConfigError, PartitionId, QError, RunConfig};
use rand::Rng as _;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// Mixed into the clients' stream numbers, so that TPC-C's inputs are not another
/// workload's for the same seed.
const CLIENT_STREAMS: u64 = 0x7470_6363_636c_6e74;

pub struct Tpcc {
    cfg: TpccConfig,
    data: TpccData,
    seed: u64,
    pmap: PartitionMap,
    catalog: Arc<Catalog>,
    new_order: ProcId,
    payment: ProcId,
}

impl Tpcc {
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = run.workload.tpcc.clone();
        let data = TpccData::new(run)?;
        if cfg.mix == TpccMix::Standard {
            return Err(ConfigError::new(
                "workload.tpcc.mix",
                "standard",
                "the standard mix needs Delivery, Order-Status and Stock-Level, which qstore \
                 does not run yet; use neworder-payment (--tpcc-mix neworder-payment)",
            ));
        }
        let mut catalog = Catalog::default();
        for schema in data.schemas() {
            catalog.add_table(schema);
        }
        let choices = Arc::new(LastNameChoices::new(&data));
        let (new_order, payment) = procs::register(&mut catalog, *data.keys(), choices);
        let pmap = PartitionMap::new(run.cluster.nodes, run.cluster.partitioning, &catalog.tables);
        Ok(Tpcc {
            cfg,
            data,
            seed: run.seed,
            pmap,
            catalog: Arc::new(catalog),
            new_order,
            payment,
        })
    }

    fn keys(&self) -> &TpccKeys {
        self.data.keys()
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
            new_order: self.new_order,
            payment: self.payment,
            date: LOAD_DATE as u32,
        })
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
            "tpcc: consistency conditions 1-4 hold in all {districts} districts ({} orders, {} \
             order lines, {} new orders, {} history rows)",
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
}

/// Conditions 1-4 of clause 3.3.2 over the rows `scan` visits, which hold whole warehouses
/// (one partition's, or all): per warehouse W_YTD = sum(D_YTD); per district D_NEXT_O_ID - 1
/// = max(O_ID) = max(NO_O_ID), the NEW-ORDER rows are max(NO_O_ID) - min(NO_O_ID) + 1, and
/// sum(O_OL_CNT) = the ORDER-LINE rows. Also what makes sure no insert was lost: each
/// district's D_ORDER_LINES and D_NEXT_H_ID - 1 count its ORDER-LINE and HISTORY rows.
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
    scan(ORDER, &mut |key, row| {
        let (w, d, o) = k.decode_order(key);
        let f = districts.entry((w, d)).or_default();
        f.max_o_id = f.max_o_id.max(o);
        f.ol_cnt_sum += O_OL_CNT.get_i32(row) as u64;
        t.add("orders", 1);
    });
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
    new_order: ProcId,
    payment: ProcId,
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
            let supply_w = if remote_line == Some(ol) {
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
                proc: self.new_order,
                args,
            },
            ops: 5 + 3 * ol_cnt,
        }
    }

    fn payment_call(&mut self, w: u32, d: u32) -> TxnCall {
        let (c_w, c_d) = if self.multi_partition() {
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
        let amount = uniform(&mut self.rng, 100, 500_000);
        let args = [w, d, c_w, c_d, by_name as u32, who, amount, self.date];
        TxnCall {
            call: ProcCall {
                proc: self.payment,
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
        if self.chance(self.cfg.payment_fraction) {
            self.payment_call(w, d)
        } else {
            self.new_order_call(w, d)
        }
    }
}
