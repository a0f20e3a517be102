//! Parsing `ofproto/trace`'s text (OVS 3.1) into steps.
//!
//! The text is for humans and has no schema, so the parser keys on the few shapes OVS's
//! `xlate_report_table()` and the trace tree print, and keeps everything else as text:
//!
//! ```text
//! Flow: ip,in_port=3,...
//!
//! bridge("br0")
//! -------------
//!  0. ip,in_port=3, priority 100, cookie 0x400000159b1c8e2
//!     goto_table:20
//! 80. reg0=0xb,reg1=0xb, priority 100, cookie 0xa00000104d06f7e
//!     output:NXM_NX_REG2[]
//!      -> output port is 4
//!
//! Final flow: ...
//! Megaflow: ...
//! Datapath actions: 4
//! ```
//!
//! A table line is `%2d. ` then the flow's match, `priority N` and `cookie 0x..` (only when
//! non-zero), or `No match.`; the lines indented under it are its actions (`->` and `>>` lines
//! are OVS's notes on them). `resubmit` nests the next table one level deeper, `goto_table`
//! does not; the indentation tells which step an action line belongs to. Unknown lines are
//! ignored, so a newer OVS that adds annotations degrades to less detail, not to an error.

use serde::Serialize;

/// The flow a table matched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Matched {
    /// The flow's match as OVS prints it (empty for a match-all flow).
    #[serde(rename = "match")]
    pub match_: String,
    pub priority: u16,
    pub cookie: u64,
}

/// One table lookup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    pub bridge: String,
    pub table: u8,
    /// Nesting (0 for the bridge's first table; +1 per `resubmit`).
    pub depth: usize,
    /// `None`: no flow matched (`miss` says what OVS did).
    pub matched: Option<Matched>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub miss: Option<String>,
    pub actions: Vec<String>,
    /// OVS's notes on the actions (`-> output port is 4`, `-> NXM_NX_REG0[] is now 0xb`).
    pub notes: Vec<String>,
    /// Actions and notes interleaved as printed (notes prefixed with `->`): the effect of an
    /// action is only known from the note after it.
    #[serde(skip)]
    pub sequence: Vec<String>,
}

/// A parsed trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ParsedTrace {
    /// The `Flow:` line: the packet as OVS understood it.
    pub flow: String,
    pub steps: Vec<Step>,
    pub final_flow: Option<String>,
    pub megaflow: Option<String>,
    /// The `Datapath actions:` value (`drop`, `4`, `set(tunnel(...)),1`, ...).
    pub datapath_actions: Option<String>,
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// `20. ip,in_port=3, priority 100, cookie 0x..` → (20, rest).
fn table_line(line: &str) -> Option<(u8, &str)> {
    let t = line.trim_start();
    let (n, rest) = t.split_once(". ")?;
    if n.is_empty() || n.len() > 3 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((n.parse().ok()?, rest))
}

/// The part after `N. `: a matched flow, or a miss.
fn table_rest(rest: &str) -> Result<Matched, String> {
    let rest = rest.trim_end();
    // "priority N" is either the whole start (match-all flow) or after the last ", ".
    let (match_, tail) = if let Some(t) = rest.strip_prefix("priority ") {
        ("", t)
    } else if let Some((m, t)) = rest.rsplit_once(", priority ") {
        (m, t)
    } else {
        return Err(rest.to_string());
    };
    let (prio, cookie) = match tail.split_once(", cookie ") {
        Some((p, c)) => (p, Some(c)),
        None => (tail, None),
    };
    let Ok(priority) = prio.trim().parse::<u16>() else { return Err(rest.to_string()) };
    let cookie = match cookie {
        None => 0,
        Some(c) => {
            let c = c.split([',', ' ']).next().unwrap_or("");
            let hex = c.strip_prefix("0x").unwrap_or(c);
            u64::from_str_radix(hex, 16).map_err(|_| rest.to_string())?
        }
    };
    Ok(Matched { match_: match_.to_string(), priority, cookie })
}

/// Parses `ofproto/trace` output. Never fails: what it does not recognise it skips.
pub fn parse(text: &str) -> ParsedTrace {
    let mut out = ParsedTrace::default();
    let mut bridge = String::new();
    // Open steps: (nesting level, index in out.steps).
    let mut open: Vec<(usize, usize)> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.bytes().all(|b| b == b'-') {
            continue;
        }
        if indent(line) == 0 {
            if let Some(v) = t.strip_prefix("Flow: ") {
                out.flow = v.to_string();
                continue;
            }
            if let Some(v) = t.strip_prefix("Final flow: ") {
                out.final_flow = Some(v.to_string());
                open.clear();
                continue;
            }
            if let Some(v) = t.strip_prefix("Megaflow: ") {
                out.megaflow = Some(v.to_string());
                continue;
            }
            if let Some(v) = t.strip_prefix("Datapath actions: ") {
                out.datapath_actions = Some(v.to_string());
                continue;
            }
        }
        if let Some(b) = t.strip_prefix("bridge(\"").and_then(|r| r.strip_suffix("\")")) {
            bridge = b.to_string();
            open.clear();
            continue;
        }
        // Table numbers are right-aligned in two columns (` 0.`, `20.`, `110.`), nested
        // levels are 4 columns deeper, and a level's actions 4 columns deeper than its table
        // line (notes one more): levels come from the indentation rounded to fours.
        let ind = indent(line);
        if let Some((table, rest)) = table_line(line) {
            let level = (ind + 1) / 4;
            while open.last().is_some_and(|&(l, _)| l >= level) {
                open.pop();
            }
            let (matched, miss) = match table_rest(rest) {
                Ok(m) => (Some(m), None),
                Err(r) => (None, Some(r)),
            };
            out.steps.push(Step {
                bridge: bridge.clone(),
                table,
                depth: level,
                matched,
                miss,
                actions: vec![],
                notes: vec![],
                sequence: vec![],
            });
            open.push((level, out.steps.len() - 1));
            continue;
        }
        let Some(level) = (ind / 4).checked_sub(1) else { continue };
        while open.last().is_some_and(|&(l, _)| l > level) {
            open.pop();
        }
        let Some(&(_, idx)) = open.last() else { continue };
        let step = &mut out.steps[idx];
        if let Some(n) = t.strip_prefix("->") {
            step.notes.push(n.trim().to_string());
            step.sequence.push(format!("->{}", n.trim()));
        } else if let Some(n) = t.strip_prefix(">>") {
            step.notes.push(n.trim().to_string());
            step.sequence.push(format!(">>{}", n.trim()));
        } else {
            step.actions.push(t.to_string());
            step.sequence.push(t.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "Flow: ip,in_port=3,vlan_tci=0x0000,nw_src=10.128.2.5,nw_dst=10.128.2.7

bridge(\"br0\")
-------------
 0. ip,in_port=3, priority 100, cookie 0x400000159b1c8e2
    goto_table:20
20. ip,in_port=3,nw_src=10.128.2.5, priority 100, cookie 0x400000159b1c8e2
    load:0xb->NXM_NX_REG0[]
    goto_table:21
21. priority 0, cookie 0x100000100000000
    goto_table:30
30. ip,nw_dst=10.128.2.0/23, priority 200, cookie 0x100000100000000
    goto_table:70
70. ip,nw_dst=10.128.2.7, priority 100, cookie 0x40000012f3b9c24
    load:0xc->NXM_NX_REG1[]
    load:0x4->NXM_NX_REG2[]
    goto_table:80
80. priority 0, cookie 0x100000100000000
    drop
 0. in_port=1, priority 100
    move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[]
     -> NXM_NX_REG0[] is now 0xb
    resubmit(,10)
    10. tun_src=172.17.0.3, priority 100
        goto_table:30
    output:7
     >> skipping output to input port
99. No match.
    drop

Final flow: unchanged
Megaflow: recirc_id=0,eth,ip,in_port=3,nw_src=10.128.2.5,nw_dst=10.128.2.7,nw_frag=no
Datapath actions: drop
";

    #[test]
    fn steps() {
        let p = parse(TEXT);
        assert_eq!(p.flow, "ip,in_port=3,vlan_tci=0x0000,nw_src=10.128.2.5,nw_dst=10.128.2.7");
        assert_eq!(p.datapath_actions.as_deref(), Some("drop"));
        let tables: Vec<u8> = p.steps.iter().map(|s| s.table).collect();
        assert_eq!(tables, [0, 20, 21, 30, 70, 80, 0, 10, 99]);
        let s = &p.steps[1];
        assert_eq!(
            s.matched,
            Some(Matched { match_: "ip,in_port=3,nw_src=10.128.2.5".into(), priority: 100, cookie: 0x400000159b1c8e2 })
        );
        assert_eq!(s.actions, ["load:0xb->NXM_NX_REG0[]", "goto_table:21"]);
        assert_eq!(p.steps[2].matched.as_ref().unwrap().match_, "");
        assert_eq!(p.steps[5].actions, ["drop"]);
        assert_eq!(p.steps[6].notes, ["NXM_NX_REG0[] is now 0xb", "skipping output to input port"]);
        assert_eq!(p.steps[6].actions, ["move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[]", "resubmit(,10)", "output:7"]);
        assert_eq!(p.steps[7].depth, 1);
        assert_eq!(p.steps[7].actions, ["goto_table:30"]);
        assert_eq!(p.steps[8].depth, 0);
        assert_eq!(p.steps[8].matched, None);
        assert_eq!(p.steps[8].miss.as_deref(), Some("No match."));
        assert!(p.steps.iter().all(|s| s.bridge == "br0"));
    }

    #[test]
    fn garbage_does_not_panic() {
        for t in [
            "",
            "\n\n",
            "1. ",
            "999. priority x",
            " 0. , priority 70000",
            "-> x",
            "300. a, priority 1, cookie 0xzz",
            "é. ü",
        ] {
            let _ = parse(t);
        }
    }
}
