//! openshift-sdn's `SetPodBandwidth`: a pod's ingress limit is a `linux-htb` QoS row on its
//! port, its egress limit the interface's ingress policing (pod ingress is OVS egress and vice
//! versa).

use super::{where_name, where_uuid, Ovs};
use crate::datum::Ref;
use crate::rows::{Interface, Port, Qos, Table};
use crate::txn::Operation;
use crate::OvsdbError;

/// What `set_pod_bandwidth` writes, given the Port named `name` as read (`_uuid`, `qos`): a
/// guard that its `qos` is unchanged; the old QoS row dropped (the reference cleared unless a
/// new one replaces it); a new QoS row attached if `ingress_bps > 0`; the interface's
/// `ingress_policing_rate` (kbps) if `egress_bps > 0`. Only the guard: nothing to do.
pub(super) fn bandwidth_ops(name: &str, port: &Port, ingress_bps: i64, egress_bps: i64) -> Result<Vec<Operation>, OvsdbError> {
    let port_uuid = port.uuid()?;
    let old_qos = port.qos()?;
    let as_read = Port { qos: Some(old_qos.clone()), ..Default::default() };
    let mut ops = vec![Port::wait_eq(where_uuid(port_uuid), &[Port::QOS], &[as_read])];
    if let Some(q) = old_qos {
        if ingress_bps <= 0 {
            ops.push(Port { qos: Some(None), ..Default::default() }.update(where_uuid(port_uuid)));
        }
        ops.push(Qos::delete(where_uuid(q)));
    }
    if ingress_bps > 0 {
        let qos = Qos {
            qos_type: Some("linux-htb".into()),
            other_config: Some([("max-rate".to_string(), ingress_bps.to_string())].into()),
            ..Default::default()
        };
        ops.push(qos.insert(Some("qos")));
        ops.push(Port { qos: Some(Some(Ref::named("qos"))), ..Default::default() }.update(where_uuid(port_uuid)));
    }
    if egress_bps > 0 {
        let rate = Interface { ingress_policing_rate: Some(egress_bps / 1024), ..Default::default() };
        ops.push(rate.update(where_name(name)));
    }
    Ok(ops)
}

impl Ovs {
    /// openshift-sdn's `SetPodBandwidth`, as one transaction: drop the port's
    /// existing QoS (clear `Port.qos`, destroy the row); if `ingress_bps > 0`
    /// attach a new `linux-htb` QoS with `other_config:max-rate`; if
    /// `egress_bps > 0` set `Interface.ingress_policing_rate` (kbps).
    /// (Pod ingress is OVS egress and vice versa.)
    pub async fn set_pod_bandwidth(&self, port: &str, ingress_bps: i64, egress_bps: i64) -> Result<(), OvsdbError> {
        self.retry("set_pod_bandwidth", || async {
            let found: Vec<Port> = self.select(where_name(port), &[Port::UUID, Port::QOS]).await?;
            let row = found.first().ok_or_else(|| OvsdbError::NotFound { table: "Port", name: port.to_string() })?;
            let ops = bandwidth_ops(port, row, ingress_bps, egress_bps)?;
            if ops.len() > 1 {
                self.transact(ops).await?;
            }
            Ok(())
        })
        .await
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

    fn port(name: &str) -> Port {
        Port::from_row(&fixtures::named(fixtures::PORT, name)).unwrap()
    }

    const TUN0: [&str; 2] = ["uuid", "9d302be5-2938-4b48-b9c0-1717edae0264"];
    const VETH1: [&str; 2] = ["uuid", "50ce6a0f-7aa8-4f5e-a077-c6235a738af8"];
    const QOS: [&str; 2] = ["uuid", "102af878-0c8c-47e4-8c5e-0ca76ca36a90"];

    #[test]
    fn limits_on_a_port_without_qos() {
        // What `ovs-vsctl set port tun0 qos=@q -- --id=@q create qos type=linux-htb
        // other-config:max-rate=1000000 -- set interface tun0 ingress_policing_rate=2000` does.
        assert_eq!(
            wire(&bandwidth_ops("tun0", &port("tun0"), 1_000_000, 2_048_000).unwrap()),
            json!([
                {"op": "wait", "timeout": 0, "table": "Port", "where": [["_uuid", "==", TUN0]], "columns": ["qos"], "until": "==", "rows": [{"qos": ["set", []]}]},
                {"op": "insert", "table": "QoS", "uuid-name": "qos", "row": {"type": "linux-htb", "other_config": ["map", [["max-rate", "1000000"]]]}},
                {"op": "update", "table": "Port", "where": [["_uuid", "==", TUN0]], "row": {"qos": ["named-uuid", "qos"]}},
                {"op": "update", "table": "Interface", "where": [["name", "==", "tun0"]], "row": {"ingress_policing_rate": 2000}}
            ])
        );
        // No limits and no QoS: only the guard, which the caller does not send.
        assert_eq!(bandwidth_ops("tun0", &port("tun0"), -1, -1).unwrap().len(), 1);
    }

    #[test]
    fn an_existing_qos_is_replaced_or_cleared() {
        // veth1 as ovs-vsctl left it: a QoS row referenced by the port.
        assert_eq!(
            wire(&bandwidth_ops("veth1", &port("veth1"), 5000, 0).unwrap()),
            json!([
                {"op": "wait", "timeout": 0, "table": "Port", "where": [["_uuid", "==", VETH1]], "columns": ["qos"], "until": "==", "rows": [{"qos": QOS}]},
                {"op": "delete", "table": "QoS", "where": [["_uuid", "==", QOS]]},
                {"op": "insert", "table": "QoS", "uuid-name": "qos", "row": {"type": "linux-htb", "other_config": ["map", [["max-rate", "5000"]]]}},
                {"op": "update", "table": "Port", "where": [["_uuid", "==", VETH1]], "row": {"qos": ["named-uuid", "qos"]}}
            ])
        );
        // The reference goes before the (root-table) row it points to.
        assert_eq!(
            wire(&bandwidth_ops("veth1", &port("veth1"), 0, 0).unwrap()[1..]),
            json!([
                {"op": "update", "table": "Port", "where": [["_uuid", "==", VETH1]], "row": {"qos": ["set", []]}},
                {"op": "delete", "table": "QoS", "where": [["_uuid", "==", QOS]]}
            ])
        );
    }

    #[tokio::test]
    async fn a_missing_port_is_not_found_and_nothing_is_written() {
        let fake = Fake::start(|_| json!([{"rows": []}]));
        assert!(matches!(fake.ovs.set_pod_bandwidth("gone", 1000, 1000).await, Err(OvsdbError::NotFound { table: "Port", .. })));
        let fake2 = Fake::start(|_| json!([{"rows": [{"_uuid": ["uuid", "p"], "qos": ["set", []]}]}]));
        fake2.ovs.set_pod_bandwidth("veth1", 0, 0).await.unwrap();
        assert_eq!(fake.transactions().len() + fake2.transactions().len(), 2, "reads only");
    }
}
