//! One direction's rules of one namespace as flows: conjunctive clauses where they are fewer
//! flows than the product, plain flows otherwise (see the parent module's documentation).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use openflow::Match;

use super::cube::{cubes, peer_member, plain_flows_seen, Cube};
use super::family::{any_ip, Family};
use super::super::audit::Verdict;
use super::{conj_id_for, next_conj_id, Allow, Audit, Dst, IsolatedPod, Side, Src, ALLOW_PRIORITY, CONJUNCTIONS_PER_NAMESPACE};
use crate::domain::Vnid;
use crate::pipeline::Flow;

/// One conjunction's worth of one rule: the peers (`None`: any), the selected pods and the
/// ports they share. An ingress rule gives one group per set of ports its pods resolve to (a
/// named port differs by destination pod); an egress rule one group per set of ports its
/// peers resolve to (a named port resolves on the destination). A group is of one family: its
/// pods' addresses and its address peers are of `family` (a rule of a dual-stack namespace is
/// two groups, two conjunctions with ids of their own).
#[derive(Clone, Debug)]
pub(super) struct Group<'a> {
    pub(super) family: Family,
    pub(super) policy: &'a str,
    pub(super) rule: usize,
    /// Peers of `family` or of any family (any, VNIDs).
    pub(super) peers: Option<Vec<Src>>,
    pub(super) pods: Vec<IpAddr>,
    /// Sorted, deduplicated, not empty.
    pub(super) ports: Vec<Dst>,
}

impl Group<'_> {
    /// The rule allows its pods everything from (or to) everywhere: any peer, any port.
    fn opens(&self) -> bool {
        self.peers.as_ref().is_none_or(|s| s.iter().any(|s| peer_member(s, self.family).is_none())) && self.ports.contains(&Dst::Any)
    }
}

/// What one direction of a namespace compiles from.
pub(super) struct Direction<'a> {
    pub(super) side: Side,
    pub(super) namespace: &'a str,
    /// The namespace's own VNID (see [`super::NamespacePolicy::vnid`]).
    pub(super) vnid: Option<Vnid>,
    /// The addresses of the pods some policy of this direction selects, in pod order (IPv4
    /// then IPv6).
    pub(super) isolated: Vec<IpAddr>,
    pub(super) groups: Vec<Group<'a>>,
    pub(super) audit: &'a Audit,
    /// Say what each flow counts ([`Role`]); off where only the flows are wanted.
    pub(super) roles: bool,
}

/// What one compiled flow's packet counter counts (see `super::counted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role<'a> {
    /// Nothing useful: a conjunction's clause flow (its actions are only `conjunction`).
    Uncounted,
    /// Connections one rule of one policy allowed: a plain flow made for the rule (the first
    /// rule, in group order, that asked for its box), or a conjunction's `conj_id` flow.
    Allowed { policy: &'a str, rule: usize },
    /// Packets dropped for this isolated pod (by its address of the flow's family): none of
    /// its rules allowed them.
    Dropped(IpAddr),
}

/// The direction's flows, what each counts (empty unless [`Direction::roles`]; else one per
/// flow, in order), and the errors (rules cut short).
pub(super) fn compile<'a>(d: Direction<'a>) -> (Vec<Flow>, Vec<Role<'a>>, Vec<String>) {
    let side = d.side;
    let mut errors = Vec::new();
    // The rule each pod's plain box came from (the first to ask for it), for the counters.
    let mut origin: HashMap<IpAddr, HashMap<Cube, (&'a str, usize)>> = HashMap::new();
    let mut note = |ip: IpAddr, a: &Allow, policy: &'a str, rule: usize| {
        if d.roles {
            let o = origin.entry(ip).or_default();
            for c in cubes(a, Family::of(ip)) {
                o.entry(c).or_insert((policy, rule));
            }
        }
    };
    // With some rule logged, every rule that can be is a conjunction (its conj_id flow names
    // the rule); a pod's plain flows are logged as the first logged rule among theirs.
    let audited = d.audit.any_allow(side);
    let mut plain_rule: BTreeMap<IpAddr, (&str, usize)> = BTreeMap::new();
    // Pods allowed everything from (or to) everywhere: one plain flow, in no conjunction (its
    // match, `ip,nw_dst=<pod>` or `ip,nw_src=<pod>`, is the pod's clause flow's).
    let open: BTreeSet<IpAddr> = d.groups.iter().filter(|g| g.opens()).flat_map(|g| g.pods.iter().copied()).collect();
    let mut plain: BTreeMap<IpAddr, Vec<Allow>> = BTreeMap::new();
    for ip in &open {
        plain.entry(*ip).or_default().push(Allow { src: Src::Any, dst: Dst::Any });
    }
    for g in d.groups.iter().filter(|g| g.opens()) {
        for ip in &g.pods {
            note(*ip, &Allow { src: Src::Any, dst: Dst::Any }, g.policy, g.rule);
        }
    }
    for g in d.groups.iter().filter(|g| audited && g.opens() && d.audit.allows(side, g.policy, g.rule)) {
        for ip in &g.pods {
            plain_rule.entry(*ip).or_insert((g.policy, g.rule));
        }
    }
    // Conjunction units: (family, policy, rule, ports) -> peers, peer members, pods, port
    // members. A unit is of one family: its clauses match `ip` or `ipv6` packets only.
    type Unit = (Option<Vec<Src>>, Option<Vec<Cube>>, Vec<IpAddr>, Option<Vec<Cube>>);
    type UnitKey<'k> = (Family, &'k str, usize, Vec<Dst>);
    let mut units: BTreeMap<UnitKey<'_>, Unit> = BTreeMap::new();
    // Rules (or parts) made plain flows: (policy, rule, peers, ports, pods).
    type PlainRule<'p> = (&'p str, usize, Vec<Src>, Vec<Dst>, Vec<IpAddr>);
    let mut plain_rules: Vec<PlainRule<'a>> = Vec::new();
    for g in &d.groups {
        let family = g.family;
        // Peers of the other family allow nothing here (callers leave them out already).
        let peers: Option<Vec<Src>> = g.peers.as_ref().map(|p| p.iter().copied().filter(|s| s.family().is_none_or(|f| f == family)).collect());
        let peer_members: Option<Vec<Cube>> = peers.as_ref().and_then(|peers| {
            let m: Option<BTreeSet<Cube>> = peers.iter().map(|s| peer_member(s, family)).collect();
            m.map(|m| m.into_iter().collect())
        });
        let mut pods: Vec<IpAddr> = g.pods.iter().copied().filter(|ip| Family::of(*ip) == family && !open.contains(ip)).collect();
        pods.sort_unstable();
        pods.dedup();
        if pods.is_empty() {
            continue;
        }
        let port_members: Option<Vec<Cube>> = (!g.ports.contains(&Dst::Any)).then(|| {
            let m: BTreeSet<Cube> = g.ports.iter().flat_map(|p| cubes(&Allow { src: Src::Any, dst: *p }, family)).collect();
            m.into_iter().collect()
        });
        if peer_members.as_ref().is_some_and(|m| m.is_empty()) || port_members.as_ref().is_some_and(|m| m.is_empty()) {
            continue;
        }
        let (s, p) = (peer_members.as_ref().map_or(0, Vec::len), port_members.as_ref().map_or(0, Vec::len));
        let clauses = 1 + usize::from(s > 0) + usize::from(p > 0);
        let product = s.max(1) * pods.len() * p.max(1);
        if d.vnid.is_none() || clauses < 2 || (!audited && product <= s + pods.len() + p + 1) {
            plain_rules.push((g.policy, g.rule, peers.unwrap_or_else(|| vec![Src::Any]), g.ports.clone(), pods));
        } else {
            let u = units.entry((family, g.policy, g.rule, g.ports.clone())).or_insert_with(|| (peers, peer_members.clone(), vec![], port_members));
            u.2.extend(pods);
        }
    }
    // Conjunction ids, unique on the node: the namespace's VNID, then one of 255 per direction
    // (see `conj_id_on`), shared by the two families. Units beyond them are plain flows.
    let mut ids: BTreeMap<UnitKey<'_>, u32> = BTreeMap::new();
    if let Some(vnid) = d.vnid {
        let mut used: BTreeSet<u32> = BTreeSet::new();
        let mut beyond = Vec::new();
        for (family, policy, rule, ports) in units.keys() {
            let first = conj_id_for(side, *family, vnid, d.namespace, policy, *rule, ports);
            let mut id = first;
            while used.contains(&id) {
                id = next_conj_id(id);
                if id == first {
                    break;
                }
            }
            if used.insert(id) {
                ids.insert((*family, *policy, *rule, ports.clone()), id);
            } else {
                beyond.push((*family, *policy, *rule, ports.clone()));
            }
        }
        if !beyond.is_empty() {
            errors.push(format!(
                "{} {side:?} rules (policy, rule and ports) in one namespace, more than the {CONJUNCTIONS_PER_NAMESPACE} conjunctions a namespace has per direction: {} of them are plain flows (one per pod, peer and port)",
                units.len(),
                beyond.len()
            ));
        }
        for k in beyond {
            if let Some((peers, _, pods, _)) = units.remove(&k) {
                plain_rules.push((k.1, k.2, peers.unwrap_or_else(|| vec![Src::Any]), k.3, pods));
            }
        }
    }
    for (policy, rule, peers, ports, pods) in &plain_rules {
        for ip in pods {
            if d.audit.allows(side, policy, *rule) {
                plain_rule.entry(*ip).or_insert((policy, *rule));
            }
            let e = plain.entry(*ip).or_default();
            for s in peers {
                for p in ports {
                    let a = Allow { src: *s, dst: *p };
                    note(*ip, &a, policy, *rule);
                    e.push(a);
                }
            }
        }
    }
    let isolated: Vec<IsolatedPod> =
        d.isolated.iter().map(|ip| IsolatedPod { ip: *ip, allows: plain.remove(ip).unwrap_or_default() }).collect();
    let mut roles = Vec::new();
    let log = |ip, verdict| match verdict {
        Verdict::Allow => plain_rule.get(&ip).and_then(|(policy, rule)| d.audit.allow_action(side, d.namespace, policy, *rule)),
        Verdict::Deny => d.audit.deny_action(side, d.namespace, ip),
    };
    let mut flows = plain_flows_seen(side, &isolated, log, |ip, cube| {
        if d.roles {
            roles.push(match cube {
                // Pruning keeps some of the boxes asked for, so each has an origin.
                Some(c) => origin.get(&ip).and_then(|o| o.get(c)).map_or(Role::Uncounted, |&(policy, rule)| Role::Allowed { policy, rule }),
                None => Role::Dropped(ip),
            })
        }
    });
    let Some(vnid) = d.vnid else { return (flows, roles, errors) };
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
    let ns_vnid = Some(vnid.get());
    let mut conj_flows = Vec::new();
    let mut conj_roles = Vec::new();
    for ((family, policy, rule, ports), (_, peers, mut pods, port_members)) in units {
        pods.sort_unstable();
        pods.dedup();
        let Some(&id) = ids.get(&(family, policy, rule, ports)) else { continue };
        let n = 1 + u8::from(peers.is_some()) + u8::from(port_members.is_some());
        let mut k = 0u8;
        let clause = |k: &mut u8| {
            *k += 1;
            openflow::Conjunction::new(id, *k, n).expect("2 or 3 clauses")
        };
        // Peers do not name the namespace: one flow per peer on the node, whichever
        // namespaces' rules name it (the store merges their conjunction actions).
        if let Some(peers) = peers {
            let c = clause(&mut k);
            for s in peers {
                add(s.to_match(side, None, None), c);
            }
        }
        let c = clause(&mut k);
        for ip in pods {
            add(side.pod_match(ip), c);
        }
        if let Some(port_members) = port_members {
            let c = clause(&mut k);
            for p in port_members {
                add(p.to_match(side, None, ns_vnid), c);
            }
        }
        conj_roles.push(Role::Allowed { policy, rule });
        conj_flows.push(side.allow_logged(
            ALLOW_PRIORITY,
            any_ip(family).conj_id(id).reg(side.namespace_reg().n(), vnid.get()),
            d.audit.allow_action(side, d.namespace, policy, rule),
        ));
    }
    for (m, mut cs) in clause_flows {
        // At most one action per conjunction, so at most CONJUNCTIONS_PER_NAMESPACE: a FLOW_MOD
        // carries them (the store bounds what several namespaces' flows merge into).
        cs.sort_unstable_by_key(|c| (c.id(), c.clause()));
        flows.push(Flow::new(side.table(), ALLOW_PRIORITY, m, cs.into_iter().map(openflow::Action::Conjunction).collect(), None));
        if d.roles {
            roles.push(Role::Uncounted);
        }
    }
    flows.extend(conj_flows);
    if d.roles {
        roles.extend(conj_roles);
    }
    (flows, roles, errors)
}
