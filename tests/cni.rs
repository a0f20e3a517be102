//! CNI end to end (issue 12): pods created through libcni — the library container runtimes
//! use — calling the real `sdn-node-cni`, served by `sdn-node run` inside a node network
//! namespace on a netdev switch; real packets between the pods, to the gateway and out through
//! the node's masquerade; and after every path, success or failure, nothing left behind.

mod support;

use std::time::Duration;

use support::agent::{signal_pid, vsctl};
use support::cninode::*;


/// Everything a pod could leave behind on a node.
#[derive(Debug, PartialEq)]
struct Leftovers {
    veths: Vec<String>,
    ports: Vec<String>,
    flows: Vec<String>,
    nft: String,
    qos: String,
}

fn snapshot(n: &CniNode) -> Leftovers {
    Leftovers {
        veths: n.veths(),
        ports: n.ports(),
        flows: n.flows(),
        nft: n.nft(),
        qos: vsctl(&n.sb, &["--no-wait", "--columns=_uuid", "list", "QoS"]),
    }
}

/// Polls (bounded: 30 s) until the node is as `before` again; panics with the difference and
/// the agent's log.
async fn back_to(node: &CniNode, before: &Leftovers, what: &str) {
    for _ in 0..300 {
        if snapshot(node) == *before {
            // And the agent says so: ready again (issue 32).
            node.ready_again(what).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: {:?} vs {before:?}\n{}", snapshot(node), node.log());
}

fn mac_of(r: &CniRun) -> String {
    r.out["result100"]["interfaces"][1]["mac"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn pods_through_libcni_reach_by_vnid_and_leave_nothing() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let before = snapshot(&node);
    assert!(before.nft.contains("masquerade"), "the node's nftables table is installed:\n{}", before.nft);
    let pods = [("team-a", "a1"), ("team-a", "a2"), ("team-b", "b1"), ("default", "d1")];
    let mut ns = Vec::new();
    let mut addr = std::collections::BTreeMap::new();
    for (i, (pod_ns, name)) in pods.iter().enumerate() {
        let p = PodNs::new(name);
        let r = node.cni("add", pod_ns, name, &container(i as u32 + 1), &p.path());
        assert!(r.ok(), "ADD {pod_ns}/{name}: {:?}\n{}", r.out, node.log());
        let ip = r.addr();
        assert!(ip.starts_with("10.128.0.") || ip.starts_with("10.128.1."), "{ip}");
        assert!(r.ip().ends_with("/23"), "{}", r.ip());
        let o: Vec<u8> = ip.split('.').map(|x| x.parse().unwrap()).collect();
        assert_eq!(mac_of(&r), format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]));
        assert!(addr.insert(*name, ip).is_none());
        ns.push(p);
    }
    let ips: std::collections::BTreeSet<_> = addr.values().collect();
    assert_eq!(ips.len(), 4, "no address twice: {addr:?}");
    let r = node.cni("check", "team-a", "a1", &container(1), &ns[0].path());
    assert!(r.ok(), "CHECK: {:?}", r.out);
    // DEL answers before the kernel has finished deleting the veth; an ADD of the same
    // container into the same sandbox right after it still works. (Straight to the agent's
    // socket, microseconds apart. The kernel unlists a deleted interface's name at once, so
    // the window the agent's name lock closes is tiny: this checks the behaviour, it could not
    // catch that lock missing.)
    for _ in 0..3 {
        assert_eq!(node.cni_raw("DEL", "team-a", "a1", &container(1), &ns[0].path()), 200, "DEL");
        assert_eq!(node.cni_raw("ADD", "team-a", "a1", &container(1), &ns[0].path()), 200, "ADD right after DEL\n{}", node.log());
        let r = node.cni("add", "team-a", "a1", &container(1), &ns[0].path());
        assert!(r.ok(), "a repeated ADD answers what the first did: {:?}", r.out);
        addr.insert("a1", r.addr());
    }
    // MTU and routes as the agent configured them.
    let (_, link) = in_ns(&ns[0].name, &["ip", "-o", "link", "show", "eth0"]);
    assert!(link.contains("mtu 1450"), "{link}");
    let (_, routes) = in_ns(&ns[0].name, &["ip", "route"]);
    for want in ["default via 10.128.0.1", "10.128.0.0/14", "224.0.0.0/4"] {
        assert!(routes.contains(want), "missing route {want}:\n{routes}");
    }
    // Real packets.
    assert!(ping(&ns[0].name, &addr["a2"]), "same VNID reaches");
    assert!(!ping(&ns[0].name, &addr["b1"]), "another VNID does not");
    assert!(!ping(&ns[2].name, &addr["a1"]), "nor the other way");
    assert!(ping(&ns[3].name, &addr["b1"]), "VNID 0 reaches every VNID");
    assert!(ping(&ns[2].name, &addr["d1"]), "and is reached from every VNID");
    assert!(ping(&ns[0].name, "10.128.0.1"), "the gateway (tun0) is reached");
    // `sdn-node trace` agrees with the packets, naming the owner that decides.
    for (to, reached) in [("team-a/a2", true), ("team-b/b1", false), ("default/d1", true)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
            .args(["trace", "--from", "team-a/a1", "--to", to, "--ovs-rundir"])
            .arg(node.sb.dir())
            .arg("--state")
            .arg(&node.agent.state)
            .arg("--socket")
            .arg(&node.agent.socket)
            .output()
            .expect("sdn-node trace");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "trace to {to}: {text}{}", String::from_utf8_lossy(&out.stderr));
        let verdict = text.lines().find(|l| l.starts_with("verdict:")).unwrap_or_default();
        if reached {
            assert!(verdict.contains("DELIVERED") && verdict.contains(to), "{to}: {text}");
        } else {
            assert!(verdict.contains("DROPPED in table 80 by base"), "{to}: {text}");
        }
        assert_eq!(ping(&ns[0].name, &addr[to.split('/').nth(1).unwrap()]), reached, "ping agrees with the trace to {to}");
    }
    // DEL twice (idempotent), then nothing is left.
    for (i, (pod_ns, name)) in pods.iter().enumerate() {
        for _ in 0..2 {
            let r = node.cni("del", pod_ns, name, &container(i as u32 + 1), &ns[i].path());
            assert!(r.ok(), "DEL {pod_ns}/{name}: {:?}", r.out);
        }
    }
    // (The veths go right after each DEL's answer, in the background.)
    back_to(&node, &before, "nothing of the pods is left").await;
}

/// Pod → a host outside the cluster: works only through the node's masquerade (the outside
/// host has no route back to the pod network).
#[tokio::test]
async fn traffic_leaving_the_cluster_is_masqueraded() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let ext = PodNs::new("ext");
    let (a, b) = (format!("vx{}", std::process::id() % 100000), format!("vy{}", std::process::id() % 100000));
    assert!(sh(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]).status.success());
    assert!(sh(&["ip", "link", "set", &a, "netns", &node.ns]).status.success());
    assert!(sh(&["ip", "link", "set", &b, "netns", &ext.name]).status.success());
    in_ns(&node.ns, &["ip", "addr", "add", "203.0.113.1/24", "dev", &a]);
    in_ns(&node.ns, &["ip", "link", "set", &a, "up"]);
    in_ns(&ext.name, &["ip", "addr", "add", "203.0.113.2/24", "dev", &b]);
    in_ns(&ext.name, &["ip", "link", "set", &b, "up"]);
    let p = PodNs::new("out");
    let r = node.cni("add", "team-a", "out", &container(9), &p.path());
    assert!(r.ok(), "{:?}\n{}", r.out, node.log());
    assert!(ping(&p.name, "203.0.113.2"), "the outside host answers the node's address\n{}", node.nft());
    let (_, rules) = in_ns(&node.ns, &["nft", "list", "ruleset"]);
    assert!(rules.contains("masquerade"), "{rules}");
    // Without our table (removed by hand) the outside host cannot answer: the masquerade did it.
    let table = rules.lines().find(|l| l.starts_with("table ip ")).unwrap_or_default().trim_end_matches(" {").to_string();
    let parts: Vec<&str> = table.split_whitespace().collect();
    assert!(in_ns(&node.ns, &["nft", "delete", "table", "ip", parts[2]]).0, "{table}");
    assert!(!ping(&p.name, "203.0.113.2"), "no reply without the masquerade");
    assert!(node.cni("del", "team-a", "out", &container(9), &p.path()).ok());
    // The agent puts back the masquerade table deleted above, and is ready.
    node.ready_again("after the masquerade table was deleted and the pod removed").await;
}

/// 50 pods: half added, the agent killed and restarted, the other half added (no address handed
/// out twice), then all deleted: nothing left that was not there before.
#[tokio::test]
async fn churn_across_an_agent_restart_leaves_nothing() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start(MULTITENANT).await;
    let before = snapshot(&node);
    let mut pods = Vec::new();
    let mut ips = std::collections::BTreeSet::new();
    for i in 0..50u32 {
        if i == 25 {
            node.kill_agent().await;
            node.spawn_agent().await;
        }
        let p = PodNs::new(&format!("c{i}"));
        let ns = if i % 2 == 0 { "team-a" } else { "team-b" };
        let r = node.cni("add", ns, &format!("c{i}"), &container(100 + i), &p.path());
        assert!(r.ok(), "ADD c{i}: {:?}\n{}", r.out, node.log());
        assert!(ips.insert(r.addr()), "address {} handed out twice", r.addr());
        pods.push((ns, i, p));
    }
    // A restart between ADD and DEL: DEL still cleans up.
    node.kill_agent().await;
    node.spawn_agent().await;
    for (ns, i, p) in &pods {
        let r = node.cni("del", ns, &format!("c{i}"), &container(100 + i), &p.path());
        assert!(r.ok(), "DEL c{i}: {:?}", r.out);
    }
    back_to(&node, &before, "nothing of 50 pods is left").await;
}

/// Every failure path of an ADD undoes everything it did.
#[tokio::test]
async fn failed_adds_leave_nothing() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let before = snapshot(&node);
    // Before the veth: the namespace has no NetNamespace (no VNID).
    let p = PodNs::new("f1");
    let r = node.cni("add", "nowhere", "f1", &container(201), &p.path());
    assert!(!r.ok(), "{:?}", r.out);
    assert_eq!(r.out["code"], 7, "invalid network configuration: {:?}", r.out);
    assert!(r.out["msg"].as_str().unwrap_or_default().contains("namespace"), "{:?}", r.out);
    assert_eq!(snapshot(&node), before);
    // The interface name is taken in the sandbox.
    assert!(in_ns(&p.name, &["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]).0);
    let r = node.cni("add", "team-a", "f1", &container(202), &p.path());
    assert!(!r.ok(), "{:?}", r.out);
    assert_eq!(snapshot(&node), before, "after an interface conflict");
    // After the veth, at the port: ovsdb-server frozen.
    let p2 = PodNs::new("f2");
    {
        let pid = node.sb.ovsdb_pid().unwrap();
        signal_pid(pid, libc::SIGSTOP);
        let r = node.cni("add", "team-a", "f2", &container(203), &p2.path());
        signal_pid(pid, libc::SIGCONT);
        assert!(!r.ok(), "{:?}", r.out);
        assert_eq!(r.out["code"], 11, "try again later: {:?}", r.out);
    }
    // The agent removes what the frozen server applied late.
    back_to(&node, &before, "after a frozen ovsdb-server").await;
    // At the commit: the switch refuses the flows (table full).
    vsctl(&node.sb, &["--", "--id=@ft", "create", "Flow_Table", "flow_limit=1", "overflow_policy=refuse", "--", "set", "Bridge", "br0", "flow_tables:20=@ft"]);
    let p3 = PodNs::new("f3");
    let r = node.cni("add", "team-a", "f3", &container(204), &p3.path());
    assert!(!r.ok(), "{:?}", r.out);
    vsctl(&node.sb, &["clear", "Bridge", "br0", "flow_tables"]);
    back_to(&node, &before, "after a refused commit").await;
    // And the same pod then comes up.
    let r = node.cni("add", "team-a", "f3", &container(204), &p3.path());
    assert!(r.ok(), "{:?}\n{}", r.out, node.log());
    node.ready_again("after the failed ADDs and the good one").await;
}

/// IPAM's GC pass: a pod whose sandbox disappears without a DEL (a crashed runtime) gets its
/// address, port, flows and veth back; the address can be handed out again.
#[tokio::test]
async fn a_sandbox_gone_without_del_is_collected() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let before = snapshot(&node);
    let p = PodNs::new("gc");
    let r = node.cni("add", "team-a", "gc", &container(301), &p.path());
    assert!(r.ok(), "{:?}", r.out);
    let ip = r.addr();
    drop(p); // `ip netns del`: the sandbox is gone, no DEL.
    back_to(&node, &before, "the dead sandbox's pod is collected").await;
    // The next pod gets another address (round robin: a released one is not reused at once).
    let q = PodNs::new("gc2");
    let r = node.cni("add", "team-a", "gc2", &container(302), &q.path());
    assert!(r.ok() && r.addr() != ip, "round robin: not reused at once");
    assert!(node.cni("del", "team-a", "gc2", &container(302), &q.path()).ok());
    node.ready_again("after the collected sandbox and the next pod").await;
}

/// A runtime that is not Kubernetes (issue 34 item 4), through libcni against the real agent:
/// CNI_ARGS as podman 4.3 sends them (`K8S_POD_NAME` the container's name, no namespace), or
/// none at all. The pod's namespace is the conflist's (`default` for the agent's own conflist),
/// its name the container's or its short ID; ADD, CHECK and DEL work, the pod has its
/// namespace's VNID, a sandbox gone without a DEL is collected, and nothing is left.
#[tokio::test]
async fn runtimes_without_kubernetes_args_get_pods() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let before = snapshot(&node);
    let team_b = node.agent.conf_dir.join("50-sdn-b.conflist");
    let socket = node.agent.socket.display().to_string();
    std::fs::write(
        &team_b,
        serde_json::json!({"cniVersion": "1.0.0", "name": "sdn-b",
            "plugins": [{"type": "sdn-node-cni", "agentSocket": socket, "namespace": "team-b"}]})
        .to_string(),
    )
    .unwrap();
    let own = node.agent.conflist();
    let (c1, c2, c3) = (container(401), container(402), container(403));
    let (p1, p2, p3) = (PodNs::new("rt1"), PodNs::new("rt2"), PodNs::new("rt3"));
    // podman's arguments on the agent's own conflist: default/web1.
    let named = "IgnoreUnknown=1;K8S_POD_NAME=web1";
    let r = node.agent.cni_with(&own, "add", named, &c1, &p1.path());
    assert!(r.ok(), "ADD: {:?}\n{}", r.out, node.log());
    let d_ip = r.addr();
    assert!(node.agent.cni_with(&own, "check", named, &c1, &p1.path()).ok(), "CHECK of default/web1");
    // No arguments at all, on team-b's network: team-b/<short ID>.
    let r = node.agent.cni_with(&team_b, "add", "", &c2, &p2.path());
    assert!(r.ok(), "ADD: {:?}\n{}", r.out, node.log());
    let b_ip = r.addr();
    assert!(node.agent.cni_with(&team_b, "check", "", &c2, &p2.path()).ok(), "CHECK of team-b/<short ID>");
    // A Kubernetes pod of team-a, for the VNIDs.
    let r = node.cni("add", "team-a", "a1", &c3, &p3.path());
    assert!(r.ok(), "{:?}", r.out);
    let a_ip = r.addr();
    let mut pods = Vec::new();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(["pod", "list", "-o", "json", "--socket"])
        .arg(&node.agent.socket)
        .output()
        .expect("sdn-node pod list");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("pod list -o json");
    for p in list.as_array().expect("a list") {
        pods.push(format!("{}/{}", p["namespace"].as_str().unwrap_or("?"), p["name"].as_str().unwrap_or("?")));
    }
    pods.sort();
    assert_eq!(pods, vec!["default/web1".to_string(), "team-a/a1".to_string(), format!("team-b/{}", &c2[..12])]);
    assert!(ping(&p1.name, &b_ip) && ping(&p1.name, &a_ip), "default (VNID 0) reaches both");
    assert!(!ping(&p2.name, &a_ip), "team-b does not reach team-a");
    assert!(ping(&p2.name, &d_ip), "team-b reaches default");
    // DEL as podman sends it (unnamed to the agent: found by container ID).
    assert!(node.agent.cni_with(&own, "del", named, &c1, &p1.path()).ok(), "DEL of default/web1");
    assert!(node.agent.cni_with(&own, "del", named, &c1, &p1.path()).ok(), "a repeated DEL");
    assert!(node.cni("del", "team-a", "a1", &c3, &p3.path()).ok());
    // team-b/<short ID>'s sandbox goes without a DEL: collected as any pod's.
    drop(p2);
    back_to(&node, &before, "the runtimes' pods are gone").await;
}
