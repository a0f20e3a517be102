//! The `sdn-node` binary as a long-running agent under test, and the oracles around it.
//!
//! - [`Agent`]: `sdn-node run` as a child process, killed (SIGKILL) and reaped on drop. Its
//!   stderr (the tracing log) is read line by line; tests wait on log lines as events
//!   ([`Agent::wait_log`]), bounded, never by sleeping. If a test panics, the agent's log is
//!   printed.
//! - [`Doc`]: a cluster state file built from YAML items, and [`write_state`], which replaces
//!   the file atomically (write to a temporary file, then rename) as a real source would.
//! - Oracles: `ovs-ofctl dump-flows`, `ovs-vsctl`, `sdn-node apply` and
//!   [`sdn_node::apply::converge`]; [`reference_dump`] programs an independent switch from
//!   scratch with the same state (see there for how ofports are made comparable);
//!   [`poll_until`] is the bounded poll for the few conditions that have no event.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sdn_node::apply::{converge, ApplyOptions, ApplyReport};
use sdn_node::cluster::state_file;
use sdn_harness::sandbox::OvsSandbox;
use tokio::sync::watch;

/// Bound for every wait on an agent's log line or on the switch.
pub const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The agent process

/// A child's stdout or stderr, taken out of tokio for a reading thread.
pub trait IntoPipeFd {
    fn into_pipe_fd(self) -> std::io::Result<std::os::fd::OwnedFd>;
}

impl IntoPipeFd for tokio::process::ChildStdout {
    fn into_pipe_fd(self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.into_owned_fd()
    }
}

impl IntoPipeFd for tokio::process::ChildStderr {
    fn into_pipe_fd(self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.into_owned_fd()
    }
}

/// Lines a child process wrote (to stderr or stdout), shared with the task that reads them.
#[derive(Clone)]
pub struct Lines {
    buf: Arc<Mutex<Vec<String>>>,
    /// Number of lines, and whether the stream ended.
    count: watch::Receiver<(usize, bool)>,
}

impl Lines {
    /// Starts a thread that reads `r` line by line. A thread of its own, not a task: a test
    /// that blocks its runtime (a synchronous CNI call waiting for the agent) must not stop the
    /// reading, or the child's pipe fills and the child's writes block behind the test.
    pub fn follow(r: impl IntoPipeFd) -> Lines {
        use std::io::BufRead;
        let buf = Arc::new(Mutex::new(Vec::new()));
        let (tx, count) = watch::channel((0, false));
        let b = buf.clone();
        let fd = r.into_pipe_fd().expect("the child's pipe as a file descriptor");
        // tokio made it non-blocking; this thread reads it blocking.
        unsafe {
            use std::os::fd::AsRawFd;
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
        std::thread::spawn(move || {
            let reader = std::io::BufReader::new(std::fs::File::from(fd));
            for l in reader.lines() {
                let Ok(l) = l else { break };
                let n = {
                    let mut v = b.lock().unwrap();
                    v.push(l);
                    v.len()
                };
                tx.send_replace((n, false));
            }
            let n = b.lock().unwrap().len();
            tx.send_replace((n, true));
        });
        Lines { buf, count }
    }

    /// Number of lines so far: a mark for [`Lines::wait`].
    pub fn mark(&self) -> usize {
        self.buf.lock().unwrap().len()
    }

    pub fn all(&self) -> Vec<String> {
        self.buf.lock().unwrap().clone()
    }

    /// The lines from `from` on.
    pub fn since(&self, from: usize) -> Vec<String> {
        self.buf.lock().unwrap()[from..].to_vec()
    }

    /// Waits (bounded by `bound`) for the first line at index >= `from` that satisfies `pred`;
    /// returns its index and text. `None` if the bound passed or the stream ended first.
    pub async fn wait(&self, from: usize, bound: Duration, pred: impl Fn(&str) -> bool) -> Option<(usize, String)> {
        let mut rx = self.count.clone();
        let mut next = from;
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            // Mark the count seen before reading the lines: a line pushed after this wakes
            // `changed` below.
            let ended = rx.borrow_and_update().1;
            let found = {
                let v = self.buf.lock().unwrap();
                let found = v.iter().enumerate().skip(next).find(|(_, l)| pred(l)).map(|(i, l)| (i, l.clone()));
                next = next.max(v.len());
                found
            };
            if found.is_some() {
                return found;
            }
            if ended {
                return None;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    // One last look: lines may have arrived with the last change.
                    let v = self.buf.lock().unwrap();
                    return v.iter().enumerate().skip(next).find(|(_, l)| pred(l)).map(|(i, l)| (i, l.clone()));
                }
            }
        }
    }
}

/// How the agent is started.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub state: PathBuf,
    pub rundir: PathBuf,
    pub datapath_type: String,
    pub port_timeout_secs: u64,
}

impl AgentOptions {
    pub fn new(state: &Path, sb: &OvsSandbox, datapath_type: &str) -> AgentOptions {
        AgentOptions {
            state: state.to_path_buf(),
            rundir: sb.dir().to_path_buf(),
            datapath_type: datapath_type.into(),
            port_timeout_secs: 10,
        }
    }
}

/// `sdn-node run` with short echo/backoff settings; SIGKILLed and reaped when dropped.
pub struct Agent {
    child: tokio::process::Child,
    pub log: Lines,
    pid: i32,
    /// Its metrics listener (`/readyz`), on a port of its own.
    pub metrics: String,
}

impl Agent {
    pub fn spawn(o: &AgentOptions) -> Agent {
        let metrics = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
            .args(["run", "--state"])
            .arg(&o.state)
            .arg("--ovs-rundir")
            .arg(&o.rundir)
            .args(["--datapath-type", &o.datapath_type])
            .args(["--port-timeout", &o.port_timeout_secs.to_string()])
            .args(["--echo-interval", "0.5", "--echo-timeout", "1", "--max-backoff", "0.2"])
            // Parallel agents: no shared pod API socket; a metrics port of its own.
            .args(["--pod-api-socket", "none", "--metrics-addr", &metrics])
            // The node's own networking is not the test host's to change.
            .args(["--no-host-network", "--cni-conf-dir", "none"])
            // No pod API, so no pods of its own to record (and no shared /var/lib/sdn-node).
            .args(["--state-dir", "none"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sdn-node run");
        let pid = child.id().expect("a running child has a pid") as i32;
        let log = Lines::follow(child.stderr.take().expect("piped stderr"));
        Agent { child, log, pid, metrics }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Sends `sig` to the agent (by its pid; it is our child, so the pid cannot be reused
    /// before we reap it).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain signal delivery to our own unreaped child.
        let r = unsafe { libc::kill(self.pid, sig) };
        assert_eq!(r, 0, "kill({}, {sig}): {}", self.pid, std::io::Error::last_os_error());
    }

    /// Waits (bounded) for the agent to exit.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the agent did not exit within {WAIT:?}\n{}", self.log_text()))
            .expect("wait for the agent")
    }

    /// SIGKILL, then reap.
    pub async fn kill9(mut self) {
        self.kill9_in_place().await;
    }

    /// SIGKILL, then reap, keeping the handle (and its log).
    pub async fn kill9_in_place(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait_exit().await;
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for a log line (at index >= `from`) containing every one of `needles`; panics
    /// with the log if none comes within [`WAIT`].
    pub async fn wait_log(&self, from: usize, needles: &[&str]) -> (usize, String) {
        match self.log.wait(from, WAIT, |l| needles.iter().all(|n| l.contains(n))).await {
            Some(hit) => hit,
            None => {
                panic!("no agent log line with {needles:?} within {WAIT:?} (from line {from}):\n{}", self.log_text())
            }
        }
    }

    pub fn log_text(&self) -> String {
        self.log.all().join("\n")
    }

    /// Polls `/readyz` (bounded: 400 polls 50 ms apart) until it answers 200; panics with its
    /// last answer, `what` and the log otherwise. Tests that change something end with this
    /// (issue 32: readiness tells the truth).
    pub async fn ready_again(&self, what: &str) {
        let mut last = (0, String::new());
        for _ in 0..400 {
            last = readyz(&self.metrics).await;
            if last.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: /readyz never answered 200 again; last: {} {}\n{}", last.0, last.1, self.log_text());
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- agent {} log ----\n{}\n---- end of agent log ----", self.pid, self.log_text());
        }
        // kill_on_drop sends SIGKILL; reap here so no zombie outlives the test.
        let _ = self.child.start_kill();
        for _ in 0..200 {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// State files

/// A cluster state file: `node-a` with subnet 10.128.2.0/23 in 10.128.0.0/14, multitenant;
/// every list holds YAML flow-style items.
#[derive(Clone, Debug)]
pub struct Doc {
    pub host_subnets: Vec<String>,
    pub net_namespaces: Vec<String>,
    pub services: Vec<String>,
    pub pods: Vec<String>,
    pub egress: Vec<String>,
    /// A comment line; makes otherwise equal texts differ (so the agent loads it again).
    pub comment: String,
}

impl Doc {
    pub fn base() -> Doc {
        Doc {
            host_subnets: vec![
                "{host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}".into(),
                "{host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}".into(),
            ],
            net_namespaces: vec![
                "{name: default, netid: 0}".into(),
                "{name: team-a, netid: 11}".into(),
                "{name: team-b, netid: 12}".into(),
            ],
            services: vec![
                "{namespace: team-a, name: web, clusterIP: 172.30.0.10, ports: [{protocol: TCP, port: 80}]}".into(),
            ],
            pods: Vec::new(),
            egress: Vec::new(),
            comment: String::new(),
        }
    }

    pub fn render(&self) -> String {
        let mut s = format!(
            "# {}\nnode: node-a\nplugin: multitenant\nclusterNetwork: 10.128.0.0/14\nserviceNetwork: 172.30.0.0/16\n",
            self.comment
        );
        for (key, items) in [
            ("hostSubnets", &self.host_subnets),
            ("netNamespaces", &self.net_namespaces),
            ("services", &self.services),
            ("pods", &self.pods),
            ("egressNetworkPolicies", &self.egress),
        ] {
            if items.is_empty() {
                s.push_str(&format!("{key}: []\n"));
            } else {
                s.push_str(&format!("{key}:\n"));
                for i in items {
                    s.push_str(&format!("  - {i}\n"));
                }
            }
        }
        s
    }

    /// The host-side port name of pod `n` (see [`pod`]).
    pub fn veth(n: u32) -> String {
        format!("vp{n}")
    }
}

/// Pod number `n` (0..500) in `namespace`: IP 10.128.2.10+n (in the local /23), an OVS internal
/// port `vp<n>`, a container ID derived from `n`, and `ingressBPS` if non-zero (a QoS row).
pub fn pod(namespace: &str, n: u32, ingress_bps: i64) -> String {
    let a = 2 * 256 + 10 + n;
    let ip = format!("10.128.{}.{}", a / 256, a % 256);
    let mac = format!("0a:58:0a:80:{:02x}:{:02x}", a / 256, a % 256);
    format!(
        "{{namespace: {namespace}, name: p{n}, containerID: \"{:064x}\", hostVeth: {}, internal: true, ip: {ip}, mac: \"{mac}\", ingressBPS: {ingress_bps}}}",
        u64::from(n) + 1,
        Doc::veth(n)
    )
}

/// Replaces `path` atomically: write a temporary file in the same directory, then rename.
pub fn write_state(path: &Path, text: &str) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).expect("write the temporary state file");
    std::fs::rename(&tmp, path).expect("rename the state file into place");
}

// ---------------------------------------------------------------------------------------------
// Oracles

/// `ovs-vsctl --timeout=20 ARGS` against the sandbox: (success, stdout, stderr).
pub fn vsctl_status(sb: &OvsSandbox, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("ovs-vsctl")
        .arg(format!("--db={}", sb.db_socket()))
        .arg("--timeout=20")
        .args(args)
        .envs(sb.ovs_env())
        .output()
        .expect("run ovs-vsctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ovs-vsctl`; panics with stderr on failure.
pub fn vsctl(sb: &OvsSandbox, args: &[&str]) -> String {
    let (ok, out, err) = vsctl_status(sb, args);
    assert!(ok, "ovs-vsctl {args:?} failed: {err}");
    out
}

/// Ports of br0 (`ovs-vsctl list-ports br0`), sorted.
pub fn list_ports(sb: &OvsSandbox) -> Vec<String> {
    try_list_ports(sb).unwrap_or_else(|e| panic!("{e}"))
}

/// `list_ports`, or the error (no bridge yet).
pub fn try_list_ports(sb: &OvsSandbox) -> Result<Vec<String>, String> {
    let (ok, out, err) = vsctl_status(sb, &["--no-wait", "list-ports", "br0"]);
    if !ok {
        return Err(format!("ovs-vsctl list-ports br0: {err}"));
    }
    let mut v: Vec<String> = out.lines().map(str::to_string).collect();
    v.sort();
    Ok(v)
}

/// Number of QoS rows (`ovs-vsctl list qos | grep -c _uuid`).
pub fn qos_rows(sb: &OvsSandbox) -> usize {
    vsctl(sb, &["--no-wait", "list", "qos"]).lines().filter(|l| l.starts_with("_uuid")).count()
}

/// Interface name -> ofport (`[]`/-1 as they come).
pub fn ofports(sb: &OvsSandbox) -> BTreeMap<String, String> {
    vsctl(
        sb,
        &["--no-wait", "--format=csv", "--data=bare", "--no-headings", "--columns=name,ofport", "list", "Interface"],
    )
    .lines()
    .filter_map(|l| l.split_once(','))
    .map(|(n, p)| (n.to_string(), p.trim().to_string()))
    .collect()
}

/// `dump-flows --no-stats` lines (sorted), cookies included.
pub fn dump(sb: &OvsSandbox) -> Vec<String> {
    super::dump_sorted(sb, &[])
}

/// `dump-flows --no-stats` lines without their cookie (sorted): what a switch programmed by
/// another agent run or by `sdn-node apply` must equal.
pub fn without_cookies(lines: &[String]) -> Vec<String> {
    let mut v: Vec<String> = lines
        .iter()
        .map(|l| match l.strip_prefix("cookie=") {
            Some(rest) => rest.split_once(", ").map(|(_, r)| r.to_string()).unwrap_or_default(),
            None => l.clone(),
        })
        .collect();
    v.sort();
    v
}

/// The dump, or the error, without panicking (the switch may be down).
pub fn try_dump(sb: &OvsSandbox) -> Result<Vec<String>, String> {
    let (ok, out, err) = super::ofctl_status(sb, &["dump-flows", "--no-stats", "--no-names", "br0"]);
    if !ok {
        return Err(err);
    }
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| !l.starts_with("OFPST_FLOW") && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect();
    v.sort();
    Ok(v)
}

/// Lines only in `a` (`-`) or only in `b` (`+`).
pub fn diff(a: &[String], b: &[String]) -> String {
    let sa: BTreeSet<&String> = a.iter().collect();
    let sb: BTreeSet<&String> = b.iter().collect();
    let mut out = String::new();
    for l in sa.difference(&sb).take(20) {
        out.push_str(&format!("- {l}\n"));
    }
    for l in sb.difference(&sa).take(20) {
        out.push_str(&format!("+ {l}\n"));
    }
    if out.is_empty() && a.len() != b.len() {
        out = format!("same lines, different multiplicity ({} vs {})", a.len(), b.len());
    }
    out
}

/// Equal dumps, or a panic with their difference.
pub fn assert_same(got: &[String], want: &[String], what: &str) {
    assert!(got == want, "{what}: the dumps differ (- expected, + found):\n{}", diff(want, got));
}

/// Bounded poll of an oracle, for conditions that have no event: at most `tries` attempts with
/// a backoff from 10 ms doubling to 200 ms; panics with `what` and the last error.
pub async fn poll_until<T>(what: &str, tries: u32, mut f: impl FnMut() -> Result<T, String>) -> T {
    let mut delay = Duration::from_millis(10);
    let mut last = String::new();
    for _ in 0..tries {
        match f() {
            Ok(t) => return t,
            Err(e) => last = e,
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(200));
    }
    panic!("{what}: not reached after {tries} tries; last:\n{last}");
}

/// Polls until br0 has exactly the ports `want` (plus br0, vxlan0, tun0), each with an ofport.
pub async fn ports_settled(sb: &OvsSandbox, want: &[String]) -> BTreeMap<String, String> {
    let mut expect: Vec<String> = want.iter().cloned().chain(["tun0".into(), "vxlan0".into()]).collect();
    expect.sort();
    poll_until("the bridge's ports match the state, each with an ofport", 150, || {
        let ports = try_list_ports(sb)?;
        if ports != expect {
            return Err(format!("ports {ports:?}, want {expect:?}"));
        }
        let of = ofports(sb);
        for p in &expect {
            match of.get(p).and_then(|v| v.parse::<i64>().ok()) {
                Some(n) if n > 0 => {}
                other => return Err(format!("port {p} has ofport {other:?}")),
            }
        }
        Ok(of)
    })
    .await
}

/// The flows (without cookies) that an independent switch holds after `sdn-node apply` of
/// `state` from scratch.
///
/// Pod flows carry ofports, which depend on a switch's history (OVS hands out numbers as ports
/// come and go). To compare whole dumps, every table included, the reference switch's pod
/// ports are created first with `ofport_request` set to the ofport each one has on the switch
/// under test (`ofports`); apply then finds them (it drops the request; OVS keeps the number).
/// The ofports of the reference are checked to match before its dump is returned.
pub async fn reference_dump(state: &str, ofports: &BTreeMap<String, String>, datapath_type: &str) -> Vec<String> {
    let sb = OvsSandbox::start(Default::default()).await.expect("start the reference sandbox");
    sb.add_bridge("br0", datapath_type).await.expect("reference br0");
    let pods: Vec<(&String, &String)> =
        ofports.iter().filter(|(n, _)| !["br0", "tun0", "vxlan0"].contains(&n.as_str())).collect();
    if !pods.is_empty() {
        let mut args: Vec<String> = Vec::new();
        for (name, port) in &pods {
            args.extend(
                ["--", "add-port", "br0", name, "--", "set", "Interface", name, "type=internal"]
                    .iter()
                    .map(|s| s.to_string()),
            );
            args.push(format!("ofport_request={port}"));
        }
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        vsctl(&sb, &a);
    }
    let path = sb.dir().join("state.yaml");
    write_state(&path, state);
    let (code, _, err) = sdn_node(&[
        "apply",
        "--state",
        path.to_str().unwrap(),
        "--ovs-rundir",
        sb.dir().to_str().unwrap(),
        "--datapath-type",
        datapath_type,
    ]);
    assert!(code == 0 || code == 2, "reference apply failed ({code}): {err}");
    let got = self::ofports(&sb);
    for (name, port) in &pods {
        assert_eq!(got.get(*name), Some(*port), "the reference switch did not keep the requested ofport of {name}");
    }
    without_cookies(&dump(&sb))
}

/// Runs the binary to completion: (exit code, stdout, stderr).
pub fn sdn_node(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sdn-node"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .output()
        .expect("run sdn-node");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until the switch under test holds exactly what `sdn-node apply` of `state` installs on
/// a fresh switch (ports first: the reference needs their ofports). Returns the dump (with
/// cookies).
pub async fn converged_to(sb: &OvsSandbox, state: &str, veths: &[String]) -> Vec<String> {
    let of = ports_settled(sb, veths).await;
    let want = reference_dump(state, &of, "dummy").await;
    poll_until("the switch equals the reference", 150, || {
        let d = try_dump(sb)?;
        let got = without_cookies(&d);
        if got == want {
            Ok(d)
        } else {
            Err(diff(&want, &got))
        }
    })
    .await
}

/// The converge oracle: `converge` the switch to `state` once more and return its report (0
/// adds/modifies/deletes proves the switch already held the desired state).
pub async fn converge_again(sb: &OvsSandbox, state: &str, datapath_type: &str) -> ApplyReport {
    let (parsed, _) = state_file::parse(state).expect("state parses");
    let mut opts = ApplyOptions::new(sb.dir().join("state.yaml"), sb.dir().to_path_buf());
    opts.bridge.datapath_type = Some(datapath_type.parse().expect("a datapath type"));
    tokio::time::timeout(WAIT, converge(&opts, &parsed)).await.expect("converge in time").expect("converge")
}

/// Asserts a converge report shows no flow change.
pub fn assert_no_flow_mods(r: &ApplyReport, what: &str) {
    assert_eq!((r.adds, r.modifies, r.deletes), (0, 0, 0), "{what}: converge still found work: {r:?}");
}

/// The generations in the cookies of a dump (sdn-node flows only).
pub fn generations(lines: &[String]) -> BTreeSet<u32> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("cookie=0x"))
        .filter_map(|r| r.split(',').next())
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .filter(|c| (1..=10).contains(&(c >> 56)))
        .map(sdn_node::store::Owner::generation_of)
        .collect()
}

/// The generation stored on br0.
pub fn stored_generation(sb: &OvsSandbox) -> Option<u32> {
    let (ok, out, _) = vsctl_status(sb, &["--no-wait", "get", "Bridge", "br0", "external_ids:sdn-node-generation"]);
    if !ok {
        return None;
    }
    out.trim().trim_matches('"').parse().ok()
}

/// Sends a signal to a daemon of the sandbox by pid.
pub fn signal_pid(pid: i32, sig: i32) {
    // SAFETY: plain signal delivery; the pid comes from the sandbox, which checked that it is
    // the daemon it started.
    let r = unsafe { libc::kill(pid, sig) };
    assert_eq!(r, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
}

/// GET /readyz from `addr` (a connection refused is status 0).
pub async fn readyz(addr: &str) -> (u16, String) {
    let addr = addr.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut out = String::new();
        if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = write!(s, "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let _ = s.read_to_string(&mut out);
        }
        let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
    })
    .await
    .expect("GET /readyz")
}
