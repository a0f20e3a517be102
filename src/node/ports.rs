//! Port I/O through OVSDB: the bridge with its base ports, and one pod's port. No state here:
//! what the ports should be comes from the model; what they are is written back to it.
//!
//! Operations on one port name are serialised by [`PortLocks`], so that a reconciler removing a
//! leftover port and a request setting up a pod with the same port name cannot interleave.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::cluster::Pod;
use crate::domain::OfPort;
use crate::options::DatapathType;
use crate::ovsdb::{BridgeInfo, BridgeOptions, Ovs, OvsdbError, PortSpec};

/// Bridge `external_ids` key holding the flow generation written into cookies.
pub const GENERATION_KEY: &str = "sdn-node-generation";

/// The Port `external_ids` key that marks a spare (not yet any pod's).
pub const SPARE_KEY: &str = "sdn-node-spare";

/// What the base ports depend on in the cluster's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseSpec {
    /// vxlan0's UDP port.
    pub vxlan_port: u16,
    /// tun0's MAC, when the flows address tun0 by MAC (networkpolicy: see
    /// src/pipeline/via_host.rs); otherwise Open vSwitch's choice is left alone.
    pub tun_mac: Option<openflow::MacAddr>,
}

impl Default for BaseSpec {
    fn default() -> Self {
        BaseSpec { vxlan_port: 4789, tun_mac: None }
    }
}

/// What the agent may do to a bridge and ports it finds already there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Takeover {
    /// The datapath type wanted; `None`: an existing bridge's own, `system` for a new one.
    pub datapath: Option<String>,
    /// An existing bridge of another datapath type is changed to `datapath` (else refused).
    pub change_datapath: bool,
    /// Ports the agent needs found on another bridge are moved onto its own (else refused).
    pub take_ports: bool,
    /// The pods' ports the agent is about to set up (checked with tun0 and vxlan0).
    pub pod_ports: Vec<String>,
}

/// Why the base was not set up.
#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error(transparent)]
    Ovsdb(#[from] OvsdbError),
    /// What exists contradicts the configuration; nothing was written.
    #[error("{0}")]
    Refused(String),
}

/// Checks, before any write, that setting the base up on `bridge` takes no port from another
/// bridge and changes no existing bridge's datapath type unless `t` allows it. Returns the
/// datapath type the bridge has or gets. `recorded` are the ports carrying a pod record (a
/// previous run's pods, recovered onto this bridge next).
pub fn check_takeover(
    bridges: &[BridgeInfo],
    bridge: &str,
    t: &Takeover,
    recorded: &[String],
) -> Result<String, String> {
    let ours = bridges.iter().find(|b| b.name == bridge);
    let datapath = match (ours, &t.datapath) {
        (None, want) => want.clone().unwrap_or_else(|| DatapathType::System.as_str().to_string()),
        (Some(b), None) => b.datapath_type.clone(),
        (Some(b), Some(want)) if DatapathType::same(&b.datapath_type, want) => b.datapath_type.clone(),
        (Some(_), Some(want)) if t.change_datapath => want.clone(),
        (Some(b), Some(want)) => {
            let have = if b.datapath_type.is_empty() { "system" } else { b.datapath_type.as_str() };
            return Err(format!(
                "bridge {bridge} has datapath type {have}, not {want}: leave --datapath-type out to keep {have}, \
                 or pass --change-datapath-type to change it (its ports move to the {want} datapath)"
            ));
        }
    };
    if t.take_ports {
        return Ok(datapath);
    }
    let mut needed: Vec<&str> = vec!["tun0", "vxlan0"];
    needed.extend(t.pod_ports.iter().map(String::as_str));
    needed.extend(recorded.iter().map(String::as_str));
    let mut elsewhere: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for b in bridges.iter().filter(|b| b.name != bridge) {
        for p in needed.iter().filter(|p| b.ports.iter().any(|q| q == *p)) {
            elsewhere.entry(b.name.as_str()).or_default().insert(p);
        }
    }
    if elsewhere.is_empty() {
        return Ok(datapath);
    }
    // The bridge that holds most of them is the one meant, most likely.
    let likely = elsewhere.iter().max_by_key(|(_, ps)| ps.len()).map(|(b, _)| *b).unwrap_or_default();
    let on: Vec<String> = elsewhere
        .iter()
        .map(|(b, ps)| {
            let list = ps.iter().copied().collect::<Vec<_>>().join(", ");
            if ps.len() == 1 {
                format!("port {list} is on bridge {b}")
            } else {
                format!("ports {list} are on bridge {b}")
            }
        })
        .collect();
    Err(format!(
        "{}, not {bridge}: did you mean --bridge {likely}? (or pass --take-ports-from-other-bridges to move them onto {bridge})",
        on.join("; ")
    ))
}

/// The bridge, vxlan0 (ofport 1, VXLAN to `vxlan_port`) and tun0 (ofport 2), as SetupOVS makes
/// them, after [`check_takeover`] (nothing is written if it refuses). Idempotent; run after
/// every OVSDB (re)connect and when `base` changes. Returns the bridge's datapath type.
pub async fn ensure_base(
    ovs: &Ovs,
    bridge: &str,
    takeover: &Takeover,
    base: BaseSpec,
    timeout: Duration,
) -> Result<String, BaseError> {
    let vxlan_port = base.vxlan_port;
    let bridges = ovs.bridges().await?;
    let recorded: Vec<String> = ovs.ports_with_external_id(super::record::POD_KEY).await?.into_iter().map(|(p, _)| p).collect();
    let datapath_type = check_takeover(&bridges, bridge, takeover, &recorded).map_err(BaseError::Refused)?;
    ovs.init().await?;
    let opts = BridgeOptions { datapath_type: datapath_type.clone(), ..Default::default() };
    ovs.ensure_bridge(bridge, &opts).await?;
    let mut vxlan = PortSpec::vxlan_flow(OfPort::VXLAN.0 as i64);
    vxlan.take_from_other_bridge = takeover.take_ports;
    // openshift-sdn sets dst_port only when the cluster's vxlanPort differs from the default.
    if vxlan_port != 4789 {
        vxlan.options.insert("dst_port".into(), vxlan_port.to_string());
    }
    ovs.ensure_port(bridge, "vxlan0", &vxlan).await?;
    // Waiting for tun0's ofport also waits for ovs-vswitchd to have set the bridge up.
    let mut tun = PortSpec::internal(Some(OfPort::TUN.0 as i64));
    tun.mac = base.tun_mac.map(|m| m.to_string());
    tun.take_from_other_bridge = takeover.take_ports;
    ovs.add_port_and_wait_ofport(bridge, "tun0", &tun, timeout).await?;
    Ok(datapath_type)
}

/// Adds a pod's port, waits for its ofport, sets its bandwidth and (if given) records the pod
/// on the port (`external_ids`), so a restarted agent knows it again.
pub async fn add_pod_port(
    ovs: &Ovs,
    bridge: &str,
    pod: &Pod,
    record: Option<(&str, &str)>,
    timeout: Duration,
    take_from_other_bridge: bool,
) -> Result<u32, OvsdbError> {
    let mut spec = if pod.internal { PortSpec::internal(None) } else { PortSpec::system() };
    spec.take_from_other_bridge = take_from_other_bridge;
    if let Some((key, value)) = record {
        spec.external_ids.insert(key.to_string(), value.to_string());
    }
    // Port and record in one transaction: they exist together or not at all.
    let (ofport, created) = ovs.add_port_fast(bridge, &pod.host_veth, &spec, timeout).await?;
    // A port created just now has no QoS: only a limit needs a transaction.
    if !created || pod.ingress_bps > 0 || pod.egress_bps > 0 {
        ovs.set_pod_bandwidth(&pod.host_veth, pod.ingress_bps, pod.egress_bps).await?;
    }
    Ok(ofport)
}

/// A warm port ([`super::spares`]) becomes `pod`'s: its spare mark gives way to the pod's
/// record in one transaction (which fails if the port is gone), then bandwidth if the pod has
/// limits. Returns the spare's ofport.
pub async fn claim_spare_port(ovs: &Ovs, pod: &Pod, record: (&str, &str), ofport: u32) -> Result<u32, OvsdbError> {
    ovs.replace_port_external_id(&pod.host_veth, SPARE_KEY, record.0, record.1).await?;
    if pod.ingress_bps > 0 || pod.egress_bps > 0 {
        ovs.set_pod_bandwidth(&pod.host_veth, pod.ingress_bps, pod.egress_bps).await?;
    }
    Ok(ofport)
}

/// TearDownPod's OVSDB part: the port's QoS and the port, in one (group) transaction when the
/// connection's monitor knows the port ([`Ovs::remove_port_fast`]). A port already gone is fine.
pub async fn remove_port(ovs: &Ovs, bridge: &str, name: &str) -> Result<(), OvsdbError> {
    ovs.remove_port_fast(bridge, name).await?;
    Ok(())
}

/// One async lock per port name.
#[derive(Clone, Default)]
pub struct PortLocks {
    locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl PortLocks {
    pub async fn lock(&self, name: &str) -> OwnedMutexGuard<()> {
        let m = {
            let mut map = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            // Forget locks nobody holds (the map would otherwise grow with every pod ever seen).
            if map.len() > 1024 {
                map.retain(|_, l| Arc::strong_count(l) > 1);
            }
            map.entry(name.to_string()).or_default().clone()
        };
        m.lock_owned().await
    }
}
