//! One OpenFlow connection: handshake, then a reader task and a writer task.
//!
//! The writer drains a bounded queue (backpressure: callers wait when it is full) and writes
//! everything available in one `write_all`, so a pipelined burst of FLOW_MODs costs a few
//! syscalls, not one per message. Echo replies go through a separate small queue so that a full
//! data queue can never delay them. The reader routes replies and errors through the
//! [`Table`](super::pending::Table) and answers the switch's ECHO_REQUESTs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use openflow::{
    codec::OfCodec, ErrorCode, ErrorMsg, FeaturesReply, Hello, Message, OfMessage, OFP_VERSION,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio_util::codec::{Encoder, FramedRead};
use tokio_util::sync::CancellationToken;
use tracing::{debug, trace, warn};

use super::error::{CloseReason, SwitchError};
use super::packet_in::{PacketInMsg, PacketInSink};
use super::pending::Table;
use super::transport::{BoxRead, BoxWrite, Target};

/// What the writer sends: a typed message or pre-encoded whole messages.
pub(crate) enum Outgoing {
    Msg(Box<OfMessage>),
    Raw(Bytes),
}

/// FLOW_REMOVED messages a slow subscriber may fall behind by (it is told how many it lost).
const FLOW_REMOVED_QUEUE: usize = 8192;

/// State shared by the handle and the two tasks.
pub(crate) struct Shared {
    table: Mutex<Table>,
    /// Echo replies (bounded: a switch that floods echo requests gets some unanswered).
    pub ctrl_tx: mpsc::Sender<OfMessage>,
    pub cancel: CancellationToken,
    state: watch::Sender<Option<CloseReason>>,
    /// Where packet-ins go (none: logged and dropped).
    packet_ins: Mutex<Option<PacketInSink>>,
    /// OFPT_FLOW_REMOVED messages, to every subscriber (the per-policy counters).
    pub flow_removed: tokio::sync::broadcast::Sender<openflow::FlowRemoved>,
    /// Milliseconds since `epoch` when the last message arrived.
    last_rx: AtomicU64,
    epoch: Instant,
}

impl Shared {
    pub fn table(&self) -> MutexGuard<'_, Table> {
        // A poisoned lock means a panic while routing; the table itself stays consistent
        // (every operation is a single insert/remove), so keep going.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the connection once: fails all waiters and stops both tasks.
    pub fn close(&self, reason: CloseReason) {
        self.table().close(reason.clone());
        self.state.send_if_modified(|s| {
            if s.is_none() {
                *s = Some(reason);
                true
            } else {
                false
            }
        });
        self.cancel.cancel();
    }

    pub fn packet_ins(&self) -> MutexGuard<'_, Option<PacketInSink>> {
        self.packet_ins.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands a packet-in to the subscriber without waiting (see `packet_in.rs`).
    fn packet_in(&self, m: PacketInMsg) {
        match &*self.packet_ins() {
            Some(sink) => sink.offer(m),
            None => debug!("packet-in with no subscriber; dropped"),
        }
    }

    pub fn state(&self) -> watch::Receiver<Option<CloseReason>> {
        self.state.subscribe()
    }

    pub fn idle_for(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_rx.load(Ordering::Relaxed)))
    }
}

pub(crate) struct Established {
    pub shared: Arc<Shared>,
    pub tx: mpsc::Sender<Outgoing>,
    pub features: FeaturesReply,
}

/// Connects, negotiates OpenFlow 1.3, fetches FEATURES and starts the tasks.
pub(crate) async fn establish(
    target: &Target,
    queue: usize,
    handshake_timeout: Duration,
) -> Result<Established, SwitchError> {
    let (r, mut w) = target
        .connect()
        .await
        .map_err(|source| SwitchError::Connect { target: target.to_string(), source })?;
    let mut reader = FramedRead::new(r, OfCodec::default());
    let hs = async {
        write_msg(&mut w, &OfMessage::new(1, Message::Hello(Hello::of13()))).await?;
        let first = next_msg(&mut reader, target).await?;
        match first.msg {
            Message::Hello(h) => {
                let offered = h.versions(first.version);
                if !offered.contains(&OFP_VERSION) {
                    // OpenFlow: tell the peer why, in its version, then give up.
                    let text = format!("We support version 0x04, you support {offered:?}, no common versions.");
                    let mut e = OfMessage::new(
                        0,
                        Message::Error(ErrorMsg { code: ErrorCode::HELLO_FAILED_INCOMPATIBLE, data: text.into() }),
                    );
                    e.version = first.version;
                    let _ = write_msg(&mut w, &e).await;
                    return Err(SwitchError::VersionUnsupported { target: target.to_string(), offered });
                }
            }
            Message::Error(e) => {
                return Err(SwitchError::Handshake { target: target.to_string(), detail: format!("switch refused HELLO: {e}") })
            }
            other => {
                return Err(SwitchError::Handshake {
                    target: target.to_string(),
                    detail: format!("expected HELLO, got {}", other.name()),
                })
            }
        }
        write_msg(&mut w, &OfMessage::new(2, Message::FeaturesRequest)).await?;
        loop {
            let m = next_msg(&mut reader, target).await?;
            match m.msg {
                Message::FeaturesReply(f) if m.xid == 2 => return Ok(f),
                Message::EchoRequest(p) => write_msg(&mut w, &OfMessage::new(m.xid, Message::EchoReply(p))).await?,
                Message::Error(e) => {
                    return Err(SwitchError::Handshake { target: target.to_string(), detail: format!("FEATURES: {e}") })
                }
                other => debug!(msg = other.name(), "ignored during handshake"),
            }
        }
    };
    let features = tokio::time::timeout(handshake_timeout, hs)
        .await
        .map_err(|_| SwitchError::Timeout { what: "the OpenFlow handshake", after: handshake_timeout })??;

    let (tx, rx) = mpsc::channel(queue.max(1));
    let (ctrl_tx, ctrl_rx) = mpsc::channel(64);
    let (state, _) = watch::channel(None);
    let shared = Arc::new(Shared {
        table: Mutex::new(Table::default()),
        ctrl_tx,
        cancel: CancellationToken::new(),
        state,
        packet_ins: Mutex::new(None),
        flow_removed: tokio::sync::broadcast::channel(FLOW_REMOVED_QUEUE).0,
        last_rx: AtomicU64::new(0),
        epoch: Instant::now(),
    });
    tokio::spawn(writer(w, rx, ctrl_rx, shared.clone()));
    tokio::spawn(read_loop(reader, shared.clone()));
    Ok(Established { shared, tx, features })
}

async fn write_msg(w: &mut BoxWrite, m: &OfMessage) -> Result<(), SwitchError> {
    let b = m.to_bytes()?;
    w.write_all(&b).await.map_err(|e| SwitchError::Disconnected(CloseReason::Io(e.to_string())))
}

async fn next_msg(r: &mut FramedRead<BoxRead, OfCodec>, target: &Target) -> Result<OfMessage, SwitchError> {
    match r.next().await {
        None => Err(SwitchError::Disconnected(CloseReason::Eof)),
        Some(Err(e)) => Err(SwitchError::Disconnected(CloseReason::Framing(e.to_string()))),
        Some(Ok(Err(bad))) => Err(SwitchError::Handshake {
            target: target.to_string(),
            detail: format!("undecodable message: {}", bad.error),
        }),
        Some(Ok(Ok(m))) => Ok(m),
    }
}

/// The largest lone chunk the writer sends without copying it into its buffer.
const DIRECT_WRITE_MAX: usize = 64 * 1024;

async fn writer(
    mut w: BoxWrite,
    mut rx: mpsc::Receiver<Outgoing>,
    mut ctrl: mpsc::Receiver<OfMessage>,
    shared: Arc<Shared>,
) {
    let mut codec = OfCodec::default();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut items = Vec::with_capacity(256);
    loop {
        tokio::select! {
            biased;
            _ = shared.cancel.cancelled() => break,
            Some(m) = ctrl.recv() => {
                if let Err(e) = codec.encode(&m, &mut buf) {
                    warn!(error = %e, "dropping unencodable control message");
                }
            }
            n = rx.recv_many(&mut items, 256) => {
                if n == 0 {
                    // Every handle is gone.
                    shared.close(CloseReason::Local);
                    break;
                }
                // A lone small pre-encoded chunk (a serial commit) is written as it is,
                // uncopied. Large ones (a replay) are copied and freed at once, as before:
                // written directly they stay allocated longer and raise the peak RSS.
                let small = matches!(items.as_slice(), [Outgoing::Raw(b)] if b.len() <= DIRECT_WRITE_MAX);
                if small && buf.is_empty() {
                    if let Some(Outgoing::Raw(b)) = items.pop() {
                        trace!(bytes = b.len(), "write");
                        if let Err(e) = w.write_all(&b).await {
                            shared.close(CloseReason::Io(e.to_string()));
                            break;
                        }
                    }
                    continue;
                }
                for item in items.drain(..) {
                    let r = match item {
                        Outgoing::Msg(m) => codec.encode(&*m, &mut buf),
                        Outgoing::Raw(b) => codec.encode(b, &mut buf),
                    };
                    if let Err(e) = r {
                        warn!(error = %e, "dropping unencodable message");
                    }
                }
            }
        }
        if buf.is_empty() {
            continue;
        }
        trace!(bytes = buf.len(), "write");
        if let Err(e) = w.write_all(&buf).await {
            shared.close(CloseReason::Io(e.to_string()));
            break;
        }
        buf.clear();
        if buf.capacity() > 4 * 1024 * 1024 {
            buf = BytesMut::with_capacity(64 * 1024);
        }
    }
    let _ = w.shutdown().await;
}

async fn read_loop(mut r: FramedRead<BoxRead, OfCodec>, shared: Arc<Shared>) {
    let reason = loop {
        let next = tokio::select! {
            _ = shared.cancel.cancelled() => break CloseReason::Local,
            n = r.next() => n,
        };
        shared.last_rx.store(shared.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        match next {
            None => break CloseReason::Eof,
            Some(Err(openflow::FrameError::Io(e))) => break CloseReason::Io(e.to_string()),
            Some(Err(e)) => break CloseReason::Framing(e.to_string()),
            Some(Ok(Err(bad))) => {
                if !shared.table().bad_reply(bad.header.xid, bad.error.clone()) {
                    warn!(xid = bad.header.xid, msg_type = bad.header.msg_type, error = %bad.error, "undecodable message from the switch");
                }
            }
            Some(Ok(Ok(m))) => dispatch(m, &shared),
        }
    };
    debug!(%reason, "OpenFlow connection closed");
    shared.close(reason);
}

fn dispatch(m: OfMessage, shared: &Shared) {
    match m.msg {
        Message::EchoRequest(payload) => {
            if shared.ctrl_tx.try_send(OfMessage::new(m.xid, Message::EchoReply(payload))).is_err() {
                warn!("echo replies are not being written; dropping one");
            }
        }
        Message::Error(e) => {
            shared.table().error(m.xid, e);
        }
        Message::Hello(_) => {}
        Message::PacketIn(p) => shared.packet_in(PacketInMsg::Standard(p)),
        Message::PacketIn2(p) => shared.packet_in(PacketInMsg::Nx(p)),
        Message::FlowRemoved(f) => {
            // No subscriber: nothing counts them.
            let _ = shared.flow_removed.send(f);
        }
        _ => {
            let name = m.msg.name();
            let xid = m.xid;
            if !shared.table().reply(m) {
                debug!(xid, msg = name, "unsolicited message from the switch");
            }
        }
    }
}
