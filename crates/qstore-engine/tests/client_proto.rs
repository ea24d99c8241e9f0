//! The client request decoder against hostile input: whatever bytes a client sends, decoding
//! gives requests or an error, never a panic; and real requests survive the round trip.

use proptest::prelude::*;
use qstore_core::txn::{ProcCall, ProcId, Value};
use qstore_engine::server::proto::ClientRequest;
use qstore_net::frame::{decode_payload, FrameDecoder, FrameEncoder};

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::Int),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(Value::Bytes),
    ]
}

fn request() -> impl Strategy<Value = ClientRequest> {
    prop_oneof![
        (any::<u64>(), any::<u32>(), any::<[u8; 32]>()).prop_map(
            |(cluster_id, format_version, nonce)| ClientRequest::Hello {
                cluster_id,
                format_version,
                nonce,
            }
        ),
        any::<[u8; 32]>().prop_map(|proof| ClientRequest::Prove { proof }),
        (
            any::<u64>(),
            any::<u16>(),
            prop::collection::vec(value(), 0..8),
            any::<u64>(),
            any::<(u64, u64)>(),
        )
            .prop_map(
                |(id, proc, args, birth_us, (session, seq))| ClientRequest::Submit {
                    id,
                    call: ProcCall {
                        proc: ProcId(proc),
                        args,
                    },
                    birth_us,
                    key: qstore_core::txn::TxnKey { session, seq },
                }
            ),
        Just(ClientRequest::Stats),
        any::<bool>().prop_map(|history| ClientRequest::Collect { history }),
    ]
}

/// Encodes `reqs` as one frame.
fn frame(reqs: &[ClientRequest]) -> Vec<u8> {
    let mut enc = FrameEncoder::new(1 << 20, 1 << 20);
    for r in reqs {
        enc.push(r).unwrap();
    }
    let mut out = Vec::new();
    enc.write_to(&mut out).unwrap();
    out
}

proptest! {
    #[test]
    fn arbitrary_payloads_decode_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_payload::<ClientRequest>(&bytes);
    }

    #[test]
    fn requests_round_trip(reqs in prop::collection::vec(request(), 1..20)) {
        let bytes = frame(&reqs);
        let got = FrameDecoder::new(1 << 20)
            .read_frame::<ClientRequest, _>(&mut &bytes[..])
            .unwrap()
            .unwrap();
        prop_assert_eq!(got, reqs);
    }

    #[test]
    fn corrupted_frames_never_panic(
        reqs in prop::collection::vec(request(), 1..8),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = frame(&reqs);
        for (at, bit) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        let _ = FrameDecoder::new(1 << 20).read_frame::<ClientRequest, _>(&mut &bytes[..]);
        let truncated = &bytes[..cut.index(bytes.len())];
        let _ = FrameDecoder::new(1 << 20).read_frame::<ClientRequest, _>(&mut &truncated[..]);
    }
}
