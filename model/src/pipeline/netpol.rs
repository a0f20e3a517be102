//! The NetworkPolicy plugin's flows (plugin id 2): conntrack in table 21, isolation per
//! destination pod in table 80.
//!
//! The design is openshift-sdn's VERSION 4 one, not VERSION 3's (see the README section
//! "NetworkPolicy plugin"): traffic from local pods to the cluster network is committed to
//! conntrack in table 21, and table 80 accepts replies of tracked connections before any policy
//! flow, so a policy never cuts the return direction of a connection it allowed.
//!
//! Table 80 in networkpolicy mode, highest priority first:
//!
//! | priority | match | action | owner |
//! |---|---|---|---|
//! | 300 | `ip,nw_src=<gateway>` | `output:NXM_NX_REG2[]` | base |
//! | 200 | `ip,ct_state=+rpl+trk` | `output:NXM_NX_REG2[]` | plugin: replies |
//! | 101..=199 | `ip,nw_dst=<pod>` + source + port | `output:NXM_NX_REG2[]` | namespace: allowed |
//! | 100 | `ip,nw_dst=<pod>` | `drop` | namespace: a pod some policy selects |
//! | 50 | `ip` | `output:NXM_NX_REG2[]` | plugin: pods no policy selects |
//! | 0 | | `drop` | base |
//!
//! No two flows of equal priority in one table overlap: allowed flows of one pod are spread
//! over priorities 199 down to 101 in layers of pairwise disjoint matches ([`layer`]); flows of
//! different pods differ in `nw_dst`.
//!
//! IP fragments after the first carry no L4 header (OVS matches their `tp_dst` as 0), so a
//! port-restricted flow alone would drop them. The userspace datapath's `ct()` (table 21, or
//! table 80's priority 250) holds fragments until their datagram is complete (OVS's ipf),
//! passes the reassembled datagram through conntrack, then sends the original fragments on
//! together with its conntrack state; the first fragment, which has the ports, is judged by the
//! port-restricted flow. So each port-restricted allowed flow has a twin without the port,
//! `ct_state=-inv+trk,...,nw_frag=later` (same source and protocol): the datagram is whole at
//! the pod iff its first fragment was allowed (a pod cannot reassemble a datagram without it).
//! The conntrack original-direction port (`ct_tp_dst`) would be the exact match, but OVS 3.1
//! gives later fragments `ct_tp_dst=0` (tried with real packets: their datapath flow shows
//! `ct_tuple4(proto=17,tp_dst=0)`). tests/netpol_sctp.rs sends datagrams larger than the MTU
//! through such rules, on one node and across VXLAN.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use openflow::flow_match::ct_state;
use openflow::{IpFrag, IpProto, Ipv4Match, Masked, Match};

use super::{cidr, host, output_reg2, Flow, Reg, Table};
use crate::model::Vnid;

/// The reply flow's priority (as openshift-sdn VERSION 4).
pub const REPLY_PRIORITY: u16 = 200;
/// The highest priority of an allowed flow (layer 0).
pub const ALLOW_TOP: u16 = 199;
/// The lowest priority of an allowed flow: [`ALLOW_TOP`] - [`MAX_LAYERS`] + 1.
pub const ALLOW_BOTTOM: u16 = 101;
/// How many layers of allowed flows one pod may have.
pub const MAX_LAYERS: usize = (ALLOW_TOP - ALLOW_BOTTOM + 1) as usize;
/// A pod some policy selects: drop what no allowed flow took.
pub const ISOLATED_PRIORITY: u16 = 100;
/// Pods no policy selects accept everything.
pub const OPEN_PRIORITY: u16 = 50;

/// Where a connection comes from, as table 80 can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Src {
    /// Anywhere.
    Any,
    /// A VNID (reg0): every pod of the namespaces carrying it.
    Vnid(Vnid),
    /// A source address range (a pod's IP is a /32).
    Net(Ipv4Net),
}

/// An L4 protocol whose destination port the datapath matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4 {
    Tcp,
    Udp,
    Sctp,
}

/// What a connection goes to, beyond the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dst {
    /// Any protocol, any port.
    Any,
    /// One protocol, ports `start..=end` (`0..=65535`: the whole protocol).
    Ports { proto: L4, start: u16, end: u16 },
}

/// One allowed (source, destination port) box for a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Allow {
    pub src: Src,
    pub dst: Dst,
}

/// A local pod some policy selects, with everything its policies allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolatedPod {
    pub ip: Ipv4Addr,
    pub allows: Vec<Allow>,
}

/// Table 21 (base flows in networkpolicy mode): connections from local pods to the cluster
/// network and to Services are committed to conntrack (in [`via_host::CT_ZONE`]), so that table
/// 80 knows their replies — for a Service, the reply the node un-NATs and sends back through
/// tun0 (see [`super::via_host`]).
///
/// [`via_host::CT_ZONE`]: super::via_host::CT_ZONE
pub fn conntrack_flows(cluster_network: Ipv4Net, service_network: Ipv4Net) -> Vec<Flow> {
    [cluster_network, service_network]
        .into_iter()
        .map(|net| {
            Flow::new(
                Table::PolicyConntrack,
                200,
                Match::any().ipv4(Ipv4Match { dst: Some(cidr(net)), ..Default::default() }),
                vec![super::via_host::commit(Table::Routing)],
                None,
            )
        })
        .collect()
}

/// The plugin's fixed table-80 flows: accept replies, accept pods no policy selects. Every
/// packet reaches table 80 tracked: from a local pod through table 21, otherwise through table
/// 30's lookup of traffic to the local subnet (registers survive the recirculation).
pub fn plugin_flows() -> Vec<Flow> {
    let ip = |m: Ipv4Match| Match::any().ipv4(m);
    vec![
        // OVS accepts ct_state bits only together with +trk.
        Flow::new(
            Table::Policy,
            REPLY_PRIORITY,
            ip(Ipv4Match::default()).ct_state(ct_state::RPL | ct_state::TRK, ct_state::RPL | ct_state::TRK),
            vec![output_reg2()],
            None,
        ),
        Flow::new(Table::Policy, OPEN_PRIORITY, ip(Ipv4Match::default()), vec![output_reg2()], None),
    ]
}

/// A match as a box of constraints, for the overlap and containment checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Cube {
    reg0: Option<u32>,
    /// (value, mask), value pre-masked.
    src: Option<(u32, u32)>,
    proto: Option<L4>,
    /// (value, mask), only with `proto`; the value is non-zero (policy ports are 1..=65535),
    /// so a later fragment (`tp_dst` 0) never matches.
    port: Option<(u16, u16)>,
    /// Later fragments only (`ct_state=-inv+trk`, `nw_frag=later`), never with `port`.
    later: bool,
}

fn masked_disjoint<T: Copy + std::ops::BitXor<Output = T> + std::ops::BitAnd<Output = T> + PartialEq + Default>(
    a: Option<(T, T)>,
    b: Option<(T, T)>,
) -> bool {
    match (a, b) {
        (Some((va, ma)), Some((vb, mb))) => ((va ^ vb) & ma & mb) != T::default(),
        _ => false,
    }
}

/// `outer` holds every value `inner` holds.
fn masked_within<T: Copy + std::ops::BitXor<Output = T> + std::ops::BitAnd<Output = T> + PartialEq + Default>(
    inner: Option<(T, T)>,
    outer: Option<(T, T)>,
) -> bool {
    match (inner, outer) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some((vi, mi)), Some((vo, mo))) => (mi & mo) == mo && ((vi ^ vo) & mo) == T::default(),
    }
}

impl Cube {
    fn disjoint(&self, o: &Cube) -> bool {
        matches!((self.reg0, o.reg0), (Some(a), Some(b)) if a != b)
            || masked_disjoint(self.src, o.src)
            || matches!((self.proto, o.proto), (Some(a), Some(b)) if a != b)
            || masked_disjoint(self.port, o.port)
            || (self.later && o.port.is_some_and(|(v, m)| v & m != 0))
            || (o.later && self.port.is_some_and(|(v, m)| v & m != 0))
    }

    fn within(&self, o: &Cube) -> bool {
        (o.reg0.is_none() || self.reg0 == o.reg0)
            && masked_within(self.src, o.src)
            && (o.proto.is_none() || self.proto == o.proto)
            && masked_within(self.port, o.port)
            && (self.later || !o.later)
    }

    fn to_match(self, pod: Ipv4Addr) -> Match {
        let proto = self.proto.map(|p| {
            let dst = self.port.map(|(v, m)| Masked::new(v, m));
            match p {
                L4::Tcp => IpProto::Tcp { dst },
                L4::Udp => IpProto::Udp { dst },
                L4::Sctp => IpProto::Sctp { dst },
            }
        });
        let src = self.src.map(|(v, m)| Masked::new(Ipv4Addr::from(v), Ipv4Addr::from(m)));
        let frag = self.later.then_some(IpFrag::Later);
        let mut m = Match::any().ipv4(Ipv4Match { src, dst: Some(host(pod)), proto, frag });
        if let Some(v) = self.reg0 {
            m = m.reg(Reg::SrcVnid.n(), v);
        }
        if self.later {
            m = m.ct_state(ct_state::TRK, ct_state::TRK | ct_state::INV);
        }
        m
    }
}

/// `start..=end` as the fewest (value, mask) prefixes.
pub fn port_masks(start: u16, end: u16) -> Vec<(u16, u16)> {
    let mut out = Vec::new();
    let (mut lo, hi) = (start as u32, end as u32);
    while lo <= hi {
        // The largest aligned block starting at lo that stays within hi.
        let mut size = if lo == 0 { 1u32 << 16 } else { 1u32 << lo.trailing_zeros() };
        while lo + size - 1 > hi {
            size >>= 1;
        }
        out.push((lo as u16, (!(size - 1) & 0xffff) as u16));
        lo += size;
    }
    out
}

fn cubes(a: &Allow) -> Vec<Cube> {
    let (reg0, src) = match a.src {
        Src::Any => (None, None),
        Src::Vnid(v) => (Some(v.get()), None),
        Src::Net(n) if n.prefix_len() == 0 => (None, None),
        Src::Net(n) => (None, Some((u32::from(n.network()), u32::from(n.netmask())))),
    };
    match a.dst {
        Dst::Any => vec![Cube { reg0, src, proto: None, port: None, later: false }],
        Dst::Ports { proto, start, end } if start == 0 && end == u16::MAX => {
            vec![Cube { reg0, src, proto: Some(proto), port: None, later: false }]
        }
        // Port 0 is no policy port; a range from 0 starts at 1 (a later fragment's tp_dst is 0).
        Dst::Ports { proto, start, end } if start.max(1) <= end => {
            let mut out: Vec<Cube> = port_masks(start.max(1), end)
                .into_iter()
                .map(|p| Cube { reg0, src, proto: Some(proto), port: Some(p), later: false })
                .collect();
            // The twin for later fragments (see the module documentation).
            out.push(Cube { reg0, src, proto: Some(proto), port: None, later: true });
            out
        }
        Dst::Ports { .. } => vec![],
    }
}

/// Spreads `cubes` over layers: a cube goes to the first layer none of whose cubes it
/// overlaps. Cubes another cube contains are dropped first (they allow nothing more).
fn layer(mut cubes: Vec<Cube>) -> Vec<Vec<Cube>> {
    cubes.sort();
    cubes.dedup();
    // Wider cubes first, so that containment drops the narrow ones.
    cubes.sort_by_key(|c| {
        (
            c.reg0.is_some() as u8 + c.proto.is_some() as u8 + c.later as u8,
            c.src.map_or(0, |(_, m)| m.count_ones()),
            c.port.map_or(0, |(_, m)| m.count_ones()),
            *c,
        )
    });
    let mut kept: Vec<Cube> = Vec::with_capacity(cubes.len());
    for c in cubes {
        if !kept.iter().any(|k| c.within(k)) {
            kept.push(c);
        }
    }
    let mut layers: Vec<Vec<Cube>> = Vec::new();
    for c in kept {
        match layers.iter_mut().find(|l| l.iter().all(|o| c.disjoint(o))) {
            Some(l) => l.push(c),
            None => layers.push(vec![c]),
        }
    }
    layers
}

/// A namespace's table-80 flows for its isolated local pods. Each pod whose allowed flows need
/// more than [`MAX_LAYERS`] priorities keeps the first layers only (it is then allowed less,
/// never more) and is named in the returned errors.
pub fn namespace_flows(pods: &[IsolatedPod]) -> (Vec<Flow>, Vec<String>) {
    let mut flows = Vec::new();
    let mut errors = Vec::new();
    // Pods selected by the same policies with the same ports allow the same boxes: layering
    // (quadratic in the boxes of a pod) is done once per distinct set, not once per pod.
    let mut memo: HashMap<Vec<Allow>, std::rc::Rc<Vec<Vec<Cube>>>> = HashMap::new();
    for p in pods {
        let mut key = p.allows.clone();
        key.sort_unstable();
        key.dedup();
        let layers = match memo.get(&key) {
            Some(l) => l.clone(),
            None => {
                let l = std::rc::Rc::new(layer(key.iter().flat_map(cubes).collect()));
                memo.insert(key, l.clone());
                l
            }
        };
        if layers.len() > MAX_LAYERS {
            errors.push(format!(
                "pod {}: its allowed traffic needs {} flow priorities, more than the {MAX_LAYERS} table 80 has for one pod; the overlapping rules beyond them are not installed (less is allowed)",
                p.ip,
                layers.len()
            ));
        }
        for (i, l) in layers.iter().take(MAX_LAYERS).enumerate() {
            for c in l {
                flows.push(Flow::new(Table::Policy, ALLOW_TOP - i as u16, c.to_match(p.ip), vec![output_reg2()], None));
            }
        }
        flows.push(Flow::drop(
            Table::Policy,
            ISOLATED_PRIORITY,
            Match::any().ipv4(Ipv4Match { dst: Some(host(p.ip)), ..Default::default() }),
        ));
    }
    (flows, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_become_prefixes() {
        assert_eq!(port_masks(80, 80), vec![(80, 0xffff)]);
        assert_eq!(port_masks(8000, 8003), vec![(8000, 0xfffc)]);
        assert_eq!(port_masks(0, 65535), vec![(0, 0)]);
        assert_eq!(port_masks(1, 3), vec![(1, 0xffff), (2, 0xfffe)]);
        // Every port of a range is covered exactly once, and nothing else.
        for (s, e) in [(1u16, 65535u16), (5, 1000), (32767, 32769), (65535, 65535)] {
            let masks = port_masks(s, e);
            for p in [0u16, 1, 4, 5, 999, 1000, 1001, 32767, 32768, 32769, 65535] {
                let n = masks.iter().filter(|(v, m)| p & m == *v).count();
                assert_eq!(n, usize::from(p >= s && p <= e), "{s}..={e} port {p}: {masks:?}");
            }
        }
    }

    #[test]
    fn text() {
        assert_eq!(
            conntrack_flows("10.128.0.0/14".parse().unwrap(), "172.30.0.0/16".parse().unwrap())
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>(),
            vec![
                "table=21, priority=200,ip,nw_dst=10.128.0.0/14 actions=ct(commit,table=30,zone=64000)",
                "table=21, priority=200,ip,nw_dst=172.30.0.0/16 actions=ct(commit,table=30,zone=64000)",
            ]
        );
        let f: Vec<String> = plugin_flows().iter().map(|f| f.to_string()).collect();
        assert_eq!(
            f,
            vec![
                "table=80, priority=200,ct_state=+rpl+trk,ip actions=output:NXM_NX_REG2[]",
                "table=80, priority=50,ip actions=output:NXM_NX_REG2[]",
            ]
        );
        let pod = IsolatedPod {
            ip: "10.128.2.5".parse().unwrap(),
            allows: vec![
                Allow { src: Src::Vnid(Vnid::new(11).unwrap()), dst: Dst::Ports { proto: L4::Tcp, start: 8080, end: 8081 } },
                Allow { src: Src::Net("10.128.2.6/32".parse().unwrap()), dst: Dst::Any },
                // Contained in the first: dropped.
                Allow { src: Src::Vnid(Vnid::new(11).unwrap()), dst: Dst::Ports { proto: L4::Tcp, start: 8080, end: 8080 } },
            ],
        };
        let (flows, errors) = namespace_flows(&[pod]);
        assert!(errors.is_empty());
        let t: Vec<String> = flows.iter().map(|f| f.to_string()).collect();
        assert_eq!(
            t,
            vec![
                "table=80, priority=199,ip,nw_src=10.128.2.6,nw_dst=10.128.2.5 actions=output:NXM_NX_REG2[]",
                "table=80, priority=198,tcp,reg0=0xb,nw_dst=10.128.2.5,tp_dst=0x1f90/0xfffe actions=output:NXM_NX_REG2[]",
                "table=80, priority=198,ct_state=-inv+trk,tcp,reg0=0xb,nw_dst=10.128.2.5,nw_frag=later actions=output:NXM_NX_REG2[]",
                "table=80, priority=100,ip,nw_dst=10.128.2.5 actions=drop",
            ]
        );
    }

    #[test]
    fn layers_are_disjoint_and_cover_everything() {
        let mut allows = Vec::new();
        for i in 0..6u32 {
            allows.push(Allow { src: Src::Vnid(Vnid::new(i % 3).unwrap()), dst: Dst::Ports { proto: L4::Udp, start: 100 + i as u16, end: 200 } });
            allows.push(Allow { src: Src::Net(format!("10.128.{i}.0/24").parse().unwrap()), dst: Dst::Any });
        }
        allows.push(Allow { src: Src::Net("10.128.0.0/16".parse().unwrap()), dst: Dst::Ports { proto: L4::Tcp, start: 1, end: 65535 } });
        let all: Vec<Cube> = allows.iter().flat_map(cubes).collect();
        let layers = layer(all.clone());
        for l in &layers {
            for (i, a) in l.iter().enumerate() {
                for b in &l[i + 1..] {
                    assert!(a.disjoint(b), "{a:?} {b:?}");
                }
            }
        }
        let kept: Vec<&Cube> = layers.iter().flatten().collect();
        for c in &all {
            assert!(kept.iter().any(|k| c.within(k)), "{c:?} lost");
        }
    }
}
