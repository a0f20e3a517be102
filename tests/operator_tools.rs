//! The tools an operator runs (issue 32, items 5 and 6), as real processes: the CLI into a
//! closed pipe stops quietly (no panic, exit 141 as a process killed by SIGPIPE); a daemon whose
//! stderr went away keeps serving and counts the log lines it dropped; `status` with no agent
//! names the socket and how to start one; `trace --socket` takes the pods from a running agent;
//! `pod list` prints a table, `-o json` the records.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sdn_harness::sandbox::OvsSandbox;
use support::agent::{pod, readyz, write_state, Doc};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sdn-node"));
    c.env("RUST_LOG", "warn").env("NO_COLOR", "1");
    c
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = bin().args(args).output().expect("run sdn-node");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `args` with stdout a pipe whose reader reads `keep` bytes (0: none) and then closes it;
/// returns (exit code, stderr).
fn into_closed_pipe(args: &[&str], keep: usize) -> (i32, String) {
    let mut child =
        bin().args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    if keep > 0 {
        let mut buf = vec![0; keep];
        stdout.read_exact(&mut buf).expect("the command's first bytes");
    }
    drop(stdout);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    (status.code().unwrap_or(-1), err)
}

fn assert_quiet_pipe_end(what: &str, (code, err): (i32, String)) {
    assert!(!err.contains("panicked"), "{what}: no panic into a closed pipe:\n{err}");
    assert_eq!(code, 141, "{what}: ends as a process killed by SIGPIPE would (141), not 101:\n{err}");
    assert!(err.trim().is_empty(), "{what}: says nothing on stderr:\n{err}");
}

#[tokio::test]
async fn dump_flows_into_a_closed_pipe_stops_quietly() {
    let sb = support::sandbox_with_bridge().await;
    // 3,000 flows: far more than a pipe holds (64 KiB), so the writer meets the closed pipe.
    let file = sb.dir().join("flows.txt");
    let flows: String = (0..3000u32)
        .map(|i| {
            format!("table=7,priority=100,ip,nw_src=10.{}.{}.{},actions=drop\n", i / 65536, (i / 256) % 256, i % 256)
        })
        .collect();
    std::fs::write(&file, flows).unwrap();
    support::ofctl(&sb, &["add-flows", "br0", file.to_str().unwrap()]);
    let dir = sb.dir().display().to_string();
    let (code, out, err) = run(&["dump-flows", "--ovs-rundir", &dir]);
    assert_eq!(code, 0, "{err}");
    assert!(out.len() > 128 * 1024, "more output than a pipe holds: {} bytes", out.len());

    assert_quiet_pipe_end("dump-flows | head -c 1000", into_closed_pipe(&["dump-flows", "--ovs-rundir", &dir], 1000));
    assert_quiet_pipe_end(
        "dump-flows into a pipe closed at once",
        into_closed_pipe(&["dump-flows", "--ovs-rundir", &dir], 0),
    );
}

#[test]
fn status_and_pod_without_an_agent_name_the_socket() {
    let dir = std::env::temp_dir().join(format!("sdn-node-no-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("nope.sock");
    let s = sock.to_str().unwrap();
    for args in [vec!["status", "--socket", s], vec!["pod", "list", "--socket", s]] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(&format!("no sdn-node agent at {s}")), "{args:?} names the socket: {err}");
        assert!(err.contains("sdn-node run"), "{args:?} says how to start one: {err}");
    }
    // A stale socket file (no agent behind it) says the same.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let (code, _, err) = run(&["status", "--socket", s]);
    assert_eq!(code, 1);
    assert!(err.contains(&format!("no sdn-node agent at {s}")), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sdn-node run` with a pod API socket and a metrics listener, stderr a pipe the test holds.
struct Daemon {
    child: std::process::Child,
    socket: PathBuf,
    metrics: String,
    state: PathBuf,
    sb: OvsSandbox,
}

impl Daemon {
    async fn start(pods: &[String], rust_log: &str) -> Daemon {
        let sb = OvsSandbox::start(Default::default()).await.expect("start the sandbox");
        let state = sb.dir().join("state.yaml");
        let mut d = Doc::base();
        d.pods = pods.to_vec();
        write_state(&state, &d.render());
        let socket = sb.dir().join("api.sock");
        let metrics =
            format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
        let child = bin()
            .args(["run", "--state"])
            .arg(&state)
            .arg("--ovs-rundir")
            .arg(sb.dir())
            .args(["--datapath-type", "dummy", "--echo-interval", "0.5", "--echo-timeout", "1", "--max-backoff", "0.2"])
            .arg("--pod-api-socket")
            .arg(&socket)
            .args(["--metrics-addr", &metrics, "--no-host-network", "--cni-conf-dir", "none", "--state-dir"])
            .arg(sb.dir().join("lib"))
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sdn-node run");
        let d = Daemon { child, socket, metrics, state, sb };
        d.ready("start").await;
        d
    }

    async fn ready(&self, what: &str) {
        let mut last = (0, String::new());
        for _ in 0..600 {
            last = readyz(&self.metrics).await;
            if last.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: /readyz never answered 200; last: {} {}", last.0, last.1);
    }

    fn sock(&self) -> &str {
        self.socket.to_str().unwrap()
    }

    fn rundir(&self) -> String {
        self.sb.dir().display().to_string()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn add_pod(sock: &str, n: u32) -> (i32, String, String) {
    let a = 2 * 256 + 100 + n;
    run(&[
        "pod",
        "add",
        "--socket",
        sock,
        "--namespace",
        "team-b",
        "--name",
        &format!("api{n}"),
        "--container-id",
        &format!("{:064x}", 1000 + n),
        "--host-veth",
        &format!("va{n}"),
        "--ip",
        &format!("10.128.{}.{}", a / 256, a % 256),
        "--mac",
        &format!("0a:58:0a:80:{:02x}:{:02x}", a / 256, a % 256),
        "--internal",
    ])
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.trim().parse().ok()).unwrap_or(-1.0)
}

#[tokio::test]
async fn the_daemon_keeps_serving_when_its_stderr_closes() {
    let mut d = Daemon::start(&[pod("team-a", 0, 0)], "debug").await;
    // `sdn-node run 2>&1 | head`: the reader goes away.
    drop(d.child.stderr.take());
    // Work that logs a lot (debug): pods set up and torn down through the API, state reloads.
    for n in 0..10 {
        let (code, _, err) = add_pod(d.sock(), n);
        assert_eq!(code, 0, "pod add {n} after stderr closed: {err}");
        let (code, _, err) =
            run(&["pod", "del", "--socket", d.sock(), "--namespace", "team-b", "--name", &format!("api{n}")]);
        assert_eq!(code, 0, "pod del {n}: {err}");
    }
    let mut doc = Doc::base();
    doc.pods = vec![pod("team-a", 0, 0), pod("team-a", 1, 0)];
    write_state(&d.state, &doc.render());
    let (code, _, err) = add_pod(d.sock(), 99);
    assert_eq!(code, 0, "{err}");
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon is still running");
    d.ready("after its stderr closed").await;
    let (code, out, err) = run(&["status", "--socket", d.sock()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("host   off (--no-host-network)"), "the host executor is off, not 'not converged':\n{out}");
    let (_, body) = support::inproc::http_get(&d.metrics, "/metrics").await;
    let dropped = metric(&body, "sdn_node_log_lines_dropped_total");
    assert!(dropped > 0.0, "the lines it could not write are counted: {dropped}");
    let (code, out, err) = run(&["status", "--socket", d.sock(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(st["log_lines_dropped"].as_u64().unwrap_or(0) > 0, "status says so too: {out}");
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon is still running");
}

/// Bytes waiting in a pipe (FIONREAD).
fn pipe_bytes(fd: &impl std::os::fd::AsRawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(r, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    n as usize
}

/// A log reader that stalls (a container runtime's log pipe nobody drains) must not stall the
/// agent: its stderr pipe fills and stays full, and pods are still set up and torn down, and
/// status answers. Seen in the chaos soak: the agent blocked in `write(2)` for minutes, every
/// pod request waiting behind it.
#[tokio::test]
async fn the_daemon_keeps_serving_when_nobody_reads_its_stderr() {
    let mut d = Daemon::start(&[pod("team-a", 0, 0)], "debug").await;
    let stderr = d.child.stderr.take().expect("piped stderr");
    // Full: 64 KiB on Linux, less the part of a line that does not fit (a line is written
    // whole or not at all).
    const FULL: usize = 60_000;
    let (mut rounds, mut after_full) = (0, 0);
    // Debug logging of pods set up and torn down (each bundle's flows) until the pipe is full,
    // then ten rounds more with it full.
    while after_full < 10 {
        assert!(rounds < 400, "the pipe never filled: {} bytes after {rounds} rounds", pipe_bytes(&stderr));
        if pipe_bytes(&stderr) >= FULL {
            after_full += 1;
        }
        let (code, _, err) = add_pod(d.sock(), rounds);
        assert_eq!(code, 0, "pod add {rounds} (stderr pipe holds {} bytes): {err}", pipe_bytes(&stderr));
        let (code, _, err) =
            run(&["pod", "del", "--socket", d.sock(), "--namespace", "team-b", "--name", &format!("api{rounds}")]);
        assert_eq!(code, 0, "pod del {rounds}: {err}");
        rounds += 1;
    }
    assert!(pipe_bytes(&stderr) >= FULL, "nobody read it: full ({} bytes)", pipe_bytes(&stderr));
    d.ready("with its stderr full").await;
    let (code, out, err) = run(&["status", "--socket", d.sock()]);
    assert_eq!(code, 0, "status with its stderr full: {err}");
    assert!(out.lines().any(|l| l.starts_with("ready:") && l.ends_with(" yes")), "{out}");
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon is still running");
    drop(stderr);
}

#[tokio::test]
async fn pod_list_is_a_table_and_json_for_scripts() {
    let d = Daemon::start(&[pod("team-a", 0, 0)], "info").await;
    let (code, _, err) = run(&["pod", "list", "--socket", d.sock()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("No pods set up through the pod API"), "{err}");
    for n in [1, 0] {
        let (code, _, err) = add_pod(d.sock(), n);
        assert_eq!(code, 0, "{err}");
    }
    let (code, out, err) = run(&["pod", "list", "--socket", d.sock()]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        lines,
        vec![
            vec!["NAMESPACE", "NAME", "IP", "MAC", "HOST-VETH"],
            vec!["team-b", "api0", "10.128.2.100", "0a:58:0a:80:02:64", "va0"],
            vec!["team-b", "api1", "10.128.2.101", "0a:58:0a:80:02:65", "va1"],
        ],
        "{out}"
    );
    // Columns line up: every cell of a column starts where its header does.
    let header = out.lines().next().unwrap();
    for l in out.lines().skip(1) {
        assert_eq!(l.find("10.128"), header.find("IP"), "aligned:\n{out}");
    }
    let (code, out, _) = run(&["pod", "list", "--socket", d.sock(), "-o", "wide"]);
    assert_eq!(code, 0);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAMESPACE", "NAME", "IP", "MAC", "HOST-VETH", "CONTAINER-ID", "INTERNAL", "CNI"], "{out}");
    assert!(out.contains(&format!("{:064x}", 1000)), "{out}");
    let (code, out, err) = run(&["pod", "list", "--socket", d.sock(), "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("-o json is JSON");
    let mut names: Vec<&str> = v.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["api0", "api1"]);
    let (code, _, err) = run(&["pod", "list", "--socket", d.sock(), "-o", "yaml"]);
    assert_eq!(code, 2, "an unknown -o is refused by the parser: {err}");
}

#[tokio::test]
async fn trace_with_the_socket_takes_pods_from_the_running_agent() {
    let d = Daemon::start(&[pod("team-a", 0, 0), pod("team-a", 1, 0)], "info").await;
    let dir = d.rundir();
    let args = ["trace", "--socket", d.sock(), "--ovs-rundir", &dir, "--from", "team-a/p0", "--to", "team-a/p1"];
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "no --state: the agent's model names the pods:\n{out}\n{err}");
    assert!(out.contains("team-a/p1"), "{out}");
    let (code, out, err) = run(&[&args[..], &["--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json is JSON");
    assert!(v["summary"].as_str().unwrap_or("").starts_with("DELIVERED to port"), "{out}");
    assert!(v["summary"].as_str().unwrap_or("").contains("pod team-a/p1"), "{out}");

    // The endpoint behind it: read-only, every pod of the model.
    let (code, body) = get_unix(&d.socket, "/v1/model/pods").await;
    assert_eq!(code, 200, "{body}");
    let pods: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = pods.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["p0", "p1"], "{body}");
    assert_eq!(pods[0]["vnid"], 11, "{body}");

    // Into a closed pipe: quiet.
    assert_quiet_pipe_end("trace into a closed pipe", into_closed_pipe(&args, 0));
}

async fn get_unix(socket: &Path, path: &str) -> (u16, String) {
    sdn_node::api::client::call(socket, "GET", path, None).await.expect("the agent answers")
}
