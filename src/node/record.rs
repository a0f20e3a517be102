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

use serde::{Deserialize, Serialize};

use crate::cluster::{Pod, Problem, EGRESS_ANNOTATION, INGRESS_ANNOTATION};

/// The Port `external_ids` key holding a pod's record: the agent rebuilds its pods from it
/// after a restart (as openshift-sdn recovers pods from the table-20 notes).
pub const POD_KEY: &str = "sdn-node-pod";

/// The record format this agent writes.
pub const VERSION: u32 = 1;

/// A pod set up through the pod API or CNI, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    pub ip: String,
    pub mac: String,
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

/// What the agent created for a CNI pod (a restarted agent can then still DEL and CHECK it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniRecord {
    pub netns: String,
    pub if_name: String,
    /// The address with the subnet's prefix, e.g. 10.128.0.5/23.
    pub address: String,
    pub gateway: String,
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
    /// Validates the record into the model's pod (fields named as in the record).
    pub fn to_pod(&self) -> Result<Pod, Problem> {
        let obj = format!("pod {}/{}", self.namespace, self.name);
        let bw = |key: &str| -> Result<i64, Problem> {
            match self.annotations.get(key) {
                None => Ok(0),
                Some(v) => crate::cluster::quantity::bandwidth(v).map_err(|e| Problem::new(obj.clone(), format!("annotations[{key}]"), e)),
            }
        };
        crate::cluster::validate::pod(crate::cluster::validate::RawPod {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            container_id: self.container_id.clone(),
            host_veth: self.host_veth.clone(),
            ip: self.ip.clone(),
            mac: self.mac.clone(),
            ingress_bps: bw(INGRESS_ANNOTATION)?,
            egress_bps: bw(EGRESS_ANNOTATION)?,
            internal: self.internal,
        })
    }

    /// The JSON stored on the pod's port.
    pub fn to_json(&self) -> String {
        // Strings, numbers and maps of strings always serialize.
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
}
