//! The baselines the churn benchmark measures the agent against, in the same run:
//! - the seed's way: one `ovs-ofctl -O OpenFlow13 --bundle add-flows BRIDGE -` process per
//!   transaction, fed the seed's flow text;
//! - `ovs-ofctl --bundle add-flows BRIDGE FILE` for a whole table.
//!
//! The raw baselines (unbundled FLOW_MODs, the switch's limit) are in [`super::rawof`].
//! This module (with its [`seed`] part for `bench pods`) is the only place the binary runs ovs-ofctl/ovs-vsctl,
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

/// The seed's way of attaching a pod, for `sdn-bench pods` (openshift-sdn's pod manager):
/// `ovs-vsctl add-port BRIDGE VETH -- get Interface VETH ofport`, then
/// `ovs-ofctl -O OpenFlow13 --bundle add-flows BRIDGE -` fed setupPodFlows' text; on teardown
/// the cleanup text (four loose deletes) and `ovs-vsctl del-port`.
///
/// With the rest of `baseline.rs`, the only place the binary runs ovs-vsctl/ovs-ofctl, and only as a
/// benchmark baseline; no agent code path uses it.
pub mod seed {
    use std::process::Command;

    use super::super::BenchError;

    fn vsctl(env: &[(String, String)], args: &[&str]) -> Result<String, BenchError> {
        let out = Command::new("ovs-vsctl")
            .args(args)
            .envs(env.iter().cloned())
            .output()
            .map_err(|e| BenchError::Baseline(format!("cannot run ovs-vsctl: {e}")))?;
        if !out.status.success() {
            return Err(BenchError::Baseline(format!("ovs-vsctl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr))));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `ovs-vsctl add-port BRIDGE VETH -- get Interface VETH ofport` (ovs-vsctl waits for
    /// ovs-vswitchd to apply the change, as the seed ran it); returns the ofport.
    pub fn add_port(env: &[(String, String)], bridge: &str, veth: &str) -> Result<u32, BenchError> {
        let out = vsctl(env, &["add-port", bridge, veth, "--", "get", "Interface", veth, "ofport"])?;
        match out.trim().parse::<i64>() {
            Ok(p) if p > 0 => Ok(p as u32),
            // The seed read the ofport with a separate `get` when the first one was not yet set.
            _ => {
                let again = vsctl(env, &["get", "Interface", veth, "ofport"])?;
                again
                    .trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|p| *p > 0)
                    .map(|p| p as u32)
                    .ok_or_else(|| BenchError::Baseline(format!("{veth}: no ofport ({:?}, then {:?})", out.trim(), again.trim())))
            }
        }
    }

    /// `ovs-vsctl del-port BRIDGE VETH`.
    pub fn del_port(env: &[(String, String)], bridge: &str, veth: &str) -> Result<(), BenchError> {
        vsctl(env, &["del-port", bridge, veth]).map(|_| ())
    }

    /// `ovs-ofctl -O OpenFlow13 --bundle add-flows BRIDGE -` with `text` (add and delete lines).
    pub fn flows(env: &[(String, String)], bridge: &str, text: &str) -> Result<(), BenchError> {
        super::ofctl_transaction(env, bridge, text).map(|_| ())
    }
}
