//! AddServiceRules / DeleteServiceRules: traffic to a service's cluster IP.

use std::net::{Ipv4Addr, Ipv6Addr};

use openflow::flow_match::{Ip6Proto, Ipv6Match};
use openflow::{IpFrag, IpProto, Ipv4Match, Masked, Match};

use super::{host, load, Flow, Reg, Table};
use crate::domain::{OfPort, Vnid};

/// Protocols a service port may use in this pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceProto {
    Tcp,
    Udp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePort {
    pub proto: ServiceProto,
    pub port: u16,
}

/// The service's flows: the blanket rule for later IP fragments (which carry no ports), then
/// one rule per port. All load the service's VNID into reg1 and tun0 into reg2.
pub fn flows(cluster_ip: Ipv4Addr, ports: &[ServicePort], vnid: Vnid) -> Vec<Flow> {
    let rule = |frag, proto| Match::any().ipv4(Ipv4Match { dst: Some(host(cluster_ip)), frag, proto, ..Default::default() });
    family_flows(ports, vnid, rule)
}

/// A dual-stack service's IPv6 flows: the same rules for its IPv6 cluster IP (`tcp6`, `udp6`).
pub fn ipv6_flows(cluster_ip6: Ipv6Addr, ports: &[ServicePort], vnid: Vnid) -> Vec<Flow> {
    let rule = |frag, proto: Option<IpProto>| {
        Match::any().ipv6(Ipv6Match { dst: Some(Masked::exact(cluster_ip6)), frag, proto: proto.map(Ip6Proto::L4), ..Default::default() })
    };
    family_flows(ports, vnid, rule)
}

fn family_flows(ports: &[ServicePort], vnid: Vnid, matching: impl Fn(Option<IpFrag>, Option<IpProto>) -> Match) -> Vec<Flow> {
    let actions = || vec![load(Reg::DstVnid, vnid.get()), load(Reg::OutPort, OfPort::TUN.0)];
    let rule = |frag, proto| Flow::new(Table::ServiceIp, 100, matching(frag, proto), actions(), Some(Table::Policy));
    let mut out = vec![rule(Some(IpFrag::Later), None)];
    for p in ports {
        let dst = Some(Masked::exact(p.port));
        out.push(rule(
            None,
            Some(match p.proto {
                ServiceProto::Tcp => IpProto::Tcp { dst },
                ServiceProto::Udp => IpProto::Udp { dst },
            }),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_text() {
        let ports = [ServicePort { proto: ServiceProto::Tcp, port: 80 }, ServicePort { proto: ServiceProto::Udp, port: 53 }];
        let t: Vec<String> = flows("172.30.0.10".parse().unwrap(), &ports, Vnid::new(11).unwrap()).iter().map(|f| f.to_string()).collect();
        let a = "actions=load:0xb->NXM_NX_REG1[],load:0x2->NXM_NX_REG2[],goto_table:80";
        assert_eq!(
            t,
            vec![
                format!("table=60, priority=100,ip,nw_dst=172.30.0.10,nw_frag=later {a}"),
                format!("table=60, priority=100,tcp,nw_dst=172.30.0.10,tp_dst=80 {a}"),
                format!("table=60, priority=100,udp,nw_dst=172.30.0.10,tp_dst=53 {a}"),
            ]
        );
    }
}
