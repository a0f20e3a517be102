//! `sdn-node run --writable-proc-sys-net`: makes /proc/sys/net, and only it, writable in the
//! agent's own mount namespace, with the two mounts `mount --bind /proc/sys/net /proc/sys/net;
//! mount -o remount,bind,rw /proc/sys/net` would do, so that the image needs no shell and no
//! `mount` binary. Container runtimes mount all of /proc/sys read-only in a container that is
//! not privileged, and refuse volumes inside /proc; the agent writes net.* sysctls
//! (ip_forward, tun0's forwarding, the veths' arp_ignore). Needs CAP_SYS_ADMIN (which the agent
//! holds anyway, for setns). Writes there still need CAP_NET_ADMIN over the network namespace.

use std::ffi::CString;

const DIR: &str = "/proc/sys/net";

/// The two mounts; an error names the one that failed.
pub fn make_writable() -> Result<(), String> {
    let dir = CString::new(DIR).expect("no NUL");
    // SAFETY: valid NUL-terminated strings; null fstype/data are allowed for bind mounts.
    if unsafe { libc::mount(dir.as_ptr(), dir.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) } != 0 {
        return Err(format!("bind-mounting {DIR} onto itself: {}", std::io::Error::last_os_error()));
    }
    // The remount keeps the flags the bind mount has (nosuid, nodev, noexec: a remount that
    // dropped one would be refused where they are locked), all but read-only.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and a statvfs to fill.
    if unsafe { libc::statvfs(dir.as_ptr(), &mut st) } != 0 {
        return Err(format!("statvfs {DIR}: {}", std::io::Error::last_os_error()));
    }
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    // SAFETY: as above.
    if unsafe { libc::mount(std::ptr::null(), dir.as_ptr(), std::ptr::null(), flags, std::ptr::null()) } != 0 {
        return Err(format!("remounting {DIR} read-write: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
