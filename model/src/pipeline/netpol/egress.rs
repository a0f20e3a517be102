//! NetworkPolicy egress: where a local pod's connections are judged against the Egress
//! policies that select it (tables 21, 25, 27 and 28).
//!
//! A pod no Egress policy selects is untouched: table 21 commits its connections and routes
//! them, as before. For a pod some Egress policy selects, its namespace's owner adds:
//!
//! | table | priority | match | actions |
//! |---|---|---|---|
//! | 21 | 300 | `ip,nw_src=<pod>` | `ct(table=27,zone=Z)` (a lookup: nothing is committed before the verdict) |
//! | 25 | 150 | `ip,nw_src=<pod>` | `load:<VNID>->reg0`, `ct(table=27,zone=Z)` (its Service connections, after the node's DNAT) |
//! | 27 | 150 | rules (plain or conjunctive, see the parent module) | `ct(commit,zone=Z,exec(load:1->NXM_NX_CT_MARK[2]))`, `goto_table:28` |
//! | 27 | 100 | `ip,nw_src=<pod>` | `drop` |
//!
//! and every node has (networkpolicy plugin, base flows):
//!
//! | table | priority | match | actions |
//! |---|---|---|---|
//! | 27 | 300 | `ip,nw_dst=<gateway>` | `goto_table:28`: the node itself, as table 80 always admits it |
//! | 27 | 250 | `ip,nw_dst=<service network>` | `goto_table:28`: judged after the DNAT, when it comes back through table 25 |
//! | 27 | 200 | `ct_state=+rpl+trk,ip`, `ct_state=+est+trk,tcp` and `…,udp`, `ct_state=+trk,ct_mark=0x4/0x4,udp`, `ct_state=+rel+trk,ip` | `goto_table:28`: replies, TCP/UDP connections allowed when they began, UDP an egress rule allowed (one-way: never `+est`) |
//! | 27 | 0 | | `drop` |
//! | 28 | 100 | `ip,in_port=2` | `ct(commit,zone=Z,exec(load:1->NXM_NX_CT_MARK[0]),table=30)` (as table 25 commits) |
//! | 28 | 0 | `ip` | `ct(commit,zone=Z,table=30)` (as table 21 commits) |
//!
//! Why a lookup, then a commit after the verdict: a denied connection must leave no conntrack
//! entry, or its peer's packets would be taken for replies (table 80's priority-200 flow) and
//! reach the pod. The allowed entries of table 27 commit too, after their verdict, only to set
//! `ct_mark` bit 0x4 ([`via_host::EGRESS_ALLOWED_MARK`]: UDP so marked passes table 27 at 200,
//! as a one-way stream is never `+est`); table 28 then commits the same entry again (its
//! via-host bit is set masked, keeping 0x4). A Service connection is judged by its endpoint: the packet to the Service's
//! address passes table 27 (and is committed, as every pod's Service traffic is, so that the
//! un-NATed reply is known), the node's DNAT sends it back through tun0 with the endpoint's
//! address, and table 25 sends it to table 27 again. An endpoint outside the cluster network
//! (a host-network pod, the API server on a node address) is routed by the node itself and
//! never comes back to br0: that traffic is not judged (docs/networkpolicy.md lists it as unsupported).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use openflow::flow_match::ct_state;
use openflow::{Action, Ct, CtZone, Match};

use super::family::{any_ip, dst_net, host_match, Family};
use super::{Flow, NodeConfig, Side, Table};
use crate::domain::{OfPort, Vnid};
use crate::pipeline::via_host::{self, CT_ZONE};
use crate::pipeline::{load, Reg};

/// `ct(table=27,zone=Z)`: the connection's state, committing nothing.
fn lookup() -> Action {
    Action::Ct(Ct::new().zone(CtZone::Imm(CT_ZONE)).table(Table::PolicyEgress.id()))
}

/// The fixed flows of tables 27 and 28 (networkpolicy plugin); on a dual-stack node each
/// `ip` flow has its `ipv6` twin (the IPv6 gateway and service network).
pub fn base_flows(cfg: &NodeConfig) -> Vec<Flow> {
    let mut sides = vec![];
    if let Some(v4) = &cfg.ipv4 {
        sides.push((Family::V4, IpAddr::V4(v4.gateway()), IpNet::V4(v4.service_network)));
    }
    if let Some(v6) = &cfg.ipv6 {
        sides.push((Family::V6, IpAddr::V6(v6.gateway()), IpNet::V6(v6.service_network)));
    }
    let pass = |priority: u16, m: Match| Flow::new(Table::PolicyEgress, priority, m, vec![], Some(Table::PolicyEgressCommit));
    let mut table27 = Vec::new();
    let mut table28 = Vec::new();
    for &(family, gateway, service_network) in &sides {
        let state = |bit: u32| any_ip(family).ct_state(bit | ct_state::TRK, bit | ct_state::TRK);
        table27.extend([
            pass(300, host_match(gateway, false)),
            pass(250, dst_net(service_network)),
            // Replies, established TCP and UDP (not SCTP: see the plugin's table-80 flows), and
            // related packets (ICMP errors).
            pass(200, state(ct_state::RPL)),
            super::established(Table::PolicyEgress, family, openflow::IpProto::Tcp { dst: None }, vec![], Some(Table::PolicyEgressCommit)),
            super::established(Table::PolicyEgress, family, openflow::IpProto::Udp { dst: None }, vec![], Some(Table::PolicyEgressCommit)),
            // UDP an egress policy flow allowed (a one-way stream is never +est).
            super::allowed_udp(Side::Egress, family, vec![], Some(Table::PolicyEgressCommit)),
            pass(200, state(ct_state::REL)),
        ]);
        table28.extend([
            Flow::new(Table::PolicyEgressCommit, 100, any_ip(family).in_port(OfPort::TUN), vec![via_host::commit_marked(Table::Routing)], None),
            // ct() needs an IP match (OVS refuses it otherwise: OFPBAC_MATCH_INCONSISTENT).
            Flow::new(Table::PolicyEgressCommit, 0, any_ip(family), vec![via_host::commit(Table::Routing)], None),
        ]);
    }
    let mut flows = table27;
    flows.push(Flow::drop(Table::PolicyEgress, 0, Match::any()));
    flows.extend(table28);
    flows
}

/// The hooks of the pods some Egress policy selects, by each of their addresses (`ip` flows
/// for the IPv4 ones, `ipv6` for the IPv6 ones): their own packets (table 21) and their
/// Service connections back from the node (table 25, reloading `vnid`) go to table 27.
pub fn pod_hooks(pods: &[IpAddr], vnid: Option<Vnid>) -> Vec<Flow> {
    let mut flows = Vec::with_capacity(pods.len() * 2);
    for &pod in pods {
        let m = host_match(pod, true);
        flows.push(Flow::new(Table::PolicyConntrack, 300, m.clone(), vec![lookup()], None));
        if let Some(v) = vnid {
            flows.push(Flow::new(Table::ViaHost, 150, m, vec![load(Reg::SrcVnid, v.get()), lookup()], None));
        }
    }
    flows
}

/// [`pod_hooks`] of IPv4 pods only.
pub fn pod_hooks_v4(pods: &[Ipv4Addr], vnid: Option<Vnid>) -> Vec<Flow> {
    pod_hooks(&pods.iter().copied().map(IpAddr::V4).collect::<Vec<_>>(), vnid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Plugin;
    use crate::pipeline::NodeIpv6;

    fn cfg(dual: bool) -> NodeConfig {
        NodeConfig {
            plugin: Plugin::NetworkPolicy,
            ipv4: Some(crate::pipeline::NodeIpv4 {
                cluster_network: "10.128.0.0/14".parse().unwrap(),
                service_network: "172.30.0.0/16".parse().unwrap(),
                local_subnet: "10.128.2.0/23".parse().unwrap(),
            }),
            ipv6: dual.then(|| NodeIpv6 {
                cluster_network: "fd00:10:128::/48".parse().unwrap(),
                service_network: "fd00:172:30::/112".parse().unwrap(),
                local_subnet: "fd00:10:128:2::/64".parse().unwrap(),
            }),
        }
    }

    #[test]
    fn dual_stack_twins() {
        let t: Vec<String> = base_flows(&cfg(true)).iter().map(|f| f.to_string()).collect();
        for w in [
            "table=27, priority=300,ipv6,ipv6_dst=fd00:10:128:2::1 actions=goto_table:28",
            "table=27, priority=250,ipv6,ipv6_dst=fd00:172:30::/112 actions=goto_table:28",
            "table=27, priority=200,ct_state=+rpl+trk,ipv6 actions=goto_table:28",
            "table=27, priority=200,ct_state=+est+trk,tcp6 actions=goto_table:28",
            "table=27, priority=200,ct_state=+est+trk,udp6 actions=goto_table:28",
            "table=27, priority=200,ct_state=+trk,ct_mark=0x4/0x4,udp6 actions=goto_table:28",
            "table=27, priority=200,ct_state=+rel+trk,ipv6 actions=goto_table:28",
            "table=28, priority=100,ipv6,in_port=2 actions=ct(commit,table=30,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[0]))",
            "table=28, priority=0,ipv6 actions=ct(commit,table=30,zone=64000)",
        ] {
            assert!(t.contains(&w.to_string()), "missing {w}\n{}", t.join("\n"));
        }
        // Twice the IPv4 flows but one table-27 default drop.
        assert_eq!(t.len(), 2 * base_flows(&cfg(false)).len() - 1);
        let h: Vec<String> = pod_hooks(&["fd00:10:128:2::5".parse().unwrap()], Some(Vnid::new(11).unwrap())).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            h,
            vec![
                "table=21, priority=300,ipv6,ipv6_src=fd00:10:128:2::5 actions=ct(table=27,zone=64000)",
                "table=25, priority=150,ipv6,ipv6_src=fd00:10:128:2::5 actions=load:0xb->NXM_NX_REG0[],ct(table=27,zone=64000)",
            ]
        );
    }

    #[test]
    fn text() {
        let t: Vec<String> = base_flows(&cfg(false)).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            t,
            vec![
                "table=27, priority=300,ip,nw_dst=10.128.2.1 actions=goto_table:28",
                "table=27, priority=250,ip,nw_dst=172.30.0.0/16 actions=goto_table:28",
                "table=27, priority=200,ct_state=+rpl+trk,ip actions=goto_table:28",
                "table=27, priority=200,ct_state=+est+trk,tcp actions=goto_table:28",
                "table=27, priority=200,ct_state=+est+trk,udp actions=goto_table:28",
                "table=27, priority=200,ct_state=+trk,ct_mark=0x4/0x4,udp actions=goto_table:28",
                "table=27, priority=200,ct_state=+rel+trk,ip actions=goto_table:28",
                "table=27, priority=0 actions=drop",
                "table=28, priority=100,ip,in_port=2 actions=ct(commit,table=30,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[0]))",
                "table=28, priority=0,ip actions=ct(commit,table=30,zone=64000)",
            ]
        );
        let h: Vec<String> = pod_hooks_v4(&["10.128.2.5".parse().unwrap()], Some(Vnid::new(11).unwrap())).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            h,
            vec![
                "table=21, priority=300,ip,nw_src=10.128.2.5 actions=ct(table=27,zone=64000)",
                "table=25, priority=150,ip,nw_src=10.128.2.5 actions=load:0xb->NXM_NX_REG0[],ct(table=27,zone=64000)",
            ]
        );
    }
}
