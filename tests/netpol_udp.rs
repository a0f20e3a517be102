//! One-way UDP across nodes (issue 32 item 8b): two netdev nodes joined by VXLAN, a client pod
//! on node a whose Egress policy allows UDP 5000-5001, a server pod on node b whose Ingress
//! policy allows UDP 5000. A stream of 1,000 datagrams from one socket, which never gets a
//! reply (never `+est` in conntrack), meets node a's allowed flow in table 27 and node b's in
//! table 80 once each — the flows whose statistics are the per-policy connection counters
//! (tests/netpol_counters.rs reads them through the agent on one node) — and the marked-UDP
//! flows at priority 200 pass the rest. Datagrams to 5001 (egress allows, ingress denies) meet
//! node b's drop every time.
//!
//! Unlike the one-node test, each node has its own conntrack: node b's entry is made by table
//! 30's commit of what comes out of the tunnel, and marked by table 80's allowed flow.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::netpol_eval::EvalPod;
use support::netpol_state;
use support::nodes::{in_netns, Cluster, Node, NodeSpec, Pod};

const WAIT: Duration = Duration::from_secs(60);

fn np(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// The sum of `n_packets` of `table`'s flows whose line holds every one of `has`.
async fn packets(node: &Node, table: u8, has: &[&str]) -> u64 {
    let out = node.ofctl("dump-flows", "br0", &[&format!("table={table}")]).await;
    out.lines()
        .filter(|l| has.iter().all(|h| l.contains(h)))
        .map(|l| {
            l.split("n_packets=")
                .nth(1)
                .and_then(|v| v.split(',').next())
                .and_then(|v| v.parse::<u64>().ok())
                .expect("n_packets")
        })
        .sum()
}

/// Waits until `packets` is `want` (the switch's statistics lag its datapath by up to a
/// second), then checks it is still `want` a while later: exact, not at least.
async fn settle(node: &Node, table: u8, has: &[&str], want: u64) {
    let end = Instant::now() + WAIT;
    loop {
        let got = packets(node, table, has).await;
        if got == want {
            break;
        }
        assert!(
            Instant::now() < end,
            "node {} table {table} {has:?}: {got} packets, want {want}\n{}",
            node.name(),
            node.ofctl("dump-flows", "br0", &[&format!("table={table}")]).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(packets(node, table, has).await, want, "node {} table {table} {has:?} moved on", node.name());
}

#[tokio::test]
async fn a_one_way_udp_stream_meets_each_nodes_policy_flows_once() {
    let Some(mut c) = Cluster::start(
        "a_one_way_udp_stream_meets_each_nodes_policy_flows_once",
        &[NodeSpec::new("a", "172.17.0.2", "10.128.0.0/23"), NodeSpec::new("b", "172.17.0.3", "10.128.2.0/23")],
    )
    .await
    else {
        return;
    };
    let client = c.node_mut("a").add_pod("client", "c1", "10.128.0.10").await;
    let server = c.node_mut("b").add_pod("isolated", "s1", "10.128.2.10").await;
    let eval = |p: &Pod| EvalPod {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        ip: p.ip,
        labels: Default::default(),
        container_ports: vec![],
    };
    let pods = vec![(client.clone(), eval(&client)), (server.clone(), eval(&server))];
    let policies = [
        np(
            "isolated",
            "udp-in",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 5000}]}]}),
        ),
        np(
            "client",
            "udp-out",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"protocol": "UDP", "port": 5000, "endPort": 5001}]}]}),
        ),
    ];
    let namespaces = || vec![json!({"name": "client", "netid": 13}), json!({"name": "isolated", "netid": 11})];
    for n in c.nodes() {
        let r = n.apply(&netpol_state::state_json(&c, n.name(), namespaces(), &pods, &policies)).await;
        assert!(r.problems.is_empty() && r.warnings.is_empty(), "node {}: {r:?}", n.name());
    }
    // The switch gives the marks back as they were sent (`load:…->NXM_NX_CT_MARK[n]` inside
    // `ct(exec(...))`, masked matches): a second apply finds nothing to change.
    for n in c.nodes() {
        let r = n.apply(&netpol_state::state_json(&c, n.name(), namespaces(), &pods, &policies)).await;
        assert_eq!(
            (r.adds, r.modifies, r.deletes),
            (0, 0, 0),
            "node {}: a second apply changed flows: {r:?}",
            n.name()
        );
    }
    let (a, b) = (c.node("a"), c.node("b"));
    // The policies' own flows: node a's egress rule (table 27), node b's ingress rule (table
    // 80), both plain flows (one pod, one port each), and node b's drop for s1.
    let egress_rule: &[&str] = &["priority=150,", "udp,", "nw_src=10.128.0.10", "goto_table:28"];
    let ingress_rule: &[&str] = &["priority=150,", "udp,", "nw_dst=10.128.2.10", "tp_dst=5000", "output:NXM_NX_REG2[]"];
    let drop: &[&str] = &["priority=100,", "nw_dst=10.128.2.10", "actions=drop"];
    assert!(
        a.ofctl("dump-flows", "br0", &["table=27"]).await.contains("nw_src=10.128.0.10,tp_dst=0x1388/0xfffe"),
        "node a's egress rule"
    );
    assert!(b.ofctl("dump-flows", "br0", &["table=80"]).await.contains("tp_dst=5000"), "node b's ingress rule");

    let got = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sink = in_netns(&server.netns, || UdpSocket::bind(("0.0.0.0", 5000))).await.expect("bind 5000");
    let g = got.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while sink.recv_from(&mut buf).is_ok() {
            g.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let s = in_netns(&client.netns, || UdpSocket::bind("0.0.0.0:0")).await.expect("bind");
    let to = |port: u16| SocketAddr::from((server.ip, port));
    // The first datagram alone, until it arrives (ARP and the tunnel resolved; see
    // docs/networkpolicy.md on the first batch), then the rest at once.
    s.send_to(&0u32.to_be_bytes(), to(5000)).unwrap();
    let end = Instant::now() + WAIT;
    while got.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < end, "the first datagram never arrived\n{}", c.diagnostics().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 1..1000u32 {
        s.send_to(&i.to_be_bytes(), to(5000)).unwrap();
        if i % 100 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for i in 0..10u32 {
        s.send_to(&i.to_be_bytes(), to(5001)).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Node a judged two connections (to 5000 and to 5001), node b one; b dropped ten.
    settle(a, 27, egress_rule, 2).await;
    settle(b, 80, ingress_rule, 1).await;
    settle(b, 80, drop, 10).await;
    let got = got.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("one-way stream across nodes: {got} of 1000 datagrams arrived");
    assert!(got >= 100, "the stream passed ({got} of 1000 arrived)");
    let marked_b = packets(b, 80, &["ct_mark=0x2/0x2,udp"]).await;
    assert!((got - 1..=999).contains(&marked_b), "node b's marked-UDP flow passed {marked_b}, the pod got {got}");
    let marked_a = packets(a, 27, &["ct_mark=0x4/0x4,udp"]).await;
    assert!(
        (got - 1 + 9..=999 + 9).contains(&marked_a),
        "node a's marked-UDP flow passed {marked_a}, the pod got {got}"
    );
}
