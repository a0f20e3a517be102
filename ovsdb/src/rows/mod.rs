//! Typed rows of the tables the agent writes: `Open_vSwitch`, `Bridge`, `Port`, `Interface` and
//! `QoS`, with the columns it uses. Each is built into a [`Row`] and parsed from one here and
//! nowhere else, by one macro, so that the two directions cannot disagree.
//!
//! Every field is an `Option`: `None` means "the column is not in this row" — not selected by a
//! `select`, not monitored, or not written by an `insert`/`update` (which then leaves it at its
//! default / unchanged). The column's own type is inside: an OVSDB optional column (`Bridge.fail_mode`,
//! `Interface.ofport`) is `Option<Option<T>>`, `Some(None)` being the empty set. The accessor of
//! the same name as the field returns the value, or an error naming the table and column if the
//! row does not have it.
//!
//! Parsing ([`Table::from_row`]) reads the columns the type knows and ignores the others; a
//! column of the wrong shape is [`OvsdbError::BadRow`] naming the table, the column and what is
//! wrong — never a panic, never a silent default. There is no `Queue` type: the agent neither
//! reads nor writes queues (its QoS rows are `linux-htb` with `other_config:max-rate`, as
//! openshift-sdn's are).

use crate::datum::{FromDatum, ToDatum};
use crate::txn::{self, Condition, Mutation, Operation};
use crate::types::Row;
use crate::OvsdbError;

/// A typed table: its name, and its rows to and from the wire. The provided methods build the
/// operations on the table, with typed rows where an operation carries rows.
pub trait Table: Sized {
    /// The table's name in the schema.
    const TABLE: &'static str;

    /// Parses a row as the server sends it (columns this type does not know are ignored).
    fn from_row(row: &Row) -> Result<Self, OvsdbError>;

    /// The columns that are set, in their wire form.
    fn to_row(&self) -> Row;

    /// Parses each row.
    fn from_rows(rows: &[Row]) -> Result<Vec<Self>, OvsdbError> {
        rows.iter().map(Self::from_row).collect()
    }

    /// `insert` of this row, named `uuid_name` for later operations of the transaction.
    fn insert(&self, uuid_name: Option<&str>) -> Operation {
        txn::insert(Self::TABLE, self.to_row(), uuid_name)
    }

    /// `update` of the rows matching `where_` with this row's columns.
    fn update(&self, where_: Vec<Condition>) -> Operation {
        txn::update(Self::TABLE, where_, self.to_row())
    }

    fn select(where_: Vec<Condition>, columns: &[&str]) -> Operation {
        txn::select(Self::TABLE, where_, columns)
    }

    fn mutate(where_: Vec<Condition>, mutations: Vec<Mutation>) -> Operation {
        txn::mutate(Self::TABLE, where_, mutations)
    }

    fn delete(where_: Vec<Condition>) -> Operation {
        txn::delete(Self::TABLE, where_)
    }

    /// `wait` (timeout 0) that the rows matching `where_`, projected onto `columns`, are `rows`.
    fn wait_eq(where_: Vec<Condition>, columns: &[&str], rows: &[Self]) -> Operation {
        txn::wait_eq(Self::TABLE, where_, columns, rows.iter().map(Self::to_row).collect())
    }
}

/// The error of a column that is missing or malformed.
pub(crate) fn bad_row(table: &'static str, column: &'static str, problem: String) -> OvsdbError {
    OvsdbError::BadRow { table, column, problem }
}

/// Reads one column of a typed row: absent is `None`, malformed an error.
pub(crate) fn read<T: FromDatum>(row: &Row, table: &'static str, column: &'static str) -> Result<Option<T>, OvsdbError> {
    row.get(column).map(|v| T::from_datum(v).map_err(|p| bad_row(table, column, p))).transpose()
}

/// Writes one column of a typed row, if it is set.
pub(crate) fn write<T: ToDatum>(row: &mut Row, column: &'static str, value: &Option<T>) {
    if let Some(v) = value {
        row.insert(column.to_string(), v.to_datum());
    }
}

/// Declares a typed row: the struct (every field an `Option`, see the module's documentation),
/// a constant per column name, `COLUMNS`, an accessor per column and the [`Table`] impl.
macro_rules! table {
    (
        $(#[$meta:meta])*
        $name:ident in $table:literal {
            $( $(#[$fmeta:meta])* $konst:ident $field:ident: $ty:ty = $col:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: Option<$ty>, )*
        }

        impl $name {
            $(
                #[doc = concat!("`", $col, "`")]
                pub const $konst: &'static str = $col;
            )*
            /// Every column this type knows.
            pub const COLUMNS: &'static [&'static str] = &[$($col),*];
            $(
                #[doc = concat!("The `", $col, "` column; an error if the row does not have it.")]
                pub fn $field(&self) -> Result<&$ty, $crate::OvsdbError> {
                    self.$field.as_ref().ok_or_else(|| {
                        $crate::rows::bad_row($table, $col, "missing (not selected, or not sent)".into())
                    })
                }
            )*
        }

        impl $crate::rows::Table for $name {
            const TABLE: &'static str = $table;

            fn from_row(row: &$crate::types::Row) -> Result<Self, $crate::OvsdbError> {
                Ok($name { $( $field: $crate::rows::read(row, $table, $col)?, )* })
            }

            fn to_row(&self) -> $crate::types::Row {
                let mut row = $crate::types::Row::new();
                $( $crate::rows::write(&mut row, $col, &self.$field); )*
                row
            }
        }
    };
}

// After the macro: the tables' modules use it by textual scope.
mod bridge;
mod interface;
mod open_vswitch;
mod port;
mod qos;

pub use bridge::Bridge;
pub use interface::Interface;
pub use open_vswitch::OpenVswitch;
pub use port::Port;
pub use qos::Qos;


impl crate::txn::OperationResult {
    /// The rows of a `select` result, typed; a row that does not parse is an error naming its
    /// table and column. (Here rather than in `txn`: operations know nothing of the tables.)
    pub fn into_table<T: Table>(self) -> Result<Vec<T>, crate::OvsdbError> {
        self.into_rows()?.iter().map(T::from_row).collect()
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Rows as a real ovsdb-server (Open vSwitch 3.1) returned them for a `select` of every
    //! column the types know, after:
    //!
    //! ```text
    //! ovs-vsctl add-br br0 -- set bridge br0 fail_mode=secure protocols=OpenFlow13 datapath_type=dummy external_ids:sdn-node-generation=3
    //! ovs-vsctl add-port br0 vxlan0 -- set interface vxlan0 type=vxlan options:remote_ip=flow options:key=flow ofport_request=1
    //! ovs-vsctl add-port br0 tun0 -- set interface tun0 type=internal ofport_request=2 mac='"0a:58:0a:80:00:01"'
    //! ovs-vsctl add-port br0 veth1 -- set interface veth1 type=dummy -- set port veth1 external_ids:sdn-node-pod='{"ns":"a"}' qos=@q \
    //!     -- --id=@q create qos type=linux-htb other-config:max-rate=1000000 -- set interface veth1 ingress_policing_rate=1000
    //! ovs-vsctl add-port br0 bad -- set interface bad type=nonexistent
    //! ovs-vsctl set open_vswitch . other_config:flow-restore-wait=true
    //! ```
    //! (ovs-vswitchd with the dummy datapath; `bad` could not be created.)

    use serde_json::Value;

    use crate::types::Row;

    pub const OPEN_VSWITCH: &str = r#"[{"_uuid":["uuid","d16a2ad8-05e7-4a31-b17b-f194a3b675bb"],"bridges":["uuid","34753c2a-c5c3-4cce-94f2-f6100ffde424"],"other_config":["map",[["flow-restore-wait","true"]]]}]"#;

    pub const BRIDGE: &str = r#"[{"_uuid":["uuid","34753c2a-c5c3-4cce-94f2-f6100ffde424"],"datapath_type":"dummy","external_ids":["map",[["sdn-node-generation","3"]]],"fail_mode":"secure","name":"br0","ports":["set",[["uuid","03a23fe4-25bf-44a3-9d6e-de5cfd1b2506"],["uuid","50ce6a0f-7aa8-4f5e-a077-c6235a738af8"],["uuid","9d302be5-2938-4b48-b9c0-1717edae0264"],["uuid","d11a49e4-141f-42e3-a916-29d9520f41ad"],["uuid","e757550a-9e79-4bf0-95f9-f43204efb1a7"]]],"protocols":"OpenFlow13"}]"#;

    pub const PORT: &str = r#"[{"_uuid":["uuid","03a23fe4-25bf-44a3-9d6e-de5cfd1b2506"],"external_ids":["map",[]],"interfaces":["uuid","0f6c0dee-fc66-4ce3-8e12-4f0c638b9b8f"],"name":"bad","qos":["set",[]]},{"_uuid":["uuid","e757550a-9e79-4bf0-95f9-f43204efb1a7"],"external_ids":["map",[]],"interfaces":["uuid","0a52e0b4-76a2-4d12-b3b7-8fbc79ae46bd"],"name":"br0","qos":["set",[]]},{"_uuid":["uuid","9d302be5-2938-4b48-b9c0-1717edae0264"],"external_ids":["map",[]],"interfaces":["uuid","efec02e4-d005-4b74-ba4d-d786f1754626"],"name":"tun0","qos":["set",[]]},{"_uuid":["uuid","50ce6a0f-7aa8-4f5e-a077-c6235a738af8"],"external_ids":["map",[["sdn-node-pod","{\"ns\":\"a\"}"]]],"interfaces":["uuid","323ce0e2-e087-48aa-8e7d-3c5a6e5ffe69"],"name":"veth1","qos":["uuid","102af878-0c8c-47e4-8c5e-0ca76ca36a90"]},{"_uuid":["uuid","d11a49e4-141f-42e3-a916-29d9520f41ad"],"external_ids":["map",[]],"interfaces":["uuid","6af7a348-9053-404d-9fd3-1ca167d75b48"],"name":"vxlan0","qos":["set",[]]}]"#;

    pub const INTERFACE: &str = r#"[{"_uuid":["uuid","0f6c0dee-fc66-4ce3-8e12-4f0c638b9b8f"],"error":"could not open network device bad (Address family not supported by protocol)","external_ids":["map",[]],"ingress_policing_rate":0,"mac":["set",[]],"mac_in_use":["set",[]],"name":"bad","ofport":-1,"ofport_request":["set",[]],"options":["map",[]],"type":"nonexistent"},{"_uuid":["uuid","6af7a348-9053-404d-9fd3-1ca167d75b48"],"error":["set",[]],"external_ids":["map",[]],"ingress_policing_rate":0,"mac":["set",[]],"mac_in_use":"5a:7c:85:77:fd:5b","name":"vxlan0","ofport":1,"ofport_request":1,"options":["map",[["key","flow"],["remote_ip","flow"]]],"type":"vxlan"},{"_uuid":["uuid","323ce0e2-e087-48aa-8e7d-3c5a6e5ffe69"],"error":["set",[]],"external_ids":["map",[]],"ingress_policing_rate":1000,"mac":["set",[]],"mac_in_use":"aa:55:aa:55:00:03","name":"veth1","ofport":3,"ofport_request":["set",[]],"options":["map",[]],"type":"dummy"},{"_uuid":["uuid","0a52e0b4-76a2-4d12-b3b7-8fbc79ae46bd"],"error":["set",[]],"external_ids":["map",[]],"ingress_policing_rate":0,"mac":["set",[]],"mac_in_use":"2a:3c:75:34:ce:4c","name":"br0","ofport":65534,"ofport_request":["set",[]],"options":["map",[]],"type":"internal"},{"_uuid":["uuid","efec02e4-d005-4b74-ba4d-d786f1754626"],"error":["set",[]],"external_ids":["map",[]],"ingress_policing_rate":0,"mac":"0a:58:0a:80:00:01","mac_in_use":"0a:58:0a:80:00:01","name":"tun0","ofport":2,"ofport_request":2,"options":["map",[]],"type":"internal"}]"#;

    pub const QOS: &str = r#"[{"_uuid":["uuid","102af878-0c8c-47e4-8c5e-0ca76ca36a90"],"other_config":["map",[["max-rate","1000000"]]],"type":"linux-htb"}]"#;

    /// The rows of one of the constants.
    pub fn rows(json: &str) -> Vec<Row> {
        match serde_json::from_str(json).expect("fixture is JSON") {
            Value::Array(rows) => rows.into_iter().map(|r| r.as_object().expect("a row").clone()).collect(),
            _ => panic!("fixture is not an array"),
        }
    }

    /// The row named `name` (its `name` column) of one of the constants.
    pub fn named(json: &str, name: &str) -> Row {
        rows(json).into_iter().find(|r| r.get("name").and_then(Value::as_str) == Some(name)).expect("fixture has the row")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(v: serde_json::Value) -> Row {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn missing_and_malformed_columns_name_table_and_column() {
        // Absent columns are None; asking for one is an error naming it.
        let b = Bridge::from_row(&row(json!({"name": "br0"}))).unwrap();
        assert_eq!(b.name().unwrap(), "br0");
        let e = b.ports().unwrap_err().to_string();
        assert!(e.contains("Bridge") && e.contains("\"ports\"") && e.contains("missing"), "{e}");
        for (table, r, column, problem) in [
            ("Bridge", Bridge::from_row(&row(json!({"ports": ["set", [["uuid", "a"], 5]]}))).map(drop), "ports", "element 1: expected a uuid"),
            ("Port", Port::from_row(&row(json!({"qos": ["set", [["uuid", "a"], ["uuid", "b"]]]}))).map(drop), "qos", "at most one value, found 2"),
            ("Interface", Interface::from_row(&row(json!({"ofport": "1"}))).map(drop), "ofport", "expected an integer"),
            ("Open_vSwitch", OpenVswitch::from_row(&row(json!({"other_config": ["map", [["k", 1]]]}))).map(drop), "other_config", "map value"),
            ("QoS", Qos::from_row(&row(json!({"_uuid": "not-a-uuid"}))).map(drop), "_uuid", "expected a uuid"),
        ] {
            match r {
                Err(OvsdbError::BadRow { table: t, column: c, problem: p }) => {
                    assert_eq!((t, c), (table, column));
                    assert!(p.contains(problem), "{table}.{column}: {p}");
                }
                other => panic!("{table}.{column}: {other:?}"),
            }
        }
        let e = Interface::from_row(&row(json!({"ofport": "1"}))).unwrap_err().to_string();
        assert_eq!(e, "malformed Interface row: column \"ofport\": expected an integer, found \"1\"");
    }

    #[test]
    fn unknown_columns_are_ignored_and_unset_fields_not_written() {
        let p = Port::from_row(&row(json!({"name": "p", "bond_mode": ["set", []], "tag": 5}))).unwrap();
        assert_eq!(p, Port { name: Some("p".into()), ..Default::default() });
        assert_eq!(serde_json::Value::Object(p.to_row()), json!({"name": "p"}));
        assert_eq!(serde_json::Value::Object(Port::default().to_row()), json!({}));
    }
}

