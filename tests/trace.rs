//! The installed pipeline's behaviour, judged by `ovs-appctl ofproto/trace`.
//!
//! Each test starts a private Open vSwitch, converges a multitenant state onto it through the
//! agent's own path ([`converge`]), and traces packets through br0. Assertions are on the final
//! `Datapath actions:` line (the ports and tunnels the packet leaves by, as datapath port
//! numbers mapped back to interface names through `dpif/show`) and on the tables the packet
//! went through. No flow is added by hand.
//!
//! Two details of the sandbox:
//! - vswitchd's unixctl socket is `$DIR/ovs-vswitchd.<pid>.ctl`; `ovs-appctl -t ovs-vswitchd`
//!   does not find it even with `OVS_RUNDIR` set, because the sandbox's pid file is `v.pid`
//!   rather than `ovs-vswitchd.pid`. The tests pass the socket's path with `--target`.
//! - A userspace (dummy) datapath uses OVS's native tunnelling, which needs a route and a
//!   neighbour entry for the remote node, and encapsulates into an underlay bridge. The tests
//!   turn that off (`dpif/set-dp-features br0 tnl_push_pop false`, a datapath feature, not a
//!   flow) so a tunnel output shows as the kernel datapath would do it:
//!   `set(tunnel(tun_id=0xb,dst=172.17.0.3,ttl=64,tp_dst=4789,flags(df|key))),4789`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use sdn_node::apply::{converge, ApplyOptions};
use sdn_node::cluster::state_file;
use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};

/// node-a's view of a three-node multitenant cluster. node-c carries the fixed-VNID annotation.
/// team-a (VNID 11) has multicast on and an egress policy; team-b (12) neither; `default` is
/// the global VNID 0.
const STATE: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
  - {host: node-c, hostIP: 172.17.0.4, subnet: 10.130.0.0/23, fixedVNID: 7}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11, multicast: true}
  - {name: team-b, netid: 12}
services:
  - {namespace: team-a, name: web, clusterIP: 172.30.0.10,
     ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 53}]}
pods:
  - {namespace: team-a, name: a1, containerID: a100000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, mac: "0a:58:0a:80:02:05"}
  - {namespace: team-a, name: a2, containerID: a200000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a2, internal: true, ip: 10.128.2.6, mac: "0a:58:0a:80:02:06"}
  - {namespace: team-a, name: a3, containerID: a300000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-a3, internal: true, ip: 10.128.2.8, mac: "0a:58:0a:80:02:08"}
  - {namespace: team-b, name: b1, containerID: b100000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-b1, internal: true, ip: 10.128.2.7, mac: "0a:58:0a:80:02:07"}
  - {namespace: team-b, name: b2, containerID: b200000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-b2, internal: true, ip: 10.128.2.10, mac: "0a:58:0a:80:02:0a"}
  - {namespace: default, name: d1, containerID: d100000000000000000000000000000000000000000000000000000000000000,
     hostVeth: veth-d1, internal: true, ip: 10.128.2.9, mac: "0a:58:0a:80:02:09"}
egressNetworkPolicies:
  - namespace: team-a
    name: default
    egress:
      - {type: Allow, to: {cidrSelector: 1.2.3.0/24}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
"#;

/// Bound for every wait (converge, each OVS tool run).
const T: Duration = Duration::from_secs(60);

/// A pod of [`STATE`]: its interface and addresses.
#[derive(Clone, Copy)]
struct Pod {
    veth: &'static str,
    ip: &'static str,
    mac: &'static str,
}

const A1: Pod = Pod { veth: "veth-a1", ip: "10.128.2.5", mac: "0a:58:0a:80:02:05" };
const A2: Pod = Pod { veth: "veth-a2", ip: "10.128.2.6", mac: "0a:58:0a:80:02:06" };
const A3: Pod = Pod { veth: "veth-a3", ip: "10.128.2.8", mac: "0a:58:0a:80:02:08" };
const B1: Pod = Pod { veth: "veth-b1", ip: "10.128.2.7", mac: "0a:58:0a:80:02:07" };
const B2: Pod = Pod { veth: "veth-b2", ip: "10.128.2.10", mac: "0a:58:0a:80:02:0a" };
const D1: Pod = Pod { veth: "veth-d1", ip: "10.128.2.9", mac: "0a:58:0a:80:02:09" };

const NODE_B: &str = "172.17.0.3";
const NODE_C: &str = "172.17.0.4";

/// The node under test: a sandbox holding the converged pipeline.
struct Node {
    sb: OvsSandbox,
    /// vswitchd's unixctl socket.
    ctl: PathBuf,
    /// Interface name -> OpenFlow port, as OVSDB reports it.
    ofports: HashMap<String, u32>,
    /// Interface name -> datapath port, as `dpif/show` reports it.
    odp: HashMap<String, u32>,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{cmd:?} failed ({}): {}{stdout}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

impl Node {
    async fn start() -> Node {
        let sb = OvsSandbox::start(SandboxOptions::default()).await.expect("start ovs sandbox");
        let (state, problems) = state_file::parse(STATE).expect("state parses");
        assert!(problems.is_empty(), "{problems:?}");
        let mut opts = ApplyOptions::new(PathBuf::from("unused.yaml"), sb.dir().to_path_buf());
        opts.bridge.datapath_type = Some(sdn_node::options::DatapathType::Dummy);
        let report = tokio::time::timeout(T, converge(&opts, &state)).await.expect("converge in time").expect("converge");
        assert!(report.problems.is_empty() && report.warnings.is_empty(), "{report:?}");
        assert_eq!(report.ports_added, 6, "{report:?}");

        let pid = sb.vswitchd_pid().expect("vswitchd runs");
        let ctl = sb.dir().join(format!("ovs-vswitchd.{pid}.ctl"));
        let mut node = Node { sb, ctl, ofports: HashMap::new(), odp: HashMap::new() };
        node.appctl(&["dpif/set-dp-features", "br0", "tnl_push_pop", "false"]);

        for iface in ["vxlan0", "tun0", A1.veth, A2.veth, A3.veth, B1.veth, B2.veth, D1.veth] {
            let ofport = node.vsctl(&["get", "interface", iface, "ofport"]);
            let ofport: u32 = ofport.trim().parse().unwrap_or_else(|e| panic!("ofport of {iface}: {ofport:?}: {e}"));
            node.ofports.insert(iface.to_string(), ofport);
        }
        assert_eq!(node.ofports["vxlan0"], 1);
        assert_eq!(node.ofports["tun0"], 2);

        // "    veth-a1 5/4: (dummy-internal)": name, OpenFlow port / datapath port.
        let show = node.appctl(&["dpif/show"]);
        for line in show.lines() {
            let mut words = line.split_whitespace();
            let (Some(name), Some(ports)) = (words.next(), words.next()) else { continue };
            let Some((of, dp)) = ports.trim_end_matches(':').split_once('/') else { continue };
            let (Ok(of), Ok(dp)) = (of.parse::<u32>(), dp.parse::<u32>()) else { continue };
            if let Some(&want) = node.ofports.get(name) {
                assert_eq!(of, want, "dpif/show and OVSDB disagree on {name}'s ofport:\n{show}");
                node.odp.insert(name.to_string(), dp);
            }
        }
        assert_eq!(node.odp.len(), node.ofports.len(), "every interface in dpif/show:\n{show}");
        node
    }

    fn appctl(&self, args: &[&str]) -> String {
        run(Command::new("ovs-appctl")
            .arg(format!("--timeout={}", T.as_secs()))
            .arg(format!("--target={}", self.ctl.display()))
            .args(args)
            .envs(self.sb.ovs_env()))
    }

    fn vsctl(&self, args: &[&str]) -> String {
        run(Command::new("ovs-vsctl")
            .arg(format!("--timeout={}", T.as_secs()))
            .arg(format!("--db={}", self.sb.db_socket()))
            .args(args)
            .envs(self.sb.ovs_env()))
    }

    fn ofport(&self, pod: Pod) -> u32 {
        self.ofports[pod.veth]
    }

    /// The datapath action that outputs to `iface`.
    fn out(&self, iface: &str) -> String {
        self.odp[iface].to_string()
    }

    fn trace(&self, flow: &str) -> Trace {
        Trace { flow: flow.to_string(), text: self.appctl(&["ofproto/trace", "br0", flow]) }
    }

    /// IP from a local pod (the pod's own source address, as table 20 requires).
    fn ip_from(&self, src: Pod, rest: &str) -> Trace {
        self.trace(&format!("in_port={},{rest},nw_src={}", self.ofport(src), src.ip))
    }

    /// An ARP request from a local pod.
    fn arp_from(&self, src: Pod, tpa: &str) -> Trace {
        self.trace(&format!(
            "in_port={},arp,arp_op=1,arp_spa={},arp_sha={},arp_tpa={tpa}",
            self.ofport(src),
            src.ip,
            src.mac
        ))
    }

    /// IP arriving over VXLAN from `tun_src` carrying `vnid`.
    fn vxlan_in(&self, tun_src: &str, vnid: u32, rest: &str) -> Trace {
        self.trace(&format!("in_port=1,tun_src={tun_src},tun_dst=172.17.0.2,tun_id={vnid:#x},{rest}"))
    }

    /// Asserts the packet leaves by exactly these local interfaces (in this order).
    fn assert_delivered(&self, t: &Trace, ifaces: &[&str]) {
        let want: Vec<String> = ifaces.iter().map(|i| self.out(i)).collect();
        assert_eq!(t.actions(), want, "expected output to {ifaces:?}\n{t}");
    }

    /// Asserts the packet leaves by exactly one VXLAN tunnel to `dst` carrying `vnid`.
    fn assert_tunnelled(&self, t: &Trace, vnid: u32, dst: &str) {
        let actions = t.actions();
        assert_eq!(actions.len(), 2, "expected set(tunnel(..)),vxlan\n{t}");
        assert_tunnel(&actions[0], vnid, dst, t);
        assert_eq!(actions[1], self.out("vxlan0"), "tunnel output goes to vxlan0's datapath port\n{t}");
    }
}

/// `set(tunnel(tun_id=0xb,dst=172.17.0.3,...))` with exactly this VNID and destination.
fn assert_tunnel(action: &str, vnid: u32, dst: &str, t: &Trace) {
    let inner = action
        .strip_prefix("set(tunnel(")
        .and_then(|s| s.strip_suffix("))"))
        .unwrap_or_else(|| panic!("{action:?} is not a tunnel set\n{t}"));
    let fields = split_top_level(inner);
    assert!(fields.contains(&format!("tun_id={vnid:#x}")), "tunnel {action:?} should carry tun_id={vnid:#x}\n{t}");
    assert!(fields.contains(&format!("dst={dst}")), "tunnel {action:?} should go to {dst}\n{t}");
    assert!(fields.contains(&"tp_dst=4789".to_string()), "VXLAN port\n{t}");
}

/// Splits on the commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// One `ofproto/trace` output.
struct Trace {
    flow: String,
    text: String,
}

impl std::fmt::Display for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--- ofproto/trace br0 '{}'\n{}", self.flow, self.text)
    }
}

impl Trace {
    /// The final `Datapath actions:` line's value.
    fn datapath_actions(&self) -> &str {
        self.text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("Datapath actions: "))
            .unwrap_or_else(|| panic!("no Datapath actions line\n{self}"))
            .trim()
    }

    /// The datapath actions, one by one; empty for `drop`.
    fn actions(&self) -> Vec<String> {
        match self.datapath_actions() {
            "drop" => vec![],
            a => split_top_level(a),
        }
    }

    /// The OpenFlow tables the packet went through, in order (" 0. ip, priority 100, ...").
    fn tables(&self) -> Vec<u8> {
        self.text
            .lines()
            .filter_map(|l| {
                let (n, rest) = l.trim_start().split_once(". ")?;
                // Only the bridge's table entries are indented by at most one space.
                (l.len() - l.trim_start().len() <= 1 && !rest.is_empty()).then_some(())?;
                n.parse().ok()
            })
            .collect()
    }

    fn assert_dropped(&self) {
        assert_eq!(self.datapath_actions(), "drop", "expected a drop\n{self}");
    }

    fn assert_tables(&self, want: &[u8]) {
        assert_eq!(self.tables(), want, "table path\n{self}");
    }
}

const FROM_POD: [u8; 4] = [0, 20, 21, 30];

fn path(tail: &[u8]) -> Vec<u8> {
    FROM_POD.iter().chain(tail).copied().collect()
}

#[tokio::test]
async fn pods_of_one_vnid_reach_each_other() {
    let n = Node::start().await;
    let t = n.ip_from(A1, &format!("ip,nw_dst={}", A2.ip));
    n.assert_delivered(&t, &[A2.veth]);
    t.assert_tables(&path(&[70, 80]));
    assert!(t.text.contains(&format!("output port is {}", n.ofport(A2))), "{t}");

    let t = n.ip_from(A2, &format!("tcp,nw_dst={},tcp_dst=8080", A1.ip));
    n.assert_delivered(&t, &[A1.veth]);

    let t = n.ip_from(B1, &format!("udp,nw_dst={},udp_dst=53", B2.ip));
    n.assert_delivered(&t, &[B2.veth]);
}

#[tokio::test]
async fn pods_of_different_vnids_are_isolated() {
    let n = Node::start().await;
    for (src, dst) in [(A1, B1), (B1, A1), (B2, A3)] {
        let t = n.ip_from(src, &format!("ip,nw_dst={}", dst.ip));
        t.assert_dropped();
        // Routed to the pod, refused by the policy table.
        t.assert_tables(&path(&[70, 80]));
    }
    // A pod may not send with another pod's address.
    let t = n.trace(&format!("in_port={},ip,nw_src={},nw_dst={}", n.ofport(B1), A2.ip, A1.ip));
    t.assert_dropped();
    t.assert_tables(&[0, 20]);
}

#[tokio::test]
async fn the_global_vnid_reaches_every_vnid_and_back() {
    let n = Node::start().await;
    let t = n.ip_from(D1, &format!("ip,nw_dst={}", A1.ip));
    n.assert_delivered(&t, &[A1.veth]);
    t.assert_tables(&path(&[70, 80]));
    assert!(t.text.contains("80. reg0=0, priority 200"), "allowed by the source-VNID-0 rule\n{t}");

    let t = n.ip_from(A1, &format!("ip,nw_dst={}", D1.ip));
    n.assert_delivered(&t, &[D1.veth]);
    // Priority 200 like the source-VNID-0 rule, as openshift-sdn has both (they cannot both
    // match here: the source is VNID 11).
    assert!(t.text.contains("80. reg1=0, priority 200"), "allowed by the destination-VNID-0 rule\n{t}");

    let t = n.ip_from(B2, &format!("ip,nw_dst={}", D1.ip));
    n.assert_delivered(&t, &[D1.veth]);
}

#[tokio::test]
async fn remote_pods_are_reached_through_vxlan_with_the_source_vnid() {
    let n = Node::start().await;
    // node-b: the VXLAN header carries the sender's VNID.
    let t = n.ip_from(A1, "ip,nw_dst=10.129.0.5");
    n.assert_tunnelled(&t, 11, NODE_B);
    t.assert_tables(&path(&[90]));
    let t = n.ip_from(B1, "tcp,nw_dst=10.129.1.200,tcp_dst=443");
    n.assert_tunnelled(&t, 12, NODE_B);
    let t = n.ip_from(D1, "ip,nw_dst=10.129.0.5");
    n.assert_tunnelled(&t, 0, NODE_B);

    // node-c has a fixed VNID: every sender's traffic carries 7.
    for src in [A1, B1, D1] {
        let t = n.ip_from(src, "ip,nw_dst=10.130.0.5");
        n.assert_tunnelled(&t, 7, NODE_C);
        t.assert_tables(&path(&[90]));
    }

    // ARP for a remote pod goes the same way (table 50).
    let t = n.arp_from(A2, "10.129.0.5");
    n.assert_tunnelled(&t, 11, NODE_B);
    t.assert_tables(&path(&[50]));
    let t = n.arp_from(A2, "10.130.0.5");
    n.assert_tunnelled(&t, 7, NODE_C);

    // A cluster address no node owns goes nowhere.
    let t = n.ip_from(A1, "ip,nw_dst=10.131.0.5");
    t.assert_dropped();
    t.assert_tables(&path(&[90]));
}

#[tokio::test]
async fn vxlan_ingress_is_accepted_only_from_known_nodes() {
    let n = Node::start().await;
    let to_a1 = format!("ip,nw_src=10.129.0.5,nw_dst={}", A1.ip);

    // From node-b with the destination's VNID, or the global one: delivered.
    let t = n.vxlan_in(NODE_B, 11, &to_a1);
    n.assert_delivered(&t, &[A1.veth]);
    t.assert_tables(&[0, 10, 30, 70, 80]);
    assert!(t.text.contains("NXM_NX_REG0[] is now 0xb"), "VNID taken from the tunnel\n{t}");
    let t = n.vxlan_in(NODE_C, 0, &to_a1);
    n.assert_delivered(&t, &[A1.veth]);

    // Another tenant's VNID: refused by policy.
    let t = n.vxlan_in(NODE_B, 12, &to_a1);
    t.assert_dropped();
    t.assert_tables(&[0, 10, 30, 70, 80]);

    // An unknown node: refused at the VXLAN ingress table.
    let t = n.vxlan_in("172.17.0.99", 11, &to_a1);
    t.assert_dropped();
    t.assert_tables(&[0, 10]);

    // A source outside the cluster network: refused at once.
    let t = n.vxlan_in(NODE_B, 11, &format!("ip,nw_src=192.168.0.5,nw_dst={}", A1.ip));
    t.assert_dropped();
    t.assert_tables(&[0]);
}

#[tokio::test]
async fn services_are_reached_on_their_ports_within_the_vnid() {
    let n = Node::start().await;
    // A listed port, same VNID: out through tun0 (to the host's service proxy).
    let t = n.ip_from(A1, "tcp,nw_dst=172.30.0.10,tcp_dst=80");
    n.assert_delivered(&t, &["tun0"]);
    t.assert_tables(&path(&[60, 80]));
    assert!(t.text.contains("output port is 2"), "{t}");
    let t = n.ip_from(A2, "udp,nw_dst=172.30.0.10,udp_dst=53");
    n.assert_delivered(&t, &["tun0"]);
    t.assert_tables(&path(&[60, 80]));

    // Unlisted ports and protocols: dropped in table 60.
    for rest in ["tcp,nw_dst=172.30.0.10,tcp_dst=8080", "udp,nw_dst=172.30.0.10,udp_dst=80", "tcp,nw_dst=172.30.0.10,tcp_dst=53"] {
        let t = n.ip_from(A1, rest);
        t.assert_dropped();
        t.assert_tables(&path(&[60]));
    }

    // Another VNID on a listed port: dropped by policy.
    let t = n.ip_from(B1, "tcp,nw_dst=172.30.0.10,tcp_dst=80");
    t.assert_dropped();
    t.assert_tables(&path(&[60, 80]));

    // VNID 0 reaches any service address and port.
    let t = n.ip_from(D1, "tcp,nw_dst=172.30.0.10,tcp_dst=8080");
    n.assert_delivered(&t, &["tun0"]);
    t.assert_tables(&path(&[60]));
}

#[tokio::test]
async fn egress_policy_allows_and_denies_external_destinations() {
    let n = Node::start().await;
    // team-a: Allow 1.2.3.0/24, then Deny 0.0.0.0/0.
    let t = n.ip_from(A1, "tcp,nw_dst=1.2.3.4,tcp_dst=443");
    n.assert_delivered(&t, &["tun0"]);
    t.assert_tables(&path(&[100]));
    assert!(t.text.contains("100. ip,reg0=0xb,nw_dst=1.2.3.0/24, priority 2"), "{t}");
    let t = n.ip_from(A2, "ip,nw_dst=8.8.8.8");
    t.assert_dropped();
    t.assert_tables(&path(&[100]));
    assert!(t.text.contains("100. ip,reg0=0xb, priority 1"), "{t}");

    // team-b and the global VNID have no policy: everything goes out.
    for src in [B1, D1] {
        let t = n.ip_from(src, "ip,nw_dst=8.8.8.8");
        n.assert_delivered(&t, &["tun0"]);
        t.assert_tables(&path(&[100]));
        assert!(t.text.contains("100. priority 0"), "{t}");
    }
}

#[tokio::test]
async fn multicast_reaches_the_vnid_s_pods_and_remote_nodes_when_enabled() {
    let n = Node::start().await;
    // team-a has multicast on: a copy to each remote node (with the sender's VNID), then to
    // every other local team-a pod (never back to the sender, never to other VNIDs).
    let t = n.ip_from(A1, "udp,nw_dst=224.1.2.3,udp_dst=5000");
    t.assert_tables(&path(&[110, 111, 120]));
    let actions = t.actions();
    assert_eq!(actions.len(), 6, "two tunnels, then two local pods\n{t}");
    assert_tunnel(&actions[0], 11, NODE_B, &t);
    assert_eq!(actions[1], n.out("vxlan0"), "{t}");
    assert_tunnel(&actions[2], 11, NODE_C, &t);
    assert_eq!(actions[3], n.out("vxlan0"), "{t}");
    let mut local = actions[4..].to_vec();
    local.sort();
    let mut want = vec![n.out(A2.veth), n.out(A3.veth)];
    want.sort();
    assert_eq!(local, want, "delivered to a2 and a3\n{t}");

    // From VXLAN: delivered to all local team-a pods, not sent back out.
    let t = n.vxlan_in(NODE_B, 11, "udp,nw_src=10.129.0.5,nw_dst=224.1.2.3,udp_dst=5000");
    t.assert_tables(&[0, 10, 30, 120]);
    let mut local = t.actions();
    local.sort();
    let mut want = vec![n.out(A1.veth), n.out(A2.veth), n.out(A3.veth)];
    want.sort();
    assert_eq!(local, want, "delivered to a1, a2 and a3\n{t}");
}

#[tokio::test]
async fn multicast_is_dropped_when_not_enabled() {
    let n = Node::start().await;
    for src in [B1, D1] {
        let t = n.ip_from(src, "udp,nw_dst=224.1.2.3,udp_dst=5000");
        t.assert_dropped();
        t.assert_tables(&path(&[110]));
    }
    let t = n.vxlan_in(NODE_B, 12, "udp,nw_src=10.129.0.5,nw_dst=224.1.2.3,udp_dst=5000");
    t.assert_dropped();
    t.assert_tables(&[0, 10, 30, 120]);
    // Multicast from the host is never forwarded.
    let t = n.trace("in_port=2,udp,nw_src=10.128.2.1,nw_dst=224.1.2.3,udp_dst=5000");
    t.assert_dropped();
    t.assert_tables(&[0]);
}

#[tokio::test]
async fn arp_reaches_local_pods_and_the_gateway() {
    let n = Node::start().await;
    // To a local pod, whatever its VNID (ARP is not isolated): table 40.
    for (src, dst) in [(A1, A2), (A1, B1), (B2, D1)] {
        let t = n.arp_from(src, dst.ip);
        n.assert_delivered(&t, &[dst.veth]);
        t.assert_tables(&path(&[40]));
    }
    // To the gateway: out through tun0.
    let t = n.arp_from(A1, "10.128.2.1");
    n.assert_delivered(&t, &["tun0"]);
    t.assert_tables(&path(&[]));
    // To an unused local address: nowhere.
    let t = n.arp_from(A1, "10.128.2.100");
    t.assert_dropped();
    t.assert_tables(&path(&[40]));
    // With another pod's hardware address: refused at once.
    let t = n.trace(&format!("in_port={},arp,arp_op=1,arp_spa={},arp_sha={},arp_tpa={}", n.ofport(A1), A1.ip, A2.mac, A2.ip));
    t.assert_dropped();
    t.assert_tables(&[0, 20]);
    // The gateway's ARP into the cluster: to the pod.
    let t = n.trace(&format!("in_port=2,arp,arp_op=1,arp_spa=10.128.2.1,arp_tpa={}", A3.ip));
    n.assert_delivered(&t, &[A3.veth]);
    t.assert_tables(&[0, 30, 40]);
}
