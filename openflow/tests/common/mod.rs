//! Shared pieces of the independent-oracle suites (`ofp_parse.rs`, `ofctl_capture.rs`): running
//! `ovs-ofctl` with a deadline, and the seed flow shapes (openshift-sdn's `ovscontroller.go`,
//! every `otx.AddFlow` format string) each given three ways:
//! - `ofctl`: the flow string as the seed hands it to `ovs-ofctl add-flow`;
//! - `fm`: the same flow built with the typed API (never parsed from text);
//! - `parsed`: what `ovs-ofctl -O OpenFlow13 parse-flow` / `ofp-parse` print for it, written
//!   here literally (obtained from OVS 3.1's own parser and printer, not from this crate).

#![allow(dead_code)]

use std::io::Read;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use openflow::{
    Action, ArpMatch, Ct, CtZone, EthMatch, FlowMod, Icmpv6Match, Instruction, Ip6Proto, IpFrag, IpProto, Ipv4Match, Ipv6Match,
    MacAddr, Masked, Match, NxmField, PortNo, RegMove, SetField, Subfield,
};

/// Deadline for one `ovs-ofctl` run; it is killed after this.
pub const OFCTL_DEADLINE: Duration = Duration::from_secs(20);

/// True if `ovs-ofctl` can be run. If it cannot: fails the test when `CI` is set (CI installs
/// Open vSwitch, so a missing binary there is a broken setup, not a reason to pass), otherwise
/// says why the test is skipped.
pub fn have_ofctl(test: &str) -> bool {
    let ok = Command::new("ovs-ofctl")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: ovs-ofctl is not on PATH but CI is set; install openvswitch-common"
        );
        eprintln!("SKIPPED {test}: ovs-ofctl is not on PATH (install Open vSwitch to run this oracle test)");
    }
    ok
}

/// Runs `ovs-ofctl ARGS`, killing it after [`OFCTL_DEADLINE`]. Panics if it cannot be started
/// or had to be killed.
pub fn run_ofctl<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    let mut child = Command::new("ovs-ofctl")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ovs-ofctl");
    // Drain the pipes in threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait ovs-ofctl") {
            break s;
        }
        if start.elapsed() > OFCTL_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            let args: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
            panic!("ovs-ofctl {args:?} did not finish within {OFCTL_DEADLINE:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output { status, stdout: t_out.join().unwrap_or_default(), stderr: t_err.join().unwrap_or_default() }
}

/// `ovs-ofctl ofp-parse FILE` on the given bytes: the printed text, or a panic with stderr.
pub fn ofp_parse(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(format!("{name}.bin"));
    std::fs::write(&path, bytes).expect("write message file");
    let out = run_ofctl(&[Path::new("ofp-parse"), &path]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{name}: ovs-ofctl ofp-parse failed ({}):\n{stderr}\n{stdout}", out.status);
    assert!(!stderr.contains("ERR") && !stderr.contains("WARN"), "{name}: ovs-ofctl complained:\n{stderr}");
    stdout
}

/// Hex dump for failure messages.
pub fn hexs(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Points at the first differing byte, for readable byte-comparison failures.
pub fn diff_bytes(want: &[u8], got: &[u8]) -> String {
    let first = want.iter().zip(got).position(|(a, b)| a != b).unwrap_or(want.len().min(got.len()));
    format!(
        "lengths {} vs {}, first difference at byte {first}\n ovs:  {}\n ours: {}",
        want.len(),
        got.len(),
        hexs(want),
        hexs(got)
    )
}

// ---------------------------------------------------------------------------------------------
// Seed parameters (one node of a multitenant cluster).

pub const CLUSTER_CIDR: &str = "10.128.0.0/14";
pub const SERVICE_CIDR: &str = "172.30.0.0/16";
pub const LOCAL_SUBNET: &str = "10.128.2.0/23";
pub const GATEWAY: &str = "10.128.2.1";
pub const POD_PORT: u32 = 3;
pub const POD_IP: &str = "10.128.2.5";
pub const POD_MAC: &str = "0a:58:0a:80:02:05";
pub const VNID: u32 = 11;
/// A 32-byte container id, as `getPodNote` turns it into a note.
pub const CONTAINER_ID: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00123456789abcdeffedcba9876543210";
pub const HOST_IP: &str = "192.168.1.12";
pub const HOST_SUBNET: &str = "10.129.0.0/23";
pub const FIXED_HOST_IP: &str = "192.168.1.13";
pub const FIXED_HOST_SUBNET: &str = "10.130.0.0/23";
pub const FIXED_VNID: u64 = 7;
pub const SERVICE_IP: &str = "172.30.0.10";

/// The pipeline's default priority (no `priority=` in the flow string).
pub const DEFAULT_PRIORITY: u16 = 0x8000;

pub fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

pub fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// An IPv6 address, exact or `addr/N`.
pub fn cidr6(s: &str) -> Masked<Ipv6Addr> {
    match s.split_once('/') {
        Some((a, p)) => Masked::cidr(ip6(a), p.parse().unwrap()).unwrap(),
        None => Masked::exact(ip6(s)),
    }
}

/// The IPv6 shapes (name, match, instructions): every IPv6 field and action the crate types,
/// exact and masked. Part of [`extra_shapes`], so every oracle that checks those checks these.
pub fn ipv6_shapes() -> Vec<(&'static str, Match, Vec<Instruction>)> {
    let v6 = |ip: Ipv6Match| Match::any().ipv6(ip);
    let l4 = |p: IpProto| v6(Ipv6Match { proto: Some(Ip6Proto::L4(p)), ..Default::default() });
    let icmp6 = |i: Icmpv6Match| v6(Ipv6Match { proto: Some(Ip6Proto::Icmpv6(i)), ..Default::default() });
    let act = |a: Vec<Action>| vec![Instruction::ApplyActions(a)];
    let mv = |src: Subfield, dst: Subfield| Action::RegMove(RegMove::new(src, dst).expect("same width"));
    vec![
        ("ipv6", v6(Ipv6Match::default()), vec![]),
        (
            "ipv6 cidr and exact",
            v6(Ipv6Match { src: Some(cidr6("fd00:10:128::/64")), dst: Some(cidr6("fd00::5")), ..Default::default() })
                .in_port(3),
            vec![],
        ),
        (
            "ipv6 non-cidr masks",
            v6(Ipv6Match {
                src: Some(Masked::new(ip6("fd00::1"), ip6("ffff::ffff"))),
                dst: Some(cidr6("2001:db8::/32")),
                ..Default::default()
            }),
            vec![],
        ),
        // inet_ntop keeps the dotted tail of an IPv4-compatible address.
        ("ipv6 v4-compatible and mapped", v6(Ipv6Match { src: Some(cidr6("::10.0.0.1")), dst: Some(cidr6("::ffff:10.0.0.2")), ..Default::default() }), vec![]),
        ("ipv6 label", v6(Ipv6Match { label: Some(Masked::exact(0x12345)), ..Default::default() }), vec![]),
        ("ipv6 label masked", v6(Ipv6Match { label: Some(Masked::new(0x5, 0xf)), ..Default::default() }), vec![]),
        (
            "ipv6 frag and label",
            v6(Ipv6Match {
                dst: Some(cidr6("fd00::/8")),
                label: Some(Masked::exact(1)),
                frag: Some(IpFrag::Later),
                ..Default::default()
            }),
            vec![],
        ),
        ("ipv6 frag not_later", v6(Ipv6Match { frag: Some(IpFrag::NotLater), ..Default::default() }), vec![]),
        ("tcp6", l4(IpProto::Tcp { dst: None }), vec![]),
        (
            "tcp6 port",
            v6(Ipv6Match {
                dst: Some(cidr6("fd00::10")),
                proto: Some(Ip6Proto::L4(IpProto::Tcp { dst: Some(Masked::exact(443)) })),
                ..Default::default()
            }),
            vec![],
        ),
        ("udp6 masked port", l4(IpProto::Udp { dst: Some(Masked::new(0x1000, 0xf000)) }), vec![]),
        ("sctp6 port", l4(IpProto::Sctp { dst: Some(Masked::exact(9000)) }), vec![]),
        ("ipv6 gre", l4(IpProto::Other(47)), vec![]),
        ("icmp6", icmp6(Icmpv6Match::default()), vec![]),
        ("icmp6 echo", icmp6(Icmpv6Match { typ: Some(128), code: Some(0), ..Default::default() }), vec![]),
        ("icmp6 code only", icmp6(Icmpv6Match { code: Some(3), ..Default::default() }), vec![]),
        (
            "nd solicit",
            icmp6(Icmpv6Match {
                typ: Some(135),
                code: Some(0),
                nd_target: Some(cidr6("fd00::1")),
                nd_sll: Some(Masked::exact(mac("0a:58:0a:80:00:01"))),
                nd_tll: None,
            }),
            vec![],
        ),
        (
            "nd advert masked",
            icmp6(Icmpv6Match {
                typ: Some(136),
                code: None,
                nd_target: Some(cidr6("fd00::/64")),
                nd_sll: None,
                nd_tll: Some(Masked::new(mac("0a:58:00:00:00:00"), mac("ff:ff:00:00:00:00"))),
            }),
            vec![],
        ),
        (
            "tunnel ipv6",
            Match { tun_ipv6_dst: Some(cidr6("fd00:1::/48")), ..Match::any().tun_ipv6_src(ip6("fd00:1::7")) },
            vec![],
        ),
        (
            "ipv6 set_field forms",
            v6(Ipv6Match::default()),
            act(vec![
                Action::SetField(SetField::TunIpv6Dst(ip6("fd00::1"))),
                Action::SetField(SetField::TunIpv6Src(ip6("fd00::2"))),
                Action::SetField(SetField::Ipv6Src(ip6("2001:db8::1"))),
                Action::SetField(SetField::Ipv6Dst(ip6("::10.0.0.1"))),
            ]),
        ),
        (
            "ipv6 move and load forms",
            v6(Ipv6Match::default()),
            act(vec![
                mv(Subfield::bits(NxmField::Ipv6Src, 0, 31).unwrap(), Subfield::whole(NxmField::Reg(0))),
                mv(Subfield::bits(NxmField::Ipv6Dst, 64, 127).unwrap(), Subfield::whole(NxmField::TunId)),
                mv(Subfield::bits(NxmField::Reg(1), 0, 31).unwrap(), Subfield::bits(NxmField::TunIpv6Dst, 96, 127).unwrap()),
                Action::RegLoad { dst: Subfield::bits(NxmField::TunIpv6Dst, 0, 63).unwrap(), value: 1 },
                Action::RegLoad { dst: Subfield::bits(NxmField::TunIpv6Src, 64, 127).unwrap(), value: 0xfd00_0000_0000_0000 },
            ]),
        ),
    ]
}

/// `A.B.C.D` (exact) or `A.B.C.D/N`.
pub fn cidr(s: &str) -> Masked<Ipv4Addr> {
    match s.split_once('/') {
        Some((a, p)) => Masked::cidr(ip(a), p.parse().expect("prefix")).expect("prefix <= 32"),
        None => Masked::exact(ip(s)),
    }
}

pub fn mac(s: &str) -> MacAddr {
    s.parse().unwrap_or_else(|e| panic!("{e}"))
}

pub fn container_note_bytes() -> Vec<u8> {
    hex::decode(CONTAINER_ID).expect("container id is hex")
}

/// `aa.bb.cc...`, as the seed's `getPodNote` formats a container id.
pub fn container_note_text() -> String {
    container_note_bytes().iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(".")
}

/// `ip[,nw_src=..][,nw_dst=..]`
pub fn m_ip(src: Option<&str>, dst: Option<&str>) -> Match {
    Match::any().ipv4(Ipv4Match { src: src.map(cidr), dst: dst.map(cidr), ..Default::default() })
}

/// `arp[,arp_spa=..][,arp_tpa=..]` (`arp,nw_src=`/`nw_dst=` in the seed's syntax).
pub fn m_arp(spa: Option<&str>, tpa: Option<&str>) -> Match {
    Match::any().arp(ArpMatch { spa: spa.map(cidr), tpa: tpa.map(cidr), ..Default::default() })
}

/// `move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[]`
pub fn mv_tun_id_to_reg0() -> Action {
    Action::RegMove(
        RegMove::new(Subfield::bits(NxmField::TunId, 0, 31).unwrap(), Subfield::whole(NxmField::Reg(0))).unwrap(),
    )
}

/// `move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31]`
pub fn mv_reg0_to_tun_id() -> Action {
    Action::RegMove(
        RegMove::new(Subfield::whole(NxmField::Reg(0)), Subfield::bits(NxmField::TunId, 0, 31).unwrap()).unwrap(),
    )
}

/// `load:V->NXM_NX_TUN_ID[0..31]`
pub fn load_tun_id_lo(v: u64) -> Action {
    Action::RegLoad { dst: Subfield::bits(NxmField::TunId, 0, 31).unwrap(), value: v }
}

/// `set_field:IP->tun_dst`
pub fn set_tun_dst(s: &str) -> Action {
    Action::SetField(SetField::TunDst(ip(s)))
}

/// One seed flow, three ways.
pub struct SeedFlow {
    /// Where in the seed it comes from.
    pub origin: &'static str,
    /// The flow string as the seed passes it to ovs-ofctl.
    pub ofctl: String,
    /// The same flow, typed.
    pub fm: FlowMod,
    /// OVS's printing of the FLOW_MOD (`ADD table:N priority=...,match [cookie:0x..] actions=...`).
    pub parsed: String,
}

fn seed(origin: &'static str, ofctl: impl Into<String>, fm: FlowMod, parsed: impl Into<String>) -> SeedFlow {
    SeedFlow { origin, ofctl: ofctl.into(), fm, parsed: parsed.into() }
}

/// Every flow shape `ovscontroller.go` writes, with the parameters above.
pub fn seed_flows() -> Vec<SeedFlow> {
    let add = FlowMod::add;
    let any = Match::any;
    let out = |p: u32| Action::output(p);
    let reg2_out = || Action::output_reg(2);
    let mv_in = "move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[]";
    let note = container_note_text();
    let mut v = vec![
        // ---- SetupOVS, table 0
        seed(
            "SetupOVS t0 vxlan arp",
            format!("table=0, priority=200, in_port=1, arp, nw_src={CLUSTER_CIDR}, nw_dst={LOCAL_SUBNET}, actions={mv_in},goto_table:10"),
            add(0, 200, m_arp(Some(CLUSTER_CIDR), Some(LOCAL_SUBNET)).in_port(1), vec![mv_tun_id_to_reg0()], Some(10)),
            "ADD priority=200,arp,in_port=1,arp_spa=10.128.0.0/14,arp_tpa=10.128.2.0/23 actions=move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],goto_table:10",
        ),
        seed(
            "SetupOVS t0 vxlan ip",
            format!("table=0, priority=200, in_port=1, ip, nw_src={CLUSTER_CIDR}, nw_dst={LOCAL_SUBNET}, actions={mv_in},goto_table:10"),
            add(0, 200, m_ip(Some(CLUSTER_CIDR), Some(LOCAL_SUBNET)).in_port(1), vec![mv_tun_id_to_reg0()], Some(10)),
            "ADD priority=200,ip,in_port=1,nw_src=10.128.0.0/14,nw_dst=10.128.2.0/23 actions=move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],goto_table:10",
        ),
        seed(
            "SetupOVS t0 vxlan multicast",
            format!("table=0, priority=200, in_port=1, ip, nw_src={CLUSTER_CIDR}, nw_dst=224.0.0.0/4, actions={mv_in},goto_table:10"),
            add(0, 200, m_ip(Some(CLUSTER_CIDR), Some("224.0.0.0/4")).in_port(1), vec![mv_tun_id_to_reg0()], Some(10)),
            "ADD priority=200,ip,in_port=1,nw_src=10.128.0.0/14,nw_dst=224.0.0.0/4 actions=move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],goto_table:10",
        ),
        seed(
            "SetupOVS t0 vxlan drop",
            "table=0, priority=150, in_port=1, actions=drop",
            add(0, 150, any().in_port(1), vec![], None),
            "ADD priority=150,in_port=1 actions=drop",
        ),
        seed(
            "SetupOVS t0 tun0 multicast drop",
            "table=0, priority=250, in_port=2, ip, nw_dst=224.0.0.0/4, actions=drop",
            add(0, 250, m_ip(None, Some("224.0.0.0/4")).in_port(2), vec![], None),
            "ADD priority=250,ip,in_port=2,nw_dst=224.0.0.0/4 actions=drop",
        ),
        seed(
            "SetupOVS t0 tun0 arp",
            format!("table=0, priority=200, in_port=2, arp, nw_src={GATEWAY}, nw_dst={CLUSTER_CIDR}, actions=goto_table:30"),
            add(0, 200, m_arp(Some(GATEWAY), Some(CLUSTER_CIDR)).in_port(2), vec![], Some(30)),
            "ADD priority=200,arp,in_port=2,arp_spa=10.128.2.1,arp_tpa=10.128.0.0/14 actions=goto_table:30",
        ),
        seed(
            "SetupOVS t0 tun0 ip",
            "table=0, priority=200, in_port=2, ip, actions=goto_table:30",
            add(0, 200, m_ip(None, None).in_port(2), vec![], Some(30)),
            "ADD priority=200,ip,in_port=2 actions=goto_table:30",
        ),
        seed(
            "SetupOVS t0 tun0 drop",
            "table=0, priority=150, in_port=2, actions=drop",
            add(0, 150, any().in_port(2), vec![], None),
            "ADD priority=150,in_port=2 actions=drop",
        ),
        seed(
            "SetupOVS t0 container arp",
            "table=0, priority=100, arp, actions=goto_table:20",
            add(0, 100, m_arp(None, None), vec![], Some(20)),
            "ADD priority=100,arp actions=goto_table:20",
        ),
        seed(
            "SetupOVS t0 container ip",
            "table=0, priority=100, ip, actions=goto_table:20",
            add(0, 100, m_ip(None, None), vec![], Some(20)),
            "ADD priority=100,ip actions=goto_table:20",
        ),
        seed("SetupOVS t0 default", "table=0, priority=0, actions=drop", add(0, 0, any(), vec![], None), "ADD priority=0 actions=drop"),
    ];
    // ---- SetupOVS, the `priority=0, actions=drop` table defaults
    for t in [10u8, 20, 40, 50, 60, 70, 80, 90, 110, 120] {
        v.push(seed(
            "SetupOVS table default drop",
            format!("table={t}, priority=0, actions=drop"),
            add(t, 0, any(), vec![], None),
            format!("ADD table:{t} priority=0 actions=drop"),
        ));
    }
    v.extend([
        seed(
            "SetupOVS t21 default",
            "table=21, priority=0, actions=goto_table:30",
            add(21, 0, any(), vec![], Some(30)),
            "ADD table:21 priority=0 actions=goto_table:30",
        ),
        // ---- table 30
        seed(
            "SetupOVS t30 arp gw",
            format!("table=30, priority=300, arp, nw_dst={GATEWAY}, actions=output:2"),
            add(30, 300, m_arp(None, Some(GATEWAY)), vec![out(2)], None),
            "ADD table:30 priority=300,arp,arp_tpa=10.128.2.1 actions=output:2",
        ),
        seed(
            "SetupOVS t30 arp local",
            format!("table=30, priority=200, arp, nw_dst={LOCAL_SUBNET}, actions=goto_table:40"),
            add(30, 200, m_arp(None, Some(LOCAL_SUBNET)), vec![], Some(40)),
            "ADD table:30 priority=200,arp,arp_tpa=10.128.2.0/23 actions=goto_table:40",
        ),
        seed(
            "SetupOVS t30 arp cluster",
            format!("table=30, priority=100, arp, nw_dst={CLUSTER_CIDR}, actions=goto_table:50"),
            add(30, 100, m_arp(None, Some(CLUSTER_CIDR)), vec![], Some(50)),
            "ADD table:30 priority=100,arp,arp_tpa=10.128.0.0/14 actions=goto_table:50",
        ),
        seed(
            "SetupOVS t30 ip gw",
            format!("table=30, priority=300, ip, nw_dst={GATEWAY}, actions=output:2"),
            add(30, 300, m_ip(None, Some(GATEWAY)), vec![out(2)], None),
            "ADD table:30 priority=300,ip,nw_dst=10.128.2.1 actions=output:2",
        ),
        seed(
            "SetupOVS t30 ip service",
            format!("table=30, priority=100, ip, nw_dst={SERVICE_CIDR}, actions=goto_table:60"),
            add(30, 100, m_ip(None, Some(SERVICE_CIDR)), vec![], Some(60)),
            "ADD table:30 priority=100,ip,nw_dst=172.30.0.0/16 actions=goto_table:60",
        ),
        seed(
            "SetupOVS t30 ip local",
            format!("table=30, priority=200, ip, nw_dst={LOCAL_SUBNET}, actions=goto_table:70"),
            add(30, 200, m_ip(None, Some(LOCAL_SUBNET)), vec![], Some(70)),
            "ADD table:30 priority=200,ip,nw_dst=10.128.2.0/23 actions=goto_table:70",
        ),
        seed(
            "SetupOVS t30 ip cluster",
            format!("table=30, priority=100, ip, nw_dst={CLUSTER_CIDR}, actions=goto_table:90"),
            add(30, 100, m_ip(None, Some(CLUSTER_CIDR)), vec![], Some(90)),
            "ADD table:30 priority=100,ip,nw_dst=10.128.0.0/14 actions=goto_table:90",
        ),
        seed(
            "SetupOVS t30 multicast from vxlan",
            "table=30, priority=50, in_port=1, ip, nw_dst=224.0.0.0/4, actions=goto_table:120",
            add(30, 50, m_ip(None, Some("224.0.0.0/4")).in_port(1), vec![], Some(120)),
            "ADD table:30 priority=50,ip,in_port=1,nw_dst=224.0.0.0/4 actions=goto_table:120",
        ),
        seed(
            "SetupOVS t30 multicast from pods",
            "table=30, priority=25, ip, nw_dst=224.0.0.0/4, actions=goto_table:110",
            add(30, 25, m_ip(None, Some("224.0.0.0/4")), vec![], Some(110)),
            "ADD table:30 priority=25,ip,nw_dst=224.0.0.0/4 actions=goto_table:110",
        ),
        seed(
            "SetupOVS t30 ip default",
            "table=30, priority=0, ip, actions=goto_table:100",
            add(30, 0, m_ip(None, None), vec![], Some(100)),
            "ADD table:30 priority=0,ip actions=goto_table:100",
        ),
        seed(
            "SetupOVS t30 arp default",
            "table=30, priority=0, arp, actions=drop",
            add(30, 0, m_arp(None, None), vec![], None),
            "ADD table:30 priority=0,arp actions=drop",
        ),
        seed(
            "SetupOVS t60 vnid 0",
            "table=60, priority=200, reg0=0, actions=output:2",
            add(60, 200, any().reg(0, 0), vec![out(2)], None),
            "ADD table:60 priority=200,reg0=0 actions=output:2",
        ),
        seed(
            "SetupOVS t80 gateway",
            format!("table=80, priority=300, ip, nw_src={GATEWAY}/32, actions=output:NXM_NX_REG2[]"),
            add(80, 300, m_ip(Some(&format!("{GATEWAY}/32")), None), vec![reg2_out()], None),
            "ADD table:80 priority=300,ip,nw_src=10.128.2.1 actions=output:NXM_NX_REG2[]",
        ),
        seed(
            "SetupOVS t100 default",
            "table=100, priority=0, actions=output:2",
            add(100, 0, any(), vec![out(2)], None),
            "ADD table:100 priority=0 actions=output:2",
        ),
        seed(
            "SetupOVS t111 default",
            "table=111, priority=100, actions=goto_table:120",
            add(111, 100, any(), vec![], Some(120)),
            "ADD table:111 priority=100 actions=goto_table:120",
        ),
        seed(
            "SetupOVS t253 version note",
            "table=253, actions=note:01.03",
            add(253, DEFAULT_PRIORITY, any(), vec![Action::note([0x01, 0x03])], None),
            "ADD table:253 actions=note:01.03.00.00.00.00",
        ),
        // ---- setupPodFlows
        seed(
            "setupPodFlows t20 arp",
            format!(
                "table=20, priority=100, in_port={POD_PORT}, arp, nw_src={POD_IP}, arp_sha={POD_MAC}, actions=load:{VNID}->NXM_NX_REG0[], note:{note}, goto_table:21"
            ),
            add(
                20,
                100,
                Match::any().in_port(POD_PORT).arp(ArpMatch {
                    spa: Some(cidr(POD_IP)),
                    sha: Some(Masked::exact(mac(POD_MAC))),
                    ..Default::default()
                }),
                vec![Action::load_reg(0, VNID), Action::note(container_note_bytes())],
                Some(21),
            ),
            format!(
                "ADD table:20 priority=100,arp,in_port=3,arp_spa=10.128.2.5,arp_sha=0a:58:0a:80:02:05 actions=load:0xb->NXM_NX_REG0[],note:{note}.00.00.00.00.00.00,goto_table:21"
            ),
        ),
        seed(
            "setupPodFlows t20 ip",
            format!("table=20, priority=100, in_port={POD_PORT}, ip, nw_src={POD_IP}, actions=load:{VNID}->NXM_NX_REG0[], goto_table:21"),
            add(20, 100, m_ip(Some(POD_IP), None).in_port(POD_PORT), vec![Action::load_reg(0, VNID)], Some(21)),
            "ADD table:20 priority=100,ip,in_port=3,nw_src=10.128.2.5 actions=load:0xb->NXM_NX_REG0[],goto_table:21",
        ),
        seed(
            "setupPodFlows t40 arp",
            format!("table=40, priority=100, arp, nw_dst={POD_IP}, actions=output:{POD_PORT}"),
            add(40, 100, m_arp(None, Some(POD_IP)), vec![out(POD_PORT)], None),
            "ADD table:40 priority=100,arp,arp_tpa=10.128.2.5 actions=output:3",
        ),
        seed(
            "setupPodFlows t70 ip",
            format!(
                "table=70, priority=100, ip, nw_dst={POD_IP}, actions=load:{VNID}->NXM_NX_REG1[], load:{POD_PORT}->NXM_NX_REG2[], goto_table:80"
            ),
            add(70, 100, m_ip(None, Some(POD_IP)), vec![Action::load_reg(1, VNID), Action::load_reg(2, POD_PORT)], Some(80)),
            "ADD table:70 priority=100,ip,nw_dst=10.128.2.5 actions=load:0xb->NXM_NX_REG1[],load:0x3->NXM_NX_REG2[],goto_table:80",
        ),
        // ---- AddHostSubnetRules
        seed(
            "AddHostSubnetRules t10 tun_src",
            format!("table=10, priority=100, tun_src={HOST_IP}, actions=goto_table:30"),
            add(10, 100, any().tun_src(ip(HOST_IP)), vec![], Some(30)),
            "ADD table:10 priority=100,tun_src=192.168.1.12 actions=goto_table:30",
        ),
        seed(
            "AddHostSubnetRules t50 arp (vnid from reg0)",
            format!("table=50, priority=100, arp, nw_dst={HOST_SUBNET}, actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:{HOST_IP}->tun_dst,output:1"),
            add(50, 100, m_arp(None, Some(HOST_SUBNET)), vec![mv_reg0_to_tun_id(), set_tun_dst(HOST_IP), out(1)], None),
            "ADD table:50 priority=100,arp,arp_tpa=10.129.0.0/23 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:192.168.1.12->tun_dst,output:1",
        ),
        seed(
            "AddHostSubnetRules t90 ip (vnid from reg0)",
            format!("table=90, priority=100, ip, nw_dst={HOST_SUBNET}, actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:{HOST_IP}->tun_dst,output:1"),
            add(90, 100, m_ip(None, Some(HOST_SUBNET)), vec![mv_reg0_to_tun_id(), set_tun_dst(HOST_IP), out(1)], None),
            "ADD table:90 priority=100,ip,nw_dst=10.129.0.0/23 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:192.168.1.12->tun_dst,output:1",
        ),
        seed(
            "AddHostSubnetRules t50 arp (fixed vnid)",
            format!("table=50, priority=100, arp, nw_dst={FIXED_HOST_SUBNET}, actions=load:{FIXED_VNID}->NXM_NX_TUN_ID[0..31],set_field:{FIXED_HOST_IP}->tun_dst,output:1"),
            add(50, 100, m_arp(None, Some(FIXED_HOST_SUBNET)), vec![load_tun_id_lo(FIXED_VNID), set_tun_dst(FIXED_HOST_IP), out(1)], None),
            "ADD table:50 priority=100,arp,arp_tpa=10.130.0.0/23 actions=load:0x7->NXM_NX_TUN_ID[0..31],set_field:192.168.1.13->tun_dst,output:1",
        ),
        seed(
            "AddHostSubnetRules t90 ip (fixed vnid)",
            format!("table=90, priority=100, ip, nw_dst={FIXED_HOST_SUBNET}, actions=load:{FIXED_VNID}->NXM_NX_TUN_ID[0..31],set_field:{FIXED_HOST_IP}->tun_dst,output:1"),
            add(90, 100, m_ip(None, Some(FIXED_HOST_SUBNET)), vec![load_tun_id_lo(FIXED_VNID), set_tun_dst(FIXED_HOST_IP), out(1)], None),
            "ADD table:90 priority=100,ip,nw_dst=10.130.0.0/23 actions=load:0x7->NXM_NX_TUN_ID[0..31],set_field:192.168.1.13->tun_dst,output:1",
        ),
    ]);
    // ---- AddServiceRules
    let svc_actions = || vec![Action::load_reg(1, VNID), Action::load_reg(2, 2)];
    let svc_text = "load:0xb->NXM_NX_REG1[],load:0x2->NXM_NX_REG2[],goto_table:80";
    let svc_tail = format!(", priority=100, actions=load:{VNID}->NXM_NX_REG1[], load:2->NXM_NX_REG2[], goto_table:80");
    v.extend([
        seed(
            "AddServiceRules fragments",
            format!("table=60, ip, nw_dst={SERVICE_IP}, ip_frag=later{svc_tail}"),
            add(
                60,
                100,
                Match::any().ipv4(Ipv4Match { dst: Some(cidr(SERVICE_IP)), frag: Some(IpFrag::Later), ..Default::default() }),
                svc_actions(),
                Some(80),
            ),
            format!("ADD table:60 priority=100,ip,nw_dst=172.30.0.10,nw_frag=later actions={svc_text}"),
        ),
        seed(
            "AddServiceRules tcp",
            format!("table=60, ip, nw_dst={SERVICE_IP}, tcp, tcp_dst=80{svc_tail}"),
            add(
                60,
                100,
                Match::any().ipv4(Ipv4Match {
                    dst: Some(cidr(SERVICE_IP)),
                    proto: Some(IpProto::Tcp { dst: Some(Masked::exact(80)) }),
                    ..Default::default()
                }),
                svc_actions(),
                Some(80),
            ),
            format!("ADD table:60 priority=100,tcp,nw_dst=172.30.0.10,tp_dst=80 actions={svc_text}"),
        ),
        seed(
            "AddServiceRules udp",
            format!("table=60, ip, nw_dst={SERVICE_IP}, udp, udp_dst=53{svc_tail}"),
            add(
                60,
                100,
                Match::any().ipv4(Ipv4Match {
                    dst: Some(cidr(SERVICE_IP)),
                    proto: Some(IpProto::Udp { dst: Some(Masked::exact(53)) }),
                    ..Default::default()
                }),
                svc_actions(),
                Some(80),
            ),
            format!("ADD table:60 priority=100,udp,nw_dst=172.30.0.10,tp_dst=53 actions={svc_text}"),
        ),
        // ---- UpdateEgressNetworkPolicyRules
        seed(
            "Egress drop-all",
            format!("table=100, reg0={VNID}, priority=1, actions=drop"),
            add(100, 1, any().reg(0, VNID), vec![], None),
            "ADD table:100 priority=1,reg0=0xb actions=drop",
        ),
        seed(
            "Egress temporary drop (cookie=1)",
            format!("table=100, reg0={VNID}, cookie=1, priority=65535, actions=drop"),
            add(100, 65535, any().reg(0, VNID), vec![], None).with_cookie(1, 0),
            "ADD table:100 priority=65535,reg0=0xb cookie:0x1 actions=drop",
        ),
        seed(
            "Egress deny CIDR",
            format!("table=100, reg0={VNID}, priority=3, ip, nw_dst=203.0.113.0/24, actions=drop"),
            add(100, 3, m_ip(None, Some("203.0.113.0/24")).reg(0, VNID), vec![], None),
            "ADD table:100 priority=3,ip,reg0=0xb,nw_dst=203.0.113.0/24 actions=drop",
        ),
        seed(
            "Egress allow host (DNS IP)",
            format!("table=100, reg0={VNID}, priority=2, ip, nw_dst=198.51.100.7, actions=output:2"),
            add(100, 2, m_ip(None, Some("198.51.100.7")).reg(0, VNID), vec![out(2)], None),
            "ADD table:100 priority=2,ip,reg0=0xb,nw_dst=198.51.100.7 actions=output:2",
        ),
        seed(
            "Egress deny 0.0.0.0/0",
            format!("table=100, reg0={VNID}, priority=1, ip, actions=drop"),
            add(100, 1, m_ip(None, None).reg(0, VNID), vec![], None),
            "ADD table:100 priority=1,ip,reg0=0xb actions=drop",
        ),
        // ---- multicast
        seed(
            "UpdateLocalMulticastFlows t110",
            format!("table=110, reg0={VNID}, actions=goto_table:111"),
            add(110, DEFAULT_PRIORITY, any().reg(0, VNID), vec![], Some(111)),
            "ADD table:110 reg0=0xb actions=goto_table:111",
        ),
        seed(
            "UpdateVXLANMulticastFlows t111",
            format!(
                "table=111, priority=100, actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:{HOST_IP}->tun_dst,output:1,set_field:{FIXED_HOST_IP}->tun_dst,output:1,goto_table:120"
            ),
            add(
                111,
                100,
                any(),
                vec![mv_reg0_to_tun_id(), set_tun_dst(HOST_IP), out(1), set_tun_dst(FIXED_HOST_IP), out(1)],
                Some(120),
            ),
            "ADD table:111 priority=100 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:192.168.1.12->tun_dst,output:1,set_field:192.168.1.13->tun_dst,output:1,goto_table:120",
        ),
        seed(
            "UpdateLocalMulticastFlows t120",
            format!("table=120, priority=100, reg0={VNID}, actions=output:3,output:4"),
            add(120, 100, any().reg(0, VNID), vec![out(3), out(4)], None),
            "ADD table:120 priority=100,reg0=0xb actions=output:3,output:4",
        ),
        // ---- multitenant policy (table 80)
        seed(
            "multitenant t80 same vnid",
            format!("table=80, priority=100, reg0={VNID}, reg1={VNID}, actions=output:NXM_NX_REG2[]"),
            add(80, 100, any().reg(0, VNID).reg(1, VNID), vec![reg2_out()], None),
            "ADD table:80 priority=100,reg0=0xb,reg1=0xb actions=output:NXM_NX_REG2[]",
        ),
        seed(
            "multitenant t80 from global",
            "table=80, priority=200, reg0=0, actions=output:NXM_NX_REG2[]",
            add(80, 200, any().reg(0, 0), vec![reg2_out()], None),
            "ADD table:80 priority=200,reg0=0 actions=output:NXM_NX_REG2[]",
        ),
        seed(
            "multitenant t80 to global",
            "table=80, priority=200, reg1=0, actions=output:NXM_NX_REG2[]",
            add(80, 200, any().reg(1, 0), vec![reg2_out()], None),
            "ADD table:80 priority=200,reg1=0 actions=output:NXM_NX_REG2[]",
        ),
    ]);
    v
}

/// The seed flow with this origin.
pub fn seed_by_origin(origin: &str) -> SeedFlow {
    seed_flows().into_iter().find(|s| s.origin == origin).unwrap_or_else(|| panic!("no seed flow {origin:?}"))
}

/// Splits OVS's `ofp-parse` text of a FLOW_MOD (`ADD table:N <match> [cookie:..] actions=A`)
/// into (match, actions); the match includes `priority=` as in dump-flows.
pub fn parsed_match_actions(parsed: &str) -> (String, String) {
    let (head, actions) = parsed.split_once("actions=").unwrap_or_else(|| panic!("no actions= in {parsed:?}"));
    let mut words: Vec<&str> = head.split_whitespace().collect();
    // Drop the command, `table:N`, and the `key:value` trailer fields (cookie:, idle:, ...).
    let is_trailer = |w: &str| w.contains(':') && !w.contains('=');
    let is_command = |w: &str| matches!(w, "ADD" | "MOD" | "MOD_STRICT" | "DEL" | "DEL_STRICT");
    words.retain(|w| !is_trailer(w) && !is_command(w));
    (words.join(" "), actions.to_string())
}

/// Splits a dump-flows style line (`[cookie=.., ][table=N, ]<match> actions=A`, as our FlowMod
/// Display prints) into (match, actions).
pub fn display_match_actions(line: &str) -> (String, String) {
    let (head, actions) = line.split_once("actions=").unwrap_or_else(|| panic!("no actions= in {line:?}"));
    let mut rest = head.trim();
    for prefix in ["cookie=", "table="] {
        if rest.starts_with(prefix) {
            rest = rest.split_once(", ").map(|(_, r)| r).unwrap_or("");
        }
    }
    (rest.trim().to_string(), actions.to_string())
}

/// Shapes beyond the seed: every match field and action the crate types, masked and zero-mask
/// forms, reserved ports, the other instructions. (name, match, instructions)
pub fn extra_shapes() -> Vec<(&'static str, Match, Vec<Instruction>)> {
    let ipm = |ip: Ipv4Match| Match::any().ipv4(ip);
    let masked_reg = {
        let mut m = Match::any();
        m.regs[15] = Some(Masked::new(0x10, 0xff));
        m.regs[3] = Some(Masked::new(0x5, 0xf0));
        m
    };
    let tun = {
        let mut m = Match::any();
        m.tun_id = Some(Masked::new(0x64, 0xffff));
        m.tun_src = Some(Masked::new(ip("1.2.3.4"), ip("255.255.0.0")));
        m.tun_dst = Some(Masked::new(ip("5.6.7.8"), ip("255.0.255.0")));
        m
    };
    let mut shapes: Vec<(&'static str, Match, Vec<Instruction>)> = Vec::new();
    for (n, f) in [
        ("frag no", IpFrag::No),
        ("frag yes", IpFrag::Yes),
        ("frag first", IpFrag::First),
        ("frag later", IpFrag::Later),
        ("frag not_later", IpFrag::NotLater),
    ] {
        shapes.push((n, ipm(Ipv4Match { frag: Some(f), ..Default::default() }), vec![]));
    }
    shapes.extend(ipv6_shapes());
    let act = |a: Vec<Action>| vec![Instruction::ApplyActions(a)];
    let conj = |id, k, n| Action::conjunction(id, k, n).expect("valid conjunction");
    shapes.extend([
        (
            "tcp masked port",
            ipm(Ipv4Match { proto: Some(IpProto::Tcp { dst: Some(Masked::new(0x50, 0xfff0)) }), ..Default::default() }),
            vec![],
        ),
        ("udp no port", ipm(Ipv4Match { proto: Some(IpProto::Udp { dst: None }), ..Default::default() }), vec![]),
        ("icmp", ipm(Ipv4Match { proto: Some(IpProto::Other(1)), ..Default::default() }), vec![]),
        ("sctp", ipm(Ipv4Match { proto: Some(IpProto::Sctp { dst: None }), ..Default::default() }), vec![]),
        (
            "sctp port",
            ipm(Ipv4Match {
                dst: Some(Masked::exact(ip("10.128.2.5"))),
                proto: Some(IpProto::Sctp { dst: Some(Masked::exact(9000)) }),
                ..Default::default()
            }),
            vec![],
        ),
        (
            "sctp masked port",
            ipm(Ipv4Match { proto: Some(IpProto::Sctp { dst: Some(Masked::new(0x1f90, 0xfffe)) }), ..Default::default() }),
            vec![],
        ),
        ("gre", ipm(Ipv4Match { proto: Some(IpProto::Other(47)), ..Default::default() }), vec![]),
        (
            "ip non-cidr masks",
            ipm(Ipv4Match {
                src: Some(Masked::new(ip("10.1.2.3"), ip("255.0.255.0"))),
                dst: Some(Masked::new(ip("10.1.2.3"), Ipv4Addr::UNSPECIFIED)),
                ..Default::default()
            }),
            vec![],
        ),
        (
            "arp all fields",
            Match::any().arp(ArpMatch {
                op: Some(2),
                spa: Some(cidr("10.0.0.0/8")),
                tpa: Some(cidr("10.0.0.2")),
                sha: Some(Masked::new(mac("00:11:22:33:44:55"), mac("ff:ff:ff:00:00:00"))),
                tha: Some(Masked::exact(mac("66:77:88:99:aa:bb"))),
            }),
            vec![],
        ),
        ("rarp", Match { eth: EthMatch::Rarp(ArpMatch::default()), ..Match::any() }, vec![]),
        ("lldp dl_type", Match { eth: EthMatch::Other(0x88cc), ..Match::any().in_port(PortNo::LOCAL) }, vec![]),
        ("masked regs", masked_reg, vec![]),
        ("tunnel masks", tun, vec![]),
        ("in_port reserved", Match::any().in_port(PortNo::CONTROLLER), vec![]),
        (
            "reserved outputs",
            Match::any(),
            act(vec![
                Action::output(PortNo::IN_PORT),
                Action::output(PortNo::TABLE),
                Action::output(PortNo::NORMAL),
                Action::output(PortNo::FLOOD),
                Action::output(PortNo::ALL),
                Action::Output { port: PortNo::CONTROLLER, max_len: 100 },
                Action::output(PortNo::LOCAL),
                Action::output(0xfeff),
            ]),
        ),
        (
            "set_field forms",
            Match::any(),
            act(vec![
                Action::SetField(SetField::Reg(0, 5)),
                Action::SetField(SetField::Reg(15, 0)),
                Action::SetField(SetField::TunId(0x64)),
                Action::SetField(SetField::TunId(0)),
                Action::SetField(SetField::TunSrc(ip("192.168.1.1"))),
                Action::SetField(SetField::TunDst(ip("192.168.1.2"))),
            ]),
        ),
        (
            "load forms",
            Match::any(),
            act(vec![
                Action::RegLoad { dst: Subfield::bits(NxmField::Reg(0), 0, 15).unwrap(), value: 5 },
                Action::RegLoad { dst: Subfield::bits(NxmField::Reg(7), 31, 31).unwrap(), value: 1 },
                Action::RegLoad { dst: Subfield::whole(NxmField::TunId), value: 0x64 },
                Action::RegLoad { dst: Subfield::whole(NxmField::TunIpv4Dst), value: 0xc0a8_0102 },
                Action::RegLoad { dst: Subfield::whole(NxmField::TunIpv4Src), value: 0 },
                Action::load_reg(5, 0),
            ]),
        ),
        (
            "move forms",
            Match::any(),
            act(vec![
                Action::RegMove(
                    RegMove::new(Subfield::whole(NxmField::Reg(1)), Subfield::whole(NxmField::TunIpv4Dst)).unwrap(),
                ),
                Action::RegMove(
                    RegMove::new(
                        Subfield::bits(NxmField::Reg(0), 0, 15).unwrap(),
                        Subfield::bits(NxmField::TunId, 16, 31).unwrap(),
                    )
                    .unwrap(),
                ),
                Action::RegMove(
                    RegMove::new(Subfield::bits(NxmField::Reg(3), 4, 4).unwrap(), Subfield::bits(NxmField::Reg(4), 9, 9).unwrap())
                        .unwrap(),
                ),
            ]),
        ),
        (
            "output_reg and resubmit",
            Match::any(),
            act(vec![
                Action::OutputReg { src: Subfield::bits(NxmField::Reg(2), 0, 15).unwrap(), max_len: 0xffff },
                Action::output_reg(9),
                Action::ResubmitTable { in_port: 0xfff8, table: 3 },
                Action::ResubmitTable { in_port: 5, table: 30 },
            ]),
        ),
        (
            "notes",
            Match::any(),
            act(vec![Action::note(vec![]), Action::note([1, 2, 3, 4, 5, 6, 7]), Action::note([0xff; 6])]),
        ),
        (
            "all instructions",
            Match::any(),
            vec![
                Instruction::GotoTable(9),
                Instruction::WriteMetadata { metadata: 0x5, mask: 0xff },
                Instruction::WriteActions(vec![Action::output(2), Action::SetField(SetField::Reg(1, 1))]),
                Instruction::ClearActions,
                Instruction::ApplyActions(vec![Action::output(1)]),
            ],
        ),
        ("write_metadata exact", Match::any(), vec![Instruction::WriteMetadata { metadata: 0, mask: u64::MAX }]),
        (
            "zero masks",
            {
                let mut m = Match::any().ipv4(Ipv4Match {
                    src: Masked::cidr(ip("10.0.0.0"), 8),
                    dst: Masked::cidr(ip("10.1.2.3"), 0),
                    proto: Some(IpProto::Udp { dst: Some(Masked::new(53, 0)) }),
                    ..Default::default()
                });
                m.regs[4] = Some(Masked::new(0, 0));
                m.tun_id = Some(Masked::new(0, 0));
                m
            },
            vec![],
        ),
        ("empty apply", Match::any(), vec![Instruction::ApplyActions(vec![])]),
        (
            "rarp arp fields",
            Match {
                eth: EthMatch::Rarp(ArpMatch {
                    op: Some(3),
                    spa: Some(cidr("10.0.0.0/8")),
                    tpa: Some(cidr("10.0.0.2")),
                    sha: Some(Masked::exact(mac("00:11:22:33:44:55"))),
                    tha: Some(Masked::new(mac("66:77:88:99:aa:bb"), mac("ff:ff:ff:00:00:00"))),
                }),
                ..Match::any()
            },
            vec![],
        ),
        ("ip nw_proto=2", ipm(Ipv4Match { proto: Some(IpProto::Other(2)), ..Default::default() }), vec![]),
        ("in_port reserved names", Match::any().in_port(PortNo::LOCAL), vec![]),
        ("in_port IN_PORT", Match::any().in_port(PortNo::IN_PORT), vec![]),
        (
            "resubmit forms",
            Match::any(),
            act(vec![
                Action::ResubmitTable { in_port: 5, table: 255 },
                Action::ResubmitTable { in_port: 0xfffe, table: 255 },
                Action::ResubmitTable { in_port: 0xfffe, table: 3 },
                Action::ResubmitTable { in_port: 0xfffa, table: 255 },
                Action::ResubmitTable { in_port: 0xfff8, table: 4 },
            ]),
        ),
        (
            "nx resubmit",
            Match::any(),
            act(vec![Action::Resubmit { in_port: 5 }, Action::Resubmit { in_port: 0xfffd }]),
        ),
        (
            "ct commit table",
            ipm(Ipv4Match { dst: Some(cidr("10.128.0.0/14")), ..Default::default() }),
            act(vec![Action::Ct(Ct::new().commit().table(30))]),
        ),
        (
            "ct zone from field",
            ipm(Ipv4Match::default()),
            act(vec![Action::Ct(
                Ct::new().table(30).zone(CtZone::Field(Subfield::bits(NxmField::Reg(0), 0, 15).unwrap())),
            )]),
        ),
        (
            "ct zone imm exec alg",
            ipm(Ipv4Match { proto: Some(IpProto::Tcp { dst: None }), ..Default::default() }),
            act(vec![Action::Ct(Ct {
                alg: 21,
                ..Ct::new().commit().zone(CtZone::Imm(5)).exec(vec![Action::SetField(SetField::CtMark(1))])
            })]),
        ),
        ("ct plain", ipm(Ipv4Match::default()), act(vec![Action::Ct(Ct::new()), Action::output(3)])),
        (
            "ct_state +rpl+trk",
            ipm(Ipv4Match::default()).ct_state(0x28, 0x28),
            act(vec![Action::output_reg(2)]),
        ),
        ("ct_state -new+est+trk", ipm(Ipv4Match::default()).ct_state(0x22, 0x23), vec![]),
        (
            "ct_zone ct_mark",
            Match { ct_zone: Some(5), ct_mark: Some(Masked::new(3, 0xf)), ..Match::any().ct_state(0x20, 0x20) },
            vec![],
        ),
        ("ct_mark exact", Match { ct_mark: Some(Masked::exact(0x10)), ..Match::any() }, vec![]),
        (
            "set_field eth_dst",
            ipm(Ipv4Match::default()).ct_state(0x28, 0x28),
            act(vec![Action::SetField(SetField::EthDst(MacAddr([0x0a, 0x58, 0x0a, 0x80, 0, 1]))), Action::output(2)]),
        ),
        // Conjunctive match: clause flows (conjunction and note actions only, as OVS requires)
        // and the conj_id flows that act for them.
        (
            "conjunction clauses",
            ipm(Ipv4Match { src: Some(cidr("10.1.0.0/16")), ..Default::default() }),
            act(vec![conj(1, 1, 2), conj(3, 2, 3)]),
        ),
        ("conjunction limits", Match::any(), act(vec![conj(0, 1, 2), conj(u32::MAX, 64, 64), conj(0x8000_0000, 17, 63)])),
        (
            "conjunction with notes",
            ipm(Ipv4Match { proto: Some(IpProto::Tcp { dst: Some(Masked::exact(443)) }), ..Default::default() }),
            act(vec![Action::note(*b"ABCDEF"), conj(3, 3, 3), Action::note([1, 2])]),
        ),
        ("conj_id", Match::any().conj_id(1), act(vec![Action::output(3)])),
        (
            "conj_id with others",
            ipm(Ipv4Match { dst: Some(cidr("10.0.0.7")), ..Default::default() }).conj_id(u32::MAX).in_port(1).ct_state(0x20, 0x20).reg(3, 9),
            act(vec![Action::ResubmitTable { in_port: 0xfff8, table: 3 }]),
        ),
    ]);
    shapes
}
