//! The HTTP server under the pod API socket and the metrics listener, with the limits that
//! keep one caller from starving the others (or the agent) of file descriptors:
//!
//! - **A cap on open connections per listener.** The backlog is always drained (a full
//!   backlog would queue a kubelet probe or the CNI plugin behind an attacker's connections);
//!   at the cap, the *oldest idle* connection (no request in progress: a slow-loris that never
//!   finishes its headers, or a keep-alive client between requests) is closed to make room,
//!   and only if every one is busy is the new one closed instead. The metrics listener, which
//!   any local user can reach, gets a small share; the pod API socket (root only) a larger
//!   one; together they stay well inside the 1,024 descriptors a default limit gives.
//! - **A header timeout**, which in hyper also bounds the idle time of a kept-alive connection
//!   between requests, and a body timeout (the pod API's handlers read bodies under
//!   [`read_body`]).
//! - The socket file is never reachable by anyone but root while it is being set up (see
//!   [`bind_private_unix`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::{debug, warn};

use crate::metrics::{ListenerLabel, Metrics, ShedLabel};

/// How one listener is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most.
    pub max_connections: usize,
    /// From the connection's start (or the end of the previous response) to the end of the
    /// request's headers.
    pub header_timeout: Duration,
    /// For the request body, once the headers are in.
    pub body_timeout: Duration,
}

/// The pod API socket (root only: kubelet's CNI plugin, `sdn-node trace`, operators). A pod
/// setup holds its connection for up to the request timeout, so this is the number of setups
/// that can wait at once.
pub const POD_API: Limits =
    Limits { max_connections: 128, header_timeout: Duration::from_secs(10), body_timeout: Duration::from_secs(10) };

/// The metrics listener (any local user; scrapes and kubelet probes take milliseconds).
pub const METRICS: Limits =
    Limits { max_connections: 16, header_timeout: Duration::from_secs(5), body_timeout: Duration::from_secs(5) };

/// A listener of either kind.
pub trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<Self::Io>>;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<Self::Io>> {
        tokio::net::TcpListener::poll_accept(self, cx).map_ok(|(s, _)| {
            let _ = s.set_nodelay(true);
            s
        })
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<Self::Io>> {
        tokio::net::UnixListener::poll_accept(self, cx).map_ok(|(s, _)| s)
    }
}

/// One open connection: whether a request is in progress on it, and how to close it.
struct Conn {
    busy: Arc<AtomicUsize>,
    close: Option<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Default)]
struct Table {
    next: u64,
    /// By accept order: the first idle one is the oldest.
    open: BTreeMap<u64, Conn>,
}

/// What the accept loop did with a new connection when the listener was full.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    Room,
    /// Made room by closing this idle connection.
    Evicted(u64),
    /// Every connection is busy.
    Full,
}

fn admit(t: &mut Table, max: usize) -> Admit {
    if t.open.len() < max {
        return Admit::Room;
    }
    let idle = t.open.iter().find(|(_, c)| c.busy.load(Ordering::Acquire) == 0).map(|(id, _)| *id);
    match idle {
        Some(id) => {
            if let Some(mut c) = t.open.remove(&id) {
                if let Some(tx) = c.close.take() {
                    let _ = tx.send(());
                }
            }
            Admit::Evicted(id)
        }
        None => Admit::Full,
    }
}

/// Counts a request in progress on its connection while alive.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(c: &Arc<AtomicUsize>) -> Busy {
        c.fetch_add(1, Ordering::AcqRel);
        Busy(c.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves; then stops accepting,
/// lets the requests in progress finish, and returns when every connection is closed.
/// `name` labels the metrics and logs (pod_api, metrics).
pub async fn serve<L: Listener>(
    listener: L,
    app: Router,
    limits: Limits,
    name: &'static str,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let table = Arc::new(Mutex::new(Table::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let drained = Arc::new(tokio::sync::Notify::new());
    let gauge = metrics.api_connections.get_or_create(&ListenerLabel { listener: name.into() }).clone();
    let shed = |why: &str| {
        metrics.api_connections_shed.get_or_create(&ShedLabel { listener: name.into(), why: why.into() }).inc()
    };
    tokio::pin!(shutdown);
    let mut last_accept_error = None::<tokio::time::Instant>;
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            r = std::future::poll_fn(|cx| listener.poll_accept(cx)) => r,
        };
        let io = match accepted {
            Ok(io) => io,
            Err(e) => {
                // EMFILE/ENFILE: the connection stays in the backlog; wait a little rather
                // than spin. Logged at most once a minute.
                if last_accept_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    warn!(listener = name, error = %e, "accept failed");
                    last_accept_error = Some(tokio::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (id, busy, close_rx) = {
            let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
            match admit(&mut t, limits.max_connections) {
                Admit::Room => {}
                Admit::Evicted(old) => {
                    shed("evicted_idle");
                    debug!(
                        listener = name,
                        connection = old,
                        "at the connection cap: closed the oldest idle connection"
                    );
                }
                Admit::Full => {
                    shed("refused");
                    debug!(listener = name, "at the connection cap with every connection busy: closed the new one");
                    drop(io);
                    continue;
                }
            }
            let id = t.next;
            t.next += 1;
            let busy = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = tokio::sync::oneshot::channel();
            t.open.insert(id, Conn { busy: busy.clone(), close: Some(tx) });
            gauge.set(t.open.len() as i64);
            (id, busy, rx)
        };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let guard = Busy::enter(&busy);
            let fut = hyper::service::Service::call(&svc, req);
            async move {
                let r = fut.await;
                drop(guard);
                r
            }
        });
        let (table, drained, gauge, mut stop) = (table.clone(), drained.clone(), gauge.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .keep_alive(true)
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                // Evicted: dropping the connection closes the socket.
                _ = close_rx => {}
                _ = async { drop(stop.wait_for(|s| *s).await) } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
            t.open.remove(&id);
            gauge.set(t.open.len() as i64);
            if t.open.is_empty() {
                drained.notify_waiters();
            }
        });
    }
    let _ = stop_tx.send(true);
    loop {
        let wait = drained.notified();
        if table.lock().unwrap_or_else(|e| e.into_inner()).open.is_empty() {
            return Ok(());
        }
        wait.await;
    }
}

/// Reads a request body of at most `limit` bytes within `timeout` (a client that trickles
/// its body holds a connection slot; this bounds for how long).
pub async fn read_body(body: axum::body::Body, limit: usize, timeout: Duration) -> Result<axum::body::Bytes, String> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, limit);
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(format!("request body: not received within {timeout:?}")),
        Ok(Err(e)) => Err(format!("request body: {e}")),
        Ok(Ok(b)) => Ok(b.to_bytes()),
    }
}

/// Binds a unix socket at `path` that nobody but its owner (root) can ever connect to before
/// it is mode 0600: it is bound inside a fresh directory of mode 0700 next to `path`, made
/// 0600 there, and only then renamed into place (a rename keeps the listening socket). The
/// directory of `path` is created with mode 0700 if missing. A stale socket at `path` is
/// replaced.
pub fn bind_private_unix(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let file = path.file_name().ok_or_else(|| std::io::Error::other(format!("{}: no file name", path.display())))?;
    let private = dir.join(format!(".{}.{}.d", file.to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let result = (|| {
        // The mode of a new directory is masked by the umask: set it explicitly.
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
        let tmp = private.join("sock");
        let listener = tokio::net::UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(t: &mut Table, busy: usize) -> (u64, tokio::sync::oneshot::Receiver<()>) {
        let id = t.next;
        t.next += 1;
        let (tx, rx) = tokio::sync::oneshot::channel();
        t.open.insert(id, Conn { busy: Arc::new(AtomicUsize::new(busy)), close: Some(tx) });
        (id, rx)
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room() {
        let mut t = Table::default();
        assert_eq!(admit(&mut t, 3), Admit::Room);
        let (_, _busy0) = conn(&mut t, 1);
        let (idle1, mut rx1) = conn(&mut t, 0);
        let (_, mut rx2) = conn(&mut t, 0);
        assert_eq!(admit(&mut t, 3), Admit::Evicted(idle1), "the busy one is older but kept");
        assert!(rx1.try_recv().is_ok(), "the evicted connection is told to close");
        assert!(rx2.try_recv().is_err(), "the younger idle one is not");
        assert_eq!(t.open.len(), 2);
        assert_eq!(admit(&mut t, 3), Admit::Room);
        // All busy: the new one is refused and nobody is closed.
        let mut t = Table::default();
        let (_, _a) = conn(&mut t, 1);
        let (_, _b) = conn(&mut t, 2);
        assert_eq!(admit(&mut t, 2), Admit::Full);
        assert_eq!(t.open.len(), 2);
    }

    #[tokio::test]
    async fn the_socket_is_private_before_it_is_in_place() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("sub/dir/api.sock");
        let l = bind_private_unix(&path).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700,
            "a missing directory is made 0700"
        );
        // Nothing left next to it, and it answers where it was renamed to.
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("api.sock")]);
        let c = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        drop((c, s));
        // A second bind replaces the stale file.
        drop(l);
        let _l = bind_private_unix(&path).unwrap();
        tokio::net::UnixStream::connect(&path).await.unwrap();
    }
}
