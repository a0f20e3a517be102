//! `sdn_node::apply::converge` on a real switch (moved from src/apply.rs's unit tests: the
//! sandbox is sdn-harness, a crate built on the sdn_node library, which the library's own unit
//! tests cannot use — they are a second build of it, with types of their own).

use std::path::PathBuf;
use std::time::Duration;

use sdn_node::apply::{converge, ApplyOptions};
use sdn_node::cluster::state_file;

/// Regression: on a bridge converge has just created, the agent must not connect to
/// `<bridge>.mgmt` before ovs-vswitchd has created it. With pods, waiting for their ofports
/// hid the race; without any, the connect failed with ENOENT now and then.
#[tokio::test]
async fn converges_a_fresh_bridge_without_pods() {
    for _ in 0..3 {
        let sb = sdn_harness::sandbox::OvsSandbox::start(Default::default()).await.unwrap();
        let (mut state, _) = state_file::parse(include_str!("../deploy/examples/cluster.yaml")).unwrap();
        state.pods.clear();
        state.egress_policies.clear();
        let mut opts = ApplyOptions::new(PathBuf::from("cluster.yaml"), sb.dir().to_path_buf());
        opts.bridge.datapath_type = Some(sdn_node::options::DatapathType::Dummy);
        let r = tokio::time::timeout(Duration::from_secs(60), converge(&opts, &state)).await.expect("in time");
        assert!(r.is_ok(), "{r:?}");
    }
}

/// OVSDB's bridges, ports and interfaces (the columns a converge writes), as ovsdb-client dumps
/// them: the oracle of "nothing changed".
fn ovsdb_dump(sb: &sdn_harness::sandbox::OvsSandbox) -> String {
    let db = format!("unix:{}", sb.dir().join("db.sock").display());
    let mut all = String::new();
    for args in [
        vec!["Open_vSwitch", "Bridge", "name", "ports", "datapath_type", "fail_mode", "protocols", "external_ids"],
        vec!["Open_vSwitch", "Port", "_uuid", "name", "interfaces", "external_ids"],
        vec!["Open_vSwitch", "Interface", "_uuid", "name", "type", "options", "ofport_request"],
    ] {
        let out =
            std::process::Command::new("ovsdb-client").arg("dump").arg(&db).args(&args).output().expect("ovsdb-client");
        assert!(out.status.success(), "ovsdb-client dump: {}", String::from_utf8_lossy(&out.stderr));
        all.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    all
}

/// Issue 32 item 2: a typo'd `--bridge` takes no port from the real bridge, and an existing
/// bridge keeps its datapath type unless told; each refusal names what it found and changes
/// nothing (OVSDB dumped before and after).
#[tokio::test]
async fn a_wrong_bridge_or_datapath_type_is_refused_and_changes_nothing() {
    let sb = sdn_harness::sandbox::OvsSandbox::start(Default::default()).await.unwrap();
    let (mut state, _) = state_file::parse(include_str!("../deploy/examples/cluster.yaml")).unwrap();
    state.pods.clear();
    state.egress_policies.clear();
    let mut opts = ApplyOptions::new(PathBuf::from("cluster.yaml"), sb.dir().to_path_buf());
    opts.bridge.datapath_type = Some(sdn_node::options::DatapathType::Dummy);
    let t = Duration::from_secs(60);
    tokio::time::timeout(t, converge(&opts, &state)).await.expect("in time").expect("br0 converges");
    let before = ovsdb_dump(&sb);

    // The typo: br9 for br0.
    let mut typo = opts.clone();
    typo.bridge.ovs.bridge = "br9".into();
    let e = tokio::time::timeout(t, converge(&typo, &state)).await.expect("in time").expect_err("refused").to_string();
    assert!(
        e.contains("ports tun0, vxlan0 are on bridge br0")
            && e.contains("--bridge br0")
            && e.contains("--take-ports-from-other-bridges"),
        "{e}"
    );
    assert_eq!(ovsdb_dump(&sb), before, "the refused apply changed OVSDB");

    // No --datapath-type: br0 keeps dummy (before, it turned into system).
    let mut keep = opts.clone();
    keep.bridge.datapath_type = None;
    tokio::time::timeout(t, converge(&keep, &state)).await.expect("in time").expect("converges on the existing bridge");
    assert_eq!(ovsdb_dump(&sb), before, "an apply without --datapath-type changed OVSDB");

    // Another datapath type without --change-datapath-type: refused, nothing written.
    let mut other = opts.clone();
    other.bridge.datapath_type = Some(sdn_node::options::DatapathType::Netdev);
    let e = tokio::time::timeout(t, converge(&other, &state)).await.expect("in time").expect_err("refused").to_string();
    assert!(
        e.contains("bridge br0 has datapath type dummy, not netdev") && e.contains("--change-datapath-type"),
        "{e}"
    );
    assert_eq!(ovsdb_dump(&sb), before, "the refused datapath change changed OVSDB");

    // With the flag, the ports do move (what the operator asked for).
    typo.bridge.take_ports_from_other_bridges = true;
    tokio::time::timeout(t, converge(&typo, &state)).await.expect("in time").expect("br9 takes the ports when told");
    let after = ovsdb_dump(&sb);
    assert_ne!(after, before);
}
