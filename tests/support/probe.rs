//! One-packet probes between pod sandboxes: a UDP datagram sent the instant a test decides,
//! and a packet capture on the receiving side that says whether that very datagram arrived.
//!
//! Why not ping or a TCP connect: a process started with `ip netns exec` leaves milliseconds
//! after it is asked to, and a connect retransmits, so neither says what happened to a packet
//! sent in the first millisecond. Here both sockets are made inside the sandboxes beforehand
//! (the capture before the pod even has an interface: an `AF_PACKET` socket bound to no
//! interface sees every interface its namespace gets), the send is one system call, and each
//! probe carries a marker, so exactly one datagram is judged per probe — whether it arrives is
//! decided by the capture, not by how long anyone waited for an answer.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// What every probe's payload starts with (then the marker, 4 bytes big-endian).
const MAGIC: &[u8] = b"sdn-node-probe";
/// The port probes go to (discard: nobody listens, the capture sees it anyway).
const PORT: u16 = 9;

/// Which way a probe crosses a pod's NetworkPolicy: into the pod (ingress: another pod sends
/// to it) or out of it (egress: the pod sends). Egress is not enforced yet; when it is, its
/// first-packet check is the same call with `Direction::Egress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

/// A pod sandbox's probe sockets.
pub struct Endpoint {
    pub netns: String,
    udp: UdpSocket,
    capture: OwnedFd,
    /// Markers captured so far, with their source address.
    seen: BTreeSet<(Ipv4Addr, u32)>,
}

impl Endpoint {
    /// Opens both sockets inside network namespace `netns` (a path), before or after the pod
    /// has its interface.
    pub async fn open(netns: &str) -> Endpoint {
        let ns = hostnet::Netns::open(netns).expect("open the sandbox's namespace");
        let (udp, capture) = ns
            .run("open probe sockets", || {
                let udp = UdpSocket::bind("0.0.0.0:0")
                    .map_err(|e| hostnet::Error::Invalid { what: "udp".into(), reason: e.to_string() })?;
                // SAFETY: plain system call; the result is checked and owned at once.
                let fd = unsafe {
                    libc::socket(
                        libc::AF_PACKET,
                        libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                        (libc::ETH_P_IP as u16).to_be() as i32,
                    )
                };
                if fd < 0 {
                    let e = std::io::Error::last_os_error();
                    return Err(hostnet::Error::Invalid { what: "AF_PACKET socket".into(), reason: e.to_string() });
                }
                // SAFETY: `fd` is a fresh descriptor nobody else owns.
                Ok((udp, unsafe { OwnedFd::from_raw_fd(fd) }))
            })
            .await
            .expect("probe sockets in the sandbox");
        Endpoint { netns: netns.to_string(), udp, capture, seen: BTreeSet::new() }
    }

    /// Sends probe `marker` to `to`; returns when the datagram left the socket.
    pub fn send(&self, to: Ipv4Addr, marker: u32) -> Instant {
        let mut payload = MAGIC.to_vec();
        payload.extend_from_slice(&marker.to_be_bytes());
        self.udp.send_to(&payload, SocketAddr::from((to, PORT))).expect("send a probe");
        Instant::now()
    }

    /// Reads what the capture holds (incoming packets only: its own probes are not counted).
    fn drain(&mut self) {
        let mut buf = [0u8; 2048];
        loop {
            // SAFETY: zeroed sockaddr_ll is a valid value; the lengths passed are the buffers'.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            let n = unsafe {
                libc::recvfrom(
                    self.capture.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                return;
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            if let Some(probe) = parse(&buf[..n as usize]) {
                self.seen.insert(probe);
            }
        }
    }

    /// Whether probe `marker` from `from` has arrived (so far).
    pub fn got(&mut self, from: Ipv4Addr, marker: u32) -> bool {
        self.drain();
        self.seen.contains(&(from, marker))
    }

    /// Waits for probe `marker` from `from` (bounded by `bound`, a hang guard, not a verdict
    /// on speed); true if it arrived.
    pub async fn wait_for(&mut self, from: Ipv4Addr, marker: u32, bound: Duration) -> bool {
        let end = Instant::now() + bound;
        while Instant::now() < end {
            if self.got(from, marker) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.got(from, marker)
    }
}

/// (source, marker) of a probe datagram (an IPv4 packet from the capture), if it is one.
fn parse(p: &[u8]) -> Option<(Ipv4Addr, u32)> {
    if p.len() < 20 || p[0] >> 4 != 4 || p[9] != 17 {
        return None;
    }
    let ihl = usize::from(p[0] & 0xf) * 4;
    let payload = p.get(ihl + 8..)?;
    let marker = payload.strip_prefix(MAGIC)?.get(..4)?;
    let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
    Some((src, u32::from_be_bytes([marker[0], marker[1], marker[2], marker[3]])))
}

/// The probe across `pod`'s policy in direction `dir`, with `peer` on the other side: who
/// sends, who captures, and the sender's address.
pub fn sides<'a>(
    dir: Direction,
    pod: &'a mut Endpoint,
    peer: &'a mut Endpoint,
) -> (&'a mut Endpoint, &'a mut Endpoint) {
    match dir {
        Direction::Ingress => (peer, pod),
        Direction::Egress => (pod, peer),
    }
}
