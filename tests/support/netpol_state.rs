//! The networkpolicy state file of one node of a two-node harness (tests/netpol.rs,
//! tests/netpol_sctp.rs): its own pods with labels and container ports, the other node's as
//! `remotePods` (also with container ports: egress named ports resolve on the destination),
//! the policies as whole Kubernetes objects.

use serde_json::{json, Value};

use super::netpol_eval::EvalPod;
use super::nodes::{Cluster, Pod, CLUSTER_NETWORK, CLUSTER_NETWORK6, SERVICE_NETWORK, SERVICE_NETWORK6};

/// Node `node`'s state with `net_namespaces` (state-file entries) and `policies`.
pub fn state_json(c: &Cluster, node: &str, net_namespaces: Vec<Value>, pods: &[(Pod, EvalPod)], policies: &[Value]) -> String {
    let host_subnets: Vec<Value> = c
        .nodes()
        .iter()
        .map(|n| match n.spec.subnet6 {
            Some(s6) if n.spec.ipv6_only => json!({"host": n.spec.host(), "hostIP": n.spec.host_ip.to_string(), "subnet": s6.to_string()}),
            Some(s6) => json!({"host": n.spec.host(), "hostIP": n.spec.host_ip.to_string(), "subnets": [n.spec.subnet.to_string(), s6.to_string()]}),
            None => json!({"host": n.spec.host(), "hostIP": n.spec.host_ip.to_string(), "subnet": n.spec.subnet.to_string()}),
        })
        .collect();
    // A dual-stack harness (nodes with IPv6 subnets): every address of both families.
    // An IPv6-only harness: the pods' IPv6 addresses alone.
    let dual = c.nodes().iter().any(|n| n.spec.subnet6.is_some());
    let v6only = c.nodes().iter().all(|n| n.spec.ipv6_only);
    let ips = |p: &Pod| -> Value {
        let mut v = if p.ipv6_only { vec![] } else { vec![p.ip.to_string()] };
        v.extend(p.ip6.map(|a| a.to_string()));
        json!(v)
    };
    let first = |p: &Pod| if p.ipv6_only { p.ip6.map(|a| a.to_string()).unwrap_or_default() } else { p.ip.to_string() };
    let mut local = Vec::new();
    let mut remote = Vec::new();
    for (p, e) in pods {
        let ports: Vec<Value> =
            e.container_ports.iter().map(|(n, port, proto)| json!({"name": n, "containerPort": port, "protocol": proto})).collect();
        if p.node == node {
            local.push(json!({
                "namespace": p.namespace, "name": p.name, "containerID": p.container_id, "hostVeth": p.host_veth,
                "ip": first(p), "ips": ips(p), "mac": p.mac, "labels": e.labels, "containerPorts": ports,
            }));
        } else {
            remote.push(json!({"namespace": p.namespace, "name": p.name, "ips": ips(p), "labels": e.labels, "containerPorts": ports}));
        }
    }
    let (clusters, services) = if v6only {
        (json!([CLUSTER_NETWORK6]), json!([SERVICE_NETWORK6]))
    } else if dual {
        (json!([CLUSTER_NETWORK, CLUSTER_NETWORK6]), json!([SERVICE_NETWORK, SERVICE_NETWORK6]))
    } else {
        (json!([CLUSTER_NETWORK]), json!([SERVICE_NETWORK]))
    };
    json!({
        "node": format!("node-{node}"), "plugin": "networkpolicy",
        "clusterNetworks": clusters, "serviceNetworks": services,
        "hostSubnets": host_subnets, "netNamespaces": net_namespaces, "pods": local,
        "remotePods": remote, "networkPolicies": policies,
    })
    .to_string()
}

/// The networkpolicy plugin on a harness cluster whose pods are labelled `app=<name>` and
/// whose namespaces ([`super::nodes::TEAM_NAMESPACES`]) carry their name label: the
/// policies of a test are applied to every node at once.
pub struct TeamPolicies<'a> {
    c: &'a Cluster,
    pods: Vec<(Pod, EvalPod)>,
    namespaces: Vec<Value>,
}

impl<'a> TeamPolicies<'a> {
    pub fn new(c: &'a Cluster, pods: &[&Pod]) -> TeamPolicies<'a> {
        let pods = pods
            .iter()
            .map(|x| {
                let labels = [("app".to_string(), x.name.clone())].into();
                ((*x).clone(), EvalPod { namespace: x.namespace.clone(), name: x.name.clone(), ip: x.ip, labels, container_ports: vec![] })
            })
            .collect();
        let namespaces = super::nodes::TEAM_NAMESPACES
            .iter()
            .map(|(n, id)| json!({"name": n, "netid": id, "labels": {"kubernetes.io/metadata.name": n}}))
            .collect();
        TeamPolicies { c, pods, namespaces }
    }

    /// Every node's state with `policies`, applied (no problem allowed), and its datapath
    /// cache purged so that the next packets meet the new flows.
    pub async fn apply(&self, policies: Vec<Value>) {
        for n in self.c.nodes() {
            let r = n.apply(&state_json(self.c, n.name(), self.namespaces.clone(), &self.pods, &policies)).await;
            assert!(r.problems.is_empty(), "node {}: {:?}", n.name(), r.problems);
            n.appctl(&["revalidator/purge"]).await;
        }
    }
}
