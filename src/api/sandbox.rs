//! The sandbox a CNI request names (`CNI_NETNS`), opened only if it is a pod's network
//! namespace: see [`hostnet::Netns::open_sandbox`] for what is refused and why. Refusals are
//! the request's fault (400, field `netns`); failing to look is the agent's (500).

use crate::api::ApiError;
use crate::cluster::Problem;
use crate::reconcile::Node;

/// Opens `netns` as the sandbox of `object` (e.g. "pod team-a/web").
pub async fn open(node: &Node, object: &str, netns: &str) -> Result<hostnet::Netns, ApiError> {
    let forbidden: Vec<hostnet::NsId> = node.spares.hold_id().into_iter().collect();
    hostnet::Netns::open_sandbox(netns, &forbidden).await.map_err(|e| match e {
        hostnet::SandboxError::Refused(m) => ApiError::Invalid(Problem::new(object, "netns", m)),
        hostnet::SandboxError::Failed(e) => ApiError::Failed(format!("{object}: opening its sandbox: {e}")),
    })
}
