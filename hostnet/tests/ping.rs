//! Real packets: a node namespace set up with `setup_host` + `install_firewall` (a Linux bridge
//! standing in for OVS as tun0), two pods set up with `setup_pod` and plugged into it, and an
//! "external" namespace beyond the node. Pods reach each other and the gateway, and reach the
//! outside only thanks to masquerading (the outside has no route back to the cluster network).

mod common;

use common::{root_or_skip, TestNs};
use hostnet::{install_firewall, remove_firewall, setup_host, setup_pod, FirewallConfig, HostConfig, PodConfig};

fn pod_cfg(ip: &str) -> PodConfig {
    PodConfig {
        ifname: "eth0".into(),
        mac: None,
        mtu: 1450,
        address: format!("{ip}/24").parse().unwrap(),
        gateway: "10.128.0.1".parse().unwrap(),
        cluster_network: "10.128.0.0/14".parse().unwrap(),
        extra_routes: vec![],
        host_ifname: None,
        ipv6: None,
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
        node_subnet: "10.128.0.0/24".parse().unwrap(),
        mtu: 1450,
        cluster_network: "10.128.0.0/14".parse().unwrap(),
        service_network: "172.30.0.0/16".parse().unwrap(),
        ipv6: None,
    };
    setup_host(&node.ns, &host).await.unwrap();
    let fw = FirewallConfig::new(host.cluster_network, host.service_network);
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
