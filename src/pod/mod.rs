//! The pod's room: its whole lifecycle on this node — ADD, DEL and CHECK from the CNI plugin
//! ([`cni`]), setups and teardowns from the pod API ([`setup`], [`teardown`]), the dead-sandbox
//! GC, recovery after a restart ([`recovery`]), warm ports ([`spares`]) and the agent's durable
//! record of its pods ([`checkpoint`]).
//!
//! ```text
//! CNI request ─► validate ─► reserve (model) ─► interface ─► port + record (OVSDB)
//!        ─► into the model, flows queued ─► committed ─► checkpoint ─► reply
//!                      └──────────── any failure: Undo, latest step first ────────┘
//! ```
//!
//! One undo path ([`undo`]): every step of a setup records what undoing it takes before it
//! may leave anything behind, and a failed request undoes its completed steps in reverse.
//!
//! The room works through the node's narrow handles ([`Pods`]), never through the converge
//! loop: it reads the connections the loop keeps, changes the shared model, and kicks the loop
//! when something is left for it (a teardown whose port could not be removed now).

pub mod checkpoint;
pub mod cni;
pub mod durable;
mod error;
pub mod hostport;
pub mod recovery;
pub mod refill;
pub mod setup;
pub mod spares;
pub mod teardown;
mod undo;

use std::sync::Arc;

pub use error::PodError;

use crate::metrics::Telemetry;
use crate::node::{Config, Conns, Kick, PortLocks, State};

/// What the pod path works with: the node's handles it uses, and nothing of the converge
/// loop's own state.
pub struct Pods {
    pub cfg: Config,
    pub telemetry: Telemetry,
    /// The node's model: pods are reserved, set up and torn down in it.
    pub state: State,
    /// The OVSDB connection and the flow engine (kept by the converge loop).
    pub conns: Arc<Conns>,
    /// One lock per port or interface name, shared with the converge loop's port pass.
    pub locks: PortLocks,
    /// Warm ports for CNI ADDs.
    pub spares: Arc<spares::Spares>,
    /// The agent's own durable record of its pods (`--state-dir`).
    pub checkpoint: Arc<checkpoint::Checkpoint>,
    /// Wakes the converge loop (a teardown left something to finish).
    pub kick: Kick,
    /// Failures injected by tests (`--fail-pod-steps`); none otherwise.
    pub faults: crate::node::faults::Faults,
}

impl Pods {
    /// A node's pod path, with new shared handles (the converge loop takes its copies from
    /// here: [`crate::reconcile::Reconciler::new`]).
    pub fn new(cfg: Config, telemetry: Telemetry, checkpoint: checkpoint::Checkpoint) -> Arc<Pods> {
        Arc::new(Pods {
            state: State::new(crate::node::NodeState::with_audit(cfg.bridge.name(), cfg.audit)),
            conns: Arc::default(),
            locks: PortLocks::default(),
            spares: Arc::new(spares::Spares::new(cfg.warm_ports, cfg.warm_ports_always)),
            checkpoint: Arc::new(checkpoint),
            kick: Kick::default(),
            faults: crate::node::faults::Faults::new(&cfg.fail_pod_steps),
            cfg,
            telemetry,
        })
    }
}
