//! The general path for ports: `ensure_port` (create, fix, or move a port), waiting for its
//! ofport, `delete_port`, and the interface's ofport and error.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{nth, wait_absent, wait_exists, where_name, where_uuid, Ensured, Ovs, PortSpec};
use crate::datum::{NamedUuid, Ref, Set};
use crate::monitor::{MonitorEnd, MonitorRequest};
use crate::rows::{Bridge, Interface, Port, Table};
use crate::txn::{Condition, Mutation, Operation};
use crate::{OvsdbError, VSWITCH_DB};

/// `""` and `system` are the same interface type.
fn same_iface_type(a: &str, b: &str) -> bool {
    let norm = |t: &str| if t == "system" { "" } else { t }.to_string();
    norm(a) == norm(b)
}

/// The Interface columns `spec` decides (its `mac` only if it names one).
pub(super) fn iface_row(spec: &PortSpec) -> Interface {
    Interface {
        iface_type: Some(spec.iface_type.clone()),
        options: Some(spec.options.clone()),
        ofport_request: Some(spec.ofport_request),
        mac: spec.mac.clone().map(Some),
        ..Default::default()
    }
}

/// What `ensure_port` writes, given every bridge (`_uuid`, `name`, `ports`) and the Port
/// (`_uuid`) and Interface (`_uuid`, `type`, `options`, `ofport_request`, `mac`) named `name`
/// as read: a new port; or the interface's columns that differ from `spec` and the port's
/// membership of `bridge` (taken from any other bridge if `spec` allows it), guarded by "the
/// rows read still exist"; or nothing.
pub(super) fn port_ops(
    bridge: &str,
    name: &str,
    spec: &PortSpec,
    bridges: &[Bridge],
    port: Option<&Port>,
    iface: Option<&Interface>,
) -> Result<(Ensured, Vec<Operation>), OvsdbError> {
    let mut target = None;
    for b in bridges {
        if b.name()? == bridge {
            target = Some(b);
        }
    }
    let target = target.ok_or_else(|| OvsdbError::NotFound { table: "Bridge", name: bridge.to_string() })?;
    let (br_uuid, br_ports) = (target.uuid()?, target.ports()?);

    let Some(port) = port else {
        let iface = Interface { name: Some(name.into()), ..iface_row(spec) };
        let port = Port { name: Some(name.into()), interfaces: Some(Set::one(Ref::named("iface"))), ..Default::default() };
        let ops = vec![
            wait_exists::<Bridge>(br_uuid),
            wait_absent::<Port>(name),
            iface.insert(Some("iface")),
            port.insert(Some("port")),
            Bridge::mutate(where_uuid(br_uuid), vec![Mutation::insert(Bridge::PORTS, Set::one(NamedUuid::new("port")))]),
        ];
        return Ok((Ensured::Created, ops));
    };

    let port_uuid = port.uuid()?;
    if !spec.take_from_other_bridge && !br_ports.contains_uuid(port_uuid) {
        for b in bridges {
            if b.ports()?.contains_uuid(port_uuid) {
                return Err(OvsdbError::OnOtherBridge { port: name.to_string(), on: b.name()?.clone(), bridge: bridge.to_string() });
            }
        }
    }
    let iface = iface.ok_or_else(|| OvsdbError::NotFound { table: "Interface", name: name.to_string() })?;
    let iface_uuid = iface.uuid()?;
    let mut ops = vec![wait_exists::<Port>(port_uuid), wait_exists::<Interface>(iface_uuid)];
    if !same_iface_type(iface.iface_type()?, &spec.iface_type)
        || iface.options()? != &spec.options
        || iface.ofport_request()? != &spec.ofport_request
        || (spec.mac.is_some() && iface.mac()? != &spec.mac)
    {
        ops.push(iface_row(spec).update(where_uuid(iface_uuid)));
    }
    for b in bridges {
        let u = b.uuid()?;
        if u != br_uuid && b.ports()?.contains_uuid(port_uuid) {
            ops.push(Bridge::mutate(where_uuid(u), vec![Mutation::delete(Bridge::PORTS, Set::one(port_uuid.clone()))]));
        }
    }
    if !br_ports.contains_uuid(port_uuid) {
        ops.push(wait_exists::<Bridge>(br_uuid));
        ops.push(Bridge::mutate(where_uuid(br_uuid), vec![Mutation::insert(Bridge::PORTS, Set::one(port_uuid.clone()))]));
    }
    if ops.len() == 2 {
        return Ok((Ensured::Unchanged, vec![]));
    }
    Ok((Ensured::Updated, ops))
}

/// What `delete_port` writes, given the Port named so (`_uuid`) and the bridge (`_uuid`,
/// `ports`) as read: nothing if either is missing or the port is not on the bridge. Deleting
/// an element that is already gone is a no-op, so no guard is needed.
pub(super) fn delete_port_op(port: Option<&Port>, bridge: Option<&Bridge>) -> Result<Option<Operation>, OvsdbError> {
    let (Some(port), Some(br)) = (port, bridge) else {
        return Ok(None);
    };
    let port_uuid = port.uuid()?;
    if !br.ports()?.contains_uuid(port_uuid) {
        return Ok(None);
    }
    let delete = Mutation::delete(Bridge::PORTS, Set::one(port_uuid.clone()));
    Ok(Some(Bridge::mutate(where_uuid(br.uuid()?), vec![delete])))
}

impl Ovs {
    /// Creates the port on `bridge` or brings an existing one in line with
    /// `spec` (type, options, ofport_request, and membership of `bridge`).
    pub async fn ensure_port(&self, bridge: &str, name: &str, spec: &PortSpec) -> Result<Ensured, OvsdbError> {
        self.retry("ensure_port", || self.try_ensure_port(bridge, name, spec)).await
    }

    async fn try_ensure_port(&self, bridge: &str, name: &str, spec: &PortSpec) -> Result<Ensured, OvsdbError> {
        let iface_columns = [Interface::UUID, Interface::TYPE, Interface::OPTIONS, Interface::OFPORT_REQUEST, Interface::MAC];
        let mut res = self
            .transact(vec![
                Bridge::select(vec![], &[Bridge::UUID, Bridge::NAME, Bridge::PORTS]),
                Port::select(where_name(name), &[Port::UUID]),
                Interface::select(where_name(name), &iface_columns),
            ])
            .await?;
        let bridges: Vec<Bridge> = nth(&mut res, 0)?;
        let ports: Vec<Port> = nth(&mut res, 1)?;
        let ifaces: Vec<Interface> = nth(&mut res, 2)?;
        let (ensured, ops) = port_ops(bridge, name, spec, &bridges, ports.first(), ifaces.first())?;
        if !ops.is_empty() {
            self.transact(ops).await?;
        }
        Ok(ensured)
    }

    /// `ensure_port`, then waits (via a monitor, not polling) until
    /// ovs-vswitchd has assigned the interface an OpenFlow port number.
    /// Fails with [`OvsdbError::InterfaceError`] carrying `Interface.error`
    /// if vswitchd could not create the interface (ofport -1).
    ///
    /// If an existing port's settings had to be changed and it has an
    /// `ofport_request`, waits for the ofport to match the request.
    pub async fn add_port_and_wait_ofport(
        &self,
        bridge: &str,
        name: &str,
        spec: &PortSpec,
        timeout: Duration,
    ) -> Result<u32, OvsdbError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out = || OvsdbError::Timeout(format!("waiting for an ofport for interface {name:?}"));
        // Monitor first, then write and read: a change can then never slip
        // between our read and the start of the notifications.
        let reqs: BTreeMap<String, MonitorRequest> = [(
            Interface::TABLE.to_string(),
            MonitorRequest::columns([Interface::NAME, Interface::OFPORT, Interface::ERROR])
                .with_conditions(vec![Condition::eq(Interface::NAME, name)]),
        )]
        .into();
        let mut mon = tokio::time::timeout_at(deadline, self.client.monitor_cond(VSWITCH_DB, &reqs))
            .await
            .map_err(|_| timed_out())??;
        let wait = async {
            let change = self.ensure_port(bridge, name, spec).await?;
            let want = if change == Ensured::Updated { spec.ofport_request } else { None };
            loop {
                let found: Vec<Interface> = self.select(where_name(name), &[Interface::OFPORT, Interface::ERROR]).await?;
                let Some(iface) = found.first() else {
                    return Err(OvsdbError::NotFound { table: "Interface", name: name.to_string() });
                };
                match *iface.ofport()? {
                    Some(-1) => {
                        return Err(OvsdbError::InterfaceError {
                            name: name.to_string(),
                            error: iface.error()?.clone().unwrap_or_else(|| "ofport is -1 (no error reported)".to_string()),
                        })
                    }
                    Some(p) if p > 0 && want.is_none_or(|w| w == p) => {
                        return u32::try_from(p).map_err(|_| OvsdbError::Protocol(format!("ofport {p} out of range")));
                    }
                    _ => {}
                }
                if mon.updates.recv().await.is_none() {
                    return Err(match mon.updates.end_reason() {
                        Some(MonitorEnd::Disconnected) | None => OvsdbError::Disconnected,
                        Some(other) => OvsdbError::Protocol(format!("interface monitor ended: {other:?}")),
                    });
                }
            }
        };
        let result = tokio::time::timeout_at(deadline, wait).await.unwrap_or_else(|_| Err(timed_out()));
        if !self.client.is_closed() {
            let _ = self.client.monitor_cancel(&mon.id).await;
        }
        result
    }

    /// Removes the port from the bridge (rows are garbage-collected).
    /// Returns false if there was nothing to delete.
    pub async fn delete_port(&self, bridge: &str, name: &str) -> Result<bool, OvsdbError> {
        let mut res = self
            .transact(vec![
                Port::select(where_name(name), &[Port::UUID]),
                Bridge::select(where_name(bridge), &[Bridge::UUID, Bridge::PORTS]),
            ])
            .await?;
        let ports: Vec<Port> = nth(&mut res, 0)?;
        let bridges: Vec<Bridge> = nth(&mut res, 1)?;
        let Some(op) = delete_port_op(ports.first(), bridges.first())? else {
            return Ok(false);
        };
        self.transact(vec![op]).await?;
        Ok(true)
    }

    /// The interface's current ofport: `None` if the interface does not exist
    /// or vswitchd has not assigned one yet; `Some(-1)` if it failed.
    pub async fn interface_ofport(&self, name: &str) -> Result<Option<i64>, OvsdbError> {
        let found: Vec<Interface> = self.select(where_name(name), &[Interface::OFPORT]).await?;
        match found.first() {
            Some(i) => Ok(*i.ofport()?),
            None => Ok(None),
        }
    }

    /// The interface's `error` column (why vswitchd could not open it).
    pub async fn interface_error(&self, name: &str) -> Result<Option<String>, OvsdbError> {
        let found: Vec<Interface> = self.select(where_name(name), &[Interface::ERROR]).await?;
        match found.first() {
            Some(i) => Ok(i.error()?.clone()),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::fake::Fake;
    use crate::rows::fixtures;
    use serde_json::{json, Value};

    fn wire(ops: &[Operation]) -> Value {
        serde_json::to_value(ops).unwrap()
    }

    fn bridges() -> Vec<Bridge> {
        Bridge::from_rows(&fixtures::rows(fixtures::BRIDGE)).unwrap()
    }

    fn port(name: &str) -> Port {
        Port::from_row(&fixtures::named(fixtures::PORT, name)).unwrap()
    }

    fn iface(name: &str) -> Interface {
        Interface::from_row(&fixtures::named(fixtures::INTERFACE, name)).unwrap()
    }

    const BR0: [&str; 2] = ["uuid", "34753c2a-c5c3-4cce-94f2-f6100ffde424"];

    #[test]
    fn a_new_port_is_inserted_and_added_to_its_bridge() {
        let (e, ops) = port_ops("br0", "vxlan1", &PortSpec::vxlan_flow(1), &bridges(), None, None).unwrap();
        assert_eq!(e, Ensured::Created);
        assert_eq!(
            wire(&ops),
            json!([
                {"op": "wait", "timeout": 0, "table": "Bridge", "where": [["_uuid", "==", BR0]], "columns": ["_uuid"], "until": "==", "rows": [{"_uuid": BR0}]},
                {"op": "wait", "timeout": 0, "table": "Port", "where": [["name", "==", "vxlan1"]], "columns": ["_uuid"], "until": "==", "rows": []},
                {"op": "insert", "table": "Interface", "uuid-name": "iface", "row": {
                    "name": "vxlan1", "type": "vxlan", "options": ["map", [["key", "flow"], ["remote_ip", "flow"]]], "ofport_request": 1}},
                {"op": "insert", "table": "Port", "uuid-name": "port", "row": {"name": "vxlan1", "interfaces": ["set", [["named-uuid", "iface"]]]}},
                {"op": "mutate", "table": "Bridge", "where": [["_uuid", "==", BR0]], "mutations": [["ports", "insert", ["set", [["named-uuid", "port"]]]]]}
            ])
        );
        assert!(matches!(
            port_ops("br1", "x", &PortSpec::system(), &bridges(), None, None),
            Err(OvsdbError::NotFound { table: "Bridge", .. })
        ));
    }

    #[test]
    fn an_existing_port_as_specified_is_left_alone() {
        // vxlan0 as ovs-vsctl created it (options key/remote_ip, ofport_request 1).
        let r = port_ops("br0", "vxlan0", &PortSpec::vxlan_flow(1), &bridges(), Some(&port("vxlan0")), Some(&iface("vxlan0")));
        assert_eq!(r.unwrap(), (Ensured::Unchanged, vec![]));
        // "system" is the empty type; a MAC the spec does not name is not compared.
        let mut tun = PortSpec::internal(Some(2));
        assert_eq!(port_ops("br0", "tun0", &tun, &bridges(), Some(&port("tun0")), Some(&iface("tun0"))).unwrap().0, Ensured::Unchanged);
        tun.mac = Some("0a:58:0a:80:00:01".into());
        assert_eq!(port_ops("br0", "tun0", &tun, &bridges(), Some(&port("tun0")), Some(&iface("tun0"))).unwrap().0, Ensured::Unchanged);
    }

    #[test]
    fn a_differing_interface_is_updated_under_guards() {
        let spec = PortSpec { mac: Some("0a:58:0a:80:00:09".into()), ..PortSpec::internal(None) };
        let (e, ops) = port_ops("br0", "tun0", &spec, &bridges(), Some(&port("tun0")), Some(&iface("tun0"))).unwrap();
        assert_eq!(e, Ensured::Updated);
        let (p, i) = (["uuid", "9d302be5-2938-4b48-b9c0-1717edae0264"], ["uuid", "efec02e4-d005-4b74-ba4d-d786f1754626"]);
        assert_eq!(
            wire(&ops),
            json!([
                {"op": "wait", "timeout": 0, "table": "Port", "where": [["_uuid", "==", p]], "columns": ["_uuid"], "until": "==", "rows": [{"_uuid": p}]},
                {"op": "wait", "timeout": 0, "table": "Interface", "where": [["_uuid", "==", i]], "columns": ["_uuid"], "until": "==", "rows": [{"_uuid": i}]},
                {"op": "update", "table": "Interface", "where": [["_uuid", "==", i]],
                 "row": {"type": "internal", "options": ["map", []], "ofport_request": ["set", []], "mac": "0a:58:0a:80:00:09"}}
            ])
        );
    }

    #[test]
    fn a_port_on_another_bridge_is_refused_or_moved() {
        let mut br1 = Bridge { uuid: Some(crate::Uuid::new("b1")), name: Some("br1".into()), ports: Some(Set::empty()), ..Default::default() };
        let all = [bridges()[0].clone(), br1.clone()];
        let veth = (port("veth1"), iface("veth1"));
        match port_ops("br1", "veth1", &PortSpec::of_type("dummy"), &all, Some(&veth.0), Some(&veth.1)) {
            Err(OvsdbError::OnOtherBridge { port, on, bridge }) => assert_eq!((port.as_str(), on.as_str(), bridge.as_str()), ("veth1", "br0", "br1")),
            other => panic!("{other:?}"),
        }
        let spec = PortSpec { take_from_other_bridge: true, ..PortSpec::of_type("dummy") };
        let (e, ops) = port_ops("br1", "veth1", &spec, &all, Some(&veth.0), Some(&veth.1)).unwrap();
        assert_eq!(e, Ensured::Updated);
        let p = ["uuid", "50ce6a0f-7aa8-4f5e-a077-c6235a738af8"];
        assert_eq!(
            wire(&ops[2..]),
            json!([
                {"op": "mutate", "table": "Bridge", "where": [["_uuid", "==", BR0]], "mutations": [["ports", "delete", ["set", [p]]]]},
                {"op": "wait", "timeout": 0, "table": "Bridge", "where": [["_uuid", "==", ["uuid", "b1"]]], "columns": ["_uuid"], "until": "==", "rows": [{"_uuid": ["uuid", "b1"]}]},
                {"op": "mutate", "table": "Bridge", "where": [["_uuid", "==", ["uuid", "b1"]]], "mutations": [["ports", "insert", ["set", [p]]]]}
            ])
        );
        // A port on no bridge at all is simply added.
        br1.ports = Some(Set::empty());
        let orphan = [br1];
        let (e, ops) = port_ops("br1", "veth1", &PortSpec::of_type("dummy"), &orphan, Some(&veth.0), Some(&veth.1)).unwrap();
        assert_eq!((e, ops.len()), (Ensured::Updated, 4));
    }

    #[test]
    fn delete_port_removes_the_membership_only() {
        let br = bridges().remove(0);
        assert_eq!(
            serde_json::to_value(delete_port_op(Some(&port("tun0")), Some(&br)).unwrap()).unwrap(),
            json!({"op": "mutate", "table": "Bridge", "where": [["_uuid", "==", BR0]],
                   "mutations": [["ports", "delete", ["set", [["uuid", "9d302be5-2938-4b48-b9c0-1717edae0264"]]]]]})
        );
        assert_eq!(delete_port_op(None, Some(&br)).unwrap(), None);
        assert_eq!(delete_port_op(Some(&port("tun0")), None).unwrap(), None);
        let other = Port { uuid: Some(crate::Uuid::new("elsewhere")), ..Default::default() };
        assert_eq!(delete_port_op(Some(&other), Some(&br)).unwrap(), None);
    }

    /// The reads and writes of `delete_port`, against a scripted server.
    #[tokio::test]
    async fn delete_port_reads_then_writes_once() {
        let fake = Fake::start(|ops| match ops[0]["op"].as_str() {
            Some("select") => json!([
                {"rows": [{"_uuid": ["uuid", "p"]}]},
                {"rows": [{"_uuid": ["uuid", "b"], "ports": ["set", [["uuid", "p"], ["uuid", "q"]]]}]}
            ]),
            _ => json!([{"count": 1}]),
        });
        assert!(fake.ovs.delete_port("br0", "veth1").await.unwrap());
        let t = fake.transactions();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t[0],
            [json!({"op": "select", "table": "Port", "where": [["name", "==", "veth1"]], "columns": ["_uuid"]}),
             json!({"op": "select", "table": "Bridge", "where": [["name", "==", "br0"]], "columns": ["_uuid", "ports"]})]
        );
        assert_eq!(t[1][0]["mutations"], json!([["ports", "delete", ["set", [["uuid", "p"]]]]]));
    }
}
