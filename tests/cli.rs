//! The `sdn-node` binary as a user runs it: apply (twice), rejected objects, dump-flows.

mod support;

use std::process::Command;

use support::*;

fn sdn_node(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sdn-node")).args(args).env("RUST_LOG", "warn").output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

const STATE: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11}
services:
  - {namespace: team-a, name: web, clusterIP: 172.30.0.10, ports: [{protocol: TCP, port: 80}]}
pods:
  - {namespace: team-a, name: a1, containerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, mac: "0a:58:0a:80:02:05"}
  - {namespace: team-a, name: bad-id, containerID: "xyz", hostVeth: veth-x, internal: true, ip: 10.128.2.6, mac: "0a:58:0a:80:02:06"}
  - {namespace: team-a, name: outside, containerID: "1123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
     hostVeth: veth-o, internal: true, ip: 10.130.0.9, mac: "0a:58:0a:80:02:07"}
"#;

#[tokio::test]
async fn apply_twice_then_dump() {
    let sb = sdn_harness::sandbox::OvsSandbox::start(Default::default()).await.unwrap();
    let state = sb.dir().join("state.yaml");
    std::fs::write(&state, STATE).unwrap();
    let dir = sb.dir().display().to_string();
    let apply = ["apply", "--state", state.to_str().unwrap(), "--ovs-rundir", &dir, "--datapath-type", "dummy"];

    let (code, _, err) = sdn_node(&apply);
    assert_eq!(code, 2, "some objects were rejected: {err}");
    assert!(err.contains("pod team-a/bad-id: field containerID"), "{err}");
    assert!(err.contains("pod team-a/outside: field ip: 10.130.0.9 is not a host address"), "{err}");
    assert!(err.contains("2 object(s) rejected"), "{err}");

    // Second run: nothing to send.
    let (code, _, err) = sdn_node(&apply);
    assert_eq!(code, 2);
    assert!(err.contains("(0 added, 0 modified, 0 deleted; 0 ports added, 0 removed)"), "{err}");

    // dump-flows prints what ovs-ofctl prints (cookies included), sorted by table then priority.
    let (code, out, err) = sdn_node(&["dump-flows", "--ovs-rundir", &dir]);
    assert_eq!(code, 0, "{err}");
    let mut ours: Vec<String> = out.lines().map(|l| l.trim().to_string()).collect();
    ours.sort();
    assert_eq!(ours, dump_sorted(&sb, &[]));

    // One object's flows, selected by cookie on the switch.
    let (code, out, _) = sdn_node(&["dump-flows", "--ovs-rundir", &dir, "--owner", "pod/team-a/a1"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines.iter().all(|l| l.contains("10.128.2.5")), "{out}");
    let (_, out, _) = sdn_node(&["dump-flows", "--ovs-rundir", &dir, "--table", "253"]);
    assert!(out.trim().ends_with("table=253, actions=note:01.03.00.00.00.00"), "{out}");
    let (code, _, err) = sdn_node(&["dump-flows", "--ovs-rundir", &dir, "--owner", "pod/x"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown owner"), "{err}");
}

#[tokio::test]
async fn a_fatal_state_error_changes_nothing() {
    let sb = sandbox_with_bridge().await;
    ofctl(&sb, &["add-flow", "br0", "table=5,priority=1,actions=drop"]);
    let before = dump_sorted(&sb, &[]);
    let state = sb.dir().join("state.yaml");
    std::fs::write(&state, STATE.replace("clusterNetwork: 10.128.0.0/14", "clusterNetwork: 10.128.0.0/99")).unwrap();
    let dir = sb.dir().display().to_string();
    let (code, _, err) = sdn_node(&["apply", "--state", state.to_str().unwrap(), "--ovs-rundir", &dir, "--datapath-type", "dummy"]);
    assert_eq!(code, 1);
    assert!(err.contains("field clusterNetwork"), "{err}");
    assert_eq!(dump_sorted(&sb, &[]), before);
}

/// dump-flows prints a dual-stack node's IPv6 flows as ovs-ofctl does (the codec's Display):
/// the whole dump agrees line for line, and the IPv6 shapes are all there.
#[tokio::test]
async fn dump_flows_prints_ipv6_flows() {
    let sb = sdn_harness::sandbox::OvsSandbox::start(Default::default()).await.unwrap();
    let state = sb.dir().join("state.yaml");
    std::fs::write(&state, include_str!("../deploy/examples/dual-stack.yaml")).unwrap();
    let dir = sb.dir().display().to_string();
    let (code, _, err) =
        sdn_node(&["apply", "--state", state.to_str().unwrap(), "--ovs-rundir", &dir, "--datapath-type", "dummy"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = sdn_node(&["dump-flows", "--ovs-rundir", &dir]);
    assert_eq!(code, 0, "{err}");
    let mut ours: Vec<String> = out.lines().map(|l| l.trim().to_string()).collect();
    ours.sort();
    assert_eq!(ours, dump_sorted(&sb, &[]));
    let v6: Vec<&String> = ours.iter().filter(|l| l.contains("ipv6") || l.contains("icmp6")).collect();
    for want in [
        ",ipv6,in_port=1,ipv6_src=fd00:10:128::/48,ipv6_dst=fd00:10:128:2::/64 ",
        "table=30, priority=300,icmp6,icmp_type=135,nd_target=fd00:10:128:2::1 ",
        "table=30, priority=100,ipv6,ipv6_dst=fd00:172:30::/112 ",
        "table=90, priority=100,ipv6,ipv6_dst=fd00:10:128:100::/64 ",
        "table=60, priority=100,tcp6,ipv6_dst=fd00:172:30::10,tp_dst=80 ",
    ] {
        assert!(v6.iter().any(|l| l.contains(want)), "no {want:?} in\n{}", out);
    }
    // One pod's IPv6 flows by owner, beside its IPv4 ones (the pods, if the example lists
    // any, are dual-stack).
    let (state_parsed, _) = sdn_node::cluster::state_file::parse(include_str!("../deploy/examples/dual-stack.yaml")).unwrap();
    if let Some(p) = state_parsed.pods.first() {
        let (code, out, _) = sdn_node(&["dump-flows", "--ovs-rundir", &dir, "--owner", &format!("pod/{}/{}", p.namespace, p.name)]);
        assert_eq!(code, 0);
        let ip6 = p.ip6.expect("a dual-stack pod").to_string();
        assert!(out.lines().any(|l| l.contains("ipv6,in_port=") && l.contains(&format!("ipv6_src={ip6} "))), "{out}");
    }
}
