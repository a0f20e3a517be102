//! Decodes arbitrary bytes as one OpenFlow message and as a stream through `OfCodec`.
//!
//! Invariants checked: no panic (the crate's no-panic rule) and no stack overflow or abort; every
//! successfully decoded message re-encodes to exactly `encoded_len` bytes and decodes back to
//! itself; the `Display` text of flow entries never panics.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use openflow::{FlowStatsEntry, Message, MultipartReply, MultipartReplyBody, OfCodec, OfMessage};
use tokio_util::codec::Decoder;

fn check(m: &OfMessage) {
    // Re-encoding can legitimately exceed the 16-bit length (a 16-bit NXM in_port becomes the
    // 32-bit OXM form); then there is nothing to compare.
    let Ok(bytes) = m.to_bytes() else { return };
    assert_eq!(bytes.len(), m.encoded_len(), "encoded_len of {m:?}");
    let again = OfMessage::decode(&bytes).unwrap_or_else(|e| panic!("re-decoding {m:?}: {e} ({bytes:02x?})"));
    assert_eq!(&again, m, "decode(encode(x)) != x");
    match &m.msg {
        Message::FlowMod(fm) => drop(fm.to_string()),
        Message::MultipartReply(MultipartReply { body: MultipartReplyBody::Flow(v), .. }) => {
            for fs in v.iter().filter_map(FlowStatsEntry::typed) {
                drop(fs.to_string());
                drop(fs.no_stats().to_string());
            }
        }
        Message::Error(e) => drop(e.to_string()),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = OfMessage::decode(data) {
        check(&m);
    }

    let mut codec = OfCodec::default();
    let mut buf = BytesMut::from(data);
    // Framing errors end the stream; a badly encoded body is an `Err` item and framing goes on.
    while let Ok(Some(item)) = codec.decode(&mut buf) {
        if let Ok(m) = item {
            check(&m);
        }
    }
    let _ = codec.decode_eof(&mut buf);
});
