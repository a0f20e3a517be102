//! The flow engine against a real switch: group commits, failure isolation, repair.

mod support;

use std::time::Duration;

use openflow::Match;
use sdn_harness::bench::workload;
use sdn_node::engine::{Engine, EngineError};
use sdn_node::pipeline::{Flow, Table};
use sdn_node::store::{diff, InstalledState, Owner};
use sdn_node::switch::{Switch, SwitchError, SwitchOptions};
use support::*;

const T: Duration = Duration::from_secs(30);

async fn setup(m: u32) -> (sdn_harness::sandbox::OvsSandbox, Switch, Engine) {
    let sb = sandbox_with_bridge().await;
    let sw = Switch::connect(&mgmt(&sb), SwitchOptions::default()).await.unwrap();
    let e = Engine::start(sw.clone(), 1);
    tokio::time::timeout(T, e.resync(Some(workload::desired(m)))).await.unwrap().unwrap();
    (sb, sw, e)
}

/// The switch holds exactly what the engine wants.
async fn assert_converged(sw: &Switch, e: &Engine) {
    let (desired, _, dirty) = e.snapshot().await.unwrap();
    assert!(!dirty);
    let generation = e.status().await.unwrap().generation;
    let installed = InstalledState::from_dump(sw.dump_flows(Default::default()).await.unwrap());
    let left = diff(&desired, &installed, generation);
    assert!(left.is_empty(), "switch differs: {left}");
}

#[tokio::test]
async fn concurrent_updates_are_group_committed_and_exact() {
    let (_sb, sw, e) = setup(100).await;
    let tasks: Vec<_> = (0..200)
        .map(|j| {
            let e = e.clone();
            tokio::spawn(async move {
                let (o, f) = workload::pod_flows(1000 + j);
                e.update(vec![(o.clone(), f)]).await?;
                if j % 2 == 0 {
                    e.update(vec![(o, vec![])]).await?;
                }
                Ok::<_, EngineError>(())
            })
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(T, t).await.unwrap().unwrap().unwrap();
    }
    assert_converged(&sw, &e).await;
    let (desired, _, _) = e.snapshot().await.unwrap();
    assert_eq!(desired.flows_of(&workload::pod(1001).0).len(), 4);
    assert!(desired.flows_of(&workload::pod(1000).0).is_empty());
}

#[tokio::test]
async fn a_conflicting_update_fails_alone() {
    let (_sb, sw, e) = setup(10).await;
    // Another owner claiming pod 3's flows conflicts; a concurrent good update still lands.
    let (_, stolen) = workload::pod_flows(3);
    let thief = Owner::Pod { namespace: "x".into(), name: "thief".into() };
    let (good, bad) = tokio::join!(e.update(vec![workload::pod_flows(500)]), e.update(vec![(thief, stolen)]));
    good.unwrap();
    let err = bad.unwrap_err();
    assert!(matches!(err, EngineError::Conflict(_)), "{err}");
    assert!(err.to_string().contains("already owned by pod/ns-3/pod-3"), "{err}");
    assert_converged(&sw, &e).await;
}

#[tokio::test]
async fn a_rejected_update_fails_alone_and_the_switch_keeps_the_rest() {
    let (_sb, sw, e) = setup(10).await;
    // goto_table backwards: OVS rejects it with OFPBIC_BAD_TABLE_ID.
    let broken = vec![Flow::new(Table::PodIp, 7, Match::any().reg(5, 1), vec![], Some(Table::Classify))];
    let bad_owner = Owner::Service { namespace: "ns".into(), name: "broken".into() };
    let (a, b, c) = tokio::join!(
        e.update(vec![workload::pod_flows(600)]),
        e.update(vec![(bad_owner.clone(), broken)]),
        e.update(vec![workload::pod_flows(601)]),
    );
    a.unwrap();
    c.unwrap();
    let err = b.unwrap_err();
    let EngineError::Switch(SwitchError::BundleRejected { failures }) = &err else { panic!("{err}") };
    assert_eq!(failures[0].1.error.code.name(), Some("OFPBIC_BAD_TABLE_ID"));
    let (desired, _, _) = e.snapshot().await.unwrap();
    assert!(desired.flows_of(&bad_owner).is_empty(), "a failed update is not kept as desired");
    assert_converged(&sw, &e).await;
}

#[tokio::test]
async fn resync_repairs_what_someone_else_changed() {
    let (sb, sw, e) = setup(50).await;
    // Behind the agent's back: delete a table, add a stray flow, change a flow's actions.
    ofctl(&sb, &["del-flows", "br0", "table=70"]);
    ofctl(&sb, &["add-flow", "br0", "table=7,priority=9,actions=drop"]);
    ofctl(&sb, &["mod-flows", "br0", "table=40,arp,arp_tpa=10.128.0.12,actions=output:99"]);
    let out = e.resync(None).await.unwrap();
    // Table 70: 50 pod flows and the base drop flow come back; one modify, one delete.
    assert_eq!((out.adds, out.modifies, out.deletes), (51, 1, 1), "{out:?}");
    assert_converged(&sw, &e).await;
    // Nothing left to do.
    assert_eq!(e.resync(None).await.unwrap().flow_mods(), 0);
}

// `churn_harness_runs_and_reports_every_figure` is in harness/tests/churn.rs (the harness's
// own test: its memory phase runs the `sdn-bench` binary, which only that package can name).
