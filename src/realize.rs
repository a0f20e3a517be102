//! Policy realization: how long each NetworkPolicy change takes from its source event (the
//! Kubernetes watch event, the state file change) to the switch's acknowledgement of the
//! bundle that carries its flows, and which generation of each policy the switch holds.
//!
//! The sources stamp every policy with its generation and the instant they saw it
//! ([`crate::cluster::Loaded::policies_seen`]); [`Realization::seen`] takes those stamps in
//! under the model lock, together with the state itself. A commit computed from the model then
//! takes a [`Ticket`] — also under the model lock, so it names exactly the generations its
//! flows were computed from — for the namespaces whose NetworkPolicy owner it recomputes (a
//! full converge: all of them). When the engine answers that commit with success, the ticket's
//! policies are *realized* at those generations and `now - seen` goes into
//! `sdn_node_policy_realization_seconds`.
//!
//! A change that leaves the namespace's flows as they are (a no-op for the switch) counts as
//! realized when the commit that recomputed it is answered: at once if that commit had nothing
//! to send (the engine answers without a bundle), or when the bundle it joined (a group
//! commit with other updates) is acknowledged. Either way the switch then holds what the policy
//! asks for, which is what "realized" promises. Deleted policies leave the table (their removal
//! is not timed). Only the networkpolicy plugin enforces policies: under the others none are
//! tracked.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::Histogram;

use crate::cluster::{Loaded, PolicyKey};
use crate::domain::Plugin;

/// One policy's realization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The generation the source has.
    pub seen: i64,
    /// When the source first saw it.
    pub seen_at: Instant,
    /// The generation the switch is known to hold (`None`: none yet).
    pub realized: Option<i64>,
    /// Source event to acknowledgement, for the last generation realized.
    pub last_latency: Option<Duration>,
}

/// The policies one commit covers, at the generations its flows were computed from.
#[derive(Debug, Default)]
#[must_use = "a ticket is realized when its commit is acknowledged"]
pub struct Ticket(Vec<(PolicyKey, i64, Instant)>);

impl Ticket {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Every policy's realization (shared by the reconciler, the pod path and status).
#[derive(Debug)]
pub struct Realization {
    policies: Mutex<BTreeMap<PolicyKey, Entry>>,
    histogram: Histogram,
}

impl Realization {
    /// Observations go into `histogram` (registered by [`crate::metrics::Metrics`]).
    pub fn new(histogram: Histogram) -> Realization {
        Realization { policies: Mutex::default(), histogram }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<PolicyKey, Entry>> {
        self.policies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new source state (call under the model lock, with the model's change): its policies'
    /// generations are seen; policies it no longer has are forgotten.
    pub fn seen(&self, loaded: &Loaded) {
        let mut all = self.lock();
        if loaded.state.plugin != Plugin::NetworkPolicy {
            all.clear();
            return;
        }
        all.retain(|k, _| loaded.policies_seen.contains_key(k));
        for (k, s) in &loaded.policies_seen {
            let e = all.entry(k.clone()).or_insert(Entry {
                seen: s.generation,
                seen_at: s.at,
                realized: None,
                last_latency: None,
            });
            if e.seen != s.generation {
                e.seen = s.generation;
                e.seen_at = s.at;
            }
        }
    }

    /// The policies a commit computed now covers: those of `namespaces` (`None`: every
    /// namespace) whose seen generation is not realized yet. Call under the model lock.
    pub fn ticket(&self, namespaces: Option<&BTreeSet<String>>) -> Ticket {
        let all = self.lock();
        Ticket(
            all.iter()
                .filter(|(k, e)| e.realized != Some(e.seen) && namespaces.is_none_or(|n| n.contains(&k.0)))
                .map(|(k, e)| (k.clone(), e.seen, e.seen_at))
                .collect(),
        )
    }

    /// The commit `ticket` was taken for is acknowledged: its policies are realized at the
    /// ticket's generations (a generation the switch already holds is not timed twice).
    pub fn realized(&self, ticket: Ticket) {
        if ticket.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut all = self.lock();
        for (k, generation, at) in ticket.0 {
            let Some(e) = all.get_mut(&k) else { continue };
            if e.realized.is_some_and(|r| r >= generation) {
                continue;
            }
            let latency = now.saturating_duration_since(at);
            e.realized = Some(generation);
            e.last_latency = Some(latency);
            self.histogram.observe(latency.as_secs_f64());
        }
    }

    /// Every policy, by (namespace, name).
    pub fn snapshot(&self) -> Vec<(PolicyKey, Entry)> {
        self.lock().iter().map(|(k, e)| (k.clone(), *e)).collect()
    }
}

/// The namespaces whose NetworkPolicy owner is among `owners`.
pub fn policy_namespaces<'a>(owners: impl IntoIterator<Item = &'a crate::store::Owner>) -> BTreeSet<String> {
    owners
        .into_iter()
        .filter_map(|o| match o {
            crate::store::Owner::NetworkPolicy { namespace } => Some(namespace.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{state_file, PoliciesSeen, PolicySeen};

    fn loaded(plugin: &str, policies: &[(&str, &str, i64, Instant)]) -> Loaded {
        let text = format!(
            "node: node-a\nplugin: {plugin}\nclusterNetwork: 10.128.0.0/14\nserviceNetwork: 172.30.0.0/16\nhostSubnets:\n  - {{host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}}\n"
        );
        let (state, problems) = state_file::parse(&text).unwrap();
        let policies_seen: PoliciesSeen = policies
            .iter()
            .map(|(ns, n, g, at)| ((ns.to_string(), n.to_string()), PolicySeen { generation: *g, at: *at }))
            .collect();
        Loaded {
            state,
            problems,
            live_pods: None,
            touched: None,
            seq: 0,
            pod_annotations: Default::default(),
            policies_seen,
        }
    }

    fn count(h: &Histogram) -> u64 {
        let mut r = prometheus_client::registry::Registry::default();
        r.register("h", "", h.clone());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out.lines().find_map(|l| l.strip_prefix("h_count ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    }

    fn key(ns: &str, n: &str) -> PolicyKey {
        (ns.into(), n.into())
    }

    /// A ticket covers what was seen when it was taken: a generation seen while its commit is
    /// in flight waits for a later commit, and the histogram counts each generation once.
    #[test]
    fn a_ticket_realizes_the_generations_it_was_taken_for() {
        let h = Histogram::new([0.001, 1.0]);
        let r = Realization::new(h.clone());
        let t0 = Instant::now();
        r.seen(&loaded("networkpolicy", &[("a", "x", 1, t0), ("b", "y", 4, t0)]));
        let only_a = r.ticket(Some(&BTreeSet::from(["a".to_string()])));
        r.seen(&loaded("networkpolicy", &[("a", "x", 2, t0), ("b", "y", 4, t0)]));
        r.realized(only_a);
        let snap: BTreeMap<_, _> = r.snapshot().into_iter().collect();
        assert_eq!(snap[&key("a", "x")].realized, Some(1), "the ticket's generation, not the newer one");
        assert_eq!(snap[&key("a", "x")].seen, 2);
        assert_eq!(snap[&key("b", "y")].realized, None, "not covered");
        assert_eq!(count(&h), 1);
        let all = r.ticket(None);
        r.realized(all);
        let snap: BTreeMap<_, _> = r.snapshot().into_iter().collect();
        assert_eq!((snap[&key("a", "x")].realized, snap[&key("b", "y")].realized), (Some(2), Some(4)));
        assert!(snap[&key("a", "x")].last_latency.is_some());
        assert_eq!(count(&h), 3);
        // Nothing left to realize: an empty ticket, nothing counted.
        let again = r.ticket(None);
        assert!(again.is_empty());
        r.realized(again);
        assert_eq!(count(&h), 3);
    }

    /// Two tickets for one generation (a pod's commit and the reconciler's): timed once.
    #[test]
    fn a_generation_is_timed_once() {
        let h = Histogram::new([1.0]);
        let r = Realization::new(h.clone());
        r.seen(&loaded("networkpolicy", &[("a", "x", 7, Instant::now())]));
        let (t1, t2) = (r.ticket(None), r.ticket(None));
        r.realized(t2);
        r.realized(t1);
        assert_eq!(count(&h), 1);
    }

    #[test]
    fn deleted_policies_and_other_plugins_are_not_tracked() {
        let r = Realization::new(Histogram::new([1.0]));
        let t0 = Instant::now();
        r.seen(&loaded("networkpolicy", &[("a", "x", 1, t0), ("a", "y", 1, t0)]));
        r.seen(&loaded("networkpolicy", &[("a", "y", 1, t0)]));
        assert_eq!(r.snapshot().into_iter().map(|(k, _)| k).collect::<Vec<_>>(), vec![key("a", "y")]);
        r.seen(&loaded("multitenant", &[("a", "y", 1, t0)]));
        assert!(r.snapshot().is_empty());
    }
}
