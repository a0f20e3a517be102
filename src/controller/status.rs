//! What the controller tells an operator and its probes: `/healthz` (the loop is alive),
//! `/readyz` (its watches have listed and, when it leads, ClusterNetwork "default" matches its
//! configuration; a standby replica that has listed is ready to take over), `/status` (JSON:
//! role, counts, pending work, problems) and `/metrics` (the same as Prometheus gauges).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::get;
use serde::Serialize;

/// A problem with one object (also a Warning Event on it).
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    pub object: String,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    pub identity: String,
    pub leading: bool,
    /// Every watch has listed.
    pub synced: bool,
    /// "ok", "not checked yet", or why ClusterNetwork "default" is refused.
    pub cluster_network: String,
    pub nodes: usize,
    pub host_subnets: usize,
    pub namespaces: usize,
    pub net_namespaces: usize,
    /// Keys to decide, writes in flight and retries waiting.
    pub pending: usize,
    /// Writes started since this replica started.
    pub writes: u64,
    pub subnets_used: u64,
    pub subnets_total: u64,
    pub problems: Vec<Problem>,
    /// When the loop last reported (liveness).
    #[serde(skip)]
    pub updated: Option<Instant>,
}

impl Status {
    /// Whether ClusterNetwork "default" matches the configuration.
    pub fn network_ok(&self) -> bool {
        self.cluster_network == "ok"
    }

    /// Why this replica is not ready, if it is not.
    pub fn not_ready(&self) -> Option<String> {
        if !self.synced {
            return Some("the watches of Nodes, Namespaces, HostSubnets, NetNamespaces and ClusterNetwork have not listed yet (is the API server reachable, and does the ClusterRole allow list and watch?)".into());
        }
        if self.leading && !self.network_ok() {
            return Some(format!("ClusterNetwork \"default\": {}", self.cluster_network));
        }
        None
    }
}

impl Status {
    /// The Prometheus text of this status: `sdn_node_controller_*` gauges and counters.
    pub fn metrics(&self) -> String {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::gauge::Gauge;
        let mut r = prometheus_client::registry::Registry::with_prefix("sdn_node_controller");
        let gauge = |r: &mut prometheus_client::registry::Registry, name: &str, help: &str, v: i64| {
            let g: Gauge = Gauge::default();
            g.set(v);
            r.register(name, help, g);
        };
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        gauge(&mut r, "leading", "1 while this replica holds the Lease and writes", i64::from(self.leading));
        gauge(&mut r, "synced", "1 once every watch has listed", i64::from(self.synced));
        gauge(
            &mut r,
            "cluster_network_ok",
            "1 while ClusterNetwork default matches the configuration",
            i64::from(self.network_ok()),
        );
        gauge(&mut r, "nodes", "Nodes watched", n(self.nodes));
        gauge(&mut r, "host_subnets", "HostSubnets in the cluster", n(self.host_subnets));
        gauge(&mut r, "namespaces", "Namespaces watched", n(self.namespaces));
        gauge(&mut r, "net_namespaces", "NetNamespaces in the cluster", n(self.net_namespaces));
        gauge(&mut r, "pending", "Keys to decide, writes in flight and retries waiting", n(self.pending));
        gauge(
            &mut r,
            "subnets_used",
            "Node subnets of the cluster network taken",
            i64::try_from(self.subnets_used).unwrap_or(i64::MAX),
        );
        gauge(
            &mut r,
            "subnets_total",
            "Node subnets the cluster network holds",
            i64::try_from(self.subnets_total).unwrap_or(i64::MAX),
        );
        gauge(&mut r, "problems", "Objects with a problem (each also a Warning Event)", n(self.problems.len()));
        let c: Counter = Counter::default();
        c.inc_by(self.writes);
        r.register("writes", "Writes started by this replica", c);
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        out
    }
}

/// The loop reports every 500 ms: silent for this long, it is stuck.
const STALE: Duration = Duration::from_secs(30);

/// Serves the probes on `addr` (bound before returning: a port in use is the caller's error).
pub async fn serve(addr: std::net::SocketAddr, status: Arc<Mutex<Status>>) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("--health-addr {addr}: {e}"))?;
    let (s1, s2, s3, s4) = (status.clone(), status.clone(), status.clone(), status);
    let app = axum::Router::new()
        .route(
            "/healthz",
            get(move || async move {
                let updated = s1.lock().ok().and_then(|s| s.updated);
                match updated {
                    Some(t) if t.elapsed() > STALE => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("the controller loop has not reported for {:?}\n", t.elapsed()),
                    ),
                    _ => (StatusCode::OK, "ok\n".to_string()),
                }
            }),
        )
        .route(
            "/readyz",
            get(move || async move {
                let why = s2.lock().map(|s| s.not_ready()).unwrap_or_else(|_| Some("status unavailable".into()));
                match why {
                    None => (StatusCode::OK, "ok\n".to_string()),
                    Some(w) => (StatusCode::SERVICE_UNAVAILABLE, format!("{w}\n")),
                }
            }),
        )
        .route(
            "/status",
            get(move || async move {
                let s = s3.lock().map(|s| s.clone()).unwrap_or_default();
                axum::Json(s)
            }),
        )
        .route(
            "/metrics",
            get(move || async move {
                let text = s4.lock().map(|s| s.metrics()).unwrap_or_default();
                ([("content-type", "text/plain; version=0.0.4")], text)
            }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(())
}
