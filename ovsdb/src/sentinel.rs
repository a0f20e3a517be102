//! A long-lived monitor of what the node owns in OVSDB — the bridges, their ports and
//! interfaces, the QoS rows — kept as a typed [`Snapshot`], so that the reconciler notices
//! within a notification what someone else removed or changed (`ovs-vsctl del-br`, a deleted
//! pod port, a changed `fail_mode`, a wiped database) and can compare it with its model without
//! reading anything back. Every change (ours included) bumps [`Sentinel::changed`]; checking the
//! snapshot against the model is pure (the agent's `reconcile::repair`), so our own writes cost a
//! comparison and nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::client::{MonitorEnd, MonitorRequest, OvsdbClient, TableUpdates};
use super::mirror::{self, lock, Mirror};
use super::types::{row_opt_i64, row_opt_string, row_opt_uuid, row_string, row_string_map, row_string_set, row_uuid_set, Row};
use super::OvsdbError;

/// A `Bridge` row, with its ports by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BridgeRow {
    pub fail_mode: Option<String>,
    pub protocols: BTreeSet<String>,
    pub datapath_type: String,
    pub external_ids: BTreeMap<String, String>,
    /// The names of the bridge's ports (ports whose rows are not known yet are left out).
    pub ports: BTreeSet<String>,
}

/// A `Port` row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortRow {
    pub external_ids: BTreeMap<String, String>,
    /// Whether the port references a QoS row that exists.
    pub has_qos: bool,
}

/// An `Interface` row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceRow {
    pub iface_type: String,
    pub options: BTreeMap<String, String>,
    pub ofport_request: Option<i64>,
    pub mac: Option<String>,
    pub ingress_policing_rate: Option<i64>,
}

/// What OVSDB holds, as the last notification left it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Whether the root `Open_vSwitch` row exists.
    pub root: bool,
    /// Bridges by name, only those the root row references (others are garbage).
    pub bridges: BTreeMap<String, BridgeRow>,
    pub ports: BTreeMap<String, PortRow>,
    pub interfaces: BTreeMap<String, InterfaceRow>,
}

/// The raw rows, by table and uuid (server data: anything may be malformed).
#[derive(Debug, Default)]
struct Rows {
    tables: HashMap<String, HashMap<String, Row>>,
    ended: Option<MonitorEnd>,
}

const COLUMNS: [(&str, &[&str]); 5] = [
    ("Open_vSwitch", &["bridges"]),
    ("Bridge", &["name", "fail_mode", "protocols", "datapath_type", "external_ids", "ports"]),
    ("Port", &["name", "external_ids", "qos"]),
    ("Interface", &["name", "type", "options", "ofport_request", "mac", "ingress_policing_rate"]),
    ("QoS", &["type"]),
];

impl Mirror for Rows {
    fn ended(&mut self, why: MonitorEnd) {
        self.ended = Some(why);
    }

    fn apply(&mut self, updates: &TableUpdates) {
        for (table, rows) in updates {
            let t = self.tables.entry(table.clone()).or_default();
            for (uuid, u) in rows {
                match &u.new {
                    // v1 monitors send every monitored column in `new`.
                    Some(new) => {
                        t.insert(uuid.clone(), new.clone());
                    }
                    None => {
                        t.remove(uuid);
                    }
                }
            }
        }
    }
}

impl Rows {
    fn table(&self, name: &str) -> impl Iterator<Item = (&String, &Row)> {
        self.tables.get(name).into_iter().flatten()
    }

    /// The typed view. A row that does not parse is left out, as if absent: the reconciler
    /// then writes it again, which is what a corrupted row needs anyway.
    fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        let mut port_names: HashMap<&str, String> = HashMap::new();
        let qos: BTreeSet<&String> = self.table("QoS").map(|(u, _)| u).collect();
        for (uuid, r) in self.table("Port") {
            let Ok(name) = row_string(r, "name") else { continue };
            let external_ids = row_string_map(r, "external_ids").unwrap_or_default();
            let has_qos = row_opt_uuid(r, "qos").ok().flatten().is_some_and(|q| qos.contains(&q));
            port_names.insert(uuid, name.clone());
            s.ports.insert(name, PortRow { external_ids, has_qos });
        }
        for (_, r) in self.table("Interface") {
            let Ok(name) = row_string(r, "name") else { continue };
            s.interfaces.insert(
                name,
                InterfaceRow {
                    iface_type: row_string(r, "type").unwrap_or_default(),
                    options: row_string_map(r, "options").unwrap_or_default(),
                    ofport_request: row_opt_i64(r, "ofport_request").ok().flatten(),
                    mac: row_opt_string(r, "mac").ok().flatten(),
                    ingress_policing_rate: super::types::row_i64(r, "ingress_policing_rate").ok(),
                },
            );
        }
        let mut referenced: BTreeSet<String> = BTreeSet::new();
        for (_, r) in self.table("Open_vSwitch") {
            s.root = true;
            referenced.extend(row_uuid_set(r, "bridges").unwrap_or_default());
        }
        for (uuid, r) in self.table("Bridge") {
            if !referenced.contains(uuid) {
                continue;
            }
            let Ok(name) = row_string(r, "name") else { continue };
            let ports = row_uuid_set(r, "ports").unwrap_or_default().iter().filter_map(|u| port_names.get(u.as_str()).cloned()).collect();
            s.bridges.insert(
                name,
                BridgeRow {
                    fail_mode: row_opt_string(r, "fail_mode").ok().flatten(),
                    protocols: row_string_set(r, "protocols").unwrap_or_default().into_iter().collect(),
                    datapath_type: row_string(r, "datapath_type").unwrap_or_default(),
                    external_ids: row_string_map(r, "external_ids").unwrap_or_default(),
                    ports,
                },
            );
        }
        s
    }
}

/// The monitor: its rows and a counter bumped after every notification.
#[derive(Clone, Debug)]
pub struct Sentinel {
    rows: Arc<Mutex<Rows>>,
    changed: watch::Receiver<u64>,
}

impl Sentinel {
    /// Starts the monitor on `client` (its initial contents are applied before this returns).
    pub async fn start(client: &OvsdbClient) -> Result<Sentinel, OvsdbError> {
        let reqs: BTreeMap<String, MonitorRequest> =
            COLUMNS.iter().map(|(t, cols)| (t.to_string(), MonitorRequest::columns(cols.iter().copied()))).collect();
        let rows = Arc::new(Mutex::new(Rows::default()));
        let changed = mirror::start(client, &reqs, rows.clone(), "sentinel").await?;
        Ok(Sentinel { rows, changed })
    }

    /// What OVSDB holds now; `None` once the monitor has ended (the connection is gone).
    pub fn snapshot(&self) -> Option<Snapshot> {
        let rows = lock(&self.rows);
        rows.ended.is_none().then(|| rows.snapshot())
    }

    /// Resolves after the next notification (or at once if one arrived since the last call).
    /// Never resolves once the monitor has ended and that was seen.
    pub async fn changed(&mut self) {
        if self.changed.changed().await.is_err() {
            std::future::pending::<()>().await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RowUpdate;
    use serde_json::json;

    fn row(v: serde_json::Value) -> Row {
        v.as_object().unwrap().clone()
    }

    fn insert(rows: &mut Rows, table: &str, uuid: &str, r: serde_json::Value) {
        let mut u = TableUpdates::new();
        u.entry(table.into()).or_default().insert(uuid.into(), RowUpdate { old: None, new: Some(row(r)) });
        rows.apply(&u);
    }

    #[test]
    fn snapshot_resolves_references_and_skips_garbage() {
        let mut rows = Rows::default();
        insert(&mut rows, "Open_vSwitch", "root", json!({"bridges": ["set", [["uuid", "b1"]]]}));
        insert(&mut rows, "Bridge", "b1", json!({"name": "br0", "fail_mode": "secure", "protocols": "OpenFlow13", "datapath_type": "netdev", "external_ids": ["map", [["k", "v"]]], "ports": ["set", [["uuid", "p1"], ["uuid", "p2"]]]}));
        // Not referenced by the root row: garbage, left out.
        insert(&mut rows, "Bridge", "b2", json!({"name": "old", "fail_mode": ["set", []], "protocols": ["set", []], "datapath_type": "", "external_ids": ["map", []], "ports": ["set", []]}));
        insert(&mut rows, "Port", "p1", json!({"name": "tun0", "external_ids": ["map", []], "qos": ["set", []]}));
        insert(&mut rows, "Port", "p2", json!({"name": "veth1", "external_ids": ["map", [["sdn-node-pod", "{}"]]], "qos": ["uuid", "q1"]}));
        insert(&mut rows, "QoS", "q1", json!({"type": "linux-htb"}));
        insert(&mut rows, "Interface", "i1", json!({"name": "tun0", "type": "internal", "options": ["map", []], "ofport_request": 2, "mac": "0a:58:0a:80:02:01", "ingress_policing_rate": 0}));
        // Malformed server data: left out, never a panic.
        insert(&mut rows, "Interface", "i2", json!({"name": 7}));
        let s = rows.snapshot();
        assert!(s.root);
        assert_eq!(s.bridges.keys().collect::<Vec<_>>(), ["br0"]);
        let br = &s.bridges["br0"];
        assert_eq!(br.fail_mode.as_deref(), Some("secure"));
        assert_eq!(br.ports, ["tun0", "veth1"].into_iter().map(String::from).collect());
        assert!(s.ports["veth1"].has_qos && !s.ports["tun0"].has_qos);
        assert_eq!(s.interfaces["tun0"].ofport_request, Some(2));
        assert_eq!(s.interfaces.len(), 1);
        // The QoS row goes: the port no longer counts as limited.
        let mut u = TableUpdates::new();
        u.entry("QoS".into()).or_default().insert("q1".into(), RowUpdate { old: None, new: None });
        rows.apply(&u);
        assert!(!rows.snapshot().ports["veth1"].has_qos);
    }
}
