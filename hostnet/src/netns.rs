//! Network namespace handles.
//!
//! Netlink sockets, ioctl sockets and /proc/sys/net files are bound to the network namespace
//! of the thread that *creates or opens* them, and keep that binding afterwards. So to work in
//! another namespace we switch a dedicated, short-lived OS thread into it with `setns(2)`,
//! create the socket (or do the blocking work) there, switch back, and let the thread end.
//! The calling thread — a tokio worker shared with unrelated tasks — never changes namespace,
//! which is the mistake that makes "sometimes my route went into the pod" bugs.

use std::{
    fs::File,
    os::fd::{AsRawFd, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use crate::error::{Error, Result};

/// Upper bound for one piece of blocking work run inside a namespace. The work itself uses
/// socket timeouts well below this; the bound only keeps a wedged kernel from hanging callers.
pub const NS_WORK_TIMEOUT: Duration = Duration::from_secs(10);

/// An open network namespace. Holding the file keeps the namespace alive even if its bind
/// mount (`/var/run/netns/X`) or process goes away meanwhile.
#[derive(Clone, Debug)]
pub struct Netns {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

impl Netns {
    /// Opens a namespace by path: `/var/run/netns/NAME` or `/proc/PID/ns/net`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io("open netns", path.display().to_string(), e))?;
        Ok(Netns { fd: Arc::new(file.into()), path })
    }

    /// The namespace of the calling process (the host namespace, for the agent).
    pub fn current() -> Result<Self> {
        Self::open("/proc/self/ns/net")
    }

    /// The path this handle was opened from, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Runs blocking `work` on a fresh OS thread that has entered this namespace, and returns
    /// its result. The thread switches back before ending; if even that fails the thread ends
    /// anyway, so no thread is ever left behind in the wrong namespace.
    pub async fn run<R, F>(&self, what: &str, work: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce() -> Result<R> + Send + 'static,
    {
        let target = self.fd.clone();
        let object = format!("{} in netns {}", what, self.path.display());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread_object = object.clone();
        std::thread::Builder::new()
            .name("hostnet-netns".into())
            .spawn(move || {
                let _ = tx.send(in_netns(&target, &thread_object, work));
            })
            .map_err(|e| Error::io("spawn thread for", object.clone(), e))?;
        match tokio::time::timeout(NS_WORK_TIMEOUT, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => {
                Err(Error::Reply { object, reason: "worker thread ended without a result (panicked)".into() })
            }
            Err(_) => Err(Error::Timeout { op: "run", object, after: NS_WORK_TIMEOUT }),
        }
    }
}

/// A namespace's identity: the device and inode of its nsfs file (what `ip netns identify`
/// and `stat -L /proc/PID/ns/net` compare). Two handles are the same namespace iff equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

/// Why a path named as a pod's sandbox cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The path is not a network namespace the agent may put a pod interface into: the
    /// request's fault (a 400 naming the field).
    #[error("{0}")]
    Refused(String),
    /// The agent could not look (file descriptor limit, /proc unreadable): not the request's
    /// fault.
    #[error("{0}")]
    Failed(Error),
}

/// nsfs's `statfs` magic (linux/magic.h): every namespace file, `/proc/PID/ns/*` and their
/// bind mounts, lives on it.
const NSFS_MAGIC: i64 = 0x6e73_6673;
/// `ioctl(NS_GET_NSTYPE)` (linux/nsfs.h, `_IO(0xb7, 0x3)`): the namespace's CLONE_NEW* type.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
/// The inode of the initial network namespace on nsfs (`PROC_NET_INIT_INO`,
/// include/linux/proc_ns.h): fixed since Linux 3.8.
const PROC_NET_INIT_INO: u64 = 0xEFFF_FFF9;

impl Netns {
    /// Identity of this namespace.
    pub fn id(&self) -> Result<NsId> {
        fstat(self.fd.as_raw_fd()).map(|st| NsId { dev: st.st_dev, ino: st.st_ino }).map_err(|e| Error::io("stat netns", self.path.display().to_string(), e))
    }

    /// Opens the namespace a request names as a pod's sandbox (CNI_NETNS), and refuses anything
    /// else, before anything is created in it:
    ///
    /// - the path is looked up with `O_PATH`, which never blocks and has no side effects (a
    ///   FIFO's open would wait for a writer on the caller's thread; a device's open could act
    ///   on the device), and must be a regular file on nsfs — a bind-mounted namespace
    ///   (`/var/run/netns/X`) or `/proc/PID/ns/net`;
    /// - only then is it opened for real, through that same `O_PATH` handle (so a path swapped
    ///   meanwhile changes nothing), non-blocking, and must be a *network* namespace;
    /// - it must not be the agent's own namespace (the node's, when the agent runs in it), nor
    ///   init's (the host's), nor any of `forbidden` (the agent's private ones): a "pod" end
    ///   moved there would land among the node's interfaces, and the pod routes set up in it
    ///   would replace the node's. `..`, symlinks and `/proc/self` lead to the same inode, so
    ///   the comparison is by identity, not by name.
    ///
    /// All of it runs on a blocking-pool thread, bounded by [`NS_WORK_TIMEOUT`].
    pub async fn open_sandbox(path: &str, forbidden: &[NsId]) -> std::result::Result<Netns, SandboxError> {
        let (p, forbidden) = (path.to_string(), forbidden.to_vec());
        let work = tokio::task::spawn_blocking(move || open_sandbox_blocking(&p, &forbidden));
        match tokio::time::timeout(NS_WORK_TIMEOUT, work).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(SandboxError::Failed(Error::Reply { object: format!("sandbox {path:?}"), reason: format!("the opening thread failed: {e}") })),
            Err(_) => Err(SandboxError::Failed(Error::Timeout { op: "open", object: format!("sandbox {path:?}"), after: NS_WORK_TIMEOUT })),
        }
    }
}

/// The blocking body of [`Netns::open_sandbox`].
pub fn open_sandbox_blocking(path: &str, forbidden: &[NsId]) -> std::result::Result<Netns, SandboxError> {
    use std::os::fd::FromRawFd;
    let refuse = |why: String| Err(SandboxError::Refused(format!("{path:?} {why}")));
    if !path.starts_with('/') {
        return refuse("is not an absolute path".into());
    }
    if path.len() >= libc::PATH_MAX as usize {
        return refuse(format!("is longer than {} bytes", libc::PATH_MAX - 1));
    }
    let Ok(c) = std::ffi::CString::new(path) else { return refuse("contains a NUL byte".into()) };
    // SAFETY: plain system call on a NUL-terminated path; the result is checked.
    let raw = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM) => Err(SandboxError::Failed(Error::io("open", format!("sandbox {path:?}"), e))),
            _ => refuse(format!("cannot be opened: {e}")),
        };
    }
    // SAFETY: `raw` is a descriptor this function just opened and nothing else owns.
    let located = unsafe { OwnedFd::from_raw_fd(raw) };
    let st = fstat(located.as_raw_fd()).map_err(|e| SandboxError::Failed(Error::io("stat", format!("sandbox {path:?}"), e)))?;
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFREG {
        return refuse(format!("is {}, not a network namespace (an nsfs file such as /var/run/netns/NAME)", file_kind(kind)));
    }
    let fs = fstatfs(located.as_raw_fd()).map_err(|e| SandboxError::Failed(Error::io("statfs", format!("sandbox {path:?}"), e)))?;
    if fs.f_type as i64 != NSFS_MAGIC {
        return refuse(format!("is a plain file (filesystem magic {:#x}), not a network namespace (nsfs)", fs.f_type));
    }
    // Reopen the very inode found, non-blocking, for setns.
    let again = std::ffi::CString::new(format!("/proc/self/fd/{}", located.as_raw_fd())).map_err(|_| SandboxError::Refused(path.into()))?;
    // SAFETY: as above.
    let raw = unsafe { libc::open(again.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY) };
    if raw < 0 {
        let e = std::io::Error::last_os_error();
        return Err(SandboxError::Failed(Error::io("reopen", format!("sandbox {path:?}"), e)));
    }
    // SAFETY: as above.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the descriptor's namespace.
    let ty = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE as _) };
    if ty != libc::CLONE_NEWNET {
        return refuse(format!("is {}, not a network namespace", ns_kind(ty)));
    }
    let st = fstat(fd.as_raw_fd()).map_err(|e| SandboxError::Failed(Error::io("stat", format!("sandbox {path:?}"), e)))?;
    let id = NsId { dev: st.st_dev, ino: st.st_ino };
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::metadata("/proc/self/ns/net").map_err(|e| SandboxError::Failed(Error::io("stat", "/proc/self/ns/net", e)))?;
    if (own.dev(), own.ino()) == (id.dev, id.ino) {
        return refuse("is the agent's own (the node's) network namespace, not a pod sandbox".into());
    }
    // The host's: the kernel's initial network namespace has a fixed inode on nsfs (there is
    // one nsfs), which works without access to init's /proc entry (no hostPID, or an init
    // that cannot be inspected); and init's, where it can be read (an agent inside a
    // namespace that is not the initial one, e.g. a nested test host).
    if (id.dev, id.ino) == (own.dev(), PROC_NET_INIT_INO) {
        return refuse("is the host's initial network namespace, not a pod sandbox".into());
    }
    match std::fs::metadata("/proc/1/ns/net") {
        Ok(init) if (init.dev(), init.ino()) == (id.dev, id.ino) => {
            return refuse("is init's (the host's) network namespace, not a pod sandbox".into());
        }
        Ok(_) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM | libc::ENOENT)) => {}
        Err(e) => return Err(SandboxError::Failed(Error::io("stat", "/proc/1/ns/net", e))),
    }
    if forbidden.contains(&id) {
        return refuse("is one of the agent's private network namespaces, not a pod sandbox".into());
    }
    Ok(Netns { fd: Arc::new(fd), path: PathBuf::from(path) })
}

fn file_kind(kind: libc::mode_t) -> &'static str {
    match kind {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symbolic link",
        _ => "not a regular file",
    }
}

fn ns_kind(ty: i32) -> String {
    match ty {
        libc::CLONE_NEWNS => "a mount namespace".into(),
        libc::CLONE_NEWPID => "a PID namespace".into(),
        libc::CLONE_NEWUSER => "a user namespace".into(),
        libc::CLONE_NEWUTS => "a UTS namespace".into(),
        libc::CLONE_NEWIPC => "an IPC namespace".into(),
        libc::CLONE_NEWCGROUP => "a cgroup namespace".into(),
        -1 => format!("a namespace of unknown type ({})", std::io::Error::last_os_error()),
        t => format!("a namespace of type {t:#x}"),
    }
}

fn fstat(fd: i32) -> std::io::Result<libc::stat> {
    // SAFETY: `st` is written by the kernel on success; `fd` is a valid descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } == 0 {
        Ok(st)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn fstatfs(fd: i32) -> std::io::Result<libc::statfs> {
    // SAFETY: as fstat.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd, &mut st) } == 0 {
        Ok(st)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Body of the worker thread: enter, work, leave.
fn in_netns<R>(target: &OwnedFd, object: &str, work: impl FnOnce() -> Result<R>) -> Result<R> {
    let original = File::open("/proc/thread-self/ns/net").map_err(|e| Error::io("open own netns for", object, e))?;
    setns(target.as_raw_fd()).map_err(|e| Error::io("enter netns for", object, e))?;
    let result = work();
    // Returning matters only for tidiness (the thread ends next); a failure here cannot
    // affect any other thread, so the work's own result is what we report.
    let _ = setns(original.as_raw_fd());
    result
}

fn setns(fd: i32) -> std::io::Result<()> {
    // SAFETY: plain system call on a file descriptor we own; affects only this thread.
    let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Where named namespaces live (iproute2's convention, so `ip netns` sees ours and we see its).
pub const NETNS_DIR: &str = "/var/run/netns";

impl Netns {
    /// Creates a new, empty network namespace named `name` under [`NETNS_DIR`], as
    /// `ip netns add` does: a fresh thread unshares its network namespace and bind-mounts it
    /// onto an empty file, then ends. Blocking (file system and a short-lived thread).
    pub fn create_named(name: &str) -> Result<Netns> {
        check_netns_name(name)?;
        let path = Path::new(NETNS_DIR).join(name);
        let object = path.display().to_string();
        std::fs::create_dir_all(NETNS_DIR).map_err(|e| Error::io("create", NETNS_DIR, e))?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io("create netns file", object.clone(), e))?;
        let target = path.clone();
        let mounted = std::thread::Builder::new()
            .name("hostnet-netns-new".into())
            .spawn(move || -> std::io::Result<()> {
                // SAFETY: unshare affects only this thread, which ends right after.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: plain system call.
                let tid = unsafe { libc::gettid() };
                bind_mount(&format!("/proc/self/task/{tid}/ns/net"), &target)
            })
            .map_err(|e| Error::io("spawn thread for", object.clone(), e))?
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("netns thread panicked")));
        if let Err(e) = mounted {
            let _ = std::fs::remove_file(&path);
            return Err(Error::io("bind-mount new netns on", object, e));
        }
        Netns::open(&path)
    }

    /// Creates a new, empty network namespace that has no name: it lives as long as a handle
    /// to it (this one or a clone) is open, and the kernel destroys it, with every interface
    /// in it, when the last one closes — so a process that dies leaves nothing of it behind.
    /// A fresh thread unshares its network namespace, opens it, and ends. Blocking.
    pub fn create_anonymous(what: &str) -> Result<Netns> {
        let object = format!("anonymous netns for {what}");
        let opened = std::thread::Builder::new()
            .name("hostnet-netns-new".into())
            .spawn(move || -> std::io::Result<File> {
                // SAFETY: unshare affects only this thread, which ends right after.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                File::open("/proc/thread-self/ns/net")
            })
            .map_err(|e| Error::io("spawn thread for", object.clone(), e))?
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("netns thread panicked")))
            .map_err(|e| Error::io("create", object.clone(), e))?;
        Ok(Netns { fd: Arc::new(opened.into()), path: PathBuf::from(object) })
    }

    /// Removes namespace `name` created by [`Netns::create_named`] (or `ip netns add`): its
    /// bind mount goes (lazily: open handles keep the namespace alive), then its file. A
    /// missing one is success. Blocking.
    pub fn remove_named(name: &str) -> Result<()> {
        check_netns_name(name)?;
        let path = Path::new(NETNS_DIR).join(name);
        let c = cstring(&path)?;
        // SAFETY: plain system call on a NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: not a mount point; ENOENT: no file.
            if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) {
                return Err(Error::io("unmount netns", path.display().to_string(), e));
            }
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove netns file", path.display().to_string(), e)),
            _ => Ok(()),
        }
    }
}

fn check_netns_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(Error::invalid(format!("netns name {name:?}"), "empty, '.', '..', or containing '/' or NUL"));
    }
    Ok(())
}

fn cstring(p: &Path) -> Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::invalid(format!("path {}", p.display()), "contains NUL"))
}

fn bind_mount(src: &str, dst: &Path) -> std::io::Result<()> {
    let src = std::ffi::CString::new(src).map_err(std::io::Error::other)?;
    let dst = cstring(dst).map_err(std::io::Error::other)?;
    // SAFETY: plain system call with NUL-terminated paths and no data.
    let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
