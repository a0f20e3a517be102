//! What callers ask of [`super::Ovs`] and what they get back.

use std::collections::BTreeMap;

/// Desired configuration of a bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeOptions {
    /// `secure` or `standalone`; `None` leaves it unset (OVS default: standalone).
    pub fail_mode: Option<String>,
    /// e.g. `["OpenFlow13"]`.
    pub protocols: Vec<String>,
    /// `""`/`"system"` (kernel), `"netdev"` (userspace) or `"dummy"` (tests).
    pub datapath_type: String,
}

impl Default for BridgeOptions {
    /// What openshift-sdn uses: `fail-mode=secure protocols=OpenFlow13`.
    fn default() -> Self {
        BridgeOptions {
            fail_mode: Some("secure".into()),
            protocols: vec!["OpenFlow13".into()],
            datapath_type: String::new(),
        }
    }
}

/// Desired configuration of a port (and its single interface of the same name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSpec {
    pub ofport_request: Option<i64>,
    /// Interface type: `""` (system device), `"internal"`, `"vxlan"`, `"dummy"`...
    pub iface_type: String,
    /// Interface options, e.g. `remote_ip=flow`, `key=flow`.
    pub options: BTreeMap<String, String>,
    /// The Port's `external_ids`, written with the port when [`super::Ovs::add_port_fast`] creates it.
    pub external_ids: BTreeMap<String, String>,
    /// The Interface's `mac` (`xx:xx:xx:xx:xx:xx`); `None` leaves the column as it is.
    pub mac: Option<String>,
    /// A port of this name on another bridge is moved onto this one; otherwise
    /// [`super::Ovs::ensure_port`] refuses it ([`crate::OvsdbError::OnOtherBridge`]) and changes nothing.
    pub take_from_other_bridge: bool,
}

impl PortSpec {
    /// `vxlan0`: `type=vxlan options:remote_ip=flow options:key=flow`.
    pub fn vxlan_flow(ofport_request: i64) -> Self {
        PortSpec {
            ofport_request: Some(ofport_request),
            iface_type: "vxlan".into(),
            options: [("remote_ip", "flow"), ("key", "flow")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    /// `tun0`: `type=internal`.
    pub fn internal(ofport_request: Option<i64>) -> Self {
        PortSpec {
            ofport_request,
            iface_type: "internal".into(),
            ..Default::default()
        }
    }

    /// An existing network device (e.g. a pod's host-side veth).
    pub fn system() -> Self {
        PortSpec::default()
    }

    /// Any interface type without options.
    pub fn of_type(iface_type: &str) -> Self {
        PortSpec {
            iface_type: iface_type.into(),
            ..Default::default()
        }
    }
}

/// A bridge as [`super::Ovs::bridges`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeInfo {
    pub name: String,
    /// `Bridge.datapath_type` as stored (empty means system).
    pub datapath_type: String,
    /// Its ports' names, sorted (its own port included).
    pub ports: Vec<String>,
}

/// What an `ensure_*` call had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    Created,
    Updated,
    Unchanged,
}
