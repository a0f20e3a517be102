//! The checkpoint's documents: one envelope (`{"version":1,"sha256":…,"state":…}`, the digest
//! being that of `state` exactly as written) around three kinds of state — a pod's file, IPAM's
//! file, and the single `pods.json` earlier agents wrote (read to migrate it) — and the checks
//! every record passes when read. Pure: no I/O.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::Saved;
use crate::cluster::PodKey;
use crate::node::record::PodRecord;
use crate::node::state::IpamCursor;

/// The format this agent writes and reads (the envelope's `version`).
pub const VERSION: u32 = 1;

/// The document as read: every field optional, so that each absence gets its own message.
#[derive(Deserialize)]
struct EnvelopeIn<'a> {
    version: Option<u32>,
    sha256: Option<String>,
    #[serde(borrow)]
    state: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    version: u32,
    sha256: String,
    state: &'a RawValue,
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A document's bytes for `state` (one line).
fn seal(state: &impl Serialize) -> Vec<u8> {
    // Serialising plain strings, numbers and maps cannot fail.
    let state = serde_json::to_string(state).unwrap_or_default();
    let raw = RawValue::from_string(state).unwrap_or_else(|_| RawValue::from_string("{}".into()).unwrap_or_default());
    let env = EnvelopeOut { version: VERSION, sha256: sha256_hex(raw.get().as_bytes()), state: &raw };
    let mut out = serde_json::to_vec(&env).unwrap_or_default();
    out.push(b'\n');
    out
}

/// A document's state, checked (version, digest) and read as `T`; the error says what is wrong
/// (the caller names the file). Fields `T` does not know are ignored, so a newer agent may add
/// some.
fn unseal<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        // An atomic write never leaves an empty file: something else truncated it.
        return Err("the file is empty".into());
    }
    let env: EnvelopeIn = serde_json::from_slice(bytes).map_err(|e| format!("not a checkpoint document: {e}"))?;
    let version = env.version.ok_or("no \"version\" field")?;
    if version != VERSION {
        return Err(if version > VERSION {
            format!("version {version} was written by a newer sdn-node; this one reads version {VERSION}")
        } else {
            format!("version {version} is not a checkpoint version (this agent reads version {VERSION})")
        });
    }
    let state = env.state.ok_or("no \"state\" field")?;
    let want = env.sha256.ok_or("no \"sha256\" field")?;
    let have = sha256_hex(state.get().as_bytes());
    if !want.eq_ignore_ascii_case(&have) {
        return Err(format!(
            "its state does not match its checksum (sha256 {have}, recorded {want}): the file was damaged or edited"
        ));
    }
    let mut de = serde_json::Deserializer::from_str(state.get());
    serde_path_to_error::deserialize(&mut de).map_err(|e| match e.path().to_string().as_str() {
        "." => format!("state: {}", e.inner()),
        path => format!("state.{path}: {}", e.inner()),
    })
}

// ---- pods.json: what agents before the per-pod files wrote --------------------------------

/// `pods.json`'s state: the pods' records and IPAM's position.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    #[serde(default)]
    last_address: Option<Ipv4Addr>,
    pods: Vec<PodRecord>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StateOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    last_address: Option<Ipv4Addr>,
    pods: &'a [PodRecord],
}

/// `pods.json`'s bytes for `saved`, as earlier agents wrote them (tests of the migration).
pub fn encode(saved: &Saved) -> Vec<u8> {
    seal(&StateOut { last_address: saved.ipam.v4, pods: &saved.pods })
}

/// Reads a `pods.json`; the error says what is wrong (the caller names the file).
pub fn decode(bytes: &[u8]) -> Result<Saved, String> {
    let state: State = unseal(bytes)?;
    let labelled: Vec<(String, &PodRecord)> =
        state.pods.iter().enumerate().map(|(i, r)| (format!("state.pods[{i}]"), r)).collect();
    check_each(&labelled)?;
    if let Some(e) = clashes(&labelled).into_iter().next() {
        return Err(e.to_string());
    }
    Ok(Saved { pods: state.pods, ipam: IpamCursor { v4: state.last_address, v6: None } })
}

// ---- one pod's file -------------------------------------------------------------------------

/// A pod's file's state: its record, and the number of the write that made the file (larger is
/// later, across every pod's file: see [`Clash`]).
#[derive(Deserialize)]
struct PodState {
    seq: u64,
    pod: PodRecord,
}

#[derive(Serialize)]
struct PodStateOut<'a> {
    seq: u64,
    pod: &'a PodRecord,
}

pub fn encode_pod(seq: u64, r: &PodRecord) -> Vec<u8> {
    seal(&PodStateOut { seq, pod: r })
}

/// Reads a pod's file named `name`: a valid pod record, which is the pod the name says, with its
/// write number.
pub fn decode_pod(name: &str, bytes: &[u8]) -> Result<(u64, PodRecord), String> {
    let s: PodState = unseal(bytes)?;
    check_each(&[("state.pod".to_string(), &s.pod)])?;
    let key = (s.pod.namespace.clone(), s.pod.name.clone());
    if file_name(&key) != name {
        return Err(format!("it holds pod {}/{}, whose file is {}", key.0, key.1, file_name(&key)));
    }
    Ok((s.seq, s.pod))
}

/// The file of pod `key` in the pods directory: `<namespace>_<name>.json` (a namespace is a
/// DNS-1123 label, so has no `_`; neither starts with `.`, which temporary files do). A name too
/// long for a file name (pod names may have 253 characters) is cut and completed with a digest of
/// the key; a key that is not a valid pod's (only a request may name one, and it has no record)
/// gets a digest alone, so no key ever names a path outside the directory.
pub fn file_name(key: &PodKey) -> String {
    let (ns, name) = (&key.0, &key.1);
    let plain = |s: &str, label: bool| {
        !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (!label && b == b'.'))
            && s.as_bytes()[0].is_ascii_alphanumeric()
    };
    let digest = || sha256_hex(format!("{ns}/{name}").as_bytes());
    if !plain(ns, true) || !plain(name, false) {
        return format!("~{}.json", &digest()[..32]);
    }
    let whole = format!("{ns}_{name}.json");
    if whole.len() <= 255 {
        return whole;
    }
    // 255 bytes: namespace (at most 63), '_', part of the name, '~', 32 hex digits, ".json".
    let keep = 255 - ns.len() - 1 - 1 - 32 - 5;
    format!("{ns}_{}~{}.json", &name[..keep], &digest()[..32])
}

// ---- IPAM's file ----------------------------------------------------------------------------

/// IPAM's file's state: the address of each family handed out last. `lastAddress6` is absent
/// from the files of agents before dual-stack (read as none) and from an IPv4-only node's (so
/// that file is written byte for byte as those agents wrote it, and they read this one's).
#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct IpamState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_address: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_address6: Option<Ipv6Addr>,
}

pub fn encode_ipam(cursor: IpamCursor) -> Vec<u8> {
    seal(&IpamState { last_address: cursor.v4, last_address6: cursor.v6 })
}

pub fn decode_ipam(bytes: &[u8]) -> Result<IpamCursor, String> {
    let s = unseal::<IpamState>(bytes)?;
    Ok(IpamCursor { v4: s.last_address, v6: s.last_address6 })
}

// ---- the checks -----------------------------------------------------------------------------

/// Each record is a valid pod (as a pod API request would be), whose CNI address is its ip.
fn check_each(pods: &[(String, &PodRecord)]) -> Result<(), String> {
    for (label, r) in pods {
        let pod = r.to_pod().map_err(|p| format!("{label} ({}): {}: {}", p.object, p.field, p.message))?;
        if let Some(c) = &r.cni {
            if c.address.addr() != r.ip {
                return Err(format!("{label} (pod {}/{}): cni.address {} is not its ip {}", r.namespace, r.name, c.address, r.ip));
            }
            if c.ipv6.map(|v6| v6.address.addr()) != r.ip6 {
                let have = c.ipv6.map_or("none".to_string(), |v6| v6.address.to_string());
                let want = pod.ip6.map_or("none".to_string(), |a| a.to_string());
                return Err(format!("{label} (pod {}/{}): cni.ipv6.address {have} is not its ip6 {want}", r.namespace, r.name));
            }
        }
    }
    Ok(())
}

/// Two records that share what only one pod may have: the pod, its address, its host interface
/// or its sandbox. Record `later` comes after record `earlier` in the list checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clash {
    pub earlier: usize,
    pub later: usize,
    message: String,
}

impl std::fmt::Display for Clash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The clashes among `pods` (each already checked by [`check_each`]), in list order.
fn clashes(pods: &[(String, &PodRecord)]) -> Vec<Clash> {
    let mut keys = HashMap::new();
    let mut ips = HashMap::new();
    let mut veths = HashMap::new();
    let mut sandboxes = HashMap::new();
    let mut out = Vec::new();
    for (i, (label, r)) in pods.iter().enumerate() {
        let clash = |what: &str, j: usize| Clash {
            earlier: j,
            later: i,
            message: format!("{label} (pod {}/{}): {what} is also {}'s", r.namespace, r.name, pods[j].0),
        };
        if let Some(j) = keys.insert((r.namespace.as_str(), r.name.as_str()), i) {
            out.push(clash("the pod", j));
        }
        if let Some(j) = ips.insert(r.ip, i) {
            out.push(clash(&format!("ip {}", r.ip), j));
        }
        if let Some(j) = r.ip6.and_then(|a| ips.insert(a.into(), i)) {
            out.push(clash(&format!("ip6 {}", r.ip6.map(|a| a.to_string()).unwrap_or_default()), j));
        }
        if let Some(j) = veths.insert(r.host_veth.as_str(), i) {
            out.push(clash(&format!("hostVeth {:?}", r.host_veth), j));
        }
        if let Some(id) = r.cni.as_ref().and_then(|c| c.sandbox) {
            if let Some(j) = sandboxes.insert(id, i) {
                out.push(clash(&format!("sandbox {id:?}"), j));
            }
        }
    }
    out
}

/// A pod's file as read: its name in the pods directory, its write number, its record.
pub type PodFile = (String, u64, PodRecord);

/// A file's name and what is wrong with it (or why it is stale).
pub type Verdict = (String, String);

/// The pods' files as read, checked against each other. A clash between two files is what a
/// crash between two writes can leave: a pod's file is removed after the pod let its address
/// (or its interface name, or its sandbox) go — durably before its DEL is answered, but another
/// pod may be given the address, and its file written, meanwhile. Of two clashing files the one
/// written earlier is then the stale one: it is left out and returned with why, to be removed.
/// Two files of the same write number cannot both be current: refused (the file, and why).
pub fn resolve(mut files: Vec<PodFile>) -> Result<(Vec<PodFile>, Vec<Verdict>), Verdict> {
    let mut stale = Vec::new();
    loop {
        // Oldest first, so that a clash's `later` is the later write.
        files.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        let labelled: Vec<(String, &PodRecord)> = files.iter().map(|(n, _, r)| (format!("pods/{n}"), r)).collect();
        let Some(c) = clashes(&labelled).into_iter().next() else { break };
        if files[c.earlier].1 == files[c.later].1 {
            return Err((files[c.later].0.clone(), format!("{c}, and both were written as write {}", files[c.later].1)));
        }
        let (name, _, _) = files.remove(c.earlier);
        stale.push((name, format!("{c}, written later")));
    }
    Ok((files, stale))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::node::record::{CniRecord, SandboxId};

    pub(crate) fn record(name: &str, ip: &str, veth: &str) -> PodRecord {
        PodRecord {
            version: 1,
            container_id: "ab".repeat(32),
            namespace: "team-a".into(),
            name: name.into(),
            host_veth: veth.into(),
            ip: ip.parse().unwrap(),
            ip6: None,
            mac: netif::MacAddr([0x0a, 0x58, 0x0a, 0x80, 0x00, 0x05]),
            annotations: Default::default(),
            internal: false,
            cni: Some(CniRecord {
                netns: "/var/run/netns/x".into(),
                if_name: "eth0".into(),
                address: format!("{ip}/23").parse().unwrap(),
                gateway: [10, 128, 0, 1].into(),
                ipv6: None,
                mtu: 1450,
                sandbox: Some(SandboxId { dev: 4, ino: 4026532000 + name.bytes().map(u64::from).sum::<u64>() }),
                host_ifindex: Some(17),
            }),
        }
    }

    fn saved() -> Saved {
        Saved {
            pods: vec![record("a1", "10.128.0.5", "vethab12"), record("a2", "10.128.0.6", "vethab13")],
            ipam: IpamCursor { v4: Some("10.128.0.6".parse().unwrap()), v6: None },
        }
    }

    /// The state part of a document, and a document around other state bytes.
    fn state_of(doc: &str) -> &str {
        let start = doc.find("\"state\":").unwrap() + "\"state\":".len();
        &doc[start..doc.rfind('}').unwrap()]
    }

    fn reseal(state: &str) -> String {
        format!("{{\"version\":1,\"sha256\":\"{}\",\"state\":{state}}}", sha256_hex(state.as_bytes()))
    }

    #[test]
    fn what_is_encoded_decodes_to_the_same() {
        let s = saved();
        assert_eq!(decode(&encode(&s)).unwrap(), s);
        assert_eq!(decode(&encode(&Saved::default())).unwrap(), Saved::default());
        let r = record("a1", "10.128.0.5", "vethab12");
        assert_eq!(decode_pod("team-a_a1.json", &encode_pod(7, &r)).unwrap(), (7, r));
        assert_eq!(decode_ipam(&encode_ipam(s.ipam)).unwrap(), s.ipam);
        assert_eq!(decode_ipam(&encode_ipam(IpamCursor::default())).unwrap(), IpamCursor::default());
        let dual = IpamCursor { v6: Some("fd00:10:128:2::9".parse().unwrap()), ..s.ipam };
        assert_eq!(decode_ipam(&encode_ipam(dual)).unwrap(), dual);
    }

    /// IPAM's file of an agent before dual-stack (no `lastAddress6`) loads, and an IPv4-only
    /// node's is written byte for byte as such an agent wrote it; a dual-stack one adds the
    /// IPv6 position.
    #[test]
    fn ipam_json_before_dual_stack_loads_and_ipv4_only_is_written_as_before() {
        let before = reseal(r#"{"lastAddress":"10.128.0.9"}"#);
        let v4 = IpamCursor { v4: Some("10.128.0.9".parse().unwrap()), v6: None };
        assert_eq!(decode_ipam(before.as_bytes()).unwrap(), v4);
        assert_eq!(String::from_utf8(encode_ipam(v4)).unwrap(), format!("{before}\n"));
        let dual = IpamCursor { v6: Some("fd00:10:128:2::9".parse().unwrap()), ..v4 };
        assert_eq!(
            String::from_utf8(encode_ipam(dual)).unwrap(),
            format!("{}\n", reseal(r#"{"lastAddress":"10.128.0.9","lastAddress6":"fd00:10:128:2::9"}"#))
        );
        let e = decode_ipam(reseal(r#"{"lastAddress6":"10.0.0.1"}"#).as_bytes()).unwrap_err();
        assert!(e.starts_with("state.lastAddress6: "), "{e}");
    }

    /// A dual-stack record: its IPv6 address is its CNI interface's, and no two pods share one.
    #[test]
    fn dual_stack_records_are_checked_and_clash_on_ip6() {
        let dual = |name: &str, ip: &str, ip6: &str, veth: &str| {
            let mut r = record(name, ip, veth);
            r.ip6 = Some(ip6.parse().unwrap());
            if let Some(c) = r.cni.as_mut() {
                c.ipv6 = Some(crate::node::record::CniIpv6 {
                    address: format!("{ip6}/64").parse().unwrap(),
                    gateway: "fd00:10:128::1".parse().unwrap(),
                });
            }
            r
        };
        let a = dual("a1", "10.128.0.5", "fd00:10:128::5", "vethab12");
        assert_eq!(decode_pod("team-a_a1.json", &encode_pod(1, &a)).unwrap(), (1, a.clone()));
        let mut off = a.clone();
        off.ip6 = Some("fd00:10:128::6".parse().unwrap());
        let e = decode_pod("team-a_a1.json", &encode_pod(1, &off)).unwrap_err();
        assert!(e.contains("cni.ipv6.address fd00:10:128::5/64 is not its ip6 fd00:10:128::6"), "{e}");
        let b = dual("a2", "10.128.0.6", "fd00:10:128::5", "vethab13");
        let (kept, stale) = resolve(vec![("team-a_a1.json".into(), 1, a), ("team-a_a2.json".into(), 2, b.clone())]).unwrap();
        assert_eq!(kept.into_iter().map(|f| f.2).collect::<Vec<_>>(), vec![b]);
        assert!(stale[0].1.contains("ip6 fd00:10:128::5 is also"), "{stale:?}");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let text = String::from_utf8(encode(&saved())).unwrap();
        // A newer agent's extra fields, in the envelope and in a record (checksummed as written).
        let extended = state_of(&text).replacen("{\"containerID\"", "{\"futureField\":[1,2],\"containerID\"", 1).replacen(
            "{\"lastAddress\"",
            "{\"futureTop\":true,\"lastAddress\"",
            1,
        );
        let doc = reseal(&extended).replacen("{\"version\":1,", "{\"version\":1,\"writer\":\"sdn-node 9\",", 1);
        assert_eq!(decode(doc.as_bytes()).unwrap(), saved());
        let r = record("a1", "10.128.0.5", "vethab12");
        let text = String::from_utf8(encode_pod(3, &r)).unwrap();
        let doc = reseal(&state_of(&text).replacen("{\"seq\"", "{\"futureTop\":1,\"seq\"", 1));
        assert_eq!(decode_pod("team-a_a1.json", doc.as_bytes()).unwrap(), (3, r));
    }

    #[test]
    fn damage_is_refused_with_what_is_wrong() {
        let good = String::from_utf8(encode(&saved())).unwrap();
        let pod = String::from_utf8(encode_pod(1, &record("a1", "10.128.0.5", "vethab12"))).unwrap();
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "empty"),
            ("\n".into(), "empty"),
            (good[..good.len() / 2].to_string(), "not a checkpoint document"),
            ("garbage".into(), "not a checkpoint document"),
            ("[1,2]".into(), "not a checkpoint document"),
            (good.replace("\"version\":1", "\"version\":2"), "newer sdn-node"),
            (good.replace("\"version\":1", "\"version\":0"), "not a checkpoint version"),
            (good.replace("\"version\":1,", ""), "no \"version\""),
            // One digit of an address changed: still valid JSON, caught by the checksum.
            (good.replace("10.128.0.5\"", "10.128.0.7\""), "does not match its checksum"),
        ];
        for (text, want) in cases {
            let e = decode(text.as_bytes()).expect_err(&text);
            assert!(e.contains(want), "{text:?}: {e}");
        }
        for (text, want) in [
            (pod[..pod.len() / 2].to_string(), "not a checkpoint document"),
            (pod.replace("10.128.0.5\"", "10.128.0.7\""), "does not match its checksum"),
            (pod.replace("\"version\":1", "\"version\":2"), "newer sdn-node"),
            (reseal(&state_of(&pod).replace("\"seq\":1,", "")), "state: missing field `seq`"),
        ] {
            let e = decode_pod("team-a_a1.json", text.as_bytes()).expect_err(&text);
            assert!(e.contains(want), "{text:?}: {e}");
        }
        // A file whose name is not its pod's.
        let e = decode_pod("team-a_a2.json", pod.as_bytes()).unwrap_err();
        assert!(e.contains("holds pod team-a/a1, whose file is team-a_a1.json"), "{e}");
    }

    /// Records are checked as pods, and against each other (with the checksum recomputed, as a
    /// buggy writer would have).
    #[test]
    fn invalid_or_clashing_records_are_refused() {
        let reencode = |s: &Saved| String::from_utf8(encode(s)).unwrap();
        let mut s = saved();
        s.pods[1].ip = "10.128.0.5".parse().unwrap();
        s.pods[1].cni.as_mut().unwrap().address = "10.128.0.5/23".parse().unwrap();
        let e = decode(reencode(&s).as_bytes()).unwrap_err();
        assert!(e.contains("state.pods[1] (pod team-a/a2): ip 10.128.0.5 is also state.pods[0]'s"), "{e}");
        // An address that is not one (the checksum recomputed over the bad text).
        let text = reencode(&saved()).replacen("\"ip\":\"10.128.0.5\"", "\"ip\":\"10.128.0.300\"", 1);
        let e = decode(reseal(state_of(&text)).as_bytes()).unwrap_err();
        assert!(e.contains("state.pods[0].ip"), "{e}");
        let mut s = saved();
        s.pods[1].cni.as_mut().unwrap().address = "10.128.0.9/23".parse().unwrap();
        assert!(decode(reencode(&s).as_bytes()).unwrap_err().contains("cni.address"));
        let mut s = saved();
        s.pods[1].name = "a1".into();
        assert!(decode(reencode(&s).as_bytes()).unwrap_err().contains("the pod is also"));
        let mut s = saved();
        s.pods[1].host_veth = "vethab12".into();
        assert!(decode(reencode(&s).as_bytes()).unwrap_err().contains("hostVeth"));
        // Two pods in one sandbox: never written (one pod per sandbox).
        let mut s = saved();
        s.pods[1].cni.as_mut().unwrap().sandbox = s.pods[0].cni.as_ref().unwrap().sandbox;
        assert!(decode(reencode(&s).as_bytes()).unwrap_err().contains("sandbox"));
        // A type error names its field.
        let text = reencode(&saved()).replace("\"mtu\":1450", "\"mtu\":\"big\"");
        let doc = reseal(state_of(&text));
        let e = decode(doc.as_bytes()).unwrap_err();
        assert!(e.contains("state.pods[0].cni.mtu"), "{e}");
        // A pod's file too.
        let mut r = record("a1", "10.128.0.5", "vethab12");
        r.cni.as_mut().unwrap().address = "10.128.0.9/23".parse().unwrap();
        let e = decode_pod("team-a_a1.json", &encode_pod(1, &r)).unwrap_err();
        assert!(e.contains("state.pod (pod team-a/a1): cni.address"), "{e}");
    }

    /// Of two files that claim one address, the earlier write is stale (left out, to be
    /// removed); the same write number twice is refused.
    #[test]
    fn a_clash_between_files_keeps_the_later_write() {
        let a = record("a1", "10.128.0.5", "vethab12");
        let mut b = record("b1", "10.128.0.5", "vethcd34");
        b.cni.as_mut().unwrap().address = "10.128.0.5/23".parse().unwrap();
        let c = record("c1", "10.128.0.7", "vethef56");
        let files = vec![("team-a_b1.json".into(), 9, b.clone()), ("team-a_a1.json".into(), 4, a.clone()), ("team-a_c1.json".into(), 1, c.clone())];
        let (kept, stale) = resolve(files).unwrap();
        assert_eq!(kept, vec![("team-a_c1.json".into(), 1, c), ("team-a_b1.json".into(), 9, b.clone())]);
        assert_eq!(stale.len(), 1);
        assert_eq!(stale[0].0, "team-a_a1.json");
        assert!(stale[0].1.contains("pods/team-a_b1.json (pod team-a/b1): ip 10.128.0.5 is also pods/team-a_a1.json's"), "{stale:?}");
        let (name, why) = resolve(vec![("team-a_a1.json".into(), 4, a), ("team-a_b1.json".into(), 4, b)]).unwrap_err();
        assert_eq!(name, "team-a_b1.json");
        assert!(why.contains("both were written as write 4"), "{why}");
    }

    #[test]
    fn file_names_stay_in_the_directory() {
        let k = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(file_name(&k("team-a", "web-1.x")), "team-a_web-1.x.json");
        for bad in [k("", ""), k("..", "x"), k("a", "../../etc/passwd"), k("a", ".hidden"), k("A", "b"), k("a_b", "c")] {
            let n = file_name(&bad);
            assert!(n.starts_with('~') && n.ends_with(".json") && n.len() == 38 && !n.contains('/'), "{bad:?}: {n}");
        }
        let long = k(&"n".repeat(63), &"p".repeat(253));
        let n = file_name(&long);
        assert_eq!(n.len(), 255, "{n}");
        assert!(n.starts_with(&format!("{}_ppp", "n".repeat(63))) && n.contains('~'));
        let mut other = long.clone();
        other.1.replace_range(252.., "q");
        assert_ne!(file_name(&other), n, "two long names that share their start get two files");
    }
}
