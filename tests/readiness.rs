//! Readiness tells the truth (issue 32, item 1): `/readyz` is 200 again within a bounded number
//! of polls after every change the agent converges — a pod added to and removed from the state
//! file, a port someone deleted and the agent put back, flows someone deleted, a pod set up and
//! torn down through the pod API — and 503 with the reason only while something is not
//! converged. Before the fix, each of these left `/readyz` at 503 ("switch not converged to the
//! latest state") for good: the pass that converged them moved the model on itself (the new
//! port's ofport) and nothing started another.

mod support;

use std::time::Duration;

use support::agent::{pod, vsctl, without_cookies, write_state, Doc};
use support::inproc::*;

const POLLS: u32 = 800;

fn state(pods: &[String]) -> String {
    let mut d = Doc::base();
    d.pods = pods.to_vec();
    d.render()
}

fn ports(r: &Running) -> Vec<String> {
    let mut v: Vec<String> =
        vsctl(&r.sb, &["list-ports", "br0"]).lines().map(str::to_string).filter(|p| p.starts_with("vp")).collect();
    v.sort();
    v
}

/// Polls until the bridge's pod ports are `want`.
async fn ports_are(r: &Running, want: &[&str], what: &str) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    for _ in 0..POLLS {
        if ports(r) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what}: ports {:?}, want {want:?}", ports(r));
}

#[tokio::test]
async fn ready_again_after_state_file_pods_come_and_go() {
    let r = start(&state(&[pod("team-a", 0, 0)])).await;
    ready_again(&r, "start").await;

    // A pod added to the state file: its port is made, its flows follow, ready again.
    write_state(&r.state, &state(&[pod("team-a", 0, 0), pod("team-b", 1, 0)]));
    ports_are(&r, &["vp0", "vp1"], "pod added").await;
    ready_again(&r, "a pod added to the state file").await;
    let flows = support::dump_sorted(&r.sb, &[]);
    assert!(flows.iter().any(|l| l.contains("10.128.2.11")), "the new pod's flows are there: {flows:#?}");

    // And removed again.
    write_state(&r.state, &state(&[pod("team-a", 0, 0)]));
    ports_are(&r, &["vp0"], "pod removed").await;
    ready_again(&r, "a pod removed from the state file").await;
    let flows = support::dump_sorted(&r.sb, &[]);
    assert!(!flows.iter().any(|l| l.contains("10.128.2.11")), "the removed pod's flows are gone: {flows:#?}");

    // A bandwidth change (a QoS row; flows unchanged).
    write_state(&r.state, &state(&[pod("team-a", 0, 1_000_000)]));
    for _ in 0..POLLS {
        if support::agent::qos_rows(&r.sb) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(support::agent::qos_rows(&r.sb), 1, "the pod's ingress limit is set");
    ready_again(&r, "a pod's bandwidth changed").await;
}

#[tokio::test]
async fn ready_again_after_a_repaired_port_and_deleted_flows() {
    let r = start(&state(&[pod("team-a", 0, 0), pod("team-a", 1, 0)])).await;
    ready_again(&r, "start").await;
    let before = support::dump_sorted(&r.sb, &[]);

    vsctl(&r.sb, &["del-port", "br0", "vp1"]);
    ports_are(&r, &["vp0", "vp1"], "a deleted port put back").await;
    ready_again(&r, "a deleted port put back").await;
    // Same flows, but for vp1's new ofport (a re-added port gets a new number).
    let after = support::dump_sorted(&r.sb, &[]);
    assert_eq!(after.len(), before.len(), "as many flows as before the repair:\n{}", support::agent::diff(&before, &after));

    support::ofctl(&r.sb, &["del-flows", "br0"]);
    for _ in 0..POLLS {
        if support::dump_sorted(&r.sb, &[]).len() == after.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // A full replay moves the flows to a new generation (the cookies' upper bits).
    let back = support::dump_sorted(&r.sb, &[]);
    assert_eq!(without_cookies(&back), without_cookies(&after), "the flows are back");
    ready_again(&r, "deleted flows put back").await;
}

#[tokio::test]
async fn ready_again_after_pod_api_adds_and_deletes() {
    let r = start(&state(&[pod("team-a", 0, 0)])).await;
    ready_again(&r, "start").await;
    for round in 0..3u8 {
        let p1 = support::inproc::pod(&format!("api-{round}-a"), "team-a", &format!("10.128.3.{}", 10 + 2 * round), 2 * round + 1);
        let p2 = support::inproc::pod(&format!("api-{round}-b"), "team-b", &format!("10.128.3.{}", 11 + 2 * round), 2 * round + 2);
        let (a, b) = tokio::join!(add(&r.socket, &p1), add(&r.socket, &p2));
        assert_eq!(a.0, 200, "ADD {}: {}", p1.name, a.1);
        assert_eq!(b.0, 200, "ADD {}: {}", p2.name, b.1);
        ready_again(&r, &format!("round {round}: two pods added")).await;
        let (a, b) = tokio::join!(del(&r.socket, "team-a", &p1.name), del(&r.socket, "team-b", &p2.name));
        assert_eq!(a.0, 200, "DEL {}: {}", p1.name, a.1);
        assert_eq!(b.0, 200, "DEL {}: {}", p2.name, b.1);
        ready_again(&r, &format!("round {round}: two pods deleted")).await;
    }
    // While a state change is being converged readiness may be false, but it never sticks: a
    // state-file change in the middle of pod requests.
    let p = support::inproc::pod("late", "team-a", "10.128.3.40", 40);
    write_state(&r.state, &state(&[pod("team-a", 0, 0), pod("team-b", 2, 0)]));
    let (a, _) = tokio::join!(add(&r.socket, &p), async {});
    assert_eq!(a.0, 200, "ADD late: {}", a.1);
    ports_are(&r, &["vp0", "vp2"], "state-file pod beside API pods").await;
    ready_again(&r, "a state-file change during pod requests").await;
    assert_eq!(del(&r.socket, "team-a", "late").await.0, 200);
    ready_again(&r, "the last DEL").await;
}
