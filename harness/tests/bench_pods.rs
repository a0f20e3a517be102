//! Smoke test of `sdn-bench pods` (issue 14; `sdn-node bench pods` until the harness left the
//! agent, moved here from tests/): the harness runs end to end with tiny numbers — a real agent,
//! pods through the real `sdn-node-cni`, the seed's way and the switch's limit — and reports
//! every figure as a positive finite number. No thresholds on the values: wall-clock figures
//! belong to benchmark runs, not tests.
//!
//! Needs root (network namespaces, veths) and Open vSwitch; under CI (`CI` set) a missing
//! prerequisite fails the test, otherwise it is skipped with the reason printed.

mod support;

use std::io::Write;
use std::process::Command;

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

fn can_run() -> bool {
    let have = |p: &str| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success());
    let why = if unsafe { libc::geteuid() } != 0 {
        Some("needs root (network namespaces, veths)".to_string())
    } else if !have("ovs-vswitchd") || !have("ovs-vsctl") || !have("ovs-ofctl") {
        Some("Open vSwitch (ovs-vswitchd, ovs-vsctl, ovs-ofctl) is not installed".to_string())
    } else {
        None
    };
    match why {
        None => true,
        Some(w) if in_ci() => panic!("CI is set and this test cannot run: {w}"),
        Some(w) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: {w}");
            false
        }
    }
}

#[test]
fn bench_pods_reports_every_figure() {
    if !can_run() {
        return;
    }
    let cni = support::workspace_bin("sdn-node-cni", "sdn-node-cni");
    let before = bench_netns();
    let out = Command::new(env!("CARGO_BIN_EXE_sdn-bench"))
        .env("SDN_NODE_BIN", support::workspace_bin("sdn-node", "sdn-node"))
        .args(["pods", "--base-pods", "3", "--ops", "3", "--concurrency", "3", "--warm-ports", "2", "--json", "--cni-bin"])
        .arg(&cni)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run sdn-bench pods");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench pods failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("ADD p50"), "the table is printed:\n{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    let j: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    for key in [
        "/serial/agent_p50_ms",
        "/serial/agent_p99_ms",
        "/serial/seed_p50_ms",
        "/serial/limit_p50_ms",
        "/serial/ratio_vs_seed",
        "/serial/ratio_vs_limit",
        "/burst/concurrency",
        "/burst/agent_s",
        "/burst/seed_s",
        "/burst/limit_s",
        "/burst/ratio_vs_seed",
        "/burst/ratio_vs_limit",
        "/del/agent_p50_ms",
        "/del/seed_p50_ms",
        "/del/limit_p50_ms",
        "/del/ratio_vs_seed",
        "/del/ratio_vs_limit",
        "/base_pods",
        "/memory/peak_rss_mib",
    ] {
        let v = j.pointer(key).unwrap_or_else(|| panic!("missing {key} in {j}"));
        assert!(v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0), "{key} = {v}");
    }
    assert_eq!(j["base_pods"], 3);
    assert_eq!(j["warm_ports"], 2);
    assert_eq!(j["burst"]["concurrency"], 3);
    // Nothing left behind: no pod or switch namespace of this run.
    let after = bench_netns();
    assert!(after.is_subset(&before), "left behind: {:?}", after.difference(&before).collect::<Vec<_>>());
}

/// The benchmark's network namespaces (all named `sdnbp<pid>-…`).
fn bench_netns() -> std::collections::BTreeSet<String> {
    let ns = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    String::from_utf8_lossy(&ns.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("sdnbp"))
        .map(str::to_string)
        .collect()
}
