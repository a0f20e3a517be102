//! The agent's own durable record of its pods: files under `--state-dir`, kept beside the
//! records on the pods' OVS ports (`external_ids`), so that a pod outlives the loss of the Open
//! vSwitch database (a reinstall, a corrupted `conf.db`). Without it a restarted agent would
//! know no pod whose port record went with the database: their sandboxes would stay dark, and
//! their addresses would be handed out again while those sandboxes hold them.
//!
//! One file per pod (`pods/<namespace>_<name>.json`) and one for IPAM's position (`ipam.json`;
//! see [`store`] for the layout), each one JSON document:
//!
//! ```text
//! {"version":1,"sha256":"<hex of the bytes of state>","state":{"seq":17,"pod":{...}}}
//! {"version":1,"sha256":"<hex of the bytes of state>","state":{"lastAddress":"10.128.0.9"}}
//! ```
//!
//! - `version` says how to read `state`; a version this agent does not know is refused (never
//!   guessed at). Fields it does not know are ignored, so a newer agent may add some.
//! - `sha256` is the digest of `state` exactly as written: a damaged file (a flipped digit of an
//!   address would otherwise pass as valid JSON and free a live pod's address) is refused.
//! - a pod's file holds the agent's record of the pod (set up, or torn down but not confirmed
//!   yet: both still hold their address) and `seq`, the number of the write that made it
//!   (increasing across all the pods' files: see [`format::resolve`] for what it decides);
//!   `lastAddress` is IPAM's position (the next search starts after it, so a just-released
//!   address is not handed out again at once, across restarts too).
//!
//! Each file is written atomically (a temporary file in the same directory, fsync, rename over
//! the old one, fsync of the directory): always one complete record, old or new, never a mix.
//! A request writes only its own pod's file (and IPAM's, when the position moved), so its cost
//! does not grow with the number of pods; writes of different pods run in parallel, those of
//! one pod one at a time, each taking the pod's record from the model after the previous one's
//! write: a pod's file always reflects a prefix of that pod's changes (CNI ADDs are answered
//! only once their pod's file is on disk, DELs once it is gone). Changes nobody asked for (a
//! sandbox collected, a pod deleted from the cluster) are written within a second
//! ([`keep_written`]). A file that cannot be read is an error naming it and what is wrong, and
//! the agent refuses to start on it (see [`CheckpointError::Corrupt`]): never a panic, never a
//! silent reset to "no pods". The single `pods.json` of earlier agents is read at start and
//! migrated ([`store`]).

pub mod format;
pub mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::node::record::PodRecord;
use crate::node::state::IpamCursor;
use crate::cluster::PodKey;

pub use format::{decode, encode, VERSION};
pub use store::{Store, LOCK};

/// The longest one write may take (fsyncs included) before the request waiting for it fails.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many pods' files a full write ([`persist`]) writes at once.
pub(super) const PARALLEL_WRITES: usize = 16;

/// What the checkpoint holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    pub pods: Vec<PodRecord>,
    /// IPAM's position: the address of each family handed out last.
    pub ipam: IpamCursor,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file exists but cannot be used. The agent does not start on it: starting without
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
    /// A write before the pods were recovered from the files (it would erase them).
    #[error("checkpoint {path}: the pods it records are not recovered yet")]
    NotRecovered { path: PathBuf },
}

/// What one file holds, as far as this agent knows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum OnDisk<T> {
    /// This (`None`: no file).
    Holds(Option<T>),
    /// Unknown: a write failed or outlived its deadline.
    Unknown,
}

/// One file's lock (writes of the file one at a time) and what it holds.
type Slot<T> = Arc<tokio::sync::Mutex<OnDisk<T>>>;

/// The node's checkpoint: disabled (no state directory) or a [`Store`] with its writers.
pub struct Checkpoint {
    store: Option<Arc<Store>>,
    /// The pods that have a file, or a write under way: each file's slot. A pod without a slot
    /// has no file.
    pods: Mutex<HashMap<PodKey, Slot<PodRecord>>>,
    /// IPAM's file (`None`: no file, when there is no position in either family).
    ipam: Slot<IpamCursor>,
    /// The next write number of a pod's file.
    seq: AtomicU64,
    /// Some write failed or timed out since the last full write: a file may be stale.
    dirty: AtomicBool,
    /// What was read at start, until the pods are recovered from it.
    loaded: Mutex<Option<Saved>>,
    /// The pods were recovered: until then the model knows none of them, and writing its view
    /// would erase the files'.
    ready: AtomicBool,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key_of(r: &PodRecord) -> PodKey {
    (r.namespace.clone(), r.name.clone())
}

impl Checkpoint {
    /// No checkpoint (no state directory): pods are recorded in OVSDB only.
    pub fn none() -> Checkpoint {
        Checkpoint {
            store: None,
            pods: Default::default(),
            ipam: Arc::new(tokio::sync::Mutex::new(OnDisk::Holds(None))),
            seq: AtomicU64::new(1),
            dirty: AtomicBool::new(false),
            loaded: Mutex::new(None),
            ready: AtomicBool::new(false),
        }
    }

    /// Opens the state directory; an unreadable checkpoint is an error (see [`Store::open`]).
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let (store, opened) = Store::open(dir)?;
        let saved = opened.saved;
        match &saved {
            Some(s) => tracing::info!(dir = %store.dir().display(), pods = s.pods.len(), "checkpoint read"),
            None => {
                tracing::info!(dir = %store.dir().display(), "no checkpoint yet; pods are known from OVSDB alone this time")
            }
        }
        let slot = |r: &PodRecord| Arc::new(tokio::sync::Mutex::new(OnDisk::Holds(Some(r.clone()))));
        let pods = saved.iter().flat_map(|s| s.pods.iter()).map(|r| (key_of(r), slot(r))).collect();
        let last = saved.as_ref().map(|s| s.ipam).filter(|c| !c.is_empty());
        Ok(Checkpoint {
            store: Some(Arc::new(store)),
            pods: Mutex::new(pods),
            ipam: Arc::new(tokio::sync::Mutex::new(OnDisk::Holds(last))),
            seq: AtomicU64::new(opened.next_seq),
            loaded: Mutex::new(saved),
            ..Checkpoint::none()
        })
    }

    pub fn enabled(&self) -> bool {
        self.store.is_some()
    }

    /// The state directory, if any.
    pub fn path(&self) -> Option<PathBuf> {
        self.store.as_ref().map(|s| s.dir().to_path_buf())
    }

    /// What was read at start (a copy: kept until [`Checkpoint::recovered`]).
    pub fn loaded(&self) -> Option<Saved> {
        locked(&self.loaded).clone()
    }

    /// The pods were recovered into the model: from now on its view is the record (and the
    /// start's copy is no longer needed).
    pub fn recovered(&self) {
        locked(&self.loaded).take();
        self.ready.store(true, Ordering::Release);
    }

    /// The store, once writes may begin.
    fn writable(&self) -> Result<Option<&Arc<Store>>, CheckpointError> {
        let Some(store) = &self.store else { return Ok(None) };
        if !self.ready.load(Ordering::Acquire) {
            return Err(CheckpointError::NotRecovered { path: store.dir().to_path_buf() });
        }
        Ok(Some(store))
    }

    /// A number for a pod's write. Drawn where the record is read from the model, under the
    /// model's lock, so that numbers follow the model's order (see [`format::resolve`]).
    /// A write failed since the last full pass: every file is to be brought up to date.
    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed)
    }

    /// The start of a full pass over the files: false if there is nothing to write to (no
    /// checkpoint); clears the dirty mark (a write failing during the pass sets it again).
    pub fn begin_full_pass(&self) -> Result<bool, CheckpointError> {
        if self.writable()?.is_none() {
            return Ok(false);
        }
        self.dirty.store(false, Ordering::Relaxed);
        Ok(true)
    }

    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Pod `key`'s slot (made if it has none).
    fn slot(&self, key: &PodKey) -> Slot<PodRecord> {
        let mut pods = locked(&self.pods);
        pods.entry(key.clone()).or_insert_with(|| Arc::new(tokio::sync::Mutex::new(OnDisk::Holds(None)))).clone()
    }

    /// Drops pod `key`'s slot if it has no file and nobody else uses it (pod names come and go:
    /// the map does not grow with every pod ever seen).
    fn tidy(&self, key: &PodKey) {
        let mut pods = locked(&self.pods);
        let unused = pods.get(key).is_some_and(|s| {
            Arc::strong_count(s) == 1 && s.try_lock().is_ok_and(|g| matches!(*g, OnDisk::Holds(None)))
        });
        if unused {
            pods.remove(key);
        }
    }

    /// Writes pod `key`'s file as `snapshot` says (its record and a write number from
    /// [`Checkpoint::next_seq`]; no record: no file) unless it holds exactly that already.
    /// `snapshot` is taken once this pod's earlier writes are over; within `deadline` (and
    /// [`WRITE_TIMEOUT`]).
    pub async fn persist_pod(
        &self,
        key: &PodKey,
        snapshot: impl FnOnce() -> (Option<PodRecord>, u64),
        deadline: Instant,
    ) -> Result<(), CheckpointError> {
        let Some(store) = self.writable()?.cloned() else { return Ok(()) };
        let slot = self.slot(key);
        let (k, path) = (key.clone(), store.pod_path(key));
        let r = self
            .write(slot, path, deadline, move |want: Option<&PodRecord>, seq| store.write_pod(&k, seq, want), snapshot)
            .await;
        self.tidy(key);
        r
    }

    /// Writes IPAM's file as `snapshot` says, unless it holds that already.
    pub async fn persist_ipam(&self, snapshot: impl FnOnce() -> IpamCursor, deadline: Instant) -> Result<(), CheckpointError> {
        let Some(store) = self.writable()?.cloned() else { return Ok(()) };
        let path = store.ipam_path();
        let write = move |want: Option<&IpamCursor>, _| store.write_ipam(want.copied().unwrap_or_default());
        self.write(self.ipam.clone(), path, deadline, write, || (Some(snapshot()).filter(|c| !c.is_empty()), 0)).await
    }

    /// One file's write, under its slot's lock (see [`Checkpoint::persist_pod`]). A write that
    /// outlives its deadline keeps the lock until it ends, so writes of a file never overtake
    /// each other.
    async fn write<T: Clone + PartialEq + Send + Sync + 'static>(
        &self,
        slot: Slot<T>,
        path: PathBuf,
        deadline: Instant,
        write: impl FnOnce(Option<&T>, u64) -> std::io::Result<()> + Send + 'static,
        snapshot: impl FnOnce() -> (Option<T>, u64),
    ) -> Result<(), CheckpointError> {
        let deadline = deadline.min(Instant::now() + WRITE_TIMEOUT);
        let Ok(mut guard) = tokio::time::timeout_at(deadline, slot.lock_owned()).await else {
            self.dirty.store(true, Ordering::Relaxed);
            return Err(CheckpointError::Timeout { path, after: WRITE_TIMEOUT });
        };
        let (want, seq) = snapshot();
        if matches!(&*guard, OnDisk::Holds(have) if *have == want) {
            return Ok(());
        }
        *guard = OnDisk::Unknown;
        let w = want.clone();
        let mut task = tokio::task::spawn_blocking(move || write(w.as_ref(), seq));
        let r = match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(Ok(()))) => {
                *guard = OnDisk::Holds(want);
                return Ok(());
            }
            Ok(Ok(Err(e))) => CheckpointError::Io { op: "write", path, source: e },
            Ok(Err(e)) => CheckpointError::Io { op: "write", path, source: std::io::Error::other(e.to_string()) },
            Err(_) => {
                // The next write of this file waits for this one (its result unknown).
                tokio::spawn(async move {
                    let _ = task.await;
                    drop(guard);
                });
                CheckpointError::Timeout { path, after: WRITE_TIMEOUT }
            }
        };
        self.dirty.store(true, Ordering::Relaxed);
        Err(r)
    }

    /// The pods whose file may not hold what `pods` (the model's records) says: those whose
    /// file differs or is unknown or being written, and those with a file `pods` lacks.
    pub fn differing(&self, pods: &[PodRecord]) -> Vec<PodKey> {
        let mut want: HashMap<PodKey, &PodRecord> = pods.iter().map(|r| (key_of(r), r)).collect();
        let slots = locked(&self.pods);
        let mut out = Vec::new();
        for (k, slot) in slots.iter() {
            let w = want.remove(k);
            let same = slot.try_lock().is_ok_and(|g| match &*g {
                OnDisk::Holds(have) => have.as_ref() == w,
                OnDisk::Unknown => false,
            });
            if !same {
                out.push(k.clone());
            }
        }
        out.extend(want.into_keys());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::format::tests::record;
    use super::*;

    fn dl() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn key(r: &PodRecord) -> PodKey {
        key_of(r)
    }

    /// The files' contents, read as the next start would (without the lock the writer holds).
    fn read_back(dir: &Path) -> Saved {
        let mut pods = Vec::new();
        for e in std::fs::read_dir(dir.join(store::PODS)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            pods.push(format::decode_pod(&name, &std::fs::read(e.path()).unwrap()).unwrap().1);
        }
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let ipam = std::fs::read(dir.join(store::IPAM)).ok().map(|b| format::decode_ipam(&b).unwrap()).unwrap_or_default();
        Saved { pods, ipam }
    }

    #[tokio::test]
    async fn persist_writes_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let a = record("a1", "10.128.0.5", "vethab12");
        let ka = key(&a);
        let with_a = || (Some(record("a1", "10.128.0.5", "vethab12")), 1);
        assert!(
            matches!(cp.persist_pod(&ka, with_a, dl()).await, Err(CheckpointError::NotRecovered { .. })),
            "nothing written before the recovery"
        );
        cp.recovered();
        cp.persist_pod(&ka, with_a, dl()).await.unwrap();
        let path = dir.path().join("pods/team-a_a1.json");
        assert_eq!(format::decode_pod("team-a_a1.json", &std::fs::read(&path).unwrap()).unwrap(), (1, a.clone()));
        // Same content: not written again (the file is not even replaced).
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        cp.persist_pod(&ka, || (Some(a.clone()), 2), dl()).await.unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap()), ino);
        assert_eq!(cp.differing(std::slice::from_ref(&a)), Vec::<PodKey>::new());
        cp.persist_ipam(|| IpamCursor { v4: Some("10.128.0.5".parse().unwrap()), v6: None }, dl()).await.unwrap();
        cp.persist_pod(&ka, || (None, 3), dl()).await.unwrap();
        assert!(!path.exists());
        assert!(locked(&cp.pods).is_empty(), "a pod without a file keeps no slot");
        assert_eq!(read_back(dir.path()), Saved { pods: vec![], ipam: IpamCursor { v4: Some("10.128.0.5".parse().unwrap()), v6: None } });
        assert!(!cp.dirty.load(Ordering::Relaxed));
        // A write that fails says so, marks the checkpoint dirty and leaves the last complete
        // file.
        let ro = tempfile::tempdir().unwrap();
        let cp2 = Checkpoint::open(ro.path()).unwrap();
        cp2.recovered();
        cp2.persist_pod(&ka, with_a, dl()).await.unwrap();
        std::fs::remove_dir_all(ro.path()).unwrap();
        let e = cp2.persist_pod(&ka, || (None, 2), dl()).await.unwrap_err();
        assert!(matches!(e, CheckpointError::Io { op: "write", .. }), "{e}");
        assert!(cp2.dirty.load(Ordering::Relaxed));
        assert_eq!(cp2.differing(&[]), vec![ka.clone()], "its file is unknown now");
    }

    /// Writes of different pods run at once; those of one pod one after the other, each
    /// snapshot taken after the previous write (the file ends with the last one's).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_pods_writes_are_ordered_and_pods_are_independent() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(Checkpoint::open(dir.path()).unwrap());
        cp.recovered();
        let pods: Vec<PodRecord> = (0..20)
            .map(|i| {
                let mut r = record(&format!("p{i}"), &format!("10.128.1.{}", i + 1), &format!("veth{i}"));
                r.mac = netif::MacAddr([0x0a, 0x58, 0x0a, 0x80, 0x01, i as u8 + 1]);
                r
            })
            .collect();
        let version = Arc::new(AtomicU64::new(0));
        // Each pod's newest snapshot.
        let newest = Arc::new(Mutex::new(HashMap::<String, u64>::new()));
        let mut tasks = Vec::new();
        for round in 0..5u64 {
            for r in &pods {
                let (cp, r, version, newest) = (cp.clone(), r.clone(), version.clone(), newest.clone());
                tasks.push(tokio::spawn(async move {
                    let k = key(&r);
                    cp.persist_pod(
                        &k,
                        || {
                            // Each snapshot: a newer record of the pod (its annotations count them).
                            let mut r = r;
                            let v = version.fetch_add(1, Ordering::SeqCst);
                            r.annotations.insert("v".into(), format!("{round}-{v}"));
                            let mut n = locked(&newest);
                            let e = n.entry(r.name.clone()).or_default();
                            *e = (*e).max(v);
                            (Some(r), v + 1)
                        },
                        dl(),
                    )
                    .await
                }));
            }
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let back = read_back(dir.path());
        assert_eq!(back.pods.len(), 20);
        let newest = locked(&newest);
        for r in &back.pods {
            let name = format::file_name(&key(r));
            let (seq, _) = format::decode_pod(&name, &std::fs::read(dir.path().join("pods").join(&name)).unwrap()).unwrap();
            let v = r.annotations["v"].split('-').nth(1).unwrap().parse::<u64>().unwrap();
            assert_eq!(seq, v + 1, "{}: the file holds the write its snapshot numbered", r.name);
            assert_eq!(v, newest[&r.name], "{}: the last write is the newest snapshot", r.name);
        }
    }
}
