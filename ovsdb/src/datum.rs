//! Typed OVSDB values (RFC 7047 §5.1): the one place their wire encodings are written and read.
//!
//! * atoms: a JSON string, integer, real or boolean; `["uuid", "<uuid>"]` ([`Uuid`]);
//!   `["named-uuid", "<id>"]` ([`NamedUuid`], a row inserted earlier in the same transaction);
//!   [`Ref`] is either of the two (a reference column written in a request);
//! * sets: `["set", [atom, ...]]`, or the atom itself for a set of one (ovsdb-server writes
//!   single-element sets that way). [`Set`] and `BTreeSet` are always written in the `["set", ..]`
//!   form; `Option` (a column of at most one value) is written as the atom or the empty set, as
//!   OVS itself does;
//! * maps: `["map", [[key, value], ...]]` (`BTreeMap`).
//!
//! [`ToDatum`] writes a value; [`FromDatum`] reads one and, when it cannot, says what is wrong in
//! a short message that the caller (a row parser, [`crate::rows`]) completes with the table and
//! the column. What is read comes from a peer we do not control: reading never panics.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

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

/// A value's OVSDB wire form.
pub trait ToDatum {
    fn to_datum(&self) -> Value;
}

/// Reading a value from its OVSDB wire form. The error is what is wrong (e.g. `expected an
/// integer, found "x"`), without the table or column, which only the caller knows.
pub trait FromDatum: Sized {
    fn from_datum(v: &Value) -> Result<Self, String>;
}

/// A type of atom: what a set may hold and a map may have as key or value.
pub trait AtomType: ToDatum + FromDatum {}

impl<T: ToDatum + ?Sized> ToDatum for &T {
    fn to_datum(&self) -> Value {
        (**self).to_datum()
    }
}

impl ToDatum for str {
    fn to_datum(&self) -> Value {
        Value::String(self.to_string())
    }
}

impl ToDatum for String {
    fn to_datum(&self) -> Value {
        Value::String(self.clone())
    }
}

impl FromDatum for String {
    fn from_datum(v: &Value) -> Result<Self, String> {
        v.as_str().map(str::to_string).ok_or_else(|| format!("expected a string, found {}", brief(v)))
    }
}

impl ToDatum for i64 {
    fn to_datum(&self) -> Value {
        Value::from(*self)
    }
}

impl FromDatum for i64 {
    fn from_datum(v: &Value) -> Result<Self, String> {
        v.as_i64().ok_or_else(|| format!("expected an integer, found {}", brief(v)))
    }
}

impl ToDatum for f64 {
    fn to_datum(&self) -> Value {
        Value::from(*self)
    }
}

impl FromDatum for f64 {
    fn from_datum(v: &Value) -> Result<Self, String> {
        v.as_f64().ok_or_else(|| format!("expected a real, found {}", brief(v)))
    }
}

impl ToDatum for bool {
    fn to_datum(&self) -> Value {
        Value::Bool(*self)
    }
}

impl FromDatum for bool {
    fn from_datum(v: &Value) -> Result<Self, String> {
        v.as_bool().ok_or_else(|| format!("expected a boolean, found {}", brief(v)))
    }
}

impl AtomType for String {}
impl AtomType for i64 {}
impl AtomType for f64 {}
impl AtomType for bool {}

/// `[tag, string]`, the form of both uuid atoms.
fn tagged(tag: &str, s: &str) -> Value {
    Value::Array(vec![Value::from(tag), Value::from(s)])
}

/// The string of `[tag, "<string>"]`, if `v` is exactly that.
fn untag<'a>(tag: &str, v: &'a Value) -> Option<&'a str> {
    match v.as_array().map(Vec::as_slice) {
        Some([Value::String(t), Value::String(s)]) if t == tag => Some(s),
        _ => None,
    }
}

/// A row's uuid, `["uuid", "<uuid>"]` on the wire. The string is the server's, kept as it is
/// (ovsdb-server validates uuids; we only compare and send them back).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Uuid(pub String);

impl Uuid {
    pub fn new(u: impl Into<String>) -> Self {
        Uuid(u.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl ToDatum for Uuid {
    fn to_datum(&self) -> Value {
        tagged("uuid", &self.0)
    }
}

impl FromDatum for Uuid {
    fn from_datum(v: &Value) -> Result<Self, String> {
        untag("uuid", v).map(Uuid::new).ok_or_else(|| format!("expected a uuid, found {}", brief(v)))
    }
}

impl AtomType for Uuid {}

/// `["named-uuid", "<id>"]`: the row an `insert` with `"uuid-name": "<id>"` creates, referred
/// to later in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedUuid(pub String);

impl NamedUuid {
    pub fn new(name: impl Into<String>) -> Self {
        NamedUuid(name.into())
    }
}

impl ToDatum for NamedUuid {
    fn to_datum(&self) -> Value {
        tagged("named-uuid", &self.0)
    }
}

impl FromDatum for NamedUuid {
    fn from_datum(v: &Value) -> Result<Self, String> {
        untag("named-uuid", v).map(NamedUuid::new).ok_or_else(|| format!("expected a named-uuid, found {}", brief(v)))
    }
}

impl AtomType for NamedUuid {}

/// A reference to a row, as a reference column holds it: an existing row ([`Uuid`]) or one
/// inserted by the same transaction ([`NamedUuid`]). Rows read back from the server only hold
/// the first kind (RFC 7047: named-uuids exist in requests only).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ref {
    Uuid(Uuid),
    Named(NamedUuid),
}

impl Ref {
    /// The uuid, for a reference to an existing row.
    pub fn uuid(&self) -> Option<&Uuid> {
        match self {
            Ref::Uuid(u) => Some(u),
            Ref::Named(_) => None,
        }
    }

    /// A reference to the row `uuid-name` `name` of the same transaction.
    pub fn named(name: impl Into<String>) -> Self {
        Ref::Named(NamedUuid::new(name))
    }
}

impl From<Uuid> for Ref {
    fn from(u: Uuid) -> Self {
        Ref::Uuid(u)
    }
}

impl From<NamedUuid> for Ref {
    fn from(n: NamedUuid) -> Self {
        Ref::Named(n)
    }
}

impl ToDatum for Ref {
    fn to_datum(&self) -> Value {
        match self {
            Ref::Uuid(u) => u.to_datum(),
            Ref::Named(n) => n.to_datum(),
        }
    }
}

impl FromDatum for Ref {
    fn from_datum(v: &Value) -> Result<Self, String> {
        if let Some(u) = untag("uuid", v) {
            return Ok(Ref::Uuid(Uuid::new(u)));
        }
        if let Some(n) = untag("named-uuid", v) {
            return Ok(Ref::Named(NamedUuid::new(n)));
        }
        Err(format!("expected a uuid, found {}", brief(v)))
    }
}

impl AtomType for Ref {}

/// The elements of a set datum: `["set", [..]]`, or a single atom (a set of one).
pub fn set_elements(v: &Value) -> Result<&[Value], String> {
    match v.as_array().map(Vec::as_slice) {
        Some([Value::String(tag), rest @ ..]) if tag == "set" => match rest {
            [Value::Array(items)] => Ok(items),
            _ => Err(format!("malformed set {}", brief(v))),
        },
        Some([Value::String(tag), ..]) if tag == "map" => Err(format!("expected a set, found a map {}", brief(v))),
        _ => Ok(std::slice::from_ref(v)),
    }
}

/// The `[key, value]` pairs of a map datum `["map", [[k, v], ..]]`.
pub fn map_pairs(v: &Value) -> Result<Vec<(&Value, &Value)>, String> {
    let bad = || format!("malformed map {}", brief(v));
    let pairs = match v.as_array().map(Vec::as_slice) {
        Some([Value::String(tag), Value::Array(pairs)]) if tag == "map" => pairs,
        _ => return Err(bad()),
    };
    pairs
        .iter()
        .map(|p| match p.as_array().map(Vec::as_slice) {
            Some([k, v]) => Ok((k, v)),
            _ => Err(bad()),
        })
        .collect()
}

/// `["set", [..]]` of `items`.
fn set_of<'a, T: ToDatum + 'a>(items: impl IntoIterator<Item = &'a T>) -> Value {
    Value::Array(vec![Value::from("set"), Value::Array(items.into_iter().map(ToDatum::to_datum).collect())])
}

/// A column of at most one value: the atom, or the empty set for `None`.
impl<T: AtomType> ToDatum for Option<T> {
    fn to_datum(&self) -> Value {
        match self {
            Some(v) => v.to_datum(),
            None => set_of::<T>([]),
        }
    }
}

impl<T: AtomType> FromDatum for Option<T> {
    fn from_datum(v: &Value) -> Result<Self, String> {
        match set_elements(v)? {
            [] => Ok(None),
            [x] => T::from_datum(x).map(Some),
            more => Err(format!("expected at most one value, found {}", more.len())),
        }
    }
}

/// A set in the order the server sent it (OVSDB sets are unordered: compare with
/// [`Set::contains`], or collect into a `BTreeSet`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set<T>(pub Vec<T>);

impl<T> Default for Set<T> {
    fn default() -> Self {
        Set(Vec::new())
    }
}

impl<T> Set<T> {
    pub fn empty() -> Self {
        Set(Vec::new())
    }

    pub fn one(x: T) -> Self {
        Set(vec![x])
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, x: &T) -> bool
    where
        T: PartialEq,
    {
        self.0.contains(x)
    }
}

impl Set<Ref> {
    /// Whether the set references the existing row `u`.
    pub fn contains_uuid(&self, u: &Uuid) -> bool {
        self.0.iter().any(|r| r.uuid() == Some(u))
    }

    /// The uuids of the existing rows referenced.
    pub fn uuids(&self) -> impl Iterator<Item = &Uuid> {
        self.0.iter().filter_map(Ref::uuid)
    }
}

impl<T> FromIterator<T> for Set<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Set(iter.into_iter().collect())
    }
}

impl<T> IntoIterator for Set<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, T> IntoIterator for &'a Set<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

fn elements<T: AtomType, C: FromIterator<T>>(v: &Value) -> Result<C, String> {
    set_elements(v)?
        .iter()
        .enumerate()
        .map(|(i, x)| T::from_datum(x).map_err(|e| format!("element {i}: {e}")))
        .collect()
}

impl<T: AtomType> ToDatum for Set<T> {
    fn to_datum(&self) -> Value {
        set_of(&self.0)
    }
}

impl<T: AtomType> FromDatum for Set<T> {
    fn from_datum(v: &Value) -> Result<Self, String> {
        elements(v)
    }
}

impl<T: AtomType + Ord> ToDatum for BTreeSet<T> {
    fn to_datum(&self) -> Value {
        set_of(self)
    }
}

impl<T: AtomType + Ord> FromDatum for BTreeSet<T> {
    fn from_datum(v: &Value) -> Result<Self, String> {
        elements(v)
    }
}

impl<K: AtomType + Ord, V: AtomType> ToDatum for BTreeMap<K, V> {
    fn to_datum(&self) -> Value {
        let pairs = self.iter().map(|(k, v)| Value::Array(vec![k.to_datum(), v.to_datum()])).collect();
        Value::Array(vec![Value::from("map"), Value::Array(pairs)])
    }
}

impl<K: AtomType + Ord, V: AtomType> FromDatum for BTreeMap<K, V> {
    fn from_datum(v: &Value) -> Result<Self, String> {
        map_pairs(v)?
            .into_iter()
            .map(|(k, val)| match (K::from_datum(k), V::from_datum(val)) {
                (Ok(k), Ok(val)) => Ok((k, val)),
                (Err(e), _) => Err(format!("map key {}: {e}", brief(k))),
                (_, Err(e)) => Err(format!("map value of {}: {e}", brief(k))),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip<T: ToDatum + FromDatum + PartialEq + fmt::Debug>(x: T, wire: Value) {
        assert_eq!(x.to_datum(), wire);
        assert_eq!(T::from_datum(&wire).unwrap(), x);
    }

    #[test]
    fn encodings_are_ovs_ones() {
        round_trip("br0".to_string(), json!("br0"));
        round_trip(-3i64, json!(-3));
        round_trip(1.5f64, json!(1.5));
        round_trip(true, json!(true));
        round_trip(Uuid::new("d16a2ad8-05e7-4a31-b17b-f194a3b675bb"), json!(["uuid", "d16a2ad8-05e7-4a31-b17b-f194a3b675bb"]));
        round_trip(NamedUuid::new("iface0"), json!(["named-uuid", "iface0"]));
        round_trip(Ref::named("port"), json!(["named-uuid", "port"]));
        round_trip(Ref::from(Uuid::new("u")), json!(["uuid", "u"]));
        round_trip(None::<i64>, json!(["set", []]));
        round_trip(Some(7i64), json!(7));
        round_trip(Set(vec![Ref::named("p0"), Ref::named("p1")]), json!(["set", [["named-uuid", "p0"], ["named-uuid", "p1"]]]));
        round_trip(Set::one("k".to_string()), json!(["set", ["k"]]));
        round_trip(BTreeSet::from(["OpenFlow13".to_string()]), json!(["set", ["OpenFlow13"]]));
        round_trip(
            BTreeMap::from([("remote_ip".to_string(), "flow".to_string()), ("key".to_string(), "flow".to_string())]),
            json!(["map", [["key", "flow"], ["remote_ip", "flow"]]]),
        );
        round_trip(BTreeMap::<String, String>::new(), json!(["map", []]));
    }

    #[test]
    fn what_ovsdb_server_sends_is_read() {
        // A set of one is the bare atom; an optional column set is the atom, unset the empty set.
        assert_eq!(BTreeSet::<String>::from_datum(&json!("OpenFlow13")).unwrap(), BTreeSet::from(["OpenFlow13".to_string()]));
        assert_eq!(Set::<Ref>::from_datum(&json!(["uuid", "a"])).unwrap(), Set::one(Ref::Uuid(Uuid::new("a"))));
        assert_eq!(Option::<i64>::from_datum(&json!(["set", [5]])).unwrap(), Some(5));
        let ports = Set::<Ref>::from_datum(&json!(["set", [["uuid", "a"], ["uuid", "b"]]])).unwrap();
        assert!(ports.contains_uuid(&Uuid::new("b")) && !ports.contains_uuid(&Uuid::new("c")));
        assert_eq!(ports.uuids().map(Uuid::as_str).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn malformed_values_say_what_is_wrong() {
        let cases: Vec<(Result<(), String>, &str)> = vec![
            (String::from_datum(&json!(7)).map(drop), "expected a string, found 7"),
            (i64::from_datum(&json!(1.5)).map(drop), "expected an integer, found 1.5"),
            (i64::from_datum(&json!(u64::MAX)).map(drop), "expected an integer"),
            (Uuid::from_datum(&json!(["uuid"])).map(drop), "expected a uuid"),
            (Uuid::from_datum(&json!(["named-uuid", "x"])).map(drop), "expected a uuid"),
            (Uuid::from_datum(&json!(["uuid", "x", "y"])).map(drop), "expected a uuid"),
            (Ref::from_datum(&json!({"uuid": "x"})).map(drop), "expected a uuid"),
            (Option::<i64>::from_datum(&json!(["set", [1, 2]])).map(drop), "at most one value, found 2"),
            (Option::<i64>::from_datum(&json!(["set", 1])).map(drop), "malformed set"),
            (Set::<String>::from_datum(&json!(["set", ["a", 1]])).map(drop), "element 1: expected a string"),
            (Set::<String>::from_datum(&json!(["map", []])).map(drop), "expected a set, found a map"),
            (BTreeMap::<String, String>::from_datum(&json!(["map", [["k"]]])).map(drop), "malformed map"),
            (BTreeMap::<String, String>::from_datum(&json!(["map", [[1, "v"]]])).map(drop), "map key 1: expected a string"),
            (BTreeMap::<String, String>::from_datum(&json!(["map", [["k", 2]]])).map(drop), "map value of \"k\": expected a string"),
            (BTreeMap::<String, String>::from_datum(&json!(["set", []])).map(drop), "malformed map"),
            (BTreeMap::<String, String>::from_datum(&json!("x")).map(drop), "malformed map"),
        ];
        for (r, want) in cases {
            let e = r.unwrap_err();
            assert!(e.contains(want), "{e:?} does not contain {want:?}");
        }
    }

    #[test]
    fn brief_is_short_and_cuts_at_a_char_boundary() {
        let long = Value::String("é".repeat(200));
        let b = brief(&long);
        assert!(b.len() <= 120 && b.ends_with("..."), "{b}");
        assert_eq!(brief(&json!([1])), "[1]");
    }
}
