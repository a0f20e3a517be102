//! Parses arbitrary bytes as JSON and runs every decoder the OVSDB client applies to what the
//! server sends: `<table-updates>` (`update` / `monitor` replies), `<table-updates2>`
//! (`update2` / `monitor_cond` replies), `transact` results, atoms, sets, maps and the typed row
//! readers, on the value itself and on the parts a JSON-RPC message would route to them.
//!
//! Invariants checked: no panic, stack overflow or abort; a parsed transact result has exactly one
//! entry per operation; an atom that decodes re-encodes to itself; `brief` stays short; the
//! errors' `Display` never panics.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sdn_node::ovsdb::client::ParseUpdates;
use sdn_node::ovsdb::txn::{self, parse_transact_result};
use sdn_node::ovsdb::types::{self, Atom, Row};
use sdn_node::ovsdb::{OvsdbError, TableUpdates, TableUpdates2};
use serde_json::{json, Value};

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
        txn::select("Bridge", vec![types::cond_eq("name", json!("br0"))], &["_uuid", "name"]),
        txn::wait_eq("Port", vec![], &["qos"], vec![]),
        txn::insert("QoS", json!({}), Some("q")),
        txn::mutate("Bridge", vec![], vec![]),
        txn::delete("Port", vec![]),
        txn::comment("fuzz"),
        json!({"no": "op"}),
        json!(5),
    ];
    let n = result.as_array().map_or(0, Vec::len);
    for len in [0, 1, n.saturating_sub(1), n, n + 1, sample.len()] {
        let ops: Vec<Value> = sample.iter().cycle().take(len).cloned().collect();
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
    if let Some(a) = show(Atom::from_json(v)) {
        assert_eq!(Atom::from_json(&a.to_json()).ok(), Some(a.clone()), "atom {a:?} does not round-trip");
    }
    if let Some(items) = show(types::datum_set(v)) {
        for item in items {
            let _ = show(Atom::from_json(item));
        }
    }
    let _ = show(types::datum_map(v));
    let _ = show(types::datum_string_map(v));
    let _ = show(types::datum_uuid(v));
}

fn check_row(row: &Row) {
    // Each column, plus one that is missing.
    for col in row.keys().map(String::as_str).take(16).chain(["no-such-column"]) {
        let _ = show(types::row_string(row, col));
        let _ = show(types::row_i64(row, col));
        let _ = show(types::row_opt_i64(row, col));
        let _ = show(types::row_opt_string(row, col));
        let _ = show(types::row_string_set(row, col));
        let _ = show(types::row_uuid(row, col));
        let set = show(types::row_uuid_set(row, col));
        if let Some(opt) = show(types::row_opt_uuid(row, col)) {
            let set = set.expect("row_opt_uuid succeeded but row_uuid_set failed");
            assert_eq!(opt.is_some() as usize, set.len());
        }
        let _ = show(types::row_string_map(row, col));
    }
}

/// Routes a message the way the client's reader does.
fn check_message(v: &Value) {
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
