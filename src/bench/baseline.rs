//! The baselines the churn benchmark measures the agent against, in the same run:
//! - the seed's way: one `ovs-ofctl -O OpenFlow13 --bundle add-flows BRIDGE -` process per
//!   transaction, fed the seed's flow text;
//! - `ovs-ofctl --bundle add-flows BRIDGE FILE` for a whole table.
//!
//! The raw baselines (unbundled FLOW_MODs, the switch's limit) are in [`super::rawof`].
//! This module and [`super::seed`] are the only places the binary runs ovs-ofctl/ovs-vsctl,
//! and only as benchmark baselines; no agent code path uses them.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};


use super::BenchError;

/// Runs `ovs-ofctl --bundle add-flows BRIDGE -` with `text` on stdin; returns its wall time.
pub fn ofctl_transaction(env: &[(String, String)], bridge: &str, text: &str) -> Result<Duration, BenchError> {
    let t = Instant::now();
    let mut child = Command::new("ovs-ofctl")
        .args(["-O", "OpenFlow13", "--bundle", "add-flows", bridge, "-"])
        .envs(env.iter().cloned())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| BenchError::Baseline(format!("cannot run ovs-ofctl: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).map_err(|e| BenchError::Baseline(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| BenchError::Baseline(e.to_string()))?;
    let d = t.elapsed();
    if !out.status.success() {
        return Err(BenchError::Baseline(format!("ovs-ofctl failed: {}", String::from_utf8_lossy(&out.stderr))));
    }
    Ok(d)
}

/// `ovs-ofctl --bundle add-flows BRIDGE FILE`; returns its wall time.
pub fn ofctl_bundle_file(env: &[(String, String)], bridge: &str, file: &Path) -> Result<Duration, BenchError> {
    let t = Instant::now();
    let out = Command::new("ovs-ofctl")
        .args(["-O", "OpenFlow13", "--bundle", "add-flows", bridge])
        .arg(file)
        .envs(env.iter().cloned())
        .output()
        .map_err(|e| BenchError::Baseline(format!("cannot run ovs-ofctl: {e}")))?;
    let d = t.elapsed();
    if !out.status.success() {
        return Err(BenchError::Baseline(format!("ovs-ofctl failed: {}", String::from_utf8_lossy(&out.stderr))));
    }
    Ok(d)
}
