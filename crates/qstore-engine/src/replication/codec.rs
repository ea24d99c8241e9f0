//! How a replica group's log entries are compressed (QR-Store section 3.4): the leader
//! compresses what it proposes once, the log and every message replicating it carry the
//! compressed bytes, and each member decompresses an entry when it applies it.
//!
//! An entry's data is its payload, and one byte beside it (in the entry's context, see the
//! member) names how the payload is compressed, so a member reads any entry whatever its own
//! setting, and an uncompressed payload is logged as it is, without a copy. LZ4 payloads
//! start with the decompressed length (little-endian u32, `lz4_flex`'s size-prepended block
//! format); Snappy payloads are raw Snappy blocks, which start with it as a varint. The length is checked
//! against a bound before anything is allocated: an entry is untrusted input.

use qstore_core::config::ReplicationCompression;
use std::borrow::Cow;

const NONE: u8 = 0;
const LZ4: u8 = 1;
const SNAPPY: u8 = 2;

/// `data` compressed with `how`: the codec byte, and the payload.
pub fn pack(how: ReplicationCompression, data: Vec<u8>) -> (u8, Vec<u8>) {
    match how {
        ReplicationCompression::None => (NONE, data),
        ReplicationCompression::Lz4 => (LZ4, lz4_flex::block::compress_prepend_size(&data)),
        ReplicationCompression::Snappy => {
            let packed = snap::raw::Encoder::new()
                .compress_vec(&data)
                .expect("snappy compresses any input under 4 GiB");
            (SNAPPY, packed)
        }
    }
}

/// The data of a payload compressed with `codec`, if it decompresses to at most `max` bytes.
pub fn unpack(codec: u8, payload: &[u8], max: usize) -> Result<Cow<'_, [u8]>, String> {
    let too_long = |n: usize| format!("it decompresses to {n} bytes, more than {max}");
    match codec {
        NONE if payload.len() <= max => Ok(Cow::Borrowed(payload)),
        NONE => Err(too_long(payload.len())),
        LZ4 => {
            let (len, block) = payload
                .split_first_chunk::<4>()
                .ok_or("an LZ4 entry without its length")?;
            let len = u32::from_le_bytes(*len) as usize;
            if len > max {
                return Err(too_long(len));
            }
            let mut out = vec![0; len];
            let n = lz4_flex::block::decompress_into(block, &mut out)
                .map_err(|e| format!("a corrupt LZ4 entry: {e}"))?;
            if n != len {
                return Err(format!("an LZ4 entry of {n} bytes, announcing {len}"));
            }
            Ok(Cow::Owned(out))
        }
        SNAPPY => {
            let len = snap::raw::decompress_len(payload)
                .map_err(|e| format!("a corrupt Snappy entry: {e}"))?;
            if len > max {
                return Err(too_long(len));
            }
            let mut out = vec![0; len];
            snap::raw::Decoder::new()
                .decompress(payload, &mut out)
                .map_err(|e| format!("a corrupt Snappy entry: {e}"))?;
            Ok(Cow::Owned(out))
        }
        other => Err(format!("an entry compressed with unknown codec {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ReplicationCompression; 3] = [
        ReplicationCompression::None,
        ReplicationCompression::Lz4,
        ReplicationCompression::Snappy,
    ];

    #[test]
    fn every_codec_round_trips_and_repetitive_batches_shrink() {
        let data: Vec<u8> = (0..4000u32).flat_map(|i| (i % 50).to_le_bytes()).collect();
        for how in ALL {
            let (codec, payload) = pack(how, data.clone());
            let back = unpack(codec, &payload, 1 << 20).unwrap();
            assert_eq!(back.as_ref(), &data[..], "{how:?}");
            if how != ReplicationCompression::None {
                assert!(payload.len() < data.len() / 4, "{how:?}: {}", payload.len());
            }
            let (codec, empty) = pack(how, Vec::new());
            assert_eq!(unpack(codec, &empty, 0).unwrap().len(), 0);
        }
    }

    #[test]
    fn hostile_entries_are_refused_before_anything_big_is_allocated() {
        let data = vec![7u8; 10_000];
        for how in ALL {
            let (codec, payload) = pack(how, data.clone());
            let e = unpack(codec, &payload, 9_999).unwrap_err();
            assert!(e.contains("more than 9999"), "{how:?}: {e}");
            // Cut short, or garbage: an error, never a panic.
            let cut = &payload[..payload.len() / 2];
            if how != ReplicationCompression::None {
                assert!(unpack(codec, cut, 1 << 20).is_err(), "{how:?}");
            }
            for junk in [&[0xff; 9][..], &[], &[1, 2, 3]] {
                let _ = unpack(codec, junk, 1 << 20);
            }
        }
        // An LZ4 length of 4 GiB is refused by the bound, not allocated.
        let huge = [0xff, 0xff, 0xff, 0xff, 0];
        assert!(unpack(LZ4, &huge, 1 << 20)
            .unwrap_err()
            .contains("more than"));
        assert!(unpack(LZ4, &[], 10).is_err());
        assert!(unpack(9, &[1], 10).unwrap_err().contains("unknown codec 9"));
    }
}
