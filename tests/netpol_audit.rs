//! The NetworkPolicy audit log end to end (issue 23 item 4): `sdn-node run --audit-log`,
//! policies annotated `sdn-node.openshift.io/audit-log`, pods through libcni, real packets on a
//! netdev ovs-vswitchd.
//!
//! - An allowed TCP connection appears once (its first packet: replies and the established
//!   connection's later packets pass table 80 before any policy flow), naming the rule's
//!   policy, rule index, direction, 5-tuple and both pods.
//! - A denied connection appears once, naming the policy that isolates the pod.
//! - A flood of 10,000 denied datagrams is limited by the switch's meter: the agent gets no
//!   more than burst + rate × the time it lasted (an upper bound, no timing asserted), while the
//!   agent's CPU for it is printed.

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cninode::*;
use support::nodes::in_netns;

const RATE: u32 = 20;
const BURST: u32 = 20;

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
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: deny-all, namespace: isolated, annotations: {sdn-node.openshift.io/audit-log: deny}}, spec: {podSelector: {}, policyTypes: [Ingress]}}
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: web, namespace: isolated, annotations: {sdn-node.openshift.io/audit-log: allow}}, spec: {podSelector: {}, ingress: [{from: [{namespaceSelector: {}}], ports: [{port: 8080}]}]}}
"#;

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line: {l}: {e}")))
        .collect()
}

/// Waits until the log holds `n` lines matching `f` (bounded by [`WAIT`], a hang guard).
async fn until(path: &std::path::Path, n: usize, f: impl Fn(&Value) -> bool, node: &CniNode) -> Vec<Value> {
    let end = Instant::now() + WAIT;
    loop {
        let l: Vec<Value> = lines(path).into_iter().filter(|v| f(v)).collect();
        if l.len() >= n || Instant::now() > end {
            assert!(l.len() >= n, "{n} lines expected, got {l:#?}\n{}", node.log());
            return l;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent's CPU time so far (utime + stime, in clock ticks of 10 ms).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("agent stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[tokio::test]
async fn connections_are_logged_once_and_a_flood_is_metered() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let (rate, burst) = (RATE.to_string(), BURST.to_string());
    let node = CniNode::start_with(STATE, &["--audit-log", log.to_str().unwrap(), "--audit-rate", &rate, "--audit-burst", &burst]).await;
    let (client_ns, server_ns) = (PodNs::new("client"), PodNs::new("server"));
    let r = node.cni("add", "client", "c1", &container(1), &client_ns.path());
    assert!(r.ok(), "client ADD: {:?}\n{}", r.out, node.log());
    let client: Ipv4Addr = r.addr().parse().unwrap();
    let r = node.cni("add", "isolated", "s1", &container(2), &server_ns.path());
    assert!(r.ok(), "server ADD: {:?}\n{}", r.out, node.log());
    let server: Ipv4Addr = r.addr().parse().unwrap();

    // An echo server on 8080 (allowed by web) in the isolated pod.
    let listener = in_netns(&server_ns.name, || TcpListener::bind(("0.0.0.0", 8080))).await.expect("listen");
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 64];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    // Allowed: one connection, ten exchanges on it.
    let echoed = in_netns(&client_ns.name, move || -> std::io::Result<()> {
        let mut s = TcpStream::connect_timeout(&SocketAddr::from((server, 8080)), WAIT)?;
        for i in 0..10u8 {
            s.write_all(&[i; 16])?;
            let mut buf = [0u8; 16];
            s.read_exact(&mut buf)?;
        }
        Ok(())
    })
    .await;
    echoed.unwrap_or_else(|e| panic!("allowed connection to {server}:8080: {e}\n{}", node.log()));
    // Denied: one SYN (the connect gives up before the kernel's first retransmission at 1 s).
    let denied = in_netns(&client_ns.name, move || TcpStream::connect_timeout(&SocketAddr::from((server, 9090)), Duration::from_millis(300))).await;
    assert!(denied.is_err(), "9090 is denied");

    let dst = |port: u16| format!("{server}:{port}");
    let allow = until(&log, 1, |v| v["verdict"] == "allow", &node).await;
    let deny = until(&log, 1, |v| v["verdict"] == "deny" && v["dst"] == dst(9090), &node).await;
    // Settle: what else the switch sent about these two connections has been written by the
    // time a later marker is (a denied datagram to another port).
    let u = in_netns(&client_ns.name, || UdpSocket::bind("0.0.0.0:0")).await.unwrap();
    u.send_to(b"x", (server, 7000)).unwrap();
    until(&log, 1, |v| v["dst"] == dst(7000), &node).await;
    let all = lines(&log);
    let allow_lines: Vec<&Value> = all.iter().filter(|v| v["verdict"] == "allow").collect();
    let deny_9090: Vec<&Value> = all.iter().filter(|v| v["dst"] == dst(9090)).collect();
    assert_eq!(allow_lines.len(), 1, "the allowed connection once (not its later packets): {all:#?}");
    assert_eq!(deny_9090.len(), 1, "the denied connection once: {all:#?}");
    let a = &allow[0];
    assert_eq!(a["policy"], "isolated/web", "{a}");
    // The state file's `node:`, not the bridge's name (issue 32 item 8).
    assert_eq!(a["node"], "node-a", "{a}");
    assert_eq!(a["rule"], 0, "{a}");
    assert_eq!(a["direction"], "ingress", "{a}");
    assert_eq!(a["proto"], "tcp", "{a}");
    assert_eq!(a["dst"], dst(8080), "{a}");
    assert!(a["src"].as_str().is_some_and(|s| s.starts_with(&format!("{client}:"))), "{a}");
    assert_eq!(a["src_pod"], "client/c1", "{a}");
    assert_eq!(a["dst_pod"], "isolated/s1", "{a}");
    let d = &deny[0];
    assert_eq!(d["policy"], "isolated/deny-all", "{d}");
    assert_eq!(d["node"], "node-a", "{d}");
    assert_eq!(d["direction"], "ingress", "{d}");
    assert_eq!(d["src_pod"], "client/c1", "{d}");

    // The flood: 10,000 denied datagrams, as fast as the client sends them.
    let pid = node.agent.pid().expect("agent pid");
    let cpu0 = cpu_ticks(pid);
    let t0 = Instant::now();
    let flood = in_netns(&client_ns.name, move || {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        let mut sent = 0;
        for i in 0..10_000u32 {
            if u.send_to(&i.to_be_bytes(), (server, 9999)).is_ok() {
                sent += 1;
            }
        }
        sent
    })
    .await;
    let sent_in = t0.elapsed();
    // Until the switch has no more to send: a marker sent after the flood is logged (if the
    // meter lets it through; else once the bucket refills, a second later, a second marker).
    let mut marker = 0u16;
    let end = Instant::now() + WAIT;
    loop {
        marker += 1;
        u.send_to(b"m", (server, 7000 + marker)).unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        if lines(&log).iter().any(|v| v["dst"] == dst(7000 + marker)) || Instant::now() > end {
            break;
        }
    }
    let elapsed = t0.elapsed();
    let cpu = cpu_ticks(pid) - cpu0;
    let flood_lines = lines(&log).iter().filter(|v| v["dst"] == dst(9999)).count();
    let bound = BURST as f64 + RATE as f64 * elapsed.as_secs_f64();
    eprintln!(
        "flood: {flood} datagrams sent in {sent_in:?}; {flood_lines} logged (meter {RATE}/s, burst {BURST}: bound {bound:.0} over {elapsed:?}); agent CPU {} ms",
        cpu * 10
    );
    assert_eq!(flood, 10_000);
    assert!(flood_lines >= 1, "the flood was logged at all\n{}", node.log());
    assert!((flood_lines as f64) <= bound, "{flood_lines} lines for a meter bound of {bound:.0}");
    // Every audit flow was added after its meter existed: OVS says "unknown meter id" (and
    // leaves the flow unmetered for its lifetime) for one added before.
    let vswitchd = node.sb.vswitchd_log();
    assert!(!vswitchd.is_empty(), "the switch's log is readable");
    assert!(!vswitchd.contains("unknown meter id"), "an audit flow was added before its meter:\n{vswitchd}");
    node.ready_again("after the audited connections and the flood").await;
}
