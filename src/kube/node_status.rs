//! This node's `NetworkUnavailable` condition, set to False once the agent is ready, as Calico,
//! flannel and Antrea do: a node whose condition is True (or that a cloud's route controller
//! set so) gets the `node.kubernetes.io/network-unavailable` taint, and the scheduler keeps
//! pods off it. The agent writes the condition once per start, when `/readyz` first says ready
//! (the same truth: connected, synced and converged), with a strategic merge patch of its own
//! Node's `status` subresource that names that one condition (merged by `type`: the kubelet's
//! conditions stay). A failure (the API server, RBAC, the admission policy) is logged and
//! retried with backoff; it is never fatal and never holds pods back. The agent never sets the
//! condition to True: a node whose agent stops keeps False, and `/readyz` (the DaemonSet's
//! readiness) is where an agent that is not ready shows.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::metrics::Health;

/// The condition's type.
pub const CONDITION: &str = "NetworkUnavailable";
/// Its reason when the agent sets it to False.
pub const REASON: &str = "SdnNodeIsUp";
/// Its message.
pub const MESSAGE: &str = "sdn-node is running on this node and has programmed its pod network";

/// How often readiness is looked at until it first holds.
const READY_POLL: Duration = Duration::from_millis(200);
/// The first retry after a failed patch, doubled per failure up to [`RETRY_CAP`].
const RETRY_BASE: Duration = Duration::from_millis(500);
const RETRY_CAP: Duration = Duration::from_secs(60);

/// The patch: `status.conditions` with the one condition (a strategic merge patch merges the
/// list by `type`).
#[derive(Debug, Serialize)]
struct StatusPatch {
    status: NodeStatus,
}

/// The condition as the patch sets it: False, since `transition` (the old condition's time if
/// it was False already: no transition then), heartbeat now.
pub fn condition(now: jiff::Timestamp, transition: Option<Time>) -> NodeCondition {
    NodeCondition {
        type_: CONDITION.into(),
        status: "False".into(),
        reason: Some(REASON.into()),
        message: Some(MESSAGE.into()),
        last_transition_time: Some(transition.unwrap_or(Time(now))),
        last_heartbeat_time: Some(Time(now)),
    }
}

/// When the Node's condition became False, if it is False now.
fn false_since(node: &Node) -> Option<Time> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == CONDITION && c.status == "False")?;
    c.last_transition_time.clone()
}

/// Waits until `health` says ready, then sets `node`'s condition to False (retried with
/// backoff until it is written). Returns once written.
pub async fn announce(nodes: Api<Node>, node: String, health: Arc<Health>) {
    let mut tick = tokio::time::interval(READY_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while health.not_ready().is_some() {
        tick.tick().await;
    }
    let mut failures = 0u32;
    loop {
        match set_false(&nodes, &node).await {
            Ok(()) => {
                info!(node = %node, condition = CONDITION, reason = REASON, "node condition set to False");
                return;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    warn!(node = %node, error = %e, "cannot set the node's {CONDITION} condition to False (RBAC nodes/status patch, the admission policy?); retrying with backoff");
                } else {
                    debug!(node = %node, error = %e, attempts = failures, "cannot set the node's {CONDITION} condition");
                }
                tokio::time::sleep(crate::metrics::retry_delay(failures, RETRY_BASE, RETRY_CAP)).await;
            }
        }
    }
}

async fn set_false(nodes: &Api<Node>, node: &str) -> Result<(), kube::Error> {
    // A condition already False keeps its transition time (an agent restart is no transition);
    // a node that cannot be read is patched all the same.
    let since = match nodes.get(node).await {
        Ok(n) => false_since(&n),
        Err(e) => {
            debug!(node, error = %e, "cannot read the node before setting its {CONDITION} condition");
            None
        }
    };
    let patch = StatusPatch {
        status: NodeStatus { conditions: Some(vec![condition(jiff::Timestamp::now(), since)]), ..Default::default() },
    };
    nodes.patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch)).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_names_one_condition_set_to_false() {
        let now: jiff::Timestamp = "2025-01-02T03:04:05Z".parse().unwrap();
        let patch =
            StatusPatch { status: NodeStatus { conditions: Some(vec![condition(now, None)]), ..Default::default() } };
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            serde_json::json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": REASON,
                "message": MESSAGE, "lastTransitionTime": "2025-01-02T03:04:05Z", "lastHeartbeatTime": "2025-01-02T03:04:05Z"}]}})
        );
        // Already False: the transition time stays.
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "status": {"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:00Z"},
            {"type": "NetworkUnavailable", "status": "False", "lastTransitionTime": "2024-06-01T00:00:00Z"}]}}))
            .unwrap();
        let c = condition(now, false_since(&node));
        assert_eq!(c.last_transition_time.unwrap().0.to_string(), "2024-06-01T00:00:00Z");
        assert_eq!(c.last_heartbeat_time.unwrap().0, now);
        // True (a cloud's route controller, or never set): a transition, now.
        let node: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "status": {"conditions": [
            {"type": "NetworkUnavailable", "status": "True", "lastTransitionTime": "2024-06-01T00:00:00Z"}]}}))
            .unwrap();
        assert_eq!(false_since(&node), None);
    }
}
