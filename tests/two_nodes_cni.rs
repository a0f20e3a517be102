//! Two nodes, each a network namespace with its own ovsdb-server, ovs-vswitchd (netdev) and
//! `sdn-node run --state`, joined by a veth underlay (tests/support/nodes.rs); pods created on
//! both through libcni calling `sdn-node-cni` (issue 12). Real packets decide: which VNIDs reach
//! each other across nodes, the gateways, and a host outside the cluster (masquerade only).

mod support;

use std::collections::BTreeMap;

use support::cninode::{can_run, container, in_ns, ping, sh, NodeAgent, PodNs};
use support::nodes::{Cluster, NodeSpec};

const NAMESPACES: [(&str, u32); 3] = [("default", 0), ("team-a", 11), ("team-b", 12)];

struct Setup {
    // Drop order: pods, then agents, then the cluster (switches, namespaces).
    pods: BTreeMap<&'static str, (PodNs, String)>,
    agents: Vec<NodeAgent>,
    cluster: Cluster,
}

/// Pods: a-ta, a-tb, a-def on node a; b-ta, b-tb, b-def on node b.
async fn setup(test: &str, plugin: &str) -> Option<Setup> {
    if !can_run() {
        return None;
    }
    let cluster =
        Cluster::start(test, &[NodeSpec::new("a", "172.17.0.2", "10.128.0.0/23"), NodeSpec::new("b", "172.17.0.3", "10.128.2.0/23")])
            .await?;
    let mut agents = Vec::new();
    for name in ["a", "b"] {
        let node = cluster.node(name);
        let state = cluster.state_yaml(name, plugin, &NAMESPACES);
        agents.push(NodeAgent::start(&node.netns, node.sb.dir(), &state).await);
    }
    let mut pods = BTreeMap::new();
    let list: [(&'static str, usize, &str); 6] =
        [("a-ta", 0, "team-a"), ("a-tb", 0, "team-b"), ("a-def", 0, "default"), ("b-ta", 1, "team-a"), ("b-tb", 1, "team-b"), ("b-def", 1, "default")];
    for (i, (name, node, ns)) in list.iter().enumerate() {
        let p = PodNs::new(name);
        let r = agents[*node].cni("add", ns, name, &container(500 + i as u32), &p.path());
        assert!(r.ok(), "ADD {name}: {:?}\n{}", r.out, agents[*node].log());
        pods.insert(*name, (p, r.addr()));
    }
    Some(Setup { pods, agents, cluster })
}

impl Setup {
    /// Every node's agent says it is ready (issue 32: tests that change something end so).
    async fn ready_again(&self, what: &str) {
        for a in &self.agents {
            a.ready_again(&format!("{what} (agent in {})", a.ns)).await;
        }
    }

    fn reach(&self, from: &str, to: &str) -> bool {
        ping(&self.pods[from].0.name, &self.pods[to].1)
    }
    fn check(&self, from: &str, to: &str, want: bool) {
        let got = self.reach(from, to);
        assert_eq!(got, want, "{from} -> {to} ({}): want {}", self.pods[to].1, if want { "reached" } else { "blocked" });
    }
}

#[tokio::test]
async fn multitenant_pods_through_cni_across_two_nodes() {
    let Some(s) = setup("multitenant_pods_through_cni_across_two_nodes", "multitenant").await else { return };
    // Same VNID across nodes, both ways.
    s.check("a-ta", "b-ta", true);
    s.check("b-ta", "a-ta", true);
    // Different VNIDs across nodes do not.
    s.check("a-ta", "b-tb", false);
    s.check("b-tb", "a-ta", false);
    // VNID 0 reaches every VNID across nodes, and is reached.
    s.check("a-def", "b-tb", true);
    s.check("b-ta", "a-def", true);
    // Gateways: local and remote.
    assert!(ping(&s.pods["a-ta"].0.name, "10.128.0.1"), "local gateway");
    assert!(ping(&s.pods["a-ta"].0.name, "10.128.2.1"), "remote gateway");
    // A host outside the cluster, attached to node a: reached only through the masquerade.
    let ext = PodNs::new("ext");
    let node_a = &s.cluster.node("a").netns;
    let (x, y) = (format!("ex{}", std::process::id() % 100000), format!("ey{}", std::process::id() % 100000));
    assert!(sh(&["ip", "link", "add", &x, "type", "veth", "peer", "name", &y]).status.success());
    assert!(sh(&["ip", "link", "set", &x, "netns", node_a]).status.success());
    assert!(sh(&["ip", "link", "set", &y, "netns", &ext.name]).status.success());
    in_ns(node_a, &["ip", "addr", "add", "203.0.113.1/24", "dev", &x]);
    in_ns(node_a, &["ip", "link", "set", &x, "up"]);
    in_ns(&ext.name, &["ip", "addr", "add", "203.0.113.2/24", "dev", &y]);
    in_ns(&ext.name, &["ip", "link", "set", &y, "up"]);
    assert!(ping(&s.pods["a-ta"].0.name, "203.0.113.2"), "outside host through the masquerade");
    // The outside host has no route to the pod network: it saw the node's address.
    let (_, routes) = in_ns(&ext.name, &["ip", "route"]);
    assert!(!routes.contains("10.128."), "{routes}");
    // DEL everywhere.
    for (i, name) in ["a-ta", "a-tb", "a-def", "b-ta", "b-tb", "b-def"].iter().enumerate() {
        let agent = &s.agents[if name.starts_with('a') { 0 } else { 1 }];
        let ns = match &name[2..] {
            "ta" => "team-a",
            "tb" => "team-b",
            _ => "default",
        };
        let r = agent.cni("del", ns, name, &container(500 + i as u32), &s.pods[name].0.path());
        assert!(r.ok(), "DEL {name}: {:?}", r.out);
    }
    s.ready_again("after the pods were deleted").await;
}

#[tokio::test]
async fn subnet_plugin_pods_through_cni_reach_everything() {
    let Some(s) = setup("subnet_plugin_pods_through_cni_reach_everything", "subnet").await else { return };
    for from in ["a-ta", "b-tb"] {
        for to in ["a-tb", "b-ta", "b-def", "a-def"] {
            if from != to {
                s.check(from, to, true);
            }
        }
    }
    s.ready_again("after the checks").await;
}
