//! The rule book: every check an object of the cluster passes before it enters the model,
//! whatever its source (the state file, Kubernetes, the pod API, CNI, a stored record). Each
//! function takes an object's fields as the source has them and returns the model's object,
//! or the field that is wrong and why.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use openflow::MacAddr;
use serde::Deserialize;

use super::{Checked, ClusterState, Fatal, FieldError, HostSubnet, NetNamespace, Pod, Problem, Service};
use crate::domain::{ContainerId, Plugin, Vnid};
use crate::pipeline::egress::{self, RuleType, Target};
use crate::pipeline::service::{ServicePort, ServiceProto};

/// The most rules one EgressNetworkPolicy may have (as the OpenShift API limits it).
pub const MAX_EGRESS_RULES: usize = 10_000;

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
    /// The pod's address: its IPv4 one, or its IPv6 one in an IPv6-only cluster (Kubernetes'
    /// `podIP`).
    pub ip: String,
    /// Kubernetes' `podIPs` shape: the pod's addresses, one per family (listing `ip`); empty
    /// for a single-stack pod.
    #[serde(default)]
    pub ips: Vec<String>,
    pub mac: String,
    #[serde(default, rename = "ingressBPS")]
    pub ingress_bps: i64,
    #[serde(default, rename = "egressBPS")]
    pub egress_bps: i64,
    #[serde(default)]
    pub internal: bool,
}

/// The cluster-wide settings of a state, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub node: String,
    pub plugin: Plugin,
    pub cluster_network: Option<Ipv4Net>,
    pub service_network: Option<Ipv4Net>,
    pub cluster_network6: Option<Ipv6Net>,
    pub service_network6: Option<Ipv6Net>,
    pub vxlan_port: u16,
    pub mtu: u32,
}

/// Validates the cluster-wide settings (the state cannot be used without them).
/// `cluster_networks` and `service_networks` are one CIDR per family (IPv4, IPv6, or
/// dual-stack: an IPv4 and an IPv6 one, in either order), the same families in both.
pub fn header(
    node: String,
    plugin: Plugin,
    cluster_networks: &[&str],
    service_networks: &[&str],
    vxlan_port: u16,
    mtu: u32,
) -> Result<Header, Fatal> {
    let named = |one: &str, list: &[&str]| if list.len() > 1 { format!("{one}s") } else { one.to_string() };
    let (cluster_network, cluster_network6) = dual_nets(&named("clusterNetwork", cluster_networks), cluster_networks)
        .map_err(|(f, e)| Fatal(format!("field {f}: {e}")))?;
    let (service_network, service_network6) = dual_nets(&named("serviceNetwork", service_networks), service_networks)
        .map_err(|(f, e)| Fatal(format!("field {f}: {e}")))?;
    if cluster_network6.is_some() != service_network6.is_some() || cluster_network.is_some() != service_network.is_some() {
        let fam = |four: bool, six: bool| match (four, six) {
            (true, true) => "IPv4 and IPv6",
            (true, false) => "IPv4",
            _ => "IPv6",
        };
        return Err(Fatal(format!(
            "fields clusterNetworks, serviceNetworks: the cluster network is {} but the service network {}: both have the same families",
            fam(cluster_network.is_some(), cluster_network6.is_some()),
            fam(service_network.is_some(), service_network6.is_some()),
        )));
    }
    if node.is_empty() {
        return Err(Fatal("field node: must not be empty".into()));
    }
    if !(576..=9000).contains(&mtu) {
        return Err(Fatal(format!("field mtu: {mtu} is outside 576..=9000")));
    }
    if vxlan_port == 0 {
        return Err(Fatal("field vxlanPort: 0 is not a UDP port".into()));
    }
    Ok(Header { node, plugin, cluster_network, service_network, cluster_network6, service_network6, vxlan_port, mtu })
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
        cluster_network6: h.cluster_network6,
        service_network6: h.service_network6,
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
        audit: Default::default(),
    };
    let node = state.node.clone();
    let (state, more) = match state.validate() {
        Ok(v) => v,
        // This node's HostSubnet rejected on its own: say why (its field), not only the effect.
        Err(_) if state_has_no_local(&node, &problems) => return Err(super::no_local_subnet(&node, &problems)),
        Err(e) => return Err(e),
    };
    problems.extend(more);
    Ok((state, problems))
}

/// Whether the per-object checks rejected a HostSubnet of `node`.
fn state_has_no_local(node: &str, problems: &[Problem]) -> bool {
    let own = format!("hostsubnet {node}");
    problems.iter().any(|p| p.object == own)
}

fn net(s: &str) -> Result<Ipv4Net, String> {
    s.parse::<Ipv4Net>().map(|n| n.trunc()).map_err(|_| format!("{s:?} is not an IPv4 CIDR"))
}

/// Kubernetes' dual-stack shape (`podCIDRs`, `podIPs`, `clusterIPs`): at least one value and
/// at most one of each family, in either order: (IPv4, IPv6). `field` names the list.
fn dual<T: Copy>(field: &str, values: &[&str], parse: impl Fn(&str) -> Option<T>, v4: impl Fn(T) -> bool, what: &str) -> Result<(Option<T>, Option<T>), FieldError> {
    let mut four = None;
    let mut six = None;
    for (i, v) in values.iter().enumerate() {
        let at = || if values.len() == 1 { field.to_string() } else { format!("{field}[{i}]") };
        let t = parse(v).ok_or_else(|| (at(), format!("{v:?} is not an {what}")))?;
        let slot = if v4(t) { &mut four } else { &mut six };
        if slot.replace(t).is_some() {
            return Err((at(), format!("{v:?}: a second {} value; one per family", if v4(t) { "IPv4" } else { "IPv6" })));
        }
    }
    if four.is_none() && six.is_none() {
        return Err((field.to_string(), format!("must have an {what}")));
    }
    Ok((four, six))
}

/// [`dual`] for CIDRs: (IPv4, IPv6), at least one.
pub fn dual_nets(field: &str, values: &[&str]) -> Result<(Option<Ipv4Net>, Option<Ipv6Net>), FieldError> {
    let (a, b) = dual(field, values, |s| s.parse::<IpNet>().ok().map(|n| n.trunc()), |n| matches!(n, IpNet::V4(_)), "IPv4 or IPv6 CIDR")?;
    let a = a.and_then(|a| if let IpNet::V4(a) = a { Some(a) } else { None });
    Ok((a, b.and_then(|b| if let IpNet::V6(b) = b { Some(b) } else { None })))
}

/// [`dual`] for addresses: (IPv4, IPv6), at least one.
pub fn dual_addrs(field: &str, values: &[&str]) -> Result<(Option<Ipv4Addr>, Option<Ipv6Addr>), FieldError> {
    let (a, b) = dual(field, values, |s| s.parse::<IpAddr>().ok(), |a| a.is_ipv4(), "IPv4 or IPv6 address")?;
    let a = a.and_then(|a| if let IpAddr::V4(a) = a { Some(a) } else { None });
    Ok((a, b.and_then(|b| if let IpAddr::V6(b) = b { Some(b) } else { None })))
}

/// A singular field and its plural (Kubernetes: `podIP` and `podIPs`): the plural if given
/// (it must then contain the singular), else the singular alone.
pub fn singular_and_plural<'a>(field: &str, singular: Option<&'a str>, plural: &'a [String]) -> Result<Vec<&'a str>, FieldError> {
    if plural.is_empty() {
        return Ok(singular.into_iter().collect());
    }
    if let Some(one) = singular {
        let same = |p: &String| p.parse::<IpNet>().ok().map(|n| n.trunc()) == one.parse::<IpNet>().ok().map(|n| n.trunc())
            && p.parse::<IpAddr>().ok() == one.parse::<IpAddr>().ok();
        if !plural.iter().any(|p| p == one || same(p)) {
            return Err((field.to_string(), format!("does not list {one:?}, the singular field's value")));
        }
    }
    Ok(plural.iter().map(String::as_str).collect())
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

/// Checks one pod of another node (a NetworkPolicy peer).
pub fn remote_pod(
    namespace: String,
    name_: String,
    ips: &[&str],
    labels: super::netpol::Labels,
    container_ports: Vec<super::netpol::ContainerPort>,
) -> Result<super::netpol::RemotePod, FieldError> {
    name("namespace", &namespace)?;
    name("name", &name_)?;
    let (ip, ip6) = dual_addrs(if ips.len() > 1 { "ips" } else { "ip" }, ips)?;
    Ok(super::netpol::RemotePod { ip, ip6, namespace, name: name_, labels, container_ports })
}

/// Checks one HostSubnet. `subnets`: one per family (dual-stack). `fixed_vnid`: the
/// fixed-VNID value, or why it is not a number.
pub fn host_subnet(host: &str, host_ip: &str, subnets: &[&str], fixed_vnid: Option<Result<u64, String>>) -> Checked<HostSubnet> {
    name("host", host)?;
    let fixed_vnid = match fixed_vnid {
        None => None,
        Some(v) => Some(v.and_then(vnid).map_err(at("fixedVNID"))?),
    };
    let field = if subnets.len() > 1 { "subnets" } else { "subnet" };
    let (subnet, subnet6) = dual_nets(field, subnets)?;
    Ok((HostSubnet { host: host.to_string(), host_ip: host_ip.parse::<IpAddr>().map_err(|_| ("hostIP".to_string(), format!("{host_ip:?} is not an IPv4 or IPv6 address")))?, subnet, subnet6, fixed_vnid }, Vec::new()))
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
/// `cluster_ips`: one per family (Kubernetes' `clusterIPs`).
pub fn service<'a>(namespace: &str, name_: &str, cluster_ips: &[&str], ports_in: impl Iterator<Item = (&'a str, i64)>) -> Checked<Service> {
    name("namespace", namespace)?;
    name("name", name_)?;
    let field = if cluster_ips.len() > 1 { "clusterIPs" } else { "clusterIP" };
    let (cluster_ip, cluster_ip6) = dual_addrs(field, cluster_ips)?;
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
    Ok((Service { namespace: namespace.to_string(), name: name_.to_string(), cluster_ip, cluster_ip6, ports }, problems))
}

/// A pod whose addresses are already typed (a stored record's, a CNI ADD's): what [`RawPod`]
/// gives once its text is parsed.
#[derive(Clone, Debug)]
pub struct TypedPod {
    pub namespace: String,
    pub name: String,
    pub container_id: String,
    pub host_veth: String,
    pub ip: Option<Ipv4Addr>,
    pub ip6: Option<Ipv6Addr>,
    pub mac: MacAddr,
    pub ingress_bps: i64,
    pub egress_bps: i64,
    pub internal: bool,
}

/// Validates one pod as the state file and the pod API write it (text).
pub fn pod(r: RawPod) -> Result<Pod, Problem> {
    let obj = format!("pod {}/{}", r.namespace, r.name);
    raw_pod_fields(r).and_then(typed_pod_fields).map_err(|(f, m)| Problem::new(obj, f, m))
}

/// Validates one pod whose addresses are typed: the same rules as [`pod`] (the state file's,
/// the pod API's, CNI's and the stored records' single rule set), with no text to parse.
pub fn typed_pod(p: TypedPod) -> Result<Pod, Problem> {
    let obj = format!("pod {}/{}", p.namespace, p.name);
    typed_pod_fields(p).map_err(|(f, m)| Problem::new(obj, f, m))
}

/// The text fields parsed (after the plain fields, as they always were).
fn raw_pod_fields(r: RawPod) -> Result<TypedPod, FieldError> {
    plain_fields(&r.namespace, &r.name, &r.host_veth, r.ingress_bps, r.egress_bps)?;
    if !r.mac.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
        return Err(("mac".into(), format!("{:?} is not six hexadecimal octets separated by ':'", r.mac)));
    }
    // Lenient: the grammar state files have always been read with (1 or 2 hex digits per octet).
    let mac = MacAddr::parse_lenient(&r.mac).map_err(|e| ("mac".to_string(), e.to_string()))?;
    let (ip, ip6) = if r.ips.is_empty() {
        match r.ip.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => (Some(a), None),
            Ok(IpAddr::V6(a)) => (None, Some(a)),
            Err(_) => return Err(("ip".into(), format!("{:?} is not an IPv4 or IPv6 address", r.ip))),
        }
    } else {
        let ips = singular_and_plural("ips", Some(&r.ip), &r.ips)?;
        dual_addrs("ips", &ips)?
    };
    Ok(TypedPod {
        namespace: r.namespace,
        name: r.name,
        container_id: r.container_id,
        host_veth: r.host_veth,
        ip,
        ip6,
        mac,
        ingress_bps: r.ingress_bps,
        egress_bps: r.egress_bps,
        internal: r.internal,
    })
}

/// The fields that are neither text to parse nor addresses, checked first on both paths.
fn plain_fields(namespace: &str, name_: &str, host_veth: &str, ingress_bps: i64, egress_bps: i64) -> Result<(), FieldError> {
    name("namespace", namespace)?;
    name("name", name_)?;
    // As the API server validates them: a namespace is a DNS-1123 label, a pod name a
    // DNS-1123 subdomain.
    if !dns1123_label(namespace) {
        return Err(("namespace".into(), format!("{namespace:?} is not a DNS-1123 label (lower-case alphanumerics and '-', at most 63)")));
    }
    if !dns1123_subdomain(name_) {
        return Err(("name".into(), format!("{name_:?} is not a DNS-1123 subdomain (lower-case alphanumerics, '-' and '.', at most 253)")));
    }
    name("hostVeth", host_veth)?;
    // The workspace's one interface-name rule (IFNAMSIZ - 1 bytes, not "." or "..", printable
    // ASCII but '/' and ':'), which the plugin and hostnet apply too; empty is refused above.
    if netif::check_ifname(host_veth).is_err() {
        return Err(("hostVeth".into(), format!("{host_veth:?} is not a valid interface name (at most 15 characters, no '/' or space)")));
    }
    for (f, v) in [("ingressBPS", ingress_bps), ("egressBPS", egress_bps)] {
        if v < 0 {
            return Err((f.into(), format!("{v} is negative")));
        }
    }
    Ok(())
}

fn typed_pod_fields(p: TypedPod) -> Result<Pod, FieldError> {
    plain_fields(&p.namespace, &p.name, &p.host_veth, p.ingress_bps, p.egress_bps)?;
    // The pod's own address: the flows match it as a source and deliver to it, so it must be
    // one station's (a group address would take in every multicast; all-zero is no address).
    if p.mac.0[0] & 1 == 1 {
        return Err(("mac".into(), format!("{} is a multicast/broadcast address, not a pod's", p.mac)));
    }
    if p.mac.0 == [0; 6] {
        return Err(("mac".into(), format!("{} is all zero, not a pod's address", p.mac)));
    }
    Ok(Pod {
        container_id: ContainerId::parse(&p.container_id).map_err(at("containerID"))?,
        ip: p.ip,
        ip6: p.ip6,
        mac: p.mac,
        namespace: p.namespace,
        name: p.name,
        host_veth: p.host_veth,
        ingress_bps: p.ingress_bps,
        egress_bps: p.egress_bps,
        internal: p.internal,
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
            (Some(c), None) => match c.parse::<IpNet>() {
                Ok(IpNet::V6(n)) => Target::Cidr6(n.trunc()),
                _ => Target::Cidr(net(c).map_err(|_| (format!("egress[{i}].to.cidrSelector"), format!("{c:?} is not an IPv4 or IPv6 CIDR")))?),
            },
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
            pod(RawPod {
                namespace: "a".into(),
                name: "p".into(),
                container_id: "ab".repeat(32),
                host_veth: "v".into(),
                ip: "10.128.2.5".into(),
                ips: Vec::new(),
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

    /// The typed path (a stored record's) applies the same rules as the text path, and gives
    /// the same pod.
    #[test]
    fn a_typed_pod_passes_the_same_rules() {
        let typed = |f: &dyn Fn(&mut TypedPod)| {
            let mut p = TypedPod {
                namespace: "a".into(),
                name: "p".into(),
                container_id: "ab".repeat(32),
                host_veth: "v".into(),
                ip: Some(Ipv4Addr::new(10, 128, 2, 5)),
                ip6: None,
                mac: MacAddr([0x0a, 0x58, 0x0a, 0x80, 0x02, 0x05]),
                ingress_bps: 0,
                egress_bps: 0,
                internal: true,
            };
            f(&mut p);
            typed_pod(p)
        };
        let raw = pod(RawPod {
            ips: Vec::new(),
            namespace: "a".into(),
            name: "p".into(),
            container_id: "ab".repeat(32),
            host_veth: "v".into(),
            ip: "10.128.2.5".into(),
            mac: "0a:58:a:80:2:5".into(),
            ingress_bps: 0,
            egress_bps: 0,
            internal: true,
        });
        assert_eq!(typed(&|_| {}).unwrap(), raw.unwrap());
        assert_eq!(typed(&|p| p.namespace = "A".into()).unwrap_err().field, "namespace");
        assert_eq!(typed(&|p| p.name = String::new()).unwrap_err().field, "name");
        assert_eq!(typed(&|p| p.host_veth = "a/b".into()).unwrap_err().field, "hostVeth");
        assert_eq!(typed(&|p| p.egress_bps = -1).unwrap_err().field, "egressBPS");
        assert_eq!(typed(&|p| p.mac = MacAddr([1, 0, 0x5e, 0, 0, 1])).unwrap_err().field, "mac");
        assert_eq!(typed(&|p| p.container_id = "ab".into()).unwrap_err().field, "containerID");
    }
}
