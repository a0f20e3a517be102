//! Pod → Service IP → endpoint pod with real packets, on two nodes networked through CNI.
//!
//! A Service's traffic leaves the pod for tun0 (table 60) and comes back from the node's own
//! network stack after kube-proxy's DNAT. kube-proxy is not here: each node's namespace gets an
//! nftables `dnat` rule per Service (what kube-proxy's rules amount to for one endpoint), made
//! by the test with `nft` as an independent stand-in. Everything else is the agent's: tun0,
//! routes, sysctls, its nftables table, the flows.
//!
//! - subnet and multitenant: the node masquerades what leaves it from the cluster network (openshift-sdn
//!   VERSION 3's rule), so the endpoint answers the gateway and the node un-NATs the reply.
//! - networkpolicy: service traffic keeps the client's address (VERSION 4), so NetworkPolicy
//!   applies to it as to direct traffic: the same policy allows or denies both, same-node and
//!   cross-node, and replies find their way back through the node that did the DNAT.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::cninode::{can_run, container, in_ns, NodeAgent, PodNs};
use support::nodes::{in_netns, tcp_echo, Cluster, NodeSpec};

const PORT: u16 = 8080;
/// How long a probe waits for its echo before it counts as denied.
const PROBE: Duration = Duration::from_millis(1500);
/// The retry of an expected-allowed probe that got no answer (a slow machine).
const PROBE_RETRY: Duration = Duration::from_secs(6);

/// (name, netid, label team=...).
const NAMESPACES: [(&str, u32, &str); 3] = [("team-a", 11, "a"), ("team-b", 12, "b"), ("team-c", 13, "c")];
/// (pod, node, namespace): clients in team-a and team-c on both nodes, endpoints in team-b.
const PODS: [(&str, usize, &str); 6] =
    [("a-ta", 0, "team-a"), ("a-tc", 0, "team-c"), ("a-tb", 0, "team-b"), ("b-ta", 1, "team-a"), ("b-tc", 1, "team-c"), ("b-tb", 1, "team-b")];
/// (service IP, the node whose stand-in kube-proxy DNATs it, endpoint pod).
const SERVICES: [(&str, usize, &str); 3] = [
    // Client and endpoint on node a.
    ("172.30.0.10", 0, "a-tb"),
    // Client on node a, endpoint on node b.
    ("172.30.0.11", 0, "b-tb"),
    // Client on node b, endpoint on node a.
    ("172.30.0.12", 1, "a-tb"),
];

struct Setup {
    // Drop order: servers, pods, agents, the cluster (switches, namespaces).
    servers: Vec<tokio::task::JoinHandle<()>>,
    pods: Vec<(&'static str, PodNs, Ipv4Addr)>,
    agents: Vec<NodeAgent>,
    cluster: Cluster,
    plugin: &'static str,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

/// Node `node`'s state; `remote`: the other node's pods (namespace, name, IP), NetworkPolicy
/// peers (an egress rule to a namespace names its pods, local and remote).
fn state(cluster: &Cluster, node: &str, plugin: &str, policies: &str, remote: &[(&str, &str, Ipv4Addr)]) -> String {
    let ids: Vec<(&str, u32)> = NAMESPACES.iter().map(|(n, id, _)| (*n, *id)).collect();
    let mut s = cluster.state_yaml(node, plugin, &ids);
    // The Services, in the endpoints' namespace (multitenant's table 60 admits a VNID to its
    // own namespaces' Services only).
    s.push_str("services:\n");
    for (i, (svc, _, _)) in SERVICES.iter().enumerate() {
        s.push_str(&format!("  - {{namespace: team-b, name: svc{i}, clusterIP: {svc}, ports: [{{protocol: TCP, port: {PORT}}}]}}\n"));
    }
    for (n, id, team) in NAMESPACES {
        s = s.replace(&format!("  - {{name: {n}, netid: {id}}}"), &format!("  - {{name: {n}, netid: {id}, labels: {{team: {team}}}}}"));
    }
    if !remote.is_empty() {
        s.push_str("remotePods:\n");
        for (ns, name, ip) in remote {
            s.push_str(&format!("  - {{namespace: {ns}, name: {name}, ip: {ip}}}\n"));
        }
    }
    if !policies.is_empty() {
        s.push_str("networkPolicies:\n");
        s.push_str(policies);
    }
    s
}

async fn setup(test: &str, plugin: &'static str) -> Option<Setup> {
    if !can_run() {
        // Never taken under CI: can_run panics there when the test cannot run.
        return None;
    }
    let cluster =
        Cluster::start(test, &[NodeSpec::new("a", "172.17.0.2", "10.128.0.0/23"), NodeSpec::new("b", "172.17.0.3", "10.128.2.0/23")])
            .await?;
    let mut agents = Vec::new();
    for name in ["a", "b"] {
        let node = cluster.node(name);
        agents.push(NodeAgent::start(&node.netns, node.sb.dir(), &state(&cluster, name, plugin, "", &[])).await);
    }
    let mut pods = Vec::new();
    let mut servers = Vec::new();
    for (i, (name, node, ns)) in PODS.iter().enumerate() {
        let p = PodNs::new(name);
        let r = agents[*node].cni("add", ns, name, &container(700 + i as u32), &p.path());
        assert!(r.ok(), "ADD {name}: {:?}\n{}", r.out, agents[*node].log());
        let ip: Ipv4Addr = r.addr().parse().expect("pod address");
        let l = in_netns(&p.name, || std::net::TcpListener::bind(("0.0.0.0", PORT))).await.expect("listen");
        l.set_nonblocking(true).unwrap();
        servers.push(tcp_echo(l));
        pods.push((*name, p, ip));
    }
    let s = Setup { servers, pods, agents, cluster, plugin };
    // kube-proxy's part, for one endpoint per Service: DNAT in the node's namespace.
    for (i, ns) in ["a", "b"].iter().map(|n| s.cluster.node(n).netns.clone()).enumerate() {
        let mut rules = String::from("table ip kube-proxy-standin {\n chain pre { type nat hook prerouting priority -100; }\n}\n");
        for (svc, node, ep) in SERVICES.iter().filter(|(_, n, _)| *n == i) {
            let _ = node;
            rules.push_str(&format!("add rule ip kube-proxy-standin pre ip daddr {svc} tcp dport {PORT} dnat to {}:{PORT}\n", s.ip(ep)));
        }
        let f = s.cluster.node(["a", "b"][i]).sb.dir().join("kube-proxy.nft");
        std::fs::write(&f, rules).unwrap();
        let (ok, out) = in_ns(&ns, &["nft", "-f", f.to_str().unwrap()]);
        assert!(ok, "nft -f in {ns}: {out}");
    }
    Some(s)
}


impl Setup {
    /// Every node's agent says it is ready (issue 32: tests that change something end so).
    async fn ready_again(&self, what: &str) {
        for a in &self.agents {
            a.ready_again(&format!("{what} (agent in {})", a.ns)).await;
        }
    }

    fn pod(&self, name: &str) -> &(&'static str, PodNs, Ipv4Addr) {
        self.pods.iter().find(|(n, _, _)| *n == name).unwrap_or_else(|| panic!("no pod {name}"))
    }
    fn ip(&self, name: &str) -> Ipv4Addr {
        self.pod(name).2
    }

    /// A new TCP connection from pod `from` to `dst:PORT` that echoes data both ways.
    async fn probe(&self, from: &str, dst: Ipv4Addr, timeout: Duration) -> bool {
        let addr = SocketAddr::from((dst, PORT));
        let ns = self.pod(from).1.name.clone();
        let connect = move || std::net::TcpStream::connect_timeout(&addr, timeout).and_then(|s| s.set_nonblocking(true).map(|_| s));
        let Ok(s) = in_netns(&ns, connect).await else { return false };
        let Ok(mut s) = tokio::net::TcpStream::from_std(s) else { return false };
        let msg = format!("{from}->{dst}");
        let echoed = async {
            s.write_all(msg.as_bytes()).await.ok()?;
            let mut buf = vec![0u8; msg.len()];
            s.read_exact(&mut buf).await.ok()?;
            (buf == msg.as_bytes()).then_some(())
        };
        tokio::time::timeout(timeout, echoed).await.ok().flatten().is_some()
    }

    /// Probes and compares with `want`; an expected-allowed probe is retried once with a
    /// longer timeout (an unexpected answer never is). Returns a mismatch description.
    async fn check(&self, from: &str, dst: Ipv4Addr, what: &str, want: bool) -> Option<String> {
        let mut got = self.probe(from, dst, PROBE).await;
        if want && !got {
            got = self.probe(from, dst, PROBE_RETRY).await;
        }
        (got != want).then(|| format!("{from} -> {what} ({dst}): want {}, got {}", verdict(want), verdict(got)))
    }

    /// Every client pod to every Service its node DNATs, and straight to the endpoint.
    async fn matrix(&self, allowed: impl Fn(&str) -> bool) -> Vec<String> {
        self.matrix_of(&["team-a", "team-c"], allowed).await
    }

    /// [`matrix`](Self::matrix) with the clients of `namespaces`.
    async fn matrix_of(&self, namespaces: &[&str], allowed: impl Fn(&str) -> bool) -> Vec<String> {
        let mut bad = Vec::new();
        for (svc, node, ep) in SERVICES {
            for (client, _, _) in PODS.iter().filter(|(c, n, ns)| *n == node && namespaces.contains(ns) && *c != ep) {
                let want = allowed(client);
                bad.extend(self.check(client, svc.parse().unwrap(), &format!("service {svc} (endpoint {ep})"), want).await);
                bad.extend(self.check(client, self.ip(ep), &format!("pod {ep}"), want).await);
            }
        }
        bad
    }

    /// Writes the policies into both agents' state files and waits until both switches show
    /// `marker` in some flow (`None`: no flow for a selected pod is left in tables 80 and 27).
    async fn set_policies(&self, policies: &str, marker: Option<&str>) {
        for (i, a) in self.agents.iter().enumerate() {
            let name = ["a", "b"][i];
            let remote: Vec<(&str, &str, Ipv4Addr)> =
                PODS.iter().filter(|(_, n, _)| *n != i).map(|(pod, _, ns)| (*ns, *pod, self.ip(pod))).collect();
            std::fs::write(&a.state, state(&self.cluster, name, self.plugin, policies, &remote)).unwrap();
        }
        // The agents reload the state file; wait until table 80 of both has the change, then
        // empty the datapath's flow cache (see tests/netpol.rs: probe the pipeline, not it).
        let mut done = false;
        for _ in 0..300 {
            done = true;
            for n in self.cluster.nodes() {
                done &= match marker {
                    Some(m) => n.ofctl("dump-flows", "br0", &[]).await.contains(m),
                    None => {
                        !n.ofctl("dump-flows", "br0", &["table=80"]).await.contains("nw_dst=10.128.")
                            && !n.ofctl("dump-flows", "br0", &["table=27"]).await.contains("nw_src=10.128.")
                    }
                };
            }
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(done, "the agents did not apply the policies ({marker:?}):\n{}", self.diagnostics().await);
        for n in self.cluster.nodes() {
            n.appctl(&["revalidator/purge"]).await;
        }
    }

    async fn diagnostics(&self) -> String {
        let mut s = self.cluster.diagnostics().await;
        for (i, a) in self.agents.iter().enumerate() {
            s.push_str(&format!("\n--- agent {i} log\n{}", a.log()));
            s.push_str(&format!("\n--- nft of node {i}\n{}", in_ns(&a.ns, &["nft", "list", "ruleset"]).1));
        }
        s
    }
}

fn verdict(b: bool) -> &'static str {
    if b {
        "connected"
    } else {
        "no connection"
    }
}

#[tokio::test]
async fn subnet_services_reach_endpoints_on_both_nodes() {
    let Some(s) = setup("subnet_services_reach_endpoints_on_both_nodes", "subnet").await else { return };
    let bad = s.matrix(|_| true).await;
    assert!(bad.is_empty(), "{bad:#?}\n{}", s.diagnostics().await);
    s.ready_again("after the Service checks").await;
}

#[tokio::test]
async fn multitenant_services_reach_their_own_vnid_only() {
    let Some(s) = setup("multitenant_services_reach_their_own_vnid_only", "multitenant").await else { return };
    // team-b's pods reach team-b's Services (and the endpoints) on both nodes...
    let bad = s.matrix_of(&["team-b"], |_| true).await;
    assert!(bad.is_empty(), "team-b: {bad:#?}\n{}", s.diagnostics().await);
    // ...other VNIDs neither (table 60 has no flow for them; table 80 isolates the pods).
    let bad = s.matrix(|_| false).await;
    assert!(bad.is_empty(), "team-a, team-c: {bad:#?}\n{}", s.diagnostics().await);
    s.ready_again("after the Service checks").await;
}

/// team-b admits team-a only (namespaceSelector): through a Service exactly as directly.
const ONLY_TEAM_A: &str = "  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: from-team-a, namespace: team-b}
    spec:
      podSelector: {}
      ingress: [{from: [{namespaceSelector: {matchLabels: {team: a}}}]}]
";

/// team-b admits the pods at team-a's addresses only (ipBlock, no VNID involved).
fn only_team_a_by_address(s: &Setup) -> String {
    let mut p = String::from(
        "  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {name: from-addresses, namespace: team-b}
    spec:
      podSelector: {}
      ingress:
        - from:
",
    );
    for pod in ["a-ta", "b-ta"] {
        p.push_str(&format!("            - ipBlock: {{cidr: {}/32}}\n", s.ip(pod)));
    }
    p
}

#[tokio::test]
async fn networkpolicy_applies_to_service_traffic() {
    let Some(s) = setup("networkpolicy_applies_to_service_traffic", "networkpolicy").await else { return };
    // No policy: every client reaches every Service.
    let bad = s.matrix(|_| true).await;
    assert!(bad.is_empty(), "no policy: {bad:#?}\n{}", s.diagnostics().await);
    // By namespace (the VNID of traffic coming back from the node is restored from its source).
    s.set_policies(ONLY_TEAM_A, Some("reg0=0xb")).await;
    let bad = s.matrix(|c| c.ends_with("ta")).await;
    assert!(bad.is_empty(), "namespaceSelector: {bad:#?}\n{}", s.diagnostics().await);
    // By address: the client's own address is kept (no masquerade inside the cluster network).
    let marker = format!("nw_src={}", s.ip("a-ta"));
    s.set_policies(&only_team_a_by_address(&s), Some(&marker)).await;
    let bad = s.matrix(|c| c.ends_with("ta")).await;
    assert!(bad.is_empty(), "ipBlock: {bad:#?}\n{}", s.diagnostics().await);
    // Egress is judged by the endpoint, after the DNAT: team-c may send only to team-b's
    // pods (namespaceSelector) — its Service connections pass, as do team-a's (no policy).
    let goto = |dst: &str, port: &str| format!("nw_dst={}{port} actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[2])),goto_table:28", s.ip(dst));
    s.set_policies(&egress_of_team_c("{namespaceSelector: {matchLabels: {team: b}}}"), Some(&goto("b-tb", ""))).await;
    let bad = s.matrix(|_| true).await;
    assert!(bad.is_empty(), "team-c egress to team-b: {bad:#?}\n{}", s.diagnostics().await);
    // To team-a only: neither the Services (their endpoints are team-b's) nor the endpoints.
    s.set_policies(&egress_of_team_c("{namespaceSelector: {matchLabels: {team: a}}}"), Some(&goto("b-ta", ""))).await;
    let bad = s.matrix(|c| c.ends_with("ta")).await;
    assert!(bad.is_empty(), "team-c egress to team-a: {bad:#?}\n{}", s.diagnostics().await);
    // By the endpoints' addresses and port (ipBlock + port): allowed again.
    let to = format!("{{ipBlock: {{cidr: {}/32}}}}, {{ipBlock: {{cidr: {}/32}}}}], ports: [{{port: {PORT}}}", s.ip("a-tb"), s.ip("b-tb"));
    s.set_policies(&egress_of_team_c(&to), Some(&goto("b-tb", &format!(",tp_dst={PORT}")))).await;
    let bad = s.matrix(|_| true).await;
    assert!(bad.is_empty(), "team-c egress by endpoint address: {bad:#?}\n{}", s.diagnostics().await);
    // And back to open.
    s.set_policies("", None).await;
    let bad = s.matrix(|_| true).await;
    assert!(bad.is_empty(), "policy removed: {bad:#?}\n{}", s.diagnostics().await);
    s.ready_again("after the policy was set and removed").await;
}

/// team-c's pods may send only to `to` (peers; or peers, `]`, and more of the rule, e.g. its
/// `ports: [...` without the closing bracket).
fn egress_of_team_c(to: &str) -> String {
    format!(
        "  - apiVersion: networking.k8s.io/v1
    kind: NetworkPolicy
    metadata: {{name: egress, namespace: team-c}}
    spec:
      podSelector: {{}}
      policyTypes: [Egress]
      egress: [{{to: [{to}]}}]
"
    )
}
