//! Host-side SDN setup (openshift-sdn's `SetupSDN`): the node's gateway interface (`tun0`, an
//! OVS internal port the caller created), the routes that send cluster and service traffic
//! into OVS, forwarding, and removal of what openshift-sdn "version 1" (docker bridge era) left
//! behind. Each family (IPv4, IPv6) is optional, at least one there: tun0 carries the families
//! of the cluster. Idempotent: running it again on a configured host changes nothing.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rtnetlink::packet_route::address::{AddressFlags, AddressScope};

use crate::{
    error::{Error, Result},
    names::check_ifname,
    netns::Netns,
    nl::Nl,
    sysctl,
};

/// Interfaces of openshift-sdn's pre-CNI design: a Linux bridge and a veth pair into OVS.
/// Deleting them also removes every route through them.
pub const LEGACY_LINKS: [&str; 3] = ["lbr0", "vlinuxbr", "vovsbr"];

/// What the host side must look like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// The gateway interface, usually `tun0`.
    pub tun: String,
    /// MTU of `tun` (the overlay MTU).
    pub mtu: u32,
    /// The IPv4 side; None: an IPv6-only node (tun gets no IPv4 address nor route, and any
    /// IPv4 address left on it from an earlier configuration is removed, as a changed IPv4
    /// gateway's old address would be).
    pub ipv4: Option<HostIpv4>,
    /// The IPv6 side; None: IPv4 only (tun's IPv6 side is left as it is, as before
    /// dual-stack). At least one of `ipv4` and `ipv6` is there.
    pub ipv6: Option<HostIpv6>,
}

/// The node's IPv4 side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostIpv4 {
    /// This node's pod subnet; its first host address is the gateway put on `tun`.
    pub node_subnet: Ipv4Net,
    /// The whole cluster network, routed on-link through `tun`.
    pub cluster_network: Ipv4Net,
    /// The service network, routed through `tun` so OVS can hand it to kube-proxy's rules.
    pub service_network: Ipv4Net,
}

impl HostIpv4 {
    /// The gateway address: the node subnet's first host address.
    pub fn gateway(&self) -> Ipv4Addr {
        gateway_of(self.node_subnet)
    }

    fn validate(&self) -> Result<()> {
        if self.node_subnet.prefix_len() > 30 {
            return Err(Error::invalid(
                format!("node subnet {}", self.node_subnet),
                "needs at least a /30 for gateway and pods",
            ));
        }
        if !self.cluster_network.contains(&self.node_subnet) {
            return Err(Error::invalid(
                format!("node subnet {}", self.node_subnet),
                format!("not inside the cluster network {}", self.cluster_network),
            ));
        }
        Ok(())
    }
}

/// The node's IPv6 side (dual-stack, or the only one of an IPv6-only node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostIpv6 {
    /// This node's IPv6 pod subnet; [`gateway6_of`] it goes on `tun`.
    pub node_subnet: Ipv6Net,
    /// The whole IPv6 cluster network, routed on-link through `tun`.
    pub cluster_network: Ipv6Net,
    /// The IPv6 service network, routed through `tun` as the IPv4 one is.
    pub service_network: Ipv6Net,
}

impl HostIpv6 {
    /// tun's IPv6 address: [`gateway6_of`] the node subnet, with its prefix length.
    pub fn gateway(&self) -> Ipv6Net {
        Ipv6Net::new_assert(gateway6_of(self.node_subnet), self.node_subnet.prefix_len())
    }

    fn validate(&self) -> Result<()> {
        if self.node_subnet.prefix_len() > 126 {
            return Err(Error::invalid(
                format!("IPv6 node subnet {}", self.node_subnet),
                "needs at least a /126 for gateway and pods",
            ));
        }
        if !self.cluster_network.contains(&self.node_subnet) {
            return Err(Error::invalid(
                format!("IPv6 node subnet {}", self.node_subnet),
                format!("not inside the IPv6 cluster network {}", self.cluster_network),
            ));
        }
        Ok(())
    }
}

impl HostConfig {
    fn validate(&self) -> Result<()> {
        check_ifname(&self.tun)?;
        if !(68..=65535).contains(&self.mtu) {
            return Err(Error::invalid(format!("MTU {}", self.mtu), "outside 68..=65535"));
        }
        if self.ipv4.is_none() && self.ipv6.is_none() {
            return Err(Error::invalid(
                format!("gateway interface {}", self.tun),
                "host configuration has neither an IPv4 nor an IPv6 side",
            ));
        }
        if let Some(v4) = &self.ipv4 {
            v4.validate()?;
        }
        if let Some(v6) = &self.ipv6 {
            v6.validate()?;
        }
        Ok(())
    }
}

/// The first host address of a subnet (openshift-sdn's GenerateDefaultGateway).
pub fn gateway_of(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).saturating_add(1))
}

/// The IPv6 gateway of a subnet: its first address + 1 (fd00:10:128:1::1 for
/// fd00:10:128:1::/64; the first, `::`, is the subnet-router anycast address).
pub fn gateway6_of(subnet: Ipv6Net) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(subnet.network()).saturating_add(1))
}

/// What `setup_host` changed, for logging.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostChanges {
    /// Legacy interfaces that were found and deleted.
    pub removed_legacy_links: Vec<String>,
    /// Addresses on `tun` other than the gateway addresses, removed (IPv6 link-local ones,
    /// the kernel's own, are kept).
    pub removed_addresses: Vec<IpNet>,
    /// Whether the IPv4 gateway address had to be added.
    pub added_address: bool,
    /// Whether the IPv6 gateway address had to be added.
    pub added_address6: bool,
    /// Routes through `tun` that were missing (or pointed elsewhere) and were put in place.
    pub added_routes: Vec<IpNet>,
}

/// Configures the host side in namespace `ns` (the host's own, for the agent).
pub async fn setup_host(ns: &Netns, cfg: &HostConfig) -> Result<HostChanges> {
    cfg.validate()?;
    let nl = Nl::connect(ns).await?;
    let mut changes = HostChanges::default();

    for name in LEGACY_LINKS {
        // vlinuxbr and vovsbr are one veth pair: the second lookup finds nothing.
        if let Some(link) = nl.link_by_name(name).await? {
            nl.link_del(link.index, name).await?;
            changes.removed_legacy_links.push(name.to_string());
        }
    }

    let tun = nl.require_link("gateway interface", &cfg.tun).await?;
    nl.link_up(&tun, Some(cfg.mtu)).await?;

    setup_ipv4(ns, &nl, &cfg.tun, cfg.ipv4.as_ref(), &mut changes).await?;
    if let Some(v6) = &cfg.ipv6 {
        setup_ipv6(ns, &nl, &cfg.tun, v6, &mut changes).await?;
    }
    Ok(changes)
}

/// tun's IPv4 side: the gateway address (no prefix route), every other IPv4 address removed,
/// the cluster and service networks on-link through tun, and forwarding.
///
/// `None` (an IPv6-only node): by the same rule (tun is our OVS port, every address on it is
/// ours and anything but the wanted gateway goes) every IPv4 address on tun is removed, and
/// the kernel then drops every IPv4 route through tun itself: the last IPv4 address of an
/// interface going takes its routes along (net/ipv4/fib_frontend.c, fib_inetaddr_event ->
/// fib_disable_ip), so the cluster and service routes of an earlier IPv4 configuration go with
/// its gateway address. IPv4 forwarding is left as it is: nothing of ours needs it turned on,
/// and turning it off is the host's business.
async fn setup_ipv4(ns: &Netns, nl: &Nl, tun_name: &str, v4: Option<&HostIpv4>, changes: &mut HostChanges) -> Result<()> {
    let tun = nl.require_link("gateway interface", tun_name).await?;
    let want = match v4 {
        Some(v4) => Some(
            Ipv4Net::new(v4.gateway(), v4.node_subnet.prefix_len())
                .map_err(|e| Error::invalid("gateway prefix", e.to_string()))?,
        ),
        None => None,
    };
    let have = nl.addrs_v4(&tun).await?;
    for a in have.iter().filter(|a| Some(**a) != want) {
        nl.addr_del(&tun, *a).await?;
        changes.removed_addresses.push(IpNet::V4(*a));
    }
    let (Some(v4), Some(want)) = (v4, want) else {
        return Ok(());
    };
    if !have.contains(&want) {
        // No prefix route: the node subnet is covered by the cluster-network route below, as
        // openshift-sdn ended up after deleting the kernel's prefix route.
        nl.addr_add(&tun, want, true).await?;
        changes.added_address = true;
    }
    // An address added earlier without IFA_F_NOPREFIXROUTE left the kernel's subnet route.
    let subnet = v4.node_subnet.trunc();
    let routes = nl.routes_v4().await?;
    if routes.iter().any(|r| r.dst == subnet && r.oif == Some(tun.index) && r.gateway.is_none()) {
        nl.route_del(subnet, tun.index, tun_name).await?;
    }

    for net in [v4.cluster_network.trunc(), v4.service_network.trunc()] {
        if !routes.iter().any(|r| r.dst == net && r.oif == Some(tun.index) && r.gateway.is_none()) {
            changes.added_routes.push(IpNet::V4(net));
        }
        nl.route_replace(net, None, &tun).await?;
    }

    let tun_name = tun_name.to_string();
    ns.run("enable IPv4 forwarding", move || {
        sysctl::write(&["net", "ipv4", "ip_forward"], "1")?;
        sysctl::write(&["net", "ipv4", "conf", &tun_name, "forwarding"], "1")
    })
    .await
}

/// tun's IPv6 side, as the IPv4 one: the gateway address (NODAD: it is the gateway, unique by
/// construction, and usable at once; no prefix route, the cluster route covers the subnet),
/// other global addresses removed, the cluster and service networks on-link through tun, and
/// forwarding.
///
/// `net.ipv6.conf.all.forwarding=1` turns forwarding on for every interface (and `default`),
/// and a forwarding interface ignores router advertisements unless its `accept_ra` is 2: a
/// host whose own addresses or default route come from SLAAC/RAs on its uplink stops
/// refreshing them (they expire). Such a host needs `accept_ra=2` on the uplink, which is its
/// administrator's setting, not ours.
async fn setup_ipv6(ns: &Netns, nl: &Nl, tun_name: &str, v6: &HostIpv6, changes: &mut HostChanges) -> Result<()> {
    // An interface with IPv6 disabled takes no IPv6 address: enable it first.
    let name = tun_name.to_string();
    ns.run("enable IPv6 on the gateway interface", move || {
        sysctl::write(&["net", "ipv6", "conf", &name, "disable_ipv6"], "0")
    })
    .await?;
    let tun = nl.require_link("gateway interface", tun_name).await?;
    let want = v6.gateway();
    let have = nl.addrs_v6(&tun).await?;
    for a in have.iter().filter(|a| a.net != want && a.scope != AddressScope::Link) {
        nl.addr_del_v6(&tun, a.net).await?;
        changes.removed_addresses.push(IpNet::V6(a.net));
    }
    if !have.iter().any(|a| a.net == want) {
        nl.addr_add_v6(&tun, want, AddressFlags::Nodad | AddressFlags::Noprefixroute).await?;
        changes.added_address6 = true;
    }
    let subnet = v6.node_subnet.trunc();
    let routes = nl.routes_v6().await?;
    if routes.iter().any(|r| r.dst == subnet && r.oif == Some(tun.index) && r.gateway.is_none()) {
        nl.route_del_v6(subnet, tun.index, tun_name).await?;
    }
    for net in [v6.cluster_network.trunc(), v6.service_network.trunc()] {
        if !routes.iter().any(|r| r.dst == net && r.oif == Some(tun.index) && r.gateway.is_none()) {
            changes.added_routes.push(IpNet::V6(net));
        }
        nl.route_replace_v6(net, None, &tun).await?;
    }
    ns.run("enable IPv6 forwarding", || sysctl::write(&["net", "ipv6", "conf", "all", "forwarding"], "1")).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HostConfig {
        HostConfig { tun: "tun0".into(), mtu: 1450, ipv4: Some(v4()), ipv6: None }
    }

    fn v4() -> HostIpv4 {
        HostIpv4 {
            node_subnet: "10.128.2.0/23".parse().unwrap(),
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            service_network: "172.30.0.0/16".parse().unwrap(),
        }
    }

    /// The host config with its IPv4 node subnet `subnet`.
    fn with_subnet(subnet: &str) -> HostConfig {
        HostConfig { ipv4: Some(HostIpv4 { node_subnet: subnet.parse().unwrap(), ..v4() }), ..cfg() }
    }

    fn v6() -> HostIpv6 {
        HostIpv6 {
            node_subnet: "fd00:10:128:1::/64".parse().unwrap(),
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
            service_network: "fd00:172:30::/112".parse().unwrap(),
        }
    }

    #[test]
    fn ipv6_gateway_is_first_address_plus_one() {
        assert_eq!(gateway6_of("fd00:10:128:1::/64".parse().unwrap()), "fd00:10:128:1::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(gateway6_of("fd00:10:128:1::77/64".parse().unwrap()), "fd00:10:128:1::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(v6().gateway().to_string(), "fd00:10:128:1::1/64");
    }

    #[test]
    fn ipv6_validation() {
        HostConfig { ipv6: Some(v6()), ..cfg() }.validate().unwrap();
        let mut v = v6();
        v.node_subnet = "fd00:99::/64".parse().unwrap();
        assert!(HostConfig { ipv6: Some(v), ..cfg() }.validate().is_err());
        let mut v = v6();
        v.node_subnet = "fd00:10:128:1::/127".parse().unwrap();
        assert!(HostConfig { ipv6: Some(v), ..cfg() }.validate().is_err());
    }

    #[test]
    fn gateway_is_first_host() {
        assert_eq!(v4().gateway(), Ipv4Addr::new(10, 128, 2, 1));
    }

    #[test]
    fn validation() {
        cfg().validate().unwrap();
        assert!(with_subnet("10.200.0.0/23").validate().is_err());
        let mut c = cfg();
        c.tun = "../x".into();
        assert!(c.validate().is_err());
        assert!(with_subnet("10.128.0.0/31").validate().is_err());
    }

    #[test]
    fn ipv6_only_is_valid_and_no_family_is_not() {
        HostConfig { ipv4: None, ipv6: Some(v6()), ..cfg() }.validate().unwrap();
        let e = HostConfig { ipv4: None, ipv6: None, ..cfg() }.validate().unwrap_err().to_string();
        assert!(e.contains("neither an IPv4 nor an IPv6"), "{e}");
    }
}
