//! The cluster state a node programs its switch from, whatever its source (the standalone state
//! file, or Kubernetes): validated objects, and the problems found in the others.

pub mod desired;
pub mod netpol;
pub mod quantity;
pub mod state_file;
pub mod validate;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use openflow::MacAddr;

use crate::domain::{ContainerId, Plugin, Vnid};
use crate::pipeline::egress;
use crate::pipeline::service::ServicePort;

/// One rejected object (or part of one): which object, which field, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// e.g. `pod team-a/a1`, `service team-a/web`, `hostsubnet node-b`.
    pub object: String,
    /// e.g. `containerID`, `ports[1].protocol`.
    pub field: String,
    pub message: String,
}

impl Problem {
    pub fn new(object: impl Into<String>, field: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem { object: object.into(), field: field.into(), message: message.into() }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.object, self.message)
        } else {
            write!(f, "{}: field {}: {}", self.object, self.field, self.message)
        }
    }
}

/// A state as a source (the state file, Kubernetes) publishes it, with the objects it
/// rejected.
#[derive(Debug)]
pub struct Loaded {
    pub state: ClusterState,
    pub problems: Vec<Problem>,
    /// The pods that exist on this node according to the source (Kubernetes), once it has
    /// listed them: pods set up through the pod API that are not in it are torn down. `None`
    /// for sources that do not know (the state file).
    pub live_pods: Option<std::collections::BTreeSet<PodKey>>,
    /// A hint for the reconciler: `None` = anything may have changed since the previously
    /// published state (a first list, a relist, a ClusterNetwork or NetNamespace change, or a
    /// source that does not know, like the state file); `Some(owners)` = only these owners'
    /// flows can differ from the previously published state's.
    pub touched: Option<Vec<crate::store::Owner>>,
    /// The publisher's sequence number (1, 2, ...; 0 = unnumbered). `touched` is relative to
    /// the state numbered one less: a consumer that skipped a state (the channel keeps only the
    /// latest) must recompute everything.
    pub seq: u64,
    /// This node's pods' bandwidth annotations (Kubernetes), applied when a pod is set up
    /// through CNI; the state file gives none.
    pub pod_annotations: std::collections::BTreeMap<PodKey, std::collections::BTreeMap<String, String>>,
    /// Each NetworkPolicy of the state (namespace, name) with the generation the source has of
    /// it and when the source first saw that generation: the agent measures how long each
    /// policy change takes to reach the switch from here (`sdn_node_policy_realization_seconds`).
    pub policies_seen: PoliciesSeen,
}

/// When a source first saw a NetworkPolicy's current generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicySeen {
    /// `metadata.generation` (Kubernetes), or the state file source's own count of the
    /// policy's changes.
    pub generation: i64,
    /// The source event: the watch event's arrival, or the state file change's detection.
    pub at: std::time::Instant,
}

/// A NetworkPolicy's (namespace, name).
pub type PolicyKey = (String, String);

/// The policies of a state, see [`Loaded::policies_seen`].
pub type PoliciesSeen = BTreeMap<PolicyKey, PolicySeen>;

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

/// The annotations that give a pod's bandwidth (as openshift-sdn's SetPodBandwidth).
pub const INGRESS_ANNOTATION: &str = "kubernetes.io/ingress-bandwidth";
pub const EGRESS_ANNOTATION: &str = "kubernetes.io/egress-bandwidth";


#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSubnet {
    pub host: String,
    /// The node's underlay address, VXLAN's tunnel endpoint: IPv4, or IPv6 for a node whose
    /// underlay is IPv6 only (its pods keep their overlay addresses, of either family).
    pub host_ip: IpAddr,
    /// The node's IPv4 pod subnet (`None` only in an IPv6-only cluster).
    pub subnet: Option<Ipv4Net>,
    /// The node's IPv6 pod subnet (dual-stack: Kubernetes' second Node.spec.podCIDRs entry;
    /// IPv6-only: its only one).
    pub subnet6: Option<Ipv6Net>,
    pub fixed_vnid: Option<Vnid>,
}

impl HostSubnet {
    /// The node's tun0 address of the family its pods' MACs derive from (IPv4 if it has an
    /// IPv4 subnet, else IPv6): what tun0's MAC is made of.
    pub fn primary_gateway(&self) -> Option<IpAddr> {
        crate::pipeline::primary_gateway(self.subnet, self.subnet6)
    }

    /// tun0's MAC (`0a:58:` and the gateway's address, as a pod's).
    pub fn tun0_mac(&self) -> Option<MacAddr> {
        self.primary_gateway().map(crate::domain::pod_mac)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetNamespace {
    pub name: String,
    pub vnid: Vnid,
    pub multicast: bool,
    /// The namespace's labels, for NetworkPolicy namespace selectors (optional).
    pub labels: netpol::Labels,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    /// Its IPv4 cluster IP (`None`: an IPv6 single-stack Service).
    pub cluster_ip: Option<Ipv4Addr>,
    /// Its IPv6 cluster IP (Kubernetes: `clusterIPs`); a Service has at least one of the two.
    pub cluster_ip6: Option<Ipv6Addr>,
    pub ports: Vec<ServicePort>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub container_id: ContainerId,
    /// The host side of the pod's veth (an existing device), or the name of an OVS internal
    /// port to create when `internal` is set.
    pub host_veth: String,
    /// The pod's IPv4 address, from the node's IPv4 subnet (`None` only on an IPv6-only node).
    pub ip: Option<Ipv4Addr>,
    /// The pod's IPv6 address (dual-stack, IPv6-only), from the node's IPv6 subnet.
    pub ip6: Option<Ipv6Addr>,
    pub mac: MacAddr,
    pub ingress_bps: i64,
    pub egress_bps: i64,
    pub internal: bool,
    /// The pod's labels, for NetworkPolicy pod selectors (optional).
    pub labels: netpol::Labels,
    /// The pod's container ports, which named NetworkPolicy ports resolve against (optional).
    pub container_ports: Vec<netpol::ContainerPort>,
}

impl Pod {
    pub fn key(&self) -> PodKey {
        (self.namespace.clone(), self.name.clone())
    }

    /// Its addresses, one per family it has.
    pub fn ips(&self) -> crate::domain::PodIps {
        crate::domain::PodIps { v4: self.ip, v6: self.ip6 }
    }
}

/// (namespace, name).
pub type PodKey = (String, String);

/// Everything a node needs, already validated object by object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterState {
    pub node: String,
    pub plugin: Plugin,
    /// The IPv4 cluster network (`None`: an IPv6-only cluster).
    pub cluster_network: Option<Ipv4Net>,
    /// The IPv4 service network, present exactly when the IPv4 cluster network is.
    pub service_network: Option<Ipv4Net>,
    /// The IPv6 cluster network of a dual-stack or IPv6-only cluster (`None`: IPv4 only).
    pub cluster_network6: Option<Ipv6Net>,
    /// The IPv6 service network, present exactly when the IPv6 cluster network is.
    pub service_network6: Option<Ipv6Net>,
    /// The UDP port of VXLAN between nodes (ClusterNetwork.vxlanPort; 4789 by default).
    pub vxlan_port: u16,
    /// The pods' and tun0's MTU (the underlay's minus VXLAN's 50 bytes; 1450 by default).
    pub mtu: u32,
    pub host_subnets: Vec<HostSubnet>,
    pub net_namespaces: Vec<NetNamespace>,
    pub services: Vec<Service>,
    pub pods: Vec<Pod>,
    pub egress_policies: Vec<egress::Policy>,
    /// Pods on other nodes, known only as NetworkPolicy peers (networkpolicy plugin).
    pub remote_pods: Vec<netpol::RemotePod>,
    /// Kubernetes NetworkPolicies (networkpolicy plugin; ignored by the others).
    pub network_policies: Vec<netpol::NetworkPolicy>,
    /// Labels and containerPorts of this node's pods as the source knows them (Kubernetes:
    /// the Pod objects), by pod: pods set up through the pod API carry none, so these take
    /// precedence over a pod's own for NetworkPolicy selection. Empty for the state file.
    pub pod_meta: BTreeMap<PodKey, netpol::PodMeta>,
    /// The node's audit log settings (the agent's flags, not the source's): off unless the
    /// agent writes an audit log.
    pub audit: netpol::NodeAudit,
}

/// `true` (keep the object) when `err` is `None`; otherwise records the problem of `object`'s
/// field and drops it. The shared tail of the per-kind checks in [`ClusterState::validate`].
fn keep_or_reject(problems: &mut Vec<Problem>, object: String, err: Option<(&str, String)>) -> bool {
    match err {
        Some((field, message)) => {
            problems.push(Problem::new(object, field, message));
            false
        }
        None => true,
    }
}

/// The fatal error of a state without a valid HostSubnet for `node`, with the problems that
/// rejected this node's HostSubnets (so the operator sees the field, not only the effect).
pub(crate) fn no_local_subnet(node: &str, problems: &[Problem]) -> Fatal {
    let own = format!("hostsubnet {node}");
    let why: Vec<String> = problems.iter().filter(|p| p.object == own).map(ToString::to_string).collect();
    let mut m = format!("no valid HostSubnet for this node {node:?}: the local subnet is unknown");
    if why.is_empty() {
        m.push_str(" (no hostSubnets entry has this host)");
    } else {
        m.push_str(": ");
        m.push_str(&why.join("; "));
    }
    Fatal(m)
}

/// The state cannot be used at all (no local subnet, bad cluster network).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Fatal(pub String);

/// Why `ip` cannot be a local pod's IPv4 address: not a host address of the node's IPv4
/// subnet, the gateway's, or taken.
fn pod_ip4_problem(ip: Ipv4Addr, subnet: Option<Ipv4Net>, taken: &dyn Fn(IpAddr) -> Option<String>) -> Option<String> {
    let Some(subnet) = subnet else {
        return Some(format!("{ip}: this node has no IPv4 subnet (an IPv6-only node)"));
    };
    if !subnet.contains(&ip) || ip == subnet.network() || ip == subnet.broadcast() {
        return Some(format!("{ip} is not a host address of this node's subnet {subnet}"));
    }
    if ip == crate::pipeline::gateway(subnet) {
        return Some(format!("{ip} is the node's gateway address"));
    }
    taken(IpAddr::V4(ip)).map(|other| format!("{ip} is already used by {other}"))
}

/// Why `ip6` cannot be a local pod's IPv6 address: not a host address of the node's IPv6
/// subnet (its first address is the network's, the second the gateway's), or taken.
fn pod_ip6_problem(ip6: Ipv6Addr, subnet6: Option<Ipv6Net>, taken: &dyn Fn(IpAddr) -> Option<String>) -> Option<String> {
    let Some(subnet6) = subnet6 else {
        return Some(format!("{ip6}: this node has no IPv6 subnet"));
    };
    if !subnet6.contains(&ip6) || ip6 == subnet6.network() {
        return Some(format!("{ip6} is not a host address of this node's IPv6 subnet {subnet6}"));
    }
    if ip6 == crate::pipeline::gateway6(subnet6) {
        return Some(format!("{ip6} is the node's IPv6 gateway address"));
    }
    taken(IpAddr::V6(ip6)).map(|other| format!("{ip6} is already used by {other}"))
}

/// A local pod's addresses against its node's subnets: one of each family the node has
/// (dual-stack: IPv6 may be missing, as a pod made before the cluster became dual-stack),
/// none of a family it lacks. `taken`: who else holds an address, if anyone. (field, message)
/// of the first wrong one.
fn pod_ips_problem(p: &Pod, local: &HostSubnet, taken: &dyn Fn(IpAddr) -> Option<String>) -> Option<(&'static str, String)> {
    match (p.ip, local.subnet) {
        (Some(ip), subnet) => {
            if let Some(e) = pod_ip4_problem(ip, subnet, taken) {
                return Some(("ip", e));
            }
        }
        (None, Some(subnet)) => return Some(("ip", format!("missing: this node's pods have an IPv4 address (its subnet is {subnet})"))),
        (None, None) if p.ip6.is_none() => return Some(("ips", "the pod has no address".into())),
        (None, None) => {}
    }
    p.ip6.and_then(|ip6| pod_ip6_problem(ip6, local.subnet6, taken)).map(|e| ("ips", e))
}

impl ClusterState {
    /// Whether the cluster is IPv6 only: no IPv4 cluster network (validated states have one of
    /// the two families at least).
    pub fn ipv6_only(&self) -> bool {
        self.cluster_network.is_none()
    }

    /// The IPv6 side of the HostSubnets: inside the IPv6 cluster network and pairwise
    /// disjoint. A HostSubnet whose IPv6 subnet is wrong loses its IPv6 subnet, with a
    /// problem: on a dual-stack node it still has IPv4 (the HostSubnet is not dropped whole,
    /// which would cut the node's IPv4 pods off for an IPv6 mistake); in an IPv6-only cluster
    /// it is its only subnet, and the HostSubnet is dropped.
    fn check_subnets6(&mut self, problems: &mut Vec<Problem>) {
        let cluster6 = self.cluster_network6;
        let ipv6_only = self.ipv6_only();
        let mut accepted: BTreeMap<u128, (Ipv6Net, String)> = BTreeMap::new();
        self.host_subnets.retain_mut(|h| {
            let obj = format!("hostsubnet {}", h.host);
            let Some(s6) = h.subnet6 else {
                if ipv6_only {
                    problems.push(Problem::new(obj, "subnet", "missing: the cluster is IPv6-only, a node's subnet is IPv6"));
                    return false;
                }
                return true;
            };
            let (start, end) = (u128::from(s6.network()), u128::from(s6.broadcast()));
            let err = match cluster6 {
                None => Some(format!("{s6}: the cluster has no IPv6 cluster network")),
                Some(c) if !c.contains(&s6) => Some(format!("{s6} is outside the cluster network {c}")),
                Some(_) => {
                    let before = accepted.range(..start).next_back().filter(|(_, (o, _))| u128::from(o.broadcast()) >= start);
                    before.into_iter().chain(accepted.range(start..=end)).next().map(|(_, (o, host))| format!("{s6} overlaps {o} of node {host}"))
                }
            };
            match err {
                Some(m) => {
                    problems.push(Problem::new(obj, if ipv6_only { "subnet" } else { "subnets" }, m));
                    h.subnet6 = None;
                    !ipv6_only
                }
                None => {
                    accepted.insert(start, (s6, h.host.clone()));
                    true
                }
            }
        });
    }

    /// A local pod's labels: the source's ([`ClusterState::pod_meta`]) if it has them, else
    /// the pod's own.
    pub fn pod_labels<'a>(&'a self, pod: &'a Pod) -> &'a netpol::Labels {
        self.pod_meta.get(&pod.key()).map_or(&pod.labels, |m| &m.labels)
    }

    /// A local pod's containerPorts, as [`ClusterState::pod_labels`].
    pub fn pod_container_ports<'a>(&'a self, pod: &'a Pod) -> &'a [netpol::ContainerPort] {
        self.pod_meta.get(&pod.key()).map_or(&pod.container_ports, |m| &m.container_ports)
    }

    /// This node's IPv4 side (the cluster's IPv4 cluster and service networks and its own
    /// IPv4 subnet), absent on an IPv6-only node: with [`ClusterState::node_ipv6`], the one
    /// place the pipeline, the host plan and the egress policy learn which families to have.
    pub fn node_ipv4(&self) -> Option<crate::pipeline::NodeIpv4> {
        Some(crate::pipeline::NodeIpv4 {
            cluster_network: self.cluster_network?,
            service_network: self.service_network?,
            local_subnet: self.local_subnet()?.subnet?,
        })
    }

    /// This node's IPv6 side, when it is dual-stack or IPv6-only (the cluster's IPv6 cluster
    /// and service networks and its own IPv6 subnet).
    pub fn node_ipv6(&self) -> Option<crate::pipeline::NodeIpv6> {
        Some(crate::pipeline::NodeIpv6 {
            cluster_network: self.cluster_network6?,
            service_network: self.service_network6?,
            local_subnet: self.local_subnet()?.subnet6?,
        })
    }

    /// This node's HostSubnet.
    pub fn local_subnet(&self) -> Option<&HostSubnet> {
        self.host_subnets.iter().find(|h| h.host == self.node)
    }

    /// The VNID traffic of `namespace` carries: its netid in multitenant mode, 0 in subnet mode.
    pub fn vnid_of(&self, namespace: &str) -> Option<Vnid> {
        if self.plugin.uses_netids() {
            self.net_namespaces.iter().find(|n| n.name == namespace).map(|n| n.vnid)
        } else {
            Some(Vnid::GLOBAL)
        }
    }

    /// The cluster's networks, family by family: IPv4 or IPv6 or both, each with its service
    /// network.
    fn check_networks(&self) -> Result<(), Fatal> {
        match (self.cluster_network, self.service_network) {
            (Some(_), None) => return Err(Fatal("clusterNetworks has an IPv4 network but serviceNetworks has none: each family has both".into())),
            (None, Some(_)) => return Err(Fatal("serviceNetworks has an IPv4 network but clusterNetworks has none: each family has both".into())),
            _ => {}
        }
        match (self.cluster_network6, self.service_network6) {
            (None, Some(_)) => Err(Fatal("serviceNetworks has an IPv6 network but clusterNetworks has none: a dual-stack cluster has both".into())),
            (Some(_), None) => Err(Fatal("clusterNetworks has an IPv6 network but serviceNetworks has none: each family has both".into())),
            (None, None) if self.cluster_network.is_none() => Err(Fatal("clusterNetworks is empty: a cluster has an IPv4 network, an IPv6 one, or both".into())),
            _ => Ok(()),
        }
    }

    /// Cross-object checks: drops every object that conflicts with the cluster or with an
    /// earlier object, and says why. Fails only if the node itself cannot be set up.
    pub fn validate(mut self) -> Result<(ClusterState, Vec<Problem>), Fatal> {
        let mut problems = Vec::new();
        self.check_networks()?;
        let cluster = self.cluster_network;
        let cluster6 = self.cluster_network6;

        let mut hosts = BTreeSet::new();
        // Accepted subnets (pairwise disjoint) by first address, with their acceptance order:
        // an overlap is found in O(log n) and reported against the earliest accepted subnet.
        let mut subnets: BTreeMap<u32, (Ipv4Net, usize)> = BTreeMap::new();
        self.host_subnets.retain(|h| {
            let obj = format!("hostsubnet {}", h.host);
            let err = if !hosts.insert(h.host.clone()) {
                Some(("host", "duplicate HostSubnet for this host".to_string()))
            } else {
                match (cluster, h.subnet) {
                    (None, None) => None,
                    (None, Some(s)) => Some(("subnet", format!("{s}: the cluster has no IPv4 cluster network (IPv6-only)"))),
                    (Some(c), None) => Some(("subnet", format!("missing: the cluster network is {c}, a node's subnet is IPv4"))),
                    (Some(c), Some(s)) if !c.contains(&s) => Some(("subnet", format!("{s} is outside the cluster network {c}"))),
                    (Some(_), Some(s)) => {
                        let (start, end) = (u32::from(s.network()), u32::from(s.broadcast()));
                        let before = subnets.range(..start).next_back().filter(|(_, (o, _))| u32::from(o.broadcast()) >= start);
                        before
                            .into_iter()
                            .chain(subnets.range(start..=end))
                            .min_by_key(|(_, (_, i))| *i)
                            .map(|(_, (o, _))| ("subnet", format!("{s} overlaps {o} of another node")))
                    }
                }
            };
            match err {
                Some((field, m)) => {
                    problems.push(Problem::new(obj, field, m));
                    false
                }
                None => {
                    if let Some(s) = h.subnet {
                        let n = subnets.len();
                        subnets.insert(u32::from(s.network()), (s, n));
                    }
                    true
                }
            }
        });
        self.check_subnets6(&mut problems);
        let Some(local) = self.local_subnet().cloned() else {
            return Err(no_local_subnet(&self.node, &problems));
        };

        let mut names = BTreeSet::new();
        self.net_namespaces.retain(|n| {
            if names.insert(n.name.clone()) {
                true
            } else {
                problems.push(Problem::new(format!("netnamespace {}", n.name), "name", "duplicate NetNamespace"));
                false
            }
        });
        let known = |ns: &str, names: &BTreeSet<String>| names.contains(ns);

        let mut cluster_ips: HashMap<IpAddr, String> = HashMap::new();
        let service_net = self.service_network;
        let service_net6 = self.service_network6;
        self.services.retain(|s| {
            let obj = format!("service {}/{}", s.namespace, s.name);
            let v4 = s.cluster_ip.and_then(|ip| match service_net {
                None => Some(("clusterIP", format!("{ip}: the cluster has no IPv4 service network (IPv6-only)"))),
                Some(n) if !n.contains(&ip) => Some(("clusterIP", format!("{ip} is outside the service network {n}"))),
                Some(_) => cluster_ips.get(&IpAddr::V4(ip)).map(|other| ("clusterIP", format!("{ip} is already used by {other}"))),
            });
            let v6 = || {
                s.cluster_ip6.and_then(|ip6| match service_net6 {
                    None => Some(("clusterIPs", format!("{ip6}: the cluster has no IPv6 service network"))),
                    Some(n) if !n.contains(&ip6) => Some(("clusterIPs", format!("{ip6} is outside the service network {n}"))),
                    Some(_) => cluster_ips.get(&IpAddr::V6(ip6)).map(|other| ("clusterIPs", format!("{ip6} is already used by {other}"))),
                })
            };
            let err = if !known(&s.namespace, &names) {
                Some(("namespace", format!("unknown namespace {:?} (no NetNamespace)", s.namespace)))
            } else if s.cluster_ip.is_none() && s.cluster_ip6.is_none() {
                Some(("clusterIP", "missing: the Service has no cluster IP".to_string()))
            } else {
                v4.or_else(v6)
            };
            match err {
                Some((f, m)) => {
                    problems.push(Problem::new(obj, f, m));
                    false
                }
                None => {
                    for ip in s.cluster_ip.map(IpAddr::V4).into_iter().chain(s.cluster_ip6.map(IpAddr::V6)) {
                        cluster_ips.insert(ip, obj.clone());
                    }
                    true
                }
            }
        });

        let mut ips: HashMap<IpAddr, String> = HashMap::new();
        let mut pod_names = BTreeSet::new();
        let mut veths: HashMap<String, String> = HashMap::new();
        self.pods.retain(|p| {
            let obj = format!("pod {}/{}", p.namespace, p.name);
            let err = if !pod_names.insert(p.key()) {
                Some(("name", "duplicate pod".to_string()))
            } else if !known(&p.namespace, &names) {
                Some(("namespace", format!("unknown namespace {:?} (no NetNamespace)", p.namespace)))
            } else if let Some(e) = pod_ips_problem(p, &local, &|ip| ips.get(&ip).cloned()) {
                Some(e)
            } else {
                veths.get(&p.host_veth).map(|other| ("hostVeth", format!("{:?} is already used by {other}", p.host_veth)))
            };
            match err {
                Some((f, m)) => {
                    problems.push(Problem::new(obj, f, m));
                    false
                }
                None => {
                    for ip in p.ips().iter() {
                        ips.insert(ip, obj.clone());
                    }
                    veths.insert(p.host_veth.clone(), obj);
                    true
                }
            }
        });

        let mut policy_names = BTreeSet::new();
        self.egress_policies.retain(|p| {
            let obj = format!("egressnetworkpolicy {}/{}", p.namespace, p.name);
            let err = if !policy_names.insert((p.namespace.clone(), p.name.clone())) {
                Some(("name", "duplicate EgressNetworkPolicy".to_string()))
            } else if !known(&p.namespace, &names) {
                Some(("namespace", format!("unknown namespace {:?} (no NetNamespace)", p.namespace)))
            } else {
                None
            };
            keep_or_reject(&mut problems, obj, err)
        });
        let mut remote_names = BTreeSet::new();
        self.remote_pods.retain(|p| {
            let obj = format!("remotepod {}/{}", p.namespace, p.name);
            let err = if !remote_names.insert((p.namespace.clone(), p.name.clone())) || pod_names.contains(&(p.namespace.clone(), p.name.clone())) {
                Some(("name", "duplicate pod".to_string()))
            } else if !known(&p.namespace, &names) {
                Some(("namespace", format!("unknown namespace {:?} (no NetNamespace)", p.namespace)))
            } else if p.ip.is_none() && p.ip6.is_none() {
                Some(("ip", "the pod has no address".to_string()))
            } else {
                let v4 = p.ip.and_then(|ip| match cluster {
                    Some(c) if c.contains(&ip) && !local.subnet.is_some_and(|l| l.contains(&ip)) => {
                        ips.get(&IpAddr::V4(ip)).map(|other| ("ip", format!("{ip} is already used by {other}")))
                    }
                    Some(c) => Some(("ip", format!("{ip} is not in the cluster network {c} outside this node's subnet"))),
                    None => Some(("ip", format!("{ip}: the cluster has no IPv4 cluster network (IPv6-only)"))),
                });
                v4.or_else(|| {
                    p.ip6.and_then(|ip6| match cluster6 {
                        Some(c) if c.contains(&ip6) && !local.subnet6.is_some_and(|l| l.contains(&ip6)) => {
                            ips.get(&IpAddr::V6(ip6)).map(|other| ("ips", format!("{ip6} is already used by {other}")))
                        }
                        Some(c) => Some(("ips", format!("{ip6} is not in the cluster network {c} outside this node's subnet"))),
                        None => Some(("ips", format!("{ip6}: the cluster has no IPv6 cluster network"))),
                    })
                })
            };
            match err {
                Some((f, m)) => {
                    problems.push(Problem::new(obj, f, m));
                    false
                }
                None => {
                    for ip in p.ip.map(IpAddr::V4).into_iter().chain(p.ip6.map(IpAddr::V6)) {
                        ips.insert(ip, obj.clone());
                    }
                    true
                }
            }
        });

        let mut np_names = BTreeSet::new();
        self.network_policies.retain(|p| {
            let obj = format!("networkpolicy {}/{}", p.namespace, p.name);
            let err = if !np_names.insert((p.namespace.clone(), p.name.clone())) {
                Some(("metadata.name", "duplicate NetworkPolicy".to_string()))
            } else if !known(&p.namespace, &names) {
                Some(("metadata.namespace", format!("unknown namespace {:?} (no NetNamespace)", p.namespace)))
            } else {
                None
            };
            keep_or_reject(&mut problems, obj, err)
        });
        Ok((self, problems))
    }

    /// Checks one local pod against this (validated) state the way [`ClusterState::validate`]
    /// does: known namespace, a host address of the local subnet other than the gateway, an IP
    /// and a host veth no other pod uses (a pod with the same key is being replaced, not a
    /// conflict).
    pub fn check_pod(&self, p: &Pod) -> Result<(), Problem> {
        let obj = format!("pod {}/{}", p.namespace, p.name);
        let Some(local) = self.local_subnet() else {
            return Err(Problem::new(obj, "", "the node has no local subnet"));
        };
        if !self.net_namespaces.iter().any(|n| n.name == p.namespace) {
            return Err(Problem::new(obj, "namespace", format!("unknown namespace {:?} (no NetNamespace)", p.namespace)));
        }
        // Who else holds an address: a scan, named only on a conflict (this runs on every pod
        // setup: no per-call map of every pod).
        let others = |ip: IpAddr| {
            self.pods
                .iter()
                .find(|o| o.key() != p.key() && o.ips().iter().any(|a| a == ip))
                .map(|o| format!("pod {}/{}", o.namespace, o.name))
        };
        if let Some((field, e)) = pod_ips_problem(p, local, &others) {
            return Err(Problem::new(obj, field, e));
        }
        if Some(p.mac) == local.tun0_mac() {
            return Err(Problem::new(obj, "mac", format!("{} is the node gateway's (tun0) MAC address", p.mac)));
        }
        for o in self.pods.iter().filter(|o| o.key() != p.key()) {
            if o.mac == p.mac {
                return Err(Problem::new(obj, "mac", format!("{} is already used by pod {}/{}", p.mac, o.namespace, o.name)));
            }
            if o.host_veth == p.host_veth {
                return Err(Problem::new(obj, "hostVeth", format!("{:?} is already used by pod {}/{}", p.host_veth, o.namespace, o.name)));
            }
        }
        Ok(())
    }

    /// Namespaces by VNID.
    pub fn namespaces_by_vnid(&self) -> BTreeMap<Vnid, Vec<&NetNamespace>> {
        let mut m: BTreeMap<Vnid, Vec<&NetNamespace>> = BTreeMap::new();
        for n in &self.net_namespaces {
            m.entry(n.vnid).or_default().push(n);
        }
        m
    }
}
