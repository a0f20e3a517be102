//! `sdn-node trace` and `sdn-node status` against a real switch run by the agent.
//!
//! The agent runs in-process ([`support::inproc`]) on a private Open vSwitch with the
//! multitenant state of `tests/trace.rs` (three nodes, two tenants and the global VNID, a
//! service, an egress policy). Traces go through ovs-vswitchd's unixctl socket with the
//! library's own client, exactly as the command does; the assertions are on the verdict and on
//! the owners named for the table hits, which is what an operator reads. `ovs-ofctl` is used
//! only as the oracle for `status`'s per-table counts.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sdn_node::trace::{self, Output, Proto, Report, TraceArgs, Verdict};

/// The state of `tests/trace.rs`, taken from its source so the two stay one scenario.
fn state() -> String {
    let src = include_str!("trace.rs");
    let start =
        src.find("const STATE: &str = r#\"").expect("STATE in tests/trace.rs") + "const STATE: &str = r#\"".len();
    let len = src[start..].find("\"#;").expect("end of STATE");
    src[start..start + len].to_string()
}

struct Node {
    agent: support::inproc::Running,
}

impl Node {
    async fn start() -> Node {
        let agent = support::inproc::start(&state()).await;
        let ctl = trace::unixctl::find_vswitchd_ctl(agent.sb.dir()).expect("vswitchd control socket");
        // The dummy datapath would encapsulate natively (needing routes to the other nodes);
        // as in tests/trace.rs, show tunnel output as the kernel datapath does.
        trace::unixctl::call(&ctl, "dpif/set-dp-features", &["br0", "tnl_push_pop", "false"], Duration::from_secs(10))
            .await
            .expect("set dp features");
        Node { agent }
    }

    fn args(&self) -> TraceArgs {
        TraceArgs {
            from: None,
            to: None,
            proto: None,
            vnid: None,
            ipv6: false,
            flow: None,
            ovs_rundir: self.agent.sb.dir().to_path_buf(),
            bridge: "br0".into(),
            ctl: None,
            state: Some(self.agent.state.clone()),
            socket: self.agent.socket.clone(),
            json: false,
        }
    }

    async fn trace(&self, from: &str, to: &str, proto: Option<Proto>) -> Report {
        let mut a = self.args();
        a.from = Some(from.into());
        a.to = Some(to.into());
        a.proto = proto;
        let r = trace::run(&a).await.unwrap_or_else(|e| panic!("trace {from} -> {to}: {e}"));
        assert!(r.notes.is_empty(), "every source is available: {:?}", r.notes);
        r
    }
}

/// The owner named for the first hit in `table`.
fn owner_in(r: &Report, table: u8) -> String {
    r.steps
        .iter()
        .find(|s| s.step.table == table)
        .and_then(|s| s.owner.as_ref())
        .and_then(|o| o.owner.clone())
        .unwrap_or_else(|| panic!("no owned hit in table {table}\n{}", r.text()))
}

fn tables(r: &Report) -> Vec<u8> {
    r.steps.iter().map(|s| s.step.table).collect()
}

fn outputs(r: &Report) -> &[Output] {
    match &r.verdict {
        Verdict::Forwarded { outputs } => outputs,
        v => panic!("expected forwarding, got {v:?}\n{}", r.text()),
    }
}

/// Asserts a drop in `table` by `owner`.
fn assert_dropped(r: &Report, table: u8, owner: &str) {
    match &r.verdict {
        Verdict::Dropped { table: t, owner: Some(o), .. } => {
            assert_eq!((*t, o.owner.as_deref()), (table, Some(owner)), "{}", r.text());
        }
        v => panic!("expected a drop in table {table} by {owner}, got {v:?}\n{}", r.text()),
    }
    assert_eq!(r.datapath_actions.as_deref(), Some("drop"), "{}", r.text());
    assert!(r.summary.starts_with(&format!("DROPPED in table {table} by {owner}")), "{}", r.summary);
}

fn assert_delivered_to_pod(r: &Report, pod: &str) {
    let o = outputs(r);
    assert_eq!(o.len(), 1, "{}", r.text());
    assert_eq!(o[0].pod.as_deref(), Some(pod), "{}", r.text());
    assert!(o[0].tunnel.is_none());
    assert!(r.summary.contains(&format!("pod {pod}")), "{}", r.summary);
}

fn assert_to_host(r: &Report) {
    let o = outputs(r);
    assert_eq!(o.len(), 1, "{}", r.text());
    assert_eq!((o[0].port, o[0].interface.as_deref()), (2, Some("tun0")), "{}", r.text());
}

fn assert_tunnelled(r: &Report, node: &str, dst: &str, vnid: u64) {
    let o = outputs(r);
    assert_eq!(o.len(), 1, "{}", r.text());
    let t = o[0].tunnel.as_ref().unwrap_or_else(|| panic!("not a tunnel\n{}", r.text()));
    assert_eq!(
        (t.node.as_deref(), t.dst.map(|d| d.to_string()), t.vnid),
        (Some(node), Some(dst.to_string()), Some(vnid)),
        "{}",
        r.text()
    );
    // The switch agrees: the datapath sets exactly that tunnel.
    let dp = r.datapath_actions.as_deref().unwrap_or("");
    assert!(dp.contains(&format!("tun_id={vnid:#x}")) && dp.contains(&format!("dst={dst}")), "{}", r.text());
}

#[tokio::test]
async fn same_vnid_is_delivered_with_its_owners() {
    let n = Node::start().await;
    let r = n.trace("team-a/a1", "team-a/a2", None).await;
    assert_delivered_to_pod(&r, "team-a/a2");
    assert_eq!(tables(&r), [0, 20, 21, 30, 70, 80]);
    assert_eq!(owner_in(&r, 20), "pod/team-a/a1");
    assert_eq!(owner_in(&r, 70), "pod/team-a/a2");
    assert_eq!(owner_in(&r, 80), "vnid/11", "allowed by VNID 11's rule");
    assert_eq!(owner_in(&r, 30), "base");
    // By IP and by bare name, with a port: the same path.
    let r = n.trace("10.128.2.5", "a2:8080", None).await;
    assert_delivered_to_pod(&r, "team-a/a2");
    assert!(r.flow.contains("tcp") && r.flow.contains("tcp_dst=8080"), "{}", r.flow);
    let r = n.trace("team-b/b1", "team-b/b2:53", Some(Proto::Udp)).await;
    assert_delivered_to_pod(&r, "team-b/b2");
    assert_eq!(owner_in(&r, 80), "vnid/12");
}

#[tokio::test]
async fn different_tenants_are_dropped_by_the_default_policy_drop() {
    let n = Node::start().await;
    for (src, dst, dst_owner) in [
        ("team-a/a1", "team-b/b1", "pod/team-b/b1"),
        ("team-b/b1", "team-a/a1", "pod/team-a/a1"),
        ("b2", "a3", "pod/team-a/a3"),
    ] {
        let r = n.trace(src, dst, Some(Proto::Icmp)).await;
        // Routed to the pod by its own flow, then refused in table 80: no VNID rule matches,
        // the base pipeline's priority-0 drop does.
        assert_eq!(owner_in(&r, 70), dst_owner);
        assert_dropped(&r, 80, "base");
        assert!(r.summary.contains("default drop"), "{}", r.summary);
        assert!(r.summary.contains("no rule lets VNID"), "{}", r.summary);
    }
    // The global VNID may.
    let r = n.trace("default/d1", "team-a/a1", None).await;
    assert_delivered_to_pod(&r, "team-a/a1");
    assert_eq!(owner_in(&r, 80), "policy", "the policy plugin's VNID-0 rule");
}

#[tokio::test]
async fn services_on_listed_ports_within_the_vnid() {
    let n = Node::start().await;
    let r = n.trace("team-a/a1", "team-a/web:80", None).await;
    assert_to_host(&r);
    assert_eq!(owner_in(&r, 60), "service/team-a/web");
    assert_eq!(tables(&r), [0, 20, 21, 30, 60, 80]);
    // By address too.
    let r = n.trace("a2", "172.30.0.10:53", Some(Proto::Udp)).await;
    assert_to_host(&r);
    assert_eq!(owner_in(&r, 60), "service/team-a/web");
    // An unlisted port: table 60's default drop.
    let r = n.trace("team-a/a1", "team-a/web:8080", None).await;
    assert_dropped(&r, 60, "base");
    // Another tenant on a listed port: the service flow matches, the policy table drops.
    let r = n.trace("team-b/b1", "team-a/web:80", None).await;
    assert_eq!(owner_in(&r, 60), "service/team-a/web");
    assert_dropped(&r, 80, "base");
}

#[tokio::test]
async fn egress_policy_allows_and_denies_by_its_own_flows() {
    let n = Node::start().await;
    let r = n.trace("team-a/a1", "1.2.3.4:443", None).await;
    assert_to_host(&r);
    assert_eq!(owner_in(&r, 100), "egress/11");
    let r = n.trace("team-a/a1", "8.8.8.8:53", Some(Proto::Udp)).await;
    assert_dropped(&r, 100, "egress/11");
    let Verdict::Dropped { owner: Some(o), .. } = &r.verdict else { unreachable!() };
    assert_eq!(o.detail.as_deref(), Some("EgressNetworkPolicy team-a/default"), "{}", r.text());
    // team-b has no policy: out through tun0.
    let r = n.trace("team-b/b1", "8.8.8.8:53", Some(Proto::Udp)).await;
    assert_to_host(&r);
}

#[tokio::test]
async fn remote_pods_are_tunnelled_to_their_node() {
    let n = Node::start().await;
    let r = n.trace("team-a/a1", "10.129.0.5", None).await;
    assert_tunnelled(&r, "node-b", "172.17.0.3", 11);
    assert_eq!(owner_in(&r, 90), "hostsubnet/node-b");
    assert!(r.summary.starts_with("TUNNELLED to node node-b (172.17.0.3) with VNID 11"), "{}", r.summary);
    // node-c's fixed VNID replaces the sender's.
    let r = n.trace("team-b/b1", "10.130.0.5:80", None).await;
    assert_tunnelled(&r, "node-c", "172.17.0.4", 7);
    assert_eq!(owner_in(&r, 90), "hostsubnet/node-c");
    // An address no node owns: table 90's default drop.
    let r = n.trace("team-a/a1", "10.131.0.5", None).await;
    assert_dropped(&r, 90, "base");
    // From node-b's pod over VXLAN, with the destination's VNID (the default) or another.
    let r = n.trace("10.129.0.5", "team-a/a1", None).await;
    assert_delivered_to_pod(&r, "team-a/a1");
    assert_eq!(owner_in(&r, 10), "hostsubnet/node-b", "accepted from a known node");
    let mut a = n.args();
    (a.from, a.to, a.vnid) = (Some("10.129.0.5".into()), Some("team-a/a1".into()), Some(12));
    let r = trace::run(&a).await.unwrap();
    assert_dropped(&r, 80, "base");
}

#[tokio::test]
async fn raw_flows_and_missing_sources() {
    let n = Node::start().await;
    let ofport = |veth: &str| -> u32 {
        let out = support::agent::vsctl(&n.agent.sb, &["get", "interface", veth, "ofport"]);
        out.trim().parse().unwrap()
    };
    let mut a = n.args();
    a.flow = Some(format!("in_port={},ip,nw_src=10.128.2.5,nw_dst=10.128.2.7", ofport("veth-a1")));
    let r = trace::run(&a).await.unwrap();
    assert_dropped(&r, 80, "base");
    assert_eq!(owner_in(&r, 70), "pod/team-b/b1");

    // No state file and no agent: pods unknown, yet the VNID-keyed owner is still named (found
    // by search) and the singletons are; pod owners are "pod (unknown object)".
    a.state = None;
    a.socket = PathBuf::from("/nonexistent/cni.sock");
    a.flow = Some(format!("in_port={},ip,nw_src=10.128.2.5,nw_dst=10.128.2.6", ofport("veth-a1")));
    let r = trace::run(&a).await.unwrap();
    assert!(!r.notes.is_empty());
    assert_eq!(owner_in(&r, 80), "vnid/11");
    let s20 = r.steps.iter().find(|s| s.step.table == 20).unwrap();
    assert_eq!(s20.owner.as_ref().unwrap().to_string(), "pod (unknown object)");
    assert_eq!(outputs(&r)[0].interface.as_deref(), Some("veth-a2"), "named from OVSDB");

    // A flow OVS cannot parse: its own error, no panic.
    a.flow = Some("in_port=3,nw_src=banana".into());
    let e = trace::run(&a).await.unwrap_err();
    assert!(e.contains("ovs-vswitchd"), "{e}");
    // Unknown pods name the known ones.
    let mut a = n.args();
    (a.from, a.to) = (Some("team-a/nope".into()), Some("a2".into()));
    let e = trace::run(&a).await.unwrap_err();
    assert!(e.contains("team-a/a1"), "{e}");
}

#[tokio::test]
async fn the_command_prints_a_blocked_pair() {
    let n = Node::start().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(["trace", "--from", "team-a/a1", "--to", "team-b/b1:80", "--bridge", "br0"])
        .arg("--ovs-rundir")
        .arg(n.agent.sb.dir())
        .arg("--state")
        .arg(&n.agent.state)
        .arg("--socket")
        .arg(&n.agent.socket)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("verdict: DROPPED in table 80 by base (the pipeline's fixed flows): the table's default drop: no rule lets VNID 11 reach VNID 12"),
        "{text}"
    );
    assert!(text.contains("owner: pod/team-b/b1"), "{text}");
    assert!(!text.contains("note:"), "the state file, the agent and OVSDB all answered: {text}");
    let json = tokio::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(["trace", "--json", "--from", "team-a/a1", "--to", "team-a/a2"])
        .arg("--ovs-rundir")
        .arg(n.agent.sb.dir())
        .arg("--state")
        .arg(&n.agent.state)
        .arg("--socket")
        .arg(&n.agent.socket)
        .output()
        .await
        .unwrap();
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["verdict"], "forwarded");
    assert_eq!(v["outputs"][0]["pod"], "team-a/a2");
}

/// Installed flows per table and per owner kind, as ovs-ofctl sees them.
fn ofctl_counts(sb: &sdn_harness::sandbox::OvsSandbox) -> (BTreeMap<u8, usize>, BTreeMap<String, usize>) {
    let mut tables = BTreeMap::new();
    let mut kinds = BTreeMap::new();
    for line in support::ofctl(sb, &["dump-flows", "br0"]).lines().filter(|l| l.contains("actions=")) {
        let field = |name: &str| line.split([',', ' ']).find_map(|w| w.trim().strip_prefix(name)).map(str::to_string);
        let table: u8 = field("table=").map(|t| t.parse().unwrap()).unwrap_or(0);
        *tables.entry(table).or_insert(0) += 1;
        let cookie = field("cookie=0x").map(|c| u64::from_str_radix(&c, 16).unwrap()).unwrap_or(0);
        let kind = sdn_node::store::Owner::kind_name((cookie >> 56) as u8).unwrap_or("none").to_string();
        *kinds.entry(kind).or_insert(0) += 1;
    }
    (tables, kinds)
}

#[tokio::test]
async fn status_agrees_with_the_switch() {
    let n = Node::start().await;
    let s = sdn_node::api::status::fetch(&n.agent.socket).await.unwrap();
    println!("{s}");
    assert!(s.switch.connected && s.ovsdb.connected, "{s}");
    assert_eq!(s.not_ready, None);
    assert_eq!(s.pipeline_version, 3);
    assert_eq!(s.plugin.as_deref(), Some("multitenant"));
    assert_eq!(s.pods.total, 6);
    assert_eq!(s.pods.with_port, 6);
    let fl = s.flows.as_ref().expect("engine running");
    assert!(!fl.dirty);
    let (tables, kinds) = ofctl_counts(&n.agent.sb);
    assert_eq!(fl.per_table, tables, "{s}");
    assert_eq!(fl.per_owner_kind, kinds, "{s}");
    assert_eq!(fl.installed, tables.values().sum::<usize>());
    assert_eq!(fl.desired, fl.installed);
    let last = fl.last_commit.as_ref().expect("a commit happened");
    assert!(last.flow_mods > 0 && last.error.is_none() && last.latency_seconds > 0.0, "{last:?}");
    assert!(fl.last_error.is_none());
    assert_eq!(kinds["pod"], s.pods.total * tables_per_pod(&n).await, "pod flows are counted as pods'");

    // A pod set up through the API shows up, and the counts still agree.
    let p = support::inproc::pod("x1", "team-b", "10.128.2.40", 0x40);
    assert_eq!(support::inproc::add(&n.agent.socket, &p).await.0, 200);
    let s2 = sdn_node::api::status::fetch(&n.agent.socket).await.unwrap();
    assert_eq!((s2.pods.total, s2.pods.api), (7, 1));
    assert!(s2.pods.names.contains(&"team-b/x1".to_string()));
    let (tables, _) = ofctl_counts(&n.agent.sb);
    assert_eq!(s2.flows.as_ref().unwrap().per_table, tables);
    assert!(s2.flows.as_ref().unwrap().bundles > fl.bundles);

    // The command, both forms.
    for json in [false, true] {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"));
        cmd.arg("status").arg("--socket").arg(&n.agent.socket);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().await.unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        if json {
            let v: sdn_node::api::status::Status = serde_json::from_str(&text).unwrap();
            assert_eq!(v.flows.unwrap().per_table, tables);
        } else {
            assert!(text.contains("switch:     connected"), "{text}");
        }
    }
}

/// Flows one pod owns (the pipeline's, counted on the switch for team-a/a1).
async fn tables_per_pod(n: &Node) -> usize {
    let lines = support::ofctl(&n.agent.sb, &["dump-flows", "br0"]);
    let cookie = sdn_node::store::Owner::Pod { namespace: "team-a".into(), name: "a1".into() }.cookie(0)
        & sdn_node::store::Owner::OWNER_MASK;
    lines
        .lines()
        .filter(|l| {
            l.split([',', ' '])
                .find_map(|w| w.trim().strip_prefix("cookie=0x"))
                .and_then(|c| u64::from_str_radix(c, 16).ok())
                .is_some_and(|c| c & sdn_node::store::Owner::OWNER_MASK == cookie)
        })
        .count()
}

/// A node converged by `sdn-node apply` (no agent left running), for traces without the model:
/// two tenants on one node, as in the issue (VNIDs 11 and 4097), and a second node.
struct Applied {
    sb: sdn_harness::sandbox::OvsSandbox,
}

const APPLIED_STATE: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
netNamespaces:
  - {name: team-a, netid: 11}
  - {name: team-x, netid: 4097}
pods:
  - {namespace: team-a, name: a1, containerID: a100000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, mac: "0a:58:0a:80:02:05"}
  - {namespace: team-a, name: a2, containerID: a200000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a2, internal: true, ip: 10.128.2.6, mac: "0a:58:0a:80:02:06"}
  - {namespace: team-x, name: x1, containerID: c800000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-x1, internal: true, ip: 10.128.3.200, mac: "0a:58:0a:80:03:c8"}
"#;

impl Applied {
    async fn start() -> Applied {
        Applied::start_with(APPLIED_STATE).await
    }

    async fn start_with(state_text: &str) -> Applied {
        let sb = sdn_harness::sandbox::OvsSandbox::start(Default::default()).await.expect("start ovs sandbox");
        let state = sb.dir().join("state.yaml");
        std::fs::write(&state, state_text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
            .args(["apply", "--datapath-type", "dummy", "--state"])
            .arg(&state)
            .arg("--ovs-rundir")
            .arg(sb.dir())
            .output()
            .unwrap();
        assert!(out.status.success(), "apply: {}", String::from_utf8_lossy(&out.stderr));
        // The trace must not find the model by accident.
        std::fs::remove_file(&state).unwrap();
        Applied { sb }
    }

    fn ofport(&self, iface: &str) -> u32 {
        support::agent::vsctl(&self.sb, &["get", "interface", iface, "ofport"]).trim().parse().unwrap()
    }

    /// `sdn-node trace ARGS --ovs-rundir DIR`, with no state file and no agent listening.
    fn trace(&self, args: &[&str]) -> (i32, String, String) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
            .arg("trace")
            .args(args)
            .arg("--ovs-rundir")
            .arg(self.sb.dir())
            .arg("--socket")
            .arg(self.sb.dir().join("no-agent.sock"))
            .env_remove("OVS_RUNDIR")
            .output()
            .unwrap();
        let code = out.status.code().unwrap_or(-1);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        println!("trace {args:?} -> {code}:\n{stdout}{stderr}");
        (code, stdout.into_owned(), stderr.into_owned())
    }

    fn trace_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let (code, out, err) = self.trace(&a);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str(&out).unwrap()
    }

    /// Asserts a failed trace whose message contains every one of `want`.
    fn trace_error(&self, args: &[&str], want: &[&str]) -> String {
        let (code, out, err) = self.trace(args);
        assert_eq!(code, 1, "a trace that cannot know the source fails: {out}{err}");
        assert!(out.is_empty(), "no verdict is printed: {out}");
        for w in want {
            assert!(err.contains(w), "{w:?} in {err}");
        }
        err
    }
}

#[tokio::test]
async fn without_agent_or_state_the_issue_case_is_dropped_by_vnid_isolation() {
    let n = Applied::start().await;
    let (a1, x1) = (n.ofport("veth-a1"), n.ofport("veth-x1"));
    // The issue's command: the packet enters by a1's port (table 20 gives it VNID 11), not by
    // tun0 (VNID 0, which every pod accepts).
    let (code, out, err) = n.trace(&["--from", "10.128.2.5", "--to", "10.128.3.200", "--proto", "icmp"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "trace br0: in_port={a1},dl_src=0a:58:0a:80:02:05,dl_dst=0a:58:0a:80:03:c8,icmp,nw_src=10.128.2.5,\
             nw_dst=10.128.3.200,icmp_type=8,icmp_code=0"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("from local pod 10.128.2.5 (port {a1} veth-a1, VNID 11, container a10000000000;")),
        "{out}"
    );
    assert!(out.contains(&format!("to   local pod 10.128.3.200 (port {x1} veth-x1, VNID 4097,")), "{out}");
    assert!(
        out.contains("verdict: DROPPED in table 80 by base (the pipeline's fixed flows): the table's default drop: no rule lets VNID 11 reach VNID 4097"),
        "{out}"
    );
    assert!(!out.contains("DELIVERED"), "{out}");
    assert!(out.contains("note: agent not reachable"), "the missing model is said: {out}");
    // And back.
    let v = n.trace_json(&["--from", "10.128.3.200", "--to", "10.128.2.5", "--proto", "icmp"]);
    assert_eq!(
        (v["from"]["type"].as_str(), v["from"]["ofport"].as_u64(), v["from"]["vnid"].as_u64()),
        (Some("port_pod"), Some(u64::from(x1)), Some(4097))
    );
    assert_eq!((v["verdict"].as_str(), v["table"].as_u64()), (Some("dropped"), Some(80)), "{v}");
    assert!(v["reason"].as_str().unwrap().ends_with("no rule lets VNID 4097 reach VNID 11"), "{v}");
    assert_eq!(v["datapath_actions"], "drop");
}

#[tokio::test]
async fn without_agent_or_state_same_vnid_pods_and_outside_senders_are_delivered() {
    let n = Applied::start().await;
    let (a1, a2) = (n.ofport("veth-a1"), n.ofport("veth-a2"));
    let v = n.trace_json(&["--from", "10.128.2.5", "--to", "10.128.2.6:8080"]);
    assert_eq!((v["from"]["ofport"].as_u64(), v["from"]["vnid"].as_u64()), (Some(u64::from(a1)), Some(11)), "{v}");
    assert_eq!(v["from"]["interface"], "veth-a1");
    assert_eq!(v["from"]["mac"], "0a:58:0a:80:02:05");
    assert_eq!(v["verdict"], "forwarded", "{v}");
    assert_eq!(v["outputs"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(
        (v["outputs"][0]["port"].as_u64(), v["outputs"][0]["interface"].as_str()),
        (Some(u64::from(a2)), Some("veth-a2"))
    );
    assert_eq!(v["summary"], format!("DELIVERED to port {a2} (veth-a2)"));
    let tables: Vec<u64> = v["steps"].as_array().unwrap().iter().map(|s| s["table"].as_u64().unwrap()).collect();
    assert_eq!(tables, [0, 20, 21, 30, 70, 80], "{v}");
    assert!(v["flow"].as_str().unwrap().contains("tcp,nw_src=10.128.2.5,nw_dst=10.128.2.6,tcp_dst=8080"), "{v}");

    // An address outside every pod network really comes through tun0, with VNID 0.
    let v = n.trace_json(&["--from", "8.8.8.8", "--to", "10.128.2.5", "--proto", "icmp"]);
    assert!(v["flow"].as_str().unwrap().starts_with("in_port=2,"), "{v}");
    assert_eq!(
        (v["verdict"].as_str(), v["outputs"][0]["port"].as_u64()),
        (Some("forwarded"), Some(u64::from(a1))),
        "{v}"
    );

    // A pod of node-b (table 90 routes its subnet there) arrives over VXLAN with the VNID given.
    let v = n.trace_json(&["--from", "10.129.0.5", "--to", "10.128.2.5", "--vnid", "11"]);
    assert!(v["flow"].as_str().unwrap().starts_with("in_port=1,tun_src=172.17.0.3,tun_id=0xb,"), "{v}");
    assert_eq!((v["from"]["type"].as_str(), v["from"]["node_ip"].as_str()), (Some("remote_pod"), Some("172.17.0.3")));
    assert_eq!(
        (v["verdict"].as_str(), v["outputs"][0]["port"].as_u64()),
        (Some("forwarded"), Some(u64::from(a1))),
        "{v}"
    );
    let v = n.trace_json(&["--from", "10.129.0.5", "--to", "10.128.2.5", "--vnid", "4097"]);
    assert_eq!((v["verdict"].as_str(), v["table"].as_u64()), (Some("dropped"), Some(80)), "{v}");

    // An unknown destination is the switch's to judge: table 70 has no flow for it.
    let v = n.trace_json(&["--from", "10.128.2.5", "--to", "10.128.2.99"]);
    assert_eq!((v["verdict"].as_str(), v["table"].as_u64()), (Some("dropped"), Some(70)), "{v}");
}

#[tokio::test]
async fn without_agent_or_state_an_unknown_source_is_an_error_naming_it() {
    let n = Applied::start().await;
    // In the local subnet, but no pod has it.
    n.trace_error(
        &["--from", "10.128.2.99", "--to", "10.128.2.5"],
        &["source 10.128.2.99", "pod subnet 10.128.2.0/23", "no pod has it", "table 20", "--state", "--socket"],
    );
    // In the cluster network, but on no node.
    n.trace_error(
        &["--from", "10.131.0.5", "--to", "10.128.2.5"],
        &["source 10.131.0.5", "cluster network 10.128.0.0/14", "no table 90 flow", "--state"],
    );
    // Another node's pod: its VNID is that node's to know.
    n.trace_error(&["--from", "10.129.0.5", "--to", "10.128.2.5"], &["source 10.129.0.5", "172.17.0.3", "--vnid"]);

    // No pipeline on the bridge at all: nothing says what any address is.
    support::agent::vsctl(&n.sb, &["del-br", "br0"]);
    support::agent::vsctl(&n.sb, &["add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=dummy"]);
    n.trace_error(
        &["--from", "10.128.2.5", "--to", "10.128.3.200"],
        &["source 10.128.2.5", "pipeline installed", "--state"],
    );
}

/// Without the agent, the pod records it keeps on its API pods' ports still name them.
#[tokio::test]
async fn without_agent_or_state_recorded_pods_are_named() {
    let n = Node::start().await;
    let p = support::inproc::pod("x1", "team-b", "10.128.2.40", 0x40);
    assert_eq!(support::inproc::add(&n.agent.socket, &p).await.0, 200);
    let mut a = n.args();
    a.state = None;
    a.socket = PathBuf::from("/nonexistent/cni.sock");
    for from in ["10.128.2.40", "team-b/x1"] {
        (a.from, a.to) = (Some(from.into()), Some("10.128.2.5".into()));
        let r = trace::run(&a).await.unwrap();
        match &r.from {
            Some(trace::Endpoint::Pod { pod }) => {
                assert_eq!(
                    (pod.namespace.as_str(), pod.name.as_str(), pod.mac.as_str()),
                    ("team-b", "x1", "0a:58:0a:80:00:40")
                );
            }
            e => panic!("{e:?}\n{}", r.text()),
        }
        assert_eq!(owner_in(&r, 20), "pod/team-b/x1");
        assert!(r.summary.ends_with("no rule lets VNID 12 reach VNID 11"), "{}", r.summary);
    }
    // As a destination it is named too.
    (a.from, a.to) = (Some("10.128.2.10".into()), Some("10.128.2.40".into()));
    let r = trace::run(&a).await.unwrap();
    assert_delivered_to_pod(&r, "team-b/x1");
    assert!(matches!(&r.from, Some(trace::Endpoint::PortPod { vnid: 12, .. })), "{:?}", r.from);
}

/// A dual-stack node-a: every node has an IPv6 subnet beside its IPv4 one, the pods an address
/// of each family, the service a cluster IP of each; node-c is on an IPv6 underlay.
const STATE6: &str = r#"
node: node-a
plugin: multitenant
clusterNetworks: [10.128.0.0/14, "fd00:10:128::/48"]
serviceNetworks: [172.30.0.0/16, "fd00:172:30::/112"]
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnets: [10.128.2.0/23, "fd00:10:128:2::/64"]}
  - {host: node-b, hostIP: 172.17.0.3, subnets: [10.129.0.0/23, "fd00:10:128:100::/64"]}
  - {host: node-c, hostIP: "fd00:172:17::4", subnets: [10.130.0.0/23, "fd00:10:128:200::/64"], fixedVNID: 7}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11}
  - {name: team-b, netid: 12}
services:
  - {namespace: team-a, name: web, clusterIPs: [172.30.0.10, "fd00:172:30::10"], ports: [{protocol: TCP, port: 80}]}
  - {namespace: team-b, name: v4only, clusterIP: 172.30.0.20, ports: [{protocol: TCP, port: 80}]}
pods:
  - {namespace: team-a, name: a1, containerID: a100000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, ips: [10.128.2.5, "fd00:10:128:2::5"], mac: "0a:58:0a:80:02:05"}
  - {namespace: team-a, name: a2, containerID: a200000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a2, internal: true, ip: 10.128.2.6, ips: [10.128.2.6, "fd00:10:128:2::6"], mac: "0a:58:0a:80:02:06"}
  - {namespace: team-b, name: b1, containerID: b100000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-b1, internal: true, ip: 10.128.2.7, ips: [10.128.2.7, "fd00:10:128:2::7"], mac: "0a:58:0a:80:02:07"}
  - {namespace: team-b, name: b4, containerID: b400000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-b4, internal: true, ip: 10.128.2.8, mac: "0a:58:0a:80:02:08"}
"#;

async fn dual_stack_node() -> Node {
    let agent = support::inproc::start(STATE6).await;
    let ctl = trace::unixctl::find_vswitchd_ctl(agent.sb.dir()).expect("vswitchd control socket");
    trace::unixctl::call(&ctl, "dpif/set-dp-features", &["br0", "tnl_push_pop", "false"], Duration::from_secs(10))
        .await
        .expect("set dp features");
    Node { agent }
}

/// IPv6 between pods of one VNID is delivered, by address or by name with `--ipv6`, with the
/// same owners as IPv4; the packet is IPv6 from end to end.
#[tokio::test]
async fn ipv6_same_vnid_is_delivered() {
    let n = dual_stack_node().await;
    let r = n.trace("fd00:10:128:2::5", "fd00:10:128:2::6", Some(Proto::Icmp)).await;
    assert_delivered_to_pod(&r, "team-a/a2");
    assert!(
        r.flow.ends_with("icmp6,ipv6_src=fd00:10:128:2::5,ipv6_dst=fd00:10:128:2::6,icmpv6_type=128,icmpv6_code=0"),
        "{}",
        r.flow
    );
    assert!(r.ovs_flow.starts_with("icmp6,"), "OVS read an ICMPv6 packet: {}", r.ovs_flow);
    assert_eq!(tables(&r), [0, 20, 21, 30, 70, 80]);
    assert_eq!(owner_in(&r, 20), "pod/team-a/a1");
    assert_eq!(owner_in(&r, 70), "pod/team-a/a2");
    assert_eq!(owner_in(&r, 80), "vnid/11");
    // By name, TCP to a port: the pods' IPv6 addresses.
    let mut a = n.args();
    (a.from, a.to, a.ipv6) = (Some("team-a/a1".into()), Some("a2:8080".into()), true);
    let r = trace::run(&a).await.unwrap();
    assert_delivered_to_pod(&r, "team-a/a2");
    assert!(r.flow.ends_with("tcp6,ipv6_src=fd00:10:128:2::5,ipv6_dst=fd00:10:128:2::6,tcp_dst=8080"), "{}", r.flow);
    // A bracketed address takes a port; UDP.
    let r = n.trace("team-a/a2", "[fd00:10:128:2::5]:53", Some(Proto::Udp)).await;
    assert_delivered_to_pod(&r, "team-a/a1");
    assert!(r.flow.ends_with("udp6,ipv6_src=fd00:10:128:2::6,ipv6_dst=fd00:10:128:2::5,udp_dst=53"), "{}", r.flow);
    // The IPv4 twin still holds.
    let r = n.trace("team-a/a1", "team-a/a2", None).await;
    assert_delivered_to_pod(&r, "team-a/a2");
    assert!(r.flow.contains(",ip,nw_src=10.128.2.5,nw_dst=10.128.2.6"), "{}", r.flow);
}

/// VNID isolation holds for IPv6: another tenant's pod is dropped by table 80's default drop.
#[tokio::test]
async fn ipv6_other_vnid_is_dropped() {
    let n = dual_stack_node().await;
    let r = n.trace("fd00:10:128:2::5", "fd00:10:128:2::7", Some(Proto::Icmp)).await;
    assert_eq!(owner_in(&r, 70), "pod/team-b/b1");
    assert_dropped(&r, 80, "base");
    assert!(r.summary.ends_with("no rule lets VNID 11 reach VNID 12"), "{}", r.summary);
    // Services by their IPv6 cluster IP: same tenant to tun0, the other dropped.
    let r = n.trace("fd00:10:128:2::5", "[fd00:172:30::10]:80", None).await;
    assert_to_host(&r);
    assert_eq!(owner_in(&r, 60), "service/team-a/web");
    let mut a = n.args();
    (a.from, a.to, a.ipv6) = (Some("team-b/b1".into()), Some("team-a/web:80".into()), true);
    let r = trace::run(&a).await.unwrap();
    assert_eq!(owner_in(&r, 60), "service/team-a/web");
    assert_dropped(&r, 80, "base");
}

/// IPv6 to another node's pod is tunnelled (over the IPv4 underlay to node-b, the IPv6 one to
/// node-c), and node-b's pod arrives over VXLAN.
#[tokio::test]
async fn ipv6_remote_pods_are_tunnelled() {
    let n = dual_stack_node().await;
    let r = n.trace("fd00:10:128:2::5", "fd00:10:128:100::9", None).await;
    assert_tunnelled(&r, "node-b", "172.17.0.3", 11);
    assert_eq!(owner_in(&r, 90), "hostsubnet/node-b");
    assert_eq!(tables(&r), [0, 20, 21, 30, 90]);
    assert!(r.summary.starts_with("TUNNELLED to node node-b (172.17.0.3) with VNID 11"), "{}", r.summary);
    let r = n.trace("fd00:10:128:2::7", "fd00:10:128:200::9", None).await;
    let o = outputs(&r);
    let t = o[0].tunnel.as_ref().unwrap_or_else(|| panic!("{}", r.text()));
    assert_eq!((t.node.as_deref(), t.dst.map(|d| d.to_string()), t.vnid), (Some("node-c"), Some("fd00:172:17::4".into()), Some(7)));
    assert!(r.datapath_actions.as_deref().unwrap_or("").contains("ipv6_dst=fd00:172:17::4"), "{}", r.text());
    // From node-b's pod, over VXLAN, with the destination's VNID.
    let r = n.trace("fd00:10:128:100::9", "team-a/a1", Some(Proto::Icmp)).await;
    assert!(r.flow.starts_with("in_port=1,tun_src=172.17.0.3,tun_dst=172.17.0.2,tun_id=0xb,"), "{}", r.flow);
    assert_delivered_to_pod(&r, "team-a/a1");
    assert_eq!(owner_in(&r, 10), "hostsubnet/node-b");
    // An IPv6 address of no node's subnet: table 90's default drop.
    let r = n.trace("team-a/a1", "fd00:10:128:300::9", Some(Proto::Icmp)).await;
    assert_dropped(&r, 90, "base");
}

/// A trace's ends are of one family; a name without an address of the asked family is an
/// error that says so.
#[tokio::test]
async fn ipv6_ends_must_have_ipv6() {
    let n = dual_stack_node().await;
    let err = |from: &str, to: &str, ipv6: bool| {
        let mut a = n.args();
        (a.from, a.to, a.ipv6) = (Some(from.into()), Some(to.into()), ipv6);
        async move { trace::run(&a).await.unwrap_err() }
    };
    assert!(err("10.128.2.5", "fd00:10:128:2::6", false).await.contains("two IP families"));
    assert!(err("team-b/b4", "team-b/b1", true).await.contains("pod team-b/b4 has no IPv6 address"));
    assert!(err("team-b/b1", "team-b/v4only:80", true).await.contains("no IPv6 cluster IP"));
    // The IPv4-only pod still traces IPv4.
    let r = n.trace("team-b/b4", "team-b/b1", None).await;
    assert_delivered_to_pod(&r, "team-b/b1");
}

/// Without the agent or the state file, br0's IPv6 flows place the addresses: the command
/// traces IPv6 from the switch's own view.
#[tokio::test]
async fn without_agent_or_state_ipv6_is_placed_by_the_switch() {
    let n = Applied::start_with(STATE6).await;
    let ctl = trace::unixctl::find_vswitchd_ctl(n.sb.dir()).expect("vswitchd control socket");
    trace::unixctl::call(&ctl, "dpif/set-dp-features", &["br0", "tnl_push_pop", "false"], Duration::from_secs(10))
        .await
        .expect("set dp features");
    let (a1, a2) = (n.ofport("veth-a1"), n.ofport("veth-a2"));
    let v = n.trace_json(&["--from", "fd00:10:128:2::5", "--to", "fd00:10:128:2::6", "--proto", "icmp"]);
    assert_eq!(
        (v["from"]["type"].as_str(), v["from"]["ofport"].as_u64(), v["from"]["vnid"].as_u64(), v["from"]["ip"].as_str()),
        (Some("port_pod"), Some(u64::from(a1)), Some(11), Some("fd00:10:128:2::5")),
        "{v}"
    );
    assert_eq!(v["from"]["mac"], "0a:58:0a:80:02:05");
    assert_eq!((v["verdict"].as_str(), v["outputs"][0]["port"].as_u64()), (Some("forwarded"), Some(u64::from(a2))), "{v}");
    let v = n.trace_json(&["--from", "fd00:10:128:2::5", "--to", "fd00:10:128:2::7", "--proto", "icmp"]);
    assert_eq!((v["verdict"].as_str(), v["table"].as_u64()), (Some("dropped"), Some(80)), "{v}");
    assert!(v["reason"].as_str().unwrap().ends_with("no rule lets VNID 11 reach VNID 12"), "{v}");
    let v = n.trace_json(&["--from", "fd00:10:128:2::5", "--to", "fd00:10:128:100::9"]);
    assert_eq!(v["verdict"], "forwarded", "{v}");
    assert_eq!((v["outputs"][0]["tunnel"]["dst"].as_str(), v["outputs"][0]["tunnel"]["vnid"].as_u64()), (Some("172.17.0.3"), Some(11)), "{v}");
    // node-b's pod over VXLAN, with the VNID given.
    let v = n.trace_json(&["--from", "fd00:10:128:100::9", "--to", "fd00:10:128:2::5", "--vnid", "11", "--proto", "icmp"]);
    assert_eq!((v["from"]["type"].as_str(), v["from"]["node_ip"].as_str()), (Some("remote_pod"), Some("172.17.0.3")), "{v}");
    assert_eq!((v["verdict"].as_str(), v["outputs"][0]["port"].as_u64()), (Some("forwarded"), Some(u64::from(a1))), "{v}");
    // An unknown IPv6 source in the node's IPv6 subnet is an error naming table 20's IPv6 flow.
    n.trace_error(
        &["--from", "fd00:10:128:2::99", "--to", "fd00:10:128:2::5"],
        &["source fd00:10:128:2::99", "pod subnet fd00:10:128:2::/64", "ipv6_src=fd00:10:128:2::99"],
    );
    n.trace_error(
        &["--from", "fd00:10:128:300::9", "--to", "fd00:10:128:2::5"],
        &["cluster network fd00:10:128::/48", "no table 90 flow"],
    );
    // An outside IPv6 sender comes in through tun0 (VNID 0, which every pod accepts).
    let v = n.trace_json(&["--from", "2001:db8::1", "--to", "fd00:10:128:2::5", "--proto", "icmp"]);
    assert!(v["flow"].as_str().unwrap().starts_with("in_port=2,"), "{v}");
    assert_eq!((v["verdict"].as_str(), v["outputs"][0]["port"].as_u64()), (Some("forwarded"), Some(u64::from(a1))), "{v}");
    // `-6` names the family for named ends... which need the model: without it, names fail.
    let (code, _, err) = n.trace(&["-6", "--from", "team-a/a1", "--to", "team-a/a2"]);
    assert_eq!(code, 1);
    assert!(err.contains("no pods are known by name"), "{err}");
}

/// `status` lists both families' networks, subnets and gateways, and the pods per family, in
/// JSON (typed) and in the text.
#[tokio::test]
async fn status_lists_both_families() {
    let n = dual_stack_node().await;
    let s = sdn_node::api::status::fetch(&n.agent.socket).await.unwrap();
    let nets = s.networks.as_ref().expect("a state");
    let v4 = nets.ipv4.as_ref().expect("an IPv4 cluster");
    assert_eq!(v4.gateway, Some("10.128.2.1".parse().unwrap()));
    assert_eq!(v4.pods, 4);
    let v6 = nets.ipv6.as_ref().expect("dual-stack");
    assert_eq!(
        (v6.cluster_network.to_string(), v6.service_network.to_string()),
        ("fd00:10:128::/48".to_string(), "fd00:172:30::/112".to_string())
    );
    assert_eq!(v6.local_subnet, Some("fd00:10:128:2::/64".parse().unwrap()));
    assert_eq!(v6.gateway, Some("fd00:10:128:2::1".parse().unwrap()));
    assert_eq!(v6.pods, 3, "b4 is IPv4-only");
    for json in [false, true] {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"));
        cmd.arg("status").arg("--socket").arg(&n.agent.socket);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().await.unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        if json {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["networks"]["ipv6"]["gateway"], "fd00:10:128:2::1", "{v}");
            assert_eq!(v["networks"]["ipv4"]["local_subnet"], "10.128.2.0/23", "{v}");
        } else {
            assert!(text.contains("networks:   dual-stack"), "{text}");
            assert!(text.contains("  IPv6  cluster fd00:10:128::/48, service fd00:172:30::/112, subnet fd00:10:128:2::/64, gateway fd00:10:128:2::1, 3 pods"), "{text}");
            assert!(text.contains("  by family: 4 IPv4, 3 IPv6"), "{text}");
        }
    }
}
