//! One long-lived monitor of the `Interface` and `Port` tables per connection: waiting for a
//! new port's ofport then costs no `monitor_cond`/`monitor_cancel` round trips per port, any
//! number of concurrent waiters share one stream of notifications, and removing a port needs
//! no read first (its row's uuid and QoS are known here; the removal's transaction checks them
//! with a `wait`, so a stale copy can only make it fall back to reading).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::OvsdbClient;
use crate::datum::{Ref, Uuid};
use crate::mirror::{self, lock, Mirror};
use crate::monitor::{MonitorEnd, MonitorRequest, TableUpdates};
use crate::rows::{Interface, Port, Table};
use crate::OvsdbError;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Iface {
    name: String,
    ofport: Option<i64>,
    error: Option<String>,
}

/// What a port removal needs to know of a `Port` row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortRow {
    pub uuid: Uuid,
    /// The row's `qos` (a root-table row that has to be destroyed with the port).
    pub qos: Option<Uuid>,
}

#[derive(Debug, Default)]
struct State {
    by_uuid: HashMap<String, Iface>,
    by_name: HashMap<String, String>,
    /// Port rows: uuid → (name, qos), and name → uuid.
    ports: HashMap<String, (String, Option<Uuid>)>,
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
            // A row that does not parse, or whose qos is unknown, is left out: removing the
            // port then reads it.
            let Ok(port) = Port::from_row(new) else { continue };
            let Ok(name) = port.name().cloned() else { continue };
            let qos = match port.qos() {
                Ok(None) => None,
                Ok(Some(Ref::Uuid(q))) => Some(q.clone()),
                _ => continue,
            };
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
            let Ok(row) = Interface::from_row(new) else { continue };
            let Ok(name) = row.name().cloned() else { continue };
            let iface = Iface {
                name: name.clone(),
                ofport: row.ofport.flatten(),
                error: row.error.flatten(),
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
                (Interface::TABLE.to_string(), MonitorRequest::columns([Interface::NAME, Interface::OFPORT, Interface::ERROR])),
                (Port::TABLE.to_string(), MonitorRequest::columns([Port::NAME, Port::QOS])),
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
        Some(PortRow { uuid: Uuid::new(uuid.clone()), qos: qos.clone() })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::RowUpdate;
    use crate::rows::fixtures;
    use serde_json::json;

    fn update(table: &str, uuid: &str, new: Option<serde_json::Value>) -> TableUpdates {
        let new = new.map(|v| v.as_object().unwrap().clone());
        [(table.to_string(), [(uuid.to_string(), RowUpdate { old: None, new })].into())].into()
    }

    fn watch(state: State) -> (InterfaceWatch, watch::Sender<u64>) {
        let (tx, changed) = watch::channel(0);
        (InterfaceWatch { state: Arc::new(Mutex::new(state)), changed }, tx)
    }

    #[tokio::test]
    async fn ofports_and_ports_from_a_real_servers_rows() {
        let mut st = State::default();
        for r in fixtures::rows(fixtures::INTERFACE) {
            let uuid = r["_uuid"][1].as_str().unwrap().to_string();
            st.apply(&update("Interface", &uuid, Some(serde_json::Value::Object(r))));
        }
        for r in fixtures::rows(fixtures::PORT) {
            let uuid = r["_uuid"][1].as_str().unwrap().to_string();
            st.apply(&update("Port", &uuid, Some(serde_json::Value::Object(r))));
        }
        let (w, _tx) = watch(st);
        let soon = Instant::now() + std::time::Duration::from_millis(50);
        assert_eq!(w.ofport("vxlan0", soon).await.unwrap(), 1);
        assert_eq!(w.ofport("br0", soon).await.unwrap(), 65534);
        match w.ofport("bad", soon).await {
            Err(OvsdbError::InterfaceError { name, error }) => {
                assert_eq!(name, "bad");
                assert!(error.contains("could not open network device"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(w.ofport("nosuch", soon).await, Err(OvsdbError::Timeout(_))));
        let veth = w.port("veth1").unwrap();
        assert_eq!(veth.uuid.as_str(), "50ce6a0f-7aa8-4f5e-a077-c6235a738af8");
        assert_eq!(veth.qos.as_ref().map(Uuid::as_str), Some("102af878-0c8c-47e4-8c5e-0ca76ca36a90"));
        assert_eq!(w.port("tun0").unwrap().qos, None);
    }

    #[tokio::test]
    async fn a_waiter_sees_the_ofport_when_it_arrives_and_bad_rows_are_skipped() {
        let mut st = State::default();
        st.apply(&update("Interface", "i1", Some(json!({"name": "veth1", "ofport": ["set", []], "error": ["set", []]}))));
        // Malformed: left out (never a panic), and a port whose qos is unreadable is unknown.
        st.apply(&update("Interface", "i2", Some(json!({"name": "veth2", "ofport": "x", "error": ["set", []]}))));
        st.apply(&update("Port", "p1", Some(json!({"name": "veth1", "qos": ["set", [["uuid", "a"], ["uuid", "b"]]]}))));
        let (w, tx) = watch(st);
        assert!(w.port("veth1").is_none());
        let later = Instant::now() + std::time::Duration::from_secs(5);
        let waiter = tokio::spawn({
            let w = w.clone();
            async move { w.ofport("veth1", later).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        lock(&w.state).apply(&update("Interface", "i1", Some(json!({"name": "veth1", "ofport": 7, "error": ["set", []]}))));
        tx.send_modify(|n| *n += 1);
        assert_eq!(waiter.await.unwrap().unwrap(), 7);
        // A deleted row is forgotten; an ended monitor answers nothing.
        lock(&w.state).apply(&update("Interface", "i1", None));
        assert!(lock(&w.state).by_name.is_empty());
        lock(&w.state).ended(MonitorEnd::Disconnected);
        assert!(!w.is_live());
        assert!(matches!(w.ofport("veth1", later).await, Err(OvsdbError::Disconnected)));
    }
}
