//! Packets the switch sends to the controller, and the two requests that shape them.
//!
//! - OFPT_PACKET_IN (OpenFlow 1.3): `buffer_id u32 | total_len u16 | reason u8 | table_id u8 |
//!   cookie u64 | ofp_match | 2 zero bytes | packet`.
//! - NXT_PACKET_IN2 (Nicira subtype 30): properties (`type u16 | len u16 | value`, padded to
//!   8), see OVS 3.1 `include/openflow/nicira-ext.h` and `lib/ofp-packet.c`. Only this form
//!   carries the `userdata` of a `controller(userdata=...)` action, which is why the audit log
//!   asks for it with NXT_SET_PACKET_IN_FORMAT.
//! - OFPT_SET_ASYNC (OpenFlow 1.3): which asynchronous messages a connection receives.
//!
//! Both packet-ins keep their match/metadata as the bytes received and decode it on demand
//! ([`PacketIn::match_`], [`PacketIn2::metadata`]): a field this crate does not type must not
//! make a packet undeliverable.

use bytes::{BufMut, Bytes};

use crate::error::DecodeError;
use crate::flow_match::Match;
use crate::wire::{pad8, Reader};

pub const OFPT_PACKET_IN: u8 = 10;
pub const OFPT_SET_ASYNC: u8 = 28;

pub const NXT_SET_PACKET_IN_FORMAT: u32 = 16;
pub const NXT_PACKET_IN2: u32 = 30;

/// NXT_SET_PACKET_IN_FORMAT values.
pub const NXPIF_STANDARD: u32 = 0;
pub const NXPIF_NXT_PACKET_IN: u32 = 1;
pub const NXPIF_NXT_PACKET_IN2: u32 = 2;

pub const NXPINT_PACKET: u16 = 0;
pub const NXPINT_FULL_LEN: u16 = 1;
pub const NXPINT_BUFFER_ID: u16 = 2;
pub const NXPINT_TABLE_ID: u16 = 3;
pub const NXPINT_COOKIE: u16 = 4;
pub const NXPINT_REASON: u16 = 5;
pub const NXPINT_METADATA: u16 = 6;
pub const NXPINT_USERDATA: u16 = 7;
pub const NXPINT_CONTINUATION: u16 = 8;

/// OFPT_PACKET_IN (OpenFlow 1.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacketIn {
    pub buffer_id: u32,
    pub total_len: u16,
    pub reason: u8,
    pub table_id: u8,
    pub cookie: u64,
    /// The whole `ofp_match`, with its header and padding.
    pub match_raw: Bytes,
    pub data: Bytes,
}

impl PacketIn {
    pub fn encoded_len(&self) -> usize {
        16 + self.match_raw.len() + 2 + self.data.len()
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(self.buffer_id);
        buf.put_u16(self.total_len);
        buf.put_u8(self.reason);
        buf.put_u8(self.table_id);
        buf.put_u64(self.cookie);
        buf.put_slice(&self.match_raw);
        buf.put_u16(0);
        buf.put_slice(&self.data);
    }

    pub fn decode(body: &[u8]) -> Result<PacketIn, DecodeError> {
        let mut r = Reader::new(body, "PACKET_IN");
        let buffer_id = r.u32()?;
        let total_len = r.u16()?;
        let reason = r.u8()?;
        let table_id = r.u8()?;
        let cookie = r.u64()?;
        let start = r.rest();
        let mut m = Reader::new(start, "PACKET_IN match");
        let _typ = m.u16()?;
        let len = m.u16()? as usize;
        if len < 4 {
            return Err(DecodeError::BadLength { what: "PACKET_IN match", len });
        }
        let match_raw = Bytes::copy_from_slice(r.bytes(pad8(len))?);
        if r.u16()? != 0 {
            return Err(DecodeError::BadValue { what: "PACKET_IN pad", value: 0 });
        }
        let data = r.take_rest();
        Ok(PacketIn { buffer_id, total_len, reason, table_id, cookie, match_raw, data })
    }

    /// The match (in_port, metadata, registers...), decoded.
    pub fn match_(&self) -> Result<Match, DecodeError> {
        Match::decode(&mut Reader::new(&self.match_raw, "PACKET_IN match"))
    }
}

/// NXT_PACKET_IN2. Absent properties are `None`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PacketIn2 {
    /// The packet, cut to the controller action's `max_len`.
    pub packet: Bytes,
    /// The packet's full length when `packet` was cut.
    pub full_len: Option<u32>,
    pub buffer_id: Option<u32>,
    pub table_id: Option<u8>,
    pub cookie: Option<u64>,
    pub reason: Option<u8>,
    /// Raw OXM/NXM TLVs (no `ofp_match` header) of the pipeline fields: in_port, registers...
    pub metadata_raw: Option<Bytes>,
    pub userdata: Option<Bytes>,
    /// Continuation and unknown properties, whole (header, value, padding), in order.
    pub other_props: Vec<Bytes>,
}

impl PacketIn2 {
    /// The length of the packet at the switch (`full_len`, or the packet's own length).
    pub fn total_len(&self) -> u32 {
        self.full_len.unwrap_or(self.packet.len() as u32)
    }

    /// The pipeline fields as a [`Match`].
    pub fn metadata(&self) -> Result<Match, DecodeError> {
        Match::decode_tlvs(self.metadata_raw.as_deref().unwrap_or_default())
    }

    /// Length of the experimenter body after `vendor | subtype`.
    pub fn encoded_len(&self) -> usize {
        let p = |n: usize| pad8(4 + n);
        p(self.packet.len())
            + self.full_len.map_or(0, |_| 8)
            + self.buffer_id.map_or(0, |_| 8)
            + self.table_id.map_or(0, |_| 8)
            + self.cookie.map_or(0, |_| 16)
            + self.reason.map_or(0, |_| 8)
            + self.metadata_raw.as_ref().map_or(0, |m| p(m.len()))
            + self.userdata.as_ref().map_or(0, |u| p(u.len()))
            + self.other_props.iter().map(|b| b.len()).sum::<usize>()
    }

    /// Writes the properties in OVS's order (ofputil_put_packet_in).
    pub fn encode(&self, buf: &mut impl BufMut) {
        fn prop(buf: &mut impl BufMut, typ: u16, value: &[u8]) {
            let l = 4 + value.len();
            buf.put_u16(typ);
            buf.put_u16(l.min(u16::MAX as usize) as u16);
            buf.put_slice(value);
            buf.put_bytes(0, pad8(l) - l);
        }
        prop(buf, NXPINT_PACKET, &self.packet);
        if let Some(v) = self.full_len {
            prop(buf, NXPINT_FULL_LEN, &v.to_be_bytes());
        }
        if let Some(v) = self.buffer_id {
            prop(buf, NXPINT_BUFFER_ID, &v.to_be_bytes());
        }
        if let Some(v) = self.table_id {
            prop(buf, NXPINT_TABLE_ID, &[v]);
        }
        if let Some(v) = self.cookie {
            // ofpprop_put_be64: the value 8-aligned, after 4 zero bytes.
            let mut b = [0u8; 12];
            b[4..].copy_from_slice(&v.to_be_bytes());
            prop(buf, NXPINT_COOKIE, &b);
        }
        if let Some(v) = self.reason {
            prop(buf, NXPINT_REASON, &[v]);
        }
        if let Some(m) = &self.metadata_raw {
            prop(buf, NXPINT_METADATA, m);
        }
        if let Some(u) = &self.userdata {
            prop(buf, NXPINT_USERDATA, u);
        }
        for p in &self.other_props {
            buf.put_slice(p);
        }
    }

    /// Decodes the properties (the body after `vendor | subtype`). A property of a known type
    /// with an impossible size is an error naming it; an unknown one is kept.
    pub fn decode(body: &[u8]) -> Result<PacketIn2, DecodeError> {
        let mut r = Reader::new(body, "NXT_PACKET_IN2");
        let mut p = PacketIn2::default();
        while !r.is_empty() {
            let head = r.rest();
            let mut h = Reader::new(head, "NXT_PACKET_IN2 property");
            let typ = h.u16()?;
            let len = h.u16()? as usize;
            if len < 4 || pad8(len) > head.len() {
                return Err(DecodeError::BadLength { what: "NXT_PACKET_IN2 property", len });
            }
            let whole = r.bytes(pad8(len))?;
            let value = &whole[4..len];
            let mut v = Reader::new(value, "NXT_PACKET_IN2 property");
            let bad = |what: &'static str| DecodeError::BadLength { what, len };
            match typ {
                NXPINT_PACKET => p.packet = Bytes::copy_from_slice(value),
                NXPINT_FULL_LEN if value.len() == 4 => p.full_len = Some(v.u32()?),
                NXPINT_BUFFER_ID if value.len() == 4 => p.buffer_id = Some(v.u32()?),
                NXPINT_TABLE_ID if !value.is_empty() => p.table_id = Some(v.u8()?),
                NXPINT_COOKIE if value.len() == 12 => {
                    v.skip(4)?;
                    p.cookie = Some(v.u64()?)
                }
                NXPINT_REASON if !value.is_empty() => p.reason = Some(v.u8()?),
                NXPINT_METADATA => p.metadata_raw = Some(Bytes::copy_from_slice(value)),
                NXPINT_USERDATA => p.userdata = Some(Bytes::copy_from_slice(value)),
                NXPINT_FULL_LEN => return Err(bad("NXT_PACKET_IN2 full_len")),
                NXPINT_BUFFER_ID => return Err(bad("NXT_PACKET_IN2 buffer_id")),
                NXPINT_TABLE_ID => return Err(bad("NXT_PACKET_IN2 table_id")),
                NXPINT_COOKIE => return Err(bad("NXT_PACKET_IN2 cookie")),
                NXPINT_REASON => return Err(bad("NXT_PACKET_IN2 reason")),
                _ => p.other_props.push(Bytes::copy_from_slice(whole)),
            }
        }
        Ok(p)
    }
}

/// OFPT_SET_ASYNC (OpenFlow 1.3): per message type, a bitmap of reasons, for the primary (or
/// equal) role and for the secondary role. Index 0 is primary/equal, 1 secondary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AsyncConfig {
    /// Bit `1 << OFPR_*`.
    pub packet_in: [u32; 2],
    /// Bit `1 << OFPPR_*` (add 0, delete 1, modify 2).
    pub port_status: [u32; 2],
    /// Bit `1 << OFPRR_*`.
    pub flow_removed: [u32; 2],
}

impl AsyncConfig {
    pub const LEN: usize = 24;

    /// Only packet-ins sent by a `controller` action, nothing else: what the audit log needs.
    pub fn packet_in_action_only() -> AsyncConfig {
        let action = 1 << crate::controller::OFPR_ACTION;
        AsyncConfig { packet_in: [action, action], ..AsyncConfig::default() }
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        for m in [self.packet_in, self.port_status, self.flow_removed] {
            buf.put_u32(m[0]);
            buf.put_u32(m[1]);
        }
    }

    pub fn decode(body: &[u8]) -> Result<AsyncConfig, DecodeError> {
        if body.len() != Self::LEN {
            return Err(DecodeError::BadLength { what: "SET_ASYNC", len: 8 + body.len() });
        }
        let mut r = Reader::new(body, "SET_ASYNC");
        let mut pair = || -> Result<[u32; 2], DecodeError> { Ok([r.u32()?, r.u32()?]) };
        Ok(AsyncConfig { packet_in: pair()?, port_status: pair()?, flow_removed: pair()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Message, OfMessage};
    use crate::wire::hex;
    use crate::NxmField;

    /// tests/ofp-print.at "NX_PACKET_IN2", with the version byte 01 -> 04 (the NX message is
    /// the same in every version): OVS prints table_id=7 cookie=0xfedcba9876543210
    /// total_len=64 metadata=0x5a5a5a5a5a5a5a5a (via action) data_len=48 buffer=0x00000114
    /// userdata=01.02.03.04.05.
    #[test]
    fn ovs_packet_in2_vector() {
        let v = hex(
            "04 04 0098 00000000 00002320 0000001e
            0000 0034
              82 82 82 82 82 82 80 81 81 81 81 81 81 00 00 50
              08 00 45 00 00 28 00 00 00 00 00 06 32 05 53 53
              53 53 54 54 54 54 00 55 00 56 00 00 00 00 00 00   00000000
            0001 0008 00000040
            0002 0008 00000114
            0003 0005 07   000000
            0004 0010 00000000   fedcba9876543210
            0005 0005 01   000000
            0006 0010 80000408 5a5a5a5a5a5a5a5a
            0007 0009 0102030405  00000000000000",
        );
        let m = OfMessage::decode(&v).unwrap();
        let Message::PacketIn2(p) = &m.msg else { panic!("{m:?}") };
        assert_eq!(p.packet.len(), 48);
        assert_eq!(p.total_len(), 64);
        assert_eq!(p.buffer_id, Some(0x114));
        assert_eq!(p.table_id, Some(7));
        assert_eq!(p.cookie, Some(0xfedc_ba98_7654_3210));
        assert_eq!(p.reason, Some(1));
        assert_eq!(p.userdata.as_deref(), Some(&[1u8, 2, 3, 4, 5][..]));
        // OXM_OF_METADATA is not typed by this crate: kept as a raw field of the match.
        let md = p.metadata().unwrap();
        assert_eq!(md.other.len(), 1, "{md:?}");
        assert_eq!(m.to_bytes().unwrap().to_vec(), v);
    }

    /// tests/ofp-print.at "OFPT_PACKET_IN - OF1.3": cookie=0x102030405060708 total_len=42
    /// in_port=LOCAL (via no_match) data_len=42 buffer=0xffffff00.
    #[test]
    fn ovs_packet_in_vector() {
        let v = hex("040a005400000000ffffff00002a000001020304050607080001000c80000004fffffffe000000000000ffffffffffff00232083c15f8035000108000604000300232083c15f0000000000232083c15f00000000");
        let m = OfMessage::decode(&v).unwrap();
        let Message::PacketIn(p) = &m.msg else { panic!("{m:?}") };
        assert_eq!((p.buffer_id, p.total_len, p.reason, p.table_id, p.cookie), (0xffffff00, 42, 0, 0, 0x0102030405060708));
        assert_eq!(p.data.len(), 42);
        assert_eq!(p.match_().unwrap().in_port, Some(crate::PortNo::LOCAL));
        assert_eq!(m.to_bytes().unwrap().to_vec(), v);
    }

    #[test]
    fn packet_in2_metadata_with_registers() {
        let p = PacketIn2 {
            packet: Bytes::from_static(b"abc"),
            table_id: Some(0),
            cookie: Some(5),
            reason: Some(1),
            // in_port=3 (OXM), reg1=9 (NXM)
            metadata_raw: Some(Bytes::from(hex("80000004 00000003 00010204 00000009"))),
            userdata: Some(Bytes::from_static(&[1])),
            ..PacketIn2::default()
        };
        let m = OfMessage::new(0, Message::PacketIn2(p.clone()));
        let b = m.to_bytes().unwrap();
        assert_eq!(OfMessage::decode(&b).unwrap(), m);
        let md = p.metadata().unwrap();
        assert_eq!(md.in_port, Some(crate::PortNo(3)));
        assert_eq!(md.regs[1].map(|r| r.value()), Some(9));
        let _ = NxmField::Reg(1);
    }

    /// A packet-in2 with a property cut short, or a known property of the wrong size, is an
    /// error, never a panic.
    #[test]
    fn hostile_packet_in2() {
        for body in ["0000 0010 0102", "0001 0005 01 000000", "0000 0003 00000000", "0004 0008 00000000"] {
            assert!(PacketIn2::decode(&hex(body)).is_err(), "{body}");
        }
        assert!(PacketIn::decode(&hex("ffffffff 0010 01 00 0000000000000000 0001 0002")).is_err());
    }

    /// tests/ofp-print.at "OFPT_SET_ASYNC - OF1.3".
    #[test]
    fn ovs_set_async_vector() {
        let v = hex("041c002000000000000010050000100700000003000000070000000000000003");
        let m = OfMessage::decode(&v).unwrap();
        let Message::SetAsync(a) = &m.msg else { panic!("{m:?}") };
        assert_eq!(a.packet_in, [0x1005, 0x1007]);
        assert_eq!(a.flow_removed, [0, 3]);
        assert_eq!(m.to_bytes().unwrap().to_vec(), v);
    }

    /// tests/ofp-print.at "NXT_SET_PACKET_IN" (version byte 01 -> 04): format=nxt_packet_in.
    #[test]
    fn ovs_set_packet_in_format_vector() {
        let v = hex("04 04 00 14 00 00 00 02 00 00 23 20 00 00 00 10 00 00 00 01");
        let m = OfMessage::decode(&v).unwrap();
        assert_eq!(m.msg, Message::SetPacketInFormat(NXPIF_NXT_PACKET_IN));
        assert_eq!(m.to_bytes().unwrap().to_vec(), v);
    }
}
