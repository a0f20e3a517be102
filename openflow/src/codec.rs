//! Stream framing for `tokio_util::codec`: 8-byte header, then `length - 8` bytes.
//!
//! A frame whose length field is below 8 or above the configured maximum is a [`FrameError`]:
//! the stream can no longer be split, so the connection must be dropped. A frame that is well
//! delimited but whose body does not decode is *not* fatal: it is yielded as `Err(BadMessage)`
//! inside the item, so one malformed message from a switch never tears the connection down.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::{DecodeError, FrameError};
use crate::msg::{Header, OfMessage, HEADER_LEN};

/// A well-framed message that failed to decode, with its raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadMessage {
    pub header: Header,
    pub raw: Bytes,
    pub error: DecodeError,
}

/// OpenFlow framing codec.
#[derive(Debug, Clone)]
pub struct OfCodec {
    max_frame: usize,
}

impl Default for OfCodec {
    fn default() -> Self {
        OfCodec { max_frame: u16::MAX as usize }
    }
}

impl OfCodec {
    /// A codec that rejects frames longer than `max_frame` bytes.
    pub fn with_max_frame(max_frame: usize) -> OfCodec {
        OfCodec { max_frame: max_frame.max(HEADER_LEN) }
    }

    /// Splits one whole raw frame off `src`, if available.
    pub fn split_frame(&self, src: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u16::from_be_bytes([src[2], src[3]]);
        if (len as usize) < HEADER_LEN {
            return Err(FrameError::TooShort(len));
        }
        let len = len as usize;
        if len > self.max_frame {
            return Err(FrameError::TooLong { len, max: self.max_frame });
        }
        if src.len() < len {
            src.reserve(len - src.len());
            return Ok(None);
        }
        Ok(Some(src.split_to(len)))
    }
}

impl Decoder for OfCodec {
    type Item = Result<OfMessage, BadMessage>;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, FrameError> {
        let Some(frame) = self.split_frame(src)? else { return Ok(None) };
        Ok(Some(OfMessage::decode(&frame).map_err(|error| BadMessage {
            // split_frame guarantees at least a header.
            header: Header::decode(&frame).unwrap_or(Header { version: 0, msg_type: 0, length: 0, xid: 0 }),
            raw: frame.freeze(),
            error,
        })))
    }
}

impl Encoder<OfMessage> for OfCodec {
    type Error = FrameError;
    fn encode(&mut self, item: OfMessage, dst: &mut BytesMut) -> Result<(), FrameError> {
        Encoder::<&OfMessage>::encode(self, &item, dst)
    }
}

impl Encoder<&OfMessage> for OfCodec {
    type Error = FrameError;
    fn encode(&mut self, item: &OfMessage, dst: &mut BytesMut) -> Result<(), FrameError> {
        dst.reserve(item.encoded_len());
        item.encode(dst)?;
        Ok(())
    }
}

/// Pre-encoded bytes (one or more whole messages) written as they are: lets a caller encode
/// once and send many times, and lets benchmarks measure the switch without encoding cost.
impl Encoder<Bytes> for OfCodec {
    type Error = FrameError;
    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> Result<(), FrameError> {
        dst.extend_from_slice(item.chunk());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::Message;

    #[test]
    fn frames_split_at_every_byte() {
        let mut all = BytesMut::new();
        let msgs = vec![
            OfMessage::new(1, Message::Hello(crate::msg::Hello::of13())),
            OfMessage::new(2, Message::EchoRequest(Bytes::from_static(b"abcd"))),
            OfMessage::new(3, Message::BarrierRequest),
        ];
        for m in &msgs {
            m.encode(&mut all).unwrap();
        }
        for cut in 0..all.len() {
            let mut codec = OfCodec::default();
            let mut buf = BytesMut::from(&all[..cut]);
            let mut got = Vec::new();
            while let Some(m) = codec.decode(&mut buf).unwrap() {
                got.push(m.unwrap());
            }
            buf.extend_from_slice(&all[cut..]);
            while let Some(m) = codec.decode(&mut buf).unwrap() {
                got.push(m.unwrap());
            }
            assert_eq!(got, msgs, "cut at {cut}");
        }
    }

    #[test]
    fn bad_lengths_are_typed_errors() {
        let mut c = OfCodec::default();
        let mut b = BytesMut::from(&[4u8, 0, 0, 4, 0, 0, 0, 1][..]);
        assert!(matches!(c.decode(&mut b), Err(FrameError::TooShort(4))));
        let mut c = OfCodec::with_max_frame(64);
        let mut b = BytesMut::from(&[4u8, 0, 0, 65, 0, 0, 0, 1][..]);
        assert!(matches!(c.decode(&mut b), Err(FrameError::TooLong { len: 65, max: 64 })));
    }

    #[test]
    fn undecodable_body_is_not_fatal() {
        let mut c = OfCodec::default();
        // FEATURES_REPLY with a 1-byte body, then a good BARRIER_REPLY.
        let mut b = BytesMut::from(&[4u8, 6, 0, 9, 0, 0, 0, 7, 0xaa, 4, 21, 0, 8, 0, 0, 0, 8][..]);
        let bad = c.decode(&mut b).unwrap().unwrap().unwrap_err();
        assert_eq!(bad.header.xid, 7);
        assert_eq!(bad.raw.len(), 9);
        let good = c.decode(&mut b).unwrap().unwrap().unwrap();
        assert_eq!(good, OfMessage::new(8, Message::BarrierReply));
    }
}
