//! `QoS` rows.

use std::collections::BTreeMap;

use crate::datum::Uuid;

table! {
    /// A pod's ingress limit: `linux-htb` with `other_config:max-rate` (bits per second).
    Qos in "QoS" {
        UUID uuid: Uuid = "_uuid",
        TYPE qos_type: String = "type",
        OTHER_CONFIG other_config: BTreeMap<String, String> = "other_config",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{fixtures, Table};
    use serde_json::{json, Value};

    #[test]
    fn parses_the_servers_row_and_builds_the_agents() {
        let q = Qos::from_rows(&fixtures::rows(fixtures::QOS)).unwrap().remove(0);
        assert_eq!(q.uuid().unwrap().as_str(), "102af878-0c8c-47e4-8c5e-0ca76ca36a90");
        assert_eq!(q.qos_type().unwrap(), "linux-htb");
        assert_eq!(q.other_config().unwrap()["max-rate"], "1000000");
        let mine = Qos { qos_type: q.qos_type.clone(), other_config: q.other_config.clone(), ..Default::default() };
        assert_eq!(Value::Object(mine.to_row()), json!({"type": "linux-htb", "other_config": ["map", [["max-rate", "1000000"]]]}));
    }
}
