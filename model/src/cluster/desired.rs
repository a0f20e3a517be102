//! From cluster state to desired flows: which seed operation applies to which object.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{netpol, ClusterState, NetNamespace, PodKey, Problem};
use crate::domain::{OfPort, Plugin, Vnid};
use crate::pipeline::egress::{self, DnsAnswers};
use crate::pipeline::pod::PodPort;
use crate::pipeline::subnet::RemoteSubnet;
use crate::pipeline::{base, multicast, policy, pod, service, subnet, Flow, NodeConfig};
use crate::store::{DesiredState, Owner};

/// The desired flows of `state`, given the ofports of the local pods that have one (a pod
/// without an ofport has no flows) and the DNS answers for egress policies.
pub fn desired_state(
    state: &ClusterState,
    ofports: &HashMap<PodKey, OfPort>,
    dns: &DnsAnswers,
) -> (DesiredState, Vec<Problem>) {
    let (d, problems, _) = desired_state_with_warnings(state, ofports, dns);
    (d, problems)
}

/// [`desired_state`], plus the operational warnings (DNS failures that made a VNID drop all
/// egress traffic, corrected selectors). Built owner by owner from the same functions as
/// [`owner_flows`], so the two cannot drift.
pub fn desired_state_with_warnings(
    state: &ClusterState,
    ofports: &HashMap<PodKey, OfPort>,
    dns: &DnsAnswers,
) -> (DesiredState, Vec<Problem>, Vec<Problem>) {
    let mut d = DesiredState::default();
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let Some(cfg) = node_config(state) else {
        problems.push(no_local_subnet(state));
        return (d, problems, warnings);
    };
    let facts = VnidFacts::gather(state, ofports, None);
    let mut owners = vec![Owner::Base, Owner::Version, Owner::PolicyPlugin];
    owners.extend(state.host_subnets.iter().filter(|h| h.host != state.node).map(|h| Owner::HostSubnet { host: h.host.clone() }));
    owners.push(Owner::MulticastVxlan);
    owners.extend(
        state
            .pods
            .iter()
            .filter(|p| ofports.contains_key(&p.key()) && facts.vnid_of(&p.namespace).is_some())
            .map(|p| Owner::Pod { namespace: p.namespace.clone(), name: p.name.clone() }),
    );
    owners.extend(
        state
            .services
            .iter()
            .filter(|s| facts.vnid_of(&s.namespace).is_some())
            .map(|s| Owner::Service { namespace: s.namespace.clone(), name: s.name.clone() }),
    );
    if state.plugin == Plugin::Multitenant {
        owners.extend(facts.in_use.iter().map(|v| Owner::VnidRule { vnid: *v }));
    }
    if state.plugin.uses_netids() {
        owners.extend(facts.namespaces.keys().map(|v| Owner::Multicast { vnid: *v }));
    }
    owners.extend(netpol_namespaces(state).into_iter().map(|namespace| Owner::NetworkPolicy { namespace }));
    owners.extend(facts.policies.keys().map(|v| Owner::EgressPolicy { vnid: *v }));
    for owner in owners {
        let out = flows_of_owner(state, &cfg, ofports, dns, &facts, &owner);
        problems.extend(out.problems);
        warnings.extend(out.warnings);
        put(&mut d, &mut problems, owner, out.flows, out.object);
    }
    (d, problems, warnings)
}

/// The flows [`desired_state_with_warnings`] gives `owner` (none if it has none), with the
/// problems and warnings found computing them: (flows, problems, warnings). A conflict with
/// another owner's flows is found only when the flows are set into a [`DesiredState`].
pub fn owner_flows(
    state: &ClusterState,
    ofports: &HashMap<PodKey, OfPort>,
    dns: &DnsAnswers,
    owner: &Owner,
) -> (Vec<Flow>, Vec<Problem>, Vec<Problem>) {
    let Some(cfg) = node_config(state) else {
        return (vec![], vec![no_local_subnet(state)], vec![]);
    };
    let only = match owner {
        Owner::VnidRule { vnid } | Owner::Multicast { vnid } | Owner::EgressPolicy { vnid } => Some(*vnid),
        _ => None,
    };
    let facts = match only {
        Some(v) => VnidFacts::gather(state, ofports, Some(v)),
        None => VnidFacts::lookup_only(state),
    };
    let out = flows_of_owner(state, &cfg, ofports, dns, &facts, owner);
    (out.flows, out.problems, out.warnings)
}

fn no_local_subnet(state: &ClusterState) -> Problem {
    // ClusterState::validate guarantees a local subnet; without one there is no pipeline.
    Problem::new(format!("node {}", state.node), "hostSubnets", "no HostSubnet for this node")
}

fn node_config(state: &ClusterState) -> Option<NodeConfig> {
    state.local_subnet()?;
    Some(NodeConfig { plugin: state.plugin, ipv4: state.node_ipv4(), ipv6: state.node_ipv6() })
}

/// What the per-VNID owners depend on, gathered in one pass over the state: for every VNID (the
/// full computation) or for one (a single owner).
struct VnidFacts<'a> {
    plugin: Plugin,
    /// Namespace name to VNID (the first NetNamespace of a name, as `vnid_of`).
    vnids: HashMap<&'a str, Vnid>,
    /// VNIDs a local pod (with an ofport) or a service uses.
    in_use: BTreeSet<Vnid>,
    /// Local pods' ofports by VNID, in pod order.
    ports: BTreeMap<Vnid, Vec<OfPort>>,
    /// Egress policies by VNID, in policy order.
    policies: BTreeMap<Vnid, Vec<egress::Policy>>,
    /// NetNamespaces by VNID, in namespace order.
    namespaces: BTreeMap<Vnid, Vec<&'a NetNamespace>>,
}

impl<'a> VnidFacts<'a> {
    fn lookup_only(state: &'a ClusterState) -> VnidFacts<'a> {
        let mut vnids = HashMap::with_capacity(state.net_namespaces.len());
        if state.plugin.uses_netids() {
            for n in &state.net_namespaces {
                vnids.entry(n.name.as_str()).or_insert(n.vnid);
            }
        }
        VnidFacts {
            plugin: state.plugin,
            vnids,
            in_use: BTreeSet::new(),
            ports: BTreeMap::new(),
            policies: BTreeMap::new(),
            namespaces: BTreeMap::new(),
        }
    }

    fn gather(state: &'a ClusterState, ofports: &HashMap<PodKey, OfPort>, only: Option<Vnid>) -> VnidFacts<'a> {
        let mut f = VnidFacts::lookup_only(state);
        let wanted = |v: Vnid| only.is_none_or(|o| o == v);
        for p in &state.pods {
            let (Some(&ofport), Some(vnid)) = (ofports.get(&p.key()), f.vnid_of(&p.namespace)) else { continue };
            if wanted(vnid) {
                f.in_use.insert(vnid);
                f.ports.entry(vnid).or_default().push(ofport);
            }
        }
        for s in &state.services {
            if let Some(vnid) = f.vnid_of(&s.namespace).filter(|v| wanted(*v)) {
                f.in_use.insert(vnid);
            }
        }
        for p in &state.egress_policies {
            if let Some(vnid) = f.vnid_of(&p.namespace).filter(|v| wanted(*v)) {
                f.policies.entry(vnid).or_default().push(p.clone());
            }
        }
        for n in state.net_namespaces.iter().filter(|n| wanted(n.vnid)) {
            f.namespaces.entry(n.vnid).or_default().push(n);
        }
        f
    }

    /// As [`ClusterState::vnid_of`].
    fn vnid_of(&self, namespace: &str) -> Option<Vnid> {
        if self.plugin.uses_netids() {
            self.vnids.get(namespace).copied()
        } else {
            Some(Vnid::GLOBAL)
        }
    }
}

/// One owner's flows, the problems and warnings found computing them, and the object a
/// conflict is reported on.
struct OwnerOut {
    flows: Vec<Flow>,
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
    object: String,
}

/// The one definition of every owner's flows.
fn flows_of_owner(
    state: &ClusterState,
    cfg: &NodeConfig,
    ofports: &HashMap<PodKey, OfPort>,
    dns: &DnsAnswers,
    facts: &VnidFacts<'_>,
    owner: &Owner,
) -> OwnerOut {
    let simple = |flows: Vec<Flow>, object: String| OwnerOut { flows, problems: vec![], warnings: vec![], object };
    let multitenant = state.plugin == Plugin::Multitenant;
    let netids = state.plugin.uses_netids();
    match owner {
        Owner::Base => simple(base::flows(cfg), "node".into()),
        Owner::Version => simple(vec![base::version_flow(state.plugin)], "node".into()),
        Owner::PolicyPlugin => simple(policy::plugin_flows(cfg), "node".into()),
        Owner::HostSubnet { host } => {
            let flows = match state.host_subnets.iter().find(|h| &h.host == host && h.host != state.node) {
                Some(h) => subnet::flows(&RemoteSubnet { host_ip: h.host_ip, subnet: h.subnet, subnet6: h.subnet6, fixed_vnid: h.fixed_vnid }),
                None => vec![],
            };
            simple(flows, format!("hostsubnet {host}"))
        }
        Owner::MulticastVxlan => {
            let remote_ips: Vec<_> = match state.plugin {
                Plugin::Multitenant | Plugin::NetworkPolicy => {
                    state.host_subnets.iter().filter(|h| h.host != state.node).map(|h| h.host_ip).collect()
                }
                // Multicast is a multitenant feature; subnet mode keeps SetupOVS's plain table 111.
                Plugin::Subnet => vec![],
            };
            simple(vec![multicast::vxlan_flow(&remote_ips)], "node".into())
        }
        Owner::Pod { namespace, name } => {
            let flows = state
                .pods
                .iter()
                .find(|p| &p.namespace == namespace && &p.name == name)
                .map(|p| pod_flows(state.plugin, facts.vnid_of(&p.namespace), ofports, p))
                .unwrap_or_default();
            simple(flows, format!("pod {namespace}/{name}"))
        }
        Owner::Service { namespace, name } => {
            let flows = match (state.services.iter().find(|s| &s.namespace == namespace && &s.name == name), facts.vnid_of(namespace)) {
                // networkpolicy: table 60 sends every service's traffic to tun0 (base flows).
                _ if state.plugin == Plugin::NetworkPolicy => vec![],
                (Some(s), Some(vnid)) => {
                    let mut flows = s.cluster_ip.map(|ip| service::flows(ip, &s.ports, vnid)).unwrap_or_default();
                    flows.extend(s.cluster_ip6.map(|ip6| service::ipv6_flows(ip6, &s.ports, vnid)).into_iter().flatten());
                    flows
                }
                _ => vec![],
            };
            simple(flows, format!("service {namespace}/{name}"))
        }
        // EnsureVNIDRules for every VNID a local pod or a service uses; none for the others
        // (FindUnusedVNIDs/SyncVNIDRules, computed from the model).
        Owner::VnidRule { vnid } => {
            // EnsureVNIDRules returns early for VNID 0: the global VNID's traffic is accepted by
            // the policy plugin's own table-80 flows, never by a per-VNID rule.
            let flows = if multitenant && *vnid != Vnid::GLOBAL && facts.in_use.contains(vnid) { vec![policy::vnid_flow(*vnid)] } else { vec![] };
            simple(flows, format!("vnid {vnid}"))
        }
        Owner::Multicast { vnid } => {
            let flows = match facts.namespaces.get(vnid).filter(|_| netids) {
                Some(namespaces) => {
                    let enabled = namespaces.iter().any(|n| n.multicast);
                    let ports = facts.ports.get(vnid).map(Vec::as_slice).unwrap_or(&[]);
                    multicast::local_flows(*vnid, enabled, ports)
                }
                None => vec![],
            };
            simple(flows, format!("multicast {vnid}"))
        }
        Owner::EgressPolicy { vnid } => {
            let Some(policies) = facts.policies.get(vnid) else {
                return simple(vec![], format!("egress {vnid}"));
            };
            let namespaces: Vec<String> = match state.plugin {
                Plugin::Multitenant | Plugin::NetworkPolicy => {
                    facts.namespaces.get(vnid).map(|ns| ns.iter().map(|n| n.name.clone()).collect()).unwrap_or_default()
                }
                Plugin::Subnet => policies.iter().map(|p| p.namespace.clone()).collect::<BTreeSet<_>>().into_iter().collect(),
            };
            // A node's policies govern each family it has (IPv6 fail closed: egress.rs).
            let families = egress::Families { ipv4: state.node_ipv4().is_some(), ipv6: state.node_ipv6().is_some() };
            let out = egress::flows_for(*vnid, policies, &namespaces, dns, families);
            let object =
                policies.iter().map(|p| format!("egressnetworkpolicy {}/{}", p.namespace, p.name)).collect::<Vec<_>>().join(", ");
            let warnings = out.warnings.iter().chain(&out.dns_error).map(|w| Problem::new(object.clone(), "", w.clone())).collect();
            let problems = out.error.map(|e| Problem::new(object.clone(), "", e)).into_iter().collect();
            OwnerOut { flows: out.flows, problems, warnings, object }
        }
        // Made of other owners' flows (the store merges them), never computed on its own.
        Owner::Shared => simple(vec![], "shared clause flows".into()),
        Owner::NetworkPolicy { namespace } => {
            let object = format!("networkpolicies of namespace {namespace}");
            let Some((ns, warnings)) = netpol_isolation(state, namespace) else {
                return simple(vec![], object);
            };
            let (flows, errors) = crate::pipeline::netpol::namespace_flows(&ns);
            let problems = errors.into_iter().map(|e| Problem::new(object.clone(), "", e)).collect();
            OwnerOut { flows, problems, warnings, object }
        }
    }
}

/// The namespaces with a NetworkPolicy owner (networkpolicy plugin): those with policies.
pub fn netpol_namespaces(state: &ClusterState) -> BTreeSet<String> {
    if state.plugin != Plugin::NetworkPolicy {
        return BTreeSet::new();
    }
    state.network_policies.iter().map(|p| p.namespace.clone()).collect()
}

/// What the policies of `namespace` make of its pods, with the warnings (`None`: the plugin
/// enforces no NetworkPolicy): the input of the namespace owner's flows, and of what those
/// flows count ([`crate::pipeline::netpol::counted::counting`]).
pub fn netpol_isolation(state: &ClusterState, namespace: &str) -> Option<(crate::pipeline::netpol::NamespacePolicy, Vec<Problem>)> {
    if state.plugin != Plugin::NetworkPolicy {
        return None;
    }
    let view = netpol::View::new(state);
    Some(netpol::isolation(state, &view, namespace))
}

/// [`netpol_isolation`] of every namespace with policies (one view of the cluster for all).
pub fn netpol_isolations(state: &ClusterState) -> Vec<crate::pipeline::netpol::NamespacePolicy> {
    let namespaces = netpol_namespaces(state);
    if namespaces.is_empty() {
        return vec![];
    }
    let view = netpol::View::new(state);
    namespaces.iter().map(|ns| netpol::isolation(state, &view, ns).0).collect()
}

/// The NetworkPolicy owners a local pod's arrival, departure or relabelling in `namespace`
/// changes (networkpolicy plugin): its namespace's, and those whose policies select pods there.
pub fn netpol_owners_for_pods_of(state: &ClusterState, namespace: &str) -> Vec<Owner> {
    if state.plugin != Plugin::NetworkPolicy {
        return vec![];
    }
    netpol::namespaces_watching_pods_of(state, namespace).into_iter().map(|namespace| Owner::NetworkPolicy { namespace }).collect()
}

/// A local pod's flows; in networkpolicy mode also its table-25 flow (its Service connections
/// coming back from the node, see [`crate::pipeline::via_host`]).
fn pod_flows(plugin: Plugin, vnid: Option<Vnid>, ofports: &HashMap<PodKey, OfPort>, pod: &super::Pod) -> Vec<Flow> {
    match (ofports.get(&pod.key()), vnid) {
        (Some(&ofport), Some(vnid)) => {
            let mut flows = pod::flows(&PodPort { ofport, ip: pod.ip, ip6: pod.ip6, mac: pod.mac, container_id: pod.container_id.clone(), vnid });
            if plugin == Plugin::NetworkPolicy {
                flows.extend(pod.ip.map(|ip| crate::pipeline::via_host::pod_flow(ip, vnid)));
                flows.extend(pod.ip6.map(|ip6| crate::pipeline::via_host::pod_flow6(ip6, vnid)));
            }
            flows
        }
        _ => vec![],
    }
}

/// The flows of one local pod (none if it has no ofport or its namespace is unknown).
pub fn pod_owner_flows(state: &ClusterState, ofports: &HashMap<PodKey, OfPort>, pod: &super::Pod) -> (Owner, Vec<Flow>) {
    let owner = Owner::Pod { namespace: pod.namespace.clone(), name: pod.name.clone() };
    (owner, pod_flows(state.plugin, state.vnid_of(&pod.namespace), ofports, pod))
}

/// The per-VNID owners a local pod's arrival or departure changes (multitenant only): the
/// table-80 rule (present while a local pod or a service uses the VNID) and the multicast
/// flows (which list the VNID's local ports). Computed by [`owner_flows`].
pub fn vnid_owner_flows(state: &ClusterState, ofports: &HashMap<PodKey, OfPort>, vnid: Vnid) -> Vec<(Owner, Vec<Flow>)> {
    let owners = match state.plugin {
        Plugin::Subnet => return vec![],
        Plugin::Multitenant => vec![Owner::VnidRule { vnid }, Owner::Multicast { vnid }],
        // networkpolicy: also the NetworkPolicy owners that see pods of the VNID's namespaces.
        Plugin::NetworkPolicy => {
            let mut o: BTreeSet<Owner> = BTreeSet::new();
            for n in state.net_namespaces.iter().filter(|n| n.vnid == vnid) {
                o.extend(netpol_owners_for_pods_of(state, &n.name));
            }
            std::iter::once(Owner::Multicast { vnid }).chain(o).collect()
        }
    };
    let dns = DnsAnswers::new();
    owners
        .into_iter()
        .map(|o| {
            let flows = owner_flows(state, ofports, &dns, &o).0;
            (o, flows)
        })
        .collect()
}

/// Sets an owner's flows; a conflict with another owner becomes a problem of `object`.
fn put(d: &mut DesiredState, problems: &mut Vec<Problem>, owner: Owner, flows: Vec<Flow>, object: String) {
    if let Err(c) = d.set(owner, flows) {
        problems.push(Problem::new(object, "", c.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::state_file::parse;

    const EXAMPLE: &str = include_str!("../../../deploy/examples/cluster.yaml");

    #[test]
    fn example_state() {
        let (state, problems) = parse(EXAMPLE).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let mut ofports = HashMap::new();
        for (i, p) in state.pods.iter().enumerate() {
            ofports.insert(p.key(), OfPort(3 + i as u32));
        }
        let mut dns = DnsAnswers::new();
        dns.insert("www.example.com".into(), Ok(vec!["93.184.216.34".parse().unwrap()]));
        let (d, problems) = desired_state(&state, &ofports, &dns);
        assert!(problems.is_empty(), "{problems:?}");
        let text: Vec<String> = d.iter().map(|(_, f)| f.to_string()).collect();
        let has = |s: &str| assert!(text.iter().any(|t| t == s), "missing {s}\n{}", text.join("\n"));
        has("table=80, priority=100,reg0=0xb,reg1=0xb actions=output:NXM_NX_REG2[]");
        has("table=110, reg0=0xb actions=goto_table:111");
        has("table=111, priority=100 actions=move:NXM_NX_REG0[]->NXM_NX_TUN_ID[0..31],set_field:172.17.0.3->tun_dst,output:1,set_field:172.17.0.4->tun_dst,output:1,goto_table:120");
        has("table=100, priority=2,ip,reg0=0xb,nw_dst=93.184.216.34 actions=output:2");
        has("table=253, actions=note:01.03.00.00.00.00");
    }

    #[test]
    fn incremental_pod_owners_agree_with_the_full_computation() {
        let (state, _) = parse(EXAMPLE).unwrap();
        let mut ofports = HashMap::new();
        for (i, p) in state.pods.iter().enumerate() {
            ofports.insert(p.key(), OfPort(3 + i as u32));
        }
        let (d, _) = desired_state(&state, &ofports, &DnsAnswers::new());
        for p in &state.pods {
            let (owner, flows) = pod_owner_flows(&state, &ofports, p);
            let want: Vec<String> = d.flows_of(&owner).iter().map(|c| c.to_string()).collect();
            assert_eq!(flows.iter().map(|f| f.to_string()).collect::<Vec<_>>(), want);
            for (o, f) in vnid_owner_flows(&state, &ofports, state.vnid_of(&p.namespace).unwrap()) {
                let want: Vec<String> = d.flows_of(&o).iter().map(|c| c.to_string()).collect();
                assert_eq!(f.iter().map(|f| f.to_string()).collect::<Vec<_>>(), want, "{o}");
            }
        }
    }

    #[test]
    fn unused_vnids_have_no_rule() {
        let (mut state, _) = parse(EXAMPLE).unwrap();
        state.services.clear();
        state.pods.clear();
        let (d, _) = desired_state(&state, &HashMap::new(), &DnsAnswers::new());
        assert!(d.owners().all(|o| !matches!(o, Owner::VnidRule { .. })));
    }

    /// Regression (issue 11): openshift-sdn's EnsureVNIDRules returns early for VNID 0; we
    /// installed `table=80, priority=100, reg0=0, reg1=0` on every multitenant node.
    #[test]
    fn the_global_vnid_has_no_vnid_rule() {
        let (mut state, _) = parse(EXAMPLE).unwrap();
        let mut pod = state.pods[0].clone();
        pod.namespace = "default".into();
        pod.name = "in-default".into();
        pod.ip = Some("10.128.3.250".parse().unwrap());
        pod.host_veth = "veth-default".into();
        state.pods.push(pod);
        let ofports: HashMap<_, _> = state.pods.iter().enumerate().map(|(i, p)| (p.key(), OfPort(3 + i as u32))).collect();
        let (d, _) = desired_state(&state, &ofports, &DnsAnswers::new());
        assert!(state.net_namespaces.iter().any(|n| n.name == "default" && n.vnid == Vnid::GLOBAL));
        assert!(d.flows_of(&Owner::VnidRule { vnid: Vnid::GLOBAL }).is_empty());
        assert!(d.iter().all(|(_, f)| !f.to_string().contains("reg0=0,reg1=0")), "no VNID-0 rule");
        assert!(!d.flows_of(&Owner::VnidRule { vnid: Vnid::new(11).unwrap() }).is_empty(), "other VNIDs keep theirs");
    }

    /// Every owner the state could give flows to (those it gives none included).
    fn candidate_owners(state: &ClusterState, d: &DesiredState) -> BTreeSet<Owner> {
        let mut owners: BTreeSet<Owner> = d.owners().cloned().collect();
        owners.extend([Owner::Base, Owner::Version, Owner::PolicyPlugin, Owner::MulticastVxlan]);
        owners.extend(state.host_subnets.iter().map(|h| Owner::HostSubnet { host: h.host.clone() }));
        owners.extend(state.services.iter().map(|s| Owner::Service { namespace: s.namespace.clone(), name: s.name.clone() }));
        owners.extend(state.pods.iter().map(|p| Owner::Pod { namespace: p.namespace.clone(), name: p.name.clone() }));
        for n in &state.net_namespaces {
            owners.extend([Owner::VnidRule { vnid: n.vnid }, Owner::Multicast { vnid: n.vnid }, Owner::EgressPolicy { vnid: n.vnid }]);
        }
        owners.extend([Owner::VnidRule { vnid: Vnid::GLOBAL }, Owner::EgressPolicy { vnid: Vnid::GLOBAL }]);
        owners.extend(state.net_namespaces.iter().map(|n| Owner::NetworkPolicy { namespace: n.name.clone() }));
        owners
    }

    #[test]
    fn networkpolicy_example() {
        let (state, problems) = parse(include_str!("../../../deploy/examples/networkpolicy.yaml")).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let (d, problems, warnings) = desired_state_with_warnings(&state, &example_ofports(&state), &DnsAnswers::new());
        assert!(problems.is_empty() && warnings.is_empty(), "{problems:?} {warnings:?}");
        let text: Vec<String> = d.iter().map(|(_, f)| f.to_string()).collect();
        let has = |s: &str| assert!(text.iter().any(|t| t == s), "missing {s}\n{}", text.join("\n"));
        has("table=253, actions=note:02.03.00.00.00.00");
        has("table=21, priority=200,ip,nw_dst=10.128.0.0/14 actions=ct(commit,table=30,zone=64000)");
        has("table=21, priority=200,ip,nw_dst=172.30.0.0/16 actions=ct(commit,table=30,zone=64000)");
        // db's Service connections coming back from the node get its VNID (11: team-a).
        has("table=25, priority=100,ip,nw_src=10.128.2.5 actions=load:0xb->NXM_NX_REG0[],ct(commit,table=30,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[0]))");
        has("table=60, priority=200 actions=output:2");
        // db: the named port sql (5432) from web pods (local and remote), 5000-5500 from api.
        has("table=80, priority=150,tcp,nw_src=10.128.2.6,nw_dst=10.128.2.5,tp_dst=5432 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        has("table=80, priority=150,tcp,nw_src=10.129.0.8,nw_dst=10.128.2.5,tp_dst=5432 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        // 5000-5500 from api (two pods, eleven port prefixes): a conjunction of three clauses
        // (sources; the pod; the ports and the later-fragment twin), 2 + 1 + 12 + 1 flows.
        let id = crate::pipeline::netpol::conj_id(Vnid::new(11).unwrap(), "team-a", "db-from-web", 1, &[crate::pipeline::netpol::Dst::Ports { proto: crate::pipeline::netpol::L4::Tcp, start: 5000, end: 5500 }]);
        has(&format!("table=80, priority=150,ip,nw_src=10.129.0.9 actions=conjunction({id},1/3)"));
        has(&format!("table=80, priority=150,ip,nw_dst=10.128.2.5 actions=conjunction({id},2/3)"));
        has(&format!("table=80, priority=150,tcp,reg1=0xb,tp_dst=0x1388/0xfff8 actions=conjunction({id},3/3)"));
        has(&format!("table=80, priority=150,ct_state=-inv+trk,tcp,reg1=0xb,nw_frag=later actions=conjunction({id},3/3)"));
        has(&format!("table=80, priority=150,conj_id={id},ip,reg1=0xb actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]"));
        // db: SCTP, the named port repl (7000) and 9000-9003 from db pods, every port from team-b.
        has("table=80, priority=150,sctp,nw_src=10.128.2.5,nw_dst=10.128.2.5,tp_dst=7000 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        has("table=80, priority=150,sctp,nw_src=10.128.2.5,nw_dst=10.128.2.5,tp_dst=0x2328/0xfffc actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        has("table=80, priority=150,sctp,reg0=0xc,nw_dst=10.128.2.5 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        // Later IP fragments (no ports) of datagrams from a source a port-restricted rule admits.
        has("table=80, priority=150,ct_state=-inv+trk,sctp,nw_src=10.128.2.5,nw_dst=10.128.2.5,nw_frag=later actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        has("table=80, priority=150,ct_state=-inv+trk,tcp,nw_src=10.128.2.6,nw_dst=10.128.2.5,nw_frag=later actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        has("table=80, priority=100,ip,nw_dst=10.128.2.5 actions=drop");
        // web: every namespace by VNID, and the block without its except.
        has("table=80, priority=150,ip,reg0=0xc,nw_dst=10.128.2.6 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        has("table=80, priority=150,ip,nw_src=10.129.1.0/24,nw_dst=10.128.2.6 actions=ct(commit,zone=64000,exec(load:0x1->NXM_NX_CT_MARK[1])),output:NXM_NX_REG2[]");
        assert!(!text.iter().any(|t| t.starts_with("table=80") && t.contains("nw_dst=10.128.2.7")), "team-b's pod is selected by no policy");
        assert!(!text.iter().any(|t| t.starts_with("table=80, priority=100,reg0") || (t.contains("reg1=0xb") && !t.contains("conj"))), "no per-VNID rule");
    }

    /// The counters' attribution, from `netpol_isolations`, names exactly the desired
    /// state's NetworkPolicy flows of tables 80 and 27 that act (all but clause flows), each
    /// in its own owner; db-from-web's rule 1 (a conjunction) and the drops among them.
    #[test]
    fn counting_covers_the_desired_policy_flows() {
        use crate::pipeline::netpol::counted::{counting, Counted};
        use crate::pipeline::netpol::Side;
        let (state, _) = parse(include_str!("../../../deploy/examples/networkpolicy.yaml")).unwrap();
        let (d, _, _) = desired_state_with_warnings(&state, &example_ofports(&state), &DnsAnswers::new());
        let all = netpol_isolations(&state);
        assert_eq!(all.iter().map(|n| n.namespace.as_str()).collect::<Vec<_>>(), ["team-a", "team-b"]);
        let mut seen = BTreeSet::new();
        for ns in &all {
            let c = counting(ns);
            let owner = Owner::NetworkPolicy { namespace: ns.namespace.clone() };
            for f in d.flows_of(&owner) {
                let text = f.to_string();
                let acting = [80, 27].contains(&f.key.table) && !text.contains("actions=conjunction(");
                assert_eq!(c.get(&f.key).is_some(), acting, "{text}");
                if let Some(x) = c.get(&f.key) {
                    seen.insert(x.clone());
                }
            }
            assert!(c.iter().all(|(k, _)| d.owner_of(k) == Some(&owner)), "every counting flow is the owner's");
        }
        for want in [
            Counted::Allowed { side: Side::Ingress, policy: "db-from-web".into(), rule: 1 },
            Counted::Allowed { side: Side::Ingress, policy: "web-from-anywhere-but".into(), rule: 0 },
            Counted::Allowed { side: Side::Egress, policy: "api-egress".into(), rule: 1 },
            Counted::Dropped { side: Side::Ingress, pod: "10.128.2.5".parse().unwrap() },
            Counted::Dropped { side: Side::Egress, pod: "10.128.2.7".parse().unwrap() },
        ] {
            assert!(seen.contains(&want), "{want:?} in {seen:#?}");
        }
    }

    /// `owner_flows` gives every owner exactly what the full computation gives it.
    fn assert_incremental_is_full(state: &ClusterState, ofports: &HashMap<PodKey, OfPort>, dns: &DnsAnswers) {
        let (d, problems, warnings) = desired_state_with_warnings(state, ofports, dns);
        let (mut all_problems, mut all_warnings) = (Vec::new(), Vec::new());
        for owner in candidate_owners(state, &d) {
            let (flows, p, w) = owner_flows(state, ofports, dns, &owner);
            let got: Vec<String> = flows.iter().map(|f| crate::store::Compiled::compile(f).to_string()).collect();
            let want: Vec<String> = d.flows_of(&owner).iter().map(|c| c.to_string()).collect();
            assert_eq!(got, want, "{owner}");
            all_problems.extend(p);
            all_warnings.extend(w);
        }
        for p in &all_problems {
            assert!(problems.contains(p), "{p}");
        }
        for w in &all_warnings {
            assert!(warnings.contains(w), "{w}");
        }
    }

    fn example_ofports(state: &ClusterState) -> HashMap<PodKey, OfPort> {
        state.pods.iter().enumerate().map(|(i, p)| (p.key(), OfPort(3 + i as u32))).collect()
    }

    #[test]
    fn owner_flows_agree_with_the_full_computation_on_the_examples() {
        let mut dns = DnsAnswers::new();
        dns.insert("www.example.com".into(), Ok(vec!["93.184.216.34".parse().unwrap()]));
        for text in [EXAMPLE, include_str!("../../../deploy/examples/subnet.yaml"), include_str!("../../../deploy/examples/networkpolicy.yaml")] {
            let (state, _) = parse(text).unwrap();
            let ofports = example_ofports(&state);
            assert_incremental_is_full(&state, &ofports, &dns);
            assert_incremental_is_full(&state, &HashMap::new(), &DnsAnswers::new());
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Random Service and HostSubnet changes: still incremental == full, owner by owner.
        #[test]
        fn owner_flows_agree_after_random_changes(
            changes in proptest::collection::vec((0..3u8, 0..8u8, 0..4u8, 1..1000u16), 0..12),
        ) {
            let (mut state, _) = parse(EXAMPLE).unwrap();
            let namespaces: Vec<String> = state.net_namespaces.iter().map(|n| n.name.clone()).collect();
            for (what, i, ns, n) in changes {
                match what {
                    0 => {
                        // Add or replace a service.
                        let s = crate::cluster::Service {
                            cluster_ip6: None,
                            namespace: namespaces[ns as usize % namespaces.len()].clone(),
                            name: format!("s{i}"),
                            cluster_ip: Some(std::net::Ipv4Addr::new(172, 30, 1, i)),
                            ports: vec![crate::pipeline::service::ServicePort { proto: crate::pipeline::service::ServiceProto::Tcp, port: n }],
                        };
                        state.services.retain(|o| !(o.namespace == s.namespace && o.name == s.name));
                        state.services.push(s);
                    }
                    1 => {
                        let k = i as usize % (state.services.len() + 1);
                        if k < state.services.len() {
                            state.services.remove(k);
                        }
                    }
                    _ => {
                        // Add, move or remove a remote HostSubnet.
                        let host = format!("node-x{}", i % 4);
                        state.host_subnets.retain(|h| h.host != host);
                        if n % 3 != 0 {
                            state.host_subnets.push(crate::cluster::HostSubnet {
                                subnet6: None,
                                host,
                                host_ip: std::net::Ipv4Addr::new(172, 17, 2, i).into(),
                                subnet: Some(format!("10.131.{}.0/24", n % 200).parse().unwrap()),
                                fixed_vnid: (ns == 0).then(|| Vnid::new(7).unwrap()),
                            });
                        }
                    }
                }
            }
            let (state, _) = state.validate().unwrap();
            let ofports = example_ofports(&state);
            assert_incremental_is_full(&state, &ofports, &DnsAnswers::new());
        }
    }
}
