//! Kubernetes Events about what this node does not do: a NetworkPolicy the API server accepted
//! may have a part this node cannot use (an unknown protocol, a port it cannot match), which
//! it drops — never allowing more — and a log line on one node is not where the policy's
//! author looks. A Warning Event regarding the policy (`kubectl describe networkpolicy`) names
//! each dropped field, once per policy generation and node, through kube's [`Recorder`]
//! (which names this node as the reporting instance).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::mapping::Id;

/// The Event's reason (`kubectl describe` shows it).
pub const PARTLY_ENFORCED_REASON: &str = "NetworkPolicyPartlyEnforced";

/// The reporting controller.
pub const CONTROLLER: &str = "sdn-node";

/// What the NetworkPolicy watcher tells the events task.
#[derive(Debug)]
pub enum Notice {
    /// A NetworkPolicy with parts dropped (as listed or changed): what was dropped, and why.
    PartlyEnforced { id: Id, reference: ObjectReference, generation: i64, note: String },
    /// A NetworkPolicy enforced whole (or deleted): reported again if that changes.
    Quiet(Id),
}

pub fn recorder(client: Client, node: &str) -> Recorder {
    Recorder::new(client, Reporter { controller: CONTROLLER.into(), instance: Some(node.into()) })
}

/// Publishes one Warning Event per partly enforced policy generation. A failed publish is logged and
/// tried again when the policy is next listed or changed.
pub async fn report(recorder: Recorder, mut notices: mpsc::UnboundedReceiver<Notice>) {
    // Per policy: the (uid, generation) last reported.
    let mut reported: HashMap<Id, (Option<String>, i64)> = HashMap::new();
    while let Some(n) = notices.recv().await {
        let (id, reference, generation, note) = match n {
            Notice::Quiet(id) => {
                reported.remove(&id);
                continue;
            }
            Notice::PartlyEnforced { id, reference, generation, note } => (id, reference, generation, note),
        };
        let key = (reference.uid.clone(), generation);
        if reported.get(&id) == Some(&key) {
            continue;
        }
        let event = Event {
            type_: EventType::Warning,
            reason: PARTLY_ENFORCED_REASON.into(),
            // The API limits a note to 1 KiB.
            note: Some(truncate(&note, 1000)),
            action: "EnforceNetworkPolicy".into(),
            secondary: None,
        };
        match recorder.publish(&event, &reference).await {
            Ok(()) => {
                info!(policy = %format!("{}/{}", id.0, id.1), generation, "reported: policy partly enforced (Event {PARTLY_ENFORCED_REASON})");
                reported.insert(id, key);
            }
            Err(e) => warn!(policy = %format!("{}/{}", id.0, id.1), error = %e, "cannot publish the {PARTLY_ENFORCED_REASON} Event; will retry when the policy is listed or changed"),
        }
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}
