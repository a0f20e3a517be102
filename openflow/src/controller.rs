//! The Nicira `controller(...)` actions: NXAST_CONTROLLER (subtype 20, fixed 16 bytes) and
//! NXAST_CONTROLLER2 (subtype 37, a list of properties).
//!
//! Why typed: the NetworkPolicy audit log sends each new connection to the agent with
//! `controller(userdata=...,meter_id=N,max_len=128)`. Only NXAST_CONTROLLER2 can carry the
//! userdata (it reaches the agent in NXT_PACKET_IN2) and the meter that rate-limits the copy
//! sent to the controller, so the pipeline needs to build it and `dump-flows` needs to read it
//! back. Layout and defaults as in OVS 3.1 `lib/ofp-actions.c` (decode/encode/format_CONTROLLER):
//! properties are `type u16 | len u16 (without padding) | value`, each padded to 8 bytes;
//! absent properties mean max_len 65535, controller id 0, reason `action`, no userdata, no
//! pause, no meter (`NX_CTLR_NO_METER` = 0). A property type this crate does not know is kept
//! verbatim (OVS itself refuses one, so such an action can only come from a newer switch).

use std::fmt::{self, Display, Formatter, Write as _};

use bytes::{BufMut, Bytes};

use crate::error::DecodeError;
use crate::wire::{pad8, Reader};

pub const NXAST_CONTROLLER: u16 = 20;
pub const NXAST_CONTROLLER2: u16 = 37;

pub const NXAC2PT_MAX_LEN: u16 = 0;
pub const NXAC2PT_CONTROLLER_ID: u16 = 1;
pub const NXAC2PT_REASON: u16 = 2;
pub const NXAC2PT_USERDATA: u16 = 3;
pub const NXAC2PT_PAUSE: u16 = 4;
pub const NXAC2PT_METER_ID: u16 = 5;

/// `meter_id` meaning "no meter" (OVS's `NX_CTLR_NO_METER`).
pub const NX_CTLR_NO_METER: u32 = 0;

/// `ofp_packet_in_reason` values (OVS `OFPR_*`).
pub const OFPR_NO_MATCH: u8 = 0;
pub const OFPR_ACTION: u8 = 1;
pub const OFPR_INVALID_TTL: u8 = 2;

/// OVS's text for a packet-in reason (`ofputil_packet_in_reason_to_string`): the OF1.4 names,
/// the two internal miss reasons as the empty string, anything else as its number.
pub fn reason_name(reason: u8) -> std::borrow::Cow<'static, str> {
    match reason {
        0 => "no_match".into(),
        1 => "action".into(),
        2 => "invalid_ttl".into(),
        3 => "action_set".into(),
        4 => "group".into(),
        5 => "packet_out".into(),
        6 | 7 => "".into(),
        n => n.to_string().into(),
    }
}

/// Which wire form to use. OVS answers a dump in the form it was given, and a NXAST_CONTROLLER2
/// whose fields NXAST_CONTROLLER could carry must stay CONTROLLER2 to round-trip; everything
/// else is `Auto`, so a built action and the same action read back from the switch are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ControllerForm {
    /// As ovs-ofctl chooses: NXAST_CONTROLLER (max_len, id, reason only) when it can carry the
    /// action, NXAST_CONTROLLER2 otherwise.
    Auto,
    /// NXAST_CONTROLLER2 even though NXAST_CONTROLLER would do.
    ForceV2,
}

/// `controller(...)`. Build with [`Controller::new`] and the builders; the wire form is chosen
/// as OVS chooses it (V2 as soon as userdata, pause or a meter is set).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Controller {
    pub max_len: u16,
    pub controller_id: u16,
    /// OFPR_*; [`OFPR_ACTION`] by default.
    pub reason: u8,
    pub userdata: Bytes,
    pub pause: bool,
    /// [`NX_CTLR_NO_METER`] = none.
    pub meter_id: u32,
    pub form: ControllerForm,
    /// Properties of unknown type, each whole (header, value, padding), in order, after the
    /// known ones when encoded.
    pub unknown_props: Vec<Bytes>,
}

impl Controller {
    /// `controller()`: the whole packet, reason action, no userdata or meter. Sent as
    /// ovs-ofctl sends it: NXAST_CONTROLLER while that form can carry it, else NXAST_CONTROLLER2.
    pub fn new() -> Controller {
        Controller {
            max_len: u16::MAX,
            controller_id: 0,
            reason: OFPR_ACTION,
            userdata: Bytes::new(),
            pause: false,
            meter_id: NX_CTLR_NO_METER,
            form: ControllerForm::Auto,
            unknown_props: Vec::new(),
        }
    }
    pub fn max_len(mut self, n: u16) -> Controller {
        self.max_len = n;
        self
    }
    pub fn reason(mut self, r: u8) -> Controller {
        self.reason = r;
        self
    }
    pub fn userdata(mut self, d: impl Into<Bytes>) -> Controller {
        self.userdata = d.into();
        self
    }
    pub fn meter_id(mut self, m: u32) -> Controller {
        self.meter_id = m;
        self
    }
    pub fn id(mut self, id: u16) -> Controller {
        self.controller_id = id;
        self
    }

    /// True if the V1 form can carry this (OVS's encode_CONTROLLER condition).
    fn fits_v1(&self) -> bool {
        self.userdata.is_empty() && !self.pause && self.meter_id == NX_CTLR_NO_METER && self.unknown_props.is_empty()
    }

    fn v2(&self) -> bool {
        self.form == ControllerForm::ForceV2 || !self.fits_v1()
    }

    /// The whole action's length.
    pub fn encoded_len(&self) -> usize {
        if !self.v2() {
            return 16;
        }
        let mut n = 16;
        if self.max_len != u16::MAX {
            n += 8;
        }
        if self.controller_id != 0 {
            n += 8;
        }
        if self.reason != OFPR_ACTION {
            n += 8;
        }
        if !self.userdata.is_empty() {
            n += pad8(4 + self.userdata.len());
        }
        if self.pause {
            n += 8;
        }
        if self.meter_id != NX_CTLR_NO_METER {
            n += 8;
        }
        n + self.unknown_props.iter().map(|p| p.len()).sum::<usize>()
    }

    /// Writes the whole action; `len` is [`Controller::encoded_len`] already checked to fit.
    pub(crate) fn encode(&self, buf: &mut impl BufMut, len: u16) {
        buf.put_u16(crate::wire::OFPAT_EXPERIMENTER);
        buf.put_u16(len);
        buf.put_u32(crate::NX_VENDOR_ID);
        if !self.v2() {
            buf.put_u16(NXAST_CONTROLLER);
            buf.put_u16(self.max_len);
            buf.put_u16(self.controller_id);
            buf.put_u8(self.reason);
            buf.put_u8(0);
            return;
        }
        buf.put_u16(NXAST_CONTROLLER2);
        buf.put_bytes(0, 6);
        let prop = |buf: &mut dyn BufMut, typ: u16, value: &[u8]| {
            let l = 4 + value.len();
            buf.put_u16(typ);
            buf.put_u16(l as u16);
            buf.put_slice(value);
            buf.put_bytes(0, pad8(l) - l);
        };
        // OVS's ofpprop_put_be16: 16-bit values are sent as 4 bytes (value, two zero bytes),
        // "as the OpenFlow specs consistently give them a length of 8".
        let u16_prop = |v: u16| {
            let [a, b] = v.to_be_bytes();
            [a, b, 0, 0]
        };
        if self.max_len != u16::MAX {
            prop(buf, NXAC2PT_MAX_LEN, &u16_prop(self.max_len));
        }
        if self.controller_id != 0 {
            prop(buf, NXAC2PT_CONTROLLER_ID, &u16_prop(self.controller_id));
        }
        if self.reason != OFPR_ACTION {
            prop(buf, NXAC2PT_REASON, &[self.reason]);
        }
        if !self.userdata.is_empty() {
            // At most 65531 bytes fit one property; encoded_len's u16 check bounds it.
            prop(buf, NXAC2PT_USERDATA, &self.userdata);
        }
        if self.pause {
            prop(buf, NXAC2PT_PAUSE, &[]);
        }
        if self.meter_id != NX_CTLR_NO_METER {
            prop(buf, NXAC2PT_METER_ID, &self.meter_id.to_be_bytes());
        }
        for p in &self.unknown_props {
            buf.put_slice(p);
        }
    }

    /// NXAST_CONTROLLER's body after the subtype (6 bytes). `None`: not representable (the
    /// must-be-zero byte is set), keep the action raw.
    pub(crate) fn decode_v1(b: &mut Reader<'_>) -> Result<Option<Controller>, DecodeError> {
        let max_len = b.u16()?;
        let controller_id = b.u16()?;
        let reason = b.u8()?;
        let zero = b.u8()?;
        Ok((zero == 0 && b.is_empty()).then_some(Controller {
            max_len,
            controller_id,
            reason,
            form: ControllerForm::Auto,
            ..Controller::new()
        }))
    }

    /// NXAST_CONTROLLER2's body after the subtype (6 pad bytes, then properties). `None`: a
    /// shape OVS refuses (non-zero pad, a property of the wrong size, a bad property length),
    /// kept raw by the caller.
    pub(crate) fn decode_v2(b: &mut Reader<'_>) -> Result<Option<Controller>, DecodeError> {
        if b.bytes(6)?.iter().any(|&x| x != 0) {
            return Ok(None);
        }
        let mut c = Controller::new();
        let mut seen_known = [false; 6];
        while !b.is_empty() {
            let head = b.rest();
            let mut h = Reader::new(head, "controller2 property");
            let typ = h.u16()?;
            let len = h.u16()? as usize;
            if len < 4 || pad8(len) > head.len() {
                return Ok(None);
            }
            let whole = b.bytes(pad8(len))?;
            let value = &whole[4..len];
            if let Some(slot) = seen_known.get_mut(typ as usize) {
                if *slot {
                    // A repeated property: OVS keeps the last; typed form cannot say "twice".
                    return Ok(None);
                }
                *slot = true;
            }
            let mut v = Reader::new(value, "controller2 property value");
            // OVS's ofpprop_parse_u8/u16 accept any value at least that long; u32 exactly 4.
            let at_least = |n: usize| value.len() >= n;
            match typ {
                NXAC2PT_MAX_LEN if at_least(2) => c.max_len = v.u16()?,
                NXAC2PT_CONTROLLER_ID if at_least(2) => c.controller_id = v.u16()?,
                NXAC2PT_REASON if at_least(1) => c.reason = v.u8()?,
                NXAC2PT_USERDATA if !value.is_empty() => c.userdata = Bytes::copy_from_slice(value),
                NXAC2PT_PAUSE if value.is_empty() => c.pause = true,
                NXAC2PT_METER_ID if value.len() == 4 => c.meter_id = v.u32()?,
                0..=5 => return Ok(None),
                _ => c.unknown_props.push(Bytes::copy_from_slice(whole)),
            }
            // A property whose default value was sent explicitly (e.g. max_len=65535) would
            // re-encode shorter; keep such an action raw so the bytes stay as received.
            let default = match typ {
                NXAC2PT_MAX_LEN => c.max_len == u16::MAX,
                NXAC2PT_CONTROLLER_ID => c.controller_id == 0,
                NXAC2PT_REASON => c.reason == OFPR_ACTION,
                NXAC2PT_METER_ID => c.meter_id == NX_CTLR_NO_METER,
                _ => false,
            };
            if default || whole[len..].iter().any(|&x| x != 0) {
                return Ok(None);
            }
        }
        c.form = if c.fits_v1() { ControllerForm::ForceV2 } else { ControllerForm::Auto };
        Ok(Some(c))
    }
}

impl Default for Controller {
    fn default() -> Controller {
        Controller::new()
    }
}

/// OVS's format_CONTROLLER: `CONTROLLER:max_len` when only max_len differs from the defaults,
/// otherwise `controller(reason=..,max_len=..,id=..,userdata=xx.xx,pause,meter_id=..)`.
impl Display for Controller {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if self.reason == OFPR_ACTION && self.controller_id == 0 && self.fits_v1() {
            return write!(f, "CONTROLLER:{}", self.max_len);
        }
        let mut parts: Vec<String> = Vec::new();
        if self.reason != OFPR_ACTION {
            parts.push(format!("reason={}", reason_name(self.reason)));
        }
        if self.max_len != u16::MAX {
            parts.push(format!("max_len={}", self.max_len));
        }
        if self.controller_id != 0 {
            parts.push(format!("id={}", self.controller_id));
        }
        if !self.userdata.is_empty() {
            let mut s = String::from("userdata=");
            for (i, b) in self.userdata.iter().enumerate() {
                if i > 0 {
                    s.push('.');
                }
                let _ = write!(s, "{b:02x}");
            }
            parts.push(s);
        }
        if self.pause {
            parts.push("pause".into());
        }
        if self.meter_id != NX_CTLR_NO_METER {
            parts.push(format!("meter_id={}", self.meter_id));
        }
        // OVS cannot hold unknown properties at all; we show them so nothing is hidden.
        for p in &self.unknown_props {
            let mut s = String::from("unknown_prop(0x");
            for b in p.iter() {
                let _ = write!(s, "{b:02x}");
            }
            s.push(')');
            parts.push(s);
        }
        write!(f, "controller({})", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::tests::enc;
    use crate::action::Action;
    use crate::wire::hex;

    fn dec(v: &[u8]) -> Action {
        Action::decode(&mut Reader::new(v, "t")).unwrap()
    }

    /// The vectors of OVS's tests/ofp-actions.at (OpenFlow 1.0 section; the action is the same
    /// in every version) with the text it expects.
    #[test]
    fn ovs_vectors() {
        let v1 = hex("ffff 0010 00002320 0014 04d2 162e 02 00");
        let a = dec(&v1);
        assert_eq!(a.to_string(), "controller(reason=invalid_ttl,max_len=1234,id=5678)");
        assert_eq!(enc(&a), v1);

        let v2 = hex(
            "ffff 0040 00002320 0025 000000000000 \
             0000 0008 04d2 0000 \
             0001 0008 162e 0000 \
             0002 0005 02 000000 \
             0003 0009 0102030405 00000000000000 \
             0004 0004 00000000",
        );
        let a = dec(&v2);
        assert_eq!(a.to_string(), "controller(reason=invalid_ttl,max_len=1234,id=5678,userdata=01.02.03.04.05,pause)");
        assert_eq!(enc(&a), v2);
    }

    /// What OVS refuses with NXBRC_MUST_BE_ZERO (tests/ofp-actions.at) stays raw, byte for byte.
    #[test]
    fn must_be_zero_is_kept_raw() {
        for v in [
            "ffff 0018 00002320 0025 0000 0005 0000 1122334455 000005",
            "ffff 0018 00002320 0025 0000 0005 5000 1122334455 000000",
            "ffff 0010 00002320 0014 04d2 162e 02 01",
            // max_len property 1 byte long
            "ffff 0018 00002320 0025 000000000000 0000 0005 04 000000",
            // property length past the end
            "ffff 0018 00002320 0025 000000000000 0003 0040 00000000",
        ] {
            let want = hex(v);
            let a = dec(&want);
            assert!(matches!(a, Action::Unknown(_)), "{v}: {a:?}");
            assert_eq!(enc(&a), want);
        }
    }

    /// The audit action: what `ovs-ofctl` sends for
    /// `controller(max_len=128,userdata=01.02,meter_id=1)` (properties in OVS's order).
    #[test]
    fn audit_shape() {
        let c = Controller::new().max_len(128).userdata(vec![1u8, 2]).meter_id(1);
        let a = Action::Controller(c);
        let want = hex(
            "ffff 0028 00002320 0025 000000000000 \
             0000 0008 0080 0000 \
             0003 0006 0102 0000 \
             0005 0008 00000001",
        );
        assert_eq!(enc(&a), want);
        assert_eq!(dec(&want), a);
        assert_eq!(a.to_string(), "controller(max_len=128,userdata=01.02,meter_id=1)");
        // Unknown property kept verbatim.
        let mut with_unknown = want.clone();
        with_unknown[3] = 0x30;
        with_unknown.extend(hex("0063 0005 aa 000000"));
        let back = dec(&with_unknown);
        assert_eq!(enc(&back), with_unknown);
        assert!(back.to_string().ends_with("unknown_prop(0x00630005aa000000))"), "{back}");
    }

    #[test]
    fn v2_with_defaults_prints_like_output() {
        let a = Action::Controller(Controller { form: ControllerForm::ForceV2, ..Controller::new().max_len(200) });
        assert_eq!(a.to_string(), "CONTROLLER:200");
        assert_eq!(enc(&a), hex("ffff 0018 00002320 0025 000000000000 0000 0008 00c8 0000"));
    }

    #[test]
    fn reasons() {
        assert_eq!(reason_name(0), "no_match");
        assert_eq!(reason_name(5), "packet_out");
        assert_eq!(reason_name(7), "");
        assert_eq!(reason_name(9), "9");
    }
}
