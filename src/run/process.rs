//! What every sdn-node binary does before its work: logging to stderr in the chosen format and
//! the one-thread runtime the agent runs on (the agent, and the benchmarks that measure it as
//! it runs in production).

use std::process::ExitCode;

/// Log format: human or json (structured).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`); colours only on a terminal.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    match format {
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter).with_writer(std::io::stderr).init(),
        LogFormat::Human => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

/// The agent's runtime. One thread: the agent's work is I/O-bound and sequential per switch,
/// and on a small node a second worker mostly adds cross-thread wake-ups on every reply
/// (measured with `sdn-bench churn`); ovs-vswitchd keeps the other core. A runtime that cannot
/// start is said on stderr and is the process's failure.
pub fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
        eprintln!("error: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })
}
