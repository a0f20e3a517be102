//! A pod setup's one failure path. Each step of a setup (reserve, warm port taken, interface,
//! port + record, flows) records what undoing it takes as soon as it may have left something
//! behind — before the call that makes it, when a failed or timed-out call can leave it half
//! made — and the setup's outcome goes through [`Undo::finish`]: on failure the completed steps
//! are undone, the latest (in the setup's order) first; on success nothing is.
//!
//! The order is the setup's, not the order in which steps were recorded: a warm port's
//! interface is claimed while its port is added, and is still undone after the port.
//!
//! This is the only undo of a pod request: hostnet's steps (make the veth, move a warm port,
//! configure) leave what they made to it, and a warm port taken from the pool is one of its
//! steps. Two things below it are atomic, not undone: one OVSDB transaction, and one flow
//! update in the engine (committed as one bundle, or not part of the desired state).

use tokio::time::Instant;
use tracing::warn;

use super::spares::Spare;
use super::teardown::{self, UNDO_GRACE};
use super::{PodError, Pods};
use crate::cluster::{Pod, PodKey};
use crate::node::record::PodRecord;

/// One step of a pod setup, as its undo needs it.
pub(super) enum Step {
    /// The pod's name, address, port name (and sandbox) reserved in the model.
    Reserved,
    /// A warm port taken from the pool. Until its claim starts it goes back to the pool on
    /// failure; from then on it is this setup's (its interface and port steps delete it) and the
    /// pool lets go of it whatever the outcome.
    Spare { spare: Spare, claimed: bool },
    /// An interface a call of this setup may have made (it failed, or timed out): deleted
    /// only if it is paired with `ifname` in the setup's sandbox (the sandbox is this setup's
    /// alone, so such a pair is its own).
    MaybeInterface { host: hostnet::Netns, name: String, sandbox: hostnet::Netns, ifname: String },
    /// The interface this setup made (CNI), as its record says: deleted by its recorded ifindex.
    Interface(PodRecord),
    /// The pod's port and record on the bridge (added, or perhaps added).
    Port(Pod),
    /// The pod in the model with its flows queued: undone as a teardown is (flows, port,
    /// interface), which covers every earlier step but the warm port's release.
    InModel,
}

impl Step {
    /// The step's place in a setup.
    fn rank(&self) -> u8 {
        match self {
            Step::Reserved => 0,
            Step::Spare { .. } => 1,
            Step::MaybeInterface { .. } | Step::Interface(_) => 2,
            Step::Port(_) => 3,
            Step::InModel => 4,
        }
    }
}

/// The steps one setup of pod `key` has completed.
pub(super) struct Undo<'a> {
    pods: &'a Pods,
    key: PodKey,
    steps: Vec<Step>,
}

impl<'a> Undo<'a> {
    pub fn new(pods: &'a Pods, key: PodKey) -> Undo<'a> {
        Undo { pods, key, steps: Vec::new() }
    }

    /// Records a completed (or possibly completed) step.
    pub fn done(&mut self, step: Step) {
        self.steps.push(step);
    }

    /// The interface a call may have made is known now, as `record` says: undone by it.
    pub fn interface_made(&mut self, record: PodRecord) {
        self.steps.retain(|s| !matches!(s, Step::MaybeInterface { .. }));
        self.steps.push(Step::Interface(record));
    }

    /// The warm port taken is being claimed: it is this setup's from now on.
    pub fn spare_claimed(&mut self) {
        for s in &mut self.steps {
            if let Step::Spare { claimed, .. } = s {
                *claimed = true;
            }
        }
    }

    /// The setup's outcome: on failure every completed step is undone before the error is
    /// returned.
    pub async fn finish<T>(mut self, r: Result<T, PodError>) -> Result<T, PodError> {
        match &r {
            Ok(_) => {
                // A claimed warm port is the pod's now: the pool no longer keeps it. One the
                // setup did not need (a repeated ADD answered what the first did) goes back.
                for s in std::mem::take(&mut self.steps) {
                    match s {
                        Step::Spare { spare, claimed: true } => self.pods.spares.release(&spare.name),
                        Step::Spare { spare, claimed: false } => self.pods.spares.put_back(spare),
                        _ => {}
                    }
                }
            }
            Err(e) => {
                if self.steps.iter().any(|s| !matches!(s, Step::Reserved)) {
                    warn!(pod = %format!("{}/{}", self.key.0, self.key.1), error = %e, "pod setup failed; undoing it");
                }
                self.run().await;
            }
        }
        r
    }

    async fn run(&mut self) {
        // Stable: steps of one rank keep the order they were done in.
        self.steps.sort_by_key(Step::rank);
        let (pods, key) = (self.pods, &self.key);
        while let Some(step) = self.steps.pop() {
            match step {
                Step::InModel => {
                    let doomed = {
                        let mut m = pods.state.lock();
                        m.tear_down(key);
                        m.doomed(key).is_some()
                    };
                    if doomed {
                        // The teardown takes the flows, the port and the interface; what is
                        // left below it is the reservation (gone with the teardown) and the
                        // warm port's release.
                        let _ = teardown::finish_teardown(pods, key, Instant::now() + UNDO_GRACE).await;
                        self.steps.retain(|s| matches!(s, Step::Spare { .. }));
                    }
                }
                Step::Port(pod) => {
                    let _g = pods.locks.lock(&pod.host_veth).await;
                    teardown::undo_port(pods, &pod).await;
                }
                Step::Interface(record) => {
                    if let Err(e) = teardown::remove_pod_iface(&record).await {
                        warn!(veth = %record.host_veth, error = %e, "could not remove a failed setup's interface; a DEL of the container removes it");
                    }
                }
                Step::MaybeInterface { host, name, sandbox, ifname } => undo_made(&host, &name, &sandbox, &ifname).await,
                // Untouched: back to the pool. Claimed: its interface and port went with the
                // steps above (a port the undo could not remove is one nobody wants once the
                // pool lets go of it: the converge loop removes it).
                Step::Spare { spare, claimed: false } => pods.spares.put_back(spare),
                Step::Spare { spare, claimed: true } => pods.spares.release(&spare.name),
                Step::Reserved => pods.state.lock().unreserve(key),
            }
        }
    }
}

/// Deletes `name` in the host namespace if it is paired with `ifname` in `sandbox`.
async fn undo_made(host: &hostnet::Netns, name: &str, sandbox: &hostnet::Netns, ifname: &str) {
    if let Ok(hostnet::VethState::Paired { host_index }) = hostnet::veth_state(host, name, None, sandbox, ifname).await {
        if let Err(e) = hostnet::delete_owned(host, name, Some(host_index)).await {
            warn!(veth = %name, error = %e, "could not remove a failed ADD's interface; a DEL of the container removes it");
        }
    }
}
