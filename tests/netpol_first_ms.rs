//! Pods are never unprotected (issue 23 item 5): a CNI ADD answers only once the pod's
//! NetworkPolicy isolation is on the switch, in the same bundle as its own flows — so a packet
//! sent the instant ADD returns never reaches a pod a policy isolates. And realization is
//! visible: every policy change is timed from its source event to the switch's
//! acknowledgement (`sdn_node_policy_realization_seconds`, per policy in `sdn-node status`).
//!
//! Real processes: a netdev ovs-vswitchd in the node's own network namespace, `sdn-node run`
//! there, pods through libcni and `sdn-node-cni`. The client pod's probe socket and each new
//! pod's capture exist before the ADD (see `support::probe`), so the probe leaves within
//! microseconds of the ADD's return. The datapath's flow cache is not purged: what a real pod
//! meets is what is tested. Asserts no timings; the latencies are printed.
//!
//! Egress (table 27) is the same check the other way (`Direction::Egress`): the new pod sends
//! the instant its ADD returns, the client captures, and nothing from an isolated pod arrives.

mod support;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use support::cninode::*;
use support::probe::{sides, Direction, Endpoint};

/// Namespace `isolated` has a default-deny policy for ingress and egress; `open` and `client`
/// have none.
const STATE: &str = r#"
node: node-a
plugin: networkpolicy
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
mtu: 1450
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/23}
netNamespaces:
  - {name: isolated, netid: 11}
  - {name: open, netid: 12}
  - {name: client, netid: 13}
networkPolicies:
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: deny-all, namespace: isolated}, spec: {podSelector: {}, policyTypes: [Ingress, Egress]}}
"#;

/// The metrics listener, on the node namespace's loopback.
const METRICS: &str = "127.0.0.1:9101";
/// New pods per run: every other one isolated.
const PODS: u32 = 20;

#[tokio::test]
async fn a_probe_the_instant_add_returns_never_reaches_an_isolated_pod() {
    if !can_run() {
        return;
    }
    first_packets(&["--metrics-addr", METRICS], Direction::Ingress).await;
}

/// The same on warm ports: the flows are committed while the kernel moves the interface into
/// the sandbox, and ADD must still wait for them.
#[tokio::test]
async fn the_same_on_warm_ports() {
    if !can_run() {
        return;
    }
    first_packets(&["--metrics-addr", METRICS, "--warm-ports", "4", "--warm-ports-always"], Direction::Ingress).await;
}

/// Egress: a new pod's first packet, sent the instant its ADD returns, never leaves a pod a
/// default-deny-egress policy isolates.
#[tokio::test]
async fn a_pods_first_packet_never_leaves_when_egress_is_denied() {
    if !can_run() {
        return;
    }
    first_packets(&["--metrics-addr", METRICS], Direction::Egress).await;
}

/// `PODS` ADDs alternating between namespace `isolated` (selected by deny-all) and `open`
/// (selected by nothing, the positive control: the same probe must see it); each new pod is
/// probed in direction `dir` the instant its ADD returns. Then the policy's realization is
/// checked in status and /metrics, and the policy is changed a few times to time it.
async fn first_packets(args: &[&str], dir: Direction) {
    let node = CniNode::start_with(STATE, args).await;
    let client_ns = PodNs::new("client");
    let r = node.cni("add", "client", "c1", &container(1), &client_ns.path());
    assert!(r.ok(), "client ADD: {:?}\n{}", r.out, node.log());
    let client_ip: Ipv4Addr = r.addr().parse().expect("client address");
    let mut client = Endpoint::open(&client_ns.path()).await;

    let (mut isolated, mut open, mut gaps, mut keep) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..PODS {
        let (pod_ns_name, selected) = if i % 2 == 0 { ("isolated", true) } else { ("open", false) };
        let ns = PodNs::new(&format!("p{i}"));
        let mut pod = Endpoint::open(&ns.path()).await;
        let r = node.cni("add", pod_ns_name, &format!("p{i}"), &container(100 + i), &ns.path());
        let returned = Instant::now();
        assert!(r.ok(), "ADD p{i}: {:?}\n{}", r.out, node.log());
        let ip: Ipv4Addr = r.addr().parse().expect("pod address");
        let (from, to) = match dir {
            Direction::Ingress => (client_ip, ip),
            Direction::Egress => (ip, client_ip),
        };
        let (sender, receiver) = sides(dir, &mut pod, &mut client);
        gaps.push(sender.send(to, i).duration_since(returned));
        let name = format!("{pod_ns_name}/p{i}");
        if selected {
            isolated.push((name, from, i, pod));
        } else {
            // The positive control: this probe, sent the same way, gets there.
            assert!(
                receiver.wait_for(from, i, WAIT).await,
                "the probe never reached unselected pod {name} ({ip})\n{}",
                node.log()
            );
            open.push((from, to, pod));
        }
        keep.push(ns);
    }
    // Ordering, not waiting: every open pod now receives a probe that left after all the
    // isolated pods' probes, over the same path through the switch; then none of those may
    // have arrived.
    for (k, (from, to, pod)) in open.iter_mut().enumerate() {
        let marker = 1000 + k as u32;
        let (sender, receiver) = sides(dir, pod, &mut client);
        sender.send(*to, marker);
        assert!(receiver.wait_for(*from, marker, WAIT).await, "the closing probe to {to} never arrived");
    }
    for (name, from, marker, pod) in &mut isolated {
        let receiver = match dir {
            Direction::Ingress => pod,
            Direction::Egress => &mut client,
        };
        assert!(
            !receiver.got(*from, *marker),
            "probe {marker} reached isolated pod {name} right after its ADD\n{}",
            node.log()
        );
    }
    gaps.sort();
    eprintln!(
        "{} probes ({:?}): probe sent after ADD returned: min {:?}, median {:?}, max {:?}; none reached the {} isolated pods",
        gaps.len(),
        dir,
        gaps[0],
        gaps[gaps.len() / 2],
        gaps[gaps.len() - 1],
        isolated.len()
    );
    realization(&node).await;
    node.ready_again("after the first-packet probes and the policy change").await;
}

/// The policy is realized in status at its generation; changing it (the state file) is timed
/// per generation into the histogram.
async fn realization(node: &CniNode) {
    let st = sdn_node::api::status::fetch(&node.agent.socket).await.expect("status");
    let p = st
        .policies
        .iter()
        .find(|p| p.namespace == "isolated" && p.name == "deny-all")
        .unwrap_or_else(|| panic!("deny-all in status: {st}"));
    assert_eq!((p.seen_generation, p.realized_generation), (1, Some(1)), "{st}");
    assert!(st.to_string().contains("isolated/deny-all  1 / 1,"), "sdn-node status prints it:\n{st}");
    let count = |m: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix("sdn_node_policy_realization_seconds_count "))
            .and_then(|v| v.trim().parse().ok())
            .expect("the histogram in /metrics")
    };
    let before = count(&node.metrics(METRICS).await);
    assert!(before >= 1, "generation 1 was timed");
    // Alternate between two versions of the policy: each write is a new generation.
    let allow =
        STATE.replace("policyTypes: [Ingress, Egress]}", "policyTypes: [Ingress, Egress], ingress: [{from: [{podSelector: {}}]}]}");
    assert_ne!(allow, STATE, "the second version differs");
    let mut latencies = Vec::new();
    for generation in 2..=7 {
        std::fs::write(&node.agent.state, if generation % 2 == 0 { &allow } else { STATE }).expect("write the state");
        let end = Instant::now() + WAIT;
        let p = loop {
            let st = sdn_node::api::status::fetch(&node.agent.socket).await.expect("status");
            let p = st.policies.into_iter().find(|p| p.name == "deny-all").expect("deny-all");
            if p.realized_generation == Some(generation) || Instant::now() > end {
                break p;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!((p.seen_generation, p.realized_generation), (generation, Some(generation)), "{}", node.log());
        latencies.push(Duration::from_secs_f64(p.last_latency_seconds.expect("a latency")));
    }
    assert_eq!(count(&node.metrics(METRICS).await), before + 6, "one observation per generation");
    latencies.sort();
    eprintln!(
        "policy realization, state file change to switch ack, {} generations: min {:?}, median {:?}, max {:?} (includes the source's 50 ms debounce)",
        latencies.len(),
        latencies[0],
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
}

