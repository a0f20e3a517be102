//! The agent's checkpoint of its pods (issue 20 item 3; issue 21 item 7): CNI pods outlive the
//! loss of the Open vSwitch database, a pod whose sandbox vanished meanwhile is collected, no
//! address a live sandbox holds is handed out again (nor a just-released one, the allocator's
//! position being kept too), and a checkpoint that cannot be read stops the agent with a clear
//! error and nothing torn down. One file per pod (issue 35 item 5): a damaged one is named and
//! refused, an earlier agent's single `pods.json` is migrated, and the temporary files of writes
//! a crash interrupted are removed at start. A real agent (`sdn-node run`) on a netdev switch in its own
//! network namespace, every pod request through libcni and `sdn-node-cni`, real pings.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use support::agent::{vsctl, vsctl_status};
use support::cninode::*;

/// What a pod leaves on a node, as the oracles (`ip`, `ovs-vsctl`, `ovs-ofctl`) see it.
#[derive(Debug, PartialEq, Eq)]
struct Node {
    veths: Vec<String>,
    ports: Vec<String>,
    flows: Vec<String>,
}

fn look(n: &CniNode) -> Node {
    Node { veths: n.veths(), ports: n.ports(), flows: n.flows() }
}

/// Polls (bounded: 30 s) until `f` holds.
async fn eventually(what: &str, n: &CniNode, mut f: impl FnMut() -> bool) {
    for _ in 0..300 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never: {what}\n{}", n.log());
}

/// The pods the checkpoint lists, by name, with their addresses.
fn checkpointed(n: &CniNode) -> BTreeMap<String, String> {
    n.agent
        .checkpointed()
        .into_iter()
        .map(|(file, p)| {
            let (ns, name) = (p["namespace"].as_str().unwrap(), p["name"].as_str().unwrap());
            assert_eq!(file, format!("{ns}_{name}.json"), "each pod in its own file");
            (name.to_string(), p["ip"].as_str().unwrap().to_string())
        })
        .collect()
}

/// A pod's file in the checkpoint.
fn pod_file(n: &CniNode, ns: &str, name: &str) -> std::path::PathBuf {
    n.agent.checkpoint_pods().join(format!("{ns}_{name}.json"))
}

/// The checkpoint's file of IPAM's position.
fn ipam_file(n: &CniNode) -> std::path::PathBuf {
    n.agent.state_dir.join("ipam.json")
}

/// The names in `dir` (sorted).
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn port_record(n: &CniNode, port: &str) -> String {
    vsctl(&n.sb, &["--no-wait", "get", "Port", port, "external_ids:sdn-node-pod"])
}

/// Four pods up (and a fifth whose sandbox is deleted while the agent is down); the agent
/// SIGKILLed; ovs-vswitchd and ovsdb-server stopped and `conf.db` recreated empty; everything
/// started again. Every surviving pod is back with its address, MAC, port record and
/// isolation; the fifth is collected; a new pod gets an address none of them has and not the
/// one just released.
#[tokio::test]
async fn pods_outlive_the_database_and_a_vanished_sandbox_is_collected() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start(MULTITENANT).await;
    let pods = [("team-a", "a1"), ("team-a", "a2"), ("team-b", "b1"), ("default", "d1"), ("team-a", "gone")];
    let mut ns = Vec::new();
    let mut addr = BTreeMap::new();
    let mut mac = BTreeMap::new();
    for (i, (pod_ns, name)) in pods.iter().enumerate() {
        let p = PodNs::new(name);
        let r = node.cni("add", pod_ns, name, &container(i as u32 + 1), &p.path());
        assert!(r.ok(), "ADD {pod_ns}/{name}: {:?}\n{}", r.out, node.log());
        addr.insert(*name, r.addr());
        mac.insert(*name, r.out["result100"]["interfaces"][1]["mac"].as_str().unwrap_or_default().to_string());
        ns.push(p);
    }
    // Answered only once recorded: the checkpoint lists every pod with its address.
    let listed = checkpointed(&node);
    assert_eq!(listed, addr.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(), "the checkpoint after the ADDs");
    assert!(ping(&ns[0].name, &addr["a2"]), "a1 reaches a2 before");
    let veth_of: BTreeMap<&str, String> = pods
        .iter()
        .enumerate()
        .map(|(i, (_, name))| (*name, sdn_node::pod::cni::host_veth_name(&container(i as u32 + 1))))
        .collect();
    let records_before: BTreeMap<&str, String> = veth_of.iter().map(|(n, v)| (*n, port_record(&node, v))).collect();

    node.kill_agent().await;
    node.sb.recreate_database().await.expect("recreate conf.db");
    let (ok, _, err) = vsctl_status(&node.sb, &["--no-wait", "list-ports", "br0"]);
    assert!(!ok && err.contains("no bridge"), "the database lost everything: {err}");
    // The fifth pod's sandbox goes while the agent is down (its runtime's DEL never arrived).
    let gone = ns.pop().unwrap();
    drop(gone);
    eventually("the vanished sandbox's veth is gone with it", &node, || !node.veths().contains(&veth_of["gone"])).await;

    node.spawn_agent().await;
    let survivors = ["a1", "a2", "b1", "d1"];
    eventually("every surviving pod's port is back", &node, || {
        let ports = node.ports();
        survivors.iter().all(|p| ports.contains(&veth_of[p]))
    })
    .await;
    assert!(!node.ports().contains(&veth_of["gone"]), "no port for the collected pod");
    for p in survivors {
        // The record on the port is back, as the ADD wrote it.
        assert_eq!(port_record(&node, &veth_of[p]), records_before[p], "{p}'s port record");
        let (_, link) =
            in_ns(&ns[survivors.iter().position(|s| *s == p).unwrap()].name, &["ip", "-o", "addr", "show", "eth0"]);
        assert!(link.contains(&format!("{}/23", addr[p])), "{p} keeps its address: {link}");
    }
    // Traffic and isolation, as before the loss.
    eventually("a1 reaches a2 again", &node, || ping(&ns[0].name, &addr["a2"])).await;
    assert!(!ping(&ns[0].name, &addr["b1"]), "another VNID still does not");
    assert!(ping(&ns[3].name, &addr["b1"]), "VNID 0 still reaches every VNID");
    // CHECK agrees: flows on the switch, the interface as the ADD made it (MAC included).
    for (i, p) in survivors.iter().enumerate() {
        let r = node.cni("check", pods[i].0, p, &container(i as u32 + 1), &ns[i].path());
        assert!(r.ok(), "CHECK {p} after the recovery: {:?}\n{}", r.out, node.log());
        let (_, link) = in_ns(&ns[i].name, &["ip", "-o", "link", "show", "eth0"]);
        assert!(link.contains(&mac[p]), "{p}'s MAC: {link}");
    }
    // The collected pod left the checkpoint, the others are there.
    eventually("the checkpoint forgets the collected pod", &node, || !checkpointed(&node).contains_key("gone")).await;
    assert_eq!(checkpointed(&node).keys().cloned().collect::<Vec<_>>(), vec!["a1", "a2", "b1", "d1"]);
    // A new pod: an address no live pod has, and not the one just released either (IPAM's
    // position came back with the checkpoint; without it the search would start over at the
    // subnet's start and find the released address first).
    let n1 = PodNs::new("n1");
    let r = node.cni("add", "team-a", "n1", &container(9), &n1.path());
    assert!(r.ok(), "ADD n1: {:?}\n{}", r.out, node.log());
    let taken: BTreeSet<&String> = survivors.iter().map(|p| &addr[p]).collect();
    assert!(!taken.contains(&r.addr()), "n1 got {} which a live pod holds ({taken:?})", r.addr());
    assert_ne!(r.addr(), addr["gone"], "the just-released address is not handed out at once");
    assert!(ping(&n1.name, &addr["a1"]), "the new pod reaches a1");
    // Everything DELs cleanly.
    let r = node.cni("del", "team-a", "n1", &container(9), &n1.path());
    assert!(r.ok(), "{:?}", r.out);
    for (i, p) in survivors.iter().enumerate() {
        let r = node.cni("del", pods[i].0, p, &container(i as u32 + 1), &ns[i].path());
        assert!(r.ok(), "DEL {p}: {:?}", r.out);
    }
    assert!(checkpointed(&node).is_empty(), "answered DELs are off the checkpoint");
    eventually("nothing of the pods is left", &node, || {
        let n = look(&node);
        n.veths.is_empty() && n.ports.iter().all(|p| !p.starts_with("veth"))
    })
    .await;
    node.ready_again("after the pods outlived the database and were deleted").await;
}

/// A checkpoint that cannot be read: the agent exits non-zero with an error naming the file
/// and what is wrong, and changes nothing (no port, flow or interface of the pods goes; they
/// keep talking). With the file back, the agent starts and has the pods.
#[tokio::test]
async fn a_corrupt_checkpoint_stops_the_agent_and_changes_nothing() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start(MULTITENANT).await;
    let a1 = PodNs::new("a1");
    let a2 = PodNs::new("a2");
    let r1 = node.cni("add", "team-a", "a1", &container(1), &a1.path());
    let r2 = node.cni("add", "team-a", "a2", &container(2), &a2.path());
    assert!(r1.ok() && r2.ok(), "{:?} {:?}\n{}", r1.out, r2.out, node.log());
    node.kill_agent().await;
    // One pod's file damaged: the agent refuses to start, naming it.
    let path = pod_file(&node, "team-a", "a1");
    let good = std::fs::read_to_string(&path).unwrap();
    let before = look(&node);
    assert!(before.ports.len() >= 4, "{before:?}");
    let half = good[..good.len() / 2].to_string();
    let flipped = good.replacen(&format!("\"ip\":\"{}\"", r1.addr()), &format!("\"ip\":\"{}\"", bump(&r1.addr())), 1);
    assert_ne!(flipped, good, "one address changed");
    let cases = [
        (half, "not a checkpoint document"),
        (String::new(), "the file is empty"),
        (flipped, "does not match its checksum"),
        (good.replacen("\"version\":1", "\"version\":7", 1), "written by a newer sdn-node"),
    ];
    for (text, why) in cases {
        std::fs::write(&path, &text).unwrap();
        let (code, log) = node.agent.run_to_exit().await;
        assert_eq!(code, Some(1), "the agent refuses to start on a bad checkpoint ({why}):\n{log}");
        let err = log.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line:\n{log}"));
        assert!(err.contains(&path.display().to_string()) && err.contains("is corrupt") && err.contains(why), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "the file is left as it was");
        assert_eq!(look(&node), before, "nothing was torn down ({why})");
        assert!(!node.agent.conflist().exists(), "and it never said it serves pods");
    }
    // IPAM's file too.
    std::fs::write(&path, &good).unwrap();
    let ipam = ipam_file(&node);
    let ipam_good = std::fs::read_to_string(&ipam).unwrap();
    std::fs::write(&ipam, "garbage").unwrap();
    let (code, log) = node.agent.run_to_exit().await;
    assert_eq!(code, Some(1), "refused on a damaged ipam.json:\n{log}");
    let err = log.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line:\n{log}"));
    assert!(err.contains(&ipam.display().to_string()) && err.contains("not a checkpoint document"), "{err}");
    assert_eq!(look(&node), before, "nothing was torn down (ipam.json)");
    assert!(ping(&a1.name, &r2.addr()), "the pods kept talking throughout (flows stay while the agent is down)");
    // The good files back, and what writes a crash interrupted leave (temporary files): the
    // agent removes those, starts, and has both pods.
    std::fs::write(&ipam, &ipam_good).unwrap();
    let leftovers = [
        node.agent.checkpoint_pods().join(".team-a_a1.json.x1Y2z3"),
        node.agent.checkpoint_pods().join(".team-a_a9.json.q8R7s6"),
        node.agent.state_dir.join(".ipam.json.k5L4m3"),
    ];
    for l in &leftovers {
        std::fs::write(l, &good[..good.len() / 3]).unwrap();
    }
    node.spawn_agent().await;
    for l in &leftovers {
        assert!(!l.exists(), "{} removed at start", l.display());
    }
    assert_eq!(names(&node.agent.checkpoint_pods()), vec!["team-a_a1.json", "team-a_a2.json"]);
    for (p, c, n) in [("a1", container(1), &a1), ("a2", container(2), &a2)] {
        let check = node.cni("check", "team-a", p, &c, &n.path());
        assert!(check.ok(), "CHECK {p}: {:?}\n{}", check.out, node.log());
    }
    assert!(ping(&a1.name, &r2.addr()));
    node.ready_again("restarted with the good checkpoint back").await;
}

/// The next address after `ip` (a.b.c.d → a.b.c.d+1).
fn bump(ip: &str) -> String {
    let a: std::net::Ipv4Addr = ip.parse().unwrap();
    std::net::Ipv4Addr::from(u32::from(a) + 1).to_string()
}

/// An ADD whose checkpoint cannot be written fails, and nothing of it remains (its flows,
/// port and interface are undone); with the directory writable again the same ADD succeeds.
#[tokio::test]
async fn an_add_that_cannot_be_recorded_fails_and_leaves_nothing() {
    if !can_run() {
        return;
    }
    let node = CniNode::start(MULTITENANT).await;
    let a1 = PodNs::new("a1");
    let r = node.cni("add", "team-a", "a1", &container(1), &a1.path());
    assert!(r.ok(), "{:?}", r.out);
    let before = look(&node);
    // The state directory replaced by a file: no temporary file can be made in it (root
    // ignores permissions, so they would not do).
    let dir = node.agent.state_dir.clone();
    let away = dir.with_extension("away");
    std::fs::rename(&dir, &away).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    let a2 = PodNs::new("a2");
    let r = node.cni("add", "team-a", "a2", &container(2), &a2.path());
    assert!(!r.ok(), "the ADD fails: {:?}", r.out);
    assert!(r.out.to_string().contains("checkpoint"), "and says why: {:?}", r.out);
    eventually("nothing of the failed ADD remains", &node, || look(&node) == before).await;
    let (_, links) = in_ns(&a2.name, &["ip", "-o", "link"]);
    assert!(!links.contains("eth0"), "no interface left in the sandbox: {links}");
    std::fs::remove_file(&dir).unwrap();
    std::fs::rename(&away, &dir).unwrap();
    let r = node.cni("add", "team-a", "a2", &container(2), &a2.path());
    assert!(r.ok(), "the retry succeeds: {:?}\n{}", r.out, node.log());
    assert!(checkpointed(&node).contains_key("a2"));
    assert!(ping(&a1.name, &r.addr()));
    node.ready_again("after the failed ADD and its retry").await;
}

/// A corrupt checkpoint moved aside (as the agent's error says to): the pods come back from
/// OVSDB's records alone, and IPAM resumes after the highest address they hold rather than
/// at the subnet's bottom, so a just-released address is not handed out first (issue 32
/// item 8).
#[tokio::test]
async fn after_a_checkpoint_is_moved_aside_a_released_address_is_not_reused_first() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start(MULTITENANT).await;
    let ns: Vec<PodNs> = ["a1", "a2", "a3"].iter().map(|n| PodNs::new(n)).collect();
    let mut addr = Vec::new();
    for (i, name) in ["a1", "a2", "a3"].iter().enumerate() {
        let r = node.cni("add", "team-a", name, &container(i as u32 + 1), &ns[i].path());
        assert!(r.ok(), "ADD {name}: {:?}\n{}", r.out, node.log());
        addr.push(r.addr());
    }
    // The lowest address is released.
    let r = node.cni("del", "team-a", "a1", &container(1), &ns[0].path());
    assert!(r.ok(), "DEL a1: {:?}", r.out);
    node.kill_agent().await;
    // IPAM's file damaged, then moved aside: its position is lost (the pods' files are kept).
    let path = ipam_file(&node);
    std::fs::write(&path, b"{ not json").unwrap();
    let (code, log) = node.agent.run_to_exit().await;
    assert_eq!(code, Some(1), "refused on the corrupt checkpoint:\n{log}");
    std::fs::rename(&path, path.with_extension("corrupt")).unwrap();
    node.spawn_agent().await;
    for (i, p) in [(1usize, "a2"), (2, "a3")] {
        let check = node.cni("check", "team-a", p, &container(i as u32 + 1), &ns[i].path());
        assert!(check.ok(), "CHECK {p}: {:?}\n{}", check.out, node.log());
    }
    let n1 = PodNs::new("n1");
    let r = node.cni("add", "team-a", "n1", &container(9), &n1.path());
    assert!(r.ok(), "ADD n1: {:?}\n{}", r.out, node.log());
    assert_ne!(r.addr(), addr[0], "the address a1 just released is not handed out first");
    assert_eq!(r.addr(), bump(&addr[2]), "IPAM resumes after the highest recovered address ({addr:?})");
    assert!(ping(&n1.name, &addr[1]), "the new pod reaches a2");
    node.ready_again("restarted without a checkpoint").await;
}

/// The single `pods.json` earlier agents wrote: a new agent reads it, writes one file per pod
/// (and IPAM's), and removes it once those are durable. Here it is all the agent has (the
/// database recreated empty): every pod comes back from it, with IPAM's position (the next
/// address follows the last one handed out, not the highest one held). What an earlier agent's
/// interrupted write left is removed.
#[tokio::test]
async fn an_earlier_agents_pods_json_is_migrated() {
    if !can_run() {
        return;
    }
    let mut node = CniNode::start(MULTITENANT).await;
    let ns: Vec<PodNs> = ["a1", "a2", "a3"].iter().map(|n| PodNs::new(n)).collect();
    let mut addr = Vec::new();
    for (i, name) in ["a1", "a2", "a3"].iter().enumerate() {
        let r = node.cni("add", "team-a", name, &container(i as u32 + 1), &ns[i].path());
        assert!(r.ok(), "ADD {name}: {:?}\n{}", r.out, node.log());
        addr.push(r.addr());
    }
    // The last address handed out is released: only IPAM's position remembers it.
    let r = node.cni("del", "team-a", "a3", &container(3), &ns[2].path());
    assert!(r.ok(), "DEL a3: {:?}", r.out);
    node.kill_agent().await;
    // The state directory as an earlier agent left it: pods.json (built here from the
    // records, as that agent wrote it: {"version":1,"sha256":<of state>,"state":{...}}), and
    // the temporary file of a write it never finished.
    let records: Vec<serde_json::Value> = node.agent.checkpointed().into_values().collect();
    assert_eq!(records.len(), 2);
    let ipam: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(ipam_file(&node)).unwrap()).unwrap();
    let last = ipam["state"]["lastAddress"].clone();
    assert_eq!(last, addr[2], "IPAM's position is a3's address");
    let state = serde_json::json!({ "lastAddress": last, "pods": records }).to_string();
    let digest: String =
        ring::digest::digest(&ring::digest::SHA256, state.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let legacy = node.agent.state_dir.join("pods.json");
    std::fs::write(&legacy, format!("{{\"version\":1,\"sha256\":\"{digest}\",\"state\":{state}}}\n")).unwrap();
    std::fs::remove_dir_all(node.agent.checkpoint_pods()).unwrap();
    std::fs::remove_file(ipam_file(&node)).unwrap();
    let leftover = node.agent.state_dir.join(".pods.json.Ab12Cd");
    std::fs::write(&leftover, "{\"version\":1,\"sha").unwrap();
    node.sb.recreate_database().await.expect("recreate conf.db");

    node.spawn_agent().await;
    assert!(!legacy.exists() && !leftover.exists(), "pods.json migrated away, the leftover removed");
    assert_eq!(names(&node.agent.state_dir), vec!["ipam.json", "lock", "pods"]);
    let migrated: Vec<serde_json::Value> = node.agent.checkpointed().into_values().collect();
    assert_eq!(migrated, records, "each pod's record, in its own file, as pods.json had it");
    for (i, p) in [(0usize, "a1"), (1, "a2")] {
        eventually(&format!("{p} is back from the migrated checkpoint"), &node, || {
            node.cni("check", "team-a", p, &container(i as u32 + 1), &ns[i].path()).ok()
        })
        .await;
    }
    assert!(ping(&ns[0].name, &addr[1]), "a1 reaches a2");
    let n1 = PodNs::new("n1");
    let r = node.cni("add", "team-a", "n1", &container(9), &n1.path());
    assert!(r.ok(), "ADD n1: {:?}\n{}", r.out, node.log());
    assert_eq!(r.addr(), bump(&addr[2]), "IPAM resumes after the position pods.json kept ({addr:?})");
    assert_eq!(checkpointed(&node).len(), 3);
    node.ready_again("after the migration").await;
}
