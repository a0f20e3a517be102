//! The one model the node is converged to: what the source (state file or Kubernetes) says,
//! the pods set up through the pod API, the ports OVSDB gave them, and the DNS answers of
//! egress policies. Pure: no I/O. Desired flows and ports are functions of it and nothing else.
//!
//! A pod set up through the API goes through three states here: *reserved* (its name, IP and
//! host port are taken, so concurrent requests cannot conflict, but it has no flows), *set up*
//! (in the effective state, with an ofport: it has flows), and *doomed* (torn down, but its
//! removal from the switch or OVSDB is not confirmed yet: it has no flows and no kept port, and
//! the reconciler finishes the removal).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::record::{CniRecord, PodRecord, SandboxId};
use crate::cluster::desired::{desired_state_with_warnings, pod_owner_flows, vnid_owner_flows};
use crate::cluster::{ClusterState, Pod, PodKey, Problem};
use crate::engine::Update;
use crate::domain::OfPort;
use crate::pipeline::egress::{dns_names, DnsAnswers};
use crate::cluster::Loaded;
use crate::store::{DesiredState, Owner};

/// A pod's port as OVSDB last confirmed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortState {
    pub host_veth: String,
    pub internal: bool,
    pub ofport: u32,
    pub bandwidth: (i64, i64),
}

/// Why a pod cannot be added now; the API turns it into a status code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request itself is wrong (400).
    Invalid(Problem),
    /// It conflicts with another object (409).
    Conflict(Problem),
    /// No cluster state yet (503).
    NoState,
    /// What the pod needs is not in the cluster yet (503): why, naming it and who makes it.
    NotYet(String),
}

/// A pod's namespace without a NetNamespace, in a cluster: the controller (sdn-node
/// controller, or openshift-sdn's master) has not made it yet.
pub fn no_net_namespace(namespace: &str, name: &str) -> String {
    format!(
        "pod {namespace}/{name}: no NetNamespace {namespace} yet (created for each Namespace by sdn-node controller or openshift-sdn's master: is it running?)"
    )
}

#[derive(Debug, Default)]
pub struct NodeState {
    /// The bridge's name: its own port and the agent's ports are never a pod's.
    pub bridge: String,
    source: Option<Arc<Loaded>>,
    /// Pods set up through the pod API, with the request that created them (persisted on the
    /// port, listed by the API).
    api_pods: BTreeMap<PodKey, (Pod, PodRecord)>,
    reserved: BTreeMap<PodKey, Pod>,
    /// The sandboxes of reserved CNI pods (set-up and doomed pods have theirs in their record).
    reserved_sandboxes: BTreeMap<PodKey, SandboxId>,
    doomed: BTreeMap<PodKey, (Pod, PodRecord)>,
    /// The address IPAM handed out last: the next search starts after it, so a released
    /// address is not reused at once.
    last_ip: Option<std::net::Ipv4Addr>,
    /// The IPv6 address IPAM handed out last (dual-stack), for the same reason.
    last_ip6: Option<std::net::Ipv6Addr>,
    /// The source's state plus the API pods, validated together.
    effective: Option<ClusterState>,
    /// Problems of the last rebuild (API pods that no longer fit).
    pub rebuild_problems: Vec<Problem>,
    ports: HashMap<PodKey, PortState>,
    dns: DnsAnswers,
    /// Bumped on every change: the reconciler knows whether it converged the latest model.
    pub version: u64,
    /// The node's audit log settings, put into every effective state (they are the agent's,
    /// not the source's).
    pub audit: crate::cluster::netpol::NodeAudit,
}

/// How the reconciler may bring the switch up to a new source state.
#[derive(Debug, PartialEq, Eq)]
pub enum SourceChange {
    /// Anything may have changed: a full converge.
    Full,
    /// Only these owners' flows can have changed (the source said so, relative to the state the
    /// model had): recompute and commit just them.
    Owners(Vec<Owner>),
}

/// IPAM's position, per family: the address handed out last (the next search starts after
/// it, so a released address is not reused at once). What the checkpoint's `ipam.json` keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpamCursor {
    pub v4: Option<std::net::Ipv4Addr>,
    pub v6: Option<std::net::Ipv6Addr>,
}

impl IpamCursor {
    /// No position in either family (nothing to keep).
    pub fn is_empty(&self) -> bool {
        self.v4.is_none() && self.v6.is_none()
    }
}

/// The names the agent itself owns on the bridge.
pub fn reserved_port_names(bridge: &str) -> [&str; 3] {
    [bridge, "vxlan0", "tun0"]
}

impl NodeState {
    pub fn new(bridge: &str) -> NodeState {
        NodeState { bridge: bridge.to_string(), ..Default::default() }
    }

    pub fn with_audit(bridge: &str, audit: crate::cluster::netpol::NodeAudit) -> NodeState {
        NodeState { audit, ..NodeState::new(bridge) }
    }

    /// The pod (`namespace/name`) at `ip`, local or on another node, as the model knows it:
    /// what the audit log names. A pod answers to each of its addresses (IPv4, IPv6, or both).
    pub fn pod_at(&self, ip: std::net::IpAddr) -> Option<String> {
        use std::net::IpAddr;
        let st = self.effective.as_ref()?;
        let at = |v4: Option<std::net::Ipv4Addr>, v6: Option<std::net::Ipv6Addr>| match ip {
            IpAddr::V4(a) => v4 == Some(a),
            IpAddr::V6(a) => v6 == Some(a),
        };
        st.pods
            .iter()
            .find(|p| at(p.ip, p.ip6))
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .or_else(|| st.remote_pods.iter().find(|p| at(p.ip, p.ip6)).map(|p| format!("{}/{}", p.namespace, p.name)))
    }

    pub fn effective(&self) -> Option<&ClusterState> {
        self.effective.as_ref()
    }

    pub fn has_state(&self) -> bool {
        self.effective.is_some()
    }

    /// A new state from the source. API pods that the source says no longer exist (Kubernetes
    /// relist) are dropped and returned: their ports and flows go with the next converge.
    pub fn set_source(&mut self, loaded: Arc<Loaded>) -> Vec<PodKey> {
        self.set_source_change(loaded).0
    }

    /// [`NodeState::set_source`], also saying whether the change can be applied owner by owner:
    /// only when the source numbered it as the successor of the state the model had, named
    /// the owners it touched, no pod went, and none of the touched owners is a pod's.
    pub fn set_source_change(&mut self, loaded: Arc<Loaded>) -> (Vec<PodKey>, SourceChange) {
        let prev_seq = self.source.as_ref().map(|l| l.seq);
        let incremental = match (&loaded.touched, prev_seq) {
            (Some(t), Some(prev)) if loaded.seq != 0 && loaded.seq == prev + 1 && !t.iter().any(|o| matches!(o, Owner::Pod { .. })) => {
                Some(t.clone())
            }
            _ => None,
        };
        let gone = self.replace_source(loaded);
        let change = match incremental {
            Some(t) if gone.is_empty() && self.rebuild_problems.is_empty() => SourceChange::Owners(t),
            _ => SourceChange::Full,
        };
        (gone, change)
    }

    /// The flows of `owners` computed from the model as it is now (the incremental form of
    /// [`NodeState::desired`]), with the problems and warnings found.
    pub fn owners_update(&self, owners: &[Owner]) -> Option<(Update, Vec<Problem>, Vec<Problem>)> {
        let st = self.effective.as_ref()?;
        let dns = self.dns_with_pending();
        let ofports = self.ofports();
        let (mut update, mut problems, mut warnings) = (Vec::new(), Vec::new(), Vec::new());
        for o in owners {
            let (f, p, w) = crate::cluster::desired::owner_flows(st, &ofports, &dns, o);
            update.push((o.clone(), f));
            problems.extend(p);
            warnings.extend(w);
        }
        Some((update, problems, warnings))
    }

    fn replace_source(&mut self, loaded: Arc<Loaded>) -> Vec<PodKey> {
        let mut gone = Vec::new();
        if let Some(live) = &loaded.live_pods {
            gone = self.api_pods.keys().filter(|k| !live.contains(*k)).cloned().collect();
            for k in &gone {
                if let Some(pr) = self.api_pods.remove(k) {
                    self.doomed.insert(k.clone(), pr);
                }
            }
        }
        self.source = Some(loaded);
        self.rebuild();
        gone
    }

    pub fn source(&self) -> Option<&Arc<Loaded>> {
        self.source.as_ref()
    }

    /// Recomputes the effective state: the source's, plus the API pods that fit in it.
    fn rebuild(&mut self) {
        self.version += 1;
        self.rebuild_problems.clear();
        let Some(loaded) = &self.source else { return };
        let mut st = loaded.state.clone();
        st.audit = self.audit;
        let from_source: HashSet<PodKey> = st.pods.iter().map(Pod::key).collect();
        for (pod, _) in self.api_pods.values() {
            if from_source.contains(&pod.key()) {
                continue;
            }
            match st.check_pod(pod) {
                Ok(()) => st.pods.push(pod.clone()),
                Err(p) => self.rebuild_problems.push(p),
            }
        }
        self.effective = Some(st);
    }

    /// Records API pods found on OVSDB ports after an agent restart.
    pub fn recover(&mut self, pods: Vec<(Pod, PodRecord)>) {
        for (pod, req) in pods {
            self.api_pods.entry(pod.key()).or_insert((pod, req));
        }
        self.rebuild();
    }

    /// Checks a new API pod against everything known and in flight, and reserves its key, IP
    /// and host port.
    pub fn reserve(&mut self, pod: &Pod) -> Result<(), Refusal> {
        let obj = format!("pod {}/{}", pod.namespace, pod.name);
        let Some(state) = &self.effective else { return Err(Refusal::NoState) };
        // From a cluster (the source lists this node's pods: Kubernetes), a namespace without
        // a NetNamespace is one the controller has not got to yet: a wait, not a bad request.
        let from_cluster = self.source.as_ref().is_some_and(|l| l.live_pods.is_some());
        if from_cluster && !state.net_namespaces.iter().any(|n| n.name == pod.namespace) {
            return Err(Refusal::NotYet(no_net_namespace(&pod.namespace, &pod.name)));
        }
        // From a state file: a mistake the operator must fix (a CNI network's `namespace`, for
        // a runtime that is not Kubernetes, names one the state does not have).
        if !from_cluster && !state.net_namespaces.iter().any(|n| n.name == pod.namespace) {
            return Err(Refusal::Invalid(Problem::new(
                obj,
                "namespace",
                format!(
                    "unknown namespace {:?}: the state has no NetNamespace of that name (add it to netNamespaces, \
                     or, for podman and other runtimes that are not Kubernetes, name one it has in the CNI network's \
                     \"namespace\")",
                    pod.namespace
                ),
            )));
        }
        if reserved_port_names(&self.bridge).contains(&pod.host_veth.as_str()) {
            return Err(Refusal::Invalid(Problem::new(
                obj,
                "hostVeth",
                format!("{:?} is one of the agent's own ports on {}", pod.host_veth, self.bridge),
            )));
        }
        let key = pod.key();
        if state.pods.iter().any(|p| p.key() == key && !self.api_pods.contains_key(&key)) {
            return Err(Refusal::Conflict(Problem::new(obj, "name", "the pod comes from the cluster state, not from the pod API")));
        }
        if self.reserved.contains_key(&key) {
            return Err(Refusal::Conflict(Problem::new(obj, "name", "a setup of this pod is in progress")));
        }
        if self.doomed.contains_key(&key) {
            return Err(Refusal::Conflict(Problem::new(obj, "name", "a teardown of this pod is not finished; retry the delete first")));
        }
        if let Some((old, _)) = self.api_pods.get(&key) {
            if old != pod {
                return Err(Refusal::Conflict(Problem::new(obj, "name", "the pod is already set up with other parameters; delete it first")));
            }
        }
        state.check_pod(pod).map_err(|p| if p.message.contains("already used") { Refusal::Conflict(p) } else { Refusal::Invalid(p) })?;
        for other in self.reserved.values().chain(self.doomed.values().map(|(p, _)| p)) {
            let conflict = if let Some(ip) = pod.ip.filter(|a| other.ip == Some(*a)) {
                Some(("ip", format!("{ip} is already used by pod {}/{}", other.namespace, other.name)))
            } else if let Some(ip6) = pod.ip6.filter(|a| other.ip6 == Some(*a)) {
                Some(("ips", format!("{ip6} is already used by pod {}/{}", other.namespace, other.name)))
            } else if other.mac == pod.mac {
                Some(("mac", format!("{} is already used by pod {}/{}", pod.mac, other.namespace, other.name)))
            } else if other.host_veth == pod.host_veth {
                Some(("hostVeth", format!("{:?} is already used by pod {}/{}", pod.host_veth, other.namespace, other.name)))
            } else {
                None
            };
            if let Some((f, m)) = conflict {
                return Err(Refusal::Conflict(Problem::new(obj, f, m)));
            }
        }
        self.reserved.insert(key, pod.clone());
        Ok(())
    }

    /// Gives a reservation up (the setup failed before anything of it reached the switch).
    pub fn unreserve(&mut self, key: &PodKey) {
        self.reserved.remove(key);
        self.reserved_sandboxes.remove(key);
    }

    /// The reserved pod `key` goes into sandbox `id` (see [`NodeState::sandbox_holders`]).
    pub fn reserve_sandbox(&mut self, key: &PodKey, id: SandboxId) {
        if self.reserved.contains_key(key) {
            self.reserved_sandboxes.insert(key.clone(), id);
        }
    }

    /// The CNI pods in sandbox `id` (`path`: how the request names it, for records that
    /// predate sandbox identities): one being set up (`true`: certain), or set up or not torn
    /// down yet, with their record (which may be stale: a namespace's inode can be reused once
    /// it is gone, so the caller checks the record's path still leads to `id`).
    pub fn sandbox_holders(&self, id: SandboxId, path: &str) -> (Option<PodKey>, Vec<(PodKey, CniRecord)>) {
        let reserved = self.reserved_sandboxes.iter().find(|(_, s)| **s == id).map(|(k, _)| k.clone());
        let recorded = self
            .api_pods
            .iter()
            .chain(self.doomed.iter())
            .filter_map(|(k, (_, r))| r.cni.as_ref().map(|c| (k, c)))
            .filter(|(_, c)| match c.sandbox {
                Some(s) => s == id,
                None => c.netns == path,
            })
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect();
        (reserved, recorded)
    }

    /// A host interface name some pod uses or will use (set up, being set up, or not torn down
    /// yet): never a new pod's, and never deleted for another container.
    pub fn host_veth_taken(&self, name: &str) -> bool {
        self.effective.as_ref().is_some_and(|s| s.pods.iter().any(|p| p.host_veth == name))
            || self.api_pods.values().any(|(p, _)| p.host_veth == name)
            || self.reserved.values().any(|p| p.host_veth == name)
            || self.doomed.values().any(|(p, _)| p.host_veth == name)
    }

    /// The CNI pod (set up or doomed) of container `id` (the full ID), with its record.
    pub fn cni_pod_of_container(&self, id: &str) -> Option<(PodKey, PodRecord)> {
        self.api_pods
            .iter()
            .chain(self.doomed.iter())
            .find(|(_, (_, r))| r.cni.is_some() && r.container_id == id)
            .map(|(k, (_, r))| (k.clone(), r.clone()))
    }

    /// The reserved pod's port is up: it joins the effective state (and gets flows).
    pub fn set_up(&mut self, pod: Pod, req: PodRecord, ofport: u32) {
        let key = pod.key();
        self.reserved.remove(&key);
        self.reserved_sandboxes.remove(&key);
        self.ports.insert(
            key.clone(),
            PortState { host_veth: pod.host_veth.clone(), internal: pod.internal, ofport, bandwidth: (pod.ingress_bps, pod.egress_bps) },
        );
        if let Some(st) = &mut self.effective {
            st.pods.retain(|p| p.key() != key);
            st.pods.push(pod.clone());
        }
        self.api_pods.insert(key, (pod, req));
        self.version += 1;
    }

    /// Removes an API pod from the effective state (its flows go); it stays *doomed* until
    /// [`NodeState::buried`] confirms its port is gone too.
    pub fn tear_down(&mut self, key: &PodKey) -> Option<Pod> {
        let (pod, req) = self.api_pods.remove(key)?;
        if let Some(st) = &mut self.effective {
            st.pods.retain(|p| p.key() != *key);
        }
        self.ports.remove(key);
        self.doomed.insert(key.clone(), (pod.clone(), req));
        self.version += 1;
        Some(pod)
    }

    /// A doomed pod and its record.
    pub fn doomed(&self, key: &PodKey) -> Option<&(Pod, PodRecord)> {
        self.doomed.get(key)
    }

    pub fn doomed_pods(&self) -> Vec<Pod> {
        self.doomed.values().map(|(p, _)| p.clone()).collect()
    }

    /// An API pod and its record.
    pub fn api_pod(&self, key: &PodKey) -> Option<&(Pod, PodRecord)> {
        self.api_pods.get(key)
    }

    /// IPAM: the next free host address of this node's IPv4 subnet (not the gateway, not used
    /// by any pod, reservation or unfinished teardown), searching after the last one handed
    /// out; `None` when this node has no IPv4 subnet (an IPv6-only node). The caller reserves
    /// it (with [`NodeState::reserve`]) before the lock is released.
    pub fn allocate_ip(&mut self) -> Result<Option<std::net::Ipv4Addr>, Refusal> {
        use std::net::Ipv4Addr;
        let Some(st) = &self.effective else { return Err(Refusal::NoState) };
        let Some(local) = st.local_subnet() else { return Err(Refusal::NoState) };
        let Some(net) = local.subnet else { return Ok(None) };
        let first = u32::from(net.network()) + 2; // after the gateway
        let last = u32::from(net.broadcast()).saturating_sub(1);
        if first > last {
            return Err(Refusal::Invalid(Problem::new(format!("hostsubnet {}", local.host), "subnet", "has no room for pods")));
        }
        // API pods the effective state rejected (their namespace went, say) still hold their
        // address while they are known: their sandboxes may be live.
        let used: HashSet<Ipv4Addr> = st
            .pods
            .iter()
            .filter_map(|p| p.ip)
            .chain(self.api_pods.values().filter_map(|(p, _)| p.ip))
            .chain(self.reserved.values().filter_map(|p| p.ip))
            .chain(self.doomed.values().filter_map(|(p, _)| p.ip))
            .collect();
        let size = last - first + 1;
        let start = self.last_ip.map(u32::from).filter(|a| (first..=last).contains(a)).map(|a| a - first + 1).unwrap_or(0);
        for i in 0..size {
            let a = Ipv4Addr::from(first + (start + i) % size);
            if !used.contains(&a) {
                self.last_ip = Some(a);
                return Ok(Some(a));
            }
        }
        Err(Refusal::Conflict(Problem::new(format!("hostsubnet {}", local.host), "subnet", format!("no free address left in {net}"))))
    }

    /// IPAM for IPv6 (dual-stack): the next free address of this node's IPv6 subnet after the
    /// last one handed out (not the network's subnet-router anycast address, not the gateway
    /// `::1`, not used by any pod, reservation or unfinished teardown); `None` when this node
    /// has no IPv6 subnet. A /64 has 2^64 addresses: the search looks at no more candidates
    /// than there are pods using one plus one (one of those is free), and the set it builds is
    /// of the pods' addresses, never of the subnet. The caller reserves the address with the
    /// pod (under the same lock), as for [`NodeState::allocate_ip`].
    pub fn allocate_ip6(&mut self) -> Result<Option<std::net::Ipv6Addr>, Refusal> {
        use std::net::Ipv6Addr;
        let Some(st) = &self.effective else { return Err(Refusal::NoState) };
        let Some(local) = st.local_subnet() else { return Err(Refusal::NoState) };
        let Some(net) = local.subnet6 else { return Ok(None) };
        let no_room = || Refusal::Conflict(Problem::new(format!("hostsubnet {}", local.host), "subnets", format!("no free address left in {net}")));
        let base = u128::from(net.network());
        // The host part's size, minus one: every address of the subnet is base + 0..=span.
        let span = u128::MAX.checked_shr(u32::from(net.prefix_len())).unwrap_or(0);
        // Candidates: base + 2 ..= base + span (the network and the gateway skipped).
        let Some(count) = span.checked_sub(1) else { return Err(no_room()) };
        let used: HashSet<Ipv6Addr> = st
            .pods
            .iter()
            .filter_map(|p| p.ip6)
            .chain(self.api_pods.values().filter_map(|(p, _)| p.ip6))
            .chain(self.reserved.values().filter_map(|p| p.ip6))
            .chain(self.doomed.values().filter_map(|(p, _)| p.ip6))
            .collect();
        // The offset (from the first candidate) to start at: after the last one handed out.
        let start = self
            .last_ip6
            .map(|a| u128::from(a).wrapping_sub(base + 2))
            .filter(|off| *off < count)
            .map(|off| (off + 1) % count)
            .unwrap_or(0);
        let tries = u128::try_from(used.len()).unwrap_or(u128::MAX).saturating_add(1).min(count);
        for i in 0..tries {
            let a = Ipv6Addr::from(base + 2 + (start + i) % count);
            if !used.contains(&a) {
                self.last_ip6 = Some(a);
                return Ok(Some(a));
            }
        }
        Err(no_room())
    }

    /// The records of the API pods, set up or doomed (both hold their address), in key order:
    /// what the agent's checkpoint keeps, with [`NodeState::ipam_cursor`].
    pub fn held_records(&self) -> Vec<PodRecord> {
        let mut pods: Vec<(&PodKey, &PodRecord)> =
            self.api_pods.iter().chain(self.doomed.iter()).map(|(k, (_, r))| (k, r)).collect();
        pods.sort_by(|a, b| a.0.cmp(b.0));
        pods.into_iter().map(|(_, r)| r.clone()).collect()
    }

    /// What the checkpoint keeps of pod `key` (one of [`NodeState::held_records`]): its record,
    /// set up or doomed.
    pub fn saved_pod(&self, key: &PodKey) -> Option<PodRecord> {
        self.api_pods.get(key).or_else(|| self.doomed.get(key)).map(|(_, r)| r.clone())
    }

    /// IPAM's position, per family (the next search starts after it).
    pub fn ipam_cursor(&self) -> IpamCursor {
        IpamCursor { v4: self.last_ip, v6: self.last_ip6 }
    }

    /// IPAM's position as a checkpoint kept it, or as the addresses still held say: per
    /// family, only where this run has none yet.
    pub fn restore_ipam_cursor(&mut self, cursor: IpamCursor) {
        self.last_ip = self.last_ip.or(cursor.v4);
        self.last_ip6 = self.last_ip6.or(cursor.v6);
    }

    /// The doomed pod's port is gone and its flows are off the switch.
    pub fn buried(&mut self, key: &PodKey) {
        self.doomed.remove(key);
    }

    pub fn is_api_pod(&self, key: &PodKey) -> bool {
        self.api_pods.contains_key(key)
    }

    pub fn in_source(&self, key: &PodKey) -> bool {
        self.source.as_ref().is_some_and(|l| l.state.pods.iter().any(|p| p.key() == *key))
    }

    pub fn is_reserved(&self, key: &PodKey) -> bool {
        self.reserved.contains_key(key)
    }

    /// The CNI pods and their sandboxes' network namespace paths (for the GC pass).
    pub fn cni_sandboxes(&self) -> Vec<(PodKey, String)> {
        self.api_pods.iter().filter_map(|(k, (_, r))| r.cni.as_ref().map(|c| (k.clone(), c.netns.clone()))).collect()
    }

    pub fn api_records(&self) -> Vec<PodRecord> {
        self.api_pods.values().map(|(_, r)| r.clone()).collect()
    }

    /// The pods that must have a port: every effective pod and every reservation.
    pub fn wanted_pods(&self) -> Vec<Pod> {
        let mut v: Vec<Pod> = self.effective.as_ref().map(|s| s.pods.clone()).unwrap_or_default();
        v.extend(self.reserved.values().cloned());
        v
    }

    /// Port names that must stay on the bridge.
    pub fn keep_ports(&self) -> HashSet<String> {
        let mut keep: HashSet<String> = reserved_port_names(&self.bridge).iter().map(|s| s.to_string()).collect();
        keep.extend(self.wanted_pods().into_iter().map(|p| p.host_veth));
        keep
    }

    pub fn ports(&self) -> &HashMap<PodKey, PortState> {
        &self.ports
    }

    pub fn set_port(&mut self, key: PodKey, port: PortState) {
        if self.ports.get(&key) != Some(&port) {
            self.ports.insert(key, port);
            self.version += 1;
        }
    }

    pub fn forget_port(&mut self, key: &PodKey) {
        if self.ports.remove(key).is_some() {
            self.version += 1;
        }
    }

    /// Corrects the pods' ofports from the switch's own port list (name, number), as read over
    /// a new OpenFlow connection. A restarted ovs-vswitchd numbers the ports afresh; a pod whose
    /// port the switch does not have is forgotten, so the next converge adds it again and
    /// waits for its ofport. Returns how many pods changed or were forgotten.
    pub fn refresh_ofports(&mut self, switch_ports: &[(String, u32)]) -> usize {
        let by_name: HashMap<&str, u32> = switch_ports.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let mut changed = 0;
        self.ports.retain(|k, s| match by_name.get(s.host_veth.as_str()) {
            Some(&p) if p == s.ofport => true,
            Some(&p) => {
                tracing::info!(pod = %format!("{}/{}", k.0, k.1), port = %s.host_veth, from = s.ofport, to = p, "the switch renumbered a pod's port");
                s.ofport = p;
                changed += 1;
                true
            }
            None => {
                changed += 1;
                false
            }
        });
        if changed > 0 {
            self.version += 1;
        }
        changed
    }

    pub fn ofports(&self) -> HashMap<PodKey, OfPort> {
        self.ports.iter().map(|(k, p)| (k.clone(), OfPort(p.ofport))).collect()
    }

    pub fn dns_names(&self) -> BTreeSet<String> {
        self.effective.as_ref().map(|s| dns_names(&s.egress_policies)).unwrap_or_default()
    }

    /// New DNS answers (from the resolver task); true if anything changed.
    pub fn set_dns(&mut self, answers: DnsAnswers) -> bool {
        if answers == self.dns {
            return false;
        }
        self.dns = answers;
        self.version += 1;
        true
    }

    /// The desired flows of the whole model, with the objects it rejected and the warnings.
    pub fn desired(&self) -> Option<(DesiredState, Vec<Problem>, Vec<Problem>)> {
        let st = self.effective.as_ref()?;
        Some(desired_state_with_warnings(st, &self.ofports(), &self.dns_with_pending()))
    }

    /// The DNS answers, with every name not resolved yet treated as a failed lookup (that
    /// VNID drops all egress, as for a failure) until its answer arrives: never allow more
    /// than the policy says.
    fn dns_with_pending(&self) -> DnsAnswers {
        let mut dns = self.dns.clone();
        if let Some(st) = &self.effective {
            for n in dns_names(&st.egress_policies) {
                dns.entry(n).or_insert_with(|| Err("not resolved yet".to_string()));
            }
        }
        dns
    }

    /// The incremental change for one pod's arrival or departure: its flows and its VNID's rule
    /// and multicast flows, computed from the model as it is now.
    pub fn pod_update(&self, pod: &Pod) -> Update {
        let Some(st) = &self.effective else { return vec![] };
        let ofports = self.ofports();
        let mut update = vec![pod_owner_flows(st, &ofports, pod)];
        if let Some(vnid) = st.vnid_of(&pod.namespace) {
            update.extend(vnid_owner_flows(st, &ofports, vnid));
        }
        // A pod not (or no longer) in the model has no flows.
        if !st.pods.iter().any(|p| p.key() == pod.key()) {
            update[0] = (Owner::Pod { namespace: pod.namespace.clone(), name: pod.name.clone() }, vec![]);
        }
        update
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::state_file::parse;

    fn state() -> NodeState {
        let (state, problems) = parse(include_str!("../../deploy/examples/cluster.yaml")).unwrap();
        let mut m = NodeState::new("br0");
        m.set_source(Arc::new(Loaded { state, problems, live_pods: None, touched: None, seq: 0, pod_annotations: Default::default(), policies_seen: Default::default() }));
        m
    }

    fn pod(m: &NodeState, name: &str, ip: &str, veth: &str) -> Pod {
        let st = m.effective().unwrap();
        let mut p = st.pods[0].clone();
        p.name = name.into();
        let v4: std::net::Ipv4Addr = ip.parse().unwrap();
        p.ip = Some(v4);
        p.mac = crate::domain::pod_mac(v4);
        p.host_veth = veth.into();
        p
    }

    /// The audit log's lookup: a local and a remote dual-stack pod are found by either of
    /// their addresses; an address of no pod, or of the other family's form, by none.
    #[test]
    fn pod_at_finds_pods_by_either_family() {
        use std::net::IpAddr;
        let mut yaml = include_str!("../../deploy/examples/dual-stack.yaml").to_string();
        yaml.push_str("remotePods:\n  - {namespace: team-b, name: api-2, ip: 10.129.0.8, ips: [10.129.0.8, \"fd00:10:128:100::8\"]}\n");
        let (state, problems) = parse(&yaml).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        let mut m = NodeState::new("br0");
        assert_eq!(m.pod_at("10.128.2.200".parse().unwrap()), None, "no state, no pods");
        m.set_source(Arc::new(Loaded { state, problems, live_pods: None, touched: None, seq: 0, pod_annotations: Default::default(), policies_seen: Default::default() }));
        let at = |a: &str| m.pod_at(a.parse::<IpAddr>().unwrap());
        assert_eq!(at("10.128.2.200").as_deref(), Some("team-a/web"));
        assert_eq!(at("fd00:10:128:2::c8").as_deref(), Some("team-a/web"));
        assert_eq!(at("10.129.0.8").as_deref(), Some("team-b/api-2"));
        assert_eq!(at("fd00:10:128:100::8").as_deref(), Some("team-b/api-2"));
        assert_eq!(at("fd00:10:128:2::c9"), None);
        // The IPv4-mapped form is another address (a packet never carries it for a pod).
        assert_eq!(at("::ffff:10.128.2.200"), None);
    }

    /// The record of an API pod `p` (not a CNI one).
    fn record_of(p: &Pod) -> PodRecord {
        PodRecord {
            version: crate::node::record::VERSION,
            container_id: p.container_id.to_string(),
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            host_veth: p.host_veth.clone(),
            ip: p.ips().first_and_second().unwrap().0,
            ip6: p.ips().first_and_second().unwrap().1,
            mac: p.mac,
            annotations: Default::default(),
            internal: p.internal,
            cni: None,
        }
    }

    /// The incremental path removes what a touched owner no longer has: a namespace's last
    /// NetworkPolicy gone, its owner is updated to no flows (the engine then deletes them).
    #[test]
    fn a_touched_owner_without_flows_is_updated_to_none() {
        let (state, _) = parse(include_str!("../../deploy/examples/networkpolicy.yaml")).unwrap();
        let ns = state.network_policies[0].namespace.clone();
        let owner = Owner::NetworkPolicy { namespace: ns.clone() };
        let loaded = |state, seq, touched| Arc::new(Loaded { state, problems: vec![], live_pods: None, touched, seq, pod_annotations: Default::default(), policies_seen: Default::default() });
        let mut m = NodeState::new("br0");
        m.set_source(loaded(state.clone(), 1, None));
        let (update, _, _) = m.owners_update(std::slice::from_ref(&owner)).unwrap();
        assert!(!update[0].1.is_empty(), "the example's policies give {ns} flows");
        let mut without = state;
        without.network_policies.retain(|p| p.namespace != ns);
        let (_, change) = m.set_source_change(loaded(without, 2, Some(vec![owner.clone()])));
        assert!(matches!(&change, SourceChange::Owners(o) if *o == vec![owner.clone()]), "{change:?}");
        let (update, _, _) = m.owners_update(std::slice::from_ref(&owner)).unwrap();
        assert_eq!(update, vec![(owner, vec![])]);
    }

    /// A CNI pod is never reachable before its isolation: the update its setup commits (one
    /// engine update, so one atomic bundle) holds the pod's own flows *and* its namespace's
    /// NetworkPolicy owner with the pod's table-80 drop, computed from the model that has the
    /// pod. `tests/netpol_first_ms.rs` probes the same on packets.
    #[test]
    fn a_pods_flows_and_its_isolation_are_one_update() {
        let (state, problems) = parse(include_str!("../../deploy/examples/networkpolicy.yaml")).unwrap();
        let mut m = NodeState::new("br0");
        m.set_source(Arc::new(Loaded { state, problems, live_pods: None, touched: None, seq: 0, pod_annotations: Default::default(), policies_seen: Default::default() }));
        // A copy of team-a/db (app: db, which db-from-web selects).
        let p = pod(&m, "new", "10.128.2.200", "vnew");
        let netpol = Owner::NetworkPolicy { namespace: p.namespace.clone() };
        let drop_flow = |flows: &[crate::pipeline::Flow]| {
            flows.iter().map(|f| f.to_string()).any(|t| t.starts_with("table=80,") && t.contains("nw_dst=10.128.2.200") && t.ends_with("actions=drop"))
        };
        let (before, _, _) = m.owners_update(std::slice::from_ref(&netpol)).unwrap();
        assert!(!drop_flow(&before[0].1), "no drop for the pod before it is set up");
        m.reserve(&p).unwrap();
        m.set_up(p.clone(), record_of(&p), 40);
        let u = m.pod_update(&p);
        let of = |o: &Owner| u.iter().find(|(x, _)| x == o).map(|(_, f)| f.as_slice());
        let own = of(&Owner::Pod { namespace: p.namespace.clone(), name: p.name.clone() }).expect("the pod's owner");
        assert!(!own.is_empty(), "the pod's flows");
        let isolation = of(&netpol).expect("its namespace's NetworkPolicy owner is in the same update");
        assert!(drop_flow(isolation), "the pod's table-80 drop: {isolation:#?}");
    }

    /// A pod in a namespace without a NetNamespace: from a state file a bad request; from a
    /// cluster a wait for the controller, which the refusal names.
    #[test]
    fn a_namespace_without_a_netnamespace_is_waited_for_in_a_cluster() {
        let mut m = state();
        let mut p = pod(&m, "x", "10.128.3.200", "vx");
        p.namespace = "nowhere".into();
        assert!(matches!(m.reserve(&p), Err(Refusal::Invalid(pr))
            if pr.field == "namespace" && pr.message.contains("unknown namespace \"nowhere\"") && pr.message.contains("netNamespaces")));
        let (state, problems) = parse(include_str!("../../deploy/examples/cluster.yaml")).unwrap();
        let live_pods = Some(state.pods.iter().map(|p| p.key()).collect());
        m.set_source(Arc::new(Loaded {
            state,
            problems,
            live_pods,
            touched: None,
            seq: 0,
            pod_annotations: Default::default(),
            policies_seen: Default::default(),
        }));
        match m.reserve(&p) {
            Err(Refusal::NotYet(why)) => assert_eq!(why, no_net_namespace("nowhere", "x")),
            other => panic!("{other:?}"),
        }
        assert!(no_net_namespace("nowhere", "x")
            .contains("no NetNamespace nowhere yet (created for each Namespace by sdn-node controller"));
    }

    #[test]
    fn the_agents_own_ports_are_never_a_pods() {
        let mut m = state();
        for name in ["br0", "tun0", "vxlan0"] {
            let p = pod(&m, "x", "10.128.3.200", name);
            match m.reserve(&p) {
                Err(Refusal::Invalid(pr)) => assert_eq!(pr.field, "hostVeth", "{pr}"),
                other => panic!("{name}: {other:?}"),
            }
        }
        // Another pod's port (from the source).
        let taken = m.effective().unwrap().pods[0].host_veth.clone();
        let p = pod(&m, "x", "10.128.3.200", &taken);
        assert!(matches!(m.reserve(&p), Err(Refusal::Conflict(pr)) if pr.field == "hostVeth"));
    }

    #[test]
    fn reservations_conflict_with_each_other_and_leave_no_flows() {
        let mut m = state();
        let a = pod(&m, "a", "10.128.3.200", "va");
        let b = pod(&m, "b", "10.128.3.200", "vb");
        let c = pod(&m, "c", "10.128.3.201", "va");
        m.reserve(&a).unwrap();
        assert!(matches!(m.reserve(&b), Err(Refusal::Conflict(pr)) if pr.field == "ip"));
        assert!(matches!(m.reserve(&c), Err(Refusal::Conflict(pr)) if pr.field == "hostVeth"));
        assert!(m.keep_ports().contains("va"), "a reservation's port is kept");
        let (d, _, _) = m.desired().unwrap();
        assert!(d.flows_of(&Owner::Pod { namespace: a.namespace.clone(), name: "a".into() }).is_empty());
        m.unreserve(&a.key());
        m.reserve(&b).unwrap();
    }

    #[test]
    fn set_up_then_torn_down_pods_flows_follow_the_model() {
        let mut m = state();
        let a = pod(&m, "a", "10.128.3.200", "va");
        m.reserve(&a).unwrap();
        m.set_up(a.clone(), record_of(&a), 40);
        let owner = Owner::Pod { namespace: a.namespace.clone(), name: "a".into() };
        let (d, _, _) = m.desired().unwrap();
        assert!(!d.flows_of(&owner).is_empty());
        assert!(!m.pod_update(&a)[0].1.is_empty());
        m.tear_down(&a.key()).unwrap();
        let (d, _, _) = m.desired().unwrap();
        assert!(d.flows_of(&owner).is_empty());
        assert!(m.pod_update(&a)[0].1.is_empty());
        assert!(!m.keep_ports().contains("va"), "a doomed pod's port goes");
        assert!(matches!(m.reserve(&a), Err(Refusal::Conflict(_))), "until its removal is confirmed");
        m.buried(&a.key());
        m.reserve(&a).unwrap();
    }

    /// deploy/examples/dual-stack.yaml with its pods replaced by three at ::5-::7.
    fn dual_stack_text() -> String {
        let example = include_str!("../../deploy/examples/dual-stack.yaml");
        let mut t = example[..example.find("\npods:\n").expect("the example has pods") + 1].to_string();
        t.push_str("pods:\n");
        for (name, ns, i) in [("a1", "team-a", 5), ("a2", "team-a", 6), ("b1", "team-b", 7)] {
            t.push_str(&format!(
                "  - {{namespace: {ns}, name: {name}, containerID: {i}123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef, hostVeth: veth-{name}, internal: true, ip: 10.128.2.{i}, ips: [10.128.2.{i}, \"fd00:10:128:2::{i}\"], mac: \"0a:58:0a:80:02:0{i}\"}}\n"
            ));
        }
        t
    }

    fn dual_stack() -> NodeState {
        let (state, problems) = parse(&dual_stack_text()).unwrap();
        let mut m = NodeState::new("br0");
        m.set_source(Arc::new(Loaded { state, problems, live_pods: None, touched: None, seq: 0, pod_annotations: Default::default(), policies_seen: Default::default() }));
        m
    }

    /// Allocates and reserves one dual-stack pod, as a CNI ADD does.
    fn add_dual(m: &mut NodeState, name: &str) -> Pod {
        let ip = m.allocate_ip().unwrap().unwrap();
        let ip6 = m.allocate_ip6().unwrap();
        let mut p = pod(m, name, &ip.to_string(), &format!("v{name}"));
        p.ip6 = ip6;
        m.reserve(&p).unwrap();
        p
    }

    /// IPv6 IPAM: after the network's address and the gateway (::1), skipping what pods hold
    /// (the state file's ::5-::7), never the same address twice while the cursor goes round,
    /// and a released address not at once.
    #[test]
    fn ipv6_addresses_come_after_the_cursor_and_skip_what_pods_hold() {
        let mut m = dual_stack();
        let got: Vec<String> = (0..8).map(|i| add_dual(&mut m, &format!("p{i}")).ip6.unwrap().to_string()).collect();
        assert_eq!(got, ["fd00:10:128:2::2", "fd00:10:128:2::3", "fd00:10:128:2::4", "fd00:10:128:2::8", "fd00:10:128:2::9", "fd00:10:128:2::a", "fd00:10:128:2::b", "fd00:10:128:2::c"]);
        assert_eq!(m.ipam_cursor().v6, Some("fd00:10:128:2::c".parse().unwrap()));
        // Released (::2): the next one is still after the cursor.
        m.unreserve(&("team-a".to_string(), "p0".to_string()));
        assert_eq!(add_dual(&mut m, "q").ip6.unwrap().to_string(), "fd00:10:128:2::d");
        // A cursor restored from a checkpoint is where the search resumes; this run's wins.
        let mut fresh = dual_stack();
        fresh.restore_ipam_cursor(IpamCursor { v4: None, v6: Some("fd00:10:128:2::40".parse().unwrap()) });
        fresh.restore_ipam_cursor(IpamCursor { v4: None, v6: Some("fd00:10:128:2::2".parse().unwrap()) });
        assert_eq!(add_dual(&mut fresh, "r").ip6.unwrap().to_string(), "fd00:10:128:2::41");
        // A node without an IPv6 subnet gives none.
        assert_eq!(state().allocate_ip6(), Ok(None));
    }

    /// At the end of the subnet the search wraps to its start; a full subnet is refused, after
    /// looking at no more candidates than pods hold addresses (a /64 is never walked).
    #[test]
    fn ipv6_allocation_wraps_and_a_full_subnet_is_refused() {
        let mut m = dual_stack();
        m.restore_ipam_cursor(IpamCursor { v4: None, v6: Some("fd00:10:128:2:ffff:ffff:ffff:fffe".parse().unwrap()) });
        assert_eq!(add_dual(&mut m, "last").ip6.unwrap().to_string(), "fd00:10:128:2:ffff:ffff:ffff:ffff");
        assert_eq!(add_dual(&mut m, "wrapped").ip6.unwrap().to_string(), "fd00:10:128:2::2");
        // A /125 (eight addresses: network, gateway and six for pods; three pods of the
        // state file hold ::5-::7): three more fit, then none.
        let (mut state, problems) = parse(&dual_stack_text()).unwrap();
        for h in state.host_subnets.iter_mut() {
            h.subnet6 = h.subnet6.map(|n| ipnet::Ipv6Net::new(n.network(), 125).unwrap());
        }
        let mut small = NodeState::new("br0");
        small.set_source(Arc::new(Loaded { state, problems, live_pods: None, touched: None, seq: 0, pod_annotations: Default::default(), policies_seen: Default::default() }));
        let got: Vec<String> = (0..3).map(|i| add_dual(&mut small, &format!("s{i}")).ip6.unwrap().to_string()).collect();
        assert_eq!(got, ["fd00:10:128:2::2", "fd00:10:128:2::3", "fd00:10:128:2::4"]);
        assert!(matches!(small.allocate_ip6(), Err(Refusal::Conflict(p)) if p.field == "subnets"));
    }

    /// Two reservations never share an IPv6 address.
    #[test]
    fn reservations_conflict_on_ip6() {
        let mut m = dual_stack();
        let a = add_dual(&mut m, "a");
        let mut b = pod(&m, "b", "10.128.2.200", "vb");
        b.ip6 = a.ip6;
        assert!(matches!(m.reserve(&b), Err(Refusal::Conflict(p)) if p.field == "ips"), "{:?}", m.reserve(&b));
    }
}
