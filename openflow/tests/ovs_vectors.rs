//! Open vSwitch's own test vectors (from its tests/ofp-actions.at, tests/ovs-ofctl.at and
//! tests/ofp-print.at), kept as data under tests/data/ with what OVS 3.1 prints for them.
//!
//! Every vector is asserted; none is skipped silently:
//! - in scope (everything in it is typed): our decoding prints exactly what OVS prints, and
//!   re-encodes to the same bytes where OVS's own encoding is canonical;
//! - out of scope (something we deliberately do not model): it decodes with the unmodelled part
//!   kept raw (`Unknown` actions/instructions, `RawOxm` fields, `Unknown` messages) and
//!   re-encodes to exactly the same bytes;
//! - rejected by OVS: we either reject it too, or keep it raw and re-encode it identically.
//!
//! The count of each category is asserted, so a decoder change that moves vectors between
//! categories (or a data file that stops parsing) fails the test instead of passing vacuously.
//! No `ovs-ofctl` is needed: the OVS side is in the data files.

use std::collections::BTreeMap;

use openflow::instruction::{decode_instructions, encode_instructions};
use openflow::text::InstructionsText;
use openflow::wire::Reader;
use openflow::*;

/// One TSV row: fields unescaped (`\n`, `\t`, `\\`).
fn rows(file: &str) -> Vec<Vec<String>> {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split('\t').map(unescape).collect())
        .collect()
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(o) => out.push(o),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s.trim()).unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Tallies categories and collects failures, so one run reports everything.
#[derive(Default)]
struct Tally {
    counts: BTreeMap<&'static str, usize>,
    failures: Vec<String>,
}

impl Tally {
    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }
    fn fail(&mut self, msg: String) {
        self.failures.push(msg);
    }
    fn finish(self, file: &str, want: &[(&'static str, usize)]) {
        eprintln!("{file}: {:?}", self.counts);
        assert!(self.failures.is_empty(), "{file}: {} failures:\n{}", self.failures.len(), self.failures.join("\n"));
        let want: BTreeMap<&'static str, usize> = want.iter().copied().collect();
        assert_eq!(self.counts, want, "{file}: vectors per category");
    }
}

fn action_has_unknown(a: &Action) -> bool {
    match a {
        Action::Unknown(_) => true,
        Action::SetField(SetField::Other(_)) => true,
        Action::Ct(ct) => ct.actions.iter().any(action_has_unknown),
        Action::RegLoad { dst, .. } | Action::OutputReg { src: dst, .. } => field_unnamed(dst.field()),
        Action::RegMove(m) => field_unnamed(m.src().field()) || field_unnamed(m.dst().field()),
        _ => false,
    }
}

/// A field we carry by header only, without a name to print.
fn field_unnamed(f: NxmField) -> bool {
    f.to_string().starts_with("NXM_") && f.to_string().len() == 12 && f.to_string()[4..].chars().all(|c| c.is_ascii_hexdigit())
}

fn instructions_have_unknown(ins: &[Instruction]) -> bool {
    ins.iter().any(|i| match i {
        Instruction::Unknown(_) => true,
        Instruction::ApplyActions(a) | Instruction::WriteActions(a) => a.iter().any(action_has_unknown),
        _ => false,
    })
}

#[test]
fn ofp_actions_vectors() {
    let mut t = Tally::default();
    for r in rows("ofp-actions.tsv") {
        let [section, kind, hexs, canon, ovs] = &r[..] else { panic!("bad row {r:?}") };
        let bytes = unhex(hexs);
        let name = format!("{section}: {hexs}");
        // Both kinds decode as instructions or actions; actions are wrapped in nothing.
        let decoded: Result<(Vec<Instruction>, bool), DecodeError> = if kind == "instructions" {
            decode_instructions(&bytes).map(|i| (i, true))
        } else {
            let mut r = Reader::new(&bytes, "actions");
            let mut v = Vec::new();
            let mut res = Ok(());
            while !r.is_empty() {
                match Action::decode(&mut r) {
                    Ok(a) => v.push(a),
                    Err(e) => {
                        res = Err(e);
                        break;
                    }
                }
            }
            res.map(|()| (vec![Instruction::ApplyActions(v)], false))
        };
        let ovs_accepts = ovs.starts_with("actions=");
        let (ins, _) = match decoded {
            Ok(d) => d,
            Err(_) if !ovs_accepts => {
                t.count("rejected by OVS and by us");
                continue;
            }
            Err(e) => {
                t.fail(format!("--- {name}: OVS prints {ovs:?}, we fail: {e}"));
                continue;
            }
        };
        let mut again = Vec::new();
        if let Err(e) = encode_instructions(&ins, &mut again) {
            t.fail(format!("--- {name}: re-encode: {e}"));
            continue;
        }
        let again = if kind == "instructions" { again } else { again[8..].to_vec() };
        let unknown = instructions_have_unknown(&ins);
        if !ovs_accepts {
            if again != bytes {
                t.fail(format!("--- {name}: OVS rejects it; we keep it but re-encode {}", hex::encode(&again)));
            }
            t.count(if unknown { "rejected by OVS, kept raw by us" } else { "rejected by OVS, typed by us" });
            continue;
        }
        if unknown {
            if again != bytes {
                t.fail(format!("--- {name}: raw form re-encodes as {}", hex::encode(&again)));
            }
            t.count("out of scope, kept raw, identical bytes");
            continue;
        }
        let ours = format!("actions={}", InstructionsText(&ins));
        if &ours != ovs {
            t.fail(format!("--- {name}: text\n  ovs:  {ovs}\n  ours: {ours}"));
        }
        if canon == "canonical" && again != bytes {
            t.fail(format!("--- {name}: re-encodes as {}", hex::encode(&again)));
        }
        t.count("in scope, text and bytes");
    }
    t.finish(
        "ofp-actions.tsv",
        &[
            // (+14 conjunction lists from tests/classifier.at.)
            // (+2: NXAST_CONTROLLER `controller(reason=invalid_ttl,max_len=1234,id=5678)`,
            // typed since the audit log's controller actions.)
            ("in scope, text and bytes", 56),
            ("out of scope, kept raw, identical bytes", 54),
            ("rejected by OVS and by us", 20),
            // (+5: invalid conjunction values, and conjunction with ct_clear.)
            ("rejected by OVS, kept raw by us", 45),
            // (+2: conjunction mixed with output, which OVS's ofpacts_verify refuses as a list.)
            ("rejected by OVS, typed by us", 13),
        ],
    );
}

/// The fields a match holds that this crate does not type.
fn match_is_typed(m: &Match) -> bool {
    m.other.is_empty()
}

#[test]
fn oxm_nxm_match_vectors() {
    let mut t = Tally::default();
    for r in rows("oxm-nxm-matches.tsv") {
        let [section, input, normalized, hexs, ovs] = &r[..] else { panic!("bad row {r:?}") };
        let name = format!("{section}: {input}");
        let _ = normalized;
        if hexs.is_empty() && ovs.starts_with("rejected:") {
            // OVS's parser rejects the input text itself, so there are no bytes to decode; the
            // row stays in the file (and is counted) as a record of what OVS refuses.
            t.count("rejected by OVS's parser (no bytes)");
            continue;
        }
        let nxm = section.contains("nx-match");
        let bytes = unhex(hexs);
        let decoded = Match::decode(&mut Reader::new(&bytes, "match"));
        let ovs_accepts = !ovs.starts_with("error:");
        let m = match decoded {
            Ok(m) => m,
            Err(_) if !ovs_accepts => {
                t.count("rejected in a FLOW_MOD by OVS and by us");
                continue;
            }
            Err(e) => {
                t.fail(format!("--- {name}: OVS prints {ovs:?}, we fail: {e}"));
                continue;
            }
        };
        let mut again = Vec::new();
        m.encode(&mut again);
        if !ovs_accepts {
            // (NXM_NX_COOKIE: a field of NXT_FLOW_MOD only.) Kept raw, so byte for byte.
            if !match_is_typed(&m) && again != bytes {
                t.fail(format!("--- {name}: OVS rejects it; we keep it but re-encode {}", hex::encode(&again)));
            }
            t.count("rejected in a FLOW_MOD by OVS, kept raw by us");
            continue;
        }
        if !match_is_typed(&m) {
            // Unmodelled fields are kept raw. Byte-identical re-encoding holds for OXM input;
            // NXM input is re-encoded in OXM form, so there the decoding must be a fixed point.
            if !nxm && again != bytes {
                t.fail(format!("--- {name}: raw fields re-encode as {}\n  want {hexs}", hex::encode(&again)));
            }
            let back = Match::decode(&mut Reader::new(&again, "match"));
            if back.as_ref() != Ok(&m) {
                t.fail(format!("--- {name}: re-encoding does not decode to the same match: {back:?}"));
            }
            t.count(if nxm { "NXM, fields out of scope kept raw" } else { "OXM, fields out of scope kept raw, identical bytes" });
            continue;
        }
        let ours = m.to_string();
        if &ours != ovs {
            t.fail(format!("--- {name}: text\n  ovs:  {ovs}\n  ours: {ours}"));
        }
        if nxm {
            let back = Match::decode(&mut Reader::new(&again, "match"));
            if back.as_ref() != Ok(&m) {
                t.fail(format!("--- {name}: OXM re-encoding decodes as {back:?}"));
            }
            t.count("NXM, in scope, text");
        } else {
            if again != bytes {
                t.fail(format!("--- {name}: re-encodes as {}\n  want {hexs}", hex::encode(&again)));
            }
            t.count("OXM, in scope, text and bytes");
        }
    }
    t.finish(
        "oxm-nxm-matches.tsv",
        &[
            // (-23/+23: the IPv6 rows, typed since EthMatch::Ipv6: ipv6_src/dst, ipv6_label,
            // ICMPv6 with nd_target/nd_sll/nd_tll, ip_frag under IPv6.)
            ("NXM, fields out of scope kept raw", 38),
            ("NXM, in scope, text", 104),
            // (The three OXM_OF_SCTP_DST rows are typed: IpProto::Sctp.)
            // (-14/+14: the IPv6 OXM rows, as above.)
            ("OXM, fields out of scope kept raw, identical bytes", 41),
            // (+4: conj_id, an NXM field that OVS keeps as NXM in an OF1.3 match.)
            ("OXM, in scope, text and bytes", 92),
            ("rejected by OVS's parser (no bytes)", 170),
            ("rejected in a FLOW_MOD by OVS, kept raw by us", 3),
        ],
    );
}

fn versions_text(v: &[u8]) -> String {
    v.iter().map(|v| format!("{v:#04x}")).collect::<Vec<_>>().join(", ")
}

#[test]
fn ofp_print_vectors() {
    let mut t = Tally::default();
    for r in rows("ofp-print.tsv") {
        let [title, hexs, ovs] = &r[..] else { panic!("bad row {r:?}") };
        let name = format!("{title}: {}", &hexs[..16.min(hexs.len())]);
        let bytes = unhex(hexs);
        let m = match OfMessage::decode(&bytes) {
            Ok(m) => m,
            Err(e) if ovs.contains("decode error") => {
                let _ = e;
                t.count("rejected by OVS and by us");
                continue;
            }
            Err(e) => {
                t.fail(format!("--- {name}: we fail: {e}"));
                continue;
            }
        };
        let again = m.to_bytes().map(|b| b.to_vec()).unwrap_or_default();
        let identical = again == bytes;
        match &m.msg {
            Message::Hello(h) => {
                // `version bitmap: ...` is OVS's interpretation of the element(s).
                let want = ovs.lines().find_map(|l| l.trim().strip_prefix("version bitmap: ")).expect("bitmap line");
                let ours = versions_text(&h.versions(m.version));
                if ours != want {
                    t.fail(format!("--- {name}: versions\n  ovs:  {want}\n  ours: {ours}"));
                }
                if !identical {
                    t.fail(format!("--- {name}: HELLO re-encodes as {}", hex::encode(&again)));
                }
                t.count("HELLO, versions and bytes");
            }
            Message::FlowMod(fm) => {
                let line = ovs.lines().next().unwrap_or_default();
                let (_, body) = line.split_once("): ").expect("flow_mod line");
                let want_actions = body.split_once("actions=").map(|(_, a)| a).unwrap_or_default();
                let ours = fm.to_string();
                let ours_actions = ours.split_once("actions=").map(|(_, a)| a).unwrap_or_default();
                if want_actions != ours_actions {
                    t.fail(format!("--- {name}: actions\n  ovs:  {want_actions}\n  ours: {ours_actions}"));
                }
                if match_is_typed(&fm.match_) {
                    // The match part of OVS's line (between `table:N` and the flags/actions).
                    let words: Vec<&str> = body.split_whitespace().collect();
                    let want_m = words.iter().find(|w| w.contains('=') && !w.starts_with("actions=")).copied().unwrap_or("");
                    let ours_m = ours.split(" actions=").next().unwrap_or("").rsplit(' ').next().unwrap_or("");
                    if want_m != ours_m {
                        t.fail(format!("--- {name}: match\n  ovs:  {want_m}\n  ours: {ours_m}"));
                    }
                    if !identical {
                        t.fail(format!("--- {name}: re-encodes as {}", hex::encode(&again)));
                    }
                    t.count("FLOW_MOD in scope, text and bytes");
                } else {
                    // Match fields out of scope (dl_src, vlan_tci, ...) are kept raw and emitted
                    // after the typed ones: the decoding is a fixed point of re-encoding.
                    if OfMessage::decode(&again).as_ref() != Ok(&m) {
                        t.fail(format!("--- {name}: re-encoding does not decode to the same message"));
                    }
                    t.count("FLOW_MOD with match fields out of scope, actions text, fixed point");
                }
            }
            Message::MeterMod(mm) => {
                let want = ovs.split_once("): ").map(|(_, b)| b).unwrap_or_default();
                let ours = mm.to_string();
                if want.trim_end() != ours {
                    t.fail(format!("--- {name}: meter mod\n  ovs:  {want}\n  ours: {ours}"));
                }
                if !identical {
                    t.fail(format!("--- {name}: METER_MOD re-encodes as {}", hex::encode(&again)));
                }
                t.count("METER_MOD, text and bytes");
            }
            Message::Unknown { .. } | Message::Experimenter { .. } => {
                if !identical {
                    t.fail(format!("--- {name}: raw message re-encodes as {}", hex::encode(&again)));
                }
                t.count("message type out of scope, kept raw, identical bytes");
            }
            Message::MultipartRequest(MultipartRequest { body: MultipartRequestBody::Unknown { .. }, .. })
            | Message::MultipartReply(MultipartReply { body: MultipartReplyBody::Unknown { .. }, .. }) => {
                if !identical {
                    t.fail(format!("--- {name}: raw multipart re-encodes as {}", hex::encode(&again)));
                }
                t.count("multipart type out of scope, kept raw, identical bytes");
            }
            other => {
                if !identical {
                    t.fail(format!("--- {name}: {} re-encodes as {}", other.name(), hex::encode(&again)));
                }
                t.count("other typed message, identical bytes");
            }
        }
    }
    t.finish(
        "ofp-print.tsv",
        &[
            ("FLOW_MOD in scope, text and bytes", 1),
            ("FLOW_MOD with match fields out of scope, actions text, fixed point", 1),
            ("HELLO, versions and bytes", 11),
            ("METER_MOD, text and bytes", 1),
            // (-7 since the audit log: PACKET_IN x2, METER_MOD x4 (3 refused by OVS, by us
            // too), SET_ASYNC are typed; -1 since FLOW_REMOVED is typed.)
            ("message type out of scope, kept raw, identical bytes", 9),
            // (-4: METER_FEATURES and METER (stats) requests and replies.)
            ("multipart type out of scope, kept raw, identical bytes", 12),
            // (+7: PACKET_IN x2, SET_ASYNC, METER_FEATURES and METER requests and replies;
            // +1: FLOW_REMOVED.)
            ("other typed message, identical bytes", 13),
            ("rejected by OVS and by us", 3),
        ],
    );
}
