//! A bounds-checked big-endian reader and small encoding helpers.

use bytes::{BufMut, Bytes};

use crate::error::{DecodeError, EncodeError};

/// The experimenter action type (OpenFlow 1.3 `OFPAT_EXPERIMENTER`): every Nicira action, the
/// controller actions included, is one.
pub const OFPAT_EXPERIMENTER: u16 = 0xffff;

/// Reads big-endian integers from a byte slice; every read is checked.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// `what` names the structure being read, for error messages.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The unread bytes, without consuming them.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated { what: self.what, need: n, have: self.buf.len() });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub fn skip(&mut self, n: usize) -> Result<(), DecodeError> {
        self.bytes(n).map(|_| ())
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let b = self.bytes(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// Everything left, as owned bytes.
    pub fn take_rest(&mut self) -> Bytes {
        let b = Bytes::copy_from_slice(self.buf);
        self.buf = &[];
        b
    }
}

/// Rounds `n` up to a multiple of 8 (OpenFlow aligns matches, actions and instructions to 8).
pub const fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Writes `n` zero bytes.
pub fn put_zeros(buf: &mut impl BufMut, n: usize) {
    buf.put_bytes(0, n);
}

/// Converts a length to a u16 length field, or says which structure is too long.
pub fn len_u16(what: &'static str, len: usize) -> Result<u16, EncodeError> {
    u16::try_from(len).map_err(|_| EncodeError::TooLong { what, len, max: u16::MAX as usize })
}

/// Checks a TLV length that must be a multiple of 8 and at least `min`, and fits in `avail`.
pub fn check_len8(what: &'static str, len: usize, min: usize, avail: usize) -> Result<(), DecodeError> {
    if len < min || !len.is_multiple_of(8) || len > avail {
        return Err(DecodeError::BadLength { what, len });
    }
    Ok(())
}

/// Test helper: parses hex test vectors, where every whitespace-separated token made only of
/// hex digits (even length) is data and every other token is an annotation.
#[cfg(test)]
pub(crate) fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .filter(|t| t.len() % 2 == 0 && t.chars().all(|c| c.is_ascii_hexdigit()))
        .flat_map(|t| (0..t.len()).step_by(2).map(move |i| u8::from_str_radix(&t[i..i + 2], 16).unwrap()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_is_checked() {
        let mut r = Reader::new(&[1, 2, 3], "t");
        assert_eq!(r.u16().unwrap(), 0x0102);
        assert_eq!(r.u16(), Err(DecodeError::Truncated { what: "t", need: 2, have: 1 }));
        assert_eq!(r.u8().unwrap(), 3);
        assert!(r.is_empty());
    }

    #[test]
    fn pad() {
        assert_eq!(pad8(0), 0);
        assert_eq!(pad8(1), 8);
        assert_eq!(pad8(8), 8);
        assert_eq!(pad8(89), 96);
    }
}
