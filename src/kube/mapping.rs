//! Kubernetes objects to the model, one object at a time, through the state file's validators
//! (one rule set: a bad object is a problem naming the object and the field, as in a state
//! file), and [`Objects`]: the converted objects by kind, which the watchers update one event at
//! a time and from which each published state is assembled.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::types::{
    annotations, ClusterNetwork, EgressNetworkPolicy, HostSubnet as KubeHostSubnet, NetNamespace as KubeNetNamespace,
    FIXED_VNID_ANNOTATION, MULTICAST_ANNOTATION,
};
use super::watch::Kind;
use crate::cluster::state_file::{self, name_problems, EgressRuleFields};
use crate::cluster::{ClusterState, HostSubnet, NetNamespace, PodKey, Problem, Service};
use crate::model::Plugin;
use crate::pipeline::egress::Policy;
use crate::run::source::Loaded;
use crate::store::Owner;

/// The openshift-sdn plugin names.
pub fn plugin(name: &str) -> Option<Plugin> {
    match name {
        "redhat/openshift-ovs-subnet" => Some(Plugin::Subnet),
        "redhat/openshift-ovs-multitenant" => Some(Plugin::Multitenant),
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
            "ClusterNetwork \"default\": pluginName {plugin_name:?} is not handled (only redhat/openshift-ovs-subnet and redhat/openshift-ovs-multitenant)"
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
    Ok(NetworkConfig { plugin, cluster_network, service_network, vxlan_port, mtu })
}

/// One object converted to the model: the model object (`None` if rejected), the problems
/// naming it, and the key the state lists it by (with its identity).
#[derive(Clone, Debug, PartialEq)]
pub struct Converted<T> {
    pub sort: String,
    pub value: Option<T>,
    pub problems: Vec<Problem>,
}

fn converted<T>(sort: String, object: &str, checked: state_file::Checked<T>) -> Converted<T> {
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
    converted(host.to_string(), &format!("hostsubnet {host}"), state_file::host_subnet(host, &h.host_ip, &h.subnet, fixed))
}

pub fn net_namespace(n: &KubeNetNamespace) -> Converted<NetNamespace> {
    let name = if n.netname.is_empty() { name_of(&n.metadata) } else { &n.netname };
    let multicast = annotations(&n.metadata).get(MULTICAST_ANNOTATION).is_some_and(|v| v == "true");
    converted(name.to_string(), &format!("netnamespace {name}"), state_file::net_namespace(name, n.netid.0.clone(), multicast))
}

/// `None` for a service without a cluster IP (headless, ExternalName): nothing to program.
pub fn service(svc: &KubeService) -> Option<Converted<Service>> {
    let spec = svc.spec.as_ref()?;
    let ip = spec.cluster_ip.as_deref().unwrap_or("");
    if ip.is_empty() || ip == "None" {
        return None;
    }
    let (ns, name) = (svc.metadata.namespace.as_deref().unwrap_or_default(), name_of(&svc.metadata));
    let ports = spec.ports.iter().flatten().map(|p| (p.protocol.as_deref().unwrap_or("TCP"), i64::from(p.port)));
    Some(converted(String::new(), &format!("service {ns}/{name}"), state_file::service(ns, name, ip, ports)))
}

pub fn egress_policy(p: &EgressNetworkPolicy) -> Converted<Policy> {
    let (ns, name) = (p.metadata.namespace.as_deref().unwrap_or_default(), name_of(&p.metadata));
    let rules = p.spec.egress.iter().map(|r| EgressRuleFields {
        kind: &r.kind,
        cidr_selector: r.to.cidr_selector.as_deref(),
        dns_name: r.to.dns_name.as_deref(),
    });
    let checked = state_file::egress_policy(ns, name, rules).map(|p| (p, Vec::new()));
    converted(String::new(), &format!("egressnetworkpolicy {ns}/{name}"), checked)
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
    /// One of this node's pods: its identity, and its bandwidth annotations (applied when
    /// the pod is set up through CNI).
    Pod(PodInfo),
}

/// What the agent uses of one of this node's Pods beyond its name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// `kubernetes.io/ingress-bandwidth` and `kubernetes.io/egress-bandwidth`, as written.
    pub annotations: BTreeMap<String, String>,
}

/// The bandwidth annotations of a pod's metadata.
pub fn pod_info(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> PodInfo {
    let keep = [crate::api::INGRESS_ANNOTATION, crate::api::EGRESS_ANNOTATION];
    PodInfo {
        annotations: meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| keep.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
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
    pods: BTreeSet<PodKey>,
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
            Kind::Pod => out.pods = std::mem::take(&mut self.pods),
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
            Kind::Pod => self.pods = from.pods,
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
    /// The changed services' cluster IPs, before and after (a service that shares one may
    /// become valid or invalid).
    service_ips: HashSet<Ipv4Addr>,
    hosts: BTreeSet<String>,
    /// The changed HostSubnets' subnets, before and after (an overlapping one may become valid
    /// or invalid).
    subnets: Vec<Ipv4Net>,
    egress_namespaces: BTreeSet<String>,
    gone_pods: BTreeSet<PodKey>,
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
    ready: [bool; 6],
    egress_forbidden: bool,
    changes: Changes,
    /// This node's pods' annotations that matter (bandwidth), by pod.
    pod_info: BTreeMap<PodKey, PodInfo>,
}

impl Objects {
    pub fn new(node: &str) -> Objects {
        Objects {
            node: node.to_string(),
            live: Maps::default(),
            listing: Maps::default(),
            ready: [false; 6],
            egress_forbidden: false,
            changes: Changes { full: true, any: true, ..Changes::default() },
            pod_info: BTreeMap::new(),
        }
    }

    /// Every kind has listed (EgressNetworkPolicies count as listed while forbidden).
    pub fn ready(&self) -> bool {
        Kind::ALL.iter().all(|k| self.ready[k.slot()] || (self.egress_forbidden && *k == Kind::EgressNetworkPolicy))
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
                        self.pod_info.insert(id.clone(), info);
                        m.pods.insert(id);
                    }
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
                        self.pod_info.insert(id.clone(), info.clone());
                        Kind::Pod
                    }
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
                        ch.subnets.push(h.subnet);
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
                    ch.service_ips.extend(old.iter().chain(&new).map(|s| s.cluster_ip));
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
            (Kind::Pod, Some(_)) => {
                if m.pods.insert(id) {
                    ch.any = true;
                }
            }
            (Kind::Pod, None) => {
                if m.pods.remove(&id) {
                    ch.any = true;
                    ch.gone_pods.insert(id);
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
            // change the other.
            for ((_, id), c) in &self.live.services.items {
                if c.value.as_ref().is_some_and(|s| ch.service_ips.contains(&s.cluster_ip)) {
                    services.insert(id);
                }
            }
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
            let mut hosts: BTreeSet<&str> = ch.hosts.iter().map(String::as_str).collect();
            for h in self.live.host_subnets.values() {
                if ch.subnets.iter().any(|s| s.contains(&h.subnet.network()) || h.subnet.contains(&s.network())) {
                    hosts.insert(&h.host);
                }
            }
            if hosts.contains(self.node.as_str()) {
                // This node's own subnet: the whole pipeline depends on it.
                return None;
            }
            owners.extend(hosts.into_iter().map(|h| Owner::HostSubnet { host: h.to_string() }));
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
        Some(owners.into_iter().collect())
    }

    /// Assembles the state from the converted objects and validates it: `None` if nothing
    /// changed since `last` (or not every kind has listed yet), an error if no state can be
    /// built (the changes are kept for the next attempt).
    pub fn publish(&mut self, last: Option<&Loaded>) -> Option<Result<Loaded, String>> {
        if !self.ready() || (!self.changes.any && last.is_some()) {
            return None;
        }
        let (state, problems) = match self.assemble() {
            Ok(v) => v,
            Err(e) => return Some(Err(e)),
        };
        let touched = self.touched(&state);
        let unchanged = last.is_some_and(|l| {
            l.state == state && l.problems == problems && l.live_pods.as_ref().is_some_and(|p| *p == self.live.pods)
        });
        self.changes = Changes::default();
        if unchanged {
            return None;
        }
        let live = &self.live.pods;
        self.pod_info.retain(|k, _| live.contains(k));
        let pod_annotations = self.pod_info.iter().filter(|(_, i)| !i.annotations.is_empty()).map(|(k, i)| (k.clone(), i.annotations.clone())).collect();
        Some(Ok(Loaded { state, problems, live_pods: Some(self.live.pods.clone()), touched, seq: 0, pod_annotations }))
    }

    /// The state from the converted objects (every watched kind as listed), validated.
    pub fn assemble(&self) -> Result<(ClusterState, Vec<Problem>), String> {
        let m = &self.live;
        let cfg = match &m.cluster_network {
            None => return Err("ClusterNetwork \"default\" does not exist".into()),
            Some(Err(e)) => return Err(e.clone()),
            Some(Ok(c)) => c,
        };
        let header = state_file::header(self.node.clone(), cfg.plugin, &cfg.cluster_network, &cfg.service_network, cfg.vxlan_port, cfg.mtu)
            .map_err(|e| format!("ClusterNetwork \"default\": {e}"))?;
        let empty = KindMap::default();
        let egress = if self.egress_forbidden { &empty } else { &m.egress_policies };
        let problems: Vec<Problem> = m
            .host_subnets
            .problems()
            .chain(m.net_namespaces.problems())
            .chain(m.services.problems())
            .chain(egress.problems())
            .cloned()
            .collect();
        state_file::assemble(
            header,
            m.host_subnets.values().cloned().collect(),
            m.net_namespaces.values().cloned().collect(),
            m.services.values().cloned().collect(),
            // Pods are set up through the pod API; the cluster only says which still exist.
            Vec::new(),
            egress.values().cloned().collect(),
            problems,
        )
        .map_err(|e| e.0)
    }

    /// This node's pods, as listed.
    pub fn live_pods(&self) -> &BTreeSet<PodKey> {
        &self.live.pods
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
            (id("team-a", "a1"), Object::Pod(PodInfo::default())),
            (id("team-a", "a2"), Object::Pod(pod_info(&meta(Some("team-a"), "a2", &[("kubernetes.io/ingress-bandwidth", "10M"), ("other", "x")])))),
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
        assert!(o.publish(None).unwrap().unwrap_err().contains("does not exist"));
    }

    /// One random change to a small cluster (collisions of cluster IPs and subnets on purpose).
    #[derive(Clone, Debug)]
    enum Ev {
        Service { name: u8, ns: u8, ip: u8, port: u16, delete: bool },
        HostSubnet { host: u8, subnet: u8, delete: bool },
        Egress { ns: u8, deny: bool, delete: bool },
        PodGone { name: u8 },
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            (0..6u8, 0..3u8, 0..5u8, 1..4u16, any::<bool>())
                .prop_map(|(name, ns, ip, port, delete)| Ev::Service { name, ns, ip, port, delete }),
            (0..5u8, 0..6u8, any::<bool>()).prop_map(|(host, subnet, delete)| Ev::HostSubnet { host, subnet, delete }),
            (0..3u8, any::<bool>(), any::<bool>()).prop_map(|(ns, deny, delete)| Ev::Egress { ns, deny, delete }),
            (0..3u8).prop_map(|name| Ev::PodGone { name }),
        ]
    }

    fn base_objects() -> Objects {
        let mut list = vec![
            (id("", "default"), Object::ClusterNetwork(cluster_network(&cn("redhat/openshift-ovs-multitenant")))),
            (id("", "node-a"), Object::HostSubnet(host_subnet(&hs("node-a", "172.17.0.2", "10.128.2.0/23")))),
        ];
        for (i, n) in ["ns0", "ns1", "ns2"].iter().enumerate() {
            // ns0 and ns2 share a VNID.
            let vnid = [10, 11, 10][i];
            list.push((id("", n), Object::NetNamespace(net_namespace(&nn(n, json!(vnid), &[])))));
        }
        for p in 0..3 {
            list.push((id(&format!("ns{p}"), &format!("p{p}")), Object::Pod(PodInfo::default())));
        }
        listed("node-a", list)
    }

    fn update(e: &Ev) -> Update {
        match *e {
            Ev::Service { name, ns, ip, port, delete } => {
                let i = id(&format!("ns{ns}"), &format!("s{name}"));
                if delete {
                    return Update::Delete(Kind::Service, i);
                }
                let s = svc(&i.0, &i.1, &format!("172.30.0.{}", 10 + ip), &[("TCP", port as i32)]);
                Update::Apply(i, Object::Service(service(&s)))
            }
            Ev::HostSubnet { host, subnet, delete } => {
                let name = format!("node-{}", (b'b' + host) as char);
                if delete {
                    return Update::Delete(Kind::HostSubnet, id("", &name));
                }
                // /23s that overlap each other (and, for 5, this node's 10.128.2.0/23).
                let net = ["10.129.0.0/23", "10.129.0.0/24", "10.129.2.0/23", "10.129.4.0/23", "10.130.0.0/23", "10.128.2.0/24"][subnet as usize];
                Update::Apply(id("", &name), Object::HostSubnet(host_subnet(&hs(&name, &format!("172.17.1.{host}"), net))))
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

    /// The flows by owner, with the node's pods (those still live) at fixed ofports.
    fn flows(l: &Loaded) -> BTreeMap<Owner, Vec<String>> {
        let mut state = l.state.clone();
        let mut ofports = HashMap::new();
        for (ns, name) in l.live_pods.iter().flatten() {
            // Stable per pod (pN): another pod's departure must not move it.
            let i: usize = name[1..].parse().unwrap();
            let ip = format!("10.128.2.{}", 10 + i);
            let mac = format!("0a:58:0a:80:02:{:02x}", 10 + i);
            let raw = state_file::RawPod {
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
            state.pods.push(state_file::validate_pod(raw).unwrap());
            ofports.insert((ns.clone(), name.clone()), crate::model::OfPort(3 + i as u32));
        }
        let (d, _) = desired_state(&state, &ofports, &DnsAnswers::new());
        let mut m: BTreeMap<Owner, Vec<String>> = BTreeMap::new();
        for (o, f) in d.iter() {
            m.entry(o.clone()).or_default().push(f.to_string());
        }
        m.values_mut().for_each(|v| v.sort());
        m
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Over random event sequences, every owner whose flows changed is in `touched` (or
        /// `touched` is `None`).
        #[test]
        fn touched_never_misses_a_changed_owner(events in proptest::collection::vec(proptest::collection::vec(ev(), 1..4), 1..12)) {
            let mut o = base_objects();
            let mut last = o.publish(None).unwrap().unwrap();
            for batch in events {
                for e in &batch {
                    o.apply(update(e));
                }
                let Some(next) = o.publish(Some(&last)) else { continue };
                let Ok(next) = next else { continue };
                if let Some(touched) = &next.touched {
                    let (before, after) = (flows(&last), flows(&next));
                    for owner in before.keys().chain(after.keys()) {
                        if before.get(owner) != after.get(owner) {
                            prop_assert!(touched.contains(owner), "{owner} changed but is not in {touched:?} after {batch:?}");
                        }
                    }
                }
                last = next;
            }
        }
    }
}
