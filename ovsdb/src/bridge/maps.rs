//! Keys of map columns: `Port.external_ids` (pod records), `Bridge.external_ids` (the flow
//! generation), `Open_vSwitch.other_config` (`flow-restore-wait`). A write is one `mutate`
//! (delete the keys, then insert the pair), so it needs no read and no guard.

use std::collections::BTreeMap;

use super::{where_name, Ovs};
use crate::datum::Set;
use crate::rows::{Bridge, OpenVswitch, Port, Table};
use crate::txn::{self, Condition, Mutation};
use crate::OvsdbError;

/// Removes the keys `remove` of map column `col`, then sets `set` (if any).
pub(super) fn map_mutations(col: &str, remove: &[&str], set: Option<(&str, &str)>) -> Vec<Mutation> {
    // A map column's `delete` takes a map (pairs) or a set of keys: here the keys.
    let keys: Set<String> = remove.iter().map(|k| k.to_string()).collect();
    let mut mutations = vec![Mutation::delete(col, keys)];
    if let Some((k, v)) = set {
        mutations.push(Mutation::insert(col, BTreeMap::from([(k.to_string(), v.to_string())])));
    }
    mutations
}

impl Ovs {
    /// Atomically removes the keys `remove` of a map column and then sets `set` (if any), in
    /// one `mutate`; a missing row is [`OvsdbError::NotFound`].
    async fn mutate_map(
        &self,
        table: &'static str,
        where_: Vec<Condition>,
        name: &str,
        col: &str,
        remove: &[&str],
        set: Option<(&str, &str)>,
    ) -> Result<(), OvsdbError> {
        let res = self.transact(vec![txn::mutate(table, where_, map_mutations(col, remove, set))]).await?;
        if res.first().and_then(|r| r.count) == Some(0) {
            return Err(OvsdbError::NotFound { table, name: name.to_string() });
        }
        Ok(())
    }

    /// Sets (`Some`) or removes (`None`) one key of `Port.external_ids`.
    pub async fn set_port_external_id(&self, port: &str, key: &str, value: Option<&str>) -> Result<(), OvsdbError> {
        self.mutate_map(Port::TABLE, where_name(port), port, Port::EXTERNAL_IDS, &[key], value.map(|v| (key, v))).await
    }

    /// In one transaction, removes key `old` of `Port.external_ids` and sets `key` to `value`;
    /// a missing port is [`OvsdbError::NotFound`].
    pub async fn replace_port_external_id(&self, port: &str, old: &str, key: &str, value: &str) -> Result<(), OvsdbError> {
        self.mutate_map(Port::TABLE, where_name(port), port, Port::EXTERNAL_IDS, &[old, key], Some((key, value))).await
    }

    /// Every port (of any bridge) whose `external_ids` has `key`, with its value.
    pub async fn ports_with_external_id(&self, key: &str) -> Result<Vec<(String, String)>, OvsdbError> {
        let ports: Vec<Port> = self.select(vec![], &[Port::NAME, Port::EXTERNAL_IDS]).await?;
        let mut out = Vec::new();
        for p in &ports {
            if let Some(v) = p.external_ids()?.get(key) {
                out.push((p.name()?.clone(), v.clone()));
            }
        }
        Ok(out)
    }

    /// `Bridge.external_ids`.
    pub async fn bridge_external_ids(&self, bridge: &str) -> Result<BTreeMap<String, String>, OvsdbError> {
        let found: Vec<Bridge> = self.select(where_name(bridge), &[Bridge::EXTERNAL_IDS]).await?;
        let br = found.first().ok_or_else(|| OvsdbError::NotFound { table: "Bridge", name: bridge.to_string() })?;
        Ok(br.external_ids()?.clone())
    }

    /// Sets one key of `Bridge.external_ids` (e.g. the flow generation).
    pub async fn set_bridge_external_id(&self, bridge: &str, key: &str, value: &str) -> Result<(), OvsdbError> {
        self.mutate_map(Bridge::TABLE, where_name(bridge), bridge, Bridge::EXTERNAL_IDS, &[key], Some((key, value))).await
    }

    /// Removes one key of `Bridge.external_ids`.
    pub async fn remove_bridge_external_id(&self, bridge: &str, key: &str) -> Result<(), OvsdbError> {
        self.mutate_map(Bridge::TABLE, where_name(bridge), bridge, Bridge::EXTERNAL_IDS, &[key], None).await
    }

    /// `Open_vSwitch.other_config`.
    pub async fn other_config(&self) -> Result<BTreeMap<String, String>, OvsdbError> {
        let found: Vec<OpenVswitch> = self.select(vec![], &[OpenVswitch::OTHER_CONFIG]).await?;
        let root = found.first().ok_or_else(|| OvsdbError::NotFound { table: "Open_vSwitch", name: "Open_vSwitch".into() })?;
        Ok(root.other_config()?.clone())
    }

    /// Sets (`Some`) or removes (`None`) a key of `Open_vSwitch.other_config`.
    pub async fn set_other_config(&self, key: &str, value: Option<&str>) -> Result<(), OvsdbError> {
        let set = value.map(|v| (key, v));
        self.mutate_map(OpenVswitch::TABLE, vec![], "Open_vSwitch", OpenVswitch::OTHER_CONFIG, &[key], set).await
    }

    /// Whether `other_config:flow-restore-wait=true` is set: while it is,
    /// ovs-vswitchd keeps the datapath flows it has and does not flush them,
    /// so traffic keeps flowing while the agent re-installs its OpenFlow rules.
    pub async fn flow_restore_wait(&self) -> Result<bool, OvsdbError> {
        Ok(self.other_config().await?.get("flow-restore-wait").map(String::as_str) == Some("true"))
    }

    /// Sets `other_config:flow-restore-wait=true`.
    pub async fn set_flow_restore_wait(&self) -> Result<(), OvsdbError> {
        self.set_other_config("flow-restore-wait", Some("true")).await
    }

    /// Removes `other_config:flow-restore-wait`.
    pub async fn clear_flow_restore_wait(&self) -> Result<(), OvsdbError> {
        self.set_other_config("flow-restore-wait", None).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::fake::Fake;
    use serde_json::json;

    #[tokio::test]
    async fn a_key_is_one_mutate_and_a_missing_row_is_not_found() {
        let fake = Fake::start(|ops| json!([{"count": if ops[0]["where"][0][2] == "br0" { 1 } else { 0 }}]));
        fake.ovs.set_bridge_external_id("br0", "sdn-node-generation", "4").await.unwrap();
        fake.ovs.replace_port_external_id("br0", "old", "new", "v").await.unwrap();
        // This server has no root row (count 0).
        fake.ovs.set_flow_restore_wait().await.unwrap_err();
        assert!(matches!(
            fake.ovs.remove_bridge_external_id("br9", "k").await,
            Err(OvsdbError::NotFound { table: "Bridge", name }) if name == "br9"
        ));
        let t = fake.transactions();
        assert_eq!(
            t[0],
            [json!({"op": "mutate", "table": "Bridge", "where": [["name", "==", "br0"]], "mutations": [
                ["external_ids", "delete", ["set", ["sdn-node-generation"]]],
                ["external_ids", "insert", ["map", [["sdn-node-generation", "4"]]]]]})]
        );
        assert_eq!(
            t[1][0]["mutations"],
            json!([["external_ids", "delete", ["set", ["old", "new"]]], ["external_ids", "insert", ["map", [["new", "v"]]]]])
        );
        assert_eq!(
            t[2],
            [json!({"op": "mutate", "table": "Open_vSwitch", "where": [], "mutations": [
                ["other_config", "delete", ["set", ["flow-restore-wait"]]],
                ["other_config", "insert", ["map", [["flow-restore-wait", "true"]]]]]})]
        );
        assert_eq!(t[3][0]["mutations"], json!([["external_ids", "delete", ["set", ["k"]]]]));
    }

    #[tokio::test]
    async fn reads_of_maps() {
        let fake = Fake::start(|ops| match ops[0]["table"].as_str() {
            Some("Port") => json!([{"rows": [
                {"name": "veth1", "external_ids": ["map", [["sdn-node-pod", "{}"]]]},
                {"name": "tun0", "external_ids": ["map", []]}]}]),
            Some("Open_vSwitch") => json!([{"rows": [{"other_config": ["map", [["flow-restore-wait", "true"]]]}]}]),
            _ => json!([{"rows": []}]),
        });
        assert_eq!(fake.ovs.ports_with_external_id("sdn-node-pod").await.unwrap(), [("veth1".to_string(), "{}".to_string())]);
        assert!(fake.ovs.flow_restore_wait().await.unwrap());
        assert!(matches!(fake.ovs.bridge_external_ids("br0").await, Err(OvsdbError::NotFound { table: "Bridge", .. })));
    }
}
