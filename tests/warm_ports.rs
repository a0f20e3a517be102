//! Warm ports (`run --warm-ports N`, src/reconcile/spares.rs): pod interfaces made ahead of
//! time that a CNI ADD moves into the pod. Through libcni and real packets: a pod on a warm
//! port is indistinguishable from one made from scratch; the pool refills; an agent killed with
//! spares waiting leaves none behind (their holding namespace dies with it) and the restarted
//! agent replaces them; a failed claim leaves nothing; DEL leaves exactly the pool.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::agent::vsctl;
use support::cninode::*;


const WARM: usize = 3;

/// Ports marked as spares, each with an ofport (ready), or None while any is not.
fn spares(node: &CniNode) -> Option<BTreeSet<String>> {
    let names: BTreeSet<String> =
        vsctl(&node.sb, &["--no-wait", "--bare", "--columns=name", "find", "Port", "external_ids:sdn-node-spare=true"])
            .split_whitespace()
            .map(str::to_string)
            .collect();
    for n in &names {
        let ofport: i64 = vsctl(&node.sb, &["--no-wait", "get", "Interface", n, "ofport"]).trim().parse().unwrap_or(-1);
        if ofport <= 0 {
            return None;
        }
    }
    Some(names)
}

/// Waits (bounded: 30 s) until exactly `n` spares are ready.
async fn pool_of(node: &CniNode, n: usize) -> BTreeSet<String> {
    for _ in 0..300 {
        if let Some(s) = spares(node).filter(|s| s.len() == n) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the pool never held {n} ready spares: {:?}\n{}", spares(node), node.log());
}

fn host_veth(r: &CniRun) -> String {
    r.out["result100"]["interfaces"][0]["name"].as_str().unwrap_or_default().to_string()
}

/// 64 KiB echoed over a new TCP connection from `client` to `server_ip` (a listener in
/// `server`): partial checksums left on would break this while ping works.
async fn tcp_ok(server: &str, client: &str, server_ip: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = support::nodes::in_netns(server, || std::net::TcpListener::bind(("0.0.0.0", 7100))).await.expect("listen");
    l.set_nonblocking(true).unwrap();
    let echo = support::nodes::tcp_echo(l);
    let addr: std::net::SocketAddr = format!("{server_ip}:7100").parse().unwrap();
    let connect = move || std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).and_then(|s| s.set_nonblocking(true).map(|_| s));
    let ok = async {
        let s = support::nodes::in_netns(client, connect).await.ok()?;
        let (mut r, mut w) = tokio::net::TcpStream::from_std(s).ok()?.into_split();
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move { w.write_all(&sent).await.is_ok() });
        let mut back = vec![0u8; data.len()];
        r.read_exact(&mut back).await.ok()?;
        (writer.await.ok()? && back == data).then_some(())
    };
    let r = tokio::time::timeout(Duration::from_secs(20), ok).await.ok().flatten().is_some();
    echo.abort();
    r
}

fn tx_checksumming(ns: &str) -> String {
    let (_, out) = in_ns(ns, &["ethtool", "-k", "eth0"]);
    out.lines().find_map(|l| l.trim().strip_prefix("tx-checksumming:")).map(|s| s.trim().to_string()).unwrap_or_default()
}

#[tokio::test]
async fn pods_on_warm_ports_work_and_the_pool_refills_survives_and_leaves_only_itself() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start_with(MULTITENANT, &["--warm-ports", &WARM.to_string(), "--warm-ports-always"]).await;
    let pool = pool_of(&node, WARM).await;
    let base_flows = node.flows();
    let base_nft = node.nft();
    assert_eq!(node.veths().into_iter().collect::<BTreeSet<_>>(), pool, "each spare's host end is on the node");

    // Five pods: the first three (at least) on spares, the rest made from scratch or refilled.
    let pods = [("team-a", "a1"), ("team-a", "a2"), ("team-b", "b1"), ("default", "d1"), ("team-a", "a3")];
    let mut sandboxes = Vec::new();
    let mut addr = std::collections::BTreeMap::new();
    let mut from_pool = 0;
    for (i, (pod_ns, name)) in pods.iter().enumerate() {
        let p = PodNs::new(name);
        let r = node.cni("add", pod_ns, name, &container(i as u32 + 1), &p.path());
        assert!(r.ok(), "ADD {pod_ns}/{name}: {:?}\n{}", r.out, node.log());
        if pool.contains(&host_veth(&r)) {
            from_pool += 1;
        } else {
            assert!(i > 0, "the first ADD, with the pool full, takes a spare: {:?} not in {pool:?}", r.out);
        }
        let ip = r.addr();
        let o: Vec<u8> = ip.split('.').map(|x| x.parse().unwrap()).collect();
        assert_eq!(
            r.out["result100"]["interfaces"][1]["mac"],
            format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]),
            "{:?}",
            r.out
        );
        addr.insert(*name, ip);
        sandboxes.push(p);
    }
    eprintln!("{from_pool} of {} ADDs took a warm port", pods.len());
    assert_eq!(addr.values().collect::<BTreeSet<_>>().len(), pods.len(), "no address twice: {addr:?}");
    for (i, (pod_ns, name)) in pods.iter().enumerate() {
        let r = node.cni("check", pod_ns, name, &container(i as u32 + 1), &sandboxes[i].path());
        assert!(r.ok(), "CHECK {name}: {:?}", r.out);
        let (_, link) = in_ns(&sandboxes[i].name, &["ip", "-o", "link", "show", "eth0"]);
        assert!(link.contains("mtu 1450") && link.contains("state UP"), "{name}: {link}");
        assert_eq!(tx_checksumming(&sandboxes[i].name), "off", "{name}");
    }
    let reach = |from: usize, to: &str| ping(&sandboxes[from].name, &addr[to]);
    assert!(reach(0, "a2") && reach(1, "a3") && reach(4, "a1"), "same VNID reaches");
    assert!(!reach(0, "b1") && !reach(2, "a1"), "another VNID does not");
    assert!(reach(3, "b1") && reach(2, "d1"), "VNID 0 reaches and is reached");
    assert!(ping(&sandboxes[0].name, "10.128.0.1"), "the gateway");
    // TCP too (partial checksums would break it on the userspace datapath).
    assert!(tcp_ok(&sandboxes[0].name, &sandboxes[1].name, &addr["a1"]).await, "TCP between pods on warm ports");

    // The pool refills with new spares.
    let refilled = pool_of(&node, WARM).await;
    assert!(refilled.iter().all(|s| !addr.is_empty() && node.ports().contains(s)));

    // Killed with spares waiting: they die with the agent's holding namespace; the restarted
    // agent removes their ports, makes new ones, and its pods still work.
    node.kill_agent().await;
    for _ in 0..200 {
        if node.veths().iter().all(|v| !refilled.contains(v)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(node.veths().iter().all(|v| !refilled.contains(v)), "waiting spares died with the agent: {:?}", node.veths());
    node.spawn_agent().await;
    let after_restart = pool_of(&node, WARM).await;
    assert!(after_restart.is_disjoint(&refilled), "new spares: {after_restart:?} vs {refilled:?}");
    for s in &refilled {
        assert!(!node.ports().contains(s), "the dead spare's port {s} is removed");
    }
    assert!(reach(0, "a2") && !reach(0, "b1"), "pods survive the restart");
    let r = node.cni("check", "team-a", "a1", &container(1), &sandboxes[0].path());
    assert!(r.ok(), "CHECK after restart: {:?}", r.out);

    // DEL, then at once (straight to the socket) an ADD into the same sandbox on a warm port:
    // the old interface, deleted in the background, is not in its way.
    for _ in 0..3 {
        let pool_now = pool_of(&node, WARM).await;
        let (sb, c) = (sandboxes[2].path(), container(3));
        assert_eq!(node.cni_raw("DEL", "team-b", "b1", &c, &sb), 200, "DEL b1");
        assert_eq!(node.cni_raw("ADD", "team-b", "b1", &c, &sb), 200, "ADD b1 right after its DEL\n{}", node.log());
        let r = node.cni("add", "team-b", "b1", &c, &sb);
        assert!(r.ok(), "a repeated ADD answers what the first did: {:?}", r.out);
        assert!(pool_now.contains(&host_veth(&r)), "on a warm port: {:?} not in {pool_now:?}", r.out);
        addr.insert("b1", r.addr());
    }
    assert!(ping(&sandboxes[3].name, &addr["b1"]), "b1 is reachable again");

    // A claim that fails (the sandbox already has eth0) leaves no pod, and its spare is gone.
    let bad = PodNs::new("bad");
    assert!(in_ns(&bad.name, &["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]).0);
    let r = node.cni("add", "team-b", "bad", &container(99), &bad.path());
    assert!(!r.ok(), "{:?}", r.out);
    assert!(in_ns(&bad.name, &["ip", "link", "show", "eth0p"]).0, "the sandbox's own interfaces are untouched");

    // DEL everything: what is left is exactly the pool (ports, veths), the base flows and
    // the same nftables table.
    for (i, (pod_ns, name)) in pods.iter().enumerate() {
        let r = node.cni("del", pod_ns, name, &container(i as u32 + 1), &sandboxes[i].path());
        assert!(r.ok(), "DEL {name}: {:?}", r.out);
    }
    let r = node.cni("del", "team-b", "bad", &container(99), &bad.path());
    assert!(r.ok(), "DEL of the failed ADD: {:?}", r.out);
    let last = pool_of(&node, WARM).await;
    let mut want_ports: BTreeSet<String> = ["tun0", "vxlan0"].iter().map(|s| s.to_string()).collect();
    want_ports.extend(last.iter().cloned());
    for _ in 0..100 {
        if node.ports().into_iter().collect::<BTreeSet<_>>() == want_ports && node.veths().into_iter().collect::<BTreeSet<_>>() == last {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(node.ports().into_iter().collect::<BTreeSet<_>>(), want_ports, "only the base ports and the pool");
    assert_eq!(node.veths().into_iter().collect::<BTreeSet<_>>(), last, "only the pool's veths");
    assert_eq!(node.flows(), base_flows, "no pod's flows");
    assert_eq!(node.nft(), base_nft);
    assert_eq!(vsctl(&node.sb, &["--no-wait", "--columns=_uuid", "list", "QoS"]), "", "no QoS");
    node.ready_again("after the warm-port pods left").await;
}
