//! The two IP families of the policy flows: every box, clause flow and drop is an `ip` flow or
//! an `ipv6` flow, never both (an IPv4 packet never matches an `ipv6` flow), so a dual-stack
//! pod's policies are the same rules compiled once per family of its addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use openflow::flow_match::{Ip6Proto, Ipv6Match};
use openflow::{IpFrag, IpProto, Ipv4Match, Masked, Match};

/// An IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// A pod's address of this family, if it has one.
    pub fn pick(self, ips: &crate::domain::PodIps) -> Option<IpAddr> {
        match self {
            Family::V4 => ips.v4.map(IpAddr::V4),
            Family::V6 => ips.v6.map(IpAddr::V6),
        }
    }

    pub fn of_net(n: IpNet) -> Family {
        match n {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
}

/// An address range of either family as (value, mask) bits, value pre-masked; an IPv4 one in
/// the low 32 bits (its family is kept beside it, in the box).
pub(crate) type Bits = (u128, u128);

pub(crate) trait BitsOf {
    fn net(n: IpNet) -> Bits;
    fn host(ip: IpAddr) -> Bits;
}

impl BitsOf for Bits {
    fn net(n: IpNet) -> Bits {
        match n {
            IpNet::V4(n) => (u128::from(u32::from(n.network())), u128::from(u32::from(n.netmask()))),
            IpNet::V6(n) => (u128::from(n.network()), u128::from(n.netmask())),
        }
    }

    fn host(ip: IpAddr) -> Bits {
        match ip {
            IpAddr::V4(a) => (u128::from(u32::from(a)), u128::from(u32::MAX)),
            IpAddr::V6(a) => (u128::from(a), u128::MAX),
        }
    }
}

/// `ip`/`tcp`/... or `ipv6`/`tcp6`/... with the given source, destination (bits of `family`),
/// protocol and fragment.
pub(crate) fn ip_match(family: Family, src: Option<Bits>, dst: Option<Bits>, proto: Option<IpProto>, frag: Option<IpFrag>) -> Match {
    match family {
        Family::V4 => {
            // The low 32 bits hold the IPv4 address (see `Bits`).
            let a = |(v, m): Bits| Masked::new(Ipv4Addr::from(v as u32), Ipv4Addr::from(m as u32));
            Match::any().ipv4(Ipv4Match { src: src.map(a), dst: dst.map(a), proto, frag })
        }
        Family::V6 => {
            let a = |(v, m): Bits| Masked::new(Ipv6Addr::from(v), Ipv6Addr::from(m));
            Match::any().ipv6(Ipv6Match { src: src.map(a), dst: dst.map(a), proto: proto.map(Ip6Proto::from), frag, label: None })
        }
    }
}

/// `ip` or `ipv6`, nothing else.
pub(crate) fn any_ip(family: Family) -> Match {
    ip_match(family, None, None, None, None)
}

/// The one host `ip` as a match: `ip,nw_src=<ip>`... (`src`) or `…,nw_dst=<ip>`.
pub(crate) fn host_match(ip: IpAddr, src: bool) -> Match {
    let h = Some(Bits::host(ip));
    if src {
        ip_match(Family::of(ip), h, None, None, None)
    } else {
        ip_match(Family::of(ip), None, h, None, None)
    }
}

/// A network of either family as a match on the destination (`nw_dst`/`ipv6_dst`).
pub(crate) fn dst_net(n: IpNet) -> Match {
    ip_match(Family::of_net(n), None, Some(Bits::net(n)), None, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text() {
        let n6: IpNet = "fd00:10:128::/48".parse().unwrap();
        assert_eq!(dst_net(n6).to_string(), "ipv6,ipv6_dst=fd00:10:128::/48");
        assert_eq!(dst_net("10.128.0.0/14".parse().unwrap()).to_string(), "ip,nw_dst=10.128.0.0/14");
        assert_eq!(host_match("fd00::5".parse().unwrap(), true).to_string(), "ipv6,ipv6_src=fd00::5");
        assert_eq!(
            ip_match(Family::V6, None, None, Some(IpProto::Tcp { dst: Some(Masked::exact(80)) }), None).to_string(),
            "tcp6,tp_dst=80"
        );
        assert_eq!(any_ip(Family::V6).to_string(), "ipv6");
    }
}
