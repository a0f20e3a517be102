//! Kubernetes objects to the model, one object at a time, through the state file's validators
//! (one rule set: a bad object is a problem naming the object and the field, as in a state
//! file), and [`Objects`]: the converted objects by kind, which the watchers update one event at
//! a time and from which each published state is assembled.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Pod as KubePod, Service as KubeService};
use k8s_openapi::api::networking::v1::NetworkPolicy as KubeNetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::types::{
    Kind,
    annotations, ClusterNetwork, EgressNetworkPolicy, HostSubnet as KubeHostSubnet, NetNamespace as KubeNetNamespace,
    CLUSTER_NETWORK_IPV6_ANNOTATION, FIXED_VNID_ANNOTATION, MULTICAST_ANNOTATION, SERVICE_NETWORK_IPV6_ANNOTATION,
    SUBNET_IPV6_ANNOTATION,
};
use crate::cluster::validate::{self, EgressRuleFields};
use crate::cluster::{name_problems, Checked};
use crate::cluster::netpol::{self, ContainerPort, Labels, NetworkPolicy, PodMeta, RemotePod};
use crate::cluster::{ClusterState, HostSubnet, NetNamespace, PodKey, Problem, Service};
use crate::domain::Plugin;
use crate::pipeline::egress::Policy;
use crate::cluster::Loaded;
use crate::store::Owner;

/// The openshift-sdn plugin names.
pub fn plugin(name: &str) -> Option<Plugin> {
    match name {
        "redhat/openshift-ovs-subnet" => Some(Plugin::Subnet),
        "redhat/openshift-ovs-multitenant" => Some(Plugin::Multitenant),
        "redhat/openshift-ovs-networkpolicy" => Some(Plugin::NetworkPolicy),
        _ => None,
    }
}

/// What the node uses of ClusterNetwork "default" (the networks are checked when the state is
/// assembled, as a state file's are).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkConfig {
    pub plugin: Plugin,
    pub cluster_network: String,
    pub service_network: String,
    /// Dual-stack: the IPv6 cluster and service networks (annotations
    /// [`CLUSTER_NETWORK_IPV6_ANNOTATION`] and [`SERVICE_NETWORK_IPV6_ANNOTATION`]: see
    /// [`super::types`] for why not `clusterNetworks`); both or neither.
    pub cluster_network6: Option<Ipv6Net>,
    pub service_network6: Option<Ipv6Net>,
    /// VXLAN's UDP port (4789 unless set).
    pub vxlan_port: u16,
    /// The pod network's MTU (1450 unless set).
    pub mtu: u32,
}

/// ClusterNetwork "default"; an error means no state can be built from it.
pub fn cluster_network(cn: &ClusterNetwork) -> Result<NetworkConfig, String> {
    let plugin_name = cn.plugin_name.as_deref().unwrap_or("");
    let Some(plugin) = plugin(plugin_name) else {
        return Err(format!(
            "ClusterNetwork \"default\": pluginName {plugin_name:?} is not handled (only redhat/openshift-ovs-subnet, redhat/openshift-ovs-multitenant and redhat/openshift-ovs-networkpolicy)"
        ));
    };
    let cluster_network = match cn.cluster_networks.first() {
        Some(c) => c.cidr.clone(),
        None => cn.network.clone().ok_or("ClusterNetwork \"default\": neither clusterNetworks nor network is set")?,
    };
    let service_network = cn.service_network.clone().ok_or("ClusterNetwork \"default\": serviceNetwork is not set")?;
    let vxlan_port = match cn.vxlan_port {
        None => 4789,
        Some(p) => u16::try_from(p).ok().filter(|p| *p != 0).ok_or_else(|| format!("ClusterNetwork \"default\": vxlanPort {p} is not a UDP port"))?,
    };
    let mtu = match cn.mtu {
        None => 1450,
        Some(m) => u32::try_from(m).map_err(|_| format!("ClusterNetwork \"default\": mtu {m} is out of range"))?,
    };
    let ann = annotations(&cn.metadata);
    let net6 = |key: &str| -> Result<Option<Ipv6Net>, String> {
        let Some(v) = ann.get(key).filter(|v| !v.trim().is_empty()) else { return Ok(None) };
        v.trim().parse::<Ipv6Net>().map(|n| Some(n.trunc())).map_err(|_| {
            format!("ClusterNetwork \"default\": field metadata.annotations[{key}]: {v:?} is not an IPv6 CIDR")
        })
    };
    let cluster_network6 = net6(CLUSTER_NETWORK_IPV6_ANNOTATION)?;
    let service_network6 = net6(SERVICE_NETWORK_IPV6_ANNOTATION)?;
    if cluster_network6.is_some() != service_network6.is_some() {
        return Err(format!(
            "ClusterNetwork \"default\": fields metadata.annotations[{CLUSTER_NETWORK_IPV6_ANNOTATION}], metadata.annotations[{SERVICE_NETWORK_IPV6_ANNOTATION}]: a dual-stack cluster has an IPv6 cluster network and an IPv6 service network, or neither"
        ));
    }
    Ok(NetworkConfig { plugin, cluster_network, service_network, cluster_network6, service_network6, vxlan_port, mtu })
}

/// One object converted to the model: the model object (`None` if rejected), the problems
/// naming it, and the key the state lists it by (with its identity).
#[derive(Clone, Debug, PartialEq)]
pub struct Converted<T> {
    pub sort: String,
    pub value: Option<T>,
    pub problems: Vec<Problem>,
}

fn converted<T>(sort: String, object: &str, checked: Checked<T>) -> Converted<T> {
    let (value, problems) = name_problems(object, checked);
    Converted { sort, value, problems }
}

fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// An object's identity: (namespace, name); the namespace is empty for cluster-scoped kinds.
pub type Id = (String, String);

pub fn id_of(meta: &ObjectMeta) -> Id {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

pub fn host_subnet(h: &KubeHostSubnet) -> Converted<HostSubnet> {
    let host = if h.host.is_empty() { name_of(&h.metadata) } else { &h.host };
    let fixed = annotations(&h.metadata)
        .get(FIXED_VNID_ANNOTATION)
        .map(|v| v.trim().parse::<u64>().map_err(|_| format!("invalid type: string {v:?}, expected u64")));
    let mut checked = validate::host_subnet(host, &h.host_ip, &[h.subnet.as_str()], fixed);
    // The IPv6 subnet ([`SUBNET_IPV6_ANNOTATION`]): a bad one is left out with a problem, and
    // the node keeps its IPv4 subnet (as the model does with an IPv6 subnet that conflicts).
    if let (Ok((hs, problems)), Some(v)) =
        (&mut checked, annotations(&h.metadata).get(SUBNET_IPV6_ANNOTATION).filter(|v| !v.trim().is_empty()))
    {
        match v.trim().parse::<Ipv6Net>() {
            Ok(net) => hs.subnet6 = Some(net.trunc()),
            Err(_) => problems.push(Problem::new(
                "",
                format!("metadata.annotations[{SUBNET_IPV6_ANNOTATION}]"),
                format!("{v:?} is not an IPv6 CIDR; the node's IPv6 subnet is left out"),
            )),
        }
    }
    converted(host.to_string(), &format!("hostsubnet {host}"), checked)
}

pub fn net_namespace(n: &KubeNetNamespace) -> Converted<NetNamespace> {
    let name = if n.netname.is_empty() { name_of(&n.metadata) } else { &n.netname };
    let multicast = annotations(&n.metadata).get(MULTICAST_ANNOTATION).is_some_and(|v| v == "true");
    converted(name.to_string(), &format!("netnamespace {name}"), validate::net_namespace(name, n.netid.0.clone(), multicast))
}

/// `None` for a service without a cluster IP (headless, ExternalName): nothing to program.
/// A dual-stack service's `spec.clusterIPs` holds one address per family (`spec.ipFamilies`
/// says which, in the same order); `clusterIP` is its first. IPv4 is required (a
/// single-stack IPv6 service is a problem of the service).
pub fn service(svc: &KubeService) -> Option<Converted<Service>> {
    let spec = svc.spec.as_ref()?;
    let one = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty());
    let many = spec.cluster_ips.as_deref().unwrap_or_default();
    if one.or(many.first().map(String::as_str)).is_none_or(|ip| ip.is_empty() || ip == "None") {
        return None;
    }
    let (ns, name) = (svc.metadata.namespace.as_deref().unwrap_or_default(), name_of(&svc.metadata));
    let ports = spec.ports.iter().flatten().map(|p| (p.protocol.as_deref().unwrap_or("TCP"), i64::from(p.port)));
    let checked = validate::singular_and_plural("clusterIPs", one, many).and_then(|ips| validate::service(ns, name, &ips, ports));
    Some(converted(String::new(), &format!("service {ns}/{name}"), checked))
}

pub fn egress_policy(p: &EgressNetworkPolicy) -> Converted<Policy> {
    let (ns, name) = (p.metadata.namespace.as_deref().unwrap_or_default(), name_of(&p.metadata));
    let rules = p.spec.egress.iter().map(|r| EgressRuleFields {
        kind: &r.kind,
        cidr_selector: r.to.cidr_selector.as_deref(),
        dns_name: r.to.dns_name.as_deref(),
    });
    let checked = validate::egress_policy(ns, name, rules).map(|p| (p, Vec::new()));
    converted(String::new(), &format!("egressnetworkpolicy {ns}/{name}"), checked)
}

/// A NetworkPolicy, through the state file's checks (`networkPolicies`).
pub fn network_policy(np: &KubeNetworkPolicy) -> Converted<NetworkPolicy> {
    let (ns, name) = (np.metadata.namespace.as_deref().unwrap_or_default(), name_of(&np.metadata));
    converted(String::new(), &format!("networkpolicy {ns}/{name}"), netpol::network_policy(np))
}

/// A Namespace's labels (with `kubernetes.io/metadata.name`, which the API server sets anyway).
pub fn namespace_labels(n: &KubeNamespace) -> Labels {
    let mut labels = n.metadata.labels.clone().unwrap_or_default();
    labels.entry(netpol::NAMESPACE_NAME_LABEL.to_string()).or_insert_with(|| name_of(&n.metadata).to_string());
    labels
}

/// One watched object, converted.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    ClusterNetwork(Result<NetworkConfig, String>),
    HostSubnet(Converted<HostSubnet>),
    NetNamespace(Converted<NetNamespace>),
    /// `None`: the service has no cluster IP.
    Service(Option<Converted<Service>>),
    EgressPolicy(Converted<Policy>),
    /// A pod (any node): its identity, and what is used of it (see [`PodInfo`]).
    Pod(PodInfo),
    /// A NetworkPolicy (networkpolicy plugin).
    NetworkPolicy(Converted<NetworkPolicy>),
    /// A Namespace's labels (networkpolicy plugin).
    Namespace(Labels),
}

/// What the agent uses of a Pod beyond its name (the full object is never kept).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// `kubernetes.io/ingress-bandwidth` and `kubernetes.io/egress-bandwidth`, as written.
    pub annotations: BTreeMap<String, String>,
    /// `spec.nodeName` (`None`: not scheduled yet).
    pub node: Option<String>,
    /// The IPv4 address of `status.podIPs` (or `status.podIP`) if the pod uses the pod network
    /// (`None` for host-network pods, finished pods and pods without an IP yet).
    pub ip: Option<Ipv4Addr>,
    /// The IPv6 address of `status.podIPs`, likewise (dual-stack).
    pub ip6: Option<Ipv6Addr>,
    /// Labels and containerPorts (NetworkPolicy selection and named ports).
    pub meta: PodMeta,
}

/// The bandwidth annotations of a pod's metadata.
pub fn pod_info(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> PodInfo {
    let keep = [crate::cluster::INGRESS_ANNOTATION, crate::cluster::EGRESS_ANNOTATION];
    PodInfo {
        annotations: meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| keep.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..PodInfo::default()
    }
}

/// A Pod, converted at once to what is used of it.
pub fn pod(p: &KubePod) -> PodInfo {
    let mut info = pod_info(&p.metadata);
    let spec = p.spec.as_ref();
    info.node = spec.and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let status = p.status.as_ref();
    let finished = status.and_then(|s| s.phase.as_deref()).is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
    if !host_network && !finished {
        // One address per family: the first of each (the API server allows no second).
        let plural: Vec<&str> = status.and_then(|s| s.pod_ips.as_ref()).into_iter().flatten().map(|p| p.ip.as_str()).collect();
        let ips = if plural.is_empty() { status.and_then(|s| s.pod_ip.as_deref()).into_iter().collect() } else { plural };
        for ip in ips.iter().filter_map(|ip| ip.trim().parse::<IpAddr>().ok()) {
            match ip {
                IpAddr::V4(a) => drop(info.ip.get_or_insert(a)),
                IpAddr::V6(a) => drop(info.ip6.get_or_insert(a)),
            }
        }
    }
    info.meta.labels = p.metadata.labels.clone().unwrap_or_default();
    // The API server validates container ports: one out of range cannot occur (skipped).
    info.meta.container_ports = spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|c| {
            let port = u16::try_from(c.container_port).ok().filter(|p| *p != 0)?;
            let proto = netpol::Proto::parse(c.protocol.as_deref()).ok()?;
            Some(ContainerPort { name: c.name.clone().filter(|n| !n.is_empty()), port, proto })
        })
        .collect();
    info
}

/// What a watcher reports, converted.
#[derive(Clone, Debug)]
pub enum Update {
    /// A (re)list of the kind begins: its objects are replaced by the listed ones at `ListDone`.
    ListStart(Kind),
    ListApply(Id, Object),
    ListDone(Kind),
    Apply(Id, Object),
    Delete(Kind, Id),
    /// Listing EgressNetworkPolicies is forbidden: policies count as none (and as listed).
    EgressForbidden,
}

/// One kind's converted objects, in the order the state lists them: by (sort key, identity).
#[derive(Debug)]
struct KindMap<T> {
    items: BTreeMap<(String, Id), Converted<T>>,
    sorts: HashMap<Id, String>,
}

impl<T> Default for KindMap<T> {
    fn default() -> Self {
        KindMap { items: BTreeMap::new(), sorts: HashMap::new() }
    }
}

impl<T: Clone + PartialEq> KindMap<T> {
    fn remove(&mut self, id: &Id) -> Option<Converted<T>> {
        let sort = self.sorts.remove(id)?;
        self.items.remove(&(sort, id.clone()))
    }

    /// Sets (or with `None` removes) an object; the old and new model values if anything
    /// changed.
    fn put(&mut self, id: Id, new: Option<Converted<T>>) -> Option<(Option<T>, Option<T>)> {
        if let Some(sort) = self.sorts.get(&id) {
            if new.as_ref() == self.items.get(&(sort.clone(), id.clone())) {
                return None;
            }
        } else if new.is_none() {
            return None;
        }
        let old = self.remove(&id).and_then(|c| c.value);
        let value = new.as_ref().and_then(|c| c.value.clone());
        if let Some(c) = new {
            self.sorts.insert(id.clone(), c.sort.clone());
            self.items.insert((c.sort.clone(), id), c);
        }
        Some((old, value))
    }

    fn values(&self) -> impl Iterator<Item = &T> {
        self.items.values().filter_map(|c| c.value.as_ref())
    }

    fn problems(&self) -> impl Iterator<Item = &Problem> {
        self.items.values().flat_map(|c| &c.problems)
    }
}

#[derive(Debug, Default)]
struct Maps {
    cluster_network: Option<Result<NetworkConfig, String>>,
    host_subnets: KindMap<HostSubnet>,
    net_namespaces: KindMap<NetNamespace>,
    services: KindMap<Service>,
    egress_policies: KindMap<Policy>,
    /// This node's pods.
    pods: BTreeSet<PodKey>,
    /// This node's pods' labels and containerPorts.
    pod_meta: BTreeMap<PodKey, PodMeta>,
    /// Other nodes' pods with a pod-network IP (NetworkPolicy peers).
    remote_pods: BTreeMap<PodKey, RemotePod>,
    /// Namespace labels, by namespace name.
    namespaces: BTreeMap<String, Labels>,
    network_policies: KindMap<NetworkPolicy>,
}

/// The keys of `items` reachable from what `hit` takes: each item hit is added to `out` and
/// `take`s its own addresses, which may hit more, until none does (a fixed point; a change of
/// one family's address can settle another item's conflict in the other family).
fn closure<'a, K: Ord + ?Sized, T: ?Sized, S>(
    items: &[(&'a K, &'a T)],
    state: &mut S,
    hit: impl Fn(&S, &T) -> bool,
    take: impl Fn(&mut S, &T),
    out: &mut BTreeSet<&'a K>,
) {
    loop {
        let mut more = false;
        for (k, t) in items {
            if !out.contains(*k) && hit(state, t) {
                out.insert(*k);
                take(state, t);
                more = true;
            }
        }
        if !more {
            return;
        }
    }
}

/// A service's cluster IPs, of both families.
fn service_ips(s: &Service) -> impl Iterator<Item = IpAddr> {
    s.cluster_ip.map(IpAddr::V4).into_iter().chain(s.cluster_ip6.map(IpAddr::V6))
}

/// A remote pod's IPs, of both families.
fn remote_ips(r: &RemotePod) -> impl Iterator<Item = IpAddr> {
    r.ip.map(IpAddr::V4).into_iter().chain(r.ip6.map(IpAddr::V6))
}

/// Files a pod: one of this node's (live, with its labels) or another node's with an IP (a
/// policy peer); an unscheduled pod is neither.
fn place_pod(node: &str, m: &mut Maps, id: Id, info: &PodInfo) {
    match info.node.as_deref() {
        Some(n) if n == node => {
            m.pod_meta.insert(id.clone(), info.meta.clone());
            m.pods.insert(id);
        }
        Some(_) if info.ip.is_some() || info.ip6.is_some() => {
            let remote = RemotePod {
                namespace: id.0.clone(),
                name: id.1.clone(),
                ip: info.ip,
                ip6: info.ip6,
                labels: info.meta.labels.clone(),
                container_ports: info.meta.container_ports.clone(),
            };
            m.remote_pods.insert(id, remote);
        }
        Some(_) | None => {}
    }
}

impl Maps {
    fn take(&mut self, kind: Kind) -> Maps {
        let mut out = Maps::default();
        match kind {
            Kind::ClusterNetwork => out.cluster_network = self.cluster_network.take(),
            Kind::HostSubnet => out.host_subnets = std::mem::take(&mut self.host_subnets),
            Kind::NetNamespace => out.net_namespaces = std::mem::take(&mut self.net_namespaces),
            Kind::EgressNetworkPolicy => out.egress_policies = std::mem::take(&mut self.egress_policies),
            Kind::Service => out.services = std::mem::take(&mut self.services),
            Kind::Pod => {
                out.pods = std::mem::take(&mut self.pods);
                out.pod_meta = std::mem::take(&mut self.pod_meta);
                out.remote_pods = std::mem::take(&mut self.remote_pods);
            }
            Kind::NetworkPolicy => out.network_policies = std::mem::take(&mut self.network_policies),
            Kind::Namespace => out.namespaces = std::mem::take(&mut self.namespaces),
        }
        out
    }

    fn replace(&mut self, kind: Kind, mut from: Maps) {
        match kind {
            Kind::ClusterNetwork => self.cluster_network = from.cluster_network.take(),
            Kind::HostSubnet => self.host_subnets = from.host_subnets,
            Kind::NetNamespace => self.net_namespaces = from.net_namespaces,
            Kind::EgressNetworkPolicy => self.egress_policies = from.egress_policies,
            Kind::Service => self.services = from.services,
            Kind::Pod => {
                self.pods = from.pods;
                self.pod_meta = from.pod_meta;
                self.remote_pods = from.remote_pods;
            }
            Kind::NetworkPolicy => self.network_policies = from.network_policies,
            Kind::Namespace => self.namespaces = from.namespaces,
        }
    }
}

/// What changed since the last published state.
#[derive(Debug, Default)]
struct Changes {
    /// Anything changed (an object, or only its problems).
    any: bool,
    /// Anything may have changed: a (re)list, the ClusterNetwork, a NetNamespace.
    full: bool,
    services: BTreeSet<Id>,
    /// The changed services' cluster IPs of both families, before and after (a service that
    /// shares one may become valid or invalid).
    service_ips: HashSet<IpAddr>,
    hosts: BTreeSet<String>,
    /// The changed HostSubnets' subnets, before and after (an overlapping one may become valid
    /// or invalid).
    subnets: Vec<Ipv4Net>,
    /// Their IPv6 subnets, likewise (an overlapping one may lose or regain its IPv6 subnet).
    subnets6: Vec<Ipv6Net>,
    egress_namespaces: BTreeSet<String>,
    gone_pods: BTreeSet<PodKey>,
    /// Namespaces whose NetworkPolicies changed (their NetworkPolicy owner, networkpolicy
    /// plugin).
    policy_namespaces: BTreeSet<String>,
    /// Namespaces with a pod that came, went, or changed labels, IP or containerPorts.
    pod_namespaces: BTreeSet<String>,
    /// The changed other-node pods' IPs of both families, before and after (of two pods with
    /// one IP the first is valid: a change to one may validate or reject the other).
    remote_ips: HashSet<IpAddr>,
    /// Namespaces whose labels changed, with their labels before the first change since the
    /// last publish as selectors saw them (without a Namespace object: the name label alone):
    /// a selector that matched the old labels may no longer.
    relabelled: BTreeMap<String, Labels>,
}

/// The converted objects of every watched kind, updated one event at a time; each published
/// state is assembled from them (see [`Objects::publish`]).
#[derive(Debug)]
pub struct Objects {
    node: String,
    live: Maps,
    /// The objects of the kinds being (re)listed.
    listing: Maps,
    /// Per [`Kind::ALL`] slot: the kind has listed (seen `InitDone`).
    ready: [bool; Kind::ALL.len()],
    /// Per [`Kind::ALL`] slot: the kind is watched (the plugin needs it); an unwatched kind
    /// has no objects and is not waited for.
    watched: [bool; Kind::ALL.len()],
    egress_forbidden: bool,
    changes: Changes,
    /// This node's pods' annotations that matter (bandwidth), by pod.
    pod_info: BTreeMap<PodKey, PodInfo>,
    /// Each NetworkPolicy's generation and when its watch event brought it (see
    /// [`Objects::apply_seen`]).
    policy_seen: BTreeMap<Id, crate::cluster::PolicySeen>,
}

/// A watch event's object generation (`None`: the server sets none) and arrival.
pub type Seen = (Option<i64>, std::time::Instant);

impl Objects {
    pub fn new(node: &str) -> Objects {
        Objects {
            node: node.to_string(),
            live: Maps::default(),
            listing: Maps::default(),
            ready: [false; Kind::ALL.len()],
            watched: [true; Kind::ALL.len()],
            egress_forbidden: false,
            changes: Changes { full: true, any: true, ..Changes::default() },
            pod_info: BTreeMap::new(),
            policy_seen: BTreeMap::new(),
        }
    }

    /// [`Objects::apply`] of a watch event that arrived as `seen` says. A NetworkPolicy whose
    /// generation is new is stamped with the event's arrival (the start of its realization,
    /// see [`crate::realize`]), and its namespace's owner counts as touched even if the
    /// converted policy is the same (its new generation is realized by a commit of it, a
    /// no-op for the switch). Without `metadata.generation` every event is a new generation.
    pub fn apply_seen(&mut self, update: Update, seen: Option<Seen>) {
        match (&update, seen) {
            (Update::Apply(id, Object::NetworkPolicy(_)) | Update::ListApply(id, Object::NetworkPolicy(_)), Some((generation, at))) => {
                let old = self.policy_seen.get(id).map(|s| s.generation);
                let generation = generation.unwrap_or_else(|| old.map_or(1, |g| g.saturating_add(1)));
                if old != Some(generation) {
                    self.policy_seen.insert(id.clone(), crate::cluster::PolicySeen { generation, at });
                    if matches!(update, Update::Apply(..)) {
                        self.changes.any = true;
                        self.changes.policy_namespaces.insert(id.0.clone());
                    }
                }
            }
            (Update::Delete(Kind::NetworkPolicy, id), _) => drop(self.policy_seen.remove(id)),
            _ => {}
        }
        self.apply(update);
    }

    /// The stamps of the live NetworkPolicies (stamps of policies gone meanwhile are dropped).
    fn policies_seen(&mut self) -> crate::cluster::PoliciesSeen {
        let live = &self.live.network_policies.sorts;
        let listing = &self.listing.network_policies.sorts;
        self.policy_seen.retain(|k, _| live.contains_key(k) || listing.contains_key(k));
        self.policy_seen.iter().filter(|(k, _)| live.contains_key(*k)).map(|(k, s)| (k.clone(), *s)).collect()
    }

    /// Every watched kind has listed (EgressNetworkPolicies count as listed while forbidden).
    pub fn ready(&self) -> bool {
        Kind::ALL.iter().all(|k| {
            !self.watched[k.slot()] || self.ready[k.slot()] || (self.egress_forbidden && *k == Kind::EgressNetworkPolicy)
        })
    }

    /// The watched kinds that have not listed yet (what [`Objects::ready`] waits for).
    pub fn unlisted(&self) -> Vec<Kind> {
        Kind::ALL
            .iter()
            .copied()
            .filter(|k| {
                self.watched[k.slot()]
                    && !self.ready[k.slot()]
                    && !(self.egress_forbidden && *k == Kind::EgressNetworkPolicy)
            })
            .collect()
    }

    /// A (new) watcher of `kind` starts: nothing is published until it has listed (its objects
    /// so far stay until the list replaces them).
    pub fn watch(&mut self, kind: Kind) {
        drop(self.listing.take(kind));
        self.watched[kind.slot()] = true;
        self.ready[kind.slot()] = false;
    }

    /// `kind` is no longer watched: its objects go, and it is not waited for.
    pub fn unwatch(&mut self, kind: Kind) {
        drop(self.listing.take(kind));
        drop(self.live.take(kind));
        self.watched[kind.slot()] = false;
        self.ready[kind.slot()] = false;
        self.changes.full = true;
        self.changes.any = true;
    }

    /// The plugin ClusterNetwork "default" names (`None`: no usable ClusterNetwork yet).
    pub fn plugin(&self) -> Option<Plugin> {
        match &self.live.cluster_network {
            Some(Ok(c)) => Some(c.plugin),
            _ => None,
        }
    }

    pub fn apply(&mut self, update: Update) {
        match update {
            Update::ListStart(kind) => drop(self.listing.take(kind)),
            Update::ListApply(id, obj) => {
                let m = &mut self.listing;
                match obj {
                    Object::ClusterNetwork(c) => m.cluster_network = Some(c),
                    Object::HostSubnet(c) => drop(m.host_subnets.put(id, Some(c))),
                    Object::NetNamespace(c) => drop(m.net_namespaces.put(id, Some(c))),
                    Object::Service(c) => drop(m.services.put(id, c)),
                    Object::EgressPolicy(c) => drop(m.egress_policies.put(id, Some(c))),
                    Object::Pod(info) => {
                        if info.node.as_deref() == Some(self.node.as_str()) {
                            self.pod_info.insert(id.clone(), info.clone());
                        }
                        place_pod(&self.node, m, id, &info);
                    }
                    Object::NetworkPolicy(c) => drop(m.network_policies.put(id, Some(c))),
                    Object::Namespace(labels) => drop(m.namespaces.insert(id.1, labels)),
                }
            }
            Update::ListDone(kind) => {
                let listed = self.listing.take(kind);
                self.live.replace(kind, listed);
                self.ready[kind.slot()] = true;
                if kind == Kind::EgressNetworkPolicy {
                    self.egress_forbidden = false;
                }
                self.changes.full = true;
                self.changes.any = true;
            }
            Update::EgressForbidden => {
                if !self.egress_forbidden {
                    self.egress_forbidden = true;
                    self.changes.full = true;
                    self.changes.any = true;
                }
            }
            Update::Apply(id, obj) => {
                let kind = match &obj {
                    Object::ClusterNetwork(_) => Kind::ClusterNetwork,
                    Object::HostSubnet(_) => Kind::HostSubnet,
                    Object::NetNamespace(_) => Kind::NetNamespace,
                    Object::Service(_) => Kind::Service,
                    Object::EgressPolicy(_) => Kind::EgressNetworkPolicy,
                    Object::Pod(info) => {
                        if info.node.as_deref() == Some(self.node.as_str()) {
                            self.pod_info.insert(id.clone(), info.clone());
                        }
                        Kind::Pod
                    }
                    Object::NetworkPolicy(_) => Kind::NetworkPolicy,
                    Object::Namespace(_) => Kind::Namespace,
                };
                self.change(kind, id, Some(obj))
            }
            Update::Delete(kind, id) => self.change(kind, id, None),
        }
    }

    /// One object set (`Some`) or deleted (`None`), and what that may change.
    fn change(&mut self, kind: Kind, id: Id, obj: Option<Object>) {
        let ch = &mut self.changes;
        let m = &mut self.live;
        match (kind, obj) {
            (Kind::ClusterNetwork, obj) => {
                let new = match obj {
                    Some(Object::ClusterNetwork(c)) => Some(c),
                    _ => None,
                };
                if m.cluster_network != new {
                    m.cluster_network = new;
                    ch.full = true;
                    ch.any = true;
                }
            }
            (Kind::HostSubnet, obj) => {
                let new = match obj {
                    Some(Object::HostSubnet(c)) => Some(c),
                    _ => None,
                };
                if let Some((old, new)) = m.host_subnets.put(id, new) {
                    ch.any = true;
                    for h in old.iter().chain(&new) {
                        ch.hosts.insert(h.host.clone());
                        ch.subnets.extend(h.subnet);
                        ch.subnets6.extend(h.subnet6);
                    }
                }
            }
            (Kind::NetNamespace, obj) => {
                let new = match obj {
                    Some(Object::NetNamespace(c)) => Some(c),
                    _ => None,
                };
                if m.net_namespaces.put(id, new).is_some() {
                    ch.any = true;
                    ch.full = true;
                }
            }
            (Kind::Service, obj) => {
                let new = match obj {
                    Some(Object::Service(c)) => c,
                    _ => None,
                };
                if let Some((old, new)) = m.services.put(id.clone(), new) {
                    ch.any = true;
                    ch.service_ips.extend(old.iter().chain(&new).flat_map(service_ips));
                    ch.services.insert(id);
                }
            }
            (Kind::EgressNetworkPolicy, obj) => {
                let new = match obj {
                    Some(Object::EgressPolicy(c)) => Some(c),
                    _ => None,
                };
                if m.egress_policies.put(id.clone(), new).is_some() {
                    ch.any = true;
                    ch.egress_namespaces.insert(id.0);
                }
            }
            (Kind::Pod, obj) => {
                let was_local = m.pods.remove(&id);
                let old_meta = m.pod_meta.remove(&id);
                let old_remote = m.remote_pods.remove(&id);
                if let Some(Object::Pod(info)) = &obj {
                    place_pod(&self.node, m, id.clone(), info);
                }
                if was_local != m.pods.contains(&id) {
                    ch.any = true;
                    if was_local {
                        ch.gone_pods.insert(id.clone());
                    }
                }
                let new_remote = m.remote_pods.get(&id);
                if old_meta.as_ref() != m.pod_meta.get(&id) || old_remote.as_ref() != new_remote {
                    ch.any = true;
                    ch.pod_namespaces.insert(id.0.clone());
                    ch.remote_ips.extend(old_remote.iter().chain(new_remote).flat_map(remote_ips));
                }
            }
            (Kind::NetworkPolicy, obj) => {
                let new = match obj {
                    Some(Object::NetworkPolicy(c)) => Some(c),
                    _ => None,
                };
                if m.network_policies.put(id.clone(), new).is_some() {
                    ch.any = true;
                    ch.policy_namespaces.insert(id.0);
                }
            }
            (Kind::Namespace, obj) => {
                let new = match obj {
                    Some(Object::Namespace(l)) => Some(l),
                    _ => None,
                };
                let old = m.namespaces.remove(&id.1);
                if let Some(l) = &new {
                    m.namespaces.insert(id.1.clone(), l.clone());
                }
                if old != new {
                    ch.any = true;
                    let seen = old.unwrap_or_else(|| Labels::from([(netpol::NAMESPACE_NAME_LABEL.to_string(), id.1.clone())]));
                    ch.relabelled.entry(id.1).or_insert(seen);
                }
            }
        }
    }

    /// The owners whose flows may differ from the last published state's (`None`: any).
    fn touched(&self, state: &ClusterState) -> Option<Vec<Owner>> {
        let ch = &self.changes;
        if ch.full {
            return None;
        }
        let mut owners: BTreeSet<Owner> = BTreeSet::new();
        let mut services: BTreeSet<&Id> = ch.services.iter().collect();
        if !ch.service_ips.is_empty() {
            // Of two services with one cluster IP the first is valid: a change to one may
            // change the other, and, through its other family's IP, a third (to a fixed
            // point).
            let mut ips = ch.service_ips.clone();
            let live: Vec<(&Id, &Service)> =
                self.live.services.items.iter().filter_map(|((_, id), c)| Some((id, c.value.as_ref()?))).collect();
            closure(
                &live,
                &mut ips,
                |ips, s| service_ips(s).any(|ip| ips.contains(&ip)),
                |ips, s| ips.extend(service_ips(s)),
                &mut services,
            );
        }
        for (ns, name) in services {
            owners.insert(Owner::Service { namespace: ns.clone(), name: name.clone() });
            if let Some(vnid) = state.vnid_of(ns) {
                owners.insert(Owner::VnidRule { vnid });
            }
        }
        if !ch.hosts.is_empty() {
            // Duplicates and overlaps are settled by order: a change may validate or
            // invalidate another HostSubnet of the same host or an overlapping subnet.
            // A HostSubnet rejected for its IPv4 subnet frees its IPv6 one too: to a fixed point.
            let mut state = (ch.hosts.clone(), ch.subnets.clone(), ch.subnets6.clone());
            let live: Vec<(&Id, &HostSubnet)> =
                self.live.host_subnets.items.iter().filter_map(|((_, id), c)| Some((id, c.value.as_ref()?))).collect();
            let mut reached = BTreeSet::new();
            closure(
                &live,
                &mut state,
                |(hosts, subnets, subnets6), h| {
                    hosts.contains(&h.host)
                        || h.subnet.is_some_and(|h4| subnets.iter().any(|s| s.contains(&h4.network()) || h4.contains(&s.network())))
                        || h.subnet6.is_some_and(|h6| subnets6.iter().any(|s| s.contains(&h6.network()) || h6.contains(&s.network())))
                },
                |(hosts, subnets, subnets6), h| {
                    hosts.insert(h.host.clone());
                    subnets.extend(h.subnet);
                    subnets6.extend(h.subnet6);
                },
                &mut reached,
            );
            let hosts = state.0;
            if hosts.contains(&self.node) {
                // This node's own subnet: the whole pipeline depends on it.
                return None;
            }
            owners.extend(hosts.into_iter().map(|host| Owner::HostSubnet { host }));
            owners.insert(Owner::MulticastVxlan);
        }
        for ns in &ch.egress_namespaces {
            if let Some(vnid) = state.vnid_of(ns) {
                owners.insert(Owner::EgressPolicy { vnid });
            }
        }
        for (ns, name) in &ch.gone_pods {
            // The pod is torn down (its flows, and its VNID's rule and multicast ports).
            owners.insert(Owner::Pod { namespace: ns.clone(), name: name.clone() });
            if let Some(vnid) = state.vnid_of(ns) {
                owners.insert(Owner::VnidRule { vnid });
                owners.insert(Owner::Multicast { vnid });
            }
        }
        if state.plugin == Plugin::NetworkPolicy {
            owners.extend(self.netpol_touched(state).into_iter().map(|namespace| Owner::NetworkPolicy { namespace }));
        }
        Some(owners.into_iter().collect())
    }

    /// The namespaces whose NetworkPolicy flows may differ from the last published state's: a
    /// policy change touches its namespace alone; a pod or namespace-label change touches the
    /// namespaces whose policies can select those pods ([`netpol::namespaces_affected`]).
    fn netpol_touched(&self, state: &ClusterState) -> BTreeSet<String> {
        let ch = &self.changes;
        let mut pods_of = ch.pod_namespaces.clone();
        if !ch.remote_ips.is_empty() {
            // Through a pod's other family's IP, a third pod: to a fixed point.
            let mut ips = ch.remote_ips.clone();
            let live: Vec<(&PodKey, &RemotePod)> = self.live.remote_pods.iter().collect();
            let mut pods = BTreeSet::new();
            closure(&live, &mut ips, |ips, r| remote_ips(r).any(|ip| ips.contains(&ip)), |ips, r| ips.extend(remote_ips(r)), &mut pods);
            pods_of.extend(pods.into_iter().map(|id| id.0.clone()));
        }
        let mut out = if pods_of.is_empty() && ch.relabelled.is_empty() {
            BTreeSet::new()
        } else {
            netpol::namespaces_affected(state, &pods_of, &ch.relabelled)
        };
        out.extend(ch.policy_namespaces.iter().cloned());
        out
    }

    /// Assembles the state from the converted objects and validates it: `None` if nothing
    /// changed since `last` (or not every kind has listed yet), what is missing if no state can
    /// be built (the changes are kept for the next attempt).
    pub fn publish(&mut self, last: Option<&Loaded>) -> Option<Result<Loaded, Unusable>> {
        if !self.ready() || (!self.changes.any && last.is_some()) {
            return None;
        }
        let (state, problems) = match self.assemble() {
            Ok(v) => v,
            Err(e) => return Some(Err(e)),
        };
        let touched = self.touched(&state);
        let policies_seen = if state.plugin == Plugin::NetworkPolicy { self.policies_seen() } else { Default::default() };
        let unchanged = last.is_some_and(|l| {
            l.state == state
                && l.problems == problems
                && l.live_pods.as_ref().is_some_and(|p| *p == self.live.pods)
                && l.policies_seen == policies_seen
        });
        self.changes = Changes::default();
        if unchanged {
            return None;
        }
        let live = &self.live.pods;
        self.pod_info.retain(|k, _| live.contains(k));
        let pod_annotations = self.pod_info.iter().filter(|(_, i)| !i.annotations.is_empty()).map(|(k, i)| (k.clone(), i.annotations.clone())).collect();
        Some(Ok(Loaded { state, problems, live_pods: Some(self.live.pods.clone()), touched, seq: 0, pod_annotations, policies_seen }))
    }

    /// The state from the converted objects (every watched kind as listed), validated.
    pub fn assemble(&self) -> Result<(ClusterState, Vec<Problem>), Unusable> {
        let m = &self.live;
        let cfg = match &m.cluster_network {
            None => return Err(Unusable::NoClusterNetwork),
            Some(Err(e)) => return Err(Unusable::ClusterNetwork(e.clone())),
            Some(Ok(c)) => c,
        };
        let mut header = validate::header(
            self.node.clone(),
            cfg.plugin,
            &[cfg.cluster_network.as_str()],
            &[cfg.service_network.as_str()],
            cfg.vxlan_port,
            cfg.mtu,
        )
        .map_err(|e| Unusable::ClusterNetwork(format!("ClusterNetwork \"default\": {e}")))?;
        // The IPv6 networks: ClusterNetwork's own fields in an IPv6-only cluster, else parsed
        // (typed) from their annotations (dual-stack), both or neither.
        header.cluster_network6 = header.cluster_network6.or(cfg.cluster_network6);
        header.service_network6 = header.service_network6.or(cfg.service_network6);
        // This node's own HostSubnet, as converted: none at all is a wait for whoever creates
        // HostSubnets; one rejected on its own names its fields.
        let own = format!("hostsubnet {}", self.node);
        let own_problems: Vec<String> =
            m.host_subnets.problems().filter(|p| p.object == own).map(ToString::to_string).collect();
        if !m.host_subnets.values().any(|h| h.host == self.node) {
            return Err(match own_problems.is_empty() {
                true => Unusable::NoHostSubnet { node: self.node.clone() },
                false => Unusable::HostSubnet { node: self.node.clone(), why: own_problems.join("; ") },
            });
        }
        let empty = KindMap::default();
        let egress = if self.egress_forbidden { &empty } else { &m.egress_policies };
        // NetworkPolicy objects, namespace and pod labels and other nodes' pods only matter
        // to the networkpolicy plugin (the other plugins' states leave them out).
        let netpol = cfg.plugin == Plugin::NetworkPolicy;
        let no_policies = KindMap::default();
        let policies = if netpol { &m.network_policies } else { &no_policies };
        let problems: Vec<Problem> = m
            .host_subnets
            .problems()
            .chain(m.net_namespaces.problems())
            .chain(m.services.problems())
            .chain(egress.problems())
            .chain(policies.problems())
            .cloned()
            .collect();
        let mut net_namespaces: Vec<NetNamespace> = m.net_namespaces.values().cloned().collect();
        if netpol {
            for n in &mut net_namespaces {
                if let Some(l) = m.namespaces.get(&n.name) {
                    n.labels = l.clone();
                }
            }
        }
        // Without IPv6 networks in ClusterNetwork "default" the pods' and services' IPv6
        // addresses cannot be served: left out, so that a dual-stack Kubernetes cluster whose
        // ClusterNetwork is IPv4-only (openshift-sdn's master, a controller without IPv6)
        // keeps its IPv4 side (the model would reject such a pod or service whole).
        // Likewise an IPv6-only cluster leaves out IPv4 addresses.
        let remote_pods = if netpol {
            let (v4, v6) = (header.cluster_network.is_some(), header.cluster_network6.is_some());
            m.remote_pods.values().map(|r| RemotePod { ip: r.ip.filter(|_| v4), ip6: r.ip6.filter(|_| v6), ..r.clone() }).collect()
        } else {
            Vec::new()
        };
        let (v4, v6) = (header.service_network.is_some(), header.service_network6.is_some());
        let services = m
            .services
            .values()
            .map(|s| Service { cluster_ip: s.cluster_ip.filter(|_| v4), cluster_ip6: s.cluster_ip6.filter(|_| v6), ..s.clone() })
            .filter(|s| s.cluster_ip.is_some() || s.cluster_ip6.is_some())
            .collect();
        let (mut state, problems) = validate::assemble_with_policies(
            header,
            m.host_subnets.values().cloned().collect(),
            net_namespaces,
            services,
            // Pods are set up through the pod API; the cluster only says which still exist
            // (and, for NetworkPolicies, their labels: `pod_meta`).
            Vec::new(),
            egress.values().cloned().collect(),
            (remote_pods, policies.values().cloned().collect()),
            problems,
        )
        // With a header that passed, the one fatal error left is this node's HostSubnet
        // rejected across objects (outside the cluster network, overlapping another node's).
        .map_err(|e| Unusable::HostSubnet { node: self.node.clone(), why: own_subnet_why(&e.0) })?;
        if netpol {
            state.pod_meta = m.pod_meta.clone();
        }
        Ok((state, problems))
    }

    /// This node's pods, as listed.
    pub fn live_pods(&self) -> &BTreeSet<PodKey> {
        &self.live.pods
    }
}

/// Why no state can be built from the cluster's objects: what the agent waits for (`/readyz`,
/// `sdn-node status`, a Warning Event regarding this Node). Each names the object (and, when
/// one is rejected, its fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// ClusterNetwork "default" does not exist.
    NoClusterNetwork,
    /// ClusterNetwork "default" cannot be used: why, naming its field.
    ClusterNetwork(String),
    /// No HostSubnet has this node as its host.
    NoHostSubnet { node: String },
    /// This node's HostSubnet is rejected: why, naming its fields.
    HostSubnet { node: String, why: String },
}

impl Unusable {
    /// The Event's reason (`kubectl describe node` shows it).
    pub fn reason(&self) -> &'static str {
        match self {
            Unusable::NoClusterNetwork => "WaitingForClusterNetwork",
            Unusable::ClusterNetwork(_) => "InvalidClusterNetwork",
            Unusable::NoHostSubnet { .. } => "WaitingForHostSubnet",
            Unusable::HostSubnet { .. } => "InvalidHostSubnet",
        }
    }
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::NoClusterNetwork => f.write_str(
                "waiting for ClusterNetwork \"default\" (created by openshift-sdn's master or sdn-node controller: is it running?)",
            ),
            Unusable::ClusterNetwork(why) => {
                let why = why.strip_prefix("ClusterNetwork \"default\": ").unwrap_or(why);
                write!(f, "waiting for a usable ClusterNetwork \"default\": {why}")
            }
            Unusable::NoHostSubnet { node } => write!(
                f,
                "no HostSubnet for node {node} yet (created by sdn-node controller or openshift-sdn's master: is it running?)"
            ),
            Unusable::HostSubnet { node, why } => write!(f, "waiting for a valid HostSubnet for node {node}: {why}"),
        }
    }
}

/// The part of the model's "no valid HostSubnet" error that says why (the rejected fields).
fn own_subnet_why(fatal: &str) -> String {
    match fatal.split_once("the local subnet is unknown: ") {
        Some((_, why)) => why.to_string(),
        None => fatal.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cluster::desired::desired_state;
    use crate::pipeline::egress::DnsAnswers;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use proptest::prelude::*;
    use serde_json::json;

    fn meta(ns: Option<&str>, name: &str, ann: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: ns.map(Into::into),
            annotations: (!ann.is_empty()).then(|| ann.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    fn cn(plugin: &str) -> ClusterNetwork {
        serde_json::from_value(json!({
            "metadata": {"name": "default"}, "network": "10.0.0.0/8", "hostsubnetlength": 9,
            "serviceNetwork": "172.30.0.0/16", "pluginName": plugin,
            "clusterNetworks": [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 9}], "vxlanPort": 4789
        }))
        .unwrap()
    }

    /// [`cn`] with the IPv6 cluster and service networks (dual-stack).
    fn cn6(plugin: &str) -> ClusterNetwork {
        let mut c = cn(plugin);
        c.metadata = meta(
            None,
            "default",
            &[(CLUSTER_NETWORK_IPV6_ANNOTATION, "fd00:10:128::/48"), (SERVICE_NETWORK_IPV6_ANNOTATION, "fd00:172:30::/112")],
        );
        c
    }

    /// [`hs`] with an IPv6 subnet annotation.
    fn hs6(host: &str, ip: &str, subnet: &str, subnet6: &str) -> KubeHostSubnet {
        KubeHostSubnet { metadata: meta(None, host, &[(SUBNET_IPV6_ANNOTATION, subnet6)]), ..hs(host, ip, subnet) }
    }

    /// A service with `spec.clusterIPs` (the first is `clusterIP`).
    fn svc_dual(ns: &str, name: &str, ips: &[&str], ports: &[(&str, i32)]) -> KubeService {
        let mut s = svc(ns, name, ips[0], ports);
        let spec = s.spec.as_mut().unwrap();
        spec.cluster_ips = Some(ips.iter().map(|s| s.to_string()).collect());
        spec.ip_families = Some(ips.iter().map(|s| if s.contains(':') { "IPv6" } else { "IPv4" }.to_string()).collect());
        s
    }

    fn hs(host: &str, ip: &str, subnet: &str) -> KubeHostSubnet {
        KubeHostSubnet { metadata: meta(None, host, &[]), host: host.into(), host_ip: ip.into(), subnet: subnet.into() }
    }

    fn nn(name: &str, netid: serde_json::Value, ann: &[(&str, &str)]) -> KubeNetNamespace {
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": ann.iter().cloned().collect::<BTreeMap<_, _>>()},
            "netname": name, "netid": netid}))
        .unwrap()
    }

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(&str, i32)]) -> KubeService {
        let ports: Vec<_> = ports.iter().map(|(p, n)| json!({"protocol": p, "port": n})).collect();
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": {"clusterIP": ip, "ports": ports}})).unwrap()
    }

    /// Objects listed from scratch (every kind listed once).
    fn listed(node: &str, list: Vec<(Id, Object)>) -> Objects {
        let mut o = Objects::new(node);
        for k in Kind::ALL {
            o.apply(Update::ListStart(k));
        }
        for (id, obj) in list {
            o.apply(Update::ListApply(id, obj));
        }
        for k in Kind::ALL {
            o.apply(Update::ListDone(k));
        }
        o
    }

    fn id(ns: &str, name: &str) -> Id {
        (ns.to_string(), name.to_string())
    }

    #[test]
    fn objects_convert_to_the_model() {
        let enp: EgressNetworkPolicy = serde_json::from_value(json!({"metadata": {"namespace": "team-a", "name": "default"},
            "spec": {"egress": [{"type": "Allow", "to": {"cidrSelector": "1.2.3.0/24"}}, {"type": "Deny", "to": {"dnsName": "example.com"}}]}}))
        .unwrap();
        let mut fixed = hs("node-b", "172.17.0.3", "10.129.0.0/23");
        fixed.metadata = meta(None, "node-b", &[(FIXED_VNID_ANNOTATION, "7")]);
        let list = vec![
            (id("", "default"), Object::ClusterNetwork(cluster_network(&cn("redhat/openshift-ovs-multitenant")))),
            (id("", "node-a"), Object::HostSubnet(host_subnet(&hs("node-a", "172.17.0.2", "10.128.2.0/23")))),
            (id("", "node-b"), Object::HostSubnet(host_subnet(&fixed))),
            (id("", "team-a"), Object::NetNamespace(net_namespace(&nn("team-a", json!(11), &[(MULTICAST_ANNOTATION, "true")])))),
            (id("", "default"), Object::NetNamespace(net_namespace(&nn("default", json!(0), &[])))),
            (id("", "bad"), Object::NetNamespace(net_namespace(&nn("bad", json!("x"), &[])))),
            (id("", "worse"), Object::NetNamespace(net_namespace(&nn("worse", json!({"a": [1]}), &[])))),
            (id("team-a", "web"), Object::Service(service(&svc("team-a", "web", "172.30.0.10", &[("TCP", 80), ("UDP", 53)])))),
            (id("team-a", "headless"), Object::Service(service(&svc("team-a", "headless", "None", &[])))),
            (id("team-a", "sctp"), Object::Service(service(&svc("team-a", "sctp", "172.30.0.11", &[("SCTP", 80), ("TCP", 0)])))),
            (id("team-a", "default"), Object::EgressPolicy(egress_policy(&enp))),
            (id("team-a", "a1"), Object::Pod(PodInfo { node: Some("node-a".into()), ..PodInfo::default() })),
            (id("team-a", "a2"), Object::Pod(PodInfo {
                node: Some("node-a".into()),
                ..pod_info(&meta(Some("team-a"), "a2", &[("kubernetes.io/ingress-bandwidth", "10M"), ("other", "x")]))
            })),
        ];
        let mut o = listed("node-a", list);
        let l = o.publish(None).unwrap().unwrap();
        assert!(l.touched.is_none());
        // CNI pods get their bandwidth from their Pod's annotations (only those are kept).
        assert_eq!(
            l.pod_annotations.get(&id("team-a", "a2")).map(|a| a.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>()),
            Some(vec!["kubernetes.io/ingress-bandwidth=10M".to_string()])
        );
        assert!(!l.pod_annotations.contains_key(&id("team-a", "a1")));
        assert_eq!(l.state.plugin, Plugin::Multitenant);
        assert_eq!(l.state.host_subnets[1].fixed_vnid.map(|v| v.get()), Some(7));
        assert_eq!(l.state.net_namespaces.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["default", "team-a"]);
        assert!(l.state.net_namespaces[1].multicast);
        assert_eq!(l.state.services.len(), 2, "headless skipped");
        assert_eq!(l.state.services[1].ports.len(), 2);
        assert_eq!(l.state.egress_policies[0].rules.len(), 2);
        assert!(l.live_pods.as_ref().unwrap().contains(&id("team-a", "a1")));
        let t: Vec<String> = l.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(t.len(), 4, "{t:?}");
        assert!(t[0].starts_with("netnamespace bad: field netid: invalid type: string \"x\""), "{t:?}");
        assert!(t[1].starts_with("netnamespace worse: field netid: invalid type: map"), "{t:?}");
        assert!(t[2].starts_with("service team-a/sctp: field ports[0].protocol: unhandled protocol \"SCTP\""), "{t:?}");
        assert!(t[3].starts_with("service team-a/sctp: field ports[1].port: 0 is not a port number"), "{t:?}");
        // Nothing changed: nothing to publish.
        assert!(o.publish(Some(&l)).is_none());
    }

    #[test]
    fn unknown_plugin_is_an_error() {
        let e = cluster_network(&cn("cni/other")).unwrap_err();
        assert!(e.contains("pluginName \"cni/other\""), "{e}");
        let mut o = listed("n", vec![]);
        assert_eq!(o.publish(None).unwrap().unwrap_err(), Unusable::NoClusterNetwork);
    }

    /// What is missing names the object and the node; a rejected HostSubnet names its field;
    /// the kinds not listed yet are known.
    #[test]
    fn what_is_waited_for_is_named() {
        let cnet =
            (id("", "default"), Object::ClusterNetwork(cluster_network(&cn("redhat/openshift-ovs-multitenant"))));
        let mut o = Objects::new("node-a");
        assert_eq!(o.unlisted().len(), Kind::ALL.len());
        assert!(o.publish(None).is_none());
        let w = listed("node-a", vec![]).publish(None).unwrap().unwrap_err();
        assert_eq!(w.reason(), "WaitingForClusterNetwork");
        assert_eq!(w.to_string(), "waiting for ClusterNetwork \"default\" (created by openshift-sdn's master or sdn-node controller: is it running?)");
        let other = (id("", "node-b"), Object::HostSubnet(host_subnet(&hs("node-b", "172.17.0.3", "10.129.0.0/23"))));
        let w = listed("node-a", vec![cnet.clone(), other.clone()]).publish(None).unwrap().unwrap_err();
        assert_eq!(w, Unusable::NoHostSubnet { node: "node-a".into() });
        assert_eq!(w.reason(), "WaitingForHostSubnet");
        assert_eq!(w.to_string(), "no HostSubnet for node node-a yet (created by sdn-node controller or openshift-sdn's master: is it running?)");
        // Rejected on its own (a bad subnet), or across objects (outside the cluster network).
        let bad = (id("", "node-a"), Object::HostSubnet(host_subnet(&hs("node-a", "172.17.0.2", "10.128.2.0/99"))));
        let w = listed("node-a", vec![cnet.clone(), other.clone(), bad]).publish(None).unwrap().unwrap_err();
        assert_eq!(w.reason(), "InvalidHostSubnet");
        let text = w.to_string();
        assert!(
            text.starts_with("waiting for a valid HostSubnet for node node-a: hostsubnet node-a: field subnet"),
            "{text}"
        );
        let outside =
            (id("", "node-a"), Object::HostSubnet(host_subnet(&hs("node-a", "172.17.0.2", "192.168.0.0/23"))));
        let w = listed("node-a", vec![cnet.clone(), other, outside]).publish(None).unwrap().unwrap_err();
        let text = w.to_string();
        assert!(
            text.starts_with("waiting for a valid HostSubnet for node node-a: hostsubnet node-a: field subnet: 192.168.0.0/23 is outside the cluster network"),
            "{text}"
        );
        let w = listed("node-a", vec![(id("", "default"), Object::ClusterNetwork(cluster_network(&cn("cni/other"))))])
            .publish(None)
            .unwrap()
            .unwrap_err();
        assert_eq!(w.reason(), "InvalidClusterNetwork");
        assert!(
            w.to_string().starts_with(
                "waiting for a usable ClusterNetwork \"default\": pluginName \"cni/other\" is not handled"
            ),
            "{w}"
        );
        // Listing: the kinds not listed yet.
        o.apply(Update::ListDone(Kind::ClusterNetwork));
        assert!(!o.unlisted().contains(&Kind::ClusterNetwork) && o.unlisted().contains(&Kind::HostSubnet));
    }

    /// Dual-stack objects reach the state with their IPv6 side: ClusterNetwork's annotations,
    /// a HostSubnet's IPv6 subnet annotation, a Service's clusterIPs, pods' podIPs; bad IPv6
    /// values are problems naming the object and the field.
    #[test]
    fn dual_stack_objects_reach_the_state() {
        let c = cluster_network(&cn6("redhat/openshift-ovs-networkpolicy")).unwrap();
        assert_eq!(c.cluster_network6, Some("fd00:10:128::/48".parse().unwrap()));
        assert_eq!(c.service_network6, Some("fd00:172:30::/112".parse().unwrap()));
        let p = |ns: &str, name: &str, node: &str, ips: &[&str]| {
            let mut k = kpod(ns, name, node, ips[0], json!({"app": "client"}));
            k.status.as_mut().unwrap().pod_ips =
                Some(ips.iter().map(|ip| k8s_openapi::api::core::v1::PodIP { ip: ip.to_string() }).collect());
            (id(ns, name), Object::Pod(pod(&k)))
        };
        let bad6 = hs6("node-c", "172.17.0.4", "10.130.0.0/23", "10.0.0.0/64");
        let list = vec![
            (id("", "default"), Object::ClusterNetwork(Ok(c.clone()))),
            (id("", "node-a"), Object::HostSubnet(host_subnet(&hs6("node-a", "172.17.0.2", "10.128.2.0/23", "fd00:10:128:2::/64")))),
            (id("", "node-b"), Object::HostSubnet(host_subnet(&hs6("node-b", "172.17.0.3", "10.129.0.0/23", "fd00:10:128:1::/64")))),
            (id("", "node-c"), Object::HostSubnet(host_subnet(&bad6))),
            (id("", "team-a"), Object::NetNamespace(net_namespace(&nn("team-a", json!(11), &[])))),
            (id("team-a", "web"), Object::Service(service(&svc_dual("team-a", "web", &["172.30.0.10", "fd00:172:30::10"], &[("TCP", 80)])))),
            // Families in either order; clusterIP is the first.
            (id("team-a", "six-first"), Object::Service(service(&svc_dual("team-a", "six-first", &["fd00:172:30::11", "172.30.0.11"], &[("TCP", 80)])))),
            (id("team-a", "headless"), Object::Service(service(&svc_dual("team-a", "headless", &["None"], &[])))),
            (id("team-a", "only6"), Object::Service(service(&svc_dual("team-a", "only6", &["fd00:172:30::12"], &[("TCP", 80)])))),
            p("team-a", "b1", "node-b", &["10.129.0.5", "fd00:10:128:1::5"]),
            p("team-a", "b2", "node-b", &["fd00:10:128:1::6", "10.129.0.6"]),
            p("team-a", "a1", "node-a", &["10.128.2.5", "fd00:10:128:2::5"]),
        ];
        let mut o = listed("node-a", list);
        let l = o.publish(None).unwrap().unwrap();
        let st = &l.state;
        assert_eq!((st.cluster_network6, st.service_network6), (c.cluster_network6, c.service_network6));
        let subnet6 = |host: &str| st.host_subnets.iter().find(|h| h.host == host).and_then(|h| h.subnet6).map(|s| s.to_string());
        assert_eq!(subnet6("node-a").as_deref(), Some("fd00:10:128:2::/64"));
        assert_eq!(subnet6("node-b").as_deref(), Some("fd00:10:128:1::/64"));
        // A bad annotation: the IPv6 subnet is left out, the IPv4 one stays.
        assert_eq!(subnet6("node-c"), None);
        assert!(st.host_subnets.iter().any(|h| h.host == "node-c" && h.subnet == Some("10.130.0.0/23".parse().unwrap())));
        let svc6 = |name: &str| st.services.iter().find(|s| s.name == name).map(|s| (s.cluster_ip.map(|i| i.to_string()), s.cluster_ip6.map(|i| i.to_string())));
        assert_eq!(svc6("web"), Some((Some("172.30.0.10".into()), Some("fd00:172:30::10".into()))));
        assert_eq!(svc6("six-first"), Some((Some("172.30.0.11".into()), Some("fd00:172:30::11".into()))));
        assert_eq!(svc6("headless"), None);
        // An IPv6 single-stack Service of a dual-stack cluster (ipFamilies [IPv6]): its one
        // cluster IP is served.
        assert_eq!(svc6("only6"), Some((None, Some("fd00:172:30::12".into()))));
        let remote = |name: &str| st.remote_pods.iter().find(|r| r.name == name).map(|r| (r.ip.map(|i| i.to_string()).unwrap_or_default(), r.ip6.map(|i| i.to_string())));
        assert_eq!(remote("b1"), Some(("10.129.0.5".into(), Some("fd00:10:128:1::5".into()))));
        assert_eq!(remote("b2"), Some(("10.129.0.6".into(), Some("fd00:10:128:1::6".into()))));
        let t: Vec<String> = l.problems.iter().map(|p| p.to_string()).collect();
        assert!(
            t.contains(&format!("hostsubnet node-c: field metadata.annotations[{SUBNET_IPV6_ANNOTATION}]: \"10.0.0.0/64\" is not an IPv6 CIDR; the node's IPv6 subnet is left out")),
            "{t:?}"
        );
        assert_eq!(t.len(), 1, "{t:?}");

        // An IPv6 change alone is tracked: a pod's IPv6 address, a service's IPv6 cluster IP.
        o.apply(p("team-a", "b1", "node-b", &["10.129.0.5", "fd00:10:128:1::7"]).into_update());
        let l2 = o.publish(Some(&l)).unwrap().unwrap();
        assert_eq!(remote_of(&l2, "b1").as_deref(), Some("fd00:10:128:1::7"));
        assert!(l2.touched.is_some());
        let s = svc_dual("team-a", "web", &["172.30.0.10", "fd00:172:30::20"], &[("TCP", 80)]);
        o.apply(Update::Apply(id("team-a", "web"), Object::Service(service(&s))));
        let l3 = o.publish(Some(&l2)).unwrap().unwrap();
        let touched = l3.touched.clone().unwrap();
        assert!(touched.contains(&Owner::Service { namespace: "team-a".into(), name: "web".into() }), "{touched:?}");
        // Another node's IPv6 subnet changes: its owner only.
        o.apply(Update::Apply(id("", "node-b"), Object::HostSubnet(host_subnet(&hs6("node-b", "172.17.0.3", "10.129.0.0/23", "fd00:10:128:3::/64")))));
        let l4 = o.publish(Some(&l3)).unwrap().unwrap();
        assert!(l4.touched.as_ref().unwrap().contains(&Owner::HostSubnet { host: "node-b".into() }), "{:?}", l4.touched);

        // Without IPv6 networks in the ClusterNetwork, the IPv6 side is left out (the IPv4
        // side stays), not a reason to reject pods and services.
        o.apply(Update::Apply(id("", "default"), Object::ClusterNetwork(cluster_network(&cn("redhat/openshift-ovs-networkpolicy")))));
        let l5 = o.publish(Some(&l4)).unwrap().unwrap();
        assert_eq!(l5.state.cluster_network6, None);
        assert!(l5.state.services.iter().any(|s| s.name == "web" && s.cluster_ip6.is_none()));
        assert!(l5.state.remote_pods.iter().all(|r| r.ip6.is_none()) && l5.state.remote_pods.len() == 2);
        assert!(l5.state.host_subnets.iter().all(|h| h.subnet6.is_none()));
    }

    fn remote_of(l: &Loaded, name: &str) -> Option<String> {
        l.state.remote_pods.iter().find(|r| r.name == name).and_then(|r| r.ip6).map(|i| i.to_string())
    }

    trait IntoUpdate {
        fn into_update(self) -> Update;
    }

    impl IntoUpdate for (Id, Object) {
        fn into_update(self) -> Update {
            Update::Apply(self.0, self.1)
        }
    }

    /// A bad IPv6 network in ClusterNetwork "default" names its annotation; one IPv6 network
    /// without the other is refused.
    #[test]
    fn bad_ipv6_cluster_networks_name_the_annotation() {
        let mut c = cn6("redhat/openshift-ovs-subnet");
        c.metadata.annotations.as_mut().unwrap().insert(CLUSTER_NETWORK_IPV6_ANNOTATION.into(), "fd00::/200".into());
        let e = cluster_network(&c).unwrap_err();
        assert_eq!(e, format!("ClusterNetwork \"default\": field metadata.annotations[{CLUSTER_NETWORK_IPV6_ANNOTATION}]: \"fd00::/200\" is not an IPv6 CIDR"));
        c.metadata.annotations.as_mut().unwrap().remove(CLUSTER_NETWORK_IPV6_ANNOTATION);
        let e = cluster_network(&c).unwrap_err();
        assert!(e.contains("or neither"), "{e}");
        let w = listed("node-a", vec![(id("", "default"), Object::ClusterNetwork(cluster_network(&c)))]).publish(None).unwrap().unwrap_err();
        assert_eq!(w.reason(), "InvalidClusterNetwork");
        // This node's HostSubnet with an IPv6 subnet outside the IPv6 cluster network: the
        // node keeps its IPv4 subnet, with a problem (the model's rule).
        let list = vec![
            (id("", "default"), Object::ClusterNetwork(cluster_network(&cn6("redhat/openshift-ovs-subnet")))),
            (id("", "node-a"), Object::HostSubnet(host_subnet(&hs6("node-a", "172.17.0.2", "10.128.2.0/23", "fd00:99::/64")))),
        ];
        let l = listed("node-a", list).publish(None).unwrap().unwrap();
        assert_eq!(l.state.local_subnet().unwrap().subnet6, None);
        let t: Vec<String> = l.problems.iter().map(|p| p.to_string()).collect();
        assert!(t.iter().any(|p| p.starts_with("hostsubnet node-a: field subnets: fd00:99::/64 is outside the cluster network")), "{t:?}");
    }

    fn kpod(ns: &str, name: &str, node: &str, ip: &str, labels: serde_json::Value) -> KubePod {
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"podIP": ip, "phase": "Running"}}))
        .unwrap()
    }

    fn kns(name: &str, labels: serde_json::Value) -> KubeNamespace {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn knp(ns: &str, name: &str, spec: serde_json::Value) -> KubeNetworkPolicy {
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap()
    }

    fn netpol_objects(plugin: &str) -> Objects {
        let list = vec![
            (id("", "default"), Object::ClusterNetwork(cluster_network(&cn(plugin)))),
            (id("", "node-a"), Object::HostSubnet(host_subnet(&hs("node-a", "172.17.0.2", "10.128.2.0/23")))),
            (id("", "node-b"), Object::HostSubnet(host_subnet(&hs("node-b", "172.17.0.3", "10.129.0.0/23")))),
            (id("", "team-a"), Object::NetNamespace(net_namespace(&nn("team-a", json!(11), &[])))),
            (id("", "team-b"), Object::NetNamespace(net_namespace(&nn("team-b", json!(12), &[])))),
            (id("", "team-a"), Object::Namespace(namespace_labels(&kns("team-a", json!({"env": "prod"}))))),
            (id("", "team-b"), Object::Namespace(namespace_labels(&kns("team-b", json!({}))))),
            (id("team-a", "a1"), Object::Pod(pod(&kpod("team-a", "a1", "node-a", "10.128.2.5", json!({"app": "web"}))))),
            (id("team-b", "b1"), Object::Pod(pod(&kpod("team-b", "b1", "node-b", "10.129.0.5", json!({"app": "client"}))))),
            (
                id("team-a", "web"),
                Object::NetworkPolicy(network_policy(&knp(
                    "team-a",
                    "web",
                    json!({"podSelector": {"matchLabels": {"app": "web"}},
                        "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": "http"}]}]}),
                ))),
            ),
            (
                id("team-a", "bad"),
                Object::NetworkPolicy(network_policy(&knp(
                    "team-a",
                    "bad",
                    json!({"podSelector": {"matchExpressions": [{"key": "x", "operator": "Near"}]}}),
                ))),
            ),
        ];
        listed("node-a", list)
    }

    /// Policies carry the generation and arrival of the watch event that brought their
    /// generation; a repeated generation keeps its first arrival, and a new generation whose
    /// converted policy is the same still touches the namespace (a no-op commit realizes it).
    #[test]
    fn policies_are_stamped_with_their_generation_and_event() {
        use std::time::{Duration, Instant};
        let mut o = netpol_objects("redhat/openshift-ovs-networkpolicy");
        let l = o.publish(None).unwrap().unwrap();
        let (t1, t2, t3) = (Instant::now(), Instant::now() + Duration::from_millis(1), Instant::now() + Duration::from_millis(2));
        let web = |spec| Update::Apply(id("team-a", "web"), Object::NetworkPolicy(network_policy(&knp("team-a", "web", spec))));
        let deny = json!({"podSelector": {"matchLabels": {"app": "web"}}});
        o.apply_seen(web(deny.clone()), Some((Some(2), t1)));
        let l2 = o.publish(Some(&l)).unwrap().unwrap();
        let seen = |l: &Loaded| l.policies_seen.get(&id("team-a", "web")).copied();
        assert_eq!(seen(&l2), Some(crate::cluster::PolicySeen { generation: 2, at: t1 }));
        let team_a = Some(vec![Owner::NetworkPolicy { namespace: "team-a".into() }]);
        assert_eq!(l2.touched, team_a);
        o.apply_seen(web(deny.clone()), Some((Some(2), t2)));
        assert!(o.publish(Some(&l2)).is_none(), "the same generation again: nothing new");
        o.apply_seen(web(deny), Some((Some(3), t3)));
        let l3 = o.publish(Some(&l2)).unwrap().unwrap();
        assert_eq!(seen(&l3), Some(crate::cluster::PolicySeen { generation: 3, at: t3 }));
        assert_eq!(l3.touched, team_a, "a new generation with the same rules is still recomputed");
        o.apply_seen(Update::Delete(Kind::NetworkPolicy, id("team-a", "web")), None);
        let l4 = o.publish(Some(&l3)).unwrap().unwrap();
        assert_eq!(seen(&l4), None);
    }

    #[test]
    fn networkpolicy_plugin_objects_reach_the_state() {
        assert_eq!(plugin("redhat/openshift-ovs-networkpolicy"), Some(Plugin::NetworkPolicy));
        let mut o = netpol_objects("redhat/openshift-ovs-networkpolicy");
        let l = o.publish(None).unwrap().unwrap();
        let st = &l.state;
        assert_eq!(st.plugin, Plugin::NetworkPolicy);
        // Namespace labels, with the name label.
        let a = st.net_namespaces.iter().find(|n| n.name == "team-a").unwrap();
        assert_eq!(a.labels.get("env").map(String::as_str), Some("prod"));
        assert_eq!(a.labels.get(netpol::NAMESPACE_NAME_LABEL).map(String::as_str), Some("team-a"));
        // The bad policy is checked as in a state file: its selector is dropped, with a problem.
        assert_eq!(st.network_policies.len(), 2);
        let t: Vec<String> = l.problems.iter().map(|p| p.to_string()).collect();
        assert!(t.iter().any(|p| p.starts_with("networkpolicy team-a/bad: field spec.podSelector.matchExpressions[0].operator")), "{t:?}");
        // The other node's pod is a peer; this node's pod is live, with its labels and ports.
        assert_eq!(st.remote_pods.len(), 1);
        assert_eq!(st.remote_pods[0].ip, Some("10.129.0.5".parse::<Ipv4Addr>().unwrap()));
        assert_eq!(st.remote_pods[0].labels.get("app").map(String::as_str), Some("client"));
        assert!(l.live_pods.as_ref().unwrap().contains(&id("team-a", "a1")));
        assert!(!l.live_pods.as_ref().unwrap().contains(&id("team-b", "b1")));
        let meta = st.pod_meta.get(&id("team-a", "a1")).unwrap();
        assert_eq!(meta.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(meta.container_ports[0].name.as_deref(), Some("http"));
        assert_eq!(meta.container_ports[0].port, 8080);

        // A CNI pod (no labels of its own) is selected through the source's labels: the
        // policy isolates it and resolves its named port.
        let mut eff = st.clone();
        let raw = validate::RawPod {
            ips: Vec::new(),
            namespace: "team-a".into(),
            name: "a1".into(),
            container_id: "ab".repeat(32),
            host_veth: "veth1".into(),
            ip: "10.128.2.5".into(),
            mac: "0a:58:0a:80:02:05".into(),
            ingress_bps: 0,
            egress_bps: 0,
            internal: false,
        };
        eff.pods.push(validate::pod(raw).unwrap());
        let view = netpol::View::new(&eff);
        let (isolated, _) = netpol::isolation(&eff, &view, "team-a");
        assert_eq!(isolated.isolated.len(), 1, "{isolated:?}");
        let text = format!("{:?}", isolated.rules);
        assert!(text.contains("10.129.0.5") && text.contains("8080"), "{text}");

        // A pod label change, a namespace label change, a policy change: team-a's policies
        // alone are recomputed (team-b has none; team-a's peer takes every namespace).
        let team_a = Some(vec![Owner::NetworkPolicy { namespace: "team-a".into() }]);
        o.apply(Update::Apply(id("team-b", "b1"), Object::Pod(pod(&kpod("team-b", "b1", "node-b", "10.129.0.5", json!({"app": "other"}))))));
        let l2 = o.publish(Some(&l)).unwrap().unwrap();
        assert_eq!(l2.touched, team_a);
        assert!(l2.state.remote_pods[0].labels.get("app").is_some_and(|v| v == "other"));
        o.apply(Update::Apply(id("", "team-b"), Object::Namespace(namespace_labels(&kns("team-b", json!({"env": "dev"}))))));
        let l3 = o.publish(Some(&l2)).unwrap().unwrap();
        assert_eq!(l3.touched, team_a);
        o.apply(Update::Delete(Kind::NetworkPolicy, id("team-a", "bad")));
        let l4 = o.publish(Some(&l3)).unwrap().unwrap();
        assert_eq!(l4.touched, team_a);
        assert_eq!(l4.state.network_policies.len(), 1);
        // This node's pod's labels change.
        o.apply(Update::Apply(id("team-a", "a1"), Object::Pod(pod(&kpod("team-a", "a1", "node-a", "10.128.2.5", json!({"app": "db"}))))));
        let l5 = o.publish(Some(&l4)).unwrap().unwrap();
        assert_eq!(l5.touched, team_a);
        assert_eq!(l5.state.pod_meta[&id("team-a", "a1")].labels.get("app").map(String::as_str), Some("db"));
        // The pod is deleted: gone from the live pods and the labels.
        o.apply(Update::Delete(Kind::Pod, id("team-a", "a1")));
        let l6 = o.publish(Some(&l5)).unwrap().unwrap();
        assert!(!l6.live_pods.as_ref().unwrap().contains(&id("team-a", "a1")));
        assert!(l6.state.pod_meta.is_empty());
        let t6 = l6.touched.unwrap();
        assert!(t6.contains(&Owner::Pod { namespace: "team-a".into(), name: "a1".into() }), "{t6:?}");
        assert!(t6.contains(&Owner::NetworkPolicy { namespace: "team-a".into() }), "{t6:?}");
    }

    #[test]
    fn other_plugins_leave_the_networkpolicy_objects_out() {
        let mut o = netpol_objects("redhat/openshift-ovs-multitenant");
        let l = o.publish(None).unwrap().unwrap();
        assert!(l.state.network_policies.is_empty() && l.state.remote_pods.is_empty() && l.state.pod_meta.is_empty());
        assert!(l.state.net_namespaces.iter().all(|n| n.labels.is_empty()));
        assert!(l.problems.is_empty(), "{:?}", l.problems);
        // Their changes publish nothing.
        o.apply(Update::Apply(id("team-b", "b1"), Object::Pod(pod(&kpod("team-b", "b1", "node-b", "10.129.0.5", json!({"app": "other"}))))));
        o.apply(Update::Apply(id("", "team-b"), Object::Namespace(namespace_labels(&kns("team-b", json!({"env": "dev"}))))));
        assert!(o.publish(Some(&l)).is_none());
    }

    /// Unwatched kinds are not waited for and leave no objects; a kind watched again (another
    /// pod selector) holds publishing back until it has listed.
    #[test]
    fn only_watched_kinds_are_waited_for() {
        let mut o = Objects::new("node-a");
        o.unwatch(Kind::NetworkPolicy);
        o.unwatch(Kind::Namespace);
        let scoped = [Kind::NetworkPolicy, Kind::Namespace];
        for k in Kind::ALL.into_iter().filter(|k| !scoped.contains(k)) {
            o.apply(Update::ListStart(k));
        }
        o.apply(Update::ListApply(id("", "default"), Object::ClusterNetwork(cluster_network(&cn("redhat/openshift-ovs-networkpolicy")))));
        o.apply(Update::ListApply(id("", "node-a"), Object::HostSubnet(host_subnet(&hs("node-a", "172.17.0.2", "10.128.2.0/23")))));
        for k in Kind::ALL.into_iter().filter(|k| !scoped.contains(k)) {
            assert!(!o.ready());
            o.apply(Update::ListDone(k));
        }
        assert!(o.ready());
        assert_eq!(o.plugin(), Some(Plugin::NetworkPolicy));
        let l = o.publish(None).unwrap().unwrap();
        // The plugin wants the policies: they are waited for once watched.
        o.watch(Kind::NetworkPolicy);
        o.apply(Update::ListStart(Kind::NetworkPolicy));
        o.apply(Update::ListApply(id("ns", "p"), Object::NetworkPolicy(network_policy(&knp("ns", "p", json!({"podSelector": {}}))))));
        assert!(!o.ready() && o.publish(Some(&l)).is_none());
        o.apply(Update::ListDone(Kind::NetworkPolicy));
        assert!(o.ready());
        assert_eq!(o.live.network_policies.items.len(), 1);
        // Unwatched again: the objects go.
        o.unwatch(Kind::NetworkPolicy);
        assert!(o.ready() && o.live.network_policies.items.is_empty());
    }

    #[test]
    fn pods_convert_to_what_is_used() {
        let p = pod(&kpod("ns", "p", "node-b", "10.129.0.9", json!({"a": "b"})));
        assert_eq!(p.node.as_deref(), Some("node-b"));
        assert_eq!(p.ip, Some("10.129.0.9".parse().unwrap()));
        let host: KubePod = serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": "h"},
            "spec": {"nodeName": "node-b", "hostNetwork": true, "containers": []}, "status": {"podIP": "172.17.0.3"}}))
        .unwrap();
        assert_eq!(pod(&host).ip, None, "host-network pods are not peers");
        let done: KubePod = serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": "d"},
            "spec": {"nodeName": "node-b", "containers": []}, "status": {"podIP": "10.129.0.10", "phase": "Succeeded"}}))
        .unwrap();
        assert_eq!(pod(&done).ip, None, "finished pods' IPs may be reused");
    }

    /// One random change to a small cluster (collisions of cluster IPs and subnets on purpose).
    #[derive(Clone, Debug)]
    enum Ev {
        /// `ip6` 3: IPv4 only.
        Service { name: u8, ns: u8, ip: u8, ip6: u8, port: u16, delete: bool },
        /// `subnet6` 4: no IPv6 subnet.
        HostSubnet { host: u8, subnet: u8, subnet6: u8, delete: bool },
        Egress { ns: u8, deny: bool, delete: bool },
        PodGone { name: u8 },
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            (0..6u8, 0..3u8, 0..5u8, 0..4u8, 1..4u16, any::<bool>())
                .prop_map(|(name, ns, ip, ip6, port, delete)| Ev::Service { name, ns, ip, ip6, port, delete }),
            (0..5u8, 0..6u8, 0..5u8, any::<bool>())
                .prop_map(|(host, subnet, subnet6, delete)| Ev::HostSubnet { host, subnet, subnet6, delete }),
            (0..3u8, any::<bool>(), any::<bool>()).prop_map(|(ns, deny, delete)| Ev::Egress { ns, deny, delete }),
            (0..3u8).prop_map(|name| Ev::PodGone { name }),
        ]
    }

    fn base_objects() -> Objects {
        let mut list = vec![
            (id("", "default"), Object::ClusterNetwork(cluster_network(&cn6("redhat/openshift-ovs-multitenant")))),
            (id("", "node-a"), Object::HostSubnet(host_subnet(&hs6("node-a", "172.17.0.2", "10.128.2.0/23", "fd00:10:128:2::/64")))),
        ];
        for (i, n) in ["ns0", "ns1", "ns2"].iter().enumerate() {
            // ns0 and ns2 share a VNID.
            let vnid = [10, 11, 10][i];
            list.push((id("", n), Object::NetNamespace(net_namespace(&nn(n, json!(vnid), &[])))));
        }
        for p in 0..3 {
            list.push((id(&format!("ns{p}"), &format!("p{p}")), Object::Pod(PodInfo { node: Some("node-a".into()), ..PodInfo::default() })));
        }
        listed("node-a", list)
    }

    fn update(e: &Ev) -> Update {
        match *e {
            Ev::Service { name, ns, ip, ip6, port, delete } => {
                let i = id(&format!("ns{ns}"), &format!("s{name}"));
                if delete {
                    return Update::Delete(Kind::Service, i);
                }
                let v4 = format!("172.30.0.{}", 10 + ip);
                let v6 = format!("fd00:172:30::{}", 10 + ip6);
                let ips: Vec<&str> = if ip6 == 3 { vec![&v4] } else { vec![&v4, &v6] };
                let s = svc_dual(&i.0, &i.1, &ips, &[("TCP", port as i32)]);
                Update::Apply(i, Object::Service(service(&s)))
            }
            Ev::HostSubnet { host, subnet, subnet6, delete } => {
                let name = format!("node-{}", (b'b' + host) as char);
                if delete {
                    return Update::Delete(Kind::HostSubnet, id("", &name));
                }
                // /23s that overlap each other (and, for 5, this node's 10.128.2.0/23).
                let net = ["10.129.0.0/23", "10.129.0.0/24", "10.129.2.0/23", "10.129.4.0/23", "10.130.0.0/23", "10.128.2.0/24"][subnet as usize];
                // IPv6 subnets that overlap each other and (3) this node's.
                let net6 = ["fd00:10:128:10::/64", "fd00:10:128:10::/63", "fd00:10:128:11::/64", "fd00:10:128:2::/64", ""][subnet6 as usize];
                Update::Apply(id("", &name), Object::HostSubnet(host_subnet(&hs6(&name, &format!("172.17.1.{host}"), net, net6))))
            }
            Ev::Egress { ns, deny, delete } => {
                let i = id(&format!("ns{ns}"), "default");
                if delete {
                    return Update::Delete(Kind::EgressNetworkPolicy, i);
                }
                let kind = if deny { "Deny" } else { "Allow" };
                let p: EgressNetworkPolicy = serde_json::from_value(json!({"metadata": {"namespace": i.0, "name": i.1},
                    "spec": {"egress": [{"type": kind, "to": {"cidrSelector": "1.2.3.0/24"}}]}}))
                .unwrap();
                Update::Apply(i, Object::EgressPolicy(egress_policy(&p)))
            }
            Ev::PodGone { name } => Update::Delete(Kind::Pod, id(&format!("ns{name}"), &format!("p{name}"))),
        }
    }

    /// The flows by owner, with the node's pods that were set up through the pod API (`set_up`)
    /// and are still live at fixed ofports (a pod that arrives in the cluster has no flows
    /// before its pod API request; one that left was torn down).
    fn flows(l: &Loaded, set_up: &BTreeSet<PodKey>) -> BTreeMap<Owner, Vec<String>> {
        let mut state = l.state.clone();
        let mut ofports = HashMap::new();
        for (ns, name) in l.live_pods.iter().flatten().filter(|k| set_up.contains(*k)) {
            // Stable per pod (pN): another pod's departure must not move it.
            let i: usize = name[1..].parse().unwrap();
            let ip = format!("10.128.2.{}", 10 + i);
            let mac = format!("0a:58:0a:80:02:{:02x}", 10 + i);
            let raw = validate::RawPod {
                ips: Vec::new(),
                namespace: ns.clone(),
                name: name.clone(),
                container_id: "ab".repeat(32),
                host_veth: format!("veth{i}"),
                ip,
                mac,
                ingress_bps: 0,
                egress_bps: 0,
                internal: false,
            };
            state.pods.push(validate::pod(raw).unwrap());
            ofports.insert((ns.clone(), name.clone()), crate::domain::OfPort(3 + i as u32));
        }
        let (d, _) = desired_state(&state, &ofports, &DnsAnswers::new());
        let mut m: BTreeMap<Owner, Vec<String>> = BTreeMap::new();
        for (o, f) in d.iter() {
            m.entry(o.clone()).or_default().push(f.to_string());
        }
        m.values_mut().for_each(|v| v.sort());
        m
    }

    /// Applies each batch and publishes; every owner whose flows changed must be in `touched`
    /// (or `touched` is `None`). Returns how many NetworkPolicy owners changed under a `Some`
    /// touched set (so a test can show the property was exercised).
    fn check_touched(mut o: Objects, batches: &[Vec<Update>]) -> Result<usize, String> {
        let mut last = o.publish(None).unwrap().unwrap();
        let mut set_up = last.live_pods.clone().unwrap_or_default();
        let mut netpol_changes = 0;
        for batch in batches {
            for u in batch {
                o.apply(u.clone());
            }
            let Some(next) = o.publish(Some(&last)) else { continue };
            let Ok(next) = next else { continue };
            let before = flows(&last, &set_up);
            set_up.retain(|k| next.live_pods.as_ref().is_some_and(|l| l.contains(k)));
            if let Some(touched) = &next.touched {
                let after = flows(&next, &set_up);
                for owner in before.keys().chain(after.keys()).collect::<BTreeSet<_>>() {
                    if before.get(owner) != after.get(owner) {
                        if !touched.contains(owner) {
                            return Err(format!("{owner} changed but is not in {touched:?} after {batch:?}"));
                        }
                        netpol_changes += matches!(owner, Owner::NetworkPolicy { .. }) as usize;
                    }
                }
            }
            last = next;
        }
        Ok(netpol_changes)
    }

    /// One random change to a small networkpolicy cluster: policies of several shapes, namespace
    /// labels, pods here and on node-b (their IPs collide on purpose).
    #[derive(Clone, Debug)]
    enum NpEv {
        Policy { ns: u8, name: u8, shape: u8, delete: bool },
        NsLabels { ns: u8, team: u8, delete: bool },
        Pod { name: u8, local: bool, app: u8, ip: u8, delete: bool },
    }

    fn np_ev() -> impl Strategy<Value = NpEv> {
        prop_oneof![
            (0..3u8, 0..2u8, 0..6u8, any::<bool>()).prop_map(|(ns, name, shape, delete)| NpEv::Policy { ns, name, shape, delete }),
            (0..3u8, 0..4u8, proptest::bool::weighted(0.2)).prop_map(|(ns, team, delete)| NpEv::NsLabels { ns, team, delete }),
            (0..6u8, any::<bool>(), 0..3u8, 0..5u8, proptest::bool::weighted(0.2))
                .prop_map(|(name, local, app, ip, delete)| NpEv::Pod { name, local, app, ip, delete }),
        ]
    }

    fn np_spec(shape: u8) -> serde_json::Value {
        match shape {
            0 => json!({"podSelector": {"matchLabels": {"app": "a0"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a1"}}}], "ports": [{"port": "http"}]}]}),
            1 => json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "t1"}}}]}]}),
            2 => json!({"podSelector": {"matchLabels": {"app": "a1"}}, "ingress": [{"from": [{
                    "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["t2"]}]},
                    "podSelector": {"matchLabels": {"app": "a0"}}}]}]}),
            3 => json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
            4 => json!({"podSelector": {}, "ingress": []}),
            _ => json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [{"from": [{"ipBlock": {"cidr": "10.129.0.0/16"}}]}]}),
        }
    }

    /// Pod pN lives in namespace ns(N mod 3); here or on node-b; IP index 4 = no IP yet. Its
    /// IPv6 address collides with other pods' differently from its IPv4 one.
    fn np_pod(name: u8, local: bool, app: u8, ip: u8) -> (Id, Object) {
        let ns = format!("ns{}", name % 3);
        let i6 = (name + ip) % 4;
        let (node, ip, ip6) = match (local, ip) {
            (_, 4) => (if local { "node-a" } else { "node-b" }, String::new(), String::new()),
            (true, i) => ("node-a", format!("10.128.2.{}", 10 + i), format!("fd00:10:128:2::{}", 10 + i6)),
            (false, i) => ("node-b", format!("10.129.0.{}", 10 + i), format!("fd00:10:128:1::{}", 10 + i6)),
        };
        let mut p = kpod(&ns, &format!("p{name}"), node, &ip, json!({"app": format!("a{app}")}));
        if !ip6.is_empty() {
            p.status.as_mut().unwrap().pod_ips = Some(
                [&ip, &ip6].iter().map(|ip| k8s_openapi::api::core::v1::PodIP { ip: ip.to_string() }).collect(),
            );
        }
        (id(&ns, &format!("p{name}")), Object::Pod(pod(&p)))
    }

    fn np_update(e: &NpEv) -> Update {
        match *e {
            NpEv::Policy { ns, name, shape, delete } => {
                let i = id(&format!("ns{ns}"), &format!("np{name}"));
                if delete {
                    return Update::Delete(Kind::NetworkPolicy, i);
                }
                Update::Apply(i.clone(), Object::NetworkPolicy(network_policy(&knp(&i.0, &i.1, np_spec(shape)))))
            }
            NpEv::NsLabels { ns, team, delete } => {
                let name = format!("ns{ns}");
                if delete {
                    return Update::Delete(Kind::Namespace, id("", &name));
                }
                let labels = if team == 3 { json!({}) } else { json!({"team": format!("t{team}")}) };
                Update::Apply(id("", &name), Object::Namespace(namespace_labels(&kns(&name, labels))))
            }
            NpEv::Pod { name, local, app, ip, delete } => {
                let (i, obj) = np_pod(name, local, app, ip);
                if delete {
                    return Update::Delete(Kind::Pod, i);
                }
                Update::Apply(i, obj)
            }
        }
    }

    fn np_base_objects() -> Objects {
        let mut list = vec![
            (id("", "default"), Object::ClusterNetwork(cluster_network(&cn6("redhat/openshift-ovs-networkpolicy")))),
            (id("", "node-a"), Object::HostSubnet(host_subnet(&hs6("node-a", "172.17.0.2", "10.128.2.0/23", "fd00:10:128:2::/64")))),
            (id("", "node-b"), Object::HostSubnet(host_subnet(&hs6("node-b", "172.17.0.3", "10.129.0.0/23", "fd00:10:128:1::/64")))),
        ];
        for (i, team) in ["t0", "t1", "t0"].iter().enumerate() {
            let n = format!("ns{i}");
            // ns0 and ns2 share a VNID: a selector taking one of them goes pod by pod.
            list.push((id("", &n), Object::NetNamespace(net_namespace(&nn(&n, json!([10, 11, 10][i]), &[])))));
            list.push((id("", &n), Object::Namespace(namespace_labels(&kns(&n, json!({"team": team}))))));
        }
        for p in 0..3 {
            list.push(np_pod(p, true, p % 2, p));
        }
        list.push(np_pod(3, false, 1, 0));
        list.push((id("ns0", "np0"), Object::NetworkPolicy(network_policy(&knp("ns0", "np0", np_spec(0))))));
        list.push((id("ns1", "np0"), Object::NetworkPolicy(network_policy(&knp("ns1", "np0", np_spec(2))))));
        listed("node-a", list)
    }

    /// The property is not vacuous: each kind of networkpolicy event changes some NetworkPolicy
    /// owner's flows through the incremental path (and the property holds for them).
    #[test]
    fn touched_check_sees_netpol_changes() {
        let kinds: [Vec<NpEv>; 3] = [
            vec![NpEv::Policy { ns: 2, name: 0, shape: 1, delete: false }, NpEv::Policy { ns: 0, name: 0, shape: 0, delete: true }],
            // ns1's policy takes app=a0 pods of namespaces without team=t2: relabel ns0.
            vec![NpEv::NsLabels { ns: 0, team: 2, delete: false }],
            // A pod labelled app=a1 on node-b in ns0: ns0's policy now allows it.
            vec![NpEv::Pod { name: 3, local: false, app: 1, ip: 1, delete: false }, NpEv::Pod { name: 3, local: false, app: 2, ip: 1, delete: false }],
        ];
        for evs in kinds {
            let batches: Vec<Vec<Update>> = evs.iter().map(|e| vec![np_update(e)]).collect();
            let n = check_touched(np_base_objects(), &batches).unwrap();
            assert!(n > 0, "no NetworkPolicy owner changed under {evs:?}");
        }
    }

    #[test]
    fn a_policy_change_touches_its_namespace_only() {
        let mut o = np_base_objects();
        let l = o.publish(None).unwrap().unwrap();
        o.apply(np_update(&NpEv::Policy { ns: 2, name: 1, shape: 4, delete: false }));
        let l2 = o.publish(Some(&l)).unwrap().unwrap();
        assert_eq!(l2.touched, Some(vec![Owner::NetworkPolicy { namespace: "ns2".into() }]));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Over random event sequences, every owner whose flows changed is in `touched` (or
        /// `touched` is `None`).
        #[test]
        fn touched_never_misses_a_changed_owner(events in proptest::collection::vec(proptest::collection::vec(ev(), 1..4), 1..12)) {
            let batches: Vec<Vec<Update>> = events.iter().map(|b| b.iter().map(update).collect()).collect();
            if let Err(e) = check_touched(base_objects(), &batches) {
                prop_assert!(false, "{}", e);
            }
        }

        /// The same under the networkpolicy plugin, with NetworkPolicy, Namespace-label and Pod
        /// events (here and elsewhere).
        #[test]
        fn touched_never_misses_a_changed_netpol_owner(events in proptest::collection::vec(proptest::collection::vec(np_ev(), 1..4), 1..12)) {
            let batches: Vec<Vec<Update>> = events.iter().map(|b| b.iter().map(np_update).collect()).collect();
            if let Err(e) = check_touched(np_base_objects(), &batches) {
                prop_assert!(false, "{}", e);
            }
        }
    }
}
