//! Host-side setup (tun0, routes, sysctls, openshift-sdn v1 leftovers) in a throwaway
//! namespace, verified with `ip -j` and the namespace's /proc/sys. A bridge stands in for the
//! OVS internal port tun0 (this kernel may lack the dummy driver).

mod common;

use common::{root_or_skip, route, TestNs};
use hostnet::{setup_host, Error, HostConfig, HostIpv4, HostIpv6};
use ipnet::IpNet;

fn cfg() -> HostConfig {
    HostConfig {
        tun: "tun0".into(),
        mtu: 1450,
        ipv4: Some(HostIpv4 {
            node_subnet: "10.128.2.0/23".parse().unwrap(),
            cluster_network: "10.128.0.0/14".parse().unwrap(),
            service_network: "172.30.0.0/16".parse().unwrap(),
        }),
        ipv6: None,
    }
}

fn sysctl(t: &TestNs, path: &str) -> String {
    t.exec(&["cat", path]).trim().to_string()
}

fn assert_configured(t: &TestNs) {
    let tun = t.link("tun0").unwrap();
    assert_eq!(tun["mtu"], 1450);
    assert!(tun["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "{tun}");
    assert_eq!(t.addrs("tun0"), vec!["10.128.2.1/23"]);
    let routes = t.routes();
    let cluster = route(&routes, "10.128.0.0/14").unwrap_or_else(|| panic!("{routes:?}"));
    assert_eq!(cluster["dev"], "tun0");
    assert_eq!(cluster["scope"], "link");
    let svc = route(&routes, "172.30.0.0/16").unwrap_or_else(|| panic!("{routes:?}"));
    assert_eq!(svc["dev"], "tun0");
    assert!(svc.get("gateway").is_none());
    assert!(
        route(&routes, "10.128.2.0/23").is_none(),
        "node subnet prefix route should not exist (covered by the cluster route): {routes:?}"
    );
    assert_eq!(sysctl(t, "/proc/sys/net/ipv4/ip_forward"), "1");
    assert_eq!(sysctl(t, "/proc/sys/net/ipv4/conf/tun0/forwarding"), "1");
}

#[tokio::test]
async fn configures_tun_routes_and_forwarding_idempotently() {
    if !root_or_skip("configures_tun_routes_and_forwarding_idempotently") {
        return;
    }
    let t = TestNs::new("host");
    t.ip(&["link", "add", "tun0", "type", "bridge"]);
    // A stale address, and the right address added the plain way (with its prefix route).
    t.ip(&["addr", "add", "10.99.0.1/24", "dev", "tun0"]);
    t.ip(&["addr", "add", "10.128.2.1/23", "dev", "tun0"]);
    t.ip(&["link", "set", "tun0", "up"]);
    // A new namespace inherits the host's IPv4 forwarding (on wherever Docker, podman's default
    // network or a router runs): turn it off here, so that the test sees setup_host turn it on.
    t.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=0"]);
    assert_eq!(sysctl(&t, "/proc/sys/net/ipv4/ip_forward"), "0");

    let changes = setup_host(&t.ns, &cfg()).await.unwrap();
    assert_eq!(changes.removed_addresses, vec!["10.99.0.1/24".parse().unwrap()]);
    assert!(!changes.added_address);
    assert!(changes.removed_legacy_links.is_empty());
    assert_configured(&t);

    let again = setup_host(&t.ns, &cfg()).await.unwrap();
    assert_eq!(again, Default::default(), "second run changed something");
    assert_configured(&t);
    assert_eq!(t.routes().len(), 2, "no duplicate routes: {:?}", t.routes());
}

#[tokio::test]
async fn fresh_interface_gets_address_without_prefix_route() {
    if !root_or_skip("fresh_interface_gets_address_without_prefix_route") {
        return;
    }
    let t = TestNs::new("host");
    t.ip(&["link", "add", "tun0", "type", "bridge"]);
    let changes = setup_host(&t.ns, &cfg()).await.unwrap();
    assert!(changes.added_address);
    assert_configured(&t);
}

#[tokio::test]
async fn removes_openshift_sdn_v1_leftovers() {
    if !root_or_skip("removes_openshift_sdn_v1_leftovers") {
        return;
    }
    let t = TestNs::new("host");
    t.ip(&["link", "add", "tun0", "type", "bridge"]);
    t.ip(&["link", "add", "lbr0", "type", "bridge"]);
    t.ip(&["link", "add", "vlinuxbr", "type", "veth", "peer", "name", "vovsbr"]);
    t.ip(&["addr", "add", "10.1.0.1/24", "dev", "lbr0"]);
    t.ip(&["link", "set", "lbr0", "up"]);
    t.ip(&["route", "add", "10.2.0.0/16", "dev", "lbr0"]);
    t.ip(&["route", "add", "10.3.0.0/16", "via", "10.1.0.9"]);
    let changes = setup_host(&t.ns, &cfg()).await.unwrap();
    let mut removed = changes.removed_legacy_links.clone();
    removed.sort();
    assert_eq!(removed, vec!["lbr0", "vlinuxbr"], "vovsbr goes with its peer");
    for l in ["lbr0", "vlinuxbr", "vovsbr"] {
        assert!(t.link(l).is_none(), "{l} still there");
    }
    let routes = t.routes();
    for dst in ["10.1.0.0/24", "10.2.0.0/16", "10.3.0.0/16"] {
        assert!(route(&routes, dst).is_none(), "{dst} left: {routes:?}");
    }
    assert_configured(&t);
}

#[tokio::test]
async fn missing_tun_is_an_error_naming_it() {
    if !root_or_skip("missing_tun_is_an_error_naming_it") {
        return;
    }
    let t = TestNs::new("host");
    let e = setup_host(&t.ns, &cfg()).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("tun0"), "{e}");
}

fn dual() -> HostConfig {
    HostConfig {
        ipv6: Some(HostIpv6 {
            node_subnet: "fd00:10:128:1::/64".parse().unwrap(),
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
            service_network: "fd00:172:30::/112".parse().unwrap(),
        }),
        ..cfg()
    }
}

/// `ip -j -6 addr show dev DEV`'s addresses (with their flags as keys).
fn addrs6(t: &TestNs, dev: &str) -> Vec<serde_json::Value> {
    let v = t.ip_json(&["-6", "addr", "show", "dev", dev]);
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a.get("local").is_some())
        .collect()
}

fn assert_configured6(t: &TestNs) {
    let global: Vec<_> = addrs6(t, "tun0").into_iter().filter(|a| a["scope"] == "global").collect();
    assert_eq!(global.len(), 1, "{global:?}");
    assert_eq!(global[0]["local"], "fd00:10:128:1::1");
    assert_eq!(global[0]["prefixlen"], 64);
    assert!(global[0].get("tentative").is_none(), "the gateway address is usable at once: {:?}", global[0]);
    let routes = t.ip_json(&["-6", "route", "show", "table", "main"]).as_array().cloned().unwrap_or_default();
    for dst in ["fd00:10:128::/48", "fd00:172:30::/112"] {
        let r = route(&routes, dst).unwrap_or_else(|| panic!("{dst}: {routes:?}"));
        assert_eq!(r["dev"], "tun0");
        assert!(r.get("gateway").is_none(), "{r}");
    }
    assert!(route(&routes, "fd00:10:128:1::/64").is_none(), "node subnet prefix route: {routes:?}");
    assert_eq!(sysctl(t, "/proc/sys/net/ipv6/conf/all/forwarding"), "1");
    assert_eq!(sysctl(t, "/proc/sys/net/ipv6/conf/tun0/disable_ipv6"), "0");
}

#[tokio::test]
async fn dual_stack_tun_gets_its_ipv6_side_idempotently() {
    if !root_or_skip("dual_stack_tun_gets_its_ipv6_side_idempotently") {
        return;
    }
    let t = TestNs::new("host");
    t.ip(&["link", "add", "tun0", "type", "bridge"]);
    t.ip(&["link", "set", "tun0", "up"]);
    // A stale address, and the right one added the plain way (with its prefix route).
    t.ip(&["addr", "add", "fd00:99::1/64", "dev", "tun0", "nodad"]);
    t.ip(&["addr", "add", "fd00:10:128:1::1/64", "dev", "tun0", "nodad"]);
    let changes = setup_host(&t.ns, &dual()).await.unwrap();
    assert_eq!(changes.removed_addresses, vec!["fd00:99::1/64".parse::<IpNet>().unwrap()]);
    assert!(!changes.added_address6);
    assert!(changes.added_address, "the IPv4 side is set up as before");
    assert_configured(&t);
    assert_configured6(&t);
    assert!(
        addrs6(&t, "tun0").iter().any(|a| a["scope"] == "link"),
        "the kernel's link-local address is kept: {:?}",
        addrs6(&t, "tun0")
    );

    let again = setup_host(&t.ns, &dual()).await.unwrap();
    assert_eq!(again, Default::default(), "second run changed something");
    assert_configured6(&t);
}

#[tokio::test]
async fn dual_stack_fresh_tun_with_ipv6_off_by_default() {
    if !root_or_skip("dual_stack_fresh_tun_with_ipv6_off_by_default") {
        return;
    }
    let t = TestNs::new("host");
    t.exec(&["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.all.forwarding=0"]);
    t.ip(&["link", "add", "tun0", "type", "bridge"]);
    assert_eq!(sysctl(&t, "/proc/sys/net/ipv6/conf/tun0/disable_ipv6"), "1");
    let changes = setup_host(&t.ns, &dual()).await.unwrap();
    assert!(changes.added_address && changes.added_address6);
    let added: Vec<String> = changes.added_routes.iter().map(ToString::to_string).collect();
    assert_eq!(added, ["10.128.0.0/14", "172.30.0.0/16", "fd00:10:128::/48", "fd00:172:30::/112"]);
    assert_configured(&t);
    assert_configured6(&t);
}

fn v6_only() -> HostConfig {
    HostConfig { ipv4: None, ..dual() }
}

/// tun0 as an IPv6-only node wants it: no IPv4 address, no IPv4 route through it (the IPv6
/// side as [`assert_configured6`]).
fn assert_no_ipv4(t: &TestNs) {
    assert!(t.addrs("tun0").is_empty(), "IPv4 addresses on tun0: {:?}", t.addrs("tun0"));
    let through: Vec<_> = t.routes().into_iter().filter(|r| r["dev"] == "tun0").collect();
    assert!(through.is_empty(), "IPv4 routes through tun0: {through:?}");
}

#[tokio::test]
async fn ipv6_only_tun_gets_the_ipv6_side_alone_idempotently() {
    if !root_or_skip("ipv6_only_tun_gets_the_ipv6_side_alone_idempotently") {
        return;
    }
    let t = TestNs::new("host");
    t.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=0", "net.ipv6.conf.all.forwarding=0"]);
    t.ip(&["link", "add", "tun0", "type", "bridge"]);
    let changes = setup_host(&t.ns, &v6_only()).await.unwrap();
    assert!(!changes.added_address && changes.added_address6, "{changes:?}");
    let added: Vec<String> = changes.added_routes.iter().map(ToString::to_string).collect();
    assert_eq!(added, ["fd00:10:128::/48", "fd00:172:30::/112"]);
    assert!(changes.removed_addresses.is_empty(), "{changes:?}");
    assert_configured6(&t);
    assert_no_ipv4(&t);
    let tun = t.link("tun0").unwrap();
    assert_eq!(tun["mtu"], 1450);
    assert!(tun["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "{tun}");
    assert_eq!(sysctl(&t, "/proc/sys/net/ipv4/ip_forward"), "0", "IPv4 forwarding is not ours to turn on here");

    let again = setup_host(&t.ns, &v6_only()).await.unwrap();
    assert_eq!(again, Default::default(), "second run changed something");
    assert_configured6(&t);
    assert_no_ipv4(&t);
}

#[tokio::test]
async fn dual_stack_to_ipv6_only_removes_the_ipv4_side() {
    if !root_or_skip("dual_stack_to_ipv6_only_removes_the_ipv4_side") {
        return;
    }
    let t = TestNs::new("host");
    t.ip(&["link", "add", "tun0", "type", "bridge"]);
    setup_host(&t.ns, &dual()).await.unwrap();
    assert_configured(&t);
    assert_configured6(&t);
    // A second stale IPv4 address too (an earlier gateway), and a route of the host's own
    // elsewhere that must stay.
    t.ip(&["addr", "add", "10.99.0.1/24", "dev", "tun0"]);
    t.ip(&["link", "add", "up0", "type", "bridge"]);
    t.ip(&["addr", "add", "192.0.2.10/24", "dev", "up0"]);
    t.ip(&["link", "set", "up0", "up"]);

    let changes = setup_host(&t.ns, &v6_only()).await.unwrap();
    let mut removed: Vec<String> = changes.removed_addresses.iter().map(ToString::to_string).collect();
    removed.sort();
    assert_eq!(removed, ["10.128.2.1/23", "10.99.0.1/24"]);
    assert!(changes.added_routes.is_empty() && !changes.added_address6, "{changes:?}");
    assert_no_ipv4(&t);
    assert_configured6(&t);
    assert!(route(&t.routes(), "192.0.2.0/24").is_some(), "a route of another interface went: {:?}", t.routes());

    // And back: the IPv4 side returns.
    let changes = setup_host(&t.ns, &dual()).await.unwrap();
    assert!(changes.added_address, "{changes:?}");
    assert_configured(&t);
    assert_configured6(&t);
}

#[tokio::test]
async fn no_family_is_refused_before_touching_anything() {
    let e = setup_host(&hostnet::Netns::current().unwrap(), &HostConfig { ipv4: None, ipv6: None, ..cfg() })
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("neither an IPv4 nor an IPv6"), "{e}");
}
