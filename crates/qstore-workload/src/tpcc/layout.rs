//! Fixed-size row layouts: a row is a byte slice, a [`Field`] names a slice of it and how to
//! read it, so that step functions read `C_BALANCE` by name instead of by offset.
//!
//! Numbers are little-endian. Byte strings are fixed-width and padded with zero bytes: their
//! value is what comes before the first zero, so a shorter value needs no length field, and
//! a value holding a zero byte (which would read back shorter) is refused.
//!
//! Getters and setters check the field's kind with `assert!`: a [`Field`] is a constant, so
//! the check folds away, and reading a money field as a count is a programmer's mistake that
//! must not pass silently.

use std::fmt;

/// How a field's bytes are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A signed 64-bit integer (dates, large counters).
    I64,
    /// A signed 32-bit integer (counts, quantities, rates in ten-thousandths).
    I32,
    /// An unsigned 32-bit integer (identifiers).
    U32,
    /// An amount of money in cents, a signed 64-bit integer: sums stay exact.
    Money,
    /// A fixed-width byte string, zero-padded.
    Bytes,
}

impl Kind {
    /// Bytes of a number of this kind (`None` for strings, whose width is the field's).
    const fn number_width(self) -> Option<usize> {
        match self {
            Kind::I64 | Kind::Money => Some(8),
            Kind::I32 | Kind::U32 => Some(4),
            Kind::Bytes => None,
        }
    }
}

/// An amount of whole dollars, in cents (the unit of [`Kind::Money`]).
pub const fn dollars(d: i64) -> i64 {
    d * 100
}

/// One field of a row: its name (the TPC-C column name), where it lies and how it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub width: usize,
    pub kind: Kind,
}

/// A value that does not fit its field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// The value has more bytes than the field.
    TooLong {
        field: &'static str,
        len: usize,
        width: usize,
    },
    /// The value holds a zero byte, which would end it early when read back.
    ZeroByte { field: &'static str, at: usize },
    /// A number the field cannot hold (e.g. a customer id over 3000 in a `u16` list).
    OutOfRange { field: &'static str, value: i64 },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::TooLong { field, len, width } => {
                write!(f, "{field}: {len} bytes do not fit in {width}")
            }
            LayoutError::ZeroByte { field, at } => {
                write!(f, "{field}: byte {at} is zero, which strings cannot hold")
            }
            LayoutError::OutOfRange { field, value } => {
                write!(f, "{field}: {value} is out of range")
            }
        }
    }
}

impl std::error::Error for LayoutError {}

impl Field {
    /// A number field of `kind` at `offset`.
    pub const fn number(name: &'static str, offset: usize, kind: Kind) -> Field {
        let Some(width) = kind.number_width() else {
            panic!("a string field needs a width: use Field::bytes");
        };
        Field {
            name,
            offset,
            width,
            kind,
        }
    }

    pub const fn i64(name: &'static str, offset: usize) -> Field {
        Field::number(name, offset, Kind::I64)
    }

    pub const fn i32(name: &'static str, offset: usize) -> Field {
        Field::number(name, offset, Kind::I32)
    }

    pub const fn u32(name: &'static str, offset: usize) -> Field {
        Field::number(name, offset, Kind::U32)
    }

    pub const fn money(name: &'static str, offset: usize) -> Field {
        Field::number(name, offset, Kind::Money)
    }

    /// A zero-padded byte string of `width` bytes at `offset`.
    pub const fn bytes(name: &'static str, offset: usize, width: usize) -> Field {
        assert!(width > 0, "a string field has at least one byte");
        Field {
            name,
            offset,
            width,
            kind: Kind::Bytes,
        }
    }

    /// The offset just past the field: where the next field of a row starts.
    pub const fn end(&self) -> usize {
        self.offset + self.width
    }

    #[inline]
    fn expect(&self, kind: Kind) {
        assert!(
            self.kind == kind,
            "field {} is {:?}, not {kind:?}",
            self.name,
            self.kind
        );
    }

    #[inline]
    fn word<const N: usize>(&self, row: &[u8]) -> [u8; N] {
        row[self.offset..self.offset + N]
            .try_into()
            .expect("the slice is N bytes")
    }

    #[inline]
    pub fn get_i64(&self, row: &[u8]) -> i64 {
        self.expect(Kind::I64);
        i64::from_le_bytes(self.word(row))
    }

    #[inline]
    pub fn set_i64(&self, row: &mut [u8], v: i64) {
        self.expect(Kind::I64);
        self.raw_mut(row).copy_from_slice(&v.to_le_bytes());
    }

    #[inline]
    pub fn get_i32(&self, row: &[u8]) -> i32 {
        self.expect(Kind::I32);
        i32::from_le_bytes(self.word(row))
    }

    #[inline]
    pub fn set_i32(&self, row: &mut [u8], v: i32) {
        self.expect(Kind::I32);
        self.raw_mut(row).copy_from_slice(&v.to_le_bytes());
    }

    #[inline]
    pub fn get_u32(&self, row: &[u8]) -> u32 {
        self.expect(Kind::U32);
        u32::from_le_bytes(self.word(row))
    }

    #[inline]
    pub fn set_u32(&self, row: &mut [u8], v: u32) {
        self.expect(Kind::U32);
        self.raw_mut(row).copy_from_slice(&v.to_le_bytes());
    }

    /// An amount in cents.
    #[inline]
    pub fn get_money(&self, row: &[u8]) -> i64 {
        self.expect(Kind::Money);
        i64::from_le_bytes(self.word(row))
    }

    #[inline]
    pub fn set_money(&self, row: &mut [u8], cents: i64) {
        self.expect(Kind::Money);
        self.raw_mut(row).copy_from_slice(&cents.to_le_bytes());
    }

    /// A string's value: its bytes before the first zero.
    #[inline]
    pub fn get_bytes<'a>(&self, row: &'a [u8]) -> &'a [u8] {
        self.expect(Kind::Bytes);
        let raw = self.raw(row);
        let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        &raw[..len]
    }

    /// Stores a string, zero-padding the rest of the field; refuses (leaving the row as it
    /// was) a value that is too long or holds a zero byte.
    pub fn set_bytes(&self, row: &mut [u8], v: &[u8]) -> Result<(), LayoutError> {
        self.expect(Kind::Bytes);
        if v.len() > self.width {
            return Err(LayoutError::TooLong {
                field: self.name,
                len: v.len(),
                width: self.width,
            });
        }
        if let Some(at) = v.iter().position(|&b| b == 0) {
            return Err(LayoutError::ZeroByte {
                field: self.name,
                at,
            });
        }
        let raw = self.raw_mut(row);
        raw[..v.len()].copy_from_slice(v);
        raw[v.len()..].fill(0);
        Ok(())
    }

    /// Stores the first `width` bytes of the concatenation of `parts`, for values the spec
    /// itself truncates (Payment's new C_DATA: new text in front of the old, cut to the
    /// field). Returns how many bytes were stored. Zero bytes are refused as in
    /// [`Field::set_bytes`].
    pub fn set_bytes_truncated(
        &self,
        row: &mut [u8],
        parts: &[&[u8]],
    ) -> Result<usize, LayoutError> {
        self.expect(Kind::Bytes);
        // Check first, so that a refused value leaves the row as it was.
        let mut len = 0;
        for part in parts {
            let take = part.len().min(self.width - len);
            if let Some(z) = part[..take].iter().position(|&b| b == 0) {
                return Err(LayoutError::ZeroByte {
                    field: self.name,
                    at: len + z,
                });
            }
            len += take;
        }
        let raw = self.raw_mut(row);
        let mut at = 0;
        for part in parts {
            let take = part.len().min(len - at);
            raw[at..at + take].copy_from_slice(&part[..take]);
            at += take;
        }
        raw[len..].fill(0);
        Ok(len)
    }

    /// The field's bytes as stored, padding included (for packed arrays such as
    /// CUSTOMER_BY_LAST_NAME's customer ids).
    #[inline]
    pub fn raw<'a>(&self, row: &'a [u8]) -> &'a [u8] {
        &row[self.offset..self.end()]
    }

    #[inline]
    pub fn raw_mut<'a>(&self, row: &'a mut [u8]) -> &'a mut [u8] {
        &mut row[self.offset..self.end()]
    }
}

/// The fields of one table's rows, in order and back to back.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub table: &'static str,
    pub fields: &'static [Field],
}

impl Layout {
    /// Bytes of a row: the end of the last field.
    pub const fn size(&self) -> usize {
        match self.fields.last() {
            Some(f) => f.end(),
            None => 0,
        }
    }

    /// Whether every field starts where the previous one ends, the first at 0: no gap, no
    /// overlap, and no field left out of the list. Checked at compile time for every table.
    pub const fn is_packed(&self) -> bool {
        let mut at = 0;
        let mut i = 0;
        while i < self.fields.len() {
            if self.fields[i].offset != at {
                return false;
            }
            at = self.fields[i].end();
            i += 1;
        }
        true
    }

    /// The field named `name`, if the table has one.
    pub fn field(&self, name: &str) -> Option<Field> {
        self.fields.iter().find(|f| f.name == name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Field = Field::u32("A", 0);
    const B: Field = Field::i32("B", A.end());
    const C: Field = Field::i64("C", B.end());
    const D: Field = Field::money("D", C.end());
    const E: Field = Field::bytes("E", D.end(), 5);
    const T: Layout = Layout {
        table: "t",
        fields: &[A, B, C, D, E],
    };

    #[test]
    fn every_kind_round_trips_at_its_extremes() {
        assert!(T.is_packed());
        assert_eq!(T.size(), 4 + 4 + 8 + 8 + 5);
        let mut row = vec![0xAAu8; T.size()];
        for (u, i, l, m) in [
            (0, 0, 0, 0),
            (u32::MAX, i32::MIN, i64::MIN, i64::MIN),
            (7, i32::MAX, i64::MAX, -1_000),
        ] {
            A.set_u32(&mut row, u);
            B.set_i32(&mut row, i);
            C.set_i64(&mut row, l);
            D.set_money(&mut row, m);
            assert_eq!(
                (
                    A.get_u32(&row),
                    B.get_i32(&row),
                    C.get_i64(&row),
                    D.get_money(&row)
                ),
                (u, i, l, m)
            );
        }
        for s in [&b""[..], b"x", b"abcde"] {
            E.set_bytes(&mut row, s).unwrap();
            assert_eq!(E.get_bytes(&row), s);
            assert_eq!(E.raw(&row).len(), 5);
        }
        assert_eq!(D.get_money(&row), -1_000, "strings stay in their field");
        assert_eq!(T.field("C"), Some(C));
        assert_eq!(T.field("Z"), None);
    }

    #[test]
    fn strings_that_do_not_fit_are_refused_and_leave_the_row() {
        let mut row = vec![0u8; T.size()];
        E.set_bytes(&mut row, b"abc").unwrap();
        assert_eq!(
            E.set_bytes(&mut row, b"abcdef"),
            Err(LayoutError::TooLong {
                field: "E",
                len: 6,
                width: 5
            })
        );
        assert_eq!(
            E.set_bytes(&mut row, b"a\0b"),
            Err(LayoutError::ZeroByte { field: "E", at: 1 })
        );
        assert_eq!(E.get_bytes(&row), b"abc");
        assert_eq!(E.set_bytes_truncated(&mut row, &[b"xy", b"1234"]), Ok(5));
        assert_eq!(E.get_bytes(&row), b"xy123");
        assert_eq!(E.set_bytes_truncated(&mut row, &[b"q", b"r"]), Ok(2));
        assert_eq!(E.raw(&row), b"qr\0\0\0");
        assert!(E.set_bytes_truncated(&mut row, &[b"q", b"\0"]).is_err());
        // A zero past what is kept does not matter.
        assert_eq!(E.set_bytes_truncated(&mut row, &[b"12345", b"\0"]), Ok(5));
    }

    #[test]
    #[should_panic(expected = "field D is Money, not I64")]
    fn reading_a_field_as_another_kind_panics() {
        D.get_i64(&[0u8; 64]);
    }

    #[test]
    fn a_layout_with_a_gap_or_a_missing_field_is_not_packed() {
        let gap = Layout {
            table: "g",
            fields: &[A, C],
        };
        assert!(!gap.is_packed());
        let unordered = Layout {
            table: "u",
            fields: &[B, A],
        };
        assert!(!unordered.is_packed());
    }
}
