//! Framing of OVSDB's wire format: JSON values written back to back.
//!
//! RFC 7047 JSON-RPC over a stream has no length prefix and no delimiter:
//! `ovsdb-server` writes one JSON object after another. To split the stream we
//! scan bytes incrementally, tracking nesting depth and whether we are inside
//! a string (and after a backslash escape inside it). The scan position is kept
//! across calls so feeding a message one byte at a time is still linear.
//! Once the outermost `{...}`/`[...]` closes, the slice is handed to
//! `serde_json`, which does the real validation.
//!
//! A hostile or broken peer must never make us hang or allocate without bound,
//! so a message that grows past `max_message_size` is rejected with
//! [`FramingError::TooLarge`] as soon as the limit is crossed, and anything that
//! is not JSON yields [`FramingError::Malformed`].

use bytes::{Buf, BufMut, BytesMut};
use serde_json::Value;
use tokio_util::codec::{Decoder, Encoder};

/// Default cap on one message: generous enough for a full `monitor` reply of
/// a large `Open_vSwitch` database, small enough to stop a runaway peer.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// Errors produced while splitting or encoding the JSON stream.
#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    #[error("I/O error on OVSDB stream: {0}")]
    Io(#[from] std::io::Error),
    #[error("OVSDB message exceeds the maximum size of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("malformed JSON on OVSDB stream: {0}")]
    Malformed(String),
    #[error("stream ended in the middle of a JSON message ({pending} bytes pending)")]
    TruncatedAtEof { pending: usize },
}

/// `Decoder`/`Encoder` for back-to-back JSON values (objects or arrays).
#[derive(Debug, Clone)]
pub struct JsonCodec {
    max_message_size: usize,
    /// Offset of the next byte to scan, relative to the start of the buffer.
    scanned: usize,
    /// Offset of the opening bracket of the message being scanned, if any.
    start: Option<usize>,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl Default for JsonCodec {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_MESSAGE_SIZE)
    }
}

impl JsonCodec {
    pub fn new(max_message_size: usize) -> Self {
        JsonCodec {
            max_message_size,
            scanned: 0,
            start: None,
            depth: 0,
            in_string: false,
            escaped: false,
        }
    }

    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    fn reset(&mut self) {
        self.scanned = 0;
        self.start = None;
        self.depth = 0;
        self.in_string = false;
        self.escaped = false;
    }

    /// Scans forward; returns the end offset (exclusive) of a complete value.
    fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, FramingError> {
        let mut i = self.scanned;
        while i < buf.len() {
            let b = buf[i];
            match self.start {
                None => match b {
                    b' ' | b'\t' | b'\r' | b'\n' => {}
                    b'{' | b'[' => {
                        self.start = Some(i);
                        self.depth = 1;
                    }
                    other => {
                        self.scanned = i;
                        return Err(FramingError::Malformed(format!(
                                "expected '{{' or '[' at the start of a message, found byte 0x{other:02x}"
                            )));
                    }
                },
                Some(start) => {
                    if self.in_string {
                        if self.escaped {
                            self.escaped = false;
                        } else if b == b'\\' {
                            self.escaped = true;
                        } else if b == b'"' {
                            self.in_string = false;
                        }
                    } else {
                        match b {
                            b'"' => self.in_string = true,
                            b'{' | b'[' => self.depth += 1,
                            b'}' | b']' => {
                                self.depth -= 1;
                                if self.depth == 0 {
                                    let end = i + 1;
                                    if end - start > self.max_message_size {
                                        return Err(FramingError::TooLarge {
                                            limit: self.max_message_size,
                                        });
                                    }
                                    return Ok(Some(end));
                                }
                            }
                            _ => {}
                        }
                    }
                    if i + 1 - start > self.max_message_size {
                        return Err(FramingError::TooLarge {
                            limit: self.max_message_size,
                        });
                    }
                }
            }
            i += 1;
        }
        self.scanned = i;
        // Leading whitespace with no message started: drop it so it does not
        // accumulate in the buffer.
        Ok(None)
    }
}

impl Decoder for JsonCodec {
    type Item = Value;
    type Error = FramingError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Value>, FramingError> {
        let end = match self.scan(src)? {
            Some(end) => end,
            None => {
                if self.start.is_none() {
                    // Only whitespace so far: discard it.
                    src.advance(self.scanned);
                    self.scanned = 0;
                } else if let Some(start) = self.start {
                    if start > 0 {
                        src.advance(start);
                        self.scanned -= start;
                        self.start = Some(0);
                    }
                }
                return Ok(None);
            }
        };
        let start = self.start.unwrap_or(0);
        let result = serde_json::from_slice::<Value>(&src[start..end]);
        src.advance(end);
        self.reset();
        result
            .map(Some)
            .map_err(|e| FramingError::Malformed(e.to_string()))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Value>, FramingError> {
        if let Some(v) = self.decode(src)? {
            return Ok(Some(v));
        }
        let pending = src.iter().filter(|b| !b.is_ascii_whitespace()).count();
        if pending > 0 {
            let n = src.len();
            src.clear();
            self.reset();
            return Err(FramingError::TruncatedAtEof { pending: n });
        }
        Ok(None)
    }
}

/// Any serializable message: a `Value`, a typed request ([`crate::rpc`]), or one serialized
/// already (`Box<RawValue>`, written as it is).
impl<T: serde::Serialize> Encoder<T> for JsonCodec {
    type Error = FramingError;

    fn encode(&mut self, item: T, dst: &mut BytesMut) -> Result<(), FramingError> {
        serde_json::to_writer(dst.writer(), &item)
            .map_err(|e| FramingError::Malformed(format!("cannot serialize message: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode_all(codec: &mut JsonCodec, buf: &mut BytesMut) -> Vec<Value> {
        let mut out = vec![];
        while let Some(v) = codec.decode(buf).unwrap() {
            out.push(v);
        }
        out
    }

    #[test]
    fn multiple_values_in_one_buffer() {
        let mut c = JsonCodec::default();
        let mut b = BytesMut::from(&br#"{"a":1}{"b":[1,2,{"c":"}"}]} ["x"]  "#[..]);
        let v = decode_all(&mut c, &mut b);
        assert_eq!(
            v,
            vec![json!({"a":1}), json!({"b":[1,2,{"c":"}"}]}), json!(["x"])]
        );
        assert!(b.is_empty());
    }

    #[test]
    fn split_at_every_byte() {
        let msgs = [
            json!({"id": 1, "method": "echo", "params": ["a\"b\\", "}{]["]}),
            json!({"result": {"x": [1, 2.5, null, true]}, "error": null, "id": "é漢"}),
            json!([]),
        ];
        let mut wire = Vec::new();
        for m in &msgs {
            wire.extend_from_slice(serde_json::to_string(m).unwrap().as_bytes());
            wire.extend_from_slice(b"\n");
        }
        // Feed one byte at a time.
        let mut c = JsonCodec::default();
        let mut b = BytesMut::new();
        let mut out = vec![];
        for byte in &wire {
            b.put_u8(*byte);
            out.extend(decode_all(&mut c, &mut b));
        }
        assert_eq!(out, msgs.to_vec());
        // And every split point into two chunks.
        for split in 0..wire.len() {
            let mut c = JsonCodec::default();
            let mut b = BytesMut::from(&wire[..split]);
            let mut out = decode_all(&mut c, &mut b);
            b.extend_from_slice(&wire[split..]);
            out.extend(decode_all(&mut c, &mut b));
            assert_eq!(out, msgs.to_vec(), "split at {split}");
        }
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in [&b"hello"[..], b"}", b"  42", b"{\"a\": xyz}", b"{\"a\":1]"] {
            let mut c = JsonCodec::default();
            let mut b = BytesMut::from(bad);
            match c.decode(&mut b) {
                Err(FramingError::Malformed(_)) => {}
                other => panic!("{:?}: expected Malformed, got {other:?}", bad),
            }
        }
    }

    #[test]
    fn oversize_is_an_error_without_complete_message() {
        let mut c = JsonCodec::new(16);
        let mut b = BytesMut::from(&b"{\"a\":\"0123456789"[..]);
        assert!(c.decode(&mut b).unwrap().is_none());
        b.extend_from_slice(b"0123456789");
        assert!(matches!(
            c.decode(&mut b),
            Err(FramingError::TooLarge { limit: 16 })
        ));
        // A complete but too large message is rejected too.
        let mut c = JsonCodec::new(4);
        let mut b = BytesMut::from(&b"{\"a\":1}"[..]);
        assert!(matches!(
            c.decode(&mut b),
            Err(FramingError::TooLarge { .. })
        ));
        // Exactly at the limit is fine.
        let mut c = JsonCodec::new(7);
        let mut b = BytesMut::from(&b"{\"a\":1}"[..]);
        assert_eq!(c.decode(&mut b).unwrap(), Some(json!({"a":1})));
    }

    #[test]
    fn huge_unterminated_string_hits_limit() {
        let mut c = JsonCodec::new(1024);
        let mut b = BytesMut::from(&b"[\""[..]);
        let mut err = None;
        for _ in 0..100 {
            b.extend_from_slice(&[b'x'; 64]);
            match c.decode(&mut b) {
                Ok(None) => {}
                Ok(Some(v)) => panic!("unexpected value {v}"),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        assert!(matches!(err, Some(FramingError::TooLarge { limit: 1024 })));
    }

    #[test]
    fn eof_mid_message_is_typed_error() {
        let mut c = JsonCodec::default();
        let mut b = BytesMut::from(&b"{\"a\":1}{\"b\""[..]);
        assert_eq!(c.decode_eof(&mut b).unwrap(), Some(json!({"a":1})));
        assert!(matches!(
            c.decode_eof(&mut b),
            Err(FramingError::TruncatedAtEof { .. })
        ));
        let mut c = JsonCodec::default();
        let mut b = BytesMut::from(&b" \n "[..]);
        assert_eq!(c.decode_eof(&mut b).unwrap(), None);
    }

    #[test]
    fn encode_round_trip() {
        let mut c = JsonCodec::default();
        let mut b = BytesMut::new();
        let v = json!({"method":"list_dbs","params":[],"id":0});
        c.encode(v.clone(), &mut b).unwrap();
        c.encode(v.clone(), &mut b).unwrap();
        assert_eq!(decode_all(&mut c, &mut b), vec![v.clone(), v]);
    }
}
