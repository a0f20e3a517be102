//! setupPodFlows / cleanupPodFlows: a local pod's four flows.

use std::net::Ipv4Addr;

use openflow::{Action, ArpMatch, Ipv4Match, MacAddr, Masked, Match};

use super::{host, load, output, Flow, Reg, Table};
use crate::domain::{ContainerId, OfPort, Vnid};

/// What the pipeline needs to know about a local pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPort {
    pub ofport: OfPort,
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address (dual-stack).
    pub ip6: Option<std::net::Ipv6Addr>,
    pub mac: MacAddr,
    pub container_id: ContainerId,
    pub vnid: Vnid,
}

/// The pod's flows: ARP and IP from the pod (table 20, the ARP one carrying the container ID
/// as its note), ARP to the pod (40), IP to the pod (70).
pub fn flows(p: &PodPort) -> Vec<Flow> {
    let from_pod = |eth| Match { in_port: Some(p.ofport.into()), eth, ..Default::default() };
    vec![
        Flow::new(
            Table::PodIngress,
            100,
            from_pod(openflow::EthMatch::Arp(ArpMatch {
                spa: Some(host(p.ip)),
                sha: Some(Masked::exact(p.mac)),
                ..Default::default()
            })),
            vec![load(Reg::SrcVnid, p.vnid.get()), Action::note(p.container_id.bytes().to_vec())],
            Some(Table::PolicyConntrack),
        ),
        Flow::new(
            Table::PodIngress,
            100,
            from_pod(openflow::EthMatch::Ipv4(Ipv4Match { src: Some(host(p.ip)), ..Default::default() })),
            vec![load(Reg::SrcVnid, p.vnid.get())],
            Some(Table::PolicyConntrack),
        ),
        Flow::new(
            Table::ArpLocal,
            100,
            Match::any().arp(ArpMatch { tpa: Some(host(p.ip)), ..Default::default() }),
            vec![output(p.ofport)],
            None,
        ),
        Flow::new(
            Table::PodIp,
            100,
            Match::any().ipv4(Ipv4Match { dst: Some(host(p.ip)), ..Default::default() }),
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
            ip: "10.128.2.5".parse().unwrap(),
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
}
