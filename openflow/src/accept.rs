//! Which FLOW_MODs Open vSwitch cannot refuse when they are *added* to a bundle.
//!
//! OVS 3.1 decodes and checks every bundled FLOW_MOD as it arrives (`handle_bundle_add` in
//! `ofproto/ofproto.c`: `ofputil_decode_flow_mod`, then `ofproto_flow_mod_init`). One that fails
//! is answered with an error and *left out* of the still-open bundle, and a COMMIT sent after it
//! applies the rest (wire reference §9.4 A). So a client may send COMMIT without first waiting
//! for a barrier only if no ADD can fail that way. Failures at commit time (overlaps, missing
//! groups or meters, a full table) are different: they roll the whole bundle back.
//!
//! [`add_cannot_fail`] answers that question conservatively: `true` only for flows built
//! entirely from the constructs below, whose add-time checks in OVS 3.1 are all decided by the
//! message itself and the switch's table count, and which this crate's types either make
//! impossible to get wrong or which are checked here:
//!
//! - table: below the FEATURES `n_tables` and not 254 (read-only), never 255 (`add_flow_init`);
//! - match: the typed fields only, with no [`RawOxm`](crate::RawOxm) and no conntrack field
//!   (OVS checks those against the datapath's conntrack support, `rule_check` in
//!   `ofproto-dpif.c`); `in_port` a port OVS can map (`ofputil_port_from_ofp11`); `arp_op`
//!   within 8 bits (`mf_is_value_valid`); no all-zero mask; prerequisites, masks and canonical
//!   order come from the types (see [`flow_match`](crate::flow_match));
//! - instructions: at most one APPLY_ACTIONS and one GOTO_TABLE (`OFPBIC_DUP_INST`), the goto
//!   to a later table below `n_tables` (`check_GOTO_TABLE`);
//! - actions: output to a regular port below 0xff00 or to IN_PORT, TABLE, NORMAL, FLOOD, ALL,
//!   CONTROLLER or LOCAL (`ofpact_check_output_port`); set_field of a register, tun_id,
//!   tun_src, tun_dst, tun_ipv6_src, tun_ipv6_dst or eth_dst (no prerequisites; ct_mark only inside `ct`); load, move and
//!   output_reg on registers and tunnel fields, a load's value within its bits
//!   (`decode_NXAST_RAW_REG_LOAD`); note; resubmit. Not `ct` (datapath support again), not
//!   meters, not anything kept raw;
//! - conjunctive match: a flow with a `conjunction(id,k/n)` action only if its instructions are
//!   one APPLY_ACTIONS holding nothing but `conjunction` and `note` actions. OVS's
//!   `ofpacts_verify` refuses anything else next to a conjunction with NXBAC_BAD_CONJUNCTION:
//!   another action, and also goto_table, clear/write_actions, write_metadata or meter, which
//!   are all actions of the one list it checks; inside write_actions a conjunction is
//!   OFPBAC_BAD_TYPE. Checked against ovs-vswitchd 3.1 (dummy datapath): bundled ADDs of
//!   conjunction with output, goto_table or clear_actions, of `conjunction(id,1/1)`, and of a
//!   conjunction in write_actions are each answered with an error before the commit, while
//!   the conjunctive flows of OVS's tests/classifier.at and `conj_id` flows commit.
//!   The values themselves (`2 <= n <= 64`, `k <= n`, checked by
//!   `decode_NXAST_RAW_CONJUNCTION`) are guaranteed by [`Conjunction`](crate::Conjunction);
//!   `check_CONJUNCTION` checks nothing else, and the rest of OVS's conjunction handling
//!   (`get_conjunctions`, the classifier) refuses nothing: clauses whose id, `n` or priority
//!   do not line up simply never match. A `conj_id` match is any 32-bit value with no
//!   prerequisites and is not one of the hidden fields `add_flow_init` refuses (recirc_id,
//!   dp_hash), so it cannot fail either.
//!
//! Anything else is `false`, which only means "wait for the barrier before committing".

use crate::action::{Action, SetField, Subfield};
use crate::field::NxmField;
use crate::flow_match::{ArpMatch, EthMatch, Ip6Proto, IpFrag, IpProto, Ipv4Match, Ipv6Match, MaskBits, Masked, Match, IPV6_LABEL_MASK};
use crate::instruction::Instruction;
use crate::port::PortNo;

/// The read-only table OVS keeps for itself.
const TABLE_READONLY: u8 = 254;

/// True if OVS 3.1 cannot refuse an ADD or MODIFY_STRICT of this flow when it is added to a
/// bundle on a switch whose FEATURES reply said `n_tables` (see the module docs).
pub fn add_cannot_fail(table: u8, m: &Match, instructions: &[Instruction], n_tables: u8) -> bool {
    table_ok(table, n_tables) && match_ok(m) && instructions_ok(table, instructions, n_tables)
}

fn table_ok(t: u8, n_tables: u8) -> bool {
    t < n_tables && t < TABLE_READONLY
}

fn masked_ok<T: MaskBits>(m: &Option<Masked<T>>) -> bool {
    m.as_ref().is_none_or(|m| m.mask() != T::ZERO)
}

/// A 32-bit OpenFlow 1.3 port OVS maps to its 16-bit space.
fn port_mappable(p: PortNo) -> bool {
    p.0 < 0xff00 || p.0 >= PortNo::MAX.0
}

fn arp_ok(a: &ArpMatch) -> bool {
    a.op.is_none_or(|op| op <= 0xff) && masked_ok(&a.spa) && masked_ok(&a.tpa) && masked_ok(&a.sha) && masked_ok(&a.tha)
}

fn l4_ok(p: Option<IpProto>) -> bool {
    match p {
        None | Some(IpProto::Other(_)) => true,
        Some(IpProto::Tcp { dst } | IpProto::Udp { dst } | IpProto::Sctp { dst }) => masked_ok(&dst),
    }
}

fn ipv4_ok(ip: &Ipv4Match) -> bool {
    masked_ok(&ip.src) && masked_ok(&ip.dst) && !matches!(ip.frag, Some(IpFrag::Other { .. })) && l4_ok(ip.proto)
}

/// IPv6 as IPv4, plus: the flow label's mask must keep some of the 20 label bits (the encoder
/// clears the value's other bits), and the neighbour discovery fields need their ICMPv6 type
/// (`Icmpv6Match::nd_prereqs_ok`, OFPBMC_BAD_PREREQ otherwise).
fn ipv6_ok(ip: &Ipv6Match) -> bool {
    let label = ip.label.is_none_or(|l| l.mask() & IPV6_LABEL_MASK != 0);
    let proto = match ip.proto {
        None => true,
        Some(Ip6Proto::L4(p)) => l4_ok(Some(p)),
        Some(Ip6Proto::Icmpv6(i)) => {
            i.nd_prereqs_ok() && masked_ok(&i.nd_target) && masked_ok(&i.nd_sll) && masked_ok(&i.nd_tll)
        }
    };
    masked_ok(&ip.src) && masked_ok(&ip.dst) && label && !matches!(ip.frag, Some(IpFrag::Other { .. })) && proto
}

fn match_ok(m: &Match) -> bool {
    let eth = match &m.eth {
        EthMatch::Any => true,
        EthMatch::Ipv4(ip) => ipv4_ok(ip),
        EthMatch::Ipv6(ip) => ipv6_ok(ip),
        EthMatch::Arp(a) | EthMatch::Rarp(a) => arp_ok(a),
        // Fields that depend on another eth_type are kept raw.
        EthMatch::Other(_) => false,
    };
    eth && m.in_port.is_none_or(port_mappable)
        && masked_ok(&m.tun_id)
        && masked_ok(&m.tun_src)
        && masked_ok(&m.tun_dst)
        && masked_ok(&m.tun_ipv6_src)
        && masked_ok(&m.tun_ipv6_dst)
        && m.regs.iter().all(masked_ok)
        && m.ct_state.is_none()
        && m.ct_zone.is_none()
        && m.ct_mark.is_none()
        && m.other.is_empty()
}

fn instructions_ok(table: u8, ins: &[Instruction], n_tables: u8) -> bool {
    let has_conjunction =
        ins.iter().any(|i| matches!(i, Instruction::ApplyActions(a) if a.iter().any(|a| matches!(a, Action::Conjunction(_)))));
    if has_conjunction {
        return conjunction_flow_ok(ins);
    }
    let (mut apply, mut goto) = (0, 0);
    for i in ins {
        match i {
            Instruction::ApplyActions(actions) => {
                apply += 1;
                if !actions.iter().all(action_ok) {
                    return false;
                }
            }
            Instruction::GotoTable(t) => {
                goto += 1;
                if *t <= table || *t >= n_tables {
                    return false;
                }
            }
            _ => return false,
        }
    }
    apply <= 1 && goto <= 1
}

/// A flow with a conjunction action: OVS's `ofpacts_verify` allows only `conjunction` and
/// `note` in the whole (flattened) instruction list, so exactly one APPLY_ACTIONS of those.
fn conjunction_flow_ok(ins: &[Instruction]) -> bool {
    let only = |a: &Action| matches!(a, Action::Conjunction(_) | Action::Note(_));
    matches!(ins, [Instruction::ApplyActions(actions)] if actions.iter().all(only))
}

/// Registers and tunnel fields: readable, writable, no prerequisites, any value.
fn plain_field(f: NxmField) -> bool {
    matches!(
        f,
        NxmField::Reg(_)
            | NxmField::TunId
            | NxmField::TunIpv4Src
            | NxmField::TunIpv4Dst
            | NxmField::TunIpv6Src
            | NxmField::TunIpv6Dst
    )
}

fn plain_subfield(s: &Subfield) -> bool {
    plain_field(s.field())
}

fn action_ok(a: &Action) -> bool {
    match a {
        Action::Output { port, .. } => {
            port.0 < 0xff00
                || [PortNo::IN_PORT, PortNo::TABLE, PortNo::NORMAL, PortNo::FLOOD, PortNo::ALL, PortNo::CONTROLLER, PortNo::LOCAL]
                    .contains(port)
        }
        Action::SetField(sf) => {
            // Not ipv6_src/ipv6_dst: those need an `ipv6` match (OFPBAC_MATCH_INCONSISTENT).
            matches!(
                sf,
                SetField::TunDst(_)
                    | SetField::TunSrc(_)
                    | SetField::TunIpv6Dst(_)
                    | SetField::TunIpv6Src(_)
                    | SetField::TunId(_)
                    | SetField::Reg(..)
                    | SetField::EthDst(_)
            )
        }
        Action::RegLoad { dst, value } => plain_subfield(dst) && (dst.n_bits() >= 64 || value >> dst.n_bits() == 0),
        Action::RegMove(m) => plain_subfield(&m.src()) && plain_subfield(&m.dst()),
        Action::OutputReg { src, .. } => plain_subfield(src),
        Action::Note(_) | Action::ResubmitTable { .. } | Action::Resubmit { .. } => true,
        // OVS's check_CONTROLLER accepts any; its decoder refuses unknown properties.
        Action::Controller(c) => c.unknown_props.is_empty(),
        // Acceptable only in a conjunction-only list, which `conjunction_flow_ok` decides.
        Action::Ct(_) | Action::Conjunction(_) | Action::Unknown(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::{Ct, RegMove};
    use crate::flow_match::MacAddr;
    use std::net::Ipv4Addr;

    const N: u8 = 254;

    fn apply(actions: Vec<Action>) -> Vec<Instruction> {
        vec![Instruction::ApplyActions(actions)]
    }

    #[test]
    fn a_pod_like_flow_cannot_fail() {
        let m = Match::any().in_port(17u32).arp(ArpMatch {
            spa: Some(Masked::exact(Ipv4Addr::new(10, 128, 0, 17))),
            sha: Some(Masked::exact(MacAddr([0x0a, 0x58, 10, 128, 0, 17]))),
            ..Default::default()
        });
        let ins = vec![
            Instruction::ApplyActions(vec![Action::load_reg(0, 100), Action::note(vec![1, 2, 3]), Action::output(17u32)]),
            Instruction::GotoTable(21),
        ];
        assert!(add_cannot_fail(20, &m, &ins, N));
        let tun = RegMove::new(Subfield::whole(NxmField::Reg(0)), Subfield::bits(NxmField::TunId, 0, 31).unwrap()).unwrap();
        let acts = vec![Action::RegMove(tun), Action::SetField(SetField::TunDst(Ipv4Addr::new(1, 2, 3, 4))), Action::output(PortNo(1))];
        assert!(add_cannot_fail(90, &Match::any().reg(0, 5), &apply(acts), N));
        assert!(add_cannot_fail(0, &Match::any(), &[], N), "drop");
    }

    /// The shapes OVS's own tests add (tests/classifier.at "conjunctive match ..."): clause flows
    /// with conjunction actions only (and notes), and the `conj_id=N` flow that acts for them.
    #[test]
    fn conjunctive_match_flows() {
        let conj = |id, k, n| Action::conjunction(id, k, n).unwrap();
        let src = Match::any().ipv4(Ipv4Match { src: Some(Masked::exact(Ipv4Addr::new(10, 0, 0, 1))), ..Default::default() });
        assert!(add_cannot_fail(0, &src, &apply(vec![conj(1, 1, 2)]), N));
        assert!(add_cannot_fail(0, &src, &apply(vec![conj(1, 1, 2), conj(3, 2, 3)]), N));
        assert!(add_cannot_fail(0, &Match::any(), &apply(vec![conj(3, 1, 2), Action::note(*b"ABCDEF")]), N));
        assert!(add_cannot_fail(0, &Match::any(), &apply(vec![Action::note(*b"ABCDEF"), conj(3, 1, 2)]), N));
        assert!(add_cannot_fail(0, &Match::any().conj_id(1), &apply(vec![Action::output(3u32)]), N));
        assert!(add_cannot_fail(0, &Match::any().conj_id(u32::MAX).in_port(1u32), &[Instruction::GotoTable(1)], N));
        // "conjunction" with any other action or instruction: NXBAC_BAD_CONJUNCTION.
        assert!(!add_cannot_fail(0, &Match::any(), &apply(vec![Action::output(1u32), conj(3, 1, 2)]), N));
        assert!(!add_cannot_fail(0, &Match::any(), &apply(vec![conj(3, 1, 2), Action::output(1u32)]), N));
        let with = |i: Instruction| vec![Instruction::ApplyActions(vec![conj(3, 1, 2)]), i];
        for other in [
            Instruction::GotoTable(1),
            Instruction::ClearActions,
            Instruction::WriteActions(vec![]),
            Instruction::WriteMetadata { metadata: 1, mask: 1 },
            Instruction::Meter(1),
        ] {
            assert!(!add_cannot_fail(0, &Match::any(), &with(other.clone()), N), "{other:?}");
        }
        // In write_actions (OFPBAC_BAD_TYPE) or nested in ct.
        assert!(!add_cannot_fail(0, &Match::any(), &[Instruction::WriteActions(vec![conj(3, 1, 2)])], N));
        let ct = Action::Ct(Ct::new().exec(vec![conj(3, 1, 2)]));
        assert!(!add_cannot_fail(0, &Match::any(), &apply(vec![ct]), N));
        // Two apply-actions, even of conjunctions only.
        let two = vec![Instruction::ApplyActions(vec![conj(3, 1, 2)]), Instruction::ApplyActions(vec![conj(3, 1, 2)])];
        assert!(!add_cannot_fail(0, &Match::any(), &two, N));
        // The table checks still apply.
        assert!(!add_cannot_fail(N, &Match::any(), &apply(vec![conj(3, 1, 2)]), N));
    }

    #[test]
    fn what_ovs_refuses_when_added_is_not_claimed() {
        let any = Match::any();
        // Backwards or out-of-range goto (OFPBIC_BAD_TABLE_ID).
        assert!(!add_cannot_fail(70, &any, &[Instruction::GotoTable(10)], N));
        assert!(!add_cannot_fail(70, &any, &[Instruction::GotoTable(70)], N));
        assert!(!add_cannot_fail(70, &any, &[Instruction::GotoTable(N)], N));
        // Tables: beyond the switch's, the read-only one, "all".
        assert!(!add_cannot_fail(N, &any, &[], N));
        assert!(!add_cannot_fail(254, &any, &[], 255));
        assert!(!add_cannot_fail(255, &any, &[], 255));
        // Duplicate instructions.
        assert!(!add_cannot_fail(1, &any, &[Instruction::GotoTable(2), Instruction::GotoTable(3)], N));
        // Ports OVS cannot map or output to.
        assert!(!add_cannot_fail(1, &any, &apply(vec![Action::output(PortNo(0xff00))]), N));
        assert!(!add_cannot_fail(1, &any, &apply(vec![Action::output(PortNo::ANY)]), N));
        assert!(!add_cannot_fail(1, &Match::any().in_port(0x1_0000u32), &[], N));
        // arp_op beyond 8 bits.
        assert!(!add_cannot_fail(1, &any.clone().arp(ArpMatch { op: Some(0x100), ..Default::default() }), &[], N));
        // A load whose value does not fit its bits.
        let load = Action::RegLoad { dst: Subfield::bits(NxmField::Reg(7), 31, 31).unwrap(), value: 2 };
        assert!(!add_cannot_fail(1, &any, &apply(vec![load]), N));
        // ct_mark outside ct (OFPBAC_BAD_SET_ARGUMENT); ct itself depends on the datapath.
        assert!(!add_cannot_fail(1, &any, &apply(vec![Action::SetField(SetField::CtMark(1))]), N));
        assert!(!add_cannot_fail(1, &any, &apply(vec![Action::Ct(Ct::new().commit())]), N));
        assert!(!add_cannot_fail(1, &any.clone().ct_state(0x20, 0x20), &[], N));
        // Meters (checked at commit time, but not modelled) and raw pieces.
        assert!(!add_cannot_fail(1, &any, &[Instruction::Meter(1)], N));
        assert!(!add_cannot_fail(1, &any, &apply(vec![Action::Unknown(bytes::Bytes::from_static(&[0; 8]))]), N));
    }

    #[test]
    fn ipv6_flows() {
        use crate::flow_match::Icmpv6Match;
        use std::net::Ipv6Addr;
        let a = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let pod = Match::any().in_port(3u32).ipv6(Ipv6Match { src: Some(Masked::exact(a("fd00::5"))), ..Default::default() });
        let tun = vec![Action::SetField(SetField::TunIpv6Dst(a("fd00::1"))), Action::output(1u32)];
        assert!(add_cannot_fail(20, &pod, &apply(tun), N));
        let nd = |typ, code| {
            let i = Icmpv6Match { typ: Some(typ), code, nd_target: Some(Masked::exact(a("fd00::5"))), ..Default::default() };
            Match::any().ipv6(Ipv6Match { proto: Some(Ip6Proto::Icmpv6(i)), ..Default::default() })
        };
        assert!(add_cannot_fail(20, &nd(135, Some(0)), &[], N));
        assert!(!add_cannot_fail(20, &nd(128, None), &[], N), "nd_target needs type 135/136");
        assert!(!add_cannot_fail(20, &nd(136, Some(1)), &[], N), "and code 0");
        let label0 = Match::any().ipv6(Ipv6Match { label: Some(Masked::new(0, 0xfff0_0000)), ..Default::default() });
        assert!(!add_cannot_fail(20, &label0, &[], N));
        let set_ipv6_src = apply(vec![Action::SetField(SetField::Ipv6Src(a("fd00::1")))]);
        assert!(!add_cannot_fail(20, &pod, &set_ipv6_src, N), "conservative: it has a prerequisite");
    }
}
