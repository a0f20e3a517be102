//! Recovery after an ovs-vswitchd restart through the production path: a real `sdn-node run`
//! (its switch supervisor, OVSDB client and reconciler, nothing bypassed) with P pods whose
//! ports it created itself, on a private switch. The figure is the time from the restarted
//! ovs-vswitchd accepting OpenFlow connections to a flow table equal (every flow, cookie,
//! match and action) to the one the agent had installed before the restart.
//!
//! `bench churn`'s other recovery figure (`recovery.restart_to_equal_s`) drives the flow
//! engine directly (reconnect, dump, replay); this one adds what production adds: the
//! supervisor's reconnect backoff, the OVSDB side (ports re-verified, ofports re-read) and the
//! reconciler's pass.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{workload, BenchError};
use crate::sandbox::{OvsSandbox, SandboxOptions};
use sdn_node::switch::{Switch, SwitchOptions};

/// How long the agent may take to set up its pods, and the switch to recover.
const BOUND: Duration = Duration::from_secs(600);

#[derive(Clone, Debug, Default, Serialize)]
pub struct AgentRecovery {
    /// Pods the agent had set up (each with its own OVSDB port).
    pub pods: u32,
    pub flows: usize,
    /// From the restarted ovs-vswitchd accepting connections to a table equal to the one
    /// before the restart.
    pub restart_to_equal_s: f64,
}

/// The state file: the benchmark's synthetic node (multitenant, /18), `pods` pods with
/// internal ports (the dummy datapath has no veths).
fn state(pods: u32) -> String {
    let cfg = workload::node4();
    let mut s = format!(
        "node: bench-node\nplugin: multitenant\nclusterNetwork: {}\nserviceNetwork: {}\nhostSubnets:\n  - {{host: bench-node, hostIP: 172.17.0.2, subnet: {}}}\nnetNamespaces:\n",
        cfg.cluster_network, cfg.service_network, cfg.local_subnet
    );
    for v in 0..workload::VNIDS {
        s.push_str(&format!("  - {{name: ns-{v}, netid: {}}}\n", 100 + v));
    }
    s.push_str(if pods == 0 { "pods: []\n" } else { "pods:\n" });
    for i in 0..pods {
        let (owner, p) = workload::pod(i);
        let sdn_node::store::Owner::Pod { namespace, name } = owner else { continue };
        s.push_str(&format!(
            "  - {{namespace: {namespace}, name: {name}, containerID: \"{}\", hostVeth: rp{i}, internal: true, ip: {}, mac: \"{}\"}}\n",
            p.container_id, p.ip.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED), p.mac
        ));
    }
    s
}

/// Every flow without its counters and cookie, as a comparable set. (A full replay after the
/// restart installs the same flows under a new generation, which is in the cookie.)
async fn table(sw: &Switch) -> Result<BTreeSet<String>, BenchError> {
    let flows = sw.dump_flows(Default::default()).await?;
    Ok(flows.iter().map(|f| format!("{} {} {:?} {:?}", f.table_id, f.priority, f.match_, f.instructions)).collect())
}

async fn connect(mgmt: &Path, deadline: Instant) -> Result<Switch, BenchError> {
    let target = format!("unix:{}", mgmt.display());
    loop {
        match Switch::connect(&target, SwitchOptions::default()).await {
            Ok(sw) => return Ok(sw),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "switch not accepting yet");
                // Sampling resolution of "accepting", not a wait for a condition.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Polls the switch until its table is `want` (or, when `want` is not known yet, settled:
/// at least `min_flows` flows, unchanged for 1 s); returns the table and when it was first seen.
async fn wait_table(
    mgmt: &Path,
    want: Option<&BTreeSet<String>>,
    min_flows: usize,
    deadline: Instant,
) -> Result<(BTreeSet<String>, Instant), BenchError> {
    let mut sw = connect(mgmt, deadline).await?;
    let mut last: Option<(BTreeSet<String>, Instant)> = None;
    loop {
        let t = match table(&sw).await {
            Ok(t) => t,
            Err(_) if Instant::now() < deadline => {
                sw = connect(mgmt, deadline).await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let at = Instant::now();
        match want {
            Some(w) if t == *w => return Ok((t, at)),
            None if t.len() >= min_flows => match &last {
                Some((l, since)) if *l == t && at.duration_since(*since) >= Duration::from_secs(1) => return Ok((t, *since)),
                Some((l, _)) if *l == t => {}
                _ => last = Some((t, at)),
            },
            _ => last = None,
        }
        if Instant::now() >= deadline {
            let got = last.map(|(t, _)| t.len()).unwrap_or_default();
            return Err(BenchError::Baseline(format!(
                "the switch did not reach the agent's table within {BOUND:?} (last seen: {got} flows, want {:?})",
                want.map(|w| w.len())
            )));
        }
        // Sampling resolution.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts `sdn-node run` with `pods` pods on a private switch, waits for its table, restarts
/// ovs-vswitchd and measures the time to the same table.
pub async fn agent_recovery(exe: &Path, pods: u32, progress: &impl Fn(&str)) -> Result<AgentRecovery, BenchError> {
    let mut sb = OvsSandbox::start(SandboxOptions::default()).await?;
    let dir: PathBuf = sb.dir().to_path_buf();
    let state_path = dir.join("recovery-state.yaml");
    std::fs::write(&state_path, state(pods))?;
    progress(&format!("recovery through the agent: sdn-node run with {pods} pods"));
    let mut agent = tokio::process::Command::new(exe)
        .args(["run", "--state"])
        .arg(&state_path)
        .arg("--ovs-rundir")
        .arg(&dir)
        // Production's defaults otherwise (reconnect backoff, echo interval, timeouts).
        .args(["--datapath-type", "dummy", "--metrics-addr", "none", "--no-host-network"])
        .arg("--state-dir")
        .arg(dir.join("sdn-node-state"))
        .arg("--pod-api-socket")
        .arg(dir.join("recovery-pods.sock"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mgmt = sb.mgmt_socket("br0");
    // Every pod has at least its four flows.
    let min_flows = 4 * pods as usize;
    let result = async {
        let (before, _) = wait_table(&mgmt, None, min_flows, Instant::now() + BOUND).await?;
        progress(&format!("recovery through the agent: restarting ovs-vswitchd with {} flows", before.len()));
        sb.stop_vswitchd()?;
        sb.start_vswitchd().await?;
        let t0 = Instant::now();
        let (_, at) = wait_table(&mgmt, Some(&before), min_flows, t0 + BOUND).await?;
        Ok(AgentRecovery { pods, flows: before.len(), restart_to_equal_s: at.duration_since(t0).as_secs_f64() })
    }
    .await;
    let _ = agent.kill().await;
    result
}
