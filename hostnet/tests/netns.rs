//! Netns: work runs inside the target namespace and never moves the calling thread.

mod common;

use common::{root_or_skip, TestNs};
use hostnet::{nl::Nl, Netns};

fn ns_inode(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[tokio::test]
async fn run_enters_the_namespace_and_leaves_the_caller_alone() {
    if !root_or_skip("run_enters_the_namespace_and_leaves_the_caller_alone") {
        return;
    }
    let t = TestNs::new("run");
    let target = ns_inode(&format!("/var/run/netns/{}", t.name));
    let before = ns_inode("/proc/thread-self/ns/net");
    let inside = t.ns.run("read own netns", || Ok(ns_inode("/proc/thread-self/ns/net"))).await.unwrap();
    assert_eq!(inside, target, "work did not run in the target namespace");
    assert_ne!(inside, before);
    assert_eq!(ns_inode("/proc/thread-self/ns/net"), before, "caller's thread moved");
}

#[tokio::test]
async fn netlink_socket_is_bound_to_the_namespace() {
    if !root_or_skip("netlink_socket_is_bound_to_the_namespace") {
        return;
    }
    let t = TestNs::new("nl");
    t.ip(&["link", "add", "probe0", "type", "bridge"]);
    let nl = Nl::connect(&t.ns).await.unwrap();
    assert!(nl.link_by_name("probe0").await.unwrap().is_some());
    assert!(nl.link_by_name("nonexistent0").await.unwrap().is_none());
    // The same name is not visible from the host namespace.
    let host = Nl::connect(&Netns::current().unwrap()).await.unwrap();
    assert!(host.link_by_name("probe0").await.unwrap().is_none());
}

#[test]
fn opening_a_missing_namespace_names_the_path() {
    let e = Netns::open("/var/run/netns/does-not-exist-hostnet").unwrap_err();
    assert!(e.to_string().contains("/var/run/netns/does-not-exist-hostnet"), "{e}");
}

#[tokio::test]
async fn a_named_namespace_is_created_and_removed_like_ip_netns_does() {
    if !root_or_skip("a_named_namespace_is_created_and_removed_like_ip_netns_does") {
        return;
    }
    let name = format!("hn-new-{}", std::process::id());
    let ns = Netns::create_named(&name).unwrap();
    // `ip netns` (the independent oracle) sees it, and it is a namespace of its own.
    assert!(common::run(&["ip", "netns", "list"]).contains(&name));
    let path = format!("/var/run/netns/{name}");
    assert_ne!(ns_inode(&path), ns_inode("/proc/self/ns/net"));
    // Empty but for lo; a veth pair made there is up at both ends.
    let pairs = vec![("hnva".to_string(), "hnvb".to_string())];
    hostnet::add_veth_pairs(&ns, &pairs, 1400).await.unwrap();
    let links = common::run(&["ip", "-n", &name, "-o", "link"]);
    for l in ["hnva@hnvb", "hnvb@hnva"] {
        let line = links.lines().find(|x| x.contains(l)).unwrap_or_else(|| panic!("{l} missing: {links}"));
        assert!(line.contains("mtu 1400") && line.contains(",UP"), "{line}");
    }
    // A second namespace of that name is refused; nothing of the first is lost.
    assert!(Netns::create_named(&name).is_err());
    assert!(common::run(&["ip", "netns", "list"]).contains(&name));
    Netns::remove_named(&name).unwrap();
    assert!(!common::run(&["ip", "netns", "list"]).contains(&name));
    assert!(!std::path::Path::new(&path).exists());
    // Removing what is gone is success; bad names are refused.
    Netns::remove_named(&name).unwrap();
    assert!(Netns::create_named("../etc").is_err());
}
