//! AddHostSubnetRules / DeleteHostSubnetRules: reaching pods on another node over VXLAN.

use std::net::IpAddr;

use ipnet::Ipv4Net;
use openflow::{Action, ArpMatch, Ipv4Match, Match, RegMove, SetField, Subfield};

use super::{cidr, cidr6, ip6, nd, output, tun_id_low32, Flow, Reg, Table, NA, NS};
use crate::domain::{OfPort, Vnid};

/// Another node's subnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSubnet {
    /// The node's underlay address (VXLAN endpoint), either family.
    pub host_ip: IpAddr,
    /// Its IPv4 pod subnet (`None` in an IPv6-only cluster).
    pub subnet: Option<Ipv4Net>,
    /// Its IPv6 pod subnet (dual-stack, IPv6-only).
    pub subnet6: Option<ipnet::Ipv6Net>,
    /// The `pod.network.openshift.io/fixed-vnid-host` annotation: every packet to this node
    /// carries this VNID instead of the sender's.
    pub fixed_vnid: Option<Vnid>,
}

/// The actions that send a packet to `host_ip` through vxlan0 with the right VNID.
pub(crate) fn to_vxlan(host_ip: IpAddr, fixed: Option<Vnid>) -> Vec<Action> {
    let set_vnid = match fixed {
        Some(v) => Action::RegLoad { dst: tun_id_low32(), value: v.get() as u64 },
        None => move_reg0_to_tun_id(),
    };
    vec![set_vnid, set_tun_dst(host_ip), output(OfPort::VXLAN)]
}

/// `set_field:<ip>->tun_dst`, or `->tun_ipv6_dst` for a node on an IPv6 underlay (vxlan0 is
/// flow-based, `remote_ip=flow`, which OVS resolves for either family).
pub(crate) fn set_tun_dst(host_ip: IpAddr) -> Action {
    Action::SetField(match host_ip {
        IpAddr::V4(ip) => SetField::TunDst(ip),
        IpAddr::V6(ip) => SetField::TunIpv6Dst(ip),
    })
}

/// Table 10's match of a packet that came through the tunnel from `host_ip`.
pub(crate) fn from_node(host_ip: IpAddr) -> Match {
    match host_ip {
        IpAddr::V4(ip) => Match::any().tun_src(ip),
        IpAddr::V6(ip) => Match { tun_ipv6_src: Some(openflow::Masked::exact(ip)), ..Match::any() },
    }
}

/// `move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31]`.
pub(crate) fn move_reg0_to_tun_id() -> Action {
    Action::RegMove(
        RegMove::new(Subfield::whole(Reg::SrcVnid.field()), tun_id_low32())
            .expect("REG0[] and TUN_ID[0..31] are both 32 bits"),
    )
}

/// The node's flows: table 10 admits what comes through the tunnel from it (either family
/// inside), then its subnet of each family: ARP or neighbour discovery (50) and IP (90) to
/// its pods, through the tunnel.
pub fn flows(r: &RemoteSubnet) -> Vec<Flow> {
    let mut flows = vec![Flow::new(Table::VxlanIngress, 100, from_node(r.host_ip), vec![], Some(Table::Routing))];
    if let Some(s) = r.subnet {
        flows.extend(ipv4_flows(r, s));
    }
    if let Some(s6) = r.subnet6 {
        // The IPv6 twins (inside the same IPv4 VXLAN underlay): neighbour discovery for the
        // node's pods (table 50, as ARP) and IPv6 to them (90).
        let net = Some(cidr6(s6));
        let any = |eth| Match { eth, ..Default::default() };
        flows.extend([
            Flow::new(Table::ArpRemote, 100, any(nd(NS, None, None, net, None)), to_vxlan(r.host_ip, r.fixed_vnid), None),
            Flow::new(Table::ArpRemote, 100, any(nd(NA, None, net, None, None)), to_vxlan(r.host_ip, r.fixed_vnid), None),
            Flow::new(Table::RemoteIp, 100, any(ip6(None, net)), to_vxlan(r.host_ip, r.fixed_vnid), None),
        ]);
    }
    flows
}

fn ipv4_flows(r: &RemoteSubnet, subnet: Ipv4Net) -> Vec<Flow> {
    vec![
        Flow::new(
            Table::ArpRemote,
            100,
            Match::any().arp(ArpMatch { tpa: Some(cidr(subnet)), ..Default::default() }),
            to_vxlan(r.host_ip, r.fixed_vnid),
            None,
        ),
        Flow::new(
            Table::RemoteIp,
            100,
            Match::any().ipv4(Ipv4Match { dst: Some(cidr(subnet)), ..Default::default() }),
            to_vxlan(r.host_ip, r.fixed_vnid),
            None,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_variants() {
        let mut r = RemoteSubnet { subnet6: None, host_ip: "172.17.0.3".parse().unwrap(), subnet: Some("10.129.0.0/23".parse().unwrap()), fixed_vnid: None };
        let t: Vec<String> = flows(&r).iter().map(|f| f.to_string()).collect();
        assert_eq!(t[0], "table=10, priority=100,tun_src=172.17.0.3 actions=goto_table:30");
        assert_eq!(
            t[2],
            "table=90, priority=100,ip,nw_dst=10.129.0.0/23 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:172.17.0.3->tun_dst,output:1"
        );
        r.fixed_vnid = Some(Vnid::new(7).unwrap());
        let t: Vec<String> = flows(&r).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            t[1],
            "table=50, priority=100,arp,arp_tpa=10.129.0.0/23 actions=load:0x7->NXM_NX_TUN_ID[0..31],set_field:172.17.0.3->tun_dst,output:1"
        );
    }
}
