//! Codec throughput on the flow shapes the node agent programs (openshift-sdn seed pipeline):
//!
//! - `flow_mod_encode`: FLOW_MOD encode of a pod's table-20 ARP flow (with a 32-byte note), a
//!   table-70 flow and a table-90 remote-subnet flow (move/set_field/output), into a reused
//!   `BytesMut`;
//! - `bundle_add_encode`: the same FLOW_MODs wrapped in ONF BUNDLE_ADD_MESSAGEs;
//! - `flow_stats_decode`: one ~64 KiB OFPMP_FLOW reply of those shapes (elements = entries);
//! - `codec_stream_decode`: `OfCodec` framing + decode of a stream of 1000 mixed messages.
//!
//! Criterion reports elements/s, i.e. messages (or flow entries) per second. Runtime is kept
//! short (20 samples, 3 s each): `cargo bench -p openflow --bench codec`.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tokio_util::codec::Decoder;

use openflow::{
    Action, ArpMatch, BundleAdd, BundleControl, BundleCtrlType, BundleFlags, FlowMod, FlowModFlags, FlowStats, FlowStatsEntry,
    Instruction, Ipv4Match, MacAddr, Masked, Match, Message, MultipartReply, MultipartReplyBody, NxmField, OfCodec,
    OfMessage, RegMove, SetField, Subfield,
};

/// Pod number `i` gets 10.128.x.y, a MAC derived from it, OpenFlow port `3 + i`, VNID `i % 50`.
fn pod_ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 2, 2)) + i)
}

fn pod_mac(i: u32) -> MacAddr {
    let ip = pod_ip(i).octets();
    MacAddr([0x0a, 0x58, ip[0], ip[1], ip[2], ip[3]])
}

/// `table=20, priority=100,arp,in_port=P,arp_spa=IP,arp_sha=MAC
///  actions=load:VNID->NXM_NX_REG0[],note:<32-byte container id>,goto_table:21`
fn table20_arp(i: u32) -> FlowMod {
    let m = Match::any().in_port(3 + i).arp(ArpMatch {
        spa: Some(Masked::exact(pod_ip(i))),
        sha: Some(Masked::exact(pod_mac(i))),
        ..Default::default()
    });
    let note = [(i & 0xff) as u8; 32];
    FlowMod::add(20, 100, m, vec![Action::load_reg(0, i % 50), Action::note(note)], Some(21))
}

/// `table=70, priority=100,ip,nw_dst=IP actions=load:VNID->NXM_NX_REG1[],load:P->NXM_NX_REG2[],goto_table:80`
fn table70(i: u32) -> FlowMod {
    let m = Match::any().ipv4(Ipv4Match { dst: Some(Masked::exact(pod_ip(i))), ..Default::default() });
    FlowMod::add(70, 100, m, vec![Action::load_reg(1, i % 50), Action::load_reg(2, 3 + i)], Some(80))
}

/// `table=90, priority=100,ip,nw_dst=10.129.N.0/23
///  actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:NODE->tun_dst,output:1`
fn table90(i: u32) -> FlowMod {
    let subnet = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 129, 0, 0)) + (i << 9));
    let m = Match::any().ipv4(Ipv4Match { dst: Masked::cidr(subnet, 23), ..Default::default() });
    let mv = RegMove::new(Subfield::whole(NxmField::Reg(0)), Subfield::bits(NxmField::TunId, 0, 31).unwrap()).unwrap();
    let node = Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 17, 0, 3)) + i);
    FlowMod::add(
        90,
        100,
        m,
        vec![Action::RegMove(mv), Action::SetField(SetField::TunDst(node)), Action::output(1)],
        None,
    )
}

fn seed_flow(i: u32) -> FlowMod {
    match i % 3 {
        0 => table20_arp(i / 3),
        1 => table70(i / 3),
        _ => table90(i / 3),
    }
}

const BATCH: u32 = 300;

fn flow_mod_encode(c: &mut Criterion) {
    let msgs: Vec<OfMessage> = (0..BATCH).map(|i| OfMessage::new(i, Message::FlowMod(seed_flow(i)))).collect();
    let total: usize = msgs.iter().map(OfMessage::encoded_len).sum();
    let mut g = c.benchmark_group("flow_mod_encode");
    g.throughput(Throughput::Elements(msgs.len() as u64));
    let mut buf = BytesMut::with_capacity(total);
    g.bench_function("seed_flows_x300", |b| {
        b.iter(|| {
            buf.clear();
            for m in &msgs {
                m.encode(&mut buf).unwrap();
            }
            black_box(buf.len())
        })
    });
    g.finish();
}

fn bundle_add_encode(c: &mut Criterion) {
    let flags = BundleFlags::ATOMIC | BundleFlags::ORDERED;
    let msgs: Vec<OfMessage> = (0..BATCH).map(|i| BundleAdd::flow_mod(1000 + i, 7, flags, seed_flow(i))).collect();
    let total: usize = msgs.iter().map(OfMessage::encoded_len).sum();
    let mut g = c.benchmark_group("bundle_add_encode");
    g.throughput(Throughput::Elements(msgs.len() as u64));
    let mut buf = BytesMut::with_capacity(total);
    g.bench_function("seed_flows_x300", |b| {
        b.iter(|| {
            buf.clear();
            for m in &msgs {
                m.encode(&mut buf).unwrap();
            }
            black_box(buf.len())
        })
    });
    g.finish();
}

fn as_stats(i: u32, fm: FlowMod) -> FlowStats {
    FlowStats {
        table_id: fm.table_id,
        duration_sec: 3600 + i,
        duration_nsec: 123_000_000,
        priority: fm.priority,
        idle_timeout: 0,
        hard_timeout: 0,
        flags: FlowModFlags::empty(),
        cookie: 0,
        packet_count: 1000 * i as u64,
        byte_count: 98_000 * i as u64,
        match_: fm.match_,
        instructions: fm.instructions,
    }
}

/// One flow-stats reply filled up to the 64 KiB message limit.
fn big_flow_stats_reply() -> (Bytes, usize) {
    let mut entries = Vec::new();
    let mut len = 8 + 8; // ofp_header + multipart header
    for i in 0.. {
        let e = as_stats(i, seed_flow(i));
        if len + e.encoded_len() > u16::MAX as usize {
            break;
        }
        len += e.encoded_len();
        entries.push(e);
    }
    let n = entries.len();
    let m = OfMessage::new(
        42,
        Message::MultipartReply(MultipartReply { flags: 0, body: MultipartReplyBody::Flow(entries.into_iter().map(FlowStatsEntry::Typed).collect()) }),
    );
    (m.to_bytes().unwrap(), n)
}

fn flow_stats_decode(c: &mut Criterion) {
    let (bytes, n) = big_flow_stats_reply();
    let mut g = c.benchmark_group("flow_stats_decode");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function(format!("reply_{}B_{n}_entries", bytes.len()), |b| {
        b.iter(|| {
            let m = OfMessage::decode(black_box(&bytes)).unwrap();
            let Message::MultipartReply(MultipartReply { body: MultipartReplyBody::Flow(v), .. }) = m.msg else {
                unreachable!()
            };
            black_box(v.len())
        })
    });
    g.finish();
}

/// 1000 messages as a switch connection sees them during a resync: bundle traffic, barriers,
/// echoes and small flow-stats replies.
fn mixed_stream() -> Bytes {
    let flags = BundleFlags::ATOMIC | BundleFlags::ORDERED;
    let mut buf = BytesMut::new();
    for i in 0..1000u32 {
        let m = match i % 10 {
            0 => OfMessage::new(i, Message::BundleControl(BundleControl::new(7, BundleCtrlType::OpenReply, flags))),
            1..=4 => BundleAdd::flow_mod(i, 7, flags, seed_flow(i)),
            5 | 6 => OfMessage::new(i, Message::FlowMod(seed_flow(i))),
            7 => OfMessage::new(i, Message::BarrierReply),
            8 => OfMessage::new(i, Message::EchoRequest(Bytes::from_static(b"keepalive"))),
            _ => OfMessage::new(
                i,
                Message::MultipartReply(MultipartReply {
                    flags: 0,
                    body: MultipartReplyBody::Flow((i..i + 3).map(|j| FlowStatsEntry::Typed(as_stats(j, seed_flow(j)))).collect()),
                }),
            ),
        };
        m.encode(&mut buf).unwrap();
    }
    buf.freeze()
}

fn codec_stream_decode(c: &mut Criterion) {
    let stream = mixed_stream();
    let mut g = c.benchmark_group("codec_stream_decode");
    g.throughput(Throughput::Elements(1000));
    g.bench_function(format!("mixed_1000_msgs_{}B", stream.len()), |b| {
        b.iter_batched(
            || BytesMut::from(&stream[..]),
            |mut buf| {
                let mut codec = OfCodec::default();
                let mut n = 0u32;
                while let Some(item) = codec.decode(&mut buf).unwrap() {
                    black_box(item.unwrap());
                    n += 1;
                }
                assert_eq!(n, 1000);
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Sanity checks that the benchmark inputs are what they claim to be (run once, not timed).
fn check_inputs() {
    let e = table20_arp(0);
    let Some(Instruction::ApplyActions(a)) = e.instructions.first() else { panic!("{e:?}") };
    let Action::Note(n) = &a[1] else { panic!("{a:?}") };
    assert!(n.has_prefix(&[0; 32]));
    assert_eq!(table90(0).to_string().split(' ').nth(1), Some("priority=100,ip,nw_dst=10.129.0.0/23"));
    let (bytes, n) = big_flow_stats_reply();
    assert!(bytes.len() > 60_000 && (400..=600).contains(&n), "{} bytes, {n} entries", bytes.len());
}

fn config() -> Criterion {
    check_inputs();
    Criterion::default().sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = flow_mod_encode, bundle_add_encode, flow_stats_decode, codec_stream_decode
}
criterion_main!(benches);
