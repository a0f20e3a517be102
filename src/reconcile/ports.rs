//! Port I/O through OVSDB: the bridge with its base ports, and one pod's port. No state here:
//! what the ports should be comes from the model; what they are is written back to it.
//!
//! Operations on one port name are serialised by [`PortLocks`], so that a reconciler removing a
//! leftover port and a request setting up a pod with the same port name cannot interleave.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

use crate::cluster::Pod;
use crate::model::OfPort;
use crate::ovsdb::{BridgeOptions, Ovs, OvsdbError, PortSpec};

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

/// The bridge, vxlan0 (ofport 1, VXLAN to `vxlan_port`) and tun0 (ofport 2), as SetupOVS makes
/// them. Idempotent; run after every OVSDB (re)connect and when `base` changes.
pub async fn ensure_base(ovs: &Ovs, bridge: &str, datapath_type: &str, base: BaseSpec, timeout: Duration) -> Result<(), OvsdbError> {
    let vxlan_port = base.vxlan_port;
    ovs.init().await?;
    let opts = BridgeOptions { datapath_type: datapath_type.to_string(), ..Default::default() };
    ovs.ensure_bridge(bridge, &opts).await?;
    let mut vxlan = PortSpec::vxlan_flow(OfPort::VXLAN.0 as i64);
    // openshift-sdn sets dst_port only when the cluster's vxlanPort differs from the default.
    if vxlan_port != 4789 {
        vxlan.options.insert("dst_port".into(), vxlan_port.to_string());
    }
    ovs.ensure_port(bridge, "vxlan0", &vxlan).await?;
    // Waiting for tun0's ofport also waits for ovs-vswitchd to have set the bridge up.
    let mut tun = PortSpec::internal(Some(OfPort::TUN.0 as i64));
    tun.mac = base.tun_mac.map(|m| m.to_string());
    ovs.add_port_and_wait_ofport(bridge, "tun0", &tun, timeout).await?;
    Ok(())
}

/// Adds a pod's port, waits for its ofport, sets its bandwidth and (if given) records the pod
/// on the port (`external_ids`), so a restarted agent knows it again.
pub async fn add_pod_port(
    ovs: &Ovs,
    bridge: &str,
    pod: &Pod,
    record: Option<(&str, &str)>,
    timeout: Duration,
) -> Result<u32, OvsdbError> {
    let mut spec = if pod.internal { PortSpec::internal(None) } else { PortSpec::system() };
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
