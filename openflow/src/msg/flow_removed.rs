//! OFPT_FLOW_REMOVED (OpenFlow 1.3, type 11): a flow that had `OFPFF_SEND_FLOW_REM` left the
//! table (timed out, deleted, or replaced by a strict ADD of the same match and priority),
//! with what it counted until then.
//!
//! `cookie u64 | priority u16 | reason u8 | table_id u8 | duration_sec u32 | duration_nsec u32 |
//! idle_timeout u16 | hard_timeout u16 | packet_count u64 | byte_count u64 | ofp_match`
//! (40 bytes, then the match padded to 8; 56 bytes at least with the header). SOURCE
//! `include/openflow/openflow-1.3.h` (`struct ofp13_flow_removed`), `lib/ofp-monitor.c`.
//!
//! The match is kept as the bytes received and decoded on demand ([`FlowRemoved::match_`]):
//! a field this crate does not type must not lose the counts.

use bytes::{BufMut, Bytes};

use crate::error::DecodeError;
use crate::flow_match::Match;
use crate::wire::{pad8, Reader};

pub const OFPT_FLOW_REMOVED: u8 = 11;

/// OFPRR_* reasons.
pub const OFPRR_IDLE_TIMEOUT: u8 = 0;
pub const OFPRR_HARD_TIMEOUT: u8 = 1;
pub const OFPRR_DELETE: u8 = 2;
pub const OFPRR_GROUP_DELETE: u8 = 3;
pub const OFPRR_METER_DELETE: u8 = 4;

/// OFPT_FLOW_REMOVED (OpenFlow 1.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowRemoved {
    pub cookie: u64,
    pub priority: u16,
    /// OFPRR_*; unknown values are kept.
    pub reason: u8,
    pub table_id: u8,
    pub duration_sec: u32,
    pub duration_nsec: u32,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub packet_count: u64,
    pub byte_count: u64,
    /// The whole `ofp_match`, with its header and padding.
    pub match_raw: Bytes,
}

impl FlowRemoved {
    /// The fixed part of the body (after the header, before the match).
    pub const FIXED_LEN: usize = 40;

    pub fn encoded_len(&self) -> usize {
        Self::FIXED_LEN + self.match_raw.len()
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u64(self.cookie);
        buf.put_u16(self.priority);
        buf.put_u8(self.reason);
        buf.put_u8(self.table_id);
        buf.put_u32(self.duration_sec);
        buf.put_u32(self.duration_nsec);
        buf.put_u16(self.idle_timeout);
        buf.put_u16(self.hard_timeout);
        buf.put_u64(self.packet_count);
        buf.put_u64(self.byte_count);
        buf.put_slice(&self.match_raw);
    }

    /// Decodes the body. Never panics: short bodies, a short or overlong match length and
    /// trailing bytes are errors.
    pub fn decode(body: &[u8]) -> Result<FlowRemoved, DecodeError> {
        let mut r = Reader::new(body, "FLOW_REMOVED");
        let cookie = r.u64()?;
        let priority = r.u16()?;
        let reason = r.u8()?;
        let table_id = r.u8()?;
        let duration_sec = r.u32()?;
        let duration_nsec = r.u32()?;
        let idle_timeout = r.u16()?;
        let hard_timeout = r.u16()?;
        let packet_count = r.u64()?;
        let byte_count = r.u64()?;
        let mut m = Reader::new(r.rest(), "FLOW_REMOVED match");
        let _typ = m.u16()?;
        let len = m.u16()? as usize;
        if len < 4 {
            return Err(DecodeError::BadLength { what: "FLOW_REMOVED match", len });
        }
        let match_raw = Bytes::copy_from_slice(r.bytes(pad8(len))?);
        if r.remaining() != 0 {
            return Err(DecodeError::BadLength { what: "FLOW_REMOVED", len: 8 + body.len() });
        }
        Ok(FlowRemoved {
            cookie,
            priority,
            reason,
            table_id,
            duration_sec,
            duration_nsec,
            idle_timeout,
            hard_timeout,
            packet_count,
            byte_count,
            match_raw,
        })
    }

    /// The match, decoded.
    pub fn match_(&self) -> Result<Match, DecodeError> {
        Match::decode(&mut Reader::new(&self.match_raw, "FLOW_REMOVED match"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Message, OfMessage};

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// `ovs-ofctl ofp-print` (OVS 3.x) of these bytes: `OFPT_FLOW_REMOVED (OF1.3) (xid=0x1):
    /// in_port=3 reason=delete table_id=5 cookie:0xfedcba9876543210 duration5.500s idle60
    /// hard120 pkts12 bytes3456`.
    const OVS_PRINTED: &str = "040b0040 00000001 fedcba9876543210 8000 02 05 00000005 1dcd6500 003c 0078
        000000000000000c 0000000000000d80 0001000c 80000004 00000003 00000000";

    #[test]
    fn decodes_what_ovs_prints() {
        let bytes = hex(OVS_PRINTED);
        let m = OfMessage::decode(&bytes).unwrap();
        assert_eq!(m.xid, 1);
        let Message::FlowRemoved(f) = &m.msg else { panic!("{m:?}") };
        assert_eq!(f.cookie, 0xfedc_ba98_7654_3210);
        assert_eq!(f.priority, 0x8000);
        assert_eq!(f.reason, OFPRR_DELETE);
        assert_eq!(f.table_id, 5);
        assert_eq!((f.duration_sec, f.duration_nsec), (5, 500_000_000));
        assert_eq!((f.idle_timeout, f.hard_timeout), (60, 120));
        assert_eq!((f.packet_count, f.byte_count), (12, 3456));
        assert_eq!(f.match_().unwrap().in_port, Some(crate::port::PortNo(3)));
        assert_eq!(m.msg.name(), "FLOW_REMOVED");
        // And back, byte for byte.
        let mut out = bytes::BytesMut::new();
        m.encode(&mut out).unwrap();
        assert_eq!(&out[..], &bytes[..]);
    }

    #[test]
    fn every_truncation_and_bad_length_is_an_error_not_a_panic() {
        let bytes = hex(OVS_PRINTED);
        let body = &bytes[8..];
        for n in 0..body.len() {
            assert!(FlowRemoved::decode(&body[..n]).is_err(), "{n} bytes");
        }
        // A match length below its own header, one past the body, trailing bytes.
        for (at, v) in [(43usize, 0u8), (43, 3), (43, 4), (43, 0x20)] {
            let mut b = body.to_vec();
            b[at] = v;
            assert!(FlowRemoved::decode(&b).is_err(), "byte {at} = {v}");
        }
        let mut b = body.to_vec();
        b.extend_from_slice(&[0; 8]);
        assert!(FlowRemoved::decode(&b).is_err(), "trailing bytes");
        // Every single-byte value at every offset: no panic.
        for at in 0..body.len() {
            for v in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut b = body.to_vec();
                b[at] = v;
                let _ = FlowRemoved::decode(&b).map(|f| f.match_());
            }
        }
    }
}
