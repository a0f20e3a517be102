//! The objects the agent rejects now, each with when it was first rejected as it is: what
//! `sdn-node status` lists and the `sdn_node_rejected_objects{kind}` gauge counts. (The counter
//! `sdn_node_objects_rejected_total` counts every rejection since start; this is the current
//! set, cleared when the object is fixed or goes.)

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::SystemTime;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::cluster::Problem;

/// A metric's `kind` label (an object kind: pod, namespace, policy, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// Where a set of problems comes from: each replaces only its own slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The source's state (the state file, Kubernetes) and the pod API pods that no longer fit
    /// in it: replaced with each new source state.
    Source,
    /// What the last converge pass found (a pod's port OVSDB refused, a policy part the
    /// pipeline cannot program): replaced after each pass.
    Pass,
}

/// The kinds the gauge shows from start (at 0).
pub const KINDS: [&str; 7] =
    ["pod", "service", "hostsubnet", "netnamespace", "egressnetworkpolicy", "networkpolicy", "remotepod"];

/// One current rejection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub problem: Problem,
    /// When the agent first found this object rejected with this field and message (without a
    /// break since).
    pub since: SystemTime,
}

type Key = (String, String, String);

fn key(p: &Problem) -> Key {
    (p.object.clone(), p.field.clone(), p.message.clone())
}

#[derive(Debug, Default)]
struct Inner {
    source: Vec<Problem>,
    pass: Vec<Problem>,
    since: BTreeMap<Key, SystemTime>,
    /// Every kind the gauge has shown (set back to 0 when its last rejection clears).
    kinds: BTreeSet<String>,
}

/// The current rejections and their gauge.
#[derive(Debug)]
pub struct Rejections {
    inner: Mutex<Inner>,
    /// Objects rejected now, by kind.
    pub gauge: Family<KindLabel, Gauge>,
}

impl Default for Rejections {
    fn default() -> Self {
        let r = Rejections { inner: Mutex::default(), gauge: Family::default() };
        {
            let mut i = r.inner.lock().unwrap_or_else(|e| e.into_inner());
            for k in KINDS {
                r.gauge.get_or_create(&KindLabel { kind: k.into() }).set(0);
                i.kinds.insert(k.into());
            }
        }
        r
    }
}

/// "pod team-a/a1" -> "pod".
fn kind_of(object: &str) -> &str {
    object.split_whitespace().next().unwrap_or("unknown")
}

impl Rejections {
    /// Replaces `slot`'s problems with `problems` at `now`: a problem already current keeps
    /// its first-seen time; one no longer in either slot is cleared.
    pub fn set_at(&self, slot: Slot, problems: &[Problem], now: SystemTime) {
        let mut i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match slot {
            Slot::Source => i.source = problems.to_vec(),
            Slot::Pass => i.pass = problems.to_vec(),
        }
        let current: BTreeSet<Key> = i.source.iter().chain(&i.pass).map(key).collect();
        i.since.retain(|k, _| current.contains(k));
        let mut per_kind: BTreeMap<String, i64> = BTreeMap::new();
        for k in current {
            *per_kind.entry(kind_of(&k.0).to_string()).or_default() += 1;
            i.since.entry(k).or_insert(now);
        }
        i.kinds.extend(per_kind.keys().cloned());
        for kind in &i.kinds {
            self.gauge.get_or_create(&KindLabel { kind: kind.clone() }).set(per_kind.get(kind).copied().unwrap_or(0));
        }
    }

    /// [`Rejections::set_at`] now.
    pub fn set(&self, slot: Slot, problems: &[Problem]) {
        self.set_at(slot, problems, SystemTime::now())
    }

    /// The current rejections, by object, field and message.
    pub fn current(&self) -> Vec<Rejection> {
        let i = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        i.since
            .iter()
            .map(|((object, field, message), since)| Rejection {
                problem: Problem::new(object, field, message),
                since: *since,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn first_seen_is_kept_and_fixed_objects_clear() {
        let r = Rejections::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let t1 = t0 + Duration::from_secs(5);
        let typo = Problem::new("pod a/p1", "internl", "unknown field `internl`");
        let port = Problem::new("pod a/p2", "hostVeth", "no such device");
        r.set_at(Slot::Source, std::slice::from_ref(&typo), t0);
        r.set_at(Slot::Pass, std::slice::from_ref(&port), t1);
        r.set_at(Slot::Source, std::slice::from_ref(&typo), t1);
        let now = r.current();
        assert_eq!(
            now,
            vec![Rejection { problem: typo.clone(), since: t0 }, Rejection { problem: port.clone(), since: t1 }]
        );
        let gauge = |r: &Rejections, k: &str| r.gauge.get_or_create(&KindLabel { kind: k.into() }).get();
        assert_eq!(gauge(&r, "pod"), 2);
        // Both slots name the same problem: counted once.
        r.set_at(Slot::Pass, &[port.clone(), typo.clone()], t1);
        assert_eq!(gauge(&r, "pod"), 2);
        r.set_at(Slot::Source, &[], t1);
        r.set_at(Slot::Pass, &[], t1);
        assert!(r.current().is_empty());
        assert_eq!(gauge(&r, "pod"), 0);
        // A new message for the same field is a new rejection, with its own time.
        r.set_at(Slot::Source, &[Problem::new("widget x", "f", "m")], t1);
        assert_eq!(gauge(&r, "widget"), 1);
        r.set_at(Slot::Source, &[], t1);
        assert_eq!(gauge(&r, "widget"), 0, "a kind seen once goes back to 0");
    }
}
