//! The Kubernetes source: kube-rs watchers for openshift-sdn's objects. Each event's object is
//! converted to the model once ([`mapping`], through the state file's per-object validators:
//! one rule set), kept in per-kind maps of converted objects (no reflector caches; every pod is
//! converted at once to the few fields used), and each published state is assembled from
//! those maps and validated across objects as a state file is.
//!
//! CONTRACT (used by `run` and by deploy/ tests):
//! - [`spawn`] starts the watchers and returns a receiver of [`Loaded`] states, published once
//!   every watcher has listed (`InitDone`) and after each change (debounced). `live_pods` is
//!   `Some` (this node's pods) so that pods set up through the pod API but deleted in the
//!   cluster are torn down after a relist. `touched` names the owners whose flows may differ
//!   from the previously published state (`None` after a list, a ClusterNetwork or NetNamespace
//!   change, or a change to this node's HostSubnet). With the networkpolicy plugin a
//!   NetworkPolicy change touches its namespace's NetworkPolicy owner; a pod or
//!   Namespace-label change the owners of the namespaces whose policies can select those pods.
//! - What is watched follows the plugin: NetworkPolicies, Namespaces and every pod only under
//!   the networkpolicy plugin; otherwise this node's pods alone (`spec.nodeName`), so that
//!   subnet and multitenant clusters need not grant those lists. NetworkPolicies of type
//!   Egress get a Warning Event ([`events`]) once per generation.
//! - No state can be built without ClusterNetwork "default" and a valid HostSubnet for this
//!   node: until they exist the source says what it waits for ([`mapping::Unusable`]: `/readyz`
//!   and `sdn-node status` through [`crate::metrics::Health::set_waiting`], a log line and a
//!   Warning Event regarding this Node once per wait) and goes on when they arrive.
//! - Once the node is ready its Node's `NetworkUnavailable` condition is set to False
//!   ([`node_status`]), once per start; never to True.
//! - [`WATCHED`] lists every resource the daemon watches or changes, with the verbs it uses:
//!   the single source for both the watchers and the RBAC rules (deploy/ checks its ClusterRole
//!   against [`rbac_rules`]).

pub mod events;
pub mod mapping;
pub mod node_status;
pub mod types;
pub mod watch;

use crate::cluster::Loaded;

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
    // This node's pods (spec.nodeName); cluster-wide with the networkpolicy plugin.
    Watched { group: "", resource: "pods", verbs: &["get", "list", "watch"] },
    // The networkpolicy plugin only (not watched under the others): policies, namespace labels.
    Watched { group: "networking.k8s.io", resource: "networkpolicies", verbs: &["get", "list", "watch"] },
    Watched { group: "", resource: "namespaces", verbs: &["get", "list", "watch"] },
    // The egress-policy label: `network.openshift.io/not-enforcing-egress-network-policy`.
    Watched { group: "", resource: "nodes", verbs: &["get", "patch"] },
    // This node's NetworkUnavailable condition, set to False once ready ([`node_status`]).
    Watched { group: "", resource: "nodes/status", verbs: &["patch"] },
    // Warning Events on NetworkPolicies with parts this node dropped, and on this Node about
    // what it waits for (kube's Recorder creates events.k8s.io Events and patches their series;
    // core Events are the same objects through the older API).
    Watched { group: "events.k8s.io", resource: "events", verbs: &["create", "patch"] },
    Watched { group: "", resource: "events", verbs: &["create", "patch"] },
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

/// Whether the kubeconfig (or the in-cluster configuration) loads into a client: checked once
/// at start, where a bad one is the operator's to fix (the API server itself is waited for).
pub async fn check_config(opts: &KubeOptions) -> Result<(), String> {
    watch::client(opts).await.map(|_| ())
}

/// Starts the watchers (see the module documentation). Must be called within a Tokio runtime;
/// the watchers stop when the receiver (and its clones) are dropped.
pub fn spawn(
    opts: KubeOptions,
    telemetry: crate::metrics::Telemetry,
) -> tokio::sync::watch::Receiver<Option<std::sync::Arc<Loaded>>> {
    watch::spawn(opts, telemetry)
}

#[cfg(test)]
mod tests {
    use super::watch::Kind;
    use super::*;

    #[test]
    fn every_watched_kind_is_allowed_to_list_and_watch() {
        for k in Kind::ALL {
            let (group, resource) = k.resource();
            let w = WATCHED.iter().find(|w| w.group == group && w.resource == resource);
            let w = w.unwrap_or_else(|| panic!("{k:?} ({group}/{resource}) is watched but not in WATCHED"));
            for v in Kind::VERBS {
                assert!(w.verbs.contains(&v), "{k:?}: verb {v} missing from WATCHED");
            }
        }
        // The egress-policy label is read and patched on this node.
        let nodes = WATCHED.iter().find(|w| w.group.is_empty() && w.resource == "nodes").unwrap();
        assert!(nodes.verbs.contains(&"get") && nodes.verbs.contains(&"patch"));
    }

    #[test]
    fn the_types_use_the_openshift_urls() {
        use kube::Resource;
        assert_eq!(types::ClusterNetwork::url_path(&(), None), "/apis/network.openshift.io/v1/clusternetworks");
        assert_eq!(types::HostSubnet::url_path(&(), None), "/apis/network.openshift.io/v1/hostsubnets");
        assert_eq!(types::NetNamespace::url_path(&(), None), "/apis/network.openshift.io/v1/netnamespaces");
        assert_eq!(
            types::EgressNetworkPolicy::url_path(&(), Some("ns")),
            "/apis/network.openshift.io/v1/namespaces/ns/egressnetworkpolicies"
        );
        for k in Kind::ALL {
            let (group, resource) = k.resource();
            let w = WATCHED.iter().find(|w| w.group == group && w.resource == resource).unwrap();
            assert!(w.verbs.contains(&"list"));
        }
    }
}
