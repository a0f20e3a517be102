//! FEATURES_REPLY and the switch configuration (GET_CONFIG_REPLY / SET_CONFIG).

use bytes::BufMut;

use crate::error::DecodeError;
use crate::wire::Reader;

/// FEATURES_REPLY body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeaturesReply {
    pub datapath_id: u64,
    pub n_buffers: u32,
    pub n_tables: u8,
    pub auxiliary_id: u8,
    pub capabilities: u32,
    pub reserved: u32,
}

impl FeaturesReply {
    pub const LEN: usize = 24;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u64(self.datapath_id);
        buf.put_u32(self.n_buffers);
        buf.put_u8(self.n_tables);
        buf.put_u8(self.auxiliary_id);
        buf.put_u16(0);
        buf.put_u32(self.capabilities);
        buf.put_u32(self.reserved);
    }

    pub fn decode(body: &[u8]) -> Result<FeaturesReply, DecodeError> {
        if body.len() != Self::LEN {
            return Err(DecodeError::BadLength { what: "FEATURES_REPLY", len: body.len() + 8 });
        }
        let mut r = Reader::new(body, "FEATURES_REPLY");
        let datapath_id = r.u64()?;
        let n_buffers = r.u32()?;
        let n_tables = r.u8()?;
        let auxiliary_id = r.u8()?;
        r.skip(2)?;
        Ok(FeaturesReply { datapath_id, n_buffers, n_tables, auxiliary_id, capabilities: r.u32()?, reserved: r.u32()? })
    }
}

/// IP fragment handling (the low two bits of `ofp_switch_config.flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FragMode {
    Normal,
    Drop,
    /// Accepted but not applied by OVS 3.1.
    Reasm,
    /// OVS extension: first fragments keep their L4 fields, later ones have them zeroed, and
    /// `ip_frag` can be matched. The seed sets this (`SetFrags("nx-match")`).
    NxMatch,
}

impl FragMode {
    fn bits(self) -> u16 {
        match self {
            FragMode::Normal => 0,
            FragMode::Drop => 1,
            FragMode::Reasm => 2,
            FragMode::NxMatch => 3,
        }
    }
    fn from_bits(b: u16) -> FragMode {
        match b & 3 {
            0 => FragMode::Normal,
            1 => FragMode::Drop,
            2 => FragMode::Reasm,
            _ => FragMode::NxMatch,
        }
    }
    /// The name ovs-ofctl uses (`frags=nx-match`).
    pub fn name(self) -> &'static str {
        match self {
            FragMode::Normal => "normal",
            FragMode::Drop => "drop",
            FragMode::Reasm => "reassemble",
            FragMode::NxMatch => "nx-match",
        }
    }
}

/// `ofp_switch_config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchConfig {
    pub frag: FragMode,
    /// Flag bits above the fragment mode, kept as received.
    pub other_flags: u16,
    pub miss_send_len: u16,
}

impl SwitchConfig {
    pub const LEN: usize = 4;

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u16((self.other_flags & !3) | self.frag.bits());
        buf.put_u16(self.miss_send_len);
    }

    pub fn decode(body: &[u8]) -> Result<SwitchConfig, DecodeError> {
        if body.len() != Self::LEN {
            return Err(DecodeError::BadLength { what: "ofp_switch_config", len: body.len() + 8 });
        }
        let mut r = Reader::new(body, "ofp_switch_config");
        let flags = r.u16()?;
        Ok(SwitchConfig { frag: FragMode::from_bits(flags), other_flags: flags & !3, miss_send_len: r.u16()? })
    }
}
