//! Two nodes on one machine, each a network namespace with its own userspace Open vSwitch
//! programmed by the agent; pods on different nodes talk through VXLAN with real packets
//! (see tests/support/nodes.rs for the topology).
//!
//! node-a: subnet 10.128.0.0/23, hostIP 172.17.0.2, gateway 10.128.0.1 on tun0
//! node-b: subnet 10.128.2.0/23, hostIP 172.17.0.3, gateway 10.128.2.1 on tun0
//!
//! Each ping is one echo request (`ping -c1 -W2`): no retries, so the first packet across
//! the tunnel must make it (the harness pre-seeds OVS's tunnel neighbour cache).

mod support;

use support::nodes::{Cluster, Node, NodeSpec, Pod};

const NAMESPACES: [(&str, u32); 3] = [("default", 0), ("team-a", 11), ("team-b", 12)];
const GATEWAY_B: &str = "10.128.2.1";
/// Bound on the revalidator rounds waited for while flow counters catch up.
const REVALIDATOR_ROUNDS: usize = 20;

struct Pods {
    /// team-a on node-a.
    a_ta: Pod,
    /// default on node-a.
    a_def: Pod,
    /// team-a on node-b.
    b_ta: Pod,
    /// team-b on node-b.
    b_tb: Pod,
    /// default on node-b.
    b_def: Pod,
}

async fn two_nodes(test: &str, plugin: &str) -> Option<(Cluster, Pods)> {
    let mut c = Cluster::start(
        test,
        &[NodeSpec::new("a", "172.17.0.2", "10.128.0.0/23"), NodeSpec::new("b", "172.17.0.3", "10.128.2.0/23")],
    )
    .await?;
    let a = c.node_mut("a");
    let a_ta = a.add_pod("team-a", "a1", "10.128.0.5").await;
    let a_def = a.add_pod("default", "d1", "10.128.0.7").await;
    let b = c.node_mut("b");
    let b_ta = b.add_pod("team-a", "a2", "10.128.2.5").await;
    let b_tb = b.add_pod("team-b", "b1", "10.128.2.6").await;
    let b_def = b.add_pod("default", "d2", "10.128.2.7").await;
    c.apply_all(plugin, &NAMESPACES).await;
    Some((c, Pods { a_ta, a_def, b_ta, b_tb, b_def }))
}

/// Packets counted by br0's table=80 priority=0 drop flow (VNID isolation) on `node`, once it
/// has counted `at_least` or after a bounded number of revalidator rounds (the userspace
/// datapath's counts reach the OpenFlow rules when a revalidator dumps the datapath flows).
async fn isolation_drops(node: &Node, at_least: u64) -> u64 {
    let mut n = 0;
    for _ in 0..REVALIDATOR_ROUNDS {
        node.appctl(&["revalidator/wait"]).await;
        let dump = node.ofctl("dump-flows", "br0", &["table=80"]).await;
        let line = dump
            .lines()
            .find(|l| l.trim_end().ends_with("priority=0 actions=drop"))
            .unwrap_or_else(|| panic!("no table=80 priority=0 drop flow in\n{dump}"));
        n = line
            .split(", ")
            .find_map(|f| f.trim().strip_prefix("n_packets="))
            .expect("n_packets")
            .parse()
            .expect("n_packets is a number");
        if n >= at_least {
            break;
        }
    }
    n
}

/// Multitenant: a tenant reaches itself across nodes, not the other tenant; VNID 0 reaches
/// and is reached by both; a pod reaches the remote node's gateway and the node its pods.
#[tokio::test]
async fn multitenant_across_two_nodes() {
    let Some((c, p)) = two_nodes("multitenant_across_two_nodes", "multitenant").await else {
        return;
    };
    // One tenant, across nodes, both ways.
    c.assert_reaches(&p.a_ta, p.b_ta.ip, "team-a on a -> team-a on b").await;
    c.assert_reaches(&p.b_ta, p.a_ta.ip, "team-a on b -> team-a on a").await;

    // Two tenants: the echo requests cross the tunnel with the sender's VNID in tun_id and
    // die in the receiving node's table 80.
    let b = c.node("b");
    let a = c.node("a");
    let (b_before, a_before) = (isolation_drops(b, 0).await, isolation_drops(a, 0).await);
    c.assert_isolated(&p.a_ta, p.b_tb.ip, "team-a on a -> team-b on b").await;
    c.assert_isolated(&p.b_tb, p.a_ta.ip, "team-b on b -> team-a on a").await;
    assert_eq!(isolation_drops(b, b_before + 1).await - b_before, 1, "team-a's request dropped on node b");
    assert_eq!(isolation_drops(a, a_before + 1).await - a_before, 1, "team-b's request dropped on node a");

    // The global VNID 0, across nodes, both ways, with both tenants.
    c.assert_reaches(&p.a_def, p.b_ta.ip, "default on a -> team-a on b").await;
    c.assert_reaches(&p.a_def, p.b_tb.ip, "default on a -> team-b on b").await;
    c.assert_reaches(&p.b_ta, p.a_def.ip, "team-a on b -> default on a").await;
    c.assert_reaches(&p.b_tb, p.a_def.ip, "team-b on b -> default on a").await;
    c.assert_reaches(&p.b_def, p.a_ta.ip, "default on b -> team-a on a").await;
    c.assert_reaches(&p.a_ta, p.b_def.ip, "team-a on a -> default on b").await;

    // The remote node's gateway (tun0 of node b), and node a itself (through its tun0) to a
    // pod on node b.
    c.assert_reaches(&p.a_ta, GATEWAY_B, "team-a on a -> node b's gateway").await;
    assert!(a.ping(p.b_tb.ip).await, "node a (tun0) -> team-b on b\n{}", c.diagnostics().await);
}

/// TCP between pods on two nodes: a bulk echo of full-size segments. Needs correct
/// checksums (TX offload off in the pods) and inner frames that fit the underlay with
/// VXLAN's 50 bytes (pod MTU 1450), which ping's small echo requests do not show.
#[tokio::test]
async fn tcp_across_two_nodes() {
    let Some((_c, p)) = two_nodes("tcp_across_two_nodes", "multitenant").await else {
        return;
    };
    support::traffic::tcp_bulk_echo(&p.a_ta, &p.b_ta, std::net::IpAddr::V4(p.b_ta.ip), 8080).await;
}

/// Subnet plugin: every pod has VNID 0, so every pod reaches every other across nodes.
#[tokio::test]
async fn subnet_plugin_across_two_nodes() {
    let Some((c, p)) = two_nodes("subnet_plugin_across_two_nodes", "subnet").await else {
        return;
    };
    c.assert_reaches(&p.a_ta, p.b_tb.ip, "team-a on a -> team-b on b (subnet)").await;
    c.assert_reaches(&p.b_tb, p.a_ta.ip, "team-b on b -> team-a on a (subnet)").await;
    c.assert_reaches(&p.a_ta, p.b_ta.ip, "team-a on a -> team-a on b (subnet)").await;
    c.assert_reaches(&p.a_def, p.b_def.ip, "default on a -> default on b (subnet)").await;
    c.assert_reaches(&p.b_def, p.a_def.ip, "default on b -> default on a (subnet)").await;
    c.assert_reaches(&p.a_ta, GATEWAY_B, "team-a on a -> node b's gateway (subnet)").await;
}
