//! `sdn-node run`: keeps the switch equal to the cluster state for as long as it runs.
//!
//! One loop reacts to four things: a new state (the file changed), the OpenFlow connection
//! coming up (resync: the difference if the switch is current, a full replay if it is empty or
//! stale), the OVSDB connection coming up (re-ensure bridge, ports, QoS), and a repair tick (a
//! failed commit left the switch's state unknown). Every path converges by the same means:
//! ports through OVSDB, then desired flows diffed against the installed mirror, one bundle.

pub mod dns;
pub mod ports;
pub mod source;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::{self, ApiError, Command, PodRequest, SetupReply};
use crate::apply::GENERATION_KEY;
use crate::cluster::desired::{desired_state_with_warnings, pod_owner_flows, vnid_owner_flows};
use crate::cluster::{ClusterState, Pod, PodKey, Problem};
use crate::engine::Engine;
use crate::metrics::Telemetry;
use crate::ovsdb::{Ovs, OvsdbClient};
use crate::pipeline::egress::dns_names;
use crate::switch::{Backoff, SwitchEvent, SwitchOptions, Supervisor};
use ports::Ports;
use source::Loaded;

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub state: PathBuf,
    pub ovs_rundir: PathBuf,
    pub bridge: String,
    pub datapath_type: String,
    pub port_timeout: Duration,
    pub dns_timeout: Duration,
    pub switch: SwitchOptions,
    pub backoff: Backoff,
    /// How often a dirty engine (after a failed commit) is repaired from a dump.
    pub repair_interval: Duration,
    /// The pod API's unix socket (`None`: no pod API).
    pub api_socket: Option<PathBuf>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`None`: not served).
    pub metrics_addr: Option<SocketAddr>,
}

impl RunOptions {
    pub fn new(state: PathBuf, ovs_rundir: PathBuf) -> RunOptions {
        RunOptions {
            state,
            ovs_rundir,
            bridge: "br0".into(),
            datapath_type: "system".into(),
            port_timeout: Duration::from_secs(10),
            dns_timeout: Duration::from_secs(5),
            switch: SwitchOptions::default(),
            backoff: Backoff::default(),
            repair_interval: Duration::from_secs(2),
            api_socket: None,
            metrics_addr: None,
        }
    }
    fn db_socket(&self) -> String {
        format!("unix:{}", self.ovs_rundir.join("db.sock").display())
    }
    fn mgmt_socket(&self) -> String {
        format!("unix:{}", self.ovs_rundir.join(format!("{}.mgmt", self.bridge)).display())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Switch(#[from] crate::switch::SwitchError),
}

/// Keeps an OVSDB connection up; publishes the live one (`None` while down).
fn ovsdb_link(address: String, backoff: Backoff, cancel: CancellationToken) -> watch::Receiver<Option<Ovs>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let attempt = tokio::select! {
                _ = cancel.cancelled() => return,
                r = OvsdbClient::connect(&address) => r,
            };
            match attempt {
                Ok(client) => {
                    failures = 0;
                    info!(%address, "connected to ovsdb-server");
                    tx.send_replace(Some(Ovs::new(client.clone())));
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = client.closed() => {}
                    }
                    warn!(%address, "lost the ovsdb-server connection; reconnecting");
                    tx.send_replace(None);
                }
                Err(e) => {
                    let d = backoff.delay(failures);
                    if failures == 0 {
                        warn!(%address, error = %e, "cannot connect to ovsdb-server");
                    }
                    failures = failures.saturating_add(1);
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(d) => {}
                    }
                }
            }
        }
    });
    rx
}

/// The Port external_ids key holding the pod API request that created the port: the agent
/// rebuilds its pod registry from it after a restart (as openshift-sdn recovers pods from the
/// table-20 notes).
pub const POD_KEY: &str = "sdn-node-pod";

/// What the loop knows.
struct Agent {
    opts: RunOptions,
    telemetry: Telemetry,
    state: Option<Arc<Loaded>>,
    /// Pods set up through the pod API (with the request, to persist and list them).
    api_pods: BTreeMap<PodKey, (Pod, PodRequest)>,
    /// The API pods were recovered from OVSDB (once per run).
    api_recovered: bool,
    /// The source's state plus the API pods, validated together.
    effective: Option<ClusterState>,
    ovs: Option<Ovs>,
    /// The bridge and base ports were ensured on the current OVSDB connection.
    base_ready: bool,
    /// Every pod port must be checked again (new OVSDB connection).
    verify_ports: bool,
    ports: Ports,
    /// Pod ports were reconciled at least once in this run: until then the pods' ofports are
    /// unknown, and computing flows would remove every pod's flows (traffic!), so the switch is
    /// left alone.
    ports_ready: bool,
    engine: Option<Engine>,
    /// The first OpenFlow connection, until the flow generation stored on the bridge is known:
    /// an engine started before that would take the switch's current flows for stale ones
    /// and replace them all (see `reconcile`).
    pending_switch: Option<crate::switch::Switch>,
    dns: dns::Dns,
    /// A new OpenFlow connection waits for its resync (dump, then difference or full replay).
    resync_pending: bool,
    generation: u32,
}

impl Agent {
    /// Ports (if OVSDB is up), then flows (if the switch is up and ports are known).
    async fn reconcile(&mut self) {
        if self.state.is_none() {
            return;
        }
        if let Some(ovs) = self.ovs.clone() {
            if let Err(e) = self.reconcile_ports(&ovs).await {
                warn!(error = %e, "OVSDB: ports not reconciled; retrying on reconnect");
            }
        }
        if !self.ports_ready {
            return;
        }
        // Ports are known, so the generation was read from the bridge: start the engine.
        if self.engine.is_none() {
            if let Some(sw) = self.pending_switch.take() {
                self.engine =
                    Some(Engine::start_with_metrics(sw, self.generation, Some(self.telemetry.metrics.clone())));
            }
        }
        let Some(engine) = self.engine.clone() else { return };
        let Some(state) = self.effective.clone() else { return };
        let desired = self.desired(&state).await;
        let resync = std::mem::take(&mut self.resync_pending);
        let r = if resync { engine.resync(Some(desired)).await } else { engine.replace(desired).await };
        match r {
            Ok(o) => {
                if o.flow_mods() > 0 || resync {
                    info!(adds = o.adds, modifies = o.modifies, deletes = o.deletes, full_replay = o.full_replay, resync, "flows converged");
                }
                if o.full_replay {
                    self.persist_generation(&engine).await;
                } else if resync {
                    if let Some(ovs) = self.ovs.clone() {
                        self.end_flow_restore_wait(&ovs).await;
                    }
                }
                if let Ok(s) = engine.status().await {
                    self.telemetry.metrics.set_flows_per_table(&s.flows_per_table);
                }
                self.telemetry.health.converged.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                self.resync_pending |= resync;
                warn!(error = %e, "flows not converged; will repair");
            }
        }
    }

    /// Rebuilds the effective state: the source's, plus the API pods that fit in it.
    fn rebuild_effective(&mut self) {
        let Some(loaded) = self.state.clone() else { return };
        let mut st = loaded.state.clone();
        // Pods the source says are gone (Kubernetes relist) are torn down below by reconcile.
        if let Some(live) = &loaded.live_pods {
            let gone: Vec<PodKey> = self.api_pods.keys().filter(|k| !live.contains(*k)).cloned().collect();
            for k in gone {
                info!(pod = %format!("{}/{}", k.0, k.1), "pod no longer exists; tearing it down");
                self.api_pods.remove(&k);
            }
        }
        for (pod, _) in self.api_pods.values() {
            match st.check_pod(pod) {
                Ok(()) => {
                    st.pods.retain(|p| p.key() != pod.key());
                    st.pods.push(pod.clone());
                }
                Err(p) => {
                    self.telemetry.metrics.reject(&p.object);
                    warn!("rejected: {p}");
                }
            }
        }
        self.effective = Some(st);
    }

    async fn reconcile_ports(&mut self, ovs: &Ovs) -> Result<(), crate::ovsdb::OvsdbError> {
        if !self.api_recovered {
            self.recover_api_pods(ovs).await?;
        }
        let Some(state) = self.effective.clone() else { return Ok(()) };
        if !self.base_ready {
            ports::ensure_base(ovs, &self.opts.bridge, &self.opts.datapath_type, self.opts.port_timeout).await?;
            self.base_ready = true;
            if let Ok(ids) = ovs.bridge_external_ids(&self.opts.bridge).await {
                if let Some(g) = ids.get(GENERATION_KEY).and_then(|g| g.parse::<u32>().ok()) {
                    self.generation = g;
                }
            }
        }
        let verify = std::mem::take(&mut self.verify_ports);
        match self.ports.reconcile(ovs, &self.opts.bridge, &state, self.opts.port_timeout, verify).await {
            Ok(_) => {
                self.ports_ready = true;
                Ok(())
            }
            Err(e) => {
                self.verify_ports = true;
                Err(e)
            }
        }
    }

    /// Rebuilds the API pod registry from the ports that carry their request.
    async fn recover_api_pods(&mut self, ovs: &Ovs) -> Result<(), crate::ovsdb::OvsdbError> {
        for (port, json) in ovs.ports_with_external_id(POD_KEY).await? {
            let parsed = serde_json::from_str::<PodRequest>(&json).map_err(|e| e.to_string()).and_then(|r| {
                let pod = r.to_pod().map_err(|p| p.to_string())?;
                Ok((pod, r))
            });
            match parsed {
                Ok((pod, req)) => {
                    self.api_pods.entry(pod.key()).or_insert((pod, req));
                }
                Err(e) => warn!(%port, error = %e, "ignoring an unreadable pod record on a port"),
            }
        }
        self.api_recovered = true;
        if !self.api_pods.is_empty() {
            info!(pods = self.api_pods.len(), "pod API registry recovered from OVSDB");
        }
        self.rebuild_effective();
        Ok(())
    }

    async fn desired(&mut self, state: &ClusterState) -> crate::store::DesiredState {
        let dns = self.dns.answers(&dns_names(&state.egress_policies)).await;
        let (d, problems, warnings) = desired_state_with_warnings(state, &self.ports.ofports(), &dns);
        for p in &problems {
            self.telemetry.metrics.reject(&p.object);
            warn!("rejected: {p}");
        }
        for w in &warnings {
            if w.message.contains("DNS resolver failed") {
                self.telemetry.metrics.dns_failures.inc();
            }
            warn!("{w}");
        }
        d
    }

    /// Pod API: set a pod up; answers after its flows are committed.
    async fn api_setup(&mut self, pod: Pod, req: PodRequest) -> Result<SetupReply, ApiError> {
        let state = self.effective.clone().ok_or_else(|| ApiError::Unavailable("no cluster state yet".into()))?;
        state.check_pod(&pod).map_err(|p| {
            if p.message.contains("already used") {
                ApiError::Conflict(p)
            } else {
                ApiError::Invalid(p)
            }
        })?;
        let ovs = self.ovs.clone().ok_or_else(|| ApiError::Unavailable("ovsdb-server is not connected".into()))?;
        let engine = self.engine.clone().filter(|_| self.ports_ready && !self.resync_pending);
        let engine = engine.ok_or_else(|| ApiError::Unavailable("the switch is not connected or not synced yet".into()))?;
        let obj = format!("pod {}/{}", pod.namespace, pod.name);
        let ofport = match self.ports.ensure_one(&ovs, &self.opts.bridge, &pod, self.opts.port_timeout).await {
            Ok(p) => p,
            Err(e) if e.is_disconnect() => return Err(ApiError::Unavailable(e.to_string())),
            Err(e) => return Err(ApiError::Invalid(Problem::new(obj, "hostVeth", format!("{:?}: {e}", pod.host_veth)))),
        };
        let record = serde_json::to_string(&req).unwrap_or_default();
        if let Err(e) = ovs.set_port_external_id(&pod.host_veth, POD_KEY, Some(&record)).await {
            warn!(%obj, error = %e, "could not record the pod on its port (it will not survive an agent restart)");
        }
        self.api_pods.insert(pod.key(), (pod.clone(), req));
        // The pod was checked against the effective state above: add it in place (rebuilding
        // would re-check every API pod, O(pods²) per setup).
        if let Some(eff) = &mut self.effective {
            eff.pods.retain(|p| p.key() != pod.key());
            eff.pods.push(pod.clone());
        }
        self.update_pod_flows(&engine, &pod).await.map_err(|e| ApiError::Failed(e.to_string()))?;
        Ok(SetupReply { ofport })
    }

    /// The incremental change for one pod: its flows and its VNID's rule and multicast flows.
    async fn update_pod_flows(&self, engine: &Engine, pod: &Pod) -> Result<(), crate::engine::EngineError> {
        let Some(state) = &self.effective else { return Ok(()) };
        let ofports = self.ports.ofports();
        let mut update = vec![pod_owner_flows(state, &ofports, pod)];
        if let Some(vnid) = state.vnid_of(&pod.namespace) {
            update.extend(vnid_owner_flows(state, &ofports, vnid));
        }
        engine.update(update).await.map(|_| ())
    }

    /// Pod API: tear a pod down (flows first, then its port).
    async fn api_teardown(&mut self, namespace: String, name: String) -> Result<(), ApiError> {
        let key = (namespace, name);
        let Some((pod, _)) = self.api_pods.remove(&key) else {
            let in_source = self.state.as_ref().is_some_and(|l| l.state.pods.iter().any(|p| p.key() == key));
            return Err(if in_source {
                ApiError::Conflict(Problem::new(format!("pod {}/{}", key.0, key.1), "", "the pod comes from the cluster state, not from the pod API"))
            } else {
                ApiError::NotFound(format!("pod {}/{} was not set up through the pod API", key.0, key.1))
            });
        };
        if let Some(eff) = &mut self.effective {
            eff.pods.retain(|p| p.key() != key);
        }
        if let (Some(engine), Some(state)) = (self.engine.clone(), self.effective.clone()) {
            let ofports = self.ports.ofports();
            let mut update = vec![(crate::store::Owner::Pod { namespace: key.0.clone(), name: key.1.clone() }, vec![])];
            if let Some(vnid) = state.vnid_of(&pod.namespace) {
                let mut without = ofports.clone();
                without.remove(&key);
                update.extend(vnid_owner_flows(&state, &without, vnid));
            }
            if let Err(e) = engine.update(update).await {
                warn!(error = %e, "pod teardown: flows not removed yet; will repair");
            }
        }
        if let Some(ovs) = self.ovs.clone() {
            if let Err(e) = self.ports.remove_one(&ovs, &self.opts.bridge, &key).await {
                warn!(error = %e, "pod teardown: port not removed yet; will retry on reconcile");
            }
        }
        Ok(())
    }

    /// Stores the generation after a full replay (so a later restore of older flows is
    /// recognised as stale) and ends OVS's flow-restore-wait if it was set for a planned
    /// restart.
    async fn persist_generation(&mut self, engine: &Engine) {
        let Ok(status) = engine.status().await else { return };
        self.generation = status.generation;
        let Some(ovs) = self.ovs.clone() else { return };
        if let Err(e) = ovs.set_bridge_external_id(&self.opts.bridge, GENERATION_KEY, &status.generation.to_string()).await {
            warn!(error = %e, "could not store the flow generation");
        }
        self.end_flow_restore_wait(&ovs).await;
    }

    async fn end_flow_restore_wait(&self, ovs: &Ovs) {
        match ovs.flow_restore_wait().await {
            Ok(true) => match ovs.clear_flow_restore_wait().await {
                Ok(()) => info!("flows restored; cleared other_config:flow-restore-wait"),
                Err(e) => warn!(error = %e, "could not clear flow-restore-wait"),
            },
            Ok(false) => {}
            Err(e) => warn!(error = %e, "could not read flow-restore-wait"),
        }
    }

    /// A new OpenFlow connection: resync (difference or full replay) once ports are known.
    async fn on_connected(&mut self, sw: crate::switch::Switch) {
        if let Err(e) = sw.set_frag_mode(openflow::FragMode::NxMatch).await {
            warn!(error = %e, "could not set fragment handling to nx-match");
        }
        // A restarted switch may have renumbered the pods' ports: its own port list is
        // authoritative for this connection (the database can lag behind it).
        match sw.port_desc().await {
            Ok(ports) => {
                let ports: Vec<(String, u32)> = ports.iter().map(|p| (p.name(), p.port_no.0)).collect();
                self.ports.refresh_ofports(&ports);
            }
            Err(e) => {
                warn!(error = %e, "could not read the switch's ports; checking every pod port again");
                self.verify_ports = true;
            }
        }
        match &self.engine {
            Some(e) => {
                let _ = e.set_switch(sw).await;
            }
            // Started by `reconcile` once the generation is known.
            None => self.pending_switch = Some(sw),
        }
        self.resync_pending = true;
        self.reconcile().await;
    }

    async fn repair(&mut self) {
        if self.resync_pending {
            self.reconcile().await;
            return;
        }
        let Some(engine) = self.engine.clone() else { return };
        match engine.status().await {
            Ok(s) if s.dirty => match engine.resync(None).await {
                Ok(o) => {
                    info!(adds = o.adds, modifies = o.modifies, deletes = o.deletes, full_replay = o.full_replay, "repaired from a dump");
                    if o.full_replay {
                        self.persist_generation(&engine).await;
                    }
                }
                Err(e) => warn!(error = %e, "repair failed; will retry"),
            },
            _ => {}
        }
    }
}

/// Runs until `shutdown` resolves. Flows stay in place when it returns (an agent restart must
/// not disturb traffic).
pub async fn run(opts: RunOptions, shutdown: impl std::future::Future<Output = ()>) -> Result<(), RunError> {
    run_with(opts, Telemetry::default(), source::watch_file, shutdown).await
}

/// [`run`] with given telemetry and state source (`source(path)` returns the receiver of
/// states; the state file watcher by default, Kubernetes in cluster mode).
pub async fn run_with(
    opts: RunOptions,
    telemetry: Telemetry,
    source: impl FnOnce(PathBuf) -> watch::Receiver<Option<Arc<Loaded>>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let mut state_rx = source(opts.state.clone());
    let (api_tx, mut api_rx) = tokio::sync::mpsc::channel::<Command>(1024);
    if let Some(sock) = opts.api_socket.clone() {
        let (t, c) = (telemetry.clone(), cancel.clone());
        let tx = api_tx.clone();
        tokio::spawn(async move {
            if let Err(e) = api::serve(&sock, tx, t, async move { c.cancelled().await }).await {
                error!(socket = %sock.display(), error = %e, "pod API stopped");
            }
        });
    }
    if let Some(addr) = opts.metrics_addr {
        let (t, c) = (telemetry.clone(), cancel.clone());
        tokio::spawn(async move {
            if let Err(e) = api::serve_metrics(addr, t, async move { c.cancelled().await }).await {
                error!(%addr, error = %e, "metrics endpoint stopped");
            }
        });
    }
    drop(api_tx);
    let mut ovs_rx = ovsdb_link(opts.db_socket(), opts.backoff.clone(), cancel.clone());
    let sup = Supervisor::spawn(&opts.mgmt_socket(), opts.switch.clone(), opts.backoff.clone())?;
    let mut events = sup.subscribe();
    let mut agent = Agent {
        opts: opts.clone(),
        telemetry: telemetry.clone(),
        state: None,
        api_pods: BTreeMap::new(),
        api_recovered: false,
        effective: None,
        ovs: None,
        base_ready: false,
        verify_ports: true,
        ports: Ports::default(),
        ports_ready: false,
        engine: None,
        pending_switch: None,
        dns: dns::Dns::new(opts.dns_timeout),
        resync_pending: false,
        generation: 1,
    };
    let mut tick = tokio::time::interval(opts.repair_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    info!(state = %opts.state.display(), rundir = %opts.ovs_rundir.display(), bridge = %opts.bridge, "sdn-node running");
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                info!("shutting down; flows stay installed");
                return Ok(());
            }
            r = state_rx.changed() => {
                if r.is_err() {
                    error!("state source ended");
                    return Ok(());
                }
                agent.state = state_rx.borrow_and_update().clone();
                if let Some(l) = &agent.state {
                    for p in &l.problems {
                        telemetry.metrics.reject(&p.object);
                    }
                    telemetry.health.synced.store(true, Ordering::Relaxed);
                }
                agent.rebuild_effective();
                agent.reconcile().await;
            }
            r = ovs_rx.changed() => {
                if r.is_err() {
                    return Ok(());
                }
                agent.ovs = ovs_rx.borrow_and_update().clone();
                telemetry.metrics.set_connected("ovsdb", agent.ovs.is_some());
                telemetry.health.ovsdb.store(agent.ovs.is_some(), Ordering::Relaxed);
                agent.base_ready = false;
                agent.verify_ports = true;
                if agent.ovs.is_some() {
                    agent.reconcile().await;
                }
            }
            ev = events.recv() => match ev {
                Ok(SwitchEvent::Connected(sw)) => {
                    telemetry.metrics.set_connected("openflow", true);
                    telemetry.health.switch.store(true, Ordering::Relaxed);
                    agent.on_connected(sw).await
                }
                Ok(SwitchEvent::Disconnected(reason)) => {
                    telemetry.metrics.set_connected("openflow", false);
                    telemetry.health.switch.store(false, Ordering::Relaxed);
                    warn!(%reason, "switch disconnected")
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if let Some(sw) = sup.current() {
                        agent.on_connected(sw).await;
                    }
                }
                Err(_) => return Ok(()),
            },
            Some(cmd) = api_rx.recv() => match cmd {
                Command::Setup(pod, req, reply) => {
                    let r = agent.api_setup(*pod, req).await;
                    let _ = reply.send(r);
                }
                Command::Teardown(ns, name, reply) => {
                    let r = agent.api_teardown(ns, name).await;
                    let _ = reply.send(r);
                }
                Command::List(reply) => {
                    let _ = reply.send(agent.api_pods.values().map(|(_, r)| r.clone()).collect());
                }
            },
            _ = tick.tick() => {
                agent.repair().await;
                // A DNS answer expired and changed: swap that VNID's egress rules.
                if agent.dns.refresh().await {
                    info!("an egress DNS answer changed; re-converging");
                    agent.reconcile().await;
                }
                if let Some(e) = &agent.engine {
                    if let Ok(s) = e.status().await {
                        telemetry.metrics.set_flows_per_table(&s.flows_per_table);
                    }
                }
            }
        }
    }
}
