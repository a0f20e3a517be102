//! Kubernetes objects to the state file's schema: the cluster state is then decoded and
//! validated by [`state_file::from_value`], exactly as a state file is.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::{json, Map, Value};

use super::types::{
    annotations, ClusterNetwork, EgressNetworkPolicy, HostSubnet, NetNamespace, FIXED_VNID_ANNOTATION,
    MULTICAST_ANNOTATION,
};
use crate::cluster::{state_file, PodKey};
use crate::run::source::Loaded;

/// A complete view of the watched objects (every reflector has listed).
pub struct Snapshot<'a> {
    pub node: &'a str,
    pub cluster_network: Option<&'a ClusterNetwork>,
    pub host_subnets: &'a [&'a HostSubnet],
    pub net_namespaces: &'a [&'a NetNamespace],
    pub services: &'a [&'a Service],
    /// Empty while listing policies is forbidden.
    pub egress_policies: &'a [&'a EgressNetworkPolicy],
    /// This node's pods.
    pub pods: &'a [&'a Pod],
}

/// The openshift-sdn plugin names.
pub fn plugin(name: &str) -> Option<&'static str> {
    match name {
        "redhat/openshift-ovs-subnet" => Some("subnet"),
        "redhat/openshift-ovs-multitenant" => Some("multitenant"),
        _ => None,
    }
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn ns_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_default()
}

/// The state in the state file's schema, and this node's live pods. An error means the state
/// cannot be built at all (no usable ClusterNetwork); nothing is published then.
pub fn to_value(s: &Snapshot<'_>) -> Result<(Value, BTreeSet<PodKey>), String> {
    let Some(cn) = s.cluster_network else {
        return Err("ClusterNetwork \"default\" does not exist".into());
    };
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

    let mut host_subnets: Vec<Value> = s
        .host_subnets
        .iter()
        .map(|h| {
            let host = if h.host.is_empty() { name_of(&h.metadata) } else { h.host.clone() };
            let mut o = Map::new();
            o.insert("host".into(), json!(host));
            o.insert("hostIP".into(), json!(h.host_ip));
            o.insert("subnet".into(), json!(h.subnet));
            if let Some(v) = annotations(&h.metadata).get(FIXED_VNID_ANNOTATION) {
                // A number, or the text (which validation rejects, naming fixedVNID).
                o.insert("fixedVNID".into(), v.trim().parse::<u64>().map(Value::from).unwrap_or_else(|_| json!(v)));
            }
            Value::Object(o)
        })
        .collect();
    host_subnets.sort_by_key(|v| v["host"].as_str().unwrap_or_default().to_string());

    let mut net_namespaces: Vec<Value> = s
        .net_namespaces
        .iter()
        .map(|n| {
            let name = if n.netname.is_empty() { name_of(&n.metadata) } else { n.netname.clone() };
            let multicast = annotations(&n.metadata).get(MULTICAST_ANNOTATION).is_some_and(|v| v == "true");
            json!({"name": name, "netid": n.netid, "multicast": multicast})
        })
        .collect();
    net_namespaces.sort_by_key(|v| v["name"].as_str().unwrap_or_default().to_string());

    let mut services: Vec<(String, String, Value)> = s
        .services
        .iter()
        .filter_map(|svc| {
            let spec = svc.spec.as_ref()?;
            let ip = spec.cluster_ip.as_deref().unwrap_or("");
            // Headless services (and ExternalName ones) have no cluster IP to program.
            if ip.is_empty() || ip == "None" {
                return None;
            }
            let ports: Vec<Value> = spec
                .ports
                .iter()
                .flatten()
                .map(|p| json!({"protocol": p.protocol.as_deref().unwrap_or("TCP"), "port": p.port}))
                .collect();
            let (ns, name) = (ns_of(&svc.metadata), name_of(&svc.metadata));
            Some((ns.clone(), name.clone(), json!({"namespace": ns, "name": name, "clusterIP": ip, "ports": ports})))
        })
        .collect();
    services.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));

    let mut policies: Vec<(String, String, Value)> = s
        .egress_policies
        .iter()
        .map(|p| {
            let (ns, name) = (ns_of(&p.metadata), name_of(&p.metadata));
            let egress: Vec<Value> = p
                .spec
                .egress
                .iter()
                .map(|r| {
                    let mut to = Map::new();
                    if let Some(c) = &r.to.cidr_selector {
                        to.insert("cidrSelector".into(), json!(c));
                    }
                    if let Some(d) = &r.to.dns_name {
                        to.insert("dnsName".into(), json!(d));
                    }
                    json!({"type": r.kind, "to": to})
                })
                .collect();
            (ns.clone(), name.clone(), json!({"namespace": ns, "name": name, "egress": egress}))
        })
        .collect();
    policies.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));

    let live: BTreeSet<PodKey> = s.pods.iter().map(|p| (ns_of(&p.metadata), name_of(&p.metadata))).collect();
    let value = json!({
        "node": s.node,
        "plugin": plugin,
        "clusterNetwork": cluster_network,
        "serviceNetwork": service_network,
        "vxlanPort": cn.vxlan_port.as_ref().and_then(Value::as_u64).unwrap_or(4789),
        "hostSubnets": host_subnets,
        "netNamespaces": net_namespaces,
        "services": services.into_iter().map(|t| t.2).collect::<Vec<_>>(),
        // Pods are set up through the pod API; the cluster only says which still exist.
        "pods": [],
        "egressNetworkPolicies": policies.into_iter().map(|t| t.2).collect::<Vec<_>>(),
    });
    Ok((value, live))
}

/// Builds and validates the state.
pub fn load(value: Value, live: BTreeSet<PodKey>) -> Result<Loaded, String> {
    let (state, problems) = state_file::from_value(value).map_err(|e| e.0)?;
    Ok(Loaded { state, problems, live_pods: Some(live) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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

    #[test]
    fn objects_map_to_the_state_schema() {
        let cn = cn("redhat/openshift-ovs-multitenant");
        let hs = [
            HostSubnet {
                metadata: meta(None, "node-a", &[]),
                host: "node-a".into(),
                host_ip: "172.17.0.2".into(),
                subnet: "10.128.2.0/23".into(),
            },
            HostSubnet {
                metadata: meta(None, "node-b", &[(FIXED_VNID_ANNOTATION, "7")]),
                host: "node-b".into(),
                host_ip: "172.17.0.3".into(),
                subnet: "10.129.0.0/23".into(),
            },
        ];
        let nn = [
            NetNamespace {
                metadata: meta(None, "team-a", &[(MULTICAST_ANNOTATION, "true")]),
                netname: "team-a".into(),
                netid: json!(11),
            },
            NetNamespace { metadata: meta(None, "default", &[]), netname: "default".into(), netid: json!(0) },
            NetNamespace { metadata: meta(None, "bad", &[]), netname: "bad".into(), netid: json!("x") },
        ];
        let svc: Vec<Service> = vec![
            serde_json::from_value(json!({"metadata": {"namespace": "team-a", "name": "web"},
                "spec": {"clusterIP": "172.30.0.10", "ports": [{"protocol": "TCP", "port": 80}, {"port": 53, "protocol": "UDP"}]}}))
            .unwrap(),
            serde_json::from_value(json!({"metadata": {"namespace": "team-a", "name": "headless"}, "spec": {"clusterIP": "None"}})).unwrap(),
        ];
        let enp: EgressNetworkPolicy = serde_json::from_value(json!({"metadata": {"namespace": "team-a", "name": "default"},
            "spec": {"egress": [{"type": "Allow", "to": {"cidrSelector": "1.2.3.0/24"}}, {"type": "Deny", "to": {"dnsName": "example.com"}}]}}))
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({"metadata": {"namespace": "team-a", "name": "a1"}})).unwrap();
        let snap = Snapshot {
            node: "node-a",
            cluster_network: Some(&cn),
            host_subnets: &hs.iter().collect::<Vec<_>>(),
            net_namespaces: &nn.iter().collect::<Vec<_>>(),
            services: &svc.iter().collect::<Vec<_>>(),
            egress_policies: &[&enp],
            pods: &[&pod],
        };
        let (v, live) = to_value(&snap).unwrap();
        assert_eq!(v["clusterNetwork"], "10.128.0.0/14");
        assert_eq!(v["hostSubnets"][1]["fixedVNID"], 7);
        assert_eq!(v["netNamespaces"][0]["name"], "bad");
        assert_eq!(v["netNamespaces"][2]["multicast"], true);
        assert_eq!(v["services"].as_array().unwrap().len(), 1, "headless skipped");
        assert!(live.contains(&("team-a".to_string(), "a1".to_string())));
        let l = load(v, live).unwrap();
        assert_eq!(l.state.plugin, crate::model::Plugin::Multitenant);
        assert_eq!(l.state.net_namespaces.len(), 2);
        assert_eq!(l.state.services[0].ports.len(), 2);
        assert_eq!(l.state.egress_policies[0].rules.len(), 2);
        assert_eq!(l.problems.len(), 1, "{:?}", l.problems);
        assert!(l.problems[0].to_string().starts_with("netnamespace bad: field netid"), "{}", l.problems[0]);
    }

    #[test]
    fn unknown_plugin_is_an_error() {
        let cn = cn("cni/other");
        let snap = Snapshot {
            node: "n",
            cluster_network: Some(&cn),
            host_subnets: &[],
            net_namespaces: &[],
            services: &[],
            egress_policies: &[],
            pods: &[],
        };
        let e = to_value(&snap).unwrap_err();
        assert!(e.contains("pluginName \"cni/other\""), "{e}");
        let snap = Snapshot { cluster_network: None, ..snap };
        assert!(to_value(&snap).unwrap_err().contains("does not exist"));
    }
}
