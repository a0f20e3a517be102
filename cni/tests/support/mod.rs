//! Test fixtures: temporary directories, the libcni-based Go client, and a fake agent.
//!
//! The client is the reference Go library (Debian's golang-github-appc-cni-dev) so that the
//! plugin is checked against what container runtimes actually run, not our reading of the
//! spec. Without Go the tests skip with a printed reason, except under CI, where they fail:
//! a CI run must never pass without having exercised the real client.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        // Short names: unix socket paths are limited to 107 bytes.
        let p = std::env::temp_dir().join(format!(
            "sdncni-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds tests/cni-client once per test binary; `None` (after printing why) when Go or
/// libcni is missing outside CI.
pub fn go_client() -> Option<&'static Path> {
    static CLIENT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = CLIENT.get_or_init(build_client);
    match built {
        Ok(p) => Some(p.as_path()),
        Err(why) => {
            if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
                panic!("CI is set and the libcni test client is unavailable: {why}");
            }
            // Straight to stderr: eprintln! output is captured and hidden for passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: libcni test client unavailable: {why} (install golang-go golang-github-appc-cni-dev)"
            );
            None
        }
    }
}

#[path = "../../../tests/cni-client/build.rs"]
mod gobuild;

fn build_client() -> Result<PathBuf, String> {
    gobuild::build_cni_client(Path::new(env!("CARGO_TARGET_TMPDIR")), "cni-client")
}

/// A CNI setup for one test: a bin dir holding the plugin, a result cache, a conflist.
pub struct Cni {
    pub client: PathBuf,
    pub dir: TempDir,
    pub conflist: PathBuf,
}

/// What the client printed and how it exited.
#[derive(Debug)]
pub struct Run {
    pub exit: i32,
    pub out: Value,
    pub elapsed: Duration,
}

impl Run {
    /// The CNI error code, if the plugin returned a CNI error.
    pub fn code(&self) -> Option<u64> {
        (self.exit == 2).then(|| self.out["code"].as_u64()).flatten()
    }
    pub fn msg(&self) -> &str {
        self.out["msg"].as_str().unwrap_or_default()
    }
}

impl Cni {
    /// Sets up a bin dir with the plugin and writes `conflist` (JSON text).
    pub fn new(client: &Path, conflist: &str) -> Cni {
        let dir = TempDir::new("cni");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sdn-node-cni"), bin.join("sdn-node-cni")).unwrap();
        let path = dir.path().join("net.conflist");
        std::fs::write(&path, conflist).unwrap();
        Cni { client: client.to_path_buf(), dir, conflist: path }
    }

    pub fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    /// Runs `cni-client <command>` with `flags` (e.g. `-args`, `-netns`).
    pub fn run(&self, command: &str, flags: &[&str]) -> Run {
        let t = Instant::now();
        let out = Command::new(&self.client)
            .arg("-conflist")
            .arg(&self.conflist)
            .arg("-bin")
            .arg(self.bin())
            .arg("-cache")
            .arg(self.dir.path().join("cache"))
            .args(flags)
            .arg(command)
            .output()
            .expect("run cni-client");
        let elapsed = t.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!("cni-client printed no JSON ({e}): {stdout:?} stderr {:?}", String::from_utf8_lossy(&out.stderr))
        });
        Run { exit: out.status.code().unwrap_or(-1), out: v, elapsed }
    }
}

/// How the fake agent answers one request.
pub enum Action {
    /// Status and body.
    Reply(u16, String),
    /// Keep the connection open and never answer (a stuck agent).
    Hang,
    /// Close the connection without answering (a crashing agent).
    Close,
}

/// One request the fake agent received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub request_line: String,
    pub headers: String,
    pub body: Value,
}

/// An HTTP server on a unix socket that records requests and answers as scripted.
pub struct FakeAgent {
    pub socket: PathBuf,
    requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeAgent {
    pub fn start(dir: &Path, script: impl Fn(&Recorded) -> Action + Send + 'static) -> FakeAgent {
        let socket = dir.join("agent.sock");
        let listener = UnixListener::bind(&socket).expect("bind fake agent");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (reqs, stopping) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut hung = Vec::new();
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let Some(rec) = read_request(&mut conn) else { continue };
                reqs.lock().unwrap().push(rec.clone());
                match script(&rec) {
                    Action::Reply(status, body) => {
                        let msg = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = conn.write_all(msg.as_bytes());
                    }
                    Action::Hang => hung.push(conn),
                    Action::Close => drop(conn),
                }
            }
        });
        FakeAgent { socket, requests, stop, thread: Some(thread) }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_request(conn: &mut UnixStream) -> Option<Recorded> {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let (request_line, headers) = head.split_once("\r\n").unwrap_or((&head, ""));
    let len: usize = headers
        .split("\r\n")
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-length")))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Recorded {
        request_line: request_line.to_owned(),
        headers: headers.to_owned(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

/// The network config list for `version` pointing at `socket`.
pub fn conflist(version: &str, socket: &Path, extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"sdn-node","plugins":[{{"type":"sdn-node-cni","agentSocket":"{}"{extra}}}]}}"#,
        socket.display()
    )
}

/// The agent's ADD answer from the protocol description.
pub const ADD_REPLY: &str = r#"{"hostVeth":"veth1a2b3c4d","ifName":"eth0","mac":"0a:58:0a:80:00:05","sandbox":"/var/run/netns/x","ip":"10.128.0.5/23","gateway":"10.128.0.1","routes":[{"dst":"0.0.0.0/0","gw":"10.128.0.1"},{"dst":"10.128.0.0/14"},{"dst":"224.0.0.0/4"}],"mtu":1450}"#;

/// An agent that answers ADD with [`ADD_REPLY`] and everything else with `{}`.
pub fn happy(r: &Recorded) -> Action {
    match r.body["command"].as_str() {
        Some("ADD") => Action::Reply(200, ADD_REPLY.into()),
        _ => Action::Reply(200, "{}".into()),
    }
}

/// Pod identity CNI_ARGS as kubelet's runtimes pass them.
pub const POD_ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=c0ffee";
