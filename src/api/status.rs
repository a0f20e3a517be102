//! `GET /v1/status`: the agent's own account of itself, for `sdn-node status`.
//!
//! Everything comes from the agent's state — the connections' health flags, the flow engine's
//! counters and its installed mirror, the model — never from dumping the switch: status must
//! answer instantly on a node whose switch is sick, and must not add load to a busy
//! ovs-vswitchd. The installed mirror is what the engine last confirmed (a dump, then every
//! committed bundle), so its per-table counts agree with `ovs-ofctl dump-flows` whenever the
//! engine is not dirty; `dirty` says when they may not.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::pod;

/// One peer connection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub connected: bool,
    /// Connections established so far (the first one included).
    pub connects: u64,
}

/// One bundle commit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Commit {
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    pub latency_seconds: f64,
    pub flow_mods: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<&crate::engine::CommitRecord> for Commit {
    fn from(r: &crate::engine::CommitRecord) -> Commit {
        Commit {
            at_unix_ms: r.at.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
            latency_seconds: r.latency.as_secs_f64(),
            flow_mods: r.flow_mods,
            error: r.error.clone(),
        }
    }
}

/// The flow engine's view.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Flows {
    /// The cookie generation of the flows this run wrote.
    pub generation: u32,
    /// A commit failed or the connection is new: the mirror may differ from the switch until
    /// the next resync.
    pub dirty: bool,
    pub desired: usize,
    pub installed: usize,
    /// Installed flows per table.
    pub per_table: BTreeMap<u8, usize>,
    /// Installed flows per owner kind (`pod`, `base`, `vnid`, ...; from the cookies).
    pub per_owner_kind: BTreeMap<String, usize>,
    pub bundles: u64,
    pub bundle_failures: u64,
    pub flow_mods: u64,
    pub resyncs: u64,
    pub full_replays: u64,
    pub last_commit: Option<Commit>,
    pub last_error: Option<Commit>,
}

/// The pods the agent knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pods {
    /// Pods in the effective state (source and pod API).
    pub total: usize,
    /// Of which set up through the pod API.
    pub api: usize,
    /// Pods with a port on the bridge (an ofport).
    pub with_port: usize,
    /// `namespace/name`, sorted.
    pub names: Vec<String>,
}

/// One IP family's networks on this node, from the effective state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyNetworks<Net, Addr> {
    pub cluster_network: Net,
    pub service_network: Net,
    /// This node's pod subnet of the family (its HostSubnet).
    pub local_subnet: Option<Net>,
    /// tun0's address in it: the pods' gateway (the subnet's first host address).
    pub gateway: Option<Addr>,
    /// Pods of the effective state with an address of this family.
    pub pods: usize,
}

/// The node's networks, per family the cluster has: IPv4, IPv6 or both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Networks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<FamilyNetworks<ipnet::Ipv4Net, std::net::Ipv4Addr>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<FamilyNetworks<ipnet::Ipv6Net, std::net::Ipv6Addr>>,
}

impl Networks {
    /// The networks of `s` (IPv6's when it has an IPv6 cluster and service network).
    pub fn of(s: &crate::cluster::ClusterState) -> Networks {
        let local = s.local_subnet();
        let ipv4 = match (s.cluster_network, s.service_network) {
            (Some(cluster_network), Some(service_network)) => {
                let subnet = local.and_then(|h| h.subnet);
                Some(FamilyNetworks {
                    cluster_network,
                    service_network,
                    local_subnet: subnet,
                    gateway: subnet.map(crate::pipeline::gateway),
                    pods: s.pods.iter().filter(|p| p.ip.is_some()).count(),
                })
            }
            _ => None,
        };
        let ipv6 = match (s.cluster_network6, s.service_network6) {
            (Some(cluster_network), Some(service_network)) => {
                let subnet6 = local.and_then(|h| h.subnet6);
                Some(FamilyNetworks {
                    cluster_network,
                    service_network,
                    local_subnet: subnet6,
                    gateway: subnet6.map(crate::pipeline::gateway6),
                    pods: s.pods.iter().filter(|p| p.ip6.is_some()).count(),
                })
            }
            _ => None,
        };
        Networks { ipv4, ipv6 }
    }

    fn write_text(&self, s: &mut String) {
        fn family<N: std::fmt::Display, A: std::fmt::Display>(s: &mut String, name: &str, f: &FamilyNetworks<N, A>) {
            let or_none = |x: Option<String>| x.unwrap_or_else(|| "none (no HostSubnet of this family)".into());
            let _ = writeln!(
                s,
                "  {name}  cluster {}, service {}, subnet {}, gateway {}, {} pods",
                f.cluster_network,
                f.service_network,
                or_none(f.local_subnet.as_ref().map(ToString::to_string)),
                or_none(f.gateway.as_ref().map(ToString::to_string)),
                f.pods
            );
        }
        let kind = match (&self.ipv4, &self.ipv6) {
            (Some(_), Some(_)) => "dual-stack",
            (Some(_), None) => "IPv4",
            _ => "IPv6-only",
        };
        let _ = writeln!(s, "networks:   {kind}");
        if let Some(v4) = &self.ipv4 {
            family(s, "IPv4", v4);
        }
        if let Some(v6) = &self.ipv6 {
            family(s, "IPv6", v6);
        }
    }
}

/// One executor (host, ovsdb, flows): each converges on its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorStatus {
    pub name: String,
    /// Why this executor does not run on this node (the host executor with
    /// `--no-host-network` or on the dummy datapath); `None` when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off: Option<String>,
    /// Converged on its last attempt.
    pub ok: bool,
    /// The last error, while failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Failing since (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since_unix_ms: Option<u64>,
    /// Consecutive failed attempts.
    pub failures: u32,
    /// Last success (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ok_unix_ms: Option<u64>,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One NetworkPolicy's realization (see [`crate::realize`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyStatus {
    pub namespace: String,
    pub name: String,
    /// The generation the source has (`metadata.generation`, or the state file's count).
    pub seen_generation: i64,
    /// The generation the switch acknowledged (`None`: none yet).
    pub realized_generation: Option<i64>,
    /// Source event to acknowledgement of the last generation realized.
    pub last_latency_seconds: Option<f64>,
    /// How long the seen generation has waited, while it is not realized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_seconds: Option<f64>,
}

/// One object rejected now (see [`crate::rejections`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionStatus {
    /// e.g. `pod team-a/a1`.
    pub object: String,
    /// e.g. `internl`, `ports[1].protocol` (empty: the object as a whole).
    pub field: String,
    /// Why; a rejected object that keeps its last good version says so here.
    pub message: String,
    /// When it was first rejected so (ms since the Unix epoch).
    pub since_unix_ms: u64,
}

/// The agent's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub bridge: String,
    pub switch: Connection,
    pub ovsdb: Connection,
    /// `None` when ready, else why not (as `/readyz` says).
    pub not_ready: Option<String>,
    /// What the cluster-state source waits for (Kubernetes: ClusterNetwork "default", this
    /// node's HostSubnet, the first lists), if anything. Before the first state this is also
    /// why the node is not ready; after it the last good state stays applied.
    #[serde(default)]
    pub waiting: Option<String>,
    pub synced: bool,
    pub converged: bool,
    /// The pipeline's rule version (the table-253 note).
    pub pipeline_version: u8,
    pub plugin: Option<String>,
    /// The cluster, service and local networks and the gateway of each IP family (`None`
    /// before the first state).
    #[serde(default)]
    pub networks: Option<Networks>,
    /// `None` while the engine has not started (no switch connection yet).
    pub flows: Option<Flows>,
    pub pods: Pods,
    /// Objects the model rejected, by kind (counted since start).
    pub rejected: BTreeMap<String, u64>,
    /// The objects rejected now, each with its field, why and since when (cleared when fixed).
    #[serde(default)]
    pub rejections: Vec<RejectionStatus>,
    pub model_version: u64,
    /// Each executor's health, failing ones with their last error.
    #[serde(default)]
    pub executors: Vec<ExecutorStatus>,
    /// Repairs of what someone else removed or changed, by what (since start).
    #[serde(default)]
    pub repairs: BTreeMap<String, u64>,
    /// Every NetworkPolicy (networkpolicy plugin), by namespace and name.
    #[serde(default)]
    pub policies: Vec<PolicyStatus>,
    /// Allowed connections per policy, drops per namespace and pod, from the switch's flow
    /// statistics (read every `--policy-stats-interval`, not when status is asked).
    #[serde(default)]
    pub policy_counters: crate::policy_stats::PolicyCounters,
    /// Log lines dropped because stderr could not be written (closed or failing), since start.
    #[serde(default)]
    pub log_lines_dropped: u64,
}

/// Builds the status from the node's state.
pub async fn status(path: &pod::Pods) -> Status {
    let t = &path.telemetry;
    let h = &t.health;
    let metrics_text = t.metrics.encode();
    let counter = |family: &str, label: &str| -> u64 {
        // The exposition text is the one public view of the counters' values.
        let prefix = format!("sdn_node_{family}_total{{{label}}} ");
        metrics_text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    };
    let mut rejected = BTreeMap::new();
    for kind in ["pod", "service", "hostsubnet", "netnamespace", "egressnetworkpolicy"] {
        rejected.insert(kind.to_string(), counter("objects_rejected", &format!("kind=\"{kind}\"")));
    }
    let (pods, plugin, networks, model_version) = {
        let m = path.state.lock();
        let api = m.api_records().len();
        let (names, plugin, networks) = match m.effective() {
            Some(s) => {
                let mut n: Vec<String> = s.pods.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect();
                n.sort();
                (n, Some(format!("{:?}", s.plugin).to_lowercase()), Some(Networks::of(s)))
            }
            None => (vec![], None, None),
        };
        (Pods { total: names.len(), api, with_port: m.ofports().len(), names }, plugin, networks, m.version)
    };
    let flows = match path.conns.engine() {
        None => None,
        Some(e) => match (e.status().await, e.snapshot().await) {
            (Ok(st), Ok((desired, installed, dirty))) => {
                let mut per_table = BTreeMap::new();
                let mut per_owner_kind = BTreeMap::new();
                for (k, f) in installed.iter() {
                    *per_table.entry(k.table).or_insert(0) += 1;
                    let kind = crate::store::Owner::kind_name((f.cookie >> 56) as u8)
                        .map(str::to_string)
                        .unwrap_or_else(|| {
                            if f.cookie == 0 {
                                "none".into()
                            } else {
                                format!("unknown({})", f.cookie >> 56)
                            }
                        });
                    *per_owner_kind.entry(kind).or_insert(0) += 1;
                }
                Some(Flows {
                    generation: st.generation,
                    dirty,
                    desired: desired.len(),
                    installed: installed.len(),
                    per_table,
                    per_owner_kind,
                    bundles: st.stats.bundles,
                    bundle_failures: st.stats.bundle_failures,
                    flow_mods: st.stats.flow_mods,
                    resyncs: st.stats.resyncs,
                    full_replays: st.stats.full_replays,
                    last_commit: st.stats.last_commit.as_ref().map(Commit::from),
                    last_error: st.stats.last_error.as_ref().map(Commit::from),
                })
            }
            _ => None,
        },
    };
    let executors = crate::metrics::Executor::ALL
        .iter()
        .zip(h.executors())
        .map(|(e, x)| ExecutorStatus {
            name: e.name().into(),
            off: match e {
                crate::metrics::Executor::Host if !path.cfg.host_network => Some("off (--no-host-network)".into()),
                crate::metrics::Executor::Host if !path.cfg.manages_host() => {
                    Some("off (the dummy datapath: its ports are not devices)".into())
                }
                _ => None,
            },
            ok: x.error.is_none() && x.last_ok.is_some(),
            last_error: x.error,
            failing_since_unix_ms: x.failing_since.map(unix_ms),
            failures: x.failures,
            last_ok_unix_ms: x.last_ok.map(unix_ms),
        })
        .collect();
    let repairs = metrics_text
        .lines()
        .filter_map(|l| l.strip_prefix("sdn_node_repairs_total{what=\""))
        .filter_map(|l| {
            let (what, n) = l.split_once("\"} ")?;
            Some((what.to_string(), n.trim().parse::<f64>().ok()? as u64))
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    let policies = t
        .metrics
        .realization
        .snapshot()
        .into_iter()
        .map(|((namespace, name), e)| PolicyStatus {
            namespace,
            name,
            seen_generation: e.seen,
            realized_generation: e.realized,
            last_latency_seconds: e.last_latency.map(|d| d.as_secs_f64()),
            pending_seconds: (e.realized != Some(e.seen)).then(|| e.seen_at.elapsed().as_secs_f64()),
        })
        .collect();
    let rejections = t
        .metrics
        .rejections
        .current()
        .into_iter()
        .map(|r| RejectionStatus {
            object: r.problem.object,
            field: r.problem.field,
            message: r.problem.message,
            since_unix_ms: unix_ms(r.since),
        })
        .collect();
    Status {
        rejections,
        executors,
        repairs,
        policies,
        policy_counters: t.metrics.policy_counters.report(),
        log_lines_dropped: crate::process::log_lines_dropped(),
        bridge: path.cfg.bridge.name().to_string(),
        switch: Connection {
            connected: h.switch.load(Ordering::Relaxed),
            connects: counter("reconnects", "target=\"openflow\""),
        },
        ovsdb: Connection {
            connected: h.ovsdb.load(Ordering::Relaxed),
            connects: counter("reconnects", "target=\"ovsdb\""),
        },
        not_ready: h.not_ready(),
        waiting: h.waiting(),
        synced: h.synced.load(Ordering::Relaxed),
        converged: h.converged.load(Ordering::Relaxed),
        pipeline_version: crate::pipeline::VERSION,
        plugin,
        networks,
        flows,
        pods,
        rejected,
        model_version,
    }
}

/// The route's handler.
pub async fn handler(State(pods): State<Arc<pod::Pods>>) -> Json<Status> {
    Json(status(&pods).await)
}

/// Asks a running agent for its status.
pub async fn fetch(socket: &Path) -> Result<Status, String> {
    let (code, body) =
        tokio::time::timeout(Duration::from_secs(10), crate::api::client::call(socket, "GET", "/v1/status", None))
            .await
            .map_err(|_| format!("{}: no answer within 10s", socket.display()))??;
    if code != 200 {
        return Err(format!("{}: GET /v1/status: {code} {}", socket.display(), body.trim()));
    }
    serde_json::from_str(&body).map_err(|e| format!("{}: unreadable status: {e}", socket.display()))
}

fn ago(at_unix_ms: u64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let s = now.saturating_sub(at_unix_ms) as f64 / 1000.0;
    format!("{s:.1}s ago")
}

impl std::fmt::Display for Status {
    /// The text form of `sdn-node status`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::new();
        let up = |c: &Connection| {
            if c.connected {
                format!("connected ({} connects)", c.connects)
            } else {
                format!("DISCONNECTED ({} connects)", c.connects)
            }
        };
        let _ = writeln!(s, "bridge:     {}", self.bridge);
        let _ = writeln!(s, "switch:     {}", up(&self.switch));
        let _ = writeln!(s, "ovsdb:      {}", up(&self.ovsdb));
        let _ = writeln!(
            s,
            "ready:      {}",
            self.not_ready.as_deref().map(|w| format!("no: {w}")).unwrap_or_else(|| "yes".into())
        );
        if let Some(w) = &self.waiting {
            let kept = if self.synced { " (the last good state stays applied)" } else { "" };
            let _ = writeln!(s, "waiting:    {w}{kept}");
        }
        let _ = writeln!(
            s,
            "pipeline:   version {} ({})",
            self.pipeline_version,
            self.plugin.as_deref().unwrap_or("no state yet")
        );
        if let Some(n) = &self.networks {
            n.write_text(&mut s);
        }
        match &self.flows {
            None => {
                let _ = writeln!(s, "flows:      engine not started (no switch connection yet)");
            }
            Some(fl) => {
                let _ = writeln!(
                    s,
                    "flows:      {} installed, {} desired, generation {}{}",
                    fl.installed,
                    fl.desired,
                    fl.generation,
                    if fl.dirty { " (DIRTY: resync pending)" } else { "" }
                );
                let _ = writeln!(
                    s,
                    "engine:     {} bundles ({} failed), {} flow-mods, {} resyncs ({} full replays)",
                    fl.bundles, fl.bundle_failures, fl.flow_mods, fl.resyncs, fl.full_replays
                );
                let commit = |c: &Commit| {
                    let mut t =
                        format!("{}, {:.3} ms, {} flow-mods", ago(c.at_unix_ms), c.latency_seconds * 1e3, c.flow_mods);
                    if let Some(e) = &c.error {
                        let _ = write!(t, ", failed: {e}");
                    }
                    t
                };
                let _ = writeln!(
                    s,
                    "last commit: {}",
                    fl.last_commit.as_ref().map(commit).unwrap_or_else(|| "none".into())
                );
                let _ =
                    writeln!(s, "last error:  {}", fl.last_error.as_ref().map(commit).unwrap_or_else(|| "none".into()));
                let _ = writeln!(s, "per table:");
                for (t, n) in &fl.per_table {
                    let _ = writeln!(s, "  table {t:>3}: {n}");
                }
                let _ = writeln!(s, "per owner kind:");
                for (k, n) in &fl.per_owner_kind {
                    let _ = writeln!(s, "  {k:<16} {n}");
                }
            }
        }
        let _ = writeln!(
            s,
            "pods:       {} ({} through the pod API, {} with a port)",
            self.pods.total, self.pods.api, self.pods.with_port
        );
        if let Some(v6) = self.networks.as_ref().and_then(|n| n.ipv6.as_ref()) {
            let _ = writeln!(s, "  by family: {} IPv4, {} IPv6", self.networks.as_ref().and_then(|n| n.ipv4.as_ref()).map_or(0, |n| n.pods), v6.pods);
        }
        for p in &self.pods.names {
            let _ = writeln!(s, "  {p}");
        }
        let _ = writeln!(s, "executors:");
        for e in &self.executors {
            let state = match (&e.last_error, e.failing_since_unix_ms) {
                _ if e.off.is_some() => e.off.clone().unwrap_or_default(),
                (Some(err), since) => format!(
                    "FAILING since {} ({} attempts): {err}",
                    since.map(ago).unwrap_or_else(|| "?".into()),
                    e.failures
                ),
                (None, _) if e.ok => format!("ok (last {})", e.last_ok_unix_ms.map(ago).unwrap_or_else(|| "?".into())),
                (None, _) => "not converged yet".into(),
            };
            let _ = writeln!(s, "  {:<6} {state}", e.name);
        }
        let repairs: Vec<String> = self.repairs.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(s, "repairs:    {}", if repairs.is_empty() { "none".into() } else { repairs.join(", ") });
        if self.log_lines_dropped > 0 {
            let _ = writeln!(s, "log:        {} lines dropped (stderr closed or failing)", self.log_lines_dropped);
        }
        let _ = writeln!(s, "policies:   {}", if self.policies.is_empty() { "none" } else { "generation seen / realized, last source-to-switch latency" });
        for p in &self.policies {
            let realized = p.realized_generation.map(|g| g.to_string()).unwrap_or_else(|| "-".into());
            let latency = p.last_latency_seconds.map(|l| format!("{:.1} ms", l * 1e3)).unwrap_or_else(|| "-".into());
            let pending = p.pending_seconds.map(|w| format!(" (PENDING for {w:.1}s)")).unwrap_or_default();
            let _ = writeln!(s, "  {}/{}  {} / {realized}, {latency}{pending}", p.namespace, p.name, p.seen_generation);
        }
        self.policy_counters.write_text(&mut s);
        let rejected: Vec<String> =
            self.rejected.iter().filter(|(_, &n)| n > 0).map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(s, "rejected:   {}", if rejected.is_empty() { "none".into() } else { format!("{} (since start)", rejected.join(", ")) });
        let _ = writeln!(s, "rejected now: {}", if self.rejections.is_empty() { "none".to_string() } else { self.rejections.len().to_string() });
        for r in &self.rejections {
            let field = if r.field.is_empty() { String::new() } else { format!("field {}: ", r.field) };
            let _ = writeln!(s, "  {}: {field}{} (since {})", r.object, r.message, ago(r.since_unix_ms));
        }
        f.write_str(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(text: &str) -> crate::cluster::ClusterState {
        let (s, problems) = crate::cluster::state_file::parse(text).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        s
    }

    /// Both families' networks, typed in JSON and listed in the text; IPv4 alone has no IPv6
    /// section (in either form).
    #[test]
    fn networks_of_each_family() {
        let s = state(include_str!("../../deploy/examples/dual-stack.yaml"));
        let n = Networks::of(&s);
        let v4 = n.ipv4.as_ref().unwrap();
        assert_eq!(v4.local_subnet, Some("10.128.2.0/23".parse().unwrap()));
        assert_eq!(v4.gateway, Some("10.128.2.1".parse().unwrap()));
        let v6 = n.ipv6.as_ref().expect("dual-stack");
        assert_eq!(v6.cluster_network, "fd00:10:128::/48".parse::<ipnet::Ipv6Net>().unwrap());
        assert_eq!(v6.service_network, "fd00:172:30::/112".parse::<ipnet::Ipv6Net>().unwrap());
        assert_eq!(v6.local_subnet, Some("fd00:10:128:2::/64".parse().unwrap()));
        assert_eq!(v6.gateway, Some("fd00:10:128:2::1".parse().unwrap()));
        assert_eq!((v4.pods, v6.pods), (1, 1), "the example has one pod, dual-stack");
        let json = serde_json::to_value(&n).unwrap();
        assert_eq!(json["ipv6"]["gateway"], "fd00:10:128:2::1");
        assert_eq!(json["ipv4"]["cluster_network"], "10.128.0.0/14");
        let back: Networks = serde_json::from_value(json).unwrap();
        assert_eq!(back, n);
        let st = Status { networks: Some(n), ..Status::default() };
        let text = st.to_string();
        assert!(text.contains("networks:   dual-stack"), "{text}");
        assert!(
            text.contains("  IPv6  cluster fd00:10:128::/48, service fd00:172:30::/112, subnet fd00:10:128:2::/64, gateway fd00:10:128:2::1,"),
            "{text}"
        );
        assert!(text.contains("  IPv4  cluster 10.128.0.0/14, service 172.30.0.0/16, subnet 10.128.2.0/23, gateway 10.128.2.1,"), "{text}");

        let s4 = state(include_str!("../../deploy/examples/cluster.yaml"));
        let n4 = Networks::of(&s4);
        assert_eq!(n4.ipv6, None);
        assert!(!serde_json::to_string(&n4).unwrap().contains("ipv6"));
        let text = Status { networks: Some(n4), ..Status::default() }.to_string();
        assert!(text.contains("networks:   IPv4\n  IPv4  cluster 10.128.0.0/14"), "{text}");
        assert!(!text.contains("IPv6") && !text.contains("by family"), "{text}");

        // IPv6-only: no IPv4 section (in either form), the IPv6 one whole.
        let s6 = state(include_str!("../../deploy/examples/ipv6-only.yaml"));
        let n6 = Networks::of(&s6);
        assert_eq!(n6.ipv4, None);
        assert_eq!(n6.ipv6.as_ref().and_then(|v6| v6.gateway), Some("fd00:10:128:2::1".parse().unwrap()));
        assert!(!serde_json::to_string(&n6).unwrap().contains("ipv4"));
        let text = Status { networks: Some(n6), ..Status::default() }.to_string();
        assert!(
            text.contains("networks:   IPv6-only\n  IPv6  cluster fd00:10:128::/48, service fd00:172:30::/112, subnet fd00:10:128:2::/64, gateway fd00:10:128:2::1, 1 pods"),
            "{text}"
        );
        assert!(!text.contains("  IPv4  ") && text.contains("by family: 0 IPv4, 1 IPv6"), "{text}");
    }
}
