//! What every sdn-node binary does before its work: logging to stderr in the chosen format and
//! the one-thread runtime the agent runs on (the agent, and the benchmarks that measure it as
//! it runs in production).

use std::io::Write;
use std::process::ExitCode;

/// Log format: human or json (structured).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Log lines that could not be written (stderr closed or full): the daemon goes on without
/// them. Exported as `sdn_node_log_lines_dropped_total`.
pub static LOG_LINES_DROPPED: std::sync::LazyLock<prometheus_client::metrics::counter::Counter> =
    std::sync::LazyLock::new(Default::default);

/// stderr for the log, as a writer that never fails: a log line that cannot be written (the
/// reader of `sdn-node run 2>&1 | head` went away) is counted in [`LOG_LINES_DROPPED`] and
/// dropped. tracing-subscriber reports a failed write with `eprint!`, which panics on a closed
/// stderr: a daemon must not die because its log went away.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        // One event is one write_all of its whole line (tracing-subscriber formats it first).
        if std::io::stderr().lock().write_all(buf).is_err() {
            LOG_LINES_DROPPED.inc();
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Lines the log may hold while stderr does not take them (a reader that stalls): past this,
/// lines are dropped and counted, and nothing in the agent waits.
const LOG_QUEUE_LINES: usize = 64 * 1024;

/// The queue's own count of lines it dropped when full, once logging is set up.
static QUEUE_DROPS: std::sync::OnceLock<tracing_appender::non_blocking::ErrorCounter> = std::sync::OnceLock::new();
/// How many of those are in [`LOG_LINES_DROPPED`] already.
static QUEUE_DROPS_COUNTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Log lines dropped so far (stderr closed or failing, or its reader stalled past the queue),
/// with the queue's drops moved into [`LOG_LINES_DROPPED`] first (for status and `/metrics`).
pub fn log_lines_dropped() -> u64 {
    use std::sync::atomic::Ordering;
    if let Some(q) = QUEUE_DROPS.get() {
        let now = q.dropped_lines() as u64;
        let before = QUEUE_DROPS_COUNTED.swap(now, Ordering::AcqRel);
        if now > before {
            LOG_LINES_DROPPED.inc_by(now - before);
        }
    }
    LOG_LINES_DROPPED.get()
}

/// Keeps the log's writer thread; dropping it (at the end of `main`) writes what is queued.
pub struct LogGuard(#[allow(dead_code)] Option<tracing_appender::non_blocking::WorkerGuard>);

/// Logs to stderr, filtered by `RUST_LOG` (default `info`); colours only on a terminal. Writing
/// the log never fails, panics nor blocks: events are queued (up to [`LOG_QUEUE_LINES`]) for a
/// thread of their own that writes them with [`LogWriter`]. The agent runs its work on one
/// thread; a stderr pipe nobody drains (a stalled container log reader, a test harness busy
/// elsewhere) once blocked that thread in `write` and with it every pod request — seen in the
/// chaos soak. A full queue drops lines (counted) instead.
pub fn init_logging(format: LogFormat) -> LogGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("sdn-node-log")
        .finish(LogWriter);
    let _ = QUEUE_DROPS.set(writer.error_counter());
    match format {
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(writer)
            .log_internal_errors(false)
            .init(),
        LogFormat::Human => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .log_internal_errors(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    LogGuard(Some(guard))
}

/// The agent's runtime. One thread: the agent's work is I/O-bound and sequential per switch,
/// and on a small node a second worker mostly adds cross-thread wake-ups on every reply
/// (measured with `sdn-bench churn`); ovs-vswitchd keeps the other core. A runtime that cannot
/// start is said on stderr and is the process's failure.
pub fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
        let _ = writeln!(std::io::stderr(), "error: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })
}
