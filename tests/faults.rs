//! Faults under the daemon (issue 11): a frozen ovsdb-server or ovs-vswitchd during pod setup
//! and teardown, a commit the switch refuses, concurrent requests with one bad one, and hostile
//! requests. Every test ends by asserting the exact switch and OVSDB state: nothing of a
//! refused request remains, and a retry succeeds.

mod support;

use std::time::Duration;

use sdn_node::run::RunOptions;
use support::agent::{signal_pid, try_list_ports, vsctl};
use support::inproc::*;
use support::*;

const STATE: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/18}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11, multicast: true}
  - {name: team-b, netid: 12}
"#;

/// Short deadlines, so a frozen peer is noticed within a few seconds.
fn fast(o: &mut RunOptions) {
    o.node.request_timeout = Duration::from_secs(3);
    o.peers.ovsdb_timeout = Duration::from_secs(1);
    o.peers.ovsdb_probe = Duration::from_millis(500);
    o.peers.echo_interval = Duration::from_millis(500);
    o.peers.echo_timeout = Duration::from_secs(1);
    o.peers.switch_request_timeout = Duration::from_secs(2);
    o.repair_interval = Duration::from_millis(300);
    o.peers.max_backoff = Duration::from_millis(300);
}

/// The request, bounded: the deadline plus a margin for the undo (never a measurement).
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

fn flows_with(r: &Running, needle: &str) -> Vec<String> {
    dump_sorted(&r.sb, &[]).into_iter().filter(|l| l.contains(needle)).collect()
}

fn has_port(r: &Running, name: &str) -> bool {
    try_list_ports(&r.sb).unwrap_or_default().iter().any(|p| p == name)
}

/// Polls `f` (bounded: 30 s) until it holds.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..300 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never: {what}");
}

/// Metrics, the pod list and /healthz keep answering while a peer is frozen; /readyz says no.
async fn still_answers_but_not_ready(r: &Running) {
    let (code, body) = http_get(&r.metrics, "/metrics").await;
    assert_eq!(code, 200);
    assert!(body.contains("sdn_node_pod_requests_total"), "{body}");
    let (code, _) = sdn_node::api::client::call(&r.socket, "GET", "/v1/pods", None).await.unwrap();
    assert_eq!(code, 200, "the pod list answers while a peer is frozen");
    assert_eq!(http_get(&r.metrics, "/healthz").await.0, 200, "the daemon itself is alive");
    let mut not_ready = false;
    for _ in 0..100 {
        if http_get(&r.metrics, "/readyz").await.0 == 503 {
            not_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(not_ready, "/readyz must go false while a peer is frozen");
}

fn unavailable_or_timeout(code: u16, body: &str, what: &str) {
    assert!(code == 503 || code == 504, "{what}: want 503/504, got {code} {body}");
}

/// Frozen `pid` (SIGSTOP) for the guard's lifetime; SIGCONT on drop, also on panic.
struct Frozen(i32);

impl Frozen {
    fn new(pid: i32) -> Frozen {
        signal_pid(pid, libc::SIGSTOP);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal_pid(self.0, libc::SIGCONT);
    }
}

async fn frozen_peer(ovsdb: bool) {
    let r = start_with(STATE, fast).await;
    let a = pod("a", "team-a", "10.128.0.10", 10);
    assert_eq!(add(&r.socket, &a).await.0, 200);
    let b = pod("b", "team-a", "10.128.0.11", 11);
    let pid = if ovsdb { r.sb.ovsdb_pid() } else { r.sb.vswitchd_pid() }.expect("daemon pid");
    let what = if ovsdb { "ovsdb-server" } else { "ovs-vswitchd" };
    {
        let _f = Frozen::new(pid);
        let (code, body) = tokio::time::timeout(ANSWER_WITHIN, add(&r.socket, &b)).await.expect("add answered");
        unavailable_or_timeout(code, &body, &format!("add with {what} frozen"));
        still_answers_but_not_ready(&r).await;
        let (code, body) = tokio::time::timeout(ANSWER_WITHIN, del(&r.socket, "team-a", "a")).await.expect("delete answered");
        unavailable_or_timeout(code, &body, &format!("delete with {what} frozen"));
    }
    ready_again(&r, &format!("{what} thawed")).await;
    // Nothing of the refused setup exists; the torn-down pod's flows are gone.
    eventually("the refused pod's port is removed", || !has_port(&r, "veth-b")).await;
    assert!(flows_with(&r, "10.128.0.11").is_empty(), "refused pod's flows: {:?}", flows_with(&r, "10.128.0.11"));
    assert!(flows_with(&r, "10.128.0.10").is_empty(), "deleted pod's flows remain: {:?}", flows_with(&r, "10.128.0.10"));
    // Retries succeed.
    let (code, body) = add(&r.socket, &b).await;
    assert_eq!(code, 200, "retried add: {body}");
    assert_eq!(flows_with(&r, "10.128.0.11").len(), 4);
    let (code, body) = del(&r.socket, "team-a", "a").await;
    assert!(code == 200 || code == 404, "retried delete: {code} {body}");
    eventually("the deleted pod's port is removed", || !has_port(&r, "veth-a")).await;
    let ports = try_list_ports(&r.sb).unwrap();
    assert_eq!(ports, vec!["tun0", "veth-b", "vxlan0"], "exactly the wanted ports");
    assert_eq!(qos(&r), 0, "no QoS rows left");
    ready_again(&r, &format!("after the retries ({what})")).await;
}

fn qos(r: &Running) -> usize {
    vsctl(&r.sb, &["--no-wait", "--columns=_uuid", "list", "QoS"]).lines().filter(|l| l.contains("_uuid")).count()
}

#[tokio::test]
async fn frozen_ovsdb_server_during_setup_and_teardown() {
    frozen_peer(true).await;
}

#[tokio::test]
async fn frozen_ovs_vswitchd_during_setup_and_teardown() {
    frozen_peer(false).await;
}

/// The switch refuses the setup's bundle (table full): 500, no port, no flow; after the limit
/// is lifted the same request succeeds.
#[tokio::test]
async fn refused_commit_during_setup_leaves_nothing() {
    let r = start_with(STATE, fast).await;
    let before = dump_sorted(&r.sb, &[]);
    let ports_before = try_list_ports(&r.sb).unwrap();
    vsctl(&r.sb, &["--", "--id=@ft", "create", "Flow_Table", "flow_limit=1", "overflow_policy=refuse", "--", "set", "Bridge", "br0", "flow_tables:20=@ft"]);
    let p = pod("c", "team-b", "10.128.0.12", 12);
    let (code, body) = add(&r.socket, &p).await;
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("TABLE_FULL"), "{body}");
    assert_eq!(dump_sorted(&r.sb, &[]), before, "nothing of the refused setup is on the switch");
    eventually("the refused pod's port is removed", || try_list_ports(&r.sb).unwrap() == ports_before).await;
    vsctl(&r.sb, &["clear", "Bridge", "br0", "flow_tables"]);
    let (code, body) = add(&r.socket, &p).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(flows_with(&r, "10.128.0.12").len(), 4);
    ready_again(&r, "after the refused commit and the retry").await;
}

/// 20 concurrent setups, one of them invalid: 19 succeed, one 4xx, no interference.
#[tokio::test]
async fn concurrent_setups_with_one_invalid() {
    let r = start(STATE).await;
    let mut reqs = Vec::new();
    for i in 0..20u8 {
        let mut p = pod(&format!("p{i}"), if i % 2 == 0 { "team-a" } else { "team-b" }, &format!("10.128.0.{}", 20 + i), 20 + i);
        if i == 7 {
            p.ip = "10.200.0.7".into(); // outside this node's subnet
        }
        reqs.push(p);
    }
    let socket = r.socket.clone();
    let results = futures::future::join_all(reqs.iter().map(|p| {
        let s = socket.clone();
        async move { add(&s, p).await }
    }))
    .await;
    for (i, (code, body)) in results.iter().enumerate() {
        if i == 7 {
            assert_eq!(*code, 400, "{body}");
            assert!(body.contains("\"field\":\"ip\""), "{body}");
        } else {
            assert_eq!(*code, 200, "p{i}: {body}");
        }
    }
    for i in 0..20u8 {
        let n = flows_with(&r, &format!("10.128.0.{},", 20 + i)).len() + flows_with(&r, &format!("10.128.0.{} ", 20 + i)).len();
        assert_eq!(n, if i == 7 { 0 } else { 4 }, "pod p{i}");
    }
    assert!(!has_port(&r, "veth-p7"));
    ready_again(&r, "after 20 concurrent setups").await;
}

/// Hostile requests: the agent's own ports and other pods' ports, names Kubernetes would
/// reject, oversized bodies. Each is a 4xx naming the field, and nothing changes.
#[tokio::test]
async fn hostile_requests_are_refused() {
    let r = start(STATE).await;
    let ok = pod("ok", "team-a", "10.128.0.30", 30);
    assert_eq!(add(&r.socket, &ok).await.0, 200);
    let before = dump_sorted(&r.sb, &[]);
    let ports = try_list_ports(&r.sb).unwrap();
    type Case = (&'static str, Box<dyn Fn(&mut sdn_node::api::PodRequest)>, u16, &'static str);
    let cases: Vec<Case> = vec![
        ("tun0", Box::new(|p| p.host_veth = "tun0".into()), 400, "hostVeth"),
        ("vxlan0", Box::new(|p| p.host_veth = "vxlan0".into()), 400, "hostVeth"),
        ("br0", Box::new(|p| p.host_veth = "br0".into()), 400, "hostVeth"),
        ("another pod's port", Box::new(|p| p.host_veth = "veth-ok".into()), 409, "hostVeth"),
        ("another pod's IP", Box::new(|p| p.ip = "10.128.0.30".into()), 409, "ip"),
        ("the gateway", Box::new(|p| p.ip = "10.128.0.1".into()), 400, "ip"),
        ("namespace not DNS-1123", Box::new(|p| p.namespace = "Team_A".into()), 400, "namespace"),
        ("name not DNS-1123", Box::new(|p| p.name = "x/../y".into()), 400, "name"),
        ("port name with a slash", Box::new(|p| p.host_veth = "a/b".into()), 400, "hostVeth"),
        ("port name too long", Box::new(|p| p.host_veth = "x".repeat(16)), 400, "hostVeth"),
    ];
    for (what, change, want, field) in cases {
        let mut p = pod("evil", "team-a", "10.128.0.31", 31);
        change(&mut p);
        let (code, body) = add(&r.socket, &p).await;
        assert_eq!(code, want, "{what}: {body}");
        assert!(body.contains(&format!("\"field\":\"{field}\"")), "{what}: {body}");
    }
    // A body over the cap.
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(sdn_node::api::MAX_BODY + 1));
    let (code, _) = post(&r.socket, &big).await;
    assert_eq!(code, 413);
    // Deleting the agent's own port through the API: not a pod.
    let (code, _) = del(&r.socket, "default", "tun0").await;
    assert_eq!(code, 404);
    assert_eq!(dump_sorted(&r.sb, &[]), before, "nothing changed");
    assert_eq!(try_list_ports(&r.sb).unwrap(), ports);
    ready_again(&r, "after the hostile requests").await;
}

/// An egress dnsName whose name server never answers does not delay pod setup: resolution
/// runs off the reconcile path. Proof by order of events, not by time: the name server has
/// received the query and not answered (no DNS failure counted yet) when the setup returns.
#[tokio::test]
async fn an_unanswered_dns_name_does_not_delay_pod_setup() {
    let ns = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = ns.local_addr().unwrap();
    ns.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let state = format!(
        "{STATE}egressNetworkPolicies:\n  - namespace: team-a\n    name: default\n    egress:\n      - {{type: Allow, to: {{dnsName: never.example.com}}}}\n      - {{type: Deny, to: {{cidrSelector: 0.0.0.0/0}}}}\n"
    );
    let r = start_with(&state, |o| {
        fast(o);
        o.dns_servers = vec![addr];
        o.dns_timeout = Duration::from_secs(120);
    })
    .await;
    let got = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 512];
        ns.recv_from(&mut buf).map(|(n, _)| n).map(|n| (n, ns))
    })
    .await
    .unwrap();
    let (n, _ns) = got.expect("the agent asked the name server");
    assert!(n > 12, "a DNS query");
    let (code, body) = add(&r.socket, &pod("dns", "team-a", "10.128.0.40", 40)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(flows_with(&r, "10.128.0.40").len(), 4);
    let (_, metrics) = http_get(&r.metrics, "/metrics").await;
    assert!(metrics.contains("sdn_node_dns_failures_total 0"), "the lookup is still outstanding:\n{metrics}");
    // Until the name resolves, team-a drops all egress (as for a failed lookup).
    let egress: Vec<String> = dump_sorted(&r.sb, &[]).into_iter().filter(|l| l.contains("table=100") && l.contains("reg0=0xb")).collect();
    assert!(!egress.is_empty() && egress.iter().all(|l| l.contains("actions=drop")), "{egress:#?}");
}
