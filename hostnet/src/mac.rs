//! Ethernet address type: CNI passes and returns MACs as text, the kernel as 6 bytes. One type
//! for the whole workspace (the `netif` crate's, which the OpenFlow codec uses too), so that a
//! pod's MAC goes from the model to the kernel without a conversion.

pub use netif::MacAddr;

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
