//! Issue 32 item 4: `sdn-node run` checks its configuration once at start; each bad file, flag,
//! address or permission exits non-zero with exactly one line on stderr naming it (before, the
//! agent ran on, retrying forever). Peers that are simply not up (no sockets in --ovs-rundir
//! here) are not configuration errors: these runs never get as far as waiting for them.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const STATE: &str = include_str!("../deploy/examples/cluster.yaml");

/// `sdn-node run` with `args` on an Open vSwitch that is not there (rundir `dir`), bounded;
/// `uid`: run as that user. Returns the exit code and stderr's lines.
fn run(dir: &Path, args: &[&str], uid: Option<u32>) -> (Option<i32>, Vec<String>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sdn-node"));
    c.arg("run")
        .args(args)
        .arg("--ovs-rundir")
        .arg(dir)
        .args(["--pod-api-socket", "none", "--state-dir", "none", "--no-host-network", "--cni-conf-dir", "none"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    let mut child = c.spawn().expect("spawn sdn-node run");
    // A configuration error exits at once; an agent still running after this long did not.
    for _ in 0..200 {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().expect("wait").is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr).lines().map(str::to_string).collect();
    (out.status.code(), err)
}

/// Exit 1 and one line, containing every one of `want`.
fn assert_one_line(r: (Option<i32>, Vec<String>), want: &[&str]) {
    let (code, lines) = r;
    assert_eq!(code, Some(1), "exit code; stderr:\n{}", lines.join("\n"));
    assert_eq!(lines.len(), 1, "one line on stderr:\n{}", lines.join("\n"));
    for w in want {
        assert!(lines[0].contains(w), "{w:?} not in {:?}", lines[0]);
    }
    assert!(lines[0].starts_with("error: "), "{:?}", lines[0]);
}

fn metrics_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", l.local_addr().unwrap().port())
}

#[test]
fn a_missing_state_file_exits() {
    let d = tempfile::tempdir().unwrap();
    let m = metrics_port();
    assert_one_line(run(d.path(), &["--state", "nope.yaml", "--metrics-addr", &m], None), &["--state", "nope.yaml"]);
}

#[test]
fn a_state_file_that_does_not_parse_exits() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("bad.yaml");
    std::fs::write(&f, "node: [unclosed\n").unwrap();
    let m = metrics_port();
    assert_one_line(
        run(d.path(), &["--state", f.to_str().unwrap(), "--metrics-addr", &m], None),
        &["--state", "bad.yaml"],
    );
}

#[test]
fn a_missing_kubeconfig_exits() {
    let d = tempfile::tempdir().unwrap();
    let m = metrics_port();
    assert_one_line(
        run(d.path(), &["--kubeconfig", "/nonexistent", "--node", "n1", "--metrics-addr", &m], None),
        &["--kubeconfig", "/nonexistent"],
    );
}

#[test]
fn a_metrics_address_in_use_exits() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("state.yaml");
    std::fs::write(&f, STATE).unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    assert_one_line(
        run(d.path(), &["--state", f.to_str().unwrap(), "--metrics-addr", &addr], None),
        &["--metrics-addr", &addr],
    );
}

#[test]
fn an_audit_log_that_cannot_be_opened_exits() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("state.yaml");
    std::fs::write(&f, STATE).unwrap();
    let m = metrics_port();
    let log = d.path().join("no/such/dir/audit.log");
    assert_one_line(
        run(
            d.path(),
            &["--state", f.to_str().unwrap(), "--metrics-addr", &m, "--audit-log", log.to_str().unwrap()],
            None,
        ),
        &["--audit-log", "audit.log"],
    );
}

/// Not root: ovsdb-server's socket (mode 0755, root's) cannot be connected to; that never gets
/// better by waiting, so it exits naming the socket and the uid.
#[test]
fn an_ovs_socket_this_user_cannot_use_exits() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none_or(|v| v.is_empty()), "CI is set and this test needs root");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = d.path().join("db.sock");
    let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = d.path().join("state.yaml");
    std::fs::write(&f, STATE).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let m = metrics_port();
    assert_one_line(
        run(d.path(), &["--state", f.to_str().unwrap(), "--metrics-addr", &m], Some(65534)),
        &["db.sock", "permission denied", "uid 65534"],
    );
}
