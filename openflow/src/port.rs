//! OpenFlow 1.3 port numbers, including the reserved ports.

use std::fmt;

/// An OpenFlow 1.3 (32-bit) port number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortNo(pub u32);

impl PortNo {
    /// Ports below this are physical/logical switch ports.
    pub const MAX: PortNo = PortNo(0xffff_ff00);
    pub const IN_PORT: PortNo = PortNo(0xffff_fff8);
    pub const TABLE: PortNo = PortNo(0xffff_fff9);
    pub const NORMAL: PortNo = PortNo(0xffff_fffa);
    pub const FLOOD: PortNo = PortNo(0xffff_fffb);
    pub const ALL: PortNo = PortNo(0xffff_fffc);
    pub const CONTROLLER: PortNo = PortNo(0xffff_fffd);
    pub const LOCAL: PortNo = PortNo(0xffff_fffe);
    /// "Any port": the wildcard in out_port filters; never a valid output.
    pub const ANY: PortNo = PortNo(0xffff_ffff);

    /// OVS's "UNSET" port (OFPP_UNSET, 0xfff7 in the 16-bit space): printed by name, never a
    /// real port.
    pub const UNSET: PortNo = PortNo(0xffff_fff7);

    /// The 32-bit port for a 16-bit (OpenFlow 1.0 / NXM / Nicira action) port number: OVS maps
    /// 0xff00.. up by 0xffff0000, as `ofputil_port_to_ofp11` does, so `0xfff8` is `IN_PORT`.
    pub fn from_ofp10(p: u16) -> PortNo {
        if p >= 0xff00 {
            PortNo(p as u32 + 0xffff_0000)
        } else {
            PortNo(p as u32)
        }
    }

    /// The name OVS prints for a reserved port, if this is one.
    pub fn reserved_name(self) -> Option<&'static str> {
        Some(match self {
            PortNo::UNSET => "UNSET",
            PortNo::IN_PORT => "IN_PORT",
            PortNo::TABLE => "TABLE",
            PortNo::NORMAL => "NORMAL",
            PortNo::FLOOD => "FLOOD",
            PortNo::ALL => "ALL",
            PortNo::CONTROLLER => "CONTROLLER",
            PortNo::LOCAL => "LOCAL",
            PortNo::ANY => "ANY",
            _ => return None,
        })
    }

    /// True for a regular (non-reserved) port number.
    pub fn is_regular(self) -> bool {
        self.0 < Self::MAX.0
    }
}

impl From<u32> for PortNo {
    fn from(v: u32) -> Self {
        PortNo(v)
    }
}

/// Formats as `ovs-ofctl` does (`ofputil_format_port` after `ofputil_port_from_ofp11`): the
/// reserved name, or the number. OVS works with 16-bit ports internally, so the other ports of
/// the reserved range 0xffffff00..=0xfffffff6 print as their 16-bit number (65280..).
impl fmt::Display for PortNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reserved_name() {
            Some(n) => f.write_str(n),
            None if *self >= PortNo::MAX => write!(f, "{}", self.0 - 0xffff_0000),
            None => write!(f, "{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_ovs_prints_them() {
        assert_eq!(PortNo::from_ofp10(0xfff8), PortNo::IN_PORT);
        assert_eq!(PortNo::from_ofp10(0xffff), PortNo::ANY);
        assert_eq!(PortNo::from_ofp10(5), PortNo(5));
        for (p, want) in [
            (PortNo::IN_PORT, "IN_PORT"),
            (PortNo::TABLE, "TABLE"),
            (PortNo::NORMAL, "NORMAL"),
            (PortNo::FLOOD, "FLOOD"),
            (PortNo::ALL, "ALL"),
            (PortNo::CONTROLLER, "CONTROLLER"),
            (PortNo::LOCAL, "LOCAL"),
            (PortNo::ANY, "ANY"),
            (PortNo::UNSET, "UNSET"),
            (PortNo(0xffff_ff00), "65280"),
            (PortNo(7), "7"),
        ] {
            assert_eq!(p.to_string(), want);
        }
    }
}
