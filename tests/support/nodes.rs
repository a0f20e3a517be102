//! Several nodes on one machine, joined by VXLAN over a userspace (netdev) Open vSwitch.
//!
//! Topology of a [`Cluster`] (all names carry the pid and a per-process counter, so tests run
//! in parallel, also several clusters in one test binary):
//!
//! ```text
//!   underlay netns  <prefix>-ul:  kernel bridge "ul" (no IP), one port n<i> per node
//!                                     |  veth
//!   node netns  <prefix>-<name>:  ul0 -- br-phy (netdev, NORMAL; node IP on its internal port)
//!     ovsdb-server + ovs-vswitchd     br0 (the agent's: vxlan0=1, tun0=2, pods)
//!                                     |  veth (host end veth<k> in the node netns)
//!   pod netns  <prefix>-<name>-p<k>:  eth0 (pod IP/prefix, MAC 0a:58:<ip>, routes as the CNI sets them)
//! ```
//!
//! - Each node is an [`OvsSandbox`] started with `netns: Some(..)`: both daemons run inside the
//!   node's namespace, so the netdev datapath's tap devices (br0, tun0, br-phy) and the
//!   kernel routes OVS reads (ovs-router) are the node's own.
//! - The userspace datapath does VXLAN itself ("native tunnelling", OVS
//!   Documentation/howto/userspace-tunneling.rst): to send to `tun_dst` it looks the route up
//!   in ovs-router, which must point at the internal port of an OVS bridge holding the
//!   underlay address (br-phy here), then needs the peer's MAC in its tunnel neighbour cache.
//!   [`Cluster::start`] puts the HostSubnet's hostIP on br-phy, gives br-phy a fixed MAC
//!   ([`NodeSpec::phy_mac`]), waits (bounded) until `ovs/route/lookup` of every peer resolves
//!   through br-phy, and pre-seeds `tnl/neigh/set` for every peer, so the first packet is not
//!   lost while OVS would otherwise resolve the peer by ARP.
//! - On the receiving node, a VXLAN packet arriving on ul0 goes through br-phy's NORMAL flow
//!   towards br-phy's LOCAL port; OVS sees that it is addressed to a tunnel endpoint of its own
//!   and pops the tunnel instead, delivering the inner frame to br0 on vxlan0 with `tun_id`
//!   and `tun_src` set.
//! - The node's kernel also sees every frame on ul0 and on the pods' host veths (the netdev
//!   datapath reads them through packet sockets). Unicast frames there are addressed to other
//!   MACs, so the kernel ignores them; broadcasts (ARP requests) it would answer for its own
//!   addresses (tun0's gateway, br-phy's node IP) on any interface: ul0 and the host veths
//!   never answer ARP (`arp_ignore=8`), and ul0 filters by reverse path (its peers are routed
//!   through br-phy), so nothing reaches the kernel's IP stack through ul0.
//! - Pods are veth pairs whose pod end has TX checksum offload off: the netdev datapath
//!   forwards partial checksums unfixed, so TCP/UDP would fail while ping works. Pods and tun0
//!   have MTU [`POD_MTU`] so that encapsulated frames fit the underlay.
//! - No nc/socat needed for TCP: [`in_netns`] runs a closure on a thread that has entered a
//!   namespace; sockets opened there stay in that namespace wherever they are used later
//!   ([`Pod::tcp_listen`], [`Pod::tcp_connect`]).
//!
//! Use:
//! ```ignore
//! let Some(mut c) = Cluster::start("my_test", &[NodeSpec::new("a", "172.17.0.2", "10.128.0.0/23"),
//!                                              NodeSpec::new("b", "172.17.0.3", "10.128.2.0/23")]).await
//! else { return };                       // not root and CI unset: skipped (printed)
//! let a1 = c.node_mut("a").add_pod("team-a", "a1", "10.128.0.5").await;
//! let yaml = c.state_yaml("a", "multitenant", &[("default", 0), ("team-a", 11)]);
//! let report = c.node("a").apply(&yaml).await;   // converge br0 + gateway address on tun0
//! assert!(a1.ping("10.128.2.5").await);
//! ```
//! Dropping the cluster (also on panic) deletes the pod namespaces, stops each node's daemons,
//! deletes the node namespaces (which destroys every veth) and the underlay namespace.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ipnet::{Ipv4Net, Ipv6Net};
use sdn_node::apply::{converge, ApplyOptions, ApplyReport};
use sdn_node::cluster::state_file;
use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};

/// The cluster network of every state this harness writes (ClusterNetwork.network).
pub const CLUSTER_NETWORK: &str = "10.128.0.0/14";
/// The service network of every state this harness writes.
pub const SERVICE_NETWORK: &str = "172.30.0.0/16";
/// The IPv6 cluster network of a dual-stack cluster (a node given [`NodeSpec::ipv6`]).
pub const CLUSTER_NETWORK6: &str = "fd00:10:128::/48";
/// The IPv6 service network of a dual-stack cluster.
pub const SERVICE_NETWORK6: &str = "fd00:172:30::/112";
/// The underlay subnet the node IPs ([`NodeSpec::host_ip`]) are in.
pub const UNDERLAY_PREFIX: u8 = 24;
/// The prefix of an IPv6 underlay (node IPs given as IPv6 addresses).
pub const UNDERLAY_PREFIX6: u8 = 64;
/// MTU of the pods' interfaces and tun0: the underlay's 1500 less VXLAN's 50 bytes, as
/// openshift-sdn sets it (a full-size inner frame would not fit the underlay veth).
pub const POD_MTU: u32 = 1450;

/// Bound for each external command (ip, ovs-vsctl, ovs-appctl, converge).
const CMD_BOUND: Duration = Duration::from_secs(30);
/// Bound for waits on OVS state (routes learnt from the kernel, ports).
const WAIT: Duration = Duration::from_secs(20);
/// Safety net around one `ping` run, which bounds itself with `-c` and `-W`.
const PING_BOUND: Duration = Duration::from_secs(30);

static NEXT_CLUSTER: AtomicU32 = AtomicU32::new(0);

/// True when the test may run: root. Without root it panics when `CI` is set and otherwise
/// prints (to the real stderr, past the test harness's capture) why it skips.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("{test}: needs root (network namespaces, veth pairs) and CI is set: not skipping");
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: needs root to create network namespaces and veth pairs; CI would fail here"
    );
    false
}

/// Runs a command to completion (bounded); panics with its stderr if it fails.
pub async fn run(args: &[&str]) -> String {
    let (ok, out, err) = run_status(args).await;
    assert!(ok, "{args:?} failed: {}{}", err.trim(), out.trim());
    out
}

/// Runs a command to completion (bounded): (success, stdout, stderr).
pub async fn run_status(args: &[&str]) -> (bool, String, String) {
    let child = tokio::process::Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()).kill_on_drop(true).output();
    let out = tokio::time::timeout(CMD_BOUND, child)
        .await
        .unwrap_or_else(|_| panic!("{args:?} did not end within {CMD_BOUND:?}"))
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ip -n NS ARGS` (ARGS split at whitespace).
pub async fn ip_in(ns: &str, args: &str) -> String {
    let mut v = vec!["ip", "-n", ns];
    v.extend(args.split_whitespace());
    run(&v).await
}

/// Writes `value` to `/proc/sys/<key>` inside namespace `ns`.
async fn sysctl_in(ns: &str, key: &str, value: &str) {
    let script = format!("echo {value} > /proc/sys/{key}");
    run(&["ip", "netns", "exec", ns, "sh", "-c", &script]).await;
}

/// A network namespace; deleted on drop (which destroys the veth ends in it).
pub struct Netns(pub String);

impl Netns {
    pub async fn add(name: String) -> Netns {
        run(&["ip", "netns", "add", &name]).await;
        Netns(name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        match std::process::Command::new("ip").args(["netns", "del", &self.0]).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("cleanup: ip netns del {}: {}", self.0, String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => eprintln!("cleanup: ip netns del {}: {e}", self.0),
        }
    }
}

/// Runs `f` on a fresh thread that has entered network namespace `ns` (`setns`, which a
/// thread of a multi-threaded process may do for network namespaces). Sockets created by `f`
/// belong to `ns` for good, also when used from other threads afterwards.
pub async fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    use std::os::fd::AsRawFd;
    let path = format!("/run/netns/{ns}");
    let handle = std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: setns on a valid namespace fd; it affects only this thread, which ends
        // when `f` returns.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    });
    tokio::task::spawn_blocking(move || handle.join())
        .await
        .expect("join helper")
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// What one `ping` run did.
#[derive(Debug, Clone)]
pub struct PingResult {
    /// ping's exit code: 0 = answered, 1 = no answer, 2 = error.
    pub code: Option<i32>,
    pub output: String,
}

impl PingResult {
    /// At least one echo reply came back.
    pub fn answered(&self) -> bool {
        self.code == Some(0)
    }
    /// Ran fine, but no reply came back (exit 1, not an error).
    pub fn unanswered(&self) -> bool {
        self.code == Some(1)
    }
}

/// `ping -n -c1 -W2 DST` inside namespace `ns` (one echo request, two seconds for its reply).
pub async fn ping_in(ns: &str, dst: &str) -> PingResult {
    let child = tokio::process::Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-n", "-c1", "-W2", dst])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PING_BOUND, child)
        .await
        .unwrap_or_else(|_| panic!("ping in {ns} did not end within {PING_BOUND:?}"))
        .expect("run ping (install iputils-ping)");
    PingResult {
        code: out.status.code(),
        output: format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    }
}

/// One node of a cluster to start.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Short name ("a"): the netns suffix; the node is `node-<name>` in the state.
    pub name: String,
    /// The HostSubnet's hostIP: the node's underlay address (IPv4, or IPv6 for an IPv6 underlay), on br-phy.
    pub host_ip: IpAddr,
    /// The HostSubnet's subnet; its first address is the gateway on tun0.
    pub subnet: Ipv4Net,
    /// The node's IPv6 subnet (dual-stack): its pods get an IPv6 address too, tun0 its
    /// first address.
    pub subnet6: Option<Ipv6Net>,
    /// An IPv6-only node ([`NodeSpec::ipv6_only`]): `subnet` only numbers its pods (a pod
    /// given 10.128.0.5 gets the IPv6 address with host part 5, and no IPv4 address); the
    /// state, tun0 and the pods have IPv6 alone.
    pub ipv6_only: bool,
}

impl NodeSpec {
    pub fn new(name: &str, host_ip: &str, subnet: &str) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            host_ip: host_ip.parse().expect("host IP"),
            subnet: subnet.parse().expect("subnet CIDR"),
            subnet6: None,
            ipv6_only: false,
        }
    }
    /// IPv6-only: the node's only subnet is `subnet6` (inside [`CLUSTER_NETWORK6`]); see
    /// [`NodeSpec::ipv6_only`](field@NodeSpec::ipv6_only). Every node of a cluster is, or none.
    pub fn ipv6_only(mut self, subnet6: &str) -> NodeSpec {
        self.subnet6 = Some(subnet6.parse().expect("IPv6 subnet CIDR"));
        self.ipv6_only = true;
        self
    }
    /// Dual-stack: the node's IPv6 subnet (inside [`CLUSTER_NETWORK6`]).
    pub fn ipv6(mut self, subnet6: &str) -> NodeSpec {
        self.subnet6 = Some(subnet6.parse().expect("IPv6 subnet CIDR"));
        self
    }
    /// The IPv6 gateway (tun0) address: the IPv6 subnet's first address after the network's.
    pub fn gateway6(&self) -> Option<Ipv6Addr> {
        self.subnet6.map(|s| Ipv6Addr::from(u128::from(s.network()) + 1))
    }
    /// `node-<name>`: the HostSubnet's host and the state's `node:`.
    pub fn host(&self) -> String {
        format!("node-{}", self.name)
    }
    /// The gateway (tun0) address: the subnet's first host address.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet.network()) + 1)
    }
    /// br-phy's fixed MAC: 02:00:<host IP>.
    pub fn phy_mac(&self) -> String {
        let o: [u8; 4] = match self.host_ip {
            IpAddr::V4(ip) => ip.octets(),
            IpAddr::V6(ip) => ip.octets()[12..].try_into().expect("four bytes"),
        };
        format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
    }
}

/// The MAC openshift-sdn gives a pod: 0a:58:<IP>.
pub fn pod_mac(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

/// An IPv6-only pod's MAC: 0a:58: and the address's last four bytes.
pub fn pod_mac6(ip: Ipv6Addr) -> String {
    let o = ip.octets();
    format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[12], o[13], o[14], o[15])
}

/// A pod: its namespace and interface. Plain data (cheap to clone); the namespace itself is
/// owned by its [`Node`] and deleted with it.
#[derive(Clone, Debug)]
pub struct Pod {
    /// The node's short name.
    pub node: String,
    /// Kubernetes namespace and name.
    pub namespace: String,
    pub name: String,
    /// The pod's network namespace (eth0 inside).
    pub netns: String,
    /// The host end of the veth, in the node's namespace: the OVS port name (`hostVeth`).
    pub host_veth: String,
    /// The pod's IPv4 address; on an IPv6-only node only the harness's number for it (the pod
    /// has no IPv4 address: see `ipv6_only`).
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address on a dual-stack or IPv6-only node: the IPv6 subnet's address
    /// with the same host part as `ip` (10.128.0.5 -> fd00:10:128:1::5).
    pub ip6: Option<Ipv6Addr>,
    /// The pod is on an IPv6-only node: `ip6` is its only address.
    pub ipv6_only: bool,
    pub mac: String,
    pub container_id: String,
}

impl Pod {
    /// One `ping -c1 -W2` from the pod: did a reply come back?
    pub async fn ping(&self, dst: impl std::fmt::Display) -> bool {
        self.ping_result(dst).await.answered()
    }

    /// One `ping -c1 -W2` from the pod, with its exit code and output.
    pub async fn ping_result(&self, dst: impl std::fmt::Display) -> PingResult {
        ping_in(&self.netns, &dst.to_string()).await
    }

    /// Spoofguard's question: `ip` is put on the pod's eth0 beside its own address (`prefix`
    /// long, no DAD for IPv6), and one ping to `dst` is sent from it.
    pub async fn ping_from(&self, ip: &str, prefix: u8, dst: impl std::fmt::Display) -> PingResult {
        let nodad = if ip.contains(':') { " nodad" } else { "" };
        ip_in(&self.netns, &format!("addr add {ip}/{prefix} dev eth0{nodad}")).await;
        let out = tokio::process::Command::new("ip")
            .args(["netns", "exec", &self.netns, "ping", "-n", "-c1", "-W2", "-I", ip, &dst.to_string()])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(PING_BOUND, out).await.expect("ping ends").expect("run ping");
        PingResult {
            code: out.status.code(),
            output: format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        }
    }

    /// A TCP listener on `0.0.0.0:port` inside the pod (non-blocking, ready for
    /// `tokio::net::TcpListener::from_std`).
    pub async fn tcp_listen(&self, port: u16) -> std::net::TcpListener {
        self.tcp_listen_on(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port).await
    }

    /// A TCP listener on `[::]:port` inside the pod (IPv6 only).
    pub async fn tcp_listen6(&self, port: u16) -> std::net::TcpListener {
        self.tcp_listen_on(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port).await
    }

    async fn tcp_listen_on(&self, addr: IpAddr, port: u16) -> std::net::TcpListener {
        let l = in_netns(&self.netns, move || std::net::TcpListener::bind((addr, port)))
            .await
            .unwrap_or_else(|e| panic!("listen on {}:{port} in {}: {e}", self.ip, self.netns));
        l.set_nonblocking(true).expect("non-blocking listener");
        l
    }

    /// A TCP connection from the pod to `dst:port` (bounded by `timeout`; non-blocking, ready
    /// for `tokio::net::TcpStream::from_std`).
    pub async fn tcp_connect(
        &self,
        dst: impl Into<IpAddr>,
        port: u16,
        timeout: Duration,
    ) -> std::io::Result<std::net::TcpStream> {
        let addr = std::net::SocketAddr::from((dst.into(), port));
        let s = in_netns(&self.netns, move || std::net::TcpStream::connect_timeout(&addr, timeout)).await?;
        s.set_nonblocking(true)?;
        Ok(s)
    }

    /// The pod's entry in a state file's `pods:`.
    pub fn state_entry(&self) -> String {
        if let (true, Some(ip6)) = (self.ipv6_only, self.ip6) {
            return format!(
                "  - {{namespace: {}, name: {}, containerID: \"{}\", hostVeth: {}, ip: \"{ip6}\", mac: \"{}\"}}\n",
                self.namespace, self.name, self.container_id, self.host_veth, self.mac
            );
        }
        let ips = self.ip6.map(|ip6| format!(", ips: [{}, \"{ip6}\"]", self.ip)).unwrap_or_default();
        format!(
            "  - {{namespace: {}, name: {}, containerID: \"{}\", hostVeth: {}, ip: {}{ips}, mac: \"{}\"}}\n",
            self.namespace, self.name, self.container_id, self.host_veth, self.ip, self.mac
        )
    }
}

/// One node: a namespace with its own ovsdb-server and ovs-vswitchd, br-phy on the underlay,
/// and the agent's br0 once [`apply`](Node::apply) has run.
pub struct Node {
    // Drop order: the pod namespaces (and with them the pods' veths) go first, then the
    // sandbox stops its daemons and deletes the node namespace.
    pod_ns: Vec<Netns>,
    pods: Vec<Pod>,
    pub sb: OvsSandbox,
    pub spec: NodeSpec,
    /// The node's network namespace.
    pub netns: String,
    /// vswitchd's unixctl socket (`ovs-appctl -t`).
    pub ctl: PathBuf,
    index: u32,
}

impl Node {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The pods added so far, in order.
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    /// `ovs-appctl -t <this node's vswitchd> ARGS`; panics if it fails.
    pub async fn appctl(&self, args: &[&str]) -> String {
        let ctl = self.ctl.to_str().expect("utf-8 path").to_string();
        let mut v = vec!["ovs-appctl", "-t", &ctl, "--timeout=20"];
        v.extend_from_slice(args);
        run(&v).await
    }

    async fn appctl_status(&self, args: &[&str]) -> (bool, String, String) {
        let ctl = self.ctl.to_str().expect("utf-8 path").to_string();
        let mut v = vec!["ovs-appctl", "-t", &ctl, "--timeout=20"];
        v.extend_from_slice(args);
        run_status(&v).await
    }

    /// `ovs-vsctl --db=<this node's db> --timeout=20 ARGS` (waits for vswitchd to apply the
    /// change); panics if it fails.
    pub async fn vsctl(&self, args: &[&str]) -> String {
        let db = format!("--db={}", self.sb.db_socket());
        let mut v = vec!["ovs-vsctl", &db, "--timeout=20"];
        v.extend_from_slice(args);
        run(&v).await
    }

    /// `ovs-ofctl -O OpenFlow13 ARGS BRIDGE-MGMT ...`: the bridge is given as `unix:` socket.
    pub async fn ofctl(&self, cmd: &str, bridge: &str, extra: &[&str]) -> String {
        let mgmt = format!("unix:{}", self.sb.mgmt_socket(bridge).display());
        let mut v = vec!["ovs-ofctl", "-O", "OpenFlow13", cmd, &mgmt];
        v.extend_from_slice(extra);
        run(&v).await
    }

    /// Creates a pod: a namespace with eth0 (IP/subnet prefix, MAC [`pod_mac`], TX checksum
    /// offload off, routes as openshift-sdn's CNI sets them: the cluster network on-link and
    /// the default route via the node's gateway) joined by a veth to the node namespace. The
    /// host end is not on br0 yet: list the pod in the node's state ([`Cluster::state_yaml`]
    /// does) and [`apply`](Node::apply) it.
    pub async fn add_pod(&mut self, namespace: &str, name: &str, ip: &str) -> Pod {
        let ip: Ipv4Addr = ip.parse().expect("pod IP");
        assert!(self.spec.subnet.contains(&ip), "{ip} is not in node {}'s subnet {}", self.name(), self.spec.subnet);
        let k = self.pods.len();
        let netns = format!("{}-p{k}", self.netns);
        self.pod_ns.push(Netns::add(netns.clone()).await);
        let host_veth = format!("veth{k}");
        let ip6 = self.spec.subnet6.map(|s6| Ipv6Addr::from(u128::from(s6.network()) + u128::from(u32::from(ip) - u32::from(self.spec.subnet.network()))));
        let v6only = self.spec.ipv6_only;
        let mac = match ip6 {
            Some(ip6) if v6only => pod_mac6(ip6),
            _ => pod_mac(ip),
        };
        let node_ns = self.netns.clone();
        // The pod end is created straight in the pod's namespace: no clash on eth0.
        ip_in(&node_ns, &format!("link add {host_veth} type veth peer name eth0 netns {netns}")).await;
        // The node's own IP stack sees the pod's frames too (the datapath reads the veth
        // through a packet socket) and would answer ARP for its addresses on any interface:
        // a switch port is not an IP interface (8 = answer for no local address).
        sysctl_in(&node_ns, &format!("net/ipv4/conf/{host_veth}/arp_ignore"), "8").await;
        // Nor is it an IPv6 interface: no link-local address, no neighbour discovery.
        sysctl_in(&node_ns, &format!("net/ipv6/conf/{host_veth}/disable_ipv6"), "1").await;
        ip_in(&node_ns, &format!("link set {host_veth} mtu {POD_MTU}")).await;
        ip_in(&node_ns, &format!("link set {host_veth} up")).await;
        ip_in(&netns, "link set lo up").await;
        ip_in(&netns, &format!("link set eth0 address {mac} mtu {POD_MTU}")).await;
        if !v6only {
            ip_in(&netns, &format!("addr add {ip}/{} dev eth0", self.spec.subnet.prefix_len())).await;
        }
        ip_in(&netns, "link set eth0 up").await;
        run(&["ip", "netns", "exec", &netns, "ethtool", "-K", "eth0", "tx", "off"]).await;
        if !v6only {
            ip_in(&netns, &format!("route add {CLUSTER_NETWORK} dev eth0")).await;
            ip_in(&netns, &format!("route add default via {}", self.spec.gateway())).await;
        }
        if let (Some(ip6), Some(s6), Some(gw6)) = (ip6, self.spec.subnet6, self.spec.gateway6()) {
            // No duplicate address detection here (hostnet's pod setup does it; these test
            // pods are the harness's own): the address is usable at once.
            ip_in(&netns, &format!("addr add {ip6}/{} dev eth0 nodad", s6.prefix_len())).await;
            ip_in(&netns, &format!("-6 route add {CLUSTER_NETWORK6} dev eth0")).await;
            ip_in(&netns, &format!("-6 route add default via {gw6}")).await;
            ip_in(&netns, "-6 route add ff00::/8 dev eth0").await;
        }
        let pod = Pod {
            node: self.name().to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            netns,
            host_veth,
            ip,
            ip6,
            ipv6_only: v6only,
            mac,
            container_id: format!("{:08x}", (self.index << 16) | k as u32).repeat(8),
        };
        self.pods.push(pod.clone());
        pod
    }

    /// Converges br0 to `state_yaml` through the agent ([`converge`], datapath netdev), then
    /// gives tun0 the gateway address of this node's subnet and routes the cluster network
    /// through it (as openshift-sdn's SetupSDN does), so the node itself takes part.
    /// Returns the report; panics if the state does not parse or converge fails.
    pub async fn apply(&self, state_yaml: &str) -> ApplyReport {
        let (state, problems) = state_file::parse(state_yaml).expect("state parses");
        assert!(problems.is_empty(), "state of node {}: {problems:?}", self.name());
        let path = self.sb.dir().join("state.yaml");
        std::fs::write(&path, state_yaml).expect("write state.yaml");
        let mut opts = ApplyOptions::new(path, self.sb.dir().to_path_buf());
        opts.bridge.datapath_type = Some(sdn_node::options::DatapathType::Netdev);
        opts.bridge.port_timeout = WAIT;
        let report = tokio::time::timeout(CMD_BOUND, converge(&opts, &state))
            .await
            .unwrap_or_else(|_| panic!("converge on node {} did not end within {CMD_BOUND:?}", self.name()))
            .unwrap_or_else(|e| panic!("converge on node {}: {e}", self.name()));
        // converge has waited for tun0's ofport: the tap exists.
        let ns = &self.netns;
        if !self.spec.ipv6_only {
            ip_in(ns, &format!("addr replace {}/{} dev tun0", self.spec.gateway(), self.spec.subnet.prefix_len())).await;
        }
        ip_in(ns, &format!("link set tun0 mtu {POD_MTU} up")).await;
        if !self.spec.ipv6_only {
            ip_in(ns, &format!("route replace {CLUSTER_NETWORK} dev tun0")).await;
        }
        if let (Some(s6), Some(gw6)) = (self.spec.subnet6, self.spec.gateway6()) {
            ip_in(ns, &format!("addr replace {gw6}/{} dev tun0 nodad", s6.prefix_len())).await;
            ip_in(ns, &format!("-6 route replace {CLUSTER_NETWORK6} dev tun0")).await;
        }
        report
    }

    /// One `ping -c1 -W2` from the node's own namespace (through tun0 for pod addresses).
    pub async fn ping(&self, dst: impl std::fmt::Display) -> bool {
        ping_in(&self.netns, &dst.to_string()).await.answered()
    }

    /// `ofproto/trace` of a flow on a bridge of this node (for diagnostics).
    pub async fn trace(&self, bridge: &str, flow: &str) -> String {
        self.appctl(&["ofproto/trace", bridge, flow]).await
    }

    /// What OVS knows about tunnels, routes and ports on this node, and br0's flows.
    pub async fn diagnostics(&self) -> String {
        let mut s = format!("===== node {} (netns {}, dir {})\n", self.name(), self.netns, self.sb.dir().display());
        for args in [
            &["dpif/show"][..],
            &["tnl/ports/show", "-v"],
            &["tnl/neigh/show"],
            &["ovs/route/show"],
            &["dpctl/dump-flows"],
        ] {
            let (_, out, err) = self.appctl_status(args).await;
            let _ = write!(s, "--- ovs-appctl {}\n{out}{err}", args.join(" "));
        }
        let (_, out, err) = run_status(&["ip", "-n", &self.netns, "-br", "addr"]).await;
        let _ = write!(s, "--- ip -br addr\n{out}{err}");
        let (_, out, err) = run_status(&["ip", "-n", &self.netns, "route"]).await;
        let _ = write!(s, "--- ip route\n{out}{err}");
        if self.sb.mgmt_socket("br0").exists() {
            let mgmt = format!("unix:{}", self.sb.mgmt_socket("br0").display());
            let (_, out, err) = run_status(&["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", &mgmt]).await;
            let _ = write!(s, "--- ovs-ofctl dump-flows br0\n{out}{err}");
        }
        s
    }
}

/// Several nodes sharing one underlay L2 segment.
pub struct Cluster {
    // Drop order: nodes first (pods, daemons, node namespaces and with them the underlay
    // veths), then the underlay namespace.
    nodes: Vec<Node>,
    _underlay: Netns,
    /// `sdn-n<pid>-<counter>`: the prefix of every namespace of this cluster.
    pub prefix: String,
}

impl Cluster {
    /// Starts every node and wires the underlay; `None` (after printing why) when not root
    /// and CI is unset. Panics on any failure (what was started is cleaned up).
    pub async fn start(test: &str, specs: &[NodeSpec]) -> Option<Cluster> {
        if !root_or_skip(test) {
            return None;
        }
        let prefix = format!("sdn-n{}-{}", std::process::id(), NEXT_CLUSTER.fetch_add(1, Ordering::Relaxed));
        let underlay = Netns::add(format!("{prefix}-ul")).await;
        ip_in(&underlay.0, "link add ul type bridge").await;
        ip_in(&underlay.0, "link set ul up").await;
        let mut cluster = Cluster { nodes: Vec::new(), _underlay: underlay, prefix };
        for (i, spec) in specs.iter().enumerate() {
            assert!(
                cluster.nodes.iter().all(|n| n.spec.name != spec.name && n.spec.host_ip != spec.host_ip),
                "node names and IPs must be unique"
            );
            let node = cluster.start_node(i as u32, spec.clone()).await;
            cluster.nodes.push(node);
        }
        // Every node knows every other one: a route through br-phy in ovs-router (learnt from
        // the kernel, asynchronously: bounded wait), and the peer's MAC in the tunnel
        // neighbour cache (seeded, so no packet waits for OVS's own ARP).
        for node in &cluster.nodes {
            for peer in cluster.nodes.iter().filter(|p| p.spec.name != node.spec.name) {
                let peer_ip = peer.spec.host_ip.to_string();
                let deadline = Instant::now() + WAIT;
                loop {
                    let (ok, out, err) = node.appctl_status(&["ovs/route/lookup", &peer_ip]).await;
                    if ok && out.contains("dev br-phy") {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "node {}: ovs-router has no route to {peer_ip} through br-phy after {WAIT:?}: {out}{err}\n{}",
                        node.name(),
                        node.appctl(&["ovs/route/show"]).await
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                node.appctl(&["tnl/neigh/set", "br-phy", &peer_ip, &peer.spec.phy_mac()]).await;
            }
        }
        Some(cluster)
    }

    async fn start_node(&self, index: u32, spec: NodeSpec) -> Node {
        let netns = format!("{}-{}", self.prefix, spec.name);
        let sb = OvsSandbox::start(SandboxOptions { netns: Some(netns.clone()), ..Default::default() })
            .await
            .unwrap_or_else(|e| panic!("start the sandbox of node {} in {netns}: {e}", spec.name));
        let pid = sb.vswitchd_pid().expect("vswitchd runs");
        let ctl = sb.dir().join(format!("ovs-vswitchd.{pid}.ctl"));
        let node = Node { pod_ns: Vec::new(), pods: Vec::new(), sb, spec, netns, ctl, index };
        let ns = node.netns.clone();
        let ul = &self._underlay.0;
        // br-phy: the underlay bridge, standalone (its default NORMAL flow), with a fixed MAC.
        let hwaddr = format!("other-config:hwaddr=\"{}\"", node.spec.phy_mac());
        node.vsctl(&["add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev", &hwaddr]).await;
        // The underlay link: ul0 in the node, n<index> on the underlay bridge.
        let peer = format!("n{index}");
        ip_in(ul, &format!("link add {peer} type veth peer name ul0 netns {ns}")).await;
        ip_in(ul, &format!("link set {peer} master ul")).await;
        ip_in(ul, &format!("link set {peer} up")).await;
        // The kernel sees ul0's frames too: it must not answer ARP there, nor take IP packets
        // in through it (strict rp_filter: the peers are routed through br-phy, not ul0).
        sysctl_in(&ns, "net/ipv4/conf/ul0/arp_ignore", "8").await;
        sysctl_in(&ns, "net/ipv4/conf/ul0/rp_filter", "1").await;
        sysctl_in(&ns, "net/ipv6/conf/ul0/disable_ipv6", "1").await;
        ip_in(&ns, "link set ul0 up").await;
        node.vsctl(&["add-port", "br-phy", "ul0"]).await;
        // ovs-vsctl waited for vswitchd to apply the change: the br-phy tap exists.
        match node.spec.host_ip {
            IpAddr::V4(ip) => ip_in(&ns, &format!("addr add {ip}/{UNDERLAY_PREFIX} dev br-phy")).await,
            // An IPv6 underlay: no duplicate address detection on the node's own address.
            IpAddr::V6(ip) => ip_in(&ns, &format!("addr add {ip}/{UNDERLAY_PREFIX6} dev br-phy nodad")).await,
        };
        ip_in(&ns, "link set br-phy up").await;
        node
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node with short name `name`; panics if there is none.
    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.spec.name == name).unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.spec.name == name).unwrap_or_else(|| panic!("no node {name}"))
    }

    /// The state file of node `name`: `node:` itself, the plugin, every node's HostSubnet, the
    /// given netNamespaces (name, netid) and the pods added to that node so far.
    pub fn state_yaml(&self, name: &str, plugin: &str, net_namespaces: &[(&str, u32)]) -> String {
        let node = self.node(name);
        let dual = self.nodes.iter().any(|n| n.spec.subnet6.is_some());
        let v6only = self.nodes.iter().all(|n| n.spec.ipv6_only);
        let mut s = if v6only {
            format!(
                "node: {}\nplugin: {plugin}\nclusterNetwork: \"{CLUSTER_NETWORK6}\"\nserviceNetwork: \"{SERVICE_NETWORK6}\"\nhostSubnets:\n",
                node.spec.host()
            )
        } else if dual {
            format!(
                "node: {}\nplugin: {plugin}\nclusterNetworks: [{CLUSTER_NETWORK}, \"{CLUSTER_NETWORK6}\"]\nserviceNetworks: [{SERVICE_NETWORK}, \"{SERVICE_NETWORK6}\"]\nhostSubnets:\n",
                node.spec.host()
            )
        } else {
            format!(
                "node: {}\nplugin: {plugin}\nclusterNetwork: {CLUSTER_NETWORK}\nserviceNetwork: {SERVICE_NETWORK}\nhostSubnets:\n",
                node.spec.host()
            )
        };
        for n in &self.nodes {
            match n.spec.subnet6 {
                Some(s6) if v6only => {
                    let _ = writeln!(s, "  - {{host: {}, hostIP: {}, subnet: \"{s6}\"}}", n.spec.host(), n.spec.host_ip);
                }
                Some(s6) => {
                    let _ = writeln!(s, "  - {{host: {}, hostIP: {}, subnets: [{}, \"{s6}\"]}}", n.spec.host(), n.spec.host_ip, n.spec.subnet);
                }
                None => {
                    let _ = writeln!(s, "  - {{host: {}, hostIP: {}, subnet: {}}}", n.spec.host(), n.spec.host_ip, n.spec.subnet);
                }
            }
        }
        s.push_str("netNamespaces:\n");
        for (ns, id) in net_namespaces {
            let _ = writeln!(s, "  - {{name: {ns}, netid: {id}}}");
        }
        if node.pods.is_empty() {
            s.push_str("pods: []\n");
        } else {
            s.push_str("pods:\n");
            for p in &node.pods {
                s.push_str(&p.state_entry());
            }
        }
        s
    }

    /// Applies every node's state with multicast on (NetNamespace `multicast: true`) for the
    /// namespaces `multicast` names.
    pub async fn apply_with_multicast(&self, plugin: &str, net_namespaces: &[(&str, u32)], multicast: &[&str]) {
        for n in &self.nodes {
            let mut yaml = self.state_yaml(n.name(), plugin, net_namespaces);
            for (ns, id) in net_namespaces.iter().filter(|(ns, _)| multicast.contains(ns)) {
                let plain = format!("{{name: {ns}, netid: {id}}}");
                assert!(yaml.contains(&plain), "{plain} in {yaml}");
                yaml = yaml.replace(&plain, &format!("{{name: {ns}, netid: {id}, multicast: true}}"));
            }
            n.apply(&yaml).await;
        }
    }

    /// Applies [`state_yaml`](Self::state_yaml) on every node; panics unless each report is
    /// clean (no problems, no warnings) and added every pod's port.
    pub async fn apply_all(&self, plugin: &str, net_namespaces: &[(&str, u32)]) {
        for n in &self.nodes {
            let report = n.apply(&self.state_yaml(n.name(), plugin, net_namespaces)).await;
            assert!(report.problems.is_empty() && report.warnings.is_empty(), "node {}: {report:?}", n.name());
            assert_eq!(report.ports_added, n.pods.len(), "node {}: {report:?}", n.name());
        }
    }

    /// [`Node::diagnostics`] of every node.
    pub async fn diagnostics(&self) -> String {
        let mut s = String::new();
        for n in &self.nodes {
            s.push_str(&n.diagnostics().await);
        }
        s
    }

    /// Asserts that `from` gets an answer from `dst`; on failure the message carries the ping
    /// output and every node's diagnostics.
    pub async fn assert_reaches(&self, from: &Pod, dst: impl std::fmt::Display, what: &str) {
        let r = from.ping_result(&dst).await;
        if !r.answered() {
            panic!(
                "{what}: {} -> {dst}: expected a reply; ping exited {:?}:\n{}\n{}",
                from.ip,
                r.code,
                r.output,
                self.diagnostics().await
            );
        }
    }

    /// Asserts that `from` gets no answer from `dst` (ping ran fine: exit 1, not an error).
    pub async fn assert_isolated(&self, from: &Pod, dst: impl std::fmt::Display, what: &str) {
        let r = from.ping_result(&dst).await;
        if !r.unanswered() {
            panic!(
                "{what}: {} -> {dst}: expected no reply; ping exited {:?}:\n{}\n{}",
                from.ip,
                r.code,
                r.output,
                self.diagnostics().await
            );
        }
    }
}

/// A TCP echo server on `l` (each connection echoed until it closes), aborted with its handle.
pub fn tcp_echo(l: std::net::TcpListener) -> tokio::task::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::from_std(l).expect("tokio listener");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    })
}

/// The namespaces of [`TeamPods`]: default (VNID 0), team-a (11), team-b (12).
pub const TEAM_NAMESPACES: [(&str, u32); 3] = [("default", 0), ("team-a", 11), ("team-b", 12)];

/// Five pods on two nodes, as the per-family tests (dual-stack, IPv6-only) place them.
pub struct TeamPods {
    /// team-a on node-a.
    pub a1: Pod,
    /// team-a on node-a, a second one.
    pub a3: Pod,
    /// default on node-a.
    pub d1: Pod,
    /// team-a on node-b.
    pub a2: Pod,
    /// team-b on node-b.
    pub b1: Pod,
}

impl TeamPods {
    /// Starts nodes `a` and `b` of `specs` (node a's pods at 10.128.0.5-7, node b's at
    /// 10.128.2.5-6, so their subnets are 10.128.0.0/23 and 10.128.2.0/23 as numbering plans),
    /// adds the five pods and applies every node's state with [`TEAM_NAMESPACES`].
    pub async fn start(test: &str, plugin: &str, specs: [NodeSpec; 2]) -> Option<(Cluster, TeamPods)> {
        let mut c = Cluster::start(test, &specs).await?;
        let a = c.node_mut("a");
        let a1 = a.add_pod("team-a", "a1", "10.128.0.5").await;
        let a3 = a.add_pod("team-a", "a3", "10.128.0.6").await;
        let d1 = a.add_pod("default", "d1", "10.128.0.7").await;
        let b = c.node_mut("b");
        let a2 = b.add_pod("team-a", "a2", "10.128.2.5").await;
        let b1 = b.add_pod("team-b", "b1", "10.128.2.6").await;
        c.apply_all(plugin, &TEAM_NAMESPACES).await;
        Some((c, TeamPods { a1, a3, d1, a2, b1 }))
    }
}
