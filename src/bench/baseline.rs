//! The baselines the churn benchmark measures the agent against, in the same run:
//! - the seed's way: one `ovs-ofctl -O OpenFlow13 --bundle add-flows BRIDGE -` process per
//!   transaction, fed the seed's flow text;
//! - the switch's own limit: pre-encoded FLOW_MODs written back to back, then one barrier.
//!
//! This module is the only place the binary runs ovs-ofctl, and only as a benchmark baseline;
//! no agent code path uses it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use openflow::{FlowMod, Message, OfMessage};

use super::BenchError;
use crate::switch::Switch;

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

/// Pre-encodes FLOW_MODs into 256 KiB chunks (xids 1..), outside any measurement.
pub fn encode_raw(fms: &[FlowMod]) -> Result<Vec<Bytes>, BenchError> {
    let mut out = Vec::new();
    let mut buf = BytesMut::with_capacity(256 * 1024);
    for (i, fm) in fms.iter().enumerate() {
        OfMessage::new(i as u32 + 1, Message::FlowMod(fm.clone()))
            .encode(&mut buf)
            .map_err(|e| BenchError::Baseline(e.to_string()))?;
        if buf.len() >= 256 * 1024 {
            out.push(buf.split().freeze());
        }
    }
    out.push(buf.freeze());
    Ok(out)
}

/// Pre-encodes FLOW_MODs given as bodies into 256 KiB chunks (xids 1..).
pub fn encode_raw_bodies(bodies: impl Iterator<Item = Bytes>) -> Result<Vec<Bytes>, BenchError> {
    let mut out = Vec::new();
    let mut buf = BytesMut::with_capacity(256 * 1024);
    for (i, body) in bodies.enumerate() {
        openflow::msg::encode_raw(&mut buf, openflow::msg::OFPT_FLOW_MOD, i as u32 + 1, &body)
            .map_err(|e| BenchError::Baseline(e.to_string()))?;
        if buf.len() >= 256 * 1024 {
            out.push(buf.split().freeze());
        }
    }
    out.push(buf.freeze());
    Ok(out)
}

/// Writes pre-encoded messages back to back and waits for one barrier.
pub async fn raw(sw: &Switch, chunks: Vec<Bytes>) -> Result<Duration, BenchError> {
    let t = Instant::now();
    sw.send_raw_and_barrier(chunks).await?;
    Ok(t.elapsed())
}
