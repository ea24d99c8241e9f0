//! Primary keys of the TPC-C tables, packed into `u64`s so that range partitioning keeps a
//! warehouse whole.
//!
//! Every key of a per-warehouse table is `w << b | local`, where `local < 2^b` packs the rest
//! of the primary key into `b` bits (the table's *space per warehouse*, `2^b` keys). The
//! table's range width is then `warehouses_per_partition << b`, so `key / width =
//! w / warehouses_per_partition`: every row of warehouse `w` is in the partition holding
//! `w`. Warehouses are numbered `0..W` over the cluster; the other ids are the spec's,
//! numbered from 1. The fields, from the most significant down (`O` is the number of
//! order-id bits, enough for `max_orders_per_district`: 16 by default):
//!
//! | table | fields (bits) | b |
//! | --- | --- | --- |
//! | WAREHOUSE | w | 0 |
//! | DISTRICT | w, d (4) | 4 |
//! | CUSTOMER | w, d (4), c (12) | 16 |
//! | HISTORY | w, d (4), c (12), h (O) | 16 + O |
//! | NEW-ORDER, ORDER | w, d (4), o (O) | 4 + O |
//! | ORDER-LINE | w, d (4), o (O), ol (4) | 8 + O |
//! | STOCK | w, i (17) | 17 |
//! | CUSTOMER_BY_LAST_NAME | w, d (4), last-name number (10) | 14 |
//! | CUSTOMER_LAST_ORDER | w, d (4), c (12) (the customer's key) | 16 |
//! | NEW_ORDER_HEAD | w, d (4) (the district's key) | 4 |
//! | ITEM | p, i (17) | 17 per partition |
//!
//! Within a district, ORDER, NEW-ORDER and ORDER-LINE keys sort by order id (then line
//! number), so the oldest new order of a district, a customer's latest order and the lines of
//! the last 20 orders are ranges of keys. HISTORY rows have no key in the spec and are only
//! ever inserted: their (w, d) are the district that took the payment (H_W_ID, H_D_ID), `c`
//! is the paying customer's id (H_C_ID, whose warehouse may be another) and `h` the
//! district's history sequence number (from `D_NEXT_H_ID`, bounded like order ids), which
//! alone makes the key unique.
//!
//! ITEM is read-only and read by every New-Order, so by default each partition holds a copy
//! under keys of its own (`p << 17 | i`): a transaction reads its home partition's copy,
//! locally. Partitioned instead (`items = "partitioned"`), item `i` is kept only by partition
//! `i mod P`, under the same key encoding.
//!
//! The plain encoders `debug_assert` their inputs: callers pass ids they made. Ids that come
//! from a client go through the `checked_*` encoders, which return a [`KeyError`].

use qstore_core::config::{ItemPlacement, TpccConfig};
use qstore_core::{Key, PartitionId};
use std::fmt;
use std::ops::Range;

/// Districts per warehouse.
pub const DISTRICTS: u32 = 10;
/// Customers per district.
pub const CUSTOMERS: u32 = 3_000;
/// Items (and stock rows per warehouse).
pub const ITEMS: u32 = 100_000;
/// Lines an order has at most.
pub const MAX_OL_CNT: u32 = 15;
/// Distinct last names: numbers 0..=999 spelled with three syllables.
pub const LAST_NAMES: u32 = 1_000;
/// Orders per district after the load.
pub const INITIAL_ORDERS: u32 = TpccConfig::INITIAL_ORDERS;
/// Orders 1..=2100 of each district are loaded delivered; 2101..=3000 are new orders.
pub const DELIVERED_ORDERS: u32 = 2_100;

/// Key bits of each field.
pub const DISTRICT_BITS: u32 = 4;
pub const CUSTOMER_BITS: u32 = 12;
pub const ORDER_LINE_BITS: u32 = 4;
pub const ITEM_BITS: u32 = 17;
pub const LAST_NAME_BITS: u32 = 10;

const _: () = assert!(DISTRICTS < 1 << DISTRICT_BITS);
const _: () = assert!(CUSTOMERS < 1 << CUSTOMER_BITS);
const _: () = assert!(MAX_OL_CNT < 1 << ORDER_LINE_BITS);
const _: () = assert!(ITEMS < 1 << ITEM_BITS);
const _: () = assert!(LAST_NAMES <= 1 << LAST_NAME_BITS);
const _: () = assert!(DISTRICT_BITS + CUSTOMER_BITS == TpccConfig::HISTORY_FIXED_BITS);

/// An id out of its range, from a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyError {
    /// The TPC-C column the id is for, e.g. `C_ID`.
    pub field: &'static str,
    pub value: i64,
    pub min: u64,
    pub max: u64,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {} is out of range: must be between {} and {}",
            self.field, self.value, self.min, self.max
        )
    }
}

impl std::error::Error for KeyError {}

/// The key encodings of one configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpccKeys {
    partitions: u32,
    warehouses_per_partition: u32,
    max_orders: u32,
    order_bits: u32,
    items: ItemPlacement,
}

impl TpccKeys {
    /// The encodings for `partitions` partitions of `cfg`, which must be valid
    /// ([`TpccConfig::validate`] checks that every key fits).
    pub fn new(cfg: &TpccConfig, partitions: u32) -> Self {
        let keys = TpccKeys {
            partitions,
            warehouses_per_partition: cfg.warehouses_per_partition,
            max_orders: cfg.max_orders_per_district,
            order_bits: cfg.order_id_bits(),
            items: cfg.items,
        };
        assert!(
            partitions > 0 && keys.warehouses_per_partition > 0,
            "a validated configuration has warehouses"
        );
        assert!(
            (keys.warehouses() as u128) << keys.history_bits() <= qstore_core::MAX_KEY as u128 + 1,
            "a validated configuration's keys fit 64 bits"
        );
        keys
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    pub fn warehouses_per_partition(&self) -> u32 {
        self.warehouses_per_partition
    }

    /// Warehouses in the cluster (W).
    pub fn warehouses(&self) -> u32 {
        self.partitions * self.warehouses_per_partition
    }

    /// Largest order id (and history sequence number) of a district.
    pub fn max_orders(&self) -> u32 {
        self.max_orders
    }

    /// Bits of the order-id field.
    pub fn order_bits(&self) -> u32 {
        self.order_bits
    }

    /// The partition holding warehouse `w`.
    pub fn partition_of_warehouse(&self, w: u32) -> PartitionId {
        debug_assert!(w < self.warehouses(), "warehouse {w}");
        PartitionId(w / self.warehouses_per_partition)
    }

    /// The warehouses partition `p` holds.
    pub fn warehouses_of(&self, p: PartitionId) -> Range<u32> {
        debug_assert!(p.0 < self.partitions, "{p}");
        let first = p.0 * self.warehouses_per_partition;
        first..first + self.warehouses_per_partition
    }

    // Bits of each table's space per warehouse.

    pub const fn district_bits(&self) -> u32 {
        DISTRICT_BITS
    }

    pub const fn customer_bits(&self) -> u32 {
        DISTRICT_BITS + CUSTOMER_BITS
    }

    pub const fn history_bits(&self) -> u32 {
        DISTRICT_BITS + CUSTOMER_BITS + self.order_bits
    }

    pub const fn order_bits_per_warehouse(&self) -> u32 {
        DISTRICT_BITS + self.order_bits
    }

    pub const fn order_line_bits(&self) -> u32 {
        DISTRICT_BITS + self.order_bits + ORDER_LINE_BITS
    }

    pub const fn stock_bits(&self) -> u32 {
        ITEM_BITS
    }

    pub const fn last_name_bits(&self) -> u32 {
        DISTRICT_BITS + LAST_NAME_BITS
    }

    /// Range width (`keys_per_partition`) of a per-warehouse table of `bits` bits.
    pub fn width(&self, bits: u32) -> u64 {
        (self.warehouses_per_partition as u64) << bits
    }

    /// Range width of ITEM: one copy of every item per partition.
    pub fn item_width(&self) -> u64 {
        1 << ITEM_BITS
    }

    #[inline]
    fn debug_check(&self, w: u32, d: u32) {
        debug_assert!(w < self.warehouses(), "W_ID {w}");
        debug_assert!((1..=DISTRICTS).contains(&d), "D_ID {d}");
    }

    #[inline]
    fn wd(&self, w: u32, d: u32) -> u64 {
        self.debug_check(w, d);
        (w as u64) << DISTRICT_BITS | d as u64
    }

    #[inline]
    fn wdo(&self, w: u32, d: u32, o: u32) -> u64 {
        debug_assert!((1..=self.max_orders).contains(&o), "O_ID {o}");
        self.wd(w, d) << self.order_bits | o as u64
    }

    // Encoders.

    #[inline]
    pub fn warehouse(&self, w: u32) -> Key {
        debug_assert!(w < self.warehouses(), "W_ID {w}");
        w as u64
    }

    #[inline]
    pub fn district(&self, w: u32, d: u32) -> Key {
        self.wd(w, d)
    }

    #[inline]
    pub fn customer(&self, w: u32, d: u32, c: u32) -> Key {
        debug_assert!((1..=CUSTOMERS).contains(&c), "C_ID {c}");
        self.wd(w, d) << CUSTOMER_BITS | c as u64
    }

    /// The HISTORY row of customer `c` of district (w, d), the `h`-th history row of the
    /// district.
    #[inline]
    pub fn history(&self, w: u32, d: u32, c: u32, h: u32) -> Key {
        debug_assert!((1..=self.max_orders).contains(&h), "history sequence {h}");
        self.customer(w, d, c) << self.order_bits | h as u64
    }

    #[inline]
    pub fn new_order(&self, w: u32, d: u32, o: u32) -> Key {
        self.wdo(w, d, o)
    }

    #[inline]
    pub fn order(&self, w: u32, d: u32, o: u32) -> Key {
        self.wdo(w, d, o)
    }

    #[inline]
    pub fn order_line(&self, w: u32, d: u32, o: u32, ol: u32) -> Key {
        debug_assert!((1..=MAX_OL_CNT).contains(&ol), "OL_NUMBER {ol}");
        self.wdo(w, d, o) << ORDER_LINE_BITS | ol as u64
    }

    #[inline]
    pub fn stock(&self, w: u32, i: u32) -> Key {
        debug_assert!(w < self.warehouses(), "W_ID {w}");
        debug_assert!((1..=ITEMS).contains(&i), "I_ID {i}");
        (w as u64) << ITEM_BITS | i as u64
    }

    /// The partition whose copy of item `i` a transaction of partition `home` reads: its own
    /// where ITEM is replicated, `i mod P` where it is partitioned.
    #[inline]
    pub fn item_home(&self, home: PartitionId, i: u32) -> PartitionId {
        match self.items {
            ItemPlacement::Replicated => home,
            ItemPlacement::Partitioned => PartitionId(i % self.partitions),
        }
    }

    /// Whether partition `p` keeps a copy of item `i`.
    pub fn keeps_item(&self, p: PartitionId, i: u32) -> bool {
        self.item_home(p, i) == p
    }

    /// Partition `p`'s copy of item `i`.
    #[inline]
    pub fn item(&self, p: PartitionId, i: u32) -> Key {
        debug_assert!(p.0 < self.partitions, "{p}");
        debug_assert!((1..=ITEMS).contains(&i), "I_ID {i}");
        (p.0 as u64) << ITEM_BITS | i as u64
    }

    /// The CUSTOMER_BY_LAST_NAME row of last name `name` (0..=999) in district (w, d).
    #[inline]
    pub fn customer_by_last_name(&self, w: u32, d: u32, name: u32) -> Key {
        debug_assert!(name < LAST_NAMES, "last name {name}");
        self.wd(w, d) << LAST_NAME_BITS | name as u64
    }

    // Bases of derived ranges (see `qstore_core::txn::KeyDep`): keys New-Order and Payment
    // insert are a base plus an id the transaction reads (D_NEXT_O_ID, D_NEXT_H_ID).

    /// ORDER and NEW-ORDER keys of district (w, d): this base plus the order id.
    #[inline]
    pub fn order_base(&self, w: u32, d: u32) -> Key {
        self.wd(w, d) << self.order_bits
    }

    /// ORDER-LINE keys of line `ol` of district (w, d)'s orders: this base plus the order id
    /// times [`Self::ORDER_LINE_SCALE`].
    #[inline]
    pub fn order_line_base(&self, w: u32, d: u32, ol: u32) -> Key {
        debug_assert!((1..=MAX_OL_CNT).contains(&ol), "OL_NUMBER {ol}");
        self.order_base(w, d) << ORDER_LINE_BITS | ol as u64
    }

    pub const ORDER_LINE_SCALE: u32 = 1 << ORDER_LINE_BITS;

    /// HISTORY keys of customer `c` of district (w, d): this base plus the sequence number.
    #[inline]
    pub fn history_base(&self, w: u32, d: u32, c: u32) -> Key {
        self.customer(w, d, c) << self.order_bits
    }

    // Decoders: the ids a key encodes (for keys these encoders made).

    #[inline]
    fn field(key: u64, shift: u32, bits: u32) -> u32 {
        ((key >> shift) & ((1u64 << bits) - 1)) as u32
    }

    #[inline]
    fn split_wd(key: u64) -> (u32, u32) {
        (
            (key >> DISTRICT_BITS) as u32,
            Self::field(key, 0, DISTRICT_BITS),
        )
    }

    /// (w, d).
    pub fn decode_district(&self, key: Key) -> (u32, u32) {
        Self::split_wd(key)
    }

    /// (w, d, c).
    pub fn decode_customer(&self, key: Key) -> (u32, u32, u32) {
        let (w, d) = Self::split_wd(key >> CUSTOMER_BITS);
        (w, d, Self::field(key, 0, CUSTOMER_BITS))
    }

    /// (w, d, c, h).
    pub fn decode_history(&self, key: Key) -> (u32, u32, u32, u32) {
        let (w, d, c) = self.decode_customer(key >> self.order_bits);
        (w, d, c, Self::field(key, 0, self.order_bits))
    }

    /// (w, d, o), of an ORDER or NEW-ORDER key.
    pub fn decode_order(&self, key: Key) -> (u32, u32, u32) {
        let (w, d) = Self::split_wd(key >> self.order_bits);
        (w, d, Self::field(key, 0, self.order_bits))
    }

    /// (w, d, o, ol).
    pub fn decode_order_line(&self, key: Key) -> (u32, u32, u32, u32) {
        let (w, d, o) = self.decode_order(key >> ORDER_LINE_BITS);
        (w, d, o, Self::field(key, 0, ORDER_LINE_BITS))
    }

    /// (w, i).
    pub fn decode_stock(&self, key: Key) -> (u32, u32) {
        ((key >> ITEM_BITS) as u32, Self::field(key, 0, ITEM_BITS))
    }

    /// (partition of the copy, i).
    pub fn decode_item(&self, key: Key) -> (PartitionId, u32) {
        (
            PartitionId((key >> ITEM_BITS) as u32),
            Self::field(key, 0, ITEM_BITS),
        )
    }

    /// (w, d, last-name number).
    pub fn decode_customer_by_last_name(&self, key: Key) -> (u32, u32, u32) {
        let (w, d) = Self::split_wd(key >> LAST_NAME_BITS);
        (w, d, Self::field(key, 0, LAST_NAME_BITS))
    }

    // Checked encoders, for ids from clients.

    /// `v` as an id in `min..=max`, or the error naming `field`.
    pub fn check_id(field: &'static str, v: i64, min: u32, max: u32) -> Result<u32, KeyError> {
        match u32::try_from(v) {
            Ok(id) if (min..=max).contains(&id) => Ok(id),
            _ => Err(KeyError {
                field,
                value: v,
                min: min as u64,
                max: max as u64,
            }),
        }
    }

    pub fn check_warehouse(&self, w: i64) -> Result<u32, KeyError> {
        Self::check_id("W_ID", w, 0, self.warehouses() - 1)
    }

    pub fn check_district(&self, d: i64) -> Result<u32, KeyError> {
        Self::check_id("D_ID", d, 1, DISTRICTS)
    }

    pub fn check_customer(&self, c: i64) -> Result<u32, KeyError> {
        Self::check_id("C_ID", c, 1, CUSTOMERS)
    }

    pub fn check_order(&self, o: i64) -> Result<u32, KeyError> {
        Self::check_id("O_ID", o, 1, self.max_orders)
    }

    pub fn check_item(&self, i: i64) -> Result<u32, KeyError> {
        Self::check_id("I_ID", i, 1, ITEMS)
    }

    pub fn checked_warehouse(&self, w: i64) -> Result<Key, KeyError> {
        Ok(self.warehouse(self.check_warehouse(w)?))
    }

    pub fn checked_district(&self, w: i64, d: i64) -> Result<Key, KeyError> {
        Ok(self.district(self.check_warehouse(w)?, self.check_district(d)?))
    }

    pub fn checked_customer(&self, w: i64, d: i64, c: i64) -> Result<Key, KeyError> {
        let (w, d) = (self.check_warehouse(w)?, self.check_district(d)?);
        Ok(self.customer(w, d, self.check_customer(c)?))
    }

    pub fn checked_history(&self, w: i64, d: i64, c: i64, h: i64) -> Result<Key, KeyError> {
        let (w, d) = (self.check_warehouse(w)?, self.check_district(d)?);
        let c = self.check_customer(c)?;
        let h = Self::check_id("history sequence", h, 1, self.max_orders)?;
        Ok(self.history(w, d, c, h))
    }

    pub fn checked_new_order(&self, w: i64, d: i64, o: i64) -> Result<Key, KeyError> {
        self.checked_order(w, d, o)
    }

    pub fn checked_order(&self, w: i64, d: i64, o: i64) -> Result<Key, KeyError> {
        let (w, d) = (self.check_warehouse(w)?, self.check_district(d)?);
        Ok(self.order(w, d, self.check_order(o)?))
    }

    pub fn checked_order_line(&self, w: i64, d: i64, o: i64, ol: i64) -> Result<Key, KeyError> {
        let (w, d) = (self.check_warehouse(w)?, self.check_district(d)?);
        let o = self.check_order(o)?;
        let ol = Self::check_id("OL_NUMBER", ol, 1, MAX_OL_CNT)?;
        Ok(self.order_line(w, d, o, ol))
    }

    pub fn checked_stock(&self, w: i64, i: i64) -> Result<Key, KeyError> {
        Ok(self.stock(self.check_warehouse(w)?, self.check_item(i)?))
    }

    pub fn checked_item(&self, p: i64, i: i64) -> Result<Key, KeyError> {
        let p = Self::check_id("partition", p, 0, self.partitions - 1)?;
        Ok(self.item(PartitionId(p), self.check_item(i)?))
    }

    pub fn checked_customer_by_last_name(
        &self,
        w: i64,
        d: i64,
        name: i64,
    ) -> Result<Key, KeyError> {
        let (w, d) = (self.check_warehouse(w)?, self.check_district(d)?);
        let name = Self::check_id("C_LAST number", name, 0, LAST_NAMES - 1)?;
        Ok(self.customer_by_last_name(w, d, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tpcc::schema::{self, tables};
    use qstore_core::config::Partitioning;
    use qstore_core::partition::PartitionMap;
    use qstore_core::TableId;

    fn keys(partitions: u32, wpp: u32, max_orders: u32) -> (TpccKeys, PartitionMap) {
        let cfg = TpccConfig {
            warehouses_per_partition: wpp,
            max_orders_per_district: max_orders,
            ..TpccConfig::default()
        };
        cfg.validate(partitions.max(2), Partitioning::Range)
            .unwrap();
        let k = TpccKeys::new(&cfg, partitions);
        let pmap = PartitionMap::new(partitions, Partitioning::Range, &schema::schemas(&k));
        (k, pmap)
    }

    /// Orders, lines and history numbers to try: the edges and a few in between.
    fn some(max: u32) -> [u32; 5] {
        [1, 2, 2101, max - 1, max]
    }

    /// Every key of warehouse `w` decodes to its ids and lives in `w`'s partition.
    fn check_warehouse(k: &TpccKeys, pmap: &PartitionMap, w: u32) {
        let home = k.partition_of_warehouse(w);
        let at = |table: TableId, key: Key| {
            assert_eq!(
                pmap.partition_of(table, key),
                home,
                "table {table} key {key:#x}"
            );
        };
        at(schema::WAREHOUSE, k.warehouse(w));
        for d in 1..=DISTRICTS {
            at(schema::DISTRICT, k.district(w, d));
            assert_eq!(k.decode_district(k.district(w, d)), (w, d));
            for c in [1, 2, 1000, CUSTOMERS] {
                let key = k.customer(w, d, c);
                at(schema::CUSTOMER, key);
                assert_eq!(k.decode_customer(key), (w, d, c));
                for h in some(k.max_orders()) {
                    let key = k.history(w, d, c, h);
                    at(schema::HISTORY, key);
                    assert_eq!(k.decode_history(key), (w, d, c, h));
                }
            }
            for o in some(k.max_orders()) {
                at(schema::ORDER, k.order(w, d, o));
                at(schema::NEW_ORDER, k.new_order(w, d, o));
                assert_eq!(k.decode_order(k.order(w, d, o)), (w, d, o));
                for ol in [1, 7, MAX_OL_CNT] {
                    let key = k.order_line(w, d, o, ol);
                    at(schema::ORDER_LINE, key);
                    assert_eq!(k.decode_order_line(key), (w, d, o, ol));
                }
            }
            at(schema::CUSTOMER_LAST_ORDER, k.customer(w, d, CUSTOMERS));
            at(schema::NEW_ORDER_HEAD, k.district(w, d));
            for name in [0, 371, LAST_NAMES - 1] {
                let key = k.customer_by_last_name(w, d, name);
                at(schema::CUSTOMER_BY_LAST_NAME, key);
                assert_eq!(k.decode_customer_by_last_name(key), (w, d, name));
            }
        }
        for i in [1, 2, 65_536, ITEMS] {
            at(schema::STOCK, k.stock(w, i));
            assert_eq!(k.decode_stock(k.stock(w, i)), (w, i));
        }
    }

    #[test]
    fn every_row_of_a_warehouse_lives_in_its_partition() {
        for partitions in [1, 3] {
            for wpp in [1, 2, 4] {
                for max_orders in [3_001, 33_000, 70_000] {
                    let (k, pmap) = keys(partitions, wpp, max_orders);
                    assert_eq!(k.warehouses(), partitions * wpp);
                    for p in 0..partitions {
                        let ws = k.warehouses_of(PartitionId(p));
                        assert_eq!(ws.len() as u32, wpp);
                        for w in ws {
                            assert_eq!(k.partition_of_warehouse(w), PartitionId(p));
                            check_warehouse(&k, &pmap, w);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_item_copy_lives_in_its_own_partition() {
        for partitions in [1, 3] {
            for wpp in [1, 2, 4] {
                let (k, pmap) = keys(partitions, wpp, 33_000);
                for p in (0..partitions).map(PartitionId) {
                    for i in [1, 2, 50_000, ITEMS] {
                        let key = k.item(p, i);
                        assert_eq!(pmap.partition_of(schema::ITEM, key), p);
                        assert_eq!(k.decode_item(key), (p, i));
                    }
                }
            }
        }
    }

    /// Range scans rely on it: within a district, keys follow order ids, then line numbers,
    /// and no two rows of different tables' ids share a key.
    #[test]
    fn order_keys_sort_by_order_id_within_a_district() {
        let (k, _) = keys(3, 2, 33_000);
        let mut last = 0;
        for o in 1..=200 {
            let key = k.order(4, 7, o);
            assert!(key > last);
            last = key;
            for ol in 1..=MAX_OL_CNT {
                assert!(k.order_line(4, 7, o, ol) < k.order_line(4, 7, o + 1, 1));
            }
        }
        assert!(k.order(4, 7, 33_000) < k.order(4, 8, 1));
        assert!(k.order(4, 10, 33_000) < k.order(5, 1, 1));
        assert!(k.history(1, 1, 5, 9) < k.history(1, 1, 6, 1));
    }

    #[test]
    fn bits_match_the_configuration_and_the_widest_table() {
        let (k, _) = keys(3, 2, 33_000);
        assert_eq!(k.order_bits(), 16);
        assert_eq!(
            k.history_bits(),
            TpccConfig::default().key_bits_per_warehouse()
        );
        assert_eq!(k.order_line_bits(), 24);
        let (k, _) = keys(1, 1, 3_001);
        assert_eq!(k.order_bits(), 12);
        for t in tables(&k) {
            assert!(t.bits <= k.history_bits(), "{}", t.layout.table);
        }
    }

    #[test]
    fn checked_encoders_refuse_ids_out_of_range() {
        let (k, _) = keys(3, 2, 33_000);
        assert_eq!(k.checked_customer(5, 10, 3000), Ok(k.customer(5, 10, 3000)));
        assert_eq!(
            k.checked_order_line(0, 1, 33_000, 15),
            Ok(k.order_line(0, 1, 33_000, 15))
        );
        assert_eq!(
            k.checked_item(2, ITEMS as i64),
            Ok(k.item(PartitionId(2), ITEMS))
        );
        let field = |r: Result<Key, KeyError>| r.unwrap_err().field;
        assert_eq!(field(k.checked_warehouse(6)), "W_ID");
        assert_eq!(field(k.checked_warehouse(-1)), "W_ID");
        assert_eq!(field(k.checked_district(0, 0)), "D_ID");
        assert_eq!(field(k.checked_district(0, 11)), "D_ID");
        assert_eq!(field(k.checked_customer(0, 1, 3001)), "C_ID");
        assert_eq!(field(k.checked_customer(0, 1, i64::MIN)), "C_ID");
        assert_eq!(field(k.checked_order(0, 1, 0)), "O_ID");
        assert_eq!(field(k.checked_new_order(0, 1, 33_001)), "O_ID");
        assert_eq!(field(k.checked_order_line(0, 1, 1, 16)), "OL_NUMBER");
        assert_eq!(
            field(k.checked_history(0, 1, 1, 1 << 40)),
            "history sequence"
        );
        assert_eq!(field(k.checked_stock(0, 100_001)), "I_ID");
        assert_eq!(field(k.checked_item(3, 1)), "partition");
        assert_eq!(
            field(k.checked_customer_by_last_name(0, 1, 1000)),
            "C_LAST number"
        );
        assert_eq!(
            k.checked_customer(0, 1, 3001).unwrap_err().to_string(),
            "C_ID = 3001 is out of range: must be between 1 and 3000"
        );
    }
}
