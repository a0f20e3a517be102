//! OFPT_ERROR, standard and experimenter forms.
//!
//! OVS 3.1 puts the *entire* offending message in `data` (not only 64 bytes), with the error's
//! xid equal to the offending message's xid; for a bundled message, `data` is the outer
//! BUNDLE_ADD_MESSAGE.

use std::fmt;

use bytes::{BufMut, Bytes};

use crate::error::DecodeError;
use crate::msg::OfMessage;
use crate::wire::Reader;
use crate::{NX_VENDOR_ID, ONF_VENDOR_ID};

pub const OFPET_EXPERIMENTER: u16 = 0xffff;

/// The error's type/code pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Standard { typ: u16, code: u16 },
    Experimenter { exp_code: u16, experimenter: u32 },
}

impl ErrorCode {
    pub const HELLO_FAILED_INCOMPATIBLE: ErrorCode = ErrorCode::Standard { typ: 0, code: 0 };
    pub const BAD_TABLE_ID: ErrorCode = ErrorCode::Standard { typ: 3, code: 2 };
    pub const BUNDLE_MSG_FAILED: ErrorCode = ErrorCode::Experimenter { exp_code: 2313, experimenter: ONF_VENDOR_ID };
    pub const BUNDLE_TIMEOUT: ErrorCode = ErrorCode::Experimenter { exp_code: 2314, experimenter: ONF_VENDOR_ID };

    /// OVS's name for the code (the names `ovs-ofctl` prints), where known.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            ErrorCode::Standard { typ, code } => match (typ, code) {
                (0, 0) => "OFPHFC_INCOMPATIBLE",
                (0, 1) => "OFPHFC_EPERM",
                (1, 0) => "OFPBRC_BAD_VERSION",
                (1, 1) => "OFPBRC_BAD_TYPE",
                (1, 2) => "OFPBRC_BAD_STAT",
                (1, 3) => "OFPBRC_BAD_VENDOR",
                (1, 4) => "OFPBRC_BAD_SUBTYPE",
                (1, 5) => "OFPBRC_EPERM",
                (1, 6) => "OFPBRC_BAD_LEN",
                (1, 7) => "OFPBRC_BUFFER_EMPTY",
                (1, 8) => "OFPBRC_BUFFER_UNKNOWN",
                (1, 9) => "OFPBRC_BAD_TABLE_ID",
                (1, 10) => "OFPBRC_IS_SLAVE",
                (1, 11) => "OFPBRC_BAD_PORT",
                (1, 12) => "OFPBRC_BAD_PACKET",
                (1, 13) => "OFPBRC_MULTIPART_BUFFER_OVERFLOW",
                (2, 0) => "OFPBAC_BAD_TYPE",
                (2, 1) => "OFPBAC_BAD_LEN",
                (2, 2) => "OFPBAC_BAD_VENDOR",
                (2, 3) => "OFPBAC_BAD_VENDOR_TYPE",
                (2, 4) => "OFPBAC_BAD_OUT_PORT",
                (2, 5) => "OFPBAC_BAD_ARGUMENT",
                (2, 6) => "OFPBAC_EPERM",
                (2, 7) => "OFPBAC_TOO_MANY",
                (2, 8) => "OFPBAC_BAD_QUEUE",
                (2, 9) => "OFPBAC_BAD_OUT_GROUP",
                (2, 10) => "OFPBAC_MATCH_INCONSISTENT",
                (2, 11) => "OFPBAC_UNSUPPORTED_ORDER",
                (2, 12) => "OFPBAC_BAD_TAG",
                (2, 13) => "OFPBAC_BAD_SET_TYPE",
                (2, 14) => "OFPBAC_BAD_SET_LEN",
                (2, 15) => "OFPBAC_BAD_SET_ARGUMENT",
                (3, 0) => "OFPBIC_UNKNOWN_INST",
                (3, 1) => "OFPBIC_UNSUP_INST",
                (3, 2) => "OFPBIC_BAD_TABLE_ID",
                (3, 3) => "OFPBIC_UNSUP_METADATA",
                (3, 4) => "OFPBIC_UNSUP_METADATA_MASK",
                (3, 5) => "OFPBIC_BAD_EXPERIMENTER",
                (3, 6) => "OFPBIC_BAD_EXP_TYPE",
                (3, 7) => "OFPBIC_BAD_LEN",
                (3, 8) => "OFPBIC_EPERM",
                (4, 0) => "OFPBMC_BAD_TYPE",
                (4, 1) => "OFPBMC_BAD_LEN",
                (4, 2) => "OFPBMC_BAD_TAG",
                (4, 3) => "OFPBMC_BAD_DL_ADDR_MASK",
                (4, 4) => "OFPBMC_BAD_NW_ADDR_MASK",
                (4, 5) => "OFPBMC_BAD_WILDCARDS",
                (4, 6) => "OFPBMC_BAD_FIELD",
                (4, 7) => "OFPBMC_BAD_VALUE",
                (4, 8) => "OFPBMC_BAD_MASK",
                (4, 9) => "OFPBMC_BAD_PREREQ",
                (4, 10) => "OFPBMC_DUP_FIELD",
                (4, 11) => "OFPBMC_EPERM",
                (5, 0) => "OFPFMFC_UNKNOWN",
                (5, 1) => "OFPFMFC_TABLE_FULL",
                (5, 2) => "OFPFMFC_BAD_TABLE_ID",
                (5, 3) => "OFPFMFC_OVERLAP",
                (5, 4) => "OFPFMFC_EPERM",
                (5, 5) => "OFPFMFC_BAD_TIMEOUT",
                (5, 6) => "OFPFMFC_BAD_COMMAND",
                (5, 7) => "OFPFMFC_BAD_FLAGS",
                (10, 0) => "OFPSCFC_BAD_FLAGS",
                (10, 1) => "OFPSCFC_BAD_LEN",
                (10, 2) => "OFPSCFC_EPERM",
                _ => return None,
            },
            ErrorCode::Experimenter { exp_code, experimenter: NX_VENDOR_ID } => match exp_code {
                4 => "NXBRC_MUST_BE_ZERO",
                10 => "NXBRC_UNENCODABLE_ERROR",
                _ => return None,
            },
            ErrorCode::Experimenter { exp_code, experimenter: ONF_VENDOR_ID } => match exp_code {
                2300 => "OFPBFC_UNKNOWN",
                2301 => "OFPBFC_EPERM",
                2302 => "OFPBFC_BAD_ID",
                2303 => "OFPBFC_BUNDLE_EXIST",
                2304 => "OFPBFC_BUNDLE_CLOSED",
                2305 => "OFPBFC_OUT_OF_BUNDLES",
                2306 => "OFPBFC_BAD_TYPE",
                2307 => "OFPBFC_BAD_FLAGS",
                2308 => "OFPBFC_MSG_BAD_LEN",
                2309 => "OFPBFC_MSG_BAD_XID",
                2310 => "OFPBFC_MSG_UNSUP",
                2311 => "OFPBFC_MSG_CONFLICT",
                2312 => "OFPBFC_MSG_TOO_MANY",
                2313 => "OFPBFC_MSG_FAILED",
                2314 => "OFPBFC_TIMEOUT",
                2315 => "OFPBFC_BUNDLE_IN_PROGRESS",
                2600 => "OFPBIC_DUP_INST",
                4250 => "OFPBAC_BAD_SET_MASK",
                _ => return None,
            },
            ErrorCode::Experimenter { .. } => return None,
        })
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.name(), self) {
            (Some(n), _) => f.write_str(n),
            (None, ErrorCode::Standard { typ, code }) => write!(f, "OFPET({typ},{code})"),
            (None, ErrorCode::Experimenter { exp_code, experimenter }) => {
                write!(f, "experimenter {experimenter:#010x} code {exp_code}")
            }
        }
    }
}

/// An ERROR message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorMsg {
    pub code: ErrorCode,
    /// The offending message (or, for HELLO_FAILED, ASCII text).
    pub data: Bytes,
}

impl ErrorMsg {
    pub fn encoded_len(&self) -> usize {
        4 + match self.code {
            ErrorCode::Standard { .. } => 0,
            ErrorCode::Experimenter { .. } => 4,
        } + self.data.len()
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        match self.code {
            ErrorCode::Standard { typ, code } => {
                buf.put_u16(typ);
                buf.put_u16(code);
            }
            ErrorCode::Experimenter { exp_code, experimenter } => {
                buf.put_u16(OFPET_EXPERIMENTER);
                buf.put_u16(exp_code);
                buf.put_u32(experimenter);
            }
        }
        buf.put_slice(&self.data);
    }

    pub fn decode(body: &[u8]) -> Result<ErrorMsg, DecodeError> {
        let mut r = Reader::new(body, "ERROR");
        let typ = r.u16()?;
        let code = r.u16()?;
        let code = if typ == OFPET_EXPERIMENTER {
            ErrorCode::Experimenter { exp_code: code, experimenter: r.u32()? }
        } else {
            ErrorCode::Standard { typ, code }
        };
        Ok(ErrorMsg { code, data: r.take_rest() })
    }

    /// Decodes the offending message carried in `data`, if it is a whole message.
    pub fn offending(&self) -> Result<OfMessage, DecodeError> {
        let h = crate::msg::Header::decode(&self.data)?;
        let len = (h.length as usize).min(self.data.len());
        OfMessage::decode(&self.data[..len])
    }

    /// The text carried by a HELLO_FAILED error.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }
}

impl fmt::Display for ErrorMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.code)?;
        match (self.code, self.offending()) {
            (ErrorCode::Standard { typ: 0, .. }, _) => write!(f, ": {}", self.text()),
            (_, Ok(m)) => write!(f, " (in {} xid={:#x})", m.msg.name(), m.xid),
            (_, Err(_)) => Ok(()),
        }
    }
}
