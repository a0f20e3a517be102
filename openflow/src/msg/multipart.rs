//! OFPT_MULTIPART_REQUEST / REPLY: flow stats, aggregate stats and port descriptions.
//!
//! A large reply is split into several messages with the same xid, all but the last flagged
//! OFPMPF_REPLY_MORE; [`MultipartAssembler`] joins them.

use bytes::{BufMut, Bytes};

use crate::error::{DecodeError, EncodeError};
use crate::flow_match::{MacAddr, Match};
use crate::instruction::{decode_instructions, encode_instructions, instructions_len, Instruction};
use crate::msg::flow_mod::{FlowModFlags, OFPG_ANY, OFPTT_ALL};
use crate::port::PortNo;
use crate::wire::{len_u16, Reader};

pub const OFPMP_DESC: u16 = 0;
pub const OFPMP_FLOW: u16 = 1;
pub const OFPMP_AGGREGATE: u16 = 2;
pub const OFPMP_PORT_DESC: u16 = 13;
pub const OFPMP_METER: u16 = 9;
pub const OFPMP_METER_FEATURES: u16 = 11;
/// OFPMPF_REQ_MORE / OFPMPF_REPLY_MORE.
pub const OFPMPF_MORE: u16 = 1;

/// Body of an OFPMP_FLOW or OFPMP_AGGREGATE request: which flows to report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowStatsRequest {
    pub table_id: u8,
    pub out_port: PortNo,
    pub out_group: u32,
    pub cookie: u64,
    pub cookie_mask: u64,
    /// Loose match: flows equal to or more specific than this are reported.
    pub match_: Match,
}

impl Default for FlowStatsRequest {
    /// Every flow in every table.
    fn default() -> Self {
        FlowStatsRequest {
            table_id: OFPTT_ALL,
            out_port: PortNo::ANY,
            out_group: OFPG_ANY,
            cookie: 0,
            cookie_mask: 0,
            match_: Match::any(),
        }
    }
}

impl FlowStatsRequest {
    fn encoded_len(&self) -> usize {
        32 + self.match_.encoded_len()
    }
    fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u8(self.table_id);
        buf.put_bytes(0, 3);
        buf.put_u32(self.out_port.0);
        buf.put_u32(self.out_group);
        buf.put_u32(0);
        buf.put_u64(self.cookie);
        buf.put_u64(self.cookie_mask);
        self.match_.encode(buf);
    }
    fn decode(body: &[u8]) -> Result<FlowStatsRequest, DecodeError> {
        let mut r = Reader::new(body, "flow stats request");
        let table_id = r.u8()?;
        r.skip(3)?;
        let out_port = PortNo(r.u32()?);
        let out_group = r.u32()?;
        r.skip(4)?;
        let cookie = r.u64()?;
        let cookie_mask = r.u64()?;
        let match_ = Match::decode(&mut r)?;
        if !r.is_empty() {
            return Err(DecodeError::BadLength { what: "flow stats request", len: body.len() });
        }
        Ok(FlowStatsRequest { table_id, out_port, out_group, cookie, cookie_mask, match_ })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultipartRequestBody {
    Desc,
    Flow(FlowStatsRequest),
    Aggregate(FlowStatsRequest),
    PortDesc,
    /// OFPMP_METER_FEATURES (empty body).
    MeterFeatures,
    /// OFPMP_METER for one meter id (or OFPM_ALL).
    MeterStats(u32),
    Unknown { mp_type: u16, body: Bytes },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultipartRequest {
    pub flags: u16,
    pub body: MultipartRequestBody,
}

impl MultipartRequest {
    pub fn flows(req: FlowStatsRequest) -> MultipartRequest {
        MultipartRequest { flags: 0, body: MultipartRequestBody::Flow(req) }
    }
    pub fn port_desc() -> MultipartRequest {
        MultipartRequest { flags: 0, body: MultipartRequestBody::PortDesc }
    }
    pub fn meter_features() -> MultipartRequest {
        MultipartRequest { flags: 0, body: MultipartRequestBody::MeterFeatures }
    }

    pub fn encoded_len(&self) -> usize {
        8 + match &self.body {
            MultipartRequestBody::Desc | MultipartRequestBody::PortDesc | MultipartRequestBody::MeterFeatures => 0,
            MultipartRequestBody::MeterStats(_) => 8,
            MultipartRequestBody::Flow(f) | MultipartRequestBody::Aggregate(f) => f.encoded_len(),
            MultipartRequestBody::Unknown { body, .. } => body.len(),
        }
    }

    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        let typ = match &self.body {
            MultipartRequestBody::Desc => OFPMP_DESC,
            MultipartRequestBody::Flow(_) => OFPMP_FLOW,
            MultipartRequestBody::Aggregate(_) => OFPMP_AGGREGATE,
            MultipartRequestBody::PortDesc => OFPMP_PORT_DESC,
            MultipartRequestBody::MeterFeatures => OFPMP_METER_FEATURES,
            MultipartRequestBody::MeterStats(_) => OFPMP_METER,
            MultipartRequestBody::Unknown { mp_type, .. } => *mp_type,
        };
        buf.put_u16(typ);
        buf.put_u16(self.flags);
        buf.put_u32(0);
        match &self.body {
            MultipartRequestBody::Desc | MultipartRequestBody::PortDesc | MultipartRequestBody::MeterFeatures => {}
            MultipartRequestBody::MeterStats(id) => {
                buf.put_u32(*id);
                buf.put_u32(0);
            }
            MultipartRequestBody::Flow(f) | MultipartRequestBody::Aggregate(f) => f.encode(buf),
            MultipartRequestBody::Unknown { body, .. } => buf.put_slice(body),
        }
        Ok(())
    }

    pub fn decode(body: &[u8]) -> Result<MultipartRequest, DecodeError> {
        let mut r = Reader::new(body, "MULTIPART_REQUEST");
        let mp_type = r.u16()?;
        let flags = r.u16()?;
        r.skip(4)?;
        let rest = r.rest();
        let body = match mp_type {
            OFPMP_DESC if rest.is_empty() => MultipartRequestBody::Desc,
            OFPMP_PORT_DESC if rest.is_empty() => MultipartRequestBody::PortDesc,
            OFPMP_METER_FEATURES if rest.is_empty() => MultipartRequestBody::MeterFeatures,
            OFPMP_METER if rest.len() == 8 => {
                let mut m = Reader::new(rest, "meter stats request");
                let (id, pad) = (m.u32()?, m.u32()?);
                // Non-zero padding would be lost by the typed form: keep it raw.
                if pad == 0 {
                    MultipartRequestBody::MeterStats(id)
                } else {
                    MultipartRequestBody::Unknown { mp_type, body: r.take_rest() }
                }
            }
            OFPMP_FLOW => MultipartRequestBody::Flow(FlowStatsRequest::decode(rest)?),
            OFPMP_AGGREGATE => MultipartRequestBody::Aggregate(FlowStatsRequest::decode(rest)?),
            _ => MultipartRequestBody::Unknown { mp_type, body: r.take_rest() },
        };
        Ok(MultipartRequest { flags, body })
    }
}

/// One `ofp_flow_stats` entry: a flow as the switch holds it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlowStats {
    pub table_id: u8,
    pub duration_sec: u32,
    pub duration_nsec: u32,
    pub priority: u16,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub flags: FlowModFlags,
    pub cookie: u64,
    /// `u64::MAX` = not available (printed `?`).
    pub packet_count: u64,
    pub byte_count: u64,
    pub match_: Match,
    pub instructions: Vec<Instruction>,
}

impl FlowStats {
    const FIXED_LEN: usize = 48;

    pub fn encoded_len(&self) -> usize {
        Self::FIXED_LEN + self.match_.encoded_len() + instructions_len(&self.instructions)
    }

    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        buf.put_u16(len_u16("ofp_flow_stats", self.encoded_len())?);
        buf.put_u8(self.table_id);
        buf.put_u8(0);
        buf.put_u32(self.duration_sec);
        buf.put_u32(self.duration_nsec);
        buf.put_u16(self.priority);
        buf.put_u16(self.idle_timeout);
        buf.put_u16(self.hard_timeout);
        buf.put_u16(self.flags.bits());
        buf.put_u32(0);
        buf.put_u64(self.cookie);
        buf.put_u64(self.packet_count);
        buf.put_u64(self.byte_count);
        self.match_.encode(buf);
        encode_instructions(&self.instructions, buf)
    }

    /// Decodes one entry; `r` is positioned at its length field.
    pub fn decode(r: &mut Reader<'_>) -> Result<FlowStats, DecodeError> {
        let len = Reader::new(r.rest(), "ofp_flow_stats").u16()? as usize;
        if len < Self::FIXED_LEN + 8 || !len.is_multiple_of(8) {
            return Err(DecodeError::BadLength { what: "ofp_flow_stats", len });
        }
        let mut e = Reader::new(r.bytes(len)?, "ofp_flow_stats");
        e.skip(2)?;
        let table_id = e.u8()?;
        e.skip(1)?;
        let duration_sec = e.u32()?;
        let duration_nsec = e.u32()?;
        let priority = e.u16()?;
        let idle_timeout = e.u16()?;
        let hard_timeout = e.u16()?;
        let flags = FlowModFlags::from_bits_retain(e.u16()?);
        e.skip(4)?;
        let cookie = e.u64()?;
        let packet_count = e.u64()?;
        let byte_count = e.u64()?;
        let match_ = Match::decode(&mut e)?;
        let instructions = decode_instructions(e.rest())?;
        Ok(FlowStats {
            table_id,
            duration_sec,
            duration_nsec,
            priority,
            idle_timeout,
            hard_timeout,
            flags,
            cookie,
            packet_count,
            byte_count,
            match_,
            instructions,
        })
    }
}

/// One entry of a flow-stats reply: typed, or kept whole when this crate cannot model it.
///
/// A switch may hold flows that other tools installed, with matches or actions outside this
/// crate's model. One such flow must not make the whole dump undecodable: the reply is decoded
/// entry by entry, and an entry that does not decode is kept as [`RawFlowStats`] (its exact
/// bytes, re-encoded verbatim) while the others stay typed.
// Typed is the common case (every flow this agent installs); boxing it would cost an allocation
// per entry of every dump to shrink the rare raw case.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FlowStatsEntry {
    Typed(FlowStats),
    Raw(RawFlowStats),
}

impl From<FlowStats> for FlowStatsEntry {
    fn from(f: FlowStats) -> Self {
        FlowStatsEntry::Typed(f)
    }
}

impl FlowStatsEntry {
    /// The typed entry, if this is one.
    pub fn typed(&self) -> Option<&FlowStats> {
        match self {
            FlowStatsEntry::Typed(f) => Some(f),
            FlowStatsEntry::Raw(_) => None,
        }
    }

    pub fn encoded_len(&self) -> usize {
        match self {
            FlowStatsEntry::Typed(f) => f.encoded_len(),
            FlowStatsEntry::Raw(r) => r.bytes.len(),
        }
    }

    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        match self {
            FlowStatsEntry::Typed(f) => f.encode(buf),
            FlowStatsEntry::Raw(r) => {
                buf.put_slice(&r.bytes);
                Ok(())
            }
        }
    }

    /// Decodes one entry, typed if possible. Fails only when the entry's own length field is
    /// unusable (then the rest of the reply cannot be split into entries either).
    pub fn decode(r: &mut Reader<'_>) -> Result<FlowStatsEntry, DecodeError> {
        let len = Reader::new(r.rest(), "ofp_flow_stats").u16()? as usize;
        if len < FlowStats::FIXED_LEN + 8 || !len.is_multiple_of(8) {
            return Err(DecodeError::BadLength { what: "ofp_flow_stats", len });
        }
        let entry = r.bytes(len)?;
        Ok(match FlowStats::decode(&mut Reader::new(entry, "ofp_flow_stats")) {
            Ok(f) => FlowStatsEntry::Typed(f),
            Err(_) => FlowStatsEntry::Raw(RawFlowStats { bytes: Bytes::copy_from_slice(entry) }),
        })
    }
}

/// A flow-stats entry this crate could not decode into [`FlowStats`] (e.g. a match with fields
/// in a combination it does not model), kept byte for byte. The fixed part is still readable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawFlowStats {
    /// The whole `ofp_flow_stats`, from its length field to the end of its instructions. At
    /// least 56 bytes and a multiple of 8 (checked when decoded).
    pub bytes: Bytes,
}

impl RawFlowStats {
    fn be16(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.bytes[at], self.bytes[at + 1]])
    }
    fn be64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.bytes[at..at + 8]);
        u64::from_be_bytes(b)
    }
    /// Reads a fixed-part field, or 0 if a hand-built value is shorter than the fixed part.
    fn fixed<T: Default>(&self, end: usize, get: impl FnOnce(&Self) -> T) -> T {
        if self.bytes.len() >= end {
            get(self)
        } else {
            T::default()
        }
    }
    pub fn table_id(&self) -> u8 {
        self.fixed(3, |s| s.bytes[2])
    }
    pub fn priority(&self) -> u16 {
        self.fixed(14, |s| s.be16(12))
    }
    pub fn cookie(&self) -> u64 {
        self.fixed(32, |s| s.be64(24))
    }
    /// Why the entry did not decode (decoding it again).
    pub fn error(&self) -> Option<DecodeError> {
        FlowStats::decode(&mut Reader::new(&self.bytes, "ofp_flow_stats")).err()
    }
}

/// Splits flow-stats entries into the typed ones and the raw ones, keeping each side's order.
pub fn split_flow_stats(entries: Vec<FlowStatsEntry>) -> (Vec<FlowStats>, Vec<RawFlowStats>) {
    let mut typed = Vec::with_capacity(entries.len());
    let mut raw = Vec::new();
    for e in entries {
        match e {
            FlowStatsEntry::Typed(f) => typed.push(f),
            FlowStatsEntry::Raw(r) => raw.push(r),
        }
    }
    (typed, raw)
}

/// OFPMP_AGGREGATE reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggregateStats {
    pub packet_count: u64,
    pub byte_count: u64,
    pub flow_count: u32,
}

/// An OF1.3 `ofp_port` (64 bytes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Port {
    pub port_no: PortNo,
    pub hw_addr: MacAddr,
    /// NUL-padded name as received.
    pub name: [u8; 16],
    pub config: u32,
    pub state: u32,
    pub curr: u32,
    pub advertised: u32,
    pub supported: u32,
    pub peer: u32,
    pub curr_speed: u32,
    pub max_speed: u32,
}

impl Port {
    pub const LEN: usize = 64;
    /// OFPPS_LIVE.
    pub const STATE_LIVE: u32 = 4;

    /// The name up to the first NUL (lossy UTF-8).
    pub fn name(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }

    fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(self.port_no.0);
        buf.put_u32(0);
        buf.put_slice(&self.hw_addr.0);
        buf.put_u16(0);
        buf.put_slice(&self.name);
        for v in [
            self.config,
            self.state,
            self.curr,
            self.advertised,
            self.supported,
            self.peer,
            self.curr_speed,
            self.max_speed,
        ] {
            buf.put_u32(v);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Port, DecodeError> {
        let port_no = PortNo(r.u32()?);
        r.skip(4)?;
        let hw_addr = MacAddr(r.array()?);
        r.skip(2)?;
        let name = r.array()?;
        Ok(Port {
            port_no,
            hw_addr,
            name,
            config: r.u32()?,
            state: r.u32()?,
            curr: r.u32()?,
            advertised: r.u32()?,
            supported: r.u32()?,
            peer: r.u32()?,
            curr_speed: r.u32()?,
            max_speed: r.u32()?,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MultipartReplyBody {
    /// Flow stats, entry by entry (see [`FlowStatsEntry`]).
    Flow(Vec<FlowStatsEntry>),
    Aggregate(AggregateStats),
    PortDesc(Vec<Port>),
    MeterFeatures(super::MeterFeatures),
    MeterStats(Vec<super::MeterStats>),
    Unknown { mp_type: u16, body: Bytes },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultipartReply {
    pub flags: u16,
    pub body: MultipartReplyBody,
}

impl MultipartReply {
    /// True if more parts with the same xid follow.
    pub fn more(&self) -> bool {
        self.flags & OFPMPF_MORE != 0
    }

    pub fn encoded_len(&self) -> usize {
        8 + match &self.body {
            MultipartReplyBody::Flow(v) => v.iter().map(FlowStatsEntry::encoded_len).sum(),
            MultipartReplyBody::Aggregate(_) => 24,
            MultipartReplyBody::PortDesc(v) => v.len() * Port::LEN,
            MultipartReplyBody::MeterFeatures(_) => super::MeterFeatures::LEN,
            MultipartReplyBody::MeterStats(v) => v.iter().map(super::MeterStats::encoded_len).sum(),
            MultipartReplyBody::Unknown { body, .. } => body.len(),
        }
    }

    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        let typ = match &self.body {
            MultipartReplyBody::Flow(_) => OFPMP_FLOW,
            MultipartReplyBody::Aggregate(_) => OFPMP_AGGREGATE,
            MultipartReplyBody::PortDesc(_) => OFPMP_PORT_DESC,
            MultipartReplyBody::MeterFeatures(_) => OFPMP_METER_FEATURES,
            MultipartReplyBody::MeterStats(_) => OFPMP_METER,
            MultipartReplyBody::Unknown { mp_type, .. } => *mp_type,
        };
        buf.put_u16(typ);
        buf.put_u16(self.flags);
        buf.put_u32(0);
        match &self.body {
            MultipartReplyBody::Flow(v) => {
                for f in v {
                    f.encode(buf)?;
                }
            }
            MultipartReplyBody::Aggregate(a) => {
                buf.put_u64(a.packet_count);
                buf.put_u64(a.byte_count);
                buf.put_u32(a.flow_count);
                buf.put_u32(0);
            }
            MultipartReplyBody::PortDesc(v) => v.iter().for_each(|p| p.encode(buf)),
            MultipartReplyBody::MeterFeatures(f) => f.encode(buf),
            MultipartReplyBody::MeterStats(v) => v.iter().for_each(|m| m.encode(buf)),
            MultipartReplyBody::Unknown { body, .. } => buf.put_slice(body),
        }
        Ok(())
    }

    pub fn decode(body: &[u8]) -> Result<MultipartReply, DecodeError> {
        let mut r = Reader::new(body, "MULTIPART_REPLY");
        let mp_type = r.u16()?;
        let flags = r.u16()?;
        r.skip(4)?;
        let body = match mp_type {
            OFPMP_FLOW => {
                let mut v = Vec::new();
                while !r.is_empty() {
                    v.push(FlowStatsEntry::decode(&mut r)?);
                }
                MultipartReplyBody::Flow(v)
            }
            OFPMP_AGGREGATE => {
                if r.remaining() != 24 {
                    return Err(DecodeError::BadLength { what: "aggregate stats reply", len: body.len() + 8 });
                }
                let a = AggregateStats { packet_count: r.u64()?, byte_count: r.u64()?, flow_count: r.u32()? };
                MultipartReplyBody::Aggregate(a)
            }
            OFPMP_PORT_DESC => {
                if !r.remaining().is_multiple_of(Port::LEN) {
                    return Err(DecodeError::BadLength { what: "port desc reply", len: body.len() + 8 });
                }
                let mut v = Vec::with_capacity(r.remaining() / Port::LEN);
                while !r.is_empty() {
                    v.push(Port::decode(&mut r)?);
                }
                MultipartReplyBody::PortDesc(v)
            }
            OFPMP_METER_FEATURES => MultipartReplyBody::MeterFeatures(super::MeterFeatures::decode(r.rest())?),
            OFPMP_METER => MultipartReplyBody::MeterStats(super::MeterStats::decode_list(r.rest())?),
            _ => MultipartReplyBody::Unknown { mp_type, body: r.take_rest() },
        };
        Ok(MultipartReply { flags, body })
    }
}

/// Joins the parts of one multipart reply (same xid) until a part without the MORE flag.
#[derive(Debug, Default)]
pub struct MultipartAssembler {
    acc: Option<MultipartReplyBody>,
}

/// Joining parts failed: a part had a different type than the first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("multipart reply: part of a different type than the first")]
pub struct MixedMultipart;

impl MultipartAssembler {
    /// Adds a part. Returns the complete body when `part` is the last one.
    pub fn push(&mut self, part: MultipartReply) -> Result<Option<MultipartReplyBody>, MixedMultipart> {
        let more = part.more();
        match (&mut self.acc, part.body) {
            (None, b) => self.acc = Some(b),
            (Some(MultipartReplyBody::Flow(a)), MultipartReplyBody::Flow(v)) => a.extend(v),
            (Some(MultipartReplyBody::PortDesc(a)), MultipartReplyBody::PortDesc(v)) => a.extend(v),
            (Some(MultipartReplyBody::MeterStats(a)), MultipartReplyBody::MeterStats(v)) => a.extend(v),
            _ => return Err(MixedMultipart),
        }
        Ok(if more { None } else { self.acc.take() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::Action;
    use crate::flow_match::EthMatch;
    use crate::wire::hex;

    /// A flow-stats reply in the shape OVS 3.1 sends for `ovs-ofctl dump-flows` (fixed part,
    /// OXM match, instructions), with three entries: a flow this crate types; a flow whose match
    /// it cannot type (ipv4_src with eth_type ARP, which OVS itself would not hold, standing in
    /// for any match outside the model); and a flow with an action it does not know
    /// (NXAST_OUTPUT_TRUNC), which stays typed with an `Unknown` action.
    const REPLY: &str = "
        0001 0000 00000000
        0058 01 00 00000094 3314c840 0064 0000 0000 0000 00000000 0000000000000000
             0000000000000000 0000000000000000
             0001 0010 80000a02 8035 80002a02 0003
             0004 0018 00000000 0000 0010 00000002 0000 000000000000
        0050 02 00 00000005 00000000 0064 0000 0000 0000 00000000 0000000000000abc
             0000000000000002 0000000000000080
             0001 0012 80000a02 0806 80001604 0a000001 000000000000
             0001 0008 03 000000
        0050 03 00 00000001 00000000 8000 0000 0000 0000 00000000 0000000000000000
             0000000000000000 0000000000000000
             0001 0004 00000000
             0004 0018 00000000 ffff 0010 00002320 0027 0002 00000080
    ";

    #[test]
    fn one_undecodable_entry_does_not_fail_the_reply() {
        let body = hex(REPLY);
        let len = (8 + body.len() as u16).to_be_bytes();
        let mut msg = vec![0x04, 0x13, len[0], len[1], 0, 0, 0, 9];
        msg.extend_from_slice(&body);
        let m = crate::OfMessage::decode(&msg).unwrap();
        let crate::Message::MultipartReply(MultipartReply { body: MultipartReplyBody::Flow(v), .. }) = &m.msg else {
            panic!("{m:?}")
        };
        assert_eq!(v.len(), 3);
        // 1: rarp,arp_op=3 (RARP with ARP fields is typed).
        let f = v[0].typed().expect("typed");
        assert!(matches!(f.match_.eth, EthMatch::Rarp(a) if a.op == Some(3)));
        assert_eq!(f.to_string(), "cookie=0x0, duration=148.857s, table=1, n_packets=0, n_bytes=0, priority=100,rarp,arp_op=3 actions=output:2");
        // 2: kept raw, fixed part still readable, reason available.
        let FlowStatsEntry::Raw(r) = &v[1] else { panic!("{:?}", v[1]) };
        assert_eq!((r.table_id(), r.priority(), r.cookie()), (2, 100, 0xabc));
        assert!(matches!(r.error(), Some(DecodeError::Prerequisite { .. })));
        // 3: an unknown action keeps the entry typed.
        let f = v[2].typed().expect("typed");
        assert!(matches!(&f.instructions[0], Instruction::ApplyActions(a) if matches!(a[0], Action::Unknown(_))));
        // The whole reply re-encodes byte for byte.
        assert_eq!(m.to_bytes().unwrap(), msg);
        let (typed, raw) = split_flow_stats(v.clone());
        assert_eq!((typed.len(), raw.len()), (2, 1));
    }

    #[test]
    fn an_unusable_entry_length_still_fails() {
        // Length 8: cannot even hold the fixed part, so the rest cannot be split into entries.
        let body = hex("0001 0000 00000000 0008 00 00 00000000");
        assert!(MultipartReply::decode(&body).is_err());
    }
}
