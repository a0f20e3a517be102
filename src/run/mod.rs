//! `sdn-node run`: keeps the switch equal to the cluster state for as long as it runs.
//!
//! This module only wires things together: the sources (state file or Kubernetes), the OVSDB
//! link and the OpenFlow supervisor, the DNS task, the pod API and the metrics endpoint all feed
//! the one [`Reconciler`]; its loop converges the node after every change. Pod requests run on
//! their own tasks against the shared model ([`crate::reconcile::pods`]): nothing they do waits
//! for this loop, and nothing this loop does waits for them.

pub mod options;
pub mod process;
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
use crate::reconcile::{Node, Reconciler};
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
    /// [`crate::reconcile::checkpoint::CheckpointError::Corrupt`]).
    #[error(transparent)]
    Checkpoint(#[from] crate::reconcile::checkpoint::CheckpointError),
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

pub use crate::reconcile::POD_KEY;

/// The audit log's view of the node: pods by address, and the node's name from the cluster
/// state (the configured `--node`, else the bridge's name, only before a state is loaded).
struct NodeLookup(Arc<Node>);

impl crate::audit::PodLookup for NodeLookup {
    fn pod(&self, ip: std::net::Ipv4Addr) -> Option<String> {
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
        Some(dir) => crate::reconcile::checkpoint::Checkpoint::open(dir)?,
        None => crate::reconcile::checkpoint::Checkpoint::none(),
    };
    let node = Node::with_checkpoint(opts.config(), telemetry.clone(), checkpoint);
    let mut state_rx = source(opts.state.clone());
    if let Some(sock) = opts.node.api_socket.clone() {
        let (n, c) = (node.clone(), cancel.clone());
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
    let (names_tx, names_rx) = watch::channel(Default::default());
    let dns = match opts.dns_servers.as_slice() {
        [] => Dns::new(opts.dns_timeout),
        servers => Dns::with_servers(opts.dns_timeout, servers),
    };
    let mut dns_rx = dns.spawn(names_rx, cancel.clone());
    let mut ovs_rx = ovsdb_link(opts.node.bridge.ovs.db_socket(), opts.peers.ovsdb(), opts.peers.backoff(), cancel.clone());
    // The audit log: its meter and packet-in settings on every connection (set up before the
    // connection is published, so before any resync installs flows naming the meter), lines
    // to the sink.
    let (_audit, on_connect) = match opts.audit_config() {
        Some(cfg) => {
            let lookup: Arc<dyn crate::audit::PodLookup> = Arc::new(NodeLookup(node.clone()));
            let (h, hook) = crate::audit::start(cfg, lookup).await.map_err(|e| RunError::Audit(e.to_string()))?;
            tokio::spawn(crate::metrics::follow_audit(telemetry.metrics.clone(), h.counters.clone(), cancel.clone()));
            (Some(h), Some(hook))
        }
        None => (None, None),
    };
    let sup = Supervisor::spawn_with(&opts.node.bridge.ovs.mgmt_socket(), opts.peers.switch(), opts.peers.backoff(), on_connect)?;
    let mut events = sup.subscribe();
    // The per-policy counters: a task of its own, so a slow switch delays only its reads; one
    // dump never takes longer than the interval or a switch request's deadline.
    if let Some(interval) = opts.policy_stats_interval.filter(|d| !d.is_zero()) {
        let o = crate::policy_stats::StatsOptions { interval, deadline: interval.min(opts.peers.switch_request_timeout) };
        // Counts exact across policy changes: the datapath's counts pushed into the flows
        // before a change removes one (one revalidation round, 500 ms by default; bounded).
        let ctl = crate::switch::VswitchdCtl::new(&opts.node.bridge.ovs.ovs_rundir);
        let _ = node.count_flush.set(crate::engine::CountFlush { ctl, deadline: opts.peers.switch_request_timeout.min(COUNT_FLUSH_DEADLINE) });
        tokio::spawn(crate::policy_stats::run(node.clone(), sup.watch_current(), o, cancel.clone()));
    }
    tokio::spawn(crate::reconcile::spares::Spares::keep_filled(node.clone(), cancel.clone()));
    tokio::spawn(crate::reconcile::checkpoint::keep_written(node.clone(), cancel.clone()));
    if node.manages_host() {
        telemetry.health.executor_started(crate::metrics::Executor::Host);
        let pacing = crate::reconcile::host::Pacing {
            verify_every: opts.repair_interval,
            retry_base: RETRY_BASE,
            retry_cap: RETRY_CAP,
            deadline: opts.node.bridge.port_timeout,
        };
        tokio::spawn(crate::reconcile::host::run(node.clone(), node.host_plans(), pacing, cancel.clone()));
    }
    let mut rec = Reconciler::new(node.clone());
    // The OVSDB monitor of the current connection that notices what others change.
    let mut sentinel: Option<Sentinel> = None;
    // Consecutive failed passes, and when the next retry is due.
    let mut failures = 0u32;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(opts.repair_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    info!(state = %opts.state.display(), rundir = %opts.node.bridge.ovs.ovs_rundir.display(), bridge = %opts.node.bridge.name(), "sdn-node running");
    // Something changed since the last successful pass.
    let mut dirty = false;
    let mut last_problems: Vec<String> = Vec::new();
    // A refusal before the first successful pass is the configuration's fault: the agent stops.
    let mut converged_once = false;
    loop {
        // A pass is due after any event; after a tick only once the backoff has passed.
        let mut due = true;
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
                let Some(loaded) = state_rx.borrow_and_update().clone() else { continue };
                record_source(&telemetry.metrics, &loaded);
                telemetry.health.synced.store(true, Ordering::Relaxed);
                let (gone, change) = {
                    let mut m = node.model();
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
                    names_tx.send_if_modified(|n| {
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
                    crate::reconcile::model::SourceChange::Owners(owners) if !dirty => rec.update_owners(&owners).await,
                    _ => false,
                };
                if !incremental {
                    node.not_converged();
                    dirty = true;
                }
            }
            r = ovs_rx.changed() => {
                if r.is_err() {
                    return Ok(());
                }
                let ovs = ovs_rx.borrow_and_update().clone();
                sentinel = None;
                rec.ovsdb_changed(ovs);
                node.not_converged();
                dirty = true;
            }
            ev = events.recv() => match ev {
                Ok(SwitchEvent::Connected(sw)) => {
                    telemetry.metrics.set_connected("openflow", true);
                    telemetry.health.switch.store(true, Ordering::Relaxed);
                    rec.switch_connected(sw).await;
                    dirty = true;
                }
                Ok(SwitchEvent::Disconnected(reason)) => {
                    telemetry.metrics.set_connected("openflow", false);
                    telemetry.health.switch.store(false, Ordering::Relaxed);
                    rec.switch_lost();
                    warn!(%reason, "switch disconnected")
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if let Some(sw) = sup.current() {
                        rec.switch_connected(sw).await;
                        dirty = true;
                    }
                }
                Err(_) => return Ok(()),
            },
            Some(answers) = dns_rx.recv() => {
                if node.model().set_dns(answers) {
                    info!("egress DNS answers changed; re-converging");
                    node.not_converged();
                    dirty = true;
                }
            }
            _ = node.kicked() => { dirty = true; }
            _ = async { match &mut sentinel { Some(s) => s.changed().await, None => std::future::pending().await } } => {
                // Let a burst of notifications (a transaction touches several tables) settle.
                tokio::time::sleep(SENTINEL_SETTLE).await;
                match sentinel.as_ref().and_then(Sentinel::snapshot) {
                    Some(snap) => {
                        if rec.inspect_ovsdb(&snap) {
                            dirty = true;
                        }
                    }
                    None => sentinel = None,
                }
            }
            _ = async { match retry_at { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } }, if dirty => {
                retry_at = None;
            }
            _ = tick.tick() => {
                due = retry_at.is_none();
                rec.repair().await;
                if let Some(sw) = sup.current() {
                    rec.check_flows(&sw).await;
                }
                if rec.collect_dead_sandboxes() {
                    node.not_converged();
                    dirty = true;
                    due = true;
                }
            }
        }
        if dirty && due && node.model().has_state() {
            telemetry.health.busy();
            match rec.converge().await {
                Ok(pass) => {
                    converged_once = true;
                    dirty = false;
                    failures = 0;
                    retry_at = None;
                    if sentinel.is_none() {
                        sentinel = start_sentinel(&node, opts.node.bridge.port_timeout).await;
                        // What changed before the monitor started is compared now.
                        if let Some(snap) = sentinel.as_ref().and_then(Sentinel::snapshot) {
                            if rec.inspect_ovsdb(&snap) {
                                dirty = true;
                                retry_at = Some(tokio::time::Instant::now());
                            }
                        }
                    }
                    telemetry.metrics.rejections.set(crate::rejections::Slot::Pass, &pass.problems);
                    let mut now: Vec<String> = pass.problems.iter().map(|p| p.to_string()).collect();
                    now.extend(pass.warnings.iter().map(|w| format!("warning: {w}")));
                    if now != last_problems {
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
                        last_problems = now;
                    }
                }
                Err(crate::reconcile::ConvergeError::Refused(m)) if !converged_once => {
                    return Err(RunError::Refused(m));
                }
                Err(e) => {
                    // Retried on the next event, or with capped backoff (`dirty` stays set).
                    failures = failures.saturating_add(1);
                    retry_at = Some(tokio::time::Instant::now() + crate::metrics::retry_delay(failures, RETRY_BASE, RETRY_CAP));
                    match e {
                        crate::reconcile::ConvergeError::NotReady(_) => {}
                        crate::reconcile::ConvergeError::Engine(_) => warn!(error = %e, attempts = failures, "flows not converged; will repair"),
                        crate::reconcile::ConvergeError::Refused(_) => error!(error = %e, attempts = failures, "refused; will retry"),
                        _ => warn!(error = %e, attempts = failures, "not converged; will retry"),
                    }
                }
            }
            telemetry.health.idle();
        }
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
async fn start_sentinel(node: &Node, deadline: Duration) -> Option<Sentinel> {
    let ovs = node.ovs()?;
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
        l.state.plugin = crate::model::Plugin::Multitenant;
        record_source(&m, &l);
        assert_eq!(m.policies_partly_enforced.get(), 0);
    }
}
