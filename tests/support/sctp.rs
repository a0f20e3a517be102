//! Hand-built SCTP packets over raw IP sockets (protocol 132), for kernels without the SCTP
//! module: `socket(AF_INET, SOCK_RAW, IPPROTO_SCTP)` still sends and receives IP packets of
//! protocol 132 (the kernel adds the IPv4 header on send and keeps it on receive).
//!
//! A packet is the 12-byte common header (source port, destination port, verification tag,
//! CRC32c checksum; RFC 9260 section 3) and one chunk: INIT (type 1) from the prober, INIT ACK
//! (type 2) from the [`Responder`], whose verification tag is the INIT's Initiate Tag, with a
//! State Cookie parameter, as an SCTP endpoint answers.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::nodes::in_netns;

pub const IPPROTO_SCTP: i32 = 132;
pub const CHUNK_INIT: u8 = 1;
pub const CHUNK_INIT_ACK: u8 = 2;

/// CRC32c (Castagnoli, reflected polynomial 0x82F63B78), as SCTP's checksum.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    !crc
}

/// An SCTP packet with one INIT or INIT ACK chunk, checksum filled in.
pub fn packet(sport: u16, dport: u16, vtag: u32, chunk: u8, initiate_tag: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(48);
    p.extend(sport.to_be_bytes());
    p.extend(dport.to_be_bytes());
    p.extend(vtag.to_be_bytes());
    p.extend([0u8; 4]);
    let cookie: &[u8] = if chunk == CHUNK_INIT_ACK { b"cookie!!" } else { b"" };
    // Type, flags, length; Initiate Tag, a_rwnd, outbound and inbound streams, initial TSN.
    let params_len = if cookie.is_empty() { 0 } else { 4 + cookie.len() };
    let chunk_len = 20 + params_len;
    p.extend([chunk, 0]);
    p.extend((chunk_len as u16).to_be_bytes());
    p.extend(initiate_tag.to_be_bytes());
    p.extend(65_536u32.to_be_bytes());
    p.extend(1u16.to_be_bytes());
    p.extend(1u16.to_be_bytes());
    p.extend(initiate_tag.wrapping_add(7).to_be_bytes());
    if !cookie.is_empty() {
        // State Cookie parameter (type 7).
        p.extend(7u16.to_be_bytes());
        p.extend(((4 + cookie.len()) as u16).to_be_bytes());
        p.extend(cookie);
    }
    // The CRC32c goes into the packet in little-endian byte order (as Linux and RFC 9260
    // appendix A's reference code store it).
    let crc = crc32c(&p);
    p[8..12].copy_from_slice(&crc.to_le_bytes());
    p
}

/// What a received IPv4 packet of protocol 132 carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub vtag: u32,
    pub chunk: u8,
    pub initiate_tag: u32,
}

/// Parses an IPv4 packet (as a raw socket delivers it: IP header first) holding an SCTP
/// packet whose first chunk is INIT or INIT ACK with a valid checksum; `None` otherwise.
pub fn parse(ip: &[u8]) -> Option<Received> {
    let ihl = (*ip.first()? & 0x0f) as usize * 4;
    if ip.len() < ihl + 12 + 20 || ip[9] as i32 != IPPROTO_SCTP || ihl < 20 {
        return None;
    }
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let s = ip.get(ihl..total.min(ip.len()))?;
    let mut zeroed = s.to_vec();
    zeroed[8..12].fill(0);
    if crc32c(&zeroed).to_le_bytes() != s[8..12] {
        return None;
    }
    let u16at = |i: usize| u16::from_be_bytes([s[i], s[i + 1]]);
    let u32at = |i: usize| u32::from_be_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    Some(Received {
        src: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        dst: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        sport: u16at(0),
        dport: u16at(2),
        vtag: u32at(4),
        chunk: s[12],
        initiate_tag: u32at(16),
    })
}

/// A raw IPv4 socket of protocol 132.
pub struct RawSctp(OwnedFd);

impl RawSctp {
    /// Opens one inside network namespace `ns`, with a receive timeout of `poll`.
    pub async fn open(ns: &str, poll: Duration) -> RawSctp {
        let fd = in_netns(ns, || {
            // SAFETY: plain socket(2); the fd is owned right away.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, IPPROTO_SCTP) };
            assert!(fd >= 0, "raw socket (protocol 132): {}", std::io::Error::last_os_error());
            // SAFETY: fd is a fresh descriptor nobody else owns.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .await;
        let tv = libc::timeval { tv_sec: poll.as_secs() as libc::time_t, tv_usec: poll.subsec_micros() as libc::suseconds_t };
        // SAFETY: setsockopt with a timeval of the right size on an open fd.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
        RawSctp(fd)
    }

    /// Sends an SCTP packet to `dst` (the kernel adds the IP header).
    pub fn send(&self, dst: Ipv4Addr, sctp: &[u8]) -> std::io::Result<()> {
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from(dst).to_be() },
            sin_zero: [0; 8],
        };
        // SAFETY: buffer and sockaddr_in are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                sctp.as_ptr() as *const libc::c_void,
                sctp.len(),
                0,
                &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next packet (IP header included), or `None` when the receive timeout passed.
    pub fn recv(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n < 0 {
            return None;
        }
        buf.truncate(n as usize);
        Some(buf)
    }
}

/// Answers every INIT addressed to `ip` with an INIT ACK (ports swapped, verification tag =
/// the INIT's Initiate Tag) and records each INIT it saw.
pub struct Responder {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Received>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Responder {
    pub async fn start(ns: &str, ip: Ipv4Addr) -> Responder {
        let sock = RawSctp::open(ns, Duration::from_millis(100)).await;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (st, se) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Some(pkt) = sock.recv() else { continue };
                let Some(r) = parse(&pkt) else { continue };
                if r.chunk != CHUNK_INIT || r.dst != ip || r.vtag != 0 {
                    continue;
                }
                se.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                let answer = packet(r.dport, r.sport, r.initiate_tag, CHUNK_INIT_ACK, r.initiate_tag ^ 0x5a5a_5a5a);
                if let Err(e) = sock.send(r.src, &answer) {
                    eprintln!("sctp responder {ip}: send to {}: {e}", r.src);
                }
            }
        });
        Responder { stop, seen, thread: Some(thread) }
    }

    /// Did an INIT from `src` with these ports and Initiate Tag arrive?
    pub fn saw(&self, src: Ipv4Addr, sport: u16, dport: u16, tag: u32) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|r| r.src == src && r.sport == sport && r.dport == dport && r.initiate_tag == tag)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends an INIT from a pod (netns `ns`) to `dst:dport` from `sport` with Initiate Tag
/// `tag`; true if the matching INIT ACK came back within `timeout`.
pub async fn init(ns: &str, dst: Ipv4Addr, sport: u16, dport: u16, tag: u32, timeout: Duration) -> bool {
    let sock = RawSctp::open(ns, Duration::from_millis(50)).await;
    tokio::task::spawn_blocking(move || {
        if let Err(e) = sock.send(dst, &packet(sport, dport, 0, CHUNK_INIT, tag)) {
            eprintln!("sctp INIT to {dst}:{dport}: {e}");
            return false;
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let Some(pkt) = sock.recv() else { continue };
            if let Some(r) = parse(&pkt) {
                if r.chunk == CHUNK_INIT_ACK && r.src == dst && r.sport == dport && r.dport == sport && r.vtag == tag {
                    return true;
                }
            }
        }
        false
    })
    .await
    .expect("sctp probe thread")
}
