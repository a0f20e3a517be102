//! Per-policy counters from flow statistics (issue 23 item 4), end to end: `sdn-node run`
//! on a netdev ovs-vswitchd in the node's namespace, pods through libcni, real TCP and UDP.
//!
//! - An allowed connection (ten exchanges) counts exactly one connection for the policy and
//!   direction that allowed it — ingress `isolated/web`, egress `client/out` rule 0 — and
//!   nothing for the others (`isolated/api`).
//! - A connection denied on ingress counts its one SYN as a drop of namespace `isolated`
//!   (ingress, pod `isolated/s1`); one denied on egress a drop of `client` (egress).
//! - Read through `/metrics` and `sdn-node status`, which agree.
//! - A policy change that re-creates the rule's flows (another match), and a drop flow
//!   re-created under the same key and cookie that counts past its old value before the next
//!   read, never make a counter go back or lose a packet.

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use support::cninode::*;
use support::nodes::in_netns;

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
  - {name: client, netid: 13}
networkPolicies:
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: web, namespace: isolated}, spec: {podSelector: {}, ingress: [{from: [{namespaceSelector: {}}], ports: [{port: 8080}]}]}}
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: api, namespace: isolated}, spec: {podSelector: {}, ingress: [{from: [{podSelector: {}}], ports: [{port: 9000}]}]}}
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: out, namespace: client}, spec: {podSelector: {}, policyTypes: [Egress], egress: [{ports: [{port: 8080, endPort: 8081}]}, {ports: [{port: 9000}]}]}}
"#;

const METRICS: &str = "127.0.0.1:9101";
/// Reads every second.
const INTERVAL: &str = "1";

/// A series' value (`None`: not exported).
fn value(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse::<f64>().ok()).map(|v| v as u64)
}

fn conns(ns: &str, policy: &str, dir: &str) -> String {
    format!("sdn_node_policy_connections_total{{namespace=\"{ns}\",policy=\"{policy}\",direction=\"{dir}\"}}")
}

fn drops(ns: &str, dir: &str) -> String {
    format!("sdn_node_policy_dropped_packets_total{{namespace=\"{ns}\",direction=\"{dir}\"}}")
}

/// Every series at its value, read through /metrics (waiting for the agent's reads and the
/// switch's statistics, bounded by [`WAIT`]), then still there two reads later: exact, not
/// at least.
async fn settle(node: &CniNode, want: &[(String, u64)]) -> String {
    let end = Instant::now() + WAIT;
    loop {
        let text = node.metrics(METRICS).await;
        let got: Vec<Option<u64>> = want.iter().map(|(s, _)| value(&text, s)).collect();
        if want.iter().zip(&got).all(|((_, v), g)| *g == Some(*v)) {
            break;
        }
        assert!(Instant::now() < end, "counters {want:?}, got {got:?}\n{text}\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let text = node.metrics(METRICS).await;
    for (s, v) in want {
        assert_eq!(value(&text, s), Some(*v), "{s} moved on\n{text}");
    }
    text
}

/// A TCP connection with ten echoed exchanges; panics if it fails.
async fn exchange(ns: &PodNs, to: Ipv4Addr, port: u16) {
    in_netns(&ns.name, move || -> std::io::Result<()> {
        let mut s = TcpStream::connect_timeout(&SocketAddr::from((to, port)), WAIT)?;
        for i in 0..10u8 {
            s.write_all(&[i; 16])?;
            let mut buf = [0u8; 16];
            s.read_exact(&mut buf)?;
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("allowed connection to {to}:{port}: {e}"));
}

/// One SYN (the connect gives up before the kernel's first retransmission at 1 s).
async fn denied(ns: &PodNs, to: Ipv4Addr, port: u16) {
    let r = in_netns(&ns.name, move || TcpStream::connect_timeout(&SocketAddr::from((to, port)), Duration::from_millis(300))).await;
    assert!(r.is_err(), "{to}:{port} is denied");
}

fn echo_server(listener: TcpListener) {
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

#[tokio::test]
async fn allowed_connections_and_drops_count_for_their_policy_and_never_go_back() {
    if !can_run() {
        return;
    }
    let node = CniNode::start_with(STATE, &["--metrics-addr", METRICS, "--policy-stats-interval", INTERVAL]).await;
    let (client_ns, server_ns) = (PodNs::new("client"), PodNs::new("server"));
    let r = node.cni("add", "client", "c1", &container(1), &client_ns.path());
    assert!(r.ok(), "client ADD: {:?}\n{}", r.out, node.log());
    let r = node.cni("add", "isolated", "s1", &container(2), &server_ns.path());
    assert!(r.ok(), "server ADD: {:?}\n{}", r.out, node.log());
    let server: Ipv4Addr = r.addr().parse().unwrap();
    for port in [8080, 8081] {
        echo_server(in_netns(&server_ns.name, move || TcpListener::bind(("0.0.0.0", port))).await.expect("listen"));
    }

    // Every known series exists at zero before anything moves.
    let zero = [
        (conns("isolated", "web", "ingress"), 0),
        (conns("isolated", "api", "ingress"), 0),
        (conns("client", "out", "egress"), 0),
        (drops("isolated", "ingress"), 0),
        (drops("client", "egress"), 0),
    ];
    settle(&node, &zero).await;

    exchange(&client_ns, server, 8080).await;
    // Egress allows 9000 (out, rule 1); isolated's ingress does not (api: own namespace only).
    denied(&client_ns, server, 9000).await;
    // Egress allows neither 9090 nor UDP: dropped in table 27, never reaching table 80.
    denied(&client_ns, server, 9090).await;
    let u = in_netns(&client_ns.name, || UdpSocket::bind("0.0.0.0:0")).await.unwrap();
    u.send_to(b"x", (server, 7000)).unwrap();
    let text = settle(
        &node,
        &[
            (conns("isolated", "web", "ingress"), 1),
            (conns("isolated", "api", "ingress"), 0),
            (conns("client", "out", "egress"), 2),
            (drops("isolated", "ingress"), 1),
            (drops("client", "egress"), 2),
        ],
    )
    .await;
    assert_eq!(value(&text, "sdn_node_policy_stats_reads_total{result=\"error\"}"), Some(0), "{text}");
    assert!(value(&text, "sdn_node_policy_dropped_bytes_total{namespace=\"isolated\",direction=\"ingress\"}").is_some_and(|b| b >= 40), "{text}");

    // The same through status, per rule and per pod.
    let st = sdn_node::api::status::fetch(&node.agent.socket).await.expect("status");
    let c = &st.policy_counters;
    assert!(c.last_read_unix_ms.is_some() && c.last_error.is_none(), "{st}");
    let allowed = |ns: &str, p: &str| c.allowed.iter().find(|a| a.namespace == ns && a.policy == p).unwrap_or_else(|| panic!("{ns}/{p} in {st}"));
    let out = allowed("client", "out");
    assert_eq!((out.direction.as_str(), out.connections), ("egress", 2), "{st}");
    assert_eq!(out.rules, [(0, 1), (1, 1)].into(), "{st}");
    assert_eq!(allowed("isolated", "web").rules, [(0, 1)].into(), "{st}");
    let dropped = c.dropped.iter().find(|d| d.namespace == "isolated").unwrap_or_else(|| panic!("{st}"));
    assert_eq!((dropped.direction.as_str(), dropped.packets), ("ingress", 1), "{st}");
    assert_eq!(dropped.pods.iter().map(|p| (p.pod.as_str(), p.packets)).collect::<Vec<_>>(), [("isolated/s1", 1)], "{st}");
    let text = st.to_string();
    assert!(text.contains("    isolated/web  ingress 1 (rule 0: 1)\n") && text.contains("      isolated/s1 ("), "sdn-node status prints them:\n{text}");

    // web's flows re-created with another match (8080 becomes 8080-8081): the count stays.
    let flows_before = node.flows();
    let changed = STATE.replace("ports: [{port: 8080}]}]}}", "ports: [{port: 8080, endPort: 8081}]}]}}");
    assert_ne!(changed, STATE);
    std::fs::write(&node.agent.state, &changed).expect("write the state");
    let end = Instant::now() + WAIT;
    while !node.flows().iter().any(|f| f.contains("tp_dst=0x1f90/0xfffe")) {
        assert!(Instant::now() < end, "the new port range never reached the switch\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(flows_before.iter().any(|f| f.contains("table=80") && f.contains("tp_dst=8080")), "web was a plain flow on 8080");
    // s1's drop flow re-created (deleted and added again, same key and cookie, as a restarted
    // switch or a replay would): its count starts from zero and, before the next read, passes
    // what the old one had. Only its age says it is another flow.
    let drop_line = || -> Option<String> {
        let out = support::ofctl(&node.sb, &["dump-flows", "br0", &format!("table=80,ip,nw_dst={server}")]);
        out.lines().find(|l| l.contains("priority=100,") && l.contains("actions=drop")).map(str::to_string)
    };
    let field = |l: &str, k: &str| -> String { l.split(&format!("{k}=")).nth(1).and_then(|v| v.split([',', ' ']).next()).unwrap_or("").to_string() };
    let old = drop_line().expect("s1's drop flow");
    assert_eq!(field(&old, "n_packets"), "1", "the switch counted one drop: {old}");
    let drop_flow = format!("table=80,priority=100,ip,nw_dst={server}");
    support::ofctl(&node.sb, &["--strict", "del-flows", "br0", &drop_flow]);
    support::ofctl(&node.sb, &["add-flow", "br0", &format!("cookie={},{drop_flow},actions=drop", field(&old, "cookie"))]);
    denied(&client_ns, server, 9000).await;
    denied(&client_ns, server, 9000).await;
    let end = Instant::now() + WAIT;
    loop {
        // The switch's own statistics lag its datapath by up to a second.
        let new = drop_line().expect("the drop flow is back");
        assert_eq!(field(&new, "cookie"), field(&old, "cookie"), "{old}\n{new}");
        if field(&new, "n_packets") == "2" {
            break;
        }
        assert!(Instant::now() < end, "two drops on the new flow: {new}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    exchange(&client_ns, server, 8081).await;
    settle(
        &node,
        &[
            (conns("isolated", "web", "ingress"), 2),
            (conns("isolated", "api", "ingress"), 0),
            (conns("client", "out", "egress"), 5),
            (drops("isolated", "ingress"), 3),
            (drops("client", "egress"), 2),
        ],
    )
    .await;
    node.ready_again("after the rule change and the re-created drop flow").await;
}

/// SIGCONTs the frozen process on drop (also on panic).
struct Thaw(i32);

impl Drop for Thaw {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// The agent's counters once `ok` holds (bounded by [`WAIT`]).
async fn wait(
    t: &sdn_node::metrics::Telemetry,
    what: &str,
    ok: impl Fn(&sdn_node::policy_stats::PolicyCounters) -> bool,
) -> sdn_node::policy_stats::PolicyCounters {
    let end = Instant::now() + WAIT;
    loop {
        let c = t.metrics.policy_counters.report();
        if ok(&c) {
            return c;
        }
        assert!(Instant::now() < end, "{what}: {c:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A frozen ovs-vswitchd (SIGSTOP) makes the reads fail at their deadline, which status shows
/// (answering at once meanwhile); thawed, the reads succeed again and the error is cleared.
#[tokio::test]
async fn a_frozen_switch_fails_reads_at_their_deadline_and_stalls_nothing() {
    let state = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/networkpolicy.yaml")).unwrap();
    let agent = support::inproc::start_with(&state, |o| o.policy_stats_interval = Some(Duration::from_millis(200))).await;
    let t = agent.telemetry.clone();
    let read = wait(&t, "a first read", |c| c.last_read_unix_ms.is_some() && c.flows_read > 0).await;
    assert!(read.last_error.is_none() && read.allowed.iter().any(|a| a.policy == "db-from-web"), "{read:?}");
    let pid = agent.sb.vswitchd_pid().expect("ovs-vswitchd pid");
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let thaw = Thaw(pid);
    let failed = wait(&t, "a failed read", |c| c.last_error.is_some()).await;
    assert!(failed.last_error.as_deref().is_some_and(|e| e.contains("no answer within 200ms")), "{failed:?}");
    let asked = Instant::now();
    let st = sdn_node::api::status::fetch(&agent.socket).await.expect("status while the switch is frozen");
    assert!(asked.elapsed() < Duration::from_secs(2), "status took {:?}", asked.elapsed());
    assert!(st.to_string().contains("LAST READ FAILED"), "{st}");
    assert_eq!(st.policy_counters.allowed, read.allowed, "the counters keep their values");
    drop(thaw);
    let after = failed.last_read_unix_ms;
    wait(&t, "reads again", |c| c.last_error.is_none() && c.last_read_unix_ms > after).await;
    let (_, m) = support::inproc::http_get(&agent.metrics, "/metrics").await;
    assert!(value(&m, "sdn_node_policy_stats_reads_total{result=\"error\"}").is_some_and(|n| n >= 1), "{m}");
    support::inproc::ready_again(&agent, "after the switch was thawed").await;
}

/// Connections just before a rule change are all counted (issue 32 item 8): twelve
/// connections to `isolated/web` on 8080, then at once the rule moves to 8081, which deletes
/// the 8080 flow well before the next read (every 5 s). Its final counts come with
/// OFPT_FLOW_REMOVED (the NetworkPolicy flows have `send_flow_rem`), so none is lost.
#[tokio::test]
async fn connections_just_before_a_rule_change_are_all_counted() {
    if !can_run() {
        return;
    }
    const METRICS2: &str = "127.0.0.1:9102";
    let node = CniNode::start_with(STATE, &["--metrics-addr", METRICS2, "--policy-stats-interval", "5"]).await;
    let (client_ns, server_ns) = (PodNs::new("client"), PodNs::new("server"));
    let r = node.cni("add", "client", "c1", &container(1), &client_ns.path());
    assert!(r.ok(), "client ADD: {:?}\n{}", r.out, node.log());
    let r = node.cni("add", "isolated", "s1", &container(2), &server_ns.path());
    assert!(r.ok(), "server ADD: {:?}\n{}", r.out, node.log());
    let server: Ipv4Addr = r.addr().parse().unwrap();
    echo_server(in_netns(&server_ns.name, move || TcpListener::bind(("0.0.0.0", 8080))).await.expect("listen"));
    let series = conns("isolated", "web", "ingress");
    let end = Instant::now() + WAIT;
    while value(&node.metrics(METRICS2).await, &series) != Some(0) {
        assert!(Instant::now() < end, "{series} never exported\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(node.flows().iter().any(|f| f.contains("table=80") && f.contains("tp_dst=8080") && f.contains("send_flow_rem")), "the counting flow asks for FLOW_REMOVED:\n{}", node.flows().join("\n"));
    for _ in 0..12 {
        exchange(&client_ns, server, 8080).await;
    }
    let changed = STATE.replace("ports: [{port: 8080}]}]}}", "ports: [{port: 8081}]}]}}");
    assert_ne!(changed, STATE);
    std::fs::write(&node.agent.state, &changed).expect("write the state");
    let end = Instant::now() + WAIT;
    while node.flows().iter().any(|f| f.contains("table=80") && f.contains("tp_dst=8080")) {
        assert!(Instant::now() < end, "the 8080 flow never left the switch\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = settle_at(&node, METRICS2, &[(series.clone(), 12)]).await;
    assert_eq!(value(&text, "sdn_node_policy_stats_reads_total{result=\"error\"}"), Some(0), "{text}");
    node.ready_again("after the rule change").await;
}

/// An audit annotation flip after traffic (issue 32 item 8: "annotation flips: 4 of 16"
/// lost): sixteen connections to `isolated/web`, counted by the switch on web's plain flows but
/// not yet read by the agent (reads every 30 s here), then its audit log is turned on, which
/// reshapes web's rule (a logged rule is a conjunction: the plain flows go). The counts the
/// agent never read come with the removed flows' FLOW_REMOVED: all sixteen count, no drop.
#[tokio::test]
async fn connections_before_an_audit_annotation_flip_are_all_counted() {
    if !can_run() {
        return;
    }
    const METRICS3: &str = "127.0.0.1:9103";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let args = ["--metrics-addr", METRICS3, "--policy-stats-interval", "30", "--audit-log", log.to_str().unwrap()];
    let node = CniNode::start_with(STATE, &args).await;
    let (client_ns, server_ns) = (PodNs::new("client"), PodNs::new("server"));
    let r = node.cni("add", "client", "c1", &container(1), &client_ns.path());
    assert!(r.ok(), "client ADD: {:?}\n{}", r.out, node.log());
    let r = node.cni("add", "isolated", "s1", &container(2), &server_ns.path());
    assert!(r.ok(), "server ADD: {:?}\n{}", r.out, node.log());
    let server: Ipv4Addr = r.addr().parse().unwrap();
    echo_server(in_netns(&server_ns.name, move || TcpListener::bind(("0.0.0.0", 8080))).await.expect("listen"));
    let series = conns("isolated", "web", "ingress");
    let end = Instant::now() + WAIT;
    while value(&node.metrics(METRICS3).await, &series) != Some(0) {
        assert!(Instant::now() < end, "{series} never exported\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..16 {
        exchange(&client_ns, server, 8080).await;
    }
    // The switch's statistics have them on web's plain flow (they lag its datapath by up to a
    // second); the agent has not read them.
    let on_plain = || -> u64 {
        let out = support::ofctl(&node.sb, &["dump-flows", "br0", "table=80,tcp,tp_dst=8080"]);
        out.lines()
            .filter(|l| !l.contains("conjunction(") && l.contains("actions=") && l.contains("priority=150"))
            .filter_map(|l| l.split("n_packets=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum()
    };
    let end = Instant::now() + WAIT;
    while on_plain() < 16 {
        assert!(Instant::now() < end, "the switch never counted 16 on web's plain flow ({})", on_plain());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(on_plain(), 16);
    assert_eq!(value(&node.metrics(METRICS3).await, &series), Some(0), "not read yet (reads every 30 s)");
    let annotated = STATE.replace(
        "metadata: {name: web, namespace: isolated}",
        "metadata: {name: web, namespace: isolated, annotations: {sdn-node.openshift.io/audit-log: allow}}",
    );
    assert_ne!(annotated, STATE);
    std::fs::write(&node.agent.state, &annotated).expect("write the state");
    let end = Instant::now() + WAIT;
    while on_plain() > 0 || !node.flows().iter().any(|f| f.contains("table=80") && f.contains("controller(")) {
        assert!(Instant::now() < end, "web's rule never became a logged conjunction:\n{:#?}", node.flows());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let end = Instant::now() + WAIT;
    loop {
        let text = node.metrics(METRICS3).await;
        if value(&text, &series) == Some(16) {
            assert_eq!(value(&text, &drops("isolated", "ingress")), Some(0), "no connection counted as a drop:\n{text}");
            assert_eq!(value(&text, "sdn_node_policy_stats_reads_total{result=\"error\"}"), Some(0), "{text}");
            break;
        }
        assert!(Instant::now() < end, "{series}: want 16\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    node.ready_again("after the annotation flip").await;
}

/// [`settle`] on another metrics address.
async fn settle_at(node: &CniNode, addr: &str, want: &[(String, u64)]) -> String {
    let end = Instant::now() + WAIT;
    loop {
        let text = node.metrics(addr).await;
        let got: Vec<Option<u64>> = want.iter().map(|(s, _)| value(&text, s)).collect();
        if want.iter().zip(&got).all(|((_, v), g)| *g == Some(*v)) {
            break;
        }
        assert!(Instant::now() < end, "counters {want:?}, got {got:?}\n{text}\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two more reads: still exactly there.
    tokio::time::sleep(Duration::from_millis(11_000)).await;
    let text = node.metrics(addr).await;
    for (s, v) in want {
        assert_eq!(value(&text, s), Some(*v), "{s} moved on\n{text}");
    }
    text
}

/// One-way UDP (issue 32 item 8b): a stream that never gets a reply is never `+est` in
/// conntrack; the allowed policy flow marks its conntrack entry (`ct_mark` bit 0x2 ingress,
/// 0x4 egress) and table 80/27 pass marked UDP before any policy flow, so the stream is
/// counted, and logged, once per direction, however many datagrams follow.
const UDP_STATE: &str = r#"
node: node-a
plugin: networkpolicy
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
mtu: 1450
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/23}
netNamespaces:
  - {name: isolated, netid: 11}
  - {name: client, netid: 13}
networkPolicies:
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: udp-in, namespace: isolated, annotations: {sdn-node.openshift.io/audit-log: allow}}, spec: {podSelector: {}, ingress: [{from: [{namespaceSelector: {}}], ports: [{protocol: UDP, port: 5000}]}]}}
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: udp-out, namespace: client, annotations: {sdn-node.openshift.io/audit-log: allow}}, spec: {podSelector: {}, policyTypes: [Egress], egress: [{ports: [{protocol: UDP, port: 5000, endPort: 5001}]}]}}
"#;

/// The audit log's lines.
fn audit_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line: {l}: {e}")))
        .collect()
}

/// A UDP receiver counting datagrams per source.
fn udp_sink(u: UdpSocket) -> std::sync::Arc<std::sync::Mutex<std::collections::HashMap<SocketAddr, u64>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let s = seen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((_, from)) = u.recv_from(&mut buf) {
            *s.lock().unwrap().entry(from).or_insert(0) += 1;
        }
    });
    seen
}

#[tokio::test]
async fn a_one_way_udp_stream_counts_and_logs_once_per_direction_and_denied_datagrams_drop_every_time() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    // A meter generous enough that a stream judged datagram by datagram would show in the log.
    let args = [
        "--metrics-addr",
        METRICS,
        "--policy-stats-interval",
        INTERVAL,
        "--audit-log",
        log.to_str().unwrap(),
        "--audit-rate",
        "1000",
        "--audit-burst",
        "1000",
    ];
    let node = CniNode::start_with(UDP_STATE, &args).await;
    let (client_ns, server_ns) = (PodNs::new("client"), PodNs::new("server"));
    let r = node.cni("add", "client", "c1", &container(1), &client_ns.path());
    assert!(r.ok(), "client ADD: {:?}\n{}", r.out, node.log());
    let client: Ipv4Addr = r.addr().parse().unwrap();
    let r = node.cni("add", "isolated", "s1", &container(2), &server_ns.path());
    assert!(r.ok(), "server ADD: {:?}\n{}", r.out, node.log());
    let server: Ipv4Addr = r.addr().parse().unwrap();
    let seen = udp_sink(in_netns(&server_ns.name, || UdpSocket::bind(("0.0.0.0", 5000))).await.expect("bind 5000"));
    let (udp_in, udp_out) = (conns("isolated", "udp-in", "ingress"), conns("client", "udp-out", "egress"));
    let (drop_in, drop_out) = (drops("isolated", "ingress"), drops("client", "egress"));
    settle(&node, &[(udp_in.clone(), 0), (udp_out.clone(), 0), (drop_in.clone(), 0), (drop_out.clone(), 0)]).await;

    // The stream: 1,000 datagrams from one socket (one 5-tuple) to 5000, which both
    // directions allow. The first alone, until it arrives: datagrams the switch handles in
    // one batch with the first, before its verdict is committed, are judged too (see
    // docs/networkpolicy.md); the first also resolves ARP, whose queue would be such a burst.
    let s = in_netns(&client_ns.name, || UdpSocket::bind("0.0.0.0:0")).await.unwrap();
    let src = SocketAddr::from((client, s.local_addr().unwrap().port()));
    s.send_to(&0u32.to_be_bytes(), (server, 5000)).unwrap();
    let end = Instant::now() + WAIT;
    while seen.lock().unwrap().get(&src).copied().unwrap_or(0) == 0 {
        assert!(Instant::now() < end, "the first datagram never arrived\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 1..1000u32 {
        s.send_to(&i.to_be_bytes(), (server, 5000)).unwrap();
        if i % 100 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Egress allows 5001, ingress does not: each datagram reaches table 80 and is dropped
    // there (the egress mark of the shared conntrack entry does not pass table 80).
    for i in 0..10u32 {
        s.send_to(&i.to_be_bytes(), (server, 5001)).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Egress denies 6000: dropped in table 27 every time.
    for i in 0..5u32 {
        s.send_to(&i.to_be_bytes(), (server, 6000)).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A marker: another socket's datagram to 5000, a new connection in both directions.
    let m = in_netns(&client_ns.name, || UdpSocket::bind("0.0.0.0:0")).await.unwrap();
    let marker = SocketAddr::from((client, m.local_addr().unwrap().port()));
    m.send_to(b"m", (server, 5000)).unwrap();
    let text =
        settle(&node, &[(udp_in.clone(), 2), (udp_out.clone(), 3), (drop_in.clone(), 10), (drop_out.clone(), 5)]).await;
    let got = seen.lock().unwrap().get(&src).copied().unwrap_or(0);
    eprintln!("one-way stream: {got} of 1000 datagrams arrived");
    assert!(got >= 100, "the stream passed ({got} of 1000 arrived)\n{text}");
    // What passed them: table 80's marked-UDP flow took every one the pod got but the first
    // (the switch's statistics, read after the counters settled).
    let marked = |table: u8, mark: &str| -> u64 {
        let out = support::ofctl(&node.sb, &["dump-flows", "br0", &format!("table={table}")]);
        let line =
            out.lines().find(|l| l.contains(&format!("ct_mark={mark}/{mark},udp"))).expect("the marked-UDP flow");
        line.split("n_packets=")
            .nth(1)
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .expect("n_packets")
    };
    let passed = marked(80, "0x2");
    assert!((got - 1..=999).contains(&passed), "table 80's marked-UDP flow passed {passed}, the pod got {got}");
    // Table 27's: the stream's later datagrams and those to 5001 (egress allowed them once).
    let passed = marked(27, "0x4");
    assert!((got - 1 + 9..=999 + 9).contains(&passed), "table 27's marked-UDP flow passed {passed}, the pod got {got}");

    // The log: the marker's two lines (ingress, egress) come after everything the stream sent.
    let end = Instant::now() + WAIT;
    while audit_lines(&log).iter().filter(|v| v["src"] == marker.to_string()).count() < 2 {
        assert!(Instant::now() < end, "the marker's allow lines\n{:#?}\n{}", audit_lines(&log), node.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all = audit_lines(&log);
    let of = |dir: &str, port: u16| -> Vec<&serde_json::Value> {
        all.iter()
            .filter(|v| v["src"] == src.to_string() && v["direction"] == dir && v["dst"] == format!("{server}:{port}"))
            .collect()
    };
    let (ingress, egress) = (of("ingress", 5000), of("egress", 5000));
    assert_eq!((ingress.len(), egress.len()), (1, 1), "the stream once per direction:\n{all:#?}");
    assert_eq!(
        (ingress[0]["verdict"].as_str(), ingress[0]["policy"].as_str(), ingress[0]["proto"].as_str()),
        (Some("allow"), Some("isolated/udp-in"), Some("udp"))
    );
    assert_eq!((egress[0]["verdict"].as_str(), egress[0]["policy"].as_str()), (Some("allow"), Some("client/udp-out")));
    assert_eq!(of("egress", 5001).len(), 1, "5001 allowed once on egress:\n{all:#?}");
    assert!(of("ingress", 5001).is_empty(), "5001 is denied on ingress (and deny is not logged):\n{all:#?}");
    node.ready_again("after the one-way streams").await;
}
