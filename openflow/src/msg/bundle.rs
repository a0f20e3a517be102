//! Bundles on OpenFlow 1.3: the ONF extension (EXT-230) that OVS implements as experimenter
//! messages 2300 (BUNDLE_CONTROL) and 2301 (BUNDLE_ADD_MESSAGE), carrying OF1.4's bundle bodies.
//!
//! OVS rules worth knowing (wire reference §9): the inner message's xid must equal the outer xid
//! (else OFPBFC_MSG_BAD_XID); a message that fails validation when *added* is left out while the
//! bundle stays open, so clients barrier and check errors before COMMIT; flags must be the same
//! on every message of a bundle (else OFPBFC_BAD_FLAGS, which destroys the bundle).

use bitflags::bitflags;
use bytes::{BufMut, Bytes};


use crate::error::{DecodeError, EncodeError};
use crate::msg::{FlowMod, Message, OfMessage, ONFT_BUNDLE_ADD_MESSAGE, ONFT_BUNDLE_CONTROL};
use crate::wire::Reader;
use crate::ONF_VENDOR_ID;

bitflags! {
    /// OFPBF_* flags. Unknown bits are kept.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct BundleFlags: u16 {
        const ATOMIC = 1;
        const ORDERED = 2;
        const _ = !0;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BundleCtrlType {
    OpenRequest,
    OpenReply,
    CloseRequest,
    CloseReply,
    CommitRequest,
    CommitReply,
    DiscardRequest,
    DiscardReply,
    Unknown(u16),
}

impl BundleCtrlType {
    pub fn to_u16(self) -> u16 {
        match self {
            BundleCtrlType::OpenRequest => 0,
            BundleCtrlType::OpenReply => 1,
            BundleCtrlType::CloseRequest => 2,
            BundleCtrlType::CloseReply => 3,
            BundleCtrlType::CommitRequest => 4,
            BundleCtrlType::CommitReply => 5,
            BundleCtrlType::DiscardRequest => 6,
            BundleCtrlType::DiscardReply => 7,
            BundleCtrlType::Unknown(n) => n,
        }
    }
    pub fn from_u16(n: u16) -> BundleCtrlType {
        match n {
            0 => BundleCtrlType::OpenRequest,
            1 => BundleCtrlType::OpenReply,
            2 => BundleCtrlType::CloseRequest,
            3 => BundleCtrlType::CloseReply,
            4 => BundleCtrlType::CommitRequest,
            5 => BundleCtrlType::CommitReply,
            6 => BundleCtrlType::DiscardRequest,
            7 => BundleCtrlType::DiscardReply,
            n => BundleCtrlType::Unknown(n),
        }
    }
}

/// ONFT_BUNDLE_CONTROL body (after the experimenter header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleControl {
    pub bundle_id: u32,
    pub ctrl_type: BundleCtrlType,
    pub flags: BundleFlags,
    /// Bundle properties, verbatim (OVS sends none).
    pub properties: Bytes,
}

impl BundleControl {
    pub fn new(bundle_id: u32, ctrl_type: BundleCtrlType, flags: BundleFlags) -> BundleControl {
        BundleControl { bundle_id, ctrl_type, flags, properties: Bytes::new() }
    }

    /// Length after `ofp_header`, including the 8-byte experimenter header.
    pub fn encoded_len(&self) -> usize {
        8 + 8 + self.properties.len()
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(ONF_VENDOR_ID);
        buf.put_u32(ONFT_BUNDLE_CONTROL);
        buf.put_u32(self.bundle_id);
        buf.put_u16(self.ctrl_type.to_u16());
        buf.put_u16(self.flags.bits());
        buf.put_slice(&self.properties);
    }

    /// Decodes the part after the experimenter header.
    pub fn decode(body: &[u8]) -> Result<BundleControl, DecodeError> {
        let mut r = Reader::new(body, "BUNDLE_CONTROL");
        Ok(BundleControl {
            bundle_id: r.u32()?,
            ctrl_type: BundleCtrlType::from_u16(r.u16()?),
            flags: BundleFlags::from_bits_retain(r.u16()?),
            properties: r.take_rest(),
        })
    }
}

/// ONFT_BUNDLE_ADD_MESSAGE body: a whole inner message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleAdd {
    pub bundle_id: u32,
    pub flags: BundleFlags,
    /// The wrapped message; OVS requires its xid and version to equal the outer ones.
    pub message: Box<OfMessage>,
    /// Padding and properties after the inner message, verbatim (OVS sends none).
    pub trailer: Bytes,
}

impl BundleAdd {
    /// Wraps a FLOW_MOD; the returned message's xid and the inner xid are both `xid`.
    pub fn flow_mod(xid: u32, bundle_id: u32, flags: BundleFlags, fm: FlowMod) -> OfMessage {
        let inner = OfMessage::new(xid, Message::FlowMod(fm));
        OfMessage::new(
            xid,
            Message::BundleAdd(BundleAdd { bundle_id, flags, message: Box::new(inner), trailer: Bytes::new() }),
        )
    }

    pub fn encoded_len(&self) -> usize {
        8 + 8 + self.message.encoded_len() + self.trailer.len()
    }

    /// Writes a whole BUNDLE_ADD_MESSAGE (outer header included) wrapping a FLOW_MOD whose
    /// body is already encoded; the outer and inner xids are both `xid`.
    pub fn encode_flow_mod_body(
        buf: &mut impl BufMut,
        xid: u32,
        bundle_id: u32,
        flags: BundleFlags,
        flow_mod_body: &[u8],
    ) -> Result<(), EncodeError> {
        let inner_len = crate::msg::HEADER_LEN + flow_mod_body.len();
        let total = crate::wire::len_u16("BUNDLE_ADD_MESSAGE", crate::msg::HEADER_LEN + 16 + inner_len)?;
        buf.put_u8(crate::OFP_VERSION);
        buf.put_u8(crate::msg::OFPT_EXPERIMENTER);
        buf.put_u16(total);
        buf.put_u32(xid);
        buf.put_u32(ONF_VENDOR_ID);
        buf.put_u32(ONFT_BUNDLE_ADD_MESSAGE);
        buf.put_u32(bundle_id);
        buf.put_u16(0);
        buf.put_u16(flags.bits());
        crate::msg::encode_raw(buf, crate::msg::OFPT_FLOW_MOD, xid, flow_mod_body)
    }

    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        buf.put_u32(ONF_VENDOR_ID);
        buf.put_u32(ONFT_BUNDLE_ADD_MESSAGE);
        buf.put_u32(self.bundle_id);
        buf.put_u16(0);
        buf.put_u16(self.flags.bits());
        self.message.encode(buf)?;
        buf.put_slice(&self.trailer);
        Ok(())
    }

    /// Decodes the part after the experimenter header.
    pub fn decode(body: &[u8]) -> Result<BundleAdd, DecodeError> {
        let mut r = Reader::new(body, "BUNDLE_ADD_MESSAGE");
        let bundle_id = r.u32()?;
        r.skip(2)?;
        let flags = BundleFlags::from_bits_retain(r.u16()?);
        let inner = r.rest();
        let h = crate::msg::Header::decode(inner)?;
        let inner_len = h.length as usize;
        if inner_len < crate::msg::HEADER_LEN {
            return Err(DecodeError::BadLength { what: "bundled message", len: inner_len });
        }
        let inner = r.bytes(inner_len)?;
        // A BUNDLE_ADD cannot carry another BUNDLE_ADD (OVS answers OFPBFC_MSG_UNSUP). Refusing
        // it here also bounds the recursion: each level costs only 24 bytes, so a 64 KiB frame
        // could otherwise nest ~2700 levels deep and overflow the stack.
        let mut exp = Reader::new(inner.get(8..).unwrap_or_default(), "bundled message");
        if h.version == crate::OFP_VERSION
            && h.msg_type == crate::msg::OFPT_EXPERIMENTER
            && exp.u32() == Ok(ONF_VENDOR_ID)
            && exp.u32() == Ok(ONFT_BUNDLE_ADD_MESSAGE)
        {
            return Err(DecodeError::BadValue { what: "bundled message type", value: ONFT_BUNDLE_ADD_MESSAGE as u64 });
        }
        let message = Box::new(OfMessage::decode(inner)?);
        Ok(BundleAdd { bundle_id, flags, message, trailer: r.take_rest() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::OfMessage;

    #[test]
    fn pre_encoded_flow_mod_body_matches_the_typed_encoding() {
        let fm = FlowMod::add(
            20,
            100,
            crate::Match::any().in_port(3u32),
            vec![crate::Action::load_reg(0, 11), crate::Action::note([1, 2])],
            Some(21),
        )
        .with_cookie(0xabc, 0);
        let typed = BundleAdd::flow_mod(9, 4, BundleFlags::ATOMIC | BundleFlags::ORDERED, fm.clone()).to_bytes().unwrap();
        let mut m = Vec::new();
        fm.match_.encode(&mut m);
        let mut ins = Vec::new();
        crate::instruction::encode_instructions(&fm.instructions, &mut ins).unwrap();
        let mut body = Vec::new();
        fm.head().encode_body(&mut body, &m, &ins);
        let mut raw = Vec::new();
        BundleAdd::encode_flow_mod_body(&mut raw, 9, 4, BundleFlags::ATOMIC | BundleFlags::ORDERED, &body).unwrap();
        assert_eq!(raw, typed.to_vec());
        let mut plain = Vec::new();
        crate::msg::encode_raw(&mut plain, crate::msg::OFPT_FLOW_MOD, 9, &body).unwrap();
        assert_eq!(plain, OfMessage::new(9, Message::FlowMod(fm)).to_bytes().unwrap().to_vec());
    }

    /// Regression: nested BUNDLE_ADDs recursed once per 24 bytes, so a hostile 64 KiB frame
    /// overflowed the stack (found by openflow/tests/roundtrip.rs).
    #[test]
    fn nested_bundle_add_is_rejected_without_recursion() {
        let mut inner = OfMessage::new(1, Message::BarrierRequest).to_bytes().unwrap().to_vec();
        let mut depth = 0;
        while inner.len() + 24 <= 0xffff {
            let mut b = vec![crate::OFP_VERSION, crate::msg::OFPT_EXPERIMENTER];
            b.extend_from_slice(&((inner.len() + 24) as u16).to_be_bytes());
            b.extend_from_slice(&1u32.to_be_bytes());
            b.extend_from_slice(&ONF_VENDOR_ID.to_be_bytes());
            b.extend_from_slice(&ONFT_BUNDLE_ADD_MESSAGE.to_be_bytes());
            b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 3]);
            b.extend_from_slice(&inner);
            inner = b;
            depth += 1;
            if depth == 1 {
                // One level is fine.
                assert!(matches!(OfMessage::decode(&inner).unwrap().msg, Message::BundleAdd(_)));
            }
        }
        let err = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || OfMessage::decode(&inner))
            .unwrap()
            .join()
            .unwrap()
            .unwrap_err();
        assert_eq!(err, DecodeError::BadValue { what: "bundled message type", value: 2301 });
    }
}
