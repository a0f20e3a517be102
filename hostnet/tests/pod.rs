//! Pod interface setup/teardown/check against the kernel, verified with `ip -j` and
//! `ethtool -k`. The "host" side is a throwaway namespace too, so nothing touches the machine.

mod common;

use common::{pod_cfg, root_or_skip, route, TestNs};
use hostnet::{check_pod, setup_pod, teardown_pod, Error, MacAddr, PodConfig, PodRoute};

fn cfg() -> PodConfig {
    pod_cfg(5)
}

#[tokio::test]
async fn setup_configures_both_ends() {
    if !root_or_skip("setup_configures_both_ends") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    let c = cfg();
    let made = setup_pod(&host.ns, &pod.ns, &c).await.unwrap();
    assert_eq!(made.mac, c.mac.unwrap());
    assert!(made.host_veth.starts_with("veth"), "{}", made.host_veth);

    let h = host.link(&made.host_veth).expect("host veth in host netns");
    assert_eq!(h["mtu"], 1400);
    assert!(h["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "{h}");
    assert!(pod.link(&made.host_veth).is_none());

    let p = pod.link("eth0").expect("eth0 in pod netns");
    assert_eq!(p["address"], "0a:58:0a:80:00:05");
    assert_eq!(p["mtu"], 1400);
    assert_eq!(p["operstate"], "UP", "{p}");
    assert!(host.link("eth0").is_none());
    let lo = pod.link("lo").unwrap();
    assert!(lo["flags"].as_array().unwrap().iter().any(|f| f == "UP"));
    assert_eq!(pod.addrs("eth0"), vec!["10.128.0.5/23"]);

    let routes = pod.routes();
    let d = route(&routes, "default").expect("default route");
    assert_eq!(d["gateway"], "10.128.0.1");
    assert_eq!(d["dev"], "eth0");
    for dst in ["10.128.0.0/14", "224.0.0.0/4"] {
        let r = route(&routes, dst).unwrap_or_else(|| panic!("route {dst}: {routes:?}"));
        assert_eq!(r["dev"], "eth0");
        assert_eq!(r["scope"], "link");
        assert!(r.get("gateway").is_none(), "{r}");
    }
    assert_eq!(pod.tx_checksumming("eth0"), "off");

    check_pod(&pod.ns, "eth0", c.ipv4.as_ref().unwrap().address, c.mac, &c.routes()).await.unwrap();

    teardown_pod(&host.ns, &made.host_veth).await.unwrap();
    assert!(host.link(&made.host_veth).is_none());
    assert!(pod.link("eth0").is_none(), "deleting the host end removes the pod end");
    // Idempotent.
    teardown_pod(&host.ns, &made.host_veth).await.unwrap();
}

#[tokio::test]
async fn kernel_random_mac_is_reported() {
    if !root_or_skip("kernel_random_mac_is_reported") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    let c = PodConfig { mac: None, ..cfg() };
    let made = setup_pod(&host.ns, &pod.ns, &c).await.unwrap();
    let p = pod.link("eth0").unwrap();
    assert_eq!(p["address"], made.mac.to_string());
}

#[tokio::test]
async fn check_reports_every_difference() {
    if !root_or_skip("check_reports_every_difference") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    let c = cfg();
    setup_pod(&host.ns, &pod.ns, &c).await.unwrap();
    pod.ip(&["route", "del", "224.0.0.0/4"]);
    pod.exec(&["ethtool", "-K", "eth0", "tx", "on"]);
    let wrong_mac: MacAddr = "0a:58:0a:80:00:99".parse().unwrap();
    let e =
        check_pod(&pod.ns, "eth0", "10.128.0.6/23".parse().unwrap(), Some(wrong_mac), &c.routes()).await.unwrap_err();
    let Error::Check { problems, .. } = &e else {
        panic!("expected a check error, got {e}");
    };
    let text = problems.join("\n");
    assert_eq!(problems.len(), 4, "{text}");
    for needle in ["MAC", "10.128.0.6/23", "224.0.0.0/4", "checksum"] {
        assert!(text.contains(needle), "{needle} not in {text}");
    }
    let e = check_pod(&pod.ns, "eth9", c.ipv4.as_ref().unwrap().address, None, &[]).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

#[tokio::test]
async fn existing_pod_interface_is_refused_without_leftovers() {
    if !root_or_skip("existing_pod_interface_is_refused_without_leftovers") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    pod.ip(&["link", "add", "eth0", "type", "bridge"]);
    let e = setup_pod(&host.ns, &pod.ns, &cfg()).await.unwrap_err();
    assert!(matches!(e, Error::Exists { .. }), "{e}");
    assert!(e.to_string().contains("eth0"), "{e}");
    let links = host.ip_json(&["link", "show"]);
    assert_eq!(links.as_array().unwrap().len(), 1, "only lo in host: {links}");
}

#[tokio::test]
async fn failure_after_creation_removes_the_veth() {
    if !root_or_skip("failure_after_creation_removes_the_veth") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    // A gateway outside every connected subnet: the kernel refuses this route only after
    // the veth, address and first routes are in place.
    let mut c = cfg();
    c.ipv4.as_mut().unwrap().extra_routes =
        vec![PodRoute { dst: "192.0.2.0/24".parse().unwrap(), via: Some("198.51.100.1".parse().unwrap()) }];
    let e = setup_pod(&host.ns, &pod.ns, &c).await.unwrap_err();
    let msg = e.to_string();
    eprintln!("setup error as reported: {msg}");
    assert!(msg.contains("192.0.2.0/24"), "error names the route: {msg}");
    assert!(pod.link("eth0").is_none(), "pod end left behind");
    let links = host.ip_json(&["link", "show"]);
    assert_eq!(links.as_array().unwrap().len(), 1, "host end left behind: {links}");
}

#[tokio::test]
async fn invalid_config_touches_nothing() {
    if !root_or_skip("invalid_config_touches_nothing") {
        return;
    }
    let host = TestNs::new("host");
    let pod = TestNs::new("pod");
    let mut c = cfg();
    c.ipv4.as_mut().unwrap().gateway = "10.200.0.1".parse().unwrap();
    let e = setup_pod(&host.ns, &pod.ns, &c).await.unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("10.200.0.1"), "{e}");
    assert_eq!(host.ip_json(&["link", "show"]).as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn teardown_of_unknown_name_is_success() {
    if !root_or_skip("teardown_of_unknown_name_is_success") {
        return;
    }
    let host = TestNs::new("host");
    teardown_pod(&host.ns, "veth00000000").await.unwrap();
    assert!(teardown_pod(&host.ns, "bad/name").await.is_err());
}
