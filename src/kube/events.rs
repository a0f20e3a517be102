//! Kubernetes Events about what this node does not do: a NetworkPolicy of type Egress is
//! accepted by the API server but not enforced by this datapath, and a log line on one node is
//! not where its author looks. A Warning Event regarding the policy (`kubectl describe
//! networkpolicy`) says so, once per policy generation and node, through kube's
//! [`Recorder`] (which names this node as the reporting instance).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::mapping::Id;

/// The Event's reason (`kubectl describe` shows it).
pub const EGRESS_REASON: &str = "EgressNotEnforced";

/// The reporting controller.
pub const CONTROLLER: &str = "sdn-node";

/// What the NetworkPolicy watcher tells the events task.
#[derive(Debug)]
pub enum Notice {
    /// A NetworkPolicy of type Egress (as listed or changed).
    Egress { id: Id, reference: ObjectReference, generation: i64 },
    /// A NetworkPolicy that is not (any longer) of type Egress, or was deleted: reported again
    /// if it becomes one.
    Quiet(Id),
}

pub fn recorder(client: Client, node: &str) -> Recorder {
    Recorder::new(client, Reporter { controller: CONTROLLER.into(), instance: Some(node.into()) })
}

/// Publishes one Warning Event per Egress policy generation. A failed publish is logged and
/// tried again when the policy is next listed or changed.
pub async fn report(recorder: Recorder, mut notices: mpsc::UnboundedReceiver<Notice>) {
    // Per policy: the (uid, generation) last reported.
    let mut reported: HashMap<Id, (Option<String>, i64)> = HashMap::new();
    while let Some(n) = notices.recv().await {
        let (id, reference, generation) = match n {
            Notice::Quiet(id) => {
                reported.remove(&id);
                continue;
            }
            Notice::Egress { id, reference, generation } => (id, reference, generation),
        };
        let key = (reference.uid.clone(), generation);
        if reported.get(&id) == Some(&key) {
            continue;
        }
        let event = Event {
            type_: EventType::Warning,
            reason: EGRESS_REASON.into(),
            note: Some("Egress rules are not enforced by the openshift-ovs-networkpolicy datapath on this node: egress from the selected pods stays allowed".into()),
            action: "EnforceNetworkPolicy".into(),
            secondary: None,
        };
        match recorder.publish(&event, &reference).await {
            Ok(()) => {
                info!(policy = %format!("{}/{}", id.0, id.1), generation, "reported: Egress rules not enforced (Event {EGRESS_REASON})");
                reported.insert(id, key);
            }
            Err(e) => warn!(policy = %format!("{}/{}", id.0, id.1), error = %e, "cannot publish the {EGRESS_REASON} Event; will retry when the policy is listed or changed"),
        }
    }
}
