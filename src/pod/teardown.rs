//! Pod teardown: the pod leaves the model (its flows leave the desired state at once, whatever
//! the switch does) and stays *doomed* until its flows are off the switch and its port is
//! gone; until then the request answers 503/504 and a retry finishes the job. A failed setup
//! that got as far as the model is undone the same way.


use tokio::time::{timeout_at, Instant};
use tracing::{info, warn};

use crate::node::record::PodRecord;
use super::error::{committed, engine_error, ovsdb_error};
use super::{PodError, Pods};
use crate::node::ports;
use crate::cluster::{Pod, Problem};
use crate::engine::OnFailure;

/// How long an undo may take once the request's own deadline has passed.
pub(super) const UNDO_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The lock name of a sandbox (network namespace path) in [`crate::node::ports::PortLocks`]: held
/// while a DEL's interface of that sandbox is being deleted. Not a valid interface name, so it
/// never collides with a port's.
pub(super) fn sandbox_lock(netns: &str) -> String {
    format!("sandbox:{netns}")
}

/// Deletes the veth the agent made for a CNI pod, as its record says: the host end by name,
/// only if it is still the interface of the recorded ifindex (an interface that took the
/// name since is someone else's and stays). Idempotent; within the undo grace period. A
/// record without `cni` (the pod's interface is not the agent's) deletes nothing.
pub async fn remove_pod_iface(req: &PodRecord) -> Result<(), String> {
    let Some(cni) = &req.cni else { return Ok(()) };
    let host = hostnet::Netns::current().map_err(|e| e.to_string())?;
    match tokio::time::timeout(UNDO_GRACE * 5, hostnet::delete_owned(&host, &req.host_veth, cni.host_ifindex)).await {
        Ok(Ok(hostnet::Deleted::NotOurs { index })) => {
            warn!(veth = %req.host_veth, index, recorded = ?cni.host_ifindex, pod = %format!("{}/{}", req.namespace, req.name), "the pod's interface name is another interface's now; left alone");
            Ok(())
        }
        Ok(r) => r.map(|_| ()).map_err(|e| e.to_string()),
        Err(_) => Err(format!("deleting {} took too long", req.host_veth)),
    }
}

/// Removes a failed setup's port within a short grace period; if OVSDB does not answer, the
/// reconcile loop removes it later (the model does not want it).
pub(super) async fn undo_port(pods: &Pods, pod: &Pod) {
    let Some(ovs) = pods.conns.ovs() else {
        pods.kick.kick();
        return;
    };
    match tokio::time::timeout(UNDO_GRACE, ports::remove_port(&ovs, pods.cfg.bridge.name(), &pod.host_veth)).await {
        Ok(Ok(())) => {}
        _ => {
            warn!(port = %pod.host_veth, "could not remove a failed setup's port now; the reconcile loop will");
            pods.kick.kick();
        }
    }
}

/// Tears a pod set up through the API down; see the module documentation.
pub async fn teardown(pods: &Pods, namespace: String, name: String, deadline: Instant) -> Result<(), PodError> {
    let key = (namespace, name);
    {
        let mut m = pods.state.lock();
        if m.tear_down(&key).is_none() && m.doomed(&key).is_none() {
            let obj = format!("pod {}/{}", key.0, key.1);
            return Err(if m.is_reserved(&key) {
                PodError::Conflict(Problem::new(obj, "name", "a setup of this pod is in progress"))
            } else if m.in_source(&key) {
                PodError::Conflict(Problem::new(obj, "name", "the pod comes from the cluster state, not from the pod API"))
            } else {
                PodError::NotFound(format!("{obj} was not set up through the pod API"))
            });
        }
    }
    finish_teardown(pods, &key, deadline).await?;
    super::durable::forgotten(pods, &key, deadline).await
}

/// Takes a doomed pod's flows off the switch, then its port off the bridge, then (CNI pods,
/// right after, in the background) its veth off the host; buries the pod when the flows and
/// the port are confirmed gone, otherwise it stays
/// doomed and a retry finishes the job. In this order on purpose, one after the other: the
/// switch commits the flow deletions in a few milliseconds while ovs-vswitchd is idle, but
/// tens of times slower while it reconfigures the bridge after a port removal or reacts to a
/// veth vanishing under one of its ports (measured with `sdn-bench pods`: overlapping the
/// three made DEL slower, not faster). The port removal answers as soon as ovsdb-server has
/// committed it, and the kernel's veth deletion then overlaps ovs-vswitchd's reconfiguration.
pub(super) async fn finish_teardown(pods: &Pods, key: &crate::cluster::PodKey, deadline: Instant) -> Result<(), PodError> {
    let Some((pod, req)) = pods.state.lock().doomed(key).cloned() else { return Ok(()) };
    // Flows: the pod's owner is empty in the model now; its VNID's flows are recomputed.
    let queued = {
        let m = pods.state.lock();
        match pods.conns.engine() {
            Some(engine) => engine.submit_update(m.pod_update(&pod), OnFailure::Keep).map_err(engine_error),
            None => Err(PodError::NotReady("the switch is not connected".into())),
        }
    };
    let flows = match queued {
        Ok(rx) => committed(rx, deadline).await,
        Err(e) => Err(e),
    };
    // The port, whatever became of the flows (it carries no flows any more).
    let port = match pods.conns.ovs() {
        None => Err(PodError::NotReady("ovsdb-server is not connected".into())),
        Some(ovs) => match timeout_at(deadline, pods.locks.lock(&pod.host_veth)).await {
            Err(_) => Err(PodError::Deadline(format!("port {:?} stayed busy", pod.host_veth))),
            Ok(_g) => match timeout_at(deadline, ports::remove_port(&ovs, pods.cfg.bridge.name(), &pod.host_veth)).await {
                Err(_) => Err(PodError::Deadline("ovsdb-server did not remove the port in time".into())),
                Ok(r) => r.map_err(|e| ovsdb_error(&pod, e)),
            },
        },
    };
    // The interface the agent created for a CNI pod: deleted right after the answer, in the
    // background, under its name's lock (an ADD that would reuse the name waits for it). The
    // kernel spends ~20 ms deleting a veth (an RCU barrier), and the pod is already cut off —
    // no port, no flows — so the answer does not wait for it; a runtime deleting the sandbox
    // next has the kernel do the same asynchronously anyway. A failure is logged, and the
    // name's next DEL or ADD finds the interface.
    if let Some(cni) = &req.cni {
        let guard = pods.locks.lock(&pod.host_veth).await;
        // And the sandbox's: a new ADD into the same sandbox would find the old interface.
        let sandbox = pods.locks.lock(&sandbox_lock(&cni.netns)).await;
        let made = req.clone();
        tokio::spawn(async move {
            let _g = (guard, sandbox);
            if let Err(e) = remove_pod_iface(&made).await {
                warn!(veth = %made.host_veth, error = %e, "could not delete a torn-down pod's interface");
            }
        });
    }
    match flows.and(port) {
        Ok(()) => {
            pods.state.lock().buried(key);
            info!(pod = %format!("{}/{}", key.0, key.1), "pod torn down");
            Ok(())
        }
        Err(e) => {
            // Left to the reconcile loop: not converged until its pass is done. (On success the
            // switch and OVSDB hold the model again, as they did before the request.)
            pods.telemetry.not_converged();
            pods.kick.kick();
            Err(e)
        }
    }
}
