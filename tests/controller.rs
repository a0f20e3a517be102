//! `sdn-node controller` (the binary) against the fake API server (tests/support/fake_kube.rs:
//! create, replace with 409 on a stale resourceVersion, delete with preconditions, Leases):
//! what it writes from a kubeadm-shaped cluster and from one without podCIDRs, Node and
//! Namespace deletion, a podCIDR outside the cluster network, a conflicting ClusterNetwork, a
//! restart that allocates nothing twice, the multitenant operations, two replicas with the
//! leader SIGKILLed, dual-stack (and an IPv4 cluster turned dual-stack) and IPv6-only. The API server's objects are the oracle; every test ends with the
//! controller ready.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::controller::Controller;
use support::fake_kube::FakeKube;

fn node(name: &str, pod_cidr: Option<&str>, internal: &str) -> Value {
    let mut n = json!({"metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {},
        "status": {"addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": internal}],
                   "conditions": [{"type": "Ready", "status": "True"}]}});
    if let Some(c) = pod_cidr {
        n["spec"] = json!({"podCIDR": c, "podCIDRs": [c]});
    }
    n
}

fn namespace(name: &str) -> Value {
    json!({"metadata": {"name": name, "uid": format!("uid-{name}")}})
}

/// HostSubnets by name: (host, hostIP, subnet).
fn host_subnets(fake: &FakeKube) -> BTreeMap<String, (String, String, String)> {
    fake.objects("hostsubnets")
        .into_iter()
        .map(|h| {
            let s = |k: &str| h[k].as_str().unwrap_or_default().to_string();
            (h["metadata"]["name"].as_str().unwrap().to_string(), (s("host"), s("hostIP"), s("subnet")))
        })
        .collect()
}

/// NetNamespaces by name: netid.
fn netids(fake: &FakeKube) -> BTreeMap<String, u64> {
    fake.objects("netnamespaces")
        .into_iter()
        .map(|n| (n["metadata"]["name"].as_str().unwrap().to_string(), n["netid"].as_u64().unwrap()))
        .collect()
}

/// The write requests (create, replace, patch, delete) on the objects the controller owns.
fn writes(fake: &FakeKube) -> usize {
    ["hostsubnets", "netnamespaces", "clusternetworks"]
        .iter()
        .map(|r| ["POST", "PUT", "PATCH", "DELETE"].iter().map(|m| fake.count(m, r)).sum::<usize>())
        .sum()
}

/// The Warning Events with `reason`, as "kind/name: note".
fn events(fake: &FakeKube, reason: &str) -> Vec<String> {
    fake.objects("events")
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| {
            format!(
                "{}/{}: {}",
                e["regarding"]["kind"].as_str().unwrap_or_default(),
                e["regarding"]["name"].as_str().unwrap_or_default(),
                e["note"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

async fn poll<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..400 {
        if let Some(t) = f() {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not reached");
}

fn kubeadm(fake: &FakeKube) {
    fake.put("nodes", node("master-0", Some("10.128.0.0/24"), "192.168.10.10"));
    fake.put("nodes", node("worker-1", Some("10.128.1.0/24"), "192.168.10.11"));
    fake.put("nodes", node("worker-2", Some("10.128.2.0/24"), "192.168.10.12"));
    for ns in ["default", "kube-system", "kube-public", "team-a", "team-b"] {
        fake.put("namespaces", namespace(ns));
    }
}

#[tokio::test]
async fn a_kubeadm_cluster_gets_exactly_the_expected_objects() {
    let fake = FakeKube::start().await;
    kubeadm(&fake);
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::spawn(&fake, dir.path(), "c1", &["--host-subnet-length", "8"]);
    c.settled("first decisions").await;

    let cn = fake.object("clusternetworks", "", "default").expect("ClusterNetwork default");
    assert_eq!(cn["network"], "10.128.0.0/14");
    assert_eq!(cn["hostsubnetlength"], 8);
    assert_eq!(cn["serviceNetwork"], "172.30.0.0/16");
    assert_eq!(cn["pluginName"], "redhat/openshift-ovs-networkpolicy");
    assert_eq!(cn["clusterNetworks"], json!([{"CIDR": "10.128.0.0/14", "hostSubnetLength": 8}]));
    assert_eq!((cn["vxlanPort"].as_u64(), cn["mtu"].as_u64()), (Some(4789), Some(1450)));

    let want: BTreeMap<String, (String, String, String)> = [
        ("master-0", "192.168.10.10", "10.128.0.0/24"),
        ("worker-1", "192.168.10.11", "10.128.1.0/24"),
        ("worker-2", "192.168.10.12", "10.128.2.0/24"),
    ]
    .iter()
    .map(|(n, ip, s)| (n.to_string(), (n.to_string(), ip.to_string(), s.to_string())))
    .collect();
    assert_eq!(host_subnets(&fake), want);

    let ids = netids(&fake);
    assert_eq!(ids.keys().cloned().collect::<Vec<_>>(), ["default", "kube-public", "kube-system", "team-a", "team-b"]);
    assert_eq!(ids["default"], 0);
    let mut others: Vec<u64> = ids.iter().filter(|(n, _)| *n != "default").map(|(_, v)| *v).collect();
    others.sort();
    others.dedup();
    assert_eq!(others.len(), 4, "unique VNIDs: {ids:?}");
    assert!(others.iter().all(|v| (10..1 << 24).contains(v)), "{ids:?}");
    // One write per object, nothing more: 1 ClusterNetwork, 3 HostSubnets, 5 NetNamespaces.
    assert_eq!(writes(&fake), 9);

    // A Node's address change is one replace of its HostSubnet.
    let before = writes(&fake);
    fake.put("nodes", node("worker-2", Some("10.128.2.0/24"), "192.168.10.22"));
    poll("hostIP follows the Node", || (host_subnets(&fake)["worker-2"].1 == "192.168.10.22").then_some(())).await;
    c.settled("after the address change").await;
    assert_eq!(writes(&fake) - before, 1);
    assert_eq!(fake.count("PUT", "hostsubnets"), 1);
    // A heartbeat (status.conditions) is no write at all.
    let mut hb = node("worker-1", Some("10.128.1.0/24"), "192.168.10.11");
    hb["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2026-12-05T12:00:00Z");
    fake.put("nodes", hb);
    c.settled("after a heartbeat").await;
    assert_eq!(writes(&fake) - before, 1);

    // A deleted Node's HostSubnet and a deleted Namespace's NetNamespace go.
    fake.delete("nodes", "", "worker-1");
    fake.delete("namespaces", "", "team-b");
    poll("HostSubnet and NetNamespace deleted", || {
        (!host_subnets(&fake).contains_key("worker-1") && !netids(&fake).contains_key("team-b")).then_some(())
    })
    .await;
    c.settled("after deletions").await;
    assert_eq!(host_subnets(&fake).len(), 2);
    let (code, metrics) = c.get("/metrics").await;
    assert_eq!(code, 200);
    for line in [
        "sdn_node_controller_leading 1",
        "sdn_node_controller_host_subnets 2",
        "sdn_node_controller_net_namespaces 4",
        "sdn_node_controller_pending 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    c.ready_again("kubeadm cluster").await;
}

#[tokio::test]
async fn a_cluster_without_pod_cidrs_gets_the_allocator_and_a_restart_allocates_nothing_twice() {
    let fake = FakeKube::start().await;
    for (i, n) in ["node-a", "node-b", "node-c"].iter().enumerate() {
        fake.put("nodes", node(n, None, &format!("10.0.0.{}", i + 1)));
    }
    fake.put("namespaces", namespace("default"));
    let dir = tempfile::tempdir().unwrap();
    let mut c = Controller::spawn(&fake, dir.path(), "c1", &[]);
    c.settled("allocation").await;
    let subnets = |f: &FakeKube| host_subnets(f).into_iter().map(|(n, (_, _, s))| (n, s)).collect::<BTreeMap<_, _>>();
    let want =
        |pairs: &[(&str, &str)]| pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<BTreeMap<_, _>>();
    assert_eq!(
        subnets(&fake),
        want(&[("node-a", "10.128.0.0/23"), ("node-b", "10.128.2.0/23"), ("node-c", "10.128.4.0/23")])
    );

    // node-b's subnet is reused only after its HostSubnet is gone.
    fake.delete("nodes", "", "node-b");
    poll("node-b's HostSubnet deleted", || (!subnets(&fake).contains_key("node-b")).then_some(())).await;
    fake.put("nodes", node("node-d", None, "10.0.0.4"));
    poll("node-d allocated", || subnets(&fake).get("node-d").cloned()).await;
    assert_eq!(subnets(&fake)["node-d"], "10.128.2.0/23");
    c.settled("after node-d").await;

    // A restart re-derives the allocator from the HostSubnets: no write for what exists, and
    // a new Node gets the next free subnet, not one already held.
    c.kill9();
    c.wait_exit().await;
    let before = writes(&fake);
    let c = Controller::spawn(&fake, dir.path(), "c2", &[]);
    c.settled("restarted").await;
    assert_eq!(writes(&fake), before, "a restart changes nothing");
    fake.put("nodes", node("node-e", None, "10.0.0.5"));
    poll("node-e allocated", || subnets(&fake).get("node-e").cloned()).await;
    assert_eq!(subnets(&fake)["node-e"], "10.128.6.0/23");
    let all: Vec<String> = subnets(&fake).into_values().collect();
    let mut unique = all.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "no two Nodes share a subnet: {all:?}");
    c.ready_again("allocator").await;
}

#[tokio::test]
async fn pod_cidr_problems_are_events_not_hostsubnets() {
    let fake = FakeKube::start().await;
    fake.put("nodes", node("in", Some("10.128.4.0/24"), "10.0.0.1"));
    fake.put("nodes", node("outside", Some("192.168.77.0/24"), "10.0.0.2"));
    fake.put("nodes", node("waiting", None, "10.0.0.3"));
    let mut noip = node("noip", Some("10.128.8.0/24"), "10.0.0.4");
    noip["status"]["addresses"] = json!([]);
    fake.put("nodes", noip);
    fake.put("nodes", node("overlap", Some("10.128.4.0/25"), "10.0.0.5"));
    fake.put("namespaces", namespace("default"));
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::spawn(&fake, dir.path(), "c1", &[]);
    c.settled("decisions").await;
    assert_eq!(host_subnets(&fake).keys().cloned().collect::<Vec<_>>(), ["in"]);
    let outside = poll("PodCIDROutsideClusterNetwork Event", || {
        Some(events(&fake, "PodCIDROutsideClusterNetwork")).filter(|e| !e.is_empty())
    })
    .await;
    assert_eq!(outside.len(), 1);
    assert!(
        outside[0].starts_with("Node/outside: ")
            && outside[0].contains("192.168.77.0/24")
            && outside[0].contains("10.128.0.0/14"),
        "{outside:?}"
    );
    let waiting = poll("NoPodCIDR Event", || Some(events(&fake, "NoPodCIDR")).filter(|e| !e.is_empty())).await;
    assert!(waiting[0].starts_with("Node/waiting: ") && waiting[0].contains("--allocate-node-cidrs"), "{waiting:?}");
    let noip = poll("NoHostIP Event", || Some(events(&fake, "NoHostIP")).filter(|e| !e.is_empty())).await;
    assert!(noip[0].contains("sdn-node.openshift.io/host-ip"), "{noip:?}");
    let overlap =
        poll("SubnetConflict Event", || Some(events(&fake, "SubnetConflict")).filter(|e| !e.is_empty())).await;
    assert!(overlap[0].starts_with("Node/overlap: ") && overlap[0].contains("of in"), "{overlap:?}");
    // Each problem once (not one Event per pass), and listed in /status.
    c.settled("still").await;
    assert_eq!(events(&fake, "PodCIDROutsideClusterNetwork").len(), 1);
    let s = c.status().await.unwrap();
    let objects: Vec<&str> = s["problems"].as_array().unwrap().iter().map(|p| p["object"].as_str().unwrap()).collect();
    assert_eq!(objects, ["node/noip", "node/outside", "node/overlap", "node/waiting"]);

    // Fixed: the podCIDR given, the annotation set: HostSubnets follow, problems clear.
    fake.put("nodes", node("outside", Some("10.128.5.0/24"), "10.0.0.2"));
    fake.put("nodes", node("waiting", Some("10.128.6.0/24"), "10.0.0.3"));
    let mut noip = node("noip", Some("10.128.8.0/24"), "10.0.0.4");
    noip["status"]["addresses"] = json!([]);
    noip["metadata"]["annotations"] = json!({"sdn-node.openshift.io/host-ip": "172.16.0.4"});
    fake.put("nodes", noip);
    fake.delete("nodes", "", "overlap");
    poll("HostSubnets after the fixes", || (host_subnets(&fake).len() == 4).then_some(())).await;
    assert_eq!(host_subnets(&fake)["noip"].1, "172.16.0.4");
    let s = c.settled("fixed").await;
    assert_eq!(s["problems"], json!([]));
    c.ready_again("pod CIDR problems").await;
}

#[tokio::test]
async fn a_conflicting_cluster_network_is_refused_by_field_and_never_changed() {
    let fake = FakeKube::start().await;
    fake.put(
        "clusternetworks",
        json!({"metadata": {"name": "default", "uid": "cn-uid"}, "network": "10.128.0.0/14", "hostsubnetlength": 9,
               "serviceNetwork": "10.96.0.0/12", "pluginName": "redhat/openshift-ovs-networkpolicy"}),
    );
    fake.put("nodes", node("node-a", Some("10.128.0.0/23"), "10.0.0.1"));
    fake.put("namespaces", namespace("team-a"));
    let before = fake.object("clusternetworks", "", "default").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::spawn(&fake, dir.path(), "c1", &[]);
    let s = c
        .wait("conflict reported", |s| {
            s["leading"] == true && s["cluster_network"].as_str().is_some_and(|m| m.contains("serviceNetwork"))
        })
        .await;
    let msg = s["cluster_network"].as_str().unwrap();
    assert!(
        msg.contains("serviceNetwork is 10.96.0.0/12 in the cluster, 172.30.0.0/16 in this controller's configuration"),
        "{msg}"
    );
    let (code, body) = c.get("/readyz").await;
    assert_eq!(code, 503);
    assert!(body.contains("serviceNetwork"), "{body}");
    let ev = poll("ClusterNetworkConflict Event", || {
        Some(events(&fake, "ClusterNetworkConflict")).filter(|e| !e.is_empty())
    })
    .await;
    assert!(ev[0].starts_with("ClusterNetwork/default: ") && ev[0].contains("serviceNetwork"), "{ev:?}");
    assert!(c.log_text().contains("serviceNetwork is 10.96.0.0/12"), "a log line names the field");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fake.object("clusternetworks", "", "default").unwrap(), before, "never changed");
    assert_eq!(writes(&fake), 0, "nothing is allocated against a network that differs");

    // The operator deletes it (a new cluster): created from the configuration, then the rest.
    fake.delete("clusternetworks", "", "default");
    poll("recreated", || {
        fake.object("clusternetworks", "", "default").filter(|cn| cn["serviceNetwork"] == "172.30.0.0/16")
    })
    .await;
    poll("HostSubnet after the fix", || host_subnets(&fake).get("node-a").cloned()).await;
    c.settled("after the fix").await;
    c.ready_again("conflicting ClusterNetwork").await;
}

#[tokio::test]
async fn multitenant_join_isolate_global() {
    let fake = FakeKube::start().await;
    for ns in ["default", "a", "b", "c"] {
        fake.put("namespaces", namespace(ns));
    }
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::spawn(&fake, dir.path(), "c1", &["--plugin", "multitenant"]);
    c.settled("NetNamespaces").await;
    let ids = netids(&fake);
    let annotate = |ns: &str, value: &str| {
        let mut n = fake.object("netnamespaces", "", ns).unwrap();
        n["metadata"]["annotations"] = json!({"pod.network.openshift.io/multitenant.change-network": value});
        fake.put("netnamespaces", n);
    };
    let done = |ns: &str| {
        let n = fake.object("netnamespaces", "", ns).unwrap();
        n["metadata"]["annotations"]
            .get("pod.network.openshift.io/multitenant.change-network")
            .is_none()
            .then(|| n["netid"].as_u64().unwrap())
    };
    annotate("b", "join:a");
    let b = poll("b joins a", || done("b")).await;
    assert_eq!(b, ids["a"]);
    annotate("b", "isolate");
    let b = poll("b isolated", || done("b")).await;
    assert!(
        b != ids["a"] && !netids(&fake).iter().any(|(n, v)| n != "b" && *v == b),
        "b has a VNID of its own: {:?}",
        netids(&fake)
    );
    annotate("c", "global");
    assert_eq!(poll("c global", || done("c")).await, 0);
    annotate("a", "join:nope");
    assert_eq!(poll("bad join refused", || done("a")).await, ids["a"]);
    let ev =
        poll("ChangeNetworkRefused Event", || Some(events(&fake, "ChangeNetworkRefused")).filter(|e| !e.is_empty()))
            .await;
    assert!(ev[0].starts_with("Namespace/a: ") && ev[0].contains("nope"), "{ev:?}");
    c.settled("after the operations").await;
    c.ready_again("multitenant").await;
}

#[tokio::test]
async fn renumbering_is_refused_under_networkpolicy() {
    let fake = FakeKube::start().await;
    for ns in ["default", "a", "b"] {
        fake.put("namespaces", namespace(ns));
    }
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::spawn(&fake, dir.path(), "c1", &[]);
    c.settled("NetNamespaces").await;
    let ids = netids(&fake);
    let mut n = fake.object("netnamespaces", "", "b").unwrap();
    n["metadata"]["annotations"] = json!({"pod.network.openshift.io/multitenant.change-network": "join:a"});
    fake.put("netnamespaces", n);
    let n = poll("annotation removed", || {
        fake.object("netnamespaces", "", "b").filter(|n| {
            n["metadata"]["annotations"].get("pod.network.openshift.io/multitenant.change-network").is_none()
        })
    })
    .await;
    assert_eq!(n["netid"].as_u64(), Some(ids["b"]));
    let ev =
        poll("ChangeNetworkRefused Event", || Some(events(&fake, "ChangeNetworkRefused")).filter(|e| !e.is_empty()))
            .await;
    assert!(ev[0].contains("does not allow NetNamespace renumbering"), "{ev:?}");
    c.ready_again("networkpolicy renumbering").await;
}

#[tokio::test]
async fn the_subnet_plugin_writes_no_netnamespaces() {
    let fake = FakeKube::start().await;
    kubeadm(&fake);
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::spawn(&fake, dir.path(), "c1", &["--plugin", "subnet", "--host-subnet-length", "8"]);
    c.settled("subnet plugin").await;
    assert_eq!(host_subnets(&fake).len(), 3);
    assert!(netids(&fake).is_empty());
    assert_eq!(fake.object("clusternetworks", "", "default").unwrap()["pluginName"], "redhat/openshift-ovs-subnet");
    c.ready_again("subnet plugin").await;
}

#[tokio::test]
async fn a_standby_takes_over_within_the_lease_duration_and_changes_nothing() {
    let fake = FakeKube::start().await;
    kubeadm(&fake);
    let dir = tempfile::tempdir().unwrap();
    let mut a = Controller::spawn(&fake, dir.path(), "replica-a", &["--host-subnet-length", "8"]);
    a.settled("replica-a leads").await;
    let b = Controller::spawn(&fake, dir.path(), "replica-b", &["--host-subnet-length", "8"]);
    b.wait("replica-b listed, standing by", |s| s["synced"] == true && s["leading"] == false).await;
    b.ready_again("a standby that has listed is ready").await;
    let lease = fake.object("leases", "sdn-node", "sdn-node-controller").expect("Lease");
    assert_eq!(lease["spec"]["holderIdentity"], "replica-a");
    let objects = (fake.objects("hostsubnets"), fake.objects("netnamespaces"), fake.objects("clusternetworks"));
    let before = writes(&fake);

    a.kill9();
    let killed = Instant::now();
    a.wait_exit().await;
    b.wait("replica-b leads", |s| s["leading"] == true).await;
    let took = killed.elapsed();
    // Lease duration 3 s; the standby observes the last renewal up to one retry period (0.5 s,
    // plus jitter up to 1.2 periods) after it happened.
    // A bound with room for a busy machine: lease + 2 jittered retries + 1 s.
    assert!(took < Duration::from_millis(3000 + 2200 + 1000), "took {took:?}");
    assert!(took >= Duration::from_millis(1000), "the Lease was respected: {took:?}");
    let lease = fake.object("leases", "sdn-node", "sdn-node-controller").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    b.settled("replica-b decided everything").await;
    assert_eq!(writes(&fake), before, "the new leader changed no object");
    assert_eq!((fake.objects("hostsubnets"), fake.objects("netnamespaces"), fake.objects("clusternetworks")), objects);

    // And it is the one that writes now.
    fake.put("nodes", node("worker-3", Some("10.128.3.0/24"), "192.168.10.13"));
    poll("replica-b writes", || host_subnets(&fake).get("worker-3").cloned()).await;

    // A graceful stop hands over at once (the Lease is released).
    let c = Controller::spawn(&fake, dir.path(), "replica-c", &["--host-subnet-length", "8"]);
    c.wait("replica-c standing by", |s| s["synced"] == true).await;
    b.term();
    let stopped = Instant::now();
    c.wait("replica-c leads after a release", |s| s["leading"] == true).await;
    assert!(
        stopped.elapsed() < Duration::from_secs(3),
        "a released Lease is taken at the next try: {:?}",
        stopped.elapsed()
    );
    c.settled("replica-c").await;
    c.ready_again("takeover").await;
}

const DUAL: [&str; 4] = ["--cluster-network-ipv6", "fd00:10:128::/48", "--service-network-ipv6", "fd00:172:30::/112"];

/// A Node with dual-stack podCIDRs (kube-controller-manager with two `--cluster-cidr`s).
fn node_dual(name: &str, cidrs: &[&str], internal: &str) -> Value {
    let mut n = node(name, None, internal);
    n["spec"] = json!({"podCIDR": cidrs[0], "podCIDRs": cidrs});
    n
}

/// HostSubnets by name: (subnet, IPv6 subnet annotation).
fn subnets_dual(fake: &FakeKube) -> BTreeMap<String, (String, String)> {
    fake.objects("hostsubnets")
        .into_iter()
        .map(|h| {
            let six = h["metadata"]["annotations"]["sdn-node.openshift.io/subnet-ipv6"].as_str().unwrap_or_default();
            (h["metadata"]["name"].as_str().unwrap().to_string(), (h["subnet"].as_str().unwrap_or_default().to_string(), six.to_string()))
        })
        .collect()
}

fn pairs(p: &[(&str, &str, &str)]) -> BTreeMap<String, (String, String)> {
    p.iter().map(|(n, a, b)| (n.to_string(), (a.to_string(), b.to_string()))).collect()
}

/// Dual-stack from podCIDRs: each HostSubnet's IPv6 subnet is its Node's IPv6 podCIDR (in
/// either order in spec.podCIDRs); the IPv6 networks are annotations of ClusterNetwork
/// "default" (its clusterNetworks stays IPv4, which openshift-sdn's agents require); a Node
/// whose IPv6 podCIDR is outside the IPv6 cluster network gets an IPv4-only HostSubnet and an
/// Event naming the problem, and its IPv6 subnet once the podCIDR is fixed.
#[tokio::test]
async fn dual_stack_pod_cidrs_become_ipv6_host_subnets() {
    let fake = FakeKube::start().await;
    fake.put("nodes", node_dual("master-0", &["10.128.0.0/24", "fd00:10:128::/64"], "192.168.10.10"));
    fake.put("nodes", node_dual("worker-1", &["fd00:10:128:1::/64", "10.128.1.0/24"], "192.168.10.11"));
    fake.put("nodes", node_dual("worker-2", &["10.128.2.0/24", "fd00:99::/64"], "192.168.10.12"));
    fake.put("namespaces", namespace("default"));
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::spawn(&fake, dir.path(), "c1", &[&["--host-subnet-length", "8"][..], &DUAL].concat());
    c.settled("dual-stack decisions").await;
    let cn = fake.object("clusternetworks", "", "default").expect("ClusterNetwork default");
    assert_eq!(cn["clusterNetworks"], json!([{"CIDR": "10.128.0.0/14", "hostSubnetLength": 8}]));
    assert_eq!(
        cn["metadata"]["annotations"],
        json!({"sdn-node.openshift.io/cluster-network-ipv6": "fd00:10:128::/48",
               "sdn-node.openshift.io/host-subnet-length-ipv6": "64",
               "sdn-node.openshift.io/service-network-ipv6": "fd00:172:30::/112"})
    );
    assert_eq!(
        subnets_dual(&fake),
        pairs(&[
            ("master-0", "10.128.0.0/24", "fd00:10:128::/64"),
            ("worker-1", "10.128.1.0/24", "fd00:10:128:1::/64"),
            ("worker-2", "10.128.2.0/24", ""),
        ])
    );
    let outside = poll("the Event", || Some(events(&fake, "PodCIDROutsideClusterNetwork")).filter(|e| !e.is_empty())).await;
    assert_eq!(outside.len(), 1, "{outside:?}");
    assert!(
        outside[0].starts_with("Node/worker-2: Node worker-2: IPv6 podCIDR fd00:99::/64 is not inside the IPv6 cluster network fd00:10:128::/48"),
        "{outside:?}"
    );
    // Fixed: the HostSubnet gains its IPv6 subnet (one replace), its IPv4 subnet unchanged.
    let before = writes(&fake);
    fake.put("nodes", node_dual("worker-2", &["10.128.2.0/24", "fd00:10:128:2::/64"], "192.168.10.12"));
    poll("worker-2 gains its IPv6 subnet", || (subnets_dual(&fake)["worker-2"].1 == "fd00:10:128:2::/64").then_some(())).await;
    c.settled("after the fix").await;
    assert_eq!(writes(&fake) - before, 1);
    assert_eq!(subnets_dual(&fake)["worker-2"].0, "10.128.2.0/24");
    c.ready_again("dual-stack podCIDRs").await;
}

/// Dual-stack without podCIDRs: the controller's second allocator cuts the IPv6 cluster
/// network into /64s; a restart reads the IPv6 subnets back from the HostSubnets' annotations
/// and writes nothing; a new Node gets the next free pair. An IPv4 cluster turned dual-stack
/// by restarting the controller with the IPv6 flags: its ClusterNetwork gains the IPv6
/// annotations (one conditional replace, the same object) and the existing HostSubnets IPv6
/// subnets (one replace each), keeping their IPv4 ones. Changing a network is still refused.
#[tokio::test]
async fn dual_stack_allocation_is_stable_across_restarts() {
    let fake = FakeKube::start().await;
    for (i, n) in ["node-a", "node-b"].iter().enumerate() {
        fake.put("nodes", node(n, None, &format!("10.0.0.{}", i + 1)));
    }
    fake.put("namespaces", namespace("default"));
    let dir = tempfile::tempdir().unwrap();
    // IPv4 first.
    let mut c = Controller::spawn(&fake, dir.path(), "c1", &[]);
    c.settled("IPv4 allocation").await;
    assert_eq!(subnets_dual(&fake), pairs(&[("node-a", "10.128.0.0/23", ""), ("node-b", "10.128.2.0/23", "")]));
    let ipv4_cn = fake.object("clusternetworks", "", "default").unwrap();
    assert_eq!(ipv4_cn["metadata"]["annotations"], Value::Null);
    c.kill9();
    c.wait_exit().await;
    // Turned dual-stack: the same ClusterNetwork gains the IPv6 networks. Its first two
    // replaces are refused (a ClusterRole without `update`): /status says so, and the
    // controller retries.
    let before = writes(&fake);
    fake.fail_next("PUT", "clusternetworks", 2, 403);
    let mut c = Controller::spawn(&fake, dir.path(), "c2", &DUAL);
    let s = c.wait("the refused update is reported", |s| s["cluster_network"].as_str().is_some_and(|m| m.starts_with("writing ClusterNetwork \"default\" failed"))).await;
    assert!(s["cluster_network"].as_str().unwrap().contains("403"), "{s}");
    assert_eq!(c.get("/readyz").await.0, 503);
    c.settled("dual-stack").await;
    let cn = fake.object("clusternetworks", "", "default").unwrap();
    assert_eq!(
        cn["metadata"]["annotations"],
        json!({"sdn-node.openshift.io/cluster-network-ipv6": "fd00:10:128::/48",
               "sdn-node.openshift.io/host-subnet-length-ipv6": "64",
               "sdn-node.openshift.io/service-network-ipv6": "fd00:172:30::/112"})
    );
    assert_eq!(cn["metadata"]["uid"], ipv4_cn["metadata"]["uid"], "updated, not recreated");
    assert_ne!(cn["metadata"]["resourceVersion"], ipv4_cn["metadata"]["resourceVersion"]);
    for field in ["network", "hostsubnetlength", "serviceNetwork", "clusterNetworks", "pluginName", "vxlanPort", "mtu"] {
        assert_eq!(cn[field], ipv4_cn[field], "{field} unchanged");
    }
    let want = pairs(&[("node-a", "10.128.0.0/23", "fd00:10:128::/64"), ("node-b", "10.128.2.0/23", "fd00:10:128:1::/64")]);
    assert_eq!(subnets_dual(&fake), want);
    // One replace of the ClusterNetwork and one per HostSubnet: nothing created or deleted.
    assert_eq!((fake.count("POST", "clusternetworks"), fake.count("PUT", "clusternetworks")), (1, 3));
    assert_eq!(fake.count("DELETE", "clusternetworks"), 0);
    assert_eq!(writes(&fake) - before, 5, "three tries of the ClusterNetwork, one replace per HostSubnet");
    assert!(events(&fake, "ClusterNetworkConflict").is_empty());
    c.ready_again("turned dual-stack").await;
    fake.put("nodes", node("node-c", None, "10.0.0.3"));
    poll("node-c allocated", || subnets_dual(&fake).get("node-c").cloned()).await;
    c.settled("node-c").await;
    assert_eq!(subnets_dual(&fake)["node-c"], ("10.128.4.0/23".to_string(), "fd00:10:128:2::/64".to_string()));

    // A restart: nothing written; a freed pair is reused only after its HostSubnet is gone.
    c.kill9();
    c.wait_exit().await;
    let before = writes(&fake);
    let mut c = Controller::spawn(&fake, dir.path(), "c3", &DUAL);
    c.settled("restarted").await;
    assert_eq!(writes(&fake), before, "a restart changes nothing");
    fake.put("nodes", node("node-d", None, "10.0.0.4"));
    poll("node-d allocated", || subnets_dual(&fake).get("node-d").cloned()).await;
    assert_eq!(subnets_dual(&fake)["node-d"], ("10.128.6.0/23".to_string(), "fd00:10:128:3::/64".to_string()));
    fake.delete("nodes", "", "node-b");
    poll("node-b's HostSubnet deleted", || (!subnets_dual(&fake).contains_key("node-b")).then_some(())).await;
    fake.put("nodes", node("node-e", None, "10.0.0.5"));
    poll("node-e allocated", || subnets_dual(&fake).get("node-e").cloned()).await;
    assert_eq!(subnets_dual(&fake)["node-e"], ("10.128.2.0/23".to_string(), "fd00:10:128:1::/64".to_string()));
    c.settled("node-e").await;
    c.ready_again("dual-stack allocator").await;
    c.kill9();
    c.wait_exit().await;

    // An IPv4-only controller now meets a dual-stack ClusterNetwork: a conflict, named.
    let mut c = Controller::spawn(&fake, dir.path(), "c4", &[]);
    c.wait("the conflict is seen", |s| s["cluster_network"].as_str().is_some_and(|m| m.contains("cluster-network-ipv6"))).await;
    let conflict = poll("the Event", || Some(events(&fake, "ClusterNetworkConflict")).filter(|e| !e.is_empty())).await;
    assert!(
        conflict.iter().any(|e| e.contains(
            "metadata.annotations[sdn-node.openshift.io/cluster-network-ipv6] is fd00:10:128::/48 in the cluster, (unset) in this controller's configuration"
        )),
        "{conflict:?}"
    );
    c.kill9();
    c.wait_exit().await;

    // Nor is the IPv6 network changed once it is there.
    let cn = fake.object("clusternetworks", "", "default").unwrap();
    let other = ["--cluster-network-ipv6", "fd00:99::/48", "--service-network-ipv6", "fd00:172:30::/112"];
    let c = Controller::spawn(&fake, dir.path(), "c5", &other);
    c.wait("the IPv6 conflict is seen", |s| s["leading"] == true && s["cluster_network"].as_str().is_some_and(|m| m.contains("fd00:99::/48"))).await;
    let s = c.status().await.unwrap();
    assert!(
        s["cluster_network"].as_str().unwrap().contains("metadata.annotations[sdn-node.openshift.io/cluster-network-ipv6] is fd00:10:128::/48 in the cluster, fd00:99::/48 in this controller's configuration"),
        "{s}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fake.object("clusternetworks", "", "default").unwrap(), cn, "never changed");
    assert_eq!(fake.count("PUT", "clusternetworks"), 3);
}

/// An IPv6-only cluster (an IPv6 --cluster-network and --service-network, the host subnet
/// length left to its default, 64): ClusterNetwork "default" and each HostSubnet hold the IPv6
/// networks in their own fields, with no IPv6 annotation; a Node's subnet is its IPv6
/// podCIDR (an IPv4 one beside it is ignored); hostIP is the Node's IPv4 address when it has
/// one, else its IPv6 address.
#[tokio::test]
async fn an_ipv6_only_cluster_has_its_networks_in_the_fields() {
    let fake = FakeKube::start().await;
    fake.put("nodes", node_dual("v6-a", &["fd00:10:128:5::/64"], "fd00:1::1"));
    fake.put("nodes", node_dual("v6-b", &["10.244.1.0/24", "fd00:10:128:6::/64"], "fd00:1::2"));
    let mut both = node_dual("both", &["fd00:10:128:7::/64"], "fd00:1::3");
    both["status"]["addresses"] = json!([{"type": "InternalIP", "address": "fd00:1::3"}, {"type": "InternalIP", "address": "192.168.10.3"}]);
    fake.put("nodes", both);
    fake.put("nodes", node_dual("outside", &["fd00:99::/64"], "fd00:1::4"));
    fake.put("namespaces", namespace("default"));
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::spawn(&fake, dir.path(), "c1", &V6_ONLY);
    c.settled("IPv6-only decisions").await;
    let cn = fake.object("clusternetworks", "", "default").expect("ClusterNetwork default");
    assert_eq!(cn["network"], "fd00:10:128::/48");
    assert_eq!(cn["hostsubnetlength"], 64);
    assert_eq!(cn["serviceNetwork"], "fd00:172:30::/112");
    assert_eq!(cn["clusterNetworks"], json!([{"CIDR": "fd00:10:128::/48", "hostSubnetLength": 64}]));
    assert_eq!(cn["pluginName"], "redhat/openshift-ovs-networkpolicy");
    assert_eq!(cn["metadata"]["annotations"], Value::Null, "no IPv6 annotations");
    let hs: BTreeMap<String, Value> =
        fake.objects("hostsubnets").into_iter().map(|h| (h["metadata"]["name"].as_str().unwrap().to_string(), h)).collect();
    assert_eq!(hs.keys().cloned().collect::<Vec<_>>(), ["both", "v6-a", "v6-b"]);
    let want = [("v6-a", "fd00:1::1", "fd00:10:128:5::/64"), ("v6-b", "fd00:1::2", "fd00:10:128:6::/64"), ("both", "192.168.10.3", "fd00:10:128:7::/64")];
    for (name, ip, subnet) in want {
        let h = &hs[name];
        assert_eq!((h["host"].as_str(), h["hostIP"].as_str(), h["subnet"].as_str()), (Some(name), Some(ip), Some(subnet)), "{h}");
        assert!(h["metadata"]["annotations"].get("sdn-node.openshift.io/subnet-ipv6").is_none(), "{h}");
    }
    let outside = poll("the Event", || Some(events(&fake, "PodCIDROutsideClusterNetwork")).filter(|e| !e.is_empty())).await;
    assert!(outside[0].contains("podCIDR fd00:99::/64 is not inside the cluster network fd00:10:128::/48"), "{outside:?}");
    // One write per object: the ClusterNetwork, three HostSubnets, one NetNamespace.
    assert_eq!(writes(&fake), 5);
    c.ready_again("IPv6-only").await;
}

const V6_ONLY: [&str; 6] =
    ["--cluster-network", "fd00:10:128::/48", "--service-network", "fd00:172:30::/112", "--host-subnet-length", ""];

/// IPv6-only without podCIDRs: the allocator cuts the IPv6 cluster network into /64s, a
/// restart reads them back from the HostSubnets' `subnet` and writes nothing, and a freed
/// subnet is reused only after its HostSubnet is gone.
#[tokio::test]
async fn ipv6_only_allocation_is_stable_across_restarts() {
    let fake = FakeKube::start().await;
    for (i, n) in ["node-a", "node-b"].iter().enumerate() {
        fake.put("nodes", node(n, None, &format!("fd00:1::{}", i + 1)));
    }
    fake.put("namespaces", namespace("default"));
    let dir = tempfile::tempdir().unwrap();
    let mut c = Controller::spawn(&fake, dir.path(), "c1", &V6_ONLY);
    c.settled("IPv6-only allocation").await;
    let subnets = |f: &FakeKube| host_subnets(f).into_iter().map(|(n, (_, ip, s))| (n, (ip, s))).collect::<BTreeMap<_, _>>();
    let want = |p: &[(&str, &str, &str)]| p.iter().map(|(n, ip, s)| (n.to_string(), (ip.to_string(), s.to_string()))).collect::<BTreeMap<_, _>>();
    assert_eq!(subnets(&fake), want(&[("node-a", "fd00:1::1", "fd00:10:128::/64"), ("node-b", "fd00:1::2", "fd00:10:128:1::/64")]));
    c.kill9();
    c.wait_exit().await;
    let before = writes(&fake);
    let c = Controller::spawn(&fake, dir.path(), "c2", &V6_ONLY);
    c.settled("restarted").await;
    assert_eq!(writes(&fake), before, "a restart changes nothing");
    fake.put("nodes", node("node-c", None, "fd00:1::3"));
    poll("node-c allocated", || subnets(&fake).get("node-c").cloned()).await;
    assert_eq!(subnets(&fake)["node-c"].1, "fd00:10:128:2::/64");
    fake.delete("nodes", "", "node-a");
    poll("node-a's HostSubnet deleted", || (!subnets(&fake).contains_key("node-a")).then_some(())).await;
    fake.put("nodes", node("node-d", None, "fd00:1::4"));
    poll("node-d allocated", || subnets(&fake).get("node-d").cloned()).await;
    assert_eq!(subnets(&fake)["node-d"].1, "fd00:10:128::/64");
    c.settled("node-d").await;
    let s = c.status().await.unwrap();
    assert_eq!((s["subnets_used"].as_u64(), s["subnets_total"].as_u64()), (Some(3), Some(1 << 16)));
    c.ready_again("IPv6-only allocator").await;
}

/// `sdn-node controller ARGS`: its exit code and stderr.
fn controller_exit(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node")).arg("controller").args(args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).trim().to_string())
}

#[tokio::test]
async fn bad_flags_exit_with_one_line() {
    let base = ["--kubeconfig", "/nonexistent", "--cluster-network", "10.128.0.0/14", "--host-subnet-length", "9"];
    let (code, err) = controller_exit(&base);
    assert_eq!(code, Some(1));
    assert_eq!(err, "sdn-node controller: --service-network (or serviceNetwork in --config) is required");
    let (code, err) = controller_exit(&[&base[..], &["--service-network", "172.30.0.0/16"]].concat());
    assert_eq!(code, Some(1));
    assert!(err.starts_with("sdn-node controller: --kubeconfig /nonexistent:") && err.lines().count() == 1, "{err}");
    // A bad IPv6 value: one line, before the API server is tried.
    let v6 = ["--service-network", "172.30.0.0/16", "--cluster-network-ipv6", "fd00:10:128::/48", "--service-network-ipv6", "nope"];
    let (code, err) = controller_exit(&[&base[..], &v6].concat());
    assert_eq!(code, Some(1));
    assert_eq!(err, "sdn-node controller: --service-network-ipv6 \"nope\" is not an IPv6 CIDR (e.g. fd00:10:128::/48)");
    // IPv6-only: the families must agree, and the dual-stack flags do not go with it.
    let (code, err) = controller_exit(&["--kubeconfig", "/nonexistent", "--cluster-network", "fd00:10:128::/48", "--service-network", "172.30.0.0/16"]);
    assert_eq!(code, Some(1));
    assert!(err.starts_with("sdn-node controller: --cluster-network fd00:10:128::/48 and --service-network 172.30.0.0/16 must be of the same family") && err.lines().count() == 1, "{err}");
    let v6 = ["--kubeconfig", "/nonexistent", "--cluster-network", "fd00:10:128::/48", "--service-network", "fd00:172:30::/112"];
    let (code, err) = controller_exit(&[&v6[..], &["--cluster-network-ipv6", "fd00:20::/48", "--service-network-ipv6", "fd00:30::/112"]].concat());
    assert_eq!(code, Some(1));
    assert!(err.starts_with("sdn-node controller: --cluster-network-ipv6, --service-network-ipv6 given with an IPv6 --cluster-network") && err.lines().count() == 1, "{err}");
    // Valid (the host subnet length defaulted): it goes on to the kubeconfig.
    let (code, err) = controller_exit(&v6);
    assert_eq!(code, Some(1));
    assert!(err.starts_with("sdn-node controller: --kubeconfig /nonexistent:"), "{err}");
}

#[tokio::test]
async fn a_leader_that_cannot_renew_stops_writing_before_its_lease_runs_out() {
    let fake = FakeKube::start().await;
    kubeadm(&fake);
    let dir = tempfile::tempdir().unwrap();
    // A lease of 6 s and a renew deadline of 2 s: the leader must stop writing 4 s before any
    // other replica could take the Lease.
    let c = Controller::spawn(
        &fake,
        dir.path(),
        "replica-a",
        &["--host-subnet-length", "8", "--leader-elect-lease-duration", "6"],
    );
    c.settled("leading").await;
    fake.fail_next("PUT", "leases", 8, 500);
    c.wait("stopped leading", |s| s["leading"] == false).await;
    let lease = fake.object("leases", "sdn-node", "sdn-node-controller").unwrap();
    let renewed: jiff::Timestamp = lease["spec"]["renewTime"].as_str().unwrap().parse().unwrap();
    let since = jiff::Timestamp::now().duration_since(renewed);
    assert!(
        since < jiff::SignedDuration::from_secs(6),
        "stopped {since:?} after the last renewal: before the Lease ran out"
    );
    assert_eq!(c.get("/readyz").await.0, 200, "a replica that stopped leading is still a ready standby");
    // While it cannot renew, it writes nothing.
    let before = writes(&fake);
    fake.put("nodes", node("worker-3", Some("10.128.3.0/24"), "192.168.10.13"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if c.status().await.unwrap()["leading"] == false {
        assert_eq!(writes(&fake), before, "no write without the Lease");
    }
    // The API server answers again: it renews its own Lease and catches up.
    poll("worker-3's HostSubnet once leading again", || host_subnets(&fake).get("worker-3").cloned()).await;
    c.settled("leading again").await;
    assert_eq!(
        fake.object("leases", "sdn-node", "sdn-node-controller").unwrap()["spec"]["holderIdentity"],
        "replica-a"
    );
    c.ready_again("after the Lease outage").await;
}
