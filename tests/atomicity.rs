//! An egress-policy swap is never seen half-done.
//!
//! A namespace's EgressNetworkPolicy of 1000 rules is swapped back and forth between two
//! variants through the agent's own path ([`converge`]: dump, diff, one atomic bundle of ~2000
//! FLOW_MODs, verify) while the test keeps dumping table 100 on other connections, with our own
//! client and with `ovs-ofctl`. Every dump must be exactly one variant's rule set: never a mix,
//! never a rule missing.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openflow::{FlowStats, FlowStatsRequest, Instruction};
use sdn_node::apply::{converge, ApplyOptions};
use sdn_node::cluster::desired::desired_state;
use sdn_node::cluster::{state_file, ClusterState};
use sdn_node::pipeline::egress::DnsAnswers;
use sdn_node::pipeline::{FlowKey, Table};
use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};
use sdn_node::switch::{Switch, SwitchOptions};

/// Rules per policy: `ALLOWS` Allow cidrSelectors, then Deny 0.0.0.0/0.
const ALLOWS: usize = 999;
/// The dumper takes at least this many dumps with each oracle...
const MIN_DUMPS: usize = 30;
/// ...while the swapper does at least this many swaps.
const MIN_SWAPS: usize = 20;
/// Hard bounds, whatever happens.
const MAX_DUMPS: usize = 2000;
const MAX_SWAPS: usize = 200;
/// Bound for every single wait (a converge, a dump, an ovs-ofctl run).
const T: Duration = Duration::from_secs(60);

/// The state with team-a's policy allowing `first_octet.x.y.0/24` for 999 (x, y), then denying
/// everything.
fn state(first_octet: u8) -> ClusterState {
    let mut yaml = String::from(
        "node: node-a\n\
         plugin: multitenant\n\
         clusterNetwork: 10.128.0.0/14\n\
         serviceNetwork: 172.30.0.0/16\n\
         hostSubnets:\n\
         \x20 - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}\n\
         \x20 - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}\n\
         netNamespaces:\n\
         \x20 - {name: default, netid: 0}\n\
         \x20 - {name: team-a, netid: 11}\n\
         egressNetworkPolicies:\n\
         \x20 - namespace: team-a\n\
         \x20   name: default\n\
         \x20   egress:\n",
    );
    for i in 0..ALLOWS {
        yaml.push_str(&format!("      - {{type: Allow, to: {{cidrSelector: {first_octet}.{}.{}.0/24}}}}\n", i / 256, i % 256));
    }
    yaml.push_str("      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}\n");
    let (s, problems) = state_file::parse(&yaml).expect("state parses");
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(s.egress_policies[0].rules.len(), ALLOWS + 1);
    s
}

/// A flow as our typed dump gives it: compared by identity in OVS (table, priority, match)
/// and instructions, printed as `dump-flows` prints it.
#[derive(Clone)]
struct Typed {
    key: FlowKey,
    instructions: Vec<Instruction>,
    text: String,
}

impl PartialEq for Typed {
    fn eq(&self, o: &Typed) -> bool {
        (&self.key, &self.instructions) == (&o.key, &o.instructions)
    }
}

impl Eq for Typed {}

impl std::hash::Hash for Typed {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (&self.key, &self.instructions).hash(h)
    }
}

impl std::fmt::Debug for Typed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// One variant's table 100, in both forms the two oracles give.
struct Variant {
    name: &'static str,
    /// For our typed dump.
    flows: HashSet<Typed>,
    /// `dump-flows --no-stats` lines without the cookie, for ovs-ofctl's.
    text: HashSet<String>,
}

impl Variant {
    fn of(name: &'static str, s: &ClusterState) -> Variant {
        let (d, problems) = desired_state(s, &HashMap::new(), &DnsAnswers::new());
        assert!(problems.is_empty(), "{problems:?}");
        let t100: Vec<openflow::FlowMod> = d
            .iter()
            .map(|(_, f)| f)
            .filter(|f| f.key.table == Table::EgressPolicy.id())
            .map(|f| f.to_flow_mod(0).unwrap())
            .collect();
        // The policy's rules and SetupOVS's default.
        assert_eq!(t100.len(), ALLOWS + 2);
        Variant {
            name,
            flows: t100
                .iter()
                .map(|f| Typed {
                    key: FlowKey::new(f.table_id, f.priority, &f.match_),
                    instructions: f.instructions.clone(),
                    text: f.to_string(),
                })
                .collect(),
            text: t100.iter().map(|f| f.to_string()).collect(),
        }
    }
}

/// Which variant a dump is, or why it is neither.
fn classify<T: std::hash::Hash + Eq + std::fmt::Debug>(
    dump: &HashSet<T>,
    variants: &[(&'static str, &HashSet<T>)],
    oracle: &str,
) -> &'static str {
    let mut why = Vec::new();
    for (name, want) in variants {
        if dump == *want {
            return name;
        }
        let missing = want.difference(dump).count();
        let extra: Vec<_> = dump.difference(want).collect();
        why.push(format!(
            "not {name}: {missing} of its {} flows missing, {} others present (e.g. {:?})",
            want.len(),
            extra.len(),
            extra.first()
        ));
    }
    panic!("{oracle} dump of table 100 ({} flows) is a half-done swap:\n{}", dump.len(), why.join("\n"));
}

fn without_cookie(line: &str) -> String {
    let line = line.trim();
    match line.strip_prefix("cookie=") {
        Some(rest) => rest.split_once(", ").map(|(_, r)| r).unwrap_or(rest).to_string(),
        None => line.to_string(),
    }
}

async fn ofctl_table100(sb: &OvsSandbox) -> HashSet<String> {
    let mut cmd = tokio::process::Command::new("ovs-ofctl");
    cmd.args(["-O", "OpenFlow13", "--timeout=60", "dump-flows", "--no-stats", "--no-names", "br0", "table=100"])
        .envs(sb.ovs_env())
        .kill_on_drop(true);
    let out = tokio::time::timeout(T, cmd.output()).await.expect("ovs-ofctl in time").expect("run ovs-ofctl");
    assert!(out.status.success(), "ovs-ofctl: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<String> =
        text.lines().filter(|l| !l.starts_with("OFPST_FLOW") && !l.trim().is_empty()).map(without_cookie).collect();
    let n = lines.len();
    let set: HashSet<String> = lines.into_iter().collect();
    assert_eq!(set.len(), n, "duplicate lines in a dump");
    set
}

fn typed(stats: Vec<FlowStats>) -> HashSet<Typed> {
    let n = stats.len();
    let set: HashSet<_> = stats
        .into_iter()
        .map(|mut s| {
            assert_eq!(s.table_id, 100);
            s.cookie = 0;
            let text = s.no_stats().to_string();
            Typed { key: FlowKey::new(s.table_id, s.priority, &s.match_), instructions: s.instructions, text }
        })
        .collect();
    assert_eq!(set.len(), n, "duplicate flows in a dump");
    set
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_policy_swaps_are_atomic() {
    let sb = OvsSandbox::start(SandboxOptions::default()).await.expect("start ovs sandbox");
    let states = Arc::new([state(10), state(11)]);
    let a = Variant::of("A", &states[0]);
    let b = Variant::of("B", &states[1]);
    assert_eq!(a.flows.intersection(&b.flows).count(), 2, "the variants share only the deny and the default");

    let mut opts = ApplyOptions::new(PathBuf::from("unused.yaml"), sb.dir().to_path_buf());
    opts.bridge.datapath_type = Some(sdn_node::options::DatapathType::Dummy);
    let first = tokio::time::timeout(T, converge(&opts, &states[0])).await.expect("converge in time").expect("converge");
    assert!(first.problems.is_empty() && first.warnings.is_empty(), "{first:?}");

    // Our own dumps go over a connection of their own.
    let sw = Switch::connect(&format!("unix:{}", sb.mgmt_socket("br0").display()), SwitchOptions::default())
        .await
        .expect("connect");
    let req = FlowStatsRequest { table_id: Table::EgressPolicy.id(), ..Default::default() };
    assert_eq!(classify(&typed(sw.dump_flows(req.clone()).await.unwrap()), &[("A", &a.flows)], "initial"), "A");

    // The swapper: B, A, B, ... until told to stop (or at MAX_SWAPS).
    let swaps = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (swaps, stop, states, opts) = (swaps.clone(), stop.clone(), states.clone(), opts.clone());
        tokio::spawn(async move {
            let mut reports = Vec::new();
            while !stop.load(Ordering::Relaxed) && swaps.load(Ordering::Relaxed) < MAX_SWAPS {
                let next = &states[(swaps.load(Ordering::Relaxed) + 1) % 2];
                let r = tokio::time::timeout(T, converge(&opts, next)).await.expect("converge in time").expect("converge");
                reports.push((r.adds, r.modifies, r.deletes));
                swaps.fetch_add(1, Ordering::Relaxed);
            }
            reports
        })
    };

    // The dumper: alternate our dump and ovs-ofctl's, classifying each.
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    let mut dumps = 0;
    let both_seen = |seen: &HashMap<(&str, &str), usize>| {
        ["ours", "ovs-ofctl"].iter().all(|o| ["A", "B"].iter().all(|v| seen.contains_key(&(*o, *v))))
    };
    while dumps < MAX_DUMPS && !swapper.is_finished() {
        let d = tokio::time::timeout(T, sw.dump_flows(req.clone())).await.expect("dump in time").expect("dump");
        let v = classify(&typed(d), &[(a.name, &a.flows), (b.name, &b.flows)], "our");
        *seen.entry(("ours", v)).or_default() += 1;
        let d = ofctl_table100(&sb).await;
        let v = classify(&d, &[(a.name, &a.text), (b.name, &b.text)], "ovs-ofctl");
        *seen.entry(("ovs-ofctl", v)).or_default() += 1;
        dumps += 1;
        if dumps >= MIN_DUMPS && swaps.load(Ordering::Relaxed) >= MIN_SWAPS && both_seen(&seen) {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reports = swapper.await.expect("swapper");
    let n = reports.len();
    eprintln!("{dumps} dumps per oracle during {n} swaps; seen: {seen:?}");

    // Each swap replaced the 999 allow rules in one bundle (the deny and the default stay).
    assert!(reports.iter().all(|r| *r == (ALLOWS, 0, ALLOWS)), "{reports:?}");
    assert!(n >= MIN_SWAPS, "only {n} swaps happened during {dumps} dumps");
    assert!(dumps >= MIN_DUMPS, "only {dumps} dumps happened during {n} swaps");
    // The dumps really raced the swaps: each oracle saw both variants.
    assert!(both_seen(&seen), "each oracle should have seen both variants: {seen:?}");

    // And the switch ends on the last variant converged.
    let last = if n % 2 == 1 { "B" } else { "A" };
    let d = typed(sw.dump_flows(req).await.unwrap());
    assert_eq!(classify(&d, &[(a.name, &a.flows), (b.name, &b.flows)], "final"), last);
}
