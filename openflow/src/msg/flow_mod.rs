//! OFPT_FLOW_MOD.

use bitflags::bitflags;
use bytes::BufMut;

use crate::action::Action;
use crate::error::{DecodeError, EncodeError};
use crate::flow_match::Match;
use crate::instruction::{decode_instructions, encode_instructions, instructions_len, Instruction};
use crate::port::PortNo;
use crate::wire::Reader;

/// OFP_NO_BUFFER: OVS has no packet buffers; anything else fails with OFPBRC_BUFFER_UNKNOWN.
pub const OFP_NO_BUFFER: u32 = 0xffff_ffff;
/// OFPG_ANY.
pub const OFPG_ANY: u32 = 0xffff_ffff;
/// OFPTT_ALL: every table (DELETE/DELETE_STRICT and stats requests only).
pub const OFPTT_ALL: u8 = 0xff;
/// The priority used when none is given.
pub const OFP_DEFAULT_PRIORITY: u16 = 0x8000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlowModCommand {
    Add,
    Modify,
    ModifyStrict,
    Delete,
    DeleteStrict,
    Unknown(u8),
}

impl FlowModCommand {
    pub fn to_u8(self) -> u8 {
        match self {
            FlowModCommand::Add => 0,
            FlowModCommand::Modify => 1,
            FlowModCommand::ModifyStrict => 2,
            FlowModCommand::Delete => 3,
            FlowModCommand::DeleteStrict => 4,
            FlowModCommand::Unknown(n) => n,
        }
    }
    pub fn from_u8(n: u8) -> FlowModCommand {
        match n {
            0 => FlowModCommand::Add,
            1 => FlowModCommand::Modify,
            2 => FlowModCommand::ModifyStrict,
            3 => FlowModCommand::Delete,
            4 => FlowModCommand::DeleteStrict,
            n => FlowModCommand::Unknown(n),
        }
    }
    /// The name ovs-ofctl prints (`ADD`, `MOD_STRICT`, `DEL`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FlowModCommand::Add => "ADD",
            FlowModCommand::Modify => "MOD",
            FlowModCommand::ModifyStrict => "MOD_STRICT",
            FlowModCommand::Delete => "DEL",
            FlowModCommand::DeleteStrict => "DEL_STRICT",
            FlowModCommand::Unknown(_) => "UNKNOWN",
        }
    }
}

bitflags! {
    /// OFPFF_* flags. Unknown bits are kept.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct FlowModFlags: u16 {
        const SEND_FLOW_REM = 1;
        const CHECK_OVERLAP = 2;
        const RESET_COUNTS = 4;
        const NO_PKT_COUNTS = 8;
        const NO_BYT_COUNTS = 0x10;
        const _ = !0;
    }
}

/// A FLOW_MOD.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FlowMod {
    /// ADD: the new flow's cookie. MODIFY*/DELETE*: a filter under `cookie_mask` (OF1.3 modify
    /// never changes a cookie).
    pub cookie: u64,
    pub cookie_mask: u64,
    pub table_id: u8,
    pub command: FlowModCommand,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub priority: u16,
    pub buffer_id: u32,
    /// DELETE* filter; ANY disables it.
    pub out_port: PortNo,
    pub out_group: u32,
    pub flags: FlowModFlags,
    pub match_: Match,
    pub instructions: Vec<Instruction>,
}

impl FlowMod {
    pub const FIXED_LEN: usize = 40;

    /// A FLOW_MOD with every filter and option at its neutral value.
    pub fn new(command: FlowModCommand, table_id: u8, priority: u16, match_: Match) -> FlowMod {
        FlowMod::from_head(FlowModHead::new(command, table_id, priority), match_, Vec::new())
    }

    /// A FLOW_MOD from its fixed part, match and instructions.
    pub fn from_head(h: FlowModHead, match_: Match, instructions: Vec<Instruction>) -> FlowMod {
        FlowMod {
            cookie: h.cookie,
            cookie_mask: h.cookie_mask,
            table_id: h.table_id,
            command: h.command,
            idle_timeout: h.idle_timeout,
            hard_timeout: h.hard_timeout,
            priority: h.priority,
            buffer_id: h.buffer_id,
            out_port: h.out_port,
            out_group: h.out_group,
            flags: h.flags,
            match_,
            instructions,
        }
    }

    /// ADD with apply-actions `actions` (omitted when empty) and an optional goto_table: the
    /// instruction shape of every flow in the openshift-sdn pipeline.
    pub fn add(table_id: u8, priority: u16, match_: Match, actions: Vec<Action>, goto: Option<u8>) -> FlowMod {
        let mut f = FlowMod::new(FlowModCommand::Add, table_id, priority, match_);
        f.instructions = instructions_for(actions, goto);
        f
    }

    /// DELETE_STRICT of exactly (table, priority, match), optionally filtered by cookie.
    pub fn delete_strict(table_id: u8, priority: u16, match_: Match) -> FlowMod {
        FlowMod::new(FlowModCommand::DeleteStrict, table_id, priority, match_)
    }

    pub fn with_cookie(mut self, cookie: u64, mask: u64) -> FlowMod {
        self.cookie = cookie;
        self.cookie_mask = mask;
        self
    }

    pub fn encoded_len(&self) -> usize {
        Self::FIXED_LEN + self.match_.encoded_len() + instructions_len(&self.instructions)
    }

    /// The fixed part of this FLOW_MOD.
    pub fn head(&self) -> FlowModHead {
        FlowModHead {
            cookie: self.cookie,
            cookie_mask: self.cookie_mask,
            table_id: self.table_id,
            command: self.command,
            idle_timeout: self.idle_timeout,
            hard_timeout: self.hard_timeout,
            priority: self.priority,
            buffer_id: self.buffer_id,
            out_port: self.out_port,
            out_group: self.out_group,
            flags: self.flags,
        }
    }

    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        self.head().encode(buf);
        self.match_.encode(buf);
        encode_instructions(&self.instructions, buf)
    }

    pub fn decode(body: &[u8]) -> Result<FlowMod, DecodeError> {
        let mut r = Reader::new(body, "FLOW_MOD");
        let head = FlowModHead::decode(&mut r)?;
        let match_ = Match::decode(&mut r)?;
        let instructions = decode_instructions(r.rest())?;
        Ok(FlowMod::from_head(head, match_, instructions))
    }
}

/// The fixed 40 bytes of a FLOW_MOD body (everything but the match and the instructions).
///
/// For callers that keep flows pre-encoded: a flow store can compile a flow's match and
/// instructions once and write FLOW_MODs as `head + encoded match + encoded instructions`,
/// without a typed [`FlowMod`] per message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowModHead {
    pub cookie: u64,
    pub cookie_mask: u64,
    pub table_id: u8,
    pub command: FlowModCommand,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub priority: u16,
    pub buffer_id: u32,
    pub out_port: PortNo,
    pub out_group: u32,
    pub flags: FlowModFlags,
}

impl FlowModHead {
    /// A head with every filter and option at its neutral value.
    pub fn new(command: FlowModCommand, table_id: u8, priority: u16) -> FlowModHead {
        FlowModHead {
            cookie: 0,
            cookie_mask: 0,
            table_id,
            command,
            idle_timeout: 0,
            hard_timeout: 0,
            priority,
            buffer_id: OFP_NO_BUFFER,
            out_port: PortNo::ANY,
            out_group: OFPG_ANY,
            flags: FlowModFlags::empty(),
        }
    }

    /// Reads the fixed part (including its 2 bytes of padding).
    pub fn decode(r: &mut Reader<'_>) -> Result<FlowModHead, DecodeError> {
        let h = FlowModHead {
            cookie: r.u64()?,
            cookie_mask: r.u64()?,
            table_id: r.u8()?,
            command: FlowModCommand::from_u8(r.u8()?),
            idle_timeout: r.u16()?,
            hard_timeout: r.u16()?,
            priority: r.u16()?,
            buffer_id: r.u32()?,
            out_port: PortNo(r.u32()?),
            out_group: r.u32()?,
            flags: FlowModFlags::from_bits_retain(r.u16()?),
        };
        r.skip(2)?;
        Ok(h)
    }

    pub fn encode(&self, buf: &mut impl BufMut) {
        buf.put_u64(self.cookie);
        buf.put_u64(self.cookie_mask);
        buf.put_u8(self.table_id);
        buf.put_u8(self.command.to_u8());
        buf.put_u16(self.idle_timeout);
        buf.put_u16(self.hard_timeout);
        buf.put_u16(self.priority);
        buf.put_u32(self.buffer_id);
        buf.put_u32(self.out_port.0);
        buf.put_u32(self.out_group);
        buf.put_u16(self.flags.bits());
        buf.put_u16(0);
    }

    /// A whole FLOW_MOD body: this head, an encoded `ofp_match` (with its padding, as
    /// [`Match::encode`] writes it) and encoded instructions.
    pub fn encode_body(&self, buf: &mut impl BufMut, encoded_match: &[u8], encoded_instructions: &[u8]) {
        self.encode(buf);
        buf.put_slice(encoded_match);
        buf.put_slice(encoded_instructions);
    }
}

/// The instructions for "apply these actions, then go to this table"; no instruction at all
/// for an empty action list (that is `actions=drop`).
pub fn instructions_for(actions: Vec<Action>, goto: Option<u8>) -> Vec<Instruction> {
    let mut ins = Vec::with_capacity(2);
    if !actions.is_empty() {
        ins.push(Instruction::ApplyActions(actions));
    }
    if let Some(t) = goto {
        ins.push(Instruction::GotoTable(t));
    }
    ins
}
