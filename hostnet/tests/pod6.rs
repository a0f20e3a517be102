//! Dual-stack pod interfaces against the kernel: both families' addresses and routes, duplicate
//! address detection over before configure_pod answers (and its failure an error), and the
//! cost of the IPv6 side as a ratio. Verified with `ip -j` and the namespaces' /proc/sys.

mod common;

use std::time::{Duration, Instant};

use common::{pod_cfg, root_or_skip, route, TestNs};
use hostnet::{
    check_pod_config, claim_spare, configure_pod, create_spare, make_pod_veth, setup_pod, Error, Netns, PodConfig,
    PodIpv6,
};
use serde_json::Value;

fn v6(host: u8) -> PodIpv6 {
    PodIpv6 {
        address: format!("fd00:10:128:1::{host:x}/64").parse().unwrap(),
        gateway: "fd00:10:128:1::1".parse().unwrap(),
        cluster_network: "fd00:10:128::/48".parse().unwrap(),
    }
}

fn dual(host: u8) -> PodConfig {
    PodConfig { ipv6: Some(v6(host)), ..pod_cfg(host) }
}

/// The global IPv6 addresses of `dev` as `ip -j` shows them (with their flags as keys).
fn addrs6(t: &TestNs, dev: &str) -> Vec<Value> {
    let v = t.ip_json(&["-6", "addr", "show", "dev", dev, "scope", "global"]);
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        // `ip -j` prints an empty object for each address its filter left out.
        .filter(|a| a.get("local").is_some())
        .collect()
}

fn routes6(t: &TestNs) -> Vec<Value> {
    t.ip_json(&["-6", "route", "show", "table", "main"]).as_array().cloned().unwrap_or_default()
}

fn sysctl(t: &TestNs, path: &str) -> String {
    t.exec(&["cat", path]).trim().to_string()
}

/// A pod namespace whose defaults are the unhelpful ones a sandbox may inherit: IPv6 off,
/// router advertisements accepted.
fn pod_ns(tag: &str) -> TestNs {
    let pod = TestNs::new(tag);
    pod.exec(&["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", "net.ipv6.conf.default.accept_ra=1"]);
    pod
}

#[tokio::test]
async fn dual_stack_pod_gets_both_families_usable_at_once() {
    if !root_or_skip("dual_stack_pod_gets_both_families_usable_at_once") {
        return;
    }
    let host = TestNs::new("host");
    let pod = pod_ns("pod");
    let c = dual(5);
    let made = setup_pod(&host.ns, &pod.ns, &c).await.unwrap();

    // Checked right away: DAD is over when setup answers.
    let a = addrs6(&pod, "eth0");
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["local"], "fd00:10:128:1::5");
    assert_eq!(a[0]["prefixlen"], 64);
    assert!(a[0].get("tentative").is_none() && a[0].get("dadfailed").is_none(), "{:?}", a[0]);
    assert_eq!(pod.addrs("eth0"), vec!["10.128.0.5/23"]);

    let r4 = pod.routes();
    assert_eq!(route(&r4, "default").expect("IPv4 default")["gateway"], "10.128.0.1");
    let r6 = routes6(&pod);
    let d = route(&r6, "default").unwrap_or_else(|| panic!("IPv6 default: {r6:?}"));
    assert_eq!(d["gateway"], "fd00:10:128:1::1");
    assert_eq!(d["dev"], "eth0");
    for dst in ["fd00:10:128::/48", "ff00::/8"] {
        let r = route(&r6, dst).unwrap_or_else(|| panic!("route {dst}: {r6:?}"));
        assert_eq!(r["dev"], "eth0");
        assert!(r.get("gateway").is_none(), "{r}");
    }

    assert_eq!(sysctl(&pod, "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"), "0");
    assert_eq!(sysctl(&pod, "/proc/sys/net/ipv6/conf/eth0/accept_ra"), "0");
    // The short DAD wait is put back afterwards (it also paces address resolution): eth0 has
    // what every other interface of the namespace has (a namespace has no neigh/default).
    assert_eq!(
        sysctl(&pod, "/proc/sys/net/ipv6/neigh/eth0/retrans_time_ms"),
        sysctl(&pod, "/proc/sys/net/ipv6/neigh/lo/retrans_time_ms")
    );

    check_pod_config(&pod.ns, &c, c.mac).await.unwrap();
    pod.ip(&["-6", "route", "del", "ff00::/8", "dev", "eth0"]);
    pod.ip(&["-6", "route", "del", "default"]);
    let e = check_pod_config(&pod.ns, &c, c.mac).await.unwrap_err();
    let Error::Check { problems, .. } = &e else { panic!("expected a check error, got {e}") };
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("ff00::/8")), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("::/0 via fd00:10:128:1::1")), "{problems:?}");
    pod.ip(&["-6", "addr", "del", "fd00:10:128:1::5/64", "dev", "eth0"]);
    let e = check_pod_config(&pod.ns, &c, c.mac).await.unwrap_err();
    assert!(e.to_string().contains("IPv6 address fd00:10:128:1::5/64 missing"), "{e}");
    // An IPv4-only check does not look at IPv6.
    check_pod_config(&pod.ns, &PodConfig { ipv6: None, ..c.clone() }, c.mac).await.unwrap();
    hostnet::teardown_pod(&host.ns, &made.host_veth).await.unwrap();
}

#[tokio::test]
async fn ipv4_only_pod_leaves_ipv6_alone() {
    if !root_or_skip("ipv4_only_pod_leaves_ipv6_alone") {
        return;
    }
    let host = TestNs::new("host");
    let pod = pod_ns("pod");
    setup_pod(&host.ns, &pod.ns, &pod_cfg(5)).await.unwrap();
    assert!(addrs6(&pod, "eth0").is_empty());
    assert_eq!(sysctl(&pod, "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"), "1", "untouched");
}

#[tokio::test]
async fn dual_stack_pods_ping6_each_other() {
    if !root_or_skip("dual_stack_pods_ping6_each_other") {
        return;
    }
    let host = TestNs::new("host");
    host.ip(&["link", "add", "br0", "type", "bridge"]);
    host.ip(&["link", "set", "br0", "up"]);
    let a = pod_ns("pa");
    let b = pod_ns("pb");
    for (pod, n) in [(&a, 5u8), (&b, 6u8)] {
        let made = setup_pod(&host.ns, &pod.ns, &dual(n)).await.unwrap();
        host.ip(&["link", "set", &made.host_veth, "master", "br0"]);
    }
    assert!(a.exec_ok(&["ping", "-6", "-c", "1", "-W", "3", "fd00:10:128:1::6"]), "pod a -> pod b over IPv6");
    assert!(b.exec_ok(&["ping", "-6", "-c", "1", "-W", "3", "fd00:10:128:1::5"]), "pod b -> pod a over IPv6");
    assert!(a.exec_ok(&["ping", "-4", "-c", "1", "-W", "3", "10.128.0.6"]), "and IPv4 still");
}

/// A peer on the pod's link (`br0` in `host`) that holds `addr` and answers for it (no DAD of
/// its own, so it is not tentative).
fn duplicate_holder(host: &TestNs, addr: &str) -> TestNs {
    let dup = TestNs::new("dup");
    host.ip(&["link", "add", "br0", "type", "bridge"]);
    host.ip(&["link", "set", "br0", "up"]);
    host.ip(&["link", "add", "dupa", "type", "veth", "peer", "name", "dupb", "netns", &dup.name]);
    host.ip(&["link", "set", "dupa", "master", "br0", "up"]);
    dup.exec(&["sysctl", "-qw", "net.ipv6.conf.dupb.accept_dad=0"]);
    dup.ip(&["addr", "add", addr, "dev", "dupb"]);
    dup.ip(&["link", "set", "dupb", "up"]);
    dup
}

#[tokio::test]
async fn dad_failure_is_an_error_and_leaves_the_interface_to_the_caller() {
    if !root_or_skip("dad_failure_is_an_error_and_leaves_the_interface_to_the_caller") {
        return;
    }
    let host = TestNs::new("host");
    let pod = pod_ns("pod");
    let _dup = duplicate_holder(&host, "fd00:10:128:1::5/64");
    let c = dual(5);
    // The agent's two steps, the host end joining the link in between.
    let veth = make_pod_veth(&host.ns, &pod.ns, &c).await.unwrap();
    host.ip(&["link", "set", &veth, "master", "br0"]);
    let e = configure_pod(&host.ns, &pod.ns, &c, &veth).await.unwrap_err();
    let Error::DadFailed { address, .. } = &e else { panic!("expected DadFailed, got {e}") };
    assert_eq!(address.to_string(), "fd00:10:128:1::5/64");
    eprintln!("DAD failure as reported: {e}");
    let a = addrs6(&pod, "eth0");
    assert_eq!(a[0]["dadfailed"], true, "{a:?}");
    assert!(host.link(&veth).is_some(), "configure_pod leaves what it made to the caller");
    // The check sees it too.
    let e = check_pod_config(&pod.ns, &c, None).await.unwrap_err();
    assert!(e.to_string().contains("duplicate address detection"), "{e}");
}

#[tokio::test]
async fn dad_failure_of_a_claimed_spare_removes_it() {
    if !root_or_skip("dad_failure_of_a_claimed_spare_removes_it") {
        return;
    }
    let host = TestNs::new("host");
    let pod = pod_ns("pod");
    let _dup = duplicate_holder(&host, "fd00:10:128:1::7/64");
    let hold = Netns::create_anonymous("test spares").unwrap();
    create_spare(&host.ns, &hold, "vethspare6", 1400).await.unwrap();
    host.ip(&["link", "set", "vethspare6", "master", "br0"]);
    let e = claim_spare(&host.ns, &hold, &pod.ns, "vethspare6", &dual(7)).await.unwrap_err();
    assert!(matches!(e, Error::DadFailed { .. }), "{e}");
    assert!(host.link("vethspare6").is_none(), "host end left behind");
    assert!(pod.link("eth0").is_none(), "pod end left behind");

    // A spare without a duplicate becomes a dual-stack pod interface.
    create_spare(&host.ns, &hold, "vethspare7", 1400).await.unwrap();
    let c = dual(8);
    claim_spare(&host.ns, &hold, &pod.ns, "vethspare7", &c).await.unwrap();
    check_pod_config(&pod.ns, &c, c.mac).await.unwrap();
    let a = addrs6(&pod, "eth0");
    assert!(a[0].get("tentative").is_none(), "{a:?}");
}

/// configure_pod (with make_pod_veth, as the agent runs them) for IPv4 only and for
/// dual-stack, alternated in one run: the IPv6 side's cost as a ratio of medians (printed;
/// no threshold on a shared machine).
#[tokio::test]
async fn dual_stack_cost_as_a_ratio() {
    if !root_or_skip("dual_stack_cost_as_a_ratio") {
        return;
    }
    const ROUNDS: usize = 7;
    let host = TestNs::new("host");
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for i in 0..ROUNDS {
        for (dual_stack, times) in [(false, &mut v4), (true, &mut v6)] {
            let pod = pod_ns("pod");
            let c = if dual_stack { dual(5) } else { pod_cfg(5) };
            let veth = make_pod_veth(&host.ns, &pod.ns, &c).await.unwrap();
            let t = Instant::now();
            configure_pod(&host.ns, &pod.ns, &c, &veth).await.unwrap();
            times.push(t.elapsed());
            hostnet::teardown_pod(&host.ns, &veth).await.unwrap();
            let _ = i;
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (m4, m6) = (median(&mut v4), median(&mut v6));
    let line = format!(
        "configure_pod median of {ROUNDS}: IPv4 only {:.1} ms, dual-stack {:.1} ms, ratio {:.2} (IPv4 {:?}, dual {:?})",
        m4.as_secs_f64() * 1e3,
        m6.as_secs_f64() * 1e3,
        m6.as_secs_f64() / m4.as_secs_f64(),
        v4.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        v6.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
    );
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// An IPv6-only pod: the IPv6 side of [`dual`] alone.
fn v6_only(host: u8) -> PodConfig {
    PodConfig { ipv4: None, ..dual(host) }
}

/// All of `dev`'s IPv6 addresses, link-local included, as (address, scope).
fn all_addrs6(t: &TestNs, dev: &str) -> Vec<(String, String)> {
    let v = t.ip_json(&["-6", "addr", "show", "dev", dev]);
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| Some((a["local"].as_str()?.to_string(), a["scope"].as_str()?.to_string())))
        .collect()
}

#[tokio::test]
async fn ipv6_only_pod_has_no_ipv4_and_reaches_its_gateway() {
    if !root_or_skip("ipv6_only_pod_has_no_ipv4_and_reaches_its_gateway") {
        return;
    }
    let host = TestNs::new("host");
    // The gateway: tun0's IPv6 address, on a bridge standing in for OVS.
    host.ip(&["link", "add", "br0", "type", "bridge"]);
    host.ip(&["addr", "add", "fd00:10:128:1::1/64", "dev", "br0", "nodad"]);
    host.ip(&["link", "set", "br0", "up"]);
    let pod = pod_ns("pod");
    let c = v6_only(5);
    let veth = make_pod_veth(&host.ns, &pod.ns, &c).await.unwrap();
    host.ip(&["link", "set", &veth, "master", "br0"]);
    let made = configure_pod(&host.ns, &pod.ns, &c, &veth).await.unwrap();
    assert_eq!(Some(made.mac), c.mac);

    // IPv6: the address (DAD over) and the kernel's link-local, nothing else.
    let a = addrs6(&pod, "eth0");
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["local"], "fd00:10:128:1::5");
    assert!(a[0].get("tentative").is_none() && a[0].get("dadfailed").is_none(), "{:?}", a[0]);
    let all = all_addrs6(&pod, "eth0");
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.iter().any(|(a, s)| s == "link" && a.starts_with("fe80:")), "{all:?}");
    let r6 = routes6(&pod);
    assert_eq!(route(&r6, "default").unwrap_or_else(|| panic!("IPv6 default: {r6:?}"))["gateway"], "fd00:10:128:1::1");
    for dst in ["fd00:10:128::/48", "ff00::/8"] {
        let r = route(&r6, dst).unwrap_or_else(|| panic!("route {dst}: {r6:?}"));
        assert_eq!(r["dev"], "eth0");
        assert!(r.get("gateway").is_none(), "{r}");
    }
    // No IPv4 at all on the pod's side.
    assert!(pod.addrs("eth0").is_empty(), "IPv4 addresses: {:?}", pod.addrs("eth0"));
    assert!(pod.routes().is_empty(), "IPv4 routes: {:?}", pod.routes());
    assert_eq!(pod.tx_checksumming("eth0"), "off");

    assert!(pod.exec_ok(&["ping", "-6", "-c", "1", "-W", "3", "fd00:10:128:1::1"]), "pod -> gateway over IPv6");

    check_pod_config(&pod.ns, &c, c.mac).await.unwrap();
    pod.ip(&["-6", "route", "del", "default"]);
    let e = check_pod_config(&pod.ns, &c, c.mac).await.unwrap_err();
    let Error::Check { problems, .. } = &e else { panic!("expected a check error, got {e}") };
    assert_eq!(problems.len(), 1, "only the IPv6 route, nothing about IPv4: {problems:?}");
    assert!(problems[0].contains("::/0 via fd00:10:128:1::1"), "{problems:?}");
    hostnet::teardown_pod(&host.ns, &veth).await.unwrap();
}

#[tokio::test]
async fn ipv6_only_pods_ping6_each_other_and_spares_serve_them() {
    if !root_or_skip("ipv6_only_pods_ping6_each_other_and_spares_serve_them") {
        return;
    }
    let host = TestNs::new("host");
    host.ip(&["link", "add", "br0", "type", "bridge"]);
    host.ip(&["link", "set", "br0", "up"]);
    let a = pod_ns("pa");
    let b = pod_ns("pb");
    let made = setup_pod(&host.ns, &a.ns, &v6_only(5)).await.unwrap();
    host.ip(&["link", "set", &made.host_veth, "master", "br0"]);
    // The other through a spare, as the agent's pool gives them.
    let hold = Netns::create_anonymous("test spares").unwrap();
    create_spare(&host.ns, &hold, "vethspare9", 1400).await.unwrap();
    host.ip(&["link", "set", "vethspare9", "master", "br0"]);
    let c = v6_only(6);
    claim_spare(&host.ns, &hold, &b.ns, "vethspare9", &c).await.unwrap();
    check_pod_config(&b.ns, &c, c.mac).await.unwrap();
    assert!(b.addrs("eth0").is_empty() && b.routes().is_empty());
    assert!(a.exec_ok(&["ping", "-6", "-c", "1", "-W", "3", "fd00:10:128:1::6"]), "pod a -> pod b over IPv6");
    assert!(b.exec_ok(&["ping", "-6", "-c", "1", "-W", "3", "fd00:10:128:1::5"]), "pod b -> pod a over IPv6");
}

#[tokio::test]
async fn a_pod_without_any_family_is_refused_touching_nothing() {
    if !root_or_skip("a_pod_without_any_family_is_refused_touching_nothing") {
        return;
    }
    let host = TestNs::new("host");
    let pod = pod_ns("pod");
    let e = setup_pod(&host.ns, &pod.ns, &PodConfig { ipv6: None, ..v6_only(5) }).await.unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("neither an IPv4 nor an IPv6"), "{e}");
    assert!(pod.link("eth0").is_none());
    assert_eq!(host.ip_json(&["link", "show"]).as_array().unwrap().len(), 1, "only lo in host");
}
