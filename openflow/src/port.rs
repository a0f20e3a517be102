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

    /// The name OVS prints for a reserved port, if this is one.
    pub fn reserved_name(self) -> Option<&'static str> {
        Some(match self {
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

/// Formats as `ovs-ofctl` does: the number, or the reserved name.
impl fmt::Display for PortNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reserved_name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.0),
        }
    }
}
