//! The nftables table, checked with `nft -j list table` in a throwaway namespace.

mod common;

use common::{root_or_skip, TestNs};
use hostnet::{install_firewall, remove_firewall, Error, FirewallConfig, FirewallIpv4, FirewallIpv6};
use serde_json::{json, Value};

const TABLE: &str = "sdn-node";

fn cfg() -> FirewallConfig {
    FirewallConfig::new("10.128.0.0/14".parse().unwrap(), "172.30.0.0/16".parse().unwrap())
}

/// The objects of `nft -j list table ip TABLE`, or None if the table does not exist.
fn list(t: &TestNs, table: &str) -> Option<Vec<Value>> {
    list_family(t, "ip", table)
}

/// The objects of `nft -j list table FAMILY TABLE`, or None if the table does not exist.
fn list_family(t: &TestNs, family: &str, table: &str) -> Option<Vec<Value>> {
    if !t.exec_ok(&["nft", "list", "table", family, table]) {
        return None;
    }
    let out = t.exec(&["nft", "-j", "list", "table", family, table]);
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

fn prefix_of(proto: &str, field: &str, op: &str, addr: &str, len: u32) -> Value {
    json!({"match": {"left": {"payload": {"field": field, "protocol": proto}}, "op": op,
                     "right": {"prefix": {"addr": addr, "len": len}}}})
}

/// The rules; `within`: traffic inside the cluster network is masqueraded too.
fn expected_rules(cn: &str, len: u32, port: u16, tun: &str, within: bool) -> Vec<(String, Value)> {
    expected_rules_of("ip", cn, len, port, tun, within)
}

/// The rules of the table of family `proto` (`ip`, `ip6`).
fn expected_rules_of(proto: &str, cn: &str, len: u32, port: u16, tun: &str, within: bool) -> Vec<(String, Value)> {
    let prefix = |field: &str, op: &str, addr: &str, len: u32| prefix_of(proto, field, op, addr, len);
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

/// Another process (`nft -i`, which keeps its netlink socket while it runs) owning table
/// `family TABLE` in `t`: our batch may not touch it. Close its stdin and wait to release it.
fn owned_table(t: &TestNs, family: &str) -> std::process::Child {
    let mut owner = std::process::Command::new("ip")
        .args(["netns", "exec", &t.name, "nft", "-i"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let stdin = owner.stdin.as_mut().unwrap();
        writeln!(stdin, "add table {family} {TABLE} {{ flags owner; }}").unwrap();
        stdin.flush().unwrap();
    }
    for _ in 0..100 {
        if t.exec_ok(&["nft", "list", "table", family, TABLE]) {
            return owner;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = owner.kill();
    let _ = owner.wait();
    panic!("nft -i did not make its table {family} {TABLE}");
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

fn dual() -> FirewallConfig {
    FirewallConfig {
        ipv6: Some(FirewallIpv6 {
            cluster_network: "fd00:10:128::/48".parse().unwrap(),
            service_network: "fd00:172:30::/112".parse().unwrap(),
        }),
        ..cfg()
    }
}

/// (name, hook, type, prio, policy) of each chain, sorted by name.
fn chains(objs: &[Value]) -> Vec<(Value, Value, Value, Value, Value)> {
    let mut chains: Vec<_> = of_kind(objs, "chain")
        .into_iter()
        .map(|c| (c["name"].clone(), c["hook"].clone(), c["type"].clone(), c["prio"].clone(), c["policy"].clone()))
        .collect();
    chains.sort_by_key(|c| c.0.to_string());
    chains
}

#[tokio::test]
async fn dual_stack_installs_the_same_rules_in_an_ip6_table() {
    if !root_or_skip("dual_stack_installs_the_same_rules_in_an_ip6_table") {
        return;
    }
    let t = TestNs::new("fw");
    install_firewall(&t.ns, &cfg()).await.unwrap();
    let v4_only = list(&t, TABLE).unwrap();
    assert!(list_family(&t, "ip6", TABLE).is_none(), "no ip6 table without IPv6");

    install_firewall(&t.ns, &dual()).await.unwrap();
    let v4 = list(&t, TABLE).unwrap();
    assert_eq!(rules(&v4), rules(&v4_only), "the IPv4 table does not change with IPv6");
    assert_eq!(chains(&v4), chains(&v4_only));
    let v6 = list_family(&t, "ip6", TABLE).expect("ip6 table");
    assert_eq!(chains(&v6), chains(&v4));
    assert_eq!(rules(&v6), expected_rules_of("ip6", "fd00:10:128::", 48, 4789, "tun0", true));

    let mut keep = dual();
    keep.masquerade_within_cluster = false;
    install_firewall(&t.ns, &keep).await.unwrap();
    assert_eq!(rules(&list_family(&t, "ip6", TABLE).unwrap()), expected_rules_of("ip6", "fd00:10:128::", 48, 4789, "tun0", false));
    assert_eq!(rules(&list(&t, TABLE).unwrap()), expected_rules("10.128.0.0", 14, 4789, "tun0", false));

    // Back to IPv4 only: the ip6 table goes, in the same batch.
    install_firewall(&t.ns, &cfg()).await.unwrap();
    assert!(list_family(&t, "ip6", TABLE).is_none(), "ip6 table left behind");
    assert_eq!(rules(&list(&t, TABLE).unwrap()), expected_rules("10.128.0.0", 14, 4789, "tun0", true));

    install_firewall(&t.ns, &dual()).await.unwrap();
    remove_firewall(&t.ns, TABLE).await.unwrap();
    assert!(list(&t, TABLE).is_none() && list_family(&t, "ip6", TABLE).is_none());
}

/// One transaction for both families: when the kernel refuses the IPv6 part (here: an ip6
/// table of that name owned by another process, NFT_TABLE_F_OWNER), the IPv4 table is still
/// the previous one.
#[tokio::test]
async fn a_refused_ipv6_part_leaves_the_previous_rules() {
    if !root_or_skip("a_refused_ipv6_part_leaves_the_previous_rules") {
        return;
    }
    let t = TestNs::new("fw");
    install_firewall(&t.ns, &cfg()).await.unwrap();
    let before = list(&t, TABLE).unwrap();

    // `nft -i` keeps its netlink socket, and so its owned table, while it runs.
    let mut owner = owned_table(&t, "ip6");

    let mut changed = dual();
    changed.ipv4 = Some(FirewallIpv4 {
        cluster_network: "10.0.0.0/16".parse().unwrap(),
        service_network: "172.30.0.0/16".parse().unwrap(),
    });
    let e = install_firewall(&t.ns, &changed).await.unwrap_err();
    eprintln!("refused batch as reported: {e}");
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("ip6"), "the error names the ip6 table: {e}");
    assert_eq!(list(&t, TABLE).unwrap(), before, "the IPv4 table changed although the batch failed");

    drop(owner.stdin.take());
    owner.wait().unwrap();
    install_firewall(&t.ns, &changed).await.unwrap();
    assert_eq!(rules(&list(&t, TABLE).unwrap()), expected_rules("10.0.0.0", 16, 4789, "tun0", true));
}

fn v6() -> FirewallIpv6 {
    FirewallIpv6 {
        cluster_network: "fd00:10:128::/48".parse().unwrap(),
        service_network: "fd00:172:30::/112".parse().unwrap(),
    }
}

#[tokio::test]
async fn ipv6_only_installs_the_ip6_table_and_no_ip_one() {
    if !root_or_skip("ipv6_only_installs_the_ip6_table_and_no_ip_one") {
        return;
    }
    let t = TestNs::new("fw");
    install_firewall(&t.ns, &FirewallConfig::ipv6_only(v6())).await.unwrap();
    assert!(list(&t, TABLE).is_none(), "an ip table for an IPv6-only cluster");
    let objs = list_family(&t, "ip6", TABLE).expect("ip6 table");
    assert_eq!(
        chains(&objs),
        vec![
            (json!("forward"), json!("forward"), json!("filter"), json!(0), json!("accept")),
            (json!("input"), json!("input"), json!("filter"), json!(0), json!("accept")),
            (json!("postrouting"), json!("postrouting"), json!("nat"), json!(100), json!("accept")),
        ]
    );
    assert_eq!(rules(&objs), expected_rules_of("ip6", "fd00:10:128::", 48, 4789, "tun0", true));
    // Idempotent, and the parameters are the usual ones.
    let keep = FirewallConfig { masquerade_within_cluster: false, vxlan_port: 8472, ..FirewallConfig::ipv6_only(v6()) };
    install_firewall(&t.ns, &keep).await.unwrap();
    install_firewall(&t.ns, &keep).await.unwrap();
    assert_eq!(rules(&list_family(&t, "ip6", TABLE).unwrap()), expected_rules_of("ip6", "fd00:10:128::", 48, 8472, "tun0", false));
    assert!(list(&t, TABLE).is_none());
    // Neither family is refused (removal is remove_firewall's), touching nothing.
    let e = install_firewall(&t.ns, &FirewallConfig { ipv6: None, ..keep }).await.unwrap_err();
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    assert!(list_family(&t, "ip6", TABLE).is_some());
    remove_firewall(&t.ns, TABLE).await.unwrap();
    assert!(list_family(&t, "ip6", TABLE).is_none());
}

#[tokio::test]
async fn ipv4_to_ipv6_only_and_back_swaps_the_tables() {
    if !root_or_skip("ipv4_to_ipv6_only_and_back_swaps_the_tables") {
        return;
    }
    let t = TestNs::new("fw");
    t.exec(&["nft", "add", "table", "ip", "other"]);
    install_firewall(&t.ns, &cfg()).await.unwrap();
    install_firewall(&t.ns, &FirewallConfig::ipv6_only(v6())).await.unwrap();
    assert!(list(&t, TABLE).is_none(), "the ip table of the IPv4 configuration is left behind");
    assert_eq!(rules(&list_family(&t, "ip6", TABLE).unwrap()), expected_rules_of("ip6", "fd00:10:128::", 48, 4789, "tun0", true));
    assert!(list(&t, "other").is_some(), "foreign table removed");
    // Dual-stack to IPv6-only the same.
    install_firewall(&t.ns, &dual()).await.unwrap();
    assert!(list(&t, TABLE).is_some());
    install_firewall(&t.ns, &FirewallConfig::ipv6_only(v6())).await.unwrap();
    assert!(list(&t, TABLE).is_none(), "the ip table of the dual-stack configuration is left behind");
    // And back to IPv4 only: the ip6 table goes.
    install_firewall(&t.ns, &cfg()).await.unwrap();
    assert!(list_family(&t, "ip6", TABLE).is_none(), "ip6 table left behind");
    assert_eq!(rules(&list(&t, TABLE).unwrap()), expected_rules("10.128.0.0", 14, 4789, "tun0", true));
}

/// The ip and ip6 tables of ours `nft list tables` shows (one dump: one generation).
fn our_tables(name: &str) -> Vec<String> {
    let out = std::process::Command::new("ip").args(["netns", "exec", name, "nft", "-j", "list", "tables"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut t: Vec<String> = of_kind(v["nftables"].as_array().unwrap(), "table")
        .into_iter()
        .filter(|t| t["name"] == TABLE)
        .map(|t| t["family"].as_str().unwrap().to_string())
        .collect();
    t.sort();
    t
}

/// Switching between IPv4 only and IPv6 only is one transaction: a reader sees exactly one of
/// the two tables, never both nor none.
#[tokio::test]
async fn readers_see_one_family_table_while_switching() {
    if !root_or_skip("readers_see_one_family_table_while_switching") {
        return;
    }
    let t = TestNs::new("fw");
    install_firewall(&t.ns, &cfg()).await.unwrap();
    let ns = t.ns.clone();
    let writer = tokio::spawn(async move {
        for i in 0..40 {
            let c = if i % 2 == 0 { FirewallConfig::ipv6_only(v6()) } else { cfg() };
            install_firewall(&ns, &c).await.unwrap();
        }
    });
    let name = t.name.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let mut seen = [0usize; 2];
        for _ in 0..60 {
            let tables = our_tables(&name);
            match tables.as_slice() {
                [f] if f == "ip" => seen[0] += 1,
                [f] if f == "ip6" => seen[1] += 1,
                other => panic!("tables mid-switch: {other:?}"),
            }
        }
        seen
    });
    writer.await.unwrap();
    let seen = reader.await.unwrap();
    eprintln!("reader saw ip {} times, ip6 {} times", seen[0], seen[1]);
    assert_eq!(our_tables(&t.name), ["ip"]);
}

/// When the kernel refuses the removal of the ip table (another process owns an `ip` table of
/// that name, NFT_TABLE_F_OWNER), the IPv6-only install fails whole: no ip6 table appears.
#[tokio::test]
async fn a_refused_ip_removal_leaves_no_ip6_table() {
    if !root_or_skip("a_refused_ip_removal_leaves_no_ip6_table") {
        return;
    }
    let t = TestNs::new("fw");
    let mut owner = owned_table(&t, "ip");

    let e = install_firewall(&t.ns, &FirewallConfig::ipv6_only(v6())).await.unwrap_err();
    eprintln!("refused batch as reported: {e}");
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("table ip "), "the error names the ip table: {e}");
    assert!(list_family(&t, "ip6", TABLE).is_none(), "the ip6 table was made although the batch failed");

    drop(owner.stdin.take());
    owner.wait().unwrap();
    install_firewall(&t.ns, &FirewallConfig::ipv6_only(v6())).await.unwrap();
    assert_eq!(our_tables(&t.name), ["ip6"]);
}
