//! A monitor mirrored in memory, the shape [`super::ifwatch`] and [`super::sentinel`] share:
//! the initial rows applied before the caller goes on, every notification applied as it
//! arrives with a counter bumped after it, and why the monitor ended recorded in the mirror.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tracing::debug;

use crate::client::OvsdbClient;
use crate::monitor::{MonitorEnd, MonitorRequest, TableUpdates};
use crate::{OvsdbError, VSWITCH_DB};

/// Rows kept from a monitor's notifications.
pub(crate) trait Mirror: Send + 'static {
    fn apply(&mut self, updates: &TableUpdates);
    /// The monitor ended: what the mirror holds is stale from now on.
    fn ended(&mut self, why: MonitorEnd);
}

/// The mirror's lock; a panic while it was held leaves rows that are still usable.
pub(crate) use crate::lock;

/// Monitors `requests` into `mirror`; the receiver's value is bumped after every applied
/// notification, and once more when the monitor ends. `what` names the monitor in the log.
pub(crate) async fn start<M: Mirror>(
    client: &OvsdbClient,
    requests: &BTreeMap<String, MonitorRequest>,
    mirror: Arc<Mutex<M>>,
    what: &'static str,
) -> Result<watch::Receiver<u64>, OvsdbError> {
    let mut mon = client.monitor(VSWITCH_DB, requests).await?;
    lock(&mirror).apply(&mon.initial);
    let (tx, changed) = watch::channel(0u64);
    tokio::spawn(async move {
        while let Some(u) = mon.updates.recv().await {
            lock(&mirror).apply(&u);
            tx.send_modify(|n| *n += 1);
        }
        let why = mon.updates.end_reason().unwrap_or(MonitorEnd::Disconnected);
        debug!(?why, monitor = what, "OVSDB monitor ended");
        lock(&mirror).ended(why);
        tx.send_modify(|n| *n += 1);
    });
    Ok(changed)
}
