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

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Hello {
    pub elements: Vec<HelloElement>,
}

impl Hello {
    /// A HELLO that offers exactly OpenFlow 1.3 (bitmap 0x10), as OVS sends on a 1.3-only bridge.
    pub fn of13() -> Hello {
        Hello { elements: vec![HelloElement::VersionBitmap(vec![1 << crate::OFP_VERSION])] }
    }

    /// The versions the peer offers: from the bitmap if present, else every version up to and
    /// including `header_version` (OpenFlow's rule for a HELLO without a bitmap).
    pub fn versions(&self, header_version: u8) -> Vec<u8> {
        for e in &self.elements {
            if let HelloElement::VersionBitmap(words) = e {
                let mut out = Vec::new();
                for (i, w) in words.iter().enumerate() {
                    for bit in 0..32 {
                        if w & (1 << bit) != 0 {
                            if let Ok(v) = u8::try_from(i * 32 + bit) {
                                out.push(v);
                            }
                        }
                    }
                }
                return out;
            }
        }
        (1..=header_version).collect()
    }

    pub fn encoded_len(&self) -> usize {
        self.elements.iter().map(|e| pad8(e.unpadded_len())).sum()
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
    }

    pub fn decode(body: &[u8]) -> Result<Hello, DecodeError> {
        let mut r = Reader::new(body, "hello element");
        let mut elements = Vec::new();
        while !r.is_empty() {
            let typ = r.u16()?;
            let len = r.u16()? as usize;
            if len < 4 {
                return Err(DecodeError::BadLength { what: "hello element", len });
            }
            let data = r.bytes(len - 4)?;
            // The last element's padding may be missing in the wild; tolerate a short tail.
            r.skip((pad8(len) - len).min(r.remaining()))?;
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
        Ok(Hello { elements })
    }
}
