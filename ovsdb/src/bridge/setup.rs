//! The root row and the bridges: `init`, `ensure_bridge`, and reading bridges and their ports.

use std::collections::BTreeMap;

use super::{nth, wait_absent, wait_exists, where_name, where_uuid, BridgeInfo, BridgeOptions, Ensured, Ovs};
use crate::datum::{NamedUuid, Ref, Set};
use crate::rows::{Bridge, Interface, OpenVswitch, Port, Table};
use crate::txn::{Mutation, Operation};
use crate::OvsdbError;

/// Creating the root row (`ovs-vsctl --no-wait init`), guarded by "there is none".
pub(super) fn init_ops() -> Vec<Operation> {
    vec![OpenVswitch::wait_eq(vec![], &[OpenVswitch::UUID], &[]), OpenVswitch::default().insert(None)]
}

/// The columns of a bridge that `opts` decides.
fn configured(opts: &BridgeOptions) -> Bridge {
    Bridge {
        fail_mode: Some(opts.fail_mode.clone()),
        protocols: Some(opts.protocols.iter().cloned().collect()),
        datapath_type: Some(opts.datapath_type.clone()),
        ..Default::default()
    }
}

/// What `ensure_bridge` writes, given the bridge named `name` as read (its `_uuid`,
/// `fail_mode`, `protocols`, `datapath_type`): when there is none, the bridge with its
/// internal port and interface of the same name, added to the root row; when it differs, its
/// configured columns.
pub(super) fn bridge_ops(name: &str, opts: &BridgeOptions, found: Option<&Bridge>) -> Result<(Ensured, Vec<Operation>), OvsdbError> {
    let want = configured(opts);
    let Some(br) = found else {
        let iface = Interface { name: Some(name.into()), iface_type: Some("internal".into()), ..Default::default() };
        let port = Port { name: Some(name.into()), interfaces: Some(Set::one(Ref::named("iface"))), ..Default::default() };
        let bridge = Bridge { name: Some(name.into()), ports: Some(Set::one(Ref::named("port"))), ..want };
        let root = OpenVswitch::mutate(vec![], vec![Mutation::insert(OpenVswitch::BRIDGES, Set::one(NamedUuid::new("bridge")))]);
        let ops = vec![
            wait_absent::<Bridge>(name),
            iface.insert(Some("iface")),
            port.insert(Some("port")),
            bridge.insert(Some("bridge")),
            root,
        ];
        return Ok((Ensured::Created, ops));
    };
    if br.fail_mode()? == &opts.fail_mode && Some(br.protocols()?) == want.protocols.as_ref() && br.datapath_type()? == &opts.datapath_type {
        return Ok((Ensured::Unchanged, vec![]));
    }
    let u = br.uuid()?;
    Ok((Ensured::Updated, vec![wait_exists::<Bridge>(u), want.update(where_uuid(u))]))
}

/// Every bridge with its ports' names (bridges: `name`, `datapath_type`, `ports`; ports:
/// `_uuid`, `name`), sorted.
pub(super) fn bridge_infos(bridges: &[Bridge], ports: &[Port]) -> Result<Vec<BridgeInfo>, OvsdbError> {
    let names = port_names_by_uuid(ports)?;
    let mut out = bridges
        .iter()
        .map(|b| {
            let mut ports: Vec<String> = b.ports()?.uuids().filter_map(|u| names.get(u.as_str()).cloned()).collect();
            ports.sort();
            Ok(BridgeInfo { name: b.name()?.clone(), datapath_type: b.datapath_type()?.clone(), ports })
        })
        .collect::<Result<Vec<_>, OvsdbError>>()?;
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn port_names_by_uuid(ports: &[Port]) -> Result<BTreeMap<&str, String>, OvsdbError> {
    ports.iter().map(|p| Ok((p.uuid()?.as_str(), p.name()?.clone()))).collect()
}

impl Ovs {
    /// Ensures the single `Open_vSwitch` row exists (`ovs-vsctl --no-wait
    /// init`); returns its uuid.
    pub async fn init(&self) -> Result<String, OvsdbError> {
        self.retry("init", || async {
            let existing: Vec<OpenVswitch> = self.select(vec![], &[OpenVswitch::UUID]).await?;
            if let Some(r) = existing.first() {
                return Ok(r.uuid()?.to_string());
            }
            let res = self.transact(init_ops()).await?;
            res.get(1)
                .and_then(|r| r.uuid.as_ref())
                .map(ToString::to_string)
                .ok_or_else(|| OvsdbError::Protocol("insert returned no uuid".into()))
        })
        .await
    }

    /// Creates the bridge (with its internal port/interface of the same name)
    /// or fixes its `fail_mode`/`protocols`/`datapath_type`.
    pub async fn ensure_bridge(&self, name: &str, opts: &BridgeOptions) -> Result<Ensured, OvsdbError> {
        self.init().await?;
        self.retry("ensure_bridge", || async {
            let columns = [Bridge::UUID, Bridge::FAIL_MODE, Bridge::PROTOCOLS, Bridge::DATAPATH_TYPE];
            let found: Vec<Bridge> = self.select(where_name(name), &columns).await?;
            let (ensured, ops) = bridge_ops(name, opts, found.first())?;
            if !ops.is_empty() {
                self.transact(ops).await?;
            }
            Ok(ensured)
        })
        .await
    }

    /// Every bridge with its datapath type and its ports' names, in one read.
    pub async fn bridges(&self) -> Result<Vec<BridgeInfo>, OvsdbError> {
        let mut res = self
            .transact(vec![
                Bridge::select(vec![], &[Bridge::NAME, Bridge::DATAPATH_TYPE, Bridge::PORTS]),
                Port::select(vec![], &[Port::UUID, Port::NAME]),
            ])
            .await?;
        bridge_infos(&nth(&mut res, 0)?, &nth(&mut res, 1)?)
    }

    /// Names of the ports on `bridge` (including the bridge's own port).
    pub async fn list_ports(&self, bridge: &str) -> Result<Vec<String>, OvsdbError> {
        let mut res = self
            .transact(vec![
                Bridge::select(where_name(bridge), &[Bridge::NAME, Bridge::DATAPATH_TYPE, Bridge::PORTS]),
                Port::select(vec![], &[Port::UUID, Port::NAME]),
            ])
            .await?;
        let bridges: Vec<Bridge> = nth(&mut res, 0)?;
        if bridges.is_empty() {
            return Err(OvsdbError::NotFound { table: "Bridge", name: bridge.to_string() });
        }
        let infos = bridge_infos(&bridges, &nth(&mut res, 1)?)?;
        Ok(infos.into_iter().next().map(|b| b.ports).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::fixtures;
    use serde_json::{json, Value};

    fn wire(ops: &[Operation]) -> Value {
        serde_json::to_value(ops).unwrap()
    }

    fn dummy() -> BridgeOptions {
        BridgeOptions { datapath_type: "dummy".into(), ..Default::default() }
    }

    #[test]
    fn init_inserts_the_root_row_unless_there_is_one() {
        assert_eq!(
            wire(&init_ops()),
            json!([
                {"op": "wait", "timeout": 0, "table": "Open_vSwitch", "where": [], "columns": ["_uuid"], "until": "==", "rows": []},
                {"op": "insert", "table": "Open_vSwitch", "row": {}}
            ])
        );
    }

    #[test]
    fn a_new_bridge_comes_with_its_port_and_interface() {
        let (e, ops) = bridge_ops("br0", &dummy(), None).unwrap();
        assert_eq!(e, Ensured::Created);
        // `ovs-vsctl add-br br0 -- set bridge br0 fail_mode=secure protocols=OpenFlow13
        // datapath_type=dummy` writes the same three rows and root membership.
        assert_eq!(
            wire(&ops),
            json!([
                {"op": "wait", "timeout": 0, "table": "Bridge", "where": [["name", "==", "br0"]], "columns": ["_uuid"], "until": "==", "rows": []},
                {"op": "insert", "table": "Interface", "row": {"name": "br0", "type": "internal"}, "uuid-name": "iface"},
                {"op": "insert", "table": "Port", "row": {"name": "br0", "interfaces": ["set", [["named-uuid", "iface"]]]}, "uuid-name": "port"},
                {"op": "insert", "table": "Bridge", "uuid-name": "bridge", "row": {
                    "name": "br0", "fail_mode": "secure", "protocols": ["set", ["OpenFlow13"]], "datapath_type": "dummy",
                    "ports": ["set", [["named-uuid", "port"]]]}},
                {"op": "mutate", "table": "Open_vSwitch", "where": [], "mutations": [["bridges", "insert", ["set", [["named-uuid", "bridge"]]]]]}
            ])
        );
    }

    #[test]
    fn an_existing_bridge_is_fixed_only_if_it_differs() {
        // As the server sends it: fail_mode "secure", protocols the bare "OpenFlow13".
        let br = Bridge::from_row(&fixtures::named(fixtures::BRIDGE, "br0")).unwrap();
        assert_eq!(bridge_ops("br0", &dummy(), Some(&br)).unwrap(), (Ensured::Unchanged, vec![]));
        let standalone = BridgeOptions { fail_mode: None, protocols: vec!["OpenFlow13".into(), "OpenFlow10".into()], ..dummy() };
        let (e, ops) = bridge_ops("br0", &standalone, Some(&br)).unwrap();
        assert_eq!(e, Ensured::Updated);
        let u = ["uuid", "34753c2a-c5c3-4cce-94f2-f6100ffde424"];
        assert_eq!(
            wire(&ops),
            json!([
                {"op": "wait", "timeout": 0, "table": "Bridge", "where": [["_uuid", "==", u]], "columns": ["_uuid"], "until": "==", "rows": [{"_uuid": u}]},
                {"op": "update", "table": "Bridge", "where": [["_uuid", "==", u]],
                 "row": {"fail_mode": ["set", []], "protocols": ["set", ["OpenFlow10", "OpenFlow13"]], "datapath_type": "dummy"}}
            ])
        );
        // Duplicates in the options are one protocol.
        let dup = BridgeOptions { protocols: vec!["OpenFlow13".into(), "OpenFlow13".into()], ..dummy() };
        assert_eq!(bridge_ops("br0", &dup, Some(&br)).unwrap().0, Ensured::Unchanged);
    }

    #[test]
    fn bridges_and_their_ports_from_the_servers_rows() {
        let bridges = Bridge::from_rows(&fixtures::rows(fixtures::BRIDGE)).unwrap();
        let ports = Port::from_rows(&fixtures::rows(fixtures::PORT)).unwrap();
        assert_eq!(
            bridge_infos(&bridges, &ports).unwrap(),
            [BridgeInfo {
                name: "br0".into(),
                datapath_type: "dummy".into(),
                ports: ["bad", "br0", "tun0", "veth1", "vxlan0"].map(String::from).to_vec(),
            }]
        );
        // A port row not (yet) read is left out; a bridge without its name is an error.
        assert_eq!(bridge_infos(&bridges, &ports[1..]).unwrap()[0].ports.len(), 4);
        let nameless = Bridge { name: None, ..bridges[0].clone() };
        assert!(matches!(bridge_infos(&[nameless], &ports), Err(OvsdbError::BadRow { table: "Bridge", column: "name", .. })));
    }
}
