//! OXM/NXM field headers: `class u16 | field u7 | hasmask u1 | length u8`.
//!
//! OVS 3.1 accepts both the NXM form (classes 0x0000/0x0001) and the OXM form (class 0x8000) of a
//! field in an OpenFlow 1.3 match, and always answers with the OXM form where the field has one.
//! Nicira actions (REG_LOAD, REG_MOVE, OUTPUT_REG) name fields by their NXM header.

use std::fmt;

/// NXM class 0 (`NXM_OF_*`).
pub const CLASS_NXM0: u16 = 0x0000;
/// NXM class 1 (`NXM_NX_*`).
pub const CLASS_NXM1: u16 = 0x0001;
/// OpenFlow basic class.
pub const CLASS_OPENFLOW_BASIC: u16 = 0x8000;
/// Experimenter class: a 4-byte experimenter id follows the header and counts in `length`.
pub const CLASS_EXPERIMENTER: u16 = 0xffff;

/// Builds an OXM/NXM header. `len` is the payload length without a mask.
pub const fn header(class: u16, field: u8, len: u8, hasmask: bool) -> u32 {
    let len = if hasmask { len * 2 } else { len };
    ((class as u32) << 16) | ((field as u32) << 9) | ((hasmask as u32) << 8) | len as u32
}

/// Splits a header into (class, field, hasmask, length).
pub const fn split(h: u32) -> (u16, u8, bool, u8) {
    ((h >> 16) as u16, ((h >> 9) & 0x7f) as u8, (h >> 8) & 1 == 1, h as u8)
}

// OXM_OF_* (class 0x8000) field numbers used by the pipeline.
pub const OXM_IN_PORT: u8 = 0;
pub const OXM_ETH_DST: u8 = 3;
pub const OXM_ETH_TYPE: u8 = 5;
pub const OXM_IP_PROTO: u8 = 10;
pub const OXM_IPV4_SRC: u8 = 11;
pub const OXM_IPV4_DST: u8 = 12;
pub const OXM_TCP_DST: u8 = 14;
pub const OXM_UDP_DST: u8 = 16;
pub const OXM_SCTP_DST: u8 = 18;
pub const OXM_ARP_OP: u8 = 21;
pub const OXM_ARP_SPA: u8 = 22;
pub const OXM_ARP_TPA: u8 = 23;
pub const OXM_ARP_SHA: u8 = 24;
pub const OXM_ARP_THA: u8 = 25;
pub const OXM_IPV6_SRC: u8 = 26;
pub const OXM_IPV6_DST: u8 = 27;
/// OXM_OF_IPV6_FLABEL: 32 bits on the wire, of which the low 20 are the flow label.
pub const OXM_IPV6_FLABEL: u8 = 28;
pub const OXM_ICMPV6_TYPE: u8 = 29;
pub const OXM_ICMPV6_CODE: u8 = 30;
pub const OXM_IPV6_ND_TARGET: u8 = 31;
pub const OXM_IPV6_ND_SLL: u8 = 32;
pub const OXM_IPV6_ND_TLL: u8 = 33;
pub const OXM_TUNNEL_ID: u8 = 38;

// NXM_OF_* (class 0) numbers: the older names of the same fields.
pub const NXM0_IN_PORT: u8 = 0;
pub const NXM0_ETH_TYPE: u8 = 3;
pub const NXM0_IP_PROTO: u8 = 6;
pub const NXM0_IP_SRC: u8 = 7;
pub const NXM0_IP_DST: u8 = 8;
pub const NXM0_TCP_DST: u8 = 10;
pub const NXM0_UDP_DST: u8 = 12;
pub const NXM0_ARP_OP: u8 = 15;
pub const NXM0_ARP_SPA: u8 = 16;
pub const NXM0_ARP_TPA: u8 = 17;

// NXM_NX_* (class 1) numbers.
pub const NXM1_TUN_ID: u8 = 16;
pub const NXM1_ARP_SHA: u8 = 17;
pub const NXM1_ARP_THA: u8 = 18;
pub const NXM1_IPV6_SRC: u8 = 19;
pub const NXM1_IPV6_DST: u8 = 20;
pub const NXM1_ICMPV6_TYPE: u8 = 21;
pub const NXM1_ICMPV6_CODE: u8 = 22;
pub const NXM1_ND_TARGET: u8 = 23;
pub const NXM1_ND_SLL: u8 = 24;
pub const NXM1_ND_TLL: u8 = 25;
pub const NXM1_IP_FRAG: u8 = 26;
pub const NXM1_IPV6_LABEL: u8 = 27;
pub const NXM1_TUN_IPV4_SRC: u8 = 31;
pub const NXM1_TUN_IPV4_DST: u8 = 32;
/// NXM_NX_CONJ_ID (32 bits, not maskable, no OXM form): OVS's meta-flow.h `NXM_NX_CONJ_ID(37)`,
/// header 0x00014a04 (checked with `ovs-ofctl parse-nxm`).
pub const NXM1_CONJ_ID: u8 = 37;
pub const NXM1_CT_STATE: u8 = 105;
pub const NXM1_CT_ZONE: u8 = 106;
pub const NXM1_CT_MARK: u8 = 107;
pub const NXM1_CT_LABEL: u8 = 108;
/// NXM_NX_TUN_IPV6_SRC/DST (128 bits, maskable, no OXM form): meta-flow.h `NXM_NX_TUN_IPV6_SRC(109)`.
pub const NXM1_TUN_IPV6_SRC: u8 = 109;
pub const NXM1_TUN_IPV6_DST: u8 = 110;

/// A field named by its NXM header, as Nicira actions (load/move/output-reg) and OVS's
/// `NXM_NX_REG0[0..15]` text name it. Headers are stored without the mask bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NxmField {
    /// `NXM_NX_REG0` .. `NXM_NX_REG15` (32 bits).
    Reg(u8),
    /// `NXM_NX_TUN_ID` (64 bits).
    TunId,
    /// `NXM_NX_TUN_IPV4_SRC` (32 bits).
    TunIpv4Src,
    /// `NXM_NX_TUN_IPV4_DST` (32 bits).
    TunIpv4Dst,
    /// `NXM_NX_TUN_IPV6_SRC` (128 bits).
    TunIpv6Src,
    /// `NXM_NX_TUN_IPV6_DST` (128 bits).
    TunIpv6Dst,
    /// `NXM_NX_IPV6_SRC` (128 bits), by its NXM header as OVS writes it in move/load actions.
    Ipv6Src,
    /// `NXM_NX_IPV6_DST` (128 bits).
    Ipv6Dst,
    /// Any other field, by its unmasked header.
    Other(u32),
}

impl NxmField {
    /// The unmasked NXM header for this field.
    pub fn header(self) -> u32 {
        match self {
            NxmField::Reg(n) => header(CLASS_NXM1, n & 0x0f, 4, false),
            NxmField::TunId => header(CLASS_NXM1, NXM1_TUN_ID, 8, false),
            NxmField::TunIpv4Src => header(CLASS_NXM1, NXM1_TUN_IPV4_SRC, 4, false),
            NxmField::TunIpv4Dst => header(CLASS_NXM1, NXM1_TUN_IPV4_DST, 4, false),
            NxmField::TunIpv6Src => header(CLASS_NXM1, NXM1_TUN_IPV6_SRC, 16, false),
            NxmField::TunIpv6Dst => header(CLASS_NXM1, NXM1_TUN_IPV6_DST, 16, false),
            NxmField::Ipv6Src => header(CLASS_NXM1, NXM1_IPV6_SRC, 16, false),
            NxmField::Ipv6Dst => header(CLASS_NXM1, NXM1_IPV6_DST, 16, false),
            NxmField::Other(h) => h,
        }
    }

    /// Classifies an unmasked header; anything else (including a masked header) is `Other`.
    pub fn from_header(h: u32) -> NxmField {
        let (class, field, hasmask, len) = split(h);
        if hasmask {
            return NxmField::Other(h);
        }
        match (class, field, len) {
            (CLASS_NXM1, n @ 0..=15, 4) => NxmField::Reg(n),
            (CLASS_NXM1, NXM1_TUN_ID, 8) => NxmField::TunId,
            (CLASS_NXM1, NXM1_TUN_IPV4_SRC, 4) => NxmField::TunIpv4Src,
            (CLASS_NXM1, NXM1_TUN_IPV4_DST, 4) => NxmField::TunIpv4Dst,
            (CLASS_NXM1, NXM1_TUN_IPV6_SRC, 16) => NxmField::TunIpv6Src,
            (CLASS_NXM1, NXM1_TUN_IPV6_DST, 16) => NxmField::TunIpv6Dst,
            (CLASS_NXM1, NXM1_IPV6_SRC, 16) => NxmField::Ipv6Src,
            (CLASS_NXM1, NXM1_IPV6_DST, 16) => NxmField::Ipv6Dst,
            _ => NxmField::Other(h),
        }
    }

    /// Width of the field in bits (for `Other`, the header's payload length).
    pub fn bits(self) -> u16 {
        let (class, _, _, len) = split(self.header());
        let payload = if class == CLASS_EXPERIMENTER { len.saturating_sub(4) } else { len };
        payload as u16 * 8
    }
}

/// Prints the NXM name, as `ovs-ofctl` does inside load/move/output actions.
impl fmt::Display for NxmField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NxmField::Reg(n) => write!(f, "NXM_NX_REG{n}"),
            NxmField::TunId => f.write_str("NXM_NX_TUN_ID"),
            NxmField::TunIpv4Src => f.write_str("NXM_NX_TUN_IPV4_SRC"),
            NxmField::TunIpv4Dst => f.write_str("NXM_NX_TUN_IPV4_DST"),
            NxmField::TunIpv6Src => f.write_str("NXM_NX_TUN_IPV6_SRC"),
            NxmField::TunIpv6Dst => f.write_str("NXM_NX_TUN_IPV6_DST"),
            NxmField::Ipv6Src => f.write_str("NXM_NX_IPV6_SRC"),
            NxmField::Ipv6Dst => f.write_str("NXM_NX_IPV6_DST"),
            NxmField::Other(h) => match field_name(*h) {
                Some(n) => f.write_str(n),
                None => write!(f, "NXM_{h:08x}"),
            },
        }
    }
}

/// The name OVS prints for a field inside load/move/output actions (`mf_format_subfield`): the
/// field's NXM name where it has one, whichever header (NXM or OXM) named it on the wire, else
/// its OXM name. `None` for headers this table does not know (printed as `NXM_<header>`), or
/// whose length is not the field's width.
pub fn field_name(h: u32) -> Option<&'static str> {
    let (class, field, _, len) = split(h);
    let (name, width) = match (class, field) {
        (CLASS_NXM0, 0) => ("NXM_OF_IN_PORT", 2),
        (CLASS_NXM0, 1) | (CLASS_OPENFLOW_BASIC, 3) => ("NXM_OF_ETH_DST", 6),
        (CLASS_NXM0, 2) | (CLASS_OPENFLOW_BASIC, 4) => ("NXM_OF_ETH_SRC", 6),
        (CLASS_NXM0, 3) | (CLASS_OPENFLOW_BASIC, 5) => ("NXM_OF_ETH_TYPE", 2),
        (CLASS_NXM0, 4) => ("NXM_OF_VLAN_TCI", 2),
        (CLASS_NXM0, 5) => ("NXM_OF_IP_TOS", 1),
        (CLASS_NXM0, 6) | (CLASS_OPENFLOW_BASIC, 10) => ("NXM_OF_IP_PROTO", 1),
        (CLASS_NXM0, 7) | (CLASS_OPENFLOW_BASIC, 11) => ("NXM_OF_IP_SRC", 4),
        (CLASS_NXM0, 8) | (CLASS_OPENFLOW_BASIC, 12) => ("NXM_OF_IP_DST", 4),
        (CLASS_NXM0, 9) | (CLASS_OPENFLOW_BASIC, 13) => ("NXM_OF_TCP_SRC", 2),
        (CLASS_NXM0, 10) | (CLASS_OPENFLOW_BASIC, 14) => ("NXM_OF_TCP_DST", 2),
        (CLASS_NXM0, 11) | (CLASS_OPENFLOW_BASIC, 15) => ("NXM_OF_UDP_SRC", 2),
        (CLASS_NXM0, 12) | (CLASS_OPENFLOW_BASIC, 16) => ("NXM_OF_UDP_DST", 2),
        (CLASS_NXM0, 13) | (CLASS_OPENFLOW_BASIC, 19) => ("NXM_OF_ICMP_TYPE", 1),
        (CLASS_NXM0, 14) | (CLASS_OPENFLOW_BASIC, 20) => ("NXM_OF_ICMP_CODE", 1),
        (CLASS_NXM0, 15) | (CLASS_OPENFLOW_BASIC, 21) => ("NXM_OF_ARP_OP", 2),
        (CLASS_NXM0, 16) | (CLASS_OPENFLOW_BASIC, 22) => ("NXM_OF_ARP_SPA", 4),
        (CLASS_NXM0, 17) | (CLASS_OPENFLOW_BASIC, 23) => ("NXM_OF_ARP_TPA", 4),
        (CLASS_NXM1, 17) | (CLASS_OPENFLOW_BASIC, 24) => ("NXM_NX_ARP_SHA", 6),
        (CLASS_NXM1, 18) | (CLASS_OPENFLOW_BASIC, 25) => ("NXM_NX_ARP_THA", 6),
        (CLASS_NXM1, 19) | (CLASS_OPENFLOW_BASIC, 26) => ("NXM_NX_IPV6_SRC", 16),
        (CLASS_NXM1, 20) | (CLASS_OPENFLOW_BASIC, 27) => ("NXM_NX_IPV6_DST", 16),
        (CLASS_NXM1, 21) | (CLASS_OPENFLOW_BASIC, 29) => ("NXM_NX_ICMPV6_TYPE", 1),
        (CLASS_NXM1, 22) | (CLASS_OPENFLOW_BASIC, 30) => ("NXM_NX_ICMPV6_CODE", 1),
        (CLASS_NXM1, 23) | (CLASS_OPENFLOW_BASIC, 31) => ("NXM_NX_ND_TARGET", 16),
        (CLASS_NXM1, 24) | (CLASS_OPENFLOW_BASIC, 32) => ("NXM_NX_ND_SLL", 6),
        (CLASS_NXM1, 25) | (CLASS_OPENFLOW_BASIC, 33) => ("NXM_NX_ND_TLL", 6),
        (CLASS_NXM1, 27) | (CLASS_OPENFLOW_BASIC, 28) => ("NXM_NX_IPV6_LABEL", 4),
        (CLASS_NXM1, 28) | (CLASS_OPENFLOW_BASIC, 9) => ("NXM_NX_IP_ECN", 1),
        (CLASS_NXM1, 29) => ("NXM_NX_IP_TTL", 1),
        (CLASS_NXM1, 33) => ("NXM_NX_PKT_MARK", 4),
        (CLASS_NXM1, 34) => ("NXM_NX_TCP_FLAGS", 2),
        (CLASS_NXM1, NXM1_CONJ_ID) => ("NXM_NX_CONJ_ID", 4),
        (CLASS_NXM1, NXM1_CT_STATE) => ("NXM_NX_CT_STATE", 4),
        (CLASS_NXM1, NXM1_CT_ZONE) => ("NXM_NX_CT_ZONE", 2),
        (CLASS_NXM1, NXM1_CT_MARK) => ("NXM_NX_CT_MARK", 4),
        (CLASS_NXM1, NXM1_CT_LABEL) => ("NXM_NX_CT_LABEL", 16),
        (CLASS_NXM1, NXM1_TUN_IPV6_SRC) => ("NXM_NX_TUN_IPV6_SRC", 16),
        (CLASS_NXM1, NXM1_TUN_IPV6_DST) => ("NXM_NX_TUN_IPV6_DST", 16),
        (CLASS_OPENFLOW_BASIC, 0) => ("OXM_OF_IN_PORT", 4),
        (CLASS_OPENFLOW_BASIC, 2) => ("OXM_OF_METADATA", 8),
        (CLASS_OPENFLOW_BASIC, 6) => ("OXM_OF_VLAN_VID", 2),
        (CLASS_OPENFLOW_BASIC, 7) => ("OXM_OF_VLAN_PCP", 1),
        (CLASS_OPENFLOW_BASIC, 8) => ("OXM_OF_IP_DSCP", 1),
        (CLASS_OPENFLOW_BASIC, 17) => ("OXM_OF_SCTP_SRC", 2),
        (CLASS_OPENFLOW_BASIC, 18) => ("OXM_OF_SCTP_DST", 2),
        (CLASS_OPENFLOW_BASIC, 34) => ("OXM_OF_MPLS_LABEL", 4),
        (CLASS_OPENFLOW_BASIC, 35) => ("OXM_OF_MPLS_TC", 1),
        (CLASS_OPENFLOW_BASIC, 36) => ("OXM_OF_MPLS_BOS", 1),
        _ => return None,
    };
    (len == width).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_match_ovs() {
        // Values from OVS's meta-flow.h / the wire reference §6.3.
        assert_eq!(header(CLASS_OPENFLOW_BASIC, OXM_IN_PORT, 4, false), 0x8000_0004);
        assert_eq!(header(CLASS_OPENFLOW_BASIC, OXM_IPV4_SRC, 4, true), 0x8000_1708);
        assert_eq!(header(CLASS_OPENFLOW_BASIC, OXM_TUNNEL_ID, 8, false), 0x8000_4c08);
        assert_eq!(NxmField::Reg(0).header(), 0x0001_0004);
        assert_eq!(NxmField::Reg(2).header(), 0x0001_0404);
        assert_eq!(NxmField::Reg(15).header(), 0x0001_1e04);
        assert_eq!(NxmField::TunId.header(), 0x0001_2008);
        assert_eq!(NxmField::TunIpv4Dst.header(), 0x0001_4004);
        assert_eq!(header(CLASS_NXM1, NXM1_IP_FRAG, 1, true), 0x0001_3502);
        assert_eq!(header(CLASS_NXM1, NXM1_CONJ_ID, 4, false), 0x0001_4a04);
    }

    #[test]
    fn classify() {
        assert_eq!(NxmField::from_header(0x0001_0e04), NxmField::Reg(7));
        assert_eq!(NxmField::from_header(0x0001_0108), NxmField::Other(0x0001_0108));
        assert_eq!(NxmField::from_header(0x8000_0004), NxmField::Other(0x8000_0004));
        assert_eq!(NxmField::TunId.bits(), 64);
    }
}
