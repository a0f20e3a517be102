//! From cluster state to desired flows: which seed operation applies to which object.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{ClusterState, PodKey, Problem};
use crate::model::{OfPort, Plugin, Vnid};
use crate::pipeline::egress::{self, DnsAnswers};
use crate::pipeline::pod::PodPort;
use crate::pipeline::subnet::RemoteSubnet;
use crate::pipeline::{base, multicast, policy, pod, service, subnet, NodeConfig};
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
/// egress traffic, corrected selectors).
pub fn desired_state_with_warnings(
    state: &ClusterState,
    ofports: &HashMap<PodKey, OfPort>,
    dns: &DnsAnswers,
) -> (DesiredState, Vec<Problem>, Vec<Problem>) {
    let mut d = DesiredState::default();
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let Some(local) = state.local_subnet() else {
        // ClusterState::validate guarantees a local subnet; without one there is no pipeline.
        problems.push(Problem::new(format!("node {}", state.node), "hostSubnets", "no HostSubnet for this node"));
        return (d, problems, warnings);
    };
    let cfg = NodeConfig {
        plugin: state.plugin,
        cluster_network: state.cluster_network,
        service_network: state.service_network,
        local_subnet: local.subnet,
    };
    put(&mut d, &mut problems, Owner::Base, base::flows(&cfg), "node".into());
    put(&mut d, &mut problems, Owner::Version, vec![base::version_flow(state.plugin)], "node".into());
    put(&mut d, &mut problems, Owner::PolicyPlugin, policy::plugin_flows(state.plugin), "node".into());

    let remotes: Vec<_> = state.host_subnets.iter().filter(|h| h.host != state.node).collect();
    for h in &remotes {
        let r = RemoteSubnet { host_ip: h.host_ip, subnet: h.subnet, fixed_vnid: h.fixed_vnid };
        put(&mut d, &mut problems, Owner::HostSubnet { host: h.host.clone() }, subnet::flows(&r), format!("hostsubnet {}", h.host));
    }
    let remote_ips: Vec<_> = match state.plugin {
        Plugin::Multitenant => remotes.iter().map(|h| h.host_ip).collect(),
        // Multicast is a multitenant feature; subnet mode keeps SetupOVS's plain table 111.
        Plugin::Subnet => vec![],
    };
    put(&mut d, &mut problems, Owner::MulticastVxlan, vec![multicast::vxlan_flow(&remote_ips)], "node".into());

    let mut in_use: BTreeSet<Vnid> = BTreeSet::new();
    let mut ports_by_vnid: BTreeMap<Vnid, Vec<OfPort>> = BTreeMap::new();
    for p in &state.pods {
        let (Some(&ofport), Some(vnid)) = (ofports.get(&p.key()), state.vnid_of(&p.namespace)) else { continue };
        let port = PodPort { ofport, ip: p.ip, mac: p.mac, container_id: p.container_id.clone(), vnid };
        let owner = Owner::Pod { namespace: p.namespace.clone(), name: p.name.clone() };
        put(&mut d, &mut problems, owner, pod::flows(&port), format!("pod {}/{}", p.namespace, p.name));
        in_use.insert(vnid);
        ports_by_vnid.entry(vnid).or_default().push(ofport);
    }
    for s in &state.services {
        let Some(vnid) = state.vnid_of(&s.namespace) else { continue };
        let owner = Owner::Service { namespace: s.namespace.clone(), name: s.name.clone() };
        put(&mut d, &mut problems, owner, service::flows(s.cluster_ip, &s.ports, vnid), format!("service {}/{}", s.namespace, s.name));
        in_use.insert(vnid);
    }

    if state.plugin == Plugin::Multitenant {
        // EnsureVNIDRules for every VNID a local pod or a service uses; none for the others
        // (FindUnusedVNIDs/SyncVNIDRules, computed from the model).
        for v in &in_use {
            put(&mut d, &mut problems, Owner::VnidRule { vnid: *v }, vec![policy::vnid_flow(*v)], format!("vnid {v}"));
        }
        for (vnid, namespaces) in state.namespaces_by_vnid() {
            let enabled = namespaces.iter().any(|n| n.multicast);
            let ports = ports_by_vnid.get(&vnid).map(Vec::as_slice).unwrap_or(&[]);
            put(&mut d, &mut problems, Owner::Multicast { vnid }, multicast::local_flows(vnid, enabled, ports), format!("multicast {vnid}"));
        }
    }

    // Egress policies, per VNID.
    let by_vnid = state.namespaces_by_vnid();
    let mut policies_by_vnid: BTreeMap<Vnid, Vec<egress::Policy>> = BTreeMap::new();
    for p in &state.egress_policies {
        if let Some(v) = state.vnid_of(&p.namespace) {
            policies_by_vnid.entry(v).or_default().push(p.clone());
        }
    }
    for (vnid, policies) in policies_by_vnid {
        let namespaces: Vec<String> = match state.plugin {
            Plugin::Multitenant => by_vnid.get(&vnid).map(|ns| ns.iter().map(|n| n.name.clone()).collect()).unwrap_or_default(),
            Plugin::Subnet => policies.iter().map(|p| p.namespace.clone()).collect::<BTreeSet<_>>().into_iter().collect(),
        };
        let out = egress::flows(vnid, &policies, &namespaces, dns);
        let object = policies.iter().map(|p| format!("egressnetworkpolicy {}/{}", p.namespace, p.name)).collect::<Vec<_>>().join(", ");
        for w in out.warnings.iter().chain(&out.dns_error) {
            warnings.push(Problem::new(object.clone(), "", w.clone()));
        }
        if let Some(e) = out.error {
            problems.push(Problem::new(object.clone(), "", e));
        }
        put(&mut d, &mut problems, Owner::EgressPolicy { vnid }, out.flows, object);
    }
    (d, problems, warnings)
}

/// The flows of one local pod (none if it has no ofport or its namespace is unknown).
pub fn pod_owner_flows(
    state: &ClusterState,
    ofports: &HashMap<PodKey, OfPort>,
    pod: &super::Pod,
) -> (Owner, Vec<crate::pipeline::Flow>) {
    let owner = Owner::Pod { namespace: pod.namespace.clone(), name: pod.name.clone() };
    let flows = match (ofports.get(&pod.key()), state.vnid_of(&pod.namespace)) {
        (Some(&ofport), Some(vnid)) => {
            pod::flows(&PodPort { ofport, ip: pod.ip, mac: pod.mac, container_id: pod.container_id.clone(), vnid })
        }
        _ => vec![],
    };
    (owner, flows)
}

/// The per-VNID owners a local pod's arrival or departure changes (multitenant only): the
/// table-80 rule (present while a local pod or a service uses the VNID) and the multicast
/// flows (which list the VNID's local ports). Computed exactly as [`desired_state`] does.
pub fn vnid_owner_flows(
    state: &ClusterState,
    ofports: &HashMap<PodKey, OfPort>,
    vnid: Vnid,
) -> Vec<(Owner, Vec<crate::pipeline::Flow>)> {
    if state.plugin != Plugin::Multitenant {
        return vec![];
    }
    let ports: Vec<OfPort> = state
        .pods
        .iter()
        .filter(|p| state.vnid_of(&p.namespace) == Some(vnid))
        .filter_map(|p| ofports.get(&p.key()).copied())
        .collect();
    let in_use = !ports.is_empty() || state.services.iter().any(|s| state.vnid_of(&s.namespace) == Some(vnid));
    let rule = if in_use { vec![policy::vnid_flow(vnid)] } else { vec![] };
    let enabled = state.net_namespaces.iter().any(|n| n.vnid == vnid && n.multicast);
    vec![
        (Owner::VnidRule { vnid }, rule),
        (Owner::Multicast { vnid }, multicast::local_flows(vnid, enabled, &ports)),
    ]
}

/// Sets an owner's flows; a conflict with another owner becomes a problem of `object`.
fn put(d: &mut DesiredState, problems: &mut Vec<Problem>, owner: Owner, flows: Vec<crate::pipeline::Flow>, object: String) {
    if let Err(c) = d.set(owner, flows) {
        problems.push(Problem::new(object, "", c.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::state_file::parse;

    const EXAMPLE: &str = include_str!("../../deploy/examples/cluster.yaml");

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
}
