//! The nftables table, checked with `nft -j list table` in a throwaway namespace.

mod common;

use common::{root_or_skip, TestNs};
use hostnet::{install_firewall, remove_firewall, FirewallConfig};
use serde_json::{json, Value};

const TABLE: &str = "sdn-node";

fn cfg() -> FirewallConfig {
    FirewallConfig::new("10.128.0.0/14".parse().unwrap(), "172.30.0.0/16".parse().unwrap())
}

/// The objects of `nft -j list table ip TABLE`, or None if the table does not exist.
fn list(t: &TestNs, table: &str) -> Option<Vec<Value>> {
    if !t.exec_ok(&["nft", "list", "table", "ip", table]) {
        return None;
    }
    let out = t.exec(&["nft", "-j", "list", "table", "ip", table]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v["nftables"].as_array().cloned()
}

fn of_kind(objs: &[Value], kind: &str) -> Vec<Value> {
    objs.iter().filter_map(|o| o.get(kind).cloned()).collect()
}

/// (chain, expressions) of each rule, in listing order (which is rule order per chain).
fn rules(objs: &[Value]) -> Vec<(String, Value)> {
    of_kind(objs, "rule").into_iter().map(|r| (r["chain"].as_str().unwrap().to_string(), r["expr"].clone())).collect()
}

fn prefix(field: &str, op: &str, addr: &str, len: u32) -> Value {
    json!({"match": {"left": {"payload": {"field": field, "protocol": "ip"}}, "op": op,
                     "right": {"prefix": {"addr": addr, "len": len}}}})
}

/// The rules; `within`: traffic inside the cluster network is masqueraded too.
fn expected_rules(cn: &str, len: u32, port: u16, tun: &str, within: bool) -> Vec<(String, Value)> {
    let r = |chain: &str, e: Value| (chain.to_string(), e);
    let masquerade = if within {
        json!([prefix("saddr", "==", cn, len), {"masquerade": null}])
    } else {
        json!([prefix("saddr", "==", cn, len), prefix("daddr", "!=", cn, len), {"masquerade": null}])
    };
    vec![
        r("postrouting", masquerade),
        r(
            "forward",
            json!([prefix("saddr", "==", cn, len),
                             {"match": {"left": {"ct": {"key": "state"}}, "op": "in", "right": "invalid"}},
                             {"drop": null}]),
        ),
        r("forward", json!([prefix("daddr", "==", cn, len), {"accept": null}])),
        r("forward", json!([prefix("saddr", "==", cn, len), {"accept": null}])),
        r(
            "input",
            json!([{"match": {"left": {"payload": {"field": "dport", "protocol": "udp"}},
                                     "op": "==", "right": port}}, {"accept": null}]),
        ),
        r(
            "input",
            json!([{"match": {"left": {"meta": {"key": "iifname"}}, "op": "==", "right": tun}},
                          {"accept": null}]),
        ),
    ]
}

#[tokio::test]
async fn installs_the_openshift_sdn_rules() {
    if !root_or_skip("installs_the_openshift_sdn_rules") {
        return;
    }
    let t = TestNs::new("fw");
    install_firewall(&t.ns, &cfg()).await.unwrap();
    let objs = list(&t, TABLE).expect("table exists");
    let mut chains: Vec<_> = of_kind(&objs, "chain")
        .into_iter()
        .map(|c| (c["name"].clone(), c["hook"].clone(), c["type"].clone(), c["prio"].clone(), c["policy"].clone()))
        .collect();
    chains.sort_by_key(|c| c.0.to_string());
    assert_eq!(
        chains,
        vec![
            (json!("forward"), json!("forward"), json!("filter"), json!(0), json!("accept")),
            (json!("input"), json!("input"), json!("filter"), json!(0), json!("accept")),
            (json!("postrouting"), json!("postrouting"), json!("nat"), json!(100), json!("accept")),
        ]
    );
    assert_eq!(rules(&objs), expected_rules("10.128.0.0", 14, 4789, "tun0", true));
}

#[tokio::test]
async fn reinstall_replaces_in_place() {
    if !root_or_skip("reinstall_replaces_in_place") {
        return;
    }
    let t = TestNs::new("fw");
    install_firewall(&t.ns, &cfg()).await.unwrap();
    // Someone else's rule in our table, and someone else's table: the first must go, the
    // second must stay.
    t.exec(&["nft", "add", "rule", "ip", TABLE, "input", "counter"]);
    t.exec(&["nft", "add", "table", "ip", "other"]);
    install_firewall(&t.ns, &cfg()).await.unwrap();
    assert_eq!(rules(&list(&t, TABLE).unwrap()), expected_rules("10.128.0.0", 14, 4789, "tun0", true));

    let mut changed = FirewallConfig::new("10.0.0.0/16".parse().unwrap(), "172.30.0.0/16".parse().unwrap());
    changed.vxlan_port = 8472;
    changed.tun = "tun1".into();
    changed.masquerade_within_cluster = false;
    install_firewall(&t.ns, &changed).await.unwrap();
    assert_eq!(rules(&list(&t, TABLE).unwrap()), expected_rules("10.0.0.0", 16, 8472, "tun1", false));
    assert!(list(&t, "other").is_some(), "foreign table removed");
}

#[tokio::test]
async fn readers_never_see_a_partial_table() {
    if !root_or_skip("readers_never_see_a_partial_table") {
        return;
    }
    let t = TestNs::new("fw");
    install_firewall(&t.ns, &cfg()).await.unwrap();
    let ns = t.ns.clone();
    let writer = tokio::spawn(async move {
        for _ in 0..40 {
            install_firewall(&ns, &cfg()).await.unwrap();
        }
    });
    let name = t.name.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let mut seen = 0;
        for _ in 0..40 {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &name, "nft", "-j", "list", "table", "ip", TABLE])
                .output()
                .unwrap();
            assert!(out.status.success(), "table missing mid-replace: {}", String::from_utf8_lossy(&out.stderr));
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            let n = v["nftables"].as_array().unwrap().iter().filter(|o| o.get("rule").is_some()).count();
            assert_eq!(n, 6, "partial table seen");
            seen += 1;
        }
        seen
    });
    writer.await.unwrap();
    assert_eq!(reader.await.unwrap(), 40);
}

#[tokio::test]
async fn remove_is_idempotent_and_leaves_others() {
    if !root_or_skip("remove_is_idempotent_and_leaves_others") {
        return;
    }
    let t = TestNs::new("fw");
    t.exec(&["nft", "add", "table", "ip", "other"]);
    remove_firewall(&t.ns, TABLE).await.unwrap();
    install_firewall(&t.ns, &cfg()).await.unwrap();
    remove_firewall(&t.ns, TABLE).await.unwrap();
    assert!(list(&t, TABLE).is_none());
    remove_firewall(&t.ns, TABLE).await.unwrap();
    assert!(list(&t, "other").is_some());
}

#[tokio::test]
async fn table_name_is_a_parameter() {
    if !root_or_skip("table_name_is_a_parameter") {
        return;
    }
    let t = TestNs::new("fw");
    let mut c = cfg();
    c.table = "sdn-node-test".into();
    install_firewall(&t.ns, &c).await.unwrap();
    assert!(list(&t, "sdn-node-test").is_some());
    assert!(list(&t, TABLE).is_none());
    assert!(install_firewall(&t.ns, &FirewallConfig { table: String::new(), ..cfg() }).await.is_err());
}
