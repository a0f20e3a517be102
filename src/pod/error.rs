//! Why a pod request failed, in the domain's words. The pod API maps these to HTTP statuses
//! (the api module) and the CNI plugin maps those to CNI error codes; nothing below the API
//! knows either. Every failure leaves nothing of the request behind (see [`super::pods`]).

use tokio::time::{timeout_at, Instant};

use crate::cluster::{Pod, Problem};
use crate::engine::{EngineError, Pending};
use crate::ovsdb::OvsdbError;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodError {
    /// A field of the request is malformed or invalid (HTTP 400).
    #[error("{0}")]
    Invalid(Problem),
    /// The request conflicts with another pod, port or sandbox (409).
    #[error("{0}")]
    Conflict(Problem),
    /// No such pod (404).
    #[error("{0}")]
    NotFound(String),
    /// OVSDB or the switch is not connected or not synced yet, or there is no cluster state
    /// (503, retry later).
    #[error("{0}")]
    NotReady(String),
    /// The request's deadline passed (504).
    #[error("{0}")]
    Deadline(String),
    /// The switch or OVSDB refused the change (500).
    #[error("{0}")]
    Refused(String),
    /// Anything else that failed on the node: the kernel, the checkpoint (500).
    #[error("{0}")]
    Failed(String),
}

impl From<crate::node::state::Refusal> for PodError {
    fn from(r: crate::node::state::Refusal) -> PodError {
        match r {
            crate::node::state::Refusal::Invalid(p) => PodError::Invalid(p),
            crate::node::state::Refusal::Conflict(p) => PodError::Conflict(p),
            crate::node::state::Refusal::NoState => PodError::NotReady("no cluster state yet".into()),
            crate::node::state::Refusal::NotYet(m) => PodError::NotReady(m),
        }
    }
}

impl PodError {
    /// The failure's message (a [`Problem`] with its object and field).
    pub fn message(&self) -> String {
        self.to_string()
    }
}

// What the peers' failures mean for a pod request (setup and teardown alike).

/// Maps an OVSDB failure of a pod's port to what the client is told.
pub(super) fn ovsdb_error(pod: &Pod, e: OvsdbError) -> PodError {
    let obj = format!("pod {}/{}", pod.namespace, pod.name);
    match e {
        e if e.is_disconnect() => PodError::NotReady(format!("ovsdb-server: {e}")),
        OvsdbError::Timeout(m) => PodError::Deadline(format!("ovsdb-server: {m}")),
        // The bridge itself is gone (someone deleted it; the reconciler puts it back): the
        // node is not ready, the request was fine (a retry succeeds once it is back).
        e @ OvsdbError::NotFound { table: "Bridge", .. } => {
            PodError::NotReady(format!("ovsdb-server: {e} (the agent is putting it back)"))
        }
        // The port is another bridge's: the agent takes none without being told to.
        e @ OvsdbError::OnOtherBridge { .. } => PodError::Conflict(Problem::new(
            obj,
            "hostVeth",
            format!("{e}: the agent moves no port from another bridge unless run with --take-ports-from-other-bridges"),
        )),
        // The device does not exist or OVS cannot use it: the request named it.
        e @ (OvsdbError::InterfaceError { .. } | OvsdbError::NotFound { .. }) => {
            PodError::Invalid(Problem::new(obj, "hostVeth", format!("{:?}: {e}", pod.host_veth)))
        }
        e => PodError::Refused(format!("ovsdb-server: {e}")),
    }
}

pub(super) fn engine_error(e: EngineError) -> PodError {
    match e {
        EngineError::Switch(e) if e.is_disconnect() => PodError::NotReady(format!("switch: {e}")),
        EngineError::Switch(crate::switch::SwitchError::Timeout { what, after }) => {
            PodError::Deadline(format!("switch: no answer to {what} within {after:?}"))
        }
        EngineError::Busy | EngineError::Stopped => PodError::NotReady(format!("switch: {e}")),
        e => PodError::Refused(format!("switch: {e}")),
    }
}

/// Awaits the engine's answer within the deadline.
pub(super) async fn committed(rx: Pending<crate::engine::Outcome>, deadline: Instant) -> Result<(), PodError> {
    match timeout_at(deadline, rx).await {
        Err(_) => Err(PodError::Deadline("the switch did not commit the change in time".into())),
        Ok(Err(_)) => Err(PodError::NotReady("the flow engine stopped".into())),
        Ok(Ok(r)) => r.map(|_| ()).map_err(engine_error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        Pod {
            ip6: None,
            namespace: "team-a".into(),
            name: "a1".into(),
            container_id: crate::domain::ContainerId::parse(&"ab".repeat(32)).unwrap(),
            host_veth: "veth-a1".into(),
            ip: Some("10.128.0.2".parse().unwrap()),
            mac: "0a:58:0a:80:00:02".parse().unwrap(),
            ingress_bps: 0,
            egress_bps: 0,
            internal: false,
            labels: Default::default(),
            container_ports: Vec::new(),
        }
    }

    /// A bridge someone deleted is the node's state, not the request's fault: try again later
    /// (the chaos soak saw it refused as an invalid hostVeth). A missing interface is the
    /// request's.
    #[test]
    fn a_missing_bridge_is_not_ready_a_missing_interface_is_invalid() {
        let e = ovsdb_error(&pod(), OvsdbError::NotFound { table: "Bridge", name: "br0".into() });
        assert!(matches!(e, PodError::NotReady(ref m) if m.contains("br0")), "{e:?}");
        let e = ovsdb_error(&pod(), OvsdbError::NotFound { table: "Interface", name: "veth-a1".into() });
        assert!(matches!(e, PodError::Invalid(ref p) if p.field == "hostVeth"), "{e:?}");
    }
}
