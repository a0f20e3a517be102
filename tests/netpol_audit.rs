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
//! - On a dual-stack node, IPv6 connections give the lines of their IPv4 twins (allowed TCP,
//!   denied TCP, a denied ping: ICMPv6 echo for ICMP echo), with the IPv6 addresses
//!   (`[addr]:port`) and the same pod names; the per-policy counters count the IPv6 connection
//!   and drops as they count the IPv4 ones (and the drops per pod name the pod).

mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
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

/// [`STATE`] on a dual-stack node: the same policies, the cluster network and the node's
/// subnet in both families (as deploy/examples/dual-stack.yaml).
const DUAL_STACK: &str = r#"
node: node-a
plugin: networkpolicy
clusterNetworks: [10.128.0.0/14, "fd00:10:128::/48"]
serviceNetworks: [172.30.0.0/16, "fd00:172:30::/112"]
mtu: 1450
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnets: [10.128.0.0/23, "fd00:10:128:1::/64"]}
netNamespaces:
  - {name: isolated, netid: 11}
  - {name: client, netid: 13}
networkPolicies:
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: deny-all, namespace: isolated, annotations: {sdn-node.openshift.io/audit-log: deny}}, spec: {podSelector: {}, policyTypes: [Ingress]}}
  - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: web, namespace: isolated, annotations: {sdn-node.openshift.io/audit-log: allow}}, spec: {podSelector: {}, ingress: [{from: [{namespaceSelector: {}}], ports: [{port: 8080}]}]}}
"#;

const METRICS: &str = "127.0.0.1:9101";

/// The pod's (IPv4, IPv6) addresses from a dual-stack ADD's result.
fn addrs(r: &CniRun) -> (IpAddr, IpAddr) {
    let ips: Vec<IpAddr> = r.out["result100"]["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["address"].as_str()?.split('/').next()?.parse().ok())
        .collect();
    let v4 = ips.iter().find(|a| a.is_ipv4()).copied();
    let v6 = ips.iter().find(|a| a.is_ipv6()).copied();
    (v4.unwrap_or_else(|| panic!("an IPv4 address: {}", r.out)), v6.unwrap_or_else(|| panic!("an IPv6 address: {}", r.out)))
}

/// A line with what depends on the family made generic: no time, the client's address (and
/// its ephemeral port) `CLIENT`, the server's `SERVER` (with its port, if any). Addresses
/// that are not the expected ones stay as they are, so the comparison shows them.
fn generic(v: &Value, client: IpAddr, server: IpAddr) -> Value {
    let mut v = v.clone();
    let o = v.as_object_mut().expect("a JSON object");
    o.remove("time");
    for (k, who, name, keep_port) in [("src", client, "CLIENT", false), ("dst", server, "SERVER", true)] {
        let Some(s) = o.get(k).and_then(Value::as_str) else { continue };
        let g = match (s.parse::<SocketAddr>(), s.parse::<IpAddr>()) {
            (Ok(sa), _) if sa.ip() == who && keep_port => format!("{name}:{}", sa.port()),
            (Ok(sa), _) if sa.ip() == who => format!("{name}:*"),
            (_, Ok(ip)) if ip == who => name.to_string(),
            _ => continue,
        };
        o.insert(k.to_string(), Value::String(g));
    }
    v
}

/// A series' value in /metrics text (`None`: not exported).
fn value(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse::<f64>().ok()).map(|v| v as u64)
}

/// Waits (bounded by [`WAIT`]) until every series has its value, then checks it still has
/// two reads later: exact, not at least.
async fn counters_settle(node: &CniNode, want: &[(&str, u64)]) {
    let end = Instant::now() + WAIT;
    loop {
        let text = node.metrics(METRICS).await;
        let got: Vec<Option<u64>> = want.iter().map(|(s, _)| value(&text, s)).collect();
        if want.iter().zip(&got).all(|((_, v), g)| *g == Some(*v)) {
            break;
        }
        assert!(Instant::now() < end, "counters {want:?}, got {got:?}\n{text}\n{}", node.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let text = node.metrics(METRICS).await;
    for (s, v) in want {
        assert_eq!(value(&text, s), Some(*v), "{s} moved on\n{text}");
    }
}

/// Dual-stack: the same connections over IPv4 and over IPv6 give the same audit lines but for
/// the addresses, which are the family's (IPv6 as `[addr]:port`), and the same counts.
#[tokio::test]
async fn ipv6_connections_are_logged_and_counted_as_their_ipv4_twins() {
    if !can_run() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let node = CniNode::start_with(DUAL_STACK, &["--audit-log", log.to_str().unwrap(), "--metrics-addr", METRICS, "--policy-stats-interval", "1"]).await;
    let (client_ns, server_ns) = (PodNs::new("client"), PodNs::new("server"));
    let r = node.cni("add", "client", "c1", &container(1), &client_ns.path());
    assert!(r.ok(), "client ADD: {:?}\n{}", r.out, node.log());
    let (client4, client6) = addrs(&r);
    let r = node.cni("add", "isolated", "s1", &container(2), &server_ns.path());
    assert!(r.ok(), "server ADD: {:?}\n{}", r.out, node.log());
    let (server4, server6) = addrs(&r);

    // An echo server on 8080 (allowed by web), one socket for both families.
    let listener = in_netns(&server_ns.name, || TcpListener::bind(("::", 8080))).await.expect("listen");
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
    let conns = "sdn_node_policy_connections_total{namespace=\"isolated\",policy=\"web\",direction=\"ingress\"}";
    let drops = "sdn_node_policy_dropped_packets_total{namespace=\"isolated\",direction=\"ingress\"}";
    counters_settle(&node, &[(conns, 0), (drops, 0)]).await;

    // Each family in turn: one allowed connection (ten exchanges), one denied SYN, one denied
    // ping, then a denied datagram as the marker after which nothing more about them comes.
    // The allowed connection goes first: it resolves the server's MAC (ARP, neighbour
    // discovery), so the denied SYN is sent within its 300 ms.
    let mut seen = Vec::new();
    for (k, (client, server)) in [(client4, server4), (client6, server6)].into_iter().enumerate() {
        let fam = if server.is_ipv4() { "IPv4" } else { "IPv6" };
        let echoed = in_netns(&client_ns.name, move || -> std::io::Result<()> {
            let mut s = TcpStream::connect_timeout(&SocketAddr::new(server, 8080), WAIT)?;
            for i in 0..10u8 {
                s.write_all(&[i; 16])?;
                let mut buf = [0u8; 16];
                s.read_exact(&mut buf)?;
            }
            Ok(())
        })
        .await;
        echoed.unwrap_or_else(|e| panic!("{fam}: allowed connection to {server} port 8080: {e}\n{}", node.log()));
        let denied = in_netns(&client_ns.name, move || TcpStream::connect_timeout(&SocketAddr::new(server, 9090), Duration::from_millis(300))).await;
        assert!(denied.is_err(), "{fam}: 9090 is denied");
        assert!(!ping(&client_ns.name, &server.to_string()), "{fam}: ping is denied");
        let u = in_netns(&client_ns.name, move || UdpSocket::bind(if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })).await.unwrap();
        u.send_to(b"m", (server, 7000)).unwrap();
        let marker = SocketAddr::new(server, 7000).to_string();
        until(&log, 1, |v| v["dst"] == marker.as_str(), &node).await;
        let n = (k + 1) as u64;
        counters_settle(&node, &[(conns, n), (drops, 3 * n)]).await;

        let all = lines(&log);
        let of = |f: &dyn Fn(&Value) -> bool| -> Vec<Value> { all.iter().filter(|v| f(v)).cloned().collect() };
        let dst = |port: u16| SocketAddr::new(server, port).to_string();
        let allow = of(&|v| v["verdict"] == "allow" && v["dst"] == dst(8080).as_str());
        let deny = of(&|v| v["dst"] == dst(9090).as_str());
        let icmp = of(&|v| v["dst"] == server.to_string().as_str());
        assert_eq!((allow.len(), deny.len(), icmp.len()), (1, 1, 1), "{fam}: each once: {all:#?}");
        // The format, spelled out: IPv6 endpoints in brackets, an ICMP line without ports.
        let src = allow[0]["src"].as_str().unwrap_or_default();
        match server {
            IpAddr::V4(_) => assert!(src.starts_with(&format!("{client}:")) && dst(8080) == format!("{server}:8080"), "{src}"),
            IpAddr::V6(_) => assert!(src.starts_with(&format!("[{client}]:")) && dst(8080) == format!("[{server}]:8080"), "{src}"),
        }
        assert_eq!(icmp[0]["src"], client.to_string().as_str(), "{fam}: {}", icmp[0]);
        seen.push([&allow[0], &deny[0], &icmp[0]].map(|v| generic(v, client, server)));
    }
    let [allow, deny, icmp] = &seen[0];
    let want = serde_json::json!({"node": "node-a", "policy": "isolated/web", "rule": 0, "direction": "ingress", "verdict": "allow", "proto": "tcp",
        "src": "CLIENT:*", "dst": "SERVER:8080", "src_pod": "client/c1", "dst_pod": "isolated/s1"});
    assert_eq!(allow, &want, "IPv4 allow");
    let want = serde_json::json!({"node": "node-a", "policy": "isolated/deny-all", "rule": 65535, "direction": "ingress", "verdict": "deny", "proto": "tcp",
        "src": "CLIENT:*", "dst": "SERVER:9090", "src_pod": "client/c1", "dst_pod": "isolated/s1"});
    assert_eq!(deny, &want, "IPv4 deny");
    let want = serde_json::json!({"node": "node-a", "policy": "isolated/deny-all", "rule": 65535, "direction": "ingress", "verdict": "deny", "proto": "icmp",
        "src": "CLIENT", "dst": "SERVER", "src_pod": "client/c1", "dst_pod": "isolated/s1", "icmp_type": 8, "icmp_code": 0});
    assert_eq!(icmp, &want, "IPv4 ping");
    // The IPv6 twins: the same lines; a ping is ICMPv6 echo (type 128).
    let [allow6, deny6, icmp6] = &seen[1];
    assert_eq!(allow6, allow, "IPv6 allow");
    assert_eq!(deny6, deny, "IPv6 deny");
    let mut icmp_as6 = icmp.clone();
    icmp_as6["proto"] = "icmpv6".into();
    icmp_as6["icmp_type"] = 128.into();
    assert_eq!(icmp6, &icmp_as6, "IPv6 ping");

    // The drops per pod: the IPv6 ones are s1's too.
    let st = sdn_node::api::status::fetch(&node.agent.socket).await.expect("status");
    let dropped = st.policy_counters.dropped.iter().find(|d| d.namespace == "isolated").unwrap_or_else(|| panic!("{st}"));
    assert_eq!(dropped.pods.iter().map(|p| (p.pod.as_str(), p.packets)).collect::<Vec<_>>(), [("isolated/s1", 6)], "{st}");
    node.ready_again("after the connections of both families").await;
}
