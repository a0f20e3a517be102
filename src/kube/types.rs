//! openshift-sdn's API objects (group `network.openshift.io/v1`), as the node reads them.
//!
//! ClusterNetwork, HostSubnet and NetNamespace keep their fields at the top level (no `spec`),
//! so they implement the Kubernetes resource traits by hand ([`resource!`]) rather than through
//! `#[derive(CustomResource)]`. Every field is optional or defaulted: a malformed value is
//! reported by the state file's validation (as a problem naming the object and the field),
//! not by failing the whole list.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The annotation that gives a HostSubnet's node a fixed VNID.
pub const FIXED_VNID_ANNOTATION: &str = "pod.network.openshift.io/fixed-vnid-host";
/// The annotation that enables multicast in a NetNamespace (value `"true"`).
pub const MULTICAST_ANNOTATION: &str = "netnamespace.network.openshift.io/multicast-enabled";

/// Implements `k8s_openapi::Resource`, `ListableResource` and `Metadata` (and through them
/// `kube::Resource`) for a `network.openshift.io/v1` type with a `metadata: ObjectMeta` field.
macro_rules! resource {
    ($ty:ident, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = "network.openshift.io/v1";
            const GROUP: &'static str = "network.openshift.io";
            const KIND: &'static str = $kind;
            const VERSION: &'static str = "v1";
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }
        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }
        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// The cluster's network configuration (the object named `default`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The legacy single cluster network CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostsubnetlength: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_networks: Vec<ClusterNetworkEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan_port: Option<Value>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ClusterNetworkEntry {
    #[serde(default, rename = "CIDR")]
    pub cidr: String,
    #[serde(default, rename = "hostSubnetLength", skip_serializing_if = "Option::is_none")]
    pub host_subnet_length: Option<Value>,
}

/// A node's pod subnet.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct HostSubnet {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub host: String,
    #[serde(default, rename = "hostIP")]
    pub host_ip: String,
    #[serde(default)]
    pub subnet: String,
}

/// A namespace's VNID.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct NetNamespace {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub netname: String,
    /// A number in a valid object; kept as JSON so that a bad value is a problem of this object.
    #[serde(default)]
    pub netid: Value,
}

/// A namespace's egress firewall.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct EgressNetworkPolicy {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: EgressNetworkPolicySpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct EgressNetworkPolicySpec {
    #[serde(default)]
    pub egress: Vec<EgressNetworkPolicyRule>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct EgressNetworkPolicyRule {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub to: EgressNetworkPolicyPeer,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EgressNetworkPolicyPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr_selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_name: Option<String>,
}

resource!(ClusterNetwork, "ClusterNetwork", "clusternetworks", k8s_openapi::ClusterResourceScope);
resource!(HostSubnet, "HostSubnet", "hostsubnets", k8s_openapi::ClusterResourceScope);
resource!(NetNamespace, "NetNamespace", "netnamespaces", k8s_openapi::ClusterResourceScope);
resource!(EgressNetworkPolicy, "EgressNetworkPolicy", "egressnetworkpolicies", k8s_openapi::NamespaceResourceScope);

/// An object's annotations (empty if it has none).
pub(crate) fn annotations(meta: &ObjectMeta) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    meta.annotations.as_ref().unwrap_or(&EMPTY)
}
