//! NetworkPolicy audit log, the agent side: packet-ins from audit flows become JSON lines.
//!
//! The flows (model `pipeline::audit::log_action`) copy each new connection's first packet to
//! the agent through one switch meter, so a flood costs the agent at most `rate_per_sec`
//! packet-ins a second (plus `burst`), whatever arrives; the packets themselves are forwarded at
//! full rate. This module keeps that meter and the connection's packet-in settings on every
//! connection the supervisor makes (they die with the switch or the connection), installed by
//! the supervisor's connect hook before the connection is used, turns each
//! packet-in into an [`AuditEvent`] and writes it as one line to the sink.
//!
//! Backpressure: the switch reader hands packet-ins over without waiting (full channel: dropped
//! and counted, `switch::PacketInSink`); this module's writer is the only consumer, so a slow
//! disk can only lose log lines, never delay the OpenFlow connection.
//!
//! Meters and flows (OVS 3.1, `ofproto/ofproto.c` ofproto_check_ofpacts): a flow whose
//! `controller(meter_id=N)` names a meter that does not exist *yet* is accepted, logged as
//! "unknown meter id", and stays unmetered for its lifetime. So the meter is installed before
//! the connection is published to the engine (the supervisor's [`OnConnect`] hook), and so
//! before any resync's audit flows; should the set-up fail or time out, the same limit is also
//! put on OVS's `controller` meter (OFPM_CONTROLLER), which meters every packet-in that has no
//! meter of its own.

mod event;
mod meter;
mod packet;
mod writer;

pub use event::{now, AuditEvent, EventError, PodLookup};
pub use meter::{install, SetupError};
pub use packet::{parse as parse_packet, Flow5, PacketError, Proto};

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

#[cfg(doc)]
use crate::switch::Supervisor;
use crate::switch::{packet_in_channel, OnConnect, PacketInCounters, Switch};

/// Where the lines go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    Stdout,
    /// Opened for appending (created if missing), so a restart continues the file.
    File(PathBuf),
}

/// The audit log's settings.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    /// Packet-ins a second the switch lets through to the agent (the meter's drop band).
    pub rate_per_sec: u32,
    /// Packets allowed above the rate in a burst.
    pub burst: u32,
    pub sink: Sink,
    /// The node's name, in every line.
    pub node: String,
    /// Packet-ins that may wait for the writer (more are dropped and counted).
    pub queue: usize,
}

impl AuditConfig {
    pub fn new(rate_per_sec: u32, burst: u32, sink: Sink, node: impl Into<String>) -> AuditConfig {
        AuditConfig { rate_per_sec, burst, sink, node: node.into(), queue: 1024 }
    }
}

/// Counts for metrics.
#[derive(Debug, Default)]
pub struct AuditCounters {
    /// Lines written.
    events: AtomicU64,
    /// Packet-ins that were not audit events (no or bad userdata, neither IPv4 nor IPv6).
    invalid: AtomicU64,
    /// Lines that could not be written.
    write_errors: AtomicU64,
    /// Connections on which the meter or the packet-in settings could not be installed.
    setup_errors: AtomicU64,
    /// Connections fully set up.
    setups: AtomicU64,
    switch: Arc<PacketInCounters>,
}

impl AuditCounters {
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }
    /// Packet-ins dropped before the writer because it was behind.
    pub fn dropped(&self) -> u64 {
        self.switch.dropped()
    }
    /// Packet-ins received from the switch.
    pub fn received(&self) -> u64 {
        self.switch.delivered() + self.switch.dropped()
    }
    pub fn invalid(&self) -> u64 {
        self.invalid.load(Ordering::Relaxed)
    }
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }
    pub fn setup_errors(&self) -> u64 {
        self.setup_errors.load(Ordering::Relaxed)
    }
    pub fn setups(&self) -> u64 {
        self.setups.load(Ordering::Relaxed)
    }
}

/// The running audit log; dropping it stops it.
pub struct AuditHandle {
    pub counters: Arc<AuditCounters>,
    cancel: CancellationToken,
    writer: Option<JoinHandle<()>>,
}

impl AuditHandle {
    /// Stops, after the lines already received are written and flushed.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(w) = self.writer.take() {
            let _ = w.await;
        }
    }
}

impl Drop for AuditHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Starts the audit log: opens the sink and starts the writer. The returned hook is for
/// [`Supervisor::spawn_with`]: on every connection, before the agent uses it, it hands the
/// connection's packet-ins to the writer and installs the meter, so the meter exists before
/// any audit flow names it. Fails only if the sink cannot be opened.
pub async fn start(cfg: AuditConfig, pods: Arc<dyn PodLookup>) -> std::io::Result<(AuditHandle, OnConnect)> {
    let out = writer::open(&cfg.sink).await?;
    let (sink, ins) = packet_in_channel(cfg.queue);
    let counters = Arc::new(AuditCounters { switch: ins.counters.clone(), ..AuditCounters::default() });
    let cancel = CancellationToken::new();
    let (c, setup_cfg) = (counters.clone(), cfg.clone());
    let on_connect: OnConnect = Arc::new(move |sw: Switch| {
        let (c, cfg, sink) = (c.clone(), setup_cfg.clone(), sink.clone());
        Box::pin(async move {
            sw.set_packet_in_sink(sink);
            match install(&sw, cfg.rate_per_sec, cfg.burst).await {
                Ok(()) => {
                    c.setups.fetch_add(1, Ordering::Relaxed);
                    info!(rate = cfg.rate_per_sec, burst = cfg.burst, "audit log: meter and packet-ins set up");
                }
                Err(e) => {
                    c.setup_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(error = %e, "audit log: cannot set up the switch; no events from this connection");
                }
            }
        })
    });
    let writer = tokio::spawn(writer::run(ins.rx, out, cfg.node.clone(), pods, counters.clone(), cancel.clone()));
    Ok((AuditHandle { counters, cancel, writer: Some(writer) }, on_connect))
}
