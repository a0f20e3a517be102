//! The benchmark's synthetic node: a multitenant cluster with M pods in a /18 local subnet.
//! Pods' flows use synthetic ofports (no OVSDB ports): ports are not what is measured.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use sdn_node::domain::{ContainerId, OfPort, Plugin, Vnid};
use sdn_node::pipeline::egress::{self, Policy, Rule, RuleType, Target};
use sdn_node::pipeline::pod::PodPort;
use sdn_node::pipeline::{base, pod, policy, Flow, NodeConfig};
use sdn_node::store::{DesiredState, Owner};

/// VNIDs the synthetic pods spread over.
pub const VNIDS: u32 = 50;

pub fn node() -> NodeConfig {
    NodeConfig { ipv6: None, plugin: Plugin::Multitenant, ipv4: Some(node4()) }
}

/// The node's (IPv4) networks.
pub fn node4() -> sdn_node::pipeline::NodeIpv4 {
    sdn_node::pipeline::NodeIpv4 {
        cluster_network: "10.128.0.0/14".parse().unwrap_or_default(),
        service_network: "172.30.0.0/16".parse().unwrap_or_default(),
        local_subnet: "10.128.0.0/18".parse().unwrap_or_default(),
    }
}

/// Pod number `i` (0-based): IP 10.128.0.10 + i, ofport 10 + i, VNID 100 + i % 50.
pub fn pod(i: u32) -> (Owner, PodPort) {
    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 10)) + i);
    let mut id = [0u8; 32];
    id[..4].copy_from_slice(&i.to_be_bytes());
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let p = PodPort {
        ip6: None,
        ofport: OfPort(10 + i),
        ip: Some(ip),
        mac: sdn_node::domain::pod_mac(ip),
        container_id: ContainerId::parse(&hex).unwrap_or_else(|_| unreachable_id()),
        vnid: Vnid::new(100 + i % VNIDS).unwrap_or(Vnid::GLOBAL),
    };
    (Owner::Pod { namespace: format!("ns-{}", i % VNIDS), name: format!("pod-{i}") }, p)
}

fn unreachable_id() -> ContainerId {
    // 64 hex characters always parse; kept total for the no-panic rule.
    ContainerId::parse(&"0".repeat(64)).unwrap_or_else(|_| unreachable_id())
}

pub fn pod_flows(i: u32) -> (Owner, Vec<Flow>) {
    let (owner, p) = pod(i);
    (owner, pod::flows(&p))
}

/// Base pipeline + `m` pods + a VNID rule for each VNID in use.
pub fn desired(m: u32) -> DesiredState {
    let cfg = node();
    let mut d = DesiredState::default();
    let _ = d.set(Owner::Base, base::flows(&cfg));
    let _ = d.set(Owner::Version, vec![base::version_flow(cfg.plugin)]);
    let _ = d.set(Owner::PolicyPlugin, policy::plugin_flows(&cfg));
    for v in 0..VNIDS.min(m) {
        let vnid = Vnid::new(100 + v).unwrap_or(Vnid::GLOBAL);
        let _ = d.set(Owner::VnidRule { vnid }, vec![policy::vnid_flow(vnid)]);
    }
    for i in 0..m {
        let (o, f) = pod_flows(i);
        let _ = d.set(o, f);
    }
    d
}

/// A one-policy egress rule set of `rules` rules for VNID 100: allow `rules - 1` /24s in
/// `first_octet.x.y.0`, then deny everything.
pub fn egress_flows(rules: u32, first_octet: u8) -> (Owner, Vec<Flow>) {
    let vnid = Vnid::new(100).unwrap_or(Vnid::GLOBAL);
    let mut r: Vec<Rule> = (0..rules.saturating_sub(1))
        .map(|k| Rule {
            kind: RuleType::Allow,
            to: Target::Cidr(Ipv4Net::new(Ipv4Addr::new(first_octet, (k >> 8) as u8, k as u8, 0), 24).unwrap_or_default()),
        })
        .collect();
    r.push(Rule { kind: RuleType::Deny, to: Target::Cidr(Ipv4Net::default()) });
    let p = Policy { namespace: "ns-0".into(), name: "default".into(), rules: r };
    let out = egress::flows(vnid, &[p], &["ns-0".into()], &Default::default());
    (Owner::EgressPolicy { vnid }, out.flows)
}

/// The seed's setupPodFlows text for pod `i` (ovscontroller.go's format strings).
pub fn seed_setup_text(i: u32) -> String {
    seed_setup_text_for(&pod(i).1)
}

/// The seed's setupPodFlows text for a pod.
pub fn seed_setup_text_for(p: &PodPort) -> String {
    let note: Vec<String> = p.container_id.bytes().iter().map(|b| format!("{b:02x}")).collect();
    let note = note.join(".");
    let (port, ip, mac, vnid) = (p.ofport.0, p.ip.unwrap_or(Ipv4Addr::UNSPECIFIED), p.mac, p.vnid.get());
    format!(
        "add table=20, priority=100, in_port={port}, arp, nw_src={ip}, arp_sha={mac}, actions=load:{vnid}->NXM_NX_REG0[], note:{note}, goto_table:21\n\
         add table=20, priority=100, in_port={port}, ip, nw_src={ip}, actions=load:{vnid}->NXM_NX_REG0[], goto_table:21\n\
         add table=40, priority=100, arp, nw_dst={ip}, actions=output:{port}\n\
         add table=70, priority=100, ip, nw_dst={ip}, actions=load:{vnid}->NXM_NX_REG1[], load:{port}->NXM_NX_REG2[], goto_table:80\n"
    )
}

/// The seed's cleanupPodFlows text: four loose deletes over every table.
pub fn seed_teardown_text(i: u32) -> String {
    seed_teardown_text_for(pod(i).1.ip.unwrap_or(Ipv4Addr::UNSPECIFIED))
}

/// The seed's cleanupPodFlows text for a pod's address.
pub fn seed_teardown_text_for(ip: Ipv4Addr) -> String {
    format!("delete ip, nw_dst={ip}\ndelete ip, nw_src={ip}\ndelete arp, nw_dst={ip}\ndelete arp, nw_src={ip}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let d = desired(200);
        assert_eq!(d.flows_of(&pod(7).0).len(), 4);
        assert!(seed_setup_text(7).contains("in_port=17, arp, nw_src=10.128.0.17"));
        assert_eq!(egress_flows(1000, 20).1.len(), 1000);
        assert_ne!(pod(1).1.container_id, pod(2).1.container_id);
    }
}
