//! Connection behaviour that a real ovs-vswitchd does not show on demand (its echo comes after
//! 60 s idle; it never stops answering): a scripted peer speaking OpenFlow through our codec.

use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use openflow::{
    BundleCtrlType, FeaturesReply, FlowMod, Hello, Match, Message, OfCodec, OfMessage,
};
use sdn_node::switch::{CloseReason, Switch, SwitchError, SwitchOptions};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::codec::Framed;

const T: Duration = Duration::from_secs(10);

/// Accepts one connection and completes the handshake; returns the framed peer.
async fn peer(listener: &UnixListener) -> Framed<UnixStream, OfCodec> {
    let (s, _) = listener.accept().await.unwrap();
    let mut f = Framed::new(s, OfCodec::default());
    f.send(OfMessage::new(1, Message::Hello(Hello::of13()))).await.unwrap();
    loop {
        let m = f.next().await.unwrap().unwrap().unwrap();
        match m.msg {
            Message::Hello(_) => {}
            Message::FeaturesRequest => {
                let fr = FeaturesReply { datapath_id: 7, n_buffers: 0, n_tables: 254, auxiliary_id: 0, capabilities: 0x4f, reserved: 0 };
                f.send(OfMessage::new(m.xid, Message::FeaturesReply(fr))).await.unwrap();
                return f;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn listener() -> (tempfile::TempDir, UnixListener, String) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("br0.mgmt");
    let l = UnixListener::bind(&p).unwrap();
    (d, l, format!("unix:{}", p.display()))
}

#[tokio::test]
async fn answers_the_switchs_echo_requests() {
    let (_d, l, target) = listener();
    let (sw, mut p) = tokio::join!(Switch::connect(&target, SwitchOptions::default()), peer(&l));
    let sw = sw.unwrap();
    assert_eq!(sw.features().datapath_id, 7);
    p.send(OfMessage::new(0x77, Message::EchoRequest(Bytes::from_static(b"ping")))).await.unwrap();
    let reply = tokio::time::timeout(T, p.next()).await.unwrap().unwrap().unwrap().unwrap();
    assert_eq!(reply, OfMessage::new(0x77, Message::EchoReply(Bytes::from_static(b"ping"))));
}

#[tokio::test]
async fn a_switch_that_stops_answering_echoes_is_declared_dead() {
    let (_d, l, target) = listener();
    let opts = SwitchOptions {
        echo_interval: Some(Duration::from_millis(50)),
        echo_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let (sw, mut p) = tokio::join!(Switch::connect(&target, opts), peer(&l));
    let sw = sw.unwrap();
    // The peer reads (so the socket stays open) but never answers.
    let first = tokio::time::timeout(T, p.next()).await.unwrap().unwrap().unwrap().unwrap();
    assert!(matches!(first.msg, Message::EchoRequest(_)), "{first:?}");
    let reason = tokio::time::timeout(T, sw.closed()).await.unwrap();
    assert_eq!(reason, CloseReason::EchoTimeout);
}

#[tokio::test]
async fn a_refused_hello_is_a_clear_error() {
    let (_d, l, target) = listener();
    let serve = async {
        let (s, _) = l.accept().await.unwrap();
        let mut f = Framed::new(s, OfCodec::default());
        // An OpenFlow 1.0-only switch.
        let mut h = OfMessage::new(1, Message::Hello(Hello::default()));
        h.version = 1;
        f.send(h).await.unwrap();
        // Read our HELLO and the HELLO_FAILED error we send back.
        let mut got = Vec::new();
        while let Some(Ok(Ok(m))) = f.next().await {
            got.push(m);
        }
        got
    };
    let (r, got) = tokio::join!(Switch::connect(&target, SwitchOptions::default()), serve);
    let e = r.unwrap_err();
    assert!(matches!(e, SwitchError::VersionUnsupported { ref offered, .. } if offered == &vec![1]), "{e}");
    let err = got.iter().find_map(|m| match &m.msg {
        Message::Error(e) => Some((m.version, e.code)),
        _ => None,
    });
    assert_eq!(err, Some((1, openflow::ErrorCode::HELLO_FAILED_INCOMPATIBLE)), "error sent in the peer's version");
}

#[tokio::test]
async fn an_abandoned_commit_discards_the_bundle() {
    let (_d, l, target) = listener();
    let (sw, mut p) = tokio::join!(Switch::connect(&target, SwitchOptions::default()), peer(&l));
    let sw = sw.unwrap();
    let mut b = sw.bundle();
    b.add(FlowMod::add(0, 1, Match::any(), vec![], None));
    // The peer never answers the barrier; the caller gives up.
    let r = tokio::time::timeout(Duration::from_millis(300), b.commit()).await;
    assert!(r.is_err(), "commit cannot finish without the barrier reply");
    let mut seen = Vec::new();
    let discard = tokio::time::timeout(T, async {
        loop {
            let m = p.next().await.unwrap().unwrap().unwrap();
            if let Message::BundleControl(c) = &m.msg {
                if c.ctrl_type == BundleCtrlType::DiscardRequest {
                    return c.bundle_id;
                }
            }
            seen.push(m.msg.name());
        }
    })
    .await
    .unwrap();
    assert_eq!(seen, vec!["BUNDLE_CONTROL", "BUNDLE_ADD_MESSAGE", "BARRIER_REQUEST"]);
    assert_eq!(discard, 1);
}

#[tokio::test]
async fn an_undecodable_reply_fails_only_its_request() {
    let (_d, l, target) = listener();
    let (sw, mut p) = tokio::join!(Switch::connect(&target, SwitchOptions::default()), peer(&l));
    let sw = sw.unwrap();
    let req = tokio::spawn({
        let sw = sw.clone();
        async move { sw.get_config().await }
    });
    let m = tokio::time::timeout(T, p.next()).await.unwrap().unwrap().unwrap().unwrap();
    assert!(matches!(m.msg, Message::GetConfigRequest));
    // A GET_CONFIG_REPLY with a 1-byte body: well framed, not decodable.
    let bad = Bytes::from(vec![4u8, 8, 0, 9, (m.xid >> 24) as u8, (m.xid >> 16) as u8, (m.xid >> 8) as u8, m.xid as u8, 0]);
    p.send(bad).await.unwrap();
    let e = tokio::time::timeout(T, req).await.unwrap().unwrap().unwrap_err();
    assert!(matches!(e, SwitchError::BadReply { .. }), "{e}");
    // The connection survives.
    let echo = tokio::spawn({
        let sw = sw.clone();
        async move { sw.echo().await }
    });
    let m = tokio::time::timeout(T, p.next()).await.unwrap().unwrap().unwrap().unwrap();
    let Message::EchoRequest(payload) = m.msg else { panic!("{m:?}") };
    p.send(OfMessage::new(m.xid, Message::EchoReply(payload))).await.unwrap();
    tokio::time::timeout(T, echo).await.unwrap().unwrap().unwrap();
}

#[tokio::test]
async fn multipart_replies_are_assembled_and_replies_are_matched_by_xid() {
    let (_d, l, target) = listener();
    let (sw, mut p) = tokio::join!(Switch::connect(&target, SwitchOptions::default()), peer(&l));
    let sw = sw.unwrap();
    let dump = tokio::spawn({
        let sw = sw.clone();
        async move { sw.dump_flows(Default::default()).await }
    });
    let barrier = tokio::spawn({
        let sw = sw.clone();
        async move { sw.barrier().await }
    });
    let mut xids = std::collections::HashMap::new();
    for _ in 0..2 {
        let m = tokio::time::timeout(T, p.next()).await.unwrap().unwrap().unwrap().unwrap();
        xids.insert(m.msg.name(), m.xid);
    }
    let stats = |prio: u16| openflow::FlowStats {
        table_id: 0,
        duration_sec: 1,
        duration_nsec: 0,
        priority: prio,
        idle_timeout: 0,
        hard_timeout: 0,
        flags: Default::default(),
        cookie: 0,
        packet_count: 0,
        byte_count: 0,
        match_: Match::any(),
        instructions: vec![],
    };
    let part = |flags: u16, prio: u16| {
        Message::MultipartReply(openflow::MultipartReply { flags, body: openflow::MultipartReplyBody::Flow(vec![stats(prio).into()]) })
    };
    let mx = xids["MULTIPART_REQUEST"];
    // Interleave: part 1, the barrier reply, part 2 (last).
    p.send(OfMessage::new(mx, part(1, 10))).await.unwrap();
    p.send(OfMessage::new(xids["BARRIER_REQUEST"], Message::BarrierReply)).await.unwrap();
    p.send(OfMessage::new(mx, part(0, 20))).await.unwrap();
    tokio::time::timeout(T, barrier).await.unwrap().unwrap().unwrap();
    let flows = tokio::time::timeout(T, dump).await.unwrap().unwrap().unwrap();
    assert_eq!(flows.iter().map(|f| f.priority).collect::<Vec<_>>(), vec![10, 20]);
}

/// The one-round-trip commit's safety net, which a real switch never triggers (the engine
/// takes that path only for flows it cannot refuse when added): a peer that refuses one ADD
/// anyway and commits the rest, as OVS would. The update fails, the switch is repaired from a
/// dump *before* the error is answered, and later commits wait for a barrier before COMMIT.
#[tokio::test]
async fn a_refused_one_trip_add_is_repaired_before_the_error_and_ends_one_trip_commits() {
    use sdn_harness::bench::workload;
    use sdn_node::engine::{Engine, EngineError};

    let (_d, l, target) = listener();
    let (sw, mut p) = tokio::join!(Switch::connect(&target, SwitchOptions::default()), peer(&l));
    let engine = Engine::start(sw.unwrap(), 1);
    // A flow dump of `flows` as the only part.
    let dump = |xid: u32, flows: Vec<openflow::FlowStats>| {
        let body = openflow::MultipartReplyBody::Flow(flows.into_iter().map(Into::into).collect());
        OfMessage::new(xid, Message::MultipartReply(openflow::MultipartReply { flags: 0, body }))
    };

    // The first resync: an empty switch and an empty desired state, nothing to commit.
    let resync = tokio::spawn({
        let e = engine.clone();
        async move { e.resync(None).await }
    });
    let m = next_msg(&mut p).await;
    assert_eq!(m.msg.name(), "MULTIPART_REQUEST");
    p.send(dump(m.xid, vec![])).await.unwrap();
    tokio::time::timeout(T, resync).await.unwrap().unwrap().unwrap();

    // A pod setup: four ADDs and a COMMIT in one go (no OPEN, no barrier).
    let (owner, flows) = workload::pod_flows(7);
    let update = tokio::spawn({
        let e = engine.clone();
        let flows = flows.clone();
        async move { e.update(vec![(owner, flows)]).await }
    });
    let mut adds = Vec::new();
    let commit = loop {
        let m = next_msg(&mut p).await;
        match &m.msg {
            Message::BundleAdd(_) => adds.push(m),
            Message::BundleControl(c) if c.ctrl_type == BundleCtrlType::CommitRequest => break m,
            other => panic!("one-trip commit sent {}", other.name()),
        }
    };
    assert_eq!(adds.len(), 4);
    // The peer refuses the second ADD and commits the others.
    let refused = &adds[1];
    let err = openflow::ErrorMsg { code: openflow::ErrorCode::Standard { typ: 2, code: 4 }, data: refused.to_bytes().unwrap() };
    p.send(OfMessage::new(refused.xid, Message::Error(err))).await.unwrap();
    let Message::BundleControl(c) = &commit.msg else { unreachable!() };
    let reply = openflow::BundleControl::new(c.bundle_id, BundleCtrlType::CommitReply, openflow::BundleFlags::empty());
    p.send(OfMessage::new(commit.xid, Message::BundleControl(reply))).await.unwrap();

    // The repair: a dump (which shows the three committed flows), then a two-phase bundle of
    // their three deletes.
    let m = next_msg(&mut p).await;
    assert_eq!(m.msg.name(), "MULTIPART_REQUEST", "repaired at once");
    assert!(!update.is_finished(), "not answered before the repair");
    let cookie = workload::pod(7).0.cookie(1);
    let held = [0, 2, 3].map(|i| {
        let f: &sdn_node::pipeline::Flow = &flows[i];
        let fm = f.add(cookie);
        openflow::FlowStats {
            table_id: fm.table_id,
            duration_sec: 0,
            duration_nsec: 0,
            priority: fm.priority,
            idle_timeout: 0,
            hard_timeout: 0,
            flags: Default::default(),
            cookie,
            packet_count: 0,
            byte_count: 0,
            match_: fm.match_,
            instructions: fm.instructions,
        }
    });
    p.send(dump(m.xid, held.to_vec())).await.unwrap();
    let mut names = Vec::new();
    let mut deletes = 0;
    loop {
        let m = next_msg(&mut p).await;
        names.push(m.msg.name());
        match &m.msg {
            Message::BundleAdd(b) => {
                let Message::FlowMod(fm) = &b.message.msg else { panic!("{m:?}") };
                assert_eq!(fm.command, openflow::FlowModCommand::DeleteStrict);
                deletes += 1;
            }
            Message::BarrierRequest => p.send(OfMessage::new(m.xid, Message::BarrierReply)).await.unwrap(),
            Message::BundleControl(c) if c.ctrl_type == BundleCtrlType::CommitRequest => {
                let reply = openflow::BundleControl::new(c.bundle_id, BundleCtrlType::CommitReply, openflow::BundleFlags::empty());
                p.send(OfMessage::new(m.xid, Message::BundleControl(reply))).await.unwrap();
                break;
            }
            _ => {}
        }
    }
    assert_eq!(deletes, 3);
    assert_eq!(names.first().copied(), Some("BUNDLE_CONTROL"), "the repair opens its bundle: {names:?}");
    let e = tokio::time::timeout(T, update).await.unwrap().unwrap().unwrap_err();
    let EngineError::Switch(SwitchError::BundlePartial { failures }) = &e else { panic!("{e}") };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, 1, "the refused ADD's index: {e}");
    let (desired, installed, dirty) = engine.snapshot().await.unwrap();
    assert!(desired.is_empty() && installed.is_empty() && !dirty);

    // From now on every commit waits for a barrier before its COMMIT.
    let update = tokio::spawn({
        let e = engine.clone();
        async move { e.update(vec![workload::pod_flows(8)]).await }
    });
    let mut names = Vec::new();
    loop {
        let m = next_msg(&mut p).await;
        names.push(m.msg.name());
        match &m.msg {
            Message::BarrierRequest => p.send(OfMessage::new(m.xid, Message::BarrierReply)).await.unwrap(),
            Message::BundleControl(c) if c.ctrl_type == BundleCtrlType::CommitRequest => {
                let reply = openflow::BundleControl::new(c.bundle_id, BundleCtrlType::CommitReply, openflow::BundleFlags::empty());
                p.send(OfMessage::new(m.xid, Message::BundleControl(reply))).await.unwrap();
                break;
            }
            _ => {}
        }
    }
    assert!(names.contains(&"BARRIER_REQUEST"), "{names:?}");
    tokio::time::timeout(T, update).await.unwrap().unwrap().unwrap();
}

async fn next_msg(p: &mut Framed<UnixStream, OfCodec>) -> OfMessage {
    tokio::time::timeout(T, p.next()).await.unwrap().unwrap().unwrap().unwrap()
}
