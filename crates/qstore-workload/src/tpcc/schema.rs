//! The TPC-C tables (clause 1.3) as fixed-size rows, plus three indexes:
//! CUSTOMER_BY_LAST_NAME (static), CUSTOMER_LAST_ORDER (kept by New-Order) and
//! NEW_ORDER_HEAD (kept by Delivery).
//!
//! Every column of the spec is here, so that any of the five transactions can be written
//! against these layouts. Columns keep the spec's names and string sizes; numbers take the
//! smallest of our kinds that holds the spec's range:
//!
//! * identifiers are `u32`; warehouses are numbered from 0 over the cluster (see `keys`);
//! * `numeric(n, 2)` amounts are money, `i64` cents, so that sums are exact;
//! * the rates W_TAX, D_TAX and C_DISCOUNT (`numeric(4, 4)`) are `i32` ten-thousandths;
//! * counts and quantities are `i32`; dates are `i64` seconds, given by the load or by the
//!   client (steps must be deterministic, so they never read a clock);
//! * the spec's nulls (O_CARRIER_ID, OL_DELIVERY_D) are 0, which no real value takes.
//!
//! Within a row, numbers come first and strings after them: the columns the transactions
//! update (balances, counters, D_NEXT_O_ID) then share the row's first cache line.
//!
//! C_DATA keeps the spec's 500 bytes. Halving it would save 7.5 MB per warehouse, little
//! next to the room ORDER-LINE keeps for new orders (about 375 MB per warehouse by default,
//! see [`TableDef`]), and Payment's cost of rewriting the C_DATA of bad-credit customers is
//! part of what TPC-C measures.
//!
//! DISTRICT has two columns the spec lacks. D_ORDER_LINES counts the district's ORDER-LINE
//! rows, so that New-Order can refuse an order the pre-sized table has no room for (it aborts
//! rather than lose lines). D_NEXT_H_ID is the next HISTORY sequence number of
//! the district, which makes HISTORY keys unique (the spec's HISTORY has no primary key).

use super::keys::{TpccKeys, CUSTOMERS, DELIVERED_ORDERS, DISTRICTS, ITEMS, ITEM_BITS, LAST_NAMES};
use super::layout::{Field, Layout, LayoutError};
use qstore_core::config::TpccConfig;
use qstore_core::txn::TableSchema;
use qstore_core::TableId;

// Table ids, in the order [`schemas`] lists them (and a catalog must add them).
pub const WAREHOUSE: TableId = 0;
pub const DISTRICT: TableId = 1;
pub const CUSTOMER: TableId = 2;
pub const HISTORY: TableId = 3;
pub const NEW_ORDER: TableId = 4;
pub const ORDER: TableId = 5;
pub const ORDER_LINE: TableId = 6;
pub const ITEM: TableId = 7;
pub const STOCK: TableId = 8;
pub const CUSTOMER_BY_LAST_NAME: TableId = 9;
pub const CUSTOMER_LAST_ORDER: TableId = 10;
pub const NEW_ORDER_HEAD: TableId = 11;
/// Number of tables.
pub const TABLES: usize = 12;

// WAREHOUSE.
pub const W_ID: Field = Field::u32("W_ID", 0);
pub const W_TAX: Field = Field::i32("W_TAX", W_ID.end());
pub const W_YTD: Field = Field::money("W_YTD", W_TAX.end());
pub const W_NAME: Field = Field::bytes("W_NAME", W_YTD.end(), 10);
pub const W_STREET_1: Field = Field::bytes("W_STREET_1", W_NAME.end(), 20);
pub const W_STREET_2: Field = Field::bytes("W_STREET_2", W_STREET_1.end(), 20);
pub const W_CITY: Field = Field::bytes("W_CITY", W_STREET_2.end(), 20);
pub const W_STATE: Field = Field::bytes("W_STATE", W_CITY.end(), 2);
pub const W_ZIP: Field = Field::bytes("W_ZIP", W_STATE.end(), 9);
pub const WAREHOUSE_LAYOUT: Layout = Layout {
    table: "warehouse",
    fields: &[
        W_ID, W_TAX, W_YTD, W_NAME, W_STREET_1, W_STREET_2, W_CITY, W_STATE, W_ZIP,
    ],
};

// DISTRICT.
pub const D_ID: Field = Field::u32("D_ID", 0);
pub const D_W_ID: Field = Field::u32("D_W_ID", D_ID.end());
pub const D_TAX: Field = Field::i32("D_TAX", D_W_ID.end());
pub const D_NEXT_O_ID: Field = Field::u32("D_NEXT_O_ID", D_TAX.end());
/// Not in the spec: the district's next HISTORY sequence number.
pub const D_NEXT_H_ID: Field = Field::u32("D_NEXT_H_ID", D_NEXT_O_ID.end());
/// Not in the spec: the ORDER-LINE rows of the district's orders (the sum of their
/// O_OL_CNT), which New-Order keeps within the district's share of the ORDER-LINE table.
pub const D_ORDER_LINES: Field = Field::u32("D_ORDER_LINES", D_NEXT_H_ID.end());
pub const D_YTD: Field = Field::money("D_YTD", D_ORDER_LINES.end());
pub const D_NAME: Field = Field::bytes("D_NAME", D_YTD.end(), 10);
pub const D_STREET_1: Field = Field::bytes("D_STREET_1", D_NAME.end(), 20);
pub const D_STREET_2: Field = Field::bytes("D_STREET_2", D_STREET_1.end(), 20);
pub const D_CITY: Field = Field::bytes("D_CITY", D_STREET_2.end(), 20);
pub const D_STATE: Field = Field::bytes("D_STATE", D_CITY.end(), 2);
pub const D_ZIP: Field = Field::bytes("D_ZIP", D_STATE.end(), 9);
pub const DISTRICT_LAYOUT: Layout = Layout {
    table: "district",
    fields: &[
        D_ID,
        D_W_ID,
        D_TAX,
        D_NEXT_O_ID,
        D_NEXT_H_ID,
        D_ORDER_LINES,
        D_YTD,
        D_NAME,
        D_STREET_1,
        D_STREET_2,
        D_CITY,
        D_STATE,
        D_ZIP,
    ],
};

// CUSTOMER.
pub const C_ID: Field = Field::u32("C_ID", 0);
pub const C_D_ID: Field = Field::u32("C_D_ID", C_ID.end());
pub const C_W_ID: Field = Field::u32("C_W_ID", C_D_ID.end());
pub const C_DISCOUNT: Field = Field::i32("C_DISCOUNT", C_W_ID.end());
pub const C_BALANCE: Field = Field::money("C_BALANCE", C_DISCOUNT.end());
pub const C_YTD_PAYMENT: Field = Field::money("C_YTD_PAYMENT", C_BALANCE.end());
pub const C_CREDIT_LIM: Field = Field::money("C_CREDIT_LIM", C_YTD_PAYMENT.end());
pub const C_PAYMENT_CNT: Field = Field::i32("C_PAYMENT_CNT", C_CREDIT_LIM.end());
pub const C_DELIVERY_CNT: Field = Field::i32("C_DELIVERY_CNT", C_PAYMENT_CNT.end());
pub const C_SINCE: Field = Field::i64("C_SINCE", C_DELIVERY_CNT.end());
pub const C_CREDIT: Field = Field::bytes("C_CREDIT", C_SINCE.end(), 2);
pub const C_MIDDLE: Field = Field::bytes("C_MIDDLE", C_CREDIT.end(), 2);
pub const C_FIRST: Field = Field::bytes("C_FIRST", C_MIDDLE.end(), 16);
pub const C_LAST: Field = Field::bytes("C_LAST", C_FIRST.end(), 16);
pub const C_STREET_1: Field = Field::bytes("C_STREET_1", C_LAST.end(), 20);
pub const C_STREET_2: Field = Field::bytes("C_STREET_2", C_STREET_1.end(), 20);
pub const C_CITY: Field = Field::bytes("C_CITY", C_STREET_2.end(), 20);
pub const C_STATE: Field = Field::bytes("C_STATE", C_CITY.end(), 2);
pub const C_ZIP: Field = Field::bytes("C_ZIP", C_STATE.end(), 9);
pub const C_PHONE: Field = Field::bytes("C_PHONE", C_ZIP.end(), 16);
pub const C_DATA: Field = Field::bytes("C_DATA", C_PHONE.end(), 500);
pub const CUSTOMER_LAYOUT: Layout = Layout {
    table: "customer",
    fields: &[
        C_ID,
        C_D_ID,
        C_W_ID,
        C_DISCOUNT,
        C_BALANCE,
        C_YTD_PAYMENT,
        C_CREDIT_LIM,
        C_PAYMENT_CNT,
        C_DELIVERY_CNT,
        C_SINCE,
        C_CREDIT,
        C_MIDDLE,
        C_FIRST,
        C_LAST,
        C_STREET_1,
        C_STREET_2,
        C_CITY,
        C_STATE,
        C_ZIP,
        C_PHONE,
        C_DATA,
    ],
};

// HISTORY.
pub const H_C_ID: Field = Field::u32("H_C_ID", 0);
pub const H_C_D_ID: Field = Field::u32("H_C_D_ID", H_C_ID.end());
pub const H_C_W_ID: Field = Field::u32("H_C_W_ID", H_C_D_ID.end());
pub const H_D_ID: Field = Field::u32("H_D_ID", H_C_W_ID.end());
pub const H_W_ID: Field = Field::u32("H_W_ID", H_D_ID.end());
pub const H_DATE: Field = Field::i64("H_DATE", H_W_ID.end());
pub const H_AMOUNT: Field = Field::money("H_AMOUNT", H_DATE.end());
pub const H_DATA: Field = Field::bytes("H_DATA", H_AMOUNT.end(), 24);
pub const HISTORY_LAYOUT: Layout = Layout {
    table: "history",
    fields: &[
        H_C_ID, H_C_D_ID, H_C_W_ID, H_D_ID, H_W_ID, H_DATE, H_AMOUNT, H_DATA,
    ],
};

// NEW-ORDER.
pub const NO_O_ID: Field = Field::u32("NO_O_ID", 0);
pub const NO_D_ID: Field = Field::u32("NO_D_ID", NO_O_ID.end());
pub const NO_W_ID: Field = Field::u32("NO_W_ID", NO_D_ID.end());
pub const NEW_ORDER_LAYOUT: Layout = Layout {
    table: "new_order",
    fields: &[NO_O_ID, NO_D_ID, NO_W_ID],
};

// ORDER.
pub const O_ID: Field = Field::u32("O_ID", 0);
pub const O_D_ID: Field = Field::u32("O_D_ID", O_ID.end());
pub const O_W_ID: Field = Field::u32("O_W_ID", O_D_ID.end());
pub const O_C_ID: Field = Field::u32("O_C_ID", O_W_ID.end());
/// 1..=10, or 0 (null) while the order is undelivered.
pub const O_CARRIER_ID: Field = Field::u32("O_CARRIER_ID", O_C_ID.end());
pub const O_OL_CNT: Field = Field::i32("O_OL_CNT", O_CARRIER_ID.end());
pub const O_ALL_LOCAL: Field = Field::i32("O_ALL_LOCAL", O_OL_CNT.end());
pub const O_ENTRY_D: Field = Field::i64("O_ENTRY_D", O_ALL_LOCAL.end());
pub const ORDER_LAYOUT: Layout = Layout {
    table: "order",
    fields: &[
        O_ID,
        O_D_ID,
        O_W_ID,
        O_C_ID,
        O_CARRIER_ID,
        O_OL_CNT,
        O_ALL_LOCAL,
        O_ENTRY_D,
    ],
};

// ORDER-LINE.
pub const OL_O_ID: Field = Field::u32("OL_O_ID", 0);
pub const OL_D_ID: Field = Field::u32("OL_D_ID", OL_O_ID.end());
pub const OL_W_ID: Field = Field::u32("OL_W_ID", OL_D_ID.end());
pub const OL_NUMBER: Field = Field::u32("OL_NUMBER", OL_W_ID.end());
pub const OL_I_ID: Field = Field::u32("OL_I_ID", OL_NUMBER.end());
pub const OL_SUPPLY_W_ID: Field = Field::u32("OL_SUPPLY_W_ID", OL_I_ID.end());
pub const OL_QUANTITY: Field = Field::i32("OL_QUANTITY", OL_SUPPLY_W_ID.end());
/// A date, or 0 (null) while the order is undelivered.
pub const OL_DELIVERY_D: Field = Field::i64("OL_DELIVERY_D", OL_QUANTITY.end());
pub const OL_AMOUNT: Field = Field::money("OL_AMOUNT", OL_DELIVERY_D.end());
pub const OL_DIST_INFO: Field = Field::bytes("OL_DIST_INFO", OL_AMOUNT.end(), 24);
pub const ORDER_LINE_LAYOUT: Layout = Layout {
    table: "order_line",
    fields: &[
        OL_O_ID,
        OL_D_ID,
        OL_W_ID,
        OL_NUMBER,
        OL_I_ID,
        OL_SUPPLY_W_ID,
        OL_QUANTITY,
        OL_DELIVERY_D,
        OL_AMOUNT,
        OL_DIST_INFO,
    ],
};

// ITEM.
pub const I_ID: Field = Field::u32("I_ID", 0);
pub const I_IM_ID: Field = Field::u32("I_IM_ID", I_ID.end());
pub const I_PRICE: Field = Field::money("I_PRICE", I_IM_ID.end());
pub const I_NAME: Field = Field::bytes("I_NAME", I_PRICE.end(), 24);
pub const I_DATA: Field = Field::bytes("I_DATA", I_NAME.end(), 50);
pub const ITEM_LAYOUT: Layout = Layout {
    table: "item",
    fields: &[I_ID, I_IM_ID, I_PRICE, I_NAME, I_DATA],
};

// STOCK.
pub const S_I_ID: Field = Field::u32("S_I_ID", 0);
pub const S_W_ID: Field = Field::u32("S_W_ID", S_I_ID.end());
pub const S_QUANTITY: Field = Field::i32("S_QUANTITY", S_W_ID.end());
pub const S_YTD: Field = Field::i32("S_YTD", S_QUANTITY.end());
pub const S_ORDER_CNT: Field = Field::i32("S_ORDER_CNT", S_YTD.end());
pub const S_REMOTE_CNT: Field = Field::i32("S_REMOTE_CNT", S_ORDER_CNT.end());
pub const S_DIST_01: Field = Field::bytes("S_DIST_01", S_REMOTE_CNT.end(), 24);
pub const S_DIST_02: Field = Field::bytes("S_DIST_02", S_DIST_01.end(), 24);
pub const S_DIST_03: Field = Field::bytes("S_DIST_03", S_DIST_02.end(), 24);
pub const S_DIST_04: Field = Field::bytes("S_DIST_04", S_DIST_03.end(), 24);
pub const S_DIST_05: Field = Field::bytes("S_DIST_05", S_DIST_04.end(), 24);
pub const S_DIST_06: Field = Field::bytes("S_DIST_06", S_DIST_05.end(), 24);
pub const S_DIST_07: Field = Field::bytes("S_DIST_07", S_DIST_06.end(), 24);
pub const S_DIST_08: Field = Field::bytes("S_DIST_08", S_DIST_07.end(), 24);
pub const S_DIST_09: Field = Field::bytes("S_DIST_09", S_DIST_08.end(), 24);
pub const S_DIST_10: Field = Field::bytes("S_DIST_10", S_DIST_09.end(), 24);
pub const S_DATA: Field = Field::bytes("S_DATA", S_DIST_10.end(), 50);
/// S_DIST_01..S_DIST_10 by district: New-Order copies `S_DIST[d - 1]` into OL_DIST_INFO.
pub const S_DIST: [Field; DISTRICTS as usize] = [
    S_DIST_01, S_DIST_02, S_DIST_03, S_DIST_04, S_DIST_05, S_DIST_06, S_DIST_07, S_DIST_08,
    S_DIST_09, S_DIST_10,
];
pub const STOCK_LAYOUT: Layout = Layout {
    table: "stock",
    fields: &[
        S_I_ID,
        S_W_ID,
        S_QUANTITY,
        S_YTD,
        S_ORDER_CNT,
        S_REMOTE_CNT,
        S_DIST_01,
        S_DIST_02,
        S_DIST_03,
        S_DIST_04,
        S_DIST_05,
        S_DIST_06,
        S_DIST_07,
        S_DIST_08,
        S_DIST_09,
        S_DIST_10,
        S_DATA,
    ],
};

// CUSTOMER_BY_LAST_NAME: (w, d, last name) -> the district's customers of that name, sorted
// by C_FIRST, which Payment and Order-Status need to find a customer by name (clause
// 2.5.2.2: the one at position ceil(n / 2)). TPC-C never inserts or deletes customers and
// never changes a last name, so the index is built by the load and only ever read.

/// Most customers one last name of one district can list.
///
/// The load gives customers 1..=1000 one name each and the other 2000 a name drawn by
/// NURand(255, 0, 999), whose likeliest values come up with probability about 3^8 / 256000
/// ≈ 2.6% (values whose low 8 bits, after the OR, are all ones): such a name gets 1 + 51
/// customers on average, with a standard deviation of 7, and a district's longest list is
/// the largest of a few such names. Over 12,800 districts (20 seeds of 64 warehouses) the
/// longest list had 82 customers; 128 is 10 standard deviations above the mean. The load
/// checks the cap and fails rather than truncate a list, and its tests measure the longest.
pub const MAX_CUSTOMERS_PER_LAST_NAME: usize = 128;
/// How many customers the row lists.
pub const CL_COUNT: Field = Field::u32("CL_COUNT", 0);
/// The customers' C_IDs, little-endian `u16`s (C_ID ≤ 3000), sorted by C_FIRST then C_ID;
/// entries past CL_COUNT are zero.
pub const CL_C_IDS: Field =
    Field::bytes("CL_C_IDS", CL_COUNT.end(), 2 * MAX_CUSTOMERS_PER_LAST_NAME);
pub const CUSTOMER_BY_LAST_NAME_LAYOUT: Layout = Layout {
    table: "customer_by_last_name",
    fields: &[CL_COUNT, CL_C_IDS],
};

const _: () = assert!(CUSTOMERS <= u16::MAX as u32);

/// The customer ids a CUSTOMER_BY_LAST_NAME row lists, in C_FIRST order. A count larger
/// than the row holds (a corrupt row) yields only what the row holds.
pub fn cl_customers(row: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let n = (CL_COUNT.get_u32(row) as usize).min(MAX_CUSTOMERS_PER_LAST_NAME);
    CL_C_IDS.raw(row)[..2 * n]
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
}

/// The customer Payment and Order-Status choose among those of a last name: the one at
/// position ceil(n / 2) in C_FIRST order (clause 2.5.2.2). `None` for an empty row.
pub fn cl_middle_customer(row: &[u8]) -> Option<u32> {
    let n = CL_COUNT.get_u32(row) as usize;
    cl_customers(row).nth(n.div_ceil(2).checked_sub(1)?)
}

/// Writes the list of a CUSTOMER_BY_LAST_NAME row; refuses more ids than it holds, or ids
/// that are no C_ID.
pub fn cl_set_customers(row: &mut [u8], ids: &[u32]) -> Result<(), LayoutError> {
    if ids.len() > MAX_CUSTOMERS_PER_LAST_NAME {
        return Err(LayoutError::TooLong {
            field: CL_C_IDS.name,
            len: 2 * ids.len(),
            width: CL_C_IDS.width,
        });
    }
    if let Some(&c) = ids.iter().find(|&&c| c == 0 || c > CUSTOMERS) {
        return Err(LayoutError::OutOfRange {
            field: CL_C_IDS.name,
            value: c as i64,
        });
    }
    CL_COUNT.set_u32(row, ids.len() as u32);
    let raw = CL_C_IDS.raw_mut(row);
    raw.fill(0);
    for (slot, &c) in raw.chunks_exact_mut(2).zip(ids) {
        slot.copy_from_slice(&(c as u16).to_le_bytes());
    }
    Ok(())
}

// CUSTOMER_LAST_ORDER: (w, d, c) -> the O_ID of the customer's latest order, which
// Order-Status reads (clause 2.6.2.2: "the row in ORDER with the largest O_ID" of the
// customer). Keyed like CUSTOMER; written by every New-Order, in the transaction that inserts
// the order, so it is exactly as current as ORDER. A table of its own rather than a CUSTOMER
// column: New-Order only reads CUSTOMER, and writing it would make New-Order conflict with
// Payments of the same customer.

/// The customer's latest order id.
pub const CO_O_ID: Field = Field::u32("CO_O_ID", 0);
pub const CUSTOMER_LAST_ORDER_LAYOUT: Layout = Layout {
    table: "customer_last_order",
    fields: &[CO_O_ID],
};

// NEW_ORDER_HEAD: (w, d) -> the district's oldest undelivered order id, the smallest NO_O_ID
// (clause 2.7.4.2), or D_NEXT_O_ID when the district has no new order. Keyed like DISTRICT;
// only Delivery reads and writes it, advancing it as it deletes the NEW-ORDER row it names.
// A table of its own rather than a DISTRICT column, so Delivery does not conflict with
// New-Order and Payment, which update DISTRICT.

/// The district's oldest undelivered order id.
pub const NOH_O_ID: Field = Field::u32("NOH_O_ID", 0);
pub const NEW_ORDER_HEAD_LAYOUT: Layout = Layout {
    table: "new_order_head",
    fields: &[NOH_O_ID],
};

const _: () = assert!(WAREHOUSE_LAYOUT.is_packed());
const _: () = assert!(DISTRICT_LAYOUT.is_packed());
const _: () = assert!(CUSTOMER_LAYOUT.is_packed());
const _: () = assert!(HISTORY_LAYOUT.is_packed());
const _: () = assert!(NEW_ORDER_LAYOUT.is_packed());
const _: () = assert!(ORDER_LAYOUT.is_packed());
const _: () = assert!(ORDER_LINE_LAYOUT.is_packed());
const _: () = assert!(ITEM_LAYOUT.is_packed());
const _: () = assert!(STOCK_LAYOUT.is_packed());
const _: () = assert!(CUSTOMER_BY_LAST_NAME_LAYOUT.is_packed());
const _: () = assert!(CUSTOMER_LAST_ORDER_LAYOUT.is_packed());
const _: () = assert!(NEW_ORDER_HEAD_LAYOUT.is_packed());

/// One table: its layout, key bits and rows.
#[derive(Clone, Copy, Debug)]
pub struct TableDef {
    pub id: TableId,
    pub layout: Layout,
    /// Key bits of the table's space per warehouse (per partition for ITEM).
    pub bits: u32,
    /// Rows a warehouse (a partition for ITEM) can come to hold. Tables that grow get room
    /// for every key their space allows: a district's `max_orders_per_district` orders, its
    /// history sequence, and its undelivered orders, all of which may be new orders when no
    /// Delivery runs (orders up to 2100 are loaded delivered). ORDER-LINE is the exception:
    /// room for 11 lines per order, not 15 (see `TpccConfig::ORDER_LINES_ROOM`).
    pub rows_per_warehouse: u64,
}

/// Every table of a configuration, in table-id order.
pub fn tables(keys: &TpccKeys) -> [TableDef; TABLES] {
    let districts = DISTRICTS as u64;
    let orders = districts * keys.max_orders() as u64;
    let delivered = districts * DELIVERED_ORDERS as u64;
    let def = |id, layout, bits, rows_per_warehouse| TableDef {
        id,
        layout,
        bits,
        rows_per_warehouse,
    };
    [
        def(WAREHOUSE, WAREHOUSE_LAYOUT, 0, 1),
        def(DISTRICT, DISTRICT_LAYOUT, keys.district_bits(), districts),
        def(
            CUSTOMER,
            CUSTOMER_LAYOUT,
            keys.customer_bits(),
            districts * CUSTOMERS as u64,
        ),
        def(HISTORY, HISTORY_LAYOUT, keys.history_bits(), orders),
        def(
            NEW_ORDER,
            NEW_ORDER_LAYOUT,
            keys.order_bits_per_warehouse(),
            orders - delivered,
        ),
        def(ORDER, ORDER_LAYOUT, keys.order_bits_per_warehouse(), orders),
        def(
            ORDER_LINE,
            ORDER_LINE_LAYOUT,
            keys.order_line_bits(),
            orders * TpccConfig::ORDER_LINES_ROOM as u64,
        ),
        def(ITEM, ITEM_LAYOUT, ITEM_BITS, ITEMS as u64),
        def(STOCK, STOCK_LAYOUT, keys.stock_bits(), ITEMS as u64),
        def(
            CUSTOMER_BY_LAST_NAME,
            CUSTOMER_BY_LAST_NAME_LAYOUT,
            keys.last_name_bits(),
            districts * LAST_NAMES as u64,
        ),
        def(
            CUSTOMER_LAST_ORDER,
            CUSTOMER_LAST_ORDER_LAYOUT,
            keys.customer_bits(),
            districts * CUSTOMERS as u64,
        ),
        def(
            NEW_ORDER_HEAD,
            NEW_ORDER_HEAD_LAYOUT,
            keys.district_bits(),
            districts,
        ),
    ]
}

/// The table schemas of a configuration, in table-id order: rows sized by the layouts, each
/// partition's range `warehouses_per_partition` warehouse spaces wide (one item space for
/// ITEM), and room for every row its warehouses can come to hold.
pub fn schemas(keys: &TpccKeys) -> Vec<TableSchema> {
    let wpp = keys.warehouses_per_partition() as u64;
    tables(keys)
        .iter()
        .map(|t| {
            let (width, rows) = if t.id == ITEM {
                (keys.item_width(), t.rows_per_warehouse)
            } else {
                (keys.width(t.bits), t.rows_per_warehouse * wpp)
            };
            TableSchema {
                name: t.layout.table.to_string(),
                row_size: t.layout.size(),
                capacity_per_partition: rows as usize,
                keys_per_partition: width,
                // No transaction writes ITEM.
                read_mostly: t.id == ITEM,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn keys(wpp: u32) -> TpccKeys {
        let cfg = TpccConfig {
            warehouses_per_partition: wpp,
            ..TpccConfig::default()
        };
        TpccKeys::new(&cfg, 2)
    }

    #[test]
    fn layouts_have_the_specs_columns_and_sizes() {
        let t = tables(&keys(1));
        for (i, def) in t.iter().enumerate() {
            assert_eq!(def.id as usize, i);
            assert!(def.layout.is_packed());
            let names: BTreeSet<_> = def.layout.fields.iter().map(|f| f.name).collect();
            assert_eq!(names.len(), def.layout.fields.len(), "{}", def.layout.table);
        }
        let sizes: Vec<usize> = t.iter().map(|d| d.layout.size()).collect();
        assert_eq!(sizes, [97, 113, 679, 60, 12, 36, 68, 90, 314, 260, 4, 4]);
        let width = |l: &Layout, n: &str| l.field(n).unwrap().width;
        assert_eq!(width(&CUSTOMER_LAYOUT, "C_DATA"), 500);
        assert_eq!(width(&CUSTOMER_LAYOUT, "C_LAST"), 16);
        assert_eq!(width(&STOCK_LAYOUT, "S_DATA"), 50);
        assert_eq!(width(&ORDER_LINE_LAYOUT, "OL_DIST_INFO"), 24);
        assert_eq!(width(&ITEM_LAYOUT, "I_NAME"), 24);
        assert_eq!(width(&WAREHOUSE_LAYOUT, "W_ZIP"), 9);
        assert_eq!(CUSTOMER_LAYOUT.field("C_BALANCE"), Some(C_BALANCE));
        assert!(
            C_DELIVERY_CNT.end() <= 64,
            "hot customer columns share a line"
        );
        assert_eq!(S_DIST[9], S_DIST_10);
    }

    #[test]
    fn schemas_scale_with_the_warehouses_of_a_partition() {
        for wpp in [1, 2, 4] {
            let k = keys(wpp);
            let s = schemas(&k);
            assert_eq!(s.len(), TABLES);
            let w = wpp as usize;
            assert_eq!(s[CUSTOMER as usize].capacity_per_partition, 30_000 * w);
            assert_eq!(s[CUSTOMER as usize].keys_per_partition, (w as u64) << 16);
            assert_eq!(s[ORDER as usize].capacity_per_partition, 330_000 * w);
            assert_eq!(s[NEW_ORDER as usize].capacity_per_partition, 309_000 * w);
            assert_eq!(
                s[ORDER_LINE as usize].capacity_per_partition,
                330_000 * 11 * w
            );
            assert_eq!(s[STOCK as usize].capacity_per_partition, 100_000 * w);
            assert_eq!(s[ITEM as usize].capacity_per_partition, 100_000);
            assert_eq!(s[ITEM as usize].keys_per_partition, 1 << 17);
            assert_eq!(s[WAREHOUSE as usize].keys_per_partition, w as u64);
            assert_eq!(s[CUSTOMER_BY_LAST_NAME as usize].row_size, 260);
            let last_order = &s[CUSTOMER_LAST_ORDER as usize];
            assert_eq!(last_order.capacity_per_partition, 30_000 * w);
            assert_eq!(last_order.keys_per_partition, (w as u64) << 16);
        }
    }

    #[test]
    fn last_name_lists_round_trip_and_pick_the_middle_customer() {
        let mut row = vec![0xAAu8; CUSTOMER_BY_LAST_NAME_LAYOUT.size()];
        for ids in [vec![], vec![7], vec![3, 1, 2000], vec![3000; 128]] {
            cl_set_customers(&mut row, &ids).unwrap();
            assert_eq!(cl_customers(&row).collect::<Vec<_>>(), ids);
        }
        for (n, middle) in [(0, None), (1, Some(10)), (2, Some(10)), (3, Some(20))] {
            let ids: Vec<u32> = (1..=n).map(|i| 10 * i).collect();
            cl_set_customers(&mut row, &ids).unwrap();
            assert_eq!(cl_middle_customer(&row), middle, "{n}");
        }
        cl_set_customers(&mut row, &[5, 6]).unwrap();
        assert!(cl_set_customers(&mut row, &[1; 129]).is_err());
        assert!(cl_set_customers(&mut row, &[1, 0]).is_err());
        assert!(cl_set_customers(&mut row, &[3001]).is_err());
        assert_eq!(cl_customers(&row).collect::<Vec<_>>(), [5, 6], "unchanged");
        CL_COUNT.set_u32(&mut row, u32::MAX);
        assert_eq!(
            cl_customers(&row).count(),
            128,
            "a corrupt count reads no further"
        );
    }
}
