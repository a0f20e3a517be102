//! `sdn-node run`'s configuration, checked once at start before anything is written (issue 32
//! item 4): a bad file, flag or address is the operator's to fix, so the agent exits with one
//! line naming it instead of retrying forever. Only peers (ovsdb-server, ovs-vswitchd, the API
//! server, DNS) that are not up yet are waited for, later.

use std::path::Path;

use super::RunOptions;

/// One configuration error: its message names the file, flag or address, and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartupError(pub String);

/// The effective user id, for permission errors.
fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A unix socket of a peer: missing is fine (the peer is not up yet: waited for), but a socket
/// this user may not connect to never becomes usable.
fn check_socket(path: &Path, what: &str) -> Result<(), StartupError> {
    let c = match std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        Ok(c) => c,
        Err(_) => return Err(StartupError(format!("{}: not a valid path", path.display()))),
    };
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => Err(StartupError(format!(
            "{}: permission denied for uid {}: {what} cannot be reached (run as root, or give this user access to --ovs-rundir)",
            path.display(),
            uid()
        ))),
        _ => Ok(()),
    }
}

/// Checks `opts` (and the Kubernetes configuration, if the state comes from there).
pub async fn check(opts: &RunOptions, kube: Option<&crate::kube::KubeOptions>) -> Result<(), StartupError> {
    if !opts.state.as_os_str().is_empty() {
        crate::cluster::state_file::load(&opts.state).map_err(|crate::cluster::Fatal(m)| {
            // The YAML reader adds a snippet under its first line (which has line and column).
            StartupError(format!("--state: {}", m.lines().next().unwrap_or_default()))
        })?;
    }
    if let Some(k) = kube {
        crate::kube::check_config(k).await.map_err(|e| StartupError(format!("--kubeconfig: {e}")))?;
    }
    let rundir = &opts.node.bridge.ovs.ovs_rundir;
    check_socket(&rundir.join("db.sock"), "ovsdb-server")?;
    check_socket(&rundir.join(format!("{}.mgmt", opts.node.bridge.name())), "ovs-vswitchd")?;
    if let Some(addr) = opts.metrics_addr {
        // Bound and released: the listener is bound again at once by the metrics endpoint
        // (SO_REUSEADDR), and one that fails then is fatal too.
        std::net::TcpListener::bind(addr).map_err(|e| {
            StartupError(format!(
                "--metrics-addr {addr}: cannot listen: {e} (another process has it? `none` turns it off)"
            ))
        })?;
    }
    if let Some(crate::audit::Sink::File(p)) = &opts.audit.log {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map_err(|e| StartupError(format!("--audit-log {}: cannot open: {e} (uid {})", p.display(), uid())))?;
    }
    Ok(())
}
