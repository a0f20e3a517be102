//! deploy/grafana/sdn-node.json only queries metrics the agent exports.
//!
//! A dashboard drifts silently: a renamed family leaves an empty panel, not an error. So the
//! test reads every PromQL expression of the dashboard (panels, rows, template variables),
//! extracts the `sdn_node_*` names and the `by (...)` labels, starts the agent in-process on a
//! private switch, and checks them against its real `/metrics` output. The same check run on
//! the dashboard with a metric misspelt, or grouped by a label it lacks, must find it.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The multitenant state of `tests/trace.rs`.
fn state() -> String {
    let src = include_str!("trace.rs");
    let start =
        src.find("const STATE: &str = r#\"").expect("STATE in tests/trace.rs") + "const STATE: &str = r#\"".len();
    let len = src[start..].find("\"#;").expect("end of STATE");
    src[start..start + len].to_string()
}

/// Every PromQL string in the dashboard: targets' `expr` and template variables' queries.
fn expressions(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains("sdn_node_") => out.push(s.clone()),
                    _ => expressions(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| expressions(x, out)),
        _ => {}
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The `sdn_node_*` metric names an expression uses.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("sdn_node_") {
        let preceded = rest[..i].chars().last().is_some_and(is_ident);
        let tail = &rest[i..];
        let end = tail.find(|c: char| !is_ident(c)).unwrap_or(tail.len());
        if !preceded {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The labels of `by (...)` clauses.
fn by_labels(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("by (") {
        let tail = &rest[i + 4..];
        let Some(end) = tail.find(')') else { break };
        out.extend(tail[..end].split(',').map(|l| l.trim().to_string()).filter(|l| !l.is_empty()));
        rest = &tail[end..];
    }
    out
}

/// Series names the exposition offers (with the labels seen on each), including the ones a
/// declared family will have before its first sample (`# TYPE x counter` → `x_total`).
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut w = decl.split_whitespace();
            let (Some(name), Some(kind)) = (w.next(), w.next()) else { continue };
            let names: Vec<String> = match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{name}{s}")).collect(),
                _ => vec![name.to_string()],
            };
            for n in names {
                out.entry(n).or_default();
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let end = line.find(|c: char| !is_ident(c)).unwrap_or(line.len());
        let labels = out.entry(line[..end].to_string()).or_default();
        if let Some(set) = line[end..].strip_prefix('{').and_then(|l| l.split_once('}')).map(|(s, _)| s) {
            labels.extend(set.split(',').filter_map(|kv| kv.split_once('=')).map(|(k, _)| k.trim().to_string()));
        }
    }
    out
}

/// `/metrics` of an agent on deploy/examples/networkpolicy.yaml after its first read of the
/// policy flows' statistics (every series at zero: no packets).
async fn networkpolicy_metrics() -> String {
    let state = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/networkpolicy.yaml")).unwrap();
    let agent = support::inproc::start_with(&state, |o| o.policy_stats_interval = Some(std::time::Duration::from_millis(200))).await;
    for _ in 0..200 {
        let (code, m) = support::inproc::http_get(&agent.metrics, "/metrics").await;
        assert_eq!(code, 200);
        if m.contains("sdn_node_policy_stats_reads_total{result=\"ok\"} ") && !m.contains("sdn_node_policy_stats_reads_total{result=\"ok\"} 0") {
            assert!(m.contains("sdn_node_policy_connections_total{namespace=\"team-a\",policy=\"db-from-web\",direction=\"ingress\"} 0"), "{m}");
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the policy counters were never read");
}

/// The panels the dashboard must have: a metric each uses.
const WANTED: &[&str] = &[
    "sdn_node_bundle_latency_seconds_bucket",
    "sdn_node_flow_mods_total",
    "sdn_node_flows",
    "sdn_node_reconnects_total",
    "sdn_node_resyncs_total",
    "sdn_node_pod_setup_seconds_bucket",
    "sdn_node_pod_requests_total",
    "sdn_node_objects_rejected_total",
    "sdn_node_policy_connections_total",
    "sdn_node_policy_dropped_packets_total",
    "sdn_node_policy_stats_reads_total",
    "sdn_node_pod_addresses",
];

/// What is wrong with `dash` against the agent's `/metrics` text: a metric it does not export,
/// a grouping label on none of the expression's series, a wanted metric no panel uses. Empty:
/// nothing.
fn problems(dash: &Value, metrics: &str) -> Vec<String> {
    let mut exprs = Vec::new();
    expressions(dash, &mut exprs);
    let exported = exported(metrics);
    let mut out = Vec::new();
    if exprs.len() < 10 {
        out.push(format!("only {} expressions: {exprs:?}", exprs.len()));
    }
    let mut used = BTreeSet::new();
    for e in &exprs {
        let names = metric_names(e);
        if names.is_empty() {
            out.push(format!("expression uses no sdn_node_ metric: {e}"));
        }
        for n in &names {
            if !exported.contains_key(n) {
                out.push(format!("{n} (in `{e}`) is not exported by the agent"));
            }
        }
        // Grouping labels exist on the series (instance and job are the scraper's).
        for l in by_labels(e) {
            if ["instance", "job"].contains(&l.as_str()) {
                continue;
            }
            if !names.iter().any(|n| exported.get(n).is_some_and(|labels| labels.contains(&l))) {
                out.push(format!("label {l} (in `{e}`) is on none of {names:?}"));
            }
        }
        used.extend(names);
    }
    for want in WANTED {
        if !used.contains(*want) {
            out.push(format!("no panel uses {want}; used: {used:?}"));
        }
    }
    out
}

#[tokio::test]
async fn every_dashboard_metric_is_exported() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/sdn-node.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("dashboard is JSON");
    assert_eq!(dash["uid"], "sdn-node");

    let agent = support::inproc::start(&state()).await;
    let (code, mut metrics) = support::inproc::http_get(&agent.metrics, "/metrics").await;
    assert_eq!(code, 200);
    // The NetworkPolicy counters' series exist under the networkpolicy plugin, once read.
    metrics.push_str(&networkpolicy_metrics().await);
    let found = problems(&dash, &metrics);
    assert!(found.is_empty(), "{}\nthe agent exports:\n{metrics}", found.join("\n"));
    // Pods' addresses by family: both series, whatever the cluster (0 IPv6 on this IPv4 one).
    for family in ["ipv4", "ipv6"] {
        let series = format!("sdn_node_pod_addresses{{family=\"{family}\"}} ");
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }

    // The check sees a misspelt metric and a wrong grouping label of the pod-addresses panel.
    let misspelt: Value = serde_json::from_str(&text.replace("sdn_node_pod_addresses{", "sdn_node_pod_address{")).unwrap();
    let found = problems(&misspelt, &metrics);
    assert!(found.iter().any(|p| p.starts_with("sdn_node_pod_address (in `")), "{found:?}");
    assert!(found.iter().any(|p| p.starts_with("no panel uses sdn_node_pod_addresses;")), "{found:?}");
    let by_ip: Value = serde_json::from_str(&text.replace("sum by (family) (sdn_node_pod_addresses", "sum by (ip_family) (sdn_node_pod_addresses")).unwrap();
    let found = problems(&by_ip, &metrics);
    assert_eq!(found, [r#"label ip_family (in `sum by (ip_family) (sdn_node_pod_addresses{instance=~"$instance"})`) is on none of {"sdn_node_pod_addresses"}"#], "{found:?}");
}

#[test]
fn extraction() {
    let e = r#"histogram_quantile(0.5, sum by (le, op) (rate(sdn_node_x_bucket{instance=~"$i"}[5m]))) / sdn_node_y"#;
    assert_eq!(metric_names(e).into_iter().collect::<Vec<_>>(), ["sdn_node_x_bucket", "sdn_node_y"]);
    assert_eq!(by_labels(e).into_iter().collect::<Vec<_>>(), ["le", "op"]);
    let x = exported("# TYPE sdn_node_a counter\n# TYPE sdn_node_h histogram\nsdn_node_g{table=\"0\"} 3\n");
    assert!(x.contains_key("sdn_node_a_total") && x.contains_key("sdn_node_h_bucket"));
    assert!(x["sdn_node_g"].contains("table"));
}
