//! `sdn-bench commit`: serial flow commits alone, for profiling the agent's cost per
//! commit. The same pod setups and teardowns as `bench churn`'s serial phase (M pods installed,
//! each of K setups and K teardowns awaited before the next), measured side by side with
//! three raw baselines on the same switch, alternating rounds:
//!
//! - **limit** — `bench churn`'s: each transaction one pre-encoded bundle (OPEN, ADDs, COMMIT)
//!   and a barrier, written at once, waited for before the next;
//! - **two-phase** — the sequence the agent must follow with OVS (OPEN and ADDs and a barrier;
//!   only when no ADD was refused, COMMIT), pre-encoded, on a raw connection;
//! - **barrier** — a lone BARRIER round trip (what one extra round trip costs).
//!
//! With `--only-agent` no baseline runs, so that `valgrind --tool=callgrind` counts the agent's
//! instructions only: the difference between a run with K ops and one with 0 ops, divided by
//! the commits, is the agent's instructions per commit.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use super::{quantile, rawof, setup_bodies, teardown_bodies, us, workload, BenchError};

#[derive(Clone, Debug)]
pub struct CommitOptions {
    pub base_pods: u32,
    pub ops: u32,
    pub rounds: u32,
    pub ovs_rundir: Option<PathBuf>,
    /// Measure the agent only (no raw baselines): for instruction counts.
    pub only_agent: bool,
}

/// One variant's serial figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    pub tps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// This process's CPU time (user + system) per transaction.
    pub cpu_us: f64,
    /// The system (kernel) part of it.
    pub sys_us: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CommitReport {
    pub base_pods: u32,
    pub ops: u32,
    pub rounds: u32,
    pub commits: u32,
    pub agent: Figures,
    pub limit: Figures,
    pub two_phase: Figures,
    pub barrier: Figures,
    /// agent tps / limit tps.
    pub agent_vs_limit: f64,
    /// two-phase tps / limit tps.
    pub two_phase_vs_limit: f64,
    pub rejections: usize,
}

fn figures(n: usize, total: Duration, cpu: Cpu, lat: &mut [Duration]) -> Figures {
    if n == 0 || total.is_zero() {
        return Figures::default();
    }
    Figures {
        tps: n as f64 / total.as_secs_f64(),
        p50_us: us(quantile(lat, 0.5)),
        p99_us: us(quantile(lat, 0.99)),
        cpu_us: us(cpu.user + cpu.sys) / n as f64,
        sys_us: us(cpu.sys) / n as f64,
    }
}

/// CPU time used, user and system.
#[derive(Clone, Copy, Debug, Default)]
struct Cpu {
    user: Duration,
    sys: Duration,
}

impl Cpu {
    fn since(self, start: Cpu) -> Cpu {
        Cpu { user: self.user.saturating_sub(start.user), sys: self.sys.saturating_sub(start.sys) }
    }
}

impl std::ops::AddAssign for Cpu {
    fn add_assign(&mut self, o: Cpu) {
        self.user += o.user;
        self.sys += o.sys;
    }
}

/// The CPU time this process has used.
fn cpu_time() -> Cpu {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Cpu::default();
    }
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    Cpu { user: tv(ru.ru_utime), sys: tv(ru.ru_stime) }
}

/// A pre-encoded raw transaction: its parts, each written and then waited for (by its
/// trailing barrier's xid).
type RawTx = Vec<(Vec<Bytes>, u32)>;

async fn run_raw(
    mgmt: &std::path::Path,
    txs: &[RawTx],
    lat: &mut Vec<Duration>,
    cpu: &mut Cpu,
    rejected: &mut usize,
) -> Result<Duration, BenchError> {
    let mut raw = rawof::RawConn::connect(mgmt).await?;
    let c0 = cpu_time();
    let t0 = Instant::now();
    for tx in txs {
        let t = Instant::now();
        for (chunks, barrier) in tx {
            raw.send_and_wait(chunks, *barrier).await?;
        }
        lat.push(t.elapsed());
    }
    let total = t0.elapsed();
    *cpu += cpu_time().since(c0);
    *rejected += raw.rejected.len();
    Ok(total)
}

pub async fn commit(opts: &CommitOptions, progress: impl Fn(&str)) -> Result<CommitReport, BenchError> {
    let (m, k, rounds) = (opts.base_pods, opts.ops, opts.rounds.max(1));
    let b = super::setup(&opts.ovs_rundir).await?;
    let (engine, mgmt) = (&b.engine, b.dir.join("br0.mgmt"));
    progress(&format!("installing {m} pods"));
    b.set_pods(m).await?;

    // The baselines' transactions, encoded before any clock starts.
    let (mut limit, mut two_phase, mut barrier): (Vec<RawTx>, Vec<RawTx>, Vec<RawTx>) = Default::default();
    if !opts.only_agent {
        let bodies: Vec<Vec<Bytes>> = setup_bodies(m, k)?.into_iter().chain(teardown_bodies(m, k)?).collect();
        let (mut one, mut two, mut bar) = (rawof::Encoder::new(1), rawof::Encoder::new(1), rawof::Encoder::new(1));
        for tx in &bodies {
            one.bundle(tx.iter())?;
            let x = one.barrier();
            limit.push(vec![(one.take(), x)]);
            let id = two.bundle_adds(tx.iter())?;
            let x1 = two.barrier();
            let adds = two.take();
            two.bundle_commit(id)?;
            let x2 = two.barrier();
            two_phase.push(vec![(adds, x1), (two.take(), x2)]);
            let x = bar.barrier();
            barrier.push(vec![(bar.take(), x)]);
        }
    }

    let pods: Vec<_> = (0..k).map(|j| workload::pod(m + j)).collect();
    let mut r = CommitReport { base_pods: m, ops: k, rounds, commits: 2 * k * rounds, ..Default::default() };
    let (mut la, mut ll, mut l2, mut lb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut ta, mut tl, mut t2, mut tb) = (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut ca, mut cl, mut c2, mut cb) = (Cpu::default(), Cpu::default(), Cpu::default(), Cpu::default());
    for round in 0..rounds {
        progress(&format!("round {}: agent", round + 1));
        let c0 = cpu_time();
        let t0 = Instant::now();
        for (o, p) in &pods {
            let t = Instant::now();
            engine.update(vec![(o.clone(), sdn_node::pipeline::pod::flows(p))]).await?;
            la.push(t.elapsed());
        }
        for (o, _) in &pods {
            let t = Instant::now();
            engine.update(vec![(o.clone(), vec![])]).await?;
            la.push(t.elapsed());
        }
        ta += t0.elapsed();
        ca += cpu_time().since(c0);
        if opts.only_agent {
            continue;
        }
        progress(&format!("round {}: limit, two-phase, barrier", round + 1));
        tl += run_raw(&mgmt, &limit, &mut ll, &mut cl, &mut r.rejections).await?;
        t2 += run_raw(&mgmt, &two_phase, &mut l2, &mut c2, &mut r.rejections).await?;
        tb += run_raw(&mgmt, &barrier, &mut lb, &mut cb, &mut r.rejections).await?;
    }
    r.agent = figures(la.len(), ta, ca, &mut la);
    r.limit = figures(ll.len(), tl, cl, &mut ll);
    r.two_phase = figures(l2.len(), t2, c2, &mut l2);
    r.barrier = figures(lb.len(), tb, cb, &mut lb);
    if r.limit.tps > 0.0 {
        r.agent_vs_limit = r.agent.tps / r.limit.tps;
        r.two_phase_vs_limit = r.two_phase.tps / r.limit.tps;
    }
    Ok(r)
}

impl CommitReport {
    pub fn table(&self) -> String {
        let line = |name: &str, f: &Figures| format!("{name:<10} {:>9.0} tx/s  p50 {:>6.0} us  p99 {:>6.0} us  cpu {:>5.1} us/tx (sys {:>5.1})\n", f.tps, f.p50_us, f.p99_us, f.cpu_us, f.sys_us);
        format!(
            "base pods {}, {} ops x {} rounds ({} commits)\n{}{}{}{}agent vs limit {:.2}, two-phase vs limit {:.2}, rejections {}\n",
            self.base_pods,
            self.ops,
            self.rounds,
            self.commits,
            line("agent", &self.agent),
            line("limit", &self.limit),
            line("two-phase", &self.two_phase),
            line("barrier", &self.barrier),
            self.agent_vs_limit,
            self.two_phase_vs_limit,
            self.rejections,
        )
    }
}
