//! The local pod API, as openshift-sdn's CNI server: HTTP/JSON on a unix socket.
//!
//! `POST /v1/pods` sets a pod up (port on the bridge, bandwidth, flows) and answers only after
//! its flows are committed; `DELETE /v1/pods/{namespace}/{name}` tears it down; `GET /v1/pods`
//! lists the pods set up through the API; `GET /v1/model/pods` (read-only) lists every pod the
//! agent's model holds, from its state source and the API, for `sdn-node trace --socket`. Bad requests get a 4xx naming the object and field,
//! and change nothing.

pub mod client;
pub mod deadline;
pub mod serve;
pub mod status;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::cluster::Problem;
use crate::metrics::Telemetry;
use crate::node::record::PodRecord;
use crate::pod::{PodError, Pods};

pub use crate::options::DEFAULT_SOCKET;

/// The body of `POST /v1/pods`: a pod whose interface the caller made. Strict (an unknown field
/// is a 400 naming it); what the agent stores is a [`PodRecord`].
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
    /// Kubernetes' `podIPs` shape for a dual-stack pod: its addresses, one per family, the
    /// IPv4 one being `ip` (the IPv6 one from this node's IPv6 subnet). Empty (and not
    /// written) for an IPv4-only pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    pub mac: String,
    /// The pod's annotations; the bandwidth ones are used.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Create an OVS internal port named `hostVeth` instead of attaching an existing device
    /// (demos and tests).
    #[serde(default)]
    pub internal: bool,
    /// Only the agent sets a record's `cni` part (see [`PodRequest::to_record`]); a request
    /// bringing one is refused by name rather than as an unknown field.
    #[serde(default, skip_serializing)]
    pub cni: Option<serde_json::Value>,
}

impl PodRequest {
    /// The record the agent will store for this request. The `cni` part says the agent created
    /// the pod's interface, and so may delete it (on DEL, or when the sandbox is gone): a caller
    /// setting it could have any node interface deleted.
    ///
    /// The request is validated here, as a pod (its `ip` and `mac` are the caller's text, read
    /// as the state file's are): a bad field is a 400 naming it, and the record holds the typed
    /// addresses.
    pub fn to_record(&self) -> Result<PodRecord, ApiError> {
        if self.cni.is_some() {
            let obj = format!("pod {}/{}", self.namespace, self.name);
            return Err(ApiError::Invalid(Problem::new(obj, "cni", "set only by the agent for the pods it networks through CNI (POST /v1/cni); not accepted here")));
        }
        let (ingress_bps, egress_bps) =
            crate::node::record::bandwidth(&self.namespace, &self.name, &self.annotations).map_err(ApiError::Invalid)?;
        let pod = crate::cluster::validate::pod(crate::cluster::validate::RawPod {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            container_id: self.container_id.clone(),
            host_veth: self.host_veth.clone(),
            ip: self.ip.clone(),
            ips: self.ips.clone(),
            mac: self.mac.clone(),
            ingress_bps,
            egress_bps,
            internal: self.internal,
        })
        .map_err(ApiError::Invalid)?;
        // The first address (IPv4, or IPv6 on an IPv6-only node); `ip6` a dual-stack pod's
        // second.
        let (ip, ip6) = pod
            .ips()
            .first_and_second()
            .ok_or_else(|| ApiError::Invalid(Problem::new(format!("pod {}/{}", self.namespace, self.name), "ip", "no address")))?;
        Ok(PodRecord {
            version: crate::node::record::VERSION,
            container_id: self.container_id.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            host_veth: self.host_veth.clone(),
            ip,
            ip6,
            mac: pod.mac,
            annotations: self.annotations.clone(),
            internal: self.internal,
            cni: None,
        })
    }
}

/// Why a request failed, as HTTP says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// Malformed or invalid (400).
    Invalid(Problem),
    /// Conflicts with another object (409).
    Conflict(Problem),
    NotFound(String),
    /// The switch or OVSDB is not reachable right now (503, with `Retry-After`); nothing of
    /// the request remains.
    Unavailable(String),
    /// The request's deadline passed (504); nothing of the request remains.
    Timeout(String),
    /// The switch or OVSDB failed the change (500); nothing of the request remains.
    Failed(String),
    /// The body is over [`MAX_BODY`] (413); nothing was done.
    TooLarge(String),
}

/// The one place a pod failure becomes an HTTP status.
impl From<PodError> for ApiError {
    fn from(e: PodError) -> ApiError {
        match e {
            PodError::Invalid(p) => ApiError::Invalid(p),
            PodError::Conflict(p) => ApiError::Conflict(p),
            PodError::NotFound(m) => ApiError::NotFound(m),
            PodError::NotReady(m) => ApiError::Unavailable(m),
            PodError::Deadline(m) => ApiError::Timeout(m),
            PodError::Refused(m) | PodError::Failed(m) => ApiError::Failed(m),
        }
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    pub fn message(&self) -> String {
        match self {
            ApiError::Invalid(p) | ApiError::Conflict(p) => p.to_string(),
            ApiError::NotFound(m) | ApiError::Unavailable(m) | ApiError::Timeout(m) | ApiError::Failed(m) | ApiError::TooLarge(m) => m.clone(),
        }
    }
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
        let code = self.status();
        let body = match self {
            ApiError::Invalid(p) | ApiError::Conflict(p) => problem_body(p),
            ApiError::NotFound(m) | ApiError::Unavailable(m) | ApiError::Timeout(m) | ApiError::Failed(m) | ApiError::TooLarge(m) => {
                ErrorBody { error: m, object: String::new(), field: String::new() }
            }
        };
        if code == StatusCode::SERVICE_UNAVAILABLE {
            return (code, [(axum::http::header::RETRY_AFTER, "1")], Json(body)).into_response();
        }
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

/// The largest request body accepted (a pod request is well under 1 KiB).
pub const MAX_BODY: usize = 64 * 1024;

/// Runs a request's work on its own task: a client that hangs up cannot cancel it halfway (its
/// undo steps always run), and requests never wait on each other's I/O.
async fn detached<T: Send + 'static>(f: impl std::future::Future<Output = Result<T, PodError>> + Send + 'static) -> Result<T, ApiError> {
    tokio::spawn(f).await.unwrap_or_else(|e| Err(PodError::Failed(format!("request task failed: {e}")))).map_err(ApiError::from)
}

fn count(t: &Telemetry, op: &str, code: StatusCode) {
    t.metrics.pod_requests.get_or_create(&crate::metrics::RequestLabel { op: op.into(), code: code.as_u16().to_string() }).inc();
}

async fn setup(State(pods): State<Arc<Pods>>, headers: HeaderMap, body: axum::body::Body) -> Result<Json<SetupReply>, ApiError> {
    let t = Instant::now();
    let r = async {
        let deadline = caller_deadline(&pods, &headers)?;
        let body = request_body(body).await?;
        let req = serde_json::from_slice::<PodRequest>(&body).map_err(|e| ApiError::Invalid(Problem::new("pod", "", format!("request body: {e}"))))?;
        let record = req.to_record()?;
        let n = pods.clone();
        detached(async move { crate::pod::setup::setup(&n, record, deadline).await }).await
    }
    .await;
    count(&pods.telemetry, "setup", r.as_ref().map(|_| StatusCode::OK).unwrap_or_else(ApiError::status));
    if r.is_ok() {
        pods.telemetry.metrics.pod_setup.observe(t.elapsed().as_secs_f64());
    }
    r.map(|ofport| Json(SetupReply { ofport }))
}

/// The request's deadline: the caller's (see [`deadline`]) or the agent's own request timeout,
/// whichever is earlier. A request whose caller has already given up is answered 504 before
/// anything is done.
fn caller_deadline(pods: &Pods, headers: &HeaderMap) -> Result<tokio::time::Instant, ApiError> {
    let d = deadline::from_headers(headers).map_err(|m| ApiError::Invalid(Problem::new("request", deadline::HEADER, m)))?;
    if d.is_some_and(|d| d <= tokio::time::Instant::now()) {
        return Err(ApiError::Timeout("the caller's deadline passed before the request was started; nothing was done".into()));
    }
    Ok(deadline::effective(d, pods.cfg.request_timeout))
}

async fn request_body(body: axum::body::Body) -> Result<axum::body::Bytes, ApiError> {
    serve::read_body(body, MAX_BODY, serve::POD_API.body_timeout).await.map_err(|m| {
        if m.contains("length limit exceeded") {
            ApiError::TooLarge(format!("request body over {MAX_BODY} bytes"))
        } else {
            ApiError::Invalid(Problem::new("request", "", m))
        }
    })
}

async fn teardown(State(pods): State<Arc<Pods>>, headers: HeaderMap, UrlPath((ns, name)): UrlPath<(String, String)>) -> Result<StatusCode, ApiError> {
    let r = match caller_deadline(&pods, &headers) {
        Err(e) => Err(e),
        Ok(d) => {
            let n = pods.clone();
            detached(async move { crate::pod::teardown::teardown(&n, ns, name, d).await }).await
        }
    };
    count(&pods.telemetry, "teardown", r.as_ref().map(|_| StatusCode::OK).unwrap_or_else(ApiError::status));
    r.map(|_| StatusCode::OK)
}

async fn cni(State(pods): State<Arc<Pods>>, headers: HeaderMap, body: axum::body::Body) -> Response {
    let t = Instant::now();
    let r = async {
        let deadline = caller_deadline(&pods, &headers)?;
        let body = request_body(body).await?;
        let req = serde_json::from_slice::<sdn_node_cni::wire::Request>(&body)
            .map_err(|e| ApiError::Invalid(Problem::new("pod", "", format!("request body: {e}"))))?;
        let n = pods.clone();
        detached(async move { crate::pod::cni::handle(&n, req, deadline).await }).await
    }
    .await;
    count(&pods.telemetry, "cni", r.as_ref().map(|_| StatusCode::OK).unwrap_or_else(ApiError::status));
    match r {
        Ok(Some(reply)) => {
            pods.telemetry.metrics.pod_setup.observe(t.elapsed().as_secs_f64());
            Json(reply).into_response()
        }
        Ok(None) => Json(serde_json::Map::new()).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The pods set up through the API and CNI, as their records.
async fn list(State(pods): State<Arc<Pods>>) -> Json<Vec<PodRecord>> {
    Json(pods.state.lock().api_records())
}

/// One pod of the agent's model, as `GET /v1/model/pods` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelPod {
    pub namespace: String,
    pub name: String,
    pub host_veth: String,
    /// Its first address: IPv4, or IPv6 on an IPv6-only node.
    pub ip: std::net::IpAddr,
    /// A dual-stack pod's IPv6 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<std::net::Ipv6Addr>,
    pub mac: String,
    /// The namespace's VNID, when the model knows the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vnid: Option<u32>,
}

/// Every pod of the model's effective state (state source and pod API), then the API pods
/// the effective state does not hold yet.
async fn model_pods(State(pods): State<Arc<Pods>>) -> Json<Vec<ModelPod>> {
    let model = pods.state.lock();
    let st = model.effective();
    let vnid_of = |ns: &str| st.and_then(|s| s.vnid_of(ns)).map(|v| v.get());
    let mut pods: Vec<ModelPod> = st
        .map(|s| {
            s.pods
                .iter()
                .filter_map(|p| {
                    let (ip, ip6) = p.ips().first_and_second()?;
                    Some(ModelPod {
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        host_veth: p.host_veth.clone(),
                        ip,
                        ip6,
                        mac: p.mac.to_string(),
                        vnid: vnid_of(&p.namespace),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    for r in model.api_records() {
        if pods.iter().any(|p| p.namespace == r.namespace && p.name == r.name) {
            continue;
        }
        pods.push(ModelPod { vnid: vnid_of(&r.namespace), namespace: r.namespace, name: r.name, host_veth: r.host_veth, ip: r.ip, ip6: r.ip6, mac: r.mac.to_string() });
    }
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Json(pods)
}

/// Serves the pod API on `socket` (mode 0600 from the start, its directory made 0700 if
/// missing; see [`serve::bind_private_unix`]) under [`serve::POD_API`]'s limits until
/// `shutdown` resolves.
pub async fn serve(
    socket: &Path,
    pods: Arc<Pods>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = serve::bind_private_unix(socket)?;
    let metrics = pods.telemetry.metrics.clone();
    let app = Router::new()
        .route("/v1/pods", get(list).post(setup))
        .route("/v1/pods/{namespace}/{name}", delete(teardown))
        .route("/v1/cni", axum::routing::post(cni))
        .route("/v1/status", get(status::handler))
        .route("/v1/model/pods", get(model_pods))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(pods);
    serve::serve(listener, app, serve::POD_API, "pod_api", metrics, shutdown).await
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` under [`serve::METRICS`]'s limits.
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
    let m = telemetry.metrics.clone();
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(telemetry);
    serve::serve(listener, app, serve::METRICS, "metrics", m, shutdown).await
}
