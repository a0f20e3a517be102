//! OpenFlow 1.3 instructions.

use bytes::{BufMut, Bytes};

use crate::action::{actions_len, decode_actions, Action};
use crate::error::{DecodeError, EncodeError};
use crate::wire::{check_len8, len_u16, Reader};

pub const OFPIT_GOTO_TABLE: u16 = 1;
pub const OFPIT_WRITE_METADATA: u16 = 2;
pub const OFPIT_WRITE_ACTIONS: u16 = 3;
pub const OFPIT_APPLY_ACTIONS: u16 = 4;
pub const OFPIT_CLEAR_ACTIONS: u16 = 5;
pub const OFPIT_METER: u16 = 6;

/// An instruction. `actions=drop` is the absence of instructions (or of actions): OVS drops an
/// empty APPLY/WRITE instruction when it stores a flow.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Instruction {
    GotoTable(u8),
    WriteMetadata { metadata: u64, mask: u64 },
    WriteActions(Vec<Action>),
    ApplyActions(Vec<Action>),
    ClearActions,
    Meter(u32),
    /// Any other instruction, whole, re-encoded verbatim.
    Unknown(Bytes),
}

impl Instruction {
    /// OVS's canonical position of this instruction when it prints or re-encodes a flow:
    /// meter, apply_actions, clear_actions, write_actions, write_metadata, goto_table.
    pub fn canonical_rank(&self) -> u8 {
        match self {
            Instruction::Meter(_) => 0,
            Instruction::ApplyActions(_) => 1,
            Instruction::ClearActions => 2,
            Instruction::WriteActions(_) => 3,
            Instruction::WriteMetadata { .. } => 4,
            Instruction::GotoTable(_) => 5,
            Instruction::Unknown(_) => 6,
        }
    }

    pub fn encoded_len(&self) -> usize {
        match self {
            Instruction::GotoTable(_) | Instruction::ClearActions | Instruction::Meter(_) => 8,
            Instruction::WriteMetadata { .. } => 24,
            Instruction::WriteActions(a) | Instruction::ApplyActions(a) => 8 + actions_len(a),
            Instruction::Unknown(b) => b.len(),
        }
    }

    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        match self {
            Instruction::GotoTable(t) => {
                buf.put_u16(OFPIT_GOTO_TABLE);
                buf.put_u16(8);
                buf.put_u8(*t);
                buf.put_bytes(0, 3);
            }
            Instruction::WriteMetadata { metadata, mask } => {
                buf.put_u16(OFPIT_WRITE_METADATA);
                buf.put_u16(24);
                buf.put_u32(0);
                buf.put_u64(*metadata);
                buf.put_u64(*mask);
            }
            Instruction::WriteActions(a) | Instruction::ApplyActions(a) => {
                let typ = if matches!(self, Instruction::WriteActions(_)) { OFPIT_WRITE_ACTIONS } else { OFPIT_APPLY_ACTIONS };
                buf.put_u16(typ);
                buf.put_u16(len_u16("instruction", self.encoded_len())?);
                buf.put_u32(0);
                for act in a {
                    act.encode(buf)?;
                }
            }
            Instruction::ClearActions => {
                buf.put_u16(OFPIT_CLEAR_ACTIONS);
                buf.put_u16(8);
                buf.put_u32(0);
            }
            Instruction::Meter(m) => {
                buf.put_u16(OFPIT_METER);
                buf.put_u16(8);
                buf.put_u32(*m);
            }
            Instruction::Unknown(b) => buf.put_slice(b),
        }
        Ok(())
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Instruction, DecodeError> {
        let head = r.rest();
        let mut h = Reader::new(head, "instruction header");
        let typ = h.u16()?;
        let len = h.u16()? as usize;
        check_len8("instruction", len, 8, head.len())?;
        let raw = r.bytes(len)?;
        let mut b = Reader::new(&raw[4..], "instruction");
        let fixed = |want: usize, name: &'static str| {
            if len == want {
                Ok(())
            } else {
                Err(DecodeError::BadLength { what: name, len })
            }
        };
        Ok(match typ {
            OFPIT_GOTO_TABLE => {
                fixed(8, "goto_table")?;
                Instruction::GotoTable(b.u8()?)
            }
            OFPIT_WRITE_METADATA => {
                fixed(24, "write_metadata")?;
                b.skip(4)?;
                Instruction::WriteMetadata { metadata: b.u64()?, mask: b.u64()? }
            }
            OFPIT_WRITE_ACTIONS => Instruction::WriteActions(decode_actions(&raw[8..])?),
            OFPIT_APPLY_ACTIONS => Instruction::ApplyActions(decode_actions(&raw[8..])?),
            OFPIT_CLEAR_ACTIONS => {
                fixed(8, "clear_actions")?;
                Instruction::ClearActions
            }
            OFPIT_METER => {
                fixed(8, "meter")?;
                Instruction::Meter(b.u32()?)
            }
            _ => Instruction::Unknown(Bytes::copy_from_slice(raw)),
        })
    }
}

/// Decodes instructions filling `buf` exactly.
pub fn decode_instructions(buf: &[u8]) -> Result<Vec<Instruction>, DecodeError> {
    let mut r = Reader::new(buf, "instructions");
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(Instruction::decode(&mut r)?);
    }
    Ok(out)
}

pub fn instructions_len(ins: &[Instruction]) -> usize {
    ins.iter().map(Instruction::encoded_len).sum()
}

pub fn encode_instructions(ins: &[Instruction], buf: &mut impl BufMut) -> Result<(), EncodeError> {
    for i in ins {
        i.encode(buf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;


    #[test]
    fn vectors() {
        let cases = [
            (Instruction::GotoTable(1), "0001 0008 01 000000"),
            (Instruction::ClearActions, "0005 0008 00000000"),
            // WRITE_ACTIONS | len 24 | pad | OUTPUT 2
            (Instruction::WriteActions(vec![Action::output(2)]), "0003 0018 00000000 0000 0010 00000002 0000 000000000000"),
            (Instruction::ApplyActions(vec![Action::output(2)]), "0004 0018 00000000 0000 0010 00000002 0000 000000000000"),
            (Instruction::WriteMetadata { metadata: 5, mask: 0xff }, "0002 0018 00000000 0000000000000005 00000000000000ff"),
        ];
        for (i, v) in cases {
            let want = hex(v);
            let mut b = Vec::new();
            i.encode(&mut b).unwrap();
            assert_eq!(b, want);
            assert_eq!(i.encoded_len(), want.len());
            assert_eq!(decode_instructions(&want).unwrap(), vec![i]);
        }
    }

    #[test]
    fn malformed() {
        assert!(decode_instructions(&hex("0001 0010 01 000000")).is_err());
        assert!(decode_instructions(&hex("0001 0007 01 000000")).is_err());
        assert!(decode_instructions(&hex("0004 0010 00000000 0000 0010")).is_err());
        let unk = hex("0007 0008 00000001");
        assert_eq!(decode_instructions(&unk).unwrap(), vec![Instruction::Unknown(Bytes::from(unk.clone()))]);
    }
}
