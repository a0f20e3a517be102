//! The agent's own durable record of its pods: a checkpoint file under `--state-dir`, kept
//! beside the records on the pods' OVS ports (`external_ids`), so that a pod outlives the loss
//! of the Open vSwitch database (a reinstall, a corrupted `conf.db`). Without it a restarted
//! agent would know no pod whose port record went with the database: their sandboxes would
//! stay dark, and their addresses would be handed out again while those sandboxes hold them.
//!
//! The file (`pods.json`) is one JSON document:
//!
//! ```text
//! {"version":1,"sha256":"<hex of the bytes of state>","state":{"lastAddress":"10.128.0.9","pods":[...]}}
//! ```
//!
//! - `version` says how to read `state`; a version this agent does not know is refused (never
//!   guessed at). Fields it does not know are ignored, so a newer agent may add some.
//! - `sha256` is the digest of `state` exactly as written: a damaged file (a flipped digit of an
//!   address would otherwise pass as valid JSON and free a live pod's address) is refused.
//! - `state.pods` are the agent's pod records (those set up and those whose teardown is not
//!   confirmed yet: both still hold their address), `state.lastAddress` IPAM's position (the
//!   next search starts after it, so a just-released address is not handed out again at once,
//!   across restarts too).
//!
//! Written atomically (a temporary file in the same directory, fsync, rename over the old one,
//! fsync of the directory): the file is always one complete snapshot, old or new, never a mix.
//! Writes are serialised, each snapshot taken after the previous write's: the file always
//! reflects a prefix of the changes made (CNI ADDs are answered only once a snapshot holding
//! them is on disk, DELs once one without them is). A checkpoint that cannot be read is an
//! error naming the file and what is wrong, and the agent refuses to start on it (see
//! [`CheckpointError::Corrupt`]): never a panic, never a silent reset to "no pods".

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use super::Pods;
use crate::node::record::PodRecord;
use super::PodError;
use crate::cluster::PodKey;


/// The checkpoint's file name in the state directory.
pub const FILE: &str = "pods.json";
/// The lock file: one agent per state directory.
pub const LOCK: &str = "lock";
/// The format this agent writes and reads.
pub const VERSION: u32 = 1;
/// Temporary files of unfinished writes start with this (removed at start).
const TMP_PREFIX: &str = ".pods.json.";
/// The longest one write may take (fsyncs included) before the request waiting for it fails.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the checkpoint holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    pub pods: Vec<PodRecord>,
    /// IPAM's position: the address handed out last.
    pub last_address: Option<Ipv4Addr>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file exists but cannot be used. The agent does not start on it: starting without
    /// its pods could hand their addresses to new pods while their sandboxes still hold them,
    /// and tearing anything down on a guess is worse.
    #[error(
        "checkpoint {path} is corrupt: {what}. The agent will not serve pods without it (their addresses could be \
         handed out again while live sandboxes hold them) and has changed nothing; restore the file, or move it aside \
         to start from the records in OVSDB alone"
    )]
    Corrupt { path: PathBuf, what: String },
    #[error("checkpoint: cannot {op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    #[error("checkpoint: {path} is locked by another sdn-node (one agent per state directory)")]
    Locked { path: PathBuf },
    #[error("checkpoint {path}: writing took longer than {after:?}")]
    Timeout { path: PathBuf, after: Duration },
    /// A write before the pods were recovered from the file (it would erase them).
    #[error("checkpoint {path}: the pods it records are not recovered yet")]
    NotRecovered { path: PathBuf },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io { op, path: path.to_path_buf(), source }
}

// ---- the format ---------------------------------------------------------------------------

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

/// The checkpoint's state: the pods' records ([`PodRecord`], read as tolerantly as on a
/// port) and IPAM's position.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    #[serde(default)]
    last_address: Option<Ipv4Addr>,
    pods: Vec<PodRecord>,
}

/// [`State`] as written, borrowing the records.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StateOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    last_address: Option<Ipv4Addr>,
    pods: &'a [PodRecord],
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The file's bytes for `saved` (pods in the order given).
pub fn encode(saved: &Saved) -> Vec<u8> {
    let state = StateOut { last_address: saved.last_address, pods: &saved.pods };
    // Serialising plain strings, numbers and maps cannot fail.
    let state = serde_json::to_string(&state).unwrap_or_default();
    let raw = RawValue::from_string(state).unwrap_or_else(|_| RawValue::from_string("{}".into()).unwrap_or_default());
    let env = EnvelopeOut { version: VERSION, sha256: sha256_hex(raw.get().as_bytes()), state: &raw };
    let mut out = serde_json::to_vec(&env).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Reads a checkpoint's bytes; the error says what is wrong (the caller names the file).
pub fn decode(bytes: &[u8]) -> Result<Saved, String> {
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
    let state: State =
        serde_path_to_error::deserialize(&mut de).map_err(|e| format!("state.{}: {}", e.path(), e.inner()))?;
    let pods = state.pods;
    validate(&pods)?;
    Ok(Saved { pods, last_address: state.last_address })
}

/// Each record is a valid pod (as a pod API request would be), and no two share a pod, an
/// address or a host interface: the agent never writes such a file.
fn validate(pods: &[PodRecord]) -> Result<(), String> {
    let mut keys = HashMap::new();
    let mut ips = HashMap::new();
    let mut veths = HashMap::new();
    let mut sandboxes = HashMap::new();
    for (i, r) in pods.iter().enumerate() {
        let pod = r.to_pod().map_err(|p| format!("state.pods[{i}] ({}): {}: {}", p.object, p.field, p.message))?;
        if let Some(c) = &r.cni {
            if c.address.addr() != r.ip {
                return Err(format!(
                    "state.pods[{i}] (pod {}/{}): cni.address {} is not its ip {}",
                    r.namespace, r.name, c.address, r.ip
                ));
            }
        }
        let twice = |what: &str, j: usize| {
            format!("state.pods[{i}] (pod {}/{}): {what} is also state.pods[{j}]'s", r.namespace, r.name)
        };
        if let Some(j) = keys.insert(pod.key(), i) {
            return Err(twice("the pod", j));
        }
        if let Some(j) = ips.insert(pod.ip, i) {
            return Err(twice(&format!("ip {}", pod.ip), j));
        }
        if let Some(j) = veths.insert(pod.host_veth.clone(), i) {
            return Err(twice(&format!("hostVeth {:?}", pod.host_veth), j));
        }
        if let Some(id) = r.cni.as_ref().and_then(|c| c.sandbox) {
            if let Some(j) = sandboxes.insert(id, i) {
                return Err(twice(&format!("sandbox {id:?}"), j));
            }
        }
    }
    Ok(())
}

// ---- the file -------------------------------------------------------------------------------

/// Replaces `dir/name` with `bytes` atomically and durably: a temporary file in `dir`, written
/// and fsynced, renamed over `name`, then the directory fsynced (so the rename itself survives a
/// crash). Blocking.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new().prefix(TMP_PREFIX).tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dir.join(name)).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}

/// An opened state directory: locked for this agent, its checkpoint read.
pub struct Store {
    dir: PathBuf,
    /// Held (flock) for the agent's lifetime.
    _lock: File,
}

impl Store {
    /// Creates `dir` if needed, takes its lock, removes the temporary files of writes a crash
    /// interrupted, and reads the checkpoint (none yet: no pods).
    pub fn open(dir: &Path) -> Result<(Store, Option<Saved>), CheckpointError> {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        let lock_path = dir.join(LOCK);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io("open", &lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(CheckpointError::Locked { path: lock_path }),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(CheckpointError::Io { op: "lock", path: lock_path, source: e })
            }
        }
        for entry in std::fs::read_dir(dir).map_err(io("list", dir))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let path = dir.join(FILE);
        let saved = match std::fs::read(&path) {
            Ok(bytes) => Some(decode(&bytes).map_err(|what| CheckpointError::Corrupt { path: path.clone(), what })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(CheckpointError::Io { op: "read", path, source: e }),
        };
        Ok((Store { dir: dir.to_path_buf(), _lock: lock }, saved))
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }
}

/// The node's checkpoint: disabled (no state directory) or a [`Store`] with its writer.
pub struct Checkpoint {
    store: Option<Arc<Store>>,
    /// What the file holds (`None`: unknown, after a failed write). The lock serialises writes:
    /// each snapshot is taken under it, after the previous write finished.
    written: Arc<tokio::sync::Mutex<Option<Vec<u8>>>>,
    /// What was read at start, until the pods are recovered from it.
    loaded: Mutex<Option<Saved>>,
    /// The pods were recovered: until then the model knows none of them, and a snapshot of it
    /// would erase the file's.
    ready: AtomicBool,
}

impl Checkpoint {
    /// No checkpoint (no state directory): pods are recorded in OVSDB only.
    pub fn none() -> Checkpoint {
        Checkpoint { store: None, written: Default::default(), loaded: Mutex::new(None), ready: AtomicBool::new(false) }
    }

    /// Opens the state directory; an unreadable checkpoint is an error (see [`Store::open`]).
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let (store, saved) = Store::open(dir)?;
        let written = saved.as_ref().map(encode);
        match &saved {
            Some(s) => tracing::info!(path = %store.path().display(), pods = s.pods.len(), "checkpoint read"),
            None => {
                tracing::info!(path = %store.path().display(), "no checkpoint yet; pods are known from OVSDB alone this time")
            }
        }
        Ok(Checkpoint {
            store: Some(Arc::new(store)),
            written: Arc::new(tokio::sync::Mutex::new(written)),
            loaded: Mutex::new(saved),
            ready: AtomicBool::new(false),
        })
    }

    pub fn enabled(&self) -> bool {
        self.store.is_some()
    }

    /// The file's path, if any.
    pub fn path(&self) -> Option<PathBuf> {
        self.store.as_ref().map(|s| s.path())
    }

    /// What was read at start (a copy: kept until [`Checkpoint::recovered`]).
    pub fn loaded(&self) -> Option<Saved> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The pods were recovered into the model: from now on its snapshots are the record (and
    /// the start's copy is no longer needed).
    pub fn recovered(&self) {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.ready.store(true, Ordering::Release);
    }

    /// Writes a snapshot taken by `snapshot` (under the write lock, so after every earlier
    /// write's) unless the file already holds exactly that; within `deadline` (and
    /// [`WRITE_TIMEOUT`]). A write that outlives its deadline keeps the lock until it ends, so
    /// writes never overtake each other.
    pub async fn persist(&self, snapshot: impl FnOnce() -> Saved, deadline: Instant) -> Result<(), CheckpointError> {
        let Some(store) = self.store.clone() else { return Ok(()) };
        if !self.ready.load(Ordering::Acquire) {
            return Err(CheckpointError::NotRecovered { path: store.path() });
        }
        let deadline = deadline.min(Instant::now() + WRITE_TIMEOUT);
        let path = store.path();
        let Ok(mut guard) = tokio::time::timeout_at(deadline, self.written.clone().lock_owned()).await else {
            return Err(CheckpointError::Timeout { path, after: WRITE_TIMEOUT });
        };
        let bytes = encode(&snapshot());
        if guard.as_deref() == Some(bytes.as_slice()) {
            return Ok(());
        }
        *guard = None;
        let b = bytes.clone();
        let s = store.clone();
        let mut write = tokio::task::spawn_blocking(move || write_atomic(&s.dir, FILE, &b));
        match tokio::time::timeout_at(deadline, &mut write).await {
            Ok(Ok(Ok(()))) => {
                *guard = Some(bytes);
                Ok(())
            }
            Ok(Ok(Err(e))) => Err(CheckpointError::Io { op: "write", path, source: e }),
            Ok(Err(e)) => Err(CheckpointError::Io { op: "write", path, source: std::io::Error::other(e.to_string()) }),
            Err(_) => {
                // The next write waits for this one (its result unknown: `None`).
                tokio::spawn(async move {
                    let _ = write.await;
                    drop(guard);
                });
                Err(CheckpointError::Timeout { path, after: WRITE_TIMEOUT })
            }
        }
    }
}

// ---- the node's use of it ----------------------------------------------------------------

/// A snapshot of the node's pods on disk, within `deadline`.
pub async fn persist(pods: &Pods, deadline: Instant) -> Result<(), CheckpointError> {
    pods.checkpoint.persist(|| { let s = pods.state.lock(); Saved { pods: s.held_records(), last_address: s.last_ip() } }, deadline).await
}

/// After a teardown: the checkpoint no longer lists the pod before the request is answered (a
/// failure fails the request, whose retry writes again).
pub(super) async fn forgotten(pods: &Pods, key: &PodKey, deadline: Instant) -> Result<(), PodError> {
    persist(pods, deadline).await.map_err(|e| {
        PodError::Failed(format!(
            "pod {}/{}: torn down, but the agent's record of it remains: {e}; retry",
            key.0, key.1
        ))
    })
}

/// How often [`keep_written`] looks for changes nobody wrote (a sandbox collected, a pod the
/// cluster deleted, a teardown finished by the reconcile loop).
const BACKGROUND_INTERVAL: Duration = Duration::from_secs(1);

/// Writes the checkpoint whenever the model's pods changed without a request writing it.
pub async fn keep_written(pods: Arc<Pods>, cancel: CancellationToken) {
    if !pods.checkpoint.enabled() {
        return;
    }
    let mut last_error = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(BACKGROUND_INTERVAL) => {}
        }
        match persist(&pods, Instant::now() + WRITE_TIMEOUT).await {
            Ok(()) => last_error = None,
            Err(CheckpointError::NotRecovered { .. }) => {}
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_ref() != Some(&msg) {
                    tracing::warn!(error = %msg, "could not write the checkpoint; will retry");
                }
                last_error = Some(msg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::record::{CniRecord, SandboxId};

    fn record(name: &str, ip: &str, veth: &str) -> PodRecord {
        PodRecord {
            version: 1,
            container_id: "ab".repeat(32),
            namespace: "team-a".into(),
            name: name.into(),
            host_veth: veth.into(),
            ip: ip.parse().unwrap(),
            mac: netif::MacAddr([0x0a, 0x58, 0x0a, 0x80, 0x00, 0x05]),
            annotations: Default::default(),
            internal: false,
            cni: Some(CniRecord {
                netns: "/var/run/netns/x".into(),
                if_name: "eth0".into(),
                address: format!("{ip}/23").parse().unwrap(),
                gateway: [10, 128, 0, 1].into(),
                mtu: 1450,
                sandbox: Some(SandboxId { dev: 4, ino: 4026532000 + name.bytes().map(u64::from).sum::<u64>() }),
                host_ifindex: Some(17),
            }),
        }
    }

    fn saved() -> Saved {
        Saved {
            pods: vec![record("a1", "10.128.0.5", "vethab12"), record("a2", "10.128.0.6", "vethab13")],
            last_address: Some("10.128.0.6".parse().unwrap()),
        }
    }

    #[test]
    fn what_is_encoded_decodes_to_the_same() {
        let s = saved();
        assert_eq!(decode(&encode(&s)).unwrap(), s);
        assert_eq!(decode(&encode(&Saved::default())).unwrap(), Saved::default());
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let text = String::from_utf8(encode(&saved())).unwrap();
        // A newer agent's extra fields, in the envelope and in a record (checksummed as written).
        let state_start = text.find("\"state\":").unwrap() + "\"state\":".len();
        let state = &text[state_start..text.rfind('}').unwrap()];
        let extended = state.replacen("{\"containerID\"", "{\"futureField\":[1,2],\"containerID\"", 1).replacen(
            "{\"lastAddress\"",
            "{\"futureTop\":true,\"lastAddress\"",
            1,
        );
        let doc = format!(
            "{{\"version\":1,\"writer\":\"sdn-node 9\",\"sha256\":\"{}\",\"state\":{extended}}}",
            sha256_hex(extended.as_bytes())
        );
        assert_eq!(decode(doc.as_bytes()).unwrap(), saved());
    }

    #[test]
    fn damage_is_refused_with_what_is_wrong() {
        let good = String::from_utf8(encode(&saved())).unwrap();
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
    }

    /// Records are checked as pods, and against each other (with the checksum recomputed, as a
    /// buggy writer would have).
    #[test]
    fn invalid_or_clashing_records_are_refused() {
        let reencode = |s: &Saved| String::from_utf8(encode(s)).unwrap();
        // The state, edited as text, with the checksum recomputed.
        let edited = |from: &str, to: &str| {
            let text = reencode(&saved());
            let state_start = text.find("\"state\":").unwrap() + 8;
            let state = text[state_start..text.rfind('}').unwrap()].replacen(from, to, 1);
            format!("{{\"version\":1,\"sha256\":\"{}\",\"state\":{state}}}", sha256_hex(state.as_bytes()))
        };
        let mut s = saved();
        s.pods[1].ip = s.pods[0].ip;
        s.pods[1].cni.as_mut().unwrap().address = "10.128.0.5/23".parse().unwrap();
        let e = decode(reencode(&s).as_bytes()).unwrap_err();
        assert!(e.contains("state.pods[1] (pod team-a/a2): ip 10.128.0.5 is also state.pods[0]'s"), "{e}");
        for (from, to, field) in [
            ("\"ip\":\"10.128.0.5\"", "\"ip\":\"10.128.0.300\"", "state.pods[0].ip: "),
            ("\"mac\":\"0a:58:0a:80:00:05\"", "\"mac\":\"0a:58\"", "state.pods[0].mac: "),
            ("\"gateway\":\"10.128.0.1\"", "\"gateway\":\"10.128.0.1/23\"", "state.pods[0].cni.gateway: "),
        ] {
            let e = decode(edited(from, to).as_bytes()).unwrap_err();
            assert!(e.starts_with(field), "{to}: {e}");
        }
        // Of a family the model does not take yet: named by field too.
        let e = decode(edited("\"ip\":\"10.128.0.5\"", "\"ip\":\"fd00::5\"").as_bytes()).unwrap_err();
        assert!(e.contains("state.pods[0] (pod team-a/a1): ip: fd00::5 is an IPv6 address"), "{e}");
        let mut s = saved();
        s.pods[1].cni.as_mut().unwrap().address = "10.128.0.9/23".parse().unwrap();
        assert!(decode(reencode(&s).as_bytes()).unwrap_err().contains("cni.address 10.128.0.9/23 is not its ip 10.128.0.6"));
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
        let state_start = text.find("\"state\":").unwrap() + 8;
        let state = &text[state_start..text.rfind('}').unwrap()];
        let doc = format!("{{\"version\":1,\"sha256\":\"{}\",\"state\":{state}}}", sha256_hex(state.as_bytes()));
        let e = decode(doc.as_bytes()).unwrap_err();
        assert!(e.contains("state.pods[0].cni.mtu"), "{e}");
    }

    #[test]
    fn the_store_writes_atomically_reads_back_and_locks() {
        let dir = tempfile::tempdir().unwrap();
        let (store, none) = Store::open(dir.path()).unwrap();
        assert!(none.is_none(), "no checkpoint yet");
        assert!(matches!(Store::open(dir.path()), Err(CheckpointError::Locked { .. })), "a second agent is refused");
        write_atomic(dir.path(), FILE, &encode(&saved())).unwrap();
        // A write a crash interrupted leaves its temporary file: removed at the next start.
        std::fs::write(dir.path().join(format!("{TMP_PREFIX}abc")), b"half").unwrap();
        drop(store);
        let (_store, read) = Store::open(dir.path()).unwrap();
        assert_eq!(read, Some(saved()));
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.starts_with(TMP_PREFIX)), "{names:?}");
    }

    #[test]
    fn a_corrupt_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), b"{\"version\":1,\"sha256\":\"00\",\"state\":{\"pods\":[]}}").unwrap();
        let e = Checkpoint::open(dir.path()).err().expect("refused");
        let msg = e.to_string();
        assert!(
            msg.contains(&dir.path().join(FILE).display().to_string())
                && msg.contains("checksum")
                && msg.contains("move it aside"),
            "{msg}"
        );
        // Nothing was changed.
        assert_eq!(
            std::fs::read(dir.path().join(FILE)).unwrap(),
            b"{\"version\":1,\"sha256\":\"00\",\"state\":{\"pods\":[]}}"
        );
    }

    #[tokio::test]
    async fn persist_writes_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        assert!(
            matches!(cp.persist(saved, deadline).await, Err(CheckpointError::NotRecovered { .. })),
            "nothing written before the recovery"
        );
        cp.recovered();
        cp.persist(saved, deadline).await.unwrap();
        let path = dir.path().join(FILE);
        assert_eq!(decode(&std::fs::read(&path).unwrap()).unwrap(), saved());
        // Same content: not written again (the file is not even replaced).
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        cp.persist(saved, deadline).await.unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap()), ino);
        cp.persist(Saved::default, deadline).await.unwrap();
        assert_eq!(decode(&std::fs::read(&path).unwrap()).unwrap(), Saved::default());
        // A write that fails says so and leaves the last complete file.
        let ro = tempfile::tempdir().unwrap();
        let cp2 = Checkpoint::open(ro.path()).unwrap();
        cp2.recovered();
        cp2.persist(saved, deadline).await.unwrap();
        std::fs::remove_dir_all(ro.path()).unwrap();
        let e = cp2.persist(Saved::default, deadline).await.unwrap_err();
        assert!(matches!(e, CheckpointError::Io { op: "write", .. }), "{e}");
    }
}
