//! The networkpolicy plugin with real packets, beyond TCP and UDP of tests/netpol.rs:
//!
//! - SCTP ports: the kernel here has no SCTP module, so pods speak SCTP through raw IP sockets
//!   (tests/support/sctp.rs): the source sends an INIT, a responder in the destination pod
//!   records it and answers with an INIT ACK (ports swapped). For every (source, destination,
//!   protocol, port) the test compares with the specification evaluator
//!   (tests/support/netpol_eval.rs) both that the INIT arrived at the destination and that
//!   the answer came back to the source: iff allowed. Ingress (table 80) and egress (table
//!   27) policies, alone and together: the source's egress and the destination's ingress must
//!   both allow the INIT.
//! - IP fragments: a UDP datagram larger than the pod MTU (fragmented by the sender's kernel)
//!   through a policy that allows only its port, on one node and across VXLAN.
//!
//! Two nodes (tests/support/nodes.rs), two namespaces: clients in ns1, servers in ns2, one of
//! each per node.

mod support;

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::netpol_eval::{EvalNamespace, EvalPod, Evaluator, Proto};
use support::netpol_state;
use support::nodes::{in_netns, tcp_echo, Cluster, NodeSpec, Pod, POD_MTU};
use support::sctp::{self, Responder};

const PROBE: Duration = Duration::from_millis(1500);
const PROBE_RETRY: Duration = Duration::from_secs(6);
/// (protocol, port) probed for every pair.
const PROBES: [(Proto, u16); 4] = [(Proto::Sctp, 7000), (Proto::Sctp, 7001), (Proto::Tcp, 7000), (Proto::Tcp, 7001)];

/// (node, namespace, name, IP, app label, container ports (name, port, protocol)).
type PodSpec = (&'static str, &'static str, &'static str, &'static str, &'static str, &'static [(&'static str, u16, &'static str)]);

const NAMESPACES: [(&str, u32, &str); 2] = [("ns1", 21, "a"), ("ns2", 22, "b")];

const PODS: [PodSpec; 4] = [
    ("a", "ns1", "c1", "10.128.0.21", "client", &[]),
    ("b", "ns1", "c2", "10.128.2.21", "client", &[]),
    ("a", "ns2", "s1", "10.128.0.22", "server", &[("assoc", 7000, "SCTP"), ("web", 7001, "TCP")]),
    ("b", "ns2", "s2", "10.128.2.22", "server", &[("assoc", 7001, "SCTP"), ("web", 7000, "TCP")]),
];

struct World {
    c: Cluster,
    pods: Vec<(Pod, EvalPod)>,
    namespaces: Vec<EvalNamespace>,
    responders: Vec<Responder>,
    servers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for World {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

async fn world(test: &str) -> Option<World> {
    let mut c = Cluster::start(
        test,
        &[NodeSpec::new("a", "172.17.0.2", "10.128.0.0/23"), NodeSpec::new("b", "172.17.0.3", "10.128.2.0/23")],
    )
    .await?;
    let mut pods = Vec::new();
    for (node, ns, name, ip, app, ports) in PODS {
        let p = c.node_mut(node).add_pod(ns, name, ip).await;
        let e = EvalPod {
            namespace: ns.into(),
            name: name.into(),
            ip: ip.parse().unwrap(),
            labels: [("app".to_string(), app.to_string())].into(),
            container_ports: ports.iter().map(|(n, p, proto)| (n.to_string(), *p, proto.to_string())).collect(),
        };
        pods.push((p, e));
    }
    let namespaces = NAMESPACES
        .iter()
        .map(|(n, _, team)| EvalNamespace { name: n.to_string(), labels: [("team".to_string(), team.to_string())].into() })
        .collect();
    let mut w = World { c, pods, namespaces, responders: Vec::new(), servers: Vec::new() };
    apply(&w, &[]).await;
    for (p, _) in &w.pods {
        w.responders.push(Responder::start(&p.netns, p.ip).await);
        for port in [7000, 7001] {
            w.servers.push(tcp_echo(p.tcp_listen(port).await));
        }
    }
    Some(w)
}


fn state_json(w: &World, node: &str, policies: &[Value]) -> String {
    let net_namespaces: Vec<Value> = NAMESPACES.iter().map(|(n, id, team)| json!({"name": n, "netid": id, "labels": {"team": team}})).collect();
    netpol_state::state_json(&w.c, node, net_namespaces, &w.pods, policies)
}

/// Applies the policies on both nodes, then empties the datapath flow caches (as
/// tests/netpol.rs) and the conntrack tables (each scenario starts without connections).
async fn apply(w: &World, policies: &[Value]) -> Vec<String> {
    let mut warnings = Vec::new();
    for n in w.c.nodes() {
        let r = n.apply(&state_json(w, n.name(), policies)).await;
        assert!(r.problems.is_empty(), "node {}: {:?}", n.name(), r.problems);
        warnings.extend(r.warnings.iter().map(|p| p.to_string()));
    }
    for n in w.c.nodes() {
        n.appctl(&["revalidator/purge"]).await;
    }
    flush_conntrack(w).await;
    warnings
}

async fn flush_conntrack(w: &World) {
    for n in w.c.nodes() {
        n.appctl(&["dpctl/flush-conntrack"]).await;
    }
}

fn np(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A source port (20000..60000) and an Initiate Tag never used before in this run.
fn next_port_and_tag() -> (u16, u32) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    ((20_000 + n % 40_000) as u16, 0x5c70_0000 + n)
}

/// One probe: (did the first packet arrive at the destination, did the answer come back).
/// For TCP both are "the connection echoed data".
async fn probe(w: &World, s: usize, d: usize, proto: Proto, port: u16, timeout: Duration) -> (bool, bool) {
    let (src, dst) = (&w.pods[s].0, &w.pods[d].0);
    match proto {
        Proto::Sctp => {
            let (sport, tag) = next_port_and_tag();
            let answered = sctp::init(&src.netns, dst.ip, sport, port, tag, timeout).await;
            (w.responders[d].saw(src.ip, sport, port, tag), answered)
        }
        Proto::Tcp => {
            let ok = async {
                let s = src.tcp_connect(dst.ip, port, timeout).await.ok()?;
                let mut s = tokio::net::TcpStream::from_std(s).ok()?;
                let msg = format!("{}->{}:{port}", src.ip, dst.ip);
                s.write_all(msg.as_bytes()).await.ok()?;
                let mut buf = vec![0u8; msg.len()];
                tokio::time::timeout(timeout, s.read_exact(&mut buf)).await.ok()?.ok()?;
                (buf == msg.as_bytes()).then_some(())
            }
            .await
            .is_some();
            (ok, ok)
        }
        Proto::Udp => unreachable!("UDP is probed by tests/netpol.rs"),
    }
}

/// Applies `policies`, probes every (source, destination, protocol, port) and compares both
/// the arrival and the answer with the evaluator. Returns (probes, allowed).
async fn check_matrix(w: &World, name: &str, policies: &[Value]) -> (usize, usize) {
    let warnings = apply(w, policies).await;
    assert!(!warnings.iter().any(|w| w.contains("SCTP")), "{name}: no SCTP warning any more: {warnings:?}");
    let eval_pods: Vec<EvalPod> = w.pods.iter().map(|(_, e)| e.clone()).collect();
    let ev = Evaluator { namespaces: &w.namespaces, pods: &eval_pods, policies };
    let mut cases = Vec::new();
    for s in 0..w.pods.len() {
        for d in (0..w.pods.len()).filter(|d| *d != s) {
            for (proto, port) in PROBES {
                cases.push((s, d, proto, port));
            }
        }
    }
    let want: Vec<bool> = cases.iter().map(|&(s, d, proto, port)| ev.allowed(&eval_pods[s], &eval_pods[d], proto, port)).collect();
    // The userspace datapath tracks SCTP without ports (one conntrack entry per address pair,
    // see `sctp_replies_are_recognised_per_address_pair`): a probe from d to s would be the
    // reply direction of an earlier probe from s to d. So the probes run in two rounds, each
    // pair in one direction per round, with conntrack emptied before each round; within a
    // round concurrently (each probe has its own source port and Initiate Tag).
    let mut got = vec![(false, false); cases.len()];
    for forward in [true, false] {
        flush_conntrack(w).await;
        let round: Vec<usize> = (0..cases.len()).filter(|&i| (cases[i].0 < cases[i].1) == forward).collect();
        let results = futures::future::join_all(round.iter().map(|&i| {
            let (s, d, proto, port) = cases[i];
            probe(w, s, d, proto, port, PROBE)
        }))
        .await;
        for (k, &i) in round.iter().enumerate() {
            let (s, d, proto, port) = cases[i];
            // An expected-allowed probe that got no answer: once more, slowly.
            got[i] = if want[i] && results[k] != (true, true) { probe(w, s, d, proto, port, PROBE_RETRY).await } else { results[k] };
        }
    }
    let mut diff = String::new();
    for (i, &(s, d, proto, port)) in cases.iter().enumerate() {
        let (arrived, answered) = got[i];
        if arrived != want[i] || answered != want[i] {
            let _ = writeln!(
                diff,
                "  {} ({}) -> {} ({}) {proto:?}/{port}: expected {}, got arrived={arrived} answered={answered}",
                eval_pods[s].name,
                eval_pods[s].ip,
                eval_pods[d].name,
                eval_pods[d].ip,
                if want[i] { "allowed" } else { "denied" },
            );
        }
    }
    if !diff.is_empty() {
        let mut flows = String::new();
        for n in w.c.nodes() {
            let _ = writeln!(flows, "--- node {} table 80\n{}", n.name(), n.ofctl("dump-flows", "br0", &["table=80"]).await);
            let _ = writeln!(flows, "--- node {} conntrack\n{}", n.name(), n.appctl(&["dpctl/dump-conntrack"]).await);
        }
        panic!("scenario {name}: differs from the specification:\n{diff}policies: {}\n{flows}", serde_json::to_string_pretty(policies).unwrap());
    }
    (cases.len(), want.iter().filter(|w| **w).count())
}

fn scenarios() -> Vec<(&'static str, Vec<Value>)> {
    let from_ns1 = json!([{"namespaceSelector": {"matchLabels": {"team": "a"}}}]);
    vec![
        ("no policies", vec![]),
        ("default deny ns2", vec![np("ns2", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}))]),
        ("sctp 7000 allowed", vec![np("ns2", "sctp", json!({"podSelector": {}, "ingress": [{"from": from_ns1, "ports": [{"protocol": "SCTP", "port": 7000}]}]}))]),
        ("only tcp 7000 allowed", vec![np("ns2", "tcp", json!({"podSelector": {}, "ingress": [{"from": from_ns1, "ports": [{"protocol": "TCP", "port": 7000}]}]}))]),
        ("sctp named port", vec![np("ns2", "named", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "SCTP", "port": "assoc"}, {"port": "web"}]}]}))]),
        (
            "sctp endPort",
            vec![np("ns2", "range", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "SCTP", "port": 7001, "endPort": 7009}, {"protocol": "TCP", "port": 6000, "endPort": 7000}]}]}))],
        ),
        ("sctp without port", vec![np("ns2", "all-sctp", json!({"podSelector": {"matchLabels": {"app": "server"}}, "ingress": [{"from": from_ns1, "ports": [{"protocol": "SCTP"}]}]}))]),
        (
            "both namespaces isolated",
            vec![
                np("ns2", "sctp", json!({"podSelector": {}, "ingress": [{"from": from_ns1, "ports": [{"protocol": "SCTP", "port": 7000}, {"protocol": "SCTP", "port": 7001}]}]})),
                np("ns1", "tcp-only", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "TCP", "port": 7001}]}]})),
            ],
        ),
        // Egress: the clients' namespace may send only what its rules allow (table 27), on
        // one node and across VXLAN; replies pass.
        ("egress default deny ns1", vec![np("ns1", "deny-out", json!({"podSelector": {}, "policyTypes": ["Egress"]}))]),
        (
            "egress sctp 7000 to servers",
            vec![np("ns1", "sctp-out", json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}], "ports": [{"protocol": "SCTP", "port": 7000}]}]}))],
        ),
        // Named ports resolve on the destination pod: "assoc" is SCTP 7000 on s1 and 7001 on s2.
        ("egress sctp named port", vec![np("ns1", "named-out", json!({"podSelector": {}, "egress": [{"ports": [{"protocol": "SCTP", "port": "assoc"}]}]}))]),
        (
            "egress sctp endPort and ipBlock",
            vec![np("ns1", "range-out", json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.128.0.0/14", "except": ["10.128.2.0/24"]}}], "ports": [{"protocol": "SCTP", "port": 6990, "endPort": 7000}, {"protocol": "TCP", "port": 7001}]}]}))],
        ),
        (
            "egress and ingress both judge sctp",
            vec![
                np("ns1", "sctp-out", json!({"podSelector": {}, "egress": [{"ports": [{"protocol": "SCTP"}]}]})),
                np("ns2", "sctp-7001-in", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "SCTP", "port": 7001}, {"protocol": "TCP"}]}]})),
            ],
        ),
    ]
}

#[test]
fn crc32c_check_value_and_packet_round_trip() {
    // The CRC-32C check value (the Castagnoli entry of the CRC catalogue; RFC 3720 B.4).
    assert_eq!(sctp::crc32c(b"123456789"), 0xe306_9283);
    let p = sctp::packet(5000, 7000, 0, sctp::CHUNK_INIT, 0x1234_5678);
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 132, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
    let total = (ip.len() + p.len()) as u16;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend(&p);
    let r = sctp::parse(&ip).expect("parses");
    assert_eq!((r.sport, r.dport, r.vtag, r.chunk, r.initiate_tag), (5000, 7000, 0, sctp::CHUNK_INIT, 0x1234_5678));
    let last = ip.len() - 1;
    ip[last] ^= 1;
    assert!(sctp::parse(&ip).is_none(), "a corrupted packet fails the checksum");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sctp_ports_truth_table_on_two_nodes() {
    let Some(w) = world("sctp_truth_table").await else { return };
    let (mut probes, mut allowed) = (0, 0);
    let only = std::env::var("NETPOL_ONLY").unwrap_or_default();
    let all = scenarios();
    for (name, policies) in all.iter().filter(|(n, _)| n.contains(&only)) {
        let (p, a) = check_matrix(&w, name, policies).await;
        probes += p;
        allowed += a;
    }
    eprintln!("sctp truth table: {} scenarios, {probes} probes ({allowed} allowed)", all.len());
}

/// A UDP echo server that answers datagrams of any size.
fn udp_echo(u: std::net::UdpSocket) -> tokio::task::JoinHandle<()> {
    let u = tokio::net::UdpSocket::from_std(u).expect("tokio udp");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, from)) = u.recv_from(&mut buf).await {
            let _ = u.send_to(&buf[..n], from).await;
        }
    })
}

/// Sends one `size`-byte datagram from `src` to `dst:port` and waits for the echo: the size
/// received back, if any (it equals `size` only if the datagram arrived whole both ways).
async fn udp_round_trip(src: &Pod, dst: Ipv4Addr, port: u16, size: usize, sport: u16, timeout: Duration) -> Option<usize> {
    let u = in_netns(&src.netns, move || std::net::UdpSocket::bind(("0.0.0.0", sport))).await.expect("bind udp");
    u.set_nonblocking(true).unwrap();
    let u = tokio::net::UdpSocket::from_std(u).unwrap();
    let msg: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    u.send_to(&msg, (dst, port)).await.expect("send");
    let mut buf = vec![0u8; 65_536];
    let n = tokio::time::timeout(timeout, u.recv(&mut buf)).await.ok()?.ok()?;
    assert!(n != size || buf[..n] == msg[..], "the echo of {size} bytes is the datagram sent");
    Some(n)
}

/// A UDP datagram larger than the MTU is fragmented by the sending pod's kernel; the later
/// fragments carry no UDP header. The userspace datapath's `ct()` (table 21 for traffic from
/// local pods, table 80's `ct(commit,table=80)` for traffic from VXLAN) releases the fragments
/// of a complete datagram together; table 80 judges the first by its port and the later ones by
/// the port-restricted rule's twin for later fragments (src/pipeline/netpol.rs). An allowed
/// datagram arrives whole (its echo comes back whole); a denied one does not arrive (no echo).
/// Same node and across VXLAN. Without the twins the allowed 4,000-byte datagram was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragmented_udp_through_a_port_restricted_policy() {
    let Some(mut w) = world("fragments").await else { return };
    for (p, _) in w.pods.iter().filter(|(p, _)| p.namespace == "ns2") {
        for port in [8080u16, 9090] {
            let ns = p.netns.clone();
            let u = in_netns(&ns, move || std::net::UdpSocket::bind(("0.0.0.0", port))).await.expect("bind udp");
            u.set_nonblocking(true).unwrap();
            w.servers.push(udp_echo(u));
        }
    }
    for n in w.c.nodes() {
        eprintln!("node {} ipf status:\n{}", n.name(), n.appctl(&["dpctl/ipf-get-status"]).await);
    }
    let policy = np("ns2", "udp-8080", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "UDP", "port": 8080}]}]}));
    apply(&w, &[policy]).await;
    let c1 = w.pods[0].0.clone();
    let size = 4000;
    assert!(size as u32 > POD_MTU, "the datagram needs fragments");
    let mut sport = 31_000;
    let mut failures = Vec::new();
    for d in [2usize, 3] {
        let dst = w.pods[d].0.clone();
        let across = if dst.node == c1.node { "same node" } else { "across VXLAN" };
        for (len, port, allowed) in [(100, 8080, true), (size, 8080, true), (100, 9090, false), (size, 9090, false)] {
            sport += 1;
            let t = if allowed { PROBE_RETRY } else { PROBE };
            let got = udp_round_trip(&c1, dst.ip, port, len, sport, t).await;
            let ok = if allowed { got == Some(len) } else { got.is_none() };
            if !ok {
                failures.push(format!("{} -> {} ({across}) UDP/{port}, {len} bytes: expected {}, got {got:?}", c1.name, dst.name, if allowed { "the whole echo" } else { "nothing" }));
            }
        }
    }
    if !failures.is_empty() {
        let mut diag = String::new();
        for n in w.c.nodes() {
            let _ = writeln!(diag, "--- node {} ipf\n{}", n.name(), n.appctl(&["dpctl/ipf-get-status", "-m"]).await);
            let _ = writeln!(diag, "--- node {} datapath flows\n{}", n.name(), n.appctl(&["dpctl/dump-flows"]).await);
        }
        panic!("{}\n{diag}", failures.join("\n"));
    }
}

/// The SCTP flow text and encoding are OVS's (ofp-parse of what the agent sends).
#[test]
fn sctp_table80_flow_decodes_in_ovs_as_displayed() {
    use sdn_node::pipeline::netpol::{namespace_flows, plain_flows, Allow, Dst, IsolatedPod, NamespacePolicy, RuleAllow, Src, L4};
    if std::process::Command::new("ovs-ofctl").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "ovs-ofctl is needed and CI is set");
        eprintln!("SKIPPED: no ovs-ofctl");
        return;
    }
    let pod = IsolatedPod {
        ip: "10.128.2.5".parse().unwrap(),
        allows: vec![
            Allow { src: Src::Any, dst: Dst::Ports { proto: L4::Sctp, start: 7000, end: 7000 } },
            Allow { src: Src::Net("10.128.0.0/16".parse().unwrap()), dst: Dst::Ports { proto: L4::Sctp, start: 9000, end: 9003 } },
            Allow { src: Src::Net("10.129.0.0/16".parse().unwrap()), dst: Dst::Ports { proto: L4::Sctp, start: 0, end: u16::MAX } },
        ],
    };
    let mut flows = plain_flows(&[pod]);
    // And as conjunctive clauses (two sources, two pods, a port range: 2 + 2 + 2 + 1 flows).
    let sctp = Dst::Ports { proto: L4::Sctp, start: 9000, end: 9003 };
    let ns = NamespacePolicy {
        namespace: "team-a".into(),
        vnid: Some(sdn_node::domain::Vnid::new(11).unwrap()),
        isolated: vec![],
        rules: vec![RuleAllow {
            policy: "p".into(),
            rule: 0,
            srcs: Some(vec![Src::Net("10.128.0.0/16".parse().unwrap()), Src::Net("10.130.0.0/16".parse().unwrap())]),
            pods: ["10.128.2.5", "10.128.2.6"].iter().map(|a| (a.parse().unwrap(), vec![sctp])).collect(),
        }],
        ..Default::default()
    };
    let (conj, errors) = namespace_flows(&ns);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(conj.len(), 7, "{conj:?}");
    flows.extend(conj);
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for (i, f) in flows.iter().enumerate() {
        let c = sdn_node::store::Compiled::compile(f);
        let fm = c.to_flow_mod(0).unwrap();
        let bytes = openflow::OfMessage::new(i as u32 + 1, openflow::Message::FlowMod(fm)).to_bytes().unwrap();
        let path = dir.path().join(format!("f{i}"));
        std::fs::write(&path, &bytes).unwrap();
        let out = std::process::Command::new("ovs-ofctl").arg("ofp-parse").arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let got = String::from_utf8_lossy(&out.stdout).into_owned();
        let body = got.split_once("): ADD table:80 ").map(|x| x.1.trim().to_string()).unwrap_or(got.clone());
        let shown = c.to_string();
        let ours = shown.strip_prefix("table=80, ").unwrap_or(&shown).to_string();
        assert_eq!(body, ours, "ofp-parse of our FLOW_MOD");
        seen.push(ours);
    }
    for want in [
        "priority=150,sctp,nw_dst=10.128.2.5,tp_dst=7000 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]",
        "priority=150,sctp,nw_src=10.128.0.0/16,nw_dst=10.128.2.5,tp_dst=0x2328/0xfffc actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]",
        "priority=150,sctp,nw_src=10.129.0.0/16,nw_dst=10.128.2.5 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]",
    ] {
        assert!(seen.iter().any(|s| s == want), "missing {want}\n{}", seen.join("\n"));
    }
    for want in ["sctp,reg1=0xb,tp_dst=0x2328/0xfffc actions=conjunction(", "ct_state=-inv+trk,sctp,reg1=0xb,nw_frag=later actions=conjunction("] {
        assert!(seen.iter().any(|s| s.contains(want)), "missing {want}\n{}", seen.join("\n"));
    }
}

/// A limit of the userspace datapath, pinned so that it is noticed when it changes (the
/// docs/networkpolicy.md states it): OVS 3.1's userspace conntrack has no SCTP
/// tracker and keys SCTP entries by addresses only (`sctp,orig=(src=A,dst=B,sport=0,dport=0)`).
/// After an allowed exchange A -> B, any SCTP packet B -> A is in the reply direction of that
/// entry and passes table 80's reply flow, whatever the ports and A's policies, until the
/// entry expires. Without such an entry the same packet is denied. The entry's direction is
/// that of the first packet, committed (table 21 at the source's node, table 80's priority 250
/// at the destination's) before table 80 judges it: after a denied attempt B -> A, an allowed
/// INIT A -> B arrives, but B's answer is in the original direction and A's policies (which
/// deny SCTP) drop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sctp_replies_are_recognised_per_address_pair() {
    let Some(w) = world("sctp_per_pair").await else { return };
    let from_ns1 = json!([{"namespaceSelector": {"matchLabels": {"team": "a"}}}]);
    let policies = [
        np("ns2", "sctp", json!({"podSelector": {}, "ingress": [{"from": from_ns1, "ports": [{"protocol": "SCTP", "port": 7000}]}]})),
        np("ns1", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]})),
    ];
    apply(&w, &policies).await;
    let eval_pods: Vec<EvalPod> = w.pods.iter().map(|(_, e)| e.clone()).collect();
    let ev = Evaluator { namespaces: &w.namespaces, pods: &eval_pods, policies: &policies };
    for (c, s) in [(0usize, 2usize), (0, 3)] {
        let what = format!("{} -> {}", w.pods[s].0.name, w.pods[c].0.name);
        assert!(!ev.allowed(&eval_pods[s], &eval_pods[c], Proto::Sctp, 7001), "the specification denies {what} SCTP/7001");
        flush_conntrack(&w).await;
        assert_eq!(probe(&w, s, c, Proto::Sctp, 7001, PROBE).await, (false, false), "{what} SCTP/7001 without a prior exchange: denied");
        // The entry of the denied attempt (committed on both nodes) makes the allowed INIT its
        // reply and the answer its original direction, judged (and dropped) by A's policy.
        assert_eq!(probe(&w, c, s, Proto::Sctp, 7000, PROBE_RETRY).await, (true, false), "after the denied {what}: the allowed INIT");
        flush_conntrack(&w).await;
        assert_eq!(probe(&w, c, s, Proto::Sctp, 7000, PROBE_RETRY).await, (true, true), "the allowed exchange, reverse of {what}");
        let ct: String = w.c.nodes()[0].appctl(&["dpctl/dump-conntrack"]).await;
        assert!(
            ct.lines().any(|l| l.starts_with("sctp,") && l.contains(&format!("src={}", w.pods[c].0.ip)) && l.contains("sport=0,dport=0")),
            "SCTP is tracked without ports:\n{ct}"
        );
        // The INIT arrives although the specification denies it; the answer (original
        // direction, to B's source port, which B's policy does not allow) is dropped at B.
        let (arrived, _) = probe(&w, s, c, Proto::Sctp, 7001, PROBE_RETRY).await;
        assert!(arrived, "{what} SCTP/7001 after the exchange passes as a reply");
    }
}
