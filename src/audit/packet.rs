//! The connection a logged packet belongs to: protocol, addresses and ports.
//!
//! Ethernet, VLAN tags and the IPv4 header are read by `etherparse` in its lax mode: the switch
//! sends only the packet's first bytes (`max_len` of the controller action), so the IP total
//! length usually points past the end, which the strict parser refuses. The ports are the first
//! four bytes of the IP payload for TCP, UDP and SCTP alike (and type, code for ICMP), so they
//! are taken from there even when the rest of the L4 header was cut off.

use std::net::Ipv4Addr;

use etherparse::{IpNumber, LaxNetSlice, LaxSlicedPacket};

/// What was read from the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow5 {
    pub proto: Proto,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// TCP/UDP/SCTP source port, ICMP type; `None` for a later fragment or a cut header.
    pub src_port: Option<u16>,
    /// TCP/UDP/SCTP destination port, ICMP code.
    pub dst_port: Option<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    Other(u8),
}

impl Proto {
    pub fn name(self) -> String {
        match self {
            Proto::Tcp => "tcp".into(),
            Proto::Udp => "udp".into(),
            Proto::Sctp => "sctp".into(),
            Proto::Icmp => "icmp".into(),
            Proto::Other(n) => n.to_string(),
        }
    }
}

/// Why a packet gave no connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("packet: no Ethernet header ({0})")]
    Ethernet(String),
    #[error("packet: not IPv4")]
    NotIpv4,
}

/// Reads the connection of an Ethernet frame (possibly cut short). Never panics.
pub fn parse(frame: &[u8]) -> Result<Flow5, PacketError> {
    let p = LaxSlicedPacket::from_ethernet(frame).map_err(|e| PacketError::Ethernet(e.to_string()))?;
    let Some(LaxNetSlice::Ipv4(ip)) = &p.net else { return Err(PacketError::NotIpv4) };
    let h = ip.header();
    let payload = ip.payload();
    let proto = match payload.ip_number {
        IpNumber::TCP => Proto::Tcp,
        IpNumber::UDP => Proto::Udp,
        IpNumber::SCTP => Proto::Sctp,
        IpNumber::ICMP => Proto::Icmp,
        n => Proto::Other(n.0),
    };
    // A fragment other than the first has no L4 header; its bytes are data.
    let first_fragment = h.fragments_offset().value() == 0;
    let b = payload.payload;
    let (src_port, dst_port) = match proto {
        _ if !first_fragment => (None, None),
        Proto::Tcp | Proto::Udp | Proto::Sctp => match b {
            [a, b2, c, d, ..] => (Some(u16::from_be_bytes([*a, *b2])), Some(u16::from_be_bytes([*c, *d]))),
            _ => (None, None),
        },
        Proto::Icmp => match b {
            [t, c, ..] => (Some(*t as u16), Some(*c as u16)),
            _ => (None, None),
        },
        Proto::Other(_) => (None, None),
    };
    Ok(Flow5 { proto, src: h.source_addr(), dst: h.destination_addr(), src_port, dst_port })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    pub(crate) fn tcp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(src, dst, 64).tcp(sport, dport, 1, 1024).syn();
        let mut v = Vec::new();
        b.write(&mut v, &[0u8; 200]).unwrap();
        v
    }

    #[test]
    fn cut_tcp_frame() {
        let f = tcp_frame([10, 128, 0, 2], [10, 128, 0, 4], 40000, 5432);
        // As the switch sends it: the first 128 bytes of a longer packet.
        let got = parse(&f[..128]).unwrap();
        assert_eq!(
            got,
            Flow5 { proto: Proto::Tcp, src: [10, 128, 0, 2].into(), dst: [10, 128, 0, 4].into(), src_port: Some(40000), dst_port: Some(5432) }
        );
        // Cut inside the TCP header, after the ports: still the ports.
        assert_eq!(parse(&f[..14 + 20 + 4]).unwrap().dst_port, Some(5432));
        // Cut before the ports: the addresses only.
        assert_eq!(parse(&f[..14 + 20 + 2]).unwrap().dst_port, None);
    }

    #[test]
    fn udp_sctp_icmp() {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([0; 6], [0; 6]).ipv4([1, 1, 1, 1], [2, 2, 2, 2], 9).udp(53, 5353).write(&mut v, &[1, 2]).unwrap();
        let f = parse(&v).unwrap();
        assert_eq!((f.proto, f.src_port, f.dst_port), (Proto::Udp, Some(53), Some(5353)));
        let mut v = Vec::new();
        PacketBuilder::ethernet2([0; 6], [0; 6]).ipv4([1, 1, 1, 1], [2, 2, 2, 2], 9).icmpv4_echo_request(1, 2).write(&mut v, &[]).unwrap();
        let f = parse(&v).unwrap();
        assert_eq!((f.proto, f.src_port, f.dst_port), (Proto::Icmp, Some(8), Some(0)));
        // SCTP (132): common header starts with the ports.
        let mut v = Vec::new();
        PacketBuilder::ethernet2([0; 6], [0; 6])
            .ipv4([1, 1, 1, 1], [2, 2, 2, 2], 9)
            .write(&mut v, IpNumber::SCTP, &[0x0b, 0xb8, 0x0b, 0xb9, 0, 0, 0, 0])
            .unwrap();
        let f = parse(&v).unwrap();
        assert_eq!((f.proto, f.src_port, f.dst_port), (Proto::Sctp, Some(3000), Some(3001)));
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        assert!(parse(&[]).is_err());
        assert!(parse(&[0u8; 13]).is_err());
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        assert_eq!(parse(&arp), Err(PacketError::NotIpv4));
        let f = tcp_frame([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        for n in 0..f.len().min(80) {
            let _ = parse(&f[..n]);
        }
        let mut x: u32 = 7;
        for _ in 0..2000 {
            let v: Vec<u8> = (0..64)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect();
            let mut g = f[..14].to_vec();
            g.extend_from_slice(&v);
            let _ = parse(&g);
        }
    }
}
