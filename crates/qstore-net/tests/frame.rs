//! Property tests of the frame codec: random batches round-trip through any number of frames,
//! and no input, however broken, makes the decoder panic.

use proptest::prelude::*;
use qstore_net::frame::{FrameDecoder, FrameEncoder, FrameError};
use serde::{Deserialize, Serialize};

/// A message shaped like protocol messages: variants, integers, strings, byte vectors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Msg {
    Ack(u64),
    Read { key: u64, table: u32 },
    Value(String),
    Batch(Vec<u8>),
}

fn msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        any::<u64>().prop_map(Msg::Ack),
        (any::<u64>(), any::<u32>()).prop_map(|(key, table)| Msg::Read { key, table }),
        ".{0,40}".prop_map(Msg::Value),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Msg::Batch),
    ]
}

/// Encodes `msgs` the way a link sender does: push, write out whenever the encoder asks.
fn encode(msgs: &[Msg], flush_bytes: usize, max_frame: usize) -> (Vec<u8>, Vec<Msg>) {
    let mut enc = FrameEncoder::new(flush_bytes, max_frame);
    let (mut out, mut sent) = (Vec::new(), Vec::new());
    for m in msgs {
        if enc.push(m).is_ok() {
            sent.push(m.clone());
        }
        if enc.should_flush() {
            enc.write_to(&mut out).unwrap();
        }
    }
    enc.write_to(&mut out).unwrap();
    (out, sent)
}

/// Decodes frames until the stream ends or an error; returns the messages and the error.
fn decode(bytes: &[u8], max_frame: usize) -> (Vec<Msg>, Option<FrameError>) {
    let mut dec = FrameDecoder::new(max_frame);
    let mut r = bytes;
    let mut got = Vec::new();
    loop {
        match dec.read_frame::<Msg, _>(&mut r) {
            Ok(Some(batch)) => got.extend(batch),
            Ok(None) => return (got, None),
            Err(e) => return (got, Some(e)),
        }
    }
}

proptest! {
    // Enough cases to cover every header field and message shape, few enough to stay quick.
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn batches_round_trip(
        msgs in proptest::collection::vec(msg(), 0..100),
        flush_bytes in 1usize..2_000,
        max_frame in 350usize..4_000,
    ) {
        let (bytes, sent) = encode(&msgs, flush_bytes, max_frame);
        // Every message fits a frame of at least 350 bytes, so none is refused.
        prop_assert_eq!(&sent, &msgs);
        let (got, err) = decode(&bytes, max_frame);
        prop_assert!(err.is_none(), "{:?}", err);
        prop_assert_eq!(got, msgs);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2_000)) {
        let _ = decode(&bytes, 1_000);
    }

    #[test]
    fn arbitrary_payload_behind_a_valid_header_never_panics(
        payload in proptest::collection::vec(any::<u8>(), 0..500),
    ) {
        // A correct header and checksum over garbage: only message decoding can object.
        let mut bytes = Vec::from(qstore_net::frame::MAGIC);
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(xxhash_rust::xxh3::xxh3_64(&payload) as u32).to_le_bytes());
        bytes.extend_from_slice(&payload);
        let _ = decode(&bytes, 1_000);
    }

    #[test]
    fn truncated_frames_are_errors_or_a_prefix(
        msgs in proptest::collection::vec(msg(), 1..50),
        cut in any::<prop::sample::Index>(),
    ) {
        let (bytes, _) = encode(&msgs, 256, 4_000);
        let cut = cut.index(bytes.len()); // always drops at least the last byte
        let (got, err) = decode(&bytes[..cut], 4_000);
        // Ending exactly between frames is a clean end; anywhere else is truncation.
        prop_assert!(msgs.starts_with(&got));
        prop_assert!(got.len() < msgs.len());
        if let Some(e) = err {
            prop_assert!(matches!(e, FrameError::Truncated { .. }), "{}", e);
        }
    }

    #[test]
    fn flipped_bits_are_always_noticed(
        msgs in proptest::collection::vec(msg(), 1..50),
        bit in any::<prop::sample::Index>(),
    ) {
        let (mut bytes, _) = encode(&msgs, 256, 4_000);
        let bit = bit.index(bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        let (got, err) = decode(&bytes, 4_000);
        // The checksum covers the payload and the header fields are checked, so a flipped bit
        // may end decoding early but never yields different messages.
        prop_assert!(msgs.starts_with(&got));
        prop_assert!(err.is_some(), "a flipped bit went unnoticed");
    }
}
