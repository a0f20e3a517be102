//! `Port` rows.

use std::collections::BTreeMap;

use crate::datum::{Ref, Set, Uuid};

table! {
    /// A port: its interfaces (the agent's ports have one, of the same name), its
    /// `external_ids` (the pod record) and its QoS.
    Port in "Port" {
        UUID uuid: Uuid = "_uuid",
        NAME name: String = "name",
        INTERFACES interfaces: Set<Ref> = "interfaces",
        EXTERNAL_IDS external_ids: BTreeMap<String, String> = "external_ids",
        /// The `QoS` row (a root table: destroyed explicitly, not collected).
        QOS qos: Option<Ref> = "qos",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{fixtures, Table};
    use serde_json::{json, Value};

    #[test]
    fn parses_the_servers_rows() {
        let ports = Port::from_rows(&fixtures::rows(fixtures::PORT)).unwrap();
        assert_eq!(ports.len(), 5);
        let veth = Port::from_row(&fixtures::named(fixtures::PORT, "veth1")).unwrap();
        assert_eq!(veth.qos().unwrap(), &Some(Ref::Uuid(Uuid::new("102af878-0c8c-47e4-8c5e-0ca76ca36a90"))));
        assert_eq!(veth.external_ids().unwrap()["sdn-node-pod"], r#"{"ns":"a"}"#);
        assert_eq!(veth.interfaces().unwrap().uuids().count(), 1);
        let tun = Port::from_row(&fixtures::named(fixtures::PORT, "tun0")).unwrap();
        assert_eq!(tun.qos().unwrap(), &None);
        assert!(tun.external_ids().unwrap().is_empty());
    }

    #[test]
    fn builds_what_the_agent_writes() {
        // ovs-vsctl add-port inserts {"name": .., "interfaces": ["named-uuid", ..]}: the same
        // set, written in its explicit form.
        let p = Port { name: Some("veth2".into()), interfaces: Some(Set::one(Ref::named("iface0"))), ..Default::default() };
        assert_eq!(Value::Object(p.to_row()), json!({"name": "veth2", "interfaces": ["set", [["named-uuid", "iface0"]]]}));
        let clear = Port { qos: Some(None), ..Default::default() };
        assert_eq!(Value::Object(clear.to_row()), json!({"qos": ["set", []]}));
        let attach = Port { qos: Some(Some(Ref::named("qos"))), ..Default::default() };
        assert_eq!(Value::Object(attach.to_row()), json!({"qos": ["named-uuid", "qos"]}));
    }
}
