//! A pod's veth as recorded (host end's name and ifindex, pod end's name in its namespace),
//! against the kernel, with `ip` as the oracle: another interface under the recorded name is
//! never taken for it, and never deleted.

mod common;

use common::{pod_cfg, root_or_skip, TestNs};
use hostnet::{delete_owned, setup_pod, veth_state, Deleted, VethState};

fn index(ns: &TestNs, name: &str) -> u32 {
    ns.link(name).and_then(|l| l["ifindex"].as_u64()).unwrap_or_else(|| panic!("{name} in {}", ns.name)) as u32
}

#[tokio::test]
async fn a_veth_is_known_by_its_recorded_index_and_pairing() {
    if !root_or_skip("a_veth_is_known_by_its_recorded_index_and_pairing") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    let other = TestNs::new("other");
    let made = setup_pod(&host.ns, &pod.ns, &pod_cfg(5)).await.unwrap();
    let idx = index(&host, &made.host_veth);
    // As made: paired, with or without the index recorded.
    for recorded in [None, Some(idx)] {
        assert_eq!(
            veth_state(&host.ns, &made.host_veth, recorded, &pod.ns, "eth0").await.unwrap(),
            VethState::Paired { host_index: idx }
        );
    }
    // Looked for in another namespace (where no eth0 is its peer).
    other.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]);
    assert_eq!(
        veth_state(&host.ns, &made.host_veth, Some(idx), &other.ns, "eth0").await.unwrap(),
        VethState::PodGone { host_index: idx }
    );
    // Another ifindex recorded: not ours, and not deleted.
    assert_eq!(
        veth_state(&host.ns, &made.host_veth, Some(idx + 1000), &pod.ns, "eth0").await.unwrap(),
        VethState::NotOurs { host_index: idx }
    );
    assert_eq!(
        delete_owned(&host.ns, &made.host_veth, Some(idx + 1000)).await.unwrap(),
        Deleted::NotOurs { index: idx }
    );
    assert!(host.link(&made.host_veth).is_some() && pod.link("eth0").is_some(), "left alone");
    // The recorded one: deleted (both ends), then gone.
    assert_eq!(delete_owned(&host.ns, &made.host_veth, Some(idx)).await.unwrap(), Deleted::Yes);
    assert!(host.link(&made.host_veth).is_none() && pod.link("eth0").is_none());
    assert_eq!(delete_owned(&host.ns, &made.host_veth, Some(idx)).await.unwrap(), Deleted::Gone);
    assert_eq!(veth_state(&host.ns, &made.host_veth, Some(idx), &pod.ns, "eth0").await.unwrap(), VethState::HostGone);
    // A new interface under the old name is another one.
    host.ip(&["link", "add", &made.host_veth, "type", "veth", "peer", "name", "stranger"]);
    let new_idx = index(&host, &made.host_veth);
    assert_ne!(new_idx, idx, "ifindexes are not reused");
    assert_eq!(delete_owned(&host.ns, &made.host_veth, Some(idx)).await.unwrap(), Deleted::NotOurs { index: new_idx });
    assert!(host.link(&made.host_veth).is_some(), "the new interface stays");
}
