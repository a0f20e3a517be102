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
//! | 150 | `ip,nw_dst=<pod>` + source + port | `output:NXM_NX_REG2[]` | namespace: a small rule, plain |
//! | 150 | `ip,reg0=<VNID>,reg1=<ns VNID>` / `ip,nw_src=<CIDR>,reg1=<ns VNID>` | `conjunction(id,1/n),...` | namespace: source clause |
//! | 150 | `ip,nw_dst=<pod>` | `conjunction(id,k/n),...` | namespace: destination clause |
//! | 150 | `tcp,reg1=<ns VNID>,tp_dst=<port/mask>` (and its later-fragment twin) | `conjunction(id,n/n),...` | namespace: port clause |
//! | 150 | `conj_id=<id>,ip,reg1=<ns VNID>` | `output:NXM_NX_REG2[]` | namespace: the rule |
//! | 100 | `ip,nw_dst=<pod>` | `drop` | namespace: a pod some policy selects |
//! | 50 | `ip` | `output:NXM_NX_REG2[]` | plugin: pods no policy selects |
//! | 0 | | `drop` | base |
//!
//! A rule (one ingress rule of one policy, for the pods of the policy that share its resolved
//! ports) is a conjunctive match of up to three clauses — sources (absent for "any"),
//! destination pods, ports (absent for "any") — so it costs |sources| + |pods| + |ports| + 1
//! flows instead of their product; a clause flow whose match several rules use is one flow
//! with all their `conjunction` actions (sorted by id). When the product is no larger (a rule
//! with one source, one pod and one port; a rule with only the destination clause, which a
//! conjunction of one clause cannot express), the rule is plain flows with `nw_dst=<pod>`.
//!
//! Why this is safe with OVS's classifier (lib/classifier.c `classifier_lookup__`): a packet's
//! conjunctions at priority P are considered only when no non-conjunctive ("hard") flow of
//! priority ≥ P matches; every flow a packet matches is seen (per subtable the best, lower
//! ones of identical match on the way down), and at P any conjunction whose every clause
//! matched sends the packet to its `conj_id` flow (same priority). Every allowed entry —
//! plain flow or `conj_id` flow — has the same action, so whichever OVS picks among them,
//! and whether a plain allowed flow at 150 hides the conjunctions, the packet is output; no
//! drop or other action shares priority 150. tests/netpol_flows.rs walks every state's flows
//! with those rules (conjunctions expanded into the boxes they match) and fails on two
//! overlapping entries of one priority with different actions, on clause flows whose
//! conjunction has no `conj_id` flow at their priority, and on an id used twice.
//!
//! Namespaces apart: clause flows of sources and ports do not name the destination pod, so
//! they match the namespace's VNID in reg1 (table 70 loads the destination pod's VNID there),
//! as does the `conj_id` flow; the destination clause names the pod. Two namespaces' flows
//! never share a match, and a conjunction can only complete for a packet to its own
//! namespace. This needs a VNID of the namespace's own: a namespace sharing its VNID with
//! another (or without one) gets plain flows only.
//!
//! Conjunction ids ([`conj_id_seed`]): FNV-1a of namespace, policy name, rule index and the
//! rule's ports for the pods concerned — stable across recomputations (a pod or source
//! joining a rule changes only its clause flows), collisions within the namespace moved to
//! the next free id in a deterministic order. Ids of different namespaces may coincide (32-bit
//! hashes, computed per namespace owner): harmless, since every flow of a conjunction matches
//! its namespace (reg1, or a pod's address), and rare.
//!
//! IP fragments after the first carry no L4 header (OVS matches their `tp_dst` as 0), so a
//! port-restricted flow alone would drop them. The userspace datapath's `ct()` (table 21, or
//! table 80's priority 250) holds fragments until their datagram is complete (OVS's ipf),
//! passes the reassembled datagram through conntrack, then sends the original fragments on
//! together with its conntrack state; the first fragment, which has the ports, is judged by the
//! port-restricted flow. So each port-restricted allowed flow has a twin without the port,
//! `ct_state=-inv+trk,...,nw_frag=later` (same source and protocol): the datagram is whole at
//! the pod iff its first fragment was allowed (a pod cannot reassemble a datagram without it).
//! In a conjunction the twin is one more member of the port clause.
//! The conntrack original-direction port (`ct_tp_dst`) would be the exact match, but OVS 3.1
//! gives later fragments `ct_tp_dst=0` (tried with real packets: their datapath flow shows
//! `ct_tuple4(proto=17,tp_dst=0)`). tests/netpol_sctp.rs sends datagrams larger than the MTU
//! through such rules, on one node and across VXLAN.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use openflow::flow_match::ct_state;
use openflow::{IpFrag, IpProto, Ipv4Match, Masked, Match};

use super::{cidr, host, output_reg2, Flow, Reg, Table};
use crate::model::Vnid;

/// The reply flow's priority (as openshift-sdn VERSION 4).
pub const REPLY_PRIORITY: u16 = 200;
/// Every allowed entry of table 80: plain allowed flows, conjunctive clause flows and their
/// `conj_id` flows (one priority: the allowed entries all have one action, and a
/// conjunction's clause flows must share their `conj_id` flow's priority).
pub const ALLOW_PRIORITY: u16 = 150;
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

/// A local pod some policy selects, with everything its policies allow (the product form:
/// what [`plain_flows`] expands into one flow per box).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolatedPod {
    pub ip: Ipv4Addr,
    pub allows: Vec<Allow>,
}

/// One ingress rule of one policy, resolved: its sources and, per local pod the policy
/// selects, the rule's ports for that pod (named ports resolved against its containerPorts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleAllow {
    /// The policy's name and the rule's index in it: what the rule's conjunction ids derive from.
    pub policy: String,
    pub rule: usize,
    /// `None`: any source (no `from`).
    pub srcs: Option<Vec<Src>>,
    /// The selected pods, each with the rule's ports for it (empty: nothing, e.g. a named port
    /// the pod does not have).
    pub pods: Vec<(Ipv4Addr, Vec<Dst>)>,
}

/// What the policies of one namespace make of its local pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespacePolicy {
    pub namespace: String,
    /// The namespace's VNID (table 70 loads it into reg1 for its pods) when no other
    /// namespace carries it: conjunctive flows need it to keep their clause flows apart from
    /// other namespaces' (without it every rule is expanded into plain flows).
    pub vnid: Option<Vnid>,
    /// The pods some Ingress policy selects, in pod order.
    pub isolated: Vec<Ipv4Addr>,
    /// Every rule of every Ingress policy selecting some of them.
    pub rules: Vec<RuleAllow>,
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
    fn within(&self, o: &Cube) -> bool {
        (o.reg0.is_none() || self.reg0 == o.reg0)
            && masked_within(self.src, o.src)
            && (o.proto.is_none() || self.proto == o.proto)
            && masked_within(self.port, o.port)
            && (self.later || !o.later)
    }

    /// The match of this box, to `dst` (a pod) if given, in namespace `dst_vnid` (reg1) if given.
    fn to_match(self, dst: Option<Ipv4Addr>, dst_vnid: Option<u32>) -> Match {
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
        let mut m = Match::any().ipv4(Ipv4Match { src, dst: dst.map(host), proto, frag });
        if let Some(v) = self.reg0 {
            m = m.reg(Reg::SrcVnid.n(), v);
        }
        if let Some(v) = dst_vnid {
            m = m.reg(Reg::DstVnid.n(), v);
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

/// Drops the boxes another box contains (they allow nothing more); the rest in a stable
/// order, narrow-last.
fn prune(mut cubes: Vec<Cube>) -> Vec<Cube> {
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
    kept
}

/// The product form: one allowed flow per (pod, box) at [`ALLOW_PRIORITY`], boxes another box
/// of the pod contains left out, then the pod's drop at [`ISOLATED_PRIORITY`]. Pods allowed
/// the same boxes share one pruning (quadratic in a pod's boxes).
pub fn plain_flows(pods: &[IsolatedPod]) -> Vec<Flow> {
    let mut flows = Vec::new();
    let mut memo: HashMap<Vec<Allow>, std::rc::Rc<Vec<Cube>>> = HashMap::new();
    for p in pods {
        let mut key = p.allows.clone();
        key.sort_unstable();
        key.dedup();
        let kept = match memo.get(&key) {
            Some(l) => l.clone(),
            None => {
                let l = std::rc::Rc::new(prune(key.iter().flat_map(cubes).collect()));
                memo.insert(key, l.clone());
                l
            }
        };
        for c in kept.iter() {
            flows.push(Flow::new(Table::Policy, ALLOW_PRIORITY, c.to_match(Some(p.ip), None), vec![output_reg2()], None));
        }
        flows.push(isolated_drop(p.ip));
    }
    flows
}

fn isolated_drop(pod: Ipv4Addr) -> Flow {
    Flow::drop(Table::Policy, ISOLATED_PRIORITY, Match::any().ipv4(Ipv4Match { dst: Some(host(pod)), ..Default::default() }))
}

/// The most `conjunction` actions one clause flow carries (16 bytes each: a FLOW_MOD must stay
/// under 64 KiB). A pod in more rules' destination clauses than this loses the rest (less is
/// allowed) and the namespace reports it.
pub const MAX_CONJUNCTIONS_PER_FLOW: usize = 2000;

/// The first conjunction id candidate of a rule (FNV-1a of namespace, policy, rule index and
/// the rule's ports for the pods of this conjunction, never 0: `conj_id=0` is what every
/// packet carries outside a conjunction). Collisions within the namespace move to the next
/// free id, in the order of [`namespace_flows`]' units (sorted by policy, rule, ports).
pub fn conj_id_seed(namespace: &str, policy: &str, rule: usize, ports: &[Dst]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |b: &[u8]| {
        for x in b {
            h ^= u32::from(*x);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    eat(namespace.as_bytes());
    eat(&[0]);
    eat(policy.as_bytes());
    eat(&[0]);
    eat(&(rule as u64).to_be_bytes());
    for d in ports {
        match d {
            Dst::Any => eat(b"*"),
            Dst::Ports { proto, start, end } => {
                eat(&[*proto as u8]);
                eat(&start.to_be_bytes());
                eat(&end.to_be_bytes());
            }
        }
    }
    h.max(1)
}

/// A namespace's table-80 flows: per rule, conjunctive clauses (sources; destination pods;
/// ports) when that is fewer flows than their product, else the product as plain flows; the
/// isolated pods' drops. See the module documentation for the layout.
pub fn namespace_flows(ns: &NamespacePolicy) -> (Vec<Flow>, Vec<String>) {
    let mut errors = Vec::new();
    // Pods allowed everything from everywhere: one plain flow, in no conjunction (its match,
    // `ip,nw_dst=<pod>`, is the pod's destination clause flow's).
    let open: BTreeSet<Ipv4Addr> = ns
        .rules
        .iter()
        .filter(|r| r.srcs.as_ref().is_none_or(|s| s.iter().any(|s| source_member(s).is_none())))
        .flat_map(|r| r.pods.iter().filter(|(_, d)| d.contains(&Dst::Any)).map(|(ip, _)| *ip))
        .collect();
    let mut plain: BTreeMap<Ipv4Addr, Vec<Allow>> = BTreeMap::new();
    for ip in &open {
        plain.entry(*ip).or_default().push(Allow { src: Src::Any, dst: Dst::Any });
    }
    // Conjunction units: (policy, rule, ports) -> source members, pods, port members.
    type Unit = (Option<Vec<Cube>>, Vec<Ipv4Addr>, Option<Vec<Cube>>);
    let mut units: BTreeMap<(&str, usize, Vec<Dst>), Unit> = BTreeMap::new();
    for r in &ns.rules {
        let src_members: Option<Vec<Cube>> = r.srcs.as_ref().and_then(|srcs| {
            let m: Option<BTreeSet<Cube>> = srcs.iter().map(source_member).collect();
            m.map(|m| m.into_iter().collect())
        });
        let mut groups: BTreeMap<Vec<Dst>, Vec<Ipv4Addr>> = BTreeMap::new();
        for (ip, dsts) in &r.pods {
            if open.contains(ip) || dsts.is_empty() {
                continue;
            }
            let mut d = dsts.clone();
            d.sort_unstable();
            d.dedup();
            groups.entry(d).or_default().push(*ip);
        }
        for (dsts, mut pods) in groups {
            pods.sort_unstable();
            pods.dedup();
            let port_members: Option<Vec<Cube>> = (!dsts.contains(&Dst::Any)).then(|| {
                let m: BTreeSet<Cube> = dsts.iter().flat_map(|d| cubes(&Allow { src: Src::Any, dst: *d })).collect();
                m.into_iter().collect()
            });
            if src_members.as_ref().is_some_and(|m| m.is_empty()) || port_members.as_ref().is_some_and(|m| m.is_empty()) {
                continue;
            }
            let (s, p) = (src_members.as_ref().map_or(0, Vec::len), port_members.as_ref().map_or(0, Vec::len));
            let clauses = 1 + usize::from(s > 0) + usize::from(p > 0);
            let product = s.max(1) * pods.len() * p.max(1);
            if ns.vnid.is_none() || clauses < 2 || product <= s + pods.len() + p + 1 {
                let srcs = r.srcs.clone().unwrap_or_else(|| vec![Src::Any]);
                for ip in &pods {
                    let e = plain.entry(*ip).or_default();
                    for s in &srcs {
                        e.extend(dsts.iter().map(|d| Allow { src: *s, dst: *d }));
                    }
                }
            } else {
                let u = units.entry((r.policy.as_str(), r.rule, dsts)).or_insert_with(|| (src_members.clone(), vec![], port_members));
                u.1.extend(pods);
            }
        }
    }
    let isolated: Vec<IsolatedPod> = ns
        .isolated
        .iter()
        .map(|ip| IsolatedPod { ip: *ip, allows: plain.remove(ip).unwrap_or_default() })
        .collect();
    let mut flows = plain_flows(&isolated);
    let Some(vnid) = ns.vnid else { return (flows, errors) };
    // Clause flows by match (a match in several rules' clauses is one flow with all their
    // conjunction actions), in order of first use.
    let mut clause_flows: Vec<(Match, Vec<openflow::Conjunction>)> = Vec::new();
    let mut index: HashMap<Match, usize> = HashMap::new();
    let mut add = |m: Match, c: openflow::Conjunction| match index.get(&m) {
        Some(&i) => clause_flows[i].1.push(c),
        None => {
            index.insert(m.clone(), clause_flows.len());
            clause_flows.push((m, vec![c]));
        }
    };
    let mut used: BTreeSet<u32> = BTreeSet::new();
    let dst_vnid = Some(vnid.get());
    let mut conj_flows = Vec::new();
    for ((policy, rule, dsts), (srcs, mut pods, ports)) in units {
        pods.sort_unstable();
        pods.dedup();
        let mut id = conj_id_seed(&ns.namespace, policy, rule, &dsts);
        while !used.insert(id) {
            id = id.wrapping_add(1).max(1);
        }
        let n = 1 + u8::from(srcs.is_some()) + u8::from(ports.is_some());
        let mut k = 0u8;
        let clause = |k: &mut u8| {
            *k += 1;
            openflow::Conjunction::new(id, *k, n).expect("2 or 3 clauses")
        };
        if let Some(srcs) = srcs {
            let c = clause(&mut k);
            for s in srcs {
                add(s.to_match(None, dst_vnid), c);
            }
        }
        let c = clause(&mut k);
        for ip in pods {
            add(Match::any().ipv4(Ipv4Match { dst: Some(host(ip)), ..Default::default() }), c);
        }
        if let Some(ports) = ports {
            let c = clause(&mut k);
            for p in ports {
                add(p.to_match(None, dst_vnid), c);
            }
        }
        conj_flows.push(Flow::new(
            Table::Policy,
            ALLOW_PRIORITY,
            Match::any().conj_id(id).ipv4(Ipv4Match::default()).reg(Reg::DstVnid.n(), vnid.get()),
            vec![output_reg2()],
            None,
        ));
    }
    for (m, mut cs) in clause_flows {
        cs.sort_unstable_by_key(|c| (c.id(), c.clause()));
        if cs.len() > MAX_CONJUNCTIONS_PER_FLOW {
            errors.push(format!(
                "{m}: in {} rules' clauses, more than the {MAX_CONJUNCTIONS_PER_FLOW} one flow can carry; the rules beyond them are not installed for it (less is allowed)",
                cs.len()
            ));
            cs.truncate(MAX_CONJUNCTIONS_PER_FLOW);
        }
        flows.push(Flow::new(Table::Policy, ALLOW_PRIORITY, m, cs.into_iter().map(openflow::Action::Conjunction).collect(), None));
    }
    flows.extend(conj_flows);
    (flows, errors)
}

/// A source as a clause member: `None` for any source.
fn source_member(s: &Src) -> Option<Cube> {
    let c = cubes(&Allow { src: *s, dst: Dst::Any }).into_iter().next()?;
    (c.reg0.is_some() || c.src.is_some()).then_some(c)
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
        let t: Vec<String> = plain_flows(&[pod]).iter().map(|f| f.to_string()).collect();
        assert_eq!(
            t,
            vec![
                "table=80, priority=150,ip,nw_src=10.128.2.6,nw_dst=10.128.2.5 actions=output:NXM_NX_REG2[]",
                "table=80, priority=150,tcp,reg0=0xb,nw_dst=10.128.2.5,tp_dst=0x1f90/0xfffe actions=output:NXM_NX_REG2[]",
                "table=80, priority=150,ct_state=-inv+trk,tcp,reg0=0xb,nw_dst=10.128.2.5,nw_frag=later actions=output:NXM_NX_REG2[]",
                "table=80, priority=100,ip,nw_dst=10.128.2.5 actions=drop",
            ]
        );
    }

    fn pods(ips: &[&str], d: &[Dst]) -> Vec<(Ipv4Addr, Vec<Dst>)> {
        ips.iter().map(|ip| (ip.parse().unwrap(), d.to_vec())).collect()
    }

    #[test]
    fn rules_become_conjunctions() {
        let tcp80 = Dst::Ports { proto: L4::Tcp, start: 80, end: 80 };
        let v = |n| Src::Vnid(Vnid::new(n).unwrap());
        let ns = NamespacePolicy {
            namespace: "team-a".into(),
            vnid: Some(Vnid::new(20).unwrap()),
            isolated: ["10.128.0.5", "10.128.0.6", "10.128.0.7"].iter().map(|a| a.parse().unwrap()).collect(),
            rules: vec![
                // Two sources, three pods, one port: 2 + 3 + 2 + 1 flows, not 2 * 3 * 2.
                RuleAllow { policy: "web".into(), rule: 0, srcs: Some(vec![v(11), v(12)]), pods: pods(&["10.128.0.5", "10.128.0.6", "10.128.0.7"], &[tcp80]) },
                // Any source, any port to one pod: a plain flow (and the pod leaves the conjunction).
                RuleAllow { policy: "open".into(), rule: 0, srcs: None, pods: pods(&["10.128.0.7"], &[Dst::Any]) },
                // One source, one pod, any port: plain.
                RuleAllow { policy: "one".into(), rule: 0, srcs: Some(vec![v(11)]), pods: pods(&["10.128.0.5"], &[Dst::Any]) },
                // Any source, two pods, one port: two clauses, sharing the pods' and port's flows.
                RuleAllow { policy: "web".into(), rule: 1, srcs: None, pods: pods(&["10.128.0.5", "10.128.0.6"], &[tcp80, Dst::Ports { proto: L4::Udp, start: 53, end: 53 }]) },
            ],
        };
        let (flows, errors) = namespace_flows(&ns);
        assert!(errors.is_empty(), "{errors:?}");
        let a = conj_id_seed("team-a", "web", 0, &[tcp80]);
        let b = conj_id_seed("team-a", "web", 1, &[tcp80, Dst::Ports { proto: L4::Udp, start: 53, end: 53 }]);
        assert_ne!(a, b);
        let t: Vec<String> = flows.iter().map(|f| f.to_string()).collect();
        let (lo, hi) = (a.min(b), a.max(b));
        let (ka, kb) = if a < b { ("2/3", "1/2") } else { ("1/2", "2/3") };
        let (pa, pb) = if a < b { ("3/3", "2/2") } else { ("2/2", "3/3") };
        let want = vec![
            "table=80, priority=150,ip,reg0=0xb,nw_dst=10.128.0.5 actions=output:NXM_NX_REG2[]".to_string(),
            "table=80, priority=100,ip,nw_dst=10.128.0.5 actions=drop".into(),
            "table=80, priority=100,ip,nw_dst=10.128.0.6 actions=drop".into(),
            "table=80, priority=150,ip,nw_dst=10.128.0.7 actions=output:NXM_NX_REG2[]".into(),
            "table=80, priority=100,ip,nw_dst=10.128.0.7 actions=drop".into(),
            format!("table=80, priority=150,ip,reg0=0xb,reg1=0x14 actions=conjunction({a},1/3)"),
            format!("table=80, priority=150,ip,reg0=0xc,reg1=0x14 actions=conjunction({a},1/3)"),
            format!("table=80, priority=150,ip,nw_dst=10.128.0.5 actions=conjunction({lo},{ka}),conjunction({hi},{kb})"),
            format!("table=80, priority=150,ip,nw_dst=10.128.0.6 actions=conjunction({lo},{ka}),conjunction({hi},{kb})"),
            format!("table=80, priority=150,tcp,reg1=0x14,tp_dst=80 actions=conjunction({lo},{pa}),conjunction({hi},{pb})"),
            format!("table=80, priority=150,ct_state=-inv+trk,tcp,reg1=0x14,nw_frag=later actions=conjunction({lo},{pa}),conjunction({hi},{pb})"),
            format!("table=80, priority=150,conj_id={a},ip,reg1=0x14 actions=output:NXM_NX_REG2[]"),
        ];
        // (The udp members and b's conj_id flow follow; checked by presence.)
        for w in &want {
            assert!(t.contains(w), "missing {w}\n{}", t.join("\n"));
        }
        for w in [
            format!("table=80, priority=150,udp,reg1=0x14,tp_dst=53 actions=conjunction({b},2/2)"),
            format!("table=80, priority=150,ct_state=-inv+trk,udp,reg1=0x14,nw_frag=later actions=conjunction({b},2/2)"),
            format!("table=80, priority=150,conj_id={b},ip,reg1=0x14 actions=output:NXM_NX_REG2[]"),
        ] {
            assert!(t.contains(&w), "missing {w}\n{}", t.join("\n"));
        }
        assert_eq!(t.len(), want.len() + 3, "{}", t.join("\n"));
        // Without a VNID of its own, the namespace's rules are plain flows.
        let (plain, _) = namespace_flows(&NamespacePolicy { vnid: None, ..ns.clone() });
        assert!(plain.iter().all(|f| f.match_.conj_id.is_none() && f.to_string().contains("nw_dst=")), "{plain:?}");
        // .5: web/1's four boxes (any source holds web/0's) and one's; .6: web/1's four; .7: open; drops.
        assert_eq!(plain.len(), 5 + 4 + 1 + 3, "{}", plain.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n"));
    }

    #[test]
    fn conj_ids_are_stable_nonzero_and_unique_in_a_namespace() {
        let d = [Dst::Any];
        assert_eq!(conj_id_seed("a", "p", 0, &d), conj_id_seed("a", "p", 0, &d));
        assert_ne!(conj_id_seed("a", "p", 0, &d), conj_id_seed("b", "p", 0, &d));
        assert_ne!(conj_id_seed("a", "p", 0, &d), conj_id_seed("a", "p", 1, &d));
        // Two policies whose seeds collide (found by a birthday search; FNV-1a is fixed):
        // the second in order moves to the next id.
        let mut seen: HashMap<u32, String> = HashMap::new();
        let (p1, p2) = (0..1_000_000)
            .find_map(|i| {
                let name = format!("p{i}");
                let id = conj_id_seed("x", &name, 0, &d);
                seen.insert(id, name.clone()).map(|other| (other, name))
            })
            .expect("a collision among a million 32-bit seeds");
        let seed = conj_id_seed("x", &p1, 0, &d);
        assert_eq!(seed, conj_id_seed("x", &p2, 0, &d));
        let v = |n| Src::Vnid(Vnid::new(n).unwrap());
        let rule = |policy: &str| RuleAllow {
            policy: policy.into(),
            rule: 0,
            srcs: Some(vec![v(11), v(12), v(13)]),
            pods: pods(&["10.128.0.5", "10.128.0.6", "10.128.0.7"], &d),
        };
        let ns = NamespacePolicy { namespace: "x".into(), vnid: Some(Vnid::new(20).unwrap()), isolated: vec![], rules: vec![rule(&p2), rule(&p1)] };
        let (flows, errors) = namespace_flows(&ns);
        assert!(errors.is_empty());
        let ids: BTreeSet<u32> = flows.iter().filter_map(|f| f.match_.conj_id).collect();
        let (first, second) = if p1 < p2 { (p1, p2) } else { (p2, p1) };
        assert_eq!(ids, BTreeSet::from([seed, seed.wrapping_add(1).max(1)]), "{first} keeps {seed}, {second} moves on");
    }

    #[test]
    fn pruning_keeps_everything_allowed() {
        let mut allows = Vec::new();
        for i in 0..6u32 {
            allows.push(Allow { src: Src::Vnid(Vnid::new(i % 3).unwrap()), dst: Dst::Ports { proto: L4::Udp, start: 100 + i as u16, end: 200 } });
            allows.push(Allow { src: Src::Net(format!("10.128.{i}.0/24").parse().unwrap()), dst: Dst::Any });
        }
        allows.push(Allow { src: Src::Net("10.128.0.0/16".parse().unwrap()), dst: Dst::Ports { proto: L4::Tcp, start: 1, end: 65535 } });
        let all: Vec<Cube> = allows.iter().flat_map(cubes).collect();
        let kept = prune(all.clone());
        assert!(kept.len() < all.len());
        for c in &all {
            assert!(kept.iter().any(|k| c.within(k)), "{c:?} lost");
        }
    }
}
