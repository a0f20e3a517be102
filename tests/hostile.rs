//! Hostile input (issue 21), against the real agent: `sdn-node run` inside a node network
//! namespace on a netdev switch, pods made through libcni and the real `sdn-node-cni`, and the
//! pod API's socket spoken to directly. Every attack is refused with the right HTTP status or
//! CNI error code and a message naming the field, and afterwards the node is *exactly* as
//! before: the other pods' interfaces, addresses and routes, the node's interfaces, addresses
//! and routes (IPv4 and IPv6, every table), its nftables ruleset, the bridge's ports and their
//! ofports, every flow, and real pings between the pods and to the gateway.
//!
//! Without root or Go/libcni the tests fail under CI and skip with a printed reason otherwise
//! (see `support::cninode::can_run`).

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::Value;
use support::agent::ofports;
use support::cninode::*;

// ---------------------------------------------------------------------------------------------
// What must not change

#[derive(Debug, PartialEq)]
struct PodView {
    links: String,
    addrs: String,
    routes: String,
}

#[derive(Debug, PartialEq)]
struct World {
    links: String,
    addrs: String,
    routes4: String,
    routes6: String,
    nft: String,
    ports: Vec<String>,
    ofports: BTreeMap<String, String>,
    flows: Vec<String>,
    pods: Vec<PodView>,
}

fn ip(ns: &str, args: &[&str]) -> String {
    let mut a = vec!["ip", "-n", ns];
    a.extend_from_slice(args);
    let out = sh(&a);
    assert!(out.status.success(), "{a:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The node and pods once the kernel has settled: no IPv6 address still tentative (duplicate
/// address detection takes a second or two after an interface comes up).
async fn settled(node: &CniNode, pods: &[&PodNs]) -> World {
    for _ in 0..100 {
        let w = world(node, pods);
        if !w.addrs.contains("tentative") && w.pods.iter().all(|p| !p.addrs.contains("tentative")) {
            return w;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("IPv6 addresses still tentative: {:?}", world(node, pods));
}

fn world(node: &CniNode, pods: &[&PodNs]) -> World {
    World {
        links: ip(&node.ns, &["-o", "link"]),
        addrs: ip(&node.ns, &["-o", "addr"]),
        routes4: ip(&node.ns, &["-4", "route", "show", "table", "all"]),
        routes6: ip(&node.ns, &["-6", "route", "show", "table", "all"]),
        nft: node.nft(),
        ports: node.ports(),
        ofports: ofports(&node.sb),
        flows: node.flows(),
        pods: pods
            .iter()
            .map(|p| PodView {
                links: ip(&p.name, &["-o", "link"]),
                addrs: ip(&p.name, &["-o", "addr"]),
                routes: ip(&p.name, &["route", "show", "table", "all"]),
            })
            .collect(),
    }
}

/// The node is as `before` (bounded poll: a DEL's veth goes right after its answer).
async fn unchanged(node: &CniNode, pods: &[&PodNs], before: &World, after: &str) {
    for _ in 0..100 {
        if world(node, pods) == *before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = world(node, pods);
    let field = |a: &str, b: &str| if a == b { String::new() } else { format!("\n--- before\n{a}\n+++ now\n{b}") };
    panic!(
        "after {after}, the node changed:{}{}{}{}{}{}{}{}{}\n{}",
        field(&before.links, &now.links),
        field(&before.addrs, &now.addrs),
        field(&before.routes4, &now.routes4),
        field(&before.routes6, &now.routes6),
        field(&before.nft, &now.nft),
        field(&format!("{:?}", before.ports), &format!("{:?}", now.ports)),
        field(&format!("{:?}", before.ofports), &format!("{:?}", now.ofports)),
        field(&before.flows.join("\n"), &now.flows.join("\n")),
        field(&format!("{:?}", before.pods), &format!("{:?}", now.pods)),
        node.log()
    );
}

// ---------------------------------------------------------------------------------------------
// Talking to the agent

/// One HTTP/1.1 request on the pod API socket, with extra headers: (status, body as JSON, or
/// as a string if it is not JSON).
fn api(node: &CniNode, method: &str, path: &str, headers: &[(&str, String)], body: &str) -> (u16, Value) {
    let mut s = UnixStream::connect(&node.agent.socket).expect("connect to the pod API socket");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut msg = format!(
        "{method} {path} HTTP/1.1\r\nHost: sdn-node\r\nContent-Type: application/json\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        msg.push_str(&format!("{k}: {v}\r\n"));
    }
    msg.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(msg.as_bytes()).expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (code, serde_json::from_str(body).unwrap_or(Value::String(body.to_string())))
}

fn cni_body(command: &str, ns: &str, name: &str, container: &str, netns: &str) -> String {
    serde_json::json!({
        "command": command, "containerID": container, "netns": netns, "ifName": "eth0",
        "namespace": ns, "name": name, "cniVersion": "1.0.0",
    })
    .to_string()
}

/// A pod API request body for an existing device `veth`.
fn pod_body(name: &str, veth: &str, ip: &str, mac: &str, extra: &[(&str, Value)]) -> String {
    let mut v = serde_json::json!({
        "containerID": "c0ffee".repeat(10) + "c0ff", "namespace": "team-a", "name": name,
        "hostVeth": veth, "ip": ip, "mac": mac,
    });
    for (k, x) in extra {
        v[*k] = x.clone();
    }
    v.to_string()
}

/// An HTTP GET to `addr` inside network namespace `ns` (the agent's metrics listener is on
/// the node's loopback): (status, body).
async fn get_in(ns: &str, addr: &str, path: &str) -> (u16, String) {
    let netns = hostnet::Netns::open(format!("/var/run/netns/{ns}")).unwrap();
    let a: std::net::SocketAddr = addr.parse().unwrap();
    let stream = netns
        .run("connect to the metrics listener", move || {
            std::net::TcpStream::connect_timeout(&a, Duration::from_secs(10))
                .map_err(|e| hostnet::Error::Invalid { what: a.to_string(), reason: e.to_string() })
        })
        .await
        .expect("connect inside the node's namespace");
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let mut s = stream;
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    })
    .await
    .unwrap()
}

/// A refused CNI ADD: exit 1, `code`, and a message naming `field` and saying `why`.
fn refused(r: &CniRun, code: u64, field: &str, why: &[&str], what: &str) {
    assert!(!r.ok(), "{what}: accepted: {:?}", r.out);
    assert_eq!(r.out["code"], code, "{what}: {:?}", r.out);
    let msg = r.out["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(&format!("field {field}")), "{what}: the message names field {field}: {msg}");
    assert!(why.iter().any(|w| msg.contains(w)), "{what}: wanted one of {why:?} in: {msg}");
}

/// A refused API request: `status`, body naming `field` (in its `field` member), message
/// containing `why`.
fn refused_api(got: &(u16, Value), status: u16, field: &str, why: &str, what: &str) {
    let (code, body) = got;
    assert_eq!(*code, status, "{what}: {body}");
    assert_eq!(body["field"], field, "{what}: {body}");
    let msg = body["error"].as_str().unwrap_or_default();
    assert!(msg.contains(why), "{what}: wanted {why:?} in: {msg}");
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sdn-hostile-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mkfifo(p: &std::path::Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: plain system call on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo {}", p.display());
}

/// The node's own interfaces the attacks aim at: `uplink0` (a bridge standing for the NIC:
/// address, default route), a veth carrying an address, a veth that is the device of a second
/// default route, and two clean veths (one for the `cni` attack, one for a legitimate pod API
/// pod).
fn node_interfaces(ns: &str) {
    for args in [
        &["link", "add", "uplink0", "type", "bridge"][..],
        &["addr", "add", "192.0.2.10/24", "dev", "uplink0"],
        &["link", "set", "uplink0", "up"],
        &["route", "add", "default", "via", "192.0.2.1", "dev", "uplink0"],
        &["link", "add", "nodeveth0", "type", "veth", "peer", "name", "nodeveth1"],
        &["addr", "add", "198.51.100.1/24", "dev", "nodeveth0"],
        &["link", "set", "nodeveth0", "up"],
        &["link", "set", "nodeveth1", "up"],
        &["link", "add", "gwveth0", "type", "veth", "peer", "name", "gwveth1"],
        &["link", "set", "gwveth0", "up"],
        &["link", "set", "gwveth1", "up"],
        &["route", "add", "default", "dev", "gwveth0", "metric", "500"],
        &["link", "add", "freeveth0", "type", "veth", "peer", "name", "freeveth1"],
        &["link", "add", "apiveth0", "type", "veth", "peer", "name", "apiveth1"],
    ] {
        ip(ns, args);
    }
}

const METRICS: &str = "127.0.0.1:9101";

// ---------------------------------------------------------------------------------------------
// The suite

#[tokio::test]
async fn hostile_requests_are_refused_and_change_nothing() {
    if !can_run() {
        return;
    }
    let node = CniNode::start_with(MULTITENANT, &["--metrics-addr", METRICS]).await;
    node_interfaces(&node.ns);
    let agent_pid = node.agent.pid().expect("agent pid");
    // Two pods that must not notice anything.
    let (p1, p2) = (PodNs::new("a1"), PodNs::new("a2"));
    let r1 = node.cni("add", "team-a", "a1", &container(1), &p1.path());
    assert!(r1.ok(), "{:?}\n{}", r1.out, node.log());
    let r2 = node.cni("add", "team-a", "a2", &container(2), &p2.path());
    assert!(r2.ok(), "{:?}\n{}", r2.out, node.log());
    let a1_veth = r1.out["result100"]["interfaces"][0]["name"].as_str().unwrap_or_default().to_string();
    let a1_mac = r1.out["result100"]["interfaces"][1]["mac"].as_str().unwrap_or_default().to_string();
    assert!(a1_veth.starts_with("veth") && !a1_mac.is_empty(), "{:?}", r1.out);
    let pings = |what: &str| {
        assert!(ping(&p1.name, &r2.addr()), "{what}: a1 reaches a2");
        assert!(ping(&p2.name, &r1.addr()), "{what}: a2 reaches a1");
        assert!(ping(&p1.name, "10.128.0.1"), "{what}: a1 reaches the gateway");
    };
    pings("before");
    assert_eq!(get_in(&node.ns, METRICS, "/readyz").await.0, 200, "ready before\n{}", node.log());
    let pods = [&p1, &p2];
    let before = settled(&node, &pods).await;
    assert!(before.routes4.contains("default via 192.0.2.1 dev uplink0"), "{}", before.routes4);

    // 1, 2. CNI_NETNS that is not a pod's sandbox (through libcni and the plugin).
    let dir = tmpdir("netns");
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let plain = dir.join("plain");
    std::fs::write(&plain, b"").unwrap();
    let test_ns = std::fs::read_link("/proc/self/ns/net").unwrap();
    let host_why: &[&str] =
        if test_ns.to_string_lossy() == "net:[4026531833]" { &["host's initial"] } else { &["init's", "host's"] };
    let cases: Vec<(String, &[&str])> = vec![
        ("/var/run/netns/../../proc/self/ns/net".into(), &["the agent's own"]),
        (format!("/var/run/netns/{}", node.ns), &["the agent's own"]),
        (format!("/proc/{agent_pid}/ns/net"), &["the agent's own"]),
        (format!("/proc/{agent_pid}/task/{agent_pid}/ns/net"), &["the agent's own"]),
        (format!("/proc/{}/ns/net", std::process::id()), host_why),
        // init's: refused as such where the agent can read it, else it cannot be opened.
        ("/proc/1/ns/net".into(), &["init's", "host's initial", "cannot be opened"]),
        (format!("/proc/{agent_pid}/ns/mnt"), &["a mount namespace"]),
        (fifo.display().to_string(), &["is a FIFO"]),
        (plain.display().to_string(), &["not a network namespace (nsfs)"]),
        ("/var/run/netns".into(), &["is a directory"]),
        ("/dev/null".into(), &["is a character device"]),
        ("netns-relative".into(), &["not an absolute path"]),
    ];
    for (i, (path, why)) in cases.iter().enumerate() {
        let name = format!("x{i}");
        let r = node.cni("add", "team-a", &name, &container(100 + i as u32), path);
        // Code 7 (not 11, "try again later"): a FIFO with no writer did not block the open.
        refused(&r, 7, "netns", why, &format!("CNI_NETNS={path}"));
        // The agent still serves everything else at once.
        assert_eq!(api(&node, "GET", "/v1/status", &[], "").0, 200, "status after CNI_NETNS={path}");
    }
    unchanged(&node, &pods, &before, "the CNI_NETNS attacks").await;
    pings("after the CNI_NETNS attacks");

    // 5. The pod API attaching node interfaces.
    let ip_for = |n: u32| format!("10.128.0.{}", 200 + n);
    let mac_for = |n: u32| format!("0a:58:0a:80:00:{:02x}", 200 + n);
    let api_cases: Vec<(String, u16, &str, String)> = vec![
        (
            pod_body("h1", "uplink0", &ip_for(1), &mac_for(1), &[]),
            400,
            "hostVeth",
            "\"uplink0\" is a bridge device".into(),
        ),
        (
            pod_body("h2", "uplink0", &ip_for(2), &mac_for(2), &[("internal", Value::Bool(true))]),
            400,
            "hostVeth",
            "\"uplink0\" is a bridge device".into(),
        ),
        (
            pod_body("h3", "nodeveth0", &ip_for(3), &mac_for(3), &[]),
            400,
            "hostVeth",
            "carries address 198.51.100.1/24".into(),
        ),
        (pod_body("h4", "gwveth0", &ip_for(4), &mac_for(4), &[]), 400, "hostVeth", "default route".into()),
        (pod_body("h5", "lo", &ip_for(5), &mac_for(5), &[]), 400, "hostVeth", "kind-less".into()),
        // tun0, the agent's own port (on the netdev datapath, a tap device).
        (pod_body("h6", "tun0", &ip_for(6), &mac_for(6), &[]), 400, "hostVeth", "\"tun0\" is a".into()),
        (pod_body("h7", "nosuchdev0", &ip_for(7), &mac_for(7), &[]), 400, "hostVeth", "no such interface".into()),
        (
            pod_body("h8", &a1_veth, &ip_for(8), &mac_for(8), &[]),
            409,
            "hostVeth",
            "already used by pod team-a/a1".into(),
        ),
        // The agent's own record of a CNI pod: with it, a DEL or the sandbox GC would delete
        // the device.
        (
            pod_body(
                "h9",
                "freeveth0",
                &ip_for(9),
                &mac_for(9),
                &[(
                    "cni",
                    serde_json::json!({"netns": "/var/run/netns/gone", "ifName": "eth0", "address": "10.128.0.209/23", "gateway": "10.128.0.1", "mtu": 1450}),
                )],
            ),
            400,
            "cni",
            "set only by the agent".into(),
        ),
        (
            pod_body(
                "h10",
                "uplink0",
                &ip_for(10),
                &mac_for(10),
                &[(
                    "cni",
                    serde_json::json!({"netns": "/var/run/netns/gone", "ifName": "eth0", "address": "10.128.0.210/23", "gateway": "10.128.0.1", "mtu": 1450}),
                )],
            ),
            400,
            "cni",
            "set only by the agent".into(),
        ),
        // 7. MACs and container IDs.
        (pod_body("m1", "freeveth0", &ip_for(11), "01:00:5e:00:00:01", &[]), 400, "mac", "multicast".into()),
        (pod_body("m2", "freeveth0", &ip_for(12), "ff:ff:ff:ff:ff:ff", &[]), 400, "mac", "multicast/broadcast".into()),
        (pod_body("m3", "freeveth0", &ip_for(13), "00:00:00:00:00:00", &[]), 400, "mac", "all zero".into()),
        (pod_body("m4", "freeveth0", &ip_for(14), &a1_mac, &[]), 409, "mac", "already used by pod team-a/a1".into()),
        (pod_body("m5", "freeveth0", &ip_for(15), "0a:58:0a:80:00:01", &[]), 400, "mac", "gateway's (tun0)".into()),
        (
            pod_body("m6", "freeveth0", &ip_for(16), "+a:58:0a:80:00:d0", &[]),
            400,
            "mac",
            "not six hexadecimal octets".into(),
        ),
        (
            pod_body(
                "m7",
                "freeveth0",
                &ip_for(17),
                &mac_for(17),
                &[("containerID", Value::String(format!("+{}", "f".repeat(63))))],
            ),
            400,
            "containerID",
            "not hexadecimal".into(),
        ),
    ];
    for (body, status, field, why) in &api_cases {
        let got = api(&node, "POST", "/v1/pods", &[], body);
        refused_api(&got, *status, field, why, body);
    }
    // The same container ID through the CNI endpoint (the plugin refuses it before sending;
    // the agent must too).
    let got = api(
        &node,
        "POST",
        "/v1/cni",
        &[],
        &cni_body("ADD", "team-a", "m8", &format!("+{}", "f".repeat(63)), &p1.path()),
    );
    refused_api(&got, 400, "containerID", "not hexadecimal", "CNI ADD with a signed container ID");
    // A legitimate pod API pod on a clean veth still works, and goes again.
    let ok = api(&node, "POST", "/v1/pods", &[], &pod_body("ok", "apiveth0", &ip_for(20), &mac_for(20), &[]));
    assert_eq!(ok.0, 200, "a veth without address is accepted: {}", ok.1);
    assert_eq!(api(&node, "DELETE", "/v1/pods/team-a/ok", &[], "").0, 200);
    // The GC runs every 2 s: three passes later, the node's devices are all still there.
    tokio::time::sleep(Duration::from_secs(6)).await;
    unchanged(&node, &pods, &before, "the pod API attacks").await;
    pings("after the pod API attacks");

    // 6. Deadlines: a request whose caller has given up is not started; one whose caller gives
    // up in the middle leaves nothing behind.
    let past = (std::time::SystemTime::now() - Duration::from_secs(1))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let p3 = PodNs::new("late");
    let got = api(
        &node,
        "POST",
        "/v1/cni",
        &[("Sdn-Deadline", past)],
        &cni_body("ADD", "team-a", "late", &container(50), &p3.path()),
    );
    assert_eq!(got.0, 504, "{}", got.1);
    assert!(
        got.1["error"].as_str().unwrap_or_default().contains("deadline passed before the request was started"),
        "{}",
        got.1
    );
    let got = api(
        &node,
        "POST",
        "/v1/cni",
        &[("Sdn-Deadline", "soon".into())],
        &cni_body("ADD", "team-a", "late", &container(50), &p3.path()),
    );
    refused_api(&got, 400, "sdn-deadline", "not a number", "a malformed deadline");
    let soon = sdn_node_cni::agent::deadline_value(Duration::from_millis(1));
    let got = api(
        &node,
        "POST",
        "/v1/cni",
        &[("Sdn-Deadline", soon)],
        &cni_body("ADD", "team-a", "late", &container(51), &p3.path()),
    );
    assert_ne!(got.0, 200, "an ADD cannot finish within 1 ms: {}", got.1);
    unchanged(&node, &pods, &before, "requests past their deadline").await;
    assert_eq!(ip(&p3.name, &["-o", "link"]).lines().count(), 1, "nothing but lo in the sandbox");

    // 7. /readyz after a DEL: ready again without anything else waking the reconciler.
    let p4 = PodNs::new("ready");
    let r = node.cni("add", "team-b", "ready", &container(60), &p4.path());
    assert!(r.ok(), "{:?}", r.out);
    assert!(node.cni("del", "team-b", "ready", &container(60), &p4.path()).ok());
    let mut last = (0, String::new());
    for _ in 0..50 {
        last = get_in(&node.ns, METRICS, "/readyz").await;
        if last.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last.0, 200, "ready after a DEL: {}", last.1);
    unchanged(&node, &pods, &before, "all of it").await;
    pings("at the end");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pod API socket is never visible under its name with any mode but 0600: the agent binds
/// it elsewhere (a private 0700 directory) and renames it into place.
#[tokio::test]
async fn the_socket_appears_already_private() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start(MULTITENANT).await;
    node.kill_agent().await;
    let dir = node.agent.socket.parent().unwrap().to_path_buf();
    let _ = std::fs::remove_file(&node.agent.socket);
    // SAFETY: plain system calls; the descriptor is closed below.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(fd >= 0);
    let cdir = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    assert!(unsafe { libc::inotify_add_watch(fd, cdir.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) } >= 0);
    node.spawn_agent().await;
    let mut events = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        // SAFETY: reading into our buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut off = 0;
        while off < n as usize {
            // SAFETY: the kernel writes whole inotify_event records.
            let ev: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
            let name = &buf[off + std::mem::size_of::<libc::inotify_event>()
                ..off + std::mem::size_of::<libc::inotify_event>() + ev.len as usize];
            let name = String::from_utf8_lossy(name).trim_end_matches('\0').to_string();
            events.push((ev.mask, name));
            off += std::mem::size_of::<libc::inotify_event>() + ev.len as usize;
        }
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    let sock = node.agent.socket.file_name().unwrap().to_string_lossy().to_string();
    let of_sock: Vec<_> = events.iter().filter(|(_, n)| *n == sock).collect();
    assert!(!of_sock.is_empty(), "the socket appeared: {events:?}");
    assert!(
        of_sock.iter().all(|(m, _)| m & libc::IN_MOVED_TO != 0),
        "only by rename, never created in place: {events:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&node.agent.socket).unwrap().permissions().mode() & 0o777, 0o600);
    // The private directory it was made in is gone.
    assert!(
        std::fs::read_dir(&dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(&format!(".{sock}"))),
        "no leftover"
    );
    assert_eq!(api(&node, "GET", "/v1/status", &[], "").0, 200);
}

/// The warm-port holding namespace is reachable by path through the agent's own descriptors
/// (`/proc/PID/fd/N`): refused like the agent's own namespace.
#[tokio::test]
async fn the_agents_private_namespaces_are_not_sandboxes() {
    if !can_run() {
        return;
    }
    let node = CniNode::start_with(MULTITENANT, &["--warm-ports", "2"]).await;
    let pid = node.agent.pid().unwrap();
    let own_ino = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/var/run/netns/{}", node.ns)).unwrap().ino()
    };
    let mut hold = None;
    for _ in 0..300 {
        for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
            let target = std::fs::read_link(e.path()).map(|t| t.to_string_lossy().to_string()).unwrap_or_default();
            if target.starts_with("net:[") && target != format!("net:[{own_ino}]") {
                hold = Some(e.path());
            }
        }
        if hold.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hold = hold.unwrap_or_else(|| panic!("the agent holds its warm ports' namespace open\n{}", node.log()));
    let r = node.cni("add", "team-a", "h", &container(70), hold.to_str().unwrap());
    refused(&r, 7, "netns", &["the agent's private"], "the holding namespace");
    // A real sandbox still works.
    let p = PodNs::new("real");
    let r = node.cni("add", "team-a", "real", &container(71), &p.path());
    assert!(r.ok(), "{:?}\n{}", r.out, node.log());
    assert!(node.cni("del", "team-a", "real", &container(71), &p.path()).ok());
}

// ---------------------------------------------------------------------------------------------
// The connection flood

/// Run by `idle_connections_do_not_stall_pod_setup` as user nobody inside the node's
/// namespace (`HOSTILE_FLOOD=ADDR,N`): opens N TCP connections to ADDR, sends nothing, and
/// holds them. Prints `FLOOD connected=C failed=F`; then for every line on stdin, how many of
/// them the server has closed (`FLOOD closed=X`). Ends when stdin does.
#[test]
#[ignore = "a helper process of the flood test, not a test"]
fn flood_helper() {
    let spec = std::env::var("HOSTILE_FLOOD").expect("run only by the flood test (HOSTILE_FLOOD=ADDR,N)");
    let (addr, n) = spec.split_once(',').unwrap();
    let n: usize = n.parse().unwrap();
    sdn_node::rlimit::raise_nofile().unwrap();
    let mut conns = Vec::new();
    let mut failed = 0;
    for _ in 0..n {
        match std::net::TcpStream::connect(addr) {
            Ok(s) => {
                s.set_nonblocking(true).unwrap();
                conns.push(s);
            }
            Err(_) => failed += 1,
        }
    }
    println!("FLOOD connected={} failed={failed}", conns.len());
    std::io::stdout().flush().unwrap();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        if line.is_err() {
            break;
        }
        let mut b = [0u8; 1];
        let closed = conns
            .iter()
            .filter(|s| match s.peek(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            })
            .count();
        println!("FLOOD closed={closed}");
        std::io::stdout().flush().unwrap();
    }
}

/// The agent under `prlimit --nofile=1024` (soft and hard: nothing to raise to), 1,100 idle
/// connections to its metrics listener from user nobody: a CNI ADD (plugin deadline 10 s)
/// completes, `/healthz` answers, the agent's descriptors stay bounded, and every idle
/// connection is closed in the end (evicted at the cap, or by the header timeout).
#[tokio::test]
async fn idle_connections_do_not_stall_pod_setup() {
    if !can_run() {
        return;
    }
    let node = CniNode::start_wrapped(MULTITENANT, &["--metrics-addr", METRICS], &["prlimit", "--nofile=1024"]).await;
    let pid = node.agent.pid().unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let nofile = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    assert!(nofile.split_whitespace().filter(|w| *w == "1024").count() == 2, "{nofile}");
    // The plugin gives up after 10 s.
    let conf = std::fs::read_to_string(node.agent.conflist()).unwrap();
    let mut v: Value = serde_json::from_str(&conf).unwrap();
    v["plugins"][0]["timeoutSeconds"] = Value::from(10);
    std::fs::write(node.agent.conflist(), v.to_string()).unwrap();

    let exe = std::env::current_exe().unwrap();
    let mut flood = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &node.ns,
            "prlimit",
            "--nofile=4096",
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .arg(&exe)
        .args(["flood_helper", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("HOSTILE_FLOOD", format!("{METRICS},1100"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the flood helper");
    let mut to_flood = flood.stdin.take().unwrap();
    let from_flood = flood.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(from_flood).lines().map_while(Result::ok) {
            // (libtest's "test flood_helper ... " may precede the first one on its line.)
            if let Some((_, rest)) = l.split_once("FLOOD ") {
                let _ = tx.send(rest.to_string());
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(120)).expect("the flood helper connects");
    eprintln!("flood: {first}");
    assert!(first.starts_with("connected=1100 "), "every connect succeeded (the agent drains its backlog): {first}");

    // Pod setup and health, during the flood.
    let p = PodNs::new("flood");
    let r = node.cni("add", "team-a", "flood", &container(80), &p.path());
    assert!(r.ok(), "ADD within its 10 s deadline during the flood: {:?}\n{}", r.out, node.log());
    let (code, body) = get_in(&node.ns, METRICS, "/healthz").await;
    assert_eq!(code, 200, "{body}");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    eprintln!("agent descriptors during the flood: {fds}");
    assert!(fds < 512, "the agent's descriptors stay far below its limit: {fds}");
    let (_, m) = get_in(&node.ns, METRICS, "/metrics").await;
    let line = |name: &str| m.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
    let open: f64 =
        line("sdn_node_api_connections{listener=\"metrics\"}").rsplit(' ').next().unwrap_or("x").parse().unwrap();
    let evicted: f64 = line("sdn_node_api_connections_shed_total{listener=\"metrics\",why=\"evicted_idle\"}")
        .rsplit(' ')
        .next()
        .unwrap_or("x")
        .parse()
        .unwrap();
    eprintln!("metrics listener: {open} open, {evicted} evicted");
    assert!(open <= 16.0 && evicted >= 1100.0 - 16.0, "open {open}, evicted {evicted}");
    assert!(node.cni("del", "team-a", "flood", &container(80), &p.path()).ok());

    // In the end every idle connection is closed (the last ones by the header timeout).
    let mut closed = String::new();
    for _ in 0..60 {
        writeln!(to_flood, "count").unwrap();
        closed = rx.recv_timeout(Duration::from_secs(30)).expect("the helper answers");
        if closed == "closed=1100" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(closed, "closed=1100", "idle connections are not kept");
    drop(to_flood);
    let _ = flood.wait();
}
