//! Independent oracle #2: a fake OpenFlow 1.3 switch on a Unix socket, driven by the real
//! `ovs-ofctl`.
//! (a) Encoder: for each seed flow string, `ovs-ofctl add-flow` / `del-flows` / `--bundle` sends
//!     its own encoding; it must equal, byte for byte (xid and bundle id aside), what our typed
//!     builder encodes for the same flow.
//! (b) Printer: the fake switch answers `dump-flows` with MULTIPART replies we encode from typed
//!     `FlowStats`; every line `ovs-ofctl` prints must equal our `Display` / `no_stats()`.
//!
//! Every socket read and every ovs-ofctl run has a deadline, so a protocol mistake fails the test
//! instead of hanging it. Skipped (with a message) when `ovs-ofctl` is missing, unless `CI` is set.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use openflow::*;

use common::*;

/// How long the fake switch waits for a connection or for the next message.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(15);

/// What the fake switch answers to MULTIPART requests.
#[derive(Clone, Default)]
struct Script {
    /// OFPMP_FLOW: one reply message per inner Vec (all but the last flagged MORE).
    flow_parts: Vec<Vec<FlowStats>>,
    /// OFPMP_PORT_DESC: one reply message per inner Vec.
    port_parts: Vec<Vec<Port>>,
    /// The fragment mode GET_CONFIG reports until a SET_CONFIG changes it.
    frag: Option<FragMode>,
}

/// One message received from ovs-ofctl: its exact bytes and our decoding of them.
#[derive(Clone, Debug)]
struct Received {
    raw: Vec<u8>,
    msg: OfMessage,
}

fn send(s: &mut UnixStream, m: &OfMessage) -> Result<(), String> {
    let b = m.to_bytes().map_err(|e| format!("encode {}: {e}", m.msg.name()))?;
    s.write_all(&b).map_err(|e| format!("write {}: {e}", m.msg.name()))
}

fn send_parts(s: &mut UnixStream, xid: u32, parts: Vec<MultipartReplyBody>) -> Result<(), String> {
    let n = parts.len();
    for (i, body) in parts.into_iter().enumerate() {
        let flags = if i + 1 < n { OFPMPF_MORE } else { 0 };
        send(s, &OfMessage::new(xid, Message::MultipartReply(MultipartReply { flags, body })))?;
    }
    Ok(())
}

/// Reads one whole message, or `None` at EOF.
fn read_msg(s: &mut UnixStream) -> Result<Option<Vec<u8>>, String> {
    let mut head = [0u8; 8];
    match s.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
        Err(e) => return Err(format!("read header: {e}")),
    }
    let len = u16::from_be_bytes([head[2], head[3]]) as usize;
    if len < 8 {
        return Err(format!("bad length {len}"));
    }
    let mut raw = head.to_vec();
    raw.resize(len, 0);
    s.read_exact(&mut raw[8..]).map_err(|e| format!("read body: {e}"))?;
    Ok(Some(raw))
}

/// Serves one ovs-ofctl connection until it closes; returns everything it sent.
fn serve(listener: UnixListener, script: Script) -> Result<Vec<Received>, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > SWITCH_TIMEOUT {
                    return Err("no connection from ovs-ofctl".into());
                }
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(SWITCH_TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(SWITCH_TIMEOUT)).map_err(|e| e.to_string())?;
    send(&mut s, &OfMessage::new(1, Message::Hello(Hello::of13())))?;
    let mut config = SwitchConfig { frag: script.frag.unwrap_or(FragMode::Normal), other_flags: 0, miss_send_len: 0 };
    let mut got = Vec::new();
    while let Some(raw) = read_msg(&mut s)? {
        let msg = OfMessage::decode(&raw).map_err(|e| format!("our decoder rejected {}: {e}", hexs(&raw)))?;
        let xid = msg.xid;
        match &msg.msg {
            Message::EchoRequest(p) => send(&mut s, &OfMessage::new(xid, Message::EchoReply(p.clone())))?,
            Message::FeaturesRequest => send(
                &mut s,
                &OfMessage::new(
                    xid,
                    Message::FeaturesReply(FeaturesReply {
                        datapath_id: 0x0000_ea72_06f7_2743,
                        n_buffers: 0,
                        n_tables: 254,
                        auxiliary_id: 0,
                        capabilities: 0x4f,
                        reserved: 0,
                    }),
                ),
            )?,
            Message::GetConfigRequest => send(&mut s, &OfMessage::new(xid, Message::GetConfigReply(config)))?,
            Message::SetConfig(c) => config = *c,
            Message::BarrierRequest => send(&mut s, &OfMessage::new(xid, Message::BarrierReply))?,
            Message::BundleControl(b) => {
                let reply = match b.ctrl_type {
                    BundleCtrlType::OpenRequest => BundleCtrlType::OpenReply,
                    BundleCtrlType::CloseRequest => BundleCtrlType::CloseReply,
                    BundleCtrlType::CommitRequest => BundleCtrlType::CommitReply,
                    BundleCtrlType::DiscardRequest => BundleCtrlType::DiscardReply,
                    other => return Err(format!("unexpected bundle control {other:?}")),
                };
                let r = BundleControl::new(b.bundle_id, reply, BundleFlags::empty());
                send(&mut s, &OfMessage::new(xid, Message::BundleControl(r)))?
            }
            Message::MultipartRequest(r) => match &r.body {
                MultipartRequestBody::Flow(_) => {
                    let parts = if script.flow_parts.is_empty() { vec![vec![]] } else { script.flow_parts.clone() };
                    send_parts(&mut s, xid, parts.into_iter().map(|p| MultipartReplyBody::Flow(p.into_iter().map(FlowStatsEntry::Typed).collect())).collect())?
                }
                MultipartRequestBody::PortDesc => {
                    let parts = if script.port_parts.is_empty() { vec![vec![]] } else { script.port_parts.clone() };
                    send_parts(&mut s, xid, parts.into_iter().map(MultipartReplyBody::PortDesc).collect())?
                }
                other => return Err(format!("unexpected multipart request {other:?}")),
            },
            _ => {}
        }
        got.push(Received { raw, msg });
    }
    Ok(got)
}

/// A fake switch for one ovs-ofctl run.
struct Switch {
    _dir: tempfile::TempDir,
    path: PathBuf,
    done: mpsc::Receiver<Result<Vec<Received>, String>>,
}

impl Switch {
    fn start(script: Script) -> Switch {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sw.sock");
        let listener = UnixListener::bind(&path).expect("bind fake switch socket");
        let (tx, done) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(serve(listener, script));
        });
        Switch { _dir: dir, path, done }
    }

    fn target(&self) -> String {
        format!("unix:{}", self.path.display())
    }

    fn finish(self) -> Vec<Received> {
        match self.done.recv_timeout(SWITCH_TIMEOUT + Duration::from_secs(5)) {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => panic!("fake switch: {e}"),
            Err(e) => panic!("fake switch did not finish: {e}"),
        }
    }
}

/// Runs `ovs-ofctl -O OpenFlow13 --timeout=10 --no-names <pre...> <cmd> unix:SOCK <args...>`
/// against a fresh fake switch; returns stdout and the messages it sent. Panics if ovs-ofctl
/// failed. (`--no-names`: otherwise ovs-ofctl first fetches table features and port
/// descriptions to accept names in flow strings.)
fn ofctl(pre: &[&str], cmd: &str, args: &[&str], script: Script) -> (String, Vec<Received>) {
    let sw = Switch::start(script);
    let target = sw.target();
    let mut argv: Vec<&str> = vec!["-O", "OpenFlow13", "--timeout=10", "--no-names"];
    argv.extend_from_slice(pre);
    argv.push(cmd);
    argv.push(&target);
    argv.extend_from_slice(args);
    let out = run_ofctl(&argv);
    let got = sw.finish();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ovs-ofctl {argv:?} failed ({}):\n{}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (stdout, got)
}

/// The messages of one type that ovs-ofctl sent (session messages filtered out).
fn sent(got: &[Received], pick: impl Fn(&Message) -> bool) -> Vec<&Received> {
    got.iter().filter(|r| pick(&r.msg.msg)).collect()
}

fn is_flow_mod(m: &Message) -> bool {
    matches!(m, Message::FlowMod(_))
}

/// Asserts `ours` (encoded with `theirs`' xid) equals ovs-ofctl's bytes.
fn assert_same_bytes(what: &str, theirs: &Received, ours: &OfMessage, failures: &mut Vec<String>) {
    let mine = ours.to_bytes().expect("encode").to_vec();
    if mine != theirs.raw {
        failures.push(format!(
            "--- {what}\n  ovs:  {:?}\n  ours: {:?}\n  {}",
            theirs.msg,
            ours,
            diff_bytes(&theirs.raw, &mine)
        ));
    }
}

fn report(failures: Vec<String>, total: usize) {
    assert!(failures.is_empty(), "{} of {total} byte comparisons failed:\n{}", failures.len(), failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// (a) byte-for-byte against ovs-ofctl's encoder

#[test]
fn add_flow_bytes_equal_ovs_ofctl() {
    if !have_ofctl("add_flow_bytes_equal_ovs_ofctl") {
        return;
    }
    let flows = seed_flows();
    let mut failures = Vec::new();
    for s in &flows {
        let (_, got) = ofctl(&[], "add-flow", &[&s.ofctl], Script::default());
        let fms = sent(&got, is_flow_mod);
        assert_eq!(fms.len(), 1, "{}: ovs-ofctl sent {got:?}", s.origin);
        let ours = OfMessage::new(fms[0].msg.xid, Message::FlowMod(s.fm.clone()));
        assert_same_bytes(&format!("{}: add-flow {}", s.origin, s.ofctl), fms[0], &ours, &mut failures);
        // ovs-ofctl finishes with a barrier and waits for our BARRIER_REPLY.
        assert!(matches!(got.last().map(|r| &r.msg.msg), Some(Message::BarrierRequest)), "{}: {got:?}", s.origin);
    }
    eprintln!("capture: compared {} seed add-flow FLOW_MODs byte for byte", flows.len());
    report(failures, flows.len());
}

/// All seed flows in one `add-flows FILE`: one connection, one FLOW_MOD each, in order.
#[test]
fn add_flows_file_bytes_equal_ovs_ofctl() {
    if !have_ofctl("add_flows_file_bytes_equal_ovs_ofctl") {
        return;
    }
    let flows = seed_flows();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flows.txt");
    std::fs::write(&file, flows.iter().map(|s| format!("{}\n", s.ofctl)).collect::<String>()).unwrap();
    let (_, got) = ofctl(&[], "add-flows", &[file.to_str().unwrap()], Script::default());
    let fms = sent(&got, is_flow_mod);
    assert_eq!(fms.len(), flows.len());
    let mut failures = Vec::new();
    for (s, theirs) in flows.iter().zip(fms) {
        let ours = OfMessage::new(theirs.msg.xid, Message::FlowMod(s.fm.clone()));
        assert_same_bytes(s.origin, theirs, &ours, &mut failures);
    }
    report(failures, flows.len());
}

/// `del-flows` and `--strict del-flows` as the seed issues them.
#[test]
fn del_flows_bytes_equal_ovs_ofctl() {
    if !have_ofctl("del_flows_bytes_equal_ovs_ofctl") {
        return;
    }
    let del = |table: u8, m: Match| FlowMod::new(FlowModCommand::Delete, table, DEFAULT_PRIORITY, m);
    let cases: Vec<(Vec<&str>, String, FlowMod)> = vec![
        (vec![], String::new(), del(OFPTT_ALL, Match::any())),
        (vec![], format!("table=100, reg0={VNID}"), del(100, Match::any().reg(0, VNID))),
        (vec![], format!("table=100, reg0={VNID}, cookie=0/1"), del(100, Match::any().reg(0, VNID)).with_cookie(0, 1)),
        (vec![], format!("table=100, reg0={VNID}, cookie=1/1"), del(100, Match::any().reg(0, VNID)).with_cookie(1, 1)),
        (vec![], "cookie=0x1234/-1".into(), del(OFPTT_ALL, Match::any()).with_cookie(0x1234, u64::MAX)),
        (vec![], format!("ip, nw_dst={POD_IP}"), del(OFPTT_ALL, m_ip(None, Some(POD_IP)))),
        (vec![], format!("ip, nw_src={POD_IP}"), del(OFPTT_ALL, m_ip(Some(POD_IP), None))),
        (vec![], format!("arp, nw_dst={POD_IP}"), del(OFPTT_ALL, m_arp(None, Some(POD_IP)))),
        (vec![], format!("arp, nw_src={POD_IP}"), del(OFPTT_ALL, m_arp(Some(POD_IP), None))),
        (vec![], format!("table=10, tun_src={HOST_IP}"), del(10, Match::any().tun_src(ip(HOST_IP)))),
        (vec![], format!("table=50, arp, nw_dst={HOST_SUBNET}"), del(50, m_arp(None, Some(HOST_SUBNET)))),
        (vec![], format!("table=90, ip, nw_dst={HOST_SUBNET}"), del(90, m_ip(None, Some(HOST_SUBNET)))),
        (vec![], format!("table=60, ip, nw_dst={SERVICE_IP}"), del(60, m_ip(None, Some(SERVICE_IP)))),
        (vec![], format!("table=110, reg0={VNID}"), del(110, Match::any().reg(0, VNID))),
        (vec![], format!("table=120, reg0={VNID}"), del(120, Match::any().reg(0, VNID))),
        (vec![], "table=1, out_port=2".into(), {
            let mut f = del(1, Match::any());
            f.out_port = PortNo(2);
            f
        }),
        (
            vec!["--strict"],
            format!("table=100, priority=1, reg0={VNID}"),
            FlowMod::delete_strict(100, 1, Match::any().reg(0, VNID)),
        ),
        (
            vec!["--strict"],
            format!("table=20, priority=100, in_port={POD_PORT}, ip, nw_src={POD_IP}"),
            FlowMod::delete_strict(20, 100, m_ip(Some(POD_IP), None).in_port(POD_PORT)),
        ),
        (
            vec!["--strict"],
            "priority=20, ip, nw_src=10.0.0.1, nw_dst=10.0.0.0/24, cookie=5/0xff".to_string(),
            FlowMod::delete_strict(OFPTT_ALL, 20, m_ip(Some("10.0.0.1"), Some("10.0.0.0/24"))).with_cookie(5, 0xff),
        ),
        (vec!["--strict"], format!("table=60, ip, nw_dst={SERVICE_IP}"), FlowMod::delete_strict(60, DEFAULT_PRIORITY, m_ip(None, Some(SERVICE_IP)))),
    ];
    let mut failures = Vec::new();
    for (pre, filter, fm) in &cases {
        let args: Vec<&str> = if filter.is_empty() { vec![] } else { vec![filter.as_str()] };
        let (_, got) = ofctl(pre, "del-flows", &args, Script::default());
        let fms = sent(&got, is_flow_mod);
        assert_eq!(fms.len(), 1, "{pre:?} del-flows {filter}: {got:?}");
        let ours = OfMessage::new(fms[0].msg.xid, Message::FlowMod(fm.clone()));
        assert_same_bytes(&format!("{pre:?} del-flows {filter:?}"), fms[0], &ours, &mut failures);
    }
    eprintln!("capture: compared {} del-flows FLOW_MODs byte for byte", cases.len());
    report(failures, cases.len());
}

/// Checks a bundle exchange: OPEN, one ADD per expected FLOW_MOD, BARRIER, COMMIT, all with
/// flags ATOMIC|ORDERED, each equal to ours byte for byte.
fn check_bundle(what: &str, got: &[Received], want: &[FlowMod], failures: &mut Vec<String>) {
    let flags = BundleFlags::ATOMIC | BundleFlags::ORDERED;
    let kinds: Vec<&str> = got.iter().map(|r| r.msg.msg.name()).collect();
    let mut expect_kinds = vec!["HELLO", "BUNDLE_CONTROL"];
    expect_kinds.extend(want.iter().map(|_| "BUNDLE_ADD_MESSAGE"));
    expect_kinds.extend(["BARRIER_REQUEST", "BUNDLE_CONTROL"]);
    assert_eq!(kinds, expect_kinds, "{what}: message sequence");
    let ctl = |r: &Received| match &r.msg.msg {
        Message::BundleControl(b) => b.clone(),
        m => panic!("{what}: not a bundle control: {m:?}"),
    };
    let open = &got[1];
    let id = ctl(open).bundle_id;
    let ours_open = OfMessage::new(open.msg.xid, Message::BundleControl(BundleControl::new(id, BundleCtrlType::OpenRequest, flags)));
    assert_same_bytes(&format!("{what}: OPEN_REQUEST"), open, &ours_open, failures);
    for (i, fm) in want.iter().enumerate() {
        let add = &got[2 + i];
        let ours = BundleAdd::flow_mod(add.msg.xid, id, flags, fm.clone());
        assert_same_bytes(&format!("{what}: ADD_MESSAGE #{i}"), add, &ours, failures);
    }
    let commit = got.last().unwrap();
    let ours_commit =
        OfMessage::new(commit.msg.xid, Message::BundleControl(BundleControl::new(id, BundleCtrlType::CommitRequest, flags)));
    assert_same_bytes(&format!("{what}: COMMIT_REQUEST"), commit, &ours_commit, failures);
}

#[test]
fn bundle_add_flow_bytes_equal_ovs_ofctl() {
    if !have_ofctl("bundle_add_flow_bytes_equal_ovs_ofctl") {
        return;
    }
    let flows = seed_flows();
    let mut failures = Vec::new();
    for name in ["setupPodFlows t20 arp", "SetupOVS t253 version note", "AddServiceRules fragments"] {
        let s = flows.iter().find(|s| s.origin == name).unwrap();
        let (_, got) = ofctl(&["--bundle"], "add-flow", &[&s.ofctl], Script::default());
        check_bundle(&format!("--bundle add-flow {name}"), &got, std::slice::from_ref(&s.fm), &mut failures);
    }
    // The whole SetupOVS/pod/service set as one transaction, like the seed's EndTransaction.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flows.txt");
    std::fs::write(&file, flows.iter().map(|s| format!("{}\n", s.ofctl)).collect::<String>()).unwrap();
    let (_, got) = ofctl(&["--bundle"], "add-flows", &[file.to_str().unwrap()], Script::default());
    let fms: Vec<FlowMod> = flows.iter().map(|s| s.fm.clone()).collect();
    check_bundle("--bundle add-flows (all seed flows)", &got, &fms, &mut failures);
    eprintln!("capture: compared {} bundle exchanges byte for byte", 4);
    report(failures, 3 * 3 + fms.len() + 2);
}

/// `ovs-ofctl bundle SWITCH FILE` with `flow add` / `flow delete` lines: the seed's transaction
/// shape (adds and deletes in one atomic bundle).
#[test]
fn bundle_file_with_adds_and_deletes_bytes_equal_ovs_ofctl() {
    if !have_ofctl("bundle_file_with_adds_and_deletes_bytes_equal_ovs_ofctl") {
        return;
    }
    let egress_tmp = seed_by_origin("Egress temporary drop (cookie=1)");
    let egress_deny = seed_by_origin("Egress deny CIDR");
    let lines = format!(
        "flow add {}\nflow delete table=100, reg0={VNID}, cookie=0/1\nflow add {}\nflow delete_strict table=100, priority=65535, reg0={VNID}\n",
        egress_tmp.ofctl, egress_deny.ofctl
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bundle.txt");
    std::fs::write(&file, lines).unwrap();
    let (_, got) = ofctl(&[], "bundle", &[file.to_str().unwrap()], Script::default());
    let want = vec![
        egress_tmp.fm,
        FlowMod::new(FlowModCommand::Delete, 100, DEFAULT_PRIORITY, Match::any().reg(0, VNID)).with_cookie(0, 1),
        egress_deny.fm,
        FlowMod::delete_strict(100, 65535, Match::any().reg(0, VNID)),
    ];
    let mut failures = Vec::new();
    check_bundle("bundle FILE", &got, &want, &mut failures);
    report(failures, want.len() + 2);
}

// ---------------------------------------------------------------------------------------------
// (b) Display against ovs-ofctl's printer

/// One FlowStats per seed shape, with varied cookies, durations, counters, timeouts and flags.
fn seed_stats() -> Vec<FlowStats> {
    let flags = [
        FlowModFlags::empty(),
        FlowModFlags::SEND_FLOW_REM,
        FlowModFlags::CHECK_OVERLAP | FlowModFlags::RESET_COUNTS,
        FlowModFlags::NO_PKT_COUNTS | FlowModFlags::NO_BYT_COUNTS,
        FlowModFlags::SEND_FLOW_REM
            | FlowModFlags::CHECK_OVERLAP
            | FlowModFlags::RESET_COUNTS
            | FlowModFlags::NO_PKT_COUNTS
            | FlowModFlags::NO_BYT_COUNTS,
    ];
    let nsecs = [0, 857_000_000, 120_500_000, 1, 999_999_999, 4_000_000, 10];
    seed_flows()
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let n = i as u64;
            FlowStats {
                table_id: s.fm.table_id,
                duration_sec: [0, 1, 148, 86_400, u32::MAX][i % 5],
                duration_nsec: nsecs[i % nsecs.len()],
                priority: s.fm.priority,
                idle_timeout: if i % 4 == 1 { 30 } else { 0 },
                hard_timeout: if i % 6 == 2 { 600 } else { 0 },
                flags: flags[i % flags.len()],
                cookie: [0, 1, 0xabc, u64::MAX, 0x8000_0000_0000_0000][i % 5] ^ if i % 5 == 0 { 0 } else { n },
                packet_count: if i % 7 == 3 { u64::MAX } else { n * 1000 },
                byte_count: if i % 7 == 4 { u64::MAX } else { n * 98_765 },
                match_: s.fm.match_,
                instructions: s.fm.instructions,
            }
        })
        .collect()
}

/// Flow lines of `dump-flows` output: without the `OFPST_FLOW reply` header lines and without
/// the leading space.
fn flow_lines(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| !l.starts_with("OFPST_FLOW reply") && !l.trim().is_empty())
        .map(|l| l.strip_prefix(' ').unwrap_or(l).to_string())
        .collect()
}

fn compare_lines(what: &str, want: &[String], got: &[String]) {
    let bad: Vec<String> = want
        .iter()
        .zip(got)
        .enumerate()
        .filter(|(_, (w, g))| w != g)
        .map(|(i, (w, g))| format!("--- line {i}\n  ovs:  {g}\n  ours: {w}"))
        .collect();
    assert!(
        bad.is_empty() && want.len() == got.len(),
        "{what}: {} of {} lines differ ({} vs {} lines):\n{}",
        bad.len(),
        want.len(),
        want.len(),
        got.len(),
        bad.join("\n")
    );
}

#[test]
fn dump_flows_prints_what_our_display_prints() {
    if !have_ofctl("dump_flows_prints_what_our_display_prints") {
        return;
    }
    let stats = seed_stats();
    // Split across three replies (MORE, MORE, last) to exercise multipart assembly in OVS.
    let a = stats.len() / 3;
    let script = Script {
        flow_parts: vec![stats[..a].to_vec(), stats[a..2 * a].to_vec(), stats[2 * a..].to_vec()],
        ..Script::default()
    };
    let with_stats: Vec<String> = stats.iter().map(|f| f.to_string()).collect();
    let no_stats: Vec<String> = stats.iter().map(|f| f.no_stats().to_string()).collect();

    let (out, got) = ofctl(&[], "dump-flows", &[], script.clone());
    // The request ovs-ofctl sent decodes to "all flows, all tables".
    let reqs = sent(&got, |m| matches!(m, Message::MultipartRequest(_)));
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].msg.msg,
        Message::MultipartRequest(MultipartRequest::flows(FlowStatsRequest::default())),
        "dump-flows request"
    );
    assert_eq!(out.lines().filter(|l| l.starts_with("OFPST_FLOW reply (OF1.3)")).count(), 3, "{out}");
    compare_lines("dump-flows", &with_stats, &flow_lines(&out));

    let (out, _) = ofctl(&["--no-stats"], "dump-flows", &[], script);
    compare_lines("dump-flows --no-stats", &no_stats, &flow_lines(&out));
    eprintln!("capture: compared {} dump-flows lines, with and without stats", stats.len());
}

/// `dump-flows` with a filter: the request ovs-ofctl encodes decodes to the typed request, and
/// re-encodes to the same bytes.
#[test]
fn dump_flows_filter_request_bytes_equal_ovs_ofctl() {
    if !have_ofctl("dump_flows_filter_request_bytes_equal_ovs_ofctl") {
        return;
    }
    let cases = [
        (format!("table=20, ip, nw_src={POD_IP}"), FlowStatsRequest { table_id: 20, match_: m_ip(Some(POD_IP), None), ..Default::default() }),
        (
            "table=30, out_port=2, cookie=0x10/0xff, ip, nw_dst=172.30.0.0/16".to_string(),
            FlowStatsRequest {
                table_id: 30,
                out_port: PortNo(2),
                cookie: 0x10,
                cookie_mask: 0xff,
                match_: m_ip(None, Some(SERVICE_CIDR)),
                ..Default::default()
            },
        ),
        ("table=253".to_string(), FlowStatsRequest { table_id: 253, ..Default::default() }),
    ];
    let mut failures = Vec::new();
    for (filter, req) in &cases {
        let (_, got) = ofctl(&[], "dump-flows", &[filter], Script::default());
        let reqs = sent(&got, |m| matches!(m, Message::MultipartRequest(_)));
        assert_eq!(reqs.len(), 1, "{filter}: {got:?}");
        let ours = OfMessage::new(reqs[0].msg.xid, Message::MultipartRequest(MultipartRequest::flows(req.clone())));
        assert_same_bytes(&format!("dump-flows {filter}"), reqs[0], &ours, &mut failures);
    }
    report(failures, cases.len());
}

/// Port descriptions we encode are printed by `dump-ports-desc` as written here.
#[test]
fn dump_ports_desc_decodes_our_port_encoding() {
    if !have_ofctl("dump_ports_desc_decodes_our_port_encoding") {
        return;
    }
    let port = |no: PortNo, name: &str, mac_s: &str, config: u32, state: u32, curr: u32, speed: u32| {
        let mut n = [0u8; 16];
        n[..name.len()].copy_from_slice(name.as_bytes());
        Port {
            port_no: no,
            hw_addr: mac(mac_s),
            name: n,
            config,
            state,
            curr,
            advertised: 0,
            supported: 0,
            peer: 0,
            curr_speed: speed,
            max_speed: speed,
        }
    };
    let ports = [
        port(PortNo(1), "vxlan0", "6e:1a:2b:3c:4d:5e", 0, 0, 0, 0),
        port(PortNo(2), "tun0", "aa:55:aa:55:00:02", 0, Port::STATE_LIVE, 0, 0),
        // 10GB_FD | COPPER, 10 Gbps; config PORT_DOWN, state LINK_DOWN.
        port(PortNo(3), "veth1234abcd", "0a:58:0a:80:02:05", 1, 1, 0x40 | 0x800, 10_000_000),
        port(PortNo::LOCAL, "br0", "ea:72:06:f7:27:43", 0, Port::STATE_LIVE, 0, 0),
    ];
    let script = Script { port_parts: vec![ports[..2].to_vec(), ports[2..].to_vec()], ..Script::default() };
    let (out, got) = ofctl(&[], "dump-ports-desc", &[], script);
    let reqs = sent(&got, |m| matches!(m, Message::MultipartRequest(_)));
    assert_eq!(reqs.len(), 1);
    let ours = OfMessage::new(reqs[0].msg.xid, Message::MultipartRequest(MultipartRequest::port_desc()));
    let mut failures = Vec::new();
    assert_same_bytes("dump-ports-desc request", reqs[0], &ours, &mut failures);
    report(failures, 1);
    let want = "\
OFPST_PORT_DESC reply (OF1.3) (xid=0x2): flags=[more]
 1(vxlan0): addr:6e:1a:2b:3c:4d:5e
     config:     0
     state:      0
     speed: 0 Mbps now, 0 Mbps max
 2(tun0): addr:aa:55:aa:55:00:02
     config:     0
     state:      LIVE
     speed: 0 Mbps now, 0 Mbps max
OFPST_PORT_DESC reply (OF1.3) (xid=0x2):
 3(veth1234abcd): addr:0a:58:0a:80:02:05
     config:     PORT_DOWN
     state:      LINK_DOWN
     current:    10GB-FD COPPER
     speed: 10000 Mbps now, 10000 Mbps max
 LOCAL(br0): addr:ea:72:06:f7:27:43
     config:     0
     state:      LIVE
     speed: 0 Mbps now, 0 Mbps max
";
    assert_eq!(out, want, "dump-ports-desc output\n--- ovs:\n{out}\n--- want:\n{want}");
}

/// `ovs-ofctl` sends session messages the fake switch must decode: HELLO with bitmap 0x10 and,
/// for get-frags/set-frags, GET_CONFIG / SET_CONFIG, which must equal ours byte for byte.
#[test]
fn session_messages_equal_ovs_ofctl() {
    if !have_ofctl("session_messages_equal_ovs_ofctl") {
        return;
    }
    let (_, got) = ofctl(&[], "set-frags", &["nx-match"], Script::default());
    let hello = &got[0];
    assert_same_bytes_or_panic("HELLO", hello, &OfMessage::new(hello.msg.xid, Message::Hello(Hello::of13())));
    let sets = sent(&got, |m| matches!(m, Message::SetConfig(_)));
    assert_eq!(sets.len(), 1, "{got:?}");
    let ours = OfMessage::new(
        sets[0].msg.xid,
        Message::SetConfig(SwitchConfig { frag: FragMode::NxMatch, other_flags: 0, miss_send_len: 0 }),
    );
    assert_same_bytes_or_panic("SET_CONFIG frags=nx-match", sets[0], &ours);

    let (out, got) = ofctl(&[], "get-frags", &[], Script { frag: Some(FragMode::NxMatch), ..Script::default() });
    assert_eq!(out.trim(), "nx-match", "get-frags printed our GET_CONFIG_REPLY");
    let gets = sent(&got, |m| matches!(m, Message::GetConfigRequest));
    assert_eq!(gets.len(), 1, "{got:?}");
    assert_same_bytes_or_panic("GET_CONFIG_REQUEST", gets[0], &OfMessage::new(gets[0].msg.xid, Message::GetConfigRequest));
}

fn assert_same_bytes_or_panic(what: &str, theirs: &Received, ours: &OfMessage) {
    let mut f = Vec::new();
    assert_same_bytes(what, theirs, ours, &mut f);
    report(f, 1);
}

/// The shapes beyond the seed (every typed field/action/instruction, masks, reserved ports) in a
/// flow-stats reply: OVS's dump-flows lines equal our Display and `no_stats()`.
#[test]
fn dump_flows_of_extra_shapes_prints_what_our_display_prints() {
    if !have_ofctl("dump_flows_of_extra_shapes_prints_what_our_display_prints") {
        return;
    }
    let stats: Vec<FlowStats> = extra_shapes()
        .into_iter()
        .enumerate()
        .map(|(i, (_, m, ins))| FlowStats {
            table_id: 2 + i as u8,
            duration_sec: i as u32,
            duration_nsec: (i as u32) * 7_000_001,
            priority: [0, 1, DEFAULT_PRIORITY, u16::MAX, 0x1234][i % 5],
            idle_timeout: i as u16,
            hard_timeout: (i as u16) * 3,
            flags: FlowModFlags::empty(),
            cookie: (i as u64) << 32,
            packet_count: i as u64,
            byte_count: (i as u64) * 64,
            match_: m,
            instructions: ins,
        })
        .collect();
    let script = Script { flow_parts: vec![stats.clone()], ..Script::default() };
    let (out, _) = ofctl(&[], "dump-flows", &[], script.clone());
    let want: Vec<String> = stats.iter().map(|f| f.to_string()).collect();
    compare_lines("dump-flows (extra shapes)", &want, &flow_lines(&out));
    let (out, _) = ofctl(&["--no-stats"], "dump-flows", &[], script);
    let want: Vec<String> = stats.iter().map(|f| f.no_stats().to_string()).collect();
    compare_lines("dump-flows --no-stats (extra shapes)", &want, &flow_lines(&out));
    eprintln!("capture: compared {} extra-shape dump-flows lines, with and without stats", stats.len());
}

/// Closing the loop for the shapes beyond the seed: the text our Display prints is fed to
/// `ovs-ofctl add-flow`, and OVS's encoding of it must equal ours byte for byte. (Shapes whose
/// typed form has no canonical OVS encoding are left out: zero masks, which OVS drops, and an
/// empty apply-actions, which OVS never sends.)
#[test]
fn add_flow_of_our_display_text_encodes_like_ours() {
    if !have_ofctl("add_flow_of_our_display_text_encodes_like_ours") {
        return;
    }
    let mut failures = Vec::new();
    let mut n = 0;
    for (i, (name, m, mut ins)) in extra_shapes().into_iter().enumerate() {
        // ("nx resubmit": OVS always encodes a parsed `resubmit:N` as NXAST_RESUBMIT_TABLE.)
        if matches!(name, "zero masks" | "ip non-cidr masks" | "empty apply" | "nx resubmit") {
            continue;
        }
        // OVS encodes instructions in its canonical order. (Table 1: every goto points forward.)
        ins.sort_by_key(Instruction::canonical_rank);
        let mut fm = FlowMod::new(FlowModCommand::Add, 1, [0, 7, DEFAULT_PRIORITY, 0x1234][i % 4], m);
        fm.instructions = ins;
        let text = fm.to_string();
        let (_, got) = ofctl(&[], "add-flow", &[&text], Script::default());
        let fms = sent(&got, is_flow_mod);
        assert_eq!(fms.len(), 1, "{name}: {got:?}");
        let ours = OfMessage::new(fms[0].msg.xid, Message::FlowMod(fm));
        assert_same_bytes(&format!("{name}: add-flow {text:?}"), fms[0], &ours, &mut failures);
        n += 1;
    }
    eprintln!("capture: compared {n} add-flow FLOW_MODs of our own Display text byte for byte");
    report(failures, n);
}

/// The NetworkPolicy plugin's conntrack flows and the other shapes added with them (RARP with
/// ARP fields, `resubmit:N`, `nw_proto=2`), written as a person would hand them to
/// `ovs-ofctl add-flow`: OVS's encoding must equal our typed builder's, byte for byte.
/// `ovs-ofctl add-flow` of each text sends the bytes of its FLOW_MOD, and what OVS sent
/// decodes to the same typed flow.
fn add_flows_equal_ours(what: &str, cases: &[(&str, FlowMod)]) {
    let mut failures = Vec::new();
    for (text, fm) in cases {
        let (_, got) = ofctl(&[], "add-flow", &[text], Script::default());
        let fms = sent(&got, is_flow_mod);
        assert_eq!(fms.len(), 1, "{text}: {got:?}");
        let ours = OfMessage::new(fms[0].msg.xid, Message::FlowMod(fm.clone()));
        assert_same_bytes(&format!("add-flow {text:?}"), fms[0], &ours, &mut failures);
        assert_eq!(&fms[0].msg.msg, &Message::FlowMod(fm.clone()), "{text}");
    }
    eprintln!("capture: compared {} {what} FLOW_MODs byte for byte", cases.len());
    report(failures, cases.len());
}

#[test]
fn conntrack_and_rarp_flows_bytes_equal_ovs_ofctl() {
    if !have_ofctl("conntrack_and_rarp_flows_bytes_equal_ovs_ofctl") {
        return;
    }
    let ipm = |ip: Ipv4Match| Match::any().ipv4(ip);
    let reg0_lo = CtZone::Field(Subfield::bits(NxmField::Reg(0), 0, 15).unwrap());
    let cases: Vec<(&str, FlowMod)> = vec![
        (
            "table=21,priority=200,ip,nw_dst=10.128.0.0/14,actions=ct(commit,table=30)",
            FlowMod::add(21, 200, m_ip(None, Some(CLUSTER_CIDR)), vec![Action::Ct(Ct::new().commit().table(30))], None),
        ),
        (
            "table=80,priority=200,ct_state=+rpl,ip,actions=output:NXM_NX_REG2[]",
            FlowMod::add(80, 200, m_ip(None, None).ct_state(0x08, 0x08), vec![Action::output_reg(2)], None),
        ),
        (
            "table=20,ip,actions=ct(table=30,zone=NXM_NX_REG0[0..15])",
            FlowMod::add(20, DEFAULT_PRIORITY, m_ip(None, None), vec![Action::Ct(Ct::new().table(30).zone(reg0_lo))], None),
        ),
        (
            "table=30,priority=100,ct_state=-new+est+trk,ip,actions=goto_table:40",
            FlowMod::add(30, 100, m_ip(None, None).ct_state(0x22, 0x23), vec![], Some(40)),
        ),
        (
            "table=30,priority=100,ct_state=+trk+rpl,ip,actions=goto_table:40",
            FlowMod::add(30, 100, m_ip(None, None).ct_state(0x28, 0x28), vec![], Some(40)),
        ),
        (
            "table=31,tcp,actions=ct(commit,zone=5,exec(set_field:0x1->ct_mark),alg=ftp)",
            FlowMod::add(
                31,
                DEFAULT_PRIORITY,
                ipm(Ipv4Match { proto: Some(IpProto::Tcp { dst: None }), ..Default::default() }),
                vec![Action::Ct(Ct {
                    alg: 21,
                    ..Ct::new().commit().zone(CtZone::Imm(5)).exec(vec![Action::SetField(SetField::CtMark(1))])
                })],
                None,
            ),
        ),
        (
            "table=30,priority=250,ct_state=+rpl+trk,ct_mark=0x1,ip,nw_dst=10.128.0.0/23,actions=set_field:0a:58:0a:80:00:01->eth_dst,output:2",
            FlowMod::add(
                30,
                250,
                Match { ct_mark: Some(Masked::exact(1)), ..m_ip(None, Some("10.128.0.0/23")).ct_state(0x28, 0x28) },
                vec![Action::SetField(SetField::EthDst(MacAddr([0x0a, 0x58, 0x0a, 0x80, 0, 1]))), Action::output(2)],
                None,
            ),
        ),
        (
            "table=25,priority=100,ip,nw_src=10.128.0.5,actions=load:0xb->NXM_NX_REG0[],ct(commit,table=30,zone=64000,exec(set_field:0x1->ct_mark))",
            FlowMod::add(
                25,
                100,
                m_ip(Some("10.128.0.5/32"), None),
                vec![
                    Action::load_reg(0, 11),
                    Action::Ct(Ct::new().commit().table(30).zone(CtZone::Imm(64000)).exec(vec![Action::SetField(SetField::CtMark(1))])),
                ],
                None,
            ),
        ),
        (
            "table=32,ct_zone=7,ct_mark=0x5/0xff,ip,actions=drop",
            FlowMod::add(
                32,
                DEFAULT_PRIORITY,
                Match { ct_zone: Some(7), ct_mark: Some(Masked::new(5, 0xff)), ..m_ip(None, None) },
                vec![],
                None,
            ),
        ),
        (
            "table=5,rarp,arp_op=3,arp_spa=10.0.0.1,arp_tha=00:11:22:33:44:55,actions=resubmit:7,resubmit(LOCAL,3),resubmit(,9)",
            FlowMod::add(
                5,
                DEFAULT_PRIORITY,
                Match {
                    eth: EthMatch::Rarp(ArpMatch {
                        op: Some(3),
                        spa: Some(cidr("10.0.0.1")),
                        tha: Some(Masked::exact(mac("00:11:22:33:44:55"))),
                        ..Default::default()
                    }),
                    ..Match::any()
                },
                vec![
                    Action::ResubmitTable { in_port: 7, table: 255 },
                    Action::ResubmitTable { in_port: 0xfffe, table: 3 },
                    Action::ResubmitTable { in_port: 0xfff8, table: 9 },
                ],
                None,
            ),
        ),
        (
            "table=6,ip,nw_proto=2,in_port=LOCAL,actions=IN_PORT,NORMAL,FLOOD,ALL,LOCAL",
            FlowMod::add(
                6,
                DEFAULT_PRIORITY,
                ipm(Ipv4Match { proto: Some(IpProto::Other(2)), ..Default::default() }).in_port(PortNo::LOCAL),
                [PortNo::IN_PORT, PortNo::NORMAL, PortNo::FLOOD, PortNo::ALL, PortNo::LOCAL].map(Action::output).to_vec(),
                None,
            ),
        ),
    ];
    add_flows_equal_ours("conntrack/rarp/resubmit", &cases);
}

/// IPv6 flows as the dual-stack pipeline writes them, in the text a person would hand to
/// `ovs-ofctl add-flow`: OVS's encoding must equal our typed builder's byte for byte and decode
/// to the same typed flow. (The first is the vector of flow_match.rs's `ipv6_tcp_bytes`.)
#[test]
fn ipv6_flows_bytes_equal_ovs_ofctl() {
    if !have_ofctl("ipv6_flows_bytes_equal_ovs_ofctl") {
        return;
    }
    let v6 = |ip: Ipv6Match| Match::any().ipv6(ip);
    let icmp6 = |i: Icmpv6Match| v6(Ipv6Match { proto: Some(Ip6Proto::Icmpv6(i)), ..Default::default() });
    let cases: Vec<(&str, FlowMod)> = vec![
        (
            "tcp6,ipv6_src=fd00::1/64,ipv6_dst=fd00::5,ipv6_label=0x12345,nw_frag=no,tp_dst=80,actions=drop",
            FlowMod::add(
                0,
                DEFAULT_PRIORITY,
                v6(Ipv6Match {
                    src: Some(cidr6("fd00::/64")),
                    dst: Some(cidr6("fd00::5")),
                    label: Some(Masked::exact(0x12345)),
                    frag: Some(IpFrag::No),
                    proto: Some(Ip6Proto::L4(IpProto::Tcp { dst: Some(Masked::exact(80)) })),
                }),
                vec![],
                None,
            ),
        ),
        (
            "table=20,priority=100,ipv6,in_port=3,ipv6_src=fd00:10:128:2::5,actions=load:0xb->NXM_NX_REG0[],goto_table:21",
            FlowMod::add(
                20,
                100,
                v6(Ipv6Match { src: Some(cidr6("fd00:10:128:2::5")), ..Default::default() }).in_port(3),
                vec![Action::load_reg(0, 11)],
                Some(21),
            ),
        ),
        (
            "table=90,priority=100,ipv6,ipv6_dst=fd00:10:128:4::/64,actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:fd00::1->tun_ipv6_dst,output:1",
            FlowMod::add(
                90,
                100,
                v6(Ipv6Match { dst: Some(cidr6("fd00:10:128:4::/64")), ..Default::default() }),
                vec![mv_reg0_to_tun_id(), Action::SetField(SetField::TunIpv6Dst(ip6("fd00::1"))), Action::output(1)],
                None,
            ),
        ),
        (
            "table=10,tun_ipv6_src=fd00::2,tun_ipv6_dst=fd00::/16,actions=goto_table:30",
            FlowMod::add(
                10,
                DEFAULT_PRIORITY,
                Match { tun_ipv6_dst: Some(cidr6("fd00::/16")), ..Match::any().tun_ipv6_src(ip6("fd00::2")) },
                vec![],
                Some(30),
            ),
        ),
        (
            "table=20,priority=300,icmp6,in_port=3,icmp_type=135,icmp_code=0,nd_target=fd00::5,nd_sll=0a:58:0a:80:00:05,actions=goto_table:21",
            FlowMod::add(
                20,
                300,
                icmp6(Icmpv6Match {
                    typ: Some(135),
                    code: Some(0),
                    nd_target: Some(cidr6("fd00::5")),
                    nd_sll: Some(Masked::exact(mac("0a:58:0a:80:00:05"))),
                    nd_tll: None,
                })
                .in_port(3),
                vec![],
                Some(21),
            ),
        ),
        (
            "table=20,priority=300,icmp6,icmp_type=136,nd_target=fd00::/64,nd_tll=0a:58:00:00:00:00/ff:ff:00:00:00:00,actions=NORMAL",
            FlowMod::add(
                20,
                300,
                icmp6(Icmpv6Match {
                    typ: Some(136),
                    code: None,
                    nd_target: Some(cidr6("fd00::/64")),
                    nd_sll: None,
                    nd_tll: Some(Masked::new(mac("0a:58:00:00:00:00"), mac("ff:ff:00:00:00:00"))),
                }),
                vec![Action::output(PortNo::NORMAL)],
                None,
            ),
        ),
        (
            "table=60,priority=100,udp6,ipv6_dst=fd00:172:30::a,tp_dst=53,actions=goto_table:80",
            FlowMod::add(
                60,
                100,
                v6(Ipv6Match {
                    dst: Some(cidr6("fd00:172:30::a")),
                    proto: Some(Ip6Proto::L4(IpProto::Udp { dst: Some(Masked::exact(53)) })),
                    ..Default::default()
                }),
                vec![],
                Some(80),
            ),
        ),
        (
            "table=60,priority=100,sctp6,tp_dst=0x2000/0xf000,ipv6_label=0x00005/0x0000f,nw_frag=later,actions=drop",
            FlowMod::add(
                60,
                100,
                v6(Ipv6Match {
                    label: Some(Masked::new(5, 0xf)),
                    frag: Some(IpFrag::Later),
                    proto: Some(Ip6Proto::L4(IpProto::Sctp { dst: Some(Masked::new(0x2000, 0xf000)) })),
                    ..Default::default()
                }),
                vec![],
                None,
            ),
        ),
        (
            "table=31,ct_state=-new+est+trk,tcp6,actions=ct(commit,table=30,zone=5)",
            FlowMod::add(
                31,
                DEFAULT_PRIORITY,
                v6(Ipv6Match { proto: Some(Ip6Proto::L4(IpProto::Tcp { dst: None })), ..Default::default() }).ct_state(0x22, 0x23),
                vec![Action::Ct(Ct::new().commit().table(30).zone(CtZone::Imm(5)))],
                None,
            ),
        ),
        (
            "ipv6,nw_proto=47,actions=set_field:2001:db8::1->ipv6_src,set_field:::10.0.0.1->ipv6_dst,set_field:fd00::3->tun_ipv6_src",
            FlowMod::add(
                0,
                DEFAULT_PRIORITY,
                v6(Ipv6Match { proto: Some(Ip6Proto::L4(IpProto::Other(47))), ..Default::default() }),
                vec![
                    Action::SetField(SetField::Ipv6Src(ip6("2001:db8::1"))),
                    Action::SetField(SetField::Ipv6Dst(ip6("::10.0.0.1"))),
                    Action::SetField(SetField::TunIpv6Src(ip6("fd00::3"))),
                ],
                None,
            ),
        ),
        (
            "icmp6,actions=move:NXM_NX_IPV6_SRC[0..31]->NXM_NX_REG0[],move:NXM_NX_REG1[]->NXM_NX_TUN_IPV6_DST[96..127],load:0x1->NXM_NX_TUN_IPV6_SRC[0..63]",
            FlowMod::add(
                0,
                DEFAULT_PRIORITY,
                icmp6(Icmpv6Match::default()),
                vec![
                    Action::RegMove(RegMove::new(Subfield::bits(NxmField::Ipv6Src, 0, 31).unwrap(), Subfield::whole(NxmField::Reg(0))).unwrap()),
                    Action::RegMove(
                        RegMove::new(Subfield::whole(NxmField::Reg(1)), Subfield::bits(NxmField::TunIpv6Dst, 96, 127).unwrap()).unwrap(),
                    ),
                    Action::RegLoad { dst: Subfield::bits(NxmField::TunIpv6Src, 0, 63).unwrap(), value: 1 },
                ],
                None,
            ),
        ),
    ];
    add_flows_equal_ours("IPv6", &cases);
}

/// The conjunctive-match flows of OVS's tests/classifier.at (and `conj_id` beside other fields),
/// written as there: OVS's encoding must equal our typed builder's, byte for byte, and decode to
/// the same typed flow.
#[test]
fn conjunctive_match_flows_bytes_equal_ovs_ofctl() {
    if !have_ofctl("conjunctive_match_flows_bytes_equal_ovs_ofctl") {
        return;
    }
    let conj = |id, k, n| Action::conjunction(id, k, n).expect("valid conjunction");
    let note = Action::note(*b"ABCDEF");
    let tcp_dst = |p| Match::any().ipv4(Ipv4Match { proto: Some(IpProto::Tcp { dst: Some(Masked::exact(p)) }), ..Default::default() });
    let cases: Vec<(&str, FlowMod)> = vec![
        ("conj_id=1,actions=3", FlowMod::add(0, DEFAULT_PRIORITY, Match::any().conj_id(1), vec![Action::output(3)], None)),
        (
            "priority=100,ip,ip_src=10.0.0.1,actions=conjunction(1,1/2)",
            FlowMod::add(0, 100, m_ip(Some("10.0.0.1"), None), vec![conj(1, 1, 2)], None),
        ),
        (
            "priority=100,ip,ip_dst=10.0.0.2,actions=conjunction(1,2/2)",
            FlowMod::add(0, 100, m_ip(None, Some("10.0.0.2")), vec![conj(1, 2, 2)], None),
        ),
        (
            "priority=5,ip,ip_src=10.1.0.0/16,actions=conjunction(1,1/2),conjunction(3,2/3)",
            FlowMod::add(0, 5, m_ip(Some("10.1.0.0/16"), None), vec![conj(1, 1, 2), conj(3, 2, 3)], None),
        ),
        (
            "priority=5,ip,ip_dst=30.0.0.0/8,actions=conjunction(2,2/2),conjunction(3,1/3)",
            FlowMod::add(0, 5, m_ip(None, Some("30.0.0.0/8")), vec![conj(2, 2, 2), conj(3, 1, 3)], None),
        ),
        ("priority=5,tcp,tcp_dst=80,actions=conjunction(3,3/3)", FlowMod::add(0, 5, tcp_dst(80), vec![conj(3, 3, 3)], None)),
        (
            "priority=10,ip,in_port=1,actions=conjunction(2,2/2)",
            FlowMod::add(0, 10, m_ip(None, None).in_port(1), vec![conj(2, 2, 2)], None),
        ),
        (
            "actions=conjunction(3,1/2),note:41.42.43.44.45.46",
            FlowMod::add(0, DEFAULT_PRIORITY, Match::any(), vec![conj(3, 1, 2), note.clone()], None),
        ),
        (
            "actions=note:41.42.43.44.45.46,conjunction(3,1/2)",
            FlowMod::add(0, DEFAULT_PRIORITY, Match::any(), vec![note.clone(), conj(3, 1, 2)], None),
        ),
        (
            "table=2,conj_id=7,actions=resubmit(,3)",
            FlowMod::add(
                2,
                DEFAULT_PRIORITY,
                Match::any().conj_id(7),
                vec![Action::ResubmitTable { in_port: 0xfff8, table: 3 }],
                None,
            ),
        ),
        (
            "table=2,priority=20,ip,actions=conjunction(7,1/2)",
            FlowMod::add(2, 20, m_ip(None, None), vec![conj(7, 1, 2)], None),
        ),
        (
            "table=3,priority=1,ip,reg3=9,in_port=4,ct_state=+trk,conj_id=4294967295,actions=output:2",
            FlowMod::add(3, 1, m_ip(None, None).reg(3, 9).in_port(4).ct_state(0x20, 0x20).conj_id(u32::MAX), vec![Action::output(2)], None),
        ),
        (
            "actions=conjunction(4294967295,64/64),conjunction(0,1/2)",
            FlowMod::add(0, DEFAULT_PRIORITY, Match::any(), vec![conj(u32::MAX, 64, 64), conj(0, 1, 2)], None),
        ),
    ];
    add_flows_equal_ours("conjunctive-match", &cases);
}

// (c) the audit log's messages: the controller2 action and the meter, as ovs-ofctl sends them

/// `controller(max_len=128,userdata=..,meter_id=1)` in a flow, and `add-meter` with one drop
/// band: our encoding equals ovs-ofctl's, byte for byte.
#[test]
fn audit_controller_action_and_meter_bytes_equal_ovs_ofctl() {
    if !have_ofctl("audit_controller_action_and_meter_bytes_equal_ovs_ofctl") {
        return;
    }
    let mut failures = Vec::new();
    let cases: Vec<(&str, Vec<Action>)> = vec![
        (
            "priority=100,ip actions=controller(max_len=128,userdata=01.00.01.00.03.74.65.61.6d.2d.61.2f.64.62,meter_id=1),output:2",
            vec![
                Action::Controller(
                    Controller::new().max_len(128).userdata(b"\x01\x00\x01\x00\x03team-a/db".to_vec()).meter_id(1),
                ),
                Action::output(2),
            ],
        ),
        (
            "priority=100,ip actions=controller(reason=no_match,id=7,pause)",
            vec![Action::Controller(Controller { pause: true, ..Controller::new().reason(0).id(7) })],
        ),
        ("priority=100,ip actions=controller(reason=invalid_ttl)", vec![Action::Controller(Controller::new().reason(2))]),
    ];
    for (flow, actions) in &cases {
        let (_, got) = ofctl(&[], "add-flow", &[flow], Script::default());
        let fms = sent(&got, is_flow_mod);
        assert_eq!(fms.len(), 1, "{flow}: {got:?}");
        let m = Match::any().ipv4(Ipv4Match::default());
        let fm = FlowMod::add(0, 100, m, actions.clone(), None);
        let ours = OfMessage::new(fms[0].msg.xid, Message::FlowMod(fm));
        assert_same_bytes(flow, fms[0], &ours, &mut failures);
    }
    let meters = [
        ("meter=1,pktps,burst,stats,bands=type=drop,rate=100,burst_size=10", MeterMod::pktps_drop(MeterCommand::Add, 1, 100, 10)),
        (
            "meter=7,kbps,bands=type=drop,rate=2000",
            MeterMod {
                command: MeterCommand::Add,
                flags: MeterFlags::KBPS,
                meter_id: 7,
                bands: vec![MeterBand::Drop { rate: 2000, burst_size: 0 }],
            },
        ),
    ];
    for (spec, mm) in &meters {
        let (_, got) = ofctl(&[], "add-meter", &[spec], Script::default());
        let mms = sent(&got, |m| matches!(m, Message::MeterMod(_)));
        assert_eq!(mms.len(), 1, "{spec}: {got:?}");
        let ours = OfMessage::new(mms[0].msg.xid, Message::MeterMod(mm.clone()));
        assert_same_bytes(spec, mms[0], &ours, &mut failures);
    }
    let (_, got) = ofctl(&[], "del-meter", &["meter=1"], Script::default());
    let mms = sent(&got, |m| matches!(m, Message::MeterMod(_)));
    assert_eq!(mms.len(), 1, "del-meter: {got:?}");
    assert_same_bytes("del-meter meter=1", mms[0], &OfMessage::new(mms[0].msg.xid, Message::MeterMod(MeterMod::delete(1))), &mut failures);
    report(failures, cases.len() + meters.len() + 1);
}
