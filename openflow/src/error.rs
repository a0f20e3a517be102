//! Error types. Decoding errors name the structure and the field that was wrong, so a log line
//! from a misbehaving switch says what was malformed, not just "parse error".

use thiserror::Error;

/// A message, match, action or instruction could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Fewer bytes were available than the structure needs.
    #[error("{what}: truncated (need {need} bytes, have {have})")]
    Truncated { what: &'static str, need: usize, have: usize },
    /// A length field is impossible (too small, not a multiple of 8, past the end, ...).
    #[error("{what}: bad length {len}")]
    BadLength { what: &'static str, len: usize },
    /// A field holds a value that cannot be represented.
    #[error("{what}: bad value {value:#x}")]
    BadValue { what: &'static str, value: u64 },
    /// A match field appears without the field it depends on (e.g. `nw_src` without `ip`).
    #[error("match: {field} requires {requires}")]
    Prerequisite { field: &'static str, requires: &'static str },
    /// A mask was given for a field that cannot be masked (in_port, eth_type, ip_proto, arp_op).
    #[error("match: {field} cannot be masked")]
    NotMaskable { field: &'static str },
    /// The same match field appears twice.
    #[error("match: duplicate field {field}")]
    DuplicateField { field: &'static str },
}

/// A typed value cannot be put on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    /// A length does not fit its 16-bit length field.
    #[error("{what}: encoded length {len} exceeds {max}")]
    TooLong { what: &'static str, len: usize, max: usize },
}

/// Stream framing failed; the byte stream can no longer be split into messages.
#[derive(Debug, Error)]
pub enum FrameError {
    /// The header's length field is below the 8-byte header size.
    #[error("OpenFlow frame: length {0} is shorter than the 8-byte header")]
    TooShort(u16),
    /// The header's length field exceeds the configured maximum.
    #[error("OpenFlow frame: length {len} exceeds the limit of {max} bytes")]
    TooLong { len: usize, max: usize },
    /// The message could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The underlying stream failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
