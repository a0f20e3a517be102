//! The per-policy counters as `sdn-node status` shows them (JSON in `GET /v1/status`, and the
//! text form).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One policy's allowed connections in one direction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowedCount {
    pub namespace: String,
    pub policy: String,
    /// `ingress` or `egress`.
    pub direction: String,
    /// New TCP/UDP connections (their first packet), and every packet of other protocols.
    pub connections: u64,
    /// By rule index (the rule's position in the policy's `ingress` or `egress` list).
    pub rules: BTreeMap<usize, u64>,
}

/// One isolated pod's dropped packets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodDrops {
    /// `namespace/name`, or the address when the model has no pod there.
    pub pod: String,
    pub ip: String,
    pub packets: u64,
    pub bytes: u64,
}

/// A namespace's dropped packets in one direction: every packet its isolated pods' policies
/// did not allow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DroppedCount {
    pub namespace: String,
    pub direction: String,
    pub packets: u64,
    pub bytes: u64,
    pub pods: Vec<PodDrops>,
}

/// The counters and how fresh they are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyCounters {
    /// Seconds between reads of the switch's flow statistics; 0: off.
    pub interval_seconds: f64,
    /// The last successful read (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_read_unix_ms: Option<u64>,
    /// NetworkPolicy flows that read reported.
    pub flows_read: usize,
    /// The last read's error, while reads fail (the counters keep their last values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_unix_ms: Option<u64>,
    pub allowed: Vec<AllowedCount>,
    pub dropped: Vec<DroppedCount>,
    /// Counted by NetworkPolicy flows the model did not name at the time (during a change).
    pub unattributed_packets: u64,
}

pub(super) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn ago(at_unix_ms: u64) -> String {
    let s = unix_ms(SystemTime::now()).saturating_sub(at_unix_ms) as f64 / 1000.0;
    format!("{s:.1}s ago")
}

impl PolicyCounters {
    /// The text form, a section of `sdn-node status`.
    pub fn write_text(&self, s: &mut String) {
        if self.interval_seconds <= 0.0 {
            let _ = writeln!(s, "policy counters: off (--policy-stats-interval 0)");
            return;
        }
        let read = match self.last_read_unix_ms {
            Some(t) => format!("read {} (every {}s), {} flows", ago(t), self.interval_seconds, self.flows_read),
            None => format!("not read yet (every {}s)", self.interval_seconds),
        };
        let _ = writeln!(s, "policy counters: {read}");
        if let (Some(e), at) = (&self.last_error, self.last_error_unix_ms) {
            let _ = writeln!(s, "  LAST READ FAILED {}: {e}", at.map(ago).unwrap_or_else(|| "?".into()));
        }
        if !self.allowed.is_empty() {
            let _ = writeln!(s, "  allowed (new connections; other protocols by packet):");
        }
        for a in &self.allowed {
            let rules: Vec<String> = a.rules.iter().map(|(r, n)| format!("rule {r}: {n}")).collect();
            let _ = writeln!(s, "    {}/{}  {} {} ({})", a.namespace, a.policy, a.direction, a.connections, rules.join(", "));
        }
        if !self.dropped.is_empty() {
            let _ = writeln!(s, "  dropped (packets):");
        }
        for d in &self.dropped {
            let _ = writeln!(s, "    {}  {} {} ({} bytes)", d.namespace, d.direction, d.packets, d.bytes);
            for p in d.pods.iter().filter(|p| p.packets > 0) {
                let _ = writeln!(s, "      {} ({}) {}", p.pod, p.ip, p.packets);
            }
        }
        if self.unattributed_packets > 0 {
            let _ = writeln!(s, "  unattributed: {} packets (flows the model did not name when read)", self.unattributed_packets);
        }
    }
}


/// The counters as status shows them, shared between the task and the API. (Here, with the
/// data it holds, so that `metrics`, which keeps it, does not import the task.)
#[derive(Debug, Default)]
pub struct Shared(std::sync::Mutex<PolicyCounters>);

impl Shared {
    pub fn report(&self) -> PolicyCounters {
        self.lock().clone()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, PolicyCounters> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text() {
        let mut c = PolicyCounters {
            interval_seconds: 10.0,
            last_read_unix_ms: Some(unix_ms(SystemTime::now())),
            flows_read: 7,
            allowed: vec![AllowedCount { namespace: "a".into(), policy: "web".into(), direction: "ingress".into(), connections: 3, rules: BTreeMap::from([(0, 3)]) }],
            dropped: vec![DroppedCount {
                namespace: "a".into(),
                direction: "ingress".into(),
                packets: 4,
                bytes: 240,
                pods: vec![PodDrops { pod: "a/s1".into(), ip: "10.128.0.3".into(), packets: 4, bytes: 240 }],
            }],
            ..Default::default()
        };
        let mut s = String::new();
        c.write_text(&mut s);
        assert!(s.starts_with("policy counters: read 0.0s ago (every 10s), 7 flows\n"), "{s}");
        assert!(s.contains("    a/web  ingress 3 (rule 0: 3)\n") && s.contains("    a  ingress 4 (240 bytes)\n      a/s1 (10.128.0.3) 4\n"), "{s}");
        c.last_error = Some("the switch is not connected".into());
        c.last_error_unix_ms = c.last_read_unix_ms;
        let mut s = String::new();
        c.write_text(&mut s);
        assert!(s.contains("  LAST READ FAILED 0.0s ago: the switch is not connected\n"), "{s}");
        let mut s = String::new();
        PolicyCounters::default().write_text(&mut s);
        assert_eq!(s, "policy counters: off (--policy-stats-interval 0)\n");
    }
}
