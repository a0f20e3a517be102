//! Host-side SDN setup (openshift-sdn's `SetupSDN`): the node's gateway interface (`tun0`, an
//! OVS internal port the caller created), the routes that send cluster and service traffic
//! into OVS, IPv4 forwarding, and removal of what openshift-sdn "version 1" (docker bridge
//! era) left behind. Idempotent: running it again on a configured host changes nothing.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

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
    /// This node's pod subnet; its first host address is the gateway put on `tun`.
    pub node_subnet: Ipv4Net,
    /// MTU of `tun` (the overlay MTU).
    pub mtu: u32,
    /// The whole cluster network, routed on-link through `tun`.
    pub cluster_network: Ipv4Net,
    /// The service network, routed through `tun` so OVS can hand it to kube-proxy's rules.
    pub service_network: Ipv4Net,
}

impl HostConfig {
    /// The gateway address: the node subnet's first host address.
    pub fn gateway(&self) -> Ipv4Addr {
        gateway_of(self.node_subnet)
    }

    fn validate(&self) -> Result<()> {
        check_ifname(&self.tun)?;
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
        if !(68..=65535).contains(&self.mtu) {
            return Err(Error::invalid(format!("MTU {}", self.mtu), "outside 68..=65535"));
        }
        Ok(())
    }
}

/// The first host address of a subnet (openshift-sdn's GenerateDefaultGateway).
pub fn gateway_of(subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).saturating_add(1))
}

/// What `setup_host` changed, for logging.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostChanges {
    /// Legacy interfaces that were found and deleted.
    pub removed_legacy_links: Vec<String>,
    /// Addresses on `tun` other than the gateway address, removed.
    pub removed_addresses: Vec<Ipv4Net>,
    /// Whether the gateway address had to be added.
    pub added_address: bool,
    /// Routes through `tun` that were missing (or pointed elsewhere) and were put in place.
    pub added_routes: Vec<Ipv4Net>,
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

    let want = Ipv4Net::new(cfg.gateway(), cfg.node_subnet.prefix_len())
        .map_err(|e| Error::invalid("gateway prefix", e.to_string()))?;
    let have = nl.addrs_v4(&tun).await?;
    for a in have.iter().filter(|a| **a != want) {
        nl.addr_del(&tun, *a).await?;
        changes.removed_addresses.push(*a);
    }
    if !have.contains(&want) {
        // No prefix route: the node subnet is covered by the cluster-network route below, as
        // openshift-sdn ended up after deleting the kernel's prefix route.
        nl.addr_add(&tun, want, true).await?;
        changes.added_address = true;
    }
    // An address added earlier without IFA_F_NOPREFIXROUTE left the kernel's subnet route.
    let subnet = cfg.node_subnet.trunc();
    let routes = nl.routes_v4().await?;
    if routes.iter().any(|r| r.dst == subnet && r.oif == Some(tun.index) && r.gateway.is_none()) {
        nl.route_del(subnet, tun.index, &cfg.tun).await?;
    }

    for net in [cfg.cluster_network.trunc(), cfg.service_network.trunc()] {
        if !routes.iter().any(|r| r.dst == net && r.oif == Some(tun.index) && r.gateway.is_none()) {
            changes.added_routes.push(net);
        }
        nl.route_replace(net, None, &tun).await?;
    }

    let tun_name = cfg.tun.clone();
    ns.run("enable IPv4 forwarding", move || {
        sysctl::write(&["net", "ipv4", "ip_forward"], "1")?;
        sysctl::write(&["net", "ipv4", "conf", &tun_name, "forwarding"], "1")
    })
    .await?;
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HostConfig {
        HostConfig {
            tun: "tun0".into(),
            node_subnet: "10.128.2.0/23".parse().unwrap(),
            mtu: 1450,
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            service_network: "172.30.0.0/16".parse().unwrap(),
        }
    }

    #[test]
    fn gateway_is_first_host() {
        assert_eq!(cfg().gateway(), Ipv4Addr::new(10, 128, 2, 1));
    }

    #[test]
    fn validation() {
        cfg().validate().unwrap();
        let mut c = cfg();
        c.node_subnet = "10.200.0.0/23".parse().unwrap();
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.tun = "../x".into();
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.node_subnet = "10.128.0.0/31".parse().unwrap();
        assert!(c.validate().is_err());
    }
}
