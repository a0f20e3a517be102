//! Typed, idempotent operations on the `Open_vSwitch` database: what the
//! openshift-sdn controller did with `ovs-vsctl`, without exec'ing it.
//!
//! Every operation is a single OVSDB transaction. Where the write depends on
//! what we read (read-modify-write), the transaction starts with a `wait`
//! operation (timeout 0) asserting that the rows we read are unchanged; if
//! another client changed them in between, the server rejects the whole
//! transaction with "timed out" and we re-read and retry, a bounded number of
//! times. Where a single transaction can express the change on its own (map
//! `mutate` delete+insert), no read is needed at all.
//!
//! Rows of `Bridge`, `Port` and `Interface` are not roots in the schema: once
//! nothing references them, ovsdb-server garbage-collects them, so deleting a
//! port is just removing it from `Bridge.ports`. `QoS` *is* a root table, so a
//! QoS row has to be destroyed explicitly (as `SetPodBandwidth` does).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde_json::{json, Value};
use tracing::debug;

use super::client::{MonitorRequest, OvsdbClient};
use super::txn::{self, OperationResult};
use super::types::{
    cond_eq, empty_set, named_uuid, optional_integer, row_opt_i64, row_opt_string, row_opt_uuid,
    row_string, row_string_map, row_string_set, row_uuid, row_uuid_set, set, string_map, uuid, Row,
};
use super::{OvsdbError, VSWITCH_DB};

/// Default number of attempts for optimistic read-modify-write transactions.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// Desired configuration of a bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeOptions {
    /// `secure` or `standalone`; `None` leaves it unset (OVS default: standalone).
    pub fail_mode: Option<String>,
    /// e.g. `["OpenFlow13"]`.
    pub protocols: Vec<String>,
    /// `""`/`"system"` (kernel), `"netdev"` (userspace) or `"dummy"` (tests).
    pub datapath_type: String,
}

impl Default for BridgeOptions {
    /// What openshift-sdn uses: `fail-mode=secure protocols=OpenFlow13`.
    fn default() -> Self {
        BridgeOptions {
            fail_mode: Some("secure".into()),
            protocols: vec!["OpenFlow13".into()],
            datapath_type: String::new(),
        }
    }
}

/// Desired configuration of a port (and its single interface of the same name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSpec {
    pub ofport_request: Option<i64>,
    /// Interface type: `""` (system device), `"internal"`, `"vxlan"`, `"dummy"`...
    pub iface_type: String,
    /// Interface options, e.g. `remote_ip=flow`, `key=flow`.
    pub options: BTreeMap<String, String>,
    /// The Port's `external_ids`, written with the port when [`Ovs::add_port_fast`] creates it.
    pub external_ids: BTreeMap<String, String>,
    /// The Interface's `mac` (`xx:xx:xx:xx:xx:xx`); `None` leaves the column as it is.
    pub mac: Option<String>,
    /// A port of this name on another bridge is moved onto this one; otherwise
    /// [`Ovs::ensure_port`] refuses it ([`OvsdbError::OnOtherBridge`]) and changes nothing.
    pub take_from_other_bridge: bool,
}

impl PortSpec {
    /// `vxlan0`: `type=vxlan options:remote_ip=flow options:key=flow`.
    pub fn vxlan_flow(ofport_request: i64) -> Self {
        PortSpec {
            ofport_request: Some(ofport_request),
            iface_type: "vxlan".into(),
            options: [("remote_ip", "flow"), ("key", "flow")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            external_ids: BTreeMap::new(),
            mac: None,
            take_from_other_bridge: false,
        }
    }

    /// `tun0`: `type=internal`.
    pub fn internal(ofport_request: Option<i64>) -> Self {
        PortSpec {
            ofport_request,
            iface_type: "internal".into(),
            options: BTreeMap::new(),
            external_ids: BTreeMap::new(),
            mac: None,
            take_from_other_bridge: false,
        }
    }

    /// An existing network device (e.g. a pod's host-side veth).
    pub fn system() -> Self {
        PortSpec::default()
    }

    /// Any interface type without options.
    pub fn of_type(iface_type: &str) -> Self {
        PortSpec {
            iface_type: iface_type.into(),
            ..Default::default()
        }
    }
}

/// A bridge as [`Ovs::bridges`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeInfo {
    pub name: String,
    /// `Bridge.datapath_type` as stored (empty means system).
    pub datapath_type: String,
    /// Its ports' names, sorted (its own port included).
    pub ports: Vec<String>,
}

/// What an `ensure_*` call had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    Created,
    Updated,
    Unchanged,
}

/// Operations on the `Open_vSwitch` database over one [`OvsdbClient`].
#[derive(Debug, Clone)]
pub struct Ovs {
    client: OvsdbClient,
    max_attempts: u32,
    /// The connection's Interface monitor, started on first use (and again if it ended).
    ifwatch: std::sync::Arc<tokio::sync::Mutex<Option<super::ifwatch::InterfaceWatch>>>,
    /// Group commit of new ports (see [`Ovs::add_port_fast`]), started on first use.
    inserts: std::sync::Arc<std::sync::OnceLock<tokio::sync::mpsc::Sender<NewPort>>>,
    /// Group commit of port removals (see [`Ovs::remove_port_fast`]), started on first use.
    removals: std::sync::Arc<std::sync::OnceLock<tokio::sync::mpsc::Sender<OldPort>>>,
}

/// A port waiting for the group transaction that removes it, as the monitor knows it.
#[derive(Debug)]
struct OldPort {
    bridge: String,
    row: super::ifwatch::PortRow,
    /// `Ok(true)`: removed; `Ok(false)`: the row is not as the monitor said (changed meanwhile,
    /// or not on `bridge`): the caller reads and retries.
    reply: tokio::sync::oneshot::Sender<Result<bool, OvsdbError>>,
}

/// The operations removing `p` from its bridge: guarded by "the Port row still exists with
/// this QoS" (the monitor's copy may be stale), the QoS row destroyed with it. The last one is
/// the `mutate`, whose count says whether the port was on the bridge.
fn old_port_ops(p: &OldPort) -> Vec<Value> {
    let u = &p.row.uuid;
    let qos = match &p.row.qos {
        Some(q) => uuid(q),
        None => empty_set(),
    };
    let mut ops = vec![txn::wait_eq("Port", where_uuid(u), &["qos"], vec![json!({ "qos": qos })])];
    if let Some(q) = &p.row.qos {
        // QoS is a root table: it outlives the port unless destroyed; the reference goes first.
        ops.push(txn::update("Port", where_uuid(u), json!({"qos": empty_set()})));
        ops.push(txn::delete("QoS", where_uuid(q)));
    }
    ops.push(txn::mutate(
        "Bridge",
        vec![cond_eq("name", json!(p.bridge)), json!(["ports", "includes", uuid(u)])],
        vec![json!(["ports", "delete", set([uuid(u)])])],
    ));
    ops
}

/// A new port waiting for the group transaction that inserts it.
#[derive(Debug)]
struct NewPort {
    bridge: String,
    name: String,
    spec: PortSpec,
    /// `Ok(true)`: inserted; `Ok(false)`: a port of that name exists already.
    reply: tokio::sync::oneshot::Sender<Result<bool, OvsdbError>>,
}

/// How many new ports one group transaction carries at most.
const MAX_GROUP_PORTS: usize = 256;

fn new_port_ops(i: usize, p: &NewPort) -> [Value; 2] {
    let mut iface = json!({
        "name": p.name,
        "type": p.spec.iface_type,
        "options": string_map(&p.spec.options),
        "ofport_request": optional_integer(p.spec.ofport_request),
    });
    if let Some(mac) = &p.spec.mac {
        iface["mac"] = json!(mac);
    }
    let port = json!({"name": p.name, "interfaces": named_uuid(&format!("iface{i}")), "external_ids": string_map(&p.spec.external_ids)});
    [txn::insert("Interface", iface, Some(&format!("iface{i}"))), txn::insert("Port", port, Some(&format!("port{i}")))]
}

fn where_name(name: &str) -> Vec<Value> {
    vec![cond_eq("name", json!(name))]
}

fn where_uuid(u: &str) -> Vec<Value> {
    vec![cond_eq("_uuid", uuid(u))]
}

/// Guard: the row `u` still exists.
fn wait_exists(table: &str, u: &str) -> Value {
    txn::wait_eq(
        table,
        where_uuid(u),
        &["_uuid"],
        vec![json!({"_uuid": uuid(u)})],
    )
}

/// Guard: no row named `name` exists.
fn wait_absent(table: &str, name: &str) -> Value {
    txn::wait_eq(table, where_name(name), &["_uuid"], vec![])
}

fn rows(mut results: Vec<OperationResult>, i: usize) -> Result<Vec<Row>, OvsdbError> {
    if i >= results.len() {
        return Err(OvsdbError::Protocol(format!("missing result {i}")));
    }
    std::mem::take(&mut results[i]).into_rows()
}

fn same_iface_type(a: &str, b: &str) -> bool {
    let norm = |t: &str| if t == "system" { "" } else { t }.to_string();
    norm(a) == norm(b)
}

impl Ovs {
    pub fn new(client: OvsdbClient) -> Self {
        Ovs {
            client,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            ifwatch: Default::default(),
            inserts: Default::default(),
            removals: Default::default(),
        }
    }

    /// Sets the bound on optimistic-concurrency retries.
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    pub fn client(&self) -> &OvsdbClient {
        &self.client
    }

    async fn transact(&self, ops: Vec<Value>) -> Result<Vec<OperationResult>, OvsdbError> {
        self.client.transact(VSWITCH_DB, ops).await
    }

    async fn select(
        &self,
        table: &str,
        where_: Vec<Value>,
        cols: &[&str],
    ) -> Result<Vec<Row>, OvsdbError> {
        rows(
            self.transact(vec![txn::select(table, where_, cols)])
                .await?,
            0,
        )
    }

    async fn retry<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T, OvsdbError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, OvsdbError>>,
    {
        for attempt in 1..=self.max_attempts {
            match f().await {
                Err(e) if e.is_wait_conflict() => {
                    debug!(what, attempt, "concurrent change detected; retrying");
                }
                r => return r,
            }
        }
        Err(OvsdbError::Conflict {
            what: what.to_string(),
            attempts: self.max_attempts,
        })
    }

    /// Ensures the single `Open_vSwitch` row exists (`ovs-vsctl --no-wait
    /// init`); returns its uuid.
    pub async fn init(&self) -> Result<String, OvsdbError> {
        self.retry("init", || async {
            let existing = self.select("Open_vSwitch", vec![], &["_uuid"]).await?;
            if let Some(r) = existing.first() {
                return row_uuid(r, "_uuid");
            }
            let res = self
                .transact(vec![
                    txn::wait_eq("Open_vSwitch", vec![], &["_uuid"], vec![]),
                    txn::insert("Open_vSwitch", json!({}), None),
                ])
                .await?;
            res.get(1)
                .and_then(|r| r.uuid.clone())
                .ok_or_else(|| OvsdbError::Protocol("insert returned no uuid".into()))
        })
        .await
    }

    /// Creates the bridge (with its internal port/interface of the same name)
    /// or fixes its `fail_mode`/`protocols`/`datapath_type`.
    pub async fn ensure_bridge(
        &self,
        name: &str,
        opts: &BridgeOptions,
    ) -> Result<Ensured, OvsdbError> {
        self.init().await?;
        let fail_mode = match &opts.fail_mode {
            Some(m) => json!(m),
            None => empty_set(),
        };
        let protocols = set(opts.protocols.iter().map(|p| json!(p)));
        let desired = json!({
            "fail_mode": fail_mode,
            "protocols": protocols,
            "datapath_type": opts.datapath_type,
        });
        self.retry("ensure_bridge", || async {
            let found = self
                .select(
                    "Bridge",
                    where_name(name),
                    &["_uuid", "fail_mode", "protocols", "datapath_type"],
                )
                .await?;
            let Some(br) = found.first() else {
                let mut row = desired.clone();
                row["name"] = json!(name);
                row["ports"] = named_uuid("port");
                self.transact(vec![
                    wait_absent("Bridge", name),
                    txn::insert(
                        "Interface",
                        json!({"name": name, "type": "internal"}),
                        Some("iface"),
                    ),
                    txn::insert(
                        "Port",
                        json!({"name": name, "interfaces": named_uuid("iface")}),
                        Some("port"),
                    ),
                    txn::insert("Bridge", row, Some("bridge")),
                    txn::mutate(
                        "Open_vSwitch",
                        vec![],
                        vec![json!(["bridges", "insert", set([named_uuid("bridge")])])],
                    ),
                ])
                .await?;
                return Ok(Ensured::Created);
            };
            let u = row_uuid(br, "_uuid")?;
            let mut have_protocols = row_string_set(br, "protocols")?;
            have_protocols.sort();
            let mut want_protocols = opts.protocols.clone();
            want_protocols.sort();
            want_protocols.dedup();
            if row_opt_string(br, "fail_mode")? == opts.fail_mode
                && have_protocols == want_protocols
                && row_string(br, "datapath_type")? == opts.datapath_type
            {
                return Ok(Ensured::Unchanged);
            }
            self.transact(vec![
                wait_exists("Bridge", &u),
                txn::update("Bridge", where_uuid(&u), desired.clone()),
            ])
            .await?;
            Ok(Ensured::Updated)
        })
        .await
    }

    /// Creates the port on `bridge` or brings an existing one in line with
    /// `spec` (type, options, ofport_request, and membership of `bridge`).
    pub async fn ensure_port(
        &self,
        bridge: &str,
        name: &str,
        spec: &PortSpec,
    ) -> Result<Ensured, OvsdbError> {
        self.retry("ensure_port", || self.try_ensure_port(bridge, name, spec))
            .await
    }

    async fn try_ensure_port(
        &self,
        bridge: &str,
        name: &str,
        spec: &PortSpec,
    ) -> Result<Ensured, OvsdbError> {
        let res = self
            .transact(vec![
                txn::select("Bridge", vec![], &["_uuid", "name", "ports"]),
                txn::select("Port", where_name(name), &["_uuid"]),
                txn::select(
                    "Interface",
                    where_name(name),
                    &["_uuid", "type", "options", "ofport_request", "mac"],
                ),
            ])
            .await?;
        let bridges = rows(res.clone(), 0)?;
        let ports = rows(res.clone(), 1)?;
        let ifaces = rows(res, 2)?;
        let mut target = None;
        let mut all = Vec::new();
        for b in &bridges {
            let u = row_uuid(b, "_uuid")?;
            let p = row_uuid_set(b, "ports")?;
            if row_string(b, "name")? == bridge {
                target = Some((u.clone(), p.clone()));
            }
            all.push((u, p));
        }
        let Some((br_uuid, br_ports)) = target else {
            return Err(OvsdbError::NotFound {
                table: "Bridge",
                name: bridge.to_string(),
            });
        };
        let mut iface_row = json!({
            "type": spec.iface_type,
            "options": string_map(&spec.options),
            "ofport_request": optional_integer(spec.ofport_request),
        });
        if let Some(mac) = &spec.mac {
            iface_row["mac"] = json!(mac);
        }

        let Some(port) = ports.first() else {
            let mut row = iface_row;
            row["name"] = json!(name);
            self.transact(vec![
                wait_exists("Bridge", &br_uuid),
                wait_absent("Port", name),
                txn::insert("Interface", row, Some("iface")),
                txn::insert(
                    "Port",
                    json!({"name": name, "interfaces": named_uuid("iface")}),
                    Some("port"),
                ),
                txn::mutate(
                    "Bridge",
                    where_uuid(&br_uuid),
                    vec![json!(["ports", "insert", set([named_uuid("port")])])],
                ),
            ])
            .await?;
            return Ok(Ensured::Created);
        };

        let port_uuid = row_uuid(port, "_uuid")?;
        if !spec.take_from_other_bridge && !br_ports.contains(&port_uuid) {
            for b in &bridges {
                if row_uuid_set(b, "ports")?.contains(&port_uuid) {
                    return Err(OvsdbError::OnOtherBridge { port: name.to_string(), on: row_string(b, "name")?, bridge: bridge.to_string() });
                }
            }
        }
        let iface = ifaces.first().ok_or_else(|| OvsdbError::NotFound {
            table: "Interface",
            name: name.to_string(),
        })?;
        let iface_uuid = row_uuid(iface, "_uuid")?;
        let mut ops = vec![
            wait_exists("Port", &port_uuid),
            wait_exists("Interface", &iface_uuid),
        ];
        if !same_iface_type(&row_string(iface, "type")?, &spec.iface_type)
            || row_string_map(iface, "options")? != spec.options
            || row_opt_i64(iface, "ofport_request")? != spec.ofport_request
            || (spec.mac.is_some() && row_opt_string(iface, "mac")? != spec.mac)
        {
            ops.push(txn::update("Interface", where_uuid(&iface_uuid), iface_row));
        }
        for (u, p) in &all {
            if *u != br_uuid && p.contains(&port_uuid) {
                ops.push(txn::mutate(
                    "Bridge",
                    where_uuid(u),
                    vec![json!(["ports", "delete", set([uuid(&port_uuid)])])],
                ));
            }
        }
        if !br_ports.contains(&port_uuid) {
            ops.push(wait_exists("Bridge", &br_uuid));
            ops.push(txn::mutate(
                "Bridge",
                where_uuid(&br_uuid),
                vec![json!(["ports", "insert", set([uuid(&port_uuid)])])],
            ));
        }
        if ops.len() == 2 {
            return Ok(Ensured::Unchanged);
        }
        self.transact(ops).await?;
        Ok(Ensured::Updated)
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
        let timed_out =
            || OvsdbError::Timeout(format!("waiting for an ofport for interface {name:?}"));
        // Monitor first, then write and read: a change can then never slip
        // between our read and the start of the notifications.
        let reqs: BTreeMap<String, MonitorRequest> = [(
            "Interface".to_string(),
            MonitorRequest::columns(["name", "ofport", "error"])
                .with_conditions(vec![cond_eq("name", json!(name))]),
        )]
        .into();
        let mut mon =
            tokio::time::timeout_at(deadline, self.client.monitor_cond(VSWITCH_DB, &reqs))
                .await
                .map_err(|_| timed_out())??;
        let wait = async {
            let change = self.ensure_port(bridge, name, spec).await?;
            let want = if change == Ensured::Updated {
                spec.ofport_request
            } else {
                None
            };
            loop {
                let found = self
                    .select("Interface", where_name(name), &["ofport", "error"])
                    .await?;
                let Some(row) = found.first() else {
                    return Err(OvsdbError::NotFound {
                        table: "Interface",
                        name: name.to_string(),
                    });
                };
                match row_opt_i64(row, "ofport")? {
                    Some(-1) => {
                        return Err(OvsdbError::InterfaceError {
                            name: name.to_string(),
                            error: row_opt_string(row, "error")?
                                .unwrap_or_else(|| "ofport is -1 (no error reported)".to_string()),
                        })
                    }
                    Some(p) if p > 0 && want.is_none_or(|w| w == p) => {
                        return u32::try_from(p)
                            .map_err(|_| OvsdbError::Protocol(format!("ofport {p} out of range")));
                    }
                    _ => {}
                }
                if mon.updates.recv().await.is_none() {
                    return Err(match mon.updates.end_reason() {
                        Some(super::MonitorEnd::Disconnected) | None => OvsdbError::Disconnected,
                        Some(other) => {
                            OvsdbError::Protocol(format!("interface monitor ended: {other:?}"))
                        }
                    });
                }
            }
        };
        let result = tokio::time::timeout_at(deadline, wait)
            .await
            .unwrap_or_else(|_| Err(timed_out()));
        if !self.client.is_closed() {
            let _ = self.client.monitor_cancel(&mon.id).await;
        }
        result
    }

    /// The connection's Interface monitor.
    pub async fn interface_watch(&self) -> Result<super::ifwatch::InterfaceWatch, OvsdbError> {
        let mut w = self.ifwatch.lock().await;
        if let Some(live) = w.as_ref().filter(|w| w.is_live()) {
            return Ok(live.clone());
        }
        let new = super::ifwatch::InterfaceWatch::start(&self.client).await?;
        *w = Some(new.clone());
        Ok(new)
    }

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
        let (tx, rx) = tokio::sync::oneshot::channel();
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
                let ofport = self.add_port_and_wait_ofport(bridge, name, spec, deadline.saturating_duration_since(tokio::time::Instant::now())).await?;
                for (k, v) in &spec.external_ids {
                    self.set_port_external_id(name, k, Some(v)).await?;
                }
                Ok((ofport, false))
            }
            Err(e) => Err(e),
        }
    }

    /// The group-commit task for new ports: whatever is queued while a transaction is in
    /// flight goes into the next one, so a burst of C pods costs ovs-vswitchd one
    /// reconfiguration instead of C. The group is optimistic (no per-port guard): if it fails
    /// — a port of one of the names exists, the bridge is missing — each port is retried on
    /// its own with a guard, so only the port at fault fails.
    fn inserter(&self) -> tokio::sync::mpsc::Sender<NewPort> {
        self.group_commit(&self.inserts, |ovs, group| Box::pin(ovs.insert_group(group)))
    }

    /// Starts (once per connection) a task that commits what `cell`'s channel receives in
    /// groups: whatever is queued while `commit` runs goes into its next call, up to
    /// [`MAX_GROUP_PORTS`] at a time.
    fn group_commit<T: Send + 'static>(
        &self,
        cell: &std::sync::OnceLock<tokio::sync::mpsc::Sender<T>>,
        commit: impl for<'a> Fn(&'a Ovs, Vec<T>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> + Send + 'static,
    ) -> tokio::sync::mpsc::Sender<T> {
        cell.get_or_init(|| {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<T>(1024);
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
            let mut ops = Vec::with_capacity(2 * group.len() + 1);
            for (i, p) in group.iter().enumerate() {
                ops.extend(new_port_ops(i, p));
            }
            let ports: Vec<Value> = (0..group.len()).map(|i| named_uuid(&format!("port{i}"))).collect();
            ops.push(txn::mutate("Bridge", where_name(&group[0].bridge), vec![json!(["ports", "insert", set(ports)])]));
            if let Ok(r) = self.transact(ops).await {
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
        let mut ops = vec![wait_absent("Port", &p.name)];
        ops.extend(new_port_ops(0, p));
        ops.push(txn::mutate("Bridge", where_name(&p.bridge), vec![json!(["ports", "insert", set([named_uuid("port0")])])]));
        match self.transact(ops).await {
            Ok(r) if r.get(3).and_then(|r| r.count) == Some(1) => Ok(true),
            // The rows inserted are not referenced by any bridge: OVSDB collects them.
            Ok(_) => Err(OvsdbError::NotFound { table: "Bridge", name: p.bridge.clone() }),
            Err(e) if e.is_wait_conflict() => Ok(false),
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
            let (tx, rx) = tokio::sync::oneshot::channel();
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

    /// The group-commit task for port removals, as [`Ovs::inserter`] for new ports.
    fn remover(&self) -> tokio::sync::mpsc::Sender<OldPort> {
        self.group_commit(&self.removals, |ovs, group| Box::pin(ovs.remove_group(group)))
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

    /// Removes the port from the bridge (rows are garbage-collected).
    /// Returns false if there was nothing to delete.
    pub async fn delete_port(&self, bridge: &str, name: &str) -> Result<bool, OvsdbError> {
        let res = self
            .transact(vec![
                txn::select("Port", where_name(name), &["_uuid"]),
                txn::select("Bridge", where_name(bridge), &["_uuid", "ports"]),
            ])
            .await?;
        let ports = rows(res.clone(), 0)?;
        let bridges = rows(res, 1)?;
        let (Some(port), Some(br)) = (ports.first(), bridges.first()) else {
            return Ok(false);
        };
        let port_uuid = row_uuid(port, "_uuid")?;
        if !row_uuid_set(br, "ports")?.contains(&port_uuid) {
            return Ok(false);
        }
        // Deleting an element that is already gone is a no-op: no guard needed.
        self.transact(vec![txn::mutate(
            "Bridge",
            where_uuid(&row_uuid(br, "_uuid")?),
            vec![json!(["ports", "delete", set([uuid(&port_uuid)])])],
        )])
        .await?;
        Ok(true)
    }

    /// Every bridge with its datapath type and its ports' names, in one read.
    pub async fn bridges(&self) -> Result<Vec<BridgeInfo>, OvsdbError> {
        let res = self
            .transact(vec![
                txn::select("Bridge", vec![], &["name", "datapath_type", "ports"]),
                txn::select("Port", vec![], &["_uuid", "name"]),
            ])
            .await?;
        let mut names = BTreeMap::new();
        for p in rows(res.clone(), 1)? {
            names.insert(row_uuid(&p, "_uuid")?, row_string(&p, "name")?);
        }
        let mut out = Vec::new();
        for b in rows(res, 0)? {
            let mut ports: Vec<String> = row_uuid_set(&b, "ports")?.iter().filter_map(|u| names.get(u).cloned()).collect();
            ports.sort();
            out.push(BridgeInfo { name: row_string(&b, "name")?, datapath_type: row_string(&b, "datapath_type")?, ports });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Names of the ports on `bridge` (including the bridge's own port).
    pub async fn list_ports(&self, bridge: &str) -> Result<Vec<String>, OvsdbError> {
        let res = self
            .transact(vec![
                txn::select("Bridge", where_name(bridge), &["ports"]),
                txn::select("Port", vec![], &["_uuid", "name"]),
            ])
            .await?;
        let br = rows(res.clone(), 0)?;
        let br = br.first().ok_or_else(|| OvsdbError::NotFound {
            table: "Bridge",
            name: bridge.to_string(),
        })?;
        let members = row_uuid_set(br, "ports")?;
        let mut names = Vec::new();
        for p in rows(res, 1)? {
            if members.contains(&row_uuid(&p, "_uuid")?) {
                names.push(row_string(&p, "name")?);
            }
        }
        names.sort();
        Ok(names)
    }

    /// openshift-sdn's `SetPodBandwidth`, as one transaction: drop the port's
    /// existing QoS (clear `Port.qos`, destroy the row); if `ingress_bps > 0`
    /// attach a new `linux-htb` QoS with `other_config:max-rate`; if
    /// `egress_bps > 0` set `Interface.ingress_policing_rate` (kbps).
    /// (Pod ingress is OVS egress and vice versa.)
    pub async fn set_pod_bandwidth(
        &self,
        port: &str,
        ingress_bps: i64,
        egress_bps: i64,
    ) -> Result<(), OvsdbError> {
        self.retry("set_pod_bandwidth", || async {
            let found = self
                .select("Port", where_name(port), &["_uuid", "qos"])
                .await?;
            let row = found.first().ok_or_else(|| OvsdbError::NotFound {
                table: "Port",
                name: port.to_string(),
            })?;
            let port_uuid = row_uuid(row, "_uuid")?;
            let qos_datum = row
                .get("qos")
                .cloned()
                .ok_or_else(|| OvsdbError::Protocol("Port row has no qos column".into()))?;
            let old_qos = row_opt_uuid(row, "qos")?;
            let mut ops = vec![txn::wait_eq(
                "Port",
                where_uuid(&port_uuid),
                &["qos"],
                vec![json!({ "qos": qos_datum })],
            )];
            if let Some(q) = &old_qos {
                if ingress_bps <= 0 {
                    ops.push(txn::update(
                        "Port",
                        where_uuid(&port_uuid),
                        json!({"qos": empty_set()}),
                    ));
                }
                ops.push(txn::delete("QoS", where_uuid(q)));
            }
            if ingress_bps > 0 {
                let cfg: BTreeMap<String, String> =
                    [("max-rate".to_string(), ingress_bps.to_string())].into();
                ops.push(txn::insert(
                    "QoS",
                    json!({"type": "linux-htb", "other_config": string_map(&cfg)}),
                    Some("qos"),
                ));
                ops.push(txn::update(
                    "Port",
                    where_uuid(&port_uuid),
                    json!({"qos": named_uuid("qos")}),
                ));
            }
            if egress_bps > 0 {
                ops.push(txn::update(
                    "Interface",
                    where_name(port),
                    json!({"ingress_policing_rate": egress_bps / 1024}),
                ));
            }
            if ops.len() > 1 {
                self.transact(ops).await?;
            }
            Ok(())
        })
        .await
    }

    async fn string_map_of(
        &self,
        table: &'static str,
        where_: Vec<Value>,
        name: &str,
        col: &str,
    ) -> Result<BTreeMap<String, String>, OvsdbError> {
        let found = self.select(table, where_, &[col]).await?;
        let row = found.first().ok_or_else(|| OvsdbError::NotFound {
            table,
            name: name.to_string(),
        })?;
        row_string_map(row, col)
    }

    /// Atomically sets (`value = Some`) or removes (`None`) one key of a map
    /// column: delete-by-key then insert, in one `mutate`, so no read is needed.
    async fn mutate_map_key(
        &self,
        table: &'static str,
        where_: Vec<Value>,
        name: &str,
        col: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), OvsdbError> {
        self.mutate_map(table, where_, name, col, &[key], value.map(|v| (key, v))).await
    }

    /// Atomically removes the keys `remove` of a map column and then sets `set` (if any), in
    /// one `mutate`; a missing row is [`OvsdbError::NotFound`].
    async fn mutate_map(
        &self,
        table: &'static str,
        where_: Vec<Value>,
        name: &str,
        col: &str,
        remove: &[&str],
        set_kv: Option<(&str, &str)>,
    ) -> Result<(), OvsdbError> {
        let mut mutations = vec![json!([col, "delete", set(remove.iter().map(|k| json!(k)))])];
        if let Some((key, v)) = set_kv {
            mutations.push(json!([col, "insert", ["map", [[key, v]]]]));
        }
        let res = self
            .transact(vec![txn::mutate(table, where_, mutations)])
            .await?;
        if res.first().and_then(|r| r.count) == Some(0) {
            return Err(OvsdbError::NotFound {
                table,
                name: name.to_string(),
            });
        }
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) one key of `Port.external_ids`.
    pub async fn set_port_external_id(&self, port: &str, key: &str, value: Option<&str>) -> Result<(), OvsdbError> {
        self.mutate_map_key("Port", where_name(port), port, "external_ids", key, value).await
    }

    /// In one transaction, removes key `old` of `Port.external_ids` and sets `key` to `value`;
    /// a missing port is [`OvsdbError::NotFound`].
    pub async fn replace_port_external_id(&self, port: &str, old: &str, key: &str, value: &str) -> Result<(), OvsdbError> {
        self.mutate_map("Port", where_name(port), port, "external_ids", &[old, key], Some((key, value))).await
    }

    /// Every port (of any bridge) whose `external_ids` has `key`, with its value.
    pub async fn ports_with_external_id(&self, key: &str) -> Result<Vec<(String, String)>, OvsdbError> {
        let rows = self.select("Port", vec![], &["name", "external_ids"]).await?;
        let mut out = Vec::new();
        for row in &rows {
            if let Some(v) = row_string_map(row, "external_ids")?.remove(key) {
                out.push((row_string(row, "name")?, v));
            }
        }
        Ok(out)
    }

    /// `Bridge.external_ids`.
    pub async fn bridge_external_ids(
        &self,
        bridge: &str,
    ) -> Result<BTreeMap<String, String>, OvsdbError> {
        self.string_map_of("Bridge", where_name(bridge), bridge, "external_ids")
            .await
    }

    /// Sets one key of `Bridge.external_ids` (e.g. the flow generation).
    pub async fn set_bridge_external_id(
        &self,
        bridge: &str,
        key: &str,
        value: &str,
    ) -> Result<(), OvsdbError> {
        self.mutate_map_key(
            "Bridge",
            where_name(bridge),
            bridge,
            "external_ids",
            key,
            Some(value),
        )
        .await
    }

    /// Removes one key of `Bridge.external_ids`.
    pub async fn remove_bridge_external_id(
        &self,
        bridge: &str,
        key: &str,
    ) -> Result<(), OvsdbError> {
        self.mutate_map_key(
            "Bridge",
            where_name(bridge),
            bridge,
            "external_ids",
            key,
            None,
        )
        .await
    }

    /// `Open_vSwitch.other_config`.
    pub async fn other_config(&self) -> Result<BTreeMap<String, String>, OvsdbError> {
        self.string_map_of("Open_vSwitch", vec![], "Open_vSwitch", "other_config")
            .await
    }

    /// Sets (`Some`) or removes (`None`) a key of `Open_vSwitch.other_config`.
    pub async fn set_other_config(&self, key: &str, value: Option<&str>) -> Result<(), OvsdbError> {
        self.mutate_map_key(
            "Open_vSwitch",
            vec![],
            "Open_vSwitch",
            "other_config",
            key,
            value,
        )
        .await
    }

    /// Whether `other_config:flow-restore-wait=true` is set: while it is,
    /// ovs-vswitchd keeps the datapath flows it has and does not flush them,
    /// so traffic keeps flowing while the agent re-installs its OpenFlow rules.
    pub async fn flow_restore_wait(&self) -> Result<bool, OvsdbError> {
        Ok(self
            .other_config()
            .await?
            .get("flow-restore-wait")
            .map(String::as_str)
            == Some("true"))
    }

    /// Sets `other_config:flow-restore-wait=true`.
    pub async fn set_flow_restore_wait(&self) -> Result<(), OvsdbError> {
        self.set_other_config("flow-restore-wait", Some("true"))
            .await
    }

    /// Removes `other_config:flow-restore-wait`.
    pub async fn clear_flow_restore_wait(&self) -> Result<(), OvsdbError> {
        self.set_other_config("flow-restore-wait", None).await
    }

    /// The interface's current ofport: `None` if the interface does not exist
    /// or vswitchd has not assigned one yet; `Some(-1)` if it failed.
    pub async fn interface_ofport(&self, name: &str) -> Result<Option<i64>, OvsdbError> {
        let found = self
            .select("Interface", where_name(name), &["ofport"])
            .await?;
        match found.first() {
            Some(r) => row_opt_i64(r, "ofport"),
            None => Ok(None),
        }
    }

    /// The interface's `error` column (why vswitchd could not open it).
    pub async fn interface_error(&self, name: &str) -> Result<Option<String>, OvsdbError> {
        let found = self
            .select("Interface", where_name(name), &["error"])
            .await?;
        match found.first() {
            Some(r) => row_opt_string(r, "error"),
            None => Ok(None),
        }
    }
}
