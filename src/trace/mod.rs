//! `sdn-node trace`: follow one packet through the installed pipeline and say who decided its
//! fate.
//!
//! The packet is built from the model (a state file and/or the running agent's pod list):
//! `in_port` is the source pod's ofport (asked from OVSDB), addresses and MACs are the pods'.
//! An address the model does not place is looked up on the switch ([`discover`]: table 20's
//! per-pod flows, table 30's and 90's routes) and in OVSDB (the ports' pod records); a source
//! that stays unknown is an error naming what is missing, never a guess.
//! It is traced by ovs-vswitchd itself (`ofproto/trace` over the unixctl socket, see
//! [`unixctl`]), so the answer is what the switch really holds, not what the agent believes it
//! installed. Each table hit is then attributed to its owner through the flow's cookie
//! ([`owners`]), and the final verdict names the object at the end of the path: the pod a
//! packet is delivered to, the node it is tunnelled to, or the flow (and its owner) that
//! dropped it.

pub mod discover;
pub mod owners;
pub mod parse;
pub mod unixctl;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::cluster::ClusterState;
use crate::domain::OfPort;
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

/// `sdn-node trace`'s arguments. Addresses may be of either family: an IPv6 address (or
/// `--ipv6` with names) traces an IPv6 packet between the ends' IPv6 addresses.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// The sender: a local pod (NAMESPACE/NAME, or NAME if unique), or an IP (a local pod's,
    /// a remote node's pod's — traced as arriving over VXLAN —, or any other address — traced
    /// as arriving from the host through tun0).
    #[arg(long, required_unless_present = "flow", requires = "to")]
    pub from: Option<String>,
    /// The receiver: a pod (NAMESPACE/NAME or NAME), a service (NAMESPACE/NAME), or an IP;
    /// optionally `:PORT` (`[IPV6]:PORT` for an IPv6 address).
    #[arg(long, required_unless_present = "flow", requires = "from")]
    pub to: Option<String>,
    /// Trace IPv6 between the ends' IPv6 addresses (implied by an IPv6 address as either end;
    /// named pods and services must then have one: a dual-stack cluster).
    #[arg(long = "ipv6", short = '6', conflicts_with = "flow")]
    pub ipv6: bool,
    /// tcp or udp (tcp if a port is given), icmp (echo request; ICMPv6's for IPv6), or ip.
    #[arg(long)]
    pub proto: Option<Proto>,
    /// The VNID a packet from a remote node's pod carries. Without it, --state makes it the
    /// destination's VNID; without --state it must be given (only the sender's node knows it).
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
    /// Its IPv4 address (`None` on an IPv6-only node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<Ipv4Addr>,
    /// Its IPv6 address (dual-stack, IPv6-only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip6: Option<Ipv6Addr>,
    pub mac: String,
    pub ofport: Option<u32>,
    pub vnid: Option<u32>,
}

/// A record's (or the pod API's) first and second address as a pod's addresses; a second
/// IPv6 address beside an IPv6 first one (a record the agent refuses) is left out.
fn ips_of(first: IpAddr, second: Option<Ipv6Addr>) -> crate::domain::PodIps {
    crate::domain::PodIps::from_first_and_second(first, second).unwrap_or(crate::domain::PodIps::from_first_and_second(first, None).unwrap_or(crate::domain::PodIps { v4: None, v6: None }))
}

impl PodInfo {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn ips(&self) -> crate::domain::PodIps {
        crate::domain::PodIps { v4: self.ip, v6: self.ip6 }
    }

    /// Its address of `family`.
    fn addr(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => self.ip.map(IpAddr::V4),
            Family::V6 => self.ip6.map(IpAddr::V6),
        }
    }

    fn has(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(ip) => self.ip == Some(ip),
            IpAddr::V6(ip) => self.ip6 == Some(ip),
        }
    }
}

/// The traced packet's IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn of(ip: IpAddr) -> Family {
        if ip.is_ipv6() {
            Family::V6
        } else {
            Family::V4
        }
    }

    fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// Everything known about the node: the model's objects and the bridge's ports.
#[derive(Debug, Default)]
pub struct Inventory {
    pub state: Option<ClusterState>,
    pub pods: Vec<PodInfo>,
    /// Interface name -> ofport, from OVSDB.
    pub ofports: HashMap<String, u32>,
    /// Interface name -> the MAC OVSDB gives for it (`external_ids:attached-mac`, or an internal
    /// port's `mac_in_use`, which is the pod's own).
    pub macs: HashMap<String, String>,
    /// br0's own view (tables 20, 30, 90), read only when the model cannot place an address:
    /// `None` when not read, the error when it could not be.
    pub switch: Option<Result<discover::SwitchView, String>>,
    /// Why a source could not be used (reported, not fatal).
    pub notes: Vec<String>,
}

impl Inventory {
    /// Builds the inventory from `state`, the agent's pod requests and OVSDB's ports (whose pod
    /// records name the API pods when the agent is not running).
    pub fn new(state: Option<ClusterState>, api_pods: Vec<crate::node::record::PodRecord>, ports: Ports) -> Inventory {
        let Ports { ofports, macs, records } = ports;
        let mut pods: Vec<PodInfo> = Vec::new();
        let vnid_of = |ns: &str| state.as_ref().and_then(|s| s.vnid_of(ns)).map(|v| v.get());
        if let Some(s) = &state {
            for p in &s.pods {
                pods.push(PodInfo {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    host_veth: p.host_veth.clone(),
                    ip: p.ip,
                    ip6: p.ip6,
                    mac: p.mac.to_string(),
                    ofport: ofports.get(&p.host_veth).copied(),
                    vnid: vnid_of(&p.namespace),
                });
            }
        }
        for r in api_pods.into_iter().chain(records) {
            if pods.iter().any(|p| p.namespace == r.namespace && p.name == r.name) {
                continue;
            }
            // A record's first address, and a dual-stack pod's IPv6 one beside.
            let crate::domain::PodIps { v4: ip, v6: ip6 } = ips_of(r.ip, r.ip6);
            pods.push(PodInfo {
                vnid: vnid_of(&r.namespace),
                ofport: ofports.get(&r.host_veth).copied(),
                namespace: r.namespace,
                name: r.name,
                host_veth: r.host_veth,
                ip,
                ip6,
                mac: r.mac.to_string(),
            });
        }
        Inventory { state, pods, ofports, macs, switch: None, notes: vec![] }
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
        // Every pod of the running agent's model (state source and API); an agent without
        // that endpoint (older) lists its API pods only.
        let agent = |path: &'static str| {
            tokio::time::timeout(TIMEOUT, crate::api::client::call(&args.socket, "GET", path, None))
        };
        let mut model_pods: Vec<crate::api::ModelPod> = vec![];
        let mut api_pods: Vec<crate::node::record::PodRecord> = vec![];
        let mut answer = agent("/v1/model/pods").await;
        let mut path = "/v1/model/pods";
        if matches!(answer, Ok(Ok((404, _)))) {
            answer = agent("/v1/pods").await;
            path = "/v1/pods";
        }
        match answer {
            Ok(Ok((200, body))) => {
                let parsed = if path == "/v1/pods" {
                    serde_json::from_str(&body).map(|p| api_pods = p)
                } else {
                    serde_json::from_str(&body).map(|p| model_pods = p)
                };
                if let Err(e) = parsed {
                    notes.push(format!("agent {}: unreadable pod list: {e}", args.socket.display()));
                }
            }
            Ok(Ok((code, body))) => {
                notes.push(format!("agent {}: GET {path}: {code} {}", args.socket.display(), body.trim()));
            }
            Ok(Err(e)) => {
                if args.state.is_none() {
                    notes.push(format!(
                        "agent not reachable ({e}) and no --state: addresses are placed by br0's flows and OVSDB's \
                         pod records; services, node names and pods without a record are not known by name"
                    ));
                }
            }
            Err(_) => {
                notes.push(format!("agent {}: no answer within {TIMEOUT:?}", args.socket.display()));
            }
        }
        let ports = match read_ports(&args.ovs_rundir.join("db.sock")).await {
            Ok((p, problems)) => {
                notes.extend(problems);
                p
            }
            Err(e) => {
                notes.push(format!("OVSDB: {e}: port numbers unknown"));
                Ports::default()
            }
        };
        let mut inv = Inventory::new(state, api_pods, ports);
        for p in model_pods {
            if inv.pods.iter().any(|q| q.namespace == p.namespace && q.name == p.name) {
                continue;
            }
            let crate::domain::PodIps { v4: ip, v6: ip6 } = ips_of(p.ip, p.ip6);
            inv.pods.push(PodInfo {
                ofport: inv.ofports.get(&p.host_veth).copied(),
                namespace: p.namespace,
                name: p.name,
                host_veth: p.host_veth,
                ip,
                ip6,
                mac: p.mac,
                vnid: p.vnid,
            });
        }
        inv.notes = notes;
        Ok(inv)
    }

    pub fn owner_index(&self) -> OwnerIndex {
        let mut ix = OwnerIndex::new();
        if let Some(s) = &self.state {
            ix.add_state(s);
        }
        for p in &self.pods {
            let detail = format!("{}, {}", p.ips().iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", "), p.host_veth);
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

    fn pod_with_ip(&self, ip: IpAddr) -> Option<&PodInfo> {
        self.pods.iter().find(|p| p.has(ip))
    }

    fn pod_on_port(&self, ofport: u32) -> Option<&PodInfo> {
        self.pods.iter().find(|p| p.ofport == Some(ofport))
    }

    fn interface_of(&self, ofport: u32) -> Option<String> {
        self.ofports.iter().find(|(_, &p)| p == ofport).map(|(n, _)| n.clone())
    }

    fn remote_node_of(&self, ip: IpAddr) -> Option<&crate::cluster::HostSubnet> {
        let s = self.state.as_ref()?;
        s.host_subnets.iter().find(|h| {
            h.host != s.node
                && match ip {
                    IpAddr::V4(ip) => h.subnet.is_some_and(|n| n.contains(&ip)),
                    IpAddr::V6(ip) => h.subnet6.is_some_and(|n| n.contains(&ip)),
                }
        })
    }

    /// The service with cluster IP `ip` (either family).
    fn service_at(&self, ip: IpAddr) -> Option<&crate::cluster::Service> {
        self.state.as_ref()?.services.iter().find(|x| match ip {
            IpAddr::V4(ip) => x.cluster_ip == Some(ip),
            IpAddr::V6(ip) => x.cluster_ip6 == Some(ip),
        })
    }

    fn node_at(&self, host_ip: std::net::IpAddr) -> Option<&crate::cluster::HostSubnet> {
        self.state.as_ref()?.host_subnets.iter().find(|h| h.host_ip == host_ip)
    }
}

/// What OVSDB says about the node's ports.
#[derive(Debug, Default)]
pub struct Ports {
    /// Interface name -> ofport (interfaces without one yet are left out).
    pub ofports: HashMap<String, u32>,
    /// Interface name -> MAC (see [`Inventory::macs`]).
    pub macs: HashMap<String, String>,
    /// The pod records the agent keeps on its API pods' ports ([`crate::node::record::POD_KEY`]).
    pub records: Vec<crate::node::record::PodRecord>,
}

/// Reads the Interface rows (name, ofport, MAC) and the Port rows' pod records in one
/// transaction. Unreadable records are reported, not fatal.
async fn read_ports(db: &std::path::Path) -> Result<(Ports, Vec<String>), String> {
    use crate::ovsdb::{Interface, Port, Table};
    let fut = async {
        let client = crate::ovsdb::OvsdbClient::connect(&format!("unix:{}", db.display())).await?;
        let columns = [Interface::NAME, Interface::OFPORT, Interface::TYPE, Interface::MAC_IN_USE, Interface::EXTERNAL_IDS];
        let ops = vec![Interface::select(vec![], &columns), Port::select(vec![], &[Port::NAME, Port::EXTERNAL_IDS])];
        let r = client.transact(crate::ovsdb::VSWITCH_DB, ops).await;
        client.close();
        r
    };
    let mut results = tokio::time::timeout(TIMEOUT, fut)
        .await
        .map_err(|_| format!("{}: no answer within {TIMEOUT:?}", db.display()))?
        .map_err(|e| format!("{}: {e}", db.display()))?
        .into_iter();
    let mut rows = || results.next().unwrap_or_default().into_rows().map_err(|e| e.to_string());
    let (interfaces, ports) = (rows()?, rows()?);
    let mut out = Ports::default();
    let mut problems = Vec::new();
    // A row that does not parse is left out.
    for i in interfaces.iter().filter_map(|r| Interface::from_row(r).ok()) {
        let Ok(name) = i.name().cloned() else { continue };
        // An unset ofport is the empty set, not a number; -1 is a failed interface.
        if let Some(p) = i.ofport.flatten().and_then(|p| u32::try_from(p).ok()) {
            out.ofports.insert(name.clone(), p);
        }
        let attached = i.external_ids.as_ref().and_then(|m| m.get("attached-mac").cloned());
        let internal = i.iface_type.as_deref() == Some("internal");
        let in_use = internal.then(|| i.mac_in_use.clone().flatten()).flatten();
        if let Some(mac) = attached.or(in_use).filter(|m| !m.is_empty()) {
            out.macs.insert(name, mac);
        }
    }
    for p in ports.iter().filter_map(|r| Port::from_row(r).ok()) {
        let Ok(name) = p.name().cloned() else { continue };
        let Some(json) = p.external_ids.as_ref().and_then(|m| m.get(crate::node::record::POD_KEY).cloned()) else {
            continue;
        };
        match crate::node::record::PodRecord::from_json(&json) {
            Ok(req) if req.host_veth == name => out.records.push(req),
            Ok(req) => problems.push(format!("OVSDB: port {name}: its pod record names port {:?}", req.host_veth)),
            Err(e) => problems.push(format!("OVSDB: port {name}: unreadable pod record: {e}")),
        }
    }
    Ok((out, problems))
}

/// One end of the traced packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Endpoint {
    Pod {
        pod: PodInfo,
    },
    /// A local pod known only from the switch: table 20's flow for its address gives its port
    /// and VNID; its name is unknown (no model, no pod record on its port).
    PortPod {
        ip: IpAddr,
        ofport: u32,
        interface: Option<String>,
        mac: Option<String>,
        vnid: u32,
        container_id: Option<String>,
    },
    /// A pod on another node: the packet arrives over VXLAN from that node. `node` is the
    /// node's name, known from the model only.
    RemotePod {
        ip: IpAddr,
        node: Option<String>,
        node_ip: std::net::IpAddr,
    },
    Service {
        namespace: String,
        name: String,
        ip: IpAddr,
    },
    /// Any other address (from the host via tun0, or outside the cluster).
    Address {
        ip: IpAddr,
    },
}

impl Endpoint {
    /// The end's address of `family` (a pod's other address when the packet is IPv6).
    fn ip(&self, family: Family) -> IpAddr {
        match self {
            Endpoint::Pod { pod } => pod.addr(family).or(pod.ips().primary()).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            Endpoint::PortPod { ip, .. }
            | Endpoint::RemotePod { ip, .. }
            | Endpoint::Service { ip, .. }
            | Endpoint::Address { ip } => *ip,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Pod { pod } => {
                write!(f, "pod {} ({}", pod.key(), pod.ips().iter().map(|a| a.to_string()).collect::<Vec<_>>().join(" "))?;
                write!(f, ", {}", pod.host_veth)?;
                if let Some(p) = pod.ofport {
                    write!(f, " port {p}")?;
                }
                if let Some(v) = pod.vnid {
                    write!(f, ", VNID {v}")?;
                }
                f.write_str(")")
            }
            Endpoint::PortPod { ip, ofport, interface, vnid, container_id, .. } => {
                write!(f, "local pod {ip} (port {ofport}")?;
                if let Some(i) = interface {
                    write!(f, " {i}")?;
                }
                write!(f, ", VNID {vnid}")?;
                if let Some(c) = container_id {
                    write!(f, ", container {}", &c[..c.len().min(12)])?;
                }
                f.write_str("; from br0's table 20, name unknown)")
            }
            Endpoint::RemotePod { ip, node: Some(node), node_ip } => {
                write!(f, "{ip} on node {node} ({node_ip}), over VXLAN")
            }
            Endpoint::RemotePod { ip, node: None, node_ip } => {
                write!(f, "{ip} on the node at {node_ip} (from br0's table 90), over VXLAN")
            }
            Endpoint::Service { namespace, name, ip } => write!(f, "service {namespace}/{name} ({ip})"),
            Endpoint::Address { ip } => write!(f, "{ip}"),
        }
    }
}

/// Which end an address is: a source decides where the packet enters the bridge, so an
/// unplaced source is an error; a destination is the switch's to route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Source,
    Destination,
}

/// What to give when the node's model is missing.
const SUPPLY: &str = "give --state FILE (the node's cluster state) or --socket PATH (the running agent's), \
     or trace an explicit --flow";

impl Inventory {
    fn view(&self) -> Option<&discover::SwitchView> {
        self.switch.as_ref().and_then(|r| r.as_ref().ok())
    }

    /// Whether the node is IPv6-only (the state says so; without one, br0's flows route an
    /// IPv6 pod subnet and no IPv4 one, or the pods have IPv6 addresses only): a trace between
    /// names is then an IPv6 packet.
    fn ipv6_only(&self) -> bool {
        match (&self.state, self.view()) {
            (Some(s), _) => s.ipv6_only(),
            (None, Some(v)) => v.local_subnet.is_none() && v.local_subnet6.is_some(),
            (None, None) => !self.pods.is_empty() && self.pods.iter().all(|p| p.ip.is_none()),
        }
    }

    /// The local pod table 20 admits with source `ip`.
    fn port_pod(&self, ip: IpAddr) -> Result<Option<Endpoint>, String> {
        let Some(v) = self.view() else { return Ok(None) };
        let found = v.pods_with_ip(ip);
        let p = match found.as_slice() {
            [] => {
                let IpAddr::V6(ip6) = ip else { return Ok(None) };
                let ports = v.ports_with_ip6_only(ip6);
                if ports.is_empty() {
                    return Ok(None);
                }
                let ports: Vec<String> = ports.iter().map(u32::to_string).collect();
                return Err(format!(
                    "{ip} is admitted by br0's table 20 from in_port {} but no IPv4 flow names that port's pod: \
                     the pipeline is inconsistent; trace it with --flow in_port=N,ipv6,ipv6_src={ip},...",
                    ports.join(", ")
                ));
            }
            [p] => p,
            many => {
                let ports: Vec<String> = many.iter().map(|p| p.ofport.to_string()).collect();
                let (ip_kw, src) = match ip {
                    IpAddr::V4(_) => ("ip", "nw_src"),
                    IpAddr::V6(_) => ("ipv6", "ipv6_src"),
                };
                return Err(format!(
                    "{ip} is claimed by several ports in br0's table 20 (in_port {}): the pipeline is \
                     inconsistent; trace one with --flow in_port=N,{ip_kw},{src}={ip},...",
                    ports.join(", ")
                ));
            }
        };
        let interface = self.interface_of(p.ofport);
        let mac = p.mac.clone().or_else(|| interface.as_ref().and_then(|i| self.macs.get(i).cloned()));
        Ok(Some(Endpoint::PortPod {
            ip,
            ofport: p.ofport,
            interface,
            mac,
            vnid: p.vnid,
            container_id: p.container_id.clone(),
        }))
    }

    /// Why table 20 was no help for `ip`.
    fn no_pod_flow(&self, ip: IpAddr) -> String {
        match &self.switch {
            Some(Ok(_)) if ip.is_ipv6() => format!("br0's table 20 has no in_port=N,ipv6,ipv6_src={ip} flow"),
            Some(Ok(_)) => format!("br0's table 20 has no in_port=N,ip,nw_src={ip} flow"),
            Some(Err(e)) => format!("br0's flows could not be read ({e})"),
            None => "br0's flows were not read".into(),
        }
    }

    /// A source address no pod, node or service has: fine if it is outside every pod network
    /// (it comes from the host or beyond, through tun0); an error otherwise, or if the pod
    /// networks are unknown.
    fn check_outside_pods(&self, ip: IpAddr) -> Result<(), String> {
        use ipnet::IpNet;
        let view = self.view();
        let local: Option<IpNet> = match (&self.state, ip) {
            (Some(s), IpAddr::V4(_)) => s.local_subnet().and_then(|h| h.subnet).map(IpNet::V4),
            (Some(s), IpAddr::V6(_)) => s.local_subnet().and_then(|h| h.subnet6).map(IpNet::V6),
            (None, _) => view.and_then(|v| v.local_subnet_of(ip)),
        };
        let clusters: Vec<IpNet> = match (&self.state, ip) {
            (Some(s), IpAddr::V4(_)) => s.cluster_network.into_iter().map(IpNet::V4).collect(),
            (Some(s), IpAddr::V6(_)) => s.cluster_network6.into_iter().map(IpNet::V6).collect(),
            (None, _) => view.map(|v| v.cluster_networks_of(ip)).unwrap_or_default(),
        };
        let model = if self.state.is_some() { "not a pod of --state, and " } else { "" };
        if let Some(local) = local.filter(|n| n.contains(&ip)) {
            return Err(format!(
                "source {ip} is in this node's pod subnet {local}, but no pod has it ({model}{}): if the pod \
                 exists, {SUPPLY}",
                self.no_pod_flow(ip)
            ));
        }
        if let Some(c) = clusters.iter().find(|n| n.contains(&ip)) {
            let why = if self.state.is_some() { "no hostSubnet of --state" } else { "no table 90 flow on br0" };
            return Err(format!(
                "source {ip} is in the cluster network {c}, but no node's subnet holds it ({why}): the node it \
                 would come from is unknown; {SUPPLY}"
            ));
        }
        if self.state.is_none() && !view.is_some_and(discover::SwitchView::has_pipeline) {
            let why = match &self.switch {
                Some(Ok(_)) => "br0's table 30 routes no pod network (is the pipeline installed?)".to_string(),
                _ => self.no_pod_flow(ip),
            };
            return Err(format!("cannot tell whether source {ip} is a pod: no model of the node, and {why}; {SUPPLY}"));
        }
        Ok(())
    }
}

fn resolve(inv: &Inventory, s: &str, end: End, family: Family) -> Result<Endpoint, String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        if Family::of(ip) != family {
            return Err(format!("{ip} is not an {} address: both ends of a trace are of one family", family.name()));
        }
        if let Some(p) = inv.pod_with_ip(ip) {
            return Ok(Endpoint::Pod { pod: p.clone() });
        }
        if let Some(e) = inv.port_pod(ip)? {
            return Ok(e);
        }
        if let Some(h) = inv.remote_node_of(ip) {
            return Ok(Endpoint::RemotePod { ip, node: Some(h.host.clone()), node_ip: h.host_ip });
        }
        if let Some(svc) = inv.service_at(ip) {
            return Ok(Endpoint::Service { namespace: svc.namespace.clone(), name: svc.name.clone(), ip });
        }
        if let Some(r) = inv.view().and_then(|v| v.remote_of(ip)) {
            let node = inv.node_at(r.host_ip).map(|h| h.host.clone());
            return Ok(Endpoint::RemotePod { ip, node, node_ip: r.host_ip });
        }
        if end == End::Source {
            inv.check_outside_pods(ip)?;
        }
        return Ok(Endpoint::Address { ip });
    }
    if let Some(p) = inv.pod_named(s)? {
        if p.addr(family).is_none() {
            return Err(format!(
                "pod {} has no {} address (an IPv4-only pod{}); trace IPv4",
                p.key(),
                family.name(),
                if inv.state.as_ref().is_some_and(|s| s.cluster_network6.is_none()) { " of an IPv4-only cluster" } else { "" }
            ));
        }
        return Ok(Endpoint::Pod { pod: p.clone() });
    }
    if let (Some((ns, name)), Some(st)) = (s.split_once('/'), &inv.state) {
        if let Some(svc) = st.services.iter().find(|x| x.namespace == ns && x.name == name) {
            let ip = match family {
                Family::V4 => IpAddr::V4(svc.cluster_ip.ok_or_else(|| {
                    format!("service {ns}/{name} has no IPv4 cluster IP (an IPv6 single-stack service); trace IPv6 (-6)")
                })?),
                Family::V6 => IpAddr::V6(svc.cluster_ip6.ok_or_else(|| {
                    format!("service {ns}/{name} has no IPv6 cluster IP (clusterIPs lists none); trace IPv4")
                })?),
            };
            return Ok(Endpoint::Service { namespace: ns.into(), name: name.into(), ip });
        }
    }
    let known = if inv.pods.is_empty() {
        "no pods are known by name (give --state FILE, or --socket PATH of a running agent)".to_string()
    } else {
        format!("known pods: {}", inv.pods.iter().map(|p| p.key()).collect::<Vec<_>>().join(", "))
    };
    Err(format!("{s:?} is neither an IP address nor a known pod or service; {known}"))
}

/// True if an address end is not a pod the model knows, so br0's own view is needed.
fn needs_switch(inv: &Inventory, from: &str, to: &str) -> bool {
    let to = split_port(to).map(|(h, _)| h).unwrap_or(to);
    [from, to].iter().any(|s| s.parse::<IpAddr>().is_ok_and(|ip| inv.pod_with_ip(ip).is_none()))
}

/// The family of the traced packet: IPv6 if asked, or if an end is an IPv6 address; ends of
/// two families are an error.
fn family_of(from: &str, to: &str, ipv6: bool) -> Result<Family, String> {
    let to = split_port(to)?.0;
    let literal: Vec<IpAddr> = [from, to].iter().filter_map(|s| s.parse::<IpAddr>().ok()).collect();
    let v6 = literal.iter().filter(|ip| ip.is_ipv6()).count();
    if v6 > 0 && v6 < literal.len() {
        return Err(format!("--from {from} and --to {to} are of two IP families: a packet has one"));
    }
    if ipv6 && v6 < literal.len() {
        return Err("--ipv6 with an IPv4 address: give the ends' IPv6 addresses, or names".into());
    }
    Ok(if ipv6 || v6 > 0 { Family::V6 } else { Family::V4 })
}

/// `HOST:PORT` → (host, port); a bare host has no port. An IPv6 address takes a port as
/// `[ADDR]:PORT` (a bare one has colons of its own).
fn split_port(s: &str) -> Result<(&str, Option<u16>), String> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or_else(|| format!("{s:?}: no closing ']'"))?;
        return match tail {
            "" => Ok((h, None)),
            t => match t.strip_prefix(':').map(str::parse::<u16>) {
                Some(Ok(p)) => Ok((h, Some(p))),
                _ => Err(format!("{s:?}: {t:?} is not :PORT")),
            },
        };
    }
    if s.parse::<Ipv6Addr>().is_ok() {
        return Ok((s, None));
    }
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
    ipv6: bool,
) -> Result<(String, Endpoint, Endpoint), String> {
    let (to_s, port) = split_port(to)?;
    let family = match family_of(from, to, ipv6)? {
        Family::V4 if inv.ipv6_only() => Family::V6,
        f => f,
    };
    let src = resolve(inv, from, End::Source, family)?;
    let dst = resolve(inv, to_s, End::Destination, family)?;
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
        Endpoint::PortPod { ofport, mac, .. } => {
            let _ = write!(f, "in_port={ofport},");
            if let Some(m) = mac {
                let _ = write!(f, "dl_src={m},");
            }
        }
        Endpoint::RemotePod { ip, node_ip, .. } => {
            // The sender's node sets the VNID; with a state file the destination's is assumed
            // (the pair the operator asks about is then a same-tenant one).
            let vnid = match (vnid, &inv.state) {
                (Some(v), _) => Some(v),
                (None, Some(_)) => match &dst {
                    Endpoint::Pod { pod } => pod.vnid,
                    _ => None,
                },
                (None, None) => {
                    return Err(format!(
                        "source {ip} is a pod of the node at {node_ip}, which sets its VNID; this node does not \
                         record it: give --vnid N (the VNID of the pod's namespace), or --state FILE to assume \
                         the destination's"
                    ))
                }
            };
            // The tunnel's outer addresses, by the underlay's family.
            let v6 = |ip: &std::net::IpAddr| if ip.is_ipv6() { "_ipv6" } else { "" };
            let _ = write!(f, "in_port={},tun{}_src={node_ip},", OfPort::VXLAN.0, v6(node_ip));
            if let Some(local) = inv.state.as_ref().and_then(|s| s.local_subnet()) {
                let _ = write!(f, "tun{}_dst={},", v6(&local.host_ip), local.host_ip);
            }
            let _ = write!(f, "tun_id={:#x},", vnid.unwrap_or(0));
        }
        Endpoint::Service { .. } | Endpoint::Address { .. } => {
            let _ = write!(f, "in_port={},", OfPort::TUN.0);
        }
    }
    match &dst {
        Endpoint::Pod { pod } => {
            let _ = write!(f, "dl_dst={},", pod.mac);
        }
        Endpoint::PortPod { mac: Some(m), .. } => {
            let _ = write!(f, "dl_dst={m},");
        }
        _ => {}
    }
    f.push_str(match (proto, family) {
        (Proto::Tcp, Family::V4) => "tcp",
        (Proto::Udp, Family::V4) => "udp",
        (Proto::Icmp, Family::V4) => "icmp",
        (Proto::Ip, Family::V4) => "ip",
        (Proto::Tcp, Family::V6) => "tcp6",
        (Proto::Udp, Family::V6) => "udp6",
        (Proto::Icmp, Family::V6) => "icmp6",
        (Proto::Ip, Family::V6) => "ipv6",
    });
    let (s, d) = match family {
        Family::V4 => ("nw_src", "nw_dst"),
        Family::V6 => ("ipv6_src", "ipv6_dst"),
    };
    let _ = write!(f, ",{s}={},{d}={}", src.ip(family), dst.ip(family));
    match (proto, port) {
        // OVS 3.1 refuses the generic `tp_dst` here ("prerequisites not met"): the
        // protocol's own field name it is.
        (Proto::Tcp, Some(p)) => {
            let _ = write!(f, ",tcp_dst={p}");
        }
        (Proto::Udp, Some(p)) => {
            let _ = write!(f, ",udp_dst={p}");
        }
        // Echo request: ICMP 8, ICMPv6 128 (a trace flow must say icmpv6_type: OVS 3.1 refuses
        // icmp_type there, "prerequisites not met").
        (Proto::Icmp, _) if family == Family::V6 => f.push_str(",icmpv6_type=128,icmpv6_code=0"),
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
    /// The underlay address (`tun_dst`, or `tun_ipv6_dst` for a node on an IPv6 underlay).
    pub dst: Option<IpAddr>,
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
        let dst = ["tun_dst", "tun_ipv6_dst"].iter().find_map(|k| regs.0.get(*k)?.parse::<IpAddr>().ok());
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
    let mut inv = Inventory::load(args).await?;
    let ctl = match &args.ctl {
        Some(c) => c.clone(),
        None => unixctl::find_vswitchd_ctl(&args.ovs_rundir).map_err(|e| e.to_string())?,
    };
    let (flow, ends) = match (&args.flow, &args.from, &args.to) {
        (Some(f), _, _) => (f.clone(), None),
        (None, Some(from), Some(to)) => {
            if needs_switch(&inv, from, to) {
                let mgmt = args.ovs_rundir.join(format!("{}.mgmt", args.bridge));
                inv.switch = Some(discover::read(&mgmt, TIMEOUT).await);
            }
            let (f, src, dst) = build_flow(&inv, from, to, args.proto, args.vnid, args.ipv6)?;
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
        assert_eq!(split_port("fd00::5").unwrap(), ("fd00::5", None));
        assert_eq!(split_port("[fd00::5]:80").unwrap(), ("fd00::5", Some(80)));
        assert_eq!(split_port("[fd00::5]").unwrap(), ("fd00::5", None));
        assert!(split_port("[fd00::5]80").is_err());
        assert!(split_port("[fd00::5:80").is_err());
    }

    #[test]
    fn families() {
        assert_eq!(family_of("a1", "a2", false), Ok(Family::V4));
        assert_eq!(family_of("a1", "a2", true), Ok(Family::V6));
        assert_eq!(family_of("fd00::5", "a2:80", false), Ok(Family::V6));
        assert_eq!(family_of("a1", "[fd00::5]:80", false), Ok(Family::V6));
        assert_eq!(family_of("10.0.0.1", "a2", false), Ok(Family::V4));
        assert!(family_of("10.0.0.1", "fd00::5", false).unwrap_err().contains("two IP families"));
        assert!(family_of("10.0.0.1", "a2", true).unwrap_err().contains("--ipv6"));
    }
}
