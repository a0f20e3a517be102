//! The reconciler: one model, one converge path, for `run` (converge forever) and `apply`
//! (converge once).
//!
//! ```text
//! source (file / kube) ─┐
//! pod API / CNI ────────┼─► Model ──► desired flows ──► Engine (diff, one bundle) ──► switch
//! DNS answers ──────────┘      └────► wanted ports ───► OVSDB ─────────────────────► ovsdb-server
//! ```
//!
//! The model lives behind a lock that is never held across I/O. Desired flows are computed
//! from it and queued to the engine *under that lock*, so the engine applies them in model
//! order: a full replacement computed before a pod's setup can never land after it and undo
//! it. Pod requests ([`pods`]) run concurrently with each other and with the reconcile loop;
//! their flow changes are group-committed by the engine, their port operations serialised per
//! port name ([`ports::PortLocks`]). Every peer call has a deadline.

pub mod checkpoint;
pub mod cni;
pub mod dns;
mod error;
pub mod host;
pub mod hostport;
pub mod model;
pub mod pods;
pub mod ports;
pub mod record;
pub mod recovery;
pub mod repair;
pub mod spares;
pub mod teardown;
mod undo;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tracing::{info, warn};

pub use error::PodError;
use record::PodRecord;
use crate::cluster::Problem;
use crate::engine::{Engine, EngineError, Outcome};
use crate::metrics::{Executor, Telemetry};
use crate::options::{self, Bridge};
use crate::ovsdb::{Ovs, OvsdbError};
use crate::switch::Switch;
use model::{Model, PortState};

/// Bridge `external_ids` key holding the flow generation written into cookies.
pub const GENERATION_KEY: &str = "sdn-node-generation";

/// The Port `external_ids` key holding the pod API request that created the port: the agent
/// rebuilds its pod registry from it after a restart (as openshift-sdn recovers pods from the
/// table-20 notes).
pub const POD_KEY: &str = "sdn-node-pod";

/// What the reconciler and the pod requests need to know of the node: the bridge, the pod
/// path's deadlines and where the pod API is announced. One option group of `sdn-node run`
/// (flattened into [`crate::run::RunOptions`]); `apply` sets the bridge only.
#[derive(clap::Args, Clone, Debug)]
pub struct Config {
    #[command(flatten)]
    pub bridge: Bridge,
    /// Deadline of one pod API request, in seconds (answered 504 when it passes, with
    /// nothing of the request left behind).
    #[arg(long, default_value = "30", value_parser = options::seconds)]
    pub request_timeout: Duration,
    /// Leave the node's own networking alone (tun0 address and routes, sysctls, the
    /// nftables NAT/filter table); the dummy datapath never touches it.
    // `host_network`: configured, as openshift-sdn's SetupSDN does, unless the flag is given;
    // never for the dummy datapath, whose ports are not real devices.
    #[arg(long = "no-host-network", action = clap::ArgAction::SetFalse)]
    pub host_network: bool,
    /// Where the CNI network configuration (80-sdn-node.conflist) is written once the agent
    /// serves pods; `none` disables it.
    #[arg(long, default_value = "/etc/cni/net.d", value_parser = options::path_or_none)]
    pub cni_conf_dir: std::option::Option<std::path::PathBuf>,
    /// The pod API's unix socket (HTTP/JSON, mode 0600); `none` disables it.
    // Also named in the CNI network configuration.
    #[arg(long = "pod-api-socket", value_name = "POD_API_SOCKET", default_value = options::DEFAULT_SOCKET, value_parser = options::path_or_none)]
    pub api_socket: std::option::Option<std::path::PathBuf>,
    /// Pod interfaces kept ready on the bridge, so that a CNI ADD moves one into the pod
    /// instead of waiting for ovs-vswitchd to add a port (the slow part of an ADD; see
    /// docs/pods.md, "Warm ports"). Refilled in the background after ADDs; 0 disables them.
    // See `spares`.
    #[arg(long, default_value_t = 0)]
    pub warm_ports: usize,
    /// Take a warm port whenever one is ready, even while adding a port is measured to be
    /// cheaper than moving one (for tests of the warm path on small bridges).
    #[arg(long, hide = true)]
    pub warm_ports_always: bool,
    /// The NetworkPolicy audit log (off: no policy flow copies packets to the agent); set
    /// from `run`'s audit options.
    #[arg(skip)]
    pub audit: crate::cluster::netpol::NodeAudit,
}

impl Default for Config {
    /// The command line's defaults, without the host's paths: no pod API socket and no CNI
    /// configuration written (a library user names its own).
    fn default() -> Self {
        Config { cni_conf_dir: None, api_socket: None, ..options::defaults() }
    }
}

/// What the pod requests and the reconcile loop share.
pub struct Node {
    pub cfg: Config,
    pub telemetry: Telemetry,
    model: Mutex<Model>,
    ovs: Mutex<Option<Ovs>>,
    engine: Mutex<Option<Engine>>,
    /// Pod flows may be committed incrementally: ports are known and the switch was resynced.
    flows_ready: AtomicBool,
    pub locks: ports::PortLocks,
    /// Warm ports for CNI ADDs.
    pub spares: spares::Spares,
    /// Wakes the reconcile loop (something is left to clean up or converge).
    kick: Notify,
    /// The agent's own durable record of its pods (`--state-dir`).
    pub checkpoint: checkpoint::Checkpoint,
    /// What the host executor converges the node's own networking to ([`host`]).
    host_plan: watch::Sender<Option<host::HostPlan>>,
    /// Wakes the host executor (tun0 was just created again).
    host_kick: Notify,
    /// Set when the per-policy counters are on: engines started from then flush the datapath's
    /// counts before a policy change removes counting flows.
    pub count_flush: std::sync::OnceLock<crate::engine::CountFlush>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Node {
    /// The pod at `ip` (`namespace/name`), for the audit log.
    pub fn pod_at(&self, ip: std::net::Ipv4Addr) -> Option<String> {
        lock(&self.model).pod_at(ip)
    }

    /// The node's name in the current cluster state (the state file's `node:`), if any.
    pub fn node_name(&self) -> Option<String> {
        lock(&self.model).effective().map(|s| s.node.clone())
    }

    pub fn new(cfg: Config, telemetry: Telemetry) -> Arc<Node> {
        Node::with_checkpoint(cfg, telemetry, checkpoint::Checkpoint::none())
    }

    /// [`Node::new`] with a checkpoint (opened, and read, before the node serves anything).
    pub fn with_checkpoint(cfg: Config, telemetry: Telemetry, checkpoint: checkpoint::Checkpoint) -> Arc<Node> {
        Arc::new(Node {
            checkpoint,
            model: Mutex::new(Model::with_audit(cfg.bridge.name(), cfg.audit)),
            spares: spares::Spares::new(cfg.warm_ports, cfg.warm_ports_always),
            cfg,
            telemetry,
            ovs: Mutex::new(None),
            engine: Mutex::new(None),
            flows_ready: AtomicBool::new(false),
            locks: ports::PortLocks::default(),
            kick: Notify::new(),
            host_plan: watch::Sender::new(None),
            host_kick: Notify::new(),
            count_flush: std::sync::OnceLock::new(),
        })
    }

    /// Whether this node configures its own networking (never on the dummy datapath, whose
    /// ports are not devices).
    pub fn manages_host(&self) -> bool {
        self.cfg.host_network && self.cfg.bridge.datapath_type != Some(crate::options::DatapathType::Dummy)
    }

    /// The host executor's plans (see [`host::run`]).
    pub fn host_plans(&self) -> watch::Receiver<Option<host::HostPlan>> {
        self.host_plan.subscribe()
    }

    /// Publishes the model's host plan to the host executor (if it changed).
    fn publish_host_plan(&self) {
        if !self.manages_host() {
            return;
        }
        let plan = self.model().effective().and_then(host::plan);
        self.host_plan.send_if_modified(|p| {
            let changed = *p != plan;
            if changed {
                *p = plan;
            }
            changed
        });
    }

    pub fn host_kick(&self) {
        self.host_kick.notify_one();
    }

    pub async fn host_kicked(&self) {
        self.host_kick.notified().await
    }

    /// The model, for a short synchronous look or change (never across an await).
    pub fn model(&self) -> MutexGuard<'_, Model> {
        lock(&self.model)
    }

    /// The live OVSDB connection, if any.
    pub fn ovs(&self) -> Option<Ovs> {
        lock(&self.ovs).clone().filter(|o| !o.client().is_closed())
    }

    pub fn set_ovs(&self, ovs: Option<Ovs>) {
        self.telemetry.health.ovsdb.store(ovs.is_some(), Ordering::Relaxed);
        self.telemetry.metrics.set_connected("ovsdb", ovs.is_some());
        *lock(&self.ovs) = ovs;
    }

    /// The engine, when pod flows can be committed incrementally.
    pub fn engine_ready(&self) -> Option<Engine> {
        if !self.flows_ready.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.engine).clone()
    }

    pub fn engine(&self) -> Option<Engine> {
        lock(&self.engine).clone()
    }

    pub fn kick(&self) {
        self.kick.notify_one();
    }

    /// Resolves when [`Node::kick`] was called.
    pub async fn kicked(&self) {
        self.kick.notified().await
    }

    pub fn not_converged(&self) {
        self.telemetry.health.converged.store(false, Ordering::Relaxed);
    }
}

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
        (crate::model::Plugin::NetworkPolicy, Some(local)) => {
            Some(crate::pipeline::via_host::tun0_mac(crate::pipeline::gateway(local.subnet)))
        }
        _ => None,
    };
    ports::BaseSpec { vxlan_port: st.vxlan_port, tun_mac }
}

/// The converge loop's own state: what it has established on the current connections.
pub struct Reconciler {
    pub node: Arc<Node>,
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
    pub fn new(node: Arc<Node>) -> Reconciler {
        Reconciler {
            node,
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

    /// A new (or lost) OVSDB connection.
    pub fn ovsdb_changed(&mut self, ovs: Option<Ovs>) {
        if ovs.is_some() {
            self.telemetry_reconnect("ovsdb");
        }
        self.node.set_ovs(ovs);
        self.base_ready = false;
        self.verify_ports = true;
    }

    /// What OVSDB must hold, from the model and what this run established.
    fn expected(&self) -> repair::Expected {
        let m = self.node.model();
        let pods = m
            .ports()
            .iter()
            .map(|(k, ps)| (k.clone(), (ps.clone(), m.api_pod(k).map(|(_, req)| req.to_json()))))
            .collect();
        repair::Expected {
            bridge: self.node.cfg.bridge.name().to_string(),
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
            self.node.telemetry.metrics.repaired(f.what());
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
            self.node.not_converged();
        }
        !found.is_empty()
    }

    /// Whether the switch still holds as many flows as the engine installed (one small
    /// OFPMP_AGGREGATE reply): `ovs-ofctl del-flows` or `add-flow` by someone else changes the
    /// count, and the engine then resyncs from a dump. The installed count is read before and
    /// after, so a commit landing in between is not taken for tampering.
    pub async fn check_flows(&mut self, sw: &Switch) {
        let Some(engine) = self.node.engine_ready() else { return };
        let Ok(before) = engine.status().await else { return };
        if before.dirty {
            return;
        }
        let Ok(agg) = sw.aggregate(openflow::FlowStatsRequest::default()).await else { return };
        let Ok(after) = engine.status().await else { return };
        if before.installed_flows != after.installed_flows || agg.flow_count as usize == after.installed_flows {
            return;
        }
        self.node.telemetry.metrics.repaired("flows");
        warn!(switch = agg.flow_count, installed = after.installed_flows, "the switch's flows changed behind the agent's back; resyncing from a dump");
        self.resync_from_dump(&engine).await;
        self.node.kick();
    }

    fn telemetry_reconnect(&self, target: &str) {
        self.node.telemetry.metrics.reconnects.get_or_create(&crate::metrics::TargetLabel { target: target.into() }).inc();
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
                self.node.model().refresh_ofports(&ports);
            }
            Err(e) => {
                warn!(error = %e, "could not read the switch's ports; checking every pod port again");
                self.verify_ports = true;
            }
        }
        self.node.flows_ready.store(false, Ordering::Release);
        let engine = self.node.engine();
        match engine {
            Some(e) => {
                let _ = e.set_switch(sw).await;
            }
            None => self.pending_switch = Some(sw),
        }
        self.resync_pending = true;
        self.node.not_converged();
    }

    pub fn switch_lost(&mut self) {
        self.node.flows_ready.store(false, Ordering::Release);
        self.node.not_converged();
    }

    /// One pass: ports (if OVSDB is up), then flows (if the switch is up and ports are known).
    pub async fn converge(&mut self) -> Result<Pass, ConvergeError> {
        let mut pass = Pass::default();
        if !self.node.model().has_state() {
            return Err(ConvergeError::NotReady("no cluster state yet"));
        }
        let doomed: Vec<_> = {
            let m = self.node.model();
            m.doomed_pods().into_iter().filter_map(|p| m.doomed(&p.key()).cloned()).collect()
        };
        self.node.publish_host_plan();
        let ovs = self.node.ovs();
        let ports_result = match &ovs {
            Some(ovs) => self.converge_ports(ovs, &mut pass).await,
            None => Err(ConvergeError::NotReady("ovsdb-server is not connected")),
        };
        if !matches!(ports_result, Err(ConvergeError::NotReady(_))) {
            self.node.telemetry.executor_result(Executor::Ovsdb, &ports_result);
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
            self.node.telemetry.executor_result(Executor::Flows, &flows.as_ref().map(|_| ()));
        }
        pass.outcome = flows?;
        ports_result?;
        // Pods doomed before this pass: their ports are gone (the pass removed every unwanted
        // port) and their flows are off the switch (it committed a model without them).
        for (p, req) in doomed {
            // The interface the agent created for a CNI pod goes too.
            if req.cni.is_some() {
                if let Err(e) = teardown::remove_pod_iface(&req).await {
                    warn!(pod = %format!("{}/{}", p.namespace, p.name), error = %e, "could not remove a torn-down pod's interface; will retry");
                    continue;
                }
            }
            self.node.model().buried(&p.key());
        }
        // Converged if the switch holds the flows of the model as it is now. The pass itself
        // moves the model on (a port it added has its ofport now, a port it removed is
        // forgotten), and a pod request may have changed it meanwhile: the flows are the
        // model's as of when they were computed, after the ports. If the model moved past them,
        // one more pass commits the difference (usually nothing) and says converged then;
        // nothing else would start it.
        if self.node.model().version == pass.flows_version {
            self.node.telemetry.health.converged.store(true, Ordering::Relaxed);
        } else {
            self.node.not_converged();
            self.node.kick();
        }
        Ok(pass)
    }

    /// The ports part of a pass alone (before the switch is connected: `apply` needs the
    /// bridge before it can connect to it).
    pub async fn prepare(&mut self) -> Result<Pass, ConvergeError> {
        let mut pass = Pass::default();
        let ovs = self.node.ovs().ok_or(ConvergeError::NotReady("ovsdb-server is not connected"))?;
        self.converge_ports(&ovs, &mut pass).await?;
        Ok(pass)
    }

    async fn converge_ports(&mut self, ovs: &Ovs, pass: &mut Pass) -> Result<(), ConvergeError> {
        let cfg = self.node.cfg.clone();
        let base = self.node.model().effective().map(base_spec).unwrap_or_default();
        if !self.base_ready || base != self.base {
            let pod_ports = self.node.model().effective().map(|s| s.pods.iter().map(|p| p.host_veth.clone()).collect()).unwrap_or_default();
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
            self.node.host_kick();
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
            if self.node.engine().is_none() {
                if let Some(sw) = self.pending_switch.take() {
                    let metrics = Some(self.node.telemetry.metrics.clone());
                    let flush = self.node.count_flush.get().cloned();
                    *lock(&self.node.engine) = Some(Engine::start_counting(sw, self.generation, metrics, flush));
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
        recovery::recover(&self.node, pods).await.map_err(ConvergeError::Recovery)?;
        self.recovered = true;
        Ok(())
    }

    /// Makes the bridge's pod ports match the model: removes ports nobody wants (pods gone,
    /// torn down, or left by a previous run), adds missing ones (waiting for their ofports),
    /// sets bandwidth where it changed. With `verify_all` every port is checked again. A pod
    /// whose port fails is reported and has no ofport (so no flows).
    async fn reconcile_pod_ports(&mut self, ovs: &Ovs, verify_all: bool, pass: &mut Pass) -> Result<(), ConvergeError> {
        use futures::StreamExt;
        let bridge = self.node.cfg.bridge.name().to_string();
        let timeout = self.node.cfg.bridge.port_timeout;
        // Ports on the bridge that nobody wants.
        let listed = ovs.list_ports(&bridge).await?;
        let wanted = |port: &str| self.node.model().keep_ports().contains(port) || self.node.spares.owns(port);
        for port in listed.iter() {
            if wanted(port) {
                continue;
            }
            // Check again under the port's lock: a request may have claimed it meanwhile.
            let _g = self.node.locks.lock(port).await;
            if wanted(port) {
                continue;
            }
            ports::remove_port(ovs, &bridge, port).await?;
            pass.ports_removed += 1;
            info!(%port, "port removed from the bridge (no pod wants it)");
        }
        // Known ports of pods that are gone or whose port changed: forget them.
        let stale: Vec<_> = {
            let m = self.node.model();
            let wanted: std::collections::HashMap<_, _> = m.wanted_pods().into_iter().map(|p| (p.key(), p)).collect();
            m.ports()
                .iter()
                .filter(|(k, s)| wanted.get(*k).is_none_or(|p| p.host_veth != s.host_veth || p.internal != s.internal))
                .map(|(k, _)| k.clone())
                .collect()
        };
        for k in stale {
            self.node.model().forget_port(&k);
        }
        // Source pods (and recovered API pods) to add or check. Reserved pods belong to their
        // request.
        let repair = std::mem::take(&mut self.repair_pods);
        let todo: Vec<(crate::cluster::Pod, Option<String>)> = {
            let m = self.node.model();
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
        let node = &self.node;
        let bridge = bridge.as_str();
        let take = node.cfg.bridge.take_ports_from_other_bridges;
        let futs: Vec<_> = todo
            .into_iter()
            .map(|(p, record)| async move {
                let _g = node.locks.lock(&p.host_veth).await;
                // Torn down meanwhile: leave it to the next pass.
                if !node.model().effective().is_some_and(|s| s.pods.iter().any(|q| q == &p)) {
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
                    self.node.model().set_port(
                        p.key(),
                        PortState { host_veth: p.host_veth.clone(), internal: p.internal, ofport, bandwidth: (p.ingress_bps, p.egress_bps) },
                    );
                }
                Some(Err(e)) if e.is_disconnect() || matches!(e, OvsdbError::Timeout(_)) => return Err(e.into()),
                Some(Err(e)) => {
                    self.node.model().forget_port(&p.key());
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
        let Some(engine) = self.node.engine_ready() else { return false };
        if self.resync_pending {
            return false;
        }
        let realization = &self.node.telemetry.metrics.realization;
        let (rx, ticket) = {
            let m = self.node.model();
            let Some((update, problems, warnings)) = m.owners_update(owners) else { return false };
            let ticket = realization.ticket(Some(&crate::realize::policy_namespaces(owners)));
            for p in &problems {
                self.node.telemetry.metrics.reject(&p.object);
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
        let Some(engine) = self.node.engine() else {
            return Err(ConvergeError::NotReady("the switch is not connected"));
        };
        let resync = self.resync_pending;
        let (rx, ticket) = {
            let m = self.node.model();
            let Some((desired, problems, warnings)) = m.desired() else {
                return Err(ConvergeError::NotReady("no cluster state yet"));
            };
            pass.problems.extend(problems);
            pass.warnings.extend(warnings);
            pass.flows_version = m.version;
            // Every policy's flows are in a full desired state.
            let ticket = self.node.telemetry.metrics.realization.ticket(None);
            (engine.submit_replace(desired, resync)?, ticket)
        };
        let outcome = rx.await.map_err(|_| EngineError::Stopped)??;
        self.node.telemetry.metrics.realization.realized(ticket);
        if resync {
            self.resync_pending = false;
            self.node.flows_ready.store(true, Ordering::Release);
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
            if let Some(ovs) = self.node.ovs() {
                end_flow_restore_wait(&ovs).await;
            }
        }
        if let Ok(s) = engine.status().await {
            self.node.telemetry.metrics.set_flows_per_table(&s.flows_per_table);
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
        let Some(ovs) = self.node.ovs() else {
            self.restore_generation = true;
            return;
        };
        if let Err(e) = ovs.set_bridge_external_id(self.node.cfg.bridge.name(), GENERATION_KEY, &status.generation.to_string()).await {
            self.restore_generation = true;
            warn!(error = %e, "could not store the flow generation; will retry");
        }
        end_flow_restore_wait(&ovs).await;
    }

    /// IPAM's GC pass: a CNI pod whose sandbox (network namespace) no longer exists lost its
    /// container without a DEL; it is torn down like a DEL would (flows, port, veth, address).
    /// True if any was found (the caller converges).
    pub fn collect_dead_sandboxes(&mut self) -> bool {
        let dead: Vec<_> = self.node.model().cni_sandboxes().into_iter().filter(|(_, ns)| !std::path::Path::new(ns).exists()).collect();
        let mut m = self.node.model();
        for (k, ns) in &dead {
            if m.tear_down(k).is_some() {
                info!(pod = %format!("{}/{}", k.0, k.1), netns = %ns, "the pod's sandbox is gone without a DEL; releasing its address, port and flows");
            }
        }
        !dead.is_empty()
    }

    /// Repairs a dirty engine (a failed commit left the switch's state unknown).
    pub async fn repair(&mut self) {
        let Some(engine) = self.node.engine() else { return };
        match engine.status().await {
            Ok(s) if s.dirty => self.resync_from_dump(&engine).await,
            _ => {}
        }
    }

    /// Makes the switch equal to the engine's desired state again from a dump of what it holds
    /// (a failed commit, or flows changed behind the agent's back); a full replay stores the
    /// new generation.
    async fn resync_from_dump(&mut self, engine: &Engine) {
        self.node.not_converged();
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
        self.node.kick();
    }

    /// Tells the kubelet the network is ready: writes `80-sdn-node.conflist` (naming the pod API
    /// socket) into the CNI configuration directory, once pods can be served.
    fn write_conflist(&mut self) {
        let (Some(dir), Some(sock)) = (&self.node.cfg.cni_conf_dir, &self.node.cfg.api_socket) else {
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
