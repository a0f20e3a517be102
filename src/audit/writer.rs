//! The writer task: packet-ins in, one JSON line each out.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::event::{now, AuditEvent, PodLookup};
use super::{AuditCounters, Sink};
use crate::switch::PacketInMsg;

pub(super) type Out = BufWriter<Box<dyn AsyncWrite + Send + Unpin>>;

/// Opens the sink (a file for appending, created if missing).
pub(super) async fn open(sink: &Sink) -> std::io::Result<Out> {
    let w: Box<dyn AsyncWrite + Send + Unpin> = match sink {
        Sink::Stdout => Box::new(tokio::io::stdout()),
        Sink::File(p) => Box::new(tokio::fs::OpenOptions::new().create(true).append(true).open(p).await?),
    };
    Ok(BufWriter::new(w))
}

/// Writes every event; flushes whenever no more packet-ins are waiting, so a line is on disk
/// soon after its packet while a burst is written in few syscalls. On cancel, writes what is
/// already queued, then returns.
pub(super) async fn run(
    mut rx: mpsc::Receiver<PacketInMsg>,
    mut out: Out,
    node: String,
    pods: Arc<dyn PodLookup>,
    counters: Arc<AuditCounters>,
    cancel: CancellationToken,
) {
    let mut last_error_logged = false;
    loop {
        let m = tokio::select! {
            biased;
            m = rx.recv() => m,
            _ = cancel.cancelled() => {
                rx.close();
                rx.recv().await
            }
        };
        let Some(m) = m else { break };
        write_one(&m, &mut out, &node, &*pods, &counters, &mut last_error_logged).await;
        if rx.is_empty() {
            if let Err(e) = out.flush().await {
                counters.write_errors.fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, "audit log: flush failed");
            }
        }
    }
    let _ = out.flush().await;
}

async fn write_one(m: &PacketInMsg, out: &mut Out, node: &str, pods: &dyn PodLookup, counters: &AuditCounters, logged: &mut bool) {
    let PacketInMsg::Nx(p) = m else {
        // Standard packet-ins carry no userdata: not from an audit flow.
        counters.invalid.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let state_node = pods.node_name();
    let node = state_node.as_deref().unwrap_or(node);
    let e = match AuditEvent::from_packet_in(p, node, pods, now()) {
        Ok(e) => e,
        Err(e) => {
            counters.invalid.fetch_add(1, Ordering::Relaxed);
            debug!(error = %e, cookie = ?p.cookie, "audit log: packet-in is no audit event");
            return;
        }
    };
    let mut line = e.to_line();
    line.push('\n');
    match out.write_all(line.as_bytes()).await {
        Ok(()) => {
            counters.events.fetch_add(1, Ordering::Relaxed);
            *logged = false;
        }
        Err(err) => {
            counters.write_errors.fetch_add(1, Ordering::Relaxed);
            if !*logged {
                warn!(error = %err, "audit log: cannot write; dropping lines until it works again");
                *logged = true;
            }
        }
    }
}
