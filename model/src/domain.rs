//! Domain values shared by the pipeline, the state sources and the store.

use std::fmt;

/// A virtual network id (the tenant's `netid`); 24 bits on the wire (VXLAN VNI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vnid(u32);

impl Vnid {
    /// The global network: every tenant may reach it and be reached from it.
    pub const GLOBAL: Vnid = Vnid(0);
    pub const MAX: u32 = (1 << 24) - 1;

    pub fn new(v: u32) -> Result<Vnid, String> {
        if v > Self::MAX {
            return Err(format!("VNID {v} exceeds the 24-bit maximum {}", Self::MAX));
        }
        Ok(Vnid(v))
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Vnid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An OpenFlow port number of a port on the bridge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OfPort(pub u32);

impl OfPort {
    /// `vxlan0`, created with ofport_request=1.
    pub const VXLAN: OfPort = OfPort(1);
    /// `tun0`, the node's gateway into the pod network, ofport_request=2.
    pub const TUN: OfPort = OfPort(2);
}

impl fmt::Display for OfPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<OfPort> for openflow::PortNo {
    fn from(p: OfPort) -> Self {
        openflow::PortNo(p.0)
    }
}

/// A container ID: 32 bytes, written as 64 hex characters. The pod's table-20 flow carries it
/// as its note, which is how the seed finds a pod's flows again.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ContainerId([u8; 32]);

impl ContainerId {
    pub fn parse(s: &str) -> Result<ContainerId, String> {
        if s.len() != 64 {
            return Err(format!("container ID {s:?} has {} characters; expected 64 hex characters (32 bytes)", s.len()));
        }
        // Every character a hex digit: `from_str_radix` alone also takes a sign ("+a").
        if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("container ID {s:?} is not hexadecimal"));
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("container ID {s:?} is not hexadecimal"))?;
        }
        Ok(ContainerId(out))
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// The openshift-sdn network plugin mode; its number is the first byte of the version note.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Plugin {
    /// `redhat/openshift-ovs-subnet`: one flat network (every VNID is 0).
    Subnet,
    /// `redhat/openshift-ovs-multitenant`: namespaces isolated by VNID.
    Multitenant,
    /// `redhat/openshift-ovs-networkpolicy`: VNIDs from NetNamespaces as in multitenant mode,
    /// isolation by Kubernetes NetworkPolicy (conntrack in table 21, per namespace in table 80).
    #[serde(rename = "networkpolicy")]
    NetworkPolicy,
}

impl Plugin {
    pub fn id(self) -> u8 {
        match self {
            Plugin::Subnet => 0,
            Plugin::Multitenant => 1,
            Plugin::NetworkPolicy => 2,
        }
    }

    /// Whether a namespace's traffic carries its NetNamespace's netid (multitenant and
    /// networkpolicy) rather than the global VNID 0 everywhere (subnet).
    pub fn uses_netids(self) -> bool {
        matches!(self, Plugin::Multitenant | Plugin::NetworkPolicy)
    }
}

/// openshift-sdn's MAC for a pod's address: `0a:58:` followed by the IPv4 address's four
/// bytes (locally administered, unicast, and unique while the address is). A pod of an
/// IPv6-only cluster has no IPv4 address: its MAC is `0a:58:` and the last four bytes of its
/// IPv6 one (ovn-kubernetes' rule). Those are unique on the node (the IPAM numbers a node's
/// pods from `::2` up, far below 2^32); two nodes may each have a pod with the same MAC, which
/// is harmless because the pipeline delivers by address, never by MAC (pods only ever see a
/// remote pod's MAC in its neighbour advertisements, and send to it through br0's routing).
/// A dual-stack pod keeps the IPv4 rule.
pub fn pod_mac(ip: impl Into<std::net::IpAddr>) -> openflow::MacAddr {
    let o = match ip.into() {
        std::net::IpAddr::V4(a) => a.octets(),
        std::net::IpAddr::V6(a) => {
            let b = a.octets();
            [b[12], b[13], b[14], b[15]]
        }
    };
    openflow::MacAddr([0x0a, 0x58, o[0], o[1], o[2], o[3]])
}

/// A pod's addresses, one per family it has: IPv4 (IPv4-only and dual-stack clusters), IPv6
/// (dual-stack and IPv6-only). The model's checks keep at least one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodIps {
    pub v4: Option<std::net::Ipv4Addr>,
    pub v6: Option<std::net::Ipv6Addr>,
}

impl PodIps {
    /// Its addresses, IPv4 first.
    pub fn iter(&self) -> impl Iterator<Item = std::net::IpAddr> {
        self.v4.map(std::net::IpAddr::V4).into_iter().chain(self.v6.map(std::net::IpAddr::V6))
    }

    /// The address its MAC and names derive from: IPv4 if it has one, else IPv6.
    pub fn primary(&self) -> Option<std::net::IpAddr> {
        self.iter().next()
    }

    /// The shape pod records and the pod API write: the first address (IPv4, or the IPv6 one
    /// of an IPv6-only pod) and a dual-stack pod's IPv6 address beside it.
    pub fn first_and_second(&self) -> Option<(std::net::IpAddr, Option<std::net::Ipv6Addr>)> {
        Some((self.primary()?, self.v4.and(self.v6)))
    }

    /// [`PodIps::first_and_second`] read back. A second address beside an IPv6 first one (no
    /// pod has two IPv6 addresses) is `None`.
    pub fn from_first_and_second(first: std::net::IpAddr, second: Option<std::net::Ipv6Addr>) -> Option<PodIps> {
        match (first, second) {
            (std::net::IpAddr::V4(a), v6) => Some(PodIps { v4: Some(a), v6 }),
            (std::net::IpAddr::V6(a), None) => Some(PodIps { v4: None, v6: Some(a) }),
            (std::net::IpAddr::V6(_), Some(_)) => None,
        }
    }
}

impl From<std::net::Ipv4Addr> for PodIps {
    fn from(a: std::net::Ipv4Addr) -> PodIps {
        PodIps { v4: Some(a), v6: None }
    }
}

impl std::str::FromStr for PodIps {
    type Err = std::net::AddrParseError;

    /// The [`Display`](std::fmt::Display) form: one address, or `v4/v6`.
    fn from_str(s: &str) -> Result<PodIps, Self::Err> {
        let mut out = PodIps { v4: None, v6: None };
        for part in s.split('/') {
            match part.parse::<std::net::IpAddr>()? {
                std::net::IpAddr::V4(a) => out.v4 = Some(a),
                std::net::IpAddr::V6(a) => out.v6 = Some(a),
            }
        }
        Ok(out)
    }
}

impl std::fmt::Display for PodIps {
    /// `10.128.2.5`, `fd00:10:128:2::5`, or `10.128.2.5/fd00:10:128:2::5`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.v4, self.v6) {
            (Some(a), Some(b)) => write!(f, "{a}/{b}"),
            (Some(a), None) => write!(f, "{a}"),
            (None, Some(b)) => write!(f, "{b}"),
            (None, None) => f.write_str("(no address)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vnid_range() {
        assert!(Vnid::new(Vnid::MAX).is_ok());
        assert!(Vnid::new(Vnid::MAX + 1).unwrap_err().contains("24-bit"));
    }

    #[test]
    fn container_id() {
        let s = "0123456789abcdef".repeat(4);
        assert_eq!(ContainerId::parse(&s).unwrap().to_string(), s);
        assert!(ContainerId::parse("abc").unwrap_err().contains("64"));
        assert!(ContainerId::parse(&"zz".repeat(32)).unwrap_err().contains("hexadecimal"));
        assert!(ContainerId::parse(&format!("{}é", "a".repeat(62))).unwrap_err().contains("hexadecimal"));
        // from_str_radix alone takes a sign: "+f" would parse as 0x0f.
        for signed in [format!("+{}", "f".repeat(63)), format!("{}-1", "a".repeat(62))] {
            assert!(ContainerId::parse(&signed).unwrap_err().contains("hexadecimal"), "{signed}");
        }
    }
}
