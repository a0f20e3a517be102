//! Single-stack IPv6 with real packets: two nodes (each its own userspace Open vSwitch
//! programmed by the agent, VXLAN between them), no IPv4 anywhere in the overlay — the state
//! has IPv6 networks and subnets only, br0 has no IPv4 flow, tun0 and the pods have IPv6
//! addresses only (tests/support/nodes.rs, `NodeSpec::ipv6_only`). The same answers as an
//! IPv4 cluster: pods reach each other by VNID and are isolated across VNIDs, neighbour
//! discovery resolves through the pipeline, TCP and UDP work on one node and across nodes,
//! multicast stays in its VNID, a foreign source is dropped, NetworkPolicy holds, and the
//! underlay may be IPv6 too (an all-IPv6 cluster).
//!
//! node-a: fd00:10:128:1::/64, gateway fd00:10:128:1::1
//! node-b: fd00:10:128:2::/64, gateway fd00:10:128:2::1
//! (The harness numbers pods with IPv4 strings, 10.128.0.5 -> fd00:10:128:1::5; the pods have
//! no IPv4 address.)

mod support;

use std::net::IpAddr;

use support::nodes::{ip_in, Cluster, NodeSpec, Pod, TeamPods, TEAM_NAMESPACES as NAMESPACES};
use support::traffic;

/// Two IPv6-only nodes with five pods; `underlay`: the nodes' hostIPs.
async fn two_nodes(test: &str, plugin: &str, underlay: [&str; 2]) -> Option<(Cluster, TeamPods)> {
    TeamPods::start(
        test,
        plugin,
        [
            NodeSpec::new("a", underlay[0], "10.128.0.0/23").ipv6_only("fd00:10:128:1::/64"),
            NodeSpec::new("b", underlay[1], "10.128.2.0/23").ipv6_only("fd00:10:128:2::/64"),
        ],
    )
    .await
}

const IPV4_UNDERLAY: [&str; 2] = ["172.17.0.2", "172.17.0.3"];

fn v6(p: &Pod) -> IpAddr {
    IpAddr::V6(p.ip6.expect("an IPv6-only pod has an IPv6 address"))
}

/// The IPv4 flows of a bridge's dump (`ip`, `arp`, `tcp`, ... or an `nw_` field in the match).
fn ipv4_flows(dump: &str) -> Vec<&str> {
    dump.lines()
        .filter(|l| {
            let m = l.split(" actions=").next().unwrap_or_default();
            m.split([',', ' ']).any(|t| matches!(t, "ip" | "arp" | "tcp" | "udp" | "sctp" | "icmp") || t.starts_with("nw_") || t.starts_with("arp_"))
        })
        .collect()
}

/// `from` reaches `to`'s (IPv6) address, or not (isolated).
async fn reach(c: &Cluster, from: &Pod, to: &Pod, reaches: bool, what: &str) {
    if reaches {
        c.assert_reaches(from, v6(to), what).await;
    } else {
        c.assert_isolated(from, v6(to), what).await;
    }
}

/// Multitenant, IPv6 only: nothing IPv4 on br0, tun0 or in the pods; a tenant reaches itself
/// on its node and across nodes, not the other tenant; VNID 0 reaches and is reached by both;
/// pods reach their gateway and the remote one, the node reaches a remote pod through tun0;
/// neighbour discovery went through the pipeline (each entry holds the peer's own MAC, its
/// IPv6-only MAC `0a:58:` + the address's last four bytes).
#[tokio::test]
async fn pods_reach_and_isolate_by_vnid_with_ipv6_alone() {
    let Some((c, p)) = two_nodes("pods_reach_and_isolate_by_vnid_with_ipv6_alone", "multitenant", IPV4_UNDERLAY).await else {
        return;
    };
    for n in c.nodes() {
        let dump = n.ofctl("dump-flows", "br0", &[]).await;
        let v4 = ipv4_flows(&dump);
        assert!(v4.is_empty(), "node {}: IPv4 flows on an IPv6-only node:\n{}", n.name(), v4.join("\n"));
        assert!(dump.contains("ipv6"), "node {}: no IPv6 flow:\n{dump}", n.name());
        let tun0 = ip_in(&n.netns, "-4 addr show dev tun0").await;
        assert!(!tun0.contains("inet "), "node {}: tun0 has an IPv4 address: {tun0}", n.name());
    }
    for pod in [&p.a1, &p.a3, &p.d1, &p.a2, &p.b1] {
        let v4 = ip_in(&pod.netns, "-4 addr show dev eth0").await;
        assert!(!v4.contains("inet "), "{}: an IPv4 address: {v4}", pod.name);
        assert_eq!(pod.mac, support::nodes::pod_mac6(pod.ip6.expect("IPv6")), "{}", pod.name);
    }
    reach(&c, &p.a1, &p.a3, true, "team-a -> team-a, one node").await;
    reach(&c, &p.a1, &p.a2, true, "team-a on a -> team-a on b").await;
    reach(&c, &p.a2, &p.a1, true, "team-a on b -> team-a on a").await;
    reach(&c, &p.a1, &p.b1, false, "team-a on a -> team-b on b").await;
    reach(&c, &p.b1, &p.a1, false, "team-b on b -> team-a on a").await;
    reach(&c, &p.d1, &p.b1, true, "default on a -> team-b on b").await;
    reach(&c, &p.b1, &p.d1, true, "team-b on b -> default on a").await;

    let (a, b) = (c.node("a"), c.node("b"));
    c.assert_reaches(&p.a1, a.spec.gateway6().expect("IPv6 node"), "team-a on a -> its gateway").await;
    c.assert_reaches(&p.a1, b.spec.gateway6().expect("IPv6 node"), "team-a on a -> node b's gateway").await;
    assert!(a.ping(v6(&p.a2)).await, "node a (tun0) -> team-a on b\n{}", c.diagnostics().await);
    for peer in [&p.a3, &p.a2] {
        let out = ip_in(&p.a1.netns, &format!("-6 neigh show {} dev eth0", v6(peer))).await;
        assert!(out.contains(&format!("lladdr {}", peer.mac)), "a1's neighbour entry for {}: {out:?}", peer.name);
    }
}

/// TCP (a bulk echo of full-size segments) and UDP, on one node and across nodes.
#[tokio::test]
async fn tcp_and_udp_on_one_node_and_across() {
    let Some((_c, p)) = two_nodes("tcp_and_udp_on_one_node_and_across", "multitenant", IPV4_UNDERLAY).await else {
        return;
    };
    for (server, port) in [(&p.a3, 8080u16), (&p.a2, 8081)] {
        traffic::tcp_bulk_echo(&p.a1, server, v6(server), port).await;
        traffic::udp_echo(&p.a1, server, v6(server), port, b"ipv6-only").await;
    }
}

/// An all-IPv6 cluster: the overlay IPv6-only and the underlay IPv6 too (hostIPs are IPv6:
/// `tun_ipv6_dst`, table 10 by `tun_ipv6_src`), isolated by VNID as over IPv4.
#[tokio::test]
async fn an_all_ipv6_cluster_over_an_ipv6_underlay() {
    let Some((c, p)) = two_nodes("an_all_ipv6_cluster_over_an_ipv6_underlay", "multitenant", ["fd00:172:17::2", "fd00:172:17::3"]).await else {
        return;
    };
    let flows = c.node("a").ofctl("dump-flows", "br0", &["table=90"]).await;
    assert!(flows.contains("set_field:fd00:172:17::3->tun_ipv6_dst"), "{flows}");
    reach(&c, &p.a1, &p.a2, true, "team-a on a -> team-a on b, IPv6 underlay").await;
    reach(&c, &p.a2, &p.a1, true, "team-a on b -> team-a on a, IPv6 underlay").await;
    reach(&c, &p.a1, &p.b1, false, "team-a on a -> team-b on b, IPv6 underlay").await;
    reach(&c, &p.d1, &p.b1, true, "default on a -> team-b on b, IPv6 underlay").await;
}

/// Spoofguard: a pod sending from an address that is not its own gets nothing through.
#[tokio::test]
async fn a_foreign_source_is_dropped() {
    let Some((c, p)) = two_nodes("a_foreign_source_is_dropped", "subnet", IPV4_UNDERLAY).await else {
        return;
    };
    c.assert_reaches(&p.a1, v6(&p.a3), "a1 -> a3 from a1's own address").await;
    let foreign = "fd00:10:128:1::99";
    let r = p.a1.ping_from(foreign, 64, v6(&p.a3)).await;
    assert!(r.unanswered(), "from {foreign}: expected no reply: {r:?}");
}

/// Multicast stays in its VNID, on the node and across the tunnel: a group datagram from
/// team-a reaches team-a's members on both nodes, not team-b's (multicast on too) nor
/// default's (multicast off).
#[tokio::test]
async fn multicast_stays_in_its_vnid() {
    let Some((c, p)) = two_nodes("multicast_stays_in_its_vnid", "multitenant", IPV4_UNDERLAY).await else {
        return;
    };
    c.apply_with_multicast("multitenant", &NAMESPACES, &["team-a", "team-b"]).await;
    let group: IpAddr = "ff15::102".parse().unwrap();
    traffic::multicast_reaches(&p.a1, group, 5003, &[(&p.a3, true), (&p.a2, true), (&p.b1, false), (&p.d1, false)]).await;
}

/// NetworkPolicy on IPv6-only nodes (networkpolicy plugin): a namespace-and-port rule admits
/// exactly its sources, an IPv6 ipBlock exactly its source, on one node and across nodes.
/// (The whole truth table runs in tests/netpol.rs `truth_table_on_ipv6_only_nodes`.)
#[tokio::test]
async fn network_policy_holds() {
    use serde_json::json;
    let Some((c, p)) = two_nodes("network_policy_holds_ipv6_only", "networkpolicy", IPV4_UNDERLAY).await else {
        return;
    };
    let policies = support::netpol_state::TeamPolicies::new(&c, &[&p.a1, &p.a3, &p.d1, &p.a2, &p.b1]);
    let apply = |list| policies.apply(list);
    let mut servers = Vec::new();
    for port in [8080u16, 9090] {
        servers.push(support::nodes::tcp_echo(p.b1.tcp_listen6(port).await));
        servers.push(support::nodes::tcp_echo(p.d1.tcp_listen6(port).await));
    }
    apply(vec![]).await;
    check("no policy", &[(&p.a1, &p.b1, 8080, true), (&p.a2, &p.d1, 9090, true), (&p.a3, &p.d1, 8080, true)]).await;
    apply(vec![json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "team-b", "name": "from-team-a-8080"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}}],
            "ports": [{"protocol": "TCP", "port": 8080}]}]}
    }), json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "default", "name": "from-a2-ipv6"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"ipBlock": {"cidr": format!("{}/128", v6(&p.a2))}}]}]}
    })])
    .await;
    check(
        "team-a may reach team-b on 8080; only a2 may reach default",
        &[
            (&p.a1, &p.b1, 8080, true),
            (&p.a2, &p.b1, 8080, true),
            (&p.a1, &p.b1, 9090, false),
            (&p.d1, &p.b1, 8080, false),
            (&p.a2, &p.d1, 9090, true),
            (&p.a1, &p.d1, 8080, false),
            (&p.b1, &p.d1, 8080, false),
        ],
    )
    .await;
    for s in servers {
        s.abort();
    }
}

/// Each (source, destination, port, verdict).
async fn check(what: &str, want: &[(&Pod, &Pod, u16, bool)]) {
    for &(from, to, port, want) in want {
        let got = traffic::connects(from, v6(to), port).await;
        assert_eq!(got, want, "{what}: {} -> {}:{port}", from.name, to.name);
    }
}
