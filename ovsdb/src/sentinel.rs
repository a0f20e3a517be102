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

use crate::client::OvsdbClient;
use crate::mirror::{self, lock, Mirror};
use crate::monitor::{MonitorEnd, MonitorRequest, TableUpdates};
use crate::rows::{Bridge, Interface, OpenVswitch, Port, Qos, Table};
use crate::types::Row;
use crate::OvsdbError;

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
    (OpenVswitch::TABLE, &[OpenVswitch::BRIDGES]),
    (
        Bridge::TABLE,
        &[Bridge::NAME, Bridge::FAIL_MODE, Bridge::PROTOCOLS, Bridge::DATAPATH_TYPE, Bridge::EXTERNAL_IDS, Bridge::PORTS],
    ),
    (Port::TABLE, &[Port::NAME, Port::EXTERNAL_IDS, Port::QOS]),
    (
        Interface::TABLE,
        &[
            Interface::NAME,
            Interface::TYPE,
            Interface::OPTIONS,
            Interface::OFPORT_REQUEST,
            Interface::MAC,
            Interface::INGRESS_POLICING_RATE,
        ],
    ),
    (Qos::TABLE, &[Qos::TYPE]),
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
    /// The rows of `T` that parse, by uuid.
    fn table<T: Table>(&self) -> impl Iterator<Item = (&String, T)> {
        let rows = self.tables.get(T::TABLE).into_iter().flatten();
        rows.filter_map(|(uuid, r)| T::from_row(r).ok().map(|t| (uuid, t)))
    }

    /// The typed view. A row that does not parse (or lacks a monitored column) is left out, as
    /// if absent: the reconciler then writes it again, which is what a corrupted row needs
    /// anyway.
    fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        let mut port_names: HashMap<&str, String> = HashMap::new();
        let qos: BTreeSet<&String> = self.table::<Qos>().map(|(u, _)| u).collect();
        for (uuid, p) in self.table::<Port>() {
            let (Ok(name), Ok(external_ids), Ok(q)) = (p.name(), p.external_ids(), p.qos()) else { continue };
            let has_qos = q.as_ref().and_then(|q| q.uuid()).is_some_and(|q| qos.contains(&q.0));
            port_names.insert(uuid, name.clone());
            s.ports.insert(name.clone(), PortRow { external_ids: external_ids.clone(), has_qos });
        }
        for (_, i) in self.table::<Interface>() {
            let row = || -> Result<(String, InterfaceRow), OvsdbError> {
                let iface = InterfaceRow {
                    iface_type: i.iface_type()?.clone(),
                    options: i.options()?.clone(),
                    ofport_request: *i.ofport_request()?,
                    mac: i.mac()?.clone(),
                    ingress_policing_rate: Some(*i.ingress_policing_rate()?),
                };
                Ok((i.name()?.clone(), iface))
            };
            if let Ok((name, iface)) = row() {
                s.interfaces.insert(name, iface);
            }
        }
        let mut referenced: BTreeSet<String> = BTreeSet::new();
        for (_, r) in self.table::<OpenVswitch>() {
            s.root = true;
            if let Ok(bridges) = r.bridges() {
                referenced.extend(bridges.uuids().map(|u| u.0.clone()));
            }
        }
        for (uuid, b) in self.table::<Bridge>() {
            if !referenced.contains(uuid) {
                continue;
            }
            let row = || -> Result<(String, BridgeRow), OvsdbError> {
                let ports = b.ports()?.uuids().filter_map(|u| port_names.get(u.as_str()).cloned()).collect();
                let bridge = BridgeRow {
                    fail_mode: b.fail_mode()?.clone(),
                    protocols: b.protocols()?.clone(),
                    datapath_type: b.datapath_type()?.clone(),
                    external_ids: b.external_ids()?.clone(),
                    ports,
                };
                Ok((b.name()?.clone(), bridge))
            };
            if let Ok((name, bridge)) = row() {
                s.bridges.insert(name, bridge);
            }
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

    /// The snapshot of rows as a real ovsdb-server sent them (see `rows::fixtures`), keyed by
    /// their `_uuid` as a monitor keys them.
    #[test]
    fn snapshot_of_a_real_servers_rows() {
        use crate::rows::fixtures;
        let mut rows = Rows::default();
        for (table, json) in [
            ("Open_vSwitch", fixtures::OPEN_VSWITCH),
            ("Bridge", fixtures::BRIDGE),
            ("Port", fixtures::PORT),
            ("Interface", fixtures::INTERFACE),
            ("QoS", fixtures::QOS),
        ] {
            for r in fixtures::rows(json) {
                let uuid = r["_uuid"][1].as_str().unwrap().to_string();
                insert(&mut rows, table, &uuid, serde_json::Value::Object(r));
            }
        }
        let s = rows.snapshot();
        assert!(s.root);
        let br = &s.bridges["br0"];
        assert_eq!(
            (br.fail_mode.as_deref(), br.datapath_type.as_str(), br.external_ids["sdn-node-generation"].as_str()),
            (Some("secure"), "dummy", "3")
        );
        assert_eq!(br.protocols, BTreeSet::from(["OpenFlow13".to_string()]));
        assert_eq!(br.ports, ["bad", "br0", "tun0", "veth1", "vxlan0"].into_iter().map(String::from).collect());
        assert!(s.ports["veth1"].has_qos);
        assert_eq!(s.ports["veth1"].external_ids["sdn-node-pod"], r#"{"ns":"a"}"#);
        assert_eq!(s.interfaces.len(), 5);
        let vxlan = &s.interfaces["vxlan0"];
        assert_eq!((vxlan.iface_type.as_str(), vxlan.ofport_request, vxlan.options.len()), ("vxlan", Some(1), 2));
        assert_eq!(s.interfaces["veth1"].ingress_policing_rate, Some(1000));
        assert_eq!(s.interfaces["tun0"].mac.as_deref(), Some("0a:58:0a:80:00:01"));
    }

    #[test]
    fn a_row_with_one_malformed_column_is_left_out() {
        let mut rows = Rows::default();
        insert(&mut rows, "Port", "p1", json!({"name": "tun0", "external_ids": ["map", [["k", 1]]], "qos": ["set", []]}));
        insert(&mut rows, "Port", "p2", json!({"name": "veth1", "external_ids": ["map", []]}));
        insert(&mut rows, "Port", "p3", json!({"name": "veth2", "external_ids": ["map", []], "qos": ["set", []]}));
        assert_eq!(rows.snapshot().ports.keys().collect::<Vec<_>>(), ["veth2"]);
    }
}
