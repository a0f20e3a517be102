//! Dual-stack with real packets: two nodes (each its own userspace Open vSwitch programmed by
//! the agent, VXLAN over an IPv4 underlay), every pod with an IPv4 and an IPv6 address
//! (tests/support/nodes.rs). Both families must give the same answers: the same pod pairs
//! reach each other, the same are isolated by VNID, neighbour discovery resolves through the
//! pipeline as ARP does, and a pod cannot send from an IPv6 address that is not its own.
//!
//! node-a: 10.128.0.0/23 + fd00:10:128:1::/64, gateway 10.128.0.1 / fd00:10:128:1::1
//! node-b: 10.128.2.0/23 + fd00:10:128:2::/64, gateway 10.128.2.1 / fd00:10:128:2::1

mod support;

use std::net::IpAddr;

use support::nodes::{ip_in, Cluster, NodeSpec, Pod, TeamPods, TEAM_NAMESPACES as NAMESPACES};
use support::traffic;

async fn two_dual_stack_nodes(test: &str, plugin: &str) -> Option<(Cluster, TeamPods)> {
    TeamPods::start(
        test,
        plugin,
        [
            NodeSpec::new("a", "172.17.0.2", "10.128.0.0/23").ipv6("fd00:10:128:1::/64"),
            NodeSpec::new("b", "172.17.0.3", "10.128.2.0/23").ipv6("fd00:10:128:2::/64"),
        ],
    )
    .await
}

fn v6(p: &Pod) -> IpAddr {
    IpAddr::V6(p.ip6.expect("a dual-stack pod has an IPv6 address"))
}

/// Both families, one answer: `from` reaches `to` on its IPv4 and its IPv6 address, or on
/// neither (isolated).
async fn both_families(c: &Cluster, from: &Pod, to: &Pod, reaches: bool, what: &str) {
    for dst in [IpAddr::V4(to.ip), v6(to)] {
        if reaches {
            c.assert_reaches(from, dst, what).await;
        } else {
            c.assert_isolated(from, dst, what).await;
        }
    }
}

/// Multitenant in both families: a tenant reaches itself on its node and across nodes, not
/// the other tenant; VNID 0 reaches and is reached by both; pods reach their gateway's and the
/// remote gateway's IPv6 address, and the node reaches a remote pod over IPv6 through tun0.
#[tokio::test]
async fn both_families_reach_and_isolate_by_vnid() {
    let Some((c, p)) = two_dual_stack_nodes("both_families_reach_and_isolate_by_vnid", "multitenant").await else {
        return;
    };
    both_families(&c, &p.a1, &p.a3, true, "team-a -> team-a, one node").await;
    both_families(&c, &p.a1, &p.a2, true, "team-a on a -> team-a on b").await;
    both_families(&c, &p.a2, &p.a1, true, "team-a on b -> team-a on a").await;
    both_families(&c, &p.a1, &p.b1, false, "team-a on a -> team-b on b").await;
    both_families(&c, &p.b1, &p.a1, false, "team-b on b -> team-a on a").await;
    both_families(&c, &p.d1, &p.b1, true, "default on a -> team-b on b").await;
    both_families(&c, &p.b1, &p.d1, true, "team-b on b -> default on a").await;

    let (a, b) = (c.node("a"), c.node("b"));
    let gw_a = a.spec.gateway6().expect("dual-stack node");
    let gw_b = b.spec.gateway6().expect("dual-stack node");
    c.assert_reaches(&p.a1, gw_a, "team-a on a -> its gateway's IPv6").await;
    c.assert_reaches(&p.a1, gw_b, "team-a on a -> node b's gateway's IPv6").await;
    assert!(a.ping(v6(&p.a2)).await, "node a (tun0) -> team-a on b over IPv6\n{}", c.diagnostics().await);

    // Neighbour discovery went through the pipeline: the IPv6 cluster network is on-link in
    // the pods, so a1 solicited a3 itself (tables 20, 30, 40) and a2 across the tunnel (50,
    // then node b's 40); each answer carries the peer's own MAC, not a node's.
    for peer in [&p.a3, &p.a2] {
        let out = ip_in(&p.a1.netns, &format!("-6 neigh show {} dev eth0", v6(peer))).await;
        assert!(out.contains(&format!("lladdr {}", peer.mac)), "a1's neighbour entry for {}: {out:?}", peer.name);
    }
}

/// TCP (a bulk echo of full-size segments) and UDP over IPv6, on one node and across nodes.
#[tokio::test]
async fn tcp_and_udp_over_ipv6() {
    let Some((_c, p)) = two_dual_stack_nodes("tcp_and_udp_over_ipv6", "multitenant").await else {
        return;
    };
    for (server, port) in [(&p.a3, 8080u16), (&p.a2, 8081)] {
        traffic::tcp_bulk_echo(&p.a1, server, v6(server), port).await;
        traffic::udp_echo(&p.a1, server, v6(server), port, b"dual-stack").await;
    }
}

/// Spoofguard in IPv6: a pod sending from an IPv6 address that is not its own gets nothing
/// through (table 20 drops it), while its own address works.
#[tokio::test]
async fn ipv6_from_a_foreign_address_is_dropped() {
    let Some((c, p)) = two_dual_stack_nodes("ipv6_from_a_foreign_address_is_dropped", "subnet").await else {
        return;
    };
    c.assert_reaches(&p.a1, v6(&p.a3), "a1 -> a3 from a1's own address").await;
    // An extra address in a1's subnet (not a1's): the same pod, a foreign source.
    let foreign = "fd00:10:128:1::99";
    let r = p.a1.ping_from(foreign, 64, v6(&p.a3)).await;
    assert!(r.unanswered(), "from {foreign}: expected no reply: {r:?}");
}

/// Nodes whose underlay is IPv6 only (hostIP an IPv6 address): VXLAN goes to
/// `tun_ipv6_dst`, table 10 accepts by `tun_ipv6_src`, and pods of both families reach each
/// other across it, isolated by VNID as over IPv4.
#[tokio::test]
async fn an_ipv6_underlay_carries_both_families() {
    let Some(mut c) = Cluster::start(
        "an_ipv6_underlay_carries_both_families",
        &[
            NodeSpec::new("a", "fd00:172:17::2", "10.128.0.0/23").ipv6("fd00:10:128:1::/64"),
            NodeSpec::new("b", "fd00:172:17::3", "10.128.2.0/23").ipv6("fd00:10:128:2::/64"),
        ],
    )
    .await
    else {
        return;
    };
    let a1 = c.node_mut("a").add_pod("team-a", "a1", "10.128.0.5").await;
    let a2 = c.node_mut("b").add_pod("team-a", "a2", "10.128.2.5").await;
    let b1 = c.node_mut("b").add_pod("team-b", "b1", "10.128.2.6").await;
    c.apply_all("multitenant", &NAMESPACES).await;
    let flows = c.node("a").ofctl("dump-flows", "br0", &["table=90"]).await;
    assert!(flows.contains("set_field:fd00:172:17::3->tun_ipv6_dst"), "{flows}");
    both_families(&c, &a1, &a2, true, "team-a on a -> team-a on b, IPv6 underlay").await;
    both_families(&c, &a2, &a1, true, "team-a on b -> team-a on a, IPv6 underlay").await;
    both_families(&c, &a1, &b1, false, "team-a on a -> team-b on b, IPv6 underlay").await;
}

/// Multicast in both families stays in its VNID, on the node and across the tunnel: a group
/// datagram from team-a reaches team-a's members on both nodes (tables 110, 111, 120), not a
/// member in team-b (multicast enabled too) nor one in default (multicast off).
#[tokio::test]
async fn multicast_in_both_families_stays_in_its_vnid() {
    let Some((c, p)) = two_dual_stack_nodes("multicast_in_both_families_stays_in_its_vnid", "multitenant").await else {
        return;
    };
    // Multicast on for team-a and team-b (NetNamespace `multicast: true`), off for default.
    c.apply_with_multicast("multitenant", &NAMESPACES, &["team-a", "team-b"]).await;
    for (group, port) in [("ff15::101".parse::<IpAddr>().unwrap(), 5001u16), ("239.1.1.101".parse().unwrap(), 5002)] {
        traffic::multicast_reaches(&p.a1, group, port, &[(&p.a3, true), (&p.a2, true), (&p.b1, false), (&p.d1, false)]).await;
    }
}

/// NetworkPolicy in both families (networkpolicy plugin, two dual-stack nodes): the same
/// verdict for a connection over IPv4 and over IPv6 when a policy selects by namespace and
/// port, and an IPv6 `ipBlock` admits exactly its IPv6 source (not the same pod over IPv4).
#[tokio::test]
async fn network_policy_holds_in_both_families() {
    use serde_json::json;
    let Some((c, p)) = two_dual_stack_nodes("network_policy_holds_in_both_families", "networkpolicy").await else {
        return;
    };
    let policies = support::netpol_state::TeamPolicies::new(&c, &[&p.a1, &p.a3, &p.d1, &p.a2, &p.b1]);
    let apply = |list| policies.apply(list);
    // b1 serves TCP 8080 and 9090 on both families (one dual-stack socket each).
    let mut servers = Vec::new();
    for port in [8080u16, 9090] {
        servers.push(support::nodes::tcp_echo(p.b1.tcp_listen6(port).await));
    }
    apply(vec![]).await;
    check(&p.b1, "no policy", &[(&p.a1, 8080, true, true), (&p.d1, 9090, true, true), (&p.a2, 8080, true, true)]).await;

    apply(vec![json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "team-b", "name": "from-team-a-8080"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}}],
            "ports": [{"protocol": "TCP", "port": 8080}]}]}
    })])
    .await;
    check(
        &p.b1,
        "team-a may reach team-b on 8080",
        &[(&p.a1, 8080, true, true), (&p.a2, 8080, true, true), (&p.a1, 9090, false, false), (&p.d1, 8080, false, false)],
    )
    .await;

    let a1_6 = format!("{}/128", v6(&p.a1));
    apply(vec![json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "team-b", "name": "from-a1-ipv6"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"ipBlock": {"cidr": a1_6}}]}]}
    })])
    .await;
    check(
        &p.b1,
        "an IPv6 ipBlock admits its IPv6 source only",
        &[(&p.a1, 8080, false, true), (&p.a1, 9090, false, true), (&p.a3, 8080, false, false), (&p.d1, 8080, false, false)],
    )
    .await;
    for s in servers {
        s.abort();
    }
}

/// Each (source, port, IPv4 verdict, IPv6 verdict) to `dst`'s two addresses.
async fn check(dst: &Pod, what: &str, want: &[(&Pod, u16, bool, bool)]) {
    for &(from, port, want4, want6) in want {
        let got4 = traffic::connects(from, IpAddr::V4(dst.ip), port).await;
        let got6 = traffic::connects(from, v6(dst), port).await;
        assert_eq!((got4, got6), (want4, want6), "{what}: {} -> {}:{port} (IPv4, IPv6)", from.name, dst.name);
    }
}
