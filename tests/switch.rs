//! The OpenFlow connection against a real ovs-vswitchd, with ovs-ofctl as the oracle.

mod support;

use std::time::Duration;

use openflow::{
    Action, FlowMod, FlowModFlags, FlowStatsRequest, FragMode, Ipv4Match, Match, PortNo,
};
use sdn_node::switch::{Backoff, CloseReason, Supervisor, Switch, SwitchError, SwitchEvent, SwitchOptions};
use support::*;

const T: Duration = Duration::from_secs(30);

async fn connect(sb: &sdn_harness::sandbox::OvsSandbox) -> Switch {
    Switch::connect(&mgmt(sb), SwitchOptions::default()).await.expect("connect")
}

#[tokio::test]
async fn handshake_features_ports_and_frag_mode() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    assert_eq!(sw.features().n_tables, 254);
    let ports = sw.port_desc().await.unwrap();
    assert!(ports.iter().any(|p| p.port_no == PortNo::LOCAL && p.name() == "br0"), "{ports:?}");

    sw.set_frag_mode(FragMode::NxMatch).await.unwrap();
    assert_eq!(sw.get_config().await.unwrap().frag, FragMode::NxMatch);
    assert_eq!(ofctl(&sb, &["get-frags", "br0"]).trim(), "nx-match");
    // Idempotent.
    sw.set_frag_mode(FragMode::NxMatch).await.unwrap();
    // OVS accepts "reassemble" without applying it: we must notice.
    let e = sw.set_frag_mode(FragMode::Reasm).await.unwrap_err();
    assert!(matches!(e, SwitchError::FragModeNotApplied { .. }), "{e}");
    sw.echo().await.unwrap();
}

#[tokio::test]
async fn handshake_refuses_a_bridge_without_openflow13() {
    let sb = sdn_harness::sandbox::OvsSandbox::start(Default::default()).await.unwrap();
    sb.add_bridge("br0", "dummy").await.unwrap();
    // Restrict the bridge to OpenFlow 1.0 with the OVSDB oracle.
    let out = std::process::Command::new("ovs-vsctl")
        .arg(format!("--db={}", sb.db_socket()))
        .args(["set", "bridge", "br0", "protocols=OpenFlow10"])
        .envs(sb.ovs_env())
        .output()
        .unwrap();
    assert!(out.status.success());
    let e = Switch::connect(&mgmt(&sb), SwitchOptions::default()).await.unwrap_err();
    assert!(matches!(e, SwitchError::VersionUnsupported { .. } | SwitchError::Handshake { .. } | SwitchError::Disconnected(_)), "{e}");
    assert!(e.to_string().contains("OpenFlow"), "{e}");
}

#[tokio::test]
async fn ten_thousand_pipelined_flow_mods_then_one_barrier() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let flows: Vec<FlowMod> = (0..10_000).map(pod_flow).collect();
    tokio::time::timeout(T, sw.send_flow_mods(&flows)).await.unwrap().unwrap();

    // Oracle: the switch holds exactly these flows, printed as our Display prints them.
    let oracle = dump_sorted(&sb, &[]);
    assert_eq!(oracle.len(), 10_000);
    let mut ours: Vec<String> = flows.iter().map(|f| f.to_string()).collect();
    ours.sort();
    assert_eq!(oracle, ours);

    // Our own dump (multipart, several parts) agrees too.
    let dumped = sw.dump_flows(FlowStatsRequest::default()).await.unwrap();
    let mut mine: Vec<String> = dumped.iter().map(|f| f.no_stats().to_string()).collect();
    mine.sort();
    assert_eq!(mine, oracle);

    // Filters: one table, and a cookie mask.
    let t70 = sw.dump_flows(FlowStatsRequest { table_id: 70, ..Default::default() }).await.unwrap();
    assert_eq!(t70.len(), 10_000);
    let t0 = sw.dump_flows(FlowStatsRequest { table_id: 0, ..Default::default() }).await.unwrap();
    assert!(t0.is_empty());
    let one = sw
        .dump_flows(FlowStatsRequest { table_id: 70, match_: pod_flow(42).match_.clone(), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].no_stats().to_string(), pod_flow(42).to_string());
}

#[tokio::test]
async fn batch_errors_name_the_failing_message() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let mut flows: Vec<FlowMod> = (0..5).map(pod_flow).collect();
    // goto_table must point forward: 70 -> 10 is OFPBIC_BAD_TABLE_ID.
    flows[3] = FlowMod::add(70, 5, Match::any(), vec![], Some(10));
    let e = sw.send_flow_mods(&flows).await.unwrap_err();
    let SwitchError::Batch { total, failures } = &e else { panic!("{e}") };
    assert_eq!(*total, 5);
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, 3);
    assert_eq!(failures[0].1.error.code.name(), Some("OFPBIC_BAD_TABLE_ID"));
    let offending = failures[0].1.offending.as_ref().expect("offending message decoded");
    assert_eq!(offending.xid, failures[0].1.xid);
    assert!(e.to_string().contains("OFPBIC_BAD_TABLE_ID"), "{e}");
    // A pipelined batch is not atomic: the others are installed.
    assert_eq!(dump_sorted(&sb, &[]).len(), 4);
}

#[tokio::test]
async fn bundle_commits_atomically() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let mut b = sw.bundle();
    b.extend((0..1000).map(pod_flow));
    b.commit().await.unwrap();
    assert_eq!(dump_sorted(&sb, &[]).len(), 1000);
}

#[tokio::test]
async fn bundle_with_an_invalid_flow_mod_is_rejected_whole() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    sw.send_flow_mods(&(0..10).map(pod_flow).collect::<Vec<_>>()).await.unwrap();
    let before = ofctl(&sb, &["dump-flows", "--no-stats", "--no-names", "--sort", "br0"]);

    let mut b = sw.bundle();
    b.extend((10..20).map(pod_flow));
    b.add(FlowMod::add(70, 5, Match::any(), vec![], Some(10))); // index 10: backwards goto
    b.extend((20..30).map(pod_flow));
    let e = b.commit().await.unwrap_err();
    let SwitchError::BundleRejected { failures } = &e else { panic!("{e}") };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, 10);
    assert_eq!(failures[0].1.error.code.name(), Some("OFPBIC_BAD_TABLE_ID"));

    let after = ofctl(&sb, &["dump-flows", "--no-stats", "--no-names", "--sort", "br0"]);
    assert_eq!(before, after, "the table is unchanged");
    // The connection is still usable and no bundle is left open.
    sw.barrier().await.unwrap();
}

#[tokio::test]
async fn commit_time_failure_rolls_back_everything() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let ip = |p: u8| Match::any().ipv4(Ipv4Match { proto: Some(openflow::IpProto::Other(p)), ..Default::default() });
    sw.send_flow_mods(&[FlowMod::add(7, 5, ip(6), vec![], None)]).await.unwrap();
    let before = dump_sorted(&sb, &[]);

    // CHECK_OVERLAP against an overlapping flow at the same priority fails at commit time.
    let mut overlapping = FlowMod::add(7, 5, Match::any().in_port(1), vec![], None);
    overlapping.flags = FlowModFlags::CHECK_OVERLAP;
    let mut b = sw.bundle();
    b.extend((0..50).map(pod_flow));
    b.add(overlapping);
    b.extend((50..100).map(pod_flow));
    let e = b.commit().await.unwrap_err();
    let SwitchError::BundleRejected { failures } = &e else { panic!("{e}") };
    assert_eq!(failures[0].0, 50, "{e}");
    assert_eq!(failures[0].1.error.code.name(), Some("OFPFMFC_OVERLAP"));
    assert_eq!(dump_sorted(&sb, &[]), before);
}

#[tokio::test]
async fn one_trip_bundles_commit_atomically_and_roll_back_on_commit_time_failures() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let mut b = sw.bundle();
    b.extend((0..1000).map(pod_flow));
    b.commit_one_trip().await.unwrap();
    assert_eq!(dump_sorted(&sb, &[]).len(), 1000);

    let before = dump_sorted(&sb, &[]);
    let ip = Match::any().ipv4(Ipv4Match { proto: Some(openflow::IpProto::Other(6)), ..Default::default() });
    sw.send_flow_mods(&[FlowMod::add(7, 5, ip, vec![], None)]).await.unwrap();
    let before_overlap = dump_sorted(&sb, &[]);
    assert_eq!(before_overlap.len(), before.len() + 1);
    let mut overlapping = FlowMod::add(7, 5, Match::any().in_port(1), vec![], None);
    overlapping.flags = FlowModFlags::CHECK_OVERLAP;
    let mut b = sw.bundle();
    b.extend((2000..2050).map(pod_flow));
    b.add(overlapping);
    b.extend((2050..2100).map(pod_flow));
    let e = b.commit_one_trip().await.unwrap_err();
    let SwitchError::BundleRejected { failures } = &e else { panic!("{e}") };
    assert_eq!(failures[0].0, 50, "{e}");
    assert_eq!(failures[0].1.error.code.name(), Some("OFPFMFC_OVERLAP"));
    assert_eq!(dump_sorted(&sb, &[]), before_overlap, "nothing of it applied");
    sw.barrier().await.unwrap();
}

/// Why only flows the switch cannot refuse when added take the one-trip path: OVS leaves a
/// refused ADD out and commits the rest, which the result says.
#[tokio::test]
async fn a_one_trip_bundle_with_a_refused_add_reports_what_was_applied() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let mut b = sw.bundle();
    b.extend((10..20).map(pod_flow));
    b.add(FlowMod::add(70, 5, Match::any(), vec![], Some(10))); // index 10: backwards goto
    b.extend((20..30).map(pod_flow));
    let e = b.commit_one_trip().await.unwrap_err();
    let SwitchError::BundlePartial { failures } = &e else { panic!("{e}") };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, 10);
    assert_eq!(failures[0].1.error.code.name(), Some("OFPBIC_BAD_TABLE_ID"));
    assert_eq!(dump_sorted(&sb, &[]).len(), 20, "the others were committed");
}

/// `openflow::accept` against the switch: every pipeline flow of a node it vouches for is
/// accepted, and flows OVS refuses when they are added are not vouched for.
#[tokio::test]
async fn the_add_time_check_agrees_with_the_switch() {
    use openflow::accept::add_cannot_fail;
    use openflow::{ArpMatch, Instruction, SetField};
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let n = sw.features().n_tables;
    let desired = sdn_harness::bench::workload::desired(60);
    let mut vouched = 0;
    for (owner, c) in desired.iter() {
        let fm = c.to_flow_mod(owner.cookie(1)).unwrap();
        if add_cannot_fail(fm.table_id, &fm.match_, &fm.instructions, n) {
            vouched += 1;
            let mut b = sw.bundle();
            b.add(fm);
            b.commit().await.unwrap_or_else(|e| panic!("{owner}: {c}: {e}"));
        }
    }
    assert!(vouched >= 4 * 60, "every pod flow is vouched for ({vouched})");

    let apply = |a: Vec<Action>| vec![Instruction::ApplyActions(a)];
    let refused = [
        (70, Match::any(), vec![Instruction::GotoTable(10)]),
        (n, Match::any(), vec![]),
        (1, Match::any(), apply(vec![Action::output(PortNo(0xff00))])),
        (1, Match::any().in_port(0x1_0000u32), vec![]),
        (1, Match::any().arp(ArpMatch { op: Some(0x100), ..Default::default() }), vec![]),
        (1, Match::any(), apply(vec![Action::SetField(SetField::CtMark(1))])),
        (1, Match::any(), apply(vec![Action::RegLoad { dst: openflow::Subfield::bits(openflow::NxmField::Reg(7), 31, 31).unwrap(), value: 2 }])),
    ];
    for (k, (table, m, ins)) in refused.into_iter().enumerate() {
        assert!(!add_cannot_fail(table, &m, &ins, n), "table {table} {m:?} {ins:?}");
        let mut fm = FlowMod::add(table, 5, m, vec![], None);
        fm.instructions = ins;
        // After a good flow, in one trip: refused when added, the good one is committed alone
        // (a refusal at commit time would roll both back).
        let mut b = sw.bundle();
        b.add(pod_flow(5000 + k as u32));
        b.add(fm.clone());
        match b.commit_one_trip().await {
            Err(SwitchError::BundlePartial { failures }) => assert_eq!(failures[0].0, 1, "{fm}"),
            other => panic!("{fm}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn chunked_bundles_apply_in_parts() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let mut b = sw.bundle();
    b.extend((0..250).map(pod_flow));
    b.commit_chunked(100).await.unwrap();
    assert_eq!(dump_sorted(&sb, &[]).len(), 250);
}

#[tokio::test]
async fn delete_strict_and_cookie_filters() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let flows: Vec<FlowMod> = (0..6).map(|i| pod_flow(i).with_cookie(i as u64, 0)).collect();
    sw.send_flow_mods(&flows).await.unwrap();
    // Strict delete of flow 2 only (same match, same priority).
    let mut del = FlowMod::delete_strict(70, 100, flows[2].match_.clone());
    sw.send_flow_mods(std::slice::from_ref(&del)).await.unwrap();
    assert_eq!(dump_sorted(&sb, &[]).len(), 5);
    // A strict delete at another priority misses.
    del = FlowMod::delete_strict(70, 99, flows[3].match_.clone());
    sw.send_flow_mods(&[del]).await.unwrap();
    assert_eq!(dump_sorted(&sb, &[]).len(), 5);
    // Cookie-masked dump and delete: odd cookies.
    let odd = sw.dump_flows(FlowStatsRequest { cookie: 1, cookie_mask: 1, ..Default::default() }).await.unwrap();
    assert_eq!(odd.iter().map(|f| f.cookie).collect::<std::collections::BTreeSet<_>>(), [1, 3, 5].into());
    let mut del_odd = FlowMod::new(openflow::FlowModCommand::Delete, openflow::OFPTT_ALL, 0x8000, Match::any());
    del_odd.cookie = 1;
    del_odd.cookie_mask = 1;
    sw.send_flow_mods(&[del_odd]).await.unwrap();
    let left = sw.dump_flows(FlowStatsRequest::default()).await.unwrap();
    assert_eq!(left.iter().map(|f| f.cookie).collect::<std::collections::BTreeSet<_>>(), [0, 4].into());
}

#[tokio::test]
async fn dead_switch_is_a_disconnect_and_the_supervisor_reconnects() {
    let mut sb = sandbox_with_bridge().await;
    let sup = Supervisor::spawn(
        &mgmt(&sb),
        SwitchOptions::default(),
        Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) },
    )
    .unwrap();
    let mut events = sup.subscribe();
    let sw = tokio::time::timeout(T, sup.connected()).await.unwrap();
    sw.send_flow_mods(&[pod_flow(1)]).await.unwrap();

    sb.stop_vswitchd().unwrap();
    let reason = tokio::time::timeout(T, sw.closed()).await.unwrap();
    assert!(matches!(reason, CloseReason::Eof | CloseReason::Io(_)), "{reason:?}");
    let e = sw.barrier().await.unwrap_err();
    assert!(e.is_disconnect(), "{e}");

    sb.start_vswitchd().await.unwrap();
    // ovs-vswitchd may reconfigure the bridge right after start and drop the first connection;
    // the agent resyncs on every Connected, so wait for one that stays up for a barrier.
    let sw2 = tokio::time::timeout(T, async {
        loop {
            match events.recv().await.unwrap() {
                SwitchEvent::Connected(s) if s.barrier().await.is_ok() => break s,
                _ => continue,
            }
        }
    })
    .await
    .unwrap();
    // The switch restarted with an empty table: that is what the agent must resync.
    assert!(sw2.dump_flows(FlowStatsRequest::default()).await.unwrap().is_empty());
}

#[tokio::test]
async fn dropping_all_handles_closes_the_connection() {
    let sb = sandbox_with_bridge().await;
    let sw = connect(&sb).await;
    let clone = sw.clone();
    let waiter = tokio::spawn(async move { clone.closed().await });
    sw.close();
    assert_eq!(tokio::time::timeout(T, waiter).await.unwrap().unwrap(), CloseReason::Local);
    assert!(matches!(sw.barrier().await, Err(SwitchError::Disconnected(CloseReason::Local))));
}

#[tokio::test]
async fn tcp_target_works() {
    let sb = sandbox_with_bridge().await;
    // Pick a free loopback port, then let ovs-vswitchd listen on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = std::process::Command::new("ovs-vsctl")
        .arg(format!("--db={}", sb.db_socket()))
        .args(["set-controller", "br0", &format!("ptcp:{port}:127.0.0.1")])
        .envs(sb.ovs_env())
        .output()
        .unwrap();
    assert!(out.status.success());
    // The listener comes up asynchronously; the supervisor's backoff is the retry loop.
    let sup = Supervisor::spawn(
        &format!("tcp:127.0.0.1:{port}"),
        SwitchOptions::default(),
        Backoff { initial: Duration::from_millis(10), max: Duration::from_millis(100) },
    )
    .unwrap();
    let sw = tokio::time::timeout(T, sup.connected()).await.unwrap();
    sw.send_flow_mods(&[FlowMod::add(0, 1, Match::any(), vec![Action::output(2)], None)]).await.unwrap();
    assert_eq!(dump_sorted(&sb, &[]), vec!["priority=1 actions=output:2".to_string()]);
}
