//! Property tests for the OpenFlow codec:
//!
//! - every *valid* typed message round-trips exactly (`decode(encode(m)) == m`) and
//!   `encoded_len` is the number of bytes `encode` writes; raw (`Unknown`) values re-encode
//!   byte for byte;
//! - decoding arbitrary or mutated bytes never panics, and whatever decodes is a fixed point of
//!   encode-then-decode (idempotence);
//! - `OfCodec` splits a stream of messages the same way however the stream is chunked.
//!
//! The strategies generate values in their canonical form. Where the typed model admits a value
//! that cannot survive the wire unchanged by design, the strategy avoids it and a comment says
//! why (search for "by design").

use std::net::{Ipv4Addr, Ipv6Addr};

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use tokio_util::codec::Decoder;

use openflow::action::OFPCML_NO_BUFFER;
use openflow::field::{self, CLASS_EXPERIMENTER, CLASS_NXM0, CLASS_NXM1, CLASS_OPENFLOW_BASIC};
use openflow::{
    Action, AggregateStats, Conjunction, ArpMatch, BundleAdd, Ct, CtZone, FlowStatsEntry, RawFlowStats, BundleControl, BundleCtrlType, BundleFlags, ErrorCode, ErrorMsg,
    EthMatch, FeaturesReply, FlowMod, FlowRemoved, FlowModCommand, FlowModFlags, FlowStats, FlowStatsRequest, FragMode, Hello,
    HelloElement, Icmpv6Match, Instruction, Ip6Proto, IpFrag, IpProto, Ipv4Match, Ipv6Match, MacAddr, Masked, Match, Message, MultipartReply,
    MultipartReplyBody, MultipartRequest, MultipartRequestBody, NxmField, OfCodec, OfMessage, Port, PortNo, RawOxm,
    RegMove, SetField, Subfield, SwitchConfig, NX_VENDOR_ID, OFP_VERSION, ONF_VENDOR_ID,
};

// ---------------------------------------------------------------------------------------------
// Leaf strategies
// ---------------------------------------------------------------------------------------------

fn bytes_up_to(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..=max).prop_map(Bytes::from)
}

fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}

fn ipv6() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        any::<u128>().prop_map(Ipv6Addr::from),
        // Mostly-zero addresses, which print with `::` (and `::a.b.c.d`).
        (any::<u16>(), any::<u32>()).prop_map(|(hi, lo)| Ipv6Addr::from(((hi as u128) << 112) | lo as u128)),
    ]
}

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn port_no() -> impl Strategy<Value = PortNo> {
    prop_oneof![
        (0u32..64).prop_map(PortNo),
        any::<u32>().prop_map(PortNo),
        select(vec![
            PortNo::IN_PORT,
            PortNo::TABLE,
            PortNo::NORMAL,
            PortNo::FLOOD,
            PortNo::ALL,
            PortNo::CONTROLLER,
            PortNo::LOCAL,
            PortNo::ANY
        ]),
    ]
}

/// Exact, CIDR and arbitrary masks (including the all-zero mask).
fn masked_ip() -> impl Strategy<Value = Masked<Ipv4Addr>> {
    prop_oneof![
        ipv4().prop_map(Masked::exact),
        (ipv4(), 0u8..=32).prop_map(|(a, p)| Masked::cidr(a, p).expect("prefix <= 32")),
        (ipv4(), ipv4()).prop_map(|(a, m)| Masked::new(a, m)),
    ]
}

fn masked_ip6() -> impl Strategy<Value = Masked<Ipv6Addr>> {
    prop_oneof![
        ipv6().prop_map(Masked::exact),
        (ipv6(), 0u8..=128).prop_map(|(a, p)| Masked::cidr(a, p).expect("prefix <= 128")),
        (ipv6(), ipv6()).prop_map(|(a, m)| Masked::new(a, m)),
    ]
}

fn masked_mac() -> impl Strategy<Value = Masked<MacAddr>> {
    prop_oneof![mac().prop_map(Masked::exact), (mac(), mac()).prop_map(|(a, m)| Masked::new(a, m))]
}

fn masked_u16() -> impl Strategy<Value = Masked<u16>> {
    prop_oneof![any::<u16>().prop_map(Masked::exact), (any::<u16>(), any::<u16>()).prop_map(|(v, m)| Masked::new(v, m))]
}

fn masked_u32() -> impl Strategy<Value = Masked<u32>> {
    prop_oneof![any::<u32>().prop_map(Masked::exact), (any::<u32>(), any::<u32>()).prop_map(|(v, m)| Masked::new(v, m))]
}

fn masked_u64() -> impl Strategy<Value = Masked<u64>> {
    prop_oneof![any::<u64>().prop_map(Masked::exact), (any::<u64>(), any::<u64>()).prop_map(|(v, m)| Masked::new(v, m))]
}

// ---------------------------------------------------------------------------------------------
// Matches
// ---------------------------------------------------------------------------------------------

/// `IpFrag` values in canonical form. By design, `IpFrag::Other { value, mask }` built by hand
/// is not canonical when it names one of the five named cases (e.g. `Other {0, 3}` is `No`) or
/// has bits outside the two flag bits: the wire form is (value & mask & 3, mask & 3), and the
/// decoder classifies it again. `from_value_mask` is the canonical constructor.
fn ip_frag() -> impl Strategy<Value = IpFrag> {
    prop_oneof![
        select(vec![IpFrag::No, IpFrag::Yes, IpFrag::First, IpFrag::Later, IpFrag::NotLater]),
        (0u8..4, 0u8..4).prop_map(|(v, m)| IpFrag::from_value_mask(v, m)),
    ]
}

/// By design `IpProto::Other(6)`/`Other(17)`/`Other(132)` decode as `Tcp { dst: None }`/
/// `Udp { dst: None }`/`Sctp { dst: None }` (the number alone decides), so `Other` avoids those
/// three numbers.
fn ip_proto() -> impl Strategy<Value = IpProto> {
    prop_oneof![
        proptest::option::of(masked_u16()).prop_map(|dst| IpProto::Tcp { dst }),
        proptest::option::of(masked_u16()).prop_map(|dst| IpProto::Udp { dst }),
        proptest::option::of(masked_u16()).prop_map(|dst| IpProto::Sctp { dst }),
        any::<u8>().prop_filter("6, 17 and 132 are typed", |n| ![6, 17, 132].contains(n)).prop_map(IpProto::Other),
    ]
}

fn ipv4_match() -> impl Strategy<Value = Ipv4Match> {
    use proptest::option::of;
    (of(masked_ip()), of(masked_ip()), of(ip_frag()), of(ip_proto())).prop_map(|(src, dst, frag, proto)| Ipv4Match {
        src,
        dst,
        frag,
        proto,
    })
}

/// `ipv6_label` in canonical form. By design only the low 20 bits are a label (the encoder
/// clears the others in the value), and a mask covering all 20 is an exact match
/// (`Masked::exact` after decoding), so the strategy draws values below 2^20 and, for masked
/// labels, masks that leave at least one label bit out (any bits above 20 are kept, as OVS
/// keeps them).
fn ipv6_label() -> impl Strategy<Value = Masked<u32>> {
    prop_oneof![
        (0u32..=0xfffff).prop_map(Masked::exact),
        (0u32..=0xfffff, any::<u32>())
            .prop_filter("mask covering the label is exact", |(_, m)| m & 0xfffff != 0xfffff)
            .prop_map(|(v, m)| Masked::new(v, m)),
    ]
}

/// ICMPv6 fields that satisfy OVS's neighbour discovery prerequisites (the decoder refuses
/// the others, by design): ND fields only with type 135/136 and code 0 or unset.
fn icmpv6_match() -> BoxedStrategy<Icmpv6Match> {
    use proptest::option::of;
    let plain = (of(any::<u8>()), of(any::<u8>())).prop_map(|(typ, code)| Icmpv6Match { typ, code, ..Default::default() });
    let nd = (select(vec![135u8, 136]), of(Just(0u8)), of(masked_ip6()), of(masked_mac())).prop_map(|(typ, code, nd_target, ll)| {
        Icmpv6Match {
            typ: Some(typ),
            code,
            nd_target,
            nd_sll: if typ == 135 { ll } else { None },
            nd_tll: if typ == 136 { ll } else { None },
        }
    });
    prop_oneof![plain, nd].boxed()
}

/// By design `L4(IpProto::Other(58))` decodes as `Icmpv6(default)` (58 is ICMPv6 whatever
/// follows), so `L4` avoids 58 as well as the three typed numbers.
fn ip6_proto() -> BoxedStrategy<Ip6Proto> {
    prop_oneof![
        ip_proto().prop_filter("58 is ICMPv6", |p| *p != IpProto::Other(58)).prop_map(Ip6Proto::L4),
        icmpv6_match().prop_map(Ip6Proto::Icmpv6),
    ]
    .boxed()
}

fn ipv6_match() -> BoxedStrategy<Ipv6Match> {
    use proptest::option::of;
    (of(masked_ip6()), of(masked_ip6()), of(ipv6_label()), of(ip_frag()), of(ip6_proto()))
        .prop_map(|(src, dst, label, frag, proto)| Ipv6Match { src, dst, label, frag, proto })
        .boxed()
}

fn arp_match() -> impl Strategy<Value = ArpMatch> {
    use proptest::option::of;
    (of(any::<u16>()), of(masked_ip()), of(masked_ip()), of(masked_mac()), of(masked_mac()))
        .prop_map(|(op, spa, tpa, sha, tha)| ArpMatch { op, spa, tpa, sha, tha })
}

/// By design `EthMatch::Other(0x0800)`/`Other(0x86dd)`/`Other(0x0806)`/`Other(0x8035)` decode
/// as `Ipv4`/`Ipv6`/`Arp`/`Rarp`.
fn eth_match() -> BoxedStrategy<EthMatch> {
    prop_oneof![
        Just(EthMatch::Any),
        ipv4_match().prop_map(EthMatch::Ipv4),
        ipv6_match().prop_map(EthMatch::Ipv6),
        arp_match().prop_map(EthMatch::Arp),
        arp_match().prop_map(EthMatch::Rarp),
        any::<u16>()
            .prop_filter("IPv4/IPv6/ARP/RARP are typed", |t| ![0x0800, 0x86dd, 0x0806, 0x8035].contains(t))
            .prop_map(EthMatch::Other),
    ]
    .boxed()
}

/// OXM/NXM TLVs this crate does not model, with a payload length consistent with the header.
/// (A `RawOxm` naming a modelled field would decode into its typed slot, by design.)
fn raw_oxm() -> BoxedStrategy<RawOxm> {
    let eth_src = (mac(), any::<bool>(), mac()).prop_map(|(v, hasmask, m)| {
        let mut p = v.0.to_vec();
        if hasmask {
            p.extend_from_slice(&m.0);
        }
        RawOxm { header: field::header(CLASS_OPENFLOW_BASIC, 4, 6, hasmask), payload: Bytes::from(p) }
    });
    // vlan_vid (OXM 6, 2 bytes).
    let vlan = any::<u16>().prop_map(|v| RawOxm {
        header: field::header(CLASS_OPENFLOW_BASIC, 6, 2, false),
        payload: Bytes::copy_from_slice(&v.to_be_bytes()),
    });
    // Experimenter OXMs: the length counts the 4-byte experimenter id.
    let exp = (0u8..128, any::<u32>(), vec(any::<u8>(), 0..=16)).prop_map(|(f, id, data)| {
        let mut p = id.to_be_bytes().to_vec();
        p.extend_from_slice(&data);
        RawOxm {
            header: ((CLASS_EXPERIMENTER as u32) << 16) | ((f as u32) << 9) | p.len() as u32,
            payload: Bytes::from(p),
        }
    });
    // NXM1 fields past the modelled ones (e.g. 33+ are NXM_NX_* fields this crate ignores;
    // 105..=107 are the typed ct_state/ct_zone/ct_mark, 109/110 tun_ipv6_src/dst).
    let nxm1 = ((60u8..128).prop_filter("ct and tun_ipv6 fields are typed", |f| !(105..=107).contains(f) && !(109..=110).contains(f)), vec(any::<u8>(), 0..=8)).prop_map(|(f, data)| RawOxm {
        header: ((CLASS_NXM1 as u32) << 16) | ((f as u32) << 9) | data.len() as u32,
        payload: Bytes::from(data),
    });
    prop_oneof![eth_src, vlan, exp, nxm1].boxed()
}

fn regs() -> impl Strategy<Value = [Option<Masked<u32>>; 16]> {
    vec(proptest::option::weighted(0.2, masked_u32()), 16).prop_map(|v| {
        let mut out = [None; 16];
        out.copy_from_slice(&v);
        out
    })
}

fn flow_match() -> BoxedStrategy<Match> {
    use proptest::option::of;
    (
        of(port_no()),
        eth_match(),
        of(masked_u64()),
        (of(masked_ip()), of(masked_ip()), of(masked_ip6()), of(masked_ip6())),
        regs(),
        (of(masked_u32()), of(any::<u16>()), of(masked_u32()), of(any::<u32>())),
        vec(raw_oxm(), 0..3),
    )
        .prop_map(
            |(in_port, eth, tun_id, (tun_src, tun_dst, tun_ipv6_src, tun_ipv6_dst), regs, (ct_state, ct_zone, ct_mark, conj_id), other)| Match {
            conj_id,
            in_port,
            eth,
            tun_id,
            tun_src,
            tun_dst,
            tun_ipv6_src,
            tun_ipv6_dst,
            regs,
            ct_state,
            ct_zone,
            ct_mark,
            other,
        },
        )
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Actions and instructions
// ---------------------------------------------------------------------------------------------

/// Fields a subfield can name. By design some `NxmField::Other` values cannot appear in a valid
/// subfield on the wire: a header that `from_header` would classify (e.g. `Other` of a register
/// header decodes as `Reg`) and a zero-width field. Experimenter-class fields are only generated
/// when `experimenter` is set: as REG_MOVE operands they take 8 bytes and are kept `Unknown`.
fn nxm_field(experimenter: bool) -> BoxedStrategy<NxmField> {
    let typed = prop_oneof![
        3 => (0u8..16).prop_map(NxmField::Reg),
        1 => Just(NxmField::TunId),
        1 => Just(NxmField::TunIpv4Src),
        1 => Just(NxmField::TunIpv4Dst),
        1 => select(vec![NxmField::TunIpv6Src, NxmField::TunIpv6Dst, NxmField::Ipv6Src, NxmField::Ipv6Dst]),
    ];
    let other = prop_oneof![
        // Unmodelled NXM1 fields, 1..=8 bytes.
        (60u8..128, 1u8..=8).prop_map(|(f, len)| NxmField::Other(field::header(CLASS_NXM1, f, len, false))),
        // Unmodelled NXM0 fields.
        (40u8..80, select(vec![1u8, 2, 4, 6, 8]))
            .prop_map(|(f, len)| NxmField::Other(field::header(CLASS_NXM0, f, len, false))),
        // Wide fields: OXM ipv6_src/ipv6_dst (16 bytes), and odd widths up to 16 bytes.
        (select(vec![26u8, 27]), Just(16u8)).prop_map(|(f, len)| NxmField::Other(field::header(
            CLASS_OPENFLOW_BASIC,
            f,
            len,
            false
        ))),
        (60u8..128, 9u8..=16)
            .prop_filter("tun_ipv6_src/dst are typed", |(f, len)| !((109..=110).contains(f) && *len == 16))
            .prop_map(|(f, len)| NxmField::Other(field::header(CLASS_NXM1, f, len, false))),
    ];
    let exp = (0u8..128, 5u8..=12)
        .prop_map(|(f, len)| NxmField::Other(((CLASS_EXPERIMENTER as u32) << 16) | ((f as u32) << 9) | len as u32));
    if experimenter {
        prop_oneof![3 => typed, 2 => other, 1 => exp].boxed()
    } else {
        prop_oneof![3 => typed, 2 => other].boxed()
    }
}

/// A valid subfield: the whole field, or `n_bits` in 1..=min(64, width) inside the field.
fn subfield(experimenter: bool) -> BoxedStrategy<Subfield> {
    nxm_field(experimenter)
        .prop_flat_map(|f| {
            let width = f.bits();
            let range = (1..=width.min(64)).prop_flat_map(move |n| {
                (0..=width - n).prop_map(move |ofs| Subfield::new(f, ofs, n).expect("valid subfield"))
            });
            prop_oneof![1 => Just(Subfield::whole(f)), 3 => range]
        })
        .boxed()
}

/// A pair of subfields of equal width (REG_MOVE).
fn reg_move() -> BoxedStrategy<RegMove> {
    (subfield(false), nxm_field(false))
        .prop_flat_map(|(src, b)| {
            let n = src.n_bits();
            let wb = b.bits();
            // Pick a destination of the same width, or fall back to a same-width source copy.
            if n <= wb {
                (0..=wb - n)
                    .prop_map(move |ob| RegMove::new(src, Subfield::new(b, ob, n).unwrap()).expect("same width"))
                    .boxed()
            } else {
                Just(RegMove::new(src, src).expect("same width")).boxed()
            }
        })
        .boxed()
}

/// SET_FIELD targets. `SetField::Other` holds only headers that `SetField` does not type (a
/// register/tunnel header would decode as `Reg`/`TunDst`/...), with the payload length equal
/// to the header's length (the wire has no other place for a longer payload).
fn set_field() -> BoxedStrategy<SetField> {
    prop_oneof![
        ipv4().prop_map(SetField::TunDst),
        ipv4().prop_map(SetField::TunSrc),
        ipv6().prop_map(SetField::TunIpv6Dst),
        ipv6().prop_map(SetField::TunIpv6Src),
        ipv6().prop_map(SetField::Ipv6Src),
        ipv6().prop_map(SetField::Ipv6Dst),
        any::<u64>().prop_map(SetField::TunId),
        (0u8..16, any::<u32>()).prop_map(|(n, v)| SetField::Reg(n, v)),
        raw_oxm().prop_map(SetField::Other),
        // NXM_NX_TUN_ID inside SET_FIELD: OVS would send the OXM form, so it stays raw.
        any::<u64>().prop_map(|v| SetField::Other(RawOxm {
            header: NxmField::TunId.header(),
            payload: Bytes::copy_from_slice(&v.to_be_bytes()),
        })),
    ]
    .boxed()
}

/// Well-formed actions that this crate does not model (they must decode back to `Unknown`).
fn unknown_action() -> BoxedStrategy<Bytes> {
    // PUSH_VLAN (0x0011, len 8).
    let push_vlan = any::<u16>().prop_map(|eth| {
        let mut b = vec![0x00, 0x11, 0x00, 0x08];
        b.extend_from_slice(&eth.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b
    });
    // Any standard type other than OUTPUT (0) and SET_FIELD (25), with an 8n-byte body.
    let std = (1u16..0xfffe, 0usize..3, any::<[u8; 20]>()).prop_filter_map("typed", |(t, n, body)| {
        if t == 25 {
            return None;
        }
        let len = 8 + 8 * n;
        let mut b = t.to_be_bytes().to_vec();
        b.extend_from_slice(&(len as u16).to_be_bytes());
        b.extend_from_slice(&body[..len - 4]);
        Some(b)
    });
    // Nicira subtypes not modelled (e.g. 0x27 OUTPUT_TRUNC), or another vendor.
    let nx = (prop_oneof![Just(NX_VENDOR_ID), any::<u32>()], select(vec![0x2bu16, 0x27, 0x2a, 0x1000]), any::<[u8; 6]>())
        .prop_map(|(vendor, sub, body)| {
            let mut b = vec![0xff, 0xff, 0x00, 0x10];
            b.extend_from_slice(&vendor.to_be_bytes());
            b.extend_from_slice(&sub.to_be_bytes());
            b.extend_from_slice(&body);
            b
        });
    prop_oneof![push_vlan, std, nx].prop_map(Bytes::from).boxed()
}

fn action() -> BoxedStrategy<Action> {
    prop_oneof![
        (port_no(), any::<u16>()).prop_map(|(port, max_len)| Action::Output { port, max_len }),
        port_no().prop_map(Action::output),
        set_field().prop_map(Action::SetField),
        (subfield(true), any::<u64>()).prop_map(|(dst, value)| Action::RegLoad { dst, value }),
        (0u8..16, any::<u32>()).prop_map(|(n, v)| Action::load_reg(n, v)),
        reg_move().prop_map(Action::RegMove),
        (subfield(true), prop_oneof![Just(OFPCML_NO_BUFFER), any::<u16>()])
            .prop_map(|(src, max_len)| Action::OutputReg { src, max_len }),
        (0u8..16).prop_map(Action::output_reg),
        vec(any::<u8>(), 0..40).prop_map(Action::note),
        (any::<u16>(), any::<u8>()).prop_map(|(in_port, table)| Action::ResubmitTable { in_port, table }),
        any::<u16>().prop_map(|in_port| Action::Resubmit { in_port }),
        ct_action().prop_map(Action::Ct),
        conjunction().prop_map(Action::Conjunction),
        unknown_action().prop_map(Action::Unknown),
    ]
    .boxed()
}

/// NXAST_CONJUNCTION: any id, `n` in 2..=64, `k` in 1..=n (the only values the type admits).
fn conjunction() -> BoxedStrategy<Conjunction> {
    (any::<u32>(), 2u8..=64)
        .prop_flat_map(|(id, n)| (1..=n).prop_map(move |k| Conjunction::new(id, k, n).expect("valid conjunction")))
        .boxed()
}

/// NXAST_CT with any flags, either zone form, and nested actions (no nested `ct`).
fn ct_action() -> BoxedStrategy<Ct> {
    let zone = prop_oneof![
        any::<u16>().prop_map(CtZone::Imm),
        (0u8..16, 0u16..=16).prop_map(|(r, ofs)| CtZone::Field(Subfield::new(NxmField::Reg(r), ofs, 16).unwrap())),
    ];
    let inner = prop_oneof![
        any::<u32>().prop_map(|v| Action::SetField(SetField::CtMark(v))),
        (0u8..16, any::<u32>()).prop_map(|(n, v)| Action::load_reg(n, v)),
        port_no().prop_map(Action::output),
        unknown_action().prop_map(Action::Unknown),
    ];
    (any::<u16>(), zone, any::<u8>(), any::<u16>(), vec(inner, 0..3))
        .prop_map(|(flags, zone, recirc_table, alg, actions)| Ct { flags, zone, recirc_table, alg, actions })
        .boxed()
}

fn actions() -> BoxedStrategy<Vec<Action>> {
    vec(action(), 0..6).boxed()
}

/// An instruction type this crate does not model (7 = OFPIT_STAT_TRIGGER, 0xffff =
/// OFPIT_EXPERIMENTER, ...), whole and 8-aligned.
fn unknown_instruction() -> impl Strategy<Value = Bytes> {
    (prop_oneof![7u16..0x100, Just(0xffffu16)], 0usize..3, any::<[u8; 20]>()).prop_map(|(t, n, body)| {
        let len = 8 + 8 * n;
        let mut b = t.to_be_bytes().to_vec();
        b.extend_from_slice(&(len as u16).to_be_bytes());
        b.extend_from_slice(&body[..len - 4]);
        Bytes::from(b)
    })
}

fn instruction() -> BoxedStrategy<Instruction> {
    prop_oneof![
        1 => any::<u8>().prop_map(Instruction::GotoTable),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(metadata, mask)| Instruction::WriteMetadata { metadata, mask }),
        1 => actions().prop_map(Instruction::WriteActions),
        2 => actions().prop_map(Instruction::ApplyActions),
        1 => Just(Instruction::ClearActions),
        1 => any::<u32>().prop_map(Instruction::Meter),
        1 => unknown_instruction().prop_map(Instruction::Unknown),
    ]
    .boxed()
}

fn instructions() -> BoxedStrategy<Vec<Instruction>> {
    vec(instruction(), 0..4).boxed()
}

// ---------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------

fn flow_mod() -> BoxedStrategy<FlowMod> {
    (
        (any::<u64>(), any::<u64>(), any::<u8>(), any::<u8>().prop_map(FlowModCommand::from_u8)),
        (any::<u16>(), any::<u16>(), any::<u16>(), any::<u32>(), port_no(), any::<u32>()),
        any::<u16>().prop_map(FlowModFlags::from_bits_retain),
        flow_match(),
        instructions(),
    )
        .prop_map(
            |(
                (cookie, cookie_mask, table_id, command),
                (idle_timeout, hard_timeout, priority, buffer_id, out_port, out_group),
                flags,
                match_,
                instructions,
            )| FlowMod {
                cookie,
                cookie_mask,
                table_id,
                command,
                idle_timeout,
                hard_timeout,
                priority,
                buffer_id,
                out_port,
                out_group,
                flags,
                match_,
                instructions,
            },
        )
        .boxed()
}

fn flow_stats() -> BoxedStrategy<FlowStats> {
    (
        (any::<u8>(), any::<u32>(), any::<u32>(), any::<u16>(), any::<u16>(), any::<u16>()),
        (any::<u16>().prop_map(FlowModFlags::from_bits_retain), any::<u64>(), any::<u64>(), any::<u64>()),
        flow_match(),
        instructions(),
    )
        .prop_map(
            |(
                (table_id, duration_sec, duration_nsec, priority, idle_timeout, hard_timeout),
                (flags, cookie, packet_count, byte_count),
                match_,
                instructions,
            )| FlowStats {
                table_id,
                duration_sec,
                duration_nsec,
                priority,
                idle_timeout,
                hard_timeout,
                flags,
                cookie,
                packet_count,
                byte_count,
                match_,
                instructions,
            },
        )
        .boxed()
}

/// A flow-stats entry this crate cannot type (an IPv4 field without eth_type, written as a raw
/// TLV): it must stay raw, byte for byte.
fn raw_flow_stats() -> BoxedStrategy<FlowStatsEntry> {
    (flow_stats(), ipv4()).prop_map(|(mut f, a)| {
        f.match_ = Match::any();
        f.match_.other = vec![RawOxm { header: field::header(CLASS_OPENFLOW_BASIC, 11, 4, false), payload: Bytes::copy_from_slice(&a.octets()) }];
        let mut b = Vec::new();
        f.encode(&mut b).unwrap();
        FlowStatsEntry::Raw(RawFlowStats { bytes: Bytes::from(b) })
    })
    .boxed()
}

fn flow_stats_request() -> impl Strategy<Value = FlowStatsRequest> {
    (any::<u8>(), port_no(), any::<u32>(), any::<u64>(), any::<u64>(), flow_match()).prop_map(
        |(table_id, out_port, out_group, cookie, cookie_mask, match_)| FlowStatsRequest {
            table_id,
            out_port,
            out_group,
            cookie,
            cookie_mask,
            match_,
        },
    )
}

/// Multipart types decoded as typed bodies: FLOW (1), AGGREGATE (2) always; DESC (0) and
/// PORT_DESC (13) requests when the body is empty; by design those are never `Unknown`.
fn multipart_request() -> BoxedStrategy<MultipartRequest> {
    let body = prop_oneof![
        Just(MultipartRequestBody::Desc),
        flow_stats_request().prop_map(MultipartRequestBody::Flow),
        flow_stats_request().prop_map(MultipartRequestBody::Aggregate),
        Just(MultipartRequestBody::PortDesc),
        Just(MultipartRequestBody::MeterFeatures),
        any::<u32>().prop_map(MultipartRequestBody::MeterStats),
        (prop_oneof![3u16..9, 10u16..11, 12u16..13], bytes_up_to(32)).prop_map(|(mp_type, body)| MultipartRequestBody::Unknown { mp_type, body }),
        (14u16..=0xffff, bytes_up_to(32)).prop_map(|(mp_type, body)| MultipartRequestBody::Unknown { mp_type, body }),
        (select(vec![0u16, 11, 13]), vec(any::<u8>(), 1..32))
            .prop_map(|(mp_type, body)| MultipartRequestBody::Unknown { mp_type, body: Bytes::from(body) }),
    ];
    (any::<u16>(), body).prop_map(|(flags, body)| MultipartRequest { flags, body }).boxed()
}

fn port() -> impl Strategy<Value = Port> {
    (port_no(), mac(), any::<[u8; 16]>(), any::<[u32; 8]>()).prop_map(|(port_no, hw_addr, name, v)| Port {
        port_no,
        hw_addr,
        name,
        config: v[0],
        state: v[1],
        curr: v[2],
        advertised: v[3],
        supported: v[4],
        peer: v[5],
        curr_speed: v[6],
        max_speed: v[7],
    })
}

fn multipart_reply() -> BoxedStrategy<MultipartReply> {
    let body = prop_oneof![
        3 => vec(prop_oneof![3 => flow_stats().prop_map(FlowStatsEntry::Typed), 1 => raw_flow_stats()], 0..4)
            .prop_map(MultipartReplyBody::Flow),
        1 => (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(packet_count, byte_count, flow_count)| {
            MultipartReplyBody::Aggregate(AggregateStats { packet_count, byte_count, flow_count })
        }),
        1 => vec(port(), 0..4).prop_map(MultipartReplyBody::PortDesc),
        1 => any::<[u32; 4]>().prop_map(|v| MultipartReplyBody::MeterFeatures(openflow::MeterFeatures {
            max_meter: v[0],
            band_types: v[1],
            capabilities: v[2],
            max_bands: v[3] as u8,
            max_color: (v[3] >> 8) as u8,
        })),
        1 => vec((any::<[u32; 4]>(), any::<[u64; 2]>(), vec(any::<(u64, u64)>(), 0..3)), 0..3).prop_map(|v| {
            MultipartReplyBody::MeterStats(
                v.into_iter()
                    .map(|(a, b, bands)| openflow::MeterStats {
                        meter_id: a[0],
                        flow_count: a[1],
                        packet_in_count: b[0],
                        byte_in_count: b[1],
                        duration_sec: a[2],
                        duration_nsec: a[3],
                        bands,
                    })
                    .collect(),
            )
        }),
        1 => (prop_oneof![Just(0u16), 3u16..9, 10u16..11, 12u16..13, 14u16..=0xffff], bytes_up_to(48))
            .prop_map(|(mp_type, body)| MultipartReplyBody::Unknown { mp_type, body }),
    ];
    (any::<u16>(), body).prop_map(|(flags, body)| MultipartReply { flags, body }).boxed()
}

fn bundle_flags() -> impl Strategy<Value = BundleFlags> {
    prop_oneof![Just(BundleFlags::ATOMIC | BundleFlags::ORDERED), any::<u16>().prop_map(BundleFlags::from_bits_retain)]
}

fn hello() -> BoxedStrategy<Hello> {
    // By design an `Unknown` element of type 1 (VERSIONBITMAP) whose data is a whole number of
    // words decodes as `VersionBitmap`; such elements are only generated as `VersionBitmap`.
    let element = prop_oneof![
        vec(any::<u32>(), 0..4).prop_map(HelloElement::VersionBitmap),
        (any::<u16>(), bytes_up_to(20))
            .prop_filter("a bitmap", |(t, d)| !(*t == 1 && d.len() % 4 == 0))
            .prop_map(|(typ, data)| HelloElement::Unknown { typ, data }),
    ];
    prop_oneof![Just(Hello::of13()), vec(element, 0..4).prop_map(|elements| Hello { elements, trailing: Bytes::new() })].boxed()
}

fn error_msg() -> BoxedStrategy<ErrorMsg> {
    let code = prop_oneof![
        (0u16..0xffff, any::<u16>()).prop_map(|(typ, code)| ErrorCode::Standard { typ, code }),
        (any::<u16>(), prop_oneof![Just(ONF_VENDOR_ID), Just(NX_VENDOR_ID), any::<u32>()])
            .prop_map(|(exp_code, experimenter)| ErrorCode::Experimenter { exp_code, experimenter }),
        select(vec![ErrorCode::BAD_TABLE_ID, ErrorCode::BUNDLE_MSG_FAILED, ErrorCode::HELLO_FAILED_INCOMPATIBLE]),
    ];
    // The data is usually the offending message.
    let data = prop_oneof![
        bytes_up_to(64),
        flow_mod().prop_filter_map("fits", |fm| OfMessage::new(9, Message::FlowMod(fm)).to_bytes().ok()),
    ];
    (code, data).prop_map(|(code, data)| ErrorMsg { code, data }).boxed()
}

fn features_reply() -> impl Strategy<Value = FeaturesReply> {
    (any::<u64>(), any::<u32>(), any::<u8>(), any::<u8>(), any::<u32>(), any::<u32>()).prop_map(
        |(datapath_id, n_buffers, n_tables, auxiliary_id, capabilities, reserved)| FeaturesReply {
            datapath_id,
            n_buffers,
            n_tables,
            auxiliary_id,
            capabilities,
            reserved,
        },
    )
}

/// By design the low two bits of the config flags are the fragment mode, so `other_flags`
/// holds only the bits above them.
fn switch_config() -> impl Strategy<Value = SwitchConfig> {
    (select(vec![FragMode::Normal, FragMode::Drop, FragMode::Reasm, FragMode::NxMatch]), any::<u16>(), any::<u16>())
        .prop_map(|(frag, flags, miss_send_len)| SwitchConfig { frag, other_flags: flags & !3, miss_send_len })
}

fn bundle_ctrl_type() -> impl Strategy<Value = BundleCtrlType> {
    any::<u16>().prop_map(BundleCtrlType::from_u16)
}

/// Message types this crate does not model in OpenFlow 1.3 (PACKET_IN 10 .. PACKET_OUT 13,
/// GROUP_MOD 15 .. TABLE_MOD 17, ROLE_REQUEST 24, ...).
fn unknown_type() -> impl Strategy<Value = u8> {
    // (10 PACKET_IN, 28 SET_ASYNC and 29 METER_MOD are typed since the audit log, 11
    // FLOW_REMOVED since the per-policy counters take a removed flow's final counts.)
    prop_oneof![12u8..=13, 15u8..=17, 22u8..=27, 30u8..=255]
}

/// OFPT_FLOW_REMOVED with a match this crate encodes (the body keeps it raw).
fn flow_removed() -> impl Strategy<Value = FlowRemoved> {
    (
        (any::<u64>(), any::<u16>(), any::<u8>(), any::<u8>()),
        (any::<u32>(), any::<u32>(), any::<u16>(), any::<u16>(), any::<u64>(), any::<u64>()),
        flow_match(),
    )
        .prop_map(|((cookie, priority, reason, table_id), (duration_sec, duration_nsec, idle_timeout, hard_timeout, packet_count, byte_count), m)| {
            let mut raw = Vec::new();
            m.encode(&mut raw);
            FlowRemoved {
                cookie,
                priority,
                reason,
                table_id,
                duration_sec,
                duration_nsec,
                idle_timeout,
                hard_timeout,
                packet_count,
                byte_count,
                match_raw: raw.into(),
            }
        })
}

/// Messages of OpenFlow 1.3 (the only version whose typed bodies are decoded).
fn of13_message() -> BoxedStrategy<Message> {
    prop_oneof![
        1 => hello().prop_map(Message::Hello),
        1 => error_msg().prop_map(Message::Error),
        1 => bytes_up_to(32).prop_map(Message::EchoRequest),
        1 => bytes_up_to(32).prop_map(Message::EchoReply),
        1 => Just(Message::FeaturesRequest),
        1 => features_reply().prop_map(Message::FeaturesReply),
        1 => Just(Message::GetConfigRequest),
        1 => switch_config().prop_map(Message::GetConfigReply),
        1 => switch_config().prop_map(Message::SetConfig),
        4 => flow_mod().prop_map(Message::FlowMod),
        2 => multipart_request().prop_map(Message::MultipartRequest),
        3 => multipart_reply().prop_map(Message::MultipartReply),
        1 => Just(Message::BarrierRequest),
        1 => Just(Message::BarrierReply),
        1 => flow_removed().prop_map(Message::FlowRemoved),
        1 => (any::<u32>(), bundle_ctrl_type(), bundle_flags(), bytes_up_to(16)).prop_map(
            |(bundle_id, ctrl_type, flags, properties)| {
                Message::BundleControl(BundleControl { bundle_id, ctrl_type, flags, properties })
            }
        ),
        1 => // By design ONF 2300/2301 decode as the typed bundle messages.
        (any::<u32>(), any::<u32>(), bytes_up_to(32))
            .prop_filter("bundle types are typed", |(e, t, _)| !(*e == ONF_VENDOR_ID && (*t == 2300 || *t == 2301)))
            .prop_filter("packet-in2 and its format are typed", |(e, t, _)| !(*e == NX_VENDOR_ID && (*t == 16 || *t == 30)))
            .prop_map(|(experimenter, exp_type, data)| Message::Experimenter { experimenter, exp_type, data }),
        1 => (unknown_type(), bytes_up_to(64)).prop_map(|(msg_type, body)| Message::Unknown { msg_type, body }),
    ]
    .boxed()
}

fn of_message() -> BoxedStrategy<OfMessage> {
    prop_oneof![
        8 => (any::<u32>(), of13_message()).prop_map(|(xid, msg)| OfMessage::new(xid, msg)),
        // BUNDLE_ADD wrapping a FLOW_MOD, sometimes with a trailer (padding/properties).
        2 => (any::<u32>(), any::<u32>(), bundle_flags(), flow_mod(), bytes_up_to(8)).prop_map(
            |(xid, id, flags, fm, trailer)| {
                let mut m = BundleAdd::flow_mod(xid, id, flags, fm);
                if let Message::BundleAdd(b) = &mut m.msg {
                    b.trailer = trailer;
                }
                m
            }
        ),
        // Other versions: HELLO and ERROR are decoded in every version, anything else is kept
        // raw. (By design a typed non-HELLO/ERROR body in another version decodes as Unknown.)
        1 => (any::<u8>().prop_filter("not 1.3", |v| *v != OFP_VERSION), any::<u32>(), prop_oneof![
            hello().prop_map(Message::Hello),
            error_msg().prop_map(Message::Error),
            (2u8..=255, bytes_up_to(64)).prop_map(|(msg_type, body)| Message::Unknown { msg_type, body }),
        ])
            .prop_map(|(version, xid, msg)| OfMessage { version, xid, msg }),
    ]
    .boxed()
}

/// A message that also fits the 16-bit length.
fn encodable_message() -> BoxedStrategy<(OfMessage, Bytes)> {
    of_message().prop_filter_map("longer than 64 KiB", |m| m.to_bytes().ok().map(|b| (m, b))).boxed()
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Decode, and if that works, check that the value is a fixed point of encode-then-decode.
fn check_idempotent(bytes: &[u8]) -> Result<(), TestCaseError> {
    let Ok(m) = OfMessage::decode(bytes) else { return Ok(()) };
    // Re-encoding may grow a message past 64 KiB (e.g. a 16-bit NXM in_port becomes the 32-bit
    // OXM form); inputs here are far smaller than that.
    let b = m.to_bytes().map_err(|e| TestCaseError::fail(format!("{e} re-encoding {m:?}")))?;
    prop_assert_eq!(b.len(), m.encoded_len());
    let again = OfMessage::decode(&b).map_err(|e| TestCaseError::fail(format!("{e}: {m:?} -> {b:02x?}")))?;
    prop_assert_eq!(&again, &m);
    // And the canonical bytes are a fixed point too.
    prop_assert_eq!(again.to_bytes().unwrap(), b);
    // The text form must not panic either.
    if let Message::FlowMod(fm) = &m.msg {
        let _ = fm.to_string();
    }
    if let Message::MultipartReply(MultipartReply { body: MultipartReplyBody::Flow(v), .. }) = &m.msg {
        for fs in v.iter().filter_map(FlowStatsEntry::typed) {
            let _ = (fs.to_string(), fs.no_stats().to_string());
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Set { at: usize, byte: u8 },
    Insert { at: usize, bytes: Vec<u8> },
    Delete { at: usize, n: usize },
    Truncate { at: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        2 => (any::<usize>(), vec(any::<u8>(), 1..9)).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        2 => (any::<usize>(), 1usize..9).prop_map(|(at, n)| Mutation::Delete { at, n }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn mutate(mut b: Vec<u8>, muts: &[Mutation], fix_len: bool) -> Vec<u8> {
    for m in muts {
        let n = b.len();
        match m {
            Mutation::Flip { at, bit } if n > 0 => b[at % n] ^= 1 << bit,
            Mutation::Set { at, byte } if n > 0 => b[at % n] = *byte,
            Mutation::Insert { at, bytes } => {
                let at = at % (n + 1);
                b.splice(at..at, bytes.iter().copied());
            }
            Mutation::Delete { at, n: k } if n > 0 => {
                let at = at % n;
                b.drain(at..(at + k).min(n));
            }
            Mutation::Truncate { at } => b.truncate(at % (n + 1)),
            _ => {}
        }
    }
    if fix_len && b.len() >= 4 && b.len() <= 0xffff {
        let len = (b.len() as u16).to_be_bytes();
        b[2] = len[0];
        b[3] = len[1];
    }
    b
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

// Case counts: proptest's default (256, or `PROPTEST_CASES`), four times that for the two
// properties that cover the most ground. `PROPTEST_CASES=20000` makes a longer soak.
fn more_cases() -> ProptestConfig {
    let base = ProptestConfig::default();
    ProptestConfig { cases: base.cases.saturating_mul(4), ..base }
}

proptest! {
    #![proptest_config(more_cases())]

    /// Typed values survive the wire; `encoded_len` is exact.
    #[test]
    fn message_round_trip((m, b) in encodable_message()) {
        prop_assert_eq!(b.len(), m.encoded_len());
        let back = OfMessage::decode(&b).map_err(|e| TestCaseError::fail(format!("{e}: {m:?} -> {b:02x?}")))?;
        prop_assert_eq!(&back, &m);
        // Bytes produced by the encoder are canonical: they re-encode identically.
        prop_assert_eq!(back.to_bytes().unwrap(), b);
    }

    /// Mutated valid encodings never panic the decoder; what decodes is idempotent.
    #[test]
    fn mutated_messages_never_panic(
        (_, b) in encodable_message(),
        muts in vec(mutation(), 1..5),
        fix_len in any::<bool>(),
    ) {
        let b = mutate(b.to_vec(), &muts, fix_len);
        check_idempotent(&b)?;
        // And through the codec: framing errors are typed, never panics.
        let mut codec = OfCodec::default();
        let mut buf = BytesMut::from(&b[..]);
        while let Ok(Some(item)) = codec.decode(&mut buf) {
            if let Ok(m) = item {
                prop_assert_eq!(OfMessage::decode(&m.to_bytes().unwrap()).unwrap(), m);
            }
        }
    }

}

proptest! {
    /// Messages with raw parts (Unknown messages, experimenter messages, unknown multipart
    /// bodies, unknown actions/instructions/OXMs) re-encode byte for byte from their bytes.
    #[test]
    fn raw_bytes_reencode_identically(
        version in any::<u8>(),
        xid in any::<u32>(),
        msg_type in unknown_type(),
        body in bytes_up_to(128),
        exp in (any::<u32>(), any::<u32>(), bytes_up_to(64)),
        acts in vec(unknown_action().prop_map(Action::Unknown), 1..4),
        ins in unknown_instruction(),
        raw in vec(raw_oxm(), 1..4),
    ) {
        let mut wire = vec![version, msg_type];
        wire.extend_from_slice(&((8 + body.len()) as u16).to_be_bytes());
        wire.extend_from_slice(&xid.to_be_bytes());
        wire.extend_from_slice(&body);
        let m = OfMessage::decode(&wire).unwrap();
        prop_assert!(matches!(m.msg, Message::Unknown { .. }), "{:?}", m);
        prop_assert_eq!(&m.to_bytes().unwrap()[..], &wire[..]);

        if !(exp.0 == ONF_VENDOR_ID && (exp.1 == 2300 || exp.1 == 2301)) {
            let mut wire = vec![OFP_VERSION, 4];
            wire.extend_from_slice(&((16 + exp.2.len()) as u16).to_be_bytes());
            wire.extend_from_slice(&xid.to_be_bytes());
            wire.extend_from_slice(&exp.0.to_be_bytes());
            wire.extend_from_slice(&exp.1.to_be_bytes());
            wire.extend_from_slice(&exp.2);
            let m = OfMessage::decode(&wire).unwrap();
            prop_assert!(matches!(m.msg, Message::Experimenter { .. }), "{:?}", m);
            prop_assert_eq!(&m.to_bytes().unwrap()[..], &wire[..]);
        }

        // A FLOW_MOD built from raw parts: the unknown pieces are decoded as Unknown/RawOxm and
        // the whole message re-encodes to the same bytes.
        let mut fm = FlowMod::add(1, 2, Match::any(), vec![], None);
        fm.match_.other = raw.clone();
        fm.instructions = vec![Instruction::ApplyActions(acts.clone()), Instruction::Unknown(ins.clone())];
        let wire = OfMessage::new(xid, Message::FlowMod(fm)).to_bytes().unwrap();
        let back = OfMessage::decode(&wire).unwrap();
        let Message::FlowMod(back_fm) = &back.msg else { panic!("{back:?}") };
        prop_assert_eq!(&back_fm.match_.other, &raw);
        prop_assert_eq!(&back_fm.instructions[0], &Instruction::ApplyActions(acts));
        prop_assert_eq!(&back_fm.instructions[1], &Instruction::Unknown(ins));
        prop_assert_eq!(back.to_bytes().unwrap(), wire);
    }

    /// Any 16-byte NXAST_CONJUNCTION: typed exactly when OVS would accept it (2 <= n <= 64,
    /// clause < n), otherwise kept raw; either way the same bytes come back.
    #[test]
    fn any_conjunction_bytes_decode_typed_or_raw(clause in any::<u8>(), n in any::<u8>(), id in any::<u32>()) {
        let mut wire = vec![0xff, 0xff, 0x00, 0x10, 0x00, 0x00, 0x23, 0x20, 0x00, 0x22, clause, n];
        wire.extend_from_slice(&id.to_be_bytes());
        let a = openflow::action::decode_actions(&wire).unwrap();
        prop_assert_eq!(a.len(), 1);
        let valid = (2..=64).contains(&n) && clause < n;
        match &a[0] {
            Action::Conjunction(c) => {
                prop_assert!(valid);
                prop_assert_eq!((c.id(), c.wire_clause(), c.n_clauses()), (id, clause, n));
                prop_assert_eq!(*c, Conjunction::new(id, clause + 1, n).unwrap());
            }
            Action::Unknown(_) => prop_assert!(!valid),
            other => prop_assert!(false, "{:?}", other),
        }
        let mut again = Vec::new();
        a[0].encode(&mut again).unwrap();
        prop_assert_eq!(again, wire);
    }

    /// The audit log's messages with arbitrary bodies (PACKET_IN, SET_ASYNC, METER_MOD,
    /// NXT_PACKET_IN2, NXT_SET_PACKET_IN_FORMAT, and a controller2 action in a FLOW_MOD): never
    /// a panic; what decodes is idempotent.
    #[test]
    fn audit_messages_with_arbitrary_bodies(kind in 0usize..6, body in vec(any::<u8>(), 0..256)) {
        let mut m = match kind {
            0 => vec![4, 10, 0, 0, 0, 0, 0, 1],
            1 => vec![4, 28, 0, 0, 0, 0, 0, 1],
            2 => vec![4, 29, 0, 0, 0, 0, 0, 1],
            3 => vec![4, 4, 0, 0, 0, 0, 0, 1, 0, 0, 0x23, 0x20, 0, 0, 0, 30],
            4 => vec![4, 4, 0, 0, 0, 0, 0, 1, 0, 0, 0x23, 0x20, 0, 0, 0, 16],
            // FLOW_MOD, empty match, APPLY_ACTIONS holding one NXAST_CONTROLLER2 of 16 + body.
            _ => {
                let mut v = vec![4, 14, 0, 0, 0, 0, 0, 1];
                v.extend_from_slice(&[0; 40]);
                v.extend_from_slice(&[0, 1, 0, 4, 0, 0, 0, 0]);
                let alen = 16 + body.len() / 8 * 8;
                v.extend_from_slice(&[0, 4, ((alen + 8) >> 8) as u8, (alen + 8) as u8, 0, 0, 0, 0]);
                v.extend_from_slice(&[0xff, 0xff, (alen >> 8) as u8, alen as u8, 0, 0, 0x23, 0x20, 0, 37, 0, 0, 0, 0, 0, 0]);
                v.extend_from_slice(&body[..body.len() / 8 * 8]);
                let n = v.len();
                v[2] = (n >> 8) as u8;
                v[3] = n as u8;
                check_idempotent(&v)?;
                return Ok(());
            }
        };
        m.extend_from_slice(&body);
        let n = m.len();
        m[2] = (n >> 8) as u8;
        m[3] = n as u8;
        check_idempotent(&m)?;
    }

    /// Arbitrary bytes never panic the decoder; what decodes is idempotent.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        check_idempotent(&bytes)?;
    }

    /// Same, with a plausible header: version 4, a known type, the right length.
    #[test]
    fn arbitrary_bodies_never_panic(msg_type in 0u8..24, xid in any::<u32>(), body in vec(any::<u8>(), 0..512)) {
        let mut b = vec![OFP_VERSION, msg_type];
        b.extend_from_slice(&((8 + body.len()) as u16).to_be_bytes());
        b.extend_from_slice(&xid.to_be_bytes());
        b.extend_from_slice(&body);
        check_idempotent(&b)?;
    }

    /// Framing does not depend on how the stream is chunked.
    #[test]
    fn codec_framing_any_chunking(
        msgs in vec(encodable_message(), 1..8),
        chunks in vec(1usize..200, 1..64),
    ) {
        let mut stream = Vec::new();
        for (_, b) in &msgs {
            stream.extend_from_slice(b);
        }
        let mut codec = OfCodec::default();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut pos = 0;
        let mut sizes = chunks.iter().cycle();
        while pos < stream.len() {
            let n = (*sizes.next().unwrap()).min(stream.len() - pos);
            buf.extend_from_slice(&stream[pos..pos + n]);
            pos += n;
            while let Some(item) = codec.decode(&mut buf).map_err(|e| TestCaseError::fail(e.to_string()))? {
                got.push(item.map_err(|e| TestCaseError::fail(format!("{e:?}")))?);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(codec.decode_eof(&mut buf).map_err(|e| TestCaseError::fail(e.to_string()))?, None);
        let want: Vec<OfMessage> = msgs.into_iter().map(|(m, _)| m).collect();
        prop_assert_eq!(got, want);
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions and edge cases found while writing the properties
// ---------------------------------------------------------------------------------------------

/// A BUNDLE_ADD nested in a BUNDLE_ADD nested in ... up to the 64 KiB frame limit: each level
/// costs only 24 bytes, so a hostile peer could ask for ~2700 levels of recursion, which
/// overflowed the stack (abort, not even a panic). Nested BUNDLE_ADDs are now refused.
#[test]
fn deeply_nested_bundle_add_does_not_overflow_the_stack() {
    let mut inner = OfMessage::new(1, Message::BarrierRequest).to_bytes().unwrap().to_vec();
    while inner.len() + 24 <= 0xffff {
        let mut b = vec![OFP_VERSION, 4];
        b.extend_from_slice(&((inner.len() + 24) as u16).to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&ONF_VENDOR_ID.to_be_bytes());
        b.extend_from_slice(&2301u32.to_be_bytes());
        b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 3]);
        b.extend_from_slice(&inner);
        inner = b;
    }
    // On a thread with a small stack (a tokio worker has 2 MiB), and through the codec.
    let res = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            let direct = OfMessage::decode(&inner).is_err();
            let mut buf = BytesMut::from(&inner[..]);
            let framed = matches!(OfCodec::default().decode(&mut buf), Ok(Some(Err(_))));
            (direct, framed)
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(res, (true, true));
}

/// Writes a seed corpus for the cargo-fuzz target (openflow/fuzz): 500 valid encodings from the
/// strategies above. Run with
/// `cargo test -p openflow --test roundtrip -- --ignored write_fuzz_seed_corpus`.
#[test]
#[ignore = "writes files; seeds the fuzzer"]
fn write_fuzz_seed_corpus() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    std::fs::create_dir_all(&dir).unwrap();
    let mut runner = TestRunner::deterministic();
    let strategy = encodable_message();
    for i in 0..500 {
        let (_, bytes) = strategy.new_tree(&mut runner).unwrap().current();
        std::fs::write(dir.join(format!("proptest-{i:03}")), &bytes).unwrap();
    }
    // Two messages back to back exercise the codec's framing loop.
    let (_, a) = strategy.new_tree(&mut runner).unwrap().current();
    let (_, b) = strategy.new_tree(&mut runner).unwrap().current();
    std::fs::write(dir.join("proptest-stream"), [a, b].concat()).unwrap();
}
