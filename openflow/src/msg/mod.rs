//! Typed OpenFlow messages: one representation per message, with `decode`/`encoded_len`/`encode`.

mod bundle;
mod error_msg;
mod flow_mod;
mod flow_removed;
mod hello;
mod meter;
mod multipart;
mod packet_in;
mod switch;

pub use bundle::*;
pub use error_msg::*;
pub use flow_mod::*;
pub use flow_removed::*;
pub use hello::*;
pub use meter::*;
pub use multipart::*;
pub use packet_in::*;
pub use switch::*;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::wire::{len_u16, Reader};
use crate::{NX_VENDOR_ID, OFP_VERSION, ONF_VENDOR_ID};

pub const OFPT_HELLO: u8 = 0;
pub const OFPT_ERROR: u8 = 1;
pub const OFPT_ECHO_REQUEST: u8 = 2;
pub const OFPT_ECHO_REPLY: u8 = 3;
pub const OFPT_EXPERIMENTER: u8 = 4;
pub const OFPT_FEATURES_REQUEST: u8 = 5;
pub const OFPT_FEATURES_REPLY: u8 = 6;
pub const OFPT_GET_CONFIG_REQUEST: u8 = 7;
pub const OFPT_GET_CONFIG_REPLY: u8 = 8;
pub const OFPT_SET_CONFIG: u8 = 9;
pub const OFPT_FLOW_MOD: u8 = 14;
pub const OFPT_MULTIPART_REQUEST: u8 = 18;
pub const OFPT_MULTIPART_REPLY: u8 = 19;
pub const OFPT_BARRIER_REQUEST: u8 = 20;
pub const OFPT_BARRIER_REPLY: u8 = 21;

/// ONF experimenter message types (bundles on OF1.3, ONF EXT-230).
pub const ONFT_BUNDLE_CONTROL: u32 = 2300;
pub const ONFT_BUNDLE_ADD_MESSAGE: u32 = 2301;

/// Size of `ofp_header`.
pub const HEADER_LEN: usize = 8;

/// The fixed OpenFlow header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub msg_type: u8,
    pub length: u16,
    pub xid: u32,
}

impl Header {
    pub fn decode(buf: &[u8]) -> Result<Header, DecodeError> {
        let mut r = Reader::new(buf, "ofp_header");
        Ok(Header { version: r.u8()?, msg_type: r.u8()?, length: r.u16()?, xid: r.u32()? })
    }
}

/// A message body. Variants without data are bare headers on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Error(ErrorMsg),
    EchoRequest(Bytes),
    EchoReply(Bytes),
    FeaturesRequest,
    FeaturesReply(FeaturesReply),
    GetConfigRequest,
    GetConfigReply(SwitchConfig),
    SetConfig(SwitchConfig),
    FlowMod(FlowMod),
    MultipartRequest(MultipartRequest),
    MultipartReply(MultipartReply),
    BarrierRequest,
    BarrierReply,
    BundleControl(BundleControl),
    BundleAdd(BundleAdd),
    /// OFPT_PACKET_IN (OpenFlow 1.3).
    PacketIn(PacketIn),
    /// OFPT_FLOW_REMOVED (OpenFlow 1.3).
    FlowRemoved(FlowRemoved),
    /// OFPT_SET_ASYNC.
    SetAsync(AsyncConfig),
    /// OFPT_METER_MOD.
    MeterMod(MeterMod),
    /// NXT_PACKET_IN2.
    PacketIn2(PacketIn2),
    /// NXT_SET_PACKET_IN_FORMAT with its NXPIF_* value.
    SetPacketInFormat(u32),
    /// An experimenter message other than the ONF bundle messages.
    Experimenter { experimenter: u32, exp_type: u32, data: Bytes },
    /// Any other message type (or any message in a version other than 1.3, except HELLO and
    /// ERROR, which have the same layout in every version): the body is kept verbatim.
    Unknown { msg_type: u8, body: Bytes },
}

impl Message {
    /// The OFPT_* type byte.
    pub fn msg_type(&self) -> u8 {
        match self {
            Message::Hello(_) => OFPT_HELLO,
            Message::Error(_) => OFPT_ERROR,
            Message::EchoRequest(_) => OFPT_ECHO_REQUEST,
            Message::EchoReply(_) => OFPT_ECHO_REPLY,
            Message::FeaturesRequest => OFPT_FEATURES_REQUEST,
            Message::FeaturesReply(_) => OFPT_FEATURES_REPLY,
            Message::GetConfigRequest => OFPT_GET_CONFIG_REQUEST,
            Message::GetConfigReply(_) => OFPT_GET_CONFIG_REPLY,
            Message::SetConfig(_) => OFPT_SET_CONFIG,
            Message::FlowMod(_) => OFPT_FLOW_MOD,
            Message::MultipartRequest(_) => OFPT_MULTIPART_REQUEST,
            Message::MultipartReply(_) => OFPT_MULTIPART_REPLY,
            Message::BarrierRequest => OFPT_BARRIER_REQUEST,
            Message::BarrierReply => OFPT_BARRIER_REPLY,
            Message::PacketIn(_) => OFPT_PACKET_IN,
            Message::FlowRemoved(_) => OFPT_FLOW_REMOVED,
            Message::SetAsync(_) => OFPT_SET_ASYNC,
            Message::MeterMod(_) => OFPT_METER_MOD,
            Message::BundleControl(_)
            | Message::BundleAdd(_)
            | Message::PacketIn2(_)
            | Message::SetPacketInFormat(_)
            | Message::Experimenter { .. } => OFPT_EXPERIMENTER,
            Message::Unknown { msg_type, .. } => *msg_type,
        }
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello(_) => "HELLO",
            Message::Error(_) => "ERROR",
            Message::EchoRequest(_) => "ECHO_REQUEST",
            Message::EchoReply(_) => "ECHO_REPLY",
            Message::FeaturesRequest => "FEATURES_REQUEST",
            Message::FeaturesReply(_) => "FEATURES_REPLY",
            Message::GetConfigRequest => "GET_CONFIG_REQUEST",
            Message::GetConfigReply(_) => "GET_CONFIG_REPLY",
            Message::SetConfig(_) => "SET_CONFIG",
            Message::FlowMod(_) => "FLOW_MOD",
            Message::MultipartRequest(_) => "MULTIPART_REQUEST",
            Message::MultipartReply(_) => "MULTIPART_REPLY",
            Message::BarrierRequest => "BARRIER_REQUEST",
            Message::BarrierReply => "BARRIER_REPLY",
            Message::BundleControl(_) => "BUNDLE_CONTROL",
            Message::BundleAdd(_) => "BUNDLE_ADD_MESSAGE",
            Message::PacketIn(_) => "PACKET_IN",
            Message::FlowRemoved(_) => "FLOW_REMOVED",
            Message::SetAsync(_) => "SET_ASYNC",
            Message::MeterMod(_) => "METER_MOD",
            Message::PacketIn2(_) => "NXT_PACKET_IN2",
            Message::SetPacketInFormat(_) => "NXT_SET_PACKET_IN_FORMAT",
            Message::Experimenter { .. } => "EXPERIMENTER",
            Message::Unknown { .. } => "UNKNOWN",
        }
    }

    fn body_len(&self) -> usize {
        match self {
            Message::Hello(h) => h.encoded_len(),
            Message::Error(e) => e.encoded_len(),
            Message::EchoRequest(b) | Message::EchoReply(b) => b.len(),
            Message::FeaturesRequest | Message::GetConfigRequest | Message::BarrierRequest | Message::BarrierReply => 0,
            Message::FeaturesReply(_) => FeaturesReply::LEN,
            Message::GetConfigReply(_) | Message::SetConfig(_) => SwitchConfig::LEN,
            Message::FlowMod(f) => f.encoded_len(),
            Message::MultipartRequest(m) => m.encoded_len(),
            Message::MultipartReply(m) => m.encoded_len(),
            Message::BundleControl(b) => b.encoded_len(),
            Message::BundleAdd(b) => b.encoded_len(),
            Message::PacketIn(p) => p.encoded_len(),
            Message::FlowRemoved(f) => f.encoded_len(),
            Message::SetAsync(_) => AsyncConfig::LEN,
            Message::MeterMod(m) => m.encoded_len(),
            Message::PacketIn2(p) => 8 + p.encoded_len(),
            Message::SetPacketInFormat(_) => 12,
            Message::Experimenter { data, .. } => 8 + data.len(),
            Message::Unknown { body, .. } => body.len(),
        }
    }

    fn encode_body(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        match self {
            Message::Hello(h) => h.encode(buf),
            Message::Error(e) => e.encode(buf),
            Message::EchoRequest(b) | Message::EchoReply(b) => buf.put_slice(b),
            Message::FeaturesRequest | Message::GetConfigRequest | Message::BarrierRequest | Message::BarrierReply => {}
            Message::FeaturesReply(f) => f.encode(buf),
            Message::GetConfigReply(c) | Message::SetConfig(c) => c.encode(buf),
            Message::FlowMod(f) => f.encode(buf)?,
            Message::MultipartRequest(m) => m.encode(buf)?,
            Message::MultipartReply(m) => m.encode(buf)?,
            Message::BundleControl(b) => b.encode(buf),
            Message::BundleAdd(b) => b.encode(buf)?,
            Message::PacketIn(p) => p.encode(buf),
            Message::FlowRemoved(f) => f.encode(buf),
            Message::SetAsync(a) => a.encode(buf),
            Message::MeterMod(m) => m.encode(buf),
            Message::PacketIn2(p) => {
                buf.put_u32(NX_VENDOR_ID);
                buf.put_u32(NXT_PACKET_IN2);
                p.encode(buf);
            }
            Message::SetPacketInFormat(f) => {
                buf.put_u32(NX_VENDOR_ID);
                buf.put_u32(NXT_SET_PACKET_IN_FORMAT);
                buf.put_u32(*f);
            }
            Message::Experimenter { experimenter, exp_type, data } => {
                buf.put_u32(*experimenter);
                buf.put_u32(*exp_type);
                buf.put_slice(data);
            }
            Message::Unknown { body, .. } => buf.put_slice(body),
        }
        Ok(())
    }

    /// Decodes a body given its header. Only HELLO and ERROR are decoded in versions other than
    /// 1.3 (their layout is version-independent); anything else there is `Unknown`.
    pub fn decode_body(version: u8, msg_type: u8, body: &[u8]) -> Result<Message, DecodeError> {
        let exact_empty = |name: &'static str| {
            if body.is_empty() {
                Ok(())
            } else {
                Err(DecodeError::BadLength { what: name, len: HEADER_LEN + body.len() })
            }
        };
        if version != OFP_VERSION && msg_type != OFPT_HELLO && msg_type != OFPT_ERROR {
            return Ok(Message::Unknown { msg_type, body: Bytes::copy_from_slice(body) });
        }
        let mut r = Reader::new(body, "message body");
        Ok(match msg_type {
            OFPT_HELLO => Message::Hello(Hello::decode(body)?),
            OFPT_ERROR => Message::Error(ErrorMsg::decode(body)?),
            OFPT_ECHO_REQUEST => Message::EchoRequest(Bytes::copy_from_slice(body)),
            OFPT_ECHO_REPLY => Message::EchoReply(Bytes::copy_from_slice(body)),
            OFPT_FEATURES_REQUEST => {
                exact_empty("FEATURES_REQUEST")?;
                Message::FeaturesRequest
            }
            OFPT_FEATURES_REPLY => Message::FeaturesReply(FeaturesReply::decode(body)?),
            OFPT_GET_CONFIG_REQUEST => {
                exact_empty("GET_CONFIG_REQUEST")?;
                Message::GetConfigRequest
            }
            OFPT_GET_CONFIG_REPLY => Message::GetConfigReply(SwitchConfig::decode(body)?),
            OFPT_SET_CONFIG => Message::SetConfig(SwitchConfig::decode(body)?),
            OFPT_FLOW_MOD => Message::FlowMod(FlowMod::decode(body)?),
            OFPT_MULTIPART_REQUEST => Message::MultipartRequest(MultipartRequest::decode(body)?),
            OFPT_MULTIPART_REPLY => Message::MultipartReply(MultipartReply::decode(body)?),
            OFPT_BARRIER_REQUEST => {
                exact_empty("BARRIER_REQUEST")?;
                Message::BarrierRequest
            }
            OFPT_BARRIER_REPLY => {
                exact_empty("BARRIER_REPLY")?;
                Message::BarrierReply
            }
            OFPT_PACKET_IN => Message::PacketIn(PacketIn::decode(body)?),
            OFPT_FLOW_REMOVED => Message::FlowRemoved(FlowRemoved::decode(body)?),
            OFPT_SET_ASYNC => Message::SetAsync(AsyncConfig::decode(body)?),
            OFPT_METER_MOD => Message::MeterMod(MeterMod::decode(body)?),
            OFPT_EXPERIMENTER => {
                let experimenter = r.u32()?;
                let exp_type = r.u32()?;
                match (experimenter, exp_type) {
                    (ONF_VENDOR_ID, ONFT_BUNDLE_CONTROL) => Message::BundleControl(BundleControl::decode(r.rest())?),
                    (ONF_VENDOR_ID, ONFT_BUNDLE_ADD_MESSAGE) => Message::BundleAdd(BundleAdd::decode(r.rest())?),
                    (NX_VENDOR_ID, NXT_PACKET_IN2) => Message::PacketIn2(PacketIn2::decode(r.rest())?),
                    (NX_VENDOR_ID, NXT_SET_PACKET_IN_FORMAT) if r.remaining() == 4 => Message::SetPacketInFormat(r.u32()?),
                    _ => Message::Experimenter { experimenter, exp_type, data: r.take_rest() },
                }
            }
            _ => Message::Unknown { msg_type, body: Bytes::copy_from_slice(body) },
        })
    }
}

/// Writes a whole OpenFlow 1.3 message whose body is already encoded.
pub fn encode_raw(buf: &mut impl BufMut, msg_type: u8, xid: u32, body: &[u8]) -> Result<(), EncodeError> {
    let len = len_u16("OpenFlow message", HEADER_LEN + body.len())?;
    buf.put_u8(OFP_VERSION);
    buf.put_u8(msg_type);
    buf.put_u16(len);
    buf.put_u32(xid);
    buf.put_slice(body);
    Ok(())
}

/// A whole message: header fields plus the typed body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfMessage {
    pub version: u8,
    pub xid: u32,
    pub msg: Message,
}

impl OfMessage {
    /// An OpenFlow 1.3 message.
    pub fn new(xid: u32, msg: Message) -> OfMessage {
        OfMessage { version: OFP_VERSION, xid, msg }
    }

    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.msg.body_len()
    }

    /// Appends the encoded message to `buf`.
    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        let len = len_u16("OpenFlow message", self.encoded_len())?;
        buf.put_u8(self.version);
        buf.put_u8(self.msg.msg_type());
        buf.put_u16(len);
        buf.put_u32(self.xid);
        self.msg.encode_body(buf)
    }

    /// Encodes into a fresh buffer.
    pub fn to_bytes(&self) -> Result<Bytes, EncodeError> {
        let mut b = BytesMut::with_capacity(self.encoded_len());
        self.encode(&mut b)?;
        Ok(b.freeze())
    }

    /// Decodes one whole message; `buf` must hold exactly `length` bytes.
    pub fn decode(buf: &[u8]) -> Result<OfMessage, DecodeError> {
        let h = Header::decode(buf)?;
        let len = h.length as usize;
        if len < HEADER_LEN || len != buf.len() {
            return Err(DecodeError::BadLength { what: "ofp_header.length", len });
        }
        let msg = Message::decode_body(h.version, h.msg_type, &buf[HEADER_LEN..])?;
        Ok(OfMessage { version: h.version, xid: h.xid, msg })
    }
}
