//! New-Order and Payment (clauses 2.4 and 2.5) as stored procedures: their arguments, the
//! programs they build and the step functions those run.
//!
//! **New-Order** `[w, d, c, entry_d, (i_id, supply_w, quantity) × ol_cnt]`: reads each line's
//! ITEM (the home partition's copy, or where ITEM is partitioned the item's partition's; an
//! unused item id, which the client sends for 1% of orders, is missing and rolls the order
//! back as a logic abort), WAREHOUSE and CUSTOMER;
//! takes the order id from DISTRICT (D_NEXT_O_ID), updates each line's STOCK, and inserts
//! ORDER, NEW-ORDER and the ORDER-LINEs under keys derived from the order id.
//!
//! **Payment** `[w, d, c_w, c_d, by_name, c_id or last-name number, amount, date]`: adds
//! the amount to W_YTD and D_YTD, takes the HISTORY sequence number from DISTRICT
//! (D_NEXT_H_ID), pays from the CUSTOMER (rewriting C_DATA of bad-credit customers), and
//! inserts the HISTORY row under a key derived from the sequence number.
//!
//! **Order-Status** `[w, d, by_name, c_id or last-name number]` (clause 2.6): reads the
//! CUSTOMER, the id of its latest order from CUSTOMER_LAST_ORDER (which every New-Order
//! updates), and that ORDER and its lines under keys derived from the id. The lines are read
//! at all 15 line numbers an order can have; an order's missing ones read as absent (`Null`).
//! The answer: C_BALANCE, the order id, the order's entry date and carrier, and each line.
//!
//! **Stock-Level** (clause 2.8) runs as OLLP, since the STOCK rows it reads depend on the
//! lines of the district's last 20 orders. Its reconnaissance `[w, d, threshold]` reads
//! D_NEXT_O_ID and, under keys derived from it, the item of every line of orders
//! D_NEXT_O_ID - 20 .. D_NEXT_O_ID - 1. The transaction `[w, d, threshold, D_NEXT_O_ID, items]`
//! then checks that D_NEXT_O_ID is still the one the reconnaissance read (otherwise it aborts
//! with `OLLP_RESTART` and the client looks again) and reads the STOCK of each distinct item,
//! answering 1 for each below the threshold. The check suffices: the last 20 orders are those
//! below D_NEXT_O_ID, and no transaction changes an order line's item.
//!
//! **Delivery** (clause 2.7) runs as OLLP too: which order it delivers in each district, and
//! that order's customer and amount, are data. Its reconnaissance `[w, carrier, date]` reads,
//! per district, NEW_ORDER_HEAD (the oldest undelivered order id, an index only Delivery
//! writes) and, under keys derived from it, whether that NEW-ORDER row exists, the ORDER's
//! customer and line count, and every line's amount. The transaction `[w, carrier, date,
//! then per district: o, present, c, ol_cnt, amount]` advances each head only if it still
//! names `o` (otherwise `OLLP_RESTART`), deletes the NEW-ORDER row, sets O_CARRIER_ID and the
//! lines' OL_DELIVERY_D, and credits the customer; a district that had no new order is checked
//! to have none still (its D_NEXT_O_ID unmoved). The head check suffices: an order's customer,
//! lines and amounts never change, and only Delivery removes new orders.
//!
//! A customer chosen by last name is looked up when the program is built, in the
//! CUSTOMER_BY_LAST_NAME index, which TPC-C never changes: this is OLLP's reconnaissance
//! step, and since the index is immutable its guess is never wrong, so no transaction ever
//! restarts for it. Each node keeps the index's choices in memory (about 2 bytes per
//! customer), computed from the seed exactly as the load builds the table.
//!
//! Tables run out of room before the run does only by configuration: the district refuses
//! (a logic abort naming the setting) an order when ORDER or its share of ORDER-LINE is
//! full, and a payment when its HISTORY is, so no row is ever lost.

use super::keys::{TpccKeys, CUSTOMERS, DISTRICTS, ITEM_BITS, LAST_NAMES, MAX_OL_CNT};
use super::schema::*;
use qstore_core::config::TpccConfig;
use qstore_core::txn::{
    Access, AccessKind, Catalog, Inputs, KeyDep, LogicAbort, ProcId, Procedure, Program, RowRef,
    StepId, Value, OLLP_RESTART,
};
use qstore_core::{Key, PartitionId, TableId};
use std::sync::Arc;

pub const NEW_ORDER_PROC: &str = "tpcc_new_order";
pub const PAYMENT_PROC: &str = "tpcc_payment";
pub const ORDER_STATUS_PROC: &str = "tpcc_order_status";
pub const STOCK_LEVEL_RECON_PROC: &str = "tpcc_stock_level_recon";
pub const STOCK_LEVEL_PROC: &str = "tpcc_stock_level";
pub const DELIVERY_RECON_PROC: &str = "tpcc_delivery_recon";
pub const DELIVERY_PROC: &str = "tpcc_delivery";

/// Per district, the accesses of Delivery's reconnaissance: the head, the NEW-ORDER row, the
/// ORDER and every line number.
pub const DELIVERY_RECON_PER_DISTRICT: usize = 3 + MAX_OL_CNT as usize;
/// Per district, the arguments of Delivery after its first three: o, present, c, ol_cnt,
/// amount.
pub const DELIVERY_ARGS_PER_DISTRICT: usize = 5;

/// Orders Stock-Level looks back over (clause 2.8.2.2).
pub const STOCK_LEVEL_ORDERS: u32 = 20;
/// Lines Stock-Level's reconnaissance reads: every line number of each of those orders.
pub const STOCK_LEVEL_LINES: u32 = STOCK_LEVEL_ORDERS * MAX_OL_CNT;
/// Stock-Level's threshold (clause 2.8.1.2).
pub const STOCK_LEVEL_THRESHOLD: [u32; 2] = [10, 20];

/// Arguments of New-Order before its lines.
pub const NEW_ORDER_FIXED_ARGS: usize = 4;
/// Lines of an order (clause 2.4.1.3).
pub const MIN_OL_CNT: u32 = 5;

/// Why the district refused an order or a payment: the pre-sized tables are full.
const ORDERS_FULL: LogicAbort = LogicAbort(
    "the district's ORDER or ORDER-LINE table is full: raise workload.tpcc.max_orders_per_district",
);
const HISTORY_FULL: LogicAbort =
    LogicAbort("the district's HISTORY table is full: raise workload.tpcc.max_orders_per_district");
const BAD_ARGUMENT: LogicAbort = LogicAbort("malformed step argument");

/// The customer each last name picks, per district: `chosen[(w * 10 + d - 1) * 1000 + name]`.
pub struct LastNameChoices {
    chosen: Vec<u16>,
}

impl LastNameChoices {
    pub fn new(data: &super::TpccData) -> Self {
        let warehouses = data.keys().warehouses();
        let chosen = (0..warehouses)
            .flat_map(|w| (1..=DISTRICTS).map(move |d| (w, d)))
            .flat_map(|(w, d)| data.chosen_by_last_name(w, d))
            .collect();
        LastNameChoices { chosen }
    }

    fn customer(&self, w: u32, d: u32, name: u32) -> Option<u32> {
        let at = ((w * DISTRICTS + d - 1) * LAST_NAMES + name) as usize;
        self.chosen.get(at).map(|&c| c as u32).filter(|&c| c > 0)
    }

    /// The customer of district (w, d) that argument `i` names: a C_ID, or (`by_name`) a
    /// last-name number, looked up here (OLLP's reconnaissance, never wrong: see above).
    fn pick(&self, args: &[Value], i: usize, by_name: bool, w: u32, d: u32) -> Result<u32, String> {
        if !by_name {
            return arg_u32(args, i, "C_ID", 1, CUSTOMERS);
        }
        let name = arg_u32(args, i, "C_LAST number", 0, LAST_NAMES - 1)?;
        self.customer(w, d, name)
            .ok_or_else(|| format!("no customer of district ({w}, {d}) has last name {name}"))
    }
}

/// The step ids of both procedures.
#[derive(Clone, Copy)]
struct Steps {
    read_item: StepId,
    read_tax: StepId,
    next_order: StepId,
    read_discount: StepId,
    insert_order: StepId,
    insert_new_order: StepId,
    update_stock: StepId,
    insert_order_line: StepId,
    pay_warehouse: StepId,
    pay_district: StepId,
    pay_customer: StepId,
    insert_history: StepId,
    record_last_order: StepId,
    status_customer: StepId,
    last_order: StepId,
    status_order: StepId,
    status_line: StepId,
    next_order_id: StepId,
    line_item: StepId,
    same_next_order: StepId,
    low_stock: StepId,
    head: StepId,
    new_order_present: StepId,
    order_customer: StepId,
    line_amount: StepId,
    advance_head: StepId,
    delete_new_order: StepId,
    set_carrier: StepId,
    set_delivery_date: StepId,
    credit_delivery: StepId,
}

/// The procedures [`register`] adds.
#[derive(Clone, Copy)]
pub struct Procs {
    pub new_order: ProcId,
    pub payment: ProcId,
    pub order_status: ProcId,
    pub stock_level_recon: ProcId,
    pub stock_level: ProcId,
    pub delivery_recon: ProcId,
    pub delivery: ProcId,
}

/// Registers the steps and the procedures in `cat`.
pub fn register(cat: &mut Catalog, keys: TpccKeys, choices: Arc<LastNameChoices>) -> Procs {
    let s = &mut cat.steps;
    let steps = Steps {
        read_item: s.register("tpcc_read_item", read_item),
        read_tax: s.register("tpcc_read_tax", read_tax),
        next_order: s.register("tpcc_next_order", next_order),
        read_discount: s.register("tpcc_read_discount", read_discount),
        insert_order: s.register("tpcc_insert_order", insert_order),
        insert_new_order: s.register("tpcc_insert_new_order", insert_new_order),
        update_stock: s.register("tpcc_update_stock", update_stock),
        insert_order_line: s.register("tpcc_insert_order_line", insert_order_line),
        pay_warehouse: s.register("tpcc_pay_warehouse", pay_warehouse),
        pay_district: s.register("tpcc_pay_district", pay_district),
        pay_customer: s.register("tpcc_pay_customer", pay_customer),
        insert_history: s.register("tpcc_insert_history", insert_history),
        record_last_order: s.register("tpcc_record_last_order", record_last_order),
        status_customer: s.register("tpcc_status_customer", status_customer),
        last_order: s.register("tpcc_last_order", last_order),
        status_order: s.register("tpcc_status_order", status_order),
        status_line: s.register("tpcc_status_line", status_line),
        next_order_id: s.register("tpcc_next_order_id", next_order_id),
        line_item: s.register("tpcc_line_item", line_item),
        same_next_order: s.register("tpcc_same_next_order", same_next_order),
        low_stock: s.register("tpcc_low_stock", low_stock),
        head: s.register("tpcc_head", head),
        new_order_present: s.register("tpcc_new_order_present", new_order_present),
        order_customer: s.register("tpcc_order_customer", order_customer),
        line_amount: s.register("tpcc_line_amount", line_amount),
        advance_head: s.register("tpcc_advance_head", advance_head),
        delete_new_order: s.register("tpcc_delete_new_order", delete_new_order),
        set_carrier: s.register("tpcc_set_carrier", set_carrier),
        set_delivery_date: s.register("tpcc_set_delivery_date", set_delivery_date),
        credit_delivery: s.register("tpcc_credit_delivery", credit_delivery),
    };
    let ctx = Arc::new(Ctx {
        keys,
        steps,
        choices,
    });
    Procs {
        new_order: cat.add_procedure(Arc::new(NewOrder(ctx.clone()))),
        payment: cat.add_procedure(Arc::new(Payment(ctx.clone()))),
        order_status: cat.add_procedure(Arc::new(OrderStatus(ctx.clone()))),
        stock_level_recon: cat.add_procedure(Arc::new(StockLevelRecon(ctx.clone()))),
        stock_level: cat.add_procedure(Arc::new(StockLevel(ctx.clone()))),
        delivery_recon: cat.add_procedure(Arc::new(DeliveryRecon(ctx.clone()))),
        delivery: cat.add_procedure(Arc::new(Delivery(ctx))),
    }
}

/// What every procedure builds its programs with.
struct Ctx {
    keys: TpccKeys,
    steps: Steps,
    choices: Arc<LastNameChoices>,
}

/// Refuses `args` unless there are `n` of them, showing the procedure's `usage`.
fn arity(args: &[Value], n: usize, usage: &str) -> Result<(), String> {
    match args.len() == n {
        true => Ok(()),
        false => Err(format!("{usage}; got {}", args.len())),
    }
}

// Arguments and outputs that carry several ids travel as little-endian `u32`s.

fn pack(ids: &[u32]) -> Value {
    Value::Bytes(ids.iter().flat_map(|v| v.to_le_bytes()).collect())
}

fn unpack<const N: usize>(v: &Value) -> Result<[u32; N], LogicAbort> {
    let Value::Bytes(b) = v else {
        return Err(BAD_ARGUMENT);
    };
    if b.len() != 4 * N {
        return Err(BAD_ARGUMENT);
    }
    let mut out = [0u32; N];
    for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
        *o = u32::from_le_bytes(c.try_into().expect("chunks of 4"));
    }
    Ok(out)
}

fn int(v: &Value) -> Result<i64, LogicAbort> {
    v.as_int().ok_or(BAD_ARGUMENT)
}

fn arg_int(args: &[Value], i: usize, what: &str) -> Result<i64, String> {
    match args.get(i) {
        Some(Value::Int(v)) => Ok(*v),
        Some(other) => Err(format!(
            "argument {i} ({what}) must be an integer, not {other:?}"
        )),
        None => Err(format!("argument {i} ({what}) is missing")),
    }
}

fn arg_u32(args: &[Value], i: usize, what: &'static str, lo: u32, hi: u32) -> Result<u32, String> {
    let v = arg_int(args, i, what)?;
    TpccKeys::check_id(what, v, lo, hi).map_err(|e| e.to_string())
}

fn write(row: RowRef<'_>) -> Result<&mut [u8], LogicAbort> {
    match row {
        RowRef::Write(r) => Ok(r),
        RowRef::Read(_) => Err(LogicAbort("a writing step got a read-only row")),
    }
}

fn access(table: TableId, key: Key, kind: AccessKind, step: StepId, arg: Value) -> Access {
    Access::plain(table, key, kind, step, arg, Vec::new())
}

/// `a`, declared able to abort the transaction (its failure is a logic abort).
fn abortable(a: Access) -> Access {
    Access {
        may_abort: true,
        ..a
    }
}

/// An insert whose key is `base + scale * output of access dep`.
#[allow(clippy::too_many_arguments)]
fn derived_insert(
    table: TableId,
    base: Key,
    dep: u16,
    scale: u32,
    limit: u32,
    step: StepId,
    arg: Value,
    deps: Vec<u16>,
) -> Access {
    debug_assert!(deps.contains(&dep));
    Access {
        deps,
        key_dep: Some(KeyDep {
            dep,
            scale,
            limit,
            back: 0,
            output: false,
        }),
        ..access(table, base, AccessKind::Insert, step, arg)
    }
}

/// A read of key `base + scale * (output of access dep - back)`, which outputs what `step`
/// returns (so the program must stay within one partition: see `KeyDep::output`).
fn derived_read(
    table: TableId,
    base: Key,
    dep: u16,
    [scale, limit, back]: [u32; 3],
    step: StepId,
) -> Access {
    Access {
        deps: vec![dep],
        key_dep: Some(KeyDep {
            dep,
            scale,
            limit,
            back,
            output: true,
        }),
        ..access(table, base, AccessKind::Read, step, Value::Null)
    }
}

/// Reads of every line number of the order of district `wd` whose id is the output of
/// access `dep` minus `back` (below `limit`): an order's missing lines read as `Null`.
fn line_reads(
    k: &TpccKeys,
    (w, d): (u32, u32),
    dep: u16,
    [limit, back]: [u32; 2],
    step: StepId,
) -> impl Iterator<Item = Access> + '_ {
    let line = [TpccKeys::ORDER_LINE_SCALE, limit, back];
    (1..=MAX_OL_CNT)
        .map(move |ol| derived_read(ORDER_LINE, k.order_line_base(w, d, ol), dep, line, step))
}

/// An item id as a line may carry it: a real one, or the unused one of a rolled-back order.
const UNUSED_ITEM: u32 = super::keys::ITEMS + 1;

struct NewOrder(Arc<Ctx>);

/// One line of an order.
struct Line {
    item: u32,
    supply_w: u32,
    quantity: u32,
}

impl NewOrder {
    fn lines(&self, args: &[Value]) -> Result<Vec<Line>, String> {
        let rest = &args[NEW_ORDER_FIXED_ARGS.min(args.len())..];
        let n = rest.len() / 3;
        if !rest.len().is_multiple_of(3)
            || !(MIN_OL_CNT as usize..=MAX_OL_CNT as usize).contains(&n)
        {
            return Err(format!(
                "New-Order takes {NEW_ORDER_FIXED_ARGS} arguments and then {MIN_OL_CNT} to \
                 {MAX_OL_CNT} lines of 3 (item, supplying warehouse, quantity); got {} arguments",
                args.len()
            ));
        }
        let last_w = self.0.keys.warehouses() - 1;
        (0..n)
            .map(|l| {
                let at = NEW_ORDER_FIXED_ARGS + 3 * l;
                Ok(Line {
                    item: arg_u32(args, at, "OL_I_ID", 1, UNUSED_ITEM)?,
                    supply_w: arg_u32(args, at + 1, "OL_SUPPLY_W_ID", 0, last_w)?,
                    quantity: arg_u32(args, at + 2, "OL_QUANTITY", 1, 10)?,
                })
            })
            .collect()
    }
}

impl Procedure for NewOrder {
    fn name(&self) -> &'static str {
        NEW_ORDER_PROC
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let Ctx {
            keys: k, steps: s, ..
        } = &*self.0;
        let w = arg_u32(args, 0, "W_ID", 0, k.warehouses() - 1)?;
        let d = arg_u32(args, 1, "D_ID", 1, DISTRICTS)?;
        let c = arg_u32(args, 2, "C_ID", 1, CUSTOMERS)?;
        let entry_d = arg_u32(args, 3, "O_ENTRY_D", 0, u32::MAX)?;
        let lines = self.lines(args)?;
        let ol_cnt = lines.len() as u32;
        let home = k.partition_of_warehouse(w);
        let all_local = lines.iter().all(|l| l.supply_w == w) as u32;
        let mut a = Vec::with_capacity(6 + 3 * lines.len());
        // The items first: an unused one aborts the order before it takes any lock.
        for l in &lines {
            a.push(abortable(access(
                ITEM,
                item_key(k.item_home(home, l.item), l.item),
                AccessKind::Read,
                s.read_item,
                Value::Null,
            )));
        }
        let at_w = a.len() as u16;
        a.push(access(
            WAREHOUSE,
            k.warehouse(w),
            AccessKind::Read,
            s.read_tax,
            Value::Null,
        ));
        let at_d = a.len() as u16;
        let limits = (k.max_orders() as i64) << 8 | ol_cnt as i64;
        a.push(abortable(access(
            DISTRICT,
            k.district(w, d),
            AccessKind::ReadModifyWrite,
            s.next_order,
            Value::Int(limits),
        )));
        a.push(access(
            CUSTOMER,
            k.customer(w, d, c),
            AccessKind::Read,
            s.read_discount,
            Value::Null,
        ));
        let limit = k.max_orders() + 1;
        a.push(derived_insert(
            ORDER,
            k.order_base(w, d),
            at_d,
            1,
            limit,
            s.insert_order,
            pack(&[w, d, c, ol_cnt, all_local, entry_d]),
            vec![at_d],
        ));
        a.push(derived_insert(
            NEW_ORDER,
            k.order_base(w, d),
            at_d,
            1,
            limit,
            s.insert_new_order,
            pack(&[w, d]),
            vec![at_d],
        ));
        a.push(Access {
            deps: vec![at_d],
            ..access(
                CUSTOMER_LAST_ORDER,
                k.customer(w, d, c),
                AccessKind::Write,
                s.record_last_order,
                Value::Null,
            )
        });
        for (j, l) in lines.iter().enumerate() {
            let remote = (l.supply_w != w) as i64;
            let stock_arg = l.quantity as i64 | (d as i64) << 8 | remote << 16;
            let at_s = a.len() as u16;
            a.push(access(
                STOCK,
                stock_key(l.supply_w, l.item),
                AccessKind::ReadModifyWrite,
                s.update_stock,
                Value::Int(stock_arg),
            ));
            let ol = j as u32 + 1;
            a.push(derived_insert(
                ORDER_LINE,
                k.order_line_base(w, d, ol),
                at_d,
                TpccKeys::ORDER_LINE_SCALE,
                limit,
                s.insert_order_line,
                pack(&[w, d, ol, l.item, l.supply_w, l.quantity]),
                vec![at_d, j as u16, at_s],
            ));
        }
        debug_assert!(at_w as usize == lines.len());
        Ok(Program { accesses: a })
    }
}

/// ITEM key of item `i` in partition `p`'s copy, for any id of the key's width (an unused
/// id is simply absent).
fn item_key(p: PartitionId, i: u32) -> Key {
    (p.0 as u64) << ITEM_BITS | i as u64
}

fn stock_key(w: u32, i: u32) -> Key {
    (w as u64) << ITEM_BITS | i as u64
}

struct Payment(Arc<Ctx>);

impl Procedure for Payment {
    fn name(&self) -> &'static str {
        PAYMENT_PROC
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let Ctx {
            keys: k,
            steps: s,
            choices,
        } = &*self.0;
        arity(
            args,
            8,
            "Payment takes 8 arguments (W_ID, D_ID, C_W_ID, C_D_ID, by last name 0/1, C_ID or \
             last-name number, H_AMOUNT in cents, H_DATE)",
        )?;
        let last_w = k.warehouses() - 1;
        let w = arg_u32(args, 0, "W_ID", 0, last_w)?;
        let d = arg_u32(args, 1, "D_ID", 1, DISTRICTS)?;
        let c_w = arg_u32(args, 2, "C_W_ID", 0, last_w)?;
        let c_d = arg_u32(args, 3, "C_D_ID", 1, DISTRICTS)?;
        let by_name = arg_u32(args, 4, "by last name", 0, 1)? == 1;
        let c = choices.pick(args, 5, by_name, c_w, c_d)?;
        let amount = arg_u32(args, 6, "H_AMOUNT", 100, 500_000)?;
        let date = arg_u32(args, 7, "H_DATE", 0, u32::MAX)?;
        let limits = (k.max_orders() as i64) << 32 | amount as i64;
        let pay_d = abortable(access(
            DISTRICT,
            k.district(w, d),
            AccessKind::ReadModifyWrite,
            s.pay_district,
            Value::Int(limits),
        ));
        let a = vec![
            access(
                WAREHOUSE,
                k.warehouse(w),
                AccessKind::ReadModifyWrite,
                s.pay_warehouse,
                Value::Int(amount as i64),
            ),
            pay_d,
            access(
                CUSTOMER,
                k.customer(c_w, c_d, c),
                AccessKind::ReadModifyWrite,
                s.pay_customer,
                pack(&[amount, c, c_d, c_w, d, w]),
            ),
            derived_insert(
                HISTORY,
                k.history_base(w, d, c),
                1,
                1,
                k.max_orders() + 1,
                s.insert_history,
                pack(&[c, c_d, c_w, d, w, amount, date]),
                vec![1, 0],
            ),
        ];
        Ok(Program { accesses: a })
    }
}

struct OrderStatus(Arc<Ctx>);

impl Procedure for OrderStatus {
    fn name(&self) -> &'static str {
        ORDER_STATUS_PROC
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let Ctx {
            keys: k,
            steps: s,
            choices,
        } = &*self.0;
        arity(
            args,
            4,
            "Order-Status takes 4 arguments (W_ID, D_ID, by last name 0/1, C_ID or last-name \
             number)",
        )?;
        let w = arg_u32(args, 0, "W_ID", 0, k.warehouses() - 1)?;
        let d = arg_u32(args, 1, "D_ID", 1, DISTRICTS)?;
        let by_name = arg_u32(args, 2, "by last name", 0, 1)? == 1;
        let c = choices.pick(args, 3, by_name, w, d)?;
        let customer = k.customer(w, d, c);
        let limit = k.max_orders() + 1;
        let mut a = Vec::with_capacity(3 + MAX_OL_CNT as usize);
        a.push(access(
            CUSTOMER,
            customer,
            AccessKind::Read,
            s.status_customer,
            Value::Null,
        ));
        a.push(access(
            CUSTOMER_LAST_ORDER,
            customer,
            AccessKind::Read,
            s.last_order,
            Value::Null,
        ));
        a.push(derived_read(
            ORDER,
            k.order_base(w, d),
            1,
            [1, limit, 0],
            s.status_order,
        ));
        a.extend(line_reads(k, (w, d), 1, [limit, 0], s.status_line));
        Ok(Program { accesses: a })
    }

    fn may_abort(&self) -> bool {
        false
    }
}

/// The (w, d, threshold) both Stock-Level procedures start with.
fn stock_level_args(k: &TpccKeys, args: &[Value]) -> Result<(u32, u32, u32), String> {
    let w = arg_u32(args, 0, "W_ID", 0, k.warehouses() - 1)?;
    let d = arg_u32(args, 1, "D_ID", 1, DISTRICTS)?;
    let [lo, hi] = STOCK_LEVEL_THRESHOLD;
    let threshold = arg_u32(args, 2, "threshold", lo, hi)?;
    Ok((w, d, threshold))
}

struct StockLevelRecon(Arc<Ctx>);

impl Procedure for StockLevelRecon {
    fn name(&self) -> &'static str {
        STOCK_LEVEL_RECON_PROC
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let Ctx {
            keys: k, steps: s, ..
        } = &*self.0;
        arity(
            args,
            3,
            "Stock-Level's reconnaissance takes 3 arguments (W_ID, D_ID, threshold)",
        )?;
        let (w, d, _) = stock_level_args(k, args)?;
        let mut a = Vec::with_capacity(1 + STOCK_LEVEL_LINES as usize);
        a.push(access(
            DISTRICT,
            k.district(w, d),
            AccessKind::Read,
            s.next_order_id,
            Value::Null,
        ));
        // D_NEXT_O_ID is at most max_orders + 1.
        let limit = k.max_orders() + 2;
        for back in 1..=STOCK_LEVEL_ORDERS {
            a.extend(line_reads(k, (w, d), 0, [limit, back], s.line_item));
        }
        Ok(Program { accesses: a })
    }

    fn may_abort(&self) -> bool {
        false
    }
}

struct StockLevel(Arc<Ctx>);

impl Procedure for StockLevel {
    fn name(&self) -> &'static str {
        STOCK_LEVEL_PROC
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let Ctx {
            keys: k, steps: s, ..
        } = &*self.0;
        let items = args.len().saturating_sub(4);
        if args.len() < 4 || items > STOCK_LEVEL_LINES as usize {
            return Err(format!(
                "Stock-Level takes 4 arguments (W_ID, D_ID, threshold, D_NEXT_O_ID as its \
                 reconnaissance read it) and then up to {STOCK_LEVEL_LINES} item ids; got {}",
                args.len()
            ));
        }
        let (w, d, threshold) = stock_level_args(k, args)?;
        let next = arg_u32(args, 3, "D_NEXT_O_ID", 1, k.max_orders() + 1)?;
        let mut a = Vec::with_capacity(1 + items);
        a.push(abortable(access(
            DISTRICT,
            k.district(w, d),
            AccessKind::Read,
            s.same_next_order,
            Value::Int(next as i64),
        )));
        for i in 4..args.len() {
            let item = arg_u32(args, i, "OL_I_ID", 1, super::keys::ITEMS)?;
            a.push(access(
                STOCK,
                stock_key(w, item),
                AccessKind::Read,
                s.low_stock,
                Value::Int(threshold as i64),
            ));
        }
        Ok(Program { accesses: a })
    }
}

/// The (w, carrier, date) both Delivery procedures start with.
fn delivery_args(k: &TpccKeys, args: &[Value]) -> Result<(u32, u32, u32), String> {
    let w = arg_u32(args, 0, "W_ID", 0, k.warehouses() - 1)?;
    let carrier = arg_u32(args, 1, "O_CARRIER_ID", 1, 10)?;
    let date = arg_u32(args, 2, "OL_DELIVERY_D", 0, u32::MAX)?;
    Ok((w, carrier, date))
}

struct DeliveryRecon(Arc<Ctx>);

impl Procedure for DeliveryRecon {
    fn name(&self) -> &'static str {
        DELIVERY_RECON_PROC
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let Ctx {
            keys: k, steps: s, ..
        } = &*self.0;
        arity(
            args,
            3,
            "Delivery's reconnaissance takes 3 arguments (W_ID, O_CARRIER_ID, OL_DELIVERY_D)",
        )?;
        let (w, _, _) = delivery_args(k, args)?;
        // The head is at most D_NEXT_O_ID, itself at most max_orders + 1.
        let limit = k.max_orders() + 2;
        let mut a = Vec::with_capacity(DISTRICTS as usize * DELIVERY_RECON_PER_DISTRICT);
        for d in 1..=DISTRICTS {
            let at = a.len() as u16;
            a.push(access(
                NEW_ORDER_HEAD,
                k.district(w, d),
                AccessKind::Read,
                s.head,
                Value::Null,
            ));
            let order = [1, limit, 0];
            a.push(derived_read(
                NEW_ORDER,
                k.order_base(w, d),
                at,
                order,
                s.new_order_present,
            ));
            a.push(derived_read(
                ORDER,
                k.order_base(w, d),
                at,
                order,
                s.order_customer,
            ));
            a.extend(line_reads(k, (w, d), at, [limit, 0], s.line_amount));
        }
        Ok(Program { accesses: a })
    }

    fn may_abort(&self) -> bool {
        false
    }
}

struct Delivery(Arc<Ctx>);

impl Procedure for Delivery {
    fn name(&self) -> &'static str {
        DELIVERY_PROC
    }

    fn program(&self, args: &[Value]) -> Result<Program, String> {
        let Ctx {
            keys: k, steps: s, ..
        } = &*self.0;
        let n = 3 + DISTRICTS as usize * DELIVERY_ARGS_PER_DISTRICT;
        arity(
            args,
            n,
            &format!(
                "Delivery takes {n} arguments (W_ID, O_CARRIER_ID, OL_DELIVERY_D, then per \
                 district: the order id, 1 if it is undelivered, its C_ID, O_OL_CNT and total \
                 amount in cents, as its reconnaissance read them)"
            ),
        )?;
        let (w, carrier, date) = delivery_args(k, args)?;
        let limit = k.max_orders() + 1;
        let mut a = Vec::new();
        for d in 1..=DISTRICTS {
            let at = 3 + (d as usize - 1) * DELIVERY_ARGS_PER_DISTRICT;
            let o = arg_u32(args, at, "O_ID", 1, k.max_orders() + 1)?;
            if arg_u32(args, at + 1, "undelivered", 0, 1)? == 0 {
                // Nothing to deliver here, if still so: no order since (the head the
                // reconnaissance read was D_NEXT_O_ID).
                a.push(abortable(access(
                    DISTRICT,
                    k.district(w, d),
                    AccessKind::Read,
                    s.same_next_order,
                    Value::Int(o as i64),
                )));
                continue;
            }
            let c = arg_u32(args, at + 2, "C_ID", 1, CUSTOMERS)?;
            let ol_cnt = arg_u32(args, at + 3, "O_OL_CNT", 1, MAX_OL_CNT)?;
            let amount = arg_int(args, at + 4, "amount")?;
            let h = a.len() as u16;
            a.push(abortable(access(
                NEW_ORDER_HEAD,
                k.district(w, d),
                AccessKind::ReadModifyWrite,
                s.advance_head,
                Value::Int(o as i64),
            )));
            let order = k.order_base(w, d);
            let by_head = |table, base, scale, kind, step, arg| Access {
                deps: vec![h],
                key_dep: Some(KeyDep {
                    dep: h,
                    scale,
                    limit,
                    back: 0,
                    output: false,
                }),
                ..access(table, base, kind, step, arg)
            };
            let carrier = Value::Int(carrier as i64);
            a.push(by_head(
                NEW_ORDER,
                order,
                1,
                AccessKind::Delete,
                s.delete_new_order,
                Value::Null,
            ));
            a.push(by_head(
                ORDER,
                order,
                1,
                AccessKind::ReadModifyWrite,
                s.set_carrier,
                carrier,
            ));
            for ol in 1..=ol_cnt {
                a.push(by_head(
                    ORDER_LINE,
                    k.order_line_base(w, d, ol),
                    TpccKeys::ORDER_LINE_SCALE,
                    AccessKind::ReadModifyWrite,
                    s.set_delivery_date,
                    Value::Int(date as i64),
                ));
            }
            a.push(access(
                CUSTOMER,
                k.customer(w, d, c),
                AccessKind::ReadModifyWrite,
                s.credit_delivery,
                Value::Int(amount),
            ));
        }
        Ok(Program { accesses: a })
    }
}

// New-Order's steps.

fn read_item(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(I_PRICE.get_money(row.bytes())))
}

fn read_tax(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(W_TAX.get_i32(row.bytes()) as i64))
}

fn read_discount(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(C_DISCOUNT.get_i32(row.bytes()) as i64))
}

/// Takes the district's next order id (the output), if ORDER and the district's share of
/// ORDER-LINE have room: arg = max_orders << 8 | ol_cnt.
fn next_order(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let arg = int(arg)?;
    let (max_orders, ol_cnt) = ((arg >> 8) as u32, (arg & 0xff) as u32);
    let o = D_NEXT_O_ID.get_u32(row);
    let lines = D_ORDER_LINES.get_u32(row) as u64 + ol_cnt as u64;
    let room = max_orders as u64 * TpccConfig::ORDER_LINES_ROOM as u64;
    if o > max_orders || lines > room {
        return Err(ORDERS_FULL);
    }
    D_NEXT_O_ID.set_u32(row, o + 1);
    D_ORDER_LINES.set_u32(row, lines as u32);
    Ok(Value::Int(o as i64))
}

fn insert_order(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let [w, d, c, ol_cnt, all_local, entry_d] = unpack::<6>(arg)?;
    O_ID.set_u32(row, int(inputs.get(0))? as u32);
    O_D_ID.set_u32(row, d);
    O_W_ID.set_u32(row, w);
    O_C_ID.set_u32(row, c);
    O_CARRIER_ID.set_u32(row, 0);
    O_OL_CNT.set_i32(row, ol_cnt as i32);
    O_ALL_LOCAL.set_i32(row, all_local as i32);
    O_ENTRY_D.set_i64(row, entry_d as i64);
    Ok(Value::Null)
}

fn insert_new_order(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let [w, d] = unpack::<2>(arg)?;
    NO_O_ID.set_u32(row, int(inputs.get(0))? as u32);
    NO_D_ID.set_u32(row, d);
    NO_W_ID.set_u32(row, w);
    Ok(Value::Null)
}

/// Clause 2.4.2.2's stock update: arg = quantity | d << 8 | remote << 16. Outputs S_DIST_d.
fn update_stock(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let arg = int(arg)?;
    let (qty, d, remote) = (
        (arg & 0xff) as i32,
        ((arg >> 8) & 0xff) as usize,
        (arg >> 16) & 1,
    );
    let dist = S_DIST.get(d.wrapping_sub(1)).ok_or(BAD_ARGUMENT)?;
    let s_qty = S_QUANTITY.get_i32(row);
    let left = if s_qty >= qty + 10 {
        s_qty - qty
    } else {
        s_qty - qty + 91
    };
    S_QUANTITY.set_i32(row, left);
    S_YTD.set_i32(row, S_YTD.get_i32(row) + qty);
    S_ORDER_CNT.set_i32(row, S_ORDER_CNT.get_i32(row) + 1);
    S_REMOTE_CNT.set_i32(row, S_REMOTE_CNT.get_i32(row) + remote as i32);
    Ok(Value::Bytes(dist.raw(row).to_vec()))
}

fn insert_order_line(
    row: RowRef<'_>,
    arg: &Value,
    inputs: Inputs<'_>,
) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let [w, d, ol, item, supply_w, qty] = unpack::<6>(arg)?;
    let o = int(inputs.get(0))? as u32;
    let price = int(inputs.get(1))?;
    OL_O_ID.set_u32(row, o);
    OL_D_ID.set_u32(row, d);
    OL_W_ID.set_u32(row, w);
    OL_NUMBER.set_u32(row, ol);
    OL_I_ID.set_u32(row, item);
    OL_SUPPLY_W_ID.set_u32(row, supply_w);
    OL_QUANTITY.set_i32(row, qty as i32);
    OL_DELIVERY_D.set_i64(row, 0);
    OL_AMOUNT.set_money(row, qty as i64 * price);
    // The stock row's S_DIST_d (absent only if the stock access found no row: then blank).
    if let Value::Bytes(dist) = inputs.get(2) {
        let raw = OL_DIST_INFO.raw_mut(row);
        let n = dist.len().min(raw.len());
        raw[..n].copy_from_slice(&dist[..n]);
    }
    Ok(Value::Null)
}

/// CUSTOMER_LAST_ORDER of the ordering customer: the new order's id (the district's output).
fn record_last_order(row: RowRef<'_>, _: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    CO_O_ID.set_u32(row, int(inputs.get(0))? as u32);
    Ok(Value::Null)
}

// Payment's steps.

/// Adds the amount to W_YTD; outputs W_NAME (for H_DATA).
fn pay_warehouse(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    W_YTD.set_money(row, W_YTD.get_money(row) + int(arg)?);
    Ok(Value::Bytes(W_NAME.get_bytes(row).to_vec()))
}

/// Adds the amount to D_YTD and takes the next HISTORY sequence number, if HISTORY has room:
/// arg = max_orders << 32 | amount. Outputs the number (8 bytes, the derived key's offset)
/// followed by D_NAME.
fn pay_district(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let arg = int(arg)?;
    let (max, amount) = ((arg >> 32) as u32, arg & 0xffff_ffff);
    let h = D_NEXT_H_ID.get_u32(row);
    if h > max {
        return Err(HISTORY_FULL);
    }
    D_NEXT_H_ID.set_u32(row, h + 1);
    D_YTD.set_money(row, D_YTD.get_money(row) + amount);
    let mut out = (h as i64).to_le_bytes().to_vec();
    out.extend_from_slice(D_NAME.get_bytes(row));
    Ok(Value::Bytes(out))
}

/// Clause 2.5.2.2's customer update: arg = [amount, c, c_d, c_w, d, w]. Outputs C_BALANCE.
fn pay_customer(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let [amount, c, c_d, c_w, d, w] = unpack::<6>(arg)?;
    let amount = amount as i64;
    let balance = C_BALANCE.get_money(row) - amount;
    C_BALANCE.set_money(row, balance);
    C_YTD_PAYMENT.set_money(row, C_YTD_PAYMENT.get_money(row) + amount);
    C_PAYMENT_CNT.set_i32(row, C_PAYMENT_CNT.get_i32(row) + 1);
    if C_CREDIT.get_bytes(row) == b"BC" {
        let new = format!("{c} {c_d} {c_w} {d} {w} {amount} ");
        let old = C_DATA.get_bytes(row).to_vec();
        C_DATA
            .set_bytes_truncated(row, &[new.as_bytes(), &old])
            .map_err(|_| BAD_ARGUMENT)?;
    }
    Ok(Value::Int(balance))
}

/// The HISTORY row: arg = [c, c_d, c_w, d, w, amount, date]; inputs: the district's output
/// (sequence number, D_NAME) and W_NAME.
fn insert_history(row: RowRef<'_>, arg: &Value, inputs: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let [c, c_d, c_w, d, w, amount, date] = unpack::<7>(arg)?;
    H_C_ID.set_u32(row, c);
    H_C_D_ID.set_u32(row, c_d);
    H_C_W_ID.set_u32(row, c_w);
    H_D_ID.set_u32(row, d);
    H_W_ID.set_u32(row, w);
    H_DATE.set_i64(row, date as i64);
    H_AMOUNT.set_money(row, amount as i64);
    let (Value::Bytes(district), Value::Bytes(w_name)) = (inputs.get(0), inputs.get(1)) else {
        return Err(BAD_ARGUMENT);
    };
    let d_name = district.get(8..).unwrap_or_default();
    H_DATA
        .set_bytes_truncated(row, &[w_name, b"    ", d_name])
        .map_err(|_| BAD_ARGUMENT)?;
    Ok(Value::Null)
}

// Order-Status's steps.

/// Outputs C_BALANCE (the answer also has the customer's names, which the client knows).
fn status_customer(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(C_BALANCE.get_money(row.bytes())))
}

/// Outputs the id of the customer's latest order, the offset of the order's keys.
fn last_order(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(CO_O_ID.get_u32(row.bytes()) as i64))
}

/// What clause 2.6.2.2 shows of the order: [O_ENTRY_D, O_CARRIER_ID].
fn status_order(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let r = row.bytes();
    Ok(pack(&[
        O_ENTRY_D.get_i64(r) as u32,
        O_CARRIER_ID.get_u32(r),
    ]))
}

/// What clause 2.6.2.2 shows of an order line: [OL_I_ID, OL_SUPPLY_W_ID, OL_QUANTITY,
/// OL_AMOUNT in cents, OL_DELIVERY_D].
fn status_line(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let r = row.bytes();
    Ok(pack(&[
        OL_I_ID.get_u32(r),
        OL_SUPPLY_W_ID.get_u32(r),
        OL_QUANTITY.get_i32(r) as u32,
        OL_AMOUNT.get_money(r) as u32,
        OL_DELIVERY_D.get_i64(r) as u32,
    ]))
}

// Stock-Level's steps.

/// Outputs D_NEXT_O_ID, the offset of the reconnaissance's line keys.
fn next_order_id(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(D_NEXT_O_ID.get_u32(row.bytes()) as i64))
}

/// Outputs the line's OL_I_ID.
fn line_item(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(OL_I_ID.get_u32(row.bytes()) as i64))
}

/// OLLP's check: D_NEXT_O_ID is still `arg`, the one the reconnaissance read (Stock-Level:
/// the same last 20 orders; Delivery, for a district whose head was D_NEXT_O_ID: still no new
/// order).
fn same_next_order(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    match D_NEXT_O_ID.get_u32(row.bytes()) as i64 == int(arg)? {
        true => Ok(Value::Null),
        false => Err(OLLP_RESTART),
    }
}

/// 1 if the stock is below the threshold `arg`, else 0 (the client sums them).
fn low_stock(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(
        (S_QUANTITY.get_i32(row.bytes()) < int(arg)? as i32) as i64,
    ))
}

// Delivery's steps.

/// Outputs NOH_O_ID, the offset of the keys of the district's oldest undelivered order.
fn head(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(NOH_O_ID.get_u32(row.bytes()) as i64))
}

/// 1: the NEW-ORDER row is there (an absent one reads as `Null`).
fn new_order_present(_: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(1))
}

/// [O_C_ID, O_OL_CNT].
fn order_customer(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let r = row.bytes();
    Ok(pack(&[O_C_ID.get_u32(r), O_OL_CNT.get_i32(r) as u32]))
}

/// OL_AMOUNT in cents.
fn line_amount(row: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Int(OL_AMOUNT.get_money(row.bytes())))
}

/// OLLP's check: the head still names order `arg`, which this Delivery then takes (the head
/// moves past it). Outputs the order id, the offset of the order's keys.
fn advance_head(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    let o = NOH_O_ID.get_u32(row);
    if o as i64 != int(arg)? {
        return Err(OLLP_RESTART);
    }
    NOH_O_ID.set_u32(row, o + 1);
    Ok(Value::Int(o as i64))
}

fn delete_new_order(_: RowRef<'_>, _: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    Ok(Value::Null)
}

fn set_carrier(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    O_CARRIER_ID.set_u32(write(row)?, int(arg)? as u32);
    Ok(Value::Null)
}

fn set_delivery_date(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    OL_DELIVERY_D.set_i64(write(row)?, int(arg)?);
    Ok(Value::Null)
}

/// Clause 2.7.4.2's customer update: C_BALANCE += the order's amount `arg`,
/// C_DELIVERY_CNT += 1.
fn credit_delivery(row: RowRef<'_>, arg: &Value, _: Inputs<'_>) -> Result<Value, LogicAbort> {
    let row = write(row)?;
    C_BALANCE.set_money(row, C_BALANCE.get_money(row) + int(arg)?);
    C_DELIVERY_CNT.set_i32(row, C_DELIVERY_CNT.get_i32(row) + 1);
    Ok(Value::Null)
}
