//! A NetworkPolicy evaluator written from the Kubernetes specification text
//! (networking.k8s.io/v1, "Network Policies" concept page and the API reference), independent
//! of the agent's pipeline code: it reads the policy objects as JSON and says whether a new
//! connection from one pod to another is allowed: by the source's egress policies and by the
//! destination's ingress policies (both must allow it).
//!
//! The rules it follows, from the specification:
//! - A pod is isolated for ingress when some policy in its namespace selects it (podSelector;
//!   empty selects all) and has Ingress in policyTypes (default: Ingress always, Egress when
//!   the policy has egress rules).
//! - A non-isolated pod accepts every connection. An isolated pod accepts a connection when
//!   some ingress rule of some policy selecting it matches (policies are additive).
//! - A rule matches when its `from` matches (empty or absent: all sources) and its `ports`
//!   match (empty or absent: all ports).
//! - A peer with only podSelector selects pods of the policy's namespace; only
//!   namespaceSelector, all pods of the selected namespaces; both, the selected pods of the
//!   selected namespaces; ipBlock, source IPs within cidr and outside every except. (Whether
//!   ipBlock matches pod IPs is left to the implementation; this evaluator, like the agent,
//!   matches on the packet's source IP.)
//! - A port: protocol (default TCP), port (absent: all ports), endPort (a range), a named port
//!   is looked up among the destination pod's container ports with that name and protocol.
//! - Egress mirrors ingress: a pod is isolated for egress when some policy in its namespace
//!   selects it and has Egress in policyTypes; an isolated pod may open a connection when
//!   some egress rule of some policy selecting it matches: `to` (empty or absent: all
//!   destinations; peers as above, matched against the destination pod, ipBlock against the
//!   destination IP) and `ports` (a named port is looked up among the *destination* pod's
//!   container ports).
//! - Replies of an allowed connection always pass (the evaluator judges new connections only).
//! - Namespaces carry the label kubernetes.io/metadata.name = their name.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::Value;

#[derive(Clone, Debug)]
pub struct EvalNamespace {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
pub struct EvalPod {
    pub namespace: String,
    pub name: String,
    pub ip: Ipv4Addr,
    pub labels: BTreeMap<String, String>,
    /// (name, port, protocol).
    pub container_ports: Vec<(String, u16, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub fn k8s(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        }
    }
}

fn labels_of(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|o| o.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect())
        .unwrap_or_default()
}

/// Does the LabelSelector `sel` (matchLabels AND matchExpressions) select `labels`?
pub fn selects(sel: &Value, labels: &BTreeMap<String, String>) -> bool {
    let ml = labels_of(sel.get("matchLabels"));
    if !ml.iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return false;
    }
    for e in sel.get("matchExpressions").and_then(Value::as_array).into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e.get("values").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let have = labels.get(key).map(String::as_str);
        let ok = match e["operator"].as_str().unwrap_or_default() {
            "In" => have.is_some_and(|h| values.contains(&h)),
            "NotIn" => have.is_none_or(|h| !values.contains(&h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            other => panic!("evaluator: unknown operator {other}"),
        };
        if !ok {
            return false;
        }
    }
    true
}

fn in_cidr(ip: Ipv4Addr, cidr: &str) -> bool {
    let (a, len) = cidr.split_once('/').expect("cidr with /");
    let a: Ipv4Addr = a.parse().expect("cidr address");
    let len: u32 = len.parse().expect("prefix length");
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    (u32::from(ip) & mask) == (u32::from(a) & mask)
}

pub struct Evaluator<'a> {
    pub namespaces: &'a [EvalNamespace],
    pub pods: &'a [EvalPod],
    pub policies: &'a [Value],
}

impl Evaluator<'_> {
    fn ns_labels(&self, ns: &str) -> BTreeMap<String, String> {
        let mut l = self.namespaces.iter().find(|n| n.name == ns).map(|n| n.labels.clone()).unwrap_or_default();
        l.insert("kubernetes.io/metadata.name".into(), ns.to_string());
        l
    }

    fn policy_types(p: &Value) -> Vec<String> {
        match p["spec"].get("policyTypes").and_then(Value::as_array) {
            Some(t) => t.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            None => {
                let mut t = vec!["Ingress".to_string()];
                if p["spec"].get("egress").and_then(Value::as_array).is_some_and(|e| !e.is_empty()) {
                    t.push("Egress".into());
                }
                t
            }
        }
    }

    /// Does `peer` (of a policy in `policy_ns`) match the pod at the other end, `other`?
    fn peer_matches(&self, policy_ns: &str, peer: &Value, other: &EvalPod) -> bool {
        if let Some(b) = peer.get("ipBlock") {
            let cidr = b["cidr"].as_str().expect("ipBlock.cidr");
            let excepts: Vec<&str> = b.get("except").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
            return in_cidr(other.ip, cidr) && !excepts.iter().any(|e| in_cidr(other.ip, e));
        }
        let ns_ok = match peer.get("namespaceSelector") {
            Some(sel) => selects(sel, &self.ns_labels(&other.namespace)),
            None => other.namespace == policy_ns,
        };
        let pod_ok = match peer.get("podSelector") {
            Some(sel) => selects(sel, &other.labels),
            None => true,
        };
        ns_ok && pod_ok
    }

    fn port_matches(port: &Value, dst: &EvalPod, proto: Proto, dport: u16) -> bool {
        let p = port.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
        if p != proto.k8s() {
            return false;
        }
        match port.get("port") {
            None => true,
            Some(Value::Number(n)) => {
                let start = n.as_u64().expect("port number") as u16;
                let end = port.get("endPort").and_then(Value::as_u64).map(|e| e as u16).unwrap_or(start);
                (start..=end).contains(&dport)
            }
            Some(Value::String(name)) => dst.container_ports.iter().any(|(n, cp, cproto)| n == name && *cp == dport && cproto == p),
            Some(other) => panic!("evaluator: port {other}"),
        }
    }

    /// Is a new connection from `src` to `dst` on (`proto`, `dport`) allowed? Both the
    /// source's egress and the destination's ingress must allow it.
    pub fn allowed(&self, src: &EvalPod, dst: &EvalPod, proto: Proto, dport: u16) -> bool {
        self.side_allows("Egress", src, dst, proto, dport) && self.side_allows("Ingress", src, dst, proto, dport)
    }

    /// One side's verdict: `Ingress` by the policies selecting `dst` (peers match `src`),
    /// `Egress` by those selecting `src` (peers match `dst`); named ports are `dst`'s.
    fn side_allows(&self, side: &str, src: &EvalPod, dst: &EvalPod, proto: Proto, dport: u16) -> bool {
        let (selected, other, rules_key, peers_key) =
            if side == "Ingress" { (dst, src, "ingress", "from") } else { (src, dst, "egress", "to") };
        let selecting: Vec<&Value> = self
            .policies
            .iter()
            .filter(|p| p["metadata"]["namespace"].as_str() == Some(&selected.namespace))
            .filter(|p| Self::policy_types(p).iter().any(|t| t == side))
            .filter(|p| selects(p["spec"].get("podSelector").unwrap_or(&Value::Null), &selected.labels))
            .collect();
        if selecting.is_empty() {
            return true;
        }
        selecting.iter().any(|p| {
            p["spec"].get(rules_key).and_then(Value::as_array).into_iter().flatten().any(|rule| {
                let peers: Vec<&Value> = rule.get(peers_key).and_then(Value::as_array).into_iter().flatten().collect();
                let ports: Vec<&Value> = rule.get("ports").and_then(Value::as_array).into_iter().flatten().collect();
                let peer_ok = peers.is_empty() || peers.iter().any(|peer| self.peer_matches(&selected.namespace, peer, other));
                let port_ok = ports.is_empty() || ports.iter().any(|port| Self::port_matches(port, dst, proto, dport));
                peer_ok && port_ok
            })
        })
    }
}
