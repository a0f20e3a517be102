//! Per-policy totals from per-flow deltas: which flow counts for what (the model's
//! [`crate::pipeline::netpol::counted`]), summed per policy and direction (allowed) and per
//! namespace, direction and pod (dropped). Pure: the task feeds it reads.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use super::accumulate::Delta;
use crate::pipeline::netpol::counted::{Counted, Counting};
use crate::pipeline::netpol::Side;
use crate::pipeline::FlowKey;
use crate::store::Owner;

/// What every NetworkPolicy flow of the model counts, by flow key (unique on the switch: two
/// owners never share one), with the owner hash of each namespace's cookies.
#[derive(Debug, Default)]
pub struct Attribution {
    by_key: HashMap<FlowKey, (Arc<str>, Counted)>,
    /// The low 32 bits of `Owner::NetworkPolicy { namespace }`'s cookie, per namespace.
    hashes: HashMap<Arc<str>, u32>,
}

/// The owner-hash bits of a cookie.
const HASH_MASK: u64 = 0xffff_ffff;

impl Attribution {
    pub fn new<'a>(namespaces: impl IntoIterator<Item = &'a Counting>) -> Attribution {
        let mut a = Attribution::default();
        for c in namespaces {
            let ns: Arc<str> = c.namespace.as_str().into();
            let hash = (Owner::NetworkPolicy { namespace: c.namespace.clone() }.cookie(0) & HASH_MASK) as u32;
            a.hashes.insert(ns.clone(), hash);
            for (k, x) in c.iter() {
                a.by_key.insert(k.clone(), (ns.clone(), x.clone()));
            }
        }
        a
    }

    /// What the flow `key` with `cookie` counts: `None` when the model has no such flow, or
    /// the cookie names another namespace's owner (someone else's flow, or a stale one).
    pub fn get(&self, key: &FlowKey, cookie: u64) -> Option<(&Arc<str>, &Counted)> {
        let (ns, c) = self.by_key.get(key)?;
        (self.hashes.get(ns).copied() == Some((cookie & HASH_MASK) as u32)).then_some((ns, c))
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// Packets and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    pub packets: u64,
    pub bytes: u64,
}

impl Count {
    fn add(&mut self, d: &Delta) {
        self.packets = self.packets.saturating_add(d.packets);
        self.bytes = self.bytes.saturating_add(d.bytes);
    }
}

/// One policy's allowed connections in one direction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowed {
    /// First packets of TCP/UDP connections, every packet of other protocols.
    pub total: Count,
    /// The same by rule index.
    pub rules: BTreeMap<usize, u64>,
}

/// Everything counted since the agent started, for the policies and pods the model has now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub allowed: BTreeMap<(String, String, Side), Allowed>,
    pub dropped: BTreeMap<(String, Side), Count>,
    /// By the pod's first address (IPv4, or IPv6 on an IPv6-only node).
    pub dropped_pods: BTreeMap<(String, Side, IpAddr), Count>,
    /// Counted by NetworkPolicy flows the model does not name (a change the switch has and
    /// the model no longer, or not yet).
    pub unattributed: Count,
}

impl Totals {
    /// Adds one read's deltas (flow key, cookie, delta).
    pub fn add(&mut self, attr: &Attribution, deltas: &[(FlowKey, u64, Delta)]) {
        for (key, cookie, d) in deltas {
            if d.packets == 0 && d.bytes == 0 {
                continue;
            }
            match attr.get(key, *cookie) {
                Some((ns, Counted::Allowed { side, policy, rule })) => {
                    let a = self.allowed.entry((ns.to_string(), policy.clone(), *side)).or_default();
                    a.total.add(d);
                    let r = a.rules.entry(*rule).or_default();
                    *r = r.saturating_add(d.packets);
                }
                Some((ns, Counted::Dropped { side, pod })) => {
                    self.dropped.entry((ns.to_string(), *side)).or_default().add(d);
                    self.dropped_pods.entry((ns.to_string(), *side, *pod)).or_default().add(d);
                }
                None => self.unattributed.add(d),
            }
        }
    }

    /// Keeps what `attr` can count (starting the new at zero, so every series exists before it
    /// first moves) and forgets the rest: a deleted policy, namespace or pod leaves, so the
    /// series stay as many as the policies and namespaces there are.
    pub fn retain_known(&mut self, attr: &Attribution) {
        let mut allowed = BTreeMap::new();
        let mut dropped = BTreeMap::new();
        let mut pods = BTreeMap::new();
        for (ns, c) in attr.by_key.values() {
            match c {
                // Many flows name one series: moved over on the first, kept after.
                Counted::Allowed { side, policy, .. } => {
                    let k = (ns.to_string(), policy.clone(), *side);
                    if let std::collections::btree_map::Entry::Vacant(e) = allowed.entry(k) {
                        let v = self.allowed.remove(e.key()).unwrap_or_default();
                        e.insert(v);
                    }
                }
                Counted::Dropped { side, pod } => {
                    let k = (ns.to_string(), *side);
                    if let std::collections::btree_map::Entry::Vacant(e) = dropped.entry(k) {
                        let v = self.dropped.remove(e.key()).unwrap_or_default();
                        e.insert(v);
                    }
                    let k = (ns.to_string(), *side, *pod);
                    if let std::collections::btree_map::Entry::Vacant(e) = pods.entry(k) {
                        let v = self.dropped_pods.remove(e.key()).unwrap_or_default();
                        e.insert(v);
                    }
                }
            }
        }
        self.allowed = allowed;
        self.dropped = dropped;
        self.dropped_pods = pods;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::netpol::{counted::counting, Dst, NamespacePolicy, RuleAllow, Src, L4};

    fn ns(name: &str, policy: &str) -> NamespacePolicy {
        let pod: crate::domain::PodIps = "10.128.0.5".parse().unwrap();
        NamespacePolicy {
            namespace: name.into(),
            isolated: vec![pod],
            rules: vec![RuleAllow {
                policy: policy.into(),
                rule: 2,
                srcs: Some(vec![Src::Net("10.128.0.9/32".parse().unwrap())]),
                pods: vec![(pod, vec![Dst::Ports { proto: L4::Tcp, start: 80, end: 80 }])],
            }],
            ..Default::default()
        }
    }

    fn cookie(ns: &str) -> u64 {
        Owner::NetworkPolicy { namespace: ns.into() }.cookie(3)
    }

    #[test]
    fn deltas_go_to_their_policy_pod_or_unattributed() {
        let (a, b) = (counting(&ns("a", "web")), counting(&ns("b", "web")));
        // The same flows in two namespaces would be one key on a real switch; here b's keys
        // differ by nothing, so a's cookie decides (b is built for the cookie check below).
        let attr = Attribution::new([&a]);
        let mut t = Totals::default();
        t.retain_known(&attr);
        assert_eq!(t.allowed[&("a".into(), "web".into(), Side::Ingress)], Allowed::default(), "known series start at zero");
        let d = |p| Delta { packets: p, bytes: p * 60 };
        let mut deltas = Vec::new();
        for (k, c) in a.iter() {
            let n = match c {
                Counted::Allowed { .. } => 1,
                Counted::Dropped { .. } => 5,
            };
            deltas.push((k.clone(), cookie("a"), d(n)));
            // The same key under another namespace's cookie: not a's.
            deltas.push((k.clone(), cookie("b"), d(100)));
        }
        t.add(&attr, &deltas);
        let allowed = &t.allowed[&("a".into(), "web".into(), Side::Ingress)];
        // One plain flow for the port and its later-fragment twin: 2 flows, 1 each.
        assert_eq!(allowed.total, Count { packets: 2, bytes: 120 });
        assert_eq!(allowed.rules, BTreeMap::from([(2, 2)]));
        assert_eq!(t.dropped[&("a".into(), Side::Ingress)], Count { packets: 5, bytes: 300 });
        assert_eq!(t.dropped_pods[&("a".into(), Side::Ingress, "10.128.0.5".parse().unwrap())].packets, 5);
        assert_eq!(t.unattributed.packets, 100 * (a.len() as u64));
        assert_eq!(b.len(), a.len());
    }

    /// Policies that leave the model leave the totals; those that stay keep their counts.
    #[test]
    fn retain_known_keeps_counts_and_forgets_the_gone() {
        let a = counting(&ns("a", "web"));
        let attr = Attribution::new([&a]);
        let mut t = Totals::default();
        let deltas: Vec<_> = a.iter().map(|(k, _)| (k.clone(), cookie("a"), Delta { packets: 1, bytes: 1 })).collect();
        t.add(&attr, &deltas);
        let before = t.clone();
        t.retain_known(&attr);
        assert_eq!(t, before);
        let renamed = counting(&ns("a", "web2"));
        let attr2 = Attribution::new([&renamed]);
        t.retain_known(&attr2);
        assert!(!t.allowed.contains_key(&("a".into(), "web".into(), Side::Ingress)));
        assert_eq!(t.allowed[&("a".into(), "web2".into(), Side::Ingress)], Allowed::default());
        assert_eq!(t.dropped[&("a".into(), Side::Ingress)].packets, 1, "the namespace's drops stay");
    }
}
