//! Seed parity: our typed pipeline against the seed's own flow text, on two real switches.
//!
//! Switch A gets a state through `sdn_node::apply::converge` (OVSDB ports, one atomic bundle).
//! Switch B gets what openshift-sdn's `ovscontroller.go` (the seed) would have sent for the same
//! state: its `fmt.Sprintf` format strings are reproduced below as plain `format!` strings, one
//! function per seed operation, line by line, and applied with `ovs-ofctl add-flows` /
//! `del-flows` in the order the seed would run them. Nothing here calls our pipeline code to
//! build B's flows: the oracle reads the state's YAML itself and formats the raw strings, as the
//! seed formats the strings of its API objects.
//!
//! Both switches print their tables through the same `ovs-ofctl dump-flows` decoder, so the
//! comparison (sorted lines, cookies removed) is a comparison of what was installed.
//!
//! Where the seed's behaviour depends on openshift-sdn code outside `ovscontroller.go` (node
//! start order, the policy plugins, when multicast and VNID rules are refreshed), the oracle's
//! choice is stated in an `ASSUMPTION:` comment.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, ToSocketAddrs};
use std::process::Command;

use ipnet::Ipv4Net;
use sdn_node::apply::{converge, ApplyOptions, ApplyReport};
use sdn_harness::sandbox::{OvsSandbox, SandboxOptions};
use serde::Deserialize;
use support::{dump_sorted, ofctl};

const EXAMPLE: &str = include_str!("../deploy/examples/cluster.yaml");

// ---------------------------------------------------------------------------------------------
// The oracle's view of a state: the YAML objects as the API would hold them (raw strings).
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct World {
    node: String,
    plugin: String,
    cluster_network: String,
    service_network: String,
    #[serde(default)]
    host_subnets: Vec<WHostSubnet>,
    #[serde(default)]
    net_namespaces: Vec<WNetNamespace>,
    #[serde(default)]
    services: Vec<WService>,
    #[serde(default)]
    pods: Vec<WPod>,
    #[serde(default)]
    egress_network_policies: Vec<WEgressPolicy>,
}

#[derive(Deserialize, Clone, Debug)]
struct WHostSubnet {
    host: String,
    #[serde(rename = "hostIP")]
    host_ip: String,
    subnet: String,
    /// The `pod.network.openshift.io/fixed-vnid-host` annotation (a string in the seed).
    #[serde(default, rename = "fixedVNID")]
    fixed_vnid: Option<u32>,
}

#[derive(Deserialize, Clone, Debug)]
struct WNetNamespace {
    name: String,
    netid: u32,
    #[serde(default)]
    multicast: bool,
}

#[derive(Deserialize, Clone, Debug)]
struct WService {
    namespace: String,
    name: String,
    #[serde(rename = "clusterIP")]
    cluster_ip: String,
    #[serde(default)]
    ports: Vec<WServicePort>,
}

#[derive(Deserialize, Clone, Debug)]
struct WServicePort {
    protocol: String,
    port: i64,
}

#[derive(Deserialize, Clone, Debug)]
struct WPod {
    namespace: String,
    name: String,
    #[serde(rename = "containerID")]
    container_id: String,
    #[serde(rename = "hostVeth")]
    host_veth: String,
    ip: String,
    mac: String,
}

#[derive(Deserialize, Clone, Debug)]
struct WEgressPolicy {
    namespace: String,
    name: String,
    #[serde(default)]
    egress: Vec<WEgressRule>,
}

#[derive(Deserialize, Clone, Debug)]
struct WEgressRule {
    #[serde(rename = "type")]
    kind: String,
    to: WEgressTo,
}

#[derive(Deserialize, Clone, Debug)]
struct WEgressTo {
    #[serde(default, rename = "cidrSelector")]
    cidr_selector: Option<String>,
    #[serde(default, rename = "dnsName")]
    dns_name: Option<String>,
}

/// Pod ofports as switch A assigned them, by `namespace/name`.
type Ofports = BTreeMap<String, u32>;

fn pod_key(p: &WPod) -> String {
    format!("{}/{}", p.namespace, p.name)
}

impl World {
    fn parse(yaml: &str) -> World {
        let v: serde_json::Value = serde_saphyr::from_str(yaml).expect("oracle: YAML");
        serde_json::from_value(v).expect("oracle: state shape")
    }

    fn multitenant(&self) -> bool {
        match self.plugin.as_str() {
            "multitenant" => true,
            "subnet" => false,
            other => panic!("oracle: unknown plugin {other}"),
        }
    }

    /// openshift-sdn's plugin ids (osdn.go): subnet 0, multitenant 1 (networkpolicy 2).
    fn plugin_id(&self) -> u8 {
        u8::from(self.multitenant())
    }

    fn local(&self) -> &WHostSubnet {
        self.host_subnets
            .iter()
            .find(|h| h.host == self.node)
            .expect("oracle: local subnet")
    }

    fn remotes(&self) -> Vec<&WHostSubnet> {
        self.host_subnets
            .iter()
            .filter(|h| h.host != self.node)
            .collect()
    }

    /// `netutils.GenerateDefaultGateway`: the subnet's first host address.
    fn gateway(&self) -> String {
        let n: Ipv4Net = self.local().subnet.parse().expect("oracle: subnet");
        Ipv4Addr::from(u32::from(n.network()) + 1).to_string()
    }

    /// policy.GetVNID: the subnet plugin puts everything in VNID 0.
    fn vnid(&self, namespace: &str) -> u32 {
        if !self.multitenant() {
            return 0;
        }
        self.net_namespaces
            .iter()
            .find(|n| n.name == namespace)
            .map(|n| n.netid)
            .expect("oracle: namespace")
    }

    /// policy.GetNamespaces(vnid).
    fn namespaces(&self, vnid: u32) -> Vec<String> {
        self.net_namespaces
            .iter()
            .filter(|n| self.vnid(&n.name) == vnid)
            .map(|n| n.name.clone())
            .collect()
    }

    /// vnids.GetMulticastEnabled(vnid).
    /// ASSUMPTION: the seed keeps one flag per netid, last NetNamespace event wins; the states
    /// here never give the namespaces of one netid different flags, so "any" is equivalent.
    fn multicast_enabled(&self, vnid: u32) -> bool {
        self.net_namespaces
            .iter()
            .any(|n| self.vnid(&n.name) == vnid && n.multicast)
    }

    /// The ofports of the given local pods whose namespace has `vnid` (podManager's
    /// UpdateLocalMulticastRules collects these from its running pods).
    fn ofports_of<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a WPod>,
        ports: &Ofports,
        vnid: u32,
    ) -> Vec<u32> {
        pods.into_iter()
            .filter(|p| self.vnid(&p.namespace) == vnid)
            .map(|p| ports[&pod_key(p)])
            .collect()
    }

    fn remote_ips(&self) -> Vec<String> {
        self.remotes().iter().map(|h| h.host_ip.clone()).collect()
    }

    fn pod(&self, name: &str) -> &WPod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .expect("oracle: pod")
    }

    fn service(&self, name: &str) -> &WService {
        self.services
            .iter()
            .find(|s| s.name == name)
            .expect("oracle: service")
    }

    fn host_subnet(&self, host: &str) -> &WHostSubnet {
        self.host_subnets
            .iter()
            .find(|h| h.host == host)
            .expect("oracle: hostsubnet")
    }

    fn policies_of(&self, vnid: u32) -> Vec<WEgressPolicy> {
        self.egress_network_policies
            .iter()
            .filter(|p| self.vnid(&p.namespace) == vnid)
            .cloned()
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The seed: ovscontroller.go's operations, format string by format string, applied to switch B.
// ---------------------------------------------------------------------------------------------

const VERSION: u8 = 3;
const VERSION_TABLE: u8 = 253;

enum Op {
    Add(String),
    Delete(String),
}

/// `ovs.Transaction`: AddFlow / DeleteFlows in order; EndTransaction sends them.
#[derive(Default)]
struct Txn(Vec<Op>);

impl Txn {
    fn add_flow(&mut self, flow: String) {
        self.0.push(Op::Add(flow));
    }
    fn delete_flows(&mut self, flow: String) {
        self.0.push(Op::Delete(flow));
    }
}

/// A flow of `ovs-ofctl dump-flows`, split the way `ovs.ParseFlow(ParseForDump, …)` splits it.
struct ParsedFlow {
    table: u32,
    fields: Vec<(String, String)>,
    actions: Vec<(String, String)>,
}

impl ParsedFlow {
    fn parse(line: &str) -> Option<ParsedFlow> {
        let (m, a) = line.trim().split_once(" actions=")?;
        let kv = |s: &str, sep: char| match s.split_once(sep) {
            Some((k, v)) => (k.trim().to_string(), v.trim().to_string()),
            None => (s.trim().to_string(), String::new()),
        };
        let fields: Vec<(String, String)> = m
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| kv(s, '='))
            .collect();
        let table = fields
            .iter()
            .find(|(k, _)| k == "table")
            .map_or(0, |(_, v)| v.parse().unwrap_or(0));
        let actions = a.split(',').map(|s| kv(s, ':')).collect();
        Some(ParsedFlow {
            table,
            fields,
            actions,
        })
    }
    fn find_field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    fn note_has_prefix(&self, prefix: &str) -> bool {
        self.actions
            .iter()
            .any(|(k, v)| k == "note" && v.starts_with(prefix))
    }
}

/// strconv.ParseInt(s, 0, 32).
fn parse_int0(s: &str) -> Option<i64> {
    match s.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// EgressDNS.GetIPs: the IPv4 answers for a name.
/// ASSUMPTION: IPv4 only (an IPv6 answer would make the seed's whole transaction fail).
fn egress_dns_get_ips(name: &str) -> Vec<Ipv4Addr> {
    let mut v: Vec<Ipv4Addr> = match (name, 0).to_socket_addrs() {
        Ok(addrs) => addrs
            .filter_map(|a| match a.ip() {
                std::net::IpAddr::V4(v4) => Some(v4),
                std::net::IpAddr::V6(_) => None,
            })
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    v.dedup();
    v
}

/// CheckDNSResolver.
/// ASSUMPTION: the seed's check is of the resolver itself (egress_dns.go); on an offline node it
/// is the resolver that fails, so "a dnsName of the policy gets no answer" is modelled as the
/// resolver failing — which is also what our agent does (drop all egress of that VNID).
fn check_dns_resolver(policy: &WEgressPolicy) -> Result<(), String> {
    for r in &policy.egress {
        if let Some(d) = r.to.dns_name.as_deref().filter(|d| !d.is_empty()) {
            if egress_dns_get_ips(d).is_empty() {
                return Err(format!("no answer for {d}"));
            }
        }
    }
    Ok(())
}

fn policy_names(policies: &[WEgressPolicy]) -> String {
    policies
        .iter()
        .map(|p| format!("{}:{}", p.namespace, p.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn generate_base_service_rule(ip: &str) -> String {
    format!("table=60, ip, nw_dst={}", ip)
}

fn generate_base_add_service_rule(ip: &str, protocol: &str, port: i64) -> Result<String, String> {
    let dst = if protocol == "UDP" {
        format!(", udp, udp_dst={}", port)
    } else if protocol == "TCP" {
        format!(", tcp, tcp_dst={}", port)
    } else {
        return Err(format!("unhandled protocol {}", protocol));
    };
    Ok(generate_base_service_rule(ip) + &dst)
}

fn get_pod_note(container_id: &str) -> Result<String, String> {
    if !container_id.len().is_multiple_of(2) || !container_id.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(format!("failed to decode container ID {:?}", container_id));
    }
    let bytes: Vec<u8> = (0..container_id.len() / 2)
        .map(|i| u8::from_str_radix(&container_id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    if bytes.len() != 32 {
        return Err(format!(
            "invalid container ID {:?} length; expected 32 bytes",
            container_id
        ));
    }
    let mut note = String::new();
    for b in bytes {
        if !note.is_empty() {
            note += ".";
        }
        note += &format!("{:02x}", b);
    }
    Ok(note)
}

/// ovsController (+ the policy plugin's table-80 code), bound to switch B.
struct Seed<'a> {
    sb: &'a OvsSandbox,
    plugin_id: u8,
    multitenant: bool,
    /// multiTenantPlugin.vnidInUse.
    vnid_in_use: BTreeSet<u32>,
    files: u32,
}

impl<'a> Seed<'a> {
    fn new(sb: &'a OvsSandbox, w: &World) -> Seed<'a> {
        Seed {
            sb,
            plugin_id: w.plugin_id(),
            multitenant: w.multitenant(),
            vnid_in_use: BTreeSet::new(),
            files: 0,
        }
    }

    /// EndTransaction: the transaction's adds (batched as they come) and deletes, in order.
    fn end_transaction(&mut self, otx: Txn) {
        let mut adds: Vec<String> = Vec::new();
        let flush = |seed: &mut Seed, adds: &mut Vec<String>| {
            if adds.is_empty() {
                return;
            }
            seed.files += 1;
            let path = seed.sb.dir().join(format!("seed-{}.flows", seed.files));
            std::fs::write(&path, adds.join("\n") + "\n").expect("write flows file");
            ofctl(
                seed.sb,
                &["add-flows", "br0", path.to_str().expect("utf-8 path")],
            );
            adds.clear();
        };
        for op in otx.0 {
            match op {
                Op::Add(f) => adds.push(f),
                Op::Delete(f) => {
                    flush(self, &mut adds);
                    ofctl(self.sb, &["del-flows", "br0", &f]);
                }
            }
        }
        flush(self, &mut adds);
    }

    fn dump_flows(&self) -> Vec<String> {
        ofctl(self.sb, &["dump-flows", "--no-stats", "--no-names", "br0"])
            .lines()
            .filter(|l| !l.starts_with("OFPST_FLOW") && !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    }

    fn get_version_note(&self) -> String {
        format!("{:02X}.{:02X}", self.plugin_id, VERSION)
    }

    fn setup_ovs(
        &mut self,
        cluster_network_cidr: &str,
        service_network_cidr: &str,
        local_subnet_cidr: &str,
        local_subnet_gateway: &str,
    ) {
        // AddBridge("fail-mode=secure", "protocols=OpenFlow13"): B's br0 is created so.
        ofctl(self.sb, &["set-frags", "br0", "nx-match"]);
        // AddPort(VXLAN, 1, …) / AddPort(TUN, 2, …) are OVSDB only; B's flows name ofports 1
        // and 2 without the ports existing.
        let mut otx = Txn::default();
        // Table 0: initial dispatch based on in_port
        // vxlan0
        otx.add_flow(format!("table=0, priority=200, in_port=1, arp, nw_src={}, nw_dst={}, actions=move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],goto_table:10", cluster_network_cidr, local_subnet_cidr));
        otx.add_flow(format!("table=0, priority=200, in_port=1, ip, nw_src={}, nw_dst={}, actions=move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],goto_table:10", cluster_network_cidr, local_subnet_cidr));
        otx.add_flow(format!("table=0, priority=200, in_port=1, ip, nw_src={}, nw_dst=224.0.0.0/4, actions=move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],goto_table:10", cluster_network_cidr));
        otx.add_flow("table=0, priority=150, in_port=1, actions=drop".to_string());
        // tun0
        otx.add_flow(
            "table=0, priority=250, in_port=2, ip, nw_dst=224.0.0.0/4, actions=drop".to_string(),
        );
        otx.add_flow(format!(
            "table=0, priority=200, in_port=2, arp, nw_src={}, nw_dst={}, actions=goto_table:30",
            local_subnet_gateway, cluster_network_cidr
        ));
        otx.add_flow("table=0, priority=200, in_port=2, ip, actions=goto_table:30".to_string());
        otx.add_flow("table=0, priority=150, in_port=2, actions=drop".to_string());
        // else, from a container
        otx.add_flow("table=0, priority=100, arp, actions=goto_table:20".to_string());
        otx.add_flow("table=0, priority=100, ip, actions=goto_table:20".to_string());
        otx.add_flow("table=0, priority=0, actions=drop".to_string());

        // Table 10: VXLAN ingress filtering; filled in by AddHostSubnetRules()
        otx.add_flow("table=10, priority=0, actions=drop".to_string());

        // Table 20: from OpenShift container; filled in by setupPodFlows
        otx.add_flow("table=20, priority=0, actions=drop".to_string());

        // Table 21: from OpenShift container; NetworkPolicy plugin uses this for connection tracking
        otx.add_flow("table=21, priority=0, actions=goto_table:30".to_string());

        // Table 30: general routing
        otx.add_flow(format!(
            "table=30, priority=300, arp, nw_dst={}, actions=output:2",
            local_subnet_gateway
        ));
        otx.add_flow(format!(
            "table=30, priority=200, arp, nw_dst={}, actions=goto_table:40",
            local_subnet_cidr
        ));
        otx.add_flow(format!(
            "table=30, priority=100, arp, nw_dst={}, actions=goto_table:50",
            cluster_network_cidr
        ));
        otx.add_flow(format!(
            "table=30, priority=300, ip, nw_dst={}, actions=output:2",
            local_subnet_gateway
        ));
        otx.add_flow(format!(
            "table=30, priority=100, ip, nw_dst={}, actions=goto_table:60",
            service_network_cidr
        ));
        otx.add_flow(format!(
            "table=30, priority=200, ip, nw_dst={}, actions=goto_table:70",
            local_subnet_cidr
        ));
        otx.add_flow(format!(
            "table=30, priority=100, ip, nw_dst={}, actions=goto_table:90",
            cluster_network_cidr
        ));

        // Multicast coming from the VXLAN
        otx.add_flow(
            "table=30, priority=50, in_port=1, ip, nw_dst=224.0.0.0/4, actions=goto_table:120"
                .to_string(),
        );
        // Multicast coming from local pods
        otx.add_flow(
            "table=30, priority=25, ip, nw_dst=224.0.0.0/4, actions=goto_table:110".to_string(),
        );

        otx.add_flow("table=30, priority=0, ip, actions=goto_table:100".to_string());
        otx.add_flow("table=30, priority=0, arp, actions=drop".to_string());

        // Table 40: ARP to local container, filled in by setupPodFlows
        otx.add_flow("table=40, priority=0, actions=drop".to_string());

        // Table 50: ARP to remote container; filled in by AddHostSubnetRules()
        otx.add_flow("table=50, priority=0, actions=drop".to_string());

        // Table 60: IP to service: vnid/port mappings; filled in by AddServiceRules()
        otx.add_flow("table=60, priority=200, reg0=0, actions=output:2".to_string());
        otx.add_flow("table=60, priority=0, actions=drop".to_string());

        // Table 70: IP to local container: vnid/port mappings; filled in by setupPodFlows
        otx.add_flow("table=70, priority=0, actions=drop".to_string());

        // Table 80: IP policy enforcement; mostly managed by the osdnPolicy
        otx.add_flow(format!(
            "table=80, priority=300, ip, nw_src={}/32, actions=output:NXM_NX_REG2[]",
            local_subnet_gateway
        ));
        otx.add_flow("table=80, priority=0, actions=drop".to_string());

        // Table 90: IP to remote container; filled in by AddHostSubnetRules()
        otx.add_flow("table=90, priority=0, actions=drop".to_string());

        // Table 100: egress network policy dispatch; edited by UpdateEgressNetworkPolicy()
        otx.add_flow("table=100, priority=0, actions=output:2".to_string());

        // Table 110: outbound multicast filtering, updated by UpdateLocalMulticastFlows()
        otx.add_flow("table=110, priority=0, actions=drop".to_string());

        // Table 111: multicast delivery from local pods to the VXLAN; only one rule, updated by UpdateVXLANMulticastRules()
        otx.add_flow("table=111, priority=100, actions=goto_table:120".to_string());

        // Table 120: multicast delivery to local pods (either from VXLAN or local pods); updated by UpdateLocalMulticastFlows()
        otx.add_flow("table=120, priority=0, actions=drop".to_string());

        // Table 253: rule version note
        otx.add_flow(format!(
            "table={}, actions=note:{}",
            VERSION_TABLE,
            self.get_version_note()
        ));

        self.end_transaction(otx);
    }

    fn setup_pod_flows(&mut self, ofport: u32, pod_ip: &str, pod_mac: &str, note: &str, vnid: u32) {
        let mut otx = Txn::default();

        // ARP/IP traffic from container
        otx.add_flow(format!("table=20, priority=100, in_port={}, arp, nw_src={}, arp_sha={}, actions=load:{}->NXM_NX_REG0[], note:{}, goto_table:21", ofport, pod_ip, pod_mac, vnid, note));
        otx.add_flow(format!("table=20, priority=100, in_port={}, ip, nw_src={}, actions=load:{}->NXM_NX_REG0[], goto_table:21", ofport, pod_ip, vnid));

        // ARP request/response to container (not isolated)
        otx.add_flow(format!(
            "table=40, priority=100, arp, nw_dst={}, actions=output:{}",
            pod_ip, ofport
        ));

        // IP traffic to container
        otx.add_flow(format!("table=70, priority=100, ip, nw_dst={}, actions=load:{}->NXM_NX_REG1[], load:{}->NXM_NX_REG2[], goto_table:80", pod_ip, vnid, ofport));

        self.end_transaction(otx);
    }

    fn cleanup_pod_flows(&mut self, pod_ip: &str) {
        let mut otx = Txn::default();
        otx.delete_flows(format!("ip, nw_dst={}", pod_ip));
        otx.delete_flows(format!("ip, nw_src={}", pod_ip));
        otx.delete_flows(format!("arp, nw_dst={}", pod_ip));
        otx.delete_flows(format!("arp, nw_src={}", pod_ip));
        self.end_transaction(otx);
    }

    /// SetUpPod; ensureOvsPort is switch A's job: `ofport` is the one A assigned.
    fn set_up_pod(
        &mut self,
        ofport: u32,
        pod_ip: &str,
        pod_mac: &str,
        container_id: &str,
        vnid: u32,
    ) {
        let note = get_pod_note(container_id).expect("pod note");
        self.setup_pod_flows(ofport, pod_ip, pod_mac, &note, vnid);
    }

    fn get_pod_details_by_container_id(
        flows: &[String],
        container_id: &str,
    ) -> Result<(u32, String, String, String), String> {
        let note = get_pod_note(container_id)?;
        for flow in flows {
            let Some(parsed) = ParsedFlow::parse(flow) else {
                return Err(format!("cannot parse {flow}"));
            };
            if parsed.table != 20 || !parsed.note_has_prefix(&note) {
                continue;
            }
            let (Some(mac), Some(port), Some(ip)) = (
                parsed.find_field("arp_sha"),
                parsed.find_field("in_port"),
                parsed.find_field("arp_spa"),
            ) else {
                continue;
            };
            let ofport: u32 = port
                .parse()
                .map_err(|e| format!("failed to parse ofport {port:?}: {e}"))?;
            return Ok((ofport, ip.to_string(), mac.to_string(), note));
        }
        Err("failed to find pod details from OVS flows".into())
    }

    fn update_pod(&mut self, container_id: &str, vnid: u32) {
        let flows = self.dump_flows();
        let (ofport, pod_ip, pod_mac, note) =
            Self::get_pod_details_by_container_id(&flows, container_id)
                .expect("UpdatePod: pod details");
        self.cleanup_pod_flows(&pod_ip);
        self.setup_pod_flows(ofport, &pod_ip, &pod_mac, &note, vnid);
    }

    /// TearDownPod; SetPodBandwidth(-1, -1) and DeletePort are OVSDB only (switch A's job).
    fn tear_down_pod(&mut self, pod_ip: &str) {
        self.cleanup_pod_flows(pod_ip);
    }

    fn update_egress_network_policy_rules(
        &mut self,
        policies: &[WEgressPolicy],
        vnid: u32,
        namespaces: &[String],
    ) -> Result<(), String> {
        let mut otx = Txn::default();
        let mut input_err: Option<String> = None;

        if policies.is_empty() {
            otx.delete_flows(format!("table=100, reg0={}", vnid));
        } else if vnid == 0 {
            input_err = Some(format!(
                "EgressNetworkPolicy in global network namespace is not allowed ({}); ignoring",
                policy_names(policies)
            ));
        } else if namespaces.len() > 1 {
            input_err = Some(format!(
                "EgressNetworkPolicy not allowed in shared NetNamespace ({}); dropping all traffic",
                namespaces.join(", ")
            ));
            otx.delete_flows(format!("table=100, reg0={}", vnid));
            otx.add_flow(format!(
                "table=100, reg0={}, priority=1, actions=drop",
                vnid
            ));
        } else if policies.len() > 1 {
            input_err = Some(format!("multiple EgressNetworkPolicies in same network namespace ({}) is not allowed; dropping all traffic", policy_names(policies)));
            otx.delete_flows(format!("table=100, reg0={}", vnid));
            otx.add_flow(format!(
                "table=100, reg0={}, priority=1, actions=drop",
                vnid
            ));
        } else {
            // Temporarily drop all outgoing traffic, to avoid race conditions while modifying the other rules
            otx.add_flow(format!(
                "table=100, reg0={}, cookie=1, priority=65535, actions=drop",
                vnid
            ));
            otx.delete_flows(format!("table=100, reg0={}, cookie=0/1", vnid));

            let mut dns_found = false;
            let rules = &policies[0].egress;
            for (i, rule) in rules.iter().enumerate() {
                let priority = rules.len() - i;

                let action = if rule.kind == "Allow" {
                    "output:2"
                } else {
                    "drop"
                };

                let mut selectors: Vec<String> = Vec::new();
                let cidr = rule.to.cidr_selector.clone().unwrap_or_default();
                let dns = rule.to.dns_name.clone().unwrap_or_default();
                if !cidr.is_empty() {
                    selectors.push(cidr);
                } else if !dns.is_empty() {
                    dns_found = true;
                    for ip in egress_dns_get_ips(&dns) {
                        selectors.push(ip.to_string());
                    }
                }

                for selector in selectors {
                    let dst = if selector == "0.0.0.0/0" {
                        String::new()
                    } else if selector == "0.0.0.0/32" {
                        // glog.Warningf("Correcting CIDRSelector '0.0.0.0/32' to '0.0.0.0/0' …")
                        String::new()
                    } else {
                        format!(", nw_dst={}", selector)
                    };

                    otx.add_flow(format!(
                        "table=100, reg0={}, priority={}, ip{}, actions={}",
                        vnid, priority, dst, action
                    ));
                }
            }

            if dns_found {
                if let Err(e) = check_dns_resolver(&policies[0]) {
                    input_err = Some(format!(
                        "DNS resolver failed: {}, dropping all traffic for namespace: {:?}",
                        e, namespaces[0]
                    ));
                    otx.delete_flows(format!("table=100, reg0={}", vnid));
                    otx.add_flow(format!(
                        "table=100, reg0={}, priority=1, actions=drop",
                        vnid
                    ));
                }
            }
            otx.delete_flows(format!("table=100, reg0={}, cookie=1/1", vnid));
        }

        self.end_transaction(otx);
        match input_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn add_host_subnet_rules(&mut self, subnet: &WHostSubnet) {
        let mut otx = Txn::default();

        otx.add_flow(format!(
            "table=10, priority=100, tun_src={}, actions=goto_table:30",
            subnet.host_ip
        ));
        if let Some(vnid) = subnet.fixed_vnid.map(|v| v.to_string()) {
            otx.add_flow(format!("table=50, priority=100, arp, nw_dst={}, actions=load:{}->NXM_NX_TUN_ID[0..31],set_field:{}->tun_dst,output:1", subnet.subnet, vnid, subnet.host_ip));
            otx.add_flow(format!("table=90, priority=100, ip, nw_dst={}, actions=load:{}->NXM_NX_TUN_ID[0..31],set_field:{}->tun_dst,output:1", subnet.subnet, vnid, subnet.host_ip));
        } else {
            otx.add_flow(format!("table=50, priority=100, arp, nw_dst={}, actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:{}->tun_dst,output:1", subnet.subnet, subnet.host_ip));
            otx.add_flow(format!("table=90, priority=100, ip, nw_dst={}, actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:{}->tun_dst,output:1", subnet.subnet, subnet.host_ip));
        }

        self.end_transaction(otx);
    }

    fn delete_host_subnet_rules(&mut self, subnet: &WHostSubnet) {
        let mut otx = Txn::default();
        otx.delete_flows(format!("table=10, tun_src={}", subnet.host_ip));
        otx.delete_flows(format!("table=50, arp, nw_dst={}", subnet.subnet));
        otx.delete_flows(format!("table=90, ip, nw_dst={}", subnet.subnet));
        self.end_transaction(otx);
    }

    fn add_service_rules(&mut self, service: &WService, net_id: u32) {
        let mut otx = Txn::default();

        let action = format!(
            ", priority=100, actions=load:{}->NXM_NX_REG1[], load:2->NXM_NX_REG2[], goto_table:80",
            net_id
        );

        // Add blanket rule allowing subsequent IP fragments
        otx.add_flow(generate_base_service_rule(&service.cluster_ip) + ", ip_frag=later" + &action);

        for port in &service.ports {
            match generate_base_add_service_rule(&service.cluster_ip, &port.protocol, port.port) {
                Ok(base_rule) => otx.add_flow(base_rule + &action),
                // glog.Errorf("Error creating OVS flow for service …")
                // DEVIATION (deliberate): the seed has no `continue` here and goes on to
                // AddFlow("" + action), i.e. `, priority=100, actions=load:…,goto_table:80`,
                // which ovs-ofctl accepts as a table-0 catch-all (see
                // `example_multitenant_localhost_dns`). The branch was unreachable in the seed's
                // Kubernetes (the API admitted only TCP and UDP); the evident intent, and what
                // our agent does, is to skip the port.
                Err(_) => continue,
            }
        }

        self.end_transaction(otx);
    }

    fn delete_service_rules(&mut self, service: &WService) {
        let mut otx = Txn::default();
        otx.delete_flows(generate_base_service_rule(&service.cluster_ip));
        self.end_transaction(otx);
    }

    fn update_local_multicast_flows(&mut self, vnid: u32, enabled: bool, ofports: &[u32]) {
        let mut otx = Txn::default();

        if enabled {
            otx.add_flow(format!("table=110, reg0={}, actions=goto_table:111", vnid));
        } else {
            otx.delete_flows(format!("table=110, reg0={}", vnid));
        }

        if enabled && !ofports.is_empty() {
            let mut actions: Vec<String> = ofports
                .iter()
                .map(|ofport| format!("output:{}", ofport))
                .collect();
            // sort.Strings: bytewise, like Rust's str ordering.
            actions.sort();
            otx.add_flow(format!(
                "table=120, priority=100, reg0={}, actions={}",
                vnid,
                actions.join(",")
            ));
        } else {
            otx.delete_flows(format!("table=120, reg0={}", vnid));
        }

        self.end_transaction(otx);
    }

    fn update_vxlan_multicast_flows(&mut self, remote_ips: &[String]) {
        let mut otx = Txn::default();

        if !remote_ips.is_empty() {
            let mut actions: Vec<String> = remote_ips
                .iter()
                .map(|ip| format!("set_field:{}->tun_dst,output:1", ip))
                .collect();
            actions.sort();
            otx.add_flow(format!("table=111, priority=100, actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],{},goto_table:120", actions.join(",")));
        } else {
            otx.add_flow("table=111, priority=100, actions=goto_table:120".to_string());
        }

        self.end_transaction(otx);
    }

    fn find_unused_vnids(&self) -> Vec<u32> {
        let mut in_use: BTreeSet<i64> = BTreeSet::from([0]);
        let mut policy: BTreeSet<i64> = BTreeSet::from([0]);
        for flow in self.dump_flows() {
            let Some(parsed) = ParsedFlow::parse(&flow) else {
                continue;
            };
            if parsed.table == 60 || parsed.table == 70 {
                for (name, value) in &parsed.actions {
                    if name != "load" || !value.contains("REG1") {
                        continue;
                    }
                    let Some((v, _)) = value.split_once("->") else {
                        continue;
                    };
                    if let Some(vnid) = parse_int0(v) {
                        in_use.insert(vnid);
                        break;
                    }
                }
            }
            if parsed.table == 80 {
                if let Some(vnid) = parsed.find_field("reg1").and_then(parse_int0) {
                    policy.insert(vnid);
                }
            }
        }
        policy.difference(&in_use).map(|v| *v as u32).collect()
    }

    // -- The policy plugins' table 80 (multitenant.go / singletenant.go) --

    /// policy.Start: the plugin's fixed table-80 rules.
    fn policy_start(&mut self) {
        let mut otx = Txn::default();
        if self.multitenant {
            otx.add_flow(
                "table=80, priority=200, reg0=0, actions=output:NXM_NX_REG2[]".to_string(),
            );
            otx.add_flow("table=80, priority=200, reg1=0, actions=output:NXM_NX_REG2[]".to_string());
        } else {
            otx.add_flow("table=80, priority=200, actions=output:NXM_NX_REG2[]".to_string());
        }
        self.end_transaction(otx);
    }

    /// EnsureVNIDRules (a no-op in the subnet plugin, and for VNID 0: openshift-sdn's
    /// multitenant plugin returns early for the global VNID).
    fn ensure_vnid_rules(&mut self, vnid: u32) {
        if !self.multitenant || vnid == 0 || !self.vnid_in_use.insert(vnid) {
            return;
        }
        let mut otx = Txn::default();
        otx.add_flow(format!(
            "table=80, priority=100, reg0={}, reg1={}, actions=output:NXM_NX_REG2[]",
            vnid, vnid
        ));
        self.end_transaction(otx);
    }

    /// SyncVNIDRules.
    fn sync_vnid_rules(&mut self) {
        if !self.multitenant {
            return;
        }
        let unused = self.find_unused_vnids();
        let mut otx = Txn::default();
        for vnid in unused {
            self.vnid_in_use.remove(&vnid);
            otx.delete_flows(format!("table=80, reg1={}", vnid));
        }
        self.end_transaction(otx);
    }

    // -- openshift-sdn's node code around the controller --

    /// A node starting on a fresh switch with the whole state `w`.
    /// ASSUMPTION (node.go Start): SetupOVS; policy.Start (table 80; multitenant also runs
    /// SetupEgressNetworkPolicy, one update per EgressNetworkPolicy event, in list order);
    /// HostSubnet events (AddHostSubnetRules, then in multitenant the VXLAN multicast rule from
    /// the subnets known so far); NetNamespace events (multitenant: local multicast per netid);
    /// pods (SetUpPod, EnsureVNIDRules, multitenant: local multicast of the pod's VNID); services
    /// (AddServiceRules, EnsureVNIDRules). Only flows with the same table/priority/match depend
    /// on this order (table 111, table 100's policy sequence), and those follow the seed's events.
    fn node_start(&mut self, w: &World, ports: &Ofports) {
        self.setup_ovs(
            &w.cluster_network,
            &w.service_network,
            &w.local().subnet,
            &w.gateway(),
        );
        self.policy_start();
        // ASSUMPTION: in subnet mode every namespace is VNID 0, so whether or not the subnet
        // plugin watches EgressNetworkPolicies, they all hit the "global namespace" branch.
        for (i, p) in w.egress_network_policies.iter().enumerate() {
            let vnid = w.vnid(&p.namespace);
            let so_far: Vec<WEgressPolicy> = w.egress_network_policies[..=i]
                .iter()
                .filter(|q| w.vnid(&q.namespace) == vnid)
                .cloned()
                .collect();
            // The seed logs input errors and goes on.
            let _ = self.update_egress_network_policy_rules(&so_far, vnid, &w.namespaces(vnid));
        }
        let remotes = w.remotes();
        for (i, h) in remotes.iter().enumerate() {
            self.add_host_subnet_rules(h);
            if self.multitenant {
                let ips: Vec<String> = remotes[..=i].iter().map(|h| h.host_ip.clone()).collect();
                self.update_vxlan_multicast_flows(&ips);
            }
        }
        if self.multitenant {
            for n in &w.net_namespaces {
                self.update_local_multicast_flows(n.netid, w.multicast_enabled(n.netid), &[]);
            }
        }
        for (i, p) in w.pods.iter().enumerate() {
            let vnid = w.vnid(&p.namespace);
            self.set_up_pod(ports[&pod_key(p)], &p.ip, &p.mac, &p.container_id, vnid);
            self.ensure_vnid_rules(vnid);
            if self.multitenant {
                let ofports = w.ofports_of(&w.pods[..=i], ports, vnid);
                self.update_local_multicast_flows(vnid, w.multicast_enabled(vnid), &ofports);
            }
        }
        for s in &w.services {
            let vnid = w.vnid(&s.namespace);
            self.add_service_rules(s, vnid);
            self.ensure_vnid_rules(vnid);
        }
    }

    /// A pod added on a running node.
    fn pod_added(&mut self, w: &World, ports: &Ofports, name: &str) {
        let p = w.pod(name);
        let vnid = w.vnid(&p.namespace);
        self.set_up_pod(ports[&pod_key(p)], &p.ip, &p.mac, &p.container_id, vnid);
        self.ensure_vnid_rules(vnid);
        if self.multitenant {
            let ofports = w.ofports_of(&w.pods, ports, vnid);
            self.update_local_multicast_flows(vnid, w.multicast_enabled(vnid), &ofports);
        }
    }

    /// A pod deleted on a running node; `after` is the state without it.
    fn pod_deleted(&mut self, before: &World, after: &World, ports: &Ofports, name: &str) {
        let p = before.pod(name);
        let vnid = before.vnid(&p.namespace);
        self.tear_down_pod(&p.ip);
        if self.multitenant {
            let remaining: Vec<&WPod> = before.pods.iter().filter(|q| q.name != name).collect();
            let ofports = before.ofports_of(remaining, ports, vnid);
            self.update_local_multicast_flows(vnid, after.multicast_enabled(vnid), &ofports);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Switches A and B.
// ---------------------------------------------------------------------------------------------

struct Pair {
    /// Converged by our agent.
    a: OvsSandbox,
    /// Programmed by the seed oracle.
    b: OvsSandbox,
}

impl Pair {
    async fn start() -> Pair {
        let start_a = OvsSandbox::start(SandboxOptions::default());
        let start_b = async {
            let b = OvsSandbox::start(SandboxOptions::default()).await?;
            b.add_bridge("br0", "dummy").await?;
            Ok::<_, sdn_harness::sandbox::SandboxError>(b)
        };
        let (a, b) = tokio::join!(start_a, start_b);
        Pair {
            a: a.expect("start sandbox A"),
            b: b.expect("start sandbox B with br0"),
        }
    }

    /// Parses `yaml` with our state file parser and converges switch A to it.
    async fn converge(&self, yaml: &str) -> ApplyReport {
        let (state, _problems) = sdn_node::cluster::state_file::parse(yaml).expect("state parses");
        let mut opts = ApplyOptions::new(
            self.a.dir().join("unused-state.yaml"),
            self.a.dir().to_path_buf(),
        );
        opts.bridge.datapath_type = Some(sdn_node::options::DatapathType::Dummy);
        converge(&opts, &state).await.expect("converge")
    }

    /// The ofports A assigned to the pods' ports (`ovs-vsctl … list Interface`).
    fn ofports(&self, w: &World) -> Ofports {
        let out = Command::new("ovs-vsctl")
            .arg(format!("--db={}", self.a.db_socket()))
            .args([
                "--format=csv",
                "--data=bare",
                "--no-headings",
                "--columns=name,ofport",
                "list",
                "Interface",
            ])
            .envs(self.a.ovs_env())
            .output()
            .expect("run ovs-vsctl");
        assert!(
            out.status.success(),
            "ovs-vsctl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let by_name: BTreeMap<String, u32> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(','))
            .filter_map(|(n, p)| Some((n.to_string(), p.trim().parse().ok()?)))
            .collect();
        w.pods
            .iter()
            .map(|p| {
                let port = *by_name
                    .get(&p.host_veth)
                    .unwrap_or_else(|| panic!("no ofport for {}: {by_name:?}", p.host_veth));
                assert!(port > 2, "{}: ofport {port}", p.host_veth);
                (pod_key(p), port)
            })
            .collect()
    }

    /// Asserts that A and B hold the same flows (cookies aside).
    fn assert_parity(&self, what: &str) {
        let a = flows_without_cookie(&self.a);
        let b = flows_without_cookie(&self.b);
        if a != b {
            let only_a: Vec<&String> = a.difference(&b).collect();
            let only_b: Vec<&String> = b.difference(&a).collect();
            let mut msg = format!("{what}: switch A (our agent) and switch B (seed) differ\n");
            msg += &format!("--- only in A ({}):\n", only_a.len());
            for l in &only_a {
                msg += &format!("  {l}\n");
            }
            msg += &format!("+++ only in B ({}):\n", only_b.len());
            for l in &only_b {
                msg += &format!("  {l}\n");
            }
            panic!("{msg}");
        }
        assert!(a.len() > 40, "{what}: suspiciously few flows ({})", a.len());
    }

    /// A second converge of the same state sends nothing.
    async fn assert_second_converge_is_noop(&self, yaml: &str) {
        let r = self.converge(yaml).await;
        assert_eq!(
            r.adds + r.modifies + r.deletes,
            0,
            "second converge sent something: {r:?}"
        );
        assert_eq!(r.ports_added + r.ports_removed, 0, "{r:?}");
    }
}

/// `dump-flows --no-stats` lines without their `cookie=0x…, ` prefix (A's flows carry a
/// generation cookie; the seed's carry none once its temporary cookie=1 rules are gone).
fn flows_without_cookie(sb: &OvsSandbox) -> BTreeSet<String> {
    dump_sorted(sb, &[])
        .into_iter()
        .map(|l| match l.strip_prefix("cookie=0x") {
            Some(rest) => rest
                .split_once(", ")
                .map_or(rest.to_string(), |(_, r)| r.to_string()),
            None => l,
        })
        .collect()
}

fn flows_of_table(sb: &OvsSandbox, table: u32) -> Vec<String> {
    let prefix = format!("table={table},");
    flows_without_cookie(sb)
        .into_iter()
        .filter(|l| l.starts_with(&prefix))
        .collect()
}

fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "state text lacks {from:?}");
    text.replace(from, to)
}

/// The example state with the egress dnsName pointed at `localhost` (offline, www.example.com
/// does not resolve; localhost resolves through /etc/hosts) and an SCTP port on team-a/web.
fn example_yaml(plugin: &str) -> String {
    let y = replaced(EXAMPLE, "www.example.com", "localhost");
    let y = replaced(
        &y,
        "ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 53}]",
        "ports: [{protocol: TCP, port: 80}, {protocol: SCTP, port: 9}, {protocol: UDP, port: 53}]",
    );
    replaced(&y, "plugin: multitenant", &format!("plugin: {plugin}"))
}

fn parse_problems(yaml: &str) -> Vec<String> {
    let (_, problems) = sdn_node::cluster::state_file::parse(yaml).expect("state parses");
    problems.iter().map(|p| p.to_string()).collect()
}

// ---------------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------------

/// Multitenant, the example state: SetupOVS, policy start, AddHostSubnetRules (both variants),
/// UpdateVXLANMulticastFlows, SetUpPod, EnsureVNIDRules, UpdateLocalMulticastFlows,
/// AddServiceRules (TCP, UDP, SCTP skipped), UpdateEgressNetworkPolicyRules (one policy with a
/// CIDR, a dnsName and 0.0.0.0/0).
#[tokio::test]
async fn example_multitenant_localhost_dns() {
    assert_eq!(
        egress_dns_get_ips("localhost"),
        vec![Ipv4Addr::LOCALHOST],
        "localhost must resolve to 127.0.0.1 only"
    );
    let yaml = example_yaml("multitenant");
    let problems = parse_problems(&yaml);
    assert!(
        problems.len() == 1 && problems[0].contains("SCTP"),
        "{problems:?}"
    );
    let w = World::parse(&yaml);

    let pair = Pair::start().await;
    let report = pair.converge(&yaml).await;
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let ports = pair.ofports(&w);

    let mut seed = Seed::new(&pair.b, &w);
    seed.node_start(&w, &ports);
    pair.assert_parity("example, multitenant");
    assert!(
        flows_of_table(&pair.a, 100)
            .iter()
            .any(|l| l.contains("nw_dst=127.0.0.1 actions=output:2")),
        "the dnsName rule resolved"
    );
    pair.assert_second_converge_is_noop(&yaml).await;

    // The seed read literally (no `continue` after the SCTP error) would also have sent
    // `"" + action`; ovs-ofctl takes it as a table-0, priority-100 catch-all that bypasses the
    // pod checks. Show it on B, after the comparison, so the deviation is documented by OVS.
    let literal =
        ", priority=100, actions=load:11->NXM_NX_REG1[], load:2->NXM_NX_REG2[], goto_table:80";
    ofctl(&pair.b, &["add-flow", "br0", literal]);
    assert!(
        flows_without_cookie(&pair.b).contains(
            "priority=100 actions=load:0xb->NXM_NX_REG1[],load:0x2->NXM_NX_REG2[],goto_table:80"
        ),
        "the literal seed line is a table-0 catch-all"
    );
}

/// Egress policies, multitenant, every branch of UpdateEgressNetworkPolicyRules: no policy;
/// VNID 0 (ignored); shared NetNamespace (drop all); two policies in one namespace (first the
/// one-policy branch, then drop all); one policy with ordered rules (a non-canonical CIDR, a
/// dnsName, 0.0.0.0/32 corrected, a /32, 0.0.0.0/0); an empty policy; a dnsName without an
/// answer (DNS-failure branch: drop all).
#[tokio::test]
async fn egress_policy_branches_multitenant() {
    let yaml = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23, fixedVNID: 0}
netNamespaces:
  - {name: default, netid: 0}
  - {name: shared-1, netid: 20}
  - {name: shared-2, netid: 20}
  - {name: multi, netid: 21}
  - {name: one, netid: 22}
  - {name: dnsfail, netid: 23}
  - {name: empty, netid: 24}
  - {name: nopolicy, netid: 25}
services:
  - {namespace: one, name: svc, clusterIP: 172.30.1.1, ports: [{protocol: TCP, port: 443}, {protocol: UDP, port: 65535}]}
  - {namespace: nopolicy, name: bare, clusterIP: 172.30.1.2, ports: []}
  - {namespace: nopolicy, name: sctp-only, clusterIP: 172.30.1.3, ports: [{protocol: SCTP, port: 9}]}
  - {namespace: empty, name: twice, clusterIP: 172.30.1.4, ports: [{protocol: TCP, port: 80}, {protocol: TCP, port: 80}]}
pods:
  - {namespace: one, name: o1, containerID: 0a0000000000000000000000000000000000000000000000000000000000000a,
     hostVeth: veth-o1, internal: true, ip: 10.128.2.10, mac: "0a:58:0a:80:02:0a"}
  - {namespace: nopolicy, name: n1, containerID: 0b0000000000000000000000000000000000000000000000000000000000000b,
     hostVeth: veth-n1, internal: true, ip: 10.128.2.11, mac: "0a:58:0a:80:02:0b"}
egressNetworkPolicies:
  - namespace: default
    name: global
    egress:
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
  - namespace: shared-1
    name: p
    egress:
      - {type: Allow, to: {cidrSelector: 8.8.8.0/24}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
  - namespace: multi
    name: p1
    egress:
      - {type: Allow, to: {cidrSelector: 9.9.9.0/24}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
  - namespace: one
    name: ordered
    egress:
      - {type: Allow, to: {cidrSelector: 1.2.3.4/24}}
      - {type: Allow, to: {dnsName: localhost}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/32}}
      - {type: Allow, to: {cidrSelector: 5.6.7.8/32}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
  - namespace: multi
    name: p2
    egress:
      - {type: Allow, to: {cidrSelector: 10.10.0.0/16}}
  - namespace: dnsfail
    name: p
    egress:
      - {type: Allow, to: {dnsName: no-such-host.invalid}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
  - namespace: empty
    name: p
    egress: []
"#;
    let problems = parse_problems(yaml);
    assert!(
        problems.len() == 1 && problems[0].contains("SCTP"),
        "{problems:?}"
    );
    assert!(
        egress_dns_get_ips("no-such-host.invalid").is_empty(),
        ".invalid never resolves (RFC 6761)"
    );
    let w = World::parse(yaml);

    let pair = Pair::start().await;
    let report = pair.converge(yaml).await;
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    let joined = problems.join("\n");
    for want in [
        "global network namespace",
        "shared NetNamespace (shared-1, shared-2)",
        "multiple EgressNetworkPolicies",
    ] {
        assert!(joined.contains(want), "missing {want:?} in {joined}");
    }
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.to_string().contains("DNS resolver failed")),
        "{:?}",
        report.warnings
    );
    let ports = pair.ofports(&w);

    let mut seed = Seed::new(&pair.b, &w);
    seed.node_start(&w, &ports);
    // The branches' input errors, as the seed reports them.
    let mut errors = Vec::new();
    for vnid in [0, 20, 21, 22, 23, 24, 25] {
        let policies = w.policies_of(vnid);
        if policies.is_empty() {
            // No EgressNetworkPolicy event for this VNID: only the "no policy" branch's delete.
            assert_eq!(
                seed.update_egress_network_policy_rules(&[], vnid, &w.namespaces(vnid)),
                Ok(())
            );
            continue;
        }
        if let Err(e) =
            seed.update_egress_network_policy_rules(&policies, vnid, &w.namespaces(vnid))
        {
            errors.push(e);
        }
    }
    assert_eq!(errors.len(), 4, "{errors:?}");
    pair.assert_parity("egress policy branches");

    let t100 = flows_of_table(&pair.a, 100);
    for want in [
        "table=100, priority=1,reg0=0x14 actions=drop",
        "table=100, priority=1,reg0=0x15 actions=drop",
        "table=100, priority=1,reg0=0x17 actions=drop",
        "table=100, priority=5,ip,reg0=0x16,nw_dst=1.2.3.0/24 actions=output:2",
        "table=100, priority=4,ip,reg0=0x16,nw_dst=127.0.0.1 actions=output:2",
        "table=100, priority=3,ip,reg0=0x16 actions=drop",
    ] {
        assert!(
            t100.iter().any(|l| l == want),
            "missing {want}\n{}",
            t100.join("\n")
        );
    }
    assert!(
        !t100
            .iter()
            .any(|l| l.contains("reg0=0 ") || l.contains("reg0=0x18")),
        "{}",
        t100.join("\n")
    );
    pair.assert_second_converge_is_noop(yaml).await;
}

/// Multicast, multitenant: UpdateLocalMulticastFlows with ofports that sort differently as
/// strings (`output:10` < `output:3`), a netid shared by two multicast namespaces, a netid
/// without multicast; UpdateVXLANMulticastFlows with several remote nodes whose
/// `set_field:IP->tun_dst,output:1` strings sort differently from the addresses.
#[tokio::test]
async fn multicast_ordering_multitenant() {
    let mut yaml = String::from(
        r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
  - {host: node-c, hostIP: 172.17.0.10, subnet: 10.129.2.0/23}
  - {host: node-d, hostIP: 172.17.0.9, subnet: 10.130.0.0/23, fixedVNID: 30}
  - {host: node-e, hostIP: 10.0.0.100, subnet: 10.130.2.0/23}
  - {host: node-f, hostIP: 192.168.1.2, subnet: 10.131.1.7/23}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-m, netid: 30, multicast: true}
  - {name: team-m2, netid: 30, multicast: true}
  - {name: team-x, netid: 31}
  - {name: team-y, netid: 32, multicast: true}
  - {name: team-max, netid: 16777215, multicast: true}
services:
  - {namespace: team-x, name: x, clusterIP: 172.30.3.1, ports: [{protocol: UDP, port: 5353}]}
  - {namespace: team-max, name: max, clusterIP: 172.30.3.2, ports: [{protocol: TCP, port: 1}]}
pods:
  - {namespace: team-max, name: upper, containerID: "ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789",
     hostVeth: veth-upper, internal: true, ip: 10.128.3.254, mac: "0A:58:0A:80:03:FE"}
"#,
    );
    let pods: Vec<(&str, usize)> = vec![
        ("team-m", 10),
        ("team-m2", 1),
        ("team-x", 2),
        ("team-y", 1),
        ("default", 1),
    ];
    let mut n = 0u32;
    for (ns, count) in pods {
        for _ in 0..count {
            n += 1;
            yaml += &format!(
                "  - {{namespace: {ns}, name: p{n}, containerID: \"{cid}\", hostVeth: veth-p{n}, internal: true, ip: 10.128.2.{ip}, mac: \"0a:58:0a:80:02:{ip:02x}\"}}\n",
                cid = format!("{n:02x}").repeat(32),
                ip = 20 + n,
            );
        }
    }
    assert!(
        parse_problems(&yaml).is_empty(),
        "{:?}",
        parse_problems(&yaml)
    );
    let w = World::parse(&yaml);

    let pair = Pair::start().await;
    pair.converge(&yaml).await;
    let ports = pair.ofports(&w);
    let m_ports = w.ofports_of(&w.pods, &ports, 30);
    assert!(
        m_ports.iter().any(|p| *p < 10) && m_ports.iter().any(|p| *p >= 10),
        "need one- and two-digit ofports: {m_ports:?}"
    );

    let mut seed = Seed::new(&pair.b, &w);
    seed.node_start(&w, &ports);
    pair.assert_parity("multicast ordering");

    let t120 = flows_of_table(&pair.a, 120);
    let line = t120
        .iter()
        .find(|l| l.contains("reg0=0x1e"))
        .expect("table 120 flow of VNID 30");
    let actions = line
        .split_once("actions=")
        .map(|(_, a)| a)
        .unwrap_or_default();
    let mut sorted: Vec<&str> = actions.split(',').collect();
    sorted.sort();
    assert_eq!(
        actions.split(',').collect::<Vec<_>>(),
        sorted,
        "string order: {line}"
    );
    assert!(
        !t120.iter().any(|l| l.contains("reg0=0x1f")),
        "VNID 31 has no multicast: {t120:?}"
    );
    let t111 = flows_of_table(&pair.a, 111);
    assert_eq!(
        t111,
        vec!["table=111, priority=100 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:10.0.0.100->tun_dst,output:1,set_field:172.17.0.10->tun_dst,output:1,set_field:172.17.0.3->tun_dst,output:1,set_field:172.17.0.9->tun_dst,output:1,set_field:192.168.1.2->tun_dst,output:1,goto_table:120".to_string()]
    );
    pair.assert_second_converge_is_noop(&yaml).await;
}

const MT_S1: &str = r#"
node: node-a
plugin: multitenant
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-b, hostIP: 172.17.0.3, subnet: 10.129.0.0/23}
  - {host: node-c, hostIP: 172.17.0.4, subnet: 10.130.0.0/23, fixedVNID: 7}
  - {host: node-d, hostIP: 172.17.0.10, subnet: 10.131.0.0/23}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11, multicast: true}
  - {name: team-b, netid: 12}
  - {name: team-c, netid: 13, multicast: true}
services:
  - {namespace: default, name: dns, clusterIP: 172.30.0.2, ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}
  - {namespace: team-a, name: web, clusterIP: 172.30.0.10, ports: [{protocol: TCP, port: 80}]}
  - {namespace: team-b, name: db, clusterIP: 172.30.0.20, ports: [{protocol: TCP, port: 5432}]}
  - {namespace: team-b, name: cache, clusterIP: 172.30.0.21, ports: [{protocol: TCP, port: 6379}, {protocol: UDP, port: 6379}]}
  - {namespace: team-c, name: feed, clusterIP: 172.30.0.30, ports: [{protocol: UDP, port: 9999}]}
pods:
  - {namespace: team-a, name: a1, containerID: a100000000000000000000000000000000000000000000000000000000000001,
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, mac: "0a:58:0a:80:02:05"}
  - {namespace: team-a, name: a2, containerID: a200000000000000000000000000000000000000000000000000000000000002,
     hostVeth: veth-a2, internal: true, ip: 10.128.2.6, mac: "0a:58:0a:80:02:06", ingressBPS: 1000000}
  - {namespace: team-a, name: a3, containerID: a300000000000000000000000000000000000000000000000000000000000003,
     hostVeth: veth-a3, internal: true, ip: 10.128.2.7, mac: "0a:58:0a:80:02:07"}
  - {namespace: team-b, name: b1, containerID: b100000000000000000000000000000000000000000000000000000000000001,
     hostVeth: veth-b1, internal: true, ip: 10.128.2.8, mac: "0a:58:0a:80:02:08"}
  - {namespace: team-b, name: b2, containerID: b200000000000000000000000000000000000000000000000000000000000002,
     hostVeth: veth-b2, internal: true, ip: 10.128.2.9, mac: "0a:58:0a:80:02:09"}
  - {namespace: team-c, name: c1, containerID: c100000000000000000000000000000000000000000000000000000000000001,
     hostVeth: veth-c1, internal: true, ip: 10.128.2.10, mac: "0a:58:0a:80:02:0a"}
  - {namespace: default, name: d1, containerID: d100000000000000000000000000000000000000000000000000000000000001,
     hostVeth: veth-d1, internal: true, ip: 10.128.2.11, mac: "0a:58:0a:80:02:0b"}
egressNetworkPolicies:
  - namespace: team-a
    name: default
    egress:
      - {type: Allow, to: {cidrSelector: 1.2.3.0/24}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
  - namespace: team-b
    name: default
    egress:
      - {type: Deny, to: {cidrSelector: 10.0.0.0/8}}
"#;

/// S1 with: pods a2, b2 gone and a4, c2 new; service team-b/db deleted; host subnet node-d
/// removed; team-a's egress policy changed; team-b's netid 12 -> 14 (VNID 12 becomes unused);
/// team-c's multicast turned off.
const MT_S2: &str = r#"
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
  - {name: team-b, netid: 14}
  - {name: team-c, netid: 13}
services:
  - {namespace: default, name: dns, clusterIP: 172.30.0.2, ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}
  - {namespace: team-a, name: web, clusterIP: 172.30.0.10, ports: [{protocol: TCP, port: 80}]}
  - {namespace: team-b, name: cache, clusterIP: 172.30.0.21, ports: [{protocol: TCP, port: 6379}, {protocol: UDP, port: 6379}]}
  - {namespace: team-c, name: feed, clusterIP: 172.30.0.30, ports: [{protocol: UDP, port: 9999}]}
pods:
  - {namespace: team-a, name: a1, containerID: a100000000000000000000000000000000000000000000000000000000000001,
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, mac: "0a:58:0a:80:02:05"}
  - {namespace: team-a, name: a3, containerID: a300000000000000000000000000000000000000000000000000000000000003,
     hostVeth: veth-a3, internal: true, ip: 10.128.2.7, mac: "0a:58:0a:80:02:07"}
  - {namespace: team-b, name: b1, containerID: b100000000000000000000000000000000000000000000000000000000000001,
     hostVeth: veth-b1, internal: true, ip: 10.128.2.8, mac: "0a:58:0a:80:02:08"}
  - {namespace: team-c, name: c1, containerID: c100000000000000000000000000000000000000000000000000000000000001,
     hostVeth: veth-c1, internal: true, ip: 10.128.2.10, mac: "0a:58:0a:80:02:0a"}
  - {namespace: default, name: d1, containerID: d100000000000000000000000000000000000000000000000000000000000001,
     hostVeth: veth-d1, internal: true, ip: 10.128.2.11, mac: "0a:58:0a:80:02:0b"}
  - {namespace: team-a, name: a4, containerID: a400000000000000000000000000000000000000000000000000000000000004,
     hostVeth: veth-a4, internal: true, ip: 10.128.2.12, mac: "0a:58:0a:80:02:0c"}
  - {namespace: team-c, name: c2, containerID: c200000000000000000000000000000000000000000000000000000000000002,
     hostVeth: veth-c2, internal: true, ip: 10.128.2.13, mac: "0a:58:0a:80:02:0d"}
egressNetworkPolicies:
  - namespace: team-a
    name: default
    egress:
      - {type: Deny, to: {cidrSelector: 5.6.7.8/32}}
      - {type: Allow, to: {cidrSelector: 5.6.7.0/24}}
      - {type: Deny, to: {cidrSelector: 0.0.0.0/32}}
  - namespace: team-b
    name: default
    egress:
      - {type: Deny, to: {cidrSelector: 10.0.0.0/8}}
"#;

/// Update parity, multitenant: S1 then S2 on the same switches. B gets the seed's sequence for
/// the change: TearDownPod, DeleteServiceRules, DeleteHostSubnetRules (+ VXLAN multicast),
/// the netid change (UpdatePod, services re-added, egress moved, multicast of both VNIDs),
/// UpdateEgressNetworkPolicyRules for the changed policy, multicast off, SetUpPod, and
/// SyncVNIDRules.
#[tokio::test]
async fn update_multitenant() {
    for y in [MT_S1, MT_S2] {
        assert!(parse_problems(y).is_empty(), "{:?}", parse_problems(y));
    }
    let (w1, w2) = (World::parse(MT_S1), World::parse(MT_S2));

    let pair = Pair::start().await;
    pair.converge(MT_S1).await;
    let ports1 = pair.ofports(&w1);
    let mut seed = Seed::new(&pair.b, &w1);
    seed.node_start(&w1, &ports1);
    pair.assert_parity("multitenant S1");

    let r = pair.converge(MT_S2).await;
    assert_eq!((r.ports_added, r.ports_removed), (2, 2), "{r:?}");
    let ports2 = pair.ofports(&w2);
    for (k, p) in &ports2 {
        if let Some(old) = ports1.get(k) {
            assert_eq!(old, p, "{k} kept its port, so its ofport");
        }
    }

    // Pods deleted (podManager teardown: TearDownPod, then the VNID's local multicast).
    seed.pod_deleted(&w1, &w2, &ports1, "a2");
    seed.pod_deleted(&w1, &w2, &ports1, "b2");
    // Service deleted.
    seed.delete_service_rules(w1.service("db"));
    // HostSubnet deleted (then the VXLAN multicast rule from the remaining subnets).
    seed.delete_host_subnet_rules(w1.host_subnet("node-d"));
    seed.update_vxlan_multicast_flows(&w2.remote_ips());
    // NetNamespace team-b: netid 12 -> 14 (multitenant updatePodNetwork).
    // ASSUMPTION: the pod update path also runs EnsureVNIDRules for the new VNID, and the
    // services' re-add does too (as AddServiceRules' callers do).
    let (old, new) = (12, 14);
    for p in w2.pods.iter().filter(|p| p.namespace == "team-b") {
        seed.update_pod(&p.container_id, new);
        seed.ensure_vnid_rules(new);
    }
    for s in w2.services.iter().filter(|s| s.namespace == "team-b") {
        seed.delete_service_rules(s);
        seed.add_service_rules(s, new);
        seed.ensure_vnid_rules(new);
    }
    // UpdateEgressNetworkPolicyVNID: the namespace's policies move to the new VNID.
    seed.update_egress_network_policy_rules(&w2.policies_of(old), old, &w2.namespaces(old))
        .unwrap();
    seed.update_egress_network_policy_rules(&w2.policies_of(new), new, &w2.namespaces(new))
        .unwrap();
    seed.update_local_multicast_flows(
        old,
        w2.multicast_enabled(old),
        &w2.ofports_of(&w2.pods, &ports2, old),
    );
    seed.update_local_multicast_flows(
        new,
        w2.multicast_enabled(new),
        &w2.ofports_of(&w2.pods, &ports2, new),
    );
    // EgressNetworkPolicy team-a/default modified.
    seed.update_egress_network_policy_rules(&w2.policies_of(11), 11, &w2.namespaces(11))
        .unwrap();
    // NetNamespace team-c: multicast annotation removed.
    let c_ports: Vec<u32> = w1.ofports_of(&w1.pods, &ports1, 13);
    seed.update_local_multicast_flows(13, w2.multicast_enabled(13), &c_ports);
    // Pods added.
    seed.pod_added(&w2, &ports2, "a4");
    seed.pod_added(&w2, &ports2, "c2");
    // ASSUMPTION: our agent removes an unused VNID's table-80 rule at once; the seed does so in
    // SyncVNIDRules (run on deletions and hourly). Compare after it has run.
    seed.sync_vnid_rules();
    pair.assert_parity("multitenant S1 -> S2");

    let t80 = flows_of_table(&pair.a, 80);
    assert!(
        t80.iter().any(|l| l.contains("reg0=0xe,reg1=0xe")),
        "{t80:?}"
    );
    assert!(!t80.iter().any(|l| l.contains("reg1=0xc")), "{t80:?}");
    pair.assert_second_converge_is_noop(MT_S2).await;
}

/// The S2 of the subnet-mode update: the example (subnet mode) with pod a2 gone and a3 new,
/// service team-a/web deleted, host subnet node-b removed, team-b's netid changed (no effect
/// in subnet mode) and the egress policy changed (ignored in subnet mode: VNID 0).
const SUBNET_S2: &str = r#"
node: node-a
plugin: subnet
clusterNetwork: 10.128.0.0/14
serviceNetwork: 172.30.0.0/16
hostSubnets:
  - {host: node-a, hostIP: 172.17.0.2, subnet: 10.128.2.0/23}
  - {host: node-c, hostIP: 172.17.0.4, subnet: 10.130.0.0/23, fixedVNID: 7}
netNamespaces:
  - {name: default, netid: 0}
  - {name: team-a, netid: 11, multicast: true}
  - {name: team-b, netid: 13}
services:
  - {namespace: default, name: dns, clusterIP: 172.30.0.2,
     ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}
pods:
  - {namespace: team-a, name: a1, containerID: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef,
     hostVeth: veth-a1, internal: true, ip: 10.128.2.5, mac: "0a:58:0a:80:02:05", ingressBPS: 0, egressBPS: 0}
  - {namespace: team-b, name: b1, containerID: 2123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef,
     hostVeth: veth-b1, internal: true, ip: 10.128.2.7, mac: "0a:58:0a:80:02:07"}
  - {namespace: team-a, name: a3, containerID: 3123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef,
     hostVeth: veth-a3, internal: true, ip: 10.128.2.8, mac: "0a:58:0a:80:02:08"}
egressNetworkPolicies:
  - namespace: team-a
    name: default
    egress:
      - {type: Deny, to: {cidrSelector: 0.0.0.0/0}}
"#;

/// Subnet mode: the example state (VNID 0 everywhere, the subnet plugin's single table-80
/// rule, no multicast: table 111 keeps SetupOVS's flow, egress policies ignored), then an
/// update: TearDownPod, DeleteServiceRules, DeleteHostSubnetRules, SetUpPod.
#[tokio::test]
async fn example_subnet_then_update() {
    let s1 = example_yaml("subnet");
    let problems = parse_problems(&s1);
    assert!(
        problems.len() == 1 && problems[0].contains("SCTP"),
        "{problems:?}"
    );
    assert!(
        parse_problems(SUBNET_S2).is_empty(),
        "{:?}",
        parse_problems(SUBNET_S2)
    );
    let (w1, w2) = (World::parse(&s1), World::parse(SUBNET_S2));

    let pair = Pair::start().await;
    let r = pair.converge(&s1).await;
    assert!(
        r.problems
            .iter()
            .any(|p| p.to_string().contains("global network namespace")),
        "{:?}",
        r.problems
    );
    let ports1 = pair.ofports(&w1);
    let mut seed = Seed::new(&pair.b, &w1);
    seed.node_start(&w1, &ports1);
    pair.assert_parity("example, subnet");
    assert_eq!(
        flows_of_table(&pair.a, 111),
        vec!["table=111, priority=100 actions=goto_table:120".to_string()]
    );
    assert_eq!(
        flows_of_table(&pair.a, 253),
        vec!["table=253, actions=note:00.03.00.00.00.00".to_string()]
    );

    pair.converge(SUBNET_S2).await;
    let ports2 = pair.ofports(&w2);
    seed.pod_deleted(&w1, &w2, &ports1, "a2");
    seed.delete_service_rules(w1.service("web"));
    seed.delete_host_subnet_rules(w1.host_subnet("node-b"));
    // team-b's netid change: the subnet plugin does not act on NetNamespaces (VNID stays 0).
    // The changed policy: VNID 0, the "global namespace" branch (nothing sent).
    assert!(seed
        .update_egress_network_policy_rules(&w2.policies_of(0), 0, &w2.namespaces(0))
        .is_err());
    seed.pod_added(&w2, &ports2, "a3");
    pair.assert_parity("subnet S1 -> S2");
    pair.assert_second_converge_is_noop(SUBNET_S2).await;
}
