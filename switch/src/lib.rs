//! The OpenFlow side of the switch: an async connection to a bridge's management socket.
//!
//! [`Switch`] is a cheap clonable handle to one connection. Requests are pipelined: many can be
//! in flight, each completes when its reply (or the OFPT_ERROR naming its xid) arrives. Batches
//! of FLOW_MODs complete on one BARRIER ([`Switch::send_flow_mods`]); atomic changes go through
//! [`Bundle`]. [`Supervisor`] keeps a connection up across switch restarts.

mod bundle;
mod conn;
mod error;
mod packet_in;
mod pending;
mod supervisor;
mod transport;
pub mod unixctl;

pub use bundle::Bundle;
pub use error::{CloseReason, Rejection, SwitchError};
pub use packet_in::{packet_in_channel, PacketInCounters, PacketInMsg, PacketInSink, PacketIns};
pub use supervisor::{Backoff, OnConnect, SwitchEvent, Supervisor, ON_CONNECT_DEADLINE};
pub use transport::Target;
pub use unixctl::{CtlError, VswitchdCtl};

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use openflow::{
    FeaturesReply, FlowMod, FlowStats, FlowStatsRequest, FragMode, Message, MultipartAssembler, MultipartReplyBody,
    MultipartRequest, OfMessage, Port, SwitchConfig,
};
use tokio::sync::oneshot;

use conn::{Outgoing, Shared};
use pending::{Completion, Waiter};

/// Tunables of a connection.
#[derive(Clone, Debug)]
pub struct SwitchOptions {
    /// Messages that may wait in the send queue before senders are made to wait.
    pub send_queue: usize,
    /// Deadline for every request's reply (a bundle commit, a dump, a barrier).
    pub request_timeout: Duration,
    /// HELLO + FEATURES deadline.
    pub handshake_timeout: Duration,
    /// Send an ECHO_REQUEST when nothing arrived for this long; `None` disables keep-alive.
    pub echo_interval: Option<Duration>,
    /// The connection is declared dead when an echo is not answered within this.
    pub echo_timeout: Duration,
    /// Pipelined batches are split into chunks of this many bytes when queued.
    pub chunk_bytes: usize,
}

impl Default for SwitchOptions {
    fn default() -> Self {
        SwitchOptions {
            send_queue: 1024,
            request_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            echo_interval: Some(Duration::from_secs(5)),
            echo_timeout: Duration::from_secs(15),
            chunk_bytes: 256 * 1024,
        }
    }
}

struct Inner {
    shared: Arc<Shared>,
    tx: tokio::sync::mpsc::Sender<Outgoing>,
    features: FeaturesReply,
    target: Target,
    opts: SwitchOptions,
    next_xid: AtomicU32,
    next_bundle: AtomicU32,
    /// Held across a GET_CONFIG and the SET_CONFIG based on it ([`Switch::set_frag_mode`],
    /// [`Switch::enable_packet_ins`]): SET_CONFIG sets both the fragment mode and
    /// `miss_send_len`, so two unserialized read-modify-writes could undo each other.
    config: tokio::sync::Mutex<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.close(CloseReason::Local);
    }
}

/// A handle to one OpenFlow 1.3 connection. Clones share the connection; it closes when the
/// last handle is dropped.
#[derive(Clone)]
pub struct Switch {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switch").field("target", &self.inner.target.to_string()).finish()
    }
}

impl Switch {
    /// Connects to `unix:PATH` (e.g. `<rundir>/br0.mgmt`) or `tcp:HOST:PORT` and negotiates
    /// OpenFlow 1.3.
    pub async fn connect(target: &str, opts: SwitchOptions) -> Result<Switch, SwitchError> {
        let target = Target::parse(target)?;
        Self::connect_target(target, opts).await
    }

    pub async fn connect_target(target: Target, opts: SwitchOptions) -> Result<Switch, SwitchError> {
        let est = conn::establish(&target, opts.send_queue, opts.handshake_timeout).await?;
        let sw = Switch {
            inner: Arc::new(Inner {
                shared: est.shared,
                tx: est.tx,
                features: est.features,
                target,
                opts,
                next_xid: AtomicU32::new(0x100),
                next_bundle: AtomicU32::new(1),
                config: tokio::sync::Mutex::new(()),
            }),
        };
        if let Some(interval) = sw.inner.opts.echo_interval {
            tokio::spawn(keepalive(Arc::downgrade(&sw.inner), interval));
        }
        Ok(sw)
    }

    pub fn features(&self) -> &FeaturesReply {
        &self.inner.features
    }

    pub fn target(&self) -> &Target {
        &self.inner.target
    }

    pub fn options(&self) -> &SwitchOptions {
        &self.inner.opts
    }

    pub fn is_closed(&self) -> bool {
        self.inner.shared.table().closed().is_some()
    }

    /// Resolves when the connection ends, with the reason.
    pub async fn closed(&self) -> CloseReason {
        let mut rx = self.inner.shared.state();
        loop {
            if let Some(r) = rx.borrow().clone() {
                return r;
            }
            if rx.changed().await.is_err() {
                return CloseReason::Local;
            }
        }
    }

    /// This connection's OFPT_FLOW_REMOVED messages from now on (see
    /// [`Switch::enable_flow_removed`]).
    pub fn subscribe_flow_removed(&self) -> tokio::sync::broadcast::Receiver<openflow::FlowRemoved> {
        self.inner.shared.flow_removed.subscribe()
    }

    /// Closes the connection; pending requests fail with `Disconnected(Local)`.
    pub fn close(&self) {
        self.inner.shared.close(CloseReason::Local);
    }

    /// Reserves `n` consecutive xids (never 0, never wrapping inside the block).
    fn alloc_xids(&self, n: u32) -> u32 {
        let mut cur = self.inner.next_xid.load(Ordering::Relaxed);
        loop {
            let start = if cur == 0 || cur.checked_add(n).is_none() { 1 } else { cur };
            match self.inner.next_xid.compare_exchange_weak(cur, start + n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return start,
                Err(c) => cur = c,
            }
        }
    }

    fn alloc_bundle_id(&self) -> u32 {
        self.inner.next_bundle.fetch_add(1, Ordering::Relaxed)
    }

    async fn enqueue(&self, item: Outgoing) -> Result<(), SwitchError> {
        if self.inner.tx.send(item).await.is_err() {
            return Err(self.disconnected());
        }
        Ok(())
    }

    fn disconnected(&self) -> SwitchError {
        SwitchError::Disconnected(self.inner.shared.table().closed().cloned().unwrap_or(CloseReason::Local))
    }

    fn register(&self, xid: u32, waiter: Waiter, cover: Option<Range<u32>>) -> Result<(), SwitchError> {
        self.inner.shared.table().register(xid, waiter, cover)
    }

    async fn wait<T>(
        &self,
        xid: u32,
        rx: oneshot::Receiver<Result<T, SwitchError>>,
        what: &'static str,
    ) -> Result<T, SwitchError> {
        let after = self.inner.opts.request_timeout;
        match tokio::time::timeout(after, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(self.disconnected()),
            Err(_) => {
                self.inner.shared.table().forget(xid);
                Err(SwitchError::Timeout { what, after })
            }
        }
    }

    /// Sends `msg` (already carrying its xid) and waits for the reply with the same xid, also
    /// collecting errors for `cover`.
    async fn round_trip(
        &self,
        first: Outgoing,
        xid: u32,
        cover: Option<Range<u32>>,
        what: &'static str,
    ) -> Result<Completion, SwitchError> {
        let (tx, rx) = oneshot::channel();
        self.register(xid, Waiter::Reply(tx), cover)?;
        if let Err(e) = self.enqueue(first).await {
            self.inner.shared.table().forget(xid);
            return Err(e);
        }
        self.wait(xid, rx, what).await
    }

    /// Sends a request and returns its reply; an OFPT_ERROR for it becomes `Rejected`.
    pub async fn request(&self, msg: Message) -> Result<OfMessage, SwitchError> {
        let xid = self.alloc_xids(1);
        let what = msg.name();
        let c = self.round_trip(Outgoing::Msg(Box::new(OfMessage::new(xid, msg))), xid, None, what).await?;
        c.reply.map_err(|r| SwitchError::Rejected(Box::new(r)))
    }

    /// Sends a message that has no reply (e.g. SET_CONFIG); errors it causes are only logged
    /// unless a later barrier covers it.
    pub async fn send(&self, msg: Message) -> Result<u32, SwitchError> {
        let xid = self.alloc_xids(1);
        self.enqueue(Outgoing::Msg(Box::new(OfMessage::new(xid, msg)))).await?;
        Ok(xid)
    }

    /// Waits until the switch has processed everything sent before.
    pub async fn barrier(&self) -> Result<(), SwitchError> {
        match self.request(Message::BarrierRequest).await?.msg {
            Message::BarrierReply => Ok(()),
            other => Err(SwitchError::UnexpectedReply { request: "BARRIER_REQUEST", got: other.name() }),
        }
    }

    /// Measures one echo round trip.
    pub async fn echo(&self) -> Result<Duration, SwitchError> {
        let t = Instant::now();
        match self.request(Message::EchoRequest(Bytes::from_static(b"sdn-node"))).await?.msg {
            Message::EchoReply(_) => Ok(t.elapsed()),
            other => Err(SwitchError::UnexpectedReply { request: "ECHO_REQUEST", got: other.name() }),
        }
    }

    /// Sends `items` and a trailing BARRIER, and waits for the barrier; errors for the xids in
    /// `cover` are collected on the way. Chunks are queued as soon as they are encoded, so the
    /// switch starts on the first messages while later ones are still being encoded.
    /// `size` is about how many bytes the messages take (the first buffer's capacity).
    pub(crate) async fn batch<'a>(
        &self,
        items: impl Iterator<Item = Item<'a>>,
        size: usize,
        cover: Range<u32>,
        barrier_xid: u32,
    ) -> Result<Completion, SwitchError> {
        self.pipeline(items, size + 8, cover, barrier_xid, Message::BarrierRequest, "the barrier after a batch").await
    }

    /// Sends `items` and then `last` (with xid `last_xid`), and waits for `last`'s reply (or
    /// its error); errors for the xids in `cover` are collected on the way (OVS answers one
    /// connection's messages in order, so they all arrive before that reply). Chunks are
    /// queued as soon as they are encoded.
    pub(crate) async fn pipeline<'a>(
        &self,
        items: impl Iterator<Item = Item<'a>>,
        size: usize,
        cover: Range<u32>,
        last_xid: u32,
        last: Message,
        what: &'static str,
    ) -> Result<Completion, SwitchError> {
        let (tx, rx) = oneshot::channel();
        self.register(last_xid, Waiter::Reply(tx), Some(cover))?;
        let sent = async {
            let limit = self.inner.opts.chunk_bytes.max(1024);
            // Sized for what is sent: a small commit must not allocate a whole chunk.
            let mut buf = BytesMut::with_capacity(size.min(limit + 64 * 1024));
            for item in items {
                match item {
                    Item::Msg(xid, m) => OfMessage::new(xid, *m).encode(&mut buf)?,
                    Item::FlowModBody(xid, body) => {
                        openflow::msg::encode_raw(&mut buf, openflow::msg::OFPT_FLOW_MOD, xid, body)?
                    }
                    Item::Bundled { xid, bundle_id, flags, body } => {
                        openflow::BundleAdd::encode_flow_mod_body(&mut buf, xid, bundle_id, flags, body)?
                    }
                }
                if buf.len() >= limit {
                    self.enqueue(Outgoing::Raw(buf.split().freeze())).await?;
                    buf.reserve(limit);
                }
            }
            OfMessage::new(last_xid, last).encode(&mut buf)?;
            self.enqueue(Outgoing::Raw(buf.freeze())).await
        }
        .await;
        if let Err(e) = sent {
            self.inner.shared.table().forget(last_xid);
            return Err(e);
        }
        self.wait(last_xid, rx, what).await
    }

    /// Sends FLOW_MODs back to back and one BARRIER; completes when the switch has processed
    /// all of them. Not atomic: on failure, the messages that were not rejected are applied.
    /// The error lists each rejected message by its index in `flow_mods`.
    pub async fn send_flow_mods(&self, flow_mods: &[FlowMod]) -> Result<(), SwitchError> {
        let bodies: Vec<Bytes> = flow_mods.iter().map(flow_mod_body).collect::<Result<_, _>>()?;
        self.send_flow_mod_bodies(&bodies).await
    }

    /// [`Switch::send_flow_mods`] for FLOW_MOD bodies that are already encoded (see
    /// [`openflow::FlowModHead::encode_body`]).
    pub async fn send_flow_mod_bodies(&self, bodies: &[Bytes]) -> Result<(), SwitchError> {
        let n = u32::try_from(bodies.len()).map_err(|_| openflow::EncodeError::TooLong {
            what: "batch",
            len: bodies.len(),
            max: u32::MAX as usize,
        })?;
        let start = self.alloc_xids(n + 1);
        let barrier = start + n;
        let items = bodies.iter().enumerate().map(|(i, b)| Item::FlowModBody(start + i as u32, b));
        let size = bodies.iter().map(|b| 8 + b.len()).sum();
        let c = self.batch(items, size, start..barrier, barrier).await?;
        c.reply.map_err(|r| SwitchError::Rejected(Box::new(r)))?;
        if c.covered.is_empty() {
            return Ok(());
        }
        let failures = c.covered.into_iter().map(|r| ((r.xid - start) as usize, r)).collect();
        Err(SwitchError::Batch { total: bodies.len(), failures })
    }

    /// Writes pre-encoded whole messages as they are and waits for a barrier after them.
    /// For benchmarks that measure the switch itself (the bytes' xids are not tracked).
    pub async fn send_raw_and_barrier(&self, chunks: Vec<Bytes>) -> Result<(), SwitchError> {
        for c in chunks {
            self.enqueue(Outgoing::Raw(c)).await?;
        }
        self.barrier().await
    }

    async fn multipart(&self, req: MultipartRequest, what: &'static str) -> Result<MultipartReplyBody, SwitchError> {
        let xid = self.alloc_xids(1);
        let (tx, rx) = oneshot::channel();
        self.register(xid, Waiter::Multipart(MultipartAssembler::default(), tx), None)?;
        if let Err(e) = self.enqueue(Outgoing::Msg(Box::new(OfMessage::new(xid, Message::MultipartRequest(req))))).await {
            self.inner.shared.table().forget(xid);
            return Err(e);
        }
        self.wait(xid, rx, what).await
    }

    /// Dumps flows (all parts of the reply, typed; see [`typed_flows`]).
    pub async fn dump_flows(&self, req: FlowStatsRequest) -> Result<Vec<FlowStats>, SwitchError> {
        match self.multipart(MultipartRequest::flows(req), "a flow dump").await? {
            MultipartReplyBody::Flow(v) => Ok(typed_flows(v)),
            _ => Err(SwitchError::UnexpectedReply { request: "OFPMP_FLOW", got: "another multipart type" }),
        }
    }

    /// Dumps flows part by part: `each` gets every reply part as it arrives, so a large table
    /// never has to be held in memory whole.
    pub async fn dump_flows_each(
        &self,
        req: FlowStatsRequest,
        mut each: impl FnMut(Vec<FlowStats>),
    ) -> Result<(), SwitchError> {
        let xid = self.alloc_xids(1);
        let (tx, mut rx) = tokio::sync::mpsc::channel(pending::PART_QUEUE);
        self.register(xid, Waiter::Parts(tx), None)?;
        let msg = Outgoing::Msg(Box::new(OfMessage::new(xid, Message::MultipartRequest(MultipartRequest::flows(req)))));
        if let Err(e) = self.enqueue(msg).await {
            self.inner.shared.table().forget(xid);
            return Err(e);
        }
        let after = self.inner.opts.request_timeout;
        let mut done = false;
        loop {
            match tokio::time::timeout(after, rx.recv()).await {
                // The channel closes after the last part (its sender is dropped then); closed
                // before it, the reader gave the dump up (this consumer fell behind).
                Ok(None) if done => return Ok(()),
                Ok(None) => return Err(SwitchError::Disconnected(CloseReason::Local)),
                Ok(Some(Ok((MultipartReplyBody::Flow(v), more)))) => {
                    done = !more;
                    each(typed_flows(v))
                }
                Ok(Some(Ok(_))) => {
                    self.inner.shared.table().forget(xid);
                    return Err(SwitchError::UnexpectedReply { request: "OFPMP_FLOW", got: "another multipart type" });
                }
                Ok(Some(Err(e))) => return Err(e),
                Err(_) => {
                    self.inner.shared.table().forget(xid);
                    return Err(SwitchError::Timeout { what: "a flow dump part", after });
                }
            }
        }
    }

    /// How many flows (and their packet and byte counts) match `req` (OFPMP_AGGREGATE): one
    /// small reply whatever the table size, so it can be asked often.
    pub async fn aggregate(&self, req: FlowStatsRequest) -> Result<openflow::msg::AggregateStats, SwitchError> {
        let mp = MultipartRequest { flags: 0, body: openflow::msg::MultipartRequestBody::Aggregate(req) };
        match self.multipart(mp, "aggregate flow stats").await? {
            MultipartReplyBody::Aggregate(a) => Ok(a),
            _ => Err(SwitchError::UnexpectedReply { request: "OFPMP_AGGREGATE", got: "another multipart type" }),
        }
    }

    /// The switch's ports (OFPMP_PORT_DESC).
    pub async fn port_desc(&self) -> Result<Vec<Port>, SwitchError> {
        match self.multipart(MultipartRequest::port_desc(), "port descriptions").await? {
            MultipartReplyBody::PortDesc(v) => Ok(v),
            _ => Err(SwitchError::UnexpectedReply { request: "OFPMP_PORT_DESC", got: "another multipart type" }),
        }
    }

    pub async fn get_config(&self) -> Result<SwitchConfig, SwitchError> {
        match self.request(Message::GetConfigRequest).await?.msg {
            Message::GetConfigReply(c) => Ok(c),
            other => Err(SwitchError::UnexpectedReply { request: "GET_CONFIG_REQUEST", got: other.name() }),
        }
    }

    /// Sets the bridge-wide fragment handling (the seed's `SetFrags("nx-match")`) and reads it
    /// back: OVS silently ignores modes it does not support.
    pub async fn set_frag_mode(&self, frag: FragMode) -> Result<(), SwitchError> {
        let _config = self.inner.config.lock().await;
        let mut cfg = self.get_config().await?;
        if cfg.frag == frag {
            return Ok(());
        }
        cfg.frag = frag;
        let xid = self.alloc_xids(2);
        // SET_CONFIG has no reply: cover it with a barrier so an error for it is not lost.
        let items = std::iter::once(Item::Msg(xid, Box::new(Message::SetConfig(cfg))));
        let c = self.batch(items, 32, xid..xid + 1, xid + 1).await?;
        if let Some(r) = c.covered.into_iter().next() {
            return Err(SwitchError::Rejected(Box::new(r)));
        }
        let got = self.get_config().await?.frag;
        if got != frag {
            return Err(SwitchError::FragModeNotApplied { want: frag.name(), got: got.name() });
        }
        Ok(())
    }

    /// Starts an atomic bundle (see [`Bundle`]).
    pub fn bundle(&self) -> Bundle {
        Bundle::new(self.clone())
    }
}

/// One message of a pipelined batch.
pub(crate) enum Item<'a> {
    Msg(u32, Box<Message>),
    FlowModBody(u32, &'a [u8]),
    Bundled { xid: u32, bundle_id: u32, flags: openflow::BundleFlags, body: &'a [u8] },
}

/// Encodes a FLOW_MOD's body (everything after the OpenFlow header).
pub fn flow_mod_body(fm: &FlowMod) -> Result<Bytes, SwitchError> {
    let mut b = BytesMut::with_capacity(fm.encoded_len());
    fm.encode(&mut b)?;
    Ok(b.freeze())
}

/// Sends an echo whenever the connection was idle for `interval`; closes it when the echo is
/// not answered in time. Holds only a weak reference, so it ends with the connection.
async fn keepalive(inner: std::sync::Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.shared.cancel.is_cancelled() {
            return;
        }
        if inner.shared.idle_for() < interval {
            continue;
        }
        let sw = Switch { inner };
        let timeout = sw.inner.opts.echo_timeout;
        match tokio::time::timeout(timeout, sw.echo()).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!(target = %sw.inner.target, ?timeout, "switch did not answer an echo; closing");
                sw.inner.shared.close(CloseReason::EchoTimeout);
                return;
            }
        }
    }
}

/// The typed entries of a flow dump. An entry the openflow crate cannot model (a flow someone
/// else installed, outside its model) is skipped with a warning instead of failing the dump.
fn typed_flows(entries: Vec<openflow::FlowStatsEntry>) -> Vec<FlowStats> {
    let (typed, raw) = openflow::split_flow_stats(entries);
    for r in &raw {
        tracing::warn!(
            table = r.table_id(),
            priority = r.priority(),
            cookie = r.cookie(),
            error = ?r.error(),
            "flow dump: skipping a flow this agent cannot model"
        );
    }
    typed
}
