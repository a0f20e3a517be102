//! `sdn-bench churn`'s measurements end to end with tiny numbers (moved from tests/engine.rs
//! with the harness): every figure is reported as a positive number. No thresholds on the
//! values: wall-clock figures belong to benchmark runs, not tests.

mod support;

use std::time::Duration;

use sdn_harness::bench::workload;

#[tokio::test]
async fn churn_harness_runs_and_reports_every_figure() {
    let opts = sdn_harness::bench::ChurnOptions {
        base_pods: 50,
        ops: 10,
        rounds: 1,
        ovs_rundir: None,
        egress_rules: 20,
        egress_swaps: 4,
        recovery_pods: 20,
    };
    // The memory phase runs the `sdn-bench` binary and the recovery the `sdn-node` agent;
    // point them at the ones cargo built.
    std::env::set_var("SDN_BENCH_BIN", env!("CARGO_BIN_EXE_sdn-bench"));
    std::env::set_var("SDN_NODE_BIN", support::workspace_bin("sdn-node", "sdn-node"));
    let r = tokio::time::timeout(Duration::from_secs(120), sdn_harness::bench::churn(&opts, |_| {})).await.unwrap().unwrap();
    let j = serde_json::to_value(&r).unwrap();
    for key in [
        "/base_pods",
        "/serial/agent_tps",
        "/serial/ofctl_tps",
        "/serial/ratio",
        "/serial/agent_p50_us",
        "/serial/agent_p99_us",
        "/serial/limit_tps",
        "/serial/limit_p50_us",
        "/serial/limit_p99_us",
        "/serial/ratio_vs_limit",
        "/pipelined/agent_flow_mods_per_s",
        "/pipelined/unbundled_flow_mods_per_s",
        "/pipelined/ratio_vs_unbundled",
        "/pipelined/limit_tps",
        "/pipelined/limit_flow_mods_per_s",
        "/pipelined/ratio_vs_limit",
        "/resync/flows",
        "/resync/agent_s",
        "/resync/ofctl_bundle_s",
        "/resync/unbundled_s",
        "/resync/ratio_vs_unbundled",
        "/resync/limit_s",
        "/resync/ratio_vs_limit",
        "/resync/ratio_vs_ofctl",
        "/teardown/p50_us_at_100",
        "/teardown/p50_us_at_base",
        "/teardown/growth",
        "/egress_swap/rules",
        "/egress_swap/p50_us",
        "/egress_swap/p99_us",
        "/memory/peak_rss_mib",
        "/recovery/flows",
        "/recovery/restart_to_equal_s",
        "/recovery/agent/pods",
        "/recovery/agent/flows",
        "/recovery/agent/restart_to_equal_s",
    ] {
        let v = j.pointer(key).unwrap_or_else(|| panic!("missing {key}"));
        assert!(v.as_f64().is_some_and(|x| x > 0.0), "{key} = {v}");
    }
    assert_eq!(r.resync.flows, workload::desired(50).len());
    // The raw baselines track their xids: the switch rejected none of their messages.
    assert_eq!((r.rejections.unbundled, r.rejections.limit), (0, 0), "{j}");
}
