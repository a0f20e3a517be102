//! The agent's file descriptor limit. Every pod request, namespace handle, netlink socket and
//! connection costs descriptors; the usual soft limit of 1,024 is far below what the kernel
//! lets a process raise itself to (the hard limit), and running out stalls everything at
//! once (accept, sandbox opens, netlink). So `run` raises the soft limit to the hard one at
//! start; the listeners' connection caps (`api::serve`) keep the rest bounded within even
//! 1,024.

/// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns (before, after).
pub fn raise_nofile() -> std::io::Result<(u64, u64)> {
    // SAFETY: getrlimit/setrlimit write/read the struct we pass; no other preconditions.
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = l.rlim_cur;
    if l.rlim_cur < l.rlim_max {
        let raised = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        l = raised;
    }
    Ok((before, l.rlim_cur))
}
