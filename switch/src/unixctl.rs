//! ovs-vswitchd's control socket (`<rundir>/ovs-vswitchd.<pid>.ctl`, the one `ovs-appctl`
//! talks to): JSON-RPC 1.0, one request per connection, spoken here so nothing is exec'd.
//!
//! The agent asks it one thing, `revalidator/wait`: it answers once the revalidator threads
//! have finished a dump of the datapath flows, and that dump is when OVS moves what the
//! datapath's cached flows counted into the OpenFlow flows' statistics (every 500 ms by
//! default, `other_config:max-revalidator`). The per-policy counters need it before a policy
//! change removes a counting flow: a packet the datapath counted but OVS had not yet pushed
//! would, after the change, be pushed to whatever flow handles that packet now (e.g. the pod's
//! drop flow), and the removed flow's FLOW_REMOVED would not have it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

use sdn_ovsdb::framing::JsonCodec;

/// A control reply is a line of text; anything larger is not ovs-vswitchd.
const MAX_REPLY: usize = 1 << 20;

/// Why a control command did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("reading {path}: {source}")]
    Pidfile { path: PathBuf, source: std::io::Error },
    #[error("{path} does not hold a process id")]
    BadPidfile { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Protocol { path: PathBuf, message: String },
    #[error("{path}: {command} failed: {message}")]
    Refused { path: PathBuf, command: String, message: String },
    #[error("{path}: no answer to {command} within {deadline:?}")]
    Timeout { path: PathBuf, command: String, deadline: Duration },
}

#[derive(Serialize)]
struct Request<'a> {
    id: u64,
    method: &'a str,
    params: [&'a str; 0],
}

#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// The ovs-vswitchd whose pidfile is in `rundir`.
#[derive(Clone, Debug)]
pub struct VswitchdCtl {
    rundir: PathBuf,
}

impl VswitchdCtl {
    pub fn new(rundir: &Path) -> VswitchdCtl {
        VswitchdCtl { rundir: rundir.to_path_buf() }
    }

    /// The control socket of the running ovs-vswitchd, found afresh (it may have restarted):
    /// the pid in `ovs-vswitchd.pid` (OVS's default pidfile), else the only
    /// `ovs-vswitchd.<pid>.ctl` of the directory (a pidfile elsewhere), preferring the
    /// newest if a dead one was left behind.
    fn socket(&self) -> Result<PathBuf, CtlError> {
        let pidfile = self.rundir.join("ovs-vswitchd.pid");
        match std::fs::read_to_string(&pidfile) {
            Ok(text) => {
                let pid: u32 = text.trim().parse().map_err(|_| CtlError::BadPidfile { path: pidfile.clone() })?;
                Ok(self.rundir.join(format!("ovs-vswitchd.{pid}.ctl")))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let newest = std::fs::read_dir(&self.rundir)
                    .map_err(|source| CtlError::Io { path: self.rundir.clone(), source })?
                    .flatten()
                    .filter(|e| is_ctl_name(&e.file_name().to_string_lossy()))
                    .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
                    .max();
                newest.map(|(_, p)| p).ok_or(CtlError::Pidfile { path: pidfile, source: e })
            }
            Err(source) => Err(CtlError::Pidfile { path: pidfile, source }),
        }
    }

    /// `ovs-appctl revalidator/wait`: returns once the datapath's counts so far are in the
    /// OpenFlow flows' statistics.
    pub async fn revalidator_wait(&self, deadline: Duration) -> Result<(), CtlError> {
        self.call("revalidator/wait", deadline).await
    }

    async fn call(&self, command: &str, deadline: Duration) -> Result<(), CtlError> {
        let path = self.socket()?;
        let timeout = || CtlError::Timeout { path: path.clone(), command: command.to_string(), deadline };
        tokio::time::timeout(deadline, self.call_on(&path, command)).await.map_err(|_| timeout())?
    }

    async fn call_on(&self, path: &Path, command: &str) -> Result<(), CtlError> {
        let io = |source| CtlError::Io { path: path.to_path_buf(), source };
        let protocol = |message: String| CtlError::Protocol { path: path.to_path_buf(), message };
        let stream = UnixStream::connect(path).await.map_err(io)?;
        let mut framed = Framed::new(stream, JsonCodec::new(MAX_REPLY));
        let req = serde_json::to_value(Request { id: 0, method: command, params: [] })
            .map_err(|e| protocol(e.to_string()))?;
        framed.send(req).await.map_err(|e| protocol(e.to_string()))?;
        let reply = match framed.next().await {
            Some(Ok(v)) => v,
            Some(Err(e)) => return Err(protocol(e.to_string())),
            None => return Err(protocol("closed without an answer".into())),
        };
        let reply: Reply = serde_json::from_value(reply).map_err(|e| protocol(format!("not a JSON-RPC reply: {e}")))?;
        match (reply.result, reply.error) {
            (_, Some(e)) if !e.is_null() => Err(CtlError::Refused {
                path: path.to_path_buf(),
                command: command.to_string(),
                message: e.as_str().map_or_else(|| e.to_string(), |s| s.trim_end().to_string()),
            }),
            (Some(_), _) => Ok(()),
            (None, _) => Err(protocol("a reply with neither result nor error".into())),
        }
    }
}

/// `ovs-vswitchd.<pid>.ctl`.
fn is_ctl_name(name: &str) -> bool {
    name.strip_prefix("ovs-vswitchd.")
        .and_then(|r| r.strip_suffix(".ctl"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixListener;

    /// A fake control socket answering the first request with `answer` (or nothing).
    async fn fake(answer: Option<&'static str>) -> (tempfile::TempDir, VswitchdCtl) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ovs-vswitchd.pid"), "4242\n").unwrap();
        let l = UnixListener::bind(dir.path().join("ovs-vswitchd.4242.ctl")).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap();
            let req: serde_json::Value = serde_json::from_slice(&buf[..n]).unwrap();
            assert_eq!(req["method"], "revalidator/wait");
            assert_eq!(req["params"], serde_json::json!([]));
            match answer {
                Some(a) => s.write_all(a.as_bytes()).await.unwrap(),
                None => std::future::pending::<()>().await,
            }
        });
        let ctl = VswitchdCtl::new(dir.path());
        (dir, ctl)
    }

    #[tokio::test]
    async fn an_answer_a_refusal_and_silence() {
        let (_d, ctl) = fake(Some(r#"{"id":0,"result":"","error":null}"#)).await;
        ctl.revalidator_wait(Duration::from_secs(5)).await.unwrap();
        let (_d, ctl) =
            fake(Some(r#"{"id":0,"result":null,"error":"\"revalidator/wait\" is not a valid command\n"}"#)).await;
        let e = ctl.revalidator_wait(Duration::from_secs(5)).await.unwrap_err();
        assert!(e.to_string().ends_with("revalidator/wait failed: \"revalidator/wait\" is not a valid command"), "{e}");
        let (_d, ctl) = fake(None).await;
        let e = ctl.revalidator_wait(Duration::from_millis(100)).await.unwrap_err();
        assert!(matches!(e, CtlError::Timeout { .. }), "{e}");
        let (_d, ctl) = fake(Some(r#"{"id":0}"#)).await;
        assert!(matches!(ctl.revalidator_wait(Duration::from_secs(5)).await, Err(CtlError::Protocol { .. })));
    }

    #[test]
    fn control_socket_names() {
        assert!(is_ctl_name("ovs-vswitchd.123.ctl"));
        assert!(
            !is_ctl_name("ovs-vswitchd..ctl")
                && !is_ctl_name("ovsdb-server.1.ctl")
                && !is_ctl_name("ovs-vswitchd.1x.ctl")
        );
    }

    /// No pidfile: the directory's one control socket.
    #[tokio::test]
    async fn without_the_default_pidfile_the_directory_says() {
        let (d, _) = fake(Some(r#"{"id":0,"result":"","error":null}"#)).await;
        std::fs::remove_file(d.path().join("ovs-vswitchd.pid")).unwrap();
        VswitchdCtl::new(d.path()).revalidator_wait(Duration::from_secs(5)).await.unwrap();
    }

    #[tokio::test]
    async fn no_pidfile_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = VswitchdCtl::new(dir.path()).revalidator_wait(Duration::from_secs(1)).await.unwrap_err();
        assert!(e.to_string().contains("ovs-vswitchd.pid"), "{e}");
        std::fs::write(dir.path().join("ovs-vswitchd.pid"), "x").unwrap();
        let e = VswitchdCtl::new(dir.path()).revalidator_wait(Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(e, CtlError::BadPidfile { .. }), "{e}");
    }
}
