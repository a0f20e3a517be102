//! Sending an nf_tables batch on a NETLINK_NETFILTER socket and collecting the kernel's
//! per-message acknowledgements. Blocking, with a receive timeout; call it inside the target
//! namespace (`Netns::run`). Replies are parsed defensively: a malformed one is an error, never
//! a panic.

use std::{
    collections::BTreeSet,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use nftnl::FinalizedBatch;

use crate::error::{Error, Result};

/// Deadline for the kernel to acknowledge a whole batch.
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(5);

const NLMSG_HDRLEN: usize = 16;

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // A short receive timeout lets the loop below check its overall deadline.
    let tv = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
    // SAFETY: valid fd, option value points to a live timeval of the stated size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Sends `batch` (whose object messages are described by `names`, in order) and waits until
/// the kernel acknowledged every message, or returns the first NACK naming its object.
pub(crate) fn send_batch(batch: &FinalizedBatch, names: &[String]) -> Result<()> {
    let what = names.last().map(String::as_str).unwrap_or("nftables batch");
    let fd = socket().map_err(|e| Error::io("open netfilter socket for", what, e))?;
    // The kernel takes a batch from one message buffer: concatenate the pages.
    let buf: Vec<u8> = batch.iter().flatten().copied().collect();
    // SAFETY: zeroed sockaddr_nl is valid; pid 0 addresses the kernel.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: buffer and address are live and sized as stated.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            0,
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 || sent as usize != buf.len() {
        return Err(Error::io("send", what, io::Error::last_os_error()));
    }

    let seqs = batch.sequence_numbers();
    // Kernels from 6.10 on also ack the batch begin/end messages, and nftnl numbers them.
    let first_object = if seqs.len() == names.len() + 2 { seqs.start + 1 } else { seqs.start };
    let describe = |seq: u32| -> String {
        seq.checked_sub(first_object)
            .and_then(|i| names.get(i as usize))
            .cloned()
            .unwrap_or_else(|| format!("nftables batch message {seq}"))
    };
    let mut pending: BTreeSet<u32> = seqs.collect();
    let deadline = Instant::now() + BATCH_TIMEOUT;
    let mut rbuf = vec![0u8; 64 * 1024];
    while !pending.is_empty() {
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                op: "wait for acknowledgement of",
                object: describe(*pending.first().unwrap_or(&0)),
                after: BATCH_TIMEOUT,
            });
        }
        // SAFETY: rbuf is live and of the stated length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), rbuf.as_mut_ptr().cast(), rbuf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                _ => return Err(Error::io("receive acknowledgement for", what, e)),
            }
        }
        for ack in
            parse_acks(&rbuf[..n as usize]).map_err(|reason| Error::Reply { object: what.to_string(), reason })?
        {
            if ack.errno != 0 {
                return Err(Error::io("apply", describe(ack.seq), io::Error::from_raw_os_error(ack.errno)));
            }
            pending.remove(&ack.seq);
        }
    }
    Ok(())
}

/// One NLMSG_ERROR reply: errno 0 is an acknowledgement.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Ack {
    pub seq: u32,
    pub errno: i32,
}

/// Extracts the NLMSG_ERROR messages from one datagram; other message types are skipped.
pub(crate) fn parse_acks(mut data: &[u8]) -> Result<Vec<Ack>, String> {
    let mut acks = Vec::new();
    while data.len() >= NLMSG_HDRLEN {
        let len = u32_at(data, 0)? as usize;
        if len < NLMSG_HDRLEN || len > data.len() {
            return Err(format!("netlink message length {len} with {} bytes left", data.len()));
        }
        let ty = u16::from_ne_bytes([data[4], data[5]]);
        let seq = u32_at(data, 8)?;
        if ty == libc::NLMSG_ERROR as u16 {
            let code =
                i32::from_ne_bytes(data.get(16..20).and_then(|b| b.try_into().ok()).ok_or("truncated NLMSG_ERROR")?);
            acks.push(Ack { seq, errno: code.checked_neg().unwrap_or(i32::MAX) });
        }
        let aligned = (len + 3) & !3;
        data = data.get(aligned..).unwrap_or(&[]);
    }
    Ok(acks)
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, String> {
    data.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or_else(|| "truncated netlink header".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let len = (NLMSG_HDRLEN + payload.len()) as u32;
        let mut v = Vec::new();
        v.extend_from_slice(&len.to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(payload);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    #[test]
    fn parses_acks_and_nacks() {
        let mut d = msg(2, 7, &0i32.to_ne_bytes());
        d.extend(msg(2, 8, &(-libc::ENOENT).to_ne_bytes()));
        d.extend(msg(3, 9, &[]));
        assert_eq!(parse_acks(&d).unwrap(), vec![Ack { seq: 7, errno: 0 }, Ack { seq: 8, errno: libc::ENOENT }]);
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let good = msg(2, 1, &0i32.to_ne_bytes());
        for cut in 0..good.len() {
            let _ = parse_acks(&good[..cut]);
        }
        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse_acks(&bad).is_err());
        let mut short = msg(2, 1, &[]);
        short[0..4].copy_from_slice(&16u32.to_ne_bytes());
        assert!(parse_acks(&short).is_err());
        assert!(parse_acks(&[0u8; 3]).unwrap().is_empty());
    }
}
