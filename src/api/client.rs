//! A thin client for the pod API (`sdn-node pod add|del|list`).

use std::path::Path;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;

/// One request over the unix socket; returns (status, body).
pub async fn call(socket: &Path, method: &str, path: &str, body: Option<String>) -> Result<(u16, String), String> {
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| unreachable(socket, &e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sdn-node")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Why no agent answered at `socket`, and what to do: no socket file, or a socket with no
/// agent behind it (a stale one) means no agent runs there.
fn unreachable(socket: &Path, e: &std::io::Error) -> String {
    use std::io::ErrorKind::{ConnectionRefused, NotFound};
    match e.kind() {
        NotFound | ConnectionRefused => format!(
            "no sdn-node agent at {} ({e}): start one with `sdn-node run --state FILE` (or --kubeconfig/--in-cluster), or pass --socket with the agent's --pod-api-socket",
            socket.display()
        ),
        _ => format!("{}: {e}", socket.display()),
    }
}
