//! One pod per sandbox, and interfaces deleted only by their owner (issue 21 items 3 and 4).
//! Each attack goes to a real agent (`sdn-node run` on a netdev switch in its own node
//! namespace) through its CNI socket, as a hostile or confused caller would send it; the
//! oracles (`ip`, `ovs-vsctl`, `ovs-ofctl`) then say that nothing of another pod changed.
//!
//! - A second ADD into a pod's sandbox (another container, pod, VNID, `CNI_IFNAME`), by its
//!   own path or another path to the same namespace, is refused with 409.
//! - A DEL is the DEL of the attachment its full container ID and interface name recorded: a
//!   DEL of a pod's container without `CNI_ARGS` tears that pod down whole (port, flows,
//!   address, veth — never its veth alone); one whose `CNI_ARGS` name another pod, or whose
//!   made-up container ID only shares the digits a host veth name keeps, touches nothing.
//! - An ADD whose host veth name is taken (by another pod, or by any interface) makes another
//!   name; and a torn-down pod's interface name that someone else's interface took since is
//!   left alone.

mod support;

use std::time::Duration;

use sdn_node::pod::cni::host_veth_name;
use serde_json::json;
use support::agent::vsctl_status;
use support::cninode::*;

/// What a pod is, as the oracles see it: its sandbox's links, addresses and routes, its host
/// veth (ifindex and peer), its OVS port and record, the flows naming its address.
#[derive(Debug, PartialEq, Eq)]
struct PodView {
    sandbox_links: String,
    sandbox_addrs: String,
    sandbox_routes: String,
    host_veth: String,
    port_record: String,
    flows: Vec<String>,
}

fn pod_view(node: &CniNode, sandbox: &PodNs, veth: &str, ip: &str) -> PodView {
    // Link lines without their counters and state flags that traffic may change.
    let links = in_ns(&sandbox.name, &["ip", "-o", "link", "show"]).1;
    let links: Vec<String> = links.lines().map(|l| l.split(" qdisc").next().unwrap_or(l).to_string()).collect();
    PodView {
        sandbox_links: links.join("\n"),
        // IPv4: the kernel's IPv6 link-local address changes state (DAD) by itself.
        sandbox_addrs: in_ns(&sandbox.name, &["ip", "-4", "-o", "addr", "show"]).1,
        sandbox_routes: in_ns(&sandbox.name, &["ip", "-4", "route", "show", "table", "all"]).1,
        host_veth: in_ns(&node.ns, &["ip", "-o", "link", "show", veth])
            .1
            .split(" qdisc")
            .next()
            .unwrap_or_default()
            .to_string(),
        port_record: {
            let (ok, out, err) =
                vsctl_status(&node.sb, &["--no-wait", "get", "Port", veth, "external_ids:sdn-node-pod"]);
            if ok {
                out
            } else {
                err
            }
        },
        flows: node
            .flows()
            .into_iter()
            .filter(|f| f.contains(&format!("={ip},")) || f.ends_with(&format!("={ip}")))
            .collect(),
    }
}

/// A pod added through libcni: its sandbox, address and host veth.
struct Added {
    ns: PodNs,
    ip: String,
    veth: String,
}

fn add(node: &CniNode, pod_ns: &str, name: &str, container: &str) -> Added {
    let ns = PodNs::new(name);
    let r = node.cni("add", pod_ns, name, container, &ns.path());
    assert!(r.ok(), "ADD {pod_ns}/{name}: {:?}\n{}", r.out, node.log());
    let veth = r.out["result100"]["interfaces"][0]["name"].as_str().unwrap_or_default().to_string();
    assert!(!veth.is_empty(), "the result names the host interface: {:?}", r.out);
    Added { ns, ip: r.addr(), veth }
}

fn view(node: &CniNode, p: &Added) -> PodView {
    pod_view(node, &p.ns, &p.veth, &p.ip)
}

/// Polls (bounded: 30 s) until `f` holds.
async fn eventually(what: &str, node: &CniNode, mut f: impl FnMut() -> bool) {
    for _ in 0..300 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never: {what}\n{}", node.log());
}

fn request(command: &str, container: &str, netns: &str, if_name: &str, pod: Option<(&str, &str)>) -> serde_json::Value {
    let mut b =
        json!({"command": command, "containerID": container, "netns": netns, "ifName": if_name, "cniVersion": "1.0.0"});
    if let Some((ns, name)) = pod {
        b["namespace"] = json!(ns);
        b["name"] = json!(name);
    }
    b
}

fn ifindex(node: &CniNode, name: &str) -> Option<String> {
    let (ok, out) = in_ns(&node.ns, &["ip", "-o", "link", "show", name]);
    ok.then(|| out.split(':').next().unwrap_or_default().to_string())
}

/// A process inside a sandbox: `/proc/PID/ns/net` is another path to the same namespace.
/// Killed on drop.
struct InSandbox(std::process::Child);

impl InSandbox {
    fn start(ns: &PodNs) -> InSandbox {
        // `ip netns exec` execs the command in place: the pid is sleep's.
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.name, "sleep", "120"])
            .spawn()
            .expect("sleep in the sandbox");
        let p = InSandbox(child);
        for _ in 0..100 {
            if std::fs::read_link(format!("/proc/{}/exe", p.0.id())).is_ok_and(|e| e.ends_with("sleep")) {
                return p;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("sleep never started in {}", ns.name);
    }
    fn netns(&self) -> String {
        format!("/proc/{}/ns/net", self.0.id())
    }
}

impl Drop for InSandbox {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_second_pod_in_a_sandbox_is_refused() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let a1 = add(&node, "team-a", "a1", &container(1));
    let before = view(&node, &a1);
    let (veths, ports, flows) = (node.veths(), node.ports(), node.flows());
    let checkpoint = node.agent.checkpointed();
    // Another pod of another VNID into a1's sandbox, as a second interface: by the same path,
    // and by another path to the same namespace.
    let inside = InSandbox::start(&a1.ns);
    for netns in [a1.ns.path(), inside.netns()] {
        for if_name in ["eth1", "eth0"] {
            let (code, body) = node.cni_post(&request("ADD", &container(2), &netns, if_name, Some(("team-b", "x1"))));
            assert_eq!(code, 409, "{netns} {if_name}: {body}\n{}", node.log());
            assert!(body.contains("one pod per sandbox") && body.contains("team-a/a1"), "{body}");
        }
    }
    // Nothing of a1 changed (a second identity, its routes), nor anything else.
    assert_eq!(view(&node, &a1), before, "a1 is as it was");
    assert_eq!((node.veths(), node.ports(), node.flows()), (veths, ports, flows), "nothing was added to the node");
    assert_eq!(node.agent.checkpointed(), checkpoint, "nor recorded");
    assert!(ping(&a1.ns.name, "10.128.0.1"), "a1 still reaches its gateway");
    // In a sandbox of its own, the same pod is fine.
    let x1 = add(&node, "team-b", "x1", &container(2));
    assert!(!ping(&x1.ns.name, &a1.ip), "and is isolated from a1 (another VNID)");
    assert_eq!(view(&node, &a1), before);
    node.ready_again("after the refused second pod").await;
}

#[tokio::test]
async fn a_del_touches_only_what_its_container_made() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let a1 = add(&node, "team-a", "a1", &container(1));
    let a2 = add(&node, "team-a", "a2", &container(2));
    let b1 = add(&node, "team-b", "b1", &container(3));
    let (a1_before, b1_before) = (view(&node, &a1), view(&node, &b1));
    let unchanged = |what: &str| {
        assert_eq!(view(&node, &a1), a1_before, "{what}: a1 changed\n{}", node.log());
        assert_eq!(view(&node, &b1), b1_before, "{what}: b1 changed\n{}", node.log());
    };

    // (b) A made-up container whose ID keeps the 11 digits b1's host veth name has, naming
    // b1, another pod, or no pod, in b1's sandbox or another: nothing of b1 goes.
    let made_up = format!("{}{}", &container(3)[..11], "f".repeat(53));
    assert_eq!(host_veth_name(&made_up), b1.veth, "the made-up ID gives b1's interface name");
    for (pod, netns) in [
        (Some(("team-b", "b1")), b1.ns.path()),
        (Some(("team-b", "ghost")), b1.ns.path()),
        (None, b1.ns.path()),
        (None, a1.ns.path()),
        (None, "/var/run/netns/no-such-sandbox".to_string()),
    ] {
        let (code, body) = node.cni_post(&request("DEL", &made_up, &netns, "eth0", pod));
        assert_eq!(code, 200, "a DEL of an unknown container succeeds (idempotent): {body}");
        unchanged(&format!("DEL of a made-up container as {pod:?} in {netns}"));
    }
    // A DEL of a2's container whose CNI_ARGS name another pod, or whose interface is another:
    // not a2's attachment, nothing goes.
    let a2_before = view(&node, &a2);
    for (pod, if_name) in [(Some(("team-b", "b1")), "eth0"), (Some(("team-a", "a1")), "eth0"), (None, "eth1")] {
        let (code, body) = node.cni_post(&request("DEL", &container(2), &a2.ns.path(), if_name, pod));
        assert_eq!(code, 200, "{body}");
        assert_eq!(view(&node, &a2), a2_before, "a2 is untouched by a DEL as {pod:?}/{if_name}");
        unchanged("a DEL naming another pod");
    }

    // (a) A DEL of a2's container without CNI_ARGS: a2's whole attachment goes — never its
    // veth alone while its port, flows and address stay.
    let (code, body) = node.cni_post(&request("DEL", &container(2), &a2.ns.path(), "eth0", None));
    assert_eq!(code, 200, "{body}");
    eventually("a2's veth, port and flows are gone together", &node, || {
        !node.veths().contains(&a2.veth)
            && !node.ports().contains(&a2.veth)
            && pod_view(&node, &a2.ns, &a2.veth, &a2.ip).flows.is_empty()
    })
    .await;
    let listed = node.agent.checkpointed();
    assert!(listed.values().all(|p| p["ip"] != a2.ip.as_str()), "a2's address is released: {listed:?}");
    unchanged("a DEL of a2's container without CNI_ARGS");

    // (c) An ADD of the made-up container (another pod, its own sandbox): b1's interface
    // name is taken, so it gets another one, and b1 keeps its own.
    let b2 = add(&node, "team-b", "b2", &made_up);
    assert_ne!(b2.veth, b1.veth, "another host interface name");
    assert!(ping(&b2.ns.name, &b1.ip), "b2 works (and reaches b1, same VNID)");
    unchanged("an ADD whose derived name is b1's");
    // And its DEL deletes b2's interface, not b1's.
    let r = node.cni("del", "team-b", "b2", &made_up, &b2.ns.path());
    assert!(r.ok(), "{:?}", r.out);
    eventually("b2's interface is gone", &node, || !node.veths().contains(&b2.veth)).await;
    unchanged("b2's DEL");
    assert!(ping(&a1.ns.name, "10.128.0.1") && ping(&b1.ns.name, "10.128.0.1"));
    node.ready_again("after the DELs").await;
}

#[tokio::test]
async fn interfaces_that_took_a_pods_name_are_left_alone() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    // Someone's interface already has the name container 7's host veth would get.
    let taken = host_veth_name(&container(7));
    assert!(in_ns(&node.ns, &["ip", "link", "add", &taken, "type", "veth", "peer", "name", "theirs7"]).0);
    let index = ifindex(&node, &taken);
    let c7 = add(&node, "team-a", "c7", &container(7));
    assert_ne!(c7.veth, taken, "the ADD made another name");
    assert_eq!(ifindex(&node, &taken), index, "and left the interface that had it");
    assert!(ping(&c7.ns.name, "10.128.0.1"), "c7 works");
    let r = node.cni("del", "team-a", "c7", &container(7), &c7.ns.path());
    assert!(r.ok(), "{:?}", r.out);
    eventually("c7's interface is gone", &node, || !node.veths().contains(&c7.veth)).await;
    assert_eq!(ifindex(&node, &taken), index, "c7's DEL left it too");

    // A pod's interface deleted by someone, and the name taken by another interface since:
    // the pod's teardown (its sandbox gone: the GC; then a late DEL) leaves that interface.
    let t1 = add(&node, "team-a", "t1", &container(8));
    assert!(in_ns(&node.ns, &["ip", "link", "del", &t1.veth]).0);
    assert!(in_ns(&node.ns, &["ip", "link", "add", &t1.veth, "type", "veth", "peer", "name", "theirs8"]).0);
    let index = ifindex(&node, &t1.veth);
    let Added { ns, veth, .. } = t1;
    let path = ns.path();
    drop(ns);
    eventually("t1 is collected (its port goes)", &node, || !node.ports().contains(&veth)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ifindex(&node, &veth), index, "the teardown left the interface that took t1's name\n{}", node.log());
    let (code, body) = node.cni_post(&request("DEL", &container(8), &path, "eth0", Some(("team-a", "t1"))));
    assert_eq!(code, 200, "{body}");
    assert_eq!(ifindex(&node, &veth), index, "so did a late DEL");
    assert!(node.log().contains("left alone"), "the agent says so:\n{}", node.log());
    node.ready_again("after leaving the foreign interface alone").await;
}
