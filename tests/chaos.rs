//! The chaos soak (issue 32): pods come and go through libcni while ovs-vswitchd and
//! ovsdb-server are killed, frozen and restarted, someone deletes the bridge, and the agent itself
//! is SIGKILLed and started again. At the end, with every fault undone: `/readyz` answers 200
//! (within a bounded number of polls), every pod holds its own address, pods of one VNID reach
//! each other and the default namespace, pods of two VNIDs do not, and the node holds one port
//! and one veth per pod, nothing else.
//!
//! Not in CI (minutes of wall time): `cargo test --release --test chaos -- --ignored --nocapture`,
//! with `SOAK_SECS` (default 300) and `SOAK_SEED` (default: the clock).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use support::agent::signal_pid;
use support::cninode::*;

/// Pods alive at most at once.
const MAX_PODS: usize = 16;
/// The namespaces pods are made in, and their VNIDs (MULTITENANT).
const NAMESPACES: [(&str, u32); 3] = [("team-a", 11), ("team-b", 12), ("default", 0)];
const METRICS: &str = "127.0.0.1:9117";

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Pod {
    name: String,
    ns: &'static str,
    vnid: u32,
    sandbox: PodNs,
    container: String,
    addr: String,
}

#[derive(Default, Debug)]
struct Figures {
    adds_ok: u32,
    adds_failed: u32,
    dels_ok: u32,
    dels_retried: u32,
    faults: BTreeMap<&'static str, u32>,
    /// Why ADDs failed (the CNI error's message, first words), and how often.
    add_errors: BTreeMap<String, u32>,
}

/// A fault in effect that the loop undoes later (a frozen daemon).
enum Frozen {
    None,
    Pid(i32, Instant),
}

#[tokio::test]
#[ignore]
async fn chaos_soak_ends_ready_reachable_and_isolated() {
    assert!(can_run(), "the soak needs root, Go and libcni");
    let secs: u64 = std::env::var("SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let seed: u64 = std::env::var("SOAK_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
    });
    eprintln!("chaos soak: {secs} s, seed {seed} (SOAK_SEED={seed} repeats it)");
    let mut rng = Rng(seed);
    let mut node = CniNode::start_with(MULTITENANT, &["--metrics-addr", METRICS]).await;
    let mut pods: Vec<Pod> = Vec::new();
    // Sandboxes whose DEL has not succeeded yet (kubelet retries a DEL until it does).
    let mut undeleted: Vec<Pod> = Vec::new();
    let mut fig = Figures::default();
    let mut frozen = Frozen::None;
    let mut next_container = 1u32;
    let end = Instant::now() + Duration::from_secs(secs);
    // About one fault every 5 s (the issue's soak: 60 in 300 s), churn in between.
    let mut next_fault = Instant::now() + Duration::from_millis(2000 + rng.below(6000));
    while Instant::now() < end {
        // Thaw a frozen daemon after a while (beyond the agent's echo timeout sometimes).
        if let Frozen::Pid(pid, until) = frozen {
            if Instant::now() >= until {
                signal_pid(pid, libc::SIGCONT);
                frozen = Frozen::None;
            }
        }
        let fault_due = Instant::now() >= next_fault;
        match fault_due {
            false => {
                // Two ADDs for one DEL: the node fills up to MAX_PODS and churns there.
                let add = pods.len() < MAX_PODS && (pods.is_empty() || rng.below(3) != 0);
                if add {
                    let (ns, vnid) = NAMESPACES[rng.below(3) as usize];
                    let name = format!("c{next_container}");
                    let container = container(next_container);
                    next_container += 1;
                    let sandbox = PodNs::new(&name);
                    let r = node.cni("add", ns, &name, &container, &sandbox.path());
                    let pod = Pod { name, ns, vnid, sandbox, container, addr: r.addr() };
                    if r.ok() {
                        fig.adds_ok += 1;
                        pods.push(pod);
                    } else {
                        // As kubelet does: a failed ADD is followed by a DEL.
                        fig.adds_failed += 1;
                        let why = failure_kind(&r.out);
                        *fig.add_errors.entry(why).or_default() += 1;
                        undeleted.push(pod);
                    }
                } else {
                    let victim = pods.swap_remove(rng.below(pods.len() as u64) as usize);
                    undeleted.push(victim);
                }
                // Retry the DELs due (each until it succeeds).
                let mut still = Vec::new();
                for p in undeleted.drain(..) {
                    if node.cni("del", p.ns, &p.name, &p.container, &p.sandbox.path()).ok() {
                        fig.dels_ok += 1;
                    } else {
                        fig.dels_retried += 1;
                        still.push(p);
                    }
                }
                undeleted = still;
            }
            true => {
                next_fault = Instant::now() + Duration::from_millis(2000 + rng.below(6000));
                if !matches!(frozen, Frozen::None) {
                    continue;
                }
                let what = match rng.below(7) {
                    0 => {
                        if let Some(pid) = node.sb.vswitchd_pid() {
                            signal_pid(pid, libc::SIGKILL);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            node.sb.start_vswitchd().await.expect("restart ovs-vswitchd");
                        }
                        "ovs-vswitchd killed and restarted"
                    }
                    1 => {
                        node.sb.stop_ovsdb().expect("stop ovsdb-server");
                        node.sb.start_ovsdb().await.expect("start ovsdb-server");
                        "ovsdb-server restarted"
                    }
                    2 => {
                        if let Some(pid) = node.sb.vswitchd_pid() {
                            signal_pid(pid, libc::SIGSTOP);
                            frozen = Frozen::Pid(pid, Instant::now() + Duration::from_millis(500 + rng.below(3000)));
                        }
                        "ovs-vswitchd frozen"
                    }
                    3 => {
                        if let Some(pid) = node.sb.ovsdb_pid() {
                            signal_pid(pid, libc::SIGSTOP);
                            frozen = Frozen::Pid(pid, Instant::now() + Duration::from_millis(500 + rng.below(3000)));
                        }
                        "ovsdb-server frozen"
                    }
                    4 => {
                        let _ = support::agent::vsctl_status(&node.sb, &["--no-wait", "del-br", "br0"]);
                        "bridge deleted"
                    }
                    5 => {
                        let ports: Vec<String> = node.ports().into_iter().filter(|p| p.starts_with("veth")).collect();
                        if let Some(p) = ports.get(rng.below(ports.len() as u64) as usize) {
                            let _ = support::agent::vsctl_status(&node.sb, &["--no-wait", "del-port", "br0", p]);
                        }
                        "a pod's port deleted"
                    }
                    _ => {
                        node.kill_agent().await;
                        node.spawn_agent().await;
                        "agent SIGKILLed and restarted"
                    }
                };
                *fig.faults.entry(what).or_default() += 1;
            }
        }
    }
    // Every fault undone; every pending DEL retried until it succeeds.
    if let Frozen::Pid(pid, _) = frozen {
        signal_pid(pid, libc::SIGCONT);
    }
    for round in 0..60 {
        let mut still = Vec::new();
        for p in undeleted.drain(..) {
            if node.cni("del", p.ns, &p.name, &p.container, &p.sandbox.path()).ok() {
                fig.dels_ok += 1;
            } else {
                still.push(p);
            }
        }
        undeleted = still;
        if undeleted.is_empty() {
            break;
        }
        assert!(round < 59, "DELs never succeeded: {}\n{}", undeleted.len(), node.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Ready again, within a bounded number of polls.
    let mut polls = 0u32;
    let mut last = (0u16, String::new());
    while polls < 1200 {
        polls += 1;
        last = get_readyz(&node.ns).await;
        if last.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last.0, 200, "/readyz after the soak: {}\n{}", last.1, node.log());

    // Every pod has its own address, and holds it.
    let addrs: BTreeSet<&str> = pods.iter().map(|p| p.addr.as_str()).collect();
    assert_eq!(addrs.len(), pods.len(), "every pod its own address: {:?}", pods.iter().map(|p| &p.addr).collect::<Vec<_>>());
    for p in &pods {
        let (_, out) = in_ns(&p.sandbox.name, &["ip", "-o", "-4", "addr", "show", "eth0"]);
        assert!(out.contains(&format!("{}/", p.addr)), "{} holds {}: {out}", p.sandbox.name, p.addr);
    }
    // One port and one veth per pod, nothing else.
    let ports = node.ports();
    let pod_ports = ports.iter().filter(|p| p.as_str() != "vxlan0" && p.as_str() != "tun0").count();
    assert_eq!(pod_ports, pods.len(), "one port per live pod: {ports:?}");
    assert_eq!(node.veths().len(), pods.len(), "one veth per live pod: {:?}", node.veths());
    let st = sdn_node::api::status::fetch(&node.agent.socket).await.expect("status");
    assert_eq!(st.pods.api, pods.len(), "the agent knows exactly the live pods");

    // Reachability by VNID: every ordered pair (pings in parallel).
    let mut checks = Vec::new();
    for a in &pods {
        for b in &pods {
            if a.addr == b.addr {
                continue;
            }
            let expect = a.vnid == b.vnid || a.vnid == 0 || b.vnid == 0;
            let (from, to) = (a.sandbox.name.clone(), b.addr.clone());
            let label = format!("{}:{} -> {}:{}", a.ns, a.addr, b.ns, b.addr);
            checks.push((label, expect, tokio::task::spawn_blocking(move || ping(&from, &to))));
        }
    }
    let pairs = checks.len();
    let mut wrong = Vec::new();
    for (label, expect, h) in checks {
        let got = h.await.expect("ping task");
        if got != expect {
            wrong.push(format!("{label}: expected {expect}, got {got}"));
        }
    }
    assert!(wrong.is_empty(), "{} of {pairs} pairs wrong:\n{}\n{}", wrong.len(), wrong.join("\n"), node.log());
    eprintln!(
        "chaos soak: {secs} s, seed {seed}: {} ADDs ok, {} failed under faults {:?}, {} DELs ({} retried), faults {:?}; \
         end: {} pods, each its own address, {pairs} pairs by VNID all as expected; /readyz 200 after {polls} polls",
        fig.adds_ok,
        fig.adds_failed,
        fig.add_errors,
        fig.dels_ok,
        fig.dels_retried,
        fig.faults,
        pods.len()
    );
    // Clean up what the agent made: DEL every pod, ready again.
    for p in pods.drain(..) {
        assert!(node.cni("del", p.ns, &p.name, &p.container, &p.sandbox.path()).ok(), "final DEL");
    }
    assert_eq!(node.veths().len(), 0, "no veth left");
}

/// GET /readyz inside the node's namespace.
async fn get_readyz(ns: &str) -> (u16, String) {
    let ns = ns.to_string();
    tokio::task::spawn_blocking(move || {
        let (_, out) = in_ns(&ns, &["bash", "-c", &format!("exec 3<>/dev/tcp/{}/{}; printf 'GET /readyz HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n' >&3; cat <&3", METRICS.split(':').next().unwrap_or_default(), METRICS.split(':').nth(1).unwrap_or_default())]);
        let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
    })
    .await
    .expect("readyz")
}

/// What a failed ADD said, without the pod's own names (so that failures group by cause).
fn failure_kind(out: &serde_json::Value) -> String {
    let text = match out.get("details").and_then(|d| d.as_str()) {
        Some(d) => format!("{}: {d}", out.get("msg").and_then(|m| m.as_str()).unwrap_or_default()),
        None => out.to_string(),
    };
    let text = match (text.find(" of pod "), text.find(" (")) {
        (Some(a), Some(b)) if b > a => format!("{}{}", &text[..a], &text[b..]),
        _ => text,
    };
    text.chars().filter(|c| !c.is_ascii_digit()).take(160).collect()
}
