//! Real packets through a userspace (netdev) Open vSwitch programmed by the agent.
//!
//! Each test builds its own topology:
//! - an [`OvsSandbox`] whose ovsdb-server and ovs-vswitchd run in a network namespace of their
//!   own (the "switch namespace"): the netdev datapath's tap devices (br0, tun0) appear there;
//! - one network namespace per pod, joined to the switch namespace by a veth pair: the host
//!   end (the pod's `hostVeth`) stays in the switch namespace, where ovs-vswitchd opens it by
//!   name; the pod end is `eth0` with the pod's IP/23, MAC and a default route via the gateway;
//! - [`converge`] with `datapath_type = "netdev"` creates br0, vxlan0 and tun0, adds the veths
//!   to br0 through OVSDB and installs the pipeline over OpenFlow; then tun0 gets the gateway
//!   address 10.128.2.1/23.
//!
//! `ping` inside the pod namespaces then shows what the pipeline forwards: ARP (tables
//! 20/30/40), IP between pods (tables 20/30/70/80, VNID isolation in table 80) and traffic to
//! and from the gateway. No kernel module is needed (the netdev datapath runs in
//! ovs-vswitchd), but creating namespaces and veths needs root: without it every test says so
//! and returns. Drop guards delete everything a test creates, also when it panics. Names carry
//! the pid and a counter, so the tests run in parallel.

mod support;

use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sdn_node::apply::{converge, ApplyOptions};
use sdn_node::cluster::state_file;
use sdn_node::ovsdb::PortSpec;
use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};

const GATEWAY: &str = "10.128.2.1";
/// Echo requests per ping run.
const COUNT: u32 = 3;
/// Bound for waits on the switch (ofports).
const T: Duration = Duration::from_secs(10);
/// Bound on the revalidator rounds waited for while flow counters catch up.
const REVALIDATOR_ROUNDS: usize = 20;
/// Safety net around one `ping` run, which bounds itself with `-c` and `-W`.
const PING_BOUND: Duration = Duration::from_secs(30);

/// A pod of the test topology.
#[derive(Clone, Copy, Debug)]
struct PodDef {
    namespace: &'static str,
    name: &'static str,
    host_veth: &'static str,
    /// Last octet of its address in the node subnet 10.128.2.0/23.
    host: u8,
}

impl PodDef {
    fn ip(&self) -> String {
        format!("10.128.2.{}", self.host)
    }
    fn mac(&self) -> String {
        format!("0a:58:0a:80:02:{:02x}", self.host)
    }
}

const fn pod(
    namespace: &'static str,
    name: &'static str,
    host_veth: &'static str,
    host: u8,
) -> PodDef {
    PodDef {
        namespace,
        name,
        host_veth,
        host,
    }
}

const A1: PodDef = pod("team-a", "a1", "veth-a1", 5);
const A2: PodDef = pod("team-a", "a2", "veth-a2", 6);
const B1: PodDef = pod("team-b", "b1", "veth-b1", 7);
const D1: PodDef = pod("default", "d1", "veth-d1", 8);
const PODS: [PodDef; 4] = [A1, A2, B1, D1];

fn state_yaml(plugin: &str) -> String {
    let pods: String = PODS
        .iter()
        .map(|p| {
            format!(
                "  - {{namespace: {}, name: {}, containerID: \"{}\", hostVeth: {}, ip: {}, mac: \"{}\"}}\n",
                p.namespace,
                p.name,
                format!("{:02x}", p.host).repeat(32),
                p.host_veth,
                p.ip(),
                p.mac()
            )
        })
        .collect();
    format!(
        "node: node-a
plugin: {plugin}
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {{host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}}
  - {{host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}}
netNamespaces:
  - {{name: default, netid: 0}}
  - {{name: team-a, netid: 11}}
  - {{name: team-b, netid: 12}}
pods:
{pods}"
    )
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() == 0 };
    // Under CI a test that cannot run fails: it must never pass without having run.
    assert!(root || std::env::var_os("CI").is_none_or(|v| v.is_empty()), "CI is set and this test needs root");
    root
}

/// Runs a command to completion; panics with its stderr if it fails.
async fn run(args: &[&str]) -> String {
    let out = tokio::process::Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip -n NS ARGS` (ARGS split at whitespace).
async fn ip_in(ns: &str, args: &str) -> String {
    let mut v = vec!["ip", "-n", ns];
    v.extend(args.split_whitespace());
    run(&v).await
}

/// A network namespace created by a test; deleted on drop, which also destroys the veth pair
/// with an end in it.
struct Netns(String);

impl Netns {
    fn add(name: String) -> Netns {
        let st = std::process::Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip netns add");
        assert!(st.success(), "ip netns add {name} failed ({st})");
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        match std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "cleanup: ip netns del {}: {}",
                self.0,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => eprintln!("cleanup: ip netns del {}: {e}", self.0),
        }
    }
}

/// What one `ping` run did.
#[derive(Debug)]
struct Ping {
    code: Option<i32>,
    received: Option<u32>,
    output: String,
}

impl Ping {
    /// Echo requests were answered (ping exits 0 once one is: after its last request, ping
    /// waits only about two round trips for the rest, too short to require all of them on a
    /// loaded machine).
    fn assert_ok(&self, what: &str) {
        assert!(
            self.code == Some(0) && self.received.is_some_and(|n| n > 0),
            "{what}: expected replies; ping exited {:?}:\n{}",
            self.code,
            self.output
        );
    }

    /// Ran fine, but not one echo request was answered (exit 1, not 2 = error).
    fn assert_all_lost(&self, what: &str) {
        assert!(
            self.code == Some(1)
                && self.received == Some(0)
                && self.output.contains("100% packet loss"),
            "{what}: expected 100% packet loss; ping exited {:?}:\n{}",
            self.code,
            self.output
        );
    }
}

/// "3 packets transmitted, 2 received, ..." -> 2.
fn received(output: &str) -> Option<u32> {
    let line = output.lines().find(|l| l.contains("packets transmitted"))?;
    let field = line.split(", ").find(|f| f.ends_with(" received"))?;
    field.trim_end_matches(" received").trim().parse().ok()
}

/// One test's switch namespace, sandbox and pod namespaces.
struct Topology {
    // Fields drop in declaration order: the pod namespaces (and so the veth pairs) go first,
    // then the sandbox stops its daemons and deletes the switch namespace.
    pods: Vec<(PodDef, Netns)>,
    sb: OvsSandbox,
    sw: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Topology {
    /// Builds the topology and converges the switch to the state for `plugin`; `None` (after
    /// saying why) when not root.
    async fn up(plugin: &str) -> Option<Topology> {
        if !is_root() {
            eprintln!("skipping: needs root to create network namespaces and veth pairs (under CI is_root() fails the test instead)");
            return None; // never under CI: is_root() fails the test there
        }
        let id = format!(
            "sdnpkt-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let sw = format!("{id}-sw");
        let sb = OvsSandbox::start(SandboxOptions {
            netns: Some(sw.clone()),
            ..Default::default()
        })
        .await
        .expect("start the sandbox in its own namespace");
        let mut pods = Vec::new();
        for p in PODS {
            let ns = Netns::add(format!("{id}-{}", p.name));
            let pod = ns.0.clone();
            pods.push((p, ns));
            let (veth, mac, ip) = (p.host_veth, p.mac(), p.ip());
            // The pod end is created straight in the pod's namespace: no clash on eth0.
            ip_in(
                &sw,
                &format!("link add {veth} type veth peer name eth0 netns {pod}"),
            )
            .await;
            // The netdev datapath reads the veth through a packet socket, so the switch
            // namespace's own IP stack sees the pod's frames too, and by default it answers
            // ARP for any of its addresses (the gateway's, on tun0) on any interface: the pod
            // could resolve the gateway to this veth's MAC, bypassing the pipeline. A switch
            // port is not an IP interface: never answer ARP on it (8 = for no local address).
            let echo = format!("echo 8 > /proc/sys/net/ipv4/conf/{veth}/arp_ignore");
            run(&["ip", "netns", "exec", &sw, "sh", "-c", &echo]).await;
            ip_in(&sw, &format!("link set {veth} up")).await;
            ip_in(&pod, "link set lo up").await;
            ip_in(&pod, &format!("link set eth0 address {mac}")).await;
            ip_in(&pod, &format!("addr add {ip}/23 dev eth0")).await;
            ip_in(&pod, "link set eth0 up").await;
            ip_in(&pod, &format!("route add default via {GATEWAY}")).await;
        }
        let topo = Topology { pods, sb, sw };

        let (state, problems) = state_file::parse(&state_yaml(plugin)).expect("state parses");
        assert!(problems.is_empty(), "{problems:?}");
        let mut opts = ApplyOptions::new(
            topo.sb.dir().join("state.yaml"),
            topo.sb.dir().to_path_buf(),
        );
        opts.bridge.datapath_type = Some(sdn_node::options::DatapathType::Netdev);
        opts.bridge.port_timeout = T;
        let report = converge(&opts, &state).await.expect("converge");
        assert!(
            report.problems.is_empty() && report.warnings.is_empty(),
            "{report:?}"
        );
        assert_eq!(report.ports_added, PODS.len(), "{report:?}");

        // The address needs the tun0 tap: its ofport says ovs-vswitchd has opened it.
        let tun0 = topo
            .sb
            .ovs()
            .add_port_and_wait_ofport("br0", "tun0", &PortSpec::internal(Some(2)), T)
            .await
            .expect("tun0 gets an ofport");
        assert_eq!(tun0, 2);
        ip_in(&topo.sw, &format!("addr add {GATEWAY}/23 dev tun0")).await;
        ip_in(&topo.sw, "link set tun0 up").await;
        Some(topo)
    }

    fn netns_of(&self, pod: PodDef) -> &str {
        let ns = self
            .pods
            .iter()
            .find_map(|(p, ns)| (p.name == pod.name).then_some(ns));
        &ns.expect("a pod of the topology").0
    }

    /// `ping -c 3` from inside namespace `ns`.
    async fn ping_in(&self, ns: &str, dst: &str) -> Ping {
        let count = COUNT.to_string();
        let child = tokio::process::Command::new("ip")
            .args([
                "netns", "exec", ns, "ping", "-n", "-c", &count, "-i", "0.2", "-W", "2", dst,
            ])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(PING_BOUND, child)
            .await
            .unwrap_or_else(|_| panic!("ping in {ns} did not end within {PING_BOUND:?}"))
            .expect("run ping (install iputils-ping)");
        let output = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ping {
            code: out.status.code(),
            received: received(&output),
            output,
        }
    }

    async fn ping(&self, from: PodDef, dst: &str) -> Ping {
        self.ping_in(self.netns_of(from), dst).await
    }

    /// The MAC the pod's neighbour table holds for `ip` (i.e. the ARP reply that came back).
    async fn neighbour(&self, pod: PodDef, ip: &str) -> Option<String> {
        let out = ip_in(self.netns_of(pod), &format!("neigh show {ip} dev eth0")).await;
        let mut words = out.split_whitespace();
        words.find(|w| *w == "lladdr")?;
        words.next().map(str::to_string)
    }

    async fn tun0_mac(&self) -> String {
        let out = ip_in(&self.sw, "-o link show tun0").await;
        let mut words = out.split_whitespace();
        words.find(|w| *w == "link/ether").expect("tun0 has a MAC");
        words.next().expect("tun0 has a MAC").to_string()
    }

    /// Packets counted by the table=80 priority=0 drop flow (VNID isolation), once it has
    /// counted `at_least` or after a bounded number of revalidator rounds.
    async fn isolation_drops(&self, at_least: u64) -> u64 {
        // The userspace datapath's packet counts reach the OpenFlow rules when a revalidator
        // round dumps the datapath flows: wait for completed rounds, not for time.
        let pid = self.sb.vswitchd_pid().expect("vswitchd runs");
        let ctl = self.sb.dir().join(format!("ovs-vswitchd.{pid}.ctl"));
        let ctl = ctl.to_str().expect("utf-8 path");
        let mut n = 0;
        for _ in 0..REVALIDATOR_ROUNDS {
            run(&["ovs-appctl", "-t", ctl, "--timeout=10", "revalidator/wait"]).await;
            n = self.isolation_drop_count();
            if n >= at_least {
                break;
            }
        }
        n
    }

    fn isolation_drop_count(&self) -> u64 {
        let dump = support::ofctl(&self.sb, &["dump-flows", "br0", "table=80"]);
        let line = dump
            .lines()
            .find(|l| l.trim_end().ends_with("priority=0 actions=drop"))
            .unwrap_or_else(|| panic!("no table=80 priority=0 drop flow in\n{dump}"));
        let n = line
            .split(", ")
            .find_map(|f| f.trim().strip_prefix("n_packets="))
            .expect("n_packets");
        n.parse().expect("n_packets is a number")
    }
}

/// Two pods of one tenant reach each other; each ARP reply (table 40) came back through the
/// pipeline with the peer's real MAC.
#[tokio::test]
async fn pods_of_one_tenant_reach_each_other() {
    let Some(t) = Topology::up("multitenant").await else {
        return;
    };
    t.ping(A1, &A2.ip())
        .await
        .assert_ok("team-a/a1 -> team-a/a2");
    t.ping(A2, &A1.ip())
        .await
        .assert_ok("team-a/a2 -> team-a/a1");
    assert_eq!(
        t.neighbour(A1, &A2.ip()).await,
        Some(A2.mac()),
        "a1 resolved a2 by ARP"
    );
    assert_eq!(
        t.neighbour(A2, &A1.ip()).await,
        Some(A1.mac()),
        "a2 resolved a1 by ARP"
    );
}

/// team-a and team-b (VNIDs 11 and 12) cannot exchange IP packets, either way: ARP still
/// resolves (table 40 does not isolate, as in the seed), and every echo request is dropped by
/// table 80's default drop.
#[tokio::test]
async fn tenants_are_isolated_both_ways() {
    let Some(t) = Topology::up("multitenant").await else {
        return;
    };
    // The topology forwards at all (so the losses below are the policy's).
    t.ping(A1, &A2.ip())
        .await
        .assert_ok("team-a/a1 -> team-a/a2");
    let before = t.isolation_drops(0).await;
    t.ping(A1, &B1.ip())
        .await
        .assert_all_lost("team-a/a1 -> team-b/b1");
    t.ping(B1, &A1.ip())
        .await
        .assert_all_lost("team-b/b1 -> team-a/a1");
    assert_eq!(
        t.neighbour(A1, &B1.ip()).await,
        Some(B1.mac()),
        "ARP across tenants resolves"
    );
    assert_eq!(
        t.neighbour(B1, &A1.ip()).await,
        Some(A1.mac()),
        "ARP across tenants resolves"
    );
    let expected = 2 * u64::from(COUNT);
    let dropped = t.isolation_drops(before + expected).await - before;
    assert_eq!(dropped, expected, "the echo requests die in table 80");
}

/// VNID 0 (namespace default) is global: it reaches every tenant and every tenant reaches it.
#[tokio::test]
async fn global_vnid_reaches_a_tenant_both_ways() {
    let Some(t) = Topology::up("multitenant").await else {
        return;
    };
    t.ping(D1, &B1.ip())
        .await
        .assert_ok("default/d1 -> team-b/b1");
    t.ping(B1, &D1.ip())
        .await
        .assert_ok("team-b/b1 -> default/d1");
}

/// A pod reaches the gateway tun0 (ARP and IP to the gateway go straight to port 2), and the
/// node reaches the pod through tun0 (table 80's gateway rule).
#[tokio::test]
async fn pod_and_gateway_reach_each_other() {
    let Some(t) = Topology::up("multitenant").await else {
        return;
    };
    t.ping(A1, GATEWAY)
        .await
        .assert_ok("team-a/a1 -> gateway tun0");
    assert_eq!(
        t.neighbour(A1, GATEWAY).await,
        Some(t.tun0_mac().await),
        "a1 resolved tun0 by ARP"
    );
    let on_port = ip_in(&t.sw, &format!("neigh show dev {}", A1.host_veth)).await;
    assert_eq!(
        on_port.trim(),
        "",
        "the switch namespace answered ARP on a switch port"
    );
    t.ping_in(&t.sw, &B1.ip())
        .await
        .assert_ok("node (tun0) -> team-b/b1");
}

/// In subnet mode every pod has VNID 0: the namespaces that multitenant mode isolates talk.
#[tokio::test]
async fn subnet_plugin_does_not_isolate() {
    let Some(t) = Topology::up("subnet").await else {
        return;
    };
    t.ping(A1, &B1.ip())
        .await
        .assert_ok("team-a/a1 -> team-b/b1 (subnet plugin)");
    t.ping(B1, &A1.ip())
        .await
        .assert_ok("team-b/b1 -> team-a/a1 (subnet plugin)");
}
