//! OFPT_METER_MOD (OpenFlow 1.3) and the meter features multipart.
//!
//! Why: the NetworkPolicy audit log rate-limits the copies of packets sent to the agent with a
//! meter on the switch (a `controller(meter_id=N)` action), so that a flood of new connections
//! costs the agent at most the meter's rate. Layouts and checks as OVS 3.1 `lib/ofp-meter.c`:
//! `command u16 | flags u16 | meter_id u32 | bands`, each band 16 bytes
//! (`type u16 | len u16 | rate u32 | burst_size u32 | 4 bytes`, the last byte of which is
//! `prec_level` for dscp_remark). OVS refuses a command other than add/modify/delete
//! (OFPMMFC_BAD_COMMAND), kbps together with pktps (OFPMMFC_BAD_FLAGS), a band of another length
//! (OFPBRC_BAD_LEN) or type (OFPMMFC_BAD_BAND); so do we.

use std::fmt::{self, Display, Formatter};

use bytes::BufMut;

use crate::error::DecodeError;
use crate::wire::Reader;

pub const OFPT_METER_MOD: u8 = 29;

/// Meter ids above this are OVS's virtual meters.
pub const OFPM_MAX: u32 = 0xffff_0000;
/// The meter of OVS's slow path (packets the datapath cannot handle).
pub const OFPM_SLOWPATH: u32 = 0xffff_fffd;
/// The meter OVS applies to every packet-in that has no meter of its own.
pub const OFPM_CONTROLLER: u32 = 0xffff_fffe;
/// Every meter (a DELETE of all).
pub const OFPM_ALL: u32 = 0xffff_ffff;

pub const OFPMBT_DROP: u16 = 1;
pub const OFPMBT_DSCP_REMARK: u16 = 2;

bitflags::bitflags! {
    /// `ofp_meter_flags`. Unknown bits are kept (OVS keeps them too and prints `flags:0x..`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct MeterFlags: u16 {
        const KBPS = 1;
        const PKTPS = 2;
        const BURST = 4;
        const STATS = 8;
        const _ = !0;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MeterCommand {
    Add,
    Modify,
    Delete,
}

impl MeterCommand {
    fn wire(self) -> u16 {
        match self {
            MeterCommand::Add => 0,
            MeterCommand::Modify => 1,
            MeterCommand::Delete => 2,
        }
    }
}

/// One band: above `rate` (packets or kilobits per second, by the meter's flags; `burst_size`
/// in packets or kilobits), drop — or remark DSCP by `prec_level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MeterBand {
    Drop { rate: u32, burst_size: u32 },
    DscpRemark { rate: u32, burst_size: u32, prec_level: u8 },
}

impl MeterBand {
    pub const LEN: usize = 16;

    fn encode(&self, buf: &mut impl BufMut) {
        let (typ, rate, burst, prec) = match *self {
            MeterBand::Drop { rate, burst_size } => (OFPMBT_DROP, rate, burst_size, 0),
            MeterBand::DscpRemark { rate, burst_size, prec_level } => (OFPMBT_DSCP_REMARK, rate, burst_size, prec_level),
        };
        buf.put_u16(typ);
        buf.put_u16(Self::LEN as u16);
        buf.put_u32(rate);
        buf.put_u32(burst);
        buf.put_u8(prec);
        buf.put_bytes(0, 3);
    }

    fn decode(r: &mut Reader<'_>) -> Result<MeterBand, DecodeError> {
        let typ = r.u16()?;
        let len = r.u16()? as usize;
        if len != Self::LEN {
            return Err(DecodeError::BadLength { what: "meter band", len });
        }
        let rate = r.u32()?;
        let burst_size = r.u32()?;
        let prec_level = r.u8()?;
        r.skip(3)?;
        match typ {
            OFPMBT_DROP => Ok(MeterBand::Drop { rate, burst_size }),
            OFPMBT_DSCP_REMARK => Ok(MeterBand::DscpRemark { rate, burst_size, prec_level }),
            t => Err(DecodeError::BadValue { what: "meter band type", value: t as u64 }),
        }
    }

    /// Bands filling `body` exactly.
    pub fn decode_list(body: &[u8]) -> Result<Vec<MeterBand>, DecodeError> {
        if !body.len().is_multiple_of(Self::LEN) {
            return Err(DecodeError::BadLength { what: "meter bands", len: body.len() });
        }
        let mut r = Reader::new(body, "meter bands");
        let mut v = Vec::with_capacity(body.len() / Self::LEN);
        while !r.is_empty() {
            v.push(MeterBand::decode(&mut r)?);
        }
        Ok(v)
    }
}

/// OFPT_METER_MOD.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeterMod {
    pub command: MeterCommand,
    pub flags: MeterFlags,
    pub meter_id: u32,
    pub bands: Vec<MeterBand>,
}

impl MeterMod {
    /// A packets-per-second meter with one drop band: at most `rate` packets a second pass,
    /// with bursts of up to `burst` packets (what the audit log installs).
    pub fn pktps_drop(command: MeterCommand, meter_id: u32, rate: u32, burst: u32) -> MeterMod {
        MeterMod {
            command,
            flags: MeterFlags::PKTPS | MeterFlags::BURST | MeterFlags::STATS,
            meter_id,
            bands: vec![MeterBand::Drop { rate, burst_size: burst }],
        }
    }

    /// DELETE of one meter (or of all, with [`OFPM_ALL`]).
    pub fn delete(meter_id: u32) -> MeterMod {
        MeterMod { command: MeterCommand::Delete, flags: MeterFlags::empty(), meter_id, bands: Vec::new() }
    }

    pub fn encoded_len(&self) -> usize {
        8 + self.bands.len() * MeterBand::LEN
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u16(self.command.wire());
        buf.put_u16(self.flags.bits());
        buf.put_u32(self.meter_id);
        for b in &self.bands {
            b.encode(buf);
        }
    }

    pub fn decode(body: &[u8]) -> Result<MeterMod, DecodeError> {
        let mut r = Reader::new(body, "METER_MOD");
        let command = match r.u16()? {
            0 => MeterCommand::Add,
            1 => MeterCommand::Modify,
            2 => MeterCommand::Delete,
            c => return Err(DecodeError::BadValue { what: "METER_MOD.command", value: c as u64 }),
        };
        let flags = MeterFlags::from_bits_retain(r.u16()?);
        if flags.contains(MeterFlags::KBPS | MeterFlags::PKTPS) {
            return Err(DecodeError::BadValue { what: "METER_MOD.flags (kbps and pktps)", value: flags.bits() as u64 });
        }
        let meter_id = r.u32()?;
        let bands = MeterBand::decode_list(r.rest())?;
        Ok(MeterMod { command, flags, meter_id, bands })
    }
}

/// `meter=N`, or OVS's names of the virtual meters.
pub struct MeterId(pub u32);

impl Display for MeterId {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n <= OFPM_MAX => write!(f, "meter={n}"),
            OFPM_SLOWPATH => f.write_str("meter=slowpath"),
            OFPM_CONTROLLER => f.write_str("meter=controller"),
            OFPM_ALL => f.write_str("meter=all"),
            _ => f.write_str("meter=unknown"),
        }
    }
}

/// As OVS's ofputil_format_meter_mod prints it after the message header (without the leading
/// space and the trailing newline): `ADD meter=5 kbps burst stats bands=\ntype=drop rate=1024
/// burst_size=128`.
impl Display for MeterMod {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let cmd = match self.command {
            MeterCommand::Add => "ADD",
            MeterCommand::Modify => "MOD",
            MeterCommand::Delete => "DEL",
        };
        write!(f, "{cmd} {} ", MeterId(self.meter_id))?;
        let fl = self.flags;
        for (bit, name) in [(MeterFlags::KBPS, "kbps "), (MeterFlags::PKTPS, "pktps "), (MeterFlags::BURST, "burst "), (MeterFlags::STATS, "stats ")] {
            if fl.contains(bit) {
                f.write_str(name)?;
            }
        }
        let rest = fl.bits() & !0xf;
        if rest != 0 {
            write!(f, "flags:0x{rest:x} ")?;
        }
        f.write_str("bands=")?;
        for b in &self.bands {
            let (name, rate, burst, prec) = match *b {
                MeterBand::Drop { rate, burst_size } => ("drop", rate, burst_size, None),
                MeterBand::DscpRemark { rate, burst_size, prec_level } => ("dscp_remark", rate, burst_size, Some(prec_level)),
            };
            write!(f, "\ntype={name} rate={rate}")?;
            if fl.contains(MeterFlags::BURST) {
                write!(f, " burst_size={burst}")?;
            }
            if let Some(p) = prec {
                write!(f, " prec_level={p}")?;
            }
        }
        Ok(())
    }
}

/// The OFPMP_METER_FEATURES reply body: what meters the datapath supports. OVS answers
/// `max_meter 0` when its datapath has no meters, which is how support is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MeterFeatures {
    pub max_meter: u32,
    /// Bit `1 << OFPMBT_*` per supported band type.
    pub band_types: u32,
    /// [`MeterFlags`] bits the datapath supports.
    pub capabilities: u32,
    pub max_bands: u8,
    pub max_color: u8,
}

impl MeterFeatures {
    pub const LEN: usize = 16;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(self.max_meter);
        buf.put_u32(self.band_types);
        buf.put_u32(self.capabilities);
        buf.put_u8(self.max_bands);
        buf.put_u8(self.max_color);
        buf.put_u16(0);
    }

    pub fn decode(body: &[u8]) -> Result<MeterFeatures, DecodeError> {
        if body.len() != Self::LEN {
            return Err(DecodeError::BadLength { what: "meter features reply", len: body.len() });
        }
        let mut r = Reader::new(body, "meter features reply");
        let f = MeterFeatures {
            max_meter: r.u32()?,
            band_types: r.u32()?,
            capabilities: r.u32()?,
            max_bands: r.u8()?,
            max_color: r.u8()?,
        };
        Ok(f)
    }

    /// True if packets-per-second drop meters with a burst can be installed.
    pub fn supports_pktps_drop(&self) -> bool {
        let caps = MeterFlags::from_bits_retain(self.capabilities as u16);
        self.max_meter > 0
            && self.max_bands > 0
            && self.band_types & (1 << OFPMBT_DROP) != 0
            && caps.contains(MeterFlags::PKTPS | MeterFlags::BURST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{Message, OfMessage};
    use crate::wire::hex;

    /// tests/ofp-print.at "OFPT_METER_MOD request - OF1.3".
    #[test]
    fn ovs_meter_mod_vector() {
        let v = hex("041d0020000000020000000d0000000500010010000004000000008000000000");
        let m = OfMessage::decode(&v).unwrap();
        let Message::MeterMod(mm) = &m.msg else { panic!("{m:?}") };
        assert_eq!(mm.to_string(), "ADD meter=5 kbps burst stats bands=\ntype=drop rate=1024 burst_size=128");
        assert_eq!(m.to_bytes().unwrap().to_vec(), v);
    }

    /// The three vectors OVS refuses (bad band type, bad command, kbps with pktps): so do we.
    #[test]
    fn ovs_rejects_we_reject() {
        for v in [
            "041d00208501d738000000000000000100050010000000020000000200000000",
            "041d001028a626520008000000000001",
            "041d002082b3a1a4000000030000000100010010000000020000000200000000",
        ] {
            assert!(OfMessage::decode(&hex(v)).is_err(), "{v}");
        }
    }

    #[test]
    fn audit_meter() {
        let mm = MeterMod::pktps_drop(MeterCommand::Add, 1, 100, 10);
        let m = OfMessage::new(7, Message::MeterMod(mm.clone()));
        let b = m.to_bytes().unwrap();
        assert_eq!(b.to_vec(), hex("041d0020 00000007 0000 000e 00000001 0001 0010 00000064 0000000a 00000000"));
        assert_eq!(OfMessage::decode(&b).unwrap(), m);
        assert_eq!(mm.to_string(), "ADD meter=1 pktps burst stats bands=\ntype=drop rate=100 burst_size=10");
        assert_eq!(MeterMod::delete(OFPM_ALL).to_string(), "DEL meter=all bands=");
    }

    /// tests/ofp-print.at "OFPST_METER_FEATURES reply - OF1.3".
    #[test]
    fn features() {
        let f = MeterFeatures::decode(&hex("00010000 00000006 0000000f 10 02 0000")).unwrap();
        assert_eq!(f, MeterFeatures { max_meter: 65536, band_types: 6, capabilities: 15, max_bands: 16, max_color: 2 });
        assert!(f.supports_pktps_drop());
        assert!(!MeterFeatures { max_meter: 0, ..f }.supports_pktps_drop());
    }
}

/// One meter's entry in an OFPMP_METER reply: what went in, and per band what the band took
/// (for a drop band: what the meter dropped).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeterStats {
    pub meter_id: u32,
    pub flow_count: u32,
    pub packet_in_count: u64,
    pub byte_in_count: u64,
    pub duration_sec: u32,
    pub duration_nsec: u32,
    /// `(packet_band_count, byte_band_count)` per band.
    pub bands: Vec<(u64, u64)>,
}

impl MeterStats {
    const FIXED: usize = 40;

    pub fn encoded_len(&self) -> usize {
        Self::FIXED + 16 * self.bands.len()
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u32(self.meter_id);
        buf.put_u16(self.encoded_len().min(u16::MAX as usize) as u16);
        buf.put_bytes(0, 6);
        buf.put_u32(self.flow_count);
        buf.put_u64(self.packet_in_count);
        buf.put_u64(self.byte_in_count);
        buf.put_u32(self.duration_sec);
        buf.put_u32(self.duration_nsec);
        for (p, b) in &self.bands {
            buf.put_u64(*p);
            buf.put_u64(*b);
        }
    }

    /// The entries of one reply part, filling `body` exactly.
    pub fn decode_list(body: &[u8]) -> Result<Vec<MeterStats>, DecodeError> {
        let mut r = Reader::new(body, "meter stats");
        let mut v = Vec::new();
        while !r.is_empty() {
            let head = r.rest();
            let mut h = Reader::new(head, "meter stats");
            h.skip(4)?;
            let len = h.u16()? as usize;
            if len < Self::FIXED || !(len - Self::FIXED).is_multiple_of(16) || len > head.len() {
                return Err(DecodeError::BadLength { what: "meter stats", len });
            }
            let mut e = Reader::new(r.bytes(len)?, "meter stats");
            let meter_id = e.u32()?;
            e.skip(8)?;
            let mut s = MeterStats {
                meter_id,
                flow_count: e.u32()?,
                packet_in_count: e.u64()?,
                byte_in_count: e.u64()?,
                duration_sec: e.u32()?,
                duration_nsec: e.u32()?,
                bands: Vec::with_capacity((len - Self::FIXED) / 16),
            };
            while !e.is_empty() {
                s.bands.push((e.u64()?, e.u64()?));
            }
            v.push(s);
        }
        Ok(v)
    }
}

#[cfg(test)]
mod stats_tests {
    use super::*;
    use crate::msg::{Message, MultipartReplyBody, MultipartRequestBody, OfMessage};
    use crate::wire::hex;

    /// tests/ofp-print.at "OFPST_METER request - OF1.3" (meter=1) and "OFPST_METER reply -
    /// OF1.3" (meter:1 flow_count:5 packet_in_count:4096 byte_in_count:143360
    /// duration:394.174990148s bands: 0: packet_count:126 byte_count:13363 1: packet_count:231
    /// byte_count:37934, then meter:2 flow_count:2 packet_in_count:512 byte_in_count:12288
    /// duration:391.170094148s bands: 0: packet_count:42 byte_count:1075).
    #[test]
    fn ovs_meter_stats_vectors() {
        let req = hex("041200180000000200090000000000000000000100000000");
        let m = OfMessage::decode(&req).unwrap();
        let Message::MultipartRequest(r) = &m.msg else { panic!() };
        assert_eq!(r.body, MultipartRequestBody::MeterStats(1));
        assert_eq!(m.to_bytes().unwrap().to_vec(), req);

        let rep = hex("0413009000000002000900000000000000000001004800000000000000000005000000000000100000000000000230000000018a0a6e2344000000000000007e000000000000343300000000000000e7000000000000942e0000000200380000000000000000000200000000000002000000000000003000000001870a236e44000000000000002a0000000000000433");
        let m = OfMessage::decode(&rep).unwrap();
        let Message::MultipartReply(r) = &m.msg else { panic!() };
        let MultipartReplyBody::MeterStats(v) = &r.body else { panic!("{r:?}") };
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].meter_id, v[0].flow_count, v[0].packet_in_count, v[0].byte_in_count), (1, 5, 4096, 143360));
        assert_eq!((v[0].duration_sec, v[0].duration_nsec), (394, 174990148));
        assert_eq!(v[0].bands, vec![(126, 13363), (231, 37934)]);
        assert_eq!((v[1].meter_id, v[1].packet_in_count, &v[1].bands), (2, 512, &vec![(42, 1075)]));
        assert_eq!(m.to_bytes().unwrap().to_vec(), rep);
        assert!(MeterStats::decode_list(&rep[16..60]).is_err());
    }
}
