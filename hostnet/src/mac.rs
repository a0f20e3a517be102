//! Ethernet address type: CNI passes and returns MACs as text, the kernel as 6 bytes.

use std::{fmt, str::FromStr};

use crate::error::Error;

/// A 48-bit Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

impl FromStr for MacAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::invalid(format!("MAC address {s:?}"), "expected xx:xx:xx:xx:xx:xx");
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in out.iter_mut() {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

impl MacAddr {
    /// Unicast and not all-zero: what the kernel accepts as an interface address.
    pub fn is_valid_unicast(&self) -> bool {
        self.0[0] & 1 == 0 && self.0 != [0; 6]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let m: MacAddr = "0a:58:0a:80:00:05".parse().unwrap();
        assert_eq!(m.0, [0x0a, 0x58, 0x0a, 0x80, 0x00, 0x05]);
        assert_eq!(m.to_string(), "0a:58:0a:80:00:05");
        assert!(m.is_valid_unicast());
    }

    #[test]
    fn rejects_malformed() {
        for s in ["", "0a:58:0a:80:00", "0a:58:0a:80:00:05:06", "0a:58:0a:80:00:5", "zz:58:0a:80:00:05"] {
            assert!(s.parse::<MacAddr>().is_err(), "{s}");
        }
        assert!(!"01:00:5e:00:00:01".parse::<MacAddr>().unwrap().is_valid_unicast());
    }
}
