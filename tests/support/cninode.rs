//! A node networked through CNI, as kubelet drives it: a netdev Open vSwitch in its own network
//! namespace, `sdn-node run` inside that namespace (so tun0, routes, sysctls and nftables are
//! the node's), pods as network namespaces, and every ADD/CHECK/DEL through libcni — the
//! reference Go library container runtimes use — calling the real `sdn-node-cni` binary.
//!
//! Without Go/libcni or root the tests fail under CI (`CI` set) and skip with a printed reason
//! otherwise; a CI run never passes without the real client.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use super::agent::Lines;
use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};

/// Bound of every wait here.
pub const WAIT: Duration = Duration::from_secs(60);

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// Whether the test can run (root, Go, libcni); prints why not, and fails under CI.
pub fn can_run() -> bool {
    let why = if unsafe { libc::geteuid() } != 0 {
        Some("needs root (network namespaces)".to_string())
    } else {
        go_client().err()
    };
    match why {
        None => true,
        Some(w) if in_ci() => panic!("CI is set and this test cannot run: {w}"),
        Some(w) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: {w}");
            false
        }
    }
}

#[path = "../cni-client/build.rs"]
mod gobuild;

/// Builds tests/cni-client (the libcni client) once per test binary.
pub fn go_client() -> Result<PathBuf, String> {
    static CLIENT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    CLIENT.get_or_init(|| gobuild::build_cni_client(Path::new(env!("CARGO_TARGET_TMPDIR")), "cni-client-main")).clone()
}

/// The `sdn-node-cni` binary next to `sdn-node` (built by `cargo test --workspace`; built here
/// otherwise).
pub fn plugin_binary() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_sdn-node")).with_file_name("sdn-node-cni");
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "-p", "sdn-node-cni", "--bin", "sdn-node-cni"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build sdn-node-cni");
        assert!(st.success(), "building sdn-node-cni failed");
    }
    p
}

pub fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Runs `args` inside network namespace `ns`; returns (success, stdout).
pub fn in_ns(ns: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("ip").args(["netns", "exec", ns]).args(args).output().expect("ip netns exec");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn ping(from: &str, to: &str) -> bool {
    in_ns(from, &["ping", "-c", "1", "-W", "2", to]).0
}

/// A network namespace standing for a pod's sandbox; deleted on drop.
pub struct PodNs {
    pub name: String,
}

impl PodNs {
    pub fn new(tag: &str) -> PodNs {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("sdnp{}-{}-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let out = sh(&["ip", "netns", "add", &name]);
        assert!(out.status.success(), "ip netns add {name}: {}", String::from_utf8_lossy(&out.stderr));
        PodNs { name }
    }
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }
}

impl Drop for PodNs {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.name]);
    }
}

/// What libcni returned.
#[derive(Debug)]
pub struct CniRun {
    pub exit: i32,
    pub out: Value,
}

impl CniRun {
    pub fn ok(&self) -> bool {
        self.exit == 0
    }
    /// The pod's address (CIDR) from an ADD result.
    pub fn ip(&self) -> String {
        self.out["result100"]["ips"][0]["address"].as_str().unwrap_or_default().to_string()
    }
    pub fn addr(&self) -> String {
        self.ip().split('/').next().unwrap_or_default().to_string()
    }
}

/// `sdn-node run` inside a node's network namespace, with its CNI configuration and the
/// libcni client to drive it.
pub struct NodeAgent {
    pub ns: String,
    pub rundir: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub conf_dir: PathBuf,
    /// The agent's `--state-dir` (its checkpoint of the pods).
    pub state_dir: PathBuf,
    pub proc: Option<(tokio::process::Child, Lines)>,
    /// Extra arguments of `sdn-node run` (a `--metrics-addr` here replaces the default `none`).
    pub args: Vec<String>,
    /// A command the agent runs under (e.g. `prlimit --nofile=1024`), before `ip netns exec`.
    pub wrapper: Vec<String>,
    bin: PathBuf,
    client: PathBuf,
}

impl NodeAgent {
    /// Writes `state_yaml` into `rundir` and starts the agent in `ns` against the switch whose
    /// sockets are in `rundir`; returns once it serves pods.
    pub async fn start(ns: &str, rundir: &Path, state_yaml: &str) -> NodeAgent {
        NodeAgent::start_with(ns, rundir, state_yaml, &[]).await
    }

    /// [`NodeAgent::start`] with extra arguments for `sdn-node run`.
    pub async fn start_with(ns: &str, rundir: &Path, state_yaml: &str, args: &[&str]) -> NodeAgent {
        let mut a = NodeAgent::unstarted(ns, rundir, state_yaml, args);
        a.spawn().await;
        a
    }

    /// The agent's files in place (state, plugin link), not started yet.
    fn unstarted(ns: &str, rundir: &Path, state_yaml: &str, args: &[&str]) -> NodeAgent {
        let state = rundir.join("state.yaml");
        std::fs::write(&state, state_yaml).unwrap();
        let bin = rundir.join("cni-bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(plugin_binary(), bin.join("sdn-node-cni")).unwrap();
        NodeAgent {
            ns: ns.to_string(),
            rundir: rundir.to_path_buf(),
            state,
            socket: rundir.join("cni.sock"),
            conf_dir: rundir.join("net.d"),
            state_dir: rundir.join("sdn-node-state"),
            proc: None,
            args: args.iter().map(|s| s.to_string()).collect(),
            wrapper: Vec::new(),
            bin,
            client: go_client().expect("go client"),
        }
    }

    pub fn conflist(&self) -> PathBuf {
        self.conf_dir.join("80-sdn-node.conflist")
    }

    /// The directory of the checkpoint's pod files.
    pub fn checkpoint_pods(&self) -> PathBuf {
        self.state_dir.join("pods")
    }

    /// The pods' records in the checkpoint, read here from the files themselves
    /// (`pods/<namespace>_<name>.json`, each `{"version":1,"sha256":…,"state":{"seq":N,"pod":{…}}}`):
    /// file name → the record. Temporary files (`.…`) are not pods'.
    pub fn checkpointed(&self) -> std::collections::BTreeMap<String, Value> {
        let mut out = std::collections::BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(self.checkpoint_pods()) else { return out };
        for e in entries {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap();
            let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {text}"));
            assert_eq!(doc["version"], 1, "{name}: {text}");
            out.insert(name, doc["state"]["pod"].clone());
        }
        out
    }

    /// Starts `sdn-node run` inside the node's namespace and waits for its CNI configuration
    /// (written once it serves pods: the signal kubelet waits for).
    pub async fn spawn(&mut self) {
        let _ = std::fs::remove_file(self.conflist());
        let mut child = self
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the agent");
        let log = Lines::follow(child.stderr.take().expect("stderr"));
        self.proc = Some((child, log));
        for _ in 0..600 {
            if self.conflist().exists() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the agent never wrote its CNI configuration; log:\n{}", self.log());
    }

    /// Runs the agent expecting it to stop by itself (within [`WAIT`]); returns its exit code
    /// and its log.
    pub async fn run_to_exit(&self) -> (Option<i32>, String) {
        let _ = std::fs::remove_file(self.conflist());
        let child = self
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the agent");
        let out = tokio::time::timeout(WAIT, child.wait_with_output())
            .await
            .expect("the agent exits by itself")
            .expect("wait for the agent");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// `sdn-node run` inside the node's namespace, as [`NodeAgent::spawn`] starts it.
    fn command(&self) -> tokio::process::Command {
        let metrics = if self.args.iter().any(|a| a == "--metrics-addr") { &[][..] } else { &["--metrics-addr", "none"][..] };
        let mut command: Vec<&str> = self.wrapper.iter().map(String::as_str).collect();
        command.extend(["ip", "netns", "exec", &self.ns]);
        let mut c = tokio::process::Command::new(command[0]);
        c.args(&command[1..])
            .arg(env!("CARGO_BIN_EXE_sdn-node"))
            .arg("run");
        // Kubernetes mode (`--kubeconfig` among the extra arguments) has no state file.
        if !self.args.iter().any(|a| a == "--kubeconfig") {
            c.arg("--state").arg(&self.state);
        }
        c.arg("--ovs-rundir")
            .arg(&self.rundir)
            .args(["--datapath-type", "netdev"])
            .args(metrics)
            .args(["--echo-interval", "0.5", "--echo-timeout", "2", "--max-backoff", "0.2"])
            .arg("--pod-api-socket")
            .arg(&self.socket)
            .arg("--cni-conf-dir")
            .arg(&self.conf_dir)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(&self.args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        c
    }

    /// Polls the agent's status (bounded: 400 polls 50 ms apart) until it says ready (what
    /// `/readyz` says); panics with why not and `what` otherwise. Every test that changes
    /// something ends with this (issue 32: readiness tells the truth).
    pub async fn ready_again(&self, what: &str) {
        let mut last = None;
        for _ in 0..400 {
            match sdn_node::api::status::fetch(&self.socket).await {
                Ok(st) if st.not_ready.is_none() && st.converged => return,
                Ok(st) => last = st.not_ready.or(Some("not converged".into())),
                Err(e) => last = Some(format!("no status: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: the agent never said ready again: {last:?}\n{}", self.log());
    }

    pub fn log(&self) -> String {
        self.proc.as_ref().map(|(_, l)| l.all().join("\n")).unwrap_or_default()
    }

    /// The agent's pid (`ip netns exec` and a wrapper such as prlimit exec it in place).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(|(c, _)| c.id())
    }

    /// SIGKILLs the agent (a crash).
    pub async fn kill(&mut self) {
        if let Some((mut c, _)) = self.proc.take() {
            let _ = c.kill().await;
        }
    }

    /// `POST /v1/cni` straight to the agent's socket (what `sdn-node-cni` sends, without a
    /// process in between: back-to-back requests microseconds apart). Returns the HTTP status.
    pub fn cni_raw(&self, command: &str, pod_ns: &str, name: &str, container: &str, netns: &str) -> u16 {
        let body = serde_json::json!({
            "command": command, "containerID": container, "netns": netns, "ifName": "eth0",
            "namespace": pod_ns, "name": name, "cniVersion": "1.0.0",
        });
        self.cni_post(&body).0
    }

    /// `POST /v1/cni` of `body` as it is (any field, or none, as a hostile caller would send
    /// it); returns the HTTP status and the response body.
    pub fn cni_post(&self, body: &Value) -> (u16, String) {
        use std::io::{Read, Write};
        let body = body.to_string();
        let mut s = std::os::unix::net::UnixStream::connect(&self.socket).expect("connect to the pod API socket");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(s, "POST /v1/cni HTTP/1.1\r\nHost: sdn-node\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
            .expect("send");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }

    /// Runs the libcni client: `add`, `check` or `del` for pod `ns/name` in `netns`.
    pub fn cni(&self, command: &str, pod_ns: &str, name: &str, container: &str, netns: &str) -> CniRun {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={pod_ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={container}");
        self.cni_with(&self.conflist(), command, &args, container, netns)
    }

    /// Runs the libcni client with `conflist` and CNI_ARGS `args` as they are (a runtime that
    /// is not Kubernetes sends no `K8S_POD_NAMESPACE`).
    pub fn cni_with(&self, conflist: &Path, command: &str, args: &str, container: &str, netns: &str) -> CniRun {
        let out = Command::new(&self.client)
            .arg("-conflist")
            .arg(conflist)
            .arg("-bin")
            .arg(&self.bin)
            .arg("-cache")
            .arg(self.rundir.join("cni-cache"))
            .args(["-containerid", container, "-netns", netns, "-ifname", "eth0"])
            .args(["-args", args])
            .arg(command)
            .output()
            .expect("run the libcni client");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let out_v = serde_json::from_str(stdout.trim()).unwrap_or(Value::String(format!("{stdout} {}", String::from_utf8_lossy(&out.stderr))));
        CniRun { exit: out.status.code().unwrap_or(-1), out: out_v }
    }
}

/// One node: a switch in its own namespace, and the agent.
pub struct CniNode {
    pub agent: NodeAgent,
    pub sb: OvsSandbox,
    pub ns: String,
}

impl CniNode {
    pub async fn start(state_yaml: &str) -> CniNode {
        CniNode::start_with(state_yaml, &[]).await
    }

    /// [`CniNode::start`] with extra arguments for `sdn-node run`.
    pub async fn start_with(state_yaml: &str, args: &[&str]) -> CniNode {
        CniNode::start_wrapped(state_yaml, args, &[]).await
    }

    /// [`CniNode::start_with`], the agent run under `wrapper` (e.g. `prlimit --nofile=1024`),
    /// with the node's loopback up before the agent starts (for a metrics listener on
    /// 127.0.0.1 in the node's namespace).
    pub async fn start_wrapped(state_yaml: &str, args: &[&str], wrapper: &[&str]) -> CniNode {
        static N: AtomicU32 = AtomicU32::new(0);
        let ns = format!("sdnn{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let sb = OvsSandbox::start(SandboxOptions { netns: Some(ns.clone()), ..Default::default() }).await.expect("sandbox");
        if !wrapper.is_empty() || args.contains(&"--metrics-addr") {
            assert!(sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]).status.success());
        }
        let mut agent = NodeAgent {
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
            ..NodeAgent::unstarted(&ns, sb.dir(), state_yaml, args)
        };
        agent.spawn().await;
        CniNode { agent, sb, ns }
    }

    pub fn log(&self) -> String {
        self.agent.log()
    }

    /// [`NodeAgent::ready_again`].
    pub async fn ready_again(&self, what: &str) {
        self.agent.ready_again(what).await
    }

    pub async fn kill_agent(&mut self) {
        self.agent.kill().await
    }

    pub async fn spawn_agent(&mut self) {
        self.agent.spawn().await
    }

    pub fn cni(&self, command: &str, pod_ns: &str, name: &str, container: &str, netns: &str) -> CniRun {
        self.agent.cni(command, pod_ns, name, container, netns)
    }

    pub fn cni_raw(&self, command: &str, pod_ns: &str, name: &str, container: &str, netns: &str) -> u16 {
        self.agent.cni_raw(command, pod_ns, name, container, netns)
    }

    pub fn cni_post(&self, body: &Value) -> (u16, String) {
        self.agent.cni_post(body)
    }

    /// Host-side veths in the node's namespace.
    pub fn veths(&self) -> Vec<String> {
        let (_, out) = in_ns(&self.ns, &["ip", "-o", "link", "show", "type", "veth"]);
        let mut v: Vec<String> =
            out.lines().filter_map(|l| l.split(':').nth(1)).map(|n| n.trim().split('@').next().unwrap_or("").to_string()).collect();
        v.sort();
        v
    }

    pub fn ports(&self) -> Vec<String> {
        super::agent::try_list_ports(&self.sb).unwrap_or_default()
    }

    pub fn flows(&self) -> Vec<String> {
        super::dump_sorted(&self.sb, &[])
    }

    pub fn nft(&self) -> String {
        in_ns(&self.ns, &["nft", "list", "ruleset"]).1
    }

    /// GET /metrics from the agent's `--metrics-addr` listener `addr`, inside the node's
    /// namespace (connect and read with deadlines): the whole HTTP answer.
    #[allow(dead_code)]
    pub async fn metrics(&self, addr: &str) -> String {
        use std::io::Read;
        let netns = hostnet::Netns::open(format!("/var/run/netns/{}", self.ns)).expect("node namespace");
        let addr: std::net::SocketAddr = addr.parse().expect("address");
        let stream = netns
            .run("connect to the metrics listener", move || {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                    .map_err(|e| hostnet::Error::Invalid { what: addr.to_string(), reason: e.to_string() })
            })
            .await
            .expect("connect inside the node's namespace");
        tokio::task::spawn_blocking(move || {
            let mut s = stream;
            s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
            write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("request");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        })
        .await
        .expect("metrics")
    }
}

/// A 64-hex container ID from a number.
pub fn container(n: u32) -> String {
    format!("{n:08x}").repeat(8)
}

/// A multitenant node-a (10.128.0.0/23, MTU 1450) with a peer node-b and the namespaces
/// default (VNID 0), team-a (11) and team-b (12).
pub const MULTITENANT: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
mtu: 1450
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.128.2.0/23}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11}
  - {name: team-b, netid: 12}
"#;
