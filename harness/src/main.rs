//! The `sdn-bench` command: the benchmarks of the sdn-node agent on a real ovs-vswitchd (what
//! `sdn-node bench` was; the agent binary carries no benchmark code). The subcommands, their
//! arguments and their output are those `sdn-node bench` had. The agent they start as
//! `sdn-node run` (the recovery of `churn`, every pod of `pods`) is `SDN_NODE_BIN`, or the
//! `sdn-node` next to this executable.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sdn_harness::bench;
use sdn_node::process::{self, LogFormat};

#[derive(Parser)]
#[command(name = "sdn-bench", version, about = "Benchmarks of the sdn-node agent on a real ovs-vswitchd, each against baselines measured in the same run")]
struct Cli {
    /// Log format: human or json (structured).
    #[arg(long, global = true, default_value = "human")]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Pod churn, bulk resync and egress swaps, each against a baseline measured in the same
    /// run (ovs-ofctl per transaction; unbundled pre-encoded FLOW_MODs; the switch's limit: pre-encoded bundles).
    Churn {
        /// Pods installed before measuring (M).
        #[arg(long, default_value_t = 10_000)]
        base_pods: u32,
        /// Pod setups (and as many teardowns) per round (K).
        #[arg(long, default_value_t = 300)]
        ops: u32,
        /// Alternating A/B rounds per measurement.
        #[arg(long, default_value_t = 2)]
        rounds: u32,
        /// Attach to a running switch (DIR/db.sock, DIR/br0.mgmt) instead of starting a
        /// private one.
        #[arg(long)]
        ovs_rundir: Option<PathBuf>,
        /// Pods of the recovery measured through a real `sdn-node run` (its own switch; each
        /// pod is an OVSDB port).
        #[arg(long, default_value_t = 1000)]
        recovery_pods: u32,
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
    },
    /// Whole pod setups and teardowns on the production path (a real `sdn-node run` agent,
    /// every ADD/DEL through the `sdn-node-cni` binary, real netns + veth per pod), side by
    /// side with the seed's way (ovs-vsctl + ovs-ofctl per pod) and the switch's limit (one raw
    /// OVSDB transaction, ofport wait, one pre-encoded bundle), alternating. Needs root.
    Pods {
        /// Pods installed on each variant's bridge before measuring (M).
        #[arg(long, default_value_t = 250)]
        base_pods: u32,
        /// Serial ADDs (and as many DELs) per variant (K).
        #[arg(long, default_value_t = 50)]
        ops: u32,
        /// Pods started at once in the burst measurement (C).
        #[arg(long, default_value_t = 30)]
        concurrency: u32,
        /// Use this running switch (agent on br0, baselines on bridges bpseed/bplimit, all in
        /// the current network namespace) instead of three private ones.
        #[arg(long)]
        ovs_rundir: Option<PathBuf>,
        /// The CNI plugin binary (default: sdn-node-cni next to this executable). The agent is
        /// `SDN_NODE_BIN`, or sdn-node next to this executable.
        #[arg(long)]
        cni_bin: Option<PathBuf>,
        /// The agent's `--warm-ports` (pod interfaces kept ready; 0: none).
        #[arg(long, default_value_t = 8)]
        warm_ports: usize,
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
    },
    /// Serial flow commits alone (churn's serial phase), side by side with raw baselines: the
    /// switch's limit (one pre-encoded bundle + barrier per transaction), the two-phase
    /// sequence the agent follows (ADDs + barrier, then COMMIT) pre-encoded, and a lone
    /// barrier. `--only-agent` skips the baselines (for instruction counts under callgrind).
    Commit {
        #[arg(long, default_value_t = 10_000)]
        base_pods: u32,
        #[arg(long, default_value_t = 500)]
        ops: u32,
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        #[arg(long)]
        ovs_rundir: Option<PathBuf>,
        #[arg(long)]
        only_agent: bool,
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
    },
    /// (Used by `churn`.) Measure the agent's peak RSS alone: replay M pods into the emptied
    /// bridge of a running switch, churn K pods, print the peak RSS in MiB.
    #[command(hide = true)]
    Rss {
        #[arg(long)]
        base_pods: u32,
        #[arg(long)]
        ops: u32,
        #[arg(long)]
        ovs_rundir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _log = process::init_logging(cli.log_format);
    let rt = match process::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    rt.block_on(run(cli.cmd))
}

/// A benchmark's report: its table, then with `--json` one JSON object as the last line.
fn print_report<R: serde::Serialize, E: std::fmt::Display>(r: Result<R, E>, table: impl FnOnce(&R) -> String, as_json: bool) -> ExitCode {
    let r = r.map_err(|e| e.to_string()).and_then(|r| {
        let line = if as_json { serde_json::to_string(&r).map_err(|e| e.to_string())? + "\n" } else { String::new() };
        Ok((r, line))
    });
    print_result(r, |(r, line)| table(r) + line)
}

fn print_result<T>(r: Result<T, String>, show: impl FnOnce(&T) -> String) -> ExitCode {
    match r {
        Ok(v) => {
            print!("{}", show(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cmd: Cmd) -> ExitCode {
    match cmd {
        Cmd::Rss { base_pods, ops, ovs_rundir } => match bench::rss(&ovs_rundir, base_pods, ops).await {
            Ok(mib) => {
                println!("{mib:.1}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Pods { base_pods, ops, concurrency, ovs_rundir, cni_bin, warm_ports, json } => {
            let own = match std::env::current_exe() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("error: own executable: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let node_bin = match bench::sdn_node_exe() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let cni_bin = cni_bin.unwrap_or_else(|| own.with_file_name("sdn-node-cni"));
            let opts = bench::pods::PodsOptions { base_pods, ops, concurrency, ovs_rundir, node_bin, cni_bin, install_concurrency: 8, warm_ports };
            print_report(bench::pods::pods(&opts, |p| eprintln!("== {p}")).await, |r| r.table(), json)
        }
        Cmd::Commit { base_pods, ops, rounds, ovs_rundir, only_agent, json } => {
            let opts = bench::commit::CommitOptions { base_pods, ops, rounds, ovs_rundir, only_agent };
            print_report(bench::commit::commit(&opts, |p| eprintln!("== {p}")).await, |r| r.table(), json)
        }
        Cmd::Churn { base_pods, ops, rounds, ovs_rundir, recovery_pods, json } => {
            let opts = bench::ChurnOptions { base_pods, ops, rounds, ovs_rundir, recovery_pods, ..Default::default() };
            print_report(bench::churn(&opts, |p| eprintln!("== {p}")).await, |r| r.table(), json)
        }
    }
}
