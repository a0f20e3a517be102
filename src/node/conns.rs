//! The agent's live connections as the pod path and the converge loop share them: the OVSDB
//! client and the flow engine. The converge loop sets them (it owns connecting, resyncing and
//! starting the engine); the pod path only reads them, and refuses a request (503) when one is
//! missing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::engine::Engine;
use crate::metrics::Telemetry;
use crate::ovsdb::Ovs;

#[derive(Default)]
pub struct Conns {
    ovs: Mutex<Option<Ovs>>,
    engine: Mutex<Option<Engine>>,
    /// Pod flows may be committed incrementally: ports are known and the switch was resynced.
    flows_ready: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Conns {
    /// The live OVSDB connection, if any.
    pub fn ovs(&self) -> Option<Ovs> {
        lock(&self.ovs).clone().filter(|o| !o.client().is_closed())
    }

    /// A new (or lost) OVSDB connection; the health and metrics say so.
    pub fn set_ovs(&self, ovs: Option<Ovs>, telemetry: &Telemetry) {
        telemetry.health.ovsdb.store(ovs.is_some(), Ordering::Relaxed);
        telemetry.metrics.set_connected("ovsdb", ovs.is_some());
        *lock(&self.ovs) = ovs;
    }

    /// The engine, when pod flows can be committed incrementally.
    pub fn engine_ready(&self) -> Option<Engine> {
        if !self.flows_ready.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.engine).clone()
    }

    /// The engine, synced or not.
    pub fn engine(&self) -> Option<Engine> {
        lock(&self.engine).clone()
    }

    pub fn set_engine(&self, engine: Engine) {
        *lock(&self.engine) = Some(engine);
    }

    /// Whether pod flows may be committed incrementally (set after a resync, cleared when the
    /// switch disconnects).
    pub fn set_flows_ready(&self, ready: bool) {
        self.flows_ready.store(ready, Ordering::Release);
    }
}
