//! Allowed boxes of (peer, protocol, port) as matches: the containment and pruning rules both
//! directions share, and the product form (one flow per pod and box).

use std::collections::HashMap;
use std::net::IpAddr;

use openflow::flow_match::ct_state;
use openflow::{IpFrag, IpProto, Masked, Match};

use super::super::audit::Verdict;
use super::family::{ip_match, Bits, BitsOf, Family};
use super::{Allow, Dst, IsolatedPod, Side, Src, L4, ALLOW_PRIORITY, ISOLATED_PRIORITY};
use crate::pipeline::{Flow, Reg};

/// A match as a box of constraints, for the overlap and containment checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Cube {
    /// The packets' family: a box is of one family (an `ip` or an `ipv6` flow).
    pub(super) family: Family,
    /// The peer's VNID (reg0; ingress only: the source's VNID is known, the destination's is
    /// not where egress is judged).
    pub(super) reg0: Option<u32>,
    /// The peer's address (value, mask), value pre-masked, of `family` (an IPv4 address in
    /// the low 32 bits): the source (ingress) or the destination (egress).
    pub(super) peer: Option<Bits>,
    pub(super) proto: Option<L4>,
    /// (value, mask), only with `proto`; the value is non-zero (policy ports are 1..=65535),
    /// so a later fragment (`tp_dst` 0) never matches.
    pub(super) port: Option<(u16, u16)>,
    /// Later fragments only (`ct_state=-inv+trk`, `nw_frag=later`), never with `port`.
    pub(super) later: bool,
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
    pub(super) fn within(&self, o: &Cube) -> bool {
        self.family == o.family
            && (o.reg0.is_none() || self.reg0 == o.reg0)
            && masked_within(self.peer, o.peer)
            && (o.proto.is_none() || self.proto == o.proto)
            && masked_within(self.port, o.port)
            && (self.later || !o.later)
    }

    /// The match of this box on `side`, for the selected pod `pod` if given, in the namespace
    /// of VNID `ns_vnid` (reg1 for ingress, reg0 for egress) if given.
    /// `pod` is of the box's family (the caller pairs them).
    pub(super) fn to_match(self, side: Side, pod: Option<IpAddr>, ns_vnid: Option<u32>) -> Match {
        let proto = self.proto.map(|p| {
            let dst = self.port.map(|(v, m)| Masked::new(v, m));
            match p {
                L4::Tcp => IpProto::Tcp { dst },
                L4::Udp => IpProto::Udp { dst },
                L4::Sctp => IpProto::Sctp { dst },
            }
        });
        let frag = self.later.then_some(IpFrag::Later);
        let pod = pod.map(Bits::host);
        let (src, dst) = match side {
            Side::Ingress => (self.peer, pod),
            Side::Egress => (pod, self.peer),
        };
        let mut m = ip_match(self.family, src, dst, proto, frag);
        if let Some(v) = self.reg0 {
            m = m.reg(Reg::SrcVnid.n(), v);
        }
        if let Some(v) = ns_vnid {
            m = m.reg(side.namespace_reg().n(), v);
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

/// The boxes of `a` in `family`: none when its peer is an address range of the other family
/// (an IPv4 ipBlock allows no IPv6 packet, and the reverse); a peer of any address (any, a
/// VNID, a `/0`) has boxes in both.
pub(super) fn cubes(a: &Allow, family: Family) -> Vec<Cube> {
    let (reg0, peer) = match a.src {
        Src::Any => (None, None),
        Src::Vnid(v) => (Some(v.get()), None),
        Src::Net(n) if Family::of_net(n) != family => return vec![],
        Src::Net(n) if n.prefix_len() == 0 => (None, None),
        Src::Net(n) => (None, Some(Bits::net(n))),
    };
    match a.dst {
        Dst::Any => vec![Cube { family, reg0, peer, proto: None, port: None, later: false }],
        Dst::Ports { proto, start, end } if start == 0 && end == u16::MAX => {
            vec![Cube { family, reg0, peer, proto: Some(proto), port: None, later: false }]
        }
        // Port 0 is no policy port; a range from 0 starts at 1 (a later fragment's tp_dst is 0).
        Dst::Ports { proto, start, end } if start.max(1) <= end => {
            let mut out: Vec<Cube> = port_masks(start.max(1), end)
                .into_iter()
                .map(|p| Cube { family, reg0, peer, proto: Some(proto), port: Some(p), later: false })
                .collect();
            // The twin for later fragments (see the module documentation).
            out.push(Cube { family, reg0, peer, proto: Some(proto), port: None, later: true });
            out
        }
        Dst::Ports { .. } => vec![],
    }
}

/// A peer as a clause member of `family`: `None` for any peer. (A peer of the other family
/// is no member: callers keep only peers of the group's family, [`Src::family`].)
pub(super) fn peer_member(s: &Src, family: Family) -> Option<Cube> {
    let c = cubes(&Allow { src: *s, dst: Dst::Any }, family).into_iter().next()?;
    (c.reg0.is_some() || c.peer.is_some()).then_some(c)
}

/// Drops the boxes another box contains (they allow nothing more); the rest in a stable
/// order, narrow-last.
pub(super) fn prune(mut cubes: Vec<Cube>) -> Vec<Cube> {
    cubes.sort();
    cubes.dedup();
    // Wider cubes first, so that containment drops the narrow ones.
    cubes.sort_by_key(|c| {
        (
            c.family,
            c.reg0.is_some() as u8 + c.proto.is_some() as u8 + c.later as u8,
            c.peer.map_or(0, |(_, m)| m.count_ones()),
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
    kept
}

/// The product form on `side`: one allowed flow per (pod, box) at [`ALLOW_PRIORITY`], boxes
/// another box of the pod contains left out, then the pod's drop at [`ISOLATED_PRIORITY`].
/// Pods allowed the same boxes share one pruning (quadratic in a pod's boxes). `log` gives a
/// pod's audit action for its allowed flows and for its drop, if they are logged.
pub fn plain_flows_on(side: Side, pods: &[IsolatedPod], log: impl Fn(IpAddr, Verdict) -> Option<openflow::Action>) -> Vec<Flow> {
    plain_flows_seen(side, pods, log, |_, _| {})
}

/// [`plain_flows_on`], telling `seen` what each flow is, in the order of the flows: the pod's
/// allowed flow of a box (`Some`), or its drop (`None`). The flow counters attribute each
/// flow from it (`super::counted`), so they follow exactly the flows made here.
pub(super) fn plain_flows_seen(
    side: Side,
    pods: &[IsolatedPod],
    log: impl Fn(IpAddr, Verdict) -> Option<openflow::Action>,
    mut seen: impl FnMut(IpAddr, Option<&Cube>),
) -> Vec<Flow> {
    let mut flows = Vec::new();
    let mut memo: HashMap<(Family, Vec<Allow>), std::rc::Rc<Vec<Cube>>> = HashMap::new();
    for p in pods {
        let family = Family::of(p.ip);
        let mut key = p.allows.clone();
        key.sort_unstable();
        key.dedup();
        let key = (family, key);
        let kept = match memo.get(&key) {
            Some(l) => l.clone(),
            None => {
                let l = std::rc::Rc::new(prune(key.1.iter().flat_map(|a| cubes(a, family)).collect()));
                memo.insert(key, l.clone());
                l
            }
        };
        let allow_log = log(p.ip, Verdict::Allow);
        for c in kept.iter() {
            seen(p.ip, Some(c));
            flows.push(side.allow_logged(ALLOW_PRIORITY, c.to_match(side, Some(p.ip), None), allow_log.clone()));
        }
        seen(p.ip, None);
        flows.push(isolated_drop(side, p.ip, log(p.ip, Verdict::Deny)));
    }
    flows
}

/// The drop of a pod some policy of `side` selects: what no allowed flow took.
pub(super) fn isolated_drop(side: Side, pod: IpAddr, log: Option<openflow::Action>) -> Flow {
    Flow::new(side.table(), ISOLATED_PRIORITY, side.pod_match(pod), log.into_iter().collect(), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Vnid;

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
    fn pruning_keeps_everything_allowed() {
        let mut allows = Vec::new();
        for i in 0..6u32 {
            allows.push(Allow { src: Src::Vnid(Vnid::new(i % 3).unwrap()), dst: Dst::Ports { proto: L4::Udp, start: 100 + i as u16, end: 200 } });
            allows.push(Allow { src: Src::Net(format!("10.128.{i}.0/24").parse().unwrap()), dst: Dst::Any });
        }
        allows.push(Allow { src: Src::Net("10.128.0.0/16".parse().unwrap()), dst: Dst::Ports { proto: L4::Tcp, start: 1, end: 65535 } });
        let all: Vec<Cube> = allows.iter().flat_map(|a| cubes(a, Family::V4)).collect();
        let kept = prune(all.clone());
        assert!(kept.len() < all.len());
        for c in &all {
            assert!(kept.iter().any(|k| c.within(k)), "{c:?} lost");
        }
    }
}
