//! JSON-RPC 1.0 connection to ovsdb-server.
//!
//! One reader task and one writer task own the two halves of the socket. Calls
//! get a fresh numeric id and wait on a oneshot that the reader completes when
//! the matching response arrives, so any number of calls can be in flight from
//! any number of tasks. The reader also answers the server's `echo` probes
//! (otherwise ovsdb-server drops "inactive" connections) and routes
//! `update`/`update2` notifications to bounded per-monitor channels.
//!
//! When the connection dies, every pending call fails with
//! [`OvsdbError::Disconnected`], every monitor stream ends (with
//! [`MonitorEnd::Disconnected`]) and [`OvsdbClient::closed`] resolves; the
//! agent then reconnects and re-creates its monitors. A monitor whose consumer
//! falls more than `monitor_buffer` notifications behind is ended with
//! [`MonitorEnd::Overflow`] rather than blocking the reader, because a blocked
//! reader would also stall the replies the consumer may be waiting for.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;
use tracing::{debug, trace, warn};

use crate::datum::brief;
use crate::framing::{JsonCodec, DEFAULT_MAX_MESSAGE_SIZE};
use crate::rpc::{monitor_params, Id, Incoming, NoParams, Reply, Request, TransactParams};
use crate::txn::{parse_transact_result, Operation, OperationResult};
use crate::{lock, OvsdbError};

pub use crate::monitor::{
    Monitor, MonitorEnd, MonitorRequest, MonitorSelect, MonitorStream, ParseUpdates, RowUpdate, RowUpdate2,
    TableUpdates, TableUpdates2,
};

/// A message ready for the writer: serialized when it is queued, so that a value that cannot
/// be encoded fails its own call rather than the connection.
type Outgoing = Box<RawValue>;

/// Serializes a message for the writer.
fn encode<T: Serialize>(msg: &T) -> Result<Outgoing, OvsdbError> {
    serde_json::value::to_raw_value(msg).map_err(|e| OvsdbError::Protocol(format!("cannot encode a request: {e}")))
}

/// Tunables of a connection.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Largest JSON message accepted from the server.
    pub max_message_size: usize,
    /// Notifications buffered per monitor before it is ended with
    /// [`MonitorEnd::Overflow`].
    pub monitor_buffer: usize,
    /// Outgoing messages queued for the writer task.
    pub outgoing_buffer: usize,
    /// Deadline of every request: a call without a reply by then fails with
    /// [`OvsdbError::Timeout`] (the connection stays up; the inactivity probe decides whether
    /// the server is dead). `None`: no deadline (tests of the framing only).
    pub request_timeout: Option<Duration>,
    /// Inactivity probe, as OVS's own jsonrpc sessions do it: after this long without a
    /// message from the server an `echo` is sent, and a server that sends nothing for another
    /// interval is declared dead (the connection is closed, so pending calls fail and the
    /// owner reconnects). `None`: no probe.
    pub probe_interval: Option<Duration>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            monitor_buffer: 1024,
            outgoing_buffer: 256,
            request_timeout: Some(Duration::from_secs(10)),
            probe_interval: Some(Duration::from_secs(5)),
        }
    }
}

enum DeliverError {
    Full,
    Closed,
    Parse(OvsdbError),
}

type Deliver = Box<dyn FnMut(&Value) -> Result<(), DeliverError> + Send>;

struct MonitorSlot {
    /// "update" or "update2": the notification method this monitor expects.
    method: &'static str,
    deliver: Deliver,
    end: Arc<Mutex<Option<MonitorEnd>>>,
}

type CallResult = Result<Value, OvsdbError>;

#[derive(Default)]
struct State {
    closed: bool,
    pending: HashMap<u64, oneshot::Sender<CallResult>>,
    monitors: HashMap<String, MonitorSlot>,
}

struct Inner {
    state: Mutex<State>,
    next_id: AtomicU64,
    next_monitor: AtomicU64,
    closed: CancellationToken,
    echoes_answered: AtomicU64,
    options: ClientOptions,
    /// When the last message arrived from the server (ms since `epoch`).
    last_rx: AtomicU64,
    epoch: std::time::Instant,
}

fn set_end(end: &Mutex<Option<MonitorEnd>>, reason: MonitorEnd) {
    let mut e = lock(end);
    if e.is_none() {
        *e = Some(reason);
    }
}

impl Inner {
    fn touch(&self) {
        self.last_rx.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Time since the server last sent anything.
    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_rx.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Marks the connection closed and fails everything waiting on it.
    fn shutdown(&self) {
        let (pending, monitors) = {
            let mut st = lock(&self.state);
            st.closed = true;
            (
                std::mem::take(&mut st.pending),
                std::mem::take(&mut st.monitors),
            )
        };
        for (_, m) in monitors {
            set_end(&m.end, MonitorEnd::Disconnected);
        }
        // Dropping the senders makes the waiting calls see Disconnected.
        drop(pending);
        self.closed.cancel();
    }
}

/// A connection to ovsdb-server. Cheap to clone; all clones share the socket.
/// The connection is closed when the last clone is dropped or on [`close`].
///
/// [`close`]: OvsdbClient::close
#[derive(Clone)]
pub struct OvsdbClient {
    inner: Arc<Inner>,
    tx: mpsc::Sender<Outgoing>,
}

impl std::fmt::Debug for OvsdbClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OvsdbClient")
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Removes a pending entry if the call is abandoned (e.g. timed out).
struct PendingGuard<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(&self.inner.state).pending.remove(&self.id);
    }
}

impl OvsdbClient {
    /// Connects to `unix:PATH` or `tcp:HOST:PORT`.
    pub async fn connect(address: &str) -> Result<Self, OvsdbError> {
        Self::connect_with(address, ClientOptions::default()).await
    }

    pub async fn connect_with(address: &str, options: ClientOptions) -> Result<Self, OvsdbError> {
        let conn_err = |source| OvsdbError::Connect {
            address: address.to_string(),
            source,
        };
        if let Some(path) = address.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(OvsdbError::InvalidAddress(address.to_string()));
            }
            let s = tokio::net::UnixStream::connect(path)
                .await
                .map_err(conn_err)?;
            Ok(Self::from_stream(s, options))
        } else if let Some(hostport) = address.strip_prefix("tcp:") {
            if hostport
                .rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(OvsdbError::InvalidAddress(address.to_string()));
            }
            let s = tokio::net::TcpStream::connect(hostport)
                .await
                .map_err(conn_err)?;
            s.set_nodelay(true).map_err(conn_err)?;
            Ok(Self::from_stream(s, options))
        } else {
            Err(OvsdbError::InvalidAddress(address.to_string()))
        }
    }

    /// Runs the protocol over an already-connected stream (used for tests
    /// with an in-memory peer, and for transports not covered by `connect`).
    /// Must be called within a tokio runtime.
    pub fn from_stream<S>(stream: S, options: ClientOptions) -> Self
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(stream);
        let codec = JsonCodec::new(options.max_message_size);
        let reader = FramedRead::new(rd, codec.clone());
        let writer = FramedWrite::new(wr, codec);
        let (tx, rx) = mpsc::channel(options.outgoing_buffer.max(1));
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
            next_monitor: AtomicU64::new(1),
            closed: CancellationToken::new(),
            echoes_answered: AtomicU64::new(0),
            options,
            last_rx: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        });
        tokio::spawn(reader_loop(inner.clone(), reader, tx.downgrade()));
        tokio::spawn(writer_loop(inner.clone(), rx, writer));
        let client = OvsdbClient { inner, tx };
        if let Some(interval) = client.inner.options.probe_interval {
            tokio::spawn(probe_loop(client.inner.clone(), client.tx.downgrade(), interval));
        }
        client
    }

    /// True once the connection has closed (for any reason).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.is_cancelled()
    }

    /// Resolves when the connection closes.
    pub async fn closed(&self) {
        self.inner.closed.cancelled().await
    }

    /// Closes the connection; pending calls fail with `Disconnected`.
    pub fn close(&self) {
        self.inner.shutdown();
    }

    /// Number of requests sent so far on this connection (for tests and benchmarks: round
    /// trips are what a slow server makes expensive).
    pub fn requests_sent(&self) -> u64 {
        self.inner.next_id.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// Number of `echo` requests from the server answered so far.
    pub fn echoes_answered(&self) -> u64 {
        self.inner.echoes_answered.load(Ordering::Relaxed)
    }

    /// Sends one JSON-RPC request and waits for its result (`params` is what the method takes,
    /// e.g. a tuple for a JSON array).
    pub async fn call(&self, method: &str, params: impl Serialize) -> Result<Value, OvsdbError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let msg = encode(&Request { method, params, id: Id::Call(id) })?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = lock(&self.inner.state);
            if st.closed {
                return Err(OvsdbError::Disconnected);
            }
            st.pending.insert(id, tx);
        }
        let _guard = PendingGuard {
            inner: &self.inner,
            id,
        };
        trace!(method, id, "ovsdb request");
        let exchange = async {
            if self.tx.send(msg).await.is_err() {
                return Err(OvsdbError::Disconnected);
            }
            rx.await.map_err(|_| OvsdbError::Disconnected)
        };
        let reply = match self.inner.options.request_timeout {
            Some(t) => tokio::time::timeout(t, exchange)
                .await
                .map_err(|_| OvsdbError::Timeout(format!("ovsdb-server did not answer {method} within {t:?}")))?,
            None => exchange.await,
        };
        match reply {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(OvsdbError::Rpc { error, .. })) => Err(OvsdbError::Rpc {
                method: method.to_string(),
                error,
            }),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(e),
        }
    }

    /// `list_dbs`
    pub async fn list_dbs(&self) -> Result<Vec<String>, OvsdbError> {
        let v = self.call("list_dbs", NoParams).await?;
        let arr = v.as_array().ok_or_else(|| {
            OvsdbError::Protocol(format!("list_dbs result is not an array: {}", brief(&v)))
        })?;
        arr.iter()
            .map(|d| {
                d.as_str().map(str::to_string).ok_or_else(|| {
                    OvsdbError::Protocol(format!("list_dbs: non-string entry {}", brief(d)))
                })
            })
            .collect()
    }

    /// `get_schema`: the database schema as JSON.
    pub async fn get_schema(&self, db: &str) -> Result<Value, OvsdbError> {
        let v = self.call("get_schema", (db,)).await?;
        if !v.is_object() {
            return Err(OvsdbError::Protocol(format!(
                "get_schema result is not an object: {}",
                brief(&v)
            )));
        }
        Ok(v)
    }

    /// `echo` (client to server); returns what the server echoed.
    pub async fn echo(&self, payload: Value) -> Result<Value, OvsdbError> {
        self.call("echo", payload).await
    }

    /// `transact`: runs `ops` atomically. A failed transaction becomes
    /// [`OvsdbError::TransactionFailed`] naming the failing operation.
    pub async fn transact(&self, db: &str, ops: Vec<Operation>) -> Result<Vec<OperationResult>, OvsdbError> {
        let v = self.call("transact", TransactParams { db, ops: &ops }).await?;
        let res = parse_transact_result(&ops, &v);
        if let Err(e) = &res {
            debug!(error = %e, "ovsdb transaction failed");
        }
        res
    }

    /// `monitor` (RFC 7047): full rows for each change.
    pub async fn monitor(
        &self,
        db: &str,
        requests: &BTreeMap<String, MonitorRequest>,
    ) -> Result<Monitor<TableUpdates>, OvsdbError> {
        self.start_monitor("monitor", "update", db, requests, false).await
    }

    /// `monitor_cond`: server-side filtering by `conditions`, diffs on modify.
    pub async fn monitor_cond(
        &self,
        db: &str,
        requests: &BTreeMap<String, MonitorRequest>,
    ) -> Result<Monitor<TableUpdates2>, OvsdbError> {
        self.start_monitor("monitor_cond", "update2", db, requests, true).await
    }

    async fn start_monitor<T: ParseUpdates>(
        &self,
        method: &'static str,
        notification: &'static str,
        db: &str,
        requests: &BTreeMap<String, MonitorRequest>,
        with_conditions: bool,
    ) -> Result<Monitor<T>, OvsdbError> {
        let n = self.inner.next_monitor.fetch_add(1, Ordering::Relaxed);
        let id = format!("mon{n}");
        let (tx, rx) = mpsc::channel::<T>(self.inner.options.monitor_buffer.max(1));
        let end = Arc::new(Mutex::new(None));
        let deliver: Deliver = Box::new(move |v: &Value| {
            let u = T::parse_updates(v).map_err(DeliverError::Parse)?;
            tx.try_send(u).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => DeliverError::Full,
                mpsc::error::TrySendError::Closed(_) => DeliverError::Closed,
            })
        });
        // Register before sending: the first update may be processed by the
        // reader right after the reply, before this task runs again.
        {
            let mut st = lock(&self.inner.state);
            if st.closed {
                return Err(OvsdbError::Disconnected);
            }
            st.monitors.insert(
                id.clone(),
                MonitorSlot {
                    method: notification,
                    deliver,
                    end: end.clone(),
                },
            );
        }
        let res = self
            .call(method, monitor_params(db, &id, requests, with_conditions))
            .await
            .and_then(|v| T::parse_updates(&v));
        match res {
            Ok(initial) => Ok(Monitor {
                id,
                initial,
                updates: MonitorStream { rx, end },
            }),
            Err(e) => {
                lock(&self.inner.state).monitors.remove(&id);
                Err(e)
            }
        }
    }

    /// `monitor_cancel`: stops the monitor; its stream ends with
    /// [`MonitorEnd::Cancelled`].
    pub async fn monitor_cancel(&self, id: &str) -> Result<(), OvsdbError> {
        if let Some(slot) = lock(&self.inner.state).monitors.remove(id) {
            set_end(&slot.end, MonitorEnd::Cancelled);
        }
        self.call("monitor_cancel", (id,)).await.map(|_| ())
    }
}

async fn writer_loop<W>(
    inner: Arc<Inner>,
    mut rx: mpsc::Receiver<Outgoing>,
    mut sink: FramedWrite<W, JsonCodec>,
) where
    W: AsyncWrite + Unpin + Send + 'static,
{
    loop {
        let msg = tokio::select! {
            _ = inner.closed.cancelled() => break,
            m = rx.recv() => m,
        };
        let Some(msg) = msg else { break };
        // Batch whatever else is queued into one flush.
        let mut res = sink.feed(msg).await;
        while res.is_ok() {
            match rx.try_recv() {
                Ok(m) => res = sink.feed(m).await,
                Err(_) => break,
            }
        }
        if res.is_ok() {
            res = SinkExt::<Outgoing>::flush(&mut sink).await;
        }
        if let Err(e) = res {
            warn!(error = %e, "ovsdb write failed; closing connection");
            break;
        }
    }
    let _ = SinkExt::<Outgoing>::close(&mut sink).await;
    inner.shutdown();
}

/// The inactivity probe (see [`ClientOptions::probe_interval`]): a server that stays silent
/// for one interval gets an `echo`; one silent for two intervals is declared dead.
async fn probe_loop(inner: Arc<Inner>, tx: mpsc::WeakSender<Outgoing>, interval: Duration) {
    let tick = (interval / 4).max(Duration::from_millis(10));
    let mut probing = false;
    loop {
        tokio::select! {
            _ = inner.closed.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
        }
        let idle = inner.idle();
        if idle >= interval * 2 {
            warn!(idle = ?idle, "ovsdb-server did not answer the inactivity probe; closing the connection");
            inner.shutdown();
            return;
        }
        if idle >= interval && !probing {
            probing = true;
            let Some(tx) = tx.upgrade() else { return };
            // The reply is matched by no pending call: it only refreshes `last_rx`.
            let id = Id::Probe(format!("probe-{}", inner.next_id.fetch_add(1, Ordering::Relaxed)));
            let Ok(msg) = encode(&Request { method: "echo", params: NoParams, id }) else { return };
            if tx.try_send(msg).is_err() {
                debug!("outgoing queue full; inactivity probe not sent this round");
            }
        } else if idle < interval {
            probing = false;
        }
    }
}

async fn reader_loop<R>(
    inner: Arc<Inner>,
    mut frames: FramedRead<R, JsonCodec>,
    tx: mpsc::WeakSender<Outgoing>,
) where
    R: AsyncRead + Unpin + Send + 'static,
{
    loop {
        let frame = tokio::select! {
            _ = inner.closed.cancelled() => break,
            f = frames.next() => f,
        };
        match frame {
            None => {
                debug!("ovsdb connection closed by peer");
                break;
            }
            Some(Err(e)) => {
                warn!(error = %e, "ovsdb read failed; closing connection");
                break;
            }
            Some(Ok(msg)) => {
                inner.touch();
                handle_message(&inner, &tx, msg).await
            }
        }
    }
    inner.shutdown();
}

/// Answers a request of the server.
async fn send_reply(tx: &mpsc::WeakSender<Outgoing>, reply: Reply<'_>) {
    let msg = match encode(&reply) {
        Ok(m) => m,
        Err(e) => return warn!(error = %e, "cannot answer an ovsdb request"),
    };
    if let Some(tx) = tx.upgrade() {
        let _ = tx.send(msg).await;
    }
}

async fn handle_message(inner: &Inner, tx: &mpsc::WeakSender<Outgoing>, msg: Value) {
    match Incoming::parse(msg) {
        Incoming::Request { method, params, id } => match method.as_str() {
            "echo" => {
                inner.echoes_answered.fetch_add(1, Ordering::Relaxed);
                trace!("answering ovsdb echo");
                send_reply(tx, Reply { result: &params, error: None, id: &id }).await;
            }
            "update" | "update2" => dispatch_update(inner, tx, &method, &params),
            other => {
                debug!(method = other, "ignoring unsupported ovsdb request/notification");
                if !id.is_null() {
                    let error = Some(format!("unknown method {other}"));
                    send_reply(tx, Reply { result: &Value::Null, error, id: &id }).await;
                }
            }
        },
        Incoming::Response { id, result, error } => handle_response(inner, id, result, error),
        Incoming::Invalid(why) => warn!(why, "ignoring an invalid JSON-RPC message"),
    }
}

fn handle_response(inner: &Inner, id: Value, result: Option<Value>, error: Option<Value>) {
    if id.as_str().is_some_and(|id| id.starts_with("probe-")) {
        trace!("inactivity probe answered");
        return;
    }
    let Some(id) = id.as_u64() else {
        warn!(id = %brief(&id), "ignoring response with unknown id");
        return;
    };
    let Some(waiter) = lock(&inner.state).pending.remove(&id) else {
        debug!(
            id,
            "response for no pending request (abandoned or fire-and-forget)"
        );
        return;
    };
    let reply = match (error, result) {
        (Some(error), _) => Err(OvsdbError::Rpc { method: String::new(), error }),
        (None, Some(r)) => Ok(r),
        (None, None) => Err(OvsdbError::Protocol(format!("response {id} has neither result nor error"))),
    };
    let _ = waiter.send(reply);
}

fn dispatch_update(inner: &Inner, tx: &mpsc::WeakSender<Outgoing>, method: &str, params: &Value) {
    let (mon_id, updates) = match params.as_array().map(Vec::as_slice) {
        Some([Value::String(id), updates, ..]) => (id.as_str(), updates),
        _ => {
            warn!(method, params = %brief(params), "ignoring malformed update notification");
            return;
        }
    };
    let mut st = lock(&inner.state);
    let Some(slot) = st.monitors.get_mut(mon_id) else {
        debug!(monitor = mon_id, "update for unknown (cancelled?) monitor");
        return;
    };
    if slot.method != method {
        warn!(
            monitor = mon_id,
            method, "unexpected notification type for monitor"
        );
        return;
    }
    let end = match (slot.deliver)(updates) {
        Ok(()) => return,
        Err(DeliverError::Full) => MonitorEnd::Overflow,
        Err(DeliverError::Closed) => MonitorEnd::Cancelled,
        Err(DeliverError::Parse(e)) => MonitorEnd::Protocol(e.to_string()),
    };
    warn!(monitor = mon_id, reason = ?end, "ending monitor");
    if let Some(slot) = st.monitors.remove(mon_id) {
        set_end(&slot.end, end);
    }
    drop(st);
    // Tell the server to stop sending; the reply is ignored.
    if let Some(tx) = tx.upgrade() {
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(msg) = encode(&Request { method: "monitor_cancel", params: (mon_id,), id: Id::Call(id) }) {
            let _ = tx.try_send(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::timeout;

    /// A scripted fake server on the other end of an in-memory pipe.
    struct Peer {
        frames: FramedRead<tokio::io::ReadHalf<DuplexStream>, JsonCodec>,
        wr: tokio::io::WriteHalf<DuplexStream>,
    }

    impl Peer {
        async fn recv(&mut self) -> Value {
            timeout(Duration::from_secs(5), self.frames.next())
                .await
                .expect("peer recv timed out")
                .expect("eof")
                .expect("bad frame")
        }
        async fn send_raw(&mut self, b: &[u8]) {
            self.wr.write_all(b).await.unwrap();
        }
        async fn send(&mut self, v: Value) {
            self.send_raw(v.to_string().as_bytes()).await;
        }
    }

    fn pair(opts: ClientOptions) -> (OvsdbClient, Peer) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let client = OvsdbClient::from_stream(a, opts);
        let (rd, wr) = tokio::io::split(b);
        (
            client,
            Peer {
                frames: FramedRead::new(rd, JsonCodec::default()),
                wr,
            },
        )
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn call_correlates_out_of_order_responses() {
        let (c, mut p) = pair(ClientOptions::default());
        let c2 = c.clone();
        let a = tokio::spawn(async move { c2.call("list_dbs", json!([])).await });
        let c3 = c.clone();
        let b = tokio::spawn(async move { c3.call("get_schema", json!(["x"])).await });
        let r1 = p.recv().await;
        let r2 = p.recv().await;
        // Answer in reverse order.
        for r in [&r2, &r1] {
            let m = r["method"].as_str().unwrap();
            p.send(json!({"id": r["id"], "result": m, "error": null}))
                .await;
        }
        assert_eq!(a.await.unwrap().unwrap(), json!("list_dbs"));
        assert_eq!(b.await.unwrap().unwrap(), json!("get_schema"));
    }

    #[tokio::test]
    async fn answers_echo() {
        let (c, mut p) = pair(ClientOptions::default());
        p.send(json!({"method": "echo", "params": ["hi"], "id": "echo"}))
            .await;
        let r = p.recv().await;
        assert_eq!(r, json!({"result": ["hi"], "error": null, "id": "echo"}));
        assert_eq!(c.echoes_answered(), 1);
    }

    #[tokio::test]
    async fn rpc_error_and_transaction_error_are_typed() {
        let (c, mut p) = pair(ClientOptions::default());
        let c2 = c.clone();
        let h = tokio::spawn(async move { c2.get_schema("nope").await });
        let r = p.recv().await;
        p.send(json!({"id": r["id"], "result": null, "error": {"error": "unknown database"}}))
            .await;
        match h.await.unwrap() {
            Err(OvsdbError::Rpc { method, error }) => {
                assert_eq!(method, "get_schema");
                assert_eq!(error["error"], "unknown database");
            }
            other => panic!("{other:?}"),
        }
        let c2 = c.clone();
        let h = tokio::spawn(async move {
            c2.transact(
                "Open_vSwitch",
                vec![crate::txn::insert("Port", Default::default(), None)],
            )
            .await
        });
        let r = p.recv().await;
        assert_eq!(r["params"][0], "Open_vSwitch");
        p.send(json!({"id": r["id"], "error": null, "result": [{"error": "constraint violation", "details": "bad name"}]})).await;
        match h.await.unwrap() {
            Err(OvsdbError::TransactionFailed {
                index: 0,
                op,
                error,
                details,
            }) => {
                assert_eq!(op, "insert");
                assert_eq!(error, "constraint violation");
                assert_eq!(details.as_deref(), Some("bad name"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn malformed_server_messages_never_panic() {
        let (c, mut p) = pair(ClientOptions::default());
        let c2 = c.clone();
        let h = tokio::spawn(async move { c2.list_dbs().await });
        let r = p.recv().await;
        // Junk that is valid JSON but not valid JSON-RPC is ignored.
        p.send(json!([1, 2, 3])).await;
        p.send(json!({"method": 5})).await;
        p.send(json!({"id": "zzz", "result": 1})).await;
        p.send(json!({"method": "update", "params": "x"})).await;
        p.send(json!({"method": "update", "params": ["mon99", {}]}))
            .await;
        // A result of the wrong shape is a typed protocol error.
        p.send(json!({"id": r["id"], "result": {"not": "a list"}, "error": null}))
            .await;
        assert!(matches!(h.await.unwrap(), Err(OvsdbError::Protocol(_))));
        // A response with neither result nor error.
        let c2 = c.clone();
        let h = tokio::spawn(async move { c2.list_dbs().await });
        let r = p.recv().await;
        p.send(json!({"id": r["id"]})).await;
        assert!(matches!(h.await.unwrap(), Err(OvsdbError::Protocol(_))));
        assert!(!c.is_closed());
        // Garbage bytes close the connection; pending calls fail.
        let c2 = c.clone();
        let h = tokio::spawn(async move { c2.list_dbs().await });
        let _ = p.recv().await;
        p.send_raw(b"garbage").await;
        assert!(matches!(
            timeout(T, h).await.unwrap().unwrap(),
            Err(OvsdbError::Disconnected)
        ));
        timeout(T, c.closed()).await.unwrap();
        assert!(matches!(c.list_dbs().await, Err(OvsdbError::Disconnected)));
    }

    #[tokio::test]
    async fn oversize_message_closes_connection() {
        let (c, mut p) = pair(ClientOptions {
            max_message_size: 1024,
            ..Default::default()
        });
        let c2 = c.clone();
        let h = tokio::spawn(async move { c2.list_dbs().await });
        let r = p.recv().await;
        let big = "x".repeat(4096);
        p.send(json!({"id": r["id"], "result": [big], "error": null}))
            .await;
        assert!(matches!(
            timeout(T, h).await.unwrap().unwrap(),
            Err(OvsdbError::Disconnected)
        ));
        assert!(c.is_closed());
    }

    #[tokio::test]
    async fn monitor_updates_and_disconnect() {
        let (c, mut p) = pair(ClientOptions::default());
        let c2 = c.clone();
        let h = tokio::spawn(async move {
            let mut reqs = BTreeMap::new();
            reqs.insert(
                "Interface".to_string(),
                MonitorRequest::columns(["name", "ofport"]),
            );
            c2.monitor("Open_vSwitch", &reqs).await
        });
        let r = p.recv().await;
        assert_eq!(r["method"], "monitor");
        assert_eq!(
            r["params"][2]["Interface"]["columns"],
            json!(["name", "ofport"])
        );
        let mon_id = r["params"][1].clone();
        // Reply, immediately followed by an update in the same write.
        let reply = json!({"id": r["id"], "error": null, "result": {"Interface": {"u1": {"new": {"name": "a", "ofport": 1}}}}});
        let upd = json!({"method": "update", "id": null, "params": [mon_id, {"Interface": {"u1": {"old": {"ofport": 1}, "new": {"name": "a", "ofport": 2}}}}]});
        p.send_raw(format!("{reply}{upd}").as_bytes()).await;
        let mut m = h.await.unwrap().unwrap();
        assert_eq!(
            m.initial["Interface"]["u1"].new.as_ref().unwrap()["ofport"],
            1
        );
        let u = timeout(T, m.updates.recv()).await.unwrap().unwrap();
        assert_eq!(u["Interface"]["u1"].old.as_ref().unwrap()["ofport"], 1);
        assert_eq!(u["Interface"]["u1"].new.as_ref().unwrap()["ofport"], 2);
        // Disconnect ends the stream.
        drop(p);
        assert!(timeout(T, m.updates.recv()).await.unwrap().is_none());
        assert_eq!(m.updates.end_reason(), Some(MonitorEnd::Disconnected));
        assert!(c.is_closed());
    }

    #[tokio::test]
    async fn monitor_overflow_and_bad_update_end_stream() {
        let (c, mut p) = pair(ClientOptions {
            monitor_buffer: 2,
            ..Default::default()
        });
        let c2 = c.clone();
        let h = tokio::spawn(async move {
            let reqs: BTreeMap<_, _> = [("Bridge".to_string(), MonitorRequest::default())].into();
            c2.monitor_cond("Open_vSwitch", &reqs).await
        });
        let r = p.recv().await;
        let id = r["params"][1].clone();
        p.send(json!({"id": r["id"], "error": null, "result": {}}))
            .await;
        let mut m = h.await.unwrap().unwrap();
        for i in 0..3 {
            p.send(json!({"method": "update2", "params": [id, {"Bridge": {"u": {"modify": {"n": i}}}}]})).await;
        }
        // The client asks the server to cancel the overflowing monitor.
        let cancel = p.recv().await;
        assert_eq!(cancel["method"], "monitor_cancel");
        assert_eq!(cancel["params"][0], id);
        let mut got = vec![];
        while let Some(u) = timeout(T, m.updates.recv()).await.unwrap() {
            got.push(u);
        }
        assert_eq!(got.len(), 2);
        assert_eq!(m.updates.end_reason(), Some(MonitorEnd::Overflow));

        // A malformed update2 ends a monitor with a protocol reason.
        let c2 = c.clone();
        let h = tokio::spawn(async move {
            let reqs: BTreeMap<_, _> = [("Bridge".to_string(), MonitorRequest::default())].into();
            c2.monitor_cond("Open_vSwitch", &reqs).await
        });
        let r = p.recv().await;
        let id = r["params"][1].clone();
        p.send(json!({"id": r["id"], "error": null, "result": {"Bridge": {"u": {"initial": {"name": "br0"}}}}})).await;
        let mut m = h.await.unwrap().unwrap();
        assert_eq!(
            m.initial["Bridge"]["u"],
            RowUpdate2::Initial(json!({"name": "br0"}).as_object().unwrap().clone())
        );
        p.send(json!({"method": "update2", "params": [id, {"Bridge": {"u": {"frobnicate": {}}}}]}))
            .await;
        assert!(timeout(T, m.updates.recv()).await.unwrap().is_none());
        assert!(matches!(
            m.updates.end_reason(),
            Some(MonitorEnd::Protocol(_))
        ));
        assert!(!c.is_closed());
    }

    #[tokio::test]
    async fn dropping_all_clients_closes_socket() {
        let (a, mut b) = tokio::io::duplex(1024);
        let c = OvsdbClient::from_stream(a, ClientOptions::default());
        drop(c);
        let mut buf = [0u8; 16];
        let n = timeout(T, b.read(&mut buf)).await.unwrap().unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn bad_addresses() {
        for a in [
            "",
            "unix:",
            "tcp:",
            "tcp:host",
            "tcp:host:notaport",
            "ssl:1.2.3.4:6640",
        ] {
            assert!(
                matches!(
                    OvsdbClient::connect(a).await,
                    Err(OvsdbError::InvalidAddress(_))
                ),
                "{a}"
            );
        }
        assert!(matches!(
            OvsdbClient::connect("unix:/nonexistent/db.sock").await,
            Err(OvsdbError::Connect { .. })
        ));
    }
}
