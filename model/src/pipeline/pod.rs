//! setupPodFlows / cleanupPodFlows: a local pod's four flows.

use std::net::Ipv4Addr;

use openflow::{Action, ArpMatch, Ipv4Match, MacAddr, Masked, Match};

use super::{host, icmp6, ip6, link_local6, load, nd, output, Flow, Reg, Table, NA, NS};
use crate::domain::{ContainerId, OfPort, Vnid};

/// What the pipeline needs to know about a local pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPort {
    pub ofport: OfPort,
    /// The pod's IPv4 address (`None` on an IPv6-only node).
    pub ip: Option<Ipv4Addr>,
    /// The pod's IPv6 address (dual-stack, IPv6-only).
    pub ip6: Option<std::net::Ipv6Addr>,
    pub mac: MacAddr,
    pub container_id: ContainerId,
    pub vnid: Vnid,
}

/// The pod's flows: ARP and IP from the pod (table 20, the ARP one carrying the container ID
/// as its note), ARP to the pod (40), IP to the pod (70); and for a pod with an IPv6 address
/// the IPv6 twins ([`ipv6_flows`]). An IPv6-only pod's container ID rides on its plain
/// `ipv6` table-20 flow (it has no ARP flow).
pub fn flows(p: &PodPort) -> Vec<Flow> {
    let mut flows = p.ip.map(|ip| ipv4_flows(p, ip)).unwrap_or_default();
    if let Some(ip6) = p.ip6 {
        flows.extend(ipv6_flows(p, ip6));
    }
    flows
}

/// A dual-stack pod's IPv6 flows. Spoofguard (table 20): IPv6 only from the pod's address;
/// ICMPv6 also from a link-local address (MLD, router solicitation: the kernel sends them
/// from fe80::/10, as Antrea allows); neighbour discovery only about itself — a solicitation
/// from its address carrying its MAC, an advertisement of its own address with its MAC or no
/// link-layer option — and straight to routing (table 30), as ARP bypasses conntrack; other
/// ND from the pod is dropped (it would poison neighbours' caches). A duplicate address
/// detection probe (from `::`, no link-layer option) passes for the pod's own address only,
/// and reaches whoever table 40 says holds it: the pod itself (the probe is not sent back out
/// of its in_port, and the kernel's DAD succeeds), or another port that still answers for the
/// address, whose answer makes the ADD fail rather than leave two pods on one address.
/// Tables 40 and 70 deliver a
/// solicitation for the pod's address and an advertisement or IPv6 packet to it.
pub fn ipv6_flows(p: &PodPort, ip6_addr: std::net::Ipv6Addr) -> Vec<Flow> {
    let from_pod = |eth| Match { in_port: Some(p.ofport.into()), eth, ..Default::default() };
    let me = Some(Masked::exact(ip6_addr));
    let vnid = || vec![load(Reg::SrcVnid, p.vnid.get())];
    let mut noted = vnid();
    if p.ip.is_none() {
        noted.push(Action::note(p.container_id.bytes().to_vec()));
    }
    vec![
        Flow::new(Table::PodIngress, 110, from_pod(nd(NS, me, None, None, Some(p.mac))), vnid(), Some(Table::Routing)),
        Flow::new(
            Table::PodIngress,
            110,
            from_pod(nd(NS, Some(Masked::exact(std::net::Ipv6Addr::UNSPECIFIED)), None, me, None)),
            vnid(),
            Some(Table::Routing),
        ),
        Flow::new(Table::PodIngress, 110, from_pod(nd(NA, me, None, me, Some(p.mac))), vnid(), Some(Table::Routing)),
        Flow::new(Table::PodIngress, 110, from_pod(nd(NA, me, None, me, Some(openflow::MacAddr([0; 6])))), vnid(), Some(Table::Routing)),
        Flow::drop(Table::PodIngress, 105, from_pod(nd(NS, None, None, None, None))),
        Flow::drop(Table::PodIngress, 105, from_pod(nd(NA, None, None, None, None))),
        Flow::new(Table::PodIngress, 100, from_pod(ip6(me, None)), noted, Some(Table::PolicyConntrack)),
        Flow::new(Table::PodIngress, 100, from_pod(icmp6(Some(super::cidr6(link_local6())))), vnid(), Some(Table::PolicyConntrack)),
        Flow::new(Table::ArpLocal, 100, Match { eth: nd(NS, None, None, me, None), ..Default::default() }, vec![output(p.ofport)], None),
        Flow::new(Table::ArpLocal, 100, Match { eth: nd(NA, None, me, None, None), ..Default::default() }, vec![output(p.ofport)], None),
        Flow::new(
            Table::PodIp,
            100,
            Match { eth: ip6(None, me), ..Default::default() },
            vec![load(Reg::DstVnid, p.vnid.get()), load(Reg::OutPort, p.ofport.0)],
            Some(Table::Policy),
        ),
    ]
}

fn ipv4_flows(p: &PodPort, ip: Ipv4Addr) -> Vec<Flow> {
    let from_pod = |eth| Match { in_port: Some(p.ofport.into()), eth, ..Default::default() };
    vec![
        Flow::new(
            Table::PodIngress,
            100,
            from_pod(openflow::EthMatch::Arp(ArpMatch {
                spa: Some(host(ip)),
                sha: Some(Masked::exact(p.mac)),
                ..Default::default()
            })),
            vec![load(Reg::SrcVnid, p.vnid.get()), Action::note(p.container_id.bytes().to_vec())],
            Some(Table::PolicyConntrack),
        ),
        Flow::new(
            Table::PodIngress,
            100,
            from_pod(openflow::EthMatch::Ipv4(Ipv4Match { src: Some(host(ip)), ..Default::default() })),
            vec![load(Reg::SrcVnid, p.vnid.get())],
            Some(Table::PolicyConntrack),
        ),
        Flow::new(
            Table::ArpLocal,
            100,
            Match::any().arp(ArpMatch { tpa: Some(host(ip)), ..Default::default() }),
            vec![output(p.ofport)],
            None,
        ),
        Flow::new(
            Table::PodIp,
            100,
            Match::any().ipv4(Ipv4Match { dst: Some(host(ip)), ..Default::default() }),
            vec![load(Reg::DstVnid, p.vnid.get()), load(Reg::OutPort, p.ofport.0)],
            Some(Table::Policy),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_text() {
        let p = PodPort {
            ip6: None,
            ofport: OfPort(3),
            ip: Some("10.128.2.5".parse().unwrap()),
            mac: "0a:58:0a:80:02:05".parse().unwrap(),
            container_id: ContainerId::parse(&"ab".repeat(32)).unwrap(),
            vnid: Vnid::new(11).unwrap(),
        };
        let t: Vec<String> = flows(&p).iter().map(|f| f.to_string()).collect();
        let note = vec!["ab"; 32].join(".") + ".00.00.00.00.00.00";
        assert_eq!(
            t,
            vec![
                format!("table=20, priority=100,arp,in_port=3,arp_spa=10.128.2.5,arp_sha=0a:58:0a:80:02:05 actions=load:0xb->NXM_NX_REG0[],note:{note},goto_table:21"),
                "table=20, priority=100,ip,in_port=3,nw_src=10.128.2.5 actions=load:0xb->NXM_NX_REG0[],goto_table:21".to_string(),
                "table=40, priority=100,arp,arp_tpa=10.128.2.5 actions=output:3".to_string(),
                "table=70, priority=100,ip,nw_dst=10.128.2.5 actions=load:0xb->NXM_NX_REG1[],load:0x3->NXM_NX_REG2[],goto_table:80".to_string(),
            ]
        );
    }

    #[test]
    fn ipv6_text() {
        let p = PodPort {
            ofport: OfPort(3),
            ip: Some("10.128.2.5".parse().unwrap()),
            ip6: Some("fd00:10:128:2::5".parse().unwrap()),
            mac: "0a:58:0a:80:02:05".parse().unwrap(),
            container_id: ContainerId::parse(&"ab".repeat(32)).unwrap(),
            vnid: Vnid::new(11).unwrap(),
        };
        let t: Vec<String> = flows(&p).iter().skip(4).map(|f| f.to_string()).collect();
        let v = "load:0xb->NXM_NX_REG0[]";
        assert_eq!(
            t,
            vec![
                format!("table=20, priority=110,icmp6,in_port=3,ipv6_src=fd00:10:128:2::5,icmp_type=135,nd_sll=0a:58:0a:80:02:05 actions={v},goto_table:30"),
                format!("table=20, priority=110,icmp6,in_port=3,ipv6_src=::,icmp_type=135,nd_target=fd00:10:128:2::5 actions={v},goto_table:30"),
                format!("table=20, priority=110,icmp6,in_port=3,ipv6_src=fd00:10:128:2::5,icmp_type=136,nd_target=fd00:10:128:2::5,nd_tll=0a:58:0a:80:02:05 actions={v},goto_table:30"),
                format!("table=20, priority=110,icmp6,in_port=3,ipv6_src=fd00:10:128:2::5,icmp_type=136,nd_target=fd00:10:128:2::5,nd_tll=00:00:00:00:00:00 actions={v},goto_table:30"),
                "table=20, priority=105,icmp6,in_port=3,icmp_type=135 actions=drop".to_string(),
                "table=20, priority=105,icmp6,in_port=3,icmp_type=136 actions=drop".to_string(),
                format!("table=20, priority=100,ipv6,in_port=3,ipv6_src=fd00:10:128:2::5 actions={v},goto_table:21"),
                format!("table=20, priority=100,icmp6,in_port=3,ipv6_src=fe80::/10 actions={v},goto_table:21"),
                "table=40, priority=100,icmp6,icmp_type=135,nd_target=fd00:10:128:2::5 actions=output:3".to_string(),
                "table=40, priority=100,icmp6,ipv6_dst=fd00:10:128:2::5,icmp_type=136 actions=output:3".to_string(),
                "table=70, priority=100,ipv6,ipv6_dst=fd00:10:128:2::5 actions=load:0xb->NXM_NX_REG1[],load:0x3->NXM_NX_REG2[],goto_table:80".to_string(),
            ]
        );
    }

    /// An IPv6-only pod: its IPv6 flows and no IPv4 one, its container ID on its plain
    /// `ipv6` table-20 flow; its MAC from its IPv6 address.
    #[test]
    fn ipv6_only_text() {
        let ip6: std::net::Ipv6Addr = "fd00:10:128:2::5".parse().unwrap();
        let p = PodPort {
            ofport: OfPort(3),
            ip: None,
            ip6: Some(ip6),
            mac: crate::domain::pod_mac(ip6),
            container_id: ContainerId::parse(&"ab".repeat(32)).unwrap(),
            vnid: Vnid::new(11).unwrap(),
        };
        assert_eq!(p.mac.to_string(), "0a:58:00:00:00:05");
        let t: Vec<String> = flows(&p).iter().map(|f| f.to_string()).collect();
        assert_eq!(t.len(), 11, "{t:#?}");
        assert!(t.iter().all(|f| f.contains("ipv6") || f.contains("icmp6")), "{t:#?}");
        let note = vec!["ab"; 32].join(".") + ".00.00.00.00.00.00";
        assert!(t.contains(&format!("table=20, priority=100,ipv6,in_port=3,ipv6_src=fd00:10:128:2::5 actions=load:0xb->NXM_NX_REG0[],note:{note},goto_table:21")), "{t:#?}");
    }
}
