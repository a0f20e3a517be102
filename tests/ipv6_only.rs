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
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::nodes::{ip_in, in_netns, Cluster, NodeSpec, Pod};

const NAMESPACES: [(&str, u32); 3] = [("default", 0), ("team-a", 11), ("team-b", 12)];

struct Pods {
    /// team-a on node-a.
    a1: Pod,
    /// team-a on node-a, a second one.
    a3: Pod,
    /// default on node-a.
    d1: Pod,
    /// team-a on node-b.
    a2: Pod,
    /// team-b on node-b.
    b1: Pod,
}

/// Two IPv6-only nodes with five pods; `underlay`: the nodes' hostIPs.
async fn two_nodes(test: &str, plugin: &str, underlay: [&str; 2]) -> Option<(Cluster, Pods)> {
    let mut c = Cluster::start(
        test,
        &[
            NodeSpec::new("a", underlay[0], "10.128.0.0/23").ipv6_only("fd00:10:128:1::/64"),
            NodeSpec::new("b", underlay[1], "10.128.2.0/23").ipv6_only("fd00:10:128:2::/64"),
        ],
    )
    .await?;
    let a = c.node_mut("a");
    let a1 = a.add_pod("team-a", "a1", "10.128.0.5").await;
    let a3 = a.add_pod("team-a", "a3", "10.128.0.6").await;
    let d1 = a.add_pod("default", "d1", "10.128.0.7").await;
    let b = c.node_mut("b");
    let a2 = b.add_pod("team-a", "a2", "10.128.2.5").await;
    let b1 = b.add_pod("team-b", "b1", "10.128.2.6").await;
    c.apply_all(plugin, &NAMESPACES).await;
    Some((c, Pods { a1, a3, d1, a2, b1 }))
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
    const BOUND: Duration = Duration::from_secs(30);
    for (server_pod, port) in [(&p.a3, 8080u16), (&p.a2, 8081)] {
        const LEN: usize = 256 * 1024;
        let listener = tokio::net::TcpListener::from_std(server_pod.tcp_listen6(port).await).expect("tokio listener");
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; LEN];
            s.read_exact(&mut buf).await.expect("server reads");
            s.write_all(&buf).await.expect("server echoes");
            s.shutdown().await.expect("server shuts down");
        });
        let dst = v6(server_pod);
        let client = async {
            let s = p.a1.tcp_connect(dst, port, Duration::from_secs(10)).await.expect("connect");
            let mut s = tokio::net::TcpStream::from_std(s).expect("tokio stream");
            let data: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
            let (mut r, mut w) = s.split();
            let mut back = Vec::with_capacity(LEN);
            let (wr, rd) = tokio::join!(w.write_all(&data), r.read_to_end(&mut back));
            wr.expect("client writes");
            rd.expect("client reads");
            assert!(back == data, "echo to {dst} differs: {} bytes back of {LEN}", back.len());
        };
        tokio::time::timeout(BOUND, client).await.expect("TCP echo within the bound");
        tokio::time::timeout(BOUND, server).await.expect("server done").expect("server task");

        let server = in_netns(&server_pod.netns, move || std::net::UdpSocket::bind(("::", port))).await.expect("bind udp6");
        server.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            let (n, from) = server.recv_from(&mut buf).expect("server receives the datagram");
            server.send_to(&buf[..n], from).expect("server echoes");
        });
        let client = in_netns(&p.a1.netns, || std::net::UdpSocket::bind(("::", 0))).await.expect("bind client");
        client.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let got = tokio::task::spawn_blocking(move || {
            let mut buf = [0u8; 1500];
            // A few sends: the first may wait for neighbour discovery.
            for _ in 0..3 {
                client.send_to(b"ipv6-only", (dst, port)).expect("send");
                if let Ok((n, _)) = client.recv_from(&mut buf) {
                    return Some(buf[..n].to_vec());
                }
            }
            None
        })
        .await
        .expect("join");
        assert_eq!(got.as_deref(), Some(&b"ipv6-only"[..]), "UDP echo from {dst}");
        echo.join().expect("echo thread");
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
    ip_in(&p.a1.netns, &format!("addr add {foreign}/64 dev eth0 nodad")).await;
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &p.a1.netns, "ping", "-n", "-c1", "-W2", "-I", foreign, &v6(&p.a3).to_string()])
        .output()
        .await
        .expect("run ping");
    assert_eq!(out.status.code(), Some(1), "from {foreign}: expected no reply:\n{}", String::from_utf8_lossy(&out.stdout));
}

/// Multicast stays in its VNID, on the node and across the tunnel: a group datagram from
/// team-a reaches team-a's members on both nodes, not team-b's (multicast on too) nor
/// default's (multicast off).
#[tokio::test]
async fn multicast_stays_in_its_vnid() {
    let Some((c, p)) = two_nodes("multicast_stays_in_its_vnid", "multitenant", IPV4_UNDERLAY).await else {
        return;
    };
    for n in c.nodes() {
        let yaml = c
            .state_yaml(n.name(), "multitenant", &NAMESPACES)
            .replace("{name: team-a, netid: 11}", "{name: team-a, netid: 11, multicast: true}")
            .replace("{name: team-b, netid: 12}", "{name: team-b, netid: 12, multicast: true}");
        assert!(yaml.contains("multicast: true"), "{yaml}");
        n.apply(&yaml).await;
    }
    let (group, port): (std::net::Ipv6Addr, u16) = ("ff15::102".parse().unwrap(), 5003);
    let mut receivers = Vec::new();
    for (member, expect) in [(&p.a3, true), (&p.a2, true), (&p.b1, false), (&p.d1, false)] {
        let sock = in_netns(&member.netns, move || -> std::io::Result<std::net::UdpSocket> {
            let s = std::net::UdpSocket::bind(("::", port))?;
            s.join_multicast_v6(&group, 0)?;
            Ok(s)
        })
        .await
        .unwrap_or_else(|e| panic!("{} joins {group}: {e}", member.name));
        sock.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
        let name = member.name.clone();
        receivers.push((name, expect, tokio::task::spawn_blocking(move || {
            let mut buf = [0u8; 64];
            sock.recv_from(&mut buf).ok().map(|(n, _)| buf[..n].to_vec())
        })));
    }
    let sender = in_netns(&p.a1.netns, || std::net::UdpSocket::bind("[::]:0")).await.expect("sender socket");
    for _ in 0..3 {
        sender.send_to(b"group", (group, port)).expect("send to the group");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (name, expect, r) in receivers {
        let got = r.await.expect("receiver");
        assert_eq!(got.is_some(), expect, "{name} on {group}: received {got:?}, expected {}", if expect { "the datagram" } else { "nothing" });
    }
}

/// NetworkPolicy on IPv6-only nodes (networkpolicy plugin): a namespace-and-port rule admits
/// exactly its sources, an IPv6 ipBlock exactly its source, on one node and across nodes.
/// (The whole truth table runs in tests/netpol.rs `truth_table_on_ipv6_only_nodes`.)
#[tokio::test]
async fn network_policy_holds() {
    use serde_json::json;
    use support::netpol_eval::EvalPod;
    let Some((c, p)) = two_nodes("network_policy_holds_ipv6_only", "networkpolicy", IPV4_UNDERLAY).await else {
        return;
    };
    let all = [&p.a1, &p.a3, &p.d1, &p.a2, &p.b1];
    let pods: Vec<(Pod, EvalPod)> = all
        .iter()
        .map(|x| {
            let e = EvalPod { namespace: x.namespace.clone(), name: x.name.clone(), ip: x.ip, labels: [("app".to_string(), x.name.clone())].into(), container_ports: vec![] };
            ((*x).clone(), e)
        })
        .collect();
    let namespaces = vec![
        json!({"name": "default", "netid": 0, "labels": {"kubernetes.io/metadata.name": "default"}}),
        json!({"name": "team-a", "netid": 11, "labels": {"kubernetes.io/metadata.name": "team-a"}}),
        json!({"name": "team-b", "netid": 12, "labels": {"kubernetes.io/metadata.name": "team-b"}}),
    ];
    let apply = |policies: Vec<serde_json::Value>| {
        let (c, pods, namespaces) = (&c, &pods, &namespaces);
        async move {
            for n in c.nodes() {
                let r = n.apply(&support::netpol_state::state_json(c, n.name(), namespaces.clone(), pods, &policies)).await;
                assert!(r.problems.is_empty(), "node {}: {:?}", n.name(), r.problems);
                n.appctl(&["revalidator/purge"]).await;
            }
        }
    };
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

/// A new TCP connection from `from` to `dst:port` that echoes: true if it did.
async fn connects(from: &Pod, dst: IpAddr, port: u16) -> bool {
    let Ok(s) = from.tcp_connect(dst, port, Duration::from_millis(1500)).await else { return false };
    let Ok(mut s) = tokio::net::TcpStream::from_std(s) else { return false };
    let ok = async {
        s.write_all(b"np").await.ok()?;
        let mut b = [0u8; 2];
        s.read_exact(&mut b).await.ok()?;
        (&b == b"np").then_some(())
    };
    tokio::time::timeout(Duration::from_secs(3), ok).await.ok().flatten().is_some()
}

/// Each (source, destination, port, verdict).
async fn check(what: &str, want: &[(&Pod, &Pod, u16, bool)]) {
    for &(from, to, port, want) in want {
        let got = connects(from, v6(to), port).await;
        assert_eq!(got, want, "{what}: {} -> {}:{port}", from.name, to.name);
    }
}
