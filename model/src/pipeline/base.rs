//! SetupOVS: the flows every node has, independent of pods and services.

use openflow::{Action, ArpMatch, EthMatch, Ipv4Match, Match, RegMove, Subfield};

use super::{
    cidr, cidr6, host, ip, ip6, multicast_net, multicast_net6, nd, output, output_reg2, tun_id_low32, Flow, NodeConfig, NodeIpv4,
    NodeIpv6, Reg, Table, NA, NS,
};
use crate::domain::OfPort;

/// `move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[]`: the sender's VNID from the VXLAN header.
fn tun_id_to_reg0() -> Action {
    // Both sides are 32 bits wide, so the move is always valid.
    Action::RegMove(
        RegMove::new(tun_id_low32(), Subfield::whole(Reg::SrcVnid.field()))
            .expect("TUN_ID[0..31] and REG0[] are both 32 bits"),
    )
}

/// Every base flow of SetupOVS: the family-neutral ones (each table's default), then the
/// IPv4 ones ([`ipv4_flows`], in the seed's order) and the IPv6 ones ([`ipv6_flows`]) for the
/// families the node has. The table-111 flow is not here: it is owned by the VXLAN multicast
/// state ([`super::multicast::vxlan_flow`]), which writes it.
pub fn flows(cfg: &NodeConfig) -> Vec<Flow> {
    use Table::*;
    let networkpolicy = cfg.plugin == crate::domain::Plugin::NetworkPolicy;
    // Table 60: in networkpolicy mode every pod may reach every service (policies apply at
    // the endpoints, as Kubernetes defines them; openshift-sdn VERSION 4 does the same);
    // otherwise VNID 0 may reach every service and the services' own flows admit the rest.
    let services = if networkpolicy { Match::any() } else { Match::any().reg(Reg::SrcVnid.n(), 0) };
    let mut flows = vec![
        // Table 0: whatever the families' flows do not take from vxlan0 and tun0, and the rest.
        Flow::drop(Classify, 150, Match::any().in_port(OfPort::VXLAN)),
        Flow::drop(Classify, 150, Match::any().in_port(OfPort::TUN)),
        Flow::drop(Classify, 0, Match::any()),
        // Table 10: VXLAN ingress filtering, filled by host subnets.
        Flow::drop(VxlanIngress, 0, Match::any()),
        // Table 20: from a container, filled by pods.
        Flow::drop(PodIngress, 0, Match::any()),
        // Table 21: conntrack hook for NetworkPolicy.
        Flow::new(PolicyConntrack, 0, Match::any(), vec![], Some(Routing)),
        // Table 40: ARP to local pods, filled by pods.
        Flow::drop(ArpLocal, 0, Match::any()),
        // Table 50: ARP to remote pods, filled by host subnets.
        Flow::drop(ArpRemote, 0, Match::any()),
        // Table 60: services; VNID 0 may reach every service.
        Flow::new(ServiceIp, 200, services, vec![output(OfPort::TUN)], None),
        Flow::drop(ServiceIp, 0, Match::any()),
        // Table 70: IP to local pods, filled by pods.
        Flow::drop(PodIp, 0, Match::any()),
        // Table 80: the rest comes from the plugin.
        Flow::drop(Policy, 0, Match::any()),
        // Table 90: IP to remote pods, filled by host subnets.
        Flow::drop(RemoteIp, 0, Match::any()),
        // Table 100: egress policy dispatch; default: out through tun0.
        Flow::new(EgressPolicy, 0, Match::any(), vec![output(OfPort::TUN)], None),
        // Table 110: outbound multicast filtering.
        Flow::drop(MulticastOut, 0, Match::any()),
        // Table 120: multicast to local pods.
        Flow::drop(MulticastLocal, 0, Match::any()),
    ];
    if let Some(v4) = &cfg.ipv4 {
        flows.extend(ipv4_flows(v4));
    }
    if let Some(v6) = &cfg.ipv6 {
        flows.extend(ipv6_flows(v6));
    }
    if networkpolicy {
        flows.extend(super::netpol::base_flows(cfg));
    }
    flows
}

/// The IPv4 base flows of SetupOVS (the seed's, in its order), and ARP.
pub fn ipv4_flows(v4: &NodeIpv4) -> Vec<Flow> {
    use Table::*;
    let vxlan = OfPort::VXLAN;
    let tun = OfPort::TUN;
    let cluster = cidr(v4.cluster_network);
    let local = cidr(v4.local_subnet);
    let gw = host(v4.gateway());
    let arp = |spa, tpa| EthMatch::Arp(ArpMatch { spa, tpa, ..Default::default() });
    let ipm = |src, dst| EthMatch::Ipv4(Ipv4Match { src, dst, ..Default::default() });
    let mcast = cidr(multicast_net());
    let with = |port: Option<OfPort>, eth: EthMatch| Match { in_port: port.map(Into::into), eth, ..Default::default() };
    vec![
        // Table 0: initial dispatch based on in_port. vxlan0:
        Flow::new(Classify, 200, with(Some(vxlan), arp(Some(cluster), Some(local))), vec![tun_id_to_reg0()], Some(VxlanIngress)),
        Flow::new(Classify, 200, with(Some(vxlan), ipm(Some(cluster), Some(local))), vec![tun_id_to_reg0()], Some(VxlanIngress)),
        Flow::new(Classify, 200, with(Some(vxlan), ipm(Some(cluster), Some(mcast))), vec![tun_id_to_reg0()], Some(VxlanIngress)),
        // tun0:
        Flow::drop(Classify, 250, with(Some(tun), ipm(None, Some(mcast)))),
        Flow::new(Classify, 200, with(Some(tun), arp(Some(gw), Some(cluster))), vec![], Some(Routing)),
        Flow::new(Classify, 200, with(Some(tun), ipm(None, None)), vec![], Some(Routing)),
        // else, from a container:
        Flow::new(Classify, 100, with(None, arp(None, None)), vec![], Some(PodIngress)),
        Flow::new(Classify, 100, with(None, ipm(None, None)), vec![], Some(PodIngress)),
        // Table 30: general routing.
        Flow::new(Routing, 300, with(None, arp(None, Some(gw))), vec![output(tun)], None),
        Flow::new(Routing, 200, with(None, arp(None, Some(local))), vec![], Some(ArpLocal)),
        Flow::new(Routing, 100, with(None, arp(None, Some(cluster))), vec![], Some(ArpRemote)),
        Flow::new(Routing, 300, with(None, ipm(None, Some(gw))), vec![output(tun)], None),
        Flow::new(Routing, 100, with(None, ipm(None, Some(cidr(v4.service_network)))), vec![], Some(ServiceIp)),
        Flow::new(Routing, 200, with(None, ipm(None, Some(local))), vec![], Some(PodIp)),
        Flow::new(Routing, 100, with(None, ipm(None, Some(cluster))), vec![], Some(RemoteIp)),
        // Multicast coming from the VXLAN, and from local pods.
        Flow::new(Routing, 50, with(Some(vxlan), ipm(None, Some(mcast))), vec![], Some(MulticastLocal)),
        Flow::new(Routing, 25, with(None, ipm(None, Some(mcast))), vec![], Some(MulticastOut)),
        Flow::new(Routing, 0, Match::any().ipv4(ip()), vec![], Some(EgressPolicy)),
        Flow::drop(Routing, 0, with(None, arp(None, None))),
        // Table 80: the gateway may always deliver.
        Flow::new(Policy, 300, with(None, ipm(Some(gw), None)), vec![output_reg2()], None),
    ]
}

/// The IPv6 twins of the base flows (dual-stack, IPv6-only), and neighbour discovery where the IPv4
/// flows handle ARP:
///
/// | table | priority | match | actions |
/// |---|---|---|---|
/// | 0 | 200 | `ipv6,in_port=1,ipv6_src=<cluster6>,ipv6_dst=<local6>` | VNID from the tunnel, `goto_table:10` |
/// | 0 | 200 | `ipv6,in_port=1,ipv6_src=<cluster6>,ipv6_dst=ff00::/8` | same (multicast, and solicitations) |
/// | 0 | 300 | `icmp6,in_port=2,icmp_type=135` | `goto_table:30` (the node's solicitations) |
/// | 0 | 250 | `ipv6,in_port=2,ipv6_dst=ff00::/8` | `drop` |
/// | 0 | 200 | `ipv6,in_port=2` | `goto_table:30` |
/// | 0 | 100 | `ipv6` | `goto_table:20` (from a pod) |
/// | 30 | 300 | `icmp6,icmp_type=135,nd_target=<gateway6>` / `ipv6,ipv6_dst=<gateway6>` | `output:2` |
/// | 30 | 250 | `icmp6,icmp_type=135,nd_target=<local6>` / `icmp6,icmp_type=136,ipv6_dst=<local6>` | `goto_table:40` |
/// | 30 | 150 | the same for `<cluster6>` | `goto_table:50` |
/// | 30 | 120 | `icmp6,icmp_type=135` / `icmp6,icmp_type=136` | `drop` (to no one we know) |
/// | 30 | 300/100/200/100 | `ipv6,ipv6_dst=` gateway6 / service6 / local6 / cluster6 | tun0 / 60 / 70 / 90 |
/// | 30 | 50, 25 | `ipv6,ipv6_dst=ff00::/8` from vxlan0 / else | 120 / 110 |
/// | 30 | 0 | `ipv6` | `goto_table:100` |
/// | 80 | 300 | `ipv6,ipv6_src=<gateway6>` | `output:NXM_NX_REG2[]` |
pub fn ipv6_flows(v6: &NodeIpv6) -> Vec<Flow> {
    use Table::*;
    let (vxlan, tun) = (OfPort::VXLAN, OfPort::TUN);
    let cluster = cidr6(v6.cluster_network);
    let local = cidr6(v6.local_subnet);
    let gw = openflow::Masked::exact(v6.gateway());
    let mcast = cidr6(multicast_net6());
    let with = |port: Option<OfPort>, eth: EthMatch| Match { in_port: port.map(Into::into), eth, ..Default::default() };
    let any = |eth: EthMatch| with(None, eth);
    vec![
        Flow::new(Classify, 200, with(Some(vxlan), ip6(Some(cluster), Some(local))), vec![tun_id_to_reg0()], Some(VxlanIngress)),
        Flow::new(Classify, 200, with(Some(vxlan), ip6(Some(cluster), Some(mcast))), vec![tun_id_to_reg0()], Some(VxlanIngress)),
        Flow::new(Classify, 300, with(Some(tun), nd(NS, None, None, None, None)), vec![], Some(Routing)),
        Flow::drop(Classify, 250, with(Some(tun), ip6(None, Some(mcast)))),
        Flow::new(Classify, 200, with(Some(tun), ip6(None, None)), vec![], Some(Routing)),
        Flow::new(Classify, 100, any(ip6(None, None)), vec![], Some(PodIngress)),
        // Neighbour discovery, as ARP.
        Flow::new(Routing, 300, any(nd(NS, None, None, Some(gw), None)), vec![output(tun)], None),
        Flow::new(Routing, 250, any(nd(NS, None, None, Some(local), None)), vec![], Some(ArpLocal)),
        Flow::new(Routing, 250, any(nd(NA, None, Some(local), None, None)), vec![], Some(ArpLocal)),
        Flow::new(Routing, 150, any(nd(NS, None, None, Some(cluster), None)), vec![], Some(ArpRemote)),
        Flow::new(Routing, 150, any(nd(NA, None, Some(cluster), None, None)), vec![], Some(ArpRemote)),
        Flow::drop(Routing, 120, any(nd(NS, None, None, None, None))),
        Flow::drop(Routing, 120, any(nd(NA, None, None, None, None))),
        // IP routing, as IPv4.
        Flow::new(Routing, 300, any(ip6(None, Some(gw))), vec![output(tun)], None),
        Flow::new(Routing, 100, any(ip6(None, Some(cidr6(v6.service_network)))), vec![], Some(ServiceIp)),
        Flow::new(Routing, 200, any(ip6(None, Some(local))), vec![], Some(PodIp)),
        Flow::new(Routing, 100, any(ip6(None, Some(cluster))), vec![], Some(RemoteIp)),
        Flow::new(Routing, 50, with(Some(vxlan), ip6(None, Some(mcast))), vec![], Some(MulticastLocal)),
        Flow::new(Routing, 25, any(ip6(None, Some(mcast))), vec![], Some(MulticastOut)),
        Flow::new(Routing, 0, any(ip6(None, None)), vec![], Some(EgressPolicy)),
        Flow::new(Policy, 300, any(ip6(Some(gw), None)), vec![output_reg2()], None),
    ]
}

/// Table 253: the rule version note `%02X.%02X` (plugin id, VERSION).
pub fn version_flow(plugin: crate::domain::Plugin) -> Flow {
    Flow::new(Table::Version, super::DEFAULT_PRIORITY, Match::any(), vec![Action::note(version_note(plugin))], None)
}

/// The note bytes the seed's AlreadySetUp looks for (a prefix of the stored note).
pub fn version_note(plugin: crate::domain::Plugin) -> [u8; 2] {
    [plugin.id(), super::VERSION]
}

/// The seed's AlreadySetUp: the switch holds the table-253 version note of this plugin and
/// pipeline VERSION (a prefix match on the note, as the seed's `NoteHasPrefix`).
pub fn already_set_up(flows: &[openflow::FlowStats], plugin: crate::domain::Plugin) -> bool {
    let want = version_note(plugin);
    flows.iter().filter(|f| f.table_id == Table::Version.id()).any(|f| {
        f.instructions.iter().any(|i| match i {
            openflow::Instruction::ApplyActions(acts) => {
                acts.iter().any(|a| matches!(a, Action::Note(n) if n.has_prefix(&want)))
            }
            _ => false,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Plugin;

    fn cfg() -> NodeConfig {
        NodeConfig {
            ipv6: None,
            plugin: Plugin::Multitenant,
            ipv4: Some(NodeIpv4 {
                cluster_network: "10.128.0.0/14".parse().unwrap(),
                service_network: "172.30.0.0/16".parse().unwrap(),
                local_subnet: "10.128.2.0/23".parse().unwrap(),
            }),
        }
    }

    #[test]
    fn text_matches_the_seed() {
        let text: Vec<String> = flows(&cfg()).iter().map(|f| f.to_string()).collect();
        for want in [
            "priority=200,arp,in_port=1,arp_spa=10.128.0.0/14,arp_tpa=10.128.2.0/23 actions=move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],goto_table:10",
            "priority=250,ip,in_port=2,nw_dst=224.0.0.0/4 actions=drop",
            "priority=200,arp,in_port=2,arp_spa=10.128.2.1,arp_tpa=10.128.0.0/14 actions=goto_table:30",
            "priority=0 actions=drop",
            "table=21, priority=0 actions=goto_table:30",
            "table=60, priority=200,reg0=0 actions=output:2",
            "table=80, priority=300,ip,nw_src=10.128.2.1 actions=output:NXM_NX_REG2[]",
            "table=30, priority=0,ip actions=goto_table:100",
        ] {
            assert!(text.iter().any(|t| t == want), "missing {want}\n{}", text.join("\n"));
        }
        assert_eq!(version_flow(Plugin::Multitenant).to_string(), "table=253, actions=note:01.03.00.00.00.00");
    }

    #[test]
    fn already_set_up_reads_the_version_note() {
        let stats = |f: &Flow| openflow::FlowStats {
            table_id: f.table.id(),
            duration_sec: 0,
            duration_nsec: 0,
            priority: f.priority,
            idle_timeout: 0,
            hard_timeout: 0,
            flags: Default::default(),
            cookie: 0,
            packet_count: 0,
            byte_count: 0,
            match_: f.match_.clone(),
            instructions: f.instructions.clone(),
        };
        let mt = stats(&version_flow(Plugin::Multitenant));
        assert!(already_set_up(std::slice::from_ref(&mt), Plugin::Multitenant));
        assert!(!already_set_up(std::slice::from_ref(&mt), Plugin::Subnet), "other plugin");
        assert!(!already_set_up(&[], Plugin::Multitenant), "empty switch");
        let old = Flow::new(Table::Version, super::super::DEFAULT_PRIORITY, Match::any(), vec![Action::note([1, 2])], None);
        assert!(!already_set_up(&[stats(&old)], Plugin::Multitenant), "older VERSION");
    }

    fn cfg6() -> NodeConfig {
        NodeConfig {
            ipv6: Some(NodeIpv6 {
                cluster_network: "fd00:10:128::/48".parse().unwrap(),
                service_network: "fd00:172:30::/112".parse().unwrap(),
                local_subnet: "fd00:10:128:2::/64".parse().unwrap(),
            }),
            ..cfg()
        }
    }

    /// The IPv6 twins print as ovs-ofctl prints them, and only a dual-stack node has them.
    #[test]
    fn ipv6_text() {
        let text: Vec<String> = flows(&cfg6()).iter().map(|f| f.to_string()).collect();
        for want in [
            "priority=200,ipv6,in_port=1,ipv6_src=fd00:10:128::/48,ipv6_dst=fd00:10:128:2::/64 actions=move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],goto_table:10",
            "priority=300,icmp6,in_port=2,icmp_type=135 actions=goto_table:30",
            "priority=250,ipv6,in_port=2,ipv6_dst=ff00::/8 actions=drop",
            "priority=100,ipv6 actions=goto_table:20",
            "table=30, priority=300,icmp6,icmp_type=135,nd_target=fd00:10:128:2::1 actions=output:2",
            "table=30, priority=250,icmp6,ipv6_dst=fd00:10:128:2::/64,icmp_type=136 actions=goto_table:40",
            "table=30, priority=150,icmp6,icmp_type=135,nd_target=fd00:10:128::/48 actions=goto_table:50",
            "table=30, priority=100,ipv6,ipv6_dst=fd00:172:30::/112 actions=goto_table:60",
            "table=30, priority=0,ipv6 actions=goto_table:100",
            "table=80, priority=300,ipv6,ipv6_src=fd00:10:128:2::1 actions=output:NXM_NX_REG2[]",
        ] {
            assert!(text.iter().any(|t| t == want), "missing {want}\n{}", text.join("\n"));
        }
        assert!(!flows(&cfg()).iter().any(|f| f.to_string().contains("ipv6") || f.to_string().contains("icmp6")));
        let f = flows(&cfg6());
        let keys: std::collections::HashSet<_> = f.iter().map(Flow::key).collect();
        assert_eq!(keys.len(), f.len());
    }

    #[test]
    fn keys_are_unique() {
        let f = flows(&cfg());
        let keys: std::collections::HashSet<_> = f.iter().map(Flow::key).collect();
        assert_eq!(keys.len(), f.len());
    }

    /// An IPv6-only node has the IPv6 flows and every table's default, and no `ip` or `arp`
    /// flow; a dual-stack node's flows are exactly the IPv4 node's and the IPv6-only node's.
    #[test]
    fn ipv6_only_has_no_ipv4_flow() {
        for plugin in [Plugin::Subnet, Plugin::Multitenant, Plugin::NetworkPolicy] {
            let v6only = NodeConfig { plugin, ipv4: None, ..cfg6() };
            let text: Vec<String> = flows(&v6only).iter().map(|f| f.to_string()).collect();
            let v4ish = |t: &str| t.contains(",ip,") || t.contains(",arp") || t.contains("nw_") || t.contains(",tcp,") || t.contains(",udp,");
            assert!(!text.iter().any(|t| v4ish(t) || t.contains("priority=0,ip ")), "{plugin:?}:\n{}", text.join("\n"));
            for want in ["table=30, priority=0,ipv6 actions=goto_table:100", "priority=0 actions=drop", "table=100, priority=0 actions=output:2"] {
                assert!(text.iter().any(|t| t == want), "{plugin:?}: missing {want}");
            }
            let dual: std::collections::BTreeSet<String> = flows(&NodeConfig { plugin, ..cfg6() }).iter().map(|f| f.to_string()).collect();
            let v4: std::collections::BTreeSet<String> = flows(&NodeConfig { plugin, ..cfg() }).iter().map(|f| f.to_string()).collect();
            // tun0's MAC is the IPv4 gateway's on a dual-stack node, the IPv6 one's here.
            let same_mac = |t: &String| t.replace("0a:58:00:00:00:01", "0a:58:0a:80:02:01");
            let union: std::collections::BTreeSet<String> = v4.iter().cloned().chain(text.iter().map(same_mac)).collect();
            assert_eq!(dual, union, "{plugin:?}");
        }
    }
}
