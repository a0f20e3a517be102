//! The Kubernetes source end to end: a fake API server (real HTTP list/watch, see
//! `support::fake_kube`), the daemon in-process (`run_with` + `kube::spawn`) against a sandbox
//! switch (datapath dummy), and `ovs-ofctl dump-flows` as the oracle. Conditions are polled a
//! bounded number of times with a short backoff; a failure shows what was last seen.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use sdn_node::kube::KubeOptions;
use sdn_node::metrics::{KindLabel, ResultLabel, Telemetry};
use sdn_node::run::RunOptions;
use sdn_harness::sandbox::OvsSandbox;
use serde_json::{json, Value};
use support::fake_kube::FakeKube;

const NODE: &str = "node-a";
const LABEL: &str = "network.openshift.io/not-enforcing-egress-network-policy";
const MULTITENANT: &str = "redhat/openshift-ovs-multitenant";

struct Daemon {
    sb: OvsSandbox,
    telemetry: Telemetry,
    api_socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    async fn start(fake: &FakeKube) -> Daemon {
        Daemon::start_with(fake, None).await
    }

    /// [`Daemon::start`], serving /metrics, /healthz and /readyz on `metrics`.
    async fn start_with(fake: &FakeKube, metrics: Option<std::net::SocketAddr>) -> Daemon {
        let sb = support::sandbox_with_bridge().await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = fake.kubeconfig(dir.path());
        let mut opts = RunOptions::new(PathBuf::new(), sb.dir().to_path_buf());
        opts.metrics_addr = metrics;
        opts.node.bridge.datapath_type = Some(sdn_node::options::DatapathType::Dummy);
        let api_socket = dir.path().join("api.sock");
        opts.node.api_socket = Some(api_socket.clone());
        let telemetry = Telemetry::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (t1, t2) = (telemetry.clone(), telemetry.clone());
        let kube = KubeOptions { kubeconfig: Some(kubeconfig), node: NODE.into() };
        let task = tokio::spawn(async move {
            let source = move |_| sdn_node::kube::spawn(kube, t2);
            let stopped = async move {
                let _ = stopped.await;
            };
            sdn_node::run::run_with(opts, t1, source, stopped).await.expect("run_with");
        });
        Daemon { sb, telemetry, api_socket, stop: Some(stop), task: Some(task), _dir: dir }
    }

    /// The agent says it is ready (status over its API socket: not_ready none, converged);
    /// tests that change something end so (issue 32).
    async fn ready_again(&self, what: &str) {
        let mut last = None;
        for _ in 0..400 {
            match sdn_node::api::status::fetch(&self.api_socket).await {
                Ok(st) if st.not_ready.is_none() && st.converged => return,
                Ok(st) => last = st.not_ready.or(Some("not converged".into())),
                Err(e) => last = Some(format!("no status: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: the agent never said ready again: {last:?}");
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task.take().unwrap()).await;
    }

    /// The flows of one table (`dump-flows --no-stats`, sorted).
    fn table(&self, t: u8) -> Vec<String> {
        let out = support::ofctl(&self.sb, &["dump-flows", "--no-stats", "--no-names", "br0", &format!("table={t}")]);
        let mut v: Vec<String> = out
            .lines()
            .filter(|l| !l.starts_with("OFPST_FLOW") && !l.trim().is_empty())
            .map(|l| l.trim().to_string())
            .collect();
        v.sort();
        v
    }

    fn bundles(&self) -> u64 {
        self.telemetry.metrics.bundles.get_or_create(&ResultLabel { result: "ok".into() }).get()
    }

    fn ports(&self) -> String {
        support::ofctl(&self.sb, &["dump-ports-desc", "br0"])
    }

    /// Sets a pod up through the pod API (an OVS internal port), once the state allows it.
    async fn add_pod(&self, ns: &str, name: &str, veth: &str, ip: &str, mac: &str) {
        let body = json!({"containerID": "ab".repeat(32), "namespace": ns, "name": name, "hostVeth": veth,
            "ip": ip, "mac": mac, "internal": true})
        .to_string();
        let sock = self.api_socket.clone();
        poll(&format!("pod {ns}/{name} set up through the pod API"), || {
            let (sock, body) = (sock.clone(), body.clone());
            async move {
                match sdn_node::api::client::call(&sock, "POST", "/v1/pods", Some(body)).await {
                    Ok((200..=299, _)) => Ok(()),
                    Ok((code, b)) => Err(format!("HTTP {code}: {b}")),
                    Err(e) => Err(e),
                }
            }
        })
        .await;
    }

    /// Polls table `t` until `pred` holds; returns the flows.
    async fn until(&self, what: &str, t: u8, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
        poll(what, || {
            let flows = self.table(t);
            let ok = pred(&flows);
            async move {
                if ok {
                    Ok(flows)
                } else {
                    Err(format!("table {t}:\n{}", flows.join("\n")))
                }
            }
        })
        .await
    }
}

/// Polls `f` (at most 150 tries, backing off from 10 ms to 200 ms: ~25 s); panics with the
/// last error.
async fn poll<T, F: std::future::Future<Output = Result<T, String>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let mut last = String::new();
    let mut delay = Duration::from_millis(10);
    for _ in 0..150 {
        match f().await {
            Ok(v) => return v,
            Err(e) => last = e,
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 3 / 2).min(Duration::from_millis(200));
    }
    panic!("timed out waiting for {what}; last seen:\n{last}");
}

fn has(flows: &[String], parts: &[&str]) -> bool {
    flows.iter().any(|f| parts.iter().all(|p| f.contains(p)))
}

fn cluster_network() -> Value {
    json!({"metadata": {"name": "default"}, "network": "10.128.0.0/14", "hostsubnetlength": 9,
        "serviceNetwork": "172.30.0.0/16", "pluginName": MULTITENANT,
        "clusterNetworks": [{"CIDR": "10.128.0.0/14", "hostSubnetLength": 9}], "vxlanPort": 4789})
}

fn host_subnet(host: &str, ip: &str, subnet: &str) -> Value {
    json!({"metadata": {"name": host}, "host": host, "hostIP": ip, "subnet": subnet})
}

fn net_namespace(name: &str, netid: u32) -> Value {
    json!({"metadata": {"name": name}, "netname": name, "netid": netid})
}

fn service(ns: &str, name: &str, ip: &str, ports: &[(&str, u16)]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|(p, n)| json!({"protocol": p, "port": n, "targetPort": n})).collect();
    json!({"metadata": {"namespace": ns, "name": name}, "spec": {"clusterIP": ip, "type": "ClusterIP", "ports": ports}})
}

fn egress_policy(ns: &str, name: &str, allow: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name}, "spec": {"egress": [
        {"type": "Allow", "to": {"cidrSelector": allow}},
        {"type": "Deny", "to": {"cidrSelector": "0.0.0.0/0"}}]}})
}

fn pod(ns: &str, name: &str, node: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name}, "spec": {"nodeName": node, "containers": []}})
}

/// A multitenant cluster: this node and node-b, namespaces default/team-a(11)/team-b(12), a
/// service and an egress policy in team-a, pod team-a/a1 here and one on node-b.
fn populate(fake: &FakeKube) {
    fake.put("nodes", json!({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}));
    fake.put("clusternetworks", cluster_network());
    fake.put("hostsubnets", host_subnet(NODE, "172.17.0.2", "10.128.2.0/23"));
    fake.put("hostsubnets", host_subnet("node-b", "172.17.0.3", "10.129.0.0/23"));
    fake.put("netnamespaces", net_namespace("default", 0));
    fake.put("netnamespaces", net_namespace("team-a", 11));
    fake.put("netnamespaces", net_namespace("team-b", 12));
    fake.put("services", service("team-a", "web", "172.30.0.10", &[("TCP", 80)]));
    fake.put(
        "services",
        json!({"metadata": {"namespace": "team-b", "name": "headless"}, "spec": {"clusterIP": "None"}}),
    );
    fake.put("egressnetworkpolicies", egress_policy("team-a", "default", "1.2.3.0/24"));
    fake.put("pods", pod("team-a", "a1", NODE));
    fake.put("pods", pod("team-a", "elsewhere", "node-b"));
}

/// The PATCHes of this Node itself (its labels; not its status, not Events).
fn label_patches(fake: &FakeKube) -> Vec<(String, String, Value)> {
    fake.patches().into_iter().filter(|(p, _, _)| *p == format!("/api/v1/nodes/{NODE}")).collect()
}

fn list_requests(fake: &FakeKube, path: &str) -> usize {
    fake.requests().iter().filter(|r| r.starts_with(&format!("GET {path}")) && !r.contains("watch=")).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_objects_drive_the_flows() {
    let fake = FakeKube::start().await;
    populate(&fake);
    let d = Daemon::start(&fake).await;

    // The initial lists: remote subnet, service (VNID 11 = 0xb), egress policy.
    d.until("node-b's subnet (table 90)", 90, |f| has(f, &["nw_dst=10.129.0.0/23", "172.17.0.3"])).await;
    d.until("service web (table 60)", 60, |f| has(f, &["nw_dst=172.30.0.10", "tp_dst=80", "0xb->NXM_NX_REG1"])).await;
    d.until("egress policy (table 100)", 100, |f| has(f, &["reg0=0xb", "nw_dst=1.2.3.0/24"])).await;
    // The headless service is skipped (not rejected: nothing to program).
    let t60 = d.table(60);
    assert!(t60.iter().filter(|f| f.contains("nw_dst=172.30.")).all(|f| f.contains("nw_dst=172.30.0.10")), "{t60:#?}");
    let rejected = d.telemetry.metrics.rejected.get_or_create(&KindLabel { kind: "service".into() }).get();
    assert_eq!(rejected, 0, "{}", d.telemetry.metrics.encode());

    // A pod set up through the pod API, known to the cluster on this node.
    d.add_pod("team-a", "a1", "veth-a1", "10.128.2.5", "0a:58:0a:80:02:05").await;
    d.until("pod a1 (table 70, VNID 11)", 70, |f| has(f, &["nw_dst=10.128.2.5", "0xb->NXM_NX_REG1"])).await;

    // HostSubnets: created, changed, deleted.
    fake.put("hostsubnets", host_subnet("node-c", "172.17.0.4", "10.130.0.0/23"));
    d.until("node-c's subnet added", 90, |f| has(f, &["nw_dst=10.130.0.0/23", "172.17.0.4"])).await;
    fake.put("hostsubnets", host_subnet("node-c", "172.17.0.9", "10.130.0.0/23"));
    d.until("node-c's host IP changed", 90, |f| {
        has(f, &["nw_dst=10.130.0.0/23", "172.17.0.9"]) && !has(f, &["172.17.0.4"])
    })
    .await;
    fake.delete("hostsubnets", "", "node-b");
    d.until("node-b's subnet removed", 90, |f| !has(f, &["10.129.0.0/23"])).await;

    // Services: created, changed, deleted.
    fake.put("services", service("team-b", "db", "172.30.0.20", &[("TCP", 5432)]));
    d.until("service db added (VNID 12)", 60, |f| has(f, &["nw_dst=172.30.0.20", "tp_dst=5432", "0xc->NXM_NX_REG1"]))
        .await;
    fake.put("services", service("team-b", "db", "172.30.0.20", &[("UDP", 5433)]));
    d.until("service db's port changed", 60, |f| {
        has(f, &["udp", "nw_dst=172.30.0.20", "tp_dst=5433"]) && !has(f, &["tp_dst=5432"])
    })
    .await;
    fake.delete("services", "team-b", "db");
    d.until("service db removed", 60, |f| !has(f, &["172.30.0.20"])).await;

    // NetNamespace netid change: the pod's, the service's and the policy's flows move to VNID
    // 21 (0x15) in one bundle.
    let before = d.bundles();
    fake.put("netnamespaces", net_namespace("team-a", 21));
    d.until("pod a1 re-pointed (table 20)", 20, |f| {
        has(f, &["10.128.2.5", "0x15->NXM_NX_REG0"]) && !has(f, &["0xb->NXM_NX_REG0"])
    })
    .await;
    d.until("pod a1 re-pointed (table 70)", 70, |f| has(f, &["nw_dst=10.128.2.5", "0x15->NXM_NX_REG1"])).await;
    d.until("service web re-pointed (table 60)", 60, |f| {
        has(f, &["nw_dst=172.30.0.10", "0x15->NXM_NX_REG1"]) && !has(f, &["0xb->"])
    })
    .await;
    d.until("policy re-pointed (table 100)", 100, |f| {
        has(f, &["reg0=0x15", "nw_dst=1.2.3.0/24"]) && !has(f, &["reg0=0xb"])
    })
    .await;
    assert_eq!(d.bundles(), before + 1, "a netid change is one bundle");

    // An egress policy edit swaps the rules atomically: every dump of table 100 shows either
    // the old rules or the new ones.
    let old = d.table(100);
    let before = d.bundles();
    fake.put("egressnetworkpolicies", egress_policy("team-a", "default", "5.6.7.0/24"));
    let mut seen = Vec::new();
    let new = poll("the new egress rules", || {
        let t = d.table(100);
        seen.push(t.clone());
        async move {
            if has(&t, &["nw_dst=5.6.7.0/24"]) {
                Ok(t)
            } else {
                Err(t.join("\n"))
            }
        }
    })
    .await;
    assert!(!has(&new, &["1.2.3.0/24"]), "old rule still there: {new:#?}");
    for s in &seen {
        assert!(*s == old || *s == new, "a mixed table 100: {s:#?}");
    }
    assert_eq!(d.bundles(), before + 1, "a policy edit is one bundle");
    fake.delete("egressnetworkpolicies", "team-a", "default");
    d.until("policy removed", 100, |f| !has(f, &["nw_dst=5.6.7.0/24"]) && !has(f, &["reg0=0x15"])).await;

    // A dropped watch: the watcher watches again from its resourceVersion (no relist) and gets
    // what happened meanwhile.
    let lists = list_requests(&fake, "/api/v1/services");
    fake.drop_watches("services");
    fake.put("services", service("team-b", "cache", "172.30.0.30", &[("TCP", 6379)]));
    d.until("service cache after a dropped watch", 60, |f| has(f, &["nw_dst=172.30.0.30", "tp_dst=6379"])).await;
    assert_eq!(list_requests(&fake, "/api/v1/services"), lists, "resumed without a relist");

    // 410 Gone: node-c disappears while the watch is down; the relist removes its flows.
    let lists = list_requests(&fake, "/apis/network.openshift.io/v1/hostsubnets");
    fake.delete_while_disconnected("hostsubnets", "", "node-c");
    d.until("node-c's subnet removed after the relist", 90, |f| !has(f, &["10.130.0.0/23"])).await;
    assert!(list_requests(&fake, "/apis/network.openshift.io/v1/hostsubnets") > lists, "a relist happened");

    // The pod is deleted in the cluster: torn down (flows and port).
    assert!(d.ports().contains("veth-a1"));
    fake.delete("pods", "team-a", "a1");
    d.until("pod a1's flows removed", 70, |f| !has(f, &["10.128.2.5"])).await;
    poll("pod a1's port removed", || {
        let p = d.ports();
        async move {
            if p.contains("veth-a1") {
                Err(p)
            } else {
                Ok(())
            }
        }
    })
    .await;
    // The watches asked for bookmarks (the fake sends one after each backlog).
    assert!(
        fake.requests().iter().any(|r| r.contains("watch=true") && r.contains("allowWatchBookmarks=true")),
        "{:#?}",
        fake.requests()
    );
    // Never forbidden: the label was never set.
    assert!(label_patches(&fake).is_empty(), "{:?}", fake.patches());
    d.ready_again("at the end of the test").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_egress_policies_label_the_node() {
    let fake = FakeKube::start().await;
    populate(&fake);
    fake.forbid("egressnetworkpolicies", true);
    let d = Daemon::start(&fake).await;

    // Everything else is programmed; policies count as none.
    d.until("service web (table 60)", 60, |f| has(f, &["nw_dst=172.30.0.10", "tp_dst=80"])).await;
    assert!(!has(&d.table(100), &["1.2.3.0/24"]));
    let patches = poll("the node label PATCH", || {
        let p = label_patches(&fake);
        async move {
            if p.is_empty() {
                Err("no PATCH yet".into())
            } else {
                Ok(p)
            }
        }
    })
    .await;
    let (path, content_type, body) = &patches[0];
    assert_eq!(path, &format!("/api/v1/nodes/{NODE}"));
    assert_eq!(content_type, "application/merge-patch+json");
    assert_eq!(body, &json!({"metadata": {"labels": {LABEL: "true"}}}));
    assert_eq!(fake.object("nodes", "", NODE).unwrap()["metadata"]["labels"][LABEL], "true");

    // Allowed again: the policies are enforced and the label goes away.
    fake.forbid("egressnetworkpolicies", false);
    d.until("egress policy (table 100)", 100, |f| has(f, &["reg0=0xb", "nw_dst=1.2.3.0/24"])).await;
    poll("the label removed", || {
        let n = fake.object("nodes", "", NODE).unwrap();
        async move {
            if n["metadata"]["labels"].get(LABEL).is_some() {
                Err(n.to_string())
            } else {
                Ok(())
            }
        }
    })
    .await;
    assert_eq!(label_patches(&fake).last().unwrap().2, json!({"metadata": {"labels": {LABEL: null}}}));
    d.ready_again("at the end of the test").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_plugin_publishes_nothing() {
    let fake = FakeKube::start().await;
    populate(&fake);
    let mut cn = cluster_network();
    cn["pluginName"] = json!("cni/something-else");
    fake.put("clusternetworks", cn);
    let d = Daemon::start(&fake).await;
    // The watchers list everything, the state is refused: the switch is left alone. Then the
    // plugin is fixed and the state applies.
    poll("every kind listed", || {
        let n = fake.requests().iter().filter(|r| r.contains("watch=")).count();
        async move {
            if n >= 6 {
                Ok(())
            } else {
                Err(format!("{n} watches"))
            }
        }
    })
    .await;
    assert!(!d.telemetry.health.synced.load(std::sync::atomic::Ordering::Relaxed));
    fake.put("clusternetworks", cluster_network());
    d.until("service web (table 60)", 60, |f| has(f, &["nw_dst=172.30.0.10"])).await;
    d.ready_again("at the end of the test").await;
    d.stop().await;
}

#[test]
fn run_takes_either_a_state_file_or_a_cluster() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node")).arg("run").args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["--state", "s.yaml", "--kubeconfig", "k", "--node", "n"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    let (code, err) = run(&["--state", "s.yaml", "--in-cluster", "--node", "n"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--state"), "{err}");
    let (code, err) = run(&["--kubeconfig", "k"]);
    assert_eq!(code, Some(2), "--node is required: {err}");
}

/// The networkpolicy plugin in Kubernetes mode: a NetworkPolicy, the Namespace's labels and the
/// Pods it selects (a local pod set up through the pod API, a peer on another node) drive table
/// 80; deleting the policy removes its flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_policies_drive_table_80() {
    let fake = FakeKube::start().await;
    fake.put("nodes", json!({"metadata": {"name": NODE}}));
    let mut cn = cluster_network();
    cn["pluginName"] = json!("redhat/openshift-ovs-networkpolicy");
    fake.put("clusternetworks", cn);
    fake.put("hostsubnets", host_subnet(NODE, "172.17.0.2", "10.128.2.0/23"));
    fake.put("hostsubnets", host_subnet("node-b", "172.17.0.3", "10.129.0.0/23"));
    fake.put("netnamespaces", net_namespace("default", 0));
    fake.put("netnamespaces", net_namespace("team-a", 11));
    fake.put("namespaces", json!({"metadata": {"name": "team-a", "labels": {"team": "a"}}}));
    fake.put("namespaces", json!({"metadata": {"name": "default"}}));
    fake.put(
        "pods",
        json!({"metadata": {"namespace": "team-a", "name": "db", "labels": {"app": "db"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "ports": [{"name": "sql", "containerPort": 5432, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": "10.128.2.5"}}),
    );
    fake.put(
        "pods",
        json!({"metadata": {"namespace": "team-a", "name": "web", "labels": {"app": "web"}},
            "spec": {"nodeName": "node-b", "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": "10.129.0.5"}}),
    );
    // Of types Ingress and Egress, both enforced; one port this node cannot match (ICMP) is
    // dropped, and reported.
    let policy = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "team-a", "name": "db-from-web", "uid": "u-1", "generation": 1},
        "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress", "Egress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": "sql"}, {"protocol": "ICMP", "port": 1}]}]}});
    fake.put("networkpolicies", policy.clone());
    let d = Daemon::start(&fake).await;
    d.add_pod("team-a", "db", "veth-db", "10.128.2.5", "0a:58:0a:80:02:05").await;
    let flows = d
        .until("the policy's flows", 80, |f| {
            has(f, &["priority=100", "nw_dst=10.128.2.5", "actions=drop"]) && has(f, &["nw_src=10.129.0.5", "nw_dst=10.128.2.5", "tp_dst=5432"])
        })
        .await;
    // Only the selected source and the named port (resolved to 5432) are allowed.
    assert!(!has(&flows, &["nw_dst=10.128.2.5", "tp_dst=5432", "nw_src=10.128"]), "{flows:#?}");
    // Egress, with no rule: everything the pod sends is judged in table 27, and dropped.
    d.until("the pod's egress hook (table 21)", 21, |f| has(f, &["priority=300", "nw_src=10.128.2.5", "ct(table=27"])).await;
    d.until("the pod's egress drop (table 27)", 27, |f| has(f, &["priority=100", "nw_src=10.128.2.5", "actions=drop"])).await;
    // The plugin needs every pod, the policies and the namespaces watched.
    let reqs = fake.requests();
    for path in ["/apis/networking.k8s.io/v1/networkpolicies?", "/api/v1/namespaces?", "/api/v1/pods?"] {
        assert!(reqs.iter().any(|r| r.starts_with(&format!("GET {path}")) && !r.contains("fieldSelector")), "{path}: {reqs:#?}");
    }

    // The dropped port: a Warning Event regarding the policy, naming the field, and the gauge.
    let events = poll("the NetworkPolicyPartlyEnforced Event", || {
        let p = fake.posts();
        async move { if p.is_empty() { Err("no POST yet".into()) } else { Ok(p) } }
    })
    .await;
    let (path, ev) = &events[0];
    assert_eq!(path, "/apis/events.k8s.io/v1/namespaces/team-a/events");
    assert_eq!(ev["reason"], "NetworkPolicyPartlyEnforced");
    assert!(ev["note"].as_str().is_some_and(|n| n.contains("spec.ingress[0].ports[1].protocol") && n.contains("ICMP")), "{ev:#}");
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["kind"], "NetworkPolicy");
    assert_eq!(ev["regarding"]["namespace"], "team-a");
    assert_eq!(ev["regarding"]["name"], "db-from-web");
    assert_eq!(ev["reportingInstance"], NODE);
    assert_eq!(d.telemetry.metrics.policies_partly_enforced.get(), 1);
    // Once per generation: a change that keeps it (a label) reports nothing; a new generation
    // is reported again.
    let mut relabelled = policy.clone();
    relabelled["metadata"]["labels"] = json!({"x": "y"});
    fake.put("networkpolicies", relabelled.clone());
    let mut next = relabelled;
    next["metadata"]["generation"] = json!(2);
    next["spec"]["ingress"][0]["ports"] = json!([{"port": 5433}, {"protocol": "ICMP", "port": 1}]);
    fake.put("networkpolicies", next);
    d.until("generation 2's port", 80, |f| has(f, &["nw_src=10.129.0.5", "tp_dst=5433"])).await;
    // The Recorder publishes a repeat as the first Event's series (a PATCH counting it).
    let policy_posts =
        || fake.posts().iter().filter(|(p, _)| p == "/apis/events.k8s.io/v1/namespaces/team-a/events").count();
    let event_patches = || {
        fake.patches()
            .into_iter()
            .filter(|(p, _, _)| p.starts_with("/apis/events.k8s.io/v1/namespaces/team-a/events/"))
            .count()
    };
    poll("the second Event", || {
        let (posts, patches) = (policy_posts(), event_patches());
        async move { if posts + patches == 2 { Ok(()) } else { Err(format!("{posts} POSTs, {patches} PATCHes")) } }
    })
    .await;
    fake.delete("networkpolicies", "team-a", "db-from-web");
    d.until("the policy's flows gone", 80, |f| !f.iter().any(|l| l.contains("nw_dst=10.128.2.5"))).await;
    poll("the gauge back to 0", || {
        let n = d.telemetry.metrics.policies_partly_enforced.get();
        async move { if n == 0 { Ok(()) } else { Err(format!("{n}")) } }
    })
    .await;
    assert_eq!(policy_posts() + event_patches(), 2, "{:#?} {:#?}", fake.posts(), fake.patches());
    d.ready_again("at the end of the test").await;
    d.stop().await;
}

/// Each NetworkPolicy generation, stamped when its watch event arrives, is realized once the
/// switch acknowledged its flows: `metadata.generation` in the realization table (what
/// `sdn-node status` shows) and one observation per generation in the histogram — a new
/// generation that changes no flow too (its no-op commit realizes it).
#[tokio::test]
async fn policy_generations_are_realized_from_watch_events() {
    let fake = FakeKube::start().await;
    fake.put("nodes", json!({"metadata": {"name": NODE}}));
    let mut cn = cluster_network();
    cn["pluginName"] = json!("redhat/openshift-ovs-networkpolicy");
    fake.put("clusternetworks", cn);
    fake.put("hostsubnets", host_subnet(NODE, "172.17.0.2", "10.128.2.0/23"));
    fake.put("netnamespaces", net_namespace("team-a", 11));
    fake.put("namespaces", json!({"metadata": {"name": "team-a"}}));
    fake.put("pods", json!({"metadata": {"namespace": "team-a", "name": "db"}, "spec": {"nodeName": NODE, "containers": [{"name": "c"}]}, "status": {"podIP": "10.128.2.5"}}));
    let mut policy = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": "team-a", "name": "deny", "uid": "u-1", "generation": 3}, "spec": {"podSelector": {}}});
    fake.put("networkpolicies", policy.clone());
    let d = Daemon::start(&fake).await;
    d.add_pod("team-a", "db", "veth-db", "10.128.2.5", "0a:58:0a:80:02:05").await;
    d.until("the drop", 80, |f| has(f, &["priority=100", "nw_dst=10.128.2.5", "actions=drop"])).await;
    let realized = |g: i64| {
        let (snap, text) = (d.telemetry.metrics.realization.snapshot(), d.telemetry.metrics.encode());
        async move {
            let e = snap.iter().find(|(k, _)| *k == ("team-a".to_string(), "deny".to_string())).map(|(_, e)| *e);
            let count = text.lines().find_map(|l| l.strip_prefix("sdn_node_policy_realization_seconds_count ")).unwrap_or("?").to_string();
            match e {
                Some(e) if e.seen == g && e.realized == Some(g) && e.last_latency.is_some() => Ok(count),
                _ => Err(format!("{e:?}, histogram count {count}")),
            }
        }
    };
    assert_eq!(poll("generation 3 realized", || realized(3)).await, "1");
    // A new generation that opens the pod: new flows.
    policy["metadata"]["generation"] = json!(4);
    policy["spec"]["ingress"] = json!([{}]);
    fake.put("networkpolicies", policy.clone());
    assert_eq!(poll("generation 4 realized", || realized(4)).await, "2");
    // A new generation with the same rules (as after a no-op edit): realized all the same.
    policy["metadata"]["generation"] = json!(5);
    policy["spec"]["ingress"] = json!([{"from": []}]);
    fake.put("networkpolicies", policy.clone());
    assert_eq!(poll("generation 5 realized", || realized(5)).await, "3");
    d.ready_again("at the end of the test").await;
    d.stop().await;
}

/// A multitenant node may list only its own pods, and neither NetworkPolicies nor Namespaces
/// (a ClusterRole without the networkpolicy plugin's rules): it converges all the same, watching
/// only what its plugin needs. When the cluster switches to the networkpolicy plugin, the node
/// starts watching those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_plugins_watch_only_their_node_pods() {
    let fake = FakeKube::start().await;
    populate(&fake);
    fake.forbid("networkpolicies", true);
    fake.forbid("namespaces", true);
    fake.forbid_unselected("pods", true);
    let d = Daemon::start(&fake).await;
    d.until("service web (table 60)", 60, |f| has(f, &["nw_dst=172.30.0.10", "tp_dst=80"])).await;
    d.add_pod("team-a", "a1", "veth-a1", "10.128.2.5", "0a:58:0a:80:02:05").await;
    d.until("pod a1 (table 70)", 70, |f| has(f, &["nw_dst=10.128.2.5", "0xb->NXM_NX_REG1"])).await;
    // This node's pods are followed: a1 deleted in the cluster is torn down.
    fake.delete("pods", "team-a", "a1");
    d.until("pod a1's flows removed", 70, |f| !has(f, &["10.128.2.5"])).await;
    let reqs = fake.requests();
    assert!(!reqs.iter().any(|r| r.contains("/networkpolicies") || r.contains("/api/v1/namespaces?")), "{reqs:#?}");
    let pods: Vec<&String> = reqs.iter().filter(|r| r.starts_with("GET /api/v1/pods")).collect();
    assert!(!pods.is_empty() && pods.iter().all(|r| r.contains("fieldSelector=spec.nodeName%3Dnode-a")), "{pods:#?}");
    assert_eq!(d.telemetry.metrics.policies_partly_enforced.get(), 0);

    // The cluster moves to the networkpolicy plugin (and the node is granted the lists).
    fake.forbid("networkpolicies", false);
    fake.forbid("namespaces", false);
    fake.forbid_unselected("pods", false);
    fake.put("namespaces", json!({"metadata": {"name": "team-a"}}));
    fake.put(
        "networkpolicies",
        json!({"metadata": {"namespace": "team-a", "name": "deny-all"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"protocol": "ICMP"}]}]}}),
    );
    let mut cn = cluster_network();
    cn["pluginName"] = json!("redhat/openshift-ovs-networkpolicy");
    fake.put("clusternetworks", cn);
    d.until("the networkpolicy version note (table 253)", 253, |f| has(f, &["note:02."])).await;
    poll("the networkpolicy plugin's watches", || {
        let reqs = fake.requests();
        let np = reqs.iter().any(|r| r.starts_with("GET /apis/networking.k8s.io/v1/networkpolicies"));
        let all_pods = reqs.iter().any(|r| r.starts_with("GET /api/v1/pods") && !r.contains("fieldSelector"));
        async move { if np && all_pods { Ok(()) } else { Err(format!("{reqs:#?}")) } }
    })
    .await;
    poll("the partly enforced policy counted", || {
        let n = d.telemetry.metrics.policies_partly_enforced.get();
        async move { if n == 1 { Ok(()) } else { Err(format!("{n}")) } }
    })
    .await;
    d.ready_again("at the end of the test").await;
    d.stop().await;
}

/// A free loopback address for the metrics endpoint (bound and released: the agent binds it
/// again at once).
fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// `GET path` on `addr`: (status, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("{addr}: {e}"))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).await.map_err(|e| e.to_string())?;
    let code =
        text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("no status line: {text}"))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((code, body))
}

/// `sdn-node status` (a process of its own) against the agent's socket: (human, --json).
async fn status_cli(d: &Daemon) -> (String, Value) {
    let run = |json: bool| {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"));
        c.arg("status").arg("--socket").arg(&d.api_socket);
        if json {
            c.arg("--json");
        }
        c.output()
    };
    let human = run(false).await.unwrap();
    assert!(human.status.success(), "sdn-node status: {}", String::from_utf8_lossy(&human.stderr));
    let json = run(true).await.unwrap();
    assert!(json.status.success(), "sdn-node status --json: {}", String::from_utf8_lossy(&json.stderr));
    (
        String::from_utf8_lossy(&human.stdout).into_owned(),
        serde_json::from_slice(&json.stdout).expect("status --json is JSON"),
    )
}

/// The Events API writes regarding this Node: its POSTed Events, and the PATCHes of Events in
/// "default" (where the Recorder files a cluster-scoped object's Events: a repeat is a PATCH of
/// the first one's series).
fn node_event_writes(fake: &FakeKube) -> (Vec<Value>, usize) {
    let posts = fake
        .posts()
        .into_iter()
        .filter(|(_, e)| e["regarding"]["kind"] == "Node" && e["regarding"]["name"] == NODE)
        .map(|(_, e)| e)
        .collect();
    let patches = fake
        .patches()
        .iter()
        .filter(|(p, _, _)| p.starts_with("/apis/events.k8s.io/v1/namespaces/default/events/"))
        .count();
    (posts, patches)
}

/// The PATCH requests of this Node's status so far (answered or not).
fn status_patch_requests(fake: &FakeKube) -> usize {
    fake.requests().iter().filter(|r| r.starts_with(&format!("PATCH /api/v1/nodes/{NODE}/status"))).count()
}

/// Until `what` holds: /readyz answers 503 with `reason` in its body, `sdn-node status` (human
/// and --json) says the same, and a Warning Event regarding this Node has `event_reason` and
/// `reason` as its note. Returns the Node's Events so far.
async fn says_it_waits(
    d: &Daemon,
    fake: &FakeKube,
    metrics: std::net::SocketAddr,
    reason: &str,
    event_reason: &str,
) -> Vec<Value> {
    poll(&format!("/readyz saying {reason:?}"), || async move {
        match http_get(metrics, "/readyz").await? {
            (503, body) if body.contains(reason) => Ok(()),
            (code, body) => Err(format!("{code}: {body}")),
        }
    })
    .await;
    let (human, json) = status_cli(d).await;
    assert!(json["not_ready"].as_str().is_some_and(|w| w.contains(reason)), "{json:#}");
    assert_eq!(json["waiting"].as_str(), Some(reason), "{json:#}");
    assert!(
        human.contains(&format!("ready:      no: {reason}")) && human.contains(&format!("waiting:    {reason}\n")),
        "{human}"
    );
    let events = poll(&format!("the {event_reason} Event on the Node"), || {
        let (events, _) = node_event_writes(fake);
        async move {
            if events.iter().any(|e| e["reason"] == event_reason) {
                Ok(events)
            } else {
                Err(format!("{events:#?}"))
            }
        }
    })
    .await;
    let e = events.iter().find(|e| e["reason"] == event_reason).unwrap();
    assert_eq!(e["type"], "Warning", "{e:#}");
    assert_eq!(e["note"], reason, "{e:#}");
    assert_eq!(e["regarding"]["apiVersion"], "v1", "{e:#}");
    assert_eq!(e["regarding"]["uid"], NODE, "kubectl describe node finds a node's Events by its name as UID: {e:#}");
    assert_eq!(e["reportingInstance"], NODE, "{e:#}");
    assert_eq!(e["reportingController"], "sdn-node", "{e:#}");
    events
}

/// Issue 33 item 5: on a cluster where nothing made ClusterNetwork "default" or this node's
/// HostSubnet yet (no controller running), the agent says what it waits for and who makes it —
/// /readyz (503), `sdn-node status` (human and --json), one Warning Event regarding the Node
/// per wait (not one per pass) — sets no Node condition, and goes on with no restart when the
/// objects arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_says_what_it_waits_for_and_goes_on_when_it_arrives() {
    let fake = FakeKube::start().await;
    fake.put("nodes", json!({"metadata": {"name": NODE}}));
    fake.put("netnamespaces", net_namespace("default", 0));
    fake.put("netnamespaces", net_namespace("team-a", 11));
    fake.put("services", service("team-a", "web", "172.30.0.10", &[("TCP", 80)]));
    let metrics = free_addr();
    let d = Daemon::start_with(&fake, Some(metrics)).await;

    // No ClusterNetwork.
    let cn_wait = "waiting for ClusterNetwork \"default\" (created by openshift-sdn's master or sdn-node controller: is it running?)";
    says_it_waits(&d, &fake, metrics, cn_wait, "WaitingForClusterNetwork").await;

    // The ClusterNetwork, another node's HostSubnet, none for this node.
    fake.put("clusternetworks", cluster_network());
    fake.put("hostsubnets", host_subnet("node-b", "172.17.0.3", "10.129.0.0/23"));
    let hs_wait =
        "no HostSubnet for node node-a yet (created by sdn-node controller or openshift-sdn's master: is it running?)";
    says_it_waits(&d, &fake, metrics, hs_wait, "WaitingForHostSubnet").await;

    // More changes while it waits: each is a pass that cannot build a state, none a new Event.
    // This node's HostSubnet, rejected (outside the cluster network), comes last on the same
    // watch: once its Event is out, every change before it has been seen.
    for i in 0..20u32 {
        fake.put(
            "hostsubnets",
            host_subnet(&format!("node-x{i}"), &format!("172.17.1.{i}"), &format!("10.130.{}.0/23", i * 2)),
        );
    }
    fake.put("hostsubnets", host_subnet(NODE, "172.17.0.2", "192.168.0.0/23"));
    let bad = "waiting for a valid HostSubnet for node node-a: hostsubnet node-a: field subnet: 192.168.0.0/23 is outside the cluster network 10.128.0.0/14";
    says_it_waits(&d, &fake, metrics, bad, "InvalidHostSubnet").await;
    let (events, patches) = node_event_writes(&fake);
    let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
    assert_eq!(
        reasons,
        ["WaitingForClusterNetwork", "WaitingForHostSubnet", "InvalidHostSubnet"],
        "one Event per wait: {events:#?}"
    );
    assert_eq!(patches, 0, "no repeat of a wait's Event: {:#?}", fake.patches());
    // Not ready: the Node's conditions are left alone.
    assert_eq!(status_patch_requests(&fake), 0, "{:#?}", fake.requests());

    // The HostSubnet fixed: the agent goes on, same process, and says ready everywhere.
    fake.put("hostsubnets", host_subnet(NODE, "172.17.0.2", "10.128.2.0/23"));
    d.until("node-b's subnet (table 90)", 90, |f| has(f, &["nw_dst=10.129.0.0/23", "172.17.0.3"])).await;
    d.ready_again("once this node's HostSubnet exists").await;
    poll("/readyz 200", || async move {
        match http_get(metrics, "/readyz").await? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code}: {body}")),
        }
    })
    .await;
    let (human, json) = status_cli(&d).await;
    assert!(json["not_ready"].is_null() && json["waiting"].is_null(), "{json:#}");
    assert!(human.contains("ready:      yes") && !human.contains("waiting:"), "{human}");
    // Ready: the Node's NetworkUnavailable condition is written (see the test below for what).
    poll("the Node status PATCH once ready", || {
        let n = status_patch_requests(&fake);
        async move {
            if n > 0 {
                Ok(())
            } else {
                Err("none yet".to_string())
            }
        }
    })
    .await;
    assert_eq!(node_event_writes(&fake).0.len(), 3, "no Event when the wait ends");
    d.ready_again("at the end of the test").await;
    d.stop().await;
}

/// Issue 33 item 5: once ready, the agent sets its own Node's NetworkUnavailable condition to
/// False, as Calico and flannel do: one strategic merge patch of the Node's status subresource
/// naming that one condition (the Node's other conditions stay), once per start. A patch that
/// fails (here: the Node is not there yet) is retried with backoff and holds nothing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_unavailable_is_set_false_once_ready() {
    let fake = FakeKube::start().await;
    populate(&fake);
    let node = fake.object("nodes", "", NODE).unwrap();
    fake.delete("nodes", "", NODE);
    let d = Daemon::start(&fake).await;
    d.ready_again("with the Node missing").await;
    // The agent is ready and tries; the Node is not there (404): it retries.
    poll("a failed status PATCH", || {
        let n = status_patch_requests(&fake);
        async move {
            if n > 0 {
                Ok(())
            } else {
                Err("none yet".to_string())
            }
        }
    })
    .await;
    d.add_pod("team-a", "a1", "veth-a1", "10.128.2.5", "0a:58:0a:80:02:05").await;
    d.until("pod a1 (table 70): pods are not held back", 70, |f| has(f, &["nw_dst=10.128.2.5"])).await;

    // The Node appears, as a kubelet registers it: with its conditions (a cloud's route
    // controller set NetworkUnavailable True).
    let mut node = node;
    node["status"] = json!({"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"},
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"},
        {"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated", "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"}]});
    fake.put("nodes", node);
    let conditions = poll("NetworkUnavailable False", || {
        let n = fake.object("nodes", "", NODE).unwrap();
        async move {
            let c = n["status"]["conditions"].as_array().cloned().unwrap_or_default();
            match c.iter().find(|c| c["type"] == "NetworkUnavailable") {
                Some(nu) if nu["status"] == "False" => Ok(c),
                _ => Err(format!("{n:#}")),
            }
        }
    })
    .await;
    let nu = conditions.iter().find(|c| c["type"] == "NetworkUnavailable").unwrap();
    assert_eq!(nu["reason"], sdn_node::kube::node_status::REASON, "{nu:#}");
    assert_eq!(nu["message"], sdn_node::kube::node_status::MESSAGE, "{nu:#}");
    for t in ["lastTransitionTime", "lastHeartbeatTime"] {
        let at = nu[t].as_str().unwrap_or_default();
        assert!(
            at.parse::<jiff::Timestamp>().is_ok_and(|at| at > "2025-01-01T00:00:00Z".parse().unwrap()),
            "{t}: {nu:#}"
        );
    }
    // The other conditions as they were.
    let types: Vec<&str> = conditions.iter().filter_map(|c| c["type"].as_str()).collect();
    assert_eq!(types, ["Ready", "MemoryPressure", "NetworkUnavailable"], "{conditions:#?}");
    for t in ["Ready", "MemoryPressure"] {
        let c = conditions.iter().find(|c| c["type"] == t).unwrap();
        assert_eq!(c["lastHeartbeatTime"], "2025-01-01T00:00:00Z", "{c:#}");
    }
    // How: a strategic merge patch of the status subresource, naming that one condition.
    let status_patches: Vec<_> =
        fake.patches().into_iter().filter(|(p, _, _)| *p == format!("/api/v1/nodes/{NODE}/status")).collect();
    let (_, content_type, body) = status_patches.last().expect("the status PATCH is recorded");
    assert_eq!(content_type, "application/strategic-merge-patch+json");
    let patched = body["status"]["conditions"].as_array().unwrap();
    assert_eq!(patched.len(), 1, "{body:#}");
    assert_eq!(patched[0]["type"], "NetworkUnavailable");
    assert_eq!(body.as_object().unwrap().len(), 1, "status alone: {body:#}");
    assert!(label_patches(&fake).is_empty(), "the Node itself is not written: {:#?}", fake.patches());
    // Once per start: written, not again.
    let requests = status_patch_requests(&fake);
    d.ready_again("at the end of the test").await;
    fake.put("services", service("team-b", "db", "172.30.0.20", &[("TCP", 5432)]));
    d.until("service db (table 60)", 60, |f| has(f, &["nw_dst=172.30.0.20"])).await;
    d.ready_again("after one more change").await;
    assert_eq!(status_patch_requests(&fake), requests, "written once");
    d.stop().await;
}
