//! OFPT_HELLO with its version-bitmap element.

use bytes::{BufMut, Bytes};

use crate::error::DecodeError;
use crate::wire::{pad8, Reader};

pub const OFPHET_VERSIONBITMAP: u16 = 1;

/// A HELLO element: `type u16 | length u16 (without padding) | data | pad to 8`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelloElement {
    /// Bit `n` of the concatenated bitmaps set = wire version `n` supported.
    VersionBitmap(Vec<u32>),
    Unknown { typ: u16, data: Bytes },
}

impl HelloElement {
    fn unpadded_len(&self) -> usize {
        4 + match self {
            HelloElement::VersionBitmap(b) => 4 * b.len(),
            HelloElement::Unknown { data, .. } => data.len(),
        }
    }
}

/// An OFPT_HELLO body.
///
/// Decoding follows OVS (`ofputil_decode_hello`): elements are read while a whole element,
/// padding included, is left; whatever follows (fewer than 4 bytes, an element length below 4,
/// an element whose padded length runs past the end) is ignored for negotiation and kept in
/// [`Hello::trailing`] so the message re-encodes byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Hello {
    pub elements: Vec<HelloElement>,
    /// Bytes after the last whole element, as received (empty in anything this crate builds).
    pub trailing: Bytes,
}

/// The highest version a HELLO bitmap can announce to OVS: it reads only the first 32-bit word.
const MAX_BITMAP_VERSION: u8 = 31;

impl Hello {
    /// A HELLO that offers exactly OpenFlow 1.3 (bitmap 0x10), as OVS sends on a 1.3-only bridge.
    pub fn of13() -> Hello {
        Hello { elements: vec![HelloElement::VersionBitmap(vec![1 << crate::OFP_VERSION])], trailing: Bytes::new() }
    }

    /// The versions the peer offers, as OVS interprets a HELLO:
    /// - without a usable bitmap: every version from 1 up to the header's version (capped at
    ///   0x1f; version 0 offers nothing);
    /// - a bitmap element is usable if it has at least one 32-bit word; only the first word
    ///   counts (versions above 0x1f are ignored), bit 0 is cleared (there is no version 0), and
    ///   a bitmap left with no bit set is ignored;
    /// - with several usable bitmaps, the last one wins.
    pub fn versions(&self, header_version: u8) -> Vec<u8> {
        let mut allowed: u32 = match header_version {
            0 => 0,
            v if v > MAX_BITMAP_VERSION => !1,
            v => ((1u32 << v) - 1) << 1,
        };
        for e in &self.elements {
            if let HelloElement::VersionBitmap(words) = e {
                let first = words.first().copied().unwrap_or(0) & !1;
                if first != 0 {
                    allowed = first;
                }
            }
        }
        (1..=MAX_BITMAP_VERSION).filter(|v| allowed & (1 << v) != 0).collect()
    }

    pub fn encoded_len(&self) -> usize {
        self.elements.iter().map(|e| pad8(e.unpadded_len())).sum::<usize>() + self.trailing.len()
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        for e in &self.elements {
            let len = e.unpadded_len();
            match e {
                HelloElement::VersionBitmap(words) => {
                    buf.put_u16(OFPHET_VERSIONBITMAP);
                    buf.put_u16(len as u16);
                    for w in words {
                        buf.put_u32(*w);
                    }
                }
                HelloElement::Unknown { typ, data } => {
                    buf.put_u16(*typ);
                    buf.put_u16(len as u16);
                    buf.put_slice(data);
                }
            }
            buf.put_bytes(0, pad8(len) - len);
        }
        buf.put_slice(&self.trailing);
    }

    /// Never fails: anything that is not a whole element is kept as trailing bytes.
    pub fn decode(body: &[u8]) -> Result<Hello, DecodeError> {
        let mut r = Reader::new(body, "hello element");
        let mut elements = Vec::new();
        while r.remaining() >= 4 {
            let mut h = Reader::new(r.rest(), "hello element");
            let typ = h.u16()?;
            let len = h.u16()? as usize;
            if len < 4 || pad8(len) > r.remaining() {
                break;
            }
            let whole = r.bytes(pad8(len))?;
            let data = &whole[4..len];
            let padding = &whole[len..];
            // Non-zero padding would be lost by the typed element: keep it (and the rest) raw.
            if padding.iter().any(|&b| b != 0) {
                let mut rest = whole.to_vec();
                rest.extend_from_slice(r.rest());
                return Ok(Hello { elements, trailing: Bytes::from(rest) });
            }
            elements.push(if typ == OFPHET_VERSIONBITMAP && data.len() % 4 == 0 {
                let mut d = Reader::new(data, "version bitmap");
                let mut words = Vec::with_capacity(data.len() / 4);
                while !d.is_empty() {
                    words.push(d.u32()?);
                }
                HelloElement::VersionBitmap(words)
            } else {
                HelloElement::Unknown { typ, data: Bytes::copy_from_slice(data) }
            });
        }
        Ok(Hello { elements, trailing: r.take_rest() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;

    fn versions(body: &str, header_version: u8) -> Vec<u8> {
        let b = hex(body);
        let h = Hello::decode(&b).unwrap();
        let mut again = Vec::new();
        h.encode(&mut again);
        assert_eq!(again, b, "re-encodes byte for byte");
        assert_eq!(h.encoded_len(), b.len());
        h.versions(header_version)
    }

    #[test]
    fn no_bitmap_means_up_to_the_header_version() {
        assert_eq!(versions("", 4), vec![1, 2, 3, 4]);
        assert_eq!(versions("", 1), vec![1]);
        assert_eq!(versions("", 0), Vec::<u8>::new());
        // OVS caps at 0x1f: a header version above that offers 1..=31.
        assert_eq!(versions("", 0x40), (1..=31).collect::<Vec<u8>>());
    }

    #[test]
    fn bitmap_semantics_follow_ovs() {
        assert_eq!(versions("0001 0008 00000010", 6), vec![4]);
        assert_eq!(versions("0001 0008 00000012", 4), vec![1, 4]);
        // Bit 0 (version 0) is cleared.
        assert_eq!(versions("0001 0008 00000011", 4), vec![4]);
        // All-zero bitmap (or only bit 0): ignored, the header version rule applies.
        assert_eq!(versions("0001 0008 00000000", 3), vec![1, 2, 3]);
        assert_eq!(versions("0001 0008 00000001", 2), vec![1, 2]);
        // Only the first word counts: versions above 0x1f are ignored.
        assert_eq!(versions("0001 000c 00000010 00000001 00000000", 4), vec![4]);
        assert_eq!(versions("0001 000c 00000000 00000001 00000000", 4), vec![1, 2, 3, 4]);
        // Empty bitmap element (length 4): ignored.
        assert_eq!(versions("0001 0004 00000000", 4), vec![1, 2, 3, 4]);
        // Unknown elements are skipped; the last usable bitmap wins.
        assert_eq!(versions("0002 0006 abcd 0000 0001 0008 00000002 0001 0008 00000010", 4), vec![4]);
    }

    #[test]
    fn trailing_bytes_are_ignored() {
        // 3 stray bytes after a bitmap.
        assert_eq!(versions("0001 0008 00000010 aabbcc", 4), vec![4]);
        // An element length below 4 stops parsing.
        assert_eq!(versions("0001 0008 00000010 0001 0002 00000000", 4), vec![4]);
        // An element whose padded length runs past the end is not used (OVS cannot pull it).
        assert_eq!(versions("0001 000c 00000002 00000000", 4), vec![1, 2, 3, 4]);
        let h = Hello::decode(&hex("0001 0008 00000010 aabbcc")).unwrap();
        assert_eq!(h.elements, vec![HelloElement::VersionBitmap(vec![0x10])]);
        assert_eq!(&h.trailing[..], &[0xaa, 0xbb, 0xcc]);
        // Non-zero padding is kept raw rather than dropped.
        assert_eq!(versions("0002 0005 01 ffffff", 4), vec![1, 2, 3, 4]);
    }
}
