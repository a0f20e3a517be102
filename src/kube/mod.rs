//! The Kubernetes source: kube-rs watchers and reflectors for openshift-sdn's objects, mapped to
//! the cluster state (the state file's schema, validated by the same code).
//!
//! CONTRACT (used by `run` and by deploy/ tests):
//! - [`spawn`] starts the watchers and returns a receiver of [`Loaded`] states, published once
//!   every reflector has listed (`InitDone`) and after each change (debounced). `live_pods` is
//!   `Some` (this node's pods) so that pods set up through the pod API but deleted in the
//!   cluster are torn down after a relist.
//! - [`WATCHED`] lists every resource the daemon watches or changes, with the verbs it uses:
//!   the single source for both the watchers and the RBAC rules (deploy/ checks its ClusterRole
//!   against [`rbac_rules`]).

use crate::run::source::Loaded;

/// One Kubernetes resource the daemon uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watched {
    /// API group ("" for the core group).
    pub group: &'static str,
    /// Plural resource name.
    pub resource: &'static str,
    /// Verbs the daemon uses on it.
    pub verbs: &'static [&'static str],
}

/// Every resource the daemon watches or changes.
pub const WATCHED: &[Watched] = &[
    Watched { group: "network.openshift.io", resource: "clusternetworks", verbs: &["get", "list", "watch"] },
    Watched { group: "network.openshift.io", resource: "hostsubnets", verbs: &["get", "list", "watch"] },
    Watched { group: "network.openshift.io", resource: "netnamespaces", verbs: &["get", "list", "watch"] },
    Watched { group: "network.openshift.io", resource: "egressnetworkpolicies", verbs: &["get", "list", "watch"] },
    Watched { group: "", resource: "services", verbs: &["get", "list", "watch"] },
    Watched { group: "", resource: "pods", verbs: &["get", "list", "watch"] },
    // The egress-policy label: `network.openshift.io/not-enforcing-egress-network-policy`.
    Watched { group: "", resource: "nodes", verbs: &["get", "patch"] },
];

/// The RBAC rules the daemon needs: (apiGroup, resource, verbs), derived from [`WATCHED`].
pub fn rbac_rules() -> Vec<(String, String, Vec<String>)> {
    WATCHED
        .iter()
        .map(|w| (w.group.to_string(), w.resource.to_string(), w.verbs.iter().map(|v| v.to_string()).collect()))
        .collect()
}

/// Where to find the API server and which node this is.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// A kubeconfig file; `None` = in-cluster configuration.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// This node's name (HostSubnet.host, Pod spec.nodeName).
    pub node: String,
}

/// Starts the watchers (see the module documentation).
pub fn spawn(
    _opts: KubeOptions,
    _telemetry: crate::metrics::Telemetry,
) -> tokio::sync::watch::Receiver<Option<std::sync::Arc<Loaded>>> {
    // Implemented in a follow-up change (kube-rs watchers); until then the source never
    // delivers a state, so the agent leaves the switch alone.
    let (tx, rx) = tokio::sync::watch::channel(None);
    std::mem::forget(tx);
    rx
}
