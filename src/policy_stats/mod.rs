//! Per-policy counters from the switch's flow statistics: new connections each NetworkPolicy
//! allowed (by namespace, policy and direction) and packets dropped for isolated pods (by
//! namespace and direction, and per pod in `sdn-node status`).
//!
//! Every `--policy-stats-interval` seconds a task of its own dumps tables 80 and 27, restricted
//! by cookie to the NetworkPolicy owners' flows (kind 11 in the cookie's top byte), with a
//! deadline per request. What each flow counts comes from the model
//! ([`crate::pipeline::netpol::counted`], computed by the same pass that makes the flows), for
//! the model as it is when read; per-flow deltas ([`accumulate`]) make the totals monotonic
//! across flows that are re-created. A switch that is down or slow only makes a read fail:
//! nothing waits for this task, the counters keep their values, and status shows the error.
//!
//! Why "connections": tables 80 and 27 pass established TCP and UDP connections before the
//! policy flows, so an allowed flow sees only each connection's first packet; drops see every
//! packet they drop.

mod accumulate;
mod totals;

pub use accumulate::{Accumulator, Delta, Sample, UNAVAILABLE};
pub use crate::policy_report::{AllowedCount, DroppedCount, PodDrops, PolicyCounters, Shared};
pub use totals::{Allowed, Attribution, Count, Totals};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use openflow::FlowStatsRequest;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::metrics::{Metrics, NamespaceDirectionLabel, PolicyLabel, ResultLabel};
use crate::pipeline::netpol::counted::{counting, Counting};
use crate::pipeline::netpol::{NamespacePolicy, Side};
use crate::pipeline::{FlowKey, Table};
use crate::node::State;
use crate::store::Owner;
use crate::switch::Switch;

/// How often, and how long one request may take.
#[derive(Clone, Copy, Debug)]
pub struct StatsOptions {
    pub interval: Duration,
    /// The deadline of each flow dump (one per table).
    pub deadline: Duration,
}

/// The namespaces' counting, recomputed for a namespace only when its policies' input changed.
#[derive(Default)]
struct Cache {
    version: Option<u64>,
    namespaces: HashMap<String, (NamespacePolicy, Counting)>,
    attribution: Arc<Attribution>,
    /// The attribution before the last refresh: a flow a policy change removed is known there.
    previous: Arc<Attribution>,
}

impl Cache {
    /// Brings the attribution up to the model (the isolation is taken under the model lock, as
    /// the reconciler computes flows; the flows' roles off the runtime).
    async fn refresh(&mut self, state: &State) -> Result<(), String> {
        let (version, inputs) = {
            let m = state.lock();
            if self.version == Some(m.version) {
                return Ok(());
            }
            (m.version, m.effective().map(crate::cluster::desired::netpol_isolations).unwrap_or_default())
        };
        let mut old = std::mem::take(&mut self.namespaces);
        let (namespaces, attribution) = tokio::task::spawn_blocking(move || {
            let mut next = HashMap::with_capacity(inputs.len());
            for ns in inputs {
                let c = match old.remove(&ns.namespace) {
                    Some((prev, c)) if prev == ns => c,
                    _ => counting(&ns),
                };
                next.insert(ns.namespace.clone(), (ns, c));
            }
            let a = Attribution::new(next.values().map(|(_, c)| c));
            (next, a)
        })
        .await
        .map_err(|e| format!("computing what the policy flows count: {e}"))?;
        self.namespaces = namespaces;
        self.previous = std::mem::replace(&mut self.attribution, Arc::new(attribution));
        self.version = Some(version);
        Ok(())
    }
}

/// The series exported, so those the model no longer has are removed.
#[derive(Default)]
struct Exported {
    allowed: HashSet<PolicyLabel>,
    dropped: HashSet<NamespaceDirectionLabel>,
}

fn direction(side: Side) -> String {
    side.audit_direction().as_str().to_string()
}

/// One dump of each policy table's NetworkPolicy flows, as (key, cookie, counts).
async fn read(sw: &Switch, deadline: Duration) -> Result<Vec<(FlowKey, u64, Sample)>, String> {
    let kind = u64::from(Owner::NetworkPolicy { namespace: String::new() }.kind()) << 56;
    let mut out = Vec::new();
    for table in [Table::Policy, Table::PolicyEgress] {
        let req = FlowStatsRequest { table_id: table.id(), cookie: kind, cookie_mask: 0xff << 56, ..Default::default() };
        let flows = tokio::time::timeout(deadline, sw.dump_flows(req))
            .await
            .map_err(|_| format!("dumping table {}: no answer within {deadline:?}", table.id()))?
            .map_err(|e| format!("dumping table {}: {e}", table.id()))?;
        out.extend(flows.into_iter().map(|f| {
            let age = Duration::from_secs(u64::from(f.duration_sec)) + Duration::from_nanos(u64::from(f.duration_nsec));
            (FlowKey::new(f.table_id, f.priority, &f.match_), f.cookie, Sample { packets: f.packet_count, bytes: f.byte_count, age })
        }));
    }
    Ok(out)
}

/// Mirrors the totals into the Prometheus families (each counter raised to its total: never
/// lowered) and removes the series of what the model no longer has.
fn export(m: &Metrics, t: &Totals, exported: &mut Exported) {
    let mut allowed = HashSet::new();
    for ((namespace, policy, side), a) in &t.allowed {
        let l = PolicyLabel { namespace: namespace.clone(), policy: policy.clone(), direction: direction(*side) };
        let c = m.policy_connections.get_or_create(&l);
        c.inc_by(a.total.packets.saturating_sub(c.get()));
        allowed.insert(l);
    }
    let mut dropped = HashSet::new();
    for ((namespace, side), d) in &t.dropped {
        let l = NamespaceDirectionLabel { namespace: namespace.clone(), direction: direction(*side) };
        let p = m.policy_dropped_packets.get_or_create(&l);
        p.inc_by(d.packets.saturating_sub(p.get()));
        let b = m.policy_dropped_bytes.get_or_create(&l);
        b.inc_by(d.bytes.saturating_sub(b.get()));
        dropped.insert(l);
    }
    for l in exported.allowed.difference(&allowed) {
        m.policy_connections.remove(l);
    }
    for l in exported.dropped.difference(&dropped) {
        m.policy_dropped_packets.remove(l);
        m.policy_dropped_bytes.remove(l);
    }
    m.policy_unattributed_packets.inc_by(t.unattributed.packets.saturating_sub(m.policy_unattributed_packets.get()));
    *exported = Exported { allowed, dropped };
}

/// The status form of the totals, pods named from the model.
fn report(state: &State, t: &Totals, into: &mut PolicyCounters) {
    into.allowed = t
        .allowed
        .iter()
        .map(|((namespace, policy, side), a)| AllowedCount {
            namespace: namespace.clone(),
            policy: policy.clone(),
            direction: direction(*side),
            connections: a.total.packets,
            rules: a.rules.clone(),
        })
        .collect();
    let m = state.lock();
    into.dropped = t
        .dropped
        .iter()
        .map(|((namespace, side), d)| DroppedCount {
            namespace: namespace.clone(),
            direction: direction(*side),
            packets: d.packets,
            bytes: d.bytes,
            pods: t
                .dropped_pods
                .range((namespace.clone(), *side, std::net::IpAddr::from(std::net::Ipv4Addr::UNSPECIFIED))..=(namespace.clone(), *side, std::net::IpAddr::from(std::net::Ipv6Addr::from(u128::MAX))))
                .map(|((_, _, ip), c)| PodDrops {
                    pod: m.pod_at(*ip).unwrap_or_else(|| ip.to_string()),
                    ip: ip.to_string(),
                    packets: c.packets,
                    bytes: c.bytes,
                })
                .collect(),
        })
        .collect();
    into.unattributed_packets = t.unattributed.packets;
}

/// Flow-removed messages of this connection, once it was asked to send them.
type Removed = tokio::sync::broadcast::Receiver<openflow::FlowRemoved>;

/// Subscribes to a new connection's flow-removed messages and asks the switch for them.
async fn follow_removed(sw: Option<Switch>, deadline: Duration) -> Option<Removed> {
    let sw = sw.filter(|s| !s.is_closed())?;
    let rx = sw.subscribe_flow_removed();
    match tokio::time::timeout(deadline, sw.enable_flow_removed()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "policy counters: cannot ask the switch for flow-removed messages; counts of replaced flows may be lost"),
        Err(_) => warn!("policy counters: no answer to the flow-removed settings; counts of replaced flows may be lost"),
    }
    Some(rx)
}

/// Applies one removal: the flow's counts since its last read, attributed by the current
/// attribution or, for a flow the model no longer has, the previous one.
fn apply_removed(f: &openflow::FlowRemoved, acc: &mut Accumulator, totals: &mut Totals, cache: &Cache) {
    if !crate::store::sends_flow_removed(f.table_id, f.cookie) {
        return;
    }
    let Ok(m) = f.match_() else {
        debug!(cookie = f.cookie, "policy counters: flow-removed with a match this agent cannot decode");
        return;
    };
    let key = FlowKey::new(f.table_id, f.priority, &m);
    let Some(d) = acc.removed(key.clone(), f.cookie, f.packet_count, f.byte_count) else { return };
    let attr = if cache.attribution.get(&key, f.cookie).is_some() { &cache.attribution } else { &cache.previous };
    totals.add(attr, &[(key, f.cookie, d)]);
}

/// Every removal already received, applied.
fn drain_removed(rx: &mut Option<Removed>, acc: &mut Accumulator, totals: &mut Totals, cache: &Cache) {
    use tokio::sync::broadcast::error::TryRecvError;
    while let Some(r) = rx.as_mut() {
        match r.try_recv() {
            Ok(f) => apply_removed(&f, acc, totals, cache),
            Err(TryRecvError::Lagged(n)) => warn!(lost = n, "policy counters: flow-removed messages lost (too many at once)"),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Closed) => *rx = None,
        }
    }
}

/// Reads the counters every `opts.interval` until `cancel`.
pub async fn run(state: State, metrics: Arc<crate::metrics::Metrics>, mut switch: watch::Receiver<Option<Switch>>, opts: StatsOptions, cancel: CancellationToken) {
    metrics.policy_counters.lock().interval_seconds = opts.interval.as_secs_f64();
    let mut tick = tokio::time::interval(opts.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut cache, mut acc, mut totals, mut exported) = (Cache::default(), Accumulator::default(), Totals::default(), Exported::default());
    let mut failures = 0u32;
    let current = switch.borrow_and_update().clone();
    let mut removed = follow_removed(current, opts.deadline).await;
    let mut switch_open = true;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            c = switch.changed(), if switch_open => {
                if c.is_err() {
                    switch_open = false;
                } else {
                    // What the old connection still had queued, then the new one's.
                    drain_removed(&mut removed, &mut acc, &mut totals, &cache);
                    let current = switch.borrow_and_update().clone();
                    removed = follow_removed(current, opts.deadline).await;
                }
                continue;
            }
            f = async { removed.as_mut().unwrap().recv().await }, if removed.is_some() => {
                match f {
                    Ok(f) => apply_removed(&f, &mut acc, &mut totals, &cache),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        warn!(lost = n, "policy counters: flow-removed messages lost (too many at once)")
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => removed = None,
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        let r = async {
            cache.refresh(&state).await?;
            let attr = cache.attribution.clone();
            // Nothing of the model counts (no policy selects a local pod): the switch is not asked.
            let flows = if attr.is_empty() {
                vec![]
            } else {
                let sw = switch.borrow().clone().filter(|s| !s.is_closed()).ok_or("the switch is not connected")?;
                read(&sw, opts.deadline).await?
            };
            let n = flows.len();
            // Removals that arrived before the dump's reply: applied first (the dump may still
            // list those flows; the accumulator skips them).
            drain_removed(&mut removed, &mut acc, &mut totals, &cache);
            let deltas = acc.read(flows);
            totals.retain_known(&attr);
            totals.add(&attr, &deltas);
            Ok::<usize, String>(n)
        }
        .await;
        let result = if r.is_ok() { "ok" } else { "error" };
        metrics.policy_stats_reads.get_or_create(&ResultLabel { result: result.into() }).inc();
        match r {
            Ok(n) => {
                export(&metrics, &totals, &mut exported);
                // Built with the model's lock alone, then published.
                let mut c = metrics.policy_counters.report();
                report(&state, &totals, &mut c);
                c.last_read_unix_ms = Some(crate::policy_report::unix_ms(SystemTime::now()));
                c.flows_read = n;
                c.last_error = None;
                c.last_error_unix_ms = None;
                *metrics.policy_counters.lock() = c;
                if failures > 0 {
                    info!(after = failures, "policy counters: reading the switch again");
                }
                failures = 0;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    warn!(error = %e, "policy counters: cannot read the flow statistics; will retry (the counters keep their values)");
                } else {
                    debug!(error = %e, attempts = failures, "policy counters: still failing");
                }
                let mut c = metrics.policy_counters.lock();
                c.last_error = Some(e);
                c.last_error_unix_ms = Some(crate::policy_report::unix_ms(SystemTime::now()));
            }
        }
    }
}
