//! The agent in-process (`run_with` on a private switch), with its pod API socket and metrics
//! endpoint, for tests that need its telemetry or want to freeze the switch under it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sdn_node::api::client::call;
use sdn_node::api::PodRequest;
use sdn_node::metrics::Telemetry;
use sdn_node::run::{run_with, source, RunOptions};

pub struct Running {
    pub sb: sdn_harness::sandbox::OvsSandbox,
    pub socket: PathBuf,
    pub metrics: String,
    pub telemetry: Telemetry,
    pub state: PathBuf,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts the agent on a new dummy-datapath switch with `state`; `tune` adjusts the options.
/// Returns once the agent is ready (converged once; bounded wait).
pub async fn start_with(state: &str, tune: impl FnOnce(&mut RunOptions)) -> Running {
    let sb = sdn_harness::sandbox::OvsSandbox::start(Default::default()).await.unwrap();
    let file = sb.dir().join("state.yaml");
    std::fs::write(&file, state).unwrap();
    let socket = sb.dir().join("api/cni.sock");
    let mut opts = RunOptions::new(file.clone(), sb.dir().to_path_buf());
    opts.node.bridge.datapath_type = Some(sdn_node::options::DatapathType::Dummy);
    opts.node.api_socket = Some(socket.clone());
    let port = free_port();
    opts.metrics_addr = Some(format!("127.0.0.1:{port}").parse().unwrap());
    tune(&mut opts);
    let telemetry = Telemetry::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let t = telemetry.clone();
    tokio::spawn(async move {
        let _ = run_with(opts, t, source::watch_file, async move {
            let _ = stopped.await;
        })
        .await;
    });
    let r = Running { sb, socket, metrics: format!("127.0.0.1:{port}"), telemetry, state: file, _stop: stop };
    for _ in 0..800 {
        if r.telemetry.health.not_ready().is_none() {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("agent not ready: {:?}", r.telemetry.health.not_ready());
}

pub async fn start(state: &str) -> Running {
    start_with(state, |_| {}).await
}

/// A pod request for an OVS internal port `veth-NAME`.
pub fn pod(name: &str, ns: &str, ip: &str, n: u8) -> PodRequest {
    PodRequest {
        container_id: format!("{:02x}", n).repeat(32),
        namespace: ns.into(),
        name: name.into(),
        host_veth: format!("veth-{name}"),
        ip: ip.into(),
        ips: Vec::new(),
        mac: format!("0a:58:0a:80:00:{n:02x}"),
        annotations: Default::default(),
        internal: true,
        cni: None,
    }
}

pub async fn post(socket: &Path, body: &str) -> (u16, String) {
    call(socket, "POST", "/v1/pods", Some(body.to_string())).await.unwrap()
}

pub async fn add(socket: &Path, p: &PodRequest) -> (u16, String) {
    post(socket, &serde_json::to_string(p).unwrap()).await
}

pub async fn del(socket: &Path, ns: &str, name: &str) -> (u16, String) {
    call(socket, "DELETE", &format!("/v1/pods/{ns}/{name}"), None).await.unwrap()
}

pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    try_http_get(addr, path).await.unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// [`http_get`], or why nothing answered (a server not listening yet).
pub async fn try_http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let (mut s, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path).header("host", "x").body(http_body_util::Empty::<hyper::body::Bytes>::new()).unwrap();
    let resp = s.send_request(req).await.map_err(|e| format!("request: {e}"))?;
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// Polls `/readyz` (bounded: 800 polls 25 ms apart) until it answers 200 and health agrees;
/// panics with its last answer and `what` otherwise. Every test that changes something ends
/// with this (issue 32: readiness tells the truth).
pub async fn ready_again(r: &Running, what: &str) {
    let mut last = (0, String::new());
    for _ in 0..800 {
        last = http_get(&r.metrics, "/readyz").await;
        if last.0 == 200 {
            assert!(r.telemetry.health.not_ready().is_none(), "{what}: /readyz and health disagree");
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what}: /readyz never answered 200 again; last: {} {}", last.0, last.1);
}
