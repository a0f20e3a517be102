//! JSON-RPC 1.0 messages as RFC 7047 uses them, typed: what the client sends ([`Request`],
//! [`Reply`] and the parameters of each method) and what it receives ([`Incoming`]).
//!
//! The `result` of a request, a notification's `params` and an echo's payload stay
//! `serde_json::Value`: their shape depends on the method, and each caller parses its own
//! (`transact` results in [`crate::txn`], table updates in [`crate::client`]).

use std::collections::BTreeMap;

use serde::ser::SerializeSeq;
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::monitor::MonitorRequest;
use crate::datum::brief;
use crate::txn::{Condition, Operation};

/// A request id: ours are numbers; the inactivity probe's are `probe-<n>` strings, so that
/// their replies match no pending call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Id {
    Call(u64),
    Probe(String),
}

/// `{"method": .., "params": .., "id": ..}`
#[derive(Debug, Serialize)]
pub struct Request<'a, P> {
    pub method: &'a str,
    pub params: P,
    pub id: Id,
}

/// Our reply to a request from the server: `{"result": .., "error": .., "id": ..}`.
#[derive(Debug, Serialize)]
pub struct Reply<'a> {
    pub result: &'a Value,
    pub error: Option<String>,
    pub id: &'a Value,
}

/// `[]`: the parameters of `list_dbs` and of an inactivity probe's `echo`.
#[derive(Debug, Clone, Copy)]
pub struct NoParams;

impl Serialize for NoParams {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_seq(Some(0))?.end()
    }
}

/// `[db, op, op, ...]`: the parameters of `transact`.
#[derive(Debug)]
pub struct TransactParams<'a> {
    pub db: &'a str,
    pub ops: &'a [Operation],
}

impl Serialize for TransactParams<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(1 + self.ops.len()))?;
        seq.serialize_element(self.db)?;
        for op in self.ops {
            seq.serialize_element(op)?;
        }
        seq.end()
    }
}

/// One table's `<monitor-request>` (or `<monitor-cond-request>`, with `where`).
#[derive(Debug, Serialize)]
pub struct MonitorRequestWire<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub columns: Option<&'a [String]>,
    #[serde(rename = "where", skip_serializing_if = "Option::is_none")]
    pub conditions: Option<&'a [Condition]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub select: Option<&'a crate::monitor::MonitorSelect>,
}

/// `[db, monitor-id, {table: request}]`: the parameters of `monitor` (without conditions) and
/// `monitor_cond` (with them).
pub fn monitor_params<'a>(
    db: &'a str,
    id: &'a str,
    requests: &'a BTreeMap<String, MonitorRequest>,
    with_conditions: bool,
) -> (&'a str, &'a str, BTreeMap<&'a str, MonitorRequestWire<'a>>) {
    let reqs = requests
        .iter()
        .map(|(table, r)| {
            let wire = MonitorRequestWire {
                columns: r.columns.as_deref(),
                conditions: if with_conditions { r.conditions.as_deref() } else { None },
                select: r.select.as_ref(),
            };
            (table.as_str(), wire)
        })
        .collect();
    (db, id, reqs)
}

/// A message from the server.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A request (`id` not null: it wants a reply) or a notification (`id` null).
    Request { method: String, params: Value, id: Value },
    /// The reply to a request; `result` and `error` as sent (a null `error` is `None`).
    Response { id: Value, result: Option<Value>, error: Option<Value> },
    /// Valid JSON that is not a JSON-RPC message; what is wrong.
    Invalid(String),
}

impl Incoming {
    /// Classifies a message. Never fails: anything unexpected is [`Incoming::Invalid`].
    pub fn parse(msg: Value) -> Incoming {
        let Value::Object(mut obj) = msg else {
            return Incoming::Invalid(format!("not an object: {}", brief(&msg)));
        };
        let id = obj.remove("id").unwrap_or(Value::Null);
        match obj.remove("method") {
            Some(Value::String(method)) => Incoming::Request {
                method,
                params: obj.remove("params").unwrap_or(Value::Null),
                id,
            },
            Some(Value::Null) | None => Incoming::Response {
                id,
                result: obj.remove("result"),
                error: obj.remove("error").filter(|e| !e.is_null()),
            },
            Some(other) => Incoming::Invalid(format!("non-string method {}", brief(&other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn;
    use serde_json::json;

    fn wire(v: impl Serialize) -> Value {
        serde_json::to_value(v).unwrap()
    }

    #[test]
    fn requests_are_rfc7047_messages() {
        assert_eq!(
            wire(Request { method: "list_dbs", params: NoParams, id: Id::Call(1) }),
            json!({"method": "list_dbs", "params": [], "id": 1})
        );
        assert_eq!(
            wire(Request { method: "get_schema", params: ("Open_vSwitch",), id: Id::Call(2) }),
            json!({"method": "get_schema", "params": ["Open_vSwitch"], "id": 2})
        );
        assert_eq!(
            wire(Request { method: "echo", params: NoParams, id: Id::Probe("probe-3".into()) }),
            json!({"method": "echo", "params": [], "id": "probe-3"})
        );
        let ops = [txn::comment("a"), txn::select("Bridge", vec![], &["name"])];
        assert_eq!(
            wire(Request { method: "transact", params: TransactParams { db: "Open_vSwitch", ops: &ops }, id: Id::Call(4) }),
            json!({"method": "transact", "id": 4, "params": ["Open_vSwitch", {"op": "comment", "comment": "a"},
                   {"op": "select", "table": "Bridge", "where": [], "columns": ["name"]}]})
        );
        assert_eq!(
            wire(Request { method: "transact", params: TransactParams { db: "Open_vSwitch", ops: &[] }, id: Id::Call(5) }),
            json!({"method": "transact", "params": ["Open_vSwitch"], "id": 5})
        );
        assert_eq!(
            wire(Reply { result: &json!(["hi"]), error: None, id: &json!("echo") }),
            json!({"result": ["hi"], "error": null, "id": "echo"})
        );
    }

    #[test]
    fn monitor_requests_carry_conditions_only_for_monitor_cond() {
        let reqs: BTreeMap<String, MonitorRequest> = [
            (
                "Interface".to_string(),
                MonitorRequest::columns(["name", "ofport"]).with_conditions(vec![Condition::eq("name", "veth1")]),
            ),
            ("Bridge".to_string(), MonitorRequest::default()),
        ]
        .into();
        assert_eq!(
            wire(monitor_params("Open_vSwitch", "mon1", &reqs, true)),
            json!(["Open_vSwitch", "mon1", {"Bridge": {}, "Interface": {"columns": ["name", "ofport"], "where": [["name", "==", "veth1"]]}}])
        );
        assert_eq!(
            wire(monitor_params("Open_vSwitch", "mon1", &reqs, false)),
            json!(["Open_vSwitch", "mon1", {"Bridge": {}, "Interface": {"columns": ["name", "ofport"]}}])
        );
        let sel = MonitorRequest { select: Some(crate::monitor::MonitorSelect { initial: false, ..Default::default() }), ..Default::default() };
        let reqs: BTreeMap<String, MonitorRequest> = [("Port".to_string(), sel)].into();
        assert_eq!(
            wire(monitor_params("db", "m", &reqs, false))[2],
            json!({"Port": {"select": {"initial": false, "insert": true, "delete": true, "modify": true}}})
        );
    }

    #[test]
    fn incoming_messages_are_classified() {
        assert_eq!(
            Incoming::parse(json!({"method": "echo", "params": [], "id": "echo"})),
            Incoming::Request { method: "echo".into(), params: json!([]), id: json!("echo") }
        );
        assert_eq!(
            Incoming::parse(json!({"method": "update", "params": ["m", {}], "id": null})),
            Incoming::Request { method: "update".into(), params: json!(["m", {}]), id: Value::Null }
        );
        assert_eq!(
            Incoming::parse(json!({"id": 3, "result": null, "error": null})),
            Incoming::Response { id: json!(3), result: Some(Value::Null), error: None }
        );
        assert_eq!(
            Incoming::parse(json!({"id": 3, "result": null, "error": {"error": "unknown database"}})),
            Incoming::Response { id: json!(3), result: Some(Value::Null), error: Some(json!({"error": "unknown database"})) }
        );
        assert_eq!(Incoming::parse(json!({"id": 4})), Incoming::Response { id: json!(4), result: None, error: None });
        assert!(matches!(Incoming::parse(json!([1, 2])), Incoming::Invalid(_)));
        assert!(matches!(Incoming::parse(json!({"method": 5})), Incoming::Invalid(_)));
    }
}
