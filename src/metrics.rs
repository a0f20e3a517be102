//! Prometheus metrics (prometheus-client) and the health state behind `/healthz` and `/readyz`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpResult {
    pub op: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// An IP family: `ipv4` or `ipv6`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabel {
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    /// setup, teardown, list.
    pub op: String,
    /// The HTTP status code answered.
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// pod_api, metrics.
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabel {
    pub listener: String,
    /// evicted_idle, refused.
    pub why: String,
}

pub use crate::rejections::KindLabel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutorLabel {
    pub executor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuditLabel {
    /// written (a JSON line), dropped (the writer was behind), invalid (not an audit
    /// packet-in), write_error.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabel {
    /// What was put back: bridge, base_port, pod_port, pod_record, qos, flows, generation.
    pub what: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub namespace: String,
    /// The NetworkPolicy's name.
    pub policy: String,
    /// ingress, egress.
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceDirectionLabel {
    pub namespace: String,
    /// ingress, egress.
    pub direction: String,
}

/// The parts of the node that converge on their own: one failing never holds back the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Executor {
    /// The node's own networking: tun0's address and MTU, routes, sysctls, the nftables table.
    Host,
    /// OVSDB: the bridge and its base ports, pod ports, their records and QoS.
    Ovsdb,
    /// The switch's flows.
    Flows,
}

impl Executor {
    pub const ALL: [Executor; 3] = [Executor::Host, Executor::Ovsdb, Executor::Flows];

    pub fn name(self) -> &'static str {
        match self {
            Executor::Host => "host",
            Executor::Ovsdb => "ovsdb",
            Executor::Flows => "flows",
        }
    }
}

/// One executor's health: failing since when, why, how often.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecutorHealth {
    /// The last error, while failing (cleared by the next success).
    pub error: Option<String>,
    /// When the current run of failures began.
    pub failing_since: Option<std::time::SystemTime>,
    /// Consecutive failures (0 while healthy).
    pub failures: u32,
    /// When it last succeeded.
    pub last_ok: Option<std::time::SystemTime>,
    /// Started and has not converged once yet.
    pub pending: bool,
}

/// Every metric the agent exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    pub flow_mods: Family<OpResult, Counter>,
    pub bundles: Family<ResultLabel, Counter>,
    pub bundle_latency: Histogram,
    pub flows: Family<TableLabel, Gauge>,
    /// The node's pods with an address of each IP family. The one metric with a `family`
    /// label: the others count things that are not per family (a pod request, a bundle and a
    /// table's flows serve both families at once), so a label would split them arbitrarily.
    pub pod_addresses: Family<FamilyLabel, Gauge>,
    pub reconnects: Family<TargetLabel, Counter>,
    pub resyncs: Family<KindLabel, Counter>,
    pub rejected: Family<KindLabel, Counter>,
    /// The objects rejected now, with since when, and their gauge (`rejected_objects`).
    pub rejections: crate::rejections::Rejections,
    pub dns_failures: Counter,
    pub pod_setup: Histogram,
    pub connected: Family<TargetLabel, Gauge>,
    pub pod_requests: Family<RequestLabel, Counter>,
    /// Seconds since the reconcile loop last finished a pass (0 while idle and caught up).
    pub reconcile_stalled: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// NetworkPolicies of the current state with a part this node could not use (dropped,
    /// never widening what is allowed): counted where an operator looks.
    pub policies_partly_enforced: Gauge,
    /// Failed converge attempts, by executor (host, ovsdb, flows).
    pub converge_errors: Family<ExecutorLabel, Counter>,
    /// Audit log packet-ins by outcome (the switch's meter already dropped what was over its
    /// rate: `ovs-ofctl meter-stats`).
    pub audit_events: Family<AuditLabel, Counter>,
    /// Things someone else removed or changed that the agent put back, by what.
    pub repairs: Family<RepairLabel, Counter>,
    /// Open connections per listener (each is capped: see `api::serve`).
    pub api_connections: Family<ListenerLabel, Gauge>,
    /// Connections the agent closed to stay under a listener's cap.
    pub api_connections_shed: Family<ShedLabel, Counter>,
    /// NetworkPolicy changes, source event to the switch's acknowledgement (see
    /// [`crate::realize`]); the per-policy table behind it is in `realization`.
    pub policy_realization: Histogram,
    /// Waits for ovs-vswitchd to push its datapath counts before a policy change removes
    /// counting flows (see [`crate::engine::CountFlush`]).
    pub policy_count_flush: Histogram,
    /// Which generation of each policy the switch holds (for `sdn-node status`).
    pub realization: crate::realize::Realization,
    /// New connections each NetworkPolicy allowed, by namespace, policy and direction (from
    /// flow statistics: see [`crate::policy_stats`]).
    pub policy_connections: Family<PolicyLabel, Counter>,
    /// Packets and bytes dropped for a namespace's isolated pods, by direction.
    pub policy_dropped_packets: Family<NamespaceDirectionLabel, Counter>,
    pub policy_dropped_bytes: Family<NamespaceDirectionLabel, Counter>,
    /// Packets of NetworkPolicy flows the model did not name when read.
    pub policy_unattributed_packets: Counter,
    /// Reads of the policy flows' statistics, by result (ok, error).
    pub policy_stats_reads: Family<ResultLabel, Counter>,
    /// The same counters per policy and pod, and when they were read (for `sdn-node status`).
    pub policy_counters: crate::policy_report::Shared,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn latency_buckets() -> Histogram {
    // 20 µs .. ~10 s.
    Histogram::new(exponential_buckets(20e-6, 2.0, 20))
}

fn realization_buckets() -> Histogram {
    // 1 ms .. ~65 s: a policy waits for debouncing, the model and the switch, not for µs.
    Histogram::new(exponential_buckets(1e-3, 2.0, 17))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let policy_realization = realization_buckets();
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("sdn_node")),
            flow_mods: Family::default(),
            bundles: Family::default(),
            bundle_latency: latency_buckets(),
            flows: Family::default(),
            pod_addresses: Family::default(),
            reconnects: Family::default(),
            resyncs: Family::default(),
            rejected: Family::default(),
            rejections: Default::default(),
            dns_failures: Counter::default(),
            pod_setup: latency_buckets(),
            connected: Family::default(),
            pod_requests: Family::default(),
            reconcile_stalled: Gauge::default(),
            policies_partly_enforced: Gauge::default(),
            converge_errors: Family::default(),
            audit_events: Family::default(),
            repairs: Family::default(),
            api_connections: Family::default(),
            api_connections_shed: Family::default(),
            // One histogram: the tracker observes into the registered one.
            realization: crate::realize::Realization::new(policy_realization.clone()),
            policy_realization,
            policy_count_flush: latency_buckets(),
            policy_connections: Family::default(),
            policy_dropped_packets: Family::default(),
            policy_dropped_bytes: Family::default(),
            policy_unattributed_packets: Counter::default(),
            policy_stats_reads: Family::default(),
            policy_counters: crate::policy_report::Shared::default(),
        };
        {
            let mut r = m.registry.lock().unwrap_or_else(|e| e.into_inner());
            r.register("flow_mods", "FLOW_MODs sent, by operation (add, modify, delete) and bundle result", m.flow_mods.clone());
            r.register("bundles", "Bundles committed, by result", m.bundles.clone());
            r.register("bundle_latency_seconds", "Bundle commit latency (send to commit reply)", m.bundle_latency.clone());
            r.register("flows", "Desired flows per table", m.flows.clone());
            r.register(
                "pod_addresses",
                "Pods of the node's current state with an address of each IP family (ipv4: every pod; ipv6: a dual-stack cluster's)",
                m.pod_addresses.clone(),
            );
            r.register("reconnects", "Connections established to the switch (openflow) and ovsdb-server (ovsdb)", m.reconnects.clone());
            r.register("resyncs", "Resyncs from a dump, by kind (difference, full_replay)", m.resyncs.clone());
            r.register("objects_rejected", "Objects rejected by validation, by kind", m.rejected.clone());
            r.register(
                "rejected_objects",
                "Objects rejected now, by kind (a rejected object of the state file that was good before keeps its last good version); cleared when fixed",
                m.rejections.gauge.clone(),
            );
            r.register("dns_failures", "Egress dnsName resolutions that failed (the VNID drops all egress)", m.dns_failures.clone());
            r.register("pod_setup_seconds", "Pod API setup latency (request to committed flows)", m.pod_setup.clone());
            r.register("connected", "1 while connected, by target (openflow, ovsdb)", m.connected.clone());
            r.register("pod_requests", "Pod API requests, by operation and the status code answered (503: switch or OVSDB unavailable, 504: deadline)", m.pod_requests.clone());
            r.register(
                "policies_partly_enforced",
                "NetworkPolicies with a part this node could not use and dropped (never allowing more); the problem names the field",
                m.policies_partly_enforced.clone(),
            );
            r.register("audit_events", "NetworkPolicy audit log packet-ins, by outcome (written, dropped, invalid, write_error)", m.audit_events.clone());
            r.register("converge_errors", "Failed converge attempts, by executor (host, ovsdb, flows); each retries on its own", m.converge_errors.clone());
            r.register("repairs", "What someone else removed or changed and the agent put back from its model, by what", m.repairs.clone());
            r.register("api_connections", "Open connections, by listener (pod_api, metrics)", m.api_connections.clone());
            r.register(
                "api_connections_shed",
                "Connections closed by the agent to stay under a listener's cap, by listener and why (evicted_idle: the oldest idle one made room for a new one; refused: all were busy)",
                m.api_connections_shed.clone(),
            );
            r.register(
                "policy_realization_seconds",
                "NetworkPolicy changes: from the source event (Kubernetes watch event, state file change) to the switch's acknowledgement of the bundle carrying the policy's flows",
                m.policy_realization.clone(),
            );
            r.register(
                "policy_count_flush_seconds",
                "Waits, before a policy change that removes counting flows, for ovs-vswitchd to move what its datapath counted into the flows' statistics (one revalidation round), so the per-policy counters keep every packet",
                m.policy_count_flush.clone(),
            );
            r.register(
                "policy_connections",
                "New connections a NetworkPolicy allowed, by namespace, policy and direction: the first packet of each TCP/UDP connection (established ones pass before the policy flows), every packet of other protocols",
                m.policy_connections.clone(),
            );
            r.register(
                "policy_dropped_packets",
                "Packets dropped because no NetworkPolicy rule allowed them, by namespace and direction (every packet, retransmissions included)",
                m.policy_dropped_packets.clone(),
            );
            r.register("policy_dropped_bytes", "Bytes of the packets counted by sdn_node_policy_dropped_packets", m.policy_dropped_bytes.clone());
            r.register(
                "policy_unattributed_packets",
                "Packets of NetworkPolicy flows the model did not name when their statistics were read (a change under way)",
                m.policy_unattributed_packets.clone(),
            );
            r.register("policy_stats_reads", "Reads of the NetworkPolicy flows' statistics, by result (ok, error)", m.policy_stats_reads.clone());
            r.register("reconcile_busy_seconds", "How long the reconcile loop has been working on its current pass", m.reconcile_stalled.clone());
            r.register(
                "log_lines_dropped",
                "Log lines that could not be written to stderr (closed or failing); the agent runs on without them",
                crate::process::LOG_LINES_DROPPED.clone(),
            );
        }
        // Known series start at zero, so a scrape shows every family before it first moves.
        for kind in ["pod", "service", "hostsubnet", "netnamespace", "egressnetworkpolicy"] {
            m.rejected.get_or_create(&KindLabel { kind: kind.into() }).inc_by(0);
        }
        for kind in ["difference", "full_replay"] {
            m.resyncs.get_or_create(&KindLabel { kind: kind.into() }).inc_by(0);
        }
        for target in ["openflow", "ovsdb"] {
            m.reconnects.get_or_create(&TargetLabel { target: target.into() }).inc_by(0);
            m.connected.get_or_create(&TargetLabel { target: target.into() }).set(0);
        }
        for op in ["setup", "teardown"] {
            for code in ["200", "400", "404", "409", "500", "503", "504"] {
                m.pod_requests.get_or_create(&RequestLabel { op: op.into(), code: code.into() }).inc_by(0);
            }
        }
        for listener in ["pod_api", "metrics"] {
            m.api_connections.get_or_create(&ListenerLabel { listener: listener.into() }).set(0);
            for why in ["evicted_idle", "refused"] {
                m.api_connections_shed.get_or_create(&ShedLabel { listener: listener.into(), why: why.into() }).inc_by(0);
            }
        }
        for result in ["ok", "error"] {
            m.bundles.get_or_create(&ResultLabel { result: result.into() }).inc_by(0);
            m.policy_stats_reads.get_or_create(&ResultLabel { result: result.into() }).inc_by(0);
        }
        for e in Executor::ALL {
            m.converge_errors.get_or_create(&ExecutorLabel { executor: e.name().into() }).inc_by(0);
        }
        for what in ["bridge", "bridge_setting", "base_port", "generation", "pod_port", "pod_record", "qos", "flows", "host"] {
            m.repairs.get_or_create(&RepairLabel { what: what.into() }).inc_by(0);
        }
        m
    }

    /// Counts one repair of `what` (see [`RepairLabel`]).
    pub fn repaired(&self, what: &str) {
        self.repairs.get_or_create(&RepairLabel { what: what.into() }).inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        // The log queue's drops into their counter first.
        crate::process::log_lines_dropped();
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
            out.clear();
        }
        out
    }

    pub fn bundle(&self, ok: bool, adds: usize, modifies: usize, deletes: usize, latency: Duration) {
        let result = if ok { "ok" } else { "error" };
        self.bundles.get_or_create(&ResultLabel { result: result.into() }).inc();
        for (op, n) in [("add", adds), ("modify", modifies), ("delete", deletes)] {
            if n > 0 {
                self.flow_mods.get_or_create(&OpResult { op: op.into(), result: result.into() }).inc_by(n as u64);
            }
        }
        if ok {
            self.bundle_latency.observe(latency.as_secs_f64());
        }
    }

    pub fn count_flush(&self, waited: Duration) {
        self.policy_count_flush.observe(waited.as_secs_f64());
    }

    pub fn resync(&self, full: bool) {
        let kind = if full { "full_replay" } else { "difference" };
        self.resyncs.get_or_create(&KindLabel { kind: kind.into() }).inc();
    }

    pub fn reject(&self, object: &str) {
        // "pod team-a/a1" -> "pod".
        let kind = object.split_whitespace().next().unwrap_or("unknown");
        self.rejected.get_or_create(&KindLabel { kind: kind.into() }).inc();
    }

    pub fn set_connected(&self, target: &str, up: bool) {
        self.connected.get_or_create(&TargetLabel { target: target.into() }).set(up as i64);
        if up {
            self.reconnects.get_or_create(&TargetLabel { target: target.into() }).inc();
        }
    }

    /// Sets `sdn_node_pod_addresses` from the node's pods: both families always (a zero IPv6
    /// count says IPv4-only, a zero IPv4 count IPv6-only, where a missing series would say
    /// nothing).
    pub fn set_pod_addresses(&self, pods: &[crate::cluster::Pod]) {
        let v4 = pods.iter().filter(|p| p.ip.is_some()).count();
        let v6 = pods.iter().filter(|p| p.ip6.is_some()).count();
        for (family, n) in [("ipv4", v4), ("ipv6", v6)] {
            self.pod_addresses.get_or_create(&FamilyLabel { family: family.into() }).set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn set_flows_per_table(&self, per_table: &[(u8, usize)]) {
        self.flows.clear();
        for (t, n) in per_table {
            self.flows.get_or_create(&TableLabel { table: t.to_string() }).set(*n as i64);
        }
    }
}

/// What `/healthz` and `/readyz` report.
///
/// - healthy (`/healthz`, liveness): the daemon's own loops make progress — the reconcile loop
///   has not been stuck in one pass for longer than the watchdog. A disconnected switch is not
///   a reason to restart the agent, so it does not make it unhealthy.
/// - ready (`/readyz`): healthy, connected to ovsdb-server and ovs-vswitchd (both answered their
///   probes: a silent peer is disconnected by its probe), the source delivered a state, and the
///   switch and OVSDB hold the latest model (the last converge succeeded and nothing failed
///   since).
#[derive(Debug)]
pub struct Health {
    pub switch: AtomicBool,
    pub ovsdb: AtomicBool,
    /// The sources delivered a complete state (file parsed / caches synced).
    pub synced: AtomicBool,
    /// The switch and OVSDB hold the latest model.
    pub converged: AtomicBool,
    /// When the reconcile loop started its current pass (ms since `epoch`; 0: idle).
    busy_since: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
    /// How long one pass may take before the loop counts as stuck (ms).
    watchdog_ms: std::sync::atomic::AtomicU64,
    /// Each executor's last result.
    executors: Mutex<[ExecutorHealth; 3]>,
    /// What the source waits for before it can deliver a state (Kubernetes: a ClusterNetwork,
    /// this node's HostSubnet, the first lists), or, after one, before it can deliver the next
    /// (the last good state stays applied meanwhile).
    waiting: Mutex<Option<String>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            switch: AtomicBool::new(false),
            ovsdb: AtomicBool::new(false),
            synced: AtomicBool::new(false),
            converged: AtomicBool::new(false),
            busy_since: std::sync::atomic::AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            watchdog_ms: std::sync::atomic::AtomicU64::new(120_000),
            executors: Mutex::default(),
            waiting: Mutex::default(),
        }
    }
}

impl Health {
    pub fn set_watchdog(&self, d: Duration) {
        self.watchdog_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn watchdog(&self) -> Duration {
        Duration::from_millis(self.watchdog_ms.load(Ordering::Relaxed))
    }

    /// The reconcile loop starts a pass.
    pub fn busy(&self) {
        let now = (self.epoch.elapsed().as_millis() as u64).max(1);
        self.busy_since.store(now, Ordering::Relaxed);
    }

    /// The reconcile loop finished its pass.
    pub fn idle(&self) {
        self.busy_since.store(0, Ordering::Relaxed);
    }

    /// How long the current pass has taken (zero while idle).
    pub fn busy_for(&self) -> Duration {
        match self.busy_since.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            since => self.epoch.elapsed().saturating_sub(Duration::from_millis(since)),
        }
    }

    /// `None` if healthy, else why not.
    pub fn unhealthy(&self) -> Option<String> {
        let busy = self.busy_for();
        let limit = self.watchdog();
        (busy > limit).then(|| format!("the reconcile loop has been stuck for {busy:?} (watchdog {limit:?})"))
    }

    pub fn not_ready(&self) -> Option<String> {
        let mut why = Vec::new();
        if let Some(w) = self.unhealthy() {
            why.push(w);
        }
        if !self.synced.load(Ordering::Relaxed) {
            // What the source waits for, before the peers: without a state there is no bridge
            // for the switch to connect to either.
            why.push(self.waiting().unwrap_or_else(|| "state not synced".into()));
        }
        if !self.switch.load(Ordering::Relaxed) {
            why.push("switch (OpenFlow) not connected".into());
        }
        if !self.ovsdb.load(Ordering::Relaxed) {
            why.push("ovsdb-server not connected".into());
        }
        for (e, h) in Executor::ALL.iter().zip(self.executors()) {
            if let Some(err) = &h.error {
                let since = h
                    .failing_since
                    .and_then(|t| t.elapsed().ok())
                    .map(|d| format!("{:.0}s", d.as_secs_f64()))
                    .unwrap_or_else(|| "?".into());
                why.push(format!("{} executor failing for {since} ({} attempts): {err}", e.name(), h.failures));
            } else if h.pending {
                why.push(format!("{} executor has not converged yet", e.name()));
            }
        }
        if why.is_empty() && !self.converged.load(Ordering::Relaxed) {
            why.push("switch not converged to the latest state".into());
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// The source says what it waits for (`None`: nothing). Before the first state this is
    /// why the node is not ready; after it, the last good state stays applied and this is
    /// reported by `sdn-node status` only.
    pub fn set_waiting(&self, what: Option<String>) {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) = what;
    }

    /// What the source waits for, if anything (see [`Health::set_waiting`]).
    pub fn waiting(&self) -> Option<String> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every executor's health, in [`Executor::ALL`] order.
    pub fn executors(&self) -> [ExecutorHealth; 3] {
        self.executors.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn executor_slot<R>(&self, e: Executor, f: impl FnOnce(&mut ExecutorHealth) -> R) -> R {
        let mut all = self.executors.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut all[e as usize])
    }

    /// `e` runs and must converge once before the node is ready.
    pub fn executor_started(&self, e: Executor) {
        self.executor_slot(e, |h| h.pending = h.last_ok.is_none());
    }

    /// `e` converged. True if it was failing until now.
    pub fn executor_ok(&self, e: Executor) -> bool {
        self.executor_slot(e, |h| {
            let was = h.error.is_some();
            *h = ExecutorHealth { last_ok: Some(std::time::SystemTime::now()), ..Default::default() };
            was
        })
    }

    /// `e` failed with `error`; returns how many times in a row.
    pub fn executor_failed(&self, e: Executor, error: String) -> u32 {
        self.executor_slot(e, |h| {
            h.failing_since.get_or_insert_with(std::time::SystemTime::now);
            h.error = Some(error);
            h.failures = h.failures.saturating_add(1);
            h.pending = false;
            h.failures
        })
    }
}

impl Telemetry {
    /// The switch or OVSDB may no longer hold what the model says: not converged until a pass
    /// confirms it.
    pub fn not_converged(&self) {
        self.health.converged.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Records one converge attempt of `e`: health (for `/readyz` and status) and, on failure,
    /// `sdn_node_converge_errors_total{executor}`. Logs the first failure and the recovery;
    /// repeated failures are logged at debug level (the metric counts them).
    pub fn executor_result<E: std::fmt::Display>(&self, e: Executor, r: &Result<(), E>) {
        match r {
            Ok(()) => {
                if self.health.executor_ok(e) {
                    tracing::info!(executor = e.name(), "executor converged again");
                }
            }
            Err(err) => {
                let msg = err.to_string();
                self.metrics.converge_errors.get_or_create(&ExecutorLabel { executor: e.name().into() }).inc();
                let n = self.health.executor_failed(e, msg.clone());
                if n == 1 {
                    tracing::warn!(executor = e.name(), error = %msg, "executor failed; retrying with backoff (the others go on)");
                } else {
                    tracing::debug!(executor = e.name(), error = %msg, attempts = n, "executor still failing");
                }
            }
        }
    }
}

/// Capped exponential backoff for an executor's retries: `base`, 2×, 4×, ... up to `cap`.
pub fn retry_delay(failures: u32, base: Duration, cap: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    base.saturating_mul(1u32 << exp).min(cap)
}

/// Shared handles.
#[derive(Clone, Debug, Default)]
pub struct Telemetry {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

/// Mirrors the audit log's counters into [`Metrics::audit_events`] twice a second until
/// `cancel`.
pub async fn follow_audit(m: Arc<Metrics>, c: Arc<crate::audit::AuditCounters>, cancel: tokio_util::sync::CancellationToken) {
    let mut last = [0u64; 4];
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = [c.events(), c.dropped(), c.invalid(), c.write_errors()];
        for (i, outcome) in ["written", "dropped", "invalid", "write_error"].iter().enumerate() {
            m.audit_events.get_or_create(&AuditLabel { outcome: outcome.to_string() }).inc_by(now[i].saturating_sub(last[i]));
        }
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executors_report_failures_and_recover() {
        let t = Telemetry::default();
        t.health.switch.store(true, Ordering::Relaxed);
        t.health.ovsdb.store(true, Ordering::Relaxed);
        t.health.synced.store(true, Ordering::Relaxed);
        t.health.converged.store(true, Ordering::Relaxed);
        assert_eq!(t.health.not_ready(), None);
        t.executor_result(Executor::Host, &Err("gateway interface tun0 not found"));
        t.executor_result(Executor::Host, &Err("gateway interface tun0 not found"));
        let why = t.health.not_ready().expect("not ready while host fails");
        assert!(why.contains("host executor failing") && why.contains("tun0 not found") && why.contains("2 attempts"), "{why}");
        assert!(t.metrics.encode().contains("sdn_node_converge_errors_total{executor=\"host\"} 2"), "{}", t.metrics.encode());
        assert!(t.metrics.encode().contains("sdn_node_converge_errors_total{executor=\"flows\"} 0"));
        t.executor_result::<String>(Executor::Host, &Ok(()));
        assert_eq!(t.health.not_ready(), None);
        assert!(t.health.executors()[0].last_ok.is_some());
    }

    #[test]
    fn what_the_source_waits_for_is_why_not_ready_until_synced() {
        let h = Health::default();
        h.switch.store(true, Ordering::Relaxed);
        h.ovsdb.store(true, Ordering::Relaxed);
        assert!(h.not_ready().unwrap().starts_with("state not synced"), "{:?}", h.not_ready());
        h.set_waiting(Some("no HostSubnet for node n yet".into()));
        assert!(h.not_ready().unwrap().starts_with("no HostSubnet for node n yet"), "{:?}", h.not_ready());
        // Synced: the last good state applies; the wait is status' to say, not readiness'.
        h.synced.store(true, Ordering::Relaxed);
        h.converged.store(true, Ordering::Relaxed);
        assert_eq!(h.not_ready(), None);
        assert_eq!(h.waiting().as_deref(), Some("no HostSubnet for node n yet"));
    }

    #[test]
    fn retry_delay_is_capped() {
        let (b, c) = (Duration::from_millis(500), Duration::from_secs(30));
        assert_eq!(retry_delay(1, b, c), b);
        assert_eq!(retry_delay(3, b, c), Duration::from_secs(2));
        assert_eq!(retry_delay(40, b, c), c);
    }

    #[test]
    fn families_are_exported() {
        let m = Metrics::new();
        m.bundle(true, 4, 0, 1, Duration::from_micros(90));
        m.reject("pod team-a/a1");
        m.set_flows_per_table(&[(20, 3)]);
        let (s, _) = crate::cluster::state_file::parse(
            r#"
node: node-a
plugin: multitenant
clusterNetworks: [10.128.0.0/14, "fd00:10:128::/48"]
serviceNetworks: [172.30.0.0/16, "fd00:172:30::/112"]
hostSubnets: [{host: node-a, hostIP: 172.17.0.2, subnets: [10.128.2.0/23, "fd00:10:128:2::/64"]}]
netNamespaces: [{name: a, netid: 11}]
pods:
  - {namespace: a, name: a1, containerID: a100000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, ips: [10.128.2.5, "fd00:10:128:2::5"], mac: "0a:58:0a:80:02:05"}
  - {namespace: a, name: a2, containerID: a200000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a2, internal: true, ip: 10.128.2.6, mac: "0a:58:0a:80:02:06"}
"#,
        )
        .unwrap();
        let pods = s.pods.clone();
        assert_eq!(pods.len(), 2);
        m.set_pod_addresses(&pods);
        let t = m.encode();
        assert!(t.contains(&format!("sdn_node_pod_addresses{{family=\"ipv4\"}} {}", pods.len())), "{t}");
        assert!(t.contains(&format!("sdn_node_pod_addresses{{family=\"ipv6\"}} {}", pods.len() - 1)), "{t}");
        // An IPv6-only node's pods: no IPv4 address.
        let (s6, _) = crate::cluster::state_file::parse(include_str!("../deploy/examples/ipv6-only.yaml")).unwrap();
        m.set_pod_addresses(&s6.pods);
        let t6 = m.encode();
        assert!(t6.contains("sdn_node_pod_addresses{family=\"ipv4\"} 0") && t6.contains("sdn_node_pod_addresses{family=\"ipv6\"} 1"), "{t6}");
        for want in [
            "sdn_node_flow_mods_total{op=\"add\",result=\"ok\"} 4",
            "sdn_node_bundles_total{result=\"ok\"} 1",
            "sdn_node_bundle_latency_seconds_count 1",
            "sdn_node_objects_rejected_total{kind=\"pod\"} 1",
            "sdn_node_flows{table=\"20\"} 3",
            "sdn_node_policy_realization_seconds_count 0",
        ] {
            assert!(t.contains(want), "missing {want}\n{t}");
        }
    }
}

