//! Kubernetes Events about what this node does not do: a NetworkPolicy the API server accepted
//! may have a part this node cannot use (an unknown protocol, a port it cannot match), which
//! it drops — never allowing more — and a log line on one node is not where the policy's
//! author looks. A Warning Event regarding the policy (`kubectl describe networkpolicy`) names
//! each dropped field, once per policy generation and node, through kube's [`Recorder`]
//! (which names this node as the reporting instance).
//!
//! And about what this node waits for: no ClusterNetwork "default", or no (valid) HostSubnet
//! for this node yet (see [`super::mapping::Unusable`]). A Warning Event regarding this Node
//! (`kubectl describe node`) says what and who makes it, once per wait (a new wait is a new
//! Event; a failed publish is retried with backoff while the wait lasts).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::mapping::{Id, Unusable};

/// The Event's reason (`kubectl describe` shows it).
pub const PARTLY_ENFORCED_REASON: &str = "NetworkPolicyPartlyEnforced";

/// The reporting controller.
pub const CONTROLLER: &str = "sdn-node";

/// The action of the Events about what the node waits for.
pub const WAIT_ACTION: &str = "WaitForClusterObjects";

/// What the NetworkPolicy watcher and the publisher tell the events task.
#[derive(Debug)]
pub enum Notice {
    /// A NetworkPolicy with parts dropped (as listed or changed): what was dropped, and why.
    PartlyEnforced { id: Id, reference: ObjectReference, generation: i64, note: String },
    /// A NetworkPolicy enforced whole (or deleted): reported again if that changes.
    Quiet(Id),
    /// No state can be built: the node waits for this (a Warning Event regarding this Node,
    /// once per wait).
    Waiting(Unusable),
    /// A state was built: the wait, if any, is over.
    Proceeding,
}

pub fn recorder(client: Client, node: &str) -> Recorder {
    Recorder::new(client, Reporter { controller: CONTROLLER.into(), instance: Some(node.into()) })
}

/// This Node, as Events regard it. The UID is the node's name, as the kubelet's own Node
/// Events have it: `kubectl describe node` looks Events up by that.
pub fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..Default::default()
    }
}

/// The first retry of a failed wait Event, doubled per failure up to [`WAIT_RETRY_CAP`].
const WAIT_RETRY_BASE: Duration = Duration::from_secs(1);
const WAIT_RETRY_CAP: Duration = Duration::from_secs(60);

/// The current wait and whether its Event is out.
struct Wait {
    what: Unusable,
    published: bool,
    failures: u32,
}

/// Publishes one Warning Event per partly enforced policy generation (a failed publish is
/// logged and tried again when the policy is next listed or changed), and one regarding
/// `node` per wait (retried with backoff while the wait lasts).
pub async fn report(recorder: Recorder, node: String, mut notices: mpsc::UnboundedReceiver<Notice>) {
    // Per policy: the (uid, generation) last reported.
    let mut reported: HashMap<Id, (Option<String>, i64)> = HashMap::new();
    let mut wait: Option<Wait> = None;
    loop {
        // A wait whose Event failed is tried again after a while.
        let retry = match &wait {
            Some(w) if !w.published && w.failures > 0 => {
                Some(crate::metrics::retry_delay(w.failures, WAIT_RETRY_BASE, WAIT_RETRY_CAP))
            }
            _ => None,
        };
        let n = tokio::select! {
            n = notices.recv() => match n {
                Some(n) => Some(n),
                None => return,
            },
            _ = async { match retry { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => None,
        };
        let (id, reference, generation, note) = match n {
            None => {
                publish_wait(&recorder, &node, &mut wait).await;
                continue;
            }
            Some(Notice::Waiting(what)) => {
                if wait.as_ref().is_none_or(|w| w.what != what) {
                    wait = Some(Wait { what, published: false, failures: 0 });
                    publish_wait(&recorder, &node, &mut wait).await;
                }
                continue;
            }
            Some(Notice::Proceeding) => {
                wait = None;
                continue;
            }
            Some(Notice::Quiet(id)) => {
                reported.remove(&id);
                continue;
            }
            Some(Notice::PartlyEnforced { id, reference, generation, note }) => (id, reference, generation, note),
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

/// Publishes the current wait's Event unless it is out.
async fn publish_wait(recorder: &Recorder, node: &str, wait: &mut Option<Wait>) {
    let Some(w) = wait.as_mut().filter(|w| !w.published) else { return };
    let event = Event {
        type_: EventType::Warning,
        reason: w.what.reason().into(),
        note: Some(truncate(&w.what.to_string(), 1000)),
        action: WAIT_ACTION.into(),
        secondary: None,
    };
    match recorder.publish(&event, &node_reference(node)).await {
        Ok(()) => {
            info!(node, reason = w.what.reason(), "reported on the Node: {}", w.what);
            w.published = true;
        }
        Err(e) => {
            w.failures = w.failures.saturating_add(1);
            if w.failures == 1 {
                warn!(node, error = %e, "cannot publish the {} Event on the Node; retrying with backoff", w.what.reason());
            } else {
                debug!(node, error = %e, attempts = w.failures, "cannot publish the {} Event on the Node", w.what.reason());
            }
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
