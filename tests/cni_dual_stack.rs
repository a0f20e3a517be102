//! Dual-stack pods through CNI (issue 36): libcni calling the real `sdn-node-cni`, served by
//! `sdn-node run` on a node whose HostSubnet has an IPv4 and an IPv6 subnet (the state of
//! deploy/examples/dual-stack.yaml: node-a, 10.128.2.0/23 and fd00:10:128:2::/64). Each ADD
//! gets one address of each family, both in the CNI result and in the sandbox (the IPv6 one
//! past duplicate address detection); IPv6 addresses are never handed out twice, across DELs
//! and agent restarts (IPAM's IPv6 cursor in the checkpoint), and an `ipam.json` from before
//! dual-stack still loads; a real DAD failure fails the ADD and leaves nothing; DEL leaves
//! nothing; pods ping each other and their gateway over IPv6.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use support::agent::vsctl;
use support::cninode::*;

/// deploy/examples/dual-stack.yaml with its pods replaced by three internal-port pods at
/// ::5-::7 (so CNI's IPv6 addresses must skip them).
fn dual_stack() -> String {
    let example = include_str!("../deploy/examples/dual-stack.yaml");
    let mut t = example[..example.find("\npods:\n").expect("the example has pods") + 1].to_string();
    t.push_str("pods:\n");
    for (name, ns, i) in [("a1", "team-a", 5), ("a2", "team-a", 6), ("b1", "team-b", 7)] {
        t.push_str(&format!(
            "  - {{namespace: {ns}, name: {name}, containerID: {i}123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef, hostVeth: veth-{name}, internal: true, ip: 10.128.2.{i}, ips: [10.128.2.{i}, \"fd00:10:128:2::{i}\"], mac: \"0a:58:0a:80:02:0{i}\"}}\n"
        ));
    }
    t
}
const SUBNET6: &str = "fd00:10:128:2:";
const GATEWAY6: &str = "fd00:10:128:2::1";

/// The result's addresses (CNI 1.0.0, as libcni converted it), in order.
fn ips(r: &CniRun) -> Vec<Value> {
    r.out["result100"]["ips"].as_array().cloned().unwrap_or_default()
}

/// The IPv6 address (without prefix) of an ADD's result.
fn addr6(r: &CniRun) -> String {
    ips(r)
        .iter()
        .filter_map(|i| i["address"].as_str())
        .find(|a| a.contains(':'))
        .and_then(|a| a.split('/').next())
        .unwrap_or_default()
        .to_string()
}

/// The sandbox's IPv6 addresses on eth0 (`ip -6 -o addr`), one line each.
fn sandbox_addrs6(p: &PodNs) -> String {
    in_ns(&p.name, &["ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"]).1
}

fn ipam_json(n: &CniNode) -> Value {
    serde_json::from_str(&std::fs::read_to_string(n.agent.state_dir.join("ipam.json")).unwrap()).unwrap()
}

/// An HTTP request to the agent's pod API socket: (status, body).
fn api(n: &CniNode, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(&n.agent.socket).expect("connect to the pod API socket");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: sdn-node\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        .expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

#[derive(Debug, PartialEq)]
struct Leftovers {
    veths: Vec<String>,
    ports: Vec<String>,
    flows: Vec<String>,
    pods: Vec<String>,
}

fn snapshot(n: &CniNode) -> Leftovers {
    Leftovers { veths: n.veths(), ports: n.ports(), flows: n.flows(), pods: n.agent.checkpointed().into_keys().collect() }
}

/// Polls (bounded: 30 s) until the node is as `before` again.
async fn back_to(node: &CniNode, before: &Leftovers, what: &str) {
    for _ in 0..300 {
        if snapshot(node) == *before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: {:?} vs {before:?}\n{}", snapshot(node), node.log());
}

#[tokio::test]
async fn a_dual_stack_add_gives_both_families_and_del_leaves_nothing() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(&dual_stack()).await;
    let before = snapshot(&node);
    let p = PodNs::new("d1");
    let r = node.cni("add", "team-a", "d1", &container(1), &p.path());
    assert!(r.ok(), "ADD: {:?}\n{}", r.out, node.log());
    // The CNI result: both addresses on the pod's interface, each with its gateway; the
    // routes of both families.
    let ips = ips(&r);
    assert_eq!(ips.len(), 2, "{:?}", r.out);
    let v4 = ips[0]["address"].as_str().unwrap().to_string();
    assert!(v4.starts_with("10.128.2.") && v4.ends_with("/23"), "{v4}");
    assert_eq!((ips[0]["gateway"].as_str(), ips[0]["interface"].as_i64()), (Some("10.128.2.1"), Some(1)));
    let v6 = ips[1]["address"].as_str().unwrap().to_string();
    assert!(v6.starts_with(SUBNET6) && v6.ends_with("/64"), "{v6}");
    assert_eq!((ips[1]["gateway"].as_str(), ips[1]["interface"].as_i64()), (Some(GATEWAY6), Some(1)));
    let routes = r.out["result100"]["routes"].as_array().cloned().unwrap_or_default();
    for want in [
        json!({"dst": "0.0.0.0/0", "gw": "10.128.2.1"}),
        json!({"dst": "10.128.0.0/14"}),
        json!({"dst": "::/0", "gw": GATEWAY6}),
        json!({"dst": "fd00:10:128::/48"}),
        json!({"dst": "ff00::/8"}),
    ] {
        assert!(routes.contains(&want), "route {want} in {routes:?}");
    }
    // The MAC is the IPv4 rule's (0a:58 + the IPv4 address), dual-stack or not.
    let o: Vec<u8> = v4.split('/').next().unwrap().split('.').map(|x| x.parse().unwrap()).collect();
    let mac = r.out["result100"]["interfaces"][1]["mac"].as_str().unwrap_or_default().to_string();
    assert_eq!(mac, format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]));
    // The sandbox: both addresses, the IPv6 one usable (DAD over: neither tentative nor
    // failed), and both default routes.
    let a6 = sandbox_addrs6(&p);
    assert!(a6.contains(&v6), "{a6}");
    assert!(!a6.contains("tentative") && !a6.contains("dadfailed"), "DAD is over when ADD answers: {a6}");
    let a4 = in_ns(&p.name, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).1;
    assert!(a4.contains(&v4), "{a4}");
    let d4 = in_ns(&p.name, &["ip", "-4", "route", "show", "default"]).1;
    assert!(d4.contains("via 10.128.2.1 dev eth0"), "{d4}");
    let d6 = in_ns(&p.name, &["ip", "-6", "route", "show", "default"]).1;
    assert!(d6.contains(&format!("via {GATEWAY6} dev eth0")), "{d6}");
    // The record (checkpoint) has both families.
    let rec = node.agent.checkpointed().into_values().next().expect("the pod's record");
    let ip6 = v6.split('/').next().unwrap();
    assert_eq!(rec["ip6"], ip6, "{rec}");
    assert_eq!(rec["cni"]["ipv6"], json!({"address": v6, "gateway": GATEWAY6}), "{rec}");
    assert_eq!(ipam_json(&node)["state"]["lastAddress6"], ip6);
    // CHECK checks both families.
    let c = node.cni("check", "team-a", "d1", &container(1), &p.path());
    assert!(c.ok(), "CHECK: {:?}", c.out);
    in_ns(&p.name, &["ip", "-6", "addr", "del", &v6, "dev", "eth0"]);
    let c = node.cni("check", "team-a", "d1", &container(1), &p.path());
    assert!(!c.ok() && c.out.to_string().contains(&v6), "CHECK sees the IPv6 address gone: {:?}", c.out);
    // DEL removes everything.
    let d = node.cni("del", "team-a", "d1", &container(1), &p.path());
    assert!(d.ok(), "DEL: {:?}", d.out);
    back_to(&node, &before, "after DEL").await;
    assert!(in_ns(&p.name, &["ip", "link", "show", "eth0"]).1.is_empty(), "the pod's interface is gone");
}

/// IPv6 IPAM hands no address out twice: not after a DEL, not across a restart (the cursor in
/// ipam.json), and an ipam.json from before dual-stack (no IPv6 cursor) still loads, IPAM then
/// resuming after the highest IPv6 address still held. A pod set up through the pod API with
/// its own IPv6 address (`ips`) keeps it: CNI never hands it out.
#[tokio::test]
async fn ipv6_addresses_are_never_handed_out_twice() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start(&dual_stack()).await;
    // An API pod holding the first candidate (::2).
    let api_pod = json!({
        "containerID": "ab".repeat(32), "namespace": "team-a", "name": "api1", "hostVeth": "veth-api1",
        "ip": "10.128.2.100", "ips": ["10.128.2.100", "fd00:10:128:2::2"], "mac": "0a:58:0a:80:02:64", "internal": true
    });
    let (code, body) = api(&node, "POST", "/v1/pods", Some(&api_pod));
    assert_eq!(code, 200, "{body}\n{}", node.log());
    let (_, listed) = api(&node, "GET", "/v1/pods", None);
    assert!(listed.contains(r#""ip6":"fd00:10:128:2::2""#), "{listed}");
    // The same IPv6 address again is a conflict, named by field.
    let mut dup = api_pod.clone();
    dup["name"] = json!("api2");
    dup["containerID"] = json!("cd".repeat(32));
    dup["hostVeth"] = json!("veth-api2");
    dup["ip"] = json!("10.128.2.101");
    dup["ips"] = json!(["10.128.2.101", "fd00:10:128:2::2"]);
    dup["mac"] = json!("0a:58:0a:80:02:65");
    let (code, body) = api(&node, "POST", "/v1/pods", Some(&dup));
    assert!(code == 409 && body.contains("fd00:10:128:2::2"), "{code} {body}");

    let sandboxes: Vec<PodNs> = (0..10).map(|i| PodNs::new(&format!("s{i}"))).collect();
    let mut seen: Vec<String> = vec!["fd00:10:128:2::2".into()];
    let add = |node: &CniNode, i: usize, seen: &mut Vec<String>| -> String {
        let r = node.cni("add", "team-a", &format!("p{i}"), &container(i as u32 + 1), &sandboxes[i].path());
        assert!(r.ok(), "ADD p{i}: {:?}\n{}", r.out, node.log());
        let a = addr6(&r);
        assert!(a.starts_with(SUBNET6), "p{i}: {a}");
        assert!(!seen.contains(&a), "p{i} got {a} again: {seen:?}");
        seen.push(a.clone());
        a
    };
    let del = |node: &CniNode, i: usize| {
        let r = node.cni("del", "team-a", &format!("p{i}"), &container(i as u32 + 1), &sandboxes[i].path());
        assert!(r.ok(), "DEL p{i}: {:?}", r.out);
    };
    // ::2 is the API pod's, ::5-::7 the state file's pods'.
    let first: Vec<String> = (0..4).map(|i| add(&node, i, &mut seen)).collect();
    assert_eq!(first, ["fd00:10:128:2::3", "fd00:10:128:2::4", "fd00:10:128:2::8", "fd00:10:128:2::9"]);
    // Released addresses are not handed out next.
    del(&node, 3);
    del(&node, 0);
    assert_eq!(add(&node, 4, &mut seen), "fd00:10:128:2::a");
    // Across a restart: the checkpoint's IPv6 cursor (::a), not the highest address held.
    del(&node, 4);
    assert_eq!(ipam_json(&node)["state"]["lastAddress6"], "fd00:10:128:2::a");
    node.kill_agent().await;
    node.spawn_agent().await;
    assert_eq!(add(&node, 5, &mut seen), "fd00:10:128:2::b");
    // An ipam.json from before dual-stack: IPv4's position alone.
    node.kill_agent().await;
    let v4 = ipam_json(&node)["state"]["lastAddress"].clone();
    let state = json!({ "lastAddress": v4 }).to_string();
    let digest: String =
        ring::digest::digest(&ring::digest::SHA256, state.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(node.agent.state_dir.join("ipam.json"), format!("{{\"version\":1,\"sha256\":\"{digest}\",\"state\":{state}}}\n")).unwrap();
    assert_eq!(node.agent.checkpointed().len(), 4, "api1, p1, p2 and p5: {:?}", node.agent.checkpointed().keys());
    node.spawn_agent().await;
    // Resumes after the highest IPv6 address still held (p5's ::b).
    assert_eq!(add(&node, 6, &mut seen), "fd00:10:128:2::c");
    assert_eq!(ipam_json(&node)["state"]["lastAddress6"], "fd00:10:128:2::c", "the IPv6 cursor is written again");
    // Many more: still never twice.
    for i in 7..10 {
        add(&node, i, &mut seen);
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "{seen:?}");
    for i in [1, 2, 5, 6, 7, 8, 9] {
        del(&node, i);
    }
    let (code, body) = api(&node, "DELETE", "/v1/pods/team-a/api1", None);
    assert_eq!(code, 200, "{body}");
}

/// Spares (warm ports) whose host end answers for `addr`, as another station on the pod's link
/// holding that address would: the pod end's duplicate address detection fails for real.
fn hold_on_spares(node: &CniNode, addr: &str) -> Vec<String> {
    let spares: Vec<String> =
        vsctl(&node.sb, &["--no-wait", "--bare", "--columns=name", "find", "Port", "external_ids:sdn-node-spare=true"])
            .split_whitespace()
            .map(str::to_string)
            .collect();
    for s in &spares {
        let (ok, _) = in_ns(&node.ns, &["ip", "-6", "addr", "add", &format!("{addr}/64"), "dev", s, "nodad"]);
        assert!(ok, "address {addr} on spare {s}");
    }
    spares
}

/// A duplicate of the pod's IPv6 address on its link (here the host end of the warm port the
/// ADD takes, which the kernel of a userspace-datapath node hears): DAD fails, the ADD fails
/// naming the address, and nothing of it remains; the next ADD gets another address.
#[tokio::test]
async fn a_dad_failure_fails_the_add_and_leaves_nothing() {
    if !can_run() {
        return;
    }
    let node = CniNode::start_with(&dual_stack(), &["--warm-ports", "1", "--warm-ports-always"]).await;
    let mut spares = Vec::new();
    for _ in 0..300 {
        spares = hold_on_spares(&node, "fd00:10:128:2::2");
        if !spares.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(spares.len(), 1, "one warm port:\n{}", node.log());
    let p = PodNs::new("dad");
    let r = node.cni("add", "team-a", "dad", &container(1), &p.path());
    assert!(!r.ok(), "ADD with a duplicate on the link: {:?}", r.out);
    let msg = r.out.to_string();
    assert!(msg.contains("duplicate address detection failed for fd00:10:128:2::2"), "{msg}\n{}", node.log());
    // Nothing of it remains: no pod record, no interface in the sandbox, and the spare it
    // took is gone with its port (a spare is the ADD's once claimed; the kernel may finish
    // deleting the pair just after the answer).
    assert!(node.agent.checkpointed().is_empty(), "{:?}", node.agent.checkpointed());
    let gone = || {
        in_ns(&p.name, &["ip", "link", "show", "eth0"]).1.is_empty()
            && !node.veths().contains(&spares[0])
            && !node.ports().contains(&spares[0])
    };
    for _ in 0..300 {
        if gone() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone(), "{:?} {:?} {}", node.veths(), node.ports(), in_ns(&p.name, &["ip", "link"]).1);
    let (_, listed) = api(&node, "GET", "/v1/pods", None);
    assert_eq!(listed.trim(), "[]");
    // The retry gets the next address (the cursor moved past the one someone else holds).
    let r = node.cni("add", "team-a", "dad", &container(1), &p.path());
    assert!(r.ok(), "retried ADD: {:?}\n{}", r.out, node.log());
    assert_eq!(addr6(&r), "fd00:10:128:2::3");
    assert!(!sandbox_addrs6(&p).contains("dadfailed"));
}

/// Pod to pod over IPv6 through OVS, pods made through libcni.
#[tokio::test]
async fn ping6_between_dual_stack_pods() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(&dual_stack()).await;
    let (a, b, c) = (PodNs::new("a"), PodNs::new("b"), PodNs::new("c"));
    let ra = node.cni("add", "team-a", "pa", &container(1), &a.path());
    let rb = node.cni("add", "team-a", "pb", &container(2), &b.path());
    let rc = node.cni("add", "team-b", "pc", &container(3), &c.path());
    assert!(ra.ok() && rb.ok() && rc.ok(), "{:?} {:?} {:?}\n{}", ra.out, rb.out, rc.out, node.log());
    let ping6 = |from: &PodNs, to: &str| in_ns(&from.name, &["ping", "-6", "-c", "1", "-W", "2", to]).0;
    assert!(ping6(&a, &addr6(&rb)), "team-a to team-a over IPv6\n{}", node.log());
    assert!(ping6(&b, &addr6(&ra)), "and back");
    assert!(!ping6(&a, &addr6(&rc)), "multitenant: team-a does not reach team-b over IPv6 either");
    assert!(ping6(&a, GATEWAY6), "the IPv6 gateway (tun0)");
}
