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

/// The annotation that gives a HostSubnet's node a fixed VNID.
pub const FIXED_VNID_ANNOTATION: &str = "pod.network.openshift.io/fixed-vnid-host";
/// The annotation that enables multicast in a NetNamespace (value `"true"`).
pub const MULTICAST_ANNOTATION: &str = "netnamespace.network.openshift.io/multicast-enabled";

/// Dual-stack: the IPv6 side of openshift-sdn's objects travels in annotations, because their
/// IPv4-only fields cannot hold it without breaking openshift-sdn's own agents: their
/// `ValidateClusterNetwork` (github.com/openshift/sdn, pkg/network/common/validation.go) runs
/// `validateCIDRv4` on every `clusterNetworks[i].CIDR` and on `serviceNetwork`, and
/// `ValidateHostSubnet` on `subnet`, so a second, IPv6 `clusterNetworks` entry would make the
/// whole ClusterNetwork invalid to them ("must be an IPv4 network"). Annotations they ignore.
///
/// On a HostSubnet: the node's IPv6 pod subnet (an IPv6 CIDR, e.g. `fd00:10:128:1::/64`).
pub const SUBNET_IPV6_ANNOTATION: &str = "sdn-node.openshift.io/subnet-ipv6";
/// On ClusterNetwork "default": the IPv6 cluster network (an IPv6 CIDR); with
/// [`SERVICE_NETWORK_IPV6_ANNOTATION`], or neither (IPv4 only).
pub const CLUSTER_NETWORK_IPV6_ANNOTATION: &str = "sdn-node.openshift.io/cluster-network-ipv6";
/// On ClusterNetwork "default": the IPv6 service network (an IPv6 CIDR).
pub const SERVICE_NETWORK_IPV6_ANNOTATION: &str = "sdn-node.openshift.io/service-network-ipv6";
/// On ClusterNetwork "default": host bits of a node's IPv6 subnet (a decimal number; written by
/// `sdn-node controller` so that a restart with another value is caught; agents do not need it).
pub const HOST_SUBNET_LENGTH_IPV6_ANNOTATION: &str = "sdn-node.openshift.io/host-subnet-length-ipv6";

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
    /// The legacy host bits of a node's subnet (with `network`).
    #[serde(default, rename = "hostsubnetlength", skip_serializing_if = "Option::is_none")]
    pub host_subnet_length: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan_port: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_networks: Vec<ClusterNetworkEntry>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ClusterNetworkEntry {
    #[serde(default, rename = "CIDR")]
    pub cidr: String,
    /// Host bits of a node's subnet out of this network.
    #[serde(default, rename = "hostSubnetLength", skip_serializing_if = "Option::is_none")]
    pub host_subnet_length: Option<i64>,
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
    /// A number in a valid object; read leniently so that a bad value is a problem of this
    /// object, not a failure of the whole list.
    #[serde(default)]
    pub netid: Number,
}

/// A field that should hold an unsigned integer: the number, or a description of the value
/// that is not one (`invalid type: string "x", expected u64`). Never fails to decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Number(pub Result<u64, String>);

impl Default for Number {
    fn default() -> Number {
        Number(Err("missing field, expected u64".into()))
    }
}

impl From<u64> for Number {
    fn from(n: u64) -> Number {
        Number(Ok(n))
    }
}

impl Serialize for Number {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Ok(n) => s.serialize_u64(*n),
            Err(_) => s.serialize_none(),
        }
    }
}

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Number, D::Error> {
        struct V;
        fn bad(what: std::fmt::Arguments<'_>) -> Number {
            Number(Err(format!("invalid type: {what}, expected u64")))
        }
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Number;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Number, E> {
                Ok(Number(Ok(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Number, E> {
                Ok(u64::try_from(v).map(|n| Number(Ok(n))).unwrap_or_else(|_| Number(Err(format!("invalid value: integer `{v}`, expected u64")))))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Number, E> {
                Ok(bad(format_args!("floating point `{v}`")))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Number, E> {
                Ok(bad(format_args!("boolean `{v}`")))
            }
            fn visit_str<E>(self, v: &str) -> Result<Number, E> {
                Ok(bad(format_args!("string {v:?}")))
            }
            fn visit_unit<E>(self) -> Result<Number, E> {
                Ok(bad(format_args!("null")))
            }
            fn visit_none<E>(self) -> Result<Number, E> {
                Ok(bad(format_args!("null")))
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Number, D::Error> {
                d.deserialize_any(V)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Number, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(bad(format_args!("sequence")))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Number, A::Error> {
                while a.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(bad(format_args!("map")))
            }
        }
        d.deserialize_any(V)
    }
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

/// The kinds the daemon watches, in readiness-slot order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ClusterNetwork,
    HostSubnet,
    NetNamespace,
    EgressNetworkPolicy,
    Service,
    Pod,
    NetworkPolicy,
    Namespace,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::ClusterNetwork,
        Kind::HostSubnet,
        Kind::NetNamespace,
        Kind::EgressNetworkPolicy,
        Kind::Service,
        Kind::Pod,
        Kind::NetworkPolicy,
        Kind::Namespace,
    ];

    /// (API group, plural resource): the [`super::WATCHED`] entry that allows watching it.
    pub fn resource(self) -> (&'static str, &'static str) {
        match self {
            Kind::ClusterNetwork => ("network.openshift.io", "clusternetworks"),
            Kind::HostSubnet => ("network.openshift.io", "hostsubnets"),
            Kind::NetNamespace => ("network.openshift.io", "netnamespaces"),
            Kind::EgressNetworkPolicy => ("network.openshift.io", "egressnetworkpolicies"),
            Kind::Service => ("", "services"),
            Kind::Pod => ("", "pods"),
            Kind::NetworkPolicy => ("networking.k8s.io", "networkpolicies"),
            Kind::Namespace => ("", "namespaces"),
        }
    }

    /// The kind's slot in [`Kind::ALL`].
    pub fn slot(self) -> usize {
        self as usize
    }

    /// The verbs a watcher uses.
    pub const VERBS: [&'static str; 2] = ["list", "watch"];
}
