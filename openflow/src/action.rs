//! OpenFlow 1.3 actions and the Nicira extension actions the openshift-sdn pipeline uses.
//!
//! What OVS 3.1 itself puts on the wire for OF1.3 (wire reference §8): `load:` is NXAST_REG_LOAD,
//! `set_field:` is OFPAT_SET_FIELD (with the NXM header for fields that have no OXM, such as
//! tun_dst), `move:` is NXAST_REG_MOVE, `output:NXM_NX_REG2[]` is NXAST_OUTPUT_REG and `note:` is
//! NXAST_NOTE whose zero padding becomes part of the note. The switch returns each action in the
//! form it was given, so [`Action::RegLoad`] and [`Action::SetField`] stay distinct.

use std::net::{Ipv4Addr, Ipv6Addr};

use bytes::{BufMut, Bytes};

use crate::controller::{Controller, NXAST_CONTROLLER, NXAST_CONTROLLER2};
use crate::error::{DecodeError, EncodeError};
use crate::field::{self, NxmField, CLASS_NXM1, CLASS_OPENFLOW_BASIC};
use crate::flow_match::{MacAddr, RawOxm};
use crate::port::PortNo;
use crate::wire::{check_len8, len_u16, pad8, Reader};
use crate::NX_VENDOR_ID;

pub const OFPAT_OUTPUT: u16 = 0;
pub const OFPAT_SET_FIELD: u16 = 25;
pub use crate::wire::OFPAT_EXPERIMENTER;

pub const NXAST_RESUBMIT: u16 = 1;
pub const NXAST_REG_MOVE: u16 = 6;
pub const NXAST_REG_LOAD: u16 = 7;
pub const NXAST_NOTE: u16 = 8;
pub const NXAST_RESUBMIT_TABLE: u16 = 14;
pub const NXAST_OUTPUT_REG: u16 = 15;
pub const NXAST_CONJUNCTION: u16 = 34;
pub const NXAST_CT: u16 = 35;

/// `recirc_table` of NXAST_CT meaning "do not recirculate" (no `table=` in the text form).
pub const NX_CT_RECIRC_NONE: u8 = 0xff;
/// NXAST_CT flags.
pub const NX_CT_F_COMMIT: u16 = 1;
pub const NX_CT_F_FORCE: u16 = 2;

/// `max_len` meaning "send the whole packet, no buffering" (used for CONTROLLER outputs).
pub const OFPCML_NO_BUFFER: u16 = 0xffff;

/// A bit range of a field: `NXM_NX_REG0[]`, `NXM_NX_TUN_ID[0..31]`, `NXM_NX_REG7[31]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Subfield {
    field: NxmField,
    ofs: u16,
    n_bits: u16,
}

impl Subfield {
    /// The whole field (`[]`). A field wider than 64 bits (e.g. an IPv6 address) is cut to its
    /// low 64 bits, the widest range [`Subfield::new`] accepts and `ofs_nbits` can encode.
    pub fn whole(field: NxmField) -> Subfield {
        Subfield { field, ofs: 0, n_bits: field.bits().clamp(1, 64) }
    }

    /// Bits `start..=end` (`[start..end]`), or `None` if the range is empty or past the field.
    pub fn bits(field: NxmField, start: u16, end: u16) -> Option<Subfield> {
        let n_bits = end.checked_sub(start)?.checked_add(1)?;
        Subfield::new(field, start, n_bits)
    }

    /// `n_bits` bits starting at `ofs`, validated against the field's width and the 6-bit
    /// `n_bits - 1` encoding of `ofs_nbits`.
    pub fn new(field: NxmField, ofs: u16, n_bits: u16) -> Option<Subfield> {
        let end = ofs.checked_add(n_bits)?;
        ((1..=64).contains(&n_bits) && end <= field.bits() && ofs < 1024).then_some(Subfield { field, ofs, n_bits })
    }

    pub fn field(&self) -> NxmField {
        self.field
    }
    pub fn ofs(&self) -> u16 {
        self.ofs
    }
    pub fn n_bits(&self) -> u16 {
        self.n_bits
    }

    /// `(ofs << 6) | (n_bits - 1)`, as REG_LOAD and OUTPUT_REG encode a range.
    pub fn ofs_nbits(&self) -> u16 {
        (self.ofs << 6) | (self.n_bits - 1)
    }

    fn from_ofs_nbits(header: u32, v: u16) -> Option<Subfield> {
        Subfield::new(NxmField::from_header(header), v >> 6, (v & 0x3f) + 1)
    }

    /// True if this covers the whole field (prints as `[]`).
    pub fn is_whole(&self) -> bool {
        self.ofs == 0 && self.n_bits == self.field.bits()
    }
}

/// NXAST_REG_MOVE: copy `n_bits` bits from `src` at `src_ofs` to `dst` at `dst_ofs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegMove {
    src: Subfield,
    dst: Subfield,
}

impl RegMove {
    /// `None` if the two ranges differ in width.
    pub fn new(src: Subfield, dst: Subfield) -> Option<RegMove> {
        (src.n_bits == dst.n_bits).then_some(RegMove { src, dst })
    }
    pub fn src(&self) -> Subfield {
        self.src
    }
    pub fn dst(&self) -> Subfield {
        self.dst
    }
}

/// NXAST_NOTE bytes. Always a length OVS can round-trip: padded with zeros so that `10 + len`
/// is a multiple of 8 (OVS keeps the padding as part of the note: `note:00.03` is stored and
/// dumped as `note:00.03.00.00.00.00`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Note(Vec<u8>);

impl Note {
    /// Pads `bytes` as OVS pads a note.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Note {
        let mut v = bytes.into();
        let padded = pad8(10 + v.len()).max(16) - 10;
        v.resize(padded, 0);
        Note(v)
    }
    /// The note as stored (with padding).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
    /// True if the note starts with `prefix` (the seed's `NoteHasPrefix`).
    pub fn has_prefix(&self, prefix: &[u8]) -> bool {
        self.0.starts_with(prefix)
    }
}

/// OFPAT_SET_FIELD targets. Only the canonical forms OVS emits are typed; anything else (other
/// fields, NXM/OXM spellings OVS would not choose, masked headers) is kept as [`SetField::Other`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SetField {
    /// `set_field:A.B.C.D->tun_dst` (NXM_NX_TUN_IPV4_DST inside OFPAT_SET_FIELD).
    TunDst(Ipv4Addr),
    /// `set_field:A.B.C.D->tun_src`.
    TunSrc(Ipv4Addr),
    /// `set_field:fd00::1->tun_ipv6_dst` (NXM_NX_TUN_IPV6_DST: no OXM form).
    TunIpv6Dst(Ipv6Addr),
    /// `set_field:fd00::1->tun_ipv6_src` (NXM_NX_TUN_IPV6_SRC).
    TunIpv6Src(Ipv6Addr),
    /// `set_field:fd00::1->ipv6_src` (OXM_OF_IPV6_SRC; OVS requires an `ipv6` match).
    Ipv6Src(Ipv6Addr),
    /// `set_field:fd00::1->ipv6_dst` (OXM_OF_IPV6_DST; OVS requires an `ipv6` match).
    Ipv6Dst(Ipv6Addr),
    /// `set_field:N->tun_id` (OXM_OF_TUNNEL_ID).
    TunId(u64),
    /// `set_field:N->regK`.
    Reg(u8, u32),
    /// `set_field:N->ct_mark` (NXM_NX_CT_MARK; typically inside `ct(commit,exec(...))`).
    CtMark(u32),
    /// `set_field:XX:XX:XX:XX:XX:XX->eth_dst` (OXM_OF_ETH_DST).
    EthDst(MacAddr),
    Other(RawOxm),
}

const TUN_DST_HDR: u32 = field::header(CLASS_NXM1, field::NXM1_TUN_IPV4_DST, 4, false);
const TUN_SRC_HDR: u32 = field::header(CLASS_NXM1, field::NXM1_TUN_IPV4_SRC, 4, false);
const TUN_ID_HDR: u32 = field::header(CLASS_OPENFLOW_BASIC, field::OXM_TUNNEL_ID, 8, false);
const TUN_IPV6_DST_HDR: u32 = field::header(CLASS_NXM1, field::NXM1_TUN_IPV6_DST, 16, false);
const TUN_IPV6_SRC_HDR: u32 = field::header(CLASS_NXM1, field::NXM1_TUN_IPV6_SRC, 16, false);
const IPV6_SRC_HDR: u32 = field::header(CLASS_OPENFLOW_BASIC, field::OXM_IPV6_SRC, 16, false);
const IPV6_DST_HDR: u32 = field::header(CLASS_OPENFLOW_BASIC, field::OXM_IPV6_DST, 16, false);
const CT_MARK_HDR: u32 = field::header(CLASS_NXM1, field::NXM1_CT_MARK, 4, false);
const ETH_DST_HDR: u32 = field::header(CLASS_OPENFLOW_BASIC, field::OXM_ETH_DST, 6, false);

impl SetField {
    fn header(&self) -> u32 {
        match self {
            SetField::TunDst(_) => TUN_DST_HDR,
            SetField::TunSrc(_) => TUN_SRC_HDR,
            SetField::TunIpv6Dst(_) => TUN_IPV6_DST_HDR,
            SetField::TunIpv6Src(_) => TUN_IPV6_SRC_HDR,
            SetField::Ipv6Src(_) => IPV6_SRC_HDR,
            SetField::Ipv6Dst(_) => IPV6_DST_HDR,
            SetField::TunId(_) => TUN_ID_HDR,
            SetField::Reg(n, _) => NxmField::Reg(n & 15).header(),
            SetField::CtMark(_) => CT_MARK_HDR,
            SetField::EthDst(_) => ETH_DST_HDR,
            SetField::Other(r) => r.header,
        }
    }
    fn payload_len(&self) -> usize {
        match self {
            SetField::TunDst(_) | SetField::TunSrc(_) | SetField::Reg(..) | SetField::CtMark(_) => 4,
            SetField::TunId(_) => 8,
            SetField::EthDst(_) => 6,
            SetField::TunIpv6Dst(_) | SetField::TunIpv6Src(_) | SetField::Ipv6Src(_) | SetField::Ipv6Dst(_) => 16,
            SetField::Other(r) => r.payload.len(),
        }
    }
    fn put_payload(&self, buf: &mut impl BufMut) {
        match self {
            SetField::TunDst(a) | SetField::TunSrc(a) => buf.put_slice(&a.octets()),
            SetField::TunId(v) => buf.put_u64(*v),
            SetField::Reg(_, v) | SetField::CtMark(v) => buf.put_u32(*v),
            SetField::EthDst(m) => buf.put_slice(&m.0),
            SetField::TunIpv6Dst(a) | SetField::TunIpv6Src(a) | SetField::Ipv6Src(a) | SetField::Ipv6Dst(a) => {
                buf.put_slice(&a.octets())
            }
            SetField::Other(r) => buf.put_slice(&r.payload),
        }
    }
    fn from_raw(header: u32, payload: &[u8]) -> SetField {
        let mut r = Reader::new(payload, "set_field");
        let typed = match NxmField::from_header(header) {
            _ if header == TUN_ID_HDR => r.u64().ok().map(SetField::TunId),
            _ if header == CT_MARK_HDR => r.u32().ok().map(SetField::CtMark),
            _ if header == ETH_DST_HDR => r.array::<6>().ok().map(|a| SetField::EthDst(MacAddr(a))),
            _ if header == IPV6_SRC_HDR => r.array::<16>().ok().map(|a| SetField::Ipv6Src(a.into())),
            _ if header == IPV6_DST_HDR => r.array::<16>().ok().map(|a| SetField::Ipv6Dst(a.into())),
            NxmField::TunIpv6Dst => r.array::<16>().ok().map(|a| SetField::TunIpv6Dst(a.into())),
            NxmField::TunIpv6Src => r.array::<16>().ok().map(|a| SetField::TunIpv6Src(a.into())),
            NxmField::TunIpv4Dst => r.array::<4>().ok().map(|a| SetField::TunDst(a.into())),
            NxmField::TunIpv4Src => r.array::<4>().ok().map(|a| SetField::TunSrc(a.into())),
            NxmField::Reg(n) => r.u32().ok().map(|v| SetField::Reg(n, v)),
            _ => None,
        };
        typed.unwrap_or_else(|| SetField::Other(RawOxm { header, payload: Bytes::copy_from_slice(payload) }))
    }
}

/// Where NXAST_CT takes the conntrack zone from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtZone {
    /// An immediate zone (`zone=5`); 0 is the default zone and is not printed.
    Imm(u16),
    /// A 16-bit field range (`zone=NXM_NX_REG0[0..15]`); OVS requires exactly 16 bits.
    Field(Subfield),
}

/// NXAST_CT: send the packet through the connection tracker (`ct(commit,table=30)`).
///
/// Nested actions (`exec(...)`) are decoded like any action list; one nested NXAST_CT is kept
/// raw rather than decoded recursively (OVS rejects nested `ct` anyway), so decoding depth is
/// bounded whatever the input.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ct {
    /// [`NX_CT_F_COMMIT`], [`NX_CT_F_FORCE`]; other bits are kept as received.
    pub flags: u16,
    pub zone: CtZone,
    /// Table to recirculate to, or [`NX_CT_RECIRC_NONE`].
    pub recirc_table: u8,
    /// Application-layer gateway: the well-known port (21 = `alg=ftp`, 69 = `alg=tftp`), 0 = none.
    pub alg: u16,
    /// Actions executed in the conntrack context (`exec(set_field:1->ct_mark)`).
    pub actions: Vec<Action>,
}

impl Ct {
    /// `ct()` with no flags, zone 0, no recirculation, no ALG, no nested actions.
    pub fn new() -> Ct {
        Ct { flags: 0, zone: CtZone::Imm(0), recirc_table: NX_CT_RECIRC_NONE, alg: 0, actions: Vec::new() }
    }
    /// Builder: sets `commit`.
    pub fn commit(mut self) -> Ct {
        self.flags |= NX_CT_F_COMMIT;
        self
    }
    /// Builder: `table=N` (recirculate to table N after conntrack).
    pub fn table(mut self, t: u8) -> Ct {
        self.recirc_table = t;
        self
    }
    /// Builder: the zone.
    pub fn zone(mut self, z: CtZone) -> Ct {
        self.zone = z;
        self
    }
    /// Builder: nested `exec(...)` actions.
    pub fn exec(mut self, actions: Vec<Action>) -> Ct {
        self.actions = actions;
        self
    }
}

impl Default for Ct {
    fn default() -> Ct {
        Ct::new()
    }
}

/// The fewest clauses a conjunction may have (OVS: `decode_NXAST_RAW_CONJUNCTION` answers
/// NXBAC_BAD_CONJUNCTION below it; one clause would just be an ordinary flow).
pub const CONJUNCTION_MIN_CLAUSES: u8 = 2;
/// The most clauses a conjunction may have (OVS's classifier tracks the clauses that matched in
/// a 64-bit map, so it refuses more).
pub const CONJUNCTION_MAX_CLAUSES: u8 = 64;

/// NXAST_CONJUNCTION: `conjunction(id,k/n)`, this flow is clause `k` of the `n` clauses of
/// conjunctive match `id`. When a packet matches one flow of every clause of `id` (at the same
/// priority, in the same table), the flow matching `conj_id=id` is executed instead
/// ([`Match::conj_id`](crate::Match::conj_id)).
///
/// Always a value OVS accepts: `2 <= n <= 64` and `1 <= k <= n` (private fields, checked by
/// [`Conjunction::new`]). A received action outside those limits, which OVS refuses with
/// NXBAC_BAD_CONJUNCTION, is kept as [`Action::Unknown`] like every other Nicira action this
/// crate cannot type, so decoding never fails or loses bytes because of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conjunction {
    id: u32,
    /// 0-based, as on the wire.
    clause: u8,
    n_clauses: u8,
}

impl Conjunction {
    /// `conjunction(id,k/n)` with `k` 1-based as in the text form (clause `k` is sent as
    /// `k - 1`). `None` unless `2 <= n <= 64` and `1 <= k <= n`.
    pub fn new(id: u32, k: u8, n: u8) -> Option<Conjunction> {
        Conjunction::from_wire(id, k.checked_sub(1)?, n)
    }

    /// From the wire's 0-based clause, with OVS's decode checks.
    fn from_wire(id: u32, clause: u8, n_clauses: u8) -> Option<Conjunction> {
        ((CONJUNCTION_MIN_CLAUSES..=CONJUNCTION_MAX_CLAUSES).contains(&n_clauses) && clause < n_clauses)
            .then_some(Conjunction { id, clause, n_clauses })
    }

    /// The conjunction id (matched by `conj_id=`).
    pub fn id(&self) -> u32 {
        self.id
    }
    /// The clause `k`, 1-based as printed (`conjunction(id,k/n)`).
    pub fn clause(&self) -> u8 {
        self.clause + 1
    }
    /// The clause as sent on the wire (0-based, `k - 1`).
    pub fn wire_clause(&self) -> u8 {
        self.clause
    }
    /// The number of clauses `n`.
    pub fn n_clauses(&self) -> u8 {
        self.n_clauses
    }
}

/// An action.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// OFPAT_OUTPUT. `max_len` only matters for CONTROLLER.
    Output { port: PortNo, max_len: u16 },
    /// OFPAT_SET_FIELD.
    SetField(SetField),
    /// NXAST_REG_LOAD: `load:value->dst`. `value` is right-aligned (bit 0 of value goes to
    /// `dst.ofs`).
    RegLoad { dst: Subfield, value: u64 },
    /// NXAST_REG_MOVE: `move:src->dst`.
    RegMove(RegMove),
    /// NXAST_OUTPUT_REG: `output:NXM_NX_REG2[]`.
    OutputReg { src: Subfield, max_len: u16 },
    /// NXAST_NOTE.
    Note(Note),
    /// NXAST_RESUBMIT_TABLE: `resubmit(port,table)`; port 0xfff8 (IN_PORT) means unchanged,
    /// table 255 means "this table". Ports are 16-bit ([`PortNo::from_ofp10`]).
    ResubmitTable { in_port: u16, table: u8 },
    /// NXAST_RESUBMIT (no table): `resubmit:N`, what ovs-ofctl sends for `resubmit:N`.
    Resubmit { in_port: u16 },
    /// NXAST_CT: `ct(...)`.
    Ct(Ct),
    /// NXAST_CONJUNCTION: `conjunction(id,k/n)`. OVS accepts it only in a flow whose actions
    /// are all `conjunction` or `note` (see [`accept`](crate::accept)).
    Conjunction(Conjunction),
    /// NXAST_CONTROLLER / NXAST_CONTROLLER2: `controller(...)` (see [`crate::controller`]).
    Controller(Controller),
    /// Any other action, whole (type, length and body), re-encoded verbatim.
    Unknown(Bytes),
}

impl Action {
    /// `output:N` as ovs-ofctl encodes it (max_len 0, or 0xffff for CONTROLLER).
    pub fn output(port: impl Into<PortNo>) -> Action {
        let port = port.into();
        let max_len = if port == PortNo::CONTROLLER { OFPCML_NO_BUFFER } else { 0 };
        Action::Output { port, max_len }
    }

    /// `load:value->NXM_NX_REGn[]`.
    pub fn load_reg(n: u8, value: u32) -> Action {
        Action::RegLoad { dst: Subfield::whole(NxmField::Reg(n & 15)), value: value as u64 }
    }

    /// `output:NXM_NX_REGn[]` (max_len 0xffff, as ovs-ofctl writes it).
    pub fn output_reg(n: u8) -> Action {
        Action::OutputReg { src: Subfield::whole(NxmField::Reg(n & 15)), max_len: OFPCML_NO_BUFFER }
    }

    /// `note:...` with OVS's padding.
    pub fn note(bytes: impl Into<Vec<u8>>) -> Action {
        Action::Note(Note::new(bytes))
    }

    /// `conjunction(id,k/n)`, `k` 1-based; `None` unless `2 <= n <= 64` and `1 <= k <= n`.
    pub fn conjunction(id: u32, k: u8, n: u8) -> Option<Action> {
        Conjunction::new(id, k, n).map(Action::Conjunction)
    }

    /// Encoded length in bytes (always a multiple of 8).
    pub fn encoded_len(&self) -> usize {
        match self {
            Action::Output { .. } | Action::ResubmitTable { .. } | Action::Resubmit { .. } | Action::Conjunction(_) => 16,
            Action::Ct(ct) => 24 + actions_len(&ct.actions),
            Action::SetField(sf) => pad8(8 + sf.payload_len()),
            Action::RegLoad { .. } | Action::OutputReg { .. } => 24,
            Action::RegMove(m) => pad8(16 + hdr_len(m.src.field) + hdr_len(m.dst.field)),
            Action::Note(n) => 10 + n.0.len(),
            Action::Controller(c) => c.encoded_len(),
            Action::Unknown(b) => b.len(),
        }
    }

    pub fn encode(&self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        let len = self.encoded_len();
        let len16 = len_u16("action", len)?;
        match self {
            Action::Output { port, max_len } => {
                buf.put_u16(OFPAT_OUTPUT);
                buf.put_u16(16);
                buf.put_u32(port.0);
                buf.put_u16(*max_len);
                buf.put_bytes(0, 6);
            }
            Action::SetField(sf) => {
                buf.put_u16(OFPAT_SET_FIELD);
                buf.put_u16(len16);
                buf.put_u32(sf.header());
                sf.put_payload(buf);
                buf.put_bytes(0, len - 8 - sf.payload_len());
            }
            Action::RegLoad { dst, value } => {
                nx_header(buf, 24, NXAST_REG_LOAD);
                buf.put_u16(dst.ofs_nbits());
                buf.put_u32(dst.field.header());
                buf.put_u64(*value);
            }
            Action::RegMove(m) => {
                nx_header(buf, len16, NXAST_REG_MOVE);
                buf.put_u16(m.src.n_bits);
                buf.put_u16(m.src.ofs);
                buf.put_u16(m.dst.ofs);
                put_hdr(buf, m.src.field);
                put_hdr(buf, m.dst.field);
                buf.put_bytes(0, len - 16 - hdr_len(m.src.field) - hdr_len(m.dst.field));
            }
            Action::OutputReg { src, max_len } => {
                nx_header(buf, 24, NXAST_OUTPUT_REG);
                buf.put_u16(src.ofs_nbits());
                buf.put_u32(src.field.header());
                buf.put_u16(*max_len);
                buf.put_bytes(0, 6);
            }
            Action::Note(n) => {
                nx_header(buf, len16, NXAST_NOTE);
                buf.put_slice(&n.0);
            }
            Action::ResubmitTable { in_port, table } => {
                nx_header(buf, 16, NXAST_RESUBMIT_TABLE);
                buf.put_u16(*in_port);
                buf.put_u8(*table);
                buf.put_bytes(0, 3);
            }
            Action::Resubmit { in_port } => {
                nx_header(buf, 16, NXAST_RESUBMIT);
                buf.put_u16(*in_port);
                buf.put_bytes(0, 4);
            }
            Action::Ct(ct) => {
                nx_header(buf, len16, NXAST_CT);
                buf.put_u16(ct.flags);
                match ct.zone {
                    CtZone::Imm(z) => {
                        buf.put_u32(0);
                        buf.put_u16(z);
                    }
                    CtZone::Field(sf) => {
                        buf.put_u32(sf.field.header());
                        buf.put_u16(sf.ofs_nbits());
                    }
                }
                buf.put_u8(ct.recirc_table);
                buf.put_bytes(0, 3);
                buf.put_u16(ct.alg);
                for a in &ct.actions {
                    a.encode(buf)?;
                }
            }
            Action::Conjunction(c) => {
                nx_header(buf, 16, NXAST_CONJUNCTION);
                buf.put_u8(c.clause);
                buf.put_u8(c.n_clauses);
                buf.put_u32(c.id);
            }
            Action::Controller(c) => c.encode(buf, len16),
            Action::Unknown(b) => buf.put_slice(b),
        }
        Ok(())
    }

    /// Decodes one action; `r` must be positioned at its `type` field.
    pub fn decode(r: &mut Reader<'_>) -> Result<Action, DecodeError> {
        Action::decode_in(r, false)
    }

    /// `nested`: inside a `ct(...)`, where a further NXAST_CT is kept raw (bounded recursion).
    fn decode_in(r: &mut Reader<'_>, nested: bool) -> Result<Action, DecodeError> {
        let head = r.rest();
        let mut h = Reader::new(head, "action header");
        let typ = h.u16()?;
        let len = h.u16()? as usize;
        check_len8("action", len, 8, head.len())?;
        let raw = r.bytes(len)?;
        let mut b = Reader::new(&raw[4..], "action");
        Ok(match typ {
            OFPAT_OUTPUT => {
                if len != 16 {
                    return Err(DecodeError::BadLength { what: "OFPAT_OUTPUT", len });
                }
                let port = PortNo(b.u32()?);
                let max_len = b.u16()?;
                // Non-zero padding would be lost by the typed form: keep such an action raw.
                if b.rest().iter().any(|&x| x != 0) {
                    return Ok(unknown(raw));
                }
                Action::Output { port, max_len }
            }
            OFPAT_SET_FIELD => {
                let hdr = b.u32()?;
                let (_, _, _, plen) = field::split(hdr);
                let payload = b.bytes(plen as usize)?;
                Action::SetField(SetField::from_raw(hdr, payload))
            }
            OFPAT_EXPERIMENTER if len >= 16 => decode_nx(raw, &mut b, nested)?.unwrap_or_else(|| unknown(raw)),
            _ => unknown(raw),
        })
    }
}

fn unknown(raw: &[u8]) -> Action {
    Action::Unknown(Bytes::copy_from_slice(raw))
}

/// Length of a field header inside REG_MOVE (experimenter OXMs carry 4 more bytes).
fn hdr_len(f: NxmField) -> usize {
    if field::split(f.header()).0 == field::CLASS_EXPERIMENTER {
        8
    } else {
        4
    }
}

fn put_hdr(buf: &mut impl BufMut, f: NxmField) {
    buf.put_u32(f.header());
    if hdr_len(f) == 8 {
        // Experimenter OXMs as move operands are kept opaque: the experimenter id is not modelled.
        buf.put_u32(0);
    }
}

fn nx_header(buf: &mut impl BufMut, len: u16, subtype: u16) {
    buf.put_u16(OFPAT_EXPERIMENTER);
    buf.put_u16(len);
    buf.put_u32(NX_VENDOR_ID);
    buf.put_u16(subtype);
}

/// Decodes a Nicira action; `Ok(None)` means "keep it as Unknown" (another vendor, another
/// subtype, or a shape this crate does not model, such as experimenter-OXM operands).
fn decode_nx(raw: &[u8], b: &mut Reader<'_>, nested: bool) -> Result<Option<Action>, DecodeError> {
    let len = raw.len();
    if b.u32()? != NX_VENDOR_ID {
        return Ok(None);
    }
    let subtype = b.u16()?;
    let a = match subtype {
        NXAST_REG_LOAD if len == 24 => {
            let ofs_nbits = b.u16()?;
            let dst = b.u32()?;
            let value = b.u64()?;
            Subfield::from_ofs_nbits(dst, ofs_nbits).map(|dst| Action::RegLoad { dst, value })
        }
        NXAST_OUTPUT_REG if len == 24 => {
            let ofs_nbits = b.u16()?;
            let src = b.u32()?;
            let max_len = b.u16()?;
            Subfield::from_ofs_nbits(src, ofs_nbits).map(|src| Action::OutputReg { src, max_len })
        }
        NXAST_REG_MOVE if len == 24 => {
            let n_bits = b.u16()?;
            let src_ofs = b.u16()?;
            let dst_ofs = b.u16()?;
            let src = NxmField::from_header(b.u32()?);
            let dst = NxmField::from_header(b.u32()?);
            if hdr_len(src) != 4 || hdr_len(dst) != 4 {
                return Ok(None);
            }
            Subfield::new(src, src_ofs, n_bits)
                .zip(Subfield::new(dst, dst_ofs, n_bits))
                .and_then(|(s, d)| RegMove::new(s, d))
                .map(Action::RegMove)
        }
        NXAST_NOTE => Some(Action::Note(Note(b.rest().to_vec()))),
        NXAST_RESUBMIT_TABLE if len == 16 => {
            let in_port = b.u16()?;
            let table = b.u8()?;
            all_zero(b.rest()).then_some(Action::ResubmitTable { in_port, table })
        }
        NXAST_RESUBMIT if len == 16 => {
            let in_port = b.u16()?;
            all_zero(b.rest()).then_some(Action::Resubmit { in_port })
        }
        // Fixed 16 bytes, no padding (OVS: OFPBAC_BAD_LEN for any other length).
        NXAST_CONJUNCTION if len == 16 => {
            let clause = b.u8()?;
            let n_clauses = b.u8()?;
            let id = b.u32()?;
            Conjunction::from_wire(id, clause, n_clauses).map(Action::Conjunction)
        }
        NXAST_CT if len >= 24 && !nested => {
            let flags = b.u16()?;
            let zone_src = b.u32()?;
            let zone_v = b.u16()?;
            let recirc_table = b.u8()?;
            let pad = b.bytes(3)?;
            let alg = b.u16()?;
            let zone = if zone_src == 0 {
                Some(CtZone::Imm(zone_v))
            } else {
                Subfield::from_ofs_nbits(zone_src, zone_v).map(CtZone::Field)
            };
            // Nested actions that do not decode, or padding the typed form would drop: raw.
            let mut inner = Reader::new(b.rest(), "ct actions");
            let mut actions = Vec::new();
            let mut ok = all_zero(pad);
            while ok && !inner.is_empty() {
                match Action::decode_in(&mut inner, true) {
                    Ok(a) => actions.push(a),
                    Err(_) => ok = false,
                }
            }
            zone.filter(|_| ok).map(|zone| Action::Ct(Ct { flags, zone, recirc_table, alg, actions }))
        }
        NXAST_CONTROLLER if len == 16 => Controller::decode_v1(b)?.map(Action::Controller),
        NXAST_CONTROLLER2 => Controller::decode_v2(b)?.map(Action::Controller),
        _ => None,
    };
    // The typed form must give back exactly the bytes received (property order, explicit
    // defaults): otherwise the action is kept raw.
    if let Some(Action::Controller(c)) = &a {
        let mut again = Vec::with_capacity(len);
        c.encode(&mut again, len as u16);
        if c.encoded_len() != len || again != raw {
            return Ok(None);
        }
    }
    Ok(a)
}

fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// Decodes a list of actions filling `buf` exactly.
pub fn decode_actions(buf: &[u8]) -> Result<Vec<Action>, DecodeError> {
    let mut r = Reader::new(buf, "action list");
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(Action::decode(&mut r)?);
    }
    Ok(out)
}

/// Total encoded length of a list of actions.
pub fn actions_len(actions: &[Action]) -> usize {
    actions.iter().map(Action::encoded_len).sum()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::hex;

    /// An action's encoding, checked against its `encoded_len` (shared by the action tests).
    pub(crate) fn enc(a: &Action) -> Vec<u8> {
        let mut b = Vec::new();
        a.encode(&mut b).unwrap();
        assert_eq!(b.len(), a.encoded_len());
        b
    }

    /// Each vector is what ovs-ofctl 3.1 put on the wire (reference §8), annotated.
    #[test]
    fn vectors() {
        let tun_id_lo = Subfield::bits(NxmField::TunId, 0, 31).unwrap();
        let cases: Vec<(Action, &str)> = vec![
            // OUTPUT | len 16 | port 2 | max_len 0 | pad
            (Action::output(2), "0000 0010 00000002 0000 000000000000"),
            (Action::output(PortNo::CONTROLLER), "0000 0010 fffffffd ffff 000000000000"),
            // SET_FIELD | len 16 | NXM_NX_TUN_IPV4_DST | 192.168.1.2 | pad
            (Action::SetField(SetField::TunDst(Ipv4Addr::new(192, 168, 1, 2))), "0019 0010 00014004 c0a80102 00000000"),
            (Action::SetField(SetField::TunId(0x64)), "0019 0010 80004c08 0000000000000064"),
            (Action::SetField(SetField::Reg(15, 5)), "0019 0010 00011e04 00000005 00000000"),
            // SET_FIELD | len 16 | OXM_OF_ETH_DST | 0a:58:0a:80:00:01 | pad
            (Action::SetField(SetField::EthDst(MacAddr([0x0a, 0x58, 0x0a, 0x80, 0, 1]))), "0019 0010 80000606 0a580a800001 0000"),
            // NX | len 24 | vendor | REG_MOVE | n_bits 32 | src_ofs 0 | dst_ofs 0 | TUN_ID | REG0
            (
                Action::RegMove(RegMove::new(tun_id_lo, Subfield::whole(NxmField::Reg(0))).unwrap()),
                "ffff 0018 00002320 0006 0020 0000 0000 00012008 00010004",
            ),
            (
                Action::RegMove(
                    RegMove::new(Subfield::bits(NxmField::Reg(0), 0, 15).unwrap(), Subfield::bits(NxmField::TunId, 16, 31).unwrap())
                        .unwrap(),
                ),
                "ffff 0018 00002320 0006 0010 0000 0010 00010004 00012008",
            ),
            // NX | REG_LOAD | ofs_nbits 0x1f | REG0 | value 5
            (Action::load_reg(0, 5), "ffff 0018 00002320 0007 001f 00010004 0000000000000005"),
            (
                Action::RegLoad { dst: Subfield::bits(NxmField::Reg(7), 31, 31).unwrap(), value: 1 },
                "ffff 0018 00002320 0007 07c0 00010e04 0000000000000001",
            ),
            (
                Action::RegLoad { dst: Subfield::whole(NxmField::TunId), value: 0x64 },
                "ffff 0018 00002320 0007 003f 00012008 0000000000000064",
            ),
            // NX | OUTPUT_REG | ofs_nbits 0x1f | REG2 | max_len 0xffff | zero
            (Action::output_reg(2), "ffff 0018 00002320 000f 001f 00010404 ffff 000000000000"),
            // NX | NOTE | 00 03 + 4 bytes padding that become part of the note
            (Action::note([0, 3]), "ffff 0010 00002320 0008 0003 00000000"),
            (Action::note(vec![]), "ffff 0010 00002320 0008 000000000000"),
            (
                Action::note([1, 2, 3, 4, 5, 6, 7]),
                "ffff 0018 00002320 0008 01020304050607 00000000000000",
            ),
            (Action::ResubmitTable { in_port: 0xfff8, table: 3 }, "ffff 0010 00002320 000e fff8 03 000000"),
            // NX | CONJUNCTION | clause 0 (printed 1) | n_clauses 2 | id 5
            (Action::conjunction(5, 1, 2).unwrap(), "ffff 0010 00002320 0022 00 02 00000005"),
            (Action::conjunction(0x4000_000a, 64, 64).unwrap(), "ffff 0010 00002320 0022 3f 40 4000000a"),
        ];
        for (a, want) in cases {
            let want = hex(want);
            assert_eq!(enc(&a), want, "{a:?}");
            let back = Action::decode(&mut Reader::new(&want, "t")).unwrap();
            assert_eq!(back, a);
        }
    }

    #[test]
    fn note_padding() {
        assert_eq!(Note::new([0, 3]).bytes(), &[0, 3, 0, 0, 0, 0]);
        assert_eq!(Note::new(vec![0; 32]).bytes().len(), 38);
        assert!(Note::new([0xab; 32]).has_prefix(&[0xab; 32]));
    }

    #[test]
    fn unknown_actions_round_trip() {
        for v in [
            "0011 0008 8100 0000",                          // PUSH_VLAN
            "ffff 0010 00002320 0027 0002 00000080",        // NXAST_OUTPUT_TRUNC
            "ffff 0010 12345678 0001 000000000000",         // another vendor
            "ffff 0018 00002320 0007 07ff 00010e04 0000000000000001", // REG_LOAD past the field
        ] {
            let want = hex(v);
            let a = Action::decode(&mut Reader::new(&want, "t")).unwrap();
            assert!(matches!(a, Action::Unknown(_)), "{v}: {a:?}");
            assert_eq!(enc(&a), want);
        }
    }

    /// What OVS 3.1 refuses with NXBAC_BAD_CONJUNCTION (n < 2, n > 64, clause >= n) or
    /// OFPBAC_BAD_LEN (not 16 bytes) is kept raw, byte for byte, and cannot be built typed.
    #[test]
    fn invalid_conjunctions_are_kept_raw() {
        for v in [
            "ffff 0010 00002320 0022 00 01 00000005", // 1/1
            "ffff 0010 00002320 0022 00 41 00000005", // 1/65
            "ffff 0010 00002320 0022 02 02 00000005", // 3/2
            "ffff 0010 00002320 0022 ff 02 00000005", // 0/2 (clause -1)
            "ffff 0010 00002320 0022 00 00 00000005", // no clauses
            "ffff 0018 00002320 0022 00 02 00000005 0000000000000000", // 24 bytes
        ] {
            let want = hex(v);
            let a = Action::decode(&mut Reader::new(&want, "t")).unwrap();
            assert!(matches!(a, Action::Unknown(_)), "{v}: {a:?}");
            assert_eq!(enc(&a), want);
        }
        for (k, n) in [(1, 1), (1, 65), (0, 2), (3, 2), (0, 0), (255, 255)] {
            assert!(Action::conjunction(1, k, n).is_none(), "{k}/{n}");
        }
        let c = Conjunction::new(7, 2, 3).unwrap();
        assert_eq!((c.id(), c.clause(), c.wire_clause(), c.n_clauses()), (7, 2, 1, 3));
    }

    #[test]
    fn bad_lengths_are_errors() {
        for v in ["0000 0010 0000", "0000 000c 00000002 0000 0000", "0000 0000 00000000", "0000 0018 00000002 0000 000000000000"] {
            assert!(Action::decode(&mut Reader::new(&hex(v), "t")).is_err(), "{v}");
        }
    }

    #[test]
    fn subfield_validation() {
        assert!(Subfield::bits(NxmField::Reg(0), 0, 32).is_none());
        assert!(Subfield::bits(NxmField::Reg(0), 5, 4).is_none());
        assert_eq!(Subfield::bits(NxmField::TunId, 0, 63).unwrap(), Subfield::whole(NxmField::TunId));
        assert!(RegMove::new(Subfield::whole(NxmField::TunId), Subfield::whole(NxmField::Reg(0))).is_none());
    }

    /// Regression (found by openflow/tests/roundtrip.rs): `whole` of a 128-bit field had
    /// n_bits 128, which the 6-bit `n_bits - 1` of REG_LOAD silently turned into `[1..64]`.
    #[test]
    fn whole_of_a_wide_field_stays_encodable() {
        let ipv6_src = NxmField::Other(field::header(CLASS_OPENFLOW_BASIC, 26, 16, false));
        let whole = Subfield::whole(ipv6_src);
        assert_eq!(Some(whole), Subfield::new(ipv6_src, 0, 64));
        let a = Action::RegLoad { dst: whole, value: 1 };
        assert_eq!(Action::decode(&mut Reader::new(&enc(&a), "t")).unwrap(), a);
    }
}
