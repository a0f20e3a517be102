//! Keeps an OpenFlow connection up: reconnects with capped exponential backoff and reports
//! every transition, so the agent can resync after the switch restarts.
//!
//! A connection can need set-up that must come before anyone uses it: the audit log's meter
//! has to exist before the flows that name it (OVS 3.1 resolves `controller(meter_id=N)` when
//! a flow is added; a flow added first stays unmetered for its lifetime). An [`OnConnect`]
//! hook runs on every new connection before it is published (`current`, `connected`,
//! [`SwitchEvent::Connected`]), so the engine's resync, which waits for the event, always
//! comes after it. The hook has a deadline ([`ON_CONNECT_DEADLINE`]): a hook that hangs
//! delays the connection's use by that much, never forever.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{CloseReason, Switch, SwitchError, SwitchOptions, Target};

/// Reconnect delays: `initial`, doubled after each failure, at most `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(5) }
    }
}

impl Backoff {
    /// The delay before attempt `n` (0-based) after a failure.
    pub fn delay(&self, n: u32) -> Duration {
        let f = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(f).min(self.max)
    }
}

/// Set-up run on each new connection before it is published; its own failures are its own to
/// report (it returns nothing: the connection is published either way).
pub type OnConnect = Arc<dyn Fn(Switch) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// How long an [`OnConnect`] hook may hold a new connection back.
pub const ON_CONNECT_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub enum SwitchEvent {
    /// A new connection is up (after start or after a disconnect): the switch may have lost or
    /// changed its flows; resync.
    Connected(Switch),
    Disconnected(CloseReason),
}

/// Owns the reconnect loop; dropping it stops the loop and closes the connection.
pub struct Supervisor {
    current: watch::Receiver<Option<Switch>>,
    events: broadcast::Sender<SwitchEvent>,
    cancel: CancellationToken,
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Supervisor {
    /// Starts connecting in the background.
    pub fn spawn(target: &str, opts: SwitchOptions, backoff: Backoff) -> Result<Supervisor, SwitchError> {
        Supervisor::spawn_with(target, opts, backoff, None)
    }

    /// Starts connecting in the background; `on_connect` runs on every new connection before
    /// it is published.
    pub fn spawn_with(target: &str, opts: SwitchOptions, backoff: Backoff, on_connect: Option<OnConnect>) -> Result<Supervisor, SwitchError> {
        let target = Target::parse(target)?;
        let (cur_tx, current) = watch::channel(None);
        let (events, _) = broadcast::channel(64);
        let cancel = CancellationToken::new();
        let link = Link { target, opts, backoff, on_connect, current: Arc::new(cur_tx), events: events.clone() };
        tokio::spawn(run(link, cancel.clone()));
        Ok(Supervisor { current, events, cancel })
    }

    /// Subscribe before waiting, to not miss a transition.
    pub fn subscribe(&self) -> broadcast::Receiver<SwitchEvent> {
        self.events.subscribe()
    }

    /// The live connection, if any.
    pub fn current(&self) -> Option<Switch> {
        self.current.borrow().clone().filter(|s| !s.is_closed())
    }

    /// The live connection as a receiver, for a task that cannot borrow the supervisor (read
    /// it as [`Supervisor::current`] does: a closed connection is none).
    pub fn watch_current(&self) -> watch::Receiver<Option<Switch>> {
        self.current.clone()
    }

    /// Waits until a connection is up.
    pub async fn connected(&self) -> Switch {
        let mut rx = self.current.clone();
        loop {
            if let Some(s) = rx.borrow_and_update().clone().filter(|s| !s.is_closed()) {
                return s;
            }
            if rx.changed().await.is_err() {
                // The loop ended (supervisor dropped); never resolves.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// What the reconnect loop works with.
struct Link {
    target: Target,
    opts: SwitchOptions,
    backoff: Backoff,
    on_connect: Option<OnConnect>,
    current: Arc<watch::Sender<Option<Switch>>>,
    events: broadcast::Sender<SwitchEvent>,
}

async fn run(link: Link, cancel: CancellationToken) {
    let Link { target, opts, backoff, on_connect, current, events } = link;
    let mut failures = 0u32;
    loop {
        let attempt = tokio::select! {
            _ = cancel.cancelled() => break,
            r = Switch::connect_target(target.clone(), opts.clone()) => r,
        };
        match attempt {
            Ok(sw) => {
                failures = 0;
                info!(%target, dpid = format!("{:016x}", sw.features().datapath_id), "connected to the switch");
                if let Some(hook) = &on_connect {
                    tokio::select! {
                        _ = cancel.cancelled() => { sw.close(); break }
                        r = tokio::time::timeout(ON_CONNECT_DEADLINE, hook(sw.clone())) => if r.is_err() {
                            warn!(%target, deadline = ?ON_CONNECT_DEADLINE, "connection set-up did not finish in time; using the connection anyway");
                        }
                    }
                }
                current.send_replace(Some(sw.clone()));
                let _ = events.send(SwitchEvent::Connected(sw.clone()));
                let reason = tokio::select! {
                    _ = cancel.cancelled() => { sw.close(); break }
                    r = sw.closed() => r,
                };
                warn!(%target, %reason, "lost the switch connection; reconnecting");
                current.send_replace(None);
                let _ = events.send(SwitchEvent::Disconnected(reason));
            }
            Err(e) => {
                let d = backoff.delay(failures);
                failures = failures.saturating_add(1);
                if failures == 1 || failures.is_multiple_of(20) {
                    warn!(%target, error = %e, retry_in = ?d, "cannot connect to the switch");
                }
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(d) => {}
                }
            }
        }
    }
    if let Some(sw) = current.send_replace(None) {
        sw.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped() {
        let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(5) };
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(3), Duration::from_millis(800));
        assert_eq!(b.delay(10), Duration::from_secs(5));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(5));
    }
}
