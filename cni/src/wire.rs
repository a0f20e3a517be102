//! The plugin ⇄ agent contract, written once and used by both sides: the body of
//! `POST /v1/cni` ([`Request`]) and the agent's ADD answer ([`AddReply`]).
//!
//! The agent deserializes [`Request`] and serializes [`AddReply`]; the plugin does the
//! reverse. Both types are tolerant readers where the other side may be another version: a
//! field a newer peer adds is ignored, a field an older peer leaves out takes its default. The
//! answer's addresses and MAC are typed as they are read (a malformed one fails with its path);
//! what else the plugin must not trust (presence, names, families, MTU) it checks after
//! reading, in [`crate::result`]: a bad answer is named by its field either way.

use std::net::IpAddr;
use std::str::FromStr;

pub use ipnet::IpNet;
pub use netif::MacAddr;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

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
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "text")]
    pub dst: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "text")]
    pub gw: Option<IpAddr>,
}

/// One of the pod's addresses (CNI's own shape of an `ips` entry, without its interface index:
/// the pod's interface is the only one addressed).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct IpConfig {
    /// The address with the subnet's prefix, e.g. `10.128.0.5/23` (host bits kept). Required;
    /// optional here only so that its absence is reported by name.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "text")]
    pub address: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "text")]
    pub gateway: Option<IpAddr>,
}

/// The agent's answer to ADD, from which the plugin prints the CNI result. Fields the plugin
/// requires (`hostVeth`, `mac`, an address) are still `Option`s so that a missing one is
/// reported as "missing" under its name rather than as a deserialization error; a present one
/// is typed, so a malformed value fails with its path (`mac`, `ips[1].gateway`, `routes[0].dst`).
///
/// The addresses are `ips`, one per family. Agents before `ips` wrote the one (IPv4) address as
/// `ip` and `gateway`, and plugins of that time read only those: the agent writes both (`ip`
/// and `gateway` copy `ips[0]`, see [`AddReply::with_ips`]), and the plugin reads `ips`, or
/// `ip`/`gateway` when `ips` is absent (see `crate::result`). Either side may so be updated
/// first.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AddReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_veth: Option<String>,
    /// The pod's interface; must be what the runtime asked for (absent: taken to be).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "text")]
    pub mac: Option<MacAddr>,
    /// The sandbox's path (absent: the requested one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The pod's addresses. `null` reads as none.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "null_as_empty")]
    pub ips: Vec<IpConfig>,
    /// `ips[0].address`, for plugins older than `ips`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "text")]
    pub ip: Option<IpNet>,
    /// `ips[0].gateway`, for plugins older than `ips`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "text")]
    pub gateway: Option<IpAddr>,
    /// `null` reads as none.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl AddReply {
    /// Sets the pod's addresses, and `ip`/`gateway` to the first of them (what plugins older
    /// than `ips` read).
    pub fn with_ips(mut self, ips: Vec<IpConfig>) -> AddReply {
        let first = ips.first().cloned().unwrap_or_default();
        (self.ip, self.gateway, self.ips) = (first.address, first.gateway, ips);
        self
    }

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

fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// A value in its text form (an address, a MAC): `null` and `""` are none (the agent's older
/// versions sent absent values as empty strings); anything else must parse, and the error
/// quotes it and says what it is not.
fn text<'de, D: Deserializer<'de>, T: Text>(d: D) -> Result<Option<T>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => s.parse().map(Some).map_err(|_| D::Error::custom(format!("{s:?} is not {}", T::WHAT))),
    }
}

/// A type the answer carries as text.
trait Text: FromStr {
    const WHAT: &'static str;
}

impl Text for IpNet {
    const WHAT: &'static str = "ADDRESS/PREFIX (an IP address and its prefix length)";
}

impl Text for IpAddr {
    const WHAT: &'static str = "an IP address";
}

impl Text for MacAddr {
    const WHAT: &'static str = "a MAC address (xx:xx:xx:xx:xx:xx)";
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

    fn net(s: &str) -> Option<IpNet> {
        Some(s.parse().unwrap())
    }

    fn addr(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    fn reply() -> AddReply {
        AddReply {
            host_veth: Some("veth1".into()),
            if_name: Some("eth0".into()),
            mac: Some("0a:58:0a:80:00:05".parse().unwrap()),
            sandbox: Some("/ns".into()),
            routes: vec![
                Route { dst: net("0.0.0.0/0"), gw: addr("10.128.0.1") },
                Route { dst: net("10.128.0.0/14"), gw: None },
            ],
            mtu: Some(1450),
            ..Default::default()
        }
        .with_ips(vec![
            IpConfig { address: net("10.128.0.5/23"), gateway: addr("10.128.0.1") },
            IpConfig { address: net("fd00:10:128::5/64"), gateway: addr("fd00:10:128::1") },
        ])
    }

    #[test]
    fn reply_round_trips() {
        let r = reply();
        assert_eq!((r.ip, r.gateway), (net("10.128.0.5/23"), addr("10.128.0.1")), "ip/gateway copy ips[0]");
        let j = serde_json::to_vec(&r).unwrap();
        assert_eq!(AddReply::from_slice(&j).unwrap(), r);
        let nulls = AddReply::from_slice(br#"{"routes":null,"ips":null,"mtu":null,"mac":null,"gateway":"","newer":[1]}"#).unwrap();
        assert_eq!(nulls, AddReply::default());
    }

    /// What an agent before `ips` answered (and what a plugin of that time reads from a newer
    /// agent: `ip`, `gateway` and the rest as they were).
    #[test]
    fn the_reply_before_ips_is_still_written_and_read() {
        const BEFORE: &str = r#"{"hostVeth":"veth1","ifName":"eth0","mac":"0a:58:0a:80:00:05","sandbox":"/ns","ip":"10.128.0.5/23","gateway":"10.128.0.1","routes":[{"dst":"0.0.0.0/0","gw":"10.128.0.1"},{"dst":"10.128.0.0/14"}],"mtu":1450}"#;
        let old = AddReply::from_slice(BEFORE.as_bytes()).unwrap();
        assert!(old.ips.is_empty());
        assert_eq!((old.ip, old.gateway), (net("10.128.0.5/23"), addr("10.128.0.1")));
        let r = reply();
        let first = r.ips[..1].to_vec();
        let one = r.with_ips(first);
        let written: serde_json::Value = serde_json::to_value(&one).unwrap();
        let mut before: serde_json::Value = serde_json::from_str(BEFORE).unwrap();
        before["ips"] = serde_json::json!([{"address": "10.128.0.5/23", "gateway": "10.128.0.1"}]);
        assert_eq!(written, before, "the fields of before, unchanged, and ips");
    }

    #[test]
    fn reply_errors_name_the_field() {
        for (body, path) in [
            ("[]", "(body)"),
            ("{", "(body)"),
            (r#"{"mac":7}"#, "mac"),
            (r#"{"mac":"0a:58:a:80:0:5"}"#, "mac"),
            (r#"{"mtu":-1}"#, "mtu"),
            (r#"{"ip":"10.0.0.1"}"#, "ip"),
            (r#"{"gateway":"10.0.0.1/24"}"#, "gateway"),
            (r#"{"ips":[{"address":"10.0.0.1/24"},{"address":"10.0.0.2/24","gateway":"x"}]}"#, "ips[1].gateway"),
            (r#"{"ips":[{"address":"10.0.0.1/33"}]}"#, "ips[0].address"),
            (r#"{"routes":[{"dst":"0.0.0.0/0","gw":3}]}"#, "routes[0].gw"),
            (r#"{"routes":[{"dst":"0.0.0.0"}]}"#, "routes[0].dst"),
            (r#"{} {}"#, "(body)"),
            (r#"{"routes":{}}"#, "routes"),
        ] {
            let (p, m) = AddReply::from_slice(body.as_bytes()).unwrap_err();
            assert_eq!(p, path, "{body}: {m}");
        }
        let (_, m) = AddReply::from_slice(br#"{"ips":[{"address":"10.0.0.1"}]}"#).unwrap_err();
        assert!(m.starts_with(r#""10.0.0.1" is not ADDRESS/PREFIX (an IP address and its prefix length)"#), "{m}");
    }
}
