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
use crate::domain::Plugin;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawFile {
    node: String,
    plugin: Plugin,
    /// The IPv4 cluster network; or `clusterNetworks`, one per family (dual-stack).
    #[serde(default)]
    cluster_network: Option<String>,
    #[serde(default)]
    cluster_networks: Vec<String>,
    #[serde(default)]
    service_network: Option<String>,
    #[serde(default)]
    service_networks: Vec<String>,
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
    #[serde(default)]
    subnet: Option<String>,
    /// One per family (dual-stack), as Node.spec.podCIDRs.
    #[serde(default)]
    subnets: Vec<String>,
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
    #[serde(default)]
    ip: Option<String>,
    /// One per family (dual-stack), as status.podIPs.
    #[serde(default)]
    ips: Vec<String>,
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
    #[serde(default, rename = "clusterIP")]
    cluster_ip: Option<String>,
    /// One per family (dual-stack), as spec.clusterIPs.
    #[serde(default, rename = "clusterIPs")]
    cluster_ips: Vec<String>,
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

/// [`parse`] of a new version of a file whose last good state is `previous` (a running agent's
/// source): an object rejected on its own (a typo'd field, a bad value) that `previous` has
/// (the same kind, namespace and name) keeps its version from `previous`, problem tagged
/// [`KEPT`], instead of going (and taking its port and flows with it). The kept object still
/// passes the cross-object checks with the rest of the new file.
pub fn parse_keeping(text: &str, previous: Option<&ClusterState>) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    let value = read_yaml(text, YamlLimits::default())?;
    from_value_keeping(value, previous)
}

/// What the message of a problem whose object kept its last good version ends with.
pub const KEPT: &str = "(the last good version is kept)";

/// [`parse`] under `limits`. A document over a limit is refused with that limit named, not
/// as invalid YAML.
pub fn parse_with(text: &str, limits: YamlLimits) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    from_value(read_yaml(text, limits)?)
}

fn read_yaml(text: &str, limits: YamlLimits) -> Result<Value, Fatal> {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = limits.max_nodes;
    budget.max_events = limits.max_events;
    budget.max_total_scalar_bytes = limits.max_scalar_bytes;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    serde_saphyr::from_str_with_options(text, options).map_err(|e| yaml_error(e, limits))
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

/// What the state file must have at least: the fields [`RawFile`] cannot default.
const NEEDS: &str = "it needs node, plugin, clusterNetwork and serviceNetwork (see deploy/examples/cluster.yaml)";

/// Decodes and validates a state given as one JSON value of the state file's schema.
pub fn from_value(value: Value) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    from_value_keeping(value, None)
}

/// [`from_value`] keeping the last good version of rejected objects (see [`parse_keeping`]).
pub fn from_value_keeping(value: Value, previous: Option<&ClusterState>) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    match &value {
        Value::Null => return Err(Fatal(format!("the state file is empty: {NEEDS}"))),
        Value::Object(_) => {}
        _ => return Err(Fatal(format!("the state file is not a mapping of fields: {NEEDS}"))),
    }
    let raw: RawFile = serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            Fatal(format!("{}: {NEEDS}", e.inner()))
        } else {
            Fatal(format!("field {path}: {}", e.inner()))
        }
    })?;
    let cluster = networks("clusterNetworks", raw.cluster_network.as_deref(), &raw.cluster_networks)?;
    let service = networks("serviceNetworks", raw.service_network.as_deref(), &raw.service_networks)?;
    let header = validate::header(raw.node, raw.plugin, &cluster, &service, raw.vxlan_port, raw.mtu)?;
    let mut problems = Vec::new();
    let prev = previous;
    let host_subnets = each(
        raw.host_subnets,
        "hostsubnet",
        &["host"],
        |r: RawHostSubnet| {
            let subnets = validate::singular_and_plural("subnets", r.subnet.as_deref(), &r.subnets)?;
            validate::host_subnet(&r.host, &r.host_ip, &subnets, r.fixed_vnid.map(Ok))
        },
        |id| prev?.host_subnets.iter().find(|h| h.host == id[0]).cloned(),
        &mut problems,
    );
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
        |id| prev?.net_namespaces.iter().find(|n| n.name == id[0]).cloned(),
        &mut problems,
    );
    let services = each(
        raw.services,
        "service",
        &["namespace", "name"],
        |r: RawService| {
            let ips = validate::singular_and_plural("clusterIPs", r.cluster_ip.as_deref(), &r.cluster_ips)?;
            validate::service(&r.namespace, &r.name, &ips, r.ports.iter().map(|p| (p.protocol.as_str(), p.port)))
        },
        |id| prev?.services.iter().find(|s| s.namespace == id[0] && s.name == id[1]).cloned(),
        &mut problems,
    );
    // Labels and containerPorts are taken out before the pod is decoded as the pod API's
    // RawPod (which has no such fields), and put back on the validated pod.
    let pods = each_with(
        raw.pods,
        "pod",
        &["namespace", "name"],
        pod_extras,
        |r: validate::RawPod, (labels, ports)| {
            validate::pod(r).map_err(|p| (p.field, p.message)).map(|mut p| {
                p.labels = labels;
                p.container_ports = ports;
                (p, Vec::new())
            })
        },
        |id| prev?.pods.iter().find(|p| p.namespace == id[0] && p.name == id[1]).cloned(),
        &mut problems,
    );
    let remote_pods = each(
        raw.remote_pods,
        "remotepod",
        &["namespace", "name"],
        |r: RawRemotePod| remote_pod(r).map(|p| (p, Vec::new())),
        |id| prev?.remote_pods.iter().find(|p| p.namespace == id[0] && p.name == id[1]).cloned(),
        &mut problems,
    );
    let network_policies = each_policy(raw.network_policies, prev, &mut problems);
    let egress_policies = each(
        raw.egress_network_policies,
        "egressnetworkpolicy",
        &["namespace", "name"],
        |r: RawEgressPolicy| {
            let rules = r.egress.iter().map(|e| validate::EgressRuleFields { kind: &e.kind, cidr_selector: e.to.cidr_selector.as_deref(), dns_name: e.to.dns_name.as_deref() });
            validate::egress_policy(&r.namespace, &r.name, rules).map(|p| (p, Vec::new()))
        },
        |id| prev?.egress_policies.iter().find(|p| p.namespace == id[0] && p.name == id[1]).cloned(),
        &mut problems,
    );
    validate::assemble_with_policies(header, host_subnets, net_namespaces, services, pods, egress_policies, (remote_pods, network_policies), problems)
}

/// The cluster or service networks, from the singular or the plural field; one is required.
fn networks<'a>(field: &str, one: Option<&'a str>, many: &'a [String]) -> Result<Vec<&'a str>, Fatal> {
    let list = validate::singular_and_plural(field, one, many).map_err(|(f, m)| Fatal(format!("field {f}: {m}")))?;
    if list.is_empty() {
        return Err(Fatal(format!("missing field `{}` (or `{field}`, one per family): {NEEDS}", field.trim_end_matches('s'))));
    }
    Ok(list)
}

/// A problem of an object rejected as a whole: with its last good version (`kept`) the
/// object stays as it was and the message says so.
fn rejected<T>(obj: String, field: String, message: String, kept: Option<T>, out: &mut Vec<T>, problems: &mut Vec<Problem>) {
    match kept {
        Some(t) => {
            out.push(t);
            problems.push(Problem::new(obj, field, format!("{message} {KEPT}")));
        }
        None => problems.push(Problem::new(obj, field, message)),
    }
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
    let ips = validate::singular_and_plural("ips", r.ip.as_deref(), &r.ips)?;
    validate::remote_pod(r.namespace, r.name, &ips, r.labels, ports)
}

/// Decodes each NetworkPolicy as the Kubernetes object (k8s-openapi's type) and checks it; a
/// rejected one keeps its version in `previous` if it has one.
fn each_policy(items: Vec<Value>, previous: Option<&ClusterState>, problems: &mut Vec<Problem>) -> Vec<super::netpol::NetworkPolicy> {
    let mut out = Vec::new();
    for (i, v) in items.into_iter().enumerate() {
        let meta = |f: &str| v.get("metadata").and_then(|m| m.get(f)).and_then(Value::as_str).map(str::to_string);
        let id = meta("namespace").zip(meta("name"));
        let obj = match &id {
            Some((ns, n)) => format!("networkpolicy {ns}/{n}"),
            None => format!("networkpolicy #{i}"),
        };
        let kept = || {
            let (ns, n) = id.as_ref()?;
            previous?.network_policies.iter().find(|p| &p.namespace == ns && &p.name == n).cloned()
        };
        let np: k8s_openapi::api::networking::v1::NetworkPolicy = match serde_path_to_error::deserialize(&v) {
            Ok(np) => np,
            Err(e) => {
                let path = e.path().to_string();
                rejected(obj, if path == "." { String::new() } else { path }, e.into_inner().to_string(), kept(), &mut out, problems);
                continue;
            }
        };
        match super::netpol::network_policy(&np) {
            Err((field, message)) => rejected(obj, field, message, kept(), &mut out, problems),
            checked => {
                let (t, p) = name_problems(&obj, checked);
                out.extend(t);
                problems.extend(p);
            }
        }
    }
    out
}

/// Decodes each object of a list; a failure becomes a problem naming the object (by the
/// `name_fields` it has, or its index) and the field. An object rejected as a whole that has a
/// last good version (`last_good`, by the values of `name_fields`) keeps it.
fn each<R: DeserializeOwned, T>(
    items: Vec<Value>,
    kind: &str,
    name_fields: &[&str],
    convert: impl Fn(R) -> Checked<T>,
    last_good: impl Fn(&[&str]) -> Option<T>,
    problems: &mut Vec<Problem>,
) -> Vec<T> {
    each_with(items, kind, name_fields, |_| Ok(()), |r, ()| convert(r), last_good, problems)
}

/// [`each`] with a first step `pre` that takes what the decoded type has no field for out of
/// the object (a pod's labels) and hands it to `convert`.
fn each_with<R: DeserializeOwned, X, T>(
    items: Vec<Value>,
    kind: &str,
    name_fields: &[&str],
    pre: impl Fn(&mut Value) -> Result<X, FieldError>,
    convert: impl Fn(R, X) -> Checked<T>,
    last_good: impl Fn(&[&str]) -> Option<T>,
    problems: &mut Vec<Problem>,
) -> Vec<T> {
    let mut out = Vec::new();
    for (i, mut v) in items.into_iter().enumerate() {
        let names: Vec<String> = name_fields.iter().filter_map(|f| v.get(*f).and_then(Value::as_str)).map(str::to_string).collect();
        let id: Option<Vec<&str>> = (names.len() == name_fields.len()).then(|| names.iter().map(String::as_str).collect());
        let obj = match &id {
            Some(id) => format!("{kind} {}", id.join("/")),
            None => format!("{kind} #{i}"),
        };
        let kept = || id.as_deref().and_then(&last_good);
        let x = match pre(&mut v) {
            Ok(x) => x,
            Err((field, message)) => {
                rejected(obj, field, message, kept(), &mut out, problems);
                continue;
            }
        };
        let raw: R = match serde_path_to_error::deserialize(&v) {
            Ok(r) => r,
            Err(e) => {
                let path = e.path().to_string();
                rejected(obj, if path == "." { String::new() } else { path }, e.into_inner().to_string(), kept(), &mut out, problems);
                continue;
            }
        };
        match convert(raw, x) {
            Err((field, message)) => rejected(obj, field, message, kept(), &mut out, problems),
            checked => {
                let (t, p) = name_problems(&obj, checked);
                out.extend(t);
                problems.extend(p);
            }
        }
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
    use crate::domain::Vnid;

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

    /// A running agent's next version of the file: an object rejected on its own keeps the
    /// version the agent had; one never good, or removed from the file, does not.
    #[test]
    fn a_rejected_object_keeps_its_last_good_version() {
        let (good, _) = parse(EXAMPLE).unwrap();
        let typo = EXAMPLE.replace("ingressBPS: 0,", "ingressBPS: 0, internl: true,");
        let (without, p) = parse(&typo).unwrap();
        assert!(without.pods.is_empty(), "without a previous state the pod is rejected");
        assert!(p[0].to_string().starts_with("pod team-a/a1: field internl: unknown field `internl`"), "{p:?}");
        assert!(!p[0].message.contains(KEPT));

        let (kept, p) = parse_keeping(&typo, Some(&good)).unwrap();
        assert_eq!(kept, good, "the pod keeps its last good version");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].object.as_str(), p[0].field.as_str()), ("pod team-a/a1", "internl"));
        assert!(p[0].message.ends_with(KEPT), "{p:?}");

        // A bad value (not only an unknown field), a bad label, a service, a namespace, an
        // egress policy, a NetworkPolicy: each keeps its version.
        for (from, to, obj) in [
            ("ip: 10.128.2.5,", "ip: 10.128.2.x,", "pod team-a/a1"),
            ("ingressBPS: 0,", "ingressBPS: 0, labels: {app: [1]},", "pod team-a/a1"),
            ("clusterIP: 172.30.0.10", "clusterIP: 172.30.0.300", "service team-a/web"),
            ("{name: team-a, netid: 11, multicast: true}", "{name: team-a, netid: -1, multicast: true}", "netnamespace team-a"),
            ("cidrSelector: 1.2.3.0/24", "cidrSelector: 1.2.3.0/24, extra: 1", "egressnetworkpolicy team-a/default"),
            ("hostIP: 172.17.0.3,", "hostIp: 172.17.0.3,", "hostsubnet node-b"),
        ] {
            let bad = EXAMPLE.replace(from, to);
            assert_ne!(bad, EXAMPLE, "{from}");
            let (st, p) = parse_keeping(&bad, Some(&good)).unwrap();
            assert_eq!(st, good, "{obj} kept");
            assert!(p.len() == 1 && p[0].object == obj && p[0].message.ends_with(KEPT), "{obj}: {p:?}");
        }

        // A new object that is bad has nothing to keep; an object taken out of the file goes.
        let new_bad = EXAMPLE.replace("name: a1,", "name: a2,").replace("ingressBPS: 0,", "ingressBPS: 0, internl: true,");
        let (st, p) = parse_keeping(&new_bad, Some(&good)).unwrap();
        assert!(st.pods.is_empty() && !p[0].message.contains(KEPT), "{p:?}");
        let pod_line = EXAMPLE.lines().position(|l| l.contains("name: a1")).unwrap();
        let gone: String = EXAMPLE.lines().enumerate().filter(|(i, _)| *i != pod_line && *i != pod_line + 1).map(|(_, l)| format!("{l}\n")).collect();
        let (st, p) = parse_keeping(&gone.replace("pods:\n", "pods: []\n"), Some(&good)).unwrap();
        assert!(st.pods.is_empty() && p.is_empty(), "{p:?}");

        // The kept object still passes the cross-object checks with the new file: another pod
        // now holding its IP is first in the file and wins.
        let taken = typo.replace("pods:\n", &format!("pods:\n  - {{namespace: team-a, name: b1, containerID: {}, hostVeth: veth-b1, ip: 10.128.2.5, mac: \"0a:58:0a:80:02:06\"}}\n", "cd".repeat(32)));
        let (st, p) = parse_keeping(&taken, Some(&good)).unwrap();
        assert_eq!(st.pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["b1"]);
        let t: Vec<String> = p.iter().map(ToString::to_string).collect();
        assert!(t.iter().any(|p| p.contains("pod team-a/a1: field ip: 10.128.2.5 is already used by pod team-a/b1")), "{t:?}");
    }

    #[test]
    fn an_empty_or_shapeless_file_says_what_it_needs() {
        for text in ["", "\n", "# nothing yet\n"] {
            let e = parse(text).unwrap_err().0;
            assert_eq!(e, "the state file is empty: it needs node, plugin, clusterNetwork and serviceNetwork (see deploy/examples/cluster.yaml)");
        }
        let e = parse("- node-a\n").unwrap_err().0;
        assert!(e.starts_with("the state file is not a mapping of fields: it needs node,"), "{e}");
        let e = parse("node: node-a\n").unwrap_err().0;
        assert!(e.starts_with("missing field `plugin`: it needs node, plugin,") && !e.contains("field ."), "{e}");
        let e = parse(&EXAMPLE.replace("node: node-a\n", "node: node-a\nnodes: x\n")).unwrap_err().0;
        assert!(e.contains("unknown field `nodes`"), "{e}");
    }

    /// This node's HostSubnet rejected on its own: the fatal error names its field.
    #[test]
    fn a_bad_local_hostsubnet_names_its_field() {
        let e = parse(&EXAMPLE.replace("{host: node-a, hostIP: 172.17.0.2,", "{host: node-a, hostIp: 172.17.0.2,")).unwrap_err().0;
        assert!(e.starts_with("no valid HostSubnet for this node \"node-a\": the local subnet is unknown: hostsubnet node-a: field hostIp: unknown field `hostIp`"), "{e}");
        let e = parse(&EXAMPLE.replace("hostIP: 172.17.0.2,", "hostIP: 172.17.0.256,")).unwrap_err().0;
        assert!(e.contains("hostsubnet node-a: field hostIP:") && e.contains("172.17.0.256"), "{e}");
        let e = parse(&EXAMPLE.replace("subnet: 10.128.2.0/23}", "subnet: 10.200.2.0/23}")).unwrap_err().0;
        assert!(e.contains("hostsubnet node-a: field subnet: 10.200.2.0/23 is outside the cluster network"), "{e}");
        let e = parse(&EXAMPLE.replace("host: node-a,", "host: node-z,")).unwrap_err().0;
        assert!(e.ends_with("(no hostSubnets entry has this host)"), "{e}");
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

    /// The dual-stack example: an IPv6 subnet beside the IPv4 one, an address of each family
    /// per pod and service; the plural fields are checked as Kubernetes checks them.
    #[test]
    fn dual_stack() {
        // The example has one pod (team-a/web; the demo makes its own through CNI): three more
        // of the same dual-stack shape, appended to its `pods:`.
        const PODS: &str = r#"
  - {namespace: team-a, name: a1, containerID: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef,
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, ips: [10.128.2.5, "fd00:10:128:2::5"], mac: "0a:58:0a:80:02:05"}
  - {namespace: team-a, name: a2, containerID: 1123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef,
     hostVeth: veth-a2, internal: true, ip: 10.128.2.6, ips: [10.128.2.6, "fd00:10:128:2::6"], mac: "0a:58:0a:80:02:06"}
  - {namespace: team-b, name: b1, containerID: 2123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef,
     hostVeth: veth-b1, internal: true, ip: 10.128.2.7, ips: [10.128.2.7, "fd00:10:128:2::7"], mac: "0a:58:0a:80:02:07"}
"#;
        let text = &format!("{}{PODS}", include_str!("../../../deploy/examples/dual-stack.yaml"));
        let text = text.as_str();
        let (s, p) = parse(text).unwrap();
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(s.cluster_network6, Some("fd00:10:128::/48".parse().unwrap()));
        assert_eq!(s.service_network6, Some("fd00:172:30::/112".parse().unwrap()));
        assert_eq!(s.local_subnet().unwrap().subnet6, Some("fd00:10:128:2::/64".parse().unwrap()));
        assert_eq!(s.pods[0].ip6, Some("fd00:10:128:2::c8".parse().unwrap()));
        assert_eq!(s.pods[1].ip6, Some("fd00:10:128:2::5".parse().unwrap()));
        assert_eq!(s.services[0].cluster_ip6, Some("fd00:172:30::10".parse().unwrap()));
        let problem = |from: &str, to: &str| {
            let bad = text.replace(from, to);
            assert_ne!(bad, text, "{from}");
            parse(&bad).map(|(_, p)| p.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")).unwrap_or_else(|e| e.0)
        };
        for (from, to, want) in [
            ("\"fd00:10:128:2::6\"", "\"fd00:10:128:2::5\"", "pod team-a/a2: field ips: fd00:10:128:2::5 is already used by pod team-a/a1"),
            ("\"fd00:10:128:2::6\"", "\"fd00:10:128:2::1\"", "field ips: fd00:10:128:2::1 is the node's IPv6 gateway address"),
            ("\"fd00:10:128:2::6\"", "\"fd00:10:128:3::6\"", "is not a host address of this node's IPv6 subnet fd00:10:128:2::/64"),
            ("ips: [10.128.2.6, ", "ips: [10.128.2.9, ", "field ips: does not list \"10.128.2.6\""),
            ("\"fd00:10:128:2::6\"]", "\"fd00:10:128:2::6\", \"fd00::9\"]", "field ips[2]: \"fd00::9\": a second IPv6 value; one per family"),
            ("\"fd00:172:30::10\"", "\"fd00:172:31::10\"", "service team-a/web: field clusterIPs: fd00:172:31::10 is outside the service network fd00:172:30::/112"),
            ("\"fd00:10:128:200::/64\"", "\"fd00:10:128:2::/63\"", "hostsubnet node-c: field subnets: fd00:10:128:2::/63 overlaps fd00:10:128:2::/64 of node node-a"),
            ("\"fd00:10:128:200::/64\"", "\"fd00:10:129::/64\"", "hostsubnet node-c: field subnets: fd00:10:129::/64 is outside the cluster network fd00:10:128::/48"),
            ("serviceNetworks: [172.30.0.0/16, \"fd00:172:30::/112\"]", "serviceNetworks: [172.30.0.0/16]", "the cluster network is IPv4 and IPv6 but the service network IPv4: both have the same families"),
            ("clusterNetworks: [10.128.0.0/14, ", "clusterNetworks: [", "the cluster network is IPv6 but the service network IPv4 and IPv6: both have the same families"),
        ] {
            let got = problem(from, to);
            assert!(got.contains(want), "{from} -> {to}: {got}");
        }
        // A HostSubnet whose IPv6 subnet is wrong keeps its IPv4 one.
        let (s, _) = parse(&text.replace("\"fd00:10:128:200::/64\"", "\"fd00:10:129::/64\"")).unwrap();
        let c = s.host_subnets.iter().find(|h| h.host == "node-c").unwrap();
        assert_eq!((c.subnet.map(|s| s.to_string()), c.subnet6), (Some("10.130.0.0/23".to_string()), None));
    }

    /// A single-stack IPv6 state: the singular fields take IPv6 values, nothing is IPv4, and
    /// the node's pipeline has no IPv4 side; every IPv4 value is refused naming its object.
    #[test]
    fn ipv6_only() {
        let text = include_str!("../../../deploy/examples/ipv6-only.yaml");
        let (s, p) = parse(text).unwrap();
        assert!(p.is_empty(), "{p:?}");
        assert!(s.ipv6_only());
        assert_eq!((s.cluster_network, s.service_network), (None, None));
        assert_eq!(s.cluster_network6, Some("fd00:10:128::/48".parse().unwrap()));
        let local = s.local_subnet().unwrap();
        assert_eq!((local.subnet, local.subnet6), (None, Some("fd00:10:128:2::/64".parse().unwrap())));
        assert_eq!(local.tun0_mac().unwrap().to_string(), "0a:58:00:00:00:01");
        assert_eq!((s.pods[0].ip, s.pods[0].ip6), (None, Some("fd00:10:128:2::c8".parse().unwrap())));
        assert_eq!((s.services[0].cluster_ip, s.services[0].cluster_ip6), (None, Some("fd00:172:30::10".parse().unwrap())));
        assert!(s.node_ipv4().is_none() && s.node_ipv6().is_some());
        let problem = |from: &str, to: &str| {
            let bad = text.replace(from, to);
            assert_ne!(bad, text, "{from}");
            parse(&bad).map(|(_, p)| p.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")).unwrap_or_else(|e| e.0)
        };
        for (from, to, want) in [
            ("ip: \"fd00:10:128:2::c8\"", "ip: 10.128.2.200", "pod team-a/web: field ip: 10.128.2.200: this node has no IPv4 subnet"),
            ("ip: \"fd00:10:128:2::c8\"", "ip: \"fd00:10:128:2::1\"", "pod team-a/web: field ips: fd00:10:128:2::1 is the node's IPv6 gateway address"),
            ("clusterIP: \"fd00:172:30::10\"", "clusterIP: 172.30.0.10", "service team-a/web: field clusterIP: 172.30.0.10: the cluster has no IPv4 service network"),
            ("subnet: \"fd00:10:128:100::/64\"", "subnet: 10.129.0.0/23", "hostsubnet node-b: field subnet: 10.129.0.0/23: the cluster has no IPv4 cluster network"),
            ("subnet: \"fd00:10:128:100::/64\"", "subnet: \"fd00:10:128:2::/63\"", "hostsubnet node-b: field subnet: fd00:10:128:2::/63 overlaps fd00:10:128:2::/64 of node node-a"),
            ("serviceNetwork: \"fd00:172:30::/112\"", "serviceNetwork: 172.30.0.0/16", "the cluster network is IPv6 but the service network IPv4"),
        ] {
            let got = problem(from, to);
            assert!(got.contains(want), "{from} -> {to}: {got}");
        }
        // A node subnet dropped whole: no IPv4 one to fall back on.
        let (s, _) = parse(&text.replace("\"fd00:10:128:100::/64\"", "\"fd00:10:129::/64\"")).unwrap();
        assert!(!s.host_subnets.iter().any(|h| h.host == "node-b"));
        // The pipeline: IPv6 flows only.
        let (d, problems, _) = crate::cluster::desired::desired_state_with_warnings(&s, &Default::default(), &Default::default());
        assert!(problems.is_empty(), "{problems:?}");
        let matches: Vec<openflow::Match> = d.iter().map(|(_, f)| f.key.decode_match().unwrap()).collect();
        assert!(matches.len() > 40, "{}", matches.len());
        assert!(matches.iter().any(|m| m.to_string() == "ipv6,ipv6_dst=fd00:172:30::10,nw_frag=later"), "{matches:#?}");
        let v4: Vec<_> = matches.iter().filter(|m| matches!(m.eth, openflow::EthMatch::Ipv4(_) | openflow::EthMatch::Arp(_))).collect();
        assert!(v4.is_empty(), "{v4:#?}");
    }
}
