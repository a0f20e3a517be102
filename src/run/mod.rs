//! `sdn-node run`: keeps the switch equal to the cluster state for as long as it runs.
//!
//! One loop reacts to four things: a new state (the file changed), the OpenFlow connection
//! coming up (resync: the difference if the switch is current, a full replay if it is empty or
//! stale), the OVSDB connection coming up (re-ensure bridge, ports, QoS), and a repair tick (a
//! failed commit left the switch's state unknown). Every path converges by the same means:
//! ports through OVSDB, then desired flows diffed against the installed mirror, one bundle.

pub mod ports;
pub mod source;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::apply::GENERATION_KEY;
use crate::cluster::desired::desired_state_with_warnings;
use crate::engine::Engine;
use crate::ovsdb::{Ovs, OvsdbClient};
use crate::pipeline::egress::{dns_names, DnsAnswers};
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

/// What the loop knows.
struct Agent {
    opts: RunOptions,
    state: Option<Arc<Loaded>>,
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
    /// A new OpenFlow connection waits for its resync (dump, then difference or full replay).
    resync_pending: bool,
    generation: u32,
}

impl Agent {
    /// Ports (if OVSDB is up), then flows (if the switch is up and ports are known).
    async fn reconcile(&mut self) {
        let Some(loaded) = self.state.clone() else { return };
        if let Some(ovs) = self.ovs.clone() {
            if let Err(e) = self.reconcile_ports(&ovs, &loaded).await {
                warn!(error = %e, "OVSDB: ports not reconciled; retrying on reconnect");
            }
        }
        if !self.ports_ready {
            return;
        }
        let Some(engine) = self.engine.clone() else { return };
        let desired = self.desired(&loaded).await;
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
            }
            Err(e) => {
                self.resync_pending |= resync;
                warn!(error = %e, "flows not converged; will repair");
            }
        }
    }

    async fn reconcile_ports(&mut self, ovs: &Ovs, loaded: &Loaded) -> Result<(), crate::ovsdb::OvsdbError> {
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
        match self.ports.reconcile(ovs, &self.opts.bridge, &loaded.state, self.opts.port_timeout, verify).await {
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

    async fn desired(&self, loaded: &Loaded) -> crate::store::DesiredState {
        let dns = resolve(&loaded.state, self.opts.dns_timeout).await;
        let (d, problems, warnings) = desired_state_with_warnings(&loaded.state, &self.ports.ofports(), &dns);
        for p in problems.iter().chain(&warnings) {
            warn!("{p}");
        }
        d
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
        match &self.engine {
            Some(e) => {
                let _ = e.set_switch(sw).await;
            }
            None => self.engine = Some(Engine::start(sw, self.generation)),
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
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let mut state_rx = source::watch_file(opts.state.clone());
    let mut ovs_rx = ovsdb_link(opts.db_socket(), opts.backoff.clone(), cancel.clone());
    let sup = Supervisor::spawn(&opts.mgmt_socket(), opts.switch.clone(), opts.backoff.clone())?;
    let mut events = sup.subscribe();
    let mut agent = Agent {
        opts: opts.clone(),
        state: None,
        ovs: None,
        base_ready: false,
        verify_ports: true,
        ports: Ports::default(),
        ports_ready: false,
        engine: None,
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
                agent.reconcile().await;
            }
            r = ovs_rx.changed() => {
                if r.is_err() {
                    return Ok(());
                }
                agent.ovs = ovs_rx.borrow_and_update().clone();
                agent.base_ready = false;
                agent.verify_ports = true;
                if agent.ovs.is_some() {
                    agent.reconcile().await;
                }
            }
            ev = events.recv() => match ev {
                Ok(SwitchEvent::Connected(sw)) => agent.on_connected(sw).await,
                Ok(SwitchEvent::Disconnected(reason)) => warn!(%reason, "switch disconnected"),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if let Some(sw) = sup.current() {
                        agent.on_connected(sw).await;
                    }
                }
                Err(_) => return Ok(()),
            },
            _ = tick.tick() => agent.repair().await,
        }
    }
}

/// Resolves the egress policies' DNS names to IPv4 addresses.
pub async fn resolve(state: &crate::cluster::ClusterState, timeout: Duration) -> DnsAnswers {
    let names = dns_names(&state.egress_policies);
    let lookups = names.into_iter().map(|name| async move {
        let r = match tokio::time::timeout(timeout, tokio::net::lookup_host((name.as_str(), 0))).await {
            Err(_) => Err(format!("no answer within {timeout:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(addrs)) => {
                let mut v: Vec<std::net::Ipv4Addr> = addrs
                    .filter_map(|a| match a.ip() {
                        std::net::IpAddr::V4(v4) => Some(v4),
                        std::net::IpAddr::V6(_) => None,
                    })
                    .collect();
                v.sort();
                v.dedup();
                if v.is_empty() {
                    Err("no IPv4 address".to_string())
                } else {
                    Ok(v)
                }
            }
        };
        (name, r)
    });
    futures::future::join_all(lookups).await.into_iter().collect()
}
