//! The pod path's one undo path (issue 35): an ADD made to fail after each of its steps —
//! sandbox and reservation, veth (or a warm port moved and renamed), addresses, OVSDB port and
//! record, flows, checkpoint — leaves nothing behind: no interface in the sandbox or on the
//! host, no port, no flow, no record in the checkpoint; and the agent is ready again. The
//! failures are injected by the agent itself (`run --fail-pod-steps`, hidden), each used once,
//! so one agent fails a series of ADDs, each at a later step; the last ADD then succeeds.

mod support;

use std::time::Duration;

use support::agent::vsctl;
use support::cninode::*;

/// What a failed ADD could leave on the node.
#[derive(Debug, PartialEq)]
struct Shape {
    /// Host veths (the warm ports' names change as the pool refills: counted, not named).
    veths: usize,
    ports: usize,
    flows: Vec<String>,
    /// Host veths that are not a port on the bridge (a half-made pod interface).
    stray: Vec<String>,
}

fn shape(n: &CniNode) -> Shape {
    let (veths, ports) = (n.veths(), n.ports());
    Shape {
        stray: veths.iter().filter(|v| !ports.contains(v)).cloned().collect(),
        veths: veths.len(),
        ports: ports.len(),
        flows: n.flows(),
    }
}

/// Every file under the agent's state directory, concatenated (the checkpoint, whatever its
/// layout).
fn state_files(n: &CniNode) -> String {
    fn walk(dir: &std::path::Path, out: &mut String) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if let Ok(s) = std::fs::read_to_string(&p) {
                out.push_str(&s);
            }
        }
    }
    let mut s = String::new();
    walk(&n.agent.state_dir, &mut s);
    s
}

/// Polls (bounded) until the node has the shape it had `before` the ADD, with nothing of pod
/// `name` in its sandbox, in OVSDB or in the checkpoint; then the agent must say ready.
async fn nothing_left(n: &CniNode, before: &Shape, name: &str, sandbox: &PodNs, what: &str) {
    let mut last = String::new();
    for _ in 0..300 {
        let now = shape(n);
        let (_, links) = in_ns(&sandbox.name, &["ip", "-o", "link", "show"]);
        let in_sandbox: Vec<&str> = links.lines().filter(|l| !l.contains(": lo:")).collect();
        let records = vsctl(&n.sb, &["--no-wait", "--columns=external_ids", "list", "Port"]);
        let recorded = records.contains(&format!("\\\"name\\\":\\\"{name}\\\""));
        let checkpointed = state_files(n).contains(&format!("\"name\":\"{name}\""));
        if now == *before && in_sandbox.is_empty() && !recorded && !checkpointed {
            n.ready_again(what).await;
            return;
        }
        last = format!("{now:?} vs {before:?}; sandbox {in_sandbox:?}; in OVSDB {recorded}; in the checkpoint {checkpointed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: something is left: {last}\n{}", n.log());
}

/// Waits until the pool of warm ports is full again (with no pod, the host's veths are the
/// pool's, each a port on the bridge), so that every ADD starts from the same shape.
async fn settled(n: &CniNode, spares: usize) -> Shape {
    for _ in 0..300 {
        let s = shape(n);
        if s.veths == spares && s.stray.is_empty() {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the node did not settle with {spares} warm ports: {:?}\n{}", shape(n), n.log());
}

async fn every_step_undone(points: &[&str], extra: &[&str], warm: bool) {
    let steps = points.join(",");
    let mut args = vec!["--fail-pod-steps", &steps];
    args.extend(extra);
    let node = CniNode::start_with(MULTITENANT, &args).await;
    node.ready_again("started").await;
    let spares = if warm { 2 } else { 0 };
    let before = settled(&node, spares).await;
    for (i, point) in points.iter().enumerate() {
        let name = format!("u{i}");
        let sandbox = PodNs::new(&name);
        let r = node.cni("add", "team-a", &name, &container(300 + i as u32), &sandbox.path());
        assert!(!r.ok(), "the ADD failing after {point} failed: {:?}", r.out);
        let msg = r.out["msg"].as_str().unwrap_or_default().to_string() + r.out["details"].as_str().unwrap_or_default();
        assert!(msg.to_lowercase().contains(&format!("after step {point}")), "failed at {point}: {:?}\n{}", r.out, node.log());
        nothing_left(&node, &before, &name, &sandbox, &format!("after a failure at {point}")).await;
        settled(&node, spares).await;
    }
    // Every point used up: the next ADD succeeds and its pod reaches the gateway; its DEL
    // leaves the node as before.
    let sandbox = PodNs::new("ok");
    let r = node.cni("add", "team-a", "ok", &container(399), &sandbox.path());
    assert!(r.ok(), "an ADD after the failures: {:?}\n{}", r.out, node.log());
    assert!(ping(&sandbox.name, "10.128.0.1"), "the pod reaches its gateway");
    assert!(node.cni("del", "team-a", "ok", &container(399), &sandbox.path()).ok());
    settled(&node, spares).await;
    nothing_left(&node, &before, "ok", &sandbox, "after the last pod's DEL").await;
}

/// A new veth per ADD (no warm ports).
#[tokio::test]
async fn every_failure_point_of_a_fresh_add_leaves_nothing() {
    if !can_run() {
        return;
    }
    every_step_undone(&["netns", "veth", "addresses", "ovsdb", "flows", "checkpoint"], &[], false).await;
}

/// ADDs on warm ports: the pool's veth moved into the sandbox and renamed.
#[tokio::test]
async fn every_failure_point_of_a_warm_add_leaves_nothing() {
    if !can_run() {
        return;
    }
    every_step_undone(&["netns", "rename", "addresses", "ovsdb", "flows", "checkpoint"], &["--warm-ports", "2", "--warm-ports-always"], true)
        .await;
}
