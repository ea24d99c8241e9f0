//! The initial database of TPC-C (clause 4.3.3.1), partition by partition.
//!
//! A partition loads its own warehouses (each with its districts, customers, history,
//! orders, order lines, new orders and stock), its copy of ITEM, and the static
//! CUSTOMER_BY_LAST_NAME index of its customers.
//!
//! Every row is a function of the seed and the row's ids alone, never of the order in which
//! rows are loaded or of how warehouses are spread over partitions: each row draws from a
//! generator of its own, seeded from (seed, table, ids). What rows of one district share
//! (who placed which order, how many lines each order has, customers' names and credit) is
//! drawn first, from the district's own generator, as a `DistrictPlan`. So a warehouse has
//! the same rows whatever `warehouses_per_partition` is, and every partition's copy of ITEM
//! is the same.
//!
//! Dates are logical: the load happens at [`LOAD_DATE`].

use super::keys::{
    TpccKeys, CUSTOMERS, DELIVERED_ORDERS, DISTRICTS, INITIAL_ORDERS, ITEMS, LAST_NAMES, MAX_OL_CNT,
};
use super::layout::{dollars, Field};
use super::random::{
    a_string_into, choose, last_name_into, money, n_string_into, nurand, permutation, put_original,
    uniform, zip_into, NuRandC, A_C_LAST,
};
use super::schema::*;
use qstore_core::config::TpccConfig;
use qstore_core::rng::{splitmix64, stream, Rng};
use qstore_core::txn::{RowLoader, TableSchema};
use qstore_core::{ConfigError, Key, PartitionId, QError, RunConfig, TableId};

/// The date of every row the load writes (seconds since the Unix epoch: 2020-01-01), fixed
/// so that loads are reproducible.
pub const LOAD_DATE: i64 = 1_577_836_800;
/// Customers of a district with bad credit ("BC"), and items and stock rows that are
/// "ORIGINAL": exactly 10% of them, chosen at random.
const BAD_CREDIT: u32 = CUSTOMERS / 10;
const ORIGINALS: u32 = ITEMS / 10;

/// What each generator of the load draws for; with the ids of its row, it names the
/// generator's stream.
#[derive(Clone, Copy)]
enum Purpose {
    Constants = 1,
    Warehouse,
    District,
    Plan,
    Customer,
    History,
    Order,
    OrderLine,
    StockOriginals,
    Stock,
    ItemOriginals,
    Item,
}

/// Mixed into the stream number of every generator of the load, so that its streams are not
/// those other parts of qstore draw from the same seed (clients' streams are numbered by
/// client).
const LOAD_STREAMS: u64 = 0x7470_6363_6c6f_6164;

/// TPC-C's data: the table schemas of a configuration and the initial rows of each of its
/// partitions.
#[derive(Clone, Debug)]
pub struct TpccData {
    seed: u64,
    keys: TpccKeys,
    nurand_load: NuRandC,
}

impl TpccData {
    /// The data of `run`; checks `run.workload.tpcc` first.
    pub fn new(run: &RunConfig) -> Result<Self, ConfigError> {
        let cfg = &run.workload.tpcc;
        cfg.validate(run.cluster.nodes, run.cluster.partitioning)?;
        Ok(Self::with(cfg, run.cluster.nodes, run.seed))
    }

    /// The data of a valid configuration of `partitions` partitions.
    pub fn with(cfg: &TpccConfig, partitions: u32, seed: u64) -> Self {
        TpccData {
            seed,
            keys: TpccKeys::new(cfg, partitions),
            nurand_load: NuRandC::random(&mut load_rng(seed, Purpose::Constants, [0; 4])),
        }
    }

    pub fn keys(&self) -> &TpccKeys {
        &self.keys
    }

    /// The tables, in table-id order.
    pub fn schemas(&self) -> Vec<TableSchema> {
        schemas(&self.keys)
    }

    /// NURand's constants of the load (C_LAST's drew the customers' last names).
    pub fn nurand_load(&self) -> NuRandC {
        self.nurand_load
    }

    /// NURand's constants for transactions on this data: the same for every client of a run
    /// (the spec's constants are per run), with C_LAST's obeying the delta rule.
    pub fn nurand_run(&self) -> NuRandC {
        let mut rng = self.rng(Purpose::Constants, [1, 0, 0, 0]);
        self.nurand_load.for_run(&mut rng)
    }

    fn rng(&self, purpose: Purpose, ids: [u32; 4]) -> Rng {
        load_rng(self.seed, purpose, ids)
    }

    /// Loads the initial rows of `partition`: its copy of ITEM and its warehouses.
    pub fn load(&self, partition: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError> {
        if partition.0 >= self.keys.partitions() {
            return Err(QError::Other(format!(
                "tpcc: no partition {partition} in a cluster of {}",
                self.keys.partitions()
            )));
        }
        self.load_items(partition, loader)?;
        for w in self.keys.warehouses_of(partition) {
            self.load_warehouse(w, loader)?;
        }
        Ok(())
    }

    fn load_items(&self, p: PartitionId, loader: &mut dyn RowLoader) -> Result<(), QError> {
        let original = choose(
            &mut self.rng(Purpose::ItemOriginals, [0; 4]),
            ITEMS,
            ORIGINALS,
        );
        let k = self.keys;
        let mut keys = (1..=ITEMS)
            .filter(|&i| k.keeps_item(p, i))
            .map(|i| k.item(p, i));
        loader.load_rows(ITEM, &mut keys, &mut |key, row| {
            let (_, i) = k.decode_item(key);
            self.fill_item(i, original[i as usize], row);
        })
    }

    fn load_warehouse(&self, w: u32, loader: &mut dyn RowLoader) -> Result<(), QError> {
        let k = self.keys;
        load_one(loader, WAREHOUSE, k.warehouse(w), |row| {
            self.fill_warehouse(w, row)
        })?;
        self.load_stock(w, loader)?;
        for d in 1..=DISTRICTS {
            self.load_district(w, d, loader)?;
        }
        Ok(())
    }

    fn load_stock(&self, w: u32, loader: &mut dyn RowLoader) -> Result<(), QError> {
        let original = choose(
            &mut self.rng(Purpose::StockOriginals, [w, 0, 0, 0]),
            ITEMS,
            ORIGINALS,
        );
        let k = self.keys;
        let mut keys = (1..=ITEMS).map(|i| k.stock(w, i));
        loader.load_rows(STOCK, &mut keys, &mut |key, row| {
            let (w, i) = k.decode_stock(key);
            self.fill_stock(w, i, original[i as usize], row);
        })
    }

    fn load_district(&self, w: u32, d: u32, loader: &mut dyn RowLoader) -> Result<(), QError> {
        let k = self.keys;
        let plan = self.plan(w, d);
        load_one(loader, DISTRICT, k.district(w, d), |row| {
            self.fill_district(&plan, w, d, row)
        })?;
        let mut keys = (1..=CUSTOMERS).map(|c| k.customer(w, d, c));
        loader.load_rows(CUSTOMER, &mut keys, &mut |key, row| {
            let (w, d, c) = k.decode_customer(key);
            self.fill_customer(&plan, w, d, c, row);
        })?;
        // One history row per customer, the district's history rows 1..=3000.
        let mut keys = (1..=CUSTOMERS).map(|c| k.history(w, d, c, c));
        loader.load_rows(HISTORY, &mut keys, &mut |key, row| {
            let (w, d, c, _) = k.decode_history(key);
            self.fill_history(w, d, c, row);
        })?;
        self.load_last_names(&plan, w, d, loader)?;
        self.load_orders(&plan, w, d, loader)
    }

    fn load_orders(
        &self,
        plan: &DistrictPlan,
        w: u32,
        d: u32,
        loader: &mut dyn RowLoader,
    ) -> Result<(), QError> {
        let k = self.keys;
        let mut keys = (1..=INITIAL_ORDERS).map(|o| k.order(w, d, o));
        loader.load_rows(ORDER, &mut keys, &mut |key, row| {
            let (w, d, o) = k.decode_order(key);
            self.fill_order(plan, w, d, o, row);
        })?;
        let mut keys = (1..=INITIAL_ORDERS).flat_map(|o| {
            (1..=plan.ol_cnt[o as usize - 1] as u32).map(move |ol| k.order_line(w, d, o, ol))
        });
        loader.load_rows(ORDER_LINE, &mut keys, &mut |key, row| {
            let (w, d, o, ol) = k.decode_order_line(key);
            self.fill_order_line(w, d, o, ol, row);
        })?;
        // Each customer has one loaded order, so it is the customer's latest.
        let mut order_of_customer = vec![0u32; CUSTOMERS as usize];
        for (at, &c) in plan.customer_of_order.iter().enumerate() {
            order_of_customer[c as usize - 1] = at as u32 + 1;
        }
        let mut keys = (1..=CUSTOMERS).map(|c| k.customer(w, d, c));
        loader.load_rows(CUSTOMER_LAST_ORDER, &mut keys, &mut |key, row| {
            let (_, _, c) = k.decode_customer(key);
            CO_O_ID.set_u32(row, order_of_customer[c as usize - 1]);
        })?;
        load_one(loader, NEW_ORDER_HEAD, k.district(w, d), |row| {
            NOH_O_ID.set_u32(row, DELIVERED_ORDERS + 1)
        })?;
        let mut keys = (DELIVERED_ORDERS + 1..=INITIAL_ORDERS).map(|o| k.new_order(w, d, o));
        loader.load_rows(NEW_ORDER, &mut keys, &mut |key, row| {
            let (w, d, o) = k.decode_order(key);
            row.fill(0);
            NO_O_ID.set_u32(row, o);
            NO_D_ID.set_u32(row, d);
            NO_W_ID.set_u32(row, w);
        })
    }

    /// CUSTOMER_BY_LAST_NAME of district (w, d): for each of the 1000 last names (each is
    /// some customer's: customers 1..=1000 take one each), its customers sorted by C_FIRST.
    fn load_last_names(
        &self,
        plan: &DistrictPlan,
        w: u32,
        d: u32,
        loader: &mut dyn RowLoader,
    ) -> Result<(), QError> {
        let lists = plan.last_name_lists();
        if let Some((name, list)) = lists
            .iter()
            .enumerate()
            .find(|(_, l)| l.len() > MAX_CUSTOMERS_PER_LAST_NAME)
        {
            return Err(QError::Other(format!(
                "tpcc: warehouse {w} district {d} has {} customers of last name {name}, more \
                 than the {MAX_CUSTOMERS_PER_LAST_NAME} a CUSTOMER_BY_LAST_NAME row lists",
                list.len()
            )));
        }
        let k = self.keys;
        let mut keys = (0..LAST_NAMES).map(|n| k.customer_by_last_name(w, d, n));
        loader.load_rows(CUSTOMER_BY_LAST_NAME, &mut keys, &mut |key, row| {
            let (_, _, name) = k.decode_customer_by_last_name(key);
            row.fill(0);
            cl_set_customers(row, &lists[name as usize]).expect("lists were checked above");
        })
    }

    /// For each last-name number of district (w, d), the customer Payment and Order-Status
    /// choose by that name (clause 2.5.2.2), as CUSTOMER_BY_LAST_NAME lists it; 0 for a name
    /// no customer has. The index never changes, so this is its content for a whole run.
    pub fn chosen_by_last_name(&self, w: u32, d: u32) -> Vec<u16> {
        self.plan(w, d)
            .last_name_lists()
            .iter()
            .map(|list| match list.len() {
                0 => 0,
                n => list[n.div_ceil(2) - 1] as u16,
            })
            .collect()
    }

    /// What the rows of district (w, d) share, drawn from the district's generator.
    fn plan(&self, w: u32, d: u32) -> DistrictPlan {
        let mut rng = self.rng(Purpose::Plan, [w, d, 0, 0]);
        let c_last = self.nurand_load.c_last;
        // Customers 1..=1000 take the names of 0..=999; the others NURand(255, 0, 999).
        let last = (1..=CUSTOMERS)
            .map(|c| match c {
                1..=1000 => c - 1,
                _ => nurand(&mut rng, A_C_LAST, 0, LAST_NAMES - 1, c_last),
            } as u16)
            .collect();
        let first = (0..CUSTOMERS)
            .map(|_| {
                let mut name = [0u8; 16];
                a_string_into(&mut rng, 8, 16, &mut name);
                name
            })
            .collect();
        DistrictPlan {
            last,
            first,
            bad_credit: choose(&mut rng, CUSTOMERS, BAD_CREDIT),
            customer_of_order: permutation(&mut rng, INITIAL_ORDERS),
            ol_cnt: (0..INITIAL_ORDERS)
                .map(|_| uniform(&mut rng, 5, MAX_OL_CNT) as u8)
                .collect(),
        }
    }

    fn fill_warehouse(&self, w: u32, row: &mut [u8]) {
        let mut rng = self.rng(Purpose::Warehouse, [w, 0, 0, 0]);
        row.fill(0);
        W_ID.set_u32(row, w);
        W_TAX.set_i32(row, uniform(&mut rng, 0, 2_000) as i32);
        W_YTD.set_money(row, dollars(300_000));
        a_string_into(&mut rng, 6, 10, W_NAME.raw_mut(row));
        fill_address(
            &mut rng,
            row,
            [W_STREET_1, W_STREET_2, W_CITY, W_STATE, W_ZIP],
        );
    }

    fn fill_district(&self, plan: &DistrictPlan, w: u32, d: u32, row: &mut [u8]) {
        let mut rng = self.rng(Purpose::District, [w, d, 0, 0]);
        row.fill(0);
        D_ID.set_u32(row, d);
        D_W_ID.set_u32(row, w);
        D_TAX.set_i32(row, uniform(&mut rng, 0, 2_000) as i32);
        D_YTD.set_money(row, dollars(30_000));
        D_NEXT_O_ID.set_u32(row, INITIAL_ORDERS + 1);
        D_NEXT_H_ID.set_u32(row, CUSTOMERS + 1);
        D_ORDER_LINES.set_u32(row, plan.ol_cnt.iter().map(|&n| n as u32).sum());
        a_string_into(&mut rng, 6, 10, D_NAME.raw_mut(row));
        fill_address(
            &mut rng,
            row,
            [D_STREET_1, D_STREET_2, D_CITY, D_STATE, D_ZIP],
        );
    }

    fn fill_customer(&self, plan: &DistrictPlan, w: u32, d: u32, c: u32, row: &mut [u8]) {
        let mut rng = self.rng(Purpose::Customer, [w, d, c, 0]);
        let at = c as usize - 1;
        row.fill(0);
        C_ID.set_u32(row, c);
        C_D_ID.set_u32(row, d);
        C_W_ID.set_u32(row, w);
        C_FIRST.raw_mut(row).copy_from_slice(&plan.first[at]);
        last_name_into(plan.last[at] as u32, C_LAST.raw_mut(row));
        put(C_MIDDLE, row, b"OE");
        fill_address(
            &mut rng,
            row,
            [C_STREET_1, C_STREET_2, C_CITY, C_STATE, C_ZIP],
        );
        n_string_into(&mut rng, 16, 16, C_PHONE.raw_mut(row));
        C_SINCE.set_i64(row, LOAD_DATE);
        let credit = if plan.bad_credit[c as usize] {
            b"BC"
        } else {
            b"GC"
        };
        put(C_CREDIT, row, credit);
        C_CREDIT_LIM.set_money(row, dollars(50_000));
        C_DISCOUNT.set_i32(row, uniform(&mut rng, 0, 5_000) as i32);
        C_BALANCE.set_money(row, -dollars(10));
        C_YTD_PAYMENT.set_money(row, dollars(10));
        C_PAYMENT_CNT.set_i32(row, 1);
        C_DELIVERY_CNT.set_i32(row, 0);
        a_string_into(&mut rng, 300, 500, C_DATA.raw_mut(row));
    }

    fn fill_history(&self, w: u32, d: u32, c: u32, row: &mut [u8]) {
        let mut rng = self.rng(Purpose::History, [w, d, c, 0]);
        row.fill(0);
        H_C_ID.set_u32(row, c);
        H_C_D_ID.set_u32(row, d);
        H_C_W_ID.set_u32(row, w);
        H_D_ID.set_u32(row, d);
        H_W_ID.set_u32(row, w);
        H_DATE.set_i64(row, LOAD_DATE);
        H_AMOUNT.set_money(row, dollars(10));
        a_string_into(&mut rng, 12, 24, H_DATA.raw_mut(row));
    }

    fn fill_order(&self, plan: &DistrictPlan, w: u32, d: u32, o: u32, row: &mut [u8]) {
        let mut rng = self.rng(Purpose::Order, [w, d, o, 0]);
        let at = o as usize - 1;
        row.fill(0);
        O_ID.set_u32(row, o);
        O_D_ID.set_u32(row, d);
        O_W_ID.set_u32(row, w);
        O_C_ID.set_u32(row, plan.customer_of_order[at]);
        O_ENTRY_D.set_i64(row, LOAD_DATE);
        if o <= DELIVERED_ORDERS {
            O_CARRIER_ID.set_u32(row, uniform(&mut rng, 1, 10));
        }
        O_OL_CNT.set_i32(row, plan.ol_cnt[at] as i32);
        O_ALL_LOCAL.set_i32(row, 1);
    }

    fn fill_order_line(&self, w: u32, d: u32, o: u32, ol: u32, row: &mut [u8]) {
        let mut rng = self.rng(Purpose::OrderLine, [w, d, o, ol]);
        row.fill(0);
        OL_O_ID.set_u32(row, o);
        OL_D_ID.set_u32(row, d);
        OL_W_ID.set_u32(row, w);
        OL_NUMBER.set_u32(row, ol);
        OL_I_ID.set_u32(row, uniform(&mut rng, 1, ITEMS));
        OL_SUPPLY_W_ID.set_u32(row, w);
        OL_QUANTITY.set_i32(row, 5);
        if o <= DELIVERED_ORDERS {
            OL_DELIVERY_D.set_i64(row, LOAD_DATE);
        } else {
            OL_AMOUNT.set_money(row, money(&mut rng, 1, dollars(10_000) - 1));
        }
        a_string_into(&mut rng, 24, 24, OL_DIST_INFO.raw_mut(row));
    }

    fn fill_stock(&self, w: u32, i: u32, original: bool, row: &mut [u8]) {
        let mut rng = self.rng(Purpose::Stock, [w, i, 0, 0]);
        row.fill(0);
        S_I_ID.set_u32(row, i);
        S_W_ID.set_u32(row, w);
        S_QUANTITY.set_i32(row, uniform(&mut rng, 10, 100) as i32);
        for dist in S_DIST {
            a_string_into(&mut rng, 24, 24, dist.raw_mut(row));
        }
        fill_data(&mut rng, S_DATA, original, row);
    }

    fn fill_item(&self, i: u32, original: bool, row: &mut [u8]) {
        let mut rng = self.rng(Purpose::Item, [i, 0, 0, 0]);
        row.fill(0);
        I_ID.set_u32(row, i);
        I_IM_ID.set_u32(row, uniform(&mut rng, 1, 10_000));
        a_string_into(&mut rng, 14, 24, I_NAME.raw_mut(row));
        I_PRICE.set_money(row, money(&mut rng, dollars(1), dollars(100)));
        fill_data(&mut rng, I_DATA, original, row);
    }
}

/// What the rows of one district share.
struct DistrictPlan {
    /// C_LAST number (0..=999) of customer c, at `c - 1`.
    last: Vec<u16>,
    /// C_FIRST of customer c, zero-padded, at `c - 1`.
    first: Vec<[u8; 16]>,
    /// Whether customer c has bad credit, at `c`.
    bad_credit: Vec<bool>,
    /// O_C_ID of order o, at `o - 1`: a permutation of the customers.
    customer_of_order: Vec<u32>,
    /// O_OL_CNT of order o, at `o - 1`.
    ol_cnt: Vec<u8>,
}

impl DistrictPlan {
    /// The customers of each last name, sorted by C_FIRST (then C_ID, should two first names
    /// be equal). Zero-padded first names sort as the names do.
    fn last_name_lists(&self) -> Vec<Vec<u32>> {
        let mut lists = vec![Vec::new(); LAST_NAMES as usize];
        for (at, &name) in self.last.iter().enumerate() {
            lists[name as usize].push(at as u32 + 1);
        }
        for list in &mut lists {
            list.sort_by_key(|&c| (self.first[c as usize - 1], c));
        }
        lists
    }
}

/// The generator of `purpose` for the row (or district, warehouse) of `ids`.
fn load_rng(seed: u64, purpose: Purpose, ids: [u32; 4]) -> Rng {
    let mut h = splitmix64(LOAD_STREAMS ^ purpose as u64);
    for id in ids {
        h = splitmix64(h ^ id as u64);
    }
    stream(seed, h)
}

/// Loads the one row of `key`.
fn load_one(
    loader: &mut dyn RowLoader,
    table: TableId,
    key: Key,
    mut fill: impl FnMut(&mut [u8]),
) -> Result<(), QError> {
    loader.load_rows(table, &mut std::iter::once(key), &mut |_, row| fill(row))
}

/// Stores a constant string of the load.
fn put(field: Field, row: &mut [u8], v: &[u8]) {
    field
        .set_bytes(row, v)
        .expect("the load's constants fit their fields");
}

/// Street 1 and 2, city, state and zip: random a-strings of 10..=20 bytes, 2 bytes, and a
/// zip code (clause 4.3.3.1).
fn fill_address(rng: &mut Rng, row: &mut [u8], [street_1, street_2, city, state, zip]: [Field; 5]) {
    a_string_into(rng, 10, 20, street_1.raw_mut(row));
    a_string_into(rng, 10, 20, street_2.raw_mut(row));
    a_string_into(rng, 10, 20, city.raw_mut(row));
    a_string_into(rng, 2, 2, state.raw_mut(row));
    zip_into(rng, zip.raw_mut(row));
}

/// I_DATA or S_DATA: a random a-string of 26..=50 bytes, holding "ORIGINAL" if `original`.
fn fill_data(rng: &mut Rng, data: Field, original: bool, row: &mut [u8]) {
    let len = a_string_into(rng, 26, 50, data.raw_mut(row));
    if original {
        put_original(rng, &mut data.raw_mut(row)[..len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemStore;
    use crate::tpcc::random::{last_name, ORIGINAL};
    use qstore_core::config::Partitioning;
    use qstore_core::partition::PartitionMap;
    use std::collections::{BTreeMap, BTreeSet};
    use std::hash::{DefaultHasher, Hash, Hasher};
    use std::sync::OnceLock;

    fn data(partitions: u32, wpp: u32, seed: u64) -> TpccData {
        let cfg = TpccConfig {
            warehouses_per_partition: wpp,
            ..TpccConfig::default()
        };
        TpccData::with(&cfg, partitions, seed)
    }

    /// Partition `p` of `d` loaded into memory.
    fn loaded(d: &TpccData, p: u32) -> MemStore {
        let mut m = MemStore::new(&d.schemas());
        d.load(PartitionId(p), &mut m).unwrap();
        m
    }

    /// Partition 1 of 3, one warehouse per partition: warehouse 1.
    fn one_warehouse() -> &'static (TpccData, MemStore) {
        static LOADED: OnceLock<(TpccData, MemStore)> = OnceLock::new();
        LOADED.get_or_init(|| {
            let d = data(3, 1, 42);
            let m = loaded(&d, 1);
            (d, m)
        })
    }

    /// Partition 1 of 3, two warehouses per partition: warehouses 2 and 3.
    fn two_warehouses() -> &'static (TpccData, MemStore) {
        static LOADED: OnceLock<(TpccData, MemStore)> = OnceLock::new();
        LOADED.get_or_init(|| {
            let d = data(3, 2, 42);
            let m = loaded(&d, 1);
            (d, m)
        })
    }

    /// The spec's row counts for the partition's warehouses, every key in the partition and
    /// every row of one of its warehouses.
    fn check_counts(d: &TpccData, m: &MemStore, p: u32) {
        let k = d.keys();
        let w = k.warehouses_per_partition() as usize;
        let expect = [
            (WAREHOUSE, w),
            (DISTRICT, 10 * w),
            (CUSTOMER, 30_000 * w),
            (HISTORY, 30_000 * w),
            (NEW_ORDER, 9_000 * w),
            (ORDER, 30_000 * w),
            (ITEM, 100_000),
            (STOCK, 100_000 * w),
            (CUSTOMER_BY_LAST_NAME, 10_000 * w),
            (CUSTOMER_LAST_ORDER, 30_000 * w),
            (NEW_ORDER_HEAD, 10 * w),
        ];
        for (t, n) in expect {
            assert_eq!(m.len(t), n, "table {t}");
        }
        let lines: i64 = m.rows(ORDER).map(|(_, r)| O_OL_CNT.get_i32(r) as i64).sum();
        assert_eq!(m.len(ORDER_LINE) as i64, lines);
        let pmap = PartitionMap::new(k.partitions(), Partitioning::Range, &d.schemas());
        let ours = k.warehouses_of(PartitionId(p));
        for t in 0..TABLES as TableId {
            for (key, row) in m.rows(t) {
                assert_eq!(pmap.partition_of(t, key), PartitionId(p));
                let w = match t {
                    WAREHOUSE => W_ID.get_u32(row),
                    DISTRICT => D_W_ID.get_u32(row),
                    CUSTOMER => C_W_ID.get_u32(row),
                    HISTORY => H_W_ID.get_u32(row),
                    NEW_ORDER => NO_W_ID.get_u32(row),
                    ORDER => O_W_ID.get_u32(row),
                    ORDER_LINE => OL_W_ID.get_u32(row),
                    STOCK => S_W_ID.get_u32(row),
                    _ => ours.start,
                };
                assert!(ours.contains(&w), "table {t} key {key:#x}: warehouse {w}");
            }
        }
    }

    /// TPC-C's consistency conditions (clause 3.3.2.1 to 3.3.2.12) on warehouse `w`.
    fn check_consistency(k: &TpccKeys, m: &MemStore, w: u32) {
        let last_o = k.max_orders();
        let mut d_ytd = 0;
        let mut w_history = 0;
        for d in 1..=DISTRICTS {
            let district = m.get(DISTRICT, k.district(w, d));
            d_ytd += D_YTD.get_money(district);
            let orders = m.range(ORDER, k.order(w, d, 1), k.order(w, d, last_o));
            let new_orders = m.range(NEW_ORDER, k.new_order(w, d, 1), k.new_order(w, d, last_o));
            let lines = m.range(
                ORDER_LINE,
                k.order_line(w, d, 1, 1),
                k.order_line(w, d, last_o, MAX_OL_CNT),
            );
            let max_o = orders.iter().map(|r| O_ID.get_u32(r)).max().unwrap();
            let no: BTreeSet<u32> = new_orders.iter().map(|r| NO_O_ID.get_u32(r)).collect();
            let (min_no, max_no) = (*no.first().unwrap(), *no.last().unwrap());
            // 2: D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID).
            assert_eq!(D_NEXT_O_ID.get_u32(district) - 1, max_o);
            assert_eq!(max_no, max_o);
            let head = m.get(NEW_ORDER_HEAD, k.district(w, d));
            assert_eq!(NOH_O_ID.get_u32(head), min_no);
            // 3: max(NO_O_ID) - min(NO_O_ID) + 1 = rows of NEW-ORDER.
            assert_eq!((max_no - min_no + 1) as usize, new_orders.len());
            // 4: sum(O_OL_CNT) = rows of ORDER-LINE.
            let ol_cnt: i64 = orders.iter().map(|r| O_OL_CNT.get_i32(r) as i64).sum();
            assert_eq!(ol_cnt as usize, lines.len());
            // 11: rows of ORDER - rows of NEW-ORDER = 2100 (at load).
            assert_eq!(orders.len() - new_orders.len(), DELIVERED_ORDERS as usize);
            let mut lines_of: BTreeMap<u32, Vec<&[u8]>> = BTreeMap::new();
            for l in &lines {
                assert_eq!((OL_W_ID.get_u32(l), OL_D_ID.get_u32(l)), (w, d));
                lines_of.entry(OL_O_ID.get_u32(l)).or_default().push(l);
            }
            let mut latest = vec![0u32; CUSTOMERS as usize + 1];
            for o in &orders {
                let c = O_C_ID.get_u32(o) as usize;
                latest[c] = latest[c].max(O_ID.get_u32(o));
            }
            for c in 1..=CUSTOMERS {
                let row = m.get(CUSTOMER_LAST_ORDER, k.customer(w, d, c));
                assert_eq!(CO_O_ID.get_u32(row), latest[c as usize], "customer {c}");
            }
            let mut delivered_amount = vec![0i64; CUSTOMERS as usize + 1];
            for o in &orders {
                let id = O_ID.get_u32(o);
                let undelivered = O_CARRIER_ID.get_u32(o) == 0;
                // 5: O_CARRIER_ID is null exactly for new orders.
                assert_eq!(undelivered, no.contains(&id), "order {id}");
                // 6: O_OL_CNT = the order's lines.
                let its = &lines_of[&id];
                assert_eq!(O_OL_CNT.get_i32(o) as usize, its.len());
                for l in its {
                    // 7: OL_DELIVERY_D is null exactly when O_CARRIER_ID is.
                    assert_eq!(OL_DELIVERY_D.get_i64(l) == 0, undelivered);
                    if !undelivered {
                        delivered_amount[O_C_ID.get_u32(o) as usize] += OL_AMOUNT.get_money(l);
                    }
                }
            }
            let history = m.range(
                HISTORY,
                k.history(w, d, 1, 1),
                k.history(w, d, CUSTOMERS, last_o),
            );
            let mut paid = vec![0i64; CUSTOMERS as usize + 1];
            for h in &history {
                assert_eq!((H_W_ID.get_u32(h), H_D_ID.get_u32(h)), (w, d));
                paid[H_C_ID.get_u32(h) as usize] += H_AMOUNT.get_money(h);
            }
            // 9: D_YTD = sum(H_AMOUNT) of the district.
            let d_history: i64 = paid.iter().sum();
            assert_eq!(D_YTD.get_money(district), d_history);
            w_history += d_history;
            for c in m.range(CUSTOMER, k.customer(w, d, 1), k.customer(w, d, CUSTOMERS)) {
                let id = C_ID.get_u32(c) as usize;
                let balance = C_BALANCE.get_money(c);
                // 10: C_BALANCE = delivered OL_AMOUNT - H_AMOUNT of the customer.
                assert_eq!(balance, delivered_amount[id] - paid[id], "customer {id}");
                // 12: C_BALANCE + C_YTD_PAYMENT = delivered OL_AMOUNT.
                assert_eq!(balance + C_YTD_PAYMENT.get_money(c), delivered_amount[id]);
            }
        }
        let w_ytd = W_YTD.get_money(m.get(WAREHOUSE, k.warehouse(w)));
        // 1: W_YTD = sum(D_YTD); 8: W_YTD = sum(H_AMOUNT) of the warehouse.
        assert_eq!(w_ytd, d_ytd);
        assert_eq!(w_ytd, w_history);
    }

    /// Values the spec fixes for the load (clause 4.3.3.1), for warehouse `w`.
    fn check_values(k: &TpccKeys, m: &MemStore, w: u32) {
        let last_o = k.max_orders();
        for d in 1..=DISTRICTS {
            let district = m.get(DISTRICT, k.district(w, d));
            assert_eq!(D_NEXT_O_ID.get_u32(district), 3_001);
            assert_eq!(D_NEXT_H_ID.get_u32(district), 3_001);
            let (lo, hi) = (k.order_line(w, d, 1, 1), k.order_line(w, d, 3_000, 15));
            let lines = m.range(ORDER_LINE, lo, hi).len() as u32;
            assert_eq!(D_ORDER_LINES.get_u32(district), lines);
            assert!((0..=2_000).contains(&D_TAX.get_i32(district)));
            let no: Vec<u32> = m
                .range(NEW_ORDER, k.new_order(w, d, 1), k.new_order(w, d, last_o))
                .iter()
                .map(|r| NO_O_ID.get_u32(r))
                .collect();
            assert_eq!(no, (2_101..=3_000).collect::<Vec<_>>());
            let orders = m.range(ORDER, k.order(w, d, 1), k.order(w, d, last_o));
            let mut who: Vec<u32> = orders.iter().map(|r| O_C_ID.get_u32(r)).collect();
            assert_ne!(who[..5], [1, 2, 3, 4, 5], "customers are permuted");
            who.sort_unstable();
            assert_eq!(who, (1..=CUSTOMERS).collect::<Vec<_>>());
            for o in &orders {
                assert!((5..=15).contains(&O_OL_CNT.get_i32(o)));
                let carrier = O_CARRIER_ID.get_u32(o);
                assert_eq!(carrier == 0, O_ID.get_u32(o) > DELIVERED_ORDERS);
                assert!(carrier <= 10);
            }
            let lines = m.range(
                ORDER_LINE,
                k.order_line(w, d, 1, 1),
                k.order_line(w, d, last_o, MAX_OL_CNT),
            );
            for l in lines {
                let amount = OL_AMOUNT.get_money(l);
                match OL_O_ID.get_u32(l) {
                    ..=DELIVERED_ORDERS => assert_eq!(amount, 0),
                    _ => assert!((1..dollars(10_000)).contains(&amount)),
                }
                assert!((1..=ITEMS).contains(&OL_I_ID.get_u32(l)));
                assert_eq!(OL_DIST_INFO.get_bytes(l).len(), 24);
            }
            let customers = m.range(CUSTOMER, k.customer(w, d, 1), k.customer(w, d, CUSTOMERS));
            let mut bad = 0;
            for c in customers {
                let id = C_ID.get_u32(c);
                let last = C_LAST.get_bytes(c);
                if id <= 1_000 {
                    assert_eq!(last, last_name(id - 1).as_bytes());
                }
                assert!((8..=16).contains(&C_FIRST.get_bytes(c).len()));
                assert!((300..=500).contains(&C_DATA.get_bytes(c).len()));
                assert_eq!(C_MIDDLE.get_bytes(c), b"OE");
                assert!((0..=5_000).contains(&C_DISCOUNT.get_i32(c)));
                assert_eq!(&C_ZIP.get_bytes(c)[4..], b"11111");
                bad += (C_CREDIT.get_bytes(c) == b"BC") as u32;
            }
            assert_eq!(bad, 300, "10% of customers have bad credit");
        }
        let originals = |t: TableId, f: Field| {
            m.rows(t)
                .filter(|(_, r)| f.get_bytes(r).windows(8).any(|s| s == ORIGINAL))
                .count()
        };
        assert_eq!(originals(ITEM, I_DATA), 10_000);
        let stock = m.range(STOCK, k.stock(w, 1), k.stock(w, ITEMS));
        let original_stock = stock
            .iter()
            .filter(|r| S_DATA.get_bytes(r).windows(8).any(|s| s == ORIGINAL))
            .count();
        assert_eq!(original_stock, 10_000);
    }

    /// Every customer of the district under exactly its last name, sorted by C_FIRST; the
    /// longest list.
    fn check_last_names(k: &TpccKeys, m: &MemStore, w: u32) -> usize {
        let mut longest = 0;
        for d in 1..=DISTRICTS {
            let mut by_name: BTreeMap<Vec<u8>, Vec<(Vec<u8>, u32)>> = BTreeMap::new();
            for c in m.range(CUSTOMER, k.customer(w, d, 1), k.customer(w, d, CUSTOMERS)) {
                let first = C_FIRST.get_bytes(c).to_vec();
                by_name
                    .entry(C_LAST.get_bytes(c).to_vec())
                    .or_default()
                    .push((first, C_ID.get_u32(c)));
            }
            assert_eq!(
                by_name.len(),
                LAST_NAMES as usize,
                "every name is someone's"
            );
            for n in 0..LAST_NAMES {
                let row = m.get(CUSTOMER_BY_LAST_NAME, k.customer_by_last_name(w, d, n));
                let listed: Vec<u32> = cl_customers(row).collect();
                let mut want = by_name[last_name(n).as_bytes()].clone();
                want.sort();
                let want: Vec<u32> = want.into_iter().map(|(_, c)| c).collect();
                assert_eq!(listed, want, "w {w} d {d} name {n}");
                longest = longest.max(listed.len());
            }
        }
        longest
    }

    #[test]
    fn one_warehouse_per_partition_loads_the_specs_rows() {
        let (d, m) = one_warehouse();
        assert_eq!(d.keys().warehouses_of(PartitionId(1)), 1..2);
        check_counts(d, m, 1);
        check_values(d.keys(), m, 1);
    }

    #[test]
    fn two_warehouses_per_partition_load_the_specs_rows() {
        let (d, m) = two_warehouses();
        assert_eq!(d.keys().warehouses_of(PartitionId(1)), 2..4);
        check_counts(d, m, 1);
        for w in 2..4 {
            check_values(d.keys(), m, w);
        }
    }

    #[test]
    fn loaded_data_meets_the_consistency_conditions() {
        let (d, m) = one_warehouse();
        check_consistency(d.keys(), m, 1);
        let (d, m) = two_warehouses();
        for w in 2..4 {
            check_consistency(d.keys(), m, w);
        }
    }

    /// The cap of CUSTOMER_BY_LAST_NAME holds with room to spare for the generated data.
    #[test]
    fn customers_by_last_name_are_exactly_those_of_the_name_sorted_by_first_name() {
        let (d, m) = one_warehouse();
        let mut longest = check_last_names(d.keys(), m, 1);
        let (d, m) = two_warehouses();
        for w in 2..4 {
            longest = longest.max(check_last_names(d.keys(), m, w));
        }
        assert!((40..=90).contains(&longest), "longest list {longest}");
        assert!(longest <= MAX_CUSTOMERS_PER_LAST_NAME);
    }

    /// Many districts' plans, to measure the longest last-name list against the cap.
    #[test]
    fn last_name_lists_stay_well_under_the_cap() {
        let d = data(64, 1, 7);
        let longest = (0..64)
            .flat_map(|w| (1..=DISTRICTS).map(move |dd| (w, dd)))
            .map(|(w, dd)| d.plan(w, dd).last_name_lists().iter().map(Vec::len).max())
            .max()
            .flatten()
            .unwrap();
        assert!(longest < MAX_CUSTOMERS_PER_LAST_NAME * 3 / 4, "{longest}");
    }

    /// Order-independent hash of a loader's rows.
    #[derive(Default)]
    struct HashLoader {
        rows: u64,
        sum: u64,
    }

    impl RowLoader for HashLoader {
        fn load_rows(
            &mut self,
            table: TableId,
            keys: &mut dyn Iterator<Item = Key>,
            fill: &mut dyn FnMut(Key, &mut [u8]),
        ) -> Result<(), QError> {
            let mut row = [0u8; 1024];
            for key in keys {
                fill(key, &mut row);
                let mut h = DefaultHasher::new();
                (table, key, row).hash(&mut h);
                self.sum = self.sum.wrapping_add(h.finish());
                self.rows += 1;
            }
            Ok(())
        }
    }

    fn district_hash(d: &TpccData, w: u32, dd: u32) -> (u64, u64) {
        let mut h = HashLoader::default();
        d.load_district(w, dd, &mut h).unwrap();
        (h.rows, h.sum)
    }

    #[test]
    fn the_load_is_deterministic_for_a_seed() {
        let a = district_hash(&data(3, 1, 42), 1, 4);
        assert_eq!(a, district_hash(&data(3, 1, 42), 1, 4));
        // The same warehouse whatever the layout around it.
        assert_eq!(a, district_hash(&data(1, 2, 42), 1, 4));
        let other = district_hash(&data(3, 1, 43), 1, 4);
        assert_ne!(a.1, other.1, "another seed, other rows");
        assert_ne!(a.1, district_hash(&data(3, 1, 42), 2, 4).1);
        // And the rows as stored: warehouse 1 of the one-warehouse load, table by table.
        let (_, m) = one_warehouse();
        let d = data(1, 2, 42);
        let mut again = MemStore::new(&d.schemas());
        d.load_warehouse(1, &mut again).unwrap();
        for t in 0..TABLES as TableId {
            if t != ITEM {
                assert!(m.rows(t).eq(again.rows(t)), "table {t}");
            }
        }
    }

    #[test]
    fn every_partition_holds_the_same_items() {
        let d = data(3, 1, 42);
        let items = |p: u32| {
            let mut m = MemStore::new(&d.schemas());
            d.load_items(PartitionId(p), &mut m).unwrap();
            m.rows(ITEM)
                .map(|(key, row)| (d.keys().decode_item(key).1, row.to_vec()))
                .collect::<Vec<_>>()
        };
        let first = items(0);
        assert_eq!(first.len(), ITEMS as usize);
        assert_eq!(first, items(2));
        let (_, m) = one_warehouse();
        assert!(first
            .iter()
            .map(|(_, r)| r.as_slice())
            .eq(m.rows(ITEM).map(|(_, r)| r)));
        for (i, row) in &first {
            assert_eq!(I_ID.get_u32(row), *i);
            assert!((dollars(1)..=dollars(100)).contains(&I_PRICE.get_money(row)));
            assert!((1..=10_000).contains(&I_IM_ID.get_u32(row)));
        }
    }

    #[test]
    fn partitioned_items_are_each_kept_once_with_the_replicated_rows() {
        let cfg = TpccConfig {
            items: qstore_core::config::ItemPlacement::Partitioned,
            ..TpccConfig::default()
        };
        let d = TpccData::with(&cfg, 3, 42);
        let replicated = data(3, 1, 42);
        let all: BTreeMap<u32, Vec<u8>> = {
            let mut m = MemStore::new(&replicated.schemas());
            replicated.load_items(PartitionId(0), &mut m).unwrap();
            m.rows(ITEM)
                .map(|(key, row)| (replicated.keys().decode_item(key).1, row.to_vec()))
                .collect()
        };
        let mut seen = BTreeMap::new();
        for p in 0..3 {
            let mut m = MemStore::new(&d.schemas());
            d.load_items(PartitionId(p), &mut m).unwrap();
            for (key, row) in m.rows(ITEM) {
                let (at, i) = d.keys().decode_item(key);
                assert_eq!((at.0, i % 3), (p, p), "item {i} in its own partition");
                assert_eq!(d.keys().item_home(PartitionId(2 - p), i), at);
                assert!(seen.insert(i, row.to_vec()).is_none(), "item {i} twice");
            }
        }
        assert_eq!(seen, all, "every item once, as the replicated load has it");
    }

    #[test]
    fn run_constants_differ_from_the_loads_by_the_delta_rule() {
        let d = data(3, 1, 42);
        let (load, run) = (d.nurand_load(), d.nurand_run());
        assert!(NuRandC::c_last_delta_ok(load.c_last, run.c_last));
        assert_eq!(run, data(2, 4, 42).nurand_run(), "one per seed");
    }

    #[test]
    fn a_partition_outside_the_cluster_is_an_error() {
        let d = data(3, 1, 42);
        let mut h = HashLoader::default();
        let e = d.load(PartitionId(3), &mut h).unwrap_err();
        assert!(e.to_string().contains("no partition p3"), "{e}");
        assert_eq!(h.rows, 0);
    }

    #[test]
    fn data_comes_from_a_validated_run_configuration() {
        let mut run = RunConfig::default();
        run.workload.name = "tpcc".into();
        run.cluster.nodes = 2;
        run.workload.tpcc.warehouses_per_partition = 3;
        let d = TpccData::new(&run).unwrap();
        assert_eq!(d.keys().warehouses(), 6);
        assert_eq!(d.schemas().len(), TABLES);
        run.cluster.partitioning = Partitioning::Hash;
        assert_eq!(
            TpccData::new(&run).unwrap_err().setting,
            "cluster.partitioning"
        );
    }
}
