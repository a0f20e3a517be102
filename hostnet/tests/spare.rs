//! Spare pod interfaces against the kernel: made ahead in a holding namespace, given to a pod
//! by one move, configured exactly like `setup_pod`'s; verified with `ip -j` and `ethtool -k`.

mod common;

use common::{pod_cfg, root_or_skip, route, TestNs};
use hostnet::{check_pod, claim_spare, create_spare, Netns, PodConfig};

fn cfg() -> PodConfig {
    pod_cfg(7)
}

#[tokio::test]
async fn a_spare_becomes_the_pod_interface_setup_would_make() {
    if !root_or_skip("a_spare_becomes_the_pod_interface_setup_would_make") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    let hold = Netns::create_anonymous("test spares").unwrap();
    // MTU of the spare differs from the pod's: the claim sets both ends.
    create_spare(&host.ns, &hold, "vethspare1", 1450).await.unwrap();
    let h = host.link("vethspare1").expect("host end in the host namespace");
    assert_eq!(h["mtu"], 1450);
    assert!(h["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "{h}");
    assert!(pod.link("vethspare1").is_none());

    let c = cfg();
    let made = claim_spare(&host.ns, &hold, &pod.ns, "vethspare1", &c).await.unwrap();
    assert_eq!(made.host_veth, "vethspare1");
    assert_eq!(made.mac, c.mac.unwrap());
    assert_eq!(host.link("vethspare1").unwrap()["mtu"], 1400);
    let p = pod.link("eth0").expect("eth0 in the pod");
    assert_eq!(p["address"], "0a:58:0a:80:00:07");
    assert_eq!(p["mtu"], 1400);
    assert_eq!(p["operstate"], "UP", "{p}");
    assert_eq!(pod.addrs("eth0"), vec!["10.128.0.7/23"]);
    let routes = pod.routes();
    assert_eq!(route(&routes, "default").expect("default route")["gateway"], "10.128.0.1");
    for dst in ["10.128.0.0/14", "224.0.0.0/4"] {
        assert_eq!(route(&routes, dst).unwrap_or_else(|| panic!("route {dst}: {routes:?}"))["scope"], "link");
    }
    assert_eq!(pod.tx_checksumming("eth0"), "off");
    check_pod(&pod.ns, "eth0", c.ipv4.as_ref().unwrap().address, c.mac, &c.routes()).await.unwrap();
    // The same spare cannot be given twice.
    let other = TestNs::new("pod2");
    let e = claim_spare(&host.ns, &hold, &other.ns, "vethspare1", &c).await.unwrap_err();
    assert!(e.to_string().contains("vethspare1"), "{e}");
    assert!(other.link("eth0").is_none());
    assert!(pod.link("eth0").is_some(), "a failed claim of a given spare leaves its pod alone");
}

#[tokio::test]
async fn a_claim_into_a_pod_with_that_interface_destroys_nothing_of_the_pod() {
    if !root_or_skip("a_claim_into_a_pod_with_that_interface_destroys_nothing_of_the_pod") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    let hold = Netns::create_anonymous("test spares").unwrap();
    create_spare(&host.ns, &hold, "vethspare2", 1450).await.unwrap();
    pod.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "other0"]);
    let e = claim_spare(&host.ns, &hold, &pod.ns, "vethspare2", &cfg()).await.unwrap_err();
    assert!(matches!(e, hostnet::Error::Exists { .. }), "{e}");
    assert!(pod.link("eth0").is_some() && pod.link("other0").is_some(), "the pod's own interface is untouched");
    assert!(host.link("vethspare2").is_some(), "a refused claim leaves the spare as it was");
}

#[tokio::test]
async fn spares_die_with_their_holding_namespace() {
    if !root_or_skip("spares_die_with_their_holding_namespace") {
        return;
    }
    let host = TestNs::new("host");
    let hold = Netns::create_anonymous("test spares").unwrap();
    for n in ["vethspare3", "vethspare4"] {
        create_spare(&host.ns, &hold, n, 1450).await.unwrap();
    }
    assert!(host.link("vethspare3").is_some() && host.link("vethspare4").is_some());
    drop(hold);
    // The kernel tears the namespace down asynchronously.
    let t = std::time::Instant::now();
    while host.link("vethspare3").is_some() || host.link("vethspare4").is_some() {
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "spare host ends outlived their holding namespace");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
