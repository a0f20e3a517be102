//! The standalone state file: YAML in the spirit of the Kubernetes objects.
//!
//! Each object is decoded on its own (through `serde_path_to_error`, so a type error names the
//! field), then checked; a bad object becomes a [`Problem`] and the rest of the file is used.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::validate;
use super::{name_problems, Checked, ClusterState, Fatal, FieldError, Problem};
use crate::model::Plugin;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawFile {
    node: String,
    plugin: Plugin,
    cluster_network: String,
    service_network: String,
    #[serde(default = "default_vxlan_port")]
    vxlan_port: u16,
    #[serde(default = "default_mtu")]
    mtu: u32,
    #[serde(default)]
    host_subnets: Vec<Value>,
    #[serde(default)]
    net_namespaces: Vec<Value>,
    #[serde(default)]
    services: Vec<Value>,
    #[serde(default)]
    pods: Vec<Value>,
    #[serde(default)]
    egress_network_policies: Vec<Value>,
    /// Pods on other nodes (NetworkPolicy peers): `{namespace, name, ip, labels}`.
    #[serde(default)]
    remote_pods: Vec<Value>,
    /// Whole networking.k8s.io/v1 NetworkPolicy objects.
    #[serde(default)]
    network_policies: Vec<Value>,
}

fn default_vxlan_port() -> u16 {
    4789
}

fn default_mtu() -> u32 {
    1450
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHostSubnet {
    host: String,
    #[serde(rename = "hostIP")]
    host_ip: String,
    subnet: String,
    #[serde(default, rename = "fixedVNID")]
    fixed_vnid: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNetNamespace {
    name: String,
    netid: u64,
    #[serde(default)]
    multicast: bool,
    #[serde(default)]
    labels: super::netpol::Labels,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRemotePod {
    namespace: String,
    name: String,
    ip: String,
    #[serde(default)]
    labels: super::netpol::Labels,
    /// What an egress rule's named ports resolve against (Kubernetes' ContainerPort shape).
    #[serde(default, rename = "containerPorts")]
    container_ports: Vec<k8s_openapi::api::core::v1::ContainerPort>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    namespace: String,
    name: String,
    #[serde(rename = "clusterIP")]
    cluster_ip: String,
    #[serde(default)]
    ports: Vec<RawServicePort>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServicePort {
    protocol: String,
    port: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEgressPolicy {
    namespace: String,
    name: String,
    #[serde(default)]
    egress: Vec<RawEgressRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEgressRule {
    #[serde(rename = "type")]
    kind: String,
    to: RawEgressTo,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEgressTo {
    #[serde(default, rename = "cidrSelector")]
    cidr_selector: Option<String>,
    #[serde(default, rename = "dnsName")]
    dns_name: Option<String>,
}

/// Reads, decodes and validates a state file.
pub fn load(path: &Path) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    let text = std::fs::read_to_string(path).map_err(|e| Fatal(format!("reading {}: {e}", path.display())))?;
    parse(&text).map_err(|Fatal(m)| Fatal(format!("{}: {m}", path.display())))
}

/// The YAML reader's limits (serde-saphyr's budget against hostile documents). Its defaults
/// (250,000 nodes) refuse the state of a 20,000-pod cluster; these are sized for a
/// 100,000-pod cluster with room to spare: such a state (100,000 pods of other nodes with
/// labels, 200 namespaces, 2,000 policies) is about 2.4 M nodes and 60 MiB of scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct YamlLimits {
    /// YAML nodes (mappings, sequences, scalars).
    pub max_nodes: usize,
    /// Parser events.
    pub max_events: usize,
    /// Bytes of all scalars together.
    pub max_scalar_bytes: usize,
}

impl Default for YamlLimits {
    fn default() -> Self {
        YamlLimits { max_nodes: 16_000_000, max_events: 32_000_000, max_scalar_bytes: 1 << 30 }
    }
}

/// Decodes and validates state file text.
pub fn parse(text: &str) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    parse_with(text, YamlLimits::default())
}

/// [`parse`] under `limits`. A document over a limit is refused with that limit named, not
/// as invalid YAML.
pub fn parse_with(text: &str, limits: YamlLimits) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = limits.max_nodes;
    budget.max_events = limits.max_events;
    budget.max_total_scalar_bytes = limits.max_scalar_bytes;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    let value: Value = serde_saphyr::from_str_with_options(text, options).map_err(|e| yaml_error(e, limits))?;
    from_value(value)
}

/// A YAML error as the operator needs it: a budget breach says which limit and what it is.
fn yaml_error(e: serde_saphyr::Error, limits: YamlLimits) -> Fatal {
    use serde_saphyr::budget::BudgetBreach;
    let serde_saphyr::Error::Budget { breach, .. } = e.without_snippet() else { return Fatal(format!("not valid YAML: {e}")) };
    let which = match breach {
        BudgetBreach::Nodes { .. } => format!("more than {} YAML nodes", limits.max_nodes),
        BudgetBreach::Events { .. } => format!("more than {} YAML parser events", limits.max_events),
        BudgetBreach::ScalarBytes { .. } => format!("more than {} bytes of scalars", limits.max_scalar_bytes),
        other => format!("a YAML reader limit ({other:?})"),
    };
    Fatal(format!(
        "too large for the state file reader: {which} (its limits are sized for a 100,000-pod cluster); \
         a state this large is not one sdn-node was built for: split it (remote pods are only needed where a policy selects them) or raise the limit (state_file::YamlLimits)"
    ))
}

/// Decodes and validates a state given as one JSON value of the state file's schema.
pub fn from_value(value: Value) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    let raw: RawFile = serde_path_to_error::deserialize(&value).map_err(|e| Fatal(format!("field {}: {}", e.path(), e.inner())))?;
    let header = validate::header(raw.node, raw.plugin, &raw.cluster_network, &raw.service_network, raw.vxlan_port, raw.mtu)?;
    let mut problems = Vec::new();
    let host_subnets = each(raw.host_subnets, "hostsubnet", &["host"], |r: RawHostSubnet| validate::host_subnet(&r.host, &r.host_ip, &r.subnet, r.fixed_vnid.map(Ok)), &mut problems);
    let net_namespaces = each(
        raw.net_namespaces,
        "netnamespace",
        &["name"],
        |r: RawNetNamespace| {
            validate::net_namespace(&r.name, Ok(r.netid), r.multicast).map(|(mut n, p)| {
                n.labels = r.labels;
                (n, p)
            })
        },
        &mut problems,
    );
    let services = each(
        raw.services,
        "service",
        &["namespace", "name"],
        |r: RawService| validate::service(&r.namespace, &r.name, &r.cluster_ip, r.ports.iter().map(|p| (p.protocol.as_str(), p.port))),
        &mut problems,
    );
    // Labels and containerPorts are taken out before the pod is decoded as the pod API's
    // RawPod (which has no such fields), and put back on the validated pod.
    let mut extras = std::collections::HashMap::new();
    let mut pod_values = Vec::with_capacity(raw.pods.len());
    for (i, mut v) in raw.pods.into_iter().enumerate() {
        let key = |v: &Value, f: &str| v.get(f).and_then(Value::as_str).map(str::to_string);
        let obj = match (key(&v, "namespace"), key(&v, "name")) {
            (Some(ns), Some(n)) => format!("pod {ns}/{n}"),
            _ => format!("pod #{i}"),
        };
        match pod_extras(&mut v) {
            Ok(x) => {
                extras.insert((key(&v, "namespace"), key(&v, "name")), x);
                pod_values.push(v);
            }
            Err((f, m)) => problems.push(Problem::new(obj, f, m)),
        }
    }
    let mut pods = each(pod_values, "pod", &["namespace", "name"], |r| validate::pod(r).map_err(|p| (p.field, p.message)).map(|p| (p, Vec::new())), &mut problems);
    for p in &mut pods {
        if let Some((labels, ports)) = extras.remove(&(Some(p.namespace.clone()), Some(p.name.clone()))) {
            p.labels = labels;
            p.container_ports = ports;
        }
    }
    let remote_pods = each(raw.remote_pods, "remotepod", &["namespace", "name"], |r: RawRemotePod| remote_pod(r).map(|p| (p, Vec::new())), &mut problems);
    let network_policies = each_policy(raw.network_policies, &mut problems);
    let egress_policies = each(
        raw.egress_network_policies,
        "egressnetworkpolicy",
        &["namespace", "name"],
        |r: RawEgressPolicy| {
            let rules = r.egress.iter().map(|e| validate::EgressRuleFields { kind: &e.kind, cidr_selector: e.to.cidr_selector.as_deref(), dns_name: e.to.dns_name.as_deref() });
            validate::egress_policy(&r.namespace, &r.name, rules).map(|p| (p, Vec::new()))
        },
        &mut problems,
    );
    validate::assemble_with_policies(header, host_subnets, net_namespaces, services, pods, egress_policies, (remote_pods, network_policies), problems)
}

/// A pod's `labels` and `containerPorts` (Kubernetes' ContainerPort shape), removed from `v`.
fn pod_extras(v: &mut Value) -> Result<(super::netpol::Labels, Vec<super::netpol::ContainerPort>), FieldError> {
    let Some(o) = v.as_object_mut() else { return Ok(Default::default()) };
    let labels = match o.remove("labels") {
        None | Some(Value::Null) => Default::default(),
        Some(l) => serde_path_to_error::deserialize(&l).map_err(|e| (format!("labels.{}", e.path()), e.inner().to_string()))?,
    };
    let mut ports = Vec::new();
    if let Some(cp) = o.remove("containerPorts").filter(|v| !v.is_null()) {
        let raw: Vec<k8s_openapi::api::core::v1::ContainerPort> =
            serde_path_to_error::deserialize(&cp).map_err(|e| (format!("containerPorts{}", e.path()), e.inner().to_string()))?;
        ports = container_ports(&raw)?;
    }
    Ok((labels, ports))
}

/// Kubernetes ContainerPorts, checked (a port 1..65535, a known protocol, an empty name is none).
fn container_ports(raw: &[k8s_openapi::api::core::v1::ContainerPort]) -> Result<Vec<super::netpol::ContainerPort>, FieldError> {
    let mut ports = Vec::with_capacity(raw.len());
    for (i, c) in raw.iter().enumerate() {
        let port = u16::try_from(c.container_port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| (format!("containerPorts[{i}].containerPort"), format!("{} is not a port number (1..65535)", c.container_port)))?;
        let proto = super::netpol::Proto::parse(c.protocol.as_deref()).map_err(|m| (format!("containerPorts[{i}].protocol"), m))?;
        ports.push(super::netpol::ContainerPort { name: c.name.clone().filter(|n| !n.is_empty()), port, proto });
    }
    Ok(ports)
}

fn remote_pod(r: RawRemotePod) -> Result<super::netpol::RemotePod, FieldError> {
    let ports = container_ports(&r.container_ports)?;
    validate::remote_pod(r.namespace, r.name, &r.ip, r.labels, ports)
}

/// Decodes each NetworkPolicy as the Kubernetes object (k8s-openapi's type) and checks it.
fn each_policy(items: Vec<Value>, problems: &mut Vec<Problem>) -> Vec<super::netpol::NetworkPolicy> {
    let mut out = Vec::new();
    for (i, v) in items.into_iter().enumerate() {
        let meta = |f: &str| v.get("metadata").and_then(|m| m.get(f)).and_then(Value::as_str).map(str::to_string);
        let obj = match (meta("namespace"), meta("name")) {
            (Some(ns), Some(n)) => format!("networkpolicy {ns}/{n}"),
            _ => format!("networkpolicy #{i}"),
        };
        let np: k8s_openapi::api::networking::v1::NetworkPolicy = match serde_path_to_error::deserialize(&v) {
            Ok(np) => np,
            Err(e) => {
                let path = e.path().to_string();
                problems.push(Problem::new(obj, if path == "." { String::new() } else { path }, e.into_inner().to_string()));
                continue;
            }
        };
        let (t, p) = name_problems(&obj, super::netpol::network_policy(&np));
        out.extend(t);
        problems.extend(p);
    }
    out
}

/// Decodes each object of a list; a failure becomes a problem naming the object (by the
/// `name_fields` it has, or its index) and the field.
fn each<R: DeserializeOwned, T>(
    items: Vec<Value>,
    kind: &str,
    name_fields: &[&str],
    convert: impl Fn(R) -> Checked<T>,
    problems: &mut Vec<Problem>,
) -> Vec<T> {
    let mut out = Vec::new();
    for (i, v) in items.into_iter().enumerate() {
        let names: Vec<&str> = name_fields.iter().filter_map(|f| v.get(*f).and_then(Value::as_str)).collect();
        let obj = if names.len() == name_fields.len() { format!("{kind} {}", names.join("/")) } else { format!("{kind} #{i}") };
        let raw: R = match serde_path_to_error::deserialize(&v) {
            Ok(r) => r,
            Err(e) => {
                let path = e.path().to_string();
                problems.push(Problem::new(obj, if path == "." { String::new() } else { path }, e.into_inner().to_string()));
                continue;
            }
        };
        let (t, p) = name_problems(&obj, convert(raw));
        out.extend(t);
        problems.extend(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_breach_names_the_limit() {
        let tiny = YamlLimits { max_nodes: 50, ..YamlLimits::default() };
        let e = parse_with(EXAMPLE, tiny).unwrap_err();
        assert!(e.0.contains("more than 50 YAML nodes") && !e.0.contains("not valid YAML"), "{}", e.0);
        assert!(parse("node: [").unwrap_err().0.contains("not valid YAML"));
    }

    /// A 100,000-pod cluster's state (pods of other nodes, with labels; 200 namespaces): parsed
    /// under the default limits. Time and memory: `cargo test --release -p sdn-model
    /// hundred_thousand -- --ignored --nocapture`.
    #[test]
    #[ignore = "large: run with --release --ignored"]
    fn a_hundred_thousand_pod_state_parses() {
        use std::fmt::Write;
        let mut text = String::from("node: node-a\nplugin: networkpolicy\nclusterNetwork: 10.128.0.0/10\nserviceNetwork: 172.30.0.0/16\n");
        text.push_str("hostSubnets:\n  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/23}\nnetNamespaces:\n");
        for n in 0..200 {
            writeln!(text, "  - {{name: ns-{n}, netid: {}}}", n + 10).unwrap();
        }
        text.push_str("remotePods:\n");
        for i in 0..100_000u32 {
            let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 130, 0, 0)) + i);
            writeln!(text, "  - {{namespace: ns-{}, name: pod-{i}, ip: {ip}, labels: {{app: app-{}, tier: backend}}}}", i % 200, i % 50).unwrap();
        }
        let t = std::time::Instant::now();
        let (state, problems) = parse(&text).unwrap();
        let took = t.elapsed();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(state.remote_pods.len(), 100_000);
        let rss = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string));
        println!("100,000-pod state: {} MiB of YAML parsed in {took:?}; peak {}", text.len() >> 20, rss.unwrap_or_default());
    }
    use crate::model::Vnid;

    pub(crate) const EXAMPLE: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
  - {host: node-c, hostIP: 172.17.0.4, subnet: 10.130.0.0/23, fixedVNID: 7}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11, multicast: true}
services:
  - {namespace: team-a, name: web, clusterIP: 172.30.0.10,
     ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 53}]}
pods:
  - {namespace: team-a, name: a1, containerID: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef, hostVeth: veth-a1,
     ip: 10.128.2.5, mac: "0a:58:0a:80:02:05", ingressBPS: 0, egressBPS: 0}
egressNetworkPolicies:
  - namespace: team-a
    name: default
    egress:
      - {type: Allow, to: {cidrSelector: 1.2.3.0/24}}
      - {type: Allow, to: {dnsName: www.example.com}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
"#;

    #[test]
    fn example_parses() {
        let (s, problems) = parse(EXAMPLE).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(s.host_subnets.len(), 3);
        assert_eq!(s.host_subnets[2].fixed_vnid, Some(Vnid::new(7).unwrap()));
        assert_eq!(s.services[0].ports.len(), 2);
        assert_eq!(s.pods[0].mac.to_string(), "0a:58:0a:80:02:05");
        assert_eq!(s.egress_policies[0].rules.len(), 3);
    }

    fn problems_of(extra: &str) -> Vec<String> {
        let (_, p) = parse(&EXAMPLE.replace("egressNetworkPolicies:", &format!("{extra}\negressNetworkPolicies:"))).unwrap();
        p.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn bad_objects_are_named_with_their_field() {
        let pod = |id: &str, ip: &str, veth: &str| {
            format!("  - {{namespace: team-a, name: p-{veth}, containerID: {id}, hostVeth: {veth}, ip: {ip}, mac: \"0a:58:0a:80:02:09\"}}")
        };
        let good_id = "ab".repeat(32);
        let p = problems_of(&[
            pod("xyz", "10.128.2.9", "v1"),
            pod(&good_id, "10.130.0.9", "v2"),
            pod(&good_id, "10.128.2.5", "v3"),
            pod(&good_id, "10.128.2.1", "v4"),
            format!("  - {{namespace: nowhere, name: x, containerID: {good_id}, hostVeth: v5, ip: 10.128.2.7, mac: \"0a:58:0a:80:02:09\"}}"),
            format!("  - {{namespace: team-a, name: typed, containerID: {good_id}, hostVeth: v6, ip: 10.128.2.8, mac: \"0a:58:0a:80:02:09\", ingressBPS: fast}}"),
        ].join("\n"));
        let joined = p.join("\n");
        assert!(joined.contains("pod team-a/p-v1: field containerID: container ID \"xyz\""), "{joined}");
        assert!(joined.contains("pod team-a/p-v2: field ip: 10.130.0.9 is not a host address"), "{joined}");
        assert!(joined.contains("pod team-a/p-v3: field ip: 10.128.2.5 is already used by pod team-a/a1"), "{joined}");
        assert!(joined.contains("pod team-a/p-v4: field ip: 10.128.2.1 is the node's gateway"), "{joined}");
        assert!(joined.contains("pod nowhere/x: field namespace: unknown namespace \"nowhere\""), "{joined}");
        assert!(joined.contains("pod team-a/typed: field ingressBPS: invalid type"), "{joined}");
    }

    #[test]
    fn service_ports_are_rejected_one_by_one() {
        let (s, p) = parse(&EXAMPLE.replace("{protocol: UDP, port: 53}", "{protocol: SCTP, port: 53}, {protocol: TCP, port: 70000}, {protocol: UDP, port: 53}")).unwrap();
        assert_eq!(s.services[0].ports.len(), 2, "TCP 80 and UDP 53 stay");
        let t: Vec<String> = p.iter().map(|p| p.to_string()).collect();
        assert!(t[0].starts_with("service team-a/web: field ports[1].protocol: unhandled protocol \"SCTP\""), "{t:?}");
        assert!(t[1].starts_with("service team-a/web: field ports[2].port: 70000"), "{t:?}");
    }

    #[test]
    fn other_checks() {
        let t = problems_of("");
        assert!(t.is_empty());
        let (_, p) = parse(&EXAMPLE.replace("netid: 11", "netid: 16777216")).unwrap();
        assert!(p[0].to_string().contains("netnamespace team-a: field netid: VNID 16777216 exceeds"), "{p:?}");
        let (_, p) = parse(&EXAMPLE.replace("cidrSelector: 1.2.3.0/24", "cidrSelector: 1.2.3.0/33")).unwrap();
        assert!(p[0].to_string().contains("egressnetworkpolicy team-a/default: field egress[0].to.cidrSelector"), "{p:?}");
        let (_, p) = parse(&EXAMPLE.replace("subnet: 10.130.0.0/23", "subnet: 10.128.3.0/24")).unwrap();
        assert!(p[0].to_string().contains("hostsubnet node-c: field subnet: 10.128.3.0/24 overlaps"), "{p:?}");
        let e = parse(&EXAMPLE.replace("host: node-a,", "host: node-z,")).unwrap_err();
        assert!(e.0.contains("no valid HostSubnet for this node"), "{e}");
        let e = parse(&EXAMPLE.replace("plugin: multitenant", "plugin: flat")).unwrap_err();
        assert!(e.0.contains("plugin"), "{e}");
        let e = parse("node: [").unwrap_err();
        assert!(e.0.contains("YAML"), "{e}");
        let (_, p) = parse(&EXAMPLE.replace("{type: Deny,", "{type: Maybe,")).unwrap();
        assert!(p[0].to_string().contains("egress[2].type"), "{p:?}");
    }
}
