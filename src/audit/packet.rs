//! The connection a logged packet belongs to: protocol, addresses and ports.
//!
//! Ethernet, VLAN tags, the IPv4 header, the IPv6 header and its extension headers are read by
//! `etherparse` in its lax mode: the switch sends only the packet's first bytes (`max_len` of
//! the controller action), so the IP total length usually points past the end, which the
//! strict parser refuses. IPv6 extension headers (hop-by-hop, routing, fragment, destination
//! options, authentication) are skipped as etherparse walks them, so the protocol is the one
//! after the last of them. The ports are the first four bytes of the IP payload for TCP, UDP
//! and SCTP alike (and type, code for ICMP and ICMPv6), so they are taken from there even when
//! the rest of the L4 header was cut off.

use std::net::IpAddr;

use etherparse::{EtherType, IpNumber, LaxIpPayloadSlice, LaxNetSlice, LaxSlicedPacket};

/// What was read from the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow5 {
    pub proto: Proto,
    /// Both of one family: the packet's IPv4 or IPv6 header.
    pub src: IpAddr,
    pub dst: IpAddr,
    /// TCP/UDP/SCTP source port, ICMP/ICMPv6 type; `None` for a later fragment or a cut header.
    pub src_port: Option<u16>,
    /// TCP/UDP/SCTP destination port, ICMP/ICMPv6 code.
    pub dst_port: Option<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    /// ICMP for IPv6 (IP protocol 58), a protocol of its own.
    Icmpv6,
    /// Any other IP protocol number. For IPv6 also an extension header etherparse could not
    /// read past (cut short or malformed): the number of the header where reading stopped.
    Other(u8),
}

impl Proto {
    pub fn name(self) -> String {
        match self {
            Proto::Tcp => "tcp".into(),
            Proto::Udp => "udp".into(),
            Proto::Sctp => "sctp".into(),
            Proto::Icmp => "icmp".into(),
            Proto::Icmpv6 => "icmpv6".into(),
            Proto::Other(n) => n.to_string(),
        }
    }

    /// ICMP or ICMPv6: the first two payload bytes are type and code, not ports.
    pub fn is_icmp(self) -> bool {
        matches!(self, Proto::Icmp | Proto::Icmpv6)
    }

    fn of(n: IpNumber) -> Proto {
        match n {
            IpNumber::TCP => Proto::Tcp,
            IpNumber::UDP => Proto::Udp,
            IpNumber::SCTP => Proto::Sctp,
            IpNumber::ICMP => Proto::Icmp,
            IpNumber::IPV6_ICMP => Proto::Icmpv6,
            n => Proto::Other(n.0),
        }
    }
}

/// Why a packet gave no connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("packet: no Ethernet header ({0})")]
    Ethernet(String),
    /// Neither IPv4 nor IPv6 (ARP, another EtherType, an IP version that is not the
    /// EtherType's), or an IP header too short or malformed to give both addresses.
    #[error("packet: not IPv4 or IPv6")]
    NotIp,
}

/// Reads the connection of an Ethernet frame (possibly cut short). Never panics.
pub fn parse(frame: &[u8]) -> Result<Flow5, PacketError> {
    let p = LaxSlicedPacket::from_ethernet(frame).map_err(|e| PacketError::Ethernet(e.to_string()))?;
    // etherparse picks the IP family by the header's version nibble; the switch (as OVS's
    // flow extraction) by the EtherType, and refuses a version that disagrees with it.
    let ether_type = p.ether_payload().map(|e| e.ether_type);
    match &p.net {
        Some(LaxNetSlice::Ipv4(ip)) if ether_type == Some(EtherType::IPV4) => {
            let h = ip.header();
            // A fragment other than the first has no L4 header; its bytes are data.
            let first_fragment = h.fragments_offset().value() == 0;
            Ok(flow(h.source_addr().into(), h.destination_addr().into(), ip.payload(), first_fragment))
        }
        Some(LaxNetSlice::Ipv6(ip)) if ether_type == Some(EtherType::IPV6) => {
            let h = ip.header();
            let exts = ip.extensions();
            let first_fragment = !later_fragment(exts.first_header(), exts.slice());
            Ok(flow(h.source_addr().into(), h.destination_addr().into(), ip.payload(), first_fragment))
        }
        _ => Err(PacketError::NotIp),
    }
}

/// Whether a fragment header among `exts` (the IPv6 extension headers etherparse walked,
/// starting with header type `first`) puts the payload at a non-zero offset: a later fragment,
/// whose first bytes are data. The first fragment (offset 0) carries the L4 header.
///
/// Walked here with checked indexing rather than with etherparse's `Ipv6ExtensionSliceIter`:
/// in etherparse 0.21, when lax parsing stopped at a header it could not read (cut short, or
/// hop-by-hop not first), that iterator goes on to that header and reads it with unchecked
/// indexing past the end of the slice (found by this module's tests: an abort in debug builds,
/// an out-of-bounds read in release).
fn later_fragment(first: Option<IpNumber>, mut rest: &[u8]) -> bool {
    let Some(mut next) = first else { return false };
    while let [nh, len, ..] = rest {
        let size = match next {
            IpNumber::IPV6_HEADER_HOP_BY_HOP | IpNumber::IPV6_ROUTE_HEADER | IpNumber::IPV6_DESTINATION_OPTIONS => (usize::from(*len) + 1) * 8,
            IpNumber::IPV6_FRAGMENTATION_HEADER => {
                // Bytes 2-3: the offset in 8-byte units (13 bits), two reserved bits, M.
                if let [_, _, hi, lo, ..] = rest {
                    if u16::from_be_bytes([*hi, *lo]) >> 3 != 0 {
                        return true;
                    }
                }
                8
            }
            IpNumber::AUTHENTICATION_HEADER => (usize::from(*len) + 2) * 4,
            _ => return false,
        };
        next = IpNumber(*nh);
        rest = rest.get(size..).unwrap_or_default();
    }
    false
}

/// The protocol and ports of an IP payload (after any extension headers).
fn flow(src: IpAddr, dst: IpAddr, payload: &LaxIpPayloadSlice<'_>, first_fragment: bool) -> Flow5 {
    let proto = Proto::of(payload.ip_number);
    let b = payload.payload;
    let (src_port, dst_port) = match proto {
        _ if !first_fragment => (None, None),
        Proto::Tcp | Proto::Udp | Proto::Sctp => match b {
            [a, b2, c, d, ..] => (Some(u16::from_be_bytes([*a, *b2])), Some(u16::from_be_bytes([*c, *d]))),
            _ => (None, None),
        },
        Proto::Icmp | Proto::Icmpv6 => match b {
            [t, c, ..] => (Some(*t as u16), Some(*c as u16)),
            _ => (None, None),
        },
        Proto::Other(_) => (None, None),
    };
    Flow5 { proto, src, dst, src_port, dst_port }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use etherparse::{IpHeaders, Ipv6Extensions, Ipv6Header, Ipv6RawExtHeader, PacketBuilder};
    use std::net::Ipv6Addr;

    pub(crate) fn tcp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(src, dst, 64).tcp(sport, dport, 1, 1024).syn();
        let mut v = Vec::new();
        b.write(&mut v, &[0u8; 200]).unwrap();
        v
    }

    /// A TCP SYN over IPv6 (checksums computed), with 200 bytes after the TCP header.
    pub(crate) fn tcp6_frame(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv6(src.octets(), dst.octets(), 64).tcp(sport, dport, 1, 1024).syn();
        let mut v = Vec::new();
        b.write(&mut v, &[0u8; 200]).unwrap();
        v
    }

    /// An ICMPv6 echo request (type 128, code 0).
    pub(crate) fn ping6_frame(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv6(src.octets(), dst.octets(), 64).icmpv6_echo_request(7, 1).write(&mut v, &[0xab; 56]).unwrap();
        v
    }

    const A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x128, 1, 0, 0, 0, 5);
    const B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x128, 2, 0, 0, 0, 6);

    /// An Ethernet + IPv6 header (payload length from `rest`, next header `next`), then `rest`.
    fn ipv6_by_hand(next: u8, rest: &[u8]) -> Vec<u8> {
        let mut v = vec![0x33, 0x33, 0, 0, 0, 0x16, 0x0a, 0x58, 0x0a, 0x80, 0, 5, 0x86, 0xdd];
        v.extend_from_slice(&[0x60, 0, 0, 0]);
        v.extend_from_slice(&(rest.len() as u16).to_be_bytes());
        v.extend_from_slice(&[next, 64]);
        v.extend_from_slice(&A6.octets());
        v.extend_from_slice(&B6.octets());
        v.extend_from_slice(rest);
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
    fn ipv6_tcp_syn_cut_as_the_switch_sends_it() {
        let f = tcp6_frame(A6, B6, 40000, 8080);
        assert_eq!(&f[12..14], &[0x86, 0xdd]);
        let want = Flow5 { proto: Proto::Tcp, src: A6.into(), dst: B6.into(), src_port: Some(40000), dst_port: Some(8080) };
        assert_eq!(parse(&f), Ok(want));
        assert_eq!(parse(&f[..128]), Ok(want));
        // Cut after the ports, before them, right after the IPv6 header: ports while they are there.
        assert_eq!(parse(&f[..14 + 40 + 4]), Ok(want));
        assert_eq!(parse(&f[..14 + 40 + 3]), Ok(Flow5 { src_port: None, dst_port: None, ..want }));
        assert_eq!(parse(&f[..14 + 40]), Ok(Flow5 { src_port: None, dst_port: None, ..want }));
        // Cut inside the IPv6 header: no addresses, so no connection.
        assert_eq!(parse(&f[..14 + 39]), Err(PacketError::NotIp));
    }

    #[test]
    fn ipv6_udp_sctp_and_icmpv6_echo() {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([0; 6], [0; 6]).ipv6(A6.octets(), B6.octets(), 9).udp(5353, 53).write(&mut v, b"query").unwrap();
        assert_eq!(parse(&v), Ok(Flow5 { proto: Proto::Udp, src: A6.into(), dst: B6.into(), src_port: Some(5353), dst_port: Some(53) }));
        let mut v = Vec::new();
        PacketBuilder::ethernet2([0; 6], [0; 6]).ipv6(A6.octets(), B6.octets(), 9).write(&mut v, IpNumber::SCTP, &[0x0b, 0xb8, 0x0b, 0xb9, 0, 0, 0, 0]).unwrap();
        let f = parse(&v).unwrap();
        assert_eq!((f.proto, f.src_port, f.dst_port), (Proto::Sctp, Some(3000), Some(3001)));
        let f = parse(&ping6_frame(A6, B6)).unwrap();
        assert_eq!(f, Flow5 { proto: Proto::Icmpv6, src: A6.into(), dst: B6.into(), src_port: Some(128), dst_port: Some(0) });
        assert_eq!((f.proto.name(), f.proto.is_icmp()), ("icmpv6".to_string(), true));
        // Behind a VLAN tag.
        let mut v = Vec::new();
        PacketBuilder::ethernet2([0; 6], [0; 6])
            .single_vlan(etherparse::VlanId::try_new(100).unwrap())
            .ipv6(A6.octets(), B6.octets(), 9)
            .udp(5353, 53)
            .write(&mut v, b"query")
            .unwrap();
        assert_eq!(parse(&v), Ok(Flow5 { proto: Proto::Udp, src: A6.into(), dst: B6.into(), src_port: Some(5353), dst_port: Some(53) }));
        // ICMP (1) inside IPv6 is still ICMP by number, not ICMPv6.
        let v = ipv6_by_hand(1, &[8, 0, 0, 0]);
        assert_eq!(parse(&v).map(|f| f.proto), Ok(Proto::Icmp));
        // A protocol without ports: its number.
        let v = ipv6_by_hand(47, &[0, 0, 0x65, 0x58]);
        assert_eq!(parse(&v), Ok(Flow5 { proto: Proto::Other(47), src: A6.into(), dst: B6.into(), src_port: None, dst_port: None }));
    }

    #[test]
    fn ipv6_extension_headers_are_skipped() {
        // A TCP SYN behind a hop-by-hop header (router alert + PadN), built and checksummed by
        // etherparse.
        let mut h = Ipv6Header { source: A6.octets(), destination: B6.octets(), hop_limit: 64, ..Default::default() };
        h.next_header = IpNumber::IPV6_HEADER_HOP_BY_HOP;
        let exts = Ipv6Extensions { hop_by_hop_options: Some(Ipv6RawExtHeader::new_raw(IpNumber::TCP, &[5, 2, 0, 0, 1, 0]).unwrap()), ..Default::default() };
        let mut f = Vec::new();
        PacketBuilder::ethernet2([0; 6], [0; 6]).ip(IpHeaders::Ipv6(h, exts)).tcp(40001, 443, 1, 1024).syn().write(&mut f, &[]).unwrap();
        assert_eq!((f[14 + 6], f[14 + 40]), (0, 6), "IPv6 next header hop-by-hop, then TCP");
        assert_eq!(parse(&f), Ok(Flow5 { proto: Proto::Tcp, src: A6.into(), dst: B6.into(), src_port: Some(40001), dst_port: Some(443) }));
        // Cut inside the hop-by-hop header: the addresses, and the header where reading stopped.
        for n in 14 + 40..14 + 48 {
            assert_eq!(parse(&f[..n]), Ok(Flow5 { proto: Proto::Other(0), src: A6.into(), dst: B6.into(), src_port: None, dst_port: None }), "cut at {n}");
        }
        // An MLDv2 report laid out as Linux sends it when a pod joins ff15::101: hop-by-hop
        // (router alert), then ICMPv6 type 143 (the checksum is not computed: never read).
        let mut mld = vec![58, 0, 5, 2, 0, 0, 1, 0];
        mld.extend_from_slice(&[143, 0, 0x12, 0x34, 0, 0, 0, 1, 4, 0, 0, 0]);
        mld.extend_from_slice(&"ff15::101".parse::<Ipv6Addr>().unwrap().octets());
        let f = parse(&ipv6_by_hand(0, &mld)).unwrap();
        assert_eq!((f.proto, f.src_port, f.dst_port), (Proto::Icmpv6, Some(143), Some(0)));
        // Destination options then routing then UDP.
        let mut chain = vec![43, 0, 1, 4, 0, 0, 0, 0]; // dest options, PadN, next: routing
        chain.extend_from_slice(&[17, 0, 4, 0, 0, 0, 0, 0]); // routing, next: UDP
        chain.extend_from_slice(&[0x13, 0x88, 0x00, 0x35, 0, 8, 0, 0]);
        let f = parse(&ipv6_by_hand(60, &chain)).unwrap();
        assert_eq!((f.proto, f.src_port, f.dst_port), (Proto::Udp, Some(5000), Some(53)));
        // Hop-by-hop anywhere but first stops the walk there.
        let f = parse(&ipv6_by_hand(60, &[0, 0, 1, 4, 0, 0, 0, 0, 6, 0, 1, 4, 0, 0, 0, 0, 0, 1, 0, 2])).unwrap();
        assert_eq!((f.proto, f.src_port), (Proto::Other(0), None));
    }

    #[test]
    fn ipv6_fragments() {
        // First fragment (offset 0, more fragments): the UDP header is there.
        let first = [17, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef, 0x13, 0x88, 0x00, 0x35, 0x05, 0xdc, 0, 0];
        let f = parse(&ipv6_by_hand(44, &first)).unwrap();
        assert_eq!((f.proto, f.src_port, f.dst_port), (Proto::Udp, Some(5000), Some(53)));
        // A later one (offset 185 × 8 = 1480): its first bytes are data, not ports.
        let later = [17, 0, (185u16 << 3).to_be_bytes()[0], (185u16 << 3).to_be_bytes()[1], 0xde, 0xad, 0xbe, 0xef, 0x13, 0x88, 0x00, 0x35];
        let f = parse(&ipv6_by_hand(44, &later)).unwrap();
        assert_eq!((f.proto, f.src_port, f.dst_port), (Proto::Udp, None, None));
        // A fragment header cut short.
        let f = parse(&ipv6_by_hand(44, &first[..5])).unwrap();
        assert_eq!((f.proto, f.src_port), (Proto::Other(44), None));
    }

    /// Pseudo-random bytes (an LCG: the same every run).
    fn noise(x: &mut u32, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                *x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (*x >> 16) as u8
            })
            .collect()
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        assert!(parse(&[]).is_err());
        assert!(parse(&[0u8; 13]).is_err());
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        assert_eq!(parse(&arp), Err(PacketError::NotIp));
        let mut other = vec![0u8; 12];
        other.extend_from_slice(&[0x88, 0xcc]);
        other.extend_from_slice(&[0u8; 40]);
        assert_eq!(parse(&other), Err(PacketError::NotIp));
        // An IPv6 EtherType whose header says version 4, and the other way round: the switch
        // reads neither as IP.
        let mut v4_in_6 = ipv6_by_hand(6, &[0; 20]);
        v4_in_6[14] = 0x45;
        assert_eq!(parse(&v4_in_6), Err(PacketError::NotIp));
        let mut v6_in_4 = ipv6_by_hand(6, &[0; 20]);
        v6_in_4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(parse(&v6_in_4), Err(PacketError::NotIp));
        let f = tcp_frame([1, 1, 1, 1], [2, 2, 2, 2], 1, 2);
        for n in 0..f.len().min(80) {
            let _ = parse(&f[..n]);
        }
        let mut x: u32 = 7;
        for _ in 0..2000 {
            let mut g = f[..14].to_vec();
            g.extend_from_slice(&noise(&mut x, 64));
            let _ = parse(&g);
        }
    }

    /// Every cut of every IPv6 frame above, and random IPv6 payloads whose next headers are
    /// mostly extension headers (so the walk over them meets every kind of cut and bad
    /// length): an answer or an error, never a panic, and whenever there is an answer its
    /// addresses are the header's.
    #[test]
    fn ipv6_garbage_and_cuts_never_panic() {
        let frames = [tcp6_frame(A6, B6, 1, 2), ping6_frame(A6, B6), ipv6_by_hand(44, &[17, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 2])];
        for fr in &frames {
            for n in 0..=fr.len() {
                match parse(&fr[..n]) {
                    Ok(f) => {
                        assert!(n >= 14 + 40, "an answer from {n} bytes");
                        assert_eq!((f.src, f.dst), (IpAddr::from(A6), IpAddr::from(B6)));
                    }
                    Err(e) => assert!(n < 14 + 40, "cut at {n}: {e}"),
                }
            }
        }
        const NEXT: [u8; 12] = [0, 43, 44, 51, 60, 0, 43, 44, 6, 17, 58, 132];
        let mut x: u32 = 11;
        for i in 0..20_000 {
            let mut rest = noise(&mut x, (i % 97) + 1);
            // Next-header bytes at the usual places, so chains go on for a while.
            for at in [0, 8, 16, 24] {
                if let Some(b) = rest.get_mut(at) {
                    *b = NEXT[(*b as usize) % NEXT.len()];
                }
            }
            let first = NEXT[i % NEXT.len()];
            let mut g = ipv6_by_hand(first, &rest);
            if i % 3 == 0 {
                // A payload length that lies (longer or shorter than what is there).
                g[18..20].copy_from_slice(&(noise(&mut x, 1)[0] as u16).to_be_bytes());
            }
            match parse(&g) {
                Ok(f) => assert_eq!((f.src, f.dst), (IpAddr::from(A6), IpAddr::from(B6))),
                Err(e) => panic!("a whole IPv6 header gave {e}: {g:02x?}"),
            }
        }
    }
}
