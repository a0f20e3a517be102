//! The node keeps working when someone else breaks it (issue 20): independent executors, and
//! repairs from the model of what others delete or change — the bridge, a pod's port, the
//! bridge's settings, the flows, the whole database — while the agent runs, with real CNI pods
//! and real pings, each ending with exact OVSDB, switch and kernel state.

mod support;

use std::time::{Duration, Instant};

use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};
use support::agent::{vsctl, without_cookies};
use support::cninode::*;

/// Bound of every wait for a repair (a bound, not a measurement).
const REPAIR_WITHIN: Duration = Duration::from_secs(40);

/// Two team-a pods and one team-b pod on one node, through libcni.
struct Pods {
    node: CniNode,
    ns: Vec<PodNs>,
    addr: Vec<String>,
}

async fn three_pods() -> Pods {
    let node = CniNode::start(MULTITENANT).await;
    let mut ns = Vec::new();
    let mut addr = Vec::new();
    for (i, (pod_ns, name)) in [("team-a", "a1"), ("team-a", "a2"), ("team-b", "b1")].iter().enumerate() {
        let p = PodNs::new(name);
        let r = node.cni("add", pod_ns, name, &container(i as u32 + 1), &p.path());
        assert!(r.ok(), "ADD {pod_ns}/{name}: {:?}\n{}", r.out, node.log());
        addr.push(r.addr());
        ns.push(p);
    }
    let pods = Pods { node, ns, addr };
    pods.isolation_holds();
    pods
}

impl Pods {
    /// Same VNID reaches, another does not.
    fn isolation_holds(&self) {
        assert!(ping(&self.ns[0].name, &self.addr[1]), "a1 reaches a2\n{}", self.node.log());
        assert!(!ping(&self.ns[0].name, &self.addr[2]), "a1 does not reach b1");
    }

    /// Waits (bounded) until a1 reaches a2 again; returns how long it took.
    async fn pings_again(&self, what: &str) -> Duration {
        let t = Instant::now();
        while t.elapsed() < REPAIR_WITHIN {
            if in_ns(&self.ns[0].name, &["ping", "-c", "1", "-W", "1", &self.addr[1]]).0 {
                let took = t.elapsed();
                eprintln!("{what}: a1 reaches a2 again after {took:?}");
                return took;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}: a1 never reached a2 again\n{}", self.node.log());
    }

    fn state(&self) -> NodeState {
        NodeState::of(&self.node)
    }

    async fn status(&self) -> sdn_node::api::status::Status {
        sdn_node::api::status::fetch(&self.node.agent.socket).await.expect("status")
    }
}

/// What the node's OVSDB, switch and kernel hold, as the oracles print it.
#[derive(Debug, PartialEq)]
struct NodeState {
    ports: Vec<String>,
    /// Flows without cookies (a full replay moves to a new generation).
    flows: Vec<String>,
    /// Each port's pod record.
    records: Vec<String>,
    bridge: String,
    vxlan: String,
    veths: Vec<String>,
}

impl NodeState {
    fn of(n: &CniNode) -> NodeState {
        let ports = n.ports();
        let records = ports
            .iter()
            .map(|p| {
                let (_, out, _) = support::agent::vsctl_status(&n.sb, &["--no-wait", "get", "Port", p, "external_ids:sdn-node-pod"]);
                format!("{p}={}", out.trim())
            })
            .collect();
        NodeState {
            flows: by_port_name(&without_cookies(&n.flows()), &support::agent::ofports(&n.sb)),
            records,
            bridge: vsctl(&n.sb, &["--no-wait", "get", "Bridge", "br0", "fail_mode", "protocols", "datapath_type"]),
            vxlan: vsctl(&n.sb, &["--no-wait", "get", "Interface", "vxlan0", "type", "options", "ofport_request"]),
            veths: n.veths(),
            ports,
        }
    }
}

/// Flows with pod ports' numbers replaced by their names: a bridge made again numbers its
/// ports anew, and the flows must follow the new numbers.
fn by_port_name(flows: &[String], ofports: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let mut pods: Vec<(String, String)> =
        ofports.iter().filter(|(n, _)| n.starts_with("veth")).map(|(n, p)| (p.clone(), n.clone())).collect();
    // Longest numbers first, so that port 13 is not taken for port 1 followed by a 3.
    pods.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    let mut out: Vec<String> = flows
        .iter()
        .map(|f| {
            let mut f = f.clone();
            for (p, name) in &pods {
                let hex = format!("0x{:x}", p.parse::<u32>().unwrap_or(0));
                for (from, to) in [
                    (format!("in_port={p},"), format!("in_port={name},")),
                    (format!("in_port={p} "), format!("in_port={name} ")),
                    (format!("load:{hex}->NXM_NX_REG2[]"), format!("load:{name}->NXM_NX_REG2[]")),
                ] {
                    f = f.replace(&from, &to);
                }
                if let Some(stem) = f.strip_suffix(&format!("output:{p}")) {
                    f = format!("{stem}output:{name}");
                }
            }
            f
        })
        .collect();
    out.sort();
    out
}

/// Polls (bounded) until the node holds `want` again; then isolation holds as before.
async fn state_back(p: &Pods, want: &NodeState, what: &str) {
    let t = Instant::now();
    loop {
        let now = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.state()));
        match now {
            Ok(s) if s == *want => {
                eprintln!("{what}: OVSDB, flows and interfaces as before after {:?}", t.elapsed());
                p.isolation_holds();
                // And the agent says so: ready again (issue 32).
                p.node.ready_again(what).await;
                return;
            }
            Ok(s) if t.elapsed() > REPAIR_WITHIN => {
                panic!("{what}: the node never got back to its state:\n{s:?}\nwant\n{want:?}\n{}", p.node.log())
            }
            _ if t.elapsed() > REPAIR_WITHIN => panic!("{what}: OVSDB or the switch never answered again\n{}", p.node.log()),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test]
async fn del_br_is_put_back_from_the_model() {
    if !can_run() {
        return;
    }
    let p = three_pods().await;
    let before = p.state();
    assert_eq!(before.ports.len(), 5, "{:?}", before.ports);
    vsctl(&p.node.sb, &["--no-wait", "del-br", "br0"]);
    p.pings_again("del-br").await;
    state_back(&p, &before, "del-br").await;
    let st = p.status().await;
    assert!(st.repairs.get("bridge").copied().unwrap_or(0) >= 1, "the repair is counted: {:?}", st.repairs);
    assert!(p.node.log().contains("someone else changed OVSDB; repairing from the model"), "{}", p.node.log());
}

#[tokio::test]
async fn deleted_port_changed_settings_and_deleted_flows_are_put_back() {
    if !can_run() {
        return;
    }
    let p = three_pods().await;
    let before = p.state();
    let a2_port = before.ports.iter().find(|x| x.starts_with("veth")).cloned();
    // a2's port (the one a1 pings): find it by its record.
    let a2 = before
        .records
        .iter()
        .find(|r| r.contains("\\\"name\\\":\\\"a2\\\""))
        .and_then(|r| r.split('=').next())
        .map(str::to_string)
        .or(a2_port)
        .expect("a2's port");
    vsctl(&p.node.sb, &["--no-wait", "del-port", "br0", &a2]);
    p.pings_again("a pod's port deleted").await;
    state_back(&p, &before, "a pod's port deleted").await;

    vsctl(&p.node.sb, &["--no-wait", "set", "Bridge", "br0", "fail_mode=standalone", "protocols=OpenFlow10"]);
    state_back(&p, &before, "bridge settings changed").await;
    p.pings_again("bridge settings changed").await;

    vsctl(&p.node.sb, &["--no-wait", "set", "Interface", "vxlan0", "options:dst_port=9999", "options:key=7"]);
    state_back(&p, &before, "vxlan0's options changed").await;

    vsctl(&p.node.sb, &["--no-wait", "remove", "Port", &a2, "external_ids", "sdn-node-pod"]);
    state_back(&p, &before, "a pod's record removed").await;

    support::ofctl(&p.node.sb, &["del-flows", "br0"]);
    p.pings_again("del-flows").await;
    state_back(&p, &before, "del-flows").await;

    let st = p.status().await;
    for what in ["pod_port", "bridge_setting", "base_port", "pod_record", "flows"] {
        assert!(st.repairs.get(what).copied().unwrap_or(0) >= 1, "{what} repair counted: {:?}", st.repairs);
    }
    assert!(st.executors.iter().all(|e| e.ok), "every executor converged: {:?}", st.executors);
}

#[tokio::test]
async fn an_empty_database_while_the_agent_runs_is_refilled() {
    if !can_run() {
        return;
    }
    let mut p = three_pods().await;
    let before = p.state();
    p.node.sb.stop_ovsdb().expect("stop ovsdb-server");
    p.node.sb.recreate_empty_db().expect("empty conf.db");
    p.node.sb.start_ovsdb().await.expect("start ovsdb-server");
    p.pings_again("empty database").await;
    state_back(&p, &before, "empty database").await;
    // The records are back, so a restart still knows every pod.
    p.node.kill_agent().await;
    p.node.spawn_agent().await;
    let st = p.status().await;
    assert_eq!(st.pods.api, 3, "every pod recovered from its record after a restart: {st:?}");
    p.pings_again("restart after the empty database").await;
}

/// GET `path` from the metrics listener at `addr`, inside network namespace `ns`.
async fn http_get_in(ns: &str, addr: &str, path: &str) -> (u16, String) {
    let (addr, path) = (addr.to_string(), path.to_string());
    hostnet::Netns::open(format!("/var/run/netns/{ns}"))
        .expect("open netns")
        .run("GET", move || {
            use std::io::{Read, Write};
            let mut out = String::new();
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let _ = s.read_to_string(&mut out);
            }
            Ok(out)
        })
        .await
        .map(|out| {
            let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
            (code, out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
        })
        .expect("GET in the node's namespace")
}

/// A node whose host networking cannot be configured (tun0 is no kernel device: the switch
/// runs with `--enable-dummy=override`) still gets every flow; `/readyz` says 503 and names the
/// host executor, status and the metric agree; once tun0 exists, the host executor converges
/// on its own and the node is ready.
#[tokio::test]
async fn a_failing_host_network_holds_back_nothing_and_says_so() {
    if !can_run() {
        return;
    }
    let ns = format!("sdnh{}", std::process::id());
    let sb = OvsSandbox::start(SandboxOptions { netns: Some(ns.clone()), dummy_override: true, ..Default::default() }).await.expect("sandbox");
    let metrics = "127.0.0.1:9181";
    assert!(in_ns(&ns, &["ip", "link", "set", "lo", "up"]).0, "lo up in the node's namespace");
    // NodeAgent returns once the CNI configuration is written, which the agent does after its
    // first flow commit: the flows are on the switch while the host step fails.
    let agent = NodeAgent::start_with(&ns, sb.dir(), MULTITENANT, &["--metrics-addr", metrics]).await;
    let flows = support::dump_sorted(&sb, &[]);
    assert!(flows.iter().any(|f| f.contains("table=253")), "the pipeline is installed: {flows:?}");
    assert!(flows.iter().any(|f| f.contains("table=80")), "{flows:?}");
    let t = Instant::now();
    let (code, body) = loop {
        let (code, body) = http_get_in(&ns, metrics, "/readyz").await;
        if body.contains("host executor failing") || t.elapsed() > REPAIR_WITHIN {
            break (code, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("host executor failing") && body.contains("tun0"), "/readyz names the failing executor and why: {body}");
    let (_, m) = http_get_in(&ns, metrics, "/metrics").await;
    let errors = m
        .lines()
        .find_map(|l| l.strip_prefix("sdn_node_converge_errors_total{executor=\"host\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(errors >= 1.0, "{m}");
    assert!(m.contains("sdn_node_converge_errors_total{executor=\"flows\"} 0"), "{m}");
    let st = sdn_node::api::status::fetch(&agent.socket).await.expect("status");
    let host = st.executors.iter().find(|e| e.name == "host").expect("host executor in status");
    assert!(!host.ok && host.last_error.as_deref().unwrap_or("").contains("tun0") && host.failing_since_unix_ms.is_some(), "{host:?}");
    assert!(st.executors.iter().filter(|e| e.name != "host").all(|e| e.ok), "the others converged: {:?}", st.executors);
    assert!(st.to_string().contains("FAILING since"), "{st}");
    // Fixed: a kernel device named tun0 appears (a veth: this kernel has no dummy driver).
    // The executor retries on its own.
    let (ok, _) = in_ns(&ns, &["ip", "link", "add", "tun0", "type", "veth", "peer", "name", "tun0p"]);
    assert!(ok, "ip link add tun0");
    let t = Instant::now();
    loop {
        let (code, body) = http_get_in(&ns, metrics, "/readyz").await;
        if code == 200 {
            break;
        }
        assert!(t.elapsed() < REPAIR_WITHIN, "never ready after tun0 appeared: {body}\n{}", agent.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, addrs) = in_ns(&ns, &["ip", "-o", "-4", "addr", "show", "tun0"]);
    assert!(addrs.contains("10.128.0.1/23"), "the gateway address is on tun0: {addrs}");
    let (_, routes) = in_ns(&ns, &["ip", "route"]);
    assert!(routes.contains("10.128.0.0/14 dev tun0") && routes.contains("172.30.0.0/16 dev tun0"), "{routes}");
    // Someone deletes the cluster route: the next verification puts it back.
    let (ok, _) = in_ns(&ns, &["ip", "route", "del", "10.128.0.0/14"]);
    assert!(ok);
    let t = Instant::now();
    loop {
        let (_, routes) = in_ns(&ns, &["ip", "route"]);
        if routes.contains("10.128.0.0/14 dev tun0") {
            break;
        }
        assert!(t.elapsed() < REPAIR_WITHIN, "the route never came back: {routes}\n{}", agent.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(agent);
}
