//! `sdn-bench pods`: whole pod setups and teardowns on the production path, measured side
//! by side with the seed's way and with the switch's limit, in one run, alternating.
//!
//! - **agent**: a real `sdn-node run` (child process; by default inside the network namespace
//!   of a private netdev switch, as tests/support/cninode.rs runs it) and every ADD/DEL through
//!   the real `sdn-node-cni` binary, exec'd with the CNI environment and the network
//!   configuration on stdin as container runtimes do: IPAM, netns + veth + address, port,
//!   ofport wait, flows.
//! - **seed**: the same netns/veth/address work through the hostnet crate, then
//!   `ovs-vsctl add-port … -- get Interface … ofport` and `ovs-ofctl --bundle add-flows` with
//!   setupPodFlows' text (see [`super::seed`]; DEL: cleanup text, `del-port`, veth).
//! - **limit**: the same netns/veth/address work, then one raw OVSDB transaction, an ofport
//!   wait on an open monitor, and one pre-encoded bundle (see [`super::limit`]).
//!
//! Each variant has its own switch (private sandboxes, each in its own network namespace) or,
//! with `--ovs-rundir`, its own bridge on that switch (the agent owns `br0` and removes ports
//! it does not know there, so the baselines use `bpseed` and `bplimit`). Each starts with M
//! base pods: through the agent's CNI for the agent (bounded concurrency), and for the
//! baselines the cheapest way to the same bridge size: M veth pairs over one netlink socket, one
//! OVSDB transaction adding their ports, one bundle of the base pipeline and their flows.
//! Pod network namespaces are created before any clock starts (a runtime creates them before
//! calling CNI).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use super::limit::{self, OfportWatch, RawMux};
use super::{quantile, seed, workload, BenchError, Memory};
use sdn_node::domain::{OfPort, Vnid};
use sdn_node::ovsdb::{BridgeOptions, Ovs, OvsdbClient};
use sdn_node::pipeline::pod::PodPort;
use sdn_node::pipeline::{base, policy};
use crate::sandbox::{OvsSandbox, SandboxOptions};
use sdn_node::store::{diff, DesiredState, InstalledState, Owner};

/// Namespaces the pods spread over (netids 100..).
const NAMESPACES: u32 = 5;
const MTU: u32 = 1450;
/// Bound of every readiness wait.
const WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Debug)]
pub struct PodsOptions {
    pub base_pods: u32,
    pub ops: u32,
    pub concurrency: u32,
    /// Use this running switch (agent on `br0`, baselines on `bpseed`/`bplimit`, all in the
    /// current network namespace, the agent with `--no-host-network`).
    pub ovs_rundir: Option<PathBuf>,
    /// The `sdn-node` binary to run as the agent.
    pub node_bin: PathBuf,
    /// The `sdn-node-cni` plugin binary.
    pub cni_bin: PathBuf,
    /// Concurrent CNI ADDs while installing the agent's base pods.
    pub install_concurrency: usize,
    /// The agent's `--warm-ports` (0: every ADD adds its own port). Before every timed
    /// operation the bench waits until the pool is full again, so that its refill (one
    /// ovs-vswitchd reconfiguration) never runs inside another variant's measurement.
    pub warm_ports: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PodsSerial {
    pub agent_p50_ms: f64,
    pub agent_p99_ms: f64,
    pub seed_p50_ms: f64,
    pub limit_p50_ms: f64,
    pub ratio_vs_seed: f64,
    pub ratio_vs_limit: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PodsBurst {
    pub concurrency: u32,
    pub agent_s: f64,
    pub seed_s: f64,
    pub limit_s: f64,
    pub ratio_vs_seed: f64,
    pub ratio_vs_limit: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PodsDel {
    pub agent_p50_ms: f64,
    pub seed_p50_ms: f64,
    pub limit_p50_ms: f64,
    pub ratio_vs_seed: f64,
    pub ratio_vs_limit: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PodsReport {
    pub base_pods: u32,
    /// The agent's `--warm-ports`.
    pub warm_ports: usize,
    pub serial: PodsSerial,
    pub burst: PodsBurst,
    pub del: PodsDel,
    pub memory: Memory,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fail(m: impl std::fmt::Display) -> BenchError {
    BenchError::Baseline(m.to_string())
}

fn run_cmd(mut c: Command, stdin: Option<&[u8]>) -> Result<String, BenchError> {
    use std::io::Write;
    let desc = format!("{c:?}");
    let mut child = c
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("{desc}: {e}")))?;
    if let (Some(input), Some(mut w)) = (stdin, child.stdin.take()) {
        w.write_all(input)?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(fail(format!(
            "{desc} failed: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Network namespaces created here; deleted on drop.
#[derive(Default)]
struct NsSet(Vec<String>);

impl NsSet {
    /// Creates each namespace (netlink and a bind mount, as `ip netns add` does; off the async
    /// thread: the runtime keeps answering the switches meanwhile); returns their paths.
    async fn add(&mut self, names: Vec<String>) -> Result<Vec<String>, BenchError> {
        let todo = names.clone();
        let (done, res) = tokio::task::spawn_blocking(move || {
            let mut done = Vec::new();
            for n in todo {
                if let Err(e) = hostnet::Netns::create_named(&n) {
                    return (done, Err(e));
                }
                done.push(n);
            }
            (done, Ok(()))
        })
        .await
        .map_err(|_| fail("netns creation thread died"))?;
        self.0.extend(done);
        res?;
        Ok(names.iter().map(|n| format!("{}/{n}", hostnet::netns::NETNS_DIR)).collect())
    }
}

impl Drop for NsSet {
    fn drop(&mut self) {
        for n in self.0.drain(..) {
            let _ = hostnet::Netns::remove_named(&n);
        }
    }
}

/// Where one variant runs: a switch directory, a bridge, the network namespace of the switch
/// (and of the host ends of the pods' veths).
struct Site {
    _sandbox: Option<OvsSandbox>,
    dir: PathBuf,
    ns: Option<String>,
    bridge: String,
    env: Vec<(String, String)>,
}

impl Site {
    async fn private(tag: &str) -> Result<Site, BenchError> {
        let ns = format!("sdnbp{}-{tag}", std::process::id());
        let sb = OvsSandbox::start(SandboxOptions { netns: Some(ns.clone()), ..Default::default() }).await?;
        let dir = sb.dir().to_path_buf();
        let env = sb.ovs_env();
        Ok(Site { _sandbox: Some(sb), dir, ns: Some(ns), bridge: "br0".into(), env })
    }

    fn attached(dir: &Path, bridge: &str) -> Site {
        let env = ["OVS_RUNDIR", "OVS_LOGDIR", "OVS_DBDIR", "OVS_SYSCONFDIR"]
            .iter()
            .map(|k| (k.to_string(), dir.display().to_string()))
            .collect();
        Site { _sandbox: None, dir: dir.to_path_buf(), ns: None, bridge: bridge.into(), env }
    }

    fn host_ns(&self) -> Result<hostnet::Netns, BenchError> {
        Ok(match &self.ns {
            Some(n) => hostnet::Netns::open(format!("/var/run/netns/{n}"))?,
            None => hostnet::Netns::current()?,
        })
    }

    fn mgmt(&self) -> PathBuf {
        self.dir.join(format!("{}.mgmt", self.bridge))
    }

    fn db(&self) -> String {
        format!("unix:{}", self.dir.join("db.sock").display())
    }

}

// ---------------------------------------------------------------------------------------
// Pods of the baselines.

/// Baseline pod `i`: veth `v<tag>%011x` (peer of a base pod: `p<tag>%011x`; the tag keeps two
/// baselines apart when they share a namespace), IP 10.128.0.10 + i, ofport 10 + i (requested by the
/// limit; the seed takes what OVS gives), VNID 100 + i % 5.
fn bpod(tag: char, i: u32) -> (String, PodPort) {
    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 10)) + i);
    let cid = workload::pod(i).1.container_id;
    let p = PodPort {
        ip6: None,
        ofport: OfPort(10 + i),
        ip: Some(ip),
        mac: sdn_node::domain::pod_mac(ip),
        container_id: cid,
        vnid: Vnid::new(100 + i % NAMESPACES).unwrap_or(Vnid::GLOBAL),
    };
    (format!("v{tag}{i:011x}"), p)
}

fn pod_config(veth: &str, p: &PodPort) -> hostnet::PodConfig {
    let node = workload::node4();
    let ip = p.ip.unwrap_or(Ipv4Addr::UNSPECIFIED);
    hostnet::PodConfig {
        ifname: "eth0".into(),
        mac: Some(p.mac),
        mtu: MTU,
        ipv4: Some(hostnet::PodIpv4 {
            address: ipnet::Ipv4Net::new(ip, node.local_subnet.prefix_len()).unwrap_or_default(),
            gateway: node.gateway(),
            cluster_network: node.cluster_network,
            extra_routes: vec![],
        }),
        host_ifname: Some(veth.to_string()),
        ipv6: None,
    }
}

/// The agent's netns/veth/address work for one pod (open the sandbox, veth, address, routes,
/// arp_ignore on the host end).
async fn net_setup(host: &hostnet::Netns, netns: &str, veth: &str, p: &PodPort) -> Result<(), BenchError> {
    let pod_ns = hostnet::Netns::open(netns)?;
    hostnet::setup_pod(host, &pod_ns, &pod_config(veth, p)).await?;
    let v = veth.to_string();
    host.run("arp_ignore", move || hostnet::sysctl::write(&["net", "ipv4", "conf", &v, "arp_ignore"], "8")).await?;
    Ok(())
}

fn pod_owner(i: u32) -> Owner {
    Owner::Pod { namespace: format!("ns-{}", i % NAMESPACES), name: format!("pod-{i}") }
}

fn add_bodies(i: u32, p: &PodPort) -> Result<Vec<Bytes>, BenchError> {
    let c = pod_owner(i).cookie(1);
    sdn_node::pipeline::pod::flows(p).into_iter().map(|f| sdn_node::switch::flow_mod_body(&f.add(c)).map_err(BenchError::from)).collect()
}

fn del_bodies(i: u32, p: &PodPort) -> Result<Vec<Bytes>, BenchError> {
    let c = pod_owner(i).cookie(1);
    sdn_node::pipeline::pod::flows(p)
        .into_iter()
        .map(|f| {
            let fm = openflow::FlowMod::delete_strict(f.table.id(), f.priority, f.match_).with_cookie(c, u64::MAX);
            sdn_node::switch::flow_mod_body(&fm).map_err(BenchError::from)
        })
        .collect()
}

/// A baseline's switch connections.
struct Baseline {
    tag: char,
    site: Site,
    host: hostnet::Netns,
    client: OvsdbClient,
    bridge_uuid: String,
    watch: OfportWatch,
    mux: Arc<RawMux>,
}

impl Baseline {
    async fn open(tag: char, site: Site) -> Result<Baseline, BenchError> {
        // No inactivity probe: a benchmark's connection to a private server.
        let copts = sdn_node::ovsdb::ClientOptions { probe_interval: None, ..Default::default() };
        let client = OvsdbClient::connect_with(&site.db(), copts).await?;
        let opts = BridgeOptions { datapath_type: "netdev".into(), ..Default::default() };
        Ovs::new(client.clone()).ensure_bridge(&site.bridge, &opts).await?;
        let t = Instant::now();
        while tokio::net::UnixStream::connect(site.mgmt()).await.is_err() {
            if t.elapsed() > WAIT {
                return Err(fail(format!("{} never accepted connections", site.mgmt().display())));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let bridge_uuid = limit::bridge_uuid(&client, &site.bridge).await?;
        let watch = OfportWatch::start(&client).await?;
        let mux = RawMux::connect(&site.mgmt()).await?;
        let host = site.host_ns()?;
        Ok(Baseline { tag, site, host, client, bridge_uuid, watch, mux })
    }

    /// M base pods the cheap way: veth pairs over one netlink socket, their ports in one OVSDB
    /// transaction (waiting for every ofport), the base pipeline and their flows in one bundle.
    async fn install_base(&self, m: u32) -> Result<(), BenchError> {
        if m == 0 {
            return Ok(());
        }
        let pairs: Vec<(String, String)> = (0..m).map(|i| (self.pod(i).0, format!("p{}{i:011x}", self.tag))).collect();
        hostnet::add_veth_pairs(&self.host, &pairs, MTU).await?;
        let ports: Vec<(String, u32)> = (0..m).map(|i| (self.pod(i).0, self.pod(i).1.ofport.0)).collect();
        let waits = ports.iter().map(|(n, _)| self.watch.expect(n)).collect::<Result<Vec<_>, _>>()?;
        self.client.transact("Open_vSwitch", limit::add_ports_ops(&self.bridge_uuid, &ports)).await?;
        for w in waits {
            OfportWatch::wait(w).await?;
        }
        let cfg = workload::node();
        let mut d = DesiredState::default();
        let _ = d.set(Owner::Base, base::flows(&cfg));
        let _ = d.set(Owner::Version, vec![base::version_flow(cfg.plugin)]);
        let _ = d.set(Owner::PolicyPlugin, policy::plugin_flows(&cfg));
        for v in 0..NAMESPACES {
            let vnid = Vnid::new(100 + v).unwrap_or(Vnid::GLOBAL);
            let _ = d.set(Owner::VnidRule { vnid }, vec![policy::vnid_flow(vnid)]);
        }
        for i in 0..m {
            let _ = d.set(pod_owner(i), sdn_node::pipeline::pod::flows(&self.pod(i).1));
        }
        let bodies = diff(&d, &InstalledState::default(), 1).bodies();
        let e = limit::encode_bundle(&self.mux, &bodies)?;
        self.mux.send(&e.bytes, e.barrier).await?;
        self.check_rejections()
    }

    fn pod(&self, i: u32) -> (String, PodPort) {
        bpod(self.tag, i)
    }

    fn check_rejections(&self) -> Result<(), BenchError> {
        let n = self.mux.rejected.load(std::sync::atomic::Ordering::Relaxed);
        if n > 0 {
            return Err(fail(format!("the switch rejected {n} of the limit's messages")));
        }
        Ok(())
    }
}

/// Seed ADD of pod `i` into `netns`.
async fn seed_add(b: &Baseline, i: u32, netns: &str) -> Result<Duration, BenchError> {
    let (veth, mut p) = b.pod(i);
    let t = Instant::now();
    net_setup(&b.host, netns, &veth, &p).await?;
    let (env, bridge) = (b.site.env.clone(), b.site.bridge.clone());
    tokio::task::spawn_blocking(move || {
        p.ofport = OfPort(seed::add_port(&env, &bridge, &veth)?);
        seed::flows(&env, &bridge, &workload::seed_setup_text_for(&p))
    })
    .await
    .map_err(fail)??;
    Ok(t.elapsed())
}

/// Seed DEL of pod `i`.
async fn seed_del(b: &Baseline, i: u32) -> Result<Duration, BenchError> {
    let (veth, p) = b.pod(i);
    let t = Instant::now();
    let (env, bridge, v) = (b.site.env.clone(), b.site.bridge.clone(), veth.clone());
    tokio::task::spawn_blocking(move || {
        seed::flows(&env, &bridge, &workload::seed_teardown_text_for(p.ip.unwrap_or(Ipv4Addr::UNSPECIFIED)))?;
        seed::del_port(&env, &bridge, &v)
    })
    .await
    .map_err(fail)??;
    hostnet::teardown_pod(&b.host, &veth).await?;
    Ok(t.elapsed())
}

/// The limit's ADD of pod `i`, prepared (transaction and bundle built before the clock).
struct LimitAdd {
    i: u32,
    veth: String,
    p: PodPort,
    ops: Vec<sdn_node::ovsdb::Operation>,
    flows: limit::Encoded,
}

fn limit_prepare(b: &Baseline, i: u32) -> Result<LimitAdd, BenchError> {
    let (veth, p) = b.pod(i);
    let ops = limit::add_ports_ops(&b.bridge_uuid, &[(veth.clone(), p.ofport.0)]);
    let flows = limit::encode_bundle(&b.mux, &add_bodies(i, &p)?)?;
    Ok(LimitAdd { i, veth, p, ops, flows })
}

/// Runs a prepared limit ADD; returns its time and the Port row's uuid.
async fn limit_add(b: &Baseline, a: LimitAdd, netns: &str) -> Result<(Duration, String), BenchError> {
    let t = Instant::now();
    net_setup(&b.host, netns, &a.veth, &a.p).await?;
    let rx = b.watch.expect(&a.veth)?;
    let r = b.client.transact("Open_vSwitch", a.ops).await?;
    OfportWatch::wait(rx).await?;
    b.mux.send(&a.flows.bytes, a.flows.barrier).await?;
    let d = t.elapsed();
    let port = r.get(1).and_then(|o| o.uuid.as_ref().map(ToString::to_string)).ok_or_else(|| fail(format!("pod {}: no Port uuid", a.i)))?;
    Ok((d, port))
}

async fn limit_del(b: &Baseline, i: u32, port: &str) -> Result<Duration, BenchError> {
    let (veth, p) = b.pod(i);
    let ops = limit::del_ports_ops(&b.bridge_uuid, &[port.to_string()]);
    let flows = limit::encode_bundle(&b.mux, &del_bodies(i, &p)?)?;
    let t = Instant::now();
    b.mux.send(&flows.bytes, flows.barrier).await?;
    b.client.transact("Open_vSwitch", ops).await?;
    hostnet::teardown_pod(&b.host, &veth).await?;
    Ok(t.elapsed())
}

// ---------------------------------------------------------------------------------------
// The agent.

struct Agent {
    site: Site,
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
    /// The plugin's network configuration, as a runtime passes it on stdin.
    conf: Vec<u8>,
    cni_bin: PathBuf,
    /// A work directory outside any sandbox, removed at the end.
    scratch: Option<PathBuf>,
    /// The agent's OVSDB, to see its warm ports.
    ovs: Ovs,
    warm_ports: usize,
}

fn agent_state() -> String {
    let mut s = String::from(
        "node: bench-node\nplugin: multitenant\nclusterNetwork: 10.128.0.0/14\nserviceNetwork: 172.30.0.0/16\n",
    );
    s.push_str(&format!("mtu: {MTU}\nhostSubnets:\n  - {{host: bench-node, hostIP: 172.17.0.2, subnet: {}}}\n", workload::node4().local_subnet));
    s.push_str("netNamespaces:\n");
    for v in 0..NAMESPACES {
        s.push_str(&format!("  - {{name: ns-{v}, netid: {}}}\n", 100 + v));
    }
    s
}

impl Agent {
    async fn start(site: Site, opts: &PodsOptions) -> Result<Agent, BenchError> {
        let work = match &site._sandbox {
            Some(sb) => sb.dir().join("agent"),
            None => std::env::temp_dir().join(format!("sdnbp{}-agent", std::process::id())),
        };
        std::fs::create_dir_all(&work)?;
        let state = work.join("state.yaml");
        std::fs::write(&state, agent_state())?;
        let conf_dir = work.join("net.d");
        let socket = work.join("cni.sock");
        let log = work.join("agent.log");
        let mut c = tokio::process::Command::new(&opts.node_bin);
        // The agent runs in the site's namespace (as `ip netns exec` would put it, without the
        // exec): the child enters it between fork and exec.
        let ns_file = site.ns.as_ref().map(|n| std::fs::File::open(format!("{}/{n}", hostnet::netns::NETNS_DIR))).transpose()?;
        if let Some(f) = &ns_file {
            use std::os::fd::AsRawFd;
            let fd = f.as_raw_fd();
            // SAFETY: only async-signal-safe work between fork and exec (one system call on
            // a descriptor the parent keeps open until the spawn below returns).
            unsafe {
                c.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        c.args(["run", "--state"])
            .arg(&state)
            .arg("--ovs-rundir")
            .arg(&site.dir)
            .args(["--bridge", &site.bridge, "--datapath-type", "netdev", "--metrics-addr", "none"])
            .args(["--warm-ports", &opts.warm_ports.to_string()])
            .arg("--pod-api-socket")
            .arg(&socket)
            .arg("--cni-conf-dir")
            .arg(&conf_dir)
            // The agent's checkpoint, written before every ADD and DEL is answered (as in
            // production), in this site's own directory.
            .arg("--state-dir")
            .arg(site.dir.join("sdn-node-state"));
        if site.ns.is_none() {
            c.arg("--no-host-network");
        }
        let child = c
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log)?))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("cannot start the agent {}: {e}", opts.node_bin.display())))?;
        drop(ns_file);
        let pid = child.id().ok_or_else(|| fail("the agent exited at once"))?;
        let scratch = site._sandbox.is_none().then(|| work.clone());
        let ovs = Ovs::new(OvsdbClient::connect(&site.db()).await.map_err(fail)?);
        let mut a = Agent { site, child, pid, log, conf: Vec::new(), cni_bin: opts.cni_bin.clone(), scratch, ovs, warm_ports: opts.warm_ports };
        let conflist = conf_dir.join("80-sdn-node.conflist");
        let t = Instant::now();
        while !conflist.exists() {
            if let Some(st) = a.child.try_wait()? {
                return Err(fail(format!("the agent exited ({st}): {}", a.log_tail())));
            }
            if t.elapsed() > WAIT {
                return Err(fail(format!("the agent never wrote its CNI configuration: {}", a.log_tail())));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let list: serde_json::Value = serde_json::from_slice(&std::fs::read(&conflist)?).map_err(fail)?;
        let mut plugin = list["plugins"][0].clone();
        plugin["name"] = list["name"].clone();
        plugin["cniVersion"] = list["cniVersion"].clone();
        a.conf = serde_json::to_vec(&plugin).map_err(fail)?;
        Ok(a)
    }

    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn container(i: u32) -> String {
        format!("{i:08x}").repeat(8)
    }

    /// Runs the plugin as a runtime does: `command` for agent pod `i` in `netns`.
    fn cni_blocking(bin: &Path, conf: &[u8], command: &str, i: u32, netns: &str) -> Result<Duration, BenchError> {
        let cid = Agent::container(i);
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns-{};K8S_POD_NAME=pod-{i};K8S_POD_INFRA_CONTAINER_ID={cid}", i % NAMESPACES);
        let mut c = Command::new(bin);
        c.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &cid)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", bin.parent().unwrap_or(Path::new("/")))
            .env("CNI_ARGS", args);
        let t = Instant::now();
        run_cmd(c, Some(conf)).map_err(|e| fail(format!("CNI {command} pod-{i}: {e}")))?;
        Ok(t.elapsed())
    }

    async fn cni(&self, command: &'static str, i: u32, netns: &str) -> Result<Duration, BenchError> {
        let (bin, conf, ns) = (self.cni_bin.clone(), self.conf.clone(), netns.to_string());
        let r = tokio::task::spawn_blocking(move || Agent::cni_blocking(&bin, &conf, command, i, &ns)).await.map_err(fail)?;
        r.map_err(|e| fail(format!("{e}\nagent log:\n{}", self.log_tail())))
    }

    /// Waits until the agent's warm ports are all there with their ofports: its refill (one
    /// OVSDB transaction, one ovs-vswitchd reconfiguration) is over. Untimed. The ofports come
    /// from the connection's Interface monitor, not from one read per port.
    async fn settled(&self) -> Result<(), BenchError> {
        if self.warm_ports == 0 {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        let never = || fail(format!("the agent's {} warm ports never came back: {}", self.warm_ports, self.log_tail()));
        let spares = loop {
            let spares = self.ovs.ports_with_external_id(sdn_node::node::ports::SPARE_KEY).await.map_err(fail)?;
            if spares.len() >= self.warm_ports {
                break spares;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(never());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let watch = self.ovs.interface_watch().await.map_err(fail)?;
        for (name, _) in &spares {
            watch.ofport(name, deadline).await.map_err(|_| never())?;
        }
        Ok(())
    }

    fn peak_rss_mib(&self) -> f64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    }

    /// Stops the agent; with `SDN_BENCH_AGENT_LOG=FILE` set, its log is kept there.
    async fn stop(mut self) {
        if let Ok(pid) = i32::try_from(self.pid) {
            // SAFETY: signal to the child we started (still ours: not yet reaped).
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
        if let Some(keep) = std::env::var_os("SDN_BENCH_AGENT_LOG") {
            let _ = std::fs::copy(&self.log, keep);
        }
        if let Some(w) = &self.scratch {
            let _ = std::fs::remove_dir_all(w);
        }
        drop(self.site);
    }
}

/// Runs `f` over `items` with at most `limit` in flight.
async fn bounded<T, F, Fut>(items: Vec<T>, limit: usize, f: F) -> Result<(), BenchError>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<Duration, BenchError>>,
{
    use futures::StreamExt;
    let mut s = futures::stream::iter(items.into_iter().map(f)).buffer_unordered(limit.max(1));
    while let Some(r) = s.next().await {
        r?;
    }
    Ok(())
}

fn p50(v: &mut [Duration]) -> Duration {
    quantile(v, 0.5)
}

/// Runs the whole benchmark; `progress` receives a line per phase.
pub async fn pods(opts: &PodsOptions, progress: impl Fn(&str)) -> Result<PodsReport, BenchError> {
    if !opts.cni_bin.exists() {
        return Err(fail(format!("{} not found (build the workspace: cargo build -p sdn-node-cni)", opts.cni_bin.display())));
    }
    let (m, k, c) = (opts.base_pods, opts.ops.max(1), opts.concurrency.max(1));
    let mut nss = NsSet::default();
    progress("starting the switches and the agent");
    let (agent_site, seed_site, limit_site) = match &opts.ovs_rundir {
        Some(d) => (Site::attached(d, "br0"), Site::attached(d, "bpseed"), Site::attached(d, "bplimit")),
        None => (Site::private("agent").await?, Site::private("seed").await?, Site::private("limit").await?),
    };
    let seed = Baseline::open('s', seed_site).await?;
    let lim = Baseline::open('l', limit_site).await?;
    let agent = Agent::start(agent_site, opts).await?;
    let result = measure(opts, &agent, &seed, &lim, &mut nss, (m, k, c), &progress).await;
    let rss = agent.peak_rss_mib();
    agent.stop().await;
    drop(nss);
    let mut r = result?;
    r.memory.peak_rss_mib = rss;
    Ok(r)
}

async fn measure(
    opts: &PodsOptions,
    agent: &Agent,
    seed: &Baseline,
    lim: &Baseline,
    nss: &mut NsSet,
    (m, k, c): (u32, u32, u32),
    progress: &impl Fn(&str),
) -> Result<PodsReport, BenchError> {
    let pid = std::process::id();
    progress(&format!("creating {} pod network namespaces", m + 3 * (k + c)));
    let agent_ns = nss.add((0..m + k + c).map(|i| format!("sdnbp{pid}-a{i}")).collect()).await?;
    let seed_ns = nss.add((0..k + c).map(|i| format!("sdnbp{pid}-s{i}")).collect()).await?;
    let lim_ns = nss.add((0..k + c).map(|i| format!("sdnbp{pid}-l{i}")).collect()).await?;

    progress(&format!("installing {m} base pods: agent through CNI ({} at a time), baselines in bulk", opts.install_concurrency));
    let t = Instant::now();
    bounded((0..m).collect(), opts.install_concurrency, |i| agent.cni("ADD", i, &agent_ns[i as usize])).await?;
    progress(&format!("  agent: {:.1} s", t.elapsed().as_secs_f64()));
    seed.install_base(m).await?;
    lim.install_base(m).await?;

    // Serial ADDs, alternating pod by pod.
    progress(&format!("serial: {k} ADDs, then {k} DELs, alternating agent / seed / limit"));
    let (mut aa, mut sa, mut la) = (Vec::new(), Vec::new(), Vec::new());
    let mut lim_ports = Vec::new();
    for j in 0..k {
        let i = m + j;
        agent.settled().await?;
        aa.push(agent.cni("ADD", i, &agent_ns[i as usize]).await?);
        agent.settled().await?;
        sa.push(seed_add(seed, i, &seed_ns[j as usize]).await?);
        let prep = limit_prepare(lim, i)?;
        let (d, port) = limit_add(lim, prep, &lim_ns[j as usize]).await?;
        la.push(d);
        lim_ports.push(port);
    }
    let (mut ad, mut sd, mut ld) = (Vec::new(), Vec::new(), Vec::new());
    for j in 0..k {
        let i = m + j;
        agent.settled().await?;
        ad.push(agent.cni("DEL", i, &agent_ns[i as usize]).await?);
        sd.push(seed_del(seed, i).await?);
        ld.push(limit_del(lim, i, &lim_ports[j as usize]).await?);
    }

    // Bursts: C pods at once, time until all are ready; then deleted (untimed).
    progress(&format!("burst: {c} ADDs at once, per variant"));
    let burst: Vec<u32> = (0..c).map(|j| m + k + j).collect();
    let slot = |i: u32| (i - m) as usize;
    agent.settled().await?;
    let t = Instant::now();
    futures::future::try_join_all(burst.iter().map(|&i| agent.cni("ADD", i, &agent_ns[i as usize]))).await?;
    let burst_agent = t.elapsed();
    futures::future::try_join_all(burst.iter().map(|&i| agent.cni("DEL", i, &agent_ns[i as usize]))).await?;
    agent.settled().await?;
    let t = Instant::now();
    futures::future::try_join_all(burst.iter().map(|&i| seed_add(seed, i, &seed_ns[slot(i)]))).await?;
    let burst_seed = t.elapsed();
    futures::future::try_join_all(burst.iter().map(|&i| seed_del(seed, i))).await?;
    let preps = burst.iter().map(|&i| limit_prepare(lim, i)).collect::<Result<Vec<_>, _>>()?;
    agent.settled().await?;
    let t = Instant::now();
    let ports = futures::future::try_join_all(preps.into_iter().map(|p| {
        let ns = lim_ns[slot(p.i)].clone();
        async move { limit_add(lim, p, &ns).await }
    }))
    .await?;
    let burst_limit = t.elapsed();
    agent.settled().await?;
    futures::future::try_join_all(burst.iter().zip(&ports).map(|(&i, (_, port))| limit_del(lim, i, port))).await?;
    seed.check_rejections()?;
    lim.check_rejections()?;

    let mut r = PodsReport { base_pods: m, warm_ports: opts.warm_ports, ..Default::default() };
    let (a50, s50, l50) = (p50(&mut aa), p50(&mut sa), p50(&mut la));
    r.serial = PodsSerial {
        agent_p50_ms: ms(a50),
        agent_p99_ms: ms(quantile(&mut aa, 0.99)),
        seed_p50_ms: ms(s50),
        limit_p50_ms: ms(l50),
        ratio_vs_seed: ms(s50) / ms(a50),
        ratio_vs_limit: ms(l50) / ms(a50),
    };
    r.burst = PodsBurst {
        concurrency: c,
        agent_s: burst_agent.as_secs_f64(),
        seed_s: burst_seed.as_secs_f64(),
        limit_s: burst_limit.as_secs_f64(),
        ratio_vs_seed: burst_seed.as_secs_f64() / burst_agent.as_secs_f64(),
        ratio_vs_limit: burst_limit.as_secs_f64() / burst_agent.as_secs_f64(),
    };
    let (a50, s50, l50) = (p50(&mut ad), p50(&mut sd), p50(&mut ld));
    r.del = PodsDel {
        agent_p50_ms: ms(a50),
        seed_p50_ms: ms(s50),
        limit_p50_ms: ms(l50),
        ratio_vs_seed: ms(s50) / ms(a50),
        ratio_vs_limit: ms(l50) / ms(a50),
    };
    Ok(r)
}

impl PodsReport {
    /// A human-readable table.
    pub fn table(&self) -> String {
        let (s, b, d) = (&self.serial, &self.burst, &self.del);
        format!(
            "base pods {m}, agent warm ports {w}; ratio = baseline time / agent time (> 1: the agent is faster)\n\
             {:<18} {:>10} {:>10} {:>10} {:>10} {:>10}\n\
             {:<18} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}   (agent p99 {:.2} ms)\n\
             {:<18} {:>10.3} {:>10.3} {:>10.3} {:>10.2} {:>10.2}\n\
             {:<18} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}\n\
             agent peak RSS {:.1} MiB\n",
            "", "agent", "seed", "limit", "vs seed", "vs limit",
            "ADD p50 (ms)", s.agent_p50_ms, s.seed_p50_ms, s.limit_p50_ms, s.ratio_vs_seed, s.ratio_vs_limit, s.agent_p99_ms,
            format!("burst x{} (s)", b.concurrency), b.agent_s, b.seed_s, b.limit_s, b.ratio_vs_seed, b.ratio_vs_limit,
            "DEL p50 (ms)", d.agent_p50_ms, d.seed_p50_ms, d.limit_p50_ms, d.ratio_vs_seed, d.ratio_vs_limit,
            self.memory.peak_rss_mib,
            m = self.base_pods,
            w = self.warm_ports,
        )
    }
}
