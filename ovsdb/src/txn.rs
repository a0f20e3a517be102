//! Builders for `transact` operations (RFC 7047 §5.2) and parsing of results.
//!
//! Operations are plain JSON values; these helpers only save us from typos in
//! member names. Results are checked strictly: a failed transaction is turned
//! into [`OvsdbError::TransactionFailed`] naming the operation that failed.

use serde_json::{json, Value};

use super::types::{as_row, brief, datum_uuid, Row};
use super::OvsdbError;

/// `insert` with an optional `uuid-name` so later ops can refer to the row.
pub fn insert(table: &str, row: Value, uuid_name: Option<&str>) -> Value {
    let mut op = json!({"op": "insert", "table": table, "row": row});
    if let Some(n) = uuid_name {
        op["uuid-name"] = json!(n);
    }
    op
}

/// `select` of `columns` from rows matching `where_`.
pub fn select(table: &str, where_: Vec<Value>, columns: &[&str]) -> Value {
    json!({"op": "select", "table": table, "where": where_, "columns": columns})
}

pub fn update(table: &str, where_: Vec<Value>, row: Value) -> Value {
    json!({"op": "update", "table": table, "where": where_, "row": row})
}

/// `mutate`; each mutation is `[column, mutator, value]`.
pub fn mutate(table: &str, where_: Vec<Value>, mutations: Vec<Value>) -> Value {
    json!({"op": "mutate", "table": table, "where": where_, "mutations": mutations})
}

pub fn delete(table: &str, where_: Vec<Value>) -> Value {
    json!({"op": "delete", "table": table, "where": where_})
}

/// `wait` with timeout 0: fails immediately with "timed out" unless the rows
/// matching `where_`, projected onto `columns`, equal `rows`. This is how we
/// assert that what we read has not changed before we write.
pub fn wait_eq(table: &str, where_: Vec<Value>, columns: &[&str], rows: Vec<Value>) -> Value {
    json!({
        "op": "wait", "timeout": 0, "table": table, "where": where_,
        "columns": columns, "until": "==", "rows": rows,
    })
}

pub fn comment(text: &str) -> Value {
    json!({"op": "comment", "comment": text})
}

/// The successful result of one operation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperationResult {
    /// `insert`: uuid of the new row.
    pub uuid: Option<String>,
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
pub fn parse_transact_result(
    ops: &[Value],
    result: &Value,
) -> Result<Vec<OperationResult>, OvsdbError> {
    let items = result.as_array().ok_or_else(|| {
        OvsdbError::Protocol(format!(
            "transact result is not an array: {}",
            brief(result)
        ))
    })?;
    // First report the first error: ops after a failed one have `null` results.
    for (index, item) in items.iter().enumerate() {
        if let Some(obj) = item.as_object() {
            if let Some(err) = obj.get("error") {
                let op = match ops.get(index) {
                    Some(op) => op
                        .get("op")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_string(),
                    None => "commit".to_string(),
                };
                let error = match err {
                    Value::String(s) => s.clone(),
                    other => brief(other),
                };
                let details = obj.get("details").map(|d| match d {
                    Value::String(s) => s.clone(),
                    other => brief(other),
                });
                return Err(OvsdbError::TransactionFailed {
                    index,
                    op,
                    error,
                    details,
                });
            }
        }
    }
    if items.len() < ops.len() {
        return Err(OvsdbError::Protocol(format!(
            "transact returned {} results for {} operations",
            items.len(),
            ops.len()
        )));
    }
    items
        .iter()
        .take(ops.len())
        .enumerate()
        .map(|(i, item)| {
            let obj = item.as_object().ok_or_else(|| {
                OvsdbError::Protocol(format!(
                    "result of operation {i} is not an object: {}",
                    brief(item)
                ))
            })?;
            let mut r = OperationResult::default();
            if let Some(u) = obj.get("uuid") {
                r.uuid =
                    Some(datum_uuid(u).map_err(|e| {
                        OvsdbError::Protocol(format!("result of operation {i}: {e}"))
                    })?);
            }
            if let Some(rows) = obj.get("rows") {
                let rows = rows.as_array().ok_or_else(|| {
                    OvsdbError::Protocol(format!(
                        "result of operation {i}: \"rows\" is not an array"
                    ))
                })?;
                r.rows = Some(
                    rows.iter()
                        .map(|row| as_row(row, &format!("result of operation {i}")).cloned())
                        .collect::<Result<_, _>>()?,
                );
            }
            if let Some(c) = obj.get("count") {
                r.count = Some(c.as_u64().ok_or_else(|| {
                    OvsdbError::Protocol(format!("result of operation {i}: bad count {}", brief(c)))
                })?);
            }
            Ok(r)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_op_is_named() {
        let ops = vec![
            select("Bridge", vec![], &["name"]),
            wait_eq("Port", vec![], &["qos"], vec![]),
            insert("QoS", json!({}), Some("q")),
        ];
        let res = json!([{"rows": []}, {"error": "timed out"}, null]);
        let e = parse_transact_result(&ops, &res).unwrap_err();
        assert!(e.is_wait_conflict());
        match e {
            OvsdbError::TransactionFailed {
                index,
                op,
                error,
                details,
            } => {
                assert_eq!(
                    (index, op.as_str(), error.as_str(), details),
                    (1, "wait", "timed out", None)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn commit_error_is_reported_after_ops() {
        let ops = vec![insert("Port", json!({"name": "x"}), None)];
        let res = json!([{"uuid": ["uuid", "u"]}, {"error": "referential integrity violation", "details": "cannot delete"}]);
        let e = parse_transact_result(&ops, &res).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("operation 1 (commit)")
                && msg.contains("referential")
                && msg.contains("cannot delete"),
            "{msg}"
        );
    }

    #[test]
    fn results_parsed() {
        let ops = vec![
            insert("QoS", json!({}), None),
            select("Bridge", vec![], &["name"]),
            mutate("Bridge", vec![], vec![]),
        ];
        let res = json!([{"uuid": ["uuid", "u1"]}, {"rows": [{"name": "br0"}]}, {"count": 1}]);
        let r = parse_transact_result(&ops, &res).unwrap();
        assert_eq!(r[0].uuid.as_deref(), Some("u1"));
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
