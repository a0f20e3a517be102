//! A native client for ovs-vswitchd's unixctl control socket (what `ovs-appctl` talks to).
//!
//! The protocol is JSON-RPC 1.0 over a unix stream socket, messages written back to back
//! without delimiters — the same framing as OVSDB, so [`crate::ovsdb::JsonCodec`] splits the
//! stream. A request is `{"method": "ofproto/trace", "params": ["br0", "<flow>"], "id": 0}`;
//! the answer is `{"result": "<text>", "error": null, "id": 0}` or an `error` string. We speak
//! it ourselves rather than exec `ovs-appctl`: the agent's image need not carry OVS's tools,
//! and a typed error beats parsing a child's stderr.
//!
//! Everything read from the socket is untrusted: a reply that is not JSON, too large, of the
//! wrong shape, or never comes is an error, never a panic or a hang.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_util::codec::Framed;

use crate::ovsdb::JsonCodec;

/// The largest reply accepted: a trace through a large pipeline is tens of KiB; 16 MiB leaves
/// room for `dpif/dump-flows` of a busy datapath while bounding a runaway peer.
pub const MAX_REPLY: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum UnixctlError {
    #[error("cannot find ovs-vswitchd's control socket in {}: {why}", dir.display())]
    NotFound { dir: PathBuf, why: String },
    #[error("{}: {source}", path.display())]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("{}: {message}", path.display())]
    Protocol { path: PathBuf, message: String },
    /// The command ran and failed (e.g. an unparsable flow): ovs-vswitchd's own words.
    #[error("ovs-vswitchd: {0}")]
    Command(String),
    #[error("{}: no answer within {after:?}", path.display())]
    Timeout { path: PathBuf, after: Duration },
}

/// Finds ovs-vswitchd's control socket in `rundir`: `ovs-vswitchd.<pid>.ctl` with the pid from
/// `ovs-vswitchd.pid` (as `ovs-appctl -t ovs-vswitchd` does); failing that, the only
/// `ovs-vswitchd.*.ctl` in the directory (sandboxes and packagings that name the pid file
/// differently).
pub fn find_vswitchd_ctl(rundir: &Path) -> Result<PathBuf, UnixctlError> {
    let pidfile = rundir.join("ovs-vswitchd.pid");
    let mut why = match std::fs::read_to_string(&pidfile) {
        Ok(s) => match s.trim().parse::<u32>() {
            Ok(pid) => {
                let p = rundir.join(format!("ovs-vswitchd.{pid}.ctl"));
                if p.exists() {
                    return Ok(p);
                }
                format!("{} names pid {pid} but {} does not exist", pidfile.display(), p.display())
            }
            Err(_) => format!("{} does not hold a pid", pidfile.display()),
        },
        Err(e) => format!("{}: {e}", pidfile.display()),
    };
    let mut found: Vec<PathBuf> = match std::fs::read_dir(rundir) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ovs-vswitchd.") && n.ends_with(".ctl"))
            })
            .collect(),
        Err(e) => {
            why.push_str(&format!("; cannot list the directory: {e}"));
            vec![]
        }
    };
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(UnixctlError::NotFound {
            dir: rundir.to_path_buf(),
            why: format!("{why}; no ovs-vswitchd.*.ctl socket"),
        }),
        n => Err(UnixctlError::NotFound {
            dir: rundir.to_path_buf(),
            why: format!("{why}; {n} ovs-vswitchd.*.ctl sockets (stale ones?): pass the socket with --ctl"),
        }),
    }
}

/// Runs one unixctl command on `path` and returns its text output.
pub async fn call(path: &Path, method: &str, params: &[&str], timeout: Duration) -> Result<String, UnixctlError> {
    let fut = async {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|source| UnixctlError::Connect { path: path.to_path_buf(), source })?;
        let mut framed = Framed::new(stream, JsonCodec::new(MAX_REPLY));
        let proto = |message: String| UnixctlError::Protocol { path: path.to_path_buf(), message };
        framed
            .send(json!({"method": method, "params": params, "id": 0}))
            .await
            .map_err(|e| proto(format!("cannot send the request: {e}")))?;
        loop {
            let msg = match framed.next().await {
                Some(Ok(v)) => v,
                Some(Err(e)) => return Err(proto(e.to_string())),
                None => return Err(proto("connection closed before the answer".into())),
            };
            match interpret(msg) {
                Reply::Answer(r) => {
                    return r.map_err(|e| match e {
                        Interp::Command(m) => UnixctlError::Command(m),
                        Interp::Protocol(m) => proto(m),
                    })
                }
                // Not ours (a notification or another id): keep reading.
                Reply::Other => continue,
            }
        }
    };
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| Err(UnixctlError::Timeout { path: path.to_path_buf(), after: timeout }))
}

enum Interp {
    Command(String),
    Protocol(String),
}

enum Reply {
    Answer(Result<String, Interp>),
    Other,
}

/// Reads one JSON-RPC message as the answer to request 0.
fn interpret(msg: Value) -> Reply {
    let Some(obj) = msg.as_object() else {
        return Reply::Answer(Err(Interp::Protocol(format!("expected a JSON object, got {}", short(&msg)))));
    };
    if obj.contains_key("method") {
        return Reply::Other;
    }
    match obj.get("id") {
        Some(Value::Number(n)) if n.as_u64() == Some(0) => {}
        Some(Value::String(s)) if s == "0" => {}
        _ => return Reply::Other,
    }
    match (obj.get("error"), obj.get("result")) {
        (Some(e), _) if !e.is_null() => {
            let m = match e {
                Value::String(s) => s.trim_end().to_string(),
                other => other.to_string(),
            };
            Reply::Answer(Err(Interp::Command(m)))
        }
        (_, Some(Value::String(s))) => Reply::Answer(Ok(s.clone())),
        (_, other) => Reply::Answer(Err(Interp::Protocol(format!(
            "expected a text result, got {}",
            other.map(short).unwrap_or_else(|| "none".into())
        )))),
    }
}

/// A value's text, cut for an error message.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one connection: reads a request, answers with `reply` bytes.
    async fn serve(reply: &'static [u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ovs-vswitchd.42.ctl");
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(reply).await;
        });
        (dir, path)
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn result_and_error() {
        let (_d, p) = serve(br#"{"id":0,"result":"Flow: ip\n","error":null}"#).await;
        assert_eq!(call(&p, "ofproto/trace", &["br0", "ip"], T).await.unwrap(), "Flow: ip\n");
        let (_d, p) = serve(br#"{"id":0,"result":null,"error":"bad flow\n"}"#).await;
        assert!(matches!(call(&p, "ofproto/trace", &[], T).await, Err(UnixctlError::Command(m)) if m == "bad flow"));
    }

    #[tokio::test]
    async fn hostile_bytes_are_errors() {
        for reply in
            [&b"\xff\xfe garbage"[..], b"[1,2,3]", b"{\"id\":0,\"result\":5,\"error\":null}", b"{\"id\":0,\"res", b""]
        {
            let r: &'static [u8] = Box::leak(reply.to_vec().into_boxed_slice());
            let (_d, p) = serve(r).await;
            assert!(matches!(call(&p, "x", &[], T).await, Err(UnixctlError::Protocol { .. })), "{reply:?}");
        }
    }

    #[test]
    fn finds_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find_vswitchd_ctl(dir.path()).is_err());
        std::fs::write(dir.path().join("ovs-vswitchd.7.ctl"), "").unwrap();
        assert_eq!(find_vswitchd_ctl(dir.path()).unwrap(), dir.path().join("ovs-vswitchd.7.ctl"));
        std::fs::write(dir.path().join("ovs-vswitchd.8.ctl"), "").unwrap();
        assert!(find_vswitchd_ctl(dir.path()).is_err());
        std::fs::write(dir.path().join("ovs-vswitchd.pid"), "8\n").unwrap();
        assert_eq!(find_vswitchd_ctl(dir.path()).unwrap(), dir.path().join("ovs-vswitchd.8.ctl"));
    }
}
