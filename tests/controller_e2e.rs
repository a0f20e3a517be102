//! A cluster that only the controller prepares (issue 33, end to end): three nodes (network
//! namespaces, each with its own ovsdb-server, ovs-vswitchd and `sdn-node run` in Kubernetes
//! mode), `sdn-node controller`, and the fake API server, which holds only what kubeadm and a
//! kubelet would write (Nodes with podCIDRs and InternalIPs, Namespaces, Pods, a
//! NetworkPolicy). Every ClusterNetwork, HostSubnet and NetNamespace is the controller's.
//! Pods are set up through libcni calling `sdn-node-cni`; real packets decide.
//!
//! The runtime has threads of its own for the fake API server: libcni and ping are blocking
//! calls of the test, and the agents call the API server meanwhile.
//!
//! The agents reach the API server through the underlay: the fake serves a second listener
//! bound inside the underlay namespace (172.17.0.1), besides the one the controller and the
//! test use on the host's loopback.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use support::cninode::{can_run, container, ping, NodeAgent, PodNs};
use support::controller::Controller;
use support::fake_kube::FakeKube;
use support::nodes::{in_netns, ip_in, Cluster, NodeSpec};

/// The underlay bridge's own address (the API server's, for the agents).
const API_IP: &str = "172.17.0.1";

struct Setup {
    // Drop order: pods, agents, controller, cluster.
    pods: BTreeMap<&'static str, (PodNs, String)>,
    agents: BTreeMap<&'static str, NodeAgent>,
    controller: Controller,
    cluster: Cluster,
    fake: FakeKube,
    _dir: tempfile::TempDir,
}

fn node_obj(spec: &NodeSpec) -> Value {
    let name = spec.host();
    json!({"metadata": {"name": name, "uid": format!("uid-{name}")},
           "spec": {"podCIDR": spec.subnet.to_string(), "podCIDRs": [spec.subnet.to_string()]},
           "status": {"addresses": [{"type": "InternalIP", "address": spec.host_ip.to_string()}, {"type": "Hostname", "address": name}],
                      "conditions": [{"type": "Ready", "status": "False", "reason": "NetworkPluginNotReady"}]}})
}

/// Three nodes, the controller, one agent per node; `plugin` is the controller's `--plugin`.
async fn setup(test: &str, plugin: &str) -> Option<Setup> {
    if !can_run() {
        return None;
    }
    let specs = [
        NodeSpec::new("a", "172.17.0.2", "10.128.0.0/23"),
        NodeSpec::new("b", "172.17.0.3", "10.128.2.0/23"),
        NodeSpec::new("c", "172.17.0.4", "10.128.4.0/23"),
    ];
    let cluster = Cluster::start(test, &specs).await?;
    let fake = FakeKube::start().await;
    // The agents' way to the API server: the underlay bridge gets an address, and the fake a
    // listener made inside the underlay namespace.
    let ul = format!("{}-ul", cluster.prefix);
    ip_in(&ul, &format!("addr add {API_IP}/24 dev ul")).await;
    // The netdev datapath forwards partial checksums unfixed: the API server's side computes
    // its own (TX checksum offload off), as pods' interfaces do (docs/testing.md).
    let (ok, out) = support::cninode::in_ns(&ul, &["ethtool", "-K", "ul", "tx", "off"]);
    assert!(ok, "ethtool -K ul tx off: {out}");
    for i in 0..3 {
        let (ok, out) = support::cninode::in_ns(&ul, &["ethtool", "-K", &format!("n{i}"), "tx", "off"]);
        assert!(ok, "ethtool -K n{i} tx off: {out}");
    }
    let listener =
        in_netns(&ul, || std::net::TcpListener::bind(format!("{API_IP}:0")).expect("bind in the underlay")).await;
    let agent_api = fake.serve_also(listener).await;
    let dir = tempfile::tempdir().unwrap();
    let agent_kubeconfig = fake.kubeconfig_for(dir.path(), "agents", agent_api);

    for s in &specs {
        fake.put("nodes", node_obj(s));
    }
    for ns in ["default", "team-a", "team-b"] {
        fake.put("namespaces", json!({"metadata": {"name": ns, "uid": format!("uid-{ns}"), "labels": {"kubernetes.io/metadata.name": ns}}}));
    }
    let controller = Controller::spawn(&fake, dir.path(), "controller-0", &["--plugin", plugin]);
    controller.settled("the controller prepared the cluster").await;

    // Each node reaches the API server over the underlay (else nothing below can work).
    for short in ["a", "b", "c"] {
        let answer = in_netns(&cluster.node(short).netns, move || {
            use std::io::{Read, Write};
            let mut s =
                std::net::TcpStream::connect_timeout(&agent_api, Duration::from_secs(5)).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
            s.write_all(b"GET /version HTTP/1.0\r\nHost: x\r\n\r\n").map_err(|e| e.to_string())?;
            let mut out = String::new();
            s.read_to_string(&mut out).map_err(|e| e.to_string())?;
            Ok::<String, String>(out)
        })
        .await;
        assert!(
            answer.as_ref().is_ok_and(|a| a.contains("gitVersion")),
            "node {short} cannot reach the API server at {agent_api}: {answer:?}"
        );
    }
    let mut agents = BTreeMap::new();
    for (short, s) in [("a", &specs[0]), ("b", &specs[1]), ("c", &specs[2])] {
        let node = cluster.node(short);
        let kc = agent_kubeconfig.to_str().unwrap().to_string();
        let host = s.host();
        let agent =
            NodeAgent::start_with(&node.netns, node.sb.dir(), "", &["--kubeconfig", &kc, "--node", &host]).await;
        agents.insert(short, agent);
    }
    Some(Setup { pods: BTreeMap::new(), agents, controller, cluster, fake, _dir: dir })
}

impl Setup {
    /// A pod as kubelet makes it: the Pod object first (bound to its node), then CNI ADD, then
    /// its status.podIP (what other nodes learn peers from).
    fn add_pod(&mut self, name: &'static str, node: &'static str, namespace: &str, labels: Value, n: u32) {
        let host = self.cluster.node(node).spec.host();
        let mut pod = json!({"metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"), "labels": labels},
                             "spec": {"nodeName": host, "containers": [{"name": "c", "image": "x"}]},
                             "status": {"phase": "Pending"}});
        self.fake.put("pods", pod.clone());
        let p = PodNs::new(name);
        let agent = &self.agents[node];
        let r = agent.cni("add", namespace, name, &container(n), &p.path());
        assert!(r.ok(), "ADD {name} on {node}: {:?}\n{}", r.out, agent.log());
        let ip = r.addr();
        pod["status"] = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]});
        self.fake.put("pods", pod);
        self.pods.insert(name, (p, ip));
    }

    fn reach(&self, from: &str, to: &str) -> bool {
        ping(&self.pods[from].0.name, &self.pods[to].1)
    }

    /// Polls (bounded) until `from` reaches `to` as wanted; the agents converge on their own.
    async fn expect(&self, from: &str, to: &str, want: bool, what: &str) {
        for _ in 0..40 {
            if self.reach(from, to) == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("{what}: {from} -> {to} ({}) should be {}", self.pods[to].1, if want { "reached" } else { "blocked" });
    }

    async fn ready_again(&self, what: &str) {
        for (n, a) in &self.agents {
            a.ready_again(&format!("{what} (agent of node {n})")).await;
        }
        self.controller.ready_again(what).await;
    }

    fn netid(&self, ns: &str) -> u64 {
        self.fake
            .object("netnamespaces", "", ns)
            .and_then(|n| n["netid"].as_u64())
            .unwrap_or_else(|| panic!("NetNamespace {ns}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_prepared_by_the_controller_networks_pods_across_three_nodes() {
    let Some(mut s) = setup("controller_e2e_multitenant", "multitenant").await else { return };
    // The agents took the HostSubnets the controller wrote from the podCIDRs.
    for (short, sub) in [("a", "10.128.0.0/23"), ("b", "10.128.2.0/23"), ("c", "10.128.4.0/23")] {
        let h = s.fake.object("hostsubnets", "", &format!("node-{short}")).unwrap();
        assert_eq!(
            (h["subnet"].as_str(), h["hostIP"].as_str()),
            (Some(sub), Some(format!("172.17.0.{}", 1 + (short.as_bytes()[0] - b'a' + 1)).as_str()))
        );
    }
    // Once ready, each agent told the cluster its node's network is available.
    for short in ["a", "b", "c"] {
        let name = format!("node-{short}");
        let mut ok = false;
        for _ in 0..200 {
            let n = s.fake.object("nodes", "", &name).unwrap();
            let conds = n["status"]["conditions"].as_array().cloned().unwrap_or_default();
            if conds.iter().any(|c| c["type"] == "NetworkUnavailable" && c["status"] == "False") {
                assert!(conds.iter().any(|c| c["type"] == "Ready"), "other conditions kept: {conds:?}");
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ok, "{name}: NetworkUnavailable never False: {:#}", s.fake.object("nodes", "", &name).unwrap());
    }
    let (ta, tb) = (s.netid("team-a"), s.netid("team-b"));
    assert!(ta != tb && ta >= 10 && tb >= 10 && s.netid("default") == 0);

    s.add_pod("a-ta", "a", "team-a", json!({}), 700);
    s.add_pod("b-ta", "b", "team-a", json!({}), 701);
    s.add_pod("c-tb", "c", "team-b", json!({}), 702);
    s.add_pod("c-def", "c", "default", json!({}), 703);
    // Same VNID across nodes; different VNIDs isolated; VNID 0 reaches all.
    s.expect("a-ta", "b-ta", true, "team-a across nodes").await;
    s.expect("b-ta", "a-ta", true, "team-a across nodes, back").await;
    s.expect("a-ta", "c-tb", false, "team-a to team-b").await;
    s.expect("c-tb", "b-ta", false, "team-b to team-a").await;
    s.expect("c-def", "a-ta", true, "default reaches team-a").await;
    s.expect("b-ta", "c-def", true, "team-a reaches default").await;
    assert!(ping(&s.pods["a-ta"].0.name, "10.128.4.1"), "a remote gateway");

    // team-b joins team-a through openshift-sdn's annotation: the controller renumbers it,
    // every agent follows, and the two reach each other across nodes.
    let mut n = s.fake.object("netnamespaces", "", "team-b").unwrap();
    n["metadata"]["annotations"] = json!({"pod.network.openshift.io/multitenant.change-network": "join:team-a"});
    s.fake.put("netnamespaces", n);
    s.expect("a-ta", "c-tb", true, "after team-b joined team-a").await;
    s.expect("c-tb", "b-ta", true, "after team-b joined team-a, back").await;
    assert_eq!(s.netid("team-b"), ta);

    // A Node deleted: the controller deletes its HostSubnet, and the other nodes drop its
    // subnet's flows (the tunnel to 172.17.0.4, routes to 10.128.4.0/23).
    s.fake.delete("nodes", "", "node-c");
    let mut gone = false;
    for _ in 0..200 {
        let flows = s.cluster.node("a").ofctl("dump-flows", "br0", &[]).await;
        if s.fake.object("hostsubnets", "", "node-c").is_none()
            && !flows.contains("10.128.4.0/23")
            && !flows.contains("172.17.0.4")
        {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        gone,
        "node-c's subnet is still in node a's flows:\n{}",
        s.cluster.node("a").ofctl("dump-flows", "br0", &[]).await
    );
    let flows_b = s.cluster.node("b").ofctl("dump-flows", "br0", &[]).await;
    assert!(!flows_b.contains("10.128.4.0/23"), "{flows_b}");
    s.expect("a-ta", "b-ta", true, "a and b still reach each other").await;

    // Pods away; every agent and the controller ready.
    for (i, (name, node, ns)) in [("a-ta", "a", "team-a"), ("b-ta", "b", "team-a")].iter().enumerate() {
        let r = s.agents[node].cni("del", ns, name, &container(700 + i as u32), &s.pods[name].0.path());
        assert!(r.ok(), "DEL {name}: {:?}", r.out);
        s.fake.delete("pods", ns, name);
    }
    s.agents.remove("c");
    s.ready_again("after the Node was deleted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_policy_is_enforced_across_nodes_on_a_controller_prepared_cluster() {
    let Some(mut s) = setup("controller_e2e_netpol", "networkpolicy").await else { return };
    s.add_pod("db", "a", "team-a", json!({"app": "db"}), 710);
    s.add_pod("client", "b", "team-a", json!({"role": "client"}), 711);
    s.add_pod("other", "c", "team-a", json!({"role": "other"}), 712);
    s.add_pod("outsider", "c", "team-b", json!({"role": "client"}), 713);
    // No policy: everything reaches everything (the networkpolicy plugin isolates nothing
    // by VNID).
    s.expect("other", "db", true, "before the policy").await;
    s.expect("outsider", "db", true, "before the policy, from team-b").await;
    s.fake.put(
        "networkpolicies",
        json!({"metadata": {"name": "db-from-clients", "namespace": "team-a", "uid": "np1", "generation": 1},
               "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}}),
    );
    s.expect("other", "db", false, "a pod the policy does not select, from node c").await;
    s.expect("outsider", "db", false, "a client of another namespace").await;
    s.expect("client", "db", true, "the allowed client, from node b").await;
    // The policy does not select the others: they still reach each other.
    s.expect("db", "other", true, "egress is not restricted").await;
    s.ready_again("NetworkPolicy across nodes").await;
}
