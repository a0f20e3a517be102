//! Bridge and pod ports, kept equal to the cluster state through OVSDB.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use tracing::{info, warn};

use crate::cluster::{ClusterState, PodKey, Problem};
use crate::model::OfPort;
use crate::ovsdb::{BridgeOptions, Ovs, OvsdbError, PortSpec};

/// A pod port as last set up.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PortState {
    host_veth: String,
    internal: bool,
    ofport: u32,
    bandwidth: (i64, i64),
}

/// The pod ports the agent manages on one bridge.
#[derive(Debug, Default)]
pub struct Ports {
    known: HashMap<PodKey, PortState>,
}

/// The bridge, vxlan0 (ofport 1) and tun0 (ofport 2), as SetupOVS makes them. Idempotent; run
/// after every OVSDB (re)connect.
pub async fn ensure_base(ovs: &Ovs, bridge: &str, datapath_type: &str, timeout: Duration) -> Result<(), OvsdbError> {
    ovs.init().await?;
    let opts = BridgeOptions { datapath_type: datapath_type.to_string(), ..Default::default() };
    ovs.ensure_bridge(bridge, &opts).await?;
    ovs.ensure_port(bridge, "vxlan0", &PortSpec::vxlan_flow(OfPort::VXLAN.0 as i64)).await?;
    // Waiting for tun0's ofport also waits for ovs-vswitchd to have set the bridge up.
    ovs.add_port_and_wait_ofport(bridge, "tun0", &PortSpec::internal(Some(OfPort::TUN.0 as i64)), timeout).await?;
    Ok(())
}

impl Ports {
    /// Sets one pod's port up (adds it, waits for its ofport, sets bandwidth).
    pub async fn ensure_one(
        &mut self,
        ovs: &Ovs,
        bridge: &str,
        p: &crate::cluster::Pod,
        timeout: Duration,
    ) -> Result<u32, OvsdbError> {
        if let Some(old) = self.known.get(&p.key()).filter(|s| s.host_veth != p.host_veth || s.internal != p.internal) {
            let old = old.host_veth.clone();
            ovs.set_pod_bandwidth(&old, -1, -1).await.or_else(ignore_missing)?;
            ovs.delete_port(bridge, &old).await?;
            self.known.remove(&p.key());
        }
        let spec = if p.internal { PortSpec::internal(None) } else { PortSpec::system() };
        let ofport = ovs.add_port_and_wait_ofport(bridge, &p.host_veth, &spec, timeout).await?;
        let bw = (p.ingress_bps, p.egress_bps);
        if self.known.get(&p.key()).is_none_or(|s| s.bandwidth != bw) {
            ovs.set_pod_bandwidth(&p.host_veth, p.ingress_bps, p.egress_bps).await?;
        }
        self.known.insert(
            p.key(),
            PortState { host_veth: p.host_veth.clone(), internal: p.internal, ofport, bandwidth: bw },
        );
        Ok(ofport)
    }

    /// Tears one pod's port down (QoS first, then the port).
    pub async fn remove_one(&mut self, ovs: &Ovs, bridge: &str, key: &PodKey) -> Result<(), OvsdbError> {
        if let Some(s) = self.known.get(key).cloned() {
            ovs.set_pod_bandwidth(&s.host_veth, -1, -1).await.or_else(ignore_missing)?;
            ovs.delete_port(bridge, &s.host_veth).await?;
            self.known.remove(key);
        }
        Ok(())
    }

    /// The ofports of the pods whose port is up.
    pub fn ofports(&self) -> HashMap<PodKey, OfPort> {
        self.known.iter().map(|(k, p)| (k.clone(), OfPort(p.ofport))).collect()
    }

    /// Corrects the pods' ofports from the switch's own port list (name, number), as read over
    /// a new OpenFlow connection. A restarted ovs-vswitchd numbers the ports afresh: a port
    /// added while it was down can take the number another port had, which then gets a new
    /// one, and the database may show the old numbers for a moment. A pod whose port the
    /// switch does not have is forgotten, so the next reconcile adds it again and waits for its
    /// ofport. Returns how many pods changed or were forgotten.
    pub fn refresh_ofports(&mut self, switch_ports: &[(String, u32)]) -> usize {
        let by_name: HashMap<&str, u32> = switch_ports.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let mut changed = 0;
        self.known.retain(|k, s| match by_name.get(s.host_veth.as_str()) {
            Some(&p) if p == s.ofport => true,
            Some(&p) => {
                info!(
                    pod = %format!("{}/{}", k.0, k.1), port = %s.host_veth, from = s.ofport, to = p,
                    "the switch renumbered a pod's port"
                );
                s.ofport = p;
                changed += 1;
                true
            }
            None => {
                changed += 1;
                false
            }
        });
        changed
    }

    /// Makes the bridge's pod ports match `state`: adds the missing ones (waiting for their
    /// ofports), sets bandwidth where it changed, removes ports of pods that are gone. With
    /// `verify_all` (after an OVSDB reconnect) every port is checked again. A pod whose port
    /// fails is reported and has no ofport; an OVSDB failure is returned (nothing is forgotten).
    pub async fn reconcile(
        &mut self,
        ovs: &Ovs,
        bridge: &str,
        state: &ClusterState,
        timeout: Duration,
        verify_all: bool,
    ) -> Result<Vec<Problem>, OvsdbError> {
        let mut problems = Vec::new();
        let wanted: HashMap<PodKey, &crate::cluster::Pod> = state.pods.iter().map(|p| (p.key(), p)).collect();
        // Pods that are gone, or whose port changed name/type: tear down (QoS first, then port).
        let stale: Vec<PodKey> = self
            .known
            .iter()
            .filter(|(k, s)| wanted.get(*k).is_none_or(|p| p.host_veth != s.host_veth || p.internal != s.internal))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some(s) = self.known.remove(&k) {
                ovs.set_pod_bandwidth(&s.host_veth, -1, -1).await.or_else(ignore_missing)?;
                ovs.delete_port(bridge, &s.host_veth).await?;
                info!(pod = %format!("{}/{}", k.0, k.1), port = %s.host_veth, "pod port removed");
            }
        }
        // Ports on the bridge that nobody wants (e.g. left by a previous run).
        let keep: HashSet<&str> =
            state.pods.iter().map(|p| p.host_veth.as_str()).chain([bridge, "vxlan0", "tun0"]).collect();
        for port in ovs.list_ports(bridge).await? {
            if !keep.contains(port.as_str()) {
                ovs.set_pod_bandwidth(&port, -1, -1).await.or_else(ignore_missing)?;
                ovs.delete_port(bridge, &port).await?;
                info!(%port, "unknown port removed from the bridge");
            }
        }
        // Pods to (re)check: new ones, changed bandwidth, or all after a reconnect.
        let todo: Vec<&crate::cluster::Pod> = state
            .pods
            .iter()
            .filter(|p| {
                verify_all
                    || self.known.get(&p.key()).is_none_or(|s| s.bandwidth != (p.ingress_bps, p.egress_bps))
            })
            .collect();
        let results: Vec<_> = {
            let futs: Vec<_> = todo
                .into_iter()
                .map(|p| async move {
                    let spec = if p.internal { PortSpec::internal(None) } else { PortSpec::system() };
                    let r = async {
                        let ofport = ovs.add_port_and_wait_ofport(bridge, &p.host_veth, &spec, timeout).await?;
                        ovs.set_pod_bandwidth(&p.host_veth, p.ingress_bps, p.egress_bps).await?;
                        Ok::<u32, OvsdbError>(ofport)
                    }
                    .await;
                    (p, r)
                })
                .collect();
            futures::stream::iter(futs).buffer_unordered(16).collect().await
        };
        for (p, r) in results {
            match r {
                Ok(ofport) => {
                    self.known.insert(
                        p.key(),
                        PortState {
                            host_veth: p.host_veth.clone(),
                            internal: p.internal,
                            ofport,
                            bandwidth: (p.ingress_bps, p.egress_bps),
                        },
                    );
                }
                Err(e) if e.is_disconnect() => return Err(e),
                Err(e) => {
                    self.known.remove(&p.key());
                    let pr = Problem::new(format!("pod {}/{}", p.namespace, p.name), "hostVeth", format!("{:?}: {e}", p.host_veth));
                    warn!("rejected: {pr}");
                    problems.push(pr);
                }
            }
        }
        Ok(problems)
    }
}

/// Clearing QoS of a port that is already gone is not an error.
fn ignore_missing(e: OvsdbError) -> Result<(), OvsdbError> {
    match e {
        OvsdbError::NotFound { .. } => Ok(()),
        other => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(ports: &[(&str, &str, u32)]) -> Ports {
        let mut p = Ports::default();
        for (name, veth, ofport) in ports {
            p.known.insert(
                ("ns".to_string(), name.to_string()),
                PortState { host_veth: veth.to_string(), internal: true, ofport: *ofport, bandwidth: (0, 0) },
            );
        }
        p
    }

    /// Regression: after an ovs-vswitchd restart the agent kept the pods' old ofports (it
    /// re-read them only on an OVSDB reconnect) and installed flows for the wrong ports.
    #[test]
    fn ofports_follow_the_switch() {
        let mut p = known(&[("a", "vp1", 3), ("b", "vp2", 4), ("c", "vp3", 5)]);
        let sw: Vec<(String, u32)> =
            [("br0", 0xfffe), ("vp1", 6), ("vp2", 4), ("vn", 3)].iter().map(|(n, p)| (n.to_string(), *p)).collect();
        assert_eq!(p.refresh_ofports(&sw), 2);
        let of = p.ofports();
        assert_eq!(of.get(&("ns".into(), "a".into())), Some(&OfPort(6)), "renumbered");
        assert_eq!(of.get(&("ns".into(), "b".into())), Some(&OfPort(4)), "unchanged");
        assert_eq!(
            of.get(&("ns".into(), "c".into())),
            None,
            "not on the switch: forgotten, re-added by the next reconcile"
        );
        assert_eq!(p.refresh_ofports(&sw), 0);
    }
}
