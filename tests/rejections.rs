//! One typo does not tear a pod down (issue 32, item 3): in a running agent, a pod of the state
//! file rejected on its own (an unknown field, a bad value) keeps its last good version — its
//! port (`ovs-vsctl`) and its flows (`ovs-ofctl dump-flows`) stay as they were — and the
//! rejection shows in `sdn-node status` (object, field, message, since when) and in the gauge
//! `sdn_node_rejected_objects{kind}`; fixing the file clears both. A new pod with a typo has no
//! good version: it is rejected and gets nothing. Each check ends with the agent ready.

mod support;

use std::time::Duration;

use support::agent::{pod, vsctl, without_cookies, write_state, Doc};
use support::inproc::*;

const POLLS: u32 = 800;

fn state(pods: &[String], comment: &str) -> String {
    let mut d = Doc::base();
    d.pods = pods.to_vec();
    d.comment = comment.into();
    d.render()
}

fn ports(r: &Running) -> Vec<String> {
    let mut v: Vec<String> =
        vsctl(&r.sb, &["list-ports", "br0"]).lines().map(str::to_string).filter(|p| p.starts_with("vp")).collect();
    v.sort();
    v
}

/// `sdn-node status` (the text an operator reads) against the agent's socket.
async fn status_text(r: &Running) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(["status", "--socket"])
        .arg(&r.socket)
        .output()
        .await
        .expect("run sdn-node status");
    assert!(out.status.success(), "sdn-node status: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The gauge's value for `kind` on the metrics endpoint.
async fn gauge(r: &Running, kind: &str) -> Option<u64> {
    let (code, text) = http_get(&r.metrics, "/metrics").await;
    assert_eq!(code, 200);
    let prefix = format!("sdn_node_rejected_objects{{kind=\"{kind}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.trim().parse().expect("a number"))
}

/// Polls the agent's status until `pred` holds of its current rejections.
async fn rejections_are(
    r: &Running,
    what: &str,
    pred: impl Fn(&[sdn_node::api::status::RejectionStatus]) -> bool,
) -> sdn_node::api::status::Status {
    let mut last = None;
    for _ in 0..POLLS {
        let st = sdn_node::api::status::fetch(&r.socket).await.expect("status");
        if pred(&st.rejections) {
            return st;
        }
        last = Some(st.rejections);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what}: rejections now {last:#?}");
}

#[tokio::test]
async fn a_typo_keeps_the_pods_last_good_version_and_shows_until_fixed() {
    let good = [pod("team-a", 0, 0), pod("team-b", 1, 0)];
    let r = start(&state(&good, "good")).await;
    ready_again(&r, "start").await;
    assert_eq!(ports(&r), ["vp0", "vp1"]);
    let before = support::dump_sorted(&r.sb, &[]);
    assert!(before.iter().any(|l| l.contains("10.128.2.11")), "p1's flows are there: {before:#?}");
    assert_eq!(gauge(&r, "pod").await, Some(0), "the gauge is exported from start");
    let text = status_text(&r).await;
    assert!(text.contains("rejected now: none"), "{text}");

    // team-b/p1 gets a typo: `internl: true`.
    let typo = pod("team-b", 1, 0).replace("internal: true", "internl: true");
    assert_ne!(typo, good[1]);
    write_state(&r.state, &state(&[good[0].clone(), typo.clone()], "typo"));
    let st = rejections_are(&r, "the typo is reported", |rs| rs.iter().any(|x| x.object == "pod team-b/p1")).await;
    let rej = st.rejections.iter().find(|x| x.object == "pod team-b/p1").unwrap();
    assert_eq!(rej.field, "internl");
    assert!(
        rej.message.contains("unknown field `internl`") && rej.message.contains("the last good version is kept"),
        "{rej:?}"
    );
    let since = rej.since_unix_ms;
    assert!(since > 0);
    ready_again(&r, "the typo'd file").await;

    // The pod keeps its port and its flows: nothing on the switch moved.
    assert_eq!(ports(&r), ["vp0", "vp1"], "the typo'd pod keeps its port");
    let during = support::dump_sorted(&r.sb, &[]);
    assert_eq!(without_cookies(&during), without_cookies(&before), "the typo'd pod keeps its flows");
    assert_eq!(st.pods.names, ["team-a/p0", "team-b/p1"]);
    assert_eq!(gauge(&r, "pod").await, Some(1));
    let text = status_text(&r).await;
    assert!(text.contains("rejected now: 1"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("  pod team-b/p1: field internl: unknown field `internl`")
            && l.contains("(the last good version is kept)")
            && l.contains("(since ")),
        "{text}"
    );

    // Another edit that leaves the typo (a new pod with a typo of its own, a bad value): the
    // typo'd pod is still kept, with its first-seen time; the new one is rejected and gets
    // nothing (there is no good version of it to keep).
    let new_typo = pod("team-a", 2, 0).replace("ingressBPS: 0", "ingressBPS: fast");
    write_state(&r.state, &state(&[good[0].clone(), typo.clone(), new_typo], "typo and a new bad pod"));
    let st = rejections_are(&r, "both rejections", |rs| rs.len() == 2).await;
    let p2 = st.rejections.iter().find(|x| x.object == "pod team-a/p2").expect("p2 rejected");
    assert_eq!(p2.field, "ingressBPS");
    assert!(!p2.message.contains("last good version"), "{p2:?}");
    assert_eq!(
        st.rejections.iter().find(|x| x.object == "pod team-b/p1").unwrap().since_unix_ms,
        since,
        "still the first rejection"
    );
    ready_again(&r, "two rejected pods").await;
    assert_eq!(ports(&r), ["vp0", "vp1"], "no port for the new bad pod, p1 keeps its own");
    assert_eq!(without_cookies(&support::dump_sorted(&r.sb, &[])), without_cookies(&before));
    assert_eq!(gauge(&r, "pod").await, Some(2));

    // Fixed: the rejections clear, the gauge is back to 0; p2 is set up now.
    write_state(&r.state, &state(&[good[0].clone(), good[1].clone(), pod("team-a", 2, 0)], "fixed"));
    rejections_are(&r, "the fix clears the rejections", <[_]>::is_empty).await;
    for _ in 0..POLLS {
        if ports(&r) == ["vp0", "vp1", "vp2"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(ports(&r), ["vp0", "vp1", "vp2"]);
    ready_again(&r, "the fixed file").await;
    assert_eq!(gauge(&r, "pod").await, Some(0));
    assert!(status_text(&r).await.contains("rejected now: none"));
    let after = support::dump_sorted(&r.sb, &[]);
    assert!(
        after.iter().any(|l| l.contains("10.128.2.11")) && after.iter().any(|l| l.contains("10.128.2.12")),
        "{after:#?}"
    );
    // And the same pod with a bad value now keeps the fixed version (the last good one).
    let bad_ip = good[1].replace("ip: 10.128.2.11", "ip: 10.128.2.x");
    assert_ne!(bad_ip, good[1]);
    let before = after;
    write_state(&r.state, &state(&[good[0].clone(), bad_ip, pod("team-a", 2, 0)], "bad value"));
    let st = rejections_are(&r, "the bad value is reported", |rs| rs.len() == 1).await;
    assert_eq!((st.rejections[0].object.as_str(), st.rejections[0].field.as_str()), ("pod team-b/p1", "ip"));
    ready_again(&r, "a bad value").await;
    assert_eq!(ports(&r), ["vp0", "vp1", "vp2"]);
    assert_eq!(without_cookies(&support::dump_sorted(&r.sb, &[])), without_cookies(&before));
    write_state(&r.state, &state(&[good[0].clone(), good[1].clone(), pod("team-a", 2, 0)], "fixed again"));
    rejections_are(&r, "fixed again", <[_]>::is_empty).await;
    ready_again(&r, "fixed again").await;
}
