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
//!
//! By concern, each an `impl Ovs` block with the pure functions that decide its operations
//! from what was read (their unit tests check the exact transactions, with rows as
//! ovsdb-server sends them):
//! * [`spec`]: what callers ask for ([`BridgeOptions`], [`PortSpec`]) and get back;
//! * `setup`: the root row and bridges (`init`, `ensure_bridge`, `bridges`, `list_ports`);
//! * `port`: the general path for ports (`ensure_port`, `add_port_and_wait_ofport`,
//!   `delete_port`, the interface's ofport and error);
//! * `fast`: pod ports through the connection's Interface monitor and group commits
//!   (`add_port_fast`, `remove_port_fast`);
//! * `qos`: `set_pod_bandwidth`;
//! * `maps`: keys of `external_ids` and `other_config`.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tracing::debug;

use crate::client::OvsdbClient;
use crate::datum::{ToDatum, Uuid};
use crate::ifwatch::InterfaceWatch;
use crate::rows::Table;
use crate::txn::{self, Condition, Operation, OperationResult};
use crate::types::Row;
use crate::{OvsdbError, VSWITCH_DB};

mod fast;
mod maps;
mod port;
mod qos;
mod setup;
pub mod spec;

#[cfg(test)]
mod fake;

pub use spec::{BridgeInfo, BridgeOptions, Ensured, PortSpec};

/// Default number of attempts for optimistic read-modify-write transactions.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// Operations on the `Open_vSwitch` database over one [`OvsdbClient`].
#[derive(Debug, Clone)]
pub struct Ovs {
    client: OvsdbClient,
    max_attempts: u32,
    /// The connection's Interface monitor, started on first use (and again if it ended).
    ifwatch: Arc<tokio::sync::Mutex<Option<InterfaceWatch>>>,
    /// Group commit of new ports (see [`Ovs::add_port_fast`]), started on first use.
    inserts: Arc<OnceLock<tokio::sync::mpsc::Sender<fast::NewPort>>>,
    /// Group commit of port removals (see [`Ovs::remove_port_fast`]), started on first use.
    removals: Arc<OnceLock<tokio::sync::mpsc::Sender<fast::OldPort>>>,
}

/// `name == name`: the key of every table the agent names rows in.
fn where_name(name: &str) -> Vec<Condition> {
    vec![Condition::eq("name", name)]
}

/// `_uuid == u` (a [`Uuid`], or a reference read from a row).
fn where_uuid(u: impl ToDatum) -> Vec<Condition> {
    vec![Condition::eq("_uuid", u)]
}

/// Guard: the row `u` of `T` still exists.
fn wait_exists<T: Table>(u: &Uuid) -> Operation {
    let row: Row = [("_uuid".to_string(), u.to_datum())].into_iter().collect();
    txn::wait_eq(T::TABLE, where_uuid(u), &["_uuid"], vec![row])
}

/// Guard: no row of `T` named `name` exists.
fn wait_absent<T: Table>(name: &str) -> Operation {
    T::wait_eq(where_name(name), &["_uuid"], &[])
}

/// The typed rows of the `i`th result (a `select`).
fn nth<T: Table>(results: &mut [OperationResult], i: usize) -> Result<Vec<T>, OvsdbError> {
    let r = results.get_mut(i).ok_or_else(|| OvsdbError::Protocol(format!("missing result {i}")))?;
    std::mem::take(r).into_table()
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

    async fn transact(&self, ops: Vec<Operation>) -> Result<Vec<OperationResult>, OvsdbError> {
        self.client.transact(VSWITCH_DB, ops).await
    }

    /// The `columns` of the rows of `T` matching `where_`.
    async fn select<T: Table>(&self, where_: Vec<Condition>, columns: &[&str]) -> Result<Vec<T>, OvsdbError> {
        nth(&mut self.transact(vec![T::select(where_, columns)]).await?, 0)
    }

    /// Runs `f` until it does not fail with a `wait` conflict, at most `max_attempts` times.
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

    /// The connection's Interface monitor.
    pub async fn interface_watch(&self) -> Result<InterfaceWatch, OvsdbError> {
        let mut w = self.ifwatch.lock().await;
        if let Some(live) = w.as_ref().filter(|w| w.is_live()) {
            return Ok(live.clone());
        }
        let new = InterfaceWatch::start(&self.client).await?;
        *w = Some(new.clone());
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::fake::Fake;
    use super::*;
    use serde_json::json;

    #[test]
    fn guards() {
        let w = |op: Operation| serde_json::to_value(op).unwrap();
        assert_eq!(
            w(wait_exists::<crate::Bridge>(&Uuid::new("b"))),
            json!({"op": "wait", "timeout": 0, "table": "Bridge", "where": [["_uuid", "==", ["uuid", "b"]]],
                   "columns": ["_uuid"], "until": "==", "rows": [{"_uuid": ["uuid", "b"]}]})
        );
        assert_eq!(
            w(wait_absent::<crate::Port>("veth1")),
            json!({"op": "wait", "timeout": 0, "table": "Port", "where": [["name", "==", "veth1"]],
                   "columns": ["_uuid"], "until": "==", "rows": []})
        );
    }

    /// A read-modify-write whose guard keeps failing gives up after `max_attempts`, each
    /// attempt re-reading.
    #[tokio::test]
    async fn conflicts_are_retried_then_reported() {
        let fake = Fake::start(|ops| match ops[0]["op"].as_str() {
            Some("select") => json!([{"rows": [{"_uuid": ["uuid", "p"], "qos": ["set", []]}]}]),
            _ => json!([{"error": "timed out"}, null]),
        });
        let ovs = fake.ovs.clone().with_max_attempts(3);
        match ovs.set_pod_bandwidth("veth1", 1000, 0).await {
            Err(OvsdbError::Conflict { what, attempts: 3 }) => assert_eq!(what, "set_pod_bandwidth"),
            other => panic!("{other:?}"),
        }
        let ops: Vec<String> = fake.transactions().iter().map(|t| t[0]["op"].as_str().unwrap().to_string()).collect();
        assert_eq!(ops, ["select", "wait", "select", "wait", "select", "wait"]);
    }

    /// A row the server sends malformed is an error naming the table and column, never a panic.
    #[tokio::test]
    async fn malformed_rows_are_errors() {
        let fake = Fake::start(|_| json!([{"rows": [{"name": "br0", "datapath_type": "", "ports": ["set", [7]]}]}, {"rows": []}]));
        let e = fake.ovs.bridges().await.unwrap_err();
        assert!(matches!(e, OvsdbError::BadRow { table: "Bridge", column: "ports", .. }), "{e}");
        let fake = Fake::start(|_| json!([{"rows": [{"ofport": "one"}]}]));
        let e = fake.ovs.interface_ofport("veth1").await.unwrap_err().to_string();
        assert_eq!(e, "malformed Interface row: column \"ofport\": expected an integer, found \"one\"");
        // A select that comes back without the column asked for.
        let fake = Fake::start(|_| json!([{"rows": [{}]}]));
        let e = fake.ovs.interface_error("veth1").await.unwrap_err().to_string();
        assert!(e.contains("Interface") && e.contains("\"error\"") && e.contains("missing"), "{e}");
    }
}
