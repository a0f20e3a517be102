//! Monotonic counters from flow statistics that are not: the deltas of each flow between reads.
//!
//! A flow's `packet_count` starts at zero whenever OVS (re)creates it — a new generation's
//! cookie after a full replay, a delete and add, ovs-vswitchd restarting — while a Prometheus
//! counter must never go backwards. So each read is compared with the previous one per flow
//! (its key and cookie): what grew is added; a flow seen for the first time, or one that was
//! re-created since (its counts or its age went backwards), adds its whole current value, which
//! it counted since it was made. A MODIFY_STRICT keeps the flow and its counts, and is only a
//! delta.
//!
//! A flow that goes between reads (a policy change deletes or replaces it) reports its final
//! counts in OFPT_FLOW_REMOVED ([`Accumulator::removed`]): what it counted after its last read
//! is added then, so the totals stay exact. A dump taken just before the removal may still list
//! the flow after its removal was applied; such a stale entry is skipped (its counts are in).

use std::collections::HashMap;
use std::time::Duration;

use crate::pipeline::FlowKey;

/// One flow's counts in one read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub packets: u64,
    pub bytes: u64,
    /// How long the flow has existed (OVS's `duration`): less than before means re-created.
    pub age: Duration,
}

/// What a flow added since the previous read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub packets: u64,
    pub bytes: u64,
}

/// OVS's "not available" for a counter (`ovs-ofctl` prints `?`).
pub const UNAVAILABLE: u64 = u64::MAX;

/// The previous read of every flow.
#[derive(Debug, Default)]
pub struct Accumulator {
    last: HashMap<(FlowKey, u64), Sample>,
    /// Flows whose removal was applied since the last read.
    gone: std::collections::HashSet<(FlowKey, u64)>,
}

impl Accumulator {
    /// Takes one complete read (every flow the dump reported, with its cookie) and returns each
    /// flow's delta, in the read's order. Flows missing from the read are forgotten (deleted:
    /// if they come back, they start again from zero). A flow whose counters are unavailable
    /// adds nothing and keeps its previous read.
    pub fn read(&mut self, flows: impl IntoIterator<Item = (FlowKey, u64, Sample)>) -> Vec<(FlowKey, u64, Delta)> {
        let mut next = HashMap::with_capacity(self.last.len());
        let mut out = Vec::new();
        for (key, cookie, s) in flows {
            let id = (key, cookie);
            if self.gone.contains(&id) {
                // Listed by a dump taken before its removal, which is already counted (a flow
                // re-created since with the same cookie is counted whole by the next read).
                continue;
            }
            let prev = self.last.get(&id).copied();
            if s.packets == UNAVAILABLE || s.bytes == UNAVAILABLE {
                if let Some(p) = prev {
                    next.insert(id, p);
                }
                continue;
            }
            let d = match prev {
                Some(p) if s.packets >= p.packets && s.bytes >= p.bytes && s.age >= p.age => {
                    Delta { packets: s.packets - p.packets, bytes: s.bytes - p.bytes }
                }
                // New, or re-created since the last read: all it has counted is new.
                _ => Delta { packets: s.packets, bytes: s.bytes },
            };
            out.push((id.0.clone(), id.1, d));
            next.insert(id, s);
        }
        self.last = next;
        self.gone.clear();
        out
    }

    /// A flow went with its final counts (OFPT_FLOW_REMOVED): what it counted since its last
    /// read (all of it if it was never read) is its delta, and it is forgotten.
    pub fn removed(&mut self, key: FlowKey, cookie: u64, packets: u64, bytes: u64) -> Option<Delta> {
        let id = (key, cookie);
        let prev = self.last.remove(&id);
        let d = if packets == UNAVAILABLE || bytes == UNAVAILABLE {
            None
        } else {
            Some(match prev {
                Some(p) if packets >= p.packets && bytes >= p.bytes => {
                    Delta { packets: packets - p.packets, bytes: bytes - p.bytes }
                }
                _ => Delta { packets, bytes },
            })
        };
        self.gone.insert(id);
        d
    }

    /// Flows remembered.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> FlowKey {
        FlowKey { table: 80, priority: 150, match_bytes: vec![0, 1, 0, 4, n, 0, 0, 0].into() }
    }

    fn s(packets: u64, bytes: u64, age_s: u64) -> Sample {
        Sample { packets, bytes, age: Duration::from_secs(age_s) }
    }

    fn deltas(a: &mut Accumulator, flows: &[(u8, u64, Sample)]) -> Vec<(u8, u64, u64)> {
        a.read(flows.iter().map(|(k, c, s)| (key(*k), *c, *s)))
            .into_iter()
            .map(|(k, _, d)| (k.match_bytes[4], d.packets, d.bytes))
            .collect()
    }

    /// A flow removed between reads adds what it counted since its last read; a stale dump
    /// that still lists it adds nothing more; one never read counts whole.
    #[test]
    fn a_removed_flow_adds_its_final_counts_once() {
        let mut a = Accumulator::default();
        assert_eq!(deltas(&mut a, &[(1, 7, s(8, 800, 1))]), vec![(1, 8, 800)]);
        assert_eq!(a.removed(key(1), 7, 12, 1200), Some(Delta { packets: 4, bytes: 400 }));
        // A dump taken before the removal, read after it.
        assert_eq!(deltas(&mut a, &[(1, 7, s(10, 1000, 2))]), vec![]);
        assert!(a.is_empty());
        assert_eq!(a.removed(key(2), 7, 3, 300), Some(Delta { packets: 3, bytes: 300 }), "never read");
        assert_eq!(a.removed(key(3), 7, UNAVAILABLE, 0), None);
        // Re-created with the same cookie after the stale read: counted whole next time.
        assert_eq!(deltas(&mut a, &[(1, 7, s(2, 200, 0))]), vec![(1, 2, 200)]);
    }

    #[test]
    fn growth_is_added_and_a_new_flow_counts_whole() {
        let mut a = Accumulator::default();
        assert_eq!(deltas(&mut a, &[(1, 7, s(3, 300, 1))]), vec![(1, 3, 300)]);
        assert_eq!(deltas(&mut a, &[(1, 7, s(5, 500, 2)), (2, 7, s(1, 60, 0))]), vec![(1, 2, 200), (2, 1, 60)]);
        assert_eq!(deltas(&mut a, &[(1, 7, s(5, 500, 3)), (2, 7, s(1, 60, 1))]), vec![(1, 0, 0), (2, 0, 0)]);
    }

    /// A flow re-created between reads: smaller counts, or a younger age with larger counts
    /// (it counted more since it was made than the old one had): its whole value is new.
    #[test]
    fn a_recreated_flow_never_makes_the_total_go_backwards() {
        let mut a = Accumulator::default();
        let mut total = 0;
        for (flows, want) in [
            (s(10, 1000, 5), 10),
            // Re-created, fewer packets so far.
            (s(2, 200, 1), 2),
            // Re-created again, and already past the old count: only the age tells.
            (s(4, 400, 0), 4),
            (s(6, 600, 1), 2),
        ] {
            let d = deltas(&mut a, &[(1, 7, flows)]);
            assert_eq!(d, vec![(1, want, want * 100)], "{flows:?}");
            total += d[0].1;
        }
        assert_eq!(total, 18);
    }

    /// The cookie is part of the identity: the same match under a new generation's cookie is
    /// another flow (a full replay re-creates every flow).
    #[test]
    fn a_new_cookie_is_a_new_flow() {
        let mut a = Accumulator::default();
        deltas(&mut a, &[(1, 7, s(10, 1000, 5))]);
        assert_eq!(deltas(&mut a, &[(1, 8, s(12, 1200, 9))]), vec![(1, 12, 1200)]);
        assert_eq!(a.len(), 1, "the old cookie's flow is forgotten");
    }

    #[test]
    fn gone_flows_are_forgotten_and_unavailable_counts_add_nothing() {
        let mut a = Accumulator::default();
        deltas(&mut a, &[(1, 7, s(10, 1000, 5)), (2, 7, s(1, 1, 1))]);
        assert_eq!(deltas(&mut a, &[(1, 7, s(UNAVAILABLE, UNAVAILABLE, 6))]), vec![]);
        assert_eq!(a.len(), 1, "flow 2 left; flow 1 keeps its last read");
        assert_eq!(deltas(&mut a, &[(1, 7, s(11, 1100, 7)), (2, 7, s(4, 4, 0))]), vec![(1, 1, 100), (2, 4, 4)]);
    }
}
