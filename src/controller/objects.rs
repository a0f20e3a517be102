//! What the controller keeps of the objects it watches: Nodes and Namespaces converted at once
//! to the few fields it uses (a Node's image list is never kept), and the openshift-sdn objects
//! it writes, whole (it replaces them with the resourceVersion they were read at).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::{IpNet, Ipv6Net};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::controller::config::Network;
use crate::kube::types::{
    annotations, ClusterNetwork, ClusterNetworkEntry, HostSubnet, NetNamespace, CLUSTER_NETWORK_IPV6_ANNOTATION,
    HOST_SUBNET_LENGTH_IPV6_ANNOTATION, SERVICE_NETWORK_IPV6_ANNOTATION, SUBNET_IPV6_ANNOTATION,
};

/// The annotation on a Node that names the address other nodes reach it at (the VXLAN
/// underlay), overriding its InternalIP and ExternalIP.
pub const HOST_IP_ANNOTATION: &str = "sdn-node.openshift.io/host-ip";

/// The label on the HostSubnets this controller creates: it deletes only those (a HostSubnet an
/// operator made, e.g. for an F5 router, stays and keeps its subnet).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "sdn-node-controller");

/// The plugin names of ClusterNetwork.pluginName.
pub fn plugin_name(p: crate::domain::Plugin) -> &'static str {
    match p {
        crate::domain::Plugin::Subnet => "redhat/openshift-ovs-subnet",
        crate::domain::Plugin::Multitenant => "redhat/openshift-ovs-multitenant",
        crate::domain::Plugin::NetworkPolicy => "redhat/openshift-ovs-networkpolicy",
    }
}

/// What the controller uses of a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub uid: Option<String>,
    /// `spec.podCIDRs` (or the older `spec.podCIDR`), parsed; a value that is not a CIDR is in
    /// `bad_pod_cidrs`.
    pub pod_cidrs: Vec<IpNet>,
    pub bad_pod_cidrs: Vec<String>,
    /// InternalIPs, then ExternalIPs, in the Node's order.
    pub internal: Vec<IpAddr>,
    pub external: Vec<IpAddr>,
    /// The host-IP annotation, raw.
    pub host_ip_annotation: Option<String>,
}

impl NodeInfo {
    pub fn from(n: &Node) -> Option<NodeInfo> {
        let name = n.metadata.name.clone()?;
        let spec = n.spec.as_ref();
        let mut cidrs: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
        if cidrs.is_empty() {
            cidrs.extend(spec.and_then(|s| s.pod_cidr.clone()));
        }
        let (mut pod_cidrs, mut bad_pod_cidrs) = (vec![], vec![]);
        for c in cidrs.into_iter().filter(|c| !c.trim().is_empty()) {
            match c.trim().parse::<IpNet>() {
                Ok(net) => pod_cidrs.push(net),
                Err(_) => bad_pod_cidrs.push(c),
            }
        }
        let (mut internal, mut external) = (vec![], vec![]);
        for a in n.status.as_ref().and_then(|s| s.addresses.as_ref()).into_iter().flatten() {
            let Ok(ip) = a.address.trim().parse::<IpAddr>() else { continue };
            match a.type_.as_str() {
                "InternalIP" => internal.push(ip),
                "ExternalIP" => external.push(ip),
                _ => {}
            }
        }
        let host_ip_annotation = n.metadata.annotations.as_ref().and_then(|a| a.get(HOST_IP_ANNOTATION)).cloned();
        Some(NodeInfo {
            name,
            uid: n.metadata.uid.clone(),
            pod_cidrs,
            bad_pod_cidrs,
            internal,
            external,
            host_ip_annotation,
        })
    }

    /// The podCIDR of `family`'s network, if any.
    pub fn pod_cidr(&self, like: &IpNet) -> Option<IpNet> {
        self.pod_cidrs
            .iter()
            .find(|c| matches!((c, like), (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))))
            .copied()
    }

    /// The node's address for the underlay: the annotation, else the first InternalIP, else the
    /// first ExternalIP, of the IPv4 family (VXLAN's underlay is IPv4 today); why not, if none.
    pub fn host_ip(&self) -> Result<IpAddr, String> {
        if let Some(a) = &self.host_ip_annotation {
            return a
                .trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("annotation {HOST_IP_ANNOTATION}: {a:?} is not an IP address"));
        }
        // IPv4 first (the VXLAN underlay of every node that has it); a node with IPv6
        // addresses only gets an IPv6 underlay address (VXLAN over IPv6). The nodes of one
        // cluster must share the underlay's family to reach each other.
        let of = |v: &[IpAddr], v4: bool| v.iter().find(|a| a.is_ipv4() == v4).copied();
        of(&self.internal, true)
            .or_else(|| of(&self.external, true))
            .or_else(|| of(&self.internal, false))
            .or_else(|| of(&self.external, false))
            .ok_or_else(|| {
                format!("no InternalIP or ExternalIP in status.addresses (set annotation {HOST_IP_ANNOTATION} to the address other nodes reach it at)")
            })
    }
}

/// What the controller uses of a Namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    pub uid: Option<String>,
}

impl NamespaceInfo {
    pub fn from(n: &Namespace) -> Option<NamespaceInfo> {
        Some(NamespaceInfo { name: n.metadata.name.clone()?, uid: n.metadata.uid.clone() })
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.to_string()), ..Default::default() }
}

/// ClusterNetwork "default" as the configuration says; the IPv6 networks (dual-stack) as
/// annotations (see [`crate::kube::types`] for why not `clusterNetworks`). An IPv6-only
/// cluster has its IPv6 networks in the fields themselves (`network`, `clusterNetworks[0]`,
/// `serviceNetwork`, `hostsubnetlength` the host bits of a node's IPv6 subnet) and no
/// annotation: openshift-sdn's agents cannot run it either way.
pub fn cluster_network(n: &Network) -> ClusterNetwork {
    let mut metadata = meta("default");
    if let Some(six) = &n.ipv6 {
        metadata.annotations = Some(BTreeMap::from([
            (CLUSTER_NETWORK_IPV6_ANNOTATION.to_string(), six.cluster_network.to_string()),
            (HOST_SUBNET_LENGTH_IPV6_ANNOTATION.to_string(), six.host_subnet_length.to_string()),
            (SERVICE_NETWORK_IPV6_ANNOTATION.to_string(), six.service_network.to_string()),
        ]));
    }
    ClusterNetwork {
        metadata,
        network: Some(n.cluster_network.to_string()),
        host_subnet_length: Some(i64::from(n.host_subnet_length)),
        service_network: Some(n.service_network.to_string()),
        plugin_name: Some(plugin_name(n.plugin).into()),
        vxlan_port: Some(i64::from(n.vxlan_port)),
        mtu: Some(i64::from(n.mtu)),
        cluster_networks: vec![ClusterNetworkEntry {
            cidr: n.cluster_network.to_string(),
            host_subnet_length: Some(i64::from(n.host_subnet_length)),
        }],
    }
}

/// The first field in which an existing ClusterNetwork differs from the configuration, as a
/// sentence naming the field, the cluster's value and the configuration's.
pub fn cluster_network_differs(existing: &ClusterNetwork, n: &Network) -> Option<String> {
    let want = cluster_network(n);
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unset)".into());
    let cidrs: Vec<(String, Option<i64>)> =
        existing.cluster_networks.iter().map(|c| (c.cidr.clone(), c.host_subnet_length)).collect();
    let (cn, hsl) = match cidrs.first() {
        Some((c, h)) => (Some(c.clone()), h.or(existing.host_subnet_length)),
        None => (existing.network.clone(), existing.host_subnet_length),
    };
    let same_net =
        |a: &Option<String>, b: &str| a.as_deref().and_then(|a| a.parse::<IpNet>().ok()) == b.parse::<IpNet>().ok();
    if cidrs.len() > 1 {
        return Some(format!(
            "clusterNetworks has {} entries in the cluster, 1 in this controller's configuration",
            cidrs.len()
        ));
    }
    if !same_net(&cn, &n.cluster_network.to_string()) {
        return Some(format!(
            "clusterNetworks[0].CIDR is {} in the cluster, {} in this controller's configuration",
            show(&cn),
            n.cluster_network
        ));
    }
    if hsl.is_some_and(|h| h != i64::from(n.host_subnet_length)) {
        return Some(format!(
            "hostSubnetLength is {} in the cluster, {} in this controller's configuration",
            hsl.unwrap_or_default(),
            n.host_subnet_length
        ));
    }
    if !same_net(&existing.service_network, &n.service_network.to_string()) {
        return Some(format!(
            "serviceNetwork is {} in the cluster, {} in this controller's configuration",
            show(&existing.service_network),
            n.service_network
        ));
    }
    if existing.plugin_name != want.plugin_name {
        return Some(format!(
            "pluginName is {} in the cluster, {} in this controller's configuration",
            show(&existing.plugin_name),
            plugin_name(n.plugin)
        ));
    }
    if existing.vxlan_port.unwrap_or(4789) != i64::from(n.vxlan_port) {
        return Some(format!(
            "vxlanPort is {} in the cluster, {} in this controller's configuration",
            existing.vxlan_port.unwrap_or(4789),
            n.vxlan_port
        ));
    }
    let ann = annotations(&existing.metadata);
    let want_ann = want.metadata.annotations.unwrap_or_default();
    for key in [CLUSTER_NETWORK_IPV6_ANNOTATION, HOST_SUBNET_LENGTH_IPV6_ANNOTATION, SERVICE_NETWORK_IPV6_ANNOTATION] {
        let (have, want) = (ann.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()), want_ann.get(key).map(String::as_str));
        let same = match (have, want) {
            (Some(h), Some(w)) => h == w || (h.parse::<IpNet>().ok().is_some() && h.parse::<IpNet>().ok() == w.parse::<IpNet>().ok()),
            (h, w) => h == w,
        };
        if !same {
            return Some(format!(
                "metadata.annotations[{key}] is {} in the cluster, {} in this controller's configuration",
                have.unwrap_or("(unset)"),
                want.unwrap_or("(unset)")
            ));
        }
    }
    if existing.mtu.unwrap_or(1450) != i64::from(n.mtu) {
        return Some(format!(
            "mtu is {} in the cluster, {} in this controller's configuration",
            existing.mtu.unwrap_or(1450),
            n.mtu
        ));
    }
    None
}

/// What to do about an existing ClusterNetwork "default" that is not what the configuration
/// would create.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterNetworkChange {
    /// It is the configuration's network.
    Same,
    /// An IPv4 cluster turned dual-stack: the same IPv4 network without any IPv6 annotation;
    /// this is it with them added (read's resourceVersion kept: the replace is conditional).
    /// Nothing that exists loses its meaning: every HostSubnet keeps its IPv4 subnet and gains
    /// an IPv6 one.
    AddIpv6(Box<ClusterNetwork>),
    /// Anything else changes a network subnets were handed out of (openshift-sdn's master
    /// refuses those too): the sentence of [`cluster_network_differs`].
    Refused(String),
}

/// Compares an existing ClusterNetwork with the configuration: the same, the IPv6 networks
/// to add (IPv4 → dual-stack), or refused, naming the field.
pub fn cluster_network_change(existing: &ClusterNetwork, n: &Network) -> ClusterNetworkChange {
    let Some(differs) = cluster_network_differs(existing, n) else { return ClusterNetworkChange::Same };
    let ann = annotations(&existing.metadata);
    let no_ipv6 = [CLUSTER_NETWORK_IPV6_ANNOTATION, HOST_SUBNET_LENGTH_IPV6_ANNOTATION, SERVICE_NETWORK_IPV6_ANNOTATION]
        .iter()
        .all(|k| ann.get(*k).is_none_or(|v| v.trim().is_empty()));
    if n.ipv6.is_none() || !no_ipv6 {
        return ClusterNetworkChange::Refused(differs);
    }
    let mut with = existing.clone();
    let add = cluster_network(n).metadata.annotations.unwrap_or_default();
    with.metadata.annotations.get_or_insert_with(Default::default).extend(add);
    // Anything else that differs is named, the annotations being what would follow.
    match cluster_network_differs(&with, n) {
        None => ClusterNetworkChange::AddIpv6(Box::new(with)),
        Some(other) => ClusterNetworkChange::Refused(other),
    }
}

/// A HostSubnet this controller creates for `node`; its IPv6 subnet (dual-stack) as the
/// annotation [`SUBNET_IPV6_ANNOTATION`]. In an IPv6-only cluster `subnet` is the node's IPv6
/// subnet and `subnet6` is `None`.
pub fn host_subnet(node: &str, host_ip: IpAddr, subnet: IpNet, subnet6: Option<Ipv6Net>) -> HostSubnet {
    let mut m = meta(node);
    m.labels = Some(BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())]));
    let mut h = HostSubnet { metadata: m, host: node.to_string(), host_ip: host_ip.to_string(), subnet: subnet.to_string() };
    if let Some(s6) = subnet6 {
        set_subnet6(&mut h, s6);
    }
    h
}

/// Sets a HostSubnet's IPv6 subnet annotation.
pub fn set_subnet6(h: &mut HostSubnet, subnet6: Ipv6Net) {
    h.metadata.annotations.get_or_insert_with(Default::default).insert(SUBNET_IPV6_ANNOTATION.to_string(), subnet6.to_string());
}

/// A HostSubnet's IPv6 subnet (the annotation), if it holds a valid one.
pub fn subnet6_of(h: &HostSubnet) -> Option<Ipv6Net> {
    annotations(&h.metadata).get(SUBNET_IPV6_ANNOTATION).and_then(|v| v.trim().parse::<Ipv6Net>().ok())
}

/// Whether this controller created `h` (and may delete it).
pub fn managed(h: &HostSubnet) -> bool {
    h.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).is_some_and(|v| v == MANAGED_BY.1)
}

/// A NetNamespace for namespace `name`.
pub fn net_namespace(name: &str, vnid: u32) -> NetNamespace {
    NetNamespace { metadata: meta(name), netname: name.to_string(), netid: u64::from(vnid).into() }
}

/// A NetNamespace's VNID, if it holds a valid one.
pub fn vnid_of(n: &NetNamespace) -> Option<u32> {
    n.netid.0.as_ref().ok().and_then(|v| u32::try_from(*v).ok()).filter(|v| *v <= crate::controller::vnids::MAX)
}

/// The resourceVersion as a number where it is one (every API server's today): a watch event
/// older than what a write answered is not let to replace it in the cache.
pub fn rv(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref().and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Plugin;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};

    fn node(cidrs: &[&str], addrs: &[(&str, &str)], ann: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                annotations: ann.map(|a| BTreeMap::from([(HOST_IP_ANNOTATION.to_string(), a.to_string())])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs: Some(cidrs.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(
                    addrs.iter().map(|(t, a)| NodeAddress { type_: t.to_string(), address: a.to_string() }).collect(),
                ),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn host_ip_order_and_family() {
        let v4: IpNet = "10.0.0.0/8".parse().unwrap();
        let n = NodeInfo::from(&node(
            &["fd00::/64", "10.128.0.0/24"],
            &[("ExternalIP", "1.2.3.4"), ("InternalIP", "fd00::1"), ("InternalIP", "192.168.1.5")],
            None,
        ))
        .unwrap();
        assert_eq!(n.host_ip().unwrap().to_string(), "192.168.1.5");
        assert_eq!(n.pod_cidr(&v4).unwrap().to_string(), "10.128.0.0/24");
        let n = NodeInfo::from(&node(&[], &[("ExternalIP", "1.2.3.4"), ("Hostname", "n1")], None)).unwrap();
        assert_eq!(n.host_ip().unwrap().to_string(), "1.2.3.4");
        assert_eq!(n.pod_cidr(&v4), None);
        let n = NodeInfo::from(&node(&["nope"], &[("InternalIP", "10.1.1.1")], Some("172.16.0.9"))).unwrap();
        assert_eq!(n.host_ip().unwrap().to_string(), "172.16.0.9");
        assert_eq!(n.bad_pod_cidrs, vec!["nope".to_string()]);
        let n = NodeInfo::from(&node(&[], &[], Some("x"))).unwrap();
        assert!(n.host_ip().unwrap_err().contains(HOST_IP_ANNOTATION));
        // IPv6 addresses only: an IPv6 underlay, InternalIP first.
        let n = NodeInfo::from(&node(&[], &[("ExternalIP", "2001:db8::9"), ("InternalIP", "fd00::1")], None)).unwrap();
        assert_eq!(n.host_ip().unwrap().to_string(), "fd00::1");
        let n = NodeInfo::from(&node(&[], &[("Hostname", "n1")], None)).unwrap();
        assert!(n.host_ip().unwrap_err().contains("no InternalIP or ExternalIP"));
    }

    #[test]
    fn cluster_network_fields_are_compared_and_named() {
        let n = Network {
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            host_subnet_length: 9,
            service_network: "172.30.0.0/16".parse().unwrap(),
            ipv6: None,
            plugin: Plugin::NetworkPolicy,
            vxlan_port: 4789,
            mtu: 1450,
        };
        let cn = cluster_network(&n);
        assert_eq!(cluster_network_differs(&cn, &n), None);
        // openshift-sdn's own object (legacy fields, defaults unset) is the same network.
        let legacy = ClusterNetwork {
            network: Some("10.128.0.0/14".into()),
            host_subnet_length: Some(9),
            service_network: Some("172.30.0.0/16".into()),
            plugin_name: Some("redhat/openshift-ovs-networkpolicy".into()),
            ..Default::default()
        };
        assert_eq!(cluster_network_differs(&legacy, &n), None);
        let mut other = cn.clone();
        other.service_network = Some("10.96.0.0/12".into());
        assert_eq!(
            cluster_network_differs(&other, &n).unwrap(),
            "serviceNetwork is 10.96.0.0/12 in the cluster, 172.30.0.0/16 in this controller's configuration"
        );
        let mut other = cn.clone();
        other.plugin_name = Some("redhat/openshift-ovs-multitenant".into());
        assert!(cluster_network_differs(&other, &n).unwrap().starts_with("pluginName"));
        let mut other = cn.clone();
        other.cluster_networks[0].host_subnet_length = Some(8);
        assert!(cluster_network_differs(&other, &n).unwrap().starts_with("hostSubnetLength is 8"));

        // Dual-stack: the IPv6 networks are annotations, compared too.
        let six = Network {
            ipv6: Some(crate::controller::config::Network6 {
                cluster_network: "fd00:10:128::/48".parse().unwrap(),
                host_subnet_length: 64,
                service_network: "fd00:172:30::/112".parse().unwrap(),
            }),
            ..n.clone()
        };
        let cn6 = cluster_network(&six);
        let a = annotations(&cn6.metadata);
        assert_eq!(a[CLUSTER_NETWORK_IPV6_ANNOTATION], "fd00:10:128::/48");
        assert_eq!(a[SERVICE_NETWORK_IPV6_ANNOTATION], "fd00:172:30::/112");
        assert_eq!(a[HOST_SUBNET_LENGTH_IPV6_ANNOTATION], "64");
        assert_eq!(cn6.cluster_networks.len(), 1, "openshift-sdn's agents refuse an IPv6 clusterNetworks entry");
        assert_eq!(cluster_network_differs(&cn6, &six), None);
        // The agent reads them back as the controller wrote them.
        let read = crate::kube::mapping::cluster_network(&cn6).unwrap();
        assert_eq!(read.cluster_network6, Some(six.ipv6.as_ref().unwrap().cluster_network));
        assert_eq!(read.service_network6, Some(six.ipv6.as_ref().unwrap().service_network));
        assert_eq!(
            cluster_network_differs(&cn, &six).unwrap(),
            format!("metadata.annotations[{CLUSTER_NETWORK_IPV6_ANNOTATION}] is (unset) in the cluster, fd00:10:128::/48 in this controller's configuration")
        );
        assert!(cluster_network_differs(&cn6, &n).unwrap().contains("is fd00:10:128::/48 in the cluster, (unset) in this"));
        // A HostSubnet's IPv6 subnet travels as its annotation.
        let h = host_subnet("n1", "10.0.0.1".parse().unwrap(), "10.128.0.0/24".parse().unwrap(), Some("fd00:10:128:5::/64".parse().unwrap()));
        assert_eq!(annotations(&h.metadata)[SUBNET_IPV6_ANNOTATION], "fd00:10:128:5::/64");
        assert_eq!(subnet6_of(&h), Some("fd00:10:128:5::/64".parse().unwrap()));
        assert_eq!(crate::kube::mapping::host_subnet(&h).value.unwrap().subnet6, subnet6_of(&h));
    }

    fn network4() -> Network {
        Network {
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            host_subnet_length: 9,
            service_network: "172.30.0.0/16".parse().unwrap(),
            ipv6: None,
            plugin: Plugin::NetworkPolicy,
            vxlan_port: 4789,
            mtu: 1450,
        }
    }

    fn dual() -> Network {
        Network {
            ipv6: Some(crate::controller::config::Network6 {
                cluster_network: "fd00:10:128::/48".parse().unwrap(),
                host_subnet_length: 64,
                service_network: "fd00:172:30::/112".parse().unwrap(),
            }),
            ..network4()
        }
    }

    /// The IPv6-only encoding the agents read: the IPv6 networks in ClusterNetwork's own fields
    /// and HostSubnet `subnet`, no annotation.
    #[test]
    fn ipv6_only_objects() {
        let n = Network {
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
            host_subnet_length: 64,
            service_network: "fd00:172:30::/112".parse().unwrap(),
            ..network4()
        };
        let cn = cluster_network(&n);
        assert_eq!(cn.network.as_deref(), Some("fd00:10:128::/48"));
        assert_eq!(cn.service_network.as_deref(), Some("fd00:172:30::/112"));
        assert_eq!(cn.host_subnet_length, Some(64));
        assert_eq!(
            cn.cluster_networks,
            vec![ClusterNetworkEntry { cidr: "fd00:10:128::/48".into(), host_subnet_length: Some(64) }]
        );
        assert_eq!(cn.metadata.annotations, None);
        let json = serde_json::to_value(&cn).unwrap();
        assert_eq!(json["network"], "fd00:10:128::/48");
        assert_eq!(json["hostsubnetlength"], 64);
        assert_eq!(json["serviceNetwork"], "fd00:172:30::/112");
        assert_eq!(json["clusterNetworks"], serde_json::json!([{"CIDR": "fd00:10:128::/48", "hostSubnetLength": 64}]));
        assert_eq!(cluster_network_change(&cn, &n), ClusterNetworkChange::Same);
        // Neither an IPv4 nor a dual-stack ClusterNetwork is changed into it, nor the reverse.
        for other in [network4(), dual()] {
            let ClusterNetworkChange::Refused(why) = cluster_network_change(&cluster_network(&other), &n) else { panic!() };
            assert_eq!(why, "clusterNetworks[0].CIDR is 10.128.0.0/14 in the cluster, fd00:10:128::/48 in this controller's configuration");
            assert!(matches!(cluster_network_change(&cn, &other), ClusterNetworkChange::Refused(_)));
        }
        let h = host_subnet("n1", "fd00:1::5".parse().unwrap(), "fd00:10:128:3::/64".parse().unwrap(), None);
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!((json["host"].as_str(), json["hostIP"].as_str(), json["subnet"].as_str()), (Some("n1"), Some("fd00:1::5"), Some("fd00:10:128:3::/64")));
        assert_eq!(annotations(&h.metadata).get(SUBNET_IPV6_ANNOTATION), None);

        // What the agents read back: an IPv6-only state (no IPv4 network, subnet or flow).
        use crate::kube::mapping;
        let cfg = mapping::cluster_network(&cn).unwrap();
        assert_eq!(cfg.cluster_network, "fd00:10:128::/48");
        let local = mapping::host_subnet(&h);
        let hs = local.value.clone().expect("the HostSubnet converts");
        assert_eq!((hs.subnet, hs.subnet6), (None, Some("fd00:10:128:3::/64".parse().unwrap())));
        let header = crate::cluster::validate::header("n1".into(), cfg.plugin, &[&cfg.cluster_network], &[&cfg.service_network], 4789, 1450).unwrap();
        let (st, problems) = crate::cluster::validate::assemble(header, vec![hs], vec![], vec![], vec![], vec![], vec![]).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert!(st.ipv6_only() && st.node_ipv4().is_none());
        assert_eq!(st.node_ipv6().map(|n| n.local_subnet), Some("fd00:10:128:3::/64".parse().unwrap()));
    }

    /// IPv4 → dual-stack is the one change made to an existing ClusterNetwork: the annotations
    /// added, everything read kept (resourceVersion included); any other difference refused.
    #[test]
    fn ipv4_to_dual_stack_adds_the_annotations_and_nothing_else() {
        let mut existing = cluster_network(&network4());
        existing.metadata.resource_version = Some("42".into());
        existing.metadata.uid = Some("cn-uid".into());
        existing.metadata.annotations = Some(BTreeMap::from([("note".to_string(), "kept".to_string())]));
        let ClusterNetworkChange::AddIpv6(new) = cluster_network_change(&existing, &dual()) else { panic!() };
        assert_eq!(new.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(new.metadata.uid.as_deref(), Some("cn-uid"));
        let a = annotations(&new.metadata);
        assert_eq!(a["note"], "kept");
        assert_eq!(a[CLUSTER_NETWORK_IPV6_ANNOTATION], "fd00:10:128::/48");
        assert_eq!(a[HOST_SUBNET_LENGTH_IPV6_ANNOTATION], "64");
        assert_eq!(a[SERVICE_NETWORK_IPV6_ANNOTATION], "fd00:172:30::/112");
        assert_eq!((new.network.clone(), new.cluster_networks.clone()), (existing.network.clone(), existing.cluster_networks.clone()));
        assert_eq!(cluster_network_change(&new, &dual()), ClusterNetworkChange::Same);
        // openshift-sdn's own object (legacy fields only) gains them the same way.
        let legacy = ClusterNetwork {
            network: Some("10.128.0.0/14".into()),
            host_subnet_length: Some(9),
            service_network: Some("172.30.0.0/16".into()),
            plugin_name: Some("redhat/openshift-ovs-networkpolicy".into()),
            ..Default::default()
        };
        assert!(matches!(cluster_network_change(&legacy, &dual()), ClusterNetworkChange::AddIpv6(_)));
        // An IPv4 difference as well: refused, naming it (not the annotations).
        let mut other = existing.clone();
        other.mtu = Some(1400);
        assert_eq!(
            cluster_network_change(&other, &dual()),
            ClusterNetworkChange::Refused("mtu is 1400 in the cluster, 1450 in this controller's configuration".into())
        );
        let mut other = existing.clone();
        other.service_network = Some("10.96.0.0/12".into());
        assert!(matches!(cluster_network_change(&other, &dual()), ClusterNetworkChange::Refused(w) if w.starts_with("serviceNetwork")));
        // A changed IPv6 network, a partial IPv6 side, or dual-stack → IPv4: refused.
        let mut other6 = dual();
        other6.ipv6.as_mut().unwrap().cluster_network = "fd00:99::/48".parse().unwrap();
        let ClusterNetworkChange::Refused(why) = cluster_network_change(&new, &other6) else { panic!() };
        assert!(why.contains("is fd00:10:128::/48 in the cluster, fd00:99::/48 in this"), "{why}");
        let mut partial = existing.clone();
        partial.metadata.annotations = Some(BTreeMap::from([(SERVICE_NETWORK_IPV6_ANNOTATION.to_string(), "fd00:172:30::/112".to_string())]));
        assert!(matches!(cluster_network_change(&partial, &dual()), ClusterNetworkChange::Refused(_)));
        let ClusterNetworkChange::Refused(why) = cluster_network_change(&new, &network4()) else { panic!() };
        assert!(why.contains("is fd00:10:128::/48 in the cluster, (unset) in this"), "{why}");
    }
}
