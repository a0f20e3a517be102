//! The openshift-sdn OVS pipeline (VERSION 3) as typed data.
//!
//! Each submodule builds the flows of one seed operation of `ovscontroller.go` (SetupOVS,
//! setupPodFlows, AddHostSubnetRules, AddServiceRules, UpdateEgressNetworkPolicyRules,
//! UpdateLocalMulticastFlows, UpdateVXLANMulticastFlows) and of the policy plugins' table 80.
//! Nothing here formats a flow string: flows are [`Flow`] values whose text form comes from the
//! codec's `Display`, which prints what `ovs-ofctl dump-flows` prints.

pub mod audit;
pub mod base;
pub mod egress;
pub mod multicast;
pub mod netpol;
pub mod pod;
pub mod policy;
pub mod service;
pub mod subnet;
pub mod via_host;

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use openflow::{Action, FlowMod, Instruction, Ipv4Match, Masked, Match, NxmField, Subfield, OFP_DEFAULT_PRIORITY};

use crate::domain::{OfPort, Plugin};

/// The rule version of the pipeline (the seed's `VERSION`).
pub const VERSION: u8 = 3;

/// The pipeline's tables, named by what they do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Table {
    /// 0: dispatch on in_port (vxlan0, tun0, or a pod).
    Classify = 0,
    /// 10: traffic from VXLAN: accept only known node IPs.
    VxlanIngress = 10,
    /// 20: traffic from a pod: check its IP/MAC, load its VNID into reg0.
    PodIngress = 20,
    /// 21: connection tracking hook (NetworkPolicy plugin); passes to routing otherwise.
    PolicyConntrack = 21,
    /// 25: IP from a local pod that came back from the node through tun0 (a DNATed Service
    /// connection, networkpolicy plugin): reload the pod's VNID and remember the connection.
    ViaHost = 25,
    /// 27: NetworkPolicy egress (networkpolicy plugin): what a local pod some Egress policy
    /// selects may send; reached from table 21 (the pod's own packets) and 25 (its Service
    /// connections after the node's DNAT). See [`netpol::egress`].
    PolicyEgress = 27,
    /// 28: an egress-allowed connection is committed to conntrack (marked if it came back
    /// from the node), then routed.
    PolicyEgressCommit = 28,
    /// 30: general routing.
    Routing = 30,
    /// 40: ARP to a local pod.
    ArpLocal = 40,
    /// 50: ARP to a pod on another node.
    ArpRemote = 50,
    /// 60: IP to a service: VNID and port mapping.
    ServiceIp = 60,
    /// 70: IP to a local pod: load its VNID (reg1) and port (reg2).
    PodIp = 70,
    /// 80: isolation policy.
    Policy = 80,
    /// 90: IP to a pod on another node (via VXLAN).
    RemoteIp = 90,
    /// 100: egress network policy for traffic leaving the cluster.
    EgressPolicy = 100,
    /// 110: outbound multicast filtering.
    MulticastOut = 110,
    /// 111: multicast to remote nodes.
    MulticastVxlan = 111,
    /// 120: multicast delivery to local pods.
    MulticastLocal = 120,
    /// 253: the version note.
    Version = 253,
}

impl Table {
    pub fn id(self) -> u8 {
        self as u8
    }
}

/// The registers the pipeline uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reg {
    /// reg0: the source VNID.
    SrcVnid = 0,
    /// reg1: the destination VNID.
    DstVnid = 1,
    /// reg2: the output port.
    OutPort = 2,
}

impl Reg {
    pub fn n(self) -> u8 {
        self as u8
    }
    pub fn field(self) -> NxmField {
        NxmField::Reg(self.n())
    }
}

/// One flow of the pipeline: what identifies it in the switch (table, priority, match) and
/// what it does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Flow {
    pub table: Table,
    pub priority: u16,
    pub match_: Match,
    pub instructions: Vec<Instruction>,
}

/// The identity of a flow in OVS: a second ADD with the same key replaces the first, and a
/// DELETE_STRICT with the key removes exactly it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub table: u8,
    pub priority: u16,
    /// The match's encoding (canonical, so equal matches give equal keys), with its padding.
    pub match_bytes: std::sync::Arc<[u8]>,
}

/// What `encode` writes, as a shared byte string: encoded into a reused per-thread buffer and
/// copied once into its final allocation (not a `Vec` turned into an `Arc`: two allocations and
/// a copy). Flows are compiled on every update.
pub(crate) fn encoded_arc(encode: impl FnOnce(&mut Vec<u8>)) -> std::sync::Arc<[u8]> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut b) => {
            b.clear();
            encode(&mut b);
            let out = std::sync::Arc::from(&b[..]);
            if b.capacity() > 64 * 1024 {
                *b = Vec::new();
            }
            out
        }
        // Re-entered (cannot happen with the encoders used here): a buffer of its own.
        Err(_) => {
            let mut b = Vec::new();
            encode(&mut b);
            b.into()
        }
    })
}

impl FlowKey {
    pub fn new(table: u8, priority: u16, m: &Match) -> FlowKey {
        FlowKey { table, priority, match_bytes: encoded_arc(|b| m.encode(b)) }
    }

    /// The match, decoded back from its encoding.
    pub fn decode_match(&self) -> Result<Match, openflow::DecodeError> {
        Match::decode(&mut openflow::wire::Reader::new(&self.match_bytes, "flow key"))
    }
}

impl Flow {
    /// A flow applying `actions` then going to `goto` (either may be empty).
    pub fn new(table: Table, priority: u16, match_: Match, actions: Vec<Action>, goto: Option<Table>) -> Flow {
        Flow { table, priority, match_, instructions: openflow::msg::instructions_for(actions, goto.map(Table::id)) }
    }

    /// A flow with no actions at all (`actions=drop`).
    pub fn drop(table: Table, priority: u16, match_: Match) -> Flow {
        Flow::new(table, priority, match_, vec![], None)
    }

    pub fn key(&self) -> FlowKey {
        FlowKey::new(self.table.id(), self.priority, &self.match_)
    }

    /// The FLOW_MOD that adds this flow with `cookie`.
    pub fn add(&self, cookie: u64) -> FlowMod {
        let mut fm = FlowMod::new(openflow::FlowModCommand::Add, self.table.id(), self.priority, self.match_.clone());
        fm.cookie = cookie;
        fm.instructions = self.instructions.clone();
        fm
    }

    /// The FLOW_MOD that replaces this flow's instructions, keeping its counters.
    pub fn modify_strict(&self) -> FlowMod {
        let mut fm =
            FlowMod::new(openflow::FlowModCommand::ModifyStrict, self.table.id(), self.priority, self.match_.clone());
        fm.instructions = self.instructions.clone();
        fm
    }
}

impl std::fmt::Display for Flow {
    /// `dump-flows --no-stats` form (without cookie).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.add(0).fmt(f)
    }
}

/// What every node-local flow depends on: the plugin and the node's networks, family by
/// family. A node has IPv4, IPv6 or both (dual-stack); every flow that names an address is
/// made for each family the node has, from the same model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    pub plugin: Plugin,
    /// The IPv4 side (`None`: an IPv6-only node, no IPv4 flow at all).
    pub ipv4: Option<NodeIpv4>,
    /// The IPv6 side (`None`: IPv4 only, no IPv6 flow at all).
    pub ipv6: Option<NodeIpv6>,
}

/// The IPv4 networks of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeIpv4 {
    pub cluster_network: Ipv4Net,
    pub service_network: Ipv4Net,
    /// This node's HostSubnet.
    pub local_subnet: Ipv4Net,
}

impl NodeIpv4 {
    /// tun0's IPv4 address ([`gateway`]).
    pub fn gateway(&self) -> Ipv4Addr {
        gateway(self.local_subnet)
    }
}

/// The IPv6 networks of a dual-stack or IPv6-only node: every IPv4 flow that names a network
/// has an IPv6 twin naming these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeIpv6 {
    pub cluster_network: ipnet::Ipv6Net,
    pub service_network: ipnet::Ipv6Net,
    /// This node's IPv6 pod subnet.
    pub local_subnet: ipnet::Ipv6Net,
}

impl NodeIpv6 {
    /// tun0's IPv6 address ([`gateway6`]).
    pub fn gateway(&self) -> std::net::Ipv6Addr {
        gateway6(self.local_subnet)
    }
}

impl NodeConfig {
    /// tun0's MAC: `0a:58:` and its IPv4 address, or the last four bytes of its IPv6 one on an
    /// IPv6-only node ([`crate::domain::pod_mac`], the rule pods' MACs follow).
    pub fn tun0_mac(&self) -> openflow::MacAddr {
        // No family: no flow names tun0's MAC (validated states always have one).
        let gw = primary_gateway(self.ipv4.map(|v4| v4.local_subnet), self.ipv6.map(|v6| v6.local_subnet));
        crate::domain::pod_mac(gw.unwrap_or(std::net::IpAddr::V4(Ipv4Addr::UNSPECIFIED)))
    }
}

/// The tun0 address of the family a node's MACs derive from: IPv4's if the node has an IPv4
/// subnet, else IPv6's.
pub fn primary_gateway(subnet: Option<Ipv4Net>, subnet6: Option<ipnet::Ipv6Net>) -> Option<std::net::IpAddr> {
    match (subnet, subnet6) {
        (Some(s), _) => Some(std::net::IpAddr::V4(gateway(s))),
        (None, Some(s6)) => Some(std::net::IpAddr::V6(gateway6(s6))),
        (None, None) => None,
    }
}

/// A node subnet's gateway (tun0) address: its first host address.
pub fn gateway(local_subnet: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(local_subnet.network()).wrapping_add(1))
}

/// A node's IPv6 subnet's gateway (tun0) address: its first address after the network's
/// (`fd00:10:128:1::1` for `fd00:10:128:1::/64`), as the IPv4 gateway is.
pub fn gateway6(local_subnet: ipnet::Ipv6Net) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::from(u128::from(local_subnet.network()).wrapping_add(1))
}

// Small match/action builders in the seed's vocabulary.

pub(crate) fn cidr(n: Ipv4Net) -> Masked<Ipv4Addr> {
    // prefix_len() <= 32 always holds for an Ipv4Net.
    Masked::cidr(n.addr(), n.prefix_len()).unwrap_or(Masked::exact(n.addr()))
}

pub(crate) fn host(a: Ipv4Addr) -> Masked<Ipv4Addr> {
    Masked::exact(a)
}

pub(crate) fn ip() -> Ipv4Match {
    Ipv4Match::default()
}

pub(crate) fn multicast_net() -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::new(224, 0, 0, 0), 4).unwrap_or_default()
}

/// An IPv6 network as a masked match value.
pub(crate) fn cidr6(n: ipnet::Ipv6Net) -> Masked<std::net::Ipv6Addr> {
    // prefix_len() <= 128 always holds for an Ipv6Net.
    Masked::cidr(n.network(), n.prefix_len()).unwrap_or(Masked::exact(n.addr()))
}

/// `ipv6` with a source and destination (either may be any).
pub(crate) fn ip6(src: Option<Masked<std::net::Ipv6Addr>>, dst: Option<Masked<std::net::Ipv6Addr>>) -> openflow::EthMatch {
    openflow::EthMatch::Ipv6(openflow::flow_match::Ipv6Match { src, dst, ..Default::default() })
}

/// IPv6 multicast, `ff00::/8` (the IPv4 pipeline's 224.0.0.0/4).
pub(crate) fn multicast_net6() -> ipnet::Ipv6Net {
    ipnet::Ipv6Net::new(std::net::Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8).unwrap_or_default()
}

/// Link-local unicast, `fe80::/10`.
pub(crate) fn link_local6() -> ipnet::Ipv6Net {
    ipnet::Ipv6Net::new(std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10).unwrap_or_default()
}

/// Neighbour discovery: ICMPv6 `typ` (135 solicitation, 136 advertisement) from `src` to
/// `dst`, for `target`, with the solicitation's source or the advertisement's target link-layer
/// address `ll` — each optional. Neighbour discovery is IPv6's ARP: the pipeline steers it as
/// it steers ARP, a solicitation by its target (it is sent to a multicast address), an
/// advertisement by its destination.
pub(crate) fn nd(
    typ: u8,
    src: Option<Masked<std::net::Ipv6Addr>>,
    dst: Option<Masked<std::net::Ipv6Addr>>,
    target: Option<Masked<std::net::Ipv6Addr>>,
    ll: Option<openflow::MacAddr>,
) -> openflow::EthMatch {
    use openflow::flow_match::{Icmpv6Match, Ip6Proto, Ipv6Match, ND_NEIGHBOR_SOLICIT};
    let ll = ll.map(Masked::exact);
    let solicit = typ == ND_NEIGHBOR_SOLICIT;
    let icmp = Icmpv6Match {
        typ: Some(typ),
        nd_target: target,
        nd_sll: if solicit { ll } else { None },
        nd_tll: if solicit { None } else { ll },
        ..Default::default()
    };
    openflow::EthMatch::Ipv6(Ipv6Match { src, dst, proto: Some(Ip6Proto::Icmpv6(icmp)), ..Default::default() })
}

/// ICMPv6 from `src`, any type.
pub(crate) fn icmp6(src: Option<Masked<std::net::Ipv6Addr>>) -> openflow::EthMatch {
    use openflow::flow_match::{Icmpv6Match, Ip6Proto, Ipv6Match};
    openflow::EthMatch::Ipv6(Ipv6Match { src, proto: Some(Ip6Proto::Icmpv6(Icmpv6Match::default())), ..Default::default() })
}

pub(crate) use openflow::flow_match::{ND_NEIGHBOR_ADVERT as NA, ND_NEIGHBOR_SOLICIT as NS};

pub(crate) fn output(p: OfPort) -> Action {
    Action::output(p)
}

/// `load:value->NXM_NX_REGn[]`.
pub(crate) fn load(r: Reg, value: u32) -> Action {
    Action::load_reg(r.n(), value)
}

/// `output:NXM_NX_REG2[]`.
pub(crate) fn output_reg2() -> Action {
    Action::output_reg(Reg::OutPort.n())
}

/// `NXM_NX_TUN_ID[0..31]`.
pub(crate) fn tun_id_low32() -> Subfield {
    Subfield::bits(NxmField::TunId, 0, 31).unwrap_or(Subfield::whole(NxmField::TunId))
}

/// The default priority (32768), for the seed's flows that give none.
pub(crate) const DEFAULT_PRIORITY: u16 = OFP_DEFAULT_PRIORITY;
