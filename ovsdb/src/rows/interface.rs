//! `Interface` rows.

use std::collections::BTreeMap;

use crate::datum::Uuid;

table! {
    /// An interface: what the agent configures (type, options, requested ofport, MAC, ingress
    /// policing) and what ovs-vswitchd reports (`ofport`, `error`, `mac_in_use`).
    Interface in "Interface" {
        UUID uuid: Uuid = "_uuid",
        NAME name: String = "name",
        /// `""` (a system device), `internal`, `vxlan`, `dummy`...
        TYPE iface_type: String = "type",
        OPTIONS options: BTreeMap<String, String> = "options",
        OFPORT_REQUEST ofport_request: Option<i64> = "ofport_request",
        /// Unset until ovs-vswitchd assigns one; -1 if it could not create the interface.
        OFPORT ofport: Option<i64> = "ofport",
        MAC mac: Option<String> = "mac",
        MAC_IN_USE mac_in_use: Option<String> = "mac_in_use",
        /// Why ovs-vswitchd could not create the interface.
        ERROR error: Option<String> = "error",
        /// kbps; 0 is no policing.
        INGRESS_POLICING_RATE ingress_policing_rate: i64 = "ingress_policing_rate",
        EXTERNAL_IDS external_ids: BTreeMap<String, String> = "external_ids",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{fixtures, Table};
    use serde_json::{json, Value};

    fn iface(name: &str) -> Interface {
        Interface::from_row(&fixtures::named(fixtures::INTERFACE, name)).unwrap()
    }

    #[test]
    fn parses_the_servers_rows() {
        assert_eq!(Interface::from_rows(&fixtures::rows(fixtures::INTERFACE)).unwrap().len(), 5);
        let vxlan = iface("vxlan0");
        assert_eq!(vxlan.iface_type().unwrap(), "vxlan");
        assert_eq!(vxlan.options().unwrap().get("remote_ip").map(String::as_str), Some("flow"));
        assert_eq!((vxlan.ofport_request().unwrap(), vxlan.ofport().unwrap()), (&Some(1), &Some(1)));
        assert_eq!(vxlan.mac().unwrap(), &None);
        assert_eq!(vxlan.error().unwrap(), &None);
        let tun = iface("tun0");
        assert_eq!(tun.mac().unwrap().as_deref(), Some("0a:58:0a:80:00:01"));
        assert_eq!(iface("veth1").ingress_policing_rate().unwrap(), &1000);
        assert_eq!(iface("br0").ofport().unwrap(), &Some(65534));
        let bad = iface("bad");
        assert_eq!(bad.ofport().unwrap(), &Some(-1));
        assert!(bad.error().unwrap().as_deref().unwrap().contains("could not open network device bad"));
        assert_eq!(bad.mac_in_use().unwrap(), &None);
    }

    #[test]
    fn builds_what_the_agent_writes() {
        let i = Interface {
            name: Some("vxlan0".into()),
            iface_type: Some("vxlan".into()),
            options: Some([("remote_ip", "flow"), ("key", "flow")].map(|(k, v)| (k.to_string(), v.to_string())).into()),
            ofport_request: Some(Some(1)),
            ..Default::default()
        };
        assert_eq!(
            Value::Object(i.to_row()),
            json!({"name": "vxlan0", "type": "vxlan", "options": ["map", [["key", "flow"], ["remote_ip", "flow"]]], "ofport_request": 1})
        );
        let unset = Interface { ofport_request: Some(None), ingress_policing_rate: Some(2), ..Default::default() };
        assert_eq!(Value::Object(unset.to_row()), json!({"ofport_request": ["set", []], "ingress_policing_rate": 2}));
    }
}
