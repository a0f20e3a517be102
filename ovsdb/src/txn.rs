//! `transact` operations (RFC 7047 §5.2) as types, and the checked parsing of their results.
//!
//! An [`Operation`] serializes to exactly the object the RFC describes (`{"op": "insert",
//! "table": .., "row": .., "uuid-name": ..}` and so on); [`Condition`]s and [`Mutation`]s to
//! their `[column, function, value]` triples. The rows they carry are [`Row`]s: the typed rows of
//! [`crate::rows`] build them (`Bridge { .. }.insert(..)`), the functions here take any row. A
//! failed transaction becomes [`OvsdbError::TransactionFailed`] naming the operation that failed.

use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::datum::{brief, ToDatum, Uuid};
use crate::types::{as_row, Row};
use crate::OvsdbError;

/// A `where` function (RFC 7047 §5.1 `<function>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Function {
    #[serde(rename = "==")]
    Eq,
    #[serde(rename = "!=")]
    Ne,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    Ge,
    #[serde(rename = "includes")]
    Includes,
    #[serde(rename = "excludes")]
    Excludes,
}

/// One condition of a `where` clause: `[column, function, value]` on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub column: String,
    pub function: Function,
    pub value: Value,
}

impl Condition {
    pub fn new(column: &str, function: Function, value: impl ToDatum) -> Self {
        Condition {
            column: column.to_string(),
            function,
            value: value.to_datum(),
        }
    }

    /// `[column, "==", value]`
    pub fn eq(column: &str, value: impl ToDatum) -> Self {
        Condition::new(column, Function::Eq, value)
    }

    /// `[column, "includes", value]`: the set/map column contains all of `value`.
    pub fn includes(column: &str, value: impl ToDatum) -> Self {
        Condition::new(column, Function::Includes, value)
    }
}

impl Serialize for Condition {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.column, self.function, &self.value).serialize(s)
    }
}

/// A mutator (RFC 7047 §5.1 `<mutator>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mutator {
    #[serde(rename = "+=")]
    Add,
    #[serde(rename = "-=")]
    Sub,
    #[serde(rename = "*=")]
    Mul,
    #[serde(rename = "/=")]
    Div,
    #[serde(rename = "%=")]
    Rem,
    #[serde(rename = "insert")]
    Insert,
    #[serde(rename = "delete")]
    Delete,
}

/// One mutation: `[column, mutator, value]` on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutation {
    pub column: String,
    pub mutator: Mutator,
    pub value: Value,
}

impl Mutation {
    pub fn new(column: &str, mutator: Mutator, value: impl ToDatum) -> Self {
        Mutation {
            column: column.to_string(),
            mutator,
            value: value.to_datum(),
        }
    }

    /// Adds the elements of the set (or the pairs of the map) `value` to the column; for a map,
    /// a key already present keeps its old value.
    pub fn insert(column: &str, value: impl ToDatum) -> Self {
        Mutation::new(column, Mutator::Insert, value)
    }

    /// Removes the elements of the set `value` from the column; for a map column, `value` is
    /// either a map (pairs removed if both match) or a set of keys.
    pub fn delete(column: &str, value: impl ToDatum) -> Self {
        Mutation::new(column, Mutator::Delete, value)
    }
}

impl Serialize for Mutation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.column, self.mutator, &self.value).serialize(s)
    }
}

/// `wait`'s `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Until {
    #[serde(rename = "==")]
    Eq,
    #[serde(rename = "!=")]
    Ne,
}

fn no_columns(c: &Option<Vec<String>>) -> bool {
    c.is_none()
}

/// One operation of a `transact` request.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Operation {
    Insert {
        table: String,
        row: Row,
        #[serde(rename = "uuid-name", skip_serializing_if = "Option::is_none")]
        uuid_name: Option<String>,
    },
    Select {
        table: String,
        #[serde(rename = "where")]
        conditions: Vec<Condition>,
        /// `None`: all columns.
        #[serde(skip_serializing_if = "no_columns")]
        columns: Option<Vec<String>>,
    },
    Update {
        table: String,
        #[serde(rename = "where")]
        conditions: Vec<Condition>,
        row: Row,
    },
    Mutate {
        table: String,
        #[serde(rename = "where")]
        conditions: Vec<Condition>,
        mutations: Vec<Mutation>,
    },
    Delete {
        table: String,
        #[serde(rename = "where")]
        conditions: Vec<Condition>,
    },
    Wait {
        /// Milliseconds; `None` waits forever.
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout: Option<u64>,
        table: String,
        #[serde(rename = "where")]
        conditions: Vec<Condition>,
        columns: Vec<String>,
        until: Until,
        rows: Vec<Row>,
    },
    Comment {
        comment: String,
    },
}

impl Operation {
    /// The `op` member: what an error names.
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Insert { .. } => "insert",
            Operation::Select { .. } => "select",
            Operation::Update { .. } => "update",
            Operation::Mutate { .. } => "mutate",
            Operation::Delete { .. } => "delete",
            Operation::Wait { .. } => "wait",
            Operation::Comment { .. } => "comment",
        }
    }
}

fn columns(cols: &[&str]) -> Vec<String> {
    cols.iter().map(|c| c.to_string()).collect()
}

/// `insert` with an optional `uuid-name` so later operations can refer to the row.
pub fn insert(table: &str, row: Row, uuid_name: Option<&str>) -> Operation {
    Operation::Insert {
        table: table.to_string(),
        row,
        uuid_name: uuid_name.map(str::to_string),
    }
}

/// `select` of `columns` from the rows matching `where_`.
pub fn select(table: &str, where_: Vec<Condition>, cols: &[&str]) -> Operation {
    Operation::Select {
        table: table.to_string(),
        conditions: where_,
        columns: Some(columns(cols)),
    }
}

/// `update`: sets the columns of `row` in the rows matching `where_`.
pub fn update(table: &str, where_: Vec<Condition>, row: Row) -> Operation {
    Operation::Update {
        table: table.to_string(),
        conditions: where_,
        row,
    }
}

/// `mutate` of the rows matching `where_`.
pub fn mutate(table: &str, where_: Vec<Condition>, mutations: Vec<Mutation>) -> Operation {
    Operation::Mutate {
        table: table.to_string(),
        conditions: where_,
        mutations,
    }
}

pub fn delete(table: &str, where_: Vec<Condition>) -> Operation {
    Operation::Delete {
        table: table.to_string(),
        conditions: where_,
    }
}

/// `wait` with timeout 0: fails at once with "timed out" unless the rows matching `where_`,
/// projected onto `columns`, equal `rows`. This is how we assert that what we read has not
/// changed before we write.
pub fn wait_eq(table: &str, where_: Vec<Condition>, cols: &[&str], rows: Vec<Row>) -> Operation {
    Operation::Wait {
        timeout: Some(0),
        table: table.to_string(),
        conditions: where_,
        columns: columns(cols),
        until: Until::Eq,
        rows,
    }
}

pub fn comment(text: &str) -> Operation {
    Operation::Comment {
        comment: text.to_string(),
    }
}

/// The successful result of one operation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperationResult {
    /// `insert`: uuid of the new row.
    pub uuid: Option<Uuid>,
    /// `select`: the selected rows.
    pub rows: Option<Vec<Row>>,
    /// `update`/`mutate`/`delete`: number of matched rows.
    pub count: Option<u64>,
}

impl OperationResult {
    /// The rows of a `select` result, or a protocol error.
    pub fn into_rows(self) -> Result<Vec<Row>, OvsdbError> {
        self.rows
            .ok_or_else(|| OvsdbError::Protocol("expected a select result with \"rows\"".into()))
    }
}

/// Parses the `result` of a `transact` call for a request of `ops`.
pub fn parse_transact_result(ops: &[Operation], result: &Value) -> Result<Vec<OperationResult>, OvsdbError> {
    let names: Vec<&str> = ops.iter().map(Operation::name).collect();
    parse_result(&names, result)
}

/// [`parse_transact_result`] for operations known by their names.
pub(crate) fn parse_result(ops: &[&str], result: &Value) -> Result<Vec<OperationResult>, OvsdbError> {
    let items = result
        .as_array()
        .ok_or_else(|| OvsdbError::Protocol(format!("transact result is not an array: {}", brief(result))))?;
    // First report the first error: ops after a failed one have `null` results.
    for (index, item) in items.iter().enumerate() {
        let Some(err) = item.as_object().and_then(|o| o.get("error")) else { continue };
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => brief(other),
        };
        return Err(OvsdbError::TransactionFailed {
            index,
            op: ops.get(index).copied().unwrap_or("commit").to_string(),
            error: text(err),
            details: item.get("details").map(text),
        });
    }
    if items.len() < ops.len() {
        return Err(OvsdbError::Protocol(format!(
            "transact returned {} results for {} operations",
            items.len(),
            ops.len()
        )));
    }
    items.iter().take(ops.len()).enumerate().map(|(i, item)| parse_one(i, item)).collect()
}

fn parse_one(i: usize, item: &Value) -> Result<OperationResult, OvsdbError> {
    let bad = |what: String| OvsdbError::Protocol(format!("result of operation {i}: {what}"));
    let obj = item.as_object().ok_or_else(|| bad(format!("not an object: {}", brief(item))))?;
    let mut r = OperationResult::default();
    if let Some(u) = obj.get("uuid") {
        r.uuid = Some(crate::datum::FromDatum::from_datum(u).map_err(bad)?);
    }
    if let Some(rows) = obj.get("rows") {
        let rows = rows.as_array().ok_or_else(|| bad("\"rows\" is not an array".into()))?;
        r.rows = Some(
            rows.iter()
                .map(|row| as_row(row, &format!("result of operation {i}")).cloned())
                .collect::<Result<_, _>>()?,
        );
    }
    if let Some(c) = obj.get("count") {
        r.count = Some(c.as_u64().ok_or_else(|| bad(format!("bad count {}", brief(c))))?);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datum::{NamedUuid, Set};
    use serde_json::json;

    fn wire(op: &Operation) -> Value {
        serde_json::to_value(op).unwrap()
    }

    fn row(v: Value) -> Row {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn operations_are_rfc7047_objects() {
        assert_eq!(
            wire(&insert("Interface", row(json!({"name": "veth2", "type": "dummy"})), Some("iface"))),
            json!({"op": "insert", "table": "Interface", "row": {"name": "veth2", "type": "dummy"}, "uuid-name": "iface"})
        );
        assert_eq!(wire(&insert("QoS", Row::new(), None)), json!({"op": "insert", "table": "QoS", "row": {}}));
        assert_eq!(
            wire(&select("Bridge", vec![Condition::eq("name", "br0")], &["_uuid", "ports"])),
            json!({"op": "select", "table": "Bridge", "where": [["name", "==", "br0"]], "columns": ["_uuid", "ports"]})
        );
        assert_eq!(
            wire(&Operation::Select { table: "Port".into(), conditions: vec![], columns: None }),
            json!({"op": "select", "table": "Port", "where": []})
        );
        assert_eq!(
            wire(&update("Port", vec![Condition::eq("_uuid", Uuid::new("u"))], row(json!({"qos": ["set", []]})))),
            json!({"op": "update", "table": "Port", "where": [["_uuid", "==", ["uuid", "u"]]], "row": {"qos": ["set", []]}})
        );
        assert_eq!(
            wire(&mutate(
                "Bridge",
                vec![Condition::eq("name", "br0"), Condition::includes("ports", Uuid::new("p"))],
                vec![Mutation::delete("ports", Set::one(Uuid::new("p"))), Mutation::insert("ports", Set::one(NamedUuid::new("n")))],
            )),
            json!({"op": "mutate", "table": "Bridge",
                   "where": [["name", "==", "br0"], ["ports", "includes", ["uuid", "p"]]],
                   "mutations": [["ports", "delete", ["set", [["uuid", "p"]]]], ["ports", "insert", ["set", [["named-uuid", "n"]]]]]})
        );
        assert_eq!(
            wire(&mutate("Open_vSwitch", vec![], vec![Mutation::new("next_cfg", Mutator::Add, 1i64)])),
            json!({"op": "mutate", "table": "Open_vSwitch", "where": [], "mutations": [["next_cfg", "+=", 1]]})
        );
        assert_eq!(
            wire(&delete("QoS", vec![Condition::eq("_uuid", Uuid::new("q"))])),
            json!({"op": "delete", "table": "QoS", "where": [["_uuid", "==", ["uuid", "q"]]]})
        );
        // As ovs-vsctl writes its guards.
        assert_eq!(
            wire(&wait_eq("Port", vec![Condition::eq("_uuid", Uuid::new("u"))], &["qos"], vec![row(json!({"qos": ["set", []]}))])),
            json!({"op": "wait", "timeout": 0, "table": "Port", "where": [["_uuid", "==", ["uuid", "u"]]],
                   "columns": ["qos"], "until": "==", "rows": [{"qos": ["set", []]}]})
        );
        assert_eq!(wire(&comment("hi")), json!({"op": "comment", "comment": "hi"}));
        let ops = [insert("T", Row::new(), None), select("T", vec![], &[]), update("T", vec![], Row::new()),
            mutate("T", vec![], vec![]), delete("T", vec![]), wait_eq("T", vec![], &[], vec![]), comment("")];
        for op in &ops {
            assert_eq!(wire(op)["op"], op.name());
        }
    }

    #[test]
    fn failed_op_is_named() {
        let ops = vec![
            select("Bridge", vec![], &["name"]),
            wait_eq("Port", vec![], &["qos"], vec![]),
            insert("QoS", Row::new(), Some("q")),
        ];
        let res = json!([{"rows": []}, {"error": "timed out"}, null]);
        let e = parse_transact_result(&ops, &res).unwrap_err();
        assert!(e.is_wait_conflict());
        match e {
            OvsdbError::TransactionFailed { index, op, error, details } => {
                assert_eq!((index, op.as_str(), error.as_str(), details), (1, "wait", "timed out", None));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn commit_error_is_reported_after_ops() {
        let ops = vec![insert("Port", row(json!({"name": "x"})), None)];
        let res = json!([{"uuid": ["uuid", "u"]}, {"error": "referential integrity violation", "details": "cannot delete"}]);
        let msg = parse_transact_result(&ops, &res).unwrap_err().to_string();
        assert!(
            msg.contains("operation 1 (commit)") && msg.contains("referential") && msg.contains("cannot delete"),
            "{msg}"
        );
    }

    #[test]
    fn results_parsed() {
        let ops = vec![insert("QoS", Row::new(), None), select("Bridge", vec![], &["name"]), mutate("Bridge", vec![], vec![])];
        let res = json!([{"uuid": ["uuid", "u1"]}, {"rows": [{"name": "br0"}]}, {"count": 1}]);
        let r = parse_transact_result(&ops, &res).unwrap();
        assert_eq!(r[0].uuid, Some(Uuid::new("u1")));
        assert_eq!(r[1].rows.as_ref().unwrap()[0]["name"], "br0");
        assert_eq!(r[2].count, Some(1));
    }

    #[test]
    fn malformed_results_are_protocol_errors() {
        let ops = vec![select("Bridge", vec![], &["name"])];
        for bad in [
            json!({}),
            json!([]),
            json!([5]),
            json!([{"rows": 3}]),
            json!([{"rows": [1]}]),
            json!([{"uuid": "x"}]),
            json!([{"count": -1}]),
        ] {
            match parse_transact_result(&ops, &bad) {
                Err(OvsdbError::Protocol(_)) => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
