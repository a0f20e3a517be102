//! Connections that pass through the node's own network stack (networkpolicy plugin): a pod's
//! Service traffic, DNATed by kube-proxy on the node and sent back into br0 through tun0.
//!
//! NetworkPolicy must judge that traffic by its real client, so the node does not masquerade
//! inside the cluster network in this mode (hostnet's `masquerade_within_cluster`): the DNATed
//! packet comes back from tun0 with the client pod's address, and table 25 reloads the client's
//! VNID from that address (openshift-sdn VERSION 4's table 25) before routing it to the
//! endpoint, local or across the VXLAN, where table 80 applies the endpoint's policies.
//!
//! The endpoint's replies must go back through the node that did the DNAT, which alone can
//! undo it (the client expects the Service's address). VERSION 4 relied on OVS sharing the
//! kernel's conntrack table with iptables (`ct(nat)` on the reply) — which only the kernel
//! datapath does. Here the flows remember such connections themselves, so the userspace
//! datapath works too: table 25 commits them with `ct_mark` bit 0x1 in our own conntrack zone
//! ([`CT_ZONE`], never the kernel's zone 0 where kube-proxy's NAT entries live: committing
//! there would clash with them), and table 30 sends replies of marked connections to tun0,
//! with tun0's MAC as destination so the node's stack accepts them. The node un-NATs the reply
//! and routes it back through tun0 to the client, whose own connection (to the Service's
//! address, committed in table 21) recognises it as a reply.
//!
//! | table | priority | match | actions |
//! |---|---|---|---|
//! | 0 | 400 | `in_port=2,ip,nw_src=<gateway>,nw_dst=<cluster>` | `goto_table:30` (the node itself) |
//! | 0 | 300 | `in_port=2,ip,nw_src=<local subnet>,nw_dst=<cluster>` | `goto_table:25` |
//! | 25 | 100 | `ip,nw_src=<pod>` | `load:<VNID>->reg0`, `ct(commit,zone=Z,exec(load:1->NXM_NX_CT_MARK[0]),table=30)` |
//! | 25 | 0 | | `drop` |
//! | 30 | 250 | `ct_state=-trk,ip,nw_dst=<local subnet>` | `ct(commit,zone=Z,table=30)` |
//! | 30 | 250 | `ct_state=+rpl+trk,ct_mark=0x1/0x1,ip,nw_dst=<local subnet>` | `set_field:<tun0 MAC>->eth_dst,output:2` |
//!
//! On a dual-stack node every one of these `ip` flows has its `ipv6` twin (the IPv6 gateway,
//! cluster network and local subnet; tun0's MAC is the same), and each local pod its IPv6
//! table-25 flow ([`pod_flow6`]): the node's kube-proxy DNATs IPv6 Services the same way.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use openflow::flow_match::Ipv6Match;
use openflow::field;
use openflow::flow_match::ct_state;
use openflow::{Action, Ct, CtZone, Ipv4Match, MacAddr, Masked, Match, NxmField, SetField, Subfield};

use super::{cidr, host, load, output, Flow, NodeConfig, Reg, Table};
use crate::domain::{OfPort, Vnid};

/// The conntrack zone of every `ct()` of the networkpolicy pipeline. Not 0: on the kernel
/// datapath zone 0 is the node's own (kube-proxy's NAT entries); a commit there of the DNATed
/// packet would clash with kube-proxy's entry for the same connection.
pub const CT_ZONE: u16 = 64000;

/// `ct_mark` bit of connections that came back from the node through tun0. Set and matched
/// masked ([`set_mark`], [`has_mark`]): the same entry may carry NetworkPolicy's bits too
/// ([`INGRESS_ALLOWED_MARK`], [`EGRESS_ALLOWED_MARK`]).
pub const VIA_HOST_MARK: u32 = 0x1;

/// `ct_mark` bit of connections an ingress policy flow allowed (table 80): table 80 passes
/// marked UDP before any policy flow, as it passes established TCP and UDP (a one-way UDP
/// stream never becomes `+est`). See [`super::netpol`].
pub const INGRESS_ALLOWED_MARK: u32 = 0x2;

/// `ct_mark` bit of connections an egress policy flow allowed (table 27). Not the ingress bit:
/// a connection between two pods of one node is one conntrack entry for both tables, and its
/// source's egress allowing it must not let it past its destination's ingress.
pub const EGRESS_ALLOWED_MARK: u32 = 0x4;

/// `load:1->NXM_NX_CT_MARK[n]`, `n` the one bit of `mark`: sets that bit and keeps the others
/// (an exact `set_field:…->ct_mark` would clear them, and OF1.3's SET_FIELD carries no mask:
/// OVS answers OFPBAC_BAD_SET_MASK; a masked write is NXAST_REG_LOAD, as ovs-ofctl sends
/// `set_field:0x2/0x2->ct_mark`). Only inside a committing `ct(exec(...))`.
pub fn set_mark(mark: u32) -> Action {
    debug_assert!(mark.is_power_of_two());
    let field = NxmField::Other(field::header(field::CLASS_NXM1, field::NXM1_CT_MARK, 4, false));
    let bit = mark.trailing_zeros() as u16;
    Action::RegLoad { dst: Subfield::bits(field, bit, bit).expect("a bit of a 32-bit field"), value: 1 }
}

/// `ct_mark=<mark>/<mark>`: the connection carries `mark`, whatever its other bits.
pub fn has_mark(mark: u32) -> Masked<u32> {
    Masked::new(mark, mark)
}

/// tun0's MAC: `0a:58:` + the gateway address (the convention pods' MACs follow too,
/// [`crate::domain::pod_mac`]), set on the interface through OVSDB, so flows can address the
/// node's stack without learning it. [`NodeConfig::tun0_mac`] picks the gateway.
pub fn tun0_mac(gateway: impl Into<std::net::IpAddr>) -> MacAddr {
    crate::domain::pod_mac(gateway)
}

fn ip(src: Option<Ipv4Net>, dst: Option<Ipv4Net>) -> Match {
    Match::any().ipv4(Ipv4Match { src: src.map(cidr), dst: dst.map(cidr), ..Default::default() })
}

fn cidr6(n: Ipv6Net) -> Masked<Ipv6Addr> {
    // prefix_len() <= 128 always holds for an Ipv6Net.
    Masked::cidr(n.network(), n.prefix_len()).unwrap_or(Masked::exact(n.addr()))
}

fn ip6(src: Option<Ipv6Net>, dst: Option<Ipv6Net>) -> Match {
    Match::any().ipv6(Ipv6Match { src: src.map(cidr6), dst: dst.map(cidr6), ..Default::default() })
}

/// `ct(commit,zone=Z,exec(load:1->NXM_NX_CT_MARK[0]),table=T)`: a connection back from the
/// node (table 25, and table 28 for an egress-isolated pod's).
pub fn commit_marked(table: Table) -> Action {
    let c = Ct::new().zone(CtZone::Imm(CT_ZONE)).table(table.id()).commit();
    Action::Ct(c.exec(vec![set_mark(VIA_HOST_MARK)]))
}

/// `ct(commit,zone=Z,exec(load:1->NXM_NX_CT_MARK[n]))`: commits the connection with `mark`
/// set and goes on with the action list (no `table=`: no recirculation; the packet is
/// untracked for the actions after it, which match nothing of conntrack).
pub fn commit_mark(mark: u32) -> Action {
    Action::Ct(Ct::new().zone(CtZone::Imm(CT_ZONE)).commit().exec(vec![set_mark(mark)]))
}

/// `ct(commit,zone=Z,table=T)`: table 21's commit of a pod's own connections.
pub fn commit(table: Table) -> Action {
    Action::Ct(Ct::new().zone(CtZone::Imm(CT_ZONE)).commit().table(table.id()))
}

/// `ct(commit,zone=Z,table=T)` for what reaches local pods from VXLAN or tun0 untracked.
///
/// It commits, as table 21 does for local sources: the receiving node's entry then has the
/// direction of the connection's first packet, not of the pod's answer. This matters for
/// protocols OVS's userspace conntrack keys without ports (SCTP: one entry per address pair):
/// uncommitted, the answer of an allowed SCTP exchange would create the entry in the reverse
/// direction, and every later SCTP packet from the same peer, to any port, would pass table 80
/// as a reply (seen with real packets, tests/netpol_sctp.rs).
pub fn track(table: Table) -> Action {
    commit(table)
}

/// The fixed flows (networkpolicy only), for each family the node has; table 25's default
/// drop once (it matches no family).
pub fn base_flows(cfg: &NodeConfig) -> Vec<Flow> {
    let tun_mac = cfg.tun0_mac();
    let mut flows = vec![];
    if let Some(v4) = &cfg.ipv4 {
        let gateway = Ipv4Net::new(v4.gateway(), 32).expect("/32 is a valid prefix");
        flows.extend(family_flows(
            |src| ip(Some(src), Some(v4.cluster_network)).in_port(OfPort::TUN),
            gateway,
            v4.local_subnet,
            || ip(None, Some(v4.local_subnet)),
            tun_mac,
        ));
    }
    if let Some(v6) = &cfg.ipv6 {
        let gateway6 = Ipv6Net::new(v6.gateway(), 128).expect("/128 is a valid prefix");
        flows.extend(family_flows(
            |src| ip6(Some(src), Some(v6.cluster_network)).in_port(OfPort::TUN),
            gateway6,
            v6.local_subnet,
            || ip6(None, Some(v6.local_subnet)),
            tun_mac,
        ));
    }
    flows.insert(flows.len().min(2), Flow::drop(Table::ViaHost, 0, Match::any()));
    flows
}

/// One family's base flows: `from_tun(src)` matches tun0 traffic from `src` to the cluster
/// network, `to_local()` traffic to the local subnet.
fn family_flows<N: Copy>(from_tun: impl Fn(N) -> Match, gateway: N, local_subnet: N, to_local: impl Fn() -> Match, tun_mac: MacAddr) -> Vec<Flow> {
    vec![
        // The node's own traffic to pods (probes, host-network pods): as any tun0 traffic.
        Flow::new(Table::Classify, 400, from_tun(gateway), vec![], Some(Table::Routing)),
        // A local pod's address coming back from the node: a DNATed Service connection.
        Flow::new(Table::Classify, 300, from_tun(local_subnet), vec![], Some(Table::ViaHost)),
        Flow::new(Table::Routing, 250, to_local().ct_state(0, ct_state::TRK), vec![track(Table::Routing)], None),
        Flow::new(
            Table::Routing,
            250,
            Match {
                ct_mark: Some(has_mark(VIA_HOST_MARK)),
                ..to_local().ct_state(ct_state::RPL | ct_state::TRK, ct_state::RPL | ct_state::TRK)
            },
            vec![Action::SetField(SetField::EthDst(tun_mac)), output(OfPort::TUN)],
            None,
        ),
    ]
}

/// A local pod's table-25 flow: its VNID for its connections that come back from the node.
pub fn pod_flow(pod_ip: Ipv4Addr, vnid: Vnid) -> Flow {
    Flow::new(
        Table::ViaHost,
        100,
        Match::any().ipv4(Ipv4Match { src: Some(host(pod_ip)), ..Default::default() }),
        vec![load(Reg::SrcVnid, vnid.get()), commit_marked(Table::Routing)],
        None,
    )
}

/// A local pod's IPv6 table-25 flow (dual-stack): [`pod_flow`] for its IPv6 address.
pub fn pod_flow6(pod_ip6: Ipv6Addr, vnid: Vnid) -> Flow {
    Flow::new(
        Table::ViaHost,
        100,
        Match::any().ipv6(Ipv6Match { src: Some(Masked::exact(pod_ip6)), ..Default::default() }),
        vec![load(Reg::SrcVnid, vnid.get()), commit_marked(Table::Routing)],
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Plugin;

    #[test]
    fn text() {
        let cfg = NodeConfig {
            ipv6: None,
            plugin: Plugin::NetworkPolicy,
            ipv4: Some(super::super::NodeIpv4 {
                cluster_network: "10.128.0.0/14".parse().unwrap(),
                service_network: "172.30.0.0/16".parse().unwrap(),
                local_subnet: "10.128.2.0/23".parse().unwrap(),
            }),
        };
        let got: Vec<String> = base_flows(&cfg).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            got,
            vec![
                "priority=400,ip,in_port=2,nw_src=10.128.2.1,nw_dst=10.128.0.0/14 actions=goto_table:30",
                "priority=300,ip,in_port=2,nw_src=10.128.2.0/23,nw_dst=10.128.0.0/14 actions=goto_table:25",
                "table=25, priority=0 actions=drop",
                "table=30, priority=250,ct_state=-trk,ip,nw_dst=10.128.2.0/23 actions=ct(commit,table=30,zone=64000)",
                "table=30, priority=250,ct_state=+rpl+trk,ct_mark=0x1/0x1,ip,nw_dst=10.128.2.0/23 actions=set_field:0a:58:0a:80:02:01->eth_dst,output:2",
            ]
        );
        assert_eq!(
            pod_flow("10.128.2.5".parse().unwrap(), Vnid::new(11).unwrap()).to_string(),
            "table=25, priority=100,ip,nw_src=10.128.2.5 actions=load:0xb->NXM_NX_REG0[],ct(commit,table=30,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[0]))"
        );
    }
}
