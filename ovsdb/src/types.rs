//! The OVSDB data model on the wire (RFC 7047 §5.1) and checked accessors.
//!
//! Values come from a peer we do not control, so every accessor returns a
//! [`OvsdbError::Protocol`] naming the table/column and what was expected,
//! instead of panicking or silently defaulting.
//!
//! Wire encodings handled here:
//! * atoms: JSON string / integer / real / boolean, `["uuid", "<uuid>"]`,
//!   `["named-uuid", "<id>"]`;
//! * sets: a single atom (set of one) or `["set", [atom, ...]]`;
//! * maps: `["map", [[key, value], ...]]`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::OvsdbError;

/// A row as sent by the server: column name -> datum.
pub type Row = serde_json::Map<String, Value>;

/// One OVSDB atom.
#[derive(Debug, Clone, PartialEq)]
pub enum Atom {
    String(String),
    Integer(i64),
    Real(f64),
    Boolean(bool),
    Uuid(String),
    NamedUuid(String),
}

impl Atom {
    pub fn to_json(&self) -> Value {
        match self {
            Atom::String(s) => Value::String(s.clone()),
            Atom::Integer(i) => json!(i),
            Atom::Real(r) => json!(r),
            Atom::Boolean(b) => json!(b),
            Atom::Uuid(u) => uuid(u),
            Atom::NamedUuid(u) => named_uuid(u),
        }
    }

    pub fn from_json(v: &Value) -> Result<Atom, OvsdbError> {
        match v {
            Value::String(s) => Ok(Atom::String(s.clone())),
            Value::Bool(b) => Ok(Atom::Boolean(*b)),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Ok(Atom::Integer(i))
                } else if let Some(f) = n.as_f64() {
                    Ok(Atom::Real(f))
                } else {
                    Err(proto(format!("number {n} is not representable")))
                }
            }
            Value::Array(a) => match (a.first().and_then(Value::as_str), a.get(1), a.len()) {
                (Some("uuid"), Some(Value::String(u)), 2) => Ok(Atom::Uuid(u.clone())),
                (Some("named-uuid"), Some(Value::String(u)), 2) => Ok(Atom::NamedUuid(u.clone())),
                _ => Err(proto(format!("expected an atom, found {}", brief(v)))),
            },
            _ => Err(proto(format!("expected an atom, found {}", brief(v)))),
        }
    }
}

fn proto(msg: String) -> OvsdbError {
    OvsdbError::Protocol(msg)
}

/// Shortened rendering of a JSON value for error messages.
pub fn brief(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 120 {
        let mut end = 117;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    } else {
        s
    }
}

/// `["uuid", u]`
pub fn uuid(u: &str) -> Value {
    json!(["uuid", u])
}

/// `["named-uuid", name]`: refers to a row inserted earlier in the same transaction.
pub fn named_uuid(name: &str) -> Value {
    json!(["named-uuid", name])
}

/// `["set", [..]]`
pub fn set<I: IntoIterator<Item = Value>>(items: I) -> Value {
    json!(["set", items.into_iter().collect::<Vec<_>>()])
}

/// The empty set, which is also how an absent optional value is written.
pub fn empty_set() -> Value {
    json!(["set", []])
}

/// `["map", [[k, v], ..]]` with string keys and values.
pub fn string_map<'a, I>(pairs: I) -> Value
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
{
    json!([
        "map",
        pairs
            .into_iter()
            .map(|(k, v)| json!([k, v]))
            .collect::<Vec<_>>()
    ])
}

/// Optional (set of zero or one) integer.
pub fn optional_integer(v: Option<i64>) -> Value {
    match v {
        Some(i) => json!(i),
        None => empty_set(),
    }
}

/// A `where` clause condition `[column, function, value]`.
pub fn cond(column: &str, function: &str, value: Value) -> Value {
    json!([column, function, value])
}

/// `[column, "==", value]`
pub fn cond_eq(column: &str, value: Value) -> Value {
    cond(column, "==", value)
}

/// Elements of a set datum (a bare atom is a set of one).
pub fn datum_set(v: &Value) -> Result<Vec<&Value>, OvsdbError> {
    match v {
        Value::Array(a) if a.first().and_then(Value::as_str) == Some("set") => {
            match (a.get(1), a.len()) {
                (Some(Value::Array(items)), 2) => Ok(items.iter().collect()),
                _ => Err(proto(format!("malformed set {}", brief(v)))),
            }
        }
        Value::Array(a) if a.first().and_then(Value::as_str) == Some("map") => {
            Err(proto(format!("expected a set, found a map {}", brief(v))))
        }
        other => Ok(vec![other]),
    }
}

/// Pairs of a map datum.
pub fn datum_map(v: &Value) -> Result<Vec<(&Value, &Value)>, OvsdbError> {
    let bad = || proto(format!("malformed map {}", brief(v)));
    let a = v.as_array().ok_or_else(bad)?;
    if a.len() != 2 || a[0].as_str() != Some("map") {
        return Err(bad());
    }
    let pairs = a[1].as_array().ok_or_else(bad)?;
    pairs
        .iter()
        .map(|p| match p.as_array().map(Vec::as_slice) {
            Some([k, v]) => Ok((k, v)),
            _ => Err(bad()),
        })
        .collect()
}

/// Map datum with string keys and values.
pub fn datum_string_map(v: &Value) -> Result<BTreeMap<String, String>, OvsdbError> {
    datum_map(v)?
        .into_iter()
        .map(|(k, val)| match (k.as_str(), val.as_str()) {
            (Some(k), Some(val)) => Ok((k.to_string(), val.to_string())),
            _ => Err(proto(format!(
                "expected map<string,string>, found pair {} -> {}",
                brief(k),
                brief(val)
            ))),
        })
        .collect()
}

/// `["uuid", u]` -> `u`
pub fn datum_uuid(v: &Value) -> Result<String, OvsdbError> {
    match Atom::from_json(v)? {
        Atom::Uuid(u) => Ok(u),
        _ => Err(proto(format!("expected a uuid, found {}", brief(v)))),
    }
}

fn column<'a>(row: &'a Row, col: &str) -> Result<&'a Value, OvsdbError> {
    row.get(col)
        .ok_or_else(|| proto(format!("row has no column {col:?}")))
}

fn ctx(col: &str, e: OvsdbError) -> OvsdbError {
    match e {
        OvsdbError::Protocol(m) => proto(format!("column {col:?}: {m}")),
        other => other,
    }
}

/// Reads a string column.
pub fn row_string(row: &Row, col: &str) -> Result<String, OvsdbError> {
    let v = column(row, col)?;
    v.as_str().map(str::to_string).ok_or_else(|| {
        proto(format!(
            "column {col:?}: expected a string, found {}",
            brief(v)
        ))
    })
}

/// Reads an integer column.
pub fn row_i64(row: &Row, col: &str) -> Result<i64, OvsdbError> {
    let v = column(row, col)?;
    v.as_i64().ok_or_else(|| {
        proto(format!(
            "column {col:?}: expected an integer, found {}",
            brief(v)
        ))
    })
}

/// Reads an optional (set of 0 or 1) integer column.
pub fn row_opt_i64(row: &Row, col: &str) -> Result<Option<i64>, OvsdbError> {
    let items = datum_set(column(row, col)?).map_err(|e| ctx(col, e))?;
    match items.as_slice() {
        [] => Ok(None),
        [v] => v.as_i64().map(Some).ok_or_else(|| {
            proto(format!(
                "column {col:?}: expected an integer, found {}",
                brief(v)
            ))
        }),
        _ => Err(proto(format!(
            "column {col:?}: expected at most one value, found {}",
            items.len()
        ))),
    }
}

/// Reads an optional (set of 0 or 1) string column.
pub fn row_opt_string(row: &Row, col: &str) -> Result<Option<String>, OvsdbError> {
    let items = datum_set(column(row, col)?).map_err(|e| ctx(col, e))?;
    match items.as_slice() {
        [] => Ok(None),
        [v] => v.as_str().map(|s| Some(s.to_string())).ok_or_else(|| {
            proto(format!(
                "column {col:?}: expected a string, found {}",
                brief(v)
            ))
        }),
        _ => Err(proto(format!(
            "column {col:?}: expected at most one value, found {}",
            items.len()
        ))),
    }
}

/// Reads a set-of-strings column.
pub fn row_string_set(row: &Row, col: &str) -> Result<Vec<String>, OvsdbError> {
    datum_set(column(row, col)?)
        .map_err(|e| ctx(col, e))?
        .into_iter()
        .map(|v| {
            v.as_str().map(str::to_string).ok_or_else(|| {
                proto(format!(
                    "column {col:?}: expected a string, found {}",
                    brief(v)
                ))
            })
        })
        .collect()
}

/// Reads a uuid column (e.g. `_uuid`).
pub fn row_uuid(row: &Row, col: &str) -> Result<String, OvsdbError> {
    datum_uuid(column(row, col)?).map_err(|e| ctx(col, e))
}

/// Reads an optional uuid reference column (e.g. `Port.qos`).
pub fn row_opt_uuid(row: &Row, col: &str) -> Result<Option<String>, OvsdbError> {
    let mut items = row_uuid_set(row, col)?;
    match items.len() {
        0 => Ok(None),
        1 => Ok(items.pop()),
        n => Err(proto(format!(
            "column {col:?}: expected at most one uuid, found {n}"
        ))),
    }
}

/// Reads a set-of-uuids column (e.g. `Bridge.ports`).
pub fn row_uuid_set(row: &Row, col: &str) -> Result<Vec<String>, OvsdbError> {
    datum_set(column(row, col)?)
        .map_err(|e| ctx(col, e))?
        .into_iter()
        .map(|v| datum_uuid(v).map_err(|e| ctx(col, e)))
        .collect()
}

/// Reads a `map<string,string>` column (e.g. `external_ids`).
pub fn row_string_map(row: &Row, col: &str) -> Result<BTreeMap<String, String>, OvsdbError> {
    datum_string_map(column(row, col)?).map_err(|e| ctx(col, e))
}

/// Interprets a JSON value as a row object.
pub fn as_row<'a>(v: &'a Value, what: &str) -> Result<&'a Row, OvsdbError> {
    v.as_object()
        .ok_or_else(|| proto(format!("{what}: expected a row object, found {}", brief(v))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(v: Value) -> Row {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn atoms_round_trip() {
        for a in [
            Atom::String("x".into()),
            Atom::Integer(-3),
            Atom::Real(1.5),
            Atom::Boolean(true),
            Atom::Uuid("0d1b0c7e-0000-4000-8000-000000000001".into()),
            Atom::NamedUuid("row1".into()),
        ] {
            assert_eq!(Atom::from_json(&a.to_json()).unwrap(), a);
        }
        assert!(Atom::from_json(&json!(["uuid"])).is_err());
        assert!(Atom::from_json(&json!({"a": 1})).is_err());
        assert!(Atom::from_json(&json!(null)).is_err());
    }

    #[test]
    fn typed_columns() {
        let r = row(json!({
            "_uuid": ["uuid", "u1"],
            "name": "br0",
            "ofport": ["set", []],
            "ofport2": 5,
            "ofport3": ["set", [7]],
            "fail_mode": "secure",
            "protocols": ["set", ["OpenFlow13", "OpenFlow10"]],
            "protocols1": "OpenFlow13",
            "ports": ["set", [["uuid", "a"], ["uuid", "b"]]],
            "qos": ["set", []],
            "external_ids": ["map", [["k", "v"], ["k2", "v2"]]],
            "bad_map": ["map", [["k"]]],
            "int_map": ["map", [[1, 2]]],
        }));
        assert_eq!(row_uuid(&r, "_uuid").unwrap(), "u1");
        assert_eq!(row_string(&r, "name").unwrap(), "br0");
        assert_eq!(row_opt_i64(&r, "ofport").unwrap(), None);
        assert_eq!(row_opt_i64(&r, "ofport2").unwrap(), Some(5));
        assert_eq!(row_opt_i64(&r, "ofport3").unwrap(), Some(7));
        assert_eq!(
            row_opt_string(&r, "fail_mode").unwrap(),
            Some("secure".into())
        );
        assert_eq!(
            row_string_set(&r, "protocols").unwrap(),
            vec!["OpenFlow13", "OpenFlow10"]
        );
        assert_eq!(
            row_string_set(&r, "protocols1").unwrap(),
            vec!["OpenFlow13"]
        );
        assert_eq!(row_uuid_set(&r, "ports").unwrap(), vec!["a", "b"]);
        assert_eq!(row_opt_uuid(&r, "qos").unwrap(), None);
        let m = row_string_map(&r, "external_ids").unwrap();
        assert_eq!(m.get("k2").map(String::as_str), Some("v2"));

        // Errors name the column and the problem.
        let e = row_string(&r, "missing").unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        let e = row_i64(&r, "name").unwrap_err().to_string();
        assert!(e.contains("\"name\"") && e.contains("integer"), "{e}");
        let e = row_opt_i64(&r, "protocols").unwrap_err().to_string();
        assert!(e.contains("at most one") || e.contains("integer"), "{e}");
        assert!(row_string_map(&r, "bad_map").is_err());
        assert!(row_string_map(&r, "int_map").is_err());
        assert!(row_uuid_set(&r, "protocols").is_err());
        assert!(row_string_set(&r, "external_ids").is_err());
    }

    #[test]
    fn builders() {
        let mut m = BTreeMap::new();
        m.insert("remote_ip".to_string(), "flow".to_string());
        assert_eq!(string_map(&m), json!(["map", [["remote_ip", "flow"]]]));
        assert_eq!(optional_integer(None), json!(["set", []]));
        assert_eq!(optional_integer(Some(1)), json!(1));
        assert_eq!(set([json!("a")]), json!(["set", ["a"]]));
        assert_eq!(cond_eq("name", json!("x")), json!(["name", "==", "x"]));
        assert_eq!(datum_string_map(&string_map(&m)).unwrap(), m);
    }
}
