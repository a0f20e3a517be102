//! TX checksum offload through the legacy ethtool ioctl (`ETHTOOL_GTXCSUM`/`ETHTOOL_STXCSUM`).
//!
//! Why: a veth peer hands packets to OVS with CHECKSUM_PARTIAL, i.e. the checksum not yet
//! computed. OVS's kernel datapath copes, but the userspace (netdev) datapath forwards them as
//! they are, so TCP/UDP from the pod arrives with a bad checksum and is dropped. Turning TX
//! checksum offload off on the pod side makes the pod's stack compute checksums itself.
//!
//! The ioctl acts on the namespace of the *socket* it is issued on, so these functions must run
//! inside the pod namespace (`Netns::run`).

use std::{
    io,
    os::fd::{FromRawFd, OwnedFd},
};

use crate::{
    error::{Error, Result},
    names::check_ifname,
};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with the `ifr_data` member of its union, padded to the kernel's size (40).
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a valid, fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ethtool_value(ifname: &str, cmd: u32, data: u32) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let sock = ioctl_socket()?;
    let mut value = EthtoolValue { cmd, data };
    let mut req =
        IfreqData { name: [0; libc::IFNAMSIZ], data: (&mut value as *mut EthtoolValue).cast(), _pad: [0; 16] };
    for (dst, src) in req.name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: `req` is a correctly laid out ifreq whose data pointer refers to `value`, both
    // alive for the duration of the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &mut req as *mut IfreqData) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value.data)
}

/// Whether TX checksum offload is on for `ifname` (in the calling thread's namespace).
pub fn tx_checksum(ifname: &str) -> Result<bool> {
    check_ifname(ifname)?;
    ethtool_value(ifname, ETHTOOL_GTXCSUM, 0)
        .map(|v| v != 0)
        .map_err(|e| Error::io("get tx checksum offload of", ifname, e))
}

/// Turns TX checksum offload on or off for `ifname` (in the calling thread's namespace).
pub fn set_tx_checksum(ifname: &str, on: bool) -> Result<()> {
    check_ifname(ifname)?;
    ethtool_value(ifname, ETHTOOL_STXCSUM, u32::from(on))
        .map(drop)
        .map_err(|e| Error::io("set tx checksum offload of", ifname, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_has_kernel_size() {
        assert_eq!(std::mem::size_of::<IfreqData>(), 40);
    }
}
