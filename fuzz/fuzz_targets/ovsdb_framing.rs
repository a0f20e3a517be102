//! Feeds arbitrary bytes, cut into fuzzer-chosen chunks, to the OVSDB stream splitter `JsonCodec`.
//!
//! Input layout: byte 0 picks the codec's `max_message_size` (low 3 bits) and the number `n` of
//! chunk lengths that follow (bits 4..=6); the next `n` bytes are chunk lengths (`len + 1`, used
//! cyclically); the rest is the stream. With `n == 0` the stream is only fed in one piece.
//!
//! Invariants checked:
//! * no panic, hang or abort;
//! * bounded output and buffering: at most one value per two input bytes, and whenever the
//!   decoder asks for more input it holds at most `max_message_size` bytes;
//! * chunking does not matter: the values and the error (if any) are the same as when the whole
//!   stream is decoded from one buffer;
//! * every decoded value, re-encoded with the codec's `Encoder` and decoded again by a fresh
//!   codec, is equal to itself (floats up to serde_json's best-effort parsing precision).

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sdn_node::ovsdb::framing::DEFAULT_MAX_MESSAGE_SIZE;
use sdn_node::ovsdb::{FramingError, JsonCodec};
use serde_json::Value;
use tokio_util::codec::{Decoder, Encoder};

const MAX_SIZES: [usize; 8] = [DEFAULT_MAX_MESSAGE_SIZE, 2, 7, 16, 64, 256, 4096, 1 << 16];

#[derive(Debug, PartialEq)]
enum End {
    Clean,
    TooLarge,
    Malformed,
    TruncatedAtEof,
}

fn end_of(e: &FramingError, max: usize) -> End {
    match e {
        FramingError::TooLarge { limit } => {
            assert_eq!(*limit, max);
            End::TooLarge
        }
        FramingError::Malformed(_) => End::Malformed,
        FramingError::TruncatedAtEof { .. } => End::TruncatedAtEof,
        FramingError::Io(e) => panic!("I/O error from an in-memory decode: {e}"),
    }
}

/// Decodes `stream` fed in chunks of the given lengths (cyclically; empty = one piece).
fn run(stream: &[u8], chunks: &[usize], max: usize) -> (Vec<Value>, End) {
    let mut codec = JsonCodec::new(max);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut pos = 0;
    let mut i = 0;
    loop {
        let n = if chunks.is_empty() { stream.len() - pos } else { chunks[i % chunks.len()] };
        i += 1;
        let next = (pos + n).min(stream.len());
        buf.extend_from_slice(&stream[pos..next]);
        pos = next;
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(v)) => out.push(v),
                Ok(None) => {
                    assert!(buf.len() <= max, "buffering {} bytes with a limit of {max}", buf.len());
                    break;
                }
                Err(e) => return (out, end_of(&e, max)),
            }
        }
        if pos == stream.len() {
            break;
        }
    }
    loop {
        match codec.decode_eof(&mut buf) {
            Ok(Some(v)) => out.push(v),
            Ok(None) => return (out, End::Clean),
            Err(e) => return (out, end_of(&e, max)),
        }
    }
}

fn num_eq(a: &serde_json::Number, b: &serde_json::Number) -> bool {
    if a == b {
        return true;
    }
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs()),
        _ => false,
    }
}

/// Structural equality, floats compared up to a few ULPs (serde_json parses floats with
/// best-effort precision unless its `float_roundtrip` feature is on).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => num_eq(x, y),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((k1, v1), (k2, v2))| k1 == k2 && json_eq(v1, v2))
        }
        _ => a == b,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else { return };
    let max = MAX_SIZES[usize::from(head & 7)];
    let n = usize::from((head >> 4) & 7).min(rest.len());
    let (lens, stream) = rest.split_at(n);
    let chunks: Vec<usize> = lens.iter().map(|&l| usize::from(l) + 1).collect();

    let (whole, whole_end) = run(stream, &[], max);
    assert!(whole.len() <= stream.len() / 2, "{} values from {} bytes", whole.len(), stream.len());
    if !chunks.is_empty() {
        let (chunked, chunked_end) = run(stream, &chunks, max);
        assert_eq!(whole, chunked, "values depend on chunking {chunks:?}");
        assert_eq!(whole_end, chunked_end, "outcome depends on chunking {chunks:?}");
    }

    for v in &whole {
        assert!(v.is_object() || v.is_array(), "top-level scalar {v}");
        let mut wire = BytesMut::new();
        JsonCodec::default().encode(v.clone(), &mut wire).expect("re-encode");
        let mut codec = JsonCodec::default();
        let again = codec.decode(&mut wire).expect("re-decode").expect("re-decoded value is complete");
        assert!(wire.is_empty(), "{} bytes left after re-decoding", wire.len());
        assert!(json_eq(v, &again), "re-decoded {again} != {v}");
    }
});
