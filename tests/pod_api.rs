//! The pod API over its unix socket and the metrics endpoint, against a running agent
//! (in-process `run`) on a real switch.

mod support;

use std::time::Instant;

use sdn_node::api::client::call;
use sdn_node::api::PodRequest;
use support::inproc::*;
use support::*;

const STATE: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.0.0/18}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11, multicast: true}
  - {name: team-b, netid: 12}
pods:
  - {namespace: team-a, name: from-file, containerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
     hostVeth: veth-file, internal: true, ip: 10.128.0.5, mac: "0a:58:0a:80:00:05"}
"#;

#[tokio::test]
async fn setup_list_teardown() {
    let r = start(STATE).await;
    let mut p = pod("web-1", "team-a", "10.128.0.9", 9);
    p.annotations.insert("kubernetes.io/ingress-bandwidth".into(), "10M".into());
    let (code, body) = post(&r.socket, &serde_json::to_string(&p).unwrap()).await;
    assert_eq!(code, 200, "{body}");
    let ofport: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ofport = ofport["ofport"].as_u64().unwrap();
    // Answered after commit: the flows are there now.
    let flows = dump_sorted(&r.sb, &[]);
    let mine: Vec<&String> = flows.iter().filter(|l| l.contains("10.128.0.9")).collect();
    assert_eq!(mine.len(), 4, "{flows:#?}");
    assert!(flows.iter().any(|l| l.contains(&format!("in_port={ofport}"))));
    // Multicast lists both team-a pods.
    assert!(flows.iter().any(|l| l.contains("table=120") && l.contains(&format!("output:{ofport}"))), "{flows:#?}");
    let out = std::process::Command::new("ovs-vsctl")
        .arg(format!("--db={}", r.sb.db_socket()))
        .args(["get", "port", "veth-web-1", "qos"])
        .envs(r.sb.ovs_env())
        .output()
        .unwrap();
    assert_ne!(String::from_utf8_lossy(&out.stdout).trim(), "[]", "ingress bandwidth sets QoS");

    let (code, body) = call(&r.socket, "GET", "/v1/pods", None).await.unwrap();
    assert_eq!(code, 200);
    let listed: Vec<PodRequest> = serde_json::from_str(&body).unwrap();
    assert_eq!(listed, vec![p]);

    let (code, _) = call(&r.socket, "DELETE", "/v1/pods/team-a/web-1", None).await.unwrap();
    assert_eq!(code, 200);
    assert!(dump_sorted(&r.sb, &[]).iter().all(|l| !l.contains("10.128.0.9")));
    let ports = ofctl_ports(&r.sb);
    assert!(!ports.contains("veth-web-1"), "{ports}");
}

fn ofctl_ports(sb: &sdn_harness::sandbox::OvsSandbox) -> String {
    let out = std::process::Command::new("ovs-vsctl")
        .arg(format!("--db={}", sb.db_socket()))
        .args(["list-ports", "br0"])
        .envs(sb.ovs_env())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn bad_requests_are_4xx_and_change_nothing() {
    let r = start(STATE).await;
    let ok = pod("ok", "team-b", "10.128.0.20", 20);
    assert_eq!(post(&r.socket, &serde_json::to_string(&ok).unwrap()).await.0, 200);
    let before = dump_sorted(&r.sb, &[]);
    let ports_before = ofctl_ports(&r.sb);
    let body = |f: &dyn Fn(&mut PodRequest)| {
        let mut p = pod("bad", "team-b", "10.128.0.21", 21);
        f(&mut p);
        serde_json::to_string(&p).unwrap()
    };
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, "request body"),
        (r#"{"containerID":"x","surprise":1}"#.into(), 400, "unknown field"),
        (body(&|p| p.container_id = "xyz".into()), 400, "field containerID"),
        (body(&|p| p.container_id = "zz".repeat(32)), 400, "not hexadecimal"),
        (body(&|p| p.mac = "0a:58".into()), 400, "field mac"),
        (body(&|p| p.ip = "10.200.0.1".into()), 400, "field ip"),
        (body(&|p| p.ip = "10.128.0.1".into()), 400, "gateway"),
        (body(&|p| p.ip = "10.128.0.20".into()), 409, "already used by pod team-b/ok"),
        (body(&|p| p.ip = "10.128.0.5".into()), 409, "already used by pod team-a/from-file"),
        (body(&|p| p.namespace = "nowhere".into()), 400, "field namespace"),
        (
            body(&|p| {
                p.annotations.insert("kubernetes.io/egress-bandwidth".into(), "fast".into());
            }),
            400,
            "annotations[kubernetes.io/egress-bandwidth]",
        ),
        (body(&|p| p.host_veth = "a-name-longer-than-15".into()), 400, "field hostVeth"),
    ];
    for (b, want, text) in cases {
        let (code, resp) = post(&r.socket, &b).await;
        assert_eq!(code, want, "{b} -> {resp}");
        assert!(resp.contains(text), "{b} -> {resp} (wanted {text:?})");
    }
    let (code, resp) = call(&r.socket, "DELETE", "/v1/pods/team-b/nope", None).await.unwrap();
    assert_eq!(code, 404, "{resp}");
    let (code, resp) = call(&r.socket, "DELETE", "/v1/pods/team-a/from-file", None).await.unwrap();
    assert_eq!(code, 409, "{resp}");
    assert_eq!(dump_sorted(&r.sb, &[]), before, "nothing changed");
    assert_eq!(ofctl_ports(&r.sb), ports_before);
    // The socket is private to root.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&r.socket).unwrap().permissions().mode() & 0o777, 0o600);
}

#[tokio::test]
async fn metrics_and_health() {
    let r = start(STATE).await;
    assert_eq!(http_get(&r.metrics, "/healthz").await.0, 200);
    assert_eq!(http_get(&r.metrics, "/readyz").await.0, 200);
    let (code, before) = http_get(&r.metrics, "/metrics").await;
    assert_eq!(code, 200);
    for family in [
        "sdn_node_flow_mods_total",
        "sdn_node_bundles_total",
        "sdn_node_bundle_latency_seconds",
        "sdn_node_flows{",
        "sdn_node_reconnects_total",
        "sdn_node_resyncs_total",
        "sdn_node_dns_failures_total",
        "sdn_node_pod_setup_seconds",
        "sdn_node_objects_rejected",
        "sdn_node_connected",
    ] {
        assert!(before.contains(family), "missing {family}\n{before}");
    }
    let value = |text: &str, series: &str| -> f64 {
        text.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
    };
    let p = pod("m1", "team-a", "10.128.0.30", 30);
    assert_eq!(post(&r.socket, &serde_json::to_string(&p).unwrap()).await.0, 200);
    // A rejected pod moves the rejection counter.
    let bad = pod("m2", "nowhere", "10.128.0.31", 31);
    assert_eq!(post(&r.socket, &serde_json::to_string(&bad).unwrap()).await.0, 400);
    let (_, after) = http_get(&r.metrics, "/metrics").await;
    assert_eq!(value(&after, "sdn_node_pod_setup_seconds_count"), value(&before, "sdn_node_pod_setup_seconds_count") + 1.0);
    assert!(value(&after, "sdn_node_bundles_total{result=\"ok\"}") > value(&before, "sdn_node_bundles_total{result=\"ok\"}"));
    assert!(
        value(&after, "sdn_node_flow_mods_total{op=\"add\",result=\"ok\"}") >= value(&before, "sdn_node_flow_mods_total{op=\"add\",result=\"ok\"}") + 4.0
    );
    assert_eq!(value(&after, "sdn_node_connected{target=\"openflow\"}"), 1.0);
}

/// Pod setup latency through the API with many pods installed (the closing note's figure):
/// `PODS=5000 CALLS=1000 cargo test --release --test pod_api -- --ignored --nocapture`.
/// With `PRECREATE=1` every pod's port is created on the bridge beforehand in one OVSDB
/// transaction (as if ports existed), so the figure is the agent's path (port lookup, QoS,
/// record, flows committed) without ovs-vswitchd's per-port reconfiguration, which grows
/// with the number of ports on the bridge.
#[tokio::test]
#[ignore]
async fn setup_latency_with_many_pods() {
    let base: u32 = std::env::var("PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    let calls: u32 = std::env::var("CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let r = start(STATE).await;
    let ip = |i: u32| std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 128, 1, 0)) + i).to_string();
    let mk = |i: u32| {
        let mut p = pod(&format!("p{i}"), if i.is_multiple_of(2) { "team-a" } else { "team-b" }, &ip(i), 0);
        p.container_id = format!("{i:064x}");
        p.mac = format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", (i >> 24) as u8, (i >> 16) as u8, (i >> 8) as u8, i as u8);
        p.host_veth = format!("v{i}");
        p
    };
    if std::env::var("PRECREATE").is_ok_and(|v| v == "1") {
        let t = Instant::now();
        let mut args = vec![format!("--db={}", r.sb.db_socket()), "--timeout=600".into()];
        for i in 0..base + calls {
            args.extend(["--".into(), "add-port".into(), "br0".into(), format!("v{i}")]);
            args.extend(["--".into(), "set".into(), "interface".into(), format!("v{i}"), "type=internal".into()]);
        }
        let out = std::process::Command::new("ovs-vsctl").args(&args).envs(r.sb.ovs_env()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        eprintln!("pre-created {} ports in {:?}", base + calls, t.elapsed());
    }
    let t = Instant::now();
    for i in 0..base {
        let (code, body) = post(&r.socket, &serde_json::to_string(&mk(i)).unwrap()).await;
        assert_eq!(code, 200, "{body}");
    }
    eprintln!("installed {base} pods in {:?}", t.elapsed());
    let mut lat = Vec::new();
    for i in base..base + calls {
        let body = serde_json::to_string(&mk(i)).unwrap();
        let t = Instant::now();
        let (code, resp) = post(&r.socket, &body).await;
        lat.push(t.elapsed());
        assert_eq!(code, 200, "{resp}");
    }
    lat.sort();
    let q = |f: f64| lat[((lat.len() - 1) as f64 * f) as usize];
    eprintln!("pod setup latency over {calls} calls with {base} pods installed: p50 {:?} p99 {:?} max {:?}", q(0.5), q(0.99), q(1.0));
}
