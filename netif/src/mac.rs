//! The Ethernet address: 6 bytes, written `xx:xx:xx:xx:xx:xx`.

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

/// Error parsing a MAC address from text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacParseError(pub String);

impl fmt::Display for MacParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid MAC address {:?}: expected six hex octets separated by ':'", self.0)
    }
}

impl std::error::Error for MacParseError {}

/// The canonical form: six octets of exactly two hex digits (either case), as the kernel, CNI
/// results and Go's `net.ParseMAC` write them.
impl FromStr for MacAddr {
    type Err = MacParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s, |p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

impl MacAddr {
    /// The grammar the state file (and the pod API) has always accepted: one or two hex digits
    /// per octet, as OVS's own parser does (`0a:58:a:80:0:5`). Kept apart from [`FromStr`] so
    /// that no state file that loads today stops loading; everything else reads the canonical
    /// form.
    pub fn parse_lenient(s: &str) -> Result<MacAddr, MacParseError> {
        parse(s, |p| !p.is_empty() && p.len() <= 2)
    }

    /// Unicast and not all-zero: what the kernel accepts as an interface address.
    pub fn is_valid_unicast(&self) -> bool {
        self.0[0] & 1 == 0 && self.0 != [0; 6]
    }
}

/// In JSON (and any serde format), the canonical text form. Reading takes [`FromStr`]'s grammar
/// and its error, which quotes the text; a reader that must take the lenient grammar (records
/// an older agent stored) reads a string and calls [`MacAddr::parse_lenient`] itself.
#[cfg(feature = "serde")]
impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = MacAddr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a MAC address (xx:xx:xx:xx:xx:xx)")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<MacAddr, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Text)
    }
}

fn parse(s: &str, octet_ok: impl Fn(&str) -> bool) -> Result<MacAddr, MacParseError> {
    let bad = || MacParseError(s.to_string());
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for o in out.iter_mut() {
        let p = parts.next().ok_or_else(bad)?;
        if !octet_ok(p) {
            return Err(bad());
        }
        *o = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(MacAddr(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_and_lenient() {
        let m: MacAddr = "0A:58:0a:80:00:05".parse().unwrap();
        assert_eq!(m.to_string(), "0a:58:0a:80:00:05");
        for s in ["0a:58:a:80:0:5", "+a:58:0a:80:00:05", "0a:58:0a:80:00:055"] {
            assert!(s.parse::<MacAddr>().is_err(), "{s}");
        }
        assert_eq!(MacAddr::parse_lenient("0a:58:a:80:0:5").unwrap(), "0a:58:0a:80:00:05".parse().unwrap());
        for s in ["", "0a:58:0a:80:00", "0a::0a:80:00:05", "0a:58:0a:80:00:055", "0a:58:0a:80:00:05:06"] {
            assert!(MacAddr::parse_lenient(s).is_err(), "{s}");
        }
        assert_eq!(
            MacAddr::parse_lenient("x").unwrap_err().to_string(),
            "invalid MAC address \"x\": expected six hex octets separated by ':'"
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn json_is_the_canonical_text() {
        let m: MacAddr = serde_json::from_str("\"0A:58:0a:80:00:05\"").unwrap();
        assert_eq!(serde_json::to_string(&m).unwrap(), "\"0a:58:0a:80:00:05\"");
        for bad in ["\"0a:58:a:80:0:5\"", "7", "null"] {
            assert!(serde_json::from_str::<MacAddr>(bad).is_err(), "{bad}");
        }
        let e = serde_json::from_str::<MacAddr>("\"x\"").unwrap_err().to_string();
        assert!(e.starts_with("invalid MAC address \"x\""), "{e}");
    }
}
