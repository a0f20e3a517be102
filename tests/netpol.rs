//! The networkpolicy plugin with real packets: a reachability truth table.
//!
//! Two nodes (tests/support/nodes.rs: userspace Open vSwitch per node, VXLAN between them),
//! three labelled namespaces with one pod on each node, every pod listening on TCP and UDP
//! ports 8080 and 9090 (echo servers). For each scenario (a set of NetworkPolicy objects), the
//! evaluator in tests/support/netpol_eval.rs — written from the Kubernetes specification, not
//! from the pipeline — says for every (source pod, destination pod, protocol, port) whether a
//! new connection is allowed; the test opens every connection for real (concurrently), checks
//! that an allowed one echoes data both ways and a denied one gets nothing, and compares the
//! whole matrix. Same-node and cross-node pairs are both in every matrix.
//!
//! Denial is observed as "no answer within a probe timeout"; an expected-allowed probe that
//! got no answer is retried with a longer timeout before it counts as a mismatch, so a slow
//! machine cannot turn into a false failure. An unexpected answer is never retried.

mod support;

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::netpol_eval::{EvalNamespace, EvalPod, Evaluator, Proto};
use support::netpol_state;
use support::nodes::{in_netns, tcp_echo, Cluster, NodeSpec, Pod};

const PORTS: [u16; 2] = [8080, 9090];
const PROTOS: [Proto; 2] = [Proto::Tcp, Proto::Udp];
/// How long a probe waits for an answer before it counts the connection as denied.
const PROBE: Duration = Duration::from_millis(1500);
/// The retry of an expected-allowed probe that got no answer.
const PROBE_RETRY: Duration = Duration::from_secs(6);
/// How many seeded random scenarios.
const RANDOM_SCENARIOS: u64 = 32;

/// (namespace, netid, labels).
type NsSpec = (&'static str, u32, &'static [(&'static str, &'static str)]);
/// (node, namespace, name, IP, app label, the named port "http" -> this port, if any).
type PodSpec = (&'static str, &'static str, &'static str, &'static str, &'static str, Option<u16>);

const NAMESPACES: [NsSpec; 3] =
    [("ns1", 11, &[("team", "a")]), ("ns2", 12, &[("team", "b")]), ("ns3", 13, &[("env", "prod")])];

const PODS: [PodSpec; 6] = [
    ("a", "ns1", "p1a", "10.128.0.11", "web", Some(8080)),
    ("b", "ns1", "p1b", "10.128.2.11", "db", Some(9090)),
    ("a", "ns2", "p2a", "10.128.0.12", "db", Some(9090)),
    ("b", "ns2", "p2b", "10.128.2.12", "web", Some(8080)),
    ("a", "ns3", "p3a", "10.128.0.13", "web", None),
    ("b", "ns3", "p3b", "10.128.2.13", "db", Some(8080)),
];

struct World {
    c: Cluster,
    /// The harness pod and what the evaluator knows of it, in [`PODS`] order.
    pods: Vec<(Pod, EvalPod)>,
    namespaces: Vec<EvalNamespace>,
    servers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for World {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

fn eval_pod(i: usize) -> EvalPod {
    let (_, ns, name, ip, app, http) = PODS[i];
    EvalPod {
        namespace: ns.into(),
        name: name.into(),
        ip: ip.parse().unwrap(),
        labels: [("app".to_string(), app.to_string())].into(),
        container_ports: http.map(|p| vec![("http".to_string(), p, "TCP".to_string()), ("http".to_string(), p, "UDP".to_string())]).unwrap_or_default(),
    }
}

async fn world(test: &str) -> Option<World> {
    world_with(test, Stack::V4).await
}

/// The families of a world's nodes and pods.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stack {
    V4,
    Dual,
    /// No IPv4 at all: the pods' IPv6 addresses alone.
    V6Only,
}

/// The dual-stack nodes' IPv6 subnets, beside [`NODE_SUBNETS`]: a pod's IPv6 address has its
/// IPv4 address's host part (tests/support/nodes.rs).
const NODE_SUBNETS: [(&str, &str); 2] = [("10.128.0.0/23", "fd00:10:128:1::/64"), ("10.128.2.0/23", "fd00:10:128:2::/64")];

/// The world, with `dual`: dual-stack nodes, every pod with an IPv6 address, servers on both
/// families.
async fn world_with(test: &str, stack: Stack) -> Option<World> {
    let spec = |name: &str, ip: &str, (v4, v6): (&str, &str)| {
        let s = NodeSpec::new(name, ip, v4);
        match stack {
            Stack::V4 => s,
            Stack::Dual => s.ipv6(v6),
            Stack::V6Only => s.ipv6_only(v6),
        }
    };
    let dual = stack != Stack::V4;
    let mut c = Cluster::start(test, &[spec("a", "172.17.0.2", NODE_SUBNETS[0]), spec("b", "172.17.0.3", NODE_SUBNETS[1])]).await?;
    let mut pods = Vec::new();
    for (i, (node, ns, name, ip, _, _)) in PODS.iter().enumerate() {
        let p = c.node_mut(node).add_pod(ns, name, ip).await;
        pods.push((p, eval_pod(i)));
    }
    let namespaces = NAMESPACES
        .iter()
        .map(|(n, _, l)| EvalNamespace { name: n.to_string(), labels: l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() })
        .collect();
    let mut w = World { c, pods, namespaces, servers: Vec::new() };
    apply(&w, &[]).await;
    for (p, _) in &w.pods {
        for port in PORTS {
            // Dual-stack: one socket of each kind takes both families (IPv4-mapped); IPv6-only:
            // the same sockets, IPv6 alone.
            w.servers.push(tcp_echo(if dual { p.tcp_listen6(port).await } else { p.tcp_listen(port).await }));
            let ns = p.netns.clone();
            let any = if dual { "::" } else { "0.0.0.0" };
            let u = in_netns(&ns, move || std::net::UdpSocket::bind((any, port))).await.expect("bind udp");
            u.set_nonblocking(true).unwrap();
            w.servers.push(udp_echo(u));
        }
    }
    Some(w)
}


fn udp_echo(u: std::net::UdpSocket) -> tokio::task::JoinHandle<()> {
    let u = tokio::net::UdpSocket::from_std(u).expect("tokio udp");
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = u.recv_from(&mut buf).await {
            let _ = u.send_to(&buf[..n], from).await;
        }
    })
}

/// Node `node`'s state (tests/support/netpol_state.rs).
fn state_json(w: &World, node: &str, policies: &[Value]) -> String {
    let net_namespaces: Vec<Value> = NAMESPACES
        .iter()
        .map(|(n, id, l)| json!({"name": n, "netid": id, "labels": l.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>()}))
        .collect();
    netpol_state::state_json(&w.c, node, net_namespaces, &w.pods, policies)
}

/// Applies the policies on both nodes (each one atomic bundle); returns the warnings.
async fn apply(w: &World, policies: &[Value]) -> Vec<String> {
    let mut warnings = Vec::new();
    for n in w.c.nodes() {
        let r = n.apply(&state_json(w, n.name(), policies)).await;
        assert!(r.problems.is_empty(), "node {}: {:?}", n.name(), r.problems);
        warnings.extend(r.warnings.iter().map(|p| p.to_string()));
    }
    // The bundle is committed to the OpenFlow tables; the datapath's cached megaflows follow
    // when the revalidators get to them (as for any flow change in Open vSwitch). Probing
    // before that would test the cache, not the pipeline: empty it.
    for n in w.c.nodes() {
        n.appctl(&["revalidator/purge"]).await;
    }
    warnings
}

/// Opens a new connection and checks that data comes back (both directions work): true if
/// it did within `timeout`.
async fn probe(src: &Pod, dst: impl Into<IpAddr>, proto: Proto, port: u16, timeout: Duration) -> bool {
    let dst: IpAddr = dst.into();
    match proto {
        Proto::Tcp => {
            let Ok(s) = src.tcp_connect(dst, port, timeout).await else { return false };
            let Ok(mut s) = tokio::net::TcpStream::from_std(s) else { return false };
            let msg = format!("{}->{dst}:{port}", src.ip);
            let echoed = async {
                s.write_all(msg.as_bytes()).await.ok()?;
                let mut buf = vec![0u8; msg.len()];
                s.read_exact(&mut buf).await.ok()?;
                (buf == msg.as_bytes()).then_some(())
            };
            tokio::time::timeout(timeout, echoed).await.ok().flatten().is_some()
        }
        Proto::Udp => {
            // A source port never used before in this run: a reused one could find the
            // conntrack entry of an earlier, allowed exchange (UDP has no handshake to tell a
            // new exchange from an old one).
            let sport = next_udp_port();
            let ns = src.netns.clone();
            let any = if dst.is_ipv6() { "::" } else { "0.0.0.0" };
            let Ok(u) = in_netns(&ns, move || std::net::UdpSocket::bind((any, sport))).await else { return false };
            u.set_nonblocking(true).unwrap();
            let u = tokio::net::UdpSocket::from_std(u).expect("tokio udp");
            let msg = format!("{}->{dst}:{port}", src.ip);
            let echoed = async {
                u.send_to(msg.as_bytes(), (dst, port)).await.ok()?;
                let mut buf = [0u8; 512];
                let n = u.recv(&mut buf).await.ok()?;
                (&buf[..n] == msg.as_bytes()).then_some(())
            };
            tokio::time::timeout(timeout, echoed).await.ok().flatten().is_some()
        }
        // Not in PROTOS: SCTP needs raw-socket pods (tests/netpol_sctp.rs).
        Proto::Sctp => unreachable!("SCTP is probed by tests/netpol_sctp.rs"),
    }
}

static NEXT_UDP_PORT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// UDP client source ports 20000..60000, each used once (then wrapping around).
fn next_udp_port() -> u16 {
    let n = NEXT_UDP_PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (20_000 + n % 40_000) as u16
}

type Case = (usize, usize, Proto, u16);

/// Every (source, destination, protocol, port) with a distinct source and destination.
fn cases(n: usize) -> Vec<Case> {
    let mut out = Vec::new();
    for s in 0..n {
        for d in (0..n).filter(|d| *d != s) {
            for proto in PROTOS {
                for port in PORTS {
                    out.push((s, d, proto, port));
                }
            }
        }
    }
    out
}

/// Applies `policies`, probes the whole matrix and compares it with the evaluator's. Returns
/// the number of probes and of allowed ones.
async fn check_matrix(w: &World, name: &str, policies: &[Value]) -> (usize, usize) {
    check_matrix_in(w, name, policies, false).await
}

/// [`check_matrix`] over IPv6 (`ipv6`, a dual-stack world): the switch gets the policies with
/// every ipBlock translated to the IPv6 plan ([`ipv6_policies`]), the probes go to the pods'
/// IPv6 addresses, and the evaluator judges the original policies by the pods' IPv4
/// addresses — the translation keeps which pods each block holds, so its verdicts are the
/// IPv6 matrix's.
async fn check_matrix_in(w: &World, name: &str, policies: &[Value], ipv6: bool) -> (usize, usize) {
    let on_switch = if ipv6 { ipv6_policies(policies) } else { policies.to_vec() };
    apply(w, &on_switch).await;
    let eval_pods: Vec<EvalPod> = w.pods.iter().map(|(_, e)| e.clone()).collect();
    let ev = Evaluator { namespaces: &w.namespaces, pods: &eval_pods, policies };
    let all = cases(w.pods.len());
    let want: Vec<bool> = all.iter().map(|&(s, d, proto, port)| ev.allowed(&eval_pods[s], &eval_pods[d], proto, port)).collect();
    let pods: Arc<Vec<Pod>> = Arc::new(w.pods.iter().map(|(p, _)| p.clone()).collect());
    let run = |cases: Vec<Case>, timeout: Duration| {
        let pods = pods.clone();
        async move {
            let mut set = tokio::task::JoinSet::new();
            for (i, (s, d, proto, port)) in cases.into_iter().enumerate() {
                let pods = pods.clone();
                let dst: IpAddr = if ipv6 { IpAddr::V6(pods[d].ip6.expect("a dual-stack world")) } else { IpAddr::V4(pods[d].ip) };
                set.spawn(async move { (i, probe(&pods[s], dst, proto, port, timeout).await) });
            }
            let mut got = Vec::new();
            while let Some(r) = set.join_next().await {
                got.push(r.expect("probe task"));
            }
            got.sort();
            got.into_iter().map(|(_, ok)| ok).collect::<Vec<bool>>()
        }
    };
    let mut got = run(all.clone(), PROBE).await;
    // Expected-allowed probes that got no answer: once more, slowly.
    let retry: Vec<usize> = (0..all.len()).filter(|&i| want[i] && !got[i]).collect();
    if !retry.is_empty() {
        let again = run(retry.iter().map(|&i| all[i]).collect(), PROBE_RETRY).await;
        for (k, &i) in retry.iter().enumerate() {
            got[i] = again[k];
        }
    }
    let mut diff = String::new();
    let mut pairs = Vec::new();
    for (i, &(s, d, proto, port)) in all.iter().enumerate() {
        if want[i] != got[i] {
            pairs.push((eval_pods[s].ip, eval_pods[d].ip));
            let _ = writeln!(
                diff,
                "  {} ({}) -> {} ({}) {proto:?}/{port}: expected {}, got {}",
                eval_pods[s].name,
                eval_pods[s].ip,
                eval_pods[d].name,
                eval_pods[d].ip,
                if want[i] { "allowed" } else { "denied" },
                if got[i] { "allowed" } else { "denied" }
            );
        }
    }
    if !diff.is_empty() {
        let mut flows = String::new();
        for n in w.c.nodes() {
            let _ = writeln!(flows, "--- node {} table 80\n{}", n.name(), n.ofctl("dump-flows", "br0", &["table=80"]).await);
            // The conntrack entries between the pairs that differ.
            let ct = n.appctl(&["dpctl/dump-conntrack"]).await;
            let _ = writeln!(flows, "--- node {} conntrack entries of the differing pairs", n.name());
            for &(s, d) in &pairs {
                for l in ct.lines().filter(|l| l.contains(&format!("={s},")) && l.contains(&format!("={d},"))) {
                    let _ = writeln!(flows, "{l}");
                }
            }
        }
        panic!(
            "scenario {name}: the matrix differs from the specification's:\n{diff}policies: {}\n{flows}",
            serde_json::to_string_pretty(policies).unwrap()
        );
    }
    (all.len(), want.iter().filter(|w| **w).count())
}

/// An IPv4 CIDR of the harness's plan as the IPv6 CIDR that holds the same pods: inside a node's
/// /23, the same offset in its /64 (`10.128.2.12/31` -> `fd00:10:128:2::c/127`); a wider one,
/// the IPv6 subnets of the node subnets it contains (both: the IPv6 cluster network, or `::/0`
/// for `0.0.0.0/0`; none: a block holding no pod).
fn ipv6_cidr(v4: &str) -> String {
    let n: ipnet::Ipv4Net = v4.parse().expect("an IPv4 CIDR of the scenario");
    let subnets: Vec<(ipnet::Ipv4Net, ipnet::Ipv6Net)> = NODE_SUBNETS.iter().map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).collect();
    if let Some((s4, s6)) = subnets.iter().find(|(s4, _)| s4.contains(&n)) {
        let offset = u32::from(n.network()) - u32::from(s4.network());
        let addr = Ipv6Addr::from(u128::from(s6.network()) + u128::from(offset));
        return format!("{addr}/{}", 96 + n.prefix_len());
    }
    let held: Vec<&ipnet::Ipv6Net> = subnets.iter().filter(|(s4, _)| n.contains(s4)).map(|(_, s6)| s6).collect();
    match held.as_slice() {
        [] => "fd00:dead::/64".to_string(),
        [one] => one.to_string(),
        _ if n.prefix_len() == 0 => "::/0".to_string(),
        _ => support::nodes::CLUSTER_NETWORK6.to_string(),
    }
}

/// `policies` with every ipBlock's `cidr` and `except` translated by [`ipv6_cidr`].
fn ipv6_policies(policies: &[Value]) -> Vec<Value> {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                if let Some(b) = m.get_mut("ipBlock").and_then(Value::as_object_mut) {
                    if let Some(Value::String(c)) = b.get_mut("cidr") {
                        *c = ipv6_cidr(c);
                    }
                    if let Some(Value::Array(ex)) = b.get_mut("except") {
                        for e in ex.iter_mut() {
                            if let Value::String(s) = e {
                                *s = ipv6_cidr(s);
                            }
                        }
                    }
                }
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut out = policies.to_vec();
    out.iter_mut().for_each(walk);
    out
}

fn np(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// The hand-written scenarios: (name, policies).
fn scenarios() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        ("no policies", vec![]),
        ("default deny ns1", vec![np("ns1", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}))]),
        ("allow same namespace ns1", vec![np("ns1", "same", json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}))]),
        (
            "allow from labelled namespaces",
            vec![np("ns1", "from-b", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]}))],
        ),
        (
            "pod selector",
            vec![np("ns1", "db-from-web", json!({"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}))],
        ),
        (
            "pod and namespace selector in one peer",
            vec![np(
                "ns2",
                "web-of-a",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {"matchLabels": {"app": "web"}}}]}]}),
            )],
        ),
        ("port restricted", vec![np("ns3", "tcp-8080", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "TCP", "port": 8080}]}]}))]),
        ("named port", vec![np("ns1", "http", json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}, {"protocol": "UDP", "port": "http"}]}]}))]),
        (
            "endPort",
            vec![np(
                "ns2",
                "ranges",
                json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "TCP", "port": 8000, "endPort": 8100}, {"protocol": "UDP", "port": 9000, "endPort": 9999}]}]}),
            )],
        ),
        (
            "ipBlock with except",
            vec![np(
                "ns3",
                "block",
                json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.128.0.0/16", "except": ["10.128.2.0/24", "10.128.0.12/32"]}}]}]}),
            )],
        ),
        (
            "union of policies",
            vec![
                np("ns1", "from-ns2-tcp", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}], "ports": [{"port": 8080}]}]})),
                np("ns1", "web-udp", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"protocol": "UDP"}]}]})),
            ],
        ),
        ("partial selection", vec![np("ns2", "deny-db", json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]}))]),
        ("allow all", vec![np("ns1", "all", json!({"podSelector": {}, "ingress": [{}]})), np("ns1", "deny", json!({"podSelector": {}}))]),
        (
            "match expressions",
            vec![np(
                "ns3",
                "exprs",
                json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]},
                       "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}}]}]}),
            )],
        ),
        (
            "namespace name label",
            vec![np("ns2", "from-ns3", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns3"}}}]}]}))],
        ),
        ("egress only: no ingress isolation", vec![np("ns1", "egress", json!({"podSelector": {}, "policyTypes": ["Egress"]}))]),
        ("default deny egress ns2", vec![np("ns2", "deny-egress", json!({"podSelector": {}, "policyTypes": ["Egress"]}))]),
        (
            "egress to pods by label and namespace",
            vec![np(
                "ns1",
                "to-db",
                json!({"podSelector": {"matchLabels": {"app": "web"}}, "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}, {"namespaceSelector": {"matchLabels": {"env": "prod"}}}]}]}),
            )],
        ),
        (
            "egress named port on any destination",
            vec![np("ns3", "http-out", json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "http"}]}]}))],
        ),
        (
            "egress named UDP port to other namespaces",
            vec![np(
                "ns2",
                "udp-http",
                json!({"podSelector": {}, "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["ns2"]}]}}], "ports": [{"protocol": "UDP", "port": "http"}]}]}),
            )],
        ),
        (
            "egress ipBlock with except and endPort",
            vec![np(
                "ns1",
                "block-out",
                json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "10.128.0.0/16", "except": ["10.128.2.0/24"]}}]},
                                                                           {"to": [{"ipBlock": {"cidr": "10.128.2.12/31"}}], "ports": [{"protocol": "TCP", "port": 8000, "endPort": 8080}]}]}),
            )],
        ),
        (
            "egress and ingress together",
            vec![
                np("ns1", "out-to-b", json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]})),
                np("ns2", "in-from-a", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}], "ports": [{"port": 9090}, {"protocol": "UDP", "port": 8080}]}]})),
            ],
        ),
        (
            "both types in one policy",
            vec![np(
                "ns3",
                "both",
                json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress", "Egress"],
                       "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": 8080}]}],
                       "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "web"}}, "namespaceSelector": {}}], "ports": [{"protocol": "UDP"}]}]}),
            )],
        ),
    ]
}

/// A small deterministic generator (xorshift64*), so the scenarios are the same every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize].clone()
    }
}

fn random_selector(r: &mut Rng, keys: &[(&str, &[&str])]) -> Value {
    match r.below(4) {
        0 => json!({}),
        1 => {
            let (k, vs) = r.pick(keys);
            json!({"matchLabels": {k: r.pick(vs)}})
        }
        2 => {
            let (k, vs) = r.pick(keys);
            let op = r.pick(&["In", "NotIn"]);
            json!({"matchExpressions": [{"key": k, "operator": op, "values": [r.pick(vs)]}]})
        }
        _ => {
            let (k, _) = r.pick(keys);
            json!({"matchExpressions": [{"key": k, "operator": r.pick(&["Exists", "DoesNotExist"])}]})
        }
    }
}

/// One random scenario: 1 to 3 policies, each of type Ingress, Egress or both (given or
/// implied), with up to 2 rules per direction of up to 2 peers and ports.
fn random_scenario(seed: u64) -> Vec<Value> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut out = Vec::new();
    for i in 0..1 + r.below(3) {
        let ns = r.pick(&["ns1", "ns2", "ns3"]);
        let pod_keys: &[(&str, &[&str])] = &[("app", &["web", "db"])];
        let mut spec = json!({"podSelector": random_selector(&mut r, pod_keys)});
        let (ingress, egress) = match r.below(3) {
            0 => (true, false),
            1 => (false, true),
            _ => (true, true),
        };
        if ingress {
            spec["ingress"] = json!(random_rules(&mut r, "from"));
        }
        if egress {
            spec["egress"] = json!(random_rules(&mut r, "to"));
        }
        // Explicit types two times in three; else the API server's default (Ingress, and Egress
        // when there are egress rules: an empty egress list then means no egress isolation).
        if r.below(3) != 0 {
            let types: Vec<&str> = [("Ingress", ingress), ("Egress", egress)].iter().filter(|(_, on)| *on).map(|(t, _)| *t).collect();
            spec["policyTypes"] = json!(types);
        }
        out.push(np(ns, &format!("r{i}"), spec));
    }
    out
}

/// Up to 2 random rules, their peers under `peers_key` (`from` or `to`).
fn random_rules(r: &mut Rng, peers_key: &str) -> Vec<Value> {
    let pod_keys: &[(&str, &[&str])] = &[("app", &["web", "db"])];
    let ns_keys: &[(&str, &[&str])] = &[("team", &["a", "b"]), ("env", &["prod"]), ("kubernetes.io/metadata.name", &["ns1", "ns2", "ns3"])];
    let mut rules = Vec::new();
    for _ in 0..r.below(3) {
        let mut rule = serde_json::Map::new();
        if r.below(4) != 0 {
            let mut peers = Vec::new();
            for _ in 0..1 + r.below(2) {
                peers.push(match r.below(4) {
                    0 => json!({"podSelector": random_selector(r, pod_keys)}),
                    1 => json!({"namespaceSelector": random_selector(r, ns_keys)}),
                    2 => json!({"namespaceSelector": random_selector(r, ns_keys), "podSelector": random_selector(r, pod_keys)}),
                    _ => {
                        // (cidr, an except within it).
                        let (cidr, except) = r.pick(&[
                            ("10.128.0.0/23", "10.128.0.12/32"),
                            ("10.128.0.0/14", "10.128.2.8/29"),
                            ("10.128.0.0/14", "10.128.0.0/24"),
                            ("10.128.2.0/24", "10.128.2.12/31"),
                        ]);
                        let except = if r.below(2) == 0 { vec![] } else { vec![except] };
                        json!({"ipBlock": {"cidr": cidr, "except": except}})
                    }
                });
            }
            rule.insert(peers_key.into(), json!(peers));
        }
        if r.below(3) != 0 {
            let mut ports = Vec::new();
            for _ in 0..1 + r.below(2) {
                ports.push(match r.below(5) {
                    0 => json!({"protocol": "TCP", "port": r.pick(&PORTS)}),
                    1 => json!({"protocol": "UDP", "port": r.pick(&PORTS)}),
                    2 => json!({"protocol": r.pick(&["TCP", "UDP"]), "port": "http"}),
                    3 => json!({"protocol": r.pick(&["TCP", "UDP"]), "port": 8000, "endPort": r.pick(&[8080u16, 9000, 9090])}),
                    _ => json!({"protocol": r.pick(&["TCP", "UDP"])}),
                });
            }
            rule.insert("ports".into(), json!(ports));
        }
        rules.push(Value::Object(rule));
    }
    rules
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truth_table_hand_written_and_random_scenarios_on_two_nodes() {
    let Some(w) = world("truth_table").await else { return };
    let (mut probes, mut allowed, mut n) = (0, 0, 0);
    let mut named: Vec<(String, Vec<Value>)> = scenarios().into_iter().map(|(n, p)| (n.to_string(), p)).collect();
    named.extend((0..RANDOM_SCENARIOS).map(|s| (format!("random seed {s}"), random_scenario(s))));
    // NETPOL_ONLY=substring runs only the scenarios whose name contains it (debugging).
    let only = std::env::var("NETPOL_ONLY").unwrap_or_default();
    for (name, policies) in named.iter().filter(|(n, _)| n.contains(&only)) {
        let (p, a) = check_matrix(&w, name, policies).await;
        probes += p;
        allowed += a;
        n += 1;
    }
    eprintln!("truth table: {n} scenarios, {probes} probes ({allowed} allowed, {} denied), 6 pods on 2 nodes", probes - allowed);
}

/// The truth table on dual-stack nodes, in both families: every scenario's matrix over IPv6
/// (ipBlocks translated to the IPv6 plan, see [`check_matrix_in`]) and over IPv4, against the
/// same evaluator. Same node and across the tunnel, as the IPv4 table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truth_table_in_both_families_on_dual_stack_nodes() {
    let Some(w) = world_with("truth_table_dual_stack", Stack::Dual).await else { return };
    let (mut probes, mut n) = (0, 0);
    let mut named: Vec<(String, Vec<Value>)> = scenarios().into_iter().map(|(n, p)| (n.to_string(), p)).collect();
    named.extend((0..RANDOM_SCENARIOS / 2).map(|s| (format!("random seed {s}"), random_scenario(s))));
    let only = std::env::var("NETPOL_ONLY").unwrap_or_default();
    for (name, policies) in named.iter().filter(|(n, _)| n.contains(&only)) {
        probes += check_matrix_in(&w, &format!("{name} (IPv6)"), policies, true).await.0;
        probes += check_matrix_in(&w, &format!("{name} (IPv4, dual-stack)"), policies, false).await.0;
        n += 1;
    }
    eprintln!("dual-stack truth table: {n} scenarios in both families, {probes} probes, 6 pods on 2 nodes");
}

/// The truth table on IPv6-only nodes (no IPv4 anywhere: state, pipeline, pods): every
/// scenario's matrix over IPv6 (ipBlocks translated to the IPv6 plan, see
/// [`check_matrix_in`]) against the same evaluator, same node and across the tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truth_table_on_ipv6_only_nodes() {
    let Some(w) = world_with("truth_table_ipv6_only", Stack::V6Only).await else { return };
    let flows = w.c.node("a").ofctl("dump-flows", "br0", &[]).await;
    let ipv4 = |l: &&str| {
        let m = l.split(" actions=").next().unwrap_or_default();
        m.split([',', ' ']).any(|t| matches!(t, "ip" | "arp" | "tcp" | "udp" | "sctp" | "icmp") || t.starts_with("nw_src=") || t.starts_with("nw_dst="))
    };
    let v4: Vec<&str> = flows.lines().filter(ipv4).collect();
    assert!(v4.is_empty(), "IPv4 flows on an IPv6-only node:\n{}", v4.join("\n"));
    assert!(flows.lines().any(|l| l.contains("ipv6")), "no IPv6 flow:\n{flows}");
    let (mut probes, mut n) = (0, 0);
    let mut named: Vec<(String, Vec<Value>)> = scenarios().into_iter().map(|(n, p)| (n.to_string(), p)).collect();
    named.extend((0..RANDOM_SCENARIOS / 2).map(|s| (format!("random seed {s}"), random_scenario(s))));
    let only = std::env::var("NETPOL_ONLY").unwrap_or_default();
    for (name, policies) in named.iter().filter(|(n, _)| n.contains(&only)) {
        probes += check_matrix_in(&w, &format!("{name} (IPv6-only)"), policies, true).await.0;
        n += 1;
    }
    assert!(n > 0, "no scenario matched NETPOL_ONLY={only:?}");
    eprintln!("IPv6-only truth table: {n} scenarios, {probes} probes, 6 pods on 2 nodes");
}


/// Established connections survive a change that still allows them; new connections stop
/// when a change denies them; during repeated swaps between two versions that both allow a
/// probe, the probe never fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_changes_keep_allowed_connections() {
    let Some(w) = world("policy_changes").await else { return };
    let p = |i: usize| w.pods[i].0.clone();
    let (p1a, p1b, p2a) = (p(0), p(1), p(2));
    let allow_both = np("ns1", "v", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}], "ports": [{"port": 8080}, {"port": 9090}]}]}));
    let allow_8080 = np("ns1", "v", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}], "ports": [{"port": 8080}]}]}));
    // The same reach for p2a by other means: its labels and namespace in one peer.
    let allow_8080_by_pod = np(
        "ns1",
        "v",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}, "podSelector": {"matchLabels": {"app": "db"}}}], "ports": [{"protocol": "TCP", "port": 8080}]}]}),
    );
    let deny = np("ns1", "v", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    apply(&w, std::slice::from_ref(&allow_both)).await;

    // Established: p2a -> p1a (same node) and p2a -> p1b (across nodes), on 8080.
    let mut established = Vec::new();
    for dst in [&p1a, &p1b] {
        let s = p2a.tcp_connect(dst.ip, 8080, PROBE_RETRY).await.expect("connect while allowed");
        established.push((dst.ip, tokio::net::TcpStream::from_std(s).unwrap()));
    }
    async fn echo(s: &mut tokio::net::TcpStream, what: &str) {
        let msg = what.as_bytes();
        s.write_all(msg).await.unwrap_or_else(|e| panic!("{what}: write: {e}"));
        let mut buf = vec![0u8; msg.len()];
        tokio::time::timeout(PROBE_RETRY, s.read_exact(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{what}: no echo"))
            .unwrap_or_else(|e| panic!("{what}: read: {e}"));
        assert_eq!(buf, msg, "{what}");
    }
    for (ip, s) in &mut established {
        echo(s, &format!("before the change to {ip}")).await;
    }
    apply(&w, std::slice::from_ref(&allow_8080)).await;
    for (ip, s) in &mut established {
        echo(s, &format!("after a change that still allows {ip}:8080")).await;
    }
    for dst in [&p1a, &p1b] {
        assert!(probe(&p2a, dst.ip, Proto::Tcp, 8080, PROBE_RETRY).await, "new connection to {}:8080 still allowed", dst.ip);
        assert!(!probe(&p2a, dst.ip, Proto::Tcp, 9090, PROBE).await, "new connection to {}:9090 now denied", dst.ip);
    }

    // Swaps between two versions that both allow p2a -> p1a/p1b TCP 8080: a probe loop of new
    // connections and an established one, running while the policy is swapped, never fails.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut loops = Vec::new();
    for dst in [p1a.ip, p1b.ip] {
        let (src, stop) = (p2a.clone(), stop.clone());
        loops.push(tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(probe(&src, dst, Proto::Tcp, 8080, PROBE_RETRY).await, "probe {n} to {dst}:8080 failed during swaps");
                n += 1;
            }
            n
        }));
    }
    for i in 0..12 {
        let v = if i % 2 == 0 { &allow_8080_by_pod } else { &allow_8080 };
        apply(&w, std::slice::from_ref(v)).await;
        for (ip, s) in &mut established {
            echo(s, &format!("established to {ip} during swap {i}")).await;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in loops {
        let n = l.await.expect("probe loop");
        assert!(n > 0, "the probe loop ran");
    }

    // A change that denies: new connections stop.
    apply(&w, std::slice::from_ref(&deny)).await;
    for dst in [&p1a, &p1b] {
        assert!(!probe(&p2a, dst.ip, Proto::Tcp, 8080, PROBE).await, "new connection to {}:8080 after deny", dst.ip);
    }
    // Replies of connections the isolated pods open themselves still come back.
    assert!(probe(&p1a, p2a.ip, Proto::Tcp, 8080, PROBE_RETRY).await, "isolated p1a -> p2a: reply allowed");
    assert!(probe(&p1b, p2a.ip, Proto::Udp, 9090, PROBE_RETRY).await, "isolated p1b -> p2a (across nodes): UDP reply allowed");
}
