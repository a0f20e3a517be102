//! What each of a namespace's NetworkPolicy flows counts, for the per-policy counters the agent
//! reads from the switch's flow statistics (`sdn_node_policy_*`, `sdn-node status`).
//!
//! Computed by the same pass that makes the flows ([`super::namespace_flows`] and
//! [`counting`] share `build`), so the attribution cannot drift from the flows: a flow is
//! known by its [`FlowKey`] (table, priority, match), which is also what the switch reports.
//!
//! - An allowed flow counts for one rule of one policy: a conjunction's `conj_id` flow for its
//!   rule, a plain flow for the first rule (in the namespace's rule order) that asked for its
//!   box. When several rules allow a packet, the flow OVS chose names the rule, as in the audit
//!   log.
//! - A conjunction's clause flows carry only `conjunction` actions; OVS does not count what
//!   they match usefully, so they count nothing here, and neither do the egress hooks in
//!   tables 21 and 25.
//! - An isolated pod's drop (priority 100) counts the packets dropped for that pod and
//!   direction.
//!
//! What the numbers mean: tables 80 and 27 pass replies, established TCP and UDP connections
//! and UDP whose entry an allowed flow marked (`ct_mark`, see [`super::Side::allow_logged`]:
//! a one-way stream is never `+est`) at priority 200, before any of these flows, so an allowed
//! flow sees a TCP or UDP connection's first packet only (one per new connection; SCTP, ICMP
//! and others packet by packet), while a drop sees every packet it drops (a retransmitted SYN
//! is counted again). The priority-200 flows are the plugin's, not a namespace's: they count
//! nothing.

use std::collections::HashMap;
use std::net::IpAddr;

use super::compile::Role;
use super::{build, NamespacePolicy, Side};
use crate::pipeline::FlowKey;

/// What one flow's packet and byte counters count.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counted {
    /// Packets (a TCP or UDP connection's first) that rule `rule` of `policy` allowed.
    Allowed { side: Side, policy: String, rule: usize },
    /// Packets dropped for the isolated pod `pod` (its IPv4 address, the pod's key, whichever
    /// family the packets were: a dual-stack pod's `ip` and `ipv6` drops count together): no
    /// rule of `side` allowed them.
    Dropped { side: Side, pod: IpAddr },
}

/// A namespace's counting flows, by their identity on the switch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counting {
    pub namespace: String,
    flows: HashMap<FlowKey, Counted>,
}

impl Counting {
    /// What the flow `key` counts (`None`: nothing, or not one of the namespace's flows).
    pub fn get(&self, key: &FlowKey) -> Option<&Counted> {
        self.flows.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&FlowKey, &Counted)> {
        self.flows.iter()
    }

    /// Number of counting flows.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }
}

/// What each of `ns`'s flows ([`super::namespace_flows`] of the same input) counts.
pub fn counting(ns: &NamespacePolicy) -> Counting {
    let (flows, roles, _) = build(ns, true);
    // A pod's drops of both families count together, under its primary address (IPv4 if it
    // has one).
    let primary: HashMap<IpAddr, IpAddr> = ns
        .isolated
        .iter()
        .chain(&ns.egress_isolated)
        .filter_map(|p| Some((p, p.primary()?)))
        .flat_map(|(p, first)| p.iter().map(move |a| (a, first)))
        .collect();
    let mut out = HashMap::with_capacity(roles.len());
    for (f, (side, role)) in flows.iter().zip(roles) {
        let c = match role {
            Role::Uncounted => continue,
            Role::Allowed { policy, rule } => Counted::Allowed { side, policy: policy.to_string(), rule },
            Role::Dropped(ip) => Counted::Dropped { side, pod: primary.get(&ip).copied().unwrap_or(ip) },
        };
        out.insert(f.key(), c);
    }
    Counting { namespace: ns.namespace.clone(), flows: out }
}

#[cfg(test)]
mod tests {
    use super::super::{namespace_flows, Dst, EgressRule, RuleAllow, Src, L4};
    use super::*;
    use crate::domain::Vnid;
    use crate::pipeline::Table;
    use openflow::Action;

    fn ip(a: &str) -> crate::domain::PodIps {
        a.parse().unwrap()
    }

    fn tcp(p: u16) -> Dst {
        Dst::Ports { proto: L4::Tcp, start: p, end: p }
    }

    fn vnid(n: u32) -> Src {
        Src::Vnid(Vnid::new(n).unwrap())
    }

    fn allowed(side: Side, policy: &str, rule: usize) -> Counted {
        Counted::Allowed { side, policy: policy.into(), rule }
    }

    /// What each flow of `ns` counts, by the flow's text (and the flows that count nothing).
    fn by_text(ns: &NamespacePolicy) -> (Vec<(String, Counted)>, Vec<String>) {
        let c = counting(ns);
        let (flows, _) = namespace_flows(ns);
        let (mut counted, mut not) = (Vec::new(), Vec::new());
        for f in &flows {
            match c.get(&f.key()) {
                Some(x) => counted.push((f.to_string(), x.clone())),
                None => not.push(f.to_string()),
            }
        }
        assert_eq!(counted.len(), c.len(), "every counting key is one of the flows");
        (counted, not)
    }

    /// Every flow of tables 80 and 27 that does something (not only `conjunction`) counts, and
    /// no other flow does: what the switch reports for the namespace is all attributed.
    fn assert_complete(ns: &NamespacePolicy) {
        let c = counting(ns);
        let (flows, _) = namespace_flows(ns);
        for f in &flows {
            let in_policy_table = [Table::Policy, Table::PolicyEgress].contains(&f.table);
            let clause = f.instructions.iter().all(|i| match i {
                openflow::Instruction::ApplyActions(a) => !a.is_empty() && a.iter().all(|a| matches!(a, Action::Conjunction(_))),
                _ => false,
            }) && !f.instructions.is_empty();
            assert_eq!(c.get(&f.key()).is_some(), in_policy_table && !clause, "{f}");
        }
    }

    fn ingress_ns(vnid_own: Option<u32>) -> NamespacePolicy {
        let pods = |ips: &[&str], d: &[Dst]| ips.iter().map(|a| (ip(a), d.to_vec())).collect::<Vec<_>>();
        NamespacePolicy {
            namespace: "team-a".into(),
            vnid: vnid_own.map(|v| Vnid::new(v).unwrap()),
            isolated: vec![ip("10.128.0.5"), ip("10.128.0.6"), ip("10.128.0.7")],
            rules: vec![
                // Conjunctive (with a VNID of its own): 2 sources x 3 pods x 1 port.
                RuleAllow { policy: "web".into(), rule: 0, srcs: Some(vec![vnid(11), vnid(12)]), pods: pods(&["10.128.0.5", "10.128.0.6", "10.128.0.7"], &[tcp(80)]) },
                // Opens .7 to everything: one plain flow.
                RuleAllow { policy: "open".into(), rule: 0, srcs: None, pods: pods(&["10.128.0.7"], &[Dst::Any]) },
                // One source, one pod, any port: plain.
                RuleAllow { policy: "one".into(), rule: 0, srcs: Some(vec![vnid(11)]), pods: pods(&["10.128.0.5"], &[Dst::Any]) },
                // The same box for .5 again, from a later rule: counted for the first.
                RuleAllow { policy: "zz-again".into(), rule: 3, srcs: Some(vec![vnid(11)]), pods: pods(&["10.128.0.5"], &[Dst::Any]) },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn conjunctions_plain_flows_and_drops_name_their_rule_or_pod() {
        let ns = ingress_ns(Some(20));
        let (counted, not) = by_text(&ns);
        let find = |prefix: &str| -> Counted {
            let hits: Vec<&Counted> = counted.iter().filter(|(t, _)| t.starts_with(prefix)).map(|(_, c)| c).collect();
            assert_eq!(hits.len(), 1, "{prefix}: {counted:#?}");
            hits[0].clone()
        };
        let web = super::super::conj_id(Vnid::new(20).unwrap(), "team-a", "web", 0, &[tcp(80)]);
        assert_eq!(find(&format!("table=80, priority=150,conj_id={web},")), allowed(Side::Ingress, "web", 0));
        assert_eq!(find("table=80, priority=150,ip,reg0=0xb,nw_dst=10.128.0.5 "), allowed(Side::Ingress, "one", 0));
        assert_eq!(find("table=80, priority=150,ip,nw_dst=10.128.0.7 actions=ct(commit"), allowed(Side::Ingress, "open", 0));
        for pod in ["10.128.0.5", "10.128.0.6", "10.128.0.7"] {
            assert_eq!(find(&format!("table=80, priority=100,ip,nw_dst={pod} ")), Counted::Dropped { side: Side::Ingress, pod: pod.parse().unwrap() });
        }
        // The clause flows count nothing, and they are all that is left.
        assert!(!not.is_empty() && not.iter().all(|t| t.contains("actions=conjunction(")), "{not:#?}");
        assert!(counted.iter().all(|(_, c)| *c != allowed(Side::Ingress, "zz-again", 3)), "a box asked for twice counts for the first rule");
        assert_complete(&ns);
    }

    /// Without a VNID of its own every rule is plain: each box still names the rule it came
    /// from, per pod.
    #[test]
    fn plain_boxes_name_their_rule() {
        let ns = ingress_ns(None);
        let (counted, not) = by_text(&ns);
        assert!(not.is_empty(), "no clause flows: {not:#?}");
        let of = |t: &str| counted.iter().find(|(x, _)| x == t).map(|(_, c)| c.clone()).unwrap_or_else(|| panic!("{t}: {counted:#?}"));
        assert_eq!(of("table=80, priority=150,tcp,reg0=0xc,nw_dst=10.128.0.6,tp_dst=80 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]"), allowed(Side::Ingress, "web", 0));
        assert_eq!(of("table=80, priority=150,ip,reg0=0xb,nw_dst=10.128.0.5 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]"), allowed(Side::Ingress, "one", 0));
        // .5's web/0 box from VNID 11 is inside one/0's (any port): pruned, so one/0 counts it.
        assert!(!counted.iter().any(|(t, _)| t.contains("reg0=0xb,nw_dst=10.128.0.5,tp_dst=80")), "{counted:#?}");
        assert_eq!(of("table=80, priority=150,ip,nw_dst=10.128.0.7 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]"), allowed(Side::Ingress, "open", 0));
        assert_complete(&ns);
    }

    #[test]
    fn egress_counts_in_table_27_and_hooks_count_nothing() {
        let pods = vec![ip("10.128.0.5"), ip("10.128.0.6")];
        let net = |a: &str| Src::Net(a.parse().unwrap());
        let ns = NamespacePolicy {
            namespace: "team-b".into(),
            vnid: Some(Vnid::new(12).unwrap()),
            pod_vnid: Some(Vnid::new(12).unwrap()),
            egress_isolated: pods.clone(),
            egress_rules: vec![
                EgressRule { policy: "db".into(), rule: 0, pods: pods.clone(), peers: vec![(net("10.129.0.8/32"), vec![tcp(5432)]), (net("10.129.0.9/32"), vec![tcp(5432)])] },
                EgressRule { policy: "db".into(), rule: 1, pods: pods.clone(), peers: vec![(net("10.129.0.10/32"), vec![tcp(5433)])] },
            ],
            ..Default::default()
        };
        let (counted, not) = by_text(&ns);
        let db0 = super::super::conj_id_on(Side::Egress, Vnid::new(12).unwrap(), "team-b", "db", 0, &[tcp(5432)]);
        let conj: Vec<&Counted> = counted.iter().filter(|(t, _)| t.contains(&format!("conj_id={db0},"))).map(|(_, c)| c).collect();
        assert_eq!(conj, vec![&allowed(Side::Egress, "db", 0)]);
        let plain: Vec<&Counted> = counted.iter().filter(|(t, _)| t.contains("tp_dst=5433")).map(|(_, c)| c).collect();
        assert_eq!(plain.len(), 2, "{counted:#?}");
        assert!(plain.iter().all(|c| **c == allowed(Side::Egress, "db", 1)));
        for pod in &pods {
            assert!(counted.iter().any(|(t, c)| t.starts_with("table=27, priority=100,") && *c == Counted::Dropped { side: Side::Egress, pod: pod.primary().unwrap() }));
        }
        assert!(not.iter().any(|t| t.starts_with("table=21,")) && not.iter().any(|t| t.starts_with("table=25,")), "{not:#?}");
        assert_complete(&ns);
    }

    /// Both directions, every rule shape and an audit log forcing conjunctions: the flows and
    /// the counting agree on every flow.
    #[test]
    fn every_acting_policy_flow_counts() {
        let mut ns = ingress_ns(Some(20));
        ns.pod_vnid = Some(Vnid::new(20).unwrap());
        ns.egress_isolated = vec![ip("10.128.0.5"), ip("10.128.0.6")];
        ns.egress_rules = vec![
            EgressRule { policy: "out".into(), rule: 0, pods: ns.egress_isolated.clone(), peers: vec![(Src::Any, vec![tcp(443)])] },
            EgressRule { policy: "out".into(), rule: 1, pods: vec![ip("10.128.0.6")], peers: vec![(Src::Any, vec![Dst::Any])] },
        ];
        assert_complete(&ns);
        ns.audit.meter_id = 1;
        ns.audit.allow.insert((Side::Ingress, "one".into(), 0));
        ns.audit.deny.insert((Side::Ingress, "10.128.0.6".parse().unwrap()), "web".into());
        assert_complete(&ns);
        let c = counting(&ns);
        assert!(c.iter().any(|(_, x)| *x == allowed(Side::Egress, "out", 1)) && c.iter().any(|(_, x)| *x == allowed(Side::Ingress, "one", 0)));
        assert!(counting(&NamespacePolicy::default()).is_empty());
    }
}
