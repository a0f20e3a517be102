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
