//! One audit event: a packet-in turned into the JSON line the log holds.

use std::net::{IpAddr, SocketAddr};

use openflow::PacketIn2;
use sdn_model::pipeline::audit::{AuditTag, UserdataError};
use serde::Serialize;

use super::packet::{self, Flow5, PacketError};

/// Names the pod behind an address (`namespace/name`), for the log's `src_pod`/`dst_pod`:
/// an IPv4 address or, on a dual-stack node, an IPv6 one (a pod answers to both).
/// Called on the writer task, once per event: it must not block (a map lookup).
pub trait PodLookup: Send + Sync + 'static {
    fn pod(&self, ip: IpAddr) -> Option<String>;
    /// The node's name as the cluster state gives it (the state file's `node:`), once a state
    /// is loaded; a line names it rather than the configured fallback.
    fn node_name(&self) -> Option<String> {
        None
    }
}

impl<F: Fn(IpAddr) -> Option<String> + Send + Sync + 'static> PodLookup for F {
    fn pod(&self, ip: IpAddr) -> Option<String> {
        self(ip)
    }
}

/// The log line. Field order is the JSON order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditEvent {
    /// RFC 3339, UTC, when the agent read the packet-in.
    pub time: String,
    pub node: String,
    /// `namespace/name`.
    pub policy: String,
    pub rule: u16,
    pub direction: &'static str,
    pub verdict: &'static str,
    pub proto: String,
    /// `ip:port` (IPv4) or `[ip]:port` (IPv6), or the bare address without a port (ICMP,
    /// ICMPv6, a later fragment, a header cut before the ports).
    pub src: String,
    pub dst: String,
    pub src_pod: Option<String>,
    pub dst_pod: Option<String>,
    /// ICMP or ICMPv6 type and code (the ports are absent then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icmp_code: Option<u16>,
}

/// Why a packet-in gave no event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("packet-in without userdata (not from an audit flow)")]
    NoUserdata,
    #[error(transparent)]
    Userdata(#[from] UserdataError),
    #[error(transparent)]
    Packet(#[from] PacketError),
}

/// `10.0.0.1:80`, `[fd00::5]:80` (brackets, as in a URL: the port is not part of the
/// address), or the bare address.
fn endpoint(ip: IpAddr, port: Option<u16>, ported: bool) -> String {
    match port {
        Some(p) if ported => SocketAddr::new(ip, p).to_string(),
        _ => ip.to_string(),
    }
}

impl AuditEvent {
    /// The event of one NXT_PACKET_IN2 sent by an audit flow. Never panics on what the switch
    /// sent.
    pub fn from_packet_in(p: &PacketIn2, node: &str, pods: &dyn PodLookup, time: String) -> Result<AuditEvent, EventError> {
        let tag = AuditTag::decode(p.userdata.as_deref().ok_or(EventError::NoUserdata)?)?;
        let f = packet::parse(&p.packet)?;
        Ok(AuditEvent::new(&tag, &f, node, pods, time))
    }

    pub fn new(tag: &AuditTag, f: &Flow5, node: &str, pods: &dyn PodLookup, time: String) -> AuditEvent {
        let icmp = f.proto.is_icmp();
        AuditEvent {
            time,
            node: node.to_string(),
            policy: format!("{}/{}", tag.namespace, tag.policy),
            rule: tag.rule,
            direction: tag.direction.as_str(),
            verdict: tag.verdict.as_str(),
            proto: f.proto.name(),
            src: endpoint(f.src, f.src_port, !icmp),
            dst: endpoint(f.dst, f.dst_port, !icmp),
            src_pod: pods.pod(f.src),
            dst_pod: pods.pod(f.dst),
            icmp_type: f.src_port.filter(|_| icmp),
            icmp_code: f.dst_port.filter(|_| icmp),
        }
    }

    /// The line, without its newline.
    pub fn to_line(&self) -> String {
        // Serializing plain strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Now, as the log prints it.
pub fn now() -> String {
    jiff::Timestamp::now().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use sdn_model::pipeline::audit::{Direction, Verdict};

    #[test]
    fn one_line() {
        let tag = AuditTag { verdict: Verdict::Allow, direction: Direction::Ingress, namespace: "team-a".into(), policy: "web".into(), rule: 2 };
        let frame = super::super::packet::tests::tcp_frame([10, 128, 0, 2], [10, 128, 0, 4], 40000, 80);
        let p = PacketIn2 { packet: Bytes::copy_from_slice(&frame[..128]), userdata: Some(tag.encode().into()), ..Default::default() };
        let pods = |ip: IpAddr| (ip == IpAddr::from([10, 128, 0, 4])).then(|| "team-a/web-1".to_string());
        let e = AuditEvent::from_packet_in(&p, "node-1", &pods, "2026-01-02T03:04:05Z".into()).unwrap();
        assert_eq!(
            e.to_line(),
            r#"{"time":"2026-01-02T03:04:05Z","node":"node-1","policy":"team-a/web","rule":2,"direction":"ingress","verdict":"allow","proto":"tcp","src":"10.128.0.2:40000","dst":"10.128.0.4:80","src_pod":null,"dst_pod":"team-a/web-1"}"#
        );
        let no_ud = PacketIn2 { userdata: None, ..p.clone() };
        assert_eq!(AuditEvent::from_packet_in(&no_ud, "n", &pods, now()), Err(EventError::NoUserdata));
        let bad = PacketIn2 { userdata: Some(Bytes::from_static(&[9])), ..p };
        assert!(matches!(AuditEvent::from_packet_in(&bad, "n", &pods, now()), Err(EventError::Userdata(UserdataError::Version(9)))));
        assert!(now().ends_with('Z'), "{}", now());
    }

    /// The IPv6 twin of [`one_line`]: the same fields, the addresses in brackets before a port,
    /// the pods looked up by their IPv6 addresses; ICMPv6 with type and code, bare addresses.
    #[test]
    fn ipv6_lines() {
        use super::super::packet::tests::{ping6_frame, tcp6_frame};
        use std::net::Ipv6Addr;
        let (client, web): (Ipv6Addr, Ipv6Addr) = ("fd00:10:128::2".parse().unwrap(), "fd00:10:128::4".parse().unwrap());
        let tag = AuditTag { verdict: Verdict::Deny, direction: Direction::Ingress, namespace: "team-a".into(), policy: "web".into(), rule: 65535 };
        let pods = move |ip: IpAddr| match ip {
            IpAddr::V6(a) if a == web => Some("team-a/web-1".to_string()),
            IpAddr::V6(a) if a == client => Some("client/c1".to_string()),
            _ => None,
        };
        let frame = tcp6_frame(client, web, 40000, 80);
        let p = PacketIn2 { packet: Bytes::copy_from_slice(&frame[..128]), userdata: Some(tag.encode().into()), ..Default::default() };
        let e = AuditEvent::from_packet_in(&p, "node-1", &pods, "2026-01-02T03:04:05Z".into()).unwrap();
        assert_eq!(
            e.to_line(),
            r#"{"time":"2026-01-02T03:04:05Z","node":"node-1","policy":"team-a/web","rule":65535,"direction":"ingress","verdict":"deny","proto":"tcp","src":"[fd00:10:128::2]:40000","dst":"[fd00:10:128::4]:80","src_pod":"client/c1","dst_pod":"team-a/web-1"}"#
        );
        let p = PacketIn2 { packet: Bytes::from(ping6_frame(client, web)), ..p };
        let e = AuditEvent::from_packet_in(&p, "node-1", &pods, "2026-01-02T03:04:05Z".into()).unwrap();
        assert_eq!(
            e.to_line(),
            r#"{"time":"2026-01-02T03:04:05Z","node":"node-1","policy":"team-a/web","rule":65535,"direction":"ingress","verdict":"deny","proto":"icmpv6","src":"fd00:10:128::2","dst":"fd00:10:128::4","src_pod":"client/c1","dst_pod":"team-a/web-1","icmp_type":128,"icmp_code":0}"#
        );
        // Cut before the ports: bare addresses, as for IPv4.
        let p = PacketIn2 { packet: Bytes::copy_from_slice(&frame[..14 + 40 + 2]), ..p };
        let e = AuditEvent::from_packet_in(&p, "node-1", &pods, now()).unwrap();
        assert_eq!((e.src.as_str(), e.dst.as_str(), e.icmp_type), ("fd00:10:128::2", "fd00:10:128::4", None));
        // Neither family: a typed error.
        let arp = [&[0xffu8; 12][..], &[0x08, 0x06], &[0; 28]].concat();
        let p = PacketIn2 { packet: Bytes::from(arp), ..p };
        assert_eq!(AuditEvent::from_packet_in(&p, "n", &pods, now()), Err(EventError::Packet(PacketError::NotIp)));
    }
}
