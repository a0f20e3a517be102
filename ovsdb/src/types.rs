//! Rows of tables the agent does not model (generic rows), and the dynamic [`Atom`].
//!
//! The tables the agent writes have typed rows ([`crate::rows`]); everything else — a monitor of
//! an arbitrary table, a test's `Manager` row — is a [`Row`], a JSON object, read column by
//! column with [`column`], which checks the value's type ([`crate::datum`]) and names the column
//! in its error instead of panicking or silently defaulting.

use serde_json::Value;

pub use crate::datum::brief;
use crate::datum::{FromDatum, NamedUuid, ToDatum, Uuid};
use crate::OvsdbError;

/// A row as sent by the server (or written in an operation): column name -> datum.
pub type Row = serde_json::Map<String, Value>;

/// One OVSDB atom of any type.
#[derive(Debug, Clone, PartialEq)]
pub enum Atom {
    String(String),
    Integer(i64),
    Real(f64),
    Boolean(bool),
    Uuid(Uuid),
    NamedUuid(NamedUuid),
}

impl ToDatum for Atom {
    fn to_datum(&self) -> Value {
        match self {
            Atom::String(s) => s.to_datum(),
            Atom::Integer(i) => i.to_datum(),
            Atom::Real(r) => r.to_datum(),
            Atom::Boolean(b) => b.to_datum(),
            Atom::Uuid(u) => u.to_datum(),
            Atom::NamedUuid(n) => n.to_datum(),
        }
    }
}

impl FromDatum for Atom {
    fn from_datum(v: &Value) -> Result<Atom, String> {
        match v {
            Value::String(s) => Ok(Atom::String(s.clone())),
            Value::Bool(b) => Ok(Atom::Boolean(*b)),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Ok(Atom::Integer(i)),
                (None, Some(f)) => Ok(Atom::Real(f)),
                (None, None) => Err(format!("number {n} is not representable")),
            },
            Value::Array(_) => Uuid::from_datum(v)
                .map(Atom::Uuid)
                .or_else(|_| NamedUuid::from_datum(v).map(Atom::NamedUuid))
                .map_err(|_| format!("expected an atom, found {}", brief(v))),
            _ => Err(format!("expected an atom, found {}", brief(v))),
        }
    }
}

/// Reads column `col` of a generic row as a `T` (e.g. `Option<i64>` for an optional integer,
/// `BTreeMap<String, String>` for `external_ids`); a missing column or a value of another type
/// is [`OvsdbError::Protocol`] naming the column.
pub fn column<T: FromDatum>(row: &Row, col: &str) -> Result<T, OvsdbError> {
    let v = row.get(col).ok_or_else(|| OvsdbError::Protocol(format!("row has no column {col:?}")))?;
    T::from_datum(v).map_err(|e| OvsdbError::Protocol(format!("column {col:?}: {e}")))
}

/// Interprets a JSON value as a row object.
pub fn as_row<'a>(v: &'a Value, what: &str) -> Result<&'a Row, OvsdbError> {
    v.as_object()
        .ok_or_else(|| OvsdbError::Protocol(format!("{what}: expected a row object, found {}", brief(v))))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::datum::{Ref, Set};
    use serde_json::json;

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
            Atom::Uuid(Uuid::new("0d1b0c7e-0000-4000-8000-000000000001")),
            Atom::NamedUuid(NamedUuid::new("row1")),
        ] {
            assert_eq!(Atom::from_datum(&a.to_datum()).unwrap(), a);
        }
        assert!(Atom::from_datum(&json!(["uuid"])).is_err());
        assert!(Atom::from_datum(&json!({"a": 1})).is_err());
        assert!(Atom::from_datum(&json!(null)).is_err());
    }

    #[test]
    fn generic_columns() {
        let r = row(json!({
            "_uuid": ["uuid", "u1"],
            "name": "br0",
            "ofport": ["set", []],
            "ofport2": 5,
            "ofport3": ["set", [7]],
            "protocols": ["set", ["OpenFlow13", "OpenFlow10"]],
            "ports": ["set", [["uuid", "a"], ["uuid", "b"]]],
            "external_ids": ["map", [["k", "v"], ["k2", "v2"]]],
            "status": ["map", [["bound_port", "6640"]]],
        }));
        assert_eq!(column::<Uuid>(&r, "_uuid").unwrap(), Uuid::new("u1"));
        assert_eq!(column::<String>(&r, "name").unwrap(), "br0");
        assert_eq!(column::<Option<i64>>(&r, "ofport").unwrap(), None);
        assert_eq!(column::<Option<i64>>(&r, "ofport2").unwrap(), Some(5));
        assert_eq!(column::<Option<i64>>(&r, "ofport3").unwrap(), Some(7));
        assert_eq!(column::<BTreeSet<String>>(&r, "protocols").unwrap().len(), 2);
        assert_eq!(column::<Set<Ref>>(&r, "ports").unwrap().len(), 2);
        assert_eq!(column::<BTreeMap<String, String>>(&r, "external_ids").unwrap()["k2"], "v2");
        // Errors name the column and the problem.
        let e = column::<String>(&r, "missing").unwrap_err().to_string();
        assert!(e.contains("no column \"missing\""), "{e}");
        let e = column::<i64>(&r, "name").unwrap_err().to_string();
        assert!(e.contains("column \"name\": expected an integer"), "{e}");
        assert!(column::<Option<i64>>(&r, "protocols").is_err());
        assert!(column::<Set<Uuid>>(&r, "protocols").is_err());
        assert!(column::<Set<String>>(&r, "external_ids").is_err());
    }
}
