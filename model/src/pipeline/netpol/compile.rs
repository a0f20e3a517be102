//! One direction's rules of one namespace as flows: conjunctive clauses where they are fewer
//! flows than the product, plain flows otherwise (see the parent module's documentation).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use openflow::{Ipv4Match, Match};

use super::cube::{cubes, peer_member, plain_flows_seen, Cube};
use super::super::audit::Verdict;
use super::{conj_id_seed_on, Allow, Audit, Dst, IsolatedPod, Side, Src, ALLOW_PRIORITY, MAX_CONJUNCTIONS_PER_FLOW};
use crate::model::Vnid;
use crate::pipeline::Flow;

/// One conjunction's worth of one rule: the peers (`None`: any), the selected pods and the
/// ports they share. An ingress rule gives one group per set of ports its pods resolve to (a
/// named port differs by destination pod); an egress rule one group per set of ports its
/// peers resolve to (a named port resolves on the destination).
#[derive(Clone, Debug)]
pub(super) struct Group<'a> {
    pub(super) policy: &'a str,
    pub(super) rule: usize,
    pub(super) peers: Option<Vec<Src>>,
    pub(super) pods: Vec<Ipv4Addr>,
    /// Sorted, deduplicated, not empty.
    pub(super) ports: Vec<Dst>,
}

impl Group<'_> {
    /// The rule allows its pods everything from (or to) everywhere: any peer, any port.
    fn opens(&self) -> bool {
        self.peers.as_ref().is_none_or(|s| s.iter().any(|s| peer_member(s).is_none())) && self.ports.contains(&Dst::Any)
    }
}

/// What one direction of a namespace compiles from.
pub(super) struct Direction<'a> {
    pub(super) side: Side,
    pub(super) namespace: &'a str,
    /// The namespace's own VNID (see [`super::NamespacePolicy::vnid`]).
    pub(super) vnid: Option<Vnid>,
    /// The pods some policy of this direction selects, in pod order.
    pub(super) isolated: &'a [Ipv4Addr],
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
    /// Packets dropped for this isolated pod: none of its rules allowed them.
    Dropped(Ipv4Addr),
}

/// The direction's flows, what each counts (empty unless [`Direction::roles`]; else one per
/// flow, in order), and the errors (rules cut short).
pub(super) fn compile<'a>(d: Direction<'a>) -> (Vec<Flow>, Vec<Role<'a>>, Vec<String>) {
    let side = d.side;
    let mut errors = Vec::new();
    // The rule each pod's plain box came from (the first to ask for it), for the counters.
    let mut origin: HashMap<Ipv4Addr, HashMap<Cube, (&'a str, usize)>> = HashMap::new();
    let mut note = |ip: Ipv4Addr, a: &Allow, policy: &'a str, rule: usize| {
        if d.roles {
            let o = origin.entry(ip).or_default();
            for c in cubes(a) {
                o.entry(c).or_insert((policy, rule));
            }
        }
    };
    // With some rule logged, every rule that can be is a conjunction (its conj_id flow names
    // the rule); a pod's plain flows are logged as the first logged rule among theirs.
    let audited = d.audit.any_allow(side);
    let mut plain_rule: BTreeMap<Ipv4Addr, (&str, usize)> = BTreeMap::new();
    // Pods allowed everything from (or to) everywhere: one plain flow, in no conjunction (its
    // match, `ip,nw_dst=<pod>` or `ip,nw_src=<pod>`, is the pod's clause flow's).
    let open: BTreeSet<Ipv4Addr> = d.groups.iter().filter(|g| g.opens()).flat_map(|g| g.pods.iter().copied()).collect();
    let mut plain: BTreeMap<Ipv4Addr, Vec<Allow>> = BTreeMap::new();
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
    // Conjunction units: (policy, rule, ports) -> peer members, pods, port members.
    type Unit = (Option<Vec<Cube>>, Vec<Ipv4Addr>, Option<Vec<Cube>>);
    let mut units: BTreeMap<(&str, usize, Vec<Dst>), Unit> = BTreeMap::new();
    for g in &d.groups {
        let peer_members: Option<Vec<Cube>> = g.peers.as_ref().and_then(|peers| {
            let m: Option<BTreeSet<Cube>> = peers.iter().map(peer_member).collect();
            m.map(|m| m.into_iter().collect())
        });
        let mut pods: Vec<Ipv4Addr> = g.pods.iter().copied().filter(|ip| !open.contains(ip)).collect();
        pods.sort_unstable();
        pods.dedup();
        if pods.is_empty() {
            continue;
        }
        let port_members: Option<Vec<Cube>> = (!g.ports.contains(&Dst::Any)).then(|| {
            let m: BTreeSet<Cube> = g.ports.iter().flat_map(|p| cubes(&Allow { src: Src::Any, dst: *p })).collect();
            m.into_iter().collect()
        });
        if peer_members.as_ref().is_some_and(|m| m.is_empty()) || port_members.as_ref().is_some_and(|m| m.is_empty()) {
            continue;
        }
        let (s, p) = (peer_members.as_ref().map_or(0, Vec::len), port_members.as_ref().map_or(0, Vec::len));
        let clauses = 1 + usize::from(s > 0) + usize::from(p > 0);
        let product = s.max(1) * pods.len() * p.max(1);
        if d.vnid.is_none() || clauses < 2 || (!audited && product <= s + pods.len() + p + 1) {
            let peers = g.peers.clone().unwrap_or_else(|| vec![Src::Any]);
            for ip in &pods {
                if d.audit.allows(side, g.policy, g.rule) {
                    plain_rule.entry(*ip).or_insert((g.policy, g.rule));
                }
                let e = plain.entry(*ip).or_default();
                for s in &peers {
                    for p in &g.ports {
                        let a = Allow { src: *s, dst: *p };
                        note(*ip, &a, g.policy, g.rule);
                        e.push(a);
                    }
                }
            }
        } else {
            let u = units.entry((g.policy, g.rule, g.ports.clone())).or_insert_with(|| (peer_members.clone(), vec![], port_members));
            u.1.extend(pods);
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
    let mut used: BTreeSet<u32> = BTreeSet::new();
    let ns_vnid = Some(vnid.get());
    let mut conj_flows = Vec::new();
    let mut conj_roles = Vec::new();
    for ((policy, rule, ports), (peers, mut pods, port_members)) in units {
        pods.sort_unstable();
        pods.dedup();
        let mut id = conj_id_seed_on(side, d.namespace, policy, rule, &ports);
        while !used.insert(id) {
            id = id.wrapping_add(1).max(1);
        }
        let n = 1 + u8::from(peers.is_some()) + u8::from(port_members.is_some());
        let mut k = 0u8;
        let clause = |k: &mut u8| {
            *k += 1;
            openflow::Conjunction::new(id, *k, n).expect("2 or 3 clauses")
        };
        if let Some(peers) = peers {
            let c = clause(&mut k);
            for s in peers {
                add(s.to_match(side, None, ns_vnid), c);
            }
        }
        let c = clause(&mut k);
        for ip in pods {
            add(Match::any().ipv4(side.pod_match(ip)), c);
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
            Match::any().conj_id(id).ipv4(Ipv4Match::default()).reg(side.namespace_reg().n(), vnid.get()),
            d.audit.allow_action(side, d.namespace, policy, rule),
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
