//! The controller's cold start at scale (issue 33): a leader that starts on a cluster of 5,000
//! Nodes (with podCIDRs, as kubeadm's) and 10,000 Namespaces, and nothing of its own yet, must
//! create ClusterNetwork "default", 5,000 HostSubnets and 10,000 NetNamespaces, bounded by its
//! client-side rate limit (`--kube-api-qps`, `--kube-api-burst`) and not by CPU; then one Node
//! or Namespace event is O(1) API calls.
//!
//! Two runs against the fake API server, in the same process: with the default limit (300/s,
//! burst 600) and with the limit lifted (the CPU floor of controller and fake together). The
//! figures printed are ratios to baselines of the same run: wall time against what the limit
//! allows ((objects - burst) / qps), and the controller's CPU time against its wall time.
//! Run in release, not in CI:
//!
//!     cargo test --release --test controller_scale -- --ignored --nocapture
//!
//! SCALE_NODES and SCALE_NAMESPACES change the sizes.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::controller::Controller;
use support::fake_kube::FakeKube;

fn env_or(k: &str, d: usize) -> usize {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

/// The controller process's CPU time so far (user + system).
fn cpu(pid: i32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn writes(fake: &FakeKube) -> usize {
    ["hostsubnets", "netnamespaces", "clusternetworks"]
        .iter()
        .map(|r| ["POST", "PUT", "PATCH", "DELETE"].iter().map(|m| fake.count(m, r)).sum::<usize>())
        .sum()
}

struct Run {
    wall: Duration,
    cpu: Duration,
    writes: usize,
}

async fn cold_start(nodes: usize, namespaces: usize, extra: &[&str]) -> Run {
    let fake = FakeKube::start().await;
    let node_objs: Vec<_> = (0..nodes)
        .map(|i| {
            // /24 podCIDRs out of 10.128.0.0/14 (1,024 of them) would not hold 5,000 Nodes:
            // the scale cluster uses 10.0.0.0/8 with /24s, kube-controller-manager's default.
            let c = format!("10.{}.{}.0/24", i / 256, i % 256);
            json!({"metadata": {"name": format!("node-{i:05}"), "uid": format!("n{i}")},
                   "spec": {"podCIDR": c, "podCIDRs": [c]},
                   "status": {"addresses": [{"type": "InternalIP", "address": format!("172.{}.{}.{}", 16 + i / 65536, (i / 256) % 256, i % 256)}]}})
        })
        .collect();
    fake.put_many("nodes", node_objs);
    let ns_objs: Vec<_> =
        (0..namespaces).map(|i| json!({"metadata": {"name": format!("ns-{i:05}"), "uid": format!("ns{i}")}})).collect();
    fake.put_many("namespaces", ns_objs);
    let dir = tempfile::tempdir().unwrap();
    let mut args =
        vec!["--cluster-network", "10.0.0.0/8", "--host-subnet-length", "8", "--service-network", "172.30.0.0/16"];
    args.extend(extra);
    let c = Controller::spawn(&fake, dir.path(), "scale", &args);
    let start = Instant::now();
    let total = 1 + nodes + namespaces;
    loop {
        let done = fake.objects("hostsubnets").len()
            + fake.objects("netnamespaces").len()
            + fake.objects("clusternetworks").len();
        if done >= total {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "cold start did not finish: {done} of {total}\n{}",
            c.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = start.elapsed();
    let run = Run { wall, cpu: cpu(c.pid()), writes: writes(&fake) };
    c.settled("cold start").await;
    // One event, O(1) calls: a new Node is one create, a new Namespace one create.
    let before = writes(&fake);
    fake.put(
        "nodes",
        json!({"metadata": {"name": "node-new", "uid": "nn"}, "spec": {"podCIDRs": ["10.255.255.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "172.31.255.254"}]}}),
    );
    fake.put("namespaces", json!({"metadata": {"name": "ns-new", "uid": "nsn"}}));
    c.settled("one Node and one Namespace more").await;
    assert_eq!(writes(&fake) - before, 2, "one write per event");
    c.ready_again("scale").await;
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "scale benchmark: run in release with --ignored --nocapture"]
async fn cold_start_at_5000_nodes_and_10000_namespaces() {
    let nodes = env_or("SCALE_NODES", 5000);
    let namespaces = env_or("SCALE_NAMESPACES", 10000);
    let objects = 1 + nodes + namespaces;
    let limited = cold_start(nodes, namespaces, &[]).await;
    assert_eq!(limited.writes, objects, "one write per object");
    let lifted = cold_start(nodes, namespaces, &["--kube-api-qps", "1000000", "--kube-api-burst", "1000000"]).await;
    assert_eq!(lifted.writes, objects);
    let (qps, burst) = (300.0, 600.0);
    let allowed = ((objects as f64 - burst) / qps).max(0.0);
    println!(
        "controller cold start, {nodes} Nodes + {namespaces} Namespaces = {objects} objects written:\n\
         \x20 default limit (300/s, burst 600): {:.1} s wall, {:.1} s CPU of the controller; the limit allows {:.1} s: wall / limit = {:.2}; CPU / wall = {:.2}\n\
         \x20 limit lifted: {:.1} s wall, {:.1} s CPU ({:.0} objects/s, controller and fake API server on 2 cores); limited wall / lifted wall = {:.1}",
        limited.wall.as_secs_f64(),
        limited.cpu.as_secs_f64(),
        allowed,
        limited.wall.as_secs_f64() / allowed,
        limited.cpu.as_secs_f64() / limited.wall.as_secs_f64(),
        lifted.wall.as_secs_f64(),
        lifted.cpu.as_secs_f64(),
        objects as f64 / lifted.wall.as_secs_f64(),
        limited.wall.as_secs_f64() / lifted.wall.as_secs_f64(),
    );
}
