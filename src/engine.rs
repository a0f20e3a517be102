//! The flow engine: owns the desired and installed flows of one switch and commits changes.
//!
//! One task owns the state, so updates are applied in order without locks. Updates that arrive
//! while a bundle is in flight are *group-committed*: the next bundle carries all of them (each
//! update's flows are a subset of one atomic bundle, so each is still applied all-or-nothing).
//!
//! Failures: a commit that failed in any way leaves the engine *dirty* — we never assume a
//! failed commit did or did not apply — and the next operation first resyncs from a fresh dump.
//! A failed group is retried update by update (after a resync) so that only the update that
//! really fails is reported as failed.
//!
//! Resync: after a dump, a switch that holds this pipeline's version note and only flows of the
//! current generation gets the difference; an empty or stale one (restarted, restored from an
//! old save, another plugin or VERSION) gets a full replay — one ordered atomic bundle that
//! deletes everything and adds everything — under a new generation.

use std::sync::Arc;
use std::time::Instant;

use openflow::FlowStatsRequest;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::pipeline::Flow;
use crate::store::{diff, diff_owners, is_current, replay, Compiled, Conflict, DesiredState, InstalledState, Owner, Plan};
use crate::switch::{Switch, SwitchError};

/// The most FLOW_MODs one group commit may carry (a single update may exceed it).
pub const MAX_GROUP_FLOW_MODS: usize = 50_000;

/// What an operation did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub adds: usize,
    pub modifies: usize,
    pub deletes: usize,
    /// A resync that replaced everything (the switch was empty or stale).
    pub full_replay: bool,
}

impl Outcome {
    fn of(p: &Plan) -> Outcome {
        Outcome { adds: p.adds, modifies: p.modifies, deletes: p.deletes, full_replay: false }
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
    /// Its queue is full (the switch is slow): try again later.
    #[error("the flow engine's queue is full")]
    Busy,
}

/// The reply to a submitted operation.
pub type Pending<T> = oneshot::Receiver<Result<T, EngineError>>;

/// What becomes of an update's flows if its commit fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// The desired state goes back to what it was (a setup that did not happen).
    Revert,
    /// The desired state keeps the update (the model already says so, e.g. a pod that is gone):
    /// the engine is dirty and the next repair puts the switch right.
    Keep,
}

/// A set of owners' new flows (an empty list removes the owner), applied atomically.
pub type Update = Vec<(Owner, Vec<Flow>)>;

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// Whether an update may change the per-policy counters' flows in a way worth waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counts {
    /// A policy or namespace change: before a bundle that removes a counting flow, the switch's
    /// datapath counts are flushed into its flows (see [`CountFlush`]).
    Flush,
    /// The pod path (CNI ADD/DEL): no wait; what the datapath had not yet pushed when a pod's
    /// counting flow goes (at most one revalidation round) is not counted.
    NoWait,
}

/// Moves what ovs-vswitchd's datapath counted into its OpenFlow flows' statistics before a
/// policy change removes counting flows, so their FLOW_REMOVED carries every packet (the
/// per-policy counters; `ovs-appctl revalidator/wait`, spoken over its control socket).
#[derive(Clone, Debug)]
pub struct CountFlush {
    pub ctl: crate::switch::VswitchdCtl,
    /// Bound of one flush (a revalidation round is 500 ms by default); past it the change goes
    /// ahead unflushed.
    pub deadline: std::time::Duration,
}

enum Request {
    Update(Update, OnFailure, Counts, Reply<Outcome>),
    Replace(DesiredState, Reply<Outcome>),
    Resync(Option<DesiredState>, Reply<Outcome>),
    SetSwitch(Switch),
    Status(oneshot::Sender<Status>),
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
    pub full_replays: u64,
    /// The last bundle sent (committed or not): `sdn-node status` shows when the switch last
    /// changed and how long that took, without a dump.
    pub last_commit: Option<CommitRecord>,
    /// The last bundle that failed, and why (kept after later successes: an operator asking
    /// "what went wrong" wants the last failure, not only the current state).
    pub last_error: Option<CommitRecord>,
}

/// One bundle commit, as remembered for status.
#[derive(Clone, Debug)]
pub struct CommitRecord {
    pub at: std::time::SystemTime,
    pub latency: std::time::Duration,
    pub flow_mods: usize,
    /// `None` if committed; the switch's error otherwise.
    pub error: Option<String>,
}

/// The engine's state, for health checks and metrics.
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub dirty: bool,
    pub generation: u32,
    pub desired_flows: usize,
    pub installed_flows: usize,
    pub stats: Stats,
    /// Desired flows per table.
    pub flows_per_table: Vec<(u8, usize)>,
}

/// Handle to the engine task.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Request>,
}

impl Engine {
    /// Starts the engine on `sw`; flows get cookies of `generation` (a full replay moves to the
    /// next one; read it back with [`Engine::status`]). Call [`Engine::resync`] before the first
    /// update so the installed mirror matches the switch.
    pub fn start(sw: Switch, generation: u32) -> Engine {
        Engine::start_with_metrics(sw, generation, None)
    }

    /// [`Engine::start`], recording bundles, FLOW_MODs and resyncs in `metrics`.
    pub fn start_with_metrics(sw: Switch, generation: u32, metrics: Option<Arc<Metrics>>) -> Engine {
        Engine::start_counting(sw, generation, metrics, None)
    }

    /// [`Engine::start_with_metrics`] that flushes the datapath's counts before a policy change
    /// removes counting flows (`count_flush`; `None` when the per-policy counters are off).
    pub fn start_counting(sw: Switch, generation: u32, metrics: Option<Arc<Metrics>>, count_flush: Option<CountFlush>) -> Engine {
        let (tx, rx) = mpsc::channel(4096);
        let st = State {
            metrics,
            sw,
            generation: generation & 0xff_ffff,
            desired: DesiredState::default(),
            installed: InstalledState::default(),
            dirty: true,
            stats: Stats::default(),
            one_trip: true,
            count_flush,
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
        self.call(|tx| Request::Update(update, OnFailure::Revert, Counts::NoWait, tx)).await?
    }

    /// Queues an update without waiting (fails with [`EngineError::Busy`] if the queue is
    /// full): callers that compute updates under a lock use this, so that the engine applies
    /// them in the order they were computed.
    pub fn submit_update(&self, update: Update, on_failure: OnFailure) -> Result<Pending<Outcome>, EngineError> {
        self.submit(|tx| Request::Update(update, on_failure, Counts::NoWait, tx))
    }

    /// [`Engine::submit_update`] of a policy or namespace change ([`Counts::Flush`]).
    pub fn submit_policy_update(&self, update: Update, on_failure: OnFailure) -> Result<Pending<Outcome>, EngineError> {
        self.submit(|tx| Request::Update(update, on_failure, Counts::Flush, tx))
    }

    /// Queues a replacement of the whole desired state (with a resync from a dump first if
    /// `resync`), without waiting; see [`Engine::submit_update`].
    pub fn submit_replace(&self, desired: DesiredState, resync: bool) -> Result<Pending<Outcome>, EngineError> {
        if resync {
            self.submit(|tx| Request::Resync(Some(desired), tx))
        } else {
            self.submit(|tx| Request::Replace(desired, tx))
        }
    }

    fn submit<T>(&self, make: impl FnOnce(Reply<T>) -> Request) -> Result<Pending<T>, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.try_send(make(tx)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => EngineError::Busy,
            mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
        })?;
        Ok(rx)
    }

    /// Replaces the whole desired state and commits the difference to the installed mirror
    /// in one atomic bundle (no dump unless the engine is dirty).
    pub async fn replace(&self, desired: DesiredState) -> Result<Outcome, EngineError> {
        self.call(|tx| Request::Replace(desired, tx)).await?
    }

    /// Dumps the switch and makes it equal to the desired state (replaced first if given): the
    /// difference if the switch is current, a full replay otherwise.
    pub async fn resync(&self, desired: Option<DesiredState>) -> Result<Outcome, EngineError> {
        self.call(|tx| Request::Resync(desired, tx)).await?
    }

    /// Switches to a new connection (after a reconnect); the engine is dirty until resynced.
    pub async fn set_switch(&self, sw: Switch) -> Result<(), EngineError> {
        self.tx.send(Request::SetSwitch(sw)).await.map_err(|_| EngineError::Stopped)
    }

    pub async fn status(&self) -> Result<Status, EngineError> {
        self.call(Request::Status).await
    }

    /// The desired and installed state, and whether a resync is needed.
    pub async fn snapshot(&self) -> Result<(DesiredState, InstalledState, bool), EngineError> {
        self.call(Request::Snapshot).await
    }
}

struct State {
    metrics: Option<Arc<Metrics>>,
    sw: Switch,
    generation: u32,
    desired: DesiredState,
    installed: InstalledState,
    dirty: bool,
    stats: Stats,
    /// Updates whose flows the switch cannot refuse when they are added commit in one round
    /// trip ([`crate::switch::Bundle::commit_one_trip`]). Cleared for good if the switch ever
    /// refuses one anyway (it then applied the rest, which the engine repaired at once).
    one_trip: bool,
    count_flush: Option<CountFlush>,
}

type Queued = (Update, OnFailure, Counts, Reply<Outcome>);
/// The flows each owner of an update had before it, in the update's order.
type Prev = Vec<Vec<Compiled>>;

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
                Request::Update(u, on_failure, counts, reply) => {
                    // Group commit: take every update already waiting (up to the limit).
                    let mut group: Vec<Queued> = vec![(u, on_failure, counts, reply)];
                    let mut size: usize = group[0].0.iter().map(|(_, f)| f.len()).sum();
                    while size < MAX_GROUP_FLOW_MODS {
                        match rx.try_recv() {
                            Ok(Request::Update(u, f, c, r)) => {
                                size += u.iter().map(|(_, f)| f.len()).sum::<usize>();
                                group.push((u, f, c, r));
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
                Request::Replace(desired, reply) => {
                    self.desired = desired;
                    let r = if self.dirty {
                        self.resync().await
                    } else {
                        let plan = diff(&self.desired, &self.installed, self.generation);
                        self.flush_counts(&plan).await;
                        self.commit(&plan).await.map(|_| Outcome::of(&plan))
                    };
                    let _ = reply.send(r.map_err(EngineError::Switch));
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
                Request::Status(reply) => {
                    let _ = reply.send(self.status());
                }
                Request::Snapshot(reply) => {
                    let _ = reply.send((self.desired.clone(), self.installed.clone(), self.dirty));
                }
            }
        }
    }

    fn status(&self) -> Status {
        let mut per_table = std::collections::BTreeMap::new();
        for (_, f) in self.desired.iter() {
            *per_table.entry(f.key.table).or_insert(0usize) += 1;
        }
        Status {
            dirty: self.dirty,
            generation: self.generation,
            desired_flows: self.desired.len(),
            installed_flows: self.installed.len(),
            stats: self.stats.clone(),
            flows_per_table: per_table.into_iter().collect(),
        }
    }

    /// Applies `u` to the desired state; returns each touched owner's previous flows, or the
    /// conflict (with nothing changed).
    fn stage(&mut self, u: &Update) -> Result<Prev, Box<Conflict>> {
        let mut prev: Prev = Vec::with_capacity(u.len());
        for (owner, flows) in u {
            let old = self.desired.flows_of(owner).to_vec();
            if let Err(c) = self.desired.set_compiled(owner.clone(), flows.iter().map(Compiled::compile).collect()) {
                self.unstage(u, prev);
                return Err(c);
            }
            prev.push(old);
        }
        Ok(prev)
    }

    /// Whether the commit of `u` may skip the barrier before COMMIT: every flow it adds or
    /// modifies is one the switch cannot refuse when added (its deletes are of flows the mirror
    /// holds, whose table and match the switch accepted before).
    fn one_trip(&self, u: &Update) -> bool {
        let n_tables = self.sw.features().n_tables;
        self.one_trip
            && u.iter().all(|(_, flows)| {
                flows.iter().all(|f| openflow::accept::add_cannot_fail(f.table.id(), &f.match_, &f.instructions, n_tables))
            })
    }

    /// Puts the switch right at once after a one-trip commit the switch applied only in part,
    /// so that the update's error is answered with no part of it left on the switch.
    async fn repair_partial(&mut self, e: &SwitchError) {
        if matches!(e, SwitchError::BundlePartial { .. }) {
            if let Err(r) = self.resync().await {
                warn!(error = %r, "repair after a partly applied bundle failed; the next operation retries");
            }
        }
    }

    /// Undoes [`State::stage`] of `u` (`prev` may cover only its first owners).
    fn unstage(&mut self, u: &Update, prev: Prev) {
        for ((owner, _), old) in u.iter().take(prev.len()).zip(prev).rev() {
            // Restoring what was there cannot conflict: it was consistent before.
            let _ = self.desired.set_compiled(owner.clone(), old);
        }
    }

    /// Before `plan` removes a flow that carries per-policy counts: the datapath's counts so far
    /// pushed into the flows (one revalidation round), so the FLOW_REMOVED of each removed flow
    /// has every packet it handled. Bounded by the flush's deadline; a failed or late flush is
    /// logged and the change goes ahead (enforcement before counting).
    async fn flush_counts(&mut self, plan: &Plan) {
        let Some(f) = &self.count_flush else { return };
        if !plan.removes_counting_flows(&self.installed) {
            return;
        }
        let t = Instant::now();
        match f.ctl.revalidator_wait(f.deadline).await {
            Ok(()) => debug!(waited = ?t.elapsed(), "datapath counts flushed before a policy change"),
            Err(e) => warn!(error = %e, "could not flush the datapath's counts before a policy change; the per-policy counters may miss what the datapath counted in the last revalidation round"),
        }
        if let Some(m) = &self.metrics {
            m.count_flush(t.elapsed());
        }
    }

    /// Commits a plan as one bundle. On any failure the switch's state is unknown: dirty.
    async fn commit(&mut self, plan: &Plan) -> Result<(), SwitchError> {
        self.commit_for(plan, false, &|| "all".to_string()).await
    }

    /// Commits `plan` for the owners `owners()` describes (only computed for log lines), in
    /// one round trip if `one_trip` (see [`State::one_trip`]).
    async fn commit_for(&mut self, plan: &Plan, one_trip: bool, owners: &(dyn Fn() -> String + Sync)) -> Result<(), SwitchError> {
        if plan.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let mut b = self.sw.bundle();
        for body in plan.bodies() {
            b.add_body(body);
        }
        let r = if one_trip { b.commit_one_trip().await } else { b.commit().await };
        let latency = t.elapsed();
        self.stats.bundles += 1;
        let record = CommitRecord {
            at: std::time::SystemTime::now(),
            latency,
            flow_mods: plan.len(),
            error: r.as_ref().err().map(|e| e.to_string()),
        };
        if record.error.is_some() {
            self.stats.last_error = Some(record.clone());
        }
        self.stats.last_commit = Some(record);
        if let Some(m) = &self.metrics {
            m.bundle(r.is_ok(), plan.adds, plan.modifies, plan.deletes, latency);
        }
        match &r {
            Ok(()) => {
                self.stats.flow_mods += plan.len() as u64;
                self.installed.apply(plan);
                if tracing::enabled!(tracing::Level::DEBUG) {
                    debug!(owners = owners(), flow_mods = plan.len(), %plan, ?latency, "bundle committed");
                }
            }
            Err(e) => {
                self.stats.bundle_failures += 1;
                self.dirty = true;
                if let SwitchError::BundlePartial { .. } = e {
                    // A flow the switch should not have been able to refuse was refused: trust
                    // the check no more on this engine.
                    self.one_trip = false;
                    tracing::error!(owners = owners(), error = %e, %plan, "the switch refused a flow when it was added to a one-trip bundle and applied the rest; repairing, and waiting for a barrier before every commit from now on");
                } else {
                    warn!(owners = owners(), error = %e, %plan, "bundle failed; the switch will be resynced from a dump");
                }
            }
        }
        r
    }

    async fn commit_group(&mut self, group: Vec<Queued>) {
        self.stats.updates += group.len() as u64;
        if self.dirty {
            // The mirror may be wrong: repair first, then apply on top of a known state.
            if let Err(e) = self.resync().await {
                for (u, on_failure, _, reply) in group {
                    // A kept update still becomes the desired state: the next repair applies it.
                    if on_failure == OnFailure::Keep {
                        let _ = self.stage(&u);
                    }
                    let _ = reply.send(Err(EngineError::Switch(clone_err(&e))));
                }
                return;
            }
        }
        // Stage every update; a conflicting one fails alone.
        let mut staged: Vec<(Queued, Prev)> = Vec::with_capacity(group.len());
        let mut one_trip = true;
        let mut flush = false;
        for (u, on_failure, counts, reply) in group {
            match self.stage(&u) {
                Ok(prev) => {
                    one_trip = one_trip && self.one_trip(&u);
                    flush = flush || counts == Counts::Flush;
                    staged.push(((u, on_failure, counts, reply), prev))
                }
                Err(c) => {
                    let _ = reply.send(Err(EngineError::Conflict(c)));
                }
            }
        }
        if staged.is_empty() {
            return;
        }
        let touched = staged.iter().flat_map(|((u, _, _, _), p)| touched(u, p));
        let plan = diff_owners(&self.desired, &self.installed, touched, self.generation);
        let owners = || describe(staged.iter().flat_map(|((u, _, _, _), _)| u.iter().map(|(o, _)| o)));
        if flush {
            self.flush_counts(&plan).await;
        }
        match self.commit_for(&plan, one_trip, &owners).await {
            Ok(()) => {
                for ((_, _, _, reply), _) in staged {
                    let _ = reply.send(Ok(Outcome::of(&plan)));
                }
            }
            Err(e) if staged.len() == 1 => {
                if let Some(((u, on_failure, _, reply), prev)) = staged.pop() {
                    if on_failure == OnFailure::Revert {
                        self.unstage(&u, prev);
                    }
                    self.repair_partial(&e).await;
                    let _ = reply.send(Err(EngineError::Switch(e)));
                }
            }
            Err(e) if e.is_disconnect() => {
                for ((u, on_failure, _, reply), prev) in staged.into_iter().rev() {
                    if on_failure == OnFailure::Revert {
                        self.unstage(&u, prev);
                    }
                    let _ = reply.send(Err(EngineError::Switch(clone_err(&e))));
                }
            }
            Err(e) => {
                // Isolate the failing update(s): undo the revertible ones, repair, then one by
                // one. Kept updates stay desired; the repair applies them.
                let (mut retry, mut kept) = (Vec::new(), Vec::new());
                for ((u, on_failure, _, reply), prev) in staged.into_iter().rev() {
                    match on_failure {
                        OnFailure::Revert => {
                            self.unstage(&u, prev);
                            retry.push((u, reply));
                        }
                        OnFailure::Keep => kept.push(reply),
                    }
                }
                self.repair_partial(&e).await;
                for reply in kept {
                    let _ = reply.send(Err(EngineError::Switch(clone_err(&e))));
                }
                for (u, reply) in retry.into_iter().rev() {
                    let r = self.single(&u).await;
                    let _ = reply.send(r);
                }
            }
        }
    }

    /// One update on its own (after a resync if the engine is dirty).
    async fn single(&mut self, u: &Update) -> Result<Outcome, EngineError> {
        if self.dirty {
            self.resync().await?;
        }
        let prev = self.stage(u)?;
        let one_trip = self.one_trip(u);
        let plan = diff_owners(&self.desired, &self.installed, touched(u, &prev), self.generation);
        let owners = || describe(u.iter().map(|(o, _)| o));
        match self.commit_for(&plan, one_trip, &owners).await {
            Ok(()) => Ok(Outcome::of(&plan)),
            Err(e) => {
                self.unstage(u, prev);
                self.repair_partial(&e).await;
                Err(EngineError::Switch(e))
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
        if is_current(&self.desired, &self.installed, self.generation) {
            let plan = diff(&self.desired, &self.installed, self.generation);
            self.commit(&plan).await?;
            if let Some(m) = &self.metrics {
                m.resync(false);
            }
            return Ok(Outcome::of(&plan));
        }
        let next = (self.generation + 1) & 0xff_ffff;
        let plan = replay(&self.desired, next);
        info!(installed = self.installed.len(), desired = self.desired.len(), generation = next, "switch is empty or stale: full replay");
        self.commit(&plan).await?;
        self.generation = next;
        self.stats.full_replays += 1;
        if let Some(m) = &self.metrics {
            m.resync(true);
        }
        Ok(Outcome { full_replay: true, ..Outcome::of(&plan) })
    }
}

/// Each owner of `u` with the flows it had before (for [`diff_owners`]).
fn touched<'a>(u: &'a Update, prev: &'a Prev) -> impl Iterator<Item = (&'a Owner, &'a [Compiled])> {
    u.iter().zip(prev).map(|((o, _), f)| (o, f.as_slice()))
}

/// "pod/ns/a, vnid/11" (at most five owners, then a count).
fn describe<'a>(owners: impl Iterator<Item = &'a Owner>) -> String {
    let all: Vec<String> = owners.map(|o| o.to_string()).collect();
    if all.len() <= 5 {
        all.join(", ")
    } else {
        format!("{} and {} more", all[..5].join(", "), all.len() - 5)
    }
}

fn clone_err(e: &SwitchError) -> SwitchError {
    match e {
        SwitchError::Disconnected(r) => SwitchError::Disconnected(r.clone()),
        SwitchError::Timeout { what, after } => SwitchError::Timeout { what, after: *after },
        other => SwitchError::Disconnected(crate::switch::CloseReason::Io(other.to_string())),
    }
}
