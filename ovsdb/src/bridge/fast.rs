//! The fast path for pod ports: a new port is one transaction (Interface, Port with its
//! record, bridge membership) and its ofport comes from the connection's Interface monitor; a
//! removal is one transaction without a read (the Port row's uuid and QoS come from the
//! monitor, and a `wait` checks them). Concurrent requests share transactions (group commit):
//! one ovs-vswitchd reconfiguration for a burst of pods instead of one each.

use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::port::iface_row;
use super::{wait_absent, where_name, where_uuid, Ovs, PortSpec};
use crate::datum::{NamedUuid, Ref, Set};
use crate::ifwatch::PortRow;
use crate::rows::{Bridge, Interface, Port, Qos, Table};
use crate::txn::{Condition, Mutation, Operation};
use crate::OvsdbError;

/// How many ports one group transaction carries at most.
const MAX_GROUP_PORTS: usize = 256;

/// A new port waiting for the group transaction that inserts it.
#[derive(Debug)]
pub(super) struct NewPort {
    bridge: String,
    name: String,
    spec: PortSpec,
    /// `Ok(true)`: inserted; `Ok(false)`: a port of that name exists already.
    reply: oneshot::Sender<Result<bool, OvsdbError>>,
}

/// A port waiting for the group transaction that removes it, as the monitor knows it.
#[derive(Debug)]
pub(super) struct OldPort {
    bridge: String,
    row: PortRow,
    /// `Ok(true)`: removed; `Ok(false)`: the row is not as the monitor said (changed meanwhile,
    /// or not on `bridge`): the caller reads and retries.
    reply: oneshot::Sender<Result<bool, OvsdbError>>,
}

/// The inserts of new port number `i` of a transaction: its Interface (`iface<i>`) and its
/// Port (`port<i>`, with the spec's `external_ids`).
fn new_port_ops(i: usize, p: &NewPort) -> [Operation; 2] {
    let iface = Interface { name: Some(p.name.clone()), ..iface_row(&p.spec) };
    let port = Port {
        name: Some(p.name.clone()),
        interfaces: Some(Set::one(Ref::named(format!("iface{i}")))),
        external_ids: Some(p.spec.external_ids.clone()),
        ..Default::default()
    };
    [iface.insert(Some(&format!("iface{i}"))), port.insert(Some(&format!("port{i}")))]
}

/// Adds the ports `port<i>` of the transaction to `bridge` (a count of 0: no such bridge).
fn add_to_bridge(bridge: &str, n: usize) -> Operation {
    let ports: Set<NamedUuid> = (0..n).map(|i| NamedUuid::new(format!("port{i}"))).collect();
    Bridge::mutate(where_name(bridge), vec![Mutation::insert(Bridge::PORTS, ports)])
}

/// A group of new ports on one bridge, without guards (a name that exists fails the whole
/// transaction, which is then retried port by port).
fn insert_group_ops(group: &[NewPort]) -> Vec<Operation> {
    let mut ops: Vec<Operation> = group.iter().enumerate().flat_map(|(i, p)| new_port_ops(i, p)).collect();
    ops.push(add_to_bridge(&group[0].bridge, group.len()));
    ops
}

/// One new port, guarded by "no port of that name exists"; its result 3 is the bridge's count.
fn insert_one_ops(p: &NewPort) -> Vec<Operation> {
    let mut ops = vec![wait_absent::<Port>(&p.name)];
    ops.extend(new_port_ops(0, p));
    ops.push(add_to_bridge(&p.bridge, 1));
    ops
}

/// The operations removing `p` from its bridge: guarded by "the Port row still exists with
/// this QoS" (the monitor's copy may be stale), the QoS row destroyed with it. The last one is
/// the `mutate`, whose count says whether the port was on the bridge.
fn old_port_ops(p: &OldPort) -> Vec<Operation> {
    let u = &p.row.uuid;
    let as_known = Port { qos: Some(p.row.qos.clone().map(Ref::from)), ..Default::default() };
    let mut ops = vec![Port::wait_eq(where_uuid(u), &[Port::QOS], &[as_known])];
    if let Some(q) = &p.row.qos {
        // QoS is a root table: it outlives the port unless destroyed; the reference goes first.
        ops.push(Port { qos: Some(None), ..Default::default() }.update(where_uuid(u)));
        ops.push(Qos::delete(where_uuid(q)));
    }
    let on_bridge = vec![Condition::eq(Bridge::NAME, &p.bridge), Condition::includes(Bridge::PORTS, u)];
    ops.push(Bridge::mutate(on_bridge, vec![Mutation::delete(Bridge::PORTS, Set::one(u.clone()))]));
    ops
}

type Commit<T> = for<'a> fn(&'a Ovs, Vec<T>) -> Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

impl Ovs {
    /// The fast path for a new port (a pod's): one transaction that inserts Interface and Port
    /// (with `spec.external_ids`) and adds the port to `bridge` — guarded by "no port of that
    /// name exists" — then the ofport from the connection's long-lived Interface monitor. Two
    /// round trips instead of seven. Returns `(ofport, created)`; a port that already exists
    /// takes [`Ovs::add_port_and_wait_ofport`] (and its external_ids are set), `created` false.
    pub async fn add_port_fast(
        &self,
        bridge: &str,
        name: &str,
        spec: &PortSpec,
        timeout: Duration,
    ) -> Result<(u32, bool), OvsdbError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let watch = tokio::time::timeout_at(deadline, self.interface_watch())
            .await
            .map_err(|_| OvsdbError::Timeout("starting the Interface monitor".into()))??;
        let (tx, rx) = oneshot::channel();
        let req = NewPort { bridge: bridge.to_string(), name: name.to_string(), spec: spec.clone(), reply: tx };
        tokio::time::timeout_at(deadline, self.inserter().send(req))
            .await
            .map_err(|_| OvsdbError::Timeout("queueing a new port".into()))?
            .map_err(|_| OvsdbError::Disconnected)?;
        let r = tokio::time::timeout_at(deadline, rx)
            .await
            .map_err(|_| OvsdbError::Timeout(format!("inserting port {name:?}")))?
            .map_err(|_| OvsdbError::Disconnected)?;
        match r {
            Ok(true) => Ok((watch.ofport(name, deadline).await?, true)),
            Ok(false) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let ofport = self.add_port_and_wait_ofport(bridge, name, spec, left).await?;
                for (k, v) in &spec.external_ids {
                    self.set_port_external_id(name, k, Some(v)).await?;
                }
                Ok((ofport, false))
            }
            Err(e) => Err(e),
        }
    }

    /// Removes a pod's port — its QoS row too, as `SetPodBandwidth(-1, -1)` then `del-port`
    /// would — in one transaction without a read: the Port row's uuid and QoS come from the
    /// connection's monitor and the transaction checks them. Concurrent removals share one
    /// transaction (one ovs-vswitchd reconfiguration for a burst of deletions). When the
    /// monitor does not know the port, or its copy is stale, it reads ([`Ovs::set_pod_bandwidth`]
    /// then [`Ovs::delete_port`]). A port already gone is fine. Returns whether this call
    /// removed a port.
    pub async fn remove_port_fast(&self, bridge: &str, name: &str) -> Result<bool, OvsdbError> {
        let watch = self.interface_watch().await?;
        if let Some(row) = watch.port(name) {
            let (tx, rx) = oneshot::channel();
            let req = OldPort { bridge: bridge.to_string(), row, reply: tx };
            self.remover().send(req).await.map_err(|_| OvsdbError::Disconnected)?;
            if rx.await.map_err(|_| OvsdbError::Disconnected)?? {
                return Ok(true);
            }
            debug!(port = name, "the monitor's copy of the port is stale; reading it");
        }
        match self.set_pod_bandwidth(name, -1, -1).await {
            Ok(()) | Err(OvsdbError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        self.delete_port(bridge, name).await
    }

    /// The group-commit task for new ports: whatever is queued while a transaction is in
    /// flight goes into the next one, so a burst of C pods costs ovs-vswitchd one
    /// reconfiguration instead of C. The group is optimistic (no per-port guard): if it fails
    /// — a port of one of the names exists, the bridge is missing — each port is retried on
    /// its own with a guard, so only the port at fault fails.
    fn inserter(&self) -> mpsc::Sender<NewPort> {
        self.group_commit(&self.inserts, |ovs, group| Box::pin(ovs.insert_group(group)))
    }

    /// The group-commit task for port removals, as [`Ovs::inserter`] for new ports.
    fn remover(&self) -> mpsc::Sender<OldPort> {
        self.group_commit(&self.removals, |ovs, group| Box::pin(ovs.remove_group(group)))
    }

    /// Starts (once per connection) a task that commits what `cell`'s channel receives in
    /// groups: whatever is queued while `commit` runs goes into its next call, up to
    /// [`MAX_GROUP_PORTS`] at a time.
    fn group_commit<T: Send + 'static>(&self, cell: &OnceLock<mpsc::Sender<T>>, commit: Commit<T>) -> mpsc::Sender<T> {
        cell.get_or_init(|| {
            let (tx, mut rx) = mpsc::channel::<T>(1024);
            // Not `self.clone()`: the task must not hold the sender it waits on, or it (and
            // the connection) would outlive every handle.
            let ovs = Ovs {
                client: self.client.clone(),
                max_attempts: self.max_attempts,
                ifwatch: self.ifwatch.clone(),
                inserts: Default::default(),
                removals: Default::default(),
            };
            tokio::spawn(async move {
                let mut group = Vec::new();
                loop {
                    let n = tokio::select! {
                        _ = ovs.client.closed() => return,
                        n = rx.recv_many(&mut group, MAX_GROUP_PORTS) => n,
                    };
                    if n == 0 {
                        return;
                    }
                    commit(&ovs, std::mem::take(&mut group)).await;
                }
            });
            tx
        })
        .clone()
    }

    async fn insert_group(&self, group: Vec<NewPort>) {
        if group.len() > 1 && group.iter().all(|p| p.bridge == group[0].bridge) {
            if let Ok(r) = self.transact(insert_group_ops(&group)).await {
                if r.last().and_then(|r| r.count) == Some(1) {
                    debug!(ports = group.len(), "new ports inserted in one transaction");
                    for p in group {
                        let _ = p.reply.send(Ok(true));
                    }
                    return;
                }
            }
        }
        for p in group {
            let r = self.insert_one(&p).await;
            let _ = p.reply.send(r);
        }
    }

    /// One new port, guarded by "no port of that name exists".
    async fn insert_one(&self, p: &NewPort) -> Result<bool, OvsdbError> {
        match self.transact(insert_one_ops(p)).await {
            Ok(r) if r.get(3).and_then(|r| r.count) == Some(1) => Ok(true),
            // The rows inserted are not referenced by any bridge: OVSDB collects them.
            Ok(_) => Err(OvsdbError::NotFound { table: "Bridge", name: p.bridge.clone() }),
            Err(e) if e.is_wait_conflict() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One transaction for the whole group; if it fails (one port's row changed, say), each
    /// port on its own, so only the port at fault falls back.
    async fn remove_group(&self, group: Vec<OldPort>) {
        if group.len() > 1 {
            let mut ops = Vec::new();
            let mut mutates = Vec::with_capacity(group.len());
            for p in &group {
                ops.extend(old_port_ops(p));
                mutates.push(ops.len() - 1);
            }
            if let Ok(r) = self.transact(ops).await {
                debug!(ports = group.len(), "ports removed in one transaction");
                for (p, i) in group.into_iter().zip(mutates) {
                    let _ = p.reply.send(Ok(r.get(i).and_then(|r| r.count) == Some(1)));
                }
                return;
            }
        }
        for p in group {
            let r = match self.transact(old_port_ops(&p)).await {
                Ok(r) => Ok(r.last().and_then(|r| r.count) == Some(1)),
                Err(e) if e.is_wait_conflict() => Ok(false),
                Err(e) => Err(e),
            };
            let _ = p.reply.send(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datum::Uuid;
    use serde_json::{json, Value};

    fn wire(ops: &[Operation]) -> Value {
        serde_json::to_value(ops).unwrap()
    }

    fn new_port(name: &str, spec: PortSpec) -> NewPort {
        NewPort { bridge: "br0".into(), name: name.into(), spec, reply: oneshot::channel().0 }
    }

    fn pod_spec() -> PortSpec {
        PortSpec { external_ids: [("sdn-node-pod".to_string(), r#"{"ns":"a"}"#.to_string())].into(), ..PortSpec::system() }
    }

    #[test]
    fn a_new_pod_port_is_one_guarded_transaction() {
        assert_eq!(
            wire(&insert_one_ops(&new_port("veth2", pod_spec()))),
            json!([
                {"op": "wait", "timeout": 0, "table": "Port", "where": [["name", "==", "veth2"]], "columns": ["_uuid"], "until": "==", "rows": []},
                {"op": "insert", "table": "Interface", "uuid-name": "iface0", "row": {"name": "veth2", "type": "", "options": ["map", []], "ofport_request": ["set", []]}},
                {"op": "insert", "table": "Port", "uuid-name": "port0", "row": {
                    "name": "veth2", "interfaces": ["set", [["named-uuid", "iface0"]]], "external_ids": ["map", [["sdn-node-pod", "{\"ns\":\"a\"}"]]]}},
                {"op": "mutate", "table": "Bridge", "where": [["name", "==", "br0"]], "mutations": [["ports", "insert", ["set", [["named-uuid", "port0"]]]]]}
            ])
        );
    }

    /// The rows are the ones `ovs-vsctl add-port br0 veth2 -- set interface veth2 type=dummy`
    /// inserts (captured from its JSON-RPC log), with the defaults it leaves out written out.
    #[test]
    fn the_rows_are_ovs_vsctls() {
        let ops = new_port_ops(0, &new_port("veth2", PortSpec::of_type("dummy")));
        let Operation::Insert { row: iface, .. } = &ops[0] else { panic!() };
        let Operation::Insert { row: port, .. } = &ops[1] else { panic!() };
        let vsctl_iface: crate::types::Row = serde_json::from_str(r#"{"name": "veth2", "type": "dummy"}"#).unwrap();
        let vsctl_port: crate::types::Row =
            serde_json::from_str(r#"{"name": "veth2", "interfaces": ["named-uuid", "iface0"]}"#).unwrap();
        let defaults = Interface { options: Some(Default::default()), ofport_request: Some(None), ..Default::default() };
        let mut want = Interface::from_row(&vsctl_iface).unwrap();
        want.options = defaults.options;
        want.ofport_request = defaults.ofport_request;
        assert_eq!(Interface::from_row(iface).unwrap(), want);
        let mut want = Port::from_row(&vsctl_port).unwrap();
        want.external_ids = Some(Default::default());
        assert_eq!(Port::from_row(port).unwrap(), want);
    }

    #[test]
    fn a_group_shares_one_bridge_mutation() {
        let group = [new_port("a", PortSpec::internal(None)), new_port("b", PortSpec::internal(Some(9)))];
        let ops = insert_group_ops(&group);
        assert_eq!(ops.len(), 5);
        let w = wire(&ops);
        assert_eq!((w[2]["uuid-name"].clone(), w[3]["row"]["interfaces"].clone()), (json!("iface1"), json!(["set", [["named-uuid", "iface1"]]])));
        assert_eq!(w[2]["row"]["ofport_request"], 9);
        assert_eq!(w[4]["mutations"], json!([["ports", "insert", ["set", [["named-uuid", "port0"], ["named-uuid", "port1"]]]]]));
    }

    #[test]
    fn a_removal_checks_the_monitors_copy_and_takes_the_qos() {
        let old = |qos: Option<&str>| OldPort {
            bridge: "br0".into(),
            row: PortRow { uuid: Uuid::new("p"), qos: qos.map(Uuid::new) },
            reply: oneshot::channel().0,
        };
        let on_br0 = json!([["name", "==", "br0"], ["ports", "includes", ["uuid", "p"]]]);
        assert_eq!(
            wire(&old_port_ops(&old(None))),
            json!([
                {"op": "wait", "timeout": 0, "table": "Port", "where": [["_uuid", "==", ["uuid", "p"]]], "columns": ["qos"], "until": "==", "rows": [{"qos": ["set", []]}]},
                {"op": "mutate", "table": "Bridge", "where": on_br0, "mutations": [["ports", "delete", ["set", [["uuid", "p"]]]]]}
            ])
        );
        assert_eq!(
            wire(&old_port_ops(&old(Some("q")))[..3]),
            json!([
                {"op": "wait", "timeout": 0, "table": "Port", "where": [["_uuid", "==", ["uuid", "p"]]], "columns": ["qos"], "until": "==", "rows": [{"qos": ["uuid", "q"]}]},
                {"op": "update", "table": "Port", "where": [["_uuid", "==", ["uuid", "p"]]], "row": {"qos": ["set", []]}},
                {"op": "delete", "table": "QoS", "where": [["_uuid", "==", ["uuid", "q"]]]}
            ])
        );
    }
}
