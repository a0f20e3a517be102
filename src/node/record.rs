//! A pod's stored record: what the agent writes next to a pod it set up — on the pod's OVS
//! port (`external_ids:sdn-node-pod`) and in the checkpoint — and what a restarted agent
//! rebuilds the pod from.
//!
//! A record is data some agent version wrote, not a request: it is read tolerantly (a field
//! a newer agent added is ignored, one an older agent did not write takes its default) and
//! carries a format version. Version 1 is written without the field, byte for byte as agents
//! before the field wrote it, so an older agent still reads what this one writes as long as
//! the record uses nothing it lacks. The pod API's request body (`PodRequest`, in the api module) is
//! a different type: strict, and without the parts only the agent may set.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};
use netif::MacAddr;
use serde::{Deserialize, Deserializer, Serialize};

use crate::cluster::{Pod, Problem, EGRESS_ANNOTATION, INGRESS_ANNOTATION};

/// The Port `external_ids` key holding a pod's record: the agent rebuilds its pods from it
/// after a restart (as openshift-sdn recovers pods from the table-20 notes).
pub const POD_KEY: &str = "sdn-node-pod";

/// The record format this agent writes.
pub const VERSION: u32 = 1;

/// A pod set up through the pod API or CNI, as stored. Its addresses are typed, in their text
/// form in JSON: written exactly as before they were typed (an address as `Display` writes it,
/// which is how the agent always wrote it), so a stored record loads and is written back the
/// same; a malformed one is refused with its field's path (`cni.gateway`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    /// The record's format; absent means 1.
    #[serde(default = "version_one", skip_serializing_if = "is_version_one")]
    pub version: u32,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub namespace: String,
    pub name: String,
    pub host_veth: String,
    /// The pod's first address: its IPv4 one, or its only (IPv6) one on an IPv6-only node.
    pub ip: IpAddr,
    /// A dual-stack pod's IPv6 address. Absent for a single-stack pod, whose record is then
    /// written byte for byte as before the field existed (and an older agent, which ignores
    /// the field, reads a dual-stack record as the IPv4 pod it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<Ipv6Addr>,
    /// Written canonically (`0a:58:0a:80:00:05`); read in the grammar the pod API has always
    /// taken (`0a:58:a:80:0:5`), which records it stored before the MAC was typed may hold.
    #[serde(deserialize_with = "lenient_mac")]
    pub mac: MacAddr,
    /// The pod's annotations; the bandwidth ones are used.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// An OVS internal port named `hostVeth` rather than an existing device (demos, tests).
    #[serde(default)]
    pub internal: bool,
    /// Set up through CNI: the agent made the pod's interface (and deletes it on DEL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniRecord>,
}

fn version_one() -> u32 {
    VERSION
}

fn is_version_one(v: &u32) -> bool {
    *v == 1
}

fn lenient_mac<'de, D: Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
    let s = String::deserialize(d)?;
    MacAddr::parse_lenient(&s).map_err(serde::de::Error::custom)
}

/// What the agent created for a CNI pod (a restarted agent can then still DEL and CHECK it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniRecord {
    pub netns: String,
    pub if_name: String,
    /// The address with the subnet's prefix, e.g. 10.128.0.5/23 (the host part kept).
    pub address: IpNet,
    pub gateway: IpAddr,
    /// A dual-stack pod's IPv6 address and gateway (absent: IPv4 only, and not written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<CniIpv6>,
    pub mtu: u32,
    /// The sandbox's identity when the pod was set up (its nsfs device and inode): one pod per
    /// sandbox, whatever path names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxId>,
    /// The host end's ifindex when the agent made it: what a DEL or teardown deletes, never
    /// another interface that has (or got) the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ifindex: Option<u32>,
}

/// The IPv6 side of a CNI pod's interface, as the ADD's reply and a CHECK need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniIpv6 {
    /// The address with the IPv6 subnet's prefix, e.g. fd00:10:128:2::5/64.
    pub address: Ipv6Net,
    /// The IPv6 gateway ([`crate::pipeline::gateway6`] of the node's IPv6 subnet).
    pub gateway: Ipv6Addr,
}

/// A network namespace's identity (see [`hostnet::NsId`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SandboxId {
    pub dev: u64,
    pub ino: u64,
}

impl From<hostnet::NsId> for SandboxId {
    fn from(id: hostnet::NsId) -> SandboxId {
        SandboxId { dev: id.dev, ino: id.ino }
    }
}


impl PodRecord {
    /// Validates the record into the model's pod (fields named as in the record), with the
    /// rules every pod passes ([`crate::cluster::validate::typed_pod`]); its addresses are
    /// typed already.
    pub fn to_pod(&self) -> Result<Pod, Problem> {
        let (ingress_bps, egress_bps) = bandwidth(&self.namespace, &self.name, &self.annotations)?;
        let Some(crate::domain::PodIps { v4: ip, v6: ip6 }) = crate::domain::PodIps::from_first_and_second(self.ip, self.ip6) else {
            let obj = format!("pod {}/{}", self.namespace, self.name);
            return Err(Problem::new(obj, "ip6", format!("a second IPv6 address beside ip {}: ip6 is a dual-stack pod's, whose ip is IPv4", self.ip)));
        };
        crate::cluster::validate::typed_pod(crate::cluster::validate::TypedPod {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            container_id: self.container_id.clone(),
            host_veth: self.host_veth.clone(),
            ip,
            ip6,
            mac: self.mac,
            ingress_bps,
            egress_bps,
            internal: self.internal,
        })
    }

    /// The JSON stored on the pod's port.
    pub fn to_json(&self) -> String {
        // Strings, numbers, maps of strings and addresses (as their text) always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a stored record; the error says which field is wrong.
    pub fn from_json(json: &str) -> Result<PodRecord, String> {
        let mut de = serde_json::Deserializer::from_str(json);
        let r: PodRecord = serde_path_to_error::deserialize(&mut de).map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
        if r.version > VERSION {
            return Err(format!("version {} was written by a newer sdn-node; this one reads version {VERSION}", r.version));
        }
        Ok(r)
    }
}

/// A pod's bandwidth limits (ingress, egress; 0: none) from its annotations; a bad value is
/// named by its annotation.
pub fn bandwidth(namespace: &str, name: &str, annotations: &BTreeMap<String, String>) -> Result<(i64, i64), Problem> {
    let bw = |key: &str| -> Result<i64, Problem> {
        match annotations.get(key) {
            None => Ok(0),
            Some(v) => crate::cluster::quantity::bandwidth(v)
                .map_err(|e| Problem::new(format!("pod {namespace}/{name}"), format!("annotations[{key}]"), e)),
        }
    };
    Ok((bw(INGRESS_ANNOTATION)?, bw(EGRESS_ANNOTATION)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CNI pod's record exactly as the agent wrote it before records had a version (and
    /// before sandbox and hostIfindex existed).
    const OLDER: &str = r#"{"containerID":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","namespace":"ns","name":"p","hostVeth":"vethaaaaaaaaaaa","ip":"10.128.0.5","mac":"0a:58:0a:80:00:05","annotations":{},"internal":false,"cni":{"netns":"/var/run/netns/x","ifName":"eth0","address":"10.128.0.5/23","gateway":"10.128.0.1","mtu":1450}}"#;

    #[test]
    fn an_older_record_still_loads_and_is_written_back_the_same() {
        let r = PodRecord::from_json(OLDER).unwrap();
        assert_eq!(r.version, 1);
        assert_eq!(r.cni.as_ref().map(|c| c.mtu), Some(1450));
        assert!(r.to_pod().is_ok());
        assert_eq!(r.to_json(), OLDER, "version 1 is written as before");
    }

    #[test]
    fn unknown_fields_are_ignored_and_a_newer_version_refused() {
        let newer = OLDER.replacen('{', r#"{"later":{"x":1},"#, 1);
        assert_eq!(PodRecord::from_json(&newer).unwrap(), PodRecord::from_json(OLDER).unwrap());
        let v2 = OLDER.replacen('{', r#"{"version":2,"#, 1);
        assert!(PodRecord::from_json(&v2).unwrap_err().contains("newer sdn-node"));
        let e = PodRecord::from_json(&OLDER.replace(r#""mtu":1450"#, r#""mtu":"x""#)).unwrap_err();
        assert!(e.contains("cni.mtu"), "{e}");
    }

    /// The addresses are typed: what is read is the typed value, a malformed one is refused
    /// naming its field.
    #[test]
    fn addresses_are_typed_and_a_bad_one_is_named() {
        let r = PodRecord::from_json(OLDER).unwrap();
        let cni = r.cni.as_ref().unwrap();
        assert_eq!(r.ip, IpAddr::from([10, 128, 0, 5]));
        assert_eq!(r.mac, MacAddr([0x0a, 0x58, 0x0a, 0x80, 0x00, 0x05]));
        assert_eq!((cni.address.addr(), cni.address.prefix_len()), (r.ip, 23));
        assert_eq!(cni.gateway, IpAddr::from([10, 128, 0, 1]));
        for (from, to, field) in [
            (r#""ip":"10.128.0.5""#, r#""ip":"10.128.0.300""#, "ip"),
            (r#""ip":"10.128.0.5""#, r#""ip":5"#, "ip"),
            (r#""mac":"0a:58:0a:80:00:05""#, r#""mac":"0a:58""#, "mac"),
            (r#""address":"10.128.0.5/23""#, r#""address":"10.128.0.5""#, "cni.address"),
            (r#""gateway":"10.128.0.1""#, r#""gateway":"""#, "cni.gateway"),
        ] {
            let e = PodRecord::from_json(&OLDER.replace(from, to)).unwrap_err();
            assert!(e.starts_with(&format!("{field}: ")), "{to}: {e}");
        }
    }

    /// A MAC the pod API took in its lenient grammar (and an older agent stored as given) still
    /// loads; it is written back canonically, which every agent reads.
    #[test]
    fn a_lenient_mac_loads_and_is_written_canonically() {
        let lenient = OLDER.replace("0a:58:0a:80:00:05", "0a:58:a:80:0:5");
        let r = PodRecord::from_json(&lenient).unwrap();
        assert_eq!(r, PodRecord::from_json(OLDER).unwrap());
        assert_eq!(r.to_json(), OLDER);
    }

    /// An IPv6-only pod's record: its one address in `ip`, no `ip6`; the pod has that IPv6
    /// address and no IPv4 one. A second IPv6 address beside an IPv6 `ip` is refused by field.
    #[test]
    fn an_ipv6_only_record_gives_an_ipv6_only_pod() {
        let v6 = OLDER.replace(r#""ip":"10.128.0.5""#, r#""ip":"fd00::5""#).replace("10.128.0.5/23", "fd00::5/64").replace("10.128.0.1", "fd00::1");
        let r = PodRecord::from_json(&v6).unwrap();
        assert_eq!(r.to_json(), v6);
        let p = r.to_pod().unwrap();
        assert_eq!((p.ip, p.ip6), (None, Some("fd00::5".parse().unwrap())));
        let both6 = v6.replace(r#""ip":"fd00::5","#, r#""ip":"fd00::5","ip6":"fd00::6","#);
        let e = PodRecord::from_json(&both6).unwrap().to_pod().unwrap_err();
        assert_eq!(e.field, "ip6", "{e}");
    }

    /// A dual-stack record: its IPv6 parts are typed, go to the pod, and are written back the
    /// same; an IPv4-only record has neither field (the byte-for-byte test above).
    #[test]
    fn a_dual_stack_record_round_trips_and_its_pod_has_ip6() {
        let dual = OLDER
            .replace(r#""ip":"10.128.0.5","#, r#""ip":"10.128.0.5","ip6":"fd00:10:128::5","#)
            .replace(r#""gateway":"10.128.0.1","#, r#""gateway":"10.128.0.1","ipv6":{"address":"fd00:10:128::5/64","gateway":"fd00:10:128::1"},"#);
        let r = PodRecord::from_json(&dual).unwrap();
        assert_eq!(r.ip6, Some("fd00:10:128::5".parse().unwrap()));
        let v6 = r.cni.as_ref().and_then(|c| c.ipv6).unwrap();
        assert_eq!((v6.address.to_string(), v6.gateway.to_string()), ("fd00:10:128::5/64".into(), "fd00:10:128::1".into()));
        assert_eq!(r.to_json(), dual);
        assert_eq!(r.to_pod().unwrap().ip6, r.ip6);
        let e = PodRecord::from_json(&dual.replace(r#""ip6":"fd00:10:128::5""#, r#""ip6":"10.0.0.1""#)).unwrap_err();
        assert!(e.starts_with("ip6: "), "{e}");
        let e = PodRecord::from_json(&dual.replace("fd00:10:128::5/64", "fd00:10:128::5")).unwrap_err();
        assert!(e.starts_with("cni.ipv6.address: "), "{e}");
    }
}
