//! One long-lived monitor of the `Interface` and `Port` tables per connection: waiting for a
//! new port's ofport then costs no `monitor_cond`/`monitor_cancel` round trips per port, any
//! number of concurrent waiters share one stream of notifications, and removing a port needs
//! no read first (its row's uuid and QoS are known here; the removal's transaction checks them
//! with a `wait`, so a stale copy can only make it fall back to reading).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use super::client::{MonitorEnd, MonitorRequest, OvsdbClient, TableUpdates};
use super::mirror::{self, lock, Mirror};
use super::types::{row_opt_i64, row_opt_string, row_opt_uuid, row_string};
use super::OvsdbError;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Iface {
    name: String,
    ofport: Option<i64>,
    error: Option<String>,
}

/// What a port removal needs to know of a `Port` row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortRow {
    pub uuid: String,
    /// The row's `qos` (a root-table row that has to be destroyed with the port).
    pub qos: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    by_uuid: HashMap<String, Iface>,
    by_name: HashMap<String, String>,
    /// Port rows: uuid → (name, qos), and name → uuid.
    ports: HashMap<String, (String, Option<String>)>,
    port_by_name: HashMap<String, String>,
    /// Why the monitor ended (the watch is then useless: a new one must be started).
    ended: Option<MonitorEnd>,
}

/// The `Interface` rows' names, ofports and errors, kept current.
#[derive(Debug, Clone)]
pub struct InterfaceWatch {
    state: Arc<Mutex<State>>,
    /// Bumped after every applied notification.
    changed: watch::Receiver<u64>,
}

impl Mirror for State {
    fn ended(&mut self, why: MonitorEnd) {
        self.ended = Some(why);
    }

    fn apply(&mut self, updates: &TableUpdates) {
        for (uuid, u) in updates.get("Port").into_iter().flatten() {
            if let Some((old, _)) = self.ports.remove(uuid) {
                if self.port_by_name.get(&old) == Some(uuid) {
                    self.port_by_name.remove(&old);
                }
            }
            let Some(new) = &u.new else { continue };
            let Ok(name) = row_string(new, "name") else { continue };
            // An unreadable qos is "unknown": the port is left out, and removing it reads.
            let Ok(qos) = row_opt_uuid(new, "qos") else { continue };
            self.port_by_name.insert(name.clone(), uuid.clone());
            self.ports.insert(uuid.clone(), (name, qos));
        }
        let Some(rows) = updates.get("Interface") else { return };
        for (uuid, u) in rows {
            if let Some(old) = self.by_uuid.remove(uuid) {
                if self.by_name.get(&old.name) == Some(uuid) {
                    self.by_name.remove(&old.name);
                }
            }
            let Some(new) = &u.new else { continue };
            // A row that does not parse is left out (never a panic on server data).
            let Ok(name) = row_string(new, "name") else { continue };
            let iface = Iface {
                name: name.clone(),
                ofport: row_opt_i64(new, "ofport").ok().flatten(),
                error: row_opt_string(new, "error").ok().flatten(),
            };
            self.by_name.insert(name, uuid.clone());
            self.by_uuid.insert(uuid.clone(), iface);
        }
    }
}

impl InterfaceWatch {
    /// Starts the monitor (its initial contents are applied before this returns).
    pub async fn start(client: &OvsdbClient) -> Result<InterfaceWatch, OvsdbError> {
        let reqs: BTreeMap<String, MonitorRequest> =
            [
                ("Interface".to_string(), MonitorRequest::columns(["name", "ofport", "error"])),
                ("Port".to_string(), MonitorRequest::columns(["name", "qos"])),
            ]
            .into();
        let state = Arc::new(Mutex::new(State::default()));
        let changed = mirror::start(client, &reqs, state.clone(), "interface watch").await?;
        Ok(InterfaceWatch { state, changed })
    }

    /// False once the monitor has ended (start a new one).
    pub fn is_live(&self) -> bool {
        lock(&self.state).ended.is_none()
    }

    /// The `Port` row named `name` as last notified (None: unknown, or the monitor ended).
    pub fn port(&self, name: &str) -> Option<PortRow> {
        let st = lock(&self.state);
        if st.ended.is_some() {
            return None;
        }
        let uuid = st.port_by_name.get(name)?;
        let (_, qos) = st.ports.get(uuid)?;
        Some(PortRow { uuid: uuid.clone(), qos: qos.clone() })
    }

    /// Waits until interface `name` has an ofport (or fails with `Interface.error` when OVS
    /// could not create it), until `deadline`.
    pub async fn ofport(&self, name: &str, deadline: Instant) -> Result<u32, OvsdbError> {
        let mut changed = self.changed.clone();
        loop {
            {
                let st = lock(&self.state);
                if let Some(i) = st.by_name.get(name).and_then(|u| st.by_uuid.get(u)) {
                    match i.ofport {
                        Some(-1) => {
                            return Err(OvsdbError::InterfaceError {
                                name: name.to_string(),
                                error: i.error.clone().unwrap_or_else(|| "ofport is -1 (no error reported)".into()),
                            })
                        }
                        Some(p) if p > 0 => {
                            return u32::try_from(p).map_err(|_| OvsdbError::Protocol(format!("ofport {p} out of range")));
                        }
                        _ => {}
                    }
                }
                if let Some(end) = &st.ended {
                    return Err(match end {
                        MonitorEnd::Disconnected => OvsdbError::Disconnected,
                        other => OvsdbError::Protocol(format!("interface monitor ended: {other:?}")),
                    });
                }
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Err(_) => return Err(OvsdbError::Timeout(format!("waiting for an ofport for interface {name:?}"))),
                Ok(Err(_)) => return Err(OvsdbError::Disconnected),
                Ok(Ok(())) => {}
            }
        }
    }
}
