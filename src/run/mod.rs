//! `sdn-node run`: keeps the switch equal to the cluster state for as long as it runs.
//!
//! This module only wires things together: the sources (state file or Kubernetes), the OVSDB
//! link and the OpenFlow supervisor, the DNS task, the pod API and the metrics endpoint all feed
//! the one [`Reconciler`]; its loop converges the node after every change. Pod requests run on
//! their own tasks against the shared model ([`crate::pod::setup`]): nothing they do waits
//! for this loop, and nothing this loop does waits for them.

pub mod options;
pub mod source;
pub mod startup;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api;
use crate::metrics::Telemetry;
use crate::ovsdb::sentinel::Sentinel;
use crate::ovsdb::{ClientOptions, Ovs, OvsdbClient};
use crate::reconcile::dns::Dns;
use crate::reconcile::Reconciler;
use crate::switch::{Backoff, SwitchEvent, Supervisor};
pub use options::RunOptions;
use source::Loaded;

/// Keeps an OVSDB connection up; publishes the live one (`None` while down).
fn ovsdb_link(address: String, options: ClientOptions, backoff: Backoff, cancel: CancellationToken) -> watch::Receiver<Option<Ovs>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let attempt = tokio::select! {
                _ = cancel.cancelled() => return,
                r = tokio::time::timeout(options.request_timeout.unwrap_or(Duration::from_secs(10)), OvsdbClient::connect_with(&address, options.clone())) => {
                    r.unwrap_or_else(|_| Err(crate::ovsdb::OvsdbError::Timeout(format!("connecting to {address}"))))
                }
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

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Switch(#[from] crate::switch::SwitchError),
    /// The checkpoint cannot be used: the agent does not start (see
    /// [`crate::pod::checkpoint::CheckpointError::Corrupt`]).
    #[error(transparent)]
    Checkpoint(#[from] crate::pod::checkpoint::CheckpointError),
    /// The audit log's sink cannot be opened.
    #[error("audit log: {0}")]
    Audit(String),
    /// The bridge or ports found contradict the configuration (see
    /// [`crate::reconcile::ConvergeError::Refused`]); nothing was written.
    #[error("{0}")]
    Refused(String),
    /// The configuration is wrong (a file, flag, address or permission): see [`startup`].
    #[error(transparent)]
    Startup(#[from] startup::StartupError),
}

pub use crate::node::record::POD_KEY;

/// The audit log's view of the node: pods by address, and the node's name from the cluster
/// state (the configured `--node`, else the bridge's name, only before a state is loaded).
struct NodeLookup(crate::node::State);

impl crate::audit::PodLookup for NodeLookup {
    fn pod(&self, ip: std::net::IpAddr) -> Option<String> {
        self.0.pod_at(ip)
    }
    fn node_name(&self) -> Option<String> {
        self.0.node_name()
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
    // Configuration first: nothing is served or changed on a bad one.
    startup::check(&opts, None).await?;
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    telemetry.health.set_watchdog(opts.watchdog);
    // Read before anything is served or changed: a checkpoint that cannot be read stops the
    // agent here, with nothing torn down.
    let checkpoint = match &opts.state_dir {
        Some(dir) => crate::pod::checkpoint::Checkpoint::open(dir)?,
        None => crate::pod::checkpoint::Checkpoint::none(),
    };
    let pods = crate::pod::Pods::new(opts.config(), telemetry.clone(), checkpoint);
    let rec = Reconciler::new(pods.clone());
    let state_rx = source(opts.state.clone());
    serve(&opts, &pods, &telemetry, &cancel);
    let (names_tx, names_rx) = watch::channel(Default::default());
    let dns = match opts.dns_servers.as_slice() {
        [] => Dns::new(opts.dns_timeout),
        servers => Dns::with_servers(opts.dns_timeout, servers),
    };
    let dns_rx = dns.spawn(names_rx, cancel.clone());
    let ovs_rx = ovsdb_link(opts.node.bridge.ovs.db_socket(), opts.peers.ovsdb(), opts.peers.backoff(), cancel.clone());
    // The audit log: its meter and packet-in settings on every connection (set up before the
    // connection is published, so before any resync installs flows naming the meter), lines
    // to the sink.
    let (_audit, on_connect) = match opts.audit_config() {
        Some(cfg) => {
            let lookup: Arc<dyn crate::audit::PodLookup> = Arc::new(NodeLookup(pods.state.clone()));
            let (h, hook) = crate::audit::start(cfg, lookup).await.map_err(|e| RunError::Audit(e.to_string()))?;
            tokio::spawn(crate::metrics::follow_audit(telemetry.metrics.clone(), h.counters.clone(), cancel.clone()));
            (Some(h), Some(hook))
        }
        None => (None, None),
    };
    let sup = Supervisor::spawn_with(&opts.node.bridge.ovs.mgmt_socket(), opts.peers.switch(), opts.peers.backoff(), on_connect)?;
    let events = sup.subscribe();
    spawn_executors(&opts, &pods, &rec, &sup, &cancel);
    info!(state = %opts.state.display(), rundir = %opts.node.bridge.ovs.ovs_rundir.display(), bridge = %opts.node.bridge.name(), "sdn-node running");
    let mut l = Loop {
        tick: tokio::time::interval(opts.repair_interval),
        port_timeout: opts.node.bridge.port_timeout,
        state: pods.state.clone(),
        kick: rec.kick.clone(),
        rec,
        telemetry,
        names_tx,
        sentinel: None,
        failures: 0,
        retry_at: None,
        dirty: false,
        last_problems: Vec::new(),
        converged_once: false,
    };
    l.tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    l.run(Inputs { state_rx, ovs_rx, dns_rx, events, sup }, shutdown).await
}

/// The pod API and the metrics endpoint, each on its own task.
fn serve(opts: &RunOptions, pods: &Arc<crate::pod::Pods>, telemetry: &Telemetry, cancel: &CancellationToken) {
    if let Some(sock) = opts.node.api_socket.clone() {
        let (n, c) = (pods.clone(), cancel.clone());
        tokio::spawn(async move {
            if let Err(e) = api::serve(&sock, n, async move { c.cancelled().await }).await {
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
}

/// The executors beside the converge loop, each on its own task so that one slow peer delays
/// only its own work: the per-policy counters, the warm-port refill, the checkpoint writer and
/// the host network.
fn spawn_executors(opts: &RunOptions, pods: &Arc<crate::pod::Pods>, rec: &Reconciler, sup: &Supervisor, cancel: &CancellationToken) {
    let telemetry = &pods.telemetry;
    // One dump never takes longer than the interval or a switch request's deadline.
    if let Some(interval) = opts.policy_stats_interval.filter(|d| !d.is_zero()) {
        let o = crate::policy_stats::StatsOptions { interval, deadline: interval.min(opts.peers.switch_request_timeout) };
        // Counts exact across policy changes: the datapath's counts pushed into the flows
        // before a change removes one (one revalidation round, 500 ms by default; bounded).
        let ctl = crate::switch::VswitchdCtl::new(&opts.node.bridge.ovs.ovs_rundir);
        let _ = rec.count_flush.set(crate::engine::CountFlush { ctl, deadline: opts.peers.switch_request_timeout.min(COUNT_FLUSH_DEADLINE) });
        tokio::spawn(crate::policy_stats::run(pods.state.clone(), telemetry.metrics.clone(), sup.watch_current(), o, cancel.clone()));
    }
    tokio::spawn(crate::pod::refill::keep_filled(pods.clone(), cancel.clone()));
    tokio::spawn(crate::pod::durable::keep_written(pods.clone(), cancel.clone()));
    if pods.cfg.manages_host() {
        telemetry.health.executor_started(crate::metrics::Executor::Host);
        let pacing = crate::reconcile::host::Pacing {
            verify_every: opts.repair_interval,
            retry_base: RETRY_BASE,
            retry_cap: RETRY_CAP,
            deadline: opts.node.bridge.port_timeout,
        };
        tokio::spawn(crate::reconcile::host::run(telemetry.clone(), rec.host_kick.clone(), rec.host_plans(), pacing, cancel.clone()));
    }
}

/// What the converge loop listens to.
struct Inputs {
    state_rx: watch::Receiver<Option<Arc<Loaded>>>,
    ovs_rx: watch::Receiver<Option<Ovs>>,
    dns_rx: tokio::sync::mpsc::Receiver<crate::pipeline::egress::DnsAnswers>,
    events: tokio::sync::broadcast::Receiver<SwitchEvent>,
    sup: Supervisor,
}

/// The converge loop of `run`: one event at a time, then a pass if one is due.
struct Loop {
    rec: Reconciler,
    state: crate::node::State,
    kick: crate::node::Kick,
    telemetry: Telemetry,
    names_tx: watch::Sender<std::collections::BTreeSet<String>>,
    tick: tokio::time::Interval,
    port_timeout: Duration,
    /// The OVSDB monitor of the current connection that notices what others change.
    sentinel: Option<Sentinel>,
    /// Consecutive failed passes, and when the next retry is due.
    failures: u32,
    retry_at: Option<tokio::time::Instant>,
    /// Something changed since the last successful pass.
    dirty: bool,
    last_problems: Vec<String>,
    /// A refusal before the first successful pass is the configuration's fault: the agent stops.
    converged_once: bool,
}

impl Loop {
    async fn run(&mut self, mut i: Inputs, shutdown: impl std::future::Future<Output = ()>) -> Result<(), RunError> {
        tokio::pin!(shutdown);
        loop {
            // A pass is due after any event; after a tick only once the backoff has passed.
            let mut due = true;
            let kick = self.kick.clone();
            let (sentinel, retry_at, dirty) = (&mut self.sentinel, self.retry_at, self.dirty);
            tokio::select! {
                _ = &mut shutdown => {
                    info!("shutting down; flows stay installed");
                    return Ok(());
                }
                r = i.state_rx.changed() => {
                    if r.is_err() {
                        error!("state source ended");
                        return Ok(());
                    }
                    let Some(loaded) = i.state_rx.borrow_and_update().clone() else { continue };
                    self.on_state(loaded).await;
                }
                r = i.ovs_rx.changed() => {
                    if r.is_err() {
                        return Ok(());
                    }
                    let ovs = i.ovs_rx.borrow_and_update().clone();
                    self.sentinel = None;
                    self.rec.ovsdb_changed(ovs);
                    self.changed();
                }
                ev = i.events.recv() => match ev {
                    Ok(SwitchEvent::Connected(sw)) => {
                        self.telemetry.metrics.set_connected("openflow", true);
                        self.telemetry.health.switch.store(true, Ordering::Relaxed);
                        self.rec.switch_connected(sw).await;
                        self.dirty = true;
                    }
                    Ok(SwitchEvent::Disconnected(reason)) => {
                        self.telemetry.metrics.set_connected("openflow", false);
                        self.telemetry.health.switch.store(false, Ordering::Relaxed);
                        self.rec.switch_lost();
                        warn!(%reason, "switch disconnected")
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if let Some(sw) = i.sup.current() {
                            self.rec.switch_connected(sw).await;
                            self.dirty = true;
                        }
                    }
                    Err(_) => return Ok(()),
                },
                Some(answers) = i.dns_rx.recv() => {
                    if self.state.lock().set_dns(answers) {
                        info!("egress DNS answers changed; re-converging");
                        self.changed();
                    }
                }
                _ = kick.kicked() => { self.dirty = true; }
                _ = async { match sentinel { Some(s) => s.changed().await, None => std::future::pending().await } } => {
                    // Let a burst of notifications (a transaction touches several tables) settle.
                    tokio::time::sleep(SENTINEL_SETTLE).await;
                    match self.sentinel.as_ref().and_then(Sentinel::snapshot) {
                        Some(snap) => {
                            if self.rec.inspect_ovsdb(&snap) {
                                self.dirty = true;
                            }
                        }
                        None => self.sentinel = None,
                    }
                }
                _ = async { match retry_at { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } }, if dirty => {
                    self.retry_at = None;
                }
                _ = self.tick.tick() => {
                    due = self.retry_at.is_none();
                    self.rec.repair().await;
                    if let Some(sw) = i.sup.current() {
                        self.rec.check_flows(&sw).await;
                    }
                    if self.rec.collect_dead_sandboxes() {
                        self.changed();
                        due = true;
                    }
                }
            }
            if self.dirty && due && self.state.lock().has_state() {
                self.telemetry.health.busy();
                let r = self.rec.converge().await;
                self.after_pass(r).await?;
                self.telemetry.health.idle();
            }
        }
    }

    /// Something the flows depend on changed: a full pass is due.
    fn changed(&mut self) {
        self.telemetry.not_converged();
        self.dirty = true;
    }

    /// A new state from the source: into the model (its DNS names to the resolver), then
    /// committed owner by owner if only some owners changed, else a full pass is due.
    async fn on_state(&mut self, loaded: Arc<Loaded>) {
        let telemetry = &self.telemetry;
        record_source(&telemetry.metrics, &loaded);
        telemetry.health.synced.store(true, Ordering::Relaxed);
        let (gone, change) = {
            let mut m = self.state.lock();
            // Seen with the state, under the model lock: a commit's ticket names the
            // generations its flows were computed from (see `crate::realize`).
            telemetry.metrics.realization.seen(&loaded);
            let (gone, change) = m.set_source_change(loaded.clone());
            let rebuild = std::mem::take(&mut m.rebuild_problems);
            for p in &rebuild {
                telemetry.metrics.reject(&p.object);
                warn!("rejected: {p}");
            }
            // What is rejected now, for status and the gauge.
            let now: Vec<_> = loaded.problems.iter().cloned().chain(rebuild).collect();
            telemetry.metrics.rejections.set(crate::rejections::Slot::Source, &now);
            let names = m.dns_names();
            self.names_tx.send_if_modified(|n| {
                let changed = *n != names;
                if changed {
                    *n = names;
                }
                changed
            });
            (gone, change)
        };
        for k in gone {
            info!(pod = %format!("{}/{}", k.0, k.1), "pod no longer exists; tearing it down");
        }
        // Only some owners changed and nothing else is pending: commit just those.
        let incremental = match change {
            crate::node::state::SourceChange::Owners(owners) if !self.dirty => self.rec.update_owners(&owners).await,
            _ => false,
        };
        if !incremental {
            self.changed();
        }
    }

    /// What a pass says: problems reported once each, the sentinel started after the first
    /// success, a failure retried with capped backoff (fatal if the configuration is refused
    /// before the first success).
    async fn after_pass(&mut self, r: Result<crate::reconcile::Pass, crate::reconcile::ConvergeError>) -> Result<(), RunError> {
        let telemetry = &self.telemetry;
        match r {
            Ok(pass) => {
                self.converged_once = true;
                self.dirty = false;
                self.failures = 0;
                self.retry_at = None;
                if self.sentinel.is_none() {
                    self.sentinel = start_sentinel(self.rec.conns(), self.port_timeout).await;
                    // What changed before the monitor started is compared now.
                    if let Some(snap) = self.sentinel.as_ref().and_then(Sentinel::snapshot) {
                        if self.rec.inspect_ovsdb(&snap) {
                            self.dirty = true;
                            self.retry_at = Some(tokio::time::Instant::now());
                        }
                    }
                }
                telemetry.metrics.rejections.set(crate::rejections::Slot::Pass, &pass.problems);
                let mut now: Vec<String> = pass.problems.iter().map(|p| p.to_string()).collect();
                now.extend(pass.warnings.iter().map(|w| format!("warning: {w}")));
                if now != self.last_problems {
                    for p in &pass.problems {
                        telemetry.metrics.reject(&p.object);
                        warn!("rejected: {p}");
                    }
                    for w in &pass.warnings {
                        // A name not answered yet is pending, not failed.
                        let pending = w.message.contains("not resolved yet");
                        if (w.message.contains("DNS") || w.message.contains("resolve")) && !pending {
                            telemetry.metrics.dns_failures.inc();
                        }
                        warn!("{w}");
                    }
                    self.last_problems = now;
                }
            }
            Err(crate::reconcile::ConvergeError::Refused(m)) if !self.converged_once => {
                return Err(RunError::Refused(m));
            }
            Err(e) => {
                // Retried on the next event, or with capped backoff (`dirty` stays set).
                self.failures = self.failures.saturating_add(1);
                self.retry_at = Some(tokio::time::Instant::now() + crate::metrics::retry_delay(self.failures, RETRY_BASE, RETRY_CAP));
                let failures = self.failures;
                match e {
                    crate::reconcile::ConvergeError::NotReady(_) => {}
                    crate::reconcile::ConvergeError::Engine(_) => warn!(error = %e, attempts = failures, "flows not converged; will repair"),
                    crate::reconcile::ConvergeError::Refused(_) => error!(error = %e, attempts = failures, "refused; will retry"),
                    _ => warn!(error = %e, attempts = failures, "not converged; will retry"),
                }
            }
        }
        Ok(())
    }
}

/// The first retry's delay after a failed pass (doubled per failure, up to [`RETRY_CAP`]).
const RETRY_BASE: Duration = Duration::from_millis(100);
/// The longest delay between retries: a repair is never more than this late.
const RETRY_CAP: Duration = Duration::from_secs(5);
/// Bound of one flush of the datapath's counts before a policy change (a revalidation round is
/// 500 ms by default): past it the change goes ahead, enforcement before counting.
const COUNT_FLUSH_DEADLINE: Duration = Duration::from_secs(2);
/// How long the sentinel lets notifications settle before comparing.
const SENTINEL_SETTLE: Duration = Duration::from_millis(50);

/// Starts the OVSDB sentinel on the live connection (`None`: not connected, or it failed;
/// the next successful pass tries again).
async fn start_sentinel(conns: &crate::node::Conns, deadline: Duration) -> Option<Sentinel> {
    let ovs = conns.ovs()?;
    match tokio::time::timeout(deadline, Sentinel::start(ovs.client())).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            warn!(error = %e, "could not start the OVSDB sentinel monitor; will retry");
            None
        }
        Err(_) => {
            warn!("the OVSDB sentinel monitor did not start in time; will retry");
            None
        }
    }
}

/// What a new source state says to the metrics: its rejected objects, and how many
/// NetworkPolicies this node enforces only in part (a part it could not use was dropped).
fn record_source(metrics: &crate::metrics::Metrics, loaded: &Loaded) {
    for p in &loaded.problems {
        metrics.reject(&p.object);
    }
    let partly = crate::cluster::netpol::partly_enforced(&loaded.state, &loaded.problems);
    metrics.policies_partly_enforced.set(i64::try_from(partly).unwrap_or(i64::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::state_file::parse;

    fn loaded(text: &str) -> Loaded {
        let (state, problems) = parse(text).unwrap();
        Loaded { state, problems, live_pods: None, touched: None, seq: 0, pod_annotations: Default::default(), policies_seen: Default::default() }
    }

    const HEADER: &str = "node: node-a\nplugin: networkpolicy\nclusterNetwork: 10.128.0.0/14\nserviceNetwork: 172.30.0.0/16\nhostSubnets:\n  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}\nnetNamespaces:\n  - {name: a, netid: 11}\n";

    #[test]
    fn partly_enforced_policies_are_counted_in_the_gauge() {
        // Egress is enforced: a policy of both types counts only when a part was dropped (two
        // bad ports here, one problem each: the policy counts once).
        let policies = "networkPolicies:\n\
            - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: both, namespace: a}, spec: {podSelector: {}, policyTypes: [Ingress, Egress]}}\n\
            - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: implied, namespace: a}, spec: {podSelector: {}, egress: [{ports: [{port: 0}, {protocol: ICMP}]}]}}\n\
            - {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: ingress, namespace: a}, spec: {podSelector: {}, ingress: [{}]}}\n";
        let m = crate::metrics::Metrics::new();
        assert!(m.encode().contains("sdn_node_policies_partly_enforced 0"), "{}", m.encode());
        record_source(&m, &loaded(&format!("{HEADER}{policies}")));
        assert!(m.encode().contains("sdn_node_policies_partly_enforced 1"), "{}", m.encode());
        // The policies go: the gauge follows.
        record_source(&m, &loaded(HEADER));
        assert!(m.encode().contains("sdn_node_policies_partly_enforced 0"), "{}", m.encode());
        // Another plugin enforces no NetworkPolicy at all: nothing counted here.
        let mut l = loaded(&format!("{HEADER}{policies}"));
        l.state.plugin = crate::domain::Plugin::Multitenant;
        record_source(&m, &l);
        assert_eq!(m.policies_partly_enforced.get(), 0);
    }
}
