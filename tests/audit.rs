//! The NetworkPolicy audit log against a real ovs-vswitchd (userspace datapath, dummy ports):
//! packets injected with `ovs-appctl netdev-dummy/receive` go through the datapath, the audit
//! flow's metered `controller(...)` action sends copies to the agent as NXT_PACKET_IN2, and the
//! agent writes one JSON line per copy. ovs-ofctl/ovs-appctl/ovs-vsctl are oracles only.
//!
//! No wall-clock thresholds: deadlines only bound waiting, and the flood's bound is computed
//! from the time the flood measurably took.

mod support;

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openflow::{Action, Controller, FlowMod, FlowStatsRequest, Ipv4Match, Match, PortNo};
use sdn_model::pipeline::audit::{log_action, Direction, Verdict, AUDIT_METER_ID};
use sdn_node::audit::{self, AuditConfig, Sink};
use sdn_harness::sandbox::OvsSandbox;
use sdn_node::switch::{packet_in_channel, Backoff, PacketInMsg, Supervisor, Switch, SwitchEvent, SwitchOptions};
use support::*;

const T: Duration = Duration::from_secs(30);

const A1: Ipv4Addr = Ipv4Addr::new(10, 128, 0, 2);
const B1: Ipv4Addr = Ipv4Addr::new(10, 128, 0, 4);

fn run(c: &mut Command) -> String {
    let out = c.output().expect("spawn");
    assert!(out.status.success(), "{c:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn vsctl(sb: &OvsSandbox, args: &[&str]) -> String {
    run(Command::new("ovs-vsctl").arg(format!("--db={}", sb.db_socket())).arg("--timeout=20").args(args).envs(sb.ovs_env()))
}

fn appctl(sb: &OvsSandbox, args: &[&str]) -> String {
    let pid = sb.vswitchd_pid().expect("vswitchd pid");
    let ctl = sb.dir().join(format!("ovs-vswitchd.{pid}.ctl"));
    run(Command::new("ovs-appctl").arg("--timeout=30").arg(format!("--target={}", ctl.display())).args(args).envs(sb.ovs_env()))
}

/// br0 (dummy datapath) with dummy ports p1 (ofport 1) and p2 (ofport 2).
async fn switch_with_ports() -> OvsSandbox {
    let sb = sandbox_with_bridge().await;
    for (p, n) in [("p1", "1"), ("p2", "2")] {
        vsctl(&sb, &["add-port", "br0", p, "--", "set", "interface", p, "type=dummy", &format!("ofport_request={n}")]);
    }
    sb
}

/// A TCP SYN from `src:sport` to `dst:dport`, 300 bytes long, as hex for netdev-dummy/receive.
fn tcp_hex(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> String {
    let b = etherparse::PacketBuilder::ethernet2([0x0a, 0x58, 10, 128, 0, 2], [0x0a, 0x58, 10, 128, 0, 4])
        .ipv4(src.octets(), dst.octets(), 64)
        .tcp(sport, dport, 1, 1024)
        .syn();
    let mut v = Vec::new();
    b.write(&mut v, &[0u8; 246]).unwrap();
    v.iter().map(|b| format!("{b:02x}")).collect()
}

/// Injects `n` copies of `hex` on p1, at most 100 per unixctl call: netdev-dummy's receive
/// queue holds 100 packets (NETDEV_DUMMY_MAX_QUEUE) and drops the rest, so each batch waits
/// until p1 has received the one before (its rx counter, the oracle).
async fn inject(sb: &OvsSandbox, hex: &str, n: u64) {
    let base = rx_packets(sb, "1");
    let mut sent = 0;
    while sent < n {
        let k = (n - sent).min(100);
        let mut args = vec!["netdev-dummy/receive", "p1"];
        args.extend(std::iter::repeat_n(hex, k as usize));
        appctl(sb, &args);
        sent += k;
        let want = base + sent;
        eventually("p1 to take the batch", async || rx_packets(sb, "1") >= want).await;
    }
}

/// The audit flow: `ip` from p1, logged (allow, ingress, team-a/web rule 2), out to p2.
async fn install_audit_flow(sw: &Switch, meter: u32) -> FlowMod {
    let m = Match::any().in_port(1).ipv4(Ipv4Match::default());
    let actions = vec![log_action(meter, Verdict::Allow, Direction::Ingress, "team-a", "web", 2), Action::output(2)];
    let fm = FlowMod::add(0, 100, m, actions, None);
    sw.send_flow_mods(std::slice::from_ref(&fm)).await.expect("flow installed");
    fm
}

async fn flow_packets(sw: &Switch) -> u64 {
    let flows = sw.dump_flows(FlowStatsRequest::default()).await.unwrap();
    flows.iter().filter(|f| f.priority == 100).map(|f| f.packet_count).sum()
}

/// Polls `cond` until it holds or the deadline passes (then fails with `what`).
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let until = Instant::now() + T;
    while !cond().await {
        assert!(Instant::now() < until, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// `tx pkts` or `rx pkts` of a port, from `ovs-ofctl dump-ports` (the oracle).
fn port_count(sb: &OvsSandbox, port: &str, key: &str) -> u64 {
    let out = ofctl(sb, &["dump-ports", "br0", port]);
    let i = out.find(key).unwrap_or_else(|| panic!("{key} in {out}")) + key.len();
    out[i..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
}

fn tx_packets(sb: &OvsSandbox, port: &str) -> u64 {
    port_count(sb, port, "tx pkts=")
}

fn rx_packets(sb: &OvsSandbox, port: &str) -> u64 {
    port_count(sb, port, "rx pkts=")
}

fn pods() -> Arc<dyn audit::PodLookup> {
    Arc::new(|ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(A1) => Some("team-a/a1".to_string()),
        std::net::IpAddr::V4(B1) => Some("team-b/b1".to_string()),
        _ => None,
    })
}

/// What OVS 3.1's userspace datapath offers, and that it takes our meter and our action.
#[tokio::test]
async fn userspace_datapath_supports_meters_and_controller_meter_id() {
    let sb = switch_with_ports().await;
    let sw = Switch::connect(&mgmt(&sb), SwitchOptions::default()).await.unwrap();
    let f = sw.meter_features().await.unwrap();
    eprintln!("meter features of the userspace datapath: {f:?}");
    eprintln!("ovs-ofctl meter-features: {}", ofctl(&sb, &["meter-features", "br0"]));
    assert!(f.supports_pktps_drop(), "{f:?}");
    audit::install(&sw, 100, 20).await.unwrap();
    // Again: the meters exist now, so this is the MODIFY path.
    audit::install(&sw, 50, 5).await.unwrap();
    let meters = ofctl(&sb, &["dump-meters", "br0"]);
    assert!(meters.contains("meter=1 pktps burst stats bands=\ntype=drop rate=50 burst_size=5"), "{meters}");
    assert!(meters.contains("meter=controller pktps burst stats bands=\ntype=drop rate=50 burst_size=5"), "{meters}");
    let fm = install_audit_flow(&sw, AUDIT_METER_ID).await;
    // OVS holds and prints our action exactly as our Display prints it.
    let dump = ofctl(&sb, &["dump-flows", "br0", "--no-stats"]);
    assert!(
        dump.contains("actions=controller(max_len=128,userdata=01.00.00.00.02.74.65.61.6d.2d.61.2f.77.65.62,meter_id=1),output:2"),
        "{dump}"
    );
    let back = sw.dump_flows(FlowStatsRequest::default()).await.unwrap();
    let flow = back.iter().find(|f| f.priority == 100).expect("our flow");
    assert_eq!(flow.instructions, fm.instructions, "the switch returns the typed action unchanged");
}

/// One packet: exactly one event, with the policy, the 5-tuple and the pods.
#[tokio::test]
async fn one_packet_gives_one_event() {
    let sb = switch_with_ports().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let cfg = AuditConfig::new(100, 20, Sink::File(log.clone()), "node-1");
    let (h, on_connect) = audit::start(cfg, pods()).await.unwrap();
    let sup = Supervisor::spawn_with(&mgmt(&sb), SwitchOptions::default(), Backoff::default(), Some(on_connect)).unwrap();
    let sw = tokio::time::timeout(T, sup.connected()).await.unwrap();
    let c = h.counters.clone();
    // The set-up ran before the connection was published: the meter is there already.
    assert_eq!(c.setups(), 1, "set up before the connection is handed out");
    let meters = ofctl(&sb, &["dump-meters", "br0"]);
    assert!(meters.contains("meter=1 pktps burst stats"), "{meters}");
    install_audit_flow(&sw, AUDIT_METER_ID).await;

    inject(&sb, &tcp_hex(A1, B1, 40000, 80), 1).await;
    eventually("one event", async || c.events() == 1).await;
    eventually("the flow's counter", async || flow_packets(&sw).await == 1).await;
    appctl(&sb, &["revalidator/wait"]);
    sw.barrier().await.unwrap();
    h.stop().await;
    assert_eq!((c.events(), c.dropped(), c.invalid(), c.received()), (1, 0, 0, 1));
    let got = lines(&log);
    assert_eq!(got.len(), 1, "{got:?}");
    let e = &got[0];
    assert_eq!(e["policy"], "team-a/web");
    assert_eq!(e["rule"], 2);
    assert_eq!(e["direction"], "ingress");
    assert_eq!(e["verdict"], "allow");
    assert_eq!(e["proto"], "tcp");
    assert_eq!(e["src"], "10.128.0.2:40000");
    assert_eq!(e["dst"], "10.128.0.4:80");
    assert_eq!(e["src_pod"], "team-a/a1");
    assert_eq!(e["dst_pod"], "team-b/b1");
    assert_eq!(e["node"], "node-1");
    assert!(e["time"].as_str().unwrap().ends_with('Z'), "{e}");
    // The packet itself was forwarded.
    assert_eq!(tx_packets(&sb, "2"), 1);
}

/// 10,000 packets: every one forwarded, at most burst + rate * elapsed copies reach the agent.
#[tokio::test]
async fn a_flood_is_limited_by_the_meter_and_still_forwarded() {
    const N: u64 = 10_000;
    const RATE: u32 = 100;
    const BURST: u32 = 20;
    let sb = switch_with_ports().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let (h, on_connect) = audit::start(AuditConfig::new(RATE, BURST, Sink::File(log.clone()), "node-1"), pods()).await.unwrap();
    let sup = Supervisor::spawn_with(&mgmt(&sb), SwitchOptions::default(), Backoff::default(), Some(on_connect)).unwrap();
    let sw = tokio::time::timeout(T, sup.connected()).await.unwrap();
    let c = h.counters.clone();
    assert_eq!(c.setups(), 1, "set up before the connection is handed out");
    install_audit_flow(&sw, AUDIT_METER_ID).await;

    // The meter's bucket holds at most BURST when the first packet arrives, and refills at
    // RATE a second until the last packet has been through the datapath.
    let start = Instant::now();
    inject(&sb, &tcp_hex(A1, B1, 40000, 80), N).await;
    // Port counters are the netdev's own (flow counters lag: revalidators push them).
    eventually("the flood through the datapath", async || tx_packets(&sb, "2") == N).await;
    let elapsed = start.elapsed();
    let bound = BURST as u64 + (RATE as f64 * elapsed.as_secs_f64()).ceil() as u64;

    // What the meter let through, by OVS's own count (the oracle): in - dropped by the band.
    let stats = ofctl(&sb, &["meter-stats", "br0", "meter=1"]);
    let num = |key: &str, text: &str| -> u64 {
        let i = text.find(key).unwrap_or_else(|| panic!("{key} in {stats}")) + key.len();
        text[i..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
    };
    let into_meter = num("packet_in_count:", &stats);
    let band_dropped = num("0: packet_count:", &stats);
    let passed = into_meter - band_dropped;
    eprintln!("flood: {N} packets in {elapsed:?}; meter passed {passed}, bound {bound}; {stats}");
    assert_eq!(into_meter, N, "every packet's copy went through the meter");
    // Our own client reads the same counters.
    let ours = sw.meter_stats(AUDIT_METER_ID).await.unwrap();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!((ours[0].meter_id, ours[0].packet_in_count, ours[0].bands[0].0), (AUDIT_METER_ID, N, band_dropped));
    assert!(passed >= 1 && passed <= bound, "meter passed {passed}, bound {bound}");

    // Every copy the meter passed reaches the writer (nothing dropped at this rate).
    eventually("the passed copies at the agent", async || c.received() == passed).await;
    h.stop().await;
    assert_eq!(c.events(), passed);
    assert_eq!(c.dropped(), 0);
    assert_eq!(lines(&log).len() as u64, passed);
    // The packets themselves were all forwarded (above): the meter only limits the copies.
    appctl(&sb, &["revalidator/wait"]);
    assert_eq!(flow_packets(&sw).await, N);
}

/// A subscriber that never reads: the switch's reader drops and counts, and requests on the
/// same connection keep completing.
#[tokio::test]
async fn a_stalled_subscriber_never_blocks_the_connection() {
    let sb = switch_with_ports().await;
    let sw = Switch::connect(&mgmt(&sb), SwitchOptions::default()).await.unwrap();
    let (sink, mut ins) = packet_in_channel(1);
    sw.set_packet_in_sink(sink);
    sw.enable_packet_ins(128).await.unwrap();
    // Unmetered, so that every packet makes a packet-in.
    let m = Match::any().in_port(1).ipv4(Ipv4Match::default());
    let ctl = Action::Controller(Controller::new().max_len(64).userdata(vec![1u8, 0, 0, 0, 0, b'a', b'/', b'b']));
    sw.send_flow_mods(&[FlowMod::add(0, 100, m, vec![ctl, Action::output(2)], None)]).await.unwrap();

    inject(&sb, &tcp_hex(A1, B1, 1, 2), 500).await;
    let counters = ins.counters.clone();
    eventually("dropped packet-ins", async || counters.dropped() > 0).await;
    // The channel is full and nobody reads it: the connection still answers.
    for _ in 0..10 {
        sw.barrier().await.unwrap();
        sw.echo().await.unwrap();
    }
    eventually("all 500 forwarded", async || tx_packets(&sb, "2") == 500).await;
    assert_eq!(counters.delivered(), 1);
    let Some(PacketInMsg::Nx(p)) = ins.rx.recv().await else { panic!("expected an NXT_PACKET_IN2") };
    assert_eq!(p.userdata.as_deref(), Some(&[1u8, 0, 0, 0, 0, b'a', b'/', b'b'][..]));
    // OVS 3.1 sends the whole packet whatever the action's max_len says (the upcall keeps
    // `packet_len = dp_packet_size(packet)`, ofproto-dpif-upcall.c; the async message's
    // `max_len` is never applied in connmgr.c): the agent must not rely on the cut.
    assert_eq!((p.packet.len(), p.full_len), (300, None));
    assert_eq!(p.metadata().unwrap().in_port, Some(PortNo(1)));
}

/// The meter and the packet-in settings come back after ovs-vswitchd restarts.
#[tokio::test]
async fn meter_and_packet_ins_are_set_up_again_after_a_reconnect() {
    let mut sb = switch_with_ports().await;
    let opts = SwitchOptions { echo_interval: Some(Duration::from_millis(200)), ..SwitchOptions::default() };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.log");
    let (h, on_connect) = audit::start(AuditConfig::new(100, 20, Sink::File(log.clone()), "node-1"), pods()).await.unwrap();
    let backoff = Backoff { initial: Duration::from_millis(50), max: Duration::from_millis(200) };
    let sup = Supervisor::spawn_with(&mgmt(&sb), opts, backoff, Some(on_connect)).unwrap();
    let mut events = sup.subscribe();
    tokio::time::timeout(T, sup.connected()).await.unwrap();
    let c = h.counters.clone();
    assert_eq!(c.setups(), 1, "the first set-up, before the connection is handed out");

    sb.stop_vswitchd().unwrap();
    sb.start_vswitchd().await.unwrap();
    // The engine resyncs on this event: by then the new switch has the meter.
    // (Subscribed before the first connection: this test runs on one thread, so the
    // supervisor's task had not run yet. The second Connected is the reconnect.)
    let sw = tokio::time::timeout(T, async {
        let mut connected = 0;
        loop {
            if let Ok(SwitchEvent::Connected(sw)) = events.recv().await {
                connected += 1;
                if connected == 2 {
                    return sw;
                }
            }
        }
    })
    .await
    .expect("reconnected");
    assert_eq!(c.setups(), 2, "set up again before the reconnect is announced");
    let meters = ofctl(&sb, &["dump-meters", "br0"]);
    assert!(meters.contains("meter=1 pktps burst stats"), "{meters}");
    // The restarted switch lost the flows: the engine would reinstall them; here, the test.
    install_audit_flow(&sw, AUDIT_METER_ID).await;
    inject(&sb, &tcp_hex(A1, B1, 40001, 443), 1).await;
    eventually("an event on the new connection", async || c.events() == 1).await;
    h.stop().await;
    assert_eq!(lines(&log)[0]["dst"], "10.128.0.4:443");
    assert_eq!(c.setup_errors(), 0);
}

/// OVS 3.1 resolves a `controller(meter_id=N)` when the flow is installed: a flow added before
/// meter N exists stays without it (ofproto.c ofproto_fix_controller_action, "unknown meter
/// id"). Such a flow (a resync racing the setup) is still limited, by OVS's `controller` meter,
/// which `audit::install` sets to the same rate.
#[tokio::test]
async fn a_flow_installed_before_the_meter_is_still_limited() {
    const N: u64 = 2_000;
    const RATE: u32 = 50;
    const BURST: u32 = 10;
    let sb = switch_with_ports().await;
    let sw = Switch::connect(&mgmt(&sb), SwitchOptions::default()).await.unwrap();
    let (sink, ins) = packet_in_channel(4096);
    sw.set_packet_in_sink(sink);
    install_audit_flow(&sw, AUDIT_METER_ID).await;
    audit::install(&sw, RATE, BURST).await.unwrap();

    let start = Instant::now();
    inject(&sb, &tcp_hex(A1, B1, 40000, 80), N).await;
    eventually("the flood through the datapath", async || tx_packets(&sb, "2") == N).await;
    let bound = BURST as u64 + (RATE as f64 * start.elapsed().as_secs_f64()).ceil() as u64;
    let meter1 = ofctl(&sb, &["meter-stats", "br0", "meter=1"]);
    let ctl = ofctl(&sb, &["meter-stats", "br0", "meter=controller"]);
    eprintln!("flow before meter: bound {bound}\n{meter1}\n{ctl}");
    assert!(meter1.contains("packet_in_count:0 "), "meter 1 is not used by the earlier flow: {meter1}");
    assert!(ctl.contains(&format!("packet_in_count:{N} ")), "the controller meter saw every copy: {ctl}");
    let c = ins.counters.clone();
    // Whatever the controller meter passed arrives; it is within the bound.
    appctl(&sb, &["revalidator/wait"]);
    sw.barrier().await.unwrap();
    let got = c.delivered() + c.dropped();
    assert!(got >= 1 && got <= bound, "{got} packet-ins, bound {bound}");
    // The switch says so in its log: the line tests/netpol_audit.rs checks is never there.
    let log = sb.vswitchd_log();
    assert!(log.contains("unknown meter id"), "{log}");
}
