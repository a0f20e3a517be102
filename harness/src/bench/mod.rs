//! `sdn-bench churn`: the agent's flow programming measured side by side with the seed's
//! way (ovs-ofctl per transaction), with unbundled pre-encoded FLOW_MODs, and with the switch's
//! limit for what the agent does (pre-encoded atomic bundles, serial and pipelined), on a real
//! ovs-vswitchd, in one run, alternating A/B rounds. `sdn-bench pods` (see [`pods`]) does
//! the same for whole pod setups through CNI.

pub mod baseline;
pub mod commit;
pub mod limit;
pub mod pods;
pub mod rawof;
pub mod recovery;
pub use baseline::seed;
pub mod workload;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openflow::{FlowMod, FlowModCommand, Match, OFPTT_ALL};
use serde::Serialize;

use sdn_node::engine::{Engine, EngineError};
use sdn_node::pipeline::Flow;
use crate::sandbox::{OvsSandbox, SandboxOptions};
use sdn_node::store::{diff, DesiredState, InstalledState, Owner};
use sdn_node::switch::{Switch, SwitchError, SwitchOptions};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("switch: {0}")]
    Switch(#[from] SwitchError),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("sandbox: {0}")]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error("OVSDB: {0}")]
    Ovsdb(#[from] sdn_node::ovsdb::OvsdbError),
    #[error("baseline: {0}")]
    Baseline(String),
    #[error("host network: {0}")]
    Hostnet(#[from] hostnet::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[derive(Clone, Debug)]
pub struct ChurnOptions {
    pub base_pods: u32,
    pub ops: u32,
    pub rounds: u32,
    /// Attach to a running switch (its `db.sock` and `br0.mgmt`) instead of starting one.
    pub ovs_rundir: Option<PathBuf>,
    pub egress_rules: u32,
    pub egress_swaps: u32,
    /// Pods of the recovery measured through a real agent (each is an OVSDB port the agent
    /// creates; ovs-vswitchd's per-port cost keeps this below `base_pods`).
    pub recovery_pods: u32,
}

impl Default for ChurnOptions {
    fn default() -> Self {
        ChurnOptions { base_pods: 10_000, ops: 300, rounds: 2, ovs_rundir: None, egress_rules: 1000, egress_swaps: 20, recovery_pods: 1000 }
    }
}

/// The agent executable the benchmarks start as `sdn-node run`: `SDN_NODE_BIN` if set (a test
/// harness names the one cargo built), else `sdn-node` next to this executable (cargo puts every
/// binary of the workspace in one directory). Checked up front, so that a missing agent fails a
/// benchmark before it has measured anything: the agent is a binary of another package, built
/// with `cargo build -p sdn-node` (or `--workspace`), not by building this one.
pub fn sdn_node_exe() -> Result<PathBuf, BenchError> {
    let exe = match std::env::var_os("SDN_NODE_BIN") {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()?.with_file_name("sdn-node"),
    };
    if !exe.exists() {
        return Err(BenchError::Baseline(format!(
            "{} not found: the agent (sdn-node) is built with its own package (cargo build --release -p sdn-node -p sdn-harness) or named by SDN_NODE_BIN",
            exe.display()
        )));
    }
    Ok(exe)
}

/// The benchmark executable (`sdn-bench`), run again as `sdn-bench rss` to measure the agent's
/// memory in a process of its own: `SDN_BENCH_BIN` if set (a test harness, whose own executable
/// is not sdn-bench, names it), else this executable.
fn sdn_bench_exe() -> Result<PathBuf, BenchError> {
    Ok(match std::env::var_os("SDN_BENCH_BIN") {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()?,
    })
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Serial {
    pub agent_tps: f64,
    pub ofctl_tps: f64,
    pub ratio: f64,
    pub agent_p50_us: f64,
    pub agent_p99_us: f64,
    pub agent_max_us: f64,
    pub ofctl_p50_us: f64,
    pub ofctl_p99_us: f64,
    pub ofctl_max_us: f64,
    /// The switch's limit: each transaction one pre-encoded atomic bundle and a barrier, on a
    /// raw connection, waited for before the next.
    pub limit_tps: f64,
    pub limit_p50_us: f64,
    pub limit_p99_us: f64,
    /// agent_tps / limit_tps.
    pub ratio_vs_limit: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Pipelined {
    pub agent_tps: f64,
    pub agent_flow_mods_per_s: f64,
    /// Pre-encoded FLOW_MODs without bundles, back to back, one barrier.
    pub unbundled_flow_mods_per_s: f64,
    pub ratio_vs_unbundled: f64,
    /// The switch's limit: one pre-encoded atomic bundle per transaction, all back to back,
    /// one barrier.
    pub limit_tps: f64,
    pub limit_flow_mods_per_s: f64,
    pub ratio_vs_limit: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Resync {
    pub flows: usize,
    pub agent_s: f64,
    pub ofctl_bundle_s: f64,
    /// Pre-encoded FLOW_MODs without a bundle, back to back, one barrier.
    pub unbundled_s: f64,
    pub ratio_vs_unbundled: f64,
    /// The switch's limit: the whole table as one pre-encoded atomic bundle.
    pub limit_s: f64,
    pub ratio_vs_limit: f64,
    pub ratio_vs_ofctl: f64,
}

/// OFPT_ERRORs the raw baselines received (each counted by xid; any makes their figures
/// suspect and is reported, not hidden).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Rejections {
    pub unbundled: usize,
    pub limit: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Teardown {
    pub p50_us_at_100: f64,
    pub p50_us_at_base: f64,
    pub growth: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct EgressSwap {
    pub rules: u32,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Recovery {
    pub flows: usize,
    /// From the restarted ovs-vswitchd accepting OpenFlow connections to a dump equal to the
    /// desired state, driving the flow engine directly (reconnect, dump, full replay bundle,
    /// verifying dump).
    pub restart_to_equal_s: f64,
    /// The same through a real `sdn-node run` (supervisor, OVSDB, reconciler; production
    /// defaults), with its own pods and ports (module `recovery`).
    pub agent: recovery::AgentRecovery,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Memory {
    pub peak_rss_mib: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ChurnReport {
    pub base_pods: u32,
    pub ops: u32,
    pub rounds: u32,
    pub serial: Serial,
    pub pipelined: Pipelined,
    pub resync: Resync,
    pub teardown: Teardown,
    pub egress_swap: EgressSwap,
    pub recovery: Recovery,
    pub memory: Memory,
    pub rejections: Rejections,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The q-quantile (0..=1) of `v` (sorted in place).
fn quantile(v: &mut [Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

fn median(mut v: Vec<Duration>) -> Duration {
    quantile(&mut v, 0.5)
}

/// The process's peak resident set (VmHWM), in MiB.
pub fn peak_rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

struct Bench {
    sandbox: Option<OvsSandbox>,
    dir: PathBuf,
    env: Vec<(String, String)>,
    sw: Switch,
    engine: Engine,
    /// The raw connection of the baselines (unbundled and limit).
    raw: rawof::RawConn,
}

impl Bench {
    /// A new raw connection for the next baseline measurement (outside the clock): the
    /// harness reads the raw connection only while it waits for a barrier, so over a long
    /// phase ovs-vswitchd's echo requests go unanswered and it drops the connection.
    async fn fresh_raw(&mut self) -> Result<(), BenchError> {
        self.raw = rawof::RawConn::connect(&self.dir.join("br0.mgmt")).await?;
        Ok(())
    }

    async fn clear(&self) -> Result<(), BenchError> {
        let del = FlowMod::new(FlowModCommand::Delete, OFPTT_ALL, 0x8000, Match::any());
        self.sw.send_flow_mods(&[del]).await?;
        Ok(())
    }

    async fn set_pods(&self, m: u32) -> Result<(), BenchError> {
        self.engine.resync(Some(workload::desired(m))).await?;
        Ok(())
    }

    /// Replays `desired` (already built, as the agent has it in memory after a switch restart).
    async fn replay(&self, desired: DesiredState) -> Result<Duration, BenchError> {
        let t = Instant::now();
        self.engine.resync(Some(desired)).await?;
        Ok(t.elapsed())
    }
}

/// Restarts the private ovs-vswitchd (M pods installed) and measures the time from the new
/// switch accepting connections to a dump equal to the desired state.
async fn recovery(b: &mut Bench, progress: &impl Fn(&str)) -> Result<Option<Recovery>, BenchError> {
    let Some(sb) = b.sandbox.as_mut() else { return Ok(None) };
    progress("recovery: restarting ovs-vswitchd with the table installed");
    sb.stop_vswitchd()?;
    sb.start_vswitchd().await?;
    let target = format!("unix:{}", sb.mgmt_socket("br0").display());
    let t = Instant::now();
    let sw = loop {
        match Switch::connect(&target, SwitchOptions::default()).await {
            Ok(sw) => break sw,
            Err(e) if t.elapsed() < Duration::from_secs(30) => {
                tracing::debug!(error = %e, "switch not accepting yet");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    b.engine.set_switch(sw.clone()).await?;
    b.engine.resync(None).await?;
    let (desired, _, _) = b.engine.snapshot().await?;
    verify(&sw, &desired, b.engine.status().await?.generation).await?;
    let restart_to_equal_s = t.elapsed().as_secs_f64();
    b.sw = sw;
    Ok(Some(Recovery { flows: desired.len(), restart_to_equal_s, ..Default::default() }))
}

/// A switch to measure on: the running one whose run directory is `ovs_rundir`, or a private
/// one (dummy datapath); the agent's engine and a raw connection to it.
async fn setup(ovs_rundir: &Option<PathBuf>) -> Result<Bench, BenchError> {
    let (sandbox, dir) = match ovs_rundir {
        Some(d) => (None, d.clone()),
        None => {
            let sb = OvsSandbox::start(SandboxOptions::default()).await?;
            sb.add_bridge("br0", "dummy").await?;
            let d = sb.dir().to_path_buf();
            (Some(sb), d)
        }
    };
    let env = match &sandbox {
        Some(sb) => sb.ovs_env(),
        None => ["OVS_RUNDIR", "OVS_LOGDIR", "OVS_DBDIR", "OVS_SYSCONFDIR"]
            .iter()
            .map(|k| (k.to_string(), dir.display().to_string()))
            .collect(),
    };
    let sw = Switch::connect(&format!("unix:{}", dir.join("br0.mgmt").display()), SwitchOptions::default()).await?;
    let engine = Engine::start(sw.clone(), 1);
    let raw = rawof::RawConn::connect(&dir.join("br0.mgmt")).await?;
    Ok(Bench { sandbox, dir, env, sw, engine, raw })
}

/// Runs every measurement; `progress` receives a line per phase.
pub async fn churn(opts: &ChurnOptions, progress: impl Fn(&str)) -> Result<ChurnReport, BenchError> {
    // The recovery through a real agent runs on a private switch only.
    let agent_exe = if opts.ovs_rundir.is_none() { Some(sdn_node_exe()?) } else { None };
    let mut b = setup(&opts.ovs_rundir).await?;
    let m = opts.base_pods;
    let k = opts.ops;
    let rounds = opts.rounds.max(1);
    let mut r = ChurnReport { base_pods: m, ops: k, rounds, ..Default::default() };

    // 3. Bulk resync into an empty bridge.
    progress(&format!("resync: {m} pods into an empty bridge, {rounds} rounds"));
    let plan = diff(&workload::desired(m), &InstalledState::default(), 1);
    r.resync.flows = plan.len();
    let file = tempfile::NamedTempFile::new()?;
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(file.as_file());
        for c in &plan.changes {
            let fm = c.to_flow_mod().map_err(|e| BenchError::Baseline(e.to_string()))?;
            writeln!(w, "{fm}")?;
        }
        w.flush()?;
    }
    let bodies = plan.bodies();
    drop(plan);
    let mut unb = rawof::Encoder::new(1);
    for body in &bodies {
        unb.flow_mod(body)?;
    }
    let unb_barrier = unb.barrier();
    let unb_chunks = unb.finish();
    let mut lim = rawof::Encoder::new(1);
    lim.bundle(bodies.iter())?;
    let lim_barrier = lim.barrier();
    let lim_chunks = lim.finish();
    drop(bodies);
    let (mut ta, mut to, mut tu, mut tl) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        b.clear().await?;
        let desired = workload::desired(m);
        ta.push(b.replay(desired).await?);
        b.clear().await?;
        to.push(baseline::ofctl_bundle_file(&b.env, "br0", file.path())?);
        b.clear().await?;
        b.fresh_raw().await?;
        tu.push(b.raw.send_and_wait(&unb_chunks, unb_barrier).await?);
        r.rejections.unbundled += std::mem::take(&mut b.raw.rejected).len();
        b.clear().await?;
        b.fresh_raw().await?;
        tl.push(b.raw.send_and_wait(&lim_chunks, lim_barrier).await?);
        r.rejections.limit += std::mem::take(&mut b.raw.rejected).len();
    }
    let (a, o, u, l) = (median(ta), median(to), median(tu), median(tl));
    r.resync.agent_s = a.as_secs_f64();
    r.resync.ofctl_bundle_s = o.as_secs_f64();
    r.resync.unbundled_s = u.as_secs_f64();
    r.resync.ratio_vs_unbundled = u.as_secs_f64() / a.as_secs_f64();
    r.resync.limit_s = l.as_secs_f64();
    r.resync.ratio_vs_limit = l.as_secs_f64() / a.as_secs_f64();
    r.resync.ratio_vs_ofctl = o.as_secs_f64() / a.as_secs_f64();
    drop((unb_chunks, lim_chunks));
    b.set_pods(m).await?;

    // 1. Serial pod churn at M, alternating agent and ovs-ofctl rounds.
    progress(&format!("serial churn: {k} setups + {k} teardowns per round, {rounds} rounds each"));
    let (mut lat_a, mut lat_o, mut lat_l) = (Vec::new(), Vec::new(), Vec::new());
    let (mut time_a, mut time_o, mut time_l) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    // The limit's transactions, each one pre-encoded bundle + barrier (encoded before timing;
    // xids continue across rounds so every error is attributable).
    let mut enc = rawof::Encoder::new(1_000_000);
    let mut limit_txs: Vec<(Vec<bytes::Bytes>, u32)> = Vec::new();
    for tx in setup_bodies(m, k)?.iter().chain(teardown_bodies(m, k)?.iter()) {
        enc.bundle(tx.iter())?;
        let x = enc.barrier();
        limit_txs.push((enc.take(), x));
    }
    let mut teardown_at_base = Vec::new();
    let pods: Vec<_> = (0..k).map(|j| workload::pod(m + j)).collect();
    for _ in 0..rounds {
        let t0 = Instant::now();
        for (o, p) in &pods {
            let t = Instant::now();
            b.engine.update(vec![(o.clone(), sdn_node::pipeline::pod::flows(p))]).await?;
            lat_a.push(t.elapsed());
        }
        for (o, _) in &pods {
            let o = o.clone();
            let t = Instant::now();
            b.engine.update(vec![(o, vec![])]).await?;
            let d = t.elapsed();
            lat_a.push(d);
            teardown_at_base.push(d);
        }
        time_a += t0.elapsed();
        let t0 = Instant::now();
        for j in 0..k {
            lat_o.push(baseline::ofctl_transaction(&b.env, "br0", &workload::seed_setup_text(m + j))?);
        }
        for j in 0..k {
            lat_o.push(baseline::ofctl_transaction(&b.env, "br0", &workload::seed_teardown_text(m + j))?);
        }
        time_o += t0.elapsed();
        b.fresh_raw().await?;
        let t0 = Instant::now();
        for (chunks, barrier) in &limit_txs {
            lat_l.push(b.raw.send_and_wait(chunks, *barrier).await?);
        }
        time_l += t0.elapsed();
        r.rejections.limit += std::mem::take(&mut b.raw.rejected).len();
    }
    let n = (2 * k * rounds) as f64;
    r.serial.agent_tps = n / time_a.as_secs_f64();
    r.serial.ofctl_tps = n / time_o.as_secs_f64();
    r.serial.ratio = r.serial.agent_tps / r.serial.ofctl_tps;
    r.serial.agent_p50_us = us(quantile(&mut lat_a, 0.5));
    r.serial.agent_p99_us = us(quantile(&mut lat_a, 0.99));
    r.serial.agent_max_us = us(quantile(&mut lat_a, 1.0));
    r.serial.ofctl_p50_us = us(quantile(&mut lat_o, 0.5));
    r.serial.ofctl_p99_us = us(quantile(&mut lat_o, 0.99));
    r.serial.ofctl_max_us = us(quantile(&mut lat_o, 1.0));
    r.serial.limit_tps = n / time_l.as_secs_f64();
    r.serial.limit_p50_us = us(quantile(&mut lat_l, 0.5));
    r.serial.limit_p99_us = us(quantile(&mut lat_l, 0.99));
    r.serial.ratio_vs_limit = r.serial.agent_tps / r.serial.limit_tps;
    r.teardown.p50_us_at_base = us(quantile(&mut teardown_at_base, 0.5));

    // 2. Pipelined churn: the same transactions submitted concurrently.
    progress(&format!("pipelined churn: {k} concurrent setups, then {k} concurrent teardowns, {rounds} rounds"));
    let (setups, teardowns) = (setup_bodies(m, k)?, teardown_bodies(m, k)?);
    let txs: Vec<&Vec<bytes::Bytes>> = setups.iter().chain(teardowns.iter()).collect();
    let fms: usize = txs.iter().map(|t| t.len()).sum();
    let (mut unb, mut lim) = (rawof::Encoder::new(2_000_000), rawof::Encoder::new(3_000_000));
    for tx in &txs {
        for body in tx.iter() {
            unb.flow_mod(body)?;
        }
        lim.bundle(tx.iter())?;
    }
    let (unb_barrier, lim_barrier) = (unb.barrier(), lim.barrier());
    let (unb_chunks, lim_chunks) = (unb.finish(), lim.finish());
    let (mut pa, mut pu, mut pl) = (Vec::new(), Vec::new(), Vec::new());
    // The pods arrive as objects; turning them into flows is the agent's work and is timed.
    let pods: Vec<_> = (0..k).map(|j| workload::pod(m + j)).collect();
    for _ in 0..rounds {
        let t = Instant::now();
        concurrently(&b.engine, pods.iter().map(|(o, p)| (o.clone(), sdn_node::pipeline::pod::flows(p))).collect()).await?;
        concurrently(&b.engine, pods.iter().map(|(o, _)| (o.clone(), vec![])).collect()).await?;
        pa.push(t.elapsed());
        b.fresh_raw().await?;
        pu.push(b.raw.send_and_wait(&unb_chunks, unb_barrier).await?);
        r.rejections.unbundled += std::mem::take(&mut b.raw.rejected).len();
        b.fresh_raw().await?;
        pl.push(b.raw.send_and_wait(&lim_chunks, lim_barrier).await?);
        r.rejections.limit += std::mem::take(&mut b.raw.rejected).len();
    }
    let (a, u, l) = (median(pa), median(pu), median(pl));
    let fms = fms as f64;
    r.pipelined.agent_tps = (2 * k) as f64 / a.as_secs_f64();
    r.pipelined.agent_flow_mods_per_s = fms / a.as_secs_f64();
    r.pipelined.unbundled_flow_mods_per_s = fms / u.as_secs_f64();
    r.pipelined.ratio_vs_unbundled = r.pipelined.agent_flow_mods_per_s / r.pipelined.unbundled_flow_mods_per_s;
    r.pipelined.limit_tps = (2 * k) as f64 / l.as_secs_f64();
    r.pipelined.limit_flow_mods_per_s = fms / l.as_secs_f64();
    r.pipelined.ratio_vs_limit = r.pipelined.agent_flow_mods_per_s / r.pipelined.limit_flow_mods_per_s;
    drop((unb_chunks, lim_chunks));

    // 4. Egress swap: replace a 1000-rule policy with another, atomically.
    progress(&format!("egress swap: {} rules, {} swaps", opts.egress_rules, opts.egress_swaps));
    r.egress_swap.rules = opts.egress_rules;
    let variants = [workload::egress_flows(opts.egress_rules, 20), workload::egress_flows(opts.egress_rules, 21)];
    b.engine.update(vec![variants[0].clone()]).await?;
    let mut sw_lat = Vec::new();
    for s in 0..opts.egress_swaps {
        let v = variants[(s as usize + 1) % 2].clone();
        let t = Instant::now();
        b.engine.update(vec![v]).await?;
        sw_lat.push(t.elapsed());
    }
    r.egress_swap.p50_us = us(quantile(&mut sw_lat, 0.5));
    r.egress_swap.p99_us = us(quantile(&mut sw_lat, 0.99));
    b.engine.update(vec![(variants[0].0.clone(), vec![])]).await?;

    // Recovery after a switch restart, with M pods installed (own switch only).
    if let Some(rec) = recovery(&mut b, &progress).await? {
        r.recovery = rec;
        if let Some(exe) = &agent_exe {
            r.recovery.agent = recovery::agent_recovery(exe, opts.recovery_pods, &progress).await?;
        }
    }

    // 5. Memory: measured in a separate agent process (this one also holds the baselines'
    // data), replaying M pods into an empty bridge and churning, at the end.

    // Teardown latency at 100 pods, for the growth ratio.
    progress("teardown at 100 base pods");
    b.set_pods(100).await?;
    let mut t100 = Vec::new();
    for _ in 0..rounds {
        for j in 0..k {
            b.engine.update(vec![workload::pod_flows(m + j)]).await?;
        }
        for j in 0..k {
            let t = Instant::now();
            b.engine.update(vec![(workload::pod(m + j).0, vec![])]).await?;
            t100.push(t.elapsed());
        }
    }
    r.teardown.p50_us_at_100 = us(quantile(&mut t100, 0.5));
    r.teardown.growth = r.teardown.p50_us_at_base / r.teardown.p50_us_at_100;

    // The switch must hold exactly the desired state at the end.
    let (desired, _, _) = b.engine.snapshot().await?;
    verify(&b.sw, &desired, b.engine.status().await?.generation).await?;

    progress(&format!("memory: a separate agent process replays {m} pods and churns {k}"));
    r.memory.peak_rss_mib = rss_in_child(&b.dir, m, k)?;
    Ok(r)
}

/// Runs `sdn-bench rss` against the same switch and reads its peak RSS.
fn rss_in_child(dir: &std::path::Path, m: u32, k: u32) -> Result<f64, BenchError> {
    let exe = sdn_bench_exe()?;
    let out = std::process::Command::new(exe)
        .args(["rss", "--base-pods", &m.to_string(), "--ops", &k.to_string(), "--ovs-rundir"])
        .arg(dir)
        .output()?;
    if !out.status.success() {
        return Err(BenchError::Baseline(format!("rss child failed: {}", String::from_utf8_lossy(&out.stderr))));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse::<f64>()
        .map_err(|_| BenchError::Baseline(format!("rss child printed {text:?}")))
}

/// The agent alone: connect, replay `m` pods into an emptied bridge as one bundle, set up and
/// tear down `k` pods one by one; returns the peak RSS (MiB) of this process.
pub async fn rss(dir: &std::path::Path, m: u32, k: u32) -> Result<f64, BenchError> {
    let sw = Switch::connect(&format!("unix:{}", dir.join("br0.mgmt").display()), SwitchOptions::default()).await?;
    let del = FlowMod::new(FlowModCommand::Delete, OFPTT_ALL, 0x8000, Match::any());
    sw.send_flow_mods(&[del]).await?;
    let engine = Engine::start(sw.clone(), 1);
    engine.resync(Some(workload::desired(m))).await?;
    for j in 0..k {
        let (o, p) = workload::pod(m + j);
        engine.update(vec![(o, sdn_node::pipeline::pod::flows(&p))]).await?;
    }
    for j in 0..k {
        engine.update(vec![(workload::pod(m + j).0, vec![])]).await?;
    }
    engine.resync(None).await?;
    Ok(peak_rss_mib())
}

/// Pods `m..m+k`'s setup transactions, each as its FLOW_MOD bodies (cookie of generation 1).
fn setup_bodies(m: u32, k: u32) -> Result<Vec<Vec<bytes::Bytes>>, BenchError> {
    (0..k)
        .map(|j| {
            let (o, f) = workload::pod_flows(m + j);
            let c = o.cookie(1);
            f.into_iter().map(|fl| sdn_node::switch::flow_mod_body(&fl.add(c)).map_err(BenchError::from)).collect()
        })
        .collect()
}

/// The matching teardowns: a strict delete per flow, by cookie.
fn teardown_bodies(m: u32, k: u32) -> Result<Vec<Vec<bytes::Bytes>>, BenchError> {
    (0..k)
        .map(|j| {
            let (o, f) = workload::pod_flows(m + j);
            let c = o.cookie(1);
            f.into_iter()
                .map(|fl| {
                    let fm = FlowMod::delete_strict(fl.table.id(), fl.priority, fl.match_).with_cookie(c, u64::MAX);
                    sdn_node::switch::flow_mod_body(&fm).map_err(BenchError::from)
                })
                .collect()
        })
        .collect()
}

/// Submits every update at once and waits for all.
async fn concurrently(engine: &Engine, updates: Vec<(Owner, Vec<Flow>)>) -> Result<(), BenchError> {
    let futs = updates.into_iter().map(|u| {
        let e = engine.clone();
        tokio::spawn(async move { e.update(vec![u]).await })
    });
    for r in futures::future::join_all(futs).await {
        r.map_err(|e| BenchError::Baseline(format!("task failed: {e}")))??;
    }
    Ok(())
}

async fn verify(sw: &Switch, desired: &DesiredState, generation: u32) -> Result<(), BenchError> {
    let installed = InstalledState::from_dump(sw.dump_flows(Default::default()).await?);
    let left = diff(desired, &installed, generation);
    if !left.is_empty() {
        return Err(BenchError::Baseline(format!("switch differs from the desired state at the end: {left}")));
    }
    Ok(())
}

impl ChurnReport {
    /// A human-readable table.
    pub fn table(&self) -> String {
        let s = &self.serial;
        let p = &self.pipelined;
        let r = &self.resync;
        format!(
            "base pods {m}, {k} ops x {rounds} rounds\n\
             serial churn      agent {:>9.0} tx/s (p50 {:.0} us, p99 {:.0} us, max {:.0} us)\n\
             \x20                 ovs-ofctl {:>5.0} tx/s (p50 {:.0} us, p99 {:.0} us)   ratio {:.1}x\n\
             \x20                 limit {:>9.0} tx/s (p50 {:.0} us, p99 {:.0} us)   ratio vs limit {:.2}\n\
             pipelined churn   agent {:>9.0} flow_mods/s ({:.0} tx/s), unbundled {:.0} flow_mods/s (vs {:.2}),\n\
             \x20                 limit (bundles) {:.0} flow_mods/s ({:.0} tx/s)   ratio vs limit {:.2}\n\
             bulk resync       {} flows: agent {:.3} s, ovs-ofctl --bundle {:.3} s, unbundled {:.3} s, limit (one bundle) {:.3} s\n\
             \x20                 vs unbundled {:.2}, vs limit {:.2}, vs ofctl {:.2}x\n\
             rejections        unbundled {}, limit {}\n\
             teardown p50      {:.0} us at 100 pods, {:.0} us at {m}   growth {:.2}\n\
             egress swap       {} rules: p50 {:.0} us, p99 {:.0} us\n\
             switch restart    {} flows: {:.3} s from accepting connections to an equal dump (flow engine)\n\
             \x20                 through sdn-node run, {} pods ({} flows): {:.3} s\n\
             peak RSS          {:.1} MiB\n",
            s.agent_tps, s.agent_p50_us, s.agent_p99_us, s.agent_max_us,
            s.ofctl_tps, s.ofctl_p50_us, s.ofctl_p99_us, s.ratio,
            s.limit_tps, s.limit_p50_us, s.limit_p99_us, s.ratio_vs_limit,
            p.agent_flow_mods_per_s, p.agent_tps, p.unbundled_flow_mods_per_s, p.ratio_vs_unbundled,
            p.limit_flow_mods_per_s, p.limit_tps, p.ratio_vs_limit,
            r.flows, r.agent_s, r.ofctl_bundle_s, r.unbundled_s, r.limit_s,
            r.ratio_vs_unbundled, r.ratio_vs_limit, r.ratio_vs_ofctl,
            self.rejections.unbundled, self.rejections.limit,
            self.teardown.p50_us_at_100, self.teardown.p50_us_at_base, self.teardown.growth,
            self.egress_swap.rules, self.egress_swap.p50_us, self.egress_swap.p99_us,
            self.recovery.flows, self.recovery.restart_to_equal_s,
            self.recovery.agent.pods, self.recovery.agent.flows, self.recovery.agent.restart_to_equal_s,
            self.memory.peak_rss_mib,
            m = self.base_pods, k = self.ops, rounds = self.rounds,
        )
    }
}
