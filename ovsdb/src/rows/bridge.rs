//! `Bridge` rows.

use std::collections::{BTreeMap, BTreeSet};

use crate::datum::{Ref, Set, Uuid};

table! {
    /// A bridge: how the agent configures it (`fail_mode`, `protocols`, `datapath_type`), its
    /// `external_ids` (the flow generation) and its ports.
    Bridge in "Bridge" {
        UUID uuid: Uuid = "_uuid",
        NAME name: String = "name",
        /// `secure` or `standalone`; unset (the empty set) is standalone.
        FAIL_MODE fail_mode: Option<String> = "fail_mode",
        PROTOCOLS protocols: BTreeSet<String> = "protocols",
        /// `""`/`system`, `netdev` or `dummy`.
        DATAPATH_TYPE datapath_type: String = "datapath_type",
        EXTERNAL_IDS external_ids: BTreeMap<String, String> = "external_ids",
        PORTS ports: Set<Ref> = "ports",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{fixtures, Table};
    use serde_json::{json, Value};

    #[test]
    fn parses_the_servers_row() {
        let b = Bridge::from_row(&fixtures::named(fixtures::BRIDGE, "br0")).unwrap();
        assert_eq!(b.uuid().unwrap().as_str(), "34753c2a-c5c3-4cce-94f2-f6100ffde424");
        assert_eq!(b.fail_mode().unwrap().as_deref(), Some("secure"));
        // A set of one protocol is sent as the bare string.
        assert_eq!(b.protocols().unwrap(), &BTreeSet::from(["OpenFlow13".to_string()]));
        assert_eq!(b.datapath_type().unwrap(), "dummy");
        assert_eq!(b.external_ids().unwrap()["sdn-node-generation"], "3");
        assert_eq!(b.ports().unwrap().len(), 5);
        assert!(b.ports().unwrap().contains_uuid(&Uuid::new("50ce6a0f-7aa8-4f5e-a077-c6235a738af8")));
    }

    #[test]
    fn builds_what_the_agent_writes() {
        let b = Bridge {
            name: Some("br0".into()),
            fail_mode: Some(None),
            protocols: Some(BTreeSet::from(["OpenFlow13".to_string()])),
            ports: Some(Set::one(Ref::named("port"))),
            ..Default::default()
        };
        assert_eq!(
            Value::Object(b.to_row()),
            json!({"name": "br0", "fail_mode": ["set", []], "protocols": ["set", ["OpenFlow13"]], "ports": ["set", [["named-uuid", "port"]]]})
        );
        // What is written reads back the same.
        assert_eq!(Bridge::from_row(&b.to_row()).unwrap(), b);
    }
}
