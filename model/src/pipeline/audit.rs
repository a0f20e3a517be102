//! NetworkPolicy audit logging: the action that copies a new connection's first packet to the
//! agent, and the userdata that says which policy rule decided it.
//!
//! The allow/deny flows of a logged policy get one more action, [`log_action`]: a
//! `controller(max_len=128,userdata=...,meter_id=AUDIT_METER_ID)`. The switch sends the agent
//! the packet's first [`AUDIT_MAX_LEN`] bytes (enough for Ethernet + IPv4 with options + the
//! L4 ports) with the userdata, in an NXT_PACKET_IN2; only that copy goes through the meter,
//! the packet itself is forwarded (or dropped) as the flow says, at full rate (OVS 3.1 puts the
//! meter inside a `clone` around the userspace action: ofproto-dpif-xlate.c
//! `xlate_controller_action`).
//!
//! Userdata layout, version 1 (small, so every logged flow stays small):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | version = 1 |
//! | 1 | 1 | verdict: 0 allow, 1 deny |
//! | 2 | 1 | direction: 0 ingress, 1 egress |
//! | 3 | 2 | rule index (big-endian) within the policy's rules of that direction |
//! | 5 | n | `namespace/name` of the policy, UTF-8 |
//!
//! A decoder that meets a newer version refuses it by name rather than guessing: the agent and
//! the flows it installed always agree, but a packet-in from flows of another agent version may
//! still arrive after an upgrade.

use std::fmt;

use openflow::{Action, Controller};
use thiserror::Error;

/// The meter every audit `controller` action goes through (one meter for the node: the rate
/// limit protects the agent, whichever policy floods).
pub const AUDIT_METER_ID: u32 = 1;

/// Bytes of each packet asked for: Ethernet (14) and IPv4 with the longest options (60) and
/// the first 8 bytes of the L4 header (ports, ICMP type and code) round up to 128 with room for
/// a VLAN tag. (OVS 3.1 sends the whole packet anyway; see tests/audit.rs.)
pub const AUDIT_MAX_LEN: u16 = 128;

/// The userdata layout written by [`AuditTag::encode`].
pub const USERDATA_VERSION: u8 = 1;

/// Fixed bytes before the policy name.
const HEADER_LEN: usize = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Allow,
    Deny,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
        }
    }
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one logged flow says about the packets it matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AuditTag {
    pub verdict: Verdict,
    pub direction: Direction,
    /// The policy's namespace.
    pub namespace: String,
    /// The policy's name.
    pub policy: String,
    /// The rule's index in the policy's `ingress` or `egress` list.
    pub rule: u16,
}

/// Why a userdata could not be read; each names the field.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum UserdataError {
    #[error("audit userdata: empty")]
    Empty,
    #[error("audit userdata: version {0} is not the supported version 1")]
    Version(u8),
    #[error("audit userdata: {field} is cut short ({len} bytes in all)")]
    Truncated { field: &'static str, len: usize },
    #[error("audit userdata: verdict {0} is neither 0 (allow) nor 1 (deny)")]
    Verdict(u8),
    #[error("audit userdata: direction {0} is neither 0 (ingress) nor 1 (egress)")]
    Direction(u8),
    #[error("audit userdata: the policy name is not UTF-8")]
    NameNotUtf8,
    #[error("audit userdata: the policy name {0:?} is not namespace/name")]
    NameShape(String),
}

impl AuditTag {
    /// The userdata bytes (see the module's table).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_LEN + self.namespace.len() + 1 + self.policy.len());
        v.push(USERDATA_VERSION);
        v.push(match self.verdict {
            Verdict::Allow => 0,
            Verdict::Deny => 1,
        });
        v.push(match self.direction {
            Direction::Ingress => 0,
            Direction::Egress => 1,
        });
        v.extend_from_slice(&self.rule.to_be_bytes());
        v.extend_from_slice(self.namespace.as_bytes());
        v.push(b'/');
        v.extend_from_slice(self.policy.as_bytes());
        v
    }

    /// Reads userdata written by [`AuditTag::encode`]. Never panics; bytes after a valid
    /// header are the name, whatever their length.
    pub fn decode(b: &[u8]) -> Result<AuditTag, UserdataError> {
        let len = b.len();
        let (&version, rest) = b.split_first().ok_or(UserdataError::Empty)?;
        if version != USERDATA_VERSION {
            return Err(UserdataError::Version(version));
        }
        let (&verdict, rest) = rest.split_first().ok_or(UserdataError::Truncated { field: "verdict", len })?;
        let (&direction, rest) = rest.split_first().ok_or(UserdataError::Truncated { field: "direction", len })?;
        let (rule, name) = rest.split_at_checked(2).ok_or(UserdataError::Truncated { field: "rule index", len })?;
        let verdict = match verdict {
            0 => Verdict::Allow,
            1 => Verdict::Deny,
            v => return Err(UserdataError::Verdict(v)),
        };
        let direction = match direction {
            0 => Direction::Ingress,
            1 => Direction::Egress,
            v => return Err(UserdataError::Direction(v)),
        };
        let rule = u16::from_be_bytes([rule[0], rule[1]]);
        let name = std::str::from_utf8(name).map_err(|_| UserdataError::NameNotUtf8)?;
        let (namespace, policy) = match name.split_once('/') {
            Some((ns, p)) if !ns.is_empty() && !p.is_empty() && !p.contains('/') => (ns, p),
            _ => return Err(UserdataError::NameShape(name.to_string())),
        };
        Ok(AuditTag { verdict, direction, namespace: namespace.into(), policy: policy.into(), rule })
    }
}

/// The action a logged allow/deny flow carries (put it before the flow's own actions: the copy
/// is taken of the packet as it arrived in the flow's table).
pub fn log_action(meter_id: u32, verdict: Verdict, direction: Direction, namespace: &str, policy: &str, rule: u16) -> Action {
    let tag = AuditTag { verdict, direction, namespace: namespace.into(), policy: policy.into(), rule };
    Action::Controller(Controller::new().max_len(AUDIT_MAX_LEN).userdata(tag.encode()).meter_id(meter_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> AuditTag {
        AuditTag {
            verdict: Verdict::Deny,
            direction: Direction::Egress,
            namespace: "team-a".into(),
            policy: "db-only".into(),
            rule: 258,
        }
    }

    #[test]
    fn round_trip() {
        let b = tag().encode();
        assert_eq!(&b[..5], &[1, 1, 1, 1, 2]);
        assert_eq!(&b[5..], b"team-a/db-only");
        assert_eq!(AuditTag::decode(&b), Ok(tag()));
    }

    #[test]
    fn every_fault_names_its_field() {
        let good = tag().encode();
        let cases: Vec<(Vec<u8>, UserdataError)> = vec![
            (vec![], UserdataError::Empty),
            (vec![2, 0, 0, 0, 0], UserdataError::Version(2)),
            (vec![1], UserdataError::Truncated { field: "verdict", len: 1 }),
            (vec![1, 0], UserdataError::Truncated { field: "direction", len: 2 }),
            (vec![1, 0, 0, 7], UserdataError::Truncated { field: "rule index", len: 4 }),
            (vec![1, 9, 0, 0, 0, b'a', b'/', b'b'], UserdataError::Verdict(9)),
            (vec![1, 0, 5, 0, 0, b'a', b'/', b'b'], UserdataError::Direction(5)),
            (vec![1, 0, 0, 0, 0, 0xff, b'/', b'b'], UserdataError::NameNotUtf8),
            (vec![1, 0, 0, 0, 0, b'a', b'b'], UserdataError::NameShape("ab".into())),
            (vec![1, 0, 0, 0, 0], UserdataError::NameShape("".into())),
            (vec![1, 0, 0, 0, 0, b'/', b'b'], UserdataError::NameShape("/b".into())),
        ];
        for (b, want) in cases {
            assert_eq!(AuditTag::decode(&b), Err(want.clone()), "{b:?}");
            assert!(want.to_string().starts_with("audit userdata: "));
        }
        // Every prefix of a good userdata up to `team-a/` is an error, never a panic.
        for n in 0..=HEADER_LEN + "team-a/".len() {
            assert!(AuditTag::decode(&good[..n]).is_err(), "{n}");
        }
    }

    /// Any bytes: an error or a tag, never a panic; a tag re-encodes to the same bytes.
    #[test]
    fn arbitrary_bytes() {
        use proptest::prelude::*;
        proptest!(|(b in proptest::collection::vec(any::<u8>(), 0..64))| {
            if let Ok(t) = AuditTag::decode(&b) {
                prop_assert_eq!(t.encode(), b);
            }
        });
    }

    #[test]
    fn the_action() {
        let a = log_action(AUDIT_METER_ID, Verdict::Allow, Direction::Ingress, "ns", "p", 3);
        assert_eq!(a.to_string(), "controller(max_len=128,userdata=01.00.00.00.03.6e.73.2f.70,meter_id=1)");
        let Action::Controller(c) = &a else { panic!() };
        assert_eq!(AuditTag::decode(&c.userdata).unwrap().rule, 3);
        assert_eq!(c.reason, openflow::controller::OFPR_ACTION);
    }
}
