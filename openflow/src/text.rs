//! The text form `ovs-ofctl -O OpenFlow13 dump-flows` prints, via `Display`.
//!
//! Field order, names and number formats follow OVS 3.1's `match_format` (lib/match.c),
//! `ofpacts_format` (lib/ofp-actions.c) and `ofputil_flow_stats_format` (lib/ofp-flow.c): e.g.
//! registers print as `reg0=0x5` but `reg1=0` (C's `%#x`), a CIDR mask as `/14`, ARP addresses
//! as `arp_spa`/`arp_tpa`, L4 ports as `tp_dst`, `ip_frag` as `nw_frag`, IPv6 protocols as
//! `tcp6`/`udp6`/`sctp6`/`icmp6`, and ICMPv6 type/code as `icmp_type`/`icmp_code`.

use std::fmt::{self, Display, Formatter, Write};
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::action::{Action, Ct, CtZone, SetField, Subfield, NX_CT_F_COMMIT, NX_CT_F_FORCE, NX_CT_RECIRC_NONE};
use crate::flow_match::{ct_state, EthMatch, Icmpv6Match, Ip6Proto, IpFrag, IpProto, MacAddr, MaskBits, Masked, Match, RawOxm};
use crate::instruction::Instruction;
use crate::msg::{FlowMod, FlowModFlags, FlowStats, OFP_DEFAULT_PRIORITY};
use crate::port::PortNo;

/// C's `%#x`: `0` for zero, `0x..` otherwise.
struct AltHex(u64);
impl Display for AltHex {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            f.write_str("0")
        } else {
            write!(f, "{:#x}", self.0)
        }
    }
}

/// Comma-separated `name=value` items, with OVS's "chomp the trailing comma".
struct Items<'a, 'b> {
    f: &'a mut Formatter<'b>,
    any: bool,
}

impl Items<'_, '_> {
    fn item(&mut self, args: fmt::Arguments<'_>) -> fmt::Result {
        if self.any {
            self.f.write_char(',')?;
        }
        self.any = true;
        self.f.write_fmt(args)
    }
}

fn ip_masked(m: &Masked<Ipv4Addr>) -> String {
    if m.is_exact() {
        m.value().to_string()
    } else if let Some(p) = m.prefix_len() {
        format!("{}/{}", m.value(), p)
    } else {
        format!("{}/{}", m.value(), m.mask())
    }
}

/// An IPv6 address as OVS prints it (`ipv6_format_addr`, i.e. glibc's `inet_ntop`): RFC 5952
/// like Rust's `Display`, except that an IPv4-compatible address (`::a.b.c.d`, the first 96 bits
/// zero and the next 16 not) keeps the dotted tail.
pub struct Ipv6Text(pub Ipv6Addr);
impl Display for Ipv6Text {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let seg = self.0.segments();
        if seg[..6] == [0; 6] && seg[6] != 0 {
            let [.., a, b, c, d] = self.0.octets();
            return write!(f, "::{a}.{b}.{c}.{d}");
        }
        write!(f, "{}", self.0)
    }
}

/// `ipv6_format_masked`: the address, then `/N` for a CIDR mask or `/mask` otherwise.
fn ip6_masked(m: &Masked<Ipv6Addr>) -> String {
    if m.is_exact() {
        Ipv6Text(m.value()).to_string()
    } else if let Some(p) = m.prefix_len() {
        format!("{}/{}", Ipv6Text(m.value()), p)
    } else {
        format!("{}/{}", Ipv6Text(m.value()), Ipv6Text(m.mask()))
    }
}

fn mac_masked(m: &Masked<MacAddr>) -> String {
    if m.is_exact() {
        m.value().to_string()
    } else {
        format!("{}/{}", m.value(), m.mask())
    }
}

fn hex_masked<T: Into<u64> + MaskBits>(m: &Masked<T>) -> String {
    if m.is_exact() {
        AltHex(m.value().into()).to_string()
    } else {
        format!("{}/{}", AltHex(m.value().into()), AltHex(m.mask().into()))
    }
}

fn port_masked(m: &Masked<u16>) -> String {
    if m.is_exact() {
        m.value().to_string()
    } else {
        format!("0x{:x}/0x{:x}", m.value(), m.mask())
    }
}

fn raw_oxm(r: &RawOxm) -> String {
    let mut s = format!("oxm:{:08x}=0x", r.header);
    for b in r.payload.iter() {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn ip_proto_name(p: &IpProto) -> Option<&'static str> {
    match p {
        IpProto::Tcp { .. } | IpProto::Other(6) => Some("tcp"),
        IpProto::Udp { .. } | IpProto::Other(17) => Some("udp"),
        IpProto::Sctp { .. } | IpProto::Other(132) => Some("sctp"),
        IpProto::Other(1) => Some("icmp"),
        // No `igmp` keyword: OVS 3.1's match_format prints `ip,nw_proto=2`.
        IpProto::Other(_) => None,
    }
}

/// match_format's keyword for an IPv6 match: `icmp6`, `tcp6`, `udp6`, `sctp6`, else `ipv6`.
fn ip6_keyword(p: Option<&Ip6Proto>) -> &'static str {
    match p {
        Some(Ip6Proto::Icmpv6(_)) | Some(Ip6Proto::L4(IpProto::Other(58))) => "icmp6",
        Some(Ip6Proto::L4(p)) => match p {
            IpProto::Tcp { .. } | IpProto::Other(6) => "tcp6",
            IpProto::Udp { .. } | IpProto::Other(17) => "udp6",
            IpProto::Sctp { .. } | IpProto::Other(132) => "sctp6",
            IpProto::Other(_) => "ipv6",
        },
        None => "ipv6",
    }
}

fn eth_type_name(t: u16) -> Option<&'static str> {
    match t {
        0x86dd => Some("ipv6"),
        0x8035 => Some("rarp"),
        0x8847 => Some("mpls"),
        0x8848 => Some("mplsm"),
        _ => None,
    }
}

fn frag_text(f: IpFrag) -> Option<&'static str> {
    let (v, m) = f.value_mask();
    match m {
        3 => Some(match (v & 1 != 0, v & 2 != 0) {
            (true, true) => "later",
            (true, false) => "first",
            (false, true) => "<error>",
            (false, false) => "no",
        }),
        1 => Some(if v & 1 != 0 { "yes" } else { "no" }),
        2 => Some(if v & 2 != 0 { "later" } else { "not_later" }),
        _ => None,
    }
}

/// A field with an all-zero mask matches everything: OVS stores it as a wildcard and
/// `match_format` prints nothing for it (`ip,nw_dst=0.0.0.0/0` prints as `ip`).
fn shown<T: MaskBits>(m: &Option<Masked<T>>) -> Option<&Masked<T>> {
    m.as_ref().filter(|m| m.mask() != T::ZERO)
}

/// `ct_state` as match_format prints it: with a full (8-bit) mask the set flags joined by `|`
/// (`0` if none), otherwise `+flag`/`-flag` for every masked bit, lowest bit first.
struct CtStateText(u32, u32);
impl Display for CtStateText {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let (value, mask) = (self.0, self.1);
        if mask == 0xff {
            if value == 0 {
                return f.write_char('0');
            }
            let names: Vec<&str> = (0..8).map(|i| 1u32 << i).filter(|b| value & b != 0).filter_map(ct_state::name).collect();
            return f.write_str(&names.join("|"));
        }
        for bit in (0..8).map(|i| 1u32 << i).filter(|b| mask & b != 0) {
            f.write_char(if value & bit != 0 { '+' } else { '-' })?;
            f.write_str(ct_state::name(bit).unwrap_or("[Unknown]"))?;
        }
        Ok(())
    }
}

/// A 16-bit (Nicira action) port as OVS prints it: the reserved name or the number.
fn port16(p: u16) -> PortNo {
    PortNo::from_ofp10(p)
}

fn write_ct(f: &mut Formatter<'_>, ct: &Ct) -> fmt::Result {
    let mut parts: Vec<String> = Vec::new();
    if ct.flags & NX_CT_F_COMMIT != 0 {
        parts.push("commit".into());
    }
    if ct.flags & NX_CT_F_FORCE != 0 {
        parts.push("force".into());
    }
    if ct.recirc_table != NX_CT_RECIRC_NONE {
        parts.push(format!("table={}", ct.recirc_table));
    }
    match ct.zone {
        CtZone::Field(sf) => parts.push(format!("zone={sf}")),
        CtZone::Imm(0) => {}
        CtZone::Imm(z) => parts.push(format!("zone={z}")),
    }
    if !ct.actions.is_empty() {
        let inner: Vec<String> = ct.actions.iter().map(|a| a.to_string()).collect();
        parts.push(format!("exec({})", inner.join(",")));
    }
    match ct.alg {
        0 => {}
        21 => parts.push("alg=ftp".into()),
        69 => parts.push("alg=tftp".into()),
        n => parts.push(format!("alg={n}")),
    }
    write!(f, "ct({})", parts.join(","))
}

/// Writes a match as `match_format` does, with `priority=N` first unless it is the default.
pub fn write_match(f: &mut Formatter<'_>, m: &Match, priority: Option<u16>) -> fmt::Result {
    let mut it = Items { f, any: false };
    if let Some(p) = priority.filter(|&p| p != OFP_DEFAULT_PRIORITY) {
        it.item(format_args!("priority={p}"))?;
    }
    // conj_id, then the conntrack fields, come before the eth_type keyword in match_format
    // (decimal, no mask: OVS's `conj_id=%u`).
    if let Some(id) = m.conj_id {
        it.item(format_args!("conj_id={id}"))?;
    }
    if let Some(cs) = m.ct_state.as_ref().filter(|cs| cs.mask() & 0xff != 0) {
        it.item(format_args!("ct_state={}", CtStateText(cs.value() & 0xff, cs.mask() & 0xff)))?;
    }
    if let Some(z) = m.ct_zone {
        it.item(format_args!("ct_zone={z}"))?;
    }
    if let Some(cm) = shown(&m.ct_mark) {
        it.item(format_args!("ct_mark={}", hex_masked(cm)))?;
    }
    match &m.eth {
        EthMatch::Ipv4(ip) => {
            it.item(format_args!("{}", ip.proto.as_ref().and_then(ip_proto_name).unwrap_or("ip")))?
        }
        EthMatch::Ipv6(ip) => it.item(format_args!("{}", ip6_keyword(ip.proto.as_ref())))?,
        EthMatch::Arp(_) => it.item(format_args!("arp"))?,
        EthMatch::Rarp(_) => it.item(format_args!("rarp"))?,
        EthMatch::Other(t) => {
            if let Some(n) = eth_type_name(*t) {
                it.item(format_args!("{n}"))?
            }
        }
        EthMatch::Any => {}
    }
    for (i, r) in m.regs.iter().enumerate() {
        if let Some(r) = shown(r) {
            it.item(format_args!("reg{i}={}", hex_masked(r)))?;
        }
    }
    if let Some(t) = shown(&m.tun_id) {
        it.item(format_args!("tun_id={}", hex_masked(t)))?;
    }
    if let Some(t) = shown(&m.tun_src) {
        it.item(format_args!("tun_src={}", ip_masked(t)))?;
    }
    if let Some(t) = shown(&m.tun_dst) {
        it.item(format_args!("tun_dst={}", ip_masked(t)))?;
    }
    if let Some(t) = shown(&m.tun_ipv6_src) {
        it.item(format_args!("tun_ipv6_src={}", ip6_masked(t)))?;
    }
    if let Some(t) = shown(&m.tun_ipv6_dst) {
        it.item(format_args!("tun_ipv6_dst={}", ip6_masked(t)))?;
    }
    if let Some(p) = m.in_port {
        it.item(format_args!("in_port={p}"))?;
    }
    if let EthMatch::Other(t) = m.eth {
        if eth_type_name(t).is_none() {
            it.item(format_args!("dl_type=0x{t:04x}"))?;
        }
    }
    match &m.eth {
        EthMatch::Ipv4(ip) => {
            if let Some(s) = shown(&ip.src) {
                it.item(format_args!("nw_src={}", ip_masked(s)))?;
            }
            if let Some(d) = shown(&ip.dst) {
                it.item(format_args!("nw_dst={}", ip_masked(d)))?;
            }
            if let Some(p) = ip.proto.as_ref().filter(|p| ip_proto_name(p).is_none()) {
                it.item(format_args!("nw_proto={}", p.number()))?;
            }
            if let Some(t) = ip.frag.and_then(frag_text) {
                it.item(format_args!("nw_frag={t}"))?;
            }
            match &ip.proto {
                Some(IpProto::Tcp { dst: Some(d) }) | Some(IpProto::Udp { dst: Some(d) }) | Some(IpProto::Sctp { dst: Some(d) })
                    if d.mask() != 0 =>
                {
                    it.item(format_args!("tp_dst={}", port_masked(d)))?
                }
                _ => {}
            }
        }
        EthMatch::Ipv6(ip) => {
            if let Some(s) = shown(&ip.src) {
                it.item(format_args!("ipv6_src={}", ip6_masked(s)))?;
            }
            if let Some(d) = shown(&ip.dst) {
                it.item(format_args!("ipv6_dst={}", ip6_masked(d)))?;
            }
            // `0x%05x`, masked or not (match_format).
            if let Some(l) = shown(&ip.label) {
                if l.is_exact() {
                    it.item(format_args!("ipv6_label=0x{:05x}", l.value()))?;
                } else {
                    it.item(format_args!("ipv6_label=0x{:05x}/0x{:05x}", l.value(), l.mask()))?;
                }
            }
            if let Some(p) = ip.proto.as_ref().filter(|p| ip6_keyword(Some(p)) == "ipv6") {
                it.item(format_args!("nw_proto={}", p.number()))?;
            }
            if let Some(t) = ip.frag.and_then(frag_text) {
                it.item(format_args!("nw_frag={t}"))?;
            }
            match &ip.proto {
                Some(Ip6Proto::L4(IpProto::Tcp { dst: Some(d) } | IpProto::Udp { dst: Some(d) } | IpProto::Sctp { dst: Some(d) }))
                    if d.mask() != 0 =>
                {
                    it.item(format_args!("tp_dst={}", port_masked(d)))?
                }
                Some(Ip6Proto::Icmpv6(i)) => write_icmpv6(&mut it, i)?,
                _ => {}
            }
        }
        EthMatch::Arp(a) | EthMatch::Rarp(a) => {
            if let Some(s) = shown(&a.spa) {
                it.item(format_args!("arp_spa={}", ip_masked(s)))?;
            }
            if let Some(t) = shown(&a.tpa) {
                it.item(format_args!("arp_tpa={}", ip_masked(t)))?;
            }
            if let Some(op) = a.op {
                it.item(format_args!("arp_op={op}"))?;
            }
            if let Some(s) = shown(&a.sha) {
                it.item(format_args!("arp_sha={}", mac_masked(s)))?;
            }
            if let Some(t) = shown(&a.tha) {
                it.item(format_args!("arp_tha={}", mac_masked(t)))?;
            }
        }
        EthMatch::Any | EthMatch::Other(_) => {}
    }
    for r in &m.other {
        it.item(format_args!("{}", raw_oxm(r)))?;
    }
    Ok(())
}

/// The ICMPv6 part of match_format: type and code as `icmp_type`/`icmp_code` (decimal), then
/// the neighbour discovery fields.
fn write_icmpv6(it: &mut Items<'_, '_>, i: &Icmpv6Match) -> fmt::Result {
    if let Some(t) = i.typ {
        it.item(format_args!("icmp_type={t}"))?;
    }
    if let Some(c) = i.code {
        it.item(format_args!("icmp_code={c}"))?;
    }
    if let Some(t) = shown(&i.nd_target) {
        it.item(format_args!("nd_target={}", ip6_masked(t)))?;
    }
    if let Some(s) = shown(&i.nd_sll) {
        it.item(format_args!("nd_sll={}", mac_masked(s)))?;
    }
    if let Some(t) = shown(&i.nd_tll) {
        it.item(format_args!("nd_tll={}", mac_masked(t)))?;
    }
    Ok(())
}

impl Display for Match {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write_match(f, self, None)
    }
}

impl Display for Subfield {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.field())?;
        if self.is_whole() {
            f.write_str("[]")
        } else if self.n_bits() == 1 {
            write!(f, "[{}]", self.ofs())
        } else {
            write!(f, "[{}..{}]", self.ofs(), self.ofs() + self.n_bits() - 1)
        }
    }
}

impl Display for Action {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Action::Output { port, max_len } => {
                if port.is_regular() {
                    write!(f, "output:{}", port.0)
                } else if *port == PortNo::CONTROLLER {
                    write!(f, "CONTROLLER:{max_len}")
                } else {
                    write!(f, "{port}")
                }
            }
            Action::SetField(sf) => match sf {
                SetField::TunDst(a) => write!(f, "set_field:{a}->tun_dst"),
                SetField::TunSrc(a) => write!(f, "set_field:{a}->tun_src"),
                SetField::TunIpv6Dst(a) => write!(f, "set_field:{}->tun_ipv6_dst", Ipv6Text(*a)),
                SetField::TunIpv6Src(a) => write!(f, "set_field:{}->tun_ipv6_src", Ipv6Text(*a)),
                SetField::Ipv6Src(a) => write!(f, "set_field:{}->ipv6_src", Ipv6Text(*a)),
                SetField::Ipv6Dst(a) => write!(f, "set_field:{}->ipv6_dst", Ipv6Text(*a)),
                SetField::TunId(v) => write!(f, "set_field:{}->tun_id", AltHex(*v)),
                SetField::Reg(n, v) => write!(f, "set_field:{}->reg{n}", AltHex(*v as u64)),
                SetField::CtMark(v) => write!(f, "set_field:{}->ct_mark", AltHex(*v as u64)),
                SetField::EthDst(m) => write!(f, "set_field:{m}->eth_dst"),
                SetField::Other(r) => write!(f, "set_field:{}", raw_oxm(r)),
            },
            Action::RegLoad { dst, value } => write!(f, "load:{}->{dst}", AltHex(*value)),
            Action::RegMove(m) => write!(f, "move:{}->{}", m.src(), m.dst()),
            Action::OutputReg { src, .. } => write!(f, "output:{src}"),
            Action::Note(n) => {
                f.write_str("note:")?;
                for (i, b) in n.bytes().iter().enumerate() {
                    if i > 0 {
                        f.write_char('.')?;
                    }
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
            // OVS's format_RESUBMIT: `resubmit:PORT` when only the port is given, otherwise
            // `resubmit([PORT],[TABLE])` with IN_PORT and table 255 left empty.
            Action::ResubmitTable { in_port, table } => write_resubmit(f, *in_port, *table),
            Action::Resubmit { in_port } => write_resubmit(f, *in_port, 255),
            Action::Ct(ct) => write_ct(f, ct),
            // OVS's format_CONJUNCTION: the clause 1-based.
            Action::Conjunction(c) => write!(f, "conjunction({},{}/{})", c.id(), c.clause(), c.n_clauses()),
            Action::Controller(c) => write!(f, "{c}"),
            Action::Unknown(raw) => {
                f.write_str("unknown_action(0x")?;
                for b in raw.iter() {
                    write!(f, "{b:02x}")?;
                }
                f.write_char(')')
            }
        }
    }
}

fn write_resubmit(f: &mut Formatter<'_>, in_port: u16, table: u8) -> fmt::Result {
    let port = port16(in_port);
    if port != PortNo::IN_PORT && table == 255 {
        return write!(f, "resubmit:{port}");
    }
    f.write_str("resubmit(")?;
    if port != PortNo::IN_PORT {
        write!(f, "{port}")?;
    }
    f.write_char(',')?;
    if table != 255 {
        write!(f, "{table}")?;
    }
    f.write_char(')')
}

/// Writes the `actions=` part: instructions in OVS's canonical order, `drop` if nothing.
pub fn write_instructions(f: &mut Formatter<'_>, ins: &[Instruction]) -> fmt::Result {
    let mut sorted: Vec<&Instruction> = ins.iter().collect();
    sorted.sort_by_key(|i| i.canonical_rank());
    let mut it = Items { f, any: false };
    for i in sorted {
        match i {
            Instruction::Meter(m) => it.item(format_args!("meter:{m}"))?,
            Instruction::ApplyActions(acts) => {
                for a in acts {
                    it.item(format_args!("{a}"))?;
                }
            }
            Instruction::ClearActions => it.item(format_args!("clear_actions"))?,
            // OVS keeps an empty write-actions instruction (unlike an empty apply-actions, whose
            // actions are simply inlined) and prints it as `write_actions(drop)`.
            Instruction::WriteActions(acts) if acts.is_empty() => it.item(format_args!("write_actions(drop)"))?,
            Instruction::WriteActions(acts) => {
                let inner: Vec<String> = acts.iter().map(|a| a.to_string()).collect();
                it.item(format_args!("write_actions({})", inner.join(",")))?
            }
            Instruction::WriteMetadata { metadata, mask } => {
                if *mask == u64::MAX {
                    it.item(format_args!("write_metadata:{}", AltHex(*metadata)))?
                } else {
                    it.item(format_args!("write_metadata:{}/{}", AltHex(*metadata), AltHex(*mask)))?
                }
            }
            Instruction::GotoTable(t) => it.item(format_args!("goto_table:{t}"))?,
            Instruction::Unknown(raw) => it.item(format_args!("unknown_instruction({} bytes)", raw.len()))?,
        }
    }
    if !it.any {
        it.f.write_str("drop")?;
    }
    Ok(())
}

/// Wraps instructions for `Display`.
pub struct InstructionsText<'a>(pub &'a [Instruction]);
impl Display for InstructionsText<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write_instructions(f, self.0)
    }
}

fn write_flags(f: &mut Formatter<'_>, flags: FlowModFlags) -> fmt::Result {
    for (flag, name) in [
        (FlowModFlags::SEND_FLOW_REM, "send_flow_rem "),
        (FlowModFlags::CHECK_OVERLAP, "check_overlap "),
        (FlowModFlags::RESET_COUNTS, "reset_counts "),
        (FlowModFlags::NO_PKT_COUNTS, "no_packet_counts "),
        (FlowModFlags::NO_BYT_COUNTS, "no_byte_counts "),
    ] {
        if flags.contains(flag) {
            f.write_str(name)?;
        }
    }
    Ok(())
}

/// The common tail of a flow line: timeouts, flags, match, `actions=`.
fn write_flow_tail(
    f: &mut Formatter<'_>,
    idle: u16,
    hard: u16,
    flags: FlowModFlags,
    m: &Match,
    priority: u16,
    ins: &[Instruction],
) -> fmt::Result {
    if idle != 0 {
        write!(f, "idle_timeout={idle}, ")?;
    }
    if hard != 0 {
        write!(f, "hard_timeout={hard}, ")?;
    }
    write_flags(f, flags)?;
    let mut s = String::new();
    {
        struct M<'a>(&'a Match, u16);
        impl Display for M<'_> {
            fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
                write_match(f, self.0, Some(self.1))
            }
        }
        let _ = write!(s, "{}", M(m, priority));
    }
    if !s.is_empty() {
        f.write_str(&s)?;
        f.write_char(' ')?;
    }
    f.write_str("actions=")?;
    write_instructions(f, ins)
}

/// A FLOW_MOD as the flow it installs, in `dump-flows --no-stats` form:
/// `cookie=0x5, table=20, priority=100,ip,in_port=3,nw_src=10.128.2.5 actions=...` (cookie and
/// table only when non-zero).
impl Display for FlowMod {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if self.cookie != 0 {
            write!(f, "cookie={:#x}, ", self.cookie)?;
        }
        if self.table_id != 0 {
            write!(f, "table={}, ", self.table_id)?;
        }
        write_flow_tail(f, self.idle_timeout, self.hard_timeout, self.flags, &self.match_, self.priority, &self.instructions)
    }
}

fn write_duration(f: &mut Formatter<'_>, sec: u32, nsec: u32) -> fmt::Result {
    write!(f, "{sec}")?;
    if nsec > 0 {
        if nsec.is_multiple_of(1_000_000) {
            write!(f, ".{:03}", nsec / 1_000_000)?;
        } else {
            let frac = format!("{nsec:09}");
            f.write_str(".")?;
            f.write_str(frac.trim_end_matches('0'))?;
        }
    }
    f.write_char('s')
}

fn write_count(f: &mut Formatter<'_>, v: u64) -> fmt::Result {
    if v == u64::MAX {
        f.write_char('?')
    } else {
        write!(f, "{v}")
    }
}

/// A flow-stats entry as one `dump-flows` line (without the leading space), with statistics.
impl Display for FlowStats {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "cookie=0x{:x}, duration=", self.cookie)?;
        write_duration(f, self.duration_sec, self.duration_nsec)?;
        write!(f, ", table={}, n_packets=", self.table_id)?;
        write_count(f, self.packet_count)?;
        f.write_str(", n_bytes=")?;
        write_count(f, self.byte_count)?;
        f.write_str(", ")?;
        write_flow_tail(f, self.idle_timeout, self.hard_timeout, self.flags, &self.match_, self.priority, &self.instructions)
    }
}

/// `dump-flows --no-stats` form of a flow-stats entry.
pub struct NoStats<'a>(pub &'a FlowStats);

impl FlowStats {
    pub fn no_stats(&self) -> NoStats<'_> {
        NoStats(self)
    }
}

impl Display for NoStats<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if s.cookie != 0 {
            write!(f, "cookie=0x{:x}, ", s.cookie)?;
        }
        if s.table_id != 0 {
            write!(f, "table={}, ", s.table_id)?;
        }
        write_flow_tail(f, s.idle_timeout, s.hard_timeout, s.flags, &s.match_, s.priority, &s.instructions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::RegMove;
    use crate::field::NxmField;
    use crate::flow_match::{ArpMatch, Ipv4Match};
    use crate::msg::{FlowModCommand, OfMessage};
    use crate::wire::hex;

    #[test]
    fn e24_text() {
        // Wire reference §5.4 / §11.2: decode the captured bytes, print them as dump-flows does.
        let bytes = hex(
            "040e0108 00000002 0000000000000abc 0000000000000000 09 00 0000 0000 0005 ffffffff ffffffff ffffffff 0000 0000
             0001 0059 80000004 00000007 80000a02 0800 80001708 0a000000 ff000000 80001804 0a010101 80001401 11
             80002002 12b5 80004c08 0000000000000005 00013e04 01010101 00014004 02020202 00010708 00000001 00000001
             00000000000000
             0004 0070 00000000
             0019 0010 00014004 03030303 00000000
             ffff 0018 00002320 0006 0020 0000 0000 00012008 00010004
             ffff 0018 00002320 0007 001f 00010004 0000000000000005
             ffff 0018 00002320 000f 001f 00010404 ffff 000000000000
             ffff 0010 00002320 0008 0003 00000000
             0001 0008 0a 000000",
        );
        let m = OfMessage::decode(&bytes).unwrap();
        let crate::msg::Message::FlowMod(fm) = &m.msg else { panic!("{m:?}") };
        assert_eq!(
            fm.to_string(),
            "cookie=0xabc, table=9, priority=5,udp,reg3=0x1/0x1,tun_id=0x5,tun_src=1.1.1.1,tun_dst=2.2.2.2,\
             in_port=7,nw_src=10.0.0.0/8,nw_dst=10.1.1.1,tp_dst=4789 actions=set_field:3.3.3.3->tun_dst,\
             move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],load:0x5->NXM_NX_REG0[],output:NXM_NX_REG2[],\
             note:00.03.00.00.00.00,goto_table:10"
        );
        assert_eq!(m.to_bytes().unwrap(), bytes, "re-encodes byte for byte");
    }

    #[test]
    fn seed_shapes() {
        let pod = FlowMod::add(
            20,
            100,
            Match::any().in_port(3).arp(ArpMatch {
                spa: Some(Masked::exact(Ipv4Addr::new(10, 128, 2, 5))),
                sha: Some(Masked::exact("0a:58:0a:80:02:05".parse().unwrap())),
                ..Default::default()
            }),
            vec![Action::load_reg(0, 0), Action::note([0xab, 0xcd])],
            Some(21),
        );
        assert_eq!(
            pod.to_string(),
            "table=20, priority=100,arp,in_port=3,arp_spa=10.128.2.5,arp_sha=0a:58:0a:80:02:05 \
             actions=load:0->NXM_NX_REG0[],note:ab.cd.00.00.00.00,goto_table:21"
        );
        let drop = FlowMod::add(0, 0, Match::any(), vec![], None);
        assert_eq!(drop.to_string(), "priority=0 actions=drop");
        let note = FlowMod::add(253, OFP_DEFAULT_PRIORITY, Match::any(), vec![Action::note([1, 3])], None);
        assert_eq!(note.to_string(), "table=253, actions=note:01.03.00.00.00.00");
        let svc = FlowMod::add(
            60,
            100,
            Match::any().ipv4(Ipv4Match {
                dst: Some(Masked::exact(Ipv4Addr::new(172, 30, 0, 10))),
                frag: Some(IpFrag::Later),
                ..Default::default()
            }),
            vec![],
            Some(80),
        );
        assert_eq!(svc.to_string(), "table=60, priority=100,ip,nw_dst=172.30.0.10,nw_frag=later actions=goto_table:80");
        let mv = Action::RegMove(
            RegMove::new(Subfield::whole(NxmField::Reg(0)), Subfield::bits(NxmField::TunId, 0, 31).unwrap()).unwrap(),
        );
        assert_eq!(mv.to_string(), "move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31]");
        let m = Match::any().reg(1, 0).reg(0, 7);
        assert_eq!(m.to_string(), "reg0=0x7,reg1=0");
        let del = FlowMod::new(FlowModCommand::DeleteStrict, 0, OFP_DEFAULT_PRIORITY, Match::any());
        assert_eq!(del.to_string(), "actions=drop");
    }

    #[test]
    fn zero_masks_print_nothing() {
        // `ovs-ofctl ofp-parse` of such a match prints only what is left (found by the
        // ofp_parse oracle suite): `ip,nw_dst=0.0.0.0/0,tcp,tp_dst=0/0,reg3=0/0` prints as `tcp`.
        let mut m = Match::any().ipv4(Ipv4Match {
            src: Masked::cidr(Ipv4Addr::new(10, 0, 0, 0), 8),
            dst: Masked::cidr(Ipv4Addr::new(10, 1, 2, 3), 0),
            proto: Some(IpProto::Tcp { dst: Some(Masked::new(80, 0)) }),
            ..Default::default()
        });
        m.regs[3] = Some(Masked::new(5, 0));
        m.tun_id = Some(Masked::new(1, 0));
        m.tun_src = Some(Masked::new(Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::UNSPECIFIED));
        m.tun_dst = Some(Masked::new(Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::UNSPECIFIED));
        assert_eq!(m.to_string(), "tcp,nw_src=10.0.0.0/8");
        let arp = Match::any().arp(ArpMatch {
            spa: Masked::cidr(Ipv4Addr::new(10, 0, 0, 1), 0),
            tpa: Some(Masked::exact(Ipv4Addr::new(10, 0, 0, 2))),
            sha: Some(Masked::new(MacAddr([1; 6]), MacAddr([0; 6]))),
            tha: Some(Masked::new(MacAddr([1; 6]), MacAddr([0; 6]))),
            op: None,
        });
        assert_eq!(arp.to_string(), "arp,arp_tpa=10.0.0.2");
    }

    /// Fixes found against OVS 3.1 (each also checked by the ofp_parse / ofctl_capture oracles).
    #[test]
    fn ovs_3_1_spellings() {
        use crate::action::{Ct, CtZone};
        // No `igmp` keyword in OVS 3.1's output.
        let m = Match::any().ipv4(Ipv4Match { proto: Some(IpProto::Other(2)), ..Default::default() });
        assert_eq!(m.to_string(), "ip,nw_proto=2");
        // resubmit: table 255 means "no table".
        for (a, want) in [
            (Action::ResubmitTable { in_port: 5, table: 255 }, "resubmit:5"),
            (Action::ResubmitTable { in_port: 0xfffe, table: 255 }, "resubmit:LOCAL"),
            (Action::ResubmitTable { in_port: 0xfffe, table: 3 }, "resubmit(LOCAL,3)"),
            (Action::ResubmitTable { in_port: 0xfff8, table: 3 }, "resubmit(,3)"),
            (Action::ResubmitTable { in_port: 0xfff8, table: 255 }, "resubmit(,)"),
            (Action::Resubmit { in_port: 0xfffa }, "resubmit:NORMAL"),
            (Action::output(PortNo::IN_PORT), "IN_PORT"),
            (Action::output(PortNo::NORMAL), "NORMAL"),
            (Action::output(PortNo::ANY), "ANY"),
        ] {
            assert_eq!(a.to_string(), want);
        }
        assert_eq!(Match::any().in_port(PortNo::LOCAL).to_string(), "in_port=LOCAL");
        // RARP prints like ARP.
        let rarp = Match { eth: EthMatch::Rarp(ArpMatch { op: Some(1), ..Default::default() }), ..Match::any() };
        assert_eq!(rarp.to_string(), "rarp,arp_op=1");
        // Conntrack.
        let reg0 = CtZone::Field(Subfield::bits(NxmField::Reg(0), 0, 15).unwrap());
        for (ct, want) in [
            (Ct::new().commit().table(30), "ct(commit,table=30)"),
            (Ct::new().table(30).zone(reg0), "ct(table=30,zone=NXM_NX_REG0[0..15])"),
            (Ct::new(), "ct()"),
            (
                Ct { alg: 21, ..Ct::new().commit().zone(CtZone::Imm(5)).exec(vec![Action::SetField(SetField::CtMark(1))]) },
                "ct(commit,zone=5,exec(set_field:0x1->ct_mark),alg=ftp)",
            ),
        ] {
            assert_eq!(Action::Ct(ct).to_string(), want);
        }
        let ip = || Match::any().ipv4(Ipv4Match::default());
        assert_eq!(ip().ct_state(0x28, 0x28).to_string(), "ct_state=+rpl+trk,ip");
        assert_eq!(ip().ct_state(0x22, 0x23).to_string(), "ct_state=-new+est+trk,ip");
        assert_eq!(ip().ct_state(0x22, 0xff).to_string(), "ct_state=est|trk,ip");
        assert_eq!(ip().ct_state(0, 0xffff_ffff).to_string(), "ct_state=0,ip");
        let m = Match { ct_zone: Some(5), ct_mark: Some(Masked::new(3, 0xf)), ..ip() };
        assert_eq!(m.to_string(), "ct_zone=5,ct_mark=0x3/0xf,ip");
        // Conjunctive match (OVS 3.1 `ofp-parse`: `ADD conj_id=5,ip,in_port=3 ...`).
        assert_eq!(Action::conjunction(1, 2, 3).unwrap().to_string(), "conjunction(1,2/3)");
        assert_eq!(Action::conjunction(u32::MAX, 64, 64).unwrap().to_string(), "conjunction(4294967295,64/64)");
        let m = Match::any().conj_id(5).in_port(3).ct_state(0x20, 0x20).ipv4(Ipv4Match::default());
        assert_eq!(m.to_string(), "conj_id=5,ct_state=+trk,ip,in_port=3");
    }

    /// IPv6 spellings, each also checked against OVS 3.1 by the ofp_parse / ofctl_capture oracles.
    #[test]
    fn ipv6_spellings() {
        use crate::flow_match::{Icmpv6Match, Ipv6Match};
        let a = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert_eq!(Ipv6Text(a("::10.0.0.1")).to_string(), "::10.0.0.1");
        assert_eq!(Ipv6Text(a("::ffff:10.0.0.1")).to_string(), "::ffff:10.0.0.1");
        assert_eq!(Ipv6Text(a("::1")).to_string(), "::1");
        assert_eq!(Ipv6Text(a("fd00:0:0:1::")).to_string(), "fd00:0:0:1::");
        let v6 = |ip: Ipv6Match| Match::any().ipv6(ip);
        let m = v6(Ipv6Match {
            src: Masked::cidr(a("fd00::9"), 64),
            dst: Some(Masked::new(a("fd00::1"), a("ffff::ffff"))),
            label: Some(Masked::new(5, 0xf)),
            frag: Some(IpFrag::No),
            proto: Some(Ip6Proto::L4(IpProto::Udp { dst: Some(Masked::exact(53)) })),
        });
        assert_eq!(m.to_string(), "udp6,ipv6_src=fd00::/64,ipv6_dst=fd00::1/ffff::ffff,ipv6_label=0x00005/0x0000f,nw_frag=no,tp_dst=53");
        let nd = Icmpv6Match {
            typ: Some(136),
            code: Some(0),
            nd_target: Some(Masked::exact(a("fd00::1"))),
            nd_tll: Some(Masked::exact(MacAddr([0x0a, 0x58, 0, 0, 0, 1]))),
            ..Default::default()
        };
        let m = v6(Ipv6Match { label: Some(Masked::exact(1)), proto: Some(Ip6Proto::Icmpv6(nd)), ..Default::default() });
        assert_eq!(m.to_string(), "icmp6,ipv6_label=0x00001,icmp_type=136,icmp_code=0,nd_target=fd00::1,nd_tll=0a:58:00:00:00:01");
        let m = v6(Ipv6Match { proto: Some(Ip6Proto::L4(IpProto::Other(47))), ..Default::default() });
        assert_eq!(m.to_string(), "ipv6,nw_proto=47");
        assert_eq!(Match::any().tun_ipv6_dst(a("fd00::2")).to_string(), "tun_ipv6_dst=fd00::2");
        assert_eq!(Action::SetField(SetField::TunIpv6Dst(a("fd00::1"))).to_string(), "set_field:fd00::1->tun_ipv6_dst");
    }

    #[test]
    fn durations() {
        struct D(u32, u32);
        impl Display for D {
            fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
                write_duration(f, self.0, self.1)
            }
        }
        assert_eq!(D(148, 857_000_000).to_string(), "148.857s");
        assert_eq!(D(3, 0).to_string(), "3s");
        assert_eq!(D(3, 120_500_000).to_string(), "3.1205s");
    }
}
