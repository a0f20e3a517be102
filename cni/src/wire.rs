//! The plugin ⇄ agent contract, written once and used by both sides: the body of
//! `POST /v1/cni` ([`Request`]) and the agent's ADD answer ([`AddReply`]).
//!
//! The agent deserializes [`Request`] and serializes [`AddReply`]; the plugin does the
//! reverse. Both types are tolerant readers where the other side may be another version: a
//! field a newer peer adds is ignored, a field an older peer leaves out takes its default. What
//! the plugin must not trust (the agent's addresses, names, MTU) it checks after reading, in
//! [`crate::result`], so that a bad answer is named by its field.

use serde::{Deserialize, Serialize};

/// The JSON body of `POST /v1/cni`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    /// `ADD`, `DEL` or `CHECK`.
    pub command: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Empty on DEL when the runtime no longer has the namespace.
    #[serde(default)]
    pub netns: String,
    pub if_name: String,
    /// The pod's namespace and name (CNI_ARGS); may be empty on DEL.
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    /// Defaults to `containerID` (the plugin fills it in).
    #[serde(default, rename = "infraContainerID")]
    pub infra_container_id: String,
    #[serde(default)]
    pub cni_version: String,
}

/// A route the pod gets: `dst` through `gw`, or on-link without one.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Route {
    /// Required; optional here only so that its absence is reported by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// The agent's answer to ADD, from which the plugin prints the CNI result. Fields the plugin
/// requires (`hostVeth`, `mac`, `ip`) are still `Option`s so that a missing one is reported
/// as "missing" under its name rather than as a deserialization error.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AddReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_veth: Option<String>,
    /// The pod's interface; must be what the runtime asked for (absent: taken to be).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The sandbox's path (absent: the requested one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The pod's address with the subnet's prefix, e.g. `10.128.0.5/23`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// `null` reads as none.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl AddReply {
    /// Reads an answer; the error names the field (`mtu`, `routes[0].gw`, or `(body)`).
    pub fn from_slice(body: &[u8]) -> Result<AddReply, (String, String)> {
        // serde would also take a struct from a JSON array, field by field.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(("(body)".into(), "not a JSON object".into()));
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let r: AddReply = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path.is_empty() || path == "." || path == "?" { "(body)".to_string() } else { path };
            (path, e.into_inner().to_string())
        })?;
        de.end().map_err(|e| ("(body)".to_string(), e.to_string()))?;
        Ok(r)
    }
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Route>, D::Error> {
    Ok(Option::<Vec<Route>>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_and_defaults() {
        let r = Request {
            command: "ADD".into(),
            container_id: "c".repeat(64),
            netns: "/var/run/netns/x".into(),
            if_name: "eth0".into(),
            namespace: "ns".into(),
            name: "p".into(),
            infra_container_id: "c".repeat(64),
            cni_version: "1.0.0".into(),
        };
        let j = serde_json::to_string(&r).unwrap();
        assert!(j.contains("\"containerID\"") && j.contains("\"ifName\"") && j.contains("\"infraContainerID\""), "{j}");
        assert_eq!(serde_json::from_str::<Request>(&j).unwrap(), r);
        // A DEL without CNI_ARGS or netns, from an older plugin, with a field a newer one adds.
        let del: Request = serde_json::from_str(r#"{"command":"DEL","containerID":"c","ifName":"eth0","later":1}"#).unwrap();
        assert_eq!((del.netns.as_str(), del.namespace.as_str(), del.cni_version.as_str()), ("", "", ""));
    }

    #[test]
    fn reply_round_trips() {
        let r = AddReply {
            host_veth: Some("veth1".into()),
            if_name: Some("eth0".into()),
            mac: Some("0a:58:0a:80:00:05".into()),
            sandbox: Some("/ns".into()),
            ip: Some("10.128.0.5/23".into()),
            gateway: Some("10.128.0.1".into()),
            routes: vec![
                Route { dst: Some("0.0.0.0/0".into()), gw: Some("10.128.0.1".into()) },
                Route { dst: Some("10.128.0.0/14".into()), gw: None },
            ],
            mtu: Some(1450),
        };
        let j = serde_json::to_vec(&r).unwrap();
        assert_eq!(AddReply::from_slice(&j).unwrap(), r);
        let nulls = AddReply::from_slice(br#"{"routes":null,"mtu":null,"mac":null,"newer":[1]}"#).unwrap();
        assert_eq!(nulls, AddReply::default());
    }

    #[test]
    fn reply_errors_name_the_field() {
        for (body, path) in [
            ("[]", "(body)"),
            ("{", "(body)"),
            (r#"{"mac":7}"#, "mac"),
            (r#"{"mtu":-1}"#, "mtu"),
            (r#"{"routes":[{"dst":"0.0.0.0/0","gw":3}]}"#, "routes[0].gw"),
            (r#"{} {}"#, "(body)"),
            (r#"{"routes":{}}"#, "routes"),
        ] {
            let (p, _) = AddReply::from_slice(body.as_bytes()).unwrap_err();
            assert_eq!(p, path, "{body}");
        }
    }
}
