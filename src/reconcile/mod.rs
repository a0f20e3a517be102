//! The converge loop: one model, one converge path, for `run` (converge forever) and `apply`
//! (converge once).
//!
//! ```text
//! source (file / kube) ─┐
//! pod API / CNI ────────┼─► NodeState ─► desired flows ──► Engine (diff, one bundle) ──► switch
//! DNS answers ──────────┘          └──► wanted ports ───► OVSDB ─────────────────────► ovsdb-server
//! ```
//!
//! The model lives behind a lock that is never held across I/O. Desired flows are computed
//! from it and queued to the engine *under that lock*, so the engine applies them in model
//! order: a full replacement computed before a pod's setup can never land after it and undo
//! it. Pod requests ([`crate::pod`]) run concurrently with each other and with the reconcile loop;
//! their flow changes are group-committed by the engine, their port operations serialised per
//! port name ([`ports::PortLocks`]). Every peer call has a deadline.

pub mod dns;
pub mod host;
pub mod repair;

use std::sync::{Arc, OnceLock};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::cluster::Problem;
use crate::engine::{CountFlush, Engine, EngineError, Outcome};
use crate::metrics::{Executor, Telemetry};
use crate::node::ports::{self, PortLocks};
use crate::node::record::{PodRecord, POD_KEY};
use crate::node::state::PortState;
use crate::node::{Config, Conns, Kick, State};
use crate::ovsdb::{Ovs, OvsdbError};
use crate::pod::spares::Spares;
use crate::pod::Pods;
use crate::switch::Switch;

use crate::node::ports::GENERATION_KEY;

/// Why a converge pass did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ConvergeError {
    #[error("OVSDB: {0}")]
    Ovsdb(#[from] OvsdbError),
    #[error("flows: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    NotReady(&'static str),
    /// The pods could not be recovered at start (a kernel query failed); retried.
    #[error("pod recovery: {0}")]
    Recovery(String),
    /// What exists contradicts the configuration (ports on another bridge, another datapath
    /// type): nothing was written. Fatal for `apply` and for `run` before its first pass.
    #[error("{0}")]
    Refused(String),
}

impl From<ports::BaseError> for ConvergeError {
    fn from(e: ports::BaseError) -> ConvergeError {
        match e {
            ports::BaseError::Ovsdb(e) => ConvergeError::Ovsdb(e),
            ports::BaseError::Refused(m) => ConvergeError::Refused(m),
        }
    }
}

/// What one converge pass did.
#[derive(Debug, Default)]
pub struct Pass {
    pub outcome: Outcome,
    pub ports_added: usize,
    pub ports_removed: usize,
    /// Objects rejected (validation, conflicts, ports that could not be set up).
    pub problems: Vec<Problem>,
    /// Operational warnings (DNS failures that made a VNID drop all egress).
    pub warnings: Vec<Problem>,
    /// The model's version the committed flows were computed from.
    pub flows_version: u64,
}

/// The base ports' settings that come from the cluster's state.
pub fn base_spec(st: &crate::cluster::ClusterState) -> ports::BaseSpec {
    let tun_mac = match (st.plugin, st.local_subnet()) {
        (crate::domain::Plugin::NetworkPolicy, Some(local)) => local.tun0_mac(),
        _ => None,
    };
    ports::BaseSpec { vxlan_port: st.vxlan_port, tun_mac }
}

/// The converge loop: the node's handles it shares with the pod path, and its own state (what
/// it has established on the current connections).
pub struct Reconciler {
    cfg: Config,
    telemetry: Telemetry,
    state: State,
    conns: Arc<Conns>,
    locks: PortLocks,
    /// Warm ports: the loop never removes one from the bridge.
    spares: Arc<Spares>,
    /// The pod path, for the recovery of its pods at start and the interfaces of torn-down pods.
    pods: Arc<Pods>,
    /// Wakes this loop (something is left to clean up or converge).
    pub kick: Kick,
    /// What the host executor converges the node's own networking to ([`host`]).
    host_plan: watch::Sender<Option<host::HostPlan>>,
    /// Wakes the host executor (tun0 was just created again).
    pub host_kick: Kick,
    /// Set when the per-policy counters are on: engines started from then flush the datapath's
    /// counts before a policy change removes counting flows.
    pub count_flush: Arc<OnceLock<CountFlush>>,
    /// The bridge and base ports were ensured on the current OVSDB connection.
    base_ready: bool,
    /// Every pod port must be checked again (new OVSDB connection).
    verify_ports: bool,
    /// Pod ports were reconciled at least once: until then the pods' ofports are unknown, and
    /// computing flows would remove every pod's flows (traffic!), so the switch is left alone.
    ports_ready: bool,
    /// The API pods were recovered from OVSDB (once per run).
    recovered: bool,
    /// A new OpenFlow connection, waiting for the engine (which starts once the generation
    /// stored on the bridge is known).
    pending_switch: Option<Switch>,
    /// A new OpenFlow connection waits for its resync (dump, then difference or full replay).
    pub resync_pending: bool,
    generation: u32,
    /// The generation this run stored on the bridge (what the sentinel expects there).
    stored_generation: Option<u32>,
    /// The stored generation is missing from the bridge: write it again.
    restore_generation: bool,
    /// What the base ports were last ensured with (vxlan0's dst_port, tun0's MAC).
    base: ports::BaseSpec,
    /// The bridge's datapath type as this run found or made it (kept from then on: put back
    /// if someone changes it).
    datapath: Option<String>,
    /// Pods whose port, record or QoS someone else removed: set up again on the next pass.
    repair_pods: std::collections::HashSet<crate::cluster::PodKey>,
    /// The CNI configuration was written.
    conflist_written: bool,
}

impl Reconciler {
    /// The converge loop of the node whose pod path is `pods` (it shares that path's handles).
    pub fn new(pods: Arc<Pods>) -> Reconciler {
        Reconciler {
            cfg: pods.cfg.clone(),
            telemetry: pods.telemetry.clone(),
            state: pods.state.clone(),
            conns: pods.conns.clone(),
            locks: pods.locks.clone(),
            spares: pods.spares.clone(),
            kick: pods.kick.clone(),
            pods,
            host_plan: watch::Sender::new(None),
            host_kick: Kick::default(),
            count_flush: Arc::default(),
            base_ready: false,
            verify_ports: true,
            ports_ready: false,
            recovered: false,
            pending_switch: None,
            resync_pending: false,
            generation: 1,
            stored_generation: None,
            restore_generation: false,
            base: ports::BaseSpec::default(),
            datapath: None,
            repair_pods: Default::default(),
            conflist_written: false,
        }
    }

    /// A node without a checkpoint, pod API or CNI configuration (`apply`, tests): its pod
    /// path and its converge loop.
    pub fn standalone(cfg: Config, telemetry: Telemetry) -> Reconciler {
        Reconciler::new(Pods::new(cfg, telemetry, crate::pod::checkpoint::Checkpoint::none()))
    }

    /// The node's model.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The live connections.
    pub fn conns(&self) -> &Arc<Conns> {
        &self.conns
    }

    /// The host executor's plans (see [`host::run`]).
    pub fn host_plans(&self) -> watch::Receiver<Option<host::HostPlan>> {
        self.host_plan.subscribe()
    }

    /// Publishes the model's host plan to the host executor (if it changed).
    fn publish_host_plan(&self) {
        if !self.cfg.manages_host() {
            return;
        }
        let plan = self.state.lock().effective().and_then(host::plan);
        self.host_plan.send_if_modified(|p| {
            let changed = *p != plan;
            if changed {
                *p = plan;
            }
            changed
        });
    }

    /// A new (or lost) OVSDB connection.
    pub fn ovsdb_changed(&mut self, ovs: Option<Ovs>) {
        if ovs.is_some() {
            self.telemetry_reconnect("ovsdb");
        }
        self.conns.set_ovs(ovs, &self.telemetry);
        self.base_ready = false;
        self.verify_ports = true;
    }

    /// What OVSDB must hold, from the model and what this run established.
    fn expected(&self) -> repair::Expected {
        let m = self.state.lock();
        let pods = m
            .ports()
            .iter()
            .map(|(k, ps)| (k.clone(), (ps.clone(), m.api_pod(k).map(|(_, req)| req.to_json()))))
            .collect();
        repair::Expected {
            bridge: self.cfg.bridge.name().to_string(),
            datapath_type: self.datapath.clone(),
            base: self.base,
            generation: self.stored_generation,
            pods,
        }
    }

    /// Compares what the sentinel sees with the model; whatever someone else removed or
    /// changed is logged, counted and scheduled for repair on the next pass. True if anything
    /// was found. Only once this connection's ports converged (before that, nothing is
    /// "removed": it is not made yet).
    pub fn inspect_ovsdb(&mut self, snap: &crate::ovsdb::sentinel::Snapshot) -> bool {
        if !(self.base_ready && self.ports_ready) || self.verify_ports {
            return false;
        }
        let found = repair::inspect(snap, &self.expected());
        for f in &found {
            self.telemetry.metrics.repaired(f.what());
            warn!(what = f.what(), "someone else changed OVSDB; repairing from the model: {f}");
            match f {
                repair::Finding::EmptyDatabase | repair::Finding::BridgeMissing => {
                    self.base_ready = false;
                    self.verify_ports = true;
                    self.restore_generation = self.stored_generation.is_some();
                }
                repair::Finding::BridgeSetting { .. } | repair::Finding::BasePort { .. } => self.base_ready = false,
                repair::Finding::Generation { .. } => self.restore_generation = true,
                _ => {}
            }
            if let Some(pod) = f.pod() {
                self.repair_pods.insert(pod.clone());
            }
        }
        if !found.is_empty() {
            self.telemetry.not_converged();
        }
        !found.is_empty()
    }

    /// Whether the switch still holds as many flows as the engine installed (one small
    /// OFPMP_AGGREGATE reply): `ovs-ofctl del-flows` or `add-flow` by someone else changes the
    /// count, and the engine then resyncs from a dump. The installed count is read before and
    /// after, so a commit landing in between is not taken for tampering.
    pub async fn check_flows(&mut self, sw: &Switch) {
        let Some(engine) = self.conns.engine_ready() else { return };
        let Ok(before) = engine.status().await else { return };
        if before.dirty {
            return;
        }
        let Ok(agg) = sw.aggregate(openflow::FlowStatsRequest::default()).await else { return };
        let Ok(after) = engine.status().await else { return };
        if before.installed_flows != after.installed_flows || agg.flow_count as usize == after.installed_flows {
            return;
        }
        self.telemetry.metrics.repaired("flows");
        warn!(switch = agg.flow_count, installed = after.installed_flows, "the switch's flows changed behind the agent's back; resyncing from a dump");
        self.resync_from_dump(&engine).await;
        self.kick.kick();
    }

    fn telemetry_reconnect(&self, target: &str) {
        self.telemetry.metrics.reconnects.get_or_create(&crate::metrics::TargetLabel { target: target.into() }).inc();
    }

    /// A new OpenFlow connection: read its port numbers, then resync on the next pass.
    pub async fn switch_connected(&mut self, sw: Switch) {
        if let Err(e) = sw.set_frag_mode(openflow::FragMode::NxMatch).await {
            warn!(error = %e, "could not set fragment handling to nx-match");
        }
        // A restarted switch may have renumbered the pods' ports: its own port list is
        // authoritative for this connection (the database can lag behind it).
        match sw.port_desc().await {
            Ok(ports) => {
                let ports: Vec<(String, u32)> = ports.iter().map(|p| (p.name(), p.port_no.0)).collect();
                self.state.lock().refresh_ofports(&ports);
            }
            Err(e) => {
                warn!(error = %e, "could not read the switch's ports; checking every pod port again");
                self.verify_ports = true;
            }
        }
        self.conns.set_flows_ready(false);
        let engine = self.conns.engine();
        match engine {
            Some(e) => {
                let _ = e.set_switch(sw).await;
            }
            None => self.pending_switch = Some(sw),
        }
        self.resync_pending = true;
        self.telemetry.not_converged();
    }

    pub fn switch_lost(&mut self) {
        self.conns.set_flows_ready(false);
        self.telemetry.not_converged();
    }

    /// One pass: ports (if OVSDB is up), then flows (if the switch is up and ports are known).
    pub async fn converge(&mut self) -> Result<Pass, ConvergeError> {
        let mut pass = Pass::default();
        if !self.state.lock().has_state() {
            return Err(ConvergeError::NotReady("no cluster state yet"));
        }
        let doomed: Vec<_> = {
            let m = self.state.lock();
            m.doomed_pods().into_iter().filter_map(|p| m.doomed(&p.key()).cloned()).collect()
        };
        self.publish_host_plan();
        let ovs = self.conns.ovs();
        let ports_result = match &ovs {
            Some(ovs) => self.converge_ports(ovs, &mut pass).await,
            None => Err(ConvergeError::NotReady("ovsdb-server is not connected")),
        };
        if !matches!(ports_result, Err(ConvergeError::NotReady(_))) {
            self.telemetry.executor_result(Executor::Ovsdb, &ports_result);
        }
        if let Err(e) = &ports_result {
            // An OVSDB refusal on a live connection ("Bridge br0 not found": someone deleted
            // it): the next pass ensures the bridge and its base ports again first. Without
            // this, a bridge deleted while no OVSDB monitor watched (just after a reconnect,
            // before a pass succeeded) was never put back: every pass failed on the missing
            // bridge, the switch could not connect to it, and the repair tick stopped at the
            // switch (seen in the chaos soak: 1,300 failed passes, pod DELs failing for good).
            if matches!(e, ConvergeError::Ovsdb(o) if !o.is_disconnect()) {
                self.base_ready = false;
            }
            if !self.ports_ready {
                return Err(ConvergeError::NotReady(match e {
                    ConvergeError::NotReady(w) => w,
                    _ => "pod ports are not known yet",
                }))
                .inspect_err(|_| warn!(error = %e, "ports not reconciled"));
            }
            warn!(error = %e, "ports not reconciled; flows follow the ports known");
        }
        let flows = self.converge_flows(&mut pass).await;
        if !matches!(flows, Err(ConvergeError::NotReady(_))) {
            self.telemetry.executor_result(Executor::Flows, &flows.as_ref().map(|_| ()));
        }
        pass.outcome = flows?;
        ports_result?;
        // Pods doomed before this pass: their ports are gone (the pass removed every unwanted
        // port) and their flows are off the switch (it committed a model without them).
        for (p, req) in doomed {
            // The interface the agent created for a CNI pod goes too.
            if req.cni.is_some() {
                if let Err(e) = crate::pod::teardown::remove_pod_iface(&req).await {
                    warn!(pod = %format!("{}/{}", p.namespace, p.name), error = %e, "could not remove a torn-down pod's interface; will retry");
                    continue;
                }
            }
            self.state.lock().buried(&p.key());
        }
        // Converged if the switch holds the flows of the model as it is now. The pass itself
        // moves the model on (a port it added has its ofport now, a port it removed is
        // forgotten), and a pod request may have changed it meanwhile: the flows are the
        // model's as of when they were computed, after the ports. If the model moved past them,
        // one more pass commits the difference (usually nothing) and says converged then;
        // nothing else would start it.
        if self.state.lock().version == pass.flows_version {
            self.telemetry.health.converged.store(true, std::sync::atomic::Ordering::Relaxed);
        } else {
            self.telemetry.not_converged();
            self.kick.kick();
        }
        Ok(pass)
    }

    /// The ports part of a pass alone (before the switch is connected: `apply` needs the
    /// bridge before it can connect to it).
    pub async fn prepare(&mut self) -> Result<Pass, ConvergeError> {
        let mut pass = Pass::default();
        let ovs = self.conns.ovs().ok_or(ConvergeError::NotReady("ovsdb-server is not connected"))?;
        self.converge_ports(&ovs, &mut pass).await?;
        Ok(pass)
    }

    async fn converge_ports(&mut self, ovs: &Ovs, pass: &mut Pass) -> Result<(), ConvergeError> {
        let cfg = self.cfg.clone();
        let base = self.state.lock().effective().map(base_spec).unwrap_or_default();
        if !self.base_ready || base != self.base {
            let pod_ports = self.state.lock().effective().map(|s| s.pods.iter().map(|p| p.host_veth.clone()).collect()).unwrap_or_default();
            let takeover = match &self.datapath {
                // The first time: what the flags allow.
                None => ports::Takeover {
                    datapath: cfg.bridge.datapath_type.map(|d| d.as_str().to_string()),
                    change_datapath: cfg.bridge.change_datapath_type,
                    take_ports: cfg.bridge.take_ports_from_other_bridges,
                    pod_ports,
                },
                // Later (a new connection, a repair): the bridge as this run found or made it.
                Some(d) => ports::Takeover { datapath: Some(d.clone()), change_datapath: true, take_ports: cfg.bridge.take_ports_from_other_bridges, pod_ports },
            };
            let datapath = ports::ensure_base(ovs, cfg.bridge.name(), &takeover, base, cfg.bridge.port_timeout).await?;
            self.datapath = Some(datapath);
            self.base = base;
            self.base_ready = true;
            // tun0 may have been created just now (a new or repaired bridge): its address,
            // routes and the rest are the host executor's, which looks again at once.
            self.host_kick.kick();
            if let Some(g) = ovs.bridge_external_ids(cfg.bridge.name()).await?.get(GENERATION_KEY).and_then(|g| g.parse::<u32>().ok()) {
                if self.stored_generation.is_none() {
                    self.generation = g & 0xff_ffff;
                }
            }
        }
        if std::mem::take(&mut self.restore_generation) {
            if let Some(g) = self.stored_generation {
                if let Err(e) = ovs.set_bridge_external_id(cfg.bridge.name(), GENERATION_KEY, &g.to_string()).await {
                    self.restore_generation = true;
                    return Err(e.into());
                }
                info!(generation = g, "flow generation stored on the bridge again");
            }
        }
        if !self.recovered {
            self.recover_api_pods(ovs).await?;
        }
        let verify = std::mem::take(&mut self.verify_ports);
        let r = self.reconcile_pod_ports(ovs, verify, pass).await;
        if r.is_err() {
            self.verify_ports = true;
        } else {
            self.ports_ready = true;
            if self.conns.engine().is_none() {
                if let Some(sw) = self.pending_switch.take() {
                    let metrics = Some(self.telemetry.metrics.clone());
                    let flush = self.count_flush.get().cloned();
                    self.conns.set_engine(Engine::start_counting(sw, self.generation, metrics, flush));
                }
            }
        }
        r
    }

    /// Rebuilds the API pod registry from the ports that carry their request and the agent's
    /// checkpoint, checked against the kernel ([`recovery`]).
    async fn recover_api_pods(&mut self, ovs: &Ovs) -> Result<(), ConvergeError> {
        let mut pods = Vec::new();
        for (port, json) in ovs.ports_with_external_id(POD_KEY).await? {
            let parsed = PodRecord::from_json(&json)
                .and_then(|r| r.to_pod().map(|p| (p, r)).map_err(|p| p.to_string()));
            match parsed {
                Ok(pr) => pods.push(pr),
                Err(e) => warn!(%port, error = %e, "ignoring an unreadable pod record on a port"),
            }
        }
        crate::pod::recovery::recover(&self.pods, pods).await.map_err(ConvergeError::Recovery)?;
        self.recovered = true;
        Ok(())
    }

    /// Makes the bridge's pod ports match the model: removes ports nobody wants (pods gone,
    /// torn down, or left by a previous run), adds missing ones (waiting for their ofports),
    /// sets bandwidth where it changed. With `verify_all` every port is checked again. A pod
    /// whose port fails is reported and has no ofport (so no flows).
    async fn reconcile_pod_ports(&mut self, ovs: &Ovs, verify_all: bool, pass: &mut Pass) -> Result<(), ConvergeError> {
        use futures::StreamExt;
        let bridge = self.cfg.bridge.name().to_string();
        let timeout = self.cfg.bridge.port_timeout;
        // Ports on the bridge that nobody wants.
        let listed = ovs.list_ports(&bridge).await?;
        let wanted = |port: &str| self.state.lock().keep_ports().contains(port) || self.spares.owns(port);
        for port in listed.iter() {
            if wanted(port) {
                continue;
            }
            // Check again under the port's lock: a request may have claimed it meanwhile.
            let _g = self.locks.lock(port).await;
            if wanted(port) {
                continue;
            }
            ports::remove_port(ovs, &bridge, port).await?;
            pass.ports_removed += 1;
            info!(%port, "port removed from the bridge (no pod wants it)");
        }
        // Known ports of pods that are gone or whose port changed: forget them.
        let stale: Vec<_> = {
            let m = self.state.lock();
            let wanted: std::collections::HashMap<_, _> = m.wanted_pods().into_iter().map(|p| (p.key(), p)).collect();
            m.ports()
                .iter()
                .filter(|(k, s)| wanted.get(*k).is_none_or(|p| p.host_veth != s.host_veth || p.internal != s.internal))
                .map(|(k, _)| k.clone())
                .collect()
        };
        for k in stale {
            self.state.lock().forget_port(&k);
        }
        // Source pods (and recovered API pods) to add or check. Reserved pods belong to their
        // request.
        let repair = std::mem::take(&mut self.repair_pods);
        let todo: Vec<(crate::cluster::Pod, Option<String>)> = {
            let m = self.state.lock();
            let st = m.effective().map(|s| s.pods.clone()).unwrap_or_default();
            st.into_iter()
                .filter(|p| {
                    verify_all
                        || repair.contains(&p.key())
                        || m.ports().get(&p.key()).is_none_or(|s| s.bandwidth != (p.ingress_bps, p.egress_bps))
                })
                // An API pod's port carries its record, so that a port put back after someone
                // removed it (or the record) is still known after a restart. A port that is
                // there and not under repair keeps the record it has (no write per pod).
                .map(|p| {
                    let rewrite = repair.contains(&p.key()) || !listed.contains(&p.host_veth);
                    let record = m.api_pod(&p.key()).filter(|_| rewrite).map(|(_, req)| req.to_json());
                    (p, record)
                })
                .collect()
        };
        let (locks, state) = (&self.locks, &self.state);
        let bridge = bridge.as_str();
        let take = self.cfg.bridge.take_ports_from_other_bridges;
        let futs: Vec<_> = todo
            .into_iter()
            .map(|(p, record)| async move {
                let _g = locks.lock(&p.host_veth).await;
                // Torn down meanwhile: leave it to the next pass.
                if !state.lock().effective().is_some_and(|s| s.pods.iter().any(|q| q == &p)) {
                    return (p, None);
                }
                let r = ports::add_pod_port(ovs, bridge, &p, record.as_deref().map(|r| (POD_KEY, r)), timeout, take).await;
                (p, Some(r))
            })
            .collect();
        let results: Vec<_> = futures::stream::iter(futs).buffer_unordered(16).collect().await;
        for (p, r) in results {
            match r {
                None => {}
                Some(Ok(ofport)) => {
                    if !listed.contains(&p.host_veth) {
                        pass.ports_added += 1;
                    }
                    self.state.lock().set_port(
                        p.key(),
                        PortState { host_veth: p.host_veth.clone(), internal: p.internal, ofport, bandwidth: (p.ingress_bps, p.egress_bps) },
                    );
                }
                Some(Err(e)) if e.is_disconnect() || matches!(e, OvsdbError::Timeout(_)) => return Err(e.into()),
                Some(Err(e)) => {
                    self.state.lock().forget_port(&p.key());
                    let pr = Problem::new(format!("pod {}/{}", p.namespace, p.name), "hostVeth", format!("{:?}: {e}", p.host_veth));
                    warn!("rejected: {pr}");
                    pass.problems.push(pr);
                }
            }
        }
        Ok(())
    }

    /// Commits the flows of `owners` alone, recomputed from the model (a source that named what
    /// it changed: one Service among thousands costs that Service's flows, not a full diff).
    /// False if that is not possible now (not synced, engine busy, commit failed): the caller
    /// then converges fully.
    pub async fn update_owners(&mut self, owners: &[crate::store::Owner]) -> bool {
        let Some(engine) = self.conns.engine_ready() else { return false };
        if self.resync_pending {
            return false;
        }
        let realization = &self.telemetry.metrics.realization;
        let (rx, ticket) = {
            let m = self.state.lock();
            let Some((update, problems, warnings)) = m.owners_update(owners) else { return false };
            let ticket = realization.ticket(Some(&crate::realize::policy_namespaces(owners)));
            for p in &problems {
                self.telemetry.metrics.reject(&p.object);
                warn!("rejected: {p}");
            }
            for w in &warnings {
                warn!("{w}");
            }
            match engine.submit_policy_update(update, crate::engine::OnFailure::Keep) {
                Ok(rx) => (rx, ticket),
                Err(_) => return false,
            }
        };
        match rx.await {
            Ok(Ok(o)) => {
                realization.realized(ticket);
                if o.flow_mods() > 0 {
                    info!(owners = owners.len(), adds = o.adds, modifies = o.modifies, deletes = o.deletes, "flows converged (incremental)");
                }
                true
            }
            _ => false,
        }
    }

    /// Commits the model's desired flows (a resync from a dump first after a new connection).
    async fn converge_flows(&mut self, pass: &mut Pass) -> Result<Outcome, ConvergeError> {
        if !self.ports_ready {
            return Err(ConvergeError::NotReady("pod ports are not known yet"));
        }
        let Some(engine) = self.conns.engine() else {
            return Err(ConvergeError::NotReady("the switch is not connected"));
        };
        let resync = self.resync_pending;
        let (rx, ticket) = {
            let m = self.state.lock();
            let Some((desired, problems, warnings)) = m.desired() else {
                return Err(ConvergeError::NotReady("no cluster state yet"));
            };
            if let Some(st) = m.effective() {
                self.telemetry.metrics.set_pod_addresses(&st.pods);
            }
            pass.problems.extend(problems);
            pass.warnings.extend(warnings);
            pass.flows_version = m.version;
            // Every policy's flows are in a full desired state.
            let ticket = self.telemetry.metrics.realization.ticket(None);
            (engine.submit_replace(desired, resync)?, ticket)
        };
        let outcome = rx.await.map_err(|_| EngineError::Stopped)??;
        self.telemetry.metrics.realization.realized(ticket);
        if resync {
            self.resync_pending = false;
            self.conns.set_flows_ready(true);
        }
        if !self.conflist_written {
            self.write_conflist();
        }
        if outcome.flow_mods() > 0 || resync {
            info!(adds = outcome.adds, modifies = outcome.modifies, deletes = outcome.deletes, full_replay = outcome.full_replay, resync, "flows converged");
        }
        if outcome.full_replay {
            self.persist_generation(&engine).await;
        } else if resync {
            if let Some(ovs) = self.conns.ovs() {
                end_flow_restore_wait(&ovs).await;
            }
        }
        if let Ok(s) = engine.status().await {
            self.telemetry.metrics.set_flows_per_table(&s.flows_per_table);
        }
        Ok(outcome)
    }

    /// Stores the generation after a full replay (so a later restore of older flows is
    /// recognised as stale) and ends OVS's flow-restore-wait if it was set for a planned
    /// restart.
    async fn persist_generation(&mut self, engine: &Engine) {
        let Ok(status) = engine.status().await else { return };
        self.generation = status.generation;
        self.stored_generation = Some(status.generation);
        let Some(ovs) = self.conns.ovs() else {
            self.restore_generation = true;
            return;
        };
        if let Err(e) = ovs.set_bridge_external_id(self.cfg.bridge.name(), GENERATION_KEY, &status.generation.to_string()).await {
            self.restore_generation = true;
            warn!(error = %e, "could not store the flow generation; will retry");
        }
        end_flow_restore_wait(&ovs).await;
    }

    /// IPAM's GC pass: a CNI pod whose sandbox (network namespace) no longer exists lost its
    /// container without a DEL; it is torn down like a DEL would (flows, port, veth, address).
    /// True if any was found (the caller converges).
    pub fn collect_dead_sandboxes(&mut self) -> bool {
        let dead: Vec<_> = self.state.lock().cni_sandboxes().into_iter().filter(|(_, ns)| !std::path::Path::new(ns).exists()).collect();
        let mut m = self.state.lock();
        for (k, ns) in &dead {
            if m.tear_down(k).is_some() {
                info!(pod = %format!("{}/{}", k.0, k.1), netns = %ns, "the pod's sandbox is gone without a DEL; releasing its address, port and flows");
            }
        }
        !dead.is_empty()
    }

    /// Repairs a dirty engine (a failed commit left the switch's state unknown).
    pub async fn repair(&mut self) {
        let Some(engine) = self.conns.engine() else { return };
        match engine.status().await {
            Ok(s) if s.dirty => self.resync_from_dump(&engine).await,
            _ => {}
        }
    }

    /// Makes the switch equal to the engine's desired state again from a dump of what it holds
    /// (a failed commit, or flows changed behind the agent's back); a full replay stores the
    /// new generation.
    async fn resync_from_dump(&mut self, engine: &Engine) {
        self.telemetry.not_converged();
        match engine.resync(None).await {
            Ok(o) => {
                info!(adds = o.adds, modifies = o.modifies, deletes = o.deletes, full_replay = o.full_replay, "repaired from a dump");
                if o.full_replay {
                    self.persist_generation(engine).await;
                }
            }
            Err(e) => warn!(error = %e, "repair failed; will retry"),
        }
        // A pass confirms (or completes) the repair and says converged again.
        self.kick.kick();
    }

    /// Tells the kubelet the network is ready: writes `80-sdn-node.conflist` (naming the pod API
    /// socket) into the CNI configuration directory, once pods can be served.
    fn write_conflist(&mut self) {
        let (Some(dir), Some(sock)) = (&self.cfg.cni_conf_dir, &self.cfg.api_socket) else {
            self.conflist_written = true;
            return;
        };
        match sdn_node_cni::write_conflist(dir, sock) {
            Ok(path) => {
                info!(path = %path.display(), "CNI network configuration written");
                self.conflist_written = true;
            }
            Err(e) => warn!(dir = %dir.display(), error = %e, "could not write the CNI network configuration; will retry"),
        }
    }

    pub fn generation(&self) -> u32 {
        self.generation
    }
}

async fn end_flow_restore_wait(ovs: &Ovs) {
    match ovs.flow_restore_wait().await {
        Ok(true) => match ovs.clear_flow_restore_wait().await {
            Ok(()) => info!("flows restored; cleared other_config:flow-restore-wait"),
            Err(e) => warn!(error = %e, "could not clear flow-restore-wait"),
        },
        Ok(false) => {}
        Err(e) => warn!(error = %e, "could not read flow-restore-wait"),
    }
}
