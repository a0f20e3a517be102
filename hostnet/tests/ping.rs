//! Real packets: a node namespace set up with `setup_host` + `install_firewall` (a Linux bridge
//! standing in for OVS as tun0), two pods set up with `setup_pod` and plugged into it, and an
//! "external" namespace beyond the node. Pods reach each other and the gateway, and reach the
//! outside only thanks to masquerading (the outside has no route back to the cluster network).

mod common;

use common::{root_or_skip, TestNs};
use hostnet::{
    install_firewall, remove_firewall, setup_host, setup_pod, FirewallConfig, FirewallIpv4, FirewallIpv6, HostConfig,
    HostIpv4, HostIpv6, PodConfig, PodIpv4, PodIpv6,
};

fn pod_cfg(ip: &str) -> PodConfig {
    PodConfig {
        ifname: "eth0".into(),
        mac: None,
        mtu: 1450,
        ipv4: Some(PodIpv4 {
            address: format!("{ip}/24").parse().unwrap(),
            gateway: "10.128.0.1".parse().unwrap(),
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            extra_routes: vec![],
        }),
        host_ifname: None,
        ipv6: None,
    }
}

fn host_v4() -> HostIpv4 {
    HostIpv4 {
        node_subnet: "10.128.0.0/24".parse().unwrap(),
        cluster_network: "10.128.0.0/14".parse().unwrap(),
        service_network: "172.30.0.0/16".parse().unwrap(),
    }
}

fn ping(from: &TestNs, to: &str) -> bool {
    from.exec_ok(&["ping", "-c", "1", "-W", "3", to])
}

#[tokio::test]
async fn pods_talk_to_each_other_the_gateway_and_outside() {
    if !root_or_skip("pods_talk_to_each_other_the_gateway_and_outside") {
        return;
    }
    let node = TestNs::new("node");
    let ext = TestNs::new("ext");
    let a = TestNs::new("pa");
    let b = TestNs::new("pb");

    node.ip(&["link", "add", "tun0", "type", "bridge"]);
    let host = HostConfig {
        tun: "tun0".into(),
        mtu: 1450,
        ipv4: Some(host_v4()),
        ipv6: None,
    };
    setup_host(&node.ns, &host).await.unwrap();
    let fw = FirewallConfig::new(host_v4().cluster_network, host_v4().service_network);
    install_firewall(&node.ns, &fw).await.unwrap();

    // The outside world: one link, no route to the cluster network.
    node.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", &ext.name]);
    node.ip(&["addr", "add", "192.0.2.1/24", "dev", "up0"]);
    node.ip(&["link", "set", "up0", "up"]);
    ext.ip(&["addr", "add", "192.0.2.2/24", "dev", "up1"]);
    ext.ip(&["link", "set", "up1", "up"]);
    ext.ip(&["link", "set", "lo", "up"]);

    for (pod, ip) in [(&a, "10.128.0.5"), (&b, "10.128.0.6")] {
        let made = setup_pod(&node.ns, &pod.ns, &pod_cfg(ip)).await.unwrap();
        node.ip(&["link", "set", &made.host_veth, "master", "tun0"]);
    }
    node.ip(&["link", "set", "tun0", "up"]);

    assert!(ping(&a, "10.128.0.6"), "pod a -> pod b");
    assert!(ping(&b, "10.128.0.5"), "pod b -> pod a");
    assert!(ping(&a, "10.128.0.1"), "pod a -> gateway");
    assert!(ping(&b, "192.0.2.2"), "pod b -> outside (needs masquerade)");
    assert!(!ext.exec_ok(&["ping", "-c", "1", "-W", "1", "10.128.0.5"]), "outside has no route in");

    // Control: without our table there is no masquerading, so the outside cannot answer.
    remove_firewall(&node.ns, &fw.table).await.unwrap();
    // Pod a never talked to the outside, so no conntrack entry carries an old NAT binding.
    assert!(!a.exec_ok(&["ping", "-c", "1", "-W", "1", "192.0.2.2"]), "reply without masquerade?");
}

fn dual_pod_cfg(n: u8) -> PodConfig {
    PodConfig {
        ipv6: Some(PodIpv6 {
            address: format!("fd00:10:128:1::{n:x}/64").parse().unwrap(),
            gateway: "fd00:10:128:1::1".parse().unwrap(),
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
        }),
        ..pod_cfg(&format!("10.128.0.{n}"))
    }
}

fn ping6(from: &TestNs, to: &str) -> bool {
    from.exec_ok(&["ping", "-6", "-c", "1", "-W", "3", to])
}

/// The same node dual-stack: IPv6 between pods, to the gateway, and out through the IPv6
/// masquerade (the outside has no route to the IPv6 cluster network either); IPv4 as before.
#[tokio::test]
async fn dual_stack_pods_talk_over_both_families_and_masquerade_ipv6() {
    if !root_or_skip("dual_stack_pods_talk_over_both_families_and_masquerade_ipv6") {
        return;
    }
    let node = TestNs::new("node");
    let ext = TestNs::new("ext");
    let a = TestNs::new("pa");
    let b = TestNs::new("pb");

    node.ip(&["link", "add", "tun0", "type", "bridge"]);
    let host = HostConfig {
        tun: "tun0".into(),
        mtu: 1450,
        ipv4: Some(host_v4()),
        ipv6: Some(HostIpv6 {
            node_subnet: "fd00:10:128:1::/64".parse().unwrap(),
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
            service_network: "fd00:172:30::/112".parse().unwrap(),
        }),
    };
    setup_host(&node.ns, &host).await.unwrap();
    let mut fw = FirewallConfig::new(host_v4().cluster_network, host_v4().service_network);
    fw.ipv6 = Some(FirewallIpv6 {
        cluster_network: "fd00:10:128::/48".parse().unwrap(),
        service_network: "fd00:172:30::/112".parse().unwrap(),
    });
    install_firewall(&node.ns, &fw).await.unwrap();

    // The outside: one link, IPv4 and IPv6 (no DAD: not what this test is about), no route to
    // either cluster network.
    node.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", &ext.name]);
    node.ip(&["addr", "add", "192.0.2.1/24", "dev", "up0"]);
    node.ip(&["addr", "add", "2001:db8::1/64", "dev", "up0", "nodad"]);
    node.ip(&["link", "set", "up0", "up"]);
    ext.ip(&["addr", "add", "192.0.2.2/24", "dev", "up1"]);
    ext.ip(&["addr", "add", "2001:db8::2/64", "dev", "up1", "nodad"]);
    ext.ip(&["link", "set", "up1", "up"]);
    ext.ip(&["link", "set", "lo", "up"]);

    for (pod, n) in [(&a, 5u8), (&b, 6u8)] {
        let made = setup_pod(&node.ns, &pod.ns, &dual_pod_cfg(n)).await.unwrap();
        node.ip(&["link", "set", &made.host_veth, "master", "tun0"]);
    }
    node.ip(&["link", "set", "tun0", "up"]);

    assert!(ping6(&a, "fd00:10:128:1::6"), "pod a -> pod b (IPv6)");
    assert!(ping6(&b, "fd00:10:128:1::5"), "pod b -> pod a (IPv6)");
    assert!(ping6(&a, "fd00:10:128:1::1"), "pod a -> gateway (IPv6)");
    assert!(ping(&a, "10.128.0.6"), "pod a -> pod b (IPv4)");
    assert!(ping6(&b, "2001:db8::2"), "pod b -> outside (needs the IPv6 masquerade)");
    assert!(ping(&b, "192.0.2.2"), "pod b -> outside (IPv4)");
    assert!(!ext.exec_ok(&["ping", "-6", "-c", "1", "-W", "1", "fd00:10:128:1::5"]), "outside has no route in");

    // Control: an IPv4-only rule set removes the ip6 table (same batch): no IPv6 masquerade.
    install_firewall(&node.ns, &FirewallConfig { ipv6: None, ..fw.clone() }).await.unwrap();
    assert!(!node.exec_ok(&["nft", "list", "table", "ip6", &fw.table]), "ip6 table left behind");
    assert!(!a.exec_ok(&["ping", "-6", "-c", "1", "-W", "1", "2001:db8::2"]), "IPv6 reply without masquerade?");
    assert!(ping(&a, "192.0.2.2"), "IPv4 masquerade still there");
}

/// An IPv6-only node: tun0, pods and firewall without any IPv4 side. IPv6 between pods, to the
/// gateway and out through the IPv6 masquerade; the pods have no IPv4 to speak of. Then the
/// firewall switched back to IPv4 only: the ip6 table goes in the same batch, and IPv6 to the
/// outside stops (no masquerade).
#[tokio::test]
async fn ipv6_only_pods_talk_and_masquerade_without_any_ipv4() {
    if !root_or_skip("ipv6_only_pods_talk_and_masquerade_without_any_ipv4") {
        return;
    }
    let node = TestNs::new("node");
    let ext = TestNs::new("ext");
    let a = TestNs::new("pa");
    let b = TestNs::new("pb");

    node.ip(&["link", "add", "tun0", "type", "bridge"]);
    let host = HostConfig {
        tun: "tun0".into(),
        mtu: 1450,
        ipv4: None,
        ipv6: Some(HostIpv6 {
            node_subnet: "fd00:10:128:1::/64".parse().unwrap(),
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
            service_network: "fd00:172:30::/112".parse().unwrap(),
        }),
    };
    setup_host(&node.ns, &host).await.unwrap();
    let fw = FirewallConfig::ipv6_only(FirewallIpv6 {
        cluster_network: "fd00:10:128::/48".parse().unwrap(),
        service_network: "fd00:172:30::/112".parse().unwrap(),
    });
    install_firewall(&node.ns, &fw).await.unwrap();
    assert!(!node.exec_ok(&["nft", "list", "table", "ip", &fw.table]), "an ip table for an IPv6-only cluster");

    node.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1", "netns", &ext.name]);
    node.ip(&["addr", "add", "2001:db8::1/64", "dev", "up0", "nodad"]);
    node.ip(&["link", "set", "up0", "up"]);
    ext.ip(&["addr", "add", "2001:db8::2/64", "dev", "up1", "nodad"]);
    ext.ip(&["link", "set", "up1", "up"]);
    ext.ip(&["link", "set", "lo", "up"]);

    for (pod, n) in [(&a, 5u8), (&b, 6u8)] {
        let c = PodConfig { ipv4: None, ..dual_pod_cfg(n) };
        let made = setup_pod(&node.ns, &pod.ns, &c).await.unwrap();
        node.ip(&["link", "set", &made.host_veth, "master", "tun0"]);
    }
    node.ip(&["link", "set", "tun0", "up"]);

    assert!(ping6(&a, "fd00:10:128:1::6"), "pod a -> pod b (IPv6)");
    assert!(ping6(&b, "fd00:10:128:1::5"), "pod b -> pod a (IPv6)");
    assert!(ping6(&a, "fd00:10:128:1::1"), "pod a -> gateway (IPv6)");
    assert!(ping6(&b, "2001:db8::2"), "pod b -> outside (needs the IPv6 masquerade)");
    assert!(!a.exec_ok(&["ping", "-4", "-c", "1", "-W", "1", "192.0.2.1"]), "an IPv6-only pod has no IPv4 route");

    // IPv4 only again: the ip6 table goes with the same batch; no IPv6 masquerade for pod a
    // (which never talked to the outside, so no conntrack entry keeps an old NAT binding).
    let v4 = FirewallIpv4 { cluster_network: host_v4().cluster_network, service_network: host_v4().service_network };
    let v4 = FirewallConfig { ipv4: Some(v4), ipv6: None, ..fw.clone() };
    install_firewall(&node.ns, &v4).await.unwrap();
    assert!(!node.exec_ok(&["nft", "list", "table", "ip6", &fw.table]), "ip6 table left behind");
    assert!(node.exec_ok(&["nft", "list", "table", "ip", &fw.table]), "no ip table");
    assert!(!a.exec_ok(&["ping", "-6", "-c", "1", "-W", "1", "2001:db8::2"]), "IPv6 reply without masquerade?");
}
