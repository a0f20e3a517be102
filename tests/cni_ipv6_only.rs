//! IPv6-only pods through CNI: libcni calling the real `sdn-node-cni`, served by `sdn-node run`
//! on a node whose HostSubnet has one IPv6 subnet and nothing IPv4 (the state of
//! deploy/examples/ipv6-only.yaml: node-a, fd00:10:128:2::/64). Each ADD gets one IPv6
//! address, alone in the CNI result and in the sandbox (past duplicate address detection),
//! with the MAC of the IPv6-only rule (`0a:58:` + the address's last four bytes); the record
//! and checkpoint keep it, a restart never hands it out again; CHECK and DEL work; pods ping
//! each other and their gateway, isolated by VNID; the agent is ready again after each.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::cninode::*;

/// deploy/examples/ipv6-only.yaml with its pod replaced by an internal-port pod at ::5 (so
/// CNI's addresses must skip it).
fn ipv6_only() -> String {
    let example = include_str!("../deploy/examples/ipv6-only.yaml");
    let mut t = example[..example.find("\npods:\n").expect("the example has pods") + 1].to_string();
    t.push_str("pods:\n");
    t.push_str("  - {namespace: team-a, name: a1, containerID: 5123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef, hostVeth: veth-a1, internal: true, ip: \"fd00:10:128:2::5\", mac: \"0a:58:00:00:00:05\"}\n");
    t
}
const SUBNET6: &str = "fd00:10:128:2:";
const GATEWAY6: &str = "fd00:10:128:2::1";

/// The result's addresses (CNI 1.0.0, as libcni converted it), in order.
fn ips(r: &CniRun) -> Vec<Value> {
    r.out["result100"]["ips"].as_array().cloned().unwrap_or_default()
}

/// The (only) address of an ADD's result, without its prefix.
fn addr(r: &CniRun) -> String {
    ips(r).first().and_then(|i| i["address"].as_str()).and_then(|a| a.split('/').next()).unwrap_or_default().to_string()
}

/// Polls (bounded: 30 s) until `f` holds.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..300 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 30 s");
}

#[tokio::test]
async fn an_ipv6_only_add_gives_one_ipv6_address_and_del_leaves_nothing() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(&ipv6_only()).await;
    let (veths, ports) = (node.veths(), node.ports());
    let p = PodNs::new("v6");
    let r = node.cni("add", "team-a", "v6", &container(1), &p.path());
    assert!(r.ok(), "ADD: {:?}\n{}", r.out, node.log());
    // The result: one IPv6 address with its gateway, IPv6 routes only.
    let ips = ips(&r);
    assert_eq!(ips.len(), 1, "{:?}", r.out);
    let v6 = ips[0]["address"].as_str().unwrap().to_string();
    assert!(v6.starts_with(SUBNET6) && v6.ends_with("/64"), "{v6}");
    assert_eq!(v6, "fd00:10:128:2::2/64", "the first free address (::5 is the state's pod)");
    assert_eq!((ips[0]["gateway"].as_str(), ips[0]["interface"].as_i64()), (Some(GATEWAY6), Some(1)));
    let routes = r.out["result100"]["routes"].as_array().cloned().unwrap_or_default();
    for want in [json!({"dst": "::/0", "gw": GATEWAY6}), json!({"dst": "fd00:10:128::/48"}), json!({"dst": "ff00::/8"})] {
        assert!(routes.contains(&want), "route {want} in {routes:?}");
    }
    assert!(!r.out.to_string().contains("0.0.0.0/0"), "no IPv4 route: {:?}", r.out);
    // The MAC: 0a:58 + the IPv6 address's last four bytes.
    let mac = r.out["result100"]["interfaces"][1]["mac"].as_str().unwrap_or_default().to_string();
    assert_eq!(mac, "0a:58:00:00:00:02");
    // The sandbox: the IPv6 address, usable (DAD over), no IPv4 address or route.
    let a6 = in_ns(&p.name, &["ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"]).1;
    assert!(a6.contains(&v6) && !a6.contains("tentative") && !a6.contains("dadfailed"), "{a6}");
    assert!(!in_ns(&p.name, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).1.contains("inet "), "no IPv4 address");
    assert!(in_ns(&p.name, &["ip", "-4", "route"]).1.trim().is_empty(), "no IPv4 route");
    let d6 = in_ns(&p.name, &["ip", "-6", "route", "show", "default"]).1;
    assert!(d6.contains(&format!("via {GATEWAY6} dev eth0")), "{d6}");
    // The record (checkpoint): its one address is `ip`, its CNI part IPv6.
    let rec = node.agent.checkpointed().into_values().next().expect("the pod's record");
    assert_eq!(rec["ip"], "fd00:10:128:2::2", "{rec}");
    assert!(rec.get("ip6").is_none(), "{rec}");
    assert_eq!((rec["cni"]["address"].as_str(), rec["cni"]["gateway"].as_str()), (Some(v6.as_str()), Some(GATEWAY6)), "{rec}");
    let c = node.cni("check", "team-a", "v6", &container(1), &p.path());
    assert!(c.ok(), "CHECK: {:?}", c.out);
    node.ready_again("after ADD and CHECK").await;
    let d = node.cni("del", "team-a", "v6", &container(1), &p.path());
    assert!(d.ok(), "DEL: {:?}", d.out);
    eventually("DEL leaves nothing", || node.veths() == veths && node.ports() == ports && node.agent.checkpointed().is_empty()).await;
    node.ready_again("after DEL").await;
}

/// Addresses are not handed out twice, across a DEL and an agent restart (IPAM's IPv6 cursor
/// in the checkpoint); pods ping each other and the gateway, and VNIDs isolate them.
#[tokio::test]
async fn ipv6_only_pods_reach_each_other_by_vnid_and_keep_their_addresses() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start(&ipv6_only()).await;
    let (a, b, c) = (PodNs::new("a"), PodNs::new("b"), PodNs::new("c"));
    let ra = node.cni("add", "team-a", "pa", &container(1), &a.path());
    let rb = node.cni("add", "team-a", "pb", &container(2), &b.path());
    let rc = node.cni("add", "team-b", "pc", &container(3), &c.path());
    assert!(ra.ok() && rb.ok() && rc.ok(), "{:?} {:?} {:?}\n{}", ra.out, rb.out, rc.out, node.log());
    let got: Vec<String> = [&ra, &rb, &rc].iter().map(|r| addr(r)).collect();
    assert_eq!(got, ["fd00:10:128:2::2", "fd00:10:128:2::3", "fd00:10:128:2::4"]);
    let ping6 = |from: &PodNs, to: &str| in_ns(&from.name, &["ping", "-6", "-c", "1", "-W", "2", to]).0;
    assert!(ping6(&a, &addr(&rb)), "team-a to team-a\n{}", node.log());
    assert!(ping6(&b, &addr(&ra)), "and back");
    assert!(!ping6(&a, &addr(&rc)), "multitenant: team-a does not reach team-b");
    assert!(ping6(&a, GATEWAY6), "the gateway (tun0)");
    // A DEL, then a restart: the released address and the held ones are not handed out again.
    let d = node.cni("del", "team-a", "pb", &container(2), &b.path());
    assert!(d.ok(), "DEL: {:?}", d.out);
    // The kernel may finish deleting the pair just after DEL answers.
    eventually("pb's interface gone after DEL", || in_ns(&b.name, &["ip", "link", "show", "eth0"]).1.is_empty()).await;
    node.kill_agent().await;
    node.spawn_agent().await;
    node.ready_again("after the restart").await;
    let rb = node.cni("add", "team-a", "pb", &container(2), &b.path());
    assert!(rb.ok(), "ADD after the restart: {:?}\n{}", rb.out, node.log());
    assert_eq!(addr(&rb), "fd00:10:128:2::6", "after the cursor (::4), past the state's ::5");
    assert!(ping6(&b, &addr(&ra)), "the pods made before the restart still answer");
    for (r, ns, name, i, sb) in [(&ra, "team-a", "pa", 1, &a), (&rb, "team-a", "pb", 2, &b), (&rc, "team-b", "pc", 3, &c)] {
        let d = node.cni("del", ns, name, &container(i), &sb.path());
        assert!(d.ok(), "DEL {name} ({}): {:?}", addr(r), d.out);
    }
    eventually("every pod deleted", || node.agent.checkpointed().is_empty()).await;
    node.ready_again("after the DELs").await;
}
