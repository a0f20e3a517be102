//! host_interface: kind, addresses and default-route use of node interfaces, against `ip`.

mod common;

use common::{root_or_skip, TestNs};

#[tokio::test]
async fn node_interfaces_are_described_as_the_kernel_has_them() {
    if !root_or_skip("node_interfaces_are_described_as_the_kernel_has_them") {
        return;
    }
    let t = TestNs::new("hostif");
    t.ip(&["link", "add", "up0", "type", "bridge"]);
    t.ip(&["addr", "add", "192.0.2.10/24", "dev", "up0"]);
    t.ip(&["link", "set", "up0", "up"]);
    t.ip(&["route", "add", "default", "via", "192.0.2.1", "dev", "up0"]);
    t.ip(&["link", "add", "va", "type", "veth", "peer", "name", "vb"]);
    t.ip(&["link", "set", "va", "up"]);
    t.ip(&["addr", "add", "2001:db8::5/64", "dev", "vb"]);
    t.ip(&["link", "set", "vb", "up"]);
    t.ip(&["-6", "route", "add", "default", "via", "2001:db8::1", "dev", "vb"]);
    let up0 = hostnet::host_interface(&t.ns, "up0").await.unwrap().expect("up0");
    assert_eq!(up0.kind.as_deref(), Some("bridge"));
    assert_eq!(up0.addresses, vec!["192.0.2.10/24".parse().unwrap()]);
    assert!(up0.default_route);
    // A veth that is up has only its IPv6 link-local address: not counted.
    let va = hostnet::host_interface(&t.ns, "va").await.unwrap().expect("va");
    assert_eq!(va.kind.as_deref(), Some("veth"));
    assert!(va.addresses.is_empty(), "{:?}", va.addresses);
    assert!(!va.default_route);
    let vb = hostnet::host_interface(&t.ns, "vb").await.unwrap().expect("vb");
    assert_eq!(vb.addresses, vec!["2001:db8::5/64".parse().unwrap()]);
    assert!(vb.default_route, "the IPv6 default route counts too");
    let lo = hostnet::host_interface(&t.ns, "lo").await.unwrap().expect("lo");
    assert_eq!(lo.kind, None, "no IFLA_INFO_KIND");
    assert!(hostnet::host_interface(&t.ns, "nosuch0").await.unwrap().is_none());
}
