//! The standalone state file: YAML in the spirit of the Kubernetes objects.
//!
//! Each object is decoded on its own (through `serde_path_to_error`, so a type error names the
//! field), then checked; a bad object becomes a [`Problem`] and the rest of the file is used.

use std::net::Ipv4Addr;
use std::path::Path;

use ipnet::Ipv4Net;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::{ClusterState, Fatal, HostSubnet, NetNamespace, Pod, Problem, Service};
use crate::model::{ContainerId, Plugin, Vnid};
use crate::pipeline::egress::{self, RuleType, Target};
use crate::pipeline::service::{ServicePort, ServiceProto};

/// The most rules one EgressNetworkPolicy may have (as the OpenShift API limits it).
pub const MAX_EGRESS_RULES: usize = 10_000;

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

/// A pod as the state file (and the pod API, field for field) writes it, before validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPod {
    pub namespace: String,
    pub name: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    #[serde(rename = "hostVeth")]
    pub host_veth: String,
    pub ip: String,
    pub mac: String,
    #[serde(default, rename = "ingressBPS")]
    pub ingress_bps: i64,
    #[serde(default, rename = "egressBPS")]
    pub egress_bps: i64,
    #[serde(default)]
    pub internal: bool,
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

/// Decodes and validates state file text.
pub fn parse(text: &str) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    let value: Value = serde_saphyr::from_str(text).map_err(|e| Fatal(format!("not valid YAML: {e}")))?;
    from_value(value)
}

/// Decodes and validates a state given as one JSON value of the state file's schema.
pub fn from_value(value: Value) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    let raw: RawFile = serde_path_to_error::deserialize(&value).map_err(|e| Fatal(format!("field {}: {}", e.path(), e.inner())))?;
    let header = header(raw.node, raw.plugin, &raw.cluster_network, &raw.service_network, raw.vxlan_port, raw.mtu)?;
    let mut problems = Vec::new();
    let host_subnets = each(raw.host_subnets, "hostsubnet", &["host"], |r: RawHostSubnet| host_subnet(&r.host, &r.host_ip, &r.subnet, r.fixed_vnid.map(Ok)), &mut problems);
    let net_namespaces = each(
        raw.net_namespaces,
        "netnamespace",
        &["name"],
        |r: RawNetNamespace| {
            net_namespace(&r.name, Ok(r.netid), r.multicast).map(|(mut n, p)| {
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
        |r: RawService| service(&r.namespace, &r.name, &r.cluster_ip, r.ports.iter().map(|p| (p.protocol.as_str(), p.port))),
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
    let mut pods = each(pod_values, "pod", &["namespace", "name"], |r| pod(r).map(|p| (p, Vec::new())), &mut problems);
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
            let rules = r.egress.iter().map(|e| EgressRuleFields { kind: &e.kind, cidr_selector: e.to.cidr_selector.as_deref(), dns_name: e.to.dns_name.as_deref() });
            egress_policy(&r.namespace, &r.name, rules).map(|p| (p, Vec::new()))
        },
        &mut problems,
    );
    assemble_with_policies(header, host_subnets, net_namespaces, services, pods, egress_policies, (remote_pods, network_policies), problems)
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
        for (i, c) in raw.iter().enumerate() {
            let port = u16::try_from(c.container_port)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| (format!("containerPorts[{i}].containerPort"), format!("{} is not a port number (1..65535)", c.container_port)))?;
            let proto = super::netpol::Proto::parse(c.protocol.as_deref()).map_err(|m| (format!("containerPorts[{i}].protocol"), m))?;
            ports.push(super::netpol::ContainerPort { name: c.name.clone().filter(|n| !n.is_empty()), port, proto });
        }
    }
    Ok((labels, ports))
}

fn remote_pod(r: RawRemotePod) -> Result<super::netpol::RemotePod, FieldError> {
    name("namespace", &r.namespace)?;
    name("name", &r.name)?;
    Ok(super::netpol::RemotePod { ip: addr(&r.ip).map_err(at("ip"))?, namespace: r.namespace, name: r.name, labels: r.labels })
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

/// The cluster-wide settings of a state, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub node: String,
    pub plugin: Plugin,
    pub cluster_network: Ipv4Net,
    pub service_network: Ipv4Net,
    pub vxlan_port: u16,
    pub mtu: u32,
}

/// Validates the cluster-wide settings (the state cannot be used without them).
pub fn header(
    node: String,
    plugin: Plugin,
    cluster_network: &str,
    service_network: &str,
    vxlan_port: u16,
    mtu: u32,
) -> Result<Header, Fatal> {
    let cluster_network = net(cluster_network).map_err(|e| Fatal(format!("field clusterNetwork: {e}")))?;
    let service_network = net(service_network).map_err(|e| Fatal(format!("field serviceNetwork: {e}")))?;
    if node.is_empty() {
        return Err(Fatal("field node: must not be empty".into()));
    }
    if !(576..=9000).contains(&mtu) {
        return Err(Fatal(format!("field mtu: {mtu} is outside 576..=9000")));
    }
    if vxlan_port == 0 {
        return Err(Fatal("field vxlanPort: 0 is not a UDP port".into()));
    }
    Ok(Header { node, plugin, cluster_network, service_network, vxlan_port, mtu })
}

/// Builds the state from objects validated one by one ([`host_subnet`], [`service`], ...) and
/// runs the cross-object checks ([`ClusterState::validate`]); `problems` are the per-object
/// problems found so far, the cross-object ones follow them.
pub fn assemble(
    h: Header,
    host_subnets: Vec<HostSubnet>,
    net_namespaces: Vec<NetNamespace>,
    services: Vec<Service>,
    pods: Vec<Pod>,
    egress_policies: Vec<egress::Policy>,
    problems: Vec<Problem>,
) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    assemble_with_policies(h, host_subnets, net_namespaces, services, pods, egress_policies, (Vec::new(), Vec::new()), problems)
}

/// [`assemble`] with the NetworkPolicy plugin's objects: pods on other nodes and policies.
#[allow(clippy::too_many_arguments)]
pub fn assemble_with_policies(
    h: Header,
    host_subnets: Vec<HostSubnet>,
    net_namespaces: Vec<NetNamespace>,
    services: Vec<Service>,
    pods: Vec<Pod>,
    egress_policies: Vec<egress::Policy>,
    (remote_pods, network_policies): (Vec<super::netpol::RemotePod>, Vec<super::netpol::NetworkPolicy>),
    mut problems: Vec<Problem>,
) -> Result<(ClusterState, Vec<Problem>), Fatal> {
    let state = ClusterState {
        node: h.node,
        plugin: h.plugin,
        cluster_network: h.cluster_network,
        service_network: h.service_network,
        vxlan_port: h.vxlan_port,
        mtu: h.mtu,
        host_subnets,
        net_namespaces,
        services,
        pods,
        egress_policies,
        remote_pods,
        network_policies,
        pod_meta: Default::default(),
    };
    let (state, more) = state.validate()?;
    problems.extend(more);
    Ok((state, problems))
}

/// A rejected field: (field, message).
pub type FieldError = (String, String);

/// One object checked on its own: the model object and the problems of the parts that were
/// dropped from it (named by field only; [`name_problems`] names the object), or why the whole
/// object is rejected.
pub type Checked<T> = Result<(T, Vec<Problem>), FieldError>;

/// The problems of one checked object, named after it (`hostsubnet node-b`, `service ns/web`).
pub fn name_problems<T>(object: &str, checked: Checked<T>) -> (Option<T>, Vec<Problem>) {
    match checked {
        Ok((t, local)) => (
            Some(t),
            local
                .into_iter()
                .map(|mut p| {
                    p.object = object.to_string();
                    p
                })
                .collect(),
        ),
        Err((field, msg)) => (None, vec![Problem::new(object, field, msg)]),
    }
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

fn net(s: &str) -> Result<Ipv4Net, String> {
    s.parse::<Ipv4Net>().map(|n| n.trunc()).map_err(|_| format!("{s:?} is not an IPv4 CIDR"))
}

fn addr(s: &str) -> Result<Ipv4Addr, String> {
    s.parse::<Ipv4Addr>().map_err(|_| format!("{s:?} is not an IPv4 address"))
}

fn vnid(v: u64) -> Result<Vnid, String> {
    u32::try_from(v).map_err(|_| format!("VNID {v} exceeds the 24-bit maximum")).and_then(Vnid::new)
}

fn at(field: &str) -> impl Fn(String) -> FieldError + '_ {
    move |m| (field.to_string(), m)
}

fn name(field: &str, s: &str) -> Result<(), FieldError> {
    if s.is_empty() {
        return Err((field.into(), "must not be empty".into()));
    }
    Ok(())
}

/// Checks one HostSubnet. `fixed_vnid`: the fixed-VNID value, or why it is not a number.
pub fn host_subnet(host: &str, host_ip: &str, subnet: &str, fixed_vnid: Option<Result<u64, String>>) -> Checked<HostSubnet> {
    name("host", host)?;
    let fixed_vnid = match fixed_vnid {
        None => None,
        Some(v) => Some(v.and_then(vnid).map_err(at("fixedVNID"))?),
    };
    Ok((
        HostSubnet { host: host.to_string(), host_ip: addr(host_ip).map_err(at("hostIP"))?, subnet: net(subnet).map_err(at("subnet"))?, fixed_vnid },
        Vec::new(),
    ))
}

/// Checks one NetNamespace. `netid`: the number, or why the value is not one.
pub fn net_namespace(name_: &str, netid: Result<u64, String>, multicast: bool) -> Checked<NetNamespace> {
    name("name", name_)?;
    let vnid = netid.and_then(vnid).map_err(at("netid"))?;
    Ok((NetNamespace { name: name_.to_string(), vnid, multicast, labels: Default::default() }, Vec::new()))
}

/// Checks one service; `ports` are (protocol, port). A port with an unsupported protocol or
/// number is dropped from the service with a problem; the service keeps its other ports (the
/// seed logs and skips such a port).
pub fn service<'a>(namespace: &str, name_: &str, cluster_ip: &str, ports_in: impl Iterator<Item = (&'a str, i64)>) -> Checked<Service> {
    name("namespace", namespace)?;
    name("name", name_)?;
    let cluster_ip = addr(cluster_ip).map_err(at("clusterIP"))?;
    let mut problems = Vec::new();
    let mut ports = Vec::new();
    for (i, (protocol, port)) in ports_in.enumerate() {
        let proto = match protocol {
            "TCP" => ServiceProto::Tcp,
            "UDP" => ServiceProto::Udp,
            other => {
                problems.push(Problem::new("", format!("ports[{i}].protocol"), format!("unhandled protocol {other:?}: only TCP and UDP; this port is skipped")));
                continue;
            }
        };
        let Ok(n) = u16::try_from(port).map_err(|_| ()).and_then(|n| if n == 0 { Err(()) } else { Ok(n) }) else {
            problems.push(Problem::new("", format!("ports[{i}].port"), format!("{port} is not a port number (1..65535); this port is skipped")));
            continue;
        };
        let sp = ServicePort { proto, port: n };
        if !ports.contains(&sp) {
            ports.push(sp);
        }
    }
    Ok((Service { namespace: namespace.to_string(), name: name_.to_string(), cluster_ip, ports }, problems))
}

/// Validates one pod (the state file's and the pod API's single rule set).
pub fn validate_pod(r: RawPod) -> Result<Pod, Problem> {
    let obj = format!("pod {}/{}", r.namespace, r.name);
    pod(r).map_err(|(f, m)| Problem::new(obj, f, m))
}

fn pod(r: RawPod) -> Result<Pod, (String, String)> {
    name("namespace", &r.namespace)?;
    name("name", &r.name)?;
    // As the API server validates them: a namespace is a DNS-1123 label, a pod name a
    // DNS-1123 subdomain.
    if !dns1123_label(&r.namespace) {
        return Err(("namespace".into(), format!("{:?} is not a DNS-1123 label (lower-case alphanumerics and '-', at most 63)", r.namespace)));
    }
    if !dns1123_subdomain(&r.name) {
        return Err(("name".into(), format!("{:?} is not a DNS-1123 subdomain (lower-case alphanumerics, '-' and '.', at most 253)", r.name)));
    }
    name("hostVeth", &r.host_veth)?;
    // IFNAMSIZ - 1: longer names cannot be network devices; "." and ".." are not names.
    if r.host_veth.len() > 15
        || r.host_veth == "."
        || r.host_veth == ".."
        || !r.host_veth.bytes().all(|b| b.is_ascii_graphic() && b != b'/' && b != b':')
    {
        return Err(("hostVeth".into(), format!("{:?} is not a valid interface name (at most 15 characters, no '/' or space)", r.host_veth)));
    }
    for (f, v) in [("ingressBPS", r.ingress_bps), ("egressBPS", r.egress_bps)] {
        if v < 0 {
            return Err((f.into(), format!("{v} is negative")));
        }
    }
    if !r.mac.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
        return Err(("mac".into(), format!("{:?} is not six hexadecimal octets separated by ':'", r.mac)));
    }
    let mac: openflow::flow_match::MacAddr = r.mac.parse().map_err(|e: openflow::flow_match::MacParseError| ("mac".to_string(), e.to_string()))?;
    // The pod's own address: the flows match it as a source and deliver to it, so it must be
    // one station's (a group address would take in every multicast; all-zero is no address).
    if mac.0[0] & 1 == 1 {
        return Err(("mac".into(), format!("{mac} is a multicast/broadcast address, not a pod's")));
    }
    if mac.0 == [0; 6] {
        return Err(("mac".into(), format!("{mac} is all zero, not a pod's address")));
    }
    Ok(Pod {
        container_id: ContainerId::parse(&r.container_id).map_err(at("containerID"))?,
        ip: addr(&r.ip).map_err(at("ip"))?,
        mac,
        namespace: r.namespace,
        name: r.name,
        host_veth: r.host_veth,
        ingress_bps: r.ingress_bps,
        egress_bps: r.egress_bps,
        internal: r.internal,
        labels: Default::default(),
        container_ports: Vec::new(),
    })
}

/// A DNS-1123 label: lower-case alphanumerics and '-', starting and ending alphanumeric.
pub fn dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253 characters.
pub fn dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns1123_label)
}

/// A DNS name as RFC 1123 allows it.
fn valid_dns_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// One egress rule's fields, as an EgressNetworkPolicy gives them.
#[derive(Clone, Copy, Debug)]
pub struct EgressRuleFields<'a> {
    pub kind: &'a str,
    pub cidr_selector: Option<&'a str>,
    pub dns_name: Option<&'a str>,
}

/// Checks one EgressNetworkPolicy.
pub fn egress_policy<'a>(namespace: &str, name_: &str, rules_in: impl ExactSizeIterator<Item = EgressRuleFields<'a>>) -> Result<egress::Policy, FieldError> {
    name("namespace", namespace)?;
    name("name", name_)?;
    if rules_in.len() > MAX_EGRESS_RULES {
        return Err(("egress".into(), format!("{} rules exceed the limit of {MAX_EGRESS_RULES}", rules_in.len())));
    }
    let mut rules = Vec::with_capacity(rules_in.len());
    for (i, rule) in rules_in.enumerate() {
        let kind = match rule.kind {
            "Allow" => RuleType::Allow,
            "Deny" => RuleType::Deny,
            other => return Err((format!("egress[{i}].type"), format!("{other:?} is neither Allow nor Deny"))),
        };
        let to = match (rule.cidr_selector, rule.dns_name) {
            (Some(c), None) => Target::Cidr(net(c).map_err(at(&format!("egress[{i}].to.cidrSelector")))?),
            (None, Some(d)) if valid_dns_name(d) => Target::DnsName(d.trim_end_matches('.').to_ascii_lowercase()),
            (None, Some(d)) => return Err((format!("egress[{i}].to.dnsName"), format!("{d:?} is not a valid DNS name"))),
            _ => return Err((format!("egress[{i}].to"), "exactly one of cidrSelector and dnsName is required".into())),
        };
        rules.push(egress::Rule { kind, to });
    }
    Ok(egress::Policy { namespace: namespace.to_string(), name: name_.to_string(), rules })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_mac_is_one_stations_in_canonical_hex() {
        let pod = |mac: &str| {
            validate_pod(RawPod {
                namespace: "a".into(),
                name: "p".into(),
                container_id: "ab".repeat(32),
                host_veth: "v".into(),
                ip: "10.128.2.5".into(),
                mac: mac.into(),
                ingress_bps: 0,
                egress_bps: 0,
                internal: true,
            })
        };
        assert!(pod("0a:58:0a:80:02:05").is_ok());
        for (mac, why) in [
            ("01:00:5e:00:00:01", "multicast"),
            ("ff:ff:ff:ff:ff:ff", "multicast/broadcast"),
            ("33:33:00:00:00:01", "multicast"),
            ("00:00:00:00:00:00", "all zero"),
            ("+a:58:0a:80:02:05", "hexadecimal octets"),
            ("0a:58:0a:80:02:-5", "hexadecimal octets"),
        ] {
            let p = pod(mac).unwrap_err();
            assert_eq!(p.field, "mac", "{mac}: {p}");
            assert!(p.message.contains(why), "{mac}: {p}");
        }
    }

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
