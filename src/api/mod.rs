//! The local pod API, as openshift-sdn's CNI server: HTTP/JSON on a unix socket.
//!
//! `POST /v1/pods` sets a pod up (port on the bridge, bandwidth, flows) and answers only after
//! its flows are committed; `DELETE /v1/pods/{namespace}/{name}` tears it down; `GET /v1/pods`
//! lists the pods set up through the API. Bad requests get a 4xx naming the object and field,
//! and change nothing.

pub mod client;
pub mod quantity;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::cluster::{Pod, Problem};
use crate::metrics::Telemetry;

pub const DEFAULT_SOCKET: &str = "/var/run/sdn-node/cni.sock";
pub const INGRESS_ANNOTATION: &str = "kubernetes.io/ingress-bandwidth";
pub const EGRESS_ANNOTATION: &str = "kubernetes.io/egress-bandwidth";

/// A pod setup request (the CNI plugin's view of a pod).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodRequest {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub namespace: String,
    pub name: String,
    #[serde(rename = "hostVeth")]
    pub host_veth: String,
    pub ip: String,
    pub mac: String,
    /// The pod's annotations; the bandwidth ones are used.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Create an OVS internal port named `hostVeth` instead of attaching an existing device
    /// (demos and tests).
    #[serde(default)]
    pub internal: bool,
}

impl PodRequest {
    /// Validates the request into a pod (fields named as in the request).
    pub fn to_pod(&self) -> Result<Pod, Problem> {
        let obj = format!("pod {}/{}", self.namespace, self.name);
        let bw = |key: &str| -> Result<i64, Problem> {
            match self.annotations.get(key) {
                None => Ok(0),
                Some(v) => quantity::bandwidth(v).map_err(|e| Problem::new(obj.clone(), format!("annotations[{key}]"), e)),
            }
        };
        crate::cluster::state_file::validate_pod(crate::cluster::state_file::RawPod {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            container_id: self.container_id.clone(),
            host_veth: self.host_veth.clone(),
            ip: self.ip.clone(),
            mac: self.mac.clone(),
            ingress_bps: bw(INGRESS_ANNOTATION)?,
            egress_bps: bw(EGRESS_ANNOTATION)?,
            internal: self.internal,
        })
    }
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// Malformed or invalid (400).
    Invalid(Problem),
    /// Conflicts with another object (409).
    Conflict(Problem),
    NotFound(String),
    /// The switch or OVSDB is not reachable right now (503); nothing changed.
    Unavailable(String),
    /// The switch failed the change (500); it will be repaired from a dump.
    Failed(String),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (code, body) = match self {
            ApiError::Invalid(p) => (StatusCode::BAD_REQUEST, problem_body(p)),
            ApiError::Conflict(p) => (StatusCode::CONFLICT, problem_body(p)),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, ErrorBody { error: m, object: String::new(), field: String::new() }),
            ApiError::Unavailable(m) => {
                (StatusCode::SERVICE_UNAVAILABLE, ErrorBody { error: m, object: String::new(), field: String::new() })
            }
            ApiError::Failed(m) => {
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorBody { error: m, object: String::new(), field: String::new() })
            }
        };
        (code, Json(body)).into_response()
    }
}

fn problem_body(p: Problem) -> ErrorBody {
    ErrorBody { error: p.to_string(), object: p.object, field: p.field }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SetupReply {
    pub ofport: u32,
}

/// What the API asks of the agent loop.
pub enum Command {
    Setup(Box<Pod>, PodRequest, oneshot::Sender<Result<SetupReply, ApiError>>),
    Teardown(String, String, oneshot::Sender<Result<(), ApiError>>),
    List(oneshot::Sender<Vec<PodRequest>>),
}

#[derive(Clone)]
struct Ctx {
    tx: mpsc::Sender<Command>,
    telemetry: Telemetry,
}

async fn ask<T>(ctx: &Ctx, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, ApiError> {
    let (tx, rx) = oneshot::channel();
    ctx.tx.send(make(tx)).await.map_err(|_| ApiError::Unavailable("the agent is shutting down".into()))?;
    rx.await.map_err(|_| ApiError::Unavailable("the agent is shutting down".into()))
}

async fn setup(State(ctx): State<Ctx>, body: axum::body::Bytes) -> Result<Json<SetupReply>, ApiError> {
    let t = Instant::now();
    let req: PodRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::Invalid(Problem::new("pod", "", format!("request body: {e}"))))?;
    let pod = req.to_pod().map_err(ApiError::Invalid)?;
    let r = ask(&ctx, |tx| Command::Setup(Box::new(pod), req, tx)).await??;
    ctx.telemetry.metrics.pod_setup.observe(t.elapsed().as_secs_f64());
    Ok(Json(r))
}

async fn teardown(State(ctx): State<Ctx>, UrlPath((ns, name)): UrlPath<(String, String)>) -> Result<StatusCode, ApiError> {
    ask(&ctx, |tx| Command::Teardown(ns, name, tx)).await??;
    Ok(StatusCode::OK)
}

async fn list(State(ctx): State<Ctx>) -> Result<Json<Vec<PodRequest>>, ApiError> {
    Ok(Json(ask(&ctx, Command::List).await?))
}

/// Serves the pod API on `socket` (created with mode 0600, its directory if missing) until
/// `shutdown` resolves.
pub async fn serve(
    socket: &Path,
    tx: mpsc::Sender<Command>,
    telemetry: Telemetry,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    let app = Router::new()
        .route("/v1/pods", get(list).post(setup))
        .route("/v1/pods/{namespace}/{name}", delete(teardown))
        .with_state(Ctx { tx, telemetry });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr`.
pub async fn serve_metrics(
    addr: std::net::SocketAddr,
    telemetry: Telemetry,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    async fn metrics(State(t): State<Telemetry>) -> impl IntoResponse {
        (
            [(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            t.metrics.encode(),
        )
    }
    async fn healthz(State(t): State<Telemetry>) -> impl IntoResponse {
        match t.health.unhealthy() {
            None => (StatusCode::OK, "ok\n".to_string()),
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        }
    }
    async fn readyz(State(t): State<Telemetry>) -> impl IntoResponse {
        match t.health.not_ready() {
            None => (StatusCode::OK, "ok\n".to_string()),
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        }
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(telemetry);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// Shared by tests and the client: the pods an agent serves, by key.
pub type PodList = Arc<Vec<PodRequest>>;
