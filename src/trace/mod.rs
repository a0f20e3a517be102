//! `sdn-node trace`: follow one packet through the installed pipeline and say who decided its
//! fate.
//!
//! The packet is built from the model (a state file and/or the running agent's pod list):
//! `in_port` is the source pod's ofport (asked from OVSDB), addresses and MACs are the pods'.
//! It is traced by ovs-vswitchd itself (`ofproto/trace` over the unixctl socket, see
//! [`unixctl`]), so the answer is what the switch really holds, not what the agent believes it
//! installed. Each table hit is then attributed to its owner through the flow's cookie
//! ([`owners`]), and the final verdict names the object at the end of the path: the pod a
//! packet is delivered to, the node it is tunnelled to, or the flow (and its owner) that
//! dropped it.

pub mod owners;
pub mod parse;
pub mod unixctl;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use crate::cluster::ClusterState;
use crate::model::OfPort;
use owners::{CookieOwner, OwnerIndex};
use parse::ParsedTrace;

/// Bound on every peer call (OVSDB, the agent, ovs-vswitchd).
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    Tcp,
    Udp,
    Icmp,
    Ip,
}

/// `sdn-node trace`'s arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// The sender: a local pod (NAMESPACE/NAME, or NAME if unique), or an IP (a local pod's,
    /// a remote node's pod's — traced as arriving over VXLAN —, or any other address — traced
    /// as arriving from the host through tun0).
    #[arg(long, required_unless_present = "flow", requires = "to")]
    pub from: Option<String>,
    /// The receiver: a pod (NAMESPACE/NAME or NAME), a service (NAMESPACE/NAME), or an IP;
    /// optionally `:PORT`.
    #[arg(long, required_unless_present = "flow", requires = "from")]
    pub to: Option<String>,
    /// tcp or udp (tcp if a port is given), icmp (echo request), or ip.
    #[arg(long)]
    pub proto: Option<Proto>,
    /// The VNID a packet from a remote node's pod carries (default: the destination's VNID).
    #[arg(long)]
    pub vnid: Option<u32>,
    /// Trace this flow as given (ovs-ofctl syntax), e.g. `in_port=3,ip,nw_src=10.128.2.5,nw_dst=10.128.2.7`.
    #[arg(long, conflicts_with_all = ["from", "to", "proto", "vnid"])]
    pub flow: Option<String>,
    /// Directory with ovsdb-server's db.sock and ovs-vswitchd's pid file and control socket.
    #[arg(long, default_value = "/var/run/openvswitch", env = "OVS_RUNDIR")]
    pub ovs_rundir: PathBuf,
    /// The integration bridge.
    #[arg(long, default_value = "br0")]
    pub bridge: String,
    /// ovs-vswitchd's control socket (default: found in --ovs-rundir).
    #[arg(long)]
    pub ctl: Option<PathBuf>,
    /// The cluster state (YAML) the node runs with: pods, services, nodes and VNIDs.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// The running agent's pod API socket (its pods complete the state file's).
    #[arg(long, default_value = crate::api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A pod as the trace knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub host_veth: String,
    pub ip: Ipv4Addr,
    pub mac: String,
    pub ofport: Option<u32>,
    pub vnid: Option<u32>,
}

impl PodInfo {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Everything known about the node: the model's objects and the bridge's ports.
#[derive(Debug, Default)]
pub struct Inventory {
    pub state: Option<ClusterState>,
    pub pods: Vec<PodInfo>,
    /// Interface name -> ofport, from OVSDB.
    pub ofports: HashMap<String, u32>,
    /// Why a source could not be used (reported, not fatal).
    pub notes: Vec<String>,
}

impl Inventory {
    /// Builds the inventory from `state` and the agent's pod requests.
    pub fn new(
        state: Option<ClusterState>,
        api_pods: Vec<crate::api::PodRequest>,
        ofports: HashMap<String, u32>,
    ) -> Inventory {
        let mut pods: Vec<PodInfo> = Vec::new();
        let vnid_of = |ns: &str| state.as_ref().and_then(|s| s.vnid_of(ns)).map(|v| v.get());
        if let Some(s) = &state {
            for p in &s.pods {
                pods.push(PodInfo {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    host_veth: p.host_veth.clone(),
                    ip: p.ip,
                    mac: p.mac.to_string(),
                    ofport: ofports.get(&p.host_veth).copied(),
                    vnid: vnid_of(&p.namespace),
                });
            }
        }
        for r in api_pods {
            if pods.iter().any(|p| p.namespace == r.namespace && p.name == r.name) {
                continue;
            }
            let Ok(ip) = r.ip.split('/').next().unwrap_or("").parse::<Ipv4Addr>() else { continue };
            pods.push(PodInfo {
                vnid: vnid_of(&r.namespace),
                ofport: ofports.get(&r.host_veth).copied(),
                namespace: r.namespace,
                name: r.name,
                host_veth: r.host_veth,
                ip,
                mac: r.mac,
            });
        }
        Inventory { state, pods, ofports, notes: vec![] }
    }

    /// Reads what is available: the state file, the agent's pods, OVSDB's ports. A missing
    /// source is a note; only an unreadable state file that was asked for is an error.
    pub async fn load(args: &TraceArgs) -> Result<Inventory, String> {
        let mut notes = Vec::new();
        let state = match &args.state {
            Some(p) => {
                let (s, problems) = crate::cluster::state_file::load(p).map_err(|e| format!("{}: {e}", p.display()))?;
                for pr in problems {
                    notes.push(format!("state file: {pr}"));
                }
                Some(s)
            }
            None => None,
        };
        let api_pods = match tokio::time::timeout(
            TIMEOUT,
            crate::api::client::call(&args.socket, "GET", "/v1/pods", None),
        )
        .await
        {
            Ok(Ok((200, body))) => match serde_json::from_str::<Vec<crate::api::PodRequest>>(&body) {
                Ok(p) => p,
                Err(e) => {
                    notes.push(format!("agent {}: unreadable pod list: {e}", args.socket.display()));
                    vec![]
                }
            },
            Ok(Ok((code, body))) => {
                notes.push(format!("agent {}: GET /v1/pods: {code} {}", args.socket.display(), body.trim()));
                vec![]
            }
            Ok(Err(e)) => {
                if args.state.is_none() {
                    notes.push(format!(
                        "agent not reachable ({e}) and no --state: pods, nodes and services are unknown"
                    ));
                }
                vec![]
            }
            Err(_) => {
                notes.push(format!("agent {}: no answer within {TIMEOUT:?}", args.socket.display()));
                vec![]
            }
        };
        let ofports = match interface_ofports(&args.ovs_rundir.join("db.sock")).await {
            Ok(m) => m,
            Err(e) => {
                notes.push(format!("OVSDB: {e}: port numbers unknown"));
                HashMap::new()
            }
        };
        let mut inv = Inventory::new(state, api_pods, ofports);
        inv.notes = notes;
        Ok(inv)
    }

    pub fn owner_index(&self) -> OwnerIndex {
        let mut ix = OwnerIndex::new();
        if let Some(s) = &self.state {
            ix.add_state(s);
        }
        for p in &self.pods {
            let detail = format!("{}, {}", p.ip, p.host_veth);
            ix.add(crate::store::Owner::Pod { namespace: p.namespace.clone(), name: p.name.clone() }, detail);
        }
        ix
    }

    /// A pod by `NAMESPACE/NAME`, or by `NAME` if only one namespace has it.
    fn pod_named(&self, s: &str) -> Result<Option<&PodInfo>, String> {
        if let Some((ns, name)) = s.split_once('/') {
            return Ok(self.pods.iter().find(|p| p.namespace == ns && p.name == name));
        }
        let found: Vec<&PodInfo> = self.pods.iter().filter(|p| p.name == s).collect();
        match found.len() {
            0 => Ok(None),
            1 => Ok(Some(found[0])),
            _ => Err(format!(
                "{s:?} names {} pods ({}): say NAMESPACE/NAME",
                found.len(),
                found.iter().map(|p| p.key()).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    fn pod_with_ip(&self, ip: Ipv4Addr) -> Option<&PodInfo> {
        self.pods.iter().find(|p| p.ip == ip)
    }

    fn pod_on_port(&self, ofport: u32) -> Option<&PodInfo> {
        self.pods.iter().find(|p| p.ofport == Some(ofport))
    }

    fn interface_of(&self, ofport: u32) -> Option<String> {
        self.ofports.iter().find(|(_, &p)| p == ofport).map(|(n, _)| n.clone())
    }

    fn remote_node_of(&self, ip: Ipv4Addr) -> Option<&crate::cluster::HostSubnet> {
        let s = self.state.as_ref()?;
        s.host_subnets.iter().find(|h| h.host != s.node && h.subnet.contains(&ip))
    }

    fn node_at(&self, host_ip: Ipv4Addr) -> Option<&crate::cluster::HostSubnet> {
        self.state.as_ref()?.host_subnets.iter().find(|h| h.host_ip == host_ip)
    }
}

/// Every interface's ofport, from OVSDB (ports without one yet are left out).
async fn interface_ofports(db: &std::path::Path) -> Result<HashMap<String, u32>, String> {
    let fut = async {
        let client =
            crate::ovsdb::OvsdbClient::connect(&format!("unix:{}", db.display())).await.map_err(|e| e.to_string())?;
        let op = json!({"op": "select", "table": "Interface", "where": [], "columns": ["name", "ofport"]});
        let v = client.call("transact", json!(["Open_vSwitch", op])).await.map_err(|e| e.to_string());
        client.close();
        v
    };
    let v = tokio::time::timeout(TIMEOUT, fut)
        .await
        .map_err(|_| format!("{}: no answer within {TIMEOUT:?}", db.display()))??;
    let mut out = HashMap::new();
    let rows = v
        .get(0)
        .and_then(|r| r.get("rows"))
        .and_then(Value::as_array)
        .ok_or_else(|| format!("unexpected reply {v}"))?;
    for r in rows {
        // An unset ofport is the empty set `["set", []]`, not a number.
        if let (Some(name), Some(ofport)) =
            (r.get("name").and_then(Value::as_str), r.get("ofport").and_then(Value::as_i64))
        {
            if let Ok(p) = u32::try_from(ofport) {
                out.insert(name.to_string(), p);
            }
        }
    }
    Ok(out)
}

/// One end of the traced packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Endpoint {
    Pod {
        pod: PodInfo,
    },
    /// A pod on another node: the packet arrives over VXLAN from that node.
    RemotePod {
        ip: Ipv4Addr,
        node: String,
        node_ip: Ipv4Addr,
    },
    Service {
        namespace: String,
        name: String,
        ip: Ipv4Addr,
    },
    /// Any other address (from the host via tun0, or outside the cluster).
    Address {
        ip: Ipv4Addr,
    },
}

impl Endpoint {
    fn ip(&self) -> Ipv4Addr {
        match self {
            Endpoint::Pod { pod } => pod.ip,
            Endpoint::RemotePod { ip, .. } | Endpoint::Service { ip, .. } | Endpoint::Address { ip } => *ip,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Pod { pod } => {
                write!(f, "pod {} ({}, {}", pod.key(), pod.ip, pod.host_veth)?;
                if let Some(p) = pod.ofport {
                    write!(f, " port {p}")?;
                }
                if let Some(v) = pod.vnid {
                    write!(f, ", VNID {v}")?;
                }
                f.write_str(")")
            }
            Endpoint::RemotePod { ip, node, node_ip } => write!(f, "{ip} on node {node} ({node_ip}), over VXLAN"),
            Endpoint::Service { namespace, name, ip } => write!(f, "service {namespace}/{name} ({ip})"),
            Endpoint::Address { ip } => write!(f, "{ip}"),
        }
    }
}

fn resolve(inv: &Inventory, s: &str) -> Result<Endpoint, String> {
    if let Ok(ip) = s.parse::<Ipv4Addr>() {
        if let Some(p) = inv.pod_with_ip(ip) {
            return Ok(Endpoint::Pod { pod: p.clone() });
        }
        if let Some(h) = inv.remote_node_of(ip) {
            return Ok(Endpoint::RemotePod { ip, node: h.host.clone(), node_ip: h.host_ip });
        }
        if let Some(svc) = inv.state.as_ref().and_then(|st| st.services.iter().find(|x| x.cluster_ip == ip)) {
            return Ok(Endpoint::Service { namespace: svc.namespace.clone(), name: svc.name.clone(), ip });
        }
        return Ok(Endpoint::Address { ip });
    }
    if let Some(p) = inv.pod_named(s)? {
        return Ok(Endpoint::Pod { pod: p.clone() });
    }
    if let (Some((ns, name)), Some(st)) = (s.split_once('/'), &inv.state) {
        if let Some(svc) = st.services.iter().find(|x| x.namespace == ns && x.name == name) {
            return Ok(Endpoint::Service { namespace: ns.into(), name: name.into(), ip: svc.cluster_ip });
        }
    }
    let known = if inv.pods.is_empty() {
        "no pods are known (give --state, or run the agent)".to_string()
    } else {
        format!("known pods: {}", inv.pods.iter().map(|p| p.key()).collect::<Vec<_>>().join(", "))
    };
    Err(format!("{s:?} is neither an IPv4 address nor a known pod or service; {known}"))
}

/// `HOST:PORT` → (host, port); a bare host has no port.
fn split_port(s: &str) -> Result<(&str, Option<u16>), String> {
    match s.rsplit_once(':') {
        Some((h, p)) => {
            p.parse::<u16>().map(|p| (h, Some(p))).map_err(|_| format!("{s:?}: {p:?} is not a port number"))
        }
        None => Ok((s, None)),
    }
}

/// The packet to trace, in ovs-ofctl flow syntax, with its ends.
pub fn build_flow(
    inv: &Inventory,
    from: &str,
    to: &str,
    proto: Option<Proto>,
    vnid: Option<u32>,
) -> Result<(String, Endpoint, Endpoint), String> {
    let (to_s, port) = split_port(to)?;
    let src = resolve(inv, from)?;
    let dst = resolve(inv, to_s)?;
    let proto = proto.unwrap_or(if port.is_some() { Proto::Tcp } else { Proto::Ip });
    let mut f = String::new();
    match &src {
        Endpoint::Pod { pod } => {
            let ofport = pod.ofport.ok_or_else(|| {
                format!(
                    "pod {} has no ofport on the bridge (is its port {} there, and OVSDB reachable?)",
                    pod.key(),
                    pod.host_veth
                )
            })?;
            let _ = write!(f, "in_port={ofport},dl_src={},", pod.mac);
        }
        Endpoint::RemotePod { node_ip, .. } => {
            let vnid = vnid.or(match &dst {
                Endpoint::Pod { pod } => pod.vnid,
                _ => None,
            });
            let _ = write!(f, "in_port={},tun_src={node_ip},", OfPort::VXLAN.0);
            if let Some(local) = inv.state.as_ref().and_then(|s| s.local_subnet()) {
                let _ = write!(f, "tun_dst={},", local.host_ip);
            }
            let _ = write!(f, "tun_id={:#x},", vnid.unwrap_or(0));
        }
        Endpoint::Service { .. } | Endpoint::Address { .. } => {
            let _ = write!(f, "in_port={},", OfPort::TUN.0);
        }
    }
    if let Endpoint::Pod { pod } = &dst {
        let _ = write!(f, "dl_dst={},", pod.mac);
    }
    f.push_str(match proto {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
        Proto::Icmp => "icmp",
        Proto::Ip => "ip",
    });
    let _ = write!(f, ",nw_src={},nw_dst={}", src.ip(), dst.ip());
    match (proto, port) {
        // OVS 3.1 refuses the generic `tp_dst` here ("prerequisites not met"): the
        // protocol's own field name it is.
        (Proto::Tcp, Some(p)) => {
            let _ = write!(f, ",tcp_dst={p}");
        }
        (Proto::Udp, Some(p)) => {
            let _ = write!(f, ",udp_dst={p}");
        }
        (Proto::Icmp, _) => f.push_str(",icmp_type=8,icmp_code=0"),
        (Proto::Ip, Some(_)) => return Err("a port needs --proto tcp or udp".into()),
        _ => {}
    }
    Ok((f, src, dst))
}

/// One table hit, with its owner.
#[derive(Clone, Debug, Serialize)]
pub struct ReportStep {
    #[serde(flatten)]
    pub step: parse::Step,
    pub owner: Option<CookieOwner>,
}

/// Where a packet leaves the bridge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Output {
    pub port: u32,
    pub interface: Option<String>,
    /// The pod on that port.
    pub pod: Option<String>,
    /// For vxlan0: the tunnel's destination and VNID.
    pub tunnel: Option<Tunnel>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tunnel {
    pub dst: Option<Ipv4Addr>,
    pub node: Option<String>,
    pub vnid: Option<u64>,
}

/// The packet's fate.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Out of one or more ports (local pods, tun0, or vxlan0 to other nodes).
    Forwarded { outputs: Vec<Output> },
    /// Nowhere: `owner` is the owner of the flow in `table` that ended the path.
    Dropped { table: u8, flow: Option<String>, owner: Option<CookieOwner>, reason: String },
    /// The trace could not be read (no table was hit).
    Unknown { reason: String },
}

/// What `sdn-node trace` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub bridge: String,
    /// The flow that was traced.
    pub flow: String,
    /// OVS's reading of it (the `Flow:` line).
    pub ovs_flow: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<Endpoint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<Endpoint>,
    pub steps: Vec<ReportStep>,
    pub datapath_actions: Option<String>,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// One line: the verdict for people.
    pub summary: String,
    pub notes: Vec<String>,
    /// ovs-vswitchd's text, as received.
    pub raw: String,
}

/// The register-like values the trace sets, by short name (`reg0`, `tun_id`, `tun_dst`).
#[derive(Default)]
struct Regs(HashMap<String, String>);

/// `NXM_NX_REG0[]` / `NXM_NX_TUN_ID[0..31]` / `reg0` / `tun_id` → `reg0` / `tun_id`.
fn field_name(s: &str) -> String {
    let base = s.split('[').next().unwrap_or(s).trim();
    let lower = base.to_ascii_lowercase();
    match lower.strip_prefix("nxm_nx_") {
        Some("tun_ipv4_dst") => "tun_dst".into(),
        Some("tun_ipv4_src") => "tun_src".into(),
        Some(rest) => rest.to_string(),
        None => lower,
    }
}

impl Regs {
    fn from_flow(flow: &str) -> Regs {
        let mut r = Regs::default();
        for kv in flow.split(',') {
            if let Some((k, v)) = kv.split_once('=') {
                r.0.insert(field_name(k), v.to_string());
            }
        }
        r
    }

    fn num(&self, name: &str) -> Option<u64> {
        let v = self.0.get(name)?;
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => v.parse().ok(),
        }
    }

    /// Applies an action's effect on fields; returns the port of an output action.
    fn action(&mut self, a: &str) -> Option<u32> {
        if let Some(rest) = a.strip_prefix("load:").or_else(|| a.strip_prefix("set_field:")) {
            let (v, dst) = rest.split_once("->")?;
            self.0.insert(field_name(dst), v.to_string());
            return None;
        }
        if let Some(rest) = a.strip_prefix("move:") {
            let (src, dst) = rest.split_once("->")?;
            if let Some(v) = self.0.get(&field_name(src)).cloned() {
                self.0.insert(field_name(dst), v);
            }
            return None;
        }
        // output:NXM_NX_REG2[] is not a number: OVS notes the port it resolved to, and the
        // note is used instead.
        a.strip_prefix("output:")?.parse::<u32>().ok()
    }

    /// `NXM_NX_REG0[] is now 0xb`.
    fn note(&mut self, n: &str) -> Option<u32> {
        if let Some((f, v)) = n.split_once(" is now ") {
            self.0.insert(field_name(f), v.trim().to_string());
            return None;
        }
        n.strip_prefix("output port is ").and_then(|p| p.trim().parse().ok())
    }
}

/// Attributes the steps and decides the verdict.
pub fn analyze(parsed: &ParsedTrace, inv: &Inventory, owners: &OwnerIndex) -> (Vec<ReportStep>, Verdict) {
    let steps: Vec<ReportStep> = parsed
        .steps
        .iter()
        .map(|s| ReportStep { step: s.clone(), owner: s.matched.as_ref().map(|m| owners.resolve(m.cookie)) })
        .collect();
    let mut regs = Regs::from_flow(&parsed.flow);
    let mut outputs: Vec<Output> = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        // The output the previous line produced, if any: a `>>` note right after it
        // ("skipping output to input port") means it did not happen.
        let mut just_output = false;
        for line in &s.step.sequence {
            if line.starts_with(">>") {
                if just_output {
                    outputs.pop();
                }
                just_output = false;
                continue;
            }
            let port = match line.strip_prefix("->") {
                Some(n) => regs.note(n),
                None => regs.action(line),
            };
            match port {
                Some(port) => {
                    outputs.push(output(port, &regs, inv, &steps[..=i]));
                    just_output = true;
                }
                // A note about the output just made ("output to kernel tunnel") keeps it.
                None if line.starts_with("->") => {}
                None => just_output = false,
            }
        }
    }
    let dropped = parsed.datapath_actions.as_deref().is_none_or(|a| a.trim() == "drop");
    let verdict = if !dropped && !outputs.is_empty() {
        Verdict::Forwarded { outputs }
    } else if let Some(last) = steps.last() {
        let (flow, reason) = match &last.step.matched {
            Some(m) => {
                let flow = format!(
                    "table={}, priority={}{}{}",
                    last.step.table,
                    m.priority,
                    if m.match_.is_empty() { "" } else { "," },
                    m.match_
                );
                let what = if last.step.actions.iter().any(|a| a == "drop") || last.step.actions.is_empty() {
                    if m.priority == 0 && m.match_.is_empty() {
                        "the table's default drop"
                    } else {
                        "a drop rule"
                    }
                } else {
                    "its actions sent the packet nowhere"
                };
                let notes: Vec<&str> = last.step.notes.iter().map(String::as_str).collect();
                let reason = if notes.is_empty() { what.to_string() } else { format!("{what} ({})", notes.join("; ")) };
                (Some(flow), reason)
            }
            None => (None, format!("no flow matched: {}", last.step.miss.as_deref().unwrap_or("table miss"))),
        };
        // Table 80 drops by absence: say which VNIDs found no rule (reg0: source, reg1:
        // destination), which is the question an operator asks next.
        let reason = match (last.step.table == crate::pipeline::Table::Policy as u8, regs.num("reg0"), regs.num("reg1"))
        {
            (true, Some(src), Some(dst)) if last.step.matched.as_ref().is_some_and(|m| m.priority == 0) => {
                format!("{reason}: no rule lets VNID {src} reach VNID {dst}")
            }
            _ => reason,
        };
        Verdict::Dropped { table: last.step.table, flow, owner: last.owner.clone(), reason }
    } else {
        Verdict::Unknown { reason: "ovs-vswitchd's trace has no table steps".into() }
    };
    (steps, verdict)
}

fn output(port: u32, regs: &Regs, inv: &Inventory, steps: &[ReportStep]) -> Output {
    let interface = inv.interface_of(port).or_else(|| match port {
        p if p == OfPort::VXLAN.0 => Some("vxlan0".into()),
        p if p == OfPort::TUN.0 => Some("tun0".into()),
        _ => None,
    });
    let pod = inv.pod_on_port(port).map(PodInfo::key).or_else(|| {
        // Without OVSDB: the pod whose table-70 flow chose this port.
        steps
            .iter()
            .rev()
            .find(|s| s.step.table == 70)
            .and_then(|s| s.owner.as_ref())
            .filter(|o| o.kind == "pod")
            .and_then(|o| o.owner.clone())
            .map(|o| o.trim_start_matches("pod/").to_string())
    });
    let tunnel = (port == OfPort::VXLAN.0 || interface.as_deref() == Some("vxlan0")).then(|| {
        let dst = regs.0.get("tun_dst").and_then(|v| v.parse::<Ipv4Addr>().ok());
        let node = dst.and_then(|d| inv.node_at(d)).map(|h| h.host.clone()).or_else(|| {
            steps
                .iter()
                .rev()
                .filter_map(|s| s.owner.as_ref())
                .find(|o| o.kind == "hostsubnet")
                .and_then(|o| o.owner.clone())
                .map(|o| o.trim_start_matches("hostsubnet/").to_string())
        });
        Tunnel { dst, node, vnid: regs.num("tun_id") }
    });
    Output { port, interface, pod: if tunnel.is_some() { None } else { pod }, tunnel }
}

/// The verdict in one line.
pub fn summary(v: &Verdict) -> String {
    match v {
        Verdict::Forwarded { outputs } => outputs
            .iter()
            .map(|o| match (&o.tunnel, &o.pod) {
                (Some(t), _) => format!(
                    "TUNNELLED to node {} ({}) with VNID {}",
                    t.node.as_deref().unwrap_or("?"),
                    t.dst.map(|d| d.to_string()).unwrap_or_else(|| "unknown address".into()),
                    t.vnid.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
                ),
                (None, Some(p)) => {
                    format!("DELIVERED to port {} ({}, pod {p})", o.port, o.interface.as_deref().unwrap_or("?"))
                }
                (None, None) if o.interface.as_deref() == Some("tun0") => {
                    format!("DELIVERED to port {} (tun0: the node's host network)", o.port)
                }
                (None, None) => {
                    format!("DELIVERED to port {} ({})", o.port, o.interface.as_deref().unwrap_or("unknown interface"))
                }
            })
            .collect::<Vec<_>>()
            .join("; "),
        Verdict::Dropped { table, owner, reason, .. } => {
            let by = owner.as_ref().map(|o| o.to_string()).unwrap_or_else(|| "no flow (table miss)".into());
            format!("DROPPED in table {table} by {by}: {reason}")
        }
        Verdict::Unknown { reason } => format!("UNKNOWN: {reason}"),
    }
}

impl Report {
    /// The text form: one block per table hit, then the verdict.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "trace {}: {}", self.bridge, self.flow);
        if let Some(f) = &self.from {
            let _ = writeln!(s, "  from {f}");
        }
        if let Some(t) = &self.to {
            let _ = writeln!(s, "  to   {t}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "  note: {n}");
        }
        s.push('\n');
        for st in &self.steps {
            let pad = "  ".repeat(st.step.depth);
            match &st.step.matched {
                Some(m) => {
                    let _ = writeln!(
                        s,
                        "{pad}table {:>3}  priority {:<5} {}",
                        st.step.table,
                        m.priority,
                        if m.match_.is_empty() { "(any packet)" } else { &m.match_ }
                    );
                    if let Some(o) = &st.owner {
                        let _ = writeln!(s, "{pad}           owner: {o}  [cookie {}]", o.cookie);
                    }
                }
                None => {
                    let _ = writeln!(
                        s,
                        "{pad}table {:>3}  {}",
                        st.step.table,
                        st.step.miss.as_deref().unwrap_or("no match")
                    );
                }
            }
            if !st.step.actions.is_empty() {
                let _ = writeln!(s, "{pad}           actions: {}", st.step.actions.join(", "));
            }
            for n in &st.step.notes {
                let _ = writeln!(s, "{pad}           -> {n}");
            }
        }
        let _ = writeln!(s, "\nverdict: {}", self.summary);
        if let Some(a) = &self.datapath_actions {
            let _ = writeln!(s, "datapath actions: {a}");
        }
        s
    }
}

/// Traces `flow` on `bridge` through the control socket `ctl` and explains the result.
pub async fn trace_flow(ctl: &std::path::Path, bridge: &str, flow: &str, inv: &Inventory) -> Result<Report, String> {
    let raw = unixctl::call(ctl, "ofproto/trace", &[bridge, flow], TIMEOUT).await.map_err(|e| e.to_string())?;
    let parsed = parse::parse(&raw);
    let owners = inv.owner_index();
    let (steps, verdict) = analyze(&parsed, inv, &owners);
    Ok(Report {
        bridge: bridge.to_string(),
        flow: flow.to_string(),
        ovs_flow: parsed.flow.clone(),
        from: None,
        to: None,
        steps,
        datapath_actions: parsed.datapath_actions.clone(),
        summary: summary(&verdict),
        verdict,
        notes: inv.notes.clone(),
        raw,
    })
}

/// `sdn-node trace`: builds the packet, traces it, explains it.
pub async fn run(args: &TraceArgs) -> Result<Report, String> {
    let inv = Inventory::load(args).await?;
    let ctl = match &args.ctl {
        Some(c) => c.clone(),
        None => unixctl::find_vswitchd_ctl(&args.ovs_rundir).map_err(|e| e.to_string())?,
    };
    let (flow, ends) = match (&args.flow, &args.from, &args.to) {
        (Some(f), _, _) => (f.clone(), None),
        (None, Some(from), Some(to)) => {
            let (f, src, dst) = build_flow(&inv, from, to, args.proto, args.vnid)?;
            (f, Some((src, dst)))
        }
        _ => return Err("give --from and --to, or --flow".into()),
    };
    let mut report = trace_flow(&ctl, &args.bridge, &flow, &inv).await?;
    if let Some((src, dst)) = ends {
        report.from = Some(src);
        report.to = Some(dst);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names() {
        assert_eq!(field_name("NXM_NX_REG0[]"), "reg0");
        assert_eq!(field_name("NXM_NX_TUN_ID[0..31]"), "tun_id");
        assert_eq!(field_name("tun_dst"), "tun_dst");
        assert_eq!(field_name("NXM_NX_TUN_IPV4_DST[]"), "tun_dst");
    }

    #[test]
    fn tunnel_registers() {
        let mut r = Regs::from_flow("ip,in_port=3,nw_src=10.128.2.5");
        r.note("NXM_NX_REG0[] is now 0xb");
        r.action("move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31]");
        r.action("set_field:172.17.0.3->tun_dst");
        assert_eq!(r.action("output:1"), Some(1));
        assert_eq!(r.num("tun_id"), Some(11));
        assert_eq!(r.0["tun_dst"], "172.17.0.3");
        assert_eq!(r.action("output:NXM_NX_REG2[]"), None);
        assert_eq!(r.note("output port is 4"), Some(4));
    }

    #[test]
    fn ports() {
        assert_eq!(split_port("10.1.2.3:80").unwrap(), ("10.1.2.3", Some(80)));
        assert_eq!(split_port("ns/pod").unwrap(), ("ns/pod", None));
        assert!(split_port("ns/pod:http").is_err());
    }
}
