//! The checkpoint's files under the state directory, and the blocking work on them:
//!
//! ```text
//! DIR/lock                         flock: one agent per directory
//! DIR/ipam.json                    IPAM's position
//! DIR/pods/<namespace>_<name>.json one file per pod
//! DIR/pods.json                    what agents before the per-pod files wrote: migrated at start
//! ```
//!
//! Every write replaces one file atomically and durably (a temporary file in the same
//! directory, written and fsynced, renamed over the file, then the directory fsynced, so the
//! rename itself survives a crash); a removal is durable the same way (the directory fsynced).
//! Temporary files start with `.`, which no checkpoint file does: those of writes a crash
//! interrupted are removed at start.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::format::{self, PodFile};
use super::{CheckpointError, Saved};
use crate::cluster::PodKey;
use crate::node::record::PodRecord;
use crate::node::state::IpamCursor;

/// The single file of earlier agents (read and migrated at start; never written).
pub const LEGACY: &str = "pods.json";
/// The directory of the pods' files.
pub const PODS: &str = "pods";
/// IPAM's file.
pub const IPAM: &str = "ipam.json";
/// The lock file: one agent per state directory.
pub const LOCK: &str = "lock";

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io { op, path: path.to_path_buf(), source }
}

/// Replaces `dir/name` with `bytes` atomically and durably (see the module documentation).
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = tempfile::Builder::new().prefix(&format!(".{name}.")).tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(dir.join(name)).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}

/// Removes `dir/name` durably; a file already gone is success (its directory is fsynced all
/// the same: a rename or removal before a crash may not be durable yet).
pub fn remove_durably(dir: &Path, name: &str) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(name)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    File::open(dir)?.sync_all()
}

/// Removes the temporary files of writes a crash interrupted: in `dir`, those of `names`; with
/// `names` empty, every file whose name starts with `.`.
fn remove_temporaries(dir: &Path, names: &[&str]) -> Result<(), CheckpointError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(CheckpointError::Io { op: "list", path: dir.to_path_buf(), source: e }),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = if names.is_empty() {
            name.starts_with('.')
        } else {
            names.iter().any(|n| name.starts_with(&format!(".{n}.")))
        };
        if ours {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// An opened state directory: locked for this agent.
pub struct Store {
    dir: PathBuf,
    pods: PathBuf,
    /// Held (flock) for the agent's lifetime.
    _lock: File,
}

/// What [`Store::open`] read.
pub struct Opened {
    /// The pods and IPAM's position (none: no checkpoint yet).
    pub saved: Option<Saved>,
    /// The next write number (above every file's).
    pub next_seq: u64,
}

impl Store {
    /// Creates `dir` if needed, takes its lock, removes the temporary files of writes a crash
    /// interrupted, migrates an earlier agent's `pods.json` and reads the checkpoint. A file
    /// that cannot be read is [`CheckpointError::Corrupt`], naming it, and nothing is changed.
    pub fn open(dir: &Path) -> Result<(Store, Opened), CheckpointError> {
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
        let store = Store { dir: dir.to_path_buf(), pods: dir.join(PODS), _lock: lock };
        remove_temporaries(dir, &[LEGACY, IPAM])?;
        remove_temporaries(&store.pods, &[])?;
        let legacy = dir.join(LEGACY);
        let opened = match std::fs::read(&legacy) {
            Ok(bytes) => {
                let saved = format::decode(&bytes).map_err(|what| CheckpointError::Corrupt { path: legacy.clone(), what })?;
                store.migrate(&saved)?;
                tracing::info!(from = %legacy.display(), to = %store.pods.display(), pods = saved.pods.len(), "checkpoint migrated to one file per pod");
                Opened { next_seq: saved.pods.len() as u64 + 1, saved: Some(saved) }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => store.read()?,
            Err(e) => return Err(CheckpointError::Io { op: "read", path: legacy, source: e }),
        };
        // Writes never have to create it.
        if !store.pods.is_dir() {
            std::fs::create_dir(&store.pods).map_err(io("create", &store.pods))?;
            File::open(dir).and_then(|d| d.sync_all()).map_err(io("sync", dir))?;
        }
        Ok((store, opened))
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Pod `key`'s file.
    pub fn pod_path(&self, key: &PodKey) -> PathBuf {
        self.pods.join(format::file_name(key))
    }

    pub fn ipam_path(&self) -> PathBuf {
        self.dir.join(IPAM)
    }

    /// Writes pod `key`'s file (`Some`: its record, as write `seq`) or removes it (`None`).
    /// Blocking.
    pub fn write_pod(&self, key: &PodKey, seq: u64, record: Option<&PodRecord>) -> std::io::Result<()> {
        let name = format::file_name(key);
        match record {
            Some(r) => write_atomic(&self.pods, &name, &format::encode_pod(seq, r)),
            None => remove_durably(&self.pods, &name),
        }
    }

    /// Writes IPAM's file (no position in either family: no file). Blocking.
    pub fn write_ipam(&self, cursor: IpamCursor) -> std::io::Result<()> {
        if cursor.is_empty() {
            remove_durably(&self.dir, IPAM)
        } else {
            write_atomic(&self.dir, IPAM, &format::encode_ipam(cursor))
        }
    }

    /// The per-pod form of `saved`, durable, and then only then `pods.json` removed: a crash
    /// before the removal migrates again at the next start (`pods.json` is the newer record
    /// while it exists: an earlier agent may have written it after a newer one's files).
    fn migrate(&self, saved: &Saved) -> Result<(), CheckpointError> {
        std::fs::create_dir_all(&self.pods).map_err(io("create", &self.pods))?;
        let mut written = std::collections::HashSet::new();
        for (i, r) in saved.pods.iter().enumerate() {
            let key = (r.namespace.clone(), r.name.clone());
            let path = self.pod_path(&key);
            self.write_pod(&key, i as u64 + 1, Some(r)).map_err(io("write", &path))?;
            written.insert(format::file_name(&key));
        }
        for (name, _) in self.listing()? {
            if !written.contains(&name) {
                let path = self.pods.join(&name);
                remove_durably(&self.pods, &name).map_err(io("remove", &path))?;
            }
        }
        self.write_ipam(saved.ipam).map_err(io("write", &self.ipam_path()))?;
        let legacy = self.dir.join(LEGACY);
        remove_durably(&self.dir, LEGACY).map_err(io("remove", &legacy))
    }

    /// The pods directory's pod files (name, path): every `*.json` not starting with `.`.
    /// Anything else there is not the agent's and is left alone.
    fn listing(&self) -> Result<Vec<(String, PathBuf)>, CheckpointError> {
        let entries = match std::fs::read_dir(&self.pods) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CheckpointError::Io { op: "list", path: self.pods.clone(), source: e }),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io("list", &self.pods))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") || !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            out.push((name, entry.path()));
        }
        out.sort();
        Ok(out)
    }

    /// Reads the pods' files and IPAM's; removes the files a crash left stale (see
    /// [`format::resolve`]) once everything else was read without error.
    fn read(&self) -> Result<Opened, CheckpointError> {
        let ipam_path = self.ipam_path();
        let ipam = match std::fs::read(&ipam_path) {
            Ok(bytes) => Some(format::decode_ipam(&bytes).map_err(|what| CheckpointError::Corrupt { path: ipam_path.clone(), what })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(CheckpointError::Io { op: "read", path: ipam_path, source: e }),
        };
        if ipam.is_none() && !self.pods.is_dir() {
            return Ok(Opened { saved: None, next_seq: 1 });
        }
        let mut files: Vec<PodFile> = Vec::new();
        for (name, path) in self.listing()? {
            let bytes = std::fs::read(&path).map_err(io("read", &path))?;
            let (seq, record) = format::decode_pod(&name, &bytes).map_err(|what| CheckpointError::Corrupt { path, what })?;
            files.push((name, seq, record));
        }
        let next_seq = files.iter().map(|f| f.1).max().unwrap_or(0) + 1;
        let (kept, stale) =
            format::resolve(files).map_err(|(name, what)| CheckpointError::Corrupt { path: self.pods.join(name), what })?;
        for (name, why) in stale {
            let path = self.pods.join(&name);
            tracing::warn!(file = %path.display(), why = %why, "a stale pod file (a crash came between two writes): removed");
            remove_durably(&self.pods, &name).map_err(io("remove", &path))?;
        }
        let mut pods: Vec<PodRecord> = kept.into_iter().map(|(_, _, r)| r).collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(Opened { saved: Some(Saved { pods, ipam: ipam.unwrap_or_default() }), next_seq })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::format::tests::record;

    fn saved() -> Saved {
        Saved {
            pods: vec![record("a1", "10.128.0.5", "vethab12"), record("a2", "10.128.0.6", "vethab13")],
            ipam: IpamCursor { v4: Some("10.128.0.6".parse().unwrap()), v6: None },
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    fn key(r: &PodRecord) -> PodKey {
        (r.namespace.clone(), r.name.clone())
    }

    #[test]
    fn the_store_writes_atomically_reads_back_and_locks() {
        let dir = tempfile::tempdir().unwrap();
        let (store, opened) = Store::open(dir.path()).unwrap();
        assert!(opened.saved.is_none(), "no checkpoint yet");
        assert!(matches!(Store::open(dir.path()), Err(CheckpointError::Locked { .. })), "a second agent is refused");
        let s = saved();
        for (i, r) in s.pods.iter().enumerate() {
            store.write_pod(&key(r), 10 + i as u64, Some(r)).unwrap();
        }
        store.write_ipam(s.ipam).unwrap();
        // Writes a crash interrupted leave their temporary files: removed at the next start.
        std::fs::write(dir.path().join(PODS).join(".team-a_a3.json.abc"), b"half").unwrap();
        std::fs::write(dir.path().join(".ipam.json.abc"), b"half").unwrap();
        std::fs::write(dir.path().join(".pods.json.abc"), b"half").unwrap();
        // What is not the agent's is left alone.
        std::fs::write(dir.path().join(PODS).join("notes.txt"), b"mine").unwrap();
        drop(store);
        let (store, opened) = Store::open(dir.path()).unwrap();
        assert_eq!(opened.saved, Some(s.clone()));
        assert_eq!(opened.next_seq, 12);
        assert_eq!(names(dir.path()), vec!["ipam.json", "lock", "pods"]);
        assert_eq!(names(&dir.path().join(PODS)), vec!["notes.txt", "team-a_a1.json", "team-a_a2.json"]);
        // A removal, and no position: no file.
        store.write_pod(&key(&s.pods[0]), 13, None).unwrap();
        store.write_pod(&key(&s.pods[0]), 14, None).unwrap();
        store.write_ipam(IpamCursor::default()).unwrap();
        drop(store);
        let (_store, opened) = Store::open(dir.path()).unwrap();
        assert_eq!(opened.saved, Some(Saved { pods: vec![s.pods[1].clone()], ipam: IpamCursor::default() }));
    }

    /// An earlier agent's `pods.json`: its pods and position in the per-pod form, the file gone
    /// once that is durable; pod files it does not list (an earlier run's of this agent) go.
    #[test]
    fn pods_json_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let s = saved();
        std::fs::create_dir(dir.path().join(PODS)).unwrap();
        let old = record("zz", "10.128.0.9", "vethzz");
        std::fs::write(dir.path().join(PODS).join("team-a_zz.json"), format::encode_pod(50, &old)).unwrap();
        std::fs::write(dir.path().join(LEGACY), format::encode(&s)).unwrap();
        let (store, opened) = Store::open(dir.path()).unwrap();
        assert_eq!(opened.saved, Some(s.clone()));
        assert_eq!(opened.next_seq, 3);
        assert_eq!(names(dir.path()), vec!["ipam.json", "lock", "pods"]);
        assert_eq!(names(&dir.path().join(PODS)), vec!["team-a_a1.json", "team-a_a2.json"]);
        drop(store);
        let (_store, again) = Store::open(dir.path()).unwrap();
        assert_eq!(again.saved, Some(s));
    }

    #[test]
    fn a_damaged_file_is_refused_naming_it_and_nothing_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let s = saved();
        for (i, r) in s.pods.iter().enumerate() {
            store.write_pod(&key(r), 1 + i as u64, Some(r)).unwrap();
        }
        drop(store);
        let bad = dir.path().join(PODS).join("team-a_a2.json");
        let text = std::fs::read_to_string(&bad).unwrap().replace("10.128.0.6\"", "10.128.0.7\"");
        std::fs::write(&bad, &text).unwrap();
        let e = Store::open(dir.path()).err().expect("refused");
        match &e {
            CheckpointError::Corrupt { path, what } => {
                assert_eq!(path, &bad);
                assert!(what.contains("does not match its checksum"), "{what}");
            }
            other => panic!("{other}"),
        }
        assert_eq!(std::fs::read_to_string(&bad).unwrap(), text, "left as it was");
        std::fs::write(dir.path().join(IPAM), b"{").unwrap();
        let e = Store::open(dir.path()).err().expect("refused");
        assert!(matches!(&e, CheckpointError::Corrupt { path, .. } if path.ends_with(IPAM)), "{e}");
        // A damaged pods.json is refused before anything is migrated.
        std::fs::remove_file(dir.path().join(IPAM)).unwrap();
        std::fs::write(&bad, format::encode_pod(2, &s.pods[1])).unwrap();
        std::fs::write(dir.path().join(LEGACY), b"{\"version\":1,\"sha256\":\"00\",\"state\":{\"pods\":[]}}").unwrap();
        let e = Store::open(dir.path()).err().expect("refused");
        assert!(matches!(&e, CheckpointError::Corrupt { path, .. } if path.ends_with(LEGACY)), "{e}");
        assert_eq!(names(&dir.path().join(PODS)), vec!["team-a_a1.json", "team-a_a2.json"], "nothing migrated");
    }

    /// A crash after a pod's address went to another pod but before the first pod's file was
    /// removed: the later write wins, the stale file is removed.
    #[test]
    fn a_stale_file_left_by_a_crash_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path()).unwrap();
        let a = record("a1", "10.128.0.5", "vethab12");
        let mut b = record("b1", "10.128.0.5", "vethcd34");
        b.cni.as_mut().unwrap().address = "10.128.0.5/23".parse().unwrap();
        store.write_pod(&key(&a), 3, Some(&a)).unwrap();
        store.write_pod(&key(&b), 4, Some(&b)).unwrap();
        drop(store);
        let (_store, opened) = Store::open(dir.path()).unwrap();
        assert_eq!(opened.saved.unwrap().pods, vec![b]);
        assert_eq!(names(&dir.path().join(PODS)), vec!["team-a_b1.json"]);
    }
}
