//! Bad input, one class per test, through both commands:
//!
//! - `sdn-node apply` exits 2 and names each rejected object and field on stderr; the rest of
//!   the state is applied (the switch then holds exactly what the state without the bad parts
//!   gives);
//! - `sdn-node run` logs the same object and field, and keeps every other object installed: the
//!   switch is exactly as with the bad parts simply absent, on the same switch, cookies
//!   included.
//!
//! How a test knows the agent has dealt with a file: each file the agent gets carries a
//! *sentinel* service (172.30.9.K, its own flows in table 60). The agent commits one bundle per
//! state, so once the sentinel of file K is on the switch and that of file K-1 is gone, file K
//! has been applied entirely; the dump is then compared with the sentinel's lines left out.
//!
//! A file that does not parse at all is fatal for `apply` (exit 1, switch untouched) and
//! ignored by `run`, which keeps the last good state installed and goes on following the file.

mod support;

use sdn_harness::sandbox::OvsSandbox;
use support::agent::*;

/// Two pods (team-a/p0 10.128.2.10, team-b/p1 10.128.2.11), a service, an egress policy.
fn base() -> Doc {
    let mut d = Doc::base();
    d.pods = vec![pod("team-a", 0, 0), pod("team-b", 1, 0)];
    d.egress.push(
        "{namespace: team-a, name: default, egress: [{type: Allow, to: {cidrSelector: 1.2.3.0/24}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]}"
            .into(),
    );
    d
}

/// A pod with a given IP and container ID (other fields valid).
fn raw_pod(ns: &str, name: &str, veth: &str, ip: &str, id: &str) -> String {
    format!("{{namespace: {ns}, name: {name}, containerID: \"{id}\", hostVeth: {veth}, internal: true, ip: {ip}, mac: \"0a:58:0a:80:02:99\"}}")
}

fn good_id(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn sentinel_ip(k: u32) -> String {
    format!("172.30.9.{k}")
}

fn with_sentinel(d: &Doc, k: u32) -> String {
    let mut d = d.clone();
    d.services.push(format!(
        "{{namespace: team-a, name: sentinel-{k}, clusterIP: {}, ports: [{{protocol: TCP, port: 1}}]}}",
        sentinel_ip(k)
    ));
    d.comment = format!("sentinel {k}");
    d.render()
}

fn is_sentinel(line: &str) -> bool {
    line.contains("nw_dst=172.30.9.")
}

/// Waits until sentinel `k` is on the switch and `gone` is not; returns the dump (cookies
/// included) without any sentinel line.
async fn after_sentinel(sb: &OvsSandbox, k: u32, gone: Option<u32>) -> Vec<String> {
    let has = |d: &[String], k: u32| d.iter().any(|l| l.contains(&format!("nw_dst={},", sentinel_ip(k))));
    let d = poll_until(&format!("sentinel {k} installed"), 150, || {
        let d = try_dump(sb)?;
        if has(&d, k) && gone.is_none_or(|g| !has(&d, g)) {
            Ok(d)
        } else {
            Err(format!("{} flows, sentinel {k} present: {}", d.len(), has(&d, k)))
        }
    })
    .await;
    d.into_iter().filter(|l| !is_sentinel(l)).collect()
}

fn apply(sb: &OvsSandbox) -> (i32, String) {
    let path = sb.dir().join("state.yaml");
    let (code, _, err) = sdn_node(&[
        "apply",
        "--state",
        path.to_str().unwrap(),
        "--ovs-rundir",
        sb.dir().to_str().unwrap(),
        "--datapath-type",
        "dummy",
    ]);
    (code, err)
}

/// One class of bad input.
struct Case {
    /// Adds the bad objects (or bad parts of objects) to the base state.
    bad: fn(&mut Doc),
    /// The same state with the rejected parts absent (what must be installed).
    good: fn(&mut Doc),
    /// (object, field) of every problem.
    named: &'static [(&'static str, &'static str)],
}

async fn check(case: Case) {
    let sb = OvsSandbox::start(Default::default()).await.expect("start the sandbox");
    let path = sb.dir().join("state.yaml");
    let mut bad = base();
    (case.bad)(&mut bad);
    let mut good = base();
    (case.good)(&mut good);

    // apply: exit 2, each problem named, the rest applied.
    write_state(&path, &bad.render());
    let (code, err) = apply(&sb);
    assert_eq!(code, 2, "apply exits 2 when objects are rejected:\n{err}");
    for (object, field) in case.named {
        assert!(err.contains(&format!("  {object}: field {field}: ")), "apply names {object} / {field}:\n{err}");
    }
    assert!(err.contains(&format!("{} object(s) rejected", case.named.len())), "{err}");
    let applied = dump(&sb);

    // run, from the good state: what it installs is what apply installed from the bad one.
    write_state(&path, &with_sentinel(&good, 1));
    let agent = Agent::spawn(&AgentOptions::new(&path, &sb, "dummy"));
    let installed = after_sentinel(&sb, 1, None).await;
    assert_same(&installed, &applied, "apply installed everything but the rejected parts");

    // run, now the bad state: the same object/field logged, nothing else changes.
    let mark = agent.log.mark();
    write_state(&path, &with_sentinel(&bad, 2));
    for (object, field) in case.named {
        agent.wait_log(mark, &["rejected:", &format!("object={object} field={field}")]).await;
    }
    let now = after_sentinel(&sb, 2, Some(1)).await;
    assert_same(&now, &installed, "the agent keeps every other object installed, and nothing of the rejected ones");
    let mut agent = agent;
    assert!(agent.running(), "the agent keeps running");
    // Rejected objects do not make it unready: it converged to every valid one.
    agent.ready_again("with objects rejected").await;
}

#[tokio::test]
async fn invalid_cidr() {
    check(Case {
        bad: |d| {
            d.host_subnets.push("{host: node-d, hostIP: 172.17.0.5, subnet: 10.131.0.0/33}".into());
            d.egress.push(
                "{namespace: team-b, name: bad-cidr, egress: [{type: Deny, to: {cidrSelector: 1.2.3.0/33}}]}".into(),
            );
        },
        good: |_| {},
        named: &[("hostsubnet node-d", "subnet"), ("egressnetworkpolicy team-b/bad-cidr", "egress[0].to.cidrSelector")],
    })
    .await;
}

#[tokio::test]
async fn pod_ip_outside_the_local_subnet_or_the_cluster_network() {
    check(Case {
        bad: |d| {
            // In the cluster network, but node-b's subnet.
            d.pods.push(raw_pod("team-a", "far", "vfar", "10.129.0.9", &good_id(0xa1)));
            // Outside the cluster network.
            d.pods.push(raw_pod("team-a", "out", "vout", "10.200.0.9", &good_id(0xa2)));
        },
        good: |_| {},
        named: &[("pod team-a/far", "ip"), ("pod team-a/out", "ip")],
    })
    .await;
}

#[tokio::test]
async fn container_id_of_the_wrong_length() {
    check(Case {
        bad: |d| d.pods.push(raw_pod("team-a", "short", "vshort", "10.128.2.50", "0123abcd")),
        good: |_| {},
        named: &[("pod team-a/short", "containerID")],
    })
    .await;
}

#[tokio::test]
async fn container_id_not_hex() {
    check(Case {
        bad: |d| d.pods.push(raw_pod("team-a", "nothex", "vnothex", "10.128.2.51", &"zz".repeat(32))),
        good: |_| {},
        named: &[("pod team-a/nothex", "containerID")],
    })
    .await;
}

#[tokio::test]
async fn duplicate_pod_ip() {
    check(Case {
        // team-a/p0 has 10.128.2.10: the later pod is rejected, p0 stays.
        bad: |d| d.pods.push(raw_pod("team-b", "dup", "vdup", "10.128.2.10", &good_id(0xd1))),
        good: |_| {},
        named: &[("pod team-b/dup", "ip")],
    })
    .await;
}

#[tokio::test]
async fn vnid_above_24_bits() {
    check(Case {
        bad: |d| {
            // 2^24-1 is the largest VNID: accepted, in both states.
            d.net_namespaces.push("{name: team-y, netid: 16777215}".into());
            d.net_namespaces.push("{name: team-z, netid: 16777216}".into());
            d.host_subnets
                .push("{host: node-d, hostIP: 172.17.0.5, subnet: 10.131.0.0/23, fixedVNID: 16777216}".into());
        },
        good: |d| d.net_namespaces.push("{name: team-y, netid: 16777215}".into()),
        named: &[("netnamespace team-z", "netid"), ("hostsubnet node-d", "fixedVNID")],
    })
    .await;
}

#[tokio::test]
async fn service_port_out_of_range() {
    check(Case {
        bad: |d| {
            d.services.push(
                "{namespace: team-a, name: api, clusterIP: 172.30.0.40, ports: [{protocol: TCP, port: 8080}, {protocol: TCP, port: 70000}, {protocol: UDP, port: 0}]}"
                    .into(),
            )
        },
        // Only the bad ports are dropped: the service keeps 8080.
        good: |d| d.services.push("{namespace: team-a, name: api, clusterIP: 172.30.0.40, ports: [{protocol: TCP, port: 8080}]}".into()),
        named: &[("service team-a/api", "ports[1].port"), ("service team-a/api", "ports[2].port")],
    })
    .await;
}

#[tokio::test]
async fn unknown_protocol_skips_that_port_only() {
    check(Case {
        bad: |d| {
            d.services.push(
                "{namespace: team-a, name: api, clusterIP: 172.30.0.41, ports: [{protocol: TCP, port: 8081}, {protocol: SCTP, port: 9000}]}".into(),
            )
        },
        good: |d| d.services.push("{namespace: team-a, name: api, clusterIP: 172.30.0.41, ports: [{protocol: TCP, port: 8081}]}".into()),
        named: &[("service team-a/api", "ports[1].protocol")],
    })
    .await;
}

#[tokio::test]
async fn egress_policy_over_10000_rules() {
    check(Case {
        bad: |d| {
            let rules = vec!["{type: Deny, to: {cidrSelector: 10.0.0.0/8}}"; 10_001].join(", ");
            d.egress.push(format!("{{namespace: team-b, name: huge, egress: [{rules}]}}"));
        },
        good: |_| {},
        named: &[("egressnetworkpolicy team-b/huge", "egress")],
    })
    .await;
}

#[tokio::test]
async fn yaml_type_errors() {
    check(Case {
        bad: |d| {
            d.pods.push(format!(
                "{{namespace: team-a, name: typed, containerID: \"{}\", hostVeth: vtyped, internal: true, ip: 10.128.2.60, mac: \"0a:58:0a:80:02:3c\", ingressBPS: fast}}",
                good_id(0xe1)
            ));
            d.net_namespaces.push("{name: team-c, netid: eleven}".into());
            d.services.push("{namespace: team-a, name: typed, clusterIP: 172.30.0.50, ports: [{protocol: TCP, port: eighty}]}".into());
        },
        good: |_| {},
        named: &[("pod team-a/typed", "ingressBPS"), ("netnamespace team-c", "netid"), ("service team-a/typed", "ports[0].port")],
    })
    .await;
}

/// A file that is not YAML at all replaces a good one.
#[tokio::test]
async fn broken_yaml_keeps_the_last_good_state() {
    let sb = OvsSandbox::start(Default::default()).await.expect("start the sandbox");
    let path = sb.dir().join("state.yaml");
    let good = base();
    let broken = good.render().replace("pods:\n", "pods: [\n");

    write_state(&path, &good.render());
    let (code, err) = apply(&sb);
    assert_eq!(code, 0, "{err}");
    let applied = dump(&sb);
    write_state(&path, &broken);
    let (code, err) = apply(&sb);
    assert_eq!(code, 1, "a file that does not parse is fatal for apply:\n{err}");
    assert!(err.contains("not valid YAML"), "{err}");
    assert_same(&dump(&sb), &applied, "apply changed nothing");

    write_state(&path, &with_sentinel(&good, 1));
    let mut agent = Agent::spawn(&AgentOptions::new(&path, &sb, "dummy"));
    let installed = after_sentinel(&sb, 1, None).await;
    assert_same(&installed, &applied, "the agent installs what apply installed");
    let before = dump(&sb);
    // The log line of that first commit may trail the switch's state: have it before the mark.
    agent.wait_log(0, &["flows converged"]).await;

    let mark = agent.log.mark();
    write_state(&path, &broken);
    agent.wait_log(mark, &["state file rejected; keeping the last good state"]).await;
    assert_same(&dump(&sb), &before, "the last good state stays installed");
    assert!(agent.running());

    // The agent still follows the file; the broken one changed nothing in between (one commit
    // since the mark: the sentinel swap).
    write_state(&path, &with_sentinel(&good, 2));
    let now = after_sentinel(&sb, 2, Some(1)).await;
    assert_same(&now, &installed, "the good state again");
    // The first commit after the broken file is the sentinel swap (2 flows out, 2 in).
    let (_, first) = agent.wait_log(mark, &["flows converged"]).await;
    assert!(first.contains("adds=2 modifies=0 deletes=2"), "the broken file led to a commit: {first}");
}
