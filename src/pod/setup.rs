//! Pod setup requests: each runs on its own task, concurrently with the others and with the
//! reconcile loop, under one deadline, and answers only when its result is in OVSDB and on the
//! switch — or fails with nothing of it left in the model, the engine's desired state or
//! OVSDB.
//!
//! A setup is a sequence of steps, each recorded in an [`Undo`] as it is taken, and one
//! failure path ([`Undo::finish`]): reserve (name, IP, port in the model: concurrent requests
//! cannot conflict) → (CNI: the pod's interface, [`super::cni`]) → port, ofport, bandwidth and
//! the pod's record in OVSDB → the pod joins the model and its flows are queued to the engine
//! in the same critical section → committed → recorded in the checkpoint. A failure after the
//! flows were queued tears the pod down the same way a delete does ([`super::teardown`]); before
//! that, the port, the interface and the reservation are undone in that order. If OVSDB cannot
//! be reached for the undo, the port (which has no flows) is left to the reconcile loop, which
//! removes every port the model does not want as soon as OVSDB answers again.


use tokio::time::{timeout_at, Instant};

use crate::node::record::PodRecord;
use super::error::{committed, engine_error, ovsdb_error};
use super::undo::{Step, Undo};
use super::{PodError, Pods};
use crate::node::ports;
use crate::node::record::POD_KEY;
use crate::cluster::{Pod, Problem};
use crate::engine::OnFailure;
use crate::node::faults::FaultPoint;

/// Sets a pod up; see the module documentation. Answers the pod's ofport.
pub async fn setup(pods: &Pods, req: PodRecord, deadline: Instant) -> Result<u32, PodError> {
    let pod = req.to_pod().map_err(PodError::Invalid)?;
    super::hostport::check(&pod).await?;
    ready(pods)?;
    if pods.spares.owns(&pod.host_veth) {
        let obj = format!("pod {}/{}", pod.namespace, pod.name);
        return Err(PodError::Conflict(Problem::new(obj, "hostVeth", format!("{:?} is one of the agent's warm ports", pod.host_veth))));
    }
    let mut undo = Undo::new(pods, pod.key());
    let r = async {
        pods.state.lock().reserve(&pod)?;
        undo.done(Step::Reserved);
        let ofport = port_and_flows(pods, pod.clone(), req, deadline, None, &mut undo).await?;
        recorded(pods, &pod.key(), deadline).await?;
        Ok(ofport)
    }
    .await;
    undo.finish(r).await
}

/// OVSDB and the switch are there (else 503 before anything is reserved).
pub(super) fn ready(pods: &Pods) -> Result<(), PodError> {
    if pods.conns.ovs().is_none() {
        return Err(PodError::NotReady("ovsdb-server is not connected".into()));
    }
    if pods.conns.engine_ready().is_none() {
        return Err(PodError::NotReady("the switch is not connected or not synced yet".into()));
    }
    Ok(())
}

/// The last step of a setup: the pod is durable (in the agent's checkpoint) before its request
/// is answered.
pub(super) async fn recorded(pods: &Pods, key: &crate::cluster::PodKey, deadline: Instant) -> Result<(), PodError> {
    let written = match pods.faults.hit(FaultPoint::Checkpoint) {
        Err(injected) => Err(injected),
        Ok(()) => super::durable::persist_pod(pods, key, deadline).await.map_err(|e| e.to_string()),
    };
    written.map_err(|e| PodError::Failed(format!("pod {}/{}: not set up: {e}", key.0, key.1)))
}

/// The steps of a setup after the pod is reserved in the model: port (a new one, or the warm
/// port with ofport `spare` the pod's interface came from) with the pod's record, then the
/// pod into the model with its flows, committed. Each step is recorded in `undo` as it is
/// taken; the caller undoes them on failure ([`Undo::finish`]).
pub(super) async fn port_and_flows<'a>(
    pods: &'a Pods,
    pod: Pod,
    req: PodRecord,
    deadline: Instant,
    spare: Option<u32>,
    undo: &mut Undo<'a>,
) -> Result<u32, PodError> {
    let key = pod.key();
    let Some(ovs) = pods.conns.ovs() else { return Err(PodError::NotReady("ovsdb-server is not connected".into())) };
    let Ok(guard) = timeout_at(deadline, pods.locks.lock(&pod.host_veth)).await else {
        return Err(PodError::Deadline(format!("port {:?} stayed busy", pod.host_veth)));
    };
    let record = req.to_json();
    let t_port = Instant::now();
    // A failed or timed-out add may have made the port.
    undo.done(Step::Port(pod.clone()));
    let added = match spare {
        None => {
            let r = timeout_at(deadline, ports::add_pod_port(&ovs, pods.cfg.bridge.name(), &pod, Some((POD_KEY, &record)), pods.cfg.bridge.port_timeout, pods.cfg.bridge.take_ports_from_other_bridges)).await;
            if matches!(r, Ok(Ok(_))) {
                pods.spares.port_added(t_port.elapsed());
            }
            r
        }
        Some(ofport) => timeout_at(deadline, ports::claim_spare_port(&ovs, &pod, (POD_KEY, &record), ofport)).await,
    };
    let port_ms = t_port.elapsed().as_secs_f64() * 1e3;
    let ofport = match added {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return Err(ovsdb_error(&pod, e)),
        Err(_) => return Err(PodError::Deadline("ovsdb-server did not set the port up in time".into())),
    };
    pods.faults.hit(FaultPoint::Ovsdb).map_err(PodError::Failed)?;
    // Into the model and, in the same critical section, to the engine: the engine then applies
    // this pod's flows after any replacement computed before it, never before.
    let queued = {
        let mut m = pods.state.lock();
        match pods.conns.engine_ready() {
            None => Err(PodError::NotReady("the switch disconnected".into())),
            Some(engine) => {
                m.set_up(pod.clone(), req, ofport);
                undo.done(Step::InModel);
                let u = m.pod_update(&pod);
                // The pod's update recomputes the NetworkPolicy owners that see it: committed,
                // it realizes their policies too (see `crate::realize`).
                let ticket = pods.telemetry.metrics.realization.ticket(Some(&crate::realize::policy_namespaces(u.iter().map(|(o, _)| o))));
                engine.submit_update(u, OnFailure::Revert).map_err(engine_error).map(|rx| (rx, ticket))
            }
        }
    };
    // The port's lock is released before any undo (a teardown takes it).
    drop(guard);
    let (queued, ticket) = queued?;
    committed(queued, deadline).await?;
    pods.telemetry.metrics.realization.realized(ticket);
    pods.faults.hit(FaultPoint::Flows).map_err(PodError::Failed)?;
    tracing::debug!(pod = %format!("{}/{}", key.0, key.1), port_ms, total_ms = t_port.elapsed().as_secs_f64() * 1e3, "pod port and flows committed");
    Ok(ofport)
}
