//! The on-disk format: segment file names, the segment header and the record header.
//!
//! A segment file `<first LSN, 20 decimal digits>.log` is a 24-byte header followed by records:
//!
//! ```text
//! segment header (24 bytes, integers little-endian)
//!   0..8    magic "QSTORLOG"
//!   8..12   format version (u32) = 1
//!   12..20  LSN of the segment's first record (u64), equal to the one in the file name
//!   20..24  CRC-32 of bytes 0..20
//! record (12-byte header + payload)
//!   0..4    payload length N (u32)
//!   4..8    CRC-32 of the payload
//!   8..12   CRC-32 of (LSN as u64 ‖ bytes 0..8): the header's own checksum
//!   12..    N bytes of payload
//! ```
//!
//! The record's LSN is not stored; it is the segment's first LSN plus the record's position. It
//! is folded into the header checksum, so a record read at the wrong position (a segment renamed
//! or copied from elsewhere) fails its check. Checking the header on its own means a bad length
//! is caught before it is used, and a damaged payload can be told from a damaged length.

use std::path::{Path, PathBuf};

use crate::{LogError, Lsn};

/// First bytes of every segment file.
pub const MAGIC: [u8; 8] = *b"QSTORLOG";
/// The format version written by this build, and the only one it reads.
pub const FORMAT_VERSION: u32 = 1;
/// Size of the segment header in bytes.
pub const SEGMENT_HEADER_LEN: u64 = 24;
/// Size of a record header in bytes.
pub const RECORD_HEADER_LEN: u64 = 12;
/// File name suffix of segment files.
const SEGMENT_SUFFIX: &str = ".log";
/// Decimal digits of the LSN in a segment file name.
const NAME_DIGITS: usize = 20;

/// CRC-32 (IEEE) of `bytes`.
pub fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Path of the segment whose first record is `first` in `dir`.
pub fn segment_path(dir: &Path, first: Lsn) -> PathBuf {
    dir.join(format!("{first:0NAME_DIGITS$}{SEGMENT_SUFFIX}"))
}

/// The first LSN named by a segment file name, or `None` if `name` is not a segment's name.
pub fn parse_segment_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The segment header for a segment starting at `first`.
pub fn encode_segment_header(first: Lsn) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&first.to_le_bytes());
    let sum = crc(&h[0..20]);
    h[20..24].copy_from_slice(&sum.to_le_bytes());
    h
}

/// Checks a full segment header read from `path`, named for first LSN `first`.
pub fn check_segment_header(
    path: &Path,
    h: &[u8; SEGMENT_HEADER_LEN as usize],
    first: Lsn,
) -> Result<(), LogError> {
    if h[0..8] != MAGIC {
        return Err(LogError::NotALog {
            path: path.to_path_buf(),
            reason: "the file does not start with the log's magic bytes \"QSTORLOG\"".into(),
        });
    }
    let version = u32_at(h, 8);
    if version != FORMAT_VERSION {
        return Err(LogError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if crc(&h[0..20]) != u32_at(h, 20) {
        return Err(LogError::corrupt(
            path,
            0,
            "segment header checksum mismatch",
        ));
    }
    let stored = u64::from_le_bytes(h[12..20].try_into().unwrap_or_default());
    if stored != first {
        return Err(LogError::corrupt(
            path,
            0,
            format!(
                "the segment header says its first LSN is {stored} but the file name says \
                 {first}; was the file renamed?"
            ),
        ));
    }
    Ok(())
}

/// The little-endian u32 at `at` in `b` (the caller guarantees the bounds).
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// A decoded record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Payload length in bytes.
    pub len: u32,
    /// CRC-32 of the payload.
    pub payload_crc: u32,
    /// CRC-32 of the LSN and the two fields above.
    pub header_crc: u32,
}

impl RecordHeader {
    /// The header of the record `lsn` carrying `payload_len` bytes whose checksum is
    /// `payload_crc`.
    pub fn new(lsn: Lsn, payload_len: u32, payload_crc: u32) -> Self {
        RecordHeader {
            len: payload_len,
            payload_crc,
            header_crc: header_crc(lsn, payload_len, payload_crc),
        }
    }

    /// Decodes the 12 header bytes (checks nothing).
    pub fn decode(b: &[u8; RECORD_HEADER_LEN as usize]) -> Self {
        RecordHeader {
            len: u32_at(b, 0),
            payload_crc: u32_at(b, 4),
            header_crc: u32_at(b, 8),
        }
    }

    /// The 12 header bytes.
    pub fn encode(&self) -> [u8; RECORD_HEADER_LEN as usize] {
        let mut b = [0u8; RECORD_HEADER_LEN as usize];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4..8].copy_from_slice(&self.payload_crc.to_le_bytes());
        b[8..12].copy_from_slice(&self.header_crc.to_le_bytes());
        b
    }

    /// Whether the header's own checksum holds for a record numbered `lsn`.
    pub fn is_valid_for(&self, lsn: Lsn) -> bool {
        self.header_crc == header_crc(lsn, self.len, self.payload_crc)
    }

    /// Bytes the whole record takes in the file.
    pub fn record_len(&self) -> u64 {
        RECORD_HEADER_LEN + u64::from(self.len)
    }
}

/// Checksum of the record header fields, keyed by the record's LSN.
fn header_crc(lsn: Lsn, len: u32, payload_crc: u32) -> u32 {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&lsn.to_le_bytes());
    b[8..12].copy_from_slice(&len.to_le_bytes());
    b[12..16].copy_from_slice(&payload_crc.to_le_bytes());
    crc(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_round_trip() {
        let p = segment_path(Path::new("/x"), 42);
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert_eq!(name, "00000000000000000042.log");
        assert_eq!(parse_segment_name(name), Some(42));
        assert_eq!(parse_segment_name("42.log"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.log"), None);
        assert_eq!(parse_segment_name("99999999999999999999.log"), None);
        assert_eq!(parse_segment_name("00000000000000000042.txt"), None);
    }

    #[test]
    fn headers_round_trip_and_detect_damage() {
        let h = encode_segment_header(7);
        assert!(check_segment_header(Path::new("s"), &h, 7).is_ok());
        assert!(check_segment_header(Path::new("s"), &h, 8).is_err());
        let r = RecordHeader::new(5, 3, crc(b"abc"));
        let d = RecordHeader::decode(&r.encode());
        assert_eq!(r, d);
        assert!(d.is_valid_for(5));
        assert!(!d.is_valid_for(6));
        assert!(!RecordHeader::decode(&[0; 12]).is_valid_for(0));
    }
}
