//! Parses arbitrary bytes as JSON and runs every decoder the OVSDB client applies to what the
//! server sends: `<table-updates>` (`update` / `monitor` replies), `<table-updates2>`
//! (`update2` / `monitor_cond` replies), `transact` results, JSON-RPC message classification,
//! atoms, sets, maps, the column readers and the typed rows (`Bridge`, `Port`, ...), on the value
//! itself and on the parts a JSON-RPC message would route to them.
//!
//! Invariants checked: no panic, stack overflow or abort; a parsed transact result has exactly one
//! entry per operation; an atom that decodes re-encodes to itself; a typed row that parses
//! re-encodes to a row that parses to it; `brief` stays short; the errors' `Display` never panics.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet};

use sdn_node::ovsdb::client::ParseUpdates;
use sdn_node::ovsdb::datum::{self, FromDatum, ToDatum};
use sdn_node::ovsdb::rpc::Incoming;
use sdn_node::ovsdb::txn::{self, parse_transact_result, Condition, Mutation};
use sdn_node::ovsdb::types::{self, column, Atom, Row};
use sdn_node::ovsdb::{
    Bridge, Interface, OpenVswitch, OvsdbError, Port, Qos, Ref, Set, Table, TableUpdates, TableUpdates2, Uuid,
};
use serde_json::Value;

/// Values visited per input, so a huge flat array cannot make one execution slow.
const MAX_VISITS: usize = 256;

fn show<T>(r: Result<T, OvsdbError>) -> Option<T> {
    match r {
        Ok(t) => Some(t),
        Err(e) => {
            drop(e.to_string());
            let _ = e.is_disconnect();
            let _ = e.is_wait_conflict();
            None
        }
    }
}

fn check_updates(v: &Value) {
    if let Some(u) = show(TableUpdates::parse_updates(v)) {
        let tables = v.as_object().expect("table-updates parsed from a non-object");
        assert_eq!(u.len(), tables.len());
        for ru in u.values().flat_map(|t| t.values()) {
            for row in ru.old.iter().chain(&ru.new) {
                check_row(row);
            }
        }
    }
    if let Some(u) = show(TableUpdates2::parse_updates(v)) {
        assert_eq!(u.len(), v.as_object().map_or(0, |o| o.len()));
        for ru in u.values().flat_map(|t| t.values()) {
            use sdn_node::ovsdb::RowUpdate2::*;
            match ru {
                Initial(r) | Insert(r) | Modify(r) | Delete(Some(r)) => check_row(r),
                Delete(None) => {}
            }
        }
    }
}

fn check_transact(result: &Value) {
    let sample = [
        txn::select("Bridge", vec![Condition::eq("name", "br0")], &["_uuid", "name"]),
        txn::wait_eq("Port", vec![], &["qos"], vec![]),
        txn::insert("QoS", Row::new(), Some("q")),
        txn::mutate("Bridge", vec![], vec![Mutation::delete("ports", Set::one(Uuid::new("u")))]),
        txn::delete("Port", vec![]),
        txn::comment("fuzz"),
    ];
    let n = result.as_array().map_or(0, Vec::len);
    for len in [0, 1, n.saturating_sub(1), n, n + 1, sample.len()] {
        let ops: Vec<txn::Operation> = sample.iter().cycle().take(len).cloned().collect();
        if let Some(res) = show(parse_transact_result(&ops, result)) {
            assert_eq!(res.len(), ops.len(), "one result per operation");
            for r in res {
                if let Some(rows) = show(r.into_rows()) {
                    rows.iter().for_each(check_row);
                }
            }
        }
    }
}

fn check_datum(v: &Value) {
    let b = types::brief(v);
    assert!(b.chars().count() <= 120, "brief() is {} chars", b.chars().count());
    if let Ok(a) = Atom::from_datum(v) {
        assert_eq!(Atom::from_datum(&a.to_datum()).ok(), Some(a.clone()), "atom {a:?} does not round-trip");
    }
    if let Ok(items) = datum::set_elements(v) {
        for item in items {
            let _ = Atom::from_datum(item);
        }
    }
    let _ = datum::map_pairs(v);
    let _ = BTreeMap::<String, String>::from_datum(v);
    let _ = Uuid::from_datum(v);
    let _ = Ref::from_datum(v);
}

/// A typed row that parses re-encodes to a row that parses to it.
fn check_typed<T: Table + PartialEq + std::fmt::Debug>(row: &Row) {
    if let Some(t) = show(T::from_row(row)) {
        assert_eq!(T::from_row(&t.to_row()).ok().as_ref(), Some(&t), "{} row does not round-trip", T::TABLE);
    }
}

fn check_row(row: &Row) {
    // Each column, plus one that is missing.
    for col in row.keys().map(String::as_str).take(16).chain(["no-such-column"]) {
        let _ = show(column::<String>(row, col));
        let _ = show(column::<i64>(row, col));
        let _ = show(column::<Option<i64>>(row, col));
        let _ = show(column::<Option<String>>(row, col));
        let _ = show(column::<BTreeSet<String>>(row, col));
        let _ = show(column::<Uuid>(row, col));
        let set = show(column::<Set<Uuid>>(row, col));
        if let Some(opt) = show(column::<Option<Uuid>>(row, col)) {
            let set = set.expect("an optional uuid parsed but the set of uuids did not");
            assert_eq!(opt.is_some() as usize, set.len());
        }
        let _ = show(column::<BTreeMap<String, String>>(row, col));
    }
    check_typed::<OpenVswitch>(row);
    check_typed::<Bridge>(row);
    check_typed::<Port>(row);
    check_typed::<Interface>(row);
    check_typed::<Qos>(row);
}

/// Routes a message the way the client's reader does.
fn check_message(v: &Value) {
    let _ = Incoming::parse(v.clone());
    let Some(obj) = v.as_object() else { return };
    match obj.get("method").and_then(Value::as_str) {
        Some("update" | "update2") => {
            if let Some([Value::String(_), updates, ..]) =
                obj.get("params").and_then(Value::as_array).map(Vec::as_slice)
            {
                check_updates(updates);
            }
        }
        _ => {
            if let Some(result) = obj.get("result") {
                check_updates(result);
                check_transact(result);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<Value>(data) else { return };
    check_message(&v);
    check_updates(&v);
    check_transact(&v);
    // Every nested value as a datum, and every nested object as a row (bounded walk).
    let mut stack = vec![&v];
    let mut visits = 0;
    while let Some(x) = stack.pop() {
        visits += 1;
        if visits > MAX_VISITS {
            break;
        }
        check_datum(x);
        match x {
            Value::Object(o) => {
                check_row(o);
                let _ = show(types::as_row(x, "fuzz"));
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
});
